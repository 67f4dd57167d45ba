//! The inter-node transport: nodes that know the secret connect (the lower id dials) and
//! answer each other's requests; a node with another secret is refused.

use openraft::raft::VoteRequest;
use openraft::Vote;
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;
use warren_quorum::transport::{CallError, Request, Response};
use warren_quorum::{Cluster, ClusterSettings};

fn listeners(n: usize) -> Vec<TcpListener> {
    (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect()
}

fn start(ls: Vec<TcpListener>, secrets: &[&str]) -> Vec<Arc<Cluster>> {
    let nodes: BTreeMap<u64, String> = ls
        .iter()
        .enumerate()
        .map(|(i, l)| (i as u64 + 1, l.local_addr().unwrap().to_string()))
        .collect();
    ls.into_iter()
        .enumerate()
        .map(|(i, l)| {
            let settings = ClusterSettings {
                node_id: i as u64 + 1,
                nodes: nodes.clone(),
                secret: secrets[i].as_bytes().to_vec(),
                tls: None,
            };
            Cluster::start(settings, l).unwrap()
        })
        .collect()
}

fn vote(group: &str) -> Request {
    Request::Vote {
        group: group.into(),
        rpc: VoteRequest::new(Vote::new(1, 1), None),
    }
}

#[tokio::test]
async fn nodes_with_the_secret_connect_and_answer() {
    let secret = "0123456789abcdef-shared";
    let c = start(listeners(3), &[secret, secret, secret]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while c.iter().any(|n| n.connected().len() < 2) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nodes did not connect"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(c[0].connected(), vec![2, 3]);
    assert_eq!(c[2].connected(), vec![1, 2]);
    // Both directions of one connection carry requests.
    for (from, to) in [(0usize, 3u64), (2, 1)] {
        let r = c[from]
            .call(
                to,
                vote("no-such-group"),
                Duration::ZERO,
                Duration::from_secs(5),
            )
            .await
            .expect("answer");
        assert!(matches!(r, Response::NoGroup), "{r:?}");
    }
    for n in &c {
        n.shutdown();
    }
}

#[tokio::test]
async fn a_node_without_the_secret_is_refused() {
    let c = start(
        listeners(2),
        &["0123456789abcdef-shared", "0123456789abcdef-other!"],
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(c[0].connected().is_empty());
    assert!(c[1].connected().is_empty());
    let r = c[0]
        .call(
            2,
            vote("g"),
            Duration::from_millis(100),
            Duration::from_secs(1),
        )
        .await;
    assert!(matches!(r, Err(CallError::Unreachable(2))), "{r:?}");
    for n in &c {
        n.shutdown();
    }
}

//! A quorum queue replicated over a cluster of three `warren` processes on 127.0.0.1: the
//! queue declared on node 1 gets members on nodes 2 and 3, publishes confirmed by node 1 are
//! on a majority, and after node 1 is killed (SIGKILL) the other two elect a leader and a
//! consumer gets every confirmed message. A member that was down catches up when it comes
//! back, a leader paused (SIGSTOP) past the election timeout rejoins as a follower with the
//! new leader's state, a publish on a member that does not lead is forwarded to the leader,
//! a queue deleted on one node is deleted on its other members, confirmed messages survive
//! a kill -9 of every node, clients of nodes that do not lead consume and get through the
//! leader's node, a queue whose group lost its quorum is deleted and declared again, and a
//! member left behind by a delete (its node was down) does not take over the queue declared
//! again since.

mod binary_support;

use binary_support::{free_port, persistent, tempdir, within, Server};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const N: usize = 300;

/// At most this many clusters (three `warren` processes each) run at once, so that the
/// nodes of a loaded two-core machine start within the harness's wait.
static CLUSTERS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(3);

fn quorum_args() -> FieldTable {
    let mut t = FieldTable::default();
    t.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    t
}

/// Node `id`'s data directory (made) and cluster environment, for nodes that listen
/// (inter-node) on `ports`.
fn node_env(
    id: usize,
    ports: &[u16],
    secret: &Path,
    root: &Path,
) -> (PathBuf, Vec<(String, String)>) {
    let seeds: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}@127.0.0.1:{p}", i + 1))
        .collect();
    let data = root.join(format!("node{id}"));
    std::fs::create_dir_all(&data).unwrap();
    let env = vec![
        ("WARREN_CLUSTER_NODE_ID".to_string(), id.to_string()),
        (
            "WARREN_CLUSTER_LISTEN".to_string(),
            format!("127.0.0.1:{}", ports[id - 1]),
        ),
        ("WARREN_CLUSTER_SEED_NODES".to_string(), seeds.join(",")),
        (
            "WARREN_CLUSTER_SECRET_FILE".to_string(),
            secret.to_string_lossy().into_owned(),
        ),
    ];
    (data, env)
}

/// Starts node `id` of the cluster whose nodes listen (inter-node) on `ports`.
fn start_node(id: usize, ports: &[u16], secret: &Path, root: &Path) -> Server {
    let (data, env) = node_env(id, ports, secret, root);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Server::start(&data, &env)
}

/// Starts the three nodes of the cluster whose nodes listen (inter-node) on `ports`.
fn three_nodes(ports: &[u16], secret: &Path, root: &Path) -> (Server, Server, Server) {
    (
        start_node(1, ports, secret, root),
        start_node(2, ports, secret, root),
        start_node(3, ports, secret, root),
    )
}

/// Waits (bounded) until `server` has queue `q`: its member is started asynchronously after
/// the declare on another node.
async fn wait_for_member(server: &Server, q: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let conn = server.connect().await;
        let ch = conn.create_channel().await.expect("channel");
        let passive = ch
            .queue_declare(
                q.into(),
                QueueDeclareOptions {
                    passive: true,
                    durable: true,
                    ..Default::default()
                },
                quorum_args(),
            )
            .await;
        let _ = conn.close(200, "bye".into()).await;
        if passive.is_ok() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node on port {} never got a member of {q}",
            server.port
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A fresh directory for a 3-node cluster, its shared secret file and three free ports.
fn cluster(name: &str) -> (PathBuf, PathBuf, [u16; 3]) {
    let root = tempdir(name);
    let secret = root.join("secret");
    std::fs::write(&secret, format!("{name}-test-cluster-secret\n")).unwrap();
    (root, secret, [free_port(), free_port(), free_port()])
}

/// Declares quorum queue `q` on `ch` and waits until each of `members` has its member.
async fn declare_replicated(ch: &lapin::Channel, q: &str, members: &[&Server]) {
    within(
        "queue.declare",
        ch.queue_declare(
            q.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            quorum_args(),
        ),
    )
    .await
    .expect("quorum queue declared");
    for m in members {
        wait_for_member(m, q).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_no_confirmed_message_lost() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster");
    let (node1, node2, node3) = three_nodes(&ports, &secret, &root);

    // Declared on node 1, which initializes the group and leads it.
    let conn = node1.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    declare_replicated(&ch, "qc", &[&node2, &node3]).await;

    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    let mut confirms = Vec::new();
    for i in 0..N {
        let pc = ch
            .basic_publish(
                "".into(),
                "qc".into(),
                BasicPublishOptions::default(),
                format!("m{i}").as_bytes(),
                persistent(),
            )
            .await
            .expect("publish");
        confirms.push(pc);
    }
    for (i, pc) in confirms.into_iter().enumerate() {
        let c = within("confirm", pc).await.expect("confirm");
        assert!(c.is_ack(), "publish {i} was not confirmed");
    }

    // The leader's node dies.
    drop(ch);
    drop(conn);
    node1.kill();

    // Consumers on both survivors; whichever becomes leader delivers.
    let mut got: HashSet<String> = HashSet::new();
    let mut streams = Vec::new();
    let mut conns = Vec::new();
    for (i, node) in [&node2, &node3].into_iter().enumerate() {
        let c = node.connect().await;
        let ch = c.create_channel().await.expect("channel");
        ch.basic_qos(100, BasicQosOptions::default())
            .await
            .expect("qos");
        let consumer = ch
            .basic_consume(
                "qc".into(),
                format!("c{i}").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("basic.consume on a member");
        streams.push(consumer);
        conns.push((c, ch));
    }
    let mut merged = futures_util::stream::select_all(streams);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(25);
    while got.len() < N {
        let next = tokio::time::timeout_at(deadline, merged.next()).await;
        let delivery = match next {
            Ok(Some(Ok(d))) => d,
            Ok(other) => panic!("consumer ended: {other:?}"),
            Err(_) => panic!(
                "only {} of {N} confirmed messages consumed after the leader died",
                got.len()
            ),
        };
        got.insert(String::from_utf8(delivery.data.clone()).unwrap());
        delivery.ack(BasicAckOptions::default()).await.expect("ack");
    }
    for i in 0..N {
        assert!(got.contains(&format!("m{i}")), "m{i} lost");
    }
    drop(merged);
    for (c, _) in conns {
        let _ = c.close(200, "bye".into()).await;
    }
    drop(node2);
    drop(node3);
    let _ = std::fs::remove_dir_all(&root);
}

/// The message count node `server` reports for `q` (its member's applied state), or None
/// when the queue is not there.
async fn count_on(server: &Server, q: &str) -> Option<u32> {
    let conn = server.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    let r = ch
        .queue_declare(
            q.into(),
            QueueDeclareOptions {
                passive: true,
                durable: true,
                ..Default::default()
            },
            quorum_args(),
        )
        .await;
    let _ = conn.close(200, "bye".into()).await;
    r.ok().map(|q| q.message_count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_catches_up_and_delete_reaches_members() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-catchup");
    let (node1, node2, node3) = three_nodes(&ports, &secret, &root);
    let conn = node1.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    declare_replicated(&ch, "qm", &[&node2, &node3]).await;

    // Node 3 is down while the others commit N publishes (a majority of two).
    node3.kill();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    let mut confirms = Vec::new();
    for i in 0..N {
        confirms.push(
            ch.basic_publish(
                "".into(),
                "qm".into(),
                BasicPublishOptions::default(),
                format!("m{i}").as_bytes(),
                persistent(),
            )
            .await
            .expect("publish"),
        );
    }
    for pc in confirms {
        assert!(within("confirm", pc).await.expect("confirm").is_ack());
    }

    // Back, it gets what it missed.
    let node3 = start_node(3, &ports, &secret, &root);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let n = count_on(&node3, "qm").await;
        if n == Some(N as u32) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 3 has {n:?} of {N} messages after coming back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Published on node 3, which does not lead: forwarded to the leader, confirmed once
    // applied there, consumed on node 1.
    let conn3 = node3.connect().await;
    let ch3 = conn3.create_channel().await.expect("channel");
    ch3.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    let mut confirms = Vec::new();
    for i in 0..50 {
        confirms.push(
            ch3.basic_publish(
                "".into(),
                "qm".into(),
                BasicPublishOptions::default(),
                format!("from3-{i}").as_bytes(),
                persistent(),
            )
            .await
            .expect("publish"),
        );
    }
    for pc in confirms {
        assert!(within("confirm", pc).await.expect("confirm").is_ack());
    }
    let _ = conn3.close(200, "bye".into()).await;
    let cch = conn.create_channel().await.expect("channel");
    let mut consumer = cch
        .basic_consume(
            "qm".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("basic.consume on the leader");
    let mut seen = HashSet::new();
    while seen.len() < N + 50 {
        let d = within("delivery", consumer.next())
            .await
            .expect("delivery")
            .expect("delivery");
        seen.insert(String::from_utf8(d.data.clone()).unwrap());
        d.ack(BasicAckOptions::default()).await.expect("ack");
    }
    assert!((0..50).all(|i| seen.contains(&format!("from3-{i}"))));

    // Deleted on node 1, gone from every member.
    within(
        "queue.delete",
        ch.queue_delete("qm".into(), Default::default()),
    )
    .await
    .expect("queue.delete");
    for node in [&node2, &node3] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while count_on(node, "qm").await.is_some() {
            assert!(
                Instant::now() < deadline,
                "queue still on node at port {}",
                node.port
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let _ = conn.close(200, "bye".into()).await;
    drop((node1, node2, node3));
    let _ = std::fs::remove_dir_all(&root);
}

/// Publishes `bodies` on `ch` (confirms on) and asserts that every one is confirmed.
async fn publish_confirmed(ch: &lapin::Channel, q: &str, bodies: impl Iterator<Item = String>) {
    let mut confirms = Vec::new();
    for b in bodies {
        confirms.push(
            ch.basic_publish(
                "".into(),
                q.into(),
                BasicPublishOptions::default(),
                b.as_bytes(),
                persistent(),
            )
            .await
            .expect("publish"),
        );
    }
    for pc in confirms {
        assert!(within("confirm", pc).await.expect("confirm").is_ack());
    }
}

/// Consumes (and acks) from `merged` until `got` holds `want` distinct bodies (bounded).
async fn take(
    merged: &mut futures_util::stream::SelectAll<lapin::Consumer>,
    got: &mut HashSet<String>,
    want: usize,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while got.len() < want {
        let d = match tokio::time::timeout_at(deadline, merged.next()).await {
            Ok(Some(Ok(d))) => d,
            Ok(other) => panic!("consumer ended: {other:?}"),
            Err(_) => panic!("{} of {want} messages consumed", got.len()),
        };
        got.insert(String::from_utf8(d.data.clone()).unwrap());
        d.ack(BasicAckOptions::default()).await.expect("ack");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_leader_rejoins_as_follower() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-pause");
    let (node1, node2, node3) = three_nodes(&ports, &secret, &root);
    let conn1 = node1.connect().await;
    let ch1 = conn1.create_channel().await.expect("channel");
    declare_replicated(&ch1, "qp", &[&node2, &node3]).await;
    ch1.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    publish_confirmed(&ch1, "qp", (0..N).map(|i| format!("m{i}"))).await;

    // The leader stops answering for longer than the election timeout.
    node1.signal(libc::SIGSTOP);
    let mut streams = Vec::new();
    let mut conns = Vec::new();
    for (i, node) in [&node2, &node3].into_iter().enumerate() {
        let c = node.connect().await;
        let ch = c.create_channel().await.expect("channel");
        ch.basic_qos(100, BasicQosOptions::default())
            .await
            .expect("qos");
        streams.push(
            ch.basic_consume(
                "qp".into(),
                format!("c{i}").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("basic.consume"),
        );
        conns.push((c, ch));
    }
    let mut merged = futures_util::stream::select_all(streams);
    let mut got: HashSet<String> = HashSet::new();
    take(&mut merged, &mut got, N).await;
    // Published on node 2 meanwhile: reaches the new leader, wherever it is.
    let (_, ch2) = &conns[0];
    ch2.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    publish_confirmed(ch2, "qp", (0..20).map(|i| format!("p{i}"))).await;
    take(&mut merged, &mut got, N + 20).await;

    // Resumed, node 1 follows the new leader: its member converges to the empty queue.
    node1.signal(libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = count_on(&node1, "qp").await;
        if n == Some(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 1 still reports {n:?} messages"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And what is published on it now goes to the leader's consumers.
    let conn1 = node1.connect().await;
    let ch1 = conn1.create_channel().await.expect("channel");
    ch1.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    publish_confirmed(&ch1, "qp", (0..10).map(|i| format!("r{i}"))).await;
    take(&mut merged, &mut got, N + 30).await;
    drop(merged);
    for (c, _) in conns {
        let _ = c.close(200, "bye".into()).await;
    }
    drop((node1, node2, node3));
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_killed_and_restarted() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-restart");
    let (node1, node2, node3) = three_nodes(&ports, &secret, &root);
    let conn = node1.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    declare_replicated(&ch, "qr", &[&node2, &node3]).await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    publish_confirmed(&ch, "qr", (0..N).map(|i| format!("m{i}"))).await;
    drop(ch);
    drop(conn);
    node1.kill();
    node2.kill();
    node3.kill();

    // Back from their data directories, the members elect a leader among themselves.
    let nodes = [
        start_node(1, &ports, &secret, &root),
        start_node(2, &ports, &secret, &root),
        start_node(3, &ports, &secret, &root),
    ];
    let mut streams = Vec::new();
    let mut conns = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let c = node.connect().await;
        let ch = c.create_channel().await.expect("channel");
        ch.basic_qos(100, BasicQosOptions::default())
            .await
            .expect("qos");
        streams.push(
            ch.basic_consume(
                "qr".into(),
                format!("c{i}").as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("basic.consume after the restart"),
        );
        conns.push((c, ch));
    }
    let mut merged = futures_util::stream::select_all(streams);
    let mut got = HashSet::new();
    take(&mut merged, &mut got, N).await;
    drop(merged);
    for (c, _) in conns {
        let _ = c.close(200, "bye".into()).await;
    }
    drop(nodes);
    let _ = std::fs::remove_dir_all(&root);
}

/// The next delivery of `consumer` (bounded): body and redelivered flag; acked unless
/// `ack` is false.
async fn next_delivery(consumer: &mut lapin::Consumer, ack: bool) -> (String, bool) {
    let d = match tokio::time::timeout(Duration::from_secs(15), consumer.next()).await {
        Ok(Some(Ok(d))) => d,
        Ok(other) => panic!("consumer ended: {other:?}"),
        Err(_) => panic!("no delivery within 15 s"),
    };
    if ack {
        d.ack(BasicAckOptions::default()).await.expect("ack");
    }
    (String::from_utf8(d.data.clone()).unwrap(), d.redelivered)
}

/// Waits (bounded) until `server` reports `want` messages in `q`.
async fn wait_count(server: &Server, q: &str, want: u32) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let n = count_on(server, q).await;
        if n == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{q} on port {} holds {n:?} messages, not {want}",
            server.port
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_and_gets_on_nodes_that_do_not_lead() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-anynode");
    let (node1, node2, node3) = three_nodes(&ports, &secret, &root);
    let q = "anynode";
    // Declared on node 1, which leads.
    let c1 = node1.connect().await;
    let ch1 = c1.create_channel().await.expect("channel");
    declare_replicated(&ch1, q, &[&node2, &node3]).await;

    // A consumer on node 3 and a publisher on node 2: neither node leads.
    let c3 = node3.connect().await;
    let ch3 = c3.create_channel().await.expect("channel");
    ch3.basic_qos(10, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut cons3 = ch3
        .basic_consume(
            q.into(),
            "on-node-3".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("basic.consume on a follower");
    let c2 = node2.connect().await;
    let ch2 = c2.create_channel().await.expect("channel");
    ch2.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    publish_confirmed(&ch2, q, (0..100).map(|i| format!("m{i}"))).await;
    for i in 0..100 {
        let (body, redelivered) = next_delivery(&mut cons3, true).await;
        assert_eq!(body, format!("m{i}"), "in order");
        assert!(!redelivered, "{body} was not delivered before");
    }
    // The acks went to the leader: nothing is left anywhere.
    wait_count(&node1, q, 0).await;
    wait_count(&node3, q, 0).await;

    // Unacknowledged deliveries of a follower's consumer come back when its channel closes.
    publish_confirmed(&ch2, q, (0..5).map(|i| format!("u{i}"))).await;
    for i in 0..5 {
        assert_eq!(next_delivery(&mut cons3, false).await.0, format!("u{i}"));
    }
    ch3.close(200, "bye".into()).await.expect("channel.close");
    drop(cons3);

    // basic.get on node 2 (a follower) takes them from the leader, flagged redelivered.
    let ch2g = c2.create_channel().await.expect("channel");
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while seen.len() < 5 {
        match ch2g
            .basic_get(q.into(), lapin::options::BasicGetOptions::default())
            .await
            .expect("basic.get on a follower")
        {
            Some(m) => {
                assert!(m.delivery.redelivered, "returned message flagged");
                seen.push(String::from_utf8(m.delivery.data.clone()).unwrap());
                m.delivery
                    .ack(BasicAckOptions::default())
                    .await
                    .expect("ack");
            }
            None => {
                assert!(Instant::now() < deadline, "got only {seen:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert_eq!(seen, (0..5).map(|i| format!("u{i}")).collect::<Vec<_>>());
    assert!(ch2g
        .basic_get(q.into(), lapin::options::BasicGetOptions::default())
        .await
        .expect("basic.get")
        .is_none());
    wait_count(&node1, q, 0).await;

    // queue.purge on node 3 (a follower) purges at the leader.
    publish_confirmed(&ch2, q, (0..3).map(|i| format!("p{i}"))).await;
    wait_count(&node3, q, 3).await;
    let ch3p = c3.create_channel().await.expect("channel");
    let purged = ch3p
        .queue_purge(q.into(), lapin::options::QueuePurgeOptions::default())
        .await
        .expect("queue.purge on a follower");
    assert_eq!(purged, 3);
    wait_count(&node1, q, 0).await;
    wait_count(&node2, q, 0).await;

    // The leader's node dies: a consumer on node 2 keeps receiving what is published on
    // node 3, from whichever survivor leads now.
    let ch2c = c2.create_channel().await.expect("channel");
    let mut cons2 = ch2c
        .basic_consume(
            q.into(),
            "on-node-2".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("basic.consume");
    drop(ch1);
    drop(c1);
    node1.kill();
    let c3 = node3.connect().await;
    let ch3 = c3.create_channel().await.expect("channel");
    ch3.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    // Publishes wait for the election (one nacked meanwhile may still arrive).
    let mut confirmed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    for attempt in 0.. {
        if confirmed.len() == 20 {
            break;
        }
        let body = format!("f{attempt}");
        let pc = ch3
            .basic_publish(
                "".into(),
                q.into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                persistent(),
            )
            .await
            .expect("publish");
        if within("confirm", pc).await.expect("confirm").is_ack() {
            confirmed.push(body);
        } else {
            assert!(Instant::now() < deadline, "no leader elected");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut got = Vec::new();
    while !got.ends_with(&confirmed[confirmed.len() - 1..]) {
        got.push(next_delivery(&mut cons2, true).await.0);
    }
    got.retain(|b| confirmed.contains(b));
    assert_eq!(got, confirmed, "every confirmed message, in order");
    drop(cons2);
    let _ = c2.close(200, "bye".into()).await;
    let _ = c3.close(200, "bye".into()).await;
    drop(node2);
    drop(node3);
    let _ = std::fs::remove_dir_all(&root);
}

/// Declares durable quorum queue `q` with argument `key` = `value` too.
async fn declare_with(ch: &lapin::Channel, q: &str, key: &str, value: AMQPValue) {
    let mut args = quorum_args();
    args.insert(key.into(), value);
    within(
        "queue.declare",
        ch.queue_declare(
            q.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        ),
    )
    .await
    .expect("declared");
}

/// Starts node `id` like [`start_node`], with its management API on 127.0.0.1:`mgmt`.
fn start_node_with_api(id: usize, ports: &[u16], secret: &Path, root: &Path, mgmt: u16) -> Server {
    let (data, env) = node_env(id, ports, secret, root);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let amqp = free_port();
    let api = format!("127.0.0.1:{mgmt}");
    Server::start_listening(
        &format!("127.0.0.1:{amqp}"),
        amqp,
        &data,
        &env,
        Some(&root.join(format!("node{id}.log"))),
        &["--management-listen", api.as_str()],
    )
}

/// `warren ctl --port <port> <args>`: (success, stdout, stderr).
/// `warren ctl quorum grow NODE` on `port`, run again (for up to 20 s) while a queue is
/// refused because NODE did not answer a Raft call in time: with the whole suite on two
/// cores a call can time out, and an operator would run the command again.
async fn grow_retrying(port: u16, node: &str) -> (bool, String, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = ctl(port, &["quorum", "grow", node]);
        let unreachable = r.1.contains("is not reachable") || r.2.contains("is not reachable");
        if r.0 || !unreachable || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn ctl(port: u16, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_warren"))
        .arg("ctl")
        .arg("--port")
        .arg(port.to_string())
        .args(args)
        .env_remove("WARREN_CTL_URL")
        .env_remove("WARREN_CTL_PORT")
        .output()
        .expect("warren ctl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// GET `path` of the management API on `port` as guest.
async fn api_get(port: u16, path: &str) -> serde_json::Value {
    let r = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}{path}"))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .expect("GET");
    assert!(r.status().is_success(), "GET {path}: {}", r.status());
    r.json().await.expect("JSON")
}

/// GET `path` of the management API on `port` as guest: (status, body).
async fn api_status(port: u16, path: &str) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}{path}"))
        .basic_auth("guest", Some("guest"))
        .send()
        .await
        .expect("GET");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

/// A replica change through the management API on `port`: (status, body).
async fn api_replicas(port: u16, q: &str, add: bool, node: &str) -> (u16, String) {
    let c = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}/api/queues/quorum/%2F/{q}/replicas");
    let req = if add {
        c.post(format!("{base}/add"))
    } else {
        c.delete(format!("{base}/delete"))
    };
    let r = req
        .basic_auth("guest", Some("guest"))
        .json(&serde_json::json!({ "node": node }))
        .send()
        .await
        .expect("replica change");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// Waits (bounded) until node `port`'s API shows `want` as the queue's members.
async fn wait_members(port: u16, q: &str, want: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let now = members_on(port, q).await;
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "members {now:?}, not {want:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The queue's members as node `port`'s API shows them, sorted.
async fn members_on(port: u16, q: &str) -> Vec<String> {
    let v = api_get(port, &format!("/api/queues/%2F/{q}")).await;
    let mut m: Vec<String> = v["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    m.sort();
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_added_and_removed() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-members");
    let api = [free_port(), free_port(), free_port()];
    let [node1, node2, node3] =
        [1, 2, 3].map(|id| start_node_with_api(id, &ports, &secret, &root, api[id - 1]));
    let name = |id: usize| format!("warren-{id}@127.0.0.1");

    // The cluster's nodes, from any node.
    let nodes = api_get(api[1], "/api/nodes").await;
    let listed: Vec<(String, bool)> = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_string(),
                n["running"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert_eq!(listed[0], (name(2), true), "this node first");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let nodes = api_get(api[1], "/api/nodes").await;
        let running = nodes
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["running"] == true)
            .count();
        if running == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "nodes not all running: {nodes}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Two members: nodes 1 and 2.
    let q = "grown";
    let conn = node1.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    declare_with(&ch, q, "x-quorum-initial-group-size", AMQPValue::LongInt(2)).await;
    wait_for_member(&node2, q).await;
    wait_members(api[0], q, &[name(1), name(2)]).await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    publish_confirmed(&ch, q, (0..50).map(|i| format!("m{i}"))).await;
    // Node 3 holds no member and reaches the queue through the members: its counts, and its
    // clients' publishes, confirmed once the group has them.
    let queue_on = |port: u16| async move { api_get(port, &format!("/api/queues/%2F/{q}")).await };
    let on3 = queue_on(api[2]).await;
    assert!(on3["members"].is_null(), "a stand-in on node 3: {on3}");
    assert_eq!(on3["type"], "quorum", "{on3}");
    wait_count(&node3, q, 50).await;
    let c3 = node3.connect().await;
    let ch3 = c3.create_channel().await.expect("channel");
    ch3.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    publish_confirmed(&ch3, q, (50..60).map(|i| format!("m{i}"))).await;
    wait_count(&node1, q, 60).await;

    // Added on node 3, asked of node 2 (which does not lead): node 3 catches up.
    let (status, body) = api_replicas(api[1], q, true, &name(3)).await;
    assert_eq!(status, 204, "{body}");
    assert_eq!(members_on(api[0], q).await, vec![name(1), name(2), name(3)]);
    wait_count(&node3, q, 60).await;
    assert_eq!(members_on(api[2], q).await, vec![name(1), name(2), name(3)]);
    // With three members, no single node is critical.
    let critical = "/api/health/checks/node-is-quorum-critical";
    assert_eq!(api_status(api[0], critical).await.0, 200);
    let leaderless = "/api/health/checks/quorum-queues-without-elected-leaders/all-vhosts";
    assert_eq!(api_status(api[2], leaderless).await.0, 200);
    let (status, body) = api_replicas(api[1], q, true, &name(3)).await;
    assert_eq!(status, 400, "a member already: {body}");
    let (status, _) = api_replicas(api[1], q, true, "warren-9@127.0.0.1").await;
    assert_eq!(status, 400, "not a node of the cluster");

    // The leader's own member removed, with `warren ctl` asked of node 3.
    let (ok, out, err) = ctl(api[2], &["quorum", "delete-member", q, &name(1)]);
    assert!(ok, "ctl: {out} {err}");
    wait_members(api[2], q, &[name(2), name(3)]).await;
    // Two members: each node is critical to the queue; node 1 is not a member any more.
    let (status, body) = api_status(api[1], critical).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["queues"][0]["name"], q, "{body}");
    assert_eq!(api_status(api[0], critical).await.0, 200);
    drop(ch);
    let _ = conn.close(200, "bye".into()).await;
    // Node 1's member makes way for a stand-in.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !queue_on(api[0]).await["members"].is_null() {
        assert!(Instant::now() < deadline, "node 1 kept its member's queue");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The remaining members elect a leader and have every message; a consumer on node 1
    // gets them through them.
    let c1 = node1.connect().await;
    let ch1 = c1.create_channel().await.expect("channel");
    let mut cons = ch1
        .basic_consume(
            q.into(),
            "after".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("basic.consume");
    for i in 0..60 {
        assert_eq!(next_delivery(&mut cons, true).await.0, format!("m{i}"));
    }
    wait_count(&node3, q, 0).await;

    // `warren ctl cluster status` lists the nodes.
    let (ok, out, err) = ctl(api[2], &["cluster", "status"]);
    assert!(ok, "ctl: {err}");
    for id in 1..=3 {
        assert!(out.contains(&name(id)), "{out}");
    }
    // Down to one member; the last one stays.
    let (status, body) = api_replicas(api[2], q, false, &name(2)).await;
    assert_eq!(status, 204, "{body} (logs in {})", root.display());
    let (status, body) = api_replicas(api[2], q, false, &name(3)).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("last member"), "{body}");
    drop(cons);
    let _ = c1.close(200, "bye".into()).await;
    let _ = c3.close(200, "bye".into()).await;

    // A queue with one member (node 1): bound, published to, got from, consumed from and
    // deleted on the other nodes.
    let q = "single";
    let conn = node1.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    declare_with(&ch, q, "x-quorum-initial-group-size", AMQPValue::LongInt(1)).await;
    wait_count(&node2, q, 0).await;
    let c2 = node2.connect().await;
    let ch2 = c2.create_channel().await.expect("channel");
    within(
        "queue.bind",
        ch2.queue_bind(
            q.into(),
            "amq.direct".into(),
            "to-single".into(),
            Default::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("bound on node 2");
    let c3 = node3.connect().await;
    let ch3 = c3.create_channel().await.expect("channel");
    ch3.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    publish_once_routed(&ch3, "amq.direct", "to-single", b"s0").await;
    publish_confirmed(&ch3, q, (1..5).map(|i| format!("s{i}"))).await;
    wait_count(&node1, q, 5).await;
    let got = within(
        "basic.get",
        ch2.basic_get(q.into(), lapin::options::BasicGetOptions::default()),
    )
    .await
    .expect("basic.get")
    .expect("a message");
    assert_eq!(got.delivery.data, b"s0");
    got.delivery
        .ack(BasicAckOptions::default())
        .await
        .expect("ack");
    let mut cons = ch3
        .basic_consume(
            q.into(),
            "on-3".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("basic.consume on node 3");
    for i in 1..5 {
        assert_eq!(next_delivery(&mut cons, true).await.0, format!("s{i}"));
    }
    wait_count(&node1, q, 0).await;
    drop(cons);
    // A member added on node 2, asked of node 3, which holds none.
    let (status, body) = api_replicas(api[2], q, true, &name(2)).await;
    assert_eq!(status, 204, "{body}");
    wait_members(api[0], q, &[name(1), name(2)]).await;
    within(
        "queue.delete",
        ch2.queue_delete(q.into(), Default::default()),
    )
    .await
    .expect("deleted on node 2");
    for n in [&node1, &node2, &node3] {
        let deadline = Instant::now() + Duration::from_secs(15);
        while count_on(n, q).await.is_some() {
            assert!(Instant::now() < deadline, "{q} left on port {}", n.port);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for c in [conn, c2, c3] {
        let _ = c.close(200, "bye".into()).await;
    }
    drop(node1);
    drop(node2);
    drop(node3);
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balanced_leaders_spread_over_the_nodes() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-balanced");
    let api = [free_port(), free_port(), free_port()];
    let [node1, node2, node3] =
        [1, 2, 3].map(|id| start_node_with_api(id, &ports, &secret, &root, api[id - 1]));
    let conn = node1.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    let mut leaders = Vec::new();
    for i in 0..3 {
        let q = format!("balanced-{i}");
        let balanced = AMQPValue::LongString(LongString::from("balanced"));
        declare_with(&ch, &q, "x-queue-leader-locator", balanced).await;
        // Its leader, once elected, counts for the next declare.
        let deadline = Instant::now() + Duration::from_secs(15);
        let leader = loop {
            let v = api_get(api[0], &format!("/api/queues/%2F/{q}")).await;
            if let Some(l) = v["leader"].as_str() {
                break l.to_string();
            }
            assert!(Instant::now() < deadline, "{q} has no leader: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        leaders.push(leader);
    }
    leaders.sort();
    assert_eq!(
        leaders,
        (1..=3)
            .map(|id| format!("warren-{id}@127.0.0.1"))
            .collect::<Vec<_>>(),
        "one leader per node"
    );
    // A queue led by another node takes publishes and deliveries as any other.
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    for i in 0..3 {
        publish_confirmed(
            &ch,
            &format!("balanced-{i}"),
            (0..10).map(|j| format!("m{j}")),
        )
        .await;
    }
    for node in [&node1, &node2, &node3] {
        for i in 0..3 {
            wait_count(node, &format!("balanced-{i}"), 10).await;
        }
    }
    let _ = conn.close(200, "bye".into()).await;
    drop(node1);
    drop(node2);
    drop(node3);
    let _ = std::fs::remove_dir_all(&root);
}

/// Waits (bounded) until a passive declare of exchange `x` succeeds on `server`.
async fn wait_for_exchange(server: &Server, x: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let conn = server.connect().await;
        let ch = conn.create_channel().await.expect("channel");
        let passive = ch
            .exchange_declare(
                x.into(),
                lapin::ExchangeKind::Topic,
                lapin::options::ExchangeDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await;
        let _ = conn.close(200, "bye".into()).await;
        if passive.is_ok() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node on port {} never got exchange {x}",
            server.port
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A management API call on `port` as guest with a JSON body: the status.
async fn api_send(port: u16, method: reqwest::Method, path: &str, body: serde_json::Value) -> u16 {
    reqwest::Client::new()
        .request(method, format!("http://127.0.0.1:{port}{path}"))
        .basic_auth("guest", Some("guest"))
        .json(&body)
        .send()
        .await
        .expect("API call")
        .status()
        .as_u16()
}

/// Whether `user` (password `pass`) can open a connection to vhost `vhost` on `amqp`.
async fn can_log_in(amqp: u16, user: &str, pass: &str, vhost: &str) -> bool {
    let uri = format!("amqp://{user}:{pass}@127.0.0.1:{amqp}/{vhost}");
    let conn = tokio::time::timeout(
        Duration::from_secs(10),
        lapin::Connection::connect(&uri, lapin::ConnectionProperties::default()),
    )
    .await;
    match conn {
        Ok(Ok(c)) => {
            let _ = c.close(200, "bye".into()).await;
            true
        }
        _ => false,
    }
}

/// Polls `check` (bounded) until it holds.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    while !check().await {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_is_replicated_to_every_node() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-metadata");
    let api = [free_port(), free_port(), free_port()];
    let [node1, node2, node3] =
        [1, 2, 3].map(|id| start_node_with_api(id, &ports, &secret, &root, api[id - 1]));

    // An exchange, a quorum queue and a binding declared on node 1 ...
    let c1 = node1.connect().await;
    let ch1 = c1.create_channel().await.unwrap();
    declare_exchange(&ch1, "orders").await;
    declare_replicated(&ch1, "meta-q", &[&node2, &node3]).await;
    within(
        "queue.bind",
        ch1.queue_bind(
            "meta-q".into(),
            "orders".into(),
            "eu.*".into(),
            Default::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("bound");

    // ... route a publish made on node 3, with that exchange and binding there.
    wait_for_exchange(&node3, "orders").await;
    let c3 = node3.connect().await;
    let ch3 = c3.create_channel().await.unwrap();
    ch3.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    eventually("the binding routes on node 3", || {
        let ch3 = ch3.clone();
        async move {
            let confirm = ch3
                .basic_publish(
                    "orders".into(),
                    "eu.paris".into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    b"routed",
                    persistent(),
                )
                .await
                .expect("publish")
                .await
                .expect("confirm");
            // An unroutable mandatory publish comes back with basic.return.
            confirm.take_message().is_none()
        }
    })
    .await;
    wait_count(&node1, "meta-q", 1).await;

    // Users, vhosts and permissions made through node 1's API work on the others.
    let put = reqwest::Method::PUT;
    assert_eq!(
        api_send(
            api[0],
            put.clone(),
            "/api/vhosts/shop",
            serde_json::json!({})
        )
        .await,
        201
    );
    assert_eq!(
        api_send(
            api[0],
            put.clone(),
            "/api/users/alice",
            serde_json::json!({"password": "wonderland", "tags": ""}),
        )
        .await,
        201
    );
    assert_eq!(
        api_send(
            api[0],
            put.clone(),
            "/api/permissions/shop/alice",
            serde_json::json!({"configure": ".*", "write": ".*", "read": ".*"}),
        )
        .await,
        201
    );
    for n in [&node2, &node3] {
        eventually("alice logs in to shop on another node", || {
            can_log_in(n.port, "alice", "wonderland", "shop")
        })
        .await;
    }
    // A quorum queue in the new vhost gets its members on every node.
    let ca = lapin::Connection::connect(
        &format!("amqp://alice:wonderland@127.0.0.1:{}/shop", node2.port),
        lapin::ConnectionProperties::default(),
    )
    .await
    .expect("alice on node 2");
    let cha = ca.create_channel().await.unwrap();
    within(
        "queue.declare",
        cha.queue_declare(
            "carts".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            quorum_args(),
        ),
    )
    .await
    .expect("declared in shop");
    eventually("carts has three members, seen from node 3", || async {
        // Its member there starts just after the declare-ok.
        let (status, q) = api_status(api[2], "/api/queues/shop/carts").await;
        status == 200 && q["members"].as_array().map(Vec::len) == Some(3)
    })
    .await;
    let _ = ca.close(200, "bye".into()).await;

    // Users and vhosts added at the same moment on the three nodes are all kept, everywhere.
    let mut puts = Vec::new();
    for (i, port) in api.iter().enumerate() {
        let port = *port;
        puts.push(tokio::spawn(async move {
            for j in 0..8 {
                let user = format!("/api/users/u{i}-{j}");
                let vhost = format!("/api/vhosts/v{i}-{j}");
                let body = serde_json::json!({"password": "p", "tags": ""});
                assert_eq!(api_send(port, reqwest::Method::PUT, &user, body).await, 201);
                let body = serde_json::json!({});
                assert_eq!(
                    api_send(port, reqwest::Method::PUT, &vhost, body).await,
                    201
                );
            }
        }));
    }
    for p in puts {
        p.await.unwrap();
    }
    for port in api {
        eventually("every node has the 24 users and vhosts", || async move {
            let names = |v: serde_json::Value| -> Vec<String> {
                v.as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|u| u["name"].as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let users = names(api_get(port, "/api/users").await);
            let vhosts = names(api_get(port, "/api/vhosts").await);
            (0..3).all(|i| {
                (0..8).all(|j| {
                    users.contains(&format!("u{i}-{j}")) && vhosts.contains(&format!("v{i}-{j}"))
                })
            })
        })
        .await;
    }

    // A user deleted on node 2 can log in nowhere.
    assert_eq!(
        api_send(
            api[1],
            reqwest::Method::DELETE,
            "/api/users/alice",
            serde_json::json!({})
        )
        .await,
        204
    );
    for n in [&node1, &node3] {
        eventually("alice refused on another node", || async {
            !can_log_in(n.port, "alice", "wonderland", "shop").await
        })
        .await;
    }

    // A node that was down when changes were made gets them when it comes back.
    drop(c3);
    node3.kill();
    within(
        "exchange.delete",
        ch1.exchange_delete("orders".into(), Default::default()),
    )
    .await
    .expect("deleted");
    declare_exchange(&ch1, "late").await;
    let node3 = start_node_with_api(3, &ports, &secret, &root, api[2]);
    wait_for_exchange(&node3, "late").await;
    let gone = api_status(api[2], "/api/exchanges/%2F/orders").await.0;
    assert_eq!(gone, 404, "the exchange deleted while node 3 was down");

    // The same new exchange declared at the same moment with two types on two nodes: each
    // node may answer declare-ok, and every node ends with the type later in the log.
    let c2 = node2.connect().await;
    let opts = lapin::options::ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    for i in 0..8 {
        let x = format!("clash{i}");
        let a = c1.create_channel().await.unwrap();
        let b = c2.create_channel().await.unwrap();
        let (ra, rb) = within("two exchange.declare of one name on two nodes", async {
            tokio::join!(
                a.exchange_declare(
                    x.as_str().into(),
                    lapin::ExchangeKind::Direct,
                    opts,
                    FieldTable::default()
                ),
                b.exchange_declare(
                    x.as_str().into(),
                    lapin::ExchangeKind::Fanout,
                    opts,
                    FieldTable::default()
                ),
            )
        })
        .await;
        assert!(ra.is_ok() || rb.is_ok(), "{ra:?} {rb:?}");
        let path = format!("/api/exchanges/%2F/{x}");
        eventually("every node has the same type", || async {
            let mut types = Vec::new();
            for port in api {
                types.push(api_status(port, &path).await.1["type"].clone());
            }
            types[0].is_string() && types.iter().all(|t| *t == types[0])
        })
        .await;
    }
    let _ = within("connection.close on node 2", c2.close(200, "bye".into())).await;
    let _ = within("connection.close on node 1", c1.close(200, "bye".into())).await;
    drop((node1, node2, node3));
    let _ = std::fs::remove_dir_all(&root);
}

/// Publishes `body` to exchange `x` with routing key `key` (mandatory, persistent) on `ch`, a
/// channel in confirm mode, until it is confirmed and routed (a binding made on another node
/// reaches this one within a moment).
async fn publish_once_routed(ch: &lapin::Channel, x: &str, key: &str, body: &[u8]) {
    eventually("the binding routes", || async {
        let confirm = ch
            .basic_publish(
                x.into(),
                key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                body,
                persistent(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        confirm.is_ack() && confirm.take_message().is_none()
    })
    .await;
}

/// Declares durable topic exchange `x` on `ch`.
async fn declare_exchange(ch: &lapin::Channel, x: &str) {
    within(
        "exchange.declare",
        ch.exchange_declare(
            x.into(),
            lapin::ExchangeKind::Topic,
            lapin::options::ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .expect("exchange declared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_added_to_and_removed_from_a_running_cluster() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-nodes");
    let four = [ports[0], ports[1], ports[2], free_port()];
    let api = [free_port(), free_port(), free_port(), free_port()];
    let [node1, node2, node3] =
        [1, 2, 3].map(|id| start_node_with_api(id, &ports, &secret, &root, api[id - 1]));
    let name4 = "warren-4@127.0.0.1";

    let c1 = node1.connect().await;
    let ch1 = c1.create_channel().await.unwrap();
    declare_exchange(&ch1, "before").await;
    declare_replicated(&ch1, "grown", &[&node2]).await;
    eventually("grown has three members", || async {
        members_on(api[0], "grown").await.len() == 3
    })
    .await;

    // A node that is not running is not added.
    let add = format!("4@127.0.0.1:{}", four[3]);
    let (ok, _, err) = ctl(api[1], &["cluster", "add-node", &add]);
    assert!(!ok && err.contains("did not connect"), "{err}");
    assert_eq!(
        api_get(api[0], "/api/nodes").await.as_array().map(Vec::len),
        Some(3)
    );
    // Node 4 starts with every node in its seed list, then joins through node 2.
    let node4 = start_node_with_api(4, &four, &secret, &root, api[3]);
    let (ok, out, err) = ctl(api[1], &["cluster", "add-node", &add]);
    assert!(ok, "add-node: {out} {err}");
    wait_for_exchange(&node4, "before").await;
    let four_running = |port: u16| async move {
        let nodes = api_get(port, "/api/nodes").await;
        let nodes = nodes.as_array().cloned().unwrap_or_default();
        nodes.len() == 4 && nodes.iter().all(|n| n["running"] == true)
    };
    eventually("four running nodes, seen from node 1", || {
        four_running(api[0])
    })
    .await;
    // Node 3 restarted with its first seed list (nodes 1 to 3) still knows node 4.
    node3.kill();
    let _node3 = start_node_with_api(3, &ports, &secret, &root, api[2]);
    eventually("four running nodes, seen from the restarted node 3", || {
        four_running(api[2])
    })
    .await;
    // Changes made now reach it; new quorum queues get a member there.
    declare_exchange(&ch1, "after").await;
    wait_for_exchange(&node4, "after").await;
    declare_replicated(&ch1, "wide", &[&node4]).await;
    eventually("wide has four members", || async {
        members_on(api[0], "wide").await.len() == 4
    })
    .await;
    // A quorum queue declared before node 4 joined is reached from it, through its members.
    wait_count(&node4, "grown", 0).await;
    let c4 = node4.connect().await;
    let ch4 = c4.create_channel().await.unwrap();
    ch4.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    publish_confirmed(&ch4, "grown", (0..5).map(|i| format!("g{i}"))).await;
    wait_count(&node1, "grown", 5).await;
    let _ = c4.close(200, "bye".into()).await;

    // grow and shrink over the vhost's quorum queues.
    let (ok, out, err) = grow_retrying(api[0], name4).await;
    assert!(ok && out.contains("grown: added"), "grow: {out} {err}");
    eventually("grown has four members", || async {
        members_on(api[0], "grown").await.len() == 4
    })
    .await;
    // Its member on node 4 took the stand-in's place, and caught up.
    assert_eq!(members_on(api[3], "grown").await.len(), 4);
    wait_count(&node4, "grown", 5).await;
    let (ok, out, err) = ctl(api[2], &["quorum", "shrink", name4]);
    assert!(ok && out.contains("wide: removed"), "shrink: {out} {err}");
    eventually("three members each after the shrink", || async {
        members_on(api[0], "grown").await.len() == 3 && members_on(api[0], "wide").await.len() == 3
    })
    .await;
    // Node 4 reaches them through the members again.
    eventually("stand-ins on node 4", || async {
        let g = api_get(api[3], "/api/queues/%2F/grown").await;
        g["members"].is_null() && g["messages"] == 5
    })
    .await;
    let (ok, out, err) = grow_retrying(api[0], name4).await;
    assert!(ok, "grow again: {out} {err}");
    eventually("four members each again", || async {
        members_on(api[0], "grown").await.len() == 4 && members_on(api[0], "wide").await.len() == 4
    })
    .await;

    // A running node is not removed; stopped, it leaves the cluster and the queues' members.
    let (ok, _, err) = ctl(api[2], &["cluster", "remove-node", name4]);
    assert!(!ok && err.contains("is running"), "{err}");
    node4.kill();
    // (Once the nodes have seen its connections drop.)
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (ok, out, err) = ctl(api[2], &["cluster", "remove-node", name4]);
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline && err.contains("is running"),
            "remove-node: {out} {err}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eventually("three nodes listed", || async {
        api_get(api[0], "/api/nodes").await.as_array().map(Vec::len) == Some(3)
    })
    .await;
    eventually("the queues lost their member on node 4", || async {
        members_on(api[0], "grown").await.len() == 3 && members_on(api[0], "wide").await.len() == 3
    })
    .await;
    let (ok, _, _) = ctl(api[0], &["cluster", "remove-node", name4]);
    assert!(!ok, "a node no longer in the cluster");
    // The three left commit changes as before.
    declare_exchange(&ch1, "last").await;
    wait_for_exchange(&node2, "last").await;
    let _ = c1.close(200, "bye".into()).await;
    let _ = std::fs::remove_dir_all(&root);
}

/// A CA and, signed by it, a node certificate for 127.0.0.1 usable by both ends of a TLS
/// connection (server and client authentication): (CA PEM, certificate PEM, key PEM).
fn node_certificate(ca_name: &str) -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        SanType,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.distinguished_name.push(DnType::CommonName, ca_name);
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut node = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    node.subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
    node.distinguished_name
        .push(DnType::CommonName, "warren node");
    node.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = node.signed_by(&key, &ca_cert, &ca_key).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_talk_over_mutual_tls() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-tls");
    let api = [free_port(), free_port(), free_port()];
    let good = node_certificate("cluster CA");
    // Node 3 knows the secret but its certificate comes from another CA.
    let rogue = node_certificate("another CA");
    let start = |id: usize, (ca, cert, key): &(String, String, String)| {
        let (data, mut env) = node_env(id, &ports, &secret, &root);
        let dir = root.join(format!("tls{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, pem) in [("ca.pem", ca), ("node.pem", cert), ("node.key", key)] {
            std::fs::write(dir.join(name), pem).unwrap();
        }
        let file = |n: &str| dir.join(n).to_string_lossy().into_owned();
        env.extend([
            ("WARREN_CLUSTER_TLS".to_string(), "true".to_string()),
            ("WARREN_TLS_CERT_FILE".to_string(), file("node.pem")),
            ("WARREN_TLS_KEY_FILE".to_string(), file("node.key")),
            ("WARREN_TLS_CA_FILE".to_string(), file("ca.pem")),
            (
                "WARREN_TLS_LISTEN".to_string(),
                format!("127.0.0.1:{}", free_port()),
            ),
        ]);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let amqp = free_port();
        let mgmt = format!("127.0.0.1:{}", api[id - 1]);
        Server::start_listening(
            &format!("127.0.0.1:{amqp}"),
            amqp,
            &data,
            &env,
            Some(&root.join(format!("node{id}.log"))),
            &["--management-listen", mgmt.as_str()],
        )
    };
    let node1 = start(1, &good);
    let node2 = start(2, &good);
    let _node3 = start(3, &rogue);

    // Nodes 1 and 2 connect over TLS; node 3 is refused by both.
    eventually("nodes 1 and 2 connected", || async {
        let nodes = api_get(api[0], "/api/nodes").await;
        nodes
            .as_array()
            .is_some_and(|a| a.iter().filter(|n| n["running"] == true).count() == 2)
    })
    .await;
    // A quorum queue replicated between them: a publish on node 2 is forwarded to the
    // leader on node 1, and consumed there.
    let c1 = node1.connect().await;
    let ch1 = c1.create_channel().await.unwrap();
    declare_replicated(&ch1, "tls-q", &[&node2]).await;
    eventually("tls-q has members on nodes 1 and 2", || async {
        members_on(api[0], "tls-q").await.len() == 2
    })
    .await;
    let c2 = node2.connect().await;
    let ch2 = c2.create_channel().await.unwrap();
    ch2.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    publish_confirmed(&ch2, "tls-q", (0..20).map(|i| format!("m{i}"))).await;
    wait_count(&node1, "tls-q", 20).await;
    let nodes = api_get(api[1], "/api/nodes").await;
    let node3 = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "warren-3@127.0.0.1")
        .cloned()
        .unwrap();
    assert_eq!(node3["running"], false, "{nodes}");
    let _ = c1.close(200, "bye".into()).await;
    let _ = c2.close(200, "bye".into()).await;
    let _ = std::fs::remove_dir_all(&root);
}

/// basic.consume on a new channel of `conn`: the channel and its consumer (dropping the
/// consumer cancels it), or the channel's close reply text.
async fn try_consume(
    conn: &lapin::Connection,
    q: &str,
    tag: &str,
    exclusive: bool,
) -> Result<(lapin::Channel, lapin::Consumer), String> {
    let ch = conn.create_channel().await.expect("channel");
    match within(
        "basic.consume",
        ch.basic_consume(
            q.into(),
            tag.into(),
            BasicConsumeOptions {
                exclusive,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    {
        Ok(consumer) => Ok((ch, consumer)),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exclusive_consumers_count_on_every_node() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-exclusive");
    let (node1, node2, node3) = three_nodes(&ports, &secret, &root);
    let c1 = node1.connect().await;
    let ch1 = c1.create_channel().await.unwrap();
    declare_replicated(&ch1, "excl", &[&node2, &node3]).await;
    let c2 = node2.connect().await;
    let c3 = node3.connect().await;

    // An exclusive consumer on node 2 (node 1 leads) keeps consumers off every node.
    let ch2 = try_consume(&c2, "excl", "only", true)
        .await
        .expect("exclusive on node 2");
    // (The consumer reaches the leader's node just after consume-ok.)
    let deadline = Instant::now() + Duration::from_secs(15);
    let refused = loop {
        match try_consume(&c3, "excl", "other", false).await {
            Err(e) => break e,
            Ok((ch, _)) => {
                let _ = ch.close(200, "bye".into()).await;
                assert!(Instant::now() < deadline, "never refused on node 3");
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(refused.contains("in exclusive use"), "{refused}");
    eventually("the leader's node refuses too", || async {
        try_consume(&c1, "excl", "leader", false).await.is_err()
    })
    .await;
    // Once it is cancelled, others may consume; an exclusive one is then refused.
    ch2.0
        .basic_cancel("only".into(), Default::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let kept = loop {
        match try_consume(&c3, "excl", "other", false).await {
            Ok(ch) => break ch,
            Err(e) => assert!(Instant::now() < deadline, "never a consumer on node 3: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eventually("an exclusive consumer on node 2 is refused", || async {
        try_consume(&c2, "excl", "again", true).await.is_err()
    })
    .await;
    drop(kept);
    for c in [c1, c2, c3] {
        let _ = c.close(200, "bye".into()).await;
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_queues_are_reachable_from_every_node() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-classic");
    let (node1, node2, node3) = three_nodes(&ports, &secret, &root);

    // A durable classic queue and its binding, declared on node 1, which holds it.
    let c1 = node1.connect().await;
    let ch1 = c1.create_channel().await.unwrap();
    within(
        "exchange.declare",
        ch1.exchange_declare(
            "cx".into(),
            lapin::ExchangeKind::Direct,
            lapin::options::ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    declare_classic(&ch1, "cq").await;
    within(
        "queue.bind",
        ch1.queue_bind(
            "cq".into(),
            "cx".into(),
            "k".into(),
            Default::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    wait_count(&node3, "cq", 0).await;
    wait_count(&node2, "cq", 0).await;

    // Publishes on node 3 are confirmed once node 1 holds them.
    let c3 = node3.connect().await;
    let ch3 = c3.create_channel().await.unwrap();
    ch3.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    publish_once_routed(&ch3, "cx", "k", b"probe").await;
    let mut confirms = Vec::new();
    for i in 0..50 {
        confirms.push(
            ch3.basic_publish(
                "cx".into(),
                "k".into(),
                BasicPublishOptions::default(),
                format!("m{i}").as_bytes(),
                persistent(),
            )
            .await
            .unwrap(),
        );
    }
    for c in confirms {
        assert!(within("confirm", c).await.unwrap().is_ack());
    }
    wait_count(&node1, "cq", 51).await;

    // A consumer on node 2 gets them in order; its acks reach node 1.
    let c2 = node2.connect().await;
    let ch2 = c2.create_channel().await.unwrap();
    ch2.basic_qos(10, BasicQosOptions::default()).await.unwrap();
    let mut consumer = ch2
        .basic_consume(
            "cq".into(),
            "c2".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let (first, _) = next_delivery(&mut consumer, true).await;
    assert_eq!(first, "probe");
    for i in 0..50 {
        let (body, redelivered) = next_delivery(&mut consumer, true).await;
        assert_eq!(
            (body.as_str(), redelivered),
            (format!("m{i}").as_str(), false)
        );
    }
    wait_count(&node1, "cq", 0).await;

    // A channel-wide prefetch (global basic.qos) on node 3 holds back what it cannot take
    // yet, and takes it after each ack.
    {
        declare_classic(&ch1, "cq-slow").await;
        wait_count(&node3, "cq-slow", 0).await;
        let c = node3.connect().await;
        let ch = c.create_channel().await.unwrap();
        ch.basic_qos(1, BasicQosOptions { global: true })
            .await
            .unwrap();
        let mut slow = ch
            .basic_consume(
                "cq-slow".into(),
                "slow".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let chp = c1.create_channel().await.unwrap();
        chp.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        publish_confirmed(&chp, "cq-slow", (0..5).map(|i| format!("g{i}"))).await;
        for i in 0..5 {
            let (body, redelivered) = next_delivery(&mut slow, true).await;
            assert_eq!((body, redelivered), (format!("g{i}"), false));
        }
        let _ = c.close(200, "bye".into()).await;
        wait_count(&node1, "cq-slow", 0).await;
    }
    // Unacked deliveries come back when the consuming channel closes, flagged redelivered;
    // basic.get on node 3 takes one, and its nack puts it back.
    ch3.basic_publish(
        "cx".into(),
        "k".into(),
        BasicPublishOptions::default(),
        b"again",
        persistent(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let (body, _) = next_delivery(&mut consumer, false).await;
    assert_eq!(body, "again");
    ch2.close(200, "bye".into()).await.unwrap();
    wait_count(&node1, "cq", 1).await;
    let got = within(
        "basic.get",
        ch3.basic_get("cq".into(), lapin::options::BasicGetOptions::default()),
    )
    .await
    .unwrap()
    .expect("a message");
    assert_eq!(&got.delivery.data[..], b"again");
    assert!(got.delivery.redelivered);
    got.delivery
        .nack(lapin::options::BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await
        .unwrap();
    wait_count(&node1, "cq", 1).await;

    // Node 3, restarted, still reaches the queue; a delete on node 2 deletes it everywhere.
    drop((ch3, c3));
    node3.kill();
    let node3 = start_node(3, &ports, &secret, &root);
    wait_count(&node3, "cq", 1).await;
    let c2 = node2.connect().await;
    let ch2 = c2.create_channel().await.unwrap();
    // queue.delete's if-empty is checked by the queue's node.
    let refused = ch2
        .queue_delete(
            "cq".into(),
            lapin::options::QueueDeleteOptions {
                if_empty: true,
                ..Default::default()
            },
        )
        .await
        .expect_err("not empty");
    assert!(refused.to_string().contains("not empty"), "{refused}");
    let ch2 = c2.create_channel().await.unwrap();
    wait_count(&node1, "cq", 1).await;
    let deleted = within(
        "queue.delete",
        ch2.queue_delete("cq".into(), Default::default()),
    )
    .await
    .unwrap();
    assert_eq!(deleted, 1);
    for n in [&node1, &node3] {
        eventually("the queue is gone", || async {
            count_on(n, "cq").await.is_none()
        })
        .await;
    }

    // An exclusive consumer on node 2 keeps consumers on node 3 off; an auto-delete queue
    // goes with its last consumer, wherever that consumer was.
    let mut args = FieldTable::default();
    args.insert("x-expires".into(), AMQPValue::LongInt(600_000));
    within(
        "queue.declare",
        ch1.queue_declare(
            "cq-auto".into(),
            QueueDeclareOptions {
                durable: true,
                auto_delete: true,
                ..Default::default()
            },
            args,
        ),
    )
    .await
    .unwrap();
    wait_count(&node3, "cq-auto", 0).await;
    wait_count(&node2, "cq-auto", 0).await;
    let (excl, _consumer) = try_consume(&c2, "cq-auto", "only", true)
        .await
        .expect("exclusive on node 2");
    let c3 = node3.connect().await;
    eventually("node 3 refused while node 2 holds it", || async {
        try_consume(&c3, "cq-auto", "other", false).await.is_err()
    })
    .await;
    excl.close(200, "bye".into()).await.unwrap();
    for n in [&node1, &node3] {
        eventually("the auto-delete queue is gone", || async {
            count_on(n, "cq-auto").await.is_none()
        })
        .await;
    }

    // While the queue's node is down, the others answer as RabbitMQ: its home node is down.
    declare_classic(&ch1, "cq-down").await;
    wait_count(&node2, "cq-down", 0).await;
    drop((ch1, c1));
    node1.kill();
    // (Once node 2 has seen the connection to node 1 drop.)
    let deadline = Instant::now() + Duration::from_secs(15);
    let e = loop {
        let ch2 = c2.create_channel().await.unwrap();
        let r = ch2
            .queue_declare(
                "cq-down".into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await;
        match r {
            Err(e) => break e,
            Ok(_) => assert!(Instant::now() < deadline, "node 1's queue still served"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(e.to_string().contains("is down or inaccessible"), "{e}");
    let ch2 = c2.create_channel().await.unwrap();
    let e = ch2
        .queue_delete("cq-down".into(), Default::default())
        .await
        .expect_err("home node down");
    assert!(e.to_string().contains("is down or inaccessible"), "{e}");
    let node1 = start_node(1, &ports, &secret, &root);
    wait_count(&node2, "cq-down", 0).await;
    wait_count(&node1, "cq-down", 0).await;
    let _ = c2.close(200, "bye".into()).await;
    let _ = c3.close(200, "bye".into()).await;
    drop((node1, node2, node3));
    let _ = std::fs::remove_dir_all(&root);
}

/// Declares durable classic queue `q` on `ch`.
async fn declare_classic(ch: &lapin::Channel, q: &str) {
    within(
        "queue.declare",
        ch.queue_declare(
            q.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .expect("classic queue declared");
}

/// The queue's (ready, unacknowledged) counts as node `port`'s API shows them.
async fn ready_unacked(port: u16, q: &str) -> (u64, u64) {
    let v = api_get(port, &format!("/api/queues/%2F/{q}")).await;
    (
        v["messages_ready"].as_u64().unwrap_or(u64::MAX),
        v["messages_unacknowledged"].as_u64().unwrap_or(u64::MAX),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_changes_lose_no_publish_and_strand_no_delivery() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-changes");
    let api = [free_port(), free_port(), free_port()];
    let [node1, _node2, node3] =
        [1, 2, 3].map(|id| start_node_with_api(id, &ports, &secret, &root, api[id - 1]));
    let name3 = "warren-3@127.0.0.1";
    let q = "changing";
    let c1 = node1.connect().await;
    let ch1 = c1.create_channel().await.unwrap();
    declare_with(
        &ch1,
        q,
        "x-quorum-initial-group-size",
        AMQPValue::LongInt(2),
    )
    .await;
    wait_count(&node3, q, 0).await;

    // Publishes on node 3 (mandatory, confirmed) while node 3's member is added and removed
    // again and again: each is routed to the queue, through a stand-in or the member.
    let c3 = node3.connect().await;
    let pub3 = c3.create_channel().await.unwrap();
    pub3.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let publisher = tokio::spawn(async move {
        let mut sent = 0u32;
        let deadline = Instant::now() + Duration::from_secs(12);
        while Instant::now() < deadline {
            let confirm = pub3
                .basic_publish(
                    "".into(),
                    q.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    format!("p{sent}").as_bytes(),
                    persistent(),
                )
                .await
                .unwrap()
                .await
                .unwrap();
            assert!(confirm.is_ack(), "publish {sent} not confirmed");
            assert!(
                confirm.take_message().is_none(),
                "publish {sent} returned unroutable"
            );
            sent += 1;
        }
        sent
    });
    for _ in 0..3 {
        let (status, body) = api_replicas(api[0], q, true, name3).await;
        assert_eq!(status, 204, "{body}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (status, body) = api_replicas(api[0], q, false, name3).await;
        assert_eq!(status, 204, "{body}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let sent = publisher.await.unwrap();
    assert!(sent > 0);
    wait_count(&node1, q, sent).await;
    let _ = ch1.queue_purge(q.into(), Default::default()).await;

    // A consumer on node 3 holds deliveries it did not ack when node 3's member is added, and
    // again when it is removed: they go back to the queue each time, none stays checked out.
    let ch = c3.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    publish_confirmed(&ch, q, (0..30).map(|i| format!("m{i}"))).await;
    for add in [true, false] {
        let consumer_ch = c3.create_channel().await.unwrap();
        consumer_ch
            .basic_qos(10, BasicQosOptions::default())
            .await
            .unwrap();
        let mut consumer = consumer_ch
            .basic_consume(
                q.into(),
                "holding".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        for _ in 0..10 {
            next_delivery(&mut consumer, false).await;
        }
        eventually("10 deliveries held", || async {
            ready_unacked(api[0], q).await == (20, 10)
        })
        .await;
        let (status, body) = api_replicas(api[0], q, add, name3).await;
        assert_eq!(status, 204, "{body}");
        eventually("the held deliveries back in the queue", || async {
            ready_unacked(api[0], q).await == (30, 0)
        })
        .await;
        let _ = consumer_ch.close(200, "bye".into()).await;
    }
    // Node 1, which node 3's stand-in asks first, loses its member too: node 3's publishes
    // are passed on to node 2, none refused on the way.
    let (status, body) = api_replicas(api[0], q, false, "warren-1@127.0.0.1").await;
    assert_eq!(status, 204, "{body}");
    eventually("node 2 alone holds the queue", || async {
        members_on(api[1], q).await == ["warren-2@127.0.0.1"]
    })
    .await;
    publish_confirmed(&ch, q, (30..40).map(|i| format!("m{i}"))).await;
    wait_count(&node3, q, 40).await;
    // queue.declare-ok on a node without a member counts as of now, as RabbitMQ's.
    within("queue.purge", ch.queue_purge(q.into(), Default::default()))
        .await
        .unwrap();
    assert_eq!(count_on(&node3, q).await, Some(0));
    publish_confirmed(&ch, q, (0..3).map(|i| format!("n{i}"))).await;
    assert_eq!(count_on(&node3, q).await, Some(3));
    let _ = c3.close(200, "bye".into()).await;
    let _ = c1.close(200, "bye".into()).await;
    let _ = std::fs::remove_dir_all(&root);
}

/// A queue whose group lost its quorum (one of its two members down) holds publishes it
/// cannot commit; deleted (the cluster's metadata still has its majority), it is gone at
/// once, and the same name declared again makes a queue that commits and delivers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_without_its_quorum_is_deleted_and_declared_again() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-stuck-delete");
    let api = [free_port(), free_port(), free_port()];
    let [node1, node2, node3] =
        [1, 2, 3].map(|id| start_node_with_api(id, &ports, &secret, &root, api[id - 1]));
    let conn = node1.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    declare_with(
        &ch,
        "qs",
        "x-quorum-initial-group-size",
        AMQPValue::LongInt(2),
    )
    .await;
    // A new queue's members go to the next nodes by id: nodes 1 and 2.
    let name = |id: usize| format!("warren-{id}@127.0.0.1");
    wait_members(api[0], "qs", &[name(1), name(2)]).await;
    node2.kill();

    // One publish at a time, so that each is its own proposal: more than the group keeps
    // in flight, none can be committed.
    let pch = conn.create_channel().await.expect("channel");
    pch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    let mut pending = Vec::new();
    for i in 0..16 {
        pending.push(
            pch.basic_publish(
                "".into(),
                "qs".into(),
                BasicPublishOptions::default(),
                format!("stuck-{i}").as_bytes(),
                persistent(),
            )
            .await
            .expect("publish"),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    within(
        "queue.delete",
        ch.queue_delete("qs".into(), Default::default()),
    )
    .await
    .expect("queue.delete");
    // Declared again (with members on the two running nodes), it commits and delivers.
    declare_with(
        &ch,
        "qs",
        "x-quorum-initial-group-size",
        AMQPValue::LongInt(2),
    )
    .await;
    wait_members(api[0], "qs", &[name(1), name(3)]).await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    let confirm = within(
        "confirm of a publish to the queue declared again",
        ch.basic_publish(
            "".into(),
            "qs".into(),
            BasicPublishOptions::default(),
            b"after",
            persistent(),
        )
        .await
        .expect("publish"),
    )
    .await
    .expect("confirm");
    assert!(confirm.is_ack());
    let got = within("basic.get", ch.basic_get("qs".into(), Default::default()))
        .await
        .expect("basic.get")
        .expect("the message published after the declare");
    assert_eq!(got.delivery.data, b"after");
    drop(pending);
    drop((node1, node3));
    let _ = std::fs::remove_dir_all(&root);
}

/// A member left on a node that was down while its queue was deleted comes back with the
/// old group's log and membership, and asks the other old member for its vote: the queue
/// declared again since under the name keeps its leader and its messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_left_by_a_delete_does_not_take_over_the_queue_declared_again() {
    let _slot = CLUSTERS.acquire().await.expect("cluster slot");
    let (root, secret, ports) = cluster("quorum-cluster-left-behind");
    let api = [free_port(), free_port(), free_port()];
    let [node1, node2, node3] =
        [1, 2, 3].map(|id| start_node_with_api(id, &ports, &secret, &root, api[id - 1]));
    let name = |id: usize| format!("warren-{id}@127.0.0.1");
    let conn = node1.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");

    // Members on nodes 1 and 2, with a long log.
    declare_with(
        &ch,
        "ql",
        "x-quorum-initial-group-size",
        AMQPValue::LongInt(2),
    )
    .await;
    wait_members(api[0], "ql", &[name(1), name(2)]).await;
    publish_confirmed(&ch, "ql", (0..200).map(|i| format!("old-{i}"))).await;

    // Node 2 down; the queue deleted (node 2's member stays on its disk) and declared again,
    // with members on nodes 1 and 3.
    node2.kill();
    within(
        "queue.delete",
        ch.queue_delete("ql".into(), Default::default()),
    )
    .await
    .expect("queue.delete");
    declare_with(
        &ch,
        "ql",
        "x-quorum-initial-group-size",
        AMQPValue::LongInt(2),
    )
    .await;
    wait_members(api[0], "ql", &[name(1), name(3)]).await;
    publish_confirmed(&ch, "ql", (0..3).map(|i| format!("new-{i}"))).await;

    // Node 2 back, for several election timeouts: the queue holds what was confirmed since
    // its declare, and nothing else.
    let node2 = start_node_with_api(2, &ports, &secret, &root, api[1]);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let mut got = Vec::new();
    while let Some(m) = within(
        "basic.get",
        ch.basic_get(
            "ql".into(),
            lapin::options::BasicGetOptions { no_ack: true },
        ),
    )
    .await
    .expect("basic.get")
    {
        got.push(String::from_utf8(m.delivery.data.clone()).unwrap());
        assert!(got.len() <= 3, "got {got:?}");
    }
    assert_eq!(got, ["new-0", "new-1", "new-2"]);
    let _ = conn.close(200, "bye".into()).await;
    drop((node1, node2, node3));
    let _ = std::fs::remove_dir_all(&root);
}

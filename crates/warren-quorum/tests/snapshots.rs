//! A quorum queue's state across restarts of its node: one that snapshots and purges its log
//! often comes back whole (the snapshot holds the queue state, the shared log the entries
//! after it), and one deleted leaves nothing in the shared log that a queue declared again
//! under its name would recover.

use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use warren_amqp::table::{FieldTable, FieldValue};
use warren_broker::vhost::QueueDeclare;
use warren_broker::{Message, VHost};
use warren_quorum::{QuorumConfig, QuorumKind, QuorumNode};

fn quorum_declare(name: &str) -> QueueDeclare {
    let mut arguments = FieldTable::new();
    arguments.insert(
        "x-queue-type",
        FieldValue::LongString(Bytes::from_static(b"quorum")),
    );
    QueueDeclare {
        name: name.into(),
        durable: true,
        arguments,
        ..Default::default()
    }
}

fn node(dir: &std::path::Path) -> (Arc<QuorumNode>, Arc<VHost>) {
    let mut cfg = QuorumConfig::new(dir);
    cfg.snapshot_every = 8;
    cfg.kept_after_snapshot = 0;
    let node = QuorumNode::new(cfg, tokio::runtime::Handle::current());
    let vhost = Arc::new(VHost::new("/"));
    vhost.set_queue_kind("quorum", QuorumKind::new(node.clone()));
    (node, vhost)
}

/// The groups the shared log of the node in `dir` holds, by key (`vhost` U+001F `name`).
fn logged_groups(dir: &std::path::Path) -> Vec<String> {
    let (log, groups) = warren_store::raftlog::RaftLog::open(
        warren_store::raftlog::RaftLogConfig::new(dir.join("log")),
    )
    .expect("log opens");
    log.close();
    let mut keys: Vec<String> = groups.into_keys().collect();
    keys.sort();
    keys
}

/// Publishes `body` to `q`; the receiver gets its confirm (true) or nack.
fn publish(v: &VHost, body: String) -> tokio::sync::oneshot::Receiver<bool> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let done = warren_broker::completion_once(move |ok| {
        let _ = tx.send(ok);
    });
    let m = Message::new(
        String::new(),
        "q".into(),
        Default::default(),
        Bytes::from(body),
    );
    let p = v.publish(Arc::new(m), Some((done, 1))).expect("routed");
    assert!(p.stored, "the quorum queue confirms it");
    rx
}

/// Waits for a confirm: true for basic.ack.
async fn confirmed(rx: tokio::sync::oneshot::Receiver<bool>) -> bool {
    tokio::time::timeout(Duration::from_secs(15), rx)
        .await
        .expect("confirmed in time")
        .expect("completion")
}

async fn publish_confirmed(v: &VHost, body: String) {
    assert!(confirmed(publish(v, body)).await);
}

/// Takes messages with basic.get (no ack) until `n` are taken or 10 s pass.
async fn get_all(v: &VHost, n: usize) -> Vec<String> {
    let q = v.queue("q", 1).expect("queue");
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while out.len() < n && tokio::time::Instant::now() < deadline {
        match q.get(true) {
            Some((m, _)) => out.push(String::from_utf8_lossy(&m.message.body).into_owned()),
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_comes_back_from_snapshot_and_log() {
    let dir = std::env::temp_dir().join(format!("warren-quorum-snap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    {
        let (node, v) = node(&dir);
        v.declare_queue(&quorum_declare("q"), 1).expect("declared");
        for i in 0..40 {
            publish_confirmed(&v, format!("m{i}")).await;
        }
        // Take ten (no ack): settled by the log too.
        assert_eq!(get_all(&v, 10).await.len(), 10);
        // Let the settlements commit and a snapshot be taken.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let snapshots = std::fs::read_dir(dir.join("snapshots"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(snapshots, 1, "a snapshot was written");
        node.close();
    }
    // The log was purged behind the snapshot.
    {
        let (log, groups) = warren_store::raftlog::RaftLog::open(
            warren_store::raftlog::RaftLogConfig::new(dir.join("log")),
        )
        .expect("log opens");
        let g = &groups["/\u{1f}q"];
        let (upto, _) = g.purged.clone().expect("purged");
        assert!(upto >= 8, "purged up to {upto}");
        assert!(g.entries.keys().all(|i| *i > upto));
        log.close();
    }
    let (node, v) = node(&dir);
    v.declare_queue(&quorum_declare("q"), 1)
        .expect("declared again");
    node.finish_recovery();
    let rest = get_all(&v, 30).await;
    let expected: Vec<String> = (10..40).map(|i| format!("m{i}")).collect();
    assert_eq!(rest, expected);
    node.close();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A queue deleted before its group started (declare and delete in the same tick of a
/// single-threaded runtime) starts no group after its drop: before the fix, the group started
/// anyway once the drop was done and wrote its vote and entries after the `DROP` record, where
/// a queue declared again under the name met them at the next recovery (and lost its own
/// entries to the stale ones' indexes).
#[tokio::test]
async fn a_queue_deleted_before_its_group_starts_leaves_nothing_in_the_log() {
    let dir = std::env::temp_dir().join(format!("warren-quorum-gone-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    {
        let (node, v) = node(&dir);
        v.declare_queue(&quorum_declare("q"), 1).expect("declared");
        v.delete_queue("q", false, false, 1).expect("deleted");
        // Time for a group that should not exist to start and elect itself.
        tokio::time::sleep(Duration::from_millis(500)).await;
        node.close();
    }
    assert_eq!(logged_groups(&dir), Vec::<String>::new());
    // Declared, deleted and declared again at once: the second queue keeps what it is sent.
    {
        let (node, v) = node(&dir);
        node.finish_recovery();
        v.declare_queue(&quorum_declare("q"), 1).expect("declared");
        v.delete_queue("q", false, false, 1).expect("deleted");
        v.declare_queue(&quorum_declare("q"), 1)
            .expect("declared again");
        // All sent before the group starts: they wait for it (and its first election).
        let sent: Vec<_> = (0..20).map(|i| publish(&v, format!("m{i}"))).collect();
        for (i, rx) in sent.into_iter().enumerate() {
            assert!(confirmed(rx).await, "publish {i} confirmed");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        node.close();
    }
    let (node, v) = node(&dir);
    v.declare_queue(&quorum_declare("q"), 1).expect("recovered");
    node.finish_recovery();
    let all = get_all(&v, 20).await;
    let expected: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    assert_eq!(all, expected);
    node.close();
    let _ = std::fs::remove_dir_all(&dir);
}

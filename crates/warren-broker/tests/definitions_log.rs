//! The durable definitions log: every durable change is one appended record; a reopened broker
//! rebuilds the topology from the snapshot and the log, across compactions, after a crash that
//! tore the last record, and from a data directory written before the log existed.

use std::path::{Path, PathBuf};
use warren_amqp::table::{encode_table, FieldTable, FieldValue};
use warren_broker::exchange::Destination;
use warren_broker::vhost::{ExchangeDeclare, QueueDeclare};
use warren_broker::{Broker, StorageOptions, VHost};

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-defslog-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn open(dir: &Path) -> Broker {
    Broker::open(StorageOptions::new(dir)).unwrap().0
}

fn durable_queue(name: &str) -> QueueDeclare {
    QueueDeclare {
        name: name.into(),
        durable: true,
        ..Default::default()
    }
}

fn exchange(name: &str, kind: &str, auto_delete: bool) -> ExchangeDeclare {
    ExchangeDeclare {
        name: name.into(),
        kind: kind.into(),
        durable: true,
        auto_delete,
        ..Default::default()
    }
}

fn queue_names(v: &VHost) -> Vec<String> {
    let mut names: Vec<String> = v.queues().iter().map(|q| q.name().to_string()).collect();
    names.sort();
    names
}

fn routed(v: &VHost, exchange: &str, key: &str) -> Vec<String> {
    let mut out = Vec::new();
    v.route(exchange, key, None, &mut out).unwrap();
    let mut names: Vec<String> = out.iter().map(|q| q.name().to_string()).collect();
    names.sort();
    names
}

fn files(dir: &Path, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("definitions"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(suffix))
        .collect();
    names.sort();
    names
}

#[test]
fn changes_survive_restarts_through_the_log_and_its_compaction() {
    let dir = tempdir("compaction");
    let none = FieldTable::new();
    let b = open(&dir);
    let v = b.vhost("/").unwrap();
    v.declare_exchange(&exchange("x", "direct", false)).unwrap();
    v.declare_exchange(&exchange("gone-with-binding", "fanout", true))
        .unwrap();
    // Enough queues with arguments for the log to outgrow its first threshold (256 KiB).
    let mut args = FieldTable::new();
    args.insert("x-message-ttl", FieldValue::I32(60_000));
    args.insert("x-dead-letter-exchange", FieldValue::LongString("x".into()));
    for i in 0..2_200 {
        v.declare_queue(
            &QueueDeclare {
                arguments: args.clone(),
                ..durable_queue(&format!("queue-with-a-long-name-{i:05}"))
            },
            1,
        )
        .unwrap();
    }
    assert!(
        files(&dir, ".defs").len() == 1,
        "no compaction wrote a snapshot: {:?}",
        files(&dir, "")
    );
    for i in 0..2_000 {
        v.delete_queue(&format!("queue-with-a-long-name-{i:05}"), false, false, 1)
            .unwrap();
    }
    v.declare_queue(&durable_queue("a"), 1).unwrap();
    v.declare_queue(&durable_queue("b"), 1).unwrap();
    v.bind("x", Destination::Queue("a".into()), "k", &none, 1)
        .unwrap();
    v.bind("x", Destination::Queue("b".into()), "k", &none, 1)
        .unwrap();
    v.bind("x", Destination::Queue("b".into()), "other", &none, 1)
        .unwrap();
    v.unbind("x", Destination::Queue("b".into()), "other", &none, 1)
        .unwrap();
    v.bind(
        "gone-with-binding",
        Destination::Queue("a".into()),
        "",
        &none,
        1,
    )
    .unwrap();
    // Deleting the queue takes the auto-delete exchange with its last binding.
    v.declare_queue(&durable_queue("short-lived"), 1).unwrap();
    v.declare_exchange(&exchange("ad", "fanout", true)).unwrap();
    v.bind("ad", Destination::Queue("short-lived".into()), "", &none, 1)
        .unwrap();
    v.delete_queue("short-lived", false, false, 1).unwrap();
    assert!(!v.exchange_exists("ad"));
    v.unbind(
        "gone-with-binding",
        Destination::Queue("a".into()),
        "",
        &none,
        1,
    )
    .unwrap();
    assert!(!v.exchange_exists("gone-with-binding"));
    let expected = queue_names(&v);
    assert_eq!(expected.len(), 202);
    b.close();

    for _ in 0..2 {
        let b = open(&dir);
        let v = b.vhost("/").unwrap();
        assert_eq!(queue_names(&v), expected);
        assert_eq!(routed(&v, "x", "k"), vec!["a", "b"]);
        assert!(routed(&v, "x", "other").is_empty());
        assert!(!v.exchange_exists("ad"));
        assert!(!v.exchange_exists("gone-with-binding"));
        let q = v.queue("queue-with-a-long-name-02100", 1).unwrap();
        assert_eq!(q.arguments(), &args);
        b.close();
    }
    let logs = files(&dir, ".log");
    assert_eq!(logs.len(), 1, "older log generations are deleted: {logs:?}");
    assert!(!logs[0].ends_with(".0.log"), "{logs:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_incomplete_last_record_is_cut_off() {
    let dir = tempdir("torn");
    let b = open(&dir);
    let v = b.vhost("/").unwrap();
    v.declare_queue(&durable_queue("q1"), 1).unwrap();
    v.declare_queue(&durable_queue("q2"), 1).unwrap();
    b.close();
    let log = dir.join("definitions").join(&files(&dir, ".log")[0]);
    let good = std::fs::metadata(&log).unwrap().len();
    // A crash in the middle of an append: a length announcing more than follows.
    let mut raw = std::fs::read(&log).unwrap();
    raw.extend_from_slice(&[0, 0, 1, 0, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3]);
    std::fs::write(&log, raw).unwrap();

    let b = open(&dir);
    let v = b.vhost("/").unwrap();
    assert_eq!(queue_names(&v), vec!["q1", "q2"]);
    assert_eq!(std::fs::metadata(&log).unwrap().len(), good);
    v.declare_queue(&durable_queue("q3"), 1).unwrap();
    b.close();
    let b = open(&dir);
    assert_eq!(queue_names(&b.vhost("/").unwrap()), vec!["q1", "q2", "q3"]);
    b.close();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A data directory written before the log existed holds only `vhost-<hex>.defs` files
/// without a log generation: they are the first snapshot, and changes go to the log from there.
#[test]
fn a_directory_from_before_the_log_is_read() {
    let dir = tempdir("upgrade");
    open(&dir).close();
    let mut queue = FieldTable::new();
    queue.insert("name", FieldValue::LongString("old".into()));
    queue.insert("auto_delete", FieldValue::Bool(false));
    queue.insert("arguments", FieldValue::Table(FieldTable::new()));
    let mut defs = FieldTable::new();
    defs.insert("name", FieldValue::LongString("/".into()));
    defs.insert("exchanges", FieldValue::Array(vec![]));
    defs.insert("queues", FieldValue::Array(vec![FieldValue::Table(queue)]));
    defs.insert("bindings", FieldValue::Array(vec![]));
    let mut body = bytes::BytesMut::new();
    encode_table(&defs, &mut body);
    let mut file = b"WARRENDEFS1\n".to_vec();
    file.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    file.extend_from_slice(&body);
    std::fs::create_dir_all(dir.join("definitions")).unwrap();
    std::fs::write(dir.join("definitions").join("vhost-2f.defs"), file).unwrap();

    let b = open(&dir);
    let v = b.vhost("/").unwrap();
    assert_eq!(queue_names(&v), vec!["old"]);
    v.declare_queue(&durable_queue("new"), 1).unwrap();
    b.close();
    let b = open(&dir);
    assert_eq!(queue_names(&b.vhost("/").unwrap()), vec!["new", "old"]);
    b.close();
    std::fs::remove_dir_all(&dir).unwrap();
}

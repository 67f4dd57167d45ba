//! `VHost::used_queues`, what the management rate sampler and the HTTP queue API's
//! checkpoints visit instead of every queue: a queue that recovers messages at start is in it
//! (so that the sampler counts its messages), one that never held a message is not, and a
//! queue deleted or declared again under its name is there only as the vhost holds it now.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use warren_amqp::properties::BasicProperties;
use warren_broker::message::Message;
use warren_broker::vhost::QueueDeclare;
use warren_broker::{Broker, StorageOptions};

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-used-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn open(dir: &Path) -> Broker {
    Broker::open(StorageOptions::new(dir)).unwrap().0
}

fn names(b: &Broker) -> Vec<String> {
    let mut n: Vec<String> = b
        .vhost("/")
        .unwrap()
        .used_queues()
        .iter()
        .map(|q| q.name().to_string())
        .collect();
    n.sort();
    n
}

#[test]
fn queues_that_recover_messages_are_used_and_idle_ones_are_not() {
    let dir = tempdir("recovered");
    let b = open(&dir);
    let v = b.vhost("/").unwrap();
    for name in ["full", "idle"] {
        let d = QueueDeclare {
            name: name.into(),
            durable: true,
            ..Default::default()
        };
        v.declare_queue(&d, 1).unwrap();
    }
    for body in [&b"a"[..], b"b", b"c"] {
        let props = BasicProperties {
            delivery_mode: Some(2),
            ..Default::default()
        };
        let m = Message::new(String::new(), "full".into(), props, body.to_vec().into());
        let (done, synced) = std::sync::mpsc::channel();
        let waiter = warren_broker::completion_once(move |ok| {
            let _ = done.send(ok);
        });
        let p = v.publish(Arc::new(m), Some((waiter, 0))).unwrap();
        assert!(p.stored);
        assert!(synced.recv().unwrap());
    }
    assert_eq!(names(&b), ["full"]);
    b.close();
    drop((v, b));

    let b = open(&dir);
    let v = b.vhost("/").unwrap();
    let full = v.queue("full", 1).unwrap();
    assert_eq!(full.counts().ready, 3);
    // Recovered with put position 0: it joined at recovery, not at an enqueue.
    assert_eq!(full.positions().put, 0);
    assert_eq!(names(&b), ["full"]);
    assert!(v.queue("idle", 1).is_ok());
    b.close();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn only_the_queue_held_under_a_name_is_used() {
    let b = Broker::new();
    let v = b.vhost("/").unwrap();
    let d = QueueDeclare {
        name: "q".into(),
        ..Default::default()
    };
    let publish = |v: &warren_broker::VHost| {
        let m = Message::new(String::new(), "q".into(), Default::default(), "x".into());
        v.publish(Arc::new(m), None).unwrap();
    };
    let (first, _) = v.declare_queue(&d, 1).unwrap();
    publish(&v);
    assert_eq!(names(&b), ["q"]);
    // Deleted, then declared again: the new queue joins at its own first message; the old
    // one is gone from the set even while something still holds it.
    v.delete_queue("q", false, false, 1).unwrap();
    assert!(names(&b).is_empty());
    let (second, _) = v.declare_queue(&d, 1).unwrap();
    assert!(names(&b).is_empty());
    publish(&v);
    let used = v.used_queues();
    assert_eq!(used.len(), 1);
    assert!(Arc::ptr_eq(&used[0], &second));
    assert!(!Arc::ptr_eq(&used[0], &first));
}

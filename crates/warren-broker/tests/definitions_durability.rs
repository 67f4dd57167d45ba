//! Durable definitions when they cannot be stored: every change a client asked for is refused
//! with 541 INTERNAL_ERROR and rolled back in memory, changes the broker makes itself are kept
//! and stored by a later retry, and what a reopened broker finds is exactly what was answered
//! ok.
//!
//! A save is made to fail by putting a regular file where the `definitions` directory goes
//! (creating the directory then fails for root too).

use std::path::{Path, PathBuf};
use warren_amqp::table::FieldTable;
use warren_broker::exchange::Destination;
use warren_broker::vhost::{ExchangeDeclare, QueueDeclare};
use warren_broker::{Broker, StorageOptions, VHost};

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-defs-{name}-{}", std::process::id()));
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

fn durable_exchange(name: &str) -> ExchangeDeclare {
    ExchangeDeclare {
        name: name.into(),
        kind: "fanout".into(),
        durable: true,
        ..Default::default()
    }
}

/// Makes saves fail (`definitions` becomes a file) or work again.
fn break_definitions(dir: &Path, broken: bool) {
    let defs = dir.join("definitions");
    if broken {
        let _ = std::fs::remove_dir_all(&defs);
        std::fs::write(&defs, b"not a directory").unwrap();
    } else {
        std::fs::remove_file(&defs).unwrap();
    }
}

fn bound(v: &VHost, exchange: &str, queue: &str) -> bool {
    let mut out = Vec::new();
    v.route(exchange, "", None, &mut out).unwrap();
    out.iter().any(|q| q.name() == queue)
}

#[test]
fn refused_changes_are_rolled_back_and_never_stored() {
    let dir = tempdir("refused");
    let b = open(&dir);
    let v = b.vhost("/").unwrap();
    let none = FieldTable::new();
    v.declare_exchange(&durable_exchange("x")).unwrap();
    v.declare_queue(&durable_queue("kept"), 1).unwrap();
    v.bind("x", Destination::Queue("kept".into()), "", &none, 1)
        .unwrap();

    break_definitions(&dir, true);
    // Every durable change is refused with 541 and leaves no trace in memory.
    let e = v.declare_queue(&durable_queue("new"), 1).unwrap_err();
    assert_eq!(e.code, 541, "{e:?}");
    assert!(
        e.text.starts_with("failed to declare queue 'new' in vhost '/' because the definitions could not be stored"),
        "{}",
        e.text
    );
    assert_eq!(v.queue("new", 1).unwrap_err().code, 404);
    let e = v.declare_exchange(&durable_exchange("y")).unwrap_err();
    assert_eq!(e.code, 541);
    assert!(!v.exchange_exists("y"));
    let e = v
        .unbind("x", Destination::Queue("kept".into()), "", &none, 1)
        .unwrap_err();
    assert_eq!(e.code, 541);
    assert!(
        bound(&v, "x", "kept"),
        "a refused unbind removed the binding"
    );
    let e = v.delete_queue("kept", false, false, 1).unwrap_err();
    assert_eq!(e.code, 541);
    assert!(
        v.queue("kept", 1).is_ok(),
        "a refused delete removed the queue"
    );
    assert!(
        bound(&v, "x", "kept"),
        "a refused delete removed the binding"
    );
    let e = v.delete_exchange("x", false).unwrap_err();
    assert_eq!(e.code, 541);
    assert!(v.exchange_exists("x") && bound(&v, "x", "kept"));
    v.declare_queue(&durable_queue("other"), 1).unwrap_err();
    // Transient changes need no storage and still work.
    v.declare_queue(
        &QueueDeclare {
            name: "transient".into(),
            ..Default::default()
        },
        1,
    )
    .unwrap();

    break_definitions(&dir, false);
    v.declare_queue(&durable_queue("later"), 1).unwrap();
    b.close();

    let b = open(&dir);
    let v = b.vhost("/").unwrap();
    let mut names: Vec<String> = v.queues().iter().map(|q| q.name().to_string()).collect();
    names.sort();
    assert_eq!(names, vec!["kept", "later"]);
    assert!(bound(&v, "x", "kept"));
    assert!(!v.exchange_exists("y"));
    b.close();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn broker_made_changes_are_stored_by_a_retry() {
    let dir = tempdir("retry");
    let b = open(&dir);
    let v = b.vhost("/").unwrap();
    let (q, _) = v
        .declare_queue(
            &QueueDeclare {
                auto_delete: true,
                ..durable_queue("ad")
            },
            1,
        )
        .unwrap();
    break_definitions(&dir, true);
    // The broker removes the queue by itself (as after its last consumer left): no client
    // can be refused, so the removal stays and the save is retried.
    v.remove_queue(&q);
    assert_eq!(v.queue("ad", 1).unwrap_err().code, 404);
    v.sweep();
    break_definitions(&dir, false);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        v.sweep();
        let text = std::fs::read_dir(dir.join("definitions"))
            .ok()
            .and_then(|mut d| d.next())
            .is_some();
        if text {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no retry stored the definitions"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    b.close();
    let b = open(&dir);
    assert_eq!(b.vhost("/").unwrap().queue("ad", 1).unwrap_err().code, 404);
    b.close();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_second_broker_on_the_same_directory_is_refused() {
    let dir = tempdir("lock");
    let first = open(&dir);
    let err = Broker::open(StorageOptions::new(&dir))
        .err()
        .expect("second open refused")
        .to_string();
    assert!(err.contains("in use by another Warren process"), "{err}");
    assert!(err.contains(&dir.display().to_string()), "{err}");
    first.close();
    // Closed: the directory is free again.
    open(&dir).close();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unreadable_definitions_file_stops_the_start() {
    let dir = tempdir("corrupt");
    let b = open(&dir);
    b.vhost("/")
        .unwrap()
        .declare_queue(&durable_queue("q"), 1)
        .unwrap();
    b.close();
    let file = std::fs::read_dir(dir.join("definitions"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut raw = std::fs::read(&file).unwrap();
    let last = raw.len() - 1;
    raw[last] ^= 0xff;
    std::fs::write(&file, raw).unwrap();
    let err = Broker::open(StorageOptions::new(&dir))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("checksum mismatch"), "{err}");
    assert!(err.contains(&file.display().to_string()), "{err}");
    // The lock was released with the failed start.
    std::fs::remove_file(&file).unwrap();
    open(&dir).close();
    std::fs::remove_dir_all(&dir).unwrap();
}

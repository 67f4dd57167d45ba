//! Queue order with concurrent publishers: a queue's order is the order in which it enqueued
//! its messages, and it keeps that order when its messages are requeued and when the broker
//! restarts (RabbitMQ's classic queues requeue to the original position and recover in queue
//! order). Message ids are taken by each publisher before the message reaches the queue, so
//! the queue must enqueue in id order, which requeue and recovery sort by.

use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use warren_amqp::properties::BasicProperties;
use warren_broker::queue::Settlement;
use warren_broker::vhost::QueueDeclare;
use warren_broker::{Broker, Message, Queue, QueuedMessage, StorageOptions, VHost};

const PUBLISHERS: usize = 4;
const EACH: usize = 400;

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-order-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A broker on `dir` whose queues keep `window` messages in memory and page the rest out.
fn open(dir: &Path, window: usize) -> Broker {
    let mut opts = StorageOptions::new(dir);
    opts.queue_window = window;
    opts.unacked_window = window;
    Broker::open(opts).unwrap().0
}

fn declare(v: &VHost, name: &str, priority: bool) -> Arc<Queue> {
    let mut arguments = warren_amqp::table::FieldTable::new();
    if priority {
        arguments.insert("x-max-priority", warren_amqp::table::FieldValue::I32(9));
    }
    v.declare_queue(
        &QueueDeclare {
            name: name.into(),
            durable: true,
            arguments,
            ..Default::default()
        },
        1,
    )
    .unwrap();
    v.queue(name, 1).unwrap()
}

/// `PUBLISHERS` threads each publish `EACH` persistent messages `p{t}-{n}` to `queue` at once,
/// as publishers on separate connections do.
fn publish_concurrently(v: &Arc<VHost>, queue: &str, priority: bool) {
    let barrier = Arc::new(std::sync::Barrier::new(PUBLISHERS));
    let threads: Vec<_> = (0..PUBLISHERS)
        .map(|t| {
            let (v, barrier, queue) = (v.clone(), barrier.clone(), queue.to_string());
            std::thread::spawn(move || {
                barrier.wait();
                for n in 0..EACH {
                    let props = BasicProperties {
                        delivery_mode: Some(2),
                        // Two priority levels, so that both interleave within each level.
                        priority: priority.then_some((n % 2) as u8 * 5),
                        ..Default::default()
                    };
                    let msg = Message::new(
                        String::new(),
                        queue.clone(),
                        props,
                        Bytes::from(format!("p{t}-{n}")),
                    );
                    v.publish(Arc::new(msg), None).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

fn body(m: &QueuedMessage) -> String {
    String::from_utf8_lossy(&m.message.body).into_owned()
}

/// Takes every ready message without acknowledging it, then requeues them all (as a channel
/// closing with unacked deliveries does, latest first); returns the bodies in delivery order.
fn take_all_and_requeue(q: &Arc<Queue>) -> Vec<String> {
    let taken: Vec<QueuedMessage> = std::iter::from_fn(|| q.get(false).map(|(m, _)| m)).collect();
    let bodies = taken.iter().map(body).collect();
    let settlements = taken
        .into_iter()
        .rev()
        .map(|message| Settlement {
            consumer_tag: None,
            message,
            requeue: true,
            rejected: false,
        })
        .collect();
    q.settle(0, settlements);
    bodies
}

/// Each publisher's messages must come in its own order (a sanity check on the test itself).
fn assert_per_publisher_order(got: &[String], priority: bool) {
    for t in 0..PUBLISHERS {
        let prefix = format!("p{t}-");
        let mine: Vec<usize> = got
            .iter()
            .filter_map(|b| b.strip_prefix(&prefix)?.parse().ok())
            .collect();
        let mut want: Vec<usize> = (0..EACH).collect();
        if priority {
            want.sort_by_key(|n| (n % 2 == 0, *n));
        }
        assert_eq!(mine, want, "publisher {t}");
    }
}

fn check(name: &str, window: usize, priority: bool) {
    let dir = tempdir(name);
    let b = open(&dir, window);
    let v = b.vhost("/").unwrap();
    let q = declare(&v, "q", priority);
    publish_concurrently(&v, "q", priority);

    let first = take_all_and_requeue(&q);
    assert_eq!(first.len(), PUBLISHERS * EACH);
    assert_per_publisher_order(&first, priority);
    let again = take_all_and_requeue(&q);
    let moved = first.iter().zip(&again).filter(|(a, b)| a != b).count();
    assert_eq!(moved, 0, "requeued messages moved ({moved} positions)");
    drop(q);
    drop(v);
    b.close();

    let b = open(&dir, window);
    let q = b.vhost("/").unwrap().queue("q", 1).unwrap();
    let recovered = take_all_and_requeue(&q);
    let moved = first.iter().zip(&recovered).filter(|(a, b)| a != b).count();
    assert_eq!(recovered.len(), first.len());
    assert_eq!(
        moved, 0,
        "recovered queue changed order ({moved} positions)"
    );
    drop(q);
    b.close();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn concurrent_publishers_keep_queue_order_across_requeue_and_restart() {
    check("memory", 100_000, false);
}

#[test]
fn concurrent_publishers_keep_queue_order_when_paged() {
    // A window of 16: most messages go to the spill file, and the requeued deliveries come
    // back paged out.
    check("paged", 16, false);
}

#[test]
fn concurrent_publishers_keep_priority_queue_order() {
    check("priority", 16, true);
}

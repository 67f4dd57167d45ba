//! Unit tests of a queue with a fake delivery target: dispatch, prefetch, settlement, TTL.

use super::*;
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};

struct Sink {
    key: u64,
    got: Mutex<Vec<(String, u64, bool)>>,
    limit: usize,
    cancelled: Mutex<Vec<String>>,
}

impl DeliveryTarget for Sink {
    fn channel_key(&self) -> u64 {
        self.key
    }
    fn deliver(
        &self,
        _q: &Arc<Queue>,
        tag: &Arc<str>,
        _no_ack: bool,
        msg: QueuedMessage,
    ) -> std::result::Result<(), QueuedMessage> {
        let mut got = self.got.lock();
        if got.len() >= self.limit {
            return Err(msg);
        }
        got.push((tag.to_string(), msg.seq, msg.redelivered));
        Ok(())
    }
    fn cancelled_by_broker(&self, tag: &Arc<str>) {
        self.cancelled.lock().push(tag.to_string());
    }
}

static KEYS: AtomicU64 = AtomicU64::new(1);

fn sink(limit: usize) -> Arc<Sink> {
    Arc::new(Sink {
        key: KEYS.fetch_add(1, Ordering::Relaxed),
        got: Mutex::new(Vec::new()),
        limit,
        cancelled: Mutex::new(Vec::new()),
    })
}

fn msg(body: &str) -> Arc<Message> {
    Arc::new(Message::new(
        String::new(),
        "q".into(),
        Default::default(),
        Bytes::copy_from_slice(body.as_bytes()),
    ))
}

fn queue() -> Arc<Queue> {
    Arc::new(ClassicQueue::new(
        "q",
        "/",
        false,
        None,
        false,
        FieldTable::new(),
    ))
}

#[test]
fn round_robin_and_prefetch() {
    let q = queue();
    let a = sink(usize::MAX);
    let b = sink(usize::MAX);
    q.add_consumer(Consumer::new(
        "a".into(),
        a.clone(),
        false,
        false,
        2,
        FieldTable::new(),
    ))
    .unwrap();
    q.add_consumer(Consumer::new(
        "b".into(),
        b.clone(),
        false,
        false,
        1,
        FieldTable::new(),
    ))
    .unwrap();
    for i in 0..5 {
        q.publish(msg(&i.to_string()), i, None);
    }
    // a gets 0 and 2 (prefetch 2), b gets 1 (prefetch 1); 3 and 4 wait.
    let seqs = |s: &Sink| s.got.lock().iter().map(|g| g.1).collect::<Vec<_>>();
    assert_eq!(seqs(&a), vec![0, 2]);
    assert_eq!(seqs(&b), vec![1]);
    assert_eq!(
        q.counts(),
        QueueCounts {
            ready: 2,
            unacked: 3,
            consumers: 2
        }
    );
    q.settle(
        b.key,
        vec![Settlement {
            consumer_tag: Some("b".into()),
            message: QueuedMessage {
                seq: 1,
                message: msg("1"),
                redelivered: false,
                stored: None,
                expires_at: None,
            },
            requeue: false,
            rejected: false,
        }],
    );
    assert_eq!(seqs(&b), vec![1, 3]);
}

#[test]
fn higher_priority_consumers_first_while_they_have_credit() {
    let q = queue();
    let lo = sink(usize::MAX);
    let hi = sink(usize::MAX);
    let prio = |p: i32| {
        let mut t = FieldTable::new();
        t.insert("x-priority", warren_amqp::table::FieldValue::I32(p));
        t
    };
    q.add_consumer(Consumer::new(
        "lo".into(),
        lo.clone(),
        false,
        false,
        0,
        prio(1),
    ))
    .unwrap();
    q.add_consumer(Consumer::new(
        "hi".into(),
        hi.clone(),
        false,
        false,
        2,
        prio(10),
    ))
    .unwrap();
    for i in 0..5 {
        q.publish(msg(&i.to_string()), i, None);
    }
    let seqs = |s: &Sink| s.got.lock().iter().map(|g| g.1).collect::<Vec<_>>();
    // hi takes what its prefetch of 2 allows, lo gets the rest.
    assert_eq!(seqs(&hi), vec![0, 1]);
    assert_eq!(seqs(&lo), vec![2, 3, 4]);
    q.settle(
        hi.key,
        vec![Settlement {
            consumer_tag: Some("hi".into()),
            message: QueuedMessage {
                seq: 0,
                message: msg("0"),
                redelivered: false,
                stored: None,
                expires_at: None,
            },
            requeue: false,
            rejected: false,
        }],
    );
    q.publish(msg("5"), 5, None);
    assert_eq!(seqs(&hi), vec![0, 1, 5]);
}

#[test]
fn requeue_returns_to_original_position() {
    let q = queue();
    for i in 0..3 {
        q.publish(msg(&i.to_string()), i, None);
    }
    let (m0, left) = q.get(false).unwrap();
    assert_eq!(left, 2);
    let (m1, _) = q.get(false).unwrap();
    q.settle(
        0,
        vec![Settlement {
            consumer_tag: None,
            message: m1,
            requeue: true,
            rejected: false,
        }],
    );
    q.settle(
        0,
        vec![Settlement {
            consumer_tag: None,
            message: m0,
            requeue: true,
            rejected: false,
        }],
    );
    let order: Vec<(u64, bool)> = std::iter::from_fn(|| q.get(true))
        .map(|(m, _)| (m.seq, m.redelivered))
        .collect();
    assert_eq!(order, vec![(0, true), (1, true), (2, false)]);
}

#[test]
fn channel_refusal_keeps_message() {
    let q = queue();
    let a = sink(1);
    q.add_consumer(Consumer::new(
        "a".into(),
        a.clone(),
        false,
        false,
        0,
        FieldTable::new(),
    ))
    .unwrap();
    q.publish(msg("x"), 0, None);
    q.publish(msg("y"), 1, None);
    assert_eq!(q.counts().ready, 1);
    assert_eq!(a.got.lock().len(), 1);
}

#[test]
fn exclusive_consumers() {
    let q = queue();
    let a = sink(9);
    q.add_consumer(Consumer::new(
        "a".into(),
        a.clone(),
        false,
        false,
        0,
        FieldTable::new(),
    ))
    .unwrap();
    let err = q
        .add_consumer(Consumer::new(
            "b".into(),
            a.clone(),
            false,
            true,
            0,
            FieldTable::new(),
        ))
        .unwrap_err();
    assert_eq!(err.code, 403);
    assert_eq!(err.text, "queue 'q' in vhost '/' in exclusive use");
}

#[test]
fn auto_delete_on_last_consumer() {
    let q: Arc<Queue> = Arc::new(ClassicQueue::new(
        "q",
        "/",
        false,
        None,
        true,
        FieldTable::new(),
    ));
    let a = sink(9);
    q.add_consumer(Consumer::new(
        "a".into(),
        a.clone(),
        false,
        false,
        0,
        FieldTable::new(),
    ))
    .unwrap();
    q.add_consumer(Consumer::new(
        "b".into(),
        a.clone(),
        false,
        false,
        0,
        FieldTable::new(),
    ))
    .unwrap();
    assert!(!q.remove_consumer(a.key, "a"));
    assert!(!q.remove_consumer(a.key, "zzz"));
    assert!(q.remove_consumer(a.key, "b"));
}

#[test]
fn queues_without_policies_share_their_settings() {
    use crate::policy::Applied;
    let new = || ClassicQueue::new("q", "/", true, None, false, FieldTable::new());
    let (a, b) = (new(), new());
    assert!(!a.apply_policy(Applied::default()));
    assert!(Arc::ptr_eq(&a.args(), &a.declared));
    assert!(Arc::ptr_eq(&a.applied_policy(), &b.applied_policy()));
    // Queues declared without arguments share one parse of none, which is the default.
    assert!(Arc::ptr_eq(&a.declared, &b.declared));
    assert_eq!(
        *a.declared,
        QueueArgs::parse("queue 'q' in vhost '/'", &FieldTable::new()).unwrap()
    );
    assert_eq!(*a.declared, QueueArgs::default());
    // A policy that changes nothing keeps the settings shared; one that changes them gives
    // the queue its own.
    let named = Applied {
        policy: Some("p".into()),
        ..Applied::default()
    };
    assert!(!a.apply_policy(named.clone()));
    assert!(Arc::ptr_eq(&a.args(), &a.declared));
    assert_eq!(a.applied_policy().policy.as_deref(), Some("p"));
    let limiting = Applied {
        definition: crate::policy::parse_definition(&serde_json::json!({"max-length": 3}), false)
            .unwrap(),
        ..named
    };
    assert!(a.apply_policy(limiting));
    assert_eq!(a.args().max_length, Some(3));
    assert_eq!(a.declared.max_length, None);
    assert!(a.apply_policy(Applied::default()));
    assert_eq!(a.args().max_length, None);
    assert!(Arc::ptr_eq(&a.args(), &a.declared));
}

/// A queue's `Arc` (two counts and the queue) fits the allocator's 448-byte size class:
/// 8 bytes more and each of 100,000 idle queues takes a 512-byte block. What is the same for
/// every queue of a broker (the paging bounds, the spill directory, the vhost's name) is
/// shared, not copied, and what most queues leave empty (arguments, requeued paged-out
/// messages) costs a pointer until it holds something.
#[cfg(target_pointer_width = "64")]
#[test]
fn a_queue_fits_a_448_byte_block() {
    assert!(
        std::mem::size_of::<ClassicQueue>() + 2 * std::mem::size_of::<usize>() <= 448,
        "{} bytes",
        std::mem::size_of::<ClassicQueue>()
    );
}

/// Counts its wake-ups.
struct WakeCount(AtomicU64);

impl std::task::Wake for WakeCount {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// A paused publisher's waker is woken when deliveries take the queue below half its
/// window (4096 without a store), not before, and is not kept once woken.
#[test]
fn a_drained_queue_wakes_its_waiting_publisher() {
    let q = queue();
    let s = sink(usize::MAX);
    q.add_consumer(Consumer::new(
        "c".into(),
        s.clone(),
        false,
        false,
        1,
        FieldTable::new(),
    ))
    .unwrap();
    for i in 0..2100 {
        q.publish(msg("m"), i, None);
    }
    assert!(q.is_pressured());
    let count = Arc::new(WakeCount(AtomicU64::new(0)));
    let waker = std::task::Waker::from(count.clone());
    assert!(q.wake_when_drained(&waker));
    let settle_next = |q: &Arc<Queue>| {
        let seq = s.got.lock().last().unwrap().1;
        q.settle(
            s.key,
            vec![Settlement {
                consumer_tag: Some("c".into()),
                message: QueuedMessage {
                    seq,
                    message: msg("m"),
                    redelivered: false,
                    stored: None,
                    expires_at: None,
                },
                requeue: false,
                rejected: false,
            }],
        );
    };
    // 2099 ready: each ack lets one more be delivered.
    while q.counts().ready > 2048 {
        settle_next(&q);
    }
    assert_eq!(count.0.load(Ordering::Relaxed), 0, "woken while pressured");
    settle_next(&q);
    assert_eq!(q.counts().ready, 2047);
    assert!(!q.is_pressured());
    assert_eq!(count.0.load(Ordering::Relaxed), 1);
    // Woken once; registering is refused while the queue is not pressured.
    settle_next(&q);
    assert_eq!(count.0.load(Ordering::Relaxed), 1);
    assert!(!q.wake_when_drained(&waker));
}

//! Queues paging to the message store, driven directly with an injected clock: TTLs count
//! from the enqueue time however a message is paged or recovered, priority queues keep
//! priority order beyond their window and across a restart, and deliveries held by their
//! channel as store locations settle and requeue in place.

use bytes::Bytes;
use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use warren_amqp::properties::BasicProperties;
use warren_amqp::table::{FieldTable, FieldValue};
use warren_broker::clock::ManualClock;
use warren_broker::queue::{Backing, ClassicQueue, PagedSettlement, Paging, Settlement};
use warren_broker::{Consumer, DeliveryTarget, Message, Queue, QueuedMessage};
use warren_store::spill::SpillEntry;
use warren_store::{Store, StoreConfig};

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-paging-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn open(dir: &Path) -> (Store, warren_store::Recovered) {
    Store::open(StoreConfig::new(dir.join("messages"))).unwrap()
}

static SPILLS: AtomicU64 = AtomicU64::new(0);

/// A durable queue paging to `store` beyond `window` messages.
fn queue(store: &Store, dir: &Path, clock: &Arc<ManualClock>, args: FieldTable) -> Arc<Queue> {
    let n = SPILLS.fetch_add(1, Ordering::Relaxed);
    Arc::new(
        ClassicQueue::new("q", "/", true, None, false, args)
            .with_clock(clock.clone())
            .with_backing(Backing {
                store: store.clone(),
                paging: Arc::new(Paging {
                    window: 8,
                    window_bytes: 1 << 20,
                    unacked_window: 4,
                    unacked_window_bytes: 1 << 20,
                    spill_dir: dir.join("spill"),
                }),
                spill: n,
            }),
    )
}

fn args(pairs: &[(&str, FieldValue)]) -> FieldTable {
    let mut t = FieldTable::new();
    for (k, v) in pairs {
        t.insert(*k, v.clone());
    }
    t
}

/// Publishes like the vhost does: a persistent message is written to the store first, with
/// the enqueue time.
fn publish(q: &Arc<Queue>, store: &Store, clock: &ManualClock, body: &str, prio: Option<u8>) {
    let props = BasicProperties {
        delivery_mode: Some(2),
        priority: prio,
        ..Default::default()
    };
    let id = store.next_id();
    use warren_broker::clock::Clock;
    let loc = store
        .append_publish(
            id,
            "",
            "q",
            &props,
            body.as_bytes(),
            clock.now_ms(),
            &[q.store_key()],
            None,
        )
        .unwrap();
    let msg = Arc::new(Message::new(
        String::new(),
        "q".into(),
        props,
        Bytes::copy_from_slice(body.as_bytes()),
    ));
    q.publish(msg, id, Some(loc));
}

fn take(q: &Arc<Queue>, n: usize) -> Vec<String> {
    std::iter::from_fn(|| q.get(true))
        .take(n)
        .map(|(m, _)| String::from_utf8(m.message.body.to_vec()).unwrap())
        .collect()
}

fn drain(q: &Arc<Queue>) -> Vec<String> {
    take(q, usize::MAX)
}

/// Every ready message as `opt=view` shows it, position by position, checking that viewing
/// changes nothing: the counts, what is in memory and what is paged out stay the same.
fn view_all(q: &Arc<Queue>) -> Vec<String> {
    let before = (q.counts(), q.ready_in_memory_and_paged_out(), q.positions());
    let p = before.2;
    assert_eq!(q.peek_position(p.get()), None, "a consumed position");
    assert_eq!(q.peek_position(p.put + 1), None, "a position not yet used");
    let seen = (p.get() + 1..=p.put)
        .map(|pos| {
            let body = q
                .peek_position(pos)
                .unwrap_or_else(|| panic!("no message at {pos}"));
            String::from_utf8(body.to_vec()).unwrap()
        })
        .collect();
    let after = (q.counts(), q.ready_in_memory_and_paged_out(), q.positions());
    assert_eq!(before, after, "viewing changed the queue");
    seen
}

/// Recovers the queue's messages from a reopened store into a fresh queue, as the vhost does.
fn reopen(dir: &Path, clock: &Arc<ManualClock>, args: FieldTable) -> (Store, Arc<Queue>) {
    let (store, rec) = open(dir);
    let q = queue(&store, dir, clock, args);
    let entries = rec.queues.get(q.store_key()).cloned().unwrap_or_default();
    q.recover(&mut entries.into_iter().map(SpillEntry::from));
    (store, q)
}

#[test]
fn ttl_counts_from_enqueue_time_across_paging_and_restart() {
    let dir = tempdir("ttl");
    let clock = Arc::new(ManualClock::new(1_000_000));
    let ttl = || args(&[("x-message-ttl", FieldValue::I32(1000))]);
    let (store, _) = open(&dir);
    let q = queue(&store, &dir, &clock, ttl());
    // 40 messages, 32 of them beyond the window of 8: paged to the spill file.
    for i in 0..40 {
        publish(&q, &store, &clock, &format!("m{i}"), None);
    }
    clock.advance(600);
    // Taking 20 brings spilled ones back into memory at t+600: their TTL still ends at t+1000.
    assert_eq!(
        take(&q, 20),
        (0..20).map(|i| format!("m{i}")).collect::<Vec<_>>()
    );
    clock.advance(401);
    q.sweep();
    assert_eq!(q.counts().ready, 0, "paged messages outlived their TTL");

    // Across a restart: recovered messages expire 1000 ms after they were published, not
    // after recovery.
    for i in 0..40 {
        publish(&q, &store, &clock, &format!("r{i}"), None);
    }
    store.close();
    clock.advance(700);
    let (store, q) = reopen(&dir, &clock, ttl());
    assert_eq!(q.counts().ready, 40);
    clock.advance(299);
    q.sweep();
    assert_eq!(q.counts().ready, 40);
    clock.advance(2);
    q.sweep();
    assert_eq!(q.counts().ready, 0, "recovered messages outlived their TTL");
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn priority_queue_pages_in_priority_order_and_across_restart() {
    let dir = tempdir("prio");
    let clock = Arc::new(ManualClock::new(0));
    let prio = || args(&[("x-max-priority", FieldValue::I32(5))]);
    let (store, _) = open(&dir);
    let q = queue(&store, &dir, &clock, prio());
    // 600 messages, window 8: nearly all paged, in one spill file per priority. The last
    // ones are the highest priority: they must still come first.
    let prio_of = |i: usize| -> u8 {
        if i >= 590 {
            9
        } else {
            (i % 5) as u8
        }
    };
    for i in 0..600 {
        publish(&q, &store, &clock, &format!("{i}"), Some(prio_of(i)));
    }
    assert_eq!(q.counts().ready, 600);
    assert_eq!(q.ready_in_memory_and_paged_out(), (8, 592));
    // Expected: by priority (capped at 5) descending, then publish order.
    let mut want: Vec<usize> = (0..600).collect();
    want.sort_by_key(|&i| (5 - prio_of(i).min(5), i));
    let want: Vec<String> = want.iter().map(|i| i.to_string()).collect();
    // Viewed position by position in that order, wherever each message is.
    assert_eq!(view_all(&q), want);
    // Take half, restart, take the rest.
    assert_eq!(take(&q, 300), want[..300]);
    assert_eq!(view_all(&q), want[300..]);
    store.close();
    let (store, q) = reopen(&dir, &clock, prio());
    // After a restart the positions start again from 1 until a front end restores them.
    q.set_put_position(600);
    assert_eq!(view_all(&q), want[300..]);
    assert_eq!(drain(&q), want[300..]);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// A consumer's channel that keeps what it was given.
struct Chan {
    key: u64,
    got: Mutex<Vec<QueuedMessage>>,
}

impl DeliveryTarget for Chan {
    fn channel_key(&self) -> u64 {
        self.key
    }
    fn deliver(
        &self,
        _q: &Arc<Queue>,
        _tag: &Arc<str>,
        _no_ack: bool,
        msg: QueuedMessage,
    ) -> Result<(), QueuedMessage> {
        self.got.lock().push(msg);
        Ok(())
    }
    fn cancelled_by_broker(&self, _tag: &Arc<str>) {}
}

#[test]
fn paged_out_deliveries_settle_and_requeue_in_place() {
    let dir = tempdir("unacked");
    let clock = Arc::new(ManualClock::new(0));
    let (store, _) = open(&dir);
    let q = queue(&store, &dir, &clock, FieldTable::new());
    assert_eq!(q.unacked_window(), Some((4, 1 << 20)));
    let chan = Arc::new(Chan {
        key: 77,
        got: Mutex::new(Vec::new()),
    });
    let tag: Arc<str> = "c".into();
    q.add_consumer(Consumer::new(
        tag.clone(),
        chan.clone(),
        false,
        false,
        0,
        FieldTable::new(),
    ))
    .unwrap();
    for i in 0..30 {
        publish(&q, &store, &clock, &format!("m{i}"), None);
    }
    q.dispatch();
    let got = std::mem::take(&mut *chan.got.lock());
    assert_eq!(got.len(), 30);
    assert_eq!(q.counts().unacked, 30);
    // The channel keeps the first few in memory and the rest as store locations.
    let (mem, paged): (Vec<_>, Vec<_>) = got.into_iter().partition(|m| m.seq % 3 == 0);
    let paged: Vec<SpillEntry> = paged.iter().map(|m| q.page_out(m).unwrap()).collect();
    assert!(paged.iter().all(|e| !e.transient));
    q.remove_consumer(77, "c");
    // Ack a few paged ones, requeue the rest and the in-memory ones.
    let (acked, requeued) = paged.split_at(5);
    let settle = |entries: &[SpillEntry], requeue: bool| {
        entries
            .iter()
            .map(|e| PagedSettlement {
                consumer_tag: Some(tag.clone()),
                entry: *e,
                requeue,
                rejected: false,
            })
            .collect::<Vec<_>>()
    };
    q.settle_paged(77, settle(acked, false));
    q.settle_paged(77, settle(requeued, true));
    q.settle(
        77,
        mem.into_iter()
            .map(|m| Settlement {
                consumer_tag: Some(tag.clone()),
                message: m,
                requeue: true,
                rejected: false,
            })
            .collect(),
    );
    assert_eq!(q.counts().unacked, 0);
    assert_eq!(q.counts().ready, 25);
    // Viewed in queue order, the requeued ones paged out among those in memory.
    let viewed = view_all(&q);
    // Back in their original order, flagged redelivered, bodies read back.
    let order: Vec<(String, bool)> = std::iter::from_fn(|| q.get(true))
        .map(|(m, _)| {
            (
                String::from_utf8(m.message.body.to_vec()).unwrap(),
                m.redelivered,
            )
        })
        .collect();
    assert_eq!(order.len(), 25);
    assert!(order.iter().all(|(_, r)| *r));
    let mut sorted = order.clone();
    sorted.sort_by_key(|(b, _)| b[1..].parse::<u32>().unwrap());
    assert_eq!(order, sorted, "requeued messages out of order");
    assert_eq!(
        viewed,
        order.into_iter().map(|(b, _)| b).collect::<Vec<_>>()
    );
    store.close();
    // The acked ones are gone for good; the requeued ones were taken with get(no_ack).
    let (store, rec) = open(&dir);
    assert!(rec.queues.get(q.store_key()).is_none_or(|v| v.is_empty()));
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// `opt=view` of a deep queue: positions in memory, in the spill file's memory tail, in the
/// spill file on disk, after partial consumption and after a restart, each read without
/// taking or moving anything, in the order gets return them.
#[test]
fn view_reads_any_position_of_a_deep_queue_without_changing_it() {
    let dir = tempdir("view");
    let clock = Arc::new(ManualClock::new(0));
    let (store, _) = open(&dir);
    let q = queue(&store, &dir, &clock, FieldTable::new());
    // 3000 messages, window 8: most of them in the spill file on disk.
    for i in 0..3000 {
        publish(&q, &store, &clock, &format!("m{i}"), None);
    }
    assert_eq!(q.ready_in_memory_and_paged_out(), (8, 2992));
    let all: Vec<String> = (0..3000).map(|i| format!("m{i}")).collect();
    assert_eq!(view_all(&q), all);
    assert_eq!(take(&q, 1234), all[..1234]);
    assert_eq!(q.peek_position(1234), None);
    assert_eq!(q.peek_position(1235).as_deref(), Some(&b"m1234"[..]));
    assert_eq!(view_all(&q), all[1234..]);
    store.close();
    let (store, q) = reopen(&dir, &clock, FieldTable::new());
    q.set_put_position(3000);
    assert_eq!(view_all(&q), all[1234..]);
    assert_eq!(drain(&q), all[1234..]);
    assert_eq!(q.peek_position(3000), None);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

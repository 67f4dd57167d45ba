//! The queue backend seam: a second kind of queue, registered under a made-up `x-queue-type`,
//! is created by queue.declare, receives what a topic exchange routes to it and delivers to a
//! consumer's [`DeliveryTarget`], with routing and the vhost unchanged. Every call the broker
//! makes on the queue goes through [`QueueBackend`]: the recording queue logs them, so a
//! routing path that bypassed the trait (or built a classic queue instead) fails here.

use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use warren_amqp::table::{FieldTable, FieldValue};
use warren_broker::args::QueueArgs;
use warren_broker::dead_letter::DeadLetter;
use warren_broker::policy::Applied;
use warren_broker::queue::{
    PagedSettlement, Positions, QueueCounts, QueueKind, QueueSpec, Settlement,
};
use warren_broker::registry::QueueStats;
use warren_broker::vhost::{ExchangeDeclare, QueueDeclare};
use warren_broker::{
    BrokerError, Consumer, DeliveryTarget, Destination, Message, Queue, QueueBackend,
    QueuedMessage, VHost,
};
use warren_store::spill::SpillEntry;
use warren_store::{Location, Store};

/// A queue that keeps its messages in a plain list and logs every call the broker makes.
struct RecordingQueue {
    name: String,
    vhost: String,
    durable: bool,
    exclusive_owner: Option<u64>,
    auto_delete: bool,
    arguments: FieldTable,
    stats: QueueStats,
    order: Mutex<()>,
    state: Mutex<Recorded>,
    sweep_mark: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Recorded {
    calls: Vec<String>,
    ready: VecDeque<QueuedMessage>,
    consumers: Vec<(Arc<str>, Arc<dyn DeliveryTarget>, bool)>,
    unacked: u32,
    deleted: bool,
}

impl std::fmt::Debug for RecordingQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingQueue")
            .field("name", &self.name)
            .finish()
    }
}

impl RecordingQueue {
    fn calls(&self) -> Vec<String> {
        self.state.lock().calls.clone()
    }
    fn log(&self, call: String) {
        self.state.lock().calls.push(call);
    }
    /// Hands ready messages to the first consumer that takes them.
    fn deliver(&self, this: &Arc<Queue>) {
        let mut st = self.state.lock();
        while let Some(qm) = st.ready.pop_front() {
            let Some((tag, target, no_ack)) = st.consumers.first().cloned() else {
                st.ready.push_front(qm);
                return;
            };
            match target.deliver(this, &tag, no_ack, qm) {
                Ok(()) => st.unacked += u32::from(!no_ack),
                Err(qm) => {
                    st.ready.push_front(qm);
                    return;
                }
            }
        }
    }
}

impl QueueBackend for RecordingQueue {
    fn name(&self) -> &str {
        &self.name
    }
    fn vhost(&self) -> &str {
        &self.vhost
    }
    fn kind(&self) -> &'static str {
        "recording"
    }
    fn durable(&self) -> bool {
        self.durable
    }
    fn exclusive_owner(&self) -> Option<u64> {
        self.exclusive_owner
    }
    fn auto_delete(&self) -> bool {
        self.auto_delete
    }
    fn arguments(&self) -> &FieldTable {
        &self.arguments
    }
    fn store_key(&self) -> &str {
        &self.name
    }
    fn store(&self) -> Option<&Store> {
        None
    }
    fn args(&self) -> Arc<QueueArgs> {
        Arc::default()
    }
    fn applied_policy(&self) -> Arc<Applied> {
        Arc::default()
    }
    fn apply_policy(&self, _applied: Applied) -> bool {
        self.log("apply_policy".into());
        false
    }
    fn enforce_limits(&self) {}
    fn enqueue_order(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.order.lock()
    }
    fn rejects_publish(&self, _msg: &Message) -> bool {
        false
    }
    fn enqueue(
        &self,
        this: &Arc<Queue>,
        message: Arc<Message>,
        seq: u64,
        stored: Option<Location>,
    ) -> (bool, Vec<DeadLetter>) {
        {
            let mut st = self.state.lock();
            st.calls.push(format!("enqueue {}", message.routing_key));
            st.ready.push_back(QueuedMessage {
                seq,
                message,
                redelivered: false,
                stored,
                expires_at: None,
            });
        }
        self.deliver(this);
        (false, Vec::new())
    }
    fn dead_letter(&self, dead: Vec<DeadLetter>) {
        assert!(dead.is_empty(), "this queue makes no dead letters");
    }
    fn is_pressured(&self) -> bool {
        false
    }
    fn stalled_at(&self) -> Option<u64> {
        None
    }
    fn mark_stalled(&self, _at: u64) {}
    fn add_consumer(&self, consumer: Consumer) -> warren_broker::Result<()> {
        let mut st = self.state.lock();
        st.calls.push(format!("add_consumer {}", consumer.tag));
        st.consumers
            .push((consumer.tag, consumer.target, consumer.no_ack));
        Ok(())
    }
    fn remove_consumer(&self, channel_key: u64, tag: &str) -> bool {
        let mut st = self.state.lock();
        st.consumers
            .retain(|(t, c, _)| !(c.channel_key() == channel_key && &**t == tag));
        false
    }
    fn dispatch_with(&self, this: &Arc<Queue>) {
        self.log("dispatch".into());
        self.deliver(this);
    }
    fn touch(&self) {}
    fn get(&self, _no_ack: bool) -> Option<(QueuedMessage, u32)> {
        let mut st = self.state.lock();
        let qm = st.ready.pop_front()?;
        Some((qm, st.ready.len() as u32))
    }
    fn settle_with(&self, this: &Arc<Queue>, _channel_key: u64, settlements: Vec<Settlement>) {
        {
            let mut st = self.state.lock();
            for s in settlements {
                st.unacked -= 1;
                let what = if s.requeue { "requeue" } else { "ack" };
                st.calls
                    .push(format!("{what} {}", s.message.message.routing_key));
                if s.requeue {
                    let mut m = s.message;
                    m.redelivered = true;
                    st.ready.push_front(m);
                }
            }
        }
        self.deliver(this);
    }
    fn unacked_window(&self) -> Option<(usize, usize)> {
        None
    }
    fn page_out(&self, _qm: &QueuedMessage) -> Option<SpillEntry> {
        None
    }
    fn settle_paged_with(&self, _: &Arc<Queue>, _: u64, _: Vec<PagedSettlement>) {
        unreachable!("this queue never pages out");
    }
    fn purge(&self) -> u32 {
        let mut st = self.state.lock();
        let n = st.ready.len() as u32;
        st.ready.clear();
        n
    }
    fn mark_deleted(&self) -> (u32, Vec<Consumer>) {
        let mut st = self.state.lock();
        st.deleted = true;
        st.calls.push("mark_deleted".into());
        let n = st.ready.len() as u32;
        st.ready.clear();
        let consumers = st
            .consumers
            .drain(..)
            .map(|(tag, target, no_ack)| {
                Consumer::new(tag, target, no_ack, false, 0, FieldTable::new())
            })
            .collect();
        (n, consumers)
    }
    fn is_deleted(&self) -> bool {
        self.state.lock().deleted
    }
    fn sweep(&self) -> bool {
        false
    }
    fn needs_sweep(&self) -> bool {
        false
    }
    fn sweep_mark(&self) -> &std::sync::atomic::AtomicBool {
        &self.sweep_mark
    }
    fn recover(&self, _entries: &mut dyn Iterator<Item = SpillEntry>) {}
    fn counts(&self) -> QueueCounts {
        let st = self.state.lock();
        QueueCounts {
            ready: st.ready.len() as u32,
            unacked: st.unacked,
            consumers: st.consumers.len() as u32,
        }
    }
    fn ready_bytes(&self) -> u64 {
        0
    }
    fn ready_in_memory_and_paged_out(&self) -> (u32, u32) {
        (self.state.lock().ready.len() as u32, 0)
    }
    fn memory(&self) -> u64 {
        (self.state.lock().ready.len() * std::mem::size_of::<QueuedMessage>()) as u64
    }
    fn deliveries(&self) -> u64 {
        0
    }
    fn stats(&self) -> &QueueStats {
        &self.stats
    }
    fn positions(&self) -> Positions {
        Positions::default()
    }
    fn set_put_position(&self, _put: u64) {}
    fn reset_positions(&self) -> u32 {
        0
    }
    fn get_positioned(&self) -> Option<(QueuedMessage, u64)> {
        None
    }
    fn peek_position(&self, _pos: u64) -> Option<Bytes> {
        None
    }
}

/// The kind `x-queue-type: recording`: keeps every queue it builds for the test to inspect.
#[derive(Default)]
struct Recording {
    built: Mutex<Vec<Arc<RecordingQueue>>>,
}

impl QueueKind for Recording {
    fn validate(&self, resource: &str, arguments: &FieldTable) -> warren_broker::Result<()> {
        if arguments.contains_key("x-max-length") {
            return Err(BrokerError::precondition_failed(format!(
                "invalid arg 'x-max-length' for {resource}"
            )));
        }
        Ok(())
    }
    fn build(&self, spec: QueueSpec) -> Arc<Queue> {
        let q = Arc::new(RecordingQueue {
            name: spec.name.to_string(),
            vhost: spec.vhost.to_string(),
            durable: spec.durable,
            exclusive_owner: spec.exclusive_owner,
            auto_delete: spec.auto_delete,
            arguments: spec.arguments,
            stats: QueueStats::default(),
            order: Mutex::new(()),
            state: Mutex::new(Recorded::default()),
            sweep_mark: Default::default(),
        });
        self.built.lock().push(q.clone());
        q
    }
}

/// A channel that takes every delivery and remembers which queue handle each came through.
#[derive(Default)]
struct Channel {
    got: Mutex<Vec<(Arc<Queue>, String, String)>>,
}

impl DeliveryTarget for Channel {
    fn channel_key(&self) -> u64 {
        7
    }
    fn deliver(
        &self,
        queue: &Arc<Queue>,
        consumer_tag: &Arc<str>,
        _no_ack: bool,
        msg: QueuedMessage,
    ) -> Result<(), QueuedMessage> {
        let key = msg.message.routing_key.to_string();
        self.got
            .lock()
            .push((queue.clone(), consumer_tag.to_string(), key));
        Ok(())
    }
    fn cancelled_by_broker(&self, _consumer_tag: &Arc<str>) {}
}

fn typed(name: &str, kind: &str) -> QueueDeclare {
    QueueDeclare {
        name: name.into(),
        arguments: [(
            "x-queue-type",
            FieldValue::LongString(Bytes::copy_from_slice(kind.as_bytes())),
        )]
        .into_iter()
        .collect(),
        ..Default::default()
    }
}

fn publish(v: &VHost, exchange: &str, key: &str) -> bool {
    let m = Message::new(
        exchange.into(),
        key.into(),
        Default::default(),
        Bytes::from_static(b"body"),
    );
    v.publish(Arc::new(m), None).expect("published").routed
}

#[test]
fn a_second_queue_kind_is_routed_to_through_the_trait() {
    let v = VHost::new("/");
    let kind = Arc::new(Recording::default());
    v.set_queue_kind("recording", kind.clone());

    // queue.declare picks the implementation by x-queue-type.
    let (q, counts) = v.declare_queue(&typed("rq", "recording"), 1).unwrap();
    assert_eq!(q.kind(), "recording");
    assert_eq!(counts, QueueCounts::default());
    let built = kind.built.lock().clone();
    assert_eq!(built.len(), 1, "the kind built the queue");
    let rq = built[0].clone();
    assert!(std::ptr::addr_eq(Arc::as_ptr(&q), Arc::as_ptr(&rq)));
    // A classic queue beside it, and both bound to a topic exchange.
    let (cq, _) = v.declare_queue(&typed("cq", "classic"), 1).unwrap();
    assert_eq!(cq.kind(), "classic");
    // A queue of another kind may count without a classic enqueue: it is visited by what
    // visits the used queues from the start; the classic one from its first message.
    let used = |v: &VHost| {
        let mut n: Vec<String> = v.used_queues().iter().map(|q| q.name().into()).collect();
        n.sort();
        n
    };
    assert_eq!(used(&v), ["rq"]);
    v.declare_exchange(&ExchangeDeclare {
        name: "t".into(),
        kind: "topic".into(),
        ..Default::default()
    })
    .unwrap();
    let none = FieldTable::new();
    v.bind("t", Destination::Queue("rq".into()), "a.*", &none, 1)
        .unwrap();
    v.bind("t", Destination::Queue("cq".into()), "#", &none, 1)
        .unwrap();

    // A consumer on the recording queue, through the vhost.
    let ch = Arc::new(Channel::default());
    let target: Arc<dyn DeliveryTarget> = ch.clone();
    let consumer = Consumer::new("c1".into(), target, false, false, 0, FieldTable::new());
    let got = v.consume("rq", consumer, 1).unwrap();
    got.dispatch();

    assert!(publish(&v, "t", "a.b"));
    assert!(publish(&v, "t", "x.y"));
    assert!(publish(&v, "t", "a.c"));
    assert_eq!(used(&v), ["cq", "rq"]);
    // Declare applied the vhost's policies to it; routing reached it for the keys matching its
    // binding only, and the classic queue for every one.
    assert_eq!(
        rq.calls(),
        vec![
            "apply_policy",
            "add_consumer c1",
            "dispatch",
            "enqueue a.b",
            "enqueue a.c"
        ]
    );
    assert_eq!(cq.counts().ready, 3);
    // The consumer got them through DeliveryTarget, with the recording queue as the handle it
    // settles with.
    let deliveries = std::mem::take(&mut *ch.got.lock());
    let keys: Vec<_> = deliveries.iter().map(|(_, _, k)| k.as_str()).collect();
    assert_eq!(keys, ["a.b", "a.c"]);
    assert!(deliveries
        .iter()
        .all(|(h, tag, _)| Arc::ptr_eq(h, &q) && tag == "c1"));
    assert_eq!(q.counts().unacked, 2);

    // Settlement goes back through the trait: one requeued (and redelivered), one acked.
    let (handle, _, _) = &deliveries[0];
    let settle = |key: &str, requeue: bool| Settlement {
        consumer_tag: Some("c1".into()),
        message: QueuedMessage {
            seq: 0,
            message: Arc::new(Message::new(
                "t".into(),
                key.into(),
                Default::default(),
                Bytes::from_static(b"body"),
            )),
            redelivered: false,
            stored: None,
            expires_at: None,
        },
        requeue,
        rejected: false,
    };
    handle.settle(7, vec![settle("a.b", false), settle("a.c", true)]);
    assert_eq!(
        ch.got.lock().len(),
        1,
        "the requeued message was delivered again"
    );
    assert!(rq
        .calls()
        .ends_with(&["ack a.b".to_string(), "requeue a.c".to_string()]));

    // A redeclare is checked against the queue's own flags and arguments.
    let (again, _) = v.declare_queue(&typed("rq", "recording"), 1).unwrap();
    assert!(Arc::ptr_eq(&again, &q));
    // Its own argument rules apply to new queues of its kind.
    let mut bad = typed("rq2", "recording");
    bad.arguments.insert("x-max-length", FieldValue::I32(1));
    assert_eq!(v.declare_queue(&bad, 1).unwrap_err().code, 406);

    // queue.delete reaches it through the trait too.
    assert_eq!(v.delete_queue("rq", false, false, 1).unwrap(), 0);
    assert!(rq.is_deleted());
    assert_eq!(rq.calls().last().map(String::as_str), Some("mark_deleted"));
    assert!(publish(&v, "t", "a.d"), "routed to the classic queue");
    assert_eq!(rq.calls().last().map(String::as_str), Some("mark_deleted"));
}

#[test]
fn an_unregistered_queue_type_is_still_refused() {
    let v = VHost::new("/");
    let err = v.declare_queue(&typed("rq", "recording"), 1).unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "invalid arg 'x-queue-type' for queue 'rq' in vhost '/': \"unsupported queue type 'recording'\""
    );
    // "classic" cannot be taken over by a registered kind.
    v.set_queue_kind("classic", Arc::new(Recording::default()));
    let (q, _) = v.declare_queue(&typed("cq", "classic"), 1).unwrap();
    assert_eq!(q.kind(), "classic");
}

#[test]
fn a_queue_whose_declare_is_taken_back_is_not_used() {
    let dir = std::env::temp_dir().join(format!("warren-kind-undo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (b, _) = warren_broker::Broker::open(warren_broker::StorageOptions::new(&dir)).unwrap();
    let v = b.vhost("/").unwrap();
    let kind = Arc::new(Recording::default());
    v.set_queue_kind("recording", kind.clone());
    // Saves of the definitions fail: a file where their directory goes.
    let defs = dir.join("definitions");
    let _ = std::fs::remove_dir_all(&defs);
    std::fs::write(&defs, b"not a directory").unwrap();
    let d = QueueDeclare {
        durable: true,
        ..typed("rq", "recording")
    };
    assert_eq!(v.declare_queue(&d, 1).unwrap_err().code, 541);
    // The kind built it (and it joined the used set), the declare took it back.
    assert_eq!(kind.built.lock().len(), 1);
    assert!(v.queue("rq", 1).is_err());
    assert!(v.used_queues().is_empty());
    b.close();
    let _ = std::fs::remove_dir_all(&dir);
}

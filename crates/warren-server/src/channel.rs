//! AMQP channels: the per-channel state machine and every channel-level method of classes
//! channel, exchange, queue, basic, tx and confirm.
//!
//! A channel has two halves. [`ChannelShared`] is reached by queues on any task when they
//! deliver (it implements [`DeliveryTarget`]): delivery tags, the unacked map, channel-wide
//! prefetch and the consumer list live there behind a mutex. [`Channel`] is owned by the
//! connection task: content assembly, confirm and transaction state.
//!
//! Unacknowledged deliveries beyond the queue's `unacked_window` (messages or body bytes)
//! are held by their store location only (see the `unacked` module), so a consumer that never
//! acknowledges does not hold every message it was sent in memory.

use crate::outbox::Outbox;
use crate::unacked::{self, PagedUnacked};
use bytes::BufMut;
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use warren_amqp::frame::{
    encode_body_frames, encode_method_frame, FRAME_END, FRAME_HEADER, FRAME_METHOD,
};
use warren_amqp::generated::*;
use warren_amqp::properties::BasicProperties;
use warren_amqp::table::put_shortstr;
use warren_amqp::{constants, Method};
use warren_broker::access::Operation;
use warren_broker::exchange::Destination;
use warren_broker::log_limit::LogLimit;
use warren_broker::ops::publish::PublishCheck;
use warren_broker::ops::{DeclaredQueue, PublishGrant};
use warren_broker::queue::Settlement;
use warren_broker::registry::{
    bump, bump_by, ChannelEntry, ChannelHandle, ChannelProbe, ConsumerDetails,
};
use warren_broker::vhost::log::DurableSink;
use warren_broker::vhost::{ExchangeDeclare as ExchangeSpec, QueueDeclare as QueueSpec, REPLY_TO};
use warren_broker::{
    names, Actor, Broker, BrokerError, Completion, Consumer, DeliveryTarget, Message, Ops,
    PublishError, Published, Queue, QueuedMessage, VHost,
};

/// Class id of `basic`, the only content class.
pub const BASIC_CLASS: u16 = 60;

static CHANNEL_KEYS: AtomicU64 = AtomicU64::new(1);

/// A message delivered on this channel and not yet settled.
struct Unacked {
    queue: Arc<Queue>,
    consumer_tag: Option<Arc<str>>,
    message: QueuedMessage,
}

struct ConsumerInfo {
    queue: Arc<Queue>,
    /// What operators see of it (`None` for direct reply-to's consumer, which RabbitMQ does
    /// not list).
    details: Option<ConsumerDetails>,
}

struct SharedState {
    open: bool,
    flow: bool,
    next_tag: u64,
    unacked: BTreeMap<u64, Unacked>,
    /// Body bytes of `unacked`.
    unacked_bytes: usize,
    /// Unacknowledged deliveries beyond the in-memory bound, by store location.
    paged: PagedUnacked,
    global_prefetch: u16,
    consumers: HashMap<Arc<str>, ConsumerInfo>,
    /// Set while the connection task handles a method on this channel: basic.cancel
    /// notifications raised meanwhile wait in `deferred_cancels` until the method's reply is
    /// queued (RabbitMQ sends queue.delete-ok before the basic.cancel it causes on the same
    /// channel; py-amqp fails queue_delete otherwise).
    replying: bool,
    deferred_cancels: Vec<Arc<str>>,
    /// A consumer registered with its queue whose basic.consume-ok is not queued yet: other
    /// tasks must not deliver to it before the client has learned its tag.
    announcing: Option<Arc<str>>,
}

/// The part of a channel that queues deliver into.
pub struct ChannelShared {
    key: u64,
    id: u16,
    outbox: Arc<Outbox>,
    frame_max: u32,
    cancel_notify: bool,
    st: Mutex<SharedState>,
    /// Counters and modes in the operators' read model.
    stats: Arc<ChannelEntry>,
}

impl ChannelProbe for ChannelShared {
    fn unacked(&self) -> u64 {
        let st = self.st.lock();
        (st.unacked.len() + st.paged.len()) as u64
    }

    fn consumers(&self) -> Vec<ConsumerDetails> {
        let st = self.st.lock();
        let mut out: Vec<ConsumerDetails> = st
            .consumers
            .values()
            .filter_map(|c| c.details.clone())
            .collect();
        out.sort_by(|a, b| a.tag.cmp(&b.tag));
        out
    }
}

/// Writes a content-bearing method, its content header and body frames.
pub fn write_content(
    buf: &mut BytesMut,
    channel: u16,
    method: &Method,
    msg: &Message,
    frame_max: u32,
) {
    buf.reserve(msg.body.len() + 256);
    encode_method_frame(channel, method, buf);
    write_header_and_body(buf, channel, msg, frame_max);
}

/// Writes the content header (with the message's properties, encoded once per message) and
/// the body frames.
fn write_header_and_body(buf: &mut BytesMut, channel: u16, msg: &Message, frame_max: u32) {
    let props = msg.encoded_properties();
    buf.put_u8(FRAME_HEADER);
    buf.put_u16(channel);
    buf.put_u32(12 + props.len() as u32);
    buf.put_u16(BASIC_CLASS);
    buf.put_u16(0);
    buf.put_u64(msg.body.len() as u64);
    buf.put_slice(props);
    buf.put_u8(FRAME_END);
    encode_body_frames(channel, &msg.body, frame_max, buf);
}

/// Writes basic.deliver and its content straight into `buf`: the hot path of every consumer,
/// so without building a [`Method`] (which would copy three strings per delivery).
fn write_delivery(
    buf: &mut BytesMut,
    channel: u16,
    consumer_tag: &str,
    delivery_tag: u64,
    redelivered: bool,
    msg: &Message,
    frame_max: u32,
) {
    buf.reserve(
        msg.body.len() + consumer_tag.len() + msg.exchange.len() + msg.routing_key.len() + 128,
    );
    buf.put_u8(FRAME_METHOD);
    buf.put_u16(channel);
    let size_at = buf.len();
    buf.put_u32(0);
    buf.put_u16(BASIC_CLASS);
    buf.put_u16(BasicDeliver::METHOD_ID);
    put_shortstr(buf, consumer_tag);
    buf.put_u64(delivery_tag);
    buf.put_u8(u8::from(redelivered));
    put_shortstr(buf, &msg.exchange);
    put_shortstr(buf, &msg.routing_key);
    let size = (buf.len() - size_at - 4) as u32;
    buf[size_at..size_at + 4].copy_from_slice(&size.to_be_bytes());
    buf.put_u8(FRAME_END);
    write_header_and_body(buf, channel, msg, frame_max);
}

impl DeliveryTarget for ChannelShared {
    fn channel_key(&self) -> u64 {
        self.key
    }

    fn deliver(
        &self,
        queue: &Arc<Queue>,
        consumer_tag: &Arc<str>,
        no_ack: bool,
        msg: QueuedMessage,
    ) -> Result<(), QueuedMessage> {
        let mut st = self.st.lock();
        if !st.open || !st.flow || st.announcing.as_ref() == Some(consumer_tag) {
            return Err(msg);
        }
        if !no_ack
            && st.global_prefetch != 0
            && st.unacked.len() + st.paged.len() >= usize::from(st.global_prefetch)
        {
            return Err(msg);
        }
        let tag = st.next_tag + 1;
        let high_water = self.outbox.high_water();
        let written = self.outbox.with(|buf| {
            if buf.len() >= high_water {
                return false;
            }
            write_delivery(
                buf,
                self.id,
                consumer_tag,
                tag,
                msg.redelivered,
                &msg.message,
                self.frame_max,
            );
            true
        });
        if !written {
            drop(st);
            self.outbox.park(queue);
            return Err(msg);
        }
        let counters = &self.stats.counters;
        bump(if no_ack {
            &counters.deliver_no_ack
        } else {
            &counters.deliver
        });
        if msg.redelivered {
            bump(&counters.redeliver);
        }
        st.next_tag = tag;
        if !no_ack {
            hold(&mut st, tag, queue, Some(consumer_tag.clone()), msg);
        }
        Ok(())
    }

    fn cancelled_by_broker(&self, consumer_tag: &Arc<str>) {
        let mut st = self.st.lock();
        if st.consumers.remove(consumer_tag).is_some() && st.open && self.cancel_notify {
            if st.replying {
                st.deferred_cancels.push(consumer_tag.clone());
                return;
            }
            self.outbox.send(
                self.id,
                &Method::BasicCancel(BasicCancel {
                    consumer_tag: consumer_tag.to_string(),
                    nowait: true,
                }),
            );
        }
    }
}

/// Keeps delivery `tag` until it is settled: in memory, or by its store location once the
/// channel holds the queue's `unacked_window` in memory.
fn hold(
    st: &mut SharedState,
    tag: u64,
    queue: &Arc<Queue>,
    consumer_tag: Option<Arc<str>>,
    msg: QueuedMessage,
) {
    if let Some((count, bytes)) = queue.unacked_window() {
        if st.unacked.len() >= count || st.unacked_bytes >= bytes {
            if let Some(e) = queue.page_out(&msg) {
                st.paged.push(tag, queue, consumer_tag, e);
                return;
            }
        }
    }
    st.unacked_bytes += msg.message.body.len();
    st.unacked.insert(
        tag,
        Unacked {
            queue: queue.clone(),
            consumer_tag,
            message: msg,
        },
    );
}

/// A message being assembled from basic.publish, its content header and body frames.
struct PendingContent {
    publish: BasicPublish,
    /// What the operations layer established when basic.publish arrived.
    check: PublishCheck,
    header: Option<(u64, BasicProperties)>,
    body: BytesMut,
    single: Option<Bytes>,
}

/// An acknowledgement operation, deferred until tx.commit in transactional channels.
#[derive(Debug, Clone, Copy)]
enum AckOp {
    Ack {
        tag: u64,
        multiple: bool,
    },
    Reject {
        tag: u64,
        multiple: bool,
        requeue: bool,
    },
}

#[derive(Default)]
struct TxState {
    publishes: Vec<(Arc<Message>, bool)>,
    acks: Vec<AckOp>,
    /// Body bytes of `publishes`.
    bytes: u64,
}

impl TxState {
    /// Refuses one more operation (and `bytes` more message bytes) beyond the configured caps.
    fn admit(&self, limits: &ChannelLimits, bytes: u64) -> MethodResult {
        if self.publishes.len() + self.acks.len() >= limits.tx_max_operations {
            return Err(BrokerError::precondition_failed(format!(
                "transaction holds the maximum of {} publishes and acknowledgements \
                 (amqp.tx_max_operations); commit or roll back",
                limits.tx_max_operations
            )));
        }
        if self.bytes + bytes > limits.tx_max_bytes {
            return Err(BrokerError::precondition_failed(format!(
                "transaction would hold {} bytes of messages, over the limit of {} \
                 (amqp.tx_max_bytes); commit or roll back",
                self.bytes + bytes,
                limits.tx_max_bytes
            )));
        }
        Ok(())
    }
}

/// Publisher-confirm bookkeeping, shared with the message store's writer thread, which
/// completes the publishes it fsynced.
///
/// Sequence numbers still waiting for an fsync are in `waiting`; settled ones in `done` until
/// sent. A flush sends everything settled below the oldest waiting number: one basic.ack with
/// `multiple` set when all of it succeeded, else one basic.ack / basic.nack per publish.
pub struct Confirms {
    channel: u16,
    outbox: Arc<Outbox>,
    book: Mutex<ConfirmBook>,
    stats: Arc<ChannelEntry>,
}

struct ConfirmBook {
    next_seq: u64,
    waiting: BTreeSet<u64>,
    done: BTreeMap<u64, bool>,
}

impl Confirms {
    fn new(channel: u16, outbox: Arc<Outbox>, stats: Arc<ChannelEntry>) -> Self {
        Confirms {
            channel,
            outbox,
            stats,
            book: Mutex::new(ConfirmBook {
                next_seq: 1,
                waiting: BTreeSet::new(),
                done: BTreeMap::new(),
            }),
        }
    }

    /// Takes the next publish sequence number, marked as waiting.
    fn begin(&self) -> u64 {
        let mut b = self.book.lock();
        let seq = b.next_seq;
        b.next_seq += 1;
        b.waiting.insert(seq);
        seq
    }

    /// Settles `seq` without the store: acked (`ok`) or nacked.
    fn settle(&self, seq: u64, ok: bool) {
        let mut b = self.book.lock();
        b.waiting.remove(&seq);
        b.done.insert(seq, ok);
    }

    /// Sends what can be confirmed now.
    pub fn flush(&self) {
        let mut b = self.book.lock();
        let limit = b.waiting.first().copied().unwrap_or(u64::MAX);
        let rest = b.done.split_off(&limit);
        let ready = std::mem::replace(&mut b.done, rest);
        let Some((&last, _)) = ready.last_key_value() else {
            return;
        };
        bump_by(
            &self.stats.counters.confirm,
            ready.values().filter(|ok| **ok).count() as u64,
        );
        if ready.values().all(|ok| *ok) {
            self.outbox.send(
                self.channel,
                &Method::BasicAck(BasicAck {
                    delivery_tag: last,
                    multiple: ready.len() > 1,
                }),
            );
            return;
        }
        self.outbox.with(|buf| {
            for (&tag, &ok) in &ready {
                let m = if ok {
                    Method::BasicAck(BasicAck {
                        delivery_tag: tag,
                        multiple: false,
                    })
                } else {
                    Method::BasicNack(BasicNack {
                        delivery_tag: tag,
                        multiple: false,
                        requeue: false,
                    })
                };
                encode_method_frame(self.channel, &m, buf);
            }
        });
    }
}

impl Completion for Confirms {
    fn complete(&self, tokens: &[u64], ok: bool) {
        {
            let mut b = self.book.lock();
            for t in tokens {
                // Settled already (confirmed early when consumers acked it, or nacked).
                if b.waiting.remove(t) {
                    b.done.insert(*t, ok);
                }
            }
        }
        self.flush();
    }
}

/// Sends tx.commit-ok once the store has fsynced the transaction's persistent messages.
struct CommitOk {
    channel: u16,
    outbox: Arc<Outbox>,
}

impl Completion for CommitOk {
    fn complete(&self, _tokens: &[u64], ok: bool) {
        // Not ok only when the store closed (broker shutdown) before the transaction's
        // messages could be written: no commit-ok then.
        if ok {
            self.outbox
                .send(self.channel, &Method::TxCommitOk(TxCommitOk {}));
        }
    }
}

/// What the connection must do after a channel handled a frame.
pub enum Outcome {
    /// Nothing more.
    Done,
    /// The client closed the channel (close-ok sent): forget it.
    Closed,
}

/// The connection-task half of a channel.
pub struct Channel {
    shared: Arc<ChannelShared>,
    /// The channel's place in the operators' read model (unregistered when dropped).
    registration: ChannelHandle,
    /// Set after the server sent channel.close: everything but close-ok is discarded.
    pub closing: bool,
    content: Option<PendingContent>,
    confirm: Option<Arc<Confirms>>,
    tx: Option<TxState>,
    consumer_prefetch: u16,
    /// The queue most recently declared on this channel: an empty queue name in queue.bind,
    /// queue.unbind, queue.purge, queue.delete, basic.consume and basic.get stands for it.
    last_queue: String,
    /// A queue this channel published to that asks publishers to pause.
    pressure: Option<Arc<Queue>>,
    /// The `reply_to` name of this channel's direct reply-to consumer.
    reply_to: Option<String>,
    /// The last publish permission granted on this channel.
    publish_grant: PublishGrant,
}

/// The connection context a channel works in.
pub struct Context<'a> {
    /// The broker.
    pub broker: &'a Broker,
    /// Who works on this connection: user, vhost, connection id (exclusive queue ownership),
    /// peer. Every operation goes through the operations layer ([`Context::ops`]) with it.
    pub actor: &'a Arc<Actor>,
    /// The connection's vhost.
    pub vhost: &'a Arc<VHost>,
    /// The limits channels enforce.
    pub limits: ChannelLimits,
    /// Bytes of content announced in content headers and not yet received, over all the
    /// connection's channels (bounded by [`ChannelLimits::max_incomplete_content_bytes`]).
    pub incomplete_content: &'a Cell<u64>,
    /// Where durable topology changes report when they are on disk: their replies (and all
    /// that follows on the connection) are held until then.
    pub durable: &'a Arc<dyn DurableSink>,
}

impl Context<'_> {
    /// The operations layer, as this connection's actor.
    pub fn ops(&self) -> Ops<'_> {
        Ops::new(self.broker, self.vhost, self.actor).with_durable_sink(self.durable)
    }
}

/// A connection's durable topology changes in flight: while any is, the connection's outbox
/// is held, so that a declare-ok (and every frame after it: other replies, deliveries,
/// confirms) leaves only once the change is on disk. The connection reads no further frames
/// until they settle ([`DurableReplies::settle`]); other connections are not affected, and the
/// changes of one read share one fsync.
pub struct DurableReplies {
    outbox: Arc<Outbox>,
    pending: AtomicU64,
    failure: Mutex<Option<BrokerError>>,
    settled: tokio::sync::Notify,
}

impl DurableReplies {
    /// For the connection writing to `outbox`.
    pub fn new(outbox: Arc<Outbox>) -> Self {
        DurableReplies {
            outbox,
            pending: AtomicU64::new(0),
            failure: Mutex::new(None),
            settled: tokio::sync::Notify::new(),
        }
    }

    /// Waits until every change is on disk or rolled back, then lets the outbox write again.
    /// Returns the refusal of a change that could not be stored: the connection must close
    /// with it (what was held is discarded).
    pub async fn settle(&self) -> Option<BrokerError> {
        if !self.outbox.is_held() {
            return None;
        }
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.pending.load(Ordering::Acquire) == 0 {
                break;
            }
            notified.await;
        }
        match self.failure.lock().take() {
            Some(e) => {
                self.outbox.discard();
                Some(e)
            }
            None => {
                self.outbox.release();
                None
            }
        }
    }
}

impl DurableSink for DurableReplies {
    fn begin(&self) {
        self.outbox.hold();
        self.pending.fetch_add(1, Ordering::AcqRel);
    }

    fn settled(&self, outcome: Result<(), BrokerError>) {
        if let Err(e) = outcome {
            self.failure.lock().get_or_insert(e);
        }
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.settled.notify_waiters();
        }
    }
}

/// Limits a connection's channels enforce, from the `[amqp]` configuration.
#[derive(Debug, Clone, Copy)]
pub struct ChannelLimits {
    /// Largest accepted message body, bytes.
    pub max_message_size: u64,
    /// Most bytes of content a connection may have announced and not finished.
    pub max_incomplete_content_bytes: u64,
    /// Most message body bytes one transaction may hold.
    pub tx_max_bytes: u64,
    /// Most publishes plus acknowledgements one transaction may hold.
    pub tx_max_operations: usize,
}

type MethodResult = Result<(), BrokerError>;

impl Channel {
    /// A freshly opened channel.
    pub fn new(
        id: u16,
        outbox: Arc<Outbox>,
        frame_max: u32,
        cancel_notify: bool,
        registration: ChannelHandle,
    ) -> Self {
        let shared = Arc::new(ChannelShared {
            key: CHANNEL_KEYS.fetch_add(1, Ordering::Relaxed),
            id,
            outbox,
            frame_max,
            cancel_notify,
            st: Mutex::new(SharedState {
                open: true,
                flow: true,
                next_tag: 0,
                unacked: BTreeMap::new(),
                unacked_bytes: 0,
                paged: PagedUnacked::default(),
                global_prefetch: 0,
                consumers: HashMap::new(),
                replying: false,
                deferred_cancels: Vec::new(),
                announcing: None,
            }),
            stats: registration.entry().clone(),
        });
        let probe: Arc<dyn ChannelProbe> = shared.clone();
        registration.entry().set_probe(Arc::downgrade(&probe));
        Channel {
            shared,
            registration,
            closing: false,
            content: None,
            confirm: None,
            tx: None,
            consumer_prefetch: 0,
            last_queue: String::new(),
            pressure: None,
            reply_to: None,
            publish_grant: PublishGrant::default(),
        }
    }

    fn id(&self) -> u16 {
        self.shared.id
    }

    fn send(&self, m: impl Into<Method>) {
        self.shared.outbox.send(self.id(), &m.into());
    }

    /// True while a content header or body frames are expected.
    pub fn expects_content(&self) -> bool {
        self.content.is_some()
    }

    /// Handles a method frame on this open channel. Its reply, if any, is queued before any
    /// basic.cancel notification the method causes on this channel.
    pub fn handle_method(&mut self, ctx: &Context, method: Method) -> Result<Outcome, BrokerError> {
        if let Some(content) = &self.content {
            let text = if content.header.is_some() {
                "expected content body, got non content body frame instead".to_string()
            } else {
                format!(
                    "expected content header for class {BASIC_CLASS}, got non content header frame instead"
                )
            };
            return Err(BrokerError::new(constants::UNEXPECTED_FRAME, text));
        }
        self.shared.st.lock().replying = true;
        let outcome = self.dispatch_method(ctx, method);
        let deferred = {
            let mut st = self.shared.st.lock();
            st.replying = false;
            std::mem::take(&mut st.deferred_cancels)
        };
        // A failed method closes the channel: its consumers are gone without notification.
        if outcome.is_ok() && !deferred.is_empty() {
            self.shared.outbox.with(|buf| {
                for tag in deferred {
                    let m = Method::BasicCancel(BasicCancel {
                        consumer_tag: tag.to_string(),
                        nowait: true,
                    });
                    encode_method_frame(self.shared.id, &m, buf);
                }
            });
        }
        outcome
    }

    fn dispatch_method(&mut self, ctx: &Context, method: Method) -> Result<Outcome, BrokerError> {
        let mut method = method;
        self.expand_shortcuts(&mut method)?;
        match method {
            Method::ChannelOpen(_) => Err(BrokerError::new(
                constants::CHANNEL_ERROR,
                "second 'channel.open' seen",
            )),
            Method::ChannelClose(_) => {
                ctx.ops().authorize(&Operation::ChannelClose)?;
                self.cleanup(ctx);
                self.send(ChannelCloseOk {});
                Ok(Outcome::Closed)
            }
            Method::ChannelFlow(f) => {
                ctx.ops().authorize(&Operation::ChannelFlow)?;
                let queues = {
                    let mut st = self.shared.st.lock();
                    st.flow = f.active;
                    self.consumer_queues(&st)
                };
                self.send(ChannelFlowOk { active: f.active });
                if f.active {
                    queues.iter().for_each(|q| q.dispatch());
                }
                Ok(Outcome::Done)
            }
            Method::AccessRequest(_) => {
                self.send(AccessRequestOk { ticket: 1 });
                Ok(Outcome::Done)
            }
            Method::ExchangeDeclare(m) => self.exchange_declare(ctx, m).map(|_| Outcome::Done),
            Method::ExchangeDelete(m) => {
                ctx.ops().delete_exchange(&m.exchange, m.if_unused)?;
                if !m.nowait {
                    self.send(ExchangeDeleteOk {});
                }
                Ok(Outcome::Done)
            }
            Method::ExchangeBind(m) => {
                ctx.ops().bind(
                    &m.source,
                    Destination::Exchange(m.destination),
                    &m.routing_key,
                    &m.arguments,
                )?;
                if !m.nowait {
                    self.send(ExchangeBindOk {});
                }
                Ok(Outcome::Done)
            }
            Method::ExchangeUnbind(m) => {
                ctx.ops().unbind(
                    &m.source,
                    Destination::Exchange(m.destination),
                    &m.routing_key,
                    &m.arguments,
                )?;
                if !m.nowait {
                    self.send(ExchangeUnbindOk {});
                }
                Ok(Outcome::Done)
            }
            Method::QueueDeclare(m) => self.queue_declare(ctx, m).map(|_| Outcome::Done),
            Method::QueueBind(m) => {
                ctx.ops().bind(
                    &m.exchange,
                    Destination::Queue(m.queue),
                    &m.routing_key,
                    &m.arguments,
                )?;
                if !m.nowait {
                    self.send(QueueBindOk {});
                }
                Ok(Outcome::Done)
            }
            Method::QueueUnbind(m) => {
                ctx.ops().unbind(
                    &m.exchange,
                    Destination::Queue(m.queue),
                    &m.routing_key,
                    &m.arguments,
                )?;
                self.send(QueueUnbindOk {});
                Ok(Outcome::Done)
            }
            Method::QueuePurge(m) => {
                let n = ctx.ops().purge_queue(&m.queue)?;
                if !m.nowait {
                    self.send(QueuePurgeOk { message_count: n });
                }
                Ok(Outcome::Done)
            }
            Method::QueueDelete(m) => {
                let n = ctx.ops().delete_queue(&m.queue, m.if_unused, m.if_empty)?;
                if !m.nowait {
                    self.send(QueueDeleteOk { message_count: n });
                }
                Ok(Outcome::Done)
            }
            Method::BasicQos(m) => {
                ctx.ops().authorize(&Operation::BasicQos)?;
                self.basic_qos(m).map(|_| Outcome::Done)
            }
            Method::BasicConsume(m) => self.basic_consume(ctx, m).map(|_| Outcome::Done),
            Method::BasicCancel(m) => {
                self.cancel_consumer(ctx, &m.consumer_tag)?;
                if !m.nowait {
                    self.send(BasicCancelOk {
                        consumer_tag: m.consumer_tag,
                    });
                }
                Ok(Outcome::Done)
            }
            Method::BasicPublish(m) => {
                if m.immediate {
                    return Err(BrokerError::not_implemented("immediate=true"));
                }
                let check = ctx
                    .ops()
                    .check_publish(&m.exchange, &mut self.publish_grant)?;
                self.content = Some(PendingContent {
                    publish: m,
                    check,
                    header: None,
                    body: BytesMut::new(),
                    single: None,
                });
                Ok(Outcome::Done)
            }
            Method::BasicGet(m) => self.basic_get(ctx, m).map(|_| Outcome::Done),
            Method::BasicAck(m) => {
                ctx.ops().authorize(&Operation::BasicAck)?;
                let op = AckOp::Ack {
                    tag: m.delivery_tag,
                    multiple: m.multiple,
                };
                self.ack_op(ctx, op).map(|_| Outcome::Done)
            }
            Method::BasicReject(m) => {
                ctx.ops().authorize(&Operation::BasicReject)?;
                let op = AckOp::Reject {
                    tag: m.delivery_tag,
                    multiple: false,
                    requeue: m.requeue,
                };
                self.ack_op(ctx, op).map(|_| Outcome::Done)
            }
            Method::BasicNack(m) => {
                ctx.ops().authorize(&Operation::BasicNack)?;
                let op = AckOp::Reject {
                    tag: m.delivery_tag,
                    multiple: m.multiple,
                    requeue: m.requeue,
                };
                self.ack_op(ctx, op).map(|_| Outcome::Done)
            }
            Method::BasicRecover(m) => {
                // As in RabbitMQ, recover-ok goes out before the redeliveries: clients (lapin)
                // discard deliveries buffered before recover-ok.
                ctx.ops().authorize(&Operation::BasicRecover)?;
                if !m.requeue {
                    return Err(BrokerError::not_implemented("requeue=false"));
                }
                self.send(BasicRecoverOk {});
                self.recover(true)?;
                Ok(Outcome::Done)
            }
            Method::BasicRecoverAsync(m) => {
                ctx.ops().authorize(&Operation::BasicRecover)?;
                self.recover(m.requeue).map(|_| Outcome::Done)
            }
            Method::TxSelect(_) => {
                ctx.ops().authorize(&Operation::TxSelect)?;
                if self.confirm.is_some() {
                    return Err(BrokerError::precondition_failed(
                        "cannot switch from confirm to tx mode",
                    ));
                }
                self.tx.get_or_insert_with(TxState::default);
                self.registration.entry().set_transactional();
                self.send(TxSelectOk {});
                Ok(Outcome::Done)
            }
            Method::TxCommit(_) => {
                ctx.ops().authorize(&Operation::TxCommit)?;
                let Some(tx) = self.tx.take() else {
                    return Err(BrokerError::precondition_failed(
                        "channel is not transactional",
                    ));
                };
                self.tx = Some(TxState::default());
                let mut stored = false;
                for (msg, mandatory) in tx.publishes {
                    match self.route_and_enqueue(ctx, msg, mandatory, None)? {
                        Some(p) => stored |= p.stored,
                        None => {
                            return Err(BrokerError::new(
                                constants::RESOURCE_ERROR,
                                "message store unavailable; transaction not committed",
                            ))
                        }
                    }
                }
                for op in tx.acks {
                    self.apply_ack(op)?;
                }
                let waiter = Arc::new(CommitOk {
                    channel: self.id(),
                    outbox: self.shared.outbox.clone(),
                });
                if !(stored && ctx.ops().sync((waiter, 0))) {
                    self.send(TxCommitOk {});
                }
                Ok(Outcome::Done)
            }
            Method::TxRollback(_) => {
                ctx.ops().authorize(&Operation::TxRollback)?;
                let Some(tx) = self.tx.as_mut() else {
                    return Err(BrokerError::precondition_failed(
                        "channel is not transactional",
                    ));
                };
                *tx = TxState::default();
                self.send(TxRollbackOk {});
                Ok(Outcome::Done)
            }
            Method::ConfirmSelect(m) => {
                ctx.ops().authorize(&Operation::ConfirmSelect)?;
                if self.tx.is_some() {
                    return Err(BrokerError::precondition_failed(
                        "cannot switch from tx to confirm mode",
                    ));
                }
                if self.confirm.is_none() {
                    self.confirm = Some(Arc::new(Confirms::new(
                        self.id(),
                        self.shared.outbox.clone(),
                        self.registration.entry().clone(),
                    )));
                    self.registration.entry().set_confirm();
                }
                if !m.nowait {
                    self.send(ConfirmSelectOk {});
                }
                Ok(Outcome::Done)
            }
            // Methods only a server sends, and channel.close-ok when no close was sent: as
            // RabbitMQ (rabbit_channel's last handle_method clause).
            _ => Err(BrokerError::command_invalid("unimplemented method")),
        }
    }

    fn exchange_declare(&mut self, ctx: &Context, m: ExchangeDeclare) -> MethodResult {
        ctx.ops().declare_exchange(&ExchangeSpec {
            name: m.exchange,
            kind: m.kind,
            passive: m.passive,
            durable: m.durable,
            auto_delete: m.auto_delete,
            internal: m.internal,
            arguments: m.arguments,
        })?;
        if !m.nowait {
            self.send(ExchangeDeclareOk {});
        }
        Ok(())
    }

    /// RabbitMQ's queue name shortcuts: an empty queue name means the queue most recently
    /// declared on the channel (404 when there is none), and in queue.bind / queue.unbind an
    /// empty routing key with an empty queue name means that queue's name too.
    fn expand_shortcuts(&self, method: &mut Method) -> MethodResult {
        let expand = |q: &mut String| -> MethodResult {
            if q.is_empty() {
                if self.last_queue.is_empty() {
                    return Err(BrokerError::not_found("no previously declared queue"));
                }
                q.clone_from(&self.last_queue);
            }
            Ok(())
        };
        match method {
            Method::BasicGet(m) => expand(&mut m.queue),
            Method::BasicConsume(m) => expand(&mut m.queue),
            Method::QueueDelete(m) => expand(&mut m.queue),
            Method::QueuePurge(m) => expand(&mut m.queue),
            Method::QueueBind(m) => {
                let empty = m.queue.is_empty();
                expand(&mut m.queue)?;
                if empty && m.routing_key.is_empty() {
                    m.routing_key.clone_from(&self.last_queue);
                }
                Ok(())
            }
            Method::QueueUnbind(m) => {
                let empty = m.queue.is_empty();
                expand(&mut m.queue)?;
                if empty && m.routing_key.is_empty() {
                    m.routing_key.clone_from(&self.last_queue);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn queue_declare(&mut self, ctx: &Context, m: QueueDeclare) -> MethodResult {
        let DeclaredQueue {
            name,
            counts,
            queue,
        } = ctx.ops().declare_queue(&QueueSpec {
            name: m.queue,
            passive: m.passive,
            durable: m.durable,
            exclusive: m.exclusive,
            auto_delete: m.auto_delete,
            arguments: m.arguments,
        })?;
        if queue.is_some() {
            self.last_queue.clone_from(&name);
        }
        if !m.nowait {
            self.send(QueueDeclareOk {
                queue: name,
                message_count: counts.ready,
                consumer_count: counts.consumers,
            });
        }
        Ok(())
    }

    fn basic_qos(&mut self, m: BasicQos) -> MethodResult {
        if m.prefetch_size != 0 {
            return Err(BrokerError::not_implemented(format!(
                "prefetch_size!=0 ({})",
                m.prefetch_size
            )));
        }
        let queues = if m.global {
            let mut st = self.shared.st.lock();
            st.global_prefetch = m.prefetch_count;
            self.consumer_queues(&st)
        } else {
            self.consumer_prefetch = m.prefetch_count;
            Vec::new()
        };
        self.registration
            .entry()
            .set_prefetch(m.prefetch_count, m.global);
        self.send(BasicQosOk {});
        queues.iter().for_each(|q| q.dispatch());
        Ok(())
    }

    fn consumer_queues(&self, st: &SharedState) -> Vec<Arc<Queue>> {
        let mut out: Vec<Arc<Queue>> = Vec::new();
        for c in st.consumers.values() {
            if !out.iter().any(|q| Arc::ptr_eq(q, &c.queue)) {
                out.push(c.queue.clone());
            }
        }
        out
    }

    fn basic_consume(&mut self, ctx: &Context, m: BasicConsume) -> MethodResult {
        let tag: Arc<str> = if m.consumer_tag.is_empty() {
            names::consumer_tag().into()
        } else {
            m.consumer_tag.as_str().into()
        };
        if self.shared.st.lock().consumers.contains_key(&tag) {
            return Err(BrokerError::not_allowed(format!(
                "attempt to reuse consumer tag '{tag}'"
            )));
        }
        if m.queue == REPLY_TO {
            return self.consume_replies(ctx, tag, m.no_ack, m.nowait);
        }
        let details = ConsumerDetails {
            tag: tag.to_string(),
            queue: String::new(),
            ack_required: !m.no_ack,
            exclusive: m.exclusive,
            prefetch_count: self.consumer_prefetch,
            arguments: m.arguments.clone(),
        };
        let consumer = Consumer::new(
            tag.clone(),
            self.shared.clone(),
            m.no_ack,
            m.exclusive,
            self.consumer_prefetch,
            m.arguments,
        );
        // Until consume-ok is queued, a publish on another connection must not deliver to the
        // new consumer: basic.deliver would reach the client before the tag it names.
        self.shared.st.lock().announcing = Some(tag.clone());
        let q = match ctx.ops().consume(&m.queue, consumer) {
            Ok(q) => q,
            Err(e) => {
                self.shared.st.lock().announcing = None;
                return Err(e);
            }
        };
        self.shared.st.lock().consumers.insert(
            tag.clone(),
            ConsumerInfo {
                queue: q.clone(),
                details: Some(ConsumerDetails {
                    queue: q.name.clone(),
                    ..details
                }),
            },
        );
        if !m.nowait {
            self.send(BasicConsumeOk {
                consumer_tag: tag.to_string(),
            });
        }
        self.shared.st.lock().announcing = None;
        q.dispatch();
        Ok(())
    }

    /// basic.consume on `amq.rabbitmq.reply-to` (direct reply-to): no queue, just a name that
    /// this channel's requests will carry in `reply_to`.
    fn consume_replies(
        &mut self,
        ctx: &Context,
        tag: Arc<str>,
        no_ack: bool,
        nowait: bool,
    ) -> MethodResult {
        if !no_ack {
            return Err(BrokerError::precondition_failed(
                "reply consumer cannot acknowledge",
            ));
        }
        if self.reply_to.is_some() {
            return Err(BrokerError::precondition_failed(
                "reply consumer already set",
            ));
        }
        let target: Arc<dyn DeliveryTarget> = self.shared.clone();
        let name = ctx
            .ops()
            .consume_replies(Arc::downgrade(&target), tag.clone())?;
        self.reply_to = Some(name);
        self.shared.st.lock().consumers.insert(
            tag.clone(),
            ConsumerInfo {
                queue: ctx.vhost.reply_queue().clone(),
                details: None,
            },
        );
        if !nowait {
            self.send(BasicConsumeOk {
                consumer_tag: tag.to_string(),
            });
        }
        Ok(())
    }

    fn cancel_consumer(&mut self, ctx: &Context, tag: &str) -> MethodResult {
        let ops = ctx.ops();
        ops.authorize(&Operation::BasicCancel)?;
        let Some(info) = self.shared.st.lock().consumers.remove(tag) else {
            return Ok(());
        };
        if Arc::ptr_eq(&info.queue, ctx.vhost.reply_queue()) {
            if let Some(name) = self.reply_to.take() {
                ops.cancel_replies(&name)?;
            }
            return Ok(());
        }
        ops.cancel(&info.queue, self.shared.key, tag)
    }

    fn basic_get(&mut self, ctx: &Context, m: BasicGet) -> MethodResult {
        // Pop under the queue lock alone, then take the channel lock: queues lock themselves
        // before channels, never after.
        let got = ctx.ops().get(&m.queue, m.no_ack)?;
        let q = got.queue;
        let Some((msg, remaining)) = got.message else {
            bump(&self.shared.stats.counters.get_empty);
            self.send(BasicGetEmpty {
                cluster_id: String::new(),
            });
            return Ok(());
        };
        let counters = &self.shared.stats.counters;
        bump(if m.no_ack {
            &counters.get_no_ack
        } else {
            &counters.get
        });
        if msg.redelivered {
            bump(&counters.redeliver);
        }
        let mut st = self.shared.st.lock();
        st.next_tag += 1;
        let tag = st.next_tag;
        let method = Method::BasicGetOk(BasicGetOk {
            delivery_tag: tag,
            redelivered: msg.redelivered,
            exchange: msg.message.exchange.clone(),
            routing_key: msg.message.routing_key.clone(),
            message_count: remaining,
        });
        self.shared.outbox.with(|buf| {
            write_content(buf, self.id(), &method, &msg.message, self.shared.frame_max)
        });
        if !m.no_ack {
            hold(&mut st, tag, &q, None, msg);
        }
        Ok(())
    }

    fn ack_op(&mut self, ctx: &Context, op: AckOp) -> MethodResult {
        if let Some(tx) = self.tx.as_mut() {
            tx.admit(&ctx.limits, 0)?;
            let (tag, multiple) = match op {
                AckOp::Ack { tag, multiple } | AckOp::Reject { tag, multiple, .. } => {
                    (tag, multiple)
                }
            };
            let st = self.shared.st.lock();
            let everything = multiple && tag == 0;
            if !everything && !st.unacked.contains_key(&tag) && !st.paged.contains(tag) {
                return Err(unknown_tag(tag));
            }
            drop(st);
            tx.acks.push(op);
            return Ok(());
        }
        self.apply_ack(op)
    }

    /// Settles unacked deliveries: ack, or reject/nack with or without requeue.
    fn apply_ack(&mut self, op: AckOp) -> MethodResult {
        let (tag, multiple, requeue, rejected) = match op {
            AckOp::Ack { tag, multiple } => (tag, multiple, false, false),
            AckOp::Reject {
                tag,
                multiple,
                requeue,
            } => (tag, multiple, requeue, true),
        };
        let (taken, paged, upto): (Vec<Unacked>, _, _) = {
            let mut st = self.shared.st.lock();
            let (taken, paged, upto) = if multiple {
                if tag != 0 && !st.unacked.contains_key(&tag) && !st.paged.contains(tag) {
                    return Err(unknown_tag(tag));
                }
                let keep = if tag == 0 {
                    BTreeMap::new()
                } else {
                    st.unacked.split_off(&(tag + 1))
                };
                let upto = if tag == 0 { st.next_tag } else { tag };
                (
                    std::mem::replace(&mut st.unacked, keep)
                        .into_values()
                        .collect(),
                    st.paged.take_upto(upto, requeue, rejected),
                    Some(upto),
                )
            } else {
                match st.unacked.remove(&tag) {
                    Some(u) => (vec![u], Vec::new(), None),
                    None => match st.paged.remove(tag, requeue, rejected) {
                        Some(p) => (Vec::new(), vec![p], None),
                        None => return Err(unknown_tag(tag)),
                    },
                }
            };
            st.unacked_bytes -= body_bytes(&taken);
            (taken, paged, upto)
        };
        if !rejected {
            bump_by(
                &self.shared.stats.counters.ack,
                (taken.len() + paged.len()) as u64,
            );
        }
        settle(self.shared.key, taken, requeue, rejected);
        self.settle_paged(paged, upto, requeue, rejected);
        // Freed channel-wide credit may let other queues deliver.
        let queues = {
            let st = self.shared.st.lock();
            if st.global_prefetch != 0 {
                self.consumer_queues(&st)
            } else {
                Vec::new()
            }
        };
        queues.iter().for_each(|q| q.dispatch());
        Ok(())
    }

    fn recover(&mut self, requeue: bool) -> MethodResult {
        if !requeue {
            return Err(BrokerError::not_implemented("requeue=false"));
        }
        let (taken, paged, upto) = {
            let mut st = self.shared.st.lock();
            st.unacked_bytes = 0;
            let upto = st.next_tag;
            (
                std::mem::take(&mut st.unacked).into_values().collect(),
                st.paged.take_upto(upto, true, false),
                upto,
            )
        };
        settle(self.shared.key, taken, true, false);
        self.settle_paged(paged, Some(upto), true, false);
        Ok(())
    }

    /// Settles deliveries held paged out: `first`, then (for `upto`) the rest with a tag up to
    /// it, a chunk at a time with the channel's lock released in between (queues lock
    /// before channels).
    fn settle_paged(
        &self,
        first: Vec<unacked::Taken>,
        upto: Option<u64>,
        requeue: bool,
        rejected: bool,
    ) {
        let mut chunk = first;
        loop {
            let more = chunk.len() == unacked::CHUNK;
            unacked::settle(self.shared.key, chunk);
            let Some(upto) = upto.filter(|_| more) else {
                return;
            };
            chunk = self
                .shared
                .st
                .lock()
                .paged
                .take_upto(upto, requeue, rejected);
        }
    }

    /// Handles a content header frame.
    pub fn handle_header(
        &mut self,
        ctx: &Context,
        class_id: u16,
        weight: u16,
        body_size: u64,
        properties: BasicProperties,
    ) -> Result<(), BrokerError> {
        let Some(content) = self.content.as_mut() else {
            return Err(BrokerError::new(
                constants::UNEXPECTED_FRAME,
                "expected method frame, got non method frame instead",
            ));
        };
        if content.header.is_some() {
            return Err(BrokerError::new(
                constants::UNEXPECTED_FRAME,
                "expected content body, got non content body frame instead",
            ));
        }
        if class_id != BASIC_CLASS {
            return Err(BrokerError::new(
                constants::UNEXPECTED_FRAME,
                format!(
                    "expected content header for class {BASIC_CLASS}, got one for class {class_id} instead"
                ),
            ));
        }
        // RabbitMQ's assembler takes a header with a non-zero weight for no header at all.
        if weight != 0 {
            return Err(BrokerError::new(
                constants::UNEXPECTED_FRAME,
                format!(
                    "expected content header for class {BASIC_CLASS}, got non content header frame instead"
                ),
            ));
        }
        if body_size > ctx.limits.max_message_size {
            self.content = None;
            return Err(BrokerError::precondition_failed(format!(
                "message size {body_size} is larger than configured max size {}",
                ctx.limits.max_message_size
            )));
        }
        // Bodies being assembled are held in memory: bound them per connection, or a client
        // could start a large message on every channel and never finish them.
        let incomplete = ctx.incomplete_content.get() + body_size;
        if incomplete > ctx.limits.max_incomplete_content_bytes {
            self.content = None;
            return Err(BrokerError::precondition_failed(format!(
                "message size {body_size} would take the content this connection has started \
                 and not finished to {incomplete} bytes, over the limit of {} \
                 (amqp.max_incomplete_content_bytes)",
                ctx.limits.max_incomplete_content_bytes
            )));
        }
        ctx.incomplete_content.set(incomplete);
        content.header = Some((body_size, properties));
        if body_size == 0 {
            self.finish_publish(ctx)?;
        }
        Ok(())
    }

    /// Handles a body frame.
    pub fn handle_body(&mut self, ctx: &Context, payload: Bytes) -> Result<(), BrokerError> {
        let Some(content) = self.content.as_mut() else {
            return Err(BrokerError::new(
                constants::UNEXPECTED_FRAME,
                "expected method frame, got non method frame instead",
            ));
        };
        let Some((size, _)) = content.header else {
            return Err(BrokerError::new(
                constants::UNEXPECTED_FRAME,
                format!(
                    "expected content header for class {BASIC_CLASS}, got non content header frame instead"
                ),
            ));
        };
        let have = content.single.as_ref().map_or(0, |b| b.len()) + content.body.len();
        if (have + payload.len()) as u64 > size {
            // RabbitMQ 4.x's text (3.x waits for ever).
            return Err(BrokerError::new(
                constants::FRAME_ERROR,
                "content body frame exceeds remaining content size",
            ));
        }
        if have == 0 {
            content.single = Some(payload);
        } else {
            if let Some(first) = content.single.take() {
                content.body.reserve(size as usize);
                content.body.extend_from_slice(&first);
            }
            content.body.extend_from_slice(&payload);
        }
        if payload_len(content) as u64 >= size {
            self.finish_publish(ctx)?;
        }
        Ok(())
    }

    /// Forgets the message being assembled, if any, and returns its share of the connection's
    /// incomplete-content budget.
    fn take_content(&mut self, ctx: &Context) -> Option<PendingContent> {
        let content = self.content.take()?;
        if let Some((size, _)) = &content.header {
            let left = ctx.incomplete_content.get().saturating_sub(*size);
            ctx.incomplete_content.set(left);
        }
        Some(content)
    }

    fn finish_publish(&mut self, ctx: &Context) -> MethodResult {
        let Some(content) = self.take_content(ctx) else {
            return Ok(());
        };
        let (_, properties) = content.header.unwrap_or_default();
        let body = match content.single {
            Some(b) => b,
            None => content.body.freeze(),
        };
        let msg = ctx.ops().prepare_message(
            content.check,
            content.publish.exchange,
            content.publish.routing_key,
            properties,
            body,
            self.reply_to.as_deref(),
        )?;
        bump(&self.shared.stats.counters.publish);
        if let Some(tx) = self.tx.as_mut() {
            let bytes = msg.body.len() as u64;
            tx.admit(&ctx.limits, bytes)?;
            tx.bytes += bytes;
            tx.publishes.push((msg, content.publish.mandatory));
            return Ok(());
        }
        let Some(confirms) = self.confirm.clone() else {
            self.route_and_enqueue(ctx, msg, content.publish.mandatory, None)?;
            return Ok(());
        };
        let seq = confirms.begin();
        let waiter: Arc<dyn Completion> = confirms.clone();
        match self.route_and_enqueue(ctx, msg, content.publish.mandatory, Some((waiter, seq))) {
            Ok(Some(p)) => {
                if p.rejected {
                    // A full queue with overflow reject-publish refused it.
                    confirms.settle(seq, false);
                } else if !p.stored {
                    confirms.settle(seq, true);
                }
                Ok(())
            }
            Ok(None) => {
                confirms.settle(seq, false);
                Ok(())
            }
            Err(e) => {
                confirms.settle(seq, false);
                Err(e)
            }
        }
    }

    /// Routes and enqueues one publish; a mandatory publish that reaches no queue comes back
    /// as basic.return 312 NO_ROUTE. `Ok(None)` means the message store refused the write
    /// (disk full or failing): the message went nowhere.
    fn route_and_enqueue(
        &mut self,
        ctx: &Context,
        msg: Arc<Message>,
        mandatory: bool,
        waiter: Option<(Arc<dyn Completion>, u64)>,
    ) -> Result<Option<Published>, BrokerError> {
        let mut published = match ctx.ops().publish(msg.clone(), waiter) {
            Ok(p) => p,
            Err(PublishError::Broker(e)) => return Err(e),
            Err(PublishError::StoreUnavailable(reason)) => {
                // Every publish is refused while the disk is full: one line per interval,
                // with the count of the refusals it stands for.
                static REFUSED: LogLimit = LogLimit::new();
                if let Some(suppressed) = REFUSED.admit() {
                    tracing::warn!(%reason, suppressed, "publish refused: message store unavailable");
                }
                return Ok(None);
            }
        };
        self.shared
            .stats
            .count_exchange(&msg.exchange, published.queues);
        if !published.routed && !mandatory {
            bump(&self.shared.stats.counters.drop_unroutable);
        }
        if !published.routed && mandatory {
            bump(&self.shared.stats.counters.return_unroutable);
            let method = Method::BasicReturn(BasicReturn {
                reply_code: constants::NO_ROUTE,
                reply_text: "NO_ROUTE".into(),
                exchange: msg.exchange.clone(),
                routing_key: msg.routing_key.clone(),
            });
            self.shared
                .outbox
                .with(|buf| write_content(buf, self.id(), &method, &msg, self.shared.frame_max));
        }
        if let Some(q) = published.pressured.take() {
            self.pressure = Some(q);
        }
        Ok(Some(published))
    }

    /// True when the channel has consumers.
    pub fn has_consumers(&self) -> bool {
        !self.shared.st.lock().consumers.is_empty()
    }

    /// Takes the queue, if any, that asked this channel's publisher to pause.
    pub fn take_pressure(&mut self) -> Option<Arc<Queue>> {
        self.pressure.take()
    }

    /// Sends the publisher confirms that are due.
    pub fn flush_confirms(&mut self) {
        if let Some(c) = &self.confirm {
            c.flush();
        }
    }

    /// Releases everything the channel holds: consumers are cancelled (auto-delete queues that
    /// lose their last consumer are deleted) and unacked messages are requeued.
    pub fn cleanup(&mut self, ctx: &Context) {
        // Releasing what the channel holds needs no permission: it cannot be refused.
        let ops = ctx.ops();
        if let Some(name) = self.reply_to.take() {
            let _ = ops.cancel_replies(&name);
        }
        let (consumers, unacked, paged, upto) = {
            let mut st = self.shared.st.lock();
            st.open = false;
            st.unacked_bytes = 0;
            let upto = st.next_tag;
            (
                std::mem::take(&mut st.consumers),
                std::mem::take(&mut st.unacked),
                st.paged.take_upto(upto, true, false),
                upto,
            )
        };
        for (tag, info) in consumers {
            let _ = ops.cancel(&info.queue, self.shared.key, &tag);
        }
        settle(
            self.shared.key,
            unacked.into_values().collect(),
            true,
            false,
        );
        self.settle_paged(paged, Some(upto), true, false);
        self.take_content(ctx);
        self.tx = None;
    }

    /// Starts a server-initiated close of this channel: cleans up, sends channel.close and
    /// discards further frames until channel.close-ok.
    pub fn close_with_error(
        &mut self,
        ctx: &Context,
        err: &BrokerError,
        class_id: u16,
        method_id: u16,
    ) {
        self.cleanup(ctx);
        self.closing = true;
        self.send(ChannelClose {
            reply_code: err.code,
            reply_text: err.reply_text(),
            class_id,
            method_id,
        });
    }
}

fn payload_len(c: &PendingContent) -> usize {
    c.single.as_ref().map_or(0, |b| b.len()) + c.body.len()
}

fn body_bytes(taken: &[Unacked]) -> usize {
    taken.iter().map(|u| u.message.message.body.len()).sum()
}

fn unknown_tag(tag: u64) -> BrokerError {
    BrokerError::precondition_failed(format!("unknown delivery tag {tag}"))
}

/// Settles `taken` deliveries with their queues, grouped per queue, requeueing when asked;
/// `rejected` for basic.reject / basic.nack (dead-lettered without `requeue`).
fn settle(channel_key: u64, taken: Vec<Unacked>, requeue: bool, rejected: bool) {
    let mut by_queue: Vec<(Arc<Queue>, Vec<Settlement>)> = Vec::new();
    for u in taken {
        let s = Settlement {
            consumer_tag: u.consumer_tag,
            message: u.message,
            requeue,
            rejected,
        };
        match by_queue.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &u.queue)) {
            Some((_, v)) => v.push(s),
            None => by_queue.push((u.queue, vec![s])),
        }
    }
    for (q, s) in by_queue {
        q.settle(channel_key, s);
    }
}

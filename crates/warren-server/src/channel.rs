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
//!
//! This file holds the [`Channel`] and its method dispatch; each concern has a file below
//! `channel/`: `delivery.rs` (the shared half), `publish.rs` (basic.publish and its content),
//! `confirms.rs` (publisher confirms), `consume.rs` (qos, consume, cancel, get), `ack.rs`
//! (ack, nack, reject, recover), `tx.rs` (transactions), `topology.rs` (exchange and queue
//! declares) and `durable_replies.rs` (replies that wait for the definitions' fsync).

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
    bump, bump_by, ChannelEntry, ChannelHandle, ChannelProbe, ConsumerDetails, QueueDeliveries,
};
use warren_broker::vhost::log::DurableSink;
use warren_broker::vhost::{ExchangeDeclare as ExchangeSpec, QueueDeclare as QueueSpec, REPLY_TO};
use warren_broker::{
    names, Actor, Broker, BrokerError, Completion, Consumer, DeliveryTarget, Message, Ops,
    PublishError, Published, Queue, QueuedMessage, VHost,
};

mod ack;
mod ack_timeout;
mod confirms;
mod consume;
mod delivery;
mod durable_replies;
mod publish;
mod topology;
mod tx;

use ack::{settle, AckOp};
use ack_timeout::AckClock;
pub use ack_timeout::{AckCheck, TimedOut};
pub use confirms::Confirms;
use confirms::{CommitEnd, CommitWait};
use delivery::{hold, ConsumerInfo, SharedState, Unacked};
pub use delivery::{write_content, ChannelShared};
pub use durable_replies::DurableReplies;
use publish::PendingContent;
use tx::TxState;

/// Class id of `basic`, the only content class.
pub const BASIC_CLASS: u16 = 60;

static CHANNEL_KEYS: AtomicU64 = AtomicU64::new(1);

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
    /// basic.ack, basic.nack and basic.reject (in that order): the access-control generation
    /// under which each was last authorized, so that a settlement, sent for every delivery,
    /// asks the operations layer only when the access-control database changed.
    settle_granted: [Option<u64>; 3],
    /// Dates the oldest unacknowledged delivery for the acknowledgement timeout.
    ack_clock: AckClock,
    /// The last tx.commit, until it ended: a failed one closed the channel.
    commit: Option<Arc<CommitWait>>,
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
    /// The broker's delivery acknowledgement timeout, ms (`amqp.consumer_timeout`; `None`:
    /// off).
    pub consumer_timeout: Option<u64>,
}

type MethodResult = Result<(), BrokerError>;

impl Channel {
    /// A freshly opened channel. `consumer_timeout` is the broker's delivery acknowledgement
    /// timeout in ms (`amqp.consumer_timeout`; `None`: off), for deliveries of queues that
    /// set none.
    pub fn new(
        id: u16,
        outbox: Arc<Outbox>,
        frame_max: u32,
        cancel_notify: bool,
        registration: ChannelHandle,
        consumer_timeout: Option<u64>,
    ) -> Self {
        let shared = Arc::new(ChannelShared {
            key: CHANNEL_KEYS.fetch_add(1, Ordering::Relaxed),
            id,
            outbox,
            frame_max,
            cancel_notify,
            consumer_timeout,
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
                tallies: Default::default(),
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
            settle_granted: [None; 3],
            ack_clock: AckClock::default(),
            commit: None,
        }
    }

    /// Takes note of how the last tx.commit ended; returns true when it failed, which sent
    /// channel.close (406 "partial tx completion"): the channel is then cleaned up and
    /// closing, as after any channel error. Called before each method the channel receives.
    pub fn settle_commit(&mut self, ctx: &Context) -> bool {
        let Some(wait) = &self.commit else {
            return false;
        };
        match wait.end() {
            CommitEnd::Waiting => false,
            CommitEnd::Committed => {
                self.commit = None;
                false
            }
            CommitEnd::Failed => {
                self.commit = None;
                self.cleanup(ctx);
                self.closing = true;
                true
            }
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
        // Consumer cancel notifications caused by a method (queue.delete of a queue this
        // channel consumes from) follow its reply. The methods of the message path delete
        // no queue, so they skip that bookkeeping and its two channel-lock round trips.
        if matches!(
            method,
            Method::BasicPublish(_)
                | Method::BasicAck(_)
                | Method::BasicNack(_)
                | Method::BasicReject(_)
        ) {
            return self.dispatch_method(ctx, method);
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

    /// Authorizes settlement `op` (basic.ack, basic.nack or basic.reject, at `slot` of
    /// `settle_granted`) through the operations layer once per generation of the
    /// access-control database.
    fn authorize_settlement(
        &mut self,
        ctx: &Context,
        op: Operation<'static>,
        slot: usize,
    ) -> Result<(), BrokerError> {
        let generation = ctx.broker.access_generation();
        if self.settle_granted[slot] != Some(generation) {
            ctx.ops().authorize(&op)?;
            self.settle_granted[slot] = Some(generation);
        }
        Ok(())
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
                    Destination::Exchange(m.destination.into()),
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
                    Destination::Exchange(m.destination.into()),
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
                    Destination::Queue(m.queue.into()),
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
                    Destination::Queue(m.queue.into()),
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
                self.authorize_settlement(ctx, Operation::BasicAck, 0)?;
                let op = AckOp::Ack {
                    tag: m.delivery_tag,
                    multiple: m.multiple,
                };
                self.ack_op(ctx, op).map(|_| Outcome::Done)
            }
            Method::BasicReject(m) => {
                self.authorize_settlement(ctx, Operation::BasicReject, 2)?;
                let op = AckOp::Reject {
                    tag: m.delivery_tag,
                    multiple: false,
                    requeue: m.requeue,
                };
                self.ack_op(ctx, op).map(|_| Outcome::Done)
            }
            Method::BasicNack(m) => {
                self.authorize_settlement(ctx, Operation::BasicNack, 1)?;
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
                // Each publish takes a part of the commit, as it would a publisher confirm: a
                // quorum queue's part ends at its commit, which no store barrier covers.
                let wait = Arc::new(CommitWait::new(self.id(), self.shared.outbox.clone()));
                let mut stored = false;
                for (i, (msg, mandatory)) in tx.publishes.into_iter().enumerate() {
                    let token = i as u64 + 1;
                    wait.expect(token);
                    let part: Arc<dyn Completion> = wait.clone();
                    match self.route_and_enqueue(ctx, msg, mandatory, Some((part, token)))? {
                        Some(p) if p.stored => stored = true,
                        Some(_) => wait.complete(&[token], true),
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
                if stored {
                    // The acknowledgements' records, written after the publishes.
                    wait.expect(0);
                    if !ctx.ops().sync((wait.clone(), 0)) {
                        wait.complete(&[0], true);
                    }
                }
                wait.seal();
                self.commit = Some(wait);
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

//! The operations layer: the one door every front end goes through.
//!
//! An AMQP channel today (and the HTTP queue API, the management API and replicated queues
//! later) does not touch a [`VHost`] directly for what a client asks: it asks [`Ops`], which
//! carries the [`Actor`] (who asks: user, tags, vhost, connection, peer), decides whether the
//! actor may do it, and then does it. Authorization is decided here and nowhere else, by
//! describing each request as an [`Operation`] and asking the access-control database
//! ([`crate::access`]), whose [`required_access`] is an exhaustive `match`: an operation
//! cannot exist without an access decision.
//!
//! Each operation makes its checks in RabbitMQ's order (`rabbit_channel.erl`): the refusals
//! RabbitMQ makes before permission checks (the default exchange, `amq.` names) come first,
//! then the resource permissions, then the lookups (404), then the checks RabbitMQ makes once
//! the resource is found (topic permissions, a new declare's alternate or dead-letter
//! exchange). The publish rules (`user_id`, expiration, direct reply-to, exchange existence)
//! are in [`publish`].
//!
//! The channel keeps the protocol: frames, delivery tags, prefetch, confirms, transactions.
//! Operations on the channel's own state (ack, nack, reject, recover, qos, flow, tx, confirm)
//! still pass [`Ops::authorize`], which needs no lock when the operation needs no permission.

pub mod admin;
pub mod publish;

use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use crate::access::operation::DIRECT_REPLY_TO_QUEUE;
use crate::access::{required_access, Operation, UserTag};
use crate::broker::Broker;
use crate::error::Result;
use crate::exchange::{Destination, ExchangeKind};
use crate::message::QueuedMessage;
use crate::queue::{Consumer, DeliveryTarget, Queue, QueueCounts};
use crate::vhost::log::{deferring, DurableSink};
use crate::vhost::{
    check_new_exchange_name, decide_queue_name, default_exchange_refused, ExchangeDeclare,
    QueueDeclare, VHost,
};
use warren_amqp::table::FieldValue;

pub use admin::Admin;
pub use publish::PublishGrant;

/// Who performs an operation: the authenticated user, the vhost, and where the request came
/// from. An AMQP connection builds one at connection.open and hands it to every operation of
/// its channels; an HTTP front end builds one per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    /// The authenticated user's name.
    pub user: Arc<str>,
    /// The user's tags at login (`administrator`, `impersonator`, …).
    pub tags: Arc<[UserTag]>,
    /// The vhost the actor works in.
    pub vhost: Arc<str>,
    /// The AMQP connection's id: the owner of the exclusive queues it declares. 0 for front
    /// ends without connections (HTTP), which own no exclusive queue.
    pub connection_id: u64,
    /// The client's address, when there is one.
    pub peer: Option<SocketAddr>,
}

impl Actor {
    /// An actor for `user` in `vhost`.
    pub fn new(
        user: impl Into<Arc<str>>,
        tags: impl Into<Arc<[UserTag]>>,
        vhost: impl Into<Arc<str>>,
        connection_id: u64,
        peer: Option<SocketAddr>,
    ) -> Self {
        Actor {
            user: user.into(),
            tags: tags.into(),
            vhost: vhost.into(),
            connection_id,
            peer,
        }
    }

    /// True when the actor's user has `tag`.
    pub fn has_tag(&self, tag: &UserTag) -> bool {
        self.tags.contains(tag)
    }
}

/// What queue.declare answers: the queue's name and counts, and the queue itself (`None` for
/// a passive declare of direct reply-to's pseudo-queue, which is no queue).
pub struct DeclaredQueue {
    /// The queue's name (server-named queues: the generated `amq.gen-…` name).
    pub name: String,
    /// Its ready messages and consumers.
    pub counts: QueueCounts,
    /// The queue.
    pub queue: Option<Arc<Queue>>,
}

/// What basic.get took: the queue, and the message with the number of messages left (`None`:
/// the queue was empty).
pub struct Got {
    /// The queue.
    pub queue: Arc<Queue>,
    /// The message and the ready messages left.
    pub message: Option<(QueuedMessage, u32)>,
}

/// The operations of one actor in one vhost: a few references, cheap to build per call.
#[derive(Clone, Copy)]
pub struct Ops<'a> {
    broker: &'a Broker,
    vhost: &'a Arc<VHost>,
    actor: &'a Actor,
    durable: Option<&'a Arc<dyn DurableSink>>,
}

impl<'a> Ops<'a> {
    /// `actor`'s operations on `vhost` of `broker` (`vhost` is the actor's vhost).
    pub fn new(broker: &'a Broker, vhost: &'a Arc<VHost>, actor: &'a Actor) -> Self {
        debug_assert_eq!(&*actor.vhost, &*vhost.name);
        Ops {
            broker,
            vhost,
            actor,
            durable: None,
        }
    }

    /// Durable declares, binds and unbinds return as soon as they are applied, and `sink`
    /// learns when they are on disk (see [`crate::vhost::log::deferring`]): the caller holds
    /// their replies until then. Deletes, whose effects (dropped messages) cannot be rolled
    /// back, return once stored, as every durable change does without a sink.
    pub fn with_durable_sink(mut self, sink: &'a Arc<dyn DurableSink>) -> Self {
        self.durable = Some(sink);
        self
    }

    /// Runs a topology change, deferring its durability to the sink if there is one.
    fn change<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.durable {
            Some(sink) => deferring(sink, f),
            None => f(),
        }
    }

    /// The actor.
    pub fn actor(&self) -> &'a Actor {
        self.actor
    }

    /// The vhost.
    pub fn vhost(&self) -> &'a Arc<VHost> {
        self.vhost
    }

    /// The broker.
    pub fn broker(&self) -> &'a Broker {
        self.broker
    }

    /// Decides whether the actor may perform `op` (the checks RabbitMQ makes before looking
    /// anything up). Operations that need no permission take no lock.
    ///
    /// Errors: 403 ACCESS_REFUSED `<perm> access to <kind> '<name>' in vhost '<v>' refused for
    /// user '<u>'`, and the other refusals of [`crate::access::AccessControl::check`].
    #[inline]
    pub fn authorize(&self, op: &Operation<'_>) -> Result<()> {
        if required_access(op).is_none() {
            return Ok(());
        }
        self.broker
            .access()
            .check(&self.actor.user, &self.actor.vhost, op)
    }

    /// The checks RabbitMQ makes once the exchange of `op` is found: topic permissions when
    /// it is a topic exchange, a publish's `user_id`.
    fn authorize_after_lookup(&self, op: &Operation<'_>, exchange_is_topic: bool) -> Result<()> {
        self.broker.access().check_after_lookup(
            &self.actor.user,
            &self.actor.vhost,
            op,
            exchange_is_topic,
        )
    }

    // --- Exchanges ---

    /// exchange.declare: the default exchange is refused (403), then configure permission on
    /// the exchange; a declare that creates it also checks the `amq.` prefix (403) and, with
    /// an `alternate-exchange`, read on the exchange and write on the alternate. Then
    /// [`VHost::declare_exchange`]'s checks and effect.
    pub fn declare_exchange(&self, d: &ExchangeDeclare) -> Result<()> {
        if d.passive {
            if d.name.is_empty() {
                return Err(default_exchange_refused());
            }
            self.authorize(&Operation::ExchangeDeclare {
                exchange: &d.name,
                passive: true,
                alternate_exchange: None,
            })?;
            return self.change(|| self.vhost.declare_exchange(d));
        }
        if ExchangeKind::parse(&d.kind).is_none() {
            // The vhost's refusal (406 unknown type) comes first, as in RabbitMQ.
            return self.vhost.declare_exchange(d);
        }
        if d.name.is_empty() {
            return Err(default_exchange_refused());
        }
        self.authorize(&Operation::ExchangeDeclare {
            exchange: &d.name,
            passive: false,
            alternate_exchange: None,
        })?;
        if !self.vhost.exchange_exists(&d.name) {
            check_new_exchange_name(&d.name)?;
            if let Some(ae) = text_arg(d.arguments.get("alternate-exchange")) {
                self.authorize(&Operation::ExchangeDeclare {
                    exchange: &d.name,
                    passive: false,
                    alternate_exchange: Some(ae),
                })?;
            }
        }
        self.change(|| self.vhost.declare_exchange(d))
    }

    /// exchange.delete: the default and `amq.` exchanges are refused (403), then configure
    /// permission on the exchange, then [`VHost::delete_exchange`].
    pub fn delete_exchange(&self, name: &str, if_unused: bool) -> Result<()> {
        self.vhost.check_exchange_deletable(name)?;
        self.authorize(&Operation::ExchangeDelete { exchange: name })?;
        // Not deferred: deleting drops what a delayed exchange holds, which a rollback could
        // not bring back. The reply waits for the record's fsync.
        self.vhost.delete_exchange(name, if_unused)
    }

    // --- Bindings ---

    /// queue.bind / exchange.bind: write on the destination, read on the source, then (the
    /// source found and a topic exchange) topic read permission on the binding key, then
    /// [`VHost::bind`].
    pub fn bind(
        &self,
        source: &str,
        destination: Destination,
        routing_key: &str,
        arguments: &warren_amqp::table::FieldTable,
    ) -> Result<()> {
        self.authorize_binding(source, &destination, routing_key, true)?;
        let connection = self.actor.connection_id;
        self.change(|| {
            self.vhost
                .bind(source, destination, routing_key, arguments, connection)
        })
    }

    /// queue.unbind / exchange.unbind: the checks of [`Ops::bind`], then [`VHost::unbind`].
    pub fn unbind(
        &self,
        source: &str,
        destination: Destination,
        routing_key: &str,
        arguments: &warren_amqp::table::FieldTable,
    ) -> Result<()> {
        self.authorize_binding(source, &destination, routing_key, false)?;
        let connection = self.actor.connection_id;
        self.change(|| {
            self.vhost
                .unbind(source, destination, routing_key, arguments, connection)
        })
    }

    fn authorize_binding(
        &self,
        source: &str,
        destination: &Destination,
        routing_key: &str,
        bind: bool,
    ) -> Result<()> {
        let op = match (destination, bind) {
            (Destination::Queue(queue), true) => Operation::QueueBind {
                queue,
                exchange: source,
                routing_key,
            },
            (Destination::Queue(queue), false) => Operation::QueueUnbind {
                queue,
                exchange: source,
                routing_key,
            },
            (Destination::Exchange(destination), true) => Operation::ExchangeBind {
                destination,
                source,
                routing_key,
            },
            (Destination::Exchange(destination), false) => Operation::ExchangeUnbind {
                destination,
                source,
                routing_key,
            },
        };
        self.authorize(&op)?;
        // RabbitMQ checks topic permissions only when the source exists and is a topic
        // exchange; a missing source is the 404 of the bind itself.
        if self.vhost.exchange_kind(source) == Some(ExchangeKind::Topic) {
            self.authorize_after_lookup(&op, true)?;
        }
        Ok(())
    }

    // --- Policies ---

    /// Creates or replaces a policy of the actor's vhost (an operator policy with
    /// `operator`): a policymaker or administrator with access to the vhost may set
    /// policies, only an administrator operator policies (rabbitmq.com/docs/policies); then
    /// [`VHost::set_policy`].
    ///
    /// Errors: 403 ACCESS_REFUSED for a user without those rights; 541 when it cannot be
    /// stored.
    pub fn set_policy(&self, operator: bool, policy: crate::policy::Policy) -> Result<()> {
        self.authorize_policy(operator, &policy.name, true)?;
        self.change(|| self.vhost.set_policy(operator, policy))
    }

    /// Removes a policy (an operator policy with `operator`), with the checks of
    /// [`Ops::set_policy`]; false when there was none.
    pub fn clear_policy(&self, operator: bool, name: &str) -> Result<bool> {
        self.authorize_policy(operator, name, false)?;
        self.change(|| self.vhost.clear_policy(operator, name))
    }

    fn authorize_policy(&self, operator: bool, name: &str, put: bool) -> Result<()> {
        let vhost = &*self.actor.vhost;
        let op = match (operator, put) {
            (true, _) => Operation::OperatorPolicyChange { vhost, name },
            (false, true) => Operation::PolicyPut { vhost, name },
            (false, false) => Operation::PolicyDelete { vhost, name },
        };
        self.authorize(&op)
    }

    // --- Queues ---

    /// queue.declare. Passive: any permission on the queue, then the lookup (404, 405).
    /// Otherwise the name is decided first (a server-named queue gets its `amq.gen-…` name;
    /// `amq.` names are refused, 403), then configure permission on it; a declare that
    /// creates the queue checks the vhost's `max-queues` and, with an
    /// `x-dead-letter-exchange`, read on the queue and write on that exchange. Then
    /// [`VHost::declare_queue`]'s checks and effect.
    pub fn declare_queue(&self, d: &QueueDeclare) -> Result<DeclaredQueue> {
        if d.passive {
            self.authorize(&Operation::QueueDeclare {
                queue: &d.name,
                passive: true,
                dead_letter_exchange: None,
            })?;
            if d.name == DIRECT_REPLY_TO_QUEUE {
                return Ok(DeclaredQueue {
                    name: d.name.clone(),
                    counts: QueueCounts::default(),
                    queue: None,
                });
            }
            let (q, counts) = self.vhost.declare_queue(d, self.actor.connection_id)?;
            return Ok(DeclaredQueue {
                name: q.name().to_string(),
                counts,
                queue: Some(q),
            });
        }
        self.vhost.check_server_named(d)?;
        let name = decide_queue_name(&d.name)?;
        let with_default;
        let d = match self.default_queue_type(d, &name) {
            Some(t) => {
                let mut c = d.clone();
                c.arguments.insert(
                    "x-queue-type",
                    warren_amqp::table::FieldValue::LongString(bytes::Bytes::from(t)),
                );
                with_default = c;
                &with_default
            }
            None => d,
        };
        self.authorize(&Operation::QueueDeclare {
            queue: &name,
            passive: false,
            dead_letter_exchange: None,
        })?;
        crate::registry::bump(&self.broker.registry().churn().queue_declared);
        if !self.vhost.queue_exists(&name) {
            self.broker.access().check_new_queue(
                &self.actor.vhost,
                &name,
                self.vhost.queue_count() as u64,
            )?;
            if let Some(dlx) = text_arg(d.arguments.get("x-dead-letter-exchange")) {
                self.authorize(&Operation::QueueDeclare {
                    queue: &name,
                    passive: false,
                    dead_letter_exchange: Some(dlx),
                })?;
            }
        }
        let connection = self.actor.connection_id;
        let (q, counts) = self.change(|| self.vhost.declare_queue_as(name, d, connection))?;
        Ok(DeclaredQueue {
            name: q.name().to_string(),
            counts,
            queue: Some(q),
        })
    }

    /// The vhost's `default_queue_type` for a new queue declared without `x-queue-type`, as
    /// RabbitMQ 4 applies it (`rabbit_amqqueue:augment_declare_args`): only where that type
    /// suits the declare (a quorum queue is durable, not exclusive, not auto-delete) and this
    /// broker has it, or where the queue exists with that type. `None`: the declare stays as
    /// it is.
    fn default_queue_type(&self, d: &QueueDeclare, name: &str) -> Option<String> {
        if d.arguments.contains_key("x-queue-type") {
            return None;
        }
        let t = self
            .broker
            .access()
            .vhost(&self.actor.vhost)?
            .default_queue_type
            .clone()?;
        if let Ok(q) = self.vhost.queue(name, self.actor.connection_id) {
            // Declared again: as the queue it is when it already has that type (so that the
            // default is equivalent to it), else as declared.
            return (q.kind() == t).then_some(t);
        }
        let suits = match t.as_str() {
            "quorum" => d.durable && !d.exclusive && !d.auto_delete,
            _ => false,
        };
        (suits && self.vhost.has_queue_kind(&t)).then_some(t)
    }

    /// queue.delete: configure permission on the queue, then [`VHost::delete_queue`]. Returns
    /// the number of messages deleted.
    pub fn delete_queue(&self, name: &str, if_unused: bool, if_empty: bool) -> Result<u32> {
        self.authorize(&Operation::QueueDelete { queue: name })?;
        // Not deferred: a deleted queue's messages are dropped at once, which a rollback could
        // not bring back. The reply waits for the record's fsync.
        self.vhost
            .delete_queue(name, if_unused, if_empty, self.actor.connection_id)
    }

    /// queue.purge: read permission on the queue, then [`VHost::purge_queue`]. Returns the
    /// number of messages purged.
    pub fn purge_queue(&self, name: &str) -> Result<u32> {
        self.authorize(&Operation::QueuePurge { queue: name })?;
        self.vhost.purge_queue(name, self.actor.connection_id)
    }

    // --- Consuming ---

    /// basic.consume: read permission on the queue, then [`VHost::consume`].
    pub fn consume(&self, queue: &str, consumer: Consumer) -> Result<Arc<Queue>> {
        self.authorize(&Operation::BasicConsume { queue })?;
        self.vhost
            .consume(queue, consumer, self.actor.connection_id)
    }

    /// basic.consume on direct reply-to's pseudo-queue (needs no permission): registers
    /// `target` and returns the `reply_to` name its requests carry.
    pub fn consume_replies(
        &self,
        target: Weak<dyn DeliveryTarget>,
        tag: Arc<str>,
    ) -> Result<String> {
        self.authorize(&Operation::BasicConsume {
            queue: DIRECT_REPLY_TO_QUEUE,
        })?;
        Ok(self.vhost.add_reply_consumer(target, tag))
    }

    /// basic.cancel of a consumer on `queue` (or the end of its channel): removes it, and
    /// deletes an auto-delete queue that lost its last consumer.
    pub fn cancel(&self, queue: &Arc<Queue>, channel_key: u64, tag: &str) -> Result<()> {
        self.authorize(&Operation::BasicCancel)?;
        if Arc::ptr_eq(queue, self.vhost.reply_queue()) {
            return Ok(());
        }
        if queue.remove_consumer(channel_key, tag) {
            self.vhost.remove_queue(queue);
        }
        Ok(())
    }

    /// Cancels the direct reply-to consumer registered under `reply_to`.
    pub fn cancel_replies(&self, reply_to: &str) -> Result<()> {
        self.authorize(&Operation::BasicCancel)?;
        self.vhost.remove_reply_consumer(reply_to);
        Ok(())
    }

    /// basic.get: read permission on the queue, then the lookup (404, 405) and one message,
    /// if any, with the number left.
    pub fn get(&self, queue: &str, no_ack: bool) -> Result<Got> {
        self.authorize(&Operation::BasicGet { queue })?;
        let q = self.vhost.queue(queue, self.actor.connection_id)?;
        let message = q.get(no_ack);
        Ok(Got { queue: q, message })
    }
}

/// A long-string argument, as RabbitMQ reads `alternate-exchange` and
/// `x-dead-letter-exchange` for their permission checks (`rabbit_misc:r_arg/4`); a value of
/// another type is left to the declare's own validation.
fn text_arg(v: Option<&FieldValue>) -> Option<&str> {
    match v? {
        FieldValue::LongString(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

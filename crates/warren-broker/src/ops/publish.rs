//! basic.publish behind the door: the rules a publish must pass before it is routed.
//!
//! In RabbitMQ's order (`handle_method(#'basic.publish'{}, ...)` in `rabbit_channel.erl`):
//! 1. write permission on the exchange (the default exchange is checked as `amq.default`);
//! 2. the exchange exists (404 `no exchange 'x' in vhost 'v'`);
//! 3. topic write permission on the routing key, when the exchange is a topic exchange;
//! 4. direct reply-to: a `reply_to` of `amq.rabbitmq.reply-to` is rewritten to the name of
//!    the publishing channel's reply consumer (406 when it has none);
//! 5. the `user_id` property names the authenticated user, unless the user is an
//!    `impersonator` (406);
//! 6. the `expiration` property is a valid TTL (406).
//!
//! Steps 1 and 2 run when the method frame arrives ([`Ops::check_publish`]), the rest once
//! the content is complete ([`Ops::prepare_message`]); an internal exchange is refused when
//! the message is routed. The write permission is the only check every publish needs: a
//! channel keeps the last decision in a [`PublishGrant`] (RabbitMQ caches permission checks
//! per channel too), valid while the access-control database is unchanged.

use std::sync::Arc;

use bytes::Bytes;
use warren_amqp::properties::BasicProperties;

use super::Ops;
use crate::access::operation::DIRECT_REPLY_TO_QUEUE;
use crate::access::Operation;
use crate::error::{BrokerError, Result};
use crate::exchange::ExchangeKind;
use crate::message::Message;
use crate::vhost::{PublishError, Published};
use crate::Completion;

/// A channel's last publish permission: the exchange it was granted for, under which
/// generation of the access-control database ([`crate::Broker::access_generation`]).
#[derive(Debug, Default)]
pub struct PublishGrant {
    granted: Option<(u64, String)>,
}

impl PublishGrant {
    fn covers(&self, generation: u64, exchange: &str) -> bool {
        matches!(&self.granted, Some((g, x)) if *g == generation && crate::names::same(x, exchange))
    }

    fn grant(&mut self, generation: u64, exchange: &str) {
        match &mut self.granted {
            Some((g, x)) => {
                *g = generation;
                x.clear();
                x.push_str(exchange);
            }
            None => self.granted = Some((generation, exchange.to_string())),
        }
    }
}

/// What a basic.publish's method frame established, kept until its content is complete.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishCheck {
    /// The exchange is a topic exchange: topic permissions apply.
    pub exchange_is_topic: bool,
}

impl Ops<'_> {
    /// basic.publish, as its method frame arrives: write permission on `exchange` (cached in
    /// `grant`), then its existence. Errors: 403 ACCESS_REFUSED `write access to exchange 'x'
    /// in vhost 'v' refused for user 'u'`, 404 NOT_FOUND `no exchange 'x' in vhost 'v'`.
    pub fn check_publish(&self, exchange: &str, grant: &mut PublishGrant) -> Result<PublishCheck> {
        let generation = self.broker.access_generation();
        if !grant.covers(generation, exchange) {
            self.authorize(&Operation::BasicPublish {
                exchange,
                routing_key: "",
                user_id: None,
            })?;
            grant.grant(generation, exchange);
        }
        match self.vhost.exchange_kind(exchange) {
            Some(kind) => Ok(PublishCheck {
                exchange_is_topic: kind == ExchangeKind::Topic,
            }),
            None => Err(BrokerError::not_found(format!(
                "no exchange '{exchange}' in vhost '{}'",
                self.vhost.name
            ))),
        }
    }

    /// The content of a publish is complete: the topic permission, direct reply-to, `user_id`
    /// and `expiration` rules (see the module docs), then the message to route.
    /// `reply_consumer` is the `reply_to` name of the publishing channel's direct reply-to
    /// consumer, if it has one.
    pub fn prepare_message(
        &self,
        check: PublishCheck,
        exchange: String,
        routing_key: String,
        mut properties: BasicProperties,
        body: Bytes,
        reply_consumer: Option<&str>,
    ) -> Result<Arc<Message>> {
        if check.exchange_is_topic {
            self.authorize_after_lookup(
                &Operation::BasicPublish {
                    exchange: &exchange,
                    routing_key: &routing_key,
                    user_id: None,
                },
                true,
            )?;
        }
        // Property values are opaque bytes; only the three the broker interprets are read
        // as text here.
        if properties
            .reply_to
            .as_ref()
            .is_some_and(|r| r == DIRECT_REPLY_TO_QUEUE)
        {
            match reply_consumer {
                Some(name) => properties.reply_to = Some(name.into()),
                None => {
                    return Err(BrokerError::precondition_failed(
                        "fast reply consumer does not exist",
                    ))
                }
            }
        }
        if let Some(claimed) = &properties.user_id {
            if claimed.as_bytes() != self.actor.user.as_bytes() {
                self.authorize_after_lookup(
                    &Operation::BasicPublish {
                        exchange: &exchange,
                        routing_key: &routing_key,
                        user_id: Some(&claimed.to_string_lossy()),
                    },
                    false,
                )?;
            }
        }
        if let Some(e) = &properties.expiration {
            if let Err(reason) = crate::args::parse_expiration(&e.to_string_lossy()) {
                return Err(BrokerError::precondition_failed(format!(
                    "invalid expiration '{e}': {reason}"
                )));
            }
        }
        Ok(Arc::new(Message::new(
            exchange,
            routing_key,
            properties,
            body,
        )))
    }

    /// Routes and enqueues a message that passed [`Ops::check_publish`] and
    /// [`Ops::prepare_message`] (see [`crate::VHost::publish`]).
    pub fn publish(
        &self,
        msg: Arc<Message>,
        waiter: Option<(Arc<dyn Completion>, u64)>,
    ) -> std::result::Result<Published, PublishError> {
        self.vhost.publish(msg, waiter)
    }

    /// Has the store fsync what this actor's publishes wrote, then completes `waiter`
    /// (tx.commit); false when nothing is pending (see [`crate::VHost::sync`]).
    pub fn sync(&self, waiter: (Arc<dyn Completion>, u64)) -> bool {
        self.vhost.sync(waiter)
    }
}

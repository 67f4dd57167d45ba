//! Direct reply-to (rabbitmq.com/docs/direct-reply-to): replies published to
//! `amq.rabbitmq.reply-to.<token>` go straight to the requester's consumer, without a queue.

use super::VHost;
use crate::message::{Message, QueuedMessage};
use crate::names;
use crate::queue::{DeliveryTarget, Queue};
use std::sync::{Arc, Weak};

/// The pseudo-queue of RabbitMQ's direct reply-to: a requester consumes from it in no-ack
/// mode and publishes with `reply_to` set to it; the broker rewrites `reply_to` to
/// `amq.rabbitmq.reply-to.<token>`, and a reply published to the default exchange with that
/// routing key goes straight to the requester's consumer, without a queue
/// (rabbitmq.com/docs/direct-reply-to).
pub const REPLY_TO: &str = "amq.rabbitmq.reply-to";

pub(super) struct ReplyConsumer {
    pub(super) target: Weak<dyn DeliveryTarget>,
    pub(super) tag: Arc<str>,
}

impl VHost {
    /// The stand-in queue of direct reply-to consumers.
    pub fn reply_queue(&self) -> &Arc<Queue> {
        &self.reply_queue
    }

    /// Registers a direct reply-to consumer; returns the `reply_to` value its requests carry.
    pub fn add_reply_consumer(&self, target: Weak<dyn DeliveryTarget>, tag: Arc<str>) -> String {
        let name = names::generate(&format!("{REPLY_TO}."));
        self.reply_consumers
            .lock()
            .insert(name.clone(), ReplyConsumer { target, tag });
        name
    }

    /// Forgets a direct reply-to consumer (cancelled, or its channel closed).
    pub fn remove_reply_consumer(&self, name: &str) {
        self.reply_consumers.lock().remove(name);
    }

    /// Delivers a reply to its direct reply-to consumer; false when there is none (any
    /// more), in which case the reply is dropped as in RabbitMQ.
    pub(super) fn deliver_reply(&self, msg: Arc<Message>) -> bool {
        let consumer = self
            .reply_consumers
            .lock()
            .get(&msg.routing_key)
            .and_then(|c| Some((c.target.upgrade()?, c.tag.clone())));
        let Some((target, tag)) = consumer else {
            return false;
        };
        let id = self.next_id();
        let qm = QueuedMessage {
            seq: id,
            message: msg,
            redelivered: false,
            stored: None,
            expires_at: None,
        };
        target.deliver(&self.reply_queue, &tag, true, qm).is_ok()
    }
}

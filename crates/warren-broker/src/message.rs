//! Messages as the broker holds them.

use bytes::Bytes;
use std::sync::Arc;
use warren_amqp::properties::BasicProperties;

/// A published message: where it was published to, its basic properties and its body.
///
/// Shared by `Arc` between every queue it was routed to: a fanout to ten queues holds one body.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Exchange name given in basic.publish (`""` for the default exchange).
    pub exchange: String,
    /// Routing key given in basic.publish.
    pub routing_key: String,
    /// The content header's 14 basic properties.
    pub properties: BasicProperties,
    /// The body, assembled from body frames.
    pub body: Bytes,
}

impl Message {
    /// True for `delivery_mode = 2` (persistent).
    pub fn is_persistent(&self) -> bool {
        self.properties.delivery_mode == Some(2)
    }
}

/// A message in a queue: the shared message, its position in the queue and whether it was
/// delivered before.
#[derive(Debug, Clone)]
pub struct QueuedMessage {
    /// Position in the queue, increasing with each enqueue; a requeued message returns to this
    /// position (RabbitMQ keeps the original order on requeue).
    pub seq: u64,
    /// The message itself.
    pub message: Arc<Message>,
    /// Set once the message has been delivered and returned (nack/reject with requeue, channel
    /// close with unacked messages, basic.recover).
    pub redelivered: bool,
    /// Where the message store holds it, for a persistent message in a durable queue.
    pub stored: Option<warren_store::Location>,
}

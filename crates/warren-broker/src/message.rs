//! Messages as the broker holds them.

use bytes::Bytes;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use warren_amqp::properties::BasicProperties;
use warren_store::Completion;

/// A publisher confirm that can be sent before the fsync: once every durable queue a
/// persistent message was routed to has delivered it and had it acknowledged, the message no
/// longer needs to be recoverable, so it is confirmed then (as RabbitMQ does) even if the fsync
/// that covers it has not finished. Whichever comes first, fsync or the last ack, confirms.
pub struct ConfirmTicket {
    remaining: AtomicU32,
    sink: Arc<dyn Completion>,
    token: u64,
}

impl ConfirmTicket {
    /// A ticket waiting for `queues` acknowledgements; completes `token` on `sink`.
    pub fn new(queues: u32, sink: Arc<dyn Completion>, token: u64) -> Self {
        ConfirmTicket {
            remaining: AtomicU32::new(queues),
            sink,
            token,
        }
    }

    /// One durable queue is done with the message (acked, or dropped).
    pub fn settle_one(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.sink.complete(&[self.token], true);
        }
    }
}

impl std::fmt::Debug for ConfirmTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfirmTicket")
            .field("remaining", &self.remaining)
            .field("token", &self.token)
            .finish()
    }
}

impl PartialEq for ConfirmTicket {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

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
    /// The publisher confirm to send early once every durable queue has acked the message.
    pub confirm: OnceLock<Arc<ConfirmTicket>>,
    /// The keys besides `routing_key` the message is routed with (its `CC` and `BCC` header
    /// keys, see [`crate::sender_selected`]), fixed when it is published or dead-lettered.
    /// `None` (a message read back from the store) means: the keys of its `CC` header.
    pub sender_keys: Option<Arc<crate::sender_selected::SenderKeys>>,
    /// The position the (first) queue it was enqueued on gave it
    /// ([`crate::queue::Positions`]): the HTTP queue API's `Pos` of a put.
    pub position: OnceLock<u64>,
    encoded_properties: OnceLock<Bytes>,
}

impl Message {
    /// A message with no confirm attached.
    pub fn new(
        exchange: String,
        routing_key: String,
        properties: BasicProperties,
        body: Bytes,
    ) -> Self {
        Message {
            exchange,
            routing_key,
            properties,
            body,
            confirm: OnceLock::new(),
            sender_keys: None,
            position: OnceLock::new(),
            encoded_properties: OnceLock::new(),
        }
    }

    /// The properties in content-header encoding (flags, then fields), encoded on first use
    /// and shared by every delivery of the message.
    pub fn encoded_properties(&self) -> &Bytes {
        self.encoded_properties.get_or_init(|| {
            let mut buf = bytes::BytesMut::with_capacity(64);
            self.properties.encode(&mut buf);
            buf.freeze()
        })
    }

    /// True for `delivery_mode = 2` (persistent).
    pub fn is_persistent(&self) -> bool {
        self.properties.delivery_mode == Some(2)
    }

    /// The message's `CC` / `BCC` keys: as fixed at publish, or read from its `CC` header.
    pub fn sender_keys(&self) -> crate::sender_selected::SenderKeys {
        match &self.sender_keys {
            Some(k) => (**k).clone(),
            None => {
                crate::sender_selected::SenderKeys::from_headers(self.properties.headers.as_ref())
                    .map(|k| crate::sender_selected::SenderKeys {
                        cc: k.cc,
                        bcc: Vec::new(),
                    })
                    .unwrap_or_default()
            }
        }
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
    /// When the message expires (ms since the epoch, from `x-message-ttl` and the
    /// `expiration` property), if it does.
    pub expires_at: Option<u64>,
}

//! Consuming from a quorum queue on a node that does not lead it.
//!
//! Only the leader hands out messages (it alone knows what is delivered and not yet settled).
//! A member whose node does not lead tells the leader's node which consumers its clients
//! have: it sends the whole list ([`crate::transport::Request::Subscribe`]) whenever it
//! changes, whenever the leader or its term changes and whenever the connection to the
//! leader's node is new. The leader keeps them as consumers of its own, whose deliveries
//! travel back over the inter-node connection ([`Cast::Deliver`]); the member hands each to
//! its client's channel with the message's key as its position, so that the client's ack,
//! nack or reject becomes the same settlement as on the leader (forwarded to it like a
//! publish). basic.get on such a member asks the leader for one message
//! ([`crate::transport::Request::Get`]), and queue.purge asks it to purge.
//!
//! Failures: the leader forgets the consumers of a node whose connection dropped and returns
//! what it had handed to that node (redelivered, `x-delivery-count` raised); a new leader
//! starts with no remote consumers (its [`crate::command::Command::Lead`] returns everything
//! checked out), and each member subscribes again once it sees the new term.

use crate::command::{put_message, read_message, RawBytes};
use bytes::{Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use warren_amqp::table::Decoder;
use warren_broker::Message;

type NodeId = u64;

/// A consumer of a member's client, as the leader's node keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteConsumer {
    /// Its id on the member's node (unique per queue there, never 0).
    pub id: u64,
    /// The client's consumer tag (shown by the leader's node).
    pub tag: String,
    /// basic.consume's no-ack: the leader settles each delivery as it hands it out.
    pub no_ack: bool,
    /// Per-consumer prefetch (0: none), enforced by the leader.
    pub prefetch: u16,
    /// Consumer priority (`x-priority`).
    pub priority: i64,
    /// basic.consume's exclusive: no other consumer may use the queue while it exists.
    pub exclusive: bool,
}

/// One message handed to a remote consumer or a remote basic.get.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoteMessage {
    /// The message's key in the queue (its position in the log's order).
    pub key: u64,
    /// It may have been delivered before.
    pub redelivered: bool,
    /// The message, with `x-delivery-count` when it was returned before.
    pub message: WireMessage,
}

impl RemoteMessage {
    /// The message as the receiving node's queue hands it to a channel: its key as its
    /// position (so that the channel's settlement names it), not stored here.
    pub fn into_queued(self) -> warren_broker::QueuedMessage {
        warren_broker::QueuedMessage {
            seq: self.key,
            message: self.message.0,
            redelivered: self.redelivered,
            stored: None,
            expires_at: None,
        }
    }
}

/// The outcome, to come, of a member change: why not, as text.
pub type MemberChange =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// One-way messages between nodes (no answer).
#[derive(Debug, Serialize, Deserialize)]
pub enum Cast {
    /// A delivery to remote consumer `consumer` of group `group` on the receiving node.
    Deliver {
        /// The group's key.
        group: String,
        /// The Raft term the sender leads in.
        term: u64,
        /// The consumer's id on the receiving node.
        consumer: u64,
        /// The message.
        delivery: RemoteMessage,
    },
    /// Settlements of a classic queue's deliveries to consumer `consumer` (0: basic.get) of
    /// the sending node (see [`crate::proxy`]).
    Settle {
        /// The queue's key.
        group: String,
        /// The consumer's id on the sending node.
        consumer: u64,
        /// (message key, requeue, rejected) each.
        settlements: Vec<(u64, bool, bool)>,
    },
    /// The sending node no longer reaches the queue of group `group` through the receiving
    /// node (its stand-in or member there was deleted or replaced): the receiver forgets its
    /// consumers and returns what it had handed to them, as when the connection drops.
    Leave {
        /// The group's key.
        group: String,
    },
}

/// What the transport calls on a node's member of a group for the requests above.
pub trait GroupServer: Send + Sync + 'static {
    /// Node `peer` has these consumers for the group while this node leads in Raft term
    /// `term`; replaces the list it sent before. Errors: this node does not lead in `term`.
    fn subscribe(
        &self,
        peer: NodeId,
        term: u64,
        consumers: Vec<RemoteConsumer>,
    ) -> Result<(), String>;
    /// A delivery from node `peer`, leading in `term`, for this node's consumer `consumer`.
    fn deliver(&self, peer: NodeId, term: u64, consumer: u64, delivery: RemoteMessage);
    /// basic.get for a client of node `peer`: one message and the number of ready messages
    /// left, or none. Errors: this node does not lead.
    fn get(&self, peer: NodeId, no_ack: bool) -> Result<Option<(RemoteMessage, u32)>, String>;
    /// queue.purge for a client of another node: the number of ready messages dropped.
    /// Errors: this node does not lead.
    fn purge(&self) -> Result<u32, String>;
    /// May a client of another node add a consumer (`exclusive` or not) now, given every
    /// consumer of the queue, on any node? Errors: the queue is in exclusive use (or would
    /// be: an exclusive consumer while there are others), or this node does not lead.
    fn check_consume(&self, exclusive: bool) -> Result<(), String>;
    /// The connection to node `peer` dropped: its consumers are gone, and what was handed to
    /// them comes back.
    fn peer_lost(&self, peer: NodeId);
    /// Adds (`add`) or removes the member on node `node`, this node leading (see
    /// `QuorumQueue::change_member`). Errors: why not, as text.
    fn change_member(&self, node: NodeId, add: bool) -> MemberChange;
    /// Whether proposals this node committed as leader may be answered now: a quorum queue
    /// whose leadership has just begun holds them until it can hand out its head (see
    /// `QuorumQueue::ready_to_hand_out`).
    fn ready_to_hand_out(&self) -> bool {
        true
    }
}

/// A message on the wire, in the log's encoding (see [`crate::command`]).
#[derive(Debug, Clone)]
pub struct WireMessage(pub Arc<Message>);

impl Serialize for WireMessage {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut b = BytesMut::new();
        put_message(&mut b, &self.0);
        s.serialize_bytes(&b)
    }
}

impl<'de> Deserialize<'de> for WireMessage {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw: RawBytes = Deserialize::deserialize(d)?;
        let payload = Bytes::from(raw.0);
        let mut dec = Decoder::new(&payload);
        read_message(&mut dec, &payload)
            .map(WireMessage)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_amqp::properties::BasicProperties;

    #[test]
    fn deliveries_round_trip() {
        let m = Arc::new(Message::new(
            "".into(),
            "q".into(),
            BasicProperties {
                delivery_mode: Some(2),
                ..Default::default()
            },
            Bytes::from_static(b"body"),
        ));
        let c = Cast::Deliver {
            group: "/\u{1f}q".into(),
            term: 3,
            consumer: 7,
            delivery: RemoteMessage {
                key: 42,
                redelivered: true,
                message: WireMessage(m),
            },
        };
        let raw = postcard::to_allocvec(&c).unwrap();
        let Cast::Deliver {
            group,
            term,
            consumer,
            delivery,
        } = postcard::from_bytes(&raw).unwrap()
        else {
            panic!("not a delivery")
        };
        assert_eq!((group.as_str(), term, consumer), ("/\u{1f}q", 3, 7));
        assert_eq!((delivery.key, delivery.redelivered), (42, true));
        assert_eq!(&delivery.message.0.body[..], b"body");
        assert_eq!(delivery.message.0.properties.delivery_mode, Some(2));
    }
}

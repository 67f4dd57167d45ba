//! Replicated metadata: the hook through which a clustered broker hands its metadata changes
//! to the cluster's metadata group, and the entry points through which the group applies
//! the changes other nodes made.
//!
//! Two kinds of change are replicated, as plain data that every node applies the same way:
//! - the durable topology changes of a vhost ([`TopologyCommand`]s: exchanges, bindings,
//!   policies, classic queues' declares and every queue's delete), the very records the
//!   vhost writes to its definitions log ([`crate::vhost::log`]), already decided (cascades
//!   listed);
//! - the whole access-control database (users, vhosts, permissions, limits, global
//!   parameters) as stored in `access.json` after a change (see [`crate::ops::admin`]).
//!
//! Queues are not copied: a quorum queue's members are declared on their nodes by the queue's
//! own group, and a classic queue lives on the node that declared it; the other nodes put a
//! stand-in under its name that reaches it ([`crate::VHost::put_remote_queue`]).
//!
//! A broker without a replicator (alone, not in a cluster) behaves as before.

use crate::vhost::log::TopologyCommand;
use std::sync::{Arc, OnceLock};

/// Called once a replicated change is committed in the cluster (`Ok`), or with the reason it
/// could not be (no majority within the wait).
pub type Done = Box<dyn FnOnce(Result<(), String>) + Send>;

/// Where a broker sends its metadata changes to be replicated (the cluster's metadata group).
/// Calls return at once; `done` learns the outcome.
pub trait MetadataReplicator: Send + Sync {
    /// `commands`, a durable topology change just made in `vhost` on this node (the records
    /// of [`crate::vhost::log`], in the order they were made).
    fn topology(&self, vhost: &str, commands: Vec<TopologyCommand>, done: Done);
    /// The access-control database just changed on this node: `json` is all of it, as
    /// stored in `access.json`.
    fn access(&self, json: String, done: Done);
}

/// The broker's replicator, set once when the node joins its cluster, and shared with every
/// vhost.
pub type ReplicatorSlot = Arc<OnceLock<Arc<dyn MetadataReplicator>>>;

/// Whether a replicated topology command is applied by [`crate::VHost::apply_replicated`]:
/// queues are not (the metadata group puts and removes the queues that live on other nodes,
/// see [`crate::VHost::put_remote_queue`]), and a binding to a queue only where that queue
/// exists.
pub(crate) fn replicated_kind(c: &TopologyCommand) -> bool {
    !matches!(
        c,
        TopologyCommand::PutQueue { .. } | TopologyCommand::RemoveQueue { .. }
    )
}

/// Whether a durable topology command is handed to the cluster: everything but the queues
/// of a kind that replicates itself (quorum queues start their members on other nodes).
pub(crate) fn sent_to_cluster(c: &TopologyCommand) -> bool {
    match c {
        TopologyCommand::PutQueue { arguments, .. } => {
            crate::queue::queue_type(arguments).is_none_or(|t| t == "classic")
        }
        _ => true,
    }
}

//! Warren's quorum queues (`x-queue-type: quorum`): queues replicated with Raft, as
//! RabbitMQ's quorum queues are with Ra.
//!
//! Each quorum queue is one Raft group ([openraft](https://docs.rs/openraft) 0.9) whose
//! members are the nodes that hold a replica; without a cluster the group has this node
//! alone, so that applications can declare quorum queues in development. A publish is
//! confirmed once the entry holding it is committed, i.e. on disk on a majority of members;
//! acks, returns and deliveries are entries too, so a member that takes over as leader holds
//! exactly what its predecessor had committed.
//!
//! The log of every group of a node goes to one shared log in Warren's store
//! (`warren_store::raftlog`: segments, CRC-framed records, group commit on a writer thread),
//! so that many queues share each fsync, as RabbitMQ's Ra shares one write-ahead log per node.
//!
//! In a cluster ([`QuorumNode::clustered`]) a queue's group has members on several nodes: the
//! declaring node asks the others to start their member, then initializes the group; the
//! groups of all queues reach the other nodes over one authenticated connection per node pair
//! ([`transport`]). Members that do not lead forward their clients' publishes to the leader,
//! and their clients consume through the leader ([`remote`]).
//!
//! Modules: [`command`] (log entry payloads and their encoding), [`state`] (the replicated,
//! deterministic queue state), [`storage`] (openraft's log storage on the shared log),
//! [`machine`] (openraft's state machine and snapshots), [`queue`] (the `QueueBackend` the
//! broker uses: proposing, delivering, settling), [`kind`] (declare rules and refusals),
//! [`node`] (the node's quorum service), [`network`] (how groups reach other nodes: openraft's
//! network over [`transport`], the authenticated inter-node connections), [`metadata`] (the
//! cluster's replicated metadata group).

pub mod command;
pub mod kind;
pub mod machine;
pub mod metadata;
pub mod network;
pub mod node;
pub mod proxy;
pub mod queue;
pub mod remote;
pub mod state;
pub mod storage;
pub mod transport;

pub use kind::QuorumKind;
pub use metadata::MetadataGroup;
pub use node::{QuorumConfig, QuorumNode};
pub use queue::QuorumQueue;
pub use transport::{Cluster, ClusterSettings, MemberHost};

openraft::declare_raft_types!(
    /// The Raft types of a quorum queue's group.
    pub TypeConfig:
        D = command::Batch,
        R = (),
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

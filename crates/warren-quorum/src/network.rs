//! How a queue's Raft group reaches the other members of the group. Without a cluster a group
//! has one member and never sends anything: every call fails as unreachable.

use crate::TypeConfig;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use std::sync::Arc;

type NodeId = u64;
type RpcError<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

/// The node's connections to the other nodes (none without a cluster).
#[derive(Clone, Default)]
pub struct Network {}

/// The network of one group.
#[derive(Clone)]
pub struct GroupNetwork {
    pub(crate) group: Arc<str>,
    pub(crate) network: Network,
}

/// A group's link to one other member.
pub struct Link {
    target: NodeId,
}

fn unreachable(target: NodeId) -> Unreachable {
    Unreachable::new(&std::io::Error::other(format!(
        "node {target} is not reachable: this node is not in a cluster"
    )))
}

impl RaftNetworkFactory<TypeConfig> for GroupNetwork {
    type Network = Link;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Link {
        let _ = (&self.group, &self.network);
        Link { target }
    }
}

impl RaftNetwork<TypeConfig> for Link {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        Err(RPCError::Unreachable(unreachable(self.target)))
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcError<InstallSnapshotError>> {
        Err(RPCError::Unreachable(unreachable(self.target)))
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        Err(RPCError::Unreachable(unreachable(self.target)))
    }
}

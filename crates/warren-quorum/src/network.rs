//! How a queue's Raft group reaches the other members of the group: openraft's
//! `RaftNetworkFactory` / `RaftNetwork` over the node's cluster transport
//! ([`crate::transport`]), one connection per pair of nodes shared by every group.
//!
//! Without a cluster a group has one member and never sends anything: every call fails as
//! unreachable.

use crate::transport::{CallError, Cluster, Request, Response};
use crate::TypeConfig;
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use std::sync::Arc;
use std::time::Duration;

type NodeId = u64;
type RpcError<E = openraft::error::Infallible> = RPCError<NodeId, BasicNode, RaftError<NodeId, E>>;

/// The node's way to the other nodes: the cluster transport, or none on a node alone.
#[derive(Clone, Default, Debug)]
pub struct Network {
    cluster: Option<Arc<Cluster>>,
}

impl Network {
    /// The network of a node in `cluster`.
    pub fn clustered(cluster: Arc<Cluster>) -> Network {
        Network {
            cluster: Some(cluster),
        }
    }

    /// The cluster transport, when the node is in a cluster.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }
}

/// The network of one group.
#[derive(Clone)]
pub struct GroupNetwork {
    pub(crate) group: Arc<str>,
    pub(crate) network: Network,
}

/// A group's link to one other member.
pub struct Link {
    target: NodeId,
    /// Entries of the append-entries request being sent (for a too-large one's hint).
    entries: u64,
    group: Arc<str>,
    cluster: Option<Arc<Cluster>>,
}

fn unreachable(target: NodeId, why: &str) -> Unreachable {
    Unreachable::new(&std::io::Error::other(format!(
        "node {target} is not reachable: {why}"
    )))
}

impl RaftNetworkFactory<TypeConfig> for GroupNetwork {
    type Network = Link;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Link {
        Link {
            target,
            entries: 0,
            group: self.group.clone(),
            cluster: self.network.cluster.clone(),
        }
    }
}

impl Link {
    /// Sends `req` within the RPC's time limit; a missing connection fails at once (openraft
    /// backs off and retries), a group the target does not have yet fails as a network error.
    async fn call<E>(
        &self,
        req: Request,
        option: &RPCOption,
    ) -> Result<Response, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>
    where
        E: std::error::Error,
    {
        let Some(cluster) = &self.cluster else {
            return Err(RPCError::Unreachable(unreachable(
                self.target,
                "this node is not in a cluster",
            )));
        };
        match cluster
            .call(self.target, req, Duration::ZERO, option.hard_ttl())
            .await
        {
            Ok(Response::NoGroup) => Err(RPCError::Network(NetworkError::new(
                &std::io::Error::other(format!(
                    "node {} has no member of this queue (yet)",
                    self.target
                )),
            ))),
            Ok(r) => Ok(r),
            Err(CallError::TooLarge(..)) if self.entries > 1 => Err(RPCError::PayloadTooLarge(
                PayloadTooLarge::new_entries_hint(self.entries / 2),
            )),
            Err(e @ CallError::Unreachable(_)) => Err(RPCError::Unreachable(unreachable(
                self.target,
                &e.to_string(),
            ))),
            Err(e) => Err(RPCError::Network(NetworkError::new(&e))),
        }
    }

    fn unexpected<E: std::error::Error>(
        &self,
    ) -> RPCError<NodeId, BasicNode, RaftError<NodeId, E>> {
        RPCError::Network(NetworkError::new(&std::io::Error::other(format!(
            "node {} answered with another kind of response",
            self.target
        ))))
    }
}

impl RaftNetwork<TypeConfig> for Link {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        self.entries = rpc.entries.len() as u64;
        let req = Request::AppendEntries {
            group: self.group.to_string(),
            rpc,
        };
        let answer = self.call(req, &option).await;
        self.entries = 0;
        match answer? {
            Response::AppendEntries(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(self.unexpected()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcError<InstallSnapshotError>> {
        let req = Request::InstallSnapshot {
            group: self.group.to_string(),
            rpc,
        };
        match self.call(req, &option).await? {
            Response::InstallSnapshot(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(self.unexpected()),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcError> {
        let req = Request::Vote {
            group: self.group.to_string(),
            rpc,
        };
        match self.call(req, &option).await? {
            Response::Vote(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(self.unexpected()),
        }
    }
}

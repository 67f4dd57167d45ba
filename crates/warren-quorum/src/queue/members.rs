//! A quorum queue's replica set: where its members are (the management API's `leader`,
//! `members` and `online`), and adding or removing a member on a node of the cluster
//! (RabbitMQ's `rabbitmq-queues add_member` / `delete_member`, and the management API's
//! `/api/queues/quorum/{vhost}/{name}/replicas/add|delete`).
//!
//! A change is made by the leader: adding starts the new node's member (as at declare),
//! makes it a learner that catches up from the leader's log (or a snapshot), then a voter;
//! removing takes the node out of the voters, then deletes its member. A member that does
//! not lead forwards the request to the leader's node.

use super::*;
use std::collections::BTreeSet;
use std::time::Duration;
use warren_broker::Replicas;

/// How long the new member's node may take to start it.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a change forwarded to the leader's node may take (a new member catches up
/// before it votes).
pub(crate) const CHANGE_TIMEOUT: Duration = Duration::from_secs(120);

impl QuorumQueue {
    /// Where the queue's members are now, as this member sees them.
    pub(crate) fn replicas_now(&self) -> Replicas {
        let me = self.node.cfg.node_id;
        let Some(raft) = self.raft.get() else {
            return Replicas {
                leader: None,
                members: vec![me],
                online: vec![me],
            };
        };
        let (leader, members): (Option<NodeId>, Vec<NodeId>) = {
            let m = raft.metrics();
            let m = m.borrow();
            (
                m.current_leader,
                m.membership_config.membership().voter_ids().collect(),
            )
        };
        let up = self
            .node
            .cluster()
            .map(|c| c.connected())
            .unwrap_or_default();
        let online = members
            .iter()
            .copied()
            .filter(|id| *id == me || up.contains(id))
            .collect();
        Replicas {
            leader,
            members,
            online,
        }
    }

    /// This member's Raft instance and the cluster. Errors: the queue is starting, or the
    /// node runs alone.
    fn raft_and_cluster(
        &self,
    ) -> std::result::Result<(Raft<TypeConfig>, Arc<crate::transport::Cluster>), String> {
        let raft = self.raft.get().cloned().ok_or("the queue is starting")?;
        let cluster = self
            .node
            .cluster()
            .cloned()
            .ok_or("this node is not in a cluster")?;
        Ok((raft, cluster))
    }

    /// Adds (`add`) or removes a member on node `node`: here when this member leads, else
    /// at the leader's node. Errors: why not, as text (not a node of the cluster, a member
    /// already or not one, the last member, no leader, the node did not answer).
    pub async fn change_member(
        self: Arc<Self>,
        node: NodeId,
        add: bool,
    ) -> std::result::Result<(), String> {
        let (raft, cluster) = self.raft_and_cluster()?;
        let me = self.node.cfg.node_id;
        // A leader that just changed may not be known everywhere yet: asked again a few
        // times when the node taken for the leader does not have the group.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let leader = raft
                .wait(Some(LEADER_WAIT))
                .metrics(|m| m.current_leader.is_some(), "a leader")
                .await
                .ok()
                .and_then(|m| m.current_leader)
                .ok_or("the queue has no leader")?;
            if leader == me {
                return self.change_member_here(node, add).await;
            }
            let req = Request::ChangeMember {
                group: self.key.clone(),
                node,
                add,
            };
            match cluster
                .call(leader, req, Duration::ZERO, CHANGE_TIMEOUT)
                .await
            {
                Ok(Response::Done(r)) => return r,
                Ok(Response::NoGroup) if attempts < 5 => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Ok(Response::NoGroup) => {
                    return Err(format!("node {leader} does not have the queue"))
                }
                Ok(other) => {
                    return Err(format!("unexpected answer from node {leader}: {other:?}"))
                }
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// [`Self::change_member`] on the leader.
    pub(crate) async fn change_member_here(
        self: Arc<Self>,
        node: NodeId,
        add: bool,
    ) -> std::result::Result<(), String> {
        let (raft, cluster) = self.raft_and_cluster()?;
        // A member is removed even from a node the cluster no longer lists (one removed
        // from the cluster); a member is added only on a node it lists.
        let addr = self.node.members.lock().get(&node).cloned();
        let addr = match addr {
            Some(a) => a,
            None if !add => String::new(),
            None => return Err(format!("node {node} is not a node of the cluster")),
        };
        let voters: BTreeSet<NodeId> = raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        let (vhost, name) = (self.vhost.to_string(), self.name.to_string());
        if add {
            if voters.contains(&node) {
                return Err(format!("node {node} holds a member already"));
            }
            let mut encoded = bytes::BytesMut::new();
            warren_amqp::table::encode_table(&self.arguments, &mut encoded);
            let req = Request::StartMember {
                vhost: vhost.clone(),
                name: name.clone(),
                arguments: encoded.to_vec(),
            };
            match cluster
                .call(node, req, START_TIMEOUT / 2, START_TIMEOUT)
                .await
            {
                Ok(Response::Started(Ok(true))) => {}
                Ok(Response::Started(Ok(false))) => {
                    return Err(format!("node {node} has a queue of this name already"))
                }
                Ok(Response::Started(Err(e))) => return Err(format!("node {node} refused: {e}")),
                Ok(other) => return Err(format!("unexpected answer from node {node}: {other:?}")),
                Err(e) => return Err(e.to_string()),
            }
            let joined = async {
                raft.add_learner(node, BasicNode::new(&addr), true)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut v = voters;
                v.insert(node);
                raft.change_membership(v, false)
                    .await
                    .map_err(|e| e.to_string())
            }
            .await;
            if let Err(e) = joined {
                // The new member is not part of the group: it goes again (and the node
                // reaches the queue through the members, as before).
                let req = Request::DeleteMember {
                    vhost,
                    name,
                    stays: true,
                };
                let _ = cluster
                    .call(node, req, START_TIMEOUT / 2, START_TIMEOUT)
                    .await;
                return Err(e);
            }
            info!(queue = %self.name, vhost = %self.vhost, node, "quorum queue member added");
        } else {
            if !voters.contains(&node) {
                return Err(format!("node {node} holds no member"));
            }
            if voters.len() == 1 {
                return Err("the last member of a queue cannot be removed".into());
            }
            let mut v = voters;
            v.remove(&node);
            raft.change_membership(v, false)
                .await
                .map_err(|e| e.to_string())?;
            info!(queue = %self.name, vhost = %self.vhost, node, "quorum queue member removed");
            let deleted = if node == self.node.cfg.node_id {
                cluster.delete_member_here(vhost, name, true).await
            } else {
                let req = Request::DeleteMember {
                    vhost,
                    name,
                    stays: true,
                };
                match cluster
                    .call(node, req, START_TIMEOUT / 2, START_TIMEOUT)
                    .await
                {
                    Ok(Response::Done(r)) => r,
                    Ok(other) => Err(format!("unexpected answer: {other:?}")),
                    Err(e) => Err(e.to_string()),
                }
            };
            if let Err(e) = deleted {
                // Out of the group already; its queue stays on that node until deleted there.
                warn!(queue = %self.name, vhost = %self.vhost, node, error = %e, "removed member's queue not deleted on its node");
            }
        }
        Ok(())
    }
}

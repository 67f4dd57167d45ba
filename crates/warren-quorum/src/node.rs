//! The quorum side of one node: the shared Raft log every queue's group writes to, the
//! groups recovered from it, the Raft settings and the network the groups talk over.

use crate::network::Network;
use crate::transport::{Cluster, ClusterSettings, MemberHost, Request, Response};
use openraft::BasicNode;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;
use tracing::{info, warn};
use warren_amqp::table::FieldTable;
use warren_store::raftlog::{GroupLog, RaftLog, RaftLogConfig};

/// The key of a queue's group: vhost and name joined by U+001F (the shared log's group id,
/// and the group's name on the wire).
pub fn group_key(vhost: &str, name: &str) -> String {
    format!("{vhost}\u{1f}{name}")
}

/// How long a declare waits for a peer to start its member of the new group.
const START_MEMBER_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of a node's quorum queues.
#[derive(Debug, Clone)]
pub struct QuorumConfig {
    /// Where the shared log (`log/`) and the snapshots (`snapshots/`) live.
    pub dir: PathBuf,
    /// This node's id (1 on a broker without a cluster).
    pub node_id: u64,
    /// Raft heartbeat interval of the queue groups.
    pub heartbeat: Duration,
    /// Election timeout range: a follower that hears nothing from its leader for a random
    /// time in this range starts an election.
    pub election_timeout: (Duration, Duration),
    /// A group snapshots its state after this many log entries, then purges them.
    pub snapshot_every: u64,
    /// Entries kept in the log behind a snapshot, for followers that lag a little (they
    /// get the snapshot otherwise).
    pub kept_after_snapshot: u64,
}

impl QuorumConfig {
    /// Defaults for `dir`: node 1, 200 ms heartbeats, elections after 1-2 s of silence,
    /// snapshots every 4096 entries, 256 entries kept behind a snapshot.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        QuorumConfig {
            dir: dir.into(),
            node_id: 1,
            heartbeat: Duration::from_millis(200),
            election_timeout: (Duration::from_millis(1000), Duration::from_millis(2000)),
            snapshot_every: 4096,
            kept_after_snapshot: 256,
        }
    }
}

/// A node's quorum service: opened lazily, when the first quorum queue is built (which happens
/// with the data directory locked, during the broker's recovery or a declare).
pub struct QuorumNode {
    pub(crate) cfg: QuorumConfig,
    pub(crate) runtime: tokio::runtime::Handle,
    log: OnceLock<Result<RaftLog, String>>,
    recovered: Mutex<HashMap<String, GroupLog>>,
    /// Groups being shut down and dropped: a queue of the same name waits for it.
    dropping: Mutex<HashMap<String, watch::Receiver<bool>>>,
    pub(crate) network: Network,
    /// The nodes a new queue's group may have members on (node id -> inter-node address):
    /// every node of the cluster, or this node alone without one.
    pub(crate) members: Mutex<BTreeMap<u64, String>>,
    /// This node's quorum queues by group key.
    queues: Mutex<HashMap<String, std::sync::Weak<crate::QuorumQueue>>>,
}

impl std::fmt::Debug for QuorumNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuorumNode")
            .field("node_id", &self.cfg.node_id)
            .finish()
    }
}

impl QuorumNode {
    /// A node's quorum service on `runtime` (where the Raft groups run).
    pub fn new(cfg: QuorumConfig, runtime: tokio::runtime::Handle) -> Arc<QuorumNode> {
        let mut members = BTreeMap::new();
        members.insert(cfg.node_id, String::new());
        Self::build(cfg, runtime, Network::default(), members)
    }

    /// A node's quorum service in a cluster: starts the inter-node transport on `listener`
    /// (bound to `[cluster] listen`); `cfg.node_id` becomes `settings.node_id`. New quorum
    /// queues get members on the other nodes of `settings.nodes`.
    ///
    /// Errors: the listener cannot be handed to the runtime.
    pub fn clustered(
        mut cfg: QuorumConfig,
        runtime: tokio::runtime::Handle,
        settings: ClusterSettings,
        listener: std::net::TcpListener,
    ) -> std::io::Result<Arc<QuorumNode>> {
        cfg.node_id = settings.node_id;
        let members = settings.nodes.clone();
        let cluster = {
            let _enter = runtime.enter();
            Cluster::start(settings, listener)?
        };
        Ok(Self::build(
            cfg,
            runtime,
            Network::clustered(cluster),
            members,
        ))
    }

    fn build(
        cfg: QuorumConfig,
        runtime: tokio::runtime::Handle,
        network: Network,
        members: BTreeMap<u64, String>,
    ) -> Arc<QuorumNode> {
        Arc::new(QuorumNode {
            cfg,
            runtime,
            log: OnceLock::new(),
            recovered: Mutex::new(HashMap::new()),
            dropping: Mutex::new(HashMap::new()),
            network,
            members: Mutex::new(members),
            queues: Mutex::new(HashMap::new()),
        })
    }

    /// The cluster transport, when this node is in a cluster.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.network.cluster()
    }

    /// Makes `nodes` the cluster's nodes (see [`Cluster::set_nodes`]): where the transport
    /// connects and where new quorum queues get members.
    pub(crate) fn set_cluster_nodes(&self, nodes: BTreeMap<u64, String>) {
        let Some(c) = self.cluster() else {
            return;
        };
        c.set_nodes(nodes);
        *self.members.lock() = c.nodes();
    }

    /// Sets what declares and deletes this node's members of groups other nodes create
    /// (does nothing without a cluster).
    pub fn set_member_host(&self, host: Arc<dyn MemberHost>) {
        if let Some(c) = self.cluster() {
            c.set_host(host);
        }
    }

    /// The members of a new group for queue `name` of `vhost`: this node and up to
    /// `size - 1` other nodes that started their member when asked (tried in id order from
    /// the one after this node, so that queues declared on different nodes spread). A node
    /// that is down or refuses is passed over; without a cluster, this node alone.
    ///
    /// None when a node has the queue already: its group was created before (declared on
    /// another node while this one was down, or at the same time) and this node's member
    /// must not start a second group of the same name.
    pub(crate) async fn place_members(
        &self,
        vhost: &str,
        name: &str,
        arguments: &FieldTable,
        size: usize,
    ) -> Option<BTreeMap<u64, BasicNode>> {
        let me = self.cfg.node_id;
        let all = self.members.lock().clone();
        let mut placed: BTreeMap<u64, BasicNode> = all
            .get(&me)
            .map(|addr| (me, BasicNode::new(addr)))
            .into_iter()
            .collect();
        let Some(cluster) = self.cluster().cloned() else {
            return Some(placed);
        };
        let mut existing = None;
        let mut encoded = bytes::BytesMut::new();
        warren_amqp::table::encode_table(arguments, &mut encoded);
        let encoded = encoded.to_vec();
        let mut candidates: Vec<u64> = all
            .range(me + 1..)
            .chain(all.range(..me))
            .map(|(id, _)| *id)
            .collect();
        candidates.reverse();
        while placed.len() < size && !candidates.is_empty() {
            let mut asks = tokio::task::JoinSet::new();
            for _ in placed.len()..size {
                let Some(peer) = candidates.pop() else { break };
                let req = Request::StartMember {
                    vhost: vhost.to_string(),
                    name: name.to_string(),
                    arguments: encoded.clone(),
                };
                let c = cluster.clone();
                asks.spawn(async move {
                    let r = c
                        .call(peer, req, START_MEMBER_TIMEOUT / 2, START_MEMBER_TIMEOUT)
                        .await;
                    (peer, r)
                });
            }
            while let Some(done) = asks.join_next().await {
                let Ok((peer, r)) = done else { continue };
                match r {
                    Ok(Response::Started(Ok(true))) => {
                        placed.insert(peer, BasicNode::new(&all[&peer]));
                    }
                    Ok(Response::Started(Ok(false))) => existing = Some(peer),
                    Ok(Response::Started(Err(e))) => {
                        warn!(queue = %name, vhost = %vhost, node = peer, error = %e, "node refused a member of a new quorum queue");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        warn!(queue = %name, vhost = %vhost, node = peer, error = %e, "no member of a new quorum queue on a node that is not reachable");
                    }
                }
            }
        }
        if let Some(peer) = existing {
            warn!(queue = %name, vhost = %vhost, node = peer, "quorum queue exists on another node already: no new group is created here (use the queue on its members)");
            return None;
        }
        Some(placed)
    }

    /// Asks `members` (other nodes) to delete their member of queue `name` of `vhost`, in the
    /// background, once each.
    pub(crate) fn delete_members(&self, vhost: &str, name: &str, members: Vec<u64>) {
        let Some(cluster) = self.cluster().cloned() else {
            return;
        };
        for peer in members {
            let c = cluster.clone();
            let req = Request::DeleteMember {
                vhost: vhost.to_string(),
                name: name.to_string(),
                stays: false,
            };
            let (vhost, name) = (vhost.to_string(), name.to_string());
            self.runtime.spawn(async move {
                match c.call(peer, req, START_MEMBER_TIMEOUT / 2, START_MEMBER_TIMEOUT).await {
                    Ok(Response::Done(Ok(()))) => {}
                    Ok(Response::Done(Err(e))) => {
                        warn!(queue = %name, vhost = %vhost, node = peer, error = %e, "node did not delete its member of a quorum queue");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        warn!(queue = %name, vhost = %vhost, node = peer, error = %e, "member of a deleted quorum queue left on a node that is not reachable");
                    }
                }
            });
        }
    }

    /// Notes queue `q` (group `key`) as this node's member of that group.
    pub(crate) fn register_queue(&self, key: &str, q: &Arc<crate::QuorumQueue>) {
        self.queues
            .lock()
            .insert(key.to_string(), Arc::downgrade(q));
    }

    /// Forgets queue `q` of group `key` (unless another queue took the key since).
    pub(crate) fn unregister_queue(&self, key: &str, q: *const crate::QuorumQueue) {
        let mut queues = self.queues.lock();
        if queues.get(key).is_some_and(|w| w.as_ptr() == q) {
            queues.remove(key);
        }
    }

    /// Adds (`add`) or removes the member on node `node` of quorum queue `name` of `vhost`
    /// (see [`crate::QuorumQueue::change_member`]), through a node that holds a member when
    /// this one does not. Errors: why not, as text; no member of the queue on this node nor
    /// on a node it is connected to.
    pub async fn change_member(
        &self,
        vhost: &str,
        name: &str,
        node: u64,
        add: bool,
    ) -> Result<(), String> {
        let key = group_key(vhost, name);
        let q = self
            .queues
            .lock()
            .get(&key)
            .and_then(std::sync::Weak::upgrade);
        if let Some(q) = q {
            return q.change_member(node, add).await;
        }
        let missing = || format!("no quorum queue '{name}' in vhost '{vhost}' on this node");
        let cluster = self.cluster().ok_or_else(missing)?;
        for peer in cluster.connected() {
            let req = Request::ChangeMember {
                group: key.clone(),
                node,
                add,
            };
            let timeout = crate::queue::members::CHANGE_TIMEOUT;
            match cluster.call(peer, req, Duration::ZERO, timeout).await {
                Ok(Response::Done(r)) => return r,
                Ok(_) => continue,
                Err(e) => warn!(peer, error = %e, "member change not asked of a node"),
            }
        }
        Err(format!(
            "no member of quorum queue '{name}' in vhost '{vhost}' on this node or on a node \
             it is connected to"
        ))
    }

    /// Adds node `id` at inter-node address `address` to the running cluster (`Some`), or
    /// removes it (`None`, as RabbitMQ's `forget_cluster_node`: the node should be stopped
    /// first). See [`crate::MetadataGroup::change_node`]. A removed node's members of the
    /// quorum queues that have a member on this node are removed too.
    ///
    /// Errors: not in a cluster; the metadata group's refusal, as text.
    pub async fn change_node(&self, id: u64, address: Option<String>) -> Result<(), String> {
        let c = self.cluster().ok_or("this node is not in a cluster")?;
        let g = c
            .metadata_group()
            .ok_or("the cluster's metadata group is starting")?;
        let remove = address.is_none();
        g.change_node(id, address).await?;
        if remove {
            for q in self.live_queues() {
                if q.replicas_now().members.contains(&id) {
                    if let Err(e) = q.change_member(id, false).await {
                        warn!(node = id, error = %e, "a removed node's quorum queue member stays");
                    }
                }
            }
        }
        Ok(())
    }

    /// This node's quorum queues (members) that are still there.
    fn live_queues(&self) -> Vec<Arc<crate::QuorumQueue>> {
        self.queues
            .lock()
            .values()
            .filter_map(std::sync::Weak::upgrade)
            .collect()
    }

    /// How many of the quorum queues with a member on this node each node leads now.
    pub(crate) fn leader_counts(&self) -> HashMap<u64, usize> {
        let mut counts = HashMap::new();
        for q in self.live_queues() {
            if let Some(leader) = q.raft().and_then(|r| r.metrics().borrow().current_leader) {
                *counts.entry(leader).or_insert(0) += 1;
            }
        }
        counts
    }

    /// Asks node `peer` to initialize group `key` with `members` (so that its member wins the
    /// first election), trying for up to [`START_MEMBER_TIMEOUT`] while that member is still
    /// starting. False when it did not.
    pub(crate) async fn initialize_on(
        &self,
        peer: u64,
        key: &str,
        members: &BTreeMap<u64, BasicNode>,
    ) -> bool {
        let Some(cluster) = self.cluster().cloned() else {
            return false;
        };
        let deadline = tokio::time::Instant::now() + START_MEMBER_TIMEOUT;
        loop {
            let req = Request::Initialize {
                group: key.to_string(),
                members: members
                    .iter()
                    .map(|(id, n)| (*id, n.addr.clone()))
                    .collect(),
            };
            match cluster
                .call(peer, req, START_MEMBER_TIMEOUT / 2, START_MEMBER_TIMEOUT)
                .await
            {
                Ok(Response::Done(Ok(()))) => return true,
                Ok(Response::NoGroup) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => {
                    warn!(group = %key.replace('\u{1f}', "/"), node = peer, answer = ?other, "quorum queue not initialized on the node chosen to lead it; this node leads");
                    return false;
                }
            }
        }
    }

    /// The shared log, opened (and recovered) on first use.
    pub(crate) fn log(&self) -> Result<RaftLog, String> {
        self.log
            .get_or_init(|| {
                let dir = self.cfg.dir.join("log");
                match RaftLog::open(RaftLogConfig::new(&dir)) {
                    Ok((log, groups)) => {
                        if !groups.is_empty() {
                            info!(groups = groups.len(), dir = %dir.display(), "quorum queue log recovered");
                        }
                        *self.recovered.lock() = groups;
                        Ok(log)
                    }
                    Err(e) => Err(format!("cannot open the quorum queue log in {}: {e}", dir.display())),
                }
            })
            .clone()
    }

    /// What recovery found of group `key` (empty for a new group).
    pub(crate) fn take_recovered(&self, key: &str) -> GroupLog {
        // Opening the log fills `recovered` (an error shows when the group starts).
        let _ = self.log();
        self.recovered.lock().remove(key).unwrap_or_default()
    }

    /// Drops the groups recovered from the log that no queue claimed (their queue was
    /// deleted before the deletion reached the log). Call once the broker has recovered.
    pub fn finish_recovery(&self) {
        let Ok(log) = self.log() else { return };
        let orphans: Vec<String> = self.recovered.lock().drain().map(|(k, _)| k).collect();
        for key in orphans {
            warn!(group = %key.replace('\u{1f}', "/"), "quorum queue log of a queue that no longer exists dropped");
            log.drop_group(&key, None);
            let _ = std::fs::remove_file(self.snapshot_path(&key));
        }
    }

    /// Where group `key` keeps its snapshot.
    pub(crate) fn snapshot_path(&self, key: &str) -> PathBuf {
        let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
        self.cfg.dir.join("snapshots").join(format!("{hex}.snap"))
    }

    /// Marks group `key` as being dropped; returns the sender to signal when it is done.
    pub(crate) fn begin_drop(&self, key: &str) -> watch::Sender<bool> {
        let (tx, rx) = watch::channel(false);
        self.dropping.lock().insert(key.to_string(), rx);
        tx
    }

    /// The drop of group `key` in progress, if any: true is sent on it once it is done.
    pub(crate) fn drop_in_progress(&self, key: &str) -> Option<watch::Receiver<bool>> {
        self.dropping.lock().get(key).cloned()
    }

    /// A drop of group `key` finished (a later drop of the same key stays registered).
    pub(crate) fn end_drop(&self, key: &str, tx: watch::Sender<bool>) {
        {
            let mut dropping = self.dropping.lock();
            if dropping
                .get(key)
                .is_some_and(|rx| rx.same_channel(&tx.subscribe()))
            {
                dropping.remove(key);
            }
        }
        let _ = tx.send(true);
    }

    /// The Raft settings of a queue group.
    pub(crate) fn raft_config(&self) -> Arc<openraft::Config> {
        let cfg = openraft::Config {
            cluster_name: "warren-quorum".into(),
            heartbeat_interval: self.cfg.heartbeat.as_millis() as u64,
            election_timeout_min: self.cfg.election_timeout.0.as_millis() as u64,
            election_timeout_max: self.cfg.election_timeout.1.as_millis() as u64,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.cfg.snapshot_every),
            max_in_snapshot_log_to_keep: self.cfg.kept_after_snapshot,
            // An entry holds up to about 4 MB of bodies: 32 of them stay within a transport
            // frame (crate::transport::MAX_FRAME).
            max_payload_entries: 32,
            ..Default::default()
        };
        Arc::new(cfg.validate().expect("valid raft settings"))
    }

    /// True while the shared log's writes fail (a full disk) and its writer retries: the
    /// node's quorum queues refuse publishes meanwhile, and resume once a retry succeeds.
    pub fn log_failed(&self) -> bool {
        matches!(self.log.get(), Some(Ok(log)) if log.is_failed())
    }

    /// Closes the connections to the other nodes, writes what is pending and stops the
    /// shared log's writer.
    pub fn close(&self) {
        if let Some(c) = self.cluster() {
            c.shutdown();
        }
        if let Some(Ok(log)) = self.log.get() {
            log.close();
        }
    }
}

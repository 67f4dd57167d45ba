//! The inter-node transport of a cluster: one TCP connection per pair of nodes, carrying the
//! Raft RPCs of every quorum queue group (multiplexed by group key), the requests that
//! start and delete a group's members, and what lets clients of any member consume: their
//! consumers' subscriptions, the deliveries to them and their basic.get ([`crate::remote`]).
//!
//! Connections: of two nodes, the one with the lower id dials the other (at its
//! `[cluster] listen` address from the seed list) and redials with backoff (100 ms doubling
//! to 3 s) whenever the connection drops; the other only accepts. Either side sends requests
//! over the connection and answers the other's.
//!
//! Framing: `u32` big-endian length, then a [postcard](https://docs.rs/postcard) encoded
//! [`Wire`] value. A frame is at most [`MAX_FRAME`] bytes (the handshake's at most
//! [`MAX_HANDSHAKE_FRAME`]); a longer one closes the connection, a request that would need
//! one fails.
//!
//! Authentication (both ways, the secret never sent): the dialer sends its id, the id it
//! expects to reach and a random 32-byte nonce; the acceptor answers with its id, its own
//! nonce and HMAC-SHA256(secret, `"warren-cluster/1 accept"`, both ids, both nonces); the
//! dialer checks it (constant-time) and answers with the same MAC under `"... dial"`, which
//! the acceptor checks. Ids must be in the seed list and differ. Any failure closes the
//! connection; the handshake must finish within 5 s.
//!
//! Liveness: each side pings every 2 s; a connection that carried nothing for 10 s (a peer
//! paused, or a machine gone without a reset) is closed, and redialed by its dialer.

use crate::remote::{Cast, GroupServer, RemoteConsumer, RemoteMessage};
use crate::TypeConfig;
use bytes::{BufMut, Bytes, BytesMut};
use hmac::{Hmac, Mac};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::Raft;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};
use warren_amqp::table::FieldTable;

type NodeId = u64;

/// Largest frame after the handshake, bytes (1 GiB: room for the largest message
/// `amqp.max_message_size` allows, 512 MiB, in one entry). A larger append-entries request is
/// refused before it is sent and openraft retries with fewer entries.
pub const MAX_FRAME: usize = 1 << 30;
/// Largest frame during the handshake, bytes.
pub const MAX_HANDSHAKE_FRAME: usize = 4096;
/// How long a handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often each side of a connection sends a ping.
const PING_EVERY: Duration = Duration::from_secs(2);
/// A connection that carried nothing for this long is closed (and redialed).
const IDLE_LIMIT: Duration = Duration::from_secs(10);
/// The protocol name mixed into every MAC.
const PROTOCOL: &[u8] = b"warren-cluster/1";
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(3);

/// A node's cluster settings (from `[cluster]`).
#[derive(Clone)]
pub struct ClusterSettings {
    /// This node's id (at least 1).
    pub node_id: NodeId,
    /// Every node of the cluster, this one included: id -> inter-node address `HOST:PORT`.
    pub nodes: BTreeMap<NodeId, String>,
    /// The shared secret nodes prove to each other (never sent).
    pub secret: Vec<u8>,
    /// Inter-node TLS (`[cluster] tls`): `None` for plain TCP.
    pub tls: Option<ClusterTls>,
}

/// The TLS configs of inter-node connections: the accepting node's, which requires a client
/// certificate, and the dialing node's, which presents one and checks the accepting node's
/// certificate against the host of its address (mutual TLS, both from `[tls]`).
#[derive(Clone)]
pub struct ClusterTls {
    /// For connections this node accepts.
    pub server: Arc<rustls::ServerConfig>,
    /// For connections this node dials.
    pub client: Arc<rustls::ClientConfig>,
}

/// An inter-node connection: plain TCP, or TLS over it.
enum Link {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

impl AsyncRead for Link {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Link::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Link {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Link::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Link::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            Link::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Link::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Link::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl std::fmt::Debug for ClusterSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSettings")
            .field("node_id", &self.node_id)
            .field("nodes", &self.nodes)
            .field("secret", &"<hidden>")
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// What a node does when another asks it to hold or drop a member of a quorum queue's group:
/// the broker declares or deletes the queue locally (set with [`Cluster::set_host`]).
pub trait MemberHost: Send + Sync + 'static {
    /// Declares durable quorum queue `name` in `vhost` with `arguments` (which include
    /// `x-queue-type: quorum`) on this node, as a member of a group another node creates.
    /// Returns true when the queue was created, false when it existed already (then it
    /// belongs to a group created before). Errors: the refusal's text.
    fn start_member(&self, vhost: &str, name: &str, arguments: FieldTable) -> Result<bool, String>;
    /// Deletes quorum queue `name` of `vhost` on this node (missing is success). Errors: the
    /// refusal's text.
    fn delete_member(&self, vhost: &str, name: &str) -> Result<(), String>;
    /// The broker, for the classic queues held here that other nodes use.
    fn broker(&self) -> Option<Arc<warren_broker::Broker>> {
        None
    }
}

/// Handshake messages.
#[derive(Debug, Serialize, Deserialize)]
enum Handshake {
    Hello {
        node: NodeId,
        target: NodeId,
        nonce: [u8; 32],
    },
    Challenge {
        node: NodeId,
        nonce: [u8; 32],
        mac: Vec<u8>,
    },
    Proof {
        mac: Vec<u8>,
    },
    Welcome,
}

/// A request from one node to another.
#[derive(Debug, Serialize, Deserialize)]
pub enum Request {
    /// Raft append-entries for group `group`.
    AppendEntries {
        /// The group's key (vhost, U+001F, queue name).
        group: String,
        /// openraft's request.
        rpc: AppendEntriesRequest<TypeConfig>,
    },
    /// Raft vote for group `group`.
    Vote {
        /// The group's key.
        group: String,
        /// openraft's request.
        rpc: VoteRequest<NodeId>,
    },
    /// A chunk of a snapshot for group `group`.
    InstallSnapshot {
        /// The group's key.
        group: String,
        /// openraft's request.
        rpc: InstallSnapshotRequest<TypeConfig>,
    },
    /// Start this node's member of a new quorum queue.
    StartMember {
        /// The queue's vhost.
        vhost: String,
        /// The queue's name.
        name: String,
        /// Its declared arguments, an AMQP field table (encoded as on the wire).
        arguments: Vec<u8>,
    },
    /// Delete this node's member of a quorum queue.
    DeleteMember {
        /// The queue's vhost.
        vhost: String,
        /// The queue's name.
        name: String,
        /// The queue stays (only this node's member is removed): the node reaches it
        /// through the other members from then on (see [`crate::proxy`]).
        stays: bool,
    },
    /// Propose `batch` in group `group`, whose leader is the answering node: what a member
    /// that does not lead forwards (publishes of its clients). Proposed in arrival order.
    Propose {
        /// The group's key.
        group: String,
        /// The commands to propose as one entry.
        batch: crate::command::Batch,
    },
    /// The sender's consumers of group `group`, for the answering node to deliver to while it
    /// leads in Raft term `term` (see [`crate::remote`]). Handled in arrival order.
    Subscribe {
        /// The group's key.
        group: String,
        /// The term the sender saw the answering node lead in.
        term: u64,
        /// Every consumer the sender's clients have on the queue now.
        consumers: Vec<RemoteConsumer>,
    },
    /// Add (`add`) or remove the member on node `node` of group `group`, of which the
    /// answering node holds a member (it passes the change on to the leader when it does
    /// not lead). Answered with [`Response::Done`], or [`Response::NoGroup`].
    ChangeMember {
        /// The group's key.
        group: String,
        /// The node whose member is added or removed.
        node: NodeId,
        /// Add (else remove).
        add: bool,
    },
    /// Initialize group `group` with these members (id, inter-node address) on the answering
    /// node, whose member then wins the first election. Answered with [`Response::Done`].
    Initialize {
        /// The group's key.
        group: String,
        /// The group's first members.
        members: Vec<(NodeId, String)>,
    },
    /// May a client of the sender add a consumer (`exclusive` or not) to group `group`'s
    /// queue, whose leader is the answering node? Answered with [`Response::Done`].
    CheckConsume {
        /// The group's key.
        group: String,
        /// basic.consume's exclusive.
        exclusive: bool,
    },
    /// Enqueue `message`, published on the sender and routed to classic queue `group` held
    /// by the answering node. Handled in arrival order; answered with
    /// [`Response::Proposed`] once the queue holds it (on disk when persistent).
    ClassicPublish {
        /// The queue's key.
        group: String,
        /// The message.
        message: crate::remote::WireMessage,
    },
    /// queue.delete of classic queue `group` held by the answering node, for a client of the
    /// sender; answered with [`Response::Deleted`].
    ClassicDelete {
        /// The queue's key.
        group: String,
        /// queue.delete's if-unused.
        if_unused: bool,
        /// queue.delete's if-empty.
        if_empty: bool,
    },
    /// The message counts of classic queue `group` held by the answering node; answered
    /// with [`Response::Counts`].
    ClassicCounts {
        /// The queue's key.
        group: String,
    },
    /// queue.purge of group `group`'s queue for a client of the sender.
    Purge {
        /// The group's key.
        group: String,
    },
    /// Add node `node` at inter-node address `address` to the cluster (`Some`), or remove
    /// it (`None`): a change of the metadata group's members, asked of the node that leads
    /// it. Answered with [`Response::Done`].
    ChangeNode {
        /// The node.
        node: NodeId,
        /// Its inter-node address, to add it.
        address: Option<String>,
    },
    /// basic.get on group `group`'s queue for a client of the sender.
    Get {
        /// The group's key.
        group: String,
        /// basic.get's no-ack.
        no_ack: bool,
    },
}

/// The answer to a [`Request`].
#[derive(Debug, Serialize, Deserialize)]
pub enum Response {
    /// openraft's answer to [`Request::AppendEntries`].
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    /// openraft's answer to [`Request::Vote`].
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    /// openraft's answer to [`Request::InstallSnapshot`].
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    /// The group is not (yet) on the answering node.
    NoGroup,
    /// Result of a member start: true when the member was created, false when the queue
    /// existed already on the answering node.
    Started(Result<bool, String>),
    /// Result of a member delete.
    Done(Result<(), String>),
    /// Result of a forwarded proposal: committed and applied, or why not.
    Proposed(Result<(), String>),
    /// Result of a [`Request::Subscribe`].
    Subscribed(Result<(), String>),
    /// Result of a [`Request::Get`]: a message and the ready messages left, or none.
    Got(Result<Option<(RemoteMessage, u32)>, String>),
    /// Result of a [`Request::Purge`]: the messages purged.
    Purged(Result<u32, String>),
    /// Result of a [`Request::ClassicCounts`]: ready, unacknowledged, consumers.
    Counts(Result<(u32, u32, u32), String>),
    /// Result of a [`Request::ClassicDelete`]: the ready messages deleted, or the refusal's
    /// reply code and text.
    Deleted(Result<u32, (u16, String)>),
}

/// A frame after the handshake.
#[derive(Debug, Serialize, Deserialize)]
enum Wire {
    Request {
        id: u64,
        body: Request,
    },
    Response {
        id: u64,
        body: Response,
    },
    /// A one-way message.
    Cast(Cast),
    /// Sent every [`PING_EVERY`], so that a peer that stopped answering is noticed.
    Ping,
}

/// Why a call to another node failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No connection to the node, or it dropped before the answer.
    #[error("node {0} is not reachable")]
    Unreachable(NodeId),
    /// No answer in time.
    #[error("node {0} did not answer in time")]
    Timeout(NodeId),
    /// The request could not be encoded.
    #[error("cannot send to node {0}: {1}")]
    Encode(NodeId, String),
    /// The request is larger than [`MAX_FRAME`].
    #[error("request to node {0} too large: {1} bytes")]
    TooLarge(NodeId, usize),
}

/// One authenticated connection to a peer.
struct Conn {
    peer: NodeId,
    /// Which connection to the peer this is (a new one gets a higher number).
    generation: u64,
    out: mpsc::UnboundedSender<Bytes>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Response>>>,
    next: AtomicU64,
    closed: watch::Sender<bool>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
}

impl Conn {
    fn answer(&self, id: u64, body: Response) {
        match encode_frame(&Wire::Response { id, body }, MAX_FRAME) {
            Ok(f) => {
                let _ = self.out.send(f);
            }
            Err(e) => warn!(peer = self.peer, error = %e, "cluster answer not sent"),
        }
    }

    fn close(&self) {
        self.pending.lock().clear();
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
        self.closed.send_replace(true);
    }
}

/// A node's end of the cluster: its connections, the groups it serves and the member
/// requests in progress.
pub struct Cluster {
    settings: ClusterSettings,
    /// Every node of the cluster now (id -> inter-node address): the seed list at start, then
    /// the metadata group's membership (see [`Cluster::set_nodes`]).
    nodes: Mutex<BTreeMap<NodeId, String>>,
    /// The metadata group, which serves node additions and removals.
    metadata: OnceLock<Weak<crate::metadata::MetadataGroup>>,
    /// Servers of the classic queues held here that other nodes use, by key.
    classic: Mutex<HashMap<String, Arc<crate::proxy::ClassicServer>>>,
    /// This cluster end, for what it hands out.
    myself: Weak<Cluster>,
    conns: Mutex<HashMap<NodeId, Arc<Conn>>>,
    attached: watch::Sender<u64>,
    groups: Mutex<HashMap<String, Raft<TypeConfig>>>,
    servers: Mutex<HashMap<String, Weak<dyn GroupServer>>>,
    generations: AtomicU64,
    joining: Mutex<HashSet<String>>,
    leaving: Mutex<HashSet<String>>,
    host: OnceLock<Arc<dyn MemberHost>>,
    stop: watch::Sender<bool>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("settings", &self.settings)
            .finish()
    }
}

/// Why a frame was not built.
#[derive(Debug)]
enum FrameError {
    Encode(String),
    TooLarge(usize),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Encode(e) => f.write_str(e),
            FrameError::TooLarge(n) => write!(f, "frame of {n} bytes is too large"),
        }
    }
}

fn encode_frame<T: Serialize>(v: &T, max: usize) -> Result<Bytes, FrameError> {
    let body = postcard::to_allocvec(v).map_err(|e| FrameError::Encode(e.to_string()))?;
    if body.len() > max {
        return Err(FrameError::TooLarge(body.len()));
    }
    let mut b = BytesMut::with_capacity(4 + body.len());
    b.put_u32(body.len() as u32);
    b.put_slice(&body);
    Ok(b.freeze())
}

async fn read_frame<R: AsyncRead + Unpin, T: for<'de> Deserialize<'de>>(
    r: &mut R,
    max: usize,
) -> std::io::Result<T> {
    let len = r.read_u32().await? as usize;
    if len > max {
        // A TLS record starts 0x16 0x03 (handshake, version 3.x).
        let hint = if len >> 16 == 0x1603 {
            ": it looks like a TLS handshake (is [cluster] tls on there and off here?)"
        } else {
            ""
        };
        return Err(std::io::Error::other(format!(
            "frame of {len} bytes exceeds {max}{hint}"
        )));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).await?;
    postcard::from_bytes(&buf).map_err(|e| std::io::Error::other(format!("bad frame: {e}")))
}

async fn write_frame<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, v: &T) -> std::io::Result<()> {
    let f =
        encode_frame(v, MAX_HANDSHAKE_FRAME).map_err(|e| std::io::Error::other(e.to_string()))?;
    w.write_all(&f).await?;
    w.flush().await
}

/// HMAC-SHA256 of the handshake under `role`.
fn handshake_mac(
    secret: &[u8],
    role: &[u8],
    dialer: NodeId,
    acceptor: NodeId,
    dialer_nonce: &[u8; 32],
    acceptor_nonce: &[u8; 32],
) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key");
    m.update(PROTOCOL);
    m.update(role);
    m.update(&dialer.to_be_bytes());
    m.update(&acceptor.to_be_bytes());
    m.update(dialer_nonce);
    m.update(acceptor_nonce);
    m
}

fn bad(what: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, what.into())
}

impl Cluster {
    /// Starts this node's end of the cluster on `listener` (bound to `[cluster] listen`):
    /// accepts peers and dials the ones with a higher id. Call inside the tokio runtime.
    pub fn start(
        settings: ClusterSettings,
        listener: std::net::TcpListener,
    ) -> std::io::Result<Arc<Cluster>> {
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let (stop, _) = watch::channel(false);
        let (attached, _) = watch::channel(0);
        let c = Arc::new_cyclic(|myself| Cluster {
            myself: myself.clone(),
            nodes: Mutex::new(settings.nodes.clone()),
            metadata: OnceLock::new(),
            classic: Mutex::new(HashMap::new()),
            settings,
            conns: Mutex::new(HashMap::new()),
            attached,
            groups: Mutex::new(HashMap::new()),
            servers: Mutex::new(HashMap::new()),
            generations: AtomicU64::new(0),
            joining: Mutex::new(HashSet::new()),
            leaving: Mutex::new(HashSet::new()),
            host: OnceLock::new(),
            stop,
        });
        info!(
            node = c.settings.node_id,
            listen = ?listener.local_addr().ok(),
            nodes = c.settings.nodes.len(),
            "cluster transport started"
        );
        tokio::spawn(c.clone().accept_loop(listener));
        let me = c.settings.node_id;
        for (&id, addr) in &c.settings.nodes {
            if id > me {
                tokio::spawn(c.clone().dial_loop(id, addr.clone()));
            }
        }
        Ok(c)
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.settings.node_id
    }

    /// Every node of the cluster now (id -> inter-node address), this one included.
    pub fn nodes(&self) -> BTreeMap<NodeId, String> {
        self.nodes.lock().clone()
    }

    /// Makes `nodes` the cluster's nodes: new ones are dialed (those with a higher id than
    /// this node's; the others dial this one) and accepted, the connections to nodes no
    /// longer listed are closed and they are refused from now on. This node stays listed.
    pub fn set_nodes(self: &Arc<Self>, mut nodes: BTreeMap<NodeId, String>) {
        let me = self.settings.node_id;
        if let Some(addr) = self.nodes.lock().get(&me).cloned() {
            nodes.entry(me).or_insert(addr);
        }
        let (added, removed) = {
            let mut now = self.nodes.lock();
            if *now == nodes {
                return;
            }
            let added: Vec<(NodeId, String)> = nodes
                .iter()
                .filter(|(id, addr)| now.get(id) != Some(addr))
                .map(|(id, addr)| (*id, addr.clone()))
                .collect();
            let removed: Vec<NodeId> = now
                .keys()
                .filter(|id| !nodes.contains_key(id))
                .copied()
                .collect();
            *now = nodes;
            (added, removed)
        };
        for (id, addr) in added {
            info!(node = id, addr = %addr, "cluster node added");
            if id > me && !*self.stop.borrow() {
                tokio::spawn(self.clone().dial_loop(id, addr));
            }
        }
        for id in removed {
            info!(node = id, "cluster node removed");
            if let Some(c) = self.conns.lock().remove(&id) {
                c.close();
            }
        }
    }

    /// Sets the metadata group that serves node additions and removals.
    pub(crate) fn set_metadata(&self, g: Weak<crate::metadata::MetadataGroup>) {
        let _ = self.metadata.set(g);
    }

    /// The metadata group, once started.
    pub fn metadata_group(&self) -> Option<Arc<crate::metadata::MetadataGroup>> {
        self.metadata.get().and_then(Weak::upgrade)
    }

    /// Sets what serves member requests (once; later calls are ignored).
    pub fn set_host(&self, host: Arc<dyn MemberHost>) {
        let _ = self.host.set(host);
    }

    /// The peers connected now.
    pub fn connected(&self) -> Vec<NodeId> {
        let mut v: Vec<NodeId> = self.conns.lock().keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Stops accepting and dialing and closes every connection.
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
        let conns: Vec<Arc<Conn>> = self.conns.lock().drain().map(|(_, c)| c).collect();
        for c in conns {
            c.close();
        }
    }

    pub(crate) fn register_group(&self, key: &str, raft: Raft<TypeConfig>) {
        self.groups.lock().insert(key.to_string(), raft);
    }

    pub(crate) fn unregister_group(&self, key: &str) {
        self.groups.lock().remove(key);
        self.servers.lock().remove(key);
    }

    /// Sets what serves group `key`'s subscriptions, deliveries and remote gets.
    pub(crate) fn register_server(&self, key: &str, server: Weak<dyn GroupServer>) {
        self.servers.lock().insert(key.to_string(), server);
    }

    fn server(&self, key: &str) -> Option<Arc<dyn GroupServer>> {
        if let Some(s) = self.servers.lock().get(key).and_then(Weak::upgrade) {
            return Some(s);
        }
        self.classic_server(key).map(|s| s as Arc<dyn GroupServer>)
    }

    /// The server of classic queue `key` held here, or of this node's member of quorum queue
    /// `key` (a [`crate::proxy::via_key`]), made when first asked (see [`crate::proxy`]);
    /// `None` when this node holds no such queue.
    fn classic_server(&self, key: &str) -> Option<Arc<crate::proxy::ClassicServer>> {
        let mut classic = self.classic.lock();
        if let Some(s) = classic.get(key) {
            if !s.queue().is_deleted() {
                return Some(s.clone());
            }
            classic.remove(key);
        }
        let (vhost, name) = crate::proxy::split_key(key)?;
        let broker = self.host.get()?.broker()?;
        let q = broker.vhost(vhost)?.queue(name, 0).ok()?;
        let kind = if crate::proxy::is_via(key) {
            "quorum"
        } else {
            "classic"
        };
        if q.kind() != kind || q.owner_node().is_some() || q.exclusive_owner().is_some() {
            return None;
        }
        let s = crate::proxy::ClassicServer::new(self.myself.clone(), key, q, &broker);
        classic.insert(key.to_string(), s.clone());
        Some(s)
    }

    /// Registers the proxy of a classic queue another node holds, which receives that node's
    /// deliveries for `key`.
    pub(crate) fn register_proxy(&self, key: &str, proxy: Weak<dyn GroupServer>) {
        self.servers.lock().insert(key.to_string(), proxy);
    }

    /// Forgets the proxy `p` of `key` (unless another took the key since).
    pub(crate) fn unregister_proxy(&self, key: &str, p: *const crate::proxy::ClassicProxy) {
        let mut servers = self.servers.lock();
        if servers
            .get(key)
            .is_some_and(|w| std::ptr::addr_eq(w.as_ptr(), p))
        {
            servers.remove(key);
        }
    }

    /// Deletes this node's member of queue `name` of `vhost` (its queue, locally: the other
    /// members are not asked to go). When the queue `stays` (only this member was removed),
    /// a proxy takes its place, with its bindings, so that the queue is still reached from
    /// here (see [`crate::proxy`]). Errors: the refusal's text.
    pub(crate) async fn delete_member_here(
        &self,
        vhost: String,
        name: String,
        stays: bool,
    ) -> Result<(), String> {
        let Some(host) = self.host.get().cloned() else {
            return Err("the node is starting".into());
        };
        let key = crate::node::group_key(&vhost, &name);
        self.leaving.lock().insert(key.clone());
        let metadata = self.metadata_group().filter(|_| stays);
        let r = tokio::task::spawn_blocking(move || {
            if let Some(m) = metadata {
                // The queue stays: a proxy takes the member's place in one step, so that
                // publishes routed here never find no queue.
                let v = host.broker().and_then(|b| b.vhost(&vhost));
                let member = v.as_ref().and_then(|v| v.queue(&name, 0).ok());
                if let (Some(v), Some(q)) = (&v, member) {
                    if q.owner_node().is_none() && m.hand_over(v, &name, q.arguments().clone()) {
                        return Ok(());
                    }
                }
            }
            host.delete_member(&vhost, &name)
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
        self.leaving.lock().remove(&key);
        r
    }

    /// Which connection to `peer` is up (a number that grows with each new one), or none.
    pub fn generation(&self, peer: NodeId) -> Option<u64> {
        self.conns.lock().get(&peer).map(|c| c.generation)
    }

    /// Sends `cast` to `peer` over the connection up now, without an answer. False when
    /// there is none (or the message cannot be encoded).
    pub fn cast(&self, peer: NodeId, cast: Cast) -> bool {
        let Some(conn) = self.conns.lock().get(&peer).cloned() else {
            return false;
        };
        match encode_frame(&Wire::Cast(cast), MAX_FRAME) {
            Ok(f) => conn.out.send(f).is_ok(),
            Err(e) => {
                warn!(peer, error = %e, "cluster message not sent");
                false
            }
        }
    }

    /// Tells every group server that the connection to `peer` is gone.
    fn peer_lost(&self, peer: NodeId) {
        let mut servers: Vec<Arc<dyn GroupServer>> = self
            .servers
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        servers.extend(
            self.classic
                .lock()
                .values()
                .map(|s| s.clone() as Arc<dyn GroupServer>),
        );
        for s in servers {
            s.peer_lost(peer);
        }
    }

    /// Whether group `key` is being started here at another node's request (taken once).
    pub(crate) fn take_joining(&self, key: &str) -> bool {
        self.joining.lock().remove(key)
    }

    /// Whether group `key` is being deleted here at another node's request.
    pub(crate) fn is_leaving(&self, key: &str) -> bool {
        self.leaving.lock().contains(key)
    }

    async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        let mut stop = self.stop.subscribe();
        loop {
            let (sock, addr) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        warn!(error = %e, "cluster accept failed");
                        tokio::time::sleep(BACKOFF_MIN).await;
                        continue;
                    }
                },
                _ = stopped(&mut stop) => return,
            };
            let me = self.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, me.accept_handshake(sock)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => warn!(peer = %addr, error = %e, "cluster connection refused"),
                    Err(_) => warn!(peer = %addr, "cluster handshake timed out"),
                }
            });
        }
    }

    async fn accept_handshake(self: Arc<Self>, sock: TcpStream) -> std::io::Result<()> {
        let _ = sock.set_nodelay(true);
        let mut sock = match &self.settings.tls {
            None => Link::Plain(sock),
            Some(tls) => {
                let s = tokio_rustls::TlsAcceptor::from(tls.server.clone())
                    .accept(sock)
                    .await?;
                Link::Tls(Box::new(s.into()))
            }
        };
        let me = self.settings.node_id;
        let Handshake::Hello {
            node: peer,
            target,
            nonce: peer_nonce,
        } = read_frame(&mut sock, MAX_HANDSHAKE_FRAME).await?
        else {
            return Err(bad("expected hello"));
        };
        if target != me {
            return Err(bad(format!(
                "node {peer} wanted node {target}, this is node {me}"
            )));
        }
        if peer == me || !self.nodes.lock().contains_key(&peer) {
            return Err(bad(format!("node {peer} is not a node of this cluster")));
        }
        let nonce: [u8; 32] = rand::random();
        let mac = handshake_mac(
            &self.settings.secret,
            b" accept",
            peer,
            me,
            &peer_nonce,
            &nonce,
        )
        .finalize()
        .into_bytes()
        .to_vec();
        write_frame(
            &mut sock,
            &Handshake::Challenge {
                node: me,
                nonce,
                mac,
            },
        )
        .await?;
        let Handshake::Proof { mac } = read_frame(&mut sock, MAX_HANDSHAKE_FRAME)
            .await
            .map_err(|e| closed_while_authenticating(e, peer))?
        else {
            return Err(bad("expected proof"));
        };
        handshake_mac(
            &self.settings.secret,
            b" dial",
            peer,
            me,
            &peer_nonce,
            &nonce,
        )
        .verify_slice(&mac)
        .map_err(|_| bad(format!("node {peer} does not know the cluster secret")))?;
        write_frame(&mut sock, &Handshake::Welcome).await?;
        self.attach(peer, sock);
        Ok(())
    }

    async fn dial_handshake(self: &Arc<Self>, peer: NodeId, addr: &str) -> std::io::Result<Link> {
        let sock = TcpStream::connect(addr).await?;
        let _ = sock.set_nodelay(true);
        let mut sock = match &self.settings.tls {
            None => Link::Plain(sock),
            Some(tls) => {
                // The accepting node's certificate must name the host of its address.
                let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = rustls::pki_types::ServerName::try_from(host.to_string())
                    .map_err(|e| std::io::Error::other(format!("bad host '{host}': {e}")))?;
                let s = tokio_rustls::TlsConnector::from(tls.client.clone())
                    .connect(name, sock)
                    .await?;
                Link::Tls(Box::new(s.into()))
            }
        };
        let me = self.settings.node_id;
        let nonce: [u8; 32] = rand::random();
        write_frame(
            &mut sock,
            &Handshake::Hello {
                node: me,
                target: peer,
                nonce,
            },
        )
        .await?;
        let Handshake::Challenge {
            node,
            nonce: peer_nonce,
            mac,
        } = read_frame(&mut sock, MAX_HANDSHAKE_FRAME)
            .await
            .map_err(|e| closed_while_authenticating(e, peer))?
        else {
            return Err(bad("expected challenge"));
        };
        if node != peer {
            return Err(bad(format!("{addr} is node {node}, not node {peer}")));
        }
        handshake_mac(
            &self.settings.secret,
            b" accept",
            me,
            peer,
            &nonce,
            &peer_nonce,
        )
        .verify_slice(&mac)
        .map_err(|_| bad(format!("node {peer} does not know the cluster secret")))?;
        let mac = handshake_mac(
            &self.settings.secret,
            b" dial",
            me,
            peer,
            &nonce,
            &peer_nonce,
        )
        .finalize()
        .into_bytes()
        .to_vec();
        write_frame(&mut sock, &Handshake::Proof { mac }).await?;
        let Handshake::Welcome = read_frame(&mut sock, MAX_HANDSHAKE_FRAME)
            .await
            .map_err(|e| closed_while_authenticating(e, peer))?
        else {
            return Err(bad("expected welcome"));
        };
        Ok(sock)
    }

    async fn dial_loop(self: Arc<Self>, peer: NodeId, addr: String) {
        let mut stop = self.stop.subscribe();
        let mut backoff = BACKOFF_MIN;
        let mut failures = 0u32;
        loop {
            if *stop.borrow() {
                return;
            }
            if self.nodes.lock().get(&peer) != Some(&addr) {
                // Removed from the cluster, or moved: another loop dials its new address.
                return;
            }
            let r = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.dial_handshake(peer, &addr)).await;
            match r {
                Ok(Ok(sock)) => {
                    if failures > 0 {
                        info!(peer, addr = %addr, "cluster node connected");
                    }
                    failures = 0;
                    backoff = BACKOFF_MIN;
                    let conn = self.attach(peer, sock);
                    let mut closed = conn.closed.subscribe();
                    tokio::select! {
                        _ = stopped(&mut closed) => {}
                        _ = stopped(&mut stop) => return,
                    }
                    info!(peer, "cluster connection lost; redialing");
                }
                Ok(Err(e)) => {
                    failures += 1;
                    // The first failure and then every 20th, so that a node that is down
                    // does not flood the log.
                    if failures % 20 == 1 {
                        info!(peer, addr = %addr, error = %e, "cannot reach cluster node");
                    }
                    if e.kind() == std::io::ErrorKind::PermissionDenied {
                        warn!(peer, addr = %addr, error = %e, "cluster node refused");
                    }
                }
                Err(_) => {
                    failures += 1;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stopped(&mut stop) => return,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Makes `sock` the connection to `peer` (closing an older one) and starts its tasks.
    fn attach(self: &Arc<Self>, peer: NodeId, sock: Link) -> Arc<Conn> {
        let (out, rx) = mpsc::unbounded_channel();
        let (closed, _) = watch::channel(false);
        let conn = Arc::new(Conn {
            peer,
            generation: self.generations.fetch_add(1, Ordering::Relaxed) + 1,
            out,
            pending: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            closed,
            tasks: Mutex::new(Vec::new()),
        });
        // The old connection's subscriptions end before the new one reads anything.
        let old = self.conns.lock().insert(peer, conn.clone());
        if let Some(old) = old {
            old.close();
            self.peer_lost(peer);
        }
        // Plain TCP splits without a lock; a TLS stream's halves share one.
        let (writer, reader) = match sock {
            Link::Plain(sock) => {
                let (rd, wr) = sock.into_split();
                (
                    tokio::spawn(Self::write_loop(wr, rx, conn.clone(), self.clone())),
                    tokio::spawn(self.clone().read_loop(rd, conn.clone())),
                )
            }
            Link::Tls(sock) => {
                let (rd, wr) = tokio::io::split(*sock);
                (
                    tokio::spawn(Self::write_loop(wr, rx, conn.clone(), self.clone())),
                    tokio::spawn(self.clone().read_loop(rd, conn.clone())),
                )
            }
        };
        conn.tasks
            .lock()
            .extend([writer.abort_handle(), reader.abort_handle()]);
        self.attached.send_modify(|n| *n += 1);
        debug!(peer, "cluster connection up");
        conn
    }

    fn detach(&self, conn: &Arc<Conn>) {
        let current = {
            let mut conns = self.conns.lock();
            let current = conns.get(&conn.peer).is_some_and(|c| Arc::ptr_eq(c, conn));
            if current {
                conns.remove(&conn.peer);
            }
            current
        };
        conn.close();
        if current {
            self.peer_lost(conn.peer);
        }
    }

    async fn write_loop<W: AsyncWrite + Unpin + Send + 'static>(
        wr: W,
        mut rx: mpsc::UnboundedReceiver<Bytes>,
        conn: Arc<Conn>,
        cluster: Arc<Cluster>,
    ) {
        let mut w = BufWriter::with_capacity(64 * 1024, wr);
        let ping = encode_frame(&Wire::Ping, MAX_FRAME).expect("a ping encodes");
        let mut tick = tokio::time::interval(PING_EVERY);
        loop {
            let f = tokio::select! {
                f = rx.recv() => match f {
                    Some(f) => f,
                    None => break,
                },
                _ = tick.tick() => ping.clone(),
            };
            if w.write_all(&f).await.is_err() {
                break;
            }
            if rx.is_empty() && w.flush().await.is_err() {
                break;
            }
        }
        cluster.detach(&conn);
    }

    async fn read_loop<R: AsyncRead + Unpin + Send + 'static>(
        self: Arc<Self>,
        rd: R,
        conn: Arc<Conn>,
    ) {
        let mut r = tokio::io::BufReader::with_capacity(64 * 1024, rd);
        loop {
            let read = tokio::time::timeout(IDLE_LIMIT, read_frame(&mut r, MAX_FRAME)).await;
            let frame: Wire = match read.unwrap_or_else(|_| {
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "nothing received for 10 s",
                ))
            }) {
                Ok(f) => f,
                Err(e) => {
                    if e.kind() != std::io::ErrorKind::UnexpectedEof {
                        debug!(peer = conn.peer, error = %e, "cluster connection closed");
                    }
                    break;
                }
            };
            match frame {
                Wire::Ping => {}
                Wire::Response { id, body } => {
                    if let Some(tx) = conn.pending.lock().remove(&id) {
                        let _ = tx.send(body);
                    }
                }
                Wire::Request {
                    id,
                    body: Request::Propose { group, batch },
                } => {
                    // Handed to Raft here, in the order they arrived; answered once applied.
                    let proposed = match self.group(&group) {
                        None => Err(Response::NoGroup),
                        Some(r) => r
                            .client_write_ff(batch)
                            .await
                            .map_err(|e| Response::Proposed(Err(e.to_string()))),
                    };
                    let conn = conn.clone();
                    let server = self.servers.lock().get(&group).cloned();
                    tokio::spawn(async move {
                        let body = match proposed {
                            Ok(rx) => match rx.await {
                                Ok(Ok(_)) => {
                                    crate::queue::until_ready_to_hand_out(|| {
                                        server
                                            .as_ref()
                                            .and_then(Weak::upgrade)
                                            .is_none_or(|s| s.ready_to_hand_out())
                                    })
                                    .await;
                                    Response::Proposed(Ok(()))
                                }
                                Ok(Err(e)) => Response::Proposed(Err(e.to_string())),
                                Err(e) => Response::Proposed(Err(e.to_string())),
                            },
                            Err(b) => b,
                        };
                        conn.answer(id, body);
                    });
                }
                // Handled here, in arrival order: a subscription replaces the one before, and
                // deliveries keep the leader's order.
                Wire::Cast(Cast::Leave { group }) => {
                    if let Some(s) = self.server(&group) {
                        s.peer_lost(conn.peer);
                    }
                }
                Wire::Cast(Cast::Settle {
                    group,
                    consumer,
                    settlements,
                }) => {
                    if let Some(s) = self.classic_server(&group) {
                        s.settle(conn.peer, consumer, settlements);
                    }
                }
                Wire::Request {
                    id,
                    body: Request::ClassicPublish { group, message },
                } => {
                    // Enqueued here, in the order they arrived; answered once held.
                    let server = self.classic_server(&group);
                    let broker = self.host.get().and_then(|h| h.broker());
                    match (server, broker) {
                        (Some(s), Some(b)) => {
                            let answer = conn.clone();
                            let done = warren_store::once(move |ok| {
                                let r = if ok {
                                    Ok(())
                                } else {
                                    Err("not enqueued".to_string())
                                };
                                answer.answer(id, Response::Proposed(r));
                            });
                            s.publish(&b, message.0, done);
                        }
                        _ => {
                            conn.answer(id, Response::Proposed(Err(crate::proxy::NOT_HERE.into())))
                        }
                    }
                }
                Wire::Request {
                    id,
                    body: Request::ClassicCounts { group },
                } => {
                    let r = match self.classic_server(&group) {
                        Some(s) => Ok(s.counts()),
                        None => Err(crate::proxy::NOT_HERE.into()),
                    };
                    conn.answer(id, Response::Counts(r));
                }
                Wire::Cast(Cast::Deliver {
                    group,
                    term,
                    consumer,
                    delivery,
                }) => {
                    if let Some(s) = self.server(&group) {
                        s.deliver(conn.peer, term, consumer, delivery);
                    }
                }
                Wire::Request {
                    id,
                    body:
                        Request::Subscribe {
                            group,
                            term,
                            consumers,
                        },
                } => {
                    let r = match self.server(&group) {
                        Some(s) => s.subscribe(conn.peer, term, consumers),
                        None => Err(crate::proxy::NOT_HERE.into()),
                    };
                    conn.answer(id, Response::Subscribed(r));
                }
                Wire::Request {
                    id,
                    body: Request::Purge { group },
                } => {
                    let r = match self.server(&group) {
                        Some(s) => s.purge(),
                        None => Err(crate::proxy::NOT_HERE.into()),
                    };
                    conn.answer(id, Response::Purged(r));
                }
                Wire::Request {
                    id,
                    body: Request::CheckConsume { group, exclusive },
                } => {
                    let r = match self.server(&group) {
                        Some(s) => s.check_consume(exclusive),
                        None => Err(crate::proxy::NOT_HERE.into()),
                    };
                    conn.answer(id, Response::Done(r));
                }
                Wire::Request {
                    id,
                    body: Request::Get { group, no_ack },
                } => {
                    let r = match self.server(&group) {
                        Some(s) => s.get(conn.peer, no_ack),
                        None => Err(crate::proxy::NOT_HERE.into()),
                    };
                    conn.answer(id, Response::Got(r));
                }
                Wire::Request { id, body } => {
                    let me = self.clone();
                    let conn = conn.clone();
                    tokio::spawn(async move {
                        let body = me.serve(conn.peer, body).await;
                        conn.answer(id, body);
                    });
                }
            }
        }
        self.detach(&conn);
    }

    fn group(&self, key: &str) -> Option<Raft<TypeConfig>> {
        self.groups.lock().get(key).cloned()
    }

    /// This node's member of group `key`, if node `candidate` may ask it for its vote: a
    /// node of the group's membership as the member knows it (voters and learners), or any
    /// node while it knows none (a member just started, whose group is not initialized).
    /// A member of an older group of the same name, left on a node that was down (or cut
    /// off) when its queue was deleted, is refused: it can never be elected in the group of
    /// a queue declared again since, whose log it would replace with its own.
    fn group_voting_for(&self, key: &str, candidate: NodeId) -> Option<Raft<TypeConfig>> {
        let r = self.group(key)?;
        let admitted = {
            let metrics = r.metrics();
            let m = metrics.borrow();
            let mut nodes = m.membership_config.membership().nodes().peekable();
            nodes.peek().is_none() || nodes.any(|(id, _)| *id == candidate)
        };
        if !admitted {
            debug!(group = %key, candidate, "vote request from a node outside the group refused");
        }
        admitted.then_some(r)
    }

    /// Answers a request from node `peer`.
    async fn serve(self: Arc<Self>, peer: NodeId, req: Request) -> Response {
        match req {
            Request::AppendEntries { group, rpc } => match self.group(&group) {
                Some(r) => Response::AppendEntries(r.append_entries(rpc).await),
                None => Response::NoGroup,
            },
            Request::Vote { group, rpc } => match self.group_voting_for(&group, peer) {
                Some(r) => Response::Vote(r.vote(rpc).await),
                None => Response::NoGroup,
            },
            Request::InstallSnapshot { group, rpc } => match self.group(&group) {
                Some(r) => Response::InstallSnapshot(r.install_snapshot(rpc).await),
                None => Response::NoGroup,
            },
            Request::StartMember {
                vhost,
                name,
                arguments,
            } => {
                let Some(host) = self.host.get().cloned() else {
                    return Response::Started(Err("the node is starting".into()));
                };
                let mut dec = warren_amqp::table::Decoder::new(&arguments);
                let arguments = match warren_amqp::table::decode_table(
                    &mut dec,
                    warren_amqp::table::DEFAULT_MAX_TABLE_DEPTH,
                ) {
                    Ok(t) => t,
                    Err(e) => return Response::Started(Err(format!("bad arguments: {e}"))),
                };
                let key = crate::node::group_key(&vhost, &name);
                self.joining.lock().insert(key.clone());
                let r = tokio::task::spawn_blocking(move || {
                    host.start_member(&vhost, &name, arguments)
                })
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
                self.joining.lock().remove(&key);
                Response::Started(r)
            }
            Request::Propose { .. } => Response::Proposed(Err("not proposed".into())),
            Request::Subscribe { .. } => Response::Subscribed(Err("not handled".into())),
            Request::Get { .. } => Response::Got(Err("not handled".into())),
            Request::Purge { .. } => Response::Purged(Err("not handled".into())),
            Request::CheckConsume { .. } => Response::Done(Err("not handled".into())),
            Request::ClassicPublish { .. } => Response::Proposed(Err("not handled".into())),
            Request::ClassicDelete {
                group,
                if_unused,
                if_empty,
            } => {
                let broker = self.host.get().and_then(|h| h.broker());
                let Some((broker, (vhost, name))) = broker.zip(
                    crate::proxy::split_key(&group).map(|(v, n)| (v.to_string(), n.to_string())),
                ) else {
                    return Response::Deleted(Err((404, crate::proxy::NOT_HERE.into())));
                };
                if crate::proxy::is_via(&group) && self.classic_server(&group).is_none() {
                    // No member of the quorum queue here: the proxy asks another node.
                    return Response::Deleted(Err((404, crate::proxy::NOT_HERE.into())));
                }
                let r = tokio::task::spawn_blocking(move || {
                    let v = broker
                        .vhost(&vhost)
                        .ok_or((404, format!("no vhost '{vhost}'")))?;
                    v.delete_queue(&name, if_unused, if_empty, 0)
                        .map_err(|e| (e.code, e.text))
                })
                .await
                .unwrap_or_else(|e| Err((541, e.to_string())));
                Response::Deleted(r)
            }
            Request::ClassicCounts { .. } => Response::Counts(Err("not handled".into())),
            Request::DeleteMember { vhost, name, stays } => {
                Response::Done(self.delete_member_here(vhost, name, stays).await)
            }
            Request::Initialize { group, members } => match self.group(&group) {
                Some(r) => {
                    let members: BTreeMap<NodeId, openraft::BasicNode> = members
                        .into_iter()
                        .map(|(id, addr)| (id, openraft::BasicNode::new(addr)))
                        .collect();
                    Response::Done(r.initialize(members).await.map_err(|e| e.to_string()))
                }
                None => Response::NoGroup,
            },
            Request::ChangeNode { node, address } => match self.metadata_group() {
                Some(m) => Response::Done(m.change_node(node, address).await),
                None => Response::NoGroup,
            },
            Request::ChangeMember { group, node, add } => match self.server(&group) {
                Some(s) => Response::Done(s.change_member(node, add).await),
                None => Response::NoGroup,
            },
        }
    }

    /// Sends `req` to `peer` and waits for the answer, at most `timeout` (which includes
    /// waiting up to `connect_wait` for a connection to the peer).
    ///
    /// Errors: [`CallError`].
    pub async fn call(
        &self,
        peer: NodeId,
        req: Request,
        connect_wait: Duration,
        timeout: Duration,
    ) -> Result<Response, CallError> {
        let work = async {
            let conn = self.connection(peer, connect_wait).await?;
            let mut pending = submit(conn, req)?;
            (&mut pending.rx)
                .await
                .map_err(|_| CallError::Unreachable(peer))
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout(peer)),
        }
    }

    /// [`Cluster::call`] waited for on this thread, for a synchronous caller on a worker
    /// thread of a multi-threaded runtime (the server's is one) or off the runtime's threads.
    /// `None` on a single-threaded runtime.
    pub fn call_blocking(
        &self,
        peer: NodeId,
        req: Request,
        timeout: Duration,
    ) -> Option<Result<Response, CallError>> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
            return None;
        }
        let call = self.call(peer, req, Duration::ZERO, timeout);
        Some(tokio::task::block_in_place(|| handle.block_on(call)))
    }

    /// Sends `req` to `peer` now, if connected: requests sent this way reach the peer in
    /// the order of the calls. The answer is awaited with [`PendingCall::wait`].
    ///
    /// Errors: [`CallError::Unreachable`] (no connection), [`CallError::Encode`].
    pub fn send_now(&self, peer: NodeId, req: Request) -> Result<PendingCall, CallError> {
        let conn = self
            .conns
            .lock()
            .get(&peer)
            .cloned()
            .ok_or(CallError::Unreachable(peer))?;
        submit(conn, req)
    }

    async fn connection(&self, peer: NodeId, wait: Duration) -> Result<Arc<Conn>, CallError> {
        let mut attached = self.attached.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(c) = self.conns.lock().get(&peer).cloned() {
                return Ok(c);
            }
            if tokio::time::timeout_at(deadline, attached.changed())
                .await
                .map_or(true, |r| r.is_err())
            {
                return Err(CallError::Unreachable(peer));
            }
        }
    }
}

/// A request sent with [`Cluster::send_now`], its answer to come.
pub struct PendingCall {
    conn: Arc<Conn>,
    id: u64,
    rx: oneshot::Receiver<Response>,
}

impl PendingCall {
    /// The answer, waited for at most `timeout`.
    ///
    /// Errors: [`CallError::Unreachable`] (the connection dropped), [`CallError::Timeout`].
    pub async fn wait(mut self, timeout: Duration) -> Result<Response, CallError> {
        let peer = self.conn.peer;
        match tokio::time::timeout(timeout, &mut self.rx).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err(CallError::Unreachable(peer)),
            Err(_) => Err(CallError::Timeout(peer)),
        }
    }
}

/// Sends `req` over `conn` and registers for its answer (forgotten when the returned call
/// is dropped).
///
/// Errors: [`CallError::TooLarge`], [`CallError::Encode`], [`CallError::Unreachable`] (the
/// connection is closed).
fn submit(conn: Arc<Conn>, req: Request) -> Result<PendingCall, CallError> {
    let peer = conn.peer;
    let id = conn.next.fetch_add(1, Ordering::Relaxed);
    let frame = encode_frame(&Wire::Request { id, body: req }, MAX_FRAME).map_err(|e| match e {
        FrameError::TooLarge(n) => CallError::TooLarge(peer, n),
        FrameError::Encode(e) => CallError::Encode(peer, e),
    })?;
    let (tx, rx) = oneshot::channel();
    conn.pending.lock().insert(id, tx);
    if *conn.closed.borrow() || conn.out.send(frame).is_err() {
        conn.pending.lock().remove(&id);
        return Err(CallError::Unreachable(peer));
    }
    Ok(PendingCall { conn, id, rx })
}

impl Drop for PendingCall {
    fn drop(&mut self) {
        self.conn.pending.lock().remove(&self.id);
    }
}

/// Returns once the flag behind `rx` is set (or its sender is gone).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// A handshake read that failed: when the other node closed the connection, the error says
/// what most likely made it refuse this node.
fn closed_while_authenticating(e: std::io::Error, peer: NodeId) -> std::io::Error {
    if e.kind() != std::io::ErrorKind::UnexpectedEof {
        return e;
    }
    std::io::Error::new(
        e.kind(),
        format!(
            "node {peer} closed the connection during authentication: its cluster secret \
             (or its seed list) differs from this node's"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_bind_roles_ids_and_nonces() {
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let m = |s: &[u8], role: &[u8], x: u64, y: u64, n1: &[u8; 32], n2: &[u8; 32]| {
            handshake_mac(s, role, x, y, n1, n2)
                .finalize()
                .into_bytes()
                .to_vec()
        };
        let base = m(b"secret", b" accept", 1, 2, &a, &b);
        assert!(handshake_mac(b"secret", b" accept", 1, 2, &a, &b)
            .verify_slice(&base)
            .is_ok());
        for other in [
            m(b"secreT", b" accept", 1, 2, &a, &b),
            m(b"secret", b" dial", 1, 2, &a, &b),
            m(b"secret", b" accept", 2, 1, &a, &b),
            m(b"secret", b" accept", 1, 2, &b, &a),
        ] {
            assert_ne!(other, base);
        }
    }
}

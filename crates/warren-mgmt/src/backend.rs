//! The one place the management API calls into the broker (`warren_broker`): users,
//! vhosts, queues, exchanges and bindings read as plain snapshots, and the writes the API
//! offers (declare, delete, purge, bind, publish, get). Everything above this module works
//! on these snapshots and on [`ApiError`], never on broker types.
//!
//! Users, their tags, password hashes and permissions come from the broker's access-control
//! database (`warren_broker::access::AccessControl`); logins go through `Broker::login`, the
//! same check as AMQP's (with the loopback rule).

use crate::error::ApiError;
use bytes::Bytes;
use serde_json::{Map, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use warren_amqp::properties::BasicProperties;
use warren_amqp::table::FieldTable;
use warren_broker::access::{PasswordHash, Permissions, UserRecord, UserTag, VhostRecord};
use warren_broker::definitions::{
    json_to_table, plan_import, plan_vhost_import, table_to_json, AppliedImport, Definitions,
};
use warren_broker::ops::Admin;
use warren_broker::queue::Settlement;
use warren_broker::vhost::{ExchangeDeclare, QueueDeclare};
use warren_broker::{Actor, Ops};
use warren_broker::{BrokerError, Destination};

pub use warren_store::{HistogramSnapshot, StoreStats};

pub use warren_broker::registry::{
    ChannelSnapshot, Churn, ConnectionDetails, ConnectionSnapshot, ConsumerDetails, ExchangeCounts,
    IoSnapshot, MessageStats, QueueDeliveries,
};

/// Vhost limits as RabbitMQ's `vhost-limits` value: `{"max-connections": n, "max-queues": n}`
/// with the limits set.
fn vhost_limits_json(l: &warren_broker::access::VhostLimits) -> Value {
    let mut m = Map::new();
    if let Some(n) = l.max_connections {
        m.insert("max-connections".into(), Value::from(n));
    }
    if let Some(n) = l.max_queues {
        m.insert("max-queues".into(), Value::from(n));
    }
    Value::Object(m)
}

/// User limits as RabbitMQ shows them: `{"max-connections": n, "max-channels": n}` with
/// the limits set.
fn user_limits_json(l: &warren_broker::access::UserLimits) -> Map<String, Value> {
    let mut m = Map::new();
    if let Some(n) = l.max_connections {
        m.insert("max-connections".into(), Value::from(n));
    }
    if let Some(n) = l.max_channels {
        m.insert("max-channels".into(), Value::from(n));
    }
    m
}

/// A queue's counters as [`MessageStats`]: what went in (`publish`), out to consumers
/// (`deliver`) and basic.get (`get`), acknowledgements and redeliveries.
fn queue_stats(q: &warren_broker::Queue) -> MessageStats {
    use std::sync::atomic::Ordering::Relaxed;
    MessageStats {
        publish: q.stats().publish.load(Relaxed),
        deliver: q.deliveries(),
        get: q.stats().get.load(Relaxed),
        ack: q.stats().ack.load(Relaxed),
        redeliver: q.stats().redeliver.load(Relaxed),
        ..MessageStats::default()
    }
}

/// What tells queue `q` from any other while it lives: a hash of the address of its `Arc`,
/// its vhost and its name, so that a new queue at the address of a freed one has another
/// ident unless it has the same name. A queue deleted and declared again under its old name
/// at its old address keeps the ident; its rate series then starts anew at the first counter
/// that went back (see `crate::rates`).
pub fn queue_ident(q: &Arc<warren_broker::Queue>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (Arc::as_ptr(q) as *const () as usize).hash(&mut h);
    q.vhost().hash(&mut h);
    q.name().hash(&mut h);
    h.finish()
}

/// The outcome, to come, of a quorum queue member change: why not, as text.
pub type MemberChange =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// A node of the cluster as the management API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// Its `[cluster] node_id`.
    pub id: u64,
    /// Its name in `node` fields: `warren-<id>@<host of its inter-node address>`.
    pub name: String,
    /// It is the node answering.
    pub this: bool,
    /// It is this node, or its inter-node connection with this node is up.
    pub running: bool,
}

impl ClusterNode {
    /// The name of node `id` whose inter-node address is `addr` (`HOST:PORT`).
    pub fn name_of(id: u64, addr: &str) -> String {
        let host = addr
            .rsplit_once(':')
            .map_or(addr, |(h, _)| h)
            .trim_matches(|c| c == '[' || c == ']');
        format!("warren-{id}@{host}")
    }
}

/// What the server that embeds the management API tells it besides the broker model: its
/// connections, alarms and listeners. Implemented by `warren-server` for its shared state.
pub trait Node: Send + Sync + 'static {
    /// The broker model.
    fn broker(&self) -> &warren_broker::Broker;
    /// Client connections open now.
    fn connection_count(&self) -> usize;
    /// True while the memory alarm is on.
    fn memory_alarm(&self) -> bool;
    /// True while the disk alarm is on.
    fn disk_alarm(&self) -> bool;
    /// The memory alarm's watermark, bytes (RabbitMQ's `mem_limit`, from
    /// `vm_memory_high_watermark`); `None` when the embedding server has no memory alarm.
    fn memory_limit(&self) -> Option<u64> {
        None
    }
    /// Free bytes on the file system of the data directory (RabbitMQ's `disk_free`), `None`
    /// when unknown.
    fn disk_free(&self) -> Option<u64> {
        None
    }
    /// The disk alarm's limit, bytes (RabbitMQ's `disk_free_limit`); `None` when the
    /// embedding server has no disk alarm.
    fn disk_free_limit(&self) -> Option<u64> {
        None
    }
    /// The broker's listeners: (protocol as RabbitMQ names it, e.g. `amqp`, address).
    fn listeners(&self) -> Vec<(String, SocketAddr)>;
    /// The nodes of this node's cluster, this one included, in id order; empty when the node
    /// runs alone (no `[cluster]`).
    fn cluster_nodes(&self) -> Vec<ClusterNode> {
        Vec::new()
    }
    /// Adds (`add`) or removes the member on cluster node `node` (its id) of quorum queue
    /// `name` of `vhost` (RabbitMQ's `rabbitmq-queues add_member` / `delete_member`).
    /// Errors: why not, as text (not in a cluster, a member already or not one, the last
    /// member, no leader, a node that does not answer).
    fn change_quorum_member(&self, vhost: &str, name: &str, node: u64, add: bool) -> MemberChange {
        let _ = (vhost, name, node, add);
        Box::pin(async { Err("this node is not in a cluster".to_string()) })
    }
    /// Adds node `id` at inter-node address `address` (`HOST:PORT`) to the running cluster
    /// (`Some`), or removes it (`None`).
    /// Errors: why not, as text (not in a cluster, no leader, the new node did not answer or
    /// catch up, the node to remove is not in the cluster or is the last one).
    fn change_cluster_node(&self, id: u64, address: Option<String>) -> MemberChange {
        let _ = (id, address);
        Box::pin(async { Err("this node is not in a cluster".to_string()) })
    }
    /// Users that may only log in from a loopback address (`[auth] loopback_users`).
    fn loopback_users(&self) -> Vec<String>;
    /// The deepest field-table nesting AMQP clients may send (`amqp.max_table_depth`): HTTP
    /// publishes are held to the same bound, so that a stored message always reads back.
    fn max_table_depth(&self) -> usize;
    /// The most client connections the node accepts at once (RabbitMQ's `connection_max`),
    /// `None` for no limit. The health checks `below-node-connection-limit` and
    /// `ready-to-serve-clients` compare [`Node::connection_count`] with it.
    fn connection_limit(&self) -> Option<usize> {
        None
    }
    /// The certificate files of the TLS listeners, read now (the health check
    /// `certificate-expiration` looks at them).
    fn tls_certificates(&self) -> Vec<ListenerCertificates> {
        Vec::new()
    }
}

/// A TLS listener's certificate files and when the certificates in them expire, for the
/// `certificate-expiration` health check.
#[derive(Debug, Clone)]
pub struct ListenerCertificates {
    /// The listener's protocol as RabbitMQ names it (`amqp/ssl`, `https`, ...).
    pub protocol: String,
    /// The listener's address.
    pub addr: SocketAddr,
    /// The certificate chain file, as configured.
    pub cert_file: String,
    /// The CA bundle file, as configured, if any.
    pub ca_file: Option<String>,
    /// The end of validity of each certificate in `cert_file`, seconds since the Unix epoch;
    /// or why the file could not be read.
    pub cert_expiries: Result<Vec<i64>, String>,
    /// The same for `ca_file` (an empty list when there is none).
    pub ca_expiries: Result<Vec<i64>, String>,
}

/// The connection id the management API uses for broker calls: it owns no exclusive queue,
/// so exclusive queues of clients are refused to it with 405 (as to any other connection).
const API_CONNECTION: u64 = u64::MAX;

/// A completion for one store wait and the receiver of its outcome (`true` once fsynced).
fn store_ack() -> (
    Arc<dyn warren_broker::Completion>,
    tokio::sync::oneshot::Receiver<bool>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let done = warren_broker::completion_once(move |ok| {
        let _ = tx.send(ok);
    });
    (done, rx)
}

/// A user as the API shows it.
#[derive(Debug, Clone)]
pub struct UserInfo {
    /// Login name.
    pub name: String,
    /// Tags (`administrator`, `monitoring`, `policymaker`, `management`, ...).
    pub tags: Vec<String>,
    /// The password hash as RabbitMQ stores it (base64 of a 4-byte salt and the salted hash),
    /// empty for a login; see `hashing_algorithm`.
    pub password_hash: String,
    /// RabbitMQ's name of the hashing algorithm (`rabbit_password_hashing_sha256`, ...).
    pub hashing_algorithm: String,
    /// The user's limits as RabbitMQ shows them (`{"max-connections": n, "max-channels":
    /// n}`, the ones set), empty for a login.
    pub limits: Map<String, Value>,
}

/// Why a login over HTTP failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoginError {
    /// Unknown user or wrong password.
    BadCredentials,
    /// A loopback-only user from another address.
    NotLoopback,
}

/// A queue as the API shows it.
#[derive(Debug, Clone)]
pub struct QueueInfo {
    /// Name.
    pub name: String,
    /// Virtual host.
    pub vhost: String,
    /// Survives a restart.
    pub durable: bool,
    /// Deleted when its last consumer goes.
    pub auto_delete: bool,
    /// Owned by one connection.
    pub exclusive: bool,
    /// The queue type (`classic`, `quorum`), as the API's `type` shows it.
    pub kind: &'static str,
    /// Declared arguments as JSON.
    pub arguments: Map<String, Value>,
    /// Ready messages.
    pub ready: u64,
    /// Delivered, not yet acknowledged messages.
    pub unacked: u64,
    /// Consumers.
    pub consumers: u64,
    /// Messages delivered to consumers since the queue was created.
    pub deliveries: u64,
    /// Body bytes of the ready messages.
    pub ready_bytes: u64,
    /// Ready messages paged out to the queue's spill file, their bodies on disk only
    /// (RabbitMQ's `messages_paged_out`).
    pub paged_out: u64,
    /// Message counts since the queue was created (`deliver` counts every delivery to a
    /// consumer, acknowledging or not).
    pub stats: MessageStats,
    /// The policy and operator policy that apply.
    pub policy: Arc<warren_broker::policy::Applied>,
    /// Bytes the queue holds in memory, estimated (see `warren_broker::Queue::memory`).
    pub memory: u64,
    /// Tells this queue from any other, including one declared later under the same name
    /// or at the same address (see [`queue_ident`]): what its rate samples are kept under.
    pub ident: u64,
    /// Where its replicas are (quorum queues).
    pub replicas: Option<warren_broker::Replicas>,
    /// The cluster node that holds it, for a classic queue held by another node.
    pub owner_node: Option<u64>,
}

/// A queue's counters and lengths for the rate sampler.
#[derive(Debug, Clone)]
pub struct QueueSample {
    /// See [`QueueInfo::ident`].
    pub ident: u64,
    /// The address of the queue's `Arc` (see [`Backend::sample_sources`]).
    pub addr: usize,
    /// Message counts since the queue was created.
    pub stats: MessageStats,
    /// Ready messages.
    pub ready: u64,
    /// Unacknowledged messages.
    pub unacked: u64,
}

/// A vhost's counters and its queues' lengths for the rate sampler.
#[derive(Debug, Clone, Default)]
pub struct VhostSample {
    /// Its name.
    pub name: String,
    /// Message counts since the start.
    pub stats: MessageStats,
    /// Ready messages in its queues.
    pub ready: u64,
    /// Unacknowledged messages in its queues.
    pub unacked: u64,
}

/// Everything the rate sampler reads in one sweep.
#[derive(Debug, Clone, Default)]
pub struct SampleSources {
    /// The node's message counts.
    pub node: MessageStats,
    /// Each vhost's message counts, and its queues' lengths.
    pub vhosts: Vec<VhostSample>,
    /// Each queue's, but for the queues that have counted nothing (no message, no
    /// counter above zero) and have no samples (see [`Backend::sample_sources`]).
    pub queues: Vec<QueueSample>,
    /// Each open channel's, by channel id.
    pub channels: Vec<(u64, MessageStats)>,
    /// Each exchange's that messages went through, by (vhost, name).
    pub exchanges: Vec<((String, String), ExchangeCounts)>,
    /// Connections, channels and queues created and closed since the start.
    pub churn: Churn,
    /// Each open connection's socket traffic, by connection id.
    pub connections: Vec<(u64, IoSnapshot)>,
    /// Each open channel's publishes per exchange: (channel id, vhost, exchange, counts).
    pub channel_exchanges: Vec<(u64, String, String, ExchangeCounts)>,
    /// Each open channel's deliveries per queue: (channel id, vhost, counts).
    pub channel_queues: Vec<(u64, String, QueueDeliveries)>,
    /// The node's resource use (memory, descriptors, sockets, threads, disk).
    pub resources: Option<crate::resources::NodeResources>,
}

/// An exchange as the API shows it.
#[derive(Debug, Clone)]
pub struct ExchangeInfo {
    /// Name (`""` for the default exchange).
    pub name: String,
    /// Virtual host.
    pub vhost: String,
    /// Type name (`direct`, `x-delayed-message`, ...).
    pub kind: String,
    /// Survives a restart.
    pub durable: bool,
    /// Deleted with its last binding.
    pub auto_delete: bool,
    /// Not publishable by clients.
    pub internal: bool,
    /// Declared arguments as JSON.
    pub arguments: Map<String, Value>,
    /// The policy and operator policy that apply.
    pub policy: Arc<warren_broker::policy::Applied>,
    /// Messages through it (none when nothing was published to it).
    pub stats: Option<ExchangeCounts>,
}

/// A binding as the API shows it.
#[derive(Debug, Clone)]
pub struct BindingInfo {
    /// Source exchange (`""` for the default exchange's implicit bindings).
    pub source: String,
    /// Virtual host.
    pub vhost: String,
    /// Destination queue or exchange.
    pub destination: String,
    /// `queue` or `exchange`.
    pub destination_type: &'static str,
    /// Binding key.
    pub routing_key: String,
    /// Binding arguments as JSON.
    pub arguments: Map<String, Value>,
}

/// A message taken by `POST /api/queues/v/q/get`.
#[derive(Debug, Clone)]
pub struct GotMessage {
    /// Exchange it was published to.
    pub exchange: String,
    /// Routing key it was published with.
    pub routing_key: String,
    /// Delivered before.
    pub redelivered: bool,
    /// Ready messages left in the queue after this one was taken.
    pub message_count: u64,
    /// Basic properties as RabbitMQ's management API shows them.
    pub properties: Map<String, Value>,
    /// The body.
    pub payload: Bytes,
}

/// What to do with the messages of a get (RabbitMQ's `ackmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    /// `ack_requeue_true`: put back, marked redelivered.
    AckRequeue,
    /// `ack_requeue_false`: acknowledged (gone).
    Ack,
    /// `reject_requeue_true`: rejected and put back.
    RejectRequeue,
    /// `reject_requeue_false`: rejected (dead-lettered where the queue says so).
    Reject,
}

/// The broker as the management API sees it.
#[derive(Clone)]
pub struct Backend {
    node: Arc<dyn Node>,
}

/// A refused declare, delete or bind as RabbitMQ's management API reports it: 404 for a
/// missing object, 401 "Access refused." for 403 ACCESS_REFUSED, else 400 with the reply
/// text (without its code).
pub(crate) fn broker_error(e: BrokerError) -> ApiError {
    match e.code {
        404 => ApiError::not_found(),
        403 => ApiError::access_refused(),
        _ => ApiError::bad_request(e.text),
    }
}

/// A refused publish, as RabbitMQ reports what its internal AMQP channel was closed with:
/// 400 with `<code> <CODE_NAME> - <text>` (e.g. `404 NOT_FOUND - no exchange 'x' in vhost
/// '/'`), or 401 for 403 ACCESS_REFUSED.
fn channel_error(e: BrokerError) -> ApiError {
    match e.code {
        403 => ApiError::not_authorised(e.reply_text()),
        _ => ApiError::bad_request(format!("{} {}", e.code, e.reply_text())),
    }
}

impl Backend {
    /// The backend of `node`.
    pub fn new(node: Arc<dyn Node>) -> Self {
        Backend { node }
    }

    /// The embedding server.
    pub fn node(&self) -> &dyn Node {
        &*self.node
    }

    fn broker(&self) -> &warren_broker::Broker {
        self.node.broker()
    }

    /// The message store's counters (see [`StoreStats`]); `None` for a broker that keeps
    /// everything in memory (no data directory).
    pub fn store_stats(&self) -> Option<StoreStats> {
        self.broker().store().map(|s| s.stats())
    }

    // ---- users and permissions -------------------------------------------------------

    /// Checks a basic-auth login from `peer` against the access-control database, with the
    /// loopback rule ([`Node::loopback_users`]).
    pub fn login(
        &self,
        name: &str,
        password: &str,
        peer: SocketAddr,
    ) -> Result<UserInfo, LoginError> {
        let loopback_users = self.node.loopback_users();
        let source = warren_broker::LoginSource {
            from_loopback: peer.ip().is_loopback(),
            loopback_users: &loopback_users,
        };
        let credentials = warren_broker::Credentials::Password {
            user: name,
            password,
        };
        match self.broker().login(credentials, source) {
            Ok(u) => Ok(UserInfo {
                name: u.user,
                tags: u.tags.iter().map(|t| t.to_string()).collect(),
                password_hash: String::new(),
                hashing_algorithm: String::new(),
                limits: Map::new(),
            }),
            Err(warren_broker::LoginRefused::NotLoopback(_)) => Err(LoginError::NotLoopback),
            Err(_) => Err(LoginError::BadCredentials),
        }
    }

    /// Every user, by name.
    pub fn users(&self) -> Vec<UserInfo> {
        let access = self.broker().access();
        let mut out: Vec<UserInfo> = access
            .users()
            .map(|u| UserInfo {
                name: u.name.clone(),
                tags: u.tags.iter().map(|t| t.to_string()).collect(),
                password_hash: u.password.to_base64(),
                hashing_algorithm: u.password.algorithm.module_name().to_string(),
                limits: user_limits_json(&u.limits),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The vhosts `user` may use: those where it has permissions.
    pub fn user_vhosts(&self, user: &str) -> Vec<String> {
        let access = self.broker().access();
        self.vhosts()
            .into_iter()
            .filter(|v| access.has_vhost_access(user, v))
            .collect()
    }

    /// Permissions as (user, vhost, configure, write, read) regexes, sorted.
    pub fn permissions(&self) -> Vec<(String, String, String, String, String)> {
        use warren_broker::access::Permission;
        let access = self.broker().access();
        let mut out: Vec<_> = access
            .all_permissions()
            .map(|(user, vhost, p)| {
                (
                    user.to_string(),
                    vhost.to_string(),
                    p.pattern(Permission::Configure).source().to_string(),
                    p.pattern(Permission::Write).source().to_string(),
                    p.pattern(Permission::Read).source().to_string(),
                )
            })
            .collect();
        out.sort();
        out
    }

    // ---- connections and channels (the broker's read model) --------------------------

    /// Every open connection, oldest first.
    pub fn connections(&self) -> Vec<ConnectionSnapshot> {
        self.broker().registry().connections()
    }

    /// Every open channel (of the connection named `connection` only, with one).
    pub fn channels(&self, connection: Option<&str>) -> Vec<ChannelSnapshot> {
        self.broker().registry().channels(connection)
    }

    /// Open channels, counted without reading them.
    pub fn channel_count(&self) -> usize {
        self.broker().registry().channel_count()
    }

    /// True when `user` may see a connection (or channel) of `owner`: its owner, monitoring
    /// and administrator users (the operations layer's `ConnectionView`).
    pub fn may_view_connection(&self, user: &UserInfo, owner: &str) -> bool {
        let actor = self.actor(user, "/");
        Admin::new(self.broker(), &actor)
            .may_view_connection(owner)
            .is_ok()
    }

    /// Closes the connection named `name` with 320 CONNECTION_FORCED and `reason`, as `user`
    /// (its owner or an administrator). Errors: 404, or 401 "User not authorised to access
    /// object".
    pub fn close_connection(
        &self,
        user: &UserInfo,
        name: &str,
        reason: &str,
    ) -> Result<(), ApiError> {
        self.admin(user, |a| a.close_connection(name, reason))
    }

    // ---- operators' writes: vhosts, users, permissions ------------------------------
    //
    // They store the access-control database (an fsync) and a vhost delete waits for the
    // definitions writer: the API calls them on a blocking thread.

    /// Runs `f` with `user`'s broker-wide operations, mapping refusals to RabbitMQ's
    /// replies: 404, 401 with the management refusal's reason, 500 for a store failure,
    /// else 400.
    fn admin<R>(
        &self,
        user: &UserInfo,
        f: impl FnOnce(Admin<'_>) -> Result<R, BrokerError>,
    ) -> Result<R, ApiError> {
        let actor = self.actor(user, "/");
        f(Admin::new(self.broker(), &actor)).map_err(|e| match e.code {
            404 => ApiError::not_found(),
            403 => ApiError::not_authorised(e.text),
            541 => ApiError::internal(e.text),
            _ => ApiError::bad_request(e.text),
        })
    }

    /// Creates (true) or updates (false) vhost `name`; a new vhost gives its creator full
    /// permissions on it, as RabbitMQ does. Errors: 400 for a `default_queue_type` other than
    /// classic, quorum or stream.
    pub fn put_vhost(
        &self,
        user: &UserInfo,
        name: &str,
        description: Option<String>,
        tags: Option<Vec<String>>,
        default_queue_type: Option<String>,
    ) -> Result<bool, ApiError> {
        let old = self.broker().access().vhost(name).cloned();
        let mut record = old.unwrap_or_else(|| VhostRecord::new(name));
        if let Some(d) = description {
            record.description = d;
        }
        if let Some(t) = tags {
            record.tags = t;
        }
        if let Some(t) = &default_queue_type {
            // RabbitMQ's queue types (rabbit_vhost:default_queue_type validation).
            if !matches!(t.as_str(), "classic" | "quorum" | "stream") {
                return Err(ApiError::bad_request(format!(
                    "unsupported default queue type '{t}' (classic, quorum or stream)"
                )));
            }
            record.default_queue_type = default_queue_type;
        }
        let created = self.admin(user, |a| a.put_vhost(record))?;
        if created {
            // As RabbitMQ (rabbit_vhost:put_vhost, maybe_grant_full_permissions): the user who
            // created the vhost may use it at once.
            let full = Permissions::new(".*", ".*", ".*")
                .map_err(|e| ApiError::internal(e.to_string()))?;
            self.admin(user, |a| a.set_permissions(&user.name, name, full))?;
        }
        Ok(created)
    }

    /// Deletes vhost `name` with everything in it, closing its connections.
    pub fn delete_vhost(&self, user: &UserInfo, name: &str) -> Result<(), ApiError> {
        self.admin(user, |a| a.delete_vhost(name))
    }

    /// Creates (true) or replaces (false) user `name` with `password` (a
    /// [`PasswordHash`]) and `tags`.
    pub fn put_user(
        &self,
        user: &UserInfo,
        name: &str,
        password: PasswordHash,
        tags: Vec<UserTag>,
    ) -> Result<bool, ApiError> {
        let record = UserRecord {
            name: name.to_string(),
            password,
            tags,
            limits: Default::default(),
        };
        self.admin(user, |a| a.put_user(record))
    }

    /// Deletes user `name`, closing its connections.
    pub fn delete_user(&self, user: &UserInfo, name: &str) -> Result<(), ApiError> {
        self.admin(user, |a| a.delete_user(name))
    }

    /// Sets permissions of `who` in `vhost`; true when there were none.
    pub fn set_permissions(
        &self,
        user: &UserInfo,
        vhost: &str,
        who: &str,
        configure: &str,
        write: &str,
        read: &str,
    ) -> Result<bool, ApiError> {
        let perms = Permissions::new(configure, write, read)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        self.admin(user, |a| a.set_permissions(who, vhost, perms))
    }

    /// Clears permissions of `who` in `vhost`.
    pub fn clear_permissions(
        &self,
        user: &UserInfo,
        vhost: &str,
        who: &str,
    ) -> Result<(), ApiError> {
        self.admin(user, |a| a.clear_permissions(who, vhost))
    }

    /// Sets topic permissions of `who` on `exchange` in `vhost`.
    pub fn set_topic_permissions(
        &self,
        user: &UserInfo,
        vhost: &str,
        who: &str,
        exchange: &str,
        write: &str,
        read: &str,
    ) -> Result<(), ApiError> {
        self.admin(user, |a| {
            a.set_topic_permissions(who, vhost, exchange, write, read)
        })
    }

    /// Clears topic permissions of `who` in `vhost` (on `exchange` only, with one).
    pub fn clear_topic_permissions(
        &self,
        user: &UserInfo,
        vhost: &str,
        who: &str,
        exchange: Option<&str>,
    ) -> Result<(), ApiError> {
        self.admin(user, |a| a.clear_topic_permissions(who, vhost, exchange))
    }

    /// Topic permissions as (user, vhost, exchange, write, read), sorted.
    pub fn topic_permissions(&self) -> Vec<(String, String, String, String, String)> {
        let access = self.broker().access();
        let mut out: Vec<_> = access
            .all_topic_permissions()
            .map(|(user, vhost, t)| {
                (
                    user.to_string(),
                    vhost.to_string(),
                    t.exchange().to_string(),
                    t.write_source().to_string(),
                    t.read_source().to_string(),
                )
            })
            .collect();
        out.sort();
        out
    }

    /// Message counts of `vhost` over its channels, open and closed.
    pub fn vhost_stats(&self, vhost: &str) -> MessageStats {
        self.broker().registry().vhost_stats(vhost)
    }

    /// Message counts of the node since it started.
    pub fn global_stats(&self) -> MessageStats {
        self.broker().registry().global_stats()
    }

    /// Connections, channels and queues created and closed since the node started.
    pub fn churn(&self) -> Churn {
        self.broker().registry().churn().snapshot()
    }

    /// What the rate sampler reads: the registry's counters (atomics, no channel asked)
    /// and the counts of each queue that may hold messages or have counted any (its lock held
    /// for that read only; `warren_broker::VHost::used_queues`: a queue that never held a
    /// message is not visited, so that idle queues cost the sampler nothing). A queue that
    /// has counted nothing (no counter above zero, no message) is left out unless the
    /// address of its `Arc` is in `sampled` (the queues with samples: it had messages).
    pub fn sample_sources(&self, sampled: &std::collections::HashSet<usize>) -> SampleSources {
        let registry = self.broker().registry();
        let (per_vhost, node) = registry.all_stats();
        let mut out = SampleSources {
            node,
            churn: registry.churn().snapshot(),
            exchanges: registry.exchange_stats().into_iter().collect(),
            channels: registry
                .channel_counters()
                .into_iter()
                .map(|(id, _, s)| (id, s))
                .collect(),
            connections: registry.connection_io(),
            channel_exchanges: registry.channel_exchange_counts(),
            channel_queues: registry.channel_deliveries(),
            resources: Some(crate::resources::NodeResources::read(self.node())),
            ..SampleSources::default()
        };
        for v in self.vhost_list(None) {
            let mut vs = VhostSample {
                name: v.name.to_string(),
                stats: per_vhost.get(&*v.name).copied().unwrap_or_default(),
                ..VhostSample::default()
            };
            for q in v.used_queues() {
                let c = q.counts();
                let (ready, unacked) = (u64::from(c.ready), u64::from(c.unacked));
                vs.ready += ready;
                vs.unacked += unacked;
                let stats = queue_stats(&*q);
                let addr = Arc::as_ptr(&q) as *const () as usize;
                // A queue that has counted nothing has no samples (see `crate::rates`).
                if ready == 0
                    && unacked == 0
                    && stats == MessageStats::default()
                    && !sampled.contains(&addr)
                {
                    continue;
                }
                out.queues.push(QueueSample {
                    ident: queue_ident(&q),
                    addr,
                    stats,
                    ready,
                    unacked,
                });
            }
            out.vhosts.push(vs);
        }
        out
    }

    // ---- runtime parameters ------------------------------------------------------------

    /// Every vhost-scoped runtime parameter as RabbitMQ's `rabbit_runtime_parameters:list()`
    /// gives them (policies left out, operator policies in), each
    /// `{"vhost", "component", "name", "value"}`: `vhost-limits`/`limits` for each vhost with
    /// limits, `operator_policy` for each operator policy. With `component`, only its;
    /// `policy` lists the policies (as RabbitMQ does when asked for that component).
    pub fn runtime_parameters(&self, component: Option<&str>) -> Vec<Value> {
        let want = |c: &str| component.is_none_or(|x| x == c);
        let mut out = Vec::new();
        if want(warren_broker::definitions::VHOST_LIMITS_COMPONENT) {
            let access = self.broker().access();
            let mut limited: Vec<&VhostRecord> = access
                .vhosts()
                .filter(|v| v.limits != warren_broker::access::VhostLimits::default())
                .collect();
            limited.sort_by(|a, b| a.name.cmp(&b.name));
            for v in limited {
                out.push(serde_json::json!({
                    "vhost": v.name,
                    "component": warren_broker::definitions::VHOST_LIMITS_COMPONENT,
                    "name": "limits",
                    "value": vhost_limits_json(&v.limits),
                }));
            }
        }
        for (c, operator) in [("operator_policy", true), ("policy", false)] {
            // `policy` only when asked for by name, as rabbit_runtime_parameters:list/2.
            if !(want(c) && (operator || component == Some(c))) {
                continue;
            }
            for v in self.vhost_list(None) {
                for p in v.policies(operator) {
                    let mut value = p.to_json();
                    if let Value::Object(m) = &mut value {
                        m.remove("name");
                    }
                    out.push(serde_json::json!({
                        "vhost": v.name, "component": c, "name": p.name, "value": value,
                    }));
                }
            }
        }
        out
    }

    /// The global runtime parameters, `{"name", "value"}` each, by name.
    pub fn global_parameters(&self) -> Vec<Value> {
        self.broker()
            .access()
            .global_parameters()
            .map(|(name, value)| serde_json::json!({"name": name, "value": value}))
            .collect()
    }

    /// Global runtime parameter `name`'s value.
    pub fn global_parameter(&self, name: &str) -> Option<Value> {
        self.broker().access().global_parameter(name).cloned()
    }

    /// The limits of user `name`, `None` when there is no such user.
    pub fn user_limits(&self, name: &str) -> Option<warren_broker::access::UserLimits> {
        self.broker().access().user(name).map(|u| u.limits)
    }

    /// Replaces user `who`'s limits as `user` (administrators). Errors: 404 unknown user,
    /// 401, 500 (not stored).
    pub fn set_user_limits(
        &self,
        user: &UserInfo,
        who: &str,
        limits: warren_broker::access::UserLimits,
    ) -> Result<(), ApiError> {
        self.admin(user, |a| a.set_user_limits(who, limits))
    }

    /// Sets vhost `vhost`'s limits as `user` (the `vhost-limits` parameter); true when it had
    /// none. Errors: 404, 401 (not a policymaker of the vhost), 500 (not stored).
    pub fn set_vhost_limits(
        &self,
        user: &UserInfo,
        vhost: &str,
        limits: warren_broker::access::VhostLimits,
    ) -> Result<bool, ApiError> {
        self.admin(user, |a| a.set_vhost_limits(vhost, limits))
    }

    /// Clears vhost `vhost`'s limits as `user`. Errors: as [`Backend::set_vhost_limits`],
    /// 404 when it has none.
    pub fn clear_vhost_limits(&self, user: &UserInfo, vhost: &str) -> Result<(), ApiError> {
        self.admin(user, |a| a.clear_vhost_limits(vhost))
    }

    /// Sets global parameter `name` as `user`; true when it was not set. Errors: 401 (not a
    /// policymaker), 500 (not stored).
    pub fn set_global_parameter(
        &self,
        user: &UserInfo,
        name: &str,
        value: Value,
    ) -> Result<bool, ApiError> {
        self.admin(user, |a| a.set_global_parameter(name, value))
    }

    /// Clears global parameter `name` as `user`. Errors: 404 when it is not set, else as
    /// [`Backend::set_global_parameter`].
    pub fn clear_global_parameter(&self, user: &UserInfo, name: &str) -> Result<(), ApiError> {
        self.admin(user, |a| a.clear_global_parameter(name))
    }

    // ---- topology reads --------------------------------------------------------------

    /// Every vhost name, sorted.
    pub fn vhosts(&self) -> Vec<String> {
        let mut v = self.broker().vhost_names();
        v.sort();
        v
    }

    /// Vhost `name`'s metadata (description, tags, default queue type, limits), if the
    /// access-control database has it.
    pub fn vhost_record(&self, name: &str) -> Option<VhostRecord> {
        self.broker().access().vhost(name).cloned()
    }

    /// True when vhost `name` exists.
    pub fn vhost_exists(&self, name: &str) -> bool {
        self.broker().vhost(name).is_some()
    }

    fn vhost_list(&self, vhost: Option<&str>) -> Vec<Arc<warren_broker::VHost>> {
        match vhost {
            Some(v) => self.broker().vhost(v).into_iter().collect(),
            None => self
                .vhosts()
                .iter()
                .filter_map(|v| self.broker().vhost(v))
                .collect(),
        }
    }

    /// Queues of `vhost` (every vhost when `None`).
    pub fn queues(&self, vhost: Option<&str>) -> Vec<QueueInfo> {
        let mut out = Vec::new();
        for v in self.vhost_list(vhost) {
            for q in v.queues() {
                if !q.is_deleted() {
                    out.push(queue_info(&q));
                }
            }
        }
        out
    }

    /// Queue `name` of `vhost`, without reading every other queue of the vhost.
    pub fn queue(&self, vhost: &str, name: &str) -> Option<QueueInfo> {
        let v = self.broker().vhost(vhost)?;
        let q = v.queues().into_iter().find(|q| q.name() == name)?;
        (!q.is_deleted()).then(|| queue_info(&q))
    }

    /// Exchanges of `vhost` (every vhost when `None`).
    pub fn exchanges(&self, vhost: Option<&str>) -> Vec<ExchangeInfo> {
        let mut out = Vec::new();
        let stats = self.broker().registry().exchange_stats();
        for v in self.vhost_list(vhost) {
            for x in v.exchange_snapshots() {
                let stats = stats.get(&(v.name.to_string(), x.name.clone())).copied();
                out.push(ExchangeInfo {
                    name: x.name,
                    vhost: v.name.to_string(),
                    kind: x.kind.as_str().to_string(),
                    durable: x.durable,
                    auto_delete: x.auto_delete,
                    internal: x.internal,
                    arguments: table_to_json(&x.arguments),
                    policy: x.policy,
                    stats,
                });
            }
        }
        out
    }

    /// Bindings of `vhost` (every vhost when `None`), the default exchange's implicit
    /// binding to each queue included, as RabbitMQ lists them.
    pub fn bindings(&self, vhost: Option<&str>) -> Vec<BindingInfo> {
        let mut out = Vec::new();
        for v in self.vhost_list(vhost) {
            let mut queues: Vec<String> = v.queues().iter().map(|q| q.name().to_string()).collect();
            queues.sort();
            for q in queues {
                out.push(BindingInfo {
                    source: String::new(),
                    vhost: v.name.to_string(),
                    destination: q.clone(),
                    destination_type: "queue",
                    routing_key: q,
                    arguments: Map::new(),
                });
            }
            let mut xs = v.exchange_snapshots();
            xs.sort_by(|a, b| a.name.cmp(&b.name));
            for x in xs {
                for b in &x.bindings {
                    let (destination, destination_type) = match &b.destination {
                        Destination::Queue(q) => (q.to_string(), "queue"),
                        Destination::Exchange(e) => (e.to_string(), "exchange"),
                    };
                    out.push(BindingInfo {
                        source: x.name.clone(),
                        vhost: v.name.to_string(),
                        destination,
                        destination_type,
                        routing_key: b.routing_key.clone(),
                        arguments: table_to_json(&b.arguments),
                    });
                }
            }
        }
        out
    }

    /// The `parameters` of a definitions export, as rabbit_definitions: every runtime
    /// parameter but policies (`vhost-limits`, `operator_policy`).
    fn definition_parameters(&self) -> Vec<Value> {
        self.runtime_parameters(None)
    }

    /// Every vhost's policies in RabbitMQ's definitions format (with `vhost`).
    fn policies_json(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for v in self.vhost_list(None) {
            for p in v.policies(false) {
                let mut j = p.to_json();
                if let Value::Object(m) = &mut j {
                    m.insert("vhost".into(), Value::from(&*v.name));
                }
                out.push(j);
            }
        }
        out
    }

    // ---- writes ------------------------------------------------------------------------

    fn vhost(&self, name: &str) -> Result<Arc<warren_broker::VHost>, ApiError> {
        self.broker().vhost(name).ok_or_else(ApiError::not_found)
    }

    /// The actor of a request by `user` in `vhost`: every write goes through the broker's
    /// operations layer with it, so that the user's configure / write / read permissions and
    /// topic permissions are checked exactly as for AMQP.
    pub(crate) fn actor(&self, user: &UserInfo, vhost: &str) -> Actor {
        let tags: Vec<warren_broker::access::UserTag> = self
            .broker()
            .access()
            .user(&user.name)
            .map(|u| u.tags.clone())
            .unwrap_or_default();
        Actor::new(user.name.as_str(), tags, vhost, API_CONNECTION, None)
    }

    /// Declares queue `name`; true when it was created, false when an equivalent one
    /// existed. Errors: 404 (no vhost), 400 with the broker's reason (inequivalent,
    /// invalid arguments, reserved name, exclusive to a client).
    pub fn declare_queue(
        &self,
        user: &UserInfo,
        vhost: &str,
        name: &str,
        durable: bool,
        auto_delete: bool,
        arguments: &Map<String, Value>,
    ) -> Result<bool, ApiError> {
        let v = self.vhost(vhost)?;
        let existed = v.queue(name, API_CONNECTION).is_ok();
        let d = QueueDeclare {
            name: name.to_string(),
            passive: false,
            durable,
            exclusive: false,
            auto_delete,
            arguments: args(arguments)?,
        };
        let actor = self.actor(user, vhost);
        Ops::new(self.broker(), &v, &actor)
            .declare_queue(&d)
            .map_err(broker_error)?;
        Ok(!existed)
    }

    /// Deletes queue `name`. Errors: 404 when it does not exist, 400 for `if_unused` /
    /// `if_empty` refusals.
    pub fn delete_queue(
        &self,
        user: &UserInfo,
        vhost: &str,
        name: &str,
        if_unused: bool,
        if_empty: bool,
    ) -> Result<(), ApiError> {
        let v = self.vhost(vhost)?;
        v.queue(name, API_CONNECTION).map_err(broker_error)?;
        let actor = self.actor(user, vhost);
        Ops::new(self.broker(), &v, &actor)
            .delete_queue(name, if_unused, if_empty)
            .map_err(broker_error)?;
        Ok(())
    }

    /// Purges queue `name`; returns how many messages went.
    pub fn purge_queue(&self, user: &UserInfo, vhost: &str, name: &str) -> Result<u64, ApiError> {
        let v = self.vhost(vhost)?;
        let actor = self.actor(user, vhost);
        Ok(Ops::new(self.broker(), &v, &actor)
            .purge_queue(name)
            .map_err(broker_error)?
            .into())
    }

    /// Declares exchange `x.name` in `x.vhost`; true when it was created. Errors: 404 (no
    /// vhost), 400 with the broker's reason (inequivalent, unknown type, reserved name).
    pub fn declare_exchange(&self, user: &UserInfo, x: &ExchangeInfo) -> Result<bool, ApiError> {
        let v = self.vhost(&x.vhost)?;
        let existed = v.exchange_exists(&x.name);
        let d = ExchangeDeclare {
            name: x.name.clone(),
            kind: x.kind.clone(),
            passive: false,
            durable: x.durable,
            auto_delete: x.auto_delete,
            internal: x.internal,
            arguments: args(&x.arguments)?,
        };
        let actor = self.actor(user, &x.vhost);
        Ops::new(self.broker(), &v, &actor)
            .declare_exchange(&d)
            .map_err(broker_error)?;
        Ok(!existed)
    }

    /// Deletes exchange `name`. Errors: 404 when missing, 400 for `if_unused` and the
    /// standard exchanges.
    pub fn delete_exchange(
        &self,
        user: &UserInfo,
        vhost: &str,
        name: &str,
        if_unused: bool,
    ) -> Result<(), ApiError> {
        let v = self.vhost(vhost)?;
        if !v.exchange_exists(name) {
            return Err(ApiError::not_found());
        }
        let actor = self.actor(user, vhost);
        Ops::new(self.broker(), &v, &actor)
            .delete_exchange(name, if_unused)
            .map_err(broker_error)
    }

    /// Binds `destination` (a queue when `to_queue`, else an exchange) to `source`.
    // One argument per field of RabbitMQ's binding path and body.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        &self,
        user: &UserInfo,
        vhost: &str,
        source: &str,
        destination: &str,
        to_queue: bool,
        routing_key: &str,
        arguments: &Map<String, Value>,
    ) -> Result<(), ApiError> {
        let v = self.vhost(vhost)?;
        let d = if to_queue {
            Destination::Queue(destination.into())
        } else {
            Destination::Exchange(destination.into())
        };
        let actor = self.actor(user, vhost);
        Ops::new(self.broker(), &v, &actor)
            .bind(source, d, routing_key, &args(arguments)?)
            .map_err(broker_error)
    }

    /// Removes a binding.
    // One argument per field of RabbitMQ's binding path and body.
    #[allow(clippy::too_many_arguments)]
    pub fn unbind(
        &self,
        user: &UserInfo,
        vhost: &str,
        source: &str,
        destination: &str,
        to_queue: bool,
        routing_key: &str,
        arguments: &Map<String, Value>,
    ) -> Result<(), ApiError> {
        let v = self.vhost(vhost)?;
        let d = if to_queue {
            Destination::Queue(destination.into())
        } else {
            Destination::Exchange(destination.into())
        };
        let actor = self.actor(user, vhost);
        Ops::new(self.broker(), &v, &actor)
            .unbind(source, d, routing_key, &args(arguments)?)
            .map_err(broker_error)
    }

    /// Publishes a message through `exchange`; true when it reached a queue.
    pub async fn publish(
        &self,
        user: &UserInfo,
        vhost: &str,
        exchange: &str,
        routing_key: &str,
        properties: &Map<String, Value>,
        payload: Bytes,
    ) -> Result<bool, ApiError> {
        let v = self.vhost(vhost)?;
        let props = properties_from_json(properties)?;
        // The same nesting bound as AMQP's decoder, checked the way it counts.
        let mut encoded = bytes::BytesMut::new();
        props.encode(&mut encoded);
        if let Err(e) = BasicProperties::decode(&encoded, self.node.max_table_depth()) {
            return Err(ApiError::bad_request(format!("invalid properties: {e}")));
        }
        let (done, stored) = store_ack();
        // Routed and stored here; the operations (not Send) end before the wait below.
        let published = {
            let actor = self.actor(user, vhost);
            let ops = Ops::new(self.broker(), &v, &actor);
            let mut grant = warren_broker::ops::PublishGrant::default();
            let check = ops
                .check_publish(exchange, &mut grant)
                .map_err(channel_error)?;
            let msg = ops
                .prepare_message(
                    check,
                    exchange.to_string(),
                    routing_key.to_string(),
                    props,
                    payload,
                    None,
                )
                .map_err(channel_error)?;
            match ops.publish(msg, Some((done, 0))) {
                Ok(p) => p,
                Err(warren_broker::PublishError::Broker(e)) => return Err(channel_error(e)),
                Err(e) => return Err(ApiError::bad_request(e.to_string())),
            }
        };
        // As RabbitMQ's management plugin publishes with confirms: the reply waits until a
        // persistent message routed to durable queues is on disk.
        if published.stored && !stored.await.unwrap_or(false) {
            return Err(ApiError::internal(
                "the message store could not write the message",
            ));
        }
        Ok(published.routed && !published.rejected)
    }

    /// Takes up to `count` messages from queue `name`, settling them as `mode` says once
    /// all are taken (so that requeued messages are not taken twice).
    pub fn get(
        &self,
        user: &UserInfo,
        vhost: &str,
        name: &str,
        count: usize,
        mode: AckMode,
    ) -> Result<Vec<GotMessage>, ApiError> {
        let v = self.vhost(vhost)?;
        let actor = self.actor(user, vhost);
        let ops = Ops::new(self.broker(), &v, &actor);
        ops.authorize(&warren_broker::access::Operation::BasicGet { queue: name })
            .map_err(broker_error)?;
        let q = v.queue(name, API_CONNECTION).map_err(broker_error)?;
        let mut taken = Vec::new();
        let mut out = Vec::new();
        for _ in 0..count {
            let Some((m, remaining)) = q.get(false) else {
                break;
            };
            out.push(GotMessage {
                exchange: m.message.exchange.clone(),
                routing_key: m.message.routing_key.clone(),
                redelivered: m.redelivered,
                message_count: remaining.into(),
                properties: properties_to_json(&m.message.properties),
                payload: m.message.body.clone(),
            });
            taken.push(m);
        }
        let (requeue, rejected) = match mode {
            AckMode::AckRequeue | AckMode::RejectRequeue => (true, false),
            AckMode::Ack => (false, false),
            AckMode::Reject => (false, true),
        };
        let settlements = taken
            .into_iter()
            .map(|message| Settlement {
                consumer_tag: None,
                message,
                requeue,
                rejected,
            })
            .collect();
        q.settle(API_CONNECTION, settlements);
        Ok(out)
    }

    /// The definitions of the whole broker in RabbitMQ's export shape
    /// (`GET /api/definitions`): users (with RabbitMQ SHA-256 password hashes, so that the
    /// file imports into RabbitMQ with working logins), vhosts, permissions, queues (not the
    /// exclusive ones),
    /// exchanges (the standard ones left out, as RabbitMQ does) and bindings.
    pub fn definitions(&self, rabbit_version: &str, cluster_name: &str) -> Value {
        let users: Vec<Value> = self
            .users()
            .into_iter()
            .map(|u| {
                serde_json::json!({
                    "name": u.name,
                    "password_hash": u.password_hash,
                    "hashing_algorithm": u.hashing_algorithm,
                    "tags": u.tags,
                    "limits": u.limits,
                })
            })
            .collect();
        let vhosts: Vec<Value> = self
            .vhosts()
            .into_iter()
            .map(|v| {
                let r = self
                    .vhost_record(&v)
                    .unwrap_or_else(|| VhostRecord::new(v.as_str()));
                // RabbitMQ 4's vhost entry (the fields rabbit_mgmt_wm_definitions keeps),
                // the default queue type always given. The limits are exported as the
                // `vhost-limits` parameters, where RabbitMQ's import reads them.
                let queue_type = r.default_queue_type.as_deref().unwrap_or("classic");
                serde_json::json!({
                    "name": v,
                    "description": r.description,
                    "tags": r.tags,
                    "default_queue_type": queue_type,
                    "metadata": {
                        "description": r.description,
                        "tags": r.tags,
                        "default_queue_type": queue_type,
                    },
                })
            })
            .collect();
        let permissions: Vec<Value> = self
            .permissions()
            .into_iter()
            .map(|(user, vhost, configure, write, read)| {
                serde_json::json!({"user": user, "vhost": vhost, "configure": configure, "write": write, "read": read})
            })
            .collect();
        let topic_permissions: Vec<Value> = self
            .topic_permissions()
            .into_iter()
            .map(|(user, vhost, exchange, write, read)| {
                serde_json::json!({"user": user, "vhost": vhost, "exchange": exchange,
                    "write": write, "read": read})
            })
            .collect();
        let queues: Vec<Value> = self
            .queues(None)
            .into_iter()
            .filter(|q| !q.exclusive)
            .map(|q| {
                serde_json::json!({"name": q.name, "vhost": q.vhost, "durable": q.durable,
                    "auto_delete": q.auto_delete, "arguments": q.arguments})
            })
            .collect();
        let exchanges: Vec<Value> = self
            .exchanges(None)
            .into_iter()
            .filter(|x| !x.name.is_empty() && !x.name.starts_with("amq."))
            .map(|x| {
                serde_json::json!({"name": x.name, "vhost": x.vhost, "type": x.kind,
                    "durable": x.durable, "auto_delete": x.auto_delete, "internal": x.internal,
                    "arguments": x.arguments})
            })
            .collect();
        let bindings: Vec<Value> = self
            .bindings(None)
            .into_iter()
            .filter(|b| !b.source.is_empty())
            .map(|b| {
                serde_json::json!({"source": b.source, "vhost": b.vhost,
                    "destination": b.destination, "destination_type": b.destination_type,
                    "routing_key": b.routing_key, "arguments": b.arguments})
            })
            .collect();
        serde_json::json!({
            "rabbit_version": rabbit_version,
            "rabbitmq_version": rabbit_version,
            "product_name": "Warren",
            "product_version": env!("CARGO_PKG_VERSION"),
            "rabbitmq_definition_format": "cluster",
            "original_cluster_name": cluster_name,
            "explanation": format!("Definitions of cluster '{cluster_name}'"),
            "users": users,
            "vhosts": vhosts,
            "permissions": permissions,
            "topic_permissions": topic_permissions,
            "parameters": self.definition_parameters(),
            "global_parameters": self
                .global_parameters()
                .into_iter()
                .filter(|g| !g["name"].as_str().is_some_and(|n| n.starts_with("internal")))
                .collect::<Vec<Value>>(),
            "policies": self.policies_json(),
            "queues": queues,
            "exchanges": exchanges,
            "bindings": bindings,
        })
    }

    /// The definitions of vhost `vhost` in RabbitMQ's per-vhost export shape
    /// (`GET /api/definitions/{vhost}`): its policies, queues, exchanges and bindings, without
    /// `vhost` fields, and no users, vhosts or permissions, as `rabbit_definitions` exports a
    /// vhost. `None` when the vhost does not exist.
    pub fn vhost_definitions(&self, vhost: &str, rabbit_version: &str) -> Option<Value> {
        if !self.vhost_exists(vhost) {
            return None;
        }
        let all = self.definitions(rabbit_version, "");
        let entry = all["vhosts"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["name"] == vhost))
            .cloned()
            .unwrap_or_default();
        let of_vhost = |key: &str| -> Value {
            Value::Array(
                all[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|o| o["vhost"] == vhost)
                    .map(|o| {
                        let mut o = o.clone();
                        if let Some(m) = o.as_object_mut() {
                            m.remove("vhost");
                        }
                        o
                    })
                    .collect(),
            )
        };
        Some(serde_json::json!({
            "rabbit_version": rabbit_version,
            "rabbitmq_version": rabbit_version,
            "product_name": "Warren",
            "product_version": env!("CARGO_PKG_VERSION"),
            "rabbitmq_definition_format": "single_virtual_host",
            "original_vhost_name": vhost,
            "explanation": format!("Definitions of virtual host '{vhost}'"),
            "metadata": entry["metadata"],
            "description": entry["description"],
            "default_queue_type": entry["default_queue_type"],
            "limits": self
                .vhost_record(vhost)
                .map(|r| vhost_limits_json(&r.limits))
                .unwrap_or_default(),
            "parameters": of_vhost("parameters"),
            "policies": of_vhost("policies"),
            "queues": of_vhost("queues"),
            "exchanges": of_vhost("exchanges"),
            "bindings": of_vhost("bindings"),
        }))
    }

    /// Imports the definitions file `text` (`POST /api/definitions`): the whole broker's, or,
    /// with `vhost`, one vhost's exchanges, queues, bindings and policies placed in it
    /// (`POST /api/definitions/{vhost}`). The file is parsed and checked whole first
    /// (400 with the reason, nothing applied), then applied through the operations layer
    /// ([`Admin::import_definitions`]).
    pub fn import_definitions(
        &self,
        user: &UserInfo,
        text: &[u8],
        vhost: Option<&str>,
    ) -> Result<AppliedImport, ApiError> {
        let text = std::str::from_utf8(text)
            .map_err(|_| ApiError::bad_request("the definitions are not UTF-8 text"))?;
        let defs =
            Definitions::from_json(text).map_err(|e| ApiError::bad_request(e.to_string()))?;
        let plan = match vhost {
            None => plan_import(&defs),
            Some(v) => plan_vhost_import(&defs, v),
        }
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
        self.admin(user, |a| a.import_definitions(&plan))
    }
}

fn args(object: &Map<String, Value>) -> Result<FieldTable, ApiError> {
    json_to_table(object).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Basic properties from the management API's JSON (`content_type`, `headers`,
/// `delivery_mode`, ...); unknown keys are refused with 400 as RabbitMQ does.
fn properties_from_json(p: &Map<String, Value>) -> Result<BasicProperties, ApiError> {
    let mut out = BasicProperties::default();
    let bad = |k: &str| ApiError::bad_request(format!("invalid value for property '{k}'"));
    for (k, v) in p {
        let text = || v.as_str().map(|s| s.into()).ok_or_else(|| bad(k));
        let int = || {
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .ok_or_else(|| bad(k))
        };
        match k.as_str() {
            "content_type" => out.content_type = Some(text()?),
            "content_encoding" => out.content_encoding = Some(text()?),
            "correlation_id" => out.correlation_id = Some(text()?),
            "reply_to" => out.reply_to = Some(text()?),
            "expiration" => out.expiration = Some(text()?),
            "message_id" => out.message_id = Some(text()?),
            "type" => out.kind = Some(text()?),
            "user_id" => out.user_id = Some(text()?),
            "app_id" => out.app_id = Some(text()?),
            "cluster_id" => out.cluster_id = Some(text()?),
            "delivery_mode" => out.delivery_mode = Some(u8::try_from(int()?).map_err(|_| bad(k))?),
            "priority" => out.priority = Some(u8::try_from(int()?).map_err(|_| bad(k))?),
            "timestamp" => out.timestamp = Some(int()?),
            "headers" => {
                let h = v.as_object().ok_or_else(|| bad(k))?;
                out.headers = Some(args(h)?);
            }
            _ => return Err(ApiError::bad_request(format!("[{{invalid_property,{k}}}]"))),
        }
    }
    Ok(out)
}

/// Basic properties as the management API shows them (only the properties that are set).
fn properties_to_json(p: &BasicProperties) -> Map<String, Value> {
    let mut m = Map::new();
    let mut s = |k: &str, v: &Option<warren_amqp::shortstr::ShortStr>| {
        if let Some(v) = v {
            m.insert(k.into(), Value::String(v.to_string_lossy().into_owned()));
        }
    };
    s("content_type", &p.content_type);
    s("content_encoding", &p.content_encoding);
    s("correlation_id", &p.correlation_id);
    s("reply_to", &p.reply_to);
    s("expiration", &p.expiration);
    s("message_id", &p.message_id);
    s("type", &p.kind);
    s("user_id", &p.user_id);
    s("app_id", &p.app_id);
    s("cluster_id", &p.cluster_id);
    if let Some(d) = p.delivery_mode {
        m.insert("delivery_mode".into(), d.into());
    }
    if let Some(d) = p.priority {
        m.insert("priority".into(), d.into());
    }
    if let Some(t) = p.timestamp {
        m.insert("timestamp".into(), t.into());
    }
    if let Some(h) = &p.headers {
        m.insert("headers".into(), Value::Object(table_to_json(h)));
    }
    m
}

/// What the management API shows of queue `q`.
fn queue_info(q: &Arc<warren_broker::Queue>) -> QueueInfo {
    let c = q.counts();
    QueueInfo {
        name: q.name().to_string(),
        vhost: q.vhost().to_string(),
        durable: q.durable(),
        auto_delete: q.auto_delete(),
        exclusive: q.exclusive_owner().is_some(),
        kind: q.kind(),
        arguments: table_to_json(q.arguments()),
        ready: c.ready.into(),
        unacked: c.unacked.into(),
        consumers: c.consumers.into(),
        deliveries: q.deliveries(),
        ready_bytes: q.ready_bytes(),
        paged_out: q.ready_in_memory_and_paged_out().1.into(),
        stats: queue_stats(q.as_ref()),
        policy: q.applied_policy(),
        memory: q.memory(),
        ident: queue_ident(q),
        replicas: q.replicas(),
        owner_node: q.owner_node(),
    }
}

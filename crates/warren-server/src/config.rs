//! Configuration: a TOML file, `WARREN_<SECTION>_<KEY>` environment overrides, then command-line
//! flags, in increasing order of precedence.
//!
//! Every limit the broker enforces is here, with RabbitMQ's default where RabbitMQ has one.
//! Every error names where the bad setting came from: the file (with line and column), the
//! environment variable, or the flag. Values that would leave the broker unable to serve
//! (a zero `max_message_size`, a zero fsync batch) are refused at start.

use crate::listen::ListenAddr;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// AMQP listener and protocol limits.
    pub amqp: AmqpConfig,
    /// Where data lives.
    pub storage: StorageConfig,
    /// Logging.
    pub log: LogConfig,
    /// Memory alarm.
    pub memory: MemoryConfig,
    /// Caps on what each vhost may hold.
    pub limits: LimitsConfig,
    /// The AMQPS listener and the TLS settings shared with the HTTP listeners.
    pub tls: crate::tls::TlsConfig,
    /// SASL mechanisms and login rules.
    pub auth: AuthConfig,
    /// A RabbitMQ definitions file imported at start.
    pub definitions: DefinitionsConfig,
    /// Users (`[[users]]`). When none is listed and no definitions file is loaded, the default
    /// `guest`/`guest` is created (with `.*` permissions on `/`; `loopback_users` keeps it to
    /// localhost).
    pub users: Vec<UserConfig>,
    /// Vhosts besides `/` (`[[vhosts]]`), with their limits.
    pub vhosts: Vec<VhostConfig>,
    /// Permissions (`[[permissions]]`). When none is listed, every user of `[[users]]` gets
    /// `.*` on `/`.
    pub permissions: Vec<PermissionConfig>,
    /// Topic permissions (`[[topic_permissions]]`).
    pub topic_permissions: Vec<TopicPermissionConfig>,
    /// The management HTTP API.
    pub management: ManagementConfig,
    /// The httpmq/httpsqs-compatible HTTP queue API.
    pub httpmq: HttpmqConfig,
    /// `[cluster]`: this node's place in a cluster of Warren nodes (quorum queues replicated
    /// over them). Absent, the broker runs alone.
    pub cluster: Option<ClusterConfig>,
}

/// `[cluster]`: a node of a Warren cluster. Quorum queues get members on the nodes of
/// `seed_nodes` (see the README's "Clustering"); nodes prove to each other that they know the
/// secret in `secret_file` (RabbitMQ's Erlang cookie) and never send it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// This node's id, at least 1, unique in the cluster and listed in `seed_nodes`.
    pub node_id: u64,
    /// Where this node listens for the other nodes (default `0.0.0.0:25672`, RabbitMQ's
    /// inter-node port), as `amqp.listen`.
    pub listen: ListenAddr,
    /// Every node of the cluster, this one included, as `ID@HOST:PORT` (the node's
    /// `listen` address as the others reach it). A list, or in the environment a
    /// comma-separated string.
    #[serde(deserialize_with = "string_list")]
    pub seed_nodes: Vec<String>,
    /// A file holding the shared secret (its content without surrounding whitespace, at
    /// least 16 bytes), the same on every node; readable by the broker only.
    pub secret_file: Option<PathBuf>,
    /// Inter-node connections over mutual TLS with the `[tls]` certificate, key and CA
    /// (RabbitMQ's inter-node TLS): each node presents its certificate and checks the other's
    /// against `tls.ca_file`, and the dialing node checks that the certificate names the host
    /// of the address it dialed. Default false: plain TCP (keep it on a private network).
    pub tls: bool,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            node_id: 0,
            listen: ListenAddr::Addr(std::net::SocketAddr::from(([0, 0, 0, 0], 25672))),
            seed_nodes: Vec::new(),
            secret_file: None,
            tls: false,
        }
    }
}

/// Shortest cluster secret accepted, bytes.
pub const MIN_CLUSTER_SECRET: usize = 16;

impl ClusterConfig {
    /// The nodes of `seed_nodes`: id -> `HOST:PORT`.
    ///
    /// Errors: an entry that is not `ID@HOST:PORT` with ID at least 1, or an id listed twice
    /// (the message names the entry).
    pub fn nodes(&self) -> Result<std::collections::BTreeMap<u64, String>, String> {
        let mut out = std::collections::BTreeMap::new();
        for entry in &self.seed_nodes {
            let bad = || format!("'{entry}' is not ID@HOST:PORT (e.g. 2@10.0.0.2:25672)");
            let (id, addr) = entry.split_once('@').ok_or_else(bad)?;
            let id: u64 = id.trim().parse().map_err(|_| bad())?;
            if id == 0 {
                return Err(format!("'{entry}': node ids start at 1"));
            }
            let addr = addr.trim();
            match addr.parse::<ListenAddr>() {
                Ok(ListenAddr::Addr(_)) | Ok(ListenAddr::Host(..)) => {}
                _ => return Err(bad()),
            }
            if out.insert(id, addr.to_string()).is_some() {
                return Err(format!("node id {id} is listed twice"));
            }
        }
        Ok(out)
    }

    /// The shared secret from `secret_file`, without surrounding whitespace.
    ///
    /// Errors: no file set, the file cannot be read, or the secret is shorter than
    /// [`MIN_CLUSTER_SECRET`] bytes.
    pub fn secret(&self) -> Result<Vec<u8>, String> {
        let Some(path) = &self.secret_file else {
            return Err(
                "must be set: nodes authenticate each other with the secret in this \
                        file (the same on every node)"
                    .into(),
            );
        };
        let raw = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
        let text = raw.trim_ascii();
        if text.len() < MIN_CLUSTER_SECRET {
            return Err(format!(
                "the secret is {} bytes; at least {MIN_CLUSTER_SECRET} are needed",
                text.len()
            ));
        }
        Ok(text.to_vec())
    }
}

/// `[httpmq]`: the HTTP queue API compatible with httpmq and httpsqs
/// (`/?name=Q&opt=put|get|view|status|status_json|reset|maxqueue`) on the queues of one vhost.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct HttpmqConfig {
    /// Serve the API (the `warren` binary does by default; an embedding program asks with
    /// [`crate::BrokerBuilder::httpmq`]).
    pub enabled: bool,
    /// Where it listens (httpsqs's port, default `0.0.0.0:1218`).
    pub listen: ListenAddr,
    /// The vhost whose queues `name=` names (default `/`).
    pub vhost: String,
    /// A password every request must carry as `auth=` (httpmq's `-auth`); unset, none. A
    /// request with HTTP basic authentication of a Warren user needs no `auth=`.
    pub auth: Option<String>,
    /// The Warren user whose permissions apply to requests without basic authentication
    /// (default `guest`).
    pub user: String,
    /// A queue's maximum number of unread messages until `opt=maxqueue` changes it
    /// (1 to 10,000,000; default 1,000,000).
    pub default_maxqueue: u64,
    /// The largest request body, bytes (default 16 MiB); a larger request gets 413.
    pub max_body_bytes: u64,
    /// Most HTTP connections open at once (default 10,000); more wait to be accepted.
    pub max_connections: usize,
    /// How often queue positions are checkpointed to `<data_dir>/httpmq/state.json`, ms
    /// (default 1000).
    pub checkpoint_ms: u64,
    /// Serve HTTPS instead of HTTP, with the `[tls]` certificate, key and client-certificate
    /// settings of AMQPS (which must be set); reloaded with them on SIGHUP.
    pub tls: bool,
}

impl Default for HttpmqConfig {
    fn default() -> Self {
        HttpmqConfig {
            enabled: true,
            listen: ListenAddr::Addr(std::net::SocketAddr::from(([0, 0, 0, 0], 1218))),
            vhost: "/".into(),
            auth: None,
            user: "guest".into(),
            default_maxqueue: 1_000_000,
            max_body_bytes: 16 * 1024 * 1024,
            max_connections: 10_000,
            checkpoint_ms: 1000,
            tls: false,
        }
    }
}

/// `[management]`: the management HTTP API (RabbitMQ's management plugin's paths and JSON,
/// and Prometheus metrics on `/metrics`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ManagementConfig {
    /// Serve the API (the `warren` binary does by default; an embedding program asks with
    /// [`crate::BrokerBuilder::management`]).
    pub enabled: bool,
    /// Where it listens (RabbitMQ's `management.tcp.port`, default `0.0.0.0:15672`).
    pub listen: ListenAddr,
    /// Most HTTP connections open at once (default 1024); more are closed as they are
    /// accepted (RabbitMQ's `management.tcp.max_connections`).
    pub max_connections: usize,
    /// Seconds a connection may wait between requests before it is closed (default 120,
    /// RabbitMQ's `management.tcp.idle_timeout`).
    pub idle_timeout: u64,
    /// Seconds a client has to send a request's line and headers once it started (default
    /// 30; RabbitMQ's `management.tcp.request_timeout`).
    pub request_timeout: u64,
    /// Milliseconds between two samples of the message counters and queue lengths that
    /// message rates are computed from (RabbitMQ's `collect_statistics_interval`, default
    /// 5000; at least 10).
    pub collect_statistics_interval: u64,
}

impl ManagementConfig {
    /// The listener's bounds.
    pub fn limits(&self) -> warren_mgmt::ListenerLimits {
        warren_mgmt::ListenerLimits {
            max_connections: self.max_connections,
            idle_timeout: std::time::Duration::from_secs(self.idle_timeout),
            request_timeout: std::time::Duration::from_secs(self.request_timeout),
        }
    }
}

impl Default for ManagementConfig {
    fn default() -> Self {
        ManagementConfig {
            enabled: true,
            listen: ListenAddr::Addr(std::net::SocketAddr::from(([0, 0, 0, 0], 15672))),
            max_connections: 1024,
            idle_timeout: 120,
            request_timeout: 30,
            collect_statistics_interval: 5000,
        }
    }
}

/// `[auth]`: how clients log in (RabbitMQ's `auth_mechanisms`, `loopback_users`,
/// `ssl_cert_login_from`, `anonymous_login_user`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// SASL mechanisms offered, in order: `PLAIN`, `AMQPLAIN`, `EXTERNAL`, `ANONYMOUS`
    /// (default `["PLAIN", "AMQPLAIN"]`). A list, or in the environment a comma-separated
    /// string. Of these, only usable ones are advertised: EXTERNAL on TLS connections whose
    /// client presented a verified certificate, ANONYMOUS when `anonymous_user` is set.
    #[serde(deserialize_with = "string_list")]
    pub mechanisms: Vec<String>,
    /// Where EXTERNAL takes the user name from the client certificate:
    /// `distinguished_name` (the whole subject DN in RabbitMQ's format, the default) or
    /// `common_name`.
    pub ssl_cert_login_from: crate::tls::CertLoginFrom,
    /// The user ANONYMOUS logs in as (must exist); unset, ANONYMOUS is unavailable.
    pub anonymous_user: Option<String>,
    /// Users that may only log in from a loopback address (default `["guest"]`; a list, or a
    /// comma-separated string in the environment; empty for none).
    #[serde(deserialize_with = "string_list")]
    pub loopback_users: Vec<String>,
    /// How long a refused login waits before the socket is closed, ms (RabbitMQ waits 3 s),
    /// so that guessing passwords is slow.
    pub login_failure_delay_ms: u64,
}

/// The SASL mechanisms Warren implements.
pub const KNOWN_MECHANISMS: &[&str] = &["PLAIN", "AMQPLAIN", "EXTERNAL", "ANONYMOUS"];

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            mechanisms: vec!["PLAIN".into(), "AMQPLAIN".into()],
            ssl_cert_login_from: crate::tls::CertLoginFrom::default(),
            anonymous_user: None,
            loopback_users: vec!["guest".into()],
            login_failure_delay_ms: 3000,
        }
    }
}

/// Reads a list of strings from a TOML array or a comma-separated string (environment
/// variables); blanks are dropped.
fn string_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        List(Vec<String>),
        Csv(String),
    }
    let items = match Form::deserialize(d)? {
        Form::List(l) => l,
        Form::Csv(s) => s.split(',').map(str::to_string).collect(),
    };
    Ok(items
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect())
}

/// `[definitions]`: a definitions file in RabbitMQ's JSON format (what `rabbitmqctl
/// export_definitions` writes) imported at every start (RabbitMQ's `load_definitions`).
/// Importing is idempotent: users, vhosts and permissions are created or replaced; exchanges,
/// queues and bindings are declared unless they exist.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DefinitionsConfig {
    /// The file; unset imports nothing.
    pub load_file: Option<PathBuf>,
}

/// `[limits]`: caps per vhost on queues, exchanges and bindings (RabbitMQ's vhost limit
/// `max-queues` and its siblings). A declare or bind past a cap fails with 406
/// PRECONDITION_FAILED. A negative value means no limit; 0 allows none.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Most queues per vhost (default 100,000).
    pub max_queues: i64,
    /// Most exchanges per vhost besides the pre-declared ones (default 10,000).
    pub max_exchanges: i64,
    /// Most bindings per vhost (default 1,000,000).
    pub max_bindings: i64,
    /// Most topic-trie nodes visited to route one message (default 100,000); a message that
    /// needs more is refused with 406.
    pub topic_match_budget: i64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let d = warren_broker::Limits::default();
        LimitsConfig {
            max_queues: d.max_queues,
            max_exchanges: d.max_exchanges,
            max_bindings: d.max_bindings,
            topic_match_budget: d.topic_match_budget,
        }
    }
}

impl LimitsConfig {
    /// The broker model's limits.
    pub fn limits(&self) -> warren_broker::Limits {
        warren_broker::Limits {
            max_queues: self.max_queues,
            max_exchanges: self.max_exchanges,
            max_bindings: self.max_bindings,
            topic_match_budget: self.topic_match_budget,
        }
    }
}

/// `[memory]`: the memory alarm (RabbitMQ's `vm_memory_high_watermark`). Above the
/// watermark, connections that publish (and consume nothing) are no longer read from, and
/// clients that declared the capability get connection.blocked, until memory use falls back.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryConfig {
    /// Watermark as a fraction of the machine's memory (RabbitMQ 4.x default 0.6).
    pub high_watermark: f64,
    /// Watermark in bytes; when non-zero it replaces `high_watermark`.
    pub high_watermark_bytes: u64,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            high_watermark: 0.6,
            high_watermark_bytes: 0,
        }
    }
}

impl MemoryConfig {
    /// The watermark in bytes for a machine with `total` bytes of memory.
    pub fn limit(&self, total: u64) -> u64 {
        if self.high_watermark_bytes > 0 {
            self.high_watermark_bytes
        } else {
            (total as f64 * self.high_watermark) as u64
        }
    }
}

/// `[amqp]`: the AMQP 0-9-1 listener.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AmqpConfig {
    /// Where to listen (RabbitMQ's `listeners.tcp.default`): a bare port listens on every
    /// interface, IPv4 and IPv6; `IP:PORT` on one address; `HOST:PORT` on every address the
    /// host name resolves to. Default `5672`.
    pub listen: ListenAddr,
    /// Largest frame in bytes offered in connection.tune, headers included (RabbitMQ
    /// `frame_max`, default 131072). Clients may lower it, not raise it.
    pub frame_max: u32,
    /// Most channels open at once on one connection, offered in connection.tune (RabbitMQ
    /// `channel_max`, default 2047). Channel numbers themselves may be any of 1..=65535.
    pub channel_max: u16,
    /// Heartbeat interval in seconds offered in connection.tune (RabbitMQ `heartbeat`, default
    /// 60); 0 disables heartbeats unless the client asks for them.
    pub heartbeat: u16,
    /// Largest message body in bytes (RabbitMQ `max_message_size`, default 16 MiB in 4.x, at
    /// most 512 MiB as in RabbitMQ).
    pub max_message_size: u64,
    /// Most concurrent client connections; further ones are refused at accept.
    pub max_connections: usize,
    /// Deepest nesting of field tables and arrays accepted from clients.
    pub max_table_depth: usize,
    /// Seconds a client has to complete the handshake (RabbitMQ `handshake_timeout`, 10 s).
    pub handshake_timeout: u64,
    /// Most bytes of message content one connection may have announced in content headers
    /// and not finished sending, over all its channels; a header beyond it closes its channel
    /// with 406 PRECONDITION_FAILED. At least `max_message_size`.
    pub max_incomplete_content_bytes: u64,
    /// Pending output in bytes above which queues stop delivering to a connection; above
    /// twice this the connection is no longer read from until its client has read it down to
    /// half the mark.
    pub outbox_high_water_bytes: usize,
    /// Most message body bytes one transaction may hold before tx.commit; beyond it the
    /// publish closes the channel with 406 PRECONDITION_FAILED.
    pub tx_max_bytes: u64,
    /// Most publishes plus acknowledgements one transaction may hold before tx.commit; beyond
    /// it the channel is closed with 406 PRECONDITION_FAILED.
    pub tx_max_operations: usize,
    /// Delivery acknowledgement timeout in milliseconds (RabbitMQ `consumer_timeout`, default
    /// 1800000, 30 minutes; rabbitmq.com/docs/consumers#acknowledgement-timeout): a channel
    /// whose oldest unacknowledged delivery (to a consumer or by basic.get) waited longer is
    /// closed with 406 PRECONDITION_FAILED and its deliveries are requeued. A queue's
    /// `x-consumer-timeout` argument or `consumer-timeout` policy overrides it. `0` turns it
    /// off (RabbitMQ turns it off with a non-integer value in `advanced.config`).
    pub consumer_timeout: u64,
}

impl AmqpConfig {
    /// [`AmqpConfig::consumer_timeout`] in ms, `None` when it is off.
    pub fn consumer_timeout(&self) -> Option<u64> {
        (self.consumer_timeout > 0).then_some(self.consumer_timeout)
    }
}

/// RabbitMQ's default `consumer_timeout`, 30 minutes in ms.
pub const DEFAULT_CONSUMER_TIMEOUT: u64 = 30 * 60 * 1000;

/// RabbitMQ's largest accepted `max_message_size`, 512 MiB.
pub const MAX_MESSAGE_SIZE_LIMIT: u64 = 512 * 1024 * 1024;

/// `[storage]`: where and how messages and durable definitions are kept.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// Data directory. `None` runs entirely in memory (the embedding default); the `warren`
    /// binary uses `./warren-data` when none is given.
    pub data_dir: Option<PathBuf>,
    /// Size at which a message-store segment file is closed and a new one started, bytes.
    pub segment_size: u64,
    /// Most bytes of appends covered by one fsync; publishers wait when this much is pending.
    pub fsync_batch_bytes: usize,
    /// Microseconds the store's writer waits for more publishes before an fsync (0 = none; the
    /// batch still grows with whatever arrives during each fsync).
    pub fsync_delay_us: u64,
    /// Ready messages a queue keeps in memory; beyond this they are paged to disk.
    pub queue_window: usize,
    /// Ready message bytes a queue keeps in memory; beyond this they are paged to disk.
    pub queue_window_bytes: usize,
    /// The disk alarm (RabbitMQ's `disk_free_limit.absolute`): when the file system holding
    /// the data directory has less free space than this, publishers are blocked. Default
    /// 50 MB, as RabbitMQ.
    pub disk_free_limit: DiskFreeLimit,
    /// RabbitMQ's `disk_free_limit.relative`: the limit as a multiple of the machine's memory
    /// (e.g. 1.0 = as much free disk as there is RAM). When above 0 it replaces
    /// `disk_free_limit`.
    pub disk_free_limit_relative: f64,
    /// Unacknowledged deliveries a channel keeps in memory; beyond this it keeps only where
    /// the store holds them (bodies are read back on requeue or dead-lettering).
    pub unacked_window: usize,
    /// The same bound in message body bytes.
    pub unacked_window_bytes: usize,
    /// A message-store segment is compacted (live messages copied forward, then the file
    /// deleted) once they take less than this fraction of it; 0 turns compaction off.
    pub compaction_ratio: f64,
    /// ... and none of its messages has been settled for this long, ms.
    pub compaction_quiet_ms: u64,
}

/// The free disk space below which publishers are blocked.
///
/// In TOML, environment and flags: an integer number of bytes (`50000000`), a string with
/// RabbitMQ's information units (`"50MB"`, `"1GB"`, `"512MiB"`: `k`/`kB`, `M`/`MB`, `G`/`GB`,
/// `T`/`TB`, `P`/`PB` are powers of 1000, `Ki`/`KiB`, `Mi`/`MiB`, `Gi`/`GiB`, `Ti`/`TiB`,
/// `Pi`/`PiB` powers of 1024), or a number between 0 and 1 for a fraction of the file
/// system's size (`0.05` = 5 %).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DiskFreeLimit {
    /// Bytes.
    Bytes(u64),
    /// A fraction of the file system's total size, in (0, 1).
    FractionOfDisk(f64),
}

impl Default for DiskFreeLimit {
    fn default() -> Self {
        DiskFreeLimit::Bytes(50_000_000)
    }
}

impl DiskFreeLimit {
    /// The limit in bytes on a file system of `disk_total` bytes.
    pub fn bytes(&self, disk_total: u64) -> u64 {
        match self {
            DiskFreeLimit::Bytes(b) => *b,
            DiskFreeLimit::FractionOfDisk(f) => (disk_total as f64 * f) as u64,
        }
    }
}

impl std::fmt::Display for DiskFreeLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DiskFreeLimit::Bytes(b) if *b > 0 && b % 1_000_000_000 == 0 => {
                write!(f, "{}GB", b / 1_000_000_000)
            }
            DiskFreeLimit::Bytes(b) if *b > 0 && b % 1_000_000 == 0 => {
                write!(f, "{}MB", b / 1_000_000)
            }
            DiskFreeLimit::Bytes(b) => write!(f, "{b}"),
            DiskFreeLimit::FractionOfDisk(x) => write!(f, "{x}"),
        }
    }
}

/// Parses RabbitMQ's information units (rabbit_resource_monitor_misc:parse_information_unit):
/// digits, then optionally a unit.
pub fn parse_information_unit(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    if digits == 0 {
        return None;
    }
    let n: u64 = s[..digits].parse().ok()?;
    let unit = s[digits..].to_ascii_lowercase();
    let k = 1000u64;
    let ki = 1024u64;
    let m = match unit.as_str() {
        "" => 1,
        "k" | "kb" => k,
        "m" | "mb" => k.pow(2),
        "g" | "gb" => k.pow(3),
        "t" | "tb" => k.pow(4),
        "p" | "pb" => k.pow(5),
        "ki" | "kib" => ki,
        "mi" | "mib" => ki.pow(2),
        "gi" | "gib" => ki.pow(3),
        "ti" | "tib" => ki.pow(4),
        "pi" | "pib" => ki.pow(5),
        _ => return None,
    };
    n.checked_mul(m)
}

impl Serialize for DiskFreeLimit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            DiskFreeLimit::FractionOfDisk(x) => s.serialize_f64(*x),
            other => s.collect_str(other),
        }
    }
}

impl<'de> Deserialize<'de> for DiskFreeLimit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = DiskFreeLimit;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "bytes (50000000), a size with a unit (\"50MB\", \"1GiB\") or a fraction of \
                     the disk between 0 and 1 (0.05)",
                )
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<DiskFreeLimit, E> {
                u64::try_from(v)
                    .map(DiskFreeLimit::Bytes)
                    .map_err(|_| E::custom(format!("{v} is negative")))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<DiskFreeLimit, E> {
                Ok(DiskFreeLimit::Bytes(v))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<DiskFreeLimit, E> {
                if v > 0.0 && v < 1.0 {
                    Ok(DiskFreeLimit::FractionOfDisk(v))
                } else {
                    Err(E::custom(format!(
                        "{v}: a fraction of the disk must be between 0 and 1 (bytes are an \
                         integer or a string such as \"50MB\")"
                    )))
                }
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DiskFreeLimit, E> {
                if let Some(b) = parse_information_unit(v) {
                    return Ok(DiskFreeLimit::Bytes(b));
                }
                match v.trim().parse::<f64>() {
                    Ok(x) => self.visit_f64(x),
                    Err(_) => Err(E::custom(format!(
                        "'{v}' is not a size (examples: 50000000, \"50MB\", \"1GB\", \"512MiB\", \
                         0.05)"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `[log]`: where the broker's log goes and how it looks. Used by the `warren` binary; a
/// program that embeds the broker installs its own `tracing` subscriber.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Level or `tracing` filter directive: `error`, `warn`, `info`, `debug`, `trace`, or e.g.
    /// `warren_server=debug,info`. Reloaded on SIGHUP.
    pub level: String,
    /// Log file. Empty: no file. A relative name goes into the data directory's `log/` folder
    /// (`warren.log` → `<data_dir>/log/warren.log`); an absolute path is used as is. The file
    /// is appended to, and reopened on SIGHUP (for log rotation).
    pub file: String,
    /// Also log to standard output.
    pub console: bool,
    /// `plain` (human-readable lines) or `json` (one JSON object per line).
    pub format: LogFormat,
}

/// The log line format.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line.
    Json,
}

impl LogConfig {
    /// The log file's path for data directory `data_dir`, if a file is configured.
    pub fn file_path(&self, data_dir: Option<&Path>) -> Option<PathBuf> {
        if self.file.is_empty() {
            return None;
        }
        let f = Path::new(&self.file);
        Some(match data_dir {
            Some(d) if f.is_relative() => d.join("log").join(f),
            _ => f.to_path_buf(),
        })
    }
}

/// One `[[users]]` entry: a `password` (hashed with SHA-256 when the configuration is
/// loaded, never logged) or a `password_hash` in RabbitMQ's format (`warren --hash-password`
/// prints one) with its `hashing_algorithm`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// Login name.
    pub name: String,
    /// Cleartext password (`Debug` prints `***`).
    #[serde(default)]
    pub password: Option<warren_broker::access::Cleartext>,
    /// Base64 `salt ++ hash(salt ++ password)`, as in a RabbitMQ definitions file.
    #[serde(default)]
    pub password_hash: Option<String>,
    /// The hash's algorithm: `rabbit_password_hashing_sha256` (default),
    /// `rabbit_password_hashing_sha512` or `rabbit_password_hashing_md5`.
    #[serde(default)]
    pub hashing_algorithm: Option<String>,
    /// Tags (`administrator`, `monitoring`, `policymaker`, `management`, `impersonator`).
    #[serde(default)]
    pub tags: Vec<String>,
    /// Only allowed from loopback addresses (as if listed in `[auth] loopback_users`).
    #[serde(default)]
    pub loopback_only: bool,
    /// Most connections the user may have open (RabbitMQ user limit `max-connections`;
    /// negative or unset = no limit).
    #[serde(default)]
    pub max_connections: Option<i64>,
    /// Most channels the user may have open over all connections (`max-channels`).
    #[serde(default)]
    pub max_channels: Option<i64>,
}

impl UserConfig {
    /// The user's stored credential: the `password` hashed now (SHA-256, fresh salt), the
    /// decoded `password_hash`, or none (a passwordless user, who can only log in with
    /// EXTERNAL or ANONYMOUS).
    ///
    /// Errors: both `password` and `password_hash` set, an unknown `hashing_algorithm`, or a
    /// `password_hash` that is not base64.
    pub fn credential(&self) -> Result<warren_broker::access::PasswordHash, String> {
        use warren_broker::access::{HashingAlgorithm, PasswordHash};
        let algorithm = match &self.hashing_algorithm {
            None => HashingAlgorithm::default(),
            Some(name) => HashingAlgorithm::from_module_name(name).ok_or_else(|| {
                format!(
                    "unknown hashing_algorithm '{name}' (use rabbit_password_hashing_sha256, \
                     rabbit_password_hashing_sha512 or rabbit_password_hashing_md5)"
                )
            })?,
        };
        match (&self.password, &self.password_hash) {
            (Some(_), Some(_)) => Err("set password or password_hash, not both".into()),
            (Some(p), None) => Ok(PasswordHash::from_password(algorithm, p.expose())),
            (None, Some(h)) => PasswordHash::from_base64(algorithm, h)
                .map_err(|e| format!("password_hash is not base64: {e}")),
            (None, None) => Ok(PasswordHash::none()),
        }
    }
}

/// One `[[vhosts]]` entry (`/` always exists; list it to set its limits).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VhostConfig {
    /// Name.
    pub name: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
    /// Most client connections to the vhost (RabbitMQ vhost limit `max-connections`;
    /// negative or unset = no limit). The number of queues per vhost is capped by
    /// `[limits] max_queues`.
    #[serde(default)]
    pub max_connections: Option<i64>,
}

fn default_vhost() -> String {
    "/".into()
}

/// One `[[permissions]]` entry: regular expressions on resource names, as `rabbitmqctl
/// set_permissions` takes them (`""` matches nothing).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PermissionConfig {
    /// User.
    pub user: String,
    /// Vhost (default `/`).
    #[serde(default = "default_vhost")]
    pub vhost: String,
    /// Configure pattern.
    pub configure: String,
    /// Write pattern.
    pub write: String,
    /// Read pattern.
    pub read: String,
}

/// One `[[topic_permissions]]` entry: routing-key patterns on a topic exchange, with
/// `{username}` and `{vhost}` expanded.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TopicPermissionConfig {
    /// User.
    pub user: String,
    /// Vhost (default `/`).
    #[serde(default = "default_vhost")]
    pub vhost: String,
    /// Topic exchange.
    pub exchange: String,
    /// Write pattern (publish).
    pub write: String,
    /// Read pattern (bindings).
    pub read: String,
}

impl Default for AmqpConfig {
    fn default() -> Self {
        AmqpConfig {
            listen: ListenAddr::Port(5672),
            frame_max: 131_072,
            channel_max: 2047,
            heartbeat: 60,
            max_message_size: 16 * 1024 * 1024,
            max_connections: 65_536,
            max_table_depth: 16,
            handshake_timeout: 10,
            max_incomplete_content_bytes: 128 * 1024 * 1024,
            outbox_high_water_bytes: crate::outbox::HIGH_WATER,
            tx_max_bytes: 128 * 1024 * 1024,
            tx_max_operations: 100_000,
            consumer_timeout: DEFAULT_CONSUMER_TIMEOUT,
        }
    }
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            data_dir: None,
            segment_size: 64 * 1024 * 1024,
            fsync_batch_bytes: 16 * 1024 * 1024,
            fsync_delay_us: 0,
            queue_window: 2048,
            queue_window_bytes: 8 * 1024 * 1024,
            disk_free_limit: DiskFreeLimit::default(),
            disk_free_limit_relative: 0.0,
            unacked_window: 2048,
            unacked_window_bytes: 8 * 1024 * 1024,
            compaction_ratio: 0.5,
            compaction_quiet_ms: 2000,
        }
    }
}

impl StorageConfig {
    /// The broker's storage options, when a data directory is set.
    pub fn options(&self) -> Option<warren_broker::StorageOptions> {
        let dir = self.data_dir.as_ref()?;
        Some(warren_broker::StorageOptions {
            segment_size: self.segment_size,
            fsync_batch_bytes: self.fsync_batch_bytes,
            fsync_delay_us: self.fsync_delay_us,
            queue_window: self.queue_window.max(1),
            queue_window_bytes: self.queue_window_bytes.max(1),
            unacked_window: self.unacked_window,
            unacked_window_bytes: self.unacked_window_bytes,
            compaction_ratio: self.compaction_ratio,
            compaction_quiet_ms: self.compaction_quiet_ms,
            ..warren_broker::StorageOptions::new(dir)
        })
    }

    /// The disk alarm's limit in bytes for a file system of `disk_total` bytes on a machine
    /// with `memory_total` bytes of memory.
    pub fn disk_free_limit_bytes(&self, disk_total: u64, memory_total: u64) -> u64 {
        if self.disk_free_limit_relative > 0.0 {
            (memory_total as f64 * self.disk_free_limit_relative) as u64
        } else {
            self.disk_free_limit.bytes(disk_total)
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
            file: String::new(),
            console: true,
            format: LogFormat::Plain,
        }
    }
}

/// Errors loading configuration; each names the source of the bad setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        /// File path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not fit the schema (the message has line, column
    /// and key).
    #[error("invalid configuration file {path}: {message}")]
    File {
        /// File path.
        path: PathBuf,
        /// What is wrong, where.
        message: String,
    },
    /// A `WARREN_*` environment variable or a flag does not fit the schema.
    #[error("invalid {origin}: {message}")]
    Override {
        /// `environment variable WARREN_…` or `flag --…`.
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// A value is out of its range.
    #[error("invalid {key} = {value} ({origin}): {message}")]
    Invalid {
        /// `section.key`.
        key: String,
        /// The value as given.
        value: String,
        /// Where it came from: the file, an environment variable, a flag, or the default.
        origin: String,
        /// The allowed range.
        message: String,
    },
}

const SECTIONS: &[&str] = &[
    "amqp",
    "storage",
    "log",
    "memory",
    "limits",
    "tls",
    "auth",
    "definitions",
    "management",
    "httpmq",
    "cluster",
];

/// `WARREN_*` variables that are not configuration: the scripts of this repository use them
/// for themselves (the interop suite's broker binary, the benchmark's port), and a broker they
/// start inherits them.
pub const NON_CONFIG_VARIABLES: &[&str] = &["WARREN_BIN", "WARREN_PORT"];

/// Prefixes of `WARREN_*` variables that are not the broker's configuration: `WARREN_CTL_*`
/// are `warren ctl`'s (URL, credentials, vhost), which an operator may keep exported in the
/// shell that also starts the broker.
pub const NON_CONFIG_PREFIXES: &[&str] = &["WARREN_CTL_"];

/// A setting given on the command line: `section.key = value`, from flag `flag`.
#[derive(Debug, Clone)]
pub struct Override {
    /// Section, e.g. `amqp`.
    pub section: &'static str,
    /// Key, e.g. `listen`.
    pub key: &'static str,
    /// The value (a TOML value: flags give strings, read as the key's type).
    pub value: toml::Value,
    /// The flag, e.g. `--amqp-listen`.
    pub flag: &'static str,
}

/// Reads an override's text as a TOML value when it parses as one (`60`, `true`, `0.05`), and
/// as a string otherwise (`0.0.0.0:5672`, `50MB`).
fn toml_value(text: &str) -> toml::Value {
    format!("v = {text}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .filter(|x| !x.is_table())
        .unwrap_or_else(|| toml::Value::String(text.to_string()))
}

/// The line (from 1) of each `section.key` in a configuration file's text, from the TOML
/// parser's spans, so that a value refused later names `file:line`. Empty when the text
/// does not have the shape of sections of keys (the schema check reports that).
fn key_lines(text: &str) -> HashMap<String, usize> {
    type Sections = HashMap<String, HashMap<String, toml::Spanned<toml::Value>>>;
    let Ok(sections) = toml::from_str::<Sections>(text) else {
        return HashMap::new();
    };
    let line_at = |offset: usize| 1 + text[..offset.min(text.len())].matches('\n').count();
    sections
        .into_iter()
        .flat_map(|(section, keys)| {
            keys.into_iter()
                .map(move |(key, v)| (format!("{section}.{key}"), line_at(v.span().start)))
        })
        .collect()
}

impl Config {
    /// Loads `path` (if given), then applies `WARREN_<SECTION>_<KEY>` variables from `env`.
    /// See [`Config::load_with`].
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        Self::load_with(path, env, &[])
    }

    /// Loads `path` (if given), applies `WARREN_<SECTION>_<KEY>` variables from `env`, then
    /// `flags`, and validates the result.
    ///
    /// An environment value is read as a TOML value when it parses as one (`60`, `true`), and
    /// as a string otherwise (`0.0.0.0:5672`). Variables other than `WARREN_*` are ignored, as
    /// are the [`NON_CONFIG_VARIABLES`]; any other `WARREN_*` variable must name a section and
    /// key.
    ///
    /// Errors: [`ConfigError`], naming the file (line and column), variable or flag at fault.
    pub fn load_with(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &[Override],
    ) -> Result<Config, ConfigError> {
        let mut origins: HashMap<String, String> = HashMap::new();
        let mut root: toml::Table = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.to_path_buf(),
                    source,
                })?;
                let file_err = |e: toml::de::Error| ConfigError::File {
                    path: p.to_path_buf(),
                    message: e.to_string().trim_end().to_string(),
                };
                // Deserializing the text itself gives errors with line, column and key.
                toml::from_str::<Config>(&text).map_err(file_err)?;
                let table: toml::Table = text.parse().map_err(file_err)?;
                let lines = key_lines(&text);
                for (section, v) in &table {
                    if let Some(t) = v.as_table() {
                        for key in t.keys() {
                            let key = format!("{section}.{key}");
                            let origin = match lines.get(&key) {
                                Some(line) => format!("{}:{line}", p.display()),
                                None => p.display().to_string(),
                            };
                            origins.insert(key, origin);
                        }
                    }
                }
                table
            }
            None => toml::Table::new(),
        };
        let mut env: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("WARREN_"))
            .filter(|(k, _)| !NON_CONFIG_VARIABLES.contains(&k.as_str()))
            .filter(|(k, _)| !NON_CONFIG_PREFIXES.iter().any(|p| k.starts_with(p)))
            .collect();
        env.sort();
        for (var, text) in env {
            let origin = format!("environment variable {var}");
            let rest = var["WARREN_".len()..].to_ascii_lowercase();
            let Some(section) = SECTIONS.iter().find(|s| rest.starts_with(&format!("{s}_"))) else {
                return Err(ConfigError::Override {
                    origin,
                    message: format!(
                        "no such setting: configuration variables are WARREN_<SECTION>_<KEY> \
                         with SECTION one of {}",
                        SECTIONS.join(", ").to_ascii_uppercase()
                    ),
                });
            };
            let key = rest[section.len() + 1..].to_string();
            apply(&mut root, section, &key, toml_value(&text), &origin)?;
            origins.insert(format!("{section}.{key}"), origin);
        }
        for f in flags {
            let origin = format!("flag {}", f.flag);
            apply(&mut root, f.section, f.key, f.value.clone(), &origin)?;
            origins.insert(format!("{}.{}", f.section, f.key), origin);
        }
        let config =
            Config::deserialize(toml::Value::Table(root)).map_err(|e| ConfigError::Override {
                origin: "configuration".into(),
                message: e.to_string(),
            })?;
        config.validate_with(&|key| {
            origins
                .get(key)
                .cloned()
                .unwrap_or_else(|| "the default".into())
        })?;
        Ok(config)
    }

    /// Rejects settings that would leave the broker unable to serve.
    ///
    /// Errors: [`ConfigError::Invalid`] for the first bad setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_with(&|_| "configuration".into())
    }

    fn validate_with(&self, origin: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
        let bad = |key: &str, value: &dyn std::fmt::Display, message: &str| {
            Err(ConfigError::Invalid {
                key: key.to_string(),
                value: value.to_string(),
                origin: origin(key),
                message: message.to_string(),
            })
        };
        let h = &self.httpmq;
        if !(1..=10_000_000).contains(&h.default_maxqueue) {
            return bad(
                "httpmq.default_maxqueue",
                &h.default_maxqueue,
                "must be between 1 and 10000000",
            );
        }
        if h.max_body_bytes == 0 || h.max_body_bytes > MAX_MESSAGE_SIZE_LIMIT {
            return bad(
                "httpmq.max_body_bytes",
                &h.max_body_bytes,
                "must be between 1 and 536870912",
            );
        }
        if h.max_connections == 0 {
            return bad(
                "httpmq.max_connections",
                &h.max_connections,
                "must be at least 1",
            );
        }
        if h.checkpoint_ms == 0 {
            return bad(
                "httpmq.checkpoint_ms",
                &h.checkpoint_ms,
                "must be at least 1",
            );
        }
        if h.tls && !self.tls.enabled() {
            return bad(
                "httpmq.tls",
                &h.tls,
                "needs tls.cert_file and tls.key_file (the listener uses the [tls] settings)",
            );
        }
        if let Some(c) = &self.cluster {
            if c.node_id == 0 {
                return bad(
                    "cluster.node_id",
                    &c.node_id,
                    "must be set to this node's id (at least 1, as in cluster.seed_nodes)",
                );
            }
            let nodes = match c.nodes() {
                Ok(n) => n,
                Err(e) => return bad("cluster.seed_nodes", &c.seed_nodes.join(","), &e),
            };
            if !nodes.contains_key(&c.node_id) {
                let shown = if c.seed_nodes.is_empty() {
                    "(unset)".to_string()
                } else {
                    c.seed_nodes.join(",")
                };
                return bad(
                    "cluster.seed_nodes",
                    &shown,
                    &format!(
                        "must list every node of the cluster, this one (cluster.node_id = {}) \
                         included",
                        c.node_id
                    ),
                );
            }
            if let Err(e) = c.secret() {
                let shown = c
                    .secret_file
                    .as_ref()
                    .map_or_else(|| "(unset)".to_string(), |p| p.display().to_string());
                return bad("cluster.secret_file", &shown, &e);
            }
            if c.tls && (!self.tls.enabled() || self.tls.ca_file.is_none()) {
                return bad(
                    "cluster.tls",
                    &c.tls,
                    "needs tls.cert_file, tls.key_file and tls.ca_file (the nodes' certificate, \
                     its key and the CAs that sign the nodes' certificates)",
                );
            }
        }
        let a = &self.amqp;
        if a.frame_max < 4096 {
            return bad(
                "amqp.frame_max",
                &a.frame_max,
                "must be at least 4096 (the AMQP minimum frame size)",
            );
        }
        if a.channel_max == 0 {
            return bad("amqp.channel_max", &a.channel_max, "must be at least 1");
        }
        if a.max_message_size == 0 || a.max_message_size > MAX_MESSAGE_SIZE_LIMIT {
            return bad(
                "amqp.max_message_size",
                &a.max_message_size,
                "must be between 1 and 536870912 bytes (512 MiB, RabbitMQ's limit)",
            );
        }
        if a.max_connections == 0 {
            return bad(
                "amqp.max_connections",
                &a.max_connections,
                "must be at least 1",
            );
        }
        let m = &self.management;
        if m.max_connections == 0 {
            return bad(
                "management.max_connections",
                &m.max_connections,
                "must be at least 1",
            );
        }
        if m.idle_timeout == 0 {
            return bad(
                "management.idle_timeout",
                &m.idle_timeout,
                "must be at least 1 second",
            );
        }
        if m.request_timeout == 0 {
            return bad(
                "management.request_timeout",
                &m.request_timeout,
                "must be at least 1 second",
            );
        }
        if m.collect_statistics_interval < 10 {
            return bad(
                "management.collect_statistics_interval",
                &m.collect_statistics_interval,
                "must be at least 10 (milliseconds)",
            );
        }
        if a.max_table_depth == 0 || a.max_table_depth > warren_store::record::MAX_TABLE_DEPTH {
            return bad(
                "amqp.max_table_depth",
                &a.max_table_depth,
                "must be between 1 and 128 (the deepest the message store reads back)",
            );
        }
        if a.handshake_timeout == 0 {
            return bad(
                "amqp.handshake_timeout",
                &a.handshake_timeout,
                "must be at least 1 second",
            );
        }
        if a.max_incomplete_content_bytes < a.max_message_size {
            return bad(
                "amqp.max_incomplete_content_bytes",
                &a.max_incomplete_content_bytes,
                "must be at least amqp.max_message_size",
            );
        }
        if a.outbox_high_water_bytes < 64 * 1024 {
            return bad(
                "amqp.outbox_high_water_bytes",
                &a.outbox_high_water_bytes,
                "must be at least 65536",
            );
        }
        if a.tx_max_bytes == 0 || a.tx_max_operations == 0 {
            return bad(
                "amqp.tx_max_bytes / amqp.tx_max_operations",
                &format!("{} / {}", a.tx_max_bytes, a.tx_max_operations),
                "must be at least 1",
            );
        }
        let s = &self.storage;
        if let Some(d) = &s.data_dir {
            if d.as_os_str().is_empty() {
                return bad("storage.data_dir", &"\"\"", "must not be empty");
            }
        }
        if s.segment_size < 4096 {
            return bad(
                "storage.segment_size",
                &s.segment_size,
                "must be at least 4096 bytes",
            );
        }
        if s.fsync_batch_bytes < 4096 {
            return bad(
                "storage.fsync_batch_bytes",
                &s.fsync_batch_bytes,
                "must be at least 4096 bytes",
            );
        }
        if s.fsync_delay_us > 1_000_000 {
            return bad(
                "storage.fsync_delay_us",
                &s.fsync_delay_us,
                "must be at most 1000000 (1 s): every confirm waits this long",
            );
        }
        if s.queue_window == 0 {
            return bad(
                "storage.queue_window",
                &s.queue_window,
                "must be at least 1",
            );
        }
        if s.queue_window_bytes == 0 {
            return bad(
                "storage.queue_window_bytes",
                &s.queue_window_bytes,
                "must be at least 1",
            );
        }
        if !(s.disk_free_limit_relative.is_finite() && s.disk_free_limit_relative >= 0.0) {
            return bad(
                "storage.disk_free_limit_relative",
                &s.disk_free_limit_relative,
                "must be 0 (unset) or a positive multiple of the machine's memory",
            );
        }
        let m = &self.memory;
        if !(m.high_watermark > 0.0 && m.high_watermark <= 1.0) {
            return bad(
                "memory.high_watermark",
                &m.high_watermark,
                "must be in (0, 1]",
            );
        }
        if !is_log_filter(&self.log.level) {
            return bad(
                "log.level",
                &format!("\"{}\"", self.log.level),
                "use error, warn, info, debug, trace or a filter such as warren_server=debug",
            );
        }
        let mut names = Vec::new();
        for u in &self.users {
            if u.name.is_empty() {
                return bad("users.name", &"\"\"", "a user needs a name");
            }
            if names.contains(&&u.name) {
                return bad("users.name", &u.name, "listed twice");
            }
            names.push(&u.name);
            if let Err(m) = u.credential() {
                return bad("users.password_hash", &u.name, &m);
            }
            if let Err(e) =
                warren_broker::access::user::parse_tags(u.tags.iter().map(String::as_str))
            {
                return bad("users.tags", &u.name, &e.to_string());
            }
        }
        let mut vhosts = Vec::new();
        for v in &self.vhosts {
            if v.name.is_empty() {
                return bad("vhosts.name", &"\"\"", "a vhost needs a name");
            }
            if vhosts.contains(&&v.name) {
                return bad("vhosts.name", &v.name, "listed twice");
            }
            vhosts.push(&v.name);
        }
        for p in &self.permissions {
            if let Err(e) = warren_broker::access::Permissions::new(&p.configure, &p.write, &p.read)
            {
                return bad(
                    "permissions",
                    &format!("{} in {}", p.user, p.vhost),
                    &e.to_string(),
                );
            }
        }
        for t in &self.topic_permissions {
            if let Err(e) = warren_broker::access::TopicPermissions::new(
                &t.user,
                &t.vhost,
                &t.exchange,
                &t.write,
                &t.read,
            ) {
                return bad(
                    "topic_permissions",
                    &format!("{} in {} on {}", t.user, t.vhost, t.exchange),
                    &e.to_string(),
                );
            }
        }
        let a = &self.auth;
        if a.mechanisms.is_empty() {
            return bad(
                "auth.mechanisms",
                &"[]",
                "list at least one of PLAIN, AMQPLAIN, EXTERNAL, ANONYMOUS",
            );
        }
        for (i, m) in a.mechanisms.iter().enumerate() {
            if !KNOWN_MECHANISMS.contains(&m.as_str()) {
                return bad(
                    "auth.mechanisms",
                    m,
                    "unknown mechanism: use PLAIN, AMQPLAIN, EXTERNAL or ANONYMOUS",
                );
            }
            if a.mechanisms[..i].contains(m) {
                return bad("auth.mechanisms", m, "listed twice");
            }
        }
        if a.anonymous_user.as_deref() == Some("") {
            return bad(
                "auth.anonymous_user",
                &"\"\"",
                "name a user, or leave it unset to disable ANONYMOUS",
            );
        }
        if a.login_failure_delay_ms > 60_000 {
            return bad(
                "auth.login_failure_delay_ms",
                &a.login_failure_delay_ms,
                "must be at most 60000 (a refused client holds a connection this long)",
            );
        }
        if let Err(e) = self.tls.validate() {
            // Name where the TLS settings came from (a flag, a variable, the file).
            let key = [
                "tls.cert_file",
                "tls.key_file",
                "tls.ca_file",
                "tls.verify_peer",
                "tls.fail_if_no_peer_cert",
            ]
            .into_iter()
            .find(|k| origin(k) != "the default")
            .unwrap_or("tls");
            let path = |p: &Option<PathBuf>| {
                p.as_ref()
                    .map_or_else(|| "unset".to_string(), |p| p.display().to_string())
            };
            let value = match key {
                "tls.cert_file" => path(&self.tls.cert_file),
                "tls.key_file" => path(&self.tls.key_file),
                "tls.ca_file" => path(&self.tls.ca_file),
                "tls.verify_peer" => self.tls.verify_peer.to_string(),
                "tls.fail_if_no_peer_cert" => self.tls.fail_if_no_peer_cert.to_string(),
                _ => "[tls]".to_string(),
            };
            return Err(ConfigError::Invalid {
                key: key.to_string(),
                value,
                origin: origin(key),
                message: e.to_string(),
            });
        }
        if !(0.0..=1.0).contains(&self.storage.compaction_ratio) {
            return bad(
                "storage.compaction_ratio",
                &self.storage.compaction_ratio,
                "must be between 0 (no compaction) and 1",
            );
        }
        Ok(())
    }

    /// A commented TOML file with every setting at its default, for `--generate-config`.
    pub fn commented_default() -> String {
        let d = Config::default();
        format!(
            r#"# Warren configuration. Every setting is shown with its default.
# Environment variables override the file: WARREN_<SECTION>_<KEY>, e.g. WARREN_AMQP_LISTEN.
# Command-line flags override both.

[amqp]
# Where the AMQP 0-9-1 listener listens: a port alone listens on every interface, IPv4 and
# IPv6 (as RabbitMQ's listeners.tcp.default); "IP:PORT" or "[IPv6]:PORT" on one address;
# "HOST:PORT" on every address the host name resolves to (e.g. "localhost:5672").
listen = {listen}
# Largest frame in bytes offered in connection.tune (clients may lower it).
frame_max = {frame_max}
# Most channels open at once on one connection (channel numbers may be any of 1-65535).
channel_max = {channel_max}
# Heartbeat interval offered in connection.tune, seconds (0 = none unless the client asks).
heartbeat = {heartbeat}
# Largest message body in bytes (at most 536870912, 512 MiB).
max_message_size = {max_message_size}
# Most concurrent client connections.
max_connections = {max_connections}
# Deepest nesting of field tables and arrays accepted from clients.
max_table_depth = {max_table_depth}
# Seconds a client has to complete the AMQP handshake.
handshake_timeout = {handshake_timeout}
# Most bytes of messages a connection may have started (content header sent) and not
# finished, over all its channels; at least max_message_size.
max_incomplete_content_bytes = {max_incomplete_content_bytes}
# Pending output per connection above which deliveries wait; above twice this the broker
# stops reading from the connection until its client catches up.
outbox_high_water_bytes = {outbox_high_water_bytes}
# Most message bytes, and most publishes plus acks, one transaction may hold.
tx_max_bytes = {tx_max_bytes}
tx_max_operations = {tx_max_operations}
# Delivery acknowledgement timeout, milliseconds (RabbitMQ's consumer_timeout): a channel
# whose oldest unacknowledged delivery waited longer is closed with 406 PRECONDITION_FAILED
# and its messages are requeued. A queue's x-consumer-timeout argument or consumer-timeout
# policy overrides it. 0 turns it off.
consumer_timeout = {consumer_timeout}

[storage]
# Data directory (durable definitions and messages; the log folder when [log] file is set).
# The warren binary uses ./warren-data when none is set here or with --data-dir.
# data_dir = "/var/lib/warren"
# Message-store segment file size, bytes.
segment_size = {segment_size}
# Most bytes of appends covered by one fsync (group commit); publishers wait beyond this.
fsync_batch_bytes = {fsync_batch_bytes}
# Microseconds to wait for more publishes before each fsync (0 = none, at most 1000000).
fsync_delay_us = {fsync_delay_us}
# Ready messages (and bytes) a queue keeps in memory before paging to disk.
queue_window = {queue_window}
queue_window_bytes = {queue_window_bytes}
# Disk alarm: below this much free space on the data directory's file system, publishers
# are blocked (connection.blocked "low on disk") until space returns. Bytes, a size with a
# unit ("50MB", "1GB", "512MiB") or a fraction of the file system (0.05). Reloaded on SIGHUP.
disk_free_limit = "{disk_free_limit}"
# The limit as a multiple of the machine's memory (RabbitMQ's disk_free_limit.relative);
# 0 = unset, above 0 it replaces disk_free_limit.
disk_free_limit_relative = {disk_free_limit_relative:?}
# Unacknowledged deliveries (and their bytes) a channel keeps in memory; beyond this only
# their place in the message store is kept.
unacked_window = {unacked_window}
unacked_window_bytes = {unacked_window_bytes}
# A segment file whose live messages take less than this fraction of it, and none of which
# was settled for compaction_quiet_ms, is compacted: they are copied forward and the file
# deleted (0 = never).
compaction_ratio = {compaction_ratio:?}
compaction_quiet_ms = {compaction_quiet_ms}

[log]
# error, warn, info, debug, trace, or a tracing filter such as "warren_server=debug,info".
# Reloaded on SIGHUP.
level = "{level}"
# Log file: empty for none; a relative name goes into <data_dir>/log/. Reopened on SIGHUP.
file = "{file}"
# Also log to standard output.
console = {console}
# "plain" lines or "json" (one JSON object per line).
format = "plain"

[memory]
# Memory alarm: above this fraction of the machine's memory (or high_watermark_bytes when
# non-zero), publishing connections are paused and get connection.blocked.
high_watermark = {high_watermark}
high_watermark_bytes = {high_watermark_bytes}

[limits]
# Caps per vhost; a declare or bind past one fails with 406 PRECONDITION_FAILED.
# A negative value means no limit, 0 allows none.
max_queues = {max_queues}
# Not counting the pre-declared default and amq.* exchanges.
max_exchanges = {max_exchanges}
max_bindings = {max_bindings}
# Most topic-trie nodes visited to route one message; a message needing more is refused
# with 406 (real binding sets need tens to hundreds).
topic_match_budget = {topic_match_budget}

[management]
# The management HTTP API (RabbitMQ's /api paths and JSON, Prometheus text on /metrics).
enabled = {management_enabled}
listen = "{management_listen}"
# Most HTTP connections open at once; more are closed as they are accepted.
max_connections = {management_max_connections}
# Seconds a connection may wait between requests, and to send a request's line and headers.
idle_timeout = {management_idle_timeout}
request_timeout = {management_request_timeout}
# Milliseconds between the samples message rates are computed from.
collect_statistics_interval = {management_collect_statistics_interval}

[httpmq]
# The httpmq/httpsqs-compatible HTTP queue API: /?name=Q&opt=put|get|view|status|...
# on the queues of one vhost. Also --httpmq-listen.
enabled = {httpmq_enabled}
listen = "{httpmq_listen}"
vhost = "/"
# A password every request must carry as auth=...; unset, none. Basic authentication with a
# Warren user works too (write permission for put, read for get/view/status, configure for
# reset/maxqueue).
# auth = "change-me"
# The user whose permissions apply to requests without basic authentication.
user = "guest"
default_maxqueue = {httpmq_default_maxqueue}
max_body_bytes = {httpmq_max_body_bytes}
max_connections = {httpmq_max_connections}
checkpoint_ms = {httpmq_checkpoint_ms}
# HTTPS with the [tls] settings (cert_file and key_file must be set).
tls = false


{tls}
# [cluster]
# This node's place in a cluster of Warren nodes; quorum queues get members on its nodes.
# Without this section Warren runs alone. Environment: WARREN_CLUSTER_NODE_ID,
# WARREN_CLUSTER_LISTEN, WARREN_CLUSTER_SEED_NODES (comma-separated),
# WARREN_CLUSTER_SECRET_FILE, WARREN_CLUSTER_TLS; flags --cluster-node-id, --cluster-listen,
# --cluster-seed-nodes, --cluster-secret-file.
# This node's id (at least 1), listed in seed_nodes.
# node_id = 1
# Where the other nodes reach this one.
# listen = "0.0.0.0:25672"
# Every node, this one included, as "ID@HOST:PORT".
# seed_nodes = ["1@10.0.0.1:25672", "2@10.0.0.2:25672", "3@10.0.0.3:25672"]
# The shared secret (at least 16 bytes, the same file content on every node, like
# RabbitMQ's Erlang cookie); it is never sent, nodes prove they know it.
# secret_file = "/etc/warren/cluster-secret"
# Inter-node connections over mutual TLS with the [tls] certificate, key and CA; each
# node's certificate must name the host of its seed_nodes address.
# tls = false

[auth]
# SASL mechanisms offered to clients, of PLAIN, AMQPLAIN, EXTERNAL and ANONYMOUS
# (environment: comma-separated). EXTERNAL is only offered on TLS connections whose client
# presented a certificate verified against tls.ca_file (needs tls.verify_peer); ANONYMOUS only
# when anonymous_user is set.
mechanisms = ["PLAIN", "AMQPLAIN"]
# Where EXTERNAL takes the user name from: "distinguished_name" (the certificate's subject,
# e.g. "CN=app,O=example", RabbitMQ's default) or "common_name".
ssl_cert_login_from = "distinguished_name"
# The user ANONYMOUS logs in as; unset, ANONYMOUS is unavailable.
# anonymous_user = "anonymous"
# Users that may only log in from a loopback address.
loopback_users = ["guest"]
# A refused login waits this long (ms) before the socket is closed.
login_failure_delay_ms = {login_failure_delay_ms}

[definitions]
# A RabbitMQ definitions file (rabbitmqctl export_definitions) imported at every start:
# users (with their password hashes), vhosts, permissions, topic permissions, exchanges,
# queues and bindings. Importing again changes nothing. Also --load-definitions FILE.
# load_file = "/etc/warren/definitions.json"

# Users. With none listed here and no definitions file, guest/guest is created and, being in
# loopback_users, may only log in from localhost. Plain passwords are hashed when the file is
# read; `warren --hash-password` prints a password_hash to use instead.
# [[users]]
# name = "admin"
# password = "change-me"
# # or: password_hash = "..." and hashing_algorithm = "rabbit_password_hashing_sha256"
# tags = ["administrator"]
# max_connections = 100
# max_channels = 1000
#
# Vhosts besides "/", and their connection limits.
# [[vhosts]]
# name = "staging"
# max_connections = 50
#
# Permissions: regular expressions on names of exchanges and queues. With none listed,
# every user of [[users]] gets ".*" on "/".
# [[permissions]]
# user = "admin"
# vhost = "staging"
# configure = ".*"
# write = ".*"
# read = ".*"
#
# Topic permissions: patterns on routing keys for one topic exchange; {{username}} and
# {{vhost}} are replaced by the user's and vhost's names.
# [[topic_permissions]]
# user = "admin"
# vhost = "staging"
# exchange = "amq.topic"
# write = "^{{username}}\\."
# read = ".*"
"#,
            listen = match &d.amqp.listen {
                ListenAddr::Port(p) => p.to_string(),
                other => format!("\"{other}\""),
            },
            frame_max = d.amqp.frame_max,
            management_enabled = d.management.enabled,
            management_listen = d.management.listen,
            httpmq_enabled = d.httpmq.enabled,
            httpmq_listen = d.httpmq.listen,
            httpmq_default_maxqueue = d.httpmq.default_maxqueue,
            httpmq_max_body_bytes = d.httpmq.max_body_bytes,
            httpmq_max_connections = d.httpmq.max_connections,
            httpmq_checkpoint_ms = d.httpmq.checkpoint_ms,
            management_max_connections = d.management.max_connections,
            management_idle_timeout = d.management.idle_timeout,
            management_request_timeout = d.management.request_timeout,
            management_collect_statistics_interval = d.management.collect_statistics_interval,
            channel_max = d.amqp.channel_max,
            heartbeat = d.amqp.heartbeat,
            max_message_size = d.amqp.max_message_size,
            max_connections = d.amqp.max_connections,
            max_table_depth = d.amqp.max_table_depth,
            handshake_timeout = d.amqp.handshake_timeout,
            max_incomplete_content_bytes = d.amqp.max_incomplete_content_bytes,
            outbox_high_water_bytes = d.amqp.outbox_high_water_bytes,
            tx_max_bytes = d.amqp.tx_max_bytes,
            tx_max_operations = d.amqp.tx_max_operations,
            consumer_timeout = d.amqp.consumer_timeout,
            segment_size = d.storage.segment_size,
            fsync_batch_bytes = d.storage.fsync_batch_bytes,
            fsync_delay_us = d.storage.fsync_delay_us,
            queue_window = d.storage.queue_window,
            queue_window_bytes = d.storage.queue_window_bytes,
            disk_free_limit = d.storage.disk_free_limit,
            disk_free_limit_relative = d.storage.disk_free_limit_relative,
            unacked_window = d.storage.unacked_window,
            unacked_window_bytes = d.storage.unacked_window_bytes,
            compaction_ratio = d.storage.compaction_ratio,
            compaction_quiet_ms = d.storage.compaction_quiet_ms,
            level = d.log.level,
            file = d.log.file,
            console = d.log.console,
            high_watermark = d.memory.high_watermark,
            high_watermark_bytes = d.memory.high_watermark_bytes,
            max_queues = d.limits.max_queues,
            max_exchanges = d.limits.max_exchanges,
            max_bindings = d.limits.max_bindings,
            topic_match_budget = d.limits.topic_match_budget,
            tls = crate::tls::TlsConfig::commented_default(),
            login_failure_delay_ms = d.auth.login_failure_delay_ms,
        )
    }
}

/// Inserts `section.key = value` into `root` and checks that the result still fits the
/// schema, so that an error names the variable or flag that broke it.
fn apply(
    root: &mut toml::Table,
    section: &str,
    key: &str,
    value: toml::Value,
    origin: &str,
) -> Result<(), ConfigError> {
    let err = |message: String| ConfigError::Override {
        origin: origin.to_string(),
        message,
    };
    root.entry(section.to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .ok_or_else(|| err(format!("[{section}] is not a table")))?
        .insert(key.to_string(), value);
    Config::deserialize(toml::Value::Table(root.clone()))
        .map(|_| ())
        .map_err(|e| err(format!("{section}.{key}: {e}")))
}

/// True when every directive of `spec` names a known level (a bare word such as `verbose`
/// would otherwise be taken as a target name and silently log nothing).
pub fn is_log_filter(spec: &str) -> bool {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    !spec.trim().is_empty()
        && spec.split(',').all(|d| {
            let level = d
                .rsplit('=')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            LEVELS.contains(&level.as_str())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("warren-cfg-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn commented_default_parses_to_default() {
        let dir = scratch("default");
        let p = dir.join("warren.toml");
        std::fs::write(&p, Config::commented_default()).unwrap();
        let c = Config::load(Some(&p), Vec::new()).unwrap();
        assert_eq!(c, Config::default());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cluster_from_env_flags_and_validation() {
        let dir = scratch("cluster");
        let secret = dir.join("secret");
        std::fs::write(&secret, "  0123456789abcdef-cookie\n").unwrap();
        let short = dir.join("short");
        std::fs::write(&short, "tiny\n").unwrap();
        assert_eq!(Config::default().cluster, None);
        let secret_s = secret.to_string_lossy().into_owned();
        let base = [
            ("WARREN_CLUSTER_NODE_ID", "2"),
            ("WARREN_CLUSTER_LISTEN", "127.0.0.1:25673"),
            (
                "WARREN_CLUSTER_SEED_NODES",
                "1@127.0.0.1:25672, 2@127.0.0.1:25673,3@localhost:25674",
            ),
            ("WARREN_CLUSTER_SECRET_FILE", secret_s.as_str()),
        ];
        let c = Config::load(None, env(&base)).unwrap();
        let cl = c.cluster.expect("[cluster] from the environment");
        assert_eq!(cl.node_id, 2);
        assert_eq!(cl.listen.to_string(), "127.0.0.1:25673");
        let nodes = cl.nodes().unwrap();
        assert_eq!(nodes.len(), 3);
        assert_eq!(nodes[&3], "localhost:25674");
        assert_eq!(cl.secret().unwrap(), b"0123456789abcdef-cookie");
        // A flag overrides the environment.
        let flag = Override {
            section: "cluster",
            key: "node_id",
            value: toml::Value::Integer(3),
            flag: "--cluster-node-id",
        };
        let c = Config::load_with(None, env(&base), &[flag]).unwrap();
        assert_eq!(c.cluster.unwrap().node_id, 3);
        // A file.
        let p = dir.join("warren.toml");
        std::fs::write(
            &p,
            format!(
                "[cluster]\nnode_id = 1\nseed_nodes = [\"1@10.0.0.1:25672\", \"2@10.0.0.2:25672\"]\n\
                 secret_file = \"{}\"\n",
                secret.display()
            ),
        )
        .unwrap();
        let cl = Config::load(Some(&p), Vec::new()).unwrap().cluster.unwrap();
        assert_eq!(cl.listen.to_string(), "0.0.0.0:25672");
        assert_eq!(cl.nodes().unwrap().len(), 2);
        // Errors name the key and where it came from.
        let short_s = short.to_string_lossy().into_owned();
        for (var, value, key, words) in [
            (
                "WARREN_CLUSTER_NODE_ID",
                "0",
                "cluster.node_id",
                "at least 1",
            ),
            (
                "WARREN_CLUSTER_NODE_ID",
                "4",
                "cluster.seed_nodes",
                "this one",
            ),
            (
                "WARREN_CLUSTER_SEED_NODES",
                "1@a:1,2",
                "cluster.seed_nodes",
                "ID@HOST:PORT",
            ),
            (
                "WARREN_CLUSTER_SEED_NODES",
                "2@a:1,2@b:1",
                "cluster.seed_nodes",
                "twice",
            ),
            (
                "WARREN_CLUSTER_SECRET_FILE",
                short_s.as_str(),
                "cluster.secret_file",
                "at least 16",
            ),
            (
                "WARREN_CLUSTER_SECRET_FILE",
                "/nonexistent/secret",
                "cluster.secret_file",
                "cannot read",
            ),
            ("WARREN_CLUSTER_TLS", "true", "cluster.tls", "tls.ca_file"),
        ] {
            let mut vars: Vec<(&str, &str)> =
                base.iter().copied().filter(|(k, _)| *k != var).collect();
            vars.push((var, value));
            let e = Config::load(None, env(&vars)).unwrap_err().to_string();
            assert!(
                e.contains(key)
                    && e.contains(words)
                    && e.contains(&format!("WARREN_{}", key.replace('.', "_").to_uppercase())),
                "{var}={value}: {e}"
            );
        }
        let e = Config::load(None, env(&[("WARREN_CLUSTER_NODE_ID", "1")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cluster.seed_nodes"), "{e}");
        let e = Config::load(None, env(&[("WARREN_CLUSTER_NODE_ID", "x")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("WARREN_CLUSTER_NODE_ID"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn management_listen_from_env_and_flag() {
        let d = Config::default().management;
        assert!(d.enabled);
        assert_eq!(d.listen.to_string(), "0.0.0.0:15672");
        let c = Config::load(
            None,
            env(&[("WARREN_MANAGEMENT_LISTEN", "127.0.0.1:15999")]),
        )
        .unwrap();
        assert_eq!(c.management.listen.to_string(), "127.0.0.1:15999");
        let flag = Override {
            section: "management",
            key: "listen",
            value: toml::Value::String("16000".into()),
            flag: "--management-listen",
        };
        let c = Config::load_with(
            None,
            env(&[("WARREN_MANAGEMENT_LISTEN", "127.0.0.1:15999")]),
            &[flag],
        )
        .unwrap();
        assert_eq!(c.management.listen, ListenAddr::Port(16000));
        let e = Config::load(None, env(&[("WARREN_MANAGEMENT_LISTEN", "nowhere")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("WARREN_MANAGEMENT_LISTEN"), "{e}");
        let c = Config::load(None, env(&[("WARREN_MANAGEMENT_ENABLED", "false")])).unwrap();
        assert!(!c.management.enabled);
    }

    #[test]
    fn httpmq_settings_from_env_flag_and_validation() {
        let d = Config::default().httpmq;
        assert!(d.enabled);
        assert_eq!(d.listen.to_string(), "0.0.0.0:1218");
        assert_eq!(d.default_maxqueue, 1_000_000);
        assert_eq!(d.vhost, "/");
        assert_eq!(d.auth, None);
        let c = Config::load(
            None,
            env(&[
                ("WARREN_HTTPMQ_LISTEN", "127.0.0.1:11218"),
                ("WARREN_HTTPMQ_AUTH", "s3cret"),
                ("WARREN_HTTPMQ_DEFAULT_MAXQUEUE", "500"),
                ("WARREN_HTTPMQ_VHOST", "staging"),
            ]),
        )
        .unwrap();
        assert_eq!(c.httpmq.listen.to_string(), "127.0.0.1:11218");
        assert_eq!(c.httpmq.auth.as_deref(), Some("s3cret"));
        assert_eq!(c.httpmq.default_maxqueue, 500);
        assert_eq!(c.httpmq.vhost, "staging");
        let flag = Override {
            section: "httpmq",
            key: "listen",
            value: toml::Value::String("1300".into()),
            flag: "--httpmq-listen",
        };
        let c = Config::load_with(
            None,
            env(&[("WARREN_HTTPMQ_LISTEN", "127.0.0.1:11218")]),
            &[flag],
        )
        .unwrap();
        assert_eq!(c.httpmq.listen, ListenAddr::Port(1300));
        for (var, value) in [
            ("WARREN_HTTPMQ_DEFAULT_MAXQUEUE", "0"),
            ("WARREN_HTTPMQ_DEFAULT_MAXQUEUE", "10000001"),
            ("WARREN_HTTPMQ_MAX_BODY_BYTES", "0"),
            ("WARREN_HTTPMQ_MAX_CONNECTIONS", "0"),
            ("WARREN_HTTPMQ_CHECKPOINT_MS", "0"),
            ("WARREN_HTTPMQ_TLS", "true"),
        ] {
            let e = Config::load(None, env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(var), "{var}={value}: {e}");
        }
        let c = Config::load(None, env(&[("WARREN_HTTPMQ_ENABLED", "false")])).unwrap();
        assert!(!c.httpmq.enabled);
    }

    #[test]
    fn env_overrides() {
        let c = Config::load(
            None,
            env(&[
                ("WARREN_AMQP_LISTEN", "127.0.0.1:5999"),
                ("WARREN_AMQP_FRAME_MAX", "8192"),
                ("WARREN_LOG_LEVEL", "debug"),
                ("WARREN_STORAGE_DISK_FREE_LIMIT", "1GB"),
                ("WARREN_AMQP_CONSUMER_TIMEOUT", "60000"),
                ("WARREN_BIN", "target/debug/warren"),
                ("WARREN_CTL_PASSWORD", "secret"),
                ("WARREN_CTL_URL", "http://localhost:15672"),
                ("OTHER", "x"),
            ]),
        )
        .unwrap();
        assert_eq!(c.amqp.listen.port(), 5999);
        assert_eq!(c.amqp.frame_max, 8192);
        assert_eq!(c.amqp.consumer_timeout(), Some(60_000));
        assert_eq!(Config::default().amqp.consumer_timeout(), Some(1_800_000));
        let off = Config::load(None, env(&[("WARREN_AMQP_CONSUMER_TIMEOUT", "0")])).unwrap();
        assert_eq!(off.amqp.consumer_timeout(), None);
        assert_eq!(c.log.level, "debug");
        assert_eq!(
            c.storage.disk_free_limit,
            DiskFreeLimit::Bytes(1_000_000_000)
        );
    }

    #[test]
    fn listen_forms_in_file_env_and_flags() {
        let dir = scratch("listen");
        let p = dir.join("warren.toml");
        std::fs::write(&p, "[amqp]\nlisten = 5673\n").unwrap();
        let c = Config::load(Some(&p), Vec::new()).unwrap();
        assert_eq!(c.amqp.listen, ListenAddr::Port(5673));
        let c = Config::load(None, env(&[("WARREN_AMQP_LISTEN", "5674")])).unwrap();
        assert_eq!(c.amqp.listen, ListenAddr::Port(5674));
        let flag = Override {
            section: "amqp",
            key: "listen",
            value: toml::Value::String("localhost:5675".into()),
            flag: "--amqp-listen",
        };
        let c = Config::load_with(Some(&p), Vec::new(), &[flag]).unwrap();
        assert_eq!(c.amqp.listen, ListenAddr::Host("localhost".into(), 5675));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn errors_name_their_source() {
        // An unknown key: the variable is named.
        let e = Config::load(None, env(&[("WARREN_AMQP_NOPE", "1")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("WARREN_AMQP_NOPE") && e.contains("nope"), "{e}");
        // An unknown section is refused like an unknown key.
        let e = Config::load(None, env(&[("WARREN_FOO_BAR", "1")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("WARREN_FOO_BAR") && e.contains("no such setting"),
            "{e}"
        );
        // A bad value in the file: the file, line and key.
        let dir = scratch("errors");
        let p = dir.join("warren.toml");
        std::fs::write(&p, "[amqp]\nheartbeat = 10\nlistne = 5672\n").unwrap();
        let e = Config::load(Some(&p), Vec::new()).unwrap_err().to_string();
        assert!(e.contains(&p.display().to_string()), "{e}");
        assert!(e.contains("line 3") && e.contains("listne"), "{e}");
        std::fs::write(&p, "[amqp]\nmax_message_size = 0\n").unwrap();
        let e = Config::load(Some(&p), Vec::new()).unwrap_err().to_string();
        assert!(
            e.contains("amqp.max_message_size = 0") && e.contains(&format!("{}:2)", p.display())),
            "{e}"
        );
        // A value refused by its range names its line too, wherever the key is.
        std::fs::write(
            &p,
            "# Warren\n\n[storage]\nsegment_size = 1048576\n\n[amqp]\nheartbeat = 10\n\
             frame_max = 1024\n",
        )
        .unwrap();
        let e = Config::load(Some(&p), Vec::new()).unwrap_err().to_string();
        assert!(
            e.contains(&format!("amqp.frame_max = 1024 ({}:8)", p.display())),
            "{e}"
        );
        // A range error from the environment names the variable.
        let e = Config::load(None, env(&[("WARREN_STORAGE_FSYNC_BATCH_BYTES", "0")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("environment variable WARREN_STORAGE_FSYNC_BATCH_BYTES"),
            "{e}"
        );
        let e = Config::load(None, env(&[("WARREN_AMQP_LISTEN", "nowhere")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("WARREN_AMQP_LISTEN") && e.contains("nowhere"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn useless_values_are_refused() {
        for (var, value) in [
            ("WARREN_AMQP_FRAME_MAX", "1024"),
            ("WARREN_AMQP_CHANNEL_MAX", "0"),
            ("WARREN_AMQP_MAX_MESSAGE_SIZE", "0"),
            ("WARREN_AMQP_MAX_MESSAGE_SIZE", "536870913"),
            ("WARREN_AMQP_MAX_CONNECTIONS", "0"),
            ("WARREN_AMQP_MAX_TABLE_DEPTH", "0"),
            ("WARREN_AMQP_HANDSHAKE_TIMEOUT", "0"),
            ("WARREN_AMQP_CONSUMER_TIMEOUT", "-1"),
            ("WARREN_AMQP_CONSUMER_TIMEOUT", "30min"),
            ("WARREN_STORAGE_DATA_DIR", "\"\""),
            ("WARREN_STORAGE_SEGMENT_SIZE", "100"),
            ("WARREN_STORAGE_FSYNC_BATCH_BYTES", "0"),
            ("WARREN_STORAGE_FSYNC_DELAY_US", "60000000"),
            ("WARREN_STORAGE_QUEUE_WINDOW", "0"),
            ("WARREN_STORAGE_QUEUE_WINDOW_BYTES", "0"),
            ("WARREN_STORAGE_DISK_FREE_LIMIT", "1.5"),
            ("WARREN_STORAGE_DISK_FREE_LIMIT", "lots"),
            ("WARREN_STORAGE_DISK_FREE_LIMIT_RELATIVE", "-1"),
            ("WARREN_MEMORY_HIGH_WATERMARK", "0"),
            ("WARREN_MEMORY_HIGH_WATERMARK", "2"),
            ("WARREN_LOG_LEVEL", "verbose"),
            ("WARREN_LOG_FORMAT", "xml"),
        ] {
            let e = Config::load(None, env(&[(var, value)]));
            assert!(e.is_err(), "{var}={value} accepted");
            let text = e.unwrap_err().to_string();
            assert!(text.contains(var), "{var}={value}: {text}");
        }
        let dir = scratch("users");
        let p = dir.join("warren.toml");
        std::fs::write(
            &p,
            "[[users]]\nname = \"a\"\npassword = \"x\"\n[[users]]\nname = \"a\"\npassword = \"y\"\n",
        )
        .unwrap();
        let e = Config::load(Some(&p), Vec::new()).unwrap_err().to_string();
        assert!(e.contains("listed twice"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tls_auth_and_definitions_from_the_environment() {
        let c = Config::load(
            None,
            env(&[
                ("WARREN_TLS_LISTEN", "127.0.0.1:5999"),
                ("WARREN_TLS_CERT_FILE", "/etc/warren/server.pem"),
                ("WARREN_TLS_KEY_FILE", "/etc/warren/server.key"),
                ("WARREN_TLS_CA_FILE", "/etc/warren/ca.pem"),
                ("WARREN_TLS_VERIFY_PEER", "true"),
                ("WARREN_AUTH_MECHANISMS", "EXTERNAL, PLAIN"),
                ("WARREN_AUTH_LOOPBACK_USERS", ""),
                ("WARREN_AUTH_SSL_CERT_LOGIN_FROM", "common_name"),
                ("WARREN_AUTH_ANONYMOUS_USER", "anon"),
                ("WARREN_DEFINITIONS_LOAD_FILE", "/etc/warren/defs.json"),
            ]),
        )
        .unwrap();
        assert!(c.tls.enabled() && c.tls.verify_peer);
        assert_eq!(c.tls.listen.port(), 5999);
        assert_eq!(c.auth.mechanisms, ["EXTERNAL", "PLAIN"]);
        assert!(c.auth.loopback_users.is_empty());
        assert_eq!(
            c.auth.ssl_cert_login_from,
            crate::tls::CertLoginFrom::CommonName
        );
        assert_eq!(c.auth.anonymous_user.as_deref(), Some("anon"));
        assert_eq!(
            c.definitions.load_file.as_deref(),
            Some(Path::new("/etc/warren/defs.json"))
        );
        let d = Config::default();
        assert_eq!(d.auth.mechanisms, ["PLAIN", "AMQPLAIN"]);
        assert_eq!(d.auth.loopback_users, ["guest"]);
        assert!(!d.tls.enabled());
    }

    #[test]
    fn bad_security_settings_are_refused() {
        for (var, value, says) in [
            (
                "WARREN_AUTH_MECHANISMS",
                "PLAIN,CRAM-MD5",
                "unknown mechanism",
            ),
            ("WARREN_AUTH_MECHANISMS", "PLAIN,PLAIN", "listed twice"),
            ("WARREN_AUTH_MECHANISMS", "", "at least one"),
            ("WARREN_AUTH_ANONYMOUS_USER", "\"\"", "leave it unset"),
            ("WARREN_TLS_VERIFY_PEER", "true", "needs tls.ca_file"),
            ("WARREN_TLS_CERT_FILE", "/x.pem", "tls.key_file is not"),
        ] {
            let e = Config::load(None, env(&[(var, value)]))
                .expect_err(var)
                .to_string();
            assert!(e.contains(var) && e.contains(says), "{var}={value}: {e}");
        }
        let dir = scratch("bad-users");
        let p = dir.join("warren.toml");
        for (toml, says) in [
            (
                "[[users]]\nname = \"a\"\npassword = \"x\"\npassword_hash = \"eA==\"\n",
                "not both",
            ),
            (
                "[[users]]\nname = \"a\"\npassword_hash = \"eA==\"\nhashing_algorithm = \"sha1\"\n",
                "unknown hashing_algorithm",
            ),
            (
                "[[users]]\nname = \"a\"\npassword_hash = \"%%\"\n",
                "not base64",
            ),
            (
                "[[permissions]]\nuser = \"a\"\nconfigure = \"(\"\nwrite = \"\"\nread = \"\"\n",
                "permissions",
            ),
            (
                "[[vhosts]]\nname = \"v\"\n[[vhosts]]\nname = \"v\"\n",
                "listed twice",
            ),
        ] {
            std::fs::write(&p, toml).unwrap();
            let e = Config::load(Some(&p), Vec::new()).unwrap_err().to_string();
            assert!(e.contains(says), "{toml}: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn passwords_are_hashed_and_not_printed() {
        let dir = scratch("user-password");
        let p = dir.join("warren.toml");
        std::fs::write(&p, "[[users]]\nname = \"a\"\npassword = \"hunter2\"\n").unwrap();
        let c = Config::load(Some(&p), Vec::new()).unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        let hash = c.users[0].credential().unwrap();
        assert!(hash.verify("hunter2") && !hash.verify("hunter3"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn information_units_as_rabbitmq() {
        assert_eq!(parse_information_unit("50MB"), Some(50_000_000));
        assert_eq!(parse_information_unit("1GB"), Some(1_000_000_000));
        assert_eq!(parse_information_unit("1G"), Some(1_000_000_000));
        assert_eq!(parse_information_unit("512MiB"), Some(512 << 20));
        assert_eq!(parse_information_unit("2Gi"), Some(2 << 30));
        assert_eq!(parse_information_unit("100"), Some(100));
        assert_eq!(parse_information_unit("kB"), None);
        assert_eq!(parse_information_unit("5 MB"), None);
        assert_eq!(parse_information_unit("5XB"), None);
        let c = Config::load(None, env(&[("WARREN_STORAGE_DISK_FREE_LIMIT", "0.05")])).unwrap();
        assert_eq!(
            c.storage.disk_free_limit,
            DiskFreeLimit::FractionOfDisk(0.05)
        );
        assert_eq!(c.storage.disk_free_limit_bytes(1000, 0), 50);
        let c = Config::load(
            None,
            env(&[("WARREN_STORAGE_DISK_FREE_LIMIT_RELATIVE", "1.5")]),
        )
        .unwrap();
        assert_eq!(c.storage.disk_free_limit_bytes(1000, 2000), 3000);
    }
}

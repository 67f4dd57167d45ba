//! The command line (clap) and what each command asks of the management API.
//!
//! Paths and bodies are RabbitMQ's (the management plugin's HTTP API reference): every
//! command works against Warren and against RabbitMQ alike.

use crate::client::{exchange_seg, seg, Client};
use crate::output;
use crate::CtlError;
use clap::{ArgAction, Args, Subcommand, ValueEnum};
use reqwest::Method;
use serde_json::{json, Map, Value};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// `warren ctl`: manage a running broker through its management HTTP API.
#[derive(Args, Debug)]
pub struct CtlArgs {
    #[command(flatten)]
    pub conn: ConnectionArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the management API is and who calls it. These come before the command
/// (`warren ctl --port 15673 list queues`); `--vhost` and `--json` may go anywhere.
#[derive(Args, Debug)]
pub struct ConnectionArgs {
    /// Base URL of the management API, e.g. http://broker:15672 (instead of --host and
    /// --port; a path prefix is kept). Plain HTTP only.
    #[arg(long, env = "WARREN_CTL_URL", value_name = "URL")]
    pub url: Option<String>,
    /// Management API host.
    #[arg(
        short = 'H',
        long,
        env = "WARREN_CTL_HOST",
        default_value = "localhost"
    )]
    pub host: String,
    /// Management API port.
    #[arg(short = 'P', long, env = "WARREN_CTL_PORT", default_value_t = 15672)]
    pub port: u16,
    /// User name (HTTP basic auth).
    #[arg(
        short = 'u',
        long,
        env = "WARREN_CTL_USERNAME",
        default_value = "guest"
    )]
    pub username: String,
    /// Password (HTTP basic auth).
    #[arg(
        short = 'p',
        long,
        env = "WARREN_CTL_PASSWORD",
        default_value = "guest",
        hide_env_values = true
    )]
    pub password: String,
    /// Seconds to wait for each reply.
    #[arg(
        long,
        env = "WARREN_CTL_TIMEOUT",
        default_value_t = 30,
        value_name = "SECONDS"
    )]
    pub timeout: u64,
    /// Virtual host of the command [default: /]; lists show every vhost without it.
    #[arg(short = 'V', long, env = "WARREN_CTL_VHOST", global = true)]
    pub vhost: Option<String>,
    /// Print the server's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

impl ConnectionArgs {
    /// The API's base URL: `--url`, or `http://HOST:PORT`.
    pub fn base_url(&self) -> String {
        match &self.url {
            Some(u) => u.clone(),
            None if self.host.contains(':') && !self.host.starts_with('[') => {
                format!("http://[{}]:{}", self.host, self.port)
            }
            None => format!("http://{}:{}", self.host, self.port),
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// List objects (every vhost unless --vhost is given).
    List(ListArgs),
    /// Create an object, or set it (users, permissions, policies).
    #[command(subcommand)]
    Declare(Declare),
    /// Delete an object.
    #[command(subcommand)]
    Delete(Delete),
    /// Remove every ready message from a queue.
    #[command(subcommand)]
    Purge(Purge),
    /// Publish one message through an exchange (the default exchange unless --exchange).
    Publish(PublishArgs),
    /// Get messages from a queue (basic.get), requeued by default.
    Get(GetArgs),
    /// Close a client connection.
    #[command(subcommand)]
    Close(Close),
    /// Write the broker's definitions (RabbitMQ's JSON) to a file or standard output.
    #[command(subcommand)]
    Export(Export),
    /// Load definitions (RabbitMQ's JSON) from a file or standard input.
    #[command(subcommand)]
    Import(Import),
    /// Versions, object totals, queue totals and message counters.
    Overview,
    /// Run a health check; exit status 1 when it fails, with its reason.
    #[command(subcommand)]
    HealthCheck(HealthCheck),
    /// The cluster's nodes.
    #[command(subcommand)]
    Cluster(Cluster),
    /// A quorum queue's replicas (RabbitMQ's `rabbitmq-queues`).
    #[command(subcommand)]
    Quorum(Quorum),
}

#[derive(Subcommand, Debug)]
pub enum Cluster {
    /// Every node of the cluster and whether it runs (GET /api/nodes).
    Status,
    /// Adds a running node to the cluster: NODE is `ID@HOST:PORT`, its `[cluster] node_id`
    /// and `listen` address (POST /api/cluster/nodes). It catches up, then votes.
    AddNode { node: String },
    /// Removes NODE (`warren-<id>@<host>` or its id) from the cluster, as RabbitMQ's
    /// `forget_cluster_node`: stop it first (DELETE /api/cluster/nodes/NODE).
    RemoveNode { node: String },
}

#[derive(Subcommand, Debug)]
pub enum Quorum {
    /// Adds a member of QUEUE on NODE (`warren-<id>@<host>`, as `cluster status` names it):
    /// POST /api/queues/quorum/VHOST/QUEUE/replicas/add.
    AddMember { queue: String, node: String },
    /// Removes the member of QUEUE on NODE: DELETE
    /// /api/queues/quorum/VHOST/QUEUE/replicas/delete.
    DeleteMember { queue: String, node: String },
    /// Where QUEUE's members are: leader, members and those online.
    Members { queue: String },
    /// Adds a member on NODE to every quorum queue of the vhost that has none there
    /// (RabbitMQ's `rabbitmq-queues grow`).
    Grow { node: String },
    /// Removes the member on NODE of every quorum queue of the vhost that has one there and
    /// other members (RabbitMQ's `rabbitmq-queues shrink`).
    Shrink { node: String },
}

/// What `list` lists.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListKind {
    Queues,
    Exchanges,
    Bindings,
    Connections,
    Channels,
    Consumers,
    Users,
    Vhosts,
    Permissions,
    Policies,
    OperatorPolicies,
    /// Runtime parameters (rabbitmqadmin's `list parameters`).
    Parameters,
    /// Global runtime parameters.
    GlobalParameters,
    Nodes,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// What to list.
    #[arg(value_enum)]
    pub what: ListKind,
    /// Table columns, comma-separated dotted keys of the JSON (e.g. name,messages,
    /// message_stats.publish).
    #[arg(long, value_delimiter = ',')]
    pub columns: Vec<String>,
}

/// Where a binding leads.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DestinationType {
    Queue,
    Exchange,
}

impl DestinationType {
    /// The path segment: `q` or `e`.
    fn seg(self) -> &'static str {
        match self {
            DestinationType::Queue => "q",
            DestinationType::Exchange => "e",
        }
    }
}

#[derive(Subcommand, Debug)]
pub enum Declare {
    /// PUT /api/queues/VHOST/NAME.
    Queue {
        #[arg(long)]
        name: String,
        /// Durable (survives a restart).
        #[arg(long, default_value_t = true, action = ArgAction::Set)]
        durable: bool,
        #[arg(long)]
        auto_delete: bool,
        /// Queue type (x-queue-type): classic, quorum, stream.
        #[arg(long = "type", value_name = "TYPE")]
        queue_type: Option<String>,
        /// Queue arguments as a JSON object, e.g. '{"x-max-length": 10}'.
        #[arg(long, value_name = "JSON")]
        arguments: Option<String>,
    },
    /// PUT /api/exchanges/VHOST/NAME.
    Exchange {
        #[arg(long)]
        name: String,
        /// direct, fanout, topic, headers, or a plugin's type.
        #[arg(long = "type", default_value = "direct", value_name = "TYPE")]
        exchange_type: String,
        #[arg(long, default_value_t = true, action = ArgAction::Set)]
        durable: bool,
        #[arg(long)]
        auto_delete: bool,
        #[arg(long)]
        internal: bool,
        /// Exchange arguments as a JSON object, e.g. '{"alternate-exchange": "ae"}'.
        #[arg(long, value_name = "JSON")]
        arguments: Option<String>,
    },
    /// POST /api/bindings/VHOST/e/SOURCE/q|e/DESTINATION.
    Binding {
        /// Source exchange.
        #[arg(long)]
        source: String,
        /// Destination queue or exchange.
        #[arg(long)]
        destination: String,
        #[arg(long, value_enum, default_value = "queue")]
        destination_type: DestinationType,
        #[arg(long, default_value = "")]
        routing_key: String,
        /// Binding arguments as a JSON object (headers exchanges: '{"x-match": "all"}').
        #[arg(long, value_name = "JSON")]
        arguments: Option<String>,
    },
    /// PUT /api/vhosts/NAME.
    Vhost {
        #[arg(long)]
        name: String,
        #[arg(long)]
        description: Option<String>,
        /// Comma-separated tags.
        #[arg(long)]
        tags: Option<String>,
        /// classic, quorum or stream.
        #[arg(long)]
        default_queue_type: Option<String>,
        #[arg(long)]
        tracing: bool,
    },
    /// PUT /api/users/NAME (creates or replaces the user).
    User {
        #[arg(long)]
        name: String,
        /// The user's password (the server stores its hash).
        #[arg(long, conflicts_with = "password_hash")]
        password: Option<String>,
        /// A RabbitMQ password hash (base64), as `warren --hash-password` prints.
        #[arg(long)]
        password_hash: Option<String>,
        /// rabbit_password_hashing_sha256 (default), _sha512 or _md5, for --password-hash.
        #[arg(long, requires = "password_hash")]
        hashing_algorithm: Option<String>,
        /// Comma-separated tags: administrator, monitoring, policymaker, management.
        #[arg(long, default_value = "")]
        tags: String,
    },
    /// PUT /api/permissions/VHOST/USER.
    Permission {
        #[arg(long)]
        user: String,
        /// Regular expression of the names the user may configure.
        #[arg(long, default_value = ".*")]
        configure: String,
        #[arg(long, default_value = ".*")]
        write: String,
        #[arg(long, default_value = ".*")]
        read: String,
    },
    /// PUT /api/policies/VHOST/NAME.
    Policy(PolicyArgs),
    /// PUT /api/operator-policies/VHOST/NAME.
    OperatorPolicy(PolicyArgs),
}

#[derive(Args, Debug)]
pub struct PolicyArgs {
    #[arg(long)]
    pub name: String,
    /// Regular expression of the queue or exchange names it applies to.
    #[arg(long)]
    pub pattern: String,
    /// The policy's keys as a JSON object, e.g. '{"max-length": 100}'.
    #[arg(long, value_name = "JSON")]
    pub definition: String,
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub priority: i64,
    /// queues, exchanges, all (and RabbitMQ's classic_queues, quorum_queues, streams).
    #[arg(long, default_value = "all")]
    pub apply_to: String,
}

#[derive(Subcommand, Debug)]
pub enum Delete {
    /// DELETE /api/queues/VHOST/NAME.
    Queue {
        #[arg(long)]
        name: String,
        /// Refuse if the queue has consumers.
        #[arg(long)]
        if_unused: bool,
        /// Refuse if the queue has messages.
        #[arg(long)]
        if_empty: bool,
    },
    /// DELETE /api/exchanges/VHOST/NAME.
    Exchange {
        #[arg(long)]
        name: String,
        /// Refuse if the exchange has bindings.
        #[arg(long)]
        if_unused: bool,
    },
    /// The binding from SOURCE to DESTINATION with this routing key and arguments.
    Binding {
        #[arg(long)]
        source: String,
        #[arg(long)]
        destination: String,
        #[arg(long, value_enum, default_value = "queue")]
        destination_type: DestinationType,
        #[arg(long, default_value = "")]
        routing_key: String,
        /// The binding's arguments as a JSON object [default: {}].
        #[arg(long, value_name = "JSON")]
        arguments: Option<String>,
        /// The binding's properties_key as listed (instead of --routing-key and --arguments).
        #[arg(long, conflicts_with_all = ["routing_key", "arguments"])]
        properties_key: Option<String>,
    },
    /// DELETE /api/vhosts/NAME (and everything in it).
    Vhost {
        #[arg(long)]
        name: String,
    },
    /// DELETE /api/users/NAME.
    User {
        #[arg(long)]
        name: String,
    },
    /// DELETE /api/permissions/VHOST/USER.
    Permission {
        #[arg(long)]
        user: String,
    },
    /// DELETE /api/policies/VHOST/NAME.
    Policy {
        #[arg(long)]
        name: String,
    },
    /// DELETE /api/operator-policies/VHOST/NAME.
    OperatorPolicy {
        #[arg(long)]
        name: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum Purge {
    /// DELETE /api/queues/VHOST/NAME/contents.
    Queue {
        #[arg(long)]
        name: String,
    },
}

#[derive(Args, Debug)]
pub struct PublishArgs {
    /// Exchange ("" is the default exchange).
    #[arg(long, default_value = "")]
    pub exchange: String,
    #[arg(long, default_value = "")]
    pub routing_key: String,
    /// The message body as text.
    #[arg(long, conflicts_with = "payload_file")]
    pub payload: Option<String>,
    /// Read the body from FILE (`-` for standard input; standard input is read when neither
    /// --payload nor --payload-file is given). A body that is not UTF-8 is sent as base64.
    #[arg(long, value_name = "FILE")]
    pub payload_file: Option<PathBuf>,
    /// Message properties as a JSON object, e.g. '{"delivery_mode": 2, "headers": {"k": 1}}'.
    #[arg(long, value_name = "JSON")]
    pub properties: Option<String>,
}

/// How `get` settles what it took (the management API's `ackmode`).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckMode {
    /// Requeue (the message stays in the queue, marked redelivered).
    AckRequeueTrue,
    /// Acknowledge: the message leaves the queue.
    AckRequeueFalse,
    /// Reject and requeue.
    RejectRequeueTrue,
    /// Reject without requeue (dead-lettered if the queue has a DLX).
    RejectRequeueFalse,
}

impl AckMode {
    fn name(self) -> &'static str {
        match self {
            AckMode::AckRequeueTrue => "ack_requeue_true",
            AckMode::AckRequeueFalse => "ack_requeue_false",
            AckMode::RejectRequeueTrue => "reject_requeue_true",
            AckMode::RejectRequeueFalse => "reject_requeue_false",
        }
    }
}

#[derive(Args, Debug)]
pub struct GetArgs {
    /// Queue name.
    #[arg(long)]
    pub queue: String,
    /// How many messages at most.
    #[arg(long, default_value_t = 1)]
    pub count: u32,
    #[arg(long, value_enum, default_value = "ack-requeue-true")]
    pub ackmode: AckMode,
    /// auto (text when it is UTF-8, else base64) or base64.
    #[arg(long, default_value = "auto")]
    pub encoding: String,
    /// Show at most this many bytes of each body.
    #[arg(long)]
    pub truncate: Option<u64>,
}

#[derive(Subcommand, Debug)]
pub enum Close {
    /// DELETE /api/connections/NAME (the name as `list connections` shows it).
    Connection {
        #[arg(long)]
        name: String,
        /// Reason given to the client (X-Reason).
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum Export {
    /// GET /api/definitions (the whole broker).
    Definitions {
        /// Output file (`-` or none: standard output).
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum Import {
    /// POST /api/definitions.
    Definitions {
        /// Input file (`-` or none: standard input).
        #[arg(long, value_name = "FILE")]
        file: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum HealthCheck {
    /// No resource alarm (memory, disk) anywhere in the cluster.
    Alarms,
    /// No resource alarm on this node.
    LocalAlarms,
    /// A listener on PORT (e.g. 5672).
    PortListener { port: u16 },
    /// A listener for PROTOCOL (amqp, amqp/ssl, http...).
    ProtocolListener { protocol: String },
    /// Every vhost is running.
    VirtualHosts,
    /// The node serves clients (RabbitMQ 4's `is-in-service`).
    IsInService,
    /// An AMQP listener is up and the node is below its connection limit.
    ReadyToServeClients,
    /// The node is below its connection limit.
    BelowNodeConnectionLimit,
    /// No queue would lose its quorum if this node stopped.
    NodeIsQuorumCritical,
    /// Every quorum queue with a member on this node knows its leader: those of the vhost,
    /// or of every vhost with --all-vhosts; --pattern keeps the queues whose name matches
    /// (a regular expression, as RabbitMQ's).
    QuorumQueuesWithoutElectedLeaders {
        /// Every vhost, not only the one of --vhost.
        #[arg(long)]
        all_vhosts: bool,
        /// Only queues whose name matches this regular expression.
        #[arg(long)]
        pattern: Option<String>,
    },
    /// No certificate of a TLS listener expires within WITHIN UNITs (days, weeks, months,
    /// years).
    CertificateExpiration { within: u32, unit: String },
    /// Declares a queue `aliveness-test` in the vhost, publishes a message to it and gets it.
    Aliveness,
}

/// Runs a parsed `warren ctl` command: results on `out`, the failure's reason (and warnings)
/// on `err`. Exit status 0 on success, 1 on any failure.
pub fn run(args: CtlArgs, out: &mut dyn Write, err: &mut dyn Write) -> ExitCode {
    let result = Client::new(
        &args.conn.base_url(),
        &args.conn.username,
        &args.conn.password,
        Duration::from_secs(args.conn.timeout.max(1)),
    )
    .and_then(|client| {
        let mut ctx = Ctx {
            client,
            vhost: args.conn.vhost.clone(),
            json: args.conn.json,
            out,
            err: &mut *err,
        };
        ctx.execute(&args.command)
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(err, "warren ctl: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Ctx<'a> {
    client: Client,
    /// `--vhost` as given.
    vhost: Option<String>,
    json: bool,
    out: &'a mut dyn Write,
    err: &'a mut dyn Write,
}

/// A JSON object from a command-line option (`--arguments`, `--definition`...).
fn object_arg(flag: &str, text: Option<&str>) -> Result<Value, CtlError> {
    let Some(text) = text else {
        return Ok(json!({}));
    };
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(CtlError::Input(format!("--{flag} must be a JSON object"))),
        Err(e) => Err(CtlError::Input(format!("--{flag} is not valid JSON: {e}"))),
    }
}

fn read_input(file: Option<&Path>) -> Result<Vec<u8>, CtlError> {
    match file {
        Some(p) if p != Path::new("-") => {
            std::fs::read(p).map_err(|e| CtlError::Io(format!("cannot read {}: {e}", p.display())))
        }
        _ => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| CtlError::Io(format!("cannot read standard input: {e}")))?;
            Ok(buf)
        }
    }
}

impl Ctx<'_> {
    /// The command's vhost: `--vhost`, or `/`.
    fn vhost(&self) -> &str {
        self.vhost.as_deref().unwrap_or("/")
    }

    fn v(&self) -> String {
        seg(self.vhost())
    }

    fn print(&mut self, text: &str) -> Result<(), CtlError> {
        match writeln!(self.out, "{text}") {
            // The reader went away (`warren ctl export definitions | head`): nothing to say.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            Err(e) => Err(CtlError::Io(format!("cannot write the output: {e}"))),
            Ok(()) => Ok(()),
        }
    }

    fn print_json(&mut self, v: &Value) -> Result<(), CtlError> {
        let text = serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
        self.print(&text)
    }

    /// After a write: the server's reply with `--json` (when it has one), else `message`.
    fn done(&mut self, reply: &Value, message: &str) -> Result<(), CtlError> {
        if self.json {
            if !reply.is_null() {
                self.print_json(reply)?;
            }
            Ok(())
        } else {
            self.print(message)
        }
    }

    fn put(&mut self, path: &str, body: Value, message: &str) -> Result<(), CtlError> {
        let reply = self.client.call(Method::PUT, path, Some(&body), &[])?;
        self.done(&reply, message)
    }

    fn delete(&mut self, path: &str, message: &str) -> Result<(), CtlError> {
        let reply = self.client.call(Method::DELETE, path, None, &[])?;
        self.done(&reply, message)
    }

    fn execute(&mut self, command: &Command) -> Result<(), CtlError> {
        match command {
            Command::List(l) => self.list(l),
            Command::Declare(d) => self.declare(d),
            Command::Delete(d) => self.delete_object(d),
            Command::Purge(Purge::Queue { name }) => {
                let path = format!("/api/queues/{}/{}/contents", self.v(), seg(name));
                self.delete(&path, "queue purged")
            }
            Command::Publish(p) => self.publish(p),
            Command::Get(g) => self.get(g),
            Command::Close(Close::Connection { name, reason }) => {
                let path = format!("/api/connections/{}", seg(name));
                let reason = reason.as_deref().unwrap_or("Closed via warren ctl");
                let reply =
                    self.client
                        .call(Method::DELETE, &path, None, &[("X-Reason", reason)])?;
                self.done(&reply, "connection closed")
            }
            Command::Export(Export::Definitions { file }) => {
                let defs = self.client.get("/api/definitions")?;
                let text = serde_json::to_string_pretty(&defs).unwrap_or_default();
                match file {
                    Some(p) if p != Path::new("-") => {
                        std::fs::write(p, text + "\n").map_err(|e| {
                            CtlError::Io(format!("cannot write {}: {e}", p.display()))
                        })?;
                        if !self.json {
                            self.print(&format!("exported definitions to {}", p.display()))?;
                        }
                        Ok(())
                    }
                    _ => self.print(&text),
                }
            }
            Command::Import(Import::Definitions { file }) => {
                let bytes = read_input(file.as_deref())?;
                let defs: Value = serde_json::from_slice(&bytes).map_err(|e| {
                    CtlError::Input(format!("the definitions are not valid JSON: {e}"))
                })?;
                if !defs.is_object() {
                    return Err(CtlError::Input(
                        "the definitions must be a JSON object".into(),
                    ));
                }
                let reply = self
                    .client
                    .call(Method::POST, "/api/definitions", Some(&defs), &[])?;
                self.done(&reply, "imported definitions")
            }
            Command::Cluster(Cluster::Status) => {
                let reply = self.client.get("/api/nodes")?;
                if self.json {
                    return self.print_json(&reply);
                }
                let rows = output::rows(&reply);
                self.print(&output::table(&rows, &["name", "running", "uptime"]))
            }
            Command::Cluster(Cluster::AddNode { node }) => {
                let body = serde_json::json!({ "node": node });
                let reply =
                    self.client
                        .call(Method::POST, "/api/cluster/nodes", Some(&body), &[])?;
                self.done(&reply, &format!("node {node} added to the cluster"))
            }
            Command::Cluster(Cluster::RemoveNode { node }) => {
                let reply = self.client.call(
                    Method::DELETE,
                    &format!("/api/cluster/nodes/{}", seg(node)),
                    None,
                    &[],
                )?;
                self.done(&reply, &format!("node {node} removed from the cluster"))
            }
            Command::Quorum(q) => self.quorum(q),
            Command::Overview => {
                let o = self.client.get("/api/overview")?;
                if self.json {
                    self.print_json(&o)
                } else {
                    self.print(&output::key_value(&o))
                }
            }
            Command::HealthCheck(h) => {
                let path = match h {
                    HealthCheck::Alarms => "/api/health/checks/alarms".to_string(),
                    HealthCheck::LocalAlarms => "/api/health/checks/local-alarms".to_string(),
                    HealthCheck::PortListener { port } => {
                        format!("/api/health/checks/port-listener/{port}")
                    }
                    HealthCheck::ProtocolListener { protocol } => {
                        format!("/api/health/checks/protocol-listener/{}", seg(protocol))
                    }
                    HealthCheck::VirtualHosts => "/api/health/checks/virtual-hosts".to_string(),
                    HealthCheck::IsInService => "/api/health/checks/is-in-service".to_string(),
                    HealthCheck::ReadyToServeClients => {
                        "/api/health/checks/ready-to-serve-clients".to_string()
                    }
                    HealthCheck::BelowNodeConnectionLimit => {
                        "/api/health/checks/below-node-connection-limit".to_string()
                    }
                    HealthCheck::NodeIsQuorumCritical => {
                        "/api/health/checks/node-is-quorum-critical".to_string()
                    }
                    HealthCheck::QuorumQueuesWithoutElectedLeaders {
                        all_vhosts,
                        pattern,
                    } => {
                        let base = "/api/health/checks/quorum-queues-without-elected-leaders";
                        let scope = if *all_vhosts {
                            format!("{base}/all-vhosts")
                        } else {
                            format!("{base}/vhost/{}", self.v())
                        };
                        match pattern {
                            Some(p) => format!("{scope}/pattern/{}", seg(p)),
                            None => scope,
                        }
                    }
                    HealthCheck::CertificateExpiration { within, unit } => format!(
                        "/api/health/checks/certificate-expiration/{within}/{}",
                        seg(unit)
                    ),
                    HealthCheck::Aliveness => format!("/api/aliveness-test/{}", self.v()),
                };
                let reply = self.client.get(&path)?;
                self.done(&reply, "ok")
            }
        }
    }

    /// `quorum grow` (`grow`) or `quorum shrink` over the vhost's quorum queues: one line per
    /// queue changed or refused; an error when any was refused.
    fn grow_or_shrink(&mut self, node: &str, grow: bool) -> Result<(), CtlError> {
        let queues = self.client.get(&format!("/api/queues/{}", self.v()))?;
        let mut failed = 0usize;
        let mut lines = Vec::new();
        for q in queues.as_array().map(Vec::as_slice).unwrap_or(&[]) {
            if q.get("type").and_then(Value::as_str) != Some("quorum") {
                continue;
            }
            let Some(name) = q.get("name").and_then(Value::as_str) else {
                continue;
            };
            let members: Vec<&str> = q
                .get("members")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let has = members.contains(&node);
            if grow == has || (!grow && members.len() < 2) {
                continue;
            }
            let (method, what) = if grow {
                (Method::POST, "add")
            } else {
                (Method::DELETE, "delete")
            };
            let path = format!(
                "/api/queues/quorum/{}/{}/replicas/{what}",
                self.v(),
                seg(name)
            );
            let body = serde_json::json!({ "node": node });
            match self.client.call(method, &path, Some(&body), &[]) {
                Ok(_) => lines.push(format!(
                    "{name}: {}",
                    if grow { "added" } else { "removed" }
                )),
                Err(e) => {
                    failed += 1;
                    lines.push(format!("{name}: refused: {e}"));
                }
            }
        }
        if lines.is_empty() {
            lines.push("no quorum queue to change".into());
        }
        self.print(&lines.join("\n"))?;
        if failed > 0 {
            return Err(CtlError::Input(format!(
                "{failed} quorum queue(s) not changed"
            )));
        }
        Ok(())
    }

    fn quorum(&mut self, q: &Quorum) -> Result<(), CtlError> {
        let path = |queue: &str, what: &str| {
            format!(
                "/api/queues/quorum/{}/{}/replicas/{what}",
                self.v(),
                seg(queue)
            )
        };
        match q {
            Quorum::AddMember { queue, node } => {
                let body = serde_json::json!({ "node": node });
                let reply =
                    self.client
                        .call(Method::POST, &path(queue, "add"), Some(&body), &[])?;
                self.done(&reply, &format!("member of {queue} added on {node}"))
            }
            Quorum::DeleteMember { queue, node } => {
                let body = serde_json::json!({ "node": node });
                let reply =
                    self.client
                        .call(Method::DELETE, &path(queue, "delete"), Some(&body), &[])?;
                self.done(&reply, &format!("member of {queue} on {node} removed"))
            }
            Quorum::Grow { node } => self.grow_or_shrink(node, true),
            Quorum::Shrink { node } => self.grow_or_shrink(node, false),
            Quorum::Members { queue } => {
                let q = self
                    .client
                    .get(&format!("/api/queues/{}/{}", self.v(), seg(queue)))?;
                if self.json {
                    return self.print_json(&q);
                }
                let list = |k: &str| {
                    q.get(k)
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .collect::<Vec<_>>()
                                .join(", ")
                        })
                        .unwrap_or_default()
                };
                let leader = q.get("leader").and_then(Value::as_str).unwrap_or("");
                let text = format!(
                    "leader: {leader}\nmembers: {}\nonline: {}",
                    list("members"),
                    list("online")
                );
                self.print(&text)
            }
        }
    }

    fn list(&mut self, l: &ListArgs) -> Result<(), CtlError> {
        use ListKind::*;
        let v = self.vhost.as_deref().map(seg);
        let scoped = |all: &str, one: String| match &v {
            None => all.to_string(),
            Some(_) => one,
        };
        let vs = v.clone().unwrap_or_default();
        let path = match l.what {
            Queues => scoped("/api/queues", format!("/api/queues/{vs}")),
            Exchanges => scoped("/api/exchanges", format!("/api/exchanges/{vs}")),
            Bindings => scoped("/api/bindings", format!("/api/bindings/{vs}")),
            Connections => scoped("/api/connections", format!("/api/vhosts/{vs}/connections")),
            Channels => scoped("/api/channels", format!("/api/vhosts/{vs}/channels")),
            Consumers => scoped("/api/consumers", format!("/api/consumers/{vs}")),
            Policies => scoped("/api/policies", format!("/api/policies/{vs}")),
            OperatorPolicies => scoped(
                "/api/operator-policies",
                format!("/api/operator-policies/{vs}"),
            ),
            // Filtered here: not every server has /api/vhosts/V/permissions.
            Permissions => "/api/permissions".to_string(),
            // Filtered here too: the API scopes parameters by component first.
            Parameters => "/api/parameters".to_string(),
            GlobalParameters => "/api/global-parameters".to_string(),
            Users => "/api/users".to_string(),
            Vhosts => "/api/vhosts".to_string(),
            Nodes => "/api/nodes".to_string(),
        };
        let reply = self.client.get(&path)?;
        let mut rows = output::rows(&reply);
        if l.what == Permissions || l.what == Parameters {
            if let Some(vhost) = &self.vhost {
                rows.retain(|p| p.get("vhost").and_then(Value::as_str) == Some(vhost));
            }
        }
        if self.json {
            return self.print_json(&Value::Array(rows));
        }
        let default: &[&str] = match l.what {
            Queues => &[
                "vhost",
                "name",
                "durable",
                "auto_delete",
                "messages_ready",
                "messages_unacknowledged",
                "messages",
                "consumers",
                "state",
            ],
            Exchanges => &[
                "vhost",
                "name",
                "type",
                "durable",
                "auto_delete",
                "internal",
            ],
            Bindings => &[
                "vhost",
                "source",
                "destination",
                "destination_type",
                "routing_key",
                "arguments",
                "properties_key",
            ],
            Connections => &[
                "name",
                "vhost",
                "user",
                "peer_host",
                "peer_port",
                "protocol",
                "channels",
                "state",
            ],
            Channels => &[
                "name",
                "vhost",
                "user",
                "number",
                "consumer_count",
                "messages_unacknowledged",
                "prefetch_count",
                "confirm",
                "state",
            ],
            Consumers => &[
                "queue.vhost",
                "queue.name",
                "consumer_tag",
                "channel_details.name",
                "ack_required",
                "prefetch_count",
                "active",
            ],
            Users => &["name", "tags", "hashing_algorithm"],
            Vhosts => &[
                "name",
                "description",
                "tags",
                "default_queue_type",
                "tracing",
            ],
            Permissions => &["vhost", "user", "configure", "write", "read"],
            Policies | OperatorPolicies => &[
                "vhost",
                "name",
                "pattern",
                "apply-to",
                "priority",
                "definition",
            ],
            Parameters => &["vhost", "component", "name", "value"],
            GlobalParameters => &["name", "value"],
            Nodes => &["name", "type", "running", "uptime"],
        };
        let columns: Vec<&str> = if l.columns.is_empty() {
            default.to_vec()
        } else {
            l.columns.iter().map(String::as_str).collect()
        };
        self.print(&output::table(&rows, &columns))
    }

    fn declare(&mut self, d: &Declare) -> Result<(), CtlError> {
        let v = self.v();
        match d {
            Declare::Queue {
                name,
                durable,
                auto_delete,
                queue_type,
                arguments,
            } => {
                let mut args = object_arg("arguments", arguments.as_deref())?;
                if let Some(t) = queue_type {
                    args["x-queue-type"] = json!(t);
                }
                let body = json!({"durable": durable, "auto_delete": auto_delete,
                                  "arguments": args});
                self.put(
                    &format!("/api/queues/{v}/{}", seg(name)),
                    body,
                    "queue declared",
                )
            }
            Declare::Exchange {
                name,
                exchange_type,
                durable,
                auto_delete,
                internal,
                arguments,
            } => {
                let body = json!({"type": exchange_type, "durable": durable,
                    "auto_delete": auto_delete, "internal": internal,
                    "arguments": object_arg("arguments", arguments.as_deref())?});
                self.put(
                    &format!("/api/exchanges/{v}/{}", exchange_seg(name)),
                    body,
                    "exchange declared",
                )
            }
            Declare::Binding {
                source,
                destination,
                destination_type,
                routing_key,
                arguments,
            } => {
                let path = format!(
                    "/api/bindings/{v}/e/{}/{}/{}",
                    exchange_seg(source),
                    destination_type.seg(),
                    seg(destination)
                );
                let body = json!({"routing_key": routing_key,
                    "arguments": object_arg("arguments", arguments.as_deref())?});
                let reply = self.client.call(Method::POST, &path, Some(&body), &[])?;
                self.done(&reply, "binding declared")
            }
            Declare::Vhost {
                name,
                description,
                tags,
                default_queue_type,
                tracing,
            } => {
                let mut body = Map::new();
                if let Some(d) = description {
                    body.insert("description".into(), json!(d));
                }
                if let Some(t) = tags {
                    body.insert("tags".into(), json!(t));
                }
                if let Some(q) = default_queue_type {
                    body.insert("default_queue_type".into(), json!(q));
                }
                body.insert("tracing".into(), json!(tracing));
                self.put(
                    &format!("/api/vhosts/{}", seg(name)),
                    Value::Object(body),
                    "vhost declared",
                )
            }
            Declare::User {
                name,
                password,
                password_hash,
                hashing_algorithm,
                tags,
            } => {
                let mut body = Map::new();
                body.insert("tags".into(), json!(tags));
                if let Some(p) = password {
                    body.insert("password".into(), json!(p));
                }
                if let Some(h) = password_hash {
                    body.insert("password_hash".into(), json!(h));
                }
                if let Some(a) = hashing_algorithm {
                    body.insert("hashing_algorithm".into(), json!(a));
                }
                self.put(
                    &format!("/api/users/{}", seg(name)),
                    Value::Object(body),
                    "user declared",
                )
            }
            Declare::Permission {
                user,
                configure,
                write,
                read,
            } => self.put(
                &format!("/api/permissions/{v}/{}", seg(user)),
                json!({"configure": configure, "write": write, "read": read}),
                "permission declared",
            ),
            Declare::Policy(p) => self.policy("policies", p, "policy declared"),
            Declare::OperatorPolicy(p) => {
                self.policy("operator-policies", p, "operator policy declared")
            }
        }
    }

    fn policy(&mut self, kind: &str, p: &PolicyArgs, message: &str) -> Result<(), CtlError> {
        let body = json!({
            "pattern": p.pattern,
            "definition": object_arg("definition", Some(&p.definition))?,
            "priority": p.priority,
            "apply-to": p.apply_to,
        });
        let path = format!("/api/{kind}/{}/{}", self.v(), seg(&p.name));
        self.put(&path, body, message)
    }

    fn delete_object(&mut self, d: &Delete) -> Result<(), CtlError> {
        let v = self.v();
        match d {
            Delete::Queue {
                name,
                if_unused,
                if_empty,
            } => {
                let mut query = Vec::new();
                if *if_unused {
                    query.push("if-unused=true");
                }
                if *if_empty {
                    query.push("if-empty=true");
                }
                let mut path = format!("/api/queues/{v}/{}", seg(name));
                if !query.is_empty() {
                    path = format!("{path}?{}", query.join("&"));
                }
                self.delete(&path, "queue deleted")
            }
            Delete::Exchange { name, if_unused } => {
                let mut path = format!("/api/exchanges/{v}/{}", exchange_seg(name));
                if *if_unused {
                    path.push_str("?if-unused=true");
                }
                self.delete(&path, "exchange deleted")
            }
            Delete::Binding {
                source,
                destination,
                destination_type,
                routing_key,
                arguments,
                properties_key,
            } => {
                let between = format!(
                    "/api/bindings/{v}/e/{}/{}/{}",
                    exchange_seg(source),
                    destination_type.seg(),
                    seg(destination)
                );
                let key = match properties_key {
                    Some(k) => k.clone(),
                    None => {
                        let args = object_arg("arguments", arguments.as_deref())?;
                        let listed = output::rows(&self.client.get(&between)?);
                        let found = listed.iter().find(|b| {
                            b.get("routing_key").and_then(Value::as_str)
                                == Some(routing_key.as_str())
                                && b.get("arguments").unwrap_or(&json!({})) == &args
                        });
                        match found
                            .and_then(|b| b.get("properties_key"))
                            .and_then(Value::as_str)
                        {
                            Some(k) => k.to_string(),
                            None => {
                                return Err(CtlError::Input(format!(
                                    "no binding from exchange '{source}' to {} '{destination}' \
                                     with routing key '{routing_key}' and arguments {args} in \
                                     vhost '{}'",
                                    match destination_type {
                                        DestinationType::Queue => "queue",
                                        DestinationType::Exchange => "exchange",
                                    },
                                    self.vhost()
                                )))
                            }
                        }
                    }
                };
                self.delete(&format!("{between}/{}", seg(&key)), "binding deleted")
            }
            Delete::Vhost { name } => {
                self.delete(&format!("/api/vhosts/{}", seg(name)), "vhost deleted")
            }
            Delete::User { name } => {
                self.delete(&format!("/api/users/{}", seg(name)), "user deleted")
            }
            Delete::Permission { user } => self.delete(
                &format!("/api/permissions/{v}/{}", seg(user)),
                "permission deleted",
            ),
            Delete::Policy { name } => self.delete(
                &format!("/api/policies/{v}/{}", seg(name)),
                "policy deleted",
            ),
            Delete::OperatorPolicy { name } => self.delete(
                &format!("/api/operator-policies/{v}/{}", seg(name)),
                "operator policy deleted",
            ),
        }
    }

    fn publish(&mut self, p: &PublishArgs) -> Result<(), CtlError> {
        let body = match &p.payload {
            Some(text) => text.clone().into_bytes(),
            None => read_input(p.payload_file.as_deref())?,
        };
        let (payload, encoding) = match String::from_utf8(body) {
            Ok(text) => (text, "string"),
            Err(e) => {
                use base64::Engine;
                let b64 = base64::engine::general_purpose::STANDARD.encode(e.as_bytes());
                (b64, "base64")
            }
        };
        let req = json!({
            "properties": object_arg("properties", p.properties.as_deref())?,
            "routing_key": p.routing_key,
            "payload": payload,
            "payload_encoding": encoding,
        });
        let path = format!(
            "/api/exchanges/{}/{}/publish",
            self.v(),
            exchange_seg(&p.exchange)
        );
        let reply = self.client.call(Method::POST, &path, Some(&req), &[])?;
        let routed = reply.get("routed").and_then(Value::as_bool);
        if self.json {
            self.print_json(&reply)?;
        } else if routed == Some(true) {
            self.print("message published and routed")?;
        }
        if routed == Some(false) {
            // Published, but no queue took it: not a failure (as rabbitmqadmin), but said.
            let _ = writeln!(self.err, "warren ctl: message published but NOT routed");
        }
        Ok(())
    }

    fn get(&mut self, g: &GetArgs) -> Result<(), CtlError> {
        let mut req = json!({
            "count": g.count,
            "ackmode": g.ackmode.name(),
            "encoding": g.encoding,
        });
        if let Some(t) = g.truncate {
            req["truncate"] = json!(t);
        }
        let path = format!("/api/queues/{}/{}/get", self.v(), seg(&g.queue));
        let reply = self.client.call(Method::POST, &path, Some(&req), &[])?;
        if self.json {
            return self.print_json(&reply);
        }
        let rows = output::rows(&reply);
        self.print(&output::table(
            &rows,
            &[
                "routing_key",
                "exchange",
                "message_count",
                "redelivered",
                "payload_bytes",
                "payload_encoding",
                "payload",
                "properties",
            ],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        ctl: CtlArgs,
    }

    fn parse(args: &[&str]) -> Result<CtlArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("ctl").chain(args.iter().copied())).map(|c| c.ctl)
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_and_global_flags() {
        let a = parse(&["list", "queues", "--json", "--vhost", "v1"]).unwrap();
        assert_eq!(a.conn.base_url(), "http://localhost:15672");
        assert_eq!(a.conn.username, "guest");
        assert!(a.conn.json);
        assert_eq!(a.conn.vhost.as_deref(), Some("v1"));
        let a = parse(&["-H", "::1", "-P", "15999", "overview"]).unwrap();
        assert_eq!(a.conn.base_url(), "http://[::1]:15999");
        let a = parse(&["--url", "http://b:1/x/", "overview"]).unwrap();
        assert_eq!(a.conn.base_url(), "http://b:1/x/");
    }

    #[test]
    fn declare_flags() {
        let a = parse(&["declare", "queue", "--name", "q", "--durable", "false"]).unwrap();
        match a.command {
            Command::Declare(Declare::Queue { durable, .. }) => assert!(!durable),
            other => panic!("{other:?}"),
        }
        let a = parse(&[
            "declare",
            "policy",
            "--name",
            "p",
            "--pattern",
            "^q",
            "--definition",
            "{}",
            "--priority",
            "-1",
        ])
        .unwrap();
        match a.command {
            Command::Declare(Declare::Policy(p)) => assert_eq!(p.priority, -1),
            other => panic!("{other:?}"),
        }
        assert!(parse(&["declare", "user", "--name", "u", "--hashing-algorithm", "x"]).is_err());
    }

    #[test]
    fn object_arguments_must_be_objects() {
        assert_eq!(object_arg("arguments", None).unwrap(), json!({}));
        assert_eq!(
            object_arg("arguments", Some(r#"{"x-max-length": 1}"#)).unwrap(),
            json!({"x-max-length": 1})
        );
        assert!(object_arg("arguments", Some("[1]"))
            .unwrap_err()
            .to_string()
            .contains("JSON object"));
        assert!(object_arg("arguments", Some("{"))
            .unwrap_err()
            .to_string()
            .contains("not valid JSON"));
    }
}

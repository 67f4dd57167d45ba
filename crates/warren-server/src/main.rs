//! The `warren` binary: starts the broker with embedded defaults, a TOML file, environment
//! overrides and flags.
//!
//! Signals: SIGTERM and SIGINT stop the broker gracefully (listeners closed, connections closed
//! with 320 CONNECTION_FORCED, the store flushed, exit status 0); SIGHUP reloads what can
//! change while running (the log level, the disk alarm's limit), reopens the log file and reads
//! the TLS certificate, key and CA files again (open connections are kept; a bad file keeps
//! the old ones in use).
//!
//! `warren --hash-password [PASSWORD]` prints a RabbitMQ SHA-256 password hash for a
//! `[[users]]` entry's `password_hash` (the password is read from standard input when not given).
//!
//! `warren ctl ...` is the command-line client of a running broker's management HTTP API
//! (the `warren-ctl` crate); `warren ctl --help` lists its commands.

use clap::Parser;

/// The broker allocates and frees small objects for every message (frames, properties,
/// queue entries); mimalloc handles that pattern with less CPU than the system allocator.
/// It is built without transparent huge pages (the `no_thp` feature: no `MADV_HUGEPAGE` on
/// its arenas): with them, each fresh page the broker touches costs 2 MB of RSS, so that a
/// few small allocations (a management sweep, say) grew an idle broker by megabytes.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use warren_server::config::Override;
use warren_server::logging::LogHandle;
use warren_server::{Broker, Config, RunningBroker};

/// Warren, an AMQP 0-9-1 message broker that RabbitMQ clients use unchanged.
#[derive(Parser, Debug)]
#[command(
    name = "warren",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Args {
    /// Without a command, the broker starts.
    #[command(subcommand)]
    command: Option<Command>,
    /// TOML configuration file (see --generate-config).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Write a commented default configuration to FILE (never over an existing file; `-` for
    /// standard output) and exit.
    #[arg(long, value_name = "FILE")]
    generate_config: Option<PathBuf>,
    /// AMQP listen address: PORT (every interface, IPv4 and IPv6), IP:PORT, [IPv6]:PORT or
    /// HOST:PORT [default: 5672].
    #[arg(long, value_name = "ADDR")]
    amqp_listen: Option<String>,
    /// Management HTTP API listen address, as --amqp-listen [default: 0.0.0.0:15672].
    #[arg(long, value_name = "ADDR")]
    management_listen: Option<String>,
    /// httpmq/httpsqs HTTP queue API listen address, as --amqp-listen [default: 0.0.0.0:1218].
    #[arg(long, value_name = "ADDR")]
    httpmq_listen: Option<String>,
    /// Data directory [default: ./warren-data].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Log level or tracing filter (error, warn, info, debug, trace) [default: info].
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
    /// Delivery acknowledgement timeout in milliseconds (RabbitMQ's consumer_timeout; 0 turns
    /// it off) [default: 1800000].
    #[arg(long, value_name = "MS")]
    consumer_timeout: Option<u64>,
    /// AMQPS (TLS) listener: --tls-listen, --tls-cert-file, --tls-key-file, --tls-ca-file.
    #[command(flatten)]
    tls: warren_server::tls::TlsArgs,
    /// Import this RabbitMQ definitions file (JSON, as `rabbitmqctl export_definitions` writes)
    /// at start: users, vhosts, permissions, exchanges, queues, bindings.
    #[arg(long, value_name = "FILE")]
    load_definitions: Option<PathBuf>,
    /// This node's id in a cluster (`[cluster] node_id`).
    #[arg(long, value_name = "ID")]
    cluster_node_id: Option<u64>,
    /// Where this node listens for the other nodes of its cluster [default: 0.0.0.0:25672].
    #[arg(long, value_name = "ADDR")]
    cluster_listen: Option<String>,
    /// Every node of the cluster, this one included: ID@HOST:PORT,ID@HOST:PORT,...
    #[arg(long, value_name = "NODES")]
    cluster_seed_nodes: Option<String>,
    /// File holding the cluster's shared secret (the same on every node).
    #[arg(long, value_name = "FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// Print a password hash (rabbit_password_hashing_sha256, base64) for a [[users]]
    /// password_hash and exit. Without PASSWORD, the first line of standard input is hashed.
    #[arg(long, value_name = "PASSWORD", num_args = 0..=1)]
    hash_password: Option<Option<String>>,
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Manage a running broker (Warren or RabbitMQ) through its management HTTP API: list,
    /// declare, delete, purge, publish, get, export and import definitions, health checks.
    Ctl(warren_ctl::CtlArgs),
}

impl Args {
    /// The flags that set configuration keys, as overrides of the file and environment.
    fn overrides(&self) -> Vec<Override> {
        let s = |v: &str| toml::Value::String(v.to_string());
        let path = |p: &Path| s(&p.to_string_lossy());
        let int = |n: u64| toml::Value::Integer(i64::try_from(n).unwrap_or(i64::MAX));
        let t = &self.tls;
        [
            (
                "amqp",
                "listen",
                "--amqp-listen",
                self.amqp_listen.as_deref().map(s),
            ),
            (
                "management",
                "listen",
                "--management-listen",
                self.management_listen.as_deref().map(s),
            ),
            (
                "httpmq",
                "listen",
                "--httpmq-listen",
                self.httpmq_listen.as_deref().map(s),
            ),
            (
                "storage",
                "data_dir",
                "--data-dir",
                self.data_dir.as_deref().map(path),
            ),
            (
                "log",
                "level",
                "--log-level",
                self.log_level.as_deref().map(s),
            ),
            (
                "amqp",
                "consumer_timeout",
                "--consumer-timeout",
                self.consumer_timeout.map(int),
            ),
            (
                "tls",
                "listen",
                "--tls-listen",
                t.tls_listen.map(|a| s(&a.to_string())),
            ),
            (
                "tls",
                "cert_file",
                "--tls-cert-file",
                t.tls_cert_file.as_deref().map(path),
            ),
            (
                "tls",
                "key_file",
                "--tls-key-file",
                t.tls_key_file.as_deref().map(path),
            ),
            (
                "tls",
                "ca_file",
                "--tls-ca-file",
                t.tls_ca_file.as_deref().map(path),
            ),
            (
                "cluster",
                "node_id",
                "--cluster-node-id",
                self.cluster_node_id.map(int),
            ),
            (
                "cluster",
                "listen",
                "--cluster-listen",
                self.cluster_listen.as_deref().map(s),
            ),
            (
                "cluster",
                "seed_nodes",
                "--cluster-seed-nodes",
                self.cluster_seed_nodes.as_deref().map(s),
            ),
            (
                "cluster",
                "secret_file",
                "--cluster-secret-file",
                self.cluster_secret_file.as_deref().map(path),
            ),
            (
                "definitions",
                "load_file",
                "--load-definitions",
                self.load_definitions.as_deref().map(path),
            ),
        ]
        .into_iter()
        .filter_map(|(section, key, flag, value)| {
            value.map(|value| Override {
                section,
                key,
                value,
                flag,
            })
        })
        .collect()
    }

    /// The configuration from the file, the environment and the flags.
    fn load(&self) -> Result<Config, warren_server::config::ConfigError> {
        let mut config =
            Config::load_with(self.config.as_deref(), std::env::vars(), &self.overrides())?;
        config
            .storage
            .data_dir
            .get_or_insert_with(|| PathBuf::from("warren-data"));
        Ok(config)
    }
}

fn generate_config(path: &Path) -> ExitCode {
    if path == Path::new("-") {
        print!("{}", Config::commented_default());
        return ExitCode::SUCCESS;
    }
    use std::io::Write;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|mut f| f.write_all(Config::commented_default().as_bytes()));
    match written {
        Ok(()) => {
            println!("wrote {}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            eprintln!(
                "warren: {} already exists; not overwriting it (remove it first, or use \
                 --generate-config - to print the defaults)",
                path.display()
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("warren: cannot write {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}

/// `--hash-password`: prints the hash of `given`, or of the first line of standard input.
fn hash_password(given: Option<&str>) -> ExitCode {
    let password = match given {
        Some(p) => p.to_string(),
        None => {
            let mut line = String::new();
            if let Err(e) = std::io::stdin().read_line(&mut line) {
                eprintln!("warren: cannot read the password from standard input: {e}");
                return ExitCode::FAILURE;
            }
            line.trim_end_matches(['\r', '\n']).to_string()
        }
    };
    if password.is_empty() {
        eprintln!("warren: an empty password can never log in; give a password");
        return ExitCode::FAILURE;
    }
    let hash = warren_broker::access::PasswordHash::from_password(
        warren_broker::access::HashingAlgorithm::Sha256,
        &password,
    );
    println!("{}", hash.to_base64());
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Ctl(ctl)) = args.command {
        return warren_ctl::run(ctl, &mut std::io::stdout().lock(), &mut std::io::stderr());
    }
    if let Some(path) = &args.generate_config {
        return generate_config(path);
    }
    if let Some(given) = &args.hash_password {
        return hash_password(given.as_deref());
    }
    let config = match args.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("warren: {e}");
            return ExitCode::FAILURE;
        }
    };
    let data_dir = config.storage.data_dir.clone().expect("set by Args::load");
    if data_dir.exists() && !data_dir.is_dir() {
        eprintln!(
            "warren: data directory {} exists and is not a directory (storage.data_dir)",
            data_dir.display()
        );
        return ExitCode::FAILURE;
    }
    let log = match warren_server::logging::init(&config.log, Some(&data_dir)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("warren: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("warren: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        // Before anything slow (recovery): a signal during startup is handled, not fatal.
        let mut signals = match Signals::new() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("warren: cannot install signal handlers: {e}");
                return ExitCode::FAILURE;
            }
        };
        let management = config.management.enabled;
        let httpmq = config.httpmq.enabled;
        let broker = match Broker::builder()
            .config(config)
            .management(management)
            .httpmq(httpmq)
            .start()
            .await
        {
            Ok(b) => b,
            Err(e) => {
                // Once on standard error, and in the log file if there is one (the console
                // log leaves it out: it would be the same line twice on a terminal).
                tracing::error!(target: warren_server::logging::STDERR_TARGET, "cannot start: {e}");
                eprintln!("warren: cannot start: {e}");
                return ExitCode::FAILURE;
            }
        };
        let addrs: Vec<String> = broker.amqp_addrs().iter().map(|a| a.to_string()).collect();
        let http: Vec<String> = broker
            .management_addrs()
            .iter()
            .map(|a| a.to_string())
            .collect();
        tracing::info!(
            amqp = %addrs.join(", "),
            amqps = %broker.amqps_addr().map(|a| a.to_string()).unwrap_or_default(),
            management = %http.join(", "),
            httpmq = %broker
                .httpmq_addrs()
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            data_dir = %data_dir.display(),
            log_file = %log.file().map(|p| p.display().to_string()).unwrap_or_default(),
            version = env!("CARGO_PKG_VERSION"),
            pid = std::process::id(),
            "Warren started"
        );
        loop {
            match signals.next().await {
                Signal::Stop(name) => {
                    tracing::info!("{name} received: shutting down");
                    break;
                }
                Signal::Reload => {
                    reload(&args, &broker, &log);
                    if let Some(tls) = broker.tls_acceptor().cloned() {
                        // Reads files: off the runtime's threads. Errors are logged by reload().
                        let _ = tokio::task::spawn_blocking(move || tls.reload()).await;
                    }
                }
            }
        }
        broker.shutdown().await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}

/// SIGHUP: reads the configuration again and applies what can change while running.
fn reload(args: &Args, broker: &RunningBroker, log: &LogHandle) {
    let new = match args.load() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("SIGHUP: configuration not reloaded, the old one stays: {e}");
            return;
        }
    };
    if let Err(e) = log.reload(&new.log) {
        tracing::error!("SIGHUP: {e}");
    }
    broker.state().set_disk_free_limit(
        new.storage.disk_free_limit,
        new.storage.disk_free_limit_relative,
    );
    // Everything else needs a restart: say so when it changed.
    let old = &broker.state().config;
    let mut cmp = new.clone();
    cmp.log.level = old.log.level.clone();
    cmp.storage.disk_free_limit = old.storage.disk_free_limit;
    cmp.storage.disk_free_limit_relative = old.storage.disk_free_limit_relative;
    if &cmp != old {
        tracing::warn!(
            "SIGHUP: settings other than log.level and storage.disk_free_limit changed; they \
             take effect at the next start"
        );
    }
    tracing::info!(
        log_level = %new.log.level,
        disk_free_limit = %new.storage.disk_free_limit,
        disk_free_limit_relative = new.storage.disk_free_limit_relative,
        "SIGHUP: configuration reloaded"
    );
}

enum Signal {
    /// SIGTERM or SIGINT.
    Stop(&'static str),
    /// SIGHUP.
    Reload,
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::Stop("SIGTERM"),
            _ = self.int.recv() => Signal::Stop("SIGINT"),
            _ = self.hup.recv() => Signal::Reload,
        }
    }
}

//! The `warren` binary: starts the broker with embedded defaults, a TOML file, environment
//! overrides and flags.

use clap::Parser;

/// The broker allocates and frees small objects for every message (frames, properties,
/// queue entries); mimalloc handles that pattern with less CPU than the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use warren_server::{Broker, Config};

/// Warren, an AMQP 0-9-1 message broker that RabbitMQ clients use unchanged.
#[derive(Parser, Debug)]
#[command(name = "warren", version, about)]
struct Args {
    /// TOML configuration file (see --generate-config).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Write a commented default configuration to FILE and exit.
    #[arg(long, value_name = "FILE")]
    generate_config: Option<PathBuf>,
    /// AMQP listen address [default: 0.0.0.0:5672].
    #[arg(long, value_name = "ADDR")]
    amqp_listen: Option<SocketAddr>,
    /// Data directory [default: ./warren-data].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Log level or tracing filter (error, warn, info, debug, trace) [default: info].
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(path) = &args.generate_config {
        if let Err(e) = std::fs::write(path, Config::commented_default()) {
            eprintln!("warren: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
        return ExitCode::SUCCESS;
    }
    let mut config = match Config::load(args.config.as_deref(), std::env::vars()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("warren: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(a) = args.amqp_listen {
        config.amqp.listen = a;
    }
    if let Some(d) = args.data_dir {
        config.storage.data_dir = Some(d);
    }
    let data_dir = config
        .storage
        .data_dir
        .get_or_insert_with(|| PathBuf::from("warren-data"))
        .clone();
    if let Some(l) = args.log_level {
        config.log.level = l;
    }
    if let Err(e) = config.validate() {
        eprintln!("warren: {e}");
        return ExitCode::FAILURE;
    }
    let filter = match tracing_subscriber::EnvFilter::try_new(&config.log.level) {
        Ok(f) if is_log_filter(&config.log.level) => f,
        _ => {
            eprintln!(
                "warren: invalid log level '{}' (use error, warn, info, debug, trace or a filter such as warren_server=debug)",
                config.log.level
            );
            return ExitCode::FAILURE;
        }
    };
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal())
        .init();

    if let Err(e) = std::fs::create_dir_all(&data_dir) {
        eprintln!(
            "warren: cannot create data directory {}: {e}",
            data_dir.display()
        );
        return ExitCode::FAILURE;
    }
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
        let broker = match Broker::builder().config(config).start().await {
            Ok(b) => b,
            Err(e) => {
                eprintln!("warren: cannot start: {e}");
                return ExitCode::FAILURE;
            }
        };
        tracing::info!(
            amqp = %broker.amqp_addr(),
            data_dir = %data_dir.display(),
            version = env!("CARGO_PKG_VERSION"),
            "Warren started"
        );
        wait_for_signal().await;
        tracing::info!("shutting down");
        broker.shutdown().await;
        ExitCode::SUCCESS
    })
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// True when every directive of `spec` names a known level (a bare word such as `verbose`
/// would otherwise be taken as a target name and silently log nothing).
fn is_log_filter(spec: &str) -> bool {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    spec.split(',').all(|d| {
        let level = d
            .rsplit('=')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        LEVELS.contains(&level.as_str())
    })
}

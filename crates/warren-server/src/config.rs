//! Configuration: a TOML file, `WARREN_<SECTION>_<KEY>` environment overrides, then command-line
//! flags, in increasing order of precedence.
//!
//! Every limit the broker enforces is here, with RabbitMQ's default where RabbitMQ has one.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
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
    /// Users; when empty, the default `guest`/`guest` (loopback only) is created.
    pub users: Vec<UserConfig>,
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
    /// Address to listen on (RabbitMQ's `listeners.tcp.default`), default `0.0.0.0:5672`.
    pub listen: SocketAddr,
    /// Largest frame in bytes offered in connection.tune, headers included (RabbitMQ
    /// `frame_max`, default 131072). Clients may lower it, not raise it.
    pub frame_max: u32,
    /// Highest channel number offered in connection.tune (RabbitMQ `channel_max`, default 2047).
    pub channel_max: u16,
    /// Heartbeat interval in seconds offered in connection.tune (RabbitMQ `heartbeat`, default
    /// 60); 0 disables heartbeats unless the client asks for them.
    pub heartbeat: u16,
    /// Largest message body in bytes (RabbitMQ `max_message_size`, default 16 MiB in 4.x).
    pub max_message_size: u64,
    /// Most concurrent client connections; further ones are refused at accept.
    pub max_connections: usize,
    /// Deepest nesting of field tables and arrays accepted from clients.
    pub max_table_depth: usize,
    /// Seconds a client has to complete the handshake (RabbitMQ `handshake_timeout`, 10 s).
    pub handshake_timeout: u64,
}

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

/// `[log]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Level or `tracing` filter directive: `error`, `warn`, `info`, `debug`, `trace`.
    pub level: String,
}

/// One `[[users]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// Login name.
    pub name: String,
    /// Password.
    pub password: String,
    /// Management tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Only allowed from loopback addresses.
    #[serde(default)]
    pub loopback_only: bool,
}

impl Default for AmqpConfig {
    fn default() -> Self {
        AmqpConfig {
            listen: "0.0.0.0:5672".parse().expect("valid literal address"),
            frame_max: 131_072,
            channel_max: 2047,
            heartbeat: 60,
            max_message_size: 16 * 1024 * 1024,
            max_connections: 65_536,
            max_table_depth: 16,
            handshake_timeout: 10,
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
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".into(),
        }
    }
}

/// Errors loading configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// File path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The TOML (after environment overrides) did not fit the schema.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

const SECTIONS: &[&str] = &["amqp", "storage", "log", "memory"];

impl Config {
    /// Loads `path` (if given), then applies `WARREN_<SECTION>_<KEY>` variables from `env`.
    ///
    /// An environment value is read as a TOML value when it parses as one (`60`, `true`), and as
    /// a string otherwise (`0.0.0.0:5672`).
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut root: toml::Table = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.to_path_buf(),
                    source,
                })?;
                text.parse()
                    .map_err(|e: toml::de::Error| ConfigError::Invalid(e.to_string()))?
            }
            None => toml::Table::new(),
        };
        for (k, v) in env {
            let Some(rest) = k.strip_prefix("WARREN_") else {
                continue;
            };
            let rest = rest.to_ascii_lowercase();
            let Some(section) = SECTIONS.iter().find(|s| rest.starts_with(&format!("{s}_"))) else {
                continue;
            };
            let key = &rest[section.len() + 1..];
            // `v = <value>` parses values like `60` or `true`; anything else is a string.
            let value = format!("v = {v}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
                .filter(|x| !x.is_table())
                .unwrap_or(toml::Value::String(v));
            root.entry(section.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .ok_or_else(|| ConfigError::Invalid(format!("[{section}] is not a table")))?
                .insert(key.to_string(), value);
        }
        let config = Config::deserialize(toml::Value::Table(root))
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Rejects settings no client could work with.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let a = &self.amqp;
        if a.frame_max < 4096 {
            return bad(format!(
                "amqp.frame_max = {} is below the AMQP minimum of 4096",
                a.frame_max
            ));
        }
        if a.channel_max == 0 {
            return bad("amqp.channel_max must be at least 1".into());
        }
        if a.max_connections == 0 {
            return bad("amqp.max_connections must be at least 1".into());
        }
        if a.max_table_depth == 0 {
            return bad("amqp.max_table_depth must be at least 1".into());
        }
        if !(self.memory.high_watermark > 0.0 && self.memory.high_watermark <= 1.0) {
            return bad("memory.high_watermark must be in (0, 1]".into());
        }
        if self.storage.segment_size < 4096 {
            return bad("storage.segment_size must be at least 4096 bytes".into());
        }
        if self.storage.queue_window == 0 || self.storage.queue_window_bytes == 0 {
            return bad("storage.queue_window and queue_window_bytes must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.storage.compaction_ratio) {
            return bad("storage.compaction_ratio must be in [0, 1]".into());
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
# Address of the AMQP 0-9-1 listener.
listen = "{listen}"
# Largest frame in bytes offered in connection.tune (clients may lower it).
frame_max = {frame_max}
# Highest channel number per connection.
channel_max = {channel_max}
# Heartbeat interval offered in connection.tune, seconds (0 = none unless the client asks).
heartbeat = {heartbeat}
# Largest message body in bytes.
max_message_size = {max_message_size}
# Most concurrent client connections.
max_connections = {max_connections}
# Deepest nesting of field tables and arrays accepted from clients.
max_table_depth = {max_table_depth}
# Seconds a client has to complete the AMQP handshake.
handshake_timeout = {handshake_timeout}

[storage]
# Data directory (durable definitions and messages). The warren binary uses ./warren-data
# when none is set here or with --data-dir.
# data_dir = "/var/lib/warren"
# Message-store segment file size, bytes.
segment_size = {segment_size}
# Most bytes of appends covered by one fsync (group commit); publishers wait beyond this.
fsync_batch_bytes = {fsync_batch_bytes}
# Microseconds to wait for more publishes before each fsync (0 = none).
fsync_delay_us = {fsync_delay_us}
# Ready messages (and bytes) a queue keeps in memory before paging to disk.
queue_window = {queue_window}
queue_window_bytes = {queue_window_bytes}
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
# error, warn, info, debug, trace, or a tracing filter such as "warren_server=debug".
level = "{level}"

[memory]
# Memory alarm: above this fraction of the machine's memory (or high_watermark_bytes when
# non-zero), publishing connections are paused and get connection.blocked.
high_watermark = {high_watermark}
high_watermark_bytes = {high_watermark_bytes}

# Users. With none listed, guest/guest is created and may only log in from localhost.
# [[users]]
# name = "admin"
# password = "change-me"
# tags = ["administrator"]
# loopback_only = false
"#,
            listen = d.amqp.listen,
            frame_max = d.amqp.frame_max,
            channel_max = d.amqp.channel_max,
            heartbeat = d.amqp.heartbeat,
            max_message_size = d.amqp.max_message_size,
            max_connections = d.amqp.max_connections,
            max_table_depth = d.amqp.max_table_depth,
            handshake_timeout = d.amqp.handshake_timeout,
            segment_size = d.storage.segment_size,
            fsync_batch_bytes = d.storage.fsync_batch_bytes,
            fsync_delay_us = d.storage.fsync_delay_us,
            queue_window = d.storage.queue_window,
            queue_window_bytes = d.storage.queue_window_bytes,
            unacked_window = d.storage.unacked_window,
            unacked_window_bytes = d.storage.unacked_window_bytes,
            compaction_ratio = d.storage.compaction_ratio,
            compaction_quiet_ms = d.storage.compaction_quiet_ms,
            level = d.log.level,
            high_watermark = d.memory.high_watermark,
            high_watermark_bytes = d.memory.high_watermark_bytes,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commented_default_parses_to_default() {
        let dir = std::env::temp_dir().join(format!("warren-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("warren.toml");
        std::fs::write(&p, Config::commented_default()).unwrap();
        let c = Config::load(Some(&p), Vec::new()).unwrap();
        assert_eq!(c, Config::default());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn env_overrides() {
        let env = vec![
            (
                "WARREN_AMQP_LISTEN".to_string(),
                "127.0.0.1:5999".to_string(),
            ),
            ("WARREN_AMQP_FRAME_MAX".to_string(), "8192".to_string()),
            ("WARREN_LOG_LEVEL".to_string(), "debug".to_string()),
            ("OTHER".to_string(), "x".to_string()),
        ];
        let c = Config::load(None, env).unwrap();
        assert_eq!(c.amqp.listen.port(), 5999);
        assert_eq!(c.amqp.frame_max, 8192);
        assert_eq!(c.log.level, "debug");
    }

    #[test]
    fn unknown_keys_are_errors() {
        let env = vec![("WARREN_AMQP_NOPE".to_string(), "1".to_string())];
        assert!(Config::load(None, env).is_err());
    }
}

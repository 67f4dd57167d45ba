//! The `warren` binary's log: standard output and/or a file, plain lines or JSON lines, with a
//! level that can be changed and a file that can be reopened while the broker runs (SIGHUP).
//!
//! A program that embeds the broker installs its own `tracing` subscriber instead.

use crate::config::{LogConfig, LogFormat};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

/// The installed log: changes its level and reopens its file.
pub struct LogHandle {
    filter: reload::Handle<EnvFilter, Registry>,
    file: Option<LogFile>,
}

/// A log file that can be reopened under the same path (after log rotation moved it away).
#[derive(Clone)]
struct LogFile {
    path: PathBuf,
    file: Arc<parking_lot::Mutex<File>>,
}

impl LogFile {
    fn open(path: &Path) -> std::io::Result<LogFile> {
        Ok(LogFile {
            path: path.to_path_buf(),
            file: Arc::new(parking_lot::Mutex::new(append(path)?)),
        })
    }

    fn reopen(&self) -> std::io::Result<()> {
        *self.file.lock() = append(&self.path)?;
        Ok(())
    }
}

fn append(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new().create(true).append(true).open(path)
}

/// Writes one formatted event under the file's lock.
struct LogFileWriter(LogFile);

impl Write for LogFileWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.file.lock().write(buf)
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.0.file.lock().write_all(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.file.lock().flush()
    }
}

/// Why the log could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The log file could not be opened.
    #[error("cannot open log file {} (log.file): {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The level is not a valid filter.
    #[error("invalid log level '{0}' (log.level)")]
    Level(String),
    /// A subscriber is already installed.
    #[error("a log subscriber is already installed")]
    Installed,
}

/// Target of the events that the binary also prints on standard error (a failed start):
/// the log file gets them, the console log leaves them out, so a terminal shows them once.
pub const STDERR_TARGET: &str = "warren::stderr";

/// The filter of `level` (`log.level`). The Raft library's own events are kept at `warn`
/// unless the level names it (`info,openraft=info`): at `info` it logs every election and
/// membership step of every quorum queue, most of a cluster's log.
fn filter(level: &str) -> Result<EnvFilter, LogError> {
    let spec = if level.contains("openraft") {
        level.to_string()
    } else {
        format!("{level},openraft=warn")
    };
    EnvFilter::try_new(spec).map_err(|_| LogError::Level(level.to_string()))
}

fn layer<S>(format: LogFormat, ansi: bool, writer: BoxMakeWriter) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    match format {
        LogFormat::Plain => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(writer)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(writer)
            .boxed(),
    }
}

/// Installs the global subscriber for `cfg`: standard output when `console`, the file
/// [`LogConfig::file_path`] (under `data_dir`) when set.
///
/// Errors: [`LogError`]: the file cannot be opened, the level is invalid.
pub fn init(cfg: &LogConfig, data_dir: Option<&Path>) -> Result<LogHandle, LogError> {
    use std::io::IsTerminal;
    let (filter, handle) = reload::Layer::new(filter(&cfg.level)?);
    let file = match cfg.file_path(data_dir) {
        Some(path) => Some(LogFile::open(&path).map_err(|source| LogError::File { path, source })?),
        None => None,
    };
    let mut layers = Vec::new();
    if cfg.console {
        let ansi = cfg.format == LogFormat::Plain && std::io::stdout().is_terminal();
        layers.push(
            layer(cfg.format, ansi, BoxMakeWriter::new(std::io::stdout))
                .with_filter(tracing_subscriber::filter::filter_fn(|m| {
                    m.target() != STDERR_TARGET
                }))
                .boxed(),
        );
    }
    if let Some(f) = &file {
        let f = f.clone();
        layers.push(layer(
            cfg.format,
            false,
            BoxMakeWriter::new(move || LogFileWriter(f.clone())),
        ));
    }
    tracing_subscriber::registry()
        .with(filter)
        .with(layers)
        .try_init()
        .map_err(|_| LogError::Installed)?;
    Ok(LogHandle {
        filter: handle,
        file,
    })
}

impl LogHandle {
    /// Applies `cfg`'s level (on SIGHUP) and reopens the log file.
    ///
    /// Errors: [`LogError`]: an invalid level (the old one stays) or a file that cannot be
    /// reopened (the old handle stays).
    pub fn reload(&self, cfg: &LogConfig) -> Result<(), LogError> {
        let f = filter(&cfg.level)?;
        let _ = self.filter.reload(f);
        if let Some(file) = &self.file {
            file.reopen().map_err(|source| LogError::File {
                path: file.path.clone(),
                source,
            })?;
        }
        Ok(())
    }

    /// The log file, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_ref().map(|f| f.path.as_path())
    }
}

//! Errors of TLS set-up: each names the setting, the file and what is wrong with it, since an
//! operator reads them in the log after a start or a SIGHUP.

use std::path::PathBuf;

/// Why TLS settings or files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The `[tls]` settings contradict each other (no file was read).
    #[error("invalid TLS settings: {0}")]
    Settings(String),
    /// A file could not be read.
    #[error("tls.{key} = {}: cannot read: {source}", path.display())]
    Read {
        /// The setting that names the file (`cert_file`, `key_file`, `ca_file`).
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file was read but its content is unusable.
    #[error("tls.{key} = {}: {reason}", path.display())]
    Invalid {
        /// The setting that names the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// rustls refused the assembled configuration.
    #[error("cannot build the TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

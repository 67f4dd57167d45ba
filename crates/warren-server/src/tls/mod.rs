//! TLS for Warren's listeners: AMQPS (AMQP 0-9-1 over TLS, port 5671) now, and the HTTP listeners
//! (httpmq, management) with the same settings.
//!
//! Why it looks like this:
//!
//! - **One handle, swapped configs.** A [`TlsAcceptorHandle`] holds the current
//!   `rustls::ServerConfig` behind a lock that is only held to clone an `Arc`. Every handshake
//!   takes the config in force when it starts; [`TlsAcceptorHandle::reload`] (on SIGHUP, see
//!   [`reload_on_sighup`]) builds a whole new config from the files and swaps it in only when
//!   everything in it is valid. Open connections keep the config they were made with, so a
//!   reload never drops them, and a bad file leaves the old certificates in place.
//! - **RabbitMQ's settings and semantics.** The `[tls]` keys ([`TlsConfig`]) are RabbitMQ's
//!   `ssl_options` (`certfile`, `keyfile`, `cacertfile`, `verify`, `fail_if_no_peer_cert`), and
//!   peer verification behaves as Erlang's `ssl` does with them: `verify_peer` asks for a client
//!   certificate and refuses a bad one; `fail_if_no_peer_cert` also refuses a client that sends
//!   none. The user name for SASL EXTERNAL comes from the peer certificate exactly as
//!   `rabbitmq_auth_mechanism_ssl` derives it ([`cert_login`]).
//! - **Any byte stream.** [`TlsAcceptorHandle::accept`] works on any tokio
//!   `AsyncRead + AsyncWrite` stream, so TCP listeners, Unix sockets and in-memory pipes (tests)
//!   all use it, and so do the HTTP listeners. TLS 1.2 and 1.3 only, as RabbitMQ's defaults.
//! - **ring as the crypto provider.** It builds with a C compiler alone (aws-lc-rs needs a much
//!   larger C build); the handle passes its provider explicitly to rustls, and the crate graph
//!   keeps aws-lc-rs out so that clients that use rustls' process-wide default provider (lapin
//!   with `rustls--ring`, amqprs with `tls`) find exactly one.
//!
//! ## HTTP listeners (axum / hyper)
//!
//! Build a handle whose config offers ALPN `h2` and `http/1.1`
//! ([`TlsAcceptorHandle::with_alpn`]) and run a manual accept loop that hands each TLS stream to
//! hyper-util, so that the handshake runs in the connection's task, not in the accept loop:
//!
//! ```text
//! let (tcp, peer) = listener.accept().await?;
//! let (tls, app) = (tls.clone(), app.clone());
//! tokio::spawn(async move {
//!     let Ok(stream) = tls.accept_timeout(tcp, handshake_timeout).await else { return };
//!     let io = hyper_util::rt::TokioIo::new(stream);
//!     let svc = hyper_util::service::TowerToHyperService::new(app);
//!     let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
//!         .serve_connection_with_upgrades(io, svc)
//!         .await;
//! });
//! ```
//!
//! `axum-server` with its `tls-rustls-no-provider` feature works too:
//! `RustlsConfig::from_config(handle.server_config())` and, after each reload,
//! `rustls_config.reload_from_config(handle.server_config())`.

mod acceptor;
pub mod cert_login;
mod error;
mod settings;

#[cfg(unix)]
pub use acceptor::reload_on_sighup;
pub use acceptor::{
    crypto_provider, load_cluster_configs, load_server_config, TlsAcceptorHandle, TlsSessionInfo,
};
pub use cert_login::{cert_login_name, issuer_dn, subject_dn, CertLoginError, CertLoginFrom};
pub use error::TlsError;
pub use settings::{TlsArgs, TlsConfig};
pub use tokio_rustls::server::TlsStream;

#[cfg(test)]
#[path = "../../tests/tls_support/certs.rs"]
pub(crate) mod test_certs;

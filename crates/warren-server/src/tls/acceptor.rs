//! Loading certificates and keys into a `rustls::ServerConfig`, and the handle that accepts TLS
//! connections with the config currently in force and swaps in a new one on reload.

use super::{TlsConfig, TlsError};
use parking_lot::RwLock;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{InconsistentKeys, RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tracing::{info, warn};

/// The crypto provider of every TLS config Warren builds: rustls' `ring` provider.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// Builds a server config from the files named in `settings`: TLS 1.2 and 1.3, the certificate
/// chain of `cert_file` with the key of `key_file`, client certificates checked against
/// `ca_file` as `verify_peer` and `fail_if_no_peer_cert` say, and `alpn` offered in that order
/// (empty for AMQPS; `h2`, `http/1.1` for HTTP).
///
/// Everything is checked before anything is returned: each certificate parses as X.509, the
/// key parses and belongs to the first certificate, each CA certificate can be a trust anchor.
/// When `cert_file` lacks the intermediates up to a root, they are taken from `ca_file`, as
/// Erlang's `ssl` (so RabbitMQ) does.
/// A `ca_file` is read and checked even without `verify_peer`, so that a mistake in it shows
/// at start rather than on the day peer verification is turned on.
///
/// Errors: [`TlsError::Settings`] when TLS is off or the settings contradict each other,
/// [`TlsError::Read`] / [`TlsError::Invalid`] naming the setting and file at fault.
pub fn load_server_config(
    settings: &TlsConfig,
    alpn: &[Vec<u8>],
) -> Result<ServerConfig, TlsError> {
    settings.validate()?;
    let (Some(cert_path), Some(key_path)) = (&settings.cert_file, &settings.key_file) else {
        return Err(TlsError::Settings(
            "TLS is off: tls.cert_file and tls.key_file are not set".into(),
        ));
    };
    let provider = crypto_provider();
    let ca_certs = match &settings.ca_file {
        Some(ca_path) => read_certs("ca_file", ca_path)?,
        None => Vec::new(),
    };
    let certified = certified_key(cert_path, key_path, &ca_certs, &provider)?;
    let verifier = client_verifier(settings, ca_certs, &provider)?;
    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    config.alpn_protocols = alpn.to_vec();
    Ok(config)
}

/// The TLS configs of inter-node connections (`[cluster] tls`), from the `[tls]` files: the
/// accepting side requires a client certificate signed by a CA of `ca_file` (whatever
/// `verify_peer` says: nodes always check each other), the dialing side presents the same
/// certificate and key and accepts a server certificate signed by a CA of `ca_file` that
/// names the host it dialed. TLS 1.2 and 1.3.
///
/// Errors: as [`load_server_config`]; [`TlsError::Settings`] without `ca_file`.
pub fn load_cluster_configs(
    settings: &TlsConfig,
) -> Result<(ServerConfig, rustls::ClientConfig), TlsError> {
    let Some(ca_path) = &settings.ca_file else {
        return Err(TlsError::Settings(
            "cluster.tls needs tls.ca_file (the CAs that sign the nodes' certificates)".into(),
        ));
    };
    let mutual = TlsConfig {
        verify_peer: true,
        fail_if_no_peer_cert: true,
        ..settings.clone()
    };
    let server = load_server_config(&mutual, &[])?;
    let (Some(cert_path), Some(key_path)) = (&settings.cert_file, &settings.key_file) else {
        return Err(TlsError::Settings(
            "cluster.tls needs tls.cert_file and tls.key_file".into(),
        ));
    };
    let provider = crypto_provider();
    let ca_certs = read_certs("ca_file", ca_path)?;
    let mut roots = RootCertStore::empty();
    for c in &ca_certs {
        roots
            .add(c.clone())
            .map_err(|e| invalid("ca_file", ca_path, format!("not a usable CA: {e}")))?;
    }
    let certified = certified_key(cert_path, key_path, &ca_certs, &provider)?;
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_root_certificates(roots)
        .with_client_auth_cert(certified.cert.clone(), read_key(key_path)?)?;
    Ok((server, client))
}

/// The certificate chain of `cert_path`, completed from `ca_certs`, with the private key of
/// `key_path`, checked to belong together.
fn certified_key(
    cert_path: &Path,
    key_path: &Path,
    ca_certs: &[CertificateDer<'static>],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let mut chain = read_certs("cert_file", cert_path)?;
    if let Some(leaf) = chain.first() {
        warn_if_outside_validity(cert_path, leaf);
    }
    complete_chain(&mut chain, ca_certs);
    let key = read_key(key_path)?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| invalid("key_file", key_path, format!("unusable private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        // Unknown: the provider cannot tell (rustls accepts the pair then, and so do we).
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => Ok(certified),
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => Err(invalid(
            "key_file",
            key_path,
            format!(
                "this private key does not belong to the first certificate of tls.cert_file = {}",
                cert_path.display()
            ),
        )),
        Err(e) => Err(invalid(
            "cert_file",
            cert_path,
            format!("the first certificate cannot be used: {e}"),
        )),
    }
}

/// Appends to `chain` the certificate of `ca_certs` that issued its last certificate, then the
/// one that issued that, and so on, up to (not including) a self-signed root. Erlang's `ssl`
/// builds the chain it sends from `cacertfile` too (root included, which clients do not need),
/// so a RabbitMQ `certfile` that holds the leaf alone, with the intermediates in `cacertfile`,
/// works here as it does there.
fn complete_chain(chain: &mut Vec<CertificateDer<'static>>, ca_certs: &[CertificateDer<'static>]) {
    // Each round appends a distinct CA certificate, so this ends after ca_certs.len() rounds.
    for _ in 0..ca_certs.len() {
        let Some(last) = chain.last() else { return };
        let Ok((_, last)) = x509_parser::parse_x509_certificate(last) else {
            return;
        };
        let issuer = last.issuer().as_raw();
        if issuer == last.subject().as_raw() {
            return; // self-signed: the root, which clients have
        }
        let next = ca_certs.iter().find(|ca| {
            !chain.contains(ca)
                && x509_parser::parse_x509_certificate(ca).is_ok_and(|(_, c)| {
                    c.subject().as_raw() == issuer && c.issuer().as_raw() != c.subject().as_raw()
                })
        });
        match next {
            Some(ca) => chain.push(ca.clone()),
            None => return,
        }
    }
}

/// The client certificate verifier for `verify_peer` (none without it): certificates must chain
/// to a CA of `ca_file` (`ca_certs`); with `fail_if_no_peer_cert`, a client without one is
/// refused too. Every CA certificate is checked to be usable as a trust anchor in both cases.
fn client_verifier(
    settings: &TlsConfig,
    ca_certs: Vec<CertificateDer<'static>>,
    provider: &Arc<CryptoProvider>,
) -> Result<Option<Arc<dyn ClientCertVerifier>>, TlsError> {
    let Some(ca_path) = &settings.ca_file else {
        return Ok(None);
    };
    let roots = trust_anchors(ca_path, ca_certs)?;
    if !settings.verify_peer {
        return Ok(None);
    }
    let mut verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
    if !settings.fail_if_no_peer_cert {
        verifier = verifier.allow_unauthenticated();
    }
    let verifier = verifier.build().map_err(|e| {
        invalid(
            "ca_file",
            ca_path,
            format!("cannot verify clients with these CAs: {e}"),
        )
    })?;
    Ok(Some(verifier))
}

fn invalid(key: &'static str, path: &Path, reason: impl Into<String>) -> TlsError {
    TlsError::Invalid {
        key,
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        key,
        path: path.to_path_buf(),
        source,
    })
}

fn pem_reason(e: &pem::Error) -> String {
    match e {
        pem::Error::MissingSectionEnd { end_marker } => format!(
            "not a valid PEM file: no -----END {}----- line",
            String::from_utf8_lossy(end_marker)
        ),
        pem::Error::IllegalSectionStart { line } => format!(
            "not a valid PEM file: malformed line {:?}",
            String::from_utf8_lossy(line)
        ),
        pem::Error::Base64Decode(d) => format!("not a valid PEM file: bad base64 ({d})"),
        other => format!("not a valid PEM file: {other}"),
    }
}

/// The certificates of a PEM file, in file order, each checked to parse as X.509.
fn read_certs(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(key, path)?;
    let mut certs = Vec::new();
    for item in CertificateDer::pem_slice_iter(&bytes) {
        let der = item.map_err(|e| invalid(key, path, pem_reason(&e)))?;
        if let Err(e) = x509_parser::parse_x509_certificate(&der) {
            return Err(invalid(
                key,
                path,
                format!(
                    "certificate #{} is not a valid X.509 certificate: {e}",
                    certs.len() + 1
                ),
            ));
        }
        certs.push(der);
    }
    if certs.is_empty() {
        let hint = if contains(&bytes, b"PRIVATE KEY-----") {
            ": it holds a private key (are cert_file and key_file swapped?)"
        } else {
            ""
        };
        return Err(invalid(
            key,
            path,
            format!("contains no PEM certificate (-----BEGIN CERTIFICATE-----){hint}"),
        ));
    }
    Ok(certs)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The first private key of the PEM file `path` (PKCS#8, PKCS#1 or SEC1).
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read("key_file", path)?;
    match PrivateKeyDer::from_pem_slice(&bytes) {
        Ok(k) => Ok(k),
        Err(pem::Error::NoItemsFound) => {
            let hint = if contains(&bytes, b"ENCRYPTED PRIVATE KEY-----")
                || contains(&bytes, b"Proc-Type: 4,ENCRYPTED")
            {
                ": it is encrypted, which is not supported (decrypt it with `openssl pkey`)"
            } else if contains(&bytes, b"-----BEGIN CERTIFICATE-----") {
                ": it holds a certificate (are cert_file and key_file swapped?)"
            } else {
                ""
            };
            Err(invalid(
                "key_file",
                path,
                format!(
                    "contains no PEM private key (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY){hint}"
                ),
            ))
        }
        Err(e) => Err(invalid("key_file", path, pem_reason(&e))),
    }
}

/// The CA certificates of `path` as trust anchors for client certificates.
fn trust_anchors(
    path: &Path,
    certs: Vec<CertificateDer<'static>>,
) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for (i, cert) in certs.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            invalid(
                "ca_file",
                path,
                format!("certificate #{} cannot be a trust anchor: {e}", i + 1),
            )
        })?;
    }
    Ok(roots)
}

/// Logs a warning when the server certificate is expired or not yet valid: clients will refuse
/// it, but the broker still starts (as RabbitMQ does), so that replacing the file and sending
/// SIGHUP fixes it.
fn warn_if_outside_validity(path: &Path, leaf: &CertificateDer<'_>) {
    if let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf) {
        let v = cert.validity();
        if !v.is_valid() {
            warn!(
                cert_file = %path.display(),
                not_before = %v.not_before,
                not_after = %v.not_after,
                "the server certificate is outside its validity period: clients will refuse it"
            );
        }
    }
}

/// Accepts TLS connections with the server config currently in force, and reloads it from the
/// files named in its [`TlsConfig`].
///
/// Cheap to clone (one `Arc`); every listener that shares the settings and ALPN protocols can
/// share one handle. Handshakes take the config in force when they start; a reload replaces it
/// for later handshakes only, so open connections are never dropped by a reload.
#[derive(Clone)]
pub struct TlsAcceptorHandle {
    inner: Arc<Inner>,
}

struct Inner {
    settings: TlsConfig,
    alpn: Vec<Vec<u8>>,
    current: RwLock<Arc<ServerConfig>>,
    reloads: AtomicU64,
}

impl std::fmt::Debug for TlsAcceptorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAcceptorHandle")
            .field("settings", &self.inner.settings)
            .field("reloads", &self.reload_count())
            .finish_non_exhaustive()
    }
}

impl TlsAcceptorHandle {
    /// Loads the files named in `settings` (no ALPN: AMQPS).
    ///
    /// Errors: as [`load_server_config`].
    pub fn new(settings: &TlsConfig) -> Result<Self, TlsError> {
        Self::with_alpn(settings, Vec::new())
    }

    /// Loads the files named in `settings` and offers the ALPN `protocols`, most preferred
    /// first (e.g. `[b"h2".to_vec(), b"http/1.1".to_vec()]` for an HTTP listener).
    ///
    /// Errors: as [`load_server_config`].
    pub fn with_alpn(settings: &TlsConfig, protocols: Vec<Vec<u8>>) -> Result<Self, TlsError> {
        let config = load_server_config(settings, &protocols)?;
        Ok(TlsAcceptorHandle {
            inner: Arc::new(Inner {
                settings: settings.clone(),
                alpn: protocols,
                current: RwLock::new(Arc::new(config)),
                reloads: AtomicU64::new(0),
            }),
        })
    }

    /// The settings the handle loads its files from.
    pub fn settings(&self) -> &TlsConfig {
        &self.inner.settings
    }

    /// The server config in force (for axum-server's `RustlsConfig` and the like).
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.inner.current.read().clone()
    }

    /// Successful reloads since the handle was made.
    pub fn reload_count(&self) -> u64 {
        self.inner.reloads.load(Ordering::Relaxed)
    }

    /// Reads the files again and, when all of them are valid, makes the new config the one
    /// later handshakes use; open connections keep theirs. On error the config in force stays,
    /// and the error (naming the file and the fault) is logged and returned.
    ///
    /// Reads files: call it from a blocking context (`spawn_blocking`) in async code.
    pub fn reload(&self) -> Result<(), TlsError> {
        match load_server_config(&self.inner.settings, &self.inner.alpn) {
            Ok(config) => {
                *self.inner.current.write() = Arc::new(config);
                self.inner.reloads.fetch_add(1, Ordering::Relaxed);
                info!(
                    cert_file = %path_of(&self.inner.settings.cert_file),
                    "TLS certificates and keys reloaded"
                );
                Ok(())
            }
            Err(e) => {
                warn!(error = %e, "TLS reload failed; the previous certificates and keys stay in use");
                Err(e)
            }
        }
    }

    /// Runs the server side of a TLS handshake on `stream` with the config in force.
    ///
    /// Errors: the handshake failed (I/O error, or `InvalidData` wrapping the rustls error:
    /// protocol version below TLS 1.2, no certificate while one is required, a certificate not
    /// signed by a CA of `ca_file`, ...). Bound it with [`accept_timeout`](Self::accept_timeout)
    /// when the peer is not trusted to finish.
    pub async fn accept<S>(&self, stream: S) -> std::io::Result<TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        tokio_rustls::TlsAcceptor::from(self.server_config())
            .accept(stream)
            .await
    }

    /// [`accept`](Self::accept), failing with `TimedOut` when the handshake has not finished
    /// within `limit` (use the listener's `handshake_timeout`).
    pub async fn accept_timeout<S>(
        &self,
        stream: S,
        limit: Duration,
    ) -> std::io::Result<TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        match tokio::time::timeout(limit, self.accept(stream)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("TLS handshake not finished within {} ms", limit.as_millis()),
            )),
        }
    }
}

fn path_of(p: &Option<PathBuf>) -> std::path::Display<'_> {
    p.as_deref().unwrap_or(Path::new("")).display()
}

/// Reloads every handle in `handles` each time the process receives SIGHUP, one after the
/// other, on the blocking pool. Returns the task, which runs until aborted.
///
/// Must be called inside a tokio runtime. Once called, SIGHUP no longer ends the process (tokio
/// keeps its handler installed for the life of the process).
///
/// Errors: the signal handler could not be installed.
#[cfg(unix)]
pub fn reload_on_sighup(
    handles: Vec<TlsAcceptorHandle>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangup = signal(SignalKind::hangup())?;
    Ok(tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            info!(
                handles = handles.len(),
                "SIGHUP: reloading TLS certificates and keys"
            );
            for h in &handles {
                let h = h.clone();
                // Errors are logged by reload() itself.
                let _ = tokio::task::spawn_blocking(move || h.reload()).await;
            }
        }
    }))
}

/// What a finished handshake agreed on, for logs, SASL EXTERNAL and the management API.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsSessionInfo {
    /// Negotiated protocol version (TLS 1.2 or 1.3).
    pub protocol: Option<rustls::ProtocolVersion>,
    /// Negotiated cipher suite.
    pub cipher_suite: Option<rustls::CipherSuite>,
    /// The client's certificate chain, leaf first, as the client sent it; verified against
    /// `ca_file` during the handshake. Empty when the client sent none (or none was asked for).
    pub peer_certificates: Vec<CertificateDer<'static>>,
    /// The host name the client asked for (SNI), if any.
    pub server_name: Option<String>,
    /// The ALPN protocol agreed on, if any.
    pub alpn_protocol: Option<Vec<u8>>,
}

impl TlsSessionInfo {
    /// The session of an accepted stream.
    pub fn of<S>(stream: &TlsStream<S>) -> Self {
        let (_, conn) = stream.get_ref();
        TlsSessionInfo {
            protocol: conn.protocol_version(),
            cipher_suite: conn.negotiated_cipher_suite().map(|s| s.suite()),
            peer_certificates: conn.peer_certificates().unwrap_or_default().to_vec(),
            server_name: conn.server_name().map(str::to_string),
            alpn_protocol: conn.alpn_protocol().map(<[u8]>::to_vec),
        }
    }

    /// The client's (verified) certificate, DER: the input of
    /// [`cert_login_name`](super::cert_login_name) for SASL EXTERNAL.
    pub fn peer_certificate(&self) -> Option<&CertificateDer<'static>> {
        self.peer_certificates.first()
    }

    /// The protocol as RabbitMQ names it in `ssl_protocol` (`tlsv1.3`, `tlsv1.2`).
    pub fn protocol_name(&self) -> &'static str {
        match self.protocol {
            Some(rustls::ProtocolVersion::TLSv1_3) => "tlsv1.3",
            Some(rustls::ProtocolVersion::TLSv1_2) => "tlsv1.2",
            _ => "",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::test_certs::{Ca, TempDir};

    /// `[tls]` settings for `dir`'s `server.pem` / `server.key` (and `ca.pem` when `ca`).
    fn settings(dir: &TempDir, ca: bool) -> TlsConfig {
        TlsConfig {
            cert_file: Some(dir.path().join("server.pem")),
            key_file: Some(dir.path().join("server.key")),
            ca_file: ca.then(|| dir.path().join("ca.pem")),
            ..TlsConfig::default()
        }
    }

    /// A directory with a CA, and a server certificate and key it signed.
    fn good_files(prefix: &str) -> (TempDir, Ca) {
        let dir = TempDir::new(prefix);
        let ca = Ca::new("Warren test CA");
        let server = ca.server();
        dir.write("server.pem", &server.cert_pem);
        dir.write("server.key", &server.key_pem);
        dir.write("ca.pem", ca.pem());
        (dir, ca)
    }

    fn error_text(settings: &TlsConfig) -> String {
        load_server_config(settings, &[]).unwrap_err().to_string()
    }

    #[test]
    fn good_files_load() {
        let (dir, _ca) = good_files("warren-tls-good");
        let h = TlsAcceptorHandle::new(&settings(&dir, false)).unwrap();
        assert!(h.server_config().alpn_protocols.is_empty());
        assert_eq!(h.reload_count(), 0);
        let alpn = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let h = TlsAcceptorHandle::with_alpn(&settings(&dir, true), alpn.clone()).unwrap();
        assert_eq!(h.server_config().alpn_protocols, alpn);
        let mut verify = settings(&dir, true);
        verify.verify_peer = true;
        verify.fail_if_no_peer_cert = true;
        TlsAcceptorHandle::new(&verify).unwrap();
    }

    #[test]
    fn nothing_to_load_when_tls_is_off_or_settings_conflict() {
        let e = error_text(&TlsConfig::default());
        assert!(e.contains("TLS is off"), "{e}");
        let (dir, _ca) = good_files("warren-tls-off");
        let mut s = settings(&dir, false);
        s.verify_peer = true;
        let e = error_text(&s);
        assert!(
            e.contains("tls.verify_peer = true needs tls.ca_file"),
            "{e}"
        );
    }

    #[test]
    fn unreadable_files_are_named() {
        let (dir, _ca) = good_files("warren-tls-missing");
        for (key, file) in [
            ("cert_file", "server.pem"),
            ("key_file", "server.key"),
            ("ca_file", "ca.pem"),
        ] {
            let path = dir.path().join(file);
            let good = std::fs::read(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            let e = error_text(&settings(&dir, true));
            assert!(
                e.starts_with(&format!("tls.{key} = {}: cannot read:", path.display())),
                "{e}"
            );
            std::fs::write(&path, good).unwrap();
        }
    }

    #[test]
    fn bad_certificate_files_say_what_is_wrong() {
        let (dir, _ca) = good_files("warren-tls-badcert");
        let s = settings(&dir, false);
        let cert = dir.path().join("server.pem");
        let prefix = format!("tls.cert_file = {}: ", cert.display());
        let key_pem = std::fs::read_to_string(dir.path().join("server.key")).unwrap();
        let cases: [(&str, String); 4] = [
            ("contains no PEM certificate", "hello\n".into()),
            ("are cert_file and key_file swapped?", key_pem),
            (
                "no -----END CERTIFICATE----- line",
                "-----BEGIN CERTIFICATE-----\nMIIB\n".into(),
            ),
            (
                "certificate #1 is not a valid X.509 certificate",
                "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n".into(),
            ),
        ];
        for (want, contents) in cases {
            dir.write("server.pem", contents);
            let e = error_text(&s);
            assert!(e.starts_with(&prefix) && e.contains(want), "{e}");
        }
    }

    #[test]
    fn bad_key_files_say_what_is_wrong() {
        let (dir, ca) = good_files("warren-tls-badkey");
        let s = settings(&dir, false);
        let key = dir.path().join("server.key");
        let prefix = format!("tls.key_file = {}: ", key.display());
        let cert_pem = std::fs::read_to_string(dir.path().join("server.pem")).unwrap();
        let other = ca.server();
        let cases: [(&str, String); 4] = [
            ("contains no PEM private key", "nothing here\n".into()),
            ("are cert_file and key_file swapped?", cert_pem.clone()),
            (
                "it is encrypted, which is not supported",
                "-----BEGIN ENCRYPTED PRIVATE KEY-----\naGVsbG8=\n-----END ENCRYPTED PRIVATE KEY-----\n"
                    .into(),
            ),
            (
                &format!(
                    "this private key does not belong to the first certificate of tls.cert_file = {}",
                    dir.path().join("server.pem").display()
                ),
                other.key_pem,
            ),
        ];
        for (want, contents) in cases {
            dir.write("server.key", contents);
            let e = error_text(&s);
            assert!(e.starts_with(&prefix) && e.contains(want), "{e}");
        }
        dir.write(
            "server.key",
            "-----BEGIN PRIVATE KEY-----\naGVsbG8gd29ybGQ=\n-----END PRIVATE KEY-----\n",
        );
        let e = error_text(&s);
        assert!(
            e.starts_with(&prefix) && e.contains("unusable private key"),
            "{e}"
        );
    }

    #[test]
    fn ca_file_is_checked_even_without_verify_peer() {
        let (dir, _ca) = good_files("warren-tls-badca");
        let prefix = format!("tls.ca_file = {}: ", dir.path().join("ca.pem").display());
        dir.write("ca.pem", "not a certificate\n");
        let e = error_text(&settings(&dir, true));
        assert!(
            e.starts_with(&prefix) && e.contains("contains no PEM certificate"),
            "{e}"
        );
        // Fine again without the ca_file setting.
        load_server_config(&settings(&dir, false), &[]).unwrap();
    }

    #[test]
    fn reload_keeps_the_old_config_when_a_file_is_bad() {
        let (dir, ca) = good_files("warren-tls-reload-bad");
        let h = TlsAcceptorHandle::new(&settings(&dir, true)).unwrap();
        let before = h.server_config();
        for (file, contents) in [
            ("server.pem", "garbage".to_string()),
            ("server.key", ca.server().key_pem),
            ("ca.pem", String::new()),
        ] {
            let good = std::fs::read(dir.path().join(file)).unwrap();
            dir.write(file, contents);
            let e = h.reload().unwrap_err().to_string();
            assert!(
                e.contains(&dir.path().join(file).display().to_string()),
                "{e}"
            );
            assert!(
                Arc::ptr_eq(&before, &h.server_config()),
                "config replaced by a bad one"
            );
            assert_eq!(h.reload_count(), 0);
            dir.write(file, good);
        }
    }

    #[test]
    fn reload_swaps_in_new_good_files() {
        let (dir, _ca) = good_files("warren-tls-reload-good");
        let h = TlsAcceptorHandle::new(&settings(&dir, false)).unwrap();
        let before = h.server_config();
        let new_ca = Ca::new("Warren second CA");
        let server = new_ca.server();
        dir.write("server.pem", &server.cert_pem);
        dir.write("server.key", &server.key_pem);
        h.reload().unwrap();
        assert!(!Arc::ptr_eq(&before, &h.server_config()));
        assert_eq!(h.reload_count(), 1);
        // Clones share the swapped config.
        let clone = h.clone();
        assert!(Arc::ptr_eq(&clone.server_config(), &h.server_config()));
    }
}

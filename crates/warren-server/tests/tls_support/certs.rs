//! Certificates for TLS tests, made fresh by each test with rcgen (no key is ever committed): a
//! CA, a server certificate for `localhost`, `127.0.0.1` and `::1`, client certificates signed by
//! the CA, self-signed (untrusted) ones, and rustls client configs that use them.
//!
//! Shared by the `tls` integration tests and the unit tests of `warren_server::tls` (which
//! include this file with `#[path]`), so it depends on rcgen and rustls only.

#![allow(dead_code)]

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A certificate with its private key, in PEM and DER.
pub struct Identity {
    /// PEM of the certificate.
    pub cert_pem: String,
    /// PEM (PKCS#8) of the private key.
    pub key_pem: String,
    /// DER of the certificate.
    pub cert_der: CertificateDer<'static>,
    /// DER of the private key.
    pub key_der: PrivatePkcs8KeyDer<'static>,
}

impl Identity {
    fn new(cert: rcgen::Certificate, key: &KeyPair) -> Identity {
        Identity {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: PrivatePkcs8KeyDer::from(key.serialize_der()),
        }
    }

    /// The private key for rustls.
    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key_der.clone_key())
    }
}

/// A certificate authority that signs server and client certificates.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Warren tests");
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

impl Ca {
    /// A new self-signed (root) CA whose subject is `CN=<name>, O=Warren tests`.
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("key generation");
        let cert = ca_params(name).self_signed(&key).expect("CA certificate");
        Ca { cert, key }
    }

    /// An intermediate CA signed by this one.
    pub fn intermediate(&self, name: &str) -> Ca {
        let key = KeyPair::generate().expect("key generation");
        let cert = ca_params(name)
            .signed_by(&key, &self.cert, &self.key)
            .expect("intermediate CA certificate");
        Ca { cert, key }
    }

    /// The CA certificate in PEM.
    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA certificate in DER.
    pub fn der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// A server certificate for `localhost`, `127.0.0.1` and `::1` (CN=localhost).
    pub fn server(&self) -> Identity {
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
        params
            .subject_alt_names
            .push(SanType::IpAddress("::1".parse().expect("ip")));
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A client certificate with the subject `CN=<cn>, O=Warren tests`, signed by this CA.
    pub fn client(&self, cn: &str) -> Identity {
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "Warren tests");
        dn.push(DnType::CommonName, cn);
        self.client_with_dn(dn)
    }

    /// A client certificate with the subject `dn`, signed by this CA.
    pub fn client_with_dn(&self, dn: DistinguishedName) -> Identity {
        self.sign(client_params(dn))
    }

    fn sign(&self, params: CertificateParams) -> Identity {
        let key = KeyPair::generate().expect("key generation");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("signing");
        Identity::new(cert, &key)
    }
}

fn client_params(dn: DistinguishedName) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = dn;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params
}

/// A self-signed client certificate (`CN=<cn>`) that no CA vouches for.
pub fn self_signed_client(cn: &str) -> Identity {
    let key = KeyPair::generate().expect("key generation");
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    let cert = client_params(dn).self_signed(&key).expect("self-signed");
    Identity::new(cert, &key)
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new empty directory whose name starts with `prefix`.
    pub fn new(prefix: &str) -> TempDir {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `contents` to `name` in the directory (replacing it) and returns its path.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, contents).expect("write test file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A rustls client config on the ring provider that trusts the CA certificates `roots`,
/// presents `identity` when given, and offers only `versions` (TLS 1.2 and 1.3 when empty).
pub fn client_config(
    roots: &[CertificateDer<'static>],
    identity: Option<&Identity>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<rustls::ClientConfig> {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).expect("trust anchor");
    }
    let versions = if versions.is_empty() {
        rustls::DEFAULT_VERSIONS
    } else {
        versions
    };
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .expect("protocol versions")
    .with_root_certificates(store);
    let config = match identity {
        Some(id) => builder
            .with_client_auth_cert(vec![id.cert_der.clone()], id.key())
            .expect("client certificate"),
        None => builder.with_no_client_auth(),
    };
    Arc::new(config)
}

/// The server name `localhost`.
pub fn localhost() -> ServerName<'static> {
    ServerName::try_from("localhost").expect("valid name")
}

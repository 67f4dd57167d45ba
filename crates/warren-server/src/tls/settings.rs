//! The `[tls]` configuration section and its command-line flags.
//!
//! The keys are RabbitMQ's `ssl_options` under Warren's names: `cert_file` (`certfile`),
//! `key_file` (`keyfile`), `ca_file` (`cacertfile`), `verify_peer` (`verify = verify_peer`,
//! otherwise `verify_none`) and `fail_if_no_peer_cert`, with RabbitMQ's defaults (no peer
//! verification). Checking the settings against each other needs no file; reading the files is
//! [`TlsAcceptorHandle::new`](super::TlsAcceptorHandle::new)'s job, so that a reload can do it
//! again.

use super::TlsError;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

/// `[tls]`: the AMQPS listener (AMQP 0-9-1 over TLS) and the TLS settings that the HTTP
/// listeners share. TLS is on when both `cert_file` and `key_file` are set.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Address of the AMQPS listener (RabbitMQ's `listeners.ssl.default`), default
    /// `0.0.0.0:5671`.
    pub listen: SocketAddr,
    /// PEM file with the server's certificate chain, leaf first, then any intermediates
    /// (RabbitMQ `ssl_options.certfile`). Sent to clients as it is.
    pub cert_file: Option<PathBuf>,
    /// PEM file with the private key of the leaf certificate: PKCS#8 (`PRIVATE KEY`), PKCS#1
    /// (`RSA PRIVATE KEY`) or SEC1 (`EC PRIVATE KEY`); RSA, ECDSA P-256/P-384 or Ed25519
    /// (RabbitMQ `ssl_options.keyfile`). Encrypted keys are not supported.
    pub key_file: Option<PathBuf>,
    /// PEM file with the certificate authorities whose client certificates are accepted
    /// (RabbitMQ `ssl_options.cacertfile`). Needed by `verify_peer`.
    pub ca_file: Option<PathBuf>,
    /// Ask clients for a certificate and refuse, during the handshake, one that is not signed
    /// by a CA of `ca_file` or is expired (RabbitMQ `ssl_options.verify = verify_peer`; the
    /// default, false, is `verify_none`: no client certificate is requested).
    pub verify_peer: bool,
    /// With `verify_peer`, also refuse clients that send no certificate (RabbitMQ
    /// `ssl_options.fail_if_no_peer_cert`, default false).
    pub fail_if_no_peer_cert: bool,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            listen: "0.0.0.0:5671".parse().expect("valid literal address"),
            cert_file: None,
            key_file: None,
            ca_file: None,
            verify_peer: false,
            fail_if_no_peer_cert: false,
        }
    }
}

impl TlsConfig {
    /// True when TLS listeners are to be started: both `cert_file` and `key_file` are set.
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() && self.key_file.is_some()
    }

    /// Rejects combinations that cannot work, without reading any file.
    ///
    /// Errors ([`TlsError::Settings`]): only one of `cert_file` / `key_file` is set;
    /// `verify_peer` without `ca_file`; `fail_if_no_peer_cert` without `verify_peer` (Erlang's
    /// `ssl` refuses that pair as incompatible options too, so RabbitMQ does not start with it).
    pub fn validate(&self) -> Result<(), TlsError> {
        let bad = |m: &str| Err(TlsError::Settings(m.to_string()));
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => {
                return bad("tls.cert_file is set but tls.key_file is not: TLS needs both")
            }
            (None, Some(_)) => {
                return bad("tls.key_file is set but tls.cert_file is not: TLS needs both")
            }
            _ => {}
        }
        if self.verify_peer && self.ca_file.is_none() {
            return bad(
                "tls.verify_peer = true needs tls.ca_file (the CAs that sign client certificates)",
            );
        }
        if self.fail_if_no_peer_cert && !self.verify_peer {
            return bad("tls.fail_if_no_peer_cert = true needs tls.verify_peer = true");
        }
        Ok(())
    }

    /// The `[tls]` section of the commented default configuration file
    /// (`--generate-config`), every key at its default.
    pub fn commented_default() -> String {
        let d = TlsConfig::default();
        format!(
            r#"[tls]
# AMQPS (AMQP over TLS) listener; it starts when cert_file and key_file are both set.
listen = "{listen}"
# PEM certificate chain of the server, leaf first, and the PEM private key of the leaf.
# cert_file = "/etc/warren/server.pem"
# key_file = "/etc/warren/server.key"
# PEM file of the certificate authorities that sign client certificates.
# ca_file = "/etc/warren/ca.pem"
# Ask clients for a certificate signed by a CA of ca_file and refuse a bad one.
verify_peer = {verify_peer}
# With verify_peer, also refuse clients that present no certificate.
fail_if_no_peer_cert = {fail_if_no_peer_cert}
# Certificates and keys are read again on SIGHUP; open connections are kept.
"#,
            listen = d.listen,
            verify_peer = d.verify_peer,
            fail_if_no_peer_cert = d.fail_if_no_peer_cert,
        )
    }
}

/// The TLS command-line flags of the `warren` binary, to be flattened into its arguments with
/// `#[command(flatten)]`; each overrides the `[tls]` key of the same name.
#[derive(clap::Args, Debug, Clone, Default, PartialEq)]
pub struct TlsArgs {
    /// AMQPS listen address [default: 0.0.0.0:5671].
    #[arg(long, value_name = "ADDR")]
    pub tls_listen: Option<SocketAddr>,
    /// PEM certificate chain of the server, leaf first (with --tls-key-file, enables AMQPS).
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of the server certificate.
    #[arg(long, value_name = "FILE")]
    pub tls_key_file: Option<PathBuf>,
    /// PEM file of the CAs that sign client certificates (for verify_peer).
    #[arg(long, value_name = "FILE")]
    pub tls_ca_file: Option<PathBuf>,
}

impl TlsArgs {
    /// Overrides the keys of `tls` that a flag was given for.
    pub fn apply(self, tls: &mut TlsConfig) {
        if let Some(a) = self.tls_listen {
            tls.listen = a;
        }
        if let Some(p) = self.tls_cert_file {
            tls.cert_file = Some(p);
        }
        if let Some(p) = self.tls_key_file {
            tls.key_file = Some(p);
        }
        if let Some(p) = self.tls_ca_file {
            tls.ca_file = Some(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn with(f: impl FnOnce(&mut TlsConfig)) -> TlsConfig {
        let mut c = TlsConfig::default();
        f(&mut c);
        c
    }

    #[test]
    fn defaults_are_rabbitmqs() {
        let d = TlsConfig::default();
        assert_eq!(d.listen, "0.0.0.0:5671".parse().unwrap());
        assert!(!d.verify_peer && !d.fail_if_no_peer_cert);
        assert!(!d.enabled());
        d.validate().unwrap();
    }

    #[test]
    fn enabled_needs_cert_and_key() {
        let both = with(|c| {
            c.cert_file = Some("c.pem".into());
            c.key_file = Some("k.pem".into());
        });
        assert!(both.enabled());
        both.validate().unwrap();

        let cert_only = with(|c| c.cert_file = Some("c.pem".into()));
        assert!(!cert_only.enabled());
        let e = cert_only.validate().unwrap_err().to_string();
        assert!(e.contains("tls.key_file is not"), "{e}");

        let key_only = with(|c| c.key_file = Some("k.pem".into()));
        let e = key_only.validate().unwrap_err().to_string();
        assert!(e.contains("tls.cert_file is not"), "{e}");
    }

    #[test]
    fn verify_peer_needs_ca_file() {
        let c = with(|c| c.verify_peer = true);
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("tls.verify_peer = true needs tls.ca_file"),
            "{e}"
        );
        with(|c| {
            c.verify_peer = true;
            c.ca_file = Some("ca.pem".into());
        })
        .validate()
        .unwrap();
    }

    #[test]
    fn fail_if_no_peer_cert_needs_verify_peer() {
        let c = with(|c| {
            c.fail_if_no_peer_cert = true;
            c.ca_file = Some("ca.pem".into());
        });
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("fail_if_no_peer_cert = true needs tls.verify_peer"),
            "{e}"
        );
        with(|c| {
            c.fail_if_no_peer_cert = true;
            c.verify_peer = true;
            c.ca_file = Some("ca.pem".into());
        })
        .validate()
        .unwrap();
    }

    #[test]
    fn commented_default_parses_to_default() {
        let t: toml::Table = TlsConfig::commented_default().parse().unwrap();
        let parsed = TlsConfig::deserialize(t["tls"].clone()).unwrap();
        assert_eq!(parsed, TlsConfig::default());
    }

    #[test]
    fn toml_keys_and_unknown_keys() {
        let t: toml::Table = r#"
            listen = "127.0.0.1:5999"
            cert_file = "/etc/warren/server.pem"
            key_file = "/etc/warren/server.key"
            ca_file = "/etc/warren/ca.pem"
            verify_peer = true
            fail_if_no_peer_cert = true
        "#
        .parse()
        .unwrap();
        let c = TlsConfig::deserialize(toml::Value::Table(t)).unwrap();
        assert_eq!(c.listen.port(), 5999);
        assert_eq!(
            c.cert_file.as_deref(),
            Some("/etc/warren/server.pem".as_ref())
        );
        assert_eq!(
            c.key_file.as_deref(),
            Some("/etc/warren/server.key".as_ref())
        );
        assert_eq!(c.ca_file.as_deref(), Some("/etc/warren/ca.pem".as_ref()));
        assert!(c.verify_peer && c.fail_if_no_peer_cert);
        c.validate().unwrap();

        let t: toml::Table = "certfile = \"x.pem\"".parse().unwrap();
        let e = TlsConfig::deserialize(toml::Value::Table(t)).unwrap_err();
        assert!(e.to_string().contains("unknown field `certfile`"), "{e}");
    }

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        tls: TlsArgs,
    }

    #[test]
    fn flags_override_keys() {
        let cli = Cli::try_parse_from([
            "warren",
            "--tls-listen",
            "127.0.0.1:5671",
            "--tls-cert-file",
            "/tmp/c.pem",
            "--tls-key-file",
            "/tmp/k.pem",
            "--tls-ca-file",
            "/tmp/ca.pem",
        ])
        .unwrap();
        let mut c = with(|c| {
            c.verify_peer = true;
            c.cert_file = Some("/etc/old.pem".into());
        });
        cli.tls.apply(&mut c);
        assert_eq!(c.listen, "127.0.0.1:5671".parse().unwrap());
        assert_eq!(c.cert_file.as_deref(), Some("/tmp/c.pem".as_ref()));
        assert_eq!(c.key_file.as_deref(), Some("/tmp/k.pem".as_ref()));
        assert_eq!(c.ca_file.as_deref(), Some("/tmp/ca.pem".as_ref()));
        assert!(c.verify_peer, "keys without a flag are kept");

        let none = Cli::try_parse_from(["warren"]).unwrap();
        assert_eq!(none.tls, TlsArgs::default());
        let before = c.clone();
        none.tls.apply(&mut c);
        assert_eq!(c, before);
    }
}

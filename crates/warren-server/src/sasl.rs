//! SASL for AMQP 0-9-1: which mechanisms a connection is offered, and what a client's
//! connection.start-ok response means.
//!
//! - PLAIN (RFC 4616): `authzid NUL authcid NUL password`.
//! - AMQPLAIN: a field table without its length prefix, holding `LOGIN` and `PASSWORD`.
//! - EXTERNAL: the user name comes from the client certificate verified during the TLS
//!   handshake, as RabbitMQ's `rabbitmq_auth_mechanism_ssl` derives it (`[auth]
//!   ssl_cert_login_from`); the response is ignored. Offered only on TLS connections whose
//!   client presented a verified certificate (RabbitMQ offers it on every TLS connection and
//!   refuses the login later; offering it only where it can work keeps clients that pick the
//!   first mechanism they support from choosing it in vain).
//! - ANONYMOUS: logs in as `[auth] anonymous_user`; offered only when that is set.
//!
//! `[auth] mechanisms` chooses which of these are offered, in its order.

use crate::config::AuthConfig;
use crate::tls::{cert_login_name, CertLoginFrom, TlsSessionInfo};
use bytes::Bytes;
use warren_amqp::table::Decoder;

/// What the transport established about a client before the AMQP handshake.
#[derive(Debug, Clone, Default)]
pub struct TransportSecurity {
    /// The TLS session, for connections accepted on the AMQPS listener.
    pub tls: Option<TlsSessionInfo>,
}

impl TransportSecurity {
    /// A plain TCP connection.
    pub fn plain() -> Self {
        TransportSecurity::default()
    }

    /// True when the client presented a certificate during the TLS handshake. Such a
    /// certificate has been verified against `tls.ca_file`: rustls only asks for one with
    /// `verify_peer` and refuses the handshake when it does not verify.
    pub fn has_client_certificate(&self) -> bool {
        self.tls
            .as_ref()
            .is_some_and(|t| t.peer_certificate().is_some())
    }
}

/// The mechanisms offered to a connection with `security`, in the configured order.
pub fn offered<'a>(auth: &'a AuthConfig, security: &TransportSecurity) -> Vec<&'a str> {
    auth.mechanisms
        .iter()
        .map(String::as_str)
        .filter(|m| match *m {
            "EXTERNAL" => security.has_client_certificate(),
            "ANONYMOUS" => auth.anonymous_user.is_some(),
            _ => true,
        })
        .collect()
}

/// The `mechanisms` field of connection.start: the offered names separated by spaces.
pub fn mechanisms_field(offered: &[&str]) -> Bytes {
    Bytes::from(offered.join(" ").into_bytes())
}

/// A start-ok response, decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum Response {
    /// PLAIN or AMQPLAIN.
    Password {
        /// User name.
        user: String,
        /// Password.
        password: String,
    },
    /// EXTERNAL: the name from the client certificate.
    Certificate {
        /// User name.
        user: String,
    },
    /// ANONYMOUS, as the configured user.
    Anonymous {
        /// The anonymous user.
        user: String,
    },
}

/// Why a response gives no user to log in; said in the log, never to the client.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResponseError {
    /// The response does not fit the mechanism's format.
    #[error("{0} response is malformed")]
    Malformed(&'static str),
    /// EXTERNAL without a usable name in the certificate (RabbitMQ's texts).
    #[error("{0}")]
    Certificate(String),
}

/// Decodes the start-ok `response` for `mechanism` (one of the offered ones).
///
/// Errors: [`ResponseError`], for the log.
pub fn decode(
    mechanism: &str,
    response: &[u8],
    auth: &AuthConfig,
    security: &TransportSecurity,
) -> Result<Response, ResponseError> {
    match mechanism {
        "PLAIN" => plain(response).ok_or(ResponseError::Malformed("PLAIN")),
        "AMQPLAIN" => amqplain(response).ok_or(ResponseError::Malformed("AMQPLAIN")),
        "EXTERNAL" => external(security, auth.ssl_cert_login_from),
        "ANONYMOUS" => auth
            .anonymous_user
            .clone()
            .map(|user| Response::Anonymous { user })
            .ok_or(ResponseError::Malformed("ANONYMOUS")),
        _ => Err(ResponseError::Malformed("unknown mechanism")),
    }
}

fn plain(response: &[u8]) -> Option<Response> {
    let mut parts = response.split(|b| *b == 0);
    let _authz = parts.next()?;
    let user = std::str::from_utf8(parts.next()?).ok()?;
    let password = std::str::from_utf8(parts.next()?).ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some(Response::Password {
        user: user.to_string(),
        password: password.to_string(),
    })
}

fn amqplain(response: &[u8]) -> Option<Response> {
    let mut framed = Vec::with_capacity(response.len() + 4);
    framed.extend_from_slice(&u32::try_from(response.len()).ok()?.to_be_bytes());
    framed.extend_from_slice(response);
    let table = warren_amqp::table::decode_table(&mut Decoder::new(&framed), 4).ok()?;
    Some(Response::Password {
        user: table.get("LOGIN")?.as_str()?.to_string(),
        password: table.get("PASSWORD")?.as_str()?.to_string(),
    })
}

fn external(security: &TransportSecurity, from: CertLoginFrom) -> Result<Response, ResponseError> {
    let Some(tls) = &security.tls else {
        return Err(ResponseError::Certificate(
            "not a TLS-enabled connection".into(),
        ));
    };
    let Some(cert) = tls.peer_certificate() else {
        return Err(ResponseError::Certificate(
            "connection peer presented no TLS (x.509) certificate".into(),
        ));
    };
    cert_login_name(cert, from)
        .map(|user| Response::Certificate { user })
        .map_err(|e| ResponseError::Certificate(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_amqplain_responses() {
        assert_eq!(
            plain(b"\0app\0s3cret"),
            Some(Response::Password {
                user: "app".into(),
                password: "s3cret".into()
            })
        );
        assert_eq!(plain(b"app"), None);
        assert_eq!(plain(b"\0a\0b\0c"), None);
        // LOGIN "u", PASSWORD "p" as field-table entries without the length prefix.
        let mut t = Vec::new();
        for (k, v) in [("LOGIN", "u"), ("PASSWORD", "p")] {
            t.push(k.len() as u8);
            t.extend_from_slice(k.as_bytes());
            t.push(b'S');
            t.extend_from_slice(&(v.len() as u32).to_be_bytes());
            t.extend_from_slice(v.as_bytes());
        }
        assert_eq!(
            amqplain(&t),
            Some(Response::Password {
                user: "u".into(),
                password: "p".into()
            })
        );
        assert_eq!(amqplain(b"\x05LOGIN"), None);
    }

    #[test]
    fn only_usable_mechanisms_are_offered() {
        let mut auth = AuthConfig {
            mechanisms: ["EXTERNAL", "PLAIN", "ANONYMOUS", "AMQPLAIN"]
                .map(String::from)
                .to_vec(),
            ..AuthConfig::default()
        };
        let plain_tcp = TransportSecurity::plain();
        assert_eq!(offered(&auth, &plain_tcp), ["PLAIN", "AMQPLAIN"]);
        auth.anonymous_user = Some("anon".into());
        assert_eq!(
            offered(&auth, &plain_tcp),
            ["PLAIN", "ANONYMOUS", "AMQPLAIN"]
        );
        assert_eq!(
            mechanisms_field(&offered(&auth, &plain_tcp)),
            "PLAIN ANONYMOUS AMQPLAIN"
        );
        assert_eq!(
            decode("EXTERNAL", b"", &auth, &plain_tcp),
            Err(ResponseError::Certificate(
                "not a TLS-enabled connection".into()
            ))
        );
        assert_eq!(
            decode("ANONYMOUS", b"whatever", &auth, &plain_tcp),
            Ok(Response::Anonymous {
                user: "anon".into()
            })
        );
    }
}

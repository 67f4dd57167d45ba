//! Listen addresses as RabbitMQ's listeners take them, and binding them.
//!
//! A [`ListenAddr`] is a bare port (`5672`: every interface, IPv4 and IPv6, as RabbitMQ's
//! `listeners.tcp.default = 5672`), an IP literal with a port (`127.0.0.1:5672`,
//! `[::1]:5672`), or a host name with a port (`localhost:5672`: every address the name
//! resolves to). Every listener of the broker (AMQP today; AMQPS and HTTP later) is configured
//! with one and bound with [`ListenAddr::bind`], so they all behave alike: one socket per
//! address, IPv6 sockets that do not also take IPv4 (so that the IPv4 socket beside them can
//! bind), and errors that name the address and the setting it came from.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use tokio::net::TcpListener;

/// Where a listener listens. Parsed from `PORT`, `IP:PORT`, `[IPv6]:PORT` or `HOST:PORT`, or
/// from a TOML integer (a port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// Every interface, IPv4 (`0.0.0.0`) and IPv6 (`[::]`), on this port.
    Port(u16),
    /// One socket address.
    Addr(SocketAddr),
    /// Every address `host` resolves to, on `port`.
    Host(String, u16),
}

impl ListenAddr {
    /// The port (0 picks a free one when binding).
    pub fn port(&self) -> u16 {
        match self {
            ListenAddr::Port(p) | ListenAddr::Host(_, p) => *p,
            ListenAddr::Addr(a) => a.port(),
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Port(p) => write!(f, "{p}"),
            ListenAddr::Addr(a) => write!(f, "{a}"),
            ListenAddr::Host(h, p) => write!(f, "{h}:{p}"),
        }
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let bad = || {
            format!(
                "'{s}' is not a listen address (expected PORT, IP:PORT, [IPv6]:PORT or \
                 HOST:PORT, e.g. 5672, 0.0.0.0:5672, [::1]:5672, localhost:5672)"
            )
        };
        if let Ok(p) = s.parse::<u16>() {
            return Ok(ListenAddr::Port(p));
        }
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(ListenAddr::Addr(a));
        }
        let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let valid = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_');
        if !valid {
            return Err(bad());
        }
        Ok(ListenAddr::Host(host.to_string(), port))
    }
}

impl Serialize for ListenAddr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ListenAddr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = ListenAddr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number or a string such as \"0.0.0.0:5672\"")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ListenAddr, E> {
                u16::try_from(v)
                    .map(ListenAddr::Port)
                    .map_err(|_| E::custom(format!("port {v} is not in 0..=65535")))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ListenAddr, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(-1))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ListenAddr, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A listener that could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {} ({key} = {listen}): {source}{}", addr.map(|a| a.to_string()).unwrap_or_else(|| listen.to_string()), hint(source, listen.port()))]
pub struct ListenError {
    /// The setting, e.g. `amqp.listen`.
    pub key: String,
    /// Its value.
    pub listen: ListenAddr,
    /// The socket address that failed, when it got that far.
    pub addr: Option<SocketAddr>,
    /// The cause.
    pub source: std::io::Error,
}

fn hint(e: &std::io::Error, port: u16) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EADDRINUSE) if port == 5672 => {
            " (another process listens there, e.g. a running RabbitMQ, whose default port this \
             is too: stop it or choose another port)"
        }
        Some(libc::EADDRINUSE) => {
            " (another process listens there: stop it or choose another port)"
        }
        Some(libc::EACCES) => " (ports below 1024 need privileges)",
        Some(libc::EADDRNOTAVAIL) => " (not an address of this machine)",
        _ => "",
    }
}

impl ListenAddr {
    /// Binds every socket this address stands for, on the current tokio runtime. `key` names
    /// the setting in errors (`amqp.listen`). A bare port binds `0.0.0.0` and `[::]`
    /// (IPv6-only), leaving out IPv6 with a warning when the machine has none; port 0 gives
    /// every socket the same free port.
    ///
    /// Errors: [`ListenError`] naming the socket address that failed (in use, not
    /// permitted, not local) or the host name that does not resolve.
    pub async fn bind(&self, key: &str) -> Result<Vec<TcpListener>, ListenError> {
        let err = |addr: Option<SocketAddr>, source: std::io::Error| ListenError {
            key: key.to_string(),
            listen: self.clone(),
            addr,
            source,
        };
        let (addrs, optional_v6): (Vec<SocketAddr>, bool) = match self {
            ListenAddr::Port(p) => (
                vec![
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), *p),
                    SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), *p),
                ],
                true,
            ),
            ListenAddr::Addr(a) => (vec![*a], false),
            ListenAddr::Host(h, p) => {
                let mut found: Vec<SocketAddr> = Vec::new();
                let resolved = tokio::net::lookup_host((h.as_str(), *p))
                    .await
                    .map_err(|e| err(None, e))?;
                for a in resolved {
                    if !found.contains(&a) {
                        found.push(a);
                    }
                }
                // IPv4 first, so that port 0 takes its free port from there.
                found.sort_by_key(|a| a.is_ipv6());
                (found, false)
            }
        };
        // With port 0, a later socket may find the first one's port taken in its family.
        let attempts = if self.port() == 0 { 5 } else { 1 };
        let mut last = None;
        for _ in 0..attempts {
            match bind_all(&addrs, optional_v6) {
                Ok(l) => return Ok(l),
                Err((addr, e)) => last = Some(err(Some(addr), e)),
            }
        }
        Err(last.expect("at least one attempt"))
    }
}

fn bind_all(
    addrs: &[SocketAddr],
    optional_v6: bool,
) -> Result<Vec<TcpListener>, (SocketAddr, std::io::Error)> {
    let mut out: Vec<TcpListener> = Vec::new();
    let mut port = None;
    for a in addrs {
        let mut a = *a;
        if a.port() == 0 {
            if let Some(p) = port {
                a.set_port(p);
            }
        }
        match bind_one(a) {
            Ok(l) => {
                port = port.or_else(|| l.local_addr().ok().map(|x| x.port()));
                out.push(l);
            }
            Err(e)
                if optional_v6
                    && a.is_ipv6()
                    && matches!(
                        e.raw_os_error(),
                        Some(libc::EAFNOSUPPORT) | Some(libc::EADDRNOTAVAIL)
                    ) =>
            {
                tracing::warn!(addr = %a, error = %e, "no IPv6 on this machine: listening on IPv4 only");
            }
            Err(e) => return Err((a, e)),
        }
    }
    Ok(out)
}

/// One listening socket. IPv6 sockets are IPv6-only, so that `[::]` and `0.0.0.0` can both be
/// bound on one port whatever the system's `bindv6only` default.
fn bind_one(addr: SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // As tokio's TcpListener::bind: a restarted broker need not wait for TIME_WAIT sockets.
    socket.set_reuse_address(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(std::net::TcpListener::from(socket))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rabbitmq_forms() {
        assert_eq!(
            "5672".parse::<ListenAddr>().unwrap(),
            ListenAddr::Port(5672)
        );
        assert_eq!(
            "127.0.0.1:5672".parse::<ListenAddr>().unwrap(),
            ListenAddr::Addr("127.0.0.1:5672".parse().unwrap())
        );
        assert_eq!(
            "[::1]:5672".parse::<ListenAddr>().unwrap(),
            ListenAddr::Addr("[::1]:5672".parse().unwrap())
        );
        assert_eq!(
            "localhost:5672".parse::<ListenAddr>().unwrap(),
            ListenAddr::Host("localhost".into(), 5672)
        );
        for bad in ["", "::1", "host", "host:99999", "a b:1", "70000"] {
            assert!(bad.parse::<ListenAddr>().is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_port_binds_both_families_and_errors_name_the_address() {
        let ls = ListenAddr::Port(0).bind("amqp.listen").await.unwrap();
        let ports: Vec<u16> = ls.iter().map(|l| l.local_addr().unwrap().port()).collect();
        assert!(ports.iter().all(|p| *p == ports[0]), "{ports:?}");
        let taken = ls[0].local_addr().unwrap();
        let e = ListenAddr::Addr(taken)
            .bind("amqp.listen")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains(&taken.to_string()), "{e}");
        assert!(e.contains("amqp.listen"), "{e}");
        assert!(e.contains("another process listens there"), "{e}");
        let e = ListenAddr::Host("no-such-host.invalid".into(), 5672)
            .bind("amqp.listen")
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("no-such-host.invalid:5672"), "{e}");
    }
}

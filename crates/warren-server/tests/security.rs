//! Security end to end on real sockets: the AMQPS listener (lapin over TLS, mutual TLS accepted
//! and refused during the handshake), SASL EXTERNAL with a client certificate, ANONYMOUS,
//! login refusals that look the same for an unknown user and a wrong password, vhost access
//! (530), per-vhost and per-user limits, users with password hashes from the configuration.
//! Certificates are made by each test (rcgen); no key is committed.

mod tls_support;

use bytes::{Bytes, BytesMut};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::{Connection, ConnectionProperties};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tls_support::certs::{client_config, self_signed_client, Ca, Identity};
use tls_support::{within, ServerFiles};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use warren_amqp::frame::{encode_method_frame, parse_frame, Frame, Limits, PROTOCOL_HEADER};
use warren_amqp::generated::*;
use warren_amqp::table::{FieldTable, FieldValue};
use warren_amqp::Method;
use warren_server::config::{PermissionConfig, UserConfig, VhostConfig};
use warren_server::{Broker, Config, RunningBroker};

// --- Brokers ---

fn base_config() -> Config {
    let mut c = Config::default();
    c.amqp.listen = "127.0.0.1:0".parse().unwrap();
    c.auth.login_failure_delay_ms = 300;
    c
}

fn user(name: &str, password: Option<&str>) -> UserConfig {
    UserConfig {
        name: name.into(),
        password: password.map(warren_broker::access::Cleartext::new),
        password_hash: None,
        hashing_algorithm: None,
        tags: vec![],
        loopback_only: false,
        max_connections: None,
        max_channels: None,
    }
}

fn full(user: &str, vhost: &str) -> PermissionConfig {
    PermissionConfig {
        user: user.into(),
        vhost: vhost.into(),
        configure: ".*".into(),
        write: ".*".into(),
        read: ".*".into(),
    }
}

fn vhost(name: &str) -> VhostConfig {
    VhostConfig {
        name: name.into(),
        description: String::new(),
        max_connections: None,
    }
}

async fn start(config: Config) -> RunningBroker {
    Broker::builder()
        .config(config)
        .start()
        .await
        .expect("broker starts")
}

/// A CA, server files it signed, and a config whose AMQPS listener serves them on a free port.
fn tls_broker_config(verify_peer: bool, fail_if_no_peer_cert: bool) -> (Ca, ServerFiles, Config) {
    let ca = Ca::new("Warren security CA");
    let files = ServerFiles::new(&ca.server(), Some(&ca.pem()));
    let mut c = base_config();
    c.tls = files.settings.clone();
    c.tls.listen = "127.0.0.1:0".parse().unwrap();
    c.tls.verify_peer = verify_peer;
    c.tls.fail_if_no_peer_cert = fail_if_no_peer_cert;
    (ca, files, c)
}

fn lapin_tls(ca: &Ca, identity: Option<&Identity>) -> OwnedTLSConfig {
    OwnedTLSConfig {
        identity: identity.map(|id| OwnedIdentity::PKCS8 {
            pem: id.cert_pem.clone().into_bytes(),
            key: id.key_pem.clone().into_bytes(),
        }),
        cert_chain: Some(ca.pem()),
    }
}

async fn lapin_connect(uri: &str, tls: OwnedTLSConfig) -> lapin::Result<Connection> {
    within(
        "lapin connection",
        Connection::connect_with_config(
            uri,
            ConnectionProperties::default(),
            tls,
            lapin::runtime::default_runtime().unwrap(),
        ),
    )
    .await
}

async fn round_trip(conn: &Connection, queue: &str) {
    use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
    let ch = within("channel.open", conn.create_channel()).await.unwrap();
    within(
        "queue.declare",
        ch.queue_declare(
            queue.into(),
            QueueDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    within(
        "basic.publish",
        ch.basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            b"secret",
            lapin::BasicProperties::default(),
        ),
    )
    .await
    .unwrap();
    let got = within("basic.get", async {
        loop {
            let opts = BasicGetOptions { no_ack: true };
            if let Some(m) = ch.basic_get(queue.into(), opts).await.unwrap() {
                return m;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert_eq!(got.delivery.data, b"secret");
}

// --- A raw AMQP client, for exact replies and timing ---

struct Raw<S> {
    stream: S,
    buf: BytesMut,
}

#[allow(clippy::large_enum_variant)]
enum Next {
    Frame(Frame),
    Eof,
    Error(std::io::Error),
}

impl<S: AsyncRead + AsyncWrite + Unpin> Raw<S> {
    async fn start(mut stream: S) -> std::io::Result<(Raw<S>, ConnectionStart)> {
        stream.write_all(PROTOCOL_HEADER).await?;
        let mut raw = Raw {
            stream,
            buf: BytesMut::new(),
        };
        match raw.next().await {
            Next::Frame(Frame::Method {
                method: Method::ConnectionStart(s),
                ..
            }) => Ok((raw, s)),
            Next::Error(e) => Err(e),
            Next::Eof => Err(std::io::ErrorKind::UnexpectedEof.into()),
            Next::Frame(f) => panic!("expected connection.start, got {f:?}"),
        }
    }

    async fn next(&mut self) -> Next {
        loop {
            match parse_frame(&mut self.buf, &Limits::default()) {
                Ok(Some(Frame::Heartbeat { .. })) => continue,
                Ok(Some(f)) => return Next::Frame(f),
                Ok(None) => {}
                Err(e) => panic!("undecodable frame: {e}"),
            }
            match within("a frame or EOF", self.stream.read_buf(&mut self.buf)).await {
                Ok(0) => return Next::Eof,
                Ok(_) => {}
                Err(e) => return Next::Error(e),
            }
        }
    }

    async fn send(&mut self, method: Method) {
        let mut out = BytesMut::new();
        encode_method_frame(0, &method, &mut out);
        self.stream.write_all(&out).await.unwrap();
    }

    async fn start_ok(&mut self, mechanism: &str, response: Bytes, failure_close: bool) {
        let mut caps = FieldTable::new();
        caps.insert(
            "authentication_failure_close",
            FieldValue::Bool(failure_close),
        );
        let mut props = FieldTable::new();
        props.insert("capabilities", FieldValue::Table(caps));
        self.send(Method::ConnectionStartOk(ConnectionStartOk {
            client_properties: props,
            mechanism: mechanism.into(),
            response,
            locale: "en_US".into(),
        }))
        .await;
    }

    /// After start-ok: tune-ok and connection.open; the reply to the open.
    async fn tune_and_open(&mut self, vhost: &str) -> Method {
        match self.next().await {
            Next::Frame(Frame::Method {
                method: Method::ConnectionTune(t),
                ..
            }) => {
                self.send(Method::ConnectionTuneOk(ConnectionTuneOk {
                    channel_max: t.channel_max,
                    frame_max: t.frame_max,
                    heartbeat: 0,
                }))
                .await;
            }
            Next::Frame(f) => panic!("expected connection.tune, got {f:?}"),
            _ => panic!("expected connection.tune, got EOF"),
        }
        self.send(Method::ConnectionOpen(ConnectionOpen {
            virtual_host: vhost.into(),
            capabilities: String::new(),
            insist: false,
        }))
        .await;
        match self.next().await {
            Next::Frame(Frame::Method { method, .. }) => method,
            _ => panic!("expected a reply to connection.open"),
        }
    }
}

fn plain(user: &str, pass: &str) -> Bytes {
    Bytes::from(format!("\0{user}\0{pass}").into_bytes())
}

async fn raw_tcp(b: &RunningBroker) -> (Raw<tokio::net::TcpStream>, ConnectionStart) {
    let tcp = tokio::net::TcpStream::connect(b.amqp_addr()).await.unwrap();
    Raw::start(tcp).await.expect("connection.start")
}

/// PLAIN login and connection.open of `vhost`: the reply to the open.
async fn open_as(b: &RunningBroker, user: &str, pass: &str, vhost: &str) -> Method {
    let (mut raw, _) = raw_tcp(b).await;
    raw.start_ok("PLAIN", plain(user, pass), true).await;
    let reply = raw.tune_and_open(vhost).await;
    std::mem::forget(raw); // keep the socket (an open connection) for the test's duration
    reply
}

fn close_of(m: &Method) -> (u16, String, u16, u16) {
    match m {
        Method::ConnectionClose(c) => (c.reply_code, c.reply_text.clone(), c.class_id, c.method_id),
        other => panic!("expected connection.close, got {other:?}"),
    }
}

// --- TLS ---

#[tokio::test]
async fn lapin_over_the_amqps_listener_and_plain_tcp_beside_it() {
    let (ca, _files, config) = tls_broker_config(false, false);
    let b = start(config).await;
    let tls_addr = b.amqps_addr().expect("AMQPS listener");
    assert_ne!(tls_addr.port(), b.amqp_addr().port());
    let uri = format!("amqps://guest:guest@127.0.0.1:{}/%2f", tls_addr.port());
    let conn = lapin_connect(&uri, lapin_tls(&ca, None))
        .await
        .expect("lapin over TLS");
    round_trip(&conn, "over-tls").await;
    // Plain AMQP still works on the other listener and sees the same broker.
    let plain_uri = format!("amqp://guest:guest@127.0.0.1:{}/%2f", b.amqp_addr().port());
    let plain_conn = lapin_connect(&plain_uri, OwnedTLSConfig::default())
        .await
        .expect("plain lapin");
    round_trip(&plain_conn, "over-tls").await;
    // A client that does not speak TLS gets no AMQP from the TLS port.
    let mut tcp = tokio::net::TcpStream::connect(tls_addr).await.unwrap();
    tcp.write_all(PROTOCOL_HEADER).await.unwrap();
    let mut buf = [0u8; 64];
    let n = within("the TLS port's answer", tcp.read(&mut buf))
        .await
        .unwrap_or(0);
    assert!(
        n == 0 || buf[0] == 0x15,
        "expected a TLS alert or a close, got {:?}",
        &buf[..n]
    );
    b.shutdown().await;
}

#[tokio::test]
async fn mutual_tls_accepts_ca_signed_clients_and_refuses_others_in_the_handshake() {
    let (ca, _files, config) = tls_broker_config(true, true);
    let b = start(config).await;
    let addr = b.amqps_addr().unwrap();
    let uri = format!("amqps://guest:guest@127.0.0.1:{}/%2f", addr.port());
    let good = ca.client("mtls-client");
    let conn = lapin_connect(&uri, lapin_tls(&ca, Some(&good)))
        .await
        .expect("a CA-signed client certificate is accepted");
    round_trip(&conn, "mtls").await;

    // No certificate, or one no CA of ca_file signed: refused before any AMQP.
    for identity in [None, Some(self_signed_client("intruder"))] {
        let cfg = client_config(&[ca.der()], identity.as_ref(), &[]);
        let outcome = match tls_support::connect(addr, cfg, None).await {
            Err(e) => Err(e),
            Ok(tls) => Raw::start(tls).await.map(|_| ()),
        };
        outcome.expect_err("the handshake must fail before connection.start");
        assert!(lapin_connect(&uri, lapin_tls(&ca, identity.as_ref()))
            .await
            .is_err());
    }
    b.shutdown().await;
}

// --- SASL ---

fn external_config(
    from: warren_server::tls::CertLoginFrom,
    name: &str,
) -> (Ca, ServerFiles, Config) {
    let (ca, files, mut c) = tls_broker_config(true, false);
    c.auth.mechanisms = ["PLAIN", "AMQPLAIN", "EXTERNAL"].map(String::from).to_vec();
    c.auth.ssl_cert_login_from = from;
    c.users = vec![user("guest", Some("guest")), user(name, None)];
    c.permissions = vec![full("guest", "/"), full(name, "/")];
    (ca, files, c)
}

async fn tls_start_mechanisms(addr: SocketAddr, ca: &Ca, identity: Option<&Identity>) -> String {
    let tls = tls_support::connect(addr, client_config(&[ca.der()], identity, &[]), None)
        .await
        .unwrap();
    let (_, start) = Raw::start(tls).await.unwrap();
    String::from_utf8(start.mechanisms.to_vec()).unwrap()
}

#[tokio::test]
async fn external_logs_in_as_the_certificate_subject() {
    use warren_server::tls::CertLoginFrom;
    let (ca, _files, config) = external_config(
        CertLoginFrom::DistinguishedName,
        "CN=ext-client,O=Warren tests",
    );
    let b = start(config).await;
    let addr = b.amqps_addr().unwrap();
    let client = ca.client("ext-client");
    // Offered only on TLS with a verified client certificate.
    assert_eq!(
        tls_start_mechanisms(addr, &ca, Some(&client)).await,
        "PLAIN AMQPLAIN EXTERNAL"
    );
    assert_eq!(
        tls_start_mechanisms(addr, &ca, None).await,
        "PLAIN AMQPLAIN"
    );
    let (_, plain_start) = raw_tcp(&b).await;
    assert_eq!(&plain_start.mechanisms[..], b"PLAIN AMQPLAIN");

    let uri = format!(
        "amqps://127.0.0.1:{}/%2f?auth_mechanism=external",
        addr.port()
    );
    let conn = lapin_connect(&uri, lapin_tls(&ca, Some(&client)))
        .await
        .expect("EXTERNAL login");
    round_trip(&conn, "external").await;
    // A verified certificate whose subject is no user is refused like any bad login.
    let stranger = ca.client("stranger");
    let e = lapin_connect(&uri, lapin_tls(&ca, Some(&stranger)))
        .await
        .expect_err("unknown certificate user");
    assert!(
        e.to_string()
            .contains("Login was refused using authentication mechanism EXTERNAL"),
        "{e}"
    );
    b.shutdown().await;

    // common_name: the CN alone.
    let (ca, _files, config) = external_config(CertLoginFrom::CommonName, "cn-client");
    let b = start(config).await;
    let uri = format!(
        "amqps://127.0.0.1:{}/%2f?auth_mechanism=external",
        b.amqps_addr().unwrap().port()
    );
    let conn = lapin_connect(&uri, lapin_tls(&ca, Some(&ca.client("cn-client"))))
        .await
        .expect("EXTERNAL login by common name");
    round_trip(&conn, "external-cn").await;
    b.shutdown().await;
}

#[tokio::test]
async fn anonymous_logs_in_as_the_configured_user_only_when_set() {
    let b = start(base_config()).await;
    let (mut raw, start_method) = raw_tcp(&b).await;
    assert_eq!(&start_method.mechanisms[..], b"PLAIN AMQPLAIN");
    raw.start_ok("ANONYMOUS", Bytes::new(), true).await;
    match raw.next().await {
        Next::Frame(Frame::Method {
            method: Method::ConnectionClose(c),
            ..
        }) => assert_eq!(
            (c.reply_code, c.reply_text.as_str()),
            (
                503,
                "COMMAND_INVALID - invalid authentication mechanism 'ANONYMOUS'"
            )
        ),
        _ => panic!("expected connection.close"),
    }
    b.shutdown().await;

    let mut c = base_config();
    c.auth.mechanisms = vec!["ANONYMOUS".into(), "PLAIN".into()];
    c.auth.anonymous_user = Some("anon".into());
    c.users = vec![user("anon", None)];
    let b = start(c).await;
    let (mut raw, start_method) = raw_tcp(&b).await;
    assert_eq!(&start_method.mechanisms[..], b"ANONYMOUS PLAIN");
    raw.start_ok("ANONYMOUS", Bytes::from_static(b"trace"), true)
        .await;
    assert!(matches!(
        raw.tune_and_open("/").await,
        Method::ConnectionOpenOk(_)
    ));
    // lapin's ANONYMOUS.
    let uri = format!(
        "amqp://127.0.0.1:{}/%2f?auth_mechanism=anonymous",
        b.amqp_addr().port()
    );
    let conn = lapin_connect(&uri, OwnedTLSConfig::default())
        .await
        .expect("lapin ANONYMOUS");
    round_trip(&conn, "anon").await;
    b.shutdown().await;
}

#[tokio::test]
async fn unknown_user_and_wrong_password_are_refused_alike_after_a_delay() {
    let mut c = base_config();
    c.users = vec![user("app", Some("right"))];
    let delay = Duration::from_millis(c.auth.login_failure_delay_ms);
    let b = start(c).await;
    let mut texts = Vec::new();
    for (who, pass) in [("app", "wrong"), ("nobody", "wrong"), ("app", "")] {
        // With authentication_failure_close: 403 at once, the socket closed after the delay.
        let (mut raw, _) = raw_tcp(&b).await;
        let sent = Instant::now();
        raw.start_ok("PLAIN", plain(who, pass), true).await;
        let close = match raw.next().await {
            Next::Frame(Frame::Method { method, .. }) => close_of(&method),
            _ => panic!("expected connection.close"),
        };
        texts.push(close);
        assert!(matches!(raw.next().await, Next::Eof | Next::Error(_)));
        assert!(sent.elapsed() >= delay, "closed after {:?}", sent.elapsed());

        // Without the capability: no close, only the socket closing after the delay.
        let (mut raw, _) = raw_tcp(&b).await;
        let sent = Instant::now();
        raw.start_ok("PLAIN", plain(who, pass), false).await;
        match raw.next().await {
            Next::Eof | Next::Error(_) => {}
            Next::Frame(f) => panic!("expected the socket to close, got {f:?}"),
        }
        assert!(sent.elapsed() >= delay, "closed after {:?}", sent.elapsed());
    }
    let expected = (
        403,
        "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details \
         see the broker logfile."
            .to_string(),
        0,
        0,
    );
    assert!(texts.iter().all(|t| *t == expected), "{texts:?}");
    // The right password gets in.
    assert!(matches!(
        open_as(&b, "app", "right", "/").await,
        Method::ConnectionOpenOk(_)
    ));
    b.shutdown().await;
}

#[tokio::test]
async fn loopback_users_are_refused_from_other_addresses() {
    // The broker listens on every IPv4 address; the test connects through a non-loopback one
    // when the machine has one.
    let Some(ip) = non_loopback_ipv4() else {
        return;
    };
    let mut c = base_config();
    c.amqp.listen = "0.0.0.0:0".parse().unwrap();
    c.users = vec![user("guest", Some("guest")), user("app", Some("app"))];
    let b = start(c).await;
    let addr = SocketAddr::new(ip, b.amqp_addr().port());
    for (who, ok) in [("guest", false), ("app", true)] {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut raw, _) = Raw::start(tcp).await.unwrap();
        raw.start_ok("PLAIN", plain(who, who), true).await;
        match raw.next().await {
            Next::Frame(Frame::Method {
                method: Method::ConnectionTune(_),
                ..
            }) => assert!(ok, "{who} let in from {ip}"),
            Next::Frame(Frame::Method {
                method: Method::ConnectionClose(c),
                ..
            }) => {
                assert!(!ok, "{who} refused: {c:?}");
                assert_eq!(c.reply_code, 403);
            }
            _ => panic!("unexpected reply"),
        }
    }
    b.shutdown().await;
}

fn non_loopback_ipv4() -> Option<std::net::IpAddr> {
    // The address the machine would use to reach a public one (no packet is sent).
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

// --- Vhosts, permissions, limits ---

#[tokio::test]
async fn a_vhost_without_permissions_is_refused_with_530() {
    let mut c = base_config();
    c.vhosts = vec![vhost("other")];
    c.users = vec![user("app", Some("pw")), user("ops", Some("pw"))];
    c.permissions = vec![full("app", "/"), full("ops", "other")];
    let b = start(c).await;
    assert!(matches!(
        open_as(&b, "app", "pw", "/").await,
        Method::ConnectionOpenOk(_)
    ));
    assert!(matches!(
        open_as(&b, "ops", "pw", "other").await,
        Method::ConnectionOpenOk(_)
    ));
    assert_eq!(
        close_of(&open_as(&b, "app", "pw", "other").await),
        (
            530,
            "NOT_ALLOWED - access to vhost 'other' refused for user 'app'".into(),
            10,
            40
        )
    );
    assert_eq!(
        close_of(&open_as(&b, "app", "pw", "missing").await),
        (530, "NOT_ALLOWED - vhost missing not found".into(), 10, 40)
    );
    // lapin sees the refusal too.
    let uri = format!("amqp://app:pw@127.0.0.1:{}/other", b.amqp_addr().port());
    let e = lapin_connect(&uri, OwnedTLSConfig::default())
        .await
        .expect_err("no permissions in 'other'");
    assert!(
        e.to_string().contains("access to vhost 'other' refused"),
        "{e}"
    );
    b.shutdown().await;
}

#[tokio::test]
async fn vhost_and_user_connection_limits() {
    let mut c = base_config();
    let mut small = vhost("small");
    small.max_connections = Some(1);
    c.vhosts = vec![small];
    let mut capped = user("capped", Some("pw"));
    capped.max_connections = Some(2);
    c.users = vec![user("app", Some("pw")), capped];
    c.permissions = vec![
        full("app", "/"),
        full("app", "small"),
        full("capped", "/"),
        full("capped", "small"),
    ];
    let b = start(c).await;
    // Vhost: one connection, whoever opens it.
    let uri = |u: &str, v: &str| format!("amqp://{u}:pw@127.0.0.1:{}/{v}", b.amqp_addr().port());
    let first = lapin_connect(&uri("app", "small"), OwnedTLSConfig::default())
        .await
        .unwrap();
    assert_eq!(
        close_of(&open_as(&b, "capped", "pw", "small").await),
        (
            530,
            "NOT_ALLOWED - access to vhost 'small' refused for user 'capped': connection limit \
             (1) is reached"
                .into(),
            10,
            40
        )
    );
    // Closing the connection frees its place.
    within("close", first.close(200, "bye".into()))
        .await
        .unwrap();
    let again = within("a free place", async {
        loop {
            match lapin_connect(&uri("capped", "small"), OwnedTLSConfig::default()).await {
                Ok(c) => return c,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await;
    // User: two connections over all vhosts (one is in 'small' now).
    let _second = lapin_connect(&uri("capped", "%2f"), OwnedTLSConfig::default())
        .await
        .unwrap();
    assert_eq!(
        close_of(&open_as(&b, "capped", "pw", "/").await),
        (
            530,
            "NOT_ALLOWED - connection refused for user 'capped': user connection limit (2) is \
             reached"
                .into(),
            10,
            40
        )
    );
    // Other users are not limited by it.
    assert!(matches!(
        open_as(&b, "app", "pw", "/").await,
        Method::ConnectionOpenOk(_)
    ));
    drop(again);
    b.shutdown().await;
}

#[tokio::test]
async fn user_channel_limit_counts_channels_over_all_connections() {
    let mut c = base_config();
    let mut limited = user("limited", Some("pw"));
    limited.max_channels = Some(2);
    c.users = vec![limited];
    let b = start(c).await;
    let uri = format!("amqp://limited:pw@127.0.0.1:{}/%2f", b.amqp_addr().port());
    let one = lapin_connect(&uri, OwnedTLSConfig::default())
        .await
        .unwrap();
    let two = lapin_connect(&uri, OwnedTLSConfig::default())
        .await
        .unwrap();
    let a = within("channel", one.create_channel()).await.unwrap();
    let _b = within("channel", two.create_channel()).await.unwrap();
    // Closing one frees a place.
    within("channel.close", a.close(200, "done".into()))
        .await
        .unwrap();
    let _c = within("channel", one.create_channel()).await.unwrap();
    let e = within("channel", two.create_channel())
        .await
        .expect_err("a third channel is over the limit");
    assert!(
        e.to_string().contains(
            "number of channels opened for user 'limited' has reached the maximum allowed user \
             limit of 2"
        ),
        "{e}"
    );
    // The refusal closed that connection (530); the other is fine.
    assert!(!two.status().connected());
    let _d = within("channel", one.create_channel())
        .await
        .expect("the refused connection's channel is freed");
    b.shutdown().await;
}

#[tokio::test]
async fn configured_password_hashes_log_in() {
    use warren_broker::access::password::encode_hash;
    use warren_broker::access::{hash_password, HashingAlgorithm};
    let mut c = base_config();
    for (name, algorithm) in [
        ("sha256", HashingAlgorithm::Sha256),
        ("sha512", HashingAlgorithm::Sha512),
        ("md5", HashingAlgorithm::Md5),
    ] {
        let mut u = user(name, None);
        u.password_hash = Some(encode_hash(&hash_password(algorithm, "hashed-pw")));
        u.hashing_algorithm = Some(algorithm.module_name().into());
        c.users.push(u);
    }
    let b = start(c).await;
    for name in ["sha256", "sha512", "md5"] {
        assert!(
            matches!(
                open_as(&b, name, "hashed-pw", "/").await,
                Method::ConnectionOpenOk(_)
            ),
            "{name}"
        );
    }
    // No guest when users are configured.
    let (mut raw, _) = raw_tcp(&b).await;
    raw.start_ok("PLAIN", plain("guest", "guest"), true).await;
    match raw.next().await {
        Next::Frame(Frame::Method { method, .. }) => assert_eq!(close_of(&method).0, 403),
        _ => panic!("expected connection.close"),
    }
    b.shutdown().await;
}

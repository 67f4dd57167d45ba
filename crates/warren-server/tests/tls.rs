//! TLS handshakes against `warren_server::tls` on real local sockets: protocol versions, peer
//! verification with RabbitMQ's `verify_peer` / `fail_if_no_peer_cert` semantics, reloads that
//! keep open connections, SIGHUP, and AMQP 0-9-1 over TLS with lapin and amqprs.

mod tls_support;

use rustls::pki_types::ServerName;
use rustls::ProtocolVersion;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tls_support::certs::{client_config, self_signed_client, Ca};
use tls_support::{client_outcome, connect, der, ping, within, EchoServer, ServerFiles};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warren_server::tls::{cert_login_name, CertLoginFrom, TlsAcceptorHandle, TlsSessionInfo};

/// A CA, a server certificate it signed, and a handle serving it (peer verification per
/// `verify_peer` / `fail_if_no_peer_cert`).
fn setup(verify_peer: bool, fail_if_no_peer_cert: bool) -> (Ca, ServerFiles, TlsAcceptorHandle) {
    let ca = Ca::new("Warren test CA");
    let mut files = ServerFiles::new(&ca.server(), Some(&ca.pem()));
    files.settings.verify_peer = verify_peer;
    files.settings.fail_if_no_peer_cert = fail_if_no_peer_cert;
    let handle = TlsAcceptorHandle::new(&files.settings).expect("load TLS files");
    (ca, files, handle)
}

#[tokio::test]
async fn tls13_by_default_with_session_details() {
    let (ca, _files, handle) = setup(false, false);
    let mut server = EchoServer::start(handle).await;
    let mut client = client_outcome(server.addr, client_config(&[ca.der()], None, &[]))
        .await
        .expect("TLS connection");
    let info = server.next_outcome().await.expect("server handshake");
    assert_eq!(info.protocol, Some(ProtocolVersion::TLSv1_3));
    assert_eq!(info.protocol_name(), "tlsv1.3");
    assert!(info.cipher_suite.is_some());
    assert_eq!(info.server_name.as_deref(), Some("localhost"));
    assert!(info.peer_certificates.is_empty());
    assert_eq!(info.peer_certificate(), None);
    assert_eq!(info.alpn_protocol, None);
    ping(&mut client).await.expect("second echo");
}

#[tokio::test]
async fn tls12_client_is_served_tls12() {
    let (ca, _files, handle) = setup(false, false);
    let mut server = EchoServer::start(handle).await;
    let config = client_config(&[ca.der()], None, &[&rustls::version::TLS12]);
    client_outcome(server.addr, config)
        .await
        .expect("TLS 1.2 connection");
    let info = server.next_outcome().await.expect("server handshake");
    assert_eq!(info.protocol, Some(ProtocolVersion::TLSv1_2));
    assert_eq!(info.protocol_name(), "tlsv1.2");
}

/// A TLS 1.1 ClientHello (rustls cannot send one, so it is written out here) shaped like
/// OpenSSL's `s_client -tls1_1`: version 3.2, no supported_versions extension, CBC cipher
/// suites, ec_point_formats, supported_groups, session_ticket, encrypt_then_mac,
/// extended_master_secret; plus signature_algorithms when `sigalgs` (which TLS 1.1 clients do
/// not send, but a TLS 1.2-capable client capped at 1.1 might).
fn tls11_client_hello(sigalgs: bool) -> Vec<u8> {
    let mut ext: Vec<u8> = vec![
        0x00, 0x0b, 0x00, 0x04, 0x03, 0x00, 0x01, 0x02, // ec_point_formats
        0x00, 0x0a, 0x00, 0x0c, 0x00, 0x0a, 0x00, 0x1d, 0x00, 0x17, 0x00, 0x1e, 0x00, 0x19, 0x00,
        0x18, // supported_groups
        0x00, 0x23, 0x00, 0x00, // session_ticket
        0x00, 0x16, 0x00, 0x00, // encrypt_then_mac
        0x00, 0x17, 0x00, 0x00, // extended_master_secret
    ];
    if sigalgs {
        // ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256, rsa_pkcs1_sha256
        ext.extend([
            0x00, 0x0d, 0x00, 0x08, 0x00, 0x06, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01,
        ]);
    }
    let suites = [
        0xc0, 0x0a, 0xc0, 0x14, 0x00, 0x39, 0xc0, 0x09, 0xc0, 0x13, 0x00, 0x33, 0x00, 0x35, 0x00,
        0x2f, 0x00, 0xff,
    ];
    let mut body = vec![0x03, 0x02]; // client_version TLS 1.1
    body.extend([0x42; 32]); // random
    body.push(0); // no session id
    body.extend([0, suites.len() as u8]);
    body.extend(suites);
    body.extend([0x01, 0x00]); // compression: null
    body.extend([0, ext.len() as u8]);
    body.extend(ext);
    let mut handshake = vec![0x01, 0, 0, body.len() as u8]; // client_hello
    handshake.extend(body);
    let mut record = vec![0x16, 0x03, 0x01, 0, handshake.len() as u8]; // handshake record
    record.extend(handshake);
    record
}

/// Sends a TLS 1.1 ClientHello and returns the server's reply bytes and its accept error.
async fn tls11_attempt(sigalgs: bool) -> (Vec<u8>, io::Error) {
    let (_ca, _files, handle) = setup(false, false);
    let mut server = EchoServer::start(handle).await;
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(&tls11_client_hello(sigalgs)).await.unwrap();
    let mut reply = Vec::new();
    within("the server's alert", tcp.read_to_end(&mut reply))
        .await
        .expect("read the alert");
    (reply, server.next_outcome().await.unwrap_err())
}

#[tokio::test]
async fn tls11_is_refused_during_the_handshake() {
    // Each reply is one alert record: type 21, ..., level 2 (fatal), description. RabbitMQ
    // (Erlang's ssl, checked with OTP 25 and these same bytes) answers protocol_version (70) to
    // both hellos; rustls looks for signature_algorithms first, so OpenSSL's TLS 1.1 hello,
    // which has none, gets handshake_failure (40). Refused during the handshake either way.
    let (reply, e) = tls11_attempt(false).await;
    assert_eq!(reply.first(), Some(&21), "{reply:?}");
    assert!(reply.ends_with(&[2, 40]), "{reply:?}");
    assert!(
        e.to_string()
            .contains("SignatureAlgorithmsExtensionRequired"),
        "{e}"
    );
    // With it, the version itself is refused: protocol_version (70).
    let (reply, e) = tls11_attempt(true).await;
    assert_eq!(reply.first(), Some(&21), "{reply:?}");
    assert!(reply.ends_with(&[2, 70]), "{reply:?}");
    assert!(e.to_string().contains("Tls12NotOffered"), "{e}");
}

#[tokio::test]
async fn server_certificate_covers_ipv4_and_ipv6_loopback() {
    let (ca, _files, handle) = setup(false, false);
    let config = client_config(&[ca.der()], None, &[]);
    let mut server = EchoServer::start(handle.clone()).await;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut s = connect(server.addr, config.clone(), Some(name))
        .await
        .expect("connect by IPv4 address");
    ping(&mut s).await.unwrap();
    server.next_outcome().await.unwrap();
    // Machines without IPv6 loopback skip the second half.
    match EchoServer::start_on("[::1]:0", handle).await {
        Ok(mut v6) => {
            let name = ServerName::try_from("::1").unwrap();
            let mut s = connect(v6.addr, config, Some(name))
                .await
                .expect("connect by IPv6 address");
            ping(&mut s).await.unwrap();
            v6.next_outcome().await.unwrap();
        }
        Err(e) => eprintln!("skipping [::1]: {e}"),
    }
}

#[tokio::test]
async fn intermediates_missing_from_cert_file_are_sent_from_ca_file() {
    let root = Ca::new("Warren root CA");
    let intermediate = root.intermediate("Warren intermediate CA");
    let server_id = intermediate.server();
    let trusts_root = client_config(&[root.der()], None, &[]);
    let peer_chain_len = |s: &tokio_rustls::client::TlsStream<tokio::net::TcpStream>| {
        s.get_ref().1.peer_certificates().map_or(0, |c| c.len())
    };

    // The leaf alone, no ca_file: clients that trust only the root cannot build a path.
    let files = ServerFiles::new(&server_id, None);
    let mut server = EchoServer::start(TlsAcceptorHandle::new(&files.settings).unwrap()).await;
    let e = client_outcome(server.addr, trusts_root.clone())
        .await
        .expect_err("served without its intermediate");
    assert!(e.contains("UnknownIssuer"), "{e}");
    let _ = server.next_outcome().await;

    // The leaf alone, intermediate and root in ca_file (RabbitMQ's usual layout): the
    // intermediate is sent, the root is not.
    let bundle = format!("{}{}", root.pem(), intermediate.pem());
    let files = ServerFiles::new(&server_id, Some(&bundle));
    let mut server = EchoServer::start(TlsAcceptorHandle::new(&files.settings).unwrap()).await;
    let s = client_outcome(server.addr, trusts_root.clone())
        .await
        .expect("served with the intermediate from ca_file");
    assert_eq!(peer_chain_len(&s), 2);
    server.next_outcome().await.unwrap();

    // The whole chain in cert_file: nothing is added twice.
    let files = ServerFiles::new(&server_id, Some(&bundle));
    files.dir.write(
        "server.pem",
        format!("{}{}", server_id.cert_pem, intermediate.pem()),
    );
    let mut server = EchoServer::start(TlsAcceptorHandle::new(&files.settings).unwrap()).await;
    let s = client_outcome(server.addr, trusts_root)
        .await
        .expect("served with its own chain");
    assert_eq!(peer_chain_len(&s), 2);
    server.next_outcome().await.unwrap();
}

#[tokio::test]
async fn verify_peer_and_fail_if_no_peer_cert_require_a_ca_signed_certificate() {
    let (ca, _files, handle) = setup(true, true);
    let mut server = EchoServer::start(handle).await;

    // Signed by the CA: accepted, and the verified certificate is there for SASL EXTERNAL.
    let client = ca.client("client-1");
    client_outcome(server.addr, client_config(&[ca.der()], Some(&client), &[]))
        .await
        .expect("CA-signed client accepted");
    let info = server.next_outcome().await.expect("server handshake");
    assert_eq!(info.peer_certificate(), Some(&der(&client)));
    let cert = info.peer_certificate().unwrap();
    assert_eq!(
        cert_login_name(cert, CertLoginFrom::DistinguishedName).unwrap(),
        "CN=client-1,O=Warren tests"
    );
    assert_eq!(
        cert_login_name(cert, CertLoginFrom::CommonName).unwrap(),
        "client-1"
    );

    // No certificate: refused during the handshake.
    let refused = client_outcome(server.addr, client_config(&[ca.der()], None, &[])).await;
    assert!(refused.is_err(), "client without a certificate was served");
    let e = server.next_outcome().await.unwrap_err().to_string();
    assert!(e.contains("peer sent no certificates"), "{e}");

    // Self-signed, and signed by another CA: refused.
    let other_ca = Ca::new("Other CA");
    for bad in [self_signed_client("intruder"), other_ca.client("client-1")] {
        let refused =
            client_outcome(server.addr, client_config(&[ca.der()], Some(&bad), &[])).await;
        assert!(refused.is_err(), "untrusted client certificate was served");
        let e = server.next_outcome().await.unwrap_err().to_string();
        assert!(e.contains("invalid peer certificate: UnknownIssuer"), "{e}");
    }
}

#[tokio::test]
async fn verify_peer_alone_accepts_no_certificate_but_refuses_a_bad_one() {
    let (ca, _files, handle) = setup(true, false);
    let mut server = EchoServer::start(handle).await;

    client_outcome(server.addr, client_config(&[ca.der()], None, &[]))
        .await
        .expect("client without a certificate accepted");
    let info = server.next_outcome().await.expect("server handshake");
    assert_eq!(info.peer_certificate(), None);

    let client = ca.client("client-2");
    client_outcome(server.addr, client_config(&[ca.der()], Some(&client), &[]))
        .await
        .expect("CA-signed client accepted");
    let info = server.next_outcome().await.expect("server handshake");
    assert_eq!(info.peer_certificate(), Some(&der(&client)));

    let bad = self_signed_client("intruder");
    let refused = client_outcome(server.addr, client_config(&[ca.der()], Some(&bad), &[])).await;
    assert!(refused.is_err(), "untrusted client certificate was served");
    let e = server.next_outcome().await.unwrap_err().to_string();
    assert!(e.contains("UnknownIssuer"), "{e}");
}

#[tokio::test]
async fn without_verify_peer_no_client_certificate_is_asked_for() {
    let (ca, _files, handle) = setup(false, false);
    let mut server = EchoServer::start(handle).await;
    // Even an untrusted client certificate is never requested, so never sent.
    let bad = self_signed_client("anyone");
    client_outcome(server.addr, client_config(&[ca.der()], Some(&bad), &[]))
        .await
        .expect("connection");
    let info = server.next_outcome().await.expect("server handshake");
    assert_eq!(info.peer_certificate(), None);
}

#[tokio::test]
async fn reload_serves_new_files_to_new_handshakes_and_keeps_open_connections() {
    let (old_ca, files, handle) = setup(false, false);
    let mut server = EchoServer::start(handle.clone()).await;
    let trusts_old = client_config(&[old_ca.der()], None, &[]);
    let mut open = client_outcome(server.addr, trusts_old.clone())
        .await
        .expect("first connection");
    server.next_outcome().await.unwrap();

    // A bad file: the reload fails and the old certificate stays in use.
    files
        .dir
        .write("server.pem", "-----BEGIN CERTIFICATE-----\n");
    let e = tokio::task::spawn_blocking({
        let h = handle.clone();
        move || h.reload()
    })
    .await
    .unwrap()
    .unwrap_err();
    assert!(e.to_string().starts_with("tls.cert_file = "), "{e}");
    client_outcome(server.addr, trusts_old.clone())
        .await
        .expect("old certificate still served");
    server.next_outcome().await.unwrap();

    // New good files from another CA: new handshakes get them.
    let new_ca = Ca::new("Warren second CA");
    files.replace_server(&new_ca.server());
    tokio::task::spawn_blocking({
        let h = handle.clone();
        move || h.reload()
    })
    .await
    .unwrap()
    .expect("reload");
    client_outcome(server.addr, client_config(&[new_ca.der()], None, &[]))
        .await
        .expect("new certificate served");
    server.next_outcome().await.unwrap();
    let stale = client_outcome(server.addr, trusts_old).await;
    let e = stale.expect_err("old certificate no longer served");
    assert!(e.contains("UnknownIssuer"), "{e}");
    assert!(server.next_outcome().await.is_err());

    // The connection opened before both reloads still works.
    ping(&mut open).await.expect("open connection kept");
}

#[cfg(unix)]
#[tokio::test]
async fn sighup_reloads_certificates() {
    let (_old_ca, files, handle) = setup(false, false);
    let reloader = warren_server::tls::reload_on_sighup(vec![handle.clone()]).unwrap();
    let mut server = EchoServer::start(handle.clone()).await;
    let new_ca = Ca::new("Warren CA after SIGHUP");
    files.replace_server(&new_ca.server());
    // SAFETY: kill with our own pid only sends a signal; tokio's handler is installed.
    assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGHUP) }, 0);
    within("the reload after SIGHUP", async {
        while handle.reload_count() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    client_outcome(server.addr, client_config(&[new_ca.der()], None, &[]))
        .await
        .expect("certificate from after SIGHUP served");
    server.next_outcome().await.unwrap();
    reloader.abort();
}

#[tokio::test]
async fn handshake_timeout_ends_a_silent_client() {
    let (_ca, _files, handle) = setup(false, false);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let _silent = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (tcp, _) = listener.accept().await.unwrap();
    let e = within(
        "the handshake timeout",
        handle.accept_timeout(tcp, Duration::from_millis(200)),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
}

#[tokio::test]
async fn accepts_any_async_stream() {
    let (ca, _files, handle) = setup(true, true);
    let (client_end, server_end) = tokio::io::duplex(16 * 1024);
    let client = ca.client("in-memory");
    let config = client_config(&[ca.der()], Some(&client), &[]);
    let connector = tokio_rustls::TlsConnector::from(config);
    let (server, client_side) = within(
        "an in-memory handshake",
        futures_util::future::join(
            handle.accept(server_end),
            connector.connect(tls_support::certs::localhost(), client_end),
        ),
    )
    .await;
    let mut server = server.expect("server side");
    let mut client_side = client_side.expect("client side");
    assert_eq!(
        TlsSessionInfo::of(&server).peer_certificate(),
        Some(&der(&client))
    );
    client_side.write_all(b"over a pipe").await.unwrap();
    client_side.flush().await.unwrap();
    let mut buf = [0u8; 11];
    within("bytes through the pipe", server.read_exact(&mut buf))
        .await
        .unwrap();
    assert_eq!(&buf, b"over a pipe");
}

mod amqp {
    //! AMQP 0-9-1 over TLS: Warren's connection code on accepted TLS streams, with lapin and
    //! amqprs as clients (both on rustls with the ring provider).

    use super::*;
    use std::net::SocketAddr;
    use tokio::sync::{mpsc, watch};
    use warren_server::{Config, ServerState};

    /// Serves AMQP over TLS on a local port; each connection's TLS session goes to the channel.
    async fn amqps(
        handle: TlsAcceptorHandle,
    ) -> (
        SocketAddr,
        mpsc::UnboundedReceiver<TlsSessionInfo>,
        watch::Sender<bool>,
    ) {
        let state = Arc::new(ServerState::new(Config::default()).expect("state"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (shutdown, rx) = watch::channel(false);
        let (tx, sessions) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((tcp, peer)) = listener.accept().await {
                let (handle, state, rx, tx) =
                    (handle.clone(), state.clone(), rx.clone(), tx.clone());
                tokio::spawn(async move {
                    let local = tcp.local_addr().expect("local address");
                    if let Ok(tls) = handle.accept_timeout(tcp, tls_support::WAIT).await {
                        let _ = tx.send(TlsSessionInfo::of(&tls));
                        warren_server::connection::serve(state, tls, peer, local, rx).await;
                    }
                });
            }
        });
        (addr, sessions, shutdown)
    }

    #[tokio::test]
    async fn lapin_publishes_and_gets_over_tls() {
        use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
        use lapin::tcp::OwnedTLSConfig;
        use lapin::types::FieldTable;
        use lapin::{BasicProperties, Connection, ConnectionProperties};

        let (ca, _files, handle) = setup(false, false);
        let (addr, mut sessions, _shutdown) = amqps(handle).await;
        let uri = format!("amqps://guest:guest@127.0.0.1:{}/%2f", addr.port());
        let tls = OwnedTLSConfig {
            identity: None,
            cert_chain: Some(ca.pem()),
        };
        let conn = within(
            "lapin amqps connection",
            Connection::connect_with_config(
                &uri,
                ConnectionProperties::default(),
                tls,
                lapin::runtime::default_runtime().unwrap(),
            ),
        )
        .await
        .expect("lapin connects over TLS");
        let session = within("the TLS session", sessions.recv()).await.unwrap();
        assert_eq!(session.protocol, Some(ProtocolVersion::TLSv1_3));
        let ch = within("channel.open", conn.create_channel()).await.unwrap();
        within(
            "queue.declare",
            ch.queue_declare(
                "tls-q".into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
        .unwrap();
        within(
            "basic.publish",
            ch.basic_publish(
                "".into(),
                "tls-q".into(),
                BasicPublishOptions::default(),
                b"over TLS",
                BasicProperties::default(),
            ),
        )
        .await
        .unwrap();
        let got = within("basic.get", async {
            loop {
                let m = ch
                    .basic_get("tls-q".into(), BasicGetOptions { no_ack: true })
                    .await
                    .unwrap();
                if let Some(m) = m {
                    return m;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert_eq!(got.delivery.data, b"over TLS");
        within("connection.close", conn.close(200, "bye".into()))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn amqprs_with_a_client_certificate_over_mutual_tls() {
        use amqprs::channel::{BasicGetArguments, BasicPublishArguments, QueueDeclareArguments};
        use amqprs::connection::{Connection, OpenConnectionArguments};
        use amqprs::tls::TlsAdaptor;

        let (ca, files, handle) = setup(true, true);
        let (addr, mut sessions, _shutdown) = amqps(handle).await;
        let client = ca.client("amqprs-client");
        let cert = files.dir.write("client.pem", &client.cert_pem);
        let key = files.dir.write("client.key", &client.key_pem);
        let ca_file = files.settings.ca_file.clone().unwrap();
        let tls = TlsAdaptor::with_client_auth(Some(&ca_file), &cert, &key, "127.0.0.1".into())
            .expect("TLS adaptor");
        let mut args = OpenConnectionArguments::new("127.0.0.1", addr.port(), "guest", "guest");
        args.tls_adaptor(tls);
        let conn = within("amqprs amqps connection", Connection::open(&args))
            .await
            .expect("amqprs connects over mutual TLS");
        let session = within("the TLS session", sessions.recv()).await.unwrap();
        assert_eq!(
            cert_login_name(
                session.peer_certificate().expect("client certificate"),
                CertLoginFrom::DistinguishedName
            )
            .unwrap(),
            "CN=amqprs-client,O=Warren tests"
        );
        let ch = within("channel.open", conn.open_channel(None))
            .await
            .unwrap();
        within(
            "queue.declare",
            ch.queue_declare(QueueDeclareArguments::new("mtls-q")),
        )
        .await
        .unwrap();
        within(
            "basic.publish",
            ch.basic_publish(
                amqprs::BasicProperties::default(),
                b"mutual".to_vec(),
                BasicPublishArguments::new("", "mtls-q"),
            ),
        )
        .await
        .unwrap();
        let got = within("basic.get", async {
            loop {
                let mut get = BasicGetArguments::new("mtls-q");
                get.no_ack(true);
                if let Some((_, _, body)) = ch.basic_get(get).await.unwrap() {
                    return body;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert_eq!(got, b"mutual");
        within("connection.close", conn.close()).await.unwrap();

        // Without a certificate the same server refuses amqprs during the handshake.
        let tls = TlsAdaptor::without_client_auth(Some(&ca_file), "127.0.0.1".into()).unwrap();
        let mut args = OpenConnectionArguments::new("127.0.0.1", addr.port(), "guest", "guest");
        args.tls_adaptor(tls);
        let refused = within("a refused amqprs connection", Connection::open(&args)).await;
        assert!(
            refused.is_err(),
            "connection without a client certificate opened"
        );
    }
}

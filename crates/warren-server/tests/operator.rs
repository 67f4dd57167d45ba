//! What an operator meets, with the real `warren` binary: the data directory lock, signals
//! (SIGHUP reloads, SIGTERM stops every listener's connections with 320 and exits 0), listen
//! addresses (IPv4 and IPv6 by default, host names), configuration errors that name their
//! source, `--generate-config`, the log (file, JSON, RabbitMQ's connection lines) and the data
//! directory's format version.

mod binary_support;

use binary_support::{
    declare_durable, free_port, persistent, run_warren, tempdir, within, Server, WAIT,
};
use lapin::options::{BasicGetOptions, BasicPublishOptions};
use lapin::{Connection, ConnectionProperties};
use std::path::Path;
use std::time::{Duration, Instant};

/// Waits until `path` contains `what`; returns the file's text.
fn wait_for_log(path: &Path, what: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(what) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "log {} never said '{what}':\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// True when this machine can listen on the IPv6 loopback.
fn ipv6_loopback() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

async fn connect_uri(uri: &str) -> lapin::Result<Connection> {
    within(
        "connect",
        Connection::connect(uri, ConnectionProperties::default()),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_broker_on_the_same_data_directory_is_refused() {
    let dir = tempdir("op-lock");
    let first = Server::start(&dir, &[]);
    let port = free_port().to_string();
    let (status, _, stderr) = run_warren(
        &[
            "--amqp-listen",
            &port,
            "--data-dir",
            dir.to_str().unwrap(),
            "--log-level",
            "warn",
        ],
        &[],
    );
    assert!(!status.success(), "a second broker started");
    assert!(
        stderr.contains(&format!("data directory {} is in use", dir.display())),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("pid {}", first.pid())), "{stderr}");
    // The embedded broker is refused too.
    let err = warren_server::Broker::builder()
        .bind("127.0.0.1:0")
        .data_dir(&dir)
        .start()
        .await
        .err()
        .expect("an embedded broker started on a locked directory");
    assert!(
        err.to_string().contains("in use by another Warren process"),
        "{err}"
    );
    // The first broker still works and, once it is gone (even by SIGKILL), the directory is
    // free.
    let conn = first.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    declare_durable(&ch, "still-here").await;
    drop(conn);
    first.kill();
    let again = Server::start(&dir, &[]);
    again.kill();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_log_level_and_keeps_running() {
    let dir = tempdir("op-hup");
    let config = dir.join("warren.toml");
    std::fs::write(&config, "[log]\nlevel = \"info\"\nfile = \"warren.log\"\n").unwrap();
    let data = dir.join("data");
    let port = free_port();
    let mut server = Server::start_listening(
        &format!("127.0.0.1:{port}"),
        port,
        &data,
        &[],
        None,
        &["--config", config.to_str().unwrap()],
    );
    let log = data.join("log").join("warren.log");
    wait_for_log(&log, "Warren started");
    let conn = server.connect().await;
    // SIGHUP with a new level in the file: reloaded, not killed.
    std::fs::write(&config, "[log]\nlevel = \"debug\"\nfile = \"warren.log\"\n").unwrap();
    server.signal(libc::SIGHUP);
    wait_for_log(&log, "SIGHUP: configuration reloaded");
    assert!(server.running(), "SIGHUP killed the broker");
    let ch = within("channel", conn.create_channel()).await.unwrap();
    declare_durable(&ch, "after-hup").await;
    // Debug lines appear from now on (the connection's end is logged at debug too).
    within("close", conn.close(200, "bye".into()))
        .await
        .unwrap();
    wait_for_log(&log, "DEBUG");
    // A broken file is reported and the old configuration stays.
    std::fs::write(&config, "[log]\nlevel = 7\n").unwrap();
    server.signal(libc::SIGHUP);
    wait_for_log(&log, "configuration not reloaded");
    assert!(server.running());
    // Log rotation: the file moved away is reopened under its name.
    std::fs::rename(&log, data.join("log").join("warren.log.1")).unwrap();
    std::fs::write(&config, "[log]\nlevel = \"info\"\nfile = \"warren.log\"\n").unwrap();
    server.signal(libc::SIGHUP);
    wait_for_log(&log, "SIGHUP: configuration reloaded");
    server.signal(libc::SIGTERM);
    assert!(server.wait_exit().success());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_every_listeners_connections_and_flushes() {
    let dir = tempdir("op-term");
    let log = dir.join("warren.log");
    let data = dir.join("data");
    let port = free_port();
    // A bare port: every interface, IPv4 and IPv6.
    let mut server = Server::start_listening(&port.to_string(), port, &data, &[], Some(&log), &[]);
    let mut uris = vec![format!("amqp://guest:guest@127.0.0.1:{port}/%2f")];
    if ipv6_loopback() {
        uris.push(format!("amqp://guest:guest@[::1]:{port}/%2f"));
    } else {
        eprintln!("no IPv6 loopback on this machine: checking IPv4 only");
    }
    let mut conns = Vec::new();
    for (i, uri) in uris.iter().enumerate() {
        let conn = connect_uri(uri).await.expect("connect");
        let ch = within("channel", conn.create_channel()).await.unwrap();
        declare_durable(&ch, "term").await;
        // Persistent publishes without confirms: only the shutdown's flush makes them durable.
        for j in 0..20 {
            within(
                "publish",
                ch.basic_publish(
                    "".into(),
                    "term".into(),
                    BasicPublishOptions::default(),
                    format!("{i}-{j}").as_bytes(),
                    persistent(),
                ),
            )
            .await
            .unwrap();
        }
        // A round trip: the broker has handled the publishes.
        declare_durable(&ch, "term").await;
        conns.push(conn);
    }
    server.signal(libc::SIGTERM);
    let status = server.wait_exit();
    assert!(status.success(), "exit status {status:?}");
    for conn in &conns {
        let deadline = Instant::now() + WAIT;
        while conn.status().connected() {
            assert!(
                Instant::now() < deadline,
                "connection not closed by SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let forced = text
        .matches("broker forced connection closure with reason 'shutdown'")
        .count();
    assert_eq!(forced, uris.len(), "320 closes logged:\n{text}");
    assert!(text.contains("CONNECTION_FORCED"), "{text}");
    drop(conns);
    let server = Server::start(&data, &[]);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let mut got = 0;
    while within(
        "basic.get",
        ch.basic_get("term".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .unwrap()
    .is_some()
    {
        got += 1;
    }
    assert_eq!(got, 20 * uris.len(), "messages lost in a graceful shutdown");
    drop(conn);
    server.kill();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_listener_takes_ipv6_and_host_names() {
    if !ipv6_loopback() {
        eprintln!("skipping: this machine has no IPv6 loopback");
        return;
    }
    let dir = tempdir("op-v6");
    let port = free_port();
    let server = Server::start_listening(&port.to_string(), port, &dir, &[], None, &[]);
    for host in ["127.0.0.1", "[::1]", "localhost"] {
        let conn = connect_uri(&format!("amqp://guest:guest@{host}:{port}/%2f"))
            .await
            .unwrap_or_else(|e| panic!("{host}: {e}"));
        let ch = within("channel", conn.create_channel()).await.unwrap();
        declare_durable(&ch, "v6").await;
        within("close", conn.close(200, "bye".into()))
            .await
            .unwrap();
    }
    server.kill();
    // A host name as listen address: every address it resolves to.
    let port = free_port();
    let server = Server::start_listening(&format!("localhost:{port}"), port, &dir, &[], None, &[]);
    let conn = connect_uri(&format!("amqp://guest:guest@[::1]:{port}/%2f"))
        .await
        .expect("localhost:PORT listens on ::1 too");
    drop(conn);
    server.kill();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn configuration_errors_name_their_source() {
    let dir = tempdir("op-config");
    let data = dir.join("data");
    let data = data.to_str().unwrap();
    let port = free_port().to_string();
    let base = ["--data-dir", data, "--amqp-listen", port.as_str()];
    let case = |args: &[&str], env: &[(&str, &str)], want: &[&str]| {
        let mut all: Vec<&str> = base.to_vec();
        all.extend_from_slice(args);
        let (status, _, stderr) = run_warren(&all, env);
        assert!(!status.success(), "{args:?} {env:?} started");
        for w in want {
            assert!(
                stderr.contains(w),
                "{args:?} {env:?}: '{w}' not in: {stderr}"
            );
        }
    };
    case(
        &[],
        &[("WARREN_FOO_BAR", "1")],
        &["WARREN_FOO_BAR", "no such setting"],
    );
    case(
        &[],
        &[("WARREN_AMQP_NOPE", "1")],
        &["WARREN_AMQP_NOPE", "nope"],
    );
    case(
        &[],
        &[("WARREN_AMQP_MAX_MESSAGE_SIZE", "0")],
        &["amqp.max_message_size = 0", "WARREN_AMQP_MAX_MESSAGE_SIZE"],
    );
    let file = dir.join("bad.toml");
    std::fs::write(&file, "[storage]\nsegment_size = 10\n").unwrap();
    case(
        &["--config", file.to_str().unwrap()],
        &[],
        &["storage.segment_size = 10", file.to_str().unwrap()],
    );
    std::fs::write(&file, "[amqp]\nlisten = \"nowhere\"\n").unwrap();
    case(
        &["--config", file.to_str().unwrap()],
        &[],
        &[file.to_str().unwrap(), "line 2", "nowhere"],
    );
    case(&["--log-level", "loud"], &[], &["log.level", "--log-level"]);
    // A data directory that is a file.
    let f = dir.join("a-file");
    std::fs::write(&f, "x").unwrap();
    let (status, _, stderr) = run_warren(
        &["--data-dir", f.to_str().unwrap(), "--amqp-listen", &port],
        &[],
    );
    assert!(!status.success());
    assert!(
        stderr.contains(&format!("{} exists and is not a directory", f.display())),
        "{stderr}"
    );
    // A listen address in use is named, with the setting.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    let (status, stdout, stderr) =
        run_warren(&["--data-dir", data, "--amqp-listen", &taken_addr], &[]);
    assert!(!status.success());
    // Said once: on standard error, not again by the console log.
    assert_eq!(
        stderr.matches("cannot listen on").count(),
        1,
        "stderr: {stderr}\nstdout: {stdout}"
    );
    assert!(!stdout.contains("cannot listen on"), "stdout: {stdout}");
    assert!(
        stderr.contains(&format!(
            "cannot listen on {taken_addr} (amqp.listen = {taken_addr})"
        )),
        "{stderr}"
    );
    // The scripts' own WARREN_ variables are not configuration.
    let (status, stdout, _) = run_warren(&["--generate-config", "-"], &[("WARREN_BIN", "x")]);
    assert!(status.success());
    assert!(stdout.contains("[amqp]") && stdout.contains("disk_free_limit"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn generate_config_never_overwrites() {
    let dir = tempdir("op-generate");
    let path = dir.join("warren.toml");
    let p = path.to_str().unwrap();
    let (status, _, _) = run_warren(&["--generate-config", p], &[]);
    assert!(status.success());
    let written = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, "# mine\n").unwrap();
    let (status, _, stderr) = run_warren(&["--generate-config", p], &[]);
    assert!(!status.success());
    assert!(stderr.contains("already exists"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "# mine\n");
    let (status, stdout, _) = run_warren(&["--generate-config", "-"], &[]);
    assert!(status.success());
    assert_eq!(stdout, written);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_events_are_logged_like_rabbitmq_in_plain_and_json() {
    for format in ["plain", "json"] {
        let dir = tempdir(&format!("op-log-{format}"));
        let port = free_port();
        let server = Server::start_listening(
            &format!("127.0.0.1:{port}"),
            port,
            &dir,
            &[
                ("WARREN_LOG_FILE", "broker.log"),
                ("WARREN_LOG_FORMAT", format),
                ("WARREN_LOG_CONSOLE", "false"),
            ],
            None,
            &["--log-level", "info"],
        );
        let log = dir.join("log").join("broker.log");
        let conn = server.connect().await;
        within("close", conn.close(200, "bye".into()))
            .await
            .unwrap();
        let text = wait_for_log(&log, "closing AMQP connection (127.0.0.1:");
        let line = text
            .lines()
            .find(|l| l.contains("closing AMQP connection"))
            .unwrap();
        assert!(
            line.contains(&format!(" -> 127.0.0.1:{port}, vhost: '/', user: 'guest')")),
            "{line}"
        );
        assert!(line.contains("INFO"), "{line}");
        assert!(
            text.contains("accepting AMQP connection (127.0.0.1:"),
            "{text}"
        );
        assert!(
            text.contains("user 'guest' authenticated and granted access to vhost '/'"),
            "{text}"
        );
        if format == "json" {
            for l in text.lines().filter(|l| !l.is_empty()) {
                assert!(
                    l.starts_with('{') && l.ends_with('}') && l.contains("\"message\":"),
                    "not a JSON line: {l}"
                );
            }
        }
        server.kill();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Opens an AMQP connection with raw frames (guest/guest, vhost `/`) and returns the socket,
/// so that it can be dropped without connection.close.
fn raw_handshake(port: u16) -> std::net::TcpStream {
    use std::io::{Read, Write};
    use warren_amqp::frame::{encode_method_frame, parse_frame, Frame, Limits};
    use warren_amqp::generated::*;
    use warren_amqp::Method;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = bytes::BytesMut::new();
    let mut next = |s: &mut std::net::TcpStream| loop {
        if let Some(Frame::Method { method, .. }) = parse_frame(&mut buf, &Limits::new(0)).unwrap()
        {
            return method;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "the broker closed the handshake");
        buf.extend_from_slice(&chunk[..n]);
    };
    let send = |s: &mut std::net::TcpStream, m: Method| {
        let mut out = bytes::BytesMut::new();
        encode_method_frame(0, &m, &mut out);
        s.write_all(&out).unwrap();
    };
    s.write_all(b"AMQP\x00\x00\x09\x01").unwrap();
    assert!(matches!(next(&mut s), Method::ConnectionStart(_)));
    send(
        &mut s,
        Method::ConnectionStartOk(ConnectionStartOk {
            client_properties: Default::default(),
            mechanism: "PLAIN".into(),
            response: bytes::Bytes::from_static(b"\0guest\0guest"),
            locale: "en_US".into(),
        }),
    );
    let tune = match next(&mut s) {
        Method::ConnectionTune(t) => t,
        other => panic!("expected connection.tune, got {other:?}"),
    };
    send(
        &mut s,
        Method::ConnectionTuneOk(ConnectionTuneOk {
            channel_max: tune.channel_max,
            frame_max: tune.frame_max,
            heartbeat: 0,
        }),
    );
    send(
        &mut s,
        Method::ConnectionOpen(ConnectionOpen {
            virtual_host: "/".into(),
            ..Default::default()
        }),
    );
    assert!(matches!(next(&mut s), Method::ConnectionOpenOk(_)));
    s
}

#[test]
fn abrupt_disconnects_are_logged_with_their_reason() {
    let dir = tempdir("op-abrupt");
    let log = dir.join("warren.log");
    let server = Server::start_logging(&dir.join("data"), &[], &log);
    let s = raw_handshake(server.port);
    let local = s.local_addr().unwrap();
    drop(s);
    let text = wait_for_log(&log, "client unexpectedly closed TCP connection");
    let line = text
        .lines()
        .find(|l| l.contains("client unexpectedly closed TCP connection"))
        .unwrap();
    assert!(
        line.contains(&format!(
            "closing AMQP connection ({local} -> 127.0.0.1:{}, vhost: '/', user: 'guest')",
            server.port
        )),
        "{line}"
    );
    server.kill();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn data_directory_format_version() {
    let dir = tempdir("op-format");
    let port = free_port().to_string();
    let args = [
        "--data-dir",
        dir.to_str().unwrap(),
        "--amqp-listen",
        port.as_str(),
    ];
    std::fs::write(dir.join("format-version"), "9\n").unwrap();
    let (status, _, stderr) = run_warren(&args, &[]);
    assert!(!status.success());
    assert!(
        stderr.contains("has format version 9, newer than the versions this Warren"),
        "{stderr}"
    );
    // Files that are not Warren's: refused rather than mixed with.
    std::fs::remove_file(dir.join("format-version")).unwrap();
    std::fs::write(dir.join("thesis.tex"), "x").unwrap();
    let (status, _, stderr) = run_warren(&args, &[]);
    assert!(!status.success());
    assert!(stderr.contains("not a Warren data directory"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

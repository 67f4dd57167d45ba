//! Security settings of the `warren` binary: the AMQPS flags and a certificate reload on SIGHUP
//! that keeps open connections, `--load-definitions` with a file exported from RabbitMQ 3.10.8
//! (its users log in with their RabbitMQ passwords; loading it again at the next start changes
//! nothing), `--hash-password`, and starts refused for unusable TLS or definitions files.

mod binary_support;
mod tls_support;

use binary_support::{free_port, run_warren, tempdir, Server};
use lapin::options::QueueDeclareOptions;
use lapin::tcp::OwnedTLSConfig;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tls_support::certs::{Ca, TempDir};
use tls_support::within;
use warren_broker::access::{HashingAlgorithm, PasswordHash};

const RABBITMQ_3_10_8: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../warren-broker/tests/fixtures/definitions-rabbitmq-3.10.8.json"
);

async fn connect(uri: &str, tls: OwnedTLSConfig) -> lapin::Result<Connection> {
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

fn trusting(ca: &Ca) -> OwnedTLSConfig {
    OwnedTLSConfig {
        identity: None,
        cert_chain: Some(ca.pem()),
    }
}

async fn declare(conn: &Connection, queue: &str, passive: bool) -> lapin::Result<()> {
    let ch = within("channel.open", conn.create_channel()).await?;
    let opts = QueueDeclareOptions {
        passive,
        ..Default::default()
    };
    within(
        "queue.declare",
        ch.queue_declare(queue.into(), opts, FieldTable::default()),
    )
    .await
    .map(|_| ())
}

fn wait_for_log(log: &Path, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "'{needle}' not in the log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn write_server(dir: &TempDir, ca: &Ca) -> (PathBuf, PathBuf) {
    let server = ca.server();
    (
        dir.write("server.pem", &server.cert_pem),
        dir.write("server.key", &server.key_pem),
    )
}

#[tokio::test]
async fn sighup_reloads_the_amqps_certificate_and_keeps_open_connections() {
    let files = TempDir::new("warren-sighup-tls");
    let old_ca = Ca::new("Old CA");
    let (cert, key) = write_server(&files, &old_ca);
    let tls_port = free_port();
    let data = tempdir("sighup-tls");
    let log = data.with_extension("log");
    let port = free_port();
    let tls_listen = format!("127.0.0.1:{tls_port}");
    let server = Server::start_listening(
        &format!("127.0.0.1:{port}"),
        port,
        &data,
        &[],
        Some(&log),
        &[
            "--tls-listen",
            &tls_listen,
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
        ],
    );
    wait_for_log(&log, "started TLS (AMQPS) listener");
    let uri = format!("amqps://guest:guest@127.0.0.1:{tls_port}/%2f");
    let open = connect(&uri, trusting(&old_ca))
        .await
        .expect("AMQPS with the first certificate");
    declare(&open, "before-reload", false).await.unwrap();

    // New files, then SIGHUP: new connections get the new certificate.
    let new_ca = Ca::new("New CA");
    assert!(connect(&uri, trusting(&new_ca)).await.is_err());
    write_server(&files, &new_ca);
    server.signal(libc::SIGHUP);
    wait_for_log(&log, "TLS certificates and keys reloaded");
    let fresh = connect(&uri, trusting(&new_ca))
        .await
        .expect("AMQPS with the reloaded certificate");
    declare(&fresh, "after-reload", false).await.unwrap();
    assert!(connect(&uri, trusting(&old_ca)).await.is_err());
    // The connection made before the reload is still open and working.
    declare(&open, "before-reload", true)
        .await
        .expect("the old connection survives the reload");

    // A bad key file on the next SIGHUP: the certificates in use stay.
    files.write("server.key", "not a key");
    server.signal(libc::SIGHUP);
    wait_for_log(&log, "TLS reload failed");
    let still = connect(&uri, trusting(&new_ca))
        .await
        .expect("the previous certificate stays after a failed reload");
    declare(&still, "after-reload", true).await.unwrap();
    drop((open, fresh, still));
    server.terminate();
    let _ = std::fs::remove_dir_all(&data);
    let _ = std::fs::remove_file(&log);
}

#[tokio::test]
async fn definitions_exported_from_rabbitmq_load_at_start_and_again() {
    let data = tempdir("definitions-load");
    let port = free_port();
    let start = |env: &[(&str, &str)], extra: &[&str]| {
        Server::start_listening(&format!("127.0.0.1:{port}"), port, &data, env, None, extra)
    };
    let uri = |user: &str, pass: &str, vhost: &str| {
        format!("amqp://{user}:{pass}@127.0.0.1:{port}/{vhost}")
    };
    let server = start(&[], &["--load-definitions", RABBITMQ_3_10_8]);
    // `app` logs in with the password it had in RabbitMQ, to the vhosts it has permissions in;
    // the file's exchanges and queues are there.
    let app = connect(
        &uri("app", "app-Secret-1", "staging"),
        OwnedTLSConfig::default(),
    )
    .await
    .expect("app logs in with its RabbitMQ password");
    for q in ["app.orders", "app.audit", "app.lazy"] {
        declare(&app, q, true).await.expect(q);
    }
    assert!(
        connect(&uri("app", "wrong", "staging"), OwnedTLSConfig::default())
            .await
            .is_err()
    );
    // guest's password in that file is guest; the passwordless user cannot log in.
    let guest = connect(&uri("guest", "guest", "%2f"), OwnedTLSConfig::default())
        .await
        .expect("guest from the file");
    declare(&guest, "root.q", true).await.expect("root.q");
    assert!(
        connect(&uri("nopass", "", "%2f"), OwnedTLSConfig::default())
            .await
            .is_err()
    );
    // A queue made since stays; importing again at the next start changes nothing.
    declare(&guest, "made-later", false).await.unwrap();
    drop((app, guest));
    server.terminate();

    let server = start(&[("WARREN_DEFINITIONS_LOAD_FILE", RABBITMQ_3_10_8)], &[]);
    let app = connect(
        &uri("app", "app-Secret-1", "staging"),
        OwnedTLSConfig::default(),
    )
    .await
    .expect("app logs in after the second import");
    declare(&app, "app.orders", true).await.unwrap();
    let guest = connect(&uri("guest", "guest", "%2f"), OwnedTLSConfig::default())
        .await
        .unwrap();
    declare(&guest, "root.q", true).await.unwrap();
    drop((app, guest));
    server.terminate();
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn hash_password_prints_a_rabbitmq_sha256_hash() {
    let (status, out, err) = run_warren(&["--hash-password", "s3cret-pw"], &[]);
    assert!(status.success(), "{err}");
    let hash = out.trim();
    let parsed = PasswordHash::from_base64(HashingAlgorithm::Sha256, hash).unwrap();
    assert_eq!(parsed.bytes.len(), 4 + 32, "salt and SHA-256 digest");
    assert!(parsed.verify("s3cret-pw"));
    assert!(!parsed.verify("other"));
    // From standard input.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_warren"))
        .arg("--hash-password")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from-stdin\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let hash = String::from_utf8(out.stdout).unwrap();
    let parsed = PasswordHash::from_base64(HashingAlgorithm::Sha256, hash.trim()).unwrap();
    assert!(parsed.verify("from-stdin"));
}

#[tokio::test]
async fn a_hash_from_hash_password_logs_in_from_the_config_file() {
    let (_, out, _) = run_warren(&["--hash-password", "cfg-pw"], &[]);
    let dir = tempdir("hash-config");
    let config = dir.join("warren.toml");
    std::fs::write(
        &config,
        format!(
            "[[users]]\nname = \"ops\"\npassword_hash = \"{}\"\ntags = [\"administrator\"]\n\n\
             [[users]]\nname = \"dev\"\npassword = \"plain-pw\"\n",
            out.trim()
        ),
    )
    .unwrap();
    let port = free_port();
    let data = dir.join("data");
    let log = dir.join("warren.log");
    let server = Server::start_listening(
        &format!("127.0.0.1:{port}"),
        port,
        &data,
        &[],
        Some(&log),
        &["--config", config.to_str().unwrap(), "--log-level", "debug"],
    );
    for (user, pass) in [("ops", "cfg-pw"), ("dev", "plain-pw")] {
        let conn = connect(
            &format!("amqp://{user}:{pass}@127.0.0.1:{port}/%2f"),
            OwnedTLSConfig::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("{user}: {e}"));
        declare(&conn, user, false).await.unwrap();
    }
    assert!(connect(
        &format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
        OwnedTLSConfig::default()
    )
    .await
    .is_err());
    server.terminate();
    // The plain password never reaches the log, even at debug level.
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("login refused"), "{logged}");
    assert!(!logged.contains("plain-pw"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unusable_tls_or_definitions_files_stop_the_start() {
    let dir = tempdir("security-bad-start");
    let port = free_port().to_string();
    let data = dir.join("data");
    let base = ["--amqp-listen", &port, "--data-dir", data.to_str().unwrap()];
    let missing = dir.join("missing.pem");
    let (status, _, err) = run_warren(
        &[
            &base[..],
            &[
                "--tls-cert-file",
                missing.to_str().unwrap(),
                "--tls-key-file",
                missing.to_str().unwrap(),
            ],
        ]
        .concat(),
        &[],
    );
    assert!(!status.success());
    assert!(
        err.contains("tls.cert_file") && err.contains("missing.pem"),
        "{err}"
    );
    // Only a key: refused by validation, naming the flag.
    let (status, _, err) = run_warren(
        &[&base[..], &["--tls-key-file", missing.to_str().unwrap()]].concat(),
        &[],
    );
    assert!(!status.success());
    assert!(
        err.contains("tls.key_file is set but tls.cert_file is not"),
        "{err}"
    );

    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        r#"{"users": [{"name": "x", "password_hash": "!!", "tags": []}]}"#,
    )
    .unwrap();
    let (status, _, err) = run_warren(
        &[&base[..], &["--load-definitions", bad.to_str().unwrap()]].concat(),
        &[],
    );
    assert!(!status.success());
    assert!(err.contains("bad.json"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

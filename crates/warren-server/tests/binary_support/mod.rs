//! Helpers for tests that run the real `warren` binary: start it on a free port with a data
//! directory, connect with lapin, kill it with SIGKILL, read its memory use.

#![allow(dead_code)]

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const WAIT: Duration = Duration::from_secs(20);

pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// A `warren` process on a free port with a given data directory and extra environment.
pub struct Server {
    child: Child,
    pub port: u16,
}

impl Server {
    pub fn start(data: &Path, env: &[(&str, &str)]) -> Server {
        Self::spawn(data, env, None)
    }

    /// Like [`Server::start`], with the broker's log (level info) written to `log`.
    pub fn start_logging(data: &Path, env: &[(&str, &str)], log: &Path) -> Server {
        Self::spawn(data, env, Some(log))
    }

    fn spawn(data: &Path, env: &[(&str, &str)], log: Option<&Path>) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_warren"));
        cmd.arg("--amqp-listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--data-dir")
            .arg(data)
            .arg("--log-level")
            .arg(if log.is_some() { "info" } else { "warn" })
            .stderr(Stdio::inherit());
        match log {
            Some(path) => cmd.stdout(std::fs::File::create(path).expect("log file")),
            None => cmd.stdout(Stdio::null()),
        };
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("warren binary starts");
        let deadline = Instant::now() + WAIT;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "warren did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, port }
    }

    pub fn kill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }

    /// Stops the broker with SIGTERM (a clean shutdown: the store's last writes are fsynced)
    /// and waits for it to exit.
    pub fn terminate(mut self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("kill -TERM");
        assert!(status.success(), "kill -TERM failed");
        self.child.wait().expect("reaped");
    }

    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap()
    }

    pub async fn connect(&self) -> Connection {
        within(
            "connect",
            Connection::connect(
                &format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port),
                ConnectionProperties::default(),
            ),
        )
        .await
        .expect("connect")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-durability-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn persistent() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(2)
}

pub async fn declare_durable(ch: &Channel, queue: &str) {
    within(
        "queue.declare",
        ch.queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .expect("queue.declare");
}

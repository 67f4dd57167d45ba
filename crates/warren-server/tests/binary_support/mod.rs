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

/// A free TCP port on 127.0.0.1 (and, in practice, on [::1]), below the kernel's ephemeral
/// range (32768 and up on Linux), so that the outgoing connections of the tests running
/// meanwhile cannot take it before the broker binds it: each call takes the next port of a
/// sequence that starts at a place drawn from the process id, skipping ports in use.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id().wrapping_mul(7919)) % SPAN,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..SPAN {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `warren` binary with `args` and `env`, its output captured: (exit status, stdout,
/// stderr). For starts that must fail.
pub fn run_warren(
    args: &[&str],
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warren"));
    cmd.args(args);
    // Tests run side by side: the management API must not take the fixed port 15672.
    if !args.contains(&"--management-listen") {
        cmd.args(["--management-listen", "127.0.0.1:0"]);
    }
    // Nor the HTTP queue API the fixed port 1218.
    if !args.contains(&"--httpmq-listen") {
        cmd.args(["--httpmq-listen", "127.0.0.1:0"]);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("warren runs");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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
        let port = free_port();
        Self::spawn_on(&format!("127.0.0.1:{port}"), port, data, env, log, &[])
    }

    /// Starts `warren --amqp-listen <listen>` (which must listen on 127.0.0.1:`port`) with
    /// `extra` arguments (with `--log-level` or `--config` among them, the log level is
    /// theirs).
    pub fn start_listening(
        listen: &str,
        port: u16,
        data: &Path,
        env: &[(&str, &str)],
        log: Option<&Path>,
        extra: &[&str],
    ) -> Server {
        Self::spawn_on(listen, port, data, env, log, extra)
    }

    fn spawn_on(
        listen: &str,
        port: u16,
        data: &Path,
        env: &[(&str, &str)],
        log: Option<&Path>,
        extra: &[&str],
    ) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_warren"));
        cmd.args(extra);
        if !extra.contains(&"--management-listen") {
            cmd.args(["--management-listen", "127.0.0.1:0"]);
        }
        if !extra.contains(&"--httpmq-listen") {
            cmd.args(["--httpmq-listen", "127.0.0.1:0"]);
        }
        cmd.arg("--amqp-listen")
            .arg(listen)
            .arg("--data-dir")
            .arg(data)
            .stderr(Stdio::inherit());
        // The broker refuses unknown WARREN_* variables: the child gets only the ones the test
        // gives it, not the test's own knobs (WARREN_TEST_*) or the caller's settings.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("WARREN_") {
                cmd.env_remove(&k);
            }
        }
        // The level comes from `extra` (a flag or a configuration file) when it says so.
        if !extra
            .iter()
            .any(|a| *a == "--log-level" || *a == "--config")
        {
            cmd.arg("--log-level")
                .arg(if log.is_some() { "info" } else { "warn" });
        }
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

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (e.g. `libc::SIGHUP`).
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        let r = unsafe { libc::kill(self.child.id() as i32, signal) };
        assert_eq!(r, 0, "kill({signal})");
    }

    /// The exit status, once the process exits (within [`WAIT`]).
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "warren did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
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

/// Publishes `body` to `queue` through the default exchange and asserts that it is confirmed
/// (`ch` is in confirm mode): a persistent message is then on disk.
pub async fn publish_and_confirm(ch: &Channel, queue: &str, body: &[u8], props: BasicProperties) {
    let pc = within(
        "basic.publish",
        ch.basic_publish(
            "".into(),
            queue.into(),
            lapin::options::BasicPublishOptions::default(),
            body,
            props,
        ),
    )
    .await
    .expect("basic.publish");
    assert!(within("confirm", pc).await.expect("confirm").is_ack());
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

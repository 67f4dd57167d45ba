//! Crash consistency of durable definitions and messages with the real `warren` binary.
//!
//! One script of topology changes and confirmed publishes is run step by step. For every step:
//! - the broker is killed (SIGKILL) right after the step was acknowledged, and
//! - the step is run with the definitions directory read-only (a read-only bind mount as
//!   root, `chmod` otherwise), then the broker is killed;
//!
//! and after a restart, everything the broker acknowledged (declare-ok, bind-ok, delete-ok,
//! a publisher confirm) must be there, and everything it refused must not.

mod binary_support;

use binary_support::{persistent, tempdir, within, Server};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, ExchangeKind};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug, Clone, Copy)]
enum Step {
    DeclareExchange,
    DeclareQueue(&'static str),
    Bind(&'static str),
    Publish(&'static str),
    Unbind(&'static str),
    DeleteQueue(&'static str),
    DeleteExchange,
}

const EXCHANGE: &str = "cc-x";
const QUEUES: [&str; 2] = ["cc-q1", "cc-q2"];

const SCRIPT: &[Step] = &[
    Step::DeclareExchange,
    Step::DeclareQueue("cc-q1"),
    Step::Bind("cc-q1"),
    Step::Publish("m1"),
    Step::DeclareQueue("cc-q2"),
    Step::Bind("cc-q2"),
    Step::Publish("m2"),
    Step::Unbind("cc-q1"),
    Step::Publish("m3"),
    Step::DeleteQueue("cc-q2"),
    Step::DeleteExchange,
];

/// What the broker acknowledged.
#[derive(Debug, Default, Clone, PartialEq)]
struct Model {
    exchange: bool,
    queues: BTreeMap<&'static str, Vec<String>>,
    bindings: BTreeSet<&'static str>,
}

impl Model {
    fn apply(&mut self, step: Step) {
        match step {
            Step::DeclareExchange => self.exchange = true,
            Step::DeclareQueue(q) => {
                self.queues.entry(q).or_default();
            }
            Step::Bind(q) => {
                self.bindings.insert(q);
            }
            Step::Publish(body) => {
                for q in &self.bindings {
                    self.queues.get_mut(q).unwrap().push(body.to_string());
                }
            }
            Step::Unbind(q) => {
                self.bindings.remove(q);
            }
            Step::DeleteQueue(q) => {
                self.queues.remove(q);
                self.bindings.remove(q);
            }
            Step::DeleteExchange => {
                self.exchange = false;
                self.bindings.clear();
            }
        }
    }
}

/// Runs `step` on a fresh connection; `Err(code)` when the broker refused it.
async fn run(server: &Server, step: Step) -> Result<(), u16> {
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let none = FieldTable::default;
    let r: lapin::Result<()> = match step {
        Step::DeclareExchange => {
            within(
                "exchange.declare",
                ch.exchange_declare(
                    EXCHANGE.into(),
                    ExchangeKind::Fanout,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    none(),
                ),
            )
            .await
        }
        Step::DeclareQueue(q) => {
            within("queue.declare", ch.queue_declare(q.into(), durable, none()))
                .await
                .map(|_| ())
        }
        Step::Bind(q) => {
            within(
                "queue.bind",
                ch.queue_bind(
                    q.into(),
                    EXCHANGE.into(),
                    "".into(),
                    QueueBindOptions::default(),
                    none(),
                ),
            )
            .await
        }
        Step::Unbind(q) => {
            within(
                "queue.unbind",
                ch.queue_unbind(q.into(), EXCHANGE.into(), "".into(), none()),
            )
            .await
        }
        Step::DeleteQueue(q) => within(
            "queue.delete",
            ch.queue_delete(q.into(), QueueDeleteOptions::default()),
        )
        .await
        .map(|_| ()),
        Step::DeleteExchange => {
            within(
                "exchange.delete",
                ch.exchange_delete(EXCHANGE.into(), ExchangeDeleteOptions::default()),
            )
            .await
        }
        Step::Publish(body) => {
            within(
                "confirm.select",
                ch.confirm_select(ConfirmSelectOptions::default()),
            )
            .await
            .unwrap();
            let confirm = within(
                "basic.publish",
                ch.basic_publish(
                    EXCHANGE.into(),
                    "".into(),
                    BasicPublishOptions::default(),
                    body.as_bytes(),
                    persistent(),
                ),
            )
            .await
            .unwrap();
            let c = within("confirm", confirm).await.unwrap();
            assert!(c.is_ack(), "{body} nacked");
            Ok(())
        }
    };
    let r = r.map_err(|e| match e.kind() {
        lapin::ErrorKind::ProtocolError(p) => p.get_id(),
        other => panic!("{step:?}: {other:?}"),
    });
    if r.is_ok() {
        let _ = within("close", conn.close(200, "bye".into())).await;
    }
    r
}

/// Checks that the restarted broker holds exactly `model`.
async fn verify(server: &Server, model: &Model, context: &str) {
    let conn = server.connect().await;
    let passive_q = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    for q in QUEUES {
        let ch = within("channel", conn.create_channel()).await.unwrap();
        let exists = within(
            "passive queue.declare",
            ch.queue_declare(q.into(), passive_q, FieldTable::default()),
        )
        .await
        .is_ok();
        assert_eq!(exists, model.queues.contains_key(q), "{context}: queue {q}");
    }
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let exists = within(
        "passive exchange.declare",
        ch.exchange_declare(
            EXCHANGE.into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .is_ok();
    assert_eq!(exists, model.exchange, "{context}: exchange");
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let get = |q: &'static str| {
        let ch = ch.clone();
        async move {
            within(
                "basic.get",
                ch.basic_get(q.into(), BasicGetOptions { no_ack: true }),
            )
            .await
            .unwrap()
            .map(|m| String::from_utf8(m.delivery.data).unwrap())
        }
    };
    for (q, want) in &model.queues {
        let mut got = Vec::new();
        while let Some(body) = get(q).await {
            got.push(body);
        }
        assert_eq!(&got, want, "{context}: messages of {q}");
    }
    if model.exchange {
        // Bindings: a probe reaches exactly the bound queues.
        within(
            "probe",
            ch.basic_publish(
                EXCHANGE.into(),
                "".into(),
                BasicPublishOptions::default(),
                b"probe",
                BasicProperties::default(),
            ),
        )
        .await
        .unwrap();
        for q in model.queues.keys() {
            let got = get(q).await;
            assert_eq!(
                got.is_some(),
                model.bindings.contains(q),
                "{context}: binding of {q}"
            );
        }
    }
    let _ = within("close", conn.close(200, "bye".into())).await;
}

/// The definitions directory made read-only, until [`ReadOnly::restore`].
struct ReadOnly {
    dir: PathBuf,
    mounted: bool,
}

impl ReadOnly {
    /// As root a read-only bind mount (root ignores permissions); otherwise `chmod 0555`.
    /// `None` when neither works here.
    fn make(dir: &Path) -> Option<ReadOnly> {
        std::fs::create_dir_all(dir).unwrap();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let ok = |c: &mut Command| c.status().map(|s| s.success()).unwrap_or(false);
            if !ok(Command::new("mount").arg("--bind").arg(dir).arg(dir)) {
                return None;
            }
            if !ok(Command::new("mount")
                .args(["-o", "remount,bind,ro"])
                .arg(dir))
            {
                let _ = Command::new("umount").arg(dir).status();
                return None;
            }
            Some(ReadOnly {
                dir: dir.to_path_buf(),
                mounted: true,
            })
        } else {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).ok()?;
            Some(ReadOnly {
                dir: dir.to_path_buf(),
                mounted: false,
            })
        }
    }

    fn restore(mut self) {
        self.undo();
    }

    fn undo(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.dir).status();
            self.mounted = false;
        } else {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o755));
        }
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        self.undo();
    }
}

/// SIGKILL right after each step was acknowledged: after a restart the step is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_step_survives_sigkill() {
    for k in 0..SCRIPT.len() {
        let dir = tempdir(&format!("cc-kill-{k}"));
        let server = Server::start(&dir, &[]);
        let mut model = Model::default();
        for &step in &SCRIPT[..=k] {
            run(&server, step)
                .await
                .unwrap_or_else(|code| panic!("{step:?} refused with {code}"));
            model.apply(step);
        }
        server.kill();
        let server = Server::start(&dir, &[]);
        verify(
            &server,
            &model,
            &format!("killed after {:?} (step {k})", SCRIPT[k]),
        )
        .await;
        server.kill();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Each step with the definitions read-only, then SIGKILL: a change that needs them is
/// refused with 541 INTERNAL_ERROR and is not there after a restart; a publish is confirmed
/// and is there; nothing acknowledged before is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_steps_leave_no_trace_and_lose_nothing() {
    for k in 0..SCRIPT.len() {
        let dir = tempdir(&format!("cc-ro-{k}"));
        let server = Server::start(&dir, &[]);
        let mut model = Model::default();
        for &step in &SCRIPT[..k] {
            run(&server, step).await.unwrap();
            model.apply(step);
        }
        let Some(read_only) = ReadOnly::make(&dir.join("definitions")) else {
            eprintln!("skipping: cannot make a directory read-only here (mount or chmod failed)");
            server.kill();
            return;
        };
        let step = SCRIPT[k];
        match run(&server, step).await {
            Ok(()) => {
                assert!(
                    matches!(step, Step::Publish(_)),
                    "{step:?} acknowledged although its definition could not be stored"
                );
                model.apply(step);
            }
            Err(code) => {
                assert_eq!(code, 541, "{step:?}");
                assert!(!matches!(step, Step::Publish(_)));
            }
        }
        server.kill();
        read_only.restore();
        let server = Server::start(&dir, &[]);
        verify(
            &server,
            &model,
            &format!("{:?} (step {k}) with read-only definitions", SCRIPT[k]),
        )
        .await;
        server.kill();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The definitions come back while the broker runs: refused changes can be made again, and
/// they stick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_declare_succeeds_once_the_disk_is_writable() {
    let dir = tempdir("cc-retry");
    let server = Server::start(&dir, &[]);
    let Some(read_only) = ReadOnly::make(&dir.join("definitions")) else {
        eprintln!("skipping: cannot make a directory read-only here (mount or chmod failed)");
        server.kill();
        return;
    };
    assert_eq!(run(&server, Step::DeclareQueue("cc-q1")).await, Err(541));
    read_only.restore();
    run(&server, Step::DeclareQueue("cc-q1")).await.unwrap();
    server.kill();
    let server = Server::start(&dir, &[]);
    let mut model = Model::default();
    model.apply(Step::DeclareQueue("cc-q1"));
    verify(&server, &model, "declared after the disk came back").await;
    server.kill();
    std::fs::remove_dir_all(&dir).unwrap();
}

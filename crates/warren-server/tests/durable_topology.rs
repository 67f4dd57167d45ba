//! Durable topology changes through a real client: pipelined durable declares on one channel
//! are all answered (sharing fsyncs) and survive a restart; a change that cannot be stored
//! closes the connection with 541 INTERNAL_ERROR, its reply never sent and the change rolled
//! back.

mod lapin_support;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use lapin_support::{within, WAIT};
use std::path::{Path, PathBuf};
use warren_server::RunningBroker;

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "warren-durable-topology-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    d
}

async fn start(dir: &Path) -> RunningBroker {
    within(
        "broker start",
        warren_server::Broker::builder()
            .data_dir(dir)
            .bind("127.0.0.1:0")
            .start(),
    )
    .await
    .expect("broker starts")
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

fn passive() -> QueueDeclareOptions {
    QueueDeclareOptions {
        passive: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn pipelined_durable_declares_are_answered_and_survive_a_restart() {
    let dir = tempdir("pipelined");
    let broker = start(&dir).await;
    let conn = lapin_support::connect(&broker).await;
    let ch = within("channel.open", conn.create_channel())
        .await
        .expect("channel.open");
    let declares = (0..2_000).map(|i| {
        ch.queue_declare(
            format!("pipelined-{i:04}").as_str().into(),
            durable(),
            FieldTable::default(),
        )
    });
    let answered = tokio::time::timeout(WAIT * 6, futures_util::future::join_all(declares))
        .await
        .expect("every declare answered");
    for (i, r) in answered.into_iter().enumerate() {
        assert_eq!(
            r.expect("declare-ok").name().as_str(),
            format!("pipelined-{i:04}")
        );
    }
    let _ = conn.close(200, "bye".into()).await;
    within("shutdown", broker.shutdown()).await;

    let broker = start(&dir).await;
    let conn = lapin_support::connect(&broker).await;
    let ch = within("channel.open", conn.create_channel())
        .await
        .expect("channel.open");
    for i in [0, 1, 999, 1_999] {
        within(
            "passive declare",
            ch.queue_declare(
                format!("pipelined-{i:04}").as_str().into(),
                passive(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("the queue came back");
    }
    assert_eq!(
        broker
            .state()
            .broker
            .vhost("/")
            .expect("vhost /")
            .queue_count(),
        2_000
    );
    let _ = conn.close(200, "bye".into()).await;
    within("shutdown", broker.shutdown()).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_declare_that_cannot_be_stored_closes_the_connection_with_541() {
    let dir = tempdir("refused");
    let broker = start(&dir).await;
    let conn = lapin_support::connect(&broker).await;
    let ch = within("channel.open", conn.create_channel())
        .await
        .expect("channel.open");
    within(
        "declare",
        ch.queue_declare("kept".into(), durable(), FieldTable::default()),
    )
    .await
    .expect("declare-ok");

    // Writes of definitions fail: `definitions` becomes a file.
    let defs = dir.join("definitions");
    std::fs::remove_dir_all(&defs).unwrap();
    std::fs::write(&defs, b"not a directory").unwrap();
    let err = within(
        "refused declare",
        ch.queue_declare("new".into(), durable(), FieldTable::default()),
    )
    .await
    .expect_err("refused");
    match err.kind() {
        lapin::ErrorKind::ProtocolError(e) => {
            assert_eq!(e.get_id(), 541, "{e:?}");
            assert!(
                e.get_message().as_str().starts_with(
                    "INTERNAL_ERROR - failed to declare queue 'new' in vhost '/' because the \
                     definitions could not be stored"
                ),
                "{e:?}"
            );
        }
        other => panic!("expected a connection.close, got {other:?}"),
    }
    std::fs::remove_file(&defs).unwrap();

    let conn = Connection::connect(
        &lapin_support::uri(&broker),
        ConnectionProperties::default(),
    )
    .await
    .expect("connect");
    let ch = within("channel.open", conn.create_channel())
        .await
        .expect("channel.open");
    lapin_support::expect_code(
        within(
            "passive declare",
            ch.queue_declare("new".into(), passive(), FieldTable::default()),
        )
        .await,
        404,
    );
    let ch = within("channel.open", conn.create_channel())
        .await
        .expect("channel.open");
    within(
        "declare",
        ch.queue_declare("later".into(), durable(), FieldTable::default()),
    )
    .await
    .expect("declare-ok once definitions can be stored again");
    let _ = conn.close(200, "bye".into()).await;
    within("shutdown", broker.shutdown()).await;

    let broker = start(&dir).await;
    let mut names: Vec<String> = broker
        .state()
        .broker
        .vhost("/")
        .expect("vhost /")
        .queues()
        .iter()
        .map(|q| q.name().to_string())
        .collect();
    names.sort();
    assert_eq!(names, vec!["kept", "later"]);
    within("shutdown", broker.shutdown()).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

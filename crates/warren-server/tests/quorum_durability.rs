//! Quorum queues survive `kill -9` of the real `warren` binary: every confirmed message is
//! there after a restart, acknowledged ones are not, and the ones that were delivered and not
//! acknowledged come back redelivered with `x-delivery-count` raised.

mod binary_support;

use binary_support::{persistent, tempdir, within, Server};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use std::time::Duration;

fn quorum_args() -> FieldTable {
    let mut t = FieldTable::default();
    t.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    t
}

async fn declare(ch: &lapin::Channel) {
    within(
        "queue.declare",
        ch.queue_declare(
            "qd".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            quorum_args(),
        ),
    )
    .await
    .expect("quorum queue declared");
}

#[tokio::test]
async fn confirmed_messages_survive_kill_9() {
    let data = tempdir("quorum-kill9");
    let server = Server::start(&data, &[]);
    let conn = server.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    declare(&ch).await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    let mut confirms = Vec::new();
    for i in 0..200 {
        let pc = ch
            .basic_publish(
                "".into(),
                "qd".into(),
                BasicPublishOptions::default(),
                format!("m{i}").as_bytes(),
                persistent(),
            )
            .await
            .expect("publish");
        confirms.push(pc);
    }
    for pc in confirms {
        assert!(within("confirm", pc).await.expect("confirm").is_ack());
    }
    // Consume 60: ack the first 50, leave 10 unacknowledged.
    let cch = conn.create_channel().await.expect("channel");
    cch.basic_qos(60, BasicQosOptions::default())
        .await
        .expect("qos");
    let mut consumer = cch
        .basic_consume(
            "qd".into(),
            "c".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    for i in 0..60 {
        let d = within("delivery", consumer.next())
            .await
            .expect("stream")
            .expect("delivery");
        assert_eq!(d.data, format!("m{i}").as_bytes());
        if i < 50 {
            d.acker.ack(BasicAckOptions::default()).await.expect("ack");
        }
    }
    // Acks are commands too; let them commit before the kill.
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.kill();
    if std::env::var("QD_DEBUG").is_ok() {
        let _ = std::process::Command::new("cp")
            .args(["-r", data.to_str().unwrap(), "/tmp/qd-copy"])
            .status();
    }

    let server = Server::start(&data, &[]);
    let conn = server.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    declare(&ch).await;
    let mut consumer = ch
        .basic_consume(
            "qd".into(),
            "after".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("consume");
    for i in 50..200 {
        let d = within("delivery after restart", consumer.next())
            .await
            .expect("stream")
            .expect("delivery");
        if std::env::var("QD_DEBUG").is_ok() {
            eprintln!(
                "{} {} {:?}",
                String::from_utf8_lossy(&d.data),
                d.redelivered,
                d.properties.headers()
            );
            d.acker.ack(BasicAckOptions::default()).await.expect("ack");
            continue;
        }
        assert_eq!(d.data, format!("m{i}").as_bytes(), "in order after restart");
        let count = d
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-delivery-count").cloned());
        // The consumer had m0..m59, then one more for each of its 50 acks.
        if i < 110 {
            assert!(d.redelivered, "m{i} was delivered before the kill");
            assert_eq!(count, Some(AMQPValue::LongLongInt(1)), "m{i}");
        } else {
            assert_eq!(count, None, "m{i} was never returned");
        }
        d.acker.ack(BasicAckOptions::default()).await.expect("ack");
    }
    let extra = tokio::time::timeout(Duration::from_millis(300), consumer.next()).await;
    assert!(extra.is_err(), "nothing beyond the 150 left: {extra:?}");
    drop(conn);
    server.terminate();
    let _ = std::fs::remove_dir_all(&data);
}

/// The message count of quorum queue `qd` once it reaches `want` (polled: after a restart the
/// group applies its log before the count shows it), or what it is after 10 s.
async fn count_reaching(ch: &lapin::Channel, want: u32) -> u32 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let q = within(
            "passive queue.declare",
            ch.queue_declare(
                "qd".into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            ),
        )
        .await
        .expect("passive declare");
        if q.message_count() == want || std::time::Instant::now() > deadline {
            return q.message_count();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A quorum queue deleted and declared again under the same name keeps what it was sent after
/// that, across restarts (the replay of the definitions log must not build the deleted
/// queue's group: it took the recovered log away from the queue declared after it).
#[tokio::test]
async fn a_queue_declared_again_after_a_delete_keeps_its_messages_across_restarts() {
    let data = tempdir("quorum-redeclare");
    let server = Server::start(&data, &[]);
    let conn = server.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    declare(&ch).await;
    within(
        "queue.delete",
        ch.queue_delete("qd".into(), Default::default()),
    )
    .await
    .expect("queue deleted");
    declare(&ch).await;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    let mut confirms = Vec::new();
    for i in 0..50 {
        confirms.push(
            ch.basic_publish(
                "".into(),
                "qd".into(),
                BasicPublishOptions::default(),
                format!("m{i}").as_bytes(),
                persistent(),
            )
            .await
            .expect("publish"),
        );
    }
    for pc in confirms {
        assert!(within("confirm", pc).await.expect("confirm").is_ack());
    }
    drop(conn);
    server.kill();
    // Twice: the second start replays the same log again.
    for round in 0..2 {
        let server = Server::start(&data, &[]);
        let conn = server.connect().await;
        let ch = conn.create_channel().await.expect("channel");
        assert_eq!(count_reaching(&ch, 50).await, 50, "after restart {round}");
        drop(conn);
        server.kill();
    }
    let _ = std::fs::remove_dir_all(&data);
}

/// tx.commit-ok on a quorum queue is sent once the quorum log has the transaction's messages
/// on disk: a kill -9 right after each commit-ok loses none of them (RabbitMQ's channel
/// waits for the queues' confirms before tx.commit-ok).
#[tokio::test]
async fn committed_transactions_survive_kill_9() {
    let data = tempdir("quorum-tx-kill9");
    let mut committed = 0u32;
    for round in 0..5 {
        let server = Server::start(&data, &[]);
        let conn = server.connect().await;
        let ch = conn.create_channel().await.expect("channel");
        declare(&ch).await;
        assert_eq!(
            count_reaching(&ch, committed).await,
            committed,
            "round {round}"
        );
        ch.tx_select().await.expect("tx.select");
        for i in 0..200 {
            ch.basic_publish(
                "".into(),
                "qd".into(),
                BasicPublishOptions::default(),
                format!("r{round}-{i}").as_bytes(),
                persistent(),
            )
            .await
            .expect("publish");
        }
        within("tx.commit", ch.tx_commit())
            .await
            .expect("tx.commit-ok");
        committed += 200;
        // At once: nothing may be left for the broker to write after the commit-ok.
        server.kill();
    }
    let server = Server::start(&data, &[]);
    let conn = server.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    declare(&ch).await;
    assert_eq!(count_reaching(&ch, committed).await, committed);
    drop(conn);
    server.terminate();
    let _ = std::fs::remove_dir_all(&data);
}

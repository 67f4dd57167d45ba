//! Quorum queues (`x-queue-type: quorum`) on one node through lapin: RabbitMQ 4.x's declare
//! rules and refusal texts, publishing with confirms, consuming and getting, the delivery
//! limit with dead-lettering and `x-delivery-count`, length limits, TTL and single active
//! consumer, publishes racing deletes and declares of their queue, and a basic.get right
//! after the first confirm of a new queue.

mod lapin_support;

use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions, BasicRejectOptions,
    QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel};
use lapin_support::*;

fn args(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    t.insert("x-queue-type".into(), s("quorum"));
    for (k, v) in pairs {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

async fn declare(
    ch: &Channel,
    name: &str,
    opts: QueueDeclareOptions,
    a: FieldTable,
) -> lapin::Result<lapin::Queue> {
    within("queue.declare", ch.queue_declare(name.into(), opts, a)).await
}

async fn quorum(ch: &Channel, name: &str, pairs: &[(&str, AMQPValue)]) {
    declare(ch, name, durable(), args(pairs))
        .await
        .expect("quorum queue declared");
}

/// Expects `res` to fail with 406 and exactly `text` as reply text.
fn expect_406<T: std::fmt::Debug>(res: lapin::Result<T>, text: &str) {
    match res {
        Ok(v) => panic!("expected 406, got Ok({v:?})"),
        Err(e) => match e.kind() {
            lapin::ErrorKind::ProtocolError(p) => {
                assert_eq!(p.get_id(), 406, "{e:?}");
                assert_eq!(
                    p.get_message().as_str(),
                    format!("PRECONDITION_FAILED - {text}")
                );
            }
            other => panic!("expected a protocol error, got {other:?}"),
        },
    }
}

/// Publishes on a confirm-mode channel and returns whether the broker acked it.
async fn publish_acked(ch: &Channel, key: &str, body: &[u8], props: BasicProperties) -> bool {
    let pc = within(
        "basic.publish",
        ch.basic_publish(
            "".into(),
            key.into(),
            BasicPublishOptions::default(),
            body,
            props,
        ),
    )
    .await
    .expect("basic.publish");
    within("publisher confirm", pc)
        .await
        .expect("publisher confirm")
        .is_ack()
}

fn header<'a>(d: &'a lapin::message::Delivery, key: &str) -> Option<&'a AMQPValue> {
    d.properties.headers().as_ref()?.inner().get(key)
}

#[tokio::test]
async fn declares_follow_rabbitmq_rules() {
    let env = Env::start().await;
    let q = "queue 'qq' in vhost '/'";
    let cases: Vec<(QueueDeclareOptions, FieldTable, String)> = vec![
        (
            QueueDeclareOptions::default(),
            args(&[]),
            format!("invalid property 'non-durable' for {q}"),
        ),
        (
            QueueDeclareOptions {
                durable: true,
                exclusive: true,
                ..Default::default()
            },
            args(&[]),
            format!("invalid property 'exclusive-owner' for {q}"),
        ),
        (
            QueueDeclareOptions {
                durable: true,
                auto_delete: true,
                ..Default::default()
            },
            args(&[]),
            format!("invalid property 'auto-delete' for {q}"),
        ),
        (
            durable(),
            args(&[("x-max-priority", AMQPValue::LongInt(10))]),
            format!("invalid arg 'x-max-priority' for {q} of queue type rabbit_quorum_queue"),
        ),
        (
            durable(),
            args(&[("x-dead-letter-strategy", s("sometimes"))]),
            format!("invalid arg 'x-dead-letter-strategy' for {q}: invalid_dlx_strategy"),
        ),
        (
            durable(),
            args(&[("x-overflow", s("drop-tail"))]),
            format!("invalid arg 'x-overflow' for {q}: invalid_overflow"),
        ),
    ];
    for (opts, a, text) in cases {
        let ch = env.channel().await;
        expect_406(declare(&ch, "qq", opts, a).await, &text);
    }
    let ch = env.channel().await;
    expect_406(
        declare(&ch, "", durable(), args(&[])).await,
        "Cannot declare a server-named queue for type rabbit_quorum_queue",
    );
    // Accepted: RabbitMQ's quorum arguments; the queue reports its type.
    let ch = env.channel().await;
    let declared = declare(
        &ch,
        "qq",
        durable(),
        args(&[
            ("x-quorum-initial-group-size", AMQPValue::LongInt(3)),
            ("x-delivery-limit", AMQPValue::LongInt(5)),
            ("x-dead-letter-strategy", s("at-most-once")),
            ("x-single-active-consumer", AMQPValue::Boolean(false)),
        ]),
    )
    .await
    .expect("declared");
    assert_eq!(declared.message_count(), 0);
    // A redeclare with other arguments is inequivalent.
    let err = declare(&ch, "qq", durable(), args(&[])).await;
    assert!(err.is_err(), "inequivalent redeclare refused");
    env.stop().await;
}

#[tokio::test]
async fn publish_confirm_consume_get_and_ack() {
    let env = Env::start().await;
    let ch = env.channel().await;
    quorum(&ch, "work", &[]).await;
    confirm_select(&ch).await;
    for i in 0..50 {
        assert!(
            publish_acked(
                &ch,
                "work",
                format!("m{i}").as_bytes(),
                BasicProperties::default()
            )
            .await
        );
    }
    // basic.get takes the head.
    let got = within(
        "basic.get",
        ch.basic_get("work".into(), BasicGetOptions { no_ack: false }),
    )
    .await
    .expect("basic.get")
    .expect("a message");
    assert_eq!(got.delivery.data, b"m0");
    assert_eq!(got.message_count, 49);
    within(
        "basic.ack",
        got.delivery.acker.ack(BasicAckOptions::default()),
    )
    .await
    .expect("ack");
    // A consumer gets the rest in order.
    let cch = env.channel().await;
    let mut consumer = consume(&cch, "work", "c", false).await;
    for i in 1..50 {
        let d = next(&mut consumer).await;
        assert_eq!(d.data, format!("m{i}").as_bytes());
        assert!(!d.redelivered);
        d.acker.ack(BasicAckOptions::default()).await.expect("ack");
    }
    assert_quiet(&mut consumer).await;
    // Published while consuming: delivered at once.
    assert!(publish_acked(&ch, "work", b"late", BasicProperties::default()).await);
    let d = next(&mut consumer).await;
    assert_eq!(d.data, b"late");
    d.acker.ack(BasicAckOptions::default()).await.expect("ack");
    // Passive declare counts what is left: nothing, once the delivery of "late" (a log
    // command of its own, committed after the message went out) is applied.
    let mut left = u32::MAX;
    for _ in 0..100 {
        let q = declare(
            &ch,
            "work",
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("passive declare");
        left = q.message_count();
        if left == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(left, 0, "messages still counted as ready after 5 s");
    env.stop().await;
}

#[tokio::test]
async fn requeued_messages_count_deliveries_and_die_at_the_limit() {
    let env = Env::start().await;
    let ch = env.channel().await;
    quorum(&ch, "dead", &[]).await;
    quorum(
        &ch,
        "poison",
        &[
            ("x-delivery-limit", AMQPValue::LongInt(2)),
            ("x-dead-letter-exchange", s("")),
            ("x-dead-letter-routing-key", s("dead")),
        ],
    )
    .await;
    confirm_select(&ch).await;
    assert!(publish_acked(&ch, "poison", b"bad", BasicProperties::default()).await);
    let cch = env.channel().await;
    let mut consumer = consume(&cch, "poison", "c", false).await;
    for round in 0..3i64 {
        let d = next(&mut consumer).await;
        assert_eq!(d.data, b"bad");
        assert_eq!(d.redelivered, round > 0);
        match header(&d, "x-delivery-count") {
            None => assert_eq!(round, 0),
            Some(v) => assert_eq!(v, &AMQPValue::LongLongInt(round)),
        }
        d.acker
            .nack(BasicNackOptions {
                requeue: true,
                ..Default::default()
            })
            .await
            .expect("nack");
    }
    // Returned a third time: over the limit of 2, dead-lettered.
    assert_quiet(&mut consumer).await;
    let mut dead = consume(&env.channel().await, "dead", "d", false).await;
    let d = next(&mut dead).await;
    assert_eq!(d.data, b"bad");
    let Some(AMQPValue::FieldArray(deaths)) = header(&d, "x-death") else {
        panic!("x-death expected")
    };
    let AMQPValue::FieldTable(first) = &deaths.as_slice()[0] else {
        panic!("x-death entry")
    };
    assert_eq!(
        first.inner().get("reason"),
        Some(&s("delivery_limit")),
        "{first:?}"
    );
    // A rejected message without requeue is dead-lettered with reason rejected.
    assert!(publish_acked(&ch, "poison", b"no", BasicProperties::default()).await);
    let d = next(&mut consumer).await;
    d.acker
        .reject(BasicRejectOptions { requeue: false })
        .await
        .expect("reject");
    let d = next(&mut dead).await;
    assert_eq!(d.data, b"no");
    env.stop().await;
}

#[tokio::test]
async fn length_limits_ttl_purge_and_delete() {
    let env = Env::start().await;
    let ch = env.channel().await;
    quorum(&ch, "short", &[("x-max-length", AMQPValue::LongInt(2))]).await;
    quorum(
        &ch,
        "strict",
        &[
            ("x-max-length", AMQPValue::LongInt(1)),
            ("x-overflow", s("reject-publish")),
        ],
    )
    .await;
    quorum(&ch, "brief", &[("x-message-ttl", AMQPValue::LongInt(100))]).await;
    confirm_select(&ch).await;
    for body in ["a", "b", "c"] {
        assert!(publish_acked(&ch, "short", body.as_bytes(), BasicProperties::default()).await);
    }
    assert!(publish_acked(&ch, "strict", b"1", BasicProperties::default()).await);
    // Wait until the first is applied, then the queue is full: the next is nacked.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!publish_acked(&ch, "strict", b"2", BasicProperties::default()).await);
    assert!(publish_acked(&ch, "brief", b"gone", BasicProperties::default()).await);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let gch = env.channel().await;
    assert_eq!(
        drain(&gch, "short").await,
        ["b", "c"],
        "drop-head kept the last two"
    );
    assert_eq!(drain(&gch, "strict").await, ["1"]);
    assert_eq!(drain(&gch, "brief").await, Vec::<String>::new(), "expired");
    for i in 0..5 {
        assert!(
            publish_acked(
                &ch,
                "brief",
                format!("{i}").as_bytes(),
                BasicProperties::default().with_expiration("60000".into())
            )
            .await
        );
    }
    let purged = within(
        "queue.purge",
        gch.queue_purge("short".into(), QueuePurgeOptions::default()),
    )
    .await
    .expect("purge");
    assert_eq!(purged, 0);
    within(
        "queue.delete",
        gch.queue_delete("brief".into(), QueueDeleteOptions::default()),
    )
    .await
    .expect("delete");
    // The same name can be declared again, empty.
    quorum(&gch, "brief", &[]).await;
    assert_eq!(drain(&gch, "brief").await, Vec::<String>::new());
    env.stop().await;
}

#[tokio::test]
async fn single_active_consumer_gets_everything() {
    let env = Env::start().await;
    let ch = env.channel().await;
    quorum(
        &ch,
        "sac",
        &[("x-single-active-consumer", AMQPValue::Boolean(true))],
    )
    .await;
    let c1 = env.channel().await;
    let c2 = env.channel().await;
    let mut first = consume(&c1, "sac", "one", false).await;
    let mut second = consume(&c2, "sac", "two", false).await;
    confirm_select(&ch).await;
    for i in 0..4 {
        assert!(
            publish_acked(
                &ch,
                "sac",
                format!("{i}").as_bytes(),
                BasicProperties::default()
            )
            .await
        );
    }
    for i in 0..4 {
        let d = next(&mut first).await;
        assert_eq!(d.data, format!("{i}").as_bytes());
        d.acker.ack(BasicAckOptions::default()).await.expect("ack");
    }
    assert_quiet(&mut second).await;
    env.stop().await;
}

/// A queue deleted and declared again, over and over, while another connection publishes
/// to it with confirms: every publish is answered (acked, or nacked when the queue went
/// away under it); none waits forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_racing_deletes_and_declares_are_all_answered() {
    let env = Env::start().await;
    let churn_ch = env.channel().await;
    let pconn = env.connect().await;
    let pch = within("channel.open", pconn.create_channel())
        .await
        .expect("channel.open");
    confirm_select(&pch).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut rounds = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                quorum(&churn_ch, "churned", &[]).await;
                within(
                    "queue.delete",
                    churn_ch.queue_delete("churned".into(), QueueDeleteOptions::default()),
                )
                .await
                .expect("queue.delete");
                rounds += 1;
            }
            rounds
        }
    });
    let mut acked = 0;
    for i in 0..1000 {
        if publish_acked(
            &pch,
            "churned",
            format!("m{i}").as_bytes(),
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        {
            acked += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = within("the deletes and declares", churn).await.unwrap();
    assert!(rounds > 0 && acked > 0, "{rounds} rounds, {acked} acked");
    let _ = pconn.close(200, "bye".into()).await;
    env.stop().await;
}

/// A message confirmed on a queue just declared is there for the next basic.get, as on a
/// queue that has been leading for long (a new leadership holds its first confirms until it
/// can hand out the head).
#[tokio::test]
async fn a_confirmed_message_is_got_at_once_from_a_new_queue() {
    // With a data directory, as a real broker: the log's writes are synced.
    let dir = std::env::temp_dir().join(format!("warren-quorum-get-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let broker = within(
        "broker start",
        warren_server::Broker::builder()
            .data_dir(&dir)
            .bind("127.0.0.1:0")
            .start(),
    )
    .await
    .expect("broker starts");
    let conn = connect(&broker).await;
    let env = Env {
        broker: Some(broker),
        conn,
    };
    let ch = env.channel().await;
    confirm_select(&ch).await;
    for i in 0..50 {
        let q = format!("fresh-{i}");
        quorum(&ch, &q, &[]).await;
        assert!(publish_acked(&ch, &q, b"first", BasicProperties::default()).await);
        let got = within(
            "basic.get",
            ch.basic_get(q.as_str().into(), BasicGetOptions { no_ack: true }),
        )
        .await
        .expect("basic.get");
        assert_eq!(
            got.map(|m| m.delivery.data),
            Some(b"first".to_vec()),
            "queue {q}"
        );
    }
    env.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

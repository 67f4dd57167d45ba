//! Queue arguments through lapin: validation at queue.declare, dead-lettering, message TTL,
//! length limits, queue expiry, single active consumer and priorities.

mod lapin_support;

use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicNackOptions, BasicPublishOptions, BasicRejectOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, ExchangeKind};
use lapin_support::*;
use std::time::Duration;

fn args(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

async fn declare_args(ch: &Channel, name: &str, a: FieldTable) -> lapin::Result<lapin::Queue> {
    within(
        "queue.declare",
        ch.queue_declare(name.into(), QueueDeclareOptions::default(), a),
    )
    .await
}

async fn declare_ok(ch: &Channel, name: &str, pairs: &[(&str, AMQPValue)]) {
    declare_args(ch, name, args(pairs))
        .await
        .expect("queue.declare");
}

async fn fanout(ch: &Channel, name: &str) {
    within(
        "exchange.declare",
        ch.exchange_declare(
            name.into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("exchange.declare");
}

async fn confirm_select(ch: &Channel) {
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
}

/// Publishes on a confirm-mode channel and returns whether the broker acked it.
async fn publish_acked(ch: &Channel, key: &str, body: &[u8]) -> bool {
    let pc = within(
        "basic.publish",
        ch.basic_publish(
            "".into(),
            key.into(),
            BasicPublishOptions::default(),
            body,
            BasicProperties::default(),
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

fn as_str(v: Option<&AMQPValue>) -> String {
    match v {
        Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        other => panic!("expected a long string, got {other:?}"),
    }
}

/// The `x-death` entries of a delivery.
fn deaths(d: &lapin::message::Delivery) -> Vec<FieldTable> {
    match header(d, "x-death") {
        Some(AMQPValue::FieldArray(a)) => a
            .as_slice()
            .iter()
            .map(|v| match v {
                AMQPValue::FieldTable(t) => t.clone(),
                other => panic!("x-death entry is not a table: {other:?}"),
            })
            .collect(),
        other => panic!("expected an x-death array, got {other:?}"),
    }
}

fn field<'a>(t: &'a FieldTable, key: &str) -> Option<&'a AMQPValue> {
    t.inner().get(key)
}

/// Expects `res` to fail with 406 and exactly `text` as reply text.
fn expect_406<T: std::fmt::Debug>(res: lapin::Result<T>, text: &str) {
    match res {
        Ok(v) => panic!("expected 406, got Ok({v:?})"),
        Err(e) => match e.kind() {
            lapin::ErrorKind::ProtocolError(p) => {
                assert_eq!(p.get_id(), 406, "{e:?}");
                assert_eq!(p.get_message().as_str(), text);
            }
            other => panic!("expected a protocol error, got {other:?}"),
        },
    }
}

#[tokio::test]
async fn invalid_arguments_are_refused_with_rabbitmq_texts() {
    let env = Env::start().await;
    let cases: Vec<(&str, AMQPValue, &str)> = vec![
        (
            "x-message-ttl",
            AMQPValue::LongInt(-1),
            "{value_negative,-1}",
        ),
        (
            "x-message-ttl",
            s("1000"),
            "\"expected integer, got longstr\"",
        ),
        ("x-expires", AMQPValue::LongInt(0), "{value_zero,0}"),
        (
            "x-max-length",
            AMQPValue::LongLongInt(-2),
            "{value_negative,-2}",
        ),
        (
            "x-max-length-bytes",
            AMQPValue::Boolean(true),
            "\"expected integer, got bool\"",
        ),
        ("x-overflow", s("drop-tail"), "invalid_overflow"),
        (
            "x-dead-letter-routing-key",
            s("rk"),
            "routing_key_but_no_dlx_defined",
        ),
        (
            "x-max-priority",
            AMQPValue::LongInt(256),
            "{max_value_exceeded,256}",
        ),
        (
            "x-single-active-consumer",
            s("yes"),
            "{unacceptable_type,longstr}",
        ),
        (
            "x-queue-type",
            s("stream"),
            "\"unsupported queue type 'stream'\"",
        ),
    ];
    for (key, value, reason) in cases {
        let ch = env.channel().await;
        expect_406(
            declare_args(&ch, "bad", args(&[(key, value)])).await,
            &format!(
                "PRECONDITION_FAILED - invalid arg '{key}' for queue 'bad' in vhost '/': {reason}"
            ),
        );
    }
    // The dead-letter exchange's type is checked first, with rabbit_channel's wording.
    let ch = env.channel().await;
    expect_406(
        declare_args(
            &ch,
            "bad",
            args(&[("x-dead-letter-exchange", AMQPValue::LongInt(1))]),
        )
        .await,
        "PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in \
         queue 'bad' in vhost '/'",
    );
    // Nothing was created; valid arguments are accepted.
    let ch = env.channel().await;
    declare_ok(
        &ch,
        "good",
        &[
            ("x-message-ttl", AMQPValue::LongInt(60_000)),
            ("x-max-length", AMQPValue::ShortShortInt(10)),
            ("x-overflow", s("reject-publish")),
            ("x-queue-type", s("classic")),
            ("x-dead-letter-exchange", s("")),
            ("x-dead-letter-routing-key", s("dead")),
        ],
    )
    .await;
    expect_code(
        within(
            "passive declare",
            ch.queue_declare(
                "bad".into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            ),
        )
        .await,
        404,
    );
    env.stop().await;
}

#[tokio::test]
async fn rejected_messages_are_dead_lettered_with_x_death() {
    let env = Env::start().await;
    let ch = env.channel().await;
    fanout(&ch, "dlx").await;
    declare_queue(&ch, "dlq").await;
    bind(&ch, "dlq", "dlx", "").await;
    declare_ok(&ch, "work", &[("x-dead-letter-exchange", s("dlx"))]).await;
    publish(&ch, "", "work", b"one").await;
    publish(&ch, "", "work", b"two").await;
    let mut c = consume(&ch, "work", "c", false).await;
    let d1 = next(&mut c).await;
    let d2 = next(&mut c).await;
    within(
        "basic.reject",
        ch.basic_reject(d1.delivery_tag, BasicRejectOptions { requeue: false }),
    )
    .await
    .unwrap();
    within(
        "basic.nack",
        ch.basic_nack(
            d2.delivery_tag,
            BasicNackOptions {
                multiple: false,
                requeue: false,
            },
        ),
    )
    .await
    .unwrap();
    let mut dead = consume(&ch, "dlq", "d", true).await;
    let m = next(&mut dead).await;
    assert_eq!(text(&m), "one");
    assert_eq!(m.exchange.as_str(), "dlx");
    assert_eq!(m.routing_key.as_str(), "work");
    let x = deaths(&m);
    assert_eq!(x.len(), 1);
    assert_eq!(field(&x[0], "count"), Some(&AMQPValue::LongLongInt(1)));
    assert_eq!(as_str(field(&x[0], "reason")), "rejected");
    assert_eq!(as_str(field(&x[0], "queue")), "work");
    assert_eq!(as_str(field(&x[0], "exchange")), "");
    assert!(matches!(
        field(&x[0], "time"),
        Some(AMQPValue::Timestamp(_))
    ));
    match field(&x[0], "routing-keys") {
        Some(AMQPValue::FieldArray(a)) => {
            assert_eq!(a.as_slice(), &[s("work")]);
        }
        other => panic!("routing-keys: {other:?}"),
    }
    assert_eq!(as_str(header(&m, "x-first-death-reason")), "rejected");
    assert_eq!(as_str(header(&m, "x-first-death-queue")), "work");
    assert_eq!(as_str(header(&m, "x-first-death-exchange")), "");
    assert_eq!(as_str(header(&m, "x-last-death-reason")), "rejected");
    assert_eq!(text(&next(&mut dead).await), "two");
    // Acked and requeued messages are not dead-lettered.
    publish(&ch, "", "work", b"three").await;
    let d3 = next(&mut c).await;
    within(
        "basic.ack",
        ch.basic_ack(d3.delivery_tag, BasicAckOptions::default()),
    )
    .await
    .unwrap();
    assert_quiet(&mut dead).await;
    env.stop().await;
}

#[tokio::test]
async fn dead_letter_routing_key_replaces_the_original() {
    let env = Env::start().await;
    let ch = env.channel().await;
    within(
        "exchange.declare",
        ch.exchange_declare(
            "dlx".into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    declare_queue(&ch, "dead").await;
    bind(&ch, "dead", "dlx", "to-dead").await;
    declare_ok(
        &ch,
        "work",
        &[
            ("x-dead-letter-exchange", s("dlx")),
            ("x-dead-letter-routing-key", s("to-dead")),
        ],
    )
    .await;
    publish(&ch, "", "work", b"m").await;
    let m = within(
        "basic.get",
        ch.basic_get(
            "work".into(),
            lapin::options::BasicGetOptions { no_ack: false },
        ),
    )
    .await
    .unwrap()
    .expect("a message");
    within(
        "basic.reject",
        ch.basic_reject(
            m.delivery.delivery_tag,
            BasicRejectOptions { requeue: false },
        ),
    )
    .await
    .unwrap();
    let mut c = consume(&ch, "dead", "c", true).await;
    let d = next(&mut c).await;
    assert_eq!(d.routing_key.as_str(), "to-dead");
    assert_eq!(as_str(field(&deaths(&d)[0], "queue")), "work");
    env.stop().await;
}

#[tokio::test]
async fn message_ttl_drops_expired_messages() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_ok(&ch, "ttl", &[("x-message-ttl", AMQPValue::LongInt(100))]).await;
    declare_queue(&ch, "plain").await;
    publish(&ch, "", "ttl", b"short-lived").await;
    publish_props(
        &ch,
        "",
        "plain",
        b"per-message",
        BasicProperties::default().with_expiration("100".into()),
    )
    .await;
    publish(&ch, "", "plain", b"stays").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(drain(&ch, "ttl").await, Vec::<String>::new());
    assert_eq!(drain(&ch, "plain").await, vec!["stays".to_string()]);
    // Fresh messages are still there.
    publish(&ch, "", "ttl", b"fresh").await;
    assert_eq!(drain(&ch, "ttl").await, vec!["fresh".to_string()]);
    env.stop().await;
}

#[tokio::test]
async fn expired_messages_are_dead_lettered_by_the_sweep() {
    let env = Env::start().await;
    let ch = env.channel().await;
    fanout(&ch, "dlx").await;
    declare_queue(&ch, "dlq").await;
    bind(&ch, "dlq", "dlx", "").await;
    declare_ok(
        &ch,
        "ttl",
        &[
            ("x-message-ttl", AMQPValue::LongInt(100)),
            ("x-dead-letter-exchange", s("dlx")),
        ],
    )
    .await;
    let mut dead = consume(&ch, "dlq", "d", true).await;
    publish_props(
        &ch,
        "",
        "ttl",
        b"x",
        BasicProperties::default().with_expiration("50".into()),
    )
    .await;
    // Nobody touches queue "ttl": only the periodic sweep can expire the message.
    let m = next(&mut dead).await;
    assert_eq!(text(&m), "x");
    let x = deaths(&m);
    assert_eq!(as_str(field(&x[0], "reason")), "expired");
    assert_eq!(as_str(field(&x[0], "original-expiration")), "50");
    assert!(m.properties.expiration().is_none());
    env.stop().await;
}

#[tokio::test]
async fn ttl_zero_reaches_only_a_waiting_consumer() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_ok(&ch, "now", &[("x-message-ttl", AMQPValue::LongInt(0))]).await;
    publish(&ch, "", "now", b"nobody").await;
    assert_eq!(drain(&ch, "now").await, Vec::<String>::new());
    let mut c = consume(&ch, "now", "c", true).await;
    publish(&ch, "", "now", b"taken").await;
    assert_eq!(text(&next(&mut c).await), "taken");
    env.stop().await;
}

#[tokio::test]
async fn max_length_drops_the_head() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_ok(&ch, "ml", &[("x-max-length", AMQPValue::LongInt(2))]).await;
    for b in ["1", "2", "3", "4"] {
        publish(&ch, "", "ml", b.as_bytes()).await;
    }
    assert_eq!(drain(&ch, "ml").await, vec!["3", "4"]);
    declare_ok(
        &ch,
        "mlb",
        &[("x-max-length-bytes", AMQPValue::LongInt(10))],
    )
    .await;
    for b in ["aaaa", "bbbb", "cccc"] {
        publish(&ch, "", "mlb", b.as_bytes()).await;
    }
    assert_eq!(drain(&ch, "mlb").await, vec!["bbbb", "cccc"]);
    env.stop().await;
}

#[tokio::test]
async fn max_length_dead_letters_with_reason_maxlen() {
    let env = Env::start().await;
    let ch = env.channel().await;
    fanout(&ch, "dlx").await;
    declare_queue(&ch, "dlq").await;
    bind(&ch, "dlq", "dlx", "").await;
    declare_ok(
        &ch,
        "ml",
        &[
            ("x-max-length", AMQPValue::LongInt(1)),
            ("x-dead-letter-exchange", s("dlx")),
        ],
    )
    .await;
    publish(&ch, "", "ml", b"old").await;
    publish(&ch, "", "ml", b"new").await;
    let mut dead = consume(&ch, "dlq", "d", true).await;
    let m = next(&mut dead).await;
    assert_eq!(text(&m), "old");
    assert_eq!(as_str(field(&deaths(&m)[0], "reason")), "maxlen");
    assert_eq!(drain(&ch, "ml").await, vec!["new"]);
    env.stop().await;
}

#[tokio::test]
async fn reject_publish_nacks_when_full() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_ok(
        &ch,
        "full",
        &[
            ("x-max-length", AMQPValue::LongInt(2)),
            ("x-overflow", s("reject-publish")),
        ],
    )
    .await;
    confirm_select(&ch).await;
    assert!(publish_acked(&ch, "full", b"1").await);
    assert!(publish_acked(&ch, "full", b"2").await);
    assert!(
        !publish_acked(&ch, "full", b"3").await,
        "third publish nacked"
    );
    assert_eq!(drain(&ch, "full").await, vec!["1", "2"]);
    assert!(publish_acked(&ch, "full", b"4").await);
    env.stop().await;
}

#[tokio::test]
async fn unused_queue_expires() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_ok(&ch, "gone", &[("x-expires", AMQPValue::LongInt(200))]).await;
    declare_ok(&ch, "used", &[("x-expires", AMQPValue::LongInt(200))]).await;
    let _c = consume(&ch, "used", "c", true).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    within(
        "passive declare",
        ch.queue_declare("used".into(), passive, FieldTable::default()),
    )
    .await
    .expect("a queue with a consumer stays");
    expect_code(
        within(
            "passive declare",
            ch.queue_declare("gone".into(), passive, FieldTable::default()),
        )
        .await,
        404,
    );
    env.stop().await;
}

#[tokio::test]
async fn single_active_consumer_gets_everything_until_it_cancels() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_ok(
        &ch,
        "sac",
        &[("x-single-active-consumer", AMQPValue::Boolean(true))],
    )
    .await;
    let mut a = consume(&ch, "sac", "a", true).await;
    let mut b = consume(&ch, "sac", "b", true).await;
    for i in 0..4 {
        publish(&ch, "", "sac", i.to_string().as_bytes()).await;
    }
    for i in 0..4 {
        assert_eq!(text(&next(&mut a).await), i.to_string());
    }
    assert_quiet(&mut b).await;
    within(
        "basic.cancel",
        ch.basic_cancel("a".into(), BasicCancelOptions::default()),
    )
    .await
    .unwrap();
    publish(&ch, "", "sac", b"after").await;
    assert_eq!(text(&next(&mut b).await), "after");
    env.stop().await;
}

#[tokio::test]
async fn priority_queue_delivers_higher_priorities_first() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_ok(
        &ch,
        "prio",
        &[("x-max-priority", AMQPValue::ShortShortInt(5))],
    )
    .await;
    for (body, p) in [
        ("low", 1u8),
        ("none", 0),
        ("high", 5),
        ("capped", 200),
        ("mid", 3),
    ] {
        let props = if p == 0 {
            BasicProperties::default()
        } else {
            BasicProperties::default().with_priority(p)
        };
        publish_props(&ch, "", "prio", body.as_bytes(), props).await;
    }
    assert_eq!(
        drain(&ch, "prio").await,
        vec!["high", "capped", "mid", "low", "none"]
    );
    // Without x-max-priority, priorities are ignored.
    declare_queue(&ch, "fifo").await;
    publish_props(
        &ch,
        "",
        "fifo",
        b"a",
        BasicProperties::default().with_priority(1),
    )
    .await;
    publish_props(
        &ch,
        "",
        "fifo",
        b"b",
        BasicProperties::default().with_priority(9),
    )
    .await;
    assert_eq!(drain(&ch, "fifo").await, vec!["a", "b"]);
    env.stop().await;
}

#[tokio::test]
async fn invalid_expiration_closes_the_channel_with_406() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "q").await;
    // In confirm mode the pending confirm fails with the channel's close reason, whichever of
    // lapin's tasks sees the channel.close first.
    within(
        "confirm.select",
        ch.confirm_select(lapin::options::ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
    let res = match within(
        "basic.publish",
        ch.basic_publish(
            "".into(),
            "q".into(),
            BasicPublishOptions::default(),
            b"x",
            BasicProperties::default().with_expiration("10s".into()),
        ),
    )
    .await
    {
        Ok(pc) => within("confirm", pc).await.map(|_| ()),
        Err(e) => Err(e),
    };
    expect_406(
        res,
        "PRECONDITION_FAILED - invalid expiration '10s': {leftover_string,\"s\"}",
    );
    env.stop().await;
}

//! Broker-model behaviour checked end to end with lapin, each against the value RabbitMQ
//! 3.10.8 gives: alternate exchanges decided per exchange visited, length limits on
//! requeue, exclusive queues never durable, sender-selected distribution (CC / BCC), the
//! default exchange refusing even passive declares, per-vhost limits, and a hostile topic
//! binding that must not stall the broker.

mod lapin_support;

use lapin::options::{
    BasicGetOptions, BasicNackOptions, BasicPublishOptions, BasicRecoverOptions,
    ConfirmSelectOptions, ExchangeBindOptions, ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, ExchangeKind};
use lapin_support::*;
use warren_server::Config;

fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    t
}

fn keys(k: &[&str]) -> AMQPValue {
    AMQPValue::FieldArray(FieldArray::from(k.iter().map(|k| s(k)).collect::<Vec<_>>()))
}

async fn exchange(ch: &Channel, name: &str, kind: ExchangeKind, args: FieldTable) {
    within(
        "exchange.declare",
        ch.exchange_declare(name.into(), kind, ExchangeDeclareOptions::default(), args),
    )
    .await
    .expect("exchange.declare");
}

async fn queue_args(ch: &Channel, name: &str, args: FieldTable) {
    within(
        "queue.declare",
        ch.queue_declare(name.into(), QueueDeclareOptions::default(), args),
    )
    .await
    .expect("queue.declare");
}

/// Expects `res` to fail with `code` and exactly `text` as reply text.
fn expect_error<T: std::fmt::Debug>(res: lapin::Result<T>, code: u16, text: &str) {
    match res {
        Ok(v) => panic!("expected {code}, got Ok({v:?})"),
        Err(e) => match e.kind() {
            lapin::ErrorKind::ProtocolError(p) => {
                assert_eq!(p.get_id(), code, "{e:?}");
                assert_eq!(p.get_message().as_str(), text);
            }
            other => panic!("expected a protocol error, got {other:?}"),
        },
    }
}

/// Publishes with confirms on `ch` (already in confirm mode) and returns the confirmation.
async fn publish_confirmed(
    ch: &Channel,
    exchange: &str,
    key: &str,
    mandatory: bool,
    props: BasicProperties,
) -> Confirmation {
    let confirm = within(
        "basic.publish",
        ch.basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions {
                mandatory,
                ..Default::default()
            },
            b"m",
            props,
        ),
    )
    .await
    .expect("basic.publish");
    within("confirm", confirm).await.expect("confirm")
}

#[tokio::test]
async fn alternate_exchange_of_an_inner_exchange_takes_the_message() {
    // fanout E -> direct I (alternate-exchange A) ; A -> QA. RabbitMQ 3.10.8 routes a
    // mandatory publish to E with a key I does not match to QA, and returns nothing.
    let env = Env::start().await;
    let ch = env.channel().await;
    exchange(&ch, "E", ExchangeKind::Fanout, FieldTable::default()).await;
    exchange(&ch, "A", ExchangeKind::Fanout, FieldTable::default()).await;
    exchange(
        &ch,
        "I",
        ExchangeKind::Direct,
        table(&[("alternate-exchange", s("A"))]),
    )
    .await;
    within(
        "exchange.bind",
        ch.exchange_bind(
            "I".into(),
            "E".into(),
            "".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("exchange.bind");
    let qa = declare_queue(&ch, "QA").await;
    bind(&ch, &qa, "A", "").await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
    let conf = publish_confirmed(&ch, "E", "nomatch", true, BasicProperties::default()).await;
    assert!(
        matches!(conf, Confirmation::Ack(None)),
        "expected a plain ack, got {conf:?}"
    );
    assert_eq!(drain(&ch, &qa).await, vec!["m"]);
    env.stop().await;
}

/// A queue with x-max-length 2 (`overflow`) dead-lettering to `dlq`.
async fn limited_queue(ch: &Channel, overflow: &str) {
    declare_queue(ch, "dlq").await;
    queue_args(
        ch,
        "limited",
        table(&[
            ("x-max-length", AMQPValue::LongInt(2)),
            ("x-overflow", s(overflow)),
            ("x-dead-letter-exchange", s("")),
            ("x-dead-letter-routing-key", s("dlq")),
        ]),
    )
    .await;
}

/// basic.get without ack; returns the delivery tag.
async fn get_unacked(ch: &Channel, queue: &str) -> u64 {
    within(
        "basic.get",
        ch.basic_get(queue.into(), BasicGetOptions { no_ack: false }),
    )
    .await
    .expect("basic.get")
    .expect("a message")
    .delivery
    .delivery_tag
}

/// The bodies and `x-first-death-reason` of what `queue` holds.
async fn dead_letters(ch: &Channel, queue: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while let Some(m) = within(
        "basic.get",
        ch.basic_get(queue.into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .expect("basic.get")
    {
        let reason = m
            .delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-first-death-reason").cloned());
        let reason = match reason {
            Some(AMQPValue::LongString(r)) => r.to_string(),
            other => panic!("no death reason: {other:?}"),
        };
        out.push((String::from_utf8(m.delivery.data).unwrap(), reason));
    }
    out
}

#[tokio::test]
async fn requeue_over_max_length_drops_the_head() {
    // RabbitMQ 3.10.8: publish a and b, get a unacked, publish c, nack a with requeue:
    // [b, c] stay and a is dead-lettered with reason maxlen.
    let env = Env::start().await;
    let ch = env.channel().await;
    limited_queue(&ch, "drop-head").await;
    publish(&ch, "", "limited", b"a").await;
    publish(&ch, "", "limited", b"b").await;
    let tag = get_unacked(&ch, "limited").await;
    publish(&ch, "", "limited", b"c").await;
    within(
        "basic.nack",
        ch.basic_nack(
            tag,
            BasicNackOptions {
                requeue: true,
                multiple: false,
            },
        ),
    )
    .await
    .expect("basic.nack");
    assert_eq!(drain(&ch, "limited").await, vec!["b", "c"]);
    assert_eq!(
        dead_letters(&ch, "dlq").await,
        vec![("a".to_string(), "maxlen".to_string())]
    );
    env.stop().await;
}

#[tokio::test]
async fn recover_channel_close_and_connection_close_respect_max_length() {
    let env = Env::start().await;
    let ch = env.channel().await;
    limited_queue(&ch, "drop-head").await;
    for how in ["recover", "channel", "connection"] {
        let conn = env.connect().await;
        let other = within("channel.open", conn.create_channel())
            .await
            .expect("channel.open");
        publish(&ch, "", "limited", b"a").await;
        publish(&ch, "", "limited", b"b").await;
        get_unacked(&other, "limited").await;
        publish(&ch, "", "limited", b"c").await;
        match how {
            "recover" => within(
                "basic.recover",
                other.basic_recover(BasicRecoverOptions { requeue: true }),
            )
            .await
            .expect("basic.recover"),
            "channel" => within("channel.close", other.close(200, "bye".into()))
                .await
                .expect("channel.close"),
            // The broker requeues a closing connection's unacked messages before close-ok.
            _ => within("connection.close", conn.close(200, "bye".into()))
                .await
                .expect("connection.close"),
        }
        assert_eq!(drain(&ch, "limited").await, vec!["b", "c"], "{how}");
        assert_eq!(
            dead_letters(&ch, "dlq").await,
            vec![("a".to_string(), "maxlen".to_string())],
            "{how}"
        );
    }
    env.stop().await;
}

#[tokio::test]
async fn reject_publish_queues_keep_requeued_messages_over_their_limit() {
    // RabbitMQ 3.10.8 keeps [a, b, c] for reject-publish and reject-publish-dlx.
    for overflow in ["reject-publish", "reject-publish-dlx"] {
        let env = Env::start().await;
        let ch = env.channel().await;
        limited_queue(&ch, overflow).await;
        publish(&ch, "", "limited", b"a").await;
        publish(&ch, "", "limited", b"b").await;
        let tag = get_unacked(&ch, "limited").await;
        publish(&ch, "", "limited", b"c").await;
        within(
            "basic.nack",
            ch.basic_nack(
                tag,
                BasicNackOptions {
                    requeue: true,
                    multiple: false,
                },
            ),
        )
        .await
        .expect("basic.nack");
        assert_eq!(
            drain(&ch, "limited").await,
            vec!["a", "b", "c"],
            "{overflow}"
        );
        assert!(dead_letters(&ch, "dlq").await.is_empty(), "{overflow}");
        env.stop().await;
    }
}

#[tokio::test]
async fn exclusive_durable_queue_is_transient() {
    // RabbitMQ: exclusive and durable makes a transient queue, so redeclaring it with
    // durable=false is equivalent, and a passive declare finds it.
    let env = Env::start().await;
    let ch = env.channel().await;
    let opts = |durable| QueueDeclareOptions {
        exclusive: true,
        durable,
        ..Default::default()
    };
    let q = within(
        "queue.declare",
        ch.queue_declare("ex".into(), opts(true), FieldTable::default()),
    )
    .await
    .expect("queue.declare");
    assert_eq!((q.message_count(), q.consumer_count()), (0, 0));
    for durable in [false, true] {
        within(
            "queue.declare",
            ch.queue_declare("ex".into(), opts(durable), FieldTable::default()),
        )
        .await
        .expect("an equivalent redeclare");
    }
    publish(&ch, "", "ex", b"m").await;
    let q = within(
        "queue.declare passive",
        ch.queue_declare(
            "ex".into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .expect("passive declare");
    assert_eq!(q.message_count(), 1);
    let broker = env.broker.as_ref().unwrap();
    let queue = broker
        .state()
        .broker
        .vhost("/")
        .unwrap()
        .queues()
        .into_iter()
        .find(|q| q.name() == "ex")
        .unwrap();
    assert!(!queue.durable());
    env.stop().await;
}

#[tokio::test]
async fn default_exchange_cannot_be_declared_even_passively() {
    let env = Env::start().await;
    for passive in [true, false] {
        let ch = env.channel().await;
        expect_error(
            within(
                "exchange.declare",
                ch.exchange_declare(
                    "".into(),
                    ExchangeKind::Direct,
                    ExchangeDeclareOptions {
                        passive,
                        ..Default::default()
                    },
                    FieldTable::default(),
                ),
            )
            .await,
            403,
            "ACCESS_REFUSED - operation not permitted on the default exchange",
        );
    }
    env.stop().await;
}

fn with_headers(h: FieldTable) -> BasicProperties {
    BasicProperties::default().with_headers(h)
}

#[tokio::test]
async fn cc_and_bcc_headers_add_routing_keys() {
    let env = Env::start().await;
    let ch = env.channel().await;
    exchange(&ch, "d", ExchangeKind::Direct, FieldTable::default()).await;
    exchange(&ch, "t", ExchangeKind::Topic, FieldTable::default()).await;
    for q in ["k1", "k2", "k3", "other"] {
        declare_queue(&ch, q).await;
        bind(&ch, q, "d", q).await;
        bind(&ch, q, "t", &format!("{q}.#")).await;
    }
    let h = table(&[("CC", keys(&["k2"])), ("BCC", keys(&["k3"]))]);
    for (x, rk) in [("d", "k1"), ("t", "k1.x"), ("", "k1")] {
        publish_props(&ch, x, rk, b"m", with_headers(h.clone())).await;
        for q in ["k1", "k2", "k3"] {
            let m = within(
                "basic.get",
                ch.basic_get(q.into(), BasicGetOptions { no_ack: true }),
            )
            .await
            .expect("basic.get")
            .unwrap_or_else(|| panic!("{q} got nothing through '{x}'"));
            assert_eq!(m.delivery.routing_key.as_str(), rk);
            let delivered = m.delivery.properties.headers().clone().unwrap_or_default();
            // BCC is removed before delivery, CC stays.
            assert!(delivered.inner().get("BCC").is_none(), "{x}");
            assert_eq!(delivered.inner().get("CC"), Some(&keys(&["k2"])), "{x}");
        }
        assert!(drain(&ch, "other").await.is_empty());
    }
    // Elements that are not long strings are skipped.
    let mixed = AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongInt(5), s("k2")]));
    publish_props(&ch, "d", "k1", b"m", with_headers(table(&[("CC", mixed)]))).await;
    assert_eq!(drain(&ch, "k2").await, vec!["m"]);
    drain(&ch, "k1").await;
    env.stop().await;
}

#[tokio::test]
async fn cc_that_is_not_an_array_closes_the_channel() {
    let env = Env::start().await;
    for (header, value, ty) in [
        ("CC", s("k2"), "longstr"),
        ("CC", AMQPValue::LongInt(5), "signedint"),
        ("BCC", s("x"), "longstr"),
    ] {
        // A connection per case: lapin may not have freed a closed channel's number yet.
        let conn = env.connect().await;
        let ch = within("channel.open", conn.create_channel())
            .await
            .expect("channel.open");
        within(
            "confirm.select",
            ch.confirm_select(ConfirmSelectOptions::default()),
        )
        .await
        .expect("confirm.select");
        // The channel close fails the publish, or its pending confirm, whichever of lapin's
        // tasks sees it first.
        let res = match within(
            "basic.publish",
            ch.basic_publish(
                "amq.direct".into(),
                "k".into(),
                BasicPublishOptions::default(),
                b"m",
                with_headers(table(&[(header, value)])),
            ),
        )
        .await
        {
            Ok(pc) => within("confirm", pc).await.map(|_| ()),
            Err(e) => Err(e),
        };
        expect_error(
            res,
            406,
            &format!(
                "PRECONDITION_FAILED - invalid message: {{unacceptable_type_in_header,\"{header}\",{ty}}}"
            ),
        );
    }
    env.stop().await;
}

#[tokio::test]
async fn x_death_routing_keys_hold_the_routing_key_and_cc() {
    // RabbitMQ 3.10.8: routing-keys ['k1', 'k2', 'cc2'] for routing key k1, CC [k2, cc2],
    // BCC [k3, bcc2]; without a dead-letter routing key the dead letter is routed with the
    // BCC keys too.
    let env = Env::start().await;
    let ch = env.channel().await;
    exchange(&ch, "d", ExchangeKind::Direct, FieldTable::default()).await;
    exchange(&ch, "dlx", ExchangeKind::Direct, FieldTable::default()).await;
    queue_args(&ch, "src", table(&[("x-dead-letter-exchange", s("dlx"))])).await;
    bind(&ch, "src", "d", "k1").await;
    let dead = declare_queue(&ch, "dead").await;
    bind(&ch, &dead, "dlx", "k3").await;
    let h = table(&[("CC", keys(&["k2", "cc2"])), ("BCC", keys(&["k3", "bcc2"]))]);
    publish_props(&ch, "d", "k1", b"m", with_headers(h)).await;
    let tag = get_unacked(&ch, "src").await;
    within(
        "basic.nack",
        ch.basic_nack(
            tag,
            BasicNackOptions {
                requeue: false,
                multiple: false,
            },
        ),
    )
    .await
    .expect("basic.nack");
    let m = within(
        "basic.get",
        ch.basic_get(dead.as_str().into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .expect("basic.get")
    .expect("the dead letter, routed by its BCC key k3");
    let h = m.delivery.properties.headers().clone().unwrap();
    let death = match h.inner().get("x-death") {
        Some(AMQPValue::FieldArray(a)) => match &a.as_slice()[0] {
            AMQPValue::FieldTable(t) => t.clone(),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    };
    assert_eq!(
        death.inner().get("routing-keys"),
        Some(&keys(&["k1", "k2", "cc2"]))
    );
    env.stop().await;
}

async fn limited_broker() -> Env {
    let mut config = Config::default();
    config.amqp.listen = "127.0.0.1:0".parse().unwrap();
    config.limits.max_queues = 2;
    config.limits.max_exchanges = 1;
    config.limits.max_bindings = 1;
    let broker = within(
        "broker start",
        warren_server::Broker::builder().config(config).start(),
    )
    .await
    .expect("broker starts");
    let conn = connect(&broker).await;
    Env {
        broker: Some(broker),
        conn,
    }
}

#[tokio::test]
async fn vhost_limits_refuse_new_queues_exchanges_and_bindings() {
    let env = limited_broker().await;
    let ch = env.channel().await;
    declare_queue(&ch, "q1").await;
    declare_queue(&ch, "q2").await;
    // RabbitMQ's max-queues text.
    expect_error(
        within(
            "queue.declare",
            ch.queue_declare(
                "q3".into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            ),
        )
        .await,
        406,
        "PRECONDITION_FAILED - cannot declare queue 'q3': queue limit in vhost '/' (2) is reached",
    );
    let ch = env.channel().await;
    // Redeclaring an existing queue is fine at the limit.
    declare_queue(&ch, "q2").await;
    exchange(&ch, "x1", ExchangeKind::Direct, FieldTable::default()).await;
    expect_error(
        within(
            "exchange.declare",
            ch.exchange_declare(
                "x2".into(),
                ExchangeKind::Fanout,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            ),
        )
        .await,
        406,
        "PRECONDITION_FAILED - cannot declare exchange 'x2' in vhost '/': exchange limit of 1 is reached",
    );
    let ch = env.channel().await;
    bind(&ch, "q1", "x1", "a").await;
    bind(&ch, "q1", "x1", "a").await;
    expect_error(
        within(
            "queue.bind",
            ch.queue_bind(
                "q2".into(),
                "x1".into(),
                "b".into(),
                Default::default(),
                FieldTable::default(),
            ),
        )
        .await,
        406,
        "PRECONDITION_FAILED - cannot bind queue 'q2' in vhost '/' to exchange 'x1' in vhost '/': binding limit of 1 is reached",
    );
    env.stop().await;
}

#[tokio::test]
async fn hostile_topic_binding_does_not_stall_the_broker() {
    // With an exponential matcher this one message took 15 s of CPU, during which every other
    // connection stalled (the waits below are bounded by 10 s).
    let env = Env::start().await;
    let ch = env.channel().await;
    let q = declare_queue(&ch, "hostile").await;
    bind(&ch, &q, "amq.topic", "#.a.#.a.#.a.#.a.#.a.#.a.#.a.c").await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
    let miss = format!("{}b", "a.".repeat(60));
    let hit = format!("{}c", "a.".repeat(60));
    for key in [&miss, &hit] {
        publish_confirmed(&ch, "amq.topic", key, false, BasicProperties::default()).await;
    }
    // Another connection is served meanwhile and afterwards.
    let other = env.connect().await;
    let och = within("channel.open", other.create_channel())
        .await
        .expect("channel.open");
    declare_queue(&och, "other").await;
    publish(&och, "", "other", b"x").await;
    assert_eq!(drain(&och, "other").await, vec!["x"]);
    assert_eq!(drain(&ch, &q).await, vec!["m"]);
    env.stop().await;
}

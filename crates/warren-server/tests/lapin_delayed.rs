//! The delayed-message exchange (`x-delayed-message`, RabbitMQ's
//! rabbitmq_delayed_message_exchange plugin) end to end with lapin: order by due time,
//! `x-delay` edge cases, declare validation, mandatory publishes, exchange-to-exchange
//! bindings, publisher confirms, and persistent delayed messages across a restart and
//! `kill -9` of the real binary.

mod binary_support;
mod lapin_support;

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions,
    ConfirmSelectOptions, ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, ExchangeKind};
use lapin_support::*;
use std::time::{Duration, Instant};

const DELAYED: &str = "x-delayed-message";

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

fn delayed_args(inner: &str) -> FieldTable {
    table(&[("x-delayed-type", s(inner))])
}

async fn declare_delayed(ch: &Channel, name: &str, inner: &str, durable: bool) {
    within(
        "exchange.declare",
        ch.exchange_declare(
            name.into(),
            ExchangeKind::Custom(DELAYED.into()),
            ExchangeDeclareOptions {
                durable,
                ..Default::default()
            },
            delayed_args(inner),
        ),
    )
    .await
    .expect("exchange.declare x-delayed-message");
}

fn delay(v: AMQPValue) -> BasicProperties {
    BasicProperties::default().with_headers(table(&[("x-delay", v)]))
}

fn ms(n: i32) -> BasicProperties {
    delay(AMQPValue::LongInt(n))
}

/// Expects `res` to fail with `code` and exactly `text`.
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

fn x_delay(d: &lapin::message::Delivery) -> Option<AMQPValue> {
    d.properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-delay").cloned())
}

#[tokio::test]
async fn messages_arrive_in_due_order_after_their_delay() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_delayed(&ch, "dx", "direct", false).await;
    let q = declare_queue(&ch, "q").await;
    bind(&ch, &q, "dx", "k").await;
    let mut consumer = consume(&ch, &q, "c", true).await;
    let started = Instant::now();
    publish_props(&ch, "dx", "k", b"late", ms(1500)).await;
    publish_props(&ch, "dx", "k", b"early", ms(300)).await;
    publish_props(&ch, "dx", "k", b"now", BasicProperties::default()).await;
    let first = next(&mut consumer).await;
    assert_eq!(text(&first), "now");
    assert_eq!(x_delay(&first), None);
    let second = next(&mut consumer).await;
    assert_eq!(text(&second), "early");
    assert!(started.elapsed() >= Duration::from_millis(300));
    // Released with x-delay negated, as a long (RabbitMQ 4.x).
    assert_eq!(x_delay(&second), Some(AMQPValue::LongLongInt(-300)));
    let third = next(&mut consumer).await;
    assert_eq!(text(&third), "late");
    assert!(started.elapsed() >= Duration::from_millis(1500));
    assert_eq!(third.exchange.as_str(), "dx");
    assert_eq!(third.routing_key.as_str(), "k");
    env.stop().await;
}

#[tokio::test]
async fn x_delay_values_that_route_at_once() {
    // As the plugin (for RabbitMQ 4.x): 0, negative, beyond 2^32-1 ms, a signed byte, a
    // boolean: no delay. A string or double is read as a number.
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_delayed(&ch, "dx", "fanout", false).await;
    let q = declare_queue(&ch, "q").await;
    bind(&ch, &q, "dx", "").await;
    let now = [
        ("zero", AMQPValue::LongInt(0)),
        ("negative", AMQPValue::LongInt(-1000)),
        ("too-large", AMQPValue::LongLongInt(4_294_967_296)),
        ("byte", AMQPValue::ShortShortInt(100)),
        ("bool", AMQPValue::Boolean(true)),
        ("negative-string", s("-5")),
    ];
    for (body, v) in &now {
        publish_props(&ch, "dx", "", body.as_bytes(), delay(v.clone())).await;
    }
    let bodies: Vec<&str> = now.iter().map(|(b, _)| *b).collect();
    assert_eq!(drain(&ch, &q).await, bodies);
    // Held: a string and a double count as numbers (the double truncated).
    let mut consumer = consume(&ch, &q, "c", true).await;
    publish_props(&ch, "dx", "", b"string", delay(s("200"))).await;
    publish_props(&ch, "dx", "", b"double", delay(AMQPValue::Double(100.9))).await;
    publish_props(
        &ch,
        "dx",
        "",
        b"max",
        delay(AMQPValue::LongLongInt(4_294_967_295)),
    )
    .await;
    let d = next(&mut consumer).await;
    assert_eq!(
        (text(&d), x_delay(&d)),
        ("double".into(), Some(AMQPValue::LongLongInt(-100)))
    );
    let d = next(&mut consumer).await;
    assert_eq!(
        (text(&d), x_delay(&d)),
        ("string".into(), Some(AMQPValue::LongLongInt(-200)))
    );
    // The one held for 49 days stays held.
    assert_quiet(&mut consumer).await;
    env.stop().await;
}

#[tokio::test]
async fn unreadable_x_delay_fails_the_publish() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_delayed(&ch, "dx", "fanout", false).await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
    // The channel close fails the publish, or its pending confirm, whichever of lapin's tasks
    // sees it first.
    let res = match within(
        "basic.publish",
        ch.basic_publish(
            "dx".into(),
            "".into(),
            BasicPublishOptions::default(),
            b"m",
            delay(s("soon")),
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
        "PRECONDITION_FAILED - invalid 'x-delay' header 'soon': not an integer",
    );
    env.stop().await;
}

#[tokio::test]
async fn x_delayed_type_is_validated_with_the_plugin_texts() {
    let env = Env::start().await;
    for (args, text) in [
        (
            FieldTable::default(),
            "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type",
        ),
        (
            table(&[("x-delayed-type", AMQPValue::LongInt(1))]),
            "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type",
        ),
        (
            delayed_args(DELAYED),
            "PRECONDITION_FAILED - Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'",
        ),
        (
            delayed_args("nope"),
            "PRECONDITION_FAILED - unknown exchange type 'nope'",
        ),
    ] {
        let ch = env.channel().await;
        expect_error(
            within(
                "exchange.declare",
                ch.exchange_declare(
                    "dx".into(),
                    ExchangeKind::Custom(DELAYED.into()),
                    ExchangeDeclareOptions::default(),
                    args,
                ),
            )
            .await,
            406,
            text,
        );
    }
    // Every exchange type can be the delayed type; a redeclare compares only the type, the
    // flags and alternate-exchange.
    let ch = env.channel().await;
    for inner in ["direct", "fanout", "topic", "headers"] {
        declare_delayed(&ch, &format!("dx-{inner}"), inner, false).await;
    }
    declare_delayed(&ch, "dx-direct", "topic", false).await;
    env.stop().await;
}

#[tokio::test]
async fn mandatory_delayed_publish_is_returned_yet_delivered() {
    // The plugin cannot know at publish time where the message will go: a mandatory publish
    // that only reaches the delayed exchange gets basic.return 312 NO_ROUTE before its ack,
    // and the message is delivered when due all the same.
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_delayed(&ch, "dx", "direct", false).await;
    let q = declare_queue(&ch, "q").await;
    bind(&ch, &q, "dx", "k").await;
    let mut consumer = consume(&ch, &q, "c", true).await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
    let confirm = within(
        "basic.publish",
        ch.basic_publish(
            "dx".into(),
            "k".into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            b"m",
            ms(200),
        ),
    )
    .await
    .expect("basic.publish");
    match within("confirm", confirm).await.expect("confirm") {
        Confirmation::Ack(Some(ret)) => {
            assert_eq!(ret.reply_code, 312);
            assert_eq!(ret.reply_text.as_str(), "NO_ROUTE");
        }
        other => panic!("expected an ack with a returned message, got {other:?}"),
    }
    assert_eq!(text(&next(&mut consumer).await), "m");
    env.stop().await;
}

#[tokio::test]
async fn transient_delayed_message_is_confirmed_before_it_is_due() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_delayed(&ch, "dx", "fanout", false).await;
    let q = declare_queue(&ch, "q").await;
    bind(&ch, &q, "dx", "").await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
    // publish_props waits for the confirm; the message is still held (60 s).
    publish_props(&ch, "dx", "", b"m", ms(60_000)).await;
    assert!(get(&ch, &q).await.is_none());
    env.stop().await;
}

#[tokio::test]
async fn delayed_exchange_behind_an_exchange_binding() {
    // fanout f -> delayed dx (topic) -> q, and f -> direct_q: the copy through dx is held
    // and routed from dx when due, keeping the exchange and routing key it was published
    // with; the direct copy arrives at once.
    let env = Env::start().await;
    let ch = env.channel().await;
    within(
        "exchange.declare",
        ch.exchange_declare(
            "f".into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("exchange.declare");
    declare_delayed(&ch, "dx", "topic", false).await;
    within(
        "exchange.bind",
        ch.exchange_bind(
            "dx".into(),
            "f".into(),
            "".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("exchange.bind");
    let held = declare_queue(&ch, "held").await;
    let direct = declare_queue(&ch, "direct").await;
    bind(&ch, &held, "dx", "a.*").await;
    bind(&ch, &direct, "f", "").await;
    let mut consumer = consume(&ch, &held, "c", true).await;
    publish_props(&ch, "f", "a.b", b"m", ms(200)).await;
    assert_eq!(drain(&ch, &direct).await, vec!["m"]);
    let d = next(&mut consumer).await;
    assert_eq!(
        (text(&d), d.exchange.as_str(), d.routing_key.as_str()),
        ("m".to_string(), "f", "a.b")
    );
    env.stop().await;
}

// ---------------------------------------------------------------------------------------
// Persistence: the real binary, restarted and SIGKILLed.
// ---------------------------------------------------------------------------------------

use binary_support::{persistent, tempdir, Server};

async fn durable_topology(ch: &Channel) {
    declare_delayed(ch, "dur-dx", "direct", true).await;
    binary_support::declare_durable(ch, "dur-q").await;
    within(
        "queue.bind",
        ch.queue_bind(
            "dur-q".into(),
            "dur-dx".into(),
            "k".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("queue.bind");
}

fn persistent_delay(n: i32) -> BasicProperties {
    persistent().with_headers(table(&[("x-delay", AMQPValue::LongInt(n))]))
}

/// Consumes `count` messages from `dur-q` (acking them) and returns their bodies in order.
async fn receive(ch: &Channel, count: usize) -> Vec<String> {
    let mut consumer = within(
        "basic.consume",
        ch.basic_consume(
            "dur-q".into(),
            "recv".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("basic.consume");
    let mut out = Vec::new();
    while out.len() < count {
        let d = within("a delayed delivery", consumer.next())
            .await
            .expect("stream open")
            .expect("delivery");
        out.push(String::from_utf8(d.data.clone()).unwrap());
        within("basic.ack", d.ack(BasicAckOptions::default()))
            .await
            .expect("basic.ack");
    }
    out
}

#[tokio::test]
async fn persistent_delayed_messages_survive_kill_and_restart() {
    let dir = tempdir("delayed-kill");
    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    durable_topology(&ch).await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
    // Confirmed once written and fsynced; then SIGKILL before any is due.
    for (body, props) in [
        ("p-1500", persistent_delay(1500)),
        ("p-1000", persistent_delay(1000)),
        ("t-1200", ms(1200)),
        ("p-long", persistent_delay(600_000)),
    ] {
        publish_props(&ch, "dur-dx", "k", body.as_bytes(), props).await;
    }
    server.kill();

    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    // Re-armed, not flushed: the ten-minute one is still held. The persistent ones come
    // back in due order; the transient one is gone (it would have come before p-1500).
    assert_eq!(receive(&ch, 2).await, vec!["p-1000", "p-1500"]);
    assert!(within(
        "basic.get",
        ch.basic_get("dur-q".into(), BasicGetOptions { no_ack: true })
    )
    .await
    .expect("basic.get")
    .is_none());
    let _ = conn.close(200, "bye".into()).await;
    // A clean stop writes every ack (after a SIGKILL an ack not yet written would bring a
    // consumed message back, as for any queue).
    server.terminate();

    // Released messages are not released again after another restart.
    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
    publish_props(&ch, "dur-dx", "k", b"marker", persistent_delay(300)).await;
    assert_eq!(receive(&ch, 1).await, vec!["marker"]);
    let _ = conn.close(200, "bye".into()).await;
    server.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn deleted_delayed_exchange_drops_its_held_messages() {
    let dir = tempdir("delayed-deleted");
    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    durable_topology(&ch).await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
    publish_props(&ch, "dur-dx", "k", b"gone", persistent_delay(500)).await;
    within(
        "exchange.delete",
        ch.exchange_delete("dur-dx".into(), Default::default()),
    )
    .await
    .expect("exchange.delete");
    server.kill();
    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let ch = conn.create_channel().await.expect("channel");
    durable_topology(&ch).await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
    publish_props(&ch, "dur-dx", "k", b"new", persistent_delay(800)).await;
    // Only the message of the new exchange arrives (the old one was due first).
    assert_eq!(receive(&ch, 1).await, vec!["new"]);
    assert!(within(
        "basic.get",
        ch.basic_get("dur-q".into(), BasicGetOptions { no_ack: true })
    )
    .await
    .expect("basic.get")
    .is_none());
    let _ = conn.close(200, "bye".into()).await;
    server.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

//! The delivery acknowledgement timeout (RabbitMQ's `consumer_timeout`), end to end with lapin
//! on a real socket: a channel holding a delivery unacknowledged for longer than the timeout
//! is closed with RabbitMQ's 406 and reply text, and the delivery is redelivered elsewhere;
//! consumers that acknowledge in time, and auto-ack consumers, are left alone.
//!
//! Timeouts are short (300 ms to 1 s) and every wait is bounded by seconds, never asserted to
//! be fast: a channel is only required to be closed eventually, and to stay open for well
//! past its timeout when it must not be closed.

mod lapin_support;

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Consumer};
use lapin_support::*;
use std::time::Duration;
use warren_server::{Config, RunningBroker};

/// RabbitMQ's reply text for a timed-out delivery on channel `channel` (reply code 406).
fn timed_out_text(channel: u16, timeout_ms: u64) -> String {
    format!(
        "PRECONDITION_FAILED - delivery acknowledgement on channel {channel} timed out. \
         Timeout value used: {timeout_ms} ms. This timeout value can be configured, see \
         consumers doc guide to learn more"
    )
}

/// Starts a broker with `amqp.consumer_timeout = timeout_ms` and connects to it.
async fn start_with_timeout(timeout_ms: u64) -> Env {
    let mut config = Config::default();
    config.amqp.consumer_timeout = timeout_ms;
    let broker = within(
        "broker start",
        warren_server::Broker::builder()
            .config(config)
            .bind("127.0.0.1:0")
            .start(),
    )
    .await
    .expect("broker starts");
    let conn = connect(&broker).await;
    Env {
        broker: Some(broker),
        conn,
    }
}

fn broker(env: &Env) -> &RunningBroker {
    env.broker.as_ref().expect("broker running")
}

/// Declares queue `name` with `x-consumer-timeout` (ms) when given.
async fn declare_with_timeout(ch: &Channel, name: &str, timeout_ms: Option<i64>) {
    let mut args = FieldTable::default();
    if let Some(t) = timeout_ms {
        args.insert("x-consumer-timeout".into(), AMQPValue::LongLongInt(t));
    }
    within(
        "queue.declare",
        ch.queue_declare(name.into(), QueueDeclareOptions::default(), args),
    )
    .await
    .expect("queue.declare");
}

async fn consume_manual(ch: &Channel, queue: &str, tag: &str) -> Consumer {
    within("basic.qos", ch.basic_qos(10, BasicQosOptions::default()))
        .await
        .expect("basic.qos");
    consume(ch, queue, tag, false).await
}

/// Waits (bounded) for the channel close that ends `consumer`'s stream and checks its reply
/// code and text.
async fn expect_closed(consumer: &mut Consumer, text: &str) {
    let err = match within("the channel close", consumer.next()).await {
        Some(Ok(d)) => panic!(
            "expected the channel to close, got delivery {}",
            d.delivery_tag
        ),
        Some(Err(e)) => e,
        None => panic!("consumer stream ended without an error"),
    };
    match err.kind() {
        lapin::ErrorKind::ProtocolError(p) => {
            assert_eq!(p.get_id(), 406, "{err:?}");
            assert_eq!(p.get_message().as_str(), text);
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

/// Asserts that `ch` still answers (a passive declare of `queue`).
async fn assert_open(ch: &Channel, queue: &str) {
    within(
        "passive queue.declare",
        ch.queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .expect("the channel is still open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_argument_timeout_closes_the_channel_and_requeues() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_with_timeout(&ch, "slow", Some(300)).await;
    let mut consumer = consume_manual(&ch, "slow", "sleepy").await;
    publish(&ch, "", "slow", b"m1").await;
    let d = next(&mut consumer).await;
    assert_eq!(text(&d), "m1");
    assert!(!d.redelivered);
    // Not acknowledged: the channel is closed with RabbitMQ's error.
    expect_closed(&mut consumer, &timed_out_text(ch.id(), 300)).await;
    // The connection stays up; the message is back, redelivered, for another consumer.
    let ch2 = env.channel().await;
    let mut other = consume(&ch2, "slow", "other", true).await;
    let d = next(&mut other).await;
    assert_eq!(text(&d), "m1");
    assert!(d.redelivered);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_acknowledges_in_time_is_not_closed() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_with_timeout(&ch, "prompt", Some(1000)).await;
    let mut consumer = consume_manual(&ch, "prompt", "prompt").await;
    let publisher = env.channel().await;
    // Deliveries over about three timeouts, each acknowledged at once.
    for i in 0..8 {
        publish(&publisher, "", "prompt", format!("m{i}").as_bytes()).await;
        let d = next(&mut consumer).await;
        assert_eq!(text(&d), format!("m{i}"));
        within(
            "basic.ack",
            ch.basic_ack(d.delivery_tag, BasicAckOptions::default()),
        )
        .await
        .expect("basic.ack");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    // Idle with nothing unacknowledged for longer than the timeout: still open.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_open(&ch, "prompt").await;
    assert_quiet(&mut consumer).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_ack_consumers_are_never_closed() {
    let env = start_with_timeout(300).await;
    let ch = env.channel().await;
    declare_with_timeout(&ch, "auto", Some(300)).await;
    let mut consumer = consume(&ch, "auto", "auto", true).await;
    for i in 0..3 {
        publish(&ch, "", "auto", format!("m{i}").as_bytes()).await;
        assert_eq!(text(&next(&mut consumer).await), format!("m{i}"));
    }
    // Many timeouts later the channel is still open and still delivers.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_open(&ch, "auto").await;
    publish(&ch, "", "auto", b"last").await;
    assert_eq!(text(&next(&mut consumer).await), "last");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_timeout_applies_to_basic_get() {
    let env = start_with_timeout(300).await;
    let ch = env.channel().await;
    declare_queue(&ch, "got").await;
    publish(&ch, "", "got", b"g1").await;
    // A consumer on the same channel whose stream reports the channel's close.
    declare_queue(&ch, "watch").await;
    let mut watcher = consume(&ch, "watch", "watcher", true).await;
    let got = within(
        "basic.get",
        ch.basic_get("got".into(), BasicGetOptions { no_ack: false }),
    )
    .await
    .expect("basic.get")
    .expect("a message");
    assert_eq!(got.delivery.data, b"g1");
    expect_closed(&mut watcher, &timed_out_text(ch.id(), 300)).await;
    let ch2 = env.channel().await;
    let again = within(
        "basic.get",
        ch2.basic_get("got".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .expect("basic.get")
    .expect("the message is back");
    assert_eq!(again.delivery.data, b"g1");
    assert!(again.delivery.redelivered);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lower_of_argument_and_policy_applies() {
    let env = Env::start().await;
    let ch = env.channel().await;
    // The argument allows a minute; a policy lowers it to 300 ms.
    declare_with_timeout(&ch, "pol.q", Some(60_000)).await;
    let policy = warren_broker::policy::Policy::from_json(
        "short",
        &serde_json::json!({"pattern": "^pol\\.", "definition": {"consumer-timeout": 300}}),
        false,
    )
    .expect("a valid policy");
    broker(&env)
        .state()
        .broker
        .vhost("/")
        .expect("vhost /")
        .set_policy(false, policy)
        .expect("policy set");
    let mut consumer = consume_manual(&ch, "pol.q", "c").await;
    publish(&ch, "", "pol.q", b"p1").await;
    assert_eq!(text(&next(&mut consumer).await), "p1");
    expect_closed(&mut consumer, &timed_out_text(ch.id(), 300)).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_queues_time_out_on_the_channel_too() {
    let env = Env::start().await;
    let ch = env.channel().await;
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args.insert("x-consumer-timeout".into(), AMQPValue::LongInt(300));
    within(
        "queue.declare",
        ch.queue_declare(
            "qq".into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        ),
    )
    .await
    .expect("quorum queue.declare");
    let mut consumer = consume_manual(&ch, "qq", "c").await;
    publish(&ch, "", "qq", b"q1").await;
    assert_eq!(text(&next(&mut consumer).await), "q1");
    expect_closed(&mut consumer, &timed_out_text(ch.id(), 300)).await;
    let ch2 = env.channel().await;
    let mut other = consume(&ch2, "qq", "other", true).await;
    let d = next(&mut other).await;
    assert_eq!(text(&d), "q1");
    assert!(d.redelivered);
    env.stop().await;
}

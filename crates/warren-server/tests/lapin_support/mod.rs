//! Shared helpers for the `lapin_*` integration tests: a broker per test, a lapin connection to
//! it, and bounded waits so that an unresponsive broker fails a test instead of hanging it.

#![allow(dead_code)]

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, BasicPublishOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer};
use std::future::Future;
use std::time::Duration;
use warren_server::RunningBroker;

/// Upper bound for any single wait on the broker.
pub const WAIT: Duration = Duration::from_secs(10);
/// How long to watch for a delivery that must not arrive.
pub const QUIET: Duration = Duration::from_millis(300);

/// Awaits `fut`, failing the test if the broker does not answer within [`WAIT`].
pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {WAIT:?} waiting for {what}"),
    }
}

/// A running broker on an ephemeral port with one lapin connection to it.
pub struct Env {
    pub broker: Option<RunningBroker>,
    pub conn: Connection,
}

impl Env {
    /// Starts a broker and connects to it as guest.
    pub async fn start() -> Env {
        let broker = within(
            "broker start",
            warren_server::Broker::builder().bind("127.0.0.1:0").start(),
        )
        .await
        .expect("broker starts");
        let conn = connect(&broker).await;
        Env {
            broker: Some(broker),
            conn,
        }
    }

    /// A second, independent connection to the same broker.
    pub async fn connect(&self) -> Connection {
        connect(self.broker.as_ref().expect("broker running")).await
    }

    /// A new channel on the main connection.
    pub async fn channel(&self) -> Channel {
        within("channel.open", self.conn.create_channel())
            .await
            .expect("channel.open")
    }

    /// Closes the connection and stops the broker.
    pub async fn stop(mut self) {
        let _ = tokio::time::timeout(WAIT, self.conn.close(200, "bye".into())).await;
        if let Some(b) = self.broker.take() {
            within("broker shutdown", b.shutdown()).await;
        }
    }
}

/// The amqp:// URI of `broker`'s default vhost.
pub fn uri(broker: &RunningBroker) -> String {
    format!("amqp://guest:guest@{}/%2f", broker.amqp_addr())
}

/// Opens a lapin connection to `broker`.
pub async fn connect(broker: &RunningBroker) -> Connection {
    within(
        "connection handshake",
        Connection::connect(&uri(broker), ConnectionProperties::default()),
    )
    .await
    .expect("connect as guest")
}

/// Declares a non-durable, non-exclusive queue named `name` (empty for a server-named one) and
/// returns its name.
pub async fn declare_queue(ch: &Channel, name: &str) -> String {
    let q = within(
        "queue.declare",
        ch.queue_declare(
            name.into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("queue.declare");
    q.name().to_string()
}

/// Binds `queue` to `exchange` with `key` and no arguments.
pub async fn bind(ch: &Channel, queue: &str, exchange: &str, key: &str) {
    bind_args(ch, queue, exchange, key, FieldTable::default()).await;
}

/// Binds `queue` to `exchange` with `key` and `args`.
pub async fn bind_args(ch: &Channel, queue: &str, exchange: &str, key: &str, args: FieldTable) {
    within(
        "queue.bind",
        ch.queue_bind(
            queue.into(),
            exchange.into(),
            key.into(),
            QueueBindOptions::default(),
            args,
        ),
    )
    .await
    .expect("queue.bind");
}

/// Publishes `body` (waiting for the confirm when the channel is in confirm mode).
pub async fn publish(ch: &Channel, exchange: &str, key: &str, body: &[u8]) {
    publish_props(ch, exchange, key, body, BasicProperties::default()).await;
}

/// Publishes `body` with `props` (waiting for the confirm when the channel is in confirm mode).
pub async fn publish_props(
    ch: &Channel,
    exchange: &str,
    key: &str,
    body: &[u8],
    props: BasicProperties,
) {
    let confirm = within(
        "basic.publish",
        ch.basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions::default(),
            body,
            props,
        ),
    )
    .await
    .expect("basic.publish");
    within("publisher confirm", confirm)
        .await
        .expect("publisher confirm");
}

/// Puts the channel in confirm mode.
pub async fn confirm_select(ch: &Channel) {
    within(
        "confirm.select",
        ch.confirm_select(lapin::options::ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
}

/// Publishes on a channel in confirm mode and waits for the confirm; a channel.close caused by
/// the publish comes back as the error (lapin fails the publish or its pending confirm,
/// whichever of its tasks sees the close first).
pub async fn publish_outcome(
    ch: &Channel,
    exchange: &str,
    key: &str,
    body: &[u8],
    props: BasicProperties,
) -> lapin::Result<()> {
    let published = ch
        .basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions::default(),
            body,
            props,
        )
        .await;
    match published {
        Ok(pc) => within("publisher confirm", pc).await.map(|_| ()),
        Err(e) => Err(e),
    }
}

/// basic.get with no-ack: the next message's body, or `None` on get-empty.
pub async fn get(ch: &Channel, queue: &str) -> Option<Vec<u8>> {
    within(
        "basic.get",
        ch.basic_get(queue.into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .expect("basic.get")
    .map(|m| m.delivery.data)
}

/// Drains `queue` with basic.get (no-ack) and returns the bodies as strings, in order.
///
/// basic.get on the channel that published is ordered after the publishes, so this observes
/// exactly what was routed.
pub async fn drain(ch: &Channel, queue: &str) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(body) = get(ch, queue).await {
        out.push(String::from_utf8(body).expect("utf-8 body"));
        assert!(out.len() < 100_000, "queue {queue} never drains");
    }
    out
}

/// Starts a consumer (acks required unless `no_ack`).
pub async fn consume(ch: &Channel, queue: &str, tag: &str, no_ack: bool) -> Consumer {
    within(
        "basic.consume",
        ch.basic_consume(
            queue.into(),
            tag.into(),
            BasicConsumeOptions {
                no_ack,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .expect("basic.consume")
}

/// The next delivery of `consumer`.
pub async fn next(consumer: &mut Consumer) -> lapin::message::Delivery {
    within("a delivery", consumer.next())
        .await
        .expect("consumer stream ended")
        .expect("delivery error")
}

/// Asserts that `consumer` receives nothing for [`QUIET`].
pub async fn assert_quiet(consumer: &mut Consumer) {
    if let Ok(d) = tokio::time::timeout(QUIET, consumer.next()).await {
        let d = d.map(|r| {
            r.map(|d| {
                (
                    d.delivery_tag,
                    String::from_utf8_lossy(&d.data).into_owned(),
                )
            })
        });
        panic!("expected no delivery, got {d:?}");
    }
}

/// The AMQP reply code of a channel or connection error.
pub fn reply_code(err: &lapin::Error) -> u16 {
    match err.kind() {
        lapin::ErrorKind::ProtocolError(e) => e.get_id(),
        other => panic!("expected an AMQP protocol error, got {other:?}"),
    }
}

/// Expects `res` to fail with AMQP reply code `code`.
pub fn expect_code<T: std::fmt::Debug>(res: lapin::Result<T>, code: u16) {
    match res {
        Ok(v) => panic!("expected error {code}, got Ok({v:?})"),
        Err(e) => assert_eq!(reply_code(&e), code, "unexpected error {e:?}"),
    }
}

/// Body as a string.
pub fn text(d: &lapin::message::Delivery) -> String {
    String::from_utf8(d.data.clone()).expect("utf-8 body")
}

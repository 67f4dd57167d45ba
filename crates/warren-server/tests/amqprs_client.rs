//! End-to-end tests with the `amqprs` client: the basics of every class, publisher confirms,
//! transactions, and each soft error as RabbitMQ reports it (channel.close with its code, reply
//! text, class and method, while the connection stays usable on other channels).

use amqprs::callbacks::ChannelCallback;
use amqprs::channel::{
    BasicAckArguments, BasicConsumeArguments, BasicGetArguments, BasicPublishArguments,
    BasicQosArguments, Channel, ConfirmSelectArguments, ConsumerMessage, ExchangeBindArguments,
    ExchangeDeclareArguments, ExchangeDeleteArguments, QueueBindArguments, QueueDeclareArguments,
    QueueDeleteArguments, QueuePurgeArguments, QueueUnbindArguments,
};
use amqprs::connection::{Connection, OpenConnectionArguments};
use amqprs::{Ack, BasicProperties, Cancel, CloseChannel, Nack, Return};
use async_trait::async_trait;
use std::future::Future;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::timeout;
use warren_server::{Broker, RunningBroker};

/// Upper bound for any single wait on the broker.
const WAIT: Duration = Duration::from_secs(5);

async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

async fn broker() -> RunningBroker {
    within(
        "broker start",
        Broker::builder().bind("127.0.0.1:0").start(),
    )
    .await
    .expect("broker start")
}

async fn stop(b: RunningBroker) {
    timeout(Duration::from_secs(20), b.shutdown())
        .await
        .expect("broker shutdown timed out");
}

async fn connect(b: &RunningBroker) -> Connection {
    let addr = b.amqp_addr();
    let args = OpenConnectionArguments::new(&addr.ip().to_string(), addr.port(), "guest", "guest");
    within("connection open", Connection::open(&args))
        .await
        .expect("connection open")
}

/// What the broker told a channel asynchronously.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    Closed {
        code: u16,
        text: String,
        class_id: u16,
        method_id: u16,
    },
    Ack {
        tag: u64,
        multiple: bool,
    },
    Nack {
        tag: u64,
    },
    Returned {
        code: u16,
    },
    Cancelled,
}

struct Recorder(mpsc::UnboundedSender<Event>);

#[async_trait]
impl ChannelCallback for Recorder {
    async fn close(&mut self, _: &Channel, c: CloseChannel) -> Result<(), amqprs::error::Error> {
        let _ = self.0.send(Event::Closed {
            code: c.reply_code(),
            text: c.reply_text().clone(),
            class_id: c.class_id(),
            method_id: c.method_id(),
        });
        Ok(())
    }
    async fn cancel(&mut self, _: &Channel, _: Cancel) -> Result<(), amqprs::error::Error> {
        let _ = self.0.send(Event::Cancelled);
        Ok(())
    }
    async fn flow(&mut self, _: &Channel, active: bool) -> Result<bool, amqprs::error::Error> {
        Ok(active)
    }
    async fn publish_ack(&mut self, _: &Channel, ack: Ack) {
        let _ = self.0.send(Event::Ack {
            tag: ack.delivery_tag(),
            multiple: ack.mutiple(),
        });
    }
    async fn publish_nack(&mut self, _: &Channel, nack: Nack) {
        let _ = self.0.send(Event::Nack {
            tag: nack.delivery_tag(),
        });
    }
    async fn publish_return(&mut self, _: &Channel, r: Return, _: BasicProperties, _: Vec<u8>) {
        let _ = self.0.send(Event::Returned {
            code: r.reply_code(),
        });
    }
}

/// A channel with a [`Recorder`] callback and the receiving end of its events.
async fn channel(conn: &Connection) -> (Channel, mpsc::UnboundedReceiver<Event>) {
    let ch = within("channel open", conn.open_channel(None))
        .await
        .expect("channel open");
    let (tx, rx) = mpsc::unbounded_channel();
    within("register callback", ch.register_callback(Recorder(tx)))
        .await
        .expect("register callback");
    (ch, rx)
}

async fn next_event(rx: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    within("channel event", rx.recv())
        .await
        .expect("event stream ended")
}

/// Expects channel.close from the broker with exactly this code, text, class and method.
async fn expect_closed(
    rx: &mut mpsc::UnboundedReceiver<Event>,
    code: u16,
    text: &str,
    class_id: u16,
    method_id: u16,
) {
    assert_eq!(
        next_event(rx).await,
        Event::Closed {
            code,
            text: text.to_string(),
            class_id,
            method_id,
        }
    );
}

/// The connection is still usable: a fresh channel declares, publishes and gets.
async fn assert_connection_usable(conn: &Connection) {
    assert!(conn.is_open(), "connection was closed");
    let (ch, _rx) = channel(conn).await;
    let q = format!("probe-{}", ch.channel_id());
    within("declare", ch.queue_declare(QueueDeclareArguments::new(&q)))
        .await
        .expect("declare on a fresh channel");
    publish(&ch, "", &q, b"probe").await;
    let got = get(&ch, &q).await.expect("probe message");
    assert_eq!(got, b"probe");
    within("channel close", ch.close())
        .await
        .expect("channel close");
}

async fn publish(ch: &Channel, exchange: &str, routing_key: &str, body: &[u8]) {
    within(
        "publish",
        ch.basic_publish(
            BasicProperties::default(),
            body.to_vec(),
            BasicPublishArguments::new(exchange, routing_key),
        ),
    )
    .await
    .expect("publish");
}

/// basic.get with auto-ack; the body, if a message was there.
async fn get(ch: &Channel, queue: &str) -> Option<Vec<u8>> {
    let mut args = BasicGetArguments::new(queue);
    args.no_ack(true);
    within("get", ch.basic_get(args))
        .await
        .expect("get")
        .map(|(_, _, body)| body)
}

async fn declare(ch: &Channel, queue: &str) {
    within(
        "declare",
        ch.queue_declare(QueueDeclareArguments::new(queue)),
    )
    .await
    .expect("queue declare");
}

async fn next_delivery(rx: &mut mpsc::UnboundedReceiver<ConsumerMessage>) -> (u64, Vec<u8>) {
    let m = within("delivery", rx.recv())
        .await
        .expect("consumer stream ended");
    (
        m.deliver.expect("deliver").delivery_tag(),
        m.content.expect("content"),
    )
}

// ---------------------------------------------------------------------------------------------
// Basics

#[tokio::test]
async fn connection_and_channel_open_close() {
    let b = broker().await;
    let conn = connect(&b).await;
    assert!(conn.is_open());
    assert_eq!(conn.server_properties().product(), "Warren");
    assert!(conn.server_properties().capabilities().publisher_confirms());
    let (ch1, _) = channel(&conn).await;
    let (ch2, _) = channel(&conn).await;
    assert_ne!(ch1.channel_id(), ch2.channel_id());
    within("close ch1", ch1.close()).await.expect("close ch1");
    declare(&ch2, "still-open").await;
    within("close ch2", ch2.close()).await.expect("close ch2");
    within("connection close", conn.close())
        .await
        .expect("connection close");
    // A new connection after a clean close works.
    let conn = connect(&b).await;
    assert_connection_usable(&conn).await;
    stop(b).await;
}

#[tokio::test]
async fn exchange_queue_declare_bind_unbind_delete() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, _rx) = channel(&conn).await;
    within(
        "exchange declare",
        ch.exchange_declare(ExchangeDeclareArguments::new("logs", "topic")),
    )
    .await
    .expect("exchange declare");
    within(
        "exchange declare",
        ch.exchange_declare(ExchangeDeclareArguments::new("fanout-x", "fanout")),
    )
    .await
    .expect("exchange declare");
    // Redeclaring with the same attributes is fine.
    within(
        "exchange redeclare",
        ch.exchange_declare(ExchangeDeclareArguments::new("logs", "topic")),
    )
    .await
    .expect("exchange redeclare");
    let (name, messages, consumers) = within(
        "queue declare",
        ch.queue_declare(QueueDeclareArguments::new("errors")),
    )
    .await
    .expect("queue declare")
    .expect("declare-ok");
    assert_eq!((name.as_str(), messages, consumers), ("errors", 0, 0));
    // Server-named queue.
    let (generated, _, _) = within(
        "server-named declare",
        ch.queue_declare(QueueDeclareArguments::exclusive_server_named()),
    )
    .await
    .expect("declare")
    .expect("declare-ok");
    assert!(generated.starts_with("amq.gen-"), "{generated}");

    within(
        "bind",
        ch.queue_bind(QueueBindArguments::new("errors", "logs", "*.error")),
    )
    .await
    .expect("bind");
    within(
        "exchange bind",
        ch.exchange_bind(ExchangeBindArguments::new("logs", "fanout-x", "")),
    )
    .await
    .expect("exchange bind");
    publish(&ch, "logs", "app.error", b"e1").await;
    publish(&ch, "logs", "app.info", b"i1").await;
    publish(&ch, "fanout-x", "whatever", b"via-e2e").await;
    assert_eq!(get(&ch, "errors").await.as_deref(), Some(&b"e1"[..]));
    // fanout-x → logs with routing key "whatever" does not match "*.error".
    assert_eq!(get(&ch, "errors").await, None);

    within(
        "unbind",
        ch.queue_unbind(QueueUnbindArguments::new("errors", "logs", "*.error")),
    )
    .await
    .expect("unbind");
    publish(&ch, "logs", "app.error", b"e2").await;
    publish(&ch, "", "errors", b"direct").await;
    assert_eq!(get(&ch, "errors").await.as_deref(), Some(&b"direct"[..]));

    publish(&ch, "", "errors", b"x").await;
    publish(&ch, "", "errors", b"y").await;
    let purged = within("purge", ch.queue_purge(QueuePurgeArguments::new("errors")))
        .await
        .expect("purge");
    assert_eq!(purged, Some(2));
    publish(&ch, "", "errors", b"z").await;
    let deleted = within(
        "queue delete",
        ch.queue_delete(QueueDeleteArguments::new("errors")),
    )
    .await
    .expect("queue delete");
    assert_eq!(deleted, Some(1));
    within(
        "exchange delete",
        ch.exchange_delete(ExchangeDeleteArguments::new("logs")),
    )
    .await
    .expect("exchange delete");
    // The exchange is gone: a passive declare now fails with 404.
    let mut passive = ExchangeDeclareArguments::new("logs", "topic");
    passive.passive(true);
    let (ch2, mut rx2) = channel(&conn).await;
    assert!(within("passive", ch2.exchange_declare(passive))
        .await
        .is_err());
    expect_closed(
        &mut rx2,
        404,
        "NOT_FOUND - no exchange 'logs' in vhost '/'",
        40,
        10,
    )
    .await;
    assert_connection_usable(&conn).await;
    stop(b).await;
}

#[tokio::test]
async fn publish_consume_ack_and_redelivery() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, _ev) = channel(&conn).await;
    declare(&ch, "work").await;
    within("qos", ch.basic_qos(BasicQosArguments::new(0, 10, false)))
        .await
        .expect("qos");
    let mut args = BasicConsumeArguments::new("work", "worker");
    args.manual_ack(true);
    let (tag, mut rx) = within("consume", ch.basic_consume_rx(args))
        .await
        .expect("consume");
    assert_eq!(tag, "worker");
    for i in 0..3u8 {
        publish(&ch, "", "work", &[b'm', b'0' + i]).await;
    }
    let mut tags = Vec::new();
    for i in 0..3u8 {
        let (t, body) = next_delivery(&mut rx).await;
        assert_eq!(body, [b'm', b'0' + i], "in publish order");
        tags.push(t);
    }
    assert_eq!(tags, [1, 2, 3]);
    // Ack the first two at once; the third stays unacked and is requeued when the channel
    // closes.
    within("ack", ch.basic_ack(BasicAckArguments::new(2, true)))
        .await
        .expect("ack");
    within("close", ch.close()).await.expect("channel close");
    let (ch2, _ev2) = channel(&conn).await;
    let mut args = BasicGetArguments::new("work");
    args.no_ack(true);
    let (get_ok, _, body) = within("get", ch2.basic_get(args))
        .await
        .expect("get")
        .expect("the unacked message was requeued");
    assert_eq!(body, b"m2");
    assert!(get_ok.redelivered());
    assert_eq!(get(&ch2, "work").await, None);
    stop(b).await;
}

#[tokio::test]
async fn publisher_confirms_ack_with_multiple() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, mut ev) = channel(&conn).await;
    declare(&ch, "confirmed").await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectArguments::default()),
    )
    .await
    .expect("confirm.select");
    const N: u64 = 50;
    for _ in 0..N {
        publish(&ch, "", "confirmed", b"c").await;
    }
    // Confirms arrive in order, cover every sequence number exactly once, and at least one
    // basic.ack covers several messages (multiple=true).
    let mut confirmed = 0;
    let mut saw_multiple = false;
    while confirmed < N {
        match next_event(&mut ev).await {
            Event::Ack { tag, multiple } => {
                if multiple {
                    assert!(tag > confirmed + 1, "multiple ack for a single message");
                    saw_multiple = true;
                } else {
                    assert_eq!(tag, confirmed + 1);
                }
                confirmed = tag;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(confirmed, N);
    assert!(
        saw_multiple,
        "50 back-to-back publishes were all acked singly"
    );
    let (_, count, _) = within(
        "passive declare",
        ch.queue_declare({
            let mut a = QueueDeclareArguments::new("confirmed");
            a.passive(true);
            a
        }),
    )
    .await
    .expect("declare")
    .expect("declare-ok");
    assert_eq!(count as u64, N);
    stop(b).await;
}

#[tokio::test]
async fn tx_commit_and_rollback() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, _ev) = channel(&conn).await;
    let (observer, _ev2) = channel(&conn).await;
    declare(&ch, "txq").await;
    within("tx.select", ch.tx_select())
        .await
        .expect("tx.select");

    publish(&ch, "", "txq", b"rolled-back").await;
    within("tx.rollback", ch.tx_rollback())
        .await
        .expect("tx.rollback");
    assert_eq!(get(&observer, "txq").await, None);

    publish(&ch, "", "txq", b"committed").await;
    // Not visible before commit.
    assert_eq!(get(&observer, "txq").await, None);
    within("tx.commit", ch.tx_commit())
        .await
        .expect("tx.commit");
    assert_eq!(
        get(&observer, "txq").await.as_deref(),
        Some(&b"committed"[..])
    );

    // Acks are transactional too: a rolled-back ack leaves the message unacked.
    publish(&observer, "", "txq", b"to-ack").await;
    let (get_ok, _, _) = within("get", ch.basic_get(BasicGetArguments::new("txq")))
        .await
        .expect("get")
        .expect("message");
    let tag = get_ok.delivery_tag();
    within("ack", ch.basic_ack(BasicAckArguments::new(tag, false)))
        .await
        .expect("ack");
    within("tx.rollback", ch.tx_rollback())
        .await
        .expect("tx.rollback");
    within("ack", ch.basic_ack(BasicAckArguments::new(tag, false)))
        .await
        .expect("ack");
    within("tx.commit", ch.tx_commit())
        .await
        .expect("tx.commit");
    within("close", ch.close()).await.expect("close");
    // Committed ack: nothing is requeued by the close.
    assert_eq!(get(&observer, "txq").await, None);
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// Soft errors: 404

#[tokio::test]
async fn publish_to_missing_exchange_is_not_found() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, mut ev) = channel(&conn).await;
    publish(&ch, "x", "rk", b"lost").await;
    expect_closed(
        &mut ev,
        404,
        "NOT_FOUND - no exchange 'x' in vhost '/'",
        60,
        40,
    )
    .await;
    assert_connection_usable(&conn).await;
    stop(b).await;
}

#[tokio::test]
async fn passive_declare_of_missing_queue_is_not_found() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, mut ev) = channel(&conn).await;
    let mut args = QueueDeclareArguments::new("nowhere");
    args.passive(true);
    assert!(within("passive declare", ch.queue_declare(args))
        .await
        .is_err());
    expect_closed(
        &mut ev,
        404,
        "NOT_FOUND - no queue 'nowhere' in vhost '/'",
        50,
        10,
    )
    .await;
    assert_connection_usable(&conn).await;
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// Soft errors: 403

#[tokio::test]
async fn reserved_amq_prefix_is_access_refused() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, mut ev) = channel(&conn).await;
    assert!(within(
        "declare amq.foo",
        ch.exchange_declare(ExchangeDeclareArguments::new("amq.foo", "direct"))
    )
    .await
    .is_err());
    expect_closed(
        &mut ev,
        403,
        "ACCESS_REFUSED - exchange name 'amq.foo' contains reserved prefix 'amq.*'",
        40,
        10,
    )
    .await;
    let (ch, mut ev) = channel(&conn).await;
    assert!(within(
        "declare amq.foo queue",
        ch.queue_declare(QueueDeclareArguments::new("amq.foo"))
    )
    .await
    .is_err());
    expect_closed(
        &mut ev,
        403,
        "ACCESS_REFUSED - queue name 'amq.foo' contains reserved prefix 'amq.*'",
        50,
        10,
    )
    .await;
    assert_connection_usable(&conn).await;
    stop(b).await;
}

#[tokio::test]
async fn bind_to_default_exchange_is_access_refused() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, mut ev) = channel(&conn).await;
    declare(&ch, "q").await;
    assert!(
        within("bind", ch.queue_bind(QueueBindArguments::new("q", "", "q")))
            .await
            .is_err()
    );
    expect_closed(
        &mut ev,
        403,
        "ACCESS_REFUSED - operation not permitted on the default exchange",
        50,
        20,
    )
    .await;
    assert_connection_usable(&conn).await;
    stop(b).await;
}

#[tokio::test]
async fn exclusive_consumer_conflict_is_access_refused() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, _ev) = channel(&conn).await;
    declare(&ch, "solo").await;
    let mut args = BasicConsumeArguments::new("solo", "first");
    args.exclusive(true);
    let (_tag, _rx) = within("exclusive consume", ch.basic_consume_rx(args))
        .await
        .expect("exclusive consume");
    let (ch2, mut ev2) = channel(&conn).await;
    assert!(within(
        "second consume",
        ch2.basic_consume_rx(BasicConsumeArguments::new("solo", "second"))
    )
    .await
    .is_err());
    expect_closed(
        &mut ev2,
        403,
        "ACCESS_REFUSED - queue 'solo' in vhost '/' in exclusive use",
        60,
        20,
    )
    .await;
    assert_connection_usable(&conn).await;
    // The exclusive consumer still receives.
    publish(&ch, "", "solo", b"mine").await;
    let mut rx = _rx;
    assert_eq!(next_delivery(&mut rx).await.1, b"mine");
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// Soft errors: 405

#[tokio::test]
async fn exclusive_queue_of_another_connection_is_resource_locked() {
    let b = broker().await;
    let owner = connect(&b).await;
    let (och, _oev) = channel(&owner).await;
    let mut args = QueueDeclareArguments::new("mine");
    args.exclusive(true);
    within("exclusive declare", och.queue_declare(args))
        .await
        .expect("exclusive declare");

    let other = connect(&b).await;
    let locked = "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'mine' in \
                  vhost '/'. It could be originally declared on another connection or the \
                  exclusive property value does not match that of the original declaration.";
    let (ch, mut ev) = channel(&other).await;
    assert!(within(
        "consume",
        ch.basic_consume_rx(BasicConsumeArguments::new("mine", ""))
    )
    .await
    .is_err());
    expect_closed(&mut ev, 405, locked, 60, 20).await;

    let (ch, mut ev) = channel(&other).await;
    assert!(
        within("delete", ch.queue_delete(QueueDeleteArguments::new("mine")))
            .await
            .is_err()
    );
    expect_closed(&mut ev, 405, locked, 50, 40).await;

    let (ch, mut ev) = channel(&other).await;
    let mut args = QueueDeclareArguments::new("mine");
    args.passive(true);
    assert!(within("passive declare", ch.queue_declare(args))
        .await
        .is_err());
    expect_closed(&mut ev, 405, locked, 50, 10).await;

    assert_connection_usable(&other).await;
    // The owner is unaffected.
    publish(&och, "", "mine", b"ok").await;
    assert_eq!(get(&och, "mine").await.as_deref(), Some(&b"ok"[..]));
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// Soft errors: 406

#[tokio::test]
async fn unknown_delivery_tag_is_precondition_failed() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, mut ev) = channel(&conn).await;
    within("ack", ch.basic_ack(BasicAckArguments::new(99, false)))
        .await
        .expect("ack is asynchronous");
    expect_closed(
        &mut ev,
        406,
        "PRECONDITION_FAILED - unknown delivery tag 99",
        60,
        80,
    )
    .await;
    assert_connection_usable(&conn).await;
    stop(b).await;
}

#[tokio::test]
async fn inequivalent_durable_is_precondition_failed() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, mut ev) = channel(&conn).await;
    declare(&ch, "transient").await;
    assert!(within(
        "durable redeclare",
        ch.queue_declare(QueueDeclareArguments::durable_client_named("transient"))
    )
    .await
    .is_err());
    expect_closed(
        &mut ev,
        406,
        "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'transient' in vhost '/': \
         received 'true' but current is 'false'",
        50,
        10,
    )
    .await;

    let (ch, mut ev) = channel(&conn).await;
    within(
        "exchange",
        ch.exchange_declare(ExchangeDeclareArguments::new("ex-t", "direct")),
    )
    .await
    .expect("exchange declare");
    let mut durable = ExchangeDeclareArguments::new("ex-t", "direct");
    durable.durable(true);
    assert!(within("durable exchange", ch.exchange_declare(durable))
        .await
        .is_err());
    expect_closed(
        &mut ev,
        406,
        "PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'ex-t' in vhost '/': \
         received 'true' but current is 'false'",
        40,
        10,
    )
    .await;
    assert_connection_usable(&conn).await;
    stop(b).await;
}

#[tokio::test]
async fn queue_delete_if_unused_and_if_empty_are_precondition_failed() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, _ev) = channel(&conn).await;
    declare(&ch, "busy").await;
    let (_tag, _rx) = within(
        "consume",
        ch.basic_consume_rx(BasicConsumeArguments::new("busy", "c")),
    )
    .await
    .expect("consume");
    let (ch2, mut ev2) = channel(&conn).await;
    let mut args = QueueDeleteArguments::new("busy");
    args.if_unused(true);
    assert!(within("delete if-unused", ch2.queue_delete(args))
        .await
        .is_err());
    expect_closed(
        &mut ev2,
        406,
        "PRECONDITION_FAILED - queue 'busy' in vhost '/' in use",
        50,
        40,
    )
    .await;

    let (ch3, mut ev3) = channel(&conn).await;
    declare(&ch3, "full").await;
    publish(&ch3, "", "full", b"x").await;
    let mut args = QueueDeleteArguments::new("full");
    args.if_empty(true);
    assert!(within("delete if-empty", ch3.queue_delete(args))
        .await
        .is_err());
    expect_closed(
        &mut ev3,
        406,
        "PRECONDITION_FAILED - queue 'full' in vhost '/' not empty",
        50,
        40,
    )
    .await;
    assert_connection_usable(&conn).await;
    // Both queues survived.
    let (ch4, _ev4) = channel(&conn).await;
    assert_eq!(get(&ch4, "full").await.as_deref(), Some(&b"x"[..]));
    stop(b).await;
}

#[tokio::test]
async fn tx_commit_on_non_tx_channel_is_precondition_failed() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, mut ev) = channel(&conn).await;
    assert!(within("tx.commit", ch.tx_commit()).await.is_err());
    expect_closed(
        &mut ev,
        406,
        "PRECONDITION_FAILED - channel is not transactional",
        90,
        20,
    )
    .await;
    let (ch, mut ev) = channel(&conn).await;
    assert!(within("tx.rollback", ch.tx_rollback()).await.is_err());
    expect_closed(
        &mut ev,
        406,
        "PRECONDITION_FAILED - channel is not transactional",
        90,
        30,
    )
    .await;
    assert_connection_usable(&conn).await;
    stop(b).await;
}

#[tokio::test]
async fn confirm_select_after_tx_select_is_precondition_failed() {
    let b = broker().await;
    let conn = connect(&b).await;
    let (ch, mut ev) = channel(&conn).await;
    within("tx.select", ch.tx_select())
        .await
        .expect("tx.select");
    assert!(within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectArguments::default())
    )
    .await
    .is_err());
    expect_closed(
        &mut ev,
        406,
        "PRECONDITION_FAILED - cannot switch from tx to confirm mode",
        85,
        10,
    )
    .await;
    let (ch, mut ev) = channel(&conn).await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectArguments::default()),
    )
    .await
    .expect("confirm.select");
    assert!(within("tx.select", ch.tx_select()).await.is_err());
    expect_closed(
        &mut ev,
        406,
        "PRECONDITION_FAILED - cannot switch from confirm to tx mode",
        90,
        10,
    )
    .await;
    assert_connection_usable(&conn).await;
    stop(b).await;
}

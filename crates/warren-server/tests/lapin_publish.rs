//! Publishing through lapin: mandatory returns, publisher confirms, transactions, content split
//! across frames, empty bodies, and basic properties / header tables surviving the broker.

mod lapin_support;

use lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};
use lapin::{BasicProperties, Channel, Confirmation};
use lapin_support::*;

async fn confirm_select(ch: &Channel) {
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
}

/// Publishes and returns the broker's confirmation.
async fn publish_confirmed(
    ch: &Channel,
    exchange: &str,
    key: &str,
    mandatory: bool,
    body: &[u8],
    props: BasicProperties,
) -> Confirmation {
    let pc = within(
        "basic.publish",
        ch.basic_publish(
            exchange.into(),
            key.into(),
            BasicPublishOptions {
                mandatory,
                ..Default::default()
            },
            body,
            props,
        ),
    )
    .await
    .expect("basic.publish");
    within("publisher confirm", pc)
        .await
        .expect("publisher confirm")
}

#[tokio::test]
async fn mandatory_without_route_is_returned_with_312() {
    let env = Env::start().await;
    let ch = env.channel().await;
    confirm_select(&ch).await;
    declare_queue(&ch, "exists").await;
    let props = BasicProperties::default()
        .with_message_id("m-1".into())
        .with_content_type("text/plain".into());
    match publish_confirmed(&ch, "amq.direct", "nowhere", true, b"bounce", props.clone()).await {
        Confirmation::Ack(Some(ret)) => {
            assert_eq!(ret.reply_code, 312);
            assert_eq!(ret.reply_text.as_str(), "NO_ROUTE");
            assert_eq!(ret.delivery.exchange.as_str(), "amq.direct");
            assert_eq!(ret.delivery.routing_key.as_str(), "nowhere");
            assert_eq!(ret.delivery.data, b"bounce");
            assert_eq!(ret.delivery.properties, props);
        }
        other => panic!("expected basic.return then ack, got {other:?}"),
    }
    // Through the default exchange to a missing queue, too.
    match publish_confirmed(&ch, "", "no-such-queue", true, b"x", Default::default()).await {
        Confirmation::Ack(Some(ret)) => assert_eq!(ret.reply_code, 312),
        other => panic!("expected basic.return then ack, got {other:?}"),
    }
    // Routable mandatory messages and unroutable non-mandatory ones are simply acked.
    let c = publish_confirmed(&ch, "", "exists", true, b"ok", Default::default()).await;
    assert!(matches!(c, Confirmation::Ack(None)), "{c:?}");
    let c = publish_confirmed(
        &ch,
        "amq.direct",
        "nowhere",
        false,
        b"x",
        Default::default(),
    )
    .await;
    assert!(matches!(c, Confirmation::Ack(None)), "{c:?}");
    assert_eq!(drain(&ch, "exists").await, vec!["ok"]);
    env.stop().await;
}

#[tokio::test]
async fn mandatory_return_without_confirms() {
    let env = Env::start().await;
    let ch = env.channel().await;
    within(
        "basic.publish",
        ch.basic_publish(
            "amq.topic".into(),
            "a.b".into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            b"back",
            BasicProperties::default(),
        ),
    )
    .await
    .expect("publish");
    // A synchronous round trip: the return precedes its reply.
    declare_queue(&ch, "sync").await;
    let returned = within("returned messages", ch.wait_for_confirms())
        .await
        .expect("returned messages");
    assert_eq!(returned.len(), 1, "{returned:?}");
    assert_eq!(returned[0].reply_code, 312);
    assert_eq!(returned[0].delivery.data, b"back");
    env.stop().await;
}

#[tokio::test]
async fn publish_to_missing_exchange_closes_channel_with_404() {
    let env = Env::start().await;
    let ch = env.channel().await;
    // In confirm mode the pending confirm fails with the channel's close reason, whichever of
    // lapin's tasks sees the channel.close first.
    confirm_select(&ch).await;
    let res = match ch
        .basic_publish(
            "no-such-exchange".into(),
            "k".into(),
            BasicPublishOptions::default(),
            b"x",
            BasicProperties::default(),
        )
        .await
    {
        Ok(pc) => within("confirm", pc).await.map(|_| ()),
        Err(e) => Err(e),
    };
    expect_code(res, 404);
    // The connection survives a channel error.
    let ch = env.channel().await;
    declare_queue(&ch, "q").await;
    env.stop().await;
}

#[tokio::test]
async fn every_publish_is_confirmed() {
    let env = Env::start().await;
    let ch = env.channel().await;
    confirm_select(&ch).await;
    declare_queue(&ch, "c").await;
    let mut pending = Vec::new();
    for i in 0..200 {
        let key = if i % 2 == 0 { "c" } else { "unroutable" };
        pending.push(
            within(
                "basic.publish",
                ch.basic_publish(
                    "".into(),
                    key.into(),
                    BasicPublishOptions::default(),
                    format!("{i}").as_bytes(),
                    BasicProperties::default(),
                ),
            )
            .await
            .expect("publish"),
        );
    }
    for (i, pc) in pending.into_iter().enumerate() {
        let c = within("confirm", pc).await.expect("confirm");
        assert!(c.is_ack(), "publish {i}: {c:?}");
    }
    let returned = within("wait_for_confirms", ch.wait_for_confirms())
        .await
        .expect("wait_for_confirms");
    assert!(returned.is_empty());
    let q = within(
        "queue.declare",
        ch.queue_declare("c".into(), Default::default(), FieldTable::default()),
    )
    .await
    .unwrap();
    assert_eq!(q.message_count(), 100);
    // confirm.select is idempotent; tx.select on a confirm channel is refused.
    confirm_select(&ch).await;
    expect_code(within("tx.select", ch.tx_select()).await, 406);
    env.stop().await;
}

#[tokio::test]
async fn transactional_publishes_are_invisible_until_commit() {
    let env = Env::start().await;
    let tx = env.channel().await;
    let obs = env.channel().await;
    declare_queue(&obs, "t").await;
    within("tx.select", tx.tx_select())
        .await
        .expect("tx.select");
    for i in 0..3 {
        publish(&tx, "", "t", format!("{i}").as_bytes()).await;
    }
    // Make sure the broker has seen the publishes: a synchronous method on the tx channel.
    declare_queue(&tx, "t").await;
    assert!(
        get(&obs, "t").await.is_none(),
        "uncommitted publish visible"
    );
    within("tx.commit", tx.tx_commit()).await.expect("commit");
    assert_eq!(drain(&obs, "t").await, vec!["0", "1", "2"]);

    // Rolled back publishes are discarded for good.
    publish(&tx, "", "t", b"rolled-back").await;
    within("tx.rollback", tx.tx_rollback())
        .await
        .expect("rollback");
    within("tx.commit", tx.tx_commit()).await.expect("commit");
    assert!(get(&obs, "t").await.is_none());

    // The channel stays transactional after commit and rollback.
    publish(&tx, "", "t", b"late").await;
    declare_queue(&tx, "t").await;
    assert!(get(&obs, "t").await.is_none());
    within("tx.commit", tx.tx_commit()).await.expect("commit");
    assert_eq!(drain(&obs, "t").await, vec!["late"]);
    env.stop().await;
}

#[tokio::test]
async fn transactional_acks() {
    let env = Env::start().await;
    let obs = env.channel().await;
    declare_queue(&obs, "ta").await;
    for i in 0..2 {
        publish(&obs, "", "ta", format!("{i}").as_bytes()).await;
    }

    let tx = env.channel().await;
    within("tx.select", tx.tx_select())
        .await
        .expect("tx.select");
    let m0 = within("get", tx.basic_get("ta".into(), BasicGetOptions::default()))
        .await
        .unwrap()
        .expect("m0");
    let m1 = within("get", tx.basic_get("ta".into(), BasicGetOptions::default()))
        .await
        .unwrap()
        .expect("m1");
    // Ack m0 and roll back: the ack is discarded, m0 stays unacked.
    within(
        "basic.ack",
        tx.basic_ack(m0.delivery.delivery_tag, Default::default()),
    )
    .await
    .unwrap();
    within("tx.rollback", tx.tx_rollback()).await.unwrap();
    // Ack m1 and commit: m1 is gone for good.
    within(
        "basic.ack",
        tx.basic_ack(m1.delivery.delivery_tag, Default::default()),
    )
    .await
    .unwrap();
    within("tx.commit", tx.tx_commit()).await.unwrap();
    // Closing the channel requeues what is still unacked: m0 only.
    within("channel.close", tx.close(200, "bye".into()))
        .await
        .unwrap();
    let m = within(
        "get",
        obs.basic_get("ta".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .unwrap()
    .expect("m0 requeued");
    assert_eq!(m.delivery.data, b"0");
    assert!(m.delivery.redelivered);
    assert!(get(&obs, "ta").await.is_none());
    env.stop().await;
}

#[tokio::test]
async fn tx_methods_on_a_non_transactional_channel_are_refused() {
    let env = Env::start().await;
    let ch = env.channel().await;
    expect_code(within("tx.commit", ch.tx_commit()).await, 406);
    let ch = env.channel().await;
    expect_code(within("tx.rollback", ch.tx_rollback()).await, 406);
    let ch = env.channel().await;
    within("tx.select", ch.tx_select()).await.unwrap();
    expect_code(
        within(
            "confirm.select",
            ch.confirm_select(ConfirmSelectOptions::default()),
        )
        .await,
        406,
    );
    env.stop().await;
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_be_bytes()[0] ^ seed)
        .collect()
}

#[tokio::test]
async fn large_bodies_span_frames_intact() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "big").await;
    let frame_max = env.conn.configuration().frame_max() as usize;
    assert!(frame_max >= 4096, "frame_max {frame_max}");
    // Payload per body frame is frame_max - 8.
    let per_frame = frame_max - 8;
    let sizes = [
        1 << 20,
        300 * 1024,
        per_frame - 1,
        per_frame,
        per_frame + 1,
        2 * per_frame,
        2 * per_frame + 1,
        1,
    ];
    for (i, &n) in sizes.iter().enumerate() {
        publish(&ch, "", "big", &pattern(n, i as u8)).await;
    }
    // Through basic.get...
    for (i, &n) in sizes.iter().enumerate().take(4) {
        let body = get(&ch, "big").await.expect("message");
        assert_eq!(body.len(), n, "message {i}");
        assert!(body == pattern(n, i as u8), "message {i} corrupted");
    }
    // ...and through a consumer.
    let mut c = consume(&ch, "big", "c", true).await;
    for (i, &n) in sizes.iter().enumerate().skip(4) {
        let d = next(&mut c).await;
        assert_eq!(d.data.len(), n, "message {i}");
        assert!(d.data == pattern(n, i as u8), "message {i} corrupted");
    }
    // A large message fanned out to several queues arrives intact in each.
    let ch2 = env.channel().await;
    for q in ["f1", "f2"] {
        declare_queue(&ch2, q).await;
        bind(&ch2, q, "amq.fanout", "").await;
    }
    let body = pattern(1 << 20, 99);
    publish(&ch2, "amq.fanout", "", &body).await;
    for q in ["f1", "f2"] {
        assert!(get(&ch2, q).await.expect("fanned out") == body, "{q}");
    }
    env.stop().await;
}

#[tokio::test]
async fn empty_body() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "e").await;
    let props = BasicProperties::default().with_correlation_id("empty".into());
    publish_props(&ch, "", "e", b"", props.clone()).await;
    publish_props(&ch, "", "e", b"", props.clone()).await;
    publish(&ch, "", "e", b"after").await;
    let m = within(
        "get",
        ch.basic_get("e".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .unwrap()
    .expect("empty message");
    assert!(m.delivery.data.is_empty());
    assert_eq!(m.delivery.properties, props);
    let mut c = consume(&ch, "e", "c", true).await;
    let d = next(&mut c).await;
    assert!(d.data.is_empty());
    assert_eq!(
        d.properties.correlation_id().as_ref().map(|s| s.as_str()),
        Some("empty")
    );
    assert_eq!(next(&mut c).await.data, b"after");
    env.stop().await;
}

fn every_field_type() -> FieldTable {
    let mut nested = FieldTable::default();
    nested.insert(
        "inner".into(),
        AMQPValue::LongString(LongString::from("deep")),
    );
    nested.insert("n".into(), AMQPValue::LongInt(-7));
    let array = FieldArray::from(vec![
        AMQPValue::LongInt(1),
        AMQPValue::LongString(LongString::from("two")),
        AMQPValue::Boolean(false),
        AMQPValue::Void,
        AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::Double(0.5)])),
        AMQPValue::FieldTable(nested.clone()),
    ]);
    let mut t = FieldTable::default();
    let entries: Vec<(&str, AMQPValue)> = vec![
        ("bool", AMQPValue::Boolean(true)),
        ("i8", AMQPValue::ShortShortInt(-128)),
        ("u8", AMQPValue::ShortShortUInt(255)),
        ("i16", AMQPValue::ShortInt(-32768)),
        ("u16", AMQPValue::ShortUInt(65535)),
        ("i32", AMQPValue::LongInt(i32::MIN)),
        ("u32", AMQPValue::LongUInt(u32::MAX)),
        ("i64", AMQPValue::LongLongInt(i64::MIN)),
        ("f32", AMQPValue::Float(1.5)),
        ("f64", AMQPValue::Double(-2.25e300)),
        (
            "decimal",
            AMQPValue::DecimalValue(DecimalValue {
                scale: 3,
                value: 123_456,
            }),
        ),
        (
            "longstr",
            AMQPValue::LongString(LongString::from("héllo \0 wörld")),
        ),
        ("emptystr", AMQPValue::LongString(LongString::from(""))),
        ("array", AMQPValue::FieldArray(array)),
        (
            "emptyarray",
            AMQPValue::FieldArray(FieldArray::from(vec![])),
        ),
        ("timestamp", AMQPValue::Timestamp(1_700_000_000)),
        ("table", AMQPValue::FieldTable(nested)),
        ("emptytable", AMQPValue::FieldTable(FieldTable::default())),
        (
            "bytes",
            AMQPValue::ByteArray(ByteArray::from(vec![0u8, 1, 2, 255])),
        ),
        ("void", AMQPValue::Void),
    ];
    for (k, v) in entries {
        t.insert(ShortString::from(k), v);
    }
    t
}

#[tokio::test]
async fn all_basic_properties_and_header_types_round_trip() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "props").await;
    let props = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_content_encoding("gzip".into())
        .with_headers(every_field_type())
        .with_delivery_mode(2)
        .with_priority(7)
        .with_correlation_id("corr-42".into())
        .with_reply_to("replies".into())
        .with_expiration("3600000".into())
        .with_message_id("msg-1".into())
        .with_timestamp(1_234_567_890)
        .with_type("order.created".into())
        // RabbitMQ refuses a user-id other than the connection's user.
        .with_user_id("guest".into())
        .with_app_id("lapin-tests".into())
        .with_cluster_id("c1".into());
    publish_props(&ch, "", "props", b"{}", props.clone()).await;
    publish_props(&ch, "", "props", b"{}", props.clone()).await;

    let m = within(
        "get",
        ch.basic_get("props".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .unwrap()
    .expect("message");
    assert_eq!(m.delivery.properties, props);

    let mut c = consume(&ch, "props", "c", true).await;
    let d = next(&mut c).await;
    assert_eq!(d.properties, props);
    assert_eq!(d.data, b"{}");

    // A mandatory return carries the properties back as well.
    confirm_select(&ch).await;
    match publish_confirmed(&ch, "amq.direct", "nowhere", true, b"r", props.clone()).await {
        Confirmation::Ack(Some(ret)) => assert_eq!(ret.delivery.properties, props),
        other => panic!("expected a return, got {other:?}"),
    }
    env.stop().await;
}

#[tokio::test]
async fn direct_reply_to_rpc_round_trip() {
    use futures_util::StreamExt;
    use lapin::options::BasicConsumeOptions;
    use lapin::types::FieldTable;
    let env = Env::start().await;
    let server_conn = env.connect().await;
    let server_ch = within("channel", server_conn.create_channel())
        .await
        .unwrap();
    let rpc = declare_queue(&server_ch, "").await;
    let mut requests = within(
        "basic.consume",
        server_ch.basic_consume(
            rpc.as_str().into(),
            "server".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();

    let client = env.channel().await;
    let mut replies = within(
        "basic.consume amq.rabbitmq.reply-to",
        client.basic_consume(
            "amq.rabbitmq.reply-to".into(),
            "replies".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    publish_props(
        &client,
        "",
        &rpc,
        b"ping",
        BasicProperties::default()
            .with_reply_to("amq.rabbitmq.reply-to".into())
            .with_correlation_id("c1".into()),
    )
    .await;

    // The server sees a rewritten reply_to and answers to it through the default exchange.
    let req = within("request", requests.next()).await.unwrap().unwrap();
    let reply_to = req.properties.reply_to().clone().unwrap().to_string();
    assert!(reply_to.starts_with("amq.rabbitmq.reply-to."), "{reply_to}");
    publish_props(
        &server_ch,
        "",
        &reply_to,
        b"pong",
        BasicProperties::default().with_correlation_id("c1".into()),
    )
    .await;
    let reply = within("reply", replies.next()).await.unwrap().unwrap();
    assert_eq!(reply.data, b"pong");
    assert_eq!(
        reply.properties.correlation_id().clone().unwrap().as_str(),
        "c1"
    );

    // Without a reply consumer on the channel, reply_to amq.rabbitmq.reply-to is refused. In
    // confirm mode the pending confirm fails with the channel's close reason, so the code is
    // observed whichever of lapin's tasks sees the channel.close first.
    let other = env.channel().await;
    confirm_select(&other).await;
    let res = match other
        .basic_publish(
            "".into(),
            rpc.as_str().into(),
            Default::default(),
            b"x",
            BasicProperties::default().with_reply_to("amq.rabbitmq.reply-to".into()),
        )
        .await
    {
        Ok(pc) => within("confirm", pc).await.map(|_| ()),
        Err(e) => Err(e),
    };
    expect_code(res, 406);
    // A reply consumer must not ack.
    let acking = env.channel().await;
    let res = within(
        "basic.consume",
        acking.basic_consume(
            "amq.rabbitmq.reply-to".into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        ),
    )
    .await;
    expect_code(res.map(|_| ()), 406);
    env.stop().await;
}

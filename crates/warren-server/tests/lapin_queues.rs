//! Queue lifecycle through lapin: declare (server-named, passive, equivalence, exclusive,
//! auto-delete), bind/unbind, purge and delete with their message counts.

mod lapin_support;

use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions,
    QueuePurgeOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Queue};
use lapin_support::*;

async fn declare(ch: &Channel, name: &str, options: QueueDeclareOptions) -> lapin::Result<Queue> {
    within(
        "queue.declare",
        ch.queue_declare(name.into(), options, FieldTable::default()),
    )
    .await
}

fn passive() -> QueueDeclareOptions {
    QueueDeclareOptions {
        passive: true,
        ..Default::default()
    }
}

async fn delete(ch: &Channel, name: &str, options: QueueDeleteOptions) -> lapin::Result<u32> {
    within("queue.delete", ch.queue_delete(name.into(), options)).await
}

#[tokio::test]
async fn server_named_queues() {
    let env = Env::start().await;
    let ch = env.channel().await;
    let a = declare(&ch, "", QueueDeclareOptions::default())
        .await
        .expect("declare");
    let b = declare(&ch, "", QueueDeclareOptions::default())
        .await
        .expect("declare");
    assert!(
        a.name().as_str().starts_with("amq.gen-"),
        "server-named queue {}",
        a.name()
    );
    assert!(b.name().as_str().starts_with("amq.gen-"));
    assert_ne!(a.name(), b.name());
    assert_eq!((a.message_count(), a.consumer_count()), (0, 0));
    // The generated name is usable like any other.
    publish(&ch, "", a.name().as_str(), b"x").await;
    assert_eq!(drain(&ch, a.name().as_str()).await, vec!["x"]);
    env.stop().await;
}

#[tokio::test]
async fn declare_ok_reports_counts() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "counted").await;
    for i in 0..3 {
        publish(&ch, "", "counted", format!("{i}").as_bytes()).await;
    }
    let q = declare(&ch, "counted", QueueDeclareOptions::default())
        .await
        .expect("redeclare");
    assert_eq!((q.message_count(), q.consumer_count()), (3, 0));

    let ch2 = env.channel().await;
    let mut c = consume(&ch2, "counted", "c1", false).await;
    // All three are delivered and unacked: declare-ok counts ready messages only.
    for _ in 0..3 {
        next(&mut c).await;
    }
    let q = declare(&ch, "counted", passive()).await.expect("passive");
    assert_eq!((q.message_count(), q.consumer_count()), (0, 1));
    env.stop().await;
}

#[tokio::test]
async fn passive_declare() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "here").await;
    publish(&ch, "", "here", b"1").await;
    let q = declare(&ch, "here", passive()).await.expect("passive ok");
    assert_eq!(q.message_count(), 1);
    // Passive declare ignores the other flags.
    declare(
        &ch,
        "here",
        QueueDeclareOptions {
            passive: true,
            durable: true,
            auto_delete: true,
            ..Default::default()
        },
    )
    .await
    .expect("passive with other flags");

    expect_code(declare(&ch, "missing", passive()).await, 404);
    // The channel is closed by the error; the queue was not created.
    let ch = env.channel().await;
    expect_code(declare(&ch, "missing", passive()).await, 404);
    env.stop().await;
}

#[tokio::test]
async fn redeclare_must_be_equivalent() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare(&ch, "plain", QueueDeclareOptions::default())
        .await
        .expect("declare");
    declare(&ch, "plain", QueueDeclareOptions::default())
        .await
        .expect("identical redeclare");
    expect_code(
        declare(
            &ch,
            "plain",
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
        )
        .await,
        406,
    );

    let ch = env.channel().await;
    declare(
        &ch,
        "dur",
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
    )
    .await
    .expect("declare durable");
    expect_code(
        declare(&ch, "dur", QueueDeclareOptions::default()).await,
        406,
    );
    let ch = env.channel().await;
    expect_code(
        declare(
            &ch,
            "dur",
            QueueDeclareOptions {
                durable: true,
                auto_delete: true,
                ..Default::default()
            },
        )
        .await,
        406,
    );
    // The failed redeclarations changed nothing.
    let ch = env.channel().await;
    declare(
        &ch,
        "dur",
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
    )
    .await
    .expect("equivalent redeclare");
    env.stop().await;
}

#[tokio::test]
async fn reserved_amq_prefix_is_refused() {
    let env = Env::start().await;
    let ch = env.channel().await;
    expect_code(
        declare(&ch, "amq.mine", QueueDeclareOptions::default()).await,
        403,
    );
    env.stop().await;
}

#[tokio::test]
async fn exclusive_queues_belong_to_their_connection() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare(
        &ch,
        "mine",
        QueueDeclareOptions {
            exclusive: true,
            ..Default::default()
        },
    )
    .await
    .expect("declare exclusive");
    // Usable from another channel of the same connection.
    let ch_b = env.channel().await;
    publish(&ch_b, "", "mine", b"1").await;
    assert_eq!(drain(&ch_b, "mine").await, vec!["1"]);

    // Another connection gets 405 RESOURCE_LOCKED for every use.
    let other = env.connect().await;
    let och = within("channel", other.create_channel()).await.unwrap();
    expect_code(declare(&och, "mine", passive()).await, 405);
    let och = within("channel", other.create_channel()).await.unwrap();
    expect_code(
        declare(
            &och,
            "mine",
            QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
        )
        .await,
        405,
    );
    let och = within("channel", other.create_channel()).await.unwrap();
    let res = within(
        "basic.get",
        och.basic_get("mine".into(), BasicGetOptions::default()),
    )
    .await;
    expect_code(res.map(|m| m.is_some()), 405);
    let och = within("channel", other.create_channel()).await.unwrap();
    expect_code(
        delete(&och, "mine", QueueDeleteOptions::default()).await,
        405,
    );

    // Closing the owning connection deletes the queue.
    within("connection.close", env.conn.close(200, "bye".into()))
        .await
        .expect("close");
    let och = within("channel", other.create_channel()).await.unwrap();
    let mut gone = false;
    for _ in 0..50 {
        match declare(&och, "mine", passive()).await {
            Err(e) => {
                assert_eq!(reply_code(&e), 404);
                gone = true;
                break;
            }
            Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    assert!(gone, "exclusive queue survived its connection");
    let _ = within("close", other.close(200, "bye".into())).await;
    if let Some(b) = env.broker {
        within("shutdown", b.shutdown()).await;
    }
}

#[tokio::test]
async fn auto_delete_when_last_consumer_cancels() {
    let env = Env::start().await;
    let ch = env.channel().await;
    let ad = QueueDeclareOptions {
        auto_delete: true,
        ..Default::default()
    };
    declare(&ch, "ad", ad).await.expect("declare");
    // Never consumed: an auto-delete queue stays.
    declare(&ch, "ad", passive()).await.expect("still there");

    let _c1 = consume(&ch, "ad", "c1", false).await;
    let _c2 = consume(&ch, "ad", "c2", false).await;
    within(
        "basic.cancel",
        ch.basic_cancel("c1".into(), BasicCancelOptions::default()),
    )
    .await
    .expect("cancel c1");
    let q = declare(&ch, "ad", passive())
        .await
        .expect("one consumer left");
    assert_eq!(q.consumer_count(), 1);
    within(
        "basic.cancel",
        ch.basic_cancel("c2".into(), BasicCancelOptions::default()),
    )
    .await
    .expect("cancel c2");
    expect_code(declare(&ch, "ad", passive()).await, 404);

    // Closing the channel that holds the last consumer also deletes it.
    let ch = env.channel().await;
    declare(&ch, "ad2", ad).await.expect("declare");
    let ch2 = env.channel().await;
    let _c = consume(&ch2, "ad2", "c", true).await;
    within("channel.close", ch2.close(200, "bye".into()))
        .await
        .expect("channel.close");
    expect_code(declare(&ch, "ad2", passive()).await, 404);
    env.stop().await;
}

#[tokio::test]
async fn bind_and_unbind_need_existing_entities() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "q").await;
    let res = within(
        "queue.bind",
        ch.queue_bind(
            "q".into(),
            "no-such-exchange".into(),
            "k".into(),
            Default::default(),
            FieldTable::default(),
        ),
    )
    .await;
    expect_code(res, 404);
    let ch = env.channel().await;
    let res = within(
        "queue.bind",
        ch.queue_bind(
            "no-such-queue".into(),
            "amq.direct".into(),
            "k".into(),
            Default::default(),
            FieldTable::default(),
        ),
    )
    .await;
    expect_code(res, 404);

    let ch = env.channel().await;
    bind(&ch, "q", "amq.direct", "k").await;
    publish(&ch, "amq.direct", "k", b"bound").await;
    within(
        "queue.unbind",
        ch.queue_unbind(
            "q".into(),
            "amq.direct".into(),
            "k".into(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("unbind");
    publish(&ch, "amq.direct", "k", b"unbound").await;
    assert_eq!(drain(&ch, "q").await, vec!["bound"]);
    env.stop().await;
}

#[tokio::test]
async fn purge_counts_ready_messages_only() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "p").await;
    for i in 0..7 {
        publish(&ch, "", "p", format!("{i}").as_bytes()).await;
    }
    // Two are fetched and left unacked: purge leaves them alone.
    let m1 = within("get", ch.basic_get("p".into(), BasicGetOptions::default()))
        .await
        .unwrap()
        .expect("message");
    let _m2 = within("get", ch.basic_get("p".into(), BasicGetOptions::default()))
        .await
        .unwrap()
        .expect("message");
    let n = within(
        "queue.purge",
        ch.queue_purge("p".into(), QueuePurgeOptions::default()),
    )
    .await
    .expect("purge");
    assert_eq!(n, 5);
    let n = within(
        "queue.purge",
        ch.queue_purge("p".into(), QueuePurgeOptions::default()),
    )
    .await
    .expect("purge");
    assert_eq!(n, 0);
    m1.delivery
        .ack(BasicAckOptions::default())
        .await
        .expect("ack");
    // Closing the channel requeues the unacked one.
    within("channel.close", ch.close(200, "bye".into()))
        .await
        .unwrap();
    let ch = env.channel().await;
    assert_eq!(drain(&ch, "p").await, vec!["1"]);

    let res = within(
        "queue.purge",
        ch.queue_purge("nope".into(), QueuePurgeOptions::default()),
    )
    .await;
    expect_code(res, 404);
    env.stop().await;
}

#[tokio::test]
async fn delete_reports_message_count_and_checks_conditions() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "d").await;
    for _ in 0..4 {
        publish(&ch, "", "d", b"m").await;
    }
    // if-empty refuses a queue with messages.
    expect_code(
        delete(
            &ch,
            "d",
            QueueDeleteOptions {
                if_empty: true,
                ..Default::default()
            },
        )
        .await,
        406,
    );
    // if-unused refuses a queue with consumers.
    let ch = env.channel().await;
    let ch_c = env.channel().await;
    within("basic.qos", ch_c.basic_qos(1, Default::default()))
        .await
        .expect("qos");
    let mut c = consume(&ch_c, "d", "c", false).await;
    next(&mut c).await;
    expect_code(
        delete(
            &ch,
            "d",
            QueueDeleteOptions {
                if_unused: true,
                ..Default::default()
            },
        )
        .await,
        406,
    );
    // Both refusals left the queue in place.
    let ch = env.channel().await;
    let q = declare(&ch, "d", passive()).await.expect("still there");
    assert_eq!(q.consumer_count(), 1);

    // A plain delete succeeds and reports the messages it dropped (the unacked one is not
    // ready, so it is not counted).
    let n = delete(&ch, "d", QueueDeleteOptions::default())
        .await
        .expect("delete");
    assert_eq!(n, 3);
    expect_code(declare(&ch, "d", passive()).await, 404);

    // Deleting a queue that does not exist succeeds with a zero count.
    let ch = env.channel().await;
    let n = delete(&ch, "never-existed", QueueDeleteOptions::default())
        .await
        .expect("delete missing");
    assert_eq!(n, 0);

    // if-empty and if-unused pass on an empty, unused queue.
    declare_queue(&ch, "e").await;
    let n = delete(
        &ch,
        "e",
        QueueDeleteOptions {
            if_empty: true,
            if_unused: true,
            ..Default::default()
        },
    )
    .await
    .expect("conditional delete");
    assert_eq!(n, 0);
    env.stop().await;
}

//! Consuming through lapin: prefetch (per consumer and channel-wide), round-robin, ordering,
//! basic.get, ack/nack/reject, requeue position, basic.recover and consumer cancellation by the
//! client and by the broker.

mod lapin_support;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions,
    BasicQosOptions, BasicRecoverOptions, BasicRejectOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Consumer};
use lapin_support::*;
use tokio::sync::mpsc;

async fn qos(ch: &Channel, count: u16, global: bool) {
    within("basic.qos", ch.basic_qos(count, BasicQosOptions { global }))
        .await
        .expect("basic.qos");
}

async fn ack(ch: &Channel, tag: u64, multiple: bool) {
    within("basic.ack", ch.basic_ack(tag, BasicAckOptions { multiple }))
        .await
        .expect("basic.ack");
}

async fn publish_n(ch: &Channel, queue: &str, n: usize) {
    for i in 0..n {
        publish(ch, "", queue, format!("{i}").as_bytes()).await;
    }
}

/// Forwards every delivery of `consumers` to one receiver, tagged with the consumer's index.
fn merge(consumers: Vec<Consumer>) -> mpsc::UnboundedReceiver<(usize, Delivery)> {
    let (tx, rx) = mpsc::unbounded_channel();
    for (i, mut c) in consumers.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(Ok(d)) = c.next().await {
                if tx.send((i, d)).is_err() {
                    break;
                }
            }
        });
    }
    rx
}

async fn recv(rx: &mut mpsc::UnboundedReceiver<(usize, Delivery)>) -> (usize, Delivery) {
    within("a delivery", rx.recv())
        .await
        .expect("all consumers ended")
}

async fn assert_rx_quiet(rx: &mut mpsc::UnboundedReceiver<(usize, Delivery)>) {
    if let Ok(Some((i, d))) = tokio::time::timeout(QUIET, rx.recv()).await {
        panic!(
            "expected no delivery, consumer {i} got tag {} body {}",
            d.delivery_tag,
            text(&d)
        );
    }
}

#[tokio::test]
async fn per_consumer_prefetch_is_exact() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "q").await;
    publish_n(&ch, "q", 10).await;
    qos(&ch, 3, false).await;
    let mut c = consume(&ch, "q", "c", false).await;
    let mut tags = Vec::new();
    for i in 0..3 {
        let d = next(&mut c).await;
        assert_eq!(text(&d), i.to_string());
        tags.push(d.delivery_tag);
    }
    assert_quiet(&mut c).await;

    // One ack frees exactly one slot.
    ack(&ch, tags[0], false).await;
    let d = next(&mut c).await;
    assert_eq!(text(&d), "3");
    tags.push(d.delivery_tag);
    assert_quiet(&mut c).await;

    // A multiple ack of the three outstanding frees three slots.
    ack(&ch, tags[3], true).await;
    for i in 4..7 {
        let d = next(&mut c).await;
        assert_eq!(text(&d), i.to_string());
        tags.push(d.delivery_tag);
    }
    assert_quiet(&mut c).await;
    let q = within(
        "queue.declare",
        ch.queue_declare(
            "q".into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .expect("passive declare");
    assert_eq!(q.message_count(), 3);
    env.stop().await;
}

#[tokio::test]
async fn per_consumer_prefetch_applies_to_each_consumer() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "a").await;
    declare_queue(&ch, "b").await;
    publish_n(&ch, "a", 5).await;
    publish_n(&ch, "b", 5).await;
    // The prefetch in force when a consumer starts is its own: 2 for ca, 1 for cb.
    qos(&ch, 2, false).await;
    let ca = consume(&ch, "a", "ca", false).await;
    qos(&ch, 1, false).await;
    let cb = consume(&ch, "b", "cb", false).await;
    let mut rx = merge(vec![ca, cb]);
    let mut per = [0usize; 2];
    for _ in 0..3 {
        per[recv(&mut rx).await.0] += 1;
    }
    assert_rx_quiet(&mut rx).await;
    assert_eq!(per, [2, 1]);
    env.stop().await;
}

#[tokio::test]
async fn global_prefetch_is_channel_wide() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "a").await;
    declare_queue(&ch, "b").await;
    publish_n(&ch, "a", 5).await;
    publish_n(&ch, "b", 5).await;
    qos(&ch, 3, true).await;
    let ca = consume(&ch, "a", "ca", false).await;
    let cb = consume(&ch, "b", "cb", false).await;
    let mut rx = merge(vec![ca, cb]);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(recv(&mut rx).await.1.delivery_tag);
    }
    // Three unacked on the channel, whichever consumers hold them: nothing more.
    assert_rx_quiet(&mut rx).await;
    ack(&ch, held[1], false).await;
    let (_, d) = recv(&mut rx).await;
    held.push(d.delivery_tag);
    assert_rx_quiet(&mut rx).await;
    // Releasing everything lets three more through, not more.
    ack(&ch, 0, true).await;
    for _ in 0..3 {
        recv(&mut rx).await;
    }
    assert_rx_quiet(&mut rx).await;
    env.stop().await;
}

#[tokio::test]
async fn prefetch_does_not_limit_no_ack_consumers() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "q").await;
    publish_n(&ch, "q", 20).await;
    qos(&ch, 1, false).await;
    qos(&ch, 1, true).await;
    let mut c = consume(&ch, "q", "c", true).await;
    for i in 0..20 {
        assert_eq!(text(&next(&mut c).await), i.to_string());
    }
    env.stop().await;
}

#[tokio::test]
async fn round_robin_among_consumers() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "rr").await;
    let mut consumers = Vec::new();
    for i in 0..3 {
        let cch = env.channel().await;
        consumers.push(consume(&cch, "rr", &format!("c{i}"), true).await);
        std::mem::forget(cch);
    }
    let mut rx = merge(consumers);
    publish_n(&ch, "rr", 30).await;
    let mut got: Vec<Vec<usize>> = vec![Vec::new(); 3];
    for _ in 0..30 {
        let (i, d) = recv(&mut rx).await;
        got[i].push(text(&d).parse().unwrap());
    }
    for g in &got {
        assert_eq!(g.len(), 10, "uneven distribution: {got:?}");
        // Each consumer sees every third message, in order.
        for w in g.windows(2) {
            assert_eq!(w[1], w[0] + 3, "not round-robin: {got:?}");
        }
    }
    env.stop().await;
}

#[tokio::test]
async fn thousand_messages_arrive_in_order() {
    let env = Env::start().await;
    let pub_ch = env.channel().await;
    let ch = env.channel().await;
    declare_queue(&ch, "order").await;
    let mut c = consume(&ch, "order", "c", false).await;
    let publisher = {
        let pub_ch = pub_ch.clone();
        tokio::spawn(async move { publish_n(&pub_ch, "order", 1000).await })
    };
    let mut last_tag = 0;
    for i in 0..1000 {
        let d = next(&mut c).await;
        assert_eq!(text(&d), i.to_string());
        assert!(!d.redelivered);
        assert!(d.delivery_tag > last_tag);
        last_tag = d.delivery_tag;
    }
    within("publisher", publisher).await.unwrap();
    ack(&ch, last_tag, true).await;
    assert_quiet(&mut c).await;
    env.stop().await;
}

#[tokio::test]
async fn basic_get_and_get_empty() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "g").await;
    let empty = within(
        "basic.get",
        ch.basic_get("g".into(), BasicGetOptions::default()),
    )
    .await
    .expect("basic.get");
    assert!(empty.is_none(), "get-empty expected");
    publish_n(&ch, "g", 3).await;
    for (i, left) in [(0, 2), (1, 1), (2, 0)] {
        let m = within(
            "basic.get",
            ch.basic_get("g".into(), BasicGetOptions::default()),
        )
        .await
        .expect("basic.get")
        .expect("get-ok");
        assert_eq!(text(&m.delivery), i.to_string());
        assert_eq!(m.message_count, left);
        assert!(!m.delivery.redelivered);
        assert_eq!(m.delivery.routing_key.as_str(), "g");
        assert_eq!(m.delivery.exchange.as_str(), "");
        m.delivery
            .ack(BasicAckOptions::default())
            .await
            .expect("ack");
    }
    let empty = within(
        "basic.get",
        ch.basic_get("g".into(), BasicGetOptions::default()),
    )
    .await
    .expect("basic.get");
    assert!(empty.is_none());
    // basic.get on a missing queue is 404.
    let res = within(
        "basic.get",
        ch.basic_get("missing".into(), BasicGetOptions::default()),
    )
    .await;
    expect_code(res.map(|m| m.is_some()), 404);
    env.stop().await;
}

/// Fetches the next message with basic.get (acks required): (body, redelivered, tag).
async fn get_one(ch: &Channel, q: &str) -> (String, bool, u64) {
    let m = within(
        "basic.get",
        ch.basic_get(q.into(), BasicGetOptions::default()),
    )
    .await
    .expect("basic.get")
    .expect("a message");
    (
        text(&m.delivery),
        m.delivery.redelivered,
        m.delivery.delivery_tag,
    )
}

#[tokio::test]
async fn requeued_message_returns_to_its_position_redelivered() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "rq").await;
    publish_n(&ch, "rq", 5).await;
    let (b0, _, t0) = get_one(&ch, "rq").await;
    let (b1, _, t1) = get_one(&ch, "rq").await;
    let (b2, _, t2) = get_one(&ch, "rq").await;
    assert_eq!((b0.as_str(), b1.as_str(), b2.as_str()), ("0", "1", "2"));
    // Requeue 2 then 0: they go back in their original order, ahead of 3 and 4.
    within(
        "basic.reject",
        ch.basic_reject(t2, BasicRejectOptions { requeue: true }),
    )
    .await
    .unwrap();
    within(
        "basic.nack",
        ch.basic_nack(
            t0,
            BasicNackOptions {
                multiple: false,
                requeue: true,
            },
        ),
    )
    .await
    .unwrap();
    ack(&ch, t1, false).await;
    let order: Vec<(String, bool)> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            let (b, r, t) = get_one(&ch, "rq").await;
            ack(&ch, t, false).await;
            v.push((b, r));
        }
        v
    };
    assert_eq!(
        order,
        vec![
            ("0".to_string(), true),
            ("2".to_string(), true),
            ("3".to_string(), false),
            ("4".to_string(), false)
        ]
    );
    assert!(get(&ch, "rq").await.is_none());
    env.stop().await;
}

#[tokio::test]
async fn ack_nack_reject_multiple_and_requeue() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "m").await;
    publish_n(&ch, "m", 8).await;
    let mut c = consume(&ch, "m", "c", false).await;
    let mut tags = Vec::new();
    for i in 0..8 {
        let d = next(&mut c).await;
        assert_eq!(text(&d), i.to_string());
        tags.push(d.delivery_tag);
    }
    // ack 0..=2 at once; nack 3..=4 without requeue (dropped); reject 5 with requeue;
    // nack 6..=7 with requeue.
    ack(&ch, tags[2], true).await;
    within(
        "basic.nack",
        ch.basic_nack(
            tags[4],
            BasicNackOptions {
                multiple: true,
                requeue: false,
            },
        ),
    )
    .await
    .unwrap();
    within(
        "basic.reject",
        ch.basic_reject(tags[5], BasicRejectOptions { requeue: true }),
    )
    .await
    .unwrap();
    let d = next(&mut c).await;
    assert_eq!((text(&d).as_str(), d.redelivered), ("5", true));
    within(
        "basic.nack",
        ch.basic_nack(
            tags[7],
            BasicNackOptions {
                multiple: true,
                requeue: true,
            },
        ),
    )
    .await
    .unwrap();
    // nack multiple covers the outstanding tags up to tags[7] only: the redelivered 5 has a
    // newer tag and stays unacked.
    let mut again = Vec::new();
    for _ in 0..2 {
        let d = next(&mut c).await;
        assert!(d.redelivered);
        again.push(text(&d));
    }
    assert_eq!(again, vec!["6", "7"]);
    assert_quiet(&mut c).await;
    ack(&ch, 0, true).await;
    assert_quiet(&mut c).await;
    within(
        "basic.cancel",
        ch.basic_cancel("c".into(), BasicCancelOptions::default()),
    )
    .await
    .unwrap();
    assert!(get(&ch, "m").await.is_none(), "queue should be empty");
    env.stop().await;
}

#[tokio::test]
async fn reject_without_requeue_drops() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "r").await;
    publish_n(&ch, "r", 2).await;
    let (_, _, t) = get_one(&ch, "r").await;
    within(
        "basic.reject",
        ch.basic_reject(t, BasicRejectOptions { requeue: false }),
    )
    .await
    .unwrap();
    assert_eq!(drain(&ch, "r").await, vec!["1"]);
    env.stop().await;
}

#[tokio::test]
async fn unknown_delivery_tag_is_a_channel_error() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "u").await;
    publish_n(&ch, "u", 1).await;
    let (_, _, t) = get_one(&ch, "u").await;
    ack(&ch, t, false).await;
    // Acking the same tag again: 406 PRECONDITION_FAILED closes the channel.
    let _ = ch.basic_ack(t, BasicAckOptions::default()).await;
    let res = within(
        "queue.declare",
        ch.queue_declare(
            "u".into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await;
    expect_code(res, 406);
    env.stop().await;
}

#[tokio::test]
async fn basic_recover_redelivers_unacked() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "rec").await;
    publish_n(&ch, "rec", 3).await;
    let mut c = consume(&ch, "rec", "c", false).await;
    let mut first = Vec::new();
    for _ in 0..3 {
        first.push(next(&mut c).await.delivery_tag);
    }
    within(
        "basic.recover",
        ch.basic_recover(BasicRecoverOptions { requeue: true }),
    )
    .await
    .expect("basic.recover");
    let mut second = Vec::new();
    for i in 0..3 {
        let d = next(&mut c).await;
        assert_eq!(text(&d), i.to_string());
        assert!(d.redelivered);
        assert!(
            !first.contains(&d.delivery_tag),
            "delivery tags are not reused"
        );
        second.push(d.delivery_tag);
    }
    ack(&ch, second[2], true).await;
    assert_quiet(&mut c).await;
    within(
        "basic.cancel",
        ch.basic_cancel("c".into(), BasicCancelOptions::default()),
    )
    .await
    .unwrap();
    assert!(get(&ch, "rec").await.is_none());
    env.stop().await;
}

#[tokio::test]
async fn cancel_stops_deliveries_and_keeps_unacked_ackable() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "cx").await;
    qos(&ch, 1, false).await;
    publish_n(&ch, "cx", 3).await;
    let mut c = consume(&ch, "cx", "ctag", false).await;
    let d = next(&mut c).await;
    assert_eq!(text(&d), "0");
    within(
        "basic.cancel",
        ch.basic_cancel("ctag".into(), BasicCancelOptions::default()),
    )
    .await
    .expect("basic.cancel");
    // The consumer stream ends.
    assert!(within("end of stream", c.next()).await.is_none());
    // The delivery made before the cancel can still be acked.
    ack(&ch, d.delivery_tag, false).await;
    publish_n(&ch, "cx", 1).await;
    assert_eq!(drain(&ch, "cx").await, vec!["1", "2", "0"]);
    // The tag can be reused after the cancel.
    let _c = consume(&ch, "cx", "ctag", true).await;
    env.stop().await;
}

#[tokio::test]
async fn server_cancels_consumer_when_queue_is_deleted() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "doomed").await;
    let mut c = consume(&ch, "doomed", "watcher", false).await;
    publish_n(&ch, "doomed", 1).await;
    let d = next(&mut c).await;
    assert_eq!(text(&d), "0");

    let other = env.channel().await;
    within(
        "queue.delete",
        other.queue_delete("doomed".into(), QueueDeleteOptions::default()),
    )
    .await
    .expect("queue.delete");
    // lapin announces consumer_cancel_notify: the broker sends basic.cancel and the stream ends.
    assert!(within("broker basic.cancel", c.next()).await.is_none());
    // The channel stays open and usable; acking the orphaned delivery is not an error.
    ack(&ch, d.delivery_tag, false).await;
    declare_queue(&ch, "after").await;
    publish_n(&ch, "after", 1).await;
    assert_eq!(drain(&ch, "after").await, vec!["0"]);
    env.stop().await;
}

#[tokio::test]
async fn exclusive_consumer_locks_out_others() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "ex").await;
    let _c = within(
        "basic.consume",
        ch.basic_consume(
            "ex".into(),
            "only".into(),
            BasicConsumeOptions {
                exclusive: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .expect("exclusive consume");
    let ch2 = env.channel().await;
    let res = within(
        "basic.consume",
        ch2.basic_consume(
            "ex".into(),
            "other".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        ),
    )
    .await;
    expect_code(res.map(|c| c.tag()), 403);
    env.stop().await;
}

#[tokio::test]
async fn closing_a_channel_requeues_its_unacked_messages() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "cl").await;
    publish_n(&ch, "cl", 3).await;
    let ch2 = env.channel().await;
    let mut c = consume(&ch2, "cl", "c", false).await;
    for _ in 0..3 {
        next(&mut c).await;
    }
    within("channel.close", ch2.close(200, "bye".into()))
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        let (b, redelivered, t) = get_one(&ch, "cl").await;
        assert!(redelivered);
        ack(&ch, t, false).await;
        got.push(b);
    }
    assert_eq!(got, vec!["0", "1", "2"]);
    env.stop().await;
}

#[tokio::test]
async fn per_consumer_and_channel_wide_limits_both_apply() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "a").await;
    declare_queue(&ch, "b").await;
    publish_n(&ch, "a", 5).await;
    publish_n(&ch, "b", 5).await;
    // Each consumer may hold 2, the channel 3 in all.
    qos(&ch, 2, false).await;
    qos(&ch, 3, true).await;
    let ca = consume(&ch, "a", "ca", false).await;
    let cb = consume(&ch, "b", "cb", false).await;
    let mut rx = merge(vec![ca, cb]);
    let mut per = [0usize; 2];
    for _ in 0..3 {
        per[recv(&mut rx).await.0] += 1;
    }
    assert_rx_quiet(&mut rx).await;
    assert!(
        per[0] <= 2 && per[1] <= 2,
        "per-consumer limit exceeded: {per:?}"
    );
    env.stop().await;
}

#[tokio::test]
async fn changing_prefetch_does_not_affect_existing_consumers() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_queue(&ch, "q").await;
    publish_n(&ch, "q", 5).await;
    qos(&ch, 1, false).await;
    let mut c = consume(&ch, "q", "c", false).await;
    let d = next(&mut c).await;
    assert_eq!(text(&d), "0");
    // A per-consumer basic.qos applies to consumers started afterwards only.
    qos(&ch, 5, false).await;
    assert_quiet(&mut c).await;
    ack(&ch, d.delivery_tag, false).await;
    assert_eq!(text(&next(&mut c).await), "1");
    assert_quiet(&mut c).await;
    env.stop().await;
}

#[tokio::test]
async fn consumer_priorities_prefer_higher_priority_consumers() {
    let env = Env::start().await;
    let ch = env.channel().await;
    let q = declare_queue(&ch, "").await;
    let lo_ch = env.channel().await;
    let hi_ch = env.channel().await;
    qos(&hi_ch, 3, false).await;
    let with_priority = |p: i32| {
        let mut t = FieldTable::default();
        t.insert("x-priority".into(), lapin::types::AMQPValue::LongInt(p));
        t
    };
    let consume = |ch: &Channel, tag: &'static str, args: FieldTable| {
        let ch = ch.clone();
        let q = q.clone();
        async move {
            within(
                "basic.consume",
                ch.basic_consume(
                    q.as_str().into(),
                    tag.into(),
                    BasicConsumeOptions::default(),
                    args,
                ),
            )
            .await
            .expect("basic.consume")
        }
    };
    let lo = consume(&lo_ch, "lo", with_priority(1)).await;
    let hi = consume(&hi_ch, "hi", with_priority(10)).await;
    let mut rx = merge(vec![lo, hi]);
    publish_n(&ch, &q, 3).await;
    // The priority-10 consumer takes everything while it has credit.
    for _ in 0..3 {
        let (who, _) = recv(&mut rx).await;
        assert_eq!(who, 1, "the higher-priority consumer should get it");
    }
    // Now it is at its prefetch limit of 3: the next messages go to the lower one.
    publish_n(&ch, &q, 2).await;
    for _ in 0..2 {
        let (who, _) = recv(&mut rx).await;
        assert_eq!(
            who, 0,
            "the lower-priority consumer should get the overflow"
        );
    }
    env.stop().await;
}

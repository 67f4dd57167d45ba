//! Tests of vhosts: declares and their equivalence, routing, TTL and expiry, dead-lettering,
//! delayed exchanges and limits, driven directly on a [`VHost`] with a manual clock.

use super::*;
use crate::broker::Broker;
use crate::message::QueuedMessage;

/// The vhost's snapshot of its durable definitions, decoded.
fn snapshot(v: &VHost, log_generation: u64) -> FieldTable {
    let bytes = v.topology.read().encode_snapshot(&v.name, log_generation);
    let mut d = warren_amqp::table::Decoder::new(&bytes);
    warren_amqp::table::decode_table(&mut d, 8).unwrap()
}

fn qd(name: &str) -> QueueDeclare {
    QueueDeclare {
        name: name.into(),
        ..Default::default()
    }
}

#[test]
fn declare_equivalence() {
    let v = VHost::new("/");
    v.declare_queue(&qd("q"), 1).unwrap();
    let err = v
        .declare_queue(
            &QueueDeclare {
                durable: true,
                ..qd("q")
            },
            1,
        )
        .unwrap_err();
    assert_eq!(err.code, 406);
    assert_eq!(
        err.text,
        "inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'"
    );
    let mut args = FieldTable::new();
    args.insert("x-message-ttl", FieldValue::I32(2000));
    let err = v
        .declare_queue(
            &QueueDeclare {
                arguments: args,
                ..qd("q")
            },
            1,
        )
        .unwrap_err();
    assert_eq!(
        err.text,
        "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the value '2000' of type 'signedint' but current is none"
    );
    // Unknown arguments are not compared.
    let mut args = FieldTable::new();
    args.insert("x-custom", FieldValue::I32(1));
    assert!(v
        .declare_queue(
            &QueueDeclare {
                arguments: args,
                ..qd("q")
            },
            1
        )
        .is_ok());
}

fn clocked() -> (Arc<crate::clock::ManualClock>, Arc<VHost>) {
    let clock = Arc::new(crate::clock::ManualClock::new(1_000_000));
    let b = Broker::with_clock(clock.clone());
    let v = b.vhost("/").unwrap();
    (clock, v)
}

fn declare_with(v: &VHost, name: &str, pairs: &[(&str, FieldValue)]) -> Arc<Queue> {
    v.declare_queue(
        &QueueDeclare {
            arguments: pairs.iter().cloned().collect(),
            ..qd(name)
        },
        1,
    )
    .unwrap()
    .0
}

fn text(v: &str) -> FieldValue {
    FieldValue::LongString(bytes::Bytes::copy_from_slice(v.as_bytes()))
}

fn send(v: &VHost, key: &str, body: &'static [u8]) {
    let m = Message::new(
        String::new(),
        key.into(),
        Default::default(),
        bytes::Bytes::from_static(body),
    );
    v.publish(Arc::new(m), None).unwrap();
}

#[test]
fn message_ttl_follows_the_clock() {
    let (clock, v) = clocked();
    let q = declare_with(&v, "t", &[("x-message-ttl", FieldValue::I32(1000))]);
    send(&v, "t", b"a");
    clock.advance(999);
    v.sweep();
    assert_eq!(q.counts().ready, 1);
    clock.advance(1);
    v.sweep();
    assert_eq!(q.counts().ready, 0);
}

#[test]
fn queue_expires_when_unused() {
    let (clock, v) = clocked();
    declare_with(&v, "e", &[("x-expires", FieldValue::I32(100))]);
    clock.advance(60);
    // A redeclare restarts the timer.
    declare_with(&v, "e", &[("x-expires", FieldValue::I32(100))]);
    clock.advance(60);
    v.sweep();
    assert!(v.queue("e", 1).is_ok());
    clock.advance(40);
    v.sweep();
    assert_eq!(v.queue("e", 1).unwrap_err().code, 404);
}

#[test]
fn expiry_cycles_are_dropped_but_rejections_cycle() {
    let (clock, v) = clocked();
    // "loop" dead-letters to itself through the default exchange.
    let q = declare_with(
        &v,
        "loop",
        &[
            ("x-message-ttl", FieldValue::I32(10)),
            ("x-dead-letter-exchange", text("")),
        ],
    );
    send(&v, "loop", b"x");
    clock.advance(10);
    v.sweep();
    assert_eq!(q.counts().ready, 0, "an expiry cycle drops the message");
    send(&v, "loop", b"y");
    let (m, _) = q.get(false).unwrap();
    q.settle(
        0,
        vec![crate::queue::Settlement {
            consumer_tag: None,
            message: m,
            requeue: false,
            rejected: true,
        }],
    );
    let (m, _) = q.get(true).expect("a rejected message comes back");
    let h = m.message.properties.headers.as_ref().unwrap();
    assert_eq!(
        h.get("x-first-death-reason").and_then(|v| v.as_str()),
        Some("rejected")
    );
    let deaths = h.get("x-death").and_then(|v| v.as_array()).unwrap();
    assert_eq!(deaths.len(), 1);
    // A second death for the same queue and reason counts up in the same entry.
    send(&v, "loop", b"z");
    for _ in 0..2 {
        let (m, _) = q.get(false).unwrap();
        q.settle(
            0,
            vec![crate::queue::Settlement {
                consumer_tag: None,
                message: m,
                requeue: false,
                rejected: true,
            }],
        );
    }
    let (twice, _) = q.get(true).unwrap();
    assert!(q.get(true).is_none());
    let count = |m: &crate::message::QueuedMessage| {
        let h = m.message.properties.headers.as_ref().unwrap();
        let d = h.get("x-death").and_then(|v| v.as_array()).unwrap();
        d[0].as_table()
            .unwrap()
            .get("count")
            .and_then(|v| v.as_i64())
    };
    assert_eq!(count(&twice), Some(2));
}

fn requeue(q: &Arc<Queue>, m: QueuedMessage) {
    q.settle(
        0,
        vec![crate::queue::Settlement {
            consumer_tag: None,
            message: m,
            requeue: true,
            rejected: false,
        }],
    );
}

fn bodies(q: &Arc<Queue>) -> Vec<String> {
    std::iter::from_fn(|| q.get(true))
        .map(|(m, _)| String::from_utf8_lossy(&m.message.body).into_owned())
        .collect()
}

#[test]
fn requeue_respects_length_limits() {
    // RabbitMQ 3.10.8: x-max-length 2, publish a b, get a, publish c, nack a with requeue:
    // drop-head keeps [b, c] and dead-letters a (maxlen); reject-publish keeps [a, b, c].
    for (overflow, kept, dead) in [
        ("drop-head", vec!["b", "c"], vec!["a"]),
        ("reject-publish", vec!["a", "b", "c"], vec![]),
        ("reject-publish-dlx", vec!["a", "b", "c"], vec![]),
    ] {
        let (_, v) = clocked();
        let dlq = declare_with(&v, "dlq", &[]);
        let q = declare_with(
            &v,
            "limited",
            &[
                ("x-max-length", FieldValue::I32(2)),
                ("x-overflow", text(overflow)),
                ("x-dead-letter-exchange", text("")),
                ("x-dead-letter-routing-key", text("dlq")),
            ],
        );
        send(&v, "limited", b"a");
        send(&v, "limited", b"b");
        let (a, _) = q.get(false).unwrap();
        send(&v, "limited", b"c");
        requeue(&q, a);
        assert_eq!(bodies(&q), kept, "{overflow}");
        let dl: Vec<(String, String)> = std::iter::from_fn(|| dlq.get(true))
            .map(|(m, _)| {
                let h = m.message.properties.headers.clone().unwrap_or_default();
                let reason = h
                    .get("x-first-death-reason")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string();
                (
                    String::from_utf8_lossy(&m.message.body).into_owned(),
                    reason,
                )
            })
            .collect();
        let want: Vec<(String, String)> = dead
            .iter()
            .map(|b| (b.to_string(), "maxlen".to_string()))
            .collect();
        assert_eq!(dl, want, "{overflow}");
    }
}

#[test]
fn requeue_respects_byte_limits() {
    let (_, v) = clocked();
    let q = declare_with(&v, "bytes", &[("x-max-length-bytes", FieldValue::I32(2))]);
    send(&v, "bytes", b"a");
    send(&v, "bytes", b"b");
    let (a, _) = q.get(false).unwrap();
    let (b, _) = q.get(false).unwrap();
    send(&v, "bytes", b"c");
    // Both come back (recover, channel close): the head goes until 2 bytes remain.
    q.settle(
        0,
        [a, b]
            .into_iter()
            .map(|m| crate::queue::Settlement {
                consumer_tag: None,
                message: m,
                requeue: true,
                rejected: false,
            })
            .collect(),
    );
    assert_eq!(bodies(&q), vec!["b", "c"]);
}

#[test]
fn exclusive_queues_are_never_durable() {
    let v = VHost::new("/");
    let (q, _) = v
        .declare_queue(
            &QueueDeclare {
                exclusive: true,
                durable: true,
                ..qd("ex")
            },
            1,
        )
        .unwrap();
    assert!(!q.durable());
    // Redeclaring with either durable flag is equivalent.
    for durable in [false, true] {
        v.declare_queue(
            &QueueDeclare {
                exclusive: true,
                durable,
                ..qd("ex")
            },
            1,
        )
        .unwrap();
    }
    assert!(snapshot(&v, 1)
        .get("queues")
        .and_then(|q| q.as_array())
        .unwrap()
        .is_empty());
}

#[test]
fn default_exchange_cannot_be_declared_even_passively() {
    let v = VHost::new("/");
    for passive in [true, false] {
        let e = v
            .declare_exchange(&ExchangeDeclare {
                name: String::new(),
                kind: "direct".into(),
                passive,
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(e.text, "operation not permitted on the default exchange");
    }
}

#[test]
fn exclusive_queues_are_locked() {
    let v = VHost::new("/");
    v.declare_queue(
        &QueueDeclare {
            exclusive: true,
            ..qd("ex")
        },
        1,
    )
    .unwrap();
    assert_eq!(v.queue("ex", 2).unwrap_err().code, 405);
    assert_eq!(v.declare_queue(&qd("ex"), 2).unwrap_err().code, 405);
    assert!(v.queue("ex", 1).is_ok());
    v.remove_exclusive_queues(1);
    assert_eq!(v.queue("ex", 1).unwrap_err().code, 404);
}

#[test]
fn routing_through_exchanges_and_alternate() {
    let v = VHost::new("/");
    for q in ["a", "b", "alt"] {
        v.declare_queue(&qd(q), 1).unwrap();
    }
    let mut args = FieldTable::new();
    args.insert(
        "alternate-exchange",
        FieldValue::LongString(bytes::Bytes::from_static(b"ae")),
    );
    v.declare_exchange(&ExchangeDeclare {
        name: "x".into(),
        kind: "direct".into(),
        arguments: args,
        ..Default::default()
    })
    .unwrap();
    v.declare_exchange(&ExchangeDeclare {
        name: "ae".into(),
        kind: "fanout".into(),
        ..Default::default()
    })
    .unwrap();
    v.declare_exchange(&ExchangeDeclare {
        name: "t".into(),
        kind: "topic".into(),
        ..Default::default()
    })
    .unwrap();
    let none = FieldTable::new();
    v.bind("x", Destination::Queue("a".into()), "k", &none, 1)
        .unwrap();
    v.bind("x", Destination::Exchange("t".into()), "k", &none, 1)
        .unwrap();
    v.bind("t", Destination::Queue("b".into()), "#", &none, 1)
        .unwrap();
    v.bind("t", Destination::Exchange("x".into()), "#", &none, 1)
        .unwrap(); // cycle
    v.bind("ae", Destination::Queue("alt".into()), "", &none, 1)
        .unwrap();
    let names = |key: &str| {
        let mut out = Vec::new();
        v.route("x", key, None, &mut out).unwrap();
        out.iter().map(|q| q.name().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(names("k"), vec!["a", "b"]);
    assert_eq!(names("other"), vec!["alt"]);
    let mut out = Vec::new();
    assert_eq!(v.route("nope", "k", None, &mut out).unwrap_err().code, 404);
}

#[test]
fn auto_delete_exchange_goes_with_last_binding() {
    let v = VHost::new("/");
    v.declare_queue(&qd("q"), 1).unwrap();
    v.declare_exchange(&ExchangeDeclare {
        name: "ad".into(),
        kind: "fanout".into(),
        auto_delete: true,
        ..Default::default()
    })
    .unwrap();
    v.bind(
        "ad",
        Destination::Queue("q".into()),
        "",
        &FieldTable::new(),
        1,
    )
    .unwrap();
    v.delete_queue("q", false, false, 1).unwrap();
    assert!(!v.exchange_exists("ad"));
}

#[test]
fn reserved_names_and_default_exchange() {
    let v = VHost::new("/");
    let e = v
        .declare_exchange(&ExchangeDeclare {
            name: "amq.foo".into(),
            kind: "direct".into(),
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(e.code, 403);
    assert_eq!(v.declare_queue(&qd("amq.q"), 1).unwrap_err().code, 403);
    assert_eq!(v.delete_exchange("", false).unwrap_err().code, 403);
    let e = v
        .declare_exchange(&ExchangeDeclare {
            name: "x".into(),
            kind: "nope".into(),
            ..Default::default()
        })
        .unwrap_err();
    // RabbitMQ 4.x: a channel error (3.x closed the connection with 503).
    assert_eq!(e.code, 406);
    assert_eq!(e.text, "unknown exchange type 'nope'");
    // An existing amq.* exchange may be redeclared, but not deleted.
    v.declare_exchange(&ExchangeDeclare {
        name: "amq.direct".into(),
        kind: "direct".into(),
        durable: true,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        v.delete_exchange("amq.direct", false).unwrap_err().text,
        "deletion of system exchange 'amq.direct' in vhost '/' not allowed"
    );
}

fn xd(name: &str, kind: &str, args: &[(&str, FieldValue)]) -> ExchangeDeclare {
    ExchangeDeclare {
        name: name.into(),
        kind: kind.into(),
        arguments: args.iter().cloned().collect(),
        ..Default::default()
    }
}

fn bind_q(v: &VHost, x: &str, q: &str, key: &str) {
    v.bind(x, Destination::Queue(q.into()), key, &FieldTable::new(), 1)
        .unwrap();
}

fn headers(pairs: &[(&str, FieldValue)]) -> FieldTable {
    pairs.iter().cloned().collect()
}

fn publish_with(v: &VHost, x: &str, key: &str, h: FieldTable, body: &'static [u8]) -> Published {
    let m = Message::new(
        x.into(),
        key.into(),
        warren_amqp::properties::BasicProperties {
            headers: Some(h),
            ..Default::default()
        },
        bytes::Bytes::from_static(body),
    );
    v.publish(Arc::new(m), None).unwrap()
}

#[test]
fn alternate_exchange_is_decided_per_exchange_visited() {
    // fanout E -> direct I (alternate-exchange A) ; A -> QA. A key I does not match
    // reaches QA and counts as routed (RabbitMQ 3.10.8: no basic.return).
    let v = VHost::new("/");
    v.declare_exchange(&xd("E", "fanout", &[])).unwrap();
    v.declare_exchange(&xd("A", "fanout", &[])).unwrap();
    v.declare_exchange(&xd("I", "direct", &[("alternate-exchange", text("A"))]))
        .unwrap();
    v.bind(
        "E",
        Destination::Exchange("I".into()),
        "",
        &FieldTable::new(),
        1,
    )
    .unwrap();
    let qa = v.declare_queue(&qd("QA"), 1).unwrap().0;
    let qi = v.declare_queue(&qd("QI"), 1).unwrap().0;
    bind_q(&v, "A", "QA", "");
    bind_q(&v, "I", "QI", "hit");
    let p = publish_with(&v, "E", "miss", FieldTable::new(), b"m");
    assert!(p.routed);
    assert_eq!((qa.counts().ready, qi.counts().ready), (1, 0));
    // E itself routed (to I), so E's own alternate exchange would not be used.
    let p = publish_with(&v, "E", "hit", FieldTable::new(), b"m");
    assert!(p.routed);
    assert_eq!((qa.counts().ready, qi.counts().ready), (1, 1));
}

#[test]
fn cc_and_bcc_route_and_bcc_is_removed() {
    let v = VHost::new("/");
    for q in ["k1", "k2", "k3"] {
        v.declare_queue(&qd(q), 1).unwrap();
    }
    v.declare_exchange(&xd("d", "direct", &[])).unwrap();
    v.declare_exchange(&xd("t", "topic", &[])).unwrap();
    for q in ["k1", "k2", "k3"] {
        bind_q(&v, "d", q, q);
        bind_q(&v, "t", q, &format!("{q}.#"));
    }
    let arr = |k: &str| FieldValue::Array(vec![text(k)]);
    for (x, cc, bcc) in [("d", "k2", "k3"), ("t", "k2.x", "k3"), ("", "k2", "k3")] {
        let p = publish_with(
            &v,
            x,
            "k1",
            headers(&[("CC", arr(cc)), ("BCC", arr(bcc))]),
            b"m",
        );
        assert!(p.routed, "{x}");
        for q in ["k1", "k2", "k3"] {
            let (m, _) = v
                .queue(q, 1)
                .unwrap()
                .get(true)
                .unwrap_or_else(|| panic!("{x} {q}"));
            let h = m.message.properties.headers.as_ref().unwrap();
            assert!(h.get("BCC").is_none(), "{x}");
            assert_eq!(h.get("CC"), Some(&arr(cc)));
            assert_eq!(m.message.routing_key, "k1");
        }
    }
    // A CC that is not an array is refused as RabbitMQ does.
    let m = Message::new(
        "d".into(),
        "k1".into(),
        warren_amqp::properties::BasicProperties {
            headers: Some(headers(&[("CC", text("k2"))])),
            ..Default::default()
        },
        bytes::Bytes::new(),
    );
    match v.publish(Arc::new(m), None) {
        Err(PublishError::Broker(e)) => {
            assert_eq!(e.code, 406);
            assert_eq!(
                e.text,
                "invalid message: {unacceptable_type_in_header,\"CC\",longstr}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn x_death_records_cc_keys_and_dead_letters_route_with_all_keys() {
    let (_, v) = clocked();
    v.declare_exchange(&xd("d", "direct", &[])).unwrap();
    for q in ["k2", "k3"] {
        v.declare_queue(&qd(q), 1).unwrap();
        bind_q(&v, "d", q, q);
    }
    let src = declare_with(&v, "src", &[("x-dead-letter-exchange", text("d"))]);
    let arr = |k: &str| FieldValue::Array(vec![text(k)]);
    publish_with(
        &v,
        "",
        "src",
        headers(&[("CC", arr("k2")), ("BCC", arr("k3"))]),
        b"m",
    );
    // CC k2 and BCC k3 reached their queues already; drain them.
    for q in ["k2", "k3"] {
        assert!(v.queue(q, 1).unwrap().get(true).is_some());
    }
    let (m, _) = src.get(false).unwrap();
    src.settle(
        0,
        vec![crate::queue::Settlement {
            consumer_tag: None,
            message: m,
            requeue: false,
            rejected: true,
        }],
    );
    // Dead-lettered with src, k2 and k3 (BCC keys included) ...
    for q in ["k2", "k3"] {
        let (m, _) = v.queue(q, 1).unwrap().get(true).expect(q);
        let h = m.message.properties.headers.as_ref().unwrap();
        let death = h.get("x-death").and_then(|d| d.as_array()).unwrap()[0]
            .as_table()
            .unwrap()
            .clone();
        // ... and x-death lists the routing key and CC, not BCC.
        assert_eq!(
            death.get("routing-keys"),
            Some(&FieldValue::Array(vec![text("src"), text("k2")]))
        );
    }
}

fn delayed_exchange(v: &VHost, name: &str, inner: &str) {
    v.declare_exchange(&xd(name, delayed::TYPE, &[("x-delayed-type", text(inner))]))
        .unwrap();
}

fn delay(ms: i32) -> FieldTable {
    headers(&[("x-delay", FieldValue::I32(ms))])
}

#[test]
fn delayed_exchange_holds_until_due_in_due_order() {
    let (clock, v) = clocked();
    delayed_exchange(&v, "dx", "direct");
    let q = declare_with(&v, "q", &[]);
    bind_q(&v, "dx", "q", "k");
    let p = publish_with(&v, "dx", "k", delay(300), b"late");
    // Held: no queue yet, so a mandatory publish is returned (as with the plugin).
    assert!(!p.routed);
    publish_with(&v, "dx", "k", delay(100), b"early");
    publish_with(&v, "dx", "k", delay(0), b"now");
    publish_with(&v, "dx", "k", delay(-5), b"negative");
    assert_eq!(bodies(&q), vec!["now", "negative"]);
    assert_eq!(v.delayed_count(), 2);
    clock.advance(99);
    v.sweep();
    assert!(q.get(true).is_none());
    clock.advance(1);
    v.sweep();
    let (m, _) = q.get(true).unwrap();
    assert_eq!(&m.message.body[..], b"early");
    let h = m.message.properties.headers.as_ref().unwrap();
    assert_eq!(h.get("x-delay"), Some(&FieldValue::I64(-100)));
    clock.advance(200);
    v.sweep();
    assert_eq!(bodies(&q), vec!["late"]);
    assert_eq!(v.delayed_count(), 0);
}

#[test]
fn delayed_exchange_behind_exchange_bindings() {
    // fanout f -> delayed dx (topic) -> q ; f -> now. The copy through dx is held, the
    // direct one is not; when due it is routed from dx, keeping exchange f and its key.
    let (clock, v) = clocked();
    v.declare_exchange(&xd("f", "fanout", &[])).unwrap();
    delayed_exchange(&v, "dx", "topic");
    v.bind(
        "f",
        Destination::Exchange("dx".into()),
        "",
        &FieldTable::new(),
        1,
    )
    .unwrap();
    let q = declare_with(&v, "q", &[]);
    let now = declare_with(&v, "now", &[]);
    bind_q(&v, "dx", "q", "a.*");
    bind_q(&v, "f", "now", "");
    // A second delayed exchange behind dx does not hold the message again.
    delayed_exchange(&v, "dx2", "fanout");
    v.bind(
        "dx",
        Destination::Exchange("dx2".into()),
        "#",
        &FieldTable::new(),
        1,
    )
    .unwrap();
    let q2 = declare_with(&v, "q2", &[]);
    bind_q(&v, "dx2", "q2", "");
    let p = publish_with(&v, "f", "a.b", delay(50), b"m");
    assert!(p.routed);
    assert_eq!((now.counts().ready, q.counts().ready), (1, 0));
    clock.advance(50);
    v.sweep();
    let (m, _) = q.get(true).unwrap();
    assert_eq!(
        (m.message.exchange.as_str(), m.message.routing_key.as_str()),
        ("f", "a.b")
    );
    assert_eq!(q2.counts().ready, 1);
    assert_eq!(v.delayed_count(), 0);
}

#[test]
fn delayed_exchange_uses_its_alternate_exchange_only_when_due() {
    // The plugin's open issue #36: RabbitMQ sees "no queues" at publish time and copies a
    // held message to the alternate exchange at once. Warren only uses it when the held
    // message is due and routes nowhere.
    let (clock, v) = clocked();
    v.declare_exchange(&xd("ae", "fanout", &[])).unwrap();
    v.declare_exchange(&xd(
        "dx",
        delayed::TYPE,
        &[
            ("x-delayed-type", text("direct")),
            ("alternate-exchange", text("ae")),
        ],
    ))
    .unwrap();
    let aq = declare_with(&v, "aq", &[]);
    bind_q(&v, "ae", "aq", "");
    publish_with(&v, "dx", "unbound", delay(10), b"m");
    assert_eq!(aq.counts().ready, 0);
    clock.advance(10);
    v.sweep();
    assert_eq!(aq.counts().ready, 1);
}

#[test]
fn deleting_a_delayed_exchange_drops_what_it_holds() {
    let (clock, v) = clocked();
    delayed_exchange(&v, "dx", "fanout");
    delayed_exchange(&v, "keep", "fanout");
    let q = declare_with(&v, "q", &[]);
    bind_q(&v, "dx", "q", "");
    bind_q(&v, "keep", "q", "");
    publish_with(&v, "dx", "", delay(10), b"gone");
    publish_with(&v, "keep", "", delay(10), b"kept");
    v.delete_exchange("dx", false).unwrap();
    assert_eq!(v.delayed_count(), 1);
    // Redeclared, it starts empty.
    delayed_exchange(&v, "dx", "fanout");
    bind_q(&v, "dx", "q", "");
    clock.advance(10);
    v.sweep();
    assert_eq!(bodies(&q), vec!["kept"]);
}

#[test]
fn delayed_exchange_declare_validation() {
    let v = VHost::new("/");
    let e = v
        .declare_exchange(&xd("dx", delayed::TYPE, &[]))
        .unwrap_err();
    assert_eq!(
        (e.code, e.text.as_str()),
        (
            406,
            "Invalid argument, 'x-delayed-type' must be an existing exchange type"
        )
    );
    let e = v
        .declare_exchange(&xd(
            "dx",
            delayed::TYPE,
            &[("x-delayed-type", text(delayed::TYPE))],
        ))
        .unwrap_err();
    assert_eq!(
        e.text,
        "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"
    );
    delayed_exchange(&v, "dx", "headers");
    // Only the type, flags and alternate-exchange are compared on redeclare.
    v.declare_exchange(&xd(
        "dx",
        delayed::TYPE,
        &[("x-delayed-type", text("fanout"))],
    ))
    .unwrap();
    let e = v.declare_exchange(&xd("dx", "headers", &[])).unwrap_err();
    assert_eq!(
        e.text,
        "inequivalent arg 'type' for exchange 'dx' in vhost '/': received 'headers' but current is 'x-delayed-message'"
    );
    // A headers-typed delayed exchange checks x-match like a headers exchange.
    v.declare_queue(&qd("q"), 1).unwrap();
    let e = v
        .bind(
            "dx",
            Destination::Queue("q".into()),
            "",
            &headers(&[("x-match", text("nope"))]),
            1,
        )
        .unwrap_err();
    assert_eq!(e.code, 406);
    // An unreadable x-delay fails the publish.
    let m = Message::new(
        "dx".into(),
        "".into(),
        warren_amqp::properties::BasicProperties {
            headers: Some(headers(&[("x-delay", text("soon"))])),
            ..Default::default()
        },
        bytes::Bytes::new(),
    );
    assert!(matches!(
        v.publish(Arc::new(m), None),
        Err(PublishError::Broker(BrokerError { code: 406, .. }))
    ));
}

#[test]
fn topic_match_budget_refuses_messages_that_need_more() {
    let b = Broker::new();
    b.set_limits(Limits {
        topic_match_budget: 500,
        ..Limits::default()
    });
    let v = b.vhost("/").unwrap();
    let q = v.declare_queue(&qd("q"), 1).unwrap().0;
    bind_q(&v, "amq.topic", "q", "#.a.#.a.#.a.#.a.#.a.#.a.#.a.c");
    // 60 words need about 800 node visits: over this budget.
    let m = Message::new(
        "amq.topic".into(),
        format!("{}b", "a.".repeat(60)),
        Default::default(),
        bytes::Bytes::new(),
    );
    match v.publish(Arc::new(m), None) {
        Err(PublishError::Broker(e)) => {
            assert_eq!(e.code, 406);
            assert_eq!(
                e.text,
                "cannot route message through exchange 'amq.topic' in vhost '/': topic matching needs more than 500 steps"
            );
        }
        other => panic!("{other:?}"),
    }
    // Shorter keys fit.
    publish_with(&v, "amq.topic", "a.a.a.a.a.a.a.c", FieldTable::new(), b"m");
    assert_eq!(q.counts().ready, 1);
}

#[test]
fn vhost_limits() {
    let b = Broker::new();
    b.set_limits(Limits {
        max_queues: 2,
        max_exchanges: 1,
        max_bindings: 2,
        ..Limits::default()
    });
    let v = b.vhost("/").unwrap();
    v.declare_queue(&qd("q1"), 1).unwrap();
    v.declare_queue(&qd("q2"), 1).unwrap();
    let e = v.declare_queue(&qd("q3"), 1).unwrap_err();
    assert_eq!(
        (e.code, e.text.as_str()),
        (
            406,
            "cannot declare queue 'q3': queue limit in vhost '/' (2) is reached"
        )
    );
    // Redeclares and passive declares still work at the limit.
    v.declare_queue(&qd("q2"), 1).unwrap();
    v.declare_exchange(&xd("x1", "direct", &[])).unwrap();
    let e = v.declare_exchange(&xd("x2", "direct", &[])).unwrap_err();
    assert_eq!(
        e.text,
        "cannot declare exchange 'x2' in vhost '/': exchange limit of 1 is reached"
    );
    v.declare_exchange(&xd("x1", "direct", &[])).unwrap();
    bind_q(&v, "x1", "q1", "a");
    bind_q(&v, "amq.direct", "q1", "b");
    bind_q(&v, "x1", "q1", "a");
    let e = v
        .bind(
            "x1",
            Destination::Queue("q2".into()),
            "c",
            &FieldTable::new(),
            1,
        )
        .unwrap_err();
    assert_eq!(
        e.text,
        "cannot bind queue 'q2' in vhost '/' to exchange 'x1' in vhost '/': binding limit of 2 is reached"
    );
    // Deleting a queue frees its bindings and its place.
    v.delete_queue("q1", false, false, 1).unwrap();
    bind_q(&v, "x1", "q2", "c");
    v.declare_queue(&qd("q3"), 1).unwrap();
    v.delete_exchange("x1", false).unwrap();
    assert_eq!(v.topology.read().bindings, 0);
    v.declare_exchange(&xd("x2", "direct", &[])).unwrap();
}

fn policy(name: &str, pattern: &str, def: serde_json::Value) -> crate::policy::Policy {
    crate::policy::Policy::from_json(
        name,
        &serde_json::json!({"pattern": pattern, "definition": def}),
        false,
    )
    .unwrap()
}

#[test]
fn policy_limits_apply_to_existing_queues_and_go_with_the_policy() {
    let (_, v) = clocked();
    let q = declare_with(&v, "pq", &[]);
    for b in [b"a", b"b", b"c"] {
        send(&v, "pq", b);
    }
    v.set_policy(
        false,
        policy("cap", "^pq", serde_json::json!({"max-length": 2})),
    )
    .unwrap();
    // Applied at once: the head goes.
    assert_eq!(q.counts().ready, 2);
    assert_eq!(q.applied_policy().policy.as_deref(), Some("cap"));
    send(&v, "pq", b"d");
    assert_eq!(bodies(&q), ["c", "d"]);
    // A queue declared later gets it too; one that does not match does not.
    let later = declare_with(&v, "pq-later", &[]);
    assert_eq!(later.args().max_length, Some(2));
    let other = declare_with(&v, "other", &[]);
    assert_eq!(other.args().max_length, None);
    assert!(v.clear_policy(false, "cap").unwrap());
    assert!(!v.clear_policy(false, "cap").unwrap());
    assert_eq!(q.args().max_length, None);
    assert_eq!(q.applied_policy().policy, None);
    for b in [b"e", b"f", b"g"] {
        send(&v, "pq", b);
    }
    assert_eq!(q.counts().ready, 3);
}

#[test]
fn policy_ttl_and_expires_with_arguments_lower_wins() {
    let (clock, v) = clocked();
    let with_arg = declare_with(&v, "t-arg", &[("x-message-ttl", FieldValue::I32(100))]);
    let plain = declare_with(&v, "t-plain", &[]);
    v.set_policy(
        false,
        policy(
            "ttl",
            "^t-",
            serde_json::json!({"message-ttl": 500, "expires": 10_000}),
        ),
    )
    .unwrap();
    let op = policy("op", "^t-plain$", serde_json::json!({"message-ttl": 300}));
    v.set_policy(true, op).unwrap();
    assert_eq!(with_arg.args().message_ttl, Some(100));
    assert_eq!(plain.args().message_ttl, Some(300));
    assert_eq!(
        plain.applied_policy().operator_policy.as_deref(),
        Some("op")
    );
    send(&v, "t-arg", b"x");
    send(&v, "t-plain", b"y");
    clock.advance(100);
    v.sweep();
    assert_eq!((with_arg.counts().ready, plain.counts().ready), (0, 1));
    clock.advance(200);
    v.sweep();
    assert_eq!(plain.counts().ready, 0);
    // The policy's expires deletes both once unused for 10 s.
    clock.advance(10_000);
    v.sweep();
    assert_eq!(v.queue("t-plain", 1).unwrap_err().code, 404);
    assert_eq!(v.queue("t-arg", 1).unwrap_err().code, 404);
}

#[test]
fn policy_commands_round_trip_as_tables() {
    use crate::vhost::log::TopologyCommand;
    let put = TopologyCommand::PutPolicy {
        operator: true,
        policy: policy(
            "p",
            "^a",
            serde_json::json!({"max-length": 3, "dead-letter-exchange": "dlx"}),
        ),
    };
    assert_eq!(TopologyCommand::from_table(&put.to_table()).unwrap(), put);
    let remove = TopologyCommand::RemovePolicy {
        operator: false,
        name: "p".into(),
    };
    assert_eq!(
        TopologyCommand::from_table(&remove.to_table()).unwrap(),
        remove
    );
}

/// Publishes to `queue` a message that expires after `ms` (its `expiration` property).
fn publish_expiring(v: &VHost, queue: &str, ms: u32) {
    let m = Message::new(
        String::new(),
        queue.into(),
        warren_amqp::properties::BasicProperties {
            expiration: Some(ms.to_string().into()),
            ..Default::default()
        },
        bytes::Bytes::from_static(b"x"),
    );
    v.publish(Arc::new(m), None).unwrap();
}

#[test]
fn the_sweep_visits_only_queues_with_something_to_sweep() {
    let (clock, v) = clocked();
    for i in 0..100 {
        declare_with(&v, &format!("idle{i}"), &[]);
    }
    let ttl = declare_with(&v, "ttl", &[("x-message-ttl", FieldValue::I32(1000))]);
    declare_with(&v, "exp", &[("x-expires", FieldValue::I32(60_000))]);
    let per_message = declare_with(&v, "pm", &[]);
    assert_eq!(v.swept_queues(), 103, "every new queue is visited once");
    v.sweep();
    assert_eq!(
        v.swept_queues(),
        2,
        "only the TTL and x-expires queues stay"
    );
    // A message with its own expiration brings its queue back, until it is gone.
    publish_expiring(&v, "pm", 500);
    assert_eq!(v.swept_queues(), 3);
    clock.advance(499);
    v.sweep();
    assert_eq!(per_message.counts().ready, 1);
    assert_eq!(v.swept_queues(), 3);
    clock.advance(1);
    v.sweep();
    assert_eq!(per_message.counts().ready, 0, "expired by the sweep");
    v.sweep();
    assert_eq!(v.swept_queues(), 2);
    // One taken by a client while it had time left leaves the set with it, and comes back
    // with it when the client gives it back.
    publish_expiring(&v, "pm", 500);
    let (m, _) = per_message.get(false).unwrap();
    v.sweep();
    assert_eq!(v.swept_queues(), 2, "nothing ready to expire");
    clock.advance(500);
    per_message.settle(
        0,
        vec![crate::queue::Settlement {
            consumer_tag: None,
            message: m,
            requeue: true,
            rejected: false,
        }],
    );
    assert_eq!(v.swept_queues(), 3);
    v.sweep();
    assert_eq!(per_message.counts().ready, 0, "expired once back");
    v.sweep();
    assert_eq!(v.swept_queues(), 2);
    send(&v, "ttl", b"a");
    clock.advance(1000);
    v.sweep();
    assert_eq!(ttl.counts().ready, 0);
    // A policy that gives the idle queues an x-expires brings them back at once.
    v.set_policy(
        false,
        policy("gone", "^idle", serde_json::json!({"expires": 100})),
    )
    .unwrap();
    assert_eq!(v.swept_queues(), 102);
    clock.advance(100);
    v.sweep();
    assert!(v.queue("idle7", 1).is_err(), "expired under the policy");
    assert_eq!(v.swept_queues(), 2);
}

#[test]
fn the_full_sweep_pass_visits_queues_that_held_messages_not_idle_ones() {
    let (_clock, v) = clocked();
    for i in 0..100 {
        declare_with(&v, &format!("idle{i}"), &[]);
    }
    declare_with(&v, "exp", &[("x-expires", FieldValue::I32(60_000))]);
    declare_with(&v, "used", &[]);
    send(&v, "used", b"a");
    v.sweep();
    let names = |full| {
        let mut n: Vec<String> = v
            .sweep_targets(full)
            .iter()
            .map(|q| q.name().to_string())
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(false), ["exp"]);
    assert_eq!(names(true), ["exp", "used"]);
    // A queue in both is visited once.
    declare_with(&v, "both", &[("x-message-ttl", FieldValue::I32(1000))]);
    send(&v, "both", b"b");
    assert_eq!(names(true), ["both", "exp", "used"]);
}

#[test]
fn a_policy_replayed_or_replicated_brings_idle_queues_into_the_sweep() {
    let (clock, v) = clocked();
    for i in 0..3 {
        declare_with(&v, &format!("idle{i}"), &[]);
    }
    v.sweep();
    assert_eq!(v.swept_queues(), 0);
    // The path of a policy set on another node of a cluster, or read from the log.
    let put = TopologyCommand::PutPolicy {
        operator: false,
        policy: policy("gone", "^idle", serde_json::json!({"expires": 100})),
    };
    v.apply(&mut v.topology.write(), &put);
    assert_eq!(v.swept_queues(), 3);
    clock.advance(100);
    v.sweep();
    assert!(v.queue("idle1", 1).is_err(), "expired under the policy");
}

#[test]
fn used_queues_are_those_that_held_a_message() {
    let (_clock, v) = clocked();
    for i in 0..100 {
        declare_with(&v, &format!("idle{i}"), &[]);
    }
    let used = declare_with(&v, "used", &[]);
    let restored = declare_with(&v, "restored", &[]);
    declare_with(&v, "gone", &[]);
    assert!(v.used_queues().is_empty());
    send(&v, "used", b"a");
    send(&v, "used", b"b");
    send(&v, "gone", b"c");
    restored.set_put_position(7);
    v.track_use(&restored);
    let names = |v: &VHost| {
        let mut n: Vec<String> = v
            .used_queues()
            .iter()
            .map(|q| q.name().to_string())
            .collect();
        n.sort();
        n
    };
    assert_eq!(names(&v), ["gone", "restored", "used"]);
    assert_eq!(used.positions().put, 2);
    v.delete_queue("gone", false, false, 1).unwrap();
    assert_eq!(names(&v), ["restored", "used"]);
    // A queue declared again under a deleted one's name joins at its own first enqueue.
    declare_with(&v, "gone", &[]);
    assert_eq!(names(&v), ["restored", "used"]);
    send(&v, "gone", b"d");
    assert_eq!(names(&v), ["gone", "restored", "used"]);
}

#[test]
fn the_used_set_stays_bounded_without_checkpoints() {
    // As a broker without the HTTP queue API: reply queues that each take a message and go.
    let (_clock, v) = clocked();
    let kept = declare_with(&v, "kept", &[]);
    send(&v, "kept", b"k");
    for i in 0..2000 {
        let name = format!("reply{i}");
        declare_with(&v, &name, &[]);
        send(&v, &name, b"r");
        v.delete_queue(&name, false, false, 1).unwrap();
        if i % 100 == 99 {
            // The broker's 50 ms sweep, which lets go of the queues it visited.
            v.sweep();
        }
    }
    // Pruned whenever it doubles: at most twice what was held at the last pruning (the
    // queues of the last 100 rounds, not yet let go by a sweep) and 64 more.
    assert!(v.used_held() <= 300, "{}", v.used_held());
    assert_eq!(v.used_queues().len(), 1);
    assert_eq!(kept.positions().put, 1);
}

#[test]
fn the_snapshot_is_the_durable_definitions_as_one_encoded_table() {
    let v = VHost::new("/");
    for (name, durable) in [("x", true), ("transient-x", false)] {
        v.declare_exchange(&ExchangeDeclare {
            name: name.into(),
            kind: "topic".into(),
            durable,
            ..Default::default()
        })
        .unwrap();
    }
    for q in ["b", "a"] {
        let durable = QueueDeclare {
            durable: true,
            ..qd(q)
        };
        v.declare_queue(&durable, 1).unwrap();
        let key = format!("{q}.#");
        v.bind(
            "x",
            Destination::Queue(q.into()),
            &key,
            &FieldTable::new(),
            1,
        )
        .unwrap();
    }
    v.declare_queue(&qd("transient"), 1).unwrap();
    v.bind(
        "x",
        Destination::Queue("transient".into()),
        "#",
        &FieldTable::new(),
        1,
    )
    .unwrap();
    v.set_policy(
        false,
        policy("p", "^a", serde_json::json!({"max-length": 2})),
    )
    .unwrap();
    let t = snapshot(&v, 7);
    let keys: Vec<&str> = t.0.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "name",
            "policies",
            "exchanges",
            "queues",
            "bindings",
            "log_generation"
        ]
    );
    let names = |k: &str, field: &str| -> Vec<String> {
        t.get(k)
            .and_then(|v| v.as_array())
            .unwrap()
            .iter()
            .map(|e| get_str(e.as_table().unwrap(), field).to_string())
            .collect()
    };
    assert_eq!(names("exchanges", "name"), ["x"]);
    assert_eq!(names("queues", "name"), ["a", "b"]);
    assert_eq!(names("bindings", "routing_key"), ["b.#", "a.#"]);
    assert_eq!(names("policies", "name"), ["p"]);
    assert_eq!(t.get("log_generation").and_then(|v| v.as_i64()), Some(7));
    // It is what a restart loads.
    let w = VHost::new("/");
    w.load_definitions(&t);
    let mut queues: Vec<String> = w.queues().iter().map(|q| q.name().to_string()).collect();
    queues.sort();
    assert_eq!(queues, ["a", "b"]);
    assert_eq!(w.queue("a", 1).unwrap().args().max_length, Some(2));
}

#[test]
fn bindings_share_the_name_of_their_queue() {
    let v = VHost::new("/");
    v.declare_exchange(&xd("t", "topic", &[])).unwrap();
    v.declare_exchange(&xd("d", "direct", &[])).unwrap();
    let q = v.declare_queue(&qd("user.42"), 1).unwrap().0;
    let name = q.shared_name();
    // The queue and the vhost's key for it.
    assert_eq!(Arc::strong_count(&name), 3);
    // queue.bind names the queue with a name of its own; the binding keeps the queue's.
    bind_q(&v, "t", "user.42", "user.42.#");
    let bound_to = |x: &str| {
        v.exchange_snapshots()
            .into_iter()
            .find(|s| s.name == x)
            .unwrap()
            .bindings
            .into_iter()
            .map(|b| b.destination)
            .collect::<Vec<_>>()
    };
    match &bound_to("t")[..] {
        [Destination::Queue(n)] => assert!(Arc::ptr_eq(n, &name)),
        other => panic!("{other:?}"),
    }
    // The binding and the topic trie's value: no copy of the name anywhere.
    assert_eq!(Arc::strong_count(&name), 5);
    // Replaying the definitions log shares it too.
    let add = TopologyCommand::AddBinding {
        source: "d".into(),
        binding: Binding {
            destination: Destination::Queue("user.42".into()),
            routing_key: "k".into(),
            arguments: FieldTable::new(),
        },
    };
    v.apply(&mut v.topology.write(), &add);
    match &bound_to("d")[..] {
        [Destination::Queue(n)] => assert!(Arc::ptr_eq(n, &name)),
        other => panic!("{other:?}"),
    }
    // Routing still finds the queue by name.
    publish_with(&v, "d", "k", FieldTable::new(), b"m");
    assert_eq!(q.counts().ready, 1);
}

//! Exchange routing end to end through lapin: direct, fanout, topic, headers, the default
//! exchange, exchange-to-exchange bindings and alternate exchanges.

mod lapin_support;

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeBindOptions, ExchangeDeclareOptions,
    ExchangeUnbindOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, ExchangeKind};
use lapin_support::*;

async fn declare_exchange(ch: &Channel, name: &str, kind: ExchangeKind) {
    declare_exchange_args(ch, name, kind, FieldTable::default()).await;
}

async fn declare_exchange_args(ch: &Channel, name: &str, kind: ExchangeKind, args: FieldTable) {
    within(
        "exchange.declare",
        ch.exchange_declare(name.into(), kind, ExchangeDeclareOptions::default(), args),
    )
    .await
    .expect("exchange.declare");
}

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    t
}

fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

/// Publishes one message per key (the key is the body) and returns, per queue, the keys it got.
async fn route_keys(
    ch: &Channel,
    exchange: &str,
    keys: &[&str],
    queues: &[&str],
) -> Vec<Vec<String>> {
    for k in keys {
        publish(ch, exchange, k, k.as_bytes()).await;
    }
    let mut out = Vec::new();
    for q in queues {
        out.push(drain(ch, q).await);
    }
    out
}

#[tokio::test]
async fn direct_exchange_multiple_bindings_and_shared_keys() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_exchange(&ch, "logs.direct", ExchangeKind::Direct).await;
    let q1 = declare_queue(&ch, "d1").await;
    let q2 = declare_queue(&ch, "d2").await;
    // q1 has two keys; "error" goes to both queues.
    bind(&ch, &q1, "logs.direct", "error").await;
    bind(&ch, &q1, "logs.direct", "warning").await;
    bind(&ch, &q2, "logs.direct", "error").await;
    bind(&ch, &q2, "logs.direct", "info").await;
    // Binding twice is idempotent: still one copy per queue.
    bind(&ch, &q2, "logs.direct", "info").await;

    let got = route_keys(
        &ch,
        "logs.direct",
        &["error", "warning", "info", "debug", "ERROR", ""],
        &[&q1, &q2],
    )
    .await;
    assert_eq!(got[0], vec!["error", "warning"]);
    assert_eq!(got[1], vec!["error", "info"]);

    // After unbinding "error" from q1 only q2 gets it.
    within(
        "queue.unbind",
        ch.queue_unbind(
            q1.as_str().into(),
            "logs.direct".into(),
            "error".into(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("queue.unbind");
    let got = route_keys(&ch, "logs.direct", &["error"], &[&q1, &q2]).await;
    assert_eq!(got, vec![Vec::<String>::new(), vec!["error".to_string()]]);
    env.stop().await;
}

#[tokio::test]
async fn fanout_ignores_routing_key() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_exchange(&ch, "fan", ExchangeKind::Fanout).await;
    let qs = [
        declare_queue(&ch, "").await,
        declare_queue(&ch, "").await,
        declare_queue(&ch, "").await,
    ];
    bind(&ch, &qs[0], "fan", "").await;
    bind(&ch, &qs[1], "fan", "whatever").await;
    bind(&ch, &qs[2], "fan", "x").await;
    let names: Vec<&str> = qs.iter().map(String::as_str).collect();
    let got = route_keys(&ch, "fan", &["", "a.b", "x"], &names).await;
    for g in got {
        assert_eq!(g, vec!["", "a.b", "x"]);
    }
    // amq.fanout is pre-declared.
    bind(&ch, &qs[0], "amq.fanout", "").await;
    let got = route_keys(&ch, "amq.fanout", &["k"], &names).await;
    assert_eq!(got[0], vec!["k"]);
    assert!(got[1].is_empty() && got[2].is_empty());
    env.stop().await;
}

/// Binds one queue per binding key on a fresh topic exchange and returns, per binding key, the
/// routing keys it received.
async fn topic_case(bindings: &[&str], keys: &[&str]) -> Vec<Vec<String>> {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_exchange(&ch, "t", ExchangeKind::Topic).await;
    let mut queues = Vec::new();
    for b in bindings {
        let q = declare_queue(&ch, "").await;
        bind(&ch, &q, "t", b).await;
        queues.push(q);
    }
    let names: Vec<&str> = queues.iter().map(String::as_str).collect();
    let got = route_keys(&ch, "t", keys, &names).await;
    env.stop().await;
    got
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn topic_hash_alone_matches_everything() {
    let keys = ["", "a", "a.b", "a.b.c", ".", "a..b"];
    let got = topic_case(&["#"], &keys).await;
    assert_eq!(got[0], strings(&keys));
}

#[tokio::test]
async fn topic_prefix_and_suffix_hash() {
    let keys = [
        "a", "a.b", "a.b.c", "b", "b.a", "x.y.b", "b.c", "", "ab", "a.",
    ];
    let got = topic_case(&["a.#", "#.b"], &keys).await;
    assert_eq!(got[0], strings(&["a", "a.b", "a.b.c", "a."]));
    assert_eq!(got[1], strings(&["a.b", "b", "x.y.b"]));
}

#[tokio::test]
async fn topic_star_and_empty_words() {
    let keys = ["a.b.c", "a..c", "a.c", "a.b.b.c", "a.bc", "x.b.c"];
    let got = topic_case(&["a.*.c", "a..c"], &keys).await;
    assert_eq!(got[0], strings(&["a.b.c", "a..c"]));
    assert_eq!(got[1], strings(&["a..c"]));
}

#[tokio::test]
async fn topic_star_does_not_match_empty_key() {
    // RabbitMQ splits the empty routing key into zero words: `*` needs exactly one, `#` takes
    // zero or more, and an empty binding key matches only the empty routing key.
    let keys = ["", "a", ".", "a.b"];
    let got = topic_case(&["*", "#", "", "*.*", "#.*"], &keys).await;
    assert_eq!(got[0], strings(&["a"]));
    assert_eq!(got[1], strings(&keys));
    assert_eq!(got[2], strings(&[""]));
    assert_eq!(got[3], strings(&[".", "a.b"]));
    assert_eq!(got[4], strings(&["a", ".", "a.b"]));
}

#[tokio::test]
async fn topic_tutorial_five() {
    let keys = [
        "quick.orange.rabbit",
        "lazy.orange.elephant",
        "quick.orange.fox",
        "lazy.brown.fox",
        "lazy.pink.rabbit",
        "quick.brown.fox",
        "orange",
        "quick.orange.new.rabbit",
        "lazy.orange.new.rabbit",
        "quick.orange.male.rabbit",
    ];
    // Q1: *.orange.*; Q2: *.*.rabbit and lazy.# (two bindings, one queue).
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_exchange(&ch, "topic_logs", ExchangeKind::Topic).await;
    let q1 = declare_queue(&ch, "").await;
    let q2 = declare_queue(&ch, "").await;
    bind(&ch, &q1, "topic_logs", "*.orange.*").await;
    bind(&ch, &q2, "topic_logs", "*.*.rabbit").await;
    bind(&ch, &q2, "topic_logs", "lazy.#").await;
    let got = route_keys(&ch, "topic_logs", &keys, &[&q1, &q2]).await;
    assert_eq!(
        got[0],
        strings(&[
            "quick.orange.rabbit",
            "lazy.orange.elephant",
            "quick.orange.fox"
        ])
    );
    // lazy.pink.rabbit matches both of Q2's bindings but is delivered once.
    assert_eq!(
        got[1],
        strings(&[
            "quick.orange.rabbit",
            "lazy.orange.elephant",
            "lazy.brown.fox",
            "lazy.pink.rabbit",
            "lazy.orange.new.rabbit",
        ])
    );
    env.stop().await;
}

#[tokio::test]
async fn topic_unbind_stops_routing() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_exchange(&ch, "t", ExchangeKind::Topic).await;
    let q = declare_queue(&ch, "tq").await;
    bind(&ch, &q, "t", "a.*").await;
    bind(&ch, &q, "t", "#.z").await;
    within(
        "queue.unbind",
        ch.queue_unbind("tq".into(), "t".into(), "a.*".into(), FieldTable::default()),
    )
    .await
    .expect("queue.unbind");
    let got = route_keys(&ch, "t", &["a.b", "a.z", "q.z"], &["tq"]).await;
    assert_eq!(got[0], strings(&["a.z", "q.z"]));
    env.stop().await;
}

/// Publishes to a headers exchange with `headers`; returns whether queue `q` got it.
async fn headers_routed(ch: &Channel, exchange: &str, q: &str, headers: FieldTable) -> bool {
    publish_props(
        ch,
        exchange,
        "ignored",
        b"h",
        BasicProperties::default().with_headers(headers),
    )
    .await;
    let got = drain(ch, q).await;
    assert!(got.len() <= 1);
    got.len() == 1
}

#[tokio::test]
async fn headers_all_and_any() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_exchange(&ch, "hx", ExchangeKind::Headers).await;
    let all = declare_queue(&ch, "all").await;
    let any = declare_queue(&ch, "any").await;
    let default_all = declare_queue(&ch, "default").await;
    let pattern = [("format", s("pdf")), ("type", s("report"))];
    let mut p_all = table(&pattern);
    p_all.insert("x-match".into(), s("all"));
    let mut p_any = table(&pattern);
    p_any.insert("x-match".into(), s("any"));
    bind_args(&ch, &all, "hx", "", p_all).await;
    bind_args(&ch, &any, "hx", "", p_any).await;
    // Without x-match the mode is `all`.
    bind_args(&ch, &default_all, "hx", "", table(&pattern)).await;

    let cases: Vec<(FieldTable, bool, bool)> = vec![
        (
            table(&[("format", s("pdf")), ("type", s("report"))]),
            true,
            true,
        ),
        (
            table(&[
                ("format", s("pdf")),
                ("type", s("report")),
                ("extra", s("1")),
            ]),
            true,
            true,
        ),
        (table(&[("format", s("pdf"))]), false, true),
        (
            table(&[("format", s("pdf")), ("type", s("log"))]),
            false,
            true,
        ),
        (
            table(&[("format", s("zip")), ("type", s("log"))]),
            false,
            false,
        ),
        (table(&[]), false, false),
        // Keys compare case-sensitively, values by bytes.
        (
            table(&[("Format", s("pdf")), ("type", s("REPORT"))]),
            false,
            false,
        ),
    ];
    for (i, (headers, want_all, want_any)) in cases.into_iter().enumerate() {
        let got_all = headers_routed(&ch, "hx", &all, headers.clone()).await;
        assert_eq!(
            drain(&ch, &default_all).await.len(),
            usize::from(want_all),
            "case {i}"
        );
        let got_any = drain(&ch, &any).await.len() == 1;
        assert_eq!((got_all, got_any), (want_all, want_any), "case {i}");
    }
    // A message without any headers table matches neither.
    publish(&ch, "hx", "", b"none").await;
    assert!(drain(&ch, &all).await.is_empty());
    assert!(drain(&ch, &any).await.is_empty());
    assert!(drain(&ch, &default_all).await.is_empty());
    env.stop().await;
}

#[tokio::test]
async fn headers_x_keys_and_with_x_modes() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_exchange(&ch, "hx", ExchangeKind::Headers).await;
    let all = declare_queue(&ch, "all").await;
    let all_x = declare_queue(&ch, "allx").await;
    let any = declare_queue(&ch, "any").await;
    let any_x = declare_queue(&ch, "anyx").await;
    let pat = |mode: &str| table(&[("x-match", s(mode)), ("x-tenant", s("t1")), ("k", s("v"))]);
    bind_args(&ch, &all, "hx", "", pat("all")).await;
    bind_args(&ch, &all_x, "hx", "", pat("all-with-x")).await;
    bind_args(&ch, &any, "hx", "", pat("any")).await;
    bind_args(&ch, &any_x, "hx", "", pat("any-with-x")).await;

    // (headers, all, all-with-x, any, any-with-x)
    let cases: Vec<(FieldTable, [bool; 4])> = vec![
        (table(&[("k", s("v"))]), [true, false, true, true]),
        (
            table(&[("k", s("v")), ("x-tenant", s("t1"))]),
            [true, true, true, true],
        ),
        (table(&[("x-tenant", s("t1"))]), [false, false, false, true]),
        (
            table(&[("k", s("no")), ("x-tenant", s("t2"))]),
            [false, false, false, false],
        ),
    ];
    for (i, (headers, want)) in cases.into_iter().enumerate() {
        publish_props(
            &ch,
            "hx",
            "",
            b"m",
            BasicProperties::default().with_headers(headers),
        )
        .await;
        let mut got = [false; 4];
        for (j, q) in [&all, &all_x, &any, &any_x].into_iter().enumerate() {
            got[j] = drain(&ch, q).await.len() == 1;
        }
        assert_eq!(got, want, "case {i}");
    }
    env.stop().await;
}

#[tokio::test]
async fn headers_void_and_numeric_values() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_exchange(&ch, "hx", ExchangeKind::Headers).await;
    let present = declare_queue(&ch, "present").await;
    let num = declare_queue(&ch, "num").await;
    let flag = declare_queue(&ch, "flag").await;
    // A void pattern value matches on presence of the key alone.
    bind_args(
        &ch,
        &present,
        "hx",
        "",
        table(&[("trace", AMQPValue::Void)]),
    )
    .await;
    // Numbers compare by value whatever their wire width.
    bind_args(&ch, &num, "hx", "", table(&[("n", AMQPValue::LongInt(42))])).await;
    bind_args(
        &ch,
        &flag,
        "hx",
        "",
        table(&[("on", AMQPValue::Boolean(true))]),
    )
    .await;

    assert!(headers_routed(&ch, "hx", &present, table(&[("trace", s("anything"))])).await);
    assert!(headers_routed(&ch, "hx", &present, table(&[("trace", AMQPValue::Void)])).await);
    assert!(
        headers_routed(
            &ch,
            "hx",
            &present,
            table(&[("trace", AMQPValue::LongLongInt(0))])
        )
        .await
    );
    assert!(!headers_routed(&ch, "hx", &present, table(&[("other", s("x"))])).await);

    for v in [
        AMQPValue::ShortShortInt(42),
        AMQPValue::ShortShortUInt(42),
        AMQPValue::ShortInt(42),
        AMQPValue::ShortUInt(42),
        AMQPValue::LongInt(42),
        AMQPValue::LongUInt(42),
        AMQPValue::LongLongInt(42),
    ] {
        assert!(
            headers_routed(&ch, "hx", &num, table(&[("n", v.clone())])).await,
            "{v:?} should equal 42"
        );
    }
    for v in [
        AMQPValue::LongInt(43),
        AMQPValue::LongLongInt(-42),
        s("42"),
        AMQPValue::Void,
    ] {
        assert!(
            !headers_routed(&ch, "hx", &num, table(&[("n", v.clone())])).await,
            "{v:?} should not equal 42"
        );
    }
    assert!(headers_routed(&ch, "hx", &flag, table(&[("on", AMQPValue::Boolean(true))])).await);
    assert!(
        !headers_routed(
            &ch,
            "hx",
            &flag,
            table(&[("on", AMQPValue::Boolean(false))])
        )
        .await
    );
    env.stop().await;
}

#[tokio::test]
async fn headers_invalid_x_match_is_refused() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_exchange(&ch, "hx", ExchangeKind::Headers).await;
    let q = declare_queue(&ch, "q").await;
    let res = within(
        "queue.bind",
        ch.queue_bind(
            q.as_str().into(),
            "hx".into(),
            "".into(),
            Default::default(),
            table(&[("x-match", s("some"))]),
        ),
    )
    .await;
    expect_code(res, 406);
    env.stop().await;
}

#[tokio::test]
async fn default_exchange_routes_by_queue_name() {
    let env = Env::start().await;
    let ch = env.channel().await;
    let q = declare_queue(&ch, "named").await;
    let gen = declare_queue(&ch, "").await;
    publish(&ch, "", "named", b"1").await;
    publish(&ch, "", &gen, b"2").await;
    publish(&ch, "", "missing", b"3").await;
    assert_eq!(drain(&ch, &q).await, vec!["1"]);
    assert_eq!(drain(&ch, &gen).await, vec!["2"]);
    // Binding to the default exchange is refused with 403.
    let res = within(
        "queue.bind",
        ch.queue_bind(
            q.as_str().into(),
            "".into(),
            "other".into(),
            Default::default(),
            FieldTable::default(),
        ),
    )
    .await;
    expect_code(res, 403);
    env.stop().await;
}

#[tokio::test]
async fn exchange_to_exchange_bindings() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_exchange(&ch, "src", ExchangeKind::Topic).await;
    declare_exchange(&ch, "mid", ExchangeKind::Direct).await;
    declare_exchange(&ch, "leaf", ExchangeKind::Fanout).await;
    let qm = declare_queue(&ch, "qm").await;
    let ql = declare_queue(&ch, "ql").await;
    // src --(a.#)--> mid --(a.b)--> qm ; src --(#.c)--> leaf --> ql ; leaf --> qm
    within(
        "exchange.bind",
        ch.exchange_bind(
            "mid".into(),
            "src".into(),
            "a.#".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("exchange.bind");
    within(
        "exchange.bind",
        ch.exchange_bind(
            "leaf".into(),
            "src".into(),
            "#.c".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("exchange.bind");
    bind(&ch, &qm, "mid", "a.b").await;
    bind(&ch, &ql, "leaf", "").await;
    bind(&ch, &qm, "leaf", "").await;

    // a.b reaches qm via mid; x.c reaches ql and qm via leaf; a.b.c... only via leaf (mid needs
    // exactly a.b); a.x goes nowhere.
    let got = route_keys(&ch, "src", &["a.b", "x.c", "a.b.c", "a.x"], &[&qm, &ql]).await;
    assert_eq!(got[0], strings(&["a.b", "x.c", "a.b.c"]));
    assert_eq!(got[1], strings(&["x.c", "a.b.c"]));

    // A message reaching the same queue by two paths is delivered once.
    within(
        "exchange.bind",
        ch.exchange_bind(
            "leaf".into(),
            "src".into(),
            "a.#".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("exchange.bind");
    let got = route_keys(&ch, "src", &["a.b"], &[&qm, &ql]).await;
    assert_eq!(got, vec![strings(&["a.b"]), strings(&["a.b"])]);

    within(
        "exchange.unbind",
        ch.exchange_unbind(
            "leaf".into(),
            "src".into(),
            "#.c".into(),
            ExchangeUnbindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("exchange.unbind");
    within(
        "exchange.unbind",
        ch.exchange_unbind(
            "leaf".into(),
            "src".into(),
            "a.#".into(),
            ExchangeUnbindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("exchange.unbind");
    let got = route_keys(&ch, "src", &["a.b", "x.c"], &[&qm, &ql]).await;
    assert_eq!(got, vec![strings(&["a.b"]), Vec::<String>::new()]);

    // Binding from or to a missing exchange is 404.
    let res = within(
        "exchange.bind",
        ch.exchange_bind(
            "nope".into(),
            "src".into(),
            "".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await;
    expect_code(res, 404);
    env.stop().await;
}

#[tokio::test]
async fn exchange_binding_cycles_terminate() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_exchange(&ch, "x1", ExchangeKind::Fanout).await;
    declare_exchange(&ch, "x2", ExchangeKind::Fanout).await;
    for (dst, src) in [("x2", "x1"), ("x1", "x2")] {
        within(
            "exchange.bind",
            ch.exchange_bind(
                dst.into(),
                src.into(),
                "".into(),
                ExchangeBindOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("exchange.bind");
    }
    let q = declare_queue(&ch, "q").await;
    bind(&ch, &q, "x2", "").await;
    let got = route_keys(&ch, "x1", &["k"], &[&q]).await;
    assert_eq!(got[0], strings(&["k"]));
    env.stop().await;
}

#[tokio::test]
async fn alternate_exchange_takes_unroutable_messages() {
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_exchange(&ch, "ae", ExchangeKind::Fanout).await;
    declare_exchange_args(
        &ch,
        "main",
        ExchangeKind::Direct,
        table(&[("alternate-exchange", s("ae"))]),
    )
    .await;
    let routed = declare_queue(&ch, "routed").await;
    let unrouted = declare_queue(&ch, "unrouted").await;
    bind(&ch, &routed, "main", "good").await;
    bind(&ch, &unrouted, "ae", "").await;

    let got = route_keys(
        &ch,
        "main",
        &["good", "bad", "other"],
        &[&routed, &unrouted],
    )
    .await;
    assert_eq!(got[0], strings(&["good"]));
    assert_eq!(got[1], strings(&["bad", "other"]));

    // A mandatory message that the alternate exchange routes is not returned.
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .expect("confirm.select");
    let confirm = within(
        "basic.publish",
        ch.basic_publish(
            "main".into(),
            "bad".into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            b"m",
            BasicProperties::default(),
        ),
    )
    .await
    .expect("basic.publish");
    let conf = within("confirm", confirm).await.expect("confirm");
    assert!(
        matches!(conf, Confirmation::Ack(None)),
        "expected a plain ack, got {conf:?}"
    );
    assert_eq!(drain(&ch, &unrouted).await, strings(&["m"]));

    // An alternate exchange that routes nowhere: the mandatory message comes back.
    within(
        "queue.unbind",
        ch.queue_unbind(
            unrouted.as_str().into(),
            "ae".into(),
            "".into(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("queue.unbind");
    let confirm = within(
        "basic.publish",
        ch.basic_publish(
            "main".into(),
            "bad".into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            b"lost",
            BasicProperties::default(),
        ),
    )
    .await
    .expect("basic.publish");
    match within("confirm", confirm).await.expect("confirm") {
        Confirmation::Ack(Some(ret)) => {
            assert_eq!(ret.reply_code, 312);
            assert_eq!(ret.delivery.data, b"lost");
        }
        other => panic!("expected a returned message, got {other:?}"),
    }
    env.stop().await;
}

#[tokio::test]
async fn unbinding_a_missing_binding_succeeds() {
    // queue.unbind of a binding that does not exist succeeds, as in RabbitMQ.
    let env = Env::start().await;
    let ch = env.channel().await;
    declare_exchange(&ch, "x", ExchangeKind::Direct).await;
    let q = declare_queue(&ch, "q").await;
    within(
        "queue.unbind",
        ch.queue_unbind(
            q.as_str().into(),
            "x".into(),
            "never".into(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("queue.unbind of a missing binding");
    env.stop().await;
}

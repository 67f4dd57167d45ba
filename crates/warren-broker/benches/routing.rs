//! Routing benchmarks through the public `Exchange` API: a topic exchange with 10,000 bindings
//! (literal words, `*` and `#` mixed), a direct exchange with 10,000 keys, and a fanout exchange
//! with 10 queues for reference, and a hostile topic binding (nested `#`) that an exponential
//! matcher takes seconds on.
//!
//! Run with: `cargo bench -p warren-broker --bench routing -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use warren_amqp::FieldTable;
use warren_broker::exchange::{Binding, Exchange};
use warren_broker::{Destination, ExchangeKind};

const REGIONS: usize = 20;
const SERVICES: usize = 50;
const EVENTS: usize = 10;

fn exchange(kind: ExchangeKind) -> Exchange {
    Exchange::new("x", kind, false, false, false, FieldTable::new())
}

fn bind(x: &mut Exchange, key: String, queue: usize) {
    assert!(x.bind(Binding {
        destination: Destination::Queue(format!("q{queue}").into()),
        routing_key: key,
        arguments: FieldTable::new(),
    }));
}

/// Binding keys of the form `region.service.event`, as a mix that a real deployment with many
/// per-service queues might have.
fn topic_exchange() -> Exchange {
    let mut x = exchange(ExchangeKind::Topic);
    let mut q = 0;
    let mut add = |x: &mut Exchange, key: String| {
        bind(x, key, q);
        q += 1;
    };
    // 7,000 fully literal keys.
    for i in 0..7_000 {
        let (r, s, e) = (
            i % REGIONS,
            (i / REGIONS) % SERVICES,
            i / (REGIONS * SERVICES),
        );
        add(&mut x, format!("region{r}.svc{s}.evt{e}"));
    }
    // 1,000 `region.service.#`.
    for r in 0..REGIONS {
        for s in 0..SERVICES {
            add(&mut x, format!("region{r}.svc{s}.#"));
        }
    }
    // 200 `region.*.event` and 500 `*.service.event`.
    for r in 0..REGIONS {
        for e in 0..EVENTS {
            add(&mut x, format!("region{r}.*.evt{e}"));
        }
    }
    for s in 0..SERVICES {
        for e in 0..EVENTS {
            add(&mut x, format!("*.svc{s}.evt{e}"));
        }
    }
    // 300 `#.event.retryN`.
    for e in 0..EVENTS {
        for k in 0..30 {
            add(&mut x, format!("#.evt{e}.retry{k}"));
        }
    }
    // 500: `regionN.#` for the upper half of the regions, 50 queues each.
    for r in REGIONS / 2..REGIONS {
        for _ in 0..50 {
            add(&mut x, format!("region{r}.#"));
        }
    }
    // 250 `*.*.alert` and 250 `#.alert`, each on its own queue.
    for _ in 0..250 {
        add(&mut x, "*.*.alert".to_owned());
    }
    for _ in 0..250 {
        add(&mut x, "#.alert".to_owned());
    }
    assert_eq!(x.binding_count(), 10_000);
    x
}

fn route_count(x: &Exchange, key: &str) -> usize {
    let mut n = 0;
    x.route(key, None, &mut |d| {
        black_box(d);
        n += 1;
    });
    n
}

fn bench_topic(c: &mut Criterion) {
    let x = topic_exchange();
    let cases = [
        ("0_matches", "eu.svc7.evt99", 0),
        ("1_match", "region3.svc7.evt99", 1),
        ("4_matches", "region3.svc7.evt5", 4),
        ("551_matches", "region12.svc7.alert", 551),
    ];
    let mut g = c.benchmark_group("topic_10k_bindings");
    for (name, key, expected) in cases {
        assert_eq!(route_count(&x, key), expected, "{key}");
        g.bench_function(name, |b| b.iter(|| route_count(&x, black_box(key))));
    }
    g.finish();
}

/// One binding with seven `#.a` pairs and a 60-word key of `a` then `b`: the pattern the
/// matcher must handle in polynomial time.
fn bench_topic_hostile(c: &mut Criterion) {
    let mut x = exchange(ExchangeKind::Topic);
    bind(&mut x, "#.a.#.a.#.a.#.a.#.a.#.a.#.a.c".to_owned(), 0);
    let key = format!("{}b", "a.".repeat(60));
    assert_eq!(route_count(&x, &key), 0);
    let mut g = c.benchmark_group("topic_hostile");
    g.bench_function("nested_hash_60_words", |b| {
        b.iter(|| route_count(&x, black_box(&key)))
    });
    g.finish();
}

fn bench_direct(c: &mut Criterion) {
    let mut x = exchange(ExchangeKind::Direct);
    for i in 0..10_000 {
        bind(&mut x, format!("orders.customer-{i}"), i);
    }
    let mut g = c.benchmark_group("direct_10k_keys");
    for (name, key, expected) in [
        ("hit", "orders.customer-4711", 1),
        ("miss", "orders.customer-99999", 0),
    ] {
        assert_eq!(route_count(&x, key), expected, "{key}");
        g.bench_function(name, |b| b.iter(|| route_count(&x, black_box(key))));
    }
    g.finish();
}

fn bench_fanout(c: &mut Criterion) {
    let mut x = exchange(ExchangeKind::Fanout);
    for i in 0..10 {
        bind(&mut x, String::new(), i);
    }
    assert_eq!(route_count(&x, "any"), 10);
    let mut g = c.benchmark_group("fanout_10_queues");
    g.bench_function("route", |b| b.iter(|| route_count(&x, black_box("any"))));
    g.finish();
}

criterion_group!(
    benches,
    bench_topic,
    bench_topic_hostile,
    bench_direct,
    bench_fanout
);
criterion_main!(benches);

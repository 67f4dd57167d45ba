"""Interop tests using pika's BlockingConnection.

The six RabbitMQ tutorial patterns (hello world, work queues, publish/subscribe,
routing, topics, RPC) written as real tests, plus a few protocol extras
(publisher confirms, basic_get, nack/requeue, channel errors).

Target broker: AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2F).
"""
import threading
import time
import uuid

import pika
import pika.exceptions
import pytest

from conftest import (
    QUIET,
    WAIT,
    collect,
    connect,
    drain_get,
    pump_for,
    pump_until,
    uniq,
)

PERSISTENT = 2  # delivery_mode for persistent messages


# ---------------------------------------------------------------------------
# 1. Hello world: default exchange, routing key == queue name
# ---------------------------------------------------------------------------

def test_hello_world(conn, res):
    ch = conn.channel()
    q = res.queue("hello")
    ok = ch.queue_declare(q)
    assert ok.method.queue == q
    assert ok.method.message_count == 0
    assert ok.method.consumer_count == 0

    ch.basic_publish(exchange="", routing_key=q, body=b"Hello World!")

    bodies = collect(conn, ch, q, 1)
    assert bodies == [b"Hello World!"]
    ch.queue_delete(q)


def test_hello_world_separate_connections(res):
    """Producer and consumer on different connections, as in the tutorial."""
    q = res.queue("hello2")
    prod = connect()
    cons = connect()
    try:
        cch = cons.channel()
        cch.queue_declare(q)
        pch = prod.channel()
        pch.queue_declare(q)  # idempotent re-declare from another connection
        for i in range(5):
            pch.basic_publish("", q, ("msg %d" % i).encode())
        bodies = collect(cons, cch, q, 5)
        assert bodies == [("msg %d" % i).encode() for i in range(5)]
    finally:
        prod.close()
        cons.close()


# ---------------------------------------------------------------------------
# 2. Work queues: durable queue, persistent messages, prefetch=1, manual ack
# ---------------------------------------------------------------------------

def test_work_queues_fair_dispatch_and_redelivery(res):
    q = res.queue("task")
    n = 8

    prod = connect()
    worker_a = connect()
    worker_b = connect()
    try:
        pch = prod.channel()
        ok = pch.queue_declare(q, durable=True)
        assert ok.method.queue == q
        pch.confirm_delivery()
        for i in range(n):
            pch.basic_publish(
                "", q, ("task %d" % i).encode(),
                properties=pika.BasicProperties(delivery_mode=PERSISTENT),
            )
        ok = pch.queue_declare(q, durable=True, passive=True)
        assert ok.method.message_count == n

        # Worker A: prefetch 1, takes a task and never acks it ("slow" / crashing worker).
        ach = worker_a.channel()
        ach.basic_qos(prefetch_count=1)
        a_got = []

        def on_a(ch, method, props, body):
            a_got.append((method, props, body))

        ach.basic_consume(q, on_a, auto_ack=False)
        assert pump_until(worker_a, lambda: len(a_got) >= 1), "worker A got nothing"
        # prefetch_count=1 must hold back further deliveries while one is unacked.
        pump_for(worker_a, QUIET)
        assert len(a_got) == 1, "prefetch=1 violated: worker A got %d" % len(a_got)
        a_method, a_props, a_body = a_got[0]
        assert a_method.redelivered is False
        assert a_props.delivery_mode == PERSISTENT

        # Worker B: prefetch 1, acks each task after "processing" it.
        bch = worker_b.channel()
        bch.basic_qos(prefetch_count=1)
        b_done = []

        def on_b(ch, method, props, body):
            assert props.delivery_mode == PERSISTENT
            b_done.append((body, method.redelivered))
            ch.basic_ack(method.delivery_tag)

        bch.basic_consume(q, on_b, auto_ack=False)
        assert pump_until(worker_b, lambda: len(b_done) >= n - 1), \
            "worker B processed %d of %d" % (len(b_done), n - 1)
        # Worker A is still holding its one unacked task; it must not have been given more.
        worker_a.process_data_events(time_limit=0)
        assert len(a_got) == 1

        # Worker A dies without acking: closing its channel requeues the task,
        # which is then redelivered to worker B with redelivered=True.
        ach.close()
        assert pump_until(worker_b, lambda: len(b_done) >= n), \
            "unacked task was not redelivered after channel close"
        pump_for(worker_b, QUIET)

        bodies = [b for b, _ in b_done]
        assert len(bodies) == n
        assert sorted(bodies) == sorted(("task %d" % i).encode() for i in range(n)), \
            "each task must be processed exactly once"
        redelivered = [(b, r) for b, r in b_done if r]
        assert redelivered == [(a_body, True)]

        ok = pch.queue_declare(q, durable=True, passive=True)
        assert ok.method.message_count == 0
        assert ok.method.consumer_count == 1
    finally:
        for c in (prod, worker_a, worker_b):
            if c.is_open:
                c.close()


def test_work_queues_round_robin_prefetch(res):
    """With prefetch=1 and both workers acking promptly, both get a share of the work
    and every message is acked exactly once."""
    q = res.queue("rr")
    n = 10
    prod = connect()
    w1 = connect()
    w2 = connect()
    try:
        pch = prod.channel()
        pch.queue_declare(q, durable=True)
        seen = {1: [], 2: []}
        chans = {}
        for idx, c in ((1, w1), (2, w2)):
            ch = c.channel()
            ch.basic_qos(prefetch_count=1)

            def cb(ch_, method, props, body, idx=idx):
                seen[idx].append(body)
                ch_.basic_ack(method.delivery_tag)

            ch.basic_consume(q, cb)
            chans[idx] = ch
        pch.confirm_delivery()
        for i in range(n):
            pch.basic_publish("", q, str(i).encode(),
                              properties=pika.BasicProperties(delivery_mode=PERSISTENT))

        def total():
            return len(seen[1]) + len(seen[2])

        deadline = time.monotonic() + WAIT
        while total() < n and time.monotonic() < deadline:
            w1.process_data_events(time_limit=0.02)
            w2.process_data_events(time_limit=0.02)
        for _ in range(10):
            w1.process_data_events(time_limit=0.02)
            w2.process_data_events(time_limit=0.02)
        allb = seen[1] + seen[2]
        assert sorted(allb, key=int) == [str(i).encode() for i in range(n)]
        assert seen[1] and seen[2], "both workers should get work: %r" % seen
    finally:
        for c in (prod, w1, w2):
            if c.is_open:
                c.close()


# ---------------------------------------------------------------------------
# 3. Publish/subscribe: fanout exchange, exclusive server-named queues
# ---------------------------------------------------------------------------

def test_publish_subscribe_fanout(conn, res):
    ch = conn.channel()
    x = res.exchange("logs")
    ch.exchange_declare(x, exchange_type="fanout")

    names = []
    for _ in range(2):
        r = ch.queue_declare("", exclusive=True)
        name = r.method.queue
        assert name, "server must generate a queue name"
        assert name.startswith("amq.gen-"), name
        ch.queue_bind(exchange=x, queue=name)
        names.append(name)
    assert names[0] != names[1]

    msgs = [("log %d" % i).encode() for i in range(4)]
    for m in msgs:
        # routing key is ignored by fanout exchanges
        ch.basic_publish(exchange=x, routing_key="ignored.%s" % uuid.uuid4().hex, body=m)

    for name in names:
        assert collect(conn, ch, name, len(msgs)) == msgs


def test_exclusive_queue_deleted_on_close(res):
    c1 = connect()
    ch = c1.channel()
    name = ch.queue_declare("", exclusive=True).method.queue
    c1.close()
    c2 = connect()
    try:
        # Deletion may complete just after close-ok; allow a short grace period.
        deadline = time.monotonic() + WAIT
        while True:
            ch2 = c2.channel()
            try:
                ch2.queue_declare(name, passive=True)
            except pika.exceptions.ChannelClosedByBroker as e:
                assert e.reply_code == 404
                break
            ch2.close()
            assert time.monotonic() < deadline, "exclusive queue survived its connection"
            time.sleep(0.1)
    finally:
        c2.close()


# ---------------------------------------------------------------------------
# 4. Routing: direct exchange, severities, multiple bindings
# ---------------------------------------------------------------------------

def test_routing_direct(conn, res):
    ch = conn.channel()
    x = res.exchange("direct_logs")
    ch.exchange_declare(x, exchange_type="direct")

    q_err = ch.queue_declare("", exclusive=True).method.queue
    q_all = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q_err, x, routing_key="error")
    for sev in ("info", "warning", "error"):
        ch.queue_bind(q_all, x, routing_key=sev)
    # A duplicate binding must not cause duplicate delivery.
    ch.queue_bind(q_all, x, routing_key="error")

    ch.confirm_delivery()
    sent = ["info", "warning", "error", "debug", "error", "critical"]
    for sev in sent:
        ch.basic_publish(x, sev, ("%s msg" % sev).encode())

    got_err = [m.routing_key for m, _, _ in drain_get(ch, q_err)]
    got_all = [m.routing_key for m, _, _ in drain_get(ch, q_all)]
    assert got_err == ["error", "error"]
    assert got_all == ["info", "warning", "error", "error"]

    # Unbind and check the binding is gone.
    ch.queue_unbind(q_all, x, routing_key="info")
    ch.basic_publish(x, "info", b"after unbind")
    ch.basic_publish(x, "warning", b"still bound")
    assert [b for _, _, b in drain_get(ch, q_all)] == [b"still bound"]


def test_routing_direct_consumers(conn, res):
    """Same as the tutorial's receive_logs_direct: consumers, not basic_get."""
    ch = conn.channel()
    x = res.exchange("direct_cons")
    ch.exchange_declare(x, exchange_type="direct")
    q1 = ch.queue_declare("", exclusive=True).method.queue
    q2 = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q1, x, "black")
    ch.queue_bind(q2, x, "black")
    ch.queue_bind(q2, x, "green")
    ch.basic_publish(x, "black", b"b1")
    ch.basic_publish(x, "green", b"g1")
    ch.basic_publish(x, "orange", b"o1")
    assert collect(conn, ch, q1, 1) == [b"b1"]
    assert collect(conn, ch, q2, 2) == [b"b1", b"g1"]


# ---------------------------------------------------------------------------
# 5. Topics
# ---------------------------------------------------------------------------

def test_topics(conn, res):
    ch = conn.channel()
    x = res.exchange("topic_logs")
    ch.exchange_declare(x, exchange_type="topic")

    queues = {}
    bindings = {
        "Q1": ["*.orange.*"],
        "Q2": ["*.*.rabbit", "lazy.#"],
        "ALL": ["#"],
        "AB": ["a.*.b"],
        "HASHMID": ["x.#.y"],
    }
    for label, keys in bindings.items():
        name = ch.queue_declare("", exclusive=True).method.queue
        for k in keys:
            ch.queue_bind(name, x, routing_key=k)
        queues[label] = name

    expected = {
        "quick.orange.rabbit": {"Q1", "Q2"},
        "lazy.orange.elephant": {"Q1", "Q2"},
        "quick.orange.fox": {"Q1"},
        "lazy.brown.fox": {"Q2"},
        "lazy.pink.rabbit": {"Q2"},  # matches both Q2 bindings, delivered once
        "quick.brown.fox": set(),
        "orange": set(),
        "quick.orange.male.rabbit": set(),
        "lazy.orange.male.rabbit": {"Q2"},
        "lazy": {"Q2"},  # '#' matches zero words
        "lazy.": {"Q2"},  # one empty trailing word
        ".orange.": {"Q1"},  # empty words still match '*'
        "..rabbit": {"Q2"},
        "a..b": {"AB"},  # empty middle word matches '*'
        "a.b": set(),  # '*' needs exactly one word
        "a.x.y.b": set(),
        "x.y": {"HASHMID"},
        "x.1.2.3.y": {"HASHMID"},
        "x..y": {"HASHMID"},
        "": set(),  # empty routing key: only '#'
        "#": set(),  # literal '#' in a routing key is just a word
        "*.orange.*": {"Q1"},  # literal '*' words match '*'
    }
    for label in queues:
        assert label in ("Q1", "Q2", "ALL", "AB", "HASHMID")

    ch.confirm_delivery()
    order = list(expected)
    for key in order:
        ch.basic_publish(x, key, ("msg:" + key).encode())

    for label, name in queues.items():
        got = [m.routing_key for m, _, _ in drain_get(ch, name)]
        if label == "ALL":
            want = order
        else:
            want = [k for k in order if label in expected[k]]
        assert got == want, "queue %s: got %r, want %r" % (label, got, want)


def test_topic_consumers_with_hash_alone(conn, res):
    ch = conn.channel()
    x = res.exchange("topic_hash")
    ch.exchange_declare(x, exchange_type="topic")
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, x, "#")
    keys = ["a", "a.b.c", "", "kern.critical"]
    for k in keys:
        ch.basic_publish(x, k, k.encode())
    assert collect(conn, ch, q, len(keys)) == [k.encode() for k in keys]


# ---------------------------------------------------------------------------
# 6. RPC
# ---------------------------------------------------------------------------

def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


class RpcServer(threading.Thread):
    def __init__(self, queue):
        super().__init__(daemon=True)
        self.queue = queue
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.error = None
        self.handled = 0

    def run(self):
        try:
            c = connect()
            try:
                ch = c.channel()
                ch.queue_declare(self.queue)
                ch.basic_qos(prefetch_count=1)

                def on_request(ch_, method, props, body):
                    n = int(body)
                    resp = str(fib(n)).encode()
                    # Counted before replying: the client may check the count as soon as the
                    # reply arrives.
                    self.handled += 1
                    ch_.basic_publish(
                        exchange="",
                        routing_key=props.reply_to,
                        properties=pika.BasicProperties(correlation_id=props.correlation_id),
                        body=resp,
                    )
                    ch_.basic_ack(method.delivery_tag)

                ch.basic_consume(self.queue, on_request)
                self.ready.set()
                while not self.stop.is_set():
                    c.process_data_events(time_limit=0.05)
            finally:
                c.close()
        except Exception as e:  # reported by the test
            self.error = e
            self.ready.set()


def test_rpc(conn, res):
    rpc_q = res.queue("rpc")
    server = RpcServer(rpc_q)
    server.start()
    try:
        assert server.ready.wait(WAIT), "RPC server did not start"
        assert server.error is None, server.error

        ch = conn.channel()
        callback_q = ch.queue_declare("", exclusive=True).method.queue
        responses = {}

        def on_response(ch_, method, props, body):
            responses[props.correlation_id] = body

        ch.basic_consume(callback_q, on_response, auto_ack=True)

        # One call at a time, like the tutorial's FibonacciRpcClient.call().
        for n in (0, 1, 2, 10, 30):
            corr = str(uuid.uuid4())
            ch.basic_publish(
                exchange="", routing_key=rpc_q,
                properties=pika.BasicProperties(reply_to=callback_q, correlation_id=corr),
                body=str(n).encode(),
            )
            assert pump_until(conn, lambda: corr in responses), "no RPC reply for fib(%d)" % n
            assert int(responses[corr]) == fib(n)

        # Several outstanding calls; replies are matched by correlation_id.
        pending = {}
        for n in (5, 6, 7, 8, 20):
            corr = str(uuid.uuid4())
            pending[corr] = n
            ch.basic_publish(
                "", rpc_q,
                properties=pika.BasicProperties(reply_to=callback_q, correlation_id=corr),
                body=str(n).encode(),
            )
        assert pump_until(conn, lambda: all(c in responses for c in pending))
        for corr, n in pending.items():
            assert int(responses[corr]) == fib(n)
        assert fib(30) == 832040
        assert server.handled == 10
        assert server.error is None, server.error
    finally:
        server.stop.set()
        server.join(WAIT)


def test_rpc_direct_reply_to(conn, res):
    """The RPC tutorial with RabbitMQ's direct reply-to instead of a callback queue."""
    rpc_q = res.queue("rpc-direct")
    server = RpcServer(rpc_q)
    server.start()
    try:
        assert server.ready.wait(WAIT), "RPC server did not start"
        ch = conn.channel()
        responses = {}

        def on_response(ch_, method, props, body):
            responses[props.correlation_id] = body

        ch.basic_consume("amq.rabbitmq.reply-to", on_response, auto_ack=True)
        for n in (3, 12):
            corr = str(uuid.uuid4())
            ch.basic_publish(
                "", rpc_q,
                properties=pika.BasicProperties(
                    reply_to="amq.rabbitmq.reply-to", correlation_id=corr),
                body=str(n).encode(),
            )
            assert pump_until(conn, lambda: corr in responses), "no direct reply for fib(%d)" % n
            assert int(responses[corr]) == fib(n)
        assert server.error is None, server.error
    finally:
        server.stop.set()
        server.join(WAIT)


# ---------------------------------------------------------------------------
# Extras
# ---------------------------------------------------------------------------

def test_publisher_confirms_and_unroutable(conn, res):
    ch = conn.channel()
    ch.confirm_delivery()
    q = res.queue("confirm")
    ch.queue_declare(q)
    # Confirmed publishes return normally.
    for i in range(5):
        ch.basic_publish("", q, ("c%d" % i).encode(), mandatory=True)
    assert ch.queue_declare(q, passive=True).method.message_count == 5

    # Mandatory publish that routes nowhere is returned -> UnroutableError.
    with pytest.raises(pika.exceptions.UnroutableError) as ei:
        ch.basic_publish("", "no-such-queue-" + uuid.uuid4().hex, b"lost", mandatory=True)
    returned = ei.value.messages
    assert len(returned) == 1
    assert returned[0].method.reply_code == 312
    assert returned[0].method.reply_text == "NO_ROUTE"
    assert returned[0].body == b"lost"

    x = res.exchange("confirm_x")
    ch.exchange_declare(x, exchange_type="direct")
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(x, "nobody", b"lost too", mandatory=True)

    # Non-mandatory unroutable publish is silently dropped (and still confirmed).
    ch.basic_publish(x, "nobody", b"dropped")
    # Channel is still usable afterwards.
    ch.basic_publish("", q, b"after", mandatory=True)
    assert ch.queue_declare(q, passive=True).method.message_count == 6


def test_basic_get_message_count(conn, res):
    ch = conn.channel()
    q = res.queue("get")
    ch.queue_declare(q)
    method, props, body = ch.basic_get(q, auto_ack=True)
    assert method is None  # get-empty

    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", q, ("m%d" % i).encode())

    counts = []
    bodies = []
    for _ in range(3):
        method, props, body = ch.basic_get(q, auto_ack=False)
        assert method is not None
        assert method.redelivered is False
        assert method.exchange == ""
        assert method.routing_key == q
        counts.append(method.message_count)
        bodies.append(body)
        ch.basic_ack(method.delivery_tag)
    assert counts == [2, 1, 0]
    assert bodies == [b"m0", b"m1", b"m2"]
    method, _, _ = ch.basic_get(q)
    assert method is None


def test_basic_nack_requeue_sets_redelivered(conn, res):
    ch = conn.channel()
    q = res.queue("nack")
    ch.queue_declare(q)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"again")

    got = []

    def cb(ch_, method, props, body):
        got.append((method.delivery_tag, method.redelivered, body))

    tag = ch.basic_consume(q, cb, auto_ack=False)
    assert pump_until(conn, lambda: len(got) >= 1)
    dtag, redelivered, body = got[0]
    assert (redelivered, body) == (False, b"again")
    ch.basic_nack(dtag, requeue=True)
    assert pump_until(conn, lambda: len(got) >= 2), "nacked message was not redelivered"
    dtag2, redelivered2, body2 = got[1]
    assert (redelivered2, body2) == (True, b"again")
    assert dtag2 != dtag
    ch.basic_ack(dtag2)
    ch.basic_cancel(tag)
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_basic_reject_without_requeue_discards(conn, res):
    ch = conn.channel()
    q = res.queue("reject")
    ch.queue_declare(q)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"bad")
    ch.basic_publish("", q, b"good")
    m, _, body = ch.basic_get(q)
    assert body == b"bad"
    ch.basic_reject(m.delivery_tag, requeue=False)
    m, _, body = ch.basic_get(q)
    assert body == b"good"
    assert m.redelivered is False
    ch.basic_ack(m.delivery_tag)
    m, _, _ = ch.basic_get(q)
    assert m is None


def test_message_properties_round_trip(conn, res):
    ch = conn.channel()
    q = res.queue("props")
    ch.queue_declare(q)
    props = pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers={"x-str": "v", "x-int": 42, "x-bool": True, "x-list": [1, "two"],
                 "x-nested": {"k": "v"}},
        delivery_mode=PERSISTENT,
        priority=3,
        correlation_id="corr-1",
        reply_to="reply.here",
        expiration="60000",
        message_id="mid-1",
        timestamp=1700000000,
        type="test.type",
        user_id="guest",
        app_id="interop",
    )
    body = bytes(range(256)) * 600  # > 128 KiB: spans several body frames
    ch.confirm_delivery()
    ch.basic_publish("", q, body, properties=props)
    m, p, b = ch.basic_get(q, auto_ack=True)
    assert m is not None
    assert b == body
    for field in ("content_type", "content_encoding", "delivery_mode", "priority",
                  "correlation_id", "reply_to", "expiration", "message_id",
                  "timestamp", "type", "user_id", "app_id"):
        assert getattr(p, field) == getattr(props, field), field
    assert p.headers["x-str"] in ("v", b"v")
    assert p.headers["x-int"] == 42
    assert p.headers["x-bool"] is True
    assert p.headers["x-nested"]["k"] in ("v", b"v")
    assert len(p.headers["x-list"]) == 2


def test_empty_body(conn, res):
    ch = conn.channel()
    q = res.queue("empty")
    ch.queue_declare(q)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"")
    m, _, b = ch.basic_get(q, auto_ack=True)
    assert m is not None and b == b""


def test_passive_declare_missing_queue_404(conn):
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare(uniq("missing"), passive=True)
    assert ei.value.reply_code == 404
    assert "NOT_FOUND" in ei.value.reply_text
    # The connection survives a channel-level error.
    assert conn.is_open
    ch2 = conn.channel()
    assert ch2.is_open


def test_passive_declare_missing_exchange_404(conn):
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.exchange_declare(uniq("missingx"), passive=True)
    assert ei.value.reply_code == 404


def test_redeclare_mismatched_durable_406(conn, res):
    ch = conn.channel()
    q = res.queue("mismatch")
    ch.queue_declare(q, durable=False)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare(q, durable=True)
    assert ei.value.reply_code == 406
    assert "PRECONDITION_FAILED" in ei.value.reply_text
    assert conn.is_open


def test_exchange_redeclare_mismatched_type_406(conn, res):
    ch = conn.channel()
    x = res.exchange("xmismatch")
    ch.exchange_declare(x, exchange_type="direct")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.exchange_declare(x, exchange_type="fanout")
    assert ei.value.reply_code == 406


def test_exclusive_queue_locked_for_other_connection(conn, res):
    ch = conn.channel()
    name = ch.queue_declare("", exclusive=True).method.queue
    other = connect()
    try:
        och = other.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
            och.basic_consume(name, lambda *a: None)
        assert ei.value.reply_code == 405
    finally:
        other.close()


def test_queue_purge_and_delete_counts(conn, res):
    ch = conn.channel()
    q = res.queue("purge")
    ch.queue_declare(q)
    ch.confirm_delivery()
    for i in range(4):
        ch.basic_publish("", q, b"x")
    assert ch.queue_purge(q).method.message_count == 4
    ch.basic_publish("", q, b"y")
    assert ch.queue_delete(q).method.message_count == 1

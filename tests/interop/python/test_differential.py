"""Differential tests: observable AMQP behaviour compared with RabbitMQ.

Every scenario runs a short client script and records what the broker observably did as
plain data: reply codes, reply texts and class/method ids of channel and connection closes,
declare-ok counts, get-ok and deliver fields, message properties and header values together
with their AMQP field types, basic.return fields, delivery order, confirm acks and nacks.
The expected values in EXPECTED were recorded against RabbitMQ (see the notes next to the
few entries where RabbitMQ 4.x differs from the 3.10 reference), so the suite passes against
both Warren and RabbitMQ.

To print what a broker does (e.g. to compare two brokers):

    AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2F python3 test_differential.py > out.json
    python3 test_differential.py --check     # compare against EXPECTED, print differences
"""
import decimal
import json
import os
import re
import struct
import sys
import time
import uuid

import pika
import pika.channel
import pika.connection
import pika.spec as spec
import pytest
from pika import exceptions

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import connect, pump_for, pump_until  # noqa: E402

RUN = uuid.uuid4().hex[:10]

# ---------------------------------------------------------------------------
# Instrumentation: class/method ids of closes and typed content-header tables
# ---------------------------------------------------------------------------
LAST_CLOSE = {}

_orig_chan_close = pika.channel.Channel._on_close_from_broker


def _chan_close(self, method_frame):
    m = method_frame.method
    LAST_CLOSE["channel"] = [m.reply_code, m.reply_text, m.class_id, m.method_id]
    return _orig_chan_close(self, method_frame)


pika.channel.Channel._on_close_from_broker = _chan_close

_orig_conn_close = pika.connection.Connection._on_connection_close_from_broker


def _conn_close(self, method_frame):
    m = method_frame.method
    LAST_CLOSE["connection"] = [m.reply_code, m.reply_text, m.class_id, m.method_id]
    return _orig_conn_close(self, method_frame)


pika.connection.Connection._on_connection_close_from_broker = _conn_close


def _shortstr(b, o):
    n = b[o]
    return b[o + 1:o + 1 + n].decode("utf-8", "replace"), o + 1 + n


def _typed_value(b, o):
    t = chr(b[o])
    o += 1
    if t == "t":
        return ["t", bool(b[o])], o + 1
    if t == "b":
        return ["b", struct.unpack_from(">b", b, o)[0]], o + 1
    if t == "B":
        return ["B", b[o]], o + 1
    if t == "s":
        return ["s", struct.unpack_from(">h", b, o)[0]], o + 2
    if t == "u":
        return ["u", struct.unpack_from(">H", b, o)[0]], o + 2
    if t == "I":
        return ["I", struct.unpack_from(">i", b, o)[0]], o + 4
    if t == "i":
        return ["i", struct.unpack_from(">I", b, o)[0]], o + 4
    if t == "l":
        return ["l", struct.unpack_from(">q", b, o)[0]], o + 8
    if t == "f":
        return ["f", struct.unpack_from(">f", b, o)[0]], o + 4
    if t == "d":
        return ["d", struct.unpack_from(">d", b, o)[0]], o + 8
    if t == "D":
        scale = b[o]
        v = struct.unpack_from(">i", b, o + 1)[0]
        return ["D", [scale, v]], o + 5
    if t in "Sx":
        n = struct.unpack_from(">I", b, o)[0]
        raw = b[o + 4:o + 4 + n]
        return [t, raw.decode("utf-8", "replace") if t == "S" else raw.hex()], o + 4 + n
    if t == "T":
        return ["T", struct.unpack_from(">Q", b, o)[0]], o + 8
    if t == "V":
        return ["V", None], o
    if t == "F":
        v, o = _typed_table(b, o)
        return ["F", v], o
    if t == "A":
        n = struct.unpack_from(">I", b, o)[0]
        end = o + 4 + n
        o += 4
        items = []
        while o < end:
            v, o = _typed_value(b, o)
            items.append(v)
        return ["A", items], end
    raise ValueError("unknown field type %r" % t)


def _typed_table(b, o):
    n = struct.unpack_from(">I", b, o)[0]
    end = o + 4 + n
    o += 4
    out = []
    while o < end:
        k, o = _shortstr(b, o)
        v, o = _typed_value(b, o)
        out.append([k, v])
    return out, end


def _typed_headers(b, o):
    """The headers table of a content header's property list, field order and types kept."""
    flags = struct.unpack_from(">H", b, o)[0]
    o += 2
    if flags & 0x8000:
        _, o = _shortstr(b, o)
    if flags & 0x4000:
        _, o = _shortstr(b, o)
    if flags & 0x2000:
        return _typed_table(b, o)[0]
    return None


_orig_props_decode = spec.BasicProperties.decode


def _props_decode(self, encoded, offset=0):
    self._typed_headers = _typed_headers(bytes(encoded), offset)
    return _orig_props_decode(self, encoded, offset)


spec.BasicProperties.decode = _props_decode

# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
PROP_FIELDS = ["content_type", "content_encoding", "delivery_mode", "priority",
               "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
               "type", "user_id", "app_id", "cluster_id"]


def props_of(p):
    if p is None:
        return None
    d = {f: getattr(p, f) for f in PROP_FIELDS if getattr(p, f) is not None}
    h = getattr(p, "_typed_headers", None)
    if h is not None:
        d["headers"] = h
    return d


def n(prefix):
    return "diff.%s.%s" % (prefix, RUN)


def err_of(e):
    if isinstance(e, exceptions.ChannelClosedByBroker):
        return {"channel_close": LAST_CLOSE.pop("channel", [e.reply_code, e.reply_text])}
    if isinstance(e, exceptions.ConnectionClosedByBroker):
        return {"connection_close": LAST_CLOSE.pop("connection", [e.reply_code, e.reply_text])}
    if isinstance(e, exceptions.ConnectionClosed):
        return {"connection_lost": type(e).__name__}
    if isinstance(e, exceptions.NackError):
        return {"nacked": len(e.messages)}
    if isinstance(e, exceptions.UnroutableError):
        return {"returned": [[m.method.reply_code, m.method.reply_text, m.method.exchange,
                              m.method.routing_key, m.body] for m in e.messages]}
    raise e


def attempt(fn):
    """Run fn; its result, or the close/exception it caused as data."""
    try:
        r = fn()
        return {"ok": r}
    except (exceptions.AMQPError) as e:
        return err_of(e)


def getok(ch, q, auto_ack=True):
    m, p, body = ch.basic_get(q, auto_ack=auto_ack)
    if m is None:
        return None
    return {"delivery_tag": m.delivery_tag, "redelivered": m.redelivered,
            "exchange": m.exchange, "routing_key": m.routing_key,
            "message_count": m.message_count, "props": props_of(p), "body": body}


def drain(ch, q, limit=100):
    out = []
    for _ in range(limit):
        g = getok(ch, q)
        if g is None:
            break
        out.append(g)
    return out


def bodies(ch, q):
    return [g["body"] for g in drain(ch, q)]


def qcount(ch, q):
    return ch.queue_declare(q, passive=True).method.message_count


def settle():
    time.sleep(0.15)


class Ctx:
    """One scenario's connections and created resources."""

    def __init__(self):
        self.conns = []
        self.queues = []
        self.exchanges = []

    def conn(self):
        c = connect()
        self.conns.append(c)
        return c

    def ch(self, conn=None):
        """A new channel on conn (or the latest connection); on a new connection if that one
        was closed by an earlier connection-level error."""
        conn = conn or (self.conns[-1] if self.conns else self.conn())
        if not conn.is_open:
            conn = self.conns[-1] if self.conns[-1].is_open else self.conn()
        return conn.channel()

    def q(self, tag):
        name = n(tag)
        self.queues.append(name)
        return name

    def x(self, tag):
        name = n(tag)
        self.exchanges.append(name)
        return name

    def close(self):
        for c in self.conns:
            try:
                if c.is_open:
                    c.close()
            except Exception:
                pass
        if not self.queues and not self.exchanges:
            return
        c = connect()
        try:
            for q in self.queues:
                try:
                    c.channel().queue_delete(q)
                except Exception:
                    pass
            for x in self.exchanges:
                try:
                    c.channel().exchange_delete(x)
                except Exception:
                    pass
        finally:
            try:
                c.close()
            except Exception:
                pass


def raw(ch, method):
    """Send a method on a blocking channel without pika's client-side checks."""
    ch._impl._send_method(method)


def confirm_on(c, ch, cb):
    """Put a blocking channel's underlying channel in confirm mode with an ack/nack callback."""
    done = []
    ch._impl.confirm_delivery(cb, callback=lambda f: done.append(1))
    pump_until(c, lambda: done)


def summarize_confirms(events, tag_of_body):
    """Confirms as RabbitMQ's observable contract: which tags were acked / nacked (a
    multiple=true confirm stands for every tag up to it; brokers may coalesce), the returns
    in order, and whether each return arrived before the confirm of its message."""
    confirmed, acked, nacked, returns, seen = set(), [], [], [], {}
    for e in events:
        if e[0] == "return":
            returns.append(e[1:])
            seen.setdefault(("return", e[-1]), len(seen))
            continue
        kind, tag, multiple = e[0], e[1], e[2] if len(e) > 2 else False
        tags = [t for t in range(1, tag + 1) if t not in confirmed] if multiple else [tag]
        for t in tags:
            confirmed.add(t)
            (acked if kind == "Ack" else nacked).append(t)
            seen[("confirm", t)] = len(seen)
    before = all(seen[("return", body)] < seen.get(("confirm", tag_of_body.get(body)), 1 << 30)
                 for body in [r[-1] for r in returns])
    return {"acked": sorted(acked), "nacked": sorted(nacked), "returns": returns,
            "returns_before_confirms": before}


def sync(ch):
    """A round trip on ch (basic.qos), so that an error caused earlier shows."""
    return attempt(lambda: ch.basic_qos(prefetch_count=0) or "alive")


SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


# ---------------------------------------------------------------------------
# Normalisation: run-specific names and non-deterministic values
# ---------------------------------------------------------------------------
GEN_RE = re.compile(r"amq\.gen-[A-Za-z0-9_-]{22}")
CTAG_RE = re.compile(r"amq\.ctag-[A-Za-z0-9_-]{22}")
PIKA_CTAG_RE = re.compile(r"ctag(\d+)\.[0-9a-f]{32}")


def norm(v):
    if isinstance(v, bytes):
        v = "b:" + v.decode("utf-8", "replace")
    if isinstance(v, str):
        v = v.replace(RUN, "RUN")
        v = GEN_RE.sub("amq.gen-<22>", v)
        v = PIKA_CTAG_RE.sub(r"ctag\1.<pika>", v)
        return CTAG_RE.sub("amq.ctag-<22>", v)
    if isinstance(v, (list, tuple)):
        if len(v) == 2 and v[0] == "T" and isinstance(v[1], int):
            return ["T", "<time>"]
        return [norm(x) for x in v]
    if isinstance(v, dict):
        return {str(k): norm(x) for k, x in v.items()}
    if isinstance(v, decimal.Decimal):
        return str(v)
    if hasattr(v, "method") and hasattr(v.method, "NAME"):
        v = v.method
    if hasattr(v, "NAME") and hasattr(v, "INDEX"):
        return norm(dict(v.__dict__, method=v.NAME))
    if v is not None and not isinstance(v, (int, float, bool)):
        return "<%s>" % type(v).__name__
    return v


def run(name):
    LAST_CLOSE.clear()
    ctx = Ctx()
    try:
        return norm(SCENARIOS[name](ctx))
    finally:
        ctx.close()


# ---------------------------------------------------------------------------
# Scenarios: missing and invalid entities
# ---------------------------------------------------------------------------
@scenario
def missing_entities(ctx):
    c = ctx.conn()
    q, x = n("nope"), n("nox")
    r = {}
    r["queue_passive"] = attempt(lambda: ctx.ch(c).queue_declare(q, passive=True))
    r["exchange_passive"] = attempt(lambda: ctx.ch(c).exchange_declare(x, passive=True))
    r["queue_delete"] = attempt(lambda: ctx.ch(c).queue_delete(q).method.message_count)
    r["exchange_delete"] = attempt(lambda: ctx.ch(c).exchange_delete(x) and "deleted")
    r["queue_purge"] = attempt(lambda: ctx.ch(c).queue_purge(q))
    r["basic_get"] = attempt(lambda: ctx.ch(c).basic_get(q))
    r["basic_consume"] = attempt(lambda: ctx.ch(c).basic_consume(q, lambda *a: None))
    r["bind_missing_queue"] = attempt(lambda: ctx.ch(c).queue_bind(q, "amq.direct", "k"))
    eq = ctx.q("exists")
    ctx.ch(c).queue_declare(eq)
    r["bind_missing_exchange"] = attempt(lambda: ctx.ch(c).queue_bind(eq, x, "k"))
    r["unbind_missing_exchange"] = attempt(lambda: ctx.ch(c).queue_unbind(eq, x, "k") and "ok")
    r["unbind_missing_queue"] = attempt(lambda: ctx.ch(c).queue_unbind(q, "amq.direct", "k") and "ok")
    r["unbind_no_binding"] = attempt(lambda: ctx.ch(c).queue_unbind(eq, "amq.direct", "nokey") and "ok")
    r["x2x_missing_dest"] = attempt(lambda: ctx.ch(c).exchange_bind(x, "amq.direct", "k"))
    r["x2x_missing_src"] = attempt(lambda: ctx.ch(c).exchange_bind("amq.direct", x, "k"))
    r["x2x_unbind_missing"] = attempt(lambda: ctx.ch(c).exchange_unbind(x, "amq.direct", "k") and "ok")

    def pub():
        ch = ctx.ch(c)
        ch.basic_publish(x, "k", b"m")
        return sync(ch)
    r["publish_missing_exchange"] = attempt(pub)
    return r


@scenario
def reserved_and_default_names(ctx):
    c = ctx.conn()
    r = {}
    r["exchange_amq_prefix"] = attempt(lambda: ctx.ch(c).exchange_declare("amq.diff" + RUN, "direct"))
    r["exchange_amq_direct_redeclare"] = attempt(lambda: ctx.ch(c).exchange_declare("amq.direct", "direct", durable=True) and "ok")
    r["exchange_amq_direct_passive"] = attempt(lambda: ctx.ch(c).exchange_declare("amq.direct", passive=True) and "ok")
    r["queue_amq_prefix"] = attempt(lambda: ctx.ch(c).queue_declare("amq.diff" + RUN))
    r["queue_amq_prefix_passive"] = attempt(lambda: ctx.ch(c).queue_declare("amq.diff" + RUN, passive=True))
    r["exchange_default_declare"] = attempt(lambda: ctx.ch(c).exchange_declare("", "direct"))
    r["exchange_default_delete"] = attempt(lambda: ctx.ch(c).exchange_delete(""))
    r["exchange_amq_delete"] = attempt(lambda: ctx.ch(c).exchange_delete("amq.fanout"))
    q = ctx.q("q")
    ctx.ch(c).queue_declare(q)
    r["bind_default"] = attempt(lambda: ctx.ch(c).queue_bind(q, "", q))
    r["unbind_default"] = attempt(lambda: ctx.ch(c).queue_unbind(q, "", q))
    r["x2x_default_dest"] = attempt(lambda: ctx.ch(c).exchange_bind("", "amq.direct", "k"))
    r["x2x_default_src"] = attempt(lambda: ctx.ch(c).exchange_bind("amq.direct", "", "k"))
    r["bad_type"] = attempt(lambda: ctx.ch(c).exchange_declare(n("bt"), "nosuchtype"))
    r["bad_type_passive_missing"] = attempt(lambda: ctx.ch(c).exchange_declare(n("bt2"), "nosuchtype", passive=True))
    return r


@scenario
def server_named(ctx):
    c = ctx.conn()
    ch = ctx.ch(c)
    m = ch.queue_declare("", exclusive=True).method
    r = {"declare": [m.queue, m.message_count, m.consumer_count]}
    ch.basic_publish("", m.queue, b"x")
    # queue.bind / purge / get with an empty queue name use the channel's last declared queue
    r["bind_empty_name"] = attempt(lambda: ch.queue_bind("", "amq.fanout") and "ok")
    r["purge_empty_name"] = attempt(lambda: ch.queue_purge("").method.message_count)
    tag = ch.basic_consume(m.queue, lambda *a: None)
    r["ctag"] = tag
    ch2 = ctx.ch(c)
    r["bind_empty_no_last_queue"] = attempt(lambda: ch2.queue_bind("", "amq.fanout"))
    ch3 = ctx.ch(c)
    r["get_empty_no_last_queue"] = attempt(lambda: ch3.basic_get(""))
    ch4 = ctx.ch(c)
    r["passive_empty"] = attempt(lambda: ch4.queue_declare("", passive=True))
    return r


# ---------------------------------------------------------------------------
# Inequivalent declarations
# ---------------------------------------------------------------------------
@scenario
def exchange_inequivalent(ctx):
    c = ctx.conn()
    x = ctx.x("x")
    ctx.ch(c).exchange_declare(x, "direct", durable=False, auto_delete=False,
                               arguments={"alternate-exchange": "ae"})
    r = {}
    r["type"] = attempt(lambda: ctx.ch(c).exchange_declare(x, "fanout", arguments={"alternate-exchange": "ae"}))
    r["durable"] = attempt(lambda: ctx.ch(c).exchange_declare(x, "direct", durable=True, arguments={"alternate-exchange": "ae"}))
    r["auto_delete"] = attempt(lambda: ctx.ch(c).exchange_declare(x, "direct", auto_delete=True, arguments={"alternate-exchange": "ae"}))
    r["internal"] = attempt(lambda: ctx.ch(c).exchange_declare(x, "direct", internal=True, arguments={"alternate-exchange": "ae"}))
    r["arg_changed"] = attempt(lambda: ctx.ch(c).exchange_declare(x, "direct", arguments={"alternate-exchange": "other"}))
    r["arg_removed"] = attempt(lambda: ctx.ch(c).exchange_declare(x, "direct") and "ok")
    r["arg_extra_unknown"] = attempt(lambda: ctx.ch(c).exchange_declare(x, "direct", arguments={"alternate-exchange": "ae", "foo": 1}) and "ok")
    r["same"] = attempt(lambda: ctx.ch(c).exchange_declare(x, "direct", arguments={"alternate-exchange": "ae"}) and "ok")
    r["passive_other_type"] = attempt(lambda: ctx.ch(c).exchange_declare(x, "fanout", passive=True) and "ok")
    return r


@scenario
def queue_inequivalent(ctx):
    c = ctx.conn()
    q = ctx.q("q")
    ctx.ch(c).queue_declare(q, arguments={"x-message-ttl": 1000, "x-max-length": 5})
    r = {}
    r["durable"] = attempt(lambda: ctx.ch(c).queue_declare(q, durable=True, arguments={"x-message-ttl": 1000, "x-max-length": 5}))
    r["auto_delete"] = attempt(lambda: ctx.ch(c).queue_declare(q, auto_delete=True, arguments={"x-message-ttl": 1000, "x-max-length": 5}))
    r["exclusive"] = attempt(lambda: ctx.ch(c).queue_declare(q, exclusive=True, arguments={"x-message-ttl": 1000, "x-max-length": 5}).method.queue)
    r["ttl_changed"] = attempt(lambda: ctx.ch(c).queue_declare(q, arguments={"x-message-ttl": 2000, "x-max-length": 5}))
    r["ttl_removed"] = attempt(lambda: ctx.ch(c).queue_declare(q, arguments={"x-max-length": 5}))
    r["ttl_type_long"] = attempt(lambda: ctx.ch(c).queue_declare(q, arguments={"x-message-ttl": 2 ** 40, "x-max-length": 5}))
    r["added_dlx"] = attempt(lambda: ctx.ch(c).queue_declare(q, arguments={"x-message-ttl": 1000, "x-max-length": 5, "x-dead-letter-exchange": "d"}))
    r["added_unknown"] = attempt(lambda: ctx.ch(c).queue_declare(q, arguments={"x-message-ttl": 1000, "x-max-length": 5, "foo": "bar"}).method.message_count)
    r["no_args"] = attempt(lambda: ctx.ch(c).queue_declare(q))
    r["passive_ignores"] = attempt(lambda: ctx.ch(c).queue_declare(q, passive=True, durable=True).method.message_count)
    q2 = ctx.q("q2")
    ctx.ch(c).queue_declare(q2, arguments={"x-max-priority": 5, "x-overflow": "drop-head"})
    r["priority_changed"] = attempt(lambda: ctx.ch(c).queue_declare(q2, arguments={"x-max-priority": 6, "x-overflow": "drop-head"}))
    r["overflow_changed"] = attempt(lambda: ctx.ch(c).queue_declare(q2, arguments={"x-max-priority": 5, "x-overflow": "reject-publish"}))
    r["priority_removed"] = attempt(lambda: ctx.ch(c).queue_declare(q2, arguments={"x-overflow": "drop-head"}))
    r["queue_type_classic"] = attempt(lambda: ctx.ch(c).queue_declare(q2, arguments={"x-max-priority": 5, "x-overflow": "drop-head", "x-queue-type": "classic"}).method.queue)
    return r


@scenario
def queue_arg_validation(ctx):
    c = ctx.conn()
    cases = {
        "ttl_negative": {"x-message-ttl": -1},
        "ttl_string": {"x-message-ttl": "1000"},
        "expires_zero": {"x-expires": 0},
        "expires_negative": {"x-expires": -5},
        "max_length_negative": {"x-max-length": -1},
        "max_length_string": {"x-max-length": "5"},
        "max_length_bytes_negative": {"x-max-length-bytes": -1},
        "overflow_bogus": {"x-overflow": "bogus"},
        "overflow_int": {"x-overflow": 1},
        "dlrk_without_dlx": {"x-dead-letter-routing-key": "k"},
        "dlx_int": {"x-dead-letter-exchange": 1},
        "max_priority_negative": {"x-max-priority": -1},
        "max_priority_256": {"x-max-priority": 256},
        "max_priority_string": {"x-max-priority": "5"},
        "sac_string": {"x-single-active-consumer": "true"},
        "sac_int": {"x-single-active-consumer": 1},
        "queue_type_bogus": {"x-queue-type": "bogus"},
        "queue_mode_bogus": {"x-queue-mode": "bogus"},
        "ok_all": {"x-message-ttl": 0, "x-expires": 1000000, "x-max-length": 0,
                   "x-max-length-bytes": 0, "x-overflow": "reject-publish-dlx",
                   "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "k",
                   "x-max-priority": 255, "x-single-active-consumer": False,
                   "x-queue-mode": "lazy", "x-unknown": [1, "a"]},
    }
    r = {}
    for k, args in cases.items():
        q = ctx.q("va." + k)
        r[k] = attempt(lambda: [ctx.ch(c).queue_declare(q, arguments=args).method.message_count])
    return r


# ---------------------------------------------------------------------------
# Exclusive queues, exclusive consumers, deletion conditions
# ---------------------------------------------------------------------------
@scenario
def exclusive_locked(ctx):
    owner = ctx.conn()
    q = ctx.q("excl")
    ctx.ch(owner).queue_declare(q, exclusive=True)
    other = ctx.conn()
    r = {}
    r["declare"] = attempt(lambda: ctx.ch(other).queue_declare(q, exclusive=True))
    r["declare_nonexcl"] = attempt(lambda: ctx.ch(other).queue_declare(q))
    r["passive"] = attempt(lambda: ctx.ch(other).queue_declare(q, passive=True))
    r["consume"] = attempt(lambda: ctx.ch(other).basic_consume(q, lambda *a: None))
    r["get"] = attempt(lambda: ctx.ch(other).basic_get(q))
    r["purge"] = attempt(lambda: ctx.ch(other).queue_purge(q))
    r["delete"] = attempt(lambda: ctx.ch(other).queue_delete(q))
    r["bind"] = attempt(lambda: ctx.ch(other).queue_bind(q, "amq.fanout"))
    r["unbind"] = attempt(lambda: ctx.ch(other).queue_unbind(q, "amq.fanout"))

    def pub():
        ch = ctx.ch(other)
        ch.basic_publish("", q, b"to-exclusive")
        return sync(ch)
    r["publish_other_conn"] = attempt(pub)
    settle()
    r["count_after"] = qcount(ctx.ch(owner), q)
    return r


@scenario
def exclusive_consumer(ctx):
    c = ctx.conn()
    q = ctx.q("xc")
    ch = ctx.ch(c)
    ch.queue_declare(q)
    ch.basic_consume(q, lambda *a: None, exclusive=True)
    r = {}
    r["second"] = attempt(lambda: ctx.ch(c).basic_consume(q, lambda *a: None))
    r["second_exclusive"] = attempt(lambda: ctx.ch(c).basic_consume(q, lambda *a: None, exclusive=True))
    q2 = ctx.q("xc2")
    ch2 = ctx.ch(c)
    ch2.queue_declare(q2)
    ch2.basic_consume(q2, lambda *a: None)
    r["exclusive_after_normal"] = attempt(lambda: ctx.ch(c).basic_consume(q2, lambda *a: None, exclusive=True))
    r["declare_ok_counts"] = [ctx.ch(c).queue_declare(q, passive=True).method.consumer_count,
                              ctx.ch(c).queue_declare(q2, passive=True).method.consumer_count]
    return r


@scenario
def delete_conditions(ctx):
    c = ctx.conn()
    q = ctx.q("del")
    ch = ctx.ch(c)
    ch.queue_declare(q)
    for i in range(3):
        ch.basic_publish("", q, b"m%d" % i)
    settle()
    r = {}
    r["if_empty"] = attempt(lambda: ctx.ch(c).queue_delete(q, if_empty=True))
    cch = ctx.ch(c)
    cch.basic_qos(prefetch_count=1)
    cch.basic_consume(q, lambda *a: None)
    r["if_unused"] = attempt(lambda: ctx.ch(c).queue_delete(q, if_unused=True))
    r["purge_with_unacked"] = attempt(lambda: ctx.ch(c).queue_purge(q).method.message_count)
    r["delete"] = attempt(lambda: ctx.ch(c).queue_delete(q).method.message_count)
    x = ctx.x("delx")
    ctx.ch(c).exchange_declare(x, "fanout")
    q2 = ctx.q("del2")
    ctx.ch(c).queue_declare(q2)
    ctx.ch(c).queue_bind(q2, x)
    r["exchange_if_unused"] = attempt(lambda: ctx.ch(c).exchange_delete(x, if_unused=True))
    r["exchange_delete"] = attempt(lambda: ctx.ch(c).exchange_delete(x) and "ok")
    return r


@scenario
def purge_and_delete_counts(ctx):
    c = ctx.conn()
    ch = ctx.ch(c)
    q = ctx.q("pc")
    r = {"declare": list(ch.queue_declare(q).method.__dict__.values())[1:]}
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    settle()
    r["redeclare"] = [ch.queue_declare(q).method.message_count, ch.queue_declare(q).method.consumer_count]
    r["get_counts"] = [getok(ch, q, auto_ack=False)["message_count"], getok(ch, q, auto_ack=False)["message_count"]]
    r["declare_with_unacked"] = ch.queue_declare(q, passive=True).method.message_count
    r["purge"] = ch.queue_purge(q).method.message_count
    r["purge_again"] = ch.queue_purge(q).method.message_count
    ch.close()
    ch = ctx.ch(c)
    settle()
    r["after_requeue"] = ch.queue_declare(q, passive=True).method.message_count
    ch.basic_publish("", q, b"x")
    settle()
    r["delete"] = ch.queue_delete(q).method.message_count
    return r


# ---------------------------------------------------------------------------
# Acknowledgements
# ---------------------------------------------------------------------------
def _ack_setup(ctx, n_msgs=3):
    c = ctx.conn()
    ch = ctx.ch(c)
    q = ctx.q("ack")
    ch.queue_declare(q)
    for i in range(n_msgs):
        ch.basic_publish("", q, b"%d" % i)
    settle()
    return c, ch, q


@scenario
def acks(ctx):
    r = {}
    c, ch, q = _ack_setup(ctx)
    ch.basic_ack(99)
    r["unknown_tag"] = sync(ch)
    ch = ctx.ch(c)
    getok(ch, q, auto_ack=False)
    ch.basic_ack(1)
    ch.basic_ack(1)
    r["double_ack"] = sync(ch)
    ch = ctx.ch(c)
    getok(ch, q, auto_ack=False)
    ch.basic_ack(0, multiple=False)
    r["ack_zero_single"] = sync(ch)
    ch = ctx.ch(c)
    settle()
    r["count_before_multi"] = qcount(ch, q)
    getok(ch, q, auto_ack=False)
    getok(ch, q, auto_ack=False)
    ch.basic_ack(0, multiple=True)
    r["ack_zero_multiple"] = sync(ch)
    ch.basic_ack(0, multiple=True)
    r["ack_zero_multiple_nothing"] = sync(ch)
    r["count_after_multi"] = qcount(ch, q)
    ch.basic_nack(7)
    r["nack_unknown"] = sync(ch)
    ch = ctx.ch(c)
    ch.basic_reject(7)
    r["reject_unknown"] = sync(ch)
    ch = ctx.ch(c)
    getok(ch, q, auto_ack=True) if qcount(ch, q) else None
    r2 = ctx.q("ack2")
    ch.queue_declare(r2)
    ch.basic_publish("", r2, b"a")
    settle()
    getok(ch, r2, auto_ack=True)
    ch.basic_ack(1)
    r["ack_autoacked"] = sync(ch)
    ch = ctx.ch(c)
    ch.basic_publish("", r2, b"b")
    settle()
    getok(ch, r2, auto_ack=False)
    ch.basic_ack(2, multiple=True)
    r["ack_multiple_beyond"] = sync(ch)
    return r


@scenario
def nack_requeue_redelivered(ctx):
    c, ch, q = _ack_setup(ctx, 3)
    r = {}
    a = getok(ch, q, auto_ack=False)
    b = getok(ch, q, auto_ack=False)
    ch.basic_nack(b["delivery_tag"], requeue=True)
    ch.basic_reject(a["delivery_tag"], requeue=True)
    settle()
    r["after"] = [[g["body"], g["redelivered"], g["delivery_tag"], g["message_count"]] for g in drain(ch, q)]
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    settle()
    for _ in range(3):
        getok(ch, q, auto_ack=False)
    ch.basic_nack(0, multiple=True, requeue=True)
    settle()
    r["nack_multiple_all"] = [[g["body"], g["redelivered"]] for g in drain(ch, q)]
    ch.basic_publish("", q, b"r")
    settle()
    getok(ch, q, auto_ack=False)
    ch.basic_recover(requeue=True)
    settle()
    r["recover"] = [[g["body"], g["redelivered"]] for g in drain(ch, q)]
    ch.basic_publish("", q, b"drop")
    settle()
    t = getok(ch, q, auto_ack=False)["delivery_tag"]
    ch.basic_reject(t, requeue=False)
    settle()
    r["reject_drop"] = qcount(ch, q)
    return r


@scenario
def consumer_redelivery_order(ctx):
    c, ch, q = _ack_setup(ctx, 4)
    got = []

    def on(chn, m, p, body):
        got.append([body, m.redelivered, m.delivery_tag, m.exchange, m.routing_key])

    ch.basic_qos(prefetch_count=10)
    tag = ch.basic_consume(q, on, consumer_tag="ctag-" + RUN)
    pump_until(c, lambda: len(got) >= 4)
    ch.basic_nack(2, requeue=True)
    ch.basic_reject(3, requeue=True)
    pump_until(c, lambda: len(got) >= 6)
    ch.basic_cancel(tag)
    ch2 = ctx.ch(c)
    ch.close()
    settle()
    return {"deliveries": got, "left": bodies(ch2, q)}


# ---------------------------------------------------------------------------
# Transactions, confirms, qos, consumer tags
# ---------------------------------------------------------------------------
@scenario
def tx_misuse(ctx):
    c = ctx.conn()
    r = {}
    r["commit_not_tx"] = attempt(lambda: ctx.ch(c).tx_commit())
    r["rollback_not_tx"] = attempt(lambda: ctx.ch(c).tx_rollback())
    ch = ctx.ch(c)
    ch.confirm_delivery()
    r["tx_after_confirm"] = attempt(lambda: ch.tx_select())
    ch = ctx.ch(c)
    ch.tx_select()
    r["tx_select_twice"] = attempt(lambda: ch.tx_select() and "ok")
    r["confirm_after_tx"] = attempt(lambda: ch.confirm_delivery())
    q = ctx.q("tx")
    ch = ctx.ch(c)
    ch.queue_declare(q)
    ch.tx_select()
    ch.basic_publish("", q, b"a")
    settle()
    r["before_commit"] = qcount(ctx.ch(c), q)
    ch.tx_commit()
    r["after_commit"] = qcount(ctx.ch(c), q)
    ch.basic_publish("", q, b"b")
    ch.tx_rollback()
    r["after_rollback"] = qcount(ctx.ch(c), q)
    g = getok(ch, q, auto_ack=False)
    ch.basic_ack(g["delivery_tag"])
    ch.tx_rollback()
    r["ack_rolled_back"] = qcount(ctx.ch(c), q)
    ch.basic_ack(g["delivery_tag"])
    ch.tx_commit()
    r["ack_committed"] = qcount(ctx.ch(c), q)
    ch.basic_ack(55)
    r["tx_bad_ack_at_ack"] = sync(ch)
    if r["tx_bad_ack_at_ack"].get("ok"):
        r["tx_bad_ack_at_commit"] = attempt(lambda: ch.tx_commit() and "ok")
    return r


@scenario
def confirm_misuse(ctx):
    c = ctx.conn()
    r = {}
    ch = ctx.ch(c)
    ch.confirm_delivery()
    r["confirm_twice"] = attempt(lambda: raw(ch, spec.Confirm.Select()) or sync(ch))
    return r


@scenario
def confirms_and_returns(ctx):
    c = ctx.conn()
    ch = ctx.ch(c)
    q = ctx.q("cf")
    ch.queue_declare(q)
    events = []
    ch._impl.add_on_return_callback(
        lambda chn, m, p, body: events.append(["return", m.reply_code, m.reply_text, m.exchange, m.routing_key, props_of(p), body]))
    confirm_on(c, ch, lambda f: events.append([type(f.method).__name__, f.method.delivery_tag, f.method.multiple]))
    ch._impl.basic_publish("", q, b"a", mandatory=True)
    ch._impl.basic_publish("", "nowhere." + RUN, b"b", pika.BasicProperties(headers={"h": 1}), mandatory=True)
    ch._impl.basic_publish("", "nowhere." + RUN, b"c", mandatory=False)
    ch._impl.basic_publish("amq.direct", "nowhere", b"d", mandatory=True)
    pump_until(c, lambda: summarize_confirms(events, {})["acked"] == [1, 2, 3, 4])
    pump_for(c, 0.3)
    r = {"with_confirms": summarize_confirms(events, {b"b": 2, b"d": 4})}
    ch2 = ctx.ch(c)
    ev2 = []
    ch2._impl.add_on_return_callback(
        lambda chn, m, p, body: ev2.append([m.reply_code, m.reply_text, m.exchange, m.routing_key, body]))
    ch2._impl.basic_publish("amq.fanout", "x", b"e", mandatory=True)
    ch2._impl.basic_publish("amq.topic", "a.b", b"f", mandatory=True)
    pump_until(c, lambda: len(ev2) >= 2)
    r["without_confirms"] = ev2
    return r


@scenario
def qos_and_tags(ctx):
    c = ctx.conn()
    r = {}
    r["prefetch_size"] = attempt(lambda: ctx.ch(c).basic_qos(prefetch_size=1000))
    c = ctx.conn()
    q = ctx.q("tags")
    ch = ctx.ch(c)
    ch.queue_declare(q)
    ch.basic_consume(q, lambda *a: None, consumer_tag="dup")

    def reuse():
        raw(ch, spec.Basic.Consume(queue=q, consumer_tag="dup"))
        return sync(ch)
    r["tag_reuse"] = attempt(reuse)
    c = ctx.conn()
    ch = ctx.ch(c)

    def cancel_unknown():
        raw(ch, spec.Basic.Cancel(consumer_tag="nosuch", nowait=True))
        return sync(ch)
    r["cancel_unknown_nowait"] = attempt(cancel_unknown)
    ch.basic_qos(prefetch_count=65535)
    r["qos_global"] = attempt(lambda: ch.basic_qos(prefetch_count=3, global_qos=True) and "ok")
    return r


# ---------------------------------------------------------------------------
# Publishing checks
# ---------------------------------------------------------------------------
@scenario
def publish_checks(ctx):
    c = ctx.conn()
    r = {}
    x = ctx.x("internal")
    ctx.ch(c).exchange_declare(x, "fanout", internal=True)

    def pub(ex, rk, props=None, mandatory=False):
        ch = ctx.ch(c)
        ch.basic_publish(ex, rk, b"m", props, mandatory=mandatory)
        return sync(ch)
    r["internal"] = attempt(lambda: pub(x, ""))
    r["user_id_bad"] = attempt(lambda: pub("amq.direct", "k", pika.BasicProperties(user_id="bob")))
    r["user_id_good"] = attempt(lambda: pub("amq.direct", "k", pika.BasicProperties(user_id="guest")))
    r["expiration_bad"] = attempt(lambda: pub("amq.direct", "k", pika.BasicProperties(expiration="abc")))
    r["expiration_negative"] = attempt(lambda: pub("amq.direct", "k", pika.BasicProperties(expiration="-1")))
    r["default_exchange_missing_queue"] = attempt(lambda: pub("", "nosuch." + RUN))
    return r


@scenario
def properties_roundtrip(ctx):
    import datetime
    c = ctx.conn()
    ch = ctx.ch(c)
    q = ctx.q("props")
    ch.queue_declare(q)
    headers = {
        "str": "hello", "int": 7, "neg": -3, "big": 2 ** 40, "bool": True,
        "dec": decimal.Decimal("3.14"), "bytes": b"\x00\x01", "none": None,
        "list": [1, "a", [True]], "table": {"k": {"n": 1}},
        "ts": datetime.datetime(2020, 1, 2, 3, 4, 5),
    }
    p = pika.BasicProperties(
        content_type="text/plain", content_encoding="gzip", headers=headers, delivery_mode=2,
        priority=3, correlation_id="corr", reply_to="rt", expiration="60000", message_id="mid",
        timestamp=1600000000, type="t", user_id="guest", app_id="app", cluster_id="cid")
    ch.basic_publish("", q, b"body", p)
    ch.basic_publish("", q, b"", pika.BasicProperties())
    ch.basic_publish("", q, b"e", pika.BasicProperties(headers={}))
    settle()
    return drain(ch, q)


# ---------------------------------------------------------------------------
# Dead-lettering, TTL, length limits, priorities, single active consumer
# ---------------------------------------------------------------------------
@scenario
def dead_letter_x_death(ctx):
    c = ctx.conn()
    ch = ctx.ch(c)
    dlx = ctx.x("dlx")
    ch.exchange_declare(dlx, "topic")
    dlq = ctx.q("dlq")
    ch.queue_declare(dlq)
    ch.queue_bind(dlq, dlx, "#")
    src = ctx.q("src")
    ch.queue_declare(src, arguments={"x-dead-letter-exchange": dlx})
    ch.basic_publish("", src, b"rej", pika.BasicProperties(headers={"keep": "me"}))
    settle()
    t = getok(ch, src, auto_ack=False)["delivery_tag"]
    ch.basic_reject(t, requeue=False)
    settle()
    r = {"rejected": drain(ch, dlq)}
    src2 = ctx.q("src2")
    ch.queue_declare(src2, arguments={"x-dead-letter-exchange": dlx,
                                      "x-dead-letter-routing-key": "new.key",
                                      "x-message-ttl": 50})
    ch.basic_publish("", src2, b"ttl", pika.BasicProperties(expiration="10000"))
    time.sleep(0.5)
    ch.queue_declare(src2, passive=True)
    settle()
    r["expired_dlrk"] = drain(ch, dlq)
    src3 = ctx.q("src3")
    ch.queue_declare(src3, arguments={"x-dead-letter-exchange": dlx, "x-max-length": 1})
    ch.basic_publish("amq.direct", "nope", b"-")
    ch.basic_publish("", src3, b"first")
    ch.basic_publish("", src3, b"second")
    settle()
    r["maxlen"] = drain(ch, dlq)
    r["src3_left"] = bodies(ch, src3)
    # a second death of an already dead-lettered message
    ch.basic_publish("", src, b"twice")
    settle()
    t = getok(ch, src, auto_ack=False)["delivery_tag"]
    ch.basic_nack(t, requeue=False)
    settle()
    first = drain(ch, dlq)
    hdrs = {k: v for k, v in first[0]["props"]["headers"]} if first else {}
    p2 = pika.BasicProperties(headers={"x-death": None})
    del p2
    # republish it (with its x-death) into src and reject again
    raw_headers = {}
    m, props, body = None, None, None
    ch.basic_publish("", src, b"twice")
    settle()
    t = getok(ch, src, auto_ack=False)["delivery_tag"]
    ch.basic_nack(t, requeue=False)
    settle()
    m, props, body = ch.basic_get(dlq, auto_ack=False)
    raw_headers = props.headers
    ch.basic_ack(m.delivery_tag)
    ch.basic_publish("", src, body, pika.BasicProperties(headers=raw_headers))
    settle()
    t = getok(ch, src, auto_ack=False)["delivery_tag"]
    ch.basic_nack(t, requeue=False)
    settle()
    r["second_death"] = drain(ch, dlq)
    r["first_death_keys"] = sorted(hdrs)
    return r


@scenario
def ttl_and_expiration(ctx):
    c = ctx.conn()
    ch = ctx.ch(c)
    q = ctx.q("ttl")
    ch.queue_declare(q)
    ch.basic_publish("", q, b"exp0", pika.BasicProperties(expiration="0"))
    ch.basic_publish("", q, b"exp100", pika.BasicProperties(expiration="100"))
    ch.basic_publish("", q, b"keep", pika.BasicProperties(expiration="60000"))
    time.sleep(0.4)
    r = {"left": [[g["body"], g["props"]] for g in drain(ch, q)]}
    q2 = ctx.q("ttl0")
    ch.queue_declare(q2, arguments={"x-message-ttl": 0})
    got = []
    ch.basic_consume(q2, lambda chn, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", q2, b"to-consumer")
    pump_until(c, lambda: got)
    r["ttl0_consumer"] = got
    q3 = ctx.q("ttl0b")
    ch.queue_declare(q3, arguments={"x-message-ttl": 0})
    ch.basic_publish("", q3, b"no-consumer")
    settle()
    r["ttl0_no_consumer"] = qcount(ch, q3)
    q4 = ctx.q("ttl200")
    ch.queue_declare(q4, arguments={"x-message-ttl": 200})
    ch.basic_publish("", q4, b"a")
    ch.basic_publish("", q4, b"b", pika.BasicProperties(expiration="50000"))
    time.sleep(0.6)
    r["queue_ttl_wins"] = qcount(ch, q4)
    return r


@scenario
def max_length_modes(ctx):
    c = ctx.conn()
    ch = ctx.ch(c)
    r = {}
    q = ctx.q("dh")
    ch.queue_declare(q, arguments={"x-max-length": 2})
    for i in range(4):
        ch.basic_publish("", q, b"%d" % i)
    settle()
    r["drop_head"] = bodies(ch, q)
    qb = ctx.q("bytes")
    ch.queue_declare(qb, arguments={"x-max-length-bytes": 10})
    for b in [b"12345", b"67890", b"abc"]:
        ch.basic_publish("", qb, b)
    settle()
    r["bytes_drop_head"] = bodies(ch, qb)
    q2 = ctx.q("rp")
    ch.queue_declare(q2, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    cch = ctx.ch(c)
    events = []
    confirm_on(c, cch, lambda f: events.append([type(f.method).__name__, f.method.delivery_tag, f.method.multiple]))
    for i in range(3):
        cch._impl.basic_publish("", q2, b"%d" % i)
    pump_until(c, lambda: len(summarize_confirms(events, {})["acked"] + summarize_confirms(events, {})["nacked"]) >= 3)
    r["reject_publish_confirms"] = summarize_confirms(events, {})
    ch.basic_publish("", q2, b"no-confirm")
    settle()
    r["reject_publish_left"] = bodies(ch, q2)
    dlq = ctx.q("rpdlq")
    ch.queue_declare(dlq)
    q3 = ctx.q("rpd")
    ch.queue_declare(q3, arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx",
                                    "x-dead-letter-exchange": "",
                                    "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q3, b"in")
    ch.basic_publish("", q3, b"over")
    settle()
    r["reject_publish_dlx_left"] = bodies(ch, q3)
    r["reject_publish_dlx_dlq"] = bodies(ch, dlq)
    q4 = ctx.q("zero")
    ch.queue_declare(q4, arguments={"x-max-length": 0})
    ch.basic_publish("", q4, b"x")
    settle()
    r["max_zero"] = qcount(ch, q4)
    q5 = ctx.q("rpmand")
    ch.queue_declare(q5, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    ev = []
    mch = ctx.ch(c)
    mch._impl.add_on_return_callback(lambda chn, m, p, body: ev.append(["return", m.reply_code, m.reply_text, body]))
    confirm_on(c, mch, lambda f: ev.append([type(f.method).__name__, f.method.delivery_tag, f.method.multiple]))
    mch._impl.basic_publish("", q5, b"m", mandatory=True)
    pump_until(c, lambda: any(e[0] != "return" for e in ev))
    pump_for(c, 0.2)
    r["reject_publish_mandatory"] = summarize_confirms(ev, {b"m": 1})
    return r


@scenario
def priorities(ctx):
    c = ctx.conn()
    ch = ctx.ch(c)
    q = ctx.q("prio")
    ch.queue_declare(q, arguments={"x-max-priority": 5})
    for i, p in enumerate([None, 1, 5, 9, 0, 3, 5]):
        ch.basic_publish("", q, b"%d:%s" % (i, str(p).encode()), pika.BasicProperties(priority=p))
    settle()
    r = {"order": [[g["body"], g["props"].get("priority")] for g in drain(ch, q)]}
    q2 = ctx.q("noprio")
    ch.queue_declare(q2)
    for i, p in enumerate([1, 9, 0]):
        ch.basic_publish("", q2, b"%d" % i, pika.BasicProperties(priority=p))
    settle()
    r["no_prio_queue"] = bodies(ch, q2)
    return r


@scenario
def single_active_consumer(ctx):
    c = ctx.conn()
    q = ctx.q("sac")
    ch = ctx.ch(c)
    ch.queue_declare(q, arguments={"x-single-active-consumer": True})
    got = []
    ch1, ch2 = ctx.ch(c), ctx.ch(c)
    t1 = ch1.basic_consume(q, lambda chn, m, p, b: got.append(["c1", b]), auto_ack=True)
    ch2.basic_consume(q, lambda chn, m, p, b: got.append(["c2", b]), auto_ack=True)
    r = {"consumers": ch.queue_declare(q, passive=True).method.consumer_count}
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    pump_until(c, lambda: len(got) >= 3)
    ch1.basic_cancel(t1)
    for i in range(3, 5):
        ch.basic_publish("", q, b"%d" % i)
    pump_until(c, lambda: len(got) >= 5)
    pump_for(c, 0.2)
    r["got"] = got
    return r


# ---------------------------------------------------------------------------
# Routing
# ---------------------------------------------------------------------------
def _route(ctx, c, x, bindings, publishes):
    """bindings: {queue_tag: [(routing_key, args)]}; publishes: [(rk, headers)].
    Returns for each publish the sorted queue tags it reached."""
    ch = ctx.ch(c)
    qs = {}
    for tag, binds in bindings.items():
        q = ctx.q("rt.%s" % tag)
        ch.queue_declare(q)
        qs[tag] = q
        for rk, args in binds:
            ch.queue_bind(q, x, rk, arguments=args)
    out = []
    for rk, headers in publishes:
        ch.basic_publish(x, rk, b"m", pika.BasicProperties(headers=headers))
        settle()
        got = []
        for tag, q in qs.items():
            if drain(ch, q):
                got.append(tag)
        out.append([rk, sorted(got)])
    return out


@scenario
def topic_edges(ctx):
    c = ctx.conn()
    x = ctx.x("topic")
    ctx.ch(c).exchange_declare(x, "topic")
    binds = {
        "hash": [("#", None)], "a_hash": [("a.#", None)], "star_b": [("*.b", None)],
        "a_star": [("a.*", None)], "hash_hash": [("#.#", None)], "a_hash_b": [("a.#.b", None)],
        "empty": [("", None)], "star": [("*", None)], "a__b": [("a..b", None)],
        "star_hash_star": [("*.#.*", None)],
    }
    pubs = [(k, None) for k in ["", "a", "a.b", ".b", "a.", "a..b", "b", "a.x.b", "x.a.b", "a.b.c", "#", "*"]]
    return _route(ctx, c, x, binds, pubs)


@scenario
def headers_edges(ctx):
    c = ctx.conn()
    x = ctx.x("hdr")
    ctx.ch(c).exchange_declare(x, "headers")
    binds = {
        "all": [("", {"x-match": "all", "a": 1, "b": "x"})],
        "any": [("", {"x-match": "any", "a": 1, "b": "x"})],
        "default": [("", {"a": 1})],
        "empty": [("", {})],
        "empty_any": [("", {"x-match": "any"})],
        "void": [("", {"v": None})],
        "str1": [("", {"a": "1"})],
        "allx": [("", {"x-match": "all-with-x", "x-h": "y"})],
        "anyx": [("", {"x-match": "any-with-x", "x-h": "y"})],
        "allx_ignored": [("", {"x-match": "all", "x-h": "y"})],
        "bool": [("", {"f": True})],
    }
    pubs = [
        ("", None), ("", {}), ("", {"a": 1}), ("", {"a": 1, "b": "x"}), ("", {"b": "x"}),
        ("", {"a": "1"}), ("", {"a": 2 ** 40}), ("", {"v": None}), ("", {"v": 1}),
        ("", {"x-h": "y"}), ("", {"f": True}), ("", {"f": 1}), ("k", {"a": 1, "b": "x", "c": 3}),
    ]
    r = {"routes": _route(ctx, c, x, binds, pubs)}
    r["bad_x_match"] = attempt(lambda: ctx.ch(c).queue_bind(n("rt.all"), x, "", arguments={"x-match": "bogus"}))
    r["x_match_int"] = attempt(lambda: ctx.ch(c).queue_bind(n("rt.all"), x, "", arguments={"x-match": 1}))
    return r


@scenario
def direct_fanout_x2x_ae(ctx):
    c = ctx.conn()
    ch = ctx.ch(c)
    r = {}
    src = ctx.x("src")
    mid = ctx.x("mid")
    ch.exchange_declare(src, "direct")
    ch.exchange_declare(mid, "fanout")
    ch.exchange_bind(mid, src, "k")
    q = ctx.q("x2xq")
    ch.queue_declare(q)
    ch.queue_bind(q, mid, "ignored")
    ch.queue_bind(q, src, "k")
    ch.basic_publish(src, "k", b"once")
    ch.basic_publish(src, "other", b"none")
    settle()
    r["x2x_dedup"] = [[g["body"], g["exchange"], g["routing_key"]] for g in drain(ch, q)]
    # exchange-to-exchange cycle
    ch.exchange_bind(src, mid, "")
    ch.basic_publish(src, "k", b"cycle")
    settle()
    r["x2x_cycle"] = bodies(ch, q)
    ae = ctx.x("ae")
    ch.exchange_declare(ae, "fanout")
    aeq = ctx.q("aeq")
    ch.queue_declare(aeq)
    ch.queue_bind(aeq, ae)
    main = ctx.x("main")
    ch.exchange_declare(main, "direct", arguments={"alternate-exchange": ae})
    mq = ctx.q("mq")
    ch.queue_declare(mq)
    ch.queue_bind(mq, main, "hit")
    ch.basic_publish(main, "hit", b"hit")
    ch.basic_publish(main, "miss", b"miss")
    settle()
    r["ae"] = [bodies(ch, mq), [[g["body"], g["exchange"], g["routing_key"]] for g in drain(ch, aeq)]]
    missing_ae = ctx.x("missingae")
    ch.exchange_declare(missing_ae, "direct", arguments={"alternate-exchange": n("nosuchae")})
    ev = []
    mch = ctx.ch(c)
    mch._impl.add_on_return_callback(lambda chn, m, p, body: ev.append([m.reply_code, m.reply_text, m.exchange, body]))
    mch._impl.basic_publish(missing_ae, "x", b"to-missing-ae", mandatory=True)
    mch._impl.basic_publish(main, "miss", b"to-ae-mandatory", mandatory=True)
    pump_until(c, lambda: ev)
    pump_for(c, 0.3)
    r["ae_mandatory_returns"] = ev
    r["ae_got"] = bodies(ch, aeq)
    return r


# ---------------------------------------------------------------------------
# Consumer cancel notification, channel reuse, connection-level errors
# ---------------------------------------------------------------------------
@scenario
def cancel_notification(ctx):
    c = ctx.conn()
    q = ctx.q("cn")
    ch = ctx.ch(c)
    ch.queue_declare(q)
    events = []
    cch = ctx.ch(c)
    cch._impl.add_on_cancel_callback(lambda f: events.append(["cancel", f.method.consumer_tag, f.method.nowait]))
    cch.basic_consume(q, lambda *a: None, consumer_tag="watched")
    ctx.ch(c).queue_delete(q)
    pump_until(c, lambda: events)
    r = {"events": events, "channel_open": cch.is_open}
    r["after"] = attempt(lambda: cch.basic_qos(prefetch_count=1) and "alive")
    return r


@scenario
def channel_reuse_after_error(ctx):
    c = ctx.conn()
    ch = ctx.ch(c)
    num = ch.channel_number
    r = {"error": attempt(lambda: ch.queue_declare(n("none"), passive=True))}
    ch2 = c.channel(channel_number=num)
    r["reuse"] = attempt(lambda: ch2.queue_declare("", exclusive=True).method.message_count)
    r["same_number"] = ch2.channel_number == num
    # client-initiated close then reopen
    ch2.close()
    ch3 = c.channel(channel_number=num)
    r["reopen"] = attempt(lambda: ch3.basic_qos(prefetch_count=1) and "ok")
    return r


@scenario
def connection_errors(ctx):
    r = {}
    c = ctx.conn()
    ch = ctx.ch(c)

    def second_open():
        raw(ch, spec.Channel.Open())
        return sync(ch)
    r["channel_open_twice"] = attempt(second_open)

    c = ctx.conn()
    ch = ctx.ch(c)

    def unopened():
        c._impl._send_method(7, spec.Basic.Qos(prefetch_count=1))
        return sync(ch)
    r["method_on_unopened_channel"] = attempt(unopened)

    c = ctx.conn()
    ch = ctx.ch(c)

    def immediate():
        ch._impl._send_method(spec.Basic.Publish(exchange="", routing_key="x", immediate=True),
                              (spec.BasicProperties(), b"body"))
        return sync(ch)
    r["publish_immediate"] = attempt(immediate)

    c = ctx.conn()
    ch = ctx.ch(c)

    def no_content():
        raw(ch, spec.Basic.Publish(exchange="", routing_key="x"))
        return sync(ch)
    r["method_instead_of_content"] = attempt(no_content)

    c = ctx.conn()
    ch = ctx.ch(c)
    r["close_ok_reply"] = attempt(lambda: c.close() or "closed")
    return r


@scenario
def server_named_formats(ctx):
    c = ctx.conn()
    ch = ctx.ch(c)
    q = ch.queue_declare("", exclusive=True).method.queue
    tag = ch.basic_consume(q, lambda *a: None)
    ch.basic_publish("", q, b"x")
    got = []
    ch2 = ctx.ch(c)
    q2 = ch2.queue_declare("", exclusive=True).method.queue
    ch2.basic_publish("", q2, b"y")
    t2 = ch2.basic_consume(q2, lambda chn, m, p, b: got.append([m.consumer_tag, m.delivery_tag, m.exchange, m.routing_key, m.redelivered, b]))
    pump_until(c, lambda: got)
    return {"queue": q, "tag": tag, "tag2": t2, "delivery": got,
            "formats": [bool(re.fullmatch(r"amq\.gen-[A-Za-z0-9_-]{22}", q)),
                        bool(re.fullmatch(r"amq\.ctag-[A-Za-z0-9_-]{22}", tag))]}


# ---------------------------------------------------------------------------
# Broker model: alternate exchanges per exchange, limits on requeue, exclusive queues,
# sender-selected distribution, the default exchange
# ---------------------------------------------------------------------------
@scenario
def ae_per_exchange(ctx):
    """A fanout E bound to a direct I whose alternate exchange A feeds QA: a mandatory publish
    to E that I does not match reaches QA and is not returned."""
    c = ctx.conn()
    ch = ctx.ch(c)
    e, i, a = ctx.x("aeE"), ctx.x("aeI"), ctx.x("aeA")
    ch.exchange_declare(e, "fanout")
    ch.exchange_declare(a, "fanout")
    ch.exchange_declare(i, "direct", arguments={"alternate-exchange": a})
    ch.exchange_bind(i, e, "")
    qa, qi = ctx.q("aeQA"), ctx.q("aeQI")
    for q in (qa, qi):
        ch.queue_declare(q)
    ch.queue_bind(qa, a)
    ch.queue_bind(qi, i, "hit")
    ev = []
    mch = ctx.ch(c)
    mch._impl.add_on_return_callback(lambda chn, m, p, body: ev.append(["return", m.reply_code, body]))
    confirm_on(c, mch, lambda f: ev.append([type(f.method).__name__, f.method.delivery_tag, f.method.multiple]))
    mch._impl.basic_publish(e, "miss", b"miss", mandatory=True)
    mch._impl.basic_publish(e, "hit", b"hit", mandatory=True)
    pump_until(c, lambda: len(summarize_confirms(ev, {})["acked"]) >= 2)
    pump_for(c, 0.2)
    return {"confirms": summarize_confirms(ev, {b"miss": 1, b"hit": 2}),
            "qa": bodies(ch, qa), "qi": bodies(ch, qi)}


@scenario
def requeue_respects_max_length(ctx):
    """x-max-length 2: publish a, b; get a unacked; publish c; requeue a (nack, recover,
    channel close) — drop-head keeps [b, c] and dead-letters a (maxlen); reject-publish keeps
    all three."""
    c = ctx.conn()
    ch = ctx.ch(c)
    r = {}
    for mode, how in [("drop-head", "nack"), ("drop-head", "recover"), ("drop-head", "close"),
                      ("reject-publish", "nack"), ("reject-publish-dlx", "nack")]:
        dlq = ctx.q("rq.dlq.%s.%s" % (mode, how))
        q = ctx.q("rq.%s.%s" % (mode, how))
        ch.queue_declare(dlq)
        ch.queue_declare(q, arguments={"x-max-length": 2, "x-overflow": mode,
                                       "x-dead-letter-exchange": "",
                                       "x-dead-letter-routing-key": dlq})
        other = ctx.ch(c)
        ch.basic_publish("", q, b"a")
        ch.basic_publish("", q, b"b")
        settle()
        m, _, _ = other.basic_get(q, auto_ack=False)
        ch.basic_publish("", q, b"c")
        settle()
        if how == "nack":
            other.basic_nack(m.delivery_tag, requeue=True)
        elif how == "recover":
            other.basic_recover(requeue=True)
        else:
            other.close()
        settle()
        left = [[g["body"], g["redelivered"]] for g in drain(ch, q)]
        dead = [[g["body"], dict(g["props"]["headers"])["x-first-death-reason"]] for g in drain(ch, dlq)]
        r["%s/%s" % (mode, how)] = {"left": left, "dead": dead}
    return r


@scenario
def exclusive_durable_queue(ctx):
    """exclusive and durable: RabbitMQ makes the queue transient, so a redeclare with
    durable=false is equivalent."""
    c = ctx.conn()
    ch = ctx.ch(c)
    q = ctx.q("exdur")
    r = {"declare": attempt(lambda: ch.queue_declare(q, exclusive=True, durable=True).method.message_count)}
    r["redeclare_transient"] = attempt(lambda: ch.queue_declare(q, exclusive=True, durable=False).method.message_count)
    r["redeclare_durable"] = attempt(lambda: ch.queue_declare(q, exclusive=True, durable=True).method.message_count)
    ch.basic_publish("", q, b"m")
    settle()
    r["passive"] = attempt(lambda: [ch.queue_declare(q, passive=True).method.message_count,
                                    ch.queue_declare(q, passive=True).method.consumer_count])
    r["not_exclusive"] = attempt(lambda: ctx.ch(c).queue_declare(q, durable=False))
    return r


@scenario
def default_exchange_passive(ctx):
    c = ctx.conn()
    return {"passive": attempt(lambda: ctx.ch(c).exchange_declare("", passive=True) and "ok"),
            "active": attempt(lambda: ctx.ch(c).exchange_declare("", "direct") and "ok")}


@scenario
def sender_selected(ctx):
    """CC and BCC headers add routing keys (direct, topic, default exchange; fanout and headers
    ignore keys); BCC is removed before delivery; a header that is not an array is refused;
    x-death routing-keys hold the routing key and CC; dead letters route with BCC keys too."""
    c = ctx.conn()
    ch = ctx.ch(c)
    qs = {k: ctx.q("ss." + k) for k in ["k1", "k2", "k3"]}
    for q in qs.values():
        ch.queue_declare(q)
    xs = {kind: ctx.x("ss." + kind) for kind in ["direct", "topic", "fanout"]}
    for kind, x in xs.items():
        ch.exchange_declare(x, kind)
        for k, q in qs.items():
            ch.queue_bind(q, x, k if kind != "topic" else k + ".#")
    r = {}
    h = {"CC": ["k2"], "BCC": ["k3"]}
    for kind, x in xs.items():
        ch.basic_publish(x, "k1", b"m", pika.BasicProperties(headers=h))
        settle()
        r[kind] = {k: [[g["routing_key"], g["props"].get("headers")] for g in drain(ch, q)] for k, q in qs.items()}
    ch.basic_publish("", qs["k1"], b"m", pika.BasicProperties(headers={"CC": [qs["k2"]], "BCC": [qs["k3"]]}))
    settle()
    r["default"] = {k: len(drain(ch, q)) for k, q in qs.items()}
    ch.basic_publish(xs["direct"], "k1", b"m", pika.BasicProperties(headers={"CC": ["k1", 5, "k2"]}))
    settle()
    r["mixed_array"] = {k: len(drain(ch, q)) for k, q in qs.items()}
    for name, hdr in [("cc_string", {"CC": "k2"}), ("cc_int", {"CC": 5}), ("bcc_table", {"BCC": {"a": 1}})]:
        def bad(hdr=hdr):
            bch = ctx.ch(c)
            bch.basic_publish(xs["direct"], "k1", b"m", pika.BasicProperties(headers=hdr))
            return sync(bch)
        r[name] = attempt(bad)
    dlx = ctx.x("ss.dlx")
    ch.exchange_declare(dlx, "direct")
    dead = ctx.q("ss.dead")
    ch.queue_declare(dead)
    ch.queue_bind(dead, dlx, "bcc2")
    src = ctx.q("ss.src")
    ch.queue_declare(src, arguments={"x-dead-letter-exchange": dlx})
    ch.queue_bind(src, xs["direct"], "k1")
    ch.basic_publish(xs["direct"], "k1", b"dl",
                     pika.BasicProperties(headers={"CC": ["cc1", "cc2"], "BCC": ["bcc1", "bcc2"]}))
    settle()
    for q in qs.values():
        drain(ch, q)
    m, _, _ = ch.basic_get(src, auto_ack=False)
    ch.basic_reject(m.delivery_tag, requeue=False)
    settle()
    got = drain(ch, dead)
    r["dead_lettered"] = [[g["routing_key"], dict(dict(g["props"]["headers"])["x-death"][1][0][1])["routing-keys"],
                           sorted(k for k, _ in g["props"]["headers"])] for g in got]
    return r


# ---------------------------------------------------------------------------
# Expected values (RabbitMQ)
# ---------------------------------------------------------------------------
EXPECTED = {'acks': {'ack_autoacked': {'channel_close': [406,
                                              'PRECONDITION_FAILED - unknown delivery tag 1',
                                              60,
                                              80]},
          'ack_multiple_beyond': {'channel_close': [406,
                                                    'PRECONDITION_FAILED - unknown delivery tag 2',
                                                    60,
                                                    80]},
          'ack_zero_multiple': {'ok': 'alive'},
          'ack_zero_multiple_nothing': {'ok': 'alive'},
          'ack_zero_single': {'channel_close': [406,
                                                'PRECONDITION_FAILED - unknown delivery tag 0',
                                                60,
                                                80]},
          'count_after_multi': 0,
          'count_before_multi': 2,
          'double_ack': {'channel_close': [406,
                                           'PRECONDITION_FAILED - unknown delivery tag 1',
                                           60,
                                           80]},
          'nack_unknown': {'channel_close': [406,
                                             'PRECONDITION_FAILED - unknown delivery tag 7',
                                             60,
                                             120]},
          'reject_unknown': {'channel_close': [406,
                                               'PRECONDITION_FAILED - unknown delivery tag 7',
                                               60,
                                               90]},
          'unknown_tag': {'channel_close': [406,
                                            'PRECONDITION_FAILED - unknown delivery tag 99',
                                            60,
                                            80]}},
 'cancel_notification': {'after': {'ok': None},
                         'channel_open': True,
                         'events': [['cancel', 'watched', True]]},
 'channel_reuse_after_error': {'error': {'channel_close': [404,
                                                           "NOT_FOUND - no queue 'diff.none.RUN' "
                                                           "in vhost '/'",
                                                           50,
                                                           10]},
                               'reopen': {'ok': None},
                               'reuse': {'ok': 0},
                               'same_number': True},
 'confirm_misuse': {'confirm_twice': {'ok': {'ok': 'alive'}}},
 'confirms_and_returns': {'with_confirms': {'acked': [1, 2, 3, 4],
                                            'nacked': [],
                                            'returns': [[312,
                                                         'NO_ROUTE',
                                                         '',
                                                         'nowhere.RUN',
                                                         {'headers': [['h', ['I', 1]]]},
                                                         'b:b'],
                                                        [312,
                                                         'NO_ROUTE',
                                                         'amq.direct',
                                                         'nowhere',
                                                         {},
                                                         'b:d']],
                                            'returns_before_confirms': True},
                          'without_confirms': [[312, 'NO_ROUTE', 'amq.fanout', 'x', 'b:e'],
                                               [312, 'NO_ROUTE', 'amq.topic', 'a.b', 'b:f']]},
 'connection_errors': {'channel_open_twice': {'ok': {'connection_close': [504,
                                                                          'CHANNEL_ERROR - second '
                                                                          "'channel.open' seen",
                                                                          20,
                                                                          10]}},
                       'close_ok_reply': {'ok': 'closed'},
                       'method_instead_of_content': {'ok': {'connection_close': [505,
                                                                                 'UNEXPECTED_FRAME '
                                                                                 '- expected '
                                                                                 'content header '
                                                                                 'for class 60, '
                                                                                 'got non content '
                                                                                 'header frame '
                                                                                 'instead',
                                                                                 60,
                                                                                 40]}},
                       'method_on_unopened_channel': {'ok': {'connection_close': [504,
                                                                                  'CHANNEL_ERROR - '
                                                                                  'expected '
                                                                                  "'channel.open'",
                                                                                  60,
                                                                                  10]}},
                       'publish_immediate': {'ok': {'connection_close': [540,
                                                                         'NOT_IMPLEMENTED - '
                                                                         'immediate=true',
                                                                         60,
                                                                         40]}}},
 'consumer_redelivery_order': {'deliveries': [['b:0', False, 1, '', 'diff.ack.RUN'],
                                              ['b:1', False, 2, '', 'diff.ack.RUN'],
                                              ['b:2', False, 3, '', 'diff.ack.RUN'],
                                              ['b:3', False, 4, '', 'diff.ack.RUN'],
                                              ['b:1', True, 5, '', 'diff.ack.RUN'],
                                              ['b:2', True, 6, '', 'diff.ack.RUN']],
                               'left': ['b:0', 'b:1', 'b:2', 'b:3']},
 'dead_letter_x_death': {'expired_dlrk': [{'body': 'b:ttl',
                                           'delivery_tag': 3,
                                           'exchange': 'diff.dlx.RUN',
                                           'message_count': 0,
                                           'props': {'headers': [['x-death',
                                                                  ['A',
                                                                   [['F',
                                                                     [['original-expiration',
                                                                       ['S', '10000']],
                                                                      ['count', ['l', 1]],
                                                                      ['reason', ['S', 'expired']],
                                                                      ['queue',
                                                                       ['S', 'diff.src2.RUN']],
                                                                      ['time', ['T', '<time>']],
                                                                      ['exchange', ['S', '']],
                                                                      ['routing-keys',
                                                                       ['A',
                                                                        [['S',
                                                                          'diff.src2.RUN']]]]]]]]],
                                                                 ['x-first-death-exchange',
                                                                  ['S', '']],
                                                                 ['x-first-death-queue',
                                                                  ['S', 'diff.src2.RUN']],
                                                                 ['x-first-death-reason',
                                                                  ['S', 'expired']],
                                                                 ['x-last-death-exchange',
                                                                  ['S', '']],
                                                                 ['x-last-death-queue',
                                                                  ['S', 'diff.src2.RUN']],
                                                                 ['x-last-death-reason',
                                                                  ['S', 'expired']]]},
                                           'redelivered': False,
                                           'routing_key': 'new.key'}],
                         'first_death_keys': ['x-death',
                                              'x-first-death-exchange',
                                              'x-first-death-queue',
                                              'x-first-death-reason',
                                              'x-last-death-exchange',
                                              'x-last-death-queue',
                                              'x-last-death-reason'],
                         'maxlen': [{'body': 'b:first',
                                     'delivery_tag': 4,
                                     'exchange': 'diff.dlx.RUN',
                                     'message_count': 0,
                                     'props': {'headers': [['x-death',
                                                            ['A',
                                                             [['F',
                                                               [['count', ['l', 1]],
                                                                ['reason', ['S', 'maxlen']],
                                                                ['queue', ['S', 'diff.src3.RUN']],
                                                                ['time', ['T', '<time>']],
                                                                ['exchange', ['S', '']],
                                                                ['routing-keys',
                                                                 ['A',
                                                                  [['S', 'diff.src3.RUN']]]]]]]]],
                                                           ['x-first-death-exchange', ['S', '']],
                                                           ['x-first-death-queue',
                                                            ['S', 'diff.src3.RUN']],
                                                           ['x-first-death-reason',
                                                            ['S', 'maxlen']],
                                                           ['x-last-death-exchange', ['S', '']],
                                                           ['x-last-death-queue',
                                                            ['S', 'diff.src3.RUN']],
                                                           ['x-last-death-reason',
                                                            ['S', 'maxlen']]]},
                                     'redelivered': False,
                                     'routing_key': 'diff.src3.RUN'}],
                         'rejected': [{'body': 'b:rej',
                                       'delivery_tag': 2,
                                       'exchange': 'diff.dlx.RUN',
                                       'message_count': 0,
                                       'props': {'headers': [['keep', ['S', 'me']],
                                                             ['x-death',
                                                              ['A',
                                                               [['F',
                                                                 [['count', ['l', 1]],
                                                                  ['reason', ['S', 'rejected']],
                                                                  ['queue', ['S', 'diff.src.RUN']],
                                                                  ['time', ['T', '<time>']],
                                                                  ['exchange', ['S', '']],
                                                                  ['routing-keys',
                                                                   ['A',
                                                                    [['S', 'diff.src.RUN']]]]]]]]],
                                                             ['x-first-death-exchange', ['S', '']],
                                                             ['x-first-death-queue',
                                                              ['S', 'diff.src.RUN']],
                                                             ['x-first-death-reason',
                                                              ['S', 'rejected']],
                                                             ['x-last-death-exchange', ['S', '']],
                                                             ['x-last-death-queue',
                                                              ['S', 'diff.src.RUN']],
                                                             ['x-last-death-reason',
                                                              ['S', 'rejected']]]},
                                       'redelivered': False,
                                       'routing_key': 'diff.src.RUN'}],
                         'second_death': [{'body': 'b:twice',
                                           'delivery_tag': 11,
                                           'exchange': 'diff.dlx.RUN',
                                           'message_count': 0,
                                           'props': {'headers': [['x-death',
                                                                  ['A',
                                                                   [['F',
                                                                     [['count', ['l', 2]],
                                                                      ['reason', ['S', 'rejected']],
                                                                      ['queue',
                                                                       ['S', 'diff.src.RUN']],
                                                                      ['time', ['T', '<time>']],
                                                                      ['exchange', ['S', '']],
                                                                      ['routing-keys',
                                                                       ['A',
                                                                        [['S',
                                                                          'diff.src.RUN']]]]]]]]],
                                                                 ['x-first-death-exchange',
                                                                  ['S', '']],
                                                                 ['x-first-death-queue',
                                                                  ['S', 'diff.src.RUN']],
                                                                 ['x-first-death-reason',
                                                                  ['S', 'rejected']],
                                                                 ['x-last-death-exchange',
                                                                  ['S', '']],
                                                                 ['x-last-death-queue',
                                                                  ['S', 'diff.src.RUN']],
                                                                 ['x-last-death-reason',
                                                                  ['S', 'rejected']]]},
                                           'redelivered': False,
                                           'routing_key': 'diff.src.RUN'}],
                         'src3_left': ['b:second']},
 'delete_conditions': {'delete': {'ok': 0},
                       'exchange_delete': {'ok': 'ok'},
                       'exchange_if_unused': {'channel_close': [406,
                                                                'PRECONDITION_FAILED - exchange '
                                                                "'diff.delx.RUN' in vhost '/' in "
                                                                'use',
                                                                40,
                                                                20]},
                       'if_empty': {'channel_close': [406,
                                                      "PRECONDITION_FAILED - queue 'diff.del.RUN' "
                                                      "in vhost '/' not empty",
                                                      50,
                                                      40]},
                       'if_unused': {'channel_close': [406,
                                                       "PRECONDITION_FAILED - queue 'diff.del.RUN' "
                                                       "in vhost '/' in use",
                                                       50,
                                                       40]},
                       'purge_with_unacked': {'ok': 2}},
 'direct_fanout_x2x_ae': {'ae': [['b:hit'], [['b:miss', 'diff.main.RUN', 'miss']]],
                          'ae_got': ['b:to-ae-mandatory'],
                          'ae_mandatory_returns': [[312,
                                                    'NO_ROUTE',
                                                    'diff.missingae.RUN',
                                                    'b:to-missing-ae']],
                          'x2x_cycle': ['b:cycle'],
                          'x2x_dedup': [['b:once', 'diff.src.RUN', 'k']]},
 'exchange_inequivalent': {'arg_changed': {'channel_close': [406,
                                                             'PRECONDITION_FAILED - inequivalent '
                                                             "arg 'alternate-exchange' for "
                                                             "exchange 'diff.x.RUN' in vhost '/': "
                                                             "received 'other' but current is 'ae'",
                                                             40,
                                                             10]},
                           'arg_extra_unknown': {'ok': 'ok'},
                           'arg_removed': {'channel_close': [406,
                                                             'PRECONDITION_FAILED - inequivalent '
                                                             "arg 'alternate-exchange' for "
                                                             "exchange 'diff.x.RUN' in vhost '/': "
                                                             'received none but current is the '
                                                             "value 'ae' of type 'longstr'",
                                                             40,
                                                             10]},
                           'auto_delete': {'channel_close': [406,
                                                             'PRECONDITION_FAILED - inequivalent '
                                                             "arg 'auto_delete' for exchange "
                                                             "'diff.x.RUN' in vhost '/': received "
                                                             "'true' but current is 'false'",
                                                             40,
                                                             10]},
                           'durable': {'channel_close': [406,
                                                         'PRECONDITION_FAILED - inequivalent arg '
                                                         "'durable' for exchange 'diff.x.RUN' in "
                                                         "vhost '/': received 'true' but current "
                                                         "is 'false'",
                                                         40,
                                                         10]},
                           'internal': {'channel_close': [406,
                                                          'PRECONDITION_FAILED - inequivalent arg '
                                                          "'internal' for exchange 'diff.x.RUN' in "
                                                          "vhost '/': received 'true' but current "
                                                          "is 'false'",
                                                          40,
                                                          10]},
                           'passive_other_type': {'ok': 'ok'},
                           'same': {'ok': 'ok'},
                           'type': {'channel_close': [406,
                                                      'PRECONDITION_FAILED - inequivalent arg '
                                                      "'type' for exchange 'diff.x.RUN' in vhost "
                                                      "'/': received 'fanout' but current is "
                                                      "'direct'",
                                                      40,
                                                      10]}},
 'exclusive_consumer': {'declare_ok_counts': [1, 1],
                        'exclusive_after_normal': {'channel_close': [403,
                                                                     'ACCESS_REFUSED - queue '
                                                                     "'diff.xc2.RUN' in vhost '/' "
                                                                     'in exclusive use',
                                                                     60,
                                                                     20]},
                        'second': {'channel_close': [403,
                                                     "ACCESS_REFUSED - queue 'diff.xc.RUN' in "
                                                     "vhost '/' in exclusive use",
                                                     60,
                                                     20]},
                        'second_exclusive': {'channel_close': [403,
                                                               'ACCESS_REFUSED - queue '
                                                               "'diff.xc.RUN' in vhost '/' in "
                                                               'exclusive use',
                                                               60,
                                                               20]}},
 'exclusive_locked': {'bind': {'channel_close': [405,
                                                 'RESOURCE_LOCKED - cannot obtain exclusive access '
                                                 "to locked queue 'diff.excl.RUN' in vhost '/'. It "
                                                 'could be originally declared on another '
                                                 'connection or the exclusive property value does '
                                                 'not match that of the original declaration.',
                                                 50,
                                                 20]},
                      'consume': {'channel_close': [405,
                                                    'RESOURCE_LOCKED - cannot obtain exclusive '
                                                    "access to locked queue 'diff.excl.RUN' in "
                                                    "vhost '/'. It could be originally declared on "
                                                    'another connection or the exclusive property '
                                                    'value does not match that of the original '
                                                    'declaration.',
                                                    60,
                                                    20]},
                      'count_after': 1,
                      'declare': {'channel_close': [405,
                                                    'RESOURCE_LOCKED - cannot obtain exclusive '
                                                    "access to locked queue 'diff.excl.RUN' in "
                                                    "vhost '/'. It could be originally declared on "
                                                    'another connection or the exclusive property '
                                                    'value does not match that of the original '
                                                    'declaration.',
                                                    50,
                                                    10]},
                      'declare_nonexcl': {'channel_close': [405,
                                                            'RESOURCE_LOCKED - cannot obtain '
                                                            'exclusive access to locked queue '
                                                            "'diff.excl.RUN' in vhost '/'. It "
                                                            'could be originally declared on '
                                                            'another connection or the exclusive '
                                                            'property value does not match that of '
                                                            'the original declaration.',
                                                            50,
                                                            10]},
                      'delete': {'channel_close': [405,
                                                   'RESOURCE_LOCKED - cannot obtain exclusive '
                                                   "access to locked queue 'diff.excl.RUN' in "
                                                   "vhost '/'. It could be originally declared on "
                                                   'another connection or the exclusive property '
                                                   'value does not match that of the original '
                                                   'declaration.',
                                                   50,
                                                   40]},
                      'get': {'channel_close': [405,
                                                'RESOURCE_LOCKED - cannot obtain exclusive access '
                                                "to locked queue 'diff.excl.RUN' in vhost '/'. It "
                                                'could be originally declared on another '
                                                'connection or the exclusive property value does '
                                                'not match that of the original declaration.',
                                                60,
                                                70]},
                      'passive': {'channel_close': [405,
                                                    'RESOURCE_LOCKED - cannot obtain exclusive '
                                                    "access to locked queue 'diff.excl.RUN' in "
                                                    "vhost '/'. It could be originally declared on "
                                                    'another connection or the exclusive property '
                                                    'value does not match that of the original '
                                                    'declaration.',
                                                    50,
                                                    10]},
                      'publish_other_conn': {'ok': {'ok': 'alive'}},
                      'purge': {'channel_close': [405,
                                                  'RESOURCE_LOCKED - cannot obtain exclusive '
                                                  "access to locked queue 'diff.excl.RUN' in vhost "
                                                  "'/'. It could be originally declared on another "
                                                  'connection or the exclusive property value does '
                                                  'not match that of the original declaration.',
                                                  50,
                                                  30]},
                      'unbind': {'ok': {'method': 'Queue.UnbindOk'}}},
 'headers_edges': {'bad_x_match': {'channel_close': [406,
                                                     'PRECONDITION_FAILED - Invalid x-match field '
                                                     'value <<"bogus">>; expected all, any, '
                                                     'all-with-x, or any-with-x',
                                                     50,
                                                     20]},
                   'routes': [['', ['allx_ignored', 'empty']],
                              ['', ['allx_ignored', 'empty']],
                              ['', ['allx_ignored', 'any', 'default', 'empty']],
                              ['', ['all', 'allx_ignored', 'any', 'default', 'empty']],
                              ['', ['allx_ignored', 'any', 'empty']],
                              ['', ['allx_ignored', 'empty', 'str1']],
                              ['', ['allx_ignored', 'empty']],
                              ['', ['allx_ignored', 'empty', 'void']],
                              ['', ['allx_ignored', 'empty', 'void']],
                              ['', ['allx', 'allx_ignored', 'anyx', 'empty']],
                              ['', ['allx_ignored', 'bool', 'empty']],
                              ['', ['allx_ignored', 'empty']],
                              ['k', ['all', 'allx_ignored', 'any', 'default', 'empty']]],
                   'x_match_int': {'channel_close': [406,
                                                     'PRECONDITION_FAILED - Invalid x-match field '
                                                     'type signedint (value 1); expected longstr',
                                                     50,
                                                     20]}},
 'max_length_modes': {'bytes_drop_head': ['b:67890', 'b:abc'],
                      'drop_head': ['b:2', 'b:3'],
                      'max_zero': 0,
                      'reject_publish_confirms': {'acked': [1],
                                                  'nacked': [2, 3],
                                                  'returns': [],
                                                  'returns_before_confirms': True},
                      'reject_publish_dlx_dlq': ['b:over'],
                      'reject_publish_dlx_left': ['b:in'],
                      'reject_publish_left': ['b:0'],
                      'reject_publish_mandatory': {'acked': [],
                                                   'nacked': [1],
                                                   'returns': [],
                                                   'returns_before_confirms': True}},
 'missing_entities': {'basic_consume': {'channel_close': [404,
                                                          "NOT_FOUND - no queue 'diff.nope.RUN' in "
                                                          "vhost '/'",
                                                          60,
                                                          20]},
                      'basic_get': {'channel_close': [404,
                                                      "NOT_FOUND - no queue 'diff.nope.RUN' in "
                                                      "vhost '/'",
                                                      60,
                                                      70]},
                      'bind_missing_exchange': {'channel_close': [404,
                                                                  'NOT_FOUND - no exchange '
                                                                  "'diff.nox.RUN' in vhost '/'",
                                                                  50,
                                                                  20]},
                      'bind_missing_queue': {'channel_close': [404,
                                                               'NOT_FOUND - no queue '
                                                               "'diff.nope.RUN' in vhost '/'",
                                                               50,
                                                               20]},
                      'exchange_delete': {'ok': 'deleted'},
                      'exchange_passive': {'channel_close': [404,
                                                             'NOT_FOUND - no exchange '
                                                             "'diff.nox.RUN' in vhost '/'",
                                                             40,
                                                             10]},
                      'publish_missing_exchange': {'ok': {'channel_close': [404,
                                                                            'NOT_FOUND - no '
                                                                            'exchange '
                                                                            "'diff.nox.RUN' in "
                                                                            "vhost '/'",
                                                                            60,
                                                                            40]}},
                      'queue_delete': {'ok': 0},
                      'queue_passive': {'channel_close': [404,
                                                          "NOT_FOUND - no queue 'diff.nope.RUN' in "
                                                          "vhost '/'",
                                                          50,
                                                          10]},
                      'queue_purge': {'channel_close': [404,
                                                        "NOT_FOUND - no queue 'diff.nope.RUN' in "
                                                        "vhost '/'",
                                                        50,
                                                        30]},
                      'unbind_missing_exchange': {'ok': 'ok'},
                      'unbind_missing_queue': {'ok': 'ok'},
                      'unbind_no_binding': {'ok': 'ok'},
                      'x2x_missing_dest': {'channel_close': [404,
                                                             'NOT_FOUND - no exchange '
                                                             "'diff.nox.RUN' in vhost '/'",
                                                             40,
                                                             30]},
                      'x2x_missing_src': {'channel_close': [404,
                                                            'NOT_FOUND - no exchange '
                                                            "'diff.nox.RUN' in vhost '/'",
                                                            40,
                                                            30]},
                      'x2x_unbind_missing': {'ok': 'ok'}},
 'nack_requeue_redelivered': {'after': [['b:0', True, 3, 2],
                                        ['b:1', True, 4, 1],
                                        ['b:2', False, 5, 0]],
                              'nack_multiple_all': [['b:0', True], ['b:1', True], ['b:2', True]],
                              'recover': [['b:r', True]],
                              'reject_drop': 0},
 'priorities': {'no_prio_queue': ['b:0', 'b:1', 'b:2'],
                'order': [['b:2:5', 5],
                          ['b:3:9', 9],
                          ['b:6:5', 5],
                          ['b:5:3', 3],
                          ['b:1:1', 1],
                          ['b:0:None', None],
                          ['b:4:0', 0]]},
 'properties_roundtrip': [{'body': 'b:body',
                           'delivery_tag': 1,
                           'exchange': '',
                           'message_count': 2,
                           'props': {'app_id': 'app',
                                     'cluster_id': 'cid',
                                     'content_encoding': 'gzip',
                                     'content_type': 'text/plain',
                                     'correlation_id': 'corr',
                                     'delivery_mode': 2,
                                     'expiration': '60000',
                                     'headers': [['str', ['S', 'hello']],
                                                 ['int', ['I', 7]],
                                                 ['neg', ['I', -3]],
                                                 ['big', ['l', 1099511627776]],
                                                 ['bool', ['t', True]],
                                                 ['dec', ['D', [2, 314]]],
                                                 ['bytes', ['x', '0001']],
                                                 ['none', ['V', None]],
                                                 ['list',
                                                  ['A',
                                                   [['I', 1], ['S', 'a'], ['A', [['t', True]]]]]],
                                                 ['table',
                                                  ['F', [['k', ['F', [['n', ['I', 1]]]]]]]],
                                                 ['ts', ['T', '<time>']]],
                                     'message_id': 'mid',
                                     'priority': 3,
                                     'reply_to': 'rt',
                                     'timestamp': 1600000000,
                                     'type': 't',
                                     'user_id': 'guest'},
                           'redelivered': False,
                           'routing_key': 'diff.props.RUN'},
                          {'body': 'b:',
                           'delivery_tag': 2,
                           'exchange': '',
                           'message_count': 1,
                           'props': {},
                           'redelivered': False,
                           'routing_key': 'diff.props.RUN'},
                          {'body': 'b:e',
                           'delivery_tag': 3,
                           'exchange': '',
                           'message_count': 0,
                           'props': {'headers': []},
                           'redelivered': False,
                           'routing_key': 'diff.props.RUN'}],
 'publish_checks': {'default_exchange_missing_queue': {'ok': {'ok': 'alive'}},
                    'expiration_bad': {'ok': {'channel_close': [406,
                                                                'PRECONDITION_FAILED - invalid '
                                                                "expiration 'abc': no_integer",
                                                                60,
                                                                40]}},
                    'expiration_negative': {'ok': {'channel_close': [406,
                                                                     'PRECONDITION_FAILED - '
                                                                     "invalid expiration '-1': "
                                                                     '{value_negative,-1}',
                                                                     60,
                                                                     40]}},
                    'internal': {'ok': {'channel_close': [403,
                                                          'ACCESS_REFUSED - cannot publish to '
                                                          "internal exchange 'diff.internal.RUN' "
                                                          "in vhost '/'",
                                                          60,
                                                          40]}},
                    'user_id_bad': {'ok': {'channel_close': [406,
                                                             'PRECONDITION_FAILED - user_id '
                                                             "property set to 'bob' but "
                                                             "authenticated user was 'guest'",
                                                             60,
                                                             40]}},
                    'user_id_good': {'ok': {'ok': 'alive'}}},
 'purge_and_delete_counts': {'after_requeue': 2,
                             'declare': [0, 0],
                             'declare_with_unacked': 3,
                             'delete': 3,
                             'get_counts': [4, 3],
                             'purge': 3,
                             'purge_again': 0,
                             'redeclare': [5, 0]},
 'qos_and_tags': {'cancel_unknown_nowait': {'ok': {'ok': 'alive'}},
                  'prefetch_size': {'connection_close': [540,
                                                         'NOT_IMPLEMENTED - prefetch_size!=0 '
                                                         '(1000)',
                                                         60,
                                                         10]},
                  'qos_global': {'ok': None},
                  'tag_reuse': {'ok': {'connection_close': [530,
                                                            'NOT_ALLOWED - attempt to reuse '
                                                            "consumer tag 'dup'",
                                                            60,
                                                            20]}}},
 'queue_arg_validation': {'dlrk_without_dlx': {'channel_close': [406,
                                                                 'PRECONDITION_FAILED - invalid '
                                                                 "arg 'x-dead-letter-routing-key' "
                                                                 'for queue '
                                                                 "'diff.va.dlrk_without_dlx.RUN' "
                                                                 "in vhost '/': "
                                                                 'routing_key_but_no_dlx_defined',
                                                                 50,
                                                                 10]},
                          'dlx_int': {'channel_close': [406,
                                                        'PRECONDITION_FAILED - invalid type '
                                                        "'signedint' for arg "
                                                        "'x-dead-letter-exchange' in queue "
                                                        "'diff.va.dlx_int.RUN' in vhost '/'",
                                                        50,
                                                        10]},
                          'expires_negative': {'channel_close': [406,
                                                                 'PRECONDITION_FAILED - invalid '
                                                                 "arg 'x-expires' for queue "
                                                                 "'diff.va.expires_negative.RUN' "
                                                                 "in vhost '/': "
                                                                 '{value_negative,-5}',
                                                                 50,
                                                                 10]},
                          'expires_zero': {'channel_close': [406,
                                                             'PRECONDITION_FAILED - invalid arg '
                                                             "'x-expires' for queue "
                                                             "'diff.va.expires_zero.RUN' in vhost "
                                                             "'/': {value_zero,0}",
                                                             50,
                                                             10]},
                          'max_length_bytes_negative': {'channel_close': [406,
                                                                          'PRECONDITION_FAILED - '
                                                                          'invalid arg '
                                                                          "'x-max-length-bytes' "
                                                                          'for queue '
                                                                          "'diff.va.max_length_bytes_negative.RUN' "
                                                                          "in vhost '/': "
                                                                          '{value_negative,-1}',
                                                                          50,
                                                                          10]},
                          'max_length_negative': {'channel_close': [406,
                                                                    'PRECONDITION_FAILED - invalid '
                                                                    "arg 'x-max-length' for queue "
                                                                    "'diff.va.max_length_negative.RUN' "
                                                                    "in vhost '/': "
                                                                    '{value_negative,-1}',
                                                                    50,
                                                                    10]},
                          'max_length_string': {'channel_close': [406,
                                                                  'PRECONDITION_FAILED - invalid '
                                                                  "arg 'x-max-length' for queue "
                                                                  "'diff.va.max_length_string.RUN' "
                                                                  'in vhost \'/\': "expected '
                                                                  'integer, got longstr"',
                                                                  50,
                                                                  10]},
                          'max_priority_256': {'channel_close': [406,
                                                                 'PRECONDITION_FAILED - invalid '
                                                                 "arg 'x-max-priority' for queue "
                                                                 "'diff.va.max_priority_256.RUN' "
                                                                 "in vhost '/': "
                                                                 '{max_value_exceeded,256}',
                                                                 50,
                                                                 10]},
                          'max_priority_negative': {'channel_close': [406,
                                                                      'PRECONDITION_FAILED - '
                                                                      'invalid arg '
                                                                      "'x-max-priority' for queue "
                                                                      "'diff.va.max_priority_negative.RUN' "
                                                                      "in vhost '/': "
                                                                      '{value_negative,-1}',
                                                                      50,
                                                                      10]},
                          'max_priority_string': {'channel_close': [406,
                                                                    'PRECONDITION_FAILED - invalid '
                                                                    "arg 'x-max-priority' for "
                                                                    'queue '
                                                                    "'diff.va.max_priority_string.RUN' "
                                                                    'in vhost \'/\': "expected '
                                                                    'integer, got longstr"',
                                                                    50,
                                                                    10]},
                          'ok_all': {'ok': [0]},
                          'overflow_bogus': {'channel_close': [406,
                                                               'PRECONDITION_FAILED - invalid arg '
                                                               "'x-overflow' for queue "
                                                               "'diff.va.overflow_bogus.RUN' in "
                                                               "vhost '/': invalid_overflow",
                                                               50,
                                                               10]},
                          'overflow_int': {'channel_close': [406,
                                                             'PRECONDITION_FAILED - invalid arg '
                                                             "'x-overflow' for queue "
                                                             "'diff.va.overflow_int.RUN' in vhost "
                                                             "'/': {unacceptable_type,signedint}",
                                                             50,
                                                             10]},
                          'queue_mode_bogus': {'channel_close': [406,
                                                                 'PRECONDITION_FAILED - invalid '
                                                                 "arg 'x-queue-mode' for queue "
                                                                 "'diff.va.queue_mode_bogus.RUN' "
                                                                 'in vhost \'/\': "unsupported '
                                                                 'queue mode \'bogus\'"',
                                                                 50,
                                                                 10]},
                          'queue_type_bogus': {'channel_close': [406,
                                                                 'PRECONDITION_FAILED - invalid '
                                                                 "arg 'x-queue-type' for queue "
                                                                 "'diff.va.queue_type_bogus.RUN' "
                                                                 'in vhost \'/\': "unsupported '
                                                                 'queue type \'bogus\'"',
                                                                 50,
                                                                 10]},
                          'sac_int': {'channel_close': [406,
                                                        'PRECONDITION_FAILED - invalid arg '
                                                        "'x-single-active-consumer' for queue "
                                                        "'diff.va.sac_int.RUN' in vhost '/': "
                                                        '{unacceptable_type,signedint}',
                                                        50,
                                                        10]},
                          'sac_string': {'channel_close': [406,
                                                           'PRECONDITION_FAILED - invalid arg '
                                                           "'x-single-active-consumer' for queue "
                                                           "'diff.va.sac_string.RUN' in vhost '/': "
                                                           '{unacceptable_type,longstr}',
                                                           50,
                                                           10]},
                          'ttl_negative': {'channel_close': [406,
                                                             'PRECONDITION_FAILED - invalid arg '
                                                             "'x-message-ttl' for queue "
                                                             "'diff.va.ttl_negative.RUN' in vhost "
                                                             "'/': {value_negative,-1}",
                                                             50,
                                                             10]},
                          'ttl_string': {'channel_close': [406,
                                                           'PRECONDITION_FAILED - invalid arg '
                                                           "'x-message-ttl' for queue "
                                                           "'diff.va.ttl_string.RUN' in vhost '/': "
                                                           '"expected integer, got longstr"',
                                                           50,
                                                           10]}},
 'queue_inequivalent': {'added_dlx': {'channel_close': [406,
                                                        'PRECONDITION_FAILED - inequivalent arg '
                                                        "'x-dead-letter-exchange' for queue "
                                                        "'diff.q.RUN' in vhost '/': received the "
                                                        "value 'd' of type 'longstr' but current "
                                                        'is none',
                                                        50,
                                                        10]},
                        'added_unknown': {'ok': 0},
                        'auto_delete': {'channel_close': [406,
                                                          'PRECONDITION_FAILED - inequivalent arg '
                                                          "'auto_delete' for queue 'diff.q.RUN' in "
                                                          "vhost '/': received 'true' but current "
                                                          "is 'false'",
                                                          50,
                                                          10]},
                        'durable': {'channel_close': [406,
                                                      'PRECONDITION_FAILED - inequivalent arg '
                                                      "'durable' for queue 'diff.q.RUN' in vhost "
                                                      "'/': received 'true' but current is 'false'",
                                                      50,
                                                      10]},
                        'exclusive': {'channel_close': [405,
                                                        'RESOURCE_LOCKED - cannot obtain exclusive '
                                                        "access to locked queue 'diff.q.RUN' in "
                                                        "vhost '/'. It could be originally "
                                                        'declared on another connection or the '
                                                        'exclusive property value does not match '
                                                        'that of the original declaration.',
                                                        50,
                                                        10]},
                        'no_args': {'channel_close': [406,
                                                      'PRECONDITION_FAILED - inequivalent arg '
                                                      "'x-message-ttl' for queue 'diff.q.RUN' in "
                                                      "vhost '/': received none but current is the "
                                                      "value '1000' of type 'signedint'",
                                                      50,
                                                      10]},
                        'overflow_changed': {'channel_close': [406,
                                                               'PRECONDITION_FAILED - inequivalent '
                                                               "arg 'x-overflow' for queue "
                                                               "'diff.q2.RUN' in vhost '/': "
                                                               "received 'reject-publish' but "
                                                               "current is 'drop-head'",
                                                               50,
                                                               10]},
                        'passive_ignores': {'ok': 0},
                        'priority_changed': {'channel_close': [406,
                                                               'PRECONDITION_FAILED - inequivalent '
                                                               "arg 'x-max-priority' for queue "
                                                               "'diff.q2.RUN' in vhost '/': "
                                                               "received '6' but current is '5'",
                                                               50,
                                                               10]},
                        'priority_removed': {'channel_close': [406,
                                                               'PRECONDITION_FAILED - inequivalent '
                                                               "arg 'x-max-priority' for queue "
                                                               "'diff.q2.RUN' in vhost '/': "
                                                               'received none but current is the '
                                                               "value '5' of type 'signedint'",
                                                               50,
                                                               10]},
                        'queue_type_classic': {'ok': 'diff.q2.RUN'},
                        'ttl_changed': {'channel_close': [406,
                                                          'PRECONDITION_FAILED - inequivalent arg '
                                                          "'x-message-ttl' for queue 'diff.q.RUN' "
                                                          "in vhost '/': received '2000' but "
                                                          "current is '1000'",
                                                          50,
                                                          10]},
                        'ttl_removed': {'channel_close': [406,
                                                          'PRECONDITION_FAILED - inequivalent arg '
                                                          "'x-message-ttl' for queue 'diff.q.RUN' "
                                                          "in vhost '/': received none but current "
                                                          "is the value '1000' of type 'signedint'",
                                                          50,
                                                          10]},
                        'ttl_type_long': {'channel_close': [406,
                                                            'PRECONDITION_FAILED - inequivalent '
                                                            "arg 'x-message-ttl' for queue "
                                                            "'diff.q.RUN' in vhost '/': received "
                                                            "'1099511627776' but current is '1000'",
                                                            50,
                                                            10]}},
 'reserved_and_default_names': {'bad_type': {'channel_close': [406,
                                                               'PRECONDITION_FAILED - unknown '
                                                               "exchange type 'nosuchtype'",
                                                               40,
                                                               10]},
                                'bad_type_passive_missing': {'channel_close': [404,
                                                                               'NOT_FOUND - no '
                                                                               'exchange '
                                                                               "'diff.bt2.RUN' in "
                                                                               "vhost '/'",
                                                                               40,
                                                                               10]},
                                'bind_default': {'channel_close': [403,
                                                                   'ACCESS_REFUSED - operation not '
                                                                   'permitted on the default '
                                                                   'exchange',
                                                                   50,
                                                                   20]},
                                'exchange_amq_delete': {'channel_close': [403,
                                                                          'ACCESS_REFUSED - '
                                                                          'deletion of system '
                                                                          "exchange 'amq.fanout' "
                                                                          "in vhost '/' not "
                                                                          'allowed',
                                                                          40,
                                                                          20]},
                                'exchange_amq_direct_passive': {'ok': 'ok'},
                                'exchange_amq_direct_redeclare': {'ok': 'ok'},
                                'exchange_amq_prefix': {'channel_close': [403,
                                                                          'ACCESS_REFUSED - '
                                                                          'exchange name '
                                                                          "'amq.diffRUN' contains "
                                                                          "reserved prefix 'amq.*'",
                                                                          40,
                                                                          10]},
                                'exchange_default_declare': {'channel_close': [403,
                                                                               'ACCESS_REFUSED - '
                                                                               'operation not '
                                                                               'permitted on the '
                                                                               'default exchange',
                                                                               40,
                                                                               10]},
                                'exchange_default_delete': {'channel_close': [403,
                                                                              'ACCESS_REFUSED - '
                                                                              'operation not '
                                                                              'permitted on the '
                                                                              'default exchange',
                                                                              40,
                                                                              20]},
                                'queue_amq_prefix': {'channel_close': [403,
                                                                       'ACCESS_REFUSED - queue '
                                                                       "name 'amq.diffRUN' "
                                                                       'contains reserved prefix '
                                                                       "'amq.*'",
                                                                       50,
                                                                       10]},
                                'queue_amq_prefix_passive': {'channel_close': [404,
                                                                               'NOT_FOUND - no '
                                                                               'queue '
                                                                               "'amq.diffRUN' in "
                                                                               "vhost '/'",
                                                                               50,
                                                                               10]},
                                'unbind_default': {'channel_close': [403,
                                                                     'ACCESS_REFUSED - operation '
                                                                     'not permitted on the default '
                                                                     'exchange',
                                                                     50,
                                                                     50]},
                                'x2x_default_dest': {'channel_close': [403,
                                                                       'ACCESS_REFUSED - operation '
                                                                       'not permitted on the '
                                                                       'default exchange',
                                                                       40,
                                                                       30]},
                                'x2x_default_src': {'channel_close': [403,
                                                                      'ACCESS_REFUSED - operation '
                                                                      'not permitted on the '
                                                                      'default exchange',
                                                                      40,
                                                                      30]}},
 'server_named': {'bind_empty_name': {'ok': 'ok'},
                  'bind_empty_no_last_queue': {'channel_close': [404,
                                                                 'NOT_FOUND - no previously '
                                                                 'declared queue',
                                                                 50,
                                                                 20]},
                  'ctag': 'ctag1.<pika>',
                  'declare': ['amq.gen-<22>', 0, 0],
                  'get_empty_no_last_queue': {'channel_close': [404,
                                                                'NOT_FOUND - no previously '
                                                                'declared queue',
                                                                60,
                                                                70]},
                  'passive_empty': {'channel_close': [404,
                                                      "NOT_FOUND - no queue '' in vhost '/'",
                                                      50,
                                                      10]},
                  'purge_empty_name': {'ok': 1}},
 'server_named_formats': {'delivery': [['ctag2.<pika>', 1, '', 'amq.gen-<22>', False, 'b:y']],
                          'formats': [True, False],
                          'queue': 'amq.gen-<22>',
                          'tag': 'ctag1.<pika>',
                          'tag2': 'ctag2.<pika>'},
 'single_active_consumer': {'consumers': 2,
                            'got': [['c1', 'b:0'],
                                    ['c1', 'b:1'],
                                    ['c1', 'b:2'],
                                    ['c2', 'b:3'],
                                    ['c2', 'b:4']]},
 'topic_edges': [['', ['empty', 'hash', 'hash_hash']],
                 ['a', ['a_hash', 'hash', 'hash_hash', 'star']],
                 ['a.b',
                  ['a_hash',
                   'a_hash_b',
                   'a_star',
                   'hash',
                   'hash_hash',
                   'star_b',
                   'star_hash_star']],
                 ['.b', ['hash', 'hash_hash', 'star_b', 'star_hash_star']],
                 ['a.', ['a_hash', 'a_star', 'hash', 'hash_hash', 'star_hash_star']],
                 ['a..b', ['a__b', 'a_hash', 'a_hash_b', 'hash', 'hash_hash', 'star_hash_star']],
                 ['b', ['hash', 'hash_hash', 'star']],
                 ['a.x.b', ['a_hash', 'a_hash_b', 'hash', 'hash_hash', 'star_hash_star']],
                 ['x.a.b', ['hash', 'hash_hash', 'star_hash_star']],
                 ['a.b.c', ['a_hash', 'hash', 'hash_hash', 'star_hash_star']],
                 ['#', ['hash', 'hash_hash', 'star']],
                 ['*', ['hash', 'hash_hash', 'star']]],
 'ttl_and_expiration': {'left': [['b:keep', {'expiration': '60000'}]],
                        'queue_ttl_wins': 0,
                        'ttl0_consumer': ['b:to-consumer'],
                        'ttl0_no_consumer': 0},
 'tx_misuse': {'ack_committed': 0,
               'ack_rolled_back': 0,
               'after_commit': 1,
               'after_rollback': 1,
               'before_commit': 0,
               'commit_not_tx': {'channel_close': [406,
                                                   'PRECONDITION_FAILED - channel is not '
                                                   'transactional',
                                                   90,
                                                   20]},
               'confirm_after_tx': {'channel_close': [406,
                                                      'PRECONDITION_FAILED - cannot switch from tx '
                                                      'to confirm mode',
                                                      85,
                                                      10]},
               'rollback_not_tx': {'channel_close': [406,
                                                     'PRECONDITION_FAILED - channel is not '
                                                     'transactional',
                                                     90,
                                                     30]},
               'tx_after_confirm': {'channel_close': [406,
                                                      'PRECONDITION_FAILED - cannot switch from '
                                                      'confirm to tx mode',
                                                      90,
                                                      10]},
               'tx_bad_ack_at_ack': {'channel_close': [406,
                                                       'PRECONDITION_FAILED - unknown delivery tag '
                                                       '55',
                                                       60,
                                                       80]},
               'tx_select_twice': {'ok': 'ok'}}}

# Where RabbitMQ 3.x (the 3.10 reference) differs from 4.x, EXPECTED holds the 4.x behaviour
# and this table what 3.x does, so the suite also passes against a 3.x broker:
# - dead-lettering: 4.x adds x-last-death-{reason,queue,exchange} (since 3.13), puts an x-death
#   entry's original-expiration first, and regenerates an x-death entry that arrived with the
#   message in its canonical field order (3.x sorts its fields by name);
# - an unknown exchange type is a 406 channel error in 4.x (rabbit_exchange:check_type), a
#   503 connection error in 3.x.
EXPECTED_RABBITMQ_3 = {'dead_letter_x_death': {'expired_dlrk': [{'body': 'b:ttl',
                                           'delivery_tag': 3,
                                           'exchange': 'diff.dlx.RUN',
                                           'message_count': 0,
                                           'props': {'headers': [['x-death',
                                                                  ['A',
                                                                   [['F',
                                                                     [['count', ['l', 1]],
                                                                      ['reason', ['S', 'expired']],
                                                                      ['queue',
                                                                       ['S', 'diff.src2.RUN']],
                                                                      ['time', ['T', '<time>']],
                                                                      ['exchange', ['S', '']],
                                                                      ['routing-keys',
                                                                       ['A',
                                                                        [['S', 'diff.src2.RUN']]]],
                                                                      ['original-expiration',
                                                                       ['S', '10000']]]]]]],
                                                                 ['x-first-death-exchange',
                                                                  ['S', '']],
                                                                 ['x-first-death-queue',
                                                                  ['S', 'diff.src2.RUN']],
                                                                 ['x-first-death-reason',
                                                                  ['S', 'expired']]]},
                                           'redelivered': False,
                                           'routing_key': 'new.key'}],
                         'first_death_keys': ['x-death',
                                              'x-first-death-exchange',
                                              'x-first-death-queue',
                                              'x-first-death-reason'],
                         'maxlen': [{'body': 'b:first',
                                     'delivery_tag': 4,
                                     'exchange': 'diff.dlx.RUN',
                                     'message_count': 0,
                                     'props': {'headers': [['x-death',
                                                            ['A',
                                                             [['F',
                                                               [['count', ['l', 1]],
                                                                ['reason', ['S', 'maxlen']],
                                                                ['queue', ['S', 'diff.src3.RUN']],
                                                                ['time', ['T', '<time>']],
                                                                ['exchange', ['S', '']],
                                                                ['routing-keys',
                                                                 ['A',
                                                                  [['S', 'diff.src3.RUN']]]]]]]]],
                                                           ['x-first-death-exchange', ['S', '']],
                                                           ['x-first-death-queue',
                                                            ['S', 'diff.src3.RUN']],
                                                           ['x-first-death-reason',
                                                            ['S', 'maxlen']]]},
                                     'redelivered': False,
                                     'routing_key': 'diff.src3.RUN'}],
                         'rejected': [{'body': 'b:rej',
                                       'delivery_tag': 2,
                                       'exchange': 'diff.dlx.RUN',
                                       'message_count': 0,
                                       'props': {'headers': [['keep', ['S', 'me']],
                                                             ['x-death',
                                                              ['A',
                                                               [['F',
                                                                 [['count', ['l', 1]],
                                                                  ['reason', ['S', 'rejected']],
                                                                  ['queue', ['S', 'diff.src.RUN']],
                                                                  ['time', ['T', '<time>']],
                                                                  ['exchange', ['S', '']],
                                                                  ['routing-keys',
                                                                   ['A',
                                                                    [['S', 'diff.src.RUN']]]]]]]]],
                                                             ['x-first-death-exchange', ['S', '']],
                                                             ['x-first-death-queue',
                                                              ['S', 'diff.src.RUN']],
                                                             ['x-first-death-reason',
                                                              ['S', 'rejected']]]},
                                       'redelivered': False,
                                       'routing_key': 'diff.src.RUN'}],
                         'second_death': [{'body': 'b:twice',
                                           'delivery_tag': 11,
                                           'exchange': 'diff.dlx.RUN',
                                           'message_count': 0,
                                           'props': {'headers': [['x-death',
                                                                  ['A',
                                                                   [['F',
                                                                     [['count', ['l', 2]],
                                                                      ['exchange', ['S', '']],
                                                                      ['queue',
                                                                       ['S', 'diff.src.RUN']],
                                                                      ['reason', ['S', 'rejected']],
                                                                      ['routing-keys',
                                                                       ['A',
                                                                        [['S', 'diff.src.RUN']]]],
                                                                      ['time',
                                                                       ['T', '<time>']]]]]]],
                                                                 ['x-first-death-exchange',
                                                                  ['S', '']],
                                                                 ['x-first-death-queue',
                                                                  ['S', 'diff.src.RUN']],
                                                                 ['x-first-death-reason',
                                                                  ['S', 'rejected']]]},
                                           'redelivered': False,
                                           'routing_key': 'diff.src.RUN'}],
                         'src3_left': ['b:second']},
 'reserved_and_default_names': {'bad_type': {'connection_close': [503,
                                                                  'COMMAND_INVALID - unknown '
                                                                  "exchange type 'nosuchtype'",
                                                                  40,
                                                                  10]}}}


# Broker-model scenarios, recorded against RabbitMQ 3.10.8. RabbitMQ 4.x also writes the
# x-last-death-* headers on a dead letter (EXPECTED_RABBITMQ_3 keeps the 3.x form).
EXPECTED.update({'ae_per_exchange': {'confirms': {'acked': [1, 2],
                                  'nacked': [],
                                  'returns': [],
                                  'returns_before_confirms': True},
                     'qa': ['b:miss'],
                     'qi': ['b:hit']},
 'default_exchange_passive': {'active': {'channel_close': [403,
                                                           'ACCESS_REFUSED - operation not '
                                                           'permitted on the default exchange',
                                                           40,
                                                           10]},
                              'passive': {'channel_close': [403,
                                                            'ACCESS_REFUSED - operation not '
                                                            'permitted on the default exchange',
                                                            40,
                                                            10]}},
 'exclusive_durable_queue': {'declare': {'ok': 0},
                             'not_exclusive': {'channel_close': [405,
                                                                 'RESOURCE_LOCKED - cannot '
                                                                 'obtain exclusive access to '
                                                                 'locked queue '
                                                                 "'diff.exdur.RUN' in vhost "
                                                                 "'/'. It could be originally "
                                                                 'declared on another '
                                                                 'connection or the exclusive '
                                                                 'property value does not '
                                                                 'match that of the original '
                                                                 'declaration.',
                                                                 50,
                                                                 10]},
                             'passive': {'ok': [1, 0]},
                             'redeclare_durable': {'ok': 0},
                             'redeclare_transient': {'ok': 0}},
 'requeue_respects_max_length': {'drop-head/close': {'dead': [['b:a', ['S', 'maxlen']]],
                                                     'left': [['b:b', False], ['b:c', False]]},
                                 'drop-head/nack': {'dead': [['b:a', ['S', 'maxlen']]],
                                                    'left': [['b:b', False], ['b:c', False]]},
                                 'drop-head/recover': {'dead': [['b:a', ['S', 'maxlen']]],
                                                       'left': [['b:b', False],
                                                                ['b:c', False]]},
                                 'reject-publish-dlx/nack': {'dead': [],
                                                             'left': [['b:a', True],
                                                                      ['b:b', False],
                                                                      ['b:c', False]]},
                                 'reject-publish/nack': {'dead': [],
                                                         'left': [['b:a', True],
                                                                  ['b:b', False],
                                                                  ['b:c', False]]}},
 'sender_selected': {'bcc_table': {'ok': {'channel_close': [406,
                                                            'PRECONDITION_FAILED - invalid '
                                                            'message: '
                                                            '{unacceptable_type_in_header,"BCC",table}',
                                                            60,
                                                            40]}},
                     'cc_int': {'ok': {'channel_close': [406,
                                                         'PRECONDITION_FAILED - invalid '
                                                         'message: '
                                                         '{unacceptable_type_in_header,"CC",signedint}',
                                                         60,
                                                         40]}},
                     'cc_string': {'ok': {'channel_close': [406,
                                                            'PRECONDITION_FAILED - invalid '
                                                            'message: '
                                                            '{unacceptable_type_in_header,"CC",longstr}',
                                                            60,
                                                            40]}},
                     'dead_lettered': [['k1',
                                        ['A', [['S', 'k1'], ['S', 'cc1'], ['S', 'cc2']]],
                                        ['CC',
                                         'x-death',
                                         'x-first-death-exchange',
                                         'x-first-death-queue',
                                         'x-first-death-reason',
                                         'x-last-death-exchange',
                                         'x-last-death-queue',
                                         'x-last-death-reason']]],
                     'default': {'k1': 1, 'k2': 1, 'k3': 1},
                     'direct': {'k1': [['k1', [['CC', ['A', [['S', 'k2']]]]]]],
                                'k2': [['k1', [['CC', ['A', [['S', 'k2']]]]]]],
                                'k3': [['k1', [['CC', ['A', [['S', 'k2']]]]]]]},
                     'fanout': {'k1': [['k1', [['CC', ['A', [['S', 'k2']]]]]]],
                                'k2': [['k1', [['CC', ['A', [['S', 'k2']]]]]]],
                                'k3': [['k1', [['CC', ['A', [['S', 'k2']]]]]]]},
                     'mixed_array': {'k1': 1, 'k2': 1, 'k3': 0},
                     'topic': {'k1': [['k1', [['CC', ['A', [['S', 'k2']]]]]]],
                               'k2': [['k1', [['CC', ['A', [['S', 'k2']]]]]]],
                               'k3': [['k1', [['CC', ['A', [['S', 'k2']]]]]]]}}})
EXPECTED_RABBITMQ_3.update({'sender_selected': {'dead_lettered': [['k1',
                                        ['A', [['S', 'k1'], ['S', 'cc1'], ['S', 'cc2']]],
                                        ['CC',
                                         'x-death',
                                         'x-first-death-exchange',
                                         'x-first-death-queue',
                                         'x-first-death-reason']]]}})

def server_major():
    c = connect()
    try:
        v = c._impl.server_properties.get("version", b"")
        v = v.decode() if isinstance(v, bytes) else str(v)
        product = c._impl.server_properties.get("product", b"")
        product = product.decode() if isinstance(product, bytes) else str(product)
    finally:
        c.close()
    return v.split(".")[0] if product == "RabbitMQ" else None


def expected(name, major=None):
    exp = EXPECTED[name]
    alt = EXPECTED_RABBITMQ_3.get(name) if major == "3" else None
    if alt is not None:
        exp = dict(exp, **alt) if isinstance(exp, dict) and name != "dead_letter_x_death" else alt
    return exp


@pytest.fixture(scope="module")
def major():
    return server_major()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_differential(name, major):
    assert run(name) == expected(name, major)


def main(argv):
    names = [a for a in argv if not a.startswith("-")] or sorted(SCENARIOS)
    out = {}
    for name in names:
        try:
            out[name] = run(name)
        except Exception as e:  # a scenario that breaks is itself an observation
            out[name] = {"scenario_failed": "%s: %s" % (type(e).__name__, e)}
    if "--check" in argv:
        bad, major = 0, server_major()
        for name in names:
            if out[name] != expected(name, major):
                bad += 1
                print("DIFF", name)
                print("  expected:", json.dumps(expected(name, major), sort_keys=True))
                print("  observed:", json.dumps(out[name], sort_keys=True))
        return 1 if bad else 0
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

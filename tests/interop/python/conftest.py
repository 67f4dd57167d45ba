"""Shared fixtures and helpers for the pika interop tests."""
import os
import time
import uuid

import pika
import pytest

AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")

# How long to wait for a message that is expected to arrive.
WAIT = float(os.environ.get("INTEROP_WAIT", "10"))
# How long to watch for messages that must NOT arrive.
QUIET = float(os.environ.get("INTEROP_QUIET", "0.5"))


def params():
    p = pika.URLParameters(AMQP_URL)
    # Local broker: fail fast rather than retrying a broker that does not answer.
    p.socket_timeout = 5
    p.stack_timeout = 10
    p.blocked_connection_timeout = 30
    p.connection_attempts = 1
    return p


def connect():
    return pika.BlockingConnection(params())


def uniq(prefix):
    return "interop.py.%s.%s" % (prefix, uuid.uuid4().hex[:12])


class Resources:
    """Tracks queues/exchanges created by a test so they can be deleted afterwards."""

    def __init__(self):
        self.queues = []
        self.exchanges = []

    def queue(self, prefix):
        name = uniq(prefix)
        self.queues.append(name)
        return name

    def exchange(self, prefix):
        name = uniq(prefix)
        self.exchanges.append(name)
        return name

    def cleanup(self):
        if not self.queues and not self.exchanges:
            return
        try:
            conn = connect()
        except Exception:
            return
        try:
            for q in self.queues:
                try:
                    ch = conn.channel()
                    ch.queue_delete(q)
                    ch.close()
                except Exception:
                    pass
            for x in self.exchanges:
                try:
                    ch = conn.channel()
                    ch.exchange_delete(x)
                    ch.close()
                except Exception:
                    pass
        finally:
            try:
                conn.close()
            except Exception:
                pass


@pytest.fixture
def res():
    r = Resources()
    yield r
    r.cleanup()


@pytest.fixture
def conn():
    c = connect()
    yield c
    if c.is_open:
        try:
            c.close()
        except Exception:
            pass


def pump_until(connection, predicate, timeout=WAIT, step=0.05):
    """Run the connection's I/O loop until predicate() is true or the deadline passes.

    Returns the final value of predicate()."""
    deadline = time.monotonic() + timeout
    while not predicate():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        connection.process_data_events(time_limit=min(step, remaining))
    return predicate()


def pump_for(connection, seconds):
    """Run the connection's I/O loop for a fixed time (used to prove nothing else arrives)."""
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        connection.process_data_events(time_limit=min(0.05, remaining))


def drain_get(channel, queue, limit=1000):
    """basic_get (auto-ack) until the queue is empty; return list of (method, props, body)."""
    out = []
    for _ in range(limit):
        method, props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((method, props, body))
    raise AssertionError("queue %s did not drain within %d messages" % (queue, limit))


def collect(connection, channel, queue, n, timeout=WAIT, quiet=QUIET):
    """Consume (auto-ack) exactly n messages from queue; fail if fewer arrive in time or
    if more arrive during the quiet period afterwards. Returns list of bodies."""
    got = []

    def on_msg(ch, method, props, body):
        got.append(body)

    tag = channel.basic_consume(queue, on_msg, auto_ack=True)
    ok = pump_until(connection, lambda: len(got) >= n, timeout)
    assert ok, "expected %d messages on %s, got %d: %r" % (n, queue, len(got), got)
    if quiet:
        pump_for(connection, quiet)
    for _m, _p, body in channel.basic_cancel(tag) or []:
        got.append(body)
    assert len(got) == n, "expected exactly %d messages on %s, got %r" % (n, queue, got)
    return got


def pytest_sessionstart(session):
    """Fail the whole run quickly (one clear error) if the broker does not complete
    an AMQP handshake, instead of timing out test by test."""
    if session.config.option.collectonly:
        return
    try:
        c = connect()
        c.close()
    except Exception as e:  # pragma: no cover - only on a broken/unreachable broker
        pytest.exit("cannot open an AMQP connection to %s: %r" % (AMQP_URL, e), returncode=1)

"""py-amqp (the client under Kombu and Celery) against the broker: the behaviours it is
strict about."""
import time
import urllib.parse

import amqp
import pytest

from conftest import AMQP_URL, uniq


def connect():
    u = urllib.parse.urlparse(AMQP_URL)
    vhost = urllib.parse.unquote(u.path[1:]) if len(u.path) > 1 else "/"
    c = amqp.Connection(
        host="%s:%d" % (u.hostname, u.port or 5672),
        userid=u.username or "guest",
        password=u.password or "guest",
        virtual_host=vhost,
        connect_timeout=5,
    )
    c.connect()
    return c


@pytest.fixture
def conn():
    c = connect()
    yield c
    try:
        c.close()
    except Exception:
        pass


def test_queue_delete_on_the_consumers_channel_returns_before_the_cancel(conn):
    # RabbitMQ sends queue.delete-ok before the basic.cancel it causes on the same channel;
    # py-amqp raises ConsumerCancelled from queue_delete if the cancel comes first.
    ch = conn.channel()
    q = uniq("pyamqp-delete")
    ch.queue_declare(q, auto_delete=False)
    cancelled = []
    got = []
    tag = ch.basic_consume(q, callback=got.append, on_cancel=cancelled.append)
    ch.basic_publish(amqp.Message(b"one"), routing_key=q)
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=0.2)
        except TimeoutError:
            pass
    assert [m.body for m in got] == [b"one"]
    ch.basic_ack(got[0].delivery_tag)
    assert ch.queue_delete(q) == 0
    # The notification follows and reaches the consumer's on_cancel callback.
    deadline = time.monotonic() + 10
    while not cancelled and time.monotonic() < deadline:
        try:
            conn.drain_events(timeout=0.2)
        except TimeoutError:
            pass
    assert cancelled == [tag]
    ch.close()


def test_queue_delete_without_on_cancel_does_not_raise(conn):
    # The Kombu pattern: consume, ack, then delete the queue on the same channel.
    ch = conn.channel()
    q = uniq("pyamqp-delete2")
    ch.queue_declare(q, auto_delete=False)
    ch.basic_consume(q, callback=lambda m: None)
    assert ch.queue_delete(q) == 0
    with pytest.raises(amqp.exceptions.ConsumerCancelled):
        conn.drain_events(timeout=5)

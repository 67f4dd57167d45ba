"""Message properties are opaque bytes, as in RabbitMQ: a raw 16-byte UUID as correlation-id
(what Go and .NET programs send) is stored and delivered unchanged, and does not close the
connection."""
import uuid

import pika

from conftest import drain_get


def test_binary_correlation_and_message_ids_round_trip(conn, res):
    ch = conn.channel()
    q = res.queue("binary-props")
    ch.queue_declare(q)
    raw = uuid.UUID("00ff1080-c328-a0a1-e228-a1f0288cbc01").bytes
    assert raw.decode("utf-8", "replace") != raw.decode("latin-1")  # not UTF-8
    props = pika.BasicProperties(correlation_id=raw, message_id=raw, content_type="text/plain")
    ch.basic_publish("", q, b"body", props)
    ch.basic_publish("", q, b"second", pika.BasicProperties(correlation_id="plain"))
    got = drain_get(ch, q)
    assert [b for _m, _p, b in got] == [b"body", b"second"]
    p = got[0][1]
    # pika hands back undecodable short strings as bytes.
    assert p.correlation_id == raw
    assert p.message_id == raw
    assert p.content_type == "text/plain"
    assert got[1][1].correlation_id == "plain"
    assert conn.is_open and ch.is_open

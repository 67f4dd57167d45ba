#!/usr/bin/env python3
"""Durable queue.declare throughput over raw AMQP 0-9-1 (standard library only).

    bench/durable_declares.py HOST PORT N CONNECTIONS TAG

CONNECTIONS connections each pipeline N/CONNECTIONS durable declares of queues named
TAG-c<i>-<n> on one channel (written in chunks of 500, at most 2,000 unanswered, replies read
as they come), as guest/guest on vhost /. A probe connection meanwhile makes queue.declare
round trips on a transient queue every 10 ms and reports its worst round trip: whether the
declaring load stalls other clients. Use a fresh data directory per run (the queues stay)."""
import socket, struct, sys, time, threading

def shortstr(s):
    b = s.encode()
    return struct.pack('B', len(b)) + b

def longstr(b):
    return struct.pack('>I', len(b)) + b

def frame(ftype, ch, payload):
    return struct.pack('>BHI', ftype, ch, len(payload)) + payload + b'\xce'

def method(ch, cls, mid, args):
    return frame(1, ch, struct.pack('>HH', cls, mid) + args)

class Conn:
    def __init__(self, host, port):
        self.s = socket.create_connection((host, port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b''
        self.s.sendall(b'AMQP\x00\x00\x09\x01')
        self.read_method()  # start
        resp = b'\x00guest\x00guest'
        self.s.sendall(method(0, 10, 11, struct.pack('>I', 0) + shortstr('PLAIN') + longstr(resp) + shortstr('en_US')))
        cls, mid, payload = self.read_method()  # tune
        channel_max, frame_max, hb = struct.unpack('>HIH', payload[:8])
        self.s.sendall(method(0, 10, 31, struct.pack('>HIH', channel_max, frame_max, 0)))
        self.s.sendall(method(0, 10, 40, shortstr('/') + shortstr('') + b'\x00'))
        self.read_method()  # open-ok
        self.s.sendall(method(1, 20, 10, shortstr('')))
        self.read_method()  # channel.open-ok

    def read_frame(self):
        while True:
            if len(self.buf) >= 7:
                t, ch, size = struct.unpack('>BHI', self.buf[:7])
                if len(self.buf) >= 8 + size:
                    payload = self.buf[7:7 + size]
                    self.buf = self.buf[8 + size:]
                    return t, ch, payload
            d = self.s.recv(1 << 20)
            if not d:
                raise EOFError
            self.buf += d

    def read_method(self):
        while True:
            t, ch, p = self.read_frame()
            if t == 1:
                cls, mid = struct.unpack('>HH', p[:4])
                if (cls, mid) in ((10, 50), (20, 40)):
                    raise RuntimeError('closed: %r' % p)
                return cls, mid, p[4:]

def declare(name, durable):
    bits = 2 if durable else 0
    return method(1, 50, 10, struct.pack('>H', 0) + shortstr(name) + struct.pack('B', bits) + struct.pack('>I', 0))

def worker(host, port, prefix, n, out, idx):
    c = Conn(host, port)
    chunk = 500
    sent = 0
    got = 0
    t0 = time.time()
    while got < n:
        while sent < n and sent - got < 4 * chunk:
            m = min(chunk, n - sent)
            c.s.sendall(b''.join(declare('%s-%d' % (prefix, sent + i), True) for i in range(m)))
            sent += m
        cls, mid, _ = c.read_method()
        assert (cls, mid) == (50, 11), (cls, mid)
        got += 1
    out[idx] = time.time() - t0
    c.s.close()

def main():
    host, port = sys.argv[1], int(sys.argv[2])
    n, conns, tag = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    stop = threading.Event()
    worst = [0.0]
    def probe():
        c = Conn(host, port)
        while not stop.is_set():
            t = time.time()
            c.s.sendall(declare('probe-%s' % tag, False))
            c.read_method()
            worst[0] = max(worst[0], time.time() - t)
            time.sleep(0.01)
        c.s.close()
    p = threading.Thread(target=probe)
    p.start()
    time.sleep(0.2)
    out = [0.0] * conns
    ts = [threading.Thread(target=worker, args=(host, port, '%s-c%d' % (tag, i), n // conns, out, i)) for i in range(conns)]
    t0 = time.time()
    for t in ts: t.start()
    for t in ts: t.join()
    total = time.time() - t0
    stop.set(); p.join()
    print('%d durable declares on %d connection(s): %.2f s (%.0f/s); probe worst round trip %.1f ms'
          % (n, conns, total, n / total, worst[0] * 1000))

main()

#!/usr/bin/env python3
"""Clients, fault schedule and checks of bench/cluster-chaos.sh (run it through that script).

    bench/cluster_chaos.py WORKDIR RESULTS_FILE

WORKDIR is the directory the wrapper prepared: `nodes` (lines "ID AMQP MGMT HTTPMQ CLUSTER"),
`nodeN.pid` (the current process of node N, rewritten here on a restart), `start-node.sh N`
(runs node N in the foreground) and the node logs. Settings come from the environment (see
the wrapper). Needs pika.

Publishers (one per queue) publish with confirms, a window of WINDOW unconfirmed messages,
through the default exchange; a message counts as confirmed only once its basic.ack came.
On a lost connection, a channel error, a nack or a confirm that takes longer than
CONFIRM_TIMEOUT they move to the next node that is not down. Consumers (CONSUMERS per queue
on every node) ack manually and record every delivery's id and redelivered flag. The fault
loop kills a node with SIGKILL and restarts it after 1-5 s, or pauses it with SIGSTOP for
2-6 s, one node at a time, at exponentially distributed gaps of mean FAULT_EVERY seconds,
drawn from random.Random(SEED) (the schedule of faults repeats with the seed; the clients'
timing does not). Then: the faults stop, the publishers finish, every node runs again, the
cluster settles, the consumers drain until quiet, they are closed and every node is drained
again with basic.get; then the records are checked.
"""
import base64
import collections
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pika

WORKDIR, RESULTS = sys.argv[1], sys.argv[2]
DURATION = float(os.environ.get("DURATION", "60"))
QUEUES = int(os.environ.get("QUEUES", "2"))
SEED = int(os.environ.get("SEED", "1"))
FAULT_EVERY = float(os.environ.get("FAULT_EVERY", "5"))
RATE = float(os.environ.get("RATE", "500"))
WINDOW = int(os.environ.get("WINDOW", "100"))
CONSUMERS = int(os.environ.get("CONSUMERS", "1"))
SETTLE = float(os.environ.get("SETTLE", "10"))
CONFIRM_TIMEOUT = float(os.environ.get("CONFIRM_TIMEOUT", "8"))
PREFETCH = int(os.environ.get("PREFETCH", "50"))
QUIET = float(os.environ.get("QUIET", "10"))
DRAIN_MAX = float(os.environ.get("DRAIN_MAX", "120"))
GROUP_SIZE = int(os.environ.get("GROUP_SIZE", "0"))

T0 = time.time()
NODES = {}
with open(os.path.join(WORKDIR, "nodes")) as f:
    for line in f:
        i, amqp, mgmt, httpmq, cport = map(int, line.split())
        NODES[i] = {"amqp": amqp, "mgmt": mgmt}
IDS = sorted(NODES)
QNAMES = [f"chaos-{k + 1}" for k in range(QUEUES)]

logging.basicConfig(
    filename=os.path.join(WORKDIR, "pika.log"),
    level=logging.WARNING,
    format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s",
)

_log_lock = threading.Lock()
_fault_log = open(os.path.join(WORKDIR, "faults.log"), "a")


def stamp():
    t = time.time()
    return time.strftime("%H:%M:%S", time.gmtime(t)) + ".%03d" % int((t % 1) * 1000)


def log(msg, fault=False):
    line = f"[cluster-chaos {stamp()} +{time.time() - T0:7.1f}s] {msg}"
    with _log_lock:
        print(line, file=sys.stderr, flush=True)
        if fault:
            _fault_log.write(line + "\n")
            _fault_log.flush()


def params(node):
    return pika.ConnectionParameters(
        host="127.0.0.1",
        port=NODES[node]["amqp"],
        credentials=pika.PlainCredentials("guest", "guest"),
        heartbeat=5,
        socket_timeout=3,
        stack_timeout=6,
        blocked_connection_timeout=10,
        connection_attempts=1,
    )


def mgmt_get(node, path, timeout=3):
    req = urllib.request.Request(f"http://127.0.0.1:{NODES[node]['mgmt']}{path}")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def port_open(node, timeout=1.0):
    try:
        with socket.create_connection(("127.0.0.1", NODES[node]["amqp"]), timeout=timeout):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# Nodes

class Cluster:
    def __init__(self):
        self.down = set()  # nodes killed or paused right now (clients avoid them)
        self.children = {}  # node -> Popen of a restart made here
        self.crashes = []  # (time, node, detail): a node that exited without being killed

    def pid(self, node):
        with open(os.path.join(WORKDIR, f"node{node}.pid")) as f:
            return int(f.read())

    def state(self, node):
        """'R'/'S'/... as in /proc, 'T' when stopped, None when gone (or a zombie)."""
        pid = self.pid(node)
        child = self.children.get(node)
        if child is not None and child.pid == pid:
            child.poll()
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return None
        return None if st in ("Z", "X") else st

    def kill9(self, node):
        pid = self.pid(node)
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 10
        while self.state(node) is not None and time.time() < deadline:
            time.sleep(0.02)

    def start(self, node):
        p = subprocess.Popen([os.path.join(WORKDIR, "start-node.sh"), str(node)])
        self.children[node] = p
        tmp = os.path.join(WORKDIR, f"node{node}.pid.tmp")
        with open(tmp, "w") as f:
            f.write(str(p.pid))
        os.replace(tmp, os.path.join(WORKDIR, f"node{node}.pid"))

    def wait_up(self, node, limit=60):
        t = time.time()
        while time.time() - t < limit:
            if port_open(node):
                return time.time() - t
            if self.state(node) is None:
                return None
            time.sleep(0.1)
        return None

    def check_crashes(self):
        """Restarts a node that is not down on purpose and has exited."""
        for n in IDS:
            if n in self.down:
                continue
            if self.state(n) is None:
                tail = ""
                try:
                    with open(os.path.join(WORKDIR, f"node{n}.log")) as f:
                        tail = "".join(f.readlines()[-5:])
                except OSError:
                    pass
                self.crashes.append((time.time() - T0, n, tail))
                log(f"NODE {n} EXITED WITHOUT BEING KILLED; restarting it. Log tail:\n{tail}", True)
                self.down.add(n)
                self.start(n)
                self.wait_up(n)
                self.down.discard(n)


cluster = Cluster()
faults = []  # dicts: t, node, kind, hold, back (seconds until the port answered again)


def fault_loop(stop):
    rnd = random.Random(SEED)
    while True:
        gap = rnd.expovariate(1.0 / FAULT_EVERY)
        node = rnd.choice(IDS)
        kind = rnd.choice(("kill", "stop"))
        hold = rnd.uniform(1, 5) if kind == "kill" else rnd.uniform(2, 6)
        if stop.wait(gap):
            return
        cluster.check_crashes()
        t = time.time() - T0
        if kind == "kill":
            log(f"fault: kill -9 node {node} (pid {cluster.pid(node)}), restart in {hold:.1f}s", True)
            cluster.down.add(node)
            cluster.kill9(node)
            time.sleep(hold)
            cluster.start(node)
            back = cluster.wait_up(node)
            cluster.down.discard(node)
            if back is None:
                log(f"node {node} did not come back after its restart", True)
            else:
                log(f"node {node} restarted (pid {cluster.pid(node)}), AMQP port open after {back:.1f}s", True)
        else:
            log(f"fault: SIGSTOP node {node} (pid {cluster.pid(node)}) for {hold:.1f}s", True)
            cluster.down.add(node)
            os.kill(cluster.pid(node), signal.SIGSTOP)
            time.sleep(hold)
            os.kill(cluster.pid(node), signal.SIGCONT)
            cluster.down.discard(node)
            back = 0.0
            log(f"node {node} resumed (SIGCONT)", True)
        faults.append({"t": t, "node": node, "kind": kind, "hold": hold, "back": back})


# ---------------------------------------------------------------------------------------------
# Clients

stop_pub = threading.Event()
stop_cons = threading.Event()
deliveries = []  # (id, redelivered, node, time, phase)
last_delivery = [time.time()]
phase = ["run"]


def record(body, redelivered, node):
    deliveries.append((body.decode(errors="replace"), bool(redelivered), node, time.time() - T0, phase[0]))
    last_delivery[0] = time.time()


def next_live(after):
    """The next node after `after` (cyclically) that is not down; `after`'s successor when all are."""
    order = IDS[IDS.index(after) + 1:] + IDS[: IDS.index(after) + 1]
    for n in order:
        if n not in cluster.down:
            return n
    return order[0]


class Publisher(threading.Thread):
    def __init__(self, q, k):
        super().__init__(name=f"pub-{q}", daemon=True)
        self.q = q
        self.node = IDS[k % len(IDS)]
        self.seq = 0
        self.sent = 0
        self.confirmed = set()
        self.nacked = set()
        self.unknown = set()  # outstanding when a connection was lost or given up
        self.sessions = 0
        self.timeouts = 0
        self.stray_confirms = 0
        self.closes = collections.Counter()

    def run(self):
        while True:
            if self.node in cluster.down:
                self.node = next_live(self.node)
            self.session(self.node)
            if stop_pub.is_set():
                return
            self.node = next_live(self.node)
            time.sleep(0.2)

    def session(self, node):
        self.sessions += 1
        self.ch = None
        self.outstanding = collections.OrderedDict()  # delivery tag -> id
        self.sent_at = {}
        self.tag = 0
        self.tokens = 0.0
        self.last_tick = time.time()
        self.stop_deadline = None
        self.why = "?"
        self.cur = node
        self.session_nacks = 0
        try:
            self.conn = pika.SelectConnection(
                params(node),
                on_open_callback=self.on_open,
                on_open_error_callback=self.on_open_error,
                on_close_callback=self.on_closed,
            )
            self.conn.ioloop.start()
        except Exception as e:  # noqa: BLE001 - any failure means: next node
            self.why = f"exception {type(e).__name__}"
        lost = list(self.outstanding.values())
        self.unknown.update(lost)
        self.closes[self.why] += 1
        if not stop_pub.is_set() or lost:
            log(f"publisher {self.q}: session on node {node} ended ({self.why}); "
                f"{self.session_nacks} nacked, {len(lost)} unconfirmed")
        if self.why == "nack":
            time.sleep(0.5)

    def close(self, why):
        self.why = why
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - already closing
            try:
                self.conn.ioloop.stop()
            except Exception:  # noqa: BLE001
                pass

    def on_open_error(self, conn, err):
        self.why = f"open failed: {type(err).__name__}"
        conn.ioloop.stop()

    def on_closed(self, conn, reason):
        if self.why == "?":
            self.why = f"closed: {reason!r}"[:120]
        conn.ioloop.stop()

    def on_open(self, conn):
        conn.channel(on_open_callback=self.on_channel)

    def on_channel(self, ch):
        self.ch = ch
        ch.add_on_close_callback(self.on_channel_closed)
        ch.confirm_delivery(ack_nack_callback=self.on_confirm, callback=self.on_select_ok)

    def on_channel_closed(self, ch, reason):
        if self.why == "?":
            self.why = f"channel closed: {reason!r}"[:120]
        if self.conn.is_open:
            self.close(self.why)

    def on_select_ok(self, _frame):
        self.last_tick = time.time()
        self.tick()

    def on_confirm(self, frame):
        m = frame.method
        ack = isinstance(m, pika.spec.Basic.Ack)
        if m.multiple:
            tags = []
            for t in self.outstanding:
                if t > m.delivery_tag:
                    break
                tags.append(t)
        else:
            tags = [m.delivery_tag] if m.delivery_tag in self.outstanding else []
        if not tags:
            self.stray_confirms += 1
        for t in tags:
            mid = self.outstanding.pop(t)
            self.sent_at.pop(t, None)
            (self.confirmed if ack else self.nacked).add(mid)
        if not ack:
            self.session_nacks += len(tags)
            if self.why == "?":
                self.close("nack")

    def tick(self):
        if not self.conn.is_open or self.ch is None or not self.ch.is_open:
            return
        now = time.time()
        if self.outstanding:
            oldest = self.sent_at[next(iter(self.outstanding))]
            if now - oldest > CONFIRM_TIMEOUT:
                self.timeouts += 1
                self.close(f"no confirm within {CONFIRM_TIMEOUT:.0f}s")
                return
        if stop_pub.is_set():
            if self.stop_deadline is None:
                self.stop_deadline = now + 15
            if not self.outstanding or now > self.stop_deadline:
                self.close("done")
                return
        else:
            if RATE > 0:
                self.tokens = min(self.tokens + RATE * (now - self.last_tick), float(WINDOW))
            else:
                self.tokens = float(WINDOW)
            self.last_tick = now
            try:
                while self.tokens >= 1 and len(self.outstanding) < WINDOW:
                    self.seq += 1
                    mid = f"{self.q}.{self.seq:09d}"
                    self.ch.basic_publish(
                        "", self.q, mid.encode(),
                        pika.BasicProperties(delivery_mode=2, message_id=mid),
                    )
                    self.tag += 1
                    self.outstanding[self.tag] = mid
                    self.sent_at[self.tag] = now
                    self.sent += 1
                    self.tokens -= 1
            except Exception as e:  # noqa: BLE001
                self.close(f"publish failed: {type(e).__name__}")
                return
        self.conn.ioloop.call_later(0.01, self.tick)


class Consumer(threading.Thread):
    def __init__(self, q, node, k):
        super().__init__(name=f"cons-{q}-n{node}-{k}", daemon=True)
        self.q = q
        self.node = node
        self.count = 0
        self.failures = collections.Counter()

    def run(self):
        while not stop_cons.is_set():
            if self.node in cluster.down:
                time.sleep(0.2)
                continue
            conn = None
            try:
                conn = pika.BlockingConnection(params(self.node))
                ch = conn.channel()
                ch.basic_qos(prefetch_count=PREFETCH)
                ch.basic_consume(self.q, self.on_message, auto_ack=False)
                while not stop_cons.is_set():
                    conn.process_data_events(time_limit=0.5)
                conn.close()
                return
            except Exception as e:  # noqa: BLE001 - reconnect on anything
                self.failures[type(e).__name__] += 1
                try:
                    if conn is not None and conn.is_open:
                        conn.close()
                except Exception:  # noqa: BLE001
                    pass
                time.sleep(0.5)

    def on_message(self, ch, method, _props, body):
        record(body, method.redelivered, self.node)
        self.count += 1
        ch.basic_ack(method.delivery_tag)


def drain_with_get():
    """basic.get with acks on every node until a whole pass finds nothing."""
    got = 0
    for _ in range(5):
        this_pass = 0
        for n in IDS:
            for q in QNAMES:
                try:
                    conn = pika.BlockingConnection(params(n))
                    ch = conn.channel()
                    while True:
                        method, _props, body = ch.basic_get(q, auto_ack=False)
                        if method is None:
                            break
                        record(body, method.redelivered, n)
                        ch.basic_ack(method.delivery_tag)
                        this_pass += 1
                    conn.close()
                except Exception as e:  # noqa: BLE001
                    log(f"basic.get drain of {q} on node {n} failed: {e!r}")
        got += this_pass
        if this_pass == 0:
            break
        time.sleep(1)
    return got


def queue_stats():
    out = {}
    for n in IDS:
        for q in QNAMES:
            try:
                _, body = mgmt_get(n, f"/api/queues/%2F/{q}")
                j = json.loads(body)
                out[(n, q)] = {k: j.get(k) for k in ("messages", "messages_ready", "messages_unacknowledged", "consumers")}
            except Exception as e:  # noqa: BLE001
                out[(n, q)] = {"error": repr(e)}
    return out


# ---------------------------------------------------------------------------------------------
# Run

def declare():
    conn = pika.BlockingConnection(params(IDS[0]))
    ch = conn.channel()
    args = {"x-queue-type": "quorum"}
    if GROUP_SIZE > 0:
        args["x-quorum-initial-group-size"] = GROUP_SIZE
    for q in QNAMES:
        ch.queue_declare(q, durable=True, arguments=args)
    conn.close()
    deadline = time.time() + 30
    for n in IDS:
        for q in QNAMES:
            while True:
                try:
                    if mgmt_get(n, f"/api/queues/%2F/{q}")[0] == 200:
                        break
                except Exception:  # noqa: BLE001 - 404 or not up yet
                    pass
                if time.time() > deadline:
                    log(f"node {n} never got queue {q}")
                    sys.exit(2)
                time.sleep(0.2)
    members = f"{GROUP_SIZE} members each" if GROUP_SIZE > 0 else "a member on every node"
    log(f"declared {', '.join(QNAMES)} on node {IDS[0]} ({members}); every node has them")


def leadership_lines():
    """Per node: the lines in which it took or lost the leadership of a queue, and error lines."""
    leads, errors, network = {}, {}, collections.Counter()
    for n in IDS:
        leads[n], errors[n] = [], []
        try:
            with open(os.path.join(WORKDIR, f"node{n}.log"), errors="replace") as f:
                for line in f:
                    if "leads the quorum queue" in line:
                        leads[n].append(line.rstrip())
                    # openraft logs every RPC to an unreachable node at ERROR: expected while
                    # a node is down, counted apart.
                    if ("did not answer in time" in line or "NetworkError" in line
                            or "Unreachable" in line):
                        network[n] += 1
                    elif " ERROR " in line or "panicked" in line:
                        errors[n].append(line.rstrip())
        except OSError:
            pass
    return leads, errors, network


def main():
    # The cluster transport needs a moment after the ports open; a node it cannot reach at the
    # declare gets no member.
    time.sleep(2)
    declare()
    publishers = [Publisher(q, k) for k, q in enumerate(QNAMES)]
    consumers = [Consumer(q, n, k) for q in QNAMES for n in IDS for k in range(CONSUMERS)]
    for c in consumers:
        c.start()
    t_pub = time.time()
    for p in publishers:
        p.start()
    stop_faults = threading.Event()
    fl = threading.Thread(target=fault_loop, args=(stop_faults,), name="faults", daemon=True)
    fl.start()
    log(f"running {DURATION:.0f}s: {len(publishers)} publishers, {len(consumers)} consumers, "
        f"seed {SEED}, a fault every {FAULT_EVERY}s on average")
    end = t_pub + DURATION
    while time.time() < end:
        time.sleep(min(10, max(0.1, end - time.time())))
        if time.time() < end:
            conf = sum(len(p.confirmed) for p in publishers)
            log(f"progress: {conf} confirmed, {len(deliveries)} deliveries, {len(faults)} faults")
    stop_faults.set()
    fl.join()
    stop_pub.set()
    for p in publishers:
        p.join(60)
    pub_secs = time.time() - t_pub
    log("faults stopped, publishers finished")

    # Every node runs again.
    for n in IDS:
        st = cluster.state(n)
        if st == "T":
            os.kill(cluster.pid(n), signal.SIGCONT)
    cluster.check_crashes()
    for n in IDS:
        if cluster.wait_up(n) is None:
            log(f"node {n} is not up at the end")
    log(f"all nodes up; settling {SETTLE:.0f}s")
    time.sleep(SETTLE)

    confirmed = set().union(*(p.confirmed for p in publishers))
    phase[0] = "drain"
    t_drain = time.time()
    last_delivery[0] = max(last_delivery[0], time.time())
    while time.time() - t_drain < DRAIN_MAX:
        seen = {d[0] for d in deliveries}
        quiet = time.time() - last_delivery[0]
        if confirmed <= seen and quiet > 3:
            break
        if quiet > QUIET:
            break
        time.sleep(0.5)
    stop_cons.set()
    for c in consumers:
        c.join(30)
    phase[0] = "get"
    got = drain_with_get()
    log(f"drained: consumers quiet after {time.time() - t_drain:.0f}s, basic.get found {got} more")
    stats = queue_stats()

    # Checks.
    by_id = collections.defaultdict(list)
    for mid, red, node, t, ph in deliveries:
        by_id[mid].append((red, node, t, ph))
    published = {f"{p.q}.{s:09d}" for p in publishers for s in range(1, p.seq + 1)}
    consumed = set(by_id)
    dup_msgs = {m for m, ds in by_id.items() if len(ds) > 1}
    duplicates = sum(len(ds) - 1 for ds in by_id.values())
    dup_no_red = {m for m, ds in by_id.items() if sum(1 for d in ds if not d[0]) > 1}
    lost = sorted(confirmed - consumed)
    stray = sorted(consumed - published)
    unconfirmed_present = consumed - confirmed
    nacked = set().union(*(p.nacked for p in publishers))
    unknown = set().union(*(p.unknown for p in publishers)) - confirmed - nacked
    sent = sum(p.sent for p in publishers)
    kinds = collections.Counter(f["kind"] for f in faults)
    leads, errors, network = leadership_lines()
    ok = not lost and not dup_no_red and not stray
    # Unavailability as the consumers saw it: gaps of more than a second between deliveries
    # of a queue while publishing went on.
    gaps = {}
    for q in QNAMES:
        ts = sorted(t for mid, _r, _n, t, ph in deliveries if ph == "run" and mid.startswith(q + "."))
        g = [b - a for a, b in zip(ts, ts[1:]) if b - a > 1.0]
        gaps[q] = (len(g), sum(g), max(g, default=0.0))

    with open(os.path.join(WORKDIR, "deliveries.tsv"), "w") as f:
        for mid, red, node, t, ph in deliveries:
            f.write(f"{mid}\t{int(red)}\t{node}\t{t:.3f}\t{ph}\n")
    with open(os.path.join(WORKDIR, "confirmed.txt"), "w") as f:
        f.write("\n".join(sorted(confirmed)) + "\n")
    with open(os.path.join(WORKDIR, "nacked.txt"), "w") as f:
        f.write("\n".join(sorted(nacked)) + "\n")

    rate = len(confirmed) / pub_secs if pub_secs else 0
    summary = (
        f"cluster-chaos {'OK' if ok else 'FAILED'}: {DURATION:.0f}s seed={SEED} queues={QUEUES} "
        f"confirmed={len(confirmed)} consumed_distinct={len(consumed)} duplicates={duplicates} "
        f"dup_without_redelivered={len(dup_no_red)} lost={len(lost)} "
        f"unconfirmed_present={len(unconfirmed_present)} faults: kill={kinds['kill']} "
        f"stop={kinds['stop']} crash={len(cluster.crashes)} confirmed_rate={rate:.0f}/s"
    )

    lines = [
        f"# cluster-chaos {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(T0))}",
        "",
        f"Result: **{'OK' if ok else 'FAILED'}**",
        "",
        "| setting | value |", "|---|---|",
        f"| DURATION | {DURATION:.0f} s |", f"| QUEUES | {QUEUES} |", f"| SEED | {SEED} |",
        f"| FAULT_EVERY | {FAULT_EVERY} s |", f"| RATE | {RATE:.0f}/s per publisher |",
        f"| WINDOW | {WINDOW} |", f"| CONSUMERS | {CONSUMERS} per queue per node |",
        f"| GROUP_SIZE | {GROUP_SIZE or 'every node'} |",
        "",
        "| figure | value |", "|---|---|",
        f"| published (sent) | {sent} |",
        f"| confirmed (basic.ack) | {len(confirmed)} |",
        f"| nacked | {len(nacked)} |",
        f"| unconfirmed (connection lost or confirm timed out) | {len(unknown)} |",
        f"| consumed, distinct | {len(consumed)} |",
        f"| deliveries | {len(deliveries)} |",
        f"| duplicates (deliveries beyond the first) | {duplicates} ({len(dup_msgs)} messages) |",
        f"| duplicates without redelivered (must be 0) | {len(dup_no_red)} |",
        f"| lost: confirmed, never consumed (must be 0) | {len(lost)} |",
        f"| consumed but never published (must be 0) | {len(stray)} |",
        f"| unconfirmed but present | {len(unconfirmed_present)} |",
        f"| of which nacked | {len(unconfirmed_present & nacked)} |",
        f"| found by basic.get after the consumers closed | {got} |",
        "| delivery gaps over 1 s (count, total, longest) | "
        + "; ".join(f"{q}: {c}, {tot:.1f} s, {mx:.1f} s" for q, (c, tot, mx) in gaps.items()) + " |",
        f"| faults | {len(faults)}: kill -9 {kinds['kill']}, SIGSTOP {kinds['stop']} |",
        f"| nodes that exited without a kill | {len(cluster.crashes)} |",
        f"| publishing time | {pub_secs:.0f} s |",
        f"| confirmed rate | {rate:.0f} msg/s |",
        f"| publisher sessions (reconnects + 1) | {sum(p.sessions for p in publishers)} |",
        f"| confirm timeouts | {sum(p.timeouts for p in publishers)} |",
        f"| confirms for unknown delivery tags | {sum(p.stray_confirms for p in publishers)} |",
        "| leadership taken (log lines, per node) | "
        + ", ".join(f"{n}: {sum(1 for l in leads[n] if 'this node leads' in l)}" for n in IDS) + " |",
        "| ERROR / panic log lines, network errors apart (per node) | "
        + ", ".join(f"{n}: {len(errors[n])}" for n in IDS) + " |",
        "| raft network-error log lines (per node) | "
        + ", ".join(f"{n}: {network[n]}" for n in IDS) + " |",
        "",
        "Deliveries per consumer node: " + ", ".join(
            f"node {n}: {sum(1 for d in deliveries if d[2] == n)}" for n in IDS),
        "",
        "Queues after the drain (management API of each node):",
        "",
    ]
    for (n, q), s in sorted(stats.items()):
        lines.append(f"- node {n} {q}: {s}")
    lines += ["", "Publisher sessions ended by:", ""]
    for p in publishers:
        lines.append(f"- {p.q}: " + ", ".join(f"{why} x{c}" for why, c in p.closes.most_common()))
    lines += ["", "Faults (seconds since start, node, kind, held for, back after):", "", "```"]
    for f in faults:
        lines.append(f"{f['t']:7.1f}  node {f['node']}  {f['kind']:4}  {f['hold']:.1f}s  "
                     + (f"{f['back']:.1f}s" if f["back"] is not None else "not back"))
    lines.append("```")
    if cluster.crashes:
        lines += ["", "Nodes that exited without a kill:", "", "```"]
        for t, n, tail in cluster.crashes:
            lines.append(f"+{t:.1f}s node {n}:\n{tail}")
        lines.append("```")
    if lost:
        lines += ["", f"Lost (first 50 of {len(lost)}):", "", "```", *lost[:50], "```"]
    if dup_no_red:
        lines += ["", f"Duplicates without redelivered (first 20 of {len(dup_no_red)}):", "", "```"]
        for m in sorted(dup_no_red)[:20]:
            lines.append(f"{m}: {by_id[m]}")
        lines.append("```")
    if stray:
        lines += ["", f"Consumed, never published (first 20): {stray[:20]}"]
    if any(errors.values()):
        lines += ["", "ERROR / panic lines of the node logs (first 10 per node):", "", "```"]
        for n in IDS:
            lines += [f"node {n}: {l}" for l in errors[n][:10]]
        lines.append("```")
    lines += ["", summary, ""]
    with open(RESULTS, "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(WORKDIR, "summary.md"), "w") as f:
        f.write("\n".join(lines))
    if lost:
        log(f"LOST {len(lost)} confirmed messages, e.g. {lost[:5]}")
    if dup_no_red:
        log(f"{len(dup_no_red)} duplicates without redelivered, e.g. {sorted(dup_no_red)[:5]}")
    log(f"results: {RESULTS}")
    print(summary, flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

'use strict';
// Interop tests using amqplib's promise API: the six RabbitMQ tutorial patterns
// plus confirm channels and channel errors.
// Target broker: AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2F).

const { test } = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const amqp = require('amqplib');

const URL = process.env.AMQP_URL || 'amqp://guest:guest@127.0.0.1:5672/%2F';
const WAIT = Number(process.env.INTEROP_WAIT || 10) * 1000; // expected message arrival
const QUIET = Number(process.env.INTEROP_QUIET || 0.5) * 1000; // window for "no more messages"
const TEST_TIMEOUT = 30000;

// Hard cap for the whole file: a wedged socket must not keep the runner alive forever.
setTimeout(() => {
  console.error('interop: node suite exceeded its 5 minute cap; exiting');
  process.exit(1);
}, 5 * 60 * 1000).unref();

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const uniq = (prefix) => `interop.js.${prefix}.${crypto.randomBytes(6).toString('hex')}`;

function withTimeout(promise, ms, what) {
  let timer;
  const t = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([promise, t]).finally(() => clearTimeout(timer));
}

async function connect() {
  const conn = await withTimeout(amqp.connect(URL, { timeout: 10000 }), 15000, 'connect');
  conn.on('error', () => {}); // surfaced through the failing operation instead
  return conn;
}

// Per-test context: opens connections, tracks queues/exchanges, cleans up afterwards.
async function ctx(t) {
  const conns = [];
  const queues = [];
  const exchanges = [];
  const c = {
    async conn() {
      const conn = await connect();
      conns.push(conn);
      return conn;
    },
    queue(p) {
      const q = uniq(p);
      queues.push(q);
      return q;
    },
    exchange(p) {
      const x = uniq(p);
      exchanges.push(x);
      return x;
    },
  };
  t.after(async () => {
    for (const conn of conns) {
      await withTimeout(conn.close(), 5000, 'close').catch(() => {
        // The broker did not finish the close handshake: drop the socket.
        try { conn.connection.stream.destroy(); } catch (_) { /* ignore */ }
      });
    }
    if (!queues.length && !exchanges.length) return;
    let conn;
    try {
      conn = await connect();
      const ch = await conn.createChannel();
      ch.on('error', () => {});
      for (const q of queues) await withTimeout(ch.deleteQueue(q), 5000, 'deleteQueue').catch(() => {});
      for (const x of exchanges) await withTimeout(ch.deleteExchange(x), 5000, 'deleteExchange').catch(() => {});
    } catch (_) {
      // best effort
    } finally {
      if (conn) await withTimeout(conn.close(), 5000, 'close').catch(() => {});
    }
  });
  return c;
}

// Wait until predicate() is true, polling; throws on timeout.
async function until(predicate, what, ms = WAIT) {
  const deadline = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(10);
  }
}

// Consume exactly n messages (noAck); fail if fewer arrive in time or more arrive afterwards.
async function collect(ch, queue, n) {
  const got = [];
  const { consumerTag } = await withTimeout(
    ch.consume(queue, (msg) => { if (msg) got.push(msg); }, { noAck: true }),
    WAIT, 'consume');
  await until(() => got.length >= n, `${n} messages on ${queue} (got ${got.length})`);
  await sleep(QUIET);
  await withTimeout(ch.cancel(consumerTag), WAIT, 'cancel');
  assert.equal(got.length, n, `exactly ${n} messages on ${queue}`);
  return got;
}

// basic.get (noAck) until empty.
async function drain(ch, queue) {
  const out = [];
  for (let i = 0; i < 1000; i++) {
    const m = await withTimeout(ch.get(queue, { noAck: true }), WAIT, 'get');
    if (m === false) return out;
    out.push(m);
  }
  throw new Error(`queue ${queue} did not drain`);
}

// Expect a channel operation to be rejected with the given AMQP reply code.
async function expectChannelError(ch, promiseFn, code) {
  const closed = new Promise((resolve) => ch.once('close', resolve));
  ch.on('error', () => {});
  await assert.rejects(
    withTimeout(Promise.resolve().then(promiseFn), WAIT, 'channel error'),
    (err) => {
      assert.equal(err.code, code, `expected reply code ${code}, got ${err.code}: ${err.message}`);
      return true;
    });
  await withTimeout(closed, WAIT, 'channel close after error');
}

// ---------------------------------------------------------------------------
// 1. Hello world
// ---------------------------------------------------------------------------

test('hello world: default exchange publish and consume', { timeout: TEST_TIMEOUT }, async (t) => {
  const c = await ctx(t);
  const conn = await c.conn();
  const ch = await conn.createChannel();
  const q = c.queue('hello');
  const ok = await ch.assertQueue(q, { durable: false });
  assert.equal(ok.queue, q);
  assert.equal(ok.messageCount, 0);
  assert.equal(ok.consumerCount, 0);

  assert.equal(ch.sendToQueue(q, Buffer.from('Hello World!')), true);
  const msgs = await collect(ch, q, 1);
  assert.equal(msgs[0].content.toString(), 'Hello World!');
  assert.equal(msgs[0].fields.exchange, '');
  assert.equal(msgs[0].fields.routingKey, q);
  assert.equal(msgs[0].fields.redelivered, false);
});

// ---------------------------------------------------------------------------
// 2. Work queues
// ---------------------------------------------------------------------------

test('work queues: prefetch=1 fair dispatch, manual ack, redelivery on channel close', { timeout: TEST_TIMEOUT }, async (t) => {
  const c = await ctx(t);
  const q = c.queue('task');
  const n = 8;
  const prod = await (await c.conn()).createConfirmChannel();
  await prod.assertQueue(q, { durable: true });
  for (let i = 0; i < n; i++) prod.sendToQueue(q, Buffer.from(`task ${i}`), { persistent: true });
  await withTimeout(prod.waitForConfirms(), WAIT, 'confirms');
  assert.equal((await prod.checkQueue(q)).messageCount, n);

  // Worker A takes one task and never acks it.
  const aCh = await (await c.conn()).createChannel();
  await aCh.prefetch(1);
  const aGot = [];
  await aCh.consume(q, (m) => { if (m) aGot.push(m); }, { noAck: false });
  await until(() => aGot.length >= 1, 'worker A delivery');
  await sleep(QUIET);
  assert.equal(aGot.length, 1, 'prefetch=1 must limit worker A to one unacked message');
  assert.equal(aGot[0].fields.redelivered, false);
  assert.equal(aGot[0].properties.deliveryMode, 2);
  const held = aGot[0].content.toString();

  // Worker B acks everything.
  const bCh = await (await c.conn()).createChannel();
  await bCh.prefetch(1);
  const bDone = [];
  await bCh.consume(q, (m) => {
    if (!m) return;
    bDone.push({ body: m.content.toString(), redelivered: m.fields.redelivered });
    bCh.ack(m);
  }, { noAck: false });
  await until(() => bDone.length >= n - 1, `worker B processing ${n - 1} tasks`);
  assert.equal(aGot.length, 1);

  // A's channel closes without acking -> its task goes to B, flagged redelivered.
  await aCh.close();
  await until(() => bDone.length >= n, 'redelivery of the unacked task');
  await sleep(QUIET);
  assert.equal(bDone.length, n);
  const bodies = bDone.map((d) => d.body).sort();
  assert.deepEqual(bodies, Array.from({ length: n }, (_, i) => `task ${i}`).sort(),
    'each task processed exactly once');
  assert.deepEqual(bDone.filter((d) => d.redelivered), [{ body: held, redelivered: true }]);
  const after = await prod.checkQueue(q);
  assert.equal(after.messageCount, 0);
  assert.equal(after.consumerCount, 1);
});

// ---------------------------------------------------------------------------
// 3. Publish/subscribe
// ---------------------------------------------------------------------------

test('publish/subscribe: fanout to exclusive server-named queues', { timeout: TEST_TIMEOUT }, async (t) => {
  const c = await ctx(t);
  const conn = await c.conn();
  const ch = await conn.createChannel();
  const x = c.exchange('logs');
  await ch.assertExchange(x, 'fanout', { durable: false });
  const names = [];
  for (let i = 0; i < 2; i++) {
    const { queue } = await ch.assertQueue('', { exclusive: true });
    assert.ok(queue.startsWith('amq.gen-'), queue);
    await ch.bindQueue(queue, x, '');
    names.push(queue);
  }
  assert.notEqual(names[0], names[1]);
  const msgs = ['a', 'b', 'c', 'd'];
  for (const m of msgs) ch.publish(x, `ignored.${m}`, Buffer.from(m));
  for (const q of names) {
    const got = await collect(ch, q, msgs.length);
    assert.deepEqual(got.map((m) => m.content.toString()), msgs);
  }
});

// ---------------------------------------------------------------------------
// 4. Routing
// ---------------------------------------------------------------------------

test('routing: direct exchange with severities and multiple bindings', { timeout: TEST_TIMEOUT }, async (t) => {
  const c = await ctx(t);
  const conn = await c.conn();
  const ch = await conn.createConfirmChannel();
  const x = c.exchange('direct_logs');
  await ch.assertExchange(x, 'direct', { durable: false });
  const qErr = (await ch.assertQueue('', { exclusive: true })).queue;
  const qAll = (await ch.assertQueue('', { exclusive: true })).queue;
  await ch.bindQueue(qErr, x, 'error');
  for (const sev of ['info', 'warning', 'error']) await ch.bindQueue(qAll, x, sev);
  await ch.bindQueue(qAll, x, 'error'); // duplicate binding: no duplicate delivery

  const sent = ['info', 'warning', 'error', 'debug', 'error', 'critical'];
  for (const sev of sent) ch.publish(x, sev, Buffer.from(`${sev} msg`));
  await withTimeout(ch.waitForConfirms(), WAIT, 'confirms');

  assert.deepEqual((await drain(ch, qErr)).map((m) => m.fields.routingKey), ['error', 'error']);
  assert.deepEqual((await drain(ch, qAll)).map((m) => m.fields.routingKey),
    ['info', 'warning', 'error', 'error']);

  await ch.unbindQueue(qAll, x, 'info');
  ch.publish(x, 'info', Buffer.from('after unbind'));
  ch.publish(x, 'warning', Buffer.from('still bound'));
  await withTimeout(ch.waitForConfirms(), WAIT, 'confirms');
  assert.deepEqual((await drain(ch, qAll)).map((m) => m.content.toString()), ['still bound']);
});

// ---------------------------------------------------------------------------
// 5. Topics
// ---------------------------------------------------------------------------

test('topics: *, # and empty words', { timeout: TEST_TIMEOUT }, async (t) => {
  const c = await ctx(t);
  const conn = await c.conn();
  const ch = await conn.createConfirmChannel();
  const x = c.exchange('topic_logs');
  await ch.assertExchange(x, 'topic', { durable: false });
  const bindings = {
    Q1: ['*.orange.*'],
    Q2: ['*.*.rabbit', 'lazy.#'],
    ALL: ['#'],
    AB: ['a.*.b'],
    HASHMID: ['x.#.y'],
  };
  const queues = {};
  for (const [label, keys] of Object.entries(bindings)) {
    const { queue } = await ch.assertQueue('', { exclusive: true });
    for (const k of keys) await ch.bindQueue(queue, x, k);
    queues[label] = queue;
  }
  const expected = [
    ['quick.orange.rabbit', ['Q1', 'Q2']],
    ['lazy.orange.elephant', ['Q1', 'Q2']],
    ['quick.orange.fox', ['Q1']],
    ['lazy.brown.fox', ['Q2']],
    ['lazy.pink.rabbit', ['Q2']],
    ['quick.brown.fox', []],
    ['orange', []],
    ['quick.orange.male.rabbit', []],
    ['lazy.orange.male.rabbit', ['Q2']],
    ['lazy', ['Q2']],
    ['lazy.', ['Q2']],
    ['.orange.', ['Q1']],
    ['..rabbit', ['Q2']],
    ['a..b', ['AB']],
    ['a.b', []],
    ['a.x.y.b', []],
    ['x.y', ['HASHMID']],
    ['x.1.2.3.y', ['HASHMID']],
    ['x..y', ['HASHMID']],
    ['', []],
    ['#', []],
    ['*.orange.*', ['Q1']],
  ];
  for (const [key] of expected) ch.publish(x, key, Buffer.from(`msg:${key}`));
  await withTimeout(ch.waitForConfirms(), WAIT, 'confirms');

  for (const [label, q] of Object.entries(queues)) {
    const got = (await drain(ch, q)).map((m) => m.fields.routingKey);
    const want = expected
      .filter(([, labels]) => label === 'ALL' || labels.includes(label))
      .map(([key]) => key);
    assert.deepEqual(got, want, `queue ${label}`);
  }
});

// ---------------------------------------------------------------------------
// 6. RPC
// ---------------------------------------------------------------------------

function fib(n) {
  let a = 0;
  let b = 1;
  for (let i = 0; i < n; i++) [a, b] = [b, a + b];
  return a;
}

test('rpc: reply_to exclusive queue and correlation_id', { timeout: TEST_TIMEOUT }, async (t) => {
  const c = await ctx(t);
  const rpcQ = c.queue('rpc_queue');

  // Server, on its own connection.
  const sCh = await (await c.conn()).createChannel();
  await sCh.assertQueue(rpcQ, { durable: false });
  await sCh.prefetch(1);
  let handled = 0;
  await sCh.consume(rpcQ, (msg) => {
    if (!msg) return;
    const n = parseInt(msg.content.toString(), 10);
    sCh.sendToQueue(msg.properties.replyTo, Buffer.from(String(fib(n))),
      { correlationId: msg.properties.correlationId });
    sCh.ack(msg);
    handled++;
  });

  // Client.
  const ch = await (await c.conn()).createChannel();
  const { queue: cbQ } = await ch.assertQueue('', { exclusive: true });
  const waiting = new Map();
  await ch.consume(cbQ, (msg) => {
    if (!msg) return;
    const resolve = waiting.get(msg.properties.correlationId);
    if (resolve) {
      waiting.delete(msg.properties.correlationId);
      resolve(msg.content.toString());
    }
  }, { noAck: true });
  const call = (n) => {
    const corr = crypto.randomUUID();
    const p = new Promise((resolve) => waiting.set(corr, resolve));
    ch.sendToQueue(rpcQ, Buffer.from(String(n)), { correlationId: corr, replyTo: cbQ });
    return withTimeout(p, WAIT, `rpc reply for fib(${n})`);
  };
  for (const n of [0, 1, 2, 10, 30]) {
    assert.equal(Number(await call(n)), fib(n));
  }
  const ns = [5, 6, 7, 8, 20];
  const results = await Promise.all(ns.map(call));
  assert.deepEqual(results.map(Number), ns.map(fib));
  assert.equal(fib(30), 832040);
  assert.equal(handled, 10);
});

// ---------------------------------------------------------------------------
// Extras
// ---------------------------------------------------------------------------

test('confirm channel: waitForConfirms, per-message callbacks, mandatory return', { timeout: TEST_TIMEOUT }, async (t) => {
  const c = await ctx(t);
  const conn = await c.conn();
  const ch = await conn.createConfirmChannel();
  const q = c.queue('confirm');
  await ch.assertQueue(q, { durable: false });

  const acks = [];
  for (let i = 0; i < 20; i++) {
    ch.sendToQueue(q, Buffer.from(`m${i}`), {}, (err) => acks.push(err));
  }
  await withTimeout(ch.waitForConfirms(), WAIT, 'waitForConfirms');
  assert.equal(acks.length, 20);
  assert.ok(acks.every((e) => e === null || e === undefined), 'all publishes acked');
  assert.equal((await ch.checkQueue(q)).messageCount, 20);

  const returned = [];
  ch.on('return', (m) => returned.push(m));
  const x = c.exchange('confirm_x');
  await ch.assertExchange(x, 'direct', { durable: false });
  ch.publish(x, 'nobody', Buffer.from('lost'), { mandatory: true });
  await withTimeout(ch.waitForConfirms(), WAIT, 'waitForConfirms (unroutable)');
  await until(() => returned.length >= 1, 'basic.return');
  assert.equal(returned[0].fields.replyCode, 312);
  assert.equal(returned[0].fields.replyText, 'NO_ROUTE');
  assert.equal(returned[0].fields.exchange, x);
  assert.equal(returned[0].fields.routingKey, 'nobody');
  assert.equal(returned[0].content.toString(), 'lost');
});

test('basic.get message count and nack requeue sets redelivered', { timeout: TEST_TIMEOUT }, async (t) => {
  const c = await ctx(t);
  const conn = await c.conn();
  const ch = await conn.createConfirmChannel();
  const q = c.queue('get');
  await ch.assertQueue(q, { durable: false });
  assert.equal(await ch.get(q), false);
  for (const b of ['m0', 'm1', 'm2']) ch.sendToQueue(q, Buffer.from(b));
  await withTimeout(ch.waitForConfirms(), WAIT, 'confirms');

  const m0 = await ch.get(q, { noAck: false });
  assert.equal(m0.fields.messageCount, 2);
  assert.equal(m0.fields.redelivered, false);
  assert.equal(m0.content.toString(), 'm0');
  ch.nack(m0, false, true); // requeue
  const again = await ch.get(q, { noAck: false });
  assert.equal(again.content.toString(), 'm0');
  assert.equal(again.fields.redelivered, true);
  assert.equal(again.fields.messageCount, 2);
  ch.ack(again);
  const rest = await drain(ch, q);
  assert.deepEqual(rest.map((m) => m.content.toString()), ['m1', 'm2']);
  assert.deepEqual(rest.map((m) => m.fields.messageCount), [1, 0]);
});

test('checkQueue of a missing queue fails with 404', { timeout: TEST_TIMEOUT }, async (t) => {
  const c = await ctx(t);
  const conn = await c.conn();
  const ch = await conn.createChannel();
  await expectChannelError(ch, () => ch.checkQueue(uniq('missing')), 404);
  // The connection survives a channel error.
  const ch2 = await conn.createChannel();
  const q = c.queue('after404');
  await ch2.assertQueue(q, { durable: false });
  await ch2.checkQueue(q);
});

test('checkExchange of a missing exchange fails with 404', { timeout: TEST_TIMEOUT }, async (t) => {
  const c = await ctx(t);
  const ch = await (await c.conn()).createChannel();
  await expectChannelError(ch, () => ch.checkExchange(uniq('missingx')), 404);
});

test('re-declaring a queue with different durable fails with 406', { timeout: TEST_TIMEOUT }, async (t) => {
  const c = await ctx(t);
  const ch = await (await c.conn()).createChannel();
  const q = c.queue('mismatch');
  await ch.assertQueue(q, { durable: false });
  await expectChannelError(ch, () => ch.assertQueue(q, { durable: true }), 406);
});

test('message properties and headers round trip', { timeout: TEST_TIMEOUT }, async (t) => {
  const c = await ctx(t);
  const ch = await (await c.conn()).createConfirmChannel();
  const q = c.queue('props');
  await ch.assertQueue(q, { durable: false });
  const body = Buffer.alloc(300 * 1024);
  for (let i = 0; i < body.length; i++) body[i] = i % 251;
  ch.sendToQueue(q, body, {
    contentType: 'application/octet-stream',
    contentEncoding: 'identity',
    headers: { 'x-str': 'v', 'x-int': 42, 'x-bool': true, 'x-nested': { k: 'v' } },
    persistent: true,
    priority: 4,
    correlationId: 'corr-1',
    replyTo: 'reply.here',
    expiration: '60000',
    messageId: 'mid-1',
    timestamp: 1700000000,
    type: 'test.type',
    appId: 'interop',
  });
  await withTimeout(ch.waitForConfirms(), WAIT, 'confirms');
  const m = await ch.get(q, { noAck: true });
  assert.ok(m);
  assert.ok(m.content.equals(body), 'body intact across frames');
  const p = m.properties;
  assert.equal(p.contentType, 'application/octet-stream');
  assert.equal(p.contentEncoding, 'identity');
  assert.equal(p.deliveryMode, 2);
  assert.equal(p.priority, 4);
  assert.equal(p.correlationId, 'corr-1');
  assert.equal(p.replyTo, 'reply.here');
  assert.equal(p.expiration, '60000');
  assert.equal(p.messageId, 'mid-1');
  assert.equal(p.timestamp, 1700000000);
  assert.equal(p.type, 'test.type');
  assert.equal(p.appId, 'interop');
  assert.equal(p.headers['x-str'], 'v');
  assert.equal(p.headers['x-int'], 42);
  assert.equal(p.headers['x-bool'], true);
  assert.equal(p.headers['x-nested'].k, 'v');
});

// ---------------------------------------------------------------------------
// Closing while the client is still flushing
// ---------------------------------------------------------------------------

test('close right after a burst of publishes completes without a socket error', { timeout: TEST_TIMEOUT }, async (t) => {
  // amqplib writes connection.close ahead of the publishes still buffered in its channel;
  // the broker must keep reading (and discarding) them until the client closes its socket.
  const c = await ctx(t);
  const setup = await c.conn();
  const sch = await setup.createChannel();
  const q = c.queue('close-burst');
  await sch.assertQueue(q, { durable: false });
  for (let round = 0; round < 5; round++) {
    const conn = await withTimeout(amqp.connect(URL, { timeout: 10000 }), 15000, 'connect');
    const errors = [];
    conn.on('error', (e) => errors.push(e));
    const ch = await conn.createChannel();
    const body = Buffer.alloc(64, 'x');
    for (let i = 0; i < 2000; i++) ch.sendToQueue(q, body);
    const started = Date.now();
    await withTimeout(conn.close(), 5000, 'connection.close');
    await sleep(50);
    assert.deepEqual(errors.map((e) => e.code || e.message), [], `round ${round}: socket errors`);
    assert.ok(Date.now() - started < 5000);
  }
});

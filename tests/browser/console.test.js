// The web management console in a real headless Chromium against the real warren binary:
// a queue declared over AMQP shows up with its depth, a message published from the page
// is got back on the page, a purge empties the queue (checked over AMQP too), and the
// overview's rate chart follows traffic.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const amqplib = require('amqplib');
const { startWarren, startChromium, waitForText, watchedPage, logIn } = require('./support.js');

let warren;
let browser;

test.before(async () => {
  warren = await startWarren();
  browser = await startChromium();
});

test.after(async () => {
  if (browser) await browser.close();
  if (warren) await warren.stop();
});

test('the page and its assets are public, with nosniff and a CSP; the API still needs auth', async () => {
  const page = await fetch(`${warren.base}/`);
  assert.equal(page.status, 200);
  assert.match(page.headers.get('content-type'), /^text\/html/);
  assert.equal(page.headers.get('x-content-type-options'), 'nosniff');
  const csp = page.headers.get('content-security-policy');
  assert.match(csp, /script-src 'self'/);
  assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/);
  const etag = page.headers.get('etag');
  assert.ok(etag);
  assert.equal((await fetch(`${warren.base}/`, { headers: { 'If-None-Match': etag } })).status, 304);
  const js = await fetch(`${warren.base}/console/js/main.js`);
  assert.equal(js.status, 200);
  assert.match(js.headers.get('content-type'), /^text\/javascript/);
  const chart = await fetch(`${warren.base}/console/vendor/uPlot.iife.min.js`);
  assert.equal(chart.status, 200);
  assert.match(await chart.text(), /uPlot \(v1\.6\.32\)/);
  assert.equal((await fetch(`${warren.base}/console/nope.js`)).status, 404);
  // Without credentials the API answers 401 with RabbitMQ's challenge; the console's own
  // calls (X-Requested-With) get no challenge, so the browser shows no credentials dialog.
  const bare = await fetch(`${warren.base}/api/overview`);
  assert.equal(bare.status, 401);
  assert.equal(bare.headers.get('www-authenticate'), 'Basic realm="RabbitMQ Management"');
  const scripted = await fetch(`${warren.base}/api/overview`, { headers: { 'X-Requested-With': 'XMLHttpRequest' } });
  assert.equal(scripted.status, 401);
  assert.equal(scripted.headers.get('www-authenticate'), null);
});

test('a wrong password is refused with the server\'s reason', async () => {
  const { page } = await watchedPage(browser.context);
  await logIn(page, warren.base, 'guest', 'wrong');
  await waitForText(page.locator('.login-error'), 'Login failed: Not_Authorized');
  assert.equal(await page.locator('#nav').isHidden(), true);
  await page.close();
});

test('log in, see an AMQP queue with its depth, publish, get it back, purge', async () => {
  const queue = 'console-browser-test';
  const conn = await amqplib.connect(warren.amqpUrl);
  try {
    const ch = await conn.createConfirmChannel();
    await ch.assertQueue(queue, { durable: true });
    for (let i = 0; i < 3; i++) ch.sendToQueue(queue, Buffer.from(`amqp message ${i}`), { persistent: true });
    await ch.waitForConfirms();

    const { page, errors } = await watchedPage(browser.context);
    page.on('dialog', (d) => d.accept());
    await logIn(page, warren.base);
    await page.locator('#nav').waitFor({ state: 'visible' });
    await waitForText(page.locator('#whoami'), 'guest (administrator)');
    await page.locator('#overview-node').getByText(/^warren@/).waitFor();

    // The queue list shows the queue declared over AMQP with its depth.
    await page.click('nav a[href="#/queues"]');
    const row = page.locator('#queues-table tbody tr', { has: page.locator(`a.queue-link:text-is("${queue}")`) });
    await waitForText(row.locator('td.ready'), '3');
    await waitForText(row.locator('td.total'), '3');

    // Its page: publish one message through the default exchange.
    await row.locator('a.queue-link').click();
    await waitForText(page.locator('#queue-depth td.total'), '3');
    await page.fill('#publish-form textarea[name=payload]', 'hello from the console');
    await page.click('#publish-form button[type=submit]');
    await page.locator('.notice.ok', { hasText: 'Message published.' }).waitFor();
    await waitForText(page.locator('#queue-depth td.total'), '4');

    // Get the four messages back, requeued; the last one is the page's.
    await page.selectOption('#get-form select[name=ackmode]', 'ack_requeue_true');
    await page.fill('#get-form input[name=count]', '10');
    await page.click('#get-form button[type=submit]');
    await page.locator('#got-messages .message').nth(3).waitFor();
    assert.equal(await page.locator('#got-messages .message').count(), 4);
    await waitForText(page.locator('#got-messages .message pre.payload').nth(3), 'hello from the console');
    await waitForText(page.locator('#got-messages .message pre.payload').nth(0), 'amqp message 0');
    await waitForText(page.locator('#queue-depth td.total'), '4');

    // Purge, then the page and the broker say 0.
    await page.click('#purge');
    await page.locator('.notice.ok', { hasText: 'Queue purged.' }).waitFor();
    await waitForText(page.locator('#queue-depth td.total'), '0');
    const check = await ch.checkQueue(queue);
    assert.equal(check.messageCount, 0);
    await page.click('nav a[href="#/queues"]');
    await waitForText(row.locator('td.total'), '0');

    assert.deepEqual(errors, []);
    await page.close();
    await ch.close();
  } finally {
    await conn.close();
  }
});

test('the overview charts the publish rate while messages flow', async () => {
  const conn = await amqplib.connect(warren.amqpUrl);
  const ch = await conn.createChannel();
  const q = (await ch.assertQueue('', { exclusive: true })).queue;
  let sent = 0;
  const pump = setInterval(() => {
    for (let i = 0; i < 20; i++) ch.sendToQueue(q, Buffer.from(`m${sent++}`));
  }, 50);
  try {
    const { page, errors } = await watchedPage(browser.context);
    await logIn(page, warren.base);
    await page.locator('#rate-chart canvas').waitFor();
    await page.selectOption('#interval', '2');
    // The first sample has no rate; later ones have a positive publish rate.
    const publish = page.locator('#current-rates tbody td').first();
    const deadline = Date.now() + 20000;
    let text = '';
    while (Date.now() < deadline) {
      text = (await publish.textContent()).trim();
      if (/^[\d,.]+\/s$/.test(text) && parseFloat(text.replace(/,/g, '')) > 0) break;
      await new Promise((r) => setTimeout(r, 200));
    }
    assert.match(text, /^[\d,.]+\/s$/, `publish rate cell reads ${JSON.stringify(text)}`);
    assert.ok(parseFloat(text.replace(/,/g, '')) > 0);
    assert.equal(await page.locator('#queued-chart canvas').count(), 1);
    assert.deepEqual(errors, []);
    await page.close();
  } finally {
    clearInterval(pump);
    await ch.close();
    await conn.close();
  }
});

// The console's other pages in headless Chromium against the warren binary: connections
// (closing one as an AMQP client sees it), channels, exchanges, users / vhosts /
// permissions / policies (add and delete, and the server's reason on a refusal), and
// definitions download and upload.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const amqplib = require('amqplib');
const { startWarren, startChromium, waitForText, watchedPage, logIn } = require('./support.js');

let warren;
let browser;
const auth = { Authorization: `Basic ${Buffer.from('guest:guest').toString('base64')}` };
const apiGet = (p) => fetch(`${warren.base}/api/${p}`, { headers: auth });

test.before(async () => {
  warren = await startWarren();
  browser = await startChromium();
});

test.after(async () => {
  if (browser) await browser.close();
  if (warren) await warren.stop();
});

async function loggedIn() {
  const w = await watchedPage(browser.context);
  w.page.on('dialog', (d) => d.accept());
  await logIn(w.page, warren.base);
  await w.page.locator('#nav').waitFor({ state: 'visible' });
  return w;
}

test('connections, channels and exchanges are listed; closing a connection reaches the client', async () => {
  const conn = await amqplib.connect(warren.amqpUrl, { clientProperties: { product: 'console-test-client' } });
  const ch = await conn.createChannel();
  const closed = new Promise((resolve) => conn.on('close', resolve));
  conn.on('error', () => {});
  const { page, errors } = await loggedIn();

  await page.click('nav a[href="#/channels"]');
  await page.locator('#channels-table tbody tr td', { hasText: '(1)' }).first().waitFor();

  await page.click('nav a[href="#/exchanges"]');
  await page.locator('#exchanges-table td', { hasText: 'amq.topic' }).waitFor();

  await page.click('nav a[href="#/connections"]');
  const row = page.locator('#connections-table tbody tr', { hasText: 'console-test-client' });
  await row.waitFor();
  await row.locator('button.close-connection').click();
  const err = await closed;
  assert.match(String(err && err.message), /CONNECTION_FORCED.*Closed via management console/);
  await page.locator('.notice.ok', { hasText: 'closed.' }).waitFor();
  await page.locator('#connections-table td.empty', { hasText: 'No connections' }).waitFor();
  assert.deepEqual(errors, []);
  await page.close();
  void ch;
});

test('users, vhosts, permissions and policies: add, list, refuse with the server\'s reason, delete', async () => {
  const { page, errors } = await loggedIn();
  await page.click('nav a[href="#/admin"]');
  await page.locator('#users-table td', { hasText: 'guest' }).first().waitFor();

  await page.fill('#add-vhost input[name=name]', 'console-vh');
  await page.click('#add-vhost button[type=submit]');
  await page.locator('#vhosts-table td', { hasText: 'console-vh' }).waitFor();

  await page.fill('#add-user input[name=name]', 'console-user');
  await page.fill('#add-user input[name=password]', 'pw-123');
  await page.fill('#add-user input[name=tags]', 'management');
  await page.click('#add-user button[type=submit]');
  await page.locator('#users-table tr', { hasText: 'console-user' }).waitFor();

  await page.selectOption('#set-permission select[name=user]', 'console-user');
  await page.selectOption('#set-permission select[name=vhost]', 'console-vh');
  await page.fill('#set-permission input[name=configure]', '^cfg');
  await page.click('#set-permission button[type=submit]');
  const perm = page.locator('#permissions-table tbody tr', { hasText: 'console-user' });
  await waitForText(perm.locator('td').nth(2), '^cfg');
  const p = await (await apiGet('permissions/console-vh/console-user')).json();
  assert.equal(p.configure, '^cfg');

  // A policy the server refuses: the page shows the server's own reason.
  const bad = { pattern: '^capped', 'apply-to': 'queues', priority: 0, definition: { 'max-length': 'lots' } };
  const refused = await fetch(`${warren.base}/api/policies/console-vh/cap`, {
    method: 'PUT', headers: { ...auth, 'Content-Type': 'application/json' }, body: JSON.stringify(bad),
  });
  assert.equal(refused.status, 400);
  const reason = (await refused.json()).reason;
  await page.selectOption('#add-policy select[name=vhost]', 'console-vh');
  await page.fill('#add-policy input[name=name]', 'cap');
  await page.fill('#add-policy input[name=pattern]', '^capped');
  await page.fill('#add-policy input[name=definition]', '{"max-length": "lots"}');
  await page.click('#add-policy button[type=submit]');
  await page.locator('.notice.error', { hasText: `Adding the policy: ${reason}` }).waitFor();

  await page.fill('#add-policy input[name=definition]', '{"max-length": 5}');
  await page.click('#add-policy button[type=submit]');
  const pol = page.locator('#policies-table tbody tr', { hasText: '^capped' });
  await pol.waitFor();
  const stored = await (await apiGet('policies/console-vh/cap')).json();
  assert.deepEqual(stored.definition, { 'max-length': 5 });

  await pol.locator('button.danger').click();
  await page.locator('#policies-table td.empty').waitFor();
  assert.equal((await apiGet('policies/console-vh/cap')).status, 404);
  await perm.locator('button.danger').click();
  await page.locator('#permissions-table tbody tr', { hasText: 'console-user' }).waitFor({ state: 'detached' });
  await page.locator('#users-table tr', { hasText: 'console-user' }).locator('button.danger').click();
  await page.locator('#users-table tr', { hasText: 'console-user' }).waitFor({ state: 'detached' });
  assert.equal((await apiGet('users/console-user')).status, 404);
  await page.locator('#vhosts-table tr', { hasText: 'console-vh' }).locator('button.danger').click();
  await page.locator('#vhosts-table tr', { hasText: 'console-vh' }).waitFor({ state: 'detached' });
  assert.equal((await apiGet('vhosts/console-vh')).status, 404);
  assert.deepEqual(errors.filter((e) => !/status of 400/.test(e)), []);
  await page.close();
});

test('definitions: download the export, upload a file', async () => {
  const put = await fetch(`${warren.base}/api/queues/%2F/exported-q`, {
    method: 'PUT', headers: { ...auth, 'Content-Type': 'application/json' }, body: '{"durable":true}',
  });
  assert.ok(put.status === 201 || put.status === 204);
  const { page, errors } = await loggedIn();
  await page.click('nav a[href="#/definitions"]');
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('#download-definitions')]);
  assert.match(download.suggestedFilename(), /^warren-definitions-.*\.json$/);
  const exported = JSON.parse(fs.readFileSync(await download.path(), 'utf8'));
  assert.ok(exported.queues.some((q) => q.name === 'exported-q'));

  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'warren-defs-')), 'defs.json');
  fs.writeFileSync(file, JSON.stringify({
    queues: [{ name: 'uploaded-q', vhost: '/', durable: true, auto_delete: false, arguments: {} }],
  }));
  await page.setInputFiles('#upload-definitions input[name=file]', file);
  await page.click('#upload-definitions button[type=submit]');
  await page.locator('.notice.ok', { hasText: 'imported' }).waitFor();
  assert.equal((await apiGet('queues/%2F/uploaded-q')).status, 200);

  fs.writeFileSync(file, '{"queues": [{"name": 7}]}');
  await page.setInputFiles('#upload-definitions input[name=file]', file);
  await page.click('#upload-definitions button[type=submit]');
  await page.locator('.notice.error', { hasText: 'Importing definitions:' }).waitFor();
  fs.rmSync(path.dirname(file), { recursive: true, force: true });
  assert.deepEqual(errors.filter((e) => !/status of 400/.test(e)), []);
  await page.close();
});

// Starting the warren binary on free ports with a temporary data directory, and Debian's
// Chromium through playwright-core, for the console tests.
'use strict';

const { spawn } = require('node:child_process');
const fs = require('node:fs');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const { chromium } = require('playwright-core');

const ROOT = path.resolve(__dirname, '..', '..');

/** A port nothing listens on right now (bound on 127.0.0.1:0 and released). */
function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function portOpen(port) {
  return new Promise((resolve) => {
    const c = net.connect({ host: '127.0.0.1', port }, () => {
      c.destroy();
      resolve(true);
    });
    c.on('error', () => resolve(false));
  });
}

/**
 * Starts `WARREN_BIN` (default target/debug/warren) with AMQP and the management API on
 * free ports of 127.0.0.1 and a fresh data directory. Resolves to
 * `{amqpUrl, base, stop(), log()}`; `stop()` terminates it and removes the directory.
 */
async function startWarren() {
  let bin = process.env.WARREN_BIN || 'target/debug/warren';
  if (!path.isAbsolute(bin)) bin = path.join(ROOT, bin);
  if (!fs.existsSync(bin)) {
    throw new Error(`${bin} not found: build it with cargo build -p warren-server --bin warren`);
  }
  const amqp = await freePort();
  const mgmt = await freePort();
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'warren-browser-data-'));
  let output = '';
  const child = spawn(bin, [
    '--amqp-listen', `127.0.0.1:${amqp}`,
    '--management-listen', `127.0.0.1:${mgmt}`,
    '--httpmq-listen', '127.0.0.1:0',
    '--data-dir', dataDir,
    '--log-level', 'warn',
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout.on('data', (d) => { output += d; });
  child.stderr.on('data', (d) => { output += d; });
  let exited = null;
  child.on('exit', (code, signal) => { exited = { code, signal }; });
  const deadline = Date.now() + 30000;
  while (!(await portOpen(mgmt)) || !(await portOpen(amqp))) {
    if (exited) throw new Error(`warren exited (${JSON.stringify(exited)}):\n${output}`);
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`warren did not listen within 30 s:\n${output}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    amqpUrl: `amqp://guest:guest@127.0.0.1:${amqp}/%2F`,
    base: `http://127.0.0.1:${mgmt}`,
    log: () => output,
    async stop() {
      if (!exited) {
        const gone = new Promise((r) => child.once('exit', r));
        child.kill('SIGTERM');
        const t = setTimeout(() => child.kill('SIGKILL'), 10000);
        await gone;
        clearTimeout(t);
      }
      fs.rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/**
 * Debian's Chromium (`CHROMIUM`, default /usr/bin/chromium), headless, with a fresh
 * profile directory; without the background-networking flags Chromium's own connections
 * are refused on a closed network. Resolves to `{context, close()}`.
 */
async function startChromium() {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'warren-browser-profile-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
    ],
    viewport: { width: 1280, height: 900 },
    acceptDownloads: true,
  });
  return {
    context,
    async close() {
      await context.close();
      fs.rmSync(profile, { recursive: true, force: true });
    },
  };
}

/** Waits until `locator`'s text (trimmed) is `expected`; fails with the last text seen. */
async function waitForText(locator, expected, timeout = 15000) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    last = await locator.first().textContent({ timeout: Math.max(1, deadline - Date.now()) }).catch(() => undefined);
    if (last !== undefined && last !== null && last.trim() === expected) return;
    if (Date.now() > deadline) {
      throw new Error(`expected ${locator} to read ${JSON.stringify(expected)}, last read ${JSON.stringify(last)}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** A page that records uncaught errors and console errors (CSP violations among them). */
async function watchedPage(context) {
  const page = await context.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(`pageerror: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(`console: ${m.text()}`);
  });
  return { page, errors };
}

/** Logs in through the console's form. */
async function logIn(page, base, user = 'guest', password = 'guest') {
  await page.goto(`${base}/`);
  await page.fill('#login-form input[name=username]', user);
  await page.fill('#login-form input[name=password]', password);
  await page.click('#login-form button[type=submit]');
}

module.exports = { startWarren, startChromium, waitForText, watchedPage, logIn, freePort, ROOT };

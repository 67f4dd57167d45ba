// Takes docs/console-overview.png: the console's overview in headless Chromium while
// messages flow (a publisher with a varying rate, a consumer that acknowledges and one
// queue left to fill up).
//
// Usage: node tests/browser/screenshot.js [seconds of traffic, default 45]
'use strict';

const path = require('node:path');
const amqplib = require('amqplib');
const { startWarren, startChromium, logIn, ROOT } = require('./support.js');

async function main() {
  const seconds = Number(process.argv[2] || 45);
  const warren = await startWarren();
  const browser = await startChromium();
  const conn = await amqplib.connect(warren.amqpUrl, { clientProperties: { product: 'screenshot-publisher' } });
  const pub = await conn.createChannel();
  const sub = await conn.createChannel();
  await pub.assertQueue('orders', { durable: true });
  await pub.assertQueue('audit', { durable: true });
  await sub.prefetch(50);
  await sub.consume('orders', (m) => setTimeout(() => sub.ack(m), 5));
  const started = Date.now();
  const pump = setInterval(() => {
    const t = (Date.now() - started) / 1000;
    const n = Math.round(15 + 10 * Math.sin(t / 6));
    for (let i = 0; i < n; i++) {
      pub.sendToQueue('orders', Buffer.from(`order ${t}`), { persistent: true });
      if (i % 3 === 0) pub.sendToQueue('audit', Buffer.from(`audit ${t}`));
    }
  }, 100);
  try {
    const page = await browser.context.newPage();
    await logIn(page, warren.base);
    await page.locator('#rate-chart canvas').waitFor();
    await page.selectOption('#interval', '2');
    await page.waitForTimeout(seconds * 1000);
    const out = path.join(ROOT, 'docs', 'console-overview.png');
    await page.screenshot({ path: out, fullPage: true });
    console.log(`wrote ${out}`);
  } finally {
    clearInterval(pump);
    await conn.close().catch(() => {});
    await browser.close();
    await warren.stop();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

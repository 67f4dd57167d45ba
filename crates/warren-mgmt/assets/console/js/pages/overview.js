// Overview: node and versions, object and queue totals, and live charts of the message
// rates (publish / deliver / ack, computed from successive samples of /api/overview's
// message_stats counters) and of the queued messages.

import { api } from '../api.js';
import { facts, h, num, rate, section, table } from '../dom.js';
import { Rates } from '../rates.js';

const POINTS = 120; // samples kept on the charts
const RATE_SERIES = [
  ['publish', 'Publish', '#1f77b4'],
  ['deliver_get', 'Deliver / get', '#2ca02c'],
  ['ack', 'Acknowledge', '#ff7f0e'],
  ['confirm', 'Confirm', '#9467bd'],
  ['redeliver', 'Redeliver', '#d62728'],
];
const QUEUED_SERIES = [
  ['messages_ready', 'Ready', '#e6b800'],
  ['messages_unacknowledged', 'Unacked', '#17becf'],
  ['messages', 'Total', '#7f7f7f'],
];

function chart(el, title, series, yLabel) {
  const width = Math.max(320, Math.min(el.clientWidth || 900, 1100));
  const opts = {
    title,
    width,
    height: 240,
    scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] } },
    axes: [{}, { label: yLabel, size: 70 }],
    series: [{}, ...series.map(([, label, stroke]) => ({ label, stroke, width: 2, spanGaps: false }))],
    legend: { live: true },
  };
  const data = [[], ...series.map(() => [])];
  // uPlot comes from vendor/uPlot.iife.min.js (loaded before this module).
  return { plot: new window.uPlot(opts, data, el), data };
}

function push(c, at, values) {
  c.data[0].push(at / 1000);
  values.forEach((v, i) => c.data[i + 1].push(v === undefined ? null : v));
  if (c.data[0].length > POINTS) for (const s of c.data) s.shift();
  c.plot.setData(c.data);
}

export async function mount(main) {
  const rates = new Rates();
  const head = h('div', { id: 'overview-node' });
  const totals = h('div', { class: 'row' });
  const rateNow = h('div', { id: 'overview-rates' });
  const rateBox = h('div', { class: 'chart', id: 'rate-chart' });
  const queuedBox = h('div', { class: 'chart', id: 'queued-chart' });
  main.append(h('h1', {}, 'Overview'), head, totals,
    section('Message rates', rateBox, rateNow),
    section('Queued messages', queuedBox));
  let rateChart = null;
  let queuedChart = null;
  let resize = null;

  async function refresh() {
    const o = await api('GET', 'overview');
    const at = Date.now();
    head.replaceChildren(facts([
      ['Node', o.node],
      ['Cluster', o.cluster_name],
      ['Product', `${o.product_name || ''} ${o.product_version || ''}`.trim()],
      ['RabbitMQ version', o.rabbitmq_version],
      ['Management version', o.management_version],
      ['Listeners', (o.listeners || []).map((l) => `${l.protocol} ${l.ip_address}:${l.port}`).join(', ')],
    ]));
    const ot = o.object_totals || {};
    const qt = o.queue_totals || {};
    totals.replaceChildren(
      section('Totals', table(
        [['Connections', (x) => num(x.connections)], ['Channels', (x) => num(x.channels)],
          ['Exchanges', (x) => num(x.exchanges)], ['Queues', (x) => num(x.queues)],
          ['Consumers', (x) => num(x.consumers)]],
        [ot], { id: 'object-totals' })),
      section('Queue totals', table(
        [['Ready', (x) => num(x.messages_ready)], ['Unacked', (x) => num(x.messages_unacknowledged)],
          ['Total', (x) => num(x.messages)]],
        [qt], { id: 'queue-totals' })),
    );
    const r = rates.sample('overview', o.message_stats || {}, RATE_SERIES.map(([f]) => f), at);
    rateNow.replaceChildren(table(
      RATE_SERIES.map(([f, label]) => [label, () => (r[f] === undefined ? '…' : rate(r[f])), { class: 'n' }]),
      [{}], { id: 'current-rates' }));
    if (!rateChart) {
      rateChart = chart(rateBox, 'Messages per second', RATE_SERIES, 'msg/s');
      queuedChart = chart(queuedBox, 'Messages queued', QUEUED_SERIES, 'messages');
      resize = () => {
        const w = Math.max(320, Math.min(main.clientWidth, 1100));
        rateChart.plot.setSize({ width: w, height: 240 });
        queuedChart.plot.setSize({ width: w, height: 240 });
      };
      window.addEventListener('resize', resize);
    }
    push(rateChart, at, RATE_SERIES.map(([f]) => r[f]));
    push(queuedChart, at, QUEUED_SERIES.map(([f]) => qt[f]));
  }

  await refresh().catch((e) => main.append(h('p', { class: 'error' }, e.reason || e.message)));
  return {
    refresh,
    unmount() {
      if (resize) window.removeEventListener('resize', resize);
      if (rateChart) rateChart.plot.destroy();
      if (queuedChart) queuedChart.plot.destroy();
    },
  };
}

// Queues: the list (depth, consumers, policy, rates) with a declare form, and one queue's
// page (arguments, bindings, get messages, publish, purge, delete).

import { api, path } from '../api.js';
import { attempt, brief, facts, field, form, h, notify, num, queueHref, rate, section, table } from '../dom.js';
import { Rates } from '../rates.js';

const RATE_FIELDS = ['publish', 'deliver_get', 'ack'];

function features(q) {
  return [q.durable && 'D', q.auto_delete && 'AD', q.exclusive && 'Excl'].filter(Boolean).join(' ');
}

async function vhostOptions() {
  const vhosts = await api('GET', 'vhosts?columns=name').catch(() => []);
  return vhosts.map((v) => h('option', { value: v.name }, v.name));
}

export async function mountList(main) {
  const rates = new Rates();
  const holder = h('div', { id: 'queues' });
  main.append(h('h1', {}, 'Queues'), holder);

  async function refresh() {
    const qs = await api('GET', 'queues');
    const at = Date.now();
    const r = new Map();
    for (const q of qs) {
      const key = `${q.vhost}\u0000${q.name}`;
      r.set(key, rates.sample(key, q.message_stats || {}, RATE_FIELDS, at));
    }
    rates.retain([...r.keys()]);
    const rr = (q, f) => {
      const v = r.get(`${q.vhost}\u0000${q.name}`)[f];
      return v === undefined ? '' : rate(v);
    };
    holder.replaceChildren(table([
      ['Virtual host', (q) => q.vhost],
      ['Name', (q) => h('a', { href: queueHref(q.vhost, q.name), class: 'queue-link' }, q.name)],
      ['Type', (q) => q.type],
      ['Features', (q) => features(q)],
      ['Policy', (q) => q.policy || ''],
      ['State', (q) => q.state],
      ['Ready', (q) => num(q.messages_ready), { class: 'n ready' }],
      ['Unacked', (q) => num(q.messages_unacknowledged), { class: 'n unacked' }],
      ['Total', (q) => num(q.messages), { class: 'n total' }],
      ['Consumers', (q) => num(q.consumers), { class: 'n' }],
      ['Incoming', (q) => rr(q, 'publish'), { class: 'n' }],
      ['Deliver / get', (q) => rr(q, 'deliver_get'), { class: 'n' }],
      ['Ack', (q) => rr(q, 'ack'), { class: 'n' }],
    ], qs, { id: 'queues-table', empty: 'No queues' }));
  }

  await attempt('Listing queues', refresh);
  main.append(section('Add a queue', form({ id: 'add-queue', class: 'inline' }, async (f) => {
    const v = f.elements.vhost.value;
    const name = f.elements.name.value;
    let args = {};
    if (f.elements.arguments.value.trim()) {
      try {
        args = JSON.parse(f.elements.arguments.value);
      } catch (e) {
        notify(`Arguments are not JSON: ${e.message}`, 'error');
        return;
      }
    }
    const ok = await attempt('Declaring the queue', () => api('PUT', `queues/${path(v, name)}`, {
      durable: f.elements.durable.checked, auto_delete: false, arguments: args,
    }).then(() => true));
    if (ok) {
      notify(`Queue ${name} declared.`);
      f.reset();
      await attempt('Listing queues', refresh);
    }
  },
  field('Virtual host', h('select', { name: 'vhost' }, await vhostOptions())),
  field('Name', h('input', { name: 'name', required: true })),
  field('Durable', h('input', { name: 'durable', type: 'checkbox', checked: true })),
  field('Arguments (JSON)', h('input', { name: 'arguments', placeholder: '{"x-max-length": 1000}' })),
  h('button', { type: 'submit' }, 'Add queue'))));
  return { refresh };
}

const ACK_MODES = [
  ['ack_requeue_true', 'Nack message requeue true'],
  ['ack_requeue_false', 'Automatic ack'],
  ['reject_requeue_true', 'Reject requeue true'],
  ['reject_requeue_false', 'Reject requeue false'],
];

function messageView(m, i) {
  return h('div', { class: 'message' },
    h('h3', {}, `Message ${i + 1}`),
    facts([
      ['Exchange', m.exchange === '' ? '(AMQP default)' : m.exchange],
      ['Routing key', m.routing_key],
      ['Redelivered', String(m.redelivered)],
      ['Properties', brief(m.properties)],
      ['Payload', `${num(m.payload_bytes)} bytes, encoding: ${m.payload_encoding}`],
      ['Messages left', num(m.message_count)],
    ]),
    h('pre', { class: 'payload' }, m.payload));
}

export async function mountQueue(main, [vhost, name]) {
  const q = `queues/${path(vhost, name)}`;
  const rates = new Rates();
  const info = h('div', { id: 'queue-info' });
  const bindings = h('div', { id: 'queue-bindings' });
  const got = h('div', { id: 'got-messages' });
  main.append(h('h1', {}, 'Queue ', h('span', { class: 'name' }, name), h('small', {}, ` in virtual host ${vhost}`)), info);

  async function refresh() {
    const d = await api('GET', q);
    const r = rates.sample('q', d.message_stats || {}, RATE_FIELDS);
    info.replaceChildren(
      facts([
        ['Type', d.type], ['State', d.state], ['Features', features(d)],
        ['Policy', d.policy || ''], ['Operator policy', d.operator_policy || ''],
        ['Effective policy definition', brief(d.effective_policy_definition)],
        ['Consumers', num(d.consumers)],
      ]),
      table([
        ['Ready', (x) => num(x.messages_ready), { class: 'n ready' }],
        ['Unacked', (x) => num(x.messages_unacknowledged), { class: 'n unacked' }],
        ['Total', (x) => num(x.messages), { class: 'n total' }],
        ['Incoming', () => rate(r.publish), { class: 'n' }],
        ['Deliver / get', () => rate(r.deliver_get), { class: 'n' }],
        ['Ack', () => rate(r.ack), { class: 'n' }],
      ], [d], { id: 'queue-depth' }),
      section('Arguments', table([['Argument', ([k]) => k], ['Value', ([, v]) => brief(v)]],
        Object.entries(d.arguments || {}), { empty: 'No arguments' })),
    );
    const bs = await api('GET', `${q}/bindings`);
    bindings.replaceChildren(table([
      ['From', (b) => (b.source === '' ? '(AMQP default)' : b.source)],
      ['Routing key', (b) => b.routing_key],
      ['Arguments', (b) => brief(b.arguments)],
    ], bs, { empty: 'No bindings' }));
  }

  try {
    await refresh();
  } catch (e) {
    main.append(h('p', { class: 'error' }, e.reason || e.message));
    return null;
  }

  main.append(
    section('Bindings', bindings),
    section('Get messages', form({ id: 'get-form', class: 'inline' }, async (f) => {
      const msgs = await attempt('Getting messages', () => api('POST', `${q}/get`, {
        count: Number(f.elements.count.value),
        ackmode: f.elements.ackmode.value,
        encoding: f.elements.encoding.value,
        truncate: 50000,
      }));
      if (msgs === undefined) return;
      got.replaceChildren(...(msgs.length ? msgs.map(messageView) : [h('p', { class: 'empty' }, 'Queue is empty')]));
      await attempt('Reading the queue', refresh);
    },
    field('Ack mode', h('select', { name: 'ackmode' }, ACK_MODES.map(([v, t]) => h('option', { value: v }, t)))),
    field('Encoding', h('select', { name: 'encoding' }, h('option', { value: 'auto' }, 'Auto string / base64'), h('option', { value: 'base64' }, 'base64'))),
    field('Messages', h('input', { name: 'count', type: 'number', min: 1, value: 1, required: true })),
    h('button', { type: 'submit' }, 'Get messages')), got),
    section('Publish message', h('p', { class: 'hint' }, 'Published to the default exchange with this queue\'s name as the routing key.'),
      form({ id: 'publish-form' }, async (f) => {
        let headers = {};
        if (f.elements.headers.value.trim()) {
          try {
            headers = JSON.parse(f.elements.headers.value);
          } catch (e) {
            notify(`Headers are not JSON: ${e.message}`, 'error');
            return;
          }
        }
        const properties = { delivery_mode: Number(f.elements.delivery_mode.value), headers };
        const res = await attempt('Publishing', () => api('POST', `exchanges/${path(vhost, 'amq.default')}/publish`, {
          properties, routing_key: name, payload: f.elements.payload.value, payload_encoding: 'string',
        }));
        if (res === undefined) return;
        notify(res.routed ? 'Message published.' : 'Message published, but not routed.', res.routed ? 'ok' : 'error');
        await attempt('Reading the queue', refresh);
      },
      field('Delivery mode', h('select', { name: 'delivery_mode' }, h('option', { value: 1 }, '1 - Non-persistent'), h('option', { value: 2 }, '2 - Persistent'))),
      field('Headers (JSON)', h('input', { name: 'headers', placeholder: '{"key": "value"}' })),
      field('Payload', h('textarea', { name: 'payload', rows: 4 })),
      h('button', { type: 'submit' }, 'Publish message'))),
    section('Purge', h('button', {
      type: 'button', id: 'purge', class: 'danger',
      onclick: async () => {
        if (!window.confirm(`Purge all messages of queue ${name}?`)) return;
        const ok = await attempt('Purging', () => api('DELETE', `${q}/contents`).then(() => true));
        if (ok) notify('Queue purged.');
        await attempt('Reading the queue', refresh);
      },
    }, 'Purge messages')),
    section('Delete', h('button', {
      type: 'button', id: 'delete-queue', class: 'danger',
      onclick: async () => {
        if (!window.confirm(`Delete queue ${name}?`)) return;
        const ok = await attempt('Deleting', () => api('DELETE', q).then(() => true));
        if (ok) {
          notify(`Queue ${name} deleted.`);
          location.hash = '#/queues';
        }
      },
    }, 'Delete queue')),
  );
  return { refresh };
}

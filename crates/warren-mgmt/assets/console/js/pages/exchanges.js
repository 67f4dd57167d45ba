// Exchanges: name, type, features and policy per vhost.

import { api } from '../api.js';
import { attempt, brief, h, table } from '../dom.js';

export async function mount(main) {
  const holder = h('div', { id: 'exchanges' });
  main.append(h('h1', {}, 'Exchanges'), holder);
  async function refresh() {
    const xs = await api('GET', 'exchanges');
    holder.replaceChildren(table([
      ['Virtual host', (x) => x.vhost],
      ['Name', (x) => (x.name === '' ? '(AMQP default)' : x.name)],
      ['Type', (x) => x.type],
      ['Features', (x) => [x.durable && 'D', x.auto_delete && 'AD', x.internal && 'I'].filter(Boolean).join(' ')],
      ['Arguments', (x) => brief(x.arguments)],
      ['Policy', (x) => x.policy || ''],
    ], xs, { id: 'exchanges-table', empty: 'No exchanges' }));
  }
  await attempt('Listing exchanges', refresh);
  return { refresh };
}

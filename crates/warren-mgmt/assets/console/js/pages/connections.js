// Connections (with "close") and channels.

import { api, path } from '../api.js';
import { attempt, h, notify, num, table } from '../dom.js';

export async function mountConnections(main) {
  const holder = h('div', { id: 'connections' });
  main.append(h('h1', {}, 'Connections'), holder);
  async function refresh() {
    const cs = await api('GET', 'connections');
    holder.replaceChildren(table([
      ['Name', (c) => c.name],
      ['Virtual host', (c) => c.vhost],
      ['User', (c) => c.user],
      ['Client', (c) => {
        const p = c.client_properties || {};
        return [p.product, p.version].filter(Boolean).join(' ');
      }],
      ['Protocol', (c) => c.protocol],
      ['TLS', (c) => (c.ssl ? 'yes' : '')],
      ['Channels', (c) => num(c.channels), { class: 'n' }],
      ['State', (c) => c.state],
      ['', (c) => h('button', {
        type: 'button', class: 'danger close-connection',
        onclick: async () => {
          if (!window.confirm(`Close connection ${c.name}?`)) return;
          const ok = await attempt('Closing the connection', () => api('DELETE', `connections/${path(c.name)}`, undefined,
            { 'X-Reason': 'Closed via management console' }).then(() => true));
          if (ok) notify(`Connection ${c.name} closed.`);
          await attempt('Listing connections', refresh);
        },
      }, 'Close')],
    ], cs, { id: 'connections-table', empty: 'No connections' }));
  }
  await attempt('Listing connections', refresh);
  return { refresh };
}

export async function mountChannels(main) {
  const holder = h('div', { id: 'channels' });
  main.append(h('h1', {}, 'Channels'), holder);
  async function refresh() {
    const chs = await api('GET', 'channels');
    holder.replaceChildren(table([
      ['Channel', (c) => c.name],
      ['Virtual host', (c) => c.vhost],
      ['User', (c) => c.user],
      ['Mode', (c) => [c.confirm && 'C', c.transactional && 'T'].filter(Boolean).join(' ')],
      ['State', (c) => c.state],
      ['Consumers', (c) => num(c.consumer_count), { class: 'n' }],
      ['Prefetch', (c) => num(c.prefetch_count), { class: 'n' }],
      ['Unacked', (c) => num(c.messages_unacknowledged), { class: 'n' }],
      ['Unconfirmed', (c) => num(c.messages_unconfirmed), { class: 'n' }],
    ], chs, { id: 'channels-table', empty: 'No channels' }));
  }
  await attempt('Listing channels', refresh);
  return { refresh };
}

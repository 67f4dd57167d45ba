// Admin: users, virtual hosts, permissions and policies (list, add, delete).

import { api, path } from '../api.js';
import { attempt, brief, field, form, h, notify, num, section, table } from '../dom.js';

function del(label, what, call, after) {
  return h('button', {
    type: 'button', class: 'danger small',
    onclick: async () => {
      if (!window.confirm(`Delete ${what}?`)) return;
      const ok = await attempt(`Deleting ${what}`, () => call().then(() => true));
      if (ok) notify(`${what} deleted.`);
      await after();
    },
  }, label);
}

function options(names, selected) {
  return names.map((n) => h('option', { value: n, selected: n === selected }, n));
}

export async function mount(main) {
  const users = h('div', { id: 'users' });
  const vhosts = h('div', { id: 'vhosts' });
  const perms = h('div', { id: 'permissions' });
  const policies = h('div', { id: 'policies' });
  const userSelects = [];
  const vhostSelects = [];

  async function refresh() {
    const [us, vs, ps, pols] = await Promise.all([
      api('GET', 'users'), api('GET', 'vhosts'), api('GET', 'permissions'), api('GET', 'policies'),
    ]);
    users.replaceChildren(table([
      ['Name', (u) => u.name],
      ['Tags', (u) => (Array.isArray(u.tags) ? u.tags.join(', ') : u.tags)],
      ['Can access virtual hosts', (u) => ps.filter((p) => p.user === u.name).map((p) => p.vhost).join(', ') || 'No access'],
      ['', (u) => del('Delete', `user ${u.name}`, () => api('DELETE', `users/${path(u.name)}`), refresh)],
    ], us, { id: 'users-table' }));
    vhosts.replaceChildren(table([
      ['Name', (v) => v.name],
      ['Description', (v) => v.description || ''],
      ['Messages', (v) => num(v.messages), { class: 'n' }],
      ['', (v) => del('Delete', `virtual host ${v.name}`, () => api('DELETE', `vhosts/${path(v.name)}`), refresh)],
    ], vs, { id: 'vhosts-table' }));
    perms.replaceChildren(table([
      ['User', (p) => p.user], ['Virtual host', (p) => p.vhost],
      ['Configure', (p) => p.configure], ['Write', (p) => p.write], ['Read', (p) => p.read],
      ['', (p) => del('Clear', `permissions of ${p.user} in ${p.vhost}`, () => api('DELETE', `permissions/${path(p.vhost, p.user)}`), refresh)],
    ], ps, { id: 'permissions-table', empty: 'No permissions' }));
    policies.replaceChildren(table([
      ['Virtual host', (p) => p.vhost], ['Name', (p) => p.name], ['Pattern', (p) => p.pattern],
      ['Apply to', (p) => p['apply-to']], ['Definition', (p) => brief(p.definition)],
      ['Priority', (p) => num(p.priority), { class: 'n' }],
      ['', (p) => del('Delete', `policy ${p.name}`, () => api('DELETE', `policies/${path(p.vhost, p.name)}`), refresh)],
    ], pols, { id: 'policies-table', empty: 'No policies' }));
    for (const s of userSelects) s.replaceChildren(...options(us.map((u) => u.name), s.value));
    for (const s of vhostSelects) s.replaceChildren(...options(vs.map((v) => v.name), s.value || '/'));
  }

  const userSelect = () => {
    const s = h('select', { name: 'user' });
    userSelects.push(s);
    return s;
  };
  const vhostSelect = () => {
    const s = h('select', { name: 'vhost' });
    vhostSelects.push(s);
    return s;
  };
  const submit = (what, call) => async (f) => {
    const ok = await attempt(what, () => call(f).then(() => true));
    if (ok) {
      notify(`${what}: done.`);
      f.reset();
      await attempt('Reading', refresh);
    }
  };

  main.append(h('h1', {}, 'Admin'),
    section('Users', users, form({ id: 'add-user', class: 'inline' }, submit('Adding the user', (f) => api('PUT', `users/${path(f.elements.name.value)}`, {
      password: f.elements.password.value, tags: f.elements.tags.value,
    })),
    field('Username', h('input', { name: 'name', required: true })),
    field('Password', h('input', { name: 'password', type: 'password', autocomplete: 'new-password' })),
    field('Tags', h('input', { name: 'tags', placeholder: 'administrator, management, ...' })),
    h('button', { type: 'submit' }, 'Add user'))),
    section('Virtual hosts', vhosts, form({ id: 'add-vhost', class: 'inline' }, submit('Adding the virtual host', (f) => api('PUT', `vhosts/${path(f.elements.name.value)}`, {
      description: f.elements.description.value,
    })),
    field('Name', h('input', { name: 'name', required: true })),
    field('Description', h('input', { name: 'description' })),
    h('button', { type: 'submit' }, 'Add virtual host'))),
    section('Permissions', perms, form({ id: 'set-permission', class: 'inline' }, submit('Setting permissions', (f) => api('PUT', `permissions/${path(f.elements.vhost.value, f.elements.user.value)}`, {
      configure: f.elements.configure.value, write: f.elements.write.value, read: f.elements.read.value,
    })),
    field('User', userSelect()), field('Virtual host', vhostSelect()),
    field('Configure regexp', h('input', { name: 'configure', value: '.*' })),
    field('Write regexp', h('input', { name: 'write', value: '.*' })),
    field('Read regexp', h('input', { name: 'read', value: '.*' })),
    h('button', { type: 'submit' }, 'Set permission'))),
    section('Policies', policies, form({ id: 'add-policy', class: 'inline' }, async (f) => {
      let definition;
      try {
        definition = JSON.parse(f.elements.definition.value);
      } catch (e) {
        notify(`The definition is not JSON: ${e.message}`, 'error');
        return;
      }
      await submit('Adding the policy', () => api('PUT', `policies/${path(f.elements.vhost.value, f.elements.name.value)}`, {
        pattern: f.elements.pattern.value, 'apply-to': f.elements['apply-to'].value,
        priority: Number(f.elements.priority.value || 0), definition,
      }))(f);
    },
    field('Virtual host', vhostSelect()),
    field('Name', h('input', { name: 'name', required: true })),
    field('Pattern', h('input', { name: 'pattern', required: true, placeholder: '^orders\\.' })),
    field('Apply to', h('select', { name: 'apply-to' }, ['queues', 'exchanges', 'all'].map((a) => h('option', { value: a }, a)))),
    field('Priority', h('input', { name: 'priority', type: 'number', value: 0 })),
    field('Definition (JSON)', h('input', { name: 'definition', required: true, placeholder: '{"max-length": 1000}' })),
    h('button', { type: 'submit' }, 'Add policy'))));
  await attempt('Reading users, virtual hosts, permissions and policies', refresh);
  return { refresh };
}

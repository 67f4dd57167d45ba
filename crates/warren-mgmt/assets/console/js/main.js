// The console's shell: login, navigation between pages (location.hash), the refresh timer
// and logout.

import { api, clearCredentials, currentUser, setCredentials, whenUnauthenticated } from './api.js';
import { field, form, h, notify } from './dom.js';
import * as overview from './pages/overview.js';
import * as queues from './pages/queues.js';
import * as exchanges from './pages/exchanges.js';
import * as connections from './pages/connections.js';
import * as admin from './pages/admin.js';
import * as definitions from './pages/definitions.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const session = document.getElementById('session');
const intervalSelect = document.getElementById('interval');

// [pattern, page module, name of its mount function]
const routes = [
  [/^\/?$/, overview.mount],
  [/^\/queues$/, queues.mountList],
  [/^\/queues\/([^/]+)\/([^/]+)$/, queues.mountQueue],
  [/^\/exchanges$/, exchanges.mount],
  [/^\/connections$/, connections.mountConnections],
  [/^\/channels$/, connections.mountChannels],
  [/^\/admin$/, admin.mount],
  [/^\/definitions$/, definitions.mount],
];

let who = null; // the /api/whoami reply
let current = null; // {refresh, unmount} of the page shown
let timer = null;
let generation = 0;

function stopTimer() {
  if (timer) clearInterval(timer);
  timer = null;
}

function startTimer() {
  stopTimer();
  const seconds = Number(intervalSelect.value);
  if (seconds > 0 && current && current.refresh) {
    timer = setInterval(() => {
      if (current && current.refresh && !document.hidden) current.refresh().catch(() => {});
    }, seconds * 1000);
  }
}

async function show() {
  const mine = ++generation;
  stopTimer();
  if (current && current.unmount) current.unmount();
  current = null;
  const route = decodeURIComponent(location.hash.replace(/^#/, '')) === '' ? '/' : location.hash.slice(1);
  for (const a of nav.querySelectorAll('a')) {
    const target = a.getAttribute('href').slice(1);
    a.classList.toggle('active', target === '/' ? route === '/' : route.startsWith(target));
  }
  main.replaceChildren();
  for (const [re, mount] of routes) {
    const m = route.match(re);
    if (!m) continue;
    const params = m.slice(1).map(decodeURIComponent);
    const page = await mount(main, params, { who });
    if (mine !== generation) {
      if (page && page.unmount) page.unmount();
      return;
    }
    current = page || null;
    startTimer();
    return;
  }
  main.append(h('h1', {}, 'Not found'), h('p', {}, 'No such page. ', h('a', { href: '#/' }, 'Overview')));
}

function showLogin(message) {
  stopTimer();
  if (current && current.unmount) current.unmount();
  current = null;
  who = null;
  nav.hidden = true;
  session.hidden = true;
  const error = h('p', { class: 'login-error', role: 'alert' }, message || '');
  main.replaceChildren(h('div', { class: 'login' },
    h('h1', {}, 'Warren management'),
    form({ id: 'login-form' }, async (f) => {
      const user = f.elements.username.value;
      setCredentials(user, f.elements.password.value);
      try {
        await enter();
      } catch (e) {
        clearCredentials();
        error.textContent = `Login failed: ${e.reason || e.message}`;
      }
    },
    field('Username', h('input', { name: 'username', autocomplete: 'username', required: true, autofocus: true })),
    field('Password', h('input', { name: 'password', type: 'password', autocomplete: 'current-password' })),
    h('button', { type: 'submit' }, 'Log in')),
    error));
  const u = main.querySelector('input[name=username]');
  if (u) u.focus();
}

async function enter() {
  who = await api('GET', 'whoami');
  const tags = Array.isArray(who.tags) ? who.tags : String(who.tags || '').split(',');
  who.tagList = tags.filter(Boolean);
  for (const a of nav.querySelectorAll('a[data-needs]')) {
    a.hidden = !who.tagList.includes(a.dataset.needs);
  }
  document.getElementById('whoami').textContent = `${who.name} (${who.tagList.join(', ') || 'no tags'})`;
  nav.hidden = false;
  session.hidden = false;
  await show();
}

whenUnauthenticated((e) => {
  if (who) {
    clearCredentials();
    showLogin(`Logged out: ${e.reason}`);
  }
});

document.getElementById('logout').addEventListener('click', () => {
  clearCredentials();
  showLogin('Logged out.');
});

const saved = sessionStorage.getItem('warren.console.interval');
if (saved !== null) intervalSelect.value = saved;
intervalSelect.addEventListener('change', () => {
  sessionStorage.setItem('warren.console.interval', intervalSelect.value);
  startTimer();
});

window.addEventListener('hashchange', () => {
  if (who) show().catch((e) => notify(e.message, 'error'));
});

if (currentUser()) {
  enter().catch((e) => {
    clearCredentials();
    showLogin(`Login failed: ${e.reason || e.message}`);
  });
} else {
  showLogin();
}

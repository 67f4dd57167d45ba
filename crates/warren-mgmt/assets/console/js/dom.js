// Small DOM helpers. Text always goes in through textContent, never as HTML.

/** `h('a', {href: '#/'}, 'text', child)`: an element with attributes and children. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'value') el.value = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Formats a count: 1234567 -> "1,234,567"; missing -> "". */
export function num(n) {
  return typeof n === 'number' ? n.toLocaleString('en-US') : '';
}

/** Formats a rate in messages per second ("12.3/s"); missing -> "". */
export function rate(r) {
  if (typeof r !== 'number' || !Number.isFinite(r)) return '';
  return `${r >= 100 ? Math.round(r).toLocaleString('en-US') : r.toFixed(1)}/s`;
}

export function bytes(n) {
  if (typeof n !== 'number') return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

/**
 * A table: `columns` are `[title, row => cell, {class}]`; a cell is text or a Node.
 * `rows` empty gives one "nothing" row.
 */
export function table(columns, rows, { empty = 'Nothing to show', id } = {}) {
  const head = h('tr', {}, columns.map(([t, , o]) => h('th', { class: o && o.class }, t)));
  const body = rows.length
    ? rows.map((r) => h('tr', {}, columns.map(([, f, o]) => h('td', { class: o && o.class }, f(r)))))
    : [h('tr', {}, h('td', { colspan: columns.length, class: 'empty' }, empty))];
  return h('table', { class: 'data', id }, h('thead', {}, head), h('tbody', {}, body));
}

/** A key/value table from `[key, value]` pairs. */
export function facts(pairs) {
  return h('table', { class: 'facts' }, pairs.map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', {}, v))));
}

/** Shows a message at the top of the page; `kind` is "ok" or "error". */
export function notify(text, kind = 'ok') {
  const box = document.getElementById('notices');
  const n = h('div', { class: `notice ${kind}`, role: kind === 'error' ? 'alert' : 'status' }, text,
    h('button', { type: 'button', class: 'close', 'aria-label': 'dismiss', onclick: () => n.remove() }, '×'));
  box.append(n);
  if (kind === 'ok') setTimeout(() => n.remove(), 6000);
  return n;
}

/** Runs `f`; an error is shown with the server's reason (prefixed with `what`). */
export async function attempt(what, f) {
  try {
    return await f();
  } catch (e) {
    notify(`${what}: ${e.reason || e.message}`, 'error');
    return undefined;
  }
}

/** A labelled form field. */
export function field(label, input) {
  return h('label', { class: 'field' }, h('span', {}, label), input);
}

/** A form whose submit runs `onsubmit(form)` (the default navigation is prevented). */
export function form(attrs, onsubmit, ...children) {
  return h('form', {
    ...attrs,
    onsubmit: (e) => {
      e.preventDefault();
      onsubmit(e.currentTarget);
    },
  }, ...children);
}

/** A section with a heading. */
export function section(title, ...children) {
  return h('section', {}, h('h2', {}, title), ...children);
}

/** "#/queues/<vhost>/<name>" for a queue. */
export function queueHref(vhost, name) {
  return `#/queues/${encodeURIComponent(vhost)}/${encodeURIComponent(name)}`;
}

/** A JSON value in short form ("" for an empty object). */
export function brief(v) {
  if (v === undefined || v === null) return '';
  if (typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length === 0) return '';
  return typeof v === 'string' ? v : JSON.stringify(v);
}

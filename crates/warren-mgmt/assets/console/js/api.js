// The management API as the console calls it: HTTP basic auth with the credentials from the
// login form (kept in this tab's sessionStorage), JSON in and out, and errors carrying the
// server's `reason` (RabbitMQ's `{"error": ..., "reason": ...}` bodies).

const KEY = 'warren.console.credentials';

/** A failed API call: `status` is the HTTP status, `reason` the server's text. */
export class ApiError extends Error {
  constructor(status, reason, error) {
    super(reason);
    this.status = status;
    this.reason = reason;
    this.error = error;
  }
}

function encodeBasic(user, password) {
  const bytes = new TextEncoder().encode(`${user}:${password}`);
  let bin = '';
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin);
}

/** Stores the credentials for this tab; they go out as `Authorization: Basic ...`. */
export function setCredentials(user, password) {
  sessionStorage.setItem(KEY, JSON.stringify({ user, basic: encodeBasic(user, password) }));
}

/** The user name logged in, or null. */
export function currentUser() {
  const c = sessionStorage.getItem(KEY);
  return c ? JSON.parse(c).user : null;
}

export function clearCredentials() {
  sessionStorage.removeItem(KEY);
}

let onUnauthenticated = () => {};
/** `f` runs when the server refuses the stored credentials (a 401 `not_authorized`). */
export function whenUnauthenticated(f) {
  onUnauthenticated = f;
}

/** `/`-separated path segments, each percent-encoded (a vhost `/` becomes `%2F`). */
export function path(...segments) {
  return segments.map((s) => encodeURIComponent(s)).join('/');
}

/**
 * Calls `method /api/<p>` with `body` as JSON (when given); resolves to the parsed JSON
 * reply, or null for an empty one (201/204). Rejects with an ApiError.
 */
export async function api(method, p, body, extraHeaders = {}) {
  const c = sessionStorage.getItem(KEY);
  const headers = { 'X-Requested-With': 'XMLHttpRequest', ...extraHeaders };
  if (c) headers.Authorization = `Basic ${JSON.parse(c).basic}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res;
  try {
    res = await fetch(`/api/${p}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      credentials: 'omit',
    });
  } catch (e) {
    throw new ApiError(0, `The broker cannot be reached (${e.message})`, 'network');
  }
  const text = await res.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = text;
    }
  }
  if (!res.ok) {
    const reason = (data && data.reason) || (typeof data === 'string' && data) || res.statusText || `HTTP ${res.status}`;
    const err = new ApiError(res.status, reason, data && data.error);
    if (res.status === 401 && (!data || data.error === 'not_authorized')) onUnauthenticated(err);
    throw err;
  }
  return data;
}

export const get = (p) => api('GET', p);

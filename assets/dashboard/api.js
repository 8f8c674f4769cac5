// The API token and calls to /api/v1. The token comes from the page's
// `#token=` fragment (never sent to the server) or the login form, lives in
// sessionStorage (gone with the tab), and is sent only in the
// Authorization header, never in a URL. `GET /whoami` tells the page the
// token's scope (read < operate < admin): views offer only what it allows
// (`can`), and the master refuses the rest anyway (403).

const KEY = 'flotilla.token';
const unauthorized = new Set();

/** Moves a `#token=...` fragment into sessionStorage and off the address bar. */
export function takeTokenFromFragment() {
  const m = location.hash.match(/^#token=([^&]+)/);
  if (!m) return;
  let t = m[1];
  try { t = decodeURIComponent(t); } catch { /* as given */ }
  sessionStorage.setItem(KEY, t);
  history.replaceState(null, '', location.pathname + location.search + '#/actors');
}

export const token = () => sessionStorage.getItem(KEY);
export const setToken = (t) => sessionStorage.setItem(KEY, t.trim());
export const forgetToken = () => sessionStorage.removeItem(KEY);

const RANK = { read: 0, operate: 1, admin: 2 };
let scope = null;

/** Asks the master for this token's scope (`GET /whoami`); the scope. */
export async function learnScope() {
  scope = (await api('GET', '/whoami')).token.scope;
  return scope;
}

/** Whether this token's scope allows what needs `needed` (`operate`, ...). */
export const can = (needed) => scope !== null && RANK[scope] >= RANK[needed];

/** `fn(error)` runs when the master refuses the token. */
export const onUnauthorized = (fn) => unauthorized.add(fn);

export function authHeaders(extra = {}) {
  return { Authorization: `Bearer ${token()}`, ...extra };
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** A refused token: tells everyone who asked, then throws. */
export function refused(status, code, message) {
  const e = new ApiError(status, code, message);
  if (status === 401) for (const fn of unauthorized) fn(e);
  return e;
}

/** `METHOD /api/v1PATH` with an optional JSON body; the parsed answer. */
export async function api(method, path, body, { signal } = {}) {
  const headers = authHeaders();
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let rsp;
  try {
    rsp = await fetch('/api/v1' + path, {
      method, headers, signal, cache: 'no-store',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, 'unreachable', `the master did not answer: ${e.message}`);
  }
  const text = await rsp.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { /* not JSON */ }
  if (!rsp.ok) {
    const err = (json && json.error) || {};
    throw refused(rsp.status, err.code || String(rsp.status), err.message || text || rsp.statusText);
  }
  return json;
}

/** Path segment escaping. */
export const seg = (s) => encodeURIComponent(s);

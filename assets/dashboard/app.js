// The dashboard's entry: the token, the login form, the one live event
// stream, and the router (`#/actors`, `#/clusters`, `#/clusters/NAME`,
// `#/operations[?cluster=NAME]`, `#/operations/ID`, `#/nodes`, `#/pools`,
// `#/events`).

import { api, forgetToken, learnScope, onUnauthorized, setToken, takeTokenFromFragment, token } from './api.js';
import { actorsView } from './actors.js';
import { clusterView, clustersView } from './clusters.js';
import { eventsView, remember } from './events.js';
import { Live } from './live.js';
import { watchMaster } from './masters.js';
import { nodesView, poolsView } from './nodes.js';
import { operationView, operationsView } from './operations.js';
import { fill, h } from './ui.js';

const ROUTES = {
  actors: [actorsView, null],
  clusters: [clustersView, clusterView],
  operations: [operationsView, operationView],
  nodes: [nodesView, null],
  pools: [poolsView, null],
  events: [eventsView, null],
};

const main = document.getElementById('main');
const liveBadge = document.getElementById('live');
const logout = document.getElementById('logout');
const scopeBadge = document.getElementById('scope');
const live = new Live();
// For a look from the browser's console (and the browser test, which cuts
// the stream to check the resume): `flotilla.live`.
window.flotilla = { live };
let unmount = null;
let started = false;

function route() {
  unmount?.();
  unmount = null;
  const raw = location.hash.replace(/^#\/?/, '');
  const [path, qs] = raw.split('?');
  const parts = path.split('/').filter(Boolean).map((p) => {
    try { return decodeURIComponent(p); } catch { return p; }
  });
  const name = Object.hasOwn(ROUTES, parts[0] ?? '') ? parts[0] : 'actors';
  const [list, one] = ROUTES[name];
  for (const a of document.querySelectorAll('#nav a')) a.classList.toggle('active', a.dataset.view === name);
  const view = parts.length > 1 && one ? one : list;
  main.replaceChildren();
  unmount = view(main, { live, params: parts.slice(1), query: new URLSearchParams(qs || '') }) || null;
}

function login(message) {
  unmount?.();
  unmount = null;
  logout.hidden = true;
  const input = h('input', { type: 'password', id: 'token-input', autocomplete: 'off', placeholder: 'flt_…' });
  const err = h('p', { class: 'error-text' }, message || '');
  const submit = async (ev) => {
    ev.preventDefault();
    setToken(input.value);
    try {
      await api('GET', '/health');
      await api('GET', '/nodes?limit=1');
      start();
    } catch (e) {
      forgetToken();
      fill(err, e.status === 401 ? 'The master refused this token.' : e.message);
    }
  };
  fill(main, h('div', { class: 'panel login' },
    h('h1', {}, 'Sign in'),
    h('p', {}, 'Paste an API token (', h('code', {}, 'flotilla token create'), ', or the one ', h('code', {}, 'flotilla dev'),
      ' prints). It stays in this tab only and is sent in the Authorization header.'),
    h('form', { onsubmit: submit }, input, h('button', { type: 'submit' }, 'Sign in')),
    err));
  input.focus();
}

async function start() {
  logout.hidden = false;
  // What this token may do, before any view draws its buttons: a view
  // shows the verbs of `operate` only to a token that has it.
  try {
    const scope = await learnScope();
    scopeBadge.textContent = scope;
    scopeBadge.title = scope === 'read' ? 'This token can look, not act' : `This token's scope: ${scope}`;
    scopeBadge.hidden = false;
  } catch (e) {
    if (e.status === 401) return; // the login form is shown
    scopeBadge.textContent = 'scope unknown';
    scopeBadge.hidden = false;
  }
  if (!started) {
    started = true;
    watchMaster();
    live.subscribe(remember);
    live.run();
    window.addEventListener('hashchange', route);
  }
  // Views read their data once the stream is live, so nothing that
  // happens in between is missed (or 2 s, if the stream is slow to come).
  await Promise.race([live.connected, new Promise((r) => setTimeout(r, 2000))]);
  route();
}

live.onState((state, detail) => {
  liveBadge.className = `live ${state === 'live' ? 'on' : 'off'}`;
  liveBadge.title = detail || 'The event stream';
  liveBadge.textContent = state === 'live' ? 'live' : state;
});
// How far behind the master the page is: the last event's age on arrival
// (and the most since the page opened, for whoever measures it).
setInterval(() => {
  if (live.state !== 'live' || live.lagMs === null) return;
  liveBadge.textContent = `live · ${live.lagMs} ms behind`;
  liveBadge.dataset.maxLagMs = live.maxLagMs;
}, 250);

onUnauthorized(() => {
  forgetToken();
  login('The master refused the token (revoked, or wrong). Sign in again.');
});
logout.addEventListener('click', () => { forgetToken(); location.hash = ''; location.reload(); });

takeTokenFromFragment();
if (token()) start(); else login();

// Nodes: status (and a cordon), lifecycle and origin (an agent started by
// hand, or the pool that launched it), heartbeat age, address, instances,
// simulated or real, a page at a time. Status changes arrive as events; heartbeat ages are
// sampled (read every 2 s while this view is open and the tab visible).
//
// Pools (in this file, beside the nodes they launch): one card per node
// pool (driver, labels, priority, nodes by lifecycle state, size, requests
// waiting, health and last error), then the node requests, newest first.
// Read again on the pools' events (coalesced) and every 5 s while the tab
// is visible (a pause or a lack of capacity ends without an event).

import { api, seg } from './api.js';
import { Pager, age, badge, coalescer, fill, h, sequencer, table, when } from './ui.js';

const PAGE = 200;
const REQUEST_PAGE = 50;
/** A pool node's lifecycle states, in order. */
const LIFECYCLE = ['launching', 'enrolling', 'ready', 'draining', 'deleting', 'failed'];
/** The events of pool nodes (`node.status` is an agent's link, not these). */
const POOL_NODE_EVENTS = new Set(['node.launching', 'node.enrolling', 'node.ready', 'node.launch_failed', 'node.adopted',
  'node.gone', 'node.failed', 'node.draining', 'node.deleting', 'node.remove_refused', 'node.held', 'node.released', 'node.leak_found', 'node.leak_removed']);
const isPoolEvent = (kind) => kind.startsWith('node_request.') || POOL_NODE_EVENTS.has(kind);

const labelText = (labels) => Object.entries(labels || {}).map(([k, v]) => `${k}=${v}`).join(' ');

/** `manual`, or `pool NAME` with the provider's id of its machine. */
function origin(o) {
  if (!o) return '–';
  if (o.kind !== 'provider') return o.kind;
  return [h('span', { class: 'origin-pool' }, 'pool ', h('a', { href: '#/pools' }, o.pool ?? '?')),
    o.external_id ? h('div', { class: 'muted mono', title: 'its id at the provider' }, o.external_id) : null];
}

const lifecycle = (state) => badge(state, {
  title: 'Where the node is in its life (a manual node: ready or cordoned); Status is its agent link',
});

export function nodesView(root, { live }) {
  const info = h('p', { class: 'muted' });
  const { table: t, body } = table([
    ['Node'], ['Status'], ['Lifecycle'], ['Origin'], ['Connected'], ['Kind'], ['Address'], ['Heartbeat age', 'num'],
    ['Instances', 'num'], ['Ports'], ['Agent'], ['Labels'],
  ], { id: 'nodes' });
  const pager = new Pager(() => refresh());
  fill(root, h('h1', {}, 'Nodes'), info, t, pager.el);
  let timer = null;
  let stopped = false;

  const row = (n) => h('tr', { dataset: { node: n.id } },
    h('td', { class: 'mono' }, n.id),
    h('td', { class: 'status' }, badge(n.status),
      n.cordon ? [' ', h('span', { class: 'badge warn cordon', title: `since ${n.cordon.since}: ${n.cordon.reason || 'no reason given'}` }, 'cordoned')] : null),
    h('td', { class: 'lifecycle' }, n.lifecycle ? lifecycle(n.lifecycle) : '–'),
    h('td', { class: 'origin' }, origin(n.origin)),
    h('td', { class: 'connected' }, n.connected ? 'yes' : 'no'),
    h('td', {}, n.simulated ? h('span', { class: 'badge warn', title: 'flotilla bench: the real protocol, no real processes' }, 'simulated') : 'real'),
    h('td', { class: 'mono' }, n.address),
    h('td', { class: 'num' }, age(n.heartbeat_age_ms)),
    h('td', { class: 'num' }, n.instance_count),
    h('td', { class: 'mono' }, `${n.port_range[0]}–${n.port_range[1]}`),
    h('td', {}, n.agent_version),
    h('td', { class: 'mono' }, labelText(n.labels)));

  async function refresh() {
    if (stopped) return;
    clearTimeout(timer);
    try {
      const { after } = pager;
      const r = await api('GET', `/nodes?limit=${PAGE}${after ? `&after=${seg(after)}` : ''}`);
      fill(body, r.nodes.map(row));
      pager.shown(r.next);
      const ready = r.nodes.filter((n) => n.status === 'Ready').length;
      fill(info, `${r.total} nodes · this page: ${ready} ready of ${r.nodes.length}`);
    } catch (e) {
      fill(info, h('span', { class: 'error-text' }, e.message));
    }
    if (!stopped) timer = setTimeout(tick, 2000);
  }
  function tick() {
    if (document.visibilityState === 'visible') refresh(); else timer = setTimeout(tick, 2000);
  }

  const off = live.subscribe((e) => {
    const tr = e.data?.node && body.querySelector(`tr[data-node="${CSS.escape(e.data.node)}"]`);
    if (!tr) return;
    if (e.kind === 'node.status') {
      const cordon = tr.querySelector('.cordon');
      fill(tr.querySelector('.status'), badge(e.data.status), cordon ? [' ', cordon] : null);
      fill(tr.querySelector('.connected'), e.data.connected ? 'yes' : 'no');
    } else if (POOL_NODE_EVENTS.has(e.kind) && LIFECYCLE.includes(e.data.state)) {
      // A ready node with a cordon is `cordoned`, as the master says it.
      const state = e.data.state === 'ready' && tr.querySelector('.cordon') ? 'cordoned' : e.data.state;
      fill(tr.querySelector('.lifecycle'), lifecycle(state));
    }
  });
  refresh();
  return () => { stopped = true; clearTimeout(timer); off(); };
}

const HEALTH_CLASS = { ok: 'ok', paused: 'warn', no_capacity: 'warn', broken: 'bad', unhealthy: 'bad' };

/** Why a pool's health is what it is (nothing when it is ok). */
function healthWhy(p) {
  const d = p.health_detail || {};
  switch (p.health) {
    case 'broken': return `its settings: ${d.broken ?? 'see its last error'}`;
    case 'unhealthy': return `a launch failed past its retries: ${d.unhealthy ?? 'see its last error'}`;
    case 'paused': return `the provider's quota: no launch until ${when(d.paused_until)}`;
    case 'no_capacity': return `the provider has no capacity: requests declined until ${when(d.no_capacity_until)}`;
    default: return null;
  }
}

/** A request's id, shortened: its random tail (the whole id in its title). */
function shortId(id) {
  const s = String(id ?? '');
  const dash = s.lastIndexOf('-');
  const short = dash > 0 && dash < s.length - 1 ? `…${s.slice(dash + 1)}` : (s.length > 12 ? `${s.slice(0, 12)}…` : s);
  return h('span', { class: 'mono', title: s }, short);
}

function stateCounts(p) {
  const by = p.nodes_by_state || {};
  const states = [...LIFECYCLE, ...Object.keys(by).filter((s) => !LIFECYCLE.includes(s))];
  return h('span', { class: 'counts pool-states' }, states.map((s) => {
    const n = by[s] ?? 0;
    return n ? badge(s, { label: `${n} ${s}` }) : h('span', { class: 'badge zero', 'data-status': s }, `0 ${s}`);
  }));
}

function poolNodes(p) {
  const nodes = p.nodes || [];
  if (!nodes.length) return h('p', { class: 'muted' }, 'No nodes launched.');
  const { table: t, body } = table([
    ['Node'], ['State'], ['External id'], ['Request'], ['Attempt', 'num'], ['Since'], ['Held until'], ['Last error'],
  ], { class: 'pool-nodes' });
  fill(body, nodes.map((n) => h('tr', { dataset: { node: n.node } },
    h('td', { class: 'mono' }, n.node),
    h('td', {}, badge(n.state)),
    h('td', { class: 'mono' }, n.external_id ?? '–'),
    h('td', {}, n.request ? shortId(n.request) : '–'),
    h('td', { class: 'num' }, n.attempt),
    h('td', {}, when(n.state_since)),
    h('td', {}, n.held_until ? when(n.held_until) : '–'),
    h('td', { class: 'error-text' }, n.last_error ?? ''))));
  const troubled = nodes.some((n) => n.state === 'failed' || n.last_error);
  return h('details', { open: troubled }, h('summary', {}, `${nodes.length} node${nodes.length === 1 ? '' : 's'}`), t);
}

function poolCard(p) {
  const cls = HEALTH_CLASS[p.health] ?? 'warn';
  const why = healthWhy(p);
  const total = Object.values(p.nodes_by_state || {}).reduce((a, b) => a + b, 0);
  const d = p.health_detail || {};
  const field = (label, ...value) => [h('span', { class: 'muted' }, label), h('span', {}, ...value)];
  return h('section', { class: `panel pool health-${cls}`, dataset: { pool: p.name, health: p.health } },
    h('div', { class: 'pool-head' },
      h('h2', { class: 'pool-name' }, p.name),
      h('span', { class: 'pool-health' }, badge(p.health, { title: why ?? 'launching and serving requests' })),
      h('span', { class: 'muted' }, `driver ${p.driver} · priority ${p.priority}`)),
    why ? h('p', { class: `pool-why ${cls}-text` }, why) : null,
    h('div', { class: 'grid' },
      field('Labels', h('span', { class: 'mono' }, labelText(p.labels) || 'none (any request)')),
      field('Nodes', stateCounts(p)),
      field('Size', `${total} of at most ${p.capacity ?? p.max_nodes}${p.capacity < p.max_nodes ? ' (max_cpu/max_memory)' : ''} · ${p.min_ready} kept ready`),
      field('Requests waiting', h('span', { class: 'pool-waiting' }, p.requests_waiting)),
      field('Launches', `${p.launch_retries} retries · ${p.max_disrupting} disrupted at once`),
      d.leaked ? field('Leaked', h('span', { class: 'warn-text' }, `${d.leaked} resources tagged for it that the master does not know`)) : null,
      field('Tags', h('span', { class: 'mono' }, labelText(p.tags) || '–')),
      field('Last error', p.last_error ? h('span', { class: 'error-text pool-error' }, p.last_error) : '–')),
    poolNodes(p));
}

export function poolsView(root, { live }) {
  const info = h('p', { class: 'muted' });
  const cards = h('div', { id: 'pools', class: 'pools' });
  const reqInfo = h('p', { class: 'muted' });
  const { table: t, body } = table([
    ['Request'], ['Created'], ['Labels'], ['Count', 'num'], ['Requestor'], ['Priority', 'num'], ['State'], ['Pool'],
    ['Nodes'], ['Reasons'],
  ], { id: 'node-requests' });
  const pager = new Pager(() => loadRequests(), { back: '← Newer', forward: 'Older →' });
  fill(root, h('h1', {}, 'Node pools'), info, cards, h('h2', {}, 'Node requests'), reqInfo, t, pager.el);
  let timer = null;
  let stopped = false;

  async function loadPools(ticket) {
    const r = await api('GET', '/pools');
    if (stopped || !ticket.latest()) return;
    if (!r.pools.length) {
      fill(info, '');
      fill(cards, h('div', { class: 'panel', id: 'pools-empty' },
        'This master has no node pools: add ', h('code', {}, '[[node_pools]]'), ' to its config.'));
      return;
    }
    const bad = r.pools.filter((p) => p.health !== 'ok').length;
    fill(info, `${r.pools.length} pool${r.pools.length === 1 ? '' : 's'}, by priority`, bad ? ` · ${bad} not ok` : '');
    fill(cards, r.pools.map(poolCard));
  }

  const reqRow = (r) => {
    const declined = r.state === 'failed' || (r.declined_by || []).length > 0;
    return h('tr', { dataset: { request: r.id, state: r.state } },
      h('td', {}, shortId(r.id)),
      h('td', {}, when(r.created_at)),
      h('td', { class: 'mono' }, labelText(r.labels) || 'any'),
      h('td', { class: 'num' }, r.count),
      h('td', { class: 'mono' }, r.requestor),
      h('td', { class: 'num' }, r.priority),
      h('td', { class: 'state' }, badge(r.state)),
      h('td', {}, r.pool ?? '–'),
      h('td', { class: 'mono' }, (r.nodes || []).join(' ')),
      h('td', { class: `reasons ${r.state === 'failed' ? 'error-text' : 'muted'}` },
        declined ? (r.reasons || []).map((s) => h('div', {}, s)) : null));
  };

  async function loadRequests(ticket = requestReads()) {
    try {
      const { after } = pager;
      const r = await api('GET', `/node-requests?limit=${REQUEST_PAGE}${after ? `&after=${seg(after)}` : ''}`);
      if (stopped || !ticket.latest()) return;
      fill(body, r.node_requests.map(reqRow));
      pager.shown(r.next);
      fill(reqInfo, r.node_requests.length ? '' : 'No node requests.');
    } catch (e) {
      if (!stopped) fill(reqInfo, h('span', { class: 'error-text' }, e.message));
    }
  }

  const poolReads = sequencer();
  const requestReads = sequencer();
  async function refresh() {
    if (stopped) return;
    clearTimeout(timer);
    const ticket = poolReads();
    await Promise.all([
      loadPools(ticket).catch((e) => { if (!stopped) fill(info, h('span', { class: 'error-text' }, e.message)); }),
      loadRequests(),
    ]);
    if (!stopped && ticket.latest()) timer = setTimeout(tick, 5000);
  }
  function tick() {
    if (document.visibilityState === 'visible') refresh(); else timer = setTimeout(tick, 5000);
  }

  const soon = coalescer(300);
  const off = live.subscribe((e) => { if (isPoolEvent(e.kind)) soon('all', refresh); });
  const offResync = live.onResync(refresh);
  refresh();
  return () => { stopped = true; clearTimeout(timer); off(); offResync(); };
}

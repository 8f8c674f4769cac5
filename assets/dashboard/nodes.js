// Nodes: status (and a cordon), heartbeat age, address, instances,
// simulated or real, a page at a time. Status changes arrive as events; heartbeat ages are
// sampled (read every 2 s while this view is open and the tab visible).

import { api, seg } from './api.js';
import { Pager, age, badge, fill, h, table } from './ui.js';

const PAGE = 200;

export function nodesView(root, { live }) {
  const info = h('p', { class: 'muted' });
  const { table: t, body } = table([
    ['Node'], ['Status'], ['Connected'], ['Kind'], ['Address'], ['Heartbeat age', 'num'], ['Instances', 'num'],
    ['Ports'], ['Agent'], ['Labels'],
  ], { id: 'nodes' });
  const pager = new Pager(() => refresh());
  fill(root, h('h1', {}, 'Nodes'), info, t, pager.el);
  let timer = null;
  let stopped = false;

  const row = (n) => h('tr', { dataset: { node: n.id } },
    h('td', { class: 'mono' }, n.id),
    h('td', { class: 'status' }, badge(n.status),
      n.cordon ? [' ', h('span', { class: 'badge warn cordon', title: `since ${n.cordon.since}: ${n.cordon.reason || 'no reason given'}` }, 'cordoned')] : null),
    h('td', { class: 'connected' }, n.connected ? 'yes' : 'no'),
    h('td', {}, n.simulated ? h('span', { class: 'badge warn', title: 'flotilla bench: the real protocol, no real processes' }, 'simulated') : 'real'),
    h('td', { class: 'mono' }, n.address),
    h('td', { class: 'num' }, age(n.heartbeat_age_ms)),
    h('td', { class: 'num' }, n.instance_count),
    h('td', { class: 'mono' }, `${n.port_range[0]}–${n.port_range[1]}`),
    h('td', {}, n.agent_version),
    h('td', { class: 'mono' }, Object.entries(n.labels || {}).map(([k, v]) => `${k}=${v}`).join(' ')));

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
    if (e.kind !== 'node.status') return;
    const tr = body.querySelector(`tr[data-node="${CSS.escape(e.data.node)}"]`);
    if (!tr) return;
    const cordon = tr.querySelector('.cordon');
    fill(tr.querySelector('.status'), badge(e.data.status), cordon ? [' ', cordon] : null);
    fill(tr.querySelector('.connected'), e.data.connected ? 'yes' : 'no');
  });
  refresh();
  return () => { stopped = true; clearTimeout(timer); off(); };
}

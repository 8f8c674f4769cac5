// Actors: the live supervision tree, as Erlang's observer shows it. The
// supervisor, its cluster actors (each expandable to its instance actors)
// and its node managers, with state, mailbox depth, the age of the oldest
// waiting message, messages per second, what each handles now and for how
// long, and its last error. Mailboxes and rates are sampled: read once a
// second while this view is open and the tab visible; actor events
// (started, stopped, failed) are applied at once.

import { api, seg } from './api.js';
import { age, badge, coalescer, fill, h, table } from './ui.js';

const STUCK_MS = 5000;
const INSTANCE_PAGE = 500;

function isFailed(a) {
  return ['Error', 'Failed', 'failed', 'escalated', 'RolledBack'].includes(a.state) || Boolean(a.last_error && a.kind !== 'instance');
}

export function actorsView(root, { live }) {
  const expanded = new Set(JSON.parse(sessionStorage.getItem('flotilla.expanded') || '[]'));
  const rates = new Map();
  const info = h('p', { class: 'muted' });
  const { table: t, body } = table([
    ['Actor'], ['State'], ['Mailbox', 'num'], ['Oldest message', 'num'], ['Msgs/s', 'num'], ['Handling now'], ['Last error'],
  ], { class: 'actors', id: 'actor-tree' });
  fill(root, h('h1', {}, 'Actors'), info, t);
  let timer = null;
  let stopped = false;

  const rate = (a) => {
    const key = `${a.kind}/${a.id}`;
    const now = performance.now();
    const prev = rates.get(key);
    rates.set(key, { handled: a.handled, at: now });
    if (!prev || now - prev.at < 200) return null;
    return Math.max(0, (a.handled - prev.handled) / ((now - prev.at) / 1000));
  };

  const row = (a, depth, extra = null) => {
    const stuck = (a.oldest_message_ms ?? 0) > STUCK_MS || (a.current_ms ?? 0) > 6 * STUCK_MS;
    const cls = isFailed(a) ? 'failed' : stuck ? 'stuck' : '';
    const r = rate(a);
    return h('tr', { class: `actor-row ${cls}`, dataset: { kind: a.kind, id: a.id } },
      h('td', { class: 'name' }, h('span', { class: `indent d${depth}` }),
        extra, h('span', { class: 'kind' }, a.kind), ' ', a.id),
      h('td', {}, badge(a.state)),
      h('td', { class: 'num' }, a.mailbox ?? 0),
      h('td', { class: 'num' }, a.oldest_message_ms == null ? '–' : age(a.oldest_message_ms)),
      h('td', { class: 'num' }, r === null ? '…' : r.toFixed(r < 10 ? 1 : 0)),
      h('td', {}, a.current ? `${a.current} (${age(a.current_ms)})` : h('span', { class: 'muted' }, 'idle')),
      h('td', { class: 'error-text' }, a.last_error ?? ''));
  };

  const toggle = (name) => {
    if (expanded.has(name)) expanded.delete(name); else expanded.add(name);
    sessionStorage.setItem('flotilla.expanded', JSON.stringify([...expanded]));
    refresh();
  };

  async function load() {
    const top = await api('GET', '/actors?limit=0');
    const under = new Map();
    await Promise.all([...expanded].map(async (name) => {
      try {
        under.set(name, await api('GET', `/actors?cluster=${seg(name)}&limit=${INSTANCE_PAGE}`));
      } catch (e) {
        if (e.status === 404) expanded.delete(name); else throw e;
      }
    }));
    return { top, under };
  }

  function render({ top, under }) {
    const actors = top.actors.filter((a) => a.kind !== 'instance');
    const sup = actors.filter((a) => a.kind === 'supervisor');
    const clusters = actors.filter((a) => a.kind === 'cluster').sort((a, b) => a.id.localeCompare(b.id));
    const nodes = actors.filter((a) => a.kind === 'node_manager').sort((a, b) => a.id.localeCompare(b.id, undefined, { numeric: true }));
    const rows = [];
    for (const s of sup) rows.push(row(s, 0));
    for (const c of clusters) {
      const open = expanded.has(c.id);
      const tog = h('span', { class: 'toggle', title: 'instance actors', onclick: () => toggle(c.id) }, open ? '▾' : '▸');
      rows.push(row(c, 1, tog));
      if (open && under.has(c.id)) {
        const page = under.get(c.id);
        const insts = page.actors.filter((a) => a.kind === 'instance');
        for (const i of insts) rows.push(row(i, 2));
        if (page.instance_actors > insts.length) {
          rows.push(h('tr', {}, h('td', { colspan: 7, class: 'muted indent-note' },
            `… ${page.instance_actors - insts.length} more instance actors (the cluster's page lists them all)`)));
        }
      }
    }
    for (const n of nodes) rows.push(row(n, 1));
    fill(body, rows);
    // Rates only of the actors shown: none kept for actors gone or folded.
    const shown = new Set(rows.map((r) => r.dataset.kind && `${r.dataset.kind}/${r.dataset.id}`));
    for (const k of [...rates.keys()]) if (!shown.has(k)) rates.delete(k);
    const failed = actors.filter(isFailed).length;
    fill(info, `${clusters.length} cluster actors, ${nodes.length} node managers, ${top.instance_actors} instance actors`,
      failed ? h('span', { class: 'error-text' }, ` · ${failed} failed`) : '',
      ' · sampled every second while this page is visible');
  }

  async function refresh() {
    if (stopped) return;
    clearTimeout(timer);
    try {
      render(await load());
    } catch (e) {
      fill(info, h('span', { class: 'error-text' }, e.message));
    }
    if (!stopped) timer = setTimeout(tick, 1000);
  }
  function tick() {
    if (document.visibilityState === 'visible') refresh(); else timer = setTimeout(tick, 1000);
  }

  const soon = coalescer(150);
  const off = live.subscribe((e) => { if (e.kind.startsWith('actor.')) soon('actors', refresh); });
  refresh();
  return () => { stopped = true; clearTimeout(timer); off(); };
}

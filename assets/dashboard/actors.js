// Actors: the live supervision tree, as Erlang's observer shows it, drawn
// from the supervision links the master declares (`parent`, `strategy`):
// the master's supervised tasks, the supervisor, its cluster actors (each
// expandable to its instance actors) and its node managers. Each row: its
// health (red: failed; amber: restarting, a message waiting over 5 s, a
// handler busy over 30 s), state, mailbox depth and messages per second
// with a sparkline of the last 5 minutes, the age of the oldest waiting
// message, what it handles now and for how long, restarts, last exit and
// last error; kill and restart behind a confirm for an admin token. Sort
// by mailbox, oldest message or restarts; filter by kind. Sampled once a
// second while this view is open and the tab visible (the history lives in
// the page: nothing is sampled for it on the master while no one looks);
// actor events (started, stopped, failed) are applied at once.

import { api, can, seg } from './api.js';
import { age, badge, coalescer, confirmDialog, fill, h, table, toast } from './ui.js';

const INSTANCE_PAGE = 500;
const HISTORY = 300; // samples: 5 minutes at one a second

const SVG = 'http://www.w3.org/2000/svg';

/** A sparkline of `values` (at most HISTORY), scaled to its own maximum. */
function spark(values, label) {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('viewBox', `0 0 ${HISTORY} 20`);
  svg.setAttribute('preserveAspectRatio', 'none');
  const max = Math.max(1, ...values);
  const off = HISTORY - values.length;
  const pts = values.map((v, i) => `${off + i},${(20 - (v / max) * 18 - 1).toFixed(1)}`).join(' ');
  const line = document.createElementNS(SVG, 'polyline');
  line.setAttribute('points', pts);
  svg.appendChild(line);
  const title = document.createElementNS(SVG, 'title');
  title.textContent = `${label}: last ${values.length} s, max ${max.toFixed(max < 10 ? 1 : 0)}`;
  svg.appendChild(title);
  return svg;
}

const key = (a) => `${a.kind}/${a.id}`;

export function actorsView(root, { live }) {
  const expanded = new Set(JSON.parse(sessionStorage.getItem('flotilla.expanded') || '[]'));
  const history = new Map(); // key -> { handled, at, mailbox: [], rate: [] }
  const info = h('p', { class: 'muted' });
  const sortBy = h('select', { id: 'actor-sort', onchange: () => refresh() },
    h('option', { value: 'tree' }, 'tree order'),
    h('option', { value: 'mailbox' }, 'mailbox depth'),
    h('option', { value: 'oldest' }, 'oldest message'),
    h('option', { value: 'restarts' }, 'restarts'));
  const kindFilter = h('select', { id: 'actor-kind', onchange: () => refresh() },
    h('option', { value: '' }, 'every kind'),
    ...['supervisor', 'cluster', 'instance', 'node_manager', 'agent_listener', 'node_watcher', 'leaked_sweep']
      .map((k) => h('option', { value: k }, k)));
  const controls = h('p', { class: 'controls' }, 'Sort by ', sortBy, ' · show ', kindFilter);
  const { table: t, body } = table([
    ['Actor'], ['State'], ['Mailbox', 'num'], ['Msgs/s', 'num'], ['Oldest message', 'num'], ['Handling now'],
    ['Restarts', 'num'], ['Last exit'], ['Last error'], [''],
  ], { class: 'actors', id: 'actor-tree' });
  fill(root, h('h1', {}, 'Actors'), info, controls, t);
  let timer = null;
  let stopped = false;

  /** Records a sample of `a`; its history. */
  const sample = (a) => {
    const now = performance.now();
    let s = history.get(key(a));
    if (!s) {
      s = { handled: a.handled, at: now, mailbox: [], rate: [], last: null };
      history.set(key(a), s);
    } else if (now - s.at >= 200) {
      const r = Math.max(0, (a.handled - s.handled) / ((now - s.at) / 1000));
      s.rate.push(r);
      s.mailbox.push(a.mailbox ?? 0);
      if (s.rate.length > HISTORY) s.rate.shift();
      if (s.mailbox.length > HISTORY) s.mailbox.shift();
      s.handled = a.handled;
      s.at = now;
      s.last = r;
    }
    return s;
  };

  const verb = async (a, what) => {
    const words = what === 'kill'
      ? `Kill ${a.kind} ${a.id}? It stops as if it failed; its supervisor acts on it (${a.strategy}).`
      : `Restart ${a.kind} ${a.id}? It starts again from its stored records.`;
    if (!await confirmDialog(`${what === 'kill' ? 'Kill' : 'Restart'} ${a.kind} ${a.id}`, h('p', {}, words),
      { ok: what === 'kill' ? 'Kill' : 'Restart', danger: what === 'kill' })) return;
    try {
      const r = await api('POST', `/actors/${seg(a.kind)}/${seg(a.id)}/${what}`);
      toast(r.done);
    } catch (e) {
      toast(`${e.code ?? 'error'}: ${e.message}`, 'bad');
    }
    refresh();
  };

  const row = (a, depth, extra = null) => {
    const cls = a.health === 'red' ? 'failed' : a.health === 'amber' ? 'stuck' : '';
    const s = sample(a);
    const actions = [];
    // The root's children whose death ends the master have no verb.
    if (can('admin') && a.kind !== 'supervisor' && a.kind !== 'store_writer') {
      if (a.state === 'failed') actions.push(h('button', { class: 'small', dataset: { verb: 'restart' }, onclick: () => verb(a, 'restart') }, 'Restart'));
      else actions.push(h('button', { class: 'small danger', dataset: { verb: 'kill' }, onclick: () => verb(a, 'kill') }, 'Kill'));
    }
    const exit = a.last_exit ? `${a.last_exit.reason} (${age(a.last_exit.age_ms)} ago)` : '';
    const err = a.last_error ? `${a.last_error}${a.last_error_age_ms != null ? ` (${age(a.last_error_age_ms)} ago)` : ''}` : '';
    return h('tr', { class: `actor-row ${cls}`, dataset: { kind: a.kind, id: a.id, health: a.health ?? '' } },
      h('td', { class: 'name', title: a.strategy ?? '' }, h('span', { class: `indent d${depth}` }),
        extra, h('span', { class: 'kind' }, a.kind), ' ', a.id),
      h('td', {}, badge(a.state)),
      h('td', { class: 'num' }, String(a.mailbox ?? 0), ' ', spark(s.mailbox, 'mailbox depth')),
      h('td', { class: 'num' }, s.last === null ? '…' : s.last.toFixed(s.last < 10 ? 1 : 0), ' ', spark(s.rate, 'messages per second')),
      h('td', { class: 'num' }, a.oldest_message_ms == null ? '–' : age(a.oldest_message_ms)),
      h('td', {}, a.current ? `${a.current} (${age(a.current_ms)})` : h('span', { class: 'muted' }, 'idle')),
      h('td', { class: 'num' }, String(a.restarts ?? 0)),
      h('td', { class: 'muted' }, exit),
      h('td', { class: 'error-text' }, err),
      h('td', {}, ...actions));
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

  /** A master of the installation as `GET /actors` lists it (`masters`). */
  function masterText(m) {
    const term = m.term != null ? `, term ${m.term}` : '';
    const pid = m.pid != null ? `, pid ${m.pid}` : '';
    return `${m.role}${term}${pid}`;
  }

  /** The supervision tree: each actor under the one its `parent` names;
   * on etcd, this master is the root and each other master a root of its
   * own beside it (a process of its own: not in this tree). */
  function treeRows(actors, under, masters) {
    const byParent = new Map();
    for (const a of actors) {
      // `master`, `supervisor` (the supervisor's id) or `kind/id`.
      const p = a.parent ?? '';
      const parent = p.includes('/') ? p : p === 'master' || p === '' ? 'master' : `${p}/${p}`;
      if (!byParent.has(parent)) byParent.set(parent, []);
      byParent.get(parent).push(a);
    }
    for (const list of byParent.values()) list.sort((a, b) => a.kind.localeCompare(b.kind) || a.id.localeCompare(b.id, undefined, { numeric: true }));
    const rows = [];
    const walk = (parent, depth) => {
      for (const a of byParent.get(parent) ?? []) {
        if (a.kind === 'cluster') {
          const open = expanded.has(a.id);
          const tog = h('span', { class: 'toggle', title: 'instance actors', onclick: () => toggle(a.id) }, open ? '▾' : '▸');
          rows.push(row(a, depth, tog));
          if (open && under.has(a.id)) {
            const page = under.get(a.id);
            const insts = page.actors.filter((i) => i.kind === 'instance');
            for (const i of insts) rows.push(row(i, depth + 1));
            if (page.instance_actors > insts.length) {
              rows.push(h('tr', {}, h('td', { colspan: 10, class: 'muted indent-note' },
                `… ${page.instance_actors - insts.length} more instance actors (the cluster's page lists them all)`)));
            }
          }
        } else {
          rows.push(row(a, depth));
        }
        walk(`${a.kind}/${a.id}`, depth + 1);
      }
    };
    const me = masters.find((m) => m.this);
    rows.push(h('tr', { class: 'actor-row', dataset: { kind: 'master', id: 'master' } },
      h('td', { class: 'name', title: 'the root: restarted by the service manager' }, h('span', { class: 'kind' }, 'master'),
        me ? ` ${me.name}` : ''),
      h('td', { colspan: 9, class: 'muted' }, me ? `this master: ${masterText(me)} · ` : '',
        'the root (its store writer and supervisor end it if they fail)')));
    walk('master', 1);
    for (const m of masters.filter((x) => !x.this)) {
      rows.push(h('tr', { class: 'actor-row peer-master', dataset: { kind: 'master', id: m.name } },
        h('td', { class: 'name', title: 'another master: a process of its own, supervised by its service manager' },
          h('span', { class: 'kind' }, 'master'), ` ${m.name}`),
        h('td', { colspan: 9, class: m.role === 'unreachable' ? 'error-text' : 'muted' }, `${masterText(m)} · `,
          /^https?:\/\//.test(m.api_url) ? h('a', { href: `${m.api_url}/api/v1/health` }, 'its health') : m.api_url,
          m.error ? ` · ${m.error}` : '')));
    }
    return rows;
  }

  function render({ top, under }) {
    const actors = top.actors.filter((a) => a.kind !== 'instance');
    const insts = [...under.values()].flatMap((p) => p.actors.filter((a) => a.kind === 'instance'));
    const kind = kindFilter.value;
    let rows;
    if (sortBy.value === 'tree' && !kind) {
      rows = treeRows(actors, under, top.masters ?? []);
    } else {
      const pick = { mailbox: (a) => a.mailbox ?? 0, oldest: (a) => a.oldest_message_ms ?? -1, restarts: (a) => a.restarts ?? 0, tree: () => 0 }[sortBy.value];
      rows = [...actors, ...insts]
        .filter((a) => !kind || a.kind === kind)
        .sort((a, b) => pick(b) - pick(a) || key(a).localeCompare(key(b)))
        .map((a) => row(a, 0));
    }
    fill(body, rows);
    // History only of the actors shown: none kept for actors gone or folded.
    const shown = new Set(rows.map((r) => r.dataset.kind && `${r.dataset.kind}/${r.dataset.id}`));
    for (const k of [...history.keys()]) if (!shown.has(k)) history.delete(k);
    const clusters = actors.filter((a) => a.kind === 'cluster').length;
    const nodes = actors.filter((a) => a.kind === 'node_manager').length;
    const failed = actors.filter((a) => a.health === 'red').length;
    fill(info, `${clusters} cluster actors, ${nodes} node managers, ${top.instance_actors} instance actors`,
      failed ? h('span', { class: 'error-text', id: 'actors-failed' }, ` · ${failed} failed`) : '',
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

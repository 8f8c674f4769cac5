// Operations, as Ambari's background-operations view shows them: a list
// (newest first, filter by cluster) and one operation with each step's
// status and progress bar, per-instance results with exit codes and
// output tails, and durations. Step and progress events move the bars at
// once; a step's results are read when it ends.

import { api, seg } from './api.js';
import { Pager, badge, bar, coalescer, duration, fill, h, sequencer, table, when } from './ui.js';

const PAGE = 50;
const TERMINAL = ['Succeeded', 'Failed', 'RolledBack', 'Cancelled'];
/** How far along a step status is: a step only moves forward. */
const STEP_RANK = { Pending: 0, Running: 1, Done: 2, Failed: 2, Undoing: 3, Undone: 4, UndoFailed: 4 };

const stepsDone = (op) => op.steps.filter((s) => s.status === 'Done').length;

/** The operation-wide bar: steps done of all steps. */
function opBar(op) {
  const ok = !['Failed', 'RolledBack', 'Cancelled'].includes(op.status);
  const total = op.steps.length;
  const done = stepsDone(op);
  return bar(op.status === 'Succeeded' ? total : done, total, { ok, label: `${done}/${total} steps` });
}

/** One step's bar: done for an ended step, the live count for a running one. */
function stepBar(s, live) {
  const n = s.results.length;
  if (s.status === 'Done') return bar(1, 1, { label: n ? `${n} instances` : 'done' });
  if (['Failed', 'UndoFailed'].includes(s.status)) {
    const ok = s.results.filter((r) => r.ok).length;
    return bar(ok, Math.max(n, 1), { ok: false, label: `${ok}/${n} ok` });
  }
  if (s.status === 'Running' && live && live.total > 0) return bar(live.done, live.total, { label: `${live.done}/${live.total}` });
  if (s.status === 'Running' && live) return bar(0, 1, { label: `${live.done} commands answered` });
  if (s.status === 'Running') return bar(0, 1, { label: 'running' });
  return bar(0, 1, { label: s.status === 'Undone' ? 'undone' : '' });
}

function results(step) {
  if (!step.results.length) return h('p', { class: 'muted' }, 'No per-instance results.');
  const { table: t, body } = table([['Instance'], ['Result'], ['Exit', 'num'], ['Message'], ['stdout (tail)'], ['stderr (tail)']]);
  fill(body, step.results.map((r) => h('tr', {},
    h('td', { class: 'mono' }, r.instance),
    h('td', {}, badge(r.ok ? 'Done' : 'Failed')),
    h('td', { class: 'num' }, r.exit_code ?? '–'),
    h('td', {}, r.message),
    h('td', {}, r.stdout_tail ? h('pre', {}, r.stdout_tail) : ''),
    h('td', {}, r.stderr_tail ? h('pre', {}, r.stderr_tail) : ''))));
  return t;
}

/** The node requests an operation waits for (its `await-nodes-<role>` steps). */
function requests(op) {
  if (!op.node_requests?.length) return '';
  const { table: t, body } = table([['Node request'], ['Labels'], ['Count', 'num'], ['State'], ['Pool'], ['Nodes'], ['Declined']], { class: 'op-requests' });
  fill(body, op.node_requests.map((r) => h('tr', { dataset: { request: r.id } },
    h('td', { class: 'mono' }, h('a', { href: '#/pools' }, r.id)),
    h('td', { class: 'mono' }, Object.entries(r.labels).map(([k, v]) => `${k}=${v}`).join(',') || '(any)'),
    h('td', { class: 'num' }, `${r.nodes.length}/${r.count}`),
    h('td', {}, badge(r.state)),
    h('td', {}, r.pool ?? '–'),
    h('td', { class: 'mono' }, r.nodes.join(', ') || '–'),
    h('td', {}, r.reasons.join('; ') || '–'))));
  return h('div', {}, h('h3', {}, 'Node requests it filed'), t);
}

/**
 * One operation, kept live: `{el, dispose}`. `onEnd(op)` runs once when it
 * has ended (for the cluster page to re-read).
 */
export function operationPanel(id, live, { onEnd } = {}) {
  const el = h('div', { class: 'panel operation', dataset: { operation: id } }, h('p', { class: 'muted' }, 'Loading the operation…'));
  let op = null;
  const progress = new Map();
  const open = new Set();
  let ended = false;
  let disposed = false;

  function render() {
    if (!op || disposed) return;
    const { table: t, body } = table([['#', 'num'], ['Step'], ['Status'], ['Progress'], ['Results']], { class: 'steps' });
    op.steps.forEach((s, i) => {
      const ok = s.results.filter((r) => r.ok).length;
      const toggle = s.results.length
        ? h('button', { class: 'quiet', onclick: () => { if (open.has(i)) open.delete(i); else open.add(i); render(); } },
          open.has(i) ? 'hide' : `${ok} ok, ${s.results.length - ok} failed`)
        : h('span', { class: 'muted' }, '–');
      body.append(h('tr', { dataset: { step: i } },
        h('td', { class: 'num' }, i + 1),
        h('td', {}, s.name, s.error ? h('div', { class: 'error-text' }, s.error) : ''),
        h('td', {}, badge(s.status)),
        h('td', {}, stepBar(s, progress.get(i))),
        h('td', {}, toggle)));
      if (open.has(i)) body.append(h('tr', {}, h('td', { colspan: 5 }, results(s))));
    });
    fill(el,
      h('h2', {}, `Operation `, h('a', { href: `#/operations/${seg(op.id)}`, class: 'mono' }, op.id)),
      h('div', { class: 'grid' },
        h('span', { class: 'muted' }, 'Kind'), h('span', {}, op.kind),
        h('span', { class: 'muted' }, 'Cluster'), h('a', { href: `#/clusters/${seg(op.cluster)}` }, op.cluster),
        h('span', { class: 'muted' }, 'Status'), h('span', { class: 'op-status' }, badge(op.status)),
        h('span', { class: 'muted' }, 'Progress'), h('span', { class: 'op-progress' }, opBar(op)),
        h('span', { class: 'muted' }, 'Started'), h('span', {}, when(op.created_at)),
        h('span', { class: 'muted' }, 'Duration'), h('span', {}, duration(op.created_at, op.ended_at)),
        h('span', { class: 'muted' }, 'Parameters'), h('code', {}, JSON.stringify(op.params))),
      op.error ? h('p', { class: 'error-text' }, op.error) : '',
      requests(op),
      t);
  }

  // What events said, kept over a read that started before they came (a
  // read never moves a step or the operation back).
  const eventSteps = new Map();
  let eventStatus = null;

  const reads = sequencer();
  async function load() {
    const ticket = reads();
    try {
      const r = await api('GET', `/operations/${seg(id)}`);
      if (disposed || !ticket.latest()) return;
      op = r.operation;
      op.steps.forEach((s, i) => {
        const said = eventSteps.get(i);
        if (said && STEP_RANK[said] > STEP_RANK[s.status]) s.status = said;
      });
      if (eventStatus && TERMINAL.includes(eventStatus) && !TERMINAL.includes(op.status)) op.status = eventStatus;
      render();
      if (TERMINAL.includes(op.status) && !ended) { ended = true; onEnd?.(op); }
    } catch (e) {
      if (!disposed) fill(el, h('p', { class: 'error-text' }, `operation ${id}: ${e.message}`));
    }
  }

  const soon = coalescer(250);
  // What an event says is kept even before the first read has answered,
  // and merged into every read (see `load`).
  const off = live.subscribe((e) => {
    // A node request it filed moved: read the operation again.
    if (e.kind.startsWith('node_request.') && `${e.data?.requestor}`.startsWith(`operation:${id}/`)) { soon(id, load); return; }
    if (e.data?.operation !== id) return;
    const d = e.data;
    if (e.kind === 'operation.progress') {
      progress.set(d.step, { done: d.done, total: d.total });
    } else if (e.kind === 'operation.step_started' || e.kind === 'operation.step_ended') {
      eventSteps.set(d.step, d.status);
      if (op?.steps[d.step]) op.steps[d.step].status = d.status;
      if (e.kind === 'operation.step_ended') { progress.delete(d.step); soon(id, load); }
    } else if (e.kind === 'operation.ended') {
      eventStatus = d.status;
      if (op) { op.status = d.status; op.error = d.error; }
      soon(id, load);
    }
    if (op) render(); else soon(id, load);
  });
  const offResync = live.onResync(load);
  load();
  return { el, dispose() { disposed = true; off(); offResync(); } };
}

export function operationView(root, { live, params }) {
  const panel = operationPanel(params[0], live);
  fill(root, h('p', {}, h('a', { href: '#/operations' }, '← Operations')), panel.el);
  return () => panel.dispose();
}

export function operationsView(root, { live, query }) {
  const cluster = query.get('cluster') || '';
  const filter = h('input', { type: 'search', placeholder: 'cluster name', value: cluster, id: 'op-filter' });
  const apply = () => { location.hash = filter.value ? `#/operations?cluster=${seg(filter.value)}` : '#/operations'; };
  filter.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') apply(); });
  const info = h('p', { class: 'muted' });
  const { table: t, body } = table([
    ['Operation'], ['Kind'], ['Cluster'], ['Status'], ['Progress'], ['Started'], ['Duration'], ['Error'],
  ], { id: 'operations' });
  const pager = new Pager(() => refresh(), { back: '← Newer', forward: 'Older →' });
  fill(root, h('h1', {}, 'Operations'),
    h('div', { class: 'toolbar' }, h('label', {}, 'Cluster', filter), h('button', { class: 'quiet', onclick: apply }, 'Filter')),
    info, t, pager.el);
  const shown = new Map();

  const row = (op) => h('tr', { dataset: { operation: op.id } },
    h('td', {}, h('a', { class: 'mono', href: `#/operations/${seg(op.id)}` }, op.id)),
    h('td', {}, op.kind),
    h('td', {}, h('a', { href: `#/clusters/${seg(op.cluster)}` }, op.cluster)),
    h('td', {}, badge(op.status)),
    h('td', {}, opBar(op)),
    h('td', {}, when(op.created_at)),
    h('td', {}, duration(op.created_at, op.ended_at)),
    h('td', { class: 'error-text' }, op.error ?? ''));

  const redraw = (op) => {
    const tr = body.querySelector(`tr[data-operation="${CSS.escape(op.id)}"]`);
    if (tr) tr.replaceWith(row(op));
  };

  async function refresh() {
    try {
      const { after } = pager;
      const q = new URLSearchParams({ limit: PAGE });
      if (cluster) q.set('cluster', cluster);
      if (after) q.set('after', after);
      const r = await api('GET', `/operations?${q}`);
      shown.clear();
      for (const op of r.operations) shown.set(op.id, op);
      fill(body, r.operations.map(row));
      pager.shown(r.next);
      fill(info, r.operations.length ? '' : 'No operations.');
    } catch (e) {
      fill(info, h('span', { class: 'error-text' }, e.message));
    }
  }

  const soon = coalescer(200);
  const off = live.subscribe((e) => {
    if (!e.kind.startsWith('operation.')) return;
    if (e.kind === 'operation.created') {
      if (pager.page === 0 && (!cluster || e.cluster === cluster)) soon('page', refresh);
      return;
    }
    const op = shown.get(e.data.operation);
    if (!op) return;
    if (e.kind === 'operation.ended') { op.status = e.data.status; op.error = e.data.error; op.ended_at = e.at; }
    if (e.kind.startsWith('operation.step_') && op.steps[e.data.step]) op.steps[e.data.step].status = e.data.status;
    if (op.status === 'Pending') op.status = 'Running';
    redraw(op);
  });
  const offResync = live.onResync(refresh);
  refresh();
  return () => { off(); offResync(); };
}

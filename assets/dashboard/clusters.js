// Clusters: a page of summaries (status and description, roles, instances
// by status, the running operation), and one cluster: its roles, config,
// running operation with progress, actions, and its instances a page at a
// time (node, pid, ports, status) kept live by instance events. Actions
// (and the boxes that pick instances for them) only for a token whose
// scope allows them (`operate`); a `read` token sees the same page without.

import { api, can, seg } from './api.js';
import { clusterAction, instanceAction } from './actions.js';
import { operationPanel } from './operations.js';
import { Pager, badge, coalescer, fill, h, sequencer, table, when } from './ui.js';

const PAGE = 100;
const INSTANCE_PAGE = 100;
const STATUSES = ['Pending', 'Installing', 'Installed', 'Starting', 'Running', 'Restarting', 'Stopping', 'Stopped', 'Failed', 'Lost', 'Deleting'];

const counts = (byStatus) => h('span', { class: 'counts' },
  Object.entries(byStatus || {}).map(([s, n]) => badge(s, { label: `${n} ${s}` })));
const roles = (r) => Object.entries(r || {}).map(([name, v]) => `${name} ×${v.count}`).join(', ');

export function clustersView(root, { live }) {
  const info = h('p', { class: 'muted' });
  const { table: t, body } = table([
    ['Cluster'], ['Package'], ['Status'], ['Roles'], ['Instances'], ['Operation'], ['Updated'],
  ], { id: 'clusters' });
  const pager = new Pager(() => refresh());
  fill(root, h('h1', {}, 'Clusters'), info, t, pager.el);

  const row = (c) => h('tr', { dataset: { cluster: c.name } },
    h('td', {}, h('a', { href: `#/clusters/${seg(c.name)}` }, c.name)),
    h('td', { class: 'mono' }, `${c.package.name}:${c.package.version}`),
    h('td', {}, badge(c.status), h('div', { class: 'muted' }, c.status_description)),
    h('td', {}, roles(c.roles)),
    h('td', {}, counts(c.instance_counts ?? c.instances)),
    h('td', {}, c.operation ? h('a', { class: 'mono', href: `#/operations/${seg(c.operation)}` }, c.operation) : '–'),
    h('td', {}, when(c.updated_at)));

  const pageReads = sequencer();
  async function refresh() {
    const ticket = pageReads();
    try {
      const { after } = pager;
      const r = await api('GET', `/clusters?limit=${PAGE}${after ? `&after=${seg(after)}` : ''}`);
      if (!ticket.latest()) return;
      fill(body, r.clusters.map(row));
      pager.shown(r.next);
      fill(info, r.total ? `${r.total} clusters` : 'No clusters yet: create one with `flotilla cluster create`.');
    } catch (e) {
      fill(info, h('span', { class: 'error-text' }, e.message));
    }
  }

  // One cluster's row is read again (its summary, no instances) at most
  // every 200 ms however many of its events arrive.
  const soon = coalescer(200);
  const reads = new Map();
  const reread = async (name) => {
    if (!body.querySelector(`tr[data-cluster="${CSS.escape(name)}"]`)) return;
    if (!reads.has(name)) reads.set(name, sequencer());
    const ticket = reads.get(name)();
    let fresh = null;
    try {
      fresh = await api('GET', `/clusters/${seg(name)}?instances=false`);
    } catch (e) {
      if (e.status !== 404) return;
    }
    // The row as it is now (a page read may have replaced it meanwhile).
    const tr = body.querySelector(`tr[data-cluster="${CSS.escape(name)}"]`);
    if (!tr || !ticket.latest()) return;
    if (fresh) tr.replaceWith(row(fresh)); else tr.remove();
  };
  const off = live.subscribe((e) => {
    if (e.kind === 'cluster.created' || e.kind === 'cluster.deleted') soon('page', refresh);
    else if (e.cluster && (e.kind.startsWith('cluster.') || e.kind.startsWith('instance.') || e.kind === 'operation.ended')) {
      soon(e.cluster, () => reread(e.cluster));
    }
  });
  const offResync = live.onResync(refresh);
  refresh();
  return () => { off(); offResync(); };
}

export function clusterView(root, { live, params }) {
  const name = params[0];
  const head = h('div', { class: 'panel', id: 'cluster-head' }, h('p', { class: 'muted' }, 'Loading…'));
  const opSlot = h('div', { id: 'cluster-operation' });
  const roleFilter = h('select', { id: 'role-filter' }, h('option', { value: '' }, 'all roles'));
  const statusFilter = h('select', { id: 'status-filter' }, h('option', { value: '' }, 'any status'),
    STATUSES.map((s) => h('option', { value: s }, s)));
  const { table: t, body } = table([
    [''], ['Instance'], ['Role'], ['Node'], ['Address'], ['Ports'], ['Status'], ['PID', 'num'], ['Gen', 'num'], ['Last error'], [''],
  ], { id: 'instances' });
  const pager = new Pager(() => loadInstances());
  const instInfo = h('span', { class: 'muted' });
  fill(root,
    h('p', {}, h('a', { href: '#/clusters' }, '← Clusters')),
    head, opSlot,
    h('h2', {}, 'Instances'),
    h('div', { class: 'toolbar' }, roleFilter, statusFilter, instInfo),
    t, pager.el);

  let cluster = null;
  let panel = null;
  let panelId = null;
  const selected = new Set();
  let gone = false;
  let stopped = false;
  const headReads = sequencer();
  const pageReads = sequencer();

  function showOperation(id) {
    if (stopped || id === panelId) return;
    if (id === null && panel) return; // keep the ended operation in view
    panel?.dispose();
    panelId = id;
    panel = id ? operationPanel(id, live, { onEnd: () => { soon('head', loadHead); soon('page', loadInstances); } }) : null;
    fill(opSlot, panel ? panel.el : '');
  }

  function renderHead() {
    const c = cluster;
    const act = (kind, label, cls = '') => h('button', { class: cls, dataset: { action: kind }, onclick: () => clusterAction(kind, c, { selected: [...selected] }) }, label);
    fill(head,
      h('h1', {}, c.name, ' ', h('span', { id: 'cluster-status' }, badge(c.status))),
      h('p', { id: 'cluster-description' }, c.status_description),
      h('div', { class: 'grid' },
        h('span', { class: 'muted' }, 'Package'), h('span', { class: 'mono' }, `${c.package.name}:${c.package.version}`),
        h('span', { class: 'muted' }, 'Roles'), h('span', {}, roles(c.roles)),
        h('span', { class: 'muted' }, 'Instances'), counts(c.instance_counts),
        h('span', { class: 'muted' }, 'Config'), h('code', {}, Object.entries(c.config).map(([k, v]) => `${k}=${v && v.secret === 'set' ? '(secret, set)' : JSON.stringify(v)}`).join('  ') || '–'),
        h('span', { class: 'muted' }, 'Created'), h('span', {}, when(c.created_at)),
        h('span', { class: 'muted' }, 'Id'), h('span', { class: 'mono' }, c.id)),
      can('operate')
        ? h('div', { class: 'toolbar actions' },
          act('scale', 'Scale…'), act('start', 'Start', 'quiet'), act('stop', 'Stop', 'quiet'), act('restart', 'Restart', 'quiet'),
          act('config', 'Config…', 'quiet'), act('upgrade', 'Upgrade…', 'quiet'), act('delete', 'Delete', 'danger'))
        : h('p', { class: 'muted', id: 'read-only' }, 'This token can look, not act: its scope is read (actions need operate).'));
    const have = new Set([...roleFilter.options].map((o) => o.value));
    for (const r of Object.keys(c.roles)) if (!have.has(r)) roleFilter.append(h('option', { value: r }, r));
  }

  async function loadHead() {
    if (gone || stopped) return;
    const ticket = headReads();
    try {
      const c = await api('GET', `/clusters/${seg(name)}?instances=false`);
      if (stopped || !ticket.latest()) return;
      cluster = c;
      renderHead();
      showOperation(cluster.operation ?? null);
    } catch (e) {
      if (stopped) return;
      if (e.status === 404) { gone = true; fill(head, h('h1', {}, name), h('p', { class: 'error-text' }, 'This cluster was deleted.')); }
      else fill(head, h('p', { class: 'error-text' }, e.message));
    }
  }

  const instRow = (i) => {
    const acts = can('operate');
    const box = acts && h('input', { type: 'checkbox', checked: selected.has(i.id), title: 'select for scale-in',
      onchange: (ev) => { if (ev.target.checked) selected.add(i.id); else selected.delete(i.id); } });
    const verbs = acts && ['restart', 'stop', 'start'].map((v) => h('button', { class: 'quiet', dataset: { verb: v },
      onclick: () => instanceAction(name, i.id, v) }, v));
    return h('tr', { dataset: { instance: i.id } },
      h('td', {}, box),
      h('td', { class: 'mono' }, i.id),
      h('td', {}, `${i.role} #${i.ordinal}`),
      h('td', { class: 'mono' }, i.node),
      h('td', { class: 'mono' }, i.host),
      h('td', { class: 'mono' }, Object.entries(i.ports).map(([k, v]) => `${k}:${v}`).join(' ')),
      h('td', { class: 'status' }, badge(i.status)),
      h('td', { class: 'num pid' }, i.pid ?? '–'),
      h('td', { class: 'num' }, i.generation),
      h('td', { class: 'error-text last-error' }, i.last_error ?? ''),
      h('td', { class: 'row-actions' }, verbs));
  };

  // The last event about each instance, with its arrival number: a page
  // read that began before an event came shows what the event said.
  const said = new Map();
  async function loadInstances() {
    if (gone || stopped) return;
    const began = live.received;
    const ticket = pageReads();
    try {
      const q = new URLSearchParams({ limit: INSTANCE_PAGE });
      if (pager.after) q.set('after', pager.after);
      if (roleFilter.value) q.set('role', roleFilter.value);
      if (statusFilter.value) q.set('status', statusFilter.value);
      const r = await api('GET', `/clusters/${seg(name)}/instances?${q}`);
      if (stopped || !ticket.latest()) return;
      for (const i of r.instances) {
        const e = said.get(i.id);
        if (e && e.n > began) Object.assign(i, { status: e.status, pid: e.pid, last_error: e.error });
      }
      fill(body, r.instances.map(instRow));
      pager.shown(r.next, `page ${pager.page + 1} of ${Math.max(1, Math.ceil(r.total / INSTANCE_PAGE))}`);
      fill(instInfo, `${r.total} instances`, selected.size ? ` · ${selected.size} selected` : '');
    } catch (e) {
      if (e.status !== 404) fill(instInfo, h('span', { class: 'error-text' }, e.message));
    }
  }
  const refilter = () => { pager.reset(); loadInstances(); };
  roleFilter.addEventListener('change', refilter);
  statusFilter.addEventListener('change', refilter);

  const soon = coalescer(100);
  const off = live.subscribe((e) => {
    if (e.cluster !== name) return;
    const d = e.data;
    if (e.kind === 'cluster.status' && cluster) {
      cluster.status = d.status;
      cluster.status_description = d.description;
      fill(document.getElementById('cluster-status'), badge(d.status));
      fill(document.getElementById('cluster-description'), d.description);
      if (d.operation) showOperation(d.operation);
      soon('head', loadHead);
    } else if (e.kind === 'cluster.deleted') {
      soon('head', loadHead);
    } else if (e.kind === 'instance.status') {
      said.set(d.instance, { ...d, n: live.received });
      const tr = body.querySelector(`tr[data-instance="${CSS.escape(d.instance)}"]`);
      if (tr) {
        fill(tr.querySelector('.status'), badge(d.status));
        fill(tr.querySelector('.pid'), d.pid ?? '–');
        fill(tr.querySelector('.last-error'), d.error ?? '');
        tr.classList.remove('flash');
        void tr.offsetWidth;
        tr.classList.add('flash');
      }
      if (statusFilter.value) soon('page', loadInstances);
      soon('head', loadHead);
    } else if (e.kind === 'instance.added' || e.kind === 'instance.removed') {
      if (e.kind === 'instance.removed') { said.delete(d.instance); selected.delete(d.instance); }
      soon('page', loadInstances);
      soon('head', loadHead);
    } else if (e.kind === 'operation.created') {
      showOperation(d.operation);
    }
  });
  const offResync = live.onResync(() => { loadHead(); loadInstances(); });
  loadHead();
  loadInstances();
  return () => { stopped = true; off(); offResync(); panel?.dispose(); };
}

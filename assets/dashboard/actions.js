// Actions with confirmation. Each asks the master first with
// `?dry_run=true` and shows what would happen (the steps, the instances
// each touches, where new instances go, which members reload and which
// restart); only "Confirm" sends the real request.

import { api, seg } from './api.js';
import { confirmDialog, h, table, toast } from './ui.js';

const VERBS = {
  start: { title: 'Start', method: 'POST', path: '/start' },
  stop: { title: 'Stop', method: 'POST', path: '/stop' },
  restart: { title: 'Restart', method: 'POST', path: '/restart' },
  delete: { title: 'Delete', method: 'DELETE', path: '', danger: true },
  scale: { title: 'Scale', method: 'POST', path: '/scale' },
  config: { title: 'Change the config of', method: 'PATCH', path: '/config' },
  upgrade: { title: 'Upgrade', method: 'POST', path: '/upgrade' },
};

/** What a dry run said, for the confirmation dialog. */
function describePlan(p) {
  const parts = [];
  const { table: steps, body } = table([['Step'], ['Action'], ['Instances', 'num'], ['Members']]);
  for (const s of p.steps || []) {
    const effects = {};
    for (const v of Object.values(s.members || {})) effects[v] = (effects[v] || 0) + 1;
    body.append(h('tr', {},
      h('td', {}, s.name), h('td', {}, s.action), h('td', { class: 'num' }, (s.instances || []).length),
      h('td', {}, Object.entries(effects).map(([k, n]) => `${n} ${k}`).join(', ') || '–')));
  }
  parts.push(h('p', {}, `Kind: ${p.kind}`), steps);
  if (p.new_instances?.length) {
    const { table: t, body: b } = table([['New instance'], ['Node'], ['Address'], ['Ports']]);
    for (const i of p.new_instances) {
      b.append(h('tr', {}, h('td', {}, `${i.role} #${i.ordinal}`), h('td', { class: 'mono' }, i.node),
        h('td', { class: 'mono' }, i.host), h('td', { class: 'mono' }, Object.entries(i.ports || {}).map(([k, v]) => `${k}:${v}`).join(' '))));
    }
    parts.push(h('h3', {}, 'Placement'), t);
  }
  return h('div', { class: 'plan', id: 'plan' }, parts);
}

/** Preview, confirm, run: true when the real request was accepted. */
async function previewAndRun(title, method, path, body, { danger = false } = {}) {
  let plan;
  try {
    plan = await api(method, `${path}${path.includes('?') ? '&' : '?'}dry_run=true`, body);
  } catch (e) {
    await confirmDialog(`${title}: refused`, h('p', { class: 'error-text' }, `${e.code}: ${e.message}`), { ok: 'Close' });
    return false;
  }
  const ok = await confirmDialog(title, describePlan(plan), { ok: danger ? 'Delete' : 'Confirm', danger });
  if (!ok) return false;
  try {
    const r = await api(method, path, body);
    toast(`${title}: operation ${r.operation.id} started`);
    return true;
  } catch (e) {
    toast(`${title}: ${e.code}: ${e.message}`, 'bad');
    return false;
  }
}

/** A form of `[label, input]` fields in the dialog; false when cancelled. */
function ask(title, fields) {
  const form = h('div', { class: 'grid' }, fields.flatMap(([label, input]) => [h('label', {}, label), input]));
  return confirmDialog(title, form, { ok: 'Preview…' });
}

function parseConfig(text, current) {
  const out = {};
  for (const line of text.split('\n')) {
    const l = line.trim();
    if (!l || l.startsWith('#')) continue;
    const eq = l.indexOf('=');
    if (eq < 1) throw new Error(`"${l}" is not key=value`);
    const key = l.slice(0, eq).trim();
    const raw = l.slice(eq + 1).trim();
    let value;
    try { value = JSON.parse(raw); } catch { value = raw; }
    if (JSON.stringify(current[key]) !== JSON.stringify(value)) out[key] = value;
  }
  return out;
}

/** One of the cluster page's action buttons. */
export async function clusterAction(kind, c, { selected = [] } = {}) {
  const v = VERBS[kind];
  const path = `/clusters/${seg(c.name)}${v.path}`;
  const title = `${v.title} ${c.name}`;
  let body;
  const batch = h('input', { type: 'number', min: 1, placeholder: 'default: a quarter of each role', name: 'batch' });
  const batchValue = () => (batch.value ? { batch: Number(batch.value) } : {});
  if (kind === 'scale') {
    const role = h('select', { name: 'role' }, Object.keys(c.roles).map((r) => h('option', { value: r }, r)));
    const add = h('input', { type: 'number', min: 0, value: selected.length ? '' : '1', name: 'add' });
    const remove = h('textarea', { rows: 3, cols: 40, name: 'remove', placeholder: 'instance ids to remove, one per line' });
    remove.value = selected.join('\n');
    if (!(await ask(`Scale ${c.name}`, [['Role', role], ['Add instances', add], ['Or remove', remove]]))) return;
    const ids = remove.value.split(/\s+/).filter(Boolean);
    body = ids.length ? { role: role.value, remove: ids } : { role: role.value, add: Number(add.value || 0) };
  } else if (kind === 'config') {
    const text = h('textarea', { rows: 8, cols: 50, name: 'config' });
    text.value = Object.entries(c.config).map(([k, val]) => `${k} = ${JSON.stringify(val)}`).join('\n');
    if (!(await ask(`Config of ${c.name}`, [['key = value (JSON or text)', text], ['Batch', batch]]))) return;
    let config;
    try { config = parseConfig(text.value, c.config); } catch (e) { toast(e.message, 'bad'); return; }
    if (!Object.keys(config).length) { toast('Nothing changed'); return; }
    body = { config, ...batchValue() };
  } else if (kind === 'upgrade') {
    let versions;
    try {
      versions = (await api('GET', '/packages')).packages.filter((p) => p.name === c.package.name && p.version !== c.package.version);
    } catch (e) { toast(`packages: ${e.message}`, 'bad'); return; }
    if (!versions.length) { toast(`No other version of ${c.package.name} is uploaded`, 'bad'); return; }
    const version = h('select', { name: 'version' }, versions.map((p) => h('option', { value: p.version }, p.version)));
    if (!(await ask(`Upgrade ${c.name} from ${c.package.version}`, [['Version', version], ['Batch', batch]]))) return;
    body = { version: version.value, ...batchValue() };
  }
  await previewAndRun(title, v.method, path, body, { danger: v.danger });
}

/** Start, stop or restart one instance. */
export async function instanceAction(cluster, id, verb) {
  await previewAndRun(`${verb[0].toUpperCase()}${verb.slice(1)} instance ${id}`, 'POST',
    `/clusters/${seg(cluster)}/instances/${seg(id)}/${verb}`, undefined);
}

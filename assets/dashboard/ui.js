// DOM helpers. Every value from the master goes in as text (textContent),
// never as markup: names, errors and process output can hold anything.

/** `h('td', {class: 'num'}, 'text', node, ...)`. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** Replaces `el`'s children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

const STATUS_CLASS = {
  // instances, clusters, operations, steps, nodes, actors
  Running: 'ok', Active: 'ok', Succeeded: 'ok', Done: 'ok', Ready: 'ok', idle: 'ok',
  Installing: 'busy', Starting: 'busy', Stopping: 'busy', Deleting: 'busy', Validating: 'busy', Configuring: 'busy',
  Scaling: 'busy', AddingInstances: 'busy', Decommissioning: 'busy', DeletingInstances: 'busy', Restarting: 'busy',
  Upgrading: 'busy', Reconfiguring: 'busy', Undoing: 'busy', busy: 'busy', starting: 'busy',
  Undone: 'warn', Unknown: 'warn', RolledBack: 'warn', Cancelled: 'warn', stopped: 'warn',
  Failed: 'bad', Lost: 'bad', Error: 'bad', Down: 'bad', UndoFailed: 'bad', failed: 'bad', escalated: 'bad',
  // a node's lifecycle, a pool's health, a node request's state
  ready: 'ok', launching: 'busy', enrolling: 'busy', draining: 'busy', deleting: 'busy', cordoned: 'warn',
  ok: 'ok', paused: 'warn', no_capacity: 'warn', broken: 'bad', unhealthy: 'bad',
  pending: 'busy', fulfilled: 'ok',
};

/** A status, coloured by what it means; `label` when it says more (`3 Running`). */
export function badge(status, { title, label } = {}) {
  const s = String(status ?? '');
  return h('span', { class: `badge ${STATUS_CLASS[s] ?? ''}`, title, 'data-status': s }, label ?? s);
}

/** A progress bar; `ok` false colours it red. */
export function bar(done, total, { ok = true, label } = {}) {
  const pct = total > 0 ? Math.min(100, Math.round((done / total) * 100)) : (ok ? 0 : 100);
  const fillEl = h('span', {});
  fillEl.style.width = `${pct}%`;
  const b = h('span', {
    class: `bar ${ok ? (pct === 100 ? 'ok' : '') : 'bad'}`, role: 'progressbar',
    'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-valuenow': pct,
  }, fillEl);
  return h('span', { class: 'bar-wrap' }, b, h('span', { class: 'bar-label' }, label ?? `${done}/${total}`));
}

export function age(ms) {
  if (ms === null || ms === undefined) return '–';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 3_600_000) return `${Math.floor(ms / 60_000)} min ${Math.round((ms % 60_000) / 1000)} s`;
  return `${(ms / 3_600_000).toFixed(1)} h`;
}

export function when(iso) {
  if (!iso) return '–';
  const d = new Date(iso);
  return d.toLocaleString(undefined, { hour12: false });
}

export function duration(fromIso, toIso) {
  if (!fromIso) return '–';
  const end = toIso ? Date.parse(toIso) : Date.now();
  return age(end - Date.parse(fromIso));
}

/**
 * Server-side paging by cursor: `pager.after` is the current page's cursor
 * (`null` on the first), `pager.shown(next, label)` after each read, and
 * the buttons call `load()` for the page they move to.
 */
export class Pager {
  constructor(load, { back = '← Previous', forward = 'Next →' } = {}) {
    this.load = load;
    this.labels = [back, forward];
    this.cursors = [null];
    this.page = 0;
    this.el = h('div', { class: 'pager' });
  }

  get after() { return this.cursors[this.page]; }

  /** Back to the first page (a filter changed). */
  reset() { this.page = 0; this.cursors.length = 1; }

  shown(next, label = `page ${this.page + 1}`) {
    this.cursors[this.page + 1] = next;
    const go = (d) => () => { this.page += d; this.load(); };
    fill(this.el,
      h('button', { class: 'quiet', disabled: this.page === 0, onclick: go(-1) }, this.labels[0]),
      h('span', { class: 'muted' }, label),
      h('button', { class: 'quiet', disabled: !next, onclick: go(1) }, this.labels[1]));
  }
}

/** A table: `cols` is [[header, class]...]; returns {table, body}. */
export function table(cols, attrs = {}) {
  const body = h('tbody');
  const t = h('table', attrs, h('thead', {}, h('tr', {}, cols.map(([c, cls]) => h('th', { class: cls }, c)))), body);
  return { table: t, body };
}

export function toast(message, kind = '') {
  const t = h('div', { class: `toast ${kind}`, role: 'status' }, message);
  document.getElementById('toasts').append(t);
  setTimeout(() => t.remove(), kind === 'bad' ? 9000 : 4000);
}

/** Shows the dialog; resolves true when the operator confirms. */
export function confirmDialog(title, body, { ok = 'Confirm', danger = false } = {}) {
  const d = document.getElementById('dialog');
  fill(document.getElementById('dialog-title'), title);
  fill(document.getElementById('dialog-body'), body);
  const okBtn = document.getElementById('dialog-ok');
  okBtn.textContent = ok;
  okBtn.className = danger ? 'danger' : '';
  d.returnValue = '';
  d.showModal();
  return new Promise((resolve) => {
    d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true });
  });
}

/**
 * Orders overlapping reads: `const ticket = next()` before a read, and
 * after it `ticket.latest()` says whether no later read began meanwhile
 * (an older answer must not overwrite a newer one).
 */
export function sequencer() {
  let n = 0;
  return () => { const mine = ++n; return { latest: () => mine === n }; };
}

/**
 * Coalesces calls per key: `fn` runs at most every `ms` (the first at once,
 * the last always), so a burst of events costs a few reads, not one each.
 */
export function coalescer(ms) {
  const timers = new Map();
  return (key, fn) => {
    const t = timers.get(key);
    if (t) { t.again = true; return; }
    const entry = { again: false };
    timers.set(key, entry);
    Promise.resolve().then(fn);
    const tick = () => {
      if (entry.again) { entry.again = false; Promise.resolve().then(fn); setTimeout(tick, ms); } else timers.delete(key);
    };
    setTimeout(tick, ms);
  };
}

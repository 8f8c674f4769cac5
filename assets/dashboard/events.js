// Events: the live feed, newest first, filtered by kind prefix or cluster.
// The page keeps the last 1,000 events it received (since it was opened),
// so this view starts with what just happened.

import { fill, h, table } from './ui.js';

const KEEP = 1000;
const SHOWN = 300;
export const recent = [];

/** Called by the app for every event, whichever view is open. */
export function remember(e) {
  recent.push(e);
  if (recent.length > KEEP) recent.splice(0, recent.length - KEEP);
}

export function eventsView(root, { live }) {
  const kind = h('input', { type: 'search', placeholder: 'kind prefix: operation.', id: 'event-kind' });
  const cluster = h('input', { type: 'search', placeholder: 'cluster', id: 'event-cluster' });
  const pause = h('input', { type: 'checkbox', id: 'event-pause' });
  const info = h('span', { class: 'muted' });
  const { table: t, body } = table([['Id', 'num'], ['Time'], ['Kind'], ['Cluster'], ['Data']], { class: 'events', id: 'events' });
  fill(root, h('h1', {}, 'Events'),
    h('div', { class: 'toolbar' }, h('label', {}, 'Kind', kind), h('label', {}, 'Cluster', cluster),
      h('label', {}, pause, 'Pause'), info),
    t);
  const matches = (e) => e.kind.startsWith(kind.value.trim()) && (!cluster.value.trim() || e.cluster === cluster.value.trim());
  const row = (e) => h('tr', {},
    h('td', { class: 'num mono' }, e.id),
    h('td', {}, new Date(e.at).toLocaleTimeString(undefined, { hour12: false, hour: '2-digit', minute: '2-digit', second: '2-digit', fractionalSecondDigits: 3 })),
    h('td', {}, e.kind),
    h('td', {}, e.cluster ?? ''),
    h('td', { class: 'data' }, JSON.stringify(e.data)));
  const redraw = () => {
    const rows = recent.filter(matches).slice(-SHOWN).reverse().map(row);
    fill(body, rows);
    fill(info, `${live.received} received since the page opened`);
  };
  kind.addEventListener('input', redraw);
  cluster.addEventListener('input', redraw);
  pause.addEventListener('change', redraw);
  const off = live.subscribe((e) => {
    if (pause.checked || !matches(e)) return;
    body.prepend(row(e));
    while (body.children.length > SHOWN) body.lastChild.remove();
    fill(info, `${live.received} received since the page opened`);
  });
  redraw();
  return off;
}

// Which master this page talks to, when there are several (a store on
// etcd): `GET /health` every 2 s. The header's badge says who leads and
// in which term (a new term: a failover happened). When the master stops
// answering, a banner says so and links to the installation's other
// masters (from its last answer); on a follower (the master restarted in
// place, now following), it links to the leader. Links carry the token in
// the fragment, as `flotilla dev`'s does (never sent to a server).

import { api, token } from './api.js';
import { fill, h } from './ui.js';

const badge = document.getElementById('master');
const banner = document.getElementById('failover');
let last = null;
let masters = [];
let firstTerm = null;
let looking = false;

async function look() {
  if (looking) return;
  looking = true;
  // A master that vanished answers nothing at all: give up after 3 s.
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), 3000);
  try {
    const health = await api('GET', '/health', undefined, { signal: abort.signal });
    if (health.store_engine !== 'etcd') {
      badge.hidden = true;
      banner.hidden = true;
      return;
    }
    last = health;
    // (A master just started answers without the list: keep the last one.)
    if (health.masters?.length) masters = health.masters;
    firstTerm ??= health.term;
    badge.hidden = false;
    badge.dataset.role = health.role;
    badge.dataset.term = health.term;
    badge.className = `master ${health.role}`;
    badge.textContent = health.role === 'leader'
      ? `${health.name} leads · term ${health.term}`
      : `follower of term ${health.term} · ${health.lag_ms ?? '?'} ms behind`;
    badge.title = `${masters.length} masters: ${masters.map((m) => m.name).join(', ')}` +
      (health.term !== firstTerm ? ` (a failover since this page opened: term ${firstTerm} then ${health.term})` : '');
    // A follower serves reads, not this page's writes and views of what
    // only the leader knows: send the operator there.
    banner.hidden = health.role === 'leader';
    if (health.role !== 'leader') {
      fill(banner, h('strong', {}, `${health.name} follows`), ' (the master you opened lost the lead, or never had it). ',
        health.leader ? link('Open the leader', health.leader) : 'No master leads right now; one takes over within seconds.');
    }
  } catch (e) {
    if (!last || e.status === 401) return;
    const others = masters.filter((m) => m.name !== last.name);
    const why = e.name === 'AbortError' ? 'no answer within 3 s' : e.message;
    banner.hidden = false;
    fill(banner,
      h('strong', {}, `${last.name} does not answer`), ` (${why}): another master takes over within seconds. `,
      others.length ? 'Open another: ' : '',
      others.map((m) => link(m.name, m.api_url)));
  } finally {
    clearTimeout(timer);
    looking = false;
  }
}

/** A link to another master's dashboard, the token in its fragment (an
 *  http(s) address only: anything else from the store is shown, not linked). */
function link(text, url) {
  if (!/^https?:\/\//.test(url)) return h('span', {}, `${text} (${url})`);
  return h('a', { class: 'master-link', href: `${url.replace(/\/$/, '')}/#token=${encodeURIComponent(token())}` }, text);
}

/** Starts watching (once signed in). */
export function watchMaster() {
  look();
  setInterval(look, 2000);
}

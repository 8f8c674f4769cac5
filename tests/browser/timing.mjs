// How long each dashboard view takes to show its data, against any master
// (BENCHMARKS.md, "The dashboard at 100,000 instances"): a measurement,
// not a test.
//
//   node timing.mjs LOGIN_URL CLUSTER [ROUNDS]
//
// For each view, the time from navigation to its rows on screen, the
// median of ROUNDS (default 5); and the size of the page's DOM.

import { chromium } from 'playwright-core';

const [, , loginUrl, cluster, roundsArg] = process.argv;
if (!loginUrl || !cluster) {
  console.error('usage: node timing.mjs LOGIN_URL CLUSTER [ROUNDS]');
  process.exit(2);
}
const rounds = Number(roundsArg || 5);
const browser = await chromium.launch({
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});
const page = await browser.newPage({ viewport: { width: 1440, height: 1000 } });
page.setDefaultTimeout(60_000);
await page.goto(loginUrl);
await page.locator('#actor-tree tr[data-kind="supervisor"]').waitFor();

const views = [
  ['actors', '#/actors', '#actor-tree tr[data-kind="cluster"]'],
  ['clusters', '#/clusters', '#clusters tr[data-cluster]'],
  ['cluster', `#/clusters/${encodeURIComponent(cluster)}`, '#instances tr[data-instance]'],
  ['operations', '#/operations', '#operations tr[data-operation]'],
  ['nodes', '#/nodes', '#nodes tr[data-node]'],
];
const out = {};
for (const [name, hash, sel] of views) {
  const times = [];
  let nodes = 0;
  for (let i = 0; i < rounds; i += 1) {
    await page.evaluate(() => { location.hash = '#/events'; });
    await page.locator('#events').waitFor();
    const t0 = Date.now();
    await page.evaluate((hsh) => { location.hash = hsh; }, hash);
    await page.locator(sel).first().waitFor();
    times.push(Date.now() - t0);
    nodes = await page.evaluate(() => document.getElementsByTagName('*').length);
  }
  times.sort((a, b) => a - b);
  out[name] = { median_ms: times[Math.floor(times.length / 2)], max_ms: times.at(-1), dom_nodes: nodes };
}
console.log(JSON.stringify(out));
await browser.close();

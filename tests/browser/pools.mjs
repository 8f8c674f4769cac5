// The node pools as the dashboard shows them, in Debian's Chromium, against
// a running `flotilla dev` with a local pool, after a create that had to
// wait for a node (tests/integration/dashboard.rs sets that up):
//
//   node pools.mjs LOGIN_URL OPERATION_ID POOL OUT_DIR
//
// The operation's page shows the node request it filed (its state, its
// pool, its node); the Pools view shows the pool, its ready node and the
// request. Asserts on what the page shows; prints one JSON line with what
// it saw; exits non-zero with the reason on the first failed expectation.

import { expect, launch, requireChromium } from './common.mjs';
import { join } from 'node:path';

const [, , loginUrl, opId, pool, outDir] = process.argv;
if (!loginUrl || !opId || !pool || !outDir) {
  console.error('usage: node pools.mjs LOGIN_URL OPERATION_ID POOL OUT_DIR');
  process.exit(2);
}
requireChromium();

const browser = await launch();
const problems = [];
const seen = {};
try {
  const context = await browser.newContext({ viewport: { width: 1440, height: 1000 } });
  const page = await context.newPage();
  page.setDefaultTimeout(30_000);
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  // Chromium fails requests with ERR_NETWORK_CHANGED while other tests
  // add and remove network namespaces' interfaces: not the page's fault.
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().includes('ERR_NETWORK_CHANGED')) problems.push(`console error: ${m.text()}`);
  });
  await page.goto(loginUrl);
  await page.locator('#nav').waitFor();

  // The operation: the request it filed, served by the pool.
  await page.evaluate((id) => { window.location.hash = `#/operations/${id}`; }, opId);
  const row = page.locator('.op-requests tr[data-request]').first();
  // Once more after a reload, should the network change under the page.
  await row.waitFor({ timeout: 15_000 }).catch(async () => {
    await page.reload();
    await row.waitFor();
  });
  seen.request = await row.getAttribute('data-request');
  seen.requestRow = await row.innerText();
  expect(seen.requestRow.includes('fulfilled'), `the request fulfilled on the operation's page, not ${seen.requestRow}`);
  expect(seen.requestRow.includes(pool), `the pool ${pool} on the request's row: ${seen.requestRow}`);
  expect(seen.requestRow.includes('1/1'), `its one node counted: ${seen.requestRow}`);
  const steps = await page.locator('table.steps').innerText();
  expect(steps.includes('await-nodes-'), `the waiting step among the steps: ${steps}`);
  await page.screenshot({ path: join(outDir, 'operation-with-request.png'), fullPage: true });

  // The Pools view: the pool with its ready node, the request listed.
  await page.locator('#nav a[data-view="pools"]').click();
  const card = page.locator('#pools .pool', { hasText: pool }).first();
  await card.waitFor();
  seen.poolCard = await card.innerText();
  seen.poolStates = await card.locator('.pool-states').innerText();
  expect(/\b1 ready\b/.test(seen.poolStates), `one ready node on the pool's card: ${seen.poolStates}`);
  const listed = page.locator(`#node-requests tr[data-request="${seen.request}"]`);
  await listed.waitFor();
  seen.listedRow = await listed.innerText();
  expect(seen.listedRow.includes(`operation:${opId}/`), `the request listed with its operation as requestor: ${seen.listedRow}`);
  await page.screenshot({ path: join(outDir, 'pools.png'), fullPage: true });
  expect(problems.length === 0, `no page errors: ${problems.join('; ')}`);
  console.log(JSON.stringify({ ok: true, ...seen }));
} catch (e) {
  console.error(`pools: ${e.message}`);
  console.log(JSON.stringify({ ok: false, error: e.message, problems, ...seen }));
  process.exitCode = 1;
} finally {
  await browser.close();
}

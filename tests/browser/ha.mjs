// Several masters on the dashboard, in Debian's Chromium, against a running
// `flotilla dev --ha` (tests/integration/dashboard.rs starts it):
//
//   node ha.mjs LOGIN_URL OUT_DIR
//
// The header says which master leads and in which term, the actor tree
// lists the two other masters following; the leader's
// process is then killed (its pid from /api/v1/health); the page says the
// master it talks to no longer leads (or answers) and links to another;
// the link opens the dashboard on the new leader, signed in, in a later
// term (or, when the killed master, restarted in place by `dev`, won the
// next election itself, the same page shows the later term). Prints one JSON line with what it saw; exits non-zero with the
// reason on the first failed expectation.

import { expect, launch, requireChromium } from './common.mjs';
import { join } from 'node:path';

const [, , loginUrl, outDir] = process.argv;
if (!loginUrl || !outDir) {
  console.error('usage: node ha.mjs LOGIN_URL OUT_DIR');
  process.exit(2);
}
requireChromium();

const browser = await launch();
const seen = {};
try {
  const context = await browser.newContext({ viewport: { width: 1440, height: 900 } });
  const page = await context.newPage();
  page.setDefaultTimeout(30_000);
  await page.goto(loginUrl);
  const badge = page.locator('#master[data-role="leader"]');
  await badge.waitFor();
  seen.before = await badge.innerText();
  seen.termBefore = Number(await badge.getAttribute('data-term'));
  expect(/leads · term \d+/.test(seen.before), `the leader and its term in the header, not ${seen.before}`);
  // The actor tree (the home view): this master its root, the two others
  // beside it as their own health says (following).
  await page.evaluate(() => { window.location.hash = '#/actors'; });
  await page.waitForFunction(() => document.querySelectorAll('#actor-tree tr.peer-master').length === 2);
  seen.peers = await page.locator('#actor-tree tr.peer-master').allInnerTexts();
  expect(seen.peers.every((t) => t.includes('follower')), `the other masters following: ${seen.peers}`);
  await page.screenshot({ path: join(outDir, 'leader.png') });

  const health = await page.evaluate(async () => (await fetch('/api/v1/health')).json());
  seen.killed = health.pid;
  process.kill(health.pid, 'SIGKILL');
  // The page says its master lost the lead (or stopped answering) and
  // links to another, unless its own master (restarted in place by `dev`)
  // won the next election: then its header shows the later term itself.
  const link = page.locator('#failover a.master-link').first();
  const later = page.locator(`#master[data-role="leader"]:not([data-term="${seen.termBefore}"])`);
  seen.way = await Promise.race([
    link.waitFor().then(() => 'link'),
    later.waitFor().then(() => 'same page'),
  ]);
  if (seen.way === 'link') {
    seen.banner = await page.locator('#failover').innerText();
    await page.screenshot({ path: join(outDir, 'failover.png') });
    await link.click();
  }
  const after = page.locator(`#master[data-role="leader"]:not([data-term="${seen.termBefore}"])`);
  await after.waitFor();
  seen.after = await after.innerText();
  seen.termAfter = Number(await after.getAttribute('data-term'));
  seen.url = page.url();
  expect(seen.termAfter > seen.termBefore, `a later term on the new leader's page: ${seen.termBefore} then ${seen.termAfter}`);
  expect(!seen.url.includes('token='), `the token off the address bar: ${seen.url}`);
  expect(await page.locator('#failover').isHidden(), 'no banner on the leader');
  // Signed in there: a view that needs the token shows.
  await page.locator('#nav a[data-view="nodes"]').click();
  await page.locator('#main table').first().waitFor();
  await page.screenshot({ path: join(outDir, 'new-leader.png') });
  console.log(JSON.stringify({ ok: true, ...seen }));
} catch (e) {
  console.error(`ha: ${e.message}`);
  console.log(JSON.stringify({ ok: false, error: e.message, ...seen }));
  process.exitCode = 1;
} finally {
  await browser.close();
}

// What every script here starts with: Debian's Chromium, headless, with
// the flags this machine needs, and the one kind of check they make.

import { chromium } from 'playwright-core';
import { existsSync } from 'node:fs';

export const CHROMIUM = '/usr/bin/chromium';

/** Exits (3) naming the missing browser, before anything starts. */
export function requireChromium() {
  if (!existsSync(CHROMIUM)) {
    console.error(`${CHROMIUM} is missing: scripts/setup.sh installs Debian's chromium`);
    process.exit(3);
  }
}

/** Chromium, headless, as these tests run it. */
export function launch() {
  return chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
      '--disable-component-update', '--disable-sync'],
  });
}

/** Throws `expected <what>` unless `cond`. */
export function expect(cond, what) {
  if (!cond) throw new Error(`expected ${what}`);
}

// End-to-end test of the burst-tier simulator in headless Chromium.
//
//   CHARON_URL=http://127.0.0.1:7071 E2E_OUT=target/e2e node simulator.spec.mjs
//
// run.sh installs Chromium and playwright-core, starts a server and calls
// this. At 1280×800 and at a phone size it loads /simulator, picks the
// penalty preset, pauses the clock and sends a burst of 35 requests at one
// instant, then checks that the page shows the 6th request bursting into
// tier 2, the rejections once tier 2 holds its 25 hits, and tier 2's
// cooldown five seconds later (no burst then). Screenshots go to E2E_OUT.
// Any failed check, page error or console error exits non-zero.

import { mkdirSync } from 'node:fs';
import path from 'node:path';
import { chromium } from 'playwright-core';

const base = (process.env.CHARON_URL || 'http://127.0.0.1:7071').replace(/\/+$/, '');
const out = path.resolve(process.env.E2E_OUT || 'target/e2e');
const executablePath = process.env.CHROMIUM || '/usr/bin/chromium';
const ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];
const VIEWPORTS = [
  { name: '1280x800', viewport: { width: 1280, height: 800 }, full: true },
  { name: '390x844', viewport: { width: 390, height: 844 }, mobile: true },
];

mkdirSync(out, { recursive: true });

function fail(message) {
  throw new Error(message);
}

function check(condition, message) {
  if (!condition) fail(message);
}

// Polls `probe` until `ok(value)`; fails with the last value seen.
async function until(what, probe, ok, timeout = 10000) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    last = await probe();
    if (ok(last)) return last;
    if (Date.now() > deadline) fail(`timed out waiting for ${what}; last saw ${JSON.stringify(last)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

const text = (page, id) => page.getByTestId(id).innerText();
const attr = (page, id, name) => page.getByTestId(id).getAttribute(name);

// The log entry of request number `index` (0-based) as the page shows it.
async function entry(page, index) {
  const li = page.locator(`[data-testid="log-entry"][data-index="${index}"]`);
  if (await li.count() === 0) return null;
  return {
    granted: Number(await li.getAttribute('data-granted')),
    tier: Number(await li.getAttribute('data-tier')),
    burst: (await li.getAttribute('data-burst')) === 'true',
    text: (await li.innerText()).replace(/\s+/g, ' '),
  };
}

async function noHorizontalScroll(page, width) {
  const scroll = await page.evaluate(() => document.documentElement.scrollWidth);
  check(scroll <= width + 1, `the page scrolls sideways at ${width} px (scrollWidth ${scroll})`);
  const box = await page.getByTestId('timeline-svg').boundingBox();
  check(box && box.x >= 0 && box.x + box.width <= width + 1, `the timeline overflows at ${width} px: ${JSON.stringify(box)}`);
}

async function scenario(browser, v) {
  const context = await browser.newContext({
    viewport: v.viewport,
    deviceScaleFactor: 1,
    isMobile: Boolean(v.mobile),
    hasTouch: Boolean(v.mobile),
  });
  const page = await context.newPage();
  try {
    await steps(page, v);
  } catch (e) {
    await page.screenshot({ path: path.join(out, `simulator-${v.name}-FAILED.png`), fullPage: true }).catch(() => {});
    throw e;
  } finally {
    await context.close();
  }
}

async function steps(page, { name, viewport, full }) {
  const problems = [];
  let expect400 = false; // Chromium logs the 400 of a deliberately broken configuration
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() !== 'error') return;
    if (expect400 && m.text().includes('status of 400')) return;
    problems.push(`console error: ${m.text()}`);
  });
  page.on('requestfailed', (r) => problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));

  const response = await page.goto(`${base}/simulator`);
  check(response && response.ok(), `GET /simulator answered ${response && response.status()}`);
  await page.waitForSelector('body[data-ready="true"]');

  // The penalty preset: {5, 1s} + {25, 1s, active 5s, cooldown 15s}.
  await page.getByTestId('preset-penalty').click();
  check(await attr(page, 'preset-penalty', 'aria-pressed') === 'true', 'the penalty preset is not selected');
  check(await page.getByTestId('tier-2-limit').inputValue() === '25', 'tier 2 of the penalty preset should have limit 25');
  check(await page.getByTestId('tier-2-cooldown').inputValue() === '15s', 'tier 2 should cool down 15s');

  // Pause: the burst happens at one instant of the virtual clock.
  await page.getByTestId('pause').click();
  await until('the clock to pause', () => text(page, 'clock-state'), (t) => t === 'PAUSED');

  // 35 requests: 20 with the button, 15 with the R key.
  for (let i = 0; i < 20; i++) await page.getByTestId('request').click();
  await page.getByTestId('request').focus();
  for (let i = 0; i < 15; i++) await page.keyboard.press('r');
  await until('35 requests replayed', () => text(page, 'total-requests'), (t) => t === '35');

  const first = await entry(page, 0);
  check(first && first.granted === 1 && first.tier === 1 && first.burst, `request #1 should burst into tier 1: ${JSON.stringify(first)}`);
  const fifth = await entry(page, 4);
  check(fifth && fifth.granted === 1 && fifth.tier === 1 && !fifth.burst, `request #5 should be granted in tier 1: ${JSON.stringify(fifth)}`);
  const sixth = await entry(page, 5);
  check(sixth && sixth.granted === 1 && sixth.tier === 2 && sixth.burst && sixth.text.includes('BURST into tier 2'),
    `request #6 should burst into tier 2: ${JSON.stringify(sixth)}`);
  const thirtieth = await entry(page, 29);
  check(thirtieth && thirtieth.granted === 1 && thirtieth.tier === 2 && thirtieth.text.includes('25/25'),
    `request #30 should fill tier 2 (25/25): ${JSON.stringify(thirtieth)}`);
  for (let i = 30; i < 35; i++) {
    const e = await entry(page, i);
    check(e && e.granted === 0 && e.tier === 2 && e.text.includes('REJECTED') && e.text.includes('25/25'),
      `request #${i + 1} should be rejected with tier 2 full: ${JSON.stringify(e)}`);
  }
  check(await text(page, 'total-granted') === '30', 'the totals should count 30 granted requests');
  check(await text(page, 'total-rejected') === '5', 'the totals should count 5 rejected requests');
  check(await text(page, 'total-bursts') === '2', 'the totals should count 2 bursts');
  check(await text(page, 'tier-phase-2') === 'ACTIVE', 'tier 2 should be labelled ACTIVE');
  check(await attr(page, 'tier-card-2', 'data-current') === 'true', 'tier 2 should be current');
  check((await text(page, 'tier-card-2')).includes('CURRENT'), 'tier 2 card should say CURRENT');
  check((await text(page, 'tier-hits-2')).includes('25 / 25'), 'tier 2 should hold 25 / 25 hits');
  check((await text(page, 'tier-card-1')).includes('SHADOWED'), 'tier 1 should be labelled SHADOWED under tier 2');
  check((await text(page, 'current-tier')).startsWith('Current tier: 2'), 'the current tier should read 2');
  check(await page.getByTestId('lane-phase-2').textContent() === 'ACTIVE', 'the timeline lane of tier 2 should say ACTIVE');
  await noHorizontalScroll(page, viewport.width);
  // On a phone the timeline is below the controls: show it from its top.
  await page.locator('#timeline-h').evaluate((el) => el.scrollIntoView({ block: 'start' }));
  await page.screenshot({ path: path.join(out, `simulator-${name}-burst.png`) });

  // Five seconds later tier 2's active period is over: cooldown, tier 1 current.
  for (let i = 0; i < 5; i++) await page.getByTestId('step').click();
  await until('tier 2 to cool down', () => text(page, 'tier-phase-2'), (t) => t === 'COOLDOWN');
  check(await attr(page, 'tier-card-1', 'data-current') === 'true', 'tier 1 should be current again after the fallback');
  check((await text(page, 'current-tier')).startsWith('Current tier: 1'), 'the current tier should read 1 after the fallback');
  check((await text(page, 'tier-card-2')).includes('cooling down until'), 'tier 2 card should say until when it cools down');
  check(await page.getByTestId('lane-phase-2').textContent() === 'COOLDOWN', 'the timeline lane of tier 2 should say COOLDOWN');
  const bandLabels = await page.locator('[data-testid="timeline-svg"] .band-label').allTextContents();
  check(bandLabels.includes('COOLDOWN') && bandLabels.includes('ACTIVE'), `the timeline should label its bands: ${bandLabels}`);

  // During the cooldown tier 1 takes five more, and the sixth cannot burst.
  await page.getByTestId('request').focus();
  for (let i = 0; i < 6; i++) await page.keyboard.press('r');
  await until('41 requests replayed', () => text(page, 'total-requests'), (t) => t === '41');
  for (let i = 35; i < 40; i++) {
    const e = await entry(page, i);
    check(e && e.granted === 1 && e.tier === 1 && !e.burst, `request #${i + 1} should be granted in tier 1: ${JSON.stringify(e)}`);
  }
  const blocked = await entry(page, 40);
  check(blocked && blocked.granted === 0 && blocked.tier === 1 && blocked.text.includes('no burst is possible'),
    `request #41 should be rejected: tier 1 full and tier 2 cooling down: ${JSON.stringify(blocked)}`);

  // Let the clock run a little so the screenshot shows the timeline moving.
  await page.getByTestId('pause').click();
  await until('the clock to run', () => text(page, 'clock-state'), (t) => t.startsWith('RUNNING'));
  await page.waitForTimeout(600);
  await page.getByTestId('pause').click();
  await until('the cooldown to show', () => text(page, 'tier-phase-2'), (t) => t === 'COOLDOWN');

  await noHorizontalScroll(page, viewport.width);
  await page.evaluate(() => window.scrollTo(0, 0));
  await page.screenshot({ path: path.join(out, `simulator-${name}.png`) });
  await page.screenshot({ path: path.join(out, `simulator-${name}-full.png`), fullPage: true });

  if (full) {
    // The export is charon-core's YAML of the penalty configuration.
    await page.getByTestId('export').click();
    const yaml = await until('the YAML export', () => page.getByTestId('yaml').inputValue(), (v) => v.includes('resources'));
    for (const needle of ['name: api/search', 'kind: rate', 'limit: 25', 'active: 5s', 'cooldown: 15s']) {
      check(yaml.includes(needle), `the exported YAML lacks ${JSON.stringify(needle)}:\n${yaml}`);
    }

    // A broken field is reported at its path and marked on the input.
    expect400 = true;
    await page.getByTestId('tier-2-window').fill('1x');
    await until('the issue for tiers[1].window', () => text(page, 'issues'), (t) => t.includes('tiers[1].window'));
    check(await attr(page, 'tier-2-window', 'aria-invalid') === 'true', 'the broken window input should be marked invalid');
    await page.getByTestId('tier-2-window').fill('1s');
    await until('the issue to clear', () => text(page, 'issues'), (t) => t.trim() === '');
    expect400 = false;

    // The generator makes requests on its own.
    const before = Number(await text(page, 'total-requests'));
    await page.getByTestId('generator-rate').fill('20');
    await page.getByTestId('generator').check();
    await page.getByTestId('pause').click();
    await until('generated requests', () => text(page, 'total-requests'), (t) => Number(t) >= before + 10);
    await page.getByTestId('generator').uncheck();
  }

  check(problems.length === 0, `the page reported problems:\n${problems.join('\n')}`);
  console.log(`ok ${name}: burst into tier 2, rejections at 25/25, cooldown; screenshots in ${out}`);
}

const browser = await chromium.launch({ executablePath, args: ARGS, headless: true });
let failed = false;
try {
  for (const v of VIEWPORTS) {
    try {
      await scenario(browser, v);
    } catch (e) {
      failed = true;
      console.error(`FAIL ${v.name}: ${e.message}`);
    }
  }
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);

// End-to-end test of the limit simulator in headless Chromium.
//
//   CHARON_URL=http://127.0.0.1:7071 E2E_OUT=target/e2e node simulator.spec.mjs
//
// run.sh installs Chromium and playwright-core, starts a server and calls
// this. At 1280×800 and at a phone size it loads /simulator, picks the
// penalty preset, pauses the clock and sends a burst of 35 requests at one
// instant, then checks that the page shows the 6th request bursting into
// tier 2, the rejections once tier 2 holds its 25 hits, and tier 2's
// cooldown five seconds later (no burst then). Then it picks each preset of
// a bucket, a window or a queue (issue 11's cookbook) and checks the figures
// the page shows: the credit pool's 40 and 48, the registrations' retry
// after 50 ms, the sliding counter's estimate, the ban, the queue's delays
// 0…400 ms and its rejection, the LLM tokens' dry run, charge and debt;
// at 1280×800 it also switches the editor to a window by hand. Last, the
// throttler view: the same overload without a throttler and with `cost`.
// The stampede view: no limit, back-off and shared_result side by side.
// Screenshots go to E2E_OUT.
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

// The log entry of event `index` of a bucket, a window or a queue.
async function meterEntry(page, index) {
  const li = page.locator(`[data-testid="log-entry"][data-index="${index}"]`);
  if (await li.count() === 0) return null;
  const a = (name) => li.getAttribute(name);
  return {
    op: await a('data-op'),
    granted: Number(await a('data-granted')),
    remaining: Number(await a('data-remaining')),
    retry: await a('data-retry'),
    delay: await a('data-delay'),
    banned: (await a('data-banned')) === 'true',
    warning: (await a('data-warning')) === 'true',
    dryRun: (await a('data-dry-run')) === 'true',
    text: (await li.innerText()).replace(/\s+/g, ' '),
  };
}

// Picks a scripted preset and waits for its `events` to be replayed.
async function scripted(page, id, kind, events) {
  await page.getByTestId(`preset-${id}`).click();
  check(await attr(page, `preset-${id}`, 'aria-pressed') === 'true', `the ${id} preset is not selected`);
  await until(`${id}: ${events} events on a ${kind}`, async () => ({
    kind: await page.locator('[data-testid="meter-card"]').getAttribute('data-kind').catch(() => null),
    n: await page.locator('[data-testid="log-entry"]').count(),
  }), (v) => v.kind === kind && v.n === events);
  check(await text(page, 'clock-state') === 'PAUSED', `${id}: a scripted preset should pause the clock`);
  return (i) => meterEntry(page, i);
}

async function svgCount(page, cls) {
  return page.locator(`[data-testid="timeline-svg"] .${cls}`).count();
}

// Issue 11's cookbook presets, each with the figures of its recipe.
async function meterPresets(page, name, viewport) {
  let e = await scripted(page, 'credits', 'bucket', 4);
  let x = await e(2);
  check(x && x.granted === 20 && x.remaining === 40, `credits: the third POST should leave 40: ${JSON.stringify(x)}`);
  x = await e(3);
  check(x && x.granted === 2 && x.remaining === 48, `credits: the GET should leave 48: ${JSON.stringify(x)}`);
  check((await text(page, 'meter-level')).includes('48 / 100 tokens left'), 'credits: the card should say 48 / 100 tokens left');
  check(await page.getByTestId('lane-level').textContent() === '48/100', 'credits: the chart lane should say 48/100');
  check(await svgCount(page, 'level-line') === 1, 'credits: the bucket level should be drawn');
  await page.screenshot({ path: path.join(out, `simulator-${name}-credits.png`) });

  e = await scripted(page, 'registrations', 'bucket', 22);
  for (let i = 0; i < 20; i++) {
    x = await e(i);
    check(x && x.granted === 1, `registrations: request #${i + 1} should be granted: ${JSON.stringify(x)}`);
  }
  x = await e(20);
  check(x && x.granted === 0 && x.retry === '50' && x.text.includes('retry after 50 ms'),
    `registrations: the 21st should be told to retry after 50 ms: ${JSON.stringify(x)}`);
  x = await e(21);
  check(x && x.granted === 1, `registrations: one more 50 ms later should be granted: ${JSON.stringify(x)}`);

  e = await scripted(page, 'sliding', 'window', 10);
  x = await e(8);
  check(x && x.granted === 1 && x.remaining === 0, `sliding: the request at 78 s should be granted with 0 left: ${JSON.stringify(x)}`);
  x = await e(9);
  check(x && x.granted === 0 && x.text.includes('REJECTED'), `sliding: the next should be rejected: ${JSON.stringify(x)}`);
  const level = await text(page, 'meter-level');
  check(level.includes('4 / 7 hits in this window') && level.includes('estimate 7 / 7') && level.includes('5 in the previous window'),
    `sliding: the card should show the count and the estimate: ${level}`);
  check(await svgCount(page, 'estimate-line') === 1, 'sliding: the estimate should be drawn');

  e = await scripted(page, 'ban', 'window', 5);
  x = await e(1);
  check(x && x.granted === 0 && x.banned && x.retry === '3600000' && x.text.includes('BANNED'),
    `ban: the 2,001st should be rejected and banned for an hour: ${JSON.stringify(x)}`);
  for (const i of [2, 3]) {
    x = await e(i);
    check(x && x.granted === 0 && x.banned, `ban: event #${i + 1} should be rejected as banned: ${JSON.stringify(x)}`);
  }
  x = await e(3);
  check(x.retry === '1', `ban: the last millisecond of the ban should say retry after 1 ms: ${JSON.stringify(x)}`);
  x = await e(4);
  check(x && x.granted === 1 && !x.banned, `ban: the first request after the hour should be decided normally: ${JSON.stringify(x)}`);
  check(await text(page, 'total-banned') === '3', 'ban: three replies should say banned');
  check(await svgCount(page, 'ban-span') === 1, 'ban: the ban should be drawn as a span');
  await page.screenshot({ path: path.join(out, `simulator-${name}-ban.png`) });

  e = await scripted(page, 'queue', 'queue', 6);
  const delays = [];
  for (let i = 0; i < 5; i++) {
    x = await e(i);
    check(x && x.granted === 1, `queue: request #${i + 1} should be admitted: ${JSON.stringify(x)}`);
    delays.push(x.delay);
  }
  check(delays.join() === '0,100,200,300,400', `queue: the delays should be 0,100,200,300,400: ${delays}`);
  check(await page.locator('[data-testid="log-entry"][data-index="4"]').innerText().then((t) => t.includes('delay 400 ms')),
    'queue: the log should say delay 400 ms');
  x = await e(5);
  check(x && x.granted === 0 && x.text.includes('REJECTED') && x.retry === '100',
    `queue: the sixth should be rejected, retry after 100 ms: ${JSON.stringify(x)}`);
  check((await text(page, 'meter-level')).includes('0 / 5 waiting'), 'queue: a second later the backlog has drained');
  check(await svgCount(page, 'delay-bar') === 5, 'queue: the five delays given should be drawn');
  await page.screenshot({ path: path.join(out, `simulator-${name}-queue.png`) });

  e = await scripted(page, 'llm', 'bucket', 4);
  x = await e(0);
  check(x && x.dryRun && x.granted === 500 && x.remaining === 500 && x.text.includes('DRY RUN'),
    `llm: the dry run should be granted 500 with 500 left: ${JSON.stringify(x)}`);
  x = await e(1);
  check(x && x.op === 'charge' && x.granted === 1500 && x.remaining === 0 && x.retry === '30060' && x.warning,
    `llm: the charge should leave the bucket in debt, warned: ${JSON.stringify(x)}`);
  x = await e(2);
  check(x && x.granted === 0, `llm: a request in debt should be rejected: ${JSON.stringify(x)}`);
  x = await e(3);
  check(x && x.granted === 1, `llm: a request once the debt is paid back should be granted: ${JSON.stringify(x)}`);
  check(await svgCount(page, 'warn-mark') >= 1, 'llm: the warning should be marked on the chart');
  check(Number(await text(page, 'total-warnings')) >= 1, 'llm: the totals should count the warning');
  // The request row sends charges and refunds too.
  await page.getByTestId('op').selectOption('refund');
  await page.getByTestId('copies').fill('100');
  await page.getByTestId('request').click();
  await until('the refund', () => meterEntry(page, 4), (v) => v && v.op === 'refund' && v.granted === 100);
  await page.getByTestId('op').selectOption('request');
  await page.getByTestId('copies').fill('1');
  await noHorizontalScroll(page, viewport.width);
  await page.locator('#timeline-h').evaluate((el) => el.scrollIntoView({ block: 'start' }));
  await page.screenshot({ path: path.join(out, `simulator-${name}-llm.png`) });
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

  await meterPresets(page, name, viewport);

  if (full) {
    // The editor switches kinds: a window of 2 per second, made by hand.
    await page.getByTestId('reset').click();
    await page.getByTestId('kind').selectOption('window');
    await until('the window fields', () => page.getByTestId('meter-limit').count(), (n) => n === 1);
    check(await page.getByTestId('meter-algorithm').inputValue() === 'fixed', 'a new window should default to fixed');
    await page.getByTestId('meter-limit').fill('2');
    await page.getByTestId('request').focus();
    for (let i = 0; i < 3; i++) await page.keyboard.press('r');
    await until('three requests on the window', () => text(page, 'total-requests'), (t) => t === '3');
    const third = await meterEntry(page, 2);
    check(third && third.granted === 0 && third.retry === '1000', `the third request in the window should wait 1 s: ${JSON.stringify(third)}`);
    expect400 = true;
    await page.getByTestId('meter-window').fill('0s');
    await until('the issue for window', () => text(page, 'issues'), (t) => t.includes('window'));
    check(await attr(page, 'meter-window', 'aria-invalid') === 'true', 'the broken window field should be marked invalid');
    await page.getByTestId('meter-window').fill('1s');
    await until('the issue to clear', () => text(page, 'issues'), (t) => t.trim() === '');
    expect400 = false;
    await page.getByTestId('export').click();
    const yaml = await until('the window YAML', () => page.getByTestId('yaml').inputValue(), (v) => v.includes('kind: window'));
    check(yaml.includes('algorithm: fixed') && yaml.includes('limit: 2'), `the exported YAML of the window: ${yaml}`);
  }

  await throttlerView(page, name, viewport);
  await stampedeView(page, name, viewport);

  check(problems.length === 0, `the page reported problems:\n${problems.join('\n')}`);
  console.log(`ok ${name}: burst into tier 2, rejections at 25/25, cooldown; bucket, window, queue, ban and charge presets; throttler and stampede views; screenshots in ${out}`);
}

// The throttler view: the same overload without a throttler and with the
// cost discipline, as the server simulates it; the page only draws.
async function throttlerView(page, name, viewport) {
  const summary = page.getByTestId('throttler-summary');
  const runWith = async (discipline) => {
    await page.getByTestId('throttler-discipline').selectOption(discipline);
    await page.getByTestId('throttler-overload').fill('3');
    await page.getByTestId('throttler-run').click();
    return until(`the throttler run (${discipline})`, async () => ({
      discipline: await summary.getAttribute('data-discipline'),
      goodput: await summary.getAttribute('data-goodput'),
      critical: await summary.getAttribute('data-critical-success'),
      rejected: await summary.getAttribute('data-rejected'),
      evicted: await summary.getAttribute('data-evicted'),
    }), (v) => v.discipline === discipline && v.goodput !== null);
  };
  const none = await runWith('none');
  check(Number(none.goodput) < 0.3 && Number(none.rejected) === 0,
    `without a throttler at 3× the service should drown: ${JSON.stringify(none)}`);
  const cost = await runWith('cost');
  check(Number(cost.goodput) > 0.8 && Number(cost.critical) > 0.9 && Number(cost.rejected) > 0 && Number(cost.evicted) > 0,
    `the cost throttler at 3× should keep goodput and CRITICAL requests, rejecting and evicting the rest: ${JSON.stringify(cost)}`);
  check(await page.locator('[data-testid="throttler-chart"] rect.started').count() > 0, 'the chart should show started requests');
  check(await page.locator('[data-testid="throttler-chart"] rect.rejected').count() > 0, 'the chart should show rejections');
  check(await page.getByTestId('throttler-queue-line').count() === 1, 'the chart should show the queue');
  await noHorizontalScroll(page, viewport.width);
  await page.getByTestId('throttler').screenshot({ path: path.join(out, `simulator-${name}-throttler.png`) });
}

// The stampede view: 300 callers of a 50 ms computation, all arriving
// before the first result; the three ways side by side, as the server
// decides them.
async function stampedeView(page, name, viewport) {
  await page.getByTestId('to-stampede').click();
  await page.getByTestId('stampede-callers').fill('300');
  await page.getByTestId('stampede-work').fill('50');
  await page.getByTestId('stampede-spread').fill('40');
  await page.getByTestId('stampede-run').click();
  const mode = (m) => page.getByTestId(`stampede-mode-${m}`);
  const figures = async (m) => ({
    computations: await mode(m).getAttribute('data-computations'),
    resultReady: await mode(m).getAttribute('data-result-ready'),
    p99: await mode(m).getAttribute('data-p99'),
    ops: await mode(m).getAttribute('data-copy-ops'),
  });
  const none = await until('the stampede run', async () => (await mode('no_limit').count()) === 1
    && (await page.getByTestId('stampede-callers').inputValue()) === '300'
    && (await page.getByTestId('stampede-status').getAttribute('data-done')) === 'true'
    ? figures('no_limit') : null, (v) => v !== null && v.computations === '300');
  const backoff = await figures('backoff');
  const shared = await figures('shared_result');
  check(none.computations === '300', `without a limit every caller computes: ${JSON.stringify(none)}`);
  check(backoff.computations === '1' && Number(backoff.ops) > 1,
    `with a copy limit and back-off one computes, the others retry: ${JSON.stringify(backoff)}`);
  check(shared.computations === '1' && Number(shared.resultReady) > 0 && Number(shared.p99) <= 50
    && Number(shared.p99) < Number(backoff.p99),
    `with shared_result one computes and the waiters get its result at once: ${JSON.stringify(shared)} vs ${JSON.stringify(backoff)}`);
  for (const m of ['no_limit', 'backoff', 'shared_result']) {
    check(await page.locator(`[data-testid="stampede-chart-${m}"] rect`).count() > 0, `the ${m} chart should show results`);
  }
  await noHorizontalScroll(page, viewport.width);
  await page.getByTestId('stampede').screenshot({ path: path.join(out, `simulator-${name}-stampede.png`) });
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

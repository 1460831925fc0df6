// Charon limit simulator: the page.
//
// The page owns a virtual clock (milliseconds, driven by real time) and the
// list of requests made so far. It never decides anything itself: whenever
// the list, the configuration or the clock moves, it sends everything to
// POST /simulator/api/run, which replays the list from empty state through
// charon-core's decisions (burst tiers, buckets, windows, queues), and draws
// what comes back: for a bucket, a window or a queue even the level between
// events comes from the server (`series`).
'use strict';

(() => {
  const API = '/simulator/api';
  const REFRESH_MS = 250; // how often a running clock re-asks for the state
  const EDIT_DEBOUNCE_MS = 300;
  const LOG_ROWS = 300;
  const NOW_AT = 0.75; // where "now" sits across the plot: 75% past, 25% future
  const SVG_NS = 'http://www.w3.org/2000/svg';

  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({
    '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;',
  }[c]));
  const secs = (ms) => (ms / 1000).toFixed(3) + ' s';
  const shortSecs = (ms) => {
    const s = ms / 1000;
    return (Number.isInteger(s) ? String(s) : s.toFixed(1)) + ' s';
  };

  const sim = {
    vnow: 0,
    running: true,
    speed: 1,
    lastFrame: null,
    events: [],
    maxEvents: 20000,
    maxEventTiers: 200000,
    presets: [],
    preset: null,
    config: { kind: 'rate', name: 'api/example', hardLimit: '', tiers: [], meter: {} },
    defaultSpan: 30000,
    result: null,
    issues: [],
    error: null,
    inflight: false,
    dirty: true,
    lastRun: 0,
    editTimer: null,
    gen: { on: false, rate: 4, burst: 0.3, nextAt: null },
    span: 30000,
    layout: null,
  };

  // ---- what is sent ------------------------------------------------------

  const numberOrText = (s) => (/^\d+$/.test(s) ? Number(s) : s);

  // The fields of the kinds other than `rate` (SPEC §7–10), with a hint each.
  const METER_FIELDS = {
    bucket: [['burst', 'tokens, e.g. 100'], ['count', 'back per period'], ['period', 'e.g. 1m']],
    window: [['algorithm', ''], ['limit', 'hits per window'], ['window', 'e.g. 1m']],
    queue: [['rate', 'leave per period'], ['period', 'e.g. 1s'], ['size', 'may wait']],
  };
  const SHARED_FIELDS = [['soft_limit', 'e.g. 80%'], ['ban', 'e.g. 1h']];
  const METER_DEFAULTS = {
    bucket: { burst: '10', count: '10', period: '1s' },
    window: { algorithm: 'fixed', limit: '10', window: '1s' },
    queue: { rate: '10', period: '1s', size: '5' },
  };
  const KIND_TITLE = { bucket: 'Bucket', window: 'Window', queue: 'Queue' };
  const isMeter = () => sim.config.kind !== 'rate';
  const meterKeys = (kind) => METER_FIELDS[kind].concat(SHARED_FIELDS).map(([k]) => k);

  function tierBody(t) {
    const o = {
      limit: t.limit.trim() === '' ? null : numberOrText(t.limit.trim()),
      window: t.window.trim(),
    };
    if (t.active.trim() !== '') o.active = t.active.trim();
    if (t.cooldown.trim() !== '') o.cooldown = t.cooldown.trim();
    o.skippable = Boolean(t.skippable);
    return o;
  }

  function configBody() {
    if (isMeter()) {
      const b = { name: sim.config.name, kind: sim.config.kind };
      for (const key of meterKeys(sim.config.kind)) {
        const v = (sim.config.meter[key] || '').trim();
        if (v !== '') b[key] = numberOrText(v);
      }
      return b;
    }
    const b = { name: sim.config.name, tiers: sim.config.tiers.map(tierBody) };
    const h = sim.config.hardLimit.trim();
    if (h !== '') b.hard_limit = numberOrText(h);
    return b;
  }

  function runBody() {
    const b = configBody();
    b.events = sim.events;
    b.at = Math.floor(sim.vnow);
    // Older requests are replayed (they decide the state) but not listed.
    b.report_from = Math.max(0, Math.floor(sim.vnow - sim.span));
    b.detail = 'replies';
    return b;
  }

  async function post(path, body) {
    const res = await fetch(API + path, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    let data = null;
    try {
      data = await res.json();
    } catch (e) {
      data = { error: 'http', message: `HTTP ${res.status}` };
    }
    return { ok: res.ok, data };
  }

  async function run() {
    sim.inflight = true;
    sim.dirty = false;
    sim.lastRun = performance.now();
    try {
      const { ok, data } = await post('/run', runBody());
      if (ok) {
        sim.result = data;
        sim.issues = [];
        sim.error = null;
      } else if (data.error === 'invalid') {
        sim.result = null;
        sim.issues = data.issues || [];
        sim.error = null;
      } else {
        sim.error = data.message || 'the server refused the replay';
      }
    } catch (e) {
      sim.error = `The server did not answer (${e.message}).`;
    } finally {
      sim.inflight = false;
      renderRun();
    }
  }

  // ---- requests and the generator ---------------------------------------

  function amount() {
    const copies = Number($('copies').value);
    const min = Number($('min-copies').value);
    if (!Number.isInteger(copies) || !Number.isInteger(min) || copies < 1 || min < 1 || min > copies) {
      return null;
    }
    return { copies, min };
  }

  // `op`: request, charge or refund; `dry` marks a dry run (SPEC §10).
  function addEvent(t, a, op = 'request', dry = false) {
    // A replay does at most maxEventTiers events × tiers (a bucket, a
    // window or a queue counts as one).
    const tiers = isMeter() ? 1 : sim.config.tiers.length;
    const cap = Math.min(sim.maxEvents, Math.floor(sim.maxEventTiers / Math.max(1, tiers)));
    if (sim.events.length >= cap) {
      setStatus(isMeter()
        ? `The simulation holds ${cap} events, the most one replay takes. Reset to go on.`
        : `The simulation holds ${cap} requests with ${tiers} tiers, the most one replay takes. Reset to go on.`);
      if (sim.gen.on) setGenerator(false);
      return false;
    }
    const last = sim.events.length ? sim.events[sim.events.length - 1].t : 0;
    const ev = { t: Math.max(Math.floor(t), last) };
    if (op !== 'request') ev.op = op;
    if (a.copies !== 1) ev.copies = a.copies;
    if (a.min !== 1 && op === 'request') ev.min_copies = a.min;
    if (dry) ev.dry_run = true;
    sim.events.push(ev);
    sim.dirty = true;
    return true;
  }

  function request() {
    const a = amount();
    if (!a) {
      setStatus('copies and min_copies must be whole numbers ≥ 1, with min_copies ≤ copies.');
      return;
    }
    flushGenerator();
    const op = isMeter() ? $('op').value : 'request';
    const dry = isMeter() && op === 'request' && $('dry-run').checked;
    if (addEvent(sim.vnow, a, op, dry)) setStatus('');
  }

  // Burstiness b: requests come in clumps of about 1 + 9b at once; the gaps
  // between clumps are regular at b = 0 and random (exponential) at b = 1.
  // The mean rate stays what was asked for.
  function scheduleNext(from) {
    const g = sim.gen;
    const clump = 1 + 9 * g.burst;
    const mean = (1000 * clump) / g.rate;
    const random = -Math.log(1 - Math.random()) * mean;
    g.nextAt = from + (1 - g.burst) * mean + g.burst * random;
  }

  function clumpSize() {
    const extra = 9 * sim.gen.burst;
    return extra <= 0 ? 1 : 1 + Math.round(-Math.log(1 - Math.random()) * extra);
  }

  function flushGenerator() {
    const g = sim.gen;
    if (!g.on || !(g.rate > 0)) return;
    if (g.nextAt === null) scheduleNext(sim.vnow);
    const a = amount() || { copies: 1, min: 1 };
    while (g.nextAt <= sim.vnow) {
      for (let n = clumpSize(); n > 0; n--) {
        if (!addEvent(g.nextAt, a)) return;
      }
      scheduleNext(g.nextAt);
    }
  }

  function setGenerator(on) {
    sim.gen.on = on;
    sim.gen.nextAt = null;
    $('gen-on').checked = on;
  }

  // ---- clock ------------------------------------------------------------

  function setRunning(running) {
    sim.running = running;
    $('pause').textContent = running ? 'Pause' : 'Resume';
    sim.dirty = true;
  }

  function reset() {
    sim.events = [];
    sim.vnow = 0;
    sim.result = null;
    sim.gen.nextAt = null;
    sim.dirty = true;
    setStatus('');
  }

  function frame(ts) {
    // A hidden tab gets no frames; its time is not simulated (at most a
    // quarter second per frame), so coming back does not flood the replay.
    const dt = sim.lastFrame === null ? 0 : Math.min(ts - sim.lastFrame, 250);
    sim.lastFrame = ts;
    if (sim.running) sim.vnow += dt * sim.speed;
    flushGenerator();
    if (sim.running && performance.now() - sim.lastRun >= REFRESH_MS) sim.dirty = true;
    if (sim.dirty && !sim.inflight) run();
    drawClock();
    drawMoving();
    requestAnimationFrame(frame);
  }

  function drawClock() {
    $('clock').textContent = 't = ' + secs(sim.vnow);
    const badge = $('clock-state');
    badge.textContent = sim.running ? `RUNNING ×${sim.speed}` : 'PAUSED';
    badge.dataset.state = sim.running ? 'running' : 'paused';
  }

  // `problem`: the text says something went wrong (shown as such).
  function setStatus(text, problem = true) {
    $('status').textContent = text;
    $('status').dataset.kind = problem ? 'problem' : 'info';
  }

  // ---- configuration editor ---------------------------------------------

  const FIELDS = [
    { key: 'limit', label: 'limit', hint: 'hits per window', mode: 'numeric' },
    { key: 'window', label: 'window', hint: 'e.g. 1s' },
    { key: 'active', label: 'active', hint: '∞ if empty' },
    { key: 'cooldown', label: 'cooldown', hint: 'e.g. 15s' },
  ];

  // Shows what belongs to the kind: tiers and hard_limit for `rate`, the
  // kind's fields, op and dry run for the others.
  function showKind() {
    const m = isMeter();
    document.querySelectorAll('.meter-only').forEach((el) => { el.hidden = !m; });
    document.querySelectorAll('.rate-only').forEach((el) => { el.hidden = m; });
  }

  function renderMeterFields() {
    const box = $('meter-fields');
    if (!isMeter()) {
      box.textContent = '';
      return;
    }
    const m = sim.config.meter;
    box.innerHTML = METER_FIELDS[sim.config.kind].concat(SHARED_FIELDS).map(([key, hint]) => (key === 'algorithm'
      ? `<label class="stack">algorithm
          <select data-field="algorithm" data-path="algorithm" data-testid="meter-algorithm">
            <option value="fixed">fixed</option><option value="sliding_counter">sliding_counter</option>
          </select></label>`
      : `<label class="stack">${key}
          <input data-field="${key}" data-path="${key}" value="${esc(m[key] || '')}" placeholder="${esc(hint)}"
            spellcheck="false" data-testid="meter-${key}" aria-label="${key}"></label>`)).join('');
    const alg = box.querySelector('select');
    if (alg) alg.value = m.algorithm || 'fixed';
  }

  function onMeterInput(e) {
    const field = e.target.dataset.field;
    if (!field) return;
    sim.config.meter[field] = e.target.value;
    configChanged(false);
  }

  function onKind(e) {
    const kind = e.target.value;
    sim.config.kind = kind;
    if (kind !== 'rate') {
      for (const [k, v] of Object.entries(METER_DEFAULTS[kind])) {
        if (!(sim.config.meter[k] || '').trim()) sim.config.meter[k] = v;
      }
    }
    sim.issues = [];
    sim.result = null;
    configChanged(true);
  }

  function renderEditor() {
    $('kind').value = sim.config.kind;
    showKind();
    renderMeterFields();
    $('name').value = sim.config.name;
    $('hard-limit').value = sim.config.hardLimit;
    const list = $('tiers');
    list.textContent = '';
    const n = sim.config.tiers.length;
    sim.config.tiers.forEach((t, i) => {
      const li = document.createElement('li');
      li.className = 'tier-edit';
      li.setAttribute('data-testid', `tier-edit-${i + 1}`);
      const fields = FIELDS.map((f) => `
        <label class="stack">${f.label}
          <input data-index="${i}" data-field="${f.key}" data-path="tiers[${i}].${f.key}"
            value="${esc(t[f.key])}" placeholder="${esc(f.hint)}" spellcheck="false"
            ${f.mode ? `inputmode="${f.mode}"` : ''} aria-label="tier ${i + 1} ${f.label}"
            data-testid="tier-${i + 1}-${f.key}">
        </label>`).join('');
      li.innerHTML = `
        <div class="tier-edit-head">
          <strong>Tier ${i + 1}</strong>
          <span class="tier-edit-actions">
            <button type="button" data-action="up" data-index="${i}" ${i === 0 ? 'disabled' : ''}
              aria-label="Move tier ${i + 1} up the list (it becomes tier ${i})">↑</button>
            <button type="button" data-action="down" data-index="${i}" ${i === n - 1 ? 'disabled' : ''}
              aria-label="Move tier ${i + 1} down the list (it becomes tier ${i + 2})">↓</button>
            <button type="button" data-action="remove" data-index="${i}"
              aria-label="Remove tier ${i + 1}" data-testid="tier-${i + 1}-remove">Remove</button>
          </span>
        </div>
        <div class="tier-fields">${fields}
          <label class="check"><input type="checkbox" data-index="${i}" data-field="skippable"
            data-path="tiers[${i}].skippable" ${t.skippable ? 'checked' : ''}
            data-testid="tier-${i + 1}-skippable"> skippable</label>
        </div>`;
      list.appendChild(li);
    });
    markIssues();
  }

  function configChanged(structural) {
    sim.preset = null;
    renderPresetButtons();
    if (structural) renderEditor();
    clearTimeout(sim.editTimer);
    sim.editTimer = setTimeout(() => { sim.dirty = true; }, structural ? 0 : EDIT_DEBOUNCE_MS);
  }

  function onTierInput(e) {
    const el = e.target;
    const i = Number(el.dataset.index);
    const field = el.dataset.field;
    if (!field || !sim.config.tiers[i]) return;
    sim.config.tiers[i][field] = field === 'skippable' ? el.checked : el.value;
    configChanged(false);
  }

  function onTierAction(e) {
    const button = e.target.closest('button[data-action]');
    if (!button) return;
    const i = Number(button.dataset.index);
    const tiers = sim.config.tiers;
    const swap = (a, b) => { [tiers[a], tiers[b]] = [tiers[b], tiers[a]]; };
    if (button.dataset.action === 'up' && i > 0) swap(i, i - 1);
    if (button.dataset.action === 'down' && i < tiers.length - 1) swap(i, i + 1);
    if (button.dataset.action === 'remove') tiers.splice(i, 1);
    configChanged(true);
  }

  function addTier() {
    const last = sim.config.tiers[sim.config.tiers.length - 1];
    const limit = last && /^\d+$/.test(last.limit.trim()) ? Number(last.limit) * 5 : 5;
    sim.config.tiers.push({ limit: String(limit || 5), window: '1s', active: '5s', cooldown: '15s', skippable: false });
    configChanged(true);
  }

  function markIssues() {
    document.querySelectorAll('[data-path]').forEach((el) => el.removeAttribute('aria-invalid'));
    for (const issue of sim.issues) {
      const el = document.querySelector(`[data-path="${CSS.escape(issue.path)}"]`);
      if (el) el.setAttribute('aria-invalid', 'true');
    }
  }

  function renderIssues() {
    markIssues();
    const box = $('issues');
    if (!sim.issues.length) {
      box.textContent = '';
      return;
    }
    box.innerHTML = `<p><strong>PROBLEM${sim.issues.length > 1 ? 'S' : ''}:</strong> the replay needs a valid configuration.</p><ul>${
      sim.issues.map((i) => `<li>${i.path ? `<code>${esc(i.path)}</code> ` : ''}${esc(i.message)}</li>`).join('')
    }</ul>`;
  }

  function renderAdjustments(adjustments) {
    const box = $('adjustments');
    if (!adjustments || !adjustments.length) {
      box.textContent = '';
      return;
    }
    box.innerHTML = `<p><strong>NORMALIZED</strong> (SPEC §2): the limiter enforces this configuration as</p><ul>${
      adjustments.map((a) => `<li><code>${esc(a.path)}</code> ${esc(a.change)}</li>`).join('')
    }</ul><p class="hint">Tier numbers on the timeline follow the normalized list.</p>`;
  }

  // ---- presets ----------------------------------------------------------

  function renderPresetButtons() {
    const box = $('preset-buttons');
    box.textContent = '';
    for (const p of sim.presets) {
      const b = document.createElement('button');
      b.type = 'button';
      b.textContent = p.title;
      b.setAttribute('data-testid', `preset-${p.id}`);
      b.setAttribute('aria-pressed', String(sim.preset === p.id));
      b.addEventListener('click', () => loadPreset(p.id));
      box.appendChild(b);
    }
    const p = sim.presets.find((x) => x.id === sim.preset);
    $('preset-summary').textContent = p ? p.summary : 'Custom configuration.';
  }

  function setSpan(ms) {
    sim.span = ms;
    $('span').value = String(ms);
    sim.layout = null;
    sim.dirty = true;
  }

  // A preset of a bucket, a window or a queue brings the cookbook's events
  // (`script`): they are loaded with the clock paused at `script.at`, so
  // the recipe's figures show at once. The others start a fresh clock.
  function loadPreset(id) {
    const p = sim.presets.find((x) => x.id === id);
    if (!p) return;
    const meter = {};
    if (p.kind) {
      for (const key of meterKeys(p.kind)) if (p[key] != null) meter[key] = String(p[key]);
    }
    sim.config = {
      kind: p.kind || 'rate',
      meter,
      name: p.name,
      hardLimit: p.hard_limit == null ? '' : String(p.hard_limit),
      tiers: (p.tiers || []).map((t) => ({
        limit: String(t.limit),
        window: t.window,
        active: t.active || '',
        cooldown: t.cooldown || '',
        skippable: Boolean(t.skippable),
      })),
    };
    sim.issues = [];
    renderEditor();
    reset();
    if (p.script) {
      setGenerator(false);
      sim.events = p.script.events.map((e) => ({ ...e }));
      sim.vnow = p.script.at;
      setRunning(false);
      setSpan(p.script.span);
    } else {
      setRunning(true);
      if (sim.span !== sim.defaultSpan) setSpan(sim.defaultSpan);
    }
    sim.preset = id;
    renderPresetButtons();
    $('yaml').value = '';
  }

  // ---- export -----------------------------------------------------------

  async function exportYaml() {
    try {
      const { ok, data } = await post('/yaml', configBody());
      if (ok) {
        $('yaml').value = data.yaml;
        setStatus('YAML exported below: paste it into a configuration file.', false);
      } else {
        sim.issues = data.issues || [];
        renderIssues();
        $('yaml').value = '';
        setStatus('The configuration has problems; nothing exported.');
      }
    } catch (e) {
      setStatus(`The server did not answer (${e.message}).`);
    }
  }

  async function copyYaml() {
    const area = $('yaml');
    if (!area.value) await exportYaml();
    try {
      await navigator.clipboard.writeText(area.value);
    } catch (e) {
      area.select();
      document.execCommand('copy');
    }
    setStatus('YAML copied.', false);
  }

  // ---- rendering a replay -----------------------------------------------

  function tierParams(t) {
    const active = t.active ? `active ${t.active}` : 'active for ever';
    return `${t.limit} per ${t.window} · ${active} · cooldown ${t.cooldown}${t.skippable ? ' · skippable' : ''}`;
  }

  function renderRun() {
    renderIssues();
    const r = sim.result;
    if (sim.error) setStatus(sim.error);
    renderAdjustments(r && r.adjustments);
    if (r && r.kind) {
      renderMeterCard(r);
      renderMeterLog(r);
    } else {
      renderCards(r);
      renderLog(r);
    }
    renderTotals(r);
    layoutTimeline();
    drawMarks();
    drawMoving();
  }

  function renderTotals(r) {
    const t = r ? r.totals : { requests: 0, granted_requests: 0, rejected_requests: 0, granted_hits: 0 };
    $('total-requests').textContent = t.requests;
    $('total-granted').textContent = t.granted_requests;
    $('total-rejected').textContent = t.rejected_requests;
    $('total-hits').textContent = t.granted_hits;
    $('total-bursts').textContent = t.bursts || 0;
    $('total-warnings').textContent = t.warnings || 0;
    $('total-banned').textContent = t.banned || 0;
  }

  const PHASE_LABEL = { active: 'ACTIVE', cooldown: 'COOLDOWN', inactive: 'INACTIVE' };

  function timing(s, now) {
    if (s.phase === 'active') {
      if (s.active_until === null) return 'active for ever';
      const cool = s.cooldown_until > s.active_until ? `, then cooldown until ${secs(s.cooldown_until)}` : '';
      return `active until ${secs(s.active_until)} (${shortSecs(s.active_until - now)} left)${cool}`;
    }
    if (s.phase === 'cooldown') {
      return `cooling down until ${secs(s.cooldown_until)} (${shortSecs(s.cooldown_until - now)} left): no burst into it`;
    }
    return s.limit === 0 ? 'limit 0: never entered' : 'not entered: a burst may enter it';
  }

  function meter(hits, limit) {
    if (limit > 0 && limit <= 60) {
      let cells = '';
      for (let k = 0; k < limit; k++) cells += `<span class="slot${k < hits ? ' full' : ''}"></span>`;
      return `<div class="slots" aria-hidden="true">${cells}</div>`;
    }
    return `<meter class="bar" min="0" max="${Math.max(limit, 1)}" value="${Math.min(hits, limit)}" aria-hidden="true"></meter>`;
  }

  function renderCards(r) {
    const box = $('tier-cards');
    const current = $('current-tier');
    if (!r) {
      box.textContent = '';
      current.textContent = sim.issues.length ? 'Current tier: — (the configuration has problems)' : 'Current tier: —';
      return;
    }
    const tiers = r.resource.tiers || [];
    const now = r.now;
    const cur = now.current_tier;
    current.textContent = cur === 0
      ? (tiers.length
        ? 'Current tier: 0 (no tier active): the next request tries to burst into tier 1.'
        : 'Current tier: 0 (no tiers): every request is rejected.')
      : `Current tier: ${cur} (${tiers[cur - 1].limit} per ${tiers[cur - 1].window}).`;
    current.dataset.tier = String(cur);
    // Highest tier first, as on the timeline.
    box.innerHTML = now.tiers.slice().reverse().map((s) => {
      const t = tiers[s.tier - 1];
      const role = s.current ? '<span class="badge badge-current">CURRENT</span>'
        : s.shadowed ? '<span class="badge badge-shadowed">SHADOWED</span>' : '';
      return `
      <article class="tier-card phase-${s.phase}${s.current ? ' is-current' : ''}" data-testid="tier-card-${s.tier}"
        data-phase="${s.phase}" data-current="${s.current}" data-shadowed="${s.shadowed}" data-hits="${s.hits}">
        <h3>Tier ${s.tier}
          <span class="badge badge-${s.phase}" data-testid="tier-phase-${s.tier}">${PHASE_LABEL[s.phase]}</span>
          ${role}</h3>
        <p class="params">${esc(tierParams(t))}</p>
        ${meter(s.hits, s.limit)}
        <p class="hits" data-testid="tier-hits-${s.tier}"><strong>${s.hits} / ${s.limit}</strong> hits in window${
          s.shadowed ? ' (kept while shadowed)' : ''}</p>
        <p class="timing">${esc(timing(s, now.t))}</p>
      </article>`;
    }).join('');
  }

  function placedText(placed) {
    return placed.map((p) => `tier ${p.tier}${p.hits > 1 ? ` ×${p.hits}` : ''}`).join(', ');
  }

  function renderLog(r) {
    const list = $('log');
    const note = $('log-note');
    if (!r) {
      list.textContent = '';
      note.textContent = '';
      return;
    }
    const events = r.events;
    const shown = events.slice(-LOG_ROWS).reverse();
    const notes = [];
    if (r.skipped > 0) notes.push(`${r.skipped} earlier requests are replayed but not listed (older than the timeline span).`);
    if (events.length > LOG_ROWS) notes.push(`Showing the latest ${LOG_ROWS} of ${events.length}.`);
    note.textContent = notes.join(' ');
    list.innerHTML = shown.map((e) => {
      const rp = e.reply;
      const ask = e.copies > 1 ? ` ×${e.copies}${e.min_copies > 1 ? ` (min ${e.min_copies})` : ''}` : '';
      let text;
      if (rp.granted > 0) {
        text = `<span class="verdict">✓ GRANTED</span> ${rp.granted}${ask ? ` of${ask}` : ''} → ${placedText(e.placed)}`
          + ` · ${rp.tier_hits}/${rp.tier_limit} in tier ${rp.tier}'s window`
          + (rp.burst ? ` · <span class="burst">⇑ BURST into tier ${rp.tier}</span>` : '');
      } else {
        let why;
        if (rp.hard_limited) why = `hard limit ${rp.hard_limit} per second reached`;
        else if (rp.tier === 0) why = 'no tier could be entered';
        else why = `tier ${rp.tier} holds ${rp.tier_hits}/${rp.tier_limit} and no burst is possible`;
        text = `<span class="verdict">✕ REJECTED</span>${ask} · ${why}`;
      }
      return `<li class="${rp.granted > 0 ? 'granted' : 'rejected'}" data-testid="log-entry" data-index="${e.index}"
        data-granted="${rp.granted}" data-tier="${rp.tier}" data-burst="${rp.burst}">
        <time>${secs(e.t)}</time> <span class="req">#${e.index + 1}</span> ${text}</li>`;
    }).join('');
  }

  // ---- buckets, windows, queues ------------------------------------------

  function meterParams(res) {
    let p;
    if (res.kind === 'bucket') p = `burst ${res.burst} · ${res.count} back per ${res.period}`;
    else if (res.kind === 'window') p = `${res.algorithm} · ${res.limit} per ${res.window}`;
    else p = `${res.rate} leave per ${res.period} · size ${res.size}`;
    if (res.soft_limit) p += ` · soft_limit ${res.soft_limit}`;
    if (res.ban) p += ` · ban ${res.ban}`;
    return p;
  }

  // What the level is in words, at one reading of the server's.
  function levelText(r, l) {
    if (r.kind === 'bucket') return `${l.remaining} / ${r.limit} tokens left`;
    if (r.kind === 'queue') return `${l.usage} / ${r.limit} waiting (backlog)`;
    const est = l.previous !== undefined ? ` · estimate ${l.estimate} / ${r.limit} (with ${l.previous} in the previous window)` : '';
    return `${l.count} / ${r.limit} hits in this window${est}`;
  }

  function renderMeterCard(r) {
    const n = r.now;
    const title = KIND_TITLE[r.kind];
    const current = $('current-tier');
    current.textContent = `${title}: ${levelText(r, n)}${n.banned_until != null ? ' · BANNED' : ''}.`;
    current.dataset.tier = '';
    const banned = n.banned_until != null;
    // A bucket's slots are its tokens left; a window's and a queue's, what is used.
    const slots = r.kind === 'bucket' ? n.remaining : Math.min(n.usage, r.limit);
    $('tier-cards').innerHTML = `
      <article class="tier-card is-current" data-testid="meter-card" data-kind="${r.kind}"
        data-remaining="${n.remaining}" data-usage="${n.usage}" data-banned="${banned}" data-warning="${n.warning}">
        <h3>${title}
          ${banned ? '<span class="badge badge-banned" data-testid="meter-banned">BANNED</span>' : ''}
          ${n.warning ? '<span class="badge badge-warning" data-testid="meter-warning">WARNING</span>' : ''}</h3>
        <p class="params">${esc(meterParams(r.resource))}</p>
        ${meter(slots, r.limit)}
        <p class="hits" data-testid="meter-level"><strong>${esc(levelText(r, n))}</strong></p>
        ${banned ? `<p class="timing">banned until ${secs(n.banned_until)} (${shortSecs(n.banned_until - n.t)} left): every request is rejected</p>` : ''}
        ${n.warning ? `<p class="timing">usage ${n.usage} is at or above the soft limit (${r.soft_threshold})</p>` : ''}
        <p class="timing">${n.usage === 0 && !banned ? 'nothing to remember' : `back to empty state in ${shortSecs(n.reset_after_ms)}`}</p>
      </article>`;
  }

  function renderMeterLog(r) {
    const list = $('log');
    const events = r.events;
    const shown = events.slice(-LOG_ROWS).reverse();
    const notes = [];
    if (r.skipped > 0) notes.push(`${r.skipped} earlier events are replayed but not listed (older than the timeline span).`);
    if (events.length > LOG_ROWS) notes.push(`Showing the latest ${LOG_ROWS} of ${events.length}.`);
    $('log-note').textContent = notes.join(' ');
    list.innerHTML = shown.map((e) => {
      const rp = e.reply;
      const ask = e.copies > 1 ? ` ×${e.copies}${e.min_copies > 1 ? ` (min ${e.min_copies})` : ''}` : '';
      const rem = ` · remaining ${rp.remaining}/${rp.limit}`;
      const retry = rp.retry_after_ms === null ? ' · never: more than the limit'
        : rp.retry_after_ms > 0 ? ` · retry after ${rp.retry_after_ms} ms` : '';
      const flags = (rp.warning ? ' · <span class="flag">⚠ WARNING</span>' : '')
        + (rp.banned ? ' · <span class="flag">⛔ BANNED</span>' : '');
      let text;
      let ok = rp.granted > 0;
      if (e.op === 'charge') {
        text = `<span class="verdict">CHARGED</span> ${rp.granted}${rem}${retry}`;
        ok = true;
      } else if (e.op === 'refund') {
        text = `<span class="verdict">REFUNDED</span> ${rp.granted}${rem}`;
        ok = true;
      } else if (ok) {
        text = `<span class="verdict">✓ ${e.dry_run ? 'DRY RUN: would be GRANTED' : 'GRANTED'}</span> ${rp.granted}${ask ? ` of${ask}` : ''}${rem}`
          + (rp.delay_ms != null ? ` · delay ${rp.delay_ms} ms` : '')
          + (e.dry_run ? ' · nothing recorded' : '');
      } else {
        text = `<span class="verdict">✕ ${e.dry_run ? 'DRY RUN: would be REJECTED' : 'REJECTED'}</span>${ask}${rem}${retry}`;
      }
      return `<li class="${ok ? 'granted' : 'rejected'}" data-testid="log-entry" data-index="${e.index}" data-op="${e.op}"
        data-granted="${rp.granted}" data-remaining="${rp.remaining}" data-retry="${rp.retry_after_ms}"
        data-delay="${rp.delay_ms ?? ''}" data-banned="${rp.banned}" data-warning="${rp.warning}" data-dry-run="${e.dry_run}">
        <time>${secs(e.t)}</time> <span class="req">#${e.index + 1}</span> ${text}${flags}</li>`;
    }).join('');
  }

  // The values a kind draws from a reading: the main line, and the
  // estimate of a sliding counter.
  function levelValue(kind, l) {
    if (kind === 'bucket') return l.remaining;
    if (kind === 'window') return l.count;
    return l.usage;
  }

  function drawMeterMarks(L, r, g) {
    const vmax = Math.max(r.limit, ...r.series.map((l) => Math.max(levelValue(r.kind, l), l.estimate || 0)), 1);
    L.vmax = vmax;
    const y = (v) => L.chartY + L.chartH - 12 - (v / vmax) * (L.chartH - 26);
    L.levelY = y;
    for (const b of r.bans) {
      const x0 = b.from * L.scale;
      const w = Math.max(1, (b.until - b.from) * L.scale);
      g.appendChild(svg('rect', { x: x0, y: L.chartY + 2, width: w, height: L.reqY + L.reqH - L.chartY - 4, class: 'ban-span' }));
      g.appendChild(svg('text', { x: x0 + 4, y: L.chartY + 14, class: 'ban-label' }, 'BANNED'));
    }
    const line = (pick, cls) => {
      const pts = r.series.map((l) => `${l.t * L.scale},${y(pick(l))}`).join(' ');
      g.appendChild(svg('polyline', { points: pts, class: cls }));
    };
    if (r.kind === 'window' && r.resource.algorithm === 'sliding_counter') line((l) => l.estimate, 'estimate-line');
    line((l) => levelValue(r.kind, l), 'level-line');
    const perT = new Map();
    for (const e of r.events) {
      if (e.reply.warning) {
        g.appendChild(svg('text', { x: e.t * L.scale, y: y(levelValue(r.kind, e.after)) - 5, class: 'warn-mark', 'text-anchor': 'middle' }, '⚠'));
      }
      if (r.kind === 'queue' && e.op === 'request' && e.reply.granted > 0 && !e.dry_run) {
        const k = perT.get(e.t) || 0;
        perT.set(e.t, k + 1);
        const dy = L.delayY + 5 + (k % 5) * 5;
        const x0 = e.t * L.scale;
        g.appendChild(svg('line', { x1: x0, x2: x0 + Math.max(2, e.reply.delay_ms * L.scale), y1: dy, y2: dy, class: 'delay-bar' }));
      }
    }
  }

  // ---- timeline ---------------------------------------------------------

  function svg(tag, attrs, text) {
    const el = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    return el;
  }

  // Sizes of the timeline; rebuilt when the width or the tier count change.
  function layoutTimeline() {
    const box = $('lanes');
    const width = Math.max(280, box.clientWidth);
    const r = sim.result;
    const kind = r && r.kind ? r.kind : '';
    const n = r && !kind ? r.now.tiers.length : 0;
    const key = `${width}/${n}/${sim.span}/${Boolean(r)}/${kind}`;
    if (sim.layout && sim.layout.key === key) return;
    const narrow = width < 560;
    const gutter = narrow ? 74 : 104;
    const laneH = 50;
    const reqH = 36;
    const axisH = 20;
    const top = 4;
    const plotW = width - gutter - 6;
    // A bucket, a window or a queue: one chart lane of its level (and for
    // a queue a lane of the delays it gave) instead of the tier lanes.
    const chartH = kind ? 130 : 0;
    const delayH = kind === 'queue' ? 32 : 0;
    const chartY = top + n * laneH;
    const delayY = chartY + chartH;
    const reqY = delayY + delayH;
    const height = reqY + reqH + axisH;
    const L = {
      key, width, height, gutter, plotW, laneH, reqH, top, n, narrow, kind, chartY, chartH, delayY, delayH,
      scale: plotW / sim.span,
      nowX: gutter + plotW * NOW_AT,
      reqY,
      axisY: reqY + reqH,
    };
    L.laneY = (tier) => top + (n - tier) * laneH;
    box.textContent = '';
    if (!r) {
      const p = document.createElement('p');
      p.className = 'lanes-empty';
      p.textContent = sim.issues.length
        ? 'No timeline: the configuration has problems (see Configuration).'
        : 'Waiting for the first replay…';
      box.appendChild(p);
      sim.layout = L;
      L.svg = null;
      return;
    }
    const root = svg('svg', {
      width, height, viewBox: `0 0 ${width} ${height}`, role: 'img',
      'aria-label': kind
        ? `Timeline: the ${kind}'s level over time${kind === 'queue' ? ', the delays given' : ''} and a lane of requests`
        : 'Timeline: one lane per tier, highest first, and a lane of requests',
      'data-testid': 'timeline-svg',
    });
    const defs = svg('defs');
    const hatch = svg('pattern', { id: 'hatch', width: 7, height: 7, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' });
    hatch.appendChild(svg('rect', { width: 7, height: 7, class: 'hatch-bg' }));
    hatch.appendChild(svg('line', { x1: 0, y1: 0, x2: 0, y2: 7, class: 'hatch-line' }));
    defs.appendChild(hatch);
    const clip = svg('clipPath', { id: 'plot-clip' });
    clip.appendChild(svg('rect', { x: gutter, y: 0, width: plotW, height }));
    defs.appendChild(clip);
    root.appendChild(defs);
    for (let i = 0; i <= n; i++) {
      const y = top + i * laneH;
      root.appendChild(svg('line', { x1: 0, x2: width, y1: y, y2: y, class: 'lane-sep' }));
    }
    for (const y of kind ? [delayY, reqY] : []) {
      if (y > chartY) root.appendChild(svg('line', { x1: 0, x2: width, y1: y, y2: y, class: 'lane-sep' }));
    }
    L.gutterG = svg('g', { class: 'gutter' });
    root.appendChild(L.gutterG);
    const plot = svg('g', { 'clip-path': 'url(#plot-clip)' });
    L.bandsG = svg('g', { class: 'bands' });
    L.marksG = svg('g', { class: 'marks' });
    L.windowsG = svg('g', { class: 'windows' });
    L.limitsG = svg('g', { class: 'limits' });
    plot.append(L.bandsG, L.limitsG, L.marksG, L.windowsG);
    plot.appendChild(svg('line', { x1: L.nowX, x2: L.nowX, y1: 0, y2: L.axisY, class: 'now-line' }));
    root.appendChild(plot);
    root.appendChild(svg('text', { x: L.nowX + 3, y: L.axisY + 14, class: 'now-label' }, 'now'));
    L.axisG = svg('g', { class: 'axis' });
    root.appendChild(L.axisG);
    box.appendChild(root);
    L.svg = root;
    sim.layout = L;
  }

  // Marks at fixed times (hits, requests) live in one group that the frame
  // loop only slides; they are rebuilt when a replay answers.
  function drawMarks() {
    const L = sim.layout;
    const r = sim.result;
    if (!L || !L.svg || !r) return;
    const g = L.marksG;
    g.textContent = '';
    const hits = new Map(); // "tier/t" → hits
    const reqs = new Map(); // t → {granted, rejected}
    if (r.kind) drawMeterMarks(L, r, g);
    for (const e of r.events) {
      for (const p of e.placed || []) {
        const k = `${p.tier}/${e.t}`;
        hits.set(k, (hits.get(k) || 0) + p.hits);
      }
      // Charges and refunds are drawn with the grants: they never fail.
      const q = reqs.get(e.t) || { granted: 0, rejected: 0 };
      if (e.reply.granted > 0) q.granted++; else q.rejected++;
      reqs.set(e.t, q);
    }
    // Counts label marks that stand for several hits or requests; where
    // marks crowd, a count is drawn only if it does not overlap the last.
    const lastLabel = new Map();
    const count = (row, x, y, n) => {
      const text = String(n);
      if (n < 2 || x < (lastLabel.get(row) ?? -Infinity)) return;
      g.appendChild(svg('text', { x, y, class: 'hit-count' }, text));
      lastLabel.set(row, x + 6 * text.length + 3);
    };
    for (const [k, n] of hits) {
      const [tier, t] = k.split('/').map(Number);
      const x = t * L.scale;
      const y = L.laneY(tier);
      g.appendChild(svg('line', { x1: x, x2: x, y1: y + 14, y2: y + L.laneH - 18, class: 'hit' }));
      count(`tier${tier}`, x + 2, y + 12, n);
    }
    for (const [t, q] of reqs) {
      const x = t * L.scale;
      if (q.granted) {
        g.appendChild(svg('text', { x, y: L.reqY + 14, class: 'req-granted', 'text-anchor': 'middle' }, '✓'));
        count('granted', x + 6, L.reqY + 12, q.granted);
      }
      if (q.rejected) {
        g.appendChild(svg('text', { x, y: L.reqY + 31, class: 'req-rejected', 'text-anchor': 'middle' }, '✕'));
        count('rejected', x + 6, L.reqY + 29, q.rejected);
      }
    }
    // Gutter: which tier, its phase in words, and its role.
    const gg = L.gutterG;
    gg.textContent = '';
    if (r.kind) {
      const what = { bucket: 'tokens left', window: 'hits in window', queue: 'backlog' }[r.kind];
      gg.appendChild(svg('text', { x: 4, y: L.chartY + 15, class: 'gutter-tier is-current' }, KIND_TITLE[r.kind]));
      gg.appendChild(svg('text', { x: 4, y: L.chartY + 30, class: 'gutter-role' }, what));
      gg.appendChild(svg('text', { x: 4, y: L.chartY + 46, class: 'gutter-phase', 'data-testid': 'lane-level' },
        `${levelValue(r.kind, r.now)}/${r.limit}`));
      if (r.kind === 'window' && r.resource.algorithm === 'sliding_counter') {
        gg.appendChild(svg('text', { x: 4, y: L.chartY + 61, class: 'gutter-role' }, `- - estimate ${r.now.estimate}`));
      }
      if (r.now.banned_until != null) gg.appendChild(svg('text', { x: 4, y: L.chartY + 76, class: 'ban-label' }, 'BANNED'));
      if (r.kind === 'queue') gg.appendChild(svg('text', { x: 4, y: L.delayY + 15, class: 'gutter-role' }, 'delays given'));
    }
    for (const s of (r.kind ? [] : r.now.tiers)) {
      const y = L.laneY(s.tier);
      const role = s.current ? 'current' : s.shadowed ? 'shadowed' : '';
      gg.appendChild(svg('text', { x: 4, y: y + 15, class: `gutter-tier${s.current ? ' is-current' : ''}` },
        `${s.current ? '▶ ' : ''}Tier ${s.tier}`));
      gg.appendChild(svg('text', { x: 4, y: y + 30, class: 'gutter-phase', 'data-testid': `lane-phase-${s.tier}` },
        PHASE_LABEL[s.phase]));
      if (role) gg.appendChild(svg('text', { x: 4, y: y + 44, class: 'gutter-role' }, role));
    }
    gg.appendChild(svg('text', { x: 4, y: L.reqY + 15, class: 'gutter-tier' }, 'Requests'));
    gg.appendChild(svg('text', { x: 4, y: L.reqY + 30, class: 'gutter-role' }, '✓ above, ✕ below'));
  }

  // Steps of whole minutes are labelled in minutes (spans up to two hours).
  const axisLabel = (t, step) => (step >= 60000 && step % 60000 === 0 ? `${t / 60000} min` : shortSecs(t));

  const AXIS_STEPS = [100, 200, 500, 1000, 2000, 5000, 10000, 15000, 30000, 60000, 120000, 300000,
    600000, 1200000, 1800000, 3600000];

  // What moves with the clock: the marks' offset, phase bands, windows, axis.
  function drawMoving() {
    const L = sim.layout;
    const r = sim.result;
    if (!L || !L.svg || !r) return;
    const v = sim.vnow;
    const x = (t) => L.nowX + (t - v) * L.scale;
    const from = v - sim.span * NOW_AT;
    const to = v + sim.span * (1 - NOW_AT);
    L.marksG.setAttribute('transform', `translate(${L.nowX - v * L.scale} 0)`);

    const bands = [];
    const band = (tier, start, end, kind) => {
      const s = Math.max(start, from);
      const e = Math.min(end, to);
      if (e <= s) return;
      const y = L.laneY(tier);
      const x0 = x(s);
      const w = x(e) - x0;
      bands.push(`<rect x="${x0}" y="${y + 2}" width="${w}" height="${L.laneH - 4}" class="band band-${kind}"/>`);
      const label = kind === 'active' ? 'ACTIVE' : 'COOLDOWN';
      if (w > label.length * 6.6 + 6) {
        bands.push(`<text x="${x0 + 4}" y="${y + L.laneH - 7}" class="band-label">${label}</text>`);
      }
    };
    (r.periods || []).forEach((periods, i) => {
      for (const p of periods) {
        const activeEnd = p.active_until === null ? Infinity : p.active_until;
        band(i + 1, p.entered, activeEnd, 'active');
        if (p.cooldown_until !== null && p.cooldown_until > activeEnd) band(i + 1, activeEnd, p.cooldown_until, 'cooldown');
      }
    });
    L.bandsG.innerHTML = bands.join('');

    const windows = [];
    if (r.kind) {
      // The limit (and the soft limit) across the chart, with the level at now.
      const lines = [];
      const y = L.levelY;
      const hline = (v, cls, label) => {
        lines.push(`<line x1="${L.gutter}" x2="${L.gutter + L.plotW}" y1="${y(v)}" y2="${y(v)}" class="${cls}"/>`);
        lines.push(`<text x="${L.gutter + 3}" y="${y(v) - 3}" class="chart-label">${esc(label)}</text>`);
      };
      if (y) {
        hline(r.limit, 'limit-line', `limit ${r.limit}`);
        if (r.soft_threshold != null && r.soft_threshold < r.limit) hline(r.soft_threshold, 'soft-line', `soft limit ${r.soft_threshold}`);
        windows.push(`<text x="${L.nowX + 4}" y="${y(levelValue(r.kind, r.now)) + 4}" class="window-label">${levelValue(r.kind, r.now)}/${r.limit}</text>`);
      }
      L.limitsG.innerHTML = lines.join('');
    }
    for (const s of (r.kind ? [] : r.now.tiers)) {
      if (s.phase !== 'active') continue;
      const y = L.laneY(s.tier);
      const x0 = x(Math.max(v - s.window_ms, from - 10));
      windows.push(`<rect x="${x0}" y="${y + 5}" width="${L.nowX - x0}" height="${L.laneH - 10}"
        class="window${s.current ? ' window-current' : ''}"/>`);
      const label = L.narrow ? `${s.hits}/${s.limit}` : `${s.hits}/${s.limit} in window`;
      windows.push(`<text x="${L.nowX + 4}" y="${y + L.laneH / 2 + 4}" class="window-label">${label}</text>`);
    }
    L.windowsG.innerHTML = windows.join('');

    const step = AXIS_STEPS.find((s) => s * L.scale >= (L.narrow ? 48 : 64)) || 7200000;
    const ticks = [];
    for (let t = Math.ceil(Math.max(0, from) / step) * step; t <= to; t += step) {
      const tx = x(t);
      if (tx < L.gutter + 8) continue;
      ticks.push(`<line x1="${tx}" x2="${tx}" y1="${L.axisY}" y2="${L.axisY + 4}" class="tick"/>`);
      if (Math.abs(tx - L.nowX) > 26) {
        ticks.push(`<text x="${tx}" y="${L.axisY + 15}" class="tick-label" text-anchor="middle">${axisLabel(t, step)}</text>`);
      }
    }
    L.axisG.innerHTML = ticks.join('');
  }

  // ---- wiring -----------------------------------------------------------

  function bind() {
    $('request').addEventListener('click', request);
    $('pause').addEventListener('click', () => setRunning(!sim.running));
    $('step').addEventListener('click', () => {
      sim.vnow += 1000;
      flushGenerator();
      sim.dirty = true;
    });
    $('reset').addEventListener('click', reset);
    $('speed').addEventListener('change', (e) => { sim.speed = Number(e.target.value); });
    $('span').addEventListener('change', (e) => {
      sim.span = Number(e.target.value);
      sim.dirty = true;
    });
    $('gen-on').addEventListener('change', (e) => setGenerator(e.target.checked));
    $('gen-rate').addEventListener('input', (e) => {
      sim.gen.rate = Math.min(200, Math.max(0, Number(e.target.value) || 0));
      sim.gen.nextAt = null;
    });
    $('gen-burst').addEventListener('input', (e) => {
      sim.gen.burst = Number(e.target.value);
      $('gen-burst-out').textContent = sim.gen.burst.toFixed(2);
      sim.gen.nextAt = null;
    });
    $('name').addEventListener('input', (e) => { sim.config.name = e.target.value; configChanged(false); });
    $('hard-limit').addEventListener('input', (e) => { sim.config.hardLimit = e.target.value; configChanged(false); });
    $('tiers').addEventListener('input', onTierInput);
    $('tiers').addEventListener('change', onTierInput);
    $('tiers').addEventListener('click', onTierAction);
    $('kind').addEventListener('change', onKind);
    $('meter-fields').addEventListener('input', onMeterInput);
    $('meter-fields').addEventListener('change', onMeterInput);
    $('add-tier').addEventListener('click', addTier);
    $('export').addEventListener('click', exportYaml);
    $('copy-yaml').addEventListener('click', copyYaml);
    document.addEventListener('keydown', (e) => {
      if (e.ctrlKey || e.metaKey || e.altKey) return;
      const tag = e.target && e.target.tagName;
      if (tag === 'INPUT' || tag === 'TEXTAREA' || tag === 'SELECT' || (e.target && e.target.isContentEditable)) return;
      if (e.key === 'r' || e.key === 'R') {
        e.preventDefault();
        request();
      } else if (e.key === 'p' || e.key === 'P') {
        e.preventDefault();
        setRunning(!sim.running);
      }
    });
    new ResizeObserver(() => {
      sim.layout = null;
      layoutTimeline();
      drawMarks();
      drawMoving();
    }).observe($('lanes'));
  }

  async function start() {
    if (window.innerWidth < 560) {
      // A phone shows ten seconds: thirty would squeeze a second into 9 px.
      sim.span = 10000;
      sim.defaultSpan = 10000;
      $('span').value = '10000';
    }
    bind();
    try {
      const res = await fetch(API + '/presets');
      const data = await res.json();
      sim.presets = data.presets;
      sim.maxEvents = data.max_events;
      if (data.max_event_tiers) sim.maxEventTiers = data.max_event_tiers;
    } catch (e) {
      setStatus(`Could not load the presets (${e.message}).`);
    }
    const wanted = location.hash.slice(1);
    loadPreset(sim.presets.some((p) => p.id === wanted) ? wanted : 'simple');
    document.body.dataset.ready = 'true';
    requestAnimationFrame(frame);
  }

  start();
})();

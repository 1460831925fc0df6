// The hot-page stampede view of the simulator page: sends the form to
// POST /simulator/api/stampede and draws the three ways side by side (no
// limit, a copy limit with retries after back-off, shared_result with
// waiting). Every copy decision is made on the server by Charon's engine on
// a virtual clock; this script only reads the form and draws.
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);
  const SVG = 'http://www.w3.org/2000/svg';
  const TITLES = {
    no_limit: 'No limit',
    backoff: 'Copy limit 1, retry with back-off',
    shared_result: 'Copy limit 1, shared_result waiting',
  };

  function body() {
    const num = (id) => Math.round(Number($(id).value));
    return {
      callers: num('stp-callers'),
      work_ms: num('stp-work'),
      spread_ms: num('stp-spread'),
      backoff_ms: num('stp-backoff'),
      seed: num('stp-seed'),
    };
  }

  function el(ns, name, attrs, parent) {
    const e = ns ? document.createElementNS(ns, name) : document.createElement(name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    if (parent) parent.appendChild(e);
    return e;
  }

  // When the callers of one mode got their result: a histogram on the
  // time axis every mode shares.
  function chart(m, answer, most, parent) {
    const W = 300, H = 120, top = 14, bottom = 14;
    const svg = el(SVG, 'svg', {
      class: 'stp-chart', viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img',
      'aria-label': `When callers got their result (${m.mode})`, 'data-testid': `stampede-chart-${m.mode}`,
    }, parent);
    const bw = W / m.histogram.length;
    m.histogram.forEach((v, i) => {
      if (v === 0) return;
      const h = (v / most) * (H - top - bottom);
      el(SVG, 'rect', { x: i * bw, y: H - bottom - h, width: Math.max(bw - 0.5, 0.5), height: h }, svg);
    });
    el(SVG, 'text', { x: 2, y: 11 }, svg).textContent = `${most} callers per ${answer.bucket_ms} ms`;
    el(SVG, 'text', { x: W - 2, y: H - 2, 'text-anchor': 'end' }, svg).textContent =
      `${answer.bucket_ms * m.histogram.length} ms`;
  }

  function draw(answer) {
    const box = $('stp-modes');
    box.replaceChildren();
    const most = Math.max(1, ...answer.modes.flatMap((m) => m.histogram));
    for (const m of answer.modes) {
      const card = el(null, 'div', {
        class: 'stp-mode', 'data-testid': `stampede-mode-${m.mode}`, 'data-mode': m.mode,
        'data-computations': m.computations, 'data-p50': m.p50_ms, 'data-p99': m.p99_ms,
        'data-result-ready': m.result_ready, 'data-copy-ops': m.copy_ops_per_caller,
      }, box);
      el(null, 'h3', {}, card).textContent = TITLES[m.mode] || m.mode;
      const dl = el(null, 'dl', {}, card);
      for (const [k, v] of [
        ['computations', m.computations],
        ['result p50 / p99', `${m.p50_ms} / ${m.p99_ms} ms`],
        ['copy operations per caller', m.copy_ops_per_caller],
        ['woken with the result', m.result_ready],
        ['read from the cache', m.from_cache],
      ]) {
        el(null, 'dt', {}, dl).textContent = k;
        el(null, 'dd', {}, dl).textContent = String(v);
      }
      chart(m, answer, most, card);
    }
  }

  // Only the latest run is drawn: an earlier answer arriving late is dropped.
  let latest = 0;

  async function run() {
    const mine = ++latest;
    const status = $('stp-status');
    status.textContent = 'running…';
    delete status.dataset.done;
    try {
      const r = await fetch('/simulator/api/stampede', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body()),
      });
      const answer = await r.json();
      if (mine !== latest) return;
      if (!r.ok) {
        status.textContent = answer.message || `error ${r.status}`;
        status.dataset.error = 'true';
        return;
      }
      delete status.dataset.error;
      status.textContent = `${answer.callers} callers over ${answer.spread_ms} ms, a computation of ${answer.work_ms} ms, `
        + `back-off from ${answer.backoff_ms} ms (seed ${answer.seed}); times are until each caller had its result`;
      draw(answer);
      status.dataset.done = 'true';
    } catch (e) {
      status.textContent = `the server did not answer: ${e}`;
    }
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('stp-run').addEventListener('click', run);
    run();
  });
})();

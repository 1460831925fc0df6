// The throttler view of the simulator page: sends the form to
// POST /simulator/api/throttle and draws what the server answers (the
// queue, admissions and rejections over time). Every arrival, decision
// and the service itself are simulated on the server by Charon's
// throttler engine; this script only reads the form and draws.
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);
  const SVG = 'http://www.w3.org/2000/svg';

  function body() {
    const num = (id) => Number($(id).value);
    return {
      discipline: $('thr-discipline').value,
      capacity: num('thr-capacity'),
      queue_ms: Math.round(num('thr-queue')),
      max_wait_ms: Math.round(num('thr-wait')),
      cheap_ms: num('thr-cheap'),
      expensive_ms: num('thr-expensive'),
      expensive_share: num('thr-exp-share') / 100,
      critical_share: num('thr-crit-share') / 100,
      overload: num('thr-overload'),
      seconds: Math.round(num('thr-seconds')),
      seed: 1,
    };
  }

  function el(name, attrs, parent) {
    const e = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    if (parent) parent.appendChild(e);
    return e;
  }

  const pct = (x) => (x === null || x === undefined ? '–' : `${Math.round(x * 1000) / 10} %`);
  const ms = (x) => (x === null || x === undefined ? '–' : `${x} ms`);

  function draw(answer) {
    const s = answer.summary;
    const summary = $('thr-summary');
    summary.dataset.goodput = String(Math.min(1, s.goodput));
    summary.dataset.criticalSuccess = String(s.critical_success ?? '');
    summary.dataset.rejected = String(s.rejected);
    summary.dataset.evicted = String(s.evicted);
    summary.dataset.discipline = s.discipline;
    const rate = s.rate === null ? 'no throttler' : `${s.discipline} at ${s.rate}/s, queue ${s.queue}`;
    summary.textContent = `${rate} · ${s.arrivals} arrivals (capacity ${s.capacity_rps} requests/s) · `
      + `goodput ${pct(Math.min(1, s.goodput))} · CRITICAL success ${pct(s.critical_success)} · `
      + `admitted latency p50 ${ms(s.p50_ms)}, p99 ${ms(s.p99_ms)} · `
      + `${s.admitted} started, ${s.rejected} rejected, ${s.evicted} evicted, ${s.expired} expired`;

    const svg = $('thr-chart');
    svg.replaceChildren();
    const t = answer.timeline;
    if (t.length === 0) return;
    const W = 1000, H = 260, top = 10, bottom = 20;
    const bw = W / t.length;
    const most = Math.max(1, ...t.map((b) => b.started + b.rejected + b.evicted + b.expired));
    const deepest = Math.max(1e-9, ...t.map((b) => b.queue_units));
    const y = (v) => H - bottom - (v / most) * (H - top - bottom);
    t.forEach((b, i) => {
      let base = 0;
      for (const kind of ['started', 'rejected', 'evicted', 'expired']) {
        const v = b[kind];
        if (v > 0) {
          el('rect', { class: kind, x: i * bw, y: y(base + v), width: Math.max(bw - 0.5, 0.5), height: y(base) - y(base + v) }, svg);
        }
        base += v;
      }
    });
    const qy = (v) => H - bottom - (v / deepest) * (H - top - bottom);
    const points = t.map((b, i) => `${(i + 0.5) * bw},${qy(b.queue_units)}`).join(' ');
    el('polyline', { class: 'queue', points, 'data-testid': 'throttler-queue-line' }, svg);
    const label = el('text', { x: 4, y: 14 }, svg);
    label.textContent = `${most} requests per ${t.length > 1 ? t[1].t - t[0].t : 100} ms · queue up to ${Math.round(deepest * 10) / 10} units`;
    const end = el('text', { x: W - 4, y: H - 5, 'text-anchor': 'end' }, svg);
    end.textContent = `${t[t.length - 1].t / 1000 + (t.length > 1 ? (t[1].t - t[0].t) / 1000 : 0.1)} s`;
  }

  async function run() {
    const summary = $('thr-summary');
    summary.textContent = 'running…';
    delete summary.dataset.goodput;
    try {
      const r = await fetch('/simulator/api/throttle', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body()),
      });
      const answer = await r.json();
      if (!r.ok) {
        summary.textContent = answer.message || `error ${r.status}`;
        summary.dataset.error = 'true';
        return;
      }
      delete summary.dataset.error;
      draw(answer);
    } catch (e) {
      summary.textContent = `the server did not answer: ${e}`;
    }
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('thr-run').addEventListener('click', run);
    run();
  });
})();

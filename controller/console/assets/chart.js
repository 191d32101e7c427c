// Loom Console: the canvas chart, and the series and markers it draws.
import {cleanups, fmt, h, num} from './core.js';

// ------------------------------------------------------------------ chart

export const COLORS = [
  '#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2', '#4b5563', '#db2777', '#65a30d',
  '#7c3aed', '#0d9488', '#a16207'
];

// Draws lines with their min..max bands on a canvas, with vertical
// markers; dragging selects a range (onZoom(x0, x1)), a double click
// resets it (onZoom(null)). lines: [{label, color, points: [{x, y, lo, hi}]}].
export function chart(lines, {markers = [], onZoom, xLabel = 'step', height = 260} = {}) {
  const canvas = h('canvas', {class: 'chart', height: String(height)});
  const readout = h('div', {class: 'muted'}, '\u00a0');
  const legend =
      h('div', {class: 'legend'},
        lines.map((l) => h('span', {}, Object.assign(h('span', {class: 'swatch'}), {}), l.label)));
  legend.querySelectorAll('.swatch').forEach((s, i) => {
    s.style.background = lines[i].color;
  });
  let xs = [Infinity, -Infinity], ys = [Infinity, -Infinity];
  for (const l of lines) {
    for (const p of l.points) {
      if (!Number.isFinite(p.x)) continue;
      xs = [Math.min(xs[0], p.x), Math.max(xs[1], p.x)];
      for (const v of [p.lo, p.hi, p.y]) {
        if (Number.isFinite(v)) ys = [Math.min(ys[0], v), Math.max(ys[1], v)];
      }
    }
  }
  // What the first line holds, for scripts (the browser test counts the
  // steps a page shows): its distinct steps, its first and its last.
  const held = lines.length ? lines[0].points.filter((p) => Number.isFinite(p.x)) : [];
  canvas.dataset.steps = String(new Set(held.map((p) => p.x)).size);
  if (held.length) {
    canvas.dataset.firstStep = String(held[0].x);
    canvas.dataset.lastStep = String(held[held.length - 1].x);
  }
  const pad = {l: 64, r: 12, t: 10, b: 28};
  let drag = null;
  const draw = () => {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 600, hh = height;
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(hh * dpr);
    const g = canvas.getContext('2d');
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, hh);
    g.font = '11px system-ui, sans-serif';
    if (!(xs[0] <= xs[1]) || !(ys[0] <= ys[1])) {
      g.fillStyle = '#667';
      g.fillText('no steps yet', w / 2 - 30, hh / 2);
      return;
    }
    const x0 = xs[0], x1 = xs[1] === xs[0] ? xs[0] + 1 : xs[1];
    const span = ys[1] - ys[0] || Math.abs(ys[0]) || 1;
    const y0 = ys[0] - span * 0.05, y1 = ys[1] + span * 0.05;
    const X = (x) => pad.l + (x - x0) / (x1 - x0) * (w - pad.l - pad.r);
    const Y = (y) => hh - pad.b - (y - y0) / (y1 - y0) * (hh - pad.t - pad.b);
    g.strokeStyle = '#d8dde3';
    g.fillStyle = '#667';
    for (let i = 0; i <= 4; i++) {
      const yv = y0 + (y1 - y0) * i / 4, yp = Y(yv);
      g.beginPath();
      g.moveTo(pad.l, yp);
      g.lineTo(w - pad.r, yp);
      g.stroke();
      g.fillText(fmt(yv, 3), 4, yp + 4);
      const xv = x0 + (x1 - x0) * i / 4;
      g.fillText(fmt(Math.round(xv), 6), Math.min(X(xv) - 10, w - 60), hh - 10);
    }
    g.fillText(xLabel, w - pad.r - 40, hh - 1);
    // Labels of markers close together go on rows of their own.
    let lastLabelX = -Infinity, row = 0;
    for (const m of markers) {
      if (!(m.x >= x0 && m.x <= x1)) continue;
      g.strokeStyle = m.color;
      g.setLineDash([4, 3]);
      g.beginPath();
      g.moveTo(X(m.x), pad.t);
      g.lineTo(X(m.x), hh - pad.b);
      g.stroke();
      g.setLineDash([]);
      g.fillStyle = m.color;
      row = X(m.x) - lastLabelX < 60 ? (row + 1) % 4 : 0;
      lastLabelX = X(m.x);
      g.fillText(m.label, X(m.x) + 2, pad.t + 10 + 12 * row);
    }
    for (const l of lines) {
      const pts = l.points.filter((p) => Number.isFinite(p.x) && Number.isFinite(p.y));
      g.fillStyle = l.color + '26';
      for (const p of pts) {
        if (Number.isFinite(p.lo) && Number.isFinite(p.hi) && p.hi > p.lo) {
          const xp = X(p.x);
          g.fillRect(xp - 1, Y(p.hi), 2, Math.max(1, Y(p.lo) - Y(p.hi)));
        }
      }
      g.strokeStyle = l.color;
      g.lineWidth = 1.5;
      g.beginPath();
      pts.forEach((p, i) => (i ? g.lineTo(X(p.x), Y(p.y)) : g.moveTo(X(p.x), Y(p.y))));
      g.stroke();
      g.lineWidth = 1;
    }
    if (drag && drag.x1 !== undefined) {
      g.fillStyle = 'rgba(37,99,235,0.12)';
      g.fillRect(
          Math.min(drag.x0, drag.x1), pad.t, Math.abs(drag.x1 - drag.x0), hh - pad.t - pad.b);
    }
    canvas._toX = (px) => x0 + (px - pad.l) / (w - pad.l - pad.r) * (x1 - x0);
  };
  canvas.addEventListener('pointerdown', (e) => {
    drag = {x0: e.offsetX};
  });
  canvas.addEventListener('pointermove', (e) => {
    if (drag) {
      drag.x1 = e.offsetX;
      draw();
    }
    if (!canvas._toX) return;
    const x = canvas._toX(e.offsetX);
    const parts = [xLabel + ' ' + fmt(Math.round(x), 8)];
    for (const l of lines) {
      let best = null;
      for (const p of l.points)
        if (!best || Math.abs(p.x - x) < Math.abs(best.x - x)) best = p;
      if (best)
        parts.push(
            l.label + ' ' + fmt(best.y) +
            (best.hi > best.lo ? ' [' + fmt(best.lo) + ', ' + fmt(best.hi) + ']' : ''));
    }
    readout.textContent = parts.join('   ');
  });
  canvas.addEventListener('pointerup', (e) => {
    const d = drag;
    drag = null;
    if (d && d.x1 !== undefined && Math.abs(d.x1 - d.x0) > 6 && onZoom && canvas._toX) {
      const a = canvas._toX(Math.min(d.x0, d.x1)), b = canvas._toX(Math.max(d.x0, d.x1));
      onZoom(Math.max(0, Math.floor(a)), Math.ceil(b));
    } else
      draw();
  });
  canvas.addEventListener('dblclick', () => onZoom && onZoom(null));
  const observer = new ResizeObserver(() => draw());
  observer.observe(canvas);
  cleanups.push(() => observer.disconnect());
  return h('div', {}, legend, canvas, readout);
}

// GetStepSeries's reply as chart points, per series name.
export function seriesPoints(reply) {
  const first = (reply.bucket_first_step || []).map(num);
  const last = (reply.bucket_last_step || []).map(num);
  const out = {};
  for (const s of reply.series || []) {
    out[s.name] = first.map((f, i) => ({
                              x: (f + last[i]) / 2,
                              y: num((s.last || [])[i]),
                              lo: num((s.min || [])[i]),
                              hi: num((s.max || [])[i]),
                            }));
  }
  return out;
}

export const MARKERS = {
  SPIKE: ['#dc2626', 'spike'],
  ROLLBACK: ['#ea580c', 'rollback'],
  RESTART: ['#9333ea', 'restart'],
  PREEMPTED: ['#4b5563', 'preempted'],
  REPLANNED: ['#0891b2', 're-plan'],
  GAVE_UP: ['#b91c1c', 'gave up'],
};

export function markersOf(job) {
  const out = [];
  for (const e of job.events || []) {
    const m = MARKERS[e.kind];
    const step = num(e.step || e.checkpoint_step);
    if (m && Number.isFinite(step)) out.push({x: step, color: m[0], label: m[1]});
  }
  return out;
}

// Loom Console: the pages, one ES module with no dependency, served by the
// controller (embedded in its binary) under a Content-Security-Policy that
// allows no inline script or style and nothing from another origin.
//
// Every value that comes from the server (a job's name, a log line, an
// event's message) reaches the page through textContent or a canvas, never
// as HTML. The pages read the JSON API (/api/v1/, docs/console.md) with the
// session cookie, send X-Loom-CSRF with every change, and follow live
// updates through the event streams, resuming after a lost connection.

const main = document.getElementById('main');
const session = {
  name: '',
  role: '',
  csrf: '',
  consoles: []
};
let cleanups = [];  // closes the current page's streams and timers

// ---------------------------------------------------------------- helpers

// An element: h('a', {href: '/x', class: 'c'}, 'text', child, ...). Strings
// become text nodes; attributes starting with "on" are listeners.
function h(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on'))
      e.addEventListener(k.slice(2), v);
    else if (k === 'class')
      e.className = v;
    else
      e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === undefined || kid === null || kid === false) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

function show(...nodes) {
  main.replaceChildren(...nodes);
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// Calls the JSON API. `query`: an object (arrays repeat the parameter).
async function api(path, {method = 'GET', body, query} = {}) {
  let url = '/api/v1/' + path;
  if (query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) {
      if (v === undefined || v === null || v === '') continue;
      for (const one of Array.isArray(v) ? v : [v]) q.append(k, String(one));
    }
    const s = q.toString();
    if (s) url += '?' + s;
  }
  const init = {method, credentials: 'same-origin', headers: {}};
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  if (method !== 'GET' && session.csrf) init.headers['X-Loom-CSRF'] = session.csrf;
  const res = await fetch(url, init);
  const text = await res.text();
  let data = {};
  try {
    data = text ? JSON.parse(text) : {};
  } catch (e) {
    data = {message: text};
  }
  if (!res.ok) {
    if (res.status === 401 && !location.pathname.startsWith('/login')) {
      go('/login?next=' + encodeURIComponent(location.pathname + location.search), true);
    }
    throw new ApiError(res.status, data.code || String(res.status), data.message || res.statusText);
  }
  return data;
}

function num(v) {
  const n = Number(v);
  return Number.isFinite(n) ? n : NaN;
}

function fmt(v, digits = 4) {
  const n = num(v);
  if (!Number.isFinite(n)) return '–';
  if (n !== 0 && (Math.abs(n) >= 1e6 || Math.abs(n) < 1e-3)) return n.toExponential(2);
  return Number.isInteger(n) ? String(n) : n.toPrecision(digits);
}

function when(ms) {
  const n = num(ms);
  if (!n) return '–';
  return new Date(n).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

function duration(seconds) {
  if (!Number.isFinite(seconds) || seconds < 0) return '–';
  const s = Math.round(seconds);
  if (s < 120) return s + ' s';
  if (s < 7200) return Math.round(s / 60) + ' min';
  return (s / 3600).toFixed(1) + ' h';
}

function badge(state) {
  return h('span', {class: 'badge ' + (state || '')}, state || '?');
}

function errorBox(e) {
  return h('p', {class: 'error'}, (e && e.message) || String(e));
}

// A sortable table: columns [{label, get(row) -> value, show(row) -> node?, num}].
function table(columns, rows, {sortBy = -1, desc = false} = {}) {
  const wrap = h('div', {class: 'scroll'});
  let key = sortBy, down = desc;
  const render = () => {
    const sorted = rows.slice();
    if (key >= 0) {
      const get = columns[key].get;
      sorted.sort((a, b) => {
        const x = get(a), y = get(b);
        const c = typeof x === 'number' && typeof y === 'number' ?
            x - y :
            String(x).localeCompare(String(y));
        return down ? -c : c;
      });
    }
    const head =
        h('tr', {},
          columns.map(
              (c, i) =>
                  h('th', {
                    class: c.num ? 'num' : '',
                    onclick: () => {
                      down = key === i ? !down : false;
                      key = i;
                      render();
                    },
                  },
                    c.label + (key === i ? (down ? ' ▼' : ' ▲') : ''))));
    const body = sorted.map(
        (r) =>
            h('tr', {},
              columns.map(
                  (c) =>
                      h('td', {class: c.num ? 'num' : ''},
                        c.show ? c.show(r) : String(c.get(r) ?? '–')))));
    wrap.replaceChildren(h('table', {}, h('thead', {}, head), h('tbody', {}, body)));
  };
  render();
  return wrap;
}

function stat(label, value) {
  return h(
      'div', {class: 'stat'}, h('div', {class: 'label'}, label), h('div', {class: 'value'}, value));
}

// A live stream of events (Server-Sent Events). The browser reconnects by
// itself with Last-Event-ID; `onReconnect` runs after each reconnect, for
// what the stream does not replay (steps).
function stream(path, handlers, onReconnect) {
  const es = new EventSource('/api/v1/' + path);
  let lost = false;
  for (const [kind, fn] of Object.entries(handlers)) {
    es.addEventListener(kind, (m) => {
      try {
        fn(JSON.parse(m.data));
      } catch (e) {
        console.error(e);
      }
    });
  }
  es.addEventListener('end', (m) => {
    const end = JSON.parse(m.data);
    if (end.code === 'OK' || end.code === 'UNAUTHENTICATED' || end.code === 'PERMISSION_DENIED' ||
        end.code === 'NOT_FOUND')
      es.close();
  });
  es.onerror = () => {
    lost = true;
  };
  es.onopen = () => {
    if (lost && onReconnect) onReconnect();
    lost = false;
  };
  cleanups.push(() => es.close());
  return es;
}

// ------------------------------------------------------------------ chart

const COLORS = [
  '#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2', '#4b5563', '#db2777', '#65a30d',
  '#7c3aed', '#0d9488', '#a16207'
];

// Draws lines with their min..max bands on a canvas, with vertical
// markers; dragging selects a range (onZoom(x0, x1)), a double click
// resets it (onZoom(null)). lines: [{label, color, points: [{x, y, lo, hi}]}].
function chart(lines, {markers = [], onZoom, xLabel = 'step', height = 260} = {}) {
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
function seriesPoints(reply) {
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

const MARKERS = {
  SPIKE: ['#dc2626', 'spike'],
  ROLLBACK: ['#ea580c', 'rollback'],
  RESTART: ['#9333ea', 'restart'],
  PREEMPTED: ['#4b5563', 'preempted'],
  REPLANNED: ['#0891b2', 're-plan'],
  GAVE_UP: ['#b91c1c', 'gave up'],
};

function markersOf(job) {
  const out = [];
  for (const e of job.events || []) {
    const m = MARKERS[e.kind];
    const step = num(e.step || e.checkpoint_step);
    if (m && Number.isFinite(step)) out.push({x: step, color: m[0], label: m[1]});
  }
  return out;
}

// ------------------------------------------------------------------ pages

async function pageLogin() {
  const params = new URLSearchParams(location.search);
  const next = params.get('next') || '/jobs';
  const input = h('input', {
    type: 'password',
    name: 'token',
    autocomplete: 'current-password',
    placeholder: 'Loom token',
    required: true
  });
  const message = h('p', {class: 'error'});
  const form =
      h('form', {class: 'login'}, h('h1', {}, 'Log in to Loom'),
        h('p', {class: 'muted'}, 'Paste your Loom token (loomctl reads it from <home>/token).'),
        input, h('button', {type: 'submit'}, 'Log in'), message);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    try {
      const who = await api('session', {method: 'POST', body: {token: input.value.trim()}});
      Object.assign(
          session,
          {name: who.name, role: who.role, csrf: who.csrf_token, consoles: who.consoles || []});
      renderWho();
      go(next.startsWith('/') && !next.startsWith('//') ? next : '/jobs', true);
    } catch (err) {
      message.textContent = err.message;
    }
  });
  show(form);
  input.focus();
}

const STATES = ['PENDING', 'SCHEDULED', 'RUNNING', 'PREEMPTED', 'SUCCEEDED', 'FAILED', 'CANCELLED'];

async function pageJobs() {
  const params = new URLSearchParams(location.search);
  const filters = {
    state: params.get('state') || '',
    queue: params.get('queue') || '',
    submitter: params.get('submitter') || '',
    name: params.get('name') || ''
  };
  let jobs = [], next = '';
  const list = h('div');
  const more = h('button', {onclick: () => load(next)}, 'Load more');
  const field = (key, label) => {
    const input = h('input', {placeholder: label, value: filters[key]});
    input.addEventListener('input', () => {
      filters[key] = input.value;
      keepUrl();
      render();
    });
    return input;
  };
  const stateSelect =
      h('select', {}, h('option', {value: ''}, 'every state'),
        STATES.map((s) => h('option', {value: s, selected: s === filters.state}, s)));
  stateSelect.addEventListener('change', () => {
    filters.state = stateSelect.value;
    keepUrl();
    reload();
  });
  const keepUrl = () => {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(filters))
      if (v) q.set(k, v);
    history.replaceState(null, '', '/jobs' + (q.toString() ? '?' + q : ''));
  };
  const render = () => {
    const rows = jobs.filter(
        (j) =>
            (!filters.queue || ((j.spec.scheduling || {}).queue || '').includes(filters.queue)) &&
            (!filters.submitter || (j.submitted_by || '').includes(filters.submitter)) &&
            (!filters.name || (j.spec.name || '').includes(filters.name) ||
             j.id.includes(filters.name)));
    list.replaceChildren(
        rows.length ? table(
                          [
                            {
                              label: 'Job',
                              get: (j) => j.id,
                              show: (j) => h('a', {href: '/jobs/' + encodeURIComponent(j.id)}, j.id)
                            },
                            {label: 'Name', get: (j) => j.spec.name || ''},
                            {label: 'State', get: (j) => j.state, show: (j) => badge(j.state)},
                            {label: 'Queue', get: (j) => (j.spec.scheduling || {}).queue || ''},
                            {label: 'Submitter', get: (j) => j.submitted_by || ''},
                            {
                              label: 'Step',
                              num: true,
                              get: (j) => num((j.summary || {}).last_step) || 0,
                              show: (j) => (num((j.summary || {}).last_step) || 0) + ' / ' +
                                  ((j.spec.schedule || {}).total_steps || '?')
                            },
                            {
                              label: 'Loss',
                              num: true,
                              get: (j) => num((j.summary || {}).last_loss),
                              show: (j) => fmt((j.summary || {}).last_loss)
                            },
                            {
                              label: 'Tokens/s',
                              num: true,
                              get: (j) => num((j.summary || {}).last_tokens_per_second) || 0,
                              show: (j) => fmt((j.summary || {}).last_tokens_per_second, 3)
                            },
                            {
                              label: 'Created',
                              get: (j) => num(j.created_unix_ms),
                              show: (j) => when(j.created_unix_ms)
                            },
                          ],
                          rows, {sortBy: 8, desc: true}) :
                      h('p', {class: 'muted'}, 'No job matches.'));
    more.hidden = !next;
  };
  const load = async (token) => {
    try {
      const page = await api('jobs', {
        query: {states: filters.state || undefined, page_size: 200, page_token: token || undefined}
      });
      jobs = token ? jobs.concat(page.jobs || []) : (page.jobs || []);
      next = page.next_page_token || '';
      render();
    } catch (e) {
      list.replaceChildren(errorBox(e));
    }
  };
  const reload = () => load('');
  show(
      h('h1', {}, 'Jobs'),
      h('div', {class: 'filters'}, stateSelect, field('name', 'name or id'),
        field('queue', 'queue'), field('submitter', 'submitter')),
      list, more);
  await load('');
  // States change live: a transition updates its row, a new job reloads.
  let pending = null;
  stream(
      'events:stream', {
        transition: (ev) => {
          const j = jobs.find((x) => x.id === ev.job_id);
          if (j) {
            j.state = ev.transition.to;
            render();
          } else if (!pending) {
            pending = setTimeout(() => {
              pending = null;
              reload();
            }, 500);
          }
        },
      },
      reload);
  cleanups.push(() => pending && clearTimeout(pending));
}

async function pageJob(id) {
  let job;
  try {
    job = await api('jobs/' + encodeURIComponent(id));
  } catch (e) {
    show(h('h1', {}, id), errorBox(e));
    return;
  }
  const head = h('div'), charts = h('div'), eventsBox = h('div'), checkpointsBox = h('div'),
        placement = h('div'), logs = h('div');
  let zoom = null;  // [from, to] or null
  let live = [];    // steps that arrived since the last series read
  let series = {};
  let seriesLast = -1;  // the last step the series read covers

  const renderHead = () => {
    const s = job.summary || {};
    const total = num((job.spec.schedule || {}).total_steps);
    const step = num(s.last_step) || 0;
    const rate = num(s.last_step_unix_ms) > num(s.first_step_unix_ms) && step > 1 ?
        (step - 1) / ((num(s.last_step_unix_ms) - num(s.first_step_unix_ms)) / 1000) :
        NaN;
    const eta = job.state === 'RUNNING' && rate > 0 ? (total - step) / rate : NaN;
    const canChange =
        session.role === 'admin' || (session.role === 'user' && job.submitted_by === session.name);
    const ended = ['SUCCEEDED', 'FAILED', 'CANCELLED'].includes(job.state);
    head.replaceChildren(
        h('h1', {}, job.spec.name || job.id, ' ', badge(job.state)),
        h('p', {class: 'muted'}, job.id, ' · submitted by ', job.submitted_by || '?', ' · ',
          job.reason || ''),
        h('div', {class: 'stats'}, stat('step', step + ' / ' + (total || '?')),
          stat('loss', fmt(s.last_loss)),
          stat('validation loss', s.has_val_loss ? fmt(s.last_val_loss) : '–'),
          stat('tokens/s', fmt(s.last_tokens_per_second, 3)), stat('MFU', fmt(s.mfu, 3)),
          stat('ETA', duration(eta)), stat('restarts', String(job.restarts || 0)),
          stat('rollbacks', String((job.rollbacks || 0) + (job.operator_rollbacks || 0))),
          stat('preemptions', String(job.preemptions || 0)),
          stat('diagnosis', (job.diagnosis || {}).summary || (job.diagnosis || {}).verdict || '–')),
        h('div', {class: 'actions'},
          canChange && !ended ? h('button', {class: 'danger', onclick: cancel}, 'Cancel') : null,
          canChange && job.state === 'RUNNING' ? h('button', {onclick: rollback}, 'Roll back…') :
                                                 null,
          session.role !== 'reader' ? h('button', {onclick: resubmit}, 'Resubmit') : null,
          h('a', {href: '/compare?jobs=' + encodeURIComponent(job.id)}, 'Compare…')));
  };
  const act = async (what, fn) => {
    try {
      await fn();
      job = await api('jobs/' + encodeURIComponent(id));
      renderAll();
    } catch (e) {
      alert(what + ': ' + e.message);
    }
  };
  function cancel() {
    if (!confirm('Cancel job ' + job.id + '? Its ranks stop.')) return;
    act('cancel',
        () =>
            api('jobs/' + encodeURIComponent(id) + ':cancel',
                {method: 'POST', body: {reason: 'from the console'}}));
  }
  function rollback() {
    const to = prompt(
        'Roll back to the newest good checkpoint at or before step:',
        String(Math.max(0, (num((job.summary || {}).last_step) || 0) - 100)));
    if (to === null) return;
    act('roll back',
        () =>
            api('jobs/' + encodeURIComponent(id) + ':rollback',
                {method: 'POST', body: {to_step: Number(to), reason: 'from the console'}}));
  }
  function resubmit() {
    if (!confirm('Submit a new job with this job\'s spec?')) return;
    api('jobs', {method: 'POST', body: {spec: job.spec}})
        .then((r) => go('/jobs/' + encodeURIComponent(r.job.id)))
        .catch((e) => alert('resubmit: ' + e.message));
  }

  const loadSeries = async () => {
    const width = Math.max(200, Math.min(4000, Math.round(main.clientWidth || 1000)));
    const reply = await api('jobs/' + encodeURIComponent(id) + '/series', {
      query: {
        buckets: width,
        from_step: zoom ? zoom[0] : undefined,
        to_step: zoom ? zoom[1] : undefined,
        series: ['loss', 'val_loss', 'tokens_per_second', 'mfu']
      }
    });
    series = seriesPoints(reply);
    seriesLast = zoom ? zoom[1] : (reply.last_step !== undefined ? num(reply.last_step) : -1);
    if (!((reply.bucket_last_step || []).length)) seriesLast = -1;
    live = live.filter((m) => num(m.step) > seriesLast);
    renderCharts();
  };
  const renderCharts = () => {
    // The series read, then the steps that arrived after its last step (the
    // latest record of each), in step order.
    const pts = (name) => {
      const after = new Map();
      for (const m of live) {
        const step = num(m.step);
        if (step > seriesLast && (name !== 'val_loss' || m.has_val_loss) &&
            (!zoom || (step >= zoom[0] && step <= zoom[1])))
          after.set(step, num(m[name]));
      }
      return (series[name] || []).concat([
        ...after.entries()
      ].sort((a, b) => a[0] - b[0]).map(([x, v]) => ({x, y: v, lo: v, hi: v})));
    };
    const onZoom = (a, b) => {
      zoom = a === null ? null : [a, b];
      loadSeries().catch(console.error);
    };
    const markers = markersOf(job);
    charts.replaceChildren(
        h('h2', {}, 'Loss',
          zoom ? ' (steps ' + zoom[0] + '–' + zoom[1] + '; double-click to reset)' : ''),
        chart(
            [
              {label: 'loss', color: COLORS[0], points: pts('loss')},
              {label: 'validation loss', color: COLORS[1], points: pts('val_loss')}
            ],
            {markers, onZoom}),
        // The markers in words too (screen readers; a canvas holds no text).
        markers.length ?
            h('ul', {class: 'markers'},
              markers.map((m) => h('li', {'data-kind': m.label}, m.label + ' at step ' + m.x))) :
            null,
        h('div', {class: 'grid2'},
          h('div', {}, h('h2', {}, 'Tokens/s'),
            chart(
                [{label: 'tokens/s', color: COLORS[2], points: pts('tokens_per_second')}],
                {markers, onZoom, height: 180})),
          h('div', {}, h('h2', {}, 'MFU'),
            chart(
                [{label: 'MFU', color: COLORS[3], points: pts('mfu')}],
                {markers, onZoom, height: 180}))));
  };
  const renderEvents = () => {
    const rows = [];
    for (const t of job.history || [])
      rows.push({
        time: num(t.time_unix_ms),
        kind: 'transition',
        step: '',
        text: (t.from || '') + ' → ' + t.to + ': ' + (t.reason || '')
      });
    for (const e of job.events || [])
      rows.push(
          {time: num(e.time_unix_ms), kind: e.kind, step: e.step || '', text: e.message || ''});
    eventsBox.replaceChildren(
        h('h2', {}, 'Events'),
        table(
            [
              {label: 'Time', get: (r) => r.time, show: (r) => when(r.time)},
              {label: 'Kind', get: (r) => r.kind},
              {label: 'Step', num: true, get: (r) => num(r.step) || 0, show: (r) => String(r.step)},
              {label: 'What', get: (r) => r.text},
            ],
            rows, {sortBy: 0, desc: true}));
  };
  const renderPlacement = () => {
    const plan = ((job.plan || {}).layout || {}).summary || '–';
    placement.replaceChildren(
        h('h2', {}, 'Plan and placement'), h('p', {}, plan),
        (job.ranks || []).length ? table(
                                       [
                                         {label: 'Rank', num: true, get: (r) => num(r.rank) || 0},
                                         {label: 'Worker', get: (r) => r.worker_id || ''},
                                         {label: 'Node', get: (r) => r.node || ''},
                                         {label: 'DP', num: true, get: (r) => num(r.dp) || 0},
                                         {label: 'PP', num: true, get: (r) => num(r.pp) || 0},
                                         {label: 'TP', num: true, get: (r) => num(r.tp) || 0},
                                         {label: 'GPU', num: true, get: (r) => num(r.gpu) || 0},
                                       ],
                                       job.ranks, {sortBy: 0}) :
                                   h('p', {class: 'muted'}, 'Not placed.'));
  };
  const loadCheckpoints = async () => {
    try {
      const r = await api('jobs/' + encodeURIComponent(id) + '/checkpoints');
      checkpointsBox.replaceChildren(
          h('h2', {}, 'Checkpoints'),
          (r.checkpoints || []).length ?
              table(
                  [
                    {label: 'Step', num: true, get: (c) => num(c.step)},
                    {label: 'Status', get: (c) => c.status || 'ok'},
                    {
                      label: 'Size',
                      num: true,
                      get: (c) => num(c.bytes) || 0,
                      show: (c) => fmt((num(c.bytes) || 0) / 1048576, 3) + ' MiB'
                    },
                    {
                      label: 'Write s',
                      num: true,
                      get: (c) => num(c.write_seconds),
                      show: (c) => fmt(c.write_seconds, 3)
                    },
                    {label: 'Attempt', num: true, get: (c) => num(c.generation) || 0},
                    {
                      label: 'Committed',
                      get: (c) => num(c.time_unix_ms),
                      show: (c) => when(c.time_unix_ms)
                    },
                  ],
                  r.checkpoints, {sortBy: 0, desc: true}) :
              h('p', {class: 'muted'}, 'None yet.'));
    } catch (e) {
      checkpointsBox.replaceChildren(h('h2', {}, 'Checkpoints'), errorBox(e));
    }
  };
  const renderLogs = () => {
    const ranks = Math.max(1, num((job.spec.resources || {}).ranks) || 1);
    const rank =
        h('select', {},
          Array.from({length: ranks}, (_, r) => h('option', {value: String(r)}, 'rank ' + r)));
    const out = h('pre', {class: 'log'});
    const follow = h('input', {type: 'checkbox'});
    const search = h('input', {placeholder: 'search every rank and attempt'});
    const found = h('div');
    const tail = async () => {
      try {
        const r = await api(
            'jobs/' + encodeURIComponent(id) + '/logs',
            {query: {rank: rank.value, tail_lines: 200}});
        out.textContent = atob(r.data || '').length ?
            new TextDecoder().decode(Uint8Array.from(atob(r.data || ''), (c) => c.charCodeAt(0))) :
            '(empty)';
        out.scrollTop = out.scrollHeight;
      } catch (e) {
        out.textContent = e.message;
      }
    };
    const timer = setInterval(() => follow.checked && tail(), 2000);
    cleanups.push(() => clearInterval(timer));
    rank.addEventListener('change', tail);
    search.addEventListener('keydown', async (e) => {
      if (e.key !== 'Enter' || !search.value) return;
      try {
        const r = await api(
            'jobs/' + encodeURIComponent(id) + '/logs:search',
            {query: {pattern: search.value, max_lines: 200}});
        found.replaceChildren(
            table(
                [
                  {label: 'Rank', num: true, get: (l) => num(l.rank) || 0},
                  {label: 'Attempt', num: true, get: (l) => num(l.generation) || 0},
                  {label: 'Line', get: (l) => l.text || ''},
                ],
                r.lines || []),
            r.truncated ? h('p', {class: 'muted'}, 'More lines matched.') : null);
      } catch (err) {
        found.replaceChildren(errorBox(err));
      }
    });
    logs.replaceChildren(
        h('h2', {}, 'Rank logs'),
        h('div', {class: 'filters'}, rank, h('button', {onclick: tail}, 'Tail'),
          h('label', {}, follow, ' follow'), search),
        out, found);
    tail();
  };
  const renderAll = () => {
    renderHead();
    renderCharts();
    renderEvents();
    renderPlacement();
  };

  show(head, charts, placement, eventsBox, checkpointsBox, logs);
  renderAll();
  renderLogs();
  await Promise.all(
      [loadSeries().catch((e) => charts.replaceChildren(errorBox(e))), loadCheckpoints()]);

  // Live: steps go onto the charts; anything else reloads the job (at most
  // twice a second). After a reconnect the series is read again: steps are
  // not replayed by the stream.
  let refresh = null;
  const refreshJob = () => {
    if (refresh) return;
    refresh = setTimeout(async () => {
      refresh = null;
      try {
        job = await api('jobs/' + encodeURIComponent(id));
        renderHead();
        renderEvents();
        renderPlacement();
        loadCheckpoints();
      } catch (e) {
        console.error(e);
      }
    }, 500);
  };
  let redraw = null;
  stream(
      'jobs/' + encodeURIComponent(id) + '/events:stream', {
        step: (ev) => {
          live.push(ev.step);
          if (ev.job) {
            job.summary = ev.job.summary;
            job.state = ev.job.state;
          }
          if (!redraw)
            redraw = setTimeout(() => {
              redraw = null;
              renderHead();
              renderCharts();
            }, 250);
        },
        transition: refreshJob,
        recovery: refreshJob,
        checkpoint: refreshJob,
        job: refreshJob,
      },
      () => {
        loadSeries().catch(console.error);
        refreshJob();
      });
  cleanups.push(() => {
    refresh && clearTimeout(refresh);
    redraw && clearTimeout(redraw);
  });
}

// Flattens a spec into path -> value, for the differences between runs.
function flatten(v, prefix = '', out = {}) {
  if (v && typeof v === 'object' && !Array.isArray(v)) {
    for (const [k, x] of Object.entries(v)) flatten(x, prefix ? prefix + '.' + k : k, out);
  } else {
    out[prefix] = JSON.stringify(v);
  }
  return out;
}

async function pageCompare() {
  const params = new URLSearchParams(location.search);
  const ids = (params.get('jobs') || '').split(',').map((s) => s.trim()).filter(Boolean);
  const byTokens = params.get('x') === 'tokens';
  const input =
      h('input', {placeholder: 'job ids, comma-separated', value: ids.join(','), size: 60});
  const axis =
      h('select', {}, h('option', {value: 'step'}, 'by step'),
        h('option', {value: 'tokens', selected: byTokens}, 'by tokens seen'));
  const apply = () =>
      go('/compare?jobs=' + encodeURIComponent(input.value.replace(/\s+/g, '')) +
         (axis.value === 'tokens' ? '&x=tokens' : ''));
  input.addEventListener('keydown', (e) => e.key === 'Enter' && apply());
  axis.addEventListener('change', apply);
  const body = h('div');
  show(
      h('h1', {}, 'Compare runs'),
      h('div', {class: 'filters'}, input, axis, h('button', {onclick: apply}, 'Compare')), body);
  if (!ids.length) {
    body.replaceChildren(
        h('p', {class: 'muted'}, 'Name the runs to overlay (at least 2; any number).'));
    return;
  }
  const runs = await Promise.all(ids.map(async (id) => {
    try {
      const [job, reply] = await Promise.all([
        api('jobs/' + encodeURIComponent(id)),
        api('jobs/' + encodeURIComponent(id) + '/series',
            {query: {buckets: 1000, series: ['loss', 'tokens_seen']}})
      ]);
      return {id, job, points: seriesPoints(reply)};
    } catch (e) {
      return {id, error: e};
    }
  }));
  const ok = runs.filter((r) => !r.error);
  const lines = ok.map(
      (r, i) => ({
        label: r.id + (r.job.spec.name ? ' (' + r.job.spec.name + ')' : ''),
        color: COLORS[i % COLORS.length],
        points: (r.points.loss || [])
                    .map(
                        (p, k) => byTokens ?
                            Object.assign({}, p, {x: ((r.points.tokens_seen || [])[k] || {}).y}) :
                            p),
      }));
  const specs = ok.map((r) => flatten(r.job.spec));
  const keys = [...new Set(specs.flatMap((s) => Object.keys(s)))].sort().filter(
      (k) => k !== 'name' && !k.startsWith('checkpoint.dir') &&
          new Set(specs.map((s) => s[k])).size > 1);
  body.replaceChildren(
      ...runs.filter((r) => r.error)
          .map((r) => h('p', {class: 'error'}, r.id + ': ' + r.error.message)),
      chart(lines, {xLabel: byTokens ? 'tokens' : 'step', height: 360}),
      h('h2', {}, 'How their specs differ'),
      keys.length ? table(
                        [{label: 'Field', get: (k) => k}].concat(
                            ok.map((r, i) => ({label: r.id, get: (k) => specs[i][k] ?? '–'}))),
                        keys) :
                    h('p', {class: 'muted'},
                      'Their specs are the same (but for names and checkpoint paths).'));
}

async function pageQueues() {
  try {
    const r = await api('queues');
    const limit = (l) => !l ?
        '–' :
        (num(l.slots) < 0 && num(l.gpus) < 0 ? 'unlimited' :
                                               (num(l.slots) < 0 ? 'any' : fmt(l.slots)) +
                 ' slots, ' + (num(l.gpus) < 0 ? 'any' : fmt(l.gpus)) + ' gpus');
    show(
        h('h1', {}, 'Queues'),
        table(
            [
              {label: 'Queue', get: (q) => q.name},
              {label: 'Cohort', get: (q) => q.cohort || '–'},
              {label: 'Quota', get: (q) => limit(q.nominal_quota)},
              {label: 'Borrowing', get: (q) => q.cohort ? limit(q.borrowing_limit) : '–'},
              {label: 'Weight', num: true, get: (q) => num(q.weight) || 0},
              {label: 'Preemption', get: (q) => (q.preemption ? 'yes' : 'no')},
              {label: 'Used', get: (q) => limit(q.used)},
              {label: 'Running', num: true, get: (q) => num(q.running_jobs) || 0},
              {label: 'Waiting', num: true, get: (q) => num(q.pending_jobs) || 0},
            ],
            r.queues || []),
        h('p', {class: 'muted'}, 'Fair-share half-life ',
          String(r.fair_share_half_life_seconds || 0), ' s; preemption grace ',
          String(r.preemption_grace_seconds || 0), ' s; minimum run ',
          String(r.min_run_time_seconds || 0), ' s.'),
        h('h2', {}, 'Waiting jobs'), h('div', {id: 'waiting'}));
    const waiting = await api('jobs', {query: {states: 'PENDING', page_size: 500}});
    document.getElementById('waiting').replaceChildren(table(
        [
          {label: 'Position', num: true, get: (j) => num(j.queue_position) || 0},
          {
            label: 'Job',
            get: (j) => j.id,
            show: (j) => h('a', {href: '/jobs/' + encodeURIComponent(j.id)}, j.id)
          },
          {label: 'Queue', get: (j) => (j.spec.scheduling || {}).queue || ''},
          {label: 'Waits for', get: (j) => j.wait_reason || j.reason || ''},
        ],
        waiting.jobs || [], {sortBy: 0}));
  } catch (e) {
    show(h('h1', {}, 'Queues'), errorBox(e));
  }
}

async function pageWorkers() {
  try {
    const r = await api('workers');
    show(
        h('h1', {}, 'Workers'),
        table(
            [
              {label: 'Worker', get: (w) => w.id},
              {label: 'Node', get: (w) => w.node || ''},
              {label: 'Alive', get: (w) => (w.alive ? 'yes' : 'no')},
              {
                label: 'Slots',
                num: true,
                get: (w) => num(w.slots) || 0,
                show: (w) => (num(w.slots_used) || 0) + ' / ' + (num(w.slots) || 0)
              },
              {label: 'GPUs', num: true, get: (w) => num(w.gpus) || 0},
              {
                label: 'GEMM GFLOP/s per thread',
                num: true,
                get: (w) => num(w.gemm_flops_per_second_per_thread) / 1e9 || 0,
                show: (w) => fmt(num(w.gemm_flops_per_second_per_thread) / 1e9, 3)
              },
              {label: 'Zone', get: (w) => w.zone || '–'},
              {
                label: 'Last heartbeat',
                get: (w) => num(w.last_heartbeat_unix_ms),
                show: (w) => when(w.last_heartbeat_unix_ms)
              },
            ],
            r.workers || [], {sortBy: 0}));
  } catch (e) {
    show(h('h1', {}, 'Workers'), errorBox(e));
  }
}

async function pagePlan() {
  const spec =
      h('textarea',
        {rows: 14, cols: 80, placeholder: '{"name": "…", "model": {…}, … } (a JobSpec in JSON)'});
  const out = h('div');
  const run = async () => {
    try {
      const r =
          await api('plan', {method: 'POST', body: {spec: JSON.parse(spec.value), top_k: 10}});
      out.replaceChildren(
          table(
              [
                {label: 'Layout', get: (c) => (c.layout || c).summary || ''},
                {label: 'Fits', get: (c) => ((c.layout || c).fits ? 'yes' : 'no')},
                {
                  label: 'Step s',
                  num: true,
                  get: (c) => num((c.layout || c).step_seconds),
                  show: (c) => fmt((c.layout || c).step_seconds, 3)
                },
                {
                  label: 'Tokens/s',
                  num: true,
                  get: (c) => num((c.layout || c).tokens_per_second),
                  show: (c) => fmt((c.layout || c).tokens_per_second, 3)
                },
                {
                  label: 'MFU',
                  num: true,
                  get: (c) => num((c.layout || c).mfu),
                  show: (c) => fmt((c.layout || c).mfu, 3)
                },
              ],
              r.alternatives || []),
          h('p', {class: 'muted'}, r.topology || ''), h('pre', {class: 'log'}, r.report || ''));
    } catch (e) {
      out.replaceChildren(errorBox(e));
    }
  };
  show(
      h('h1', {}, 'Plan a job'), spec,
      h('div', {class: 'actions'}, h('button', {onclick: run}, 'Plan')), out);
}

// ----------------------------------------------------------------- router

const ROUTES = [
  [/^\/login\/?$/, pageLogin],
  [/^\/(jobs\/?)?$/, pageJobs],
  [/^\/jobs\/([^/]+)\/?$/, pageJob],
  [/^\/compare\/?$/, pageCompare],
  [/^\/queues\/?$/, pageQueues],
  [/^\/workers\/?$/, pageWorkers],
  [/^\/plan\/?$/, pagePlan],
];

function renderWho() {
  const who = document.getElementById('who');
  if (!session.name) {
    who.replaceChildren();
    return;
  }
  const out =
      h('a', {
        href: '#',
        onclick: async (e) => {
          e.preventDefault();
          try {
            await api('session', {method: 'DELETE'});
          } catch (err) { /* gone already */
          }
          Object.assign(session, {name: '', role: '', csrf: ''});
          renderWho();
          go('/login', true);
        }
      },
        'log out');
  who.replaceChildren(session.name + ' (' + session.role + ') · ', out);
}

async function render() {
  for (const c of cleanups) c();
  cleanups = [];
  const path = location.pathname;
  if (!path.startsWith('/login') && !session.name) {
    try {
      const who = await api('session');
      Object.assign(
          session,
          {name: who.name, role: who.role, csrf: who.csrf_token, consoles: who.consoles || []});
      renderWho();
    } catch (e) {
      if (e.status !== 401) show(errorBox(e));
      return;  // api() went to /login
    }
  }
  for (const [re, page] of ROUTES) {
    const m = path.match(re);
    if (m) {
      document.title = 'Loom · ' + (path.split('/')[1] || 'jobs');
      await page(...m.slice(1).map(decodeURIComponent));
      return;
    }
  }
  show(
      h('h1', {}, 'Not found'),
      h('p', {}, 'No console page at ', path, '. ', h('a', {href: '/jobs'}, 'Jobs')));
}

function go(url, replace = false) {
  if (replace)
    history.replaceState(null, '', url);
  else
    history.pushState(null, '', url);
  render();
}

document.addEventListener('click', (e) => {
  const a = e.target.closest && e.target.closest('a[href]');
  if (!a || a.target || e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
  const href = a.getAttribute('href');
  if (!href || !href.startsWith('/') || href.startsWith('//') || href.startsWith('/api/')) return;
  e.preventDefault();
  go(href);
});
window.addEventListener('popstate', render);
render();

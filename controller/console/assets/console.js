// Loom Console: the pages, one ES module with no dependency, served by the
// controller (embedded in its binary) under a Content-Security-Policy that
// allows no inline script or style and nothing from another origin.
//
// Every value that comes from the server (a job's name, a log line, an
// event's message) reaches the page through textContent or a canvas, never
// as HTML. The pages read the JSON API (/api/v1/, docs/console.md) with the
// session cookie, send X-Loom-CSRF with every change, and follow live
// updates through the event streams, resuming after a lost connection.

import {chart, COLORS, seriesPoints} from './chart.js';
import {api, badge, cleanups, errorBox, fmt, go, h, markPainted, num, router, session, show, stream, table, when} from './core.js';
import {pageJob} from './job_page.js';

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
  // The controller filters (ListJobs' queue, submitted_by, name_contains),
  // so every matching job is found, not only those of the pages loaded.
  let typing = null;
  const field = (key, label) => {
    const input = h('input', {placeholder: label, value: filters[key]});
    input.addEventListener('input', () => {
      filters[key] = input.value.trim();
      keepUrl();
      clearTimeout(typing);
      typing = setTimeout(reload, 300);
    });
    return input;
  };
  cleanups.push(() => clearTimeout(typing));
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
    const rows = jobs;
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
  let loads = 0;  // a reply to an older filter is dropped
  const load = async (token) => {
    const mine = ++loads;
    try {
      const page = await api('jobs', {
        query: {
          states: filters.state,
          queue: filters.queue,
          submitted_by: filters.submitter,
          name_contains: filters.name,
          page_size: 200,
          page_token: token
        }
      });
      if (mine !== loads) return;
      jobs = token ? jobs.concat(page.jobs || []) : (page.jobs || []);
      next = page.next_page_token || '';
      render();
      markPainted('loom:jobs');
    } catch (e) {
      list.replaceChildren(errorBox(e));
    }
  };
  const reload = () => load('');
  show(
      h('h1', {}, 'Jobs'),
      h('div', {class: 'filters'}, stateSelect, field('name', 'name or id'),
        field('queue', 'queue (exact)'), field('submitter', 'submitter (exact)')),
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
  const admin = session.role === 'admin';
  // An admin's action on a node, confirmed in the page and checked again by
  // the controller (only admins may); the page is read again after it.
  const act = async (node, verb, body, question) => {
    if (!confirm(question)) return;
    try {
      await api('nodes/' + encodeURIComponent(node) + ':' + verb, {method: 'POST', body});
    } catch (e) {
      alert(verb + ' ' + node + ': ' + e.message);
    }
    pageWorkers();
  };
  const cordon = (w) => {
    const reason = prompt('Cordon ' + w.node + ': its workers take no new ranks. Reason?', '');
    if (reason === null) return;
    act(w.node, 'cordon', {reason}, 'Cordon node ' + w.node + ' until it is uncordoned?');
  };
  const drain = (w) => {
    const reason = prompt('Drain ' + w.node + ': its jobs save a checkpoint and move. Reason?', '');
    if (reason === null) return;
    act(w.node, 'drain', {reason},
        'Drain node ' + w.node + '? Every job with ranks there saves a checkpoint at its next ' +
            'step and moves off it; the node stays cordoned.');
  };
  const cordoned = (w) => !w.cordoned ?
      'no' :
      (num(w.cordoned_until_unix_ms) ? 'until ' + when(w.cordoned_until_unix_ms) :
                                       'until uncordoned') +
          (w.cordon_reason ? ' (' + w.cordon_reason + ')' : '');
  const columns = [
    {label: 'Worker', get: (w) => w.id},
    {label: 'Node', get: (w) => w.node || ''},
    {label: 'Alive', get: (w) => (w.alive ? 'yes' : 'no')},
    {label: 'Cordoned', get: cordoned},
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
  ];
  if (admin) {
    columns.push({
      label: 'Actions',
      get: () => '',
      show: (w) =>
          h('span', {class: 'actions', 'data-node': w.node},
            w.cordoned ? h('button', {
              onclick: () =>
                  act(w.node, 'uncordon', {}, 'Uncordon node ' + w.node + '? It takes ranks again.')
            },
                           'Uncordon') :
                         h('button', {onclick: () => cordon(w)}, 'Cordon…'),
            h('button', {class: 'danger', onclick: () => drain(w)}, 'Drain…'))
    });
  }
  try {
    const r = await api('workers');
    show(h('h1', {}, 'Workers'), table(columns, r.workers || [], {sortBy: 0}));
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
  for (const c of cleanups.splice(0)) c();
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


document.addEventListener('click', (e) => {
  const a = e.target.closest && e.target.closest('a[href]');
  if (!a || a.target || e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
  const href = a.getAttribute('href');
  if (!href || !href.startsWith('/') || href.startsWith('//') || href.startsWith('/api/')) return;
  e.preventDefault();
  go(href);
});
router.render = render;
window.addEventListener('popstate', render);
render();

// Loom Console: one job's page.
import {chart, COLORS, markersOf, seriesPoints} from './chart.js';
import {api, badge, cleanups, duration, errorBox, fmt, go, h, main, markPainted, num, session, show, stat, stream, table, when} from './core.js';

export async function pageJob(id) {
  let job;
  try {
    job = await api('jobs/' + encodeURIComponent(id));
  } catch (e) {
    show(h('h1', {}, id), errorBox(e));
    return;
  }
  const head = h('div'), charts = h('div'), eventsBox = h('div'), checkpointsBox = h('div'),
        placement = h('div'), logs = h('div'), goodputBox = h('div', {id: 'goodput'});
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
    markPainted('loom:charts');
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
            '',  // (replaceChildren would write a null as the text "null")
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
                      // Where it can be restored from: its directory, and
                      // the object store once uploaded (checkpoint.remote).
                      label: 'Tier',
                      get: (c) => [c.status === 'committed' ? 'local' : '',
                                   c.remote_url && c.status !== 'corrupt' ? 'remote' : '']
                                      .filter((t) => t)
                                      .join('+') ||
                          '-'
                    },
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
  // Where the job's wall time went (the controller's goodput buckets): a bar
  // of shares, and each bucket's seconds.
  const loadGoodput = async () => {
    try {
      const g = await api('jobs/' + encodeURIComponent(id) + '/goodput');
      const wall = num(g.wall_seconds) || 0;
      const buckets = (g.buckets || []).map((b) => ({...b, seconds: num(b.seconds) || 0}));
      const bar = h('div', {class: 'goodput-bar', 'aria-label': 'goodput buckets'});
      buckets.forEach((b, i) => {
        if (!(wall > 0) || b.seconds <= 0) return;
        const part = h('span', {title: b.description + ': ' + duration(b.seconds)});
        part.style.width = (100 * b.seconds / wall).toFixed(3) + '%';
        part.style.background = COLORS[i % COLORS.length];
        bar.append(part);
      });
      goodputBox.dataset.ettr = String(num(g.ettr) || 0);
      goodputBox.dataset.wallSeconds = String(wall);
      goodputBox.replaceChildren(
          h('h2', {}, 'Goodput'),
          h('div', {class: 'stats'}, stat('ETTR', fmt(g.ettr, 3)),
            stat('wall time', duration(wall)),
            stat('step reports', String(num(g.step_reports) || 0))),
          bar,
          table(
              [
                {
                  label: 'Bucket',
                  get: (b) => b.description,
                  show: (b) => {
                    const sw = h('span', {class: 'swatch'});
                    sw.style.background = COLORS[buckets.indexOf(b) % COLORS.length];
                    return h('span', {}, sw, b.description);
                  }
                },
                {
                  label: 'Seconds',
                  num: true,
                  get: (b) => b.seconds,
                  show: (b) => fmt(b.seconds, 4)
                },
                {
                  label: 'Share',
                  num: true,
                  get: (b) => b.seconds,
                  show: (b) => wall > 0 ? (100 * b.seconds / wall).toFixed(1) + '%' : '–'
                },
              ],
              buckets));
    } catch (e) {
      goodputBox.replaceChildren(h('h2', {}, 'Goodput'), errorBox(e));
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

  show(head, charts, placement, eventsBox, goodputBox, checkpointsBox, logs);
  renderAll();
  renderLogs();
  await Promise.all([
    loadSeries().catch((e) => charts.replaceChildren(errorBox(e))), loadCheckpoints(), loadGoodput()
  ]);
  // A job still going: its goodput moves with the clock (the controller
  // recomputes it at most every few seconds).
  const goodputTimer = setInterval(() => {
    if (!['SUCCEEDED', 'FAILED', 'CANCELLED'].includes(job.state)) loadGoodput();
  }, 10000);
  cleanups.push(() => clearInterval(goodputTimer));

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
        loadGoodput();
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

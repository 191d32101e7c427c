// The browser half of ./bench/run.sh console (bench/console_bench.cc
// starts the controller and reads what this writes): Debian's Chromium,
// driven by playwright-core, against a console holding a big history.
//
//   node console_bench.mjs   (everything through the environment:)
//     LOOM_CONSOLE_TOOLS  where scripts/install-deploy-deps.sh put playwright-core
//     LOOM_CONSOLE_URL    the console; LOOM_TOKEN an admin's token
//     LOOM_BIG_JOB        the job of a million steps; LOOM_LIVE_JOB the live one
//     LOOM_LIVE_SECONDS   how long to watch the live job's page
//     LOOM_OUT            where the figures go, as JSON
//
// Times come from the page's own clock: performance.now() at the marks the
// pages set (loom:charts when the job page's charts are first painted with
// the series, loom:jobs when the jobs table is), from the navigation's
// start. Every wait is bounded.
import fs from 'node:fs';

import { env, launchChromium, logIn } from '../tests/console/chromium.mjs';

const url = env('LOOM_CONSOLE_URL');
const log = (...a) => console.log('[console-bench]', ...a);
const browser = await launchChromium();

// Navigates and waits for the mark `name`; its time from the navigation's
// start, the first contentful paint, and the resources the page fetched.
async function timedOpen(page, target, name) {
  await page.goto(target);
  await page.waitForFunction((n) => performance.getEntriesByName(n).length > 0, name,
                             { timeout: 60000 });
  return page.evaluate((n) => ({
    mark: performance.getEntriesByName(n)[0].startTime,
    fcp: (performance.getEntriesByName('first-contentful-paint')[0] || { startTime: -1 }).startTime,
    resources: performance.getEntriesByType('resource').map(
        (r) => ({ name: r.name, bytes: r.encodedBodySize, ms: r.duration })),
  }), name);
}

const out = {};
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  page.setDefaultTimeout(60000);
  page.on('pageerror', (e) => { throw new Error('page error: ' + e); });
  await logIn(page, url, env('LOOM_TOKEN'));

  // The big job: its page's first open, then three more.
  const big = url + '/jobs/' + encodeURIComponent(env('LOOM_BIG_JOB'));
  const cold = await timedOpen(page, big, 'loom:charts');
  const warm = [];
  for (let i = 0; i < 3; ++i) warm.push(await timedOpen(page, big, 'loom:charts'));
  const series = warm[warm.length - 1].resources.find((r) => r.name.includes('/series'));
  out.big_cold_ms = cold.mark;
  out.big_warm_max_ms = Math.max(...warm.map((w) => w.mark));
  out.big_fcp_ms = Math.max(cold.fcp, ...warm.map((w) => w.fcp));
  out.series_bytes = series ? series.bytes : -1;
  out.series_buckets = series ? Number(new URL(series.name).searchParams.get('buckets')) : -1;
  out.big_steps_drawn = await page.evaluate(
      () => Number((document.querySelector('canvas.chart') || { dataset: {} }).dataset.steps));
  log('big job: first open', cold.mark.toFixed(0), 'ms; then',
      warm.map((w) => w.mark.toFixed(0)).join(', '), 'ms; series', out.series_bytes, 'bytes');

  // The jobs page: navigation to its table.
  const jobs = await timedOpen(page, url + '/jobs', 'loom:jobs');
  out.jobs_table_ms = jobs.mark;
  log('jobs page: table at', jobs.mark.toFixed(0), 'ms');

  // The live job: when the step tile changes, and to what.
  await page.goto(url + '/jobs/' + encodeURIComponent(env('LOOM_LIVE_JOB')));
  await page.waitForSelector('canvas.chart');
  await page.evaluate(() => {
    window.loomShown = [];
    const read = () => {
      const tile = [...document.querySelectorAll('.stat')].find(
          (s) => s.querySelector('.label').textContent === 'step');
      return tile ? Number(tile.querySelector('.value').textContent.split('/')[0]) : NaN;
    };
    let last = read();
    new MutationObserver(() => {
      const now = read();
      if (Number.isFinite(now) && now !== last) {
        last = now;
        window.loomShown.push([now, Date.now()]);
      }
    }).observe(document.getElementById('main'), { subtree: true, childList: true,
                                                    characterData: true });
  });
  await page.waitForTimeout(Number(env('LOOM_LIVE_SECONDS')) * 1000);
  out.live_shown = await page.evaluate(() => window.loomShown);
  log('live job: the step changed', out.live_shown.length, 'times on its page');
  fs.writeFileSync(env('LOOM_OUT'), JSON.stringify(out));
  await browser.close();
} catch (e) {
  console.error('[console-bench] FAIL:', e && e.stack ? e.stack : e);
  await browser.close();
  process.exit(1);
}

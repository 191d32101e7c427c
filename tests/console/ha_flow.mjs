// Loom Console across a leader failover, in Debian's Chromium driven by
// playwright-core: the page submits a job, and its page, opened at the
// leader's console, stays open
// while the test kills that controller (kill -9), finds the new leader's
// console by itself, and goes on updating to the job's end with every step
// on its chart and without reloading.
//
//   node ha_flow.mjs   (everything through the environment:)
//     LOOM_CONSOLE_TOOLS  where scripts/install-deploy-deps.sh put playwright-core
//     LOOM_CONSOLE_URL    the leader's console; LOOM_PEER_URL the standby's
//     LOOM_TOKEN          an admin's token
//     LOOM_SPEC_JSON      the job to submit (loomctl -o json validate's output);
//     LOOM_JOB_STEPS      its total steps
//     LOOM_LEADER_PID     the leader's pid, killed here once the page is live
//     LOOM_SHOTS          where the screenshot of the page after it goes
//
// Exit 0 when the flow passed; otherwise the failure, on stderr. Every wait
// is bounded.
import assert from 'node:assert/strict';
import path from 'node:path';

import { env, launchChromium, logIn } from './chromium.mjs';

const url = env('LOOM_CONSOLE_URL');
const peer = env('LOOM_PEER_URL');
const steps = Number(env('LOOM_JOB_STEPS'));
const log = (...a) => console.log('[console-ha]', ...a);

const browser = await launchChromium();

// The step tile's number, and what the loss chart holds.
const stepShown = (page) => page.evaluate(() => {
  const tile = [...document.querySelectorAll('.stat')].find(
      (s) => s.querySelector('.label').textContent === 'step');
  return tile ? Number(tile.querySelector('.value').textContent.split('/')[0]) : -1;
});
const lossChart = (page) => page.evaluate(() => {
  const c = document.querySelector('canvas.chart');
  return c ? { steps: Number(c.dataset.steps), first: Number(c.dataset.firstStep),
               last: Number(c.dataset.lastStep) } : null;
});

let page = null;
try {
  const context = await browser.newContext(
      { ignoreHTTPSErrors: true, viewport: { width: 1280, height: 800 } });
  page = await context.newPage();
  page.setDefaultTimeout(30000);
  page.on('pageerror', (e) => { throw new Error('page error: ' + e); });
  await logIn(page, url, env('LOOM_TOKEN'));
  // Submitted through the console's API, with the session and its CSRF token.
  const submitted = await page.evaluate(async (spec) => {
    const who = await (await fetch('/api/v1/session')).json();
    const res = await fetch('/api/v1/jobs', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'X-Loom-CSRF': who.csrf_token },
      body: JSON.stringify({ spec }),
    });
    return { status: res.status, body: await res.json() };
  }, JSON.parse(env('LOOM_SPEC_JSON')));
  assert.equal(submitted.status, 200, JSON.stringify(submitted.body));
  const job = submitted.body.job.id;
  log('submitted', job, 'through the console');
  await page.goto(url + '/jobs/' + job);
  await page.waitForSelector('canvas.chart');
  await page.waitForFunction(
      () => [...document.querySelectorAll('.stat')].some(
          (s) => s.querySelector('.label').textContent === 'step' &&
              Number(s.querySelector('.value').textContent.split('/')[0]) >= 10),
      null, { timeout: 120000 });
  // A mark on the window: gone if the page were loaded again.
  await page.evaluate(() => { window.loomKeptOpen = true; });
  const before = await stepShown(page);
  assert.ok(before < steps, `the job ended (step ${before}) before the kill`);
  process.kill(Number(env('LOOM_LEADER_PID')), 'SIGKILL');
  const killed = Date.now();
  log('killed the leader at step', before);

  // The page notices, finds the new leader, and says so.
  await page.waitForSelector('#moved:not([hidden])', { timeout: 60000 });
  const moved = await page.locator('#moved').innerText();
  assert.ok(moved.includes(peer), `the notice does not name ${peer}: ${moved}`);
  await page.waitForFunction(
      (b) => [...document.querySelectorAll('.stat')].some(
          (s) => s.querySelector('.label').textContent === 'step' &&
              Number(s.querySelector('.value').textContent.split('/')[0]) > b + 5),
      before, { timeout: 60000 });
  log('steps arrive again through', peer, (Date.now() - killed) / 1000, 's after the kill; now at',
      await stepShown(page));

  // To the end: the state from the stream, every step on the chart.
  await page.waitForSelector('.badge.SUCCEEDED', { timeout: 240000 });
  await page.waitForFunction(
      (n) => Number((document.querySelector('canvas.chart') || { dataset: {} }).dataset.lastStep) === n,
      steps, { timeout: 30000 });
  const held = await lossChart(page);
  log('the loss chart holds', JSON.stringify(held));
  // From the first step to the last, none missing.
  assert.deepEqual(held, { steps, first: 1, last: steps });
  assert.equal(await stepShown(page), steps);
  assert.equal(await page.evaluate(() => window.loomKeptOpen), true, 'the page was loaded again');
  // No value the page failed to fill shows as a word.
  const text = await page.locator('main').innerText();
  assert.doesNotMatch(text, /\b(null|undefined|NaN)\b/, 'a value shows as null/undefined/NaN');
  // The top of the page: the notice, the tiles and the loss chart.
  await page.screenshot({ path: path.join(env('LOOM_SHOTS'), 'job-after-failover-1280x800.png') });
  log('PASS');
  await browser.close();
} catch (e) {
  console.error('[console-ha] FAIL:', e && e.stack ? e.stack : e);
  if (page) {
    const where = path.join(env('LOOM_SHOTS'), 'job-failover-FAILED.png');
    await page.screenshot({ path: where, fullPage: true }).catch(() => {});
    console.error('[console-ha] the page as it was:', where, '\n',
                  await page.locator('body').innerText().catch(() => '?'));
  }
  await browser.close();
  process.exit(1);
}

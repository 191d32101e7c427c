// Loom Console in a real browser: Debian's Chromium driven by
// playwright-core (which downloads no browser), against a real local
// cluster that tests/console_browser_test.cc started and filled with jobs.
//
//   node flows.mjs   (everything through the environment:)
//     LOOM_CONSOLE_TOOLS  where scripts/install-deploy-deps.sh put playwright-core
//     LOOM_CONSOLE_URL    the controller's console, https://127.0.0.1:<port>
//     LOOM_TOKEN          an admin's token; LOOM_READER_TOKEN a reader's
//     LOOM_JOBS           JSON: {"spiky": id, "long": id, "compare": [id, id, id], "evil": id}
//     LOOM_SHOTS          where the screenshots go (1280x800 and 390x844 per page)
//
// Exit 0 when every flow passed; otherwise the first failure, on stderr.
// Every wait is bounded: nothing here runs for ever.
import assert from 'node:assert/strict';
import path from 'node:path';

import { env, launchChromium, logIn as logInAt } from './chromium.mjs';

const url = env('LOOM_CONSOLE_URL');
const jobs = JSON.parse(env('LOOM_JOBS'));
const shots = env('LOOM_SHOTS');

const browser = await launchChromium();
const log = (...a) => console.log('[console-flows]', ...a);
let dialogs = [];  // every alert/confirm the pages opened: an injected script would add one

async function newPage(viewport = { width: 1280, height: 800 }) {
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport });
  const page = await context.newPage();
  page.setDefaultTimeout(30000);
  page.on('pageerror', (e) => { throw new Error('page error: ' + e); });
  page.on('dialog', async (d) => {
    dialogs.push(d.type() + ': ' + d.message());
    await d.accept();
  });
  return { context, page };
}

const logIn = (page, token) => logInAt(page, url, token);

// The number in the job page's "step" tile.
async function stepShown(page) {
  const text = await page.locator('.stat:has(.label:text-is("step")) .value').innerText();
  return Number(text.split('/')[0].trim());
}

try {
  // No session: the API answers 401 and the pages ask for a login.
  {
    const { context, page } = await newPage();
    const res = await page.request.get(url + '/api/v1/jobs');
    assert.equal(res.status(), 401);
    await page.goto(url + '/jobs/' + jobs.spiky);
    await page.waitForSelector('input[name=token]');
    assert.match(page.url(), /\/login\?next=/);
    await context.close();
    log('no session: 401 and the login page');
  }

  const { context, page } = await newPage();
  await logIn(page, env('LOOM_TOKEN'));
  log('logged in');

  // The jobs page filters on the server: a piece of the name finds the
  // three compared runs, a submitter no one is finds none, and the URL
  // keeps the filter.
  const rowsShown = () => page.locator('main table tbody tr').count();
  await page.fill('input[placeholder="name or id"]', 'lr-');
  await page.waitForFunction(
      () => document.querySelectorAll('main table tbody tr').length === 3, null,
      { timeout: 30000 });
  assert.match(page.url(), /[?&]name=lr-/);
  await page.fill('input[placeholder="submitter (exact)"]', 'nobody');
  await page.waitForFunction(() => !document.querySelector('main table tbody tr'), null,
                             { timeout: 30000 });
  log('jobs filtered on the server: "lr-" gives 3,', 'submitter "nobody"', await rowsShown());
  await page.goto(url + '/jobs');
  await page.waitForSelector('main table tbody tr');

  // The spiky job's page while it runs: steps arrive live, then its spike
  // and rollback show as markers and events.
  await page.goto(url + '/jobs/' + jobs.spiky);
  await page.waitForSelector('canvas');
  const first = await stepShown(page);
  await page.waitForFunction(
      (before) => {
        const tile = [...document.querySelectorAll('.stat')].find(
            (s) => s.querySelector('.label').textContent === 'step');
        return tile && Number(tile.querySelector('.value').textContent.split('/')[0]) > before + 5;
      },
      first, { timeout: 60000 });
  log('steps arrive live: from step', first, 'to', await stepShown(page));
  await page.waitForSelector('ul.markers li[data-kind="spike"]', { timeout: 120000 });
  await page.waitForSelector('ul.markers li[data-kind="rollback"]', { timeout: 60000 });
  await page.waitForSelector('td:text-is("ROLLBACK")');
  log('spike and rollback shown:',
      await page.locator('ul.markers').innerText().then((t) => t.replace(/\n/g, '; ')));

  // Goodput: every bucket, summing to the wall time, and an ETTR in (0, 1].
  // The controller answers figures up to a few seconds old and the page
  // reloads them every 10 s: wait for ones that count this job's steps.
  await page.waitForFunction(() => {
    const box = document.querySelector('#goodput[data-ettr]');
    return box && box.querySelector('table tbody tr') && Number(box.dataset.ettr) > 0;
  }, null, { timeout: 30000 });
  const goodput = await page.evaluate(() => {
    const box = document.querySelector('#goodput');
    const rows = [...box.querySelectorAll('table tbody tr')].map(
        (tr) => [tr.cells[0].textContent, Number(tr.cells[1].textContent)]);
    const widths = [...box.querySelectorAll('.goodput-bar span')].reduce(
        (sum, s) => sum + parseFloat(s.style.width), 0);
    return { ettr: Number(box.dataset.ettr), wall: Number(box.dataset.wallSeconds), rows, widths };
  });
  assert.equal(goodput.rows.length, 11, JSON.stringify(goodput.rows));
  assert.ok(goodput.ettr > 0 && goodput.ettr <= 1, 'ETTR ' + goodput.ettr);
  const productive = goodput.rows.find(([name]) => name === 'productive steps');
  assert.ok(productive && productive[1] > 0, JSON.stringify(goodput.rows));
  const summed = goodput.rows.reduce((sum, [, sec]) => sum + sec, 0);
  assert.ok(Math.abs(summed - goodput.wall) <= 0.01 * goodput.wall + 0.01,
            `buckets ${summed} s, wall ${goodput.wall} s`);
  assert.ok(Math.abs(goodput.widths - 100) < 0.5, 'bar ' + goodput.widths + '%');
  log('goodput: ETTR', goodput.ettr, 'over', goodput.wall, 's in 11 buckets');

  // The logs: search across ranks and attempts.
  await page.fill('input[placeholder^="search every rank"]', 'loom-rank');
  await page.press('input[placeholder^="search every rank"]', 'Enter');
  await page.waitForSelector('td:has-text("loom-rank")');
  log('log search found', await page.locator('td:has-text("loom-rank")').count(), 'lines');

  // Compare three runs: three lines, and their specs' difference (lr).
  await page.goto(url + '/compare?jobs=' + jobs.compare.join(','));
  await page.waitForSelector('.legend span');
  assert.equal(await page.locator('.legend > span').count(), 3);
  await page.waitForSelector('td:text-is("optimizer.adamw.lr")');
  log('compare: 3 runs, lr differs');

  // Escaping: a reason with markup is shown as text and runs nothing.
  await page.goto(url + '/jobs/' + jobs.evil);
  await page.waitForSelector('td:has-text("<img src=x onerror=alert(1)>")');
  assert.equal(await page.locator('img[src="x"]').count(), 0);
  log('markup in an event is text');

  // Cancel a running job from its page (confirmed in a dialog).
  await page.goto(url + '/jobs/' + jobs.long);
  dialogs = [];
  await page.click('button:text-is("Cancel")');
  await page.waitForSelector('.badge.CANCELLED', { timeout: 30000 });
  assert.ok(dialogs.some((d) => d.startsWith('confirm:')), 'cancel asked for confirmation');
  await page.waitForSelector('td:has-text("by user")');
  log('cancelled from the page, recorded with who did it');

  // An admin cordons a node from the workers page (asked for a reason and a
  // confirmation), sees it, and uncordons it.
  await page.goto(url + '/workers');
  const firstNode = await page.locator('main table tbody tr span.actions').first()
                        .getAttribute('data-node');
  const row = page.locator(`main table tbody tr:has(span.actions[data-node="${firstNode}"])`);
  dialogs = [];
  await row.locator('button:text-is("Cordon…")').click();
  await page.waitForSelector(
      `main table tbody tr:has(span.actions[data-node="${firstNode}"]) button:text-is("Uncordon")`);
  assert.match(await row.innerText(), /until uncordoned \(cordoned by user /);
  assert.ok(dialogs.some((d) => d.startsWith('prompt:')), 'cordon asked for a reason');
  assert.ok(dialogs.some((d) => d.startsWith('confirm:')), 'cordon asked for confirmation');
  await row.locator('button:text-is("Uncordon")').click();
  await page.waitForSelector(
      `main table tbody tr:has(span.actions[data-node="${firstNode}"]) button:text-is("Cordon…")`);
  log('cordoned and uncordoned', firstNode, 'from the workers page');

  // Screenshots of every page, wide and narrow.
  for (const [name, viewport] of [['1280x800', { width: 1280, height: 800 }],
                                  ['390x844', { width: 390, height: 844 }]]) {
    await page.setViewportSize(viewport);
    for (const [page_name, path_] of [['jobs', '/jobs'], ['job', '/jobs/' + jobs.spiky],
                                      ['compare', '/compare?jobs=' + jobs.compare.join(',')],
                                      ['queues', '/queues'], ['workers', '/workers'],
                                      ['plan', '/plan']]) {
      await page.goto(url + path_);
      await page.waitForSelector('main h1');
      await page.waitForLoadState('networkidle').catch(() => {});
      await page.screenshot({ path: path.join(shots, `${page_name}-${name}.png`) });
    }
  }
  log('screenshots in', shots);
  assert.deepEqual(dialogs.filter((d) => d.startsWith('alert')), [], 'no alert ran');
  await context.close();

  // A reader sees the jobs but is offered no action, and the server
  // refuses one anyway.
  {
    const reader = await newPage();
    await logIn(reader.page, env('LOOM_READER_TOKEN'));
    await reader.page.goto(url + '/jobs/' + jobs.spiky);
    await reader.page.waitForSelector('canvas');
    assert.equal(await reader.page.locator('button:text-is("Cancel")').count(), 0);
    await reader.page.goto(url + '/workers');
    await reader.page.waitForSelector('main table tbody tr');
    assert.equal(await reader.page.locator('button:text-is("Drain…")').count(), 0);
    await reader.page.goto(url + '/jobs/' + jobs.spiky);
    await reader.page.waitForSelector('canvas');
    const csrf = await reader.page.evaluate(async () => {
      const r = await fetch('/api/v1/session');
      return (await r.json()).csrf_token;
    });
    const refused = await reader.page.evaluate(async ([id, token]) => {
      const r = await fetch('/api/v1/jobs/' + id + ':cancel',
                            { method: 'POST', headers: { 'X-Loom-CSRF': token,
                                                         'Content-Type': 'application/json' },
                              body: '{}' });
      return r.status;
    }, [jobs.long, csrf]);
    assert.equal(refused, 403);
    const drainRefused = await reader.page.evaluate(async ([node, token]) => {
      const r = await fetch('/api/v1/nodes/' + encodeURIComponent(node) + ':drain',
                            { method: 'POST', headers: { 'X-Loom-CSRF': token,
                                                         'Content-Type': 'application/json' },
                              body: '{}' });
      return r.status;
    }, [firstNode, csrf]);
    assert.equal(drainRefused, 403);
    await reader.context.close();
    log('a reader is refused a cancel and a drain (403)');
  }
  log('all flows passed');
  await browser.close();
} catch (e) {
  console.error('[console-flows] FAILED:', e && e.stack || e);
  await browser.close().catch(() => {});
  process.exit(1);
}

// What every Loom Console browser script shares (tests/console/flows.mjs,
// tests/console/ha_flow.mjs, bench/console_bench.mjs): settings from the
// environment, Debian's Chromium through playwright-core (from
// $LOOM_CONSOLE_TOOLS, where scripts/install-deploy-deps.sh put it; it
// downloads no browser), and the console's login form.
import path from 'node:path';

// The environment variable `name`; throws when it is not set.
export function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
}

// Headless Chromium ($LOOM_CHROMIUM, default /usr/bin/chromium).
export async function launchChromium() {
  const { chromium } =
      await import(path.join(env('LOOM_CONSOLE_TOOLS'), 'node_modules/playwright-core/index.mjs'));
  return chromium.launch({
    executablePath: process.env.LOOM_CHROMIUM || '/usr/bin/chromium',
    args: ['--no-sandbox', '--disable-gpu'],
    timeout: 60000,
  });
}

// Logs `page` in at the console `url` with `token` (the form at /jobs,
// which asks for one), and waits for the jobs page.
export async function logIn(page, url, token) {
  await page.goto(url + '/jobs');
  await page.waitForSelector('input[name=token]');
  await page.fill('input[name=token]', token);
  await page.click('button[type=submit]');
  await page.waitForSelector('h1:has-text("Jobs")');
}

#!/usr/bin/env node
// Evaluates, through a running Prometheus's HTTP API, every PromQL expression
// of the Grafana dashboard (panel targets and annotations, with the
// dashboard's variables set to match everything) and every recording rule
// (its expression and the series it records), and fails unless each returns
// data. Also fails if Prometheus reports any rule unhealthy (an evaluation
// error) or any scrape target down.
// Usage: node prometheus_check.js http://HOST:PORT DASHBOARD.json RULES.yml... [--range 10m]
'use strict';
const fs = require('fs');
const http = require('http');
const os = require('os');
const path = require('path');
const { createRequire } = require('module');
const toolsDir = process.env.LOOM_TOOLS_DIR || path.join(os.homedir(), '.cache/loom/deploy-tools');
const YAML = createRequire(path.join(toolsDir, 'package.json'))('yaml');

const args = process.argv.slice(2);
let range = '10m';
const ri = args.indexOf('--range');
if (ri >= 0) range = args.splice(ri, 2)[1];
const [base, dashboardFile, ...ruleFiles] = args;

function get(pathAndQuery) {
  return new Promise((resolve, reject) => {
    http.get(base + pathAndQuery, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => {
        try {
          resolve(JSON.parse(body));
        } catch (e) {
          reject(new Error(`${pathAndQuery}: HTTP ${res.statusCode}: ${body.slice(0, 200)}`));
        }
      });
    }).on('error', reject);
  });
}

// Grafana's variables, as a dashboard with "All" selected expands them.
function expand(expr) {
  return expr
    .replace(/\$\{?__range\}?/g, range)
    .replace(/\$\{?__rate_interval\}?/g, '1m')
    .replace(/\$\{?__interval\}?/g, '15s')
    .replace(/\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?/g, '.*');
}

async function query(expr) {
  const r = await get(`/api/v1/query?query=${encodeURIComponent(expr)}`);
  if (r.status !== 'success') throw new Error(`${r.errorType}: ${r.error}`);
  return r.data.result;
}

(async () => {
  const checks = [];
  const dash = JSON.parse(fs.readFileSync(dashboardFile, 'utf8'));
  for (const p of dash.panels || []) {
    for (const t of p.targets || []) {
      if (t.expr) checks.push({ what: `panel ${p.id} "${p.title}" ${t.refId}`, expr: t.expr });
    }
  }
  for (const a of (dash.annotations && dash.annotations.list) || []) {
    if (a.expr) checks.push({ what: `annotation "${a.name}"`, expr: a.expr });
  }
  for (const f of ruleFiles) {
    for (const g of YAML.parse(fs.readFileSync(f, 'utf8')).groups) {
      for (const r of g.rules) {
        if (!r.record) continue;
        checks.push({ what: `rule ${r.record} (expr)`, expr: r.expr });
        checks.push({ what: `rule ${r.record} (recorded)`, expr: r.record });
      }
    }
  }
  let failed = 0;
  for (const c of checks) {
    const expr = expand(c.expr);
    try {
      const result = await query(expr);
      if (result.length === 0) {
        failed++;
        console.log(`FAIL ${c.what}: no data for ${expr}`);
      } else {
        const sample = result[0];
        const value = sample.value ? sample.value[1] : '';
        console.log(`ok   ${c.what}: ${result.length} series (e.g. ${JSON.stringify(sample.metric)} = ${value})`);
      }
    } catch (e) {
      failed++;
      console.log(`FAIL ${c.what}: ${e.message} for ${expr}`);
    }
  }
  const rules = await get('/api/v1/rules');
  let nrules = 0;
  for (const g of rules.data.groups) {
    for (const r of g.rules) {
      nrules++;
      if (r.health !== 'ok') {
        failed++;
        console.log(`FAIL rule ${r.name || r.record}: health ${r.health}: ${r.lastError}`);
      }
    }
  }
  console.log(`ok   ${nrules} rules loaded, all healthy unless listed above`);
  const targets = await get('/api/v1/targets');
  for (const t of targets.data.activeTargets) {
    if (t.health !== 'up') {
      failed++;
      console.log(`FAIL target ${t.labels.job} ${t.labels.instance}: ${t.health} ${t.lastError}`);
    }
  }
  console.log(`${checks.length - failed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
})().catch((e) => {
  console.log(`FAIL ${e.message}`);
  process.exit(1);
});

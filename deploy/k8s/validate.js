#!/usr/bin/env node
// Validates rendered Kubernetes manifests (multi-document YAML, e.g. the
// output of `kubectl kustomize deploy/k8s/overlays/NAME`) against the
// Kubernetes OpenAPI schemas, through the validators that kubernetes-models
// generates from them (and @kubernetes-models/prometheus-operator for the
// Operator's CRDs). An object of a kind no schema covers is an error: nothing
// passes unvalidated. Then checks Loom's own rules for its workloads (the
// hardening the issue asks for), each labelled "policy".
//
// Usage: node validate.js FILE...   (tools from $LOOM_TOOLS_DIR, installed by
// scripts/install-deploy-deps.sh). Exit 0 when every object passes.
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const { createRequire } = require('module');

const toolsDir = process.env.LOOM_TOOLS_DIR || path.join(os.homedir(), '.cache/loom/deploy-tools');
const need = createRequire(path.join(toolsDir, 'package.json'));
const YAML = need('yaml');

// apiVersion -> module exporting one model class per kind.
function modelFor(apiVersion, kind) {
  const [group, version] = apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
  const candidates = [];
  if (group === 'monitoring.coreos.com') {
    candidates.push(`@kubernetes-models/prometheus-operator/${group}/${version}`);
  } else {
    candidates.push(group ? `kubernetes-models/${group}/${version}` : `kubernetes-models/${version}`);
  }
  for (const mod of candidates) {
    try {
      const m = need(mod);
      if (m[kind]) return m[kind];
    } catch (e) {
      if (e.code !== 'MODULE_NOT_FOUND' && e.code !== 'ERR_PACKAGE_PATH_NOT_EXPORTED') throw e;
    }
  }
  return null;
}

function podSpecOf(obj) {
  if (obj.kind === 'Pod') return obj.spec;
  if (obj.spec && obj.spec.template && obj.spec.template.spec) return obj.spec.template.spec;
  return null;
}

// Loom's hardening rules for its own workloads.
function policyErrors(obj) {
  const errs = [];
  const spec = podSpecOf(obj);
  if (!spec) return errs;
  const psc = spec.securityContext || {};
  if (psc.runAsNonRoot !== true) errs.push('pod securityContext.runAsNonRoot is not true');
  if (!psc.seccompProfile || psc.seccompProfile.type !== 'RuntimeDefault') {
    errs.push('pod seccompProfile is not RuntimeDefault');
  }
  const all = [...(spec.initContainers || []), ...(spec.containers || [])];
  for (const c of all) {
    const sc = c.securityContext || {};
    const where = `container ${c.name}`;
    if (sc.allowPrivilegeEscalation !== false) errs.push(`${where}: allowPrivilegeEscalation is not false`);
    if (sc.readOnlyRootFilesystem !== true) errs.push(`${where}: readOnlyRootFilesystem is not true`);
    const drop = (sc.capabilities && sc.capabilities.drop) || [];
    if (!drop.includes('ALL')) errs.push(`${where}: capabilities do not drop ALL`);
    if (!c.resources || !c.resources.requests || !c.resources.limits) {
      errs.push(`${where}: no resource requests and limits`);
    } else if (!c.resources.limits.memory) {
      errs.push(`${where}: no memory limit`);
    }
    if (/:latest$/.test(c.image) || !/:[^/]+$/.test(c.image)) errs.push(`${where}: image ${c.image} has no pinned tag`);
  }
  for (const c of spec.containers || []) {
    if (!c.livenessProbe || !c.readinessProbe) errs.push(`container ${c.name}: no liveness/readiness probe`);
  }
  return errs;
}

// --print-flags NAME FILE: the --flags (names only, one a line) that the
// Deployment or StatefulSet NAME passes its containers, on the command line
// and through its ConfigMap NAME-config flag files. The deploy test checks
// each against the binary's --helpfull.
if (process.argv[2] === '--print-flags') {
  const [name, file] = process.argv.slice(3);
  const objs = YAML.parseAllDocuments(fs.readFileSync(file, 'utf8')).map((d) => d.toJS()).filter(Boolean);
  const lines = [];
  for (const o of objs) {
    if (['Deployment', 'StatefulSet'].includes(o.kind) && o.metadata.name === name) {
      for (const c of podSpecOf(o).containers) lines.push(...(c.command || []), ...(c.args || []));
    }
    if (o.kind === 'ConfigMap' && o.metadata.name === `${name}-config`) {
      for (const v of Object.values(o.data || {})) lines.push(...v.split('\n'));
    }
  }
  const names = new Set(lines.map((l) => (/^\s*--([a-z_]+)/.exec(l) || [])[1]).filter(Boolean));
  console.log([...names].sort().join('\n'));
  process.exit(names.size ? 0 : 1);
}

let failed = 0, checked = 0;
for (const file of process.argv.slice(2)) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, 'utf8'));
  for (const doc of docs) {
    if (doc.errors.length) {
      console.log(`FAIL ${file}: YAML: ${doc.errors[0].message}`);
      failed++;
      continue;
    }
    const obj = doc.toJS();
    if (obj == null) continue;
    const id = `${obj.kind}/${obj.metadata && obj.metadata.name}`;
    checked++;
    const Model = obj.apiVersion && obj.kind ? modelFor(obj.apiVersion, obj.kind) : null;
    if (!Model) {
      console.log(`FAIL ${id}: no OpenAPI schema for ${obj.apiVersion} ${obj.kind}`);
      failed++;
      continue;
    }
    const errs = [];
    try {
      new Model(obj).validate();
    } catch (e) {
      errs.push(`schema: ${e.message}`);
    }
    if (!obj.metadata || !obj.metadata.namespace) {
      if (!['Namespace', 'ClusterRole', 'ClusterRoleBinding'].includes(obj.kind)) {
        errs.push('schema: no metadata.namespace');
      }
    }
    for (const p of policyErrors(obj)) errs.push(`policy: ${p}`);
    if (errs.length) {
      failed++;
      for (const e of errs) console.log(`FAIL ${id}: ${e}`);
    } else {
      console.log(`ok   ${obj.apiVersion} ${id}`);
    }
  }
}
console.log(`${checked - failed} passed, ${failed} failed`);
process.exit(failed || checked === 0 ? 1 : 0);

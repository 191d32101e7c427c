#!/usr/bin/env node
// Turns a rendered overlay (deploy/k8s, `kubectl kustomize`) into what
// `podman kube play --network=host` 4.3 can run on one machine, changing as
// little as possible, and prints every change on stderr:
//  * kinds podman 4.3 cannot play are left out (Namespace, ServiceAccount,
//    RBAC, Service, PodDisruptionBudget, NetworkPolicy, monitors); on host
//    networking the pods reach each other on 127.0.0.1 instead of Services;
//  * a StatefulSet becomes one Pod per replica (podman 4.3 has no
//    StatefulSet), named NAME-0, NAME-1, ... as Kubernetes names them;
//  * PersistentVolumeClaims and Secrets become hostPath volumes under the
//    test's directory (a Secret NAME is the directory secretDir/NAME, which
//    the test fills as Kubernetes would mount it: group 10001, mode 0440; a
//    volume that selects some of a Secret's keys with `items` gets a
//    directory of its own holding only those, so a pod sees what it would
//    see on Kubernetes and no more); the data volume is mounted at its host
//    path so the job spec's absolute data paths mean the same inside and out;
//  * ports (gRPC, metrics, the workers' health service) are remapped to free
//    loopback ports (host networking: every container shares the host's
//    ports), given as flags after --flagfile so they override the
//    ConfigMap's; downward-API env values become literals
//    (podman 4.3 resolves none of spec.nodeName, status.podIP), and
//    $(VAR) references in args are expanded as the kubelet would (podman 4.3
//    passes them through verbatim);
//  * emptyDir volumes are renamed NAME-POD: podman 4.3 makes an emptyDir a
//    named volume, shared by every pod that uses the same volume name (the
//    workers would share /dev/shm and their work directories);
//  * gRPC and httpGet probes are dropped: podman 4.3 runs probes as
//    healthchecks through systemd timers, which this machine lacks; the test
//    checks health itself through the same protocols.
// Usage: node kube_play_convert.js RENDERED.yaml PARAMS.json > play.yaml
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const { createRequire } = require('module');
const toolsDir = process.env.LOOM_TOOLS_DIR || path.join(os.homedir(), '.cache/loom/deploy-tools');
const YAML = createRequire(path.join(toolsDir, 'package.json'))('yaml');

const [renderedFile, paramsFile] = process.argv.slice(2);
const p = JSON.parse(fs.readFileSync(paramsFile, 'utf8'));
// p: {controllerGrpc, controllerMetrics, controllerHealth, controllerConsole,
//     workerMetrics: [..], workerHealth: [..], hostDir: {claimName: dir}, secretDir, dataMount}
const objs = YAML.parseAllDocuments(fs.readFileSync(renderedFile, 'utf8')).map((d) => d.toJS()).filter(Boolean);
const note = (s) => process.stderr.write(`kube-play: ${s}\n`);
const out = [];

function hostVolumes(spec, podName) {
  spec.volumes = (spec.volumes || []).map((v) => {
    if (v.persistentVolumeClaim) {
      const dir = p.hostDir[v.persistentVolumeClaim.claimName];
      if (!dir) throw new Error(`no host directory for claim ${v.persistentVolumeClaim.claimName}`);
      note(`${podName}: PersistentVolumeClaim ${v.persistentVolumeClaim.claimName} -> hostPath ${dir}`);
      return { name: v.name, hostPath: { path: dir, type: 'Directory' } };
    }
    if (v.secret) {
      const whole = path.join(p.secretDir, v.secret.secretName);
      if (!fs.existsSync(whole)) throw new Error(`no directory ${whole} for Secret ${v.secret.secretName}`);
      let dir = whole;
      if (v.secret.items) {
        dir = path.join(p.secretDir, `${v.secret.secretName}.${podName}.${v.name}`);
        fs.mkdirSync(dir, { recursive: true });
        for (const item of v.secret.items) {
          const from = path.join(whole, item.key);
          const to = path.join(dir, item.path);
          fs.copyFileSync(from, to);
          const st = fs.statSync(from);
          fs.chownSync(to, st.uid, st.gid);
          fs.chmodSync(to, st.mode & 0o777);
        }
      }
      note(`${podName}: Secret ${v.secret.secretName}${v.secret.items ? ` (items ${v.secret.items.map((i) => i.key).join(', ')})` : ''} -> hostPath ${dir} (mode 0440, group 10001)`);
      return { name: v.name, hostPath: { path: dir, type: 'Directory' } };
    }
    if (v.emptyDir) {
      const unique = `${podName}-${v.name}`;
      for (const c of [...(spec.initContainers || []), ...spec.containers]) {
        for (const m of c.volumeMounts || []) if (m.name === v.name) m.name = unique;
      }
      note(`${podName}: emptyDir ${v.name} -> podman volume ${unique}`);
      return { ...v, name: unique };
    }
    return v;
  });
}

function dropProbes(c, podName) {
  for (const k of ['startupProbe', 'livenessProbe', 'readinessProbe']) {
    if (c[k]) {
      delete c[k];
      note(`${podName}/${c.name}: ${k} dropped (checked by the test instead)`);
    }
  }
  delete c.ports;  // host networking: nothing to publish
}

for (const o of objs) {
  const id = `${o.kind}/${o.metadata.name}`;
  switch (o.kind) {
    case 'ConfigMap':
      out.push(o);
      break;
    case 'Deployment': {
      const spec = o.spec.template.spec;
      hostVolumes(spec, o.metadata.name);
      for (const c of spec.containers) {
        dropProbes(c, o.metadata.name);
        // The workers' data volume moves to dataMount (below), and with it
        // the root the controller confines data paths to.
        c.args = (c.args || []).map((a) => (a === '--data_root=/data' ? `--data_root=${p.dataMount}` : a));
        c.args = [...c.args, `--listen=127.0.0.1:${p.controllerGrpc}`,
                  `--metrics_listen=127.0.0.1:${p.controllerMetrics}`,
                  `--health_listen=127.0.0.1:${p.controllerHealth}`,
                  `--console_port=${p.controllerConsole}`];
        note(`${o.metadata.name}/${c.name}: gRPC on 127.0.0.1:${p.controllerGrpc}, metrics on 127.0.0.1:${p.controllerMetrics}, health on 127.0.0.1:${p.controllerHealth}, console on 127.0.0.1:${p.controllerConsole}, data root ${p.dataMount}`);
      }
      out.push(o);
      break;
    }
    case 'StatefulSet': {
      const n = o.spec.replicas;
      if (p.workerMetrics.length < n || p.workerHealth.length < n) {
        throw new Error(`need ${n} worker metrics and health ports`);
      }
      note(`${id}: played as ${n} Pods (podman 4.3 has no StatefulSet)`);
      for (let i = 0; i < n; i++) {
        const name = `${o.metadata.name}-${i}`;
        const spec = JSON.parse(JSON.stringify(o.spec.template.spec));
        hostVolumes(spec, name);
        for (const c of [...(spec.initContainers || []), ...spec.containers]) {
          for (const m of c.volumeMounts || []) {
            if (m.name === 'data') {
              m.mountPath = p.dataMount;
              note(`${name}/${c.name}: data volume mounted at ${p.dataMount}`);
            }
          }
        }
        for (const c of spec.containers) {
          dropProbes(c, name);
          const literal = { LOOM_NODE: name, LOOM_POD_IP: '127.0.0.1', LOOM_POD_NAME: name, LOOM_ZONE: 'zone-a', LOOM_RACK: `rack-${i}` };
          c.env = (c.env || []).map((e) => {
            if (e.valueFrom && e.valueFrom.fieldRef && e.name in literal) {
              note(`${name}/${c.name}: env ${e.name} (${e.valueFrom.fieldRef.fieldPath}) = ${literal[e.name]}`);
              return { name: e.name, value: literal[e.name] };
            }
            return e;
          });
          const env = Object.fromEntries(c.env.filter((e) => 'value' in e).map((e) => [e.name, e.value]));
          c.args = (c.args || []).map((a) => a.replace(/\$\(([A-Z_][A-Z0-9_]*)\)/g, (m, v) => {
            if (!(v in env)) throw new Error(`${name}/${c.name}: args use $(${v}), which has no value`);
            return env[v];
          }));
          note(`${name}/${c.name}: args $(VAR) expanded: ${c.args.join(' ')}`);
          c.args = [...c.args, `--controller=127.0.0.1:${p.controllerGrpc}`,
                    `--metrics_listen=127.0.0.1:${p.workerMetrics[i]}`,
                    `--health_listen=127.0.0.1:${p.workerHealth[i]}`];
          note(`${name}/${c.name}: controller 127.0.0.1:${p.controllerGrpc}, metrics on 127.0.0.1:${p.workerMetrics[i]}, health on 127.0.0.1:${p.workerHealth[i]}`);
        }
        out.push({
          apiVersion: 'v1', kind: 'Pod',
          metadata: { name, namespace: o.metadata.namespace,
                      labels: { ...o.spec.template.metadata.labels, 'statefulset.kubernetes.io/pod-name': name },
                      annotations: o.spec.template.metadata.annotations },
          spec,
        });
      }
      break;
    }
    default:
      note(`${id}: not played (podman kube play 4.3 does not run ${o.kind}; host networking stands in for Services and policies)`);
  }
}
process.stdout.write(out.map((o) => YAML.stringify(o)).join('---\n'));

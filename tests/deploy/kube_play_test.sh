#!/usr/bin/env bash
# Manifests run: the rendered cpu-dev overlay, converted only where podman
# 4.3 cannot play a kind or a field (tests/deploy/kube_play_convert.js prints
# each change), is played with `podman kube play --network=host` from the
# images scripts/build-images.sh built: the controller Deployment and two
# workers come up, loomctl on the host submits a tiny data-parallel job, it
# ends SUCCEEDED with checkpoints on the shared volume (the controller's
# --checkpoint_root), and tear-down leaves no container, pod or volume behind.
# The containers read the Secrets straight from their files (root:10001,
# mode 0440, as Kubernetes mounts them with fsGroup). No token exists for
# workers: each proves its node with its certificate from loom-worker-tls
# (worker-<node>.pem/.key) and sees no other Secret's keys; the workers report the
# zone and rack the downward API gives them and answer grpc.health.v1 with
# SERVING once registered.
source "$(dirname "$0")/lib.sh"
require_images
TOOLS=${LOOM_TOOLS_DIR:-$HOME/.cache/loom/deploy-tools}
KUBECTL="$TOOLS/bin/kubectl"
[ -x "$KUBECTL" ] || fail "$KUBECTL missing: run scripts/install-deploy-deps.sh"
T=$(mktemp -d /tmp/loom_kube_play.XXXXXX)
chmod 755 "$T"
podman volume ls -q | sort > "$T/volumes.before"
played=0
teardown() {
  if [ "$played" = 1 ]; then
    podman kube down "$T/play.yaml" > /dev/null 2>&1 || true
    comm -13 "$T/volumes.before" <(podman volume ls -q | sort) | xargs -r podman volume rm -f > /dev/null 2>&1 || true
  fi
}
trap 'teardown; rm -rf "$T"' EXIT

mkdir -p "$T"/{controller-data,checkpoints,data} "$T"/secret/{loom-users,loom-tls,loom-worker-tls}
chown 10001:10001 "$T/controller-data" "$T/checkpoints"
# The Secrets as Kubernetes mounts them with fsGroup 10001: group-readable.
# loom-users: "ops", an admin, whose token loomctl on the host holds.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$T/host-token"
chmod 0600 "$T/host-token"
printf 'ops admin sha256:%s\n' "$(tr -d '\n' < "$T/host-token" | sha256sum | cut -d' ' -f1)" > "$T/secret/loom-users/users"
chgrp 10001 "$T/secret/loom-users/users"
chmod 0440 "$T/secret/loom-users/users"
# loom-tls: the cluster CA and the controller's certificate, for the
# address the workers and loomctl dial here.
"$LOOM_BIN_DIR/loomctl" ca issue server controller --dir "$T/tls" --host 127.0.0.1 \
  --host loom-controller > /dev/null
for f in ca.pem controller.pem controller.key; do install -m 0440 -g 10001 "$T/tls/$f" "$T/secret/loom-tls/$f"; done
# loom-worker-tls: one certificate per node, as docs/kubernetes.md issues
# them (the converted pods' spec.nodeName is the pod's name).
for n in loom-worker-0 loom-worker-1; do
  "$LOOM_BIN_DIR/loomctl" ca issue worker "$n" --dir "$T/tls" > /dev/null
  for ext in pem key; do
    install -m 0440 -g 10001 "$T/tls/worker-$n.$ext" "$T/secret/loom-worker-tls/worker-$n.$ext"
  done
done
"$LOOM_BIN_DIR/loomctl" data prepare --input /usr/share/games/fortunes/fortunes \
  /usr/share/games/fortunes/literature --out "$T/data" --val-fraction 0.1 > /dev/null
chmod -R a+rX "$T/data"

grpc=$(free_port); metrics=$(free_port); health=$(free_port); w0=$(free_port); w1=$(free_port)
h0=$(free_port); h1=$(free_port); console=$(free_port)
cat > "$T/params.json" << JSON
{"controllerGrpc": $grpc, "controllerMetrics": $metrics, "controllerHealth": $health,
 "controllerConsole": $console,
 "workerMetrics": [$w0, $w1],
 "workerHealth": [$h0, $h1],
 "hostDir": {"loom-controller-data": "$T/controller-data", "loom-checkpoints": "$T/checkpoints",
             "loom-data": "$T/data"},
 "secretDir": "$T/secret", "dataMount": "$T/data"}
JSON
"$KUBECTL" kustomize "$LOOM_SOURCE_DIR/deploy/k8s/overlays/cpu-dev" > "$T/rendered.yaml"
node "$(dirname "$0")/kube_play_convert.js" "$T/rendered.yaml" "$T/params.json" > "$T/play.yaml"
grep -q "image: localhost/loom-worker:$TAG" "$T/play.yaml" || fail "played manifests do not use localhost/loom-worker:$TAG"

say "podman kube play --network=host (controller gRPC $grpc, metrics $metrics; workers $w0, $w1)"
played=1
podman kube play --network=host "$T/play.yaml" > "$T/play.out" 2>&1 || { cat "$T/play.out" >&2; fail "podman kube play"; }
podman ps --format '{{.Names}} {{.Image}} {{.Status}}' | grep loom- || true

ctl=("$LOOM_BIN_DIR/loomctl" --tls-ca "$T/tls/ca.pem" --controller "127.0.0.1:$grpc" --token-file "$T/host-token")
wait_for 60 "the controller's gRPC health service" "$LOOM_BIN_DIR/loom-probe" grpc "127.0.0.1:$health"
# TLS only on the gRPC port: a plaintext client is refused.
"$LOOM_BIN_DIR/loomctl" --plaintext --controller "127.0.0.1:$grpc" --token-file "$T/host-token" workers \
  > /dev/null 2>&1 && fail "the controller answered a plaintext client"
two_workers() { [ "$("${ctl[@]}" workers | grep -c ' yes ')" = 2 ]; }
wait_for 60 "two workers alive" two_workers
"${ctl[@]}" workers | tee "$T/workers.out"
for port in "$w0" "$w1"; do "$LOOM_BIN_DIR/loom-probe" http "127.0.0.1:$port" /metrics > /dev/null; done
for i in 0 1; do
  grep -qE "^loom-worker-$i-[0-9a-f]+ +loom-worker-$i +zone-a +rack-$i +yes " "$T/workers.out" ||
    fail "loomctl workers does not show loom-worker-$i in zone-a, rack-$i"
done
for port in "$h0" "$h1"; do
  out=$("$LOOM_BIN_DIR/loom-probe" grpc "127.0.0.1:$port") || fail "worker health on $port: $out"
  [ "$out" = SERVING ] || fail "worker health on $port: $out"
done
say "workers report zone-a/rack-0 and zone-a/rack-1; their grpc.health.v1 says SERVING"
for c in loom-controller-pod-0-controller loom-worker-0-worker loom-worker-1-worker; do
  [ "$(podman inspect "$c" --format '{{.Config.User}}')" = 10001 ] ||
    [ "$(podman inspect "$c" --format '{{.Config.User}}')" = 10001:10001 ] ||
    fail "$c does not run as uid 10001: $(podman inspect "$c" --format '{{.Config.User}}')"
  [ "$(podman inspect "$c" --format '{{.HostConfig.ReadonlyRootfs}}')" = true ] ||
    fail "$c: root filesystem is writable (readOnlyRootFilesystem)"
done
say "controller and both workers up, non-root, read-only root filesystems"
# Loom Console, as the manifests serve it: HTTPS with the controller's
# certificate, the pages, and the API for the users file's people only.
con=(curl -sS --max-time 10 --cacert "$T/tls/ca.pem" -o "$T/console.out" -w '%{http_code}')
[ "$("${con[@]}" "https://127.0.0.1:$console/jobs")" = 200 ] || fail "the console's pages: $(cat "$T/console.out")"
[ "$("${con[@]}" "https://127.0.0.1:$console/api/v1/jobs")" = 401 ] ||
  fail "the console's API answered a caller with no token: $(cat "$T/console.out")"
[ "$("${con[@]}" -H "Authorization: Bearer $(cat "$T/host-token")" "https://127.0.0.1:$console/api/v1/whoami")" = 200 ] ||
  fail "the console's API refused the admin: $(cat "$T/console.out")"
say "the console serves its pages over HTTPS and its API to the users file's people: $(cat "$T/console.out")"
[ -z "$(podman ps -a --format '{{.Names}}' | grep -E 'loom-(controller|worker)-.*-token$' || true)" ] ||
  fail "an init container copies the token; the daemons should read the Secret directly"
# What a worker pod can read of the Secrets: the CA certificate and the
# workers' certificates, never a key of loom-tls or the users file.
# Read from the container's mounts (not with podman exec: in a chroot,
# runc's exec lands in the host's root instead of the container's).
seen=""
while read -r src dst; do
  case $dst in /etc/loom/*) ;; *) continue ;; esac
  if [ -d "$src" ]; then
    seen+="$(ls "$src" | tr '\n' ' ')"
  else
    seen+="$(basename "$dst") "
  fi
done < <(podman inspect loom-worker-0-worker --format '{{range .Mounts}}{{.Source}} {{.Destination}}{{"\n"}}{{end}}')
for f in controller.key ca.key users token; do
  grep -qw "$f" <<<"$seen" && fail "a worker pod sees $f: $seen"
done
grep -q 'worker-loom-worker-0.key' <<<"$seen" || fail "loom-worker-0 lacks its certificate: $seen"
say "worker pods hold the CA certificate and the workers' certificates only (no token exists): $seen"

cat > "$T/tiny.yaml" << YAML
name: tiny
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data:
  train: ["$T/data/train_*.bin"]
  validation: ["$T/data/val_*.bin"]
optimizer:
  adamw: {lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: 40, warmup_steps: 5, eval_interval: 20, eval_batches: 4}
batch: {global_batch: 8, micro_batch: 4}
resources: {workers: 2, ranks: 2}
checkpoint: {interval_steps: 20, keep: 2}
seed: 7
YAML
say "loomctl submit --follow (2 ranks, one per worker pod)"
timeout 240 "${ctl[@]}" submit --follow "$T/tiny.yaml" > "$T/submit.out" 2>&1 ||
  { cat "$T/submit.out"; podman logs loom-worker-0-worker 2>&1 | tail -20; fail "the job did not succeed"; }
tail -3 "$T/submit.out"
"${ctl[@]}" -o json status tiny-1 > "$T/status.json"
grep -q '"state": "SUCCEEDED"' "$T/status.json" || fail "tiny-1 is not SUCCEEDED: $(head -c 400 "$T/status.json")"
grep -q '"node": "loom-worker-0"' "$T/status.json" && grep -q '"node": "loom-worker-1"' "$T/status.json" ||
  fail "the ranks did not run on both worker pods"
ls "$T/checkpoints/tiny-1" > /dev/null 2>&1 || fail "no checkpoints on the shared volume"
grep -q committed <<<"$("${ctl[@]}" checkpoints tiny-1)" || fail "no committed checkpoint in the catalog"
# --verify re-reads every checksum in the controller's pod (no LibTorch there).
"${ctl[@]}" checkpoints tiny-1 --verify > "$T/verify.out" 2>&1 ||
  fail "loomctl checkpoints --verify in the controller pod: $(head -c 400 "$T/verify.out")"
grep -q committed "$T/verify.out" || fail "--verify found no committed checkpoint: $(head -c 400 "$T/verify.out")"
say "loomctl checkpoints tiny-1 --verify: $(grep -c committed "$T/verify.out") committed, verified in the controller's pod"
# A rank's log through the controller, without a shell on its pod.
"${ctl[@]}" logs tiny-1 --rank 1 > "$T/rank1.log" || fail "loomctl logs tiny-1 --rank 1"
grep -q 'loom-rank 1/2' "$T/rank1.log" || fail "rank 1's log lacks its start line: $(head -c 300 "$T/rank1.log")"
say "loomctl logs tiny-1 --rank 1: $(wc -l < "$T/rank1.log") lines from a worker pod"
say "tiny-1 SUCCEEDED on loom-worker-0 and loom-worker-1; checkpoints in the shared volume: $(ls "$T/checkpoints/tiny-1" | tr '\n' ' ')"

podman kube down "$T/play.yaml" > /dev/null 2>&1 || fail "podman kube down"
comm -13 "$T/volumes.before" <(podman volume ls -q | sort) | xargs -r podman volume rm > /dev/null
played=0
left=$(podman ps -a --format '{{.Names}}' | grep -E 'loom-(controller|worker)-' || true)
[ -z "$left" ] || fail "containers left behind: $left"
[ -z "$(podman pod ps -q --filter name=loom-)" ] || fail "pods left behind"
grep -q . <<<"$(comm -13 "$T/volumes.before" <(podman volume ls -q | sort))" && fail "volumes left behind"
say "PASS: cpu-dev played, job SUCCEEDED, nothing left behind"

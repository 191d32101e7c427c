#!/usr/bin/env bash
# Every kustomize overlay in deploy/k8s/overlays builds with a current
# kustomize (kubectl 1.32's, installed by scripts/install-deploy-deps.sh),
# every rendered object validates against the Kubernetes OpenAPI schemas
# (deploy/k8s/validate.js), the validator rejects a broken object, and every
# flag the manifests pass to loom-controller / loom-worker is one the real
# binaries accept.
source "$(dirname "$0")/lib.sh"
TOOLS=${LOOM_TOOLS_DIR:-$HOME/.cache/loom/deploy-tools}
KUBECTL="$TOOLS/bin/kubectl"
[ -x "$KUBECTL" ] || fail "$KUBECTL missing: run scripts/install-deploy-deps.sh"
say "$("$KUBECTL" version --client | tr '\n' ' ')"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
k8s="$LOOM_SOURCE_DIR/deploy/k8s"

overlays=()
for dir in "$k8s"/overlays/*/; do overlays+=("$(basename "$dir")"); done
[ "${#overlays[@]}" -ge 3 ] || fail "expected the cpu-dev, gpu and ha overlays, found: ${overlays[*]}"
# The console's Ingress example, as an operator adds it: ha plus the
# console-ingress component (checked below like an overlay of its own).
mkdir -p "$tmp/k/ha-ingress"
rel=$(realpath --relative-to="$tmp/k/ha-ingress" "$k8s")
printf 'resources: [%s/overlays/ha]\ncomponents: [%s/components/console-ingress]\n' "$rel" "$rel" \
  > "$tmp/k/ha-ingress/kustomization.yaml"
# Checkpoints in an object store, as an operator adds them: gpu plus the
# object-store component (its flags are checked with the others below).
mkdir -p "$tmp/k/gpu-object-store"
printf 'resources: [%s/overlays/gpu]\ncomponents: [%s/components/object-store]\n' "$rel" "$rel" \
  > "$tmp/k/gpu-object-store/kustomization.yaml"
for o in "${overlays[@]}" ha-ingress gpu-object-store; do
  dir="$k8s/overlays/$o"
  [ "$o" = ha-ingress ] && dir="$tmp/k/ha-ingress"
  [ "$o" = gpu-object-store ] && dir="$tmp/k/gpu-object-store"
  "$KUBECTL" kustomize "$dir" > "$tmp/$o.yaml" || fail "overlay $o does not build"
  say "overlay $o: $(grep -c '^kind:' "$tmp/$o.yaml") objects; validating"
  node "$k8s/validate.js" "$tmp/$o.yaml" || fail "overlay $o: objects fail validation"
done
# Loom Console: served by every overlay's controller, through the Service,
# reachable past the NetworkPolicy; the Ingress example names the Service's
# console port, checks the controller's certificate, and streams unbuffered.
for o in "${overlays[@]}" ha-ingress; do
  f="$tmp/$o.yaml"
  grep -q -- '--console_port=8443' "$f" || fail "overlay $o: the controller serves no console"
  service=$(sed -n '/^kind: Service$/,/^---/p' "$f")
  grep -q 'name: console' <<<"$service" || fail "overlay $o: no console port on a Service"
  policy=$(sed -n '/^kind: NetworkPolicy$/,/^---/p' "$f")
  grep -q 'port: console' <<<"$policy" || fail "overlay $o: the NetworkPolicy shuts the console out"
done
f="$tmp/ha-ingress.yaml"
[ "$(grep -c '^kind: Ingress$' "$f")" = 1 ] || fail "ha-ingress: no Ingress"
ingress=$(sed -n '/^kind: Ingress$/,/^---/p' "$f")
for want in 'backend-protocol: HTTPS' 'proxy-ssl-verify: "on"' 'proxy-buffering: "off"' \
            'name: loom-controller' 'name: console' 'secretName: loom-console-tls'; do
  grep -qF "$want" <<<"$ingress" || fail "ha-ingress: the Ingress lacks $want"
done
grep -q -- '--console_url=https://loom.example.com' "$f" || fail "ha-ingress: no --console_url"
say "console: served, on the Service, allowed by the policy; the Ingress example is whole"
# The object store: the workers and the controller take its place from the
# ConfigMap and their credentials from the Secret, the workers keep the gpu
# overlay's own flags, and no credential is in the manifests.
f="$tmp/gpu-object-store.yaml"
worker=$(sed -n '/^kind: StatefulSet$/,/^---/p' "$f")
grep -q 'name: loom-object-store$' <<<"$worker" || fail "object-store: workers do not read the ConfigMap"
grep -q 'name: loom-object-store-credentials' <<<"$worker" ||
  fail "object-store: workers do not read the credentials Secret"
grep -q -- '--upload_max_mbps=200' <<<"$worker" || fail "object-store: no upload cap"
grep -q 'nvidia.com/gpu: "8"' "$f" || fail "object-store: the gpu overlay's workers changed"
# The controller lists the store for `checkpoints gc --dry-run`.
grep -q 'name: loom-object-store-credentials' <<<"$(sed -n '/^kind: Deployment$/,/^---/p' "$f")" ||
  fail "object-store: the controller does not read the store's credentials"
grep -qE 'AWS_(ACCESS_KEY_ID|SECRET_ACCESS_KEY):' "$f" && fail "object-store: credentials in the manifests"
say "object-store: workers and controller read the store's ConfigMap and credentials Secret; none in the manifests"
overlays+=(ha-ingress gpu-object-store)

# What the issue requires is there, in every overlay.
for o in "${overlays[@]}"; do
  f="$tmp/$o.yaml"
  for kind in Namespace ServiceAccount ClusterRole ClusterRoleBinding ConfigMap \
              PersistentVolumeClaim Deployment StatefulSet Service PodDisruptionBudget NetworkPolicy; do
    grep -q "^kind: $kind\$" "$f" || fail "overlay $o has no $kind"
  done
  if [ "$o" = ha ] || [ "$o" = ha-ingress ]; then
    # Two controllers over PostgreSQL: rolled one at a time, the
    # Service's traffic to the leader alone, the database a StatefulSet on a
    # claim, its password from the Secret only.
    grep -q 'type: RollingUpdate' "$f" || fail "overlay ha: controllers are not rolled one at a time"
    # (Read whole before grep -q: under pipefail, grep leaving early makes
    # sed's SIGPIPE fail the pipeline.)
    deployment=$(sed -n '/^kind: Deployment$/,/^---/p' "$f")
    grep -q '^  replicas: 2$' <<<"$deployment" || fail "overlay ha: not 2 controller replicas"
    grep -q 'service: loom.leader' "$f" || fail "overlay ha: readiness does not follow the leader"
    grep -q -- '--store=postgresql://loom@loom-postgres:5432/loom' "$f" || fail "overlay ha: no --store"
    grep -q -- '--store_password_file=/etc/loom/db/password' "$f" || fail "overlay ha: no password file"
    grep -q -- '--advertise_address=$(POD_IP):7070' "$f" || fail "overlay ha: no --advertise_address"
    grep -q 'secretName: loom-postgres' "$f" || fail "overlay ha: no loom-postgres Secret"
    grep -q 'name: loom-controller-data' "$f" && fail "overlay ha: the SQLite volume is still there"
    grep -q 'volumeClaimTemplates:' "$f" || fail "overlay ha: PostgreSQL has no volume claim"
    [ "$(grep -c '^kind: PodDisruptionBudget$' "$f")" = 3 ] ||
      fail "overlay ha: expected PodDisruptionBudgets for workers, controllers and the database"
    grep -qE 'password: |PASSWORD=' "$f" && fail "overlay ha: a password in the manifests"
  else
    grep -q 'type: Recreate' "$f" || fail "overlay $o: controller Deployment is not Recreate"
  fi
  grep -q 'clusterIP: None' "$f" || fail "overlay $o: no headless worker Service"
  grep -q 'ReadWriteMany' "$f" || fail "overlay $o: no ReadWriteMany checkpoint volume"
  grep -q 'medium: Memory' "$f" || fail "overlay $o: no memory-backed /dev/shm"
  grep -q 'grpc:' "$f" || fail "overlay $o: no gRPC probes"
  grep -q 'prometheus.io/scrape' "$f" || fail "overlay $o: no scrape annotations"
  # The daemons read the Secret as mounted (fsGroup, 0440): no copying step.
  grep -q 'initContainers:' "$f" && fail "overlay $o: an init container is back"
  grep -q -- '--checkpoint_root=/var/lib/loom/checkpoints' "$f" ||
    fail "overlay $o: the controller does not name the shared checkpoint volume"
  [ "$(grep -c 'mountPath: /var/lib/loom/checkpoints$' "$f")" = 2 ] ||
    fail "overlay $o: controller and workers do not mount checkpoints at /var/lib/loom/checkpoints"
  grep -q -- '--health_listen=0.0.0.0:9103' "$f" || fail "overlay $o: workers serve no health port"
  # The preStop hook writes the notice file: every overlay's workers watch it.
  grep -q -- '--notice_file=/var/lib/loom/work/notice' "$f" ||
    fail "overlay $o: workers watch no notice file (the preStop hook writes it)"
  # Spec data paths are confined to the workers' data volume.
  grep -q -- '--data_root=/data' "$f" || fail "overlay $o: the controller confines no data paths"
  grep -q 'mountPath: /data$' "$f" || fail "overlay $o: workers do not mount the data volume at /data"
  # TLS everywhere, and workers prove their node with certificates: no
  # token for workers, no plaintext.
  grep -q -- '--tls_cert_dir=/etc/loom/worker-tls' "$f" || fail "overlay $o: workers hold no certificates"
  grep -q 'secretName: loom-worker-tls' "$f" || fail "overlay $o: no loom-worker-tls Secret"
  grep -q -- '--tls_client_ca=/etc/loom/tls/ca.pem' "$f" || fail "overlay $o: the controller verifies no client certificates"
  grep -qE -- '--(worker_)?token_file|loom-token|--allow_plaintext' "$f" &&
    fail "overlay $o: a workers' token or plaintext is back: $(grep -nE -- '--(worker_)?token_file|loom-token|--allow_plaintext' "$f")"
done
grep -q 'nvidia.com/gpu: "8"' "$tmp/gpu.yaml" || fail "gpu overlay requests no nvidia.com/gpu"
grep -qE 'image: [^ ]*/loom-worker-cuda:[^ ]+$' "$tmp/gpu.yaml" ||
  fail "gpu overlay workers do not run the worker-cuda image (deploy/docker/worker-cuda.Containerfile)"
grep -q '^kind: ServiceMonitor$' "$tmp/gpu.yaml" || fail "gpu overlay has no ServiceMonitor"
grep -q '^kind: PodMonitor$' "$tmp/gpu.yaml" || fail "gpu overlay has no PodMonitor"
say "required objects present in ${overlays[*]}"

# Least privilege: the only cluster-wide rule reads Nodes.
rules=$(sed -n '/^kind: ClusterRole$/,/^---/p' "$tmp/cpu-dev.yaml" | sed -n '/^rules:/,$p')
grep -q -- '- nodes' <<<"$rules" || fail "ClusterRole does not grant reading nodes"
[ "$(echo "$rules" | grep -c 'resources:')" = 1 ] || fail "ClusterRole grants more than nodes: $rules"
grep -qE 'create|update|patch|delete|\*' <<<"$rules" && fail "ClusterRole grants writes: $rules"

# The validator is not a rubber stamp.
sed '0,/replicas: 2/s//replicas: two/' "$tmp/cpu-dev.yaml" > "$tmp/broken.yaml"
if node "$k8s/validate.js" "$tmp/broken.yaml" > "$tmp/broken.out"; then
  fail "validator accepted replicas: two"
fi
grep -q 'FAIL StatefulSet/loom-worker: schema:.*replicas must be integer' "$tmp/broken.out" ||
  fail "validator did not name the bad field: $(grep FAIL "$tmp/broken.out")"
printf 'apiVersion: example.com/v1\nkind: Gadget\nmetadata: {name: g, namespace: loom}\n' > "$tmp/unknown.yaml"
node "$k8s/validate.js" "$tmp/unknown.yaml" > /dev/null && fail "validator accepted a kind it has no schema for"
say "validator rejects a mistyped field and an unknown kind"

# Every --flag the manifests pass (command lines and flag files) exists.
for bin in controller worker; do
  "$LOOM_BIN_DIR/loom-$bin" --helpfull > "$tmp/$bin.help" 2>&1 || true
done
for o in "${overlays[@]}"; do
  for bin in controller worker; do
    # The container's args and its ConfigMap flag file.
    flags=$(node "$LOOM_SOURCE_DIR/deploy/k8s/validate.js" --print-flags "loom-$bin" "$tmp/$o.yaml")
    [ -n "$flags" ] || fail "overlay $o: found no loom-$bin flags"
    for f in $flags; do
      grep -qE "^ +--$f " "$tmp/$bin.help" || fail "overlay $o passes --$f, which loom-$bin does not know"
    done
    say "overlay $o: loom-$bin flags $(echo $flags | tr ' ' ',') all exist"
  done
done
say "PASS"

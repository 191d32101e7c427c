#!/usr/bin/env bash
# Images run: a container of each CPU image (and of the ha overlay's
# PostgreSQL) starts as the non-root user and answers its health check (both through the gRPC health-checking protocol;
# the worker's says NOT_SERVING until it has registered), the worker
# registers with the controller container and got OpenBLAS, every binary's
# libraries resolve, and nothing is left behind.
source "$(dirname "$0")/lib.sh"
require_images
tmp=$(mktemp -d)
prefix="loom-smoke-$$"
cleanup() {
  # --ignore: without it podman 4.3 stops at a container that was never made
  # and leaves the other running.
  podman rm -f -i -t 2 "$prefix-controller" "$prefix-worker" "$prefix-postgres" > /dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
make_token "$tmp"
make_users "$tmp"
"$LOOM_BIN_DIR/loomctl" ca issue server controller --dir "$tmp/tls" --host 127.0.0.1 > /dev/null
chown -R 10001:10001 "$tmp/tls"
grpc=$(free_port); metrics=$(free_port); chealth=$(free_port); wmetrics=$(free_port)
whealth=$(free_port)

# The worker first, while no controller listens: alive, but not registered.
say "worker container (metrics $wmetrics, health $whealth) before any controller"
podman run -d --name "$prefix-worker" --network=host -e LOOM_HEALTH_PORT="$whealth" \
  -e LOOM_ZONE=zone-s -v "$tmp/token:/etc/loom/token/token:ro" \
  -v "$tmp/tls/ca.pem:/etc/loom/tls/ca.pem:ro" "localhost/loom-worker:$TAG" \
  --tls --tls_ca=/etc/loom/tls/ca.pem \
  --controller="127.0.0.1:$grpc" --node=smoke-node --address=127.0.0.1 --rack=rack-s \
  --metrics_listen="127.0.0.1:$wmetrics" --health_listen="127.0.0.1:$whealth" \
  --work_dir=/var/lib/loom/work --token_file=/etc/loom/token/token > /dev/null
[ "$(podman inspect "$prefix-worker" --format '{{.Config.User}}')" = 10001:10001 ] ||
  fail "worker image does not run as 10001:10001"
grep -q 'loom-probe grpc' <<<"$(podman inspect "$prefix-worker" --format '{{.Config.Healthcheck.Test}}')" ||
  fail "worker image has no gRPC HEALTHCHECK"
# loom-probe exits 1 on NOT_SERVING (and on no answer): tell them apart by
# what it says (not through a pipe: pipefail would take its status).
not_serving() {
  local out
  out=$("$LOOM_BIN_DIR/loom-probe" grpc "127.0.0.1:$whealth" 2>&1) && return 1
  [[ $out == *": NOT_SERVING" ]]
}
wait_for 60 "the unregistered worker's health service to say NOT_SERVING" not_serving
healthy "$prefix-worker" LOOM_HEALTH_PORT="$whealth" > /dev/null 2>&1 &&
  fail "the worker's HEALTHCHECK passes before it registered"
say "unregistered worker: grpc.health.v1 NOT_SERVING, HEALTHCHECK unhealthy"

say "controller container on 127.0.0.1:$grpc (metrics $metrics)"
podman run -d --name "$prefix-controller" --network=host -e LOOM_HEALTH_PORT="$chealth" \
  -v "$tmp/tls:/etc/loom/tls:ro" \
  -v "$tmp/token:/etc/loom/token/token:ro" -v "$tmp/users:/etc/loom/users/users:ro" \
  "localhost/loom-controller:$TAG" \
  --listen="127.0.0.1:$grpc" --metrics_listen="127.0.0.1:$metrics" \
  --data_dir=/var/lib/loom/controller --worker_token_file=/etc/loom/token/token \
  --users_file=/etc/loom/users/users --health_listen="127.0.0.1:$chealth" \
  --tls_cert=/etc/loom/tls/controller.pem --tls_key=/etc/loom/tls/controller.key > /dev/null
[ "$(podman inspect "$prefix-controller" --format '{{.Config.User}}')" = 10001:10001 ] ||
  fail "controller image does not run as 10001:10001"
grep -q 'loom-probe grpc' <<<"$(podman inspect "$prefix-controller" --format '{{.Config.Healthcheck.Test}}')" ||
  fail "controller image has no gRPC HEALTHCHECK"
# podman runs HEALTHCHECKs from systemd timers; without systemd, run it here.
wait_for 30 "the controller's HEALTHCHECK" healthy "$prefix-controller" LOOM_HEALTH_PORT="$chealth"
say "controller HEALTHCHECK passes"
out=$("$LOOM_BIN_DIR/loom-probe" grpc "127.0.0.1:$chealth")
[ "$out" = SERVING ] || fail "grpc.health.v1 from the host: $out"
say "grpc.health.v1.Health/Check from the host: $out"
# (0 or already 1: the waiting worker registers as soon as the controller is up)
http_get "127.0.0.1:$metrics" /metrics | grep '^loom_controller_workers_alive [01]$' > /dev/null ||
  fail "controller /metrics lacks loom_controller_workers_alive"

say "the worker registers with it"
# HEALTHCHECK = registered with the controller.
wait_for 60 "the worker's HEALTHCHECK" healthy "$prefix-worker" LOOM_HEALTH_PORT="$whealth"
say "worker HEALTHCHECK passes"
ctl=("$LOOM_BIN_DIR/loomctl" --tls-ca "$tmp/tls/ca.pem" --controller "127.0.0.1:$grpc" --token-file "$tmp/user-token")
registered() { grep -q smoke-node <<<"$("${ctl[@]}" workers)"; }
wait_for 30 "the worker to register" registered
"${ctl[@]}" workers | tee "$tmp/workers.out"
grep -qE '^smoke-node-[0-9a-f]+ +smoke-node +zone-s +rack-s +yes ' "$tmp/workers.out" ||
  fail "loomctl workers does not show zone-s (from LOOM_ZONE) and rack-s (from --rack)"
http_get "127.0.0.1:$metrics" /metrics | grep '^loom_controller_workers_alive 1' > /dev/null ||
  fail "controller does not count the worker alive"
# grep reads it all (no -q): under pipefail a writer cut off early by
# grep -q fails the pipeline.
podman logs "$prefix-worker" 2>&1 | grep 'BLAS: openblas' > /dev/null ||
  { podman logs "$prefix-worker" >&2; fail "worker image does not resolve libblas.so.3 to OpenBLAS"; }
say "worker: $(podman logs "$prefix-worker" 2>&1 | grep 'BLAS:' | sed -n 1p)"

for c in controller worker; do
  ldds=$(in_image "localhost/loom-$c:$TAG" 'for b in /usr/local/bin/*; do ldd "$b"; done')
  grep -q 'libc.so' <<<"$ldds" || fail "$c image: ldd said nothing: $ldds"
  missing=$(grep 'not found' <<<"$ldds" || true)
  [ -z "$missing" ] || fail "$c image: unresolved libraries: $missing"
  in_image "localhost/loom-$c:$TAG" 'touch /usr/local/bin/x' 2> /dev/null &&
    fail "$c image: the non-root user can write /usr/local/bin"
  labels=$(podman inspect "localhost/loom-$c:$TAG" --format '{{index .Labels "org.opencontainers.image.revision"}}')
  [ -n "$labels" ] || fail "$c image: no org.opencontainers.image.revision label"
done
say "every binary's libraries resolve in both images; binaries are not writable by the user"

# The ha overlay's database: makes its cluster on first start
# with the Secret's password, as uid 10002 on a read-only root, and takes
# that password (and no other) over TCP.
require_image postgres
mkdir -p "$tmp/pg/data" "$tmp/pg/run" "$tmp/pg/secret"
head -c 18 /dev/urandom | base64 > "$tmp/pg/secret/password"
chown -R 10002:10002 "$tmp/pg/data" "$tmp/pg/run"
chgrp 10002 "$tmp/pg/secret/password"
chmod 0440 "$tmp/pg/secret/password"
pgport=$(free_port)
podman run -d --name "$prefix-postgres" --network=host --read-only --tmpfs /tmp \
  -e LOOM_POSTGRES_PASSWORD_FILE=/etc/loom/db/password -e LOOM_POSTGRES_PORT="$pgport" \
  -v "$tmp/pg/data:/var/lib/postgresql/data" -v "$tmp/pg/run:/var/run/postgresql" \
  -v "$tmp/pg/secret:/etc/loom/db:ro" "localhost/loom-postgres:$TAG" > /dev/null
for _ in $(seq 60); do
  podman exec "$prefix-postgres" pg_isready -q -h 127.0.0.1 -p "$pgport" -U loom -d loom && break
  sleep 1
done
podman exec "$prefix-postgres" pg_isready -q -h 127.0.0.1 -p "$pgport" -U loom -d loom ||
  fail "postgres image: not ready in 60 s: $(podman logs "$prefix-postgres" 2>&1 | tail -5)"
[ "$(podman exec "$prefix-postgres" id -u)" = 10002 ] || fail "postgres image: not uid 10002"
who=$(PGPASSWORD=$(cat "$tmp/pg/secret/password") psql -Atc 'select current_user' \
  "postgresql://loom@127.0.0.1:$pgport/loom")
[ "$who" = loom ] || fail "postgres image: the Secret's password does not log in"
PGPASSWORD=wrong psql -Atc 'select 1' "postgresql://loom@127.0.0.1:$pgport/loom" 2> /dev/null &&
  fail "postgres image: a wrong password logs in"
say "postgres image: ready on $pgport as uid 10002, the Secret's password (only) logs in"

podman stop -t 5 "$prefix-worker" "$prefix-controller" "$prefix-postgres" > /dev/null
podman rm "$prefix-worker" "$prefix-controller" "$prefix-postgres" > /dev/null
left=$(podman ps -a --filter "name=$prefix" --format '{{.Names}}')
[ -z "$left" ] || fail "containers left behind: $left"
say "PASS: the three images start, answer their health checks, and leave nothing behind"

#!/usr/bin/env bash
# Real Prometheus: Debian's prometheus on loopback, configured by
# dashboards/prometheus/local-prometheus-config.sh (scrape jobs and rule files
# from this repository), scrapes a local cluster (`loomctl local up`) through
# a short job whose data is poisoned so its loss spikes once and the
# controller rolls it back automatically; then every PromQL expression of the
# Grafana dashboard and every recording rule is evaluated through the HTTP
# API and must return data (tests/deploy/prometheus_check.js), and the
# rollback must show in loom_controller_job_rollbacks_total.
source "$(dirname "$0")/lib.sh"
command -v prometheus > /dev/null || fail "prometheus missing: run scripts/install-deps.sh"
T=$(mktemp -d /tmp/loom_prometheus_test.XXXXXX)
H="$T/home"
ctl=("$LOOM_BIN_DIR/loomctl" --home "$H")
prom_pid=
cleanup() {
  [ -n "$prom_pid" ] && kill "$prom_pid" 2> /dev/null && wait "$prom_pid" 2> /dev/null
  "${ctl[@]}" local down > /dev/null 2>&1 || true
  rm -rf "$T"
}
trap cleanup EXIT

say "loomctl local up --workers 2"
"${ctl[@]}" local up --workers 2 > /dev/null
"${ctl[@]}" data prepare --input /usr/share/games/fortunes/fortunes /usr/share/games/fortunes/literature \
  /usr/share/games/fortunes/riddles --out "$H/data" --val-fraction 0.1 > /dev/null
# Batches 60..63 of the job below are random bytes: step 61 spikes.
"$LOOM_BIN_DIR/loom_poison_shard" "$H/data/train_000000.bin" 32 16 7 60 64

# The repository's rules, evaluated every 2 s instead of every 30 s so a
# 1-minute job produces recorded series.
mkdir -p "$T/rules"
for f in "$LOOM_SOURCE_DIR"/dashboards/prometheus/loom-*.yml; do
  case "$f" in *-test.yml) continue ;; esac
  sed -E 's/^( +interval:) .*/\1 2s/' "$f" > "$T/rules/$(basename "$f")"
done
port=$(free_port)
SCRAPE_INTERVAL=1s RULE_FILES="$(ls "$T"/rules/*.yml | tr '\n' ' ')" \
  "$LOOM_SOURCE_DIR/dashboards/prometheus/local-prometheus-config.sh" "$H" > "$T/prometheus.yml"
promtool check config "$T/prometheus.yml" > /dev/null || fail "promtool check config"
say "prometheus $(prometheus --version 2>&1 | sed -n 1p | cut -d' ' -f3) on 127.0.0.1:$port"
prometheus --config.file="$T/prometheus.yml" --storage.tsdb.path="$T/tsdb" \
  --web.listen-address="127.0.0.1:$port" --log.level=warn > "$T/prometheus.log" 2>&1 &
prom_pid=$!
ready() { grep -q Ready <<<"$(http_get "127.0.0.1:$port" /-/ready)"; }
wait_for 30 "Prometheus to be ready" ready
# The counters must be scraped at 0 before the job moves them.
scraped_all() {
  grep -q '"value":\[[0-9.]*,"3"\]' <<<"$(http_get "127.0.0.1:$port" "/api/v1/query?query=count(up%3D%3D1)")"
}
wait_for 30 "Prometheus to scrape the controller and both workers" scraped_all

# keep: 10 keeps every checkpoint of the 100 steps. With keep: 2 the ranks
# keep the rollback target only while they are within twice the rollback
# distance (40 steps) of it, and this toy job trains ~230 steps/s on a
# fast, idle machine: a fresh-Debian run's ranks got past step 90 before
# the stop reached them, pruned step 40, and the rollback found nothing to
# resume from.
cat > "$T/spiky.yaml" << YAML
name: spiky
model:
  gpt: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 32, vocab_size: 256}
data:
  train: ["$H/data/train_*.bin"]
  validation: ["$H/data/val_*.bin"]
optimizer:
  adamw: {lr: 0.003, weight_decay: 0.1, grad_clip: 1.0}
schedule: {total_steps: 100, warmup_steps: 5, eval_interval: 50, eval_batches: 4}
batch: {global_batch: 16, micro_batch: 8}
resources: {workers: 2, ranks: 2}
checkpoint: {interval_steps: 10, keep: 10}
seed: 7
recovery: {window: 32, min_history: 16, rollback_distance: 20, skip_before: 10, skip_after: 10,
           max_rollbacks: 2, max_restarts: 0}
YAML
say "submitting spiky (100 steps, poisoned batches 60-63)"
timeout 300 "${ctl[@]}" submit --follow "$T/spiky.yaml" > "$T/submit.out" 2>&1 ||
  { cat "$T/submit.out"; fail "spiky did not succeed"; }
grep -q ROLLBACK "$T/submit.out" || { cat "$T/submit.out"; fail "no automatic rollback"; }
say "spiky SUCCEEDED after an automatic rollback: $(grep -m1 ROLLBACK "$T/submit.out" | tr -s ' ')"
# Two more evaluation rounds and scrapes after the end.
sleep 5

rollbacks() {
  http_get "127.0.0.1:$port" "/api/v1/query?query=increase(loom_controller_job_rollbacks_total%5B10m%5D)" |
    grep -qE '"value":\[[0-9.]+,"[1-9]'
}
poll 15 rollbacks ||
  { http_get "127.0.0.1:$port" "/api/v1/query?query=loom_controller_job_rollbacks_total"; fail "no rollback in Prometheus"; }
say "Prometheus: increase(loom_controller_job_rollbacks_total[10m]) >= 1"
node "$(dirname "$0")/prometheus_check.js" "http://127.0.0.1:$port" \
  "$LOOM_SOURCE_DIR/dashboards/grafana/loom-training.json" "$T"/rules/*.yml ||
  { tail -5 "$T/prometheus.log"; fail "dashboard or rule queries without data"; }
say "PASS"

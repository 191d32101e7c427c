#!/usr/bin/env bash
# Runs Loom's benchmarks by name:
#   ./bench/run.sh NAME [NAME...]     e.g. ./bench/run.sh planner
#   ./bench/run.sh                    runs them all
#   ./bench/run.sh list               lists the names
# Each benchmark builds what it needs with scripts/build.sh (BUILD_DIR and
# JOBS are passed through), compares against a baseline measured in the same
# run, and prints one summary line per figure; its last line has the form
#   NAME: <figure> ratio=<x>
# To add a benchmark, add its target to bench/bench.cmake and a bench_NAME
# function below.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
export BUILD_DIR

# Builds ninja targets quietly; shows the build log only when it fails.
build() {
  local log
  if ! log=$(./scripts/build.sh "$@" 2>&1); then
    echo "$log" >&2
    exit 1
  fi
}

# Planning time for a 1008B model on 3072 GPUs (issue 3).
bench_planner() {
  build loom_planner_bench
  "$BUILD_DIR/bin/loom_planner_bench" "${PLANNER_REPETITIONS:-30}"
}

# Fused AdamW bandwidth on 100M fp32 parameters, 2 threads, against a stream
# kernel with the same access pattern and torch::optim::AdamW (issue 6).
bench_adamw() {
  build loom_adamw_bench
  "$BUILD_DIR/bin/loom_adamw_bench" "${ADAMW_PARAMS:-100000000}" "${ADAMW_THREADS:-2}" \
    "${ADAMW_ROUNDS:-5}"
}

# Time from spike detection to the first resumed step, on a real local
# cluster with poisoned data (issue 4).
bench_recovery() {
  build loom_recovery_bench
  "$BUILD_DIR/bin/loom_recovery_bench" "$BUILD_DIR/bin"
}

# Checkpoint write throughput against the disk's own write+fsync, and the
# stall per asynchronous checkpoint as a fraction of a step, for a
# ~124M-parameter GPT (issue 4). Checkpoints go to CHECKPOINT_BENCH_DIR
# (default: the build directory), so choose the disk to measure.
bench_checkpoint() {
  build loom_checkpoint_bench
  local dir=${CHECKPOINT_BENCH_DIR:-$BUILD_DIR}
  mkdir -p "$dir"
  "$BUILD_DIR/bin/loom_checkpoint_bench" "$dir" "${CHECKPOINT_LAYERS:-12}" \
    "${CHECKPOINT_D_MODEL:-768}" "${CHECKPOINT_STEPS:-10}" "${CHECKPOINT_INTERVAL:-3}" \
    "${CHECKPOINT_THREADS:-2}"
}

benchmarks() {
  compgen -A function | sed -n 's/^bench_//p'
}

if [ $# -eq 1 ] && { [ "$1" = "-h" ] || [ "$1" = "--help" ] || [ "$1" = "list" ]; }; then
  echo "usage: $0 [NAME...]  (no NAME runs them all); benchmarks:" >&2
  benchmarks | sed 's/^/  /' >&2
  exit 0
fi
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  mapfile -t names < <(benchmarks)
fi
for name in "${names[@]}"; do
  if ! declare -F "bench_$name" >/dev/null; then
    echo "unknown benchmark \"$name\"; known: $(benchmarks | tr '\n' ' ')" >&2
    exit 2
  fi
  "bench_$name"
done

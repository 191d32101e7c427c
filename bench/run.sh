#!/usr/bin/env bash
# Runs Loom's benchmarks by name:
#   ./bench/run.sh NAME [NAME...]     e.g. ./bench/run.sh planner
#   ./bench/run.sh                    runs them all, except gpu
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

# Planning time for a 1008B model on 3072 GPUs.
bench_planner() {
  build loom_planner_bench
  "$BUILD_DIR/bin/loom_planner_bench" "${PLANNER_REPETITIONS:-30}"
}

# Plan time of every published run in controller/planner/testdata/
# published_runs.yaml, as `loomctl plan` plans it, against the same plans
# unpruned; fails when a plan takes 1 s or more.
bench_published_plans() {
  build loom_published_plans_bench
  "$BUILD_DIR/bin/loom_published_plans_bench" controller/planner/testdata/published_runs.yaml \
    "${PUBLISHED_PLANS_REPETITIONS:-3}"
}

# The scheduling policy (controller/scheduling/) driven through ClusterSim on
# a fake clock over a synthetic trace of SCHEDULER_JOBS jobs (default 15000,
# seed SCHEDULER_SEED) on 1,000 workers: time to admission per gang size,
# utilisation while demand exceeds capacity, goodput, preemptions and steps
# lost, decisions/s; fails when a figure crosses bench/scheduler_thresholds.txt.
bench_scheduler() {
  build loom_scheduler_bench
  "$BUILD_DIR/bin/loom_scheduler_bench" bench/scheduler_thresholds.txt "${SCHEDULER_JOBS:-15000}" \
    "${SCHEDULER_SEED:-30}"
}

# Fused AdamW bandwidth on 100M fp32 parameters, 2 threads, against a stream
# kernel with the same access pattern and torch::optim::AdamW.
bench_adamw() {
  build loom_adamw_bench
  "$BUILD_DIR/bin/loom_adamw_bench" "${ADAMW_PARAMS:-100000000}" "${ADAMW_THREADS:-2}" \
    "${ADAMW_ROUNDS:-5}"
}

# Time from spike detection to the first resumed step, on a real local
# cluster with poisoned data.
bench_recovery() {
  build loom_recovery_bench
  "$BUILD_DIR/bin/loom_recovery_bench" "$BUILD_DIR/bin"
}

# Fault trials on a real local cluster, each daemon in its own network
# namespace (CHAOS_TRIALS, default 41; CHAOS_SEED): kill -9 of workers,
# ranks and the controller, a partition, a full checkpoint volume, trials
# preempted three times by a higher-priority job, and elastic trials (grow,
# lose a worker and shrink, grow back). Every fixed-layout job must end
# bit-exact with an uninterrupted run; every elastic one must train each
# data batch once (bench/chaos_bench.cc says what else is checked). Root:
# network namespaces, iptables, a tmpfs mount. CHAOS_FIRST_TRIALS=N replays
# only the first N trials of the mix, with the full run's random draws (a
# failing trial again, by its number).
bench_chaos() {
  build loom_chaos_bench
  "$BUILD_DIR/bin/loom_chaos_bench" "$BUILD_DIR/bin" "${CHAOS_TRIALS:-41}" "${CHAOS_SEED:-1}"
}

# Active/standby controllers over PostgreSQL (docs/ha.md): FAILOVER_CYCLES
# faults (12) of the leader, kill -9, SIGSTOP past the lease and a partition
# from the database in turn, under a client submitting and cancelling jobs;
# the checker's counts (gangs scheduled twice, acknowledged writes lost,
# epochs backwards) and the p50/p99 failover. Root: network namespaces and
# iptables. FAILOVER_LEASE_S sets the lease (2).
bench_failover() {
  build loom_failover_bench
  "$BUILD_DIR/bin/loom_failover_bench" "$BUILD_DIR/bin" "${FAILOVER_CYCLES:-12}" \
    "${FAILOVER_LEASE_S:-2}"
}

# One elastic job on 4 local workers through a fault every 30-50 s: a worker
# kill -9 and its return, part of it preempted, a slow rank (a CPU-quota
# cgroup), a controller kill; recovery time and steps lost per fault, ETTR,
# loss against an uninterrupted run. Root: network namespaces and the
# cgroup. ELASTIC_STEPS sets the
# run's length (3000), ELASTIC_CLEAN_SECONDS adds a clean run that long in
# which no rank may be named slow.
bench_elastic() {
  build loom_elastic_bench
  "$BUILD_DIR/bin/loom_elastic_bench" "$BUILD_DIR/bin" "${ELASTIC_STEPS:-3000}" \
    "${ELASTIC_CLEAN_SECONDS:-0}"
}

# The controller under a large cluster's load: CONTROL_PLANE_WORKERS
# simulated workers (default 10000) heartbeating at 1 Hz, CONTROL_PLANE_JOBS
# one-rank jobs (100) reporting steps at 10 Hz and CONTROL_PLANE_WATCHERS job
# watchers (20), over real gRPC from one process against a real
# loom-controller; p50/p99 of heartbeats and step reports over
# CONTROL_PLANE_SECONDS (30) after CONTROL_PLANE_WARMUP (5) seconds, and the
# controller's CPU. The controller's store goes under TMPDIR (default /tmp):
# its fsyncs are part of every step report, so choose the disk to measure.
# CONTROL_PLANE_CPUS=1.1 (root) runs the controller and the client together
# under a CPU quota of that many cores (a cgroup made for the run and
# removed after it): how the tail grows when the machine gives them less
# than its cores, as a busy host or a throttled VM does, reproducibly.
# It runs once on each store, SQLite (the default) and PostgreSQL (a server
# of its own, fsync on: what the controllers of --ha share), and
# ends with both p99s side by side; CONTROL_PLANE_STORES=sqlite (or
# postgres) runs one.
bench_control-plane() {
  build loom_control_plane_bench
  local cmd=("$BUILD_DIR/bin/loom_control_plane_bench" "$BUILD_DIR/bin"
             "${CONTROL_PLANE_WORKERS:-10000}" "${CONTROL_PLANE_SECONDS:-30}"
             "${CONTROL_PLANE_JOBS:-100}" "${CONTROL_PLANE_WATCHERS:-20}"
             "${CONTROL_PLANE_WARMUP:-5}")
  local out store lines=()
  out=$(mktemp)
  for store in ${CONTROL_PLANE_STORES:-sqlite postgres}; do
    echo "== control-plane on $store"
    if [ -n "${CONTROL_PLANE_CPUS:-}" ]; then
      CONTROL_PLANE_STORE=$store run_under_cpu_quota "$CONTROL_PLANE_CPUS" "${cmd[@]}" | tee "$out"
    else
      CONTROL_PLANE_STORE=$store "${cmd[@]}" | tee "$out"
    fi
    lines+=("$(grep '^control-plane: ' "$out" | tail -1)")
  done
  rm -f "$out"
  # control-plane: N workers, p99 X ms on sqlite, Y ms on postgres ratio=<worse/50>
  printf '%s\n' "${lines[@]}" | awk '
    { for (i = 1; i <= NF; i++) if ($i == "p99") { p = $(i + 1); s = $(i + 4) }
      n = $2; figs = figs (figs == "" ? "" : ", ") p " ms on " s; if (p > worst) worst = p }
    END { if (figs != "") printf "control-plane: %s workers, p99 %s ratio=%.3f\n", n, figs, worst / 50 }'
}

# run_under_cpu_quota CORES COMMAND...: COMMAND and its children in a new
# cgroup allowed CORES cores' worth of CPU time per 100 ms period (cgroup v2
# cpu.max, or v1 cpu.cfs_quota_us); prints how often the quota throttled
# them, and removes the cgroup. Needs root.
run_under_cpu_quota() {
  local cores=$1
  shift
  local quota
  if ! quota=$(awk -v c="$cores" 'BEGIN { if (c !~ /^[0-9]*\.?[0-9]+$/ || c + 0 < 0.01) exit 1
                                          printf "%d", c * 100000 }'); then
    echo "CONTROL_PLANE_CPUS: a number of cores (e.g. 1.1), not \"$cores\"" >&2
    exit 2
  fi
  local dir
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # cgroup v2
    dir=/sys/fs/cgroup/loom-bench-$$
    grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control ||
      echo +cpu > /sys/fs/cgroup/cgroup.subtree_control
    mkdir "$dir"
    echo "$quota 100000" > "$dir/cpu.max"
  elif [ -d /sys/fs/cgroup/cpu ]; then  # cgroup v1
    dir=/sys/fs/cgroup/cpu/loom-bench-$$
    mkdir "$dir"
    echo 100000 > "$dir/cpu.cfs_period_us"
    echo "$quota" > "$dir/cpu.cfs_quota_us"
  else
    echo "CONTROL_PLANE_CPUS: no cgroup cpu controller under /sys/fs/cgroup" >&2
    exit 2
  fi
  echo "cpu quota: the controller and the client together get $cores core(s)" \
       "($((quota / 1000)) ms per 100 ms period, cgroup $dir)"
  # The throttling is printed just before the command's last line, which
  # stays the summary.
  local statuses
  set +e
  (echo "$BASHPID" > "$dir/cgroup.procs" && exec "$@") 2>&1 |
    awk -v stat="$dir/cpu.stat" '
      NR > 1 { print last; fflush() }
      { last = $0 }
      END {
        while ((getline line < stat) > 0) {
          split(line, f, " ")
          if (f[1] == "nr_periods") p = f[2]
          if (f[1] == "nr_throttled") t = f[2]
        }
        printf "cpu quota: throttled in %d of %d periods\n", t, p
        if (NR > 0) print last
      }'
  statuses=("${PIPESTATUS[@]}")
  set -e
  rmdir "$dir" 2>/dev/null || echo "cpu quota: could not remove $dir (still in use)" >&2
  return "${statuses[0]}"
}

# Checkpoint write throughput against the disk's own write+fsync, and the
# stall per asynchronous checkpoint as a fraction of a step, for a
# ~124M-parameter GPT. Checkpoints go to CHECKPOINT_BENCH_DIR
# (default: the build directory), so choose the disk to measure.
# In-memory snapshots on the CPU benchmark GPT: step time with them off,
# every 10th step and every step, and a restart from memory against one
# from a checkpoint file of the same step.
bench_snapshot() {
  build loom_snapshot_bench
  "$BUILD_DIR/bin/loom_snapshot_bench" "$BUILD_DIR" "${SNAPSHOT_STEPS:-30}" \
    "${SNAPSHOT_THREADS:-1}"
}

bench_checkpoint() {
  build loom_checkpoint_bench
  local dir=${CHECKPOINT_BENCH_DIR:-$BUILD_DIR}
  mkdir -p "$dir"
  "$BUILD_DIR/bin/loom_checkpoint_bench" "$dir" "${CHECKPOINT_LAYERS:-12}" \
    "${CHECKPOINT_D_MODEL:-768}" "${CHECKPOINT_STEPS:-8}" "${CHECKPOINT_INTERVAL:-2}" \
    "${CHECKPOINT_THREADS:-2}"
}

# The object-store tier against a RADOS Gateway on loopback (its daemons at
# nice 19, REMOTE_TIER_STORE_NICE, standing in for a store elsewhere):
# Loom's upload and restore of a checkpoint against `aws s3 cp --recursive`
# of the same bytes (Debian's awscli: scripts/install-deploy-deps.sh), and
# training's step time while uploading against without.
bench_checkpoint-remote() {
  build loom_remote_tier_bench
  local dir=${REMOTE_TIER_BENCH_DIR:-$BUILD_DIR}
  mkdir -p "$dir"
  # Training uploads 4 checkpoints and the comparison 6 more copies of one
  # (~5.4 GB), beyond the test store's default 4 GiB OSD file.
  OSD_GIB=${REMOTE_TIER_OSD_GIB:-16} "$BUILD_DIR/bin/loom_remote_tier_bench" "$dir" "${REMOTE_TIER_LAYERS:-6}" \
    "${REMOTE_TIER_D_MODEL:-512}" "${REMOTE_TIER_STEPS:-12}" "${REMOTE_TIER_INTERVAL:-3}" \
    "${REMOTE_TIER_THREADS:-2}"
}

# The BLAS kernels the worker selects in production (worker_main.cc):
# Debian's OpenBLAS 0.3.21 does not know recent AVX-512 CPUs and falls back
# to generic SSE3 kernels. An operator's own OPENBLAS_CORETYPE wins.
select_blas_kernels() {
  if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx512f /proc/cpuinfo &&
     grep -qw avx512bw /proc/cpuinfo && grep -qw avx512dq /proc/cpuinfo &&
     grep -qw avx512vl /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=SkylakeX
  fi
}

# Value of key=value field $3 on the line of output $2 that starts with $1.
field() { grep "^$1 " <<<"$2" | tr ' ' '\n' | sed -n "s/^$3=//p"; }

# Training tokens/s of loom::engine::Train against PyTorch eager (Debian's
# python3-torch 1.13) on the same GPT, optimizer, batch and threads, both as
# a fraction of the sgemm rate measured in the same run. The GPT: 4 layers,
# 4 heads, d_model 256, seq 256, vocab 50304, batch 8 sequences, AdamW
# (lr 3e-4 constant, betas 0.9/0.95, weight decay 0.1), clipping at 1.0
# (bench/cpu_gpt_config.h). The sgemm
# reference is the best 2048^3 fp32 matmul rate either side measured (each
# measures before its first step, after its last, and once after every step).
# TRAIN_PROFILE=0 skips the per-stage and per-operator profiles.
bench_train() {
  ./scripts/install-bench-deps.sh >/dev/null
  # Both sides on the same kernels (select_blas_kernels), like for like.
  select_blas_kernels
  build loom_train_bench
  local steps=${TRAIN_STEPS:-23} warmup=${TRAIN_WARMUP:-3} threads=${TRAIN_THREADS:-2}
  local loom_profile=0 torch_profile=0
  if [ "${TRAIN_PROFILE:-1}" != 0 ]; then loom_profile=2 torch_profile=2; fi
  # The two sides run at the same time in lockstep, taking turns step by
  # step through two FIFOs (see Turns in bench/train_bench.cc), so that load
  # from other processes on the cores falls on both alike.
  # If either side fails, the other gives up after waiting 10 minutes for
  # its turn; the trap ends the Loom side at once when this script exits
  # early (a failure, or an interrupt).
  local loom torch
  TRAIN_TURNS=$(mktemp -d)
  TRAIN_LOOM_PID=""
  trap 'if [ -n "$TRAIN_LOOM_PID" ]; then kill "$TRAIN_LOOM_PID" 2>/dev/null || true; fi
        rm -rf "$TRAIN_TURNS"' EXIT
  mkfifo "$TRAIN_TURNS/to_loom" "$TRAIN_TURNS/to_pytorch"
  "$BUILD_DIR/bin/loom_train_bench" "$steps" "$warmup" "$threads" "$loom_profile" \
    "$TRAIN_TURNS/to_loom" "$TRAIN_TURNS/to_pytorch" >"$TRAIN_TURNS/loom.out" &
  TRAIN_LOOM_PID=$!
  # Process policy: the Loom side runs as loom-rank does, keeping freed host
  # memory for the next step (worker/engine/host_allocator.h: no mmap per
  # large block, no trimming) and with OpenMP threads that spin only briefly
  # before they sleep (worker/engine/openmp_wait.h); PyTorch eager runs as
  # shipped, on glibc's and OpenMP's defaults. TRAIN_LIKE_FOR_LIKE=1 gives the
  # PyTorch side both policies through its environment (GLIBC_TUNABLES,
  # GOMP_SPINCOUNT);
  # TRAIN_PYTORCH_ALLOCATOR=retain gives it the allocator policy alone.
  # TRAIN_DEFAULT_ALLOCATOR=1 leaves both sides on glibc's default, and an
  # OMP_WAIT_POLICY or GOMP_SPINCOUNT in the environment applies to both.
  local torch_env=()
  if [ "${TRAIN_DEFAULT_ALLOCATOR:-0}" != 1 ] &&
     { [ "${TRAIN_PYTORCH_ALLOCATOR:-default}" = retain ] || [ "${TRAIN_LIKE_FOR_LIKE:-0}" = 1 ]; }; then
    torch_env+=(GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647)
    echo "host allocator: pytorch side also keeps freed memory (${torch_env[0]})"
  else
    echo "host allocator: pytorch side on glibc's default (TRAIN_LIKE_FOR_LIKE=1 to change)"
  fi
  if [ -n "${OMP_WAIT_POLICY+x}${GOMP_SPINCOUNT+x}" ]; then
    echo "openmp wait: both sides as the environment says" \
      "(OMP_WAIT_POLICY=${OMP_WAIT_POLICY-} GOMP_SPINCOUNT=${GOMP_SPINCOUNT-})"
  elif [ "${TRAIN_LIKE_FOR_LIKE:-0}" = 1 ]; then
    # kTrainingSpinCount in worker/engine/openmp_wait.h
    torch_env+=(GOMP_SPINCOUNT=30000)
    echo "openmp wait: pytorch side also spins briefly (GOMP_SPINCOUNT=30000)"
  else
    echo "openmp wait: pytorch side on OpenMP's default, spinning (TRAIN_LIKE_FOR_LIKE=1 to change)"
  fi
  # Debian's interpreter explicitly: the first python3 on PATH may be another
  # one, without torch.
  if ! torch=$(env "${torch_env[@]}" /usr/bin/python3 bench/train_pytorch.py --steps "$steps" --warmup "$warmup" \
      --threads "$threads" --profile-steps "$torch_profile" \
      --turn-in "$TRAIN_TURNS/to_pytorch" --turn-out "$TRAIN_TURNS/to_loom"); then
    echo "train: the PyTorch side failed" >&2
    exit 1
  fi
  if ! wait "$TRAIN_LOOM_PID"; then
    TRAIN_LOOM_PID=""
    echo "train: the Loom side failed" >&2
    exit 1
  fi
  TRAIN_LOOM_PID=""
  loom=$(cat "$TRAIN_TURNS/loom.out")
  rm -rf "$TRAIN_TURNS"
  trap - EXIT
  grep -v '^LOOM_TRAIN ' <<<"$loom"
  grep -v '^PYTORCH_TRAIN ' <<<"$torch"
  # OpenBLAS 0.3.21 (Debian 12) falls back to generic SSE3 kernels on CPU
  # models it does not know, which halves or worse every matmul on both sides.
  if grep -q 'BLAS: OpenBLAS Prescott' <<<"$loom" && grep -qw avx2 /proc/cpuinfo; then
    echo "note: OpenBLAS runs its generic Prescott kernels on this CPU; OPENBLAS_CORETYPE=SkylakeX" \
      "(avx512f) or Haswell (avx2) selects vector kernels, for both sides"
  fi
  local loom_tps torch_tps flops_per_token loom_sgemm torch_sgemm loom_min torch_min tokens_per_step
  loom_tps=$(field LOOM_TRAIN "$loom" tokens_per_second)
  loom_min=$(field LOOM_TRAIN "$loom" min_step_seconds)
  tokens_per_step=$(field LOOM_TRAIN "$loom" tokens_per_step)
  torch_min=$(field PYTORCH_TRAIN "$torch" min_step_seconds)
  flops_per_token=$(field LOOM_TRAIN "$loom" flops_per_token)
  loom_sgemm=$(field LOOM_TRAIN "$loom" sgemm_flops_per_second)
  torch_tps=$(field PYTORCH_TRAIN "$torch" tokens_per_second)
  torch_sgemm=$(field PYTORCH_TRAIN "$torch" sgemm_flops_per_second)
  awk -v l="$loom_tps" -v t="$torch_tps" -v f="$flops_per_token" -v ls="$loom_sgemm" \
    -v ts="$torch_sgemm" -v lm="$loom_min" -v tm="$torch_min" \
    -v n="$tokens_per_step" 'BEGIN {
      s = ls > ts ? ls : ts
      printf "sgemm reference: %.1f GFLOP/s (best of loom %.1f, pytorch %.1f)\n", s / 1e9, ls / 1e9, ts / 1e9
      printf "loom:    %.1f tok/s (median step) = %.1f GFLOP/s at %.1f MFLOP/token\n", l, l * f / 1e9, f / 1e6
      printf "pytorch: %.1f tok/s (median step) = %.1f GFLOP/s at %.1f MFLOP/token\n", t, t * f / 1e9, f / 1e6
      printf "fastest step (least disturbed by other load): loom %.1f tok/s, pytorch %.1f tok/s, ratio=%.2f\n",
        n / lm, n / tm, tm / lm
      printf "train: %.1f tok/s ratio=%.2f vs PyTorch eager, loom %.1f%% / pytorch %.1f%% of sgemm\n",
        l, l / t, 100 * l * f / s, 100 * t * f / s
    }'
}

# Causal self-attention forward + backward: Loom's blocked CPU kernel against
# the unfused LibTorch expression, one attention layer of the train
# benchmark's GPT (batch 8, seq 256, d 256, 4 heads, 2 threads), alternating
# in one process.
bench_attention() {
  build loom_attention_bench
  select_blas_kernels
  "$BUILD_DIR/bin/loom_attention_bench" "${ATTENTION_ROUNDS:-30}" "${ATTENTION_THREADS:-2}"
}

# A Llama-family training step (RMSNorm, SwiGLU, rotary positions, 4 of 8
# K/V heads, untied) against a GPT-2 of the same width and depth on the CPU:
# time per model FLOP relative to GPT-2's, and the step's shares of the
# unfused rotary + K/V expansion, RMSNorm and SwiGLU.
bench_llama() {
  build loom_llama_bench
  select_blas_kernels
  "$BUILD_DIR/bin/loom_llama_bench" "${LLAMA_ROUNDS:-10}" "${LLAMA_THREADS:-2}"
}

# Training tokens/s and peak memory of fp32, bf16 and bf16 + activation
# checkpointing on a GPT with d_model 512, 8 layers, 8 heads, seq 256, vocab
# 50304, batch 4, 2 threads, each configuration in its own child process
# (peak memory: live LibTorch tensor bytes and the child's peak RSS).
# PRECISION_STEPS timed steps after PRECISION_WARMUP (median step time).
bench_precision() {
  build loom_precision_bench
  select_blas_kernels
  "$BUILD_DIR/bin/loom_precision_bench" "${PRECISION_STEPS:-6}" "${PRECISION_WARMUP:-2}" \
    "${PRECISION_THREADS:-2}" "${PRECISION_D_MODEL:-512}" "${PRECISION_LAYERS:-8}" \
    "${PRECISION_VOCAB:-50304}" "${PRECISION_BATCH:-4}"
}

# Share of the training step spent waiting for data, with the prefetching
# loader and (same run) without it, on the train benchmark's GPT (4 layers,
# 4 heads, d_model 256, seq 256, vocab 50304, batch 8 sequences, 2 threads;
# bench/cpu_gpt_config.h) over a shard of random tokens; the target is
# under 2 % with prefetching.
bench_loader() {
  build loom_loader_bench
  select_blas_kernels
  local out wait sync
  out=$("$BUILD_DIR/bin/loom_loader_bench" "${LOADER_STEPS:-10}" "${LOADER_WARMUP:-2}" \
    "${LOADER_THREADS:-2}")
  grep -v '^LOOM_LOADER ' <<<"$out"
  wait=$(field LOOM_LOADER "$out" prefetch_wait_fraction)
  sync=$(field LOOM_LOADER "$out" sync_wait_fraction)
  awk -v w="$wait" -v s="$sync" 'BEGIN {
    printf "loader: %.4f%% of step time waiting for data (without prefetching %.4f%%) ratio=%.6f\n",
      100 * w, 100 * s, w
  }'
}

# ZeRO's exchange on Gloo: LibTorch 1.13's Gloo has no
# reduce_scatter, so Loom builds a ring from send/recv; its cost with the
# all-gather of the updated shards, against data parallelism's all-reduce of
# the same buffer (100 MB of fp32 gradients, 2 ranks over loopback).
bench_zero() {
  build loom_zero_bench
  "$BUILD_DIR/bin/loom_zero_bench" "${ZERO_ELEMENTS:-25000000}" "${ZERO_RANKS:-2}" \
    "${ZERO_ROUNDS:-5}"
}

# The planner's step time against the measured one on the local cluster,
# for one rank alone (the compute model's baseline), DP2, TP2, PP2 (m = 8),
# TP2 x PP2, ZeRO-1 DP2 and ZeRO-2 DP2.
bench_plan-accuracy() {
  build loom_plan_accuracy_bench
  "$BUILD_DIR/bin/loom_plan_accuracy_bench" "$BUILD_DIR/bin" "${PLAN_ACCURACY_STEPS:-14}"
}

# Data-parallel gradient averaging overlapped with backward against the same
# buckets all-reduced after backward, 2 in-process Gloo ranks.
bench_overlap() {
  build loom_overlap_bench
  OMP_NUM_THREADS=1 "$BUILD_DIR/bin/loom_overlap_bench" "${OVERLAP_LAYERS:-8}" \
    "${OVERLAP_D_MODEL:-512}" "${OVERLAP_STEPS:-8}"
}

# The largest GPT that trains under a per-rank memory limit (default 2 GiB)
# on 4 local ranks: pure data parallelism against the planner's layout,
# measured peak RSS of every rank checked against the limit.
bench_parallel() {
  build loom_parallel_bench
  "$BUILD_DIR/bin/loom_parallel_bench" "$BUILD_DIR/bin" "${PARALLEL_LIMIT_GIB:-2}" \
    "${PARALLEL_STEPS:-3}"
}

# `loomctl logs JOB --grep TEXT` over LOGS_LINES (default 10,000,000) log
# lines of one job (16 ranks x 2 attempts) in the controller's store, on
# SQLite and on PostgreSQL: ingest rate, and the median search time for a
# rare, a unique and a common string against a full scan of the same
# bytes; fails when a rare-string search takes 500 ms or more.
# Loom Console against 10,000 jobs, a 1,000,000-step job with 10 million
# log lines and a live job (CONSOLE_JOBS, CONSOLE_STEPS, CONSOLE_LOG_LINES,
# CONSOLE_LIVE_SECONDS): the jobs page's p95 and size, the big job's charts
# painted in Chromium (cold and warm) and their reply's size, the delay from
# a step's report to the open page, log search; fails when a target is
# missed. Needs playwright-core (scripts/install-deploy-deps.sh).
bench_console() {
  build loom_console_bench loom-controller
  "$BUILD_DIR/bin/loom_console_bench" "$BUILD_DIR/bin" "$PWD"
}

bench_logs() {
  build loom_logs_bench
  "$BUILD_DIR/bin/loom_logs_bench"
}

# The GPU benchmark: bench/gpu/run.sh builds the engine and
# bench/gpu/gpu_bench.cc against PyTorch's LibTorch and runs them on a CUDA
# device (bf16 GPT tokens/s and MFU, fused AdamW against copy bandwidth,
# fused loss against unfused). Only by name: on a machine without a GPU it
# ends with "no CUDA device" (exit 77), so running all benchmarks leaves it
# out. Arguments and environment: see bench/gpu/run.sh.
bench_gpu() {
  bench/gpu/run.sh
}

benchmarks() {
  compgen -A function | sed -n 's/^bench_//p'
}

if [ $# -eq 1 ] && { [ "$1" = "-h" ] || [ "$1" = "--help" ] || [ "$1" = "list" ]; }; then
  echo "usage: $0 [NAME...]  (no NAME runs all but gpu); benchmarks:" >&2
  benchmarks | sed 's/^/  /' >&2
  exit 0
fi
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  mapfile -t names < <(benchmarks | grep -vx gpu)
fi
for name in "${names[@]}"; do
  if ! declare -F "bench_$name" >/dev/null; then
    echo "unknown benchmark \"$name\"; known: $(benchmarks | tr '\n' ' ')" >&2
    exit 2
  fi
  "bench_$name"
done

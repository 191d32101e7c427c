#!/usr/bin/env bash
# The GPU check: everything Loom's engine claims about GPUs, in one run of
# at most six minutes on an H200 (after the machine has started), for a
# machine with one NVIDIA GPU, nvcc, CMake, ninja and PyTorch's wheel, and
# no network. CI has no GPU: there `--rehearse` does the same on the CPU.
#
# 1. Builds, with all cores and ccache when there is one, the engine and
#    bench/gpu/'s programs (bench/gpu/CMakeLists.txt) against the wheel's
#    LibTorch (torch.utils.cmake_prefix_path): loom_gpu_check, loom-rank,
#    and the CUDA AdamW kernel's own check. Abseil, protobuf and yaml-cpp
#    come from the Debian packages scripts/fetch-gpu-debs.sh downloads into
#    GPU_DEBS (default .cache/gpu-debs; about 6 MB, carried to the machine),
#    unpacked with dpkg -x (or ar + tar); the build then refuses copies of
#    them from anywhere else (LOOM_GPU_DEPS_PREFIX). Without the folder the
#    system's must do (a rehearsal fetches the folder first).
# 2. Runs each check under its own timeout, in this order; each prints PART
#    lines for its steps and one verdict (bench/gpu/gpu_check.h):
#      adamw-kernel   the CUDA AdamW kernel against the CPU kernel, bit for
#                     bit, and its bandwidth (worker/engine/ops/
#                     fused_adamw_cuda_test.cu, as scripts/device-check.sh)
#      adamw          the same through FusedAdamW, as the trainer calls it
#      gpt-precision  a small GPT on cuda:0, 20 steps in fp32, bf16 and fp16
#                     (loss scaler), each against the CPU fp32 run: worst
#                     step loss within 1e-4, 1e-2 and 1e-2 (relative)
#      activation-checkpointing   equal losses (1e-5) to no checkpointing,
#                     in fp32 and bf16, and a lower peak
#      memory         the engine's device-memory figures (StepMetrics,
#                     device_memory.h) against the caching allocator's
#                     (torch.cuda.max_memory_allocated)
#      nvml           the power meter reads NVML's energy counter; it counts
#                     ~3 s of matrix products
#      nccl           an NCCL group of one rank: all-reduce, broadcast, and
#                     Train over it
#      gloo-staging   two ranks on cuda:0 over Gloo, tensors staged through
#                     host memory, against one rank (1e-4)
#      tp-pp          TP2 and PP2 on cuda:0 through the same staging against
#                     one rank (1e-4); one GPU cannot host two NCCL ranks
#      resume         loom-rank trains a one-GPU job from its JSON
#                     assignment (loom.v1.StartRank), checkpoints at step 4
#                     and 8; a second loom-rank resumes from step 4 and
#                     matches losses and step-8 shard bit for bit
#      bench          bf16 ~1.3B GPT (24 layers, d 2048, seq 2048) through
#                     Train against PyTorch eager (bench/gpu/gpt_eager.py) in
#                     the same run: MFU and tokens/s, ending
#                     `gpu: mfu <x> ratio=<loom/torch>`
# 3. Writes the logs to LOGS (one per check, and build.log), LOGS bundled
#    as OUT/logs.tar.gz, and OUT/summary.md: the verdict, then one table of
#    every check and part; prints it last.
#
# --rehearse (CI, from the README's test command: ctest loom_gpu_rehearsal,
# tests/gpu/rehearsal_test.sh): the same build against Debian's LibTorch
# (1.13, CPU only) on a CPU machine, then every check with
# CUDA_VISIBLE_DEVICES empty. What needs no GPU runs for real (the CPU
# reference runs, two ranks over Gloo, TP2 and PP2, loom-rank's checkpoint
# and resume, both benchmark sides on a tiny model) and must PASS; every
# check then stops with SKIP and exit 77. The rehearsal passes only when
# the build passed, every part passed and every check skipped: a SKIP is
# never counted as a GPU pass.
#
# Usage: scripts/gpu-run.sh [--rehearse] [--out DIR] [--logs DIR] [--only CHECK,...]
#   --out DIR   where summary.md and logs.tar.gz go (default $OUT, else
#               BUILD/out)
#   --logs DIR  where the logs go (default OUT/logs; outside OUT when only
#               a few files may come back from it)
#   --only      run these checks only (comma-separated)
# Environment: PYTHON (the interpreter with PyTorch; default python3, in a
# rehearsal Debian's /usr/bin/python3), GPU_RUN_BUILD (default build-gpu-run,
# in a rehearsal build-gpu-rehearsal), GPU_DEBS, JOBS (default nproc),
# CUDA_ARCH (default 90), TIMEOUT_SCALE (multiplies every check's timeout;
# default 1), GPU_RUN_DEADLINE (seconds from the start by which the summary
# is written: checks are cut short to meet it and the rest not run; default
# 570, inside a 10-minute command limit; 0 = none, a rehearsal's default).
# Exit status: 0 when every check passed (a rehearsal: as described above),
# 1 otherwise; 2 for bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
started=$(date +%s)

rehearse=0
out=${OUT:-}
logs=""
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rehearse) rehearse=1 ;;
    --out) out=${2:?--out needs a folder}; shift ;;
    --logs) logs=${2:?--logs needs a folder}; shift ;;
    --only) only=${2:?--only needs check names}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-run: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [ "$rehearse" = 1 ]; then
  BUILD=${GPU_RUN_BUILD:-build-gpu-rehearsal}
  PYTHON=${PYTHON:-/usr/bin/python3}
  # No GPU, whatever the machine has: every GPU half must skip.
  export CUDA_VISIBLE_DEVICES=
else
  BUILD=${GPU_RUN_BUILD:-build-gpu-run}
  PYTHON=${PYTHON:-python3}
fi
DEBS=${GPU_DEBS:-.cache/gpu-debs}
JOBS=${JOBS:-$(nproc)}
SCALE=${TIMEOUT_SCALE:-1}
DEADLINE=${GPU_RUN_DEADLINE:-$([ "$rehearse" = 1 ] && echo 0 || echo 570)}
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
out=${out:-$BUILD/out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
logs=${logs:-$out/logs}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
rm -f "$logs"/*.log  # this run's only

# Summary rows: "name<TAB>result<TAB>exit<TAB>seconds<TAB>detail".
rows=()
row() { rows+=("$1"$'\t'"$2"$'\t'"$3"$'\t'"$4"$'\t'"${5//|//}"); }
notes=()

# --- 1. Build -------------------------------------------------------------
prefix_path=""
cmake_args=()
if [ "$rehearse" = 1 ]; then
  notes+=("rehearsal on $(hostname): Debian's LibTorch, no GPU (CUDA_VISIBLE_DEVICES empty)")
else
  if ! torch_prefix=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)'); then
    echo "gpu-run: $PYTHON cannot import torch; set PYTHON to an interpreter with PyTorch" >&2
    exit 1
  fi
  prefix_path=$torch_prefix
  notes+=("$("$PYTHON" -c 'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda,
    "GPUs", torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tail -n 1)")
fi
if command -v nvidia-smi >/dev/null && [ "$rehearse" = 0 ]; then
  notes+=("nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)")
fi

# A rehearsal fetches the packages a GPU machine is sent (a few MB from
# Debian's archive) when it has none, so that it builds as the GPU machine
# does; offline it makes do with the system's.
if [ "$rehearse" = 1 ] && ! compgen -G "$DEBS/*.deb" >/dev/null; then
  if ! ./scripts/fetch-gpu-debs.sh "$DEBS" >"$logs/fetch-gpu-debs.log" 2>&1; then
    notes+=("scripts/fetch-gpu-debs.sh failed (see $logs/fetch-gpu-debs.log): the system's packages instead")
  fi
fi
# The carried Debian packages: unpacked once per set of files.
if compgen -G "$DEBS/*.deb" >/dev/null; then
  deps=$BUILD/debs-root
  ./scripts/unpack-debs.sh "$DEBS" "$deps"
  prefix_path="$deps/usr${prefix_path:+;$prefix_path}"
  cmake_args+=("-DLOOM_GPU_DEPS_PREFIX=$deps/usr")
  export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  notes+=("Abseil, protobuf, yaml-cpp: the Debian packages in $DEBS ($(du -sh "$DEBS" | cut -f1))")
else
  notes+=("Abseil, protobuf, yaml-cpp: the system's ($DEBS has no .deb files)")
fi
nvcc=$(command -v nvcc || true)
if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
if [ -n "$nvcc" ]; then cmake_args+=("-DCMAKE_CUDA_COMPILER=$nvcc"); fi
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
# ccache keys on paths relative to the source tree, so that a fresh clone
# elsewhere (CI's) reuses what a build at the same place in another tree
# compiled (ctest's rehearsal builds in <build dir>/gpu-rehearsal).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}

build_log=$logs/build.log
build_start=$(date +%s)
built=0
if { cmake -S bench/gpu -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_PREFIX_PATH="$prefix_path" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" \
       "${cmake_args[@]}" &&
     targets=(loom_gpu_check loom-rank) &&
     if ninja -C "$BUILD" -t targets all | grep -q '^loom_fused_adamw_cuda_test:'; then
       targets+=(loom_fused_adamw_cuda_test)
     fi &&
     ninja -C "$BUILD" -j "$JOBS" "${targets[@]}"; } >"$build_log" 2>&1; then
  built=1
fi
build_seconds=$(($(date +%s) - build_start))
configured=$(grep -E '^-- Loom GPU build: LibTorch' "$build_log" | sed 's/^-- Loom GPU build: //' || true)
if [ "$built" = 1 ]; then
  row build PASS 0 "$build_seconds" "$JOBS jobs: ${configured:-configured}"
else
  tail -n 40 "$build_log" >&2
  row build FAIL 1 "$build_seconds" "see $build_log: $(grep -m1 -E 'error|Error' "$build_log" || tail -n 1 "$build_log")"
fi

# --- 2. Checks ------------------------------------------------------------
# Seconds each check may take (before TIMEOUT_SCALE).
declare -A limit=([adamw-kernel]=60 [adamw]=60 [gpt-precision]=120
  [activation-checkpointing]=90 [memory]=60 [nvml]=60 [nccl]=90 [gloo-staging]=120
  [tp-pp]=150 [resume]=150 [bench]=240)
wanted() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

# Runs one check, its log in LOGS/<name>.log, and adds its rows.
run_check() {
  local name=$1; shift
  local log=$logs/$name.log t0 rc=0 seconds seconds_limit verdict result detail left
  seconds_limit=$(awk -v s="${limit[$name]:-120}" -v k="$SCALE" 'BEGIN { printf "%d", s * k }')
  if [ "$DEADLINE" -gt 0 ]; then
    # Leave 10 s to write the summary.
    left=$((started + DEADLINE - 10 - $(date +%s)))
    if [ "$left" -lt 5 ]; then
      row "$name" FAIL - 0 "not run: the run's deadline (GPU_RUN_DEADLINE $DEADLINE s) has passed"
      return
    fi
    if [ "$left" -lt "$seconds_limit" ]; then seconds_limit=$left; fi
  fi
  t0=$(date +%s.%N)
  timeout --kill-after=10 "$seconds_limit" "$@" >"$log" 2>&1 || rc=$?
  seconds=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  while IFS= read -r line; do
    local part=${line#PART "$name"/}
    row "$name/${part%%: *}" "$(cut -d' ' -f1 <<<"${part#*: }")" - - "${part#*: * }"
  done < <(grep -E "^PART $name/" "$log" || true)
  verdict=$(grep -E "^CHECK $name: " "$log" | tail -n 1 || true)
  result=$(cut -d' ' -f3 <<<"$verdict")
  detail=${verdict#CHECK "$name": "$result"}
  detail=${detail# }
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    result=FAIL detail="timed out after $seconds_limit s (${detail:-no verdict})"
  elif [ -z "$verdict" ]; then
    result=FAIL detail="no verdict line; exit $rc: $(tail -n 1 "$log")"
  elif ! { [ "$result" = PASS ] && [ "$rc" = 0 ]; } && ! { [ "$result" = SKIP ] && [ "$rc" = 77 ]; } &&
       ! { [ "$result" = FAIL ] && [ "$rc" = 1 ]; }; then
    detail="verdict $result but exit $rc: $detail"
    result=FAIL
  fi
  row "$name" "$result" "$rc" "$seconds" "$detail"
  printf 'gpu-run: %-26s %s (%s s)\n' "$name" "$result" "$seconds" >&2
}

if [ "$built" = 1 ]; then
  if wanted adamw-kernel; then
    if [ -x "$BUILD/loom_fused_adamw_cuda_test" ]; then
      # The kernel's check prints ok/FAIL lines and PASSED/FAILED (exit 0/1),
      # or SKIPPED with exit 77; as a verdict line here:
      run_check adamw-kernel bash -c '
        "$1" 100000000; rc=$?
        case $rc in
          0) echo "CHECK adamw-kernel: PASS $(grep -h "^adamw-cuda: .*ratio=" "$2" | tail -n 1)" ;;
          77) echo "CHECK adamw-kernel: SKIP no CUDA device (cudaGetDeviceCount)" ;;
          *) echo "CHECK adamw-kernel: FAIL exit $rc: $(grep -h -m1 -E "^FAIL|error" "$2" || tail -n 1 "$2")" ;;
        esac
        exit $rc' _ "$BUILD/loom_fused_adamw_cuda_test" "$logs/adamw-kernel.log"
    else
      row adamw-kernel SKIP 77 0 "not built: CMake found no CUDA compiler (nvcc)"
    fi
  fi
  # The checks, in order; loom_gpu_check must know the same list.
  checks=(adamw gpt-precision activation-checkpointing memory nvml nccl gloo-staging tp-pp
          resume bench)
  listed=$("$BUILD/loom_gpu_check" list 2>&1 | tr '\n' ' ' || true)
  if [ "$listed" != "${checks[*]} " ]; then
    row list FAIL 1 0 "loom_gpu_check list says: $listed; gpu-run.sh runs: ${checks[*]}"
  fi
  for name in "${checks[@]}"; do
    wanted "$name" || continue
    case "$name" in
      # In-process ranks share one OpenMP runtime; deterministic only with
      # one OpenMP thread per process (worker/engine/engine.cmake).
      gloo-staging|tp-pp) run_check "$name" env OMP_NUM_THREADS=1 "$BUILD/loom_gpu_check" "$name" ;;
      bench) run_check "$name" env LOOM_GPU_PYTHON="$PYTHON" "$BUILD/loom_gpu_check" "$name" ;;
      *) run_check "$name" "$BUILD/loom_gpu_check" "$name" ;;
    esac
  done
fi

# --- 3. Verdict and summary -----------------------------------------------
passed=0 failed=0 skipped=0 skipped_ok=0 parts_passed=0 parts_failed=0
for r in "${rows[@]}"; do
  IFS=$'\t' read -r name result rc _ _ <<<"$r"
  if [ "$name" = build ]; then continue; fi
  if [[ "$name" == */* ]]; then
    if [ "$result" = PASS ]; then parts_passed=$((parts_passed + 1)); else parts_failed=$((parts_failed + 1)); fi
    continue
  fi
  case "$result" in
    PASS) passed=$((passed + 1)) ;;
    SKIP) skipped=$((skipped + 1)); if [ "$rc" = 77 ]; then skipped_ok=$((skipped_ok + 1)); fi ;;
    *) failed=$((failed + 1)) ;;
  esac
done
elapsed=$(($(date +%s) - started))
ran=$((passed + failed + skipped))
if [ "$rehearse" = 1 ]; then
  # The build passes; every check (its GPU half) skips with exit 77; every
  # part (what needs no GPU) passes.
  if [ "$built" = 1 ] && [ "$ran" -gt 0 ] && [ "$skipped_ok" = "$ran" ] && [ "$parts_failed" = 0 ]; then
    status=0
    verdict="rehearsal passed: built in $build_seconds s; $skipped GPU checks skipped (exit 77, no GPU); $parts_passed CPU parts passed"
  else
    status=1
    verdict="rehearsal FAILED: build $([ "$built" = 1 ] && echo passed || echo FAILED); $failed checks failed, $passed passed without a GPU, $((skipped - skipped_ok)) skipped without exit 77; $parts_failed CPU parts failed"
  fi
else
  if [ "$built" = 1 ] && [ "$ran" -gt 0 ] && [ "$passed" = "$ran" ] && [ "$parts_failed" = 0 ]; then
    status=0
    verdict="all $ran checks passed"
  else
    status=1
    verdict="build $([ "$built" = 1 ] && echo passed || echo FAILED); of $ran checks $passed passed, $failed failed, $skipped skipped; $parts_failed parts failed"
  fi
  if [ "$elapsed" -gt 360 ]; then verdict="$verdict; OVER the 6-minute budget ($elapsed s)"; fi
fi

summary=$out/summary.md
{
  echo "# Loom GPU check$([ "$rehearse" = 1 ] && echo " (rehearsal)")"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname); $elapsed s in all (build $build_seconds s); logs in $logs"
  for n in "${notes[@]}"; do echo "- $n"; done
  if [ -f "$logs/bench.log" ]; then grep -h '^gpu: mfu' "$logs/bench.log" | sed 's/^/- /' || true; fi
  echo
  echo "**gpu-run: $verdict**"
  echo
  echo "| check | result | exit | seconds | detail |"
  echo "|---|---|---|---|---|"
  for r in "${rows[@]}"; do
    IFS=$'\t' read -r name result rc seconds detail <<<"$r"
    echo "| $name | $result | $rc | $seconds | $detail |"
  done
} >"$summary"
(cd "$logs" && tar -czf "$out/logs.tar.gz" -- *.log) || true
echo
cat "$summary"
exit "$status"

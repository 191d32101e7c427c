#!/usr/bin/env bash
# The GPU check: everything Loom's engine claims about GPUs, in one run of
# at most six minutes on an H200 (after the machine has started), for a
# machine with one NVIDIA GPU, nvcc, CMake, ninja and PyTorch's wheel, and
# no network. CI has no GPU: there `--rehearse` does the same on the CPU.
#
# 1. Preflight, before CMake runs: the facts a failed build's rerun needs,
#    written at once to OUT/preflight.md and OUT/summary.md (and kept in
#    the final summary): torch's version, C++ ABI, CUDA and NCCL versions;
#    whether torch/include has gloo/; the carried libgloo-dev; whether
#    libtorch_cpu.so exports sgemm_ and protobuf symbols; nccl.h's version
#    and place (the build refuses to start when it is not the NCCL torch
#    runs, naming both); where cublas_v2.h and cusparse.h are; nvcc, CMake,
#    ninja, g++ and glibc versions.
# 2. Builds, with all cores and ccache when there is one, the engine and
#    bench/gpu/'s programs (bench/gpu/CMakeLists.txt) against the wheel's
#    LibTorch (torch.utils.cmake_prefix_path): loom_gpu_check, loom-rank,
#    and the CUDA AdamW kernel's own check (whenever nvcc is found).
#    Abseil, protobuf, yaml-cpp and Gloo's headers come from the Debian
#    packages scripts/fetch-gpu-debs.sh downloads into GPU_DEBS (default
#    .cache/gpu-debs; about 6 MB, carried to the machine), unpacked with
#    dpkg -x (or ar + tar); the build then refuses copies of them from
#    anywhere else (LOOM_GPU_DEPS_PREFIX). Without the folder the system's
#    must do (a rehearsal fetches the folder first).
# 3. Runs each check under its own timeout, in this order; each prints PART
#    lines for its steps and one verdict (bench/gpu/gpu_check.h):
#      adamw-kernel   the CUDA AdamW kernel against the CPU kernel, bit for
#                     bit, and its bandwidth (worker/engine/ops/
#                     fused_adamw_cuda_test.cu, as scripts/device-check.sh)
#      adamw          the same through FusedAdamW, as the trainer calls it
#      gpt-precision  a small GPT on cuda:0, 20 steps in fp32, bf16 and fp16
#                     (loss scaler), each against the CPU fp32 run: worst
#                     step loss within 1e-4, 1e-2 and 1e-2 (relative)
#      activation-checkpointing   losses within 1e-5 (fp32) and 1e-3 (bf16:
#                     FlashAttention-2's backward adds atomically) of no
#                     checkpointing, bitwise equality reported,
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
# 4. Writes the logs to LOGS (one per check, and build.log), LOGS bundled
#    as OUT/logs.tar.gz, and OUT/summary.md: the verdict, one table of
#    every check and part, then the preflight table; prints it last.
#
# --rehearse (CI, from the README's test command: ctest loom_gpu_rehearsal,
# tests/gpu/rehearsal_test.sh): the same build against Debian's LibTorch
# (1.13, CPU only) on a CPU machine, laid out as the wheel is: the system's
# Gloo headers are hidden from the build (an empty folder mounted over
# /usr/include/gloo in a mount namespace of the build's own: unshare, as
# root or with a user namespace), so that only the carried libgloo-dev can
# supply them; then every check with CUDA_VISIBLE_DEVICES empty. What needs no GPU runs for real (the CPU
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
# GPU_RUN_HIDE_SYSTEM_GLOO (rehearsal: 0 leaves the system's Gloo headers
# visible, where no mount namespace can be made; the summary says so),
# NCCL_INCLUDE_DIR (the nccl.h to build with), CUDA_ARCH (default 90), TIMEOUT_SCALE (multiplies every check's timeout;
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

# --- 1. Where LibTorch and the carried packages are ---------------------------
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
  notes+=("nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed -n 1p)")
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
  notes+=("Abseil, protobuf, yaml-cpp, Gloo's headers: the Debian packages in $DEBS ($(du -sh "$DEBS" | cut -f1))")
else
  notes+=("Abseil, protobuf, yaml-cpp, Gloo's headers: the system's ($DEBS has no .deb files)")
fi
nvcc=$(command -v nvcc || true)
if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
if [ -n "$nvcc" ]; then cmake_args+=("-DCMAKE_CUDA_COMPILER=$nvcc"); fi
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
# ccache keys on paths relative to the source tree, so that a fresh clone
# elsewhere (CI's) reuses what a build at the same place in another tree
# compiled (ctest's rehearsal builds in <build dir>/gpu-rehearsal).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}

# --- 2. Preflight ---------------------------------------------------------
# The facts a failed build's rerun needs, gathered before CMake runs and
# written at once to OUT/preflight.md (and into the summary): a build that
# fails, or a machine that is taken back mid-build, still leaves them.
facts=()  # "fact<TAB>value"
fact() { facts+=("$1"$'\t'"${2//|//}"); }
# The first line of a command's output, read whole (a reader that leaves
# early would kill the writer with SIGPIPE under pipefail).
first_line() { local o; o=$("$@" 2>&1) || true; o=${o%%$'\n'*}; printf '%s' "${o:-none}"; }
torch_facts=$("$PYTHON" - <<'PY' 2>&1 || true
import os
try:
    import torch
except Exception as e:  # the row says why
    print("error=%s" % str(e).splitlines()[0])
    raise SystemExit(0)
print("version=%s" % torch.__version__)
print("dir=%s" % os.path.dirname(torch.__file__))
print("cxx11_abi=%s" % torch.compiled_with_cxx11_abi())
print("cuda=%s" % torch.version.cuda)
try:
    v = torch.cuda.nccl.version()
    if isinstance(v, int):  # older torch: one number, 2.9+ as 10000*major
        v = (v // 10000, v // 100 % 100, v % 100) if v >= 20900 else (v // 1000, v // 100 % 10, v % 100)
    print("nccl=%s" % ".".join(str(x) for x in v[:3]))
except Exception as e:
    print("nccl=none (%s)" % (str(e).splitlines() or ["no NCCL"])[0])
PY
)
torch_fact() { sed -n "s/^$1=//p" <<<"$torch_facts" | sed -n 1p; }
torch_dir=$(torch_fact dir)
torch_error=$(torch_fact error)
fact "python torch" "$(torch_fact version)${torch_error:+cannot import torch: $torch_error} ($PYTHON)"
fact "torch.compiled_with_cxx11_abi()" "$(torch_fact cxx11_abi)"
fact "torch.version.cuda" "$(torch_fact cuda)"
torch_nccl=$(torch_fact nccl)
fact "torch.cuda.nccl.version()" "${torch_nccl:-unknown}"

# Where the LibTorch being built against keeps its headers and libraries:
# the wheel's torch/include and torch/lib; in a rehearsal, Debian's.
if [ "$rehearse" = 1 ]; then
  torch_include=/usr/include
  torch_lib=/usr/lib/$(gcc -print-multiarch)
else
  torch_include=$torch_dir/include
  torch_lib=$torch_dir/lib
fi
if [ -d "$torch_include/gloo" ]; then
  gloo_state="present ($torch_include/gloo)"
  if [ "$rehearse" = 1 ]; then gloo_state="$gloo_state: the system's libgloo-dev, hidden from the build"; fi
else
  gloo_state="absent ($torch_include has no gloo/): the carried libgloo-dev must supply it"
fi
fact "torch/include/gloo" "$gloo_state"
carried_gloo=$(compgen -G "$DEBS/libgloo-dev_*.deb" | sed -n 1p || true)
if [ -n "$carried_gloo" ]; then
  fact "carried libgloo-dev" "$(basename "$carried_gloo") (in $DEBS)"
else
  fact "carried libgloo-dev" "none in $DEBS: scripts/fetch-gpu-debs.sh carries it"
fi

# libtorch_cpu's exports: sgemm_ (the CPU attention kernel's reference
# BLAS call may resolve from it) and protobuf (which must not clash with the
# carried libprotobuf).
libtorch_cpu=$torch_lib/libtorch_cpu.so
if [ -f "$libtorch_cpu" ] && command -v nm >/dev/null; then
  nm -D --defined-only "$libtorch_cpu" >"$logs/libtorch_cpu.exports" 2>&1 || true
  sgemm=$(grep -c ' sgemm_$' "$logs/libtorch_cpu.exports" || true)
  protobuf=$(grep -c '_ZN6google8protobuf' "$logs/libtorch_cpu.exports" || true)
  fact "libtorch_cpu.so exports sgemm_" "$([ "${sgemm:-0}" -gt 0 ] && echo yes || echo no) ($libtorch_cpu)"
  fact "libtorch_cpu.so exports protobuf symbols" "${protobuf:-0}"
else
  fact "libtorch_cpu.so exports" "not read: $libtorch_cpu $([ -f "$libtorch_cpu" ] && echo "present, no nm" || echo absent)"
fi

# nccl.h: the one CMake will use (the same search as bench/gpu/CMakeLists.txt,
# which is then told this one), against the NCCL torch runs with. The
# options struct libtorch fills is sized by the header: another version's
# corrupts the heap, so a mismatch refuses to build.
site_packages=${torch_dir:+$(dirname "$torch_dir")}
nccl_header=""
for d in "${NCCL_INCLUDE_DIR:-}" "${NCCL_ROOT:+$NCCL_ROOT/include}" \
         "${site_packages:+$site_packages/nvidia/nccl/include}" \
         "${site_packages:+$site_packages/nvidia/cu13/include}" \
         "${nvcc:+$(dirname "$(dirname "$nvcc")")/include}"; do
  if [ -n "$d" ] && [ -f "$d/nccl.h" ]; then nccl_header=$d/nccl.h; break; fi
done
nccl_refusal=""
if [ -n "$nccl_header" ]; then
  header_nccl=$(awk '/^#define NCCL_(MAJOR|MINOR|PATCH) /{v[$2]=$3}
    END { if (v["NCCL_MAJOR"] != "") printf "%s.%s.%s", v["NCCL_MAJOR"], v["NCCL_MINOR"], v["NCCL_PATCH"] }' "$nccl_header")
  if [[ "$torch_nccl" =~ ^[0-9] ]]; then
    fact "nccl.h" "${header_nccl:-unknown version} ($nccl_header)"
  else
    fact "nccl.h" "${header_nccl:-unknown version} ($nccl_header); torch has no NCCL, so the build does not use it"
  fi
  cmake_args+=("-DLOOM_NCCL_INCLUDE_DIR=$(dirname "$nccl_header")")
  if [ -n "$header_nccl" ] && [[ "$torch_nccl" =~ ^[0-9] ]] && [ "$header_nccl" != "$torch_nccl" ]; then
    nccl_refusal="nccl.h is NCCL $header_nccl ($nccl_header) but torch runs NCCL $torch_nccl: the options struct libtorch fills would be sized by another version's header (heap corruption); set NCCL_INCLUDE_DIR to the headers of NCCL $torch_nccl"
  fi
else
  fact "nccl.h" "not found (NCCL_INCLUDE_DIR, NCCL_ROOT, the wheel's nvidia/ folders, the CUDA toolkit)"
fi
cuda_include=${nvcc:+$(dirname "$(dirname "$nvcc")")/include}
for h in cublas_v2.h cusparse.h; do
  where=""
  for d in "$cuda_include" ${site_packages:+"$site_packages"/nvidia/*/include}; do
    if [ -n "$d" ] && [ -f "$d/$h" ]; then where=$d/$h; break; fi
  done
  fact "$h" "${where:-absent}"
done
fact "nvcc" "$([ -n "$nvcc" ] && { o=$("$nvcc" --version 2>&1 || true); printf '%s' "${o##*$'\n'}"; } || echo "not found")"
fact "cmake" "$(first_line cmake --version)"
fact "ninja" "$(first_line ninja --version)"
fact "g++" "$(first_line g++ --version)"
fact "glibc" "$(first_line getconf GNU_LIBC_VERSION)"

preflight=$out/preflight.md
{
  echo "| preflight | value |"
  echo "|---|---|"
  for f in "${facts[@]}"; do
    IFS=$'\t' read -r name value <<<"$f"
    echo "| $name | $value |"
  done
} >"$preflight"
echo "gpu-run: preflight ($preflight):" >&2
cat "$preflight" >&2
# Until the run ends, the summary is the preflight: what a rerun needs if
# the build fails or the machine goes before the end.
{
  echo "# Loom GPU check$([ "$rehearse" = 1 ] && echo " (rehearsal)"): preflight only, the run has not finished"
  echo
  cat "$preflight"
} >"$out/summary.md"

# --- 3. Build ---------------------------------------------------------------
# A rehearsal hides the system's Gloo headers (an empty folder mounted over
# /usr/include/gloo in a mount namespace of the build's own): the wheel has
# none, so only the carried libgloo-dev may supply them, and a set of
# carried packages without it fails here, not on the GPU machine.
# GPU_RUN_HIDE_SYSTEM_GLOO=0 builds with them visible (a machine where no
# mount namespace can be made; the summary says so).
hide=()
if [ "$rehearse" = 1 ] && [ -d /usr/include/gloo ] && [ "${GPU_RUN_HIDE_SYSTEM_GLOO:-1}" != 0 ]; then
  mkdir -p "$BUILD/empty"
  if [ "$(id -u)" = 0 ]; then
    hide=(unshare --mount --propagation private --)
  else
    hide=(unshare --mount --map-root-user --propagation private --)
  fi
  hide+=(bash -c 'mount --bind "$1" /usr/include/gloo && shift && exec "$@"' hide-gloo "$BUILD/empty")
  notes+=("the system's /usr/include/gloo hidden from the build (a mount namespace): Gloo's headers from the carried packages only")
elif [ "$rehearse" = 1 ] && [ -d /usr/include/gloo ]; then
  notes+=("GPU_RUN_HIDE_SYSTEM_GLOO=0: the system's Gloo headers were visible to the build; a missing carried libgloo-dev goes unseen")
fi

build_log=$logs/build.log
build_start=$(date +%s)
built=0
targets_file=$BUILD/ninja-targets.txt
if [ -n "$nccl_refusal" ]; then
  echo "gpu-run: refusing to build: $nccl_refusal" >"$build_log"
elif { "${hide[@]}" cmake -S bench/gpu -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
         -DCMAKE_PREFIX_PATH="$prefix_path" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" \
         "${cmake_args[@]}" &&
       targets=(loom_gpu_check loom-rank) &&
       # The list goes to a file and is searched there: see tests/lint/.
       ninja -C "$BUILD" -t targets all >"$targets_file" &&
       if grep '^loom_fused_adamw_cuda_test:' "$targets_file" >/dev/null; then
         targets+=(loom_fused_adamw_cuda_test)
       fi &&
       "${hide[@]}" ninja -C "$BUILD" -j "$JOBS" "${targets[@]}"; } >"$build_log" 2>&1; then
  built=1
fi
build_seconds=$(($(date +%s) - build_start))
configured=$(grep -E '^-- Loom GPU build: LibTorch' "$build_log" | sed 's/^-- Loom GPU build: //' || true)
if [ "$built" = 1 ]; then
  row build PASS 0 "$build_seconds" "$JOBS jobs: ${configured:-configured}"
elif [ -n "$nccl_refusal" ]; then
  row build FAIL 1 0 "refused: $nccl_refusal"
else
  tail -n 40 "$build_log" >&2
  row build FAIL 1 "$build_seconds" "see $build_log: $(grep -m1 -E 'error|Error' "$build_log" || tail -n 1 "$build_log")"
fi

# --- 4. Checks ------------------------------------------------------------
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

# --- 5. Verdict and summary -----------------------------------------------
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
  cat "$preflight"
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

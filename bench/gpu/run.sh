#!/usr/bin/env bash
# GPU benchmark, for a machine with an NVIDIA GPU, PyTorch
# with CUDA (whose LibTorch serves the C++ build), nvcc, CMake and ninja:
# builds the engine parts it needs and bench/gpu/gpu_bench.cc there
# (bench/gpu/CMakeLists.txt; the fused AdamW kernel for sm_90 unless
# CUDA_ARCH says otherwise), then runs it. It prints the bf16 matmul rate
# and copy bandwidth it measures, the training tokens/s and MFU of a ~355M
# GPT with the fused step, fused AdamW against the copy bandwidth, and the
# fused loss against the unfused one; the last line reads
#   gpu: <tok/s> tok/s ratio=<MFU> MFU (...)
#
# Abseil, protobuf and yaml-cpp (bench/gpu/CMakeLists.txt configures the
# whole standalone build, of which this benchmark needs Abseil only): from
# the system when CMake finds them; otherwise from the Debian packages in
# GPU_DEBS (default .cache/gpu-debs, filled on a Debian 12 machine by
# scripts/fetch-gpu-debs.sh and carried to the GPU machine), unpacked with
# dpkg -x (or ar + tar where there is no dpkg) into the build directory.
# scripts/gpu-run.sh builds and runs the GPU checks the same way.
#
# Usage: bench/gpu/run.sh [batch] [steps] [adamw_params]   (see gpu_bench.cc)
# Environment: PYTHON (default python3), GPU_BENCH_BUILD (default
# build-gpu-bench), GPU_DEBS, CUDA_ARCH (default 90), JOBS (default nproc),
# GPU_BENCH_TIMEOUT (seconds for the run itself, default 420).
# Exit status: gpu_bench's (77: no CUDA device), or 1 when the build fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
BUILD=${GPU_BENCH_BUILD:-build-gpu-bench}
DEBS=${GPU_DEBS:-.cache/gpu-debs}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)

if ! torch_prefix=$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)'); then
  echo "gpu bench: $PYTHON cannot import torch; set PYTHON to an interpreter with PyTorch" >&2
  exit 1
fi
"$PYTHON" -c 'import torch; print("gpu bench: PyTorch", torch.__version__, "CUDA", torch.version.cuda,
  "GPUs", torch.cuda.device_count())'
prefix_path=$torch_prefix

# Carried Debian packages: unpack once per set of files.
if compgen -G "$DEBS/*.deb" >/dev/null; then
  root=$BUILD/debs-root
  ./scripts/unpack-debs.sh "$DEBS" "$root"
  prefix_path="$prefix_path;$root/usr"
  export LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "gpu bench: Debian packages from $DEBS unpacked in $root"
fi

nvcc=$(command -v nvcc || true)
if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
cuda_args=()
if [ -n "$nvcc" ]; then cuda_args=("-DCMAKE_CUDA_COMPILER=$nvcc"); fi
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}

start=$(date +%s)
log=$BUILD/build.log
if ! { cmake -S bench/gpu -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
         -DCMAKE_PREFIX_PATH="$prefix_path" -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" \
         "${cuda_args[@]}" && ninja -C "$BUILD" -j "$JOBS" loom_gpu_bench; } >"$log" 2>&1; then
  tail -n 60 "$log" >&2
  echo "gpu bench: the build failed (full log: $log)" >&2
  exit 1
fi
grep -E '^-- Loom GPU bench' "$log" || true
echo "gpu bench: built in $(($(date +%s) - start)) s"

status=0
timeout "${GPU_BENCH_TIMEOUT:-420}" "$BUILD/loom_gpu_bench" "$@" || status=$?
if [ "$status" = 124 ]; then echo "gpu bench: timed out" >&2; fi
exit "$status"

#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU and nvcc (not part of CI, which
# has no GPU): builds the fused AdamW CUDA kernel with its standalone check
# and runs it against the CPU reference kernel (bitwise), then prints the
# bandwidth. Needs only nvcc, g++ with OpenMP, and Abseil's headers: from
# ABSL_INCLUDE, else /usr/include, else the libabsl-dev package among the
# carried Debian packages in GPU_DEBS (default .cache/gpu-debs; see
# scripts/fetch-gpu-debs.sh), unpacked with dpkg -x.
# With --bench it then runs the GPU benchmark (bench/gpu/run.sh: the engine
# against PyTorch's LibTorch; bf16 GPT MFU, fused AdamW, fused loss).
# Usage: ./scripts/device-check.sh [PARAMETERS] [--bench]   (default 100000000)
set -euo pipefail
cd "$(dirname "$0")/.."
params=100000000
bench=0
for arg in "$@"; do
  case "$arg" in
    --bench) bench=1 ;;
    *) params=$arg ;;
  esac
done
command -v nvcc >/dev/null || { echo "device-check: nvcc not found" >&2; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ARCH=${CUDA_ARCH:-sm_90}
out=$(mktemp -d)
absl_include=${ABSL_INCLUDE:-/usr/include}
if [ ! -f "$absl_include/absl/types/span.h" ]; then
  deb=$(compgen -G "${GPU_DEBS:-.cache/gpu-debs}/libabsl-dev_*.deb" | sed -n 1p || true)
  if [ -z "$deb" ]; then
    echo "device-check: no Abseil headers (set ABSL_INCLUDE, or carry the packages of" \
      "scripts/fetch-gpu-debs.sh)" >&2
    exit 1
  fi
  dpkg -x "$deb" "$out/absl"
  absl_include=$out/absl/usr/include
fi
nvcc -std=c++17 -O3 -arch="$ARCH" -I. -I"$absl_include" \
  worker/engine/ops/fused_adamw_cuda_test.cu worker/engine/ops/fused_adamw_cuda.cu \
  worker/engine/ops/fused_adamw.cc worker/engine/ops/cpu_features.cc -Xcompiler -fopenmp,-ffp-contract=off \
  -o "$out/fused_adamw_cuda_test"
"$out/fused_adamw_cuda_test" "$params"
if [ "$bench" = 1 ]; then bench/gpu/run.sh; fi

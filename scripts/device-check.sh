#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU and nvcc (not part of CI, which
# has no GPU): builds the fused AdamW CUDA kernel with its standalone check
# and runs it against the CPU reference kernel (bitwise), then prints the
# bandwidth. Needs only nvcc, g++ with OpenMP, and Abseil's headers (set
# ABSL_INCLUDE if they are not in /usr/include).
# Usage: ./scripts/device-check.sh [PARAMETERS]   (default 100000000)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvcc >/dev/null || { echo "device-check: nvcc not found" >&2; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
ARCH=${CUDA_ARCH:-sm_90}
out=$(mktemp -d)
nvcc -std=c++17 -O3 -arch="$ARCH" -I. -I"${ABSL_INCLUDE:-/usr/include}" \
  worker/engine/fused_adamw_cuda_test.cu worker/engine/fused_adamw_cuda.cu \
  worker/engine/fused_adamw.cc -Xcompiler -fopenmp,-ffp-contract=off -o "$out/fused_adamw_cuda_test"
"$out/fused_adamw_cuda_test" "${1:-100000000}"

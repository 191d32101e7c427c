#!/usr/bin/env bash
# Installs what Loom's benchmarks need beyond Loom's own dependencies, from
# Debian 12 packages: PyTorch for Python (python3-torch 1.13), the eager
# baseline that bench/train_pytorch.py runs under /usr/bin/python3. It shares
# libblas.so.3 (pinned to OpenBLAS by install-deps.sh) with LibTorch, so both
# sides of a benchmark run on the same BLAS. Idempotent.
set -euo pipefail
exec "$(dirname "$0")/install-deps.sh" python3 python3-torch

#!/usr/bin/env bash
# Installs what Loom's benchmarks need beyond scripts/install-deps.sh, from
# Debian 12 packages: PyTorch for Python (python3-torch, 1.13), the eager
# baseline that bench/train_pytorch.py runs under /usr/bin/python3.
# Idempotent: re-running it installs nothing new.
set -euo pipefail

PKGS=(
  python3 python3-torch
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-bench-deps: installing ${#missing[@]} package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install-bench-deps: all ${#PKGS[@]} packages present"
fi

# Debian's python3-torch uses the same libblas.so.3 alternative as LibTorch;
# scripts/install-deps.sh pins it to OpenBLAS, so both sides of a benchmark
# run on the same BLAS. Say which one that is.
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
echo "install-bench-deps: libblas.so.3 is $(readlink -f /usr/lib/${arch}/libblas.so.3)"

#!/usr/bin/env bash
# Installs every build and run-time dependency of Loom from Debian 12 packages.
# Idempotent: re-running it installs nothing new and re-asserts the BLAS choice.
# Extra package names given as arguments are installed the same way
# (scripts/install-bench-deps.sh uses this).
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates procps
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  libtorch-dev libgloo-dev
  libsqlite3-dev libyaml-cpp-dev libcivetweb-dev libcpp-httplib-dev libsentencepiece-dev
  libpq-dev postgresql
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  prometheus
  libopenblas0-openmp libopenblas-dev
  fortunes fortunes-min
  curl openssl libssl-dev libcurl4-openssl-dev
  python3-torch chromium
  clang-14 libclang-rt-14-dev libfuzzer-14-dev libomp-14-dev
  iproute2 iptables
  "$@"
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" >/dev/null; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  # PostgreSQL: the controllers' shared store. Loom's tests and
  # `loomctl local up --ha` start servers of their own in directories they
  # make; the package's default cluster would be one more server running
  # for nothing, so a first install of the server is told not to make one.
  if ! dpkg-query -W -f='${Status}' postgresql-common 2>/dev/null | grep "install ok installed" >/dev/null; then
    $SUDO mkdir -p /etc/postgresql-common/createcluster.d
    echo "create_main_cluster = false" |
      $SUDO tee /etc/postgresql-common/createcluster.d/loom.conf >/dev/null
  fi
  echo "install-deps: installing ${#missing[@]} package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # Prometheus' package would start a server through its init hooks; we only
  # need promtool, and a chroot/container has no init to start it anyway.
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install-deps: all ${#PKGS[@]} packages present"
fi

# BLAS: Debian's LibTorch links libblas.so.3, which the alternatives system
# resolves. The reference BLAS is ~100x slower than OpenBLAS for sgemm, so pin
# OpenBLAS (openmp flavour) even if someone set the alternative to manual.
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
for name in "libblas.so.3-${arch}" "liblapack.so.3-${arch}"; do
  lib=${name%%-${arch}}
  target=$(update-alternatives --list "$name" 2>/dev/null | grep 'openblas-openmp' | sed -n 1p || true)
  if [ -n "$target" ]; then
    current=$(readlink -f "/etc/alternatives/${name}" 2>/dev/null || true)
    if [ "$current" != "$(readlink -f "$target")" ]; then
      $SUDO update-alternatives --set "$name" "$target" >/dev/null
      echo "install-deps: ${lib} -> ${target}"
    fi
  else
    echo "install-deps: WARNING: no OpenBLAS alternative for ${lib}" >&2
  fi
done
echo "install-deps: libblas.so.3 is $(readlink -f /usr/lib/${arch}/libblas.so.3)"

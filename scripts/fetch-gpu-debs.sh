#!/usr/bin/env bash
# Downloads, on a Debian 12 machine, the Debian packages that the engine's
# GPU build needs besides LibTorch, into a folder that goes with the working
# tree to a GPU machine where nothing can be installed from a registry
# (bench/gpu/run.sh unpacks them there with dpkg -x):
#   libabsl-dev and the Abseil runtime it depends on (absl::Status,
#   StatusOr, StrCat/StrFormat, Span in worker/engine).
# Nothing is installed here; apt-get only downloads (and updates its lists
# when they do not know the packages yet).
# Usage: ./scripts/fetch-gpu-debs.sh [DIR]   (default .cache/gpu-debs)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.cache/gpu-debs}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

if ! apt-cache show libabsl-dev >/dev/null 2>&1; then apt-get update -qq; fi
# The runtime library's name carries Abseil's version (libabsl20220623 on
# Debian 12): take it from libabsl-dev's dependencies.
runtime=$(apt-cache depends libabsl-dev | awk '$1 == "Depends:" && $2 ~ /^libabsl[0-9]+$/ { print $2 }')
if [ -z "$runtime" ]; then
  echo "fetch-gpu-debs: cannot find the Abseil runtime package libabsl-dev depends on" >&2
  exit 1
fi
packages=(libabsl-dev $runtime)

rm -f "$DIR"/*.deb
# apt-get download writes to the current directory; as root it warns that
# the _apt user cannot write there, which is harmless.
(cd "$DIR" && apt-get download -q "${packages[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
for p in "${packages[@]}"; do
  if ! compgen -G "$DIR/${p}_*.deb" >/dev/null; then
    echo "fetch-gpu-debs: $p was not downloaded" >&2
    exit 1
  fi
done
ls -l "$DIR"
echo "fetch-gpu-debs: carry $DIR to the GPU machine (e.g. the device tool's carry" \
  "[\"${DIR#"$PWD"/}\"]); bench/gpu/run.sh finds it there"

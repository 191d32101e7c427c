#!/usr/bin/env bash
# Downloads, on a Debian 12 machine, the Debian packages that the engine's
# GPU build needs besides LibTorch, into a folder that goes with the working
# tree to a GPU machine where nothing can be installed from a registry
# (scripts/gpu-run.sh and bench/gpu/run.sh unpack them there with dpkg -x;
# bench/gpu/CMakeLists.txt then takes them from nowhere else):
#   libabsl-dev and its runtime        absl::Status, StatusOr, StrCat, Span...
#   libprotobuf-dev, its runtimes,     loom/v1/job.pb.{h,cc}, generated in the
#     protobuf-compiler, libprotoc     build: the trainer reports steps as
#                                      loom.v1.StepMetrics, loom-rank reads
#                                      its JSON assignment
#   libyaml-cpp-dev and its runtime    checkpoint manifests, job specs
#   libgloo-dev (its headers only)     ProcessGroupGloo.hpp includes <gloo/...>,
#                                      and PyTorch's wheels install no Gloo
#                                      headers (Gloo is linked into
#                                      libtorch_cpu; its build sets
#                                      GLOO_INSTALL OFF). Nothing links
#                                      against it, so its runtime stays
#                                      behind. Debian 12's snapshot is older
#                                      than the Gloo inside a recent wheel:
#                                      the engine only creates groups through
#                                      c10d and calls no Gloo virtual, which
#                                      is what makes the two compatible.
# libprotobuf-dev's zlib1g-dev is left out: it serves static linking only,
# and every machine has zlib's runtime. About 6 MB in all (the budget for
# what a GPU machine gets besides its own software is 64 MiB).
# Nothing is installed here; apt-get only downloads (and updates its lists
# when they do not know the packages yet).
# Usage: ./scripts/fetch-gpu-debs.sh [DIR]   (default .cache/gpu-debs)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.cache/gpu-debs}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

if ! apt-cache show libabsl-dev protobuf-compiler libyaml-cpp-dev libgloo-dev >/dev/null 2>&1; then
  apt-get update -qq
fi
# Runtime libraries carry their ABI version in the name (libabsl20220623,
# libprotobuf32, libprotoc32, libyaml-cpp0.7 on Debian 12): each is taken
# from the dependencies of the package that needs it.
runtime_of() {  # PACKAGE REGEX -> the dependencies of PACKAGE matching REGEX
  local found
  found=$(apt-cache depends "$1" | awk -v re="$2" '$1 == "Depends:" && $2 ~ re { print $2 }' | sort -u)
  if [ -z "$found" ]; then
    echo "fetch-gpu-debs: cannot find the runtime package ($2) that $1 depends on" >&2
    exit 1
  fi
  echo "$found"
}
packages=(libabsl-dev libprotobuf-dev protobuf-compiler libyaml-cpp-dev libgloo-dev)
packages+=($(runtime_of libabsl-dev '^libabsl[0-9]+$'))
packages+=($(runtime_of libprotobuf-dev '^libprotobuf(-lite)?[0-9]+$'))
packages+=($(runtime_of protobuf-compiler '^libprotoc[0-9]+$'))
packages+=($(runtime_of libyaml-cpp-dev '^libyaml-cpp[0-9.]+$'))

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
echo "fetch-gpu-debs: $(du -sh "$DIR" | cut -f1) in $DIR; carry it to the GPU machine (e.g. the" \
  "device tool's carry [\"${DIR#"$PWD"/}\"]); scripts/gpu-run.sh finds it there"

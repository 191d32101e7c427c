#!/usr/bin/env bash
# Builds Loom's libFuzzer targets under AddressSanitizer + UndefinedBehavior-
# Sanitizer with Debian's clang-14 (into build-fuzz/, every object
# instrumented) and runs each from its checked-in seed corpus
# (tests/fuzz/<target>/).
#   ./scripts/fuzz.sh [SECONDS]   each target for SECONDS (default 60)
#   ./scripts/fuzz.sh --smoke     each target for 5 s: what CI runs
#   FUZZ_TARGETS="access jobspec" ./scripts/fuzz.sh 600   only those targets
# New inputs go to build-fuzz/corpus/<target>/ (the seeds stay as checked
# in); a crash leaves its input in build-fuzz/artifacts/<target>/ and the
# script exits 1 (turn it into a regression seed under tests/fuzz/ once
# fixed). Prints the executions each target ran.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60
if [ "${1:-}" = "--smoke" ]; then
  seconds=5
elif [ -n "${1:-}" ]; then
  seconds=$1
fi
./scripts/install-deps.sh >/dev/null
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
# Paths under the checkout are hashed relative to it, and the -g build's
# working directory not at all, so another clone or build directory of the
# same sources reuses ccache's objects.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
flags="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fsanitize=fuzzer-no-link"
flags="$flags -fno-sanitize-recover=undefined"
if [ ! -f "$BUILD/build.ninja" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=None \
    -DLOOM_FUZZ=ON -DCMAKE_CXX_FLAGS="$flags" >/dev/null
fi
ninja -C "$BUILD" -j "${JOBS:-$(nproc)}" loom_fuzzers >/dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=0
for seeds in tests/fuzz/*/; do
  name=$(basename "$seeds")
  if [ -n "${FUZZ_TARGETS:-}" ] && ! grep -qw -- "$name" <<<"$FUZZ_TARGETS"; then continue; fi
  bin="$BUILD/bin/loom_${name}_fuzz"
  corpus="$BUILD/corpus/$name"
  artifacts="$BUILD/artifacts/$name/"
  mkdir -p "$corpus" "$artifacts"
  log="$BUILD/fuzz-$name.log"
  if "$bin" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=3072 -print_final_stats=1 \
      -artifact_prefix="$artifacts" "$corpus" "$seeds" >"$log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed=1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  echo "fuzz: $name: ${execs:-?} executions in ${seconds}s, $status"
  if [ "$status" = FAILED ]; then
    grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$log" | sed -n 1,20p || true
    echo "(full log: $log)"
  fi
done
exit "$failed"

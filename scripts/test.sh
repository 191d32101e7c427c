#!/usr/bin/env bash
# README command 2: installs dependencies if missing, builds, runs every test
# (unit + integration) with ctest, then (with no ctest arguments) the LibTorch
# 2.6 compile check. Exit status: 0 when both pass.
#
#   ./scripts/test.sh [ctest args...]
#   ./scripts/test.sh --sanitize [ctest args...]
#       the unit tests (no integration, deploy or fuzz label) built with
#       AddressSanitizer + UndefinedBehaviorSanitizer and -Wall -Wextra, in
#       build-sanitize/ (LOOM_SANITIZE, LOOM_WARNINGS); the compiler's
#       warnings are left in build-sanitize/warnings.log.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --sanitize ]; then
  shift
  ./scripts/install-deps.sh
  BUILD_DIR=${BUILD_DIR:-build-sanitize}
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DLOOM_SANITIZE=ON -DLOOM_WARNINGS=ON
  fi
  # The unit tests and what they run (loom-ckpt, for the catalog's verifier).
  mapfile -t targets < <(ninja -C "$BUILD_DIR" -t targets all |
                           grep -oE '^loom_[a-z0-9_]+_test(:|$)' | tr -d : | sort -u)
  # Compiler output (its warnings) kept for the note; a failed build fails.
  ninja -C "$BUILD_DIR" -j "${JOBS:-$(nproc)}" loom-ckpt "${targets[@]}" 2>&1 |
    tee "$BUILD_DIR/build.log"
  grep -E 'warning:' "$BUILD_DIR/build.log" | sort -u > "$BUILD_DIR/warnings.log" || true
  echo "test.sh: $(wc -l < "$BUILD_DIR/warnings.log") distinct warning line(s) in $BUILD_DIR/warnings.log"
  cd "$BUILD_DIR"
  # Leaks in the uninstrumented libraries' one-time state are not Loom's:
  # tests/sanitizer/lsan.supp names them.
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
  export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/../tests/sanitizer/lsan.supp:print_suppressions=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  # loom_host_allocator_test is left out: it checks glibc malloc's tuning
  # (mallopt, mallinfo2), which ASan replaces with its own allocator.
  ctest --output-on-failure -j "${CTEST_JOBS:-2}" -LE 'integration|heavy|deploy|fuzz' \
    -E '^loom_host_allocator_test$' "$@"
  exit
fi
# Deploy tests (label "deploy") need podman, debootstrap, Node.js and pinned
# npm tools on top of the build dependencies.
./scripts/install-deploy-deps.sh
./scripts/build.sh
build_dir=${BUILD_DIR:-build}
# Integration tests start several processes each; two at a time fits 2 cores.
status=0
(cd "$build_dir" && ctest --output-on-failure -j "${CTEST_JOBS:-2}" "$@") || status=$?
# The whole run (no ctest arguments) also compiles every translation unit
# that includes LibTorch against Debian 13's LibTorch 2.6, CPU and CUDA
# headers (scripts/check-torch2.sh: ~15 MB downloaded once into
# ~/.cache/loom/torch2, ~1 GB more where no CUDA toolkit is installed).
# After ctest, not beside it: its compiles would slow the timed tests.
if [ $# -eq 0 ] && [ "${LOOM_SKIP_TORCH2_CHECK:-0}" != 1 ]; then
  ./scripts/check-torch2.sh -j "${JOBS:-$(nproc)}" "$build_dir" || status=1
fi
exit "$status"

#!/usr/bin/env bash
# README command 2: installs dependencies if missing, builds, runs every test
# (unit + integration) with ctest. Exit status is ctest's.
set -euo pipefail
cd "$(dirname "$0")/.."
# Deploy tests (label "deploy") need podman, debootstrap, Node.js and pinned
# npm tools on top of the build dependencies.
./scripts/install-deploy-deps.sh
./scripts/build.sh
cd "${BUILD_DIR:-build}"
# Integration tests start several processes each; two at a time fits 2 cores.
ctest --output-on-failure -j "${CTEST_JOBS:-2}" "$@"

#!/usr/bin/env bash
# Builds Loom's CPU container images with podman from the project's own build:
#   localhost/loom-base:bookworm     debootstrap --variant=minbase bookworm,
#                                    made once and reused (no registry needed)
#   localhost/loom-controller:TAG    deploy/docker/controller.Containerfile
#   localhost/loom-worker:TAG        deploy/docker/worker.Containerfile
#   localhost/loom-postgres:TAG      deploy/docker/postgres.Containerfile (the
#                                    ha overlay's database)
# The binaries come from $BUILD_DIR/bin (built first unless
# LOOM_IMAGES_NO_BUILD=1, which the ctest tests set). Idempotent: unchanged
# binaries reuse every cached layer.
# Env: BUILD_DIR (build), LOOM_IMAGE_TAG (dev), DEBIAN_MIRROR (default: the
#      mirror this machine's apt uses, scripts/apt-mirror.sh),
#      LOOM_REBUILD_BASE=1 remakes the base.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/podman-env.sh
loom_require_root_mount || exit 1
BUILD_DIR=${BUILD_DIR:-build}
TAG=${LOOM_IMAGE_TAG:-dev}
BASE=localhost/loom-base:bookworm
MIRROR=""  # taken from apt's configuration only when the base is made
BINS=(loom-controller loom-worker loom-rank loom-ckpt loomctl loom-probe loom-sentencepiece)
log() { echo "build-images: $*"; }

if [ "${LOOM_IMAGES_NO_BUILD:-0}" != 1 ]; then
  ./scripts/build.sh "${BINS[@]}"
fi
for b in "${BINS[@]}"; do
  [ -x "$BUILD_DIR/bin/$b" ] || { echo "build-images: $BUILD_DIR/bin/$b missing (run scripts/build.sh)" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ "${LOOM_REBUILD_BASE:-0}" = 1 ] || ! podman image exists "$BASE"; then
  MIRROR=$(scripts/apt-mirror.sh)
  log "making $BASE with debootstrap --variant=minbase from $MIRROR"
  start=$SECONDS
  debootstrap --variant=minbase bookworm "$work/rootfs" "$MIRROR" > "$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb "$work/rootfs/var/lib/apt/lists/"*
  tar -C "$work/rootfs" -c . |
    podman import --quiet --change 'CMD ["/bin/bash"]' \
      --change "LABEL org.opencontainers.image.title=loom-base io.loom.base=debootstrap-minbase-bookworm" \
      - "$BASE" > /dev/null
  rm -rf "$work/rootfs"
  log "$BASE made in $((SECONDS - start)) s"
else
  log "$BASE present (LOOM_REBUILD_BASE=1 remakes it)"
fi

mkdir -p "$work/ctx/bin"
for b in "${BINS[@]}"; do cp "$BUILD_DIR/bin/$b" "$work/ctx/bin/"; done
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ -n "$(git status --porcelain 2>/dev/null | sed -n 1p)" ]; then revision="$revision-dirty"; fi
# The database image of the Kubernetes ha overlay needs no binary
# of ours, only its entrypoint.
cp deploy/docker/postgres-entrypoint.sh "$work/ctx/"
for image in controller worker postgres; do
  start=$SECONDS
  podman build --quiet --network=host --format docker --layers \
    --build-arg BASE="$BASE" \
    --build-arg VERSION="$TAG" --build-arg REVISION="$revision" \
    --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    -f "deploy/docker/$image.Containerfile" -t "localhost/loom-$image:$TAG" "$work/ctx" > "$work/id"
  log "localhost/loom-$image:$TAG $(cut -c1-12 "$work/id") in $((SECONDS - start)) s"
done
# Earlier builds of the same tags leave untagged images behind.
podman image prune -f > /dev/null
podman images --filter reference='localhost/loom-*' --format '{{.Repository}}:{{.Tag}} {{.Size}}'

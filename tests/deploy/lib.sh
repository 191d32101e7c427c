# Helpers shared by Loom's deploy tests (sourced). Each test is a bash script
# run by ctest with LOOM_BIN_DIR (the build's bin/) and LOOM_SOURCE_DIR set;
# it prints what it checks and exits non-zero on the first failure.
set -euo pipefail
: "${LOOM_SOURCE_DIR:?}" "${LOOM_BIN_DIR:?}"
source "$LOOM_SOURCE_DIR/scripts/podman-env.sh"
TAG=${LOOM_IMAGE_TAG:-dev}

say() { echo "[$(date +%H:%M:%S)] $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

# A TCP port on 127.0.0.1 that nothing listens on (and that we have not
# handed out before in this test). Racy in principle; the ports come from a
# range the kernel does not hand out as ephemeral ports (32768-60999).
declare -A _loom_ports_taken=()
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 12000))
    [ -n "${_loom_ports_taken[$p]:-}" ] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      _loom_ports_taken[$p]=1
      echo "$p"
      return 0
    fi
  done
  fail "no free port"
}

# poll SECONDS COMMAND...: runs COMMAND every 0.5 s until it succeeds
# (status 0) or SECONDS pass (status 1).
poll() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" > /dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.5
  done
}

# wait_for SECONDS DESCRIPTION COMMAND...: poll, failing the test on timeout.
wait_for() {
  local secs=$1 what=$2
  shift 2
  poll "$secs" "$@" || fail "timed out after ${secs} s waiting for $what"
}

http_get() {  # http_get HOST:PORT PATH -> body on stdout
  local host=${1%:*} port=${1##*:}
  exec 3<>"/dev/tcp/$host/$port"
  printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$2" "$1" >&3
  sed '1,/^\r$/d' <&3
  exec 3>&-
}

# healthy CONTAINER [NAME=VALUE...]: runs CONTAINER's HEALTHCHECK command as
# the runtime would, in a new container of the same image, user and host
# network, with the environment given (what the container was started
# with); its exit status. Not `podman healthcheck run`, which execs into the
# container: in a chroot, runc's exec lands in the host's root instead of
# the container's.
healthy() {
  local c=$1 image cmd kind
  shift
  image=$(podman inspect "$c" --format '{{.ImageName}}')
  kind=$(podman inspect "$c" --format '{{index .Config.Healthcheck.Test 0}}')
  [ "$kind" = CMD-SHELL ] || fail "$c: HEALTHCHECK is $kind, expected CMD-SHELL"
  cmd=$(podman inspect "$c" --format '{{index .Config.Healthcheck.Test 1}}')
  local env=()
  for e in "$@"; do env+=(-e "$e"); done
  podman run --rm --network=host "${env[@]}" --entrypoint /bin/sh "$image" -c "$cmd"
}

# in_image IMAGE COMMAND: runs COMMAND with /bin/sh in a new container of
# IMAGE as its user (see healthy for why not podman exec).
in_image() {
  podman run --rm --entrypoint /bin/sh "$1" -c "$2"
}

# require_image NAME: localhost/loom-NAME:$TAG exists.
require_image() {
  podman image exists "localhost/loom-$1:$TAG" ||
    fail "localhost/loom-$1:$TAG missing: the loom_deploy_images test (scripts/build-images.sh) builds it"
}

require_images() {
  loom_require_root_mount || fail "podman cannot run containers in this environment"
  for i in controller worker; do
    podman image exists "localhost/loom-$i:$TAG" ||
      fail "localhost/loom-$i:$TAG missing: the loom_deploy_images test (scripts/build-images.sh) builds it"
  done
}

# A users file the controller's uid (10001) can read, mode 0600, listing
# "ops" as an admin, and ops's token for loomctl on the host.
make_users() {  # make_users DIR -> DIR/users, DIR/user-token
  local token
  token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  printf '%s\n' "$token" > "$1/user-token"
  chmod 600 "$1/user-token"
  printf 'ops admin sha256:%s\n' "$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)" > "$1/users"
  chmod 600 "$1/users"
  chown 10001:10001 "$1/users"
}

# The workers' token, which the containers' uid (10001) can read, mode 0600.
make_token() {  # make_token DIR -> DIR/token
  mkdir -p "$1"
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$1/token"
  chmod 600 "$1/token"
  chown 10001:10001 "$1/token"
}

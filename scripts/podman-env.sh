# Sourced by Loom's image and manifest scripts: the podman settings this
# project's machines need (see deploy/podman/containers.conf). An operator's
# own CONTAINERS_CONF wins.
export CONTAINERS_CONF=${CONTAINERS_CONF:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/deploy/podman/containers.conf}

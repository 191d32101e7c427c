# Sourced by Loom's image and manifest scripts: the podman settings this
# project's machines need (see deploy/podman/containers.conf). An operator's
# own CONTAINERS_CONF wins.
export CONTAINERS_CONF=${CONTAINERS_CONF:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/deploy/podman/containers.conf}

# podman can unpack image layers and start containers only where / is a
# mount point: containers/storage makes / private (remount with MS_REC|
# MS_PRIVATE) before it untars a layer, and runc pivot_root()s into the
# container. Inside a plain chroot / is not a mount point and both fail
# ("processing tar file(remount /, flags: 0x44000: invalid argument)").
# Every machine, VM and container has / mounted; a chroot has it when its
# directory is bind-mounted onto itself (mount --bind DIR DIR) before
# entering it.
loom_require_root_mount() {
  if ! mountpoint -q /; then
    echo "podman cannot run here: / is not a mount point (a chroot whose directory is not" \
         "a mount). Run on a machine, VM or container, or enter the chroot after" \
         "'mount --bind DIR DIR'." >&2
    return 1
  fi
}

#!/bin/sh
# Run under `rdmx-ibv exec` (inside its private mount namespace): shows the device's sysfs
# tree, which the launcher writes for libibverbs under $SYSFS_PATH, at
# /sys/class/infiniband too, then runs "$@". rdma-core's tests read a few files there
# directly (tests/utils.py get_pkey_from_kernel: `cat /sys/class/infiniband/DEV/ports/1/
# pkeys/0`), as they may with a kernel device. sysfs has no infiniband class on a kernel
# without RDMA and no directory can be made in it, so /sys/class becomes a tmpfs holding
# bind mounts of every host class plus infiniband. Nothing leaves the namespace.
set -eu
[ -n "${SYSFS_PATH:-}" ] && [ -d "$SYSFS_PATH/class/infiniband" ] \
  || { echo "sysview.sh: run under rdmx-ibv exec (no SYSFS_PATH tree)" >&2; exit 2; }
if [ ! -d /sys/class/infiniband ]; then
  host=/dev/rdmx-ibv/host-sys-class
  mkdir -p "$host"
  mount --bind /sys/class "$host"
  mount -t tmpfs -o mode=755 rdmx-sys-class /sys/class
  for c in "$host"/*; do
    name=$(basename "$c")
    mkdir "/sys/class/$name"
    mount --bind "$c" "/sys/class/$name"
  done
  mkdir /sys/class/infiniband
  mount --bind "$SYSFS_PATH/class/infiniband" /sys/class/infiniband
fi
exec "$@"

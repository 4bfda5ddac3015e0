#!/usr/bin/env bash
# Installs the Debian packages rdmx's build and tests need. Idempotent: packages already
# present are skipped, and apt is only touched when something is missing.
set -euo pipefail

PKGS=(
  build-essential pkg-config       # cc for ffi-tests, pkg-config for rdmx.pc
  libibverbs-dev librdmacm-dev     # rdma-sys (feature "verbs") links these
  libclang-dev clang               # bindgen (rdma-sys) needs libclang
  valgrind                         # ffi-tests under valgrind
  iproute2 nftables iptables       # network namespaces, veth, black-hole rules (failover tests)
  ethtool                          # GSO test: software segmentation on lo in a namespace
  tshark tcpdump                   # capture check: decode the soft provider as RRoCE
  ucx-utils                        # ucx_perftest, the send_bw comparison in bench/soft.sh
  ibverbs-utils perftest           # rdmx-ibv: unmodified verbs programs (ibv_devinfo, ibv_rc_pingpong, ib_*_bw/lat)
  rdmacm-utils                     # rdmx-ibv: the connection manager's tools (rping, ucmatose, udaddy)
  cmake ninja-build                # rdmx-ibv: configure the vendored rdma-core headers for the ABI layout test
  util-linux                       # rdmx-ibv: unshare(1)/mount(8) used by the launcher's tests' checks
  ceph-mon ceph-osd ceph-mgr ceph-common  # ceph-harness/: a real Ceph cluster (async+rdma over rdmx-ibv, async+posix)
  fio                              # ceph-harness/: fio's rados engine (4K random read/write, verify)
  python3-matplotlib               # ceph-harness/: IOPS-over-time PNGs (failover, RNR storm); rdmx-perf tune --plot
  uuid-runtime                     # ceph-harness/: uuidgen for the cluster fsid and OSD uuids
  python3-pyverbs python3-pip      # rdmx-ibv/pyverbs/: rdma-core's Python tests on rdmx0 (pyverbs 44)
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# Wait up to 10 minutes for the dpkg lock when another apt/dpkg (unattended-upgrades, a
# second install) runs, instead of failing at once.
APT=(apt-get -o DPkg::Lock::Timeout=600)

# while_locked CMD...: runs CMD; while it fails because another apt, dpkg or debconf holds a
# lock that DPkg::Lock::Timeout does not cover (apt-get update's lists lock on older apt, the
# debconf database), says so, waits and retries, for up to 10 minutes. Other failures are
# returned at once. CMD's stdout passes through; its stderr is shown.
while_locked() {
  local err status
  for _ in $(seq 60); do
    status=0
    err=$({ "$@" 2>&1 1>&3 3>&-; } 3>&1) || status=$?
    [ -n "$err" ] && echo "$err" >&2
    [ "$status" -eq 0 ] && return 0
    case "$err" in
      *"Could not get lock"* | *"Unable to lock"* | *"is locked by another process"*)
        echo "install-deps: another package manager holds a lock; retrying in 10 s" >&2
        sleep 10
        ;;
      *) return "$status" ;;
    esac
  done
  return "$status"
}

# tshark asks whether non-root users may capture; answer for it.
preseed() {
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
}

if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  while_locked preseed
  echo "install-deps: apt-get update"
  while_locked $SUDO "${APT[@]}" update -qq
  echo "install-deps: apt-get install"
  while_locked $SUDO "${APT[@]}" install -y -q --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all system packages present"
fi

# Rust components used by the test command.
if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi

# --- block IO (fio/, docs/block.md) -------------------------------------------------------
# fio runs the rdmx ioengine's tests (fio/test.sh); nbdkit is fio/bench.sh's TCP baseline;
# dpkg-dev's dpkg-source unpacks fio's Debian source, from which fio/fio-src.sh builds the
# configured tree the engine compiles against (Debian ships no fio-dev).
BLK_PKGS=(fio nbdkit dpkg-dev)
blk_missing=()
for p in "${BLK_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || blk_missing+=("$p")
done
if [ "${#blk_missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${blk_missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  while_locked $SUDO "${APT[@]}" update -qq
  while_locked $SUDO "${APT[@]}" install -y -q --no-install-recommends "${blk_missing[@]}"
fi
"$(cd "$(dirname "$0")/.." && pwd)/fio/fio-src.sh" >/dev/null

# --- rdma-core's Python tests (rdmx-ibv/pyverbs/run.sh, docs/ibv-device.md) ---------------
# The tests are in no Debian package; the PyPI sdist of pyverbs 57.0 carries rdma-core's
# whole tree, tests/ included. Cached outside the repository (never committed), checked
# against the digest it had when the runner's expected list was made.
PYVERBS_VERSION=57.0
PYVERBS_SHA256=6d3a452bf14b8c56dec9281d64101573a7574bc879471bf0d3521168755ca9fe
pyverbs_cache=${PYVERBS_SDIST_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rdmx-pyverbs}
pyverbs_sdist="$pyverbs_cache/pyverbs-$PYVERBS_VERSION.tar.gz"
if ! echo "$PYVERBS_SHA256  $pyverbs_sdist" | sha256sum -c --status 2>/dev/null; then
  echo "install-deps: fetching the pyverbs $PYVERBS_VERSION sdist (rdma-core's tests) into $pyverbs_cache"
  mkdir -p "$pyverbs_cache"
  rm -f "$pyverbs_sdist"
  /usr/bin/python3 -m pip download --quiet --no-deps --no-binary pyverbs \
    -d "$pyverbs_cache" "pyverbs==$PYVERBS_VERSION"
  echo "$PYVERBS_SHA256  $pyverbs_sdist" | sha256sum -c --quiet
fi

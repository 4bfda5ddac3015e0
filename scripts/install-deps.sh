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
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  # tshark asks whether non-root users may capture; answer for it.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all system packages present"
fi

# Rust components used by the test command.
if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi

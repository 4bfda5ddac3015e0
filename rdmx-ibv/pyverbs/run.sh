#!/usr/bin/env bash
# rdma-core's own Python tests (tests/ of rdma-core v57, from the PyPI `pyverbs` sdist that
# scripts/install-deps.sh caches) on the device rdmx0, under `rdmx-ibv exec`, with Debian's
# pyverbs 44. Prints pass/fail/skip per test file; exits non-zero on any failure that is not
# on expected.tsv (version gap, needs UD, needs the connection manager). See
# docs/ibv-device.md, "rdma-core's tests".
#
#   rdmx-ibv/pyverbs/run.sh [--bin PATH/rdmx-ibv] [-v] [--only test_x.py]...
#
# The binary defaults to target/debug/rdmx-ibv (`cargo build -p rdmx-ibv` builds it and the
# provider library next to it). The sdist is looked for in $PYVERBS_SDIST_DIR (default
# ~/.cache/rdmx-pyverbs); the tests are unpacked into a temporary directory, never into
# the repository.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin="$root/target/debug/rdmx-ibv"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
version=57.0
cache=${PYVERBS_SDIST_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rdmx-pyverbs}
sdist="$cache/pyverbs-$version.tar.gz"
[ -x "$bin" ] || { echo "pyverbs tests: $bin missing: cargo build -p rdmx-ibv" >&2; exit 2; }
[ -f "$sdist" ] || { echo "pyverbs tests: $sdist missing: scripts/install-deps.sh fetches it" >&2; exit 2; }
/usr/bin/python3 -c 'import pyverbs.device' 2>/dev/null \
  || { echo "pyverbs tests: Debian's python3-pyverbs is not installed (scripts/install-deps.sh)" >&2; exit 2; }

work=$(mktemp -d /tmp/rdmx-pyverbs.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar -xzf "$sdist" -C "$work" "pyverbs-$version/rdma-core/tests"
tests="$work/pyverbs-$version/rdma-core/tests"

# One address per run (RoCEv2's port is fixed: one receiver per IP), from a /24 no other
# test uses, varied by pid so that two runs on one host do not collide.
ip="127.0.28.$(( $$ % 250 + 2 ))"
# Each test file gets 300 s (run.py); the whole run is bounded too. Not `exec`: the trap
# removes the unpacked tests afterwards.
timeout -k 10 1800 "$bin" exec --ip "$ip" -- \
  "$here/sysview.sh" env PATH="$here:$PATH" /usr/bin/python3 "$here/run.py" \
  "$tests" "$here/expected.tsv" "${args[@]}"

#!/usr/bin/env bash
# The README's test command: installs what is needed, then runs every check CI runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

"$root/scripts/install-deps.sh"

# Every test that needs something of the host (network namespaces, nftables, tc, IPv6,
# CAP_NET_RAW, tshark/tcpdump, user namespaces) fails instead of skipping when it is
# missing: a passing run ran every case (tests/require/mod.rs, scripts/require.sh,
# ffi-tests/require.h). RDMX_TEST_REQUIRE= (empty) turns that off: skips, printed.
export RDMX_TEST_REQUIRE=${RDMX_TEST_REQUIRE-all}

# Each step's wall time, printed as the next starts and summed up at the end: CI has 90
# minutes and should stay well under 30, so the log says where the time goes.
STEP_NAME="install-deps.sh"
STEP_START=$SECONDS
STEP_TIMES=()
step_done() { STEP_TIMES+=("$(printf '%5d s  %s' $((SECONDS - STEP_START)) "$STEP_NAME")"); }
step() {
  step_done
  STEP_NAME=$*
  STEP_START=$SECONDS
  echo; echo "==== $* (at $((SECONDS / 60)) min $((SECONDS % 60)) s)"
}

step "cargo fmt --check"
cargo fmt --all --check

# The workspace: the library (rdmx), the benchmark tool (rdmx-perf/) and the libibverbs
# device (rdmx-ibv/: its tests run unmodified verbs programs, ibv_devinfo/ibv_rc_pingpong/
# perftest, through `rdmx-ibv exec`). fuzz/ has its own workspace; its driver runs here as
# tests/rc_fuzz_state.rs.
step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

# `cargo build` too: the tests of rdmx-ibv load the provider library (cdylib
# target/debug/librdmx_ibv.so), which `cargo test` does not build.
step "cargo build --workspace; cargo test --workspace (build)"
cargo build --workspace
cargo test --workspace --no-run

step "cargo test --workspace"
cargo test --workspace --quiet

step "include/rdmx.h is fresh (build, then git diff --exit-code include/)"
cargo build --lib
if ! git diff --exit-code -- include/ || [ -n "$(git status --porcelain -- include/)" ]; then
  echo "include/ is stale or has untracked files: commit the regenerated header"
  git status --short -- include/
  exit 1
fi

# rdma-core's own Python tests (v57's tests/ on Debian's pyverbs 44) on rdmx0 under
# rdmx-ibv exec: pass/fail/skip per file; fails on any failure not on
# rdmx-ibv/pyverbs/expected.tsv (version gap, connection manager).
step "rdma-core's Python tests (rdmx-ibv/pyverbs/run.sh)"
"$root/rdmx-ibv/pyverbs/run.sh"

step "ffi-tests (C and C++ under ASan+UBSan and valgrind)"
"$root/ffi-tests/run.sh"

# --- block IO (fio/, docs/block.md) ------------------------------------------------------
step "fio over rdmx (fio/test.sh: job files with verify, loopback and two namespaces, killed target)"
"$root/fio/test.sh"

# A real Ceph cluster (Debian's ceph 16.2: 1 mon, 1 mgr, 3 memstore OSDs) on async+rdma,
# every daemon and client under rdmx-ibv exec: 10 s of fio randread with crc32c verify
# while an OSD is killed; fails on any IO error, hang (every step has a deadline) or
# daemon crash, or if rdmx's counters show no traffic. Under 3 minutes.
step "ceph-harness smoke (cargo build --release -p rdmx-ibv; ceph-harness/run.sh smoke)"
cargo build --release -p rdmx-ibv
# TERM at 240 s lets the harness stop the cluster from its trap; KILL 15 s later.
timeout -k 15 240 "$root/ceph-harness/run.sh" smoke

step_done
echo
echo "==== step times"
printf '%s\n' "${STEP_TIMES[@]}"
echo "==== all tests passed in $((SECONDS / 60)) min $((SECONDS % 60)) s"

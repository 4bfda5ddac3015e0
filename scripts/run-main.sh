#!/usr/bin/env bash
# The README's main-job command: installs what is needed, builds, and runs the main job: a
# 4K random-read benchmark (RDMA READ, queue depth 32) on the soft provider over loopback,
# server and client as two processes. Extra arguments go to the client, e.g.
#   ./scripts/run-main.sh --duration 10 --profile ceph-after --json
# Exit status: the client's (0 the run completed without errors, 1 it failed, 2 usage
# error), or 1 when the build or the server failed. With --json, stdout is the client's JSON
# object alone (progress and the table go to stderr), so `| jq` works.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
say() { echo "run-main: $*" >&2; }

say "checking system packages (scripts/install-deps.sh)"
"$root/scripts/install-deps.sh" >&2
say "building rdmx-perf (cargo build --release -p rdmx-perf)"
cargo build --release -p rdmx-perf
bin="${CARGO_TARGET_DIR:-$root/target}/release/rdmx-perf"
log=$(mktemp)
server=""
# Keeps the exit status of the run: stopping the server (killed: 143) must not replace it.
cleanup() {
  local status=$?
  if [ -n "$server" ]; then
    kill "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  rm -f "$log"
  exit "$status"
}
trap cleanup EXIT
say "starting rdmx-perf server on 127.0.0.1"
"$bin" server --listen 127.0.0.1:0 --set max_dest_rd_atomic=32 >"$log" 2>&1 &
server=$!
addr=""
for _ in $(seq 100); do
  addr=$(grep -o 'listening on [0-9.:]*' "$log" | awk '{print $3}') || true
  [ -n "$addr" ] && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.05
done
[ -n "$addr" ] || { say "the server did not start:"; cat "$log" >&2; exit 1; }
say "server on $addr; running read_bw for the main job"
"$bin" read_bw --connect "$addr" --size 4096 --qd 32 --duration 5 --set max_rd_atomic=32 "$@"

#!/usr/bin/env bash
# The README's main-job command: installs what is needed, builds, and runs the main job: a
# 4K random-read benchmark (RDMA READ, queue depth 32) on the soft provider over loopback,
# server and client as two processes. Extra arguments go to the client, e.g.
#   ./scripts/run-main.sh --duration 10 --profile ceph-after --json
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/install-deps.sh"
cargo build --release --quiet --bin rdmx-perf
bin="$root/target/release/rdmx-perf"
log=$(mktemp)
"$bin" server --listen 127.0.0.1:0 --set max_dest_rd_atomic=32 >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -f "$log"' EXIT
addr=""
for _ in $(seq 100); do
  addr=$(grep -o 'listening on [0-9.:]*' "$log" | awk '{print $3}') || true
  [ -n "$addr" ] && break
  sleep 0.05
done
[ -n "$addr" ] || { echo "run-main: the server did not start:"; cat "$log"; exit 1; }
"$bin" read_bw --connect "$addr" --size 4096 --qd 32 --duration 5 --set max_rd_atomic=32 "$@"

#!/usr/bin/env bash
# Engine benchmark: two RC engines in one process exchanging RDMA READs through an
# in-memory link, next to a bare copy of the same blocks; prints both rates and their
# ratio (target >= 0.5). Arguments go to `rdmx-perf engine_bench`, e.g.
#   bench/engine.sh --seconds 2 --qd 32 --size 4096 [--json]
# Honors CARGO_TARGET_DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cargo build --release --quiet -p rdmx-perf
exec "${CARGO_TARGET_DIR:-$root/target}/release/rdmx-perf" engine_bench "$@"

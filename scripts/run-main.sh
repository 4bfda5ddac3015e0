#!/usr/bin/env bash
# The README's main-job command: installs what is needed, builds, and runs the main job.
# Until the soft provider and its 4K random-read benchmark exist, the main job prints the
# effective configuration and the IB encoding tables (extra arguments go to rdmx-perf config).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/install-deps.sh"
cargo build --release --quiet --bin rdmx-perf
exec "$root/target/release/rdmx-perf" config "$@"

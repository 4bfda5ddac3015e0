#!/usr/bin/env bash
# rdmx soft provider: what idle connections cost a busy one on the same device.
#
#   bench/scale.sh               # DURATION=5 s per run, ROUNDS=2: about 1.5 min
#   DURATION=3 ROUNDS=3 bench/scale.sh
#   IDLE="0 100 1000 2000" bench/scale.sh
#
# read_bw 4K qd 32 (32 READs in flight, max_rd_atomic 32) on one connection while the same
# client context holds N more connections to the same server open and unused
# (`rdmx-perf read_bw --idle-conns N`), N in IDLE (default 0 100 1000), alternating N within
# each of ROUNDS rounds, one fresh server per run (port 0). The server runs with
# max_recv_wr=16 (read_bw posts no SENDs; its default 4096 receives per connection would
# cost every idle connection ~1 MB of work requests for nothing).
#
# Prints each run, the median per N, and the ratio (last N)/(first N) against the target:
# >= 0.8 (issue 16, item 7: a progress pass costs nothing per idle QP).
#
# TEST=rpc_lat bench/scale.sh: the messenger instead, rpc_lat 4K (one request at a time)
# on one session while the client holds N more sessions to the server open and idle
# (`rdmx-perf rpc_lat --idle-sessions N`); both messengers' passes go over every session.
# The ratio is reported without a target (1,000 idle sessions, 2026-12-02: 0.009 before
# the passes skipped quiet sessions, 287 against 32,424 requests/s; 0.21 after; about 0.95
# once idle sessions were parked, docs/messenger.md).
# Exits 0 when every run completed without errors (a missed ratio is reported as BELOW),
# non-zero otherwise.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-2}
IDLE=${IDLE:-0 100 1000}
TEST=${TEST:-read_bw}
case $TEST in
    read_bw | rpc_lat) ;;
    *) echo "bench/scale.sh: TEST is read_bw or rpc_lat, not '$TEST'" >&2; exit 2 ;;
esac
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET_DIR/release/rdmx-perf
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/rdmx-scale-bench.XXXXXX")
PIDS=()
FAILED=0

cleanup() {
    for p in "${PIDS[@]}"; do
        kill "$p" 2>/dev/null
    done
    for p in "${PIDS[@]}"; do
        wait "$p" 2>/dev/null
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -z "${NO_BUILD:-}" ]; then
    echo "# building rdmx-perf (release)"
    if ! cargo build --release -p rdmx-perf; then
        echo "bench/scale.sh: build failed" >&2
        exit 2
    fi
fi

# Each connection holds a UDP socket and a TCP side channel on both sides (one process each).
max_idle=0
for n in $IDLE; do
    [ "$n" -gt "$max_idle" ] && max_idle=$n
done
need=$((2 * max_idle + 256))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
    ulimit -n "$need" 2>/dev/null || {
        echo "bench/scale.sh: $max_idle idle connections need ~$need fds; ulimit -n is $(ulimit -n)" >&2
        exit 2
    }
fi

# start, stop, field
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"


# run ROUND N: the test with N idle connections (sessions) against a fresh server; one row.
declare -A OPS
run() {
    local round=$1 n=$2 name="r$1-idle$2"
    local t0=$SECONDS
    if [ "$TEST" = read_bw ]; then
        start "$name" server --listen 127.0.0.1:0 --set max_dest_rd_atomic=32 --set max_recv_wr=16
        JSON=$(timeout $((DURATION * 3 + 120 + n / 10)) "$BIN" read_bw --connect "$ADDR" \
            --size 4096 --qd 32 --set max_rd_atomic=32 --idle-conns "$n" --duration "$DURATION" \
            --json 2>"$LOGDIR/$name.client.err" | tail -1)
    else
        start "$name" server --listen 127.0.0.1:0
        JSON=$(timeout $((DURATION * 3 + 120 + n / 10)) "$BIN" rpc_lat --connect "$ADDR" \
            --size 4096 --idle-sessions "$n" --duration "$DURATION" \
            --json 2>"$LOGDIR/$name.client.err" | tail -1)
    fi
    local rc=${PIPESTATUS[0]}
    local setup=$((SECONDS - t0))
    local rss
    rss=$(awk '/VmHWM/ { printf "%.0f", $2 / 1024 }' "/proc/$SERVER/status" 2>/dev/null)
    stop
    local ops
    ops=$(field "$JSON" ops_per_sec)
    if [ -z "$ops" ] || [ "$(field "$JSON" errors)" != "0" ]; then
        printf "  round %s  idle %5s  FAILED (exit %s): %s\n" "$round" "$n" "$rc" \
            "$(grep -m1 -i 'error\|idle conn' "$LOGDIR/$name.client.err" | cut -c1-400)"
        FAILED=1
        return 1
    fi
    printf "  round %s  idle %5s  %10.0f ops/s  %7.2f Gb/s  p50 %6s us  retransmits %-5s errors %s  (run+setup %3s s, server peak RSS %s MiB)\n" \
        "$round" "$n" "$ops" "$(field "$JSON" bw_gbit_per_sec)" "$(field "$JSON" lat_p50_us)" \
        "$(field "$JSON" retransmits)" "$(field "$JSON" errors)" "$setup" "${rss:-?}"
    OPS[$n]="${OPS[$n]:-} $ops"
}

if [ "$TEST" = read_bw ]; then
    what="read_bw 4K qd 32" idle_what="idle connections"
else
    what="rpc_lat 4K (messenger)" idle_what="idle sessions"
fi
echo "# $what beside N $idle_what (N in: $IDLE), $ROUNDS round(s) of $DURATION s runs; raw output in $LOGDIR"
for r in $(seq 1 "$ROUNDS"); do
    for n in $IDLE; do
        run "$r" "$n"
    done
done

echo
first="" last=""
for n in $IDLE; do
    # shellcheck disable=SC2086
    m=$(median_of ${OPS[$n]:-})
    printf "%s, %5s %s: %10s ops/s (median of %s)\n" "$what" "$n" "$idle_what" "${m:-FAILED}" \
        "$(wc -w <<<"${OPS[$n]:-}")"
    [ -z "$first" ] && { first=$n; FIRST=$m; }
    last=$n
    LAST=$m
done
if [ -n "${FIRST:-}" ] && [ -n "${LAST:-}" ] && [ "$first" != "$last" ]; then
    ratio=$(ratio "$LAST" "$FIRST")
    if [ "$TEST" = read_bw ]; then
        verdict=$(verdict "$ratio" 0.8 ">=")
        echo "ratio ${last} idle / ${first} idle: $LAST / $FIRST = $ratio (target >= 0.8): $verdict"
    else
        echo "ratio ${last} idle / ${first} idle: $LAST / $FIRST = $ratio (no target)"
    fi
fi
exit "$FAILED"

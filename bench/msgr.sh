#!/usr/bin/env bash
# The messenger against its baselines on 127.0.0.1 (soft provider), ratios from one run:
#
#   bench/msgr.sh              # DURATION=3 s per run, PAIRS=3 alternating pairs per target
#   PAIRS=5 DURATION=5 bench/msgr.sh
#
# 1. rpc_bw 4K, 32 outstanding (64-byte request, 4 KiB reply)  vs read_bw 4K qd 32   >= 0.8
# 2. rpc_lat 4K p50 (request to reply)                           vs read_lat 4K p50   <= 1.3
# 3. msg_bw 4K qd 32 msg/s                 vs ucx_perftest am_bw 4K over TCP (lo)    >= 1.5
# 4. what per-session rkeys cost (msgr_scoped_rkeys=true vs false on both sides, issue 27;
#    docs/security.md): rpc_bw 64K qd 32 (rendezvous: a READ window per reply), msg_bw 4K
#    qd 32 (eager writes: a WRITE window per granted receive); ratio on/off, no target
#    (the lead records the figures). SCOPE_ONLY=1 runs only this step.
#
# Each pair alternates A and B against a fresh server on fresh ports (this shared host drifts
# between minutes); the verdict is on the median of the per-pair ratios and every pair is
# printed. Exits 0 when every run completed (a missed target is reported as BELOW, not a
# failure), non-zero when a run failed. Servers are killed on exit.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DURATION=${DURATION:-3}
PAIRS=${PAIRS:-3}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET_DIR/release/rdmx-perf
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/rdmx-msgr-bench.XXXXXX")
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

echo "# building rdmx-perf (release)"
if ! cargo build --release --quiet -p rdmx-perf; then
    echo "bench/msgr.sh: build failed" >&2
    exit 2
fi
# shellcheck source=bench/lib.sh
. bench/lib.sh


CLIENT=(--duration "$DURATION" --size 4096)
echo "# rdmx-perf $("$BIN" config | sed -n 's/^# rdmx \([^:]*\):.*/\1/p' | head -1), runs of $DURATION s, $PAIRS pairs, logs in $LOGDIR"
header

# pairs NAME A_TEST B_TEST KEY QD: PAIRS pairs of (A, B) each against a fresh server; sets
# A_MED, B_MED, R_MED (median of the per-pair ratios A/B of KEY) and prints every pair.
pairs() {
    local name=$1 a=$2 b=$3 key=$4 qd=$5 p
    local ra=() rb=() rr=() ea=() eb=()
    for p in $(seq 1 "$PAIRS"); do
        start "srv.$name.$p" server --listen 127.0.0.1:0
        # Alternate which goes first.
        if [ $((p % 2)) = 1 ]; then
            run_json "$name.$a.$p" "$a" --connect "$ADDR" "${CLIENT[@]}" --qd "$qd"
            ra+=("$(field "$JSON" "$key")"); ea+=("$(field "$JSON" errors)")
            run_json "$name.$b.$p" "$b" --connect "$ADDR" "${CLIENT[@]}" --qd "$qd"
            rb+=("$(field "$JSON" "$key")"); eb+=("$(field "$JSON" errors)")
        else
            run_json "$name.$b.$p" "$b" --connect "$ADDR" "${CLIENT[@]}" --qd "$qd"
            rb+=("$(field "$JSON" "$key")"); eb+=("$(field "$JSON" errors)")
            run_json "$name.$a.$p" "$a" --connect "$ADDR" "${CLIENT[@]}" --qd "$qd"
            ra+=("$(field "$JSON" "$key")"); ea+=("$(field "$JSON" errors)")
        fi
        stop
        rr+=("$(ratio "${ra[-1]}" "${rb[-1]}")")
        echo "    pair $p: $a ${ra[-1]} (errors ${ea[-1]}), $b ${rb[-1]} (errors ${eb[-1]}), ratio ${rr[-1]}"
    done
    A_MED=$(median_of "${ra[@]}")
    B_MED=$(median_of "${rb[@]}")
    R_MED=$(median_of "${rr[@]}")
}

# scope_pairs NAME TEST SIZE: PAIRS pairs of TEST at SIZE, qd 32, with msgr_scoped_rkeys on
# and off (server and client alike, order alternating), each against a fresh server; sets
# A_MED (on), B_MED (off), R_MED (median of the per-pair ratios on/off of ops/s).
scope_pairs() {
    local name=$1 test=$2 size=$3 p mode
    local ra=() rb=() rr=()
    for p in $(seq 1 "$PAIRS"); do
        local order=(true false)
        [ $((p % 2)) = 0 ] && order=(false true)
        for mode in "${order[@]}"; do
            start "srv.$name.$mode.$p" server --listen 127.0.0.1:0 --set "msgr_scoped_rkeys=$mode"
            run_json "$name.$mode.$p" "$test" --connect "$ADDR" --duration "$DURATION" \
                --size "$size" --qd 32 --set "msgr_scoped_rkeys=$mode"
            stop
            if [ "$mode" = true ]; then ra+=("$(field "$JSON" ops_per_sec)"); else rb+=("$(field "$JSON" ops_per_sec)"); fi
        done
        rr+=("$(ratio "${ra[-1]}" "${rb[-1]}")")
        echo "    pair $p: scoped ${ra[-1]}, unscoped ${rb[-1]} ops/s, ratio ${rr[-1]}"
    done
    A_MED=$(median_of "${ra[@]}")
    B_MED=$(median_of "${rb[@]}")
    R_MED=$(median_of "${rr[@]}")
}

if [ "${SCOPE_ONLY:-0}" != 1 ]; then
# 1. rpc_bw vs read_bw at 32 outstanding.
pairs rpcbw rpc_bw read_bw ops_per_sec 32
line "1 rpc_bw 4K qd32 ops/s vs read_bw qd32" "$A_MED" "$B_MED" "$R_MED" ">= 0.8" "$(verdict "$R_MED" 0.8 ge)"

# 2. rpc_lat p50 vs read_lat p50.
pairs rpclat rpc_lat read_lat lat_p50_us 1
line "2 rpc_lat 4K p50 us vs read_lat p50" "$A_MED" "$B_MED" "$R_MED" "<= 1.3" "$(verdict "$R_MED" 1.3 le)"

# 3. msg_bw vs ucx_perftest am_bw over TCP, alternating, fresh ports.
MSG=()
UCX=()
RATIOS=()
UCX_WHY=""
command -v ucx_perftest >/dev/null 2>&1 || UCX_WHY="ucx_perftest not installed (Debian: ucx-utils)"
# am_bw over TCP runs at a few thousand 4K messages/s here: iterations for about DURATION s.
UCX_ITERS=${UCX_ITERS:-$((3000 * DURATION))}
for p in $(seq 1 "$PAIRS"); do
    start "srv.msgbw.$p" server --listen 127.0.0.1:0
    run_json "msg_bw.$p" msg_bw --connect "$ADDR" "${CLIENT[@]}" --qd 32
    MSG+=("$(field "$JSON" ops_per_sec)")
    stop
    U=""
    if [ -z "$UCX_WHY" ]; then
        UCX_PORT=$((20000 + RANDOM % 20000))
        timeout $((DURATION * 10 + 30)) ucx_perftest -p "$UCX_PORT" -x tcp -d lo >"$LOGDIR/ucx_server.$p.out" 2>&1 &
        UCX_SERVER=$!
        PIDS+=("$UCX_SERVER")
        sleep 0.5
        if timeout $((DURATION * 10 + 25)) ucx_perftest 127.0.0.1 -p "$UCX_PORT" -x tcp -d lo \
            -t am_bw -s 4096 -w 1000 -n "$UCX_ITERS" >"$LOGDIR/ucx_client.$p.out" 2>&1; then
            # "Final: iterations p50 avg overall MB/s-avg MB/s-overall msg/s-avg msg/s-overall"
            U=$(awk '/^Final:/ { print $NF }' "$LOGDIR/ucx_client.$p.out" | tail -1)
            [ -z "$U" ] && UCX_WHY="no 'Final:' line ($LOGDIR/ucx_client.$p.out)"
        else
            UCX_WHY="ucx_perftest failed: $(tail -2 "$LOGDIR/ucx_client.$p.out" | tr '\n' ' ')"
        fi
        kill "$UCX_SERVER" 2>/dev/null
        wait "$UCX_SERVER" 2>/dev/null
    fi
    UCX+=("${U:-n/a}")
    RATIOS+=("$(ratio "${MSG[-1]}" "$U")")
    echo "    pair $p: msg_bw ${MSG[-1]}, ucx am_bw ${U:-n/a}, ratio ${RATIOS[-1]}"
done
if [ -z "$UCX_WHY" ]; then
    R=$(median_of "${RATIOS[@]}")
    line "3 msg_bw 4K qd32 msg/s vs ucx am_bw tcp" "$(median_of "${MSG[@]}")" "$(median_of "${UCX[@]}")" "$R" ">= 1.5" "$(verdict "$R" 1.5 ge)"
else
    line "3 msg_bw 4K qd32 msg/s vs ucx am_bw tcp" "$(median_of "${MSG[@]}")" "skipped" "n/a" ">= 1.5" "SKIPPED"
    echo "    ucx skipped: $UCX_WHY"
fi

fi

# 4. per-session rkeys (windows) on vs off.
scope_pairs scoperpc rpc_bw 65536
line "4a rpc_bw 64K qd32 ops/s scoped vs not" "$A_MED" "$B_MED" "$R_MED" "report" "-"
scope_pairs scopemsg msg_bw 4096
line "4b msg_bw 4K qd32 ops/s scoped vs not" "$A_MED" "$B_MED" "$R_MED" "report" "-"

echo
echo "# summary (medians of $PAIRS alternating pairs, $DURATION s runs)"
header
printf '%s\n' "${LINES[@]}"
[ "$FAILED" = 0 ] || { echo "bench/msgr.sh: $FAILED run(s) failed (logs in $LOGDIR)" >&2; exit 1; }

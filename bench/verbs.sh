#!/usr/bin/env bash
# The verbs provider's cost over the soft provider, one script run (issue 15, point 7):
# `rdmx-perf read_bw` and `read_lat` with provider=verbs, each side under `rdmx-ibv exec`
# (rdmx verbs -> libibverbs -> rdmx0 -> the soft transport) on loopback addresses of its
# own, against the same tool with provider=soft. Runs alternate (soft, verbs, soft, ...);
# medians are compared.
#
#   bench/verbs.sh                    # ROUNDS=3 alternating rounds, DURATION=5 s per run
#   ROUNDS=5 DURATION=3 bench/verbs.sh
#
# 1. read_bw --size 4096 --qd 32, ops/s: verbs / soft                        >= 0.8
# 2. read_lat --size 4096, p50: verbs / soft                                 <= 1.25
# Exits 0 when every run produced its figure (a missed target is reported as BELOW, not a
# failure), non-zero when a run failed. Servers are killed on exit.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
BIN=$TARGET_DIR/release/rdmx-perf
IBV=$TARGET_DIR/release/rdmx-ibv
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/rdmx-verbs-bench.XXXXXX")
PIDS=()
FAILED=0

cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "# building rdmx-perf and rdmx-ibv (release)"
if ! cargo build --release --quiet -p rdmx-perf -p rdmx-ibv; then
    echo "bench/verbs.sh: build failed" >&2
    exit 2
fi
source "$ROOT/bench/lib.sh"

# run PROVIDER TEST: server and client of rdmx-perf; on verbs each under `rdmx-ibv exec`
# with an address of its own. Prints the client's JSON line.
run() {
    local provider=$1 test=$2
    local extra=()
    [ "$test" = read_bw ] && extra=(--qd 32)
    fresh_endpoints
    local srv=() cli=()
    if [ "$provider" = verbs ]; then
        srv=("$IBV" exec --ip "$SRV_IP" --set provider=verbs --)
        cli=("$IBV" exec --ip "$CLI_IP" --set provider=verbs --)
    fi
    local name="$provider-$test-$PORT"
    RDMX_PROVIDER=$provider "${srv[@]}" "$BIN" server --listen "127.0.0.1:$PORT" \
        >"$LOGDIR/$name.out" 2>"$LOGDIR/$name.err" &
    local pid=$!
    PIDS+=("$pid")
    for _ in $(seq 1 200); do
        grep -q "listening on" "$LOGDIR/$name.out" 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    local out
    out=$(RDMX_PROVIDER=$provider timeout -s KILL $((DURATION + 30)) "${cli[@]}" "$BIN" "$test" \
        --connect "127.0.0.1:$PORT" --size 4096 "${extra[@]}" --duration "$DURATION" --json \
        2>"$LOGDIR/$name.client.err")
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    local p
    p=$(sed -n 's/.*"provider":"\([a-z]*\)".*/\1/p' <<<"$out")
    if [ "$p" != "$provider" ]; then
        echo "bench/verbs.sh: $name ran on '$p', not $provider; logs in $LOGDIR" >&2
        tail -3 "$LOGDIR/$name.client.err" >&2
        FAILED=1
    fi
    echo "$out"
}


echo "# $ROUNDS alternating rounds, $DURATION s each; logs in $LOGDIR"
SB=() VB=() SL=() VL=()
for r in $(seq 1 "$ROUNDS"); do
    SB+=("$(field "$(run soft read_bw)" ops_per_sec)")
    VB+=("$(field "$(run verbs read_bw)" ops_per_sec)")
    SL+=("$(field "$(run soft read_lat)" lat_p50_us)")
    VL+=("$(field "$(run verbs read_lat)" lat_p50_us)")
    echo "round $r: read_bw soft ${SB[-1]} verbs ${VB[-1]} ops/s; read_lat p50 soft ${SL[-1]} verbs ${VL[-1]} us"
done
sb=$(printf '%s\n' "${SB[@]}" | median)
vb=$(printf '%s\n' "${VB[@]}" | median)
sl=$(printf '%s\n' "${SL[@]}" | median)
vl=$(printf '%s\n' "${VL[@]}" | median)
if [ -n "$sb" ] && [ -n "$vb" ] && [ -n "$sl" ] && [ -n "$vl" ]; then
    rb=$(awk -v a="$vb" -v b="$sb" 'BEGIN { printf "%.3f", a / b }')
    rl=$(awk -v a="$vl" -v b="$sl" 'BEGIN { printf "%.3f", a / b }')
    printf '\n%-44s %12s %12s %7s %s\n' "medians of $ROUNDS rounds" verbs soft ratio target
    printf '%-44s %12.0f %12.0f %7s >= 0.8 %s\n' "1. read_bw --size 4096 --qd 32 (ops/s)" "$vb" "$sb" "$rb" "$(verdict "$rb" 0.8 '>=')"
    printf '%-44s %12.2f %12.2f %7s <= 1.25 %s\n' "2. read_lat --size 4096 p50 (us)" "$vl" "$sl" "$rl" "$(verdict "$rl" 1.25 '<=')"
else
    FAILED=1
fi
exit $FAILED

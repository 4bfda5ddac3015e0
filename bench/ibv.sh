#!/usr/bin/env bash
# Unmodified perftest through rdmx's libibverbs device against rdmx's native soft path, one
# script run (issue 11, point 7). Both sides of every pair run on loopback addresses of
# their own; runs alternate (native, perftest, native, ...) and the medians are compared.
#
#   bench/ibv.sh                  # ROUNDS=3 alternating rounds, DURATION=5 s per run
#   ROUNDS=5 DURATION=3 bench/ibv.sh
#
# 1. perftest `ib_read_bw -s 4096 -t 32` (32 WRs in flight; every READ outstanding at once:
#    -o 32 asks the device for 32 READs in flight) through `rdmx-ibv exec` vs
#    `rdmx-perf read_bw --size 4096 --qd 32` (ops/s)                            >= 0.8x
# 2. perftest `ib_read_lat -s 4096` p50 (t_typical) vs `rdmx-perf read_lat --size 4096` p50
#                                                                                <= 1.3x
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
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/rdmx-ibv-bench.XXXXXX")
PIDS=()
FAILED=0

cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for tool in ib_read_bw ib_read_lat; do
    command -v "$tool" >/dev/null || {
        echo "bench/ibv.sh: $tool missing (run ./scripts/install-deps.sh)" >&2
        exit 2
    }
done
echo "# building rdmx-perf and rdmx-ibv (release)"
if ! cargo build --release --quiet -p rdmx-perf -p rdmx-ibv; then
    echo "bench/ibv.sh: build failed" >&2
    exit 2
fi
source "$ROOT/bench/lib.sh"

# native read_bw|read_lat: rdmx-perf server and client on the soft provider; prints the
# client's JSON line.
native() {
    local test=$1
    fresh_endpoints
    start "native-$test-$PORT" server --listen "127.0.0.1:$PORT"
    local extra=()
    [ "$test" = read_bw ] && extra=(--qd 32)
    local out
    out=$("$BIN" "$test" --connect "$ADDR" --size 4096 "${extra[@]}" --duration "$DURATION" --json 2>"$LOGDIR/native-$test-$PORT.client.err")
    stop
    echo "$out"
}

# perftest TOOL ARGS...: server and client under rdmx-ibv exec on their own addresses;
# prints the client's output.
perftest() {
    local tool=$1
    shift
    fresh_endpoints
    local args=(-d rdmx0 -x 0 -F -s 4096 -p "$PORT" "$@")
    "$IBV" exec --ip "$SRV_IP" -- "$tool" "${args[@]}" >"$LOGDIR/$tool-$PORT.server" 2>&1 &
    local srv=$!
    PIDS+=("$srv")
    # perftest clients do not retry their connect: wait (bounded) for the server to listen.
    local hex
    hex=$(printf ':%04X 00000000:0000 0A' "$PORT")
    for _ in $(seq 1 200); do
        grep -q "$hex" "/proc/$srv/net/tcp" 2>/dev/null && break
        sleep 0.05
    done
    timeout -s KILL $((DURATION + 30)) "$IBV" exec --ip "$CLI_IP" -- "$tool" "${args[@]}" "$SRV_IP" \
        >"$LOGDIR/$tool-$PORT.client" 2>&1
    local rc=$?
    wait "$srv" 2>/dev/null
    if [ $rc -ne 0 ]; then
        echo "bench/ibv.sh: $tool client failed ($rc); logs in $LOGDIR" >&2
        tail -5 "$LOGDIR/$tool-$PORT.client" >&2
        FAILED=1
    fi
    cat "$LOGDIR/$tool-$PORT.client"
}

# The result line of a perftest bw run: "#bytes #iterations BW peak BW average MsgRate".
bw_msg_rate() { awk '$1 == 4096 && NF >= 5 { print $5 * 1000000 }' <<<"$1" | tail -1; }
# The result line of a perftest lat run: "#bytes #iterations t_min t_max t_typical ...".
lat_typical() { awk '$1 == 4096 && NF >= 5 { print $5 }' <<<"$1" | tail -1; }


echo "# $ROUNDS alternating rounds, $DURATION s each; logs in $LOGDIR"
NB=() IB=() NL=() IL=()
for r in $(seq 1 "$ROUNDS"); do
    j=$(native read_bw)
    v=$(field "$j" ops_per_sec)
    [ -n "$v" ] || { echo "read_bw: no result: $j" >&2; FAILED=1; }
    NB+=("$v")
    o=$(perftest ib_read_bw -t 32 -o 32 -D "$DURATION")
    v=$(bw_msg_rate "$o")
    [ -n "$v" ] || { echo "ib_read_bw: no result" >&2; FAILED=1; }
    IB+=("$v")
    j=$(native read_lat)
    v=$(field "$j" lat_p50_us)
    [ -n "$v" ] || { echo "read_lat: no result: $j" >&2; FAILED=1; }
    NL+=("$v")
    o=$(perftest ib_read_lat -n 20000)
    v=$(lat_typical "$o")
    [ -n "$v" ] || { echo "ib_read_lat: no result" >&2; FAILED=1; }
    IL+=("$v")
    echo "round $r: read_bw ${NB[-1]} ops/s, ib_read_bw ${IB[-1]} ops/s, read_lat p50 ${NL[-1]} us, ib_read_lat t_typical ${IL[-1]} us"
done

nb=$(printf '%s\n' "${NB[@]}" | median)
ib=$(printf '%s\n' "${IB[@]}" | median)
nl=$(printf '%s\n' "${NL[@]}" | median)
il=$(printf '%s\n' "${IL[@]}" | median)
if [ -n "$nb" ] && [ -n "$ib" ] && [ -n "$nl" ] && [ -n "$il" ]; then
    rb=$(awk -v a="$ib" -v b="$nb" 'BEGIN { printf "%.3f", a / b }')
    rl=$(awk -v a="$il" -v b="$nl" 'BEGIN { printf "%.3f", a / b }')
    printf '\n%-58s %12s %12s %7s %s\n' "medians of $ROUNDS rounds" perftest native ratio target
    printf '%-58s %12.0f %12.0f %7s >= 0.8 %s\n' "1. ib_read_bw -s 4096 -t 32 -o 32 vs read_bw --qd 32 (ops/s)" "$ib" "$nb" "$rb" "$(verdict "$rb" 0.8 '>=')"
    printf '%-58s %12.2f %12.2f %7s <= 1.3 %s\n' "2. ib_read_lat -s 4096 t_typical vs read_lat p50 (us)" "$il" "$nl" "$rl" "$(verdict "$rl" 1.3 '<=')"
else
    FAILED=1
fi
exit $FAILED

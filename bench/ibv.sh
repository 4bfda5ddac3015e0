#!/usr/bin/env bash
# Unmodified verbs programs through rdmx's libibverbs device (rdmx-ibv exec), one table:
# against rdmx's native soft path, and programs that wait without polling against programs
# that poll (issue 11 point 7; issue 28 point 1). Both sides of every pair run on loopback
# addresses of their own; within a round every measurement runs once, in a fixed order, so
# rounds alternate between them; the table shows medians over the rounds.
#
#   bench/ibv.sh                          # ROUNDS=3, DURATION=5 s, LAT_ITERS=20000, PP_ITERS=20000
#   ROUNDS=5 DURATION=3 bench/ibv.sh
#   BASE_IBV=/path/to/old/target/release/rdmx-ibv bench/ibv.sh
#                                         # also runs the polling programs with an older
#                                         # build (its provider next to it), alternating
#   ROUNDS=1 DURATION=1 LAT_ITERS=100 PP_ITERS=100 bench/ibv.sh    # does it work
#
# Rows (perftest's t_typical is its median; ibv_rc_pingpong reports usec/iter):
#  1. ib_read_bw -s 4096 -t 32 -o 32 vs rdmx-perf read_bw --qd 32 (ops/s)       >= 0.8x
#  2. ib_read_lat -s 4096 vs rdmx-perf read_lat --size 4096 p50 (us)            <= 1.3x
#  3. ib_write_lat (spins on memory, never polls for the peer's WRITE) vs
#     ib_send_lat (polls its receive CQ), p50                                   <= 2x
#  4. ib_send_lat -e vs ib_send_lat (completion channel vs polling), p50        (shown)
#  5. ib_read_lat -e vs ib_read_lat, p50                                        (shown)
#  6. ibv_rc_pingpong -e vs ibv_rc_pingpong, usec/iter                          <= 2x
#  7. with BASE_IBV: ib_send_lat, ib_read_lat, ibv_rc_pingpong (polling) against the
#     base build                                                                <= 1.1x
#     and the waiting ib_send_lat -e and ibv_rc_pingpong -e against it           (shown)
# Exits 0 when every run produced its figure (a missed target is reported as BELOW, not a
# failure), non-zero when a run failed. Servers are killed on exit.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
LAT_ITERS=${LAT_ITERS:-20000}
PP_ITERS=${PP_ITERS:-20000}
BASE_IBV=${BASE_IBV:-}
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

for tool in ib_read_bw ib_read_lat ib_send_lat ib_write_lat ibv_rc_pingpong; do
    command -v "$tool" >/dev/null || {
        echo "bench/ibv.sh: $tool missing (run ./scripts/install-deps.sh)" >&2
        exit 2
    }
done
if [ -n "$BASE_IBV" ] && [ ! -x "$BASE_IBV" ]; then
    echo "bench/ibv.sh: BASE_IBV=$BASE_IBV is not an executable" >&2
    exit 2
fi
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

# pair LAUNCHER NAME CMD...: CMD as server and as client (with the server's address last)
# under LAUNCHER exec, each on its own address; prints the client's output. The port is
# $PORT (fresh_endpoints first).
pair() {
    local launcher=$1 name=$2
    shift 2
    "$launcher" exec --ip "$SRV_IP" -- "$@" >"$LOGDIR/$name-$PORT.server" 2>&1 &
    local srv=$!
    PIDS+=("$srv")
    # perftest and ibv_rc_pingpong clients do not retry their connect: wait (bounded) for
    # the server to listen.
    local hex
    hex=$(printf ':%04X 00000000:0000 0A' "$PORT")
    for _ in $(seq 1 200); do
        grep -q "$hex" "/proc/$srv/net/tcp" 2>/dev/null && break
        sleep 0.05
    done
    timeout -s KILL $((DURATION + 60)) "$launcher" exec --ip "$CLI_IP" -- "$@" "$SRV_IP" \
        >"$LOGDIR/$name-$PORT.client" 2>&1
    local rc=$?
    timeout 10 tail --pid="$srv" -f /dev/null 2>/dev/null || kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
    if [ $rc -ne 0 ]; then
        echo "bench/ibv.sh: $name client failed ($rc); logs in $LOGDIR" >&2
        tail -5 "$LOGDIR/$name-$PORT.client" >&2
        FAILED=1
    fi
    cat "$LOGDIR/$name-$PORT.client"
}

# perftest [LAUNCHER=] TOOL ARGS...: a perftest pair on device rdmx0, GID 0.
perftest() {
    local launcher=$IBV
    case ${1:-} in LAUNCHER=*) launcher=${1#LAUNCHER=}; shift ;; esac
    local tool=$1
    shift
    fresh_endpoints
    pair "$launcher" "$tool" "$tool" -d rdmx0 -x 0 -F -p "$PORT" "$@"
}

# pingpong [LAUNCHER=] ARGS...: an ibv_rc_pingpong pair (4096-byte messages, PP_ITERS).
pingpong() {
    local launcher=$IBV
    case ${1:-} in LAUNCHER=*) launcher=${1#LAUNCHER=}; shift ;; esac
    fresh_endpoints
    pair "$launcher" ibv_rc_pingpong ibv_rc_pingpong -d rdmx0 -g 0 -p "$PORT" -n "$PP_ITERS" "$@"
}

# The result line of a perftest bw run: "#bytes #iterations BW peak BW average MsgRate".
bw_msg_rate() { awk '$1 == 4096 && NF >= 5 { print $5 * 1000000 }' <<<"$1" | tail -1; }
# t_typical of a perftest lat run's result line ("#bytes #iterations t_min t_max
# t_typical ...", the first number row).
lat_typical() { awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 5 { v = $5 } END { print v }' <<<"$1"; }
# ibv_rc_pingpong's "N iters in S seconds = U usec/iter".
pp_usec() { sed -n 's/.* = \([0-9.]*\) usec\/iter.*/\1/p' <<<"$1" | tail -1; }

# record KEY VALUE: appends VALUE (or n/a) to the round results of KEY.
declare -A R
record() {
    local v=$2
    if [ -z "$v" ]; then
        echo "bench/ibv.sh: $1: no result" >&2
        FAILED=1
        v=n/a
    fi
    R[$1]="${R[$1]:-} $v"
}
med() { local k=$1; [ -n "${R[$k]:-}" ] && median_of ${R[$k]} | grep -v '^n/a$'; }

echo "# $ROUNDS rounds, bw/native runs $DURATION s, lat -n $LAT_ITERS, pingpong -n $PP_ITERS; logs in $LOGDIR"
for r in $(seq 1 "$ROUNDS"); do
    record native_bw "$(field "$(native read_bw)" ops_per_sec)"
    record ib_read_bw "$(bw_msg_rate "$(perftest ib_read_bw -s 4096 -t 32 -o 32 -D "$DURATION")")"
    record native_lat "$(field "$(native read_lat)" lat_p50_us)"
    record read_lat_4k "$(lat_typical "$(perftest ib_read_lat -s 4096 -n "$LAT_ITERS")")"
    record send_lat "$(lat_typical "$(perftest ib_send_lat -n "$LAT_ITERS")")"
    record write_lat "$(lat_typical "$(perftest ib_write_lat -n "$LAT_ITERS")")"
    record send_lat_e "$(lat_typical "$(perftest ib_send_lat -n "$LAT_ITERS" -e)")"
    record read_lat "$(lat_typical "$(perftest ib_read_lat -n "$LAT_ITERS")")"
    record read_lat_e "$(lat_typical "$(perftest ib_read_lat -n "$LAT_ITERS" -e)")"
    record pp "$(pp_usec "$(pingpong)")"
    record pp_e "$(pp_usec "$(pingpong -e)")"
    if [ -n "$BASE_IBV" ]; then
        record base_send_lat "$(lat_typical "$(perftest LAUNCHER="$BASE_IBV" ib_send_lat -n "$LAT_ITERS")")"
        record base_read_lat "$(lat_typical "$(perftest LAUNCHER="$BASE_IBV" ib_read_lat -n "$LAT_ITERS")")"
        record base_pp "$(pp_usec "$(pingpong LAUNCHER="$BASE_IBV")")"
        record base_send_lat_e "$(lat_typical "$(perftest LAUNCHER="$BASE_IBV" ib_send_lat -n "$LAT_ITERS" -e)")"
        record base_pp_e "$(pp_usec "$(pingpong LAUNCHER="$BASE_IBV" -e)")"
    fi
    echo "round $r:$(for k in native_bw ib_read_bw native_lat read_lat_4k send_lat write_lat send_lat_e read_lat read_lat_e pp pp_e base_send_lat base_read_lat base_pp base_send_lat_e base_pp_e; do [ -n "${R[$k]:-}" ] && printf ' %s=%s' "$k" "${R[$k]##* }"; done)"
done

# row WHAT KEY_MEASURED KEY_BASELINE TARGET OP: one line of the table (a target "-" only
# shows the ratio).
row() {
    local m b r v
    m=$(med "$2")
    b=$(med "$3")
    r=$(ratio "$m" "$b")
    v="-"
    [ "$4" != "-" ] && v=$(verdict "$r" "$4" "$5")
    printf '%-58s %12s %12s %7s %6s %s\n' "$1" "${m:-n/a}" "${b:-n/a}" "$r" "$5$4" "$v"
}

echo
printf '%-58s %12s %12s %7s %6s %s\n' "medians of $ROUNDS rounds" measured baseline ratio target verdict
row "1. ib_read_bw -s 4096 -t 32 -o 32 / read_bw --qd 32 (op/s)" ib_read_bw native_bw 0.8 ">="
row "2. ib_read_lat -s 4096 / rdmx-perf read_lat p50 (us)" read_lat_4k native_lat 1.3 "<="
row "3. ib_write_lat / ib_send_lat, t_typical (us)" write_lat send_lat 2 "<="
row "4. ib_send_lat -e / ib_send_lat, t_typical (us)" send_lat_e send_lat - ""
row "5. ib_read_lat -e / ib_read_lat, t_typical (us)" read_lat_e read_lat - ""
row "6. ibv_rc_pingpong -e / ibv_rc_pingpong (usec/iter)" pp_e pp 2 "<="
if [ -n "$BASE_IBV" ]; then
    row "7a. ib_send_lat / base build, t_typical (us)" send_lat base_send_lat 1.1 "<="
    row "7b. ib_read_lat / base build, t_typical (us)" read_lat base_read_lat 1.1 "<="
    row "7c. ibv_rc_pingpong / base build (usec/iter)" pp base_pp 1.1 "<="
    row "7d. ib_send_lat -e / base build, t_typical (us)" send_lat_e base_send_lat_e - ""
    row "7e. ibv_rc_pingpong -e / base build (usec/iter)" pp_e base_pp_e - ""
fi
exit $FAILED

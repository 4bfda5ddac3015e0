#!/usr/bin/env bash
# Block IO over rdmx (docs/block.md): one run, every figure next to its baseline.
#
#   fio/bench.sh              # DURATION=5 s per run, PAIRS=3 rounds: about 2 min
#   DURATION=3 PAIRS=5 fio/bench.sh
#
# 4K random reads, queue depth 32, a memory volume (64 MiB), all on 127.0.0.1:
#   A. fio --ioengine=external:fio/rdmx-engine.so mode=rpc (every IO a request + reply
#      through rdmx-target)                              vs rdmx-perf read_bw --qd 32  >= 0.85
#   B. the same fio over rdmx (rpc)                      vs fio's nbd engine against
#      `nbdkit memory 64M` over TCP on loopback                                     >= 2.5
#   C. fio over rdmx mode=read (one-sided RDMA READ into fio's buffers), beside them.
# IOPS are medians of PAIRS rounds; each round runs every contender once with fresh
# servers on fresh ports, the order reversed every other round (A/B, B/A). Latency
# p50/p99/p99.9 (us, fio's completion latency, rdmx-perf's post-to-completion) are the
# medians too.
#
# Exits 0 when every run completed (a missed target is reported as BELOW, not a failure),
# non-zero when a run failed.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DURATION=${DURATION:-5}
PAIRS=${PAIRS:-3}
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/rdmx-fio-bench.XXXXXX")
PIDS=()
FAILED=0
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "# building rdmx-perf, rdmx-target (release) and fio/rdmx-engine.so"
if ! cargo build --release --quiet -p rdmx-perf -p rdmx-target || ! make -s -C fio >/dev/null; then
    echo "fio/bench.sh: build failed" >&2
    exit 2
fi
for tool in fio nbdkit; do
    command -v "$tool" >/dev/null || { echo "fio/bench.sh: $tool missing (scripts/install-deps.sh)" >&2; exit 2; }
done
PERF=$ROOT/target/release/rdmx-perf
TARGET=$ROOT/target/release/rdmx-target

# start NAME CMD...: runs CMD in the background, waits for a "listening on ADDR" line on its
# stdout; sets ADDR and SERVER.
start() {
    local name=$1
    shift
    "$@" >"$LOGDIR/$name.out" 2>"$LOGDIR/$name.err" &
    SERVER=$!
    PIDS+=("$SERVER")
    for _ in $(seq 200); do
        ADDR=$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$LOGDIR/$name.out" 2>/dev/null | head -1)
        [ -n "$ADDR" ] && return 0
        kill -0 "$SERVER" 2>/dev/null || break
        sleep 0.05
    done
    echo "fio/bench.sh: $name did not start: $(cat "$LOGDIR/$name.err")" >&2
    exit 2
}
stop() {
    kill "$SERVER" 2>/dev/null
    wait "$SERVER" 2>/dev/null
}

# A free TCP port on 127.0.0.1 (the kernel's choice), for nbdkit.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

FIO_COMMON=(--rw=randread --bs=4k --iodepth=32 --iodepth_batch_submit=8
    --iodepth_batch_complete_min=1 --iodepth_batch_complete_max=32 --time_based=1
    --runtime="$DURATION" --output-format=json --lat_percentiles=0 --clat_percentiles=1
    --percentile_list=50:99:99.9)

# fio_figures FILE: "IOPS P50 P99 P999" of a fio JSON output (us), or nothing on error.
fio_figures() {
    python3 - "$1" <<'PY'
import json, sys
try:
    txt = open(sys.argv[1]).read()
    d = json.loads(txt[txt.index("{"):])
    j = d["jobs"][0]
    if j.get("error", 0):
        sys.exit(0)
    r = j["read"]
    p = r["clat_ns"]["percentile"]
    def us(k):
        return p.get(k, 0) / 1000.0
    print(f'{r["iops"]:.0f} {us("50.000000"):.1f} {us("99.000000"):.1f} {us("99.900000"):.1f}')
except Exception:
    pass
PY
}

run_rdmx() { # run_rdmx MODE OUTFILE
    start target "$TARGET" --listen 127.0.0.1:0 --volume v0=mem:64M
    local a=$ADDR
    fio --name=rdmx --ioengine=external:fio/rdmx-engine.so --hostname="${a%:*}" \
        --port="${a##*:}" --volume=v0 --mode="$1" "${FIO_COMMON[@]}" >"$2" 2>>"$LOGDIR/fio.err"
    stop
}

run_nbd() { # run_nbd OUTFILE
    local port
    port=$(free_port)
    nbdkit -f -i 127.0.0.1 -p "$port" memory 64M >"$LOGDIR/nbdkit.out" 2>"$LOGDIR/nbdkit.err" &
    SERVER=$!
    PIDS+=("$SERVER")
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.05
    done
    fio --name=nbd --ioengine=nbd --uri="nbd://127.0.0.1:$port" "${FIO_COMMON[@]}" >"$1" 2>>"$LOGDIR/fio.err"
    stop
}

run_perf() { # run_perf OUTFILE: "IOPS P50 P99 P999"
    start perf "$PERF" server --listen 127.0.0.1:0
    "$PERF" read_bw --connect "$ADDR" --size 4096 --qd 32 --duration "$DURATION" --json \
        2>>"$LOGDIR/perf.err" | python3 -c '
import json, sys
try:
    d = json.load(sys.stdin)
    if d.get("errors", 1) == 0:
        print("%.0f %.1f %.1f %.1f" % (d["ops_per_sec"], d["lat_p50_us"], d["lat_p99_us"], d["lat_p999_us"]))
except Exception:
    pass' >"$1"
    stop
}

declare -A FIG
one() { # one NAME: runs contender NAME once, appends its figures to FIG[NAME]
    local f="$LOGDIR/$1.$RANDOM.json" line
    case $1 in
        rpc) run_rdmx rpc "$f"; line=$(fio_figures "$f") ;;
        read) run_rdmx read "$f"; line=$(fio_figures "$f") ;;
        nbd) run_nbd "$f"; line=$(fio_figures "$f") ;;
        read_bw) run_perf "$f"; line=$(cat "$f") ;;
    esac
    if [ -z "$line" ]; then
        echo "  $1: run FAILED (logs in $LOGDIR)"
        FAILED=1
        return
    fi
    echo "  $1: $line"
    FIG[$1]+="$line"$'\n'
}

NAMES=(rpc read_bw nbd read)
for round in $(seq "$PAIRS"); do
    echo "# round $round/$PAIRS ($(cut -d' ' -f1-3 /proc/loadavg) load)"
    if [ $((round % 2)) -eq 1 ]; then order=("${NAMES[@]}"); else order=(read nbd read_bw rpc); fi
    for n in "${order[@]}"; do one "$n"; done
done

# median COLUMN NAME
median() {
    printf '%s' "${FIG[$2]:-}" | awk -v c="$1" 'NF{print $c}' | sort -g | awk '{a[NR]=$1} END{if(NR==0){print 0}else if(NR%2){print a[(NR+1)/2]}else{print (a[NR/2]+a[NR/2+1])/2}}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{if(b>0) printf "%.2f", a/b; else print "n/a"}'; }
verdict() { awk -v r="$1" -v t="$2" 'BEGIN{print (r+0 >= t) ? "ok" : "BELOW"}'; }

echo
printf '%-44s %10s %9s %9s %9s\n' "4K randread QD32, mem volume (medians of $PAIRS)" IOPS "p50 us" "p99 us" "p99.9 us"
for n in rpc read nbd read_bw; do
    case $n in
        rpc) label="fio over rdmx, mode=rpc" ;;
        read) label="fio over rdmx, mode=read (one-sided)" ;;
        nbd) label="fio nbd engine, nbdkit memory, TCP" ;;
        read_bw) label="rdmx-perf read_bw --qd 32" ;;
    esac
    printf '%-44s %10s %9s %9s %9s\n' "$label" "$(median 1 $n)" "$(median 2 $n)" "$(median 3 $n)" "$(median 4 $n)"
done
ra=$(ratio "$(median 1 rpc)" "$(median 1 read_bw)")
rb=$(ratio "$(median 1 rpc)" "$(median 1 nbd)")
rc=$(ratio "$(median 1 read)" "$(median 1 read_bw)")
rd=$(ratio "$(median 1 read)" "$(median 1 nbd)")
echo
echo "A. fio rdmx rpc / rdmx-perf read_bw      = $ra  (target >= 0.85: $(verdict "$ra" 0.85))"
echo "B. fio rdmx rpc / fio nbd (nbdkit, TCP)  = $rb  (target >= 2.5: $(verdict "$rb" 2.5))"
echo "C. fio rdmx read / rdmx-perf read_bw     = $rc;  fio rdmx read / fio nbd = $rd"
echo "logs: $LOGDIR"
exit "$FAILED"

#!/usr/bin/env bash
# What side-channel authentication costs (issue 27 point 7; docs/security.md):
#   1. the handshake: median (and p90) time of CONNECTS connects with auth=required and as
#      many with auth=none, alternating one by one (examples/auth_handshake.rs);
#   2. the data path: fio 4K randread QD 32 over rdmx-target (a 64 MiB memory volume, mode
#      rpc) with and without authentication, PAIRS rounds alternating (order reversed every
#      other round), DURATION s each. The data path is the same code: the ratio should be
#      1 within noise (target: within 2%).
#   3. under attack: a keyholder's open time (median of OPENS) and 4K randread QD32 IOPS,
#      quiet and beside SILENT silent connections from 16 addresses plus a slow consumer
#      (examples/target_under_attack.rs, alternating, PAIRS rounds of DURATION s). The
#      attack is a child process; it runs twice: sharing both cores with the target (the
#      ratio then includes the attacker's own CPU, printed) and with PIN=1 (the attacker
#      on CPU 1, the target and the keyholder on CPU 0 in both phases: the attacker spends
#      its own core, as it would on another host).
#
#   bench/auth.sh                              # CONNECTS=200 PAIRS=3 DURATION=5
#   CONNECTS=5 PAIRS=1 DURATION=1 bench/auth.sh  # a smoke run
#
# Exits non-zero when a run failed; prints the figures and ratios otherwise.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
CONNECTS=${CONNECTS:-200}
SILENT=${SILENT:-500}
OPENS=${OPENS:-20}
PAIRS=${PAIRS:-3}
DURATION=${DURATION:-5}
LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/rdmx-auth-bench.XXXXXX")
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    rm -rf "$LOGDIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "# building (release): examples/auth_handshake, examples/target_under_attack, rdmx-target, fio/rdmx-engine.so"
if ! cargo build --release --quiet -p rdmx --example auth_handshake --example target_under_attack ||
   ! cargo build --release --quiet -p rdmx-target || ! make -s -C fio >/dev/null; then
    echo "bench/auth.sh: build failed" >&2
    exit 2
fi
command -v fio >/dev/null || { echo "bench/auth.sh: fio missing (scripts/install-deps.sh)" >&2; exit 2; }
TARGET=$ROOT/target/release/rdmx-target

echo "# 1. handshake: $CONNECTS connects each way, alternating"
RDMX_LOG=error "$ROOT/target/release/examples/auth_handshake" "$CONNECTS" || exit 1

KEYRING=$LOGDIR/keyring
printf '[client.fio]\n    key = %s\n' "$(head -c 32 /dev/urandom | base64)" >"$KEYRING"
chmod 600 "$KEYRING"

# run_fio AUTH(0|1) OUTFILE: a fresh target, one fio run; the IOPS go to OUTFILE.
run_fio() {
    local auth=$1 out=$2 tset=() fopt=()
    if [ "$auth" = 1 ]; then
        tset=(--set "auth_keyring=$KEYRING" --set auth_entity=osd.0)
        fopt=(--keyring="$KEYRING" --entity=client.fio)
    fi
    RDMX_LOG=error "$TARGET" --listen 127.0.0.1:0 --volume v0=mem:64M "${tset[@]}" \
        >"$LOGDIR/target.out" 2>"$LOGDIR/target.err" &
    local srv=$! addr=""
    PIDS+=("$srv")
    for _ in $(seq 200); do
        addr=$(sed -n 's/^rdmx-target listening on \([^ ]*\) .*/\1/p' "$LOGDIR/target.out")
        [ -n "$addr" ] && break
        sleep 0.05
    done
    [ -n "$addr" ] || { echo "rdmx-target did not start: $(cat "$LOGDIR/target.err")" >&2; return 1; }
    RDMX_LOG=error fio --name=auth"$auth" --ioengine=external:fio/rdmx-engine.so \
        --hostname="${addr%:*}" --port="${addr##*:}" --volume=v0 --mode=rpc "${fopt[@]}" \
        --rw=randread --bs=4k --iodepth=32 --iodepth_batch_submit=8 \
        --iodepth_batch_complete_min=1 --iodepth_batch_complete_max=32 --time_based=1 \
        --runtime="$DURATION" --output-format=json >"$LOGDIR/fio.json" 2>>"$LOGDIR/fio.err"
    local rc=$?
    kill "$srv" 2>/dev/null
    wait "$srv" 2>/dev/null
    [ "$rc" = 0 ] || { echo "fio (auth=$auth) failed: $(tail -3 "$LOGDIR/fio.err")" >&2; return 1; }
    python3 - "$LOGDIR/fio.json" >"$out" <<'PY' || return 1
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])["jobs"][0]
assert j.get("error", 0) == 0, j.get("error")
print(f'{j["read"]["iops"]:.0f}')
PY
}

echo "# 2. fio 4K randread QD 32, $PAIRS round(s) of ${DURATION}s each way, alternating"
WITH=()
WITHOUT=()
for r in $(seq "$PAIRS"); do
    order="1 0"
    [ $((r % 2)) = 0 ] && order="0 1"
    for a in $order; do
        run_fio "$a" "$LOGDIR/iops" || exit 1
        v=$(cat "$LOGDIR/iops")
        if [ "$a" = 1 ]; then WITH+=("$v"); else WITHOUT+=("$v"); fi
        echo "  round $r auth=$([ "$a" = 1 ] && echo required || echo none): $v IOPS"
    done
done
python3 - "${WITH[*]}" "${WITHOUT[*]}" <<'PY'
import statistics, sys
w = [float(x) for x in sys.argv[1].split()]
n = [float(x) for x in sys.argv[2].split()]
mw, mn = statistics.median(w), statistics.median(n)
print(f"fio 4K randread QD32 median IOPS: auth=required {mw:.0f}, auth=none {mn:.0f}; "
      f"ratio {mw / mn:.3f} (target 0.98..1.02)")
PY

echo "# 3. a keyholder beside $SILENT silent connections and a slow consumer, $PAIRS round(s)"
RDMX_LOG=error "$ROOT/target/release/examples/target_under_attack" "$PAIRS" "$DURATION" \
    "$SILENT" "$OPENS" || exit 1
echo "# 3b. the same with PIN=1 (attacker on CPU 1; target and keyholder on CPU 0)"
PIN=1 RDMX_LOG=error "$ROOT/target/release/examples/target_under_attack" "$PAIRS" "$DURATION" \
    "$SILENT" "$OPENS" || exit 1

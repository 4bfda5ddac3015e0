# shellcheck shell=bash disable=SC2034
# Shared by the bench/ scripts (sourced): servers in the background and the
# JSON fields of a client's last line. Needs BIN, LOGDIR and a PIDS array.

# start NAME ARGS...: `$BIN ARGS...` in the background (logs in $LOGDIR/NAME.out/.err),
# waits for its "listening on" line; sets ADDR to the address it printed, SERVER to its pid.
start() {
    local name=$1
    shift
    "$BIN" "$@" >"$LOGDIR/$name.out" 2>"$LOGDIR/$name.err" &
    local pid=$!
    PIDS+=("$pid")
    SERVER=$pid
    for _ in $(seq 1 200); do
        ADDR=$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' "$LOGDIR/$name.out" | head -1)
        [ -n "$ADDR" ] && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    echo "$(basename "$0"): server $name did not start: $(cat "$LOGDIR/$name.err")" >&2
    exit 2
}

# stop: kills and reaps the last server started.
stop() {
    kill "$SERVER" 2>/dev/null
    wait "$SERVER" 2>/dev/null
}

# field JSON KEY: a number field of the JSON line.
field() {
    sed -n "s/.*\"$2\":\([-0-9.e]*\).*/\1/p" <<<"$1"
}

# median: the median of the numbers on stdin, one per line (mean of the middle two for an
# even count; empty for none). Failed runs ("n/a") sort first.
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

# median_of V...: the median of the arguments.
median_of() { printf '%s\n' "$@" | median; }

# ratio A B: A / B to 3 decimals ("n/a" when either is missing or B is 0).
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || a == "n/a" || b + 0 == 0) print "n/a"; else printf "%.3f", a / b }'
}

# verdict VALUE TARGET ">="|"<=" (or ge|le): "ok" when VALUE meets TARGET that way, else
# "BELOW"; "n/a" for a missing value.
verdict() {
    awk -v v="$1" -v t="$2" -v op="$3" 'BEGIN {
        if (v == "" || v == "n/a") { print "n/a"; exit }
        ok = (op == ">=" || op == "ge") ? (v + 0 >= t + 0) : (v + 0 <= t + 0)
        print ok ? "ok" : "BELOW"
    }'
}

# fresh_endpoints: a fresh TCP port (PORT) and a fresh pair of loopback addresses (SRV_IP
# 127.0.X.1, CLI_IP 127.0.X.2) per run: a stale server on a fixed port would measure an old
# binary, and a device address serves one process at a time. Runs are called in command
# substitutions (subshells, which lose variable updates), so the counter lives in a file
# under $LOGDIR.
fresh_endpoints() {
    local f=$LOGDIR/.endpoint-seq n
    [ -f "$f" ] || echo "$((20000 + RANDOM % 20000))" >"$f"
    n=$(($(cat "$f") + 1))
    echo "$n" >"$f"
    PORT=$n
    local net=$((n % 250 + 1))
    SRV_IP=127.0.$net.1
    CLI_IP=127.0.$net.2
}

# run_json NAME ARGS...: runs an rdmx-perf client (inside the command prefix IN_NS when
# set), sets JSON to its last stdout line; a failed run is reported and counted in FAILED.
run_json() {
    local name=$1 ok=1
    shift
    JSON=""
    if ! ${IN_NS[@]+"${IN_NS[@]}"} "$BIN" "$@" --json >"$LOGDIR/$name.out" 2>"$LOGDIR/$name.err"; then
        ok=0
        echo "RUN FAILED: $name: rdmx-perf $* --json" >&2
        sed 's/^/    /' "$LOGDIR/$name.err" >&2
    fi
    JSON=$(tail -1 "$LOGDIR/$name.out" | grep '^{' || true)
    if [ -z "$JSON" ]; then
        [ "$ok" = 1 ] && echo "RUN FAILED: $name: no JSON output" >&2
        ok=0
        JSON="{}"
    fi
    [ "$ok" = 1 ] || FAILED=$((FAILED + 1))
}

LINES=()
# line WHAT MEASURED BASELINE RATIO TARGET VERDICT
line() {
    LINES+=("$(printf '%-44s %14s %14s %8s %10s  %s' "$@")")
    printf '%-44s %14s %14s %8s %10s  %s\n' "$@"
}

header() {
    printf '%-44s %14s %14s %8s %10s  %s\n' "what" "measured" "baseline" "ratio" "target" "verdict"
}

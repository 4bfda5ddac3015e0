# Shell functions the fio scripts share (sourced by fio/test.sh and fio/failover.sh).

# wait_target NAME WHO: waits (bounded: 10 s) until the rdmx-target with pid $TPID, whose
# stdout is $work/NAME.out, prints the address it listens on; sets ADDR (host:port). Exits
# with WHO's message and the target's stderr when it dies or never prints one.
wait_target() {
  local name=$1 who=$2
  ADDR=""
  for _ in $(seq 200); do
    ADDR=$(sed -n 's/^rdmx-target listening on \([^ ]*\) .*/\1/p' "$work/$name.out" 2>/dev/null || true)
    [ -n "$ADDR" ] && return 0
    kill -0 "$TPID" 2>/dev/null || break
    sleep 0.05
  done
  echo "$who: rdmx-target $name did not start: $(cat "$work/$name.err")" >&2
  exit 1
}

# shellcheck shell=bash
# shellcheck disable=SC2034  # KILLED, FIO_SIZE, FIO_NRFILES, RUN_OUT, BG_PIDS are run.sh's
# ceph-harness/bench.sh: the full runs (bench, failover, rnr), sourced by run.sh after
# lib.sh. Each run starts a fresh cluster and stops it (trap in run.sh whatever happens).

# results_dir NAME: $OUT or target/ceph-harness/NAME-<time>.
results_dir() {
  local r=${OUT:-$ROOT/target/ceph-harness/$1-$(date +%Y%m%d-%H%M%S)}
  mkdir -p "$r"
  echo "$r"
}

# up_for LABEL TRANSPORT PROFILE: a fresh cluster for one measurement. A start that fails
# (a hung `ceph` call, a daemon dead at start) is kept in $RUN_OUT/failed-start-N and tried
# once more.
up_for() {
  local try
  for try in 1 2; do
    set_transport "$2" "$3"
    new_cluster_dir "$1"
    # a background subshell: `die` ends it alone, and errexit stays on inside (it would
    # not in an `if` condition)
    cluster_up &
    if wait "$!"; then return 0; fi
    say "cluster start $try failed ($2 $3); logs in ${RUN_OUT:-?}/failed-start-$try"
    stop_cluster "${RUN_OUT:-/tmp}/failed-start-$try"
  done
  die "the cluster did not start twice ($2 $3)"
}

# fill_fast: every fio file written once with 64 KiB blocks (randread needs data; 1 MiB
# writes are 64 RDMA chunks each and exhaust the OSDs' SRQs: that is the RNR storm's job).
fill_fast() {
  run_fio "$1" "${FILL_TIMEOUT:-240}" --name=fill --rw=write --bs=64k --iodepth=8 ||
    { tail -20 "$1.stderr" >&2; die "fill failed"; }
}

# The three jobs of the bench: randread (after the fill), randwrite and 70/30 with crc32c
# verify (verify_backlog: fio reads back and checks what it wrote during the run).
JOBS=(randread randwrite mixed)
job_args() {
  case $1 in
    randread) echo "--rw=randread" ;;
    randwrite) echo "--rw=randwrite --verify=crc32c --verify_backlog=256" ;;
    mixed) echo "--rw=randrw --rwmixread=70 --verify=crc32c --verify_backlog=256" ;;
  esac
}

# bench_one RESULTS ROUND TRANSPORT PROFILE: one cluster, the three jobs, a TSV row each.
# PROFILE may end in /pN: Ceph's ms_async_rdma_polling_us = N for that cluster (e.g.
# BENCH_CONFIGS="rdma:ceph-after rdma:ceph-after/p100 posix:none").
bench_one() {
  local res=$1 round=$2 tr=$3 prof=$4 label dir job t0 t1 hz pids
  label="$tr-${prof//\//-}"
  dir=$res/raw/r$round-$label
  mkdir -p "$dir"
  RUN_OUT=$dir
  local polling=${RDMA_POLLING_US:-}
  if [[ $prof == */p* ]]; then RDMA_POLLING_US=${prof##*/p}; fi
  up_for "bench-$label" "$tr" "${prof%/p*}"
  RDMA_POLLING_US=$polling
  fio_common
  fill_fast "$dir/fill.json"
  hz=$(getconf CLK_TCK)
  for job in "${JOBS[@]}"; do
    # shellcheck disable=SC2207
    local extra=($(job_args "$job"))
    mapfile -t pids < <(daemon_pids)
    t0=$(cpu_ticks "${pids[@]}")
    run_fio "$dir/$job.json" $((RUNTIME + 60)) --name="$job" "${extra[@]}" --bs=4k --iodepth=32 \
      --runtime="$RUNTIME" --time_based --continue_on_error=all || say "fio $job: rc $? (counted as errors)"
    t1=$(cpu_ticks "${pids[@]}")
    check_daemons || say "a daemon died during $job ($label)"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$tr" "$prof" "$job" "$(( t1 - t0 ))/$hz" "$dir/$job.json" >>"$res/runs.tsv"
  done
  if [ "$tr" = rdma ]; then
    counters >"$dir/counters.md" || { cat "$dir/counters.md"; say "NO TRAFFIC over rdmx in $label: its rows are refused"; echo "$round $tr $prof" >>"$res/refused"; }
  fi
  stop_cluster "$dir"
}

cmd_bench() {
  RUNTIME=${RUNTIME:-20}
  local res configs round i order
  res=$(results_dir bench)
  trap on_exit EXIT INT TERM
  read -r -a configs <<<"${BENCH_CONFIGS:-rdma:ceph-before rdma:ceph-after posix:none}"
  : >"$res/runs.tsv"
  for round in $(seq 1 "${ROUNDS:-2}"); do
    # alternate the order: A B C, then C B A, ...
    order=()
    for i in "${!configs[@]}"; do order+=("${configs[$i]}"); done
    if [ $((round % 2)) = 0 ]; then
      local rev=(); for ((i = ${#order[@]} - 1; i >= 0; i--)); do rev+=("${order[$i]}"); done; order=("${rev[@]}")
    fi
    for c in "${order[@]}"; do
      say "bench round $round: ${c%%:*} ${c#*:}"
      bench_one "$res" "$round" "${c%%:*}" "${c#*:}"
    done
  done
  "$PY" "$HERE/analyze.py" table "$res" | tee "$res/table.md"
  say "bench results: $res"
}

# ---- failover ---------------------------------------------------------------------------

# failover_one RES CASE RW PROFILE: fresh cluster, fio RW for FO_RUNTIME s, the event at
# FO_AT s (kill: kill -9 of fio.0's acting primary; blackhole: nft drops its UDP, the
# process lives), then the timeline facts into CASE dir.
failover_one() {
  local res=$1 kind=$2 rw=$3 prof=$4 dir victim vip pid fio ev_ms rc=0
  dir=$res/$kind-$rw/${prof}
  mkdir -p "$dir"
  RUN_OUT=$dir
  if [ "$prof" = posix ]; then up_for "fo-$kind-posix" posix none; else up_for "fo-$kind-$prof" rdma "$prof"; fi
  FIO_SIZE=64m FIO_NRFILES=16
  fio_common
  [ "$rw" = randread ] && fill_fast "$dir/fill.json"
  victim=$(primary_of fio.0)
  vip=$(osd_ip "$victim")
  pid=$(daemon_pid "osd.$victim")
  ceph_cli pg ls-by-primary "osd.$victim" -f json 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(len(d["pg_stats"] if isinstance(d,dict) else d))' >"$dir/primary_pgs" || true
  run_fio "$dir/fio.json" $((FO_RUNTIME + 90)) --name=fo --rw="$rw" --bs=4k --iodepth=32 \
    --runtime="$FO_RUNTIME" --time_based --continue_on_error=all \
    --write_iops_log="$dir/fo" --log_avg_msec=100 --log_unix_epoch=1 &
  fio=$!
  BG_PIDS=$fio
  sleep "$FO_AT"
  ev_ms=$(now_ms)
  case $kind in
    kill) kill -KILL "$pid"; KILLED["osd.$victim"]=1 ;;
    blackhole)
      # rdma: the OSD's RoCEv2 (UDP) only, its TCP side channel stays; posix: its TCP
      local match="meta l4proto udp"
      [ "$prof" = posix ] && match="meta l4proto tcp"
      nft -f - <<EOF
table inet rdmx_ceph {
  chain out {
    type filter hook output priority 0; policy accept;
    ip saddr $vip $match drop
    ip daddr $vip $match drop
  }
}
EOF
      ;;
  esac
  say "$kind osd.$victim ($vip, pid $pid) at $ev_ms ($prof, $rw)"
  wait "$fio" || rc=$?
  BG_PIDS=""
  nft delete table inet rdmx_ceph 2>/dev/null || true
  local dead
  dead=$(check_daemons 2>&1 | awk '{print $1}' | paste -sd, -) || true
  printf 'victim %s\nvip %s\nevent_ms %s\nfio_rc %s\nkind %s\nrw %s\nprofile %s\nend_ms %s\ncrashed %s\n' \
    "$victim" "$vip" "$ev_ms" "$rc" "$kind" "$rw" "$prof" "$(now_ms)" "${dead:-none}" >"$dir/facts"
  [ -z "$dead" ] || say "died during the run (not killed by the harness): $dead"
  [ "$prof" = posix ] || counters >"$dir/counters.md" || say "no rdmx traffic?"
  stop_cluster "$dir"
}

cmd_failover() {
  # 35 s: a black hole is detected by heartbeats only (osd_heartbeat_grace 20 s, Ceph's
  # default), so the run must outlast grace + interval after the event at 4 s.
  FO_RUNTIME=${FO_RUNTIME:-35}
  FO_AT=${FO_AT:-4}
  local res kind rw prof
  res=$(results_dir failover)
  trap on_exit EXIT INT TERM
  for kind in ${FO_KINDS:-kill blackhole}; do
    for rw in ${FO_RWS:-randread randwrite}; do
      for prof in ${FO_PROFILES:-ceph-before ceph-after posix}; do
        say "failover: $kind $rw $prof"
        failover_one "$res" "$kind" "$rw" "$prof"
      done
    done
  done
  "$PY" "$HERE/analyze.py" failover "$res" | tee "$res/table.md"
  say "failover results: $res"
}

# ---- RNR storm ---------------------------------------------------------------------------

# Small receive queues on the OSDs only (RNR_QUEUE_LEN receives posted on each OSD's SRQ,
# RNR_BUFFERS receive chunks at most; mon, mgr and clients keep theirs: with 4/8 everywhere
# the cluster does not even start, `ceph osd new` hangs), then a 4 KiB randwrite burst at
# QD 32: the OSDs' SRQs run dry, senders get RNR NAKs. ceph-before (rnr_retry 7 = forever,
# min_rnr_timer 0 = 655 ms) vs ceph-after (2, 12 = 0.64 ms).
cmd_rnr() {
  local res prof dir rc ql=${RNR_QUEUE_LEN:-8} nb=${RNR_BUFFERS:-32}
  res=$(results_dir rnr)
  trap on_exit EXIT INT TERM
  for prof in ${RNR_PROFILES:-ceph-before ceph-after}; do
    dir=$res/$prof
    mkdir -p "$dir"
    RUN_OUT=$dir
    say "rnr storm: $prof (OSDs: receive_queue_len $ql, receive_buffers $nb)"
    OSD_EXTRA_CONF="ms_async_rdma_receive_queue_len = $ql"$'\n'"ms_async_rdma_receive_buffers = $nb" \
      up_for "rnr-$prof" rdma "$prof"
    FIO_SIZE=64m FIO_NRFILES=16
    fio_common
    rc=0
    run_fio "$dir/fio.json" $((${RNR_RUNTIME:-15} + 90)) --name=rnr --rw=randwrite --bs=4k \
      --iodepth=32 --runtime="${RNR_RUNTIME:-15}" --time_based --continue_on_error=all \
      --write_iops_log="$dir/fo" --log_avg_msec=100 --log_unix_epoch=1 || rc=$?
    printf 'fio_rc %s\nprofile %s\nqueue_len %s\nbuffers %s\n' "$rc" "$prof" "$ql" "$nb" >"$dir/facts"
    check_daemons || say "a daemon died in the RNR storm ($prof)"
    counters >"$dir/counters.md" || say "no rdmx traffic?"
    stop_cluster "$dir"
  done
  "$PY" "$HERE/analyze.py" rnr "$res" | tee "$res/table.md"
  say "rnr results: $res"
}

# ---- profile ----------------------------------------------------------------------------
# cmd_profile: where the CPU of a 4K randread goes. For each of PROFILE_CONFIGS (default
# rdma:ceph-after posix:none): a fresh cluster, the fill, then fio randread QD 32 while
# `perf record -g` samples the primary-heavy OSD (osd.0) and fio for PERF_SECONDS (10).
# Writes perf-<config>-<osd|fio>.txt (top DSOs and symbols, self time) in the results dir.
# descendant PID NAME: the first process called NAME under PID (not another job's fio).
descendant() {
  local kid
  for kid in $(pgrep -P "$1"); do
    if [ "$(cat "/proc/$kid/comm" 2>/dev/null)" = "$2" ]; then echo "$kid"; return 0; fi
    descendant "$kid" "$2" && return 0
  done
  return 1
}

cmd_profile() {
  RUNTIME=${RUNTIME:-20}
  local res c tr prof dir osd fio_pid secs=${PERF_SECONDS:-10} who pid
  command -v perf >/dev/null || die "perf is missing (apt-get install linux-perf)"
  res=$(results_dir profile)
  trap on_exit EXIT INT TERM
  for c in ${PROFILE_CONFIGS:-rdma:ceph-after posix:none}; do
    tr=${c%%:*} prof=${c#*:} dir=$res/$tr-$prof
    mkdir -p "$dir"
    RUN_OUT=$dir
    up_for "profile-$tr-$prof" "$tr" "$prof"
    fio_common
    fill_fast "$dir/fill.json"
    run_fio "$dir/randread.json" $((RUNTIME + 60)) --name=randread --rw=randread --bs=4k \
      --iodepth=32 --runtime="$RUNTIME" --time_based &
    local fio_job=$!
    sleep 3
    osd=$(daemon_pid osd.0)
    fio_pid=$(descendant "$fio_job" fio)
    for who in osd fio; do
      if [ "$who" = osd ]; then pid=$osd; else pid=$fio_pid; fi
      [ -n "$pid" ] || { say "profile: no $who pid"; continue; }
      perf record -q -F 499 -g -p "$pid" -o "$dir/$who.perf" -- sleep "$secs" 2>/dev/null &
    done
    wait "$fio_job" || say "fio randread ($c): rc $?"
    sleep 1
    for who in osd fio; do
      [ -s "$dir/$who.perf" ] || continue
      ( # head closes the pipe early: not an error here
        set +o pipefail
        echo "# $c $who: self time by shared object"
        perf report -i "$dir/$who.perf" --stdio --no-children --sort dso -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -15
        echo "# $c $who: self time by symbol"
        perf report -i "$dir/$who.perf" --stdio --no-children --sort dso,sym -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40
      ) >"$res/perf-$tr-$prof-$who.txt"
    done
    "$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); r=j["jobs"][0]["read"]; print("%s IOPS %.0f p50 %.0f us" % (sys.argv[2], r["iops"], r["clat_ns"]["percentile"]["50.000000"]/1000))' "$dir/randread.json" "$c" | tee -a "$res/iops.txt" || true
    stop_cluster "$dir"
  done
  say "profile results: $res"
}

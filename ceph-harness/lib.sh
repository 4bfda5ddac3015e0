# shellcheck shell=bash
# shellcheck disable=SC2034  # NET, FIO_IP, PY, RDMA_* are used by run.sh and bench.sh
# ceph-harness/lib.sh: a single-host Ceph cluster (1 mon, 1 mgr, N memstore OSDs, auth
# none, no systemd) whose daemons and clients each run on their own loopback address,
# under `rdmx-ibv exec` (transport rdma: ms_type async+rdma on the rdmx0 device) or
# directly (transport posix: async+posix, TCP). Sourced by run.sh; every function
# expects `set -euo pipefail`.
#
# State lives in $D (a private directory): ceph.conf, data/, log/, pids (NAME PID IP
# lines), rdmx-stats/ (the provider's per-process counters, RDMXIBV_STATS_DIR).

# Addresses: 127.0.13.0/24 is this harness's (issue 13); every daemon and client its own.
NET=${CEPH_HARNESS_NET:-127.0.13}
# Debian's python (python3-matplotlib from install-deps.sh), not a python3 earlier in PATH
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
MON_IP=$NET.1
MGR_IP=$NET.2
osd_ip() { echo "$NET.$((10 + $1))"; }
CLI_IP=$NET.200          # the ceph/rados command line tools (one at a time)
FIO_IP=$NET.100          # fio's rados engine (one fio at a time)
NUM_OSD=${NUM_OSD:-3}
POOL=bench
PG_NUM=${PG_NUM:-32}

# Ceph's RDMA memory (docs/ceph-harness.md). The soft provider pins what is registered
# (mlock) within RLIMIT_MEMLOCK, which CAP_IPC_LOCK lifts, as the kernel does for a NIC;
# rdmx0 reports no max_mr_size of its own, as rxe. 8 KiB chunks (a 4 KiB IO's message
# fits one; Ceph's 128 KiB would pin 16x the memory for nothing), Ceph's counts otherwise:
# 1024 send chunks (8 MiB, one MR), up to 8192 receive chunks (grown on demand) and 4096
# receives posted on the SRQ, so the chunks never run out. (Until 2026-12-04 rdmx0 reported
# max_mr_size = the 8 MiB memlock limit and the harness ran 128 send and 384 receive chunks
# with an SRQ holding them all: Ceph's receive chunks ran out under load, it logged ~8,000
# "OUT OF RX BUFFERS" lines a second per OSD, and a shortage triggers its SRQ over-post,
# see "SRQ over-post".) Where a process may not pin that much (no CAP_IPC_LOCK and a low
# `ulimit -l`), the daemons run with soft_pin=false (cluster_up says so).
RDMA_BUFFER_SIZE=${RDMA_BUFFER_SIZE:-8192}
RDMA_SEND_BUFFERS=${RDMA_SEND_BUFFERS:-1024}
RDMA_RECV_BUFFERS=${RDMA_RECV_BUFFERS:-8192}
RDMA_RECV_QUEUE_LEN=${RDMA_RECV_QUEUE_LEN:-4096}

now_ms() { date +%s%3N; }
say() { echo "[ceph-harness $(date +%T)] $*" >&2; }
die() { echo "ceph-harness: error: $*" >&2; exit 1; }

# launch IP CMD...: CMD on address IP, under rdmx-ibv exec for transport rdma (exec:
# CMD keeps the launcher's pid).
launch() {
  local ip=$1; shift
  if [ "$TRANSPORT" = rdma ]; then
    RDMXIBV_STATS_DIR="$D/rdmx-stats" exec "$RDMX_IBV" exec --ip "$ip" "${RDMX_ARGS[@]}" -- "$@"
  else
    exec "$@"
  fi
}

# ceph_cli ARGS...: the ceph tool (a librados client) on CLI_IP, 30 s at most.
ceph_cli() { (launch "$CLI_IP" timeout -s KILL "${CLI_TIMEOUT:-30}" ceph -c "$CONF" "$@"); }
rados_cli() { (launch "$CLI_IP" timeout -s KILL "${CLI_TIMEOUT:-30}" rados -c "$CONF" "$@"); }

write_conf() {
  local fsid=$1 ms
  if [ "$TRANSPORT" = rdma ]; then ms=async+rdma; else ms=async+posix; fi
  cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon_host = [v2:$MON_IP:3300,v1:$MON_IP:6789]
ms_type = $ms
ms_bind_port_min = 46710
ms_bind_port_max = 46799
# rdmx0 (rdmx-ibv): GID 0 is the RoCEv2 GID of the process's address
ms_async_rdma_device_name = rdmx0
ms_async_rdma_port_num = 1
ms_async_rdma_gid_idx = 0
ms_async_rdma_buffer_size = $RDMA_BUFFER_SIZE
ms_async_rdma_send_buffers = $RDMA_SEND_BUFFERS
ms_async_rdma_receive_buffers = $RDMA_RECV_BUFFERS
ms_async_rdma_receive_queue_len = $RDMA_RECV_QUEUE_LEN
# how long Ceph's RDMA dispatcher busy-polls its CQs after a completion before it waits on
# the completion channel (Ceph's default 1000 us; RDMA_POLLING_US sets it)
ms_async_rdma_polling_us = ${RDMA_POLLING_US:-1000}
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
auth_allow_insecure_global_id_reclaim = false
keyring = $D/keyring
run_dir = $D/run
admin_socket = $D/run/\$name.asok
pid_file = $D/run/\$name.pid
log_file = $D/log/\$name.log
mon_cluster_log_file = $D/log/cluster.log
crash_dir = $D/crash
log_to_stderr = false
err_to_stderr = true
debug_ms = 0/0
# RETRY_EXC_ERR and other error completions are logged by Ceph's RDMA stack at level 1
debug_ms_async_rdma = ${DEBUG_RDMA:-1}/5
# single host: replicate across OSDs, let one OSD report another's failure
osd_crush_chooseleaf_type = 0
osd_pool_default_size = 2
osd_pool_default_min_size = 1
osd_pool_default_pg_num = $PG_NUM
osd_pool_default_pgp_num = $PG_NUM
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_osd_reporter_subtree_level = osd
mon_osd_min_down_reporters = 1
mon_warn_on_pool_no_redundancy = false
mon_data_avail_warn = 1
mon_data_avail_crit = 0
mon_max_pg_per_osd = 1000
mgr_stats_period = 1
mgr_initial_modules = status
osd_mon_report_interval = 1
osd_objectstore = memstore
memstore_device_bytes = 1073741824
memstore_page_set = true
osd_memory_target = 939524096
osd_heartbeat_grace = ${HB_GRACE:-20}
osd_heartbeat_interval = ${HB_INTERVAL:-6}
paxos_propose_interval = ${PAXOS_PROPOSE:-1}
${EXTRA_CONF:-}

[client]
admin_socket = $D/run/\$name.\$pid.asok
log_file = $D/log/client.\$pid.log
rados_osd_op_timeout = ${CLIENT_OP_TIMEOUT:-60}

[mon]
mon_data = $D/data/\$name
[mon.a]
public_addr = $MON_IP
[mgr]
mgr_data = $D/data/\$name
[mgr.x]
public_addr = $MGR_IP
[osd]
osd_data = $D/data/\$name
${OSD_EXTRA_CONF:-}
EOF
  local i
  for i in $(seq 0 $((NUM_OSD - 1))); do
    printf '[osd.%s]\npublic_addr = %s\ncluster_addr = %s\n' "$i" "$(osd_ip "$i")" "$(osd_ip "$i")" >>"$CONF"
  done
}

# start_daemon NAME IP CMD...: CMD in the foreground (-f) in the background, its pid
# recorded.
start_daemon() {
  local name=$1 ip=$2; shift 2
  (launch "$ip" "$@") >>"$D/log/$name.out" 2>&1 &
  echo "$name $! $ip" >>"$D/pids"
  disown "$!"   # no job notices when the harness kills it
}

# alive PID: running and not a zombie (a pid gone between the two reads counts as dead).
alive() {
  local st
  st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

daemon_pid() { awk -v n="$1" '$1 == n { p = $2 } END { print p }' "$D/pids"; }

# Every daemon recorded as started is still alive (prints the dead ones).
check_daemons() {
  local name pid ip bad=0
  while read -r name pid ip; do
    [ "${KILLED[$name]:-0}" = 1 ] && continue
    if ! alive "$pid"; then echo "$name (pid $pid, $ip) died" >&2; bad=1; fi
  done <"$D/pids"
  return $bad
}

pgs_state() {
  ceph_cli status -f json 2>/dev/null | python3 -c '
import json, sys
s = json.load(sys.stdin); pm = s["pgmap"]; n = pm.get("num_pgs", 0)
ac = sum(x["count"] for x in pm.get("pgs_by_state", []) if x["state_name"] == "active+clean")
om = s["osdmap"]; up = om.get("num_up_osds", om.get("osdmap", {}).get("num_up_osds"))
print(s["health"]["status"], n, ac, up)
sys.exit(0 if n > 0 and n == ac else 1)'
}

# cluster_up: builds and starts the cluster in $D (must not exist); returns once every
# PG is active+clean (90 s at most).
cluster_up() {
  local t0 fsid i uuid id out=""
  t0=$(now_ms)
  [ -e "$D/ceph.conf" ] && die "$D already holds a cluster"
  mkdir -p "$D"/{run,log,data,crash,rdmx-stats}
  : >"$D/pids"
  fsid=$(uuidgen)
  write_conf "$fsid"
  if [ "$TRANSPORT" = rdma ]; then
    ulimit -l unlimited 2>/dev/null || ulimit -l "$(ulimit -Hl)"
    local need_kib=$(( (RDMA_SEND_BUFFERS + RDMA_RECV_BUFFERS) * (RDMA_BUFFER_SIZE + 4096) / 1024 ))
    local capeff
    capeff=$(awk '/^CapEff:/ { print $2 }' /proc/self/status)
    if [ "$(ulimit -l)" != unlimited ] && [ "$(ulimit -l)" -lt "$need_kib" ] &&
      (( (0x${capeff:-0} >> 14 & 1) == 0 )); then
      # No CAP_IPC_LOCK (bit 14) and a limit below what Ceph's chunks pin: pin nothing.
      say "ulimit -l is $(ulimit -l) KiB (hard $(ulimit -Hl)), no CAP_IPC_LOCK; Ceph's RDMA buffers need ~$need_kib KiB pinned: the daemons run with soft_pin=false"
      RDMX_ARGS+=(--set soft_pin=false)
    fi
  fi
  ceph-authtool --create-keyring "$D/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool "$D/keyring" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
  monmaptool --create --clobber --fsid "$fsid" --addv a "[v2:$MON_IP:3300,v1:$MON_IP:6789]" "$D/monmap" >/dev/null
  ceph-mon -c "$CONF" -i a --mkfs --monmap "$D/monmap" --keyring "$D/keyring" >"$D/log/mon.a.mkfs.out" 2>&1 ||
    { cat "$D/log/mon.a.mkfs.out" >&2; die "ceph-mon --mkfs failed"; }
  start_daemon mon.a "$MON_IP" ceph-mon -f -c "$CONF" -i a
  mkdir -p "$D/data/mgr.x"
  start_daemon mgr.x "$MGR_IP" ceph-mgr -f -c "$CONF" -i x
  for i in $(seq 0 $((NUM_OSD - 1))); do
    uuid=$(uuidgen)
    id=$(ceph_cli osd new "$uuid") || die "ceph osd new failed (is the mon up? $D/log/mon.a.out)"
    [ "$id" = "$i" ] || die "ceph osd new gave id $id, expected $i"
    mkdir -p "$D/data/osd.$id"
    (launch "$(osd_ip "$id")" timeout -s KILL 60 ceph-osd -c "$CONF" -i "$id" --mkfs --osd-uuid "$uuid") \
      >"$D/log/osd.$id.mkfs.out" 2>&1 || { tail -5 "$D/log/osd.$id.mkfs.out" >&2; die "osd.$id --mkfs failed"; }
    start_daemon "osd.$id" "$(osd_ip "$id")" ceph-osd -f -c "$CONF" -i "$id"
  done
  ceph_cli osd pool create "$POOL" "$PG_NUM" "$PG_NUM" replicated >/dev/null 2>&1 || die "pool create failed"
  ceph_cli osd pool application enable "$POOL" rados >/dev/null 2>&1 || true
  # Clean twice in a row: the mgr adds its own pool (1 PG) a moment after the first
  # time all of ours are clean.
  local clean=0
  for _ in $(seq 1 90); do
    if out=$(pgs_state); then
      clean=$((clean + 1))
      [ "$clean" -ge 2 ] && break
    else
      clean=0
    fi
    check_daemons || die "a daemon died during start (logs in $D/log)"
    sleep 1
  done
  [ "$clean" -ge 2 ] || die "PGs not active+clean after 90 s: $out"
  say "cluster up ($TRANSPORT${PROFILE:+, profile $PROFILE}) in $(( $(now_ms) - t0 )) ms: $out (health pgs active+clean osds_up)"
}

# cluster_down: SIGTERM every recorded daemon, SIGKILL after 1 s (memstore data is thrown
# away); keeps $D (logs, counters) unless KEEP=0.
cluster_down() {
  [ -f "${D:-}/pids" ] || return 0
  local name pid ip pids=()
  while read -r name pid ip; do
    alive "$pid" && { kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); }
  done <"$D/pids"
  for _ in $(seq 1 10); do
    local n=0 p
    for p in "${pids[@]}"; do alive "$p" && n=1; done
    [ $n = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do
    if alive "$p"; then kill -KILL "$p" 2>/dev/null || true; fi
  done
  # Wait for the kills to land (the addresses' UDP ports must be free for the next cluster).
  for _ in $(seq 1 50); do
    local n=0 p
    for p in "${pids[@]}"; do alive "$p" && n=1; done
    [ $n = 0 ] && break
    sleep 0.1
  done
  mv "$D/pids" "$D/pids.stopped"
}

# The acting primary of object $1 in the pool.
primary_of() {
  ceph_cli osd map "$POOL" "$1" -f json | python3 -c 'import json,sys; print(json.load(sys.stdin)["acting_primary"])'
}

# cpu_ticks PID...: utime+stime (clock ticks) summed over the pids alive.
cpu_ticks() {
  local p s=0
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] || continue
    s=$((s + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
  done
  echo "$s"
}

daemon_pids() { awk '{print $2}' "$D/pids"; }

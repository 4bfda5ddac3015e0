#!/usr/bin/env bash
# Builds librdmx.a, checks rdmx.pc against rustc's native-static-libs, then builds the C and
# C++ consumers through `pkg-config --cflags --libs rdmx` with -Wall -Wextra -Werror
# -pedantic and runs them under ASan+UBSan and under valgrind (zero errors, zero leaks).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
out="$here/build"
mkdir -p "$out"
cd "$root"

echo "== ffi-tests: building librdmx.a"
libs_line=$(cargo rustc --lib --quiet -- --print native-static-libs 2>&1 | grep 'native-static-libs:' | tail -n1)
rustc_libs=${libs_line#*native-static-libs: }
export PKG_CONFIG_PATH="$root/target/debug/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"

echo "== ffi-tests: rdmx.pc vs rustc --print native-static-libs"
pc_private=$(pkg-config --libs-only-l --static rdmx | tr ' ' '\n' | grep -v '^-lrdmx$' | grep . | sort -u)
want=$(echo "$rustc_libs" | tr ' ' '\n' | grep . | sort -u)
if [ "$pc_private" != "$want" ]; then
  echo "rdmx.pc libraries differ from rustc's native-static-libs:"
  diff <(echo "$want") <(echo "$pc_private") || true
  exit 1
fi
for l in $rustc_libs; do
  pkg-config --libs rdmx | tr ' ' '\n' | grep -qx -- "$l" || { echo "Libs lacks $l"; exit 1; }
done
echo "ok: $rustc_libs"

version=$(pkg-config --modversion rdmx)
cflags="$(pkg-config --cflags rdmx) -DRDMX_EXPECTED_VERSION=\"$version\" -g -Wall -Wextra -Werror -pedantic"
ldlibs=$(pkg-config --libs rdmx)
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"

build() { # build NAME SOURCE EXTRA_FLAGS...
  local name=$1 src=$2; shift 2
  case "$src" in
    *.c)   # shellcheck disable=SC2086
           cc -std=c11 $cflags "$@" -o "$out/$name" "$here/$src" $ldlibs -lpthread ;;
    *.cpp) # shellcheck disable=SC2086
           c++ -std=c++17 $cflags "$@" -o "$out/$name" "$here/$src" $ldlibs ;;
  esac
}
tests=(test_config.c test_config.cpp test_conn.c test_mem.c test_provider.c test_blk.c test_auth.c
  test_blk_acl.c test_stats_size.c test_blk_paths.c test_msgr_pause.c test_msgr_paths.c)
# The messenger echo: a C server, a C client (event records, then callbacks) and a C++ client
# (callbacks on worker threads), as separate processes.
echo_progs=(msgr_echo_server.c msgr_echo_client.c msgr_echo_client.cpp)

echo_run() { # echo_run SUFFIX COUNT RUNNER...: the server, the three clients, the README's
  local sfx=$1 count=$2; shift 2
  local portf="$out/msgr_port$sfx"
  rm -f "$portf"
  # 5 sessions: the C client twice, the C++ client's two, the README's example
  # (examples/msgr_client.c, the same file as in README.md: tests/readme.rs checks).
  "$@" "$out/msgr_echo_server_c$sfx" "$portf" 5 &
  local srv=$!
  local i
  for i in $(seq 1 600); do [ -s "$portf" ] && break; sleep 0.1; done
  [ -s "$portf" ] || { echo "msgr_echo_server did not start"; kill "$srv"; return 1; }
  local addr="127.0.0.1:$(cat "$portf")"
  "$@" "$out/msgr_echo_client_c$sfx" "$addr" poll "$count"
  "$@" "$out/msgr_echo_client_c$sfx" "$addr" callback "$count"
  "$@" "$out/msgr_echo_client_cpp$sfx" "$addr" "$count"
  # The example takes the defaults and the environment (rdmx_msgr_new(NULL, ...)): any
  # free UDP port instead of 4791, which another rdmx process may hold.
  local reply
  reply=$(RDMX_SOFT_PORT=0 "$@" "$out/msgr_client_c$sfx" "$addr")
  echo "$reply"
  [ "$reply" = "reply: type 1, front 'ping', 4096 data bytes" ] ||
    { echo "examples/msgr_client.c: unexpected output"; return 1; }
  wait "$srv"
}

# test_blk talks to an rdmx-target (a memory volume v0) given as its argument. Timeout 18
# (1.07 s) and a 60 s keepalive timeout on both sides: valgrind slows the client ~30x and
# stops it for seconds while it translates code.
# test_blk_acl talks to a second one with keys and grants (keyrings written here).
echo "== ffi-tests: starting rdmx-target for test_blk and test_blk_acl"
cargo build --quiet -p rdmx-target
tpids=()
trap 'kill "${tpids[@]}" 2>/dev/null || true' EXIT
# start_target LOG ARGS...: an rdmx-target in the background; its address in $taddr.
start_target() {
  local tlog=$1
  shift
  : >"$tlog" # exists before the loop below reads it (the server opens it only once started)
  "$root/target/debug/rdmx-target" --listen 127.0.0.1:0 --volume v0=mem:4M \
    --set timeout=18 --set msgr_keepalive_timeout_ms=60000 "$@" >"$tlog" 2>&1 &
  local tpid=$!
  tpids+=("$tpid")
  taddr=""
  for _ in $(seq 100); do
    taddr=$(sed -n 's/^rdmx-target listening on \([^ ]*\) .*/\1/p' "$tlog")
    [ -n "$taddr" ] && break
    kill -0 "$tpid" 2>/dev/null || { cat "$tlog"; echo "rdmx-target exited"; exit 1; }
    sleep 0.1
  done
  [ -n "$taddr" ] || { cat "$tlog"; echo "rdmx-target did not start within 10 s"; exit 1; }
}
start_target "$out/rdmx-target.log"
blk_addr=$taddr
keys="$out/acl-keys"
mkdir -p "$keys"
key_ro=AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=
key_rw=ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=
key_none=QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl8=
ring() { # ring FILE ENTITY KEY [ENTITY KEY]...: a keyring, mode 600
  local f=$1
  shift
  : >"$f"
  chmod 600 "$f"
  while [ $# -gt 0 ]; do printf '[%s]\n    key = %s\n' "$1" "$2" >>"$f"; shift 2; done
}
ring "$keys/server" client.ro "$key_ro" client.rw "$key_rw" client.none "$key_none"
ring "$keys/ro" client.ro "$key_ro"
ring "$keys/rw" client.rw "$key_rw"
ring "$keys/none" client.none "$key_none"
ring "$keys/wrong" client.ro "$key_rw"
start_target "$out/rdmx-target-acl.log" --keyring "$keys/server" --entity osd.0 \
  --allow v0=client.ro:ro,client.rw:rw --set handshake_first_bytes_ms=10000
acl_addr=$taddr
args_of() {
  case "$1" in
    test_blk.c) echo "$blk_addr" ;;
    test_blk_acl.c) echo "$acl_addr $keys" ;;
    # starts (and SIGKILLs) its own two targets on one file volume
    test_blk_paths.c) echo "$root/target/debug/rdmx-target" ;;
  esac
  return 0
}

echo "== ffi-tests: ASan+UBSan"
for t in "${tests[@]}"; do
  name="${t%.*}_${t##*.}"
  build "${name}_san" "$t" $san
  # shellcheck disable=SC2046
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 "$out/${name}_san" $(args_of "$t")
done
for t in "${echo_progs[@]}"; do build "${t%.*}_${t##*.}_san" "$t" $san; done
build msgr_client_c_san ../examples/msgr_client.c $san
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 echo_run _san 2000
# Messenger fault injection (issue 12 point 4; two processes, the program re-executes itself
# as the peer): lossless, 100,000 messages each way under faults on both sides (~40 s here),
# then lossy, the peer SIGKILLed mid-stream three times and 2,000 each way on a new
# session (~2 s). UDP black holes need nftables (root); without it, the other faults only.
build msgr_faults_c_san msgr_faults.c $san
for c in "lossless 100000" "lossy 2000"; do
  # shellcheck disable=SC2086
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    timeout 900 "$out/msgr_faults_c_san" $c
done

echo "== ffi-tests: valgrind"

vg=(valgrind -q --error-exitcode=99 --leak-check=full --trace-children=yes
    --suppressions="$here/valgrind.supp"
    --show-leak-kinds=definite,indirect,possible
    --errors-for-leak-kinds=definite,indirect,possible)
# Runs a program under valgrind; when it fails, says its own last lines again: a program
# that exits on a failure leaves its messenger's threads and memory behind, and valgrind's
# leak report after them would bury the reason (CI shows the end of the log).
vg_run() { # vg_run LABEL COMMAND... (COMMAND starts valgrind: "${vg[@]}" or timeout N "${vg[@]}")
  local label=$1 log="$out/valgrind-last.log" rc=0
  shift
  "$@" 2>&1 | tee "$log" || rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] && return 0
  echo "== ffi-tests: $label failed under valgrind (exit $rc); its own last lines:"
  grep -v '^==[0-9]*==' "$log" | tail -n 20
  return "$rc"
}
for t in "${tests[@]}"; do
  name="${t%.*}_${t##*.}"
  build "$name" "$t" -O1
  if [ "$t" = test_blk_paths.c ]; then
    # The targets it starts are not traced (their leaks are not the client's; one is
    # SIGKILLed on purpose).
    # shellcheck disable=SC2046
    vg_run "$name" "${vg[@]}" --trace-children-skip='*/rdmx-target' "$out/$name" $(args_of "$t")
  elif [ "$t" = test_blk.c ] || [ "$t" = test_blk_acl.c ]; then
    # shellcheck disable=SC2046
    RDMX_TIMEOUT=18 RDMX_MSGR_KEEPALIVE_TIMEOUT_MS=60000 vg_run "$name" "${vg[@]}" "$out/$name" $(args_of "$t")
  elif [ "$t" = test_conn.c ] || [ "$t" = test_mem.c ] || [ "$t" = test_provider.c ] ||
       [ "$t" = test_auth.c ]; then
    # valgrind slows everything ~30x: give the RC ACK timer room (timeout 16 = 268 ms
    # instead of the default 4.2 ms), or retransmission timeouts would fail connections.
    RDMX_TIMEOUT=16 vg_run "$name" "${vg[@]}" "$out/$name"
  else
    vg_run "$name" "${vg[@]}" "$out/$name"
  fi
done
for t in "${echo_progs[@]}"; do build "${t%.*}_${t##*.}" "$t" -O1; done
build msgr_client_c ../examples/msgr_client.c -O1
RDMX_TIMEOUT=16 echo_run "" 200 "${vg[@]}"
# The fault injection with fewer messages (~25 messages/s under valgrind): lossless 1,000
# each way (~45 s), lossy 200 (~20 s). MSGR_FAULTS_SLOW=1 stretches its timers and fault
# intervals 10x; the peers are traced (their leaks count), nft is not; no vgdb FIFOs are
# left behind by the SIGKILLed peers.
build msgr_faults_c msgr_faults.c -O1
for c in "lossless 1000" "lossy 200"; do
  # shellcheck disable=SC2086
  MSGR_FAULTS_SLOW=1 vg_run "msgr_faults $c" timeout 1800 "${vg[@]}" --vgdb=no --trace-children-skip='*/nft' \
    "$out/msgr_faults_c" $c
done
# The verbs provider: the same library, its contexts opening rdmx's libibverbs device
# (rdmx-ibv exec: libibverbs -> rdmx0 -> the soft transport). test_provider.c runs in one
# process. test_conn.c and test_mem.c fork a server on soft, but a device address serves
# one process (RoCEv2 has one UDP port): here their server and client run as two
# processes, each under its own `rdmx-ibv exec` (127.0.0.2 and 127.0.0.3), the server's
# TCP address handed over in a file; test_mem's RLIMIT_MEMLOCK case runs alone. ASan
# must come first in the library list, which the launcher's LD_PRELOAD of the provider
# changes: the check is turned off (the preloaded provider is not instrumented; the test
# and librdmx.a are).
echo "== ffi-tests: provider=verbs under rdmx-ibv exec (ASan+UBSan, valgrind)"
launcher="$root/target/debug/rdmx-ibv"
if [ ! -x "$launcher" ] || [ ! -f "$root/target/debug/librdmx_ibv.so" ]; then
  echo "missing $launcher or librdmx_ibv.so: run cargo build --workspace first"
  exit 1
fi
verbs_pair() { # verbs_pair PROG [--set K=V]... -- [RUNNER...]: server and client processes
  local prog=$1; shift
  local sets=()
  while [ "$1" != -- ]; do sets+=("$1"); shift; done
  shift
  local addrf="$out/$(basename "$prog").addr"
  rm -f "$addrf"
  timeout 300 "$launcher" exec --ip 127.0.0.2 --set provider=verbs "${sets[@]}" -- \
    "$@" "$prog" server "$addrf" &
  local srv=$! rc=0
  timeout 300 "$launcher" exec --ip 127.0.0.3 --set provider=verbs "${sets[@]}" -- \
    "$@" "$prog" client "$addrf" || rc=$?
  [ "$rc" = 0 ] || kill "$srv" 2>/dev/null || true
  wait "$srv" || rc=$?
  [ "$rc" = 0 ] || { echo "$(basename "$prog") on verbs failed ($rc)"; return 1; }
}
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:verify_asan_link_order=0
export UBSAN_OPTIONS=print_stacktrace=1
"$launcher" exec --ip 127.0.0.2 --set provider=verbs -- "$out/test_provider_c_san"
verbs_pair "$out/test_conn_c_san" --
verbs_pair "$out/test_mem_c_san" --
"$launcher" exec --ip 127.0.0.2 --set provider=verbs --set timeout=16 -- \
  "${vg[@]}" "$out/test_provider_c"
verbs_pair "$out/test_conn_c" --set timeout=16 -- "${vg[@]}"
verbs_pair "$out/test_mem_c" --set timeout=16 -- "${vg[@]}"
# The RLIMIT_MEMLOCK case (ASan intercepts mlock: valgrind only). It drops to nobody:
# no vgdb pipes in /tmp that it could not remove.
timeout 300 "$launcher" exec --ip 127.0.0.2 --set provider=verbs -- \
  "${vg[@]}" --vgdb=no "$out/test_mem_c" memlock
# A plain libibverbs program: event records about objects destroyed before the records
# are read (the provider keeps their memory until acknowledged; valgrind sees libibverbs'
# own accesses, ASan the program's).
cc -std=c11 -g -Wall -Wextra -Werror -pedantic $san -o "$out/ibv_async_destroy_san" \
  "$here/ibv_async_destroy.c" -libverbs
cc -std=c11 -g -O1 -Wall -Wextra -Werror -pedantic -o "$out/ibv_async_destroy" \
  "$here/ibv_async_destroy.c" -libverbs
"$launcher" exec --ip 127.0.0.2 -- "$out/ibv_async_destroy_san"
"$launcher" exec --ip 127.0.0.2 -- "${vg[@]}" "$out/ibv_async_destroy"
# UD QPs and address handles through the C API (GRH, src_qp, MTU refusal, no multicast).
cc -std=c11 -g -Wall -Wextra -Werror -pedantic $san -o "$out/ibv_ud_san" "$here/ibv_ud.c" -libverbs
cc -std=c11 -g -O1 -Wall -Wextra -Werror -pedantic -o "$out/ibv_ud" "$here/ibv_ud.c" -libverbs
"$launcher" exec --ip 127.0.0.2 -- "$out/ibv_ud_san"
"$launcher" exec --ip 127.0.0.2 -- "${vg[@]}" "$out/ibv_ud"
echo "== ffi-tests: all passed"

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
           cc -std=c11 $cflags "$@" -o "$out/$name" "$here/$src" $ldlibs ;;
    *.cpp) # shellcheck disable=SC2086
           c++ -std=c++17 $cflags "$@" -o "$out/$name" "$here/$src" $ldlibs ;;
  esac
}
tests=(test_config.c test_config.cpp test_conn.c test_mem.c test_blk.c)

# test_blk talks to an rdmx-target (a memory volume v0) given as its argument. Timeout 18
# (1.07 s) and a 60 s keepalive timeout on both sides: valgrind slows the client ~30x and
# stops it for seconds while it translates code.
echo "== ffi-tests: starting rdmx-target for test_blk"
cargo build --quiet -p rdmx-target
tlog="$out/rdmx-target.log"
"$root/target/debug/rdmx-target" --listen 127.0.0.1:0 --volume v0=mem:4M \
  --set timeout=18 --set msgr_keepalive_timeout_ms=60000 >"$tlog" 2>&1 &
tpid=$!
trap 'kill "$tpid" 2>/dev/null || true' EXIT
taddr=""
for _ in $(seq 100); do
  taddr=$(sed -n 's/^rdmx-target listening on \([^ ]*\) .*/\1/p' "$tlog")
  [ -n "$taddr" ] && break
  kill -0 "$tpid" 2>/dev/null || { cat "$tlog"; echo "rdmx-target exited"; exit 1; }
  sleep 0.1
done
[ -n "$taddr" ] || { cat "$tlog"; echo "rdmx-target did not start within 10 s"; exit 1; }
args_of() { [ "$1" = test_blk.c ] && echo "$taddr"; return 0; }

echo "== ffi-tests: ASan+UBSan"
for t in "${tests[@]}"; do
  name="${t%.*}_${t##*.}"
  build "${name}_san" "$t" $san
  # shellcheck disable=SC2046
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 "$out/${name}_san" $(args_of "$t")
done

echo "== ffi-tests: valgrind"

vg=(valgrind -q --error-exitcode=99 --leak-check=full --trace-children=yes
    --suppressions="$here/valgrind.supp"
    --show-leak-kinds=definite,indirect,possible
    --errors-for-leak-kinds=definite,indirect,possible)
for t in "${tests[@]}"; do
  name="${t%.*}_${t##*.}"
  build "$name" "$t" -O1
  if [ "$t" = test_blk.c ]; then
    RDMX_TIMEOUT=18 RDMX_MSGR_KEEPALIVE_TIMEOUT_MS=60000 "${vg[@]}" "$out/$name" "$taddr"
  elif [ "$t" = test_conn.c ] || [ "$t" = test_mem.c ]; then
    # valgrind slows everything ~30x: give the RC ACK timer room (timeout 16 = 268 ms
    # instead of the default 4.2 ms), or retransmission timeouts would fail connections.
    RDMX_TIMEOUT=16 "${vg[@]}" "$out/$name"
  else
    "${vg[@]}" "$out/$name"
  fi
done
echo "== ffi-tests: all passed"

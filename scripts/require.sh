# shellcheck shell=bash
# What a test script needs from the host, and what it does when the host lacks it: the
# shell side of tests/require/mod.rs. Source it, then where a case would be skipped:
#
#   if ! ip netns add "$ns" 2>/dev/null; then
#     require_missing netns "the two-namespace case" "ip netns add failed" || exit 1
#   else ... fi
#
# By default require_missing prints the skip line and returns 0 (the caller skips the
# case). Under RDMX_TEST_REQUIRE=all (scripts/test.sh sets it), or a comma-separated list
# naming the capability, it prints what is missing and returns 1: the caller fails.

# require_needed CAPABILITY: whether RDMX_TEST_REQUIRE makes CAPABILITY mandatory.
require_needed() {
  local cap=$1 c
  local IFS=,
  for c in ${RDMX_TEST_REQUIRE:-}; do
    c=${c// /}
    c=${c,,}
    [ "$c" = all ] || [ "$c" = "${cap,,}" ] && return 0
  done
  return 1
}

# require_missing CAPABILITY WHAT WHY: the host lacks CAPABILITY, so WHAT cannot run.
require_missing() {
  local cap=$1 what=$2 why=$3
  if require_needed "$cap"; then
    echo "FAIL RDMX_TEST_REQUIRE=$RDMX_TEST_REQUIRE: $what needs $cap, which is missing here: $why" >&2
    return 1
  fi
  echo "skip $what: needs $cap, missing here: $why (RDMX_TEST_REQUIRE=all would fail instead)"
  return 0
}

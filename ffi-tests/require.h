/* What a C test needs from the host, and what it does when the host lacks it: the C side of
 * tests/require/mod.rs and scripts/require.sh. Where a case would be skipped, call
 * require_missing(CAP, WHAT, WHY): by default it prints the skip line and returns (the
 * caller skips the case); under RDMX_TEST_REQUIRE=all, or a comma-separated list naming
 * CAP, it prints what is missing and exits 1. */
#ifndef RDMX_FFI_REQUIRE_H
#define RDMX_FFI_REQUIRE_H

#include <strings.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether RDMX_TEST_REQUIRE makes `cap` mandatory: "all", or a list naming it. */
static int require_needed(const char *cap) {
  const char *v = getenv("RDMX_TEST_REQUIRE");
  if (v == NULL) return 0;
  size_t caplen = strlen(cap);
  while (*v) {
    while (*v == ',' || *v == ' ') v++;
    const char *end = v;
    while (*end && *end != ',' && *end != ' ') end++;
    size_t n = (size_t)(end - v);
    if ((n == 3 && strncasecmp(v, "all", 3) == 0) || (n == caplen && strncasecmp(v, cap, n) == 0))
      return 1;
    v = end;
  }
  return 0;
}

static void require_missing(const char *cap, const char *what, const char *why) {
  if (require_needed(cap)) {
    fprintf(stderr, "FAIL RDMX_TEST_REQUIRE=%s: %s needs %s, which is missing here: %s\n",
            getenv("RDMX_TEST_REQUIRE"), what, cap, why);
    exit(1);
  }
  printf("skip %s: needs %s, missing here: %s (RDMX_TEST_REQUIRE=all would fail instead)\n", what,
         cap, why);
  fflush(stdout);
}

#endif

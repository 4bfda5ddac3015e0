/* Waiting on a connection, shared by test_conn.c, test_mem.c and test_provider.c (include
 * after check.h). wait_for pauses 200 us between empty polls: under valgrind, which runs
 * one thread at a time, a caller spinning on rdmx_poll starved the other context's
 * progress thread for the whole 10 s bound (test_provider, 2 runs in 4). */
#ifndef RDMX_FFI_TESTS_CONN_WAIT_H
#define RDMX_FFI_TESTS_CONN_WAIT_H

#include <rdmx.h>

#include <stdio.h>
#include <time.h>

static inline double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Polls `c` until `want` completions arrived or 10 s passed; returns how many. */
static inline size_t wait_for(rdmx_conn *c, rdmx_completion *out, size_t want) {
  size_t got = 0;
  double end = now_s() + 10.0;
  while (got < want && now_s() < end) {
    size_t n = 0;
    if (rdmx_poll(c, out + got, want - got, &n) != RDMX_OK) {
      fprintf(stderr, "poll: %s\n", rdmx_last_error());
      break;
    }
    got += n;
    if (n == 0) {
      struct timespec pause = {0, 200000};
      nanosleep(&pause, NULL);
    }
  }
  return got;
}

/* Waits up to 10 s for the client to close the connection: posts are refused with
 * RDMX_CLOSED once its side channel is closed. Freeing the connection earlier could
 * overtake what the QP still sends (the NAK of a failure case, which must reach the
 * client before the side channel's EOF). Each probe is a receive on a QP already in the
 * error state, flushed at once; returns how many were posted. */
static inline int wait_peer_gone(rdmx_conn *c, rdmx_sge *r) {
  int probes = 0;
  double end = now_s() + 10.0;
  rdmx_status st;
  while ((st = rdmx_post_recv(c, r, 1, 900)) == RDMX_OK && now_s() < end) {
    probes++;
    rdmx_completion wc[1];
    CHECK(wait_for(c, wc, 1) == 1 && wc[0].status == 5 && wc[0].cookie == 900);
    struct timespec pause = {0, 1000000};
    nanosleep(&pause, NULL);
  }
  CHECK(st == RDMX_CLOSED);
  return probes;
}

#endif

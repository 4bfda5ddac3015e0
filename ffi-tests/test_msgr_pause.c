/* rdmx_session_pause_receive: receive-side flow control through the C ABI. A server pauses
 * the session a client streams numbered messages on: at most the credits the client held
 * (msgr_recv_window) arrive while paused, the client's sends back up to RDMX_FULL in its own
 * queue, nothing resets, and after the resume every message arrives once, in order. NULL and
 * unknown-session arguments get their statuses. Every wait is bounded. */
#define _POSIX_C_SOURCE 200809L
#include <rdmx.h>

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"

#define WINDOW 32
#define MSG_TYPE 3

typedef struct {
  atomic_ulong session; /* the session of the CONNECT event */
  atomic_ulong messages;
  atomic_ulong bad; /* a message out of order */
  atomic_ulong resets;
} side_t;

/* One session per side: its events come on one worker thread, in order. */
static void on_event(void *user, rdmx_msgr *m, const rdmx_msgr_event *ev) {
  side_t *s = (side_t *)user;
  (void)m;
  if (ev->kind == RDMX_MSGR_EVENT_CONNECT) {
    atomic_store(&s->session, ev->session);
  } else if (ev->kind == RDMX_MSGR_EVENT_MESSAGE) {
    size_t len = 0;
    const void *f = rdmx_msg_front(ev->msg, &len);
    uint64_t n = 0;
    if (f != NULL && len == sizeof n) memcpy(&n, f, sizeof n);
    if (n != atomic_load(&s->messages) + 1) atomic_fetch_add(&s->bad, 1);
    atomic_fetch_add(&s->messages, 1);
    rdmx_msg_free(ev->msg);
  } else if (ev->kind == RDMX_MSGR_EVENT_RESET) {
    atomic_fetch_add(&s->resets, 1);
  }
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* Waits (up to 120 s: valgrind) until `*v` reaches `want`. */
static int wait_for(atomic_ulong *v, unsigned long want) {
  double end = now_s() + 120.0;
  while (atomic_load(v) < want) {
    if (now_s() > end) return 0;
    sleep_ms(2);
  }
  return 1;
}

static rdmx_msgr *new_msgr(side_t *s) {
  rdmx_config *cfg = NULL;
  rdmx_msgr *m = NULL;
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
  const char *kv[][2] = {{"soft_port", "0"},           {"msgr_threads", "1"},
                         {"msgr_recv_window", "32"},   {"msgr_send_queue_msgs", "64"},
                         {"msgr_keepalive_ms", "50"},  {"msgr_keepalive_timeout_ms", "30000"}};
  for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
    CHECK_STATUS(rdmx_config_set(cfg, kv[i][0], kv[i][1]), RDMX_OK);
  CHECK_STATUS(rdmx_msgr_new(cfg, on_event, s, &m), RDMX_OK);
  rdmx_config_free(cfg);
  return m;
}

static rdmx_status send_seq(rdmx_msgr *m, uint64_t session, uint64_t n) {
  uint64_t id = 0;
  return rdmx_session_send(m, session, MSG_TYPE, &n, sizeof n, NULL, 0, &id);
}

int main(void) {
  static side_t srv, cli;
  rdmx_msgr *ms = new_msgr(&srv);
  rdmx_msgr *mc = new_msgr(&cli);
  uint16_t port = 0;
  CHECK_STATUS(rdmx_msgr_listen(ms, "127.0.0.1:0", &port), RDMX_OK);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%u", (unsigned)port);
  uint64_t s = 0;
  CHECK_STATUS(rdmx_msgr_connect(mc, addr, RDMX_POLICY_LOSSLESS, &s), RDMX_OK);
  CHECK_STATUS(send_seq(mc, s, 1), RDMX_OK);
  CHECK(wait_for(&srv.messages, 1));
  uint64_t ss = atomic_load(&srv.session);
  CHECK(ss != 0);

  CHECK_STATUS(rdmx_session_pause_receive(ms, ss, 1), RDMX_OK);
  CHECK_STATUS(rdmx_session_pause_receive(ms, ss, 1), RDMX_OK); /* idempotent */
  /* Stream until the client's own queue is full. */
  uint64_t sent = 1;
  rdmx_status st = RDMX_OK;
  double end = now_s() + 60.0;
  while ((st = send_seq(mc, s, sent + 1)) == RDMX_OK && now_s() < end) sent++;
  CHECK_STATUS(st, RDMX_FULL);
  sleep_ms(300); /* six keepalive intervals */
  unsigned long got = atomic_load(&srv.messages);
  printf("paused: %llu sent, %lu delivered\n", (unsigned long long)sent, got);
  CHECK(got <= 1 + WINDOW);
  CHECK(sent > got + 16);

  CHECK_STATUS(rdmx_session_pause_receive(ms, ss, 0), RDMX_OK);
  CHECK(wait_for(&srv.messages, (unsigned long)sent));
  CHECK(atomic_load(&srv.messages) == sent);
  CHECK(atomic_load(&srv.bad) == 0);
  CHECK(atomic_load(&srv.resets) == 0 && atomic_load(&cli.resets) == 0);

  CHECK_STATUS(rdmx_session_pause_receive(NULL, ss, 1), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_session_pause_receive(ms, 0x1234567, 1), RDMX_CLOSED);
  CHECK_ERR_HAS("pause_receive");

  rdmx_msgr_free(mc);
  rdmx_msgr_free(ms);
  CHECK_DONE("test_msgr_pause");
}

/* A messenger session over two paths through rdmx.h (issue 30 point 1): a server listening
 * on every loopback address and a client that connects to it over 127.0.0.1 (path 0) and
 * 127.0.0.2 (path 1) with rdmx_msgr_connect_paths, both in this process, each polled for
 * event records (msgr_threads = 0). Checks: NULL and bad arguments give a status and a
 * message; both paths come up (rdmx_msgr_path_info); numbered messages flow while a QP
 * error hits the active path; every message arrives exactly once and in order with no
 * reset; the path events (rdmx_msgr_next_path_event) say path 0 down then path 1 active;
 * path 0 rejoins and takes the traffic back (failback); the counters agree; a path is
 * removed and added. Then a second session with RDMX_PATH_POLICY_ACTIVE: both paths
 * active and both carrying messages (msgs_sent of each), a QP error mid-stream, every
 * message exactly once and in order, no reset. Every wait is bounded. */
#define _GNU_SOURCE
#include <rdmx.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

#define N 600

static rdmx_msgr *cli, *srv;
static uint64_t last_seq, delivered, bad, resets, acked;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Drains both messengers' events once (each poll makes progress). */
static void pump(void) {
  rdmx_msgr *ms[2] = {cli, srv};
  for (int k = 0; k < 2; k++) {
    rdmx_msgr_event ev[64];
    size_t n = 0;
    if (rdmx_msgr_poll(ms[k], 1, ev, 64, &n) != RDMX_OK) {
      fprintf(stderr, "poll: %s\n", rdmx_last_error());
      bad++;
      return;
    }
    for (size_t i = 0; i < n; i++) {
      if (ev[i].kind == RDMX_MSGR_EVENT_MESSAGE) {
        size_t len = 0;
        const void *front = rdmx_msg_front(ev[i].msg, &len);
        uint64_t seq = 0;
        if (len == sizeof seq) memcpy(&seq, front, sizeof seq);
        if (seq != last_seq + 1) {
          fprintf(stderr, "message %llu after %llu\n", (unsigned long long)seq,
                  (unsigned long long)last_seq);
          bad++;
        }
        last_seq = seq;
        delivered++;
        rdmx_msg_free(ev[i].msg);
      } else if (ev[i].kind == RDMX_MSGR_EVENT_RESET) {
        fprintf(stderr, "reset: %s\n", ev[i].text);
        resets++;
      } else if (ev[i].kind == RDMX_MSGR_EVENT_SEND_COMPLETE) {
        if (ev[i].status == RDMX_OK) {
          acked++;
        } else {
          fprintf(stderr, "send failed: %s\n", ev[i].text);
          bad++;
        }
      }
    }
  }
}

static uint32_t path_state(uint64_t s, uint32_t i) {
  rdmx_msgr_path p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  if (rdmx_msgr_path_info(cli, s, i, &p) != RDMX_OK) return 99;
  return p.state;
}

/* Pumps until path `i` of `s` is in `state` (bounded). */
static int wait_state(uint64_t s, uint32_t i, uint32_t state) {
  double end = now_s() + 60;
  while (now_s() < end) {
    if (path_state(s, i) == state) return 1;
    pump();
  }
  fprintf(stderr, "path %u never reached state %u (is %u)\n", i, state, path_state(s, i));
  return 0;
}

static void send_range(uint64_t s, uint64_t from, uint64_t to) {
  double end = now_s() + 60;
  uint64_t seq = from;
  while (seq < to && now_s() < end) {
    rdmx_status st = rdmx_session_send(cli, s, 7, &seq, sizeof seq, NULL, 0, NULL);
    if (st == RDMX_OK) {
      seq++;
    } else if (st == RDMX_FULL) {
      pump();
    } else {
      fprintf(stderr, "send %llu: %s\n", (unsigned long long)seq, rdmx_last_error());
      bad++;
      return;
    }
  }
  CHECK(seq == to);
}

/* The next path event of the client; kind NONE when there is none. */
static rdmx_msgr_path_event next_event(void) {
  rdmx_msgr_path_event e;
  memset(&e, 0, sizeof e);
  e.struct_size = sizeof e;
  CHECK_STATUS(rdmx_msgr_next_path_event(cli, &e), RDMX_OK);
  return e;
}

int main(void) {
  rdmx_config *cfg = NULL;
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "soft_port", "0"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "msgr_keepalive_ms", "50"), RDMX_OK);
  /* Room for valgrind (~30x slower): a longer RC ACK timeout (268 ms) and keepalive
   * timeout; a QP error is seen at once all the same. */
  CHECK_STATUS(rdmx_config_set(cfg, "timeout", "16"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "msgr_keepalive_timeout_ms", "10000"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "msgr_reconnect_min_ms", "5"), RDMX_OK);
  CHECK_STATUS(rdmx_msgr_new(cfg, NULL, NULL, &srv), RDMX_OK);
  CHECK_STATUS(rdmx_msgr_new(cfg, NULL, NULL, &cli), RDMX_OK);
  rdmx_config_free(cfg);
  if (!srv || !cli) return 1;
  uint16_t port = 0;
  CHECK_STATUS(rdmx_msgr_listen(srv, "0.0.0.0:0", &port), RDMX_OK);
  char a0[64], a1[64];
  snprintf(a0, sizeof a0, "127.0.0.1:%u", port);
  snprintf(a1, sizeof a1, "127.0.0.2:%u", port);
  const char *addrs[2] = {a0, a1};
  uint64_t s = 0;
  uint32_t s32 = 0;

  /* Bad arguments: a status and a message, nothing made. */
  CHECK_STATUS(rdmx_msgr_connect_paths(NULL, addrs, 2, RDMX_POLICY_LOSSLESS,
                                       RDMX_PATH_POLICY_STANDBY, &s),
               RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_msgr_connect_paths(cli, NULL, 2, RDMX_POLICY_LOSSLESS,
                                       RDMX_PATH_POLICY_STANDBY, &s),
               RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("addrs is NULL");
  CHECK_STATUS(rdmx_msgr_connect_paths(cli, addrs, 0, RDMX_POLICY_LOSSLESS,
                                       RDMX_PATH_POLICY_STANDBY, &s),
               RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_msgr_connect_paths(cli, addrs, 2, RDMX_POLICY_LOSSLESS, 7, &s),
               RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("path_policy 7");
  CHECK_STATUS(rdmx_msgr_connect_paths(cli, addrs, 2, RDMX_POLICY_LOSSLESS,
                                       RDMX_PATH_POLICY_STANDBY, NULL),
               RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_msgr_next_path_event(cli, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_msgr_path_info(NULL, 1, 0, NULL), RDMX_INVALID_ARGUMENT);
  /* A session this messenger does not have: as for the other session calls. */
  CHECK_STATUS(rdmx_msgr_path_count(cli, 12345, &s32), RDMX_CLOSED);

  CHECK_STATUS(rdmx_msgr_connect_paths(cli, addrs, 2, RDMX_POLICY_LOSSLESS,
                                       RDMX_PATH_POLICY_STANDBY, &s),
               RDMX_OK);
  CHECK(wait_state(s, 0, RDMX_PATH_ACTIVE));
  CHECK(wait_state(s, 1, RDMX_PATH_STANDBY));
  uint32_t count = 0;
  CHECK_STATUS(rdmx_msgr_path_count(cli, s, &count), RDMX_OK);
  CHECK(count == 2);
  rdmx_msgr_path p;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  CHECK_STATUS(rdmx_msgr_path_info(cli, s, 2, &p), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("the session has 2");
  /* Drain the join event(s). */
  while (next_event().kind != RDMX_PATH_EVENT_NONE) {
  }

  /* Traffic, a QP error on the active path with messages in flight, more traffic. */
  send_range(s, 1, N / 2);
  CHECK_STATUS(rdmx_session_inject_fault(cli, s, RDMX_FAULT_QP_ERROR), RDMX_OK);
  send_range(s, N / 2, N);
  /* Path 0 down, then the traffic on path 1 (events in order). */
  int seen_down = 0, seen_active = 0;
  double end = now_s() + 60;
  while (!(seen_down && seen_active) && now_s() < end) {
    pump();
    rdmx_msgr_path_event e = next_event();
    if (e.kind == RDMX_PATH_EVENT_DOWN && e.path == 0) {
      CHECK(e.session == s);
      CHECK(strlen(e.reason) > 0);
      seen_down = 1;
    } else if (e.kind == RDMX_PATH_EVENT_ACTIVE && e.path == 1) {
      CHECK(seen_down);
      seen_active = 1;
    }
  }
  CHECK(seen_down && seen_active);
  /* Path 0 rejoins and takes the traffic back. */
  CHECK(wait_state(s, 0, RDMX_PATH_ACTIVE));
  end = now_s() + 60;
  while ((delivered < N - 1 || acked < N - 1) && now_s() < end) pump();
  CHECK(delivered == N - 1);
  CHECK(acked == N - 1);
  CHECK(last_seq == N - 1);
  CHECK(bad == 0);
  CHECK(resets == 0);
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  CHECK_STATUS(rdmx_msgr_path_info(cli, s, 0, &p), RDMX_OK);
  CHECK(p.struct_size == sizeof p);
  CHECK(p.faults >= 1);
  CHECK(p.switches >= 1);
  CHECK(p.since_last_fault_us != UINT64_MAX);
  CHECK_STATUS(rdmx_msgr_path_info(cli, s, 1, &p), RDMX_OK);
  CHECK(p.switches >= 1);
  CHECK(p.msgs_sent > 0);

  /* Remove the active path: the traffic moves; the last path stays; add one back. */
  CHECK_STATUS(rdmx_msgr_remove_path(cli, s, 0), RDMX_OK);
  CHECK(wait_state(s, 1, RDMX_PATH_ACTIVE));
  CHECK_STATUS(rdmx_msgr_remove_path(cli, s, 1), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("last path");
  uint32_t idx = 0;
  CHECK_STATUS(rdmx_msgr_add_path(cli, s, NULL, &idx), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_msgr_add_path(cli, s, a0, &idx), RDMX_OK);
  CHECK(idx == 2);
  /* A later index is less preferred: it joins as standby, path 1 keeps the traffic. */
  CHECK(wait_state(s, 2, RDMX_PATH_STANDBY));
  CHECK(path_state(s, 1) == RDMX_PATH_ACTIVE);
  CHECK(bad == 0 && resets == 0);

  /* Active/active: every joined path carries messages. */
  uint64_t sa = 0;
  CHECK_STATUS(rdmx_msgr_connect_paths(cli, addrs, 2, RDMX_POLICY_LOSSLESS,
                                       RDMX_PATH_POLICY_ACTIVE, &sa),
               RDMX_OK);
  CHECK(wait_state(sa, 0, RDMX_PATH_ACTIVE));
  CHECK(wait_state(sa, 1, RDMX_PATH_ACTIVE));
  last_seq = 0;
  delivered = 0;
  acked = 0;
  /* Sends keep the queue fuller than one path's credits: both paths take messages. */
  send_range(sa, 1, N / 2);
  end = now_s() + 60;
  while ((delivered < N / 2 - 1 || acked < N / 2 - 1) && now_s() < end) pump();
  CHECK(delivered == N / 2 - 1);
  uint64_t sent0 = 0, sent1 = 0;
  memset(&p, 0, sizeof p);
  p.struct_size = sizeof p;
  CHECK_STATUS(rdmx_msgr_path_info(cli, sa, 0, &p), RDMX_OK);
  sent0 = p.msgs_sent;
  CHECK_STATUS(rdmx_msgr_path_info(cli, sa, 1, &p), RDMX_OK);
  sent1 = p.msgs_sent;
  printf("test_msgr_paths: active/active: %llu messages on path 0, %llu on path 1\n",
         (unsigned long long)sent0, (unsigned long long)sent1);
  CHECK(sent0 > 0 && sent1 > 0);
  /* A QP error on one path with messages in flight: nothing lost, nothing twice. */
  CHECK_STATUS(rdmx_session_inject_fault(cli, sa, RDMX_FAULT_QP_ERROR), RDMX_OK);
  send_range(sa, N / 2, N);
  end = now_s() + 60;
  while ((delivered < N - 1 || acked < N - 1) && now_s() < end) pump();
  CHECK(delivered == N - 1);
  CHECK(acked == N - 1);
  CHECK(last_seq == N - 1);
  CHECK(bad == 0);
  CHECK(resets == 0);

  rdmx_session_close(cli, sa);
  rdmx_session_close(cli, s);
  rdmx_msgr_free(cli);
  rdmx_msgr_free(srv);
  printf("test_msgr_paths: %d checks, %d failed\n", check_count, check_failures);
  return check_failures == 0 ? 0 : 1;
}

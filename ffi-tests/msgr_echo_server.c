/* Messenger echo server: `msgr_echo_server PORT_FILE CLIENTS`. Event records drained by
 * this thread while one worker thread (msgr_threads = 1) makes progress; waits on the
 * messenger's event fd with epoll. Echoes every ECHO message on its session: the data
 * segments are sent back as they were received (RDMX_SEG_RECEIVED, no copy), every 4th as
 * a copy (RDMX_SEG_COPY); a refused send (RDMX_FULL) waits, in order, for SEND_READY. Exits
 * when CLIENTS clients sent QUIT and their sessions ended, after checking that the pools are
 * back to their baseline. */
#define _POSIX_C_SOURCE 200809L
#include <rdmx.h>

#include <stdint.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "msgr_echo.h"

#define MAX_SESSIONS 16
#define RING 4096

typedef struct {
  uint64_t id;
  int live;
  rdmx_msg *pending[RING]; /* echoes refused with FULL, oldest first */
  size_t head, len;
} session;

static session sessions[MAX_SESSIONS];
static uint64_t outstanding; /* accepted sends without their completion */
static uint64_t echoed; /* over every session */
static int quits, resets, failures_seen;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static session *find(uint64_t id) {
  for (int i = 0; i < MAX_SESSIONS; i++)
    if (sessions[i].live && sessions[i].id == id) return &sessions[i];
  return NULL;
}

/* Sends the echo of `msg` (consumed on success). RDMX_FULL leaves it untouched. */
static rdmx_status echo(rdmx_msgr *m, uint64_t s, rdmx_msg *msg) {
  size_t flen = 0;
  const void *front = rdmx_msg_front(msg, &flen);
  size_t nseg = rdmx_msg_seg_count(msg);
  rdmx_msg_iov iov[4];
  rdmx_iov piece[1];
  if (nseg > 4) return RDMX_INVALID_ARGUMENT;
  int copy = (rdmx_msg_seq(msg) % 4) == 3;
  for (size_t i = 0; i < nseg; i++) {
    memset(&iov[i], 0, sizeof iov[i]);
    size_t n = 0;
    if (copy && rdmx_msg_seg_iov(msg, i, piece, 1, &n) == RDMX_OK) {
      /* One piece (<= 4 KiB): send a copy of it. */
      iov[i].kind = RDMX_SEG_COPY;
      iov[i].addr = piece[0].base;
      iov[i].length = piece[0].len;
    } else {
      iov[i].kind = RDMX_SEG_RECEIVED;
      iov[i].msg = msg;
      iov[i].index = i;
    }
  }
  rdmx_status st = rdmx_session_send(m, s, rdmx_msg_type(msg), front, flen, iov, nseg, NULL);
  if (st == RDMX_OK) {
    outstanding++;
    rdmx_msg_free(msg); /* its received segments moved into the send */
  }
  return st;
}

/* Retries the refused echoes of `ss`, oldest first, until one is refused again. */
static void drain_pending(rdmx_msgr *m, session *ss) {
  while (ss->len > 0) {
    rdmx_msg *msg = ss->pending[ss->head];
    rdmx_status st = echo(m, ss->id, msg);
    if (st == RDMX_FULL) return;
    if (st != RDMX_OK) {
      fprintf(stderr, "server: echo retry: %s\n", rdmx_last_error());
      rdmx_msg_free(msg);
      failures_seen++;
    } else {
      echoed++;
    }
    ss->head = (ss->head + 1) % RING;
    ss->len--;
  }
}

static void on_event(rdmx_msgr *m, const rdmx_msgr_event *ev) {
  session *ss = find(ev->session);
  switch (ev->kind) {
    case RDMX_MSGR_EVENT_CONNECT:
      CHECK(ev->incoming == 1);
      CHECK(strncmp(ev->text, "127.0.0.1:", 10) == 0);
      for (int i = 0; i < MAX_SESSIONS; i++) {
        if (!sessions[i].live) {
          memset(&sessions[i], 0, sizeof sessions[i]);
          sessions[i].live = 1;
          sessions[i].id = ev->session;
          break;
        }
      }
      break;
    case RDMX_MSGR_EVENT_MESSAGE:
      CHECK(ss != NULL);
      if (ss == NULL) {
        rdmx_msg_free(ev->msg);
      } else if (rdmx_msg_type(ev->msg) == QUIT_TYPE) {
        quits++;
        rdmx_msg_free(ev->msg);
      } else if (ss->len > 0) {
        CHECK(ss->len < RING);
        ss->pending[(ss->head + ss->len) % RING] = ev->msg;
        ss->len++;
      } else {
        rdmx_status st = echo(m, ev->session, ev->msg);
        if (st == RDMX_FULL) {
          ss->pending[ss->head] = ev->msg;
          ss->len = 1;
        } else if (st != RDMX_OK) {
          fprintf(stderr, "server: echo: %s\n", rdmx_last_error());
          failures_seen++;
          rdmx_msg_free(ev->msg);
        } else {
          echoed++;
        }
      }
      break;
    case RDMX_MSGR_EVENT_SEND_COMPLETE:
      CHECK(outstanding > 0);
      outstanding--;
      /* A session the client closed fails its last sends: only count it. */
      if (ev->status != RDMX_OK) failures_seen++;
      if (ss) drain_pending(m, ss);
      break;
    case RDMX_MSGR_EVENT_SEND_READY:
      if (ss) drain_pending(m, ss);
      break;
    case RDMX_MSGR_EVENT_RESET:
      resets++;
      if (ss) {
        while (ss->len > 0) {
          rdmx_msg_free(ss->pending[ss->head]);
          ss->head = (ss->head + 1) % RING;
          ss->len--;
        }
        ss->live = 0;
      }
      break;
    default:
      CHECK(!"unknown event kind");
  }
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s PORT_FILE CLIENTS\n", argv[0]);
    return 2;
  }
  int clients = atoi(argv[2]);
  rdmx_config *cfg = NULL;
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "soft_port", "0"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "msgr_threads", "1"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "msgr_keepalive_timeout_ms", "30000"), RDMX_OK);
  /* A client that went away without a bye is given up after 2 x 5 s. */
  CHECK_STATUS(rdmx_config_set(cfg, "msgr_reconnect_timeout_ms", "5000"), RDMX_OK);
  rdmx_msgr *m = NULL;
  CHECK_STATUS(rdmx_msgr_new(cfg, NULL, NULL, &m), RDMX_OK);
  rdmx_config_free(cfg);
  if (m == NULL) CHECK_DONE("msgr_echo_server");

  rdmx_msgr_stats base = {.struct_size = sizeof base};
  CHECK_STATUS(rdmx_msgr_get_stats(m, &base), RDMX_OK);
  uint16_t port = 0;
  CHECK_STATUS(rdmx_msgr_listen(m, "127.0.0.1:0", &port), RDMX_OK);
  CHECK_STATUS(rdmx_msgr_listen(m, "127.0.0.1:0", NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("already listening");
  {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", argv[1]);
    FILE *f = fopen(tmp, "w");
    CHECK(f != NULL);
    if (f) {
      fprintf(f, "%u\n", (unsigned)port);
      fclose(f);
      CHECK(rename(tmp, argv[1]) == 0);
    }
  }

  int ep = epoll_create1(0);
  struct epoll_event want = {.events = EPOLLIN, .data = {.u64 = 0}};
  int efd = rdmx_msgr_event_fd(m);
  CHECK(efd >= 0);
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, efd, &want) == 0);

  /* Until every client quit and its session ended (bounded: valgrind is slow). */
  double end = now_s() + 300.0;
  int wakeups = 0;
  while (now_s() < end && !(quits >= clients && resets >= clients && outstanding == 0)) {
    struct epoll_event got;
    int r = epoll_wait(ep, &got, 1, 100);
    if (r > 0) wakeups++;
    rdmx_msgr_event evs[32];
    size_t n = 0;
    do {
      CHECK_STATUS(rdmx_msgr_poll(m, 0, evs, 32, &n), RDMX_OK);
      for (size_t i = 0; i < n; i++) on_event(m, &evs[i]);
    } while (n == 32);
  }
  close(ep);
  CHECK(quits == clients);
  CHECK(resets >= clients);
  CHECK(outstanding == 0);
  CHECK(wakeups > 0);
  printf("server: %d clients, %llu echoes, %d failed sends (closed sessions), %d wakeups\n",
         quits, (unsigned long long)echoed, failures_seen, wakeups);

  /* Pools back to their baseline once the ended sessions' connections drained. */
  rdmx_msgr_stats st = {.struct_size = sizeof st};
  double until = now_s() + 10.0;
  do {
    struct timespec pause = {0, 20000000};
    nanosleep(&pause, NULL);
    CHECK_STATUS(rdmx_msgr_get_stats(m, &st), RDMX_OK);
  } while (now_s() < until && (st.data_chunks_in_use != base.data_chunks_in_use ||
                               st.header_slots_in_use != base.header_slots_in_use));
  CHECK(st.sessions == 0);
  CHECK(st.missed_wakes == 0);
  CHECK(st.data_chunks_in_use == base.data_chunks_in_use);
  CHECK(st.header_slots_in_use == base.header_slots_in_use);
  CHECK(st.copy_chunks_in_use == 0);
  CHECK(st.events_queued == 0);
  rdmx_session_counters totals = {.struct_size = sizeof totals};
  CHECK_STATUS(rdmx_msgr_get_totals(m, &totals), RDMX_OK);
  CHECK(totals.rnr_naks == 0);
  CHECK(totals.msgs_received >= echoed);
  printf("server: data chunks in use %u (baseline %u), header slots %u, copied %llu B\n",
         st.data_chunks_in_use, base.data_chunks_in_use, st.header_slots_in_use,
         (unsigned long long)totals.copied_bytes);
  rdmx_msgr_free(m);
  CHECK_DONE("msgr_echo_server");
}

/* Issue 12 point 4 through the C ABI: two processes exchange numbered messages (front =
 * sequence number + FNV-1a of the 4 KiB data page) while faults hit at random every
 * 50-200 ms, as Ceph's test_msgr injects socket failures. The reference is the Rust test
 * tests/msgr_process_faults.rs; this program checks the same through rdmx.h.
 *
 *   msgr_faults lossless [N]   N messages each way (default MSGR_FAULTS_MESSAGES or 100000)
 *                              while both processes inject faults: side-channel closes and QP
 *                              errors through rdmx_session_inject_fault on both sides, and
 *                              (this side) UDP black holes longer than the retry budget,
 *                              made of nftables rules on the two processes' UDP ports where
 *                              `nft` works (MSGR_FAULTS_NO_BLACK_HOLE=1: none). Every message
 *                              delivered exactly once, in order, content verified, on both
 *                              sides; both reconnected; no reset; every send completed OK;
 *                              pools back to their baseline in both processes.
 *   msgr_faults lossy [N]      three times: a lossy child SIGKILLed 50-200 ms into a stream
 *                              (once both sides delivered something): a prompt reset (time
 *                              printed), every accepted send completed (the unacknowledged
 *                              ones with an error), pools back to their baseline; then a new
 *                              child exchanges min(N, 2000) each way on a new session.
 *   msgr_faults peer ADDR lossless|lossy N FAULTS
 *                              the child (run by the two above: fork + exec of this program,
 *                              stdout lines to the parent, "exit" or EOF on stdin to end).
 *
 * The parent drains event records (rdmx_msgr_poll on the event fd) while a worker thread
 * makes progress; the child gets callbacks on its worker thread. Data goes as a copy, a lent
 * pool chunk or a slot of a registered buffer in turn. MSGR_FAULTS_SLOW=1 (valgrind) gives
 * the timers room: a longer RC ACK timeout and keepalive timeout, longer black holes, longer
 * waits. Every wait is bounded (deadlines, and alarm() as the last resort); a child is
 * SIGKILLed on any failure (and dies with its parent: PR_SET_PDEATHSIG). Exit status 0 only
 * if every check passed. */
#define _GNU_SOURCE
#include <rdmx.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "require.h"

#define PAGE 4096
#define MSG_TYPE 7
#define BURST 128 /* sends per pump call: the loops look at the clock and the peer between */
#define SLOTS 256 /* registered 4 KiB slots for RDMX_SEG_MEM data */
#define FIFO 8192 /* accepted sends awaiting completion (msgr_send_queue_msgs is 4096) */
#define MAX_SESSIONS 8
#define LOSSY_ROUNDS 3
#define FINAL_MAX 2000 /* messages each way on the lossy case's last session */

/* ---- messages, checksums, time ---- */

typedef struct {
  uint64_t seq; /* 1, 2, ... */
  uint64_t sum; /* fnv64 of the data page */
} front_t;

/* Message `seq`'s data: byte i is (seq * 31) ^ i (mod 256), so there are 256 different
 * pages: made once with their checksums (byte loops under ASan and valgrind would cost more
 * than the messenger). A page received intact equals pages[page_of(seq)] byte for byte,
 * which also gives it the checksum sums[...]. */
static uint8_t pages[256][PAGE];
static uint64_t sums[256];

static size_t page_of(uint64_t seq) { return (size_t)((seq * 31u) & 0xff); }

static uint64_t fnv64(const uint8_t *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

static void make_pages(void) {
  for (size_t k = 0; k < 256; k++) {
    for (size_t i = 0; i < PAGE; i++) pages[k][i] = (uint8_t)(k ^ i);
    sums[k] = fnv64(pages[k], PAGE);
  }
}

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void sleep_us(long us) {
  struct timespec t = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&t, NULL);
}

static int slow; /* MSGR_FAULTS_SLOW=1: under valgrind */

/* 50-200 ms from now; slow: 0.5-2 s (a reconnect under valgrind takes ~100x longer: faults
 * every 50-200 ms would leave the session reconnecting most of the time). */
static double next_fault_time(uint64_t *rng) {
  return now_s() + (50.0 + (double)(rnd(rng) % 151)) / 1e3 * (slow ? 10.0 : 1.0);
}

/* Scales a wait for valgrind (~30-50x slower). */
static double wait_s(double plain) { return slow ? plain * 10.0 : plain; }

/* rdmx's log lines (any thread): the transport's "retry counter exceeded" warnings are
 * counted (each is a QP whose tries all went into a black hole: the evidence that a hole
 * outlasted the retry budget) and only the first is shown; everything else goes to stderr. */
static atomic_ulong retry_exceeded;

static void on_log(void *user, rdmx_log_level level, const char *message) {
  (void)user;
  if (strstr(message, "RETRY_EXC_ERR") != NULL && atomic_fetch_add(&retry_exceeded, 1) > 0) return;
  fprintf(stderr, "[%d] rdmx %s: %s\n", (int)getpid(), level <= RDMX_LOG_ERROR ? "error" : "warning",
          message);
}

/* ---- per-session bookkeeping (both roles) ---- */

typedef struct {
  uint64_t id;
  int32_t slot; /* registered slot of an RDMX_SEG_MEM send, else -1 */
} pending_t;

/* What the checks read of a session (copied out under the lock). */
typedef struct {
  uint64_t id;
  int used;
  double opened, reset_at;
  uint64_t next; /* last sequence number delivered (the next must be next + 1) */
  uint64_t bad, ok, failed;
  uint64_t sent; /* accepted sends */
  size_t len;    /* of which not completed yet */
  int reset;
  rdmx_status reset_status;
  char why[256];
  char first_failure[256];
} view_t;

typedef struct {
  view_t v;
  pending_t fifo[FIFO]; /* accepted sends in send order (completions come in that order) */
  size_t head;
} sess_t;

/* What one process holds. `lock` guards everything the event handler touches: the child's
 * callbacks run on its worker thread; the parent handles event records on its own thread
 * (the lock is then uncontended). */
typedef struct {
  rdmx_msgr *m;
  pthread_mutex_t lock;
  sess_t s[MAX_SESSIONS];
  uint64_t anomalies; /* events that should not happen (counted under the lock) */
  uint8_t *ring;      /* SLOTS registered pages */
  rdmx_mem mem;
  int free_slots[SLOTS];
  int nfree;
  uint8_t scratch[PAGE];
  int incoming; /* what CONNECT events must say */
} proc_t;

static proc_t P;

/* The session record of `id`; created if `create` (NULL when full or absent). Locked. */
static sess_t *sess_of(uint64_t id, int create) {
  for (int i = 0; i < MAX_SESSIONS; i++)
    if (P.s[i].v.used && P.s[i].v.id == id) return &P.s[i];
  if (!create) return NULL;
  for (int i = 0; i < MAX_SESSIONS; i++) {
    if (!P.s[i].v.used) {
      memset(&P.s[i], 0, sizeof P.s[i]);
      P.s[i].v.used = 1;
      P.s[i].v.id = id;
      return &P.s[i];
    }
  }
  return NULL;
}

/* Checks a received message: its front, sequence number (exactly the next), its one 4 KiB
 * segment's checksum and every byte. Frees it. Locked. */
static void receive(sess_t *ss, rdmx_msg *msg) {
  size_t flen = 0;
  const void *fp = rdmx_msg_front(msg, &flen);
  front_t f;
  memset(&f, 0, sizeof f);
  int good = fp != NULL && flen == sizeof f;
  if (good) memcpy(&f, fp, sizeof f);
  good = good && rdmx_msg_type(msg) == MSG_TYPE && f.seq == ss->v.next + 1 &&
         rdmx_msg_seq(msg) == f.seq && rdmx_msg_seg_count(msg) == 1 &&
         rdmx_msg_seg_len(msg, 0) == PAGE;
  rdmx_iov iov[2];
  size_t n = 0;
  good = good && rdmx_msg_seg_iov(msg, 0, iov, 2, &n) == RDMX_OK && n == 1 && iov[0].len == PAGE;
  if (good) {
    const uint8_t *b = (const uint8_t *)iov[0].base;
    good = f.sum == sums[page_of(f.seq)] && memcmp(b, pages[page_of(f.seq)], PAGE) == 0;
  }
  if (!good) {
    if (ss->v.bad < 5)
      fprintf(stderr, "[%d] bad message on session %#llx: seq %llu (msg seq %llu), expected %llu\n",
              (int)getpid(), (unsigned long long)ss->v.id, (unsigned long long)f.seq,
              (unsigned long long)rdmx_msg_seq(msg), (unsigned long long)ss->v.next + 1);
    ss->v.bad++;
  }
  if (fp != NULL && flen == sizeof f) ss->v.next = f.seq;
  rdmx_msg_free(msg);
}

/* One event of either role. Locked by the caller. */
static void handle(const rdmx_msgr_event *ev) {
  sess_t *ss = sess_of(ev->session, ev->kind == RDMX_MSGR_EVENT_CONNECT);
  if (ss == NULL) {
    fprintf(stderr, "[%d] event %u for unknown session %#llx\n", (int)getpid(), ev->kind,
            (unsigned long long)ev->session);
    P.anomalies++;
    if (ev->kind == RDMX_MSGR_EVENT_MESSAGE) rdmx_msg_free(ev->msg);
    return;
  }
  switch (ev->kind) {
    case RDMX_MSGR_EVENT_CONNECT:
      if ((int)ev->incoming != P.incoming || strncmp(ev->text, "127.0.0.1:", 10) != 0) P.anomalies++;
      ss->v.opened = now_s();
      break;
    case RDMX_MSGR_EVENT_MESSAGE:
      receive(ss, ev->msg);
      break;
    case RDMX_MSGR_EVENT_SEND_COMPLETE:
      /* Exactly one per accepted send, in send order. */
      if (ss->v.len == 0 || ss->fifo[ss->head].id != ev->send_id) {
        fprintf(stderr, "[%d] completion of send %llu, expected %llu\n", (int)getpid(),
                (unsigned long long)ev->send_id,
                (unsigned long long)(ss->v.len ? ss->fifo[ss->head].id : 0));
        P.anomalies++;
      }
      if (ss->v.len > 0) {
        int32_t slot = ss->fifo[ss->head].slot;
        if (slot >= 0) P.free_slots[P.nfree++] = slot;
        ss->head = (ss->head + 1) % FIFO;
        ss->v.len--;
      }
      if (ev->status == RDMX_OK) {
        ss->v.ok++;
      } else {
        if (ss->v.failed == 0) snprintf(ss->v.first_failure, sizeof ss->v.first_failure, "%s: %s",
                                      rdmx_status_str((int)ev->status), ev->text);
        ss->v.failed++;
      }
      break;
    case RDMX_MSGR_EVENT_SEND_READY:
      break; /* the pump retries anyway */
    case RDMX_MSGR_EVENT_RESET:
      if (ss->v.reset) P.anomalies++;
      ss->v.reset = 1;
      ss->v.reset_at = now_s();
      ss->v.reset_status = ev->status;
      snprintf(ss->v.why, sizeof ss->v.why, "%s", ev->text);
      break;
    default:
      P.anomalies++;
  }
}

/* The child's callback (its worker thread). */
static void on_event(void *user, rdmx_msgr *m, const rdmx_msgr_event *ev) {
  (void)user;
  (void)m;
  pthread_mutex_lock(&P.lock);
  handle(ev);
  pthread_mutex_unlock(&P.lock);
}

/* The parent: drains the queued event records. */
static void drain_events(void) {
  rdmx_msgr_event evs[64];
  size_t n = 0;
  do {
    CHECK_STATUS(rdmx_msgr_poll(P.m, 0, evs, 64, &n), RDMX_OK);
    pthread_mutex_lock(&P.lock);
    for (size_t i = 0; i < n; i++) handle(&evs[i]);
    pthread_mutex_unlock(&P.lock);
  } while (n == 64);
}

/* A copy of what session `id`'s checks read (zeroes if none). */
static view_t snap(uint64_t id) {
  view_t out;
  memset(&out, 0, sizeof out);
  pthread_mutex_lock(&P.lock);
  sess_t *ss = sess_of(id, 0);
  if (ss) out = ss->v;
  pthread_mutex_unlock(&P.lock);
  return out;
}

/* ---- sending ---- */

/* Accepted sends on `id` so far (the main thread's own count; read under the lock). */
static uint64_t sent_of(uint64_t id) {
  pthread_mutex_lock(&P.lock);
  sess_t *ss = sess_of(id, 0);
  uint64_t n = ss ? ss->v.sent : 0;
  pthread_mutex_unlock(&P.lock);
  return n;
}

/* Sends message `seq` on `id`: the data from unregistered memory (copied), a lent chunk or
 * a registered slot in turn. The lock is held across rdmx_session_send so that the
 * completion (on the child's worker thread) finds the send in the FIFO. */
static rdmx_status send_one(uint64_t id, uint64_t seq) {
  uint32_t kind = (uint32_t)(seq % 3); /* RDMX_SEG_COPY, _CHUNK, _MEM */
  uint8_t *data = P.scratch;
  rdmx_chunk ch;
  int32_t slot = -1;
  if (kind == RDMX_SEG_CHUNK) {
    rdmx_status st = rdmx_msgr_chunk_get(P.m, &ch);
    if (st != RDMX_OK) return st; /* RDMX_FULL: the pool is out, try later */
    CHECK(ch.length == PAGE && ((uintptr_t)ch.addr % PAGE) == 0);
    data = (uint8_t *)ch.addr;
  } else if (kind == RDMX_SEG_MEM) {
    pthread_mutex_lock(&P.lock);
    if (P.nfree > 0) slot = P.free_slots[--P.nfree];
    pthread_mutex_unlock(&P.lock);
    if (slot >= 0) data = P.ring + (size_t)slot * PAGE;
    else kind = RDMX_SEG_COPY; /* every slot in flight */
  }
  memcpy(data, pages[page_of(seq)], PAGE);
  front_t f = {seq, sums[page_of(seq)]};
  rdmx_msg_iov iov;
  memset(&iov, 0, sizeof iov);
  iov.kind = kind;
  iov.addr = data;
  iov.length = PAGE;
  iov.mem = kind == RDMX_SEG_MEM ? &P.mem : NULL;
  uint64_t send_id = 0;
  pthread_mutex_lock(&P.lock);
  sess_t *ss = sess_of(id, 1);
  rdmx_status st = ss ? rdmx_session_send(P.m, id, MSG_TYPE, &f, sizeof f, &iov, 1, &send_id)
                      : RDMX_INVALID_ARGUMENT;
  if (st == RDMX_OK) {
    CHECK(ss->v.len < FIFO);
    ss->fifo[(ss->head + ss->v.len) % FIFO] = (pending_t){send_id, slot};
    ss->v.len++;
    ss->v.sent++;
  } else if (slot >= 0) {
    P.free_slots[P.nfree++] = slot;
  }
  pthread_mutex_unlock(&P.lock);
  if (st != RDMX_OK && kind == RDMX_SEG_CHUNK) {
    /* A refusal leaves the chunk ours unless the error says it was consumed. */
    int consumed = strstr(rdmx_last_error(), "consumed") != NULL;
    CHECK_STATUS(rdmx_msgr_chunk_put(P.m, ch.addr), consumed ? RDMX_INVALID_ARGUMENT : RDMX_OK);
  }
  return st;
}

/* Sends the next messages on `id` until RDMX_FULL, `upto` in all, or BURST. Returns 1 if
 * any went, 0 if none, -1 for another refusal (the session ended; `*why` says which). */
static int pump(uint64_t id, uint64_t upto, rdmx_status *why) {
  int any = 0;
  uint64_t sent = sent_of(id);
  for (int k = 0; k < BURST && sent < upto; k++) {
    rdmx_status st = send_one(id, sent + 1);
    if (st == RDMX_FULL) break;
    if (st != RDMX_OK) {
      if (why) *why = st;
      return -1;
    }
    sent++;
    any = 1;
  }
  return any;
}

/* ---- messenger setup and pools ---- */

typedef struct {
  const char *key, *value;
} kv_t;

/* Both processes' config (as the Rust test's): a short retry budget (timeout 12 = 16.8 ms x
 * 4 tries, so a 150 ms black hole exceeds it), keepalive 50 ms / 2 s, fast reconnects, one
 * worker thread; `kv` on top. Slow (valgrind): timeout 16 (268 ms; valgrind stalls would
 * exhaust 16.8 ms tries), keepalive timeout 30 s (lossy sessions would reset on a stall).
 * With `udp_port` non-NULL the messenger's UDP port is stored there. */

static rdmx_msgr *new_msgr(const kv_t *kv, size_t nkv, rdmx_msgr_on_event cb,
                           uint16_t *udp_port) {
  rdmx_config *cfg = NULL;
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
  if (cfg == NULL) return NULL;
  const kv_t base[] = {
      {"soft_port", "0"},
      {"timeout", slow ? "16" : "12"},
      {"retry_cnt", "3"},
      {"msgr_keepalive_ms", "50"},
      {"msgr_keepalive_timeout_ms", slow ? "30000" : "2000"},
      {"msgr_reconnect_min_ms", "5"},
      {"msgr_reconnect_max_ms", "100"},
      {"msgr_threads", "1"},
      /* Slow: 8 receives posted per session, not 64: 64 x 4 KiB in flight overflow a
       * valgrind-slowed receiver's UDP socket, and every loss costs a 268 ms timeout. */
      {"msgr_recv_window", slow ? "8" : "64"},
      /* Slow: a connector's first auth frame can take over the default 500 ms under
       * valgrind, and the listener drops the connection (a lossy peer's session then
       * ends: "no session from peer"). */
      {"handshake_first_bytes_ms", slow ? "10000" : "500"},
  };
  for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
    CHECK_STATUS(rdmx_config_set(cfg, base[i].key, base[i].value), RDMX_OK);
  for (size_t i = 0; i < nkv; i++) CHECK_STATUS(rdmx_config_set(cfg, kv[i].key, kv[i].value), RDMX_OK);
  rdmx_msgr *m = NULL;
  rdmx_status st = rdmx_msgr_new(cfg, cb, NULL, &m);
  rdmx_config_free(cfg);
  if (st != RDMX_OK) {
    fprintf(stderr, "[%d] rdmx_msgr_new: %s\n", (int)getpid(), rdmx_last_error());
    check_failures++;
    return NULL;
  }
  if (udp_port) {
    /* The kernel chose it (soft_port 0): the black hole names it. */
    *udp_port = rdmx_msgr_udp_port(m);
    CHECK(*udp_port != 0);
  }
  CHECK(rdmx_msgr_udp_port(NULL) == 0);
  return m;
}

/* Registers the ring of slots the RDMX_SEG_MEM sends use. */
static void setup_ring(void) {
  P.ring = (uint8_t *)aligned_alloc(PAGE, (size_t)SLOTS * PAGE);
  CHECK(P.ring != NULL);
  CHECK_STATUS(rdmx_msgr_mem_reg(P.m, P.ring, (size_t)SLOTS * PAGE, &P.mem), RDMX_OK);
  for (int i = 0; i < SLOTS; i++) P.free_slots[i] = SLOTS - 1 - i;
  P.nfree = SLOTS;
}

static void teardown_ring(void) {
  CHECK(P.nfree == SLOTS); /* every RDMX_SEG_MEM send completed */
  CHECK_STATUS(rdmx_msgr_mem_dereg(P.m, &P.mem), RDMX_OK);
  CHECK_STATUS(rdmx_msgr_mem_invalidate(P.m, P.ring, (size_t)SLOTS * PAGE), RDMX_OK);
  free(P.ring);
  P.ring = NULL;
  rdmx_msgr_stats now = {.struct_size = sizeof now};
  CHECK_STATUS(rdmx_msgr_get_stats(P.m, &now), RDMX_OK);
  CHECK(now.mem_registrations == 0 && now.chunks_lent == 0);
}

/* Whether the pools are back to `base`: data chunks and header slots in use as then, no copy
 * chunk, no lent chunk, registrations as then. `sessions` is compared when >= 0. */
static int pools_back(const rdmx_msgr_stats *base, int64_t sessions, rdmx_msgr_stats *now) {
  CHECK_STATUS(rdmx_msgr_get_stats(P.m, now), RDMX_OK);
  return now->data_chunks_in_use == base->data_chunks_in_use &&
         now->header_slots_in_use == base->header_slots_in_use && now->copy_chunks_in_use == 0 &&
         now->chunks_lent == 0 && now->mem_registrations == base->mem_registrations &&
         (sessions < 0 || now->sessions == (uint64_t)sessions);
}

static void print_pools(FILE *to, const char *who, const rdmx_msgr_stats *base,
                        const rdmx_msgr_stats *s) {
  fprintf(to,
          "%s: data chunks in use %u (baseline %u, carved %u), header slots %u (baseline %u), "
          "copy chunks %u, lent %u, registrations %u (baseline %u), sessions %llu, events "
          "queued %u\n",
          who, s->data_chunks_in_use, base->data_chunks_in_use, s->data_chunks_total,
          s->header_slots_in_use, base->header_slots_in_use, s->copy_chunks_in_use,
          s->chunks_lent, s->mem_registrations, base->mem_registrations,
          (unsigned long long)s->sessions, s->events_queued);
}

/* ---- the child ---- */

static void say(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
  fflush(stdout);
}

/* Connects to ADDR, sends N numbered messages (0: until told to exit or killed) while
 * checking what arrives (and injecting faults on its end if FAULTS), prints DONE when both
 * ways are complete; on "exit" or EOF closes its session, checks its pools, prints EXIT. */
static int peer_main(const char *addr, const char *policy_name, uint64_t n, int faults) {
  alarm(slow ? 1200 : 300); /* bounded life, whatever the parent does */
  uint32_t policy = strcmp(policy_name, "lossy") == 0 ? RDMX_POLICY_LOSSY : RDMX_POLICY_LOSSLESS;
  const kv_t kv[] = {{"msgr_policy", policy_name}};
  uint16_t udp = 0;
  P.incoming = 0;
  P.m = new_msgr(kv, 1, on_event, &udp);
  if (P.m == NULL) return 1;
  setup_ring();
  rdmx_msgr_stats base = {.struct_size = sizeof base}; /* with the ring registered */
  CHECK_STATUS(rdmx_msgr_get_stats(P.m, &base), RDMX_OK);
  uint64_t s = 0;
  CHECK_STATUS(rdmx_msgr_connect(P.m, addr, policy, &s), RDMX_OK);
  say("READY pid=%d udp=%u session=%#llx", (int)getpid(), (unsigned)udp, (unsigned long long)s);
  CHECK(fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK) == 0);

  uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
  double next_fault = next_fault_time(&rng), next_report = now_s();
  double end = now_s() + (slow ? 1100.0 : 280.0);
  uint64_t injected = 0, upto = n ? n : UINT64_MAX;
  int done = 0, ended = 0;
  char cmd[256];
  size_t cmd_len = 0;
  int quit = 0;
  while (!quit && now_s() < end) {
    int any = 0;
    if (!ended) {
      rdmx_status why = RDMX_OK;
      int r = pump(s, upto, &why);
      if (r < 0) {
        ended = 1;
        fprintf(stderr, "[%d] send refused: %s (%s)\n", (int)getpid(), rdmx_status_str((int)why),
                rdmx_last_error());
      }
      any = r > 0;
    }
    view_t p = snap(s);
    if (!done && n && p.next == n && p.ok == n) {
      done = 1;
      rdmx_session_counters c = {.struct_size = sizeof c};
      CHECK_STATUS(rdmx_session_get_counters(P.m, s, &c), RDMX_OK);
      say("DONE recv=%llu bad=%llu ok=%llu failed=%llu resets=%d reconnects=%llu replays=%llu "
          "faults=%llu injected=%llu duplicates=%llu retries_exceeded=%lu",
          (unsigned long long)p.next, (unsigned long long)p.bad, (unsigned long long)p.ok,
          (unsigned long long)p.failed, p.reset, (unsigned long long)c.reconnects,
          (unsigned long long)c.replays, (unsigned long long)c.faults,
          (unsigned long long)injected, (unsigned long long)c.duplicates_dropped,
          (unsigned long)atomic_load(&retry_exceeded));
    }
    if (faults && !done && now_s() >= next_fault) {
      uint32_t f = rnd(&rng) % 2 ? RDMX_FAULT_SIDE_CHANNEL_CLOSE : RDMX_FAULT_QP_ERROR;
      /* RDMX_CLOSED while the session has no connection (reconnecting): not counted. */
      if (rdmx_session_inject_fault(P.m, s, f) == RDMX_OK) injected++;
      next_fault = next_fault_time(&rng);
    }
    if (now_s() >= next_report) {
      say("PROGRESS recv=%llu bad=%llu sent=%llu ok=%llu injected=%llu retries_exceeded=%lu",
          (unsigned long long)p.next, (unsigned long long)p.bad, (unsigned long long)p.sent,
          (unsigned long long)p.ok, (unsigned long long)injected,
          (unsigned long)atomic_load(&retry_exceeded));
      next_report = now_s() + 0.02;
    }
    for (;;) { /* commands: "exit"; EOF (the parent went) too */
      char c;
      ssize_t r = read(0, &c, 1);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        quit = 1;
        break;
      }
      if (r < 0) break;
      if (c != '\n') {
        if (cmd_len < sizeof cmd - 1) cmd[cmd_len++] = c;
        continue;
      }
      cmd[cmd_len] = 0;
      cmd_len = 0;
      if (strcmp(cmd, "exit") == 0) quit = 1;
      else say("UNKNOWN %s", cmd);
    }
    if (!any) sleep_us(500);
  }
  CHECK(quit);
  /* A lossless session still reconnecting after the parent's last fault: let it finish
   * first, so that the pools are compared at rest. (rdmx_msgr_free cancels and joins a
   * reconnect attempt in flight; before that fix its thread kept the messenger's core past
   * the free and valgrind reported the memory as lost.) */
  rdmx_session_info info = {.struct_size = sizeof info};
  double open_by = now_s() + wait_s(10.0);
  while (policy == RDMX_POLICY_LOSSLESS && rdmx_session_get_info(P.m, s, &info) == RDMX_OK &&
         info.state != RDMX_SESSION_OPEN && now_s() < open_by)
    sleep_us(1000);
  /* Close (an ended session: RDMX_CLOSED), then every send completes and the pools come
   * back once the connection drained. */
  rdmx_status cst = rdmx_session_close(P.m, s);
  CHECK(cst == RDMX_OK || cst == RDMX_CLOSED);
  rdmx_msgr_stats now = {.struct_size = sizeof now};
  double until = now_s() + wait_s(10.0);
  int back = 0;
  while (!(back = pools_back(&base, 0, &now) && snap(s).len == 0) && now_s() < until) sleep_us(5000);
  view_t p = snap(s);
  CHECK(p.len == 0 && p.ok + p.failed == p.sent);
  if (!back) print_pools(stderr, "peer", &base, &now);
  teardown_ring();
  pthread_mutex_lock(&P.lock);
  uint64_t anomalies = P.anomalies;
  pthread_mutex_unlock(&P.lock);
  CHECK(anomalies == 0);
  say("EXIT pools=%s anomalies=%llu", back ? "baseline" : "leaked", (unsigned long long)anomalies);
  rdmx_msgr_free(P.m);
  P.m = NULL;
  return check_failures == 0 ? 0 : 1;
}

/* ---- the parent: child processes, black holes, failures ---- */

/* Black holes a lossless run makes at most while none has run a QP out of tries. */
#define MAX_HOLES 16

typedef struct {
  pid_t pid;
  int out_fd, in_fd;
  char buf[8192];
  size_t len;
  char ready[256], progress[256], done[512], exit_line[256];
  int reaped;
} peer_t;

static const char *self_exe;
static volatile pid_t live_pids[4]; /* what the alarm handler and fail() kill */
static char hole_table[64];         /* the live black hole's nft table ("" if none) */
static volatile sig_atomic_t hole_live;

static void kill_all(void) {
  for (int i = 0; i < 4; i++)
    if (live_pids[i] > 0) kill(live_pids[i], SIGKILL);
}

/* `nft delete table inet NAME` without the C library's non-reentrant parts (also from the
 * alarm handler). */
static void hole_delete_raw(void) {
  if (!hole_live) return;
  pid_t pid = fork();
  if (pid == 0) {
    char *argv[] = {"nft", "delete", "table", "inet", hole_table, NULL};
    execvp("nft", argv);
    _exit(127);
  }
  if (pid > 0) waitpid(pid, NULL, 0);
  hole_live = 0;
}

/* SIGALRM (the run's bound), SIGTERM and SIGINT (`timeout`, ^C): no child and no nft rule
 * outlives the run. */
static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "msgr_faults: timed out or terminated; killing the children\n";
  kill_all();
  hole_delete_raw();
  ssize_t r = write(2, msg, sizeof msg - 1);
  (void)r;
  _exit(3);
}

/* A failure the run cannot go on from: children killed, black hole removed, exit 1. */
static void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "msgr_faults: FAILED: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  kill_all();
  hole_delete_raw();
  exit(1);
}

/* Runs argv[0] (a PATH search) with `input` on its stdin and stdout discarded; 0 if it
 * exited 0. */
static int run_cmd(char *const argv[], const char *input) {
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    dup2(pfd[0], 0);
    if (null >= 0) dup2(null, 1);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(pfd[0]);
  if (input) {
    size_t len = strlen(input), off = 0;
    while (off < len) {
      ssize_t w = write(pfd[1], input + off, len - off);
      if (w <= 0) break;
      off += (size_t)w;
    }
  }
  close(pfd[1]);
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* Whether black holes are wanted (not MSGR_FAULTS_NO_BLACK_HOLE=1) and nft works; a
 * wanted one without nft is skipped, or fails under RDMX_TEST_REQUIRE=all. */
static int nft_usable(void) {
  const char *no = getenv("MSGR_FAULTS_NO_BLACK_HOLE");
  if (no && strcmp(no, "1") == 0) return 0;
  char *argv[] = {"nft", "list", "tables", NULL};
  if (run_cmd(argv, NULL) == 0) return 1;
  require_missing("nft", "the UDP black holes", "`nft list tables` failed (root, nftables?)");
  return 0;
}

/* Drops every UDP datagram arriving for ports `a` and `b` (the two messengers' soft
 * devices): only UDP, the TCP side channel stays up, so each peer looks alive. */
static int hole_add(uint16_t a, uint16_t b) {
  static int seq;
  snprintf(hole_table, sizeof hole_table, "rdmxc_bh_%d_%d", (int)getpid(), seq++);
  char script[512];
  snprintf(script, sizeof script,
           "table inet %s {\n  chain input {\n    type filter hook input priority -10; policy "
           "accept;\n    udp dport { %u, %u } drop\n  }\n}\n",
           hole_table, (unsigned)a, (unsigned)b);
  char *argv[] = {"nft", "-f", "-", NULL};
  if (run_cmd(argv, script) != 0) return -1;
  hole_live = 1;
  return 0;
}

static void track(pid_t pid) {
  for (int i = 0; i < 4; i++)
    if (live_pids[i] == 0) {
      live_pids[i] = pid;
      return;
    }
  fail("too many children");
}

static void untrack(pid_t pid) {
  for (int i = 0; i < 4; i++)
    if (live_pids[i] == pid) live_pids[i] = 0;
}

/* Copies line `l` into `dst` (truncated to fit). */
static void keep(char *dst, size_t cap, const char *l) {
  size_t n = strlen(l);
  if (n >= cap) n = cap - 1;
  memcpy(dst, l, n);
  dst[n] = 0;
}

/* Reads what the child printed; keeps the last line of each kind. */
static void peer_read(peer_t *p) {
  for (;;) {
    ssize_t r = read(p->out_fd, p->buf + p->len, sizeof p->buf - 1 - p->len);
    if (r <= 0) break;
    p->len += (size_t)r;
    char *nl;
    while ((nl = memchr(p->buf, '\n', p->len)) != NULL) {
      *nl = 0;
      const char *l = p->buf;
      if (strncmp(l, "PROGRESS ", 9) == 0) keep(p->progress, sizeof p->progress, l);
      else if (strncmp(l, "DONE ", 5) == 0) keep(p->done, sizeof p->done, l);
      else if (strncmp(l, "EXIT ", 5) == 0) keep(p->exit_line, sizeof p->exit_line, l);
      else if (strncmp(l, "READY ", 6) == 0) keep(p->ready, sizeof p->ready, l);
      else fprintf(stderr, "peer %d: %s\n", (int)p->pid, l);
      size_t used = (size_t)(nl - p->buf) + 1;
      memmove(p->buf, nl + 1, p->len - used);
      p->len -= used;
    }
    if (p->len == sizeof p->buf - 1) p->len = 0; /* a line this long is garbage */
  }
}

/* The value of `key=` in `line` (0 if absent: callers check presence with has_field). */
static int has_field(const char *line, const char *key, uint64_t *out) {
  size_t kl = strlen(key);
  for (const char *t = line; (t = strstr(t, key)) != NULL; t += kl) {
    if ((t == line || t[-1] == ' ') && t[kl] == '=') {
      char *e = NULL;
      unsigned long long v = strtoull(t + kl + 1, &e, 0);
      if (out) *out = (uint64_t)v;
      return e != t + kl + 1;
    }
  }
  return 0;
}

static uint64_t num(const char *line, const char *key) {
  uint64_t v = 0;
  if (!has_field(line, key, &v)) fail("no %s= in '%s'", key, line);
  return v;
}

/* Waits up to `ms` for an event record or a line from `p` (NULL: none), then handles both. */
static void parent_wait(peer_t *p, int ms) {
  struct pollfd fds[2] = {{rdmx_msgr_event_fd(P.m), POLLIN, 0}, {p ? p->out_fd : -1, POLLIN, 0}};
  if (ms > 0) poll(fds, 2, ms);
  drain_events();
  if (p) peer_read(p);
}

/* Starts the child: this program in the `peer` role, its stdin and stdout piped here. */
static void peer_spawn(peer_t *p, const char *addr, const char *policy, uint64_t n, int faults) {
  memset(p, 0, sizeof *p);
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) fail("pipe: %s", strerror(errno));
  char nbuf[32], fbuf[8];
  snprintf(nbuf, sizeof nbuf, "%llu", (unsigned long long)n);
  snprintf(fbuf, sizeof fbuf, "%d", faults);
  pid_t pid = fork();
  if (pid < 0) fail("fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the parent */
    dup2(in[0], 0);
    dup2(out[1], 1);
    char *argv[] = {(char *)self_exe, "peer", (char *)addr, (char *)policy, nbuf, fbuf, NULL};
    execv(self_exe, argv);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  p->pid = pid;
  p->in_fd = in[1];
  p->out_fd = out[0];
  track(pid);
  fcntl(p->out_fd, F_SETFL, fcntl(p->out_fd, F_GETFL) | O_NONBLOCK);
  double end = now_s() + wait_s(20.0);
  while (!p->ready[0]) {
    if (now_s() > end) fail("peer %d: no READY line within %.0f s", (int)pid, wait_s(20.0));
    parent_wait(p, 5);
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      p->reaped = 1;
      untrack(pid);
      fail("peer %d exited before READY (status %#x)", (int)pid, st);
    }
  }
  if (num(p->ready, "pid") != (uint64_t)pid) fail("READY of another process: %s", p->ready);
}

/* SIGKILL and reap. */
static void peer_kill(peer_t *p) {
  if (p->reaped) return;
  kill(p->pid, SIGKILL);
  int st = 0;
  CHECK(waitpid(p->pid, &st, 0) == p->pid);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  p->reaped = 1;
  untrack(p->pid);
  close(p->in_fd);
  close(p->out_fd);
}

/* Tells the child to exit; waits (bounded) for its EXIT line and a 0 exit status. */
static void peer_finish(peer_t *p) {
  static const char cmd[] = "exit\n";
  CHECK(write(p->in_fd, cmd, sizeof cmd - 1) == (ssize_t)(sizeof cmd - 1));
  double end = now_s() + wait_s(20.0);
  while (!p->exit_line[0]) {
    if (now_s() > end) fail("peer %d: no EXIT line within %.0f s", (int)p->pid, wait_s(20.0));
    parent_wait(p, 5);
  }
  int st = 0;
  end = now_s() + wait_s(10.0);
  while (waitpid(p->pid, &st, WNOHANG) != p->pid) {
    if (now_s() > end) fail("peer %d did not exit", (int)p->pid);
    parent_wait(p, 5);
  }
  p->reaped = 1;
  untrack(p->pid);
  peer_read(p);
  close(p->in_fd);
  close(p->out_fd);
  if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
    fprintf(stderr, "peer %d exited with status %#x\n", (int)p->pid, st);
    check_failures++;
  }
  CHECK(strstr(p->exit_line, "pools=baseline") != NULL);
}

/* Waits (bounded) for a session CONNECT that is not in `seen`; returns its id. */
static uint64_t wait_session(peer_t *p, const uint64_t *seen, int nseen) {
  double end = now_s() + wait_s(20.0);
  for (;;) {
    parent_wait(p, 2);
    pthread_mutex_lock(&P.lock);
    uint64_t found = 0;
    for (int i = 0; i < MAX_SESSIONS && !found; i++) {
      int old = 0;
      for (int j = 0; j < nseen; j++) old |= P.s[i].v.id == seen[j];
      if (P.s[i].v.used && P.s[i].v.opened > 0 && !old) found = P.s[i].v.id;
    }
    pthread_mutex_unlock(&P.lock);
    if (found) return found;
    if (now_s() > end) fail("no session from peer %d within %.0f s", (int)p->pid, wait_s(20.0));
  }
}

/* Waits (bounded) until the pools are back to `base` and `sessions` are left. */
static void wait_pools(const rdmx_msgr_stats *base, int64_t sessions, double within) {
  rdmx_msgr_stats now = {.struct_size = sizeof now};
  double end = now_s() + within;
  while (!pools_back(base, sessions, &now)) {
    if (now_s() > end) {
      print_pools(stderr, "parent", base, &now);
      fail("pools not back to the baseline within %.0f s", within);
    }
    parent_wait(NULL, 5);
  }
}

static rdmx_msgr *parent_msgr(const kv_t *kv, size_t nkv, uint16_t *udp,
                              char *addr, size_t addr_len, rdmx_msgr_stats *base) {
  P.incoming = 1;
  P.m = new_msgr(kv, nkv, NULL, udp);
  if (P.m == NULL) fail("no messenger");
  uint16_t port = 0;
  CHECK_STATUS(rdmx_msgr_listen(P.m, "127.0.0.1:0", &port), RDMX_OK);
  snprintf(addr, addr_len, "127.0.0.1:%u", (unsigned)port);
  setup_ring();
  CHECK_STATUS(rdmx_msgr_get_stats(P.m, base), RDMX_OK); /* with the ring registered */
  return P.m;
}

static void parent_done(void) {
  teardown_ring();
  CHECK(P.anomalies == 0);
  rdmx_msgr_free(P.m);
  P.m = NULL;
}

/* ---- case 1: lossless, faults on both sides ---- */

static void run_lossless(uint64_t n) {
  int black_hole = nft_usable();
  if (!black_hole)
    fprintf(stderr, "lossless: no UDP black holes (nft unusable or MSGR_FAULTS_NO_BLACK_HOLE=1): "
                    "side-channel closes and QP errors only\n");
  uint16_t udp = 0;
  char addr[64];
  rdmx_msgr_stats base = {.struct_size = sizeof base};
  parent_msgr(NULL, 0, black_hole ? &udp : NULL, addr, sizeof addr, &base);
  double start = now_s();
  peer_t peer;
  peer_spawn(&peer, addr, "lossless", n, 1);
  uint16_t peer_udp = (uint16_t)num(peer.ready, "udp");
  uint64_t s = wait_session(&peer, NULL, 0);

  /* The hole outlasts the retry budget: 150 ms > 4 x 16.8 ms (slow: 1.5 s > 4 x 268 ms). */
  double hole_len = slow ? 1.5 : 0.15, hole_until = 0, limit = wait_s(60.0 + (double)n / 200.0);
  uint64_t rng = 0x123456789abcdef1ull ^ (uint64_t)getpid();
  double next_fault = next_fault_time(&rng);
  unsigned tried[3] = {0, 0, 0}, injected[3] = {0, 0, 0};
  for (;;) {
    /* The last message waits until both processes injected a fault that took (the peer
     * stops injecting once it has everything): reconnects are then due on both sides
     * whatever N is. */
    uint64_t peer_injected = 0, peer_exceeded = 0;
    has_field(peer.progress, "injected", &peer_injected);
    has_field(peer.progress, "retries_exceeded", &peer_exceeded);
    /* With black holes, also until one of them ran a QP out of tries (in either process),
     * or MAX_HOLES went in without that: a hole finds no packet in flight now and then
     * (CI17 under valgrind: 4 holes, none did), and the check below then fails. */
    int holes_done = !black_hole || injected[2] >= MAX_HOLES ||
                     atomic_load(&retry_exceeded) + peer_exceeded > 0;
    int faulted = injected[0] + injected[1] > 0 && peer_injected > 0 && holes_done;
    rdmx_status why = RDMX_OK;
    int any = pump(s, faulted ? n : n - 1, &why);
    if (any < 0) fail("lossless send refused: %s (%s)", rdmx_status_str((int)why), rdmx_last_error());
    parent_wait(&peer, any ? 0 : 1);
    if (hole_live && now_s() >= hole_until) {
      hole_delete_raw();
      next_fault = next_fault_time(&rng);
    }
    view_t p = snap(s);
    if (p.next == n && p.ok == n && peer.done[0]) break;
    if (now_s() - start > limit) {
      rdmx_session_info info = {.struct_size = sizeof info};
      rdmx_session_get_info(P.m, s, &info);
      fail("lossless stuck after %.0f s: parent sent %llu, delivered %llu, ok %llu, failed %llu; "
           "state %u queued %llu unacked %llu; peer: %s",
           limit, (unsigned long long)p.sent, (unsigned long long)p.next,
           (unsigned long long)p.ok, (unsigned long long)p.failed, info.state,
           (unsigned long long)info.queued, (unsigned long long)info.unacked, peer.progress);
    }
    /* Faults until this side is done (the peer stops its own when it is). */
    if ((p.next < n || p.ok < n) && !hole_live && now_s() >= next_fault) {
      unsigned kinds = black_hole ? 3 : 2;
      unsigned k = (tried[0] + tried[1] + tried[2]) % kinds;
      tried[k]++;
      if (k == 0) {
        if (rdmx_session_inject_fault(P.m, s, RDMX_FAULT_SIDE_CHANNEL_CLOSE) == RDMX_OK) injected[0]++;
      } else if (k == 1) {
        if (rdmx_session_inject_fault(P.m, s, RDMX_FAULT_QP_ERROR) == RDMX_OK) injected[1]++;
      } else if (hole_add(udp, peer_udp) == 0) {
        injected[2]++;
        hole_until = now_s() + hole_len;
      } else {
        fail("nft could not add a black hole");
      }
      next_fault = next_fault_time(&rng);
    }
  }
  double elapsed = now_s() - start;
  hole_delete_raw();
  view_t p = snap(s);
  rdmx_session_counters c = {.struct_size = sizeof c};
  CHECK_STATUS(rdmx_session_get_counters(P.m, s, &c), RDMX_OK);
  const char *d = peer.done;
  printf("lossless: %llu messages each way in %.2f s; parent injected side channel %u/%u, QP "
         "error %u/%u, black hole %u/%u (injected/tried); parent: faults %llu reconnects %llu "
         "replays %llu duplicates dropped %llu credit stalls %llu full %llu, retries exceeded "
         "%lu; peer: %s\n",
         (unsigned long long)n, elapsed, injected[0], tried[0], injected[1], tried[1],
         injected[2], tried[2], (unsigned long long)c.faults, (unsigned long long)c.reconnects,
         (unsigned long long)c.replays, (unsigned long long)c.duplicates_dropped,
         (unsigned long long)c.credit_stalls, (unsigned long long)c.full_refusals,
         (unsigned long)atomic_load(&retry_exceeded), d);
  fflush(stdout);
  /* Exactly once, in order, intact, every send acknowledged: both sides. */
  CHECK(p.next == n && p.bad == 0 && p.ok == n && p.failed == 0 && p.sent == n);
  if (p.failed) fprintf(stderr, "first failed send: %s\n", p.first_failure);
  CHECK(num(d, "recv") == n && num(d, "bad") == 0);
  CHECK(num(d, "ok") == n && num(d, "failed") == 0);
  CHECK(c.msgs_sent == n && c.msgs_received == n);
  /* No reset; both reconnected; faults from both processes. */
  CHECK(num(d, "resets") == 0);
  CHECK(!p.reset);
  if (p.reset) fprintf(stderr, "parent reset: %s\n", p.why);
  CHECK(num(d, "reconnects") > 0);
  CHECK(c.reconnects > 0);
  CHECK(injected[0] + injected[1] > 0 && num(d, "injected") > 0);
  /* The holes outlasted the retry budget: QPs ran out of tries (in either process; of
   * several holes one at least found packets in flight; the last message waited for it). */
  CHECK(!black_hole || atomic_load(&retry_exceeded) + num(d, "retries_exceeded") > 0);
  /* The peer closes its session and checks its pools; then this side closes its own (the
   * peer's close is a fault here: lossless waits for a reconnect) and its pools come back. */
  peer_finish(&peer);
  parent_wait(NULL, 0);
  rdmx_status cst = rdmx_session_close(P.m, s);
  CHECK(cst == RDMX_OK || (cst == RDMX_CLOSED && snap(s).reset));
  wait_pools(&base, 0, wait_s(10.0));
  p = snap(s);
  CHECK(p.len == 0 && p.ok == n && p.failed == 0);
  drain_events();
  rdmx_msgr_stats now = {.struct_size = sizeof now};
  CHECK_STATUS(rdmx_msgr_get_stats(P.m, &now), RDMX_OK);
  CHECK(now.events_queued == 0);
  rdmx_session_counters totals = {.struct_size = sizeof totals};
  CHECK_STATUS(rdmx_msgr_get_totals(P.m, &totals), RDMX_OK);
  CHECK(totals.rnr_naks == 0);
  print_pools(stdout, "lossless: parent after close", &base, &now);
  parent_done();
}

/* ---- case 2: lossy, the child SIGKILLed mid-stream ---- */

/* Exchanges `n` messages each way on `s` with a peer that sends its `n` by itself. */
static void exchange(uint64_t s, peer_t *peer, uint64_t n) {
  double end = now_s() + wait_s(30.0);
  for (;;) {
    rdmx_status why = RDMX_OK;
    int any = pump(s, n, &why);
    if (any < 0) fail("exchange: send refused: %s (%s)", rdmx_status_str((int)why), rdmx_last_error());
    parent_wait(peer, any ? 0 : 1);
    view_t p = snap(s);
    if (p.next == n && p.ok == n && peer->done[0]) break;
    if (now_s() > end)
      fail("exchange of %llu stuck: parent sent %llu delivered %llu ok %llu; peer: %s",
           (unsigned long long)n, (unsigned long long)p.sent, (unsigned long long)p.next,
           (unsigned long long)p.ok, peer->progress);
  }
  view_t p = snap(s);
  CHECK(p.bad == 0 && p.failed == 0 && !p.reset);
  CHECK(num(peer->done, "recv") == n && num(peer->done, "bad") == 0);
  CHECK(num(peer->done, "ok") == n && num(peer->done, "failed") == 0);
  CHECK(num(peer->done, "resets") == 0);
}

static void run_lossy(uint64_t final_n) {
  /* Keepalive timeout 5 s, reconnect timeout 20 s: a prompt reset can only come from the
   * side channel or the QP (slow: keepalive timeout 60 s). */
  const kv_t kv[] = {{"msgr_keepalive_timeout_ms", slow ? "60000" : "5000"},
                         {"msgr_reconnect_timeout_ms", "20000"}};
  char addr[64];
  rdmx_msgr_stats base = {.struct_size = sizeof base};
  parent_msgr(kv, 2, NULL, addr, sizeof addr, &base);
  uint64_t rng = 0x51517a7a01012323ull ^ (uint64_t)getpid();
  uint64_t seen[LOSSY_ROUNDS + 1];
  double took_ms[LOSSY_ROUNDS];
  for (int round = 0; round < LOSSY_ROUNDS; round++) {
    peer_t peer;
    peer_spawn(&peer, addr, "lossy", 0, 0);
    uint64_t s = wait_session(&peer, seen, round);
    seen[round] = s;
    /* Stream both ways for 50-200 ms, and until both sides delivered something. */
    double opened = snap(s).opened;
    double kill_at = opened + (50.0 + (double)(rnd(&rng) % 151)) / 1e3;
    double end = now_s() + wait_s(20.0);
    for (;;) {
      rdmx_status why = RDMX_OK;
      int any = pump(s, UINT64_MAX, &why);
      if (any < 0) fail("round %d: send refused before the kill: %s", round, rdmx_last_error());
      parent_wait(&peer, any ? 0 : 1);
      uint64_t peer_got = 0;
      has_field(peer.progress, "recv", &peer_got);
      if (now_s() >= kill_at && snap(s).next > 0 && peer_got > 0) break;
      if (now_s() > end) fail("round %d: no traffic both ways", round);
    }
    /* One more burst (so sends are held: queued or unacknowledged), then SIGKILL. */
    pump(s, UINT64_MAX, NULL);
    rdmx_session_info info = {.struct_size = sizeof info};
    CHECK_STATUS(rdmx_session_get_info(P.m, s, &info), RDMX_OK);
    uint64_t held = info.queued + info.unacked;
    CHECK(info.policy == RDMX_POLICY_LOSSY && info.incoming == 1);
    double killed = now_s();
    peer_kill(&peer);
    end = killed + wait_s(10.0);
    while (!snap(s).reset) {
      if (now_s() > end) fail("round %d: no reset within %.0f s of the kill", round, wait_s(10.0));
      parent_wait(NULL, 1);
    }
    view_t p = snap(s);
    double took = p.reset_at - killed;
    /* Every accepted send completed: the delivered ones OK, the rest with an error (RESET
     * comes last, so they already have). */
    CHECK(p.ok + p.failed == p.sent && p.len == 0);
    printf("lossy round %d: killed %.0f ms after the session opened with %llu sends held; "
           "reset after %.1f ms: %s (%s); sends ok %llu failed %llu (%s), delivered %llu\n",
           round, (killed - opened) * 1e3, (unsigned long long)held, took * 1e3, p.why,
           rdmx_status_str((int)p.reset_status), (unsigned long long)p.ok,
           (unsigned long long)p.failed, p.first_failure, (unsigned long long)p.next);
    fflush(stdout);
    CHECK(p.bad == 0);
    CHECK(held > 0 && p.failed > 0);
    /* Promptly, and by the side channel's EOF (which moves the QP to the error state: a
     * flush); the retry budget or the keepalive would take longer. */
    CHECK(took < (slow ? 5.0 : 1.0));
    CHECK(strstr(p.why, "WrFlushErr") != NULL || strstr(p.why, "side channel closed") != NULL);
    CHECK_STATUS(rdmx_session_send(P.m, s, MSG_TYPE, NULL, 0, NULL, 0, NULL), RDMX_CLOSED);
    wait_pools(&base, 0, wait_s(5.0));
    took_ms[round] = took * 1e3;
  }
  /* A new child after the kills: exchange works again. */
  peer_t peer;
  peer_spawn(&peer, addr, "lossy", final_n, 0);
  uint64_t s = wait_session(&peer, seen, LOSSY_ROUNDS);
  exchange(s, &peer, final_n);
  peer_finish(&peer);
  /* Its close (a bye) ends this side's lossy session too. */
  double end = now_s() + wait_s(5.0);
  while (!snap(s).reset) {
    if (now_s() > end) fail("the peer's close did not end the session");
    parent_wait(NULL, 1);
  }
  wait_pools(&base, 0, wait_s(5.0));
  printf("lossy: resets %.1f / %.1f / %.1f ms after the kills; then %llu each way on a new "
         "session (ended by the peer: %s)\n",
         took_ms[0], took_ms[1], took_ms[2], (unsigned long long)final_n, snap(s).why);
  parent_done();
}

int main(int argc, char **argv) {
  const char *sl = getenv("MSGR_FAULTS_SLOW");
  slow = sl != NULL && strcmp(sl, "1") == 0;
  pthread_mutex_init(&P.lock, NULL);
  make_pages();
  CHECK_STATUS(rdmx_log_set_callback(on_log, RDMX_LOG_WARN, NULL), RDMX_OK);
  if (argc == 6 && strcmp(argv[1], "peer") == 0)
    return peer_main(argv[2], argv[3], strtoull(argv[4], NULL, 10), atoi(argv[5]));
  if (argc < 2 || argc > 3 || (strcmp(argv[1], "lossless") != 0 && strcmp(argv[1], "lossy") != 0)) {
    fprintf(stderr, "usage: %s lossless|lossy [MESSAGES]\n", argv[0]);
    return 2;
  }
  const char *env_n = getenv("MSGR_FAULTS_MESSAGES");
  uint64_t n = argc == 3 ? strtoull(argv[2], NULL, 10) : env_n ? strtoull(env_n, NULL, 10) : 100000;
  if (n == 0) n = 1;
  self_exe = strchr(argv[0], '/') ? argv[0] : "/proc/self/exe";
  signal(SIGPIPE, SIG_IGN); /* a dead child's stdin: write fails instead */
  signal(SIGALRM, on_alarm);
  signal(SIGTERM, on_alarm);
  signal(SIGINT, on_alarm);
  alarm(slow ? 1800 : 600);
  double t0 = now_s();
  if (strcmp(argv[1], "lossless") == 0) run_lossless(n);
  else run_lossy(n < FINAL_MAX ? n : FINAL_MAX);
  printf("msgr_faults %s: %.1f s\n", argv[1], now_s() - t0);
  pthread_mutex_destroy(&P.lock);
  CHECK_DONE(strcmp(argv[1], "lossless") == 0 ? "msgr_faults lossless" : "msgr_faults lossy");
}

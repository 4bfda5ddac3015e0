/* Messenger echo client: `msgr_echo_client HOST:PORT poll|callback COUNT`.
 *
 * msgr_threads = 0: progress happens inside rdmx_msgr_poll on this thread; "poll" drains
 * event records, "callback" gets the same events through the callback (run inside
 * rdmx_msgr_poll). Sends COUNT numbered ECHO messages (front: number + checksum, data: 4 KiB,
 * every 50th 64 KiB) with the data from unregistered memory (copied), a lent pool chunk or
 * a registered buffer in turn, at most WINDOW echoes outstanding, and verifies every echo:
 * in order, each number once, data page-aligned and intact. Also: NULL and bad arguments,
 * a send over msgr_max_segments (8 here) and a msgr_max_message_bytes the pool cannot hold,
 * RDMX_FULL at the send queue bound (msgr_send_queue_msgs = 16) then SEND_READY, a QP
 * fault in the middle (poll mode, lossless: reconnect and replay, still exactly once in
 * order), the session counters, and the pools back to their baseline at the end. */
#define _POSIX_C_SOURCE 200809L
#include <rdmx.h>

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "check.h"
#include "msgr_echo.h"

#define WINDOW 12
#define BIG (64 * 1024)
#define SLOTS 64
#define MAX_SENDS 100000

static rdmx_msgr *M;
static int callback_mode;
static int tag; /* the callback's user_data */
static uint64_t S;
static int connected, ready_seen, resets;
static uint64_t next_expected, echoed, sent_numbers;
static uint64_t completed_ok, completed_failed;
static uint64_t copied_expected, quit_id;
static int quit_done;
static uint8_t *ring; /* SLOTS x BIG, registered */
static int slot_busy[SLOTS];
static int16_t slot_of_send[MAX_SENDS + 64]; /* send id -> slot + 1 */
static int misc_checked;
static char send_error[512]; /* rdmx_last_error() of the last refused send_number */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void verify_echo(rdmx_msg *msg) {
  CHECK(rdmx_msg_type(msg) == ECHO_TYPE);
  size_t flen = 0;
  const echo_front *f = (const echo_front *)rdmx_msg_front(msg, &flen);
  CHECK(f != NULL && flen == sizeof(echo_front));
  if (f == NULL || flen != sizeof(echo_front)) return;
  if (f->number != next_expected) {
    fprintf(stderr, "echo %llu arrived, expected %llu\n", (unsigned long long)f->number,
            (unsigned long long)next_expected);
    check_failures++;
  }
  next_expected = f->number + 1;
  CHECK(rdmx_msg_seg_count(msg) == 1);
  CHECK(rdmx_msg_seg_len(msg, 0) == f->data_len);
  size_t pieces = 0;
  CHECK_STATUS(rdmx_msg_seg_iov(msg, 0, NULL, 0, &pieces), RDMX_OK);
  CHECK(pieces == (f->data_len + 4095) / 4096);
  rdmx_iov iov[BIG / 4096];
  if (pieces > BIG / 4096) return;
  if (pieces > 1) {
    CHECK_STATUS(rdmx_msg_seg_iov(msg, 0, iov, 1, NULL), RDMX_BUFFER_TOO_SMALL);
  }
  CHECK_STATUS(rdmx_msg_seg_iov(msg, 0, iov, pieces, &pieces), RDMX_OK);
  uint32_t h = FNV_INIT;
  size_t off = 0, bad = 0;
  for (size_t k = 0; k < pieces; k++) {
    CHECK(((uintptr_t)iov[k].base % 4096) == 0); /* zero-copy: pool chunks */
    const uint8_t *b = (const uint8_t *)iov[k].base;
    for (size_t j = 0; j < iov[k].len; j++)
      if (b[j] != echo_byte(f->number, off + j)) bad++;
    h = fnv1a(h, b, iov[k].len);
    off += iov[k].len;
  }
  CHECK(off == f->data_len);
  CHECK(bad == 0);
  CHECK(h == f->checksum);
  echoed++;
}

static void handle(const rdmx_msgr_event *ev) {
  CHECK(ev->text != NULL);
  switch (ev->kind) {
    case RDMX_MSGR_EVENT_CONNECT:
      CHECK(ev->session == S);
      CHECK(ev->incoming == 0);
      CHECK(strncmp(ev->text, "127.0.0.1:", 10) == 0);
      connected++;
      if (callback_mode && !misc_checked) {
        /* What a callback may not do. */
        size_t n = 0;
        CHECK_STATUS(rdmx_msgr_poll(M, 0, NULL, 0, &n), RDMX_BUSY);
        CHECK_ERR_HAS("inside an event callback");
        rdmx_msgr_free(M); /* refused: nothing freed */
        CHECK_ERR_HAS("refused");
        misc_checked = 1;
      }
      break;
    case RDMX_MSGR_EVENT_MESSAGE: {
      CHECK(ev->session == S);
      rdmx_msg *msg = ev->msg;
      verify_echo(msg);
      /* Release the data early now and then; freeing the message releases the rest. */
      if (echoed % 5 == 0) {
        CHECK_STATUS(rdmx_msg_seg_release(msg, 0), RDMX_OK);
        CHECK_STATUS(rdmx_msg_seg_release(msg, 0), RDMX_INVALID_ARGUMENT);
        CHECK(rdmx_msg_seg_len(msg, 0) == 0);
      }
      rdmx_msg_free(msg);
      break;
    }
    case RDMX_MSGR_EVENT_SEND_COMPLETE:
      CHECK(ev->session == S);
      if (ev->status == RDMX_OK) {
        completed_ok++;
      } else {
        fprintf(stderr, "send %llu failed: %s\n", (unsigned long long)ev->send_id, ev->text);
        completed_failed++;
      }
      if (ev->send_id < MAX_SENDS + 64 && slot_of_send[ev->send_id] > 0) {
        slot_busy[slot_of_send[ev->send_id] - 1] = 0;
        slot_of_send[ev->send_id] = 0;
      }
      if (ev->send_id == quit_id) quit_done = 1;
      break;
    case RDMX_MSGR_EVENT_SEND_READY:
      ready_seen++;
      break;
    case RDMX_MSGR_EVENT_RESET:
      fprintf(stderr, "reset: %s (%s)\n", ev->text, rdmx_status_str((int)ev->status));
      resets++;
      break;
    default:
      CHECK(!"unknown event kind");
  }
}

static void on_event(void *user, rdmx_msgr *m, const rdmx_msgr_event *ev) {
  CHECK(user == &tag);
  CHECK(m == M);
  handle(ev);
}

static void pump(int timeout_ms) {
  size_t n = 0;
  if (callback_mode) {
    CHECK_STATUS(rdmx_msgr_poll(M, timeout_ms, NULL, 0, &n), RDMX_OK);
    return;
  }
  rdmx_msgr_event evs[16];
  CHECK_STATUS(rdmx_msgr_poll(M, timeout_ms, evs, 16, &n), RDMX_OK);
  for (size_t i = 0; i < n; i++) handle(&evs[i]);
}

/* Sends ECHO `number`; the data's memory kind rotates. Returns the status (RDMX_FULL: nothing
 * was consumed; a lent chunk is given back here). */
static rdmx_status send_number(uint64_t number, const rdmx_mem *mem) {
  uint32_t len = (number % 50 == 49) ? BIG : ECHO_DATA;
  uint32_t kind = (uint32_t)(number % 3);
  if (kind == RDMX_SEG_CHUNK && len > 4096) kind = RDMX_SEG_COPY;
  static uint8_t scratch[BIG];
  uint8_t *data = scratch;
  rdmx_chunk chunk;
  int slot = -1;
  if (kind == RDMX_SEG_CHUNK) {
    rdmx_status st = rdmx_msgr_chunk_get(M, &chunk);
    if (st != RDMX_OK) return st;
    CHECK(chunk.length == 4096);
    CHECK(((uintptr_t)chunk.addr % 4096) == 0);
    data = (uint8_t *)chunk.addr;
  } else if (kind == RDMX_SEG_MEM) {
    slot = (int)(number % SLOTS);
    double end = now_s() + 30.0;
    while (slot_busy[slot] && now_s() < end) pump(1);
    CHECK(!slot_busy[slot]);
    data = ring + (size_t)slot * BIG;
  }
  for (uint32_t j = 0; j < len; j++) data[j] = echo_byte(number, j);
  echo_front f;
  memset(&f, 0, sizeof f);
  f.number = number;
  f.checksum = fnv1a(FNV_INIT, data, len);
  f.data_len = len;
  f.seg_kind = kind;
  rdmx_msg_iov iov;
  memset(&iov, 0, sizeof iov);
  iov.kind = kind;
  iov.addr = data;
  iov.length = len;
  iov.mem = mem;
  uint64_t id = 0;
  rdmx_status st = rdmx_session_send(M, S, ECHO_TYPE, &f, sizeof f, &iov, 1, &id);
  if (st == RDMX_OK) {
    sent_numbers++;
    if (kind == RDMX_SEG_COPY) copied_expected += len;
    if (slot >= 0 && id < MAX_SENDS + 64) {
      slot_busy[slot] = 1;
      slot_of_send[id] = (int16_t)(slot + 1);
    }
  } else {
    snprintf(send_error, sizeof send_error, "%s", rdmx_last_error());
  }
  if (st != RDMX_OK && kind == RDMX_SEG_CHUNK) {
    rdmx_msgr_stats s = {.struct_size = sizeof s};
    CHECK_STATUS(rdmx_msgr_get_stats(M, &s), RDMX_OK);
    CHECK(s.chunks_lent == 1); /* refused: still ours */
    CHECK_STATUS(rdmx_msgr_chunk_put(M, chunk.addr), RDMX_OK);
    CHECK_STATUS(rdmx_msgr_chunk_put(M, chunk.addr), RDMX_INVALID_ARGUMENT);
  }
  return st;
}

static void bad_arguments(void) {
  rdmx_msgr *none = NULL;
  uint64_t s = 0;
  CHECK_STATUS(rdmx_msgr_new(NULL, NULL, NULL, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("out is NULL");
  CHECK_STATUS(rdmx_msgr_listen(none, "127.0.0.1:0", NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("msgr is NULL");
  CHECK_STATUS(rdmx_msgr_connect(M, NULL, RDMX_POLICY_DEFAULT, &s), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("addr is NULL");
  CHECK_STATUS(rdmx_msgr_connect(M, "127.0.0.1:1", 7, &s), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("policy 7");
  CHECK_STATUS(rdmx_msgr_connect(M, "no-port-here", RDMX_POLICY_LOSSY, &s), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_msgr_connect(M, "127.0.0.1:1", RDMX_POLICY_LOSSY, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_session_send(M, 12345, 1, NULL, 0, NULL, 0, NULL), RDMX_CLOSED);
  CHECK_STATUS(rdmx_session_send(none, 1, 1, NULL, 0, NULL, 0, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_session_send(M, S, 1, NULL, 4, NULL, 0, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("front is NULL");
  CHECK_STATUS(rdmx_session_send(M, S, 1, NULL, 0, NULL, 1, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("iov is NULL");
  rdmx_msg_iov iov;
  memset(&iov, 0, sizeof iov);
  iov.kind = 9;
  CHECK_STATUS(rdmx_session_send(M, S, 1, NULL, 0, &iov, 1, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("kind 9");
  iov.kind = RDMX_SEG_CHUNK;
  iov.addr = &iov;
  iov.length = 8;
  CHECK_STATUS(rdmx_session_send(M, S, 1, NULL, 0, &iov, 1, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("not a chunk lent");
  iov.kind = RDMX_SEG_MEM;
  CHECK_STATUS(rdmx_session_send(M, S, 1, NULL, 0, &iov, 1, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("mem is NULL");
  iov.kind = RDMX_SEG_RECEIVED;
  CHECK_STATUS(rdmx_session_send(M, S, 1, NULL, 0, &iov, 1, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("msg is NULL");
  char big_front[4096] = {0};
  CHECK_STATUS(rdmx_session_send(M, S, 1, big_front, sizeof big_front, NULL, 0, NULL),
               RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("front of 4096 bytes");
  /* Over the message limits (main sets msgr_max_segments = 8): refused at send. */
  rdmx_msg_iov nine[9];
  memset(nine, 0, sizeof nine);
  for (int k = 0; k < 9; k++) {
    nine[k].kind = RDMX_SEG_COPY;
    nine[k].addr = big_front;
    nine[k].length = 16;
  }
  CHECK_STATUS(rdmx_session_send(M, S, 1, NULL, 0, nine, 9, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("msgr_max_segments");
  /* A byte limit the data pool cannot hold (half of it at most) is refused at creation. */
  rdmx_config *small = NULL;
  rdmx_msgr *refused = NULL;
  CHECK_STATUS(rdmx_config_new(&small), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(small, "msgr_pool_chunks", "1024"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(small, "msgr_max_message_bytes", "4194304"), RDMX_OK);
  CHECK_STATUS(rdmx_msgr_new(small, NULL, NULL, &refused), RDMX_CONFLICT);
  CHECK_ERR_HAS("msgr_max_message_bytes");
  CHECK(refused == NULL);
  rdmx_config_free(small);
  CHECK_STATUS(rdmx_msgr_chunk_put(M, &iov), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_session_inject_fault(M, S, 99), RDMX_INVALID_ARGUMENT);
  rdmx_session_info info = {.struct_size = sizeof info};
  CHECK(rdmx_session_get_info(M, 12345, &info) != RDMX_OK);
  CHECK_STATUS(rdmx_session_get_info(M, S, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_msgr_poll(none, 0, NULL, 0, NULL), RDMX_INVALID_ARGUMENT);
  if (!callback_mode) {
    CHECK_STATUS(rdmx_msgr_poll(M, 0, NULL, 4, NULL), RDMX_INVALID_ARGUMENT);
  }
  CHECK(rdmx_msgr_event_fd(none) == -1);
  CHECK(rdmx_msgr_event_fd(M) >= 0);
  CHECK(rdmx_msg_type(NULL) == 0);
  CHECK(rdmx_msg_seq(NULL) == 0);
  CHECK(rdmx_msg_seg_count(NULL) == 0);
  CHECK(rdmx_msg_seg_len(NULL, 0) == 0);
  CHECK(rdmx_msg_front(NULL, NULL) == NULL);
  CHECK_STATUS(rdmx_msg_seg_iov(NULL, 0, NULL, 0, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_msg_seg_release(NULL, 0), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_msgr_mem_dereg(M, NULL), RDMX_INVALID_ARGUMENT);
  rdmx_msg_free(NULL);
  rdmx_msgr_free(NULL);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s HOST:PORT poll|callback COUNT\n", argv[0]);
    return 2;
  }
  const char *addr = argv[1];
  callback_mode = strcmp(argv[2], "callback") == 0;
  uint64_t count = (uint64_t)strtoull(argv[3], NULL, 10);
  if (count > MAX_SENDS - 100) count = MAX_SENDS - 100;

  rdmx_config *cfg = NULL;
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "soft_port", "0"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "msgr_threads", "0"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "msgr_send_queue_msgs", "16"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "msgr_max_segments", "8"), RDMX_OK);
  CHECK_STATUS(rdmx_config_set(cfg, "msgr_keepalive_timeout_ms", "30000"), RDMX_OK);
  CHECK_STATUS(rdmx_msgr_new(cfg, callback_mode ? on_event : NULL, &tag, &M), RDMX_OK);
  rdmx_config_free(cfg);
  if (M == NULL) CHECK_DONE("msgr_echo_client");
  rdmx_msgr_stats base = {.struct_size = sizeof base};
  CHECK_STATUS(rdmx_msgr_get_stats(M, &base), RDMX_OK);

  uint32_t policy = callback_mode ? RDMX_POLICY_LOSSY : RDMX_POLICY_LOSSLESS;
  CHECK_STATUS(rdmx_msgr_connect(M, addr, policy, &S), RDMX_OK);
  bad_arguments();
  double end = now_s() + 60.0;
  while (!connected && !resets && now_s() < end) pump(10);
  CHECK(connected == 1);
  char peer[64];
  size_t peer_len = 0;
  CHECK_STATUS(rdmx_session_peer(M, S, peer, sizeof peer, &peer_len), RDMX_OK);
  CHECK_STREQ(peer, addr);
  CHECK_STATUS(rdmx_session_peer(M, S, peer, 3, &peer_len), RDMX_BUFFER_TOO_SMALL);
  CHECK(peer_len == strlen(addr));

  ring = (uint8_t *)aligned_alloc(4096, (size_t)SLOTS * BIG);
  rdmx_mem mem;
  CHECK_STATUS(rdmx_msgr_mem_reg(M, ring, (size_t)SLOTS * BIG, &mem), RDMX_OK);
  CHECK(mem.addr <= (uint64_t)(uintptr_t)ring && mem.length >= (uint64_t)SLOTS * BIG);

  /* RDMX_FULL at the bound (16 messages held; nothing moves without poll here). */
  uint64_t number = 0;
  rdmx_status st = RDMX_OK;
  int burst = 0;
  for (; burst < 64 && (st = send_number(number, &mem)) == RDMX_OK; burst++) number++;
  CHECK(st == RDMX_FULL);
  CHECK(strstr(send_error, "msgr_send_queue_msgs") != NULL);
  CHECK(burst == 16);
  end = now_s() + 60.0;
  while (!ready_seen && now_s() < end) pump(10);
  CHECK(ready_seen > 0);

  /* The numbered stream, WINDOW echoes outstanding at most. */
  int faulted = 0;
  end = now_s() + 600.0;
  while (number < count && now_s() < end && !resets) {
    if (number - echoed >= WINDOW) {
      pump(10);
      continue;
    }
    if (!callback_mode && !faulted && number >= count / 2) {
      CHECK_STATUS(rdmx_session_inject_fault(M, S, RDMX_FAULT_QP_ERROR), RDMX_OK);
      faulted = 1;
    }
    st = send_number(number, &mem);
    if (st == RDMX_OK) {
      number++;
    } else if (st == RDMX_FULL) {
      pump(10);
    } else {
      fprintf(stderr, "send %llu: %s\n", (unsigned long long)number, rdmx_last_error());
      check_failures++;
      break;
    }
  }
  while (echoed < number && now_s() < end && !resets) pump(10);
  CHECK(echoed == count);
  CHECK(next_expected == count);

  /* QUIT, acknowledged by the server. */
  CHECK_STATUS(rdmx_session_send(M, S, QUIT_TYPE, "bye", 3, NULL, 0, &quit_id), RDMX_OK);
  while (!quit_done && now_s() < end && !resets) pump(10);
  CHECK(quit_done);
  while (completed_ok + completed_failed < sent_numbers + 1 && now_s() < end) pump(10);
  CHECK(completed_ok == sent_numbers + 1);
  CHECK(completed_failed == 0);
  CHECK(resets == 0);

  rdmx_session_info info = {.struct_size = sizeof info};
  CHECK_STATUS(rdmx_session_get_info(M, S, &info), RDMX_OK);
  CHECK(info.state == RDMX_SESSION_OPEN);
  CHECK(info.policy == policy);
  CHECK(info.incoming == 0);
  CHECK(info.queued == 0 && info.unacked == 0);
  rdmx_session_counters c = {.struct_size = sizeof c};
  CHECK_STATUS(rdmx_session_get_counters(M, S, &c), RDMX_OK);
  CHECK(c.msgs_sent == sent_numbers + 1);
  CHECK(c.msgs_received == count);
  CHECK(c.copied_bytes == copied_expected);
  CHECK(c.eager_segments > 0);
  /* The server echoes 4 KiB segments eagerly, as RDMA WRITEs into the chunks this side
     granted (msgr_eager_write, on by default on both). */
  CHECK(c.written_segments > 0 && c.written_segments <= c.eager_segments);
  CHECK(c.read_segments > 0 || count < 50);
  CHECK(c.full_refusals >= 1);
  CHECK(c.rnr_naks == 0);
  /* Send-queue completions are counted (one per batch of sends: only its last is signaled). */
  CHECK(c.send_completions > 0);
  /* Same header and library: each struct filled whole. */
  CHECK(c.struct_size == sizeof c && info.struct_size == sizeof info);
  if (faulted) {
    CHECK(c.reconnects >= 1);
    CHECK(c.faults >= 1);
  }
  printf("client (%s): %llu echoes verified, sent %llu B, received %llu B, copied %llu B, "
         "eager %llu (written %llu), read %llu, credit stalls %llu, full %llu, faults %llu, "
         "reconnects %llu, replays %llu\n",
         argv[2], (unsigned long long)echoed, (unsigned long long)c.bytes_sent,
         (unsigned long long)c.bytes_received, (unsigned long long)c.copied_bytes,
         (unsigned long long)c.eager_segments, (unsigned long long)c.written_segments,
         (unsigned long long)c.read_segments,
         (unsigned long long)c.credit_stalls, (unsigned long long)c.full_refusals,
         (unsigned long long)c.faults, (unsigned long long)c.reconnects,
         (unsigned long long)c.replays);

  CHECK_STATUS(rdmx_session_close(M, S), RDMX_OK);
  CHECK_STATUS(rdmx_session_close(M, S), RDMX_CLOSED);
  CHECK_STATUS(rdmx_msgr_mem_dereg(M, &mem), RDMX_OK);
  CHECK_STATUS(rdmx_msgr_mem_dereg(M, &mem), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_msgr_mem_invalidate(M, ring, (size_t)SLOTS * BIG), RDMX_OK);

  /* Pools back to their baseline once the closed connection drained. */
  rdmx_msgr_stats s = {.struct_size = sizeof s};
  double until = now_s() + 10.0;
  do {
    pump(10);
    CHECK_STATUS(rdmx_msgr_get_stats(M, &s), RDMX_OK);
  } while (now_s() < until && (s.data_chunks_in_use != base.data_chunks_in_use ||
                               s.header_slots_in_use != base.header_slots_in_use));
  CHECK(s.sessions == 0);
  CHECK(s.active_sessions == 0);
  CHECK(s.missed_wakes == 0); /* every parked session was woken by its own work */
  CHECK(s.data_chunks_in_use == base.data_chunks_in_use);
  CHECK(s.header_slots_in_use == base.header_slots_in_use);
  CHECK(s.copy_chunks_in_use == 0);
  CHECK(s.chunks_lent == 0);
  CHECK(s.mem_registrations == 0);
  CHECK(s.events_queued == 0);
  rdmx_session_counters totals = {.struct_size = sizeof totals};
  CHECK_STATUS(rdmx_msgr_get_totals(M, &totals), RDMX_OK);
  CHECK(totals.msgs_sent == sent_numbers + 1);
  rdmx_msgr_free(M);
  free(ring);
  CHECK_DONE(callback_mode ? "msgr_echo_client (callback)" : "msgr_echo_client (poll)");
}

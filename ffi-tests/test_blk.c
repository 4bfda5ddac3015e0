/* C consumer of the block client (rdmx_blk_*): against an rdmx-target whose address is
 * argv[1] and which serves a memory volume "v0" of at least 4 MiB, writes a pattern in
 * batches of 4 KiB and 64 KiB requests, reads it back at random offsets (rpc and one-sided
 * read mode) and checks every byte, and that rpc reads copied nothing (placed by the
 * target's RDMA WRITE); bad requests complete with -EINVAL/-ERANGE; NULL
 * arguments are refused. */
#define _DEFAULT_SOURCE
#include <rdmx.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"

#define SPAN (1u << 20)  /* bytes written and checked */
#define QD 32u

static uint8_t pattern(uint64_t off) { return (uint8_t)((off * 2654435761u) >> 13) ^ (uint8_t)(off >> 12); }

/* Submits every request (resubmitting what a full queue refused) and waits for all;
 * returns how many completed with status 0; each completion's status is stored by cookie. */
static size_t run_all(rdmx_blk *b, rdmx_blk_req *reqs, size_t n, int32_t *status) {
  size_t next = 0, done = 0, ok = 0;
  rdmx_blk_completion wc[QD];
  for (int rounds = 0; done < n && rounds < 100000; rounds++) {
    if (next < n) {
      size_t k = 0, batch = n - next < QD ? n - next : QD;
      if (rdmx_blk_inflight(b) < QD) {
        rdmx_status s = rdmx_blk_submit(b, reqs + next, batch, &k);
        CHECK_STATUS(s, RDMX_OK);
        if (s != RDMX_OK) break;
        next += k;
      }
    }
    size_t got = 0;
    CHECK_STATUS(rdmx_blk_poll(b, wc, QD, 1, 100, &got), RDMX_OK);
    for (size_t i = 0; i < got; i++) {
      if (wc[i].cookie < n) status[wc[i].cookie] = wc[i].status;
      if (wc[i].status == 0) ok++;
      done++;
    }
  }
  CHECK(done == n);
  return ok;
}

static void write_pattern(rdmx_blk *b, uint8_t *buf, uint32_t io) {
  size_t n = SPAN / io;
  rdmx_blk_req *reqs = calloc(n, sizeof *reqs);
  int32_t *st = calloc(n, sizeof *st);
  for (uint64_t i = 0; i < SPAN; i++) buf[i] = pattern(i + io);
  for (size_t i = 0; i < n; i++) {
    reqs[i].op = RDMX_BLK_WRITE;
    reqs[i].len = io;
    reqs[i].offset = i * io;
    reqs[i].buf = buf + i * io;
    reqs[i].cookie = i;
  }
  CHECK(run_all(b, reqs, n, st) == n);
  free(reqs);
  free(st);
}

/* Reads every 4 KiB block once, in a random order, each into its own place; checks all. */
static void read_check(rdmx_blk *b, uint8_t *buf, uint32_t seed_io, unsigned seed) {
  size_t n = SPAN / 4096;
  size_t *order = calloc(n, sizeof *order);
  rdmx_blk_req *reqs = calloc(n, sizeof *reqs);
  int32_t *st = calloc(n, sizeof *st);
  for (size_t i = 0; i < n; i++) order[i] = i;
  srand(seed);
  for (size_t i = n - 1; i > 0; i--) {
    size_t j = (size_t)rand() % (i + 1), t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  memset(buf, 0xEE, SPAN);
  for (size_t i = 0; i < n; i++) {
    reqs[i].op = RDMX_BLK_READ;
    reqs[i].len = 4096;
    reqs[i].offset = order[i] * 4096;
    reqs[i].buf = buf + order[i] * 4096;
    reqs[i].cookie = i;
  }
  CHECK(run_all(b, reqs, n, st) == n);
  size_t bad = 0;
  for (uint64_t i = 0; i < SPAN; i++)
    if (buf[i] != pattern(i + seed_io)) {
      if (bad++ < 5) fprintf(stderr, "byte %lu: got %#x want %#x\n", (unsigned long)i, buf[i], pattern(i + seed_io));
    }
  CHECK(bad == 0);
  free(order);
  free(reqs);
  free(st);
}

static void bad_requests(rdmx_blk *b, uint8_t *buf, uint64_t size) {
  rdmx_blk_req reqs[5] = {
      {RDMX_BLK_READ, 4096, 512, buf, 0},       /* misaligned offset */
      {RDMX_BLK_WRITE, 100, 0, buf, 1},         /* misaligned length */
      {RDMX_BLK_READ, 4096, size, buf, 2},      /* beyond the end */
      {RDMX_BLK_READ, 2u << 20, 0, buf, 3},     /* above 1 MiB */
      {42, 4096, 0, buf, 4},                    /* unknown op */
  };
  int32_t st[5] = {1, 1, 1, 1, 1};
  CHECK(run_all(b, reqs, 5, st) == 0);
  CHECK(st[0] == -EINVAL);
  CHECK(st[1] == -EINVAL);
  CHECK(st[2] == -ERANGE);
  CHECK(st[3] == -EINVAL);
  CHECK(st[4] == -EINVAL);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s TARGET_ADDR:PORT (an rdmx-target serving v0=mem:4M or more)\n", argv[0]);
    return 2;
  }
  const char *addr = argv[1];
  rdmx_blk *b = NULL;
  /* NULL safety. */
  CHECK_STATUS(rdmx_blk_open(NULL, NULL, "v0", RDMX_BLK_MODE_RPC, 0, &b), RDMX_INVALID_ARGUMENT);
  CHECK(b == NULL);
  CHECK_STATUS(rdmx_blk_open(NULL, addr, "v0", RDMX_BLK_MODE_RPC, 0, NULL), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_blk_open(NULL, addr, "v0", 7, 0, &b), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_blk_open(NULL, addr, "nope", RDMX_BLK_MODE_RPC, 0, &b), RDMX_INVALID_ARGUMENT);
  CHECK_ERR_HAS("nope");
  size_t k = 7;
  CHECK_STATUS(rdmx_blk_submit(NULL, NULL, 1, &k), RDMX_INVALID_ARGUMENT);
  CHECK(k == 0);
  CHECK_STATUS(rdmx_blk_poll(NULL, NULL, 1, 0, 0, &k), RDMX_INVALID_ARGUMENT);
  CHECK(rdmx_blk_event_fd(NULL) == -1);
  CHECK(rdmx_blk_inflight(NULL) == 0);
  rdmx_blk_free(NULL);

  rdmx_config *cfg = NULL;
  CHECK_STATUS(rdmx_config_new(&cfg), RDMX_OK);
  CHECK_STATUS(rdmx_blk_open(cfg, addr, "v0", RDMX_BLK_MODE_RPC, 10000, &b), RDMX_OK);
  if (b == NULL) {
    fprintf(stderr, "open: %s\n", rdmx_last_error());
    rdmx_config_free(cfg);
    CHECK_DONE("test_blk (C)");
  }
  rdmx_blk_volume info;
  CHECK_STATUS(rdmx_blk_info(b, &info), RDMX_OK);
  CHECK(info.block_size == 4096);
  CHECK(info.size >= SPAN);
  CHECK(info.one_sided == 1);
  CHECK(rdmx_blk_event_fd(b) >= 0);
  uint8_t *buf = aligned_alloc(4096, SPAN);
  CHECK(buf != NULL);
  CHECK_STATUS(rdmx_blk_mem_register(b, NULL, 0), RDMX_INVALID_ARGUMENT);
  CHECK_STATUS(rdmx_blk_mem_register(b, buf, SPAN), RDMX_OK);

  write_pattern(b, buf, 4096);
  read_check(b, buf, 4096, 1);
  write_pattern(b, buf, 65536);
  read_check(b, buf, 65536, 2);
  /* Reads were placed in buf by the target's RDMA WRITE: nothing copied in rdmx. */
  rdmx_blk_counters kc = {.struct_size = sizeof kc};
  CHECK_STATUS(rdmx_blk_get_counters(b, &kc), RDMX_OK);
  CHECK(kc.copied_bytes == 0 && kc.copied_reads == 0);
  CHECK(kc.placed_bytes == 2u * SPAN && kc.placed_reads == 2u * (SPAN / 4096));
  /* Each answered by the WRITE's immediate value alone: no reply message. */
  CHECK(kc.imm_replies == kc.placed_reads);
  CHECK_STATUS(rdmx_blk_get_counters(b, NULL), RDMX_INVALID_ARGUMENT);
  /* A single-path client has no path events. */
  rdmx_blk_path_event pe = {.struct_size = sizeof(pe)};
  CHECK_STATUS(rdmx_blk_next_path_event(b, &pe), RDMX_OK);
  CHECK(pe.kind == RDMX_BLK_PATH_EVENT_NONE);
  CHECK_STATUS(rdmx_blk_get_counters(NULL, &kc), RDMX_INVALID_ARGUMENT);
  bad_requests(b, buf, info.size);
  /* A flush. */
  rdmx_blk_req fl = {RDMX_BLK_FLUSH, 0, 0, NULL, 0};
  int32_t st = 1;
  CHECK(run_all(b, &fl, 1, &st) == 1 && st == 0);

  /* One-sided read mode: the same data, read straight into buf by RDMA READ. */
  rdmx_blk *o = NULL;
  CHECK_STATUS(rdmx_blk_open(cfg, addr, "v0", RDMX_BLK_MODE_READ, 10000, &o), RDMX_OK);
  if (o != NULL) {
    read_check(o, buf, 65536, 3);
    write_pattern(o, buf, 4096);
    read_check(b, buf, 4096, 4); /* written one-sided, read through the target */
    rdmx_blk_free(o);
  }
  rdmx_blk_free(b);
  rdmx_config_free(cfg);
  free(buf);
  CHECK_DONE("test_blk (C)");
}

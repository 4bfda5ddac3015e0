/* Memory windows through unmodified libibverbs (run under `rdmx-ibv exec`; built and run
 * by rdmx-ibv/tests/ibv_mw.rs): ibv_alloc_mw / ibv_dealloc_mw, IBV_WR_BIND_MW (type 2),
 * ibv_bind_mw (type 1), IBV_WR_LOCAL_INV, IBV_WR_SEND_WITH_INV (remote invalidation), their
 * completions and errors as verbs gives them, and what a window's rkey opens: its range and
 * rights, on the QP it is bound to (type 2), until it is invalidated or deallocated.
 *
 * One process, pairs of RC QPs of the one device connected to each other (both on the
 * process's address, GID index 0): `t` (the target, which binds) and `i` (the initiator,
 * which READs and WRITEs). A remote access error ends a pair, so each refusal gets a fresh
 * one. Exit 0 when every step held. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(cond, ...)                                                 \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "ibv_mw: %s:%d: ", __FILE__, __LINE__);            \
      fprintf(stderr, __VA_ARGS__);                                      \
      fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));      \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

#include "qp_pair.h"

#define WIN_OFF 1024
#define WIN_LEN 1024

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static char win_buf[4096];  /* registered with MW_BIND only: no remote right of its own */
static char src_buf[4096];  /* the initiator's local buffer */
static char plain_buf[4096]; /* registered without MW_BIND */
static struct ibv_mr *win_mr, *src_mr, *plain_mr;

struct pair {
  struct ibv_cq *tcq, *icq, *rcq;
  struct ibv_qp *t, *i;
};

/* How every pair's QPs are made and connected. */
static const struct qp_opts opts = {
    .depth = 16,
    .access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE,
    .rd_atomic = 4,
    .min_rnr_timer = 1};

/* The next completion of `cq` (5 s at most). */
static struct ibv_wc next_wc(struct ibv_cq *cq, const char *what) {
  struct ibv_wc wc;
  for (long spins = 0;; spins++) {
    CHECK(spins < 50000000L, "%s: no completion", what);
    int r = ibv_poll_cq(cq, 1, &wc);
    CHECK(r >= 0, "ibv_poll_cq (%s)", what);
    if (r == 1) return wc;
  }
}

/* No completion on `cq` for about `ms` milliseconds of polling. */
static void no_wc(struct ibv_cq *cq, int ms, const char *what) {
  struct ibv_wc wc;
  for (int k = 0; k < ms; k++) {
    int r = ibv_poll_cq(cq, 1, &wc);
    CHECK(r == 0, "%s: unexpected completion (wr_id %llu status %d)", what,
          (unsigned long long)wc.wr_id, (int)wc.status);
    struct timespec d = {0, 1000000};
    nanosleep(&d, NULL);
  }
}

static struct pair make_pair(void) {
  struct pair p;
  p.tcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
  p.icq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
  p.rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
  CHECK(p.tcq && p.icq && p.rcq, "ibv_create_cq");
  p.t = qp_pair_make(pd, p.tcq, p.rcq, &opts);
  p.i = qp_pair_make(pd, p.icq, p.rcq, &opts);
  qp_pair_connect_both(p.t, p.i, &gid, &opts);
  return p;
}

static void free_pair(struct pair *p) {
  CHECK(ibv_destroy_qp(p->t) == 0 && ibv_destroy_qp(p->i) == 0, "ibv_destroy_qp");
  CHECK(ibv_destroy_cq(p->tcq) == 0 && ibv_destroy_cq(p->icq) == 0 &&
            ibv_destroy_cq(p->rcq) == 0,
        "ibv_destroy_cq");
}

/* Posts IBV_WR_BIND_MW of the type-2 window `mw` on `qp` over [win_buf + off, + len) of
 * `mr`; returns the window's new rkey. */
static uint32_t post_bind(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mr *mr, size_t off,
                          size_t len, unsigned access, uint64_t id) {
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info.mr = mr;
  wr.bind_mw.bind_info.addr = (uintptr_t)mr->addr + off;
  wr.bind_mw.bind_info.length = len;
  wr.bind_mw.bind_info.mw_access_flags = access;
  CHECK(ibv_post_send(qp, &wr, &bad) == 0, "post BIND_MW");
  return wr.bind_mw.rkey;
}

static void post_local_inv(struct ibv_qp *qp, uint32_t rkey, uint64_t id) {
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = id;
  wr.opcode = IBV_WR_LOCAL_INV;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.invalidate_rkey = rkey;
  CHECK(ibv_post_send(qp, &wr, &bad) == 0, "post LOCAL_INV");
}

/* Posts a receive of 64 bytes (at src_buf + 2048) on `qp`. */
static void post_recv_of(struct ibv_qp *qp, uint64_t id) {
  struct ibv_sge rs = {.addr = (uintptr_t)src_buf + 2048, .length = 64, .lkey = src_mr->lkey};
  struct ibv_recv_wr r, *bad = NULL;
  memset(&r, 0, sizeof r);
  r.wr_id = id;
  r.sg_list = &rs;
  r.num_sge = 1;
  CHECK(ibv_post_recv(qp, &r, &bad) == 0, "post_recv");
}

/* Posts an 8-byte IBV_WR_SEND_WITH_INV of `rkey` on `qp`. */
static void post_send_inv(struct ibv_qp *qp, uint32_t rkey, uint64_t id) {
  struct ibv_sge sge = {.addr = (uintptr_t)src_buf, .length = 8, .lkey = src_mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND_WITH_INV;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.invalidate_rkey = rkey;
  CHECK(ibv_post_send(qp, &wr, &bad) == 0, "post SEND_WITH_INV");
}

/* The initiator's RDMA `op` of `len` bytes at win_buf + off through `rkey`; returns the
 * completion status. */
static int rdma(struct pair *p, enum ibv_wr_opcode op, uint32_t rkey, size_t off, uint32_t len,
                uint64_t id) {
  struct ibv_sge sge = {.addr = (uintptr_t)src_buf, .length = len, .lkey = src_mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = (uintptr_t)win_buf + off;
  wr.wr.rdma.rkey = rkey;
  CHECK(ibv_post_send(p->i, &wr, &bad) == 0, "post RDMA");
  struct ibv_wc wc = next_wc(p->icq, "RDMA");
  CHECK(wc.wr_id == id, "RDMA: wr_id %llu, want %llu", (unsigned long long)wc.wr_id,
        (unsigned long long)id);
  return (int)wc.status;
}

static void expect_bind(struct ibv_cq *cq, uint64_t id, int status, const char *what) {
  struct ibv_wc wc = next_wc(cq, what);
  CHECK(wc.wr_id == id, "%s: wr_id %llu, want %llu", what, (unsigned long long)wc.wr_id,
        (unsigned long long)id);
  CHECK((int)wc.status == status, "%s: status %s, want %s", what,
        ibv_wc_status_str(wc.status), ibv_wc_status_str((enum ibv_wc_status)status));
  if (status == IBV_WC_SUCCESS)
    CHECK(wc.opcode == IBV_WC_BIND_MW, "%s: opcode %d, want IBV_WC_BIND_MW", what, wc.opcode);
}

int main(void) {
  ctx = qp_pair_open_device();
  CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "ibv_query_gid");

  /* The device says it has windows (as rxe: MEM_WINDOW | MEM_WINDOW_TYPE_2B) ... */
  struct ibv_device_attr da;
  CHECK(ibv_query_device(ctx, &da) == 0, "ibv_query_device");
  CHECK(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW, "no IBV_DEVICE_MEM_WINDOW");
  CHECK(da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B, "no MEM_WINDOW_TYPE_2B");
  /* ... and remote invalidation (as rxe: MEM_MGT_EXTENSIONS). */
  CHECK(da.device_cap_flags & IBV_DEVICE_MEM_MGT_EXTENSIONS, "no MEM_MGT_EXTENSIONS");
  CHECK(da.max_mw > 0, "max_mw %d", da.max_mw);

  pd = ibv_alloc_pd(ctx);
  CHECK(pd != NULL, "ibv_alloc_pd");
  win_mr = ibv_reg_mr(pd, win_buf, sizeof win_buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
  src_mr = ibv_reg_mr(pd, src_buf, sizeof src_buf, IBV_ACCESS_LOCAL_WRITE);
  plain_mr = ibv_reg_mr(pd, plain_buf, sizeof plain_buf, IBV_ACCESS_LOCAL_WRITE);
  CHECK(win_mr && src_mr && plain_mr, "ibv_reg_mr");

  /* Type 3 does not exist. */
  errno = 0;
  CHECK(ibv_alloc_mw(pd, (enum ibv_mw_type)3) == NULL && errno == EINVAL,
        "ibv_alloc_mw(type 3) must fail with EINVAL");

  /* 1. A type-2 window opens its range, READ and WRITE, to its QP's peer. */
  struct pair p = make_pair();
  struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
  CHECK(mw != NULL && mw->type == IBV_MW_TYPE_2 && mw->pd == pd, "ibv_alloc_mw(type 2)");
  uint32_t rkey = post_bind(p.t, mw, win_mr, WIN_OFF, WIN_LEN,
                            IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, 1);
  expect_bind(p.tcq, 1, IBV_WC_SUCCESS, "bind");
  memcpy(src_buf, "windowed", 8);
  CHECK(rdma(&p, IBV_WR_RDMA_WRITE, rkey, WIN_OFF, 8, 2) == IBV_WC_SUCCESS, "WRITE in the window");
  CHECK(memcmp(win_buf + WIN_OFF, "windowed", 8) == 0, "the WRITE did not land");
  memcpy(win_buf + WIN_OFF + WIN_LEN - 8, "lastbyte", 8);
  CHECK(rdma(&p, IBV_WR_RDMA_READ, rkey, WIN_OFF + WIN_LEN - 8, 8, 3) == IBV_WC_SUCCESS,
        "READ of the window's end");
  CHECK(memcmp(src_buf, "lastbyte", 8) == 0, "the READ read something else");
  /* A bound region cannot be deregistered (EBUSY, as verbs). */
  errno = 0;
  int rc = ibv_dereg_mr(win_mr);
  CHECK(rc == EBUSY, "ibv_dereg_mr of a region with a bound window: %d, want EBUSY", rc);
  /* One byte past the window: a remote access error, nothing written. */
  win_buf[WIN_OFF + WIN_LEN] = 0;
  CHECK(rdma(&p, IBV_WR_RDMA_WRITE, rkey, WIN_OFF + WIN_LEN - 7, 8, 4) == IBV_WC_REM_ACCESS_ERR,
        "a WRITE one byte past the window must be a remote access error");
  CHECK(win_buf[WIN_OFF + WIN_LEN] == 0, "written past the window");
  free_pair(&p);

  /* 2. The region's own rkey opens nothing (registered without remote rights). */
  p = make_pair();
  CHECK(rdma(&p, IBV_WR_RDMA_READ, win_mr->rkey, WIN_OFF, 8, 5) == IBV_WC_REM_ACCESS_ERR,
        "the region's rkey must not open it");
  free_pair(&p);

  /* 3. Another QP's peer: the window is bound to the first pair's target QP. */
  struct pair other = make_pair();
  p = make_pair();
  /* The window of step 1 is still bound to a destroyed QP: rebinding a bound type-2 window
   * is refused (invalidate it first). */
  post_bind(p.t, mw, win_mr, WIN_OFF, WIN_LEN, IBV_ACCESS_REMOTE_READ, 6);
  expect_bind(p.tcq, 6, IBV_WC_MW_BIND_ERR, "rebinding a bound type-2 window");
  free_pair(&p);
  p = make_pair();
  post_local_inv(p.t, rkey, 7);
  struct ibv_wc wc = next_wc(p.tcq, "LOCAL_INV");
  CHECK(wc.wr_id == 7 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV,
        "LOCAL_INV: status %s opcode %d", ibv_wc_status_str(wc.status), wc.opcode);
  rkey = post_bind(p.t, mw, win_mr, WIN_OFF, WIN_LEN, IBV_ACCESS_REMOTE_READ, 8);
  expect_bind(p.tcq, 8, IBV_WC_SUCCESS, "bind after the invalidation");
  CHECK(rdma(&other, IBV_WR_RDMA_READ, rkey, WIN_OFF, 8, 9) == IBV_WC_REM_ACCESS_ERR,
        "a request on another QP must not open a type-2 window");
  free_pair(&other);

  /* 4. Rights: a READ window refuses a WRITE. */
  CHECK(rdma(&p, IBV_WR_RDMA_READ, rkey, WIN_OFF, 8, 10) == IBV_WC_SUCCESS, "READ in a READ window");
  CHECK(rdma(&p, IBV_WR_RDMA_WRITE, rkey, WIN_OFF, 8, 11) == IBV_WC_REM_ACCESS_ERR,
        "a WRITE through a READ window");
  free_pair(&p);

  /* 5. After LOCAL_INV the rkey is dead. */
  p = make_pair();
  post_local_inv(p.t, rkey, 12);
  wc = next_wc(p.tcq, "LOCAL_INV 2");
  CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV, "LOCAL_INV 2");
  rkey = post_bind(p.t, mw, win_mr, WIN_OFF, WIN_LEN, IBV_ACCESS_REMOTE_WRITE, 13);
  expect_bind(p.tcq, 13, IBV_WC_SUCCESS, "bind 3");
  CHECK(rdma(&p, IBV_WR_RDMA_WRITE, rkey, WIN_OFF, 8, 14) == IBV_WC_SUCCESS, "WRITE before LOCAL_INV");
  post_local_inv(p.t, rkey, 15);
  wc = next_wc(p.tcq, "LOCAL_INV 3");
  CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV, "LOCAL_INV 3");
  CHECK(rdma(&p, IBV_WR_RDMA_WRITE, rkey, WIN_OFF, 8, 16) == IBV_WC_REM_ACCESS_ERR,
        "a WRITE through an invalidated window");
  free_pair(&p);

  /* 6. Bind errors complete with IBV_WC_MW_BIND_ERR and end the QP: a region without
   * MW_BIND, a range outside the region. */
  p = make_pair();
  post_bind(p.t, mw, plain_mr, 0, 64, IBV_ACCESS_REMOTE_READ, 17);
  expect_bind(p.tcq, 17, IBV_WC_MW_BIND_ERR, "bind over a region without MW_BIND");
  {
    struct ibv_sge sge = {.addr = (uintptr_t)src_buf, .length = 8, .lkey = src_mr->lkey};
    struct ibv_send_wr w, *bad = NULL;
    memset(&w, 0, sizeof w);
    w.wr_id = 18;
    w.sg_list = &sge;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    CHECK(ibv_post_send(p.t, &w, &bad) == 0, "post after the bind error");
    wc = next_wc(p.tcq, "after the bind error");
    CHECK(wc.wr_id == 18 && wc.status == IBV_WC_WR_FLUSH_ERR,
          "a WR after a bind error: status %s, want a flush", ibv_wc_status_str(wc.status));
  }
  free_pair(&p);
  p = make_pair();
  post_bind(p.t, mw, win_mr, sizeof win_buf - 512, 1024, IBV_ACCESS_REMOTE_READ, 19);
  expect_bind(p.tcq, 19, IBV_WC_MW_BIND_ERR, "bind past the region's end");
  free_pair(&p);

  /* 7. A bind takes its turn after the WRs posted before it: a SEND waiting for a receive
   * (RNR) holds the bind's completion back. */
  p = make_pair();
  {
    struct ibv_sge sge = {.addr = (uintptr_t)src_buf, .length = 8, .lkey = src_mr->lkey};
    struct ibv_send_wr w, *bad = NULL;
    memset(&w, 0, sizeof w);
    w.wr_id = 20;
    w.sg_list = &sge;
    w.num_sge = 1;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    CHECK(ibv_post_send(p.t, &w, &bad) == 0, "post SEND");
    rkey = post_bind(p.t, mw, win_mr, WIN_OFF, WIN_LEN, IBV_ACCESS_REMOTE_READ, 21);
    no_wc(p.tcq, 200, "the bind completed before the SEND posted ahead of it");
    struct ibv_sge rs = {.addr = (uintptr_t)src_buf + 2048, .length = 64, .lkey = src_mr->lkey};
    struct ibv_recv_wr r, *rbad = NULL;
    memset(&r, 0, sizeof r);
    r.wr_id = 22;
    r.sg_list = &rs;
    r.num_sge = 1;
    CHECK(ibv_post_recv(p.i, &r, &rbad) == 0, "post_recv");
    wc = next_wc(p.tcq, "SEND");
    CHECK(wc.wr_id == 20 && wc.status == IBV_WC_SUCCESS, "the SEND first: wr_id %llu",
          (unsigned long long)wc.wr_id);
    expect_bind(p.tcq, 21, IBV_WC_SUCCESS, "then the bind");
    wc = next_wc(p.rcq, "receive");
    CHECK(wc.wr_id == 22 && wc.status == IBV_WC_SUCCESS, "receive");
  }

  /* 8. Deallocating a bound window ends it; the region may then go. */
  CHECK(ibv_dealloc_mw(mw) == 0, "ibv_dealloc_mw of a bound window");
  CHECK(rdma(&p, IBV_WR_RDMA_READ, rkey, WIN_OFF, 8, 23) == IBV_WC_REM_ACCESS_ERR,
        "a READ through a deallocated window");
  free_pair(&p);

  /* 9. Type 1 (ibv_bind_mw): bound to every QP; unbound by a bind of length 0; a local
   * invalidate may not end it. */
  p = make_pair();
  other = make_pair();
  struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
  CHECK(mw1 != NULL && mw1->type == IBV_MW_TYPE_1, "ibv_alloc_mw(type 1)");
  uint32_t before = mw1->rkey;
  struct ibv_mw_bind b;
  memset(&b, 0, sizeof b);
  b.wr_id = 24;
  b.send_flags = IBV_SEND_SIGNALED;
  b.bind_info.mr = win_mr;
  b.bind_info.addr = (uintptr_t)win_buf + WIN_OFF;
  b.bind_info.length = WIN_LEN;
  b.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
  CHECK(ibv_bind_mw(p.t, mw1, &b) == 0, "ibv_bind_mw");
  CHECK(mw1->rkey == ibv_inc_rkey(before), "ibv_bind_mw sets the next key");
  expect_bind(p.tcq, 24, IBV_WC_SUCCESS, "type-1 bind");
  CHECK(rdma(&p, IBV_WR_RDMA_READ, mw1->rkey, WIN_OFF, 8, 25) == IBV_WC_SUCCESS, "type-1 READ");
  CHECK(rdma(&other, IBV_WR_RDMA_READ, mw1->rkey, WIN_OFF, 8, 26) == IBV_WC_SUCCESS,
        "type-1 READ on another QP");
  b.wr_id = 27;
  b.bind_info.length = 0;
  b.bind_info.mw_access_flags = 0;
  uint32_t bound1 = mw1->rkey;
  CHECK(ibv_bind_mw(p.t, mw1, &b) == 0, "ibv_bind_mw (length 0)");
  expect_bind(p.tcq, 27, IBV_WC_SUCCESS, "type-1 unbind");
  CHECK(rdma(&p, IBV_WR_RDMA_READ, bound1, WIN_OFF, 8, 28) == IBV_WC_REM_ACCESS_ERR,
        "a READ through an unbound type-1 window");
  free_pair(&p);
  b.wr_id = 29;
  b.bind_info.length = WIN_LEN;
  b.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
  CHECK(ibv_bind_mw(other.t, mw1, &b) == 0, "ibv_bind_mw again");
  expect_bind(other.tcq, 29, IBV_WC_SUCCESS, "type-1 bind 2");
  post_local_inv(other.t, mw1->rkey, 30);
  wc = next_wc(other.tcq, "LOCAL_INV of a type-1 window");
  CHECK(wc.wr_id == 30 && wc.status == IBV_WC_LOC_QP_OP_ERR,
        "LOCAL_INV of a type-1 window: %s, want LOC_QP_OP_ERR", ibv_wc_status_str(wc.status));
  free_pair(&other);
  CHECK(ibv_dealloc_mw(mw1) == 0, "ibv_dealloc_mw(type 1)");

  /* 10. SEND_WITH_INV (remote invalidation): the peer's SEND ends the type-2 window bound
   * to the QP it arrives on; the receive completes as IBV_WC_RECV with IBV_WC_WITH_INV and
   * the rkey in invalidated_rkey, the sender's as IBV_WC_SEND; the rkey then opens nothing,
   * and the window may be bound again. An rkey it may not end (a window bound to another
   * QP, a region's rkey) completes the receive with IBV_WC_REM_INV_REQ_ERR (as rxe: the
   * SEND itself is acknowledged) and leaves the window bound. */
  {
    struct ibv_mw *mw3 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    CHECK(mw3 != NULL, "ibv_alloc_mw (SEND_WITH_INV)");
    p = make_pair();
    rkey = post_bind(p.t, mw3, win_mr, WIN_OFF, WIN_LEN,
                     IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ, 31);
    expect_bind(p.tcq, 31, IBV_WC_SUCCESS, "bind (SEND_WITH_INV)");
    CHECK(rdma(&p, IBV_WR_RDMA_WRITE, rkey, WIN_OFF, 8, 32) == IBV_WC_SUCCESS,
          "WRITE before SEND_WITH_INV");
    post_recv_of(p.t, 33);
    post_send_inv(p.i, rkey, 34);
    wc = next_wc(p.icq, "SEND_WITH_INV");
    CHECK(wc.wr_id == 34 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND,
          "SEND_WITH_INV: wr_id %llu status %s opcode %d", (unsigned long long)wc.wr_id,
          ibv_wc_status_str(wc.status), wc.opcode);
    wc = next_wc(p.rcq, "receive of SEND_WITH_INV");
    CHECK(wc.wr_id == 33 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV,
          "receive of SEND_WITH_INV: wr_id %llu status %s opcode %d",
          (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.opcode);
    CHECK((wc.wc_flags & IBV_WC_WITH_INV) && !(wc.wc_flags & IBV_WC_WITH_IMM),
          "receive of SEND_WITH_INV: wc_flags %#x, want IBV_WC_WITH_INV", wc.wc_flags);
    CHECK(wc.invalidated_rkey == rkey && wc.byte_len == 8,
          "receive of SEND_WITH_INV: invalidated_rkey %#x (want %#x), byte_len %u",
          wc.invalidated_rkey, rkey, wc.byte_len);
    CHECK(rdma(&p, IBV_WR_RDMA_WRITE, rkey, WIN_OFF, 8, 35) == IBV_WC_REM_ACCESS_ERR,
          "a WRITE through a remotely invalidated window");
    free_pair(&p);

    other = make_pair();
    p = make_pair();
    rkey = post_bind(p.t, mw3, win_mr, WIN_OFF, WIN_LEN, IBV_ACCESS_REMOTE_READ, 36);
    expect_bind(p.tcq, 36, IBV_WC_SUCCESS, "bind after the remote invalidation");
    uint32_t refused[2] = {rkey, win_mr->rkey};
    const char *why[2] = {"a window bound to another QP", "a region's rkey"};
    for (int k = 0; k < 2; k++) {
      post_recv_of(other.t, 37);
      post_send_inv(other.i, refused[k], 38);
      wc = next_wc(other.icq, "refused SEND_WITH_INV");
      CHECK(wc.wr_id == 38 && wc.status == IBV_WC_SUCCESS,
            "SEND_WITH_INV of %s: the sender's status %s", why[k], ibv_wc_status_str(wc.status));
      wc = next_wc(other.rcq, "receive of a refused SEND_WITH_INV");
      CHECK(wc.wr_id == 37 && wc.status == IBV_WC_REM_INV_REQ_ERR,
            "SEND_WITH_INV of %s: receive status %s, want REM_INV_REQ_ERR", why[k],
            ibv_wc_status_str(wc.status));
      free_pair(&other);
      other = make_pair();
    }
    free_pair(&other);
    CHECK(rdma(&p, IBV_WR_RDMA_READ, rkey, WIN_OFF, 8, 39) == IBV_WC_SUCCESS,
          "the window survives a refused SEND_WITH_INV");
    free_pair(&p);
    CHECK(ibv_dealloc_mw(mw3) == 0, "ibv_dealloc_mw (SEND_WITH_INV)");
  }

  /* 11. In one chain: a bind between two SENDs completes between them; a failing bind
   * in a chain: the SEND before it completes (or is flushed), the bind fails, the SEND
   * after it is flushed, in that order. */
  p = make_pair();
  {
    struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    CHECK(mw2 != NULL, "ibv_alloc_mw (chain)");
    struct ibv_sge sge = {.addr = (uintptr_t)src_buf, .length = 8, .lkey = src_mr->lkey};
    for (int k = 0; k < 2; k++) {
      struct ibv_sge rs = {.addr = (uintptr_t)src_buf + 2048, .length = 64, .lkey = src_mr->lkey};
      struct ibv_recv_wr r, *rbad = NULL;
      memset(&r, 0, sizeof r);
      r.wr_id = 70 + k;
      r.sg_list = &rs;
      r.num_sge = 1;
      CHECK(ibv_post_recv(p.i, &r, &rbad) == 0, "post_recv (chain)");
    }
    struct ibv_send_wr w[3], *bad = NULL;
    memset(w, 0, sizeof w);
    for (int k = 0; k < 3; k++) {
      w[k].wr_id = 50 + k;
      w[k].send_flags = IBV_SEND_SIGNALED;
      w[k].next = k < 2 ? &w[k + 1] : NULL;
    }
    w[0].opcode = IBV_WR_SEND;
    w[0].sg_list = &sge;
    w[0].num_sge = 1;
    w[1].opcode = IBV_WR_BIND_MW;
    w[1].bind_mw.mw = mw2;
    w[1].bind_mw.rkey = ibv_inc_rkey(mw2->rkey);
    w[1].bind_mw.bind_info.mr = win_mr;
    w[1].bind_mw.bind_info.addr = (uintptr_t)win_buf;
    w[1].bind_mw.bind_info.length = 64;
    w[1].bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
    w[2] = w[0];
    w[2].wr_id = 52;
    w[2].next = NULL;
    CHECK(ibv_post_send(p.t, w, &bad) == 0, "post a chain with a bind");
    for (int k = 0; k < 3; k++) {
      wc = next_wc(p.tcq, "chain");
      CHECK(wc.wr_id == (uint64_t)(50 + k) && wc.status == IBV_WC_SUCCESS,
            "chain: completion %d is wr_id %llu status %s", k, (unsigned long long)wc.wr_id,
            ibv_wc_status_str(wc.status));
      CHECK(wc.opcode == (k == 1 ? IBV_WC_BIND_MW : IBV_WC_SEND), "chain: opcode %d", wc.opcode);
    }
    uint32_t k2 = w[1].bind_mw.rkey;
    CHECK(rdma(&p, IBV_WR_RDMA_READ, k2, 0, 8, 53) == IBV_WC_SUCCESS, "READ through the chained bind");
    free_pair(&p);
    p = make_pair();
    w[1].bind_mw.bind_info.mr = plain_mr;
    w[1].bind_mw.bind_info.addr = (uintptr_t)plain_buf;
    w[1].bind_mw.rkey = ibv_inc_rkey(k2);
    CHECK(ibv_post_send(p.t, w, &bad) == 0, "post a chain with a failing bind");
    wc = next_wc(p.tcq, "chain 2: the SEND before");
    CHECK(wc.wr_id == 50 && (wc.status == IBV_WC_SUCCESS || wc.status == IBV_WC_WR_FLUSH_ERR),
          "chain 2: first wr_id %llu status %s", (unsigned long long)wc.wr_id,
          ibv_wc_status_str(wc.status));
    expect_bind(p.tcq, 51, IBV_WC_MW_BIND_ERR, "chain 2: the failing bind");
    wc = next_wc(p.tcq, "chain 2: the SEND after");
    CHECK(wc.wr_id == 52 && wc.status == IBV_WC_WR_FLUSH_ERR,
          "chain 2: last wr_id %llu status %s, want a flush", (unsigned long long)wc.wr_id,
          ibv_wc_status_str(wc.status));
    CHECK(ibv_dealloc_mw(mw2) == 0, "ibv_dealloc_mw (chain)");
  }
  free_pair(&p);

  CHECK(ibv_dereg_mr(win_mr) == 0 && ibv_dereg_mr(src_mr) == 0 && ibv_dereg_mr(plain_mr) == 0,
        "ibv_dereg_mr");
  CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
  CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
  printf("ibv_mw: all passed\n");
  return 0;
}

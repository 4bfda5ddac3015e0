/* ibv_req_notify_cq's contract through unmodified libibverbs (run under `rdmx-ibv exec`;
 * built and run by rdmx-ibv/tests/ibv_programs.rs): an arming is for the next completion
 * added after it, never for completions already queued; solicited_only = 1 signals for a
 * solicited receive or an error completion only; one channel record per arming.
 *
 * One process, two RC QPs of the one device connected to each other (both on the
 * process's address, GID index 0). Exit 0 when every step held. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                 \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "ibv_notify: %s:%d: ", __FILE__, __LINE__);        \
      fprintf(stderr, __VA_ARGS__);                                      \
      fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));      \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

#include "qp_pair.h"

/* How both QPs are made and connected. */
static const struct qp_opts opts = {
    .depth = 8, .access = IBV_ACCESS_REMOTE_WRITE, .rd_atomic = 1, .min_rnr_timer = 12};

static struct ibv_comp_channel *ch;
static struct ibv_cq *scq, *rcq;
static struct ibv_mr *mr;
static char buf[4096];

/* Whether the channel gets a record within ms milliseconds. */
static int record_within(int ms) {
  struct pollfd p = {.fd = ch->fd, .events = POLLIN, .revents = 0};
  return poll(&p, 1, ms) == 1;
}

/* Reads one record, which must name `want`, and acknowledges it. */
static void take_record(struct ibv_cq *want, const char *what) {
  CHECK(record_within(5000), "no channel record for %s within 5 s", what);
  struct ibv_cq *cq = NULL;
  void *ctx = NULL;
  CHECK(ibv_get_cq_event(ch, &cq, &ctx) == 0, "ibv_get_cq_event (%s)", what);
  CHECK(cq == want, "the record for %s names another CQ", what);
  ibv_ack_cq_events(cq, 1);
}

/* Polls `cq` until `n` completions came (5 s at most); returns the last one's status. */
static int poll_n(struct ibv_cq *cq, int n, const char *what) {
  struct ibv_wc wc;
  int got = 0, status = -1;
  for (long spins = 0; got < n; spins++) {
    CHECK(spins < 50000000L, "%s: %d of %d completions", what, got, n);
    int r = ibv_poll_cq(cq, 1, &wc);
    CHECK(r >= 0, "ibv_poll_cq");
    if (r == 1) {
      got++;
      status = (int)wc.status;
    }
  }
  return status;
}

static void post_recv(struct ibv_qp *qp, uint64_t id) {
  struct ibv_sge sge = {.addr = (uintptr_t)buf + 2048, .length = 64, .lkey = mr->lkey};
  struct ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  CHECK(ibv_post_recv(qp, &wr, &bad) == 0, "ibv_post_recv");
}

static void post_send(struct ibv_qp *qp, uint64_t id, unsigned flags) {
  struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | flags;
  CHECK(ibv_post_send(qp, &wr, &bad) == 0, "ibv_post_send");
}

int main(void) {
  struct ibv_context *ctx = qp_pair_open_device();
  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  CHECK(pd != NULL, "ibv_alloc_pd");
  ch = ibv_create_comp_channel(ctx);
  CHECK(ch != NULL, "ibv_create_comp_channel");
  scq = ibv_create_cq(ctx, 64, NULL, ch, 0);
  rcq = ibv_create_cq(ctx, 64, NULL, ch, 0);
  CHECK(scq != NULL && rcq != NULL, "ibv_create_cq");
  mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  CHECK(mr != NULL, "ibv_reg_mr");
  union ibv_gid gid;
  CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "ibv_query_gid");
  struct ibv_qp *a = qp_pair_make(pd, scq, rcq, &opts), *b = qp_pair_make(pd, scq, rcq, &opts);
  qp_pair_connect_both(a, b, &gid, &opts);

  /* 1. A completion queued before the arming raises no event; the next new one does. */
  post_recv(b, 1);
  post_send(a, 1, 0);
  CHECK(poll_n(scq, 1, "send 1") == IBV_WC_SUCCESS, "send 1 failed");
  /* b's receive completion is now queued in rcq (acknowledged: b received it). */
  CHECK(ibv_req_notify_cq(rcq, 0) == 0, "ibv_req_notify_cq");
  CHECK(!record_within(300), "an event for a completion queued before the arming");
  post_recv(b, 2);
  post_send(a, 2, 0);
  take_record(rcq, "the receive after the arming");
  CHECK(poll_n(rcq, 2, "receives 1 and 2") == IBV_WC_SUCCESS, "receive failed");
  CHECK(poll_n(scq, 1, "send 2") == IBV_WC_SUCCESS, "send 2 failed");
  CHECK(!record_within(300), "two events for one arming");

  /* 2. Solicited only: an unsolicited receive raises nothing, a solicited one does. */
  CHECK(ibv_req_notify_cq(rcq, 1) == 0, "ibv_req_notify_cq(solicited)");
  post_recv(b, 3);
  post_send(a, 3, 0);
  CHECK(poll_n(rcq, 1, "receive 3") == IBV_WC_SUCCESS, "receive 3 failed");
  CHECK(!record_within(300), "an event for an unsolicited receive (solicited_only)");
  post_recv(b, 4);
  post_send(a, 4, IBV_SEND_SOLICITED);
  take_record(rcq, "the solicited receive");
  CHECK(poll_n(rcq, 1, "receive 4") == IBV_WC_SUCCESS, "receive 4 failed");
  CHECK(poll_n(scq, 2, "sends 3 and 4") == IBV_WC_SUCCESS, "sends failed");

  /* 3. Solicited only: an error completion raises it (a receive flushed by ERR). */
  CHECK(ibv_req_notify_cq(rcq, 1) == 0, "ibv_req_notify_cq(solicited)");
  post_recv(b, 5);
  struct ibv_qp_attr e;
  memset(&e, 0, sizeof e);
  e.qp_state = IBV_QPS_ERR;
  CHECK(ibv_modify_qp(b, &e, IBV_QP_STATE) == 0, "modify to ERR");
  take_record(rcq, "the flushed receive");
  CHECK(poll_n(rcq, 1, "flush") == IBV_WC_WR_FLUSH_ERR, "want a flush error");

  CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "ibv_destroy_qp");
  CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
  CHECK(ibv_destroy_cq(scq) == 0 && ibv_destroy_cq(rcq) == 0, "ibv_destroy_cq");
  CHECK(ibv_destroy_comp_channel(ch) == 0, "ibv_destroy_comp_channel");
  CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
  CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
  printf("ibv_notify: all passed\n");
  return 0;
}

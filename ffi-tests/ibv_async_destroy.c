/* An unmodified-libibverbs consumer of rdmx's device (run under `rdmx-ibv exec`): event
 * records that name an object the application has already destroyed.
 *
 * A QP on an SRQ raises IBV_EVENT_QP_LAST_WQE_REACHED when it enters ERR, and an armed CQ
 * with a completion channel gets a channel record at its next completion. Here both
 * objects are destroyed before their records are read, new objects are made (so a freed
 * address would be reused), and only then are the records read and acknowledged, through
 * libibverbs' own ibv_get_async_event/ibv_ack_async_event and
 * ibv_get_cq_event/ibv_ack_cq_events, which read and write the named object. The provider
 * must keep that memory until the acks: under valgrind any access to freed memory is an
 * error (libibverbs is not instrumented for ASan; the reads below are).
 *
 * Exit 0 when every step held. */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "ibv_async_destroy: %s:%d: ", __FILE__, __LINE__);     \
      fprintf(stderr, __VA_ARGS__);                                          \
      fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));          \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_srq *srq) {
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.srq = srq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 4;
  ia.cap.max_recv_wr = srq ? 0 : 4;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  struct ibv_qp *qp = ibv_create_qp(pd, &ia);
  CHECK(qp != NULL, "ibv_create_qp");
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_READ;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                  IBV_QP_ACCESS_FLAGS) == 0,
        "modify to INIT");
  return qp;
}

static void to_err(struct ibv_qp *qp) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_ERR;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "modify to ERR");
}

/* Waits up to 5 s for fd to be readable. */
static void wait_readable(int fd, const char *what) {
  struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
  CHECK(poll(&p, 1, 5000) == 1, "no %s within 5 s", what);
}

int main(void) {
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  CHECK(list != NULL && n > 0, "no RDMA device (run under rdmx-ibv exec)");
  struct ibv_context *ctx = ibv_open_device(list[0]);
  CHECK(ctx != NULL, "ibv_open_device");
  ibv_free_device_list(list);
  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  CHECK(pd != NULL, "ibv_alloc_pd");
  struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
  CHECK(ch != NULL, "ibv_create_comp_channel");
  int cq_tag = 0;
  struct ibv_cq *cq = ibv_create_cq(ctx, 16, &cq_tag, ch, 0);
  CHECK(cq != NULL, "ibv_create_cq");
  struct ibv_cq *cq2 = ibv_create_cq(ctx, 16, NULL, NULL, 0);
  CHECK(cq2 != NULL, "ibv_create_cq (2)");
  struct ibv_srq_init_attr sa;
  memset(&sa, 0, sizeof sa);
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  struct ibv_srq *srq = ibv_create_srq(pd, &sa);
  CHECK(srq != NULL, "ibv_create_srq");

  /* 1. LAST_WQE_REACHED about a QP destroyed before the event is read. */
  struct ibv_qp *qp = make_qp(pd, cq2, srq);
  uint32_t qpn = qp->qp_num;
  to_err(qp);
  wait_readable(ctx->async_fd, "async event");
  CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp with an unread event");
  /* New QPs while the record waits: a freed address would be handed out again. */
  struct ibv_qp *others[8];
  for (int i = 0; i < 8; i++) others[i] = make_qp(pd, cq2, srq);
  struct ibv_async_event ev;
  CHECK(ibv_get_async_event(ctx, &ev) == 0, "ibv_get_async_event");
  CHECK(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED, "event %d, want LAST_WQE_REACHED",
        (int)ev.event_type);
  CHECK(ev.element.qp == qp, "the event names another QP");
  CHECK(ev.element.qp->qp_num == qpn, "the destroyed QP's memory changed: qp_num %u, want %u",
        ev.element.qp->qp_num, qpn);
  ibv_ack_async_event(&ev);
  for (int i = 0; i < 8; i++) CHECK(ibv_destroy_qp(others[i]) == 0, "ibv_destroy_qp");

  /* 2. A completion channel record about a CQ destroyed before the record is read: an
   * armed CQ, a receive flushed into it (a QP of its own receive queue, moved to ERR). */
  CHECK(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");
  struct ibv_qp *rq = make_qp(pd, cq, NULL);
  static char buf[64];
  struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  CHECK(mr != NULL, "ibv_reg_mr");
  struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = sizeof buf, .lkey = mr->lkey};
  struct ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 42;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  CHECK(ibv_post_recv(rq, &wr, &bad) == 0, "ibv_post_recv");
  to_err(rq);
  wait_readable(ch->fd, "completion channel record");
  struct ibv_wc wc;
  CHECK(ibv_poll_cq(cq, 1, &wc) == 1, "the flushed receive");
  CHECK(wc.wr_id == 42 && wc.status == IBV_WC_WR_FLUSH_ERR, "wr_id %llu status %d",
        (unsigned long long)wc.wr_id, (int)wc.status);
  CHECK(ibv_destroy_qp(rq) == 0, "ibv_destroy_qp");
  CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
  CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq with an unread channel record");
  struct ibv_cq *cqs[8];
  for (int i = 0; i < 8; i++) {
    cqs[i] = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    CHECK(cqs[i] != NULL, "ibv_create_cq");
  }
  struct ibv_cq *ev_cq = NULL;
  void *ev_ctx = NULL;
  CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0, "ibv_get_cq_event");
  CHECK(ev_cq == cq && ev_ctx == &cq_tag, "the record names another CQ (%p/%p)",
        (void *)ev_cq, ev_ctx);
  ibv_ack_cq_events(ev_cq, 1);
  for (int i = 0; i < 8; i++) CHECK(ibv_destroy_cq(cqs[i]) == 0, "ibv_destroy_cq");

  /* 3. An event never read: destroy does not wait for it, and closing the device frees
   * what was kept (valgrind's leak check). */
  struct ibv_qp *last = make_qp(pd, cq2, srq);
  to_err(last);
  wait_readable(ctx->async_fd, "async event");
  CHECK(ibv_destroy_qp(last) == 0, "ibv_destroy_qp with an event never read");

  CHECK(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
  CHECK(ibv_destroy_cq(cq2) == 0, "ibv_destroy_cq");
  CHECK(ibv_destroy_comp_channel(ch) == 0, "ibv_destroy_comp_channel");
  CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
  CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
  printf("ibv_async_destroy: ok\n");
  return 0;
}

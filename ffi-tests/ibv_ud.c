/* An unmodified-libibverbs consumer of rdmx's device (run under `rdmx-ibv exec`): UD QPs
 * through the C API. Two UD QPs of one context; A sends to B through an address handle
 * made from the port's GID 0 (its own address), inline and from registered memory:
 *   - ibv_create_ah without a GRH fails with EINVAL (RoCE needs one);
 *   - B's completion: IBV_WC_RECV, byte_len = 40 + length, src_qp = A's QPN,
 *     IBV_WC_GRH (and WITH_IMM with the immediate), the payload 40 bytes into the buffer,
 *     the GRH area's IPv4 header (RoCEv2) naming the address in its last 8 bytes;
 *   - a message of the port's active MTU passes, one byte more is refused at post
 *     (EINVAL, bad_wr set): UD does not segment;
 *   - ibv_query_qp reports the Q_Key;
 *   - ibv_attach_mcast answers EOPNOTSUPP (multicast is not implemented);
 *   - ibv_dealloc_pd is EBUSY while an AH uses the PD.
 * Exit 0 when every step held. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>

#define CHECK(cond, ...)                                                 \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "ibv_ud: %s:%d: ", __FILE__, __LINE__);            \
      fprintf(stderr, __VA_ARGS__);                                      \
      fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));      \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

#define QKEY 0x11111111u
#define BUF 16384

static struct ibv_qp *make_ud(struct ibv_pd *pd, struct ibv_cq *cq) {
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_UD;
  ia.cap.max_send_wr = 8;
  ia.cap.max_recv_wr = 8;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  ia.cap.max_inline_data = 64;
  struct ibv_qp *qp = ibv_create_qp(pd, &ia);
  CHECK(qp != NULL, "ibv_create_qp(IBV_QPT_UD)");
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = QKEY;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0,
        "INIT");
  a.qp_state = IBV_QPS_RTR;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "RTR");
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 1;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "RTS");
  return qp;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

/* The next completion, polled for at most 10 s. */
static struct ibv_wc next_wc(struct ibv_cq *cq) {
  struct ibv_wc wc;
  double end = now() + 10;
  while (now() < end) {
    int n = ibv_poll_cq(cq, 1, &wc);
    CHECK(n >= 0, "ibv_poll_cq");
    if (n == 1) return wc;
  }
  CHECK(0, "no completion within 10 s");
  return wc;
}

int main(void) {
  int num;
  struct ibv_device **list = ibv_get_device_list(&num);
  CHECK(list && num > 0, "no device");
  struct ibv_context *ctx = ibv_open_device(list[0]);
  CHECK(ctx, "ibv_open_device");
  struct ibv_port_attr port;
  CHECK(ibv_query_port(ctx, 1, &port) == 0, "ibv_query_port");
  int mtu = 128 << port.active_mtu;
  union ibv_gid gid;
  CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "ibv_query_gid");
  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  CHECK(pd, "ibv_alloc_pd");
  static char buf[BUF];
  struct ibv_mr *mr = ibv_reg_mr(pd, buf, BUF, IBV_ACCESS_LOCAL_WRITE);
  CHECK(mr, "ibv_reg_mr");
  struct ibv_cq *scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
  struct ibv_cq *rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
  CHECK(scq && rcq, "ibv_create_cq");
  struct ibv_qp *a = make_ud(pd, scq), *b = make_ud(pd, rcq);

  struct ibv_ah_attr aa;
  memset(&aa, 0, sizeof aa);
  aa.port_num = 1;
  errno = 0;
  CHECK(ibv_create_ah(pd, &aa) == NULL && errno == EINVAL, "an AH without a GRH must be EINVAL");
  aa.is_global = 1;
  aa.grh.dgid = gid;
  aa.grh.sgid_index = 0;
  aa.grh.hop_limit = 64;
  struct ibv_ah *ah = ibv_create_ah(pd, &aa);
  CHECK(ah, "ibv_create_ah");

  /* Inline SEND_WITH_IMM of 5 bytes. */
  struct ibv_sge rs = {(uintptr_t)buf, 40 + 64, mr->lkey};
  struct ibv_recv_wr rw = {.wr_id = 1, .sg_list = &rs, .num_sge = 1}, *bad_r;
  CHECK(ibv_post_recv(b, &rw, &bad_r) == 0, "ibv_post_recv");
  char msg[] = "hello";
  struct ibv_sge ss = {(uintptr_t)msg, 5, 0};
  struct ibv_send_wr sw, *bad_s;
  memset(&sw, 0, sizeof sw);
  sw.wr_id = 2;
  sw.sg_list = &ss;
  sw.num_sge = 1;
  sw.opcode = IBV_WR_SEND_WITH_IMM;
  sw.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  sw.imm_data = htonl(0xabcd);
  sw.wr.ud.ah = ah;
  sw.wr.ud.remote_qpn = b->qp_num;
  sw.wr.ud.remote_qkey = QKEY;
  CHECK(ibv_post_send(a, &sw, &bad_s) == 0, "ibv_post_send inline");
  struct ibv_wc wc = next_wc(scq);
  CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 2 && wc.opcode == IBV_WC_SEND, "send wc");
  wc = next_wc(rcq);
  CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1 && wc.opcode == IBV_WC_RECV, "recv wc %d",
        wc.status);
  CHECK(wc.byte_len == 45, "byte_len %u", wc.byte_len);
  CHECK(wc.src_qp == a->qp_num, "src_qp %#x, A is %#x", wc.src_qp, a->qp_num);
  CHECK(wc.qp_num == b->qp_num, "qp_num");
  CHECK((wc.wc_flags & IBV_WC_GRH) && (wc.wc_flags & IBV_WC_WITH_IMM), "wc_flags %#x",
        wc.wc_flags);
  CHECK(ntohl(wc.imm_data) == 0xabcd, "imm_data");
  CHECK(memcmp(buf + 40, "hello", 5) == 0, "payload after the GRH");
  CHECK(buf[20] == 0x45 && memcmp(buf + 32, &gid.raw[12], 4) == 0 &&
            memcmp(buf + 36, &gid.raw[12], 4) == 0,
        "GRH area: IPv4 header with the addresses");

  /* An MTU-sized message from registered memory passes; one byte more is refused. */
  rs.length = 40 + mtu;
  CHECK(ibv_post_recv(b, &rw, &bad_r) == 0, "ibv_post_recv");
  for (int i = 0; i < mtu + 1; i++) buf[8192 + i] = (char)(i * 7);
  ss.addr = (uintptr_t)(buf + 8192);
  ss.length = mtu + 1;
  ss.lkey = mr->lkey;
  sw.opcode = IBV_WR_SEND;
  sw.send_flags = IBV_SEND_SIGNALED;
  bad_s = NULL;
  CHECK(ibv_post_send(a, &sw, &bad_s) == EINVAL && bad_s == &sw,
        "a message above the MTU (%d) must be refused with EINVAL", mtu);
  ss.length = mtu;
  CHECK(ibv_post_send(a, &sw, &bad_s) == 0, "an MTU-sized send");
  CHECK(next_wc(scq).status == IBV_WC_SUCCESS, "send wc");
  wc = next_wc(rcq);
  CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == (uint32_t)(40 + mtu), "MTU recv %u",
        wc.byte_len);
  CHECK(memcmp(buf + 40, buf + 8192, mtu) == 0, "MTU payload");

  struct ibv_qp_attr qa;
  struct ibv_qp_init_attr qia;
  CHECK(ibv_query_qp(b, &qa, IBV_QP_QKEY | IBV_QP_STATE, &qia) == 0, "ibv_query_qp");
  CHECK(qa.qkey == QKEY && qa.qp_state == IBV_QPS_RTS && qia.qp_type == IBV_QPT_UD, "query_qp");

  union ibv_gid mgid;
  memset(&mgid, 0, sizeof mgid);
  mgid.raw[0] = 0xff;
  CHECK(ibv_attach_mcast(b, &mgid, 0) == EOPNOTSUPP, "ibv_attach_mcast must be EOPNOTSUPP");

  CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "ibv_destroy_qp");
  CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc_pd with an AH and an MR must be EBUSY");
  CHECK(ibv_destroy_ah(ah) == 0, "ibv_destroy_ah");
  CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
  CHECK(ibv_destroy_cq(scq) == 0 && ibv_destroy_cq(rcq) == 0, "ibv_destroy_cq");
  CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
  CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
  ibv_free_device_list(list);
  printf("ibv_ud: all passed (MTU %d)\n", mtu);
  return 0;
}

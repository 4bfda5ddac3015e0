/* The RC QP bring-up the C test programs share (ibv_mw.c, ibv_notify.c): open the first
 * device, create an RC QP, and connect it INIT -> RTR -> RTS to a QP of the same device
 * (both on the process's address, GID index 0, port 1). What differs between the programs
 * (queue depth, access rights, rd_atomic, the RNR timer) is a parameter.
 *
 * Header-only (static inline: a program that leaves a function unused gets no warning
 * under -Wall -Wextra -Werror). The including file defines CHECK(cond, ...) first: it
 * reports a failed step in the program's own name and exits. */
#ifndef RDMX_QP_PAIR_H
#define RDMX_QP_PAIR_H

#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

#ifndef CHECK
#error "define CHECK(cond, ...) before including qp_pair.h"
#endif

/* How a program's QPs are made and connected. */
struct qp_opts {
  uint32_t depth;           /* max_send_wr and max_recv_wr */
  unsigned access;          /* qp_access_flags at INIT */
  uint8_t rd_atomic;        /* max_dest_rd_atomic (RTR) and max_rd_atomic (RTS) */
  uint8_t min_rnr_timer;    /* RTR */
};

/* The first RDMA device, opened (under `rdmx-ibv exec`: rdmx0). */
static inline struct ibv_context *qp_pair_open_device(void) {
  int n = 0;
  struct ibv_device **list = ibv_get_device_list(&n);
  CHECK(list != NULL && n > 0, "no RDMA device (run under rdmx-ibv exec)");
  struct ibv_context *ctx = ibv_open_device(list[0]);
  CHECK(ctx != NULL, "ibv_open_device");
  ibv_free_device_list(list);
  return ctx;
}

/* An RC QP of `pd` on `scq`/`rcq`, one SGE per WR, `o->depth` WRs per queue. */
static inline struct ibv_qp *qp_pair_make(struct ibv_pd *pd, struct ibv_cq *scq,
                                          struct ibv_cq *rcq, const struct qp_opts *o) {
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof ia);
  ia.send_cq = scq;
  ia.recv_cq = rcq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = o->depth;
  ia.cap.max_recv_wr = o->depth;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  struct ibv_qp *qp = ibv_create_qp(pd, &ia);
  CHECK(qp != NULL, "ibv_create_qp");
  return qp;
}

/* Takes `qp` INIT -> RTR -> RTS towards QP `dest` at `gid` (PSNs 1, MTU 1024). */
static inline void qp_pair_connect(struct ibv_qp *qp, uint32_t dest, const union ibv_gid *gid,
                                   const struct qp_opts *o) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = o->access;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                  IBV_QP_ACCESS_FLAGS) == 0,
        "INIT");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest;
  a.rq_psn = 1;
  a.max_dest_rd_atomic = o->rd_atomic;
  a.min_rnr_timer = o->min_rnr_timer;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = *gid;
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.port_num = 1;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                  IBV_QP_MIN_RNR_TIMER) == 0,
        "RTR");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 1;
  a.max_rd_atomic = o->rd_atomic;
  CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
        "RTS");
}

/* Connects `a` and `b` to each other (a first, then b). */
static inline void qp_pair_connect_both(struct ibv_qp *a, struct ibv_qp *b,
                                        const union ibv_gid *gid, const struct qp_opts *o) {
  qp_pair_connect(a, b->qp_num, gid, o);
  qp_pair_connect(b, a->qp_num, gid, o);
}

#endif

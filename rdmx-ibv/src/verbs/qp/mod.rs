//! RC queue pairs: creation with CQs and an optional SRQ, `modify` through verbs' state
//! machine (RESET -> INIT -> RTR -> RTS, -> ERR, -> RESET) with the peer's address taken
//! from the AV's GID at RTR, `query`, posting, and the operator's `qp_override`.

mod attr;

pub use attr::{AhAttr, QpAttr, mtu_from_ibv, mtu_to_ibv, qp_state_from_ibv};

use rdmx::error::{Error, Result};
use rdmx::rc::{QpState, SgeList, WrOpcode};
use std::sync::Arc;

use super::cq::Cq;
use super::pd::Pd;
use super::srq::Srq;

/// `struct ibv_qp_cap`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (RC).
#[derive(Debug, Clone)]
pub struct InitAttr {
    pub send_cq: Arc<Cq>,
    pub recv_cq: Arc<Cq>,
    /// Receives come from this SRQ (`cap.max_recv_wr`/`max_recv_sge` are then ignored and
    /// `post_recv` on the QP is refused, as verbs).
    pub srq: Option<Arc<Srq>>,
    pub cap: QpCap,
    /// Every send WR completes with a completion (else only IBV_SEND_SIGNALED ones do).
    pub sq_sig_all: bool,
    /// `enum ibv_qp_type`: only [`super::QPT_RC`] (2); others are Unsupported.
    pub qp_type: u32,
}

/// `struct ibv_send_wr` (one WR; the glue walks the `next` chain into a slice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    /// `enum ibv_send_flags`: SIGNALED 2, SOLICITED 4, INLINE 8 (FENCE 1 is accepted: the
    /// engine executes in order anyway).
    pub send_flags: u32,
    pub sg_list: SgeList,
    /// `__be32 imm_data` as it lies in memory (SEND_WITH_IMM, RDMA_WRITE_WITH_IMM).
    pub imm_data: u32,
    /// `wr.rdma.remote_addr` / `wr.rdma.rkey` (RDMA READ/WRITE).
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `struct ibv_recv_wr` (one WR).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sg_list: SgeList,
}

/// An RC queue pair (`ibv_create_qp`).
#[derive(Debug)]
pub struct Qp {
    pd: Arc<Pd>,
    handle: u64,
}

impl Qp {
    /// An RC QP in RESET on `pd`'s device with a QP number the device picks (random,
    /// never 0/1, unique in the device); `handle` names it (`struct ibv_qp *`). The caps
    /// are checked against the device limits (InvalidArgument); `cap.max_inline_data` is
    /// at most the device's (1024) and a buffer of `(max_send_wr + 1) x max_inline_data`
    /// bytes is registered for inline sends. `query` reports the caps granted.
    pub fn new(pd: &Arc<Pd>, init: &InitAttr, handle: u64) -> Result<Arc<Qp>> {
        let _ = (pd, init, handle);
        todo!()
    }

    pub fn handle(&self) -> u64 {
        self.handle
    }

    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        todo!()
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        todo!()
    }

    /// `ibv_modify_qp` with `mask` of `enum ibv_qp_attr_mask` bits. Transitions and
    /// required/optional masks as verbs for RC (RESET->INIT: STATE|PKEY_INDEX|PORT|
    /// ACCESS_FLAGS; INIT->RTR: STATE|AV|PATH_MTU|DEST_QPN|RQ_PSN|MAX_DEST_RD_ATOMIC|
    /// MIN_RNR_TIMER; RTR->RTS: STATE|SQ_PSN|MAX_QP_RD_ATOMIC|RETRY_CNT|RNR_RETRY|TIMEOUT;
    /// any -> ERR or RESET). CUR_STATE is checked against the current state; SQD/SQE,
    /// alternate paths and unknown bits are refused. At RTR the AV's `dgid` gives the
    /// peer's IP (IPv4-mapped -> IPv4), its UDP port is `soft_port`; `sgid_index` must be
    /// 0; `path_mtu` above the route's active MTU is lowered (logged). Attributes listed in
    /// the config's `qp_override` are replaced by the config's values (logged once per QP
    /// and attribute, counted). On error nothing changes.
    pub fn modify(&self, attr: &QpAttr, mask: u32) -> Result<()> {
        let _ = (attr, mask);
        todo!()
    }

    /// `ibv_query_qp`: the current attributes (the whole struct is filled, `mask` is
    /// accepted for verbs' sake) including `cur_qp_state` and the granted caps, and the
    /// init attributes.
    pub fn query(&self, mask: u32) -> (QpAttr, InitAttr) {
        let _ = mask;
        todo!()
    }

    /// `ibv_post_send`: posts in order; on the first refusal returns its index (`bad_wr`)
    /// and why (InvalidArgument: not in RTS (or ERR, where WRs complete at once with
    /// WR_FLUSH_ERR), too many SGEs, inline data above `max_inline_data`, an opcode
    /// needing a field it lacks; Full: `max_send_wr` outstanding). Signaled completions
    /// per `sq_sig_all` or IBV_SEND_SIGNALED; errors always complete. INLINE data is
    /// copied during the call (the SGEs' lkeys are then ignored, as verbs).
    ///
    /// # Safety
    /// For WRs with IBV_SEND_INLINE, each SGE's `[addr, addr + length)` must be readable
    /// for the duration of the call. Other SGEs are not dereferenced here (the engine
    /// reaches them through their memory regions).
    pub unsafe fn post_send(&self, wrs: &[SendWr]) -> std::result::Result<(), (usize, Error)> {
        let _ = wrs;
        todo!()
    }

    /// `ibv_post_recv`: as `post_send` (refused in RESET, and on a QP with an SRQ).
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), (usize, Error)> {
        let _ = wrs;
        todo!()
    }

    /// Attributes of this QP that `qp_override` replaced so far.
    pub fn overrides(&self) -> u64 {
        todo!()
    }

    /// `ibv_destroy_qp`: the QP leaves the device (its packets are dropped from now on);
    /// outstanding WRs are discarded without completions, as verbs.
    pub fn destroy(&self) -> Result<()> {
        todo!()
    }
}

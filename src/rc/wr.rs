//! Work requests in and completions out, shaped like `ibv_send_wr`, `ibv_recv_wr` and
//! `ibv_wc`.

use super::memory::SgeList;
use super::verbs::{WcOpcode, WcStatus, WrOpcode};

/// A send-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    /// `send_flags` bits (`verbs::send_flags`).
    pub flags: u32,
    /// Local buffers: gathered for SEND/WRITE, scattered into for READ.
    pub sges: SgeList,
    /// Remote address and key for RDMA READ/WRITE.
    pub remote_addr: u64,
    pub rkey: u32,
    /// Immediate data (SEND_WITH_IMM, RDMA_WRITE_WITH_IMM), in network order as on the wire;
    /// for SEND_WITH_INV the rkey the responder is to invalidate (host order: verbs' union
    /// of `imm_data` and `invalidate_rkey`).
    pub imm: u32,
}

/// A receive-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sges: SgeList,
}

/// A work completion (`ibv_wc`). For statuses other than Success only `wr_id`, `status`
/// and `qp_num` are meaningful, as in verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    /// The immediate data (WITH_IMM), or for [`WcOpcode::RecvWithInv`] the rkey the SEND
    /// invalidated (verbs' union of `imm_data` and `invalidated_rkey`).
    pub imm: Option<u32>,
    pub qp_num: u32,
    /// True for receive-queue completions (they go to the receive CQ).
    pub is_recv: bool,
    /// A receive completion of a message whose last packet had the Solicited Event bit
    /// (the sender's IBV_SEND_SOLICITED): what `ibv_req_notify_cq(solicited_only)` waits
    /// for.
    pub solicited: bool,
}

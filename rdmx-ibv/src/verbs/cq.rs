//! Completion channels and completion queues.
//!
//! A [`CompChannel`] is a pipe: on an armed CQ's next completion (or next solicited one,
//! or error one, with `solicited_only`) the CQ's 8-byte handle is written to it, which is
//! the `struct ib_uverbs_comp_event_desc { u64 cq_handle; }` libibverbs' `ibv_get_cq_event`
//! reads and casts to `struct ibv_cq *`. One event per arm, as verbs.

use rdmx::error::Result;
use rdmx::provider::soft::cq::Cq as SoftCq;
use std::os::fd::RawFd;
use std::sync::Arc;

use super::device::Device;
use super::sys::RecordPipe;

/// A completion channel (`ibv_create_comp_channel`).
#[derive(Debug)]
pub struct CompChannel {
    pipe: RecordPipe,
}

impl CompChannel {
    pub fn new() -> Result<Arc<CompChannel>> {
        todo!()
    }

    /// The read end (`ibv_comp_channel.fd`): 8-byte CQ handles.
    pub fn fd(&self) -> RawFd {
        self.pipe.read_fd()
    }

    /// `ibv_destroy_comp_channel`: Busy while CQs use it.
    pub fn destroy(&self) -> Result<()> {
        todo!()
    }
}

/// One work completion, the fields of `struct ibv_wc` in verbs numbering.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    /// `enum ibv_wc_status`.
    pub status: u32,
    /// `enum ibv_wc_opcode` (RECV 128, RECV_RDMA_WITH_IMM 129). Meaningful only for
    /// successful completions, as verbs (set anyway where known).
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `__be32 imm_data` as it lies in memory (the wire bytes, native-read), valid with
    /// `wc_flags & WITH_IMM`.
    pub imm_data: u32,
    pub qp_num: u32,
    /// The peer QP's number (RC: the QP's dest_qp_num).
    pub src_qp: u32,
    /// `enum ibv_wc_flags` (WITH_IMM = 2).
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// A completion queue (`ibv_create_cq`).
#[derive(Debug)]
pub struct Cq {
    pub(crate) dev: Arc<Device>,
    pub(crate) soft: Arc<SoftCq>,
    handle: u64,
}

impl Cq {
    /// A CQ of at least `cqe` entries (1..=max_cqe, InvalidArgument otherwise) whose
    /// notifications, when armed, go to `channel`; `handle` names it (`struct ibv_cq *`).
    pub fn new(
        dev: &Arc<Device>,
        cqe: u32,
        channel: Option<Arc<CompChannel>>,
        handle: u64,
    ) -> Result<Arc<Cq>> {
        let _ = (dev, cqe, channel, handle);
        todo!()
    }

    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// The number of entries (`ibv_cq.cqe`).
    pub fn cqe(&self) -> u32 {
        todo!()
    }

    /// `ibv_poll_cq`: moves up to `out.len()` completions into `out`, oldest first; returns
    /// how many. With `progress=inline` a poll first drives the device (receives what
    /// arrived, runs due timers), so a busy-polling application needs no other call.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let _ = out;
        todo!()
    }

    /// `ibv_req_notify_cq`: the next completion added (`solicited_only`: the next
    /// solicited receive completion or error completion) writes this CQ's handle to its
    /// channel, once. Completions already queued at arming signal at once (so a waiter
    /// cannot miss them). InvalidArgument for a CQ without a channel. Tells the device
    /// the application is about to sleep (progress=inline hands receiving to the thread).
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        let _ = solicited_only;
        todo!()
    }

    /// `ibv_destroy_cq`: Busy while QPs use it.
    pub fn destroy(&self) -> Result<()> {
        todo!()
    }
}

//! Shared receive queues. A QP created with an SRQ takes its receive WQEs from it: when a
//! SEND or WRITE_WITH_IMM arrives for the QP and its own receive queue is empty, one WQE
//! moves from the SRQ to the QP before the engine processes the packet (RNR NAK when the
//! SRQ is empty too). Completions go to the QP's receive CQ with the QP's number. When
//! the SRQ's WQE count falls below an armed `srq_limit`, SRQ_LIMIT_REACHED is raised
//! (once per arming, as verbs).

use rdmx::error::Result;
use std::sync::Arc;

use super::pd::Pd;
use super::qp::RecvWr;

/// `enum ibv_srq_attr_mask` bits.
pub mod srq_attr_mask {
    pub const MAX_WR: u32 = 1;
    pub const LIMIT: u32 = 2;
}

/// `struct ibv_srq_attr`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    /// 0 = not armed.
    pub srq_limit: u32,
}

/// A shared receive queue (`ibv_create_srq`).
#[derive(Debug)]
pub struct Srq {
    pd: Arc<Pd>,
    handle: u64,
}

impl Srq {
    /// An SRQ of `attr.max_wr` WQEs of at most `attr.max_sge` SGEs (both 1..=the device
    /// limits, InvalidArgument otherwise), armed at `attr.srq_limit` if non-zero.
    pub fn new(pd: &Arc<Pd>, attr: &SrqAttr, handle: u64) -> Result<Arc<Srq>> {
        let _ = (pd, attr, handle);
        todo!()
    }

    pub fn handle(&self) -> u64 {
        self.handle
    }

    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// `ibv_post_srq_recv`: posts in order; on the first refusal returns its index
    /// (`bad_wr`) and why (Full when `max_wr` WQEs are queued, InvalidArgument for too many
    /// SGEs); the WRs before it are posted.
    pub fn post_recv(
        &self,
        wrs: &[RecvWr],
    ) -> std::result::Result<(), (usize, rdmx::error::Error)> {
        let _ = wrs;
        todo!()
    }

    /// `ibv_modify_srq`: `mask` of [`srq_attr_mask`]: MAX_WR resizes (not below the WQEs
    /// queued: InvalidArgument), LIMIT arms the limit event (0 disarms). As verbs, a limit
    /// above `max_wr` is InvalidArgument.
    pub fn modify(&self, attr: &SrqAttr, mask: u32) -> Result<()> {
        let _ = (attr, mask);
        todo!()
    }

    /// `ibv_query_srq`.
    pub fn query(&self) -> SrqAttr {
        todo!()
    }

    /// `ibv_destroy_srq`: Busy while QPs use it; queued WQEs are dropped (no completions).
    pub fn destroy(&self) -> Result<()> {
        todo!()
    }
}

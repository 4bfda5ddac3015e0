//! Shared receive queues. A QP created with an SRQ takes its receive WQEs from it: when a
//! SEND or WRITE_WITH_IMM arrives for the QP and its own receive queue is empty, one WQE
//! moves from the SRQ to the QP before the engine processes the packet (RNR NAK when the
//! SRQ is empty too). Completions go to the QP's receive CQ with the QP's number. When
//! the SRQ's WQE count falls below an armed `srq_limit`, SRQ_LIMIT_REACHED is raised
//! (once per arming, as verbs).

use rdmx::error::{Error, ErrorKind, Result};
use rdmx::provider::soft::srq::{SoftSrq, SrqWqe};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::device::limits;
use super::events::{EventTally, event_type};
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
    pub(crate) soft: Arc<SoftSrq>,
    /// Async event records written about this SRQ.
    events: Arc<EventTally>,
    /// QPs attached and not destroyed.
    pub(crate) qps: AtomicUsize,
    dead: AtomicBool,
}

impl Srq {
    /// An SRQ of `attr.max_wr` WQEs of at most `attr.max_sge` SGEs (both 1..=the device
    /// limits, InvalidArgument otherwise), armed at `attr.srq_limit` if non-zero.
    pub fn new(pd: &Arc<Pd>, attr: &SrqAttr, handle: u64) -> Result<Arc<Srq>> {
        pd.check_alive()?;
        if attr.max_wr > limits::MAX_QP_WR || attr.max_sge > limits::MAX_SGE {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "create_srq: max_wr {} / max_sge {} exceed the device's {} / {}",
                    attr.max_wr,
                    attr.max_sge,
                    limits::MAX_QP_WR,
                    limits::MAX_SGE
                ),
            ));
        }
        let soft = Arc::new(SoftSrq::new(attr.max_wr, attr.max_sge, attr.srq_limit)?);
        let events = Arc::clone(&pd.dev.events);
        let tally = Arc::new(EventTally::default());
        let t = Arc::clone(&tally);
        soft.set_limit_hook(Box::new(move || {
            t.emit(|| events.raise(handle, event_type::SRQ_LIMIT_REACHED))
        }));
        pd.users.fetch_add(1, Ordering::AcqRel);
        Ok(Arc::new(Srq {
            pd: Arc::clone(pd),
            handle,
            soft,
            events: tally,
            qps: AtomicUsize::new(0),
            dead: AtomicBool::new(false),
        }))
    }

    pub(crate) fn check_alive(&self) -> Result<()> {
        if self.dead.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "shared receive queue already destroyed",
            ));
        }
        Ok(())
    }

    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// Async event records written about this SRQ (each one the application must
    /// acknowledge before the SRQ's memory may go).
    pub fn events_written(&self) -> u64 {
        self.events.written()
    }

    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// `ibv_post_srq_recv`: posts in order; on the first refusal returns its index
    /// (`bad_wr`) and why (Full when `max_wr` WQEs are queued, InvalidArgument for too many
    /// SGEs); the WRs before it are posted.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), (usize, Error)> {
        self.check_alive().map_err(|e| (0, e))?;
        let wqes: Vec<SrqWqe> = wrs.iter().map(|w| (w.wr_id, w.sg_list.clone())).collect();
        match self.soft.post_recv(self.pd.dev.soft.mrs(), &wqes) {
            (_, None) => Ok(()),
            (n, Some(e)) => Err((n, e)),
        }
    }

    /// `ibv_modify_srq`: `mask` of [`srq_attr_mask`]: MAX_WR resizes (not below the WQEs
    /// queued: InvalidArgument), LIMIT arms the limit event (0 disarms). As verbs, a limit
    /// above `max_wr` is InvalidArgument.
    pub fn modify(&self, attr: &SrqAttr, mask: u32) -> Result<()> {
        self.check_alive()?;
        let known = srq_attr_mask::MAX_WR | srq_attr_mask::LIMIT;
        if mask & !known != 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("modify_srq: unknown attr_mask bits {:#x}", mask & !known),
            ));
        }
        if mask & srq_attr_mask::MAX_WR != 0 && attr.max_wr > limits::MAX_QP_WR {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "modify_srq: max_wr {} exceeds the device's {}",
                    attr.max_wr,
                    limits::MAX_QP_WR
                ),
            ));
        }
        self.soft.modify(
            (mask & srq_attr_mask::MAX_WR != 0).then_some(attr.max_wr),
            (mask & srq_attr_mask::LIMIT != 0).then_some(attr.srq_limit),
        )
    }

    /// `ibv_query_srq`.
    pub fn query(&self) -> SrqAttr {
        let (max_wr, max_sge, srq_limit) = self.soft.attr();
        SrqAttr {
            max_wr,
            max_sge,
            srq_limit,
        }
    }

    /// `ibv_destroy_srq`: Busy while QPs use it; queued WQEs are dropped (no completions).
    /// No event is written after it returns.
    pub fn destroy(&self) -> Result<()> {
        self.check_alive()?;
        let n = self.qps.load(Ordering::Acquire);
        if n > 0 {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("destroy_srq: {n} QP(s) still use it"),
            ));
        }
        if self.dead.swap(true, Ordering::AcqRel) {
            return self.check_alive();
        }
        self.events.close();
        self.soft.drain(self.pd.dev.soft.mrs());
        self.pd.users.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }
}

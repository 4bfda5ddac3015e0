//! Memory windows (`ibv_alloc_mw`, `ibv_dealloc_mw`), bound by `IBV_WR_BIND_MW` (type 2,
//! to the QP it is posted on) or `ibv_bind_mw` (type 1, to every QP of the device), ended
//! by `IBV_WR_LOCAL_INV` (type 2), a bind of length 0 (type 1) or deallocation, as rxe and
//! mlx5 do. The windows live in the soft device's window table
//! (`rdmx::provider::soft::window`): a window's rkey opens `[addr, addr + len)` of its
//! region with its rights, to requests arriving on the QP it is bound to (type 2), until it
//! is invalidated; a region with windows bound cannot be deregistered (EBUSY).
//!
//! The operations run when posted, their completions (IBV_WC_BIND_MW, IBV_WC_LOCAL_INV,
//! or IBV_WC_MW_BIND_ERR / IBV_WC_LOC_QP_OP_ERR, which end the QP) take their turn in the
//! send queue's order (`rdmx::provider::soft::qp`, `local.rs`).

use rdmx::error::{Error, ErrorKind, Result};
use rdmx::rc::verbs::send_flags;
use rdmx::rc::{QpState, WcOpcode, WcStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::pd::Pd;

/// `IBV_MW_TYPE_1`.
pub const MW_TYPE_1: u32 = 1;
/// `IBV_MW_TYPE_2`.
pub const MW_TYPE_2: u32 = 2;
/// `IBV_ACCESS_ZERO_BASED`: no zero-based windows here (as rxe's `ibv_bind_mw`).
const ACCESS_ZERO_BASED: u32 = 1 << 5;

/// A memory window (`ibv_alloc_mw`).
#[derive(Debug)]
pub struct Mw {
    pd: Arc<Pd>,
    handle: u64,
    kind: u32,
    /// The rkey it was allocated with: its slot's fixed bits (a bind changes the low 8).
    rkey: u32,
    dead: AtomicBool,
}

impl Pd {
    /// `ibv_alloc_mw` of `kind` [`MW_TYPE_1`] or [`MW_TYPE_2`] (other types:
    /// InvalidArgument, as the kernel); `handle` names it (`struct ibv_mw *`). The PD
    /// cannot be deallocated while it exists.
    pub fn alloc_mw(self: &Arc<Self>, kind: u32, handle: u64) -> Result<Arc<Mw>> {
        self.check_alive()?;
        if kind != MW_TYPE_1 && kind != MW_TYPE_2 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("alloc_mw: type {kind}: memory windows are of type 1 or 2"),
            ));
        }
        let rkey = self.dev.soft.mrs().alloc_mw()?;
        self.users.fetch_add(1, Ordering::AcqRel);
        Ok(Arc::new(Mw {
            pd: Arc::clone(self),
            handle,
            kind,
            rkey,
            dead: AtomicBool::new(false),
        }))
    }
}

impl Mw {
    pub fn handle(&self) -> u64 {
        self.handle
    }

    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// [`MW_TYPE_1`] or [`MW_TYPE_2`].
    pub fn kind(&self) -> u32 {
        self.kind
    }

    /// The rkey it was allocated with (`ibv_mw.rkey` after `ibv_alloc_mw`).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// `ibv_dealloc_mw`: a bound window is invalidated first (no access through it is in
    /// progress when this returns, and its region may be deregistered). A second call is
    /// refused (InvalidArgument).
    pub fn dealloc(&self) -> Result<()> {
        if self.dead.swap(true, Ordering::AcqRel) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("dealloc_mw: window {:#x} already deallocated", self.rkey),
            ));
        }
        self.pd.dev.soft.mrs().dealloc_mw(self.rkey);
        self.pd.users.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        if !self.dead.load(Ordering::Acquire) {
            let _ = self.dealloc();
        }
    }
}

/// The memory region a bind names (`ibv_mw_bind_info.mr`).
#[derive(Debug, Clone)]
pub struct BindMr {
    pub lkey: u32,
    /// The MR's PD (the window's must be the same).
    pub pd: Arc<Pd>,
    /// Registered with IBV_ACCESS_MW_BIND (C10-73).
    pub mw_bind: bool,
}

/// `IBV_WR_BIND_MW` (or `ibv_bind_mw`'s WR).
#[derive(Debug, Clone)]
pub struct BindWr {
    pub wr_id: u64,
    pub send_flags: u32,
    pub mw: Arc<Mw>,
    /// The rkey the window gets (`ibv_inc_rkey` of the old one: its low 8 bits are the
    /// application's; the others must be the window's).
    pub rkey: u32,
    /// None only for a type-1 unbind (length 0).
    pub mr: Option<BindMr>,
    pub addr: u64,
    pub length: u64,
    /// `mw_access_flags`: REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC (LOCAL_WRITE ignored).
    pub access: u32,
}

/// A send-queue WR that puts nothing on the wire.
#[derive(Debug, Clone)]
pub enum LocalOp {
    Bind(BindWr),
    /// `IBV_WR_LOCAL_INV` of `rkey`.
    LocalInv {
        wr_id: u64,
        send_flags: u32,
        rkey: u32,
    },
}

impl LocalOp {
    fn wr_id(&self) -> u64 {
        match self {
            LocalOp::Bind(b) => b.wr_id,
            LocalOp::LocalInv { wr_id, .. } => *wr_id,
        }
    }

    fn send_flags(&self) -> u32 {
        match self {
            LocalOp::Bind(b) => b.send_flags,
            LocalOp::LocalInv { send_flags, .. } => *send_flags,
        }
    }

    fn opcode(&self) -> WcOpcode {
        match self {
            LocalOp::Bind(_) => WcOpcode::BindMw,
            LocalOp::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }
}

impl super::qp::Qp {
    /// Posts a local operation (after the WRs posted before it): performed now if the
    /// QP is in RTS, its completion in the send queue's order (signaled per `sq_sig_all`
    /// or IBV_SEND_SIGNALED; errors always). Refused (InvalidArgument) in RESET, INIT, RTR,
    /// and for a window of another device; in ERR it completes flushed, not performed.
    pub fn post_local(&self, op: &LocalOp) -> Result<()> {
        self.check_alive()?;
        let soft = self.soft_qp();
        let dev = &self.pd().dev;
        if let LocalOp::Bind(b) = op
            && !Arc::ptr_eq(&b.mw.pd.dev, dev)
        {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "post_send: IBV_WR_BIND_MW of a window of another device",
            ));
        }
        let signaled = op.send_flags() & send_flags::SIGNALED != 0 || self.sq_sig_all();
        let status = if soft.state() == QpState::Rts {
            self.perform(op)
        } else {
            WcStatus::Success
        };
        soft.post_local(dev.soft.mrs(), op.wr_id(), op.opcode(), status, signaled)
    }

    /// Performs `op` on the device's window table; the status of its completion.
    fn perform(&self, op: &LocalOp) -> WcStatus {
        let mrs = self.pd().dev.soft.mrs();
        let qpn = self.qp_num();
        let why = match op {
            LocalOp::LocalInv { rkey, .. } => match mrs.invalidate_mw(*rkey) {
                Ok(()) => return WcStatus::Success,
                Err(why) => {
                    log::debug!(target: "rdmx::ibv", "QP {qpn:#x}: LOCAL_INV: {why}");
                    return WcStatus::LocQpOpErr;
                }
            },
            LocalOp::Bind(b) => match self.check_bind(b) {
                Err(why) => why,
                Ok(lkey) => match mrs.bind_mw(
                    b.rkey,
                    b.mw.kind == MW_TYPE_1,
                    qpn,
                    lkey,
                    b.addr,
                    b.length,
                    b.access,
                ) {
                    Ok(()) => return WcStatus::Success,
                    Err(why) => why,
                },
            },
        };
        log::debug!(target: "rdmx::ibv", "QP {qpn:#x}: BIND_MW refused: {why}");
        WcStatus::MwBindErr
    }

    /// verbs' checks of a bind that need the verbs objects (C10-72, C10-73, the key's
    /// window); the table checks range and rights. The region's lkey (0 for an unbind).
    fn check_bind(&self, b: &BindWr) -> std::result::Result<u32, String> {
        if b.mw.dead.load(Ordering::Acquire) {
            return Err("the window was deallocated".into());
        }
        if b.rkey & !0xff != b.mw.rkey & !0xff {
            return Err(format!(
                "rkey {:#x} is not a key of window {:#x} (only the low 8 bits may change)",
                b.rkey, b.mw.rkey
            ));
        }
        if b.access & ACCESS_ZERO_BASED != 0 {
            return Err("zero-based windows are not supported".into());
        }
        if b.mw.kind == MW_TYPE_2 && !Arc::ptr_eq(&b.mw.pd, self.pd()) {
            return Err("a type-2 window of another PD than the QP's (C10-72)".into());
        }
        let Some(mr) = &b.mr else {
            if b.length == 0 && b.mw.kind == MW_TYPE_1 {
                return Ok(0);
            }
            return Err("no memory region".into());
        };
        if !Arc::ptr_eq(&mr.pd, &b.mw.pd) {
            return Err("the region's PD is not the window's".into());
        }
        if !mr.mw_bind {
            return Err("the region was registered without IBV_ACCESS_MW_BIND (C10-73)".into());
        }
        Ok(mr.lkey)
    }
}

//! Memory windows on a verbs device, for the messenger's scoped rkeys (issue 27; the
//! soft provider's are `provider/soft/window.rs`): a window's rkey opens a byte range of
//! one registration to the peer of one QP, until it is invalidated.
//!
//! - bind: a type-2 window (from this device's pool, or `ibv_alloc_mw`) is bound with
//!   `IBV_WR_BIND_MW` on the QP of the peer it is for, with the window's next key
//!   (`ibv_inc_rkey`). The bind is posted before the SEND that advertises the rkey, and a
//!   send queue executes in order, so the window is bound before the peer can use it.
//! - invalidate: `IBV_WR_LOCAL_INV` on the same QP, waited for (`qp/local.rs`); only
//!   then does the caller give the memory back to its pool. When the QP is in error or
//!   gone (the link ended) the invalidation cannot complete: the window is deallocated
//!   (`ibv_dealloc_mw` ends a bound window) instead of returning to the pool.
//!
//! What it costs: one more send-queue WR per window bound and one per window ended, and
//! the invalidation's round trip through the CQ (the NIC's local processing, no network
//! round trip). The registrations carry IBV_ACCESS_MW_BIND (`mr.rs`).

use super::device::Pd;
use super::mr::VerbsMrs;
use super::qp::VerbsQp;
use crate::error::{Error, ErrorKind, Result};
use parking_lot::Mutex;
use rdma_sys as ib;
use rustc_hash::FxHashMap as HashMap;
use std::sync::{Arc, Weak};

/// An allocated type-2 window.
#[derive(Debug)]
struct Mw(*mut ib::ibv_mw);

// SAFETY: a libibverbs object usable from any thread; owned by the pool or one bound
// record at a time, deallocated once.
unsafe impl Send for Mw {}

impl Mw {
    /// Deallocates it (which ends it if bound).
    fn dealloc(self) {
        // SAFETY: the window came from ibv_alloc_mw and is deallocated once (self is
        // consumed).
        let rc = unsafe { ib::ibv_dealloc_mw(self.0) };
        if rc != 0 {
            log::warn!(target: "rdmx::verbs", "ibv_dealloc_mw: {}", std::io::Error::from_raw_os_error(rc));
        }
    }
}

/// A bound window: what ends it.
#[derive(Debug)]
struct Bound {
    mw: Mw,
    qp: Weak<VerbsQp>,
    lkey: u32,
}

/// The windows of one device.
#[derive(Debug)]
pub struct VerbsWindows {
    pd: Arc<Pd>,
    mrs: Arc<VerbsMrs>,
    /// Unbound windows, for reuse (allocation is a kernel call on a NIC).
    free: Mutex<Vec<Mw>>,
    /// Bound windows by rkey.
    bound: Mutex<HashMap<u32, Bound>>,
}

/// `ibv_inc_rkey` (verbs.h): the window's next key.
fn inc_rkey(rkey: u32) -> u32 {
    (rkey & 0xffff_ff00) | (rkey.wrapping_add(1) & 0xff)
}

/// Most unbound windows kept for reuse; more are deallocated.
const POOL_MAX: usize = 4096;

impl VerbsWindows {
    pub fn new(pd: Arc<Pd>, mrs: Arc<VerbsMrs>) -> VerbsWindows {
        VerbsWindows {
            pd,
            mrs,
            free: Mutex::new(Vec::new()),
            bound: Mutex::new(HashMap::default()),
        }
    }

    /// Binds a window over `[addr, addr + len)` of region `lkey` with `rights`
    /// (REMOTE_READ / REMOTE_WRITE) to `qp`; its rkey. The region cannot be deregistered
    /// until the window is invalidated.
    pub fn bind(
        &self,
        qp: &Arc<VerbsQp>,
        lkey: u32,
        addr: u64,
        len: u64,
        rights: u32,
    ) -> Result<u32> {
        let Some(mr) = self.mrs.raw_mr(lkey) else {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("memory window: no memory region with lkey {lkey:#x}"),
            ));
        };
        let mw = match self.free.lock().pop() {
            Some(m) => m,
            None => {
                // SAFETY: a live PD of this device (rdma-sys calls `context->ops.alloc_mw`
                // as verbs.h's static inline does; None when the provider has none).
                let p = unsafe { ib::ibv_alloc_mw(self.pd.pd, ib::ibv_mw_type::IBV_MW_TYPE_2) }
                    .unwrap_or(std::ptr::null_mut());
                if p.is_null() {
                    return Err(Error::new(
                        ErrorKind::ResourceLimit,
                        format!(
                            "memory window: ibv_alloc_mw: {}",
                            std::io::Error::last_os_error()
                        ),
                    ));
                }
                Mw(p)
            }
        };
        // SAFETY: a live window of ours.
        let rkey = inc_rkey(unsafe { (*mw.0).rkey });
        self.mrs.hold(&[lkey], true);
        if let Err(e) = qp.post_bind_mw(mw.0, rkey, mr, addr, len, rights) {
            self.mrs.hold(&[lkey], false);
            self.free.lock().push(mw);
            return Err(e);
        }
        // The window's key from now on (what the next bind increments; rxe checks it).
        // SAFETY: a live window of ours; nothing else reads it concurrently.
        unsafe { (*mw.0).rkey = rkey };
        self.bound.lock().insert(
            rkey,
            Bound {
                mw,
                qp: Arc::downgrade(qp),
                lkey,
            },
        );
        Ok(rkey)
    }

    /// Ends window `rkey`: when this returns, no access through it is in progress or can
    /// start (its LOCAL_INV completed, or it was deallocated). Unknown keys are ignored.
    pub fn invalidate(&self, rkey: u32) {
        let Some(b) = self.bound.lock().remove(&rkey) else {
            return;
        };
        let ended = b.qp.upgrade().is_some_and(|q| q.invalidate_sync(rkey));
        if ended {
            let mut free = self.free.lock();
            if free.len() < POOL_MAX {
                free.push(b.mw);
            } else {
                drop(free);
                b.mw.dealloc();
            }
        } else {
            b.mw.dealloc();
        }
        self.mrs.hold(&[b.lkey], false);
    }
}

impl Drop for VerbsWindows {
    fn drop(&mut self) {
        for mw in self.free.get_mut().drain(..) {
            mw.dealloc();
        }
        for (_, b) in self.bound.get_mut().drain() {
            b.mw.dealloc();
            self.mrs.hold(&[b.lkey], false);
        }
    }
}

/// The windows of one QP's peer: what the messenger's scope binds through.
#[derive(Debug)]
pub struct VerbsQpWindows {
    pub(crate) windows: Arc<VerbsWindows>,
    pub(crate) qp: Weak<VerbsQp>,
}

impl crate::provider::windows::QpWindows for VerbsQpWindows {
    fn bind(&self, lkey: u32, addr: u64, len: u64, rights: u32) -> Result<u32> {
        let Some(qp) = self.qp.upgrade() else {
            return Err(Error::fixed(
                ErrorKind::Closed,
                "memory window: the link's QP is gone",
            ));
        };
        self.windows.bind(&qp, lkey, addr, len, rights)
    }

    fn invalidate(&self, rkey: u32) {
        self.windows.invalidate(rkey);
    }
}

#[cfg(test)]
mod tests {
    use super::inc_rkey;

    #[test]
    fn the_next_key_changes_the_low_byte_only() {
        assert_eq!(inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(inc_rkey(0x1234_5601), 0x1234_5602);
    }
}

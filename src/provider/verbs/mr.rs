//! Memory regions on a verbs device: `ibv_reg_mr` with the caller's access flags, one per
//! registration (pools register each 2 MiB arena once), kept in a table by lkey so that
//! deregistration is refused while work requests name a region (as the soft provider
//! does: a NIC would DMA into freed memory) and the handshake can list exposed regions.
//! That bookkeeping is shared with the soft provider (`crate::provider::mr_table`); the
//! `ibv_reg_mr`/`ibv_dereg_mr` calls are this provider's own.

use super::device::Pd;
use crate::error::{Error, ErrorKind, Result};
use crate::provider::mr_table::{Regions, Registration};
use parking_lot::RwLock;
use rdma_sys as ib;
use std::sync::Arc;

/// One registration.
pub type VRegion = Registration<IbvMr>;

/// A registration's `struct ibv_mr *`.
#[derive(Debug)]
pub struct IbvMr(*mut ib::ibv_mr);

// SAFETY: the mr pointer is only passed to ibv_dereg_mr (once, by the table) and read as a
// bind's `ibv_mr`; the rest of a registration is plain data and atomics.
unsafe impl Send for IbvMr {}
// SAFETY: as above.
unsafe impl Sync for IbvMr {}

/// Every region of one device.
#[derive(Debug)]
pub struct VerbsMrs {
    pd: Arc<Pd>,
    by_lkey: RwLock<Regions<IbvMr>>,
    /// Registrations also carry IBV_ACCESS_MW_BIND (the device binds type-2 windows,
    /// which the messenger uses for scoped rkeys: `window.rs`).
    mw_bind: bool,
}

/// `IBV_ACCESS_MW_BIND`.
const ACCESS_MW_BIND: u32 = 1 << 4;

impl VerbsMrs {
    /// The regions of `pd`; with `mw_bind`, every registration allows memory windows.
    pub fn new(pd: Arc<Pd>, mw_bind: bool) -> VerbsMrs {
        VerbsMrs {
            pd,
            by_lkey: RwLock::new(Regions::default()),
            mw_bind,
        }
    }

    /// The `struct ibv_mr *` of the region with `lkey` (what a bind names).
    pub(crate) fn raw_mr(&self, lkey: u32) -> Option<*mut ib::ibv_mr> {
        self.by_lkey.read().get(lkey).map(|r| r.own.0)
    }

    /// Registers `[addr, addr + len)` with `access_flags` (checked as the soft provider
    /// checks them, so both providers refuse the same inputs with the same words).
    ///
    /// # Safety
    /// The memory must stay valid and mapped until `deregister(lkey)` succeeds.
    pub unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access_flags: u32,
    ) -> Result<Arc<VRegion>> {
        crate::provider::region::check_region(addr, len, access_flags)?;
        let flags = if self.mw_bind {
            access_flags | ACCESS_MW_BIND
        } else {
            access_flags
        };
        // SAFETY: the PD is live (held by `self`); the caller keeps the range mapped until
        // deregistration; the access bits are the ibv_access_flags values.
        let mr = unsafe { ib::ibv_reg_mr(self.pd.pd, addr.cast(), len, flags as libc::c_int) };
        if mr.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                // The driver pins the pages: the kernel charges them to RLIMIT_MEMLOCK
                // (unless CAP_IPC_LOCK) and refuses with ENOMEM or EPERM/EAGAIN above it.
                Some(libc::ENOMEM | libc::EPERM | libc::EAGAIN) => {
                    let limit = crate::provider::sys::memlock_limit()
                        .map_or("unlimited".to_string(), |l| format!("{l} bytes"));
                    Error::new(
                        ErrorKind::ResourceLimit,
                        format!(
                            "registering {len} bytes: ibv_reg_mr refused ({e}); RLIMIT_MEMLOCK is {limit}: raise it (ulimit -l), or register less (pools reuse one registration)"
                        ),
                    )
                }
                _ => Error::new(
                    ErrorKind::Io,
                    format!("verbs: ibv_reg_mr of {len} bytes at {addr:p}: {e}"),
                ),
            });
        }
        // SAFETY: `mr` is non-NULL, returned by ibv_reg_mr.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        let r = Arc::new(VRegion::new(
            addr as u64,
            len as u64,
            access_flags,
            lkey,
            rkey,
            IbvMr(mr),
        ));
        self.by_lkey.write().insert(Arc::clone(&r));
        Ok(r)
    }

    /// Deregisters the region with `lkey`; `Busy` while work requests name it.
    pub fn deregister(&self, lkey: u32) -> Result<()> {
        let mut t = self.by_lkey.write();
        let mr = t.idle(lkey)?.own.0;
        // SAFETY: `mr` came from ibv_reg_mr and is deregistered once: it leaves the table
        // under the write lock right after.
        let rc = unsafe { ib::ibv_dereg_mr(mr) };
        if rc != 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "verbs: ibv_dereg_mr lkey {lkey:#x}: {}",
                    std::io::Error::from_raw_os_error(rc)
                ),
            ));
        }
        t.remove(lkey);
        Ok(())
    }

    /// Marks the regions of `lkeys` as named by one more (`up`) or one fewer WR.
    pub fn hold(&self, lkeys: &[u32], up: bool) {
        if lkeys.is_empty() {
            return;
        }
        self.by_lkey.read().hold(lkeys, up);
    }

    /// Regions with remote access, by address (for the handshake).
    pub fn exposed(&self) -> Vec<Arc<VRegion>> {
        self.by_lkey.read().exposed()
    }
}

impl Drop for VerbsMrs {
    fn drop(&mut self) {
        // Regions still registered when the last user goes (a leak by the caller):
        // deregister them before the PD is released.
        for r in self.by_lkey.get_mut().drain() {
            // SAFETY: each mr is deregistered once, here, and never used again.
            unsafe { ib::ibv_dereg_mr(r.own.0) };
        }
    }
}

impl crate::mem::Registrar for VerbsMrs {
    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: u32,
    ) -> Result<crate::mem::MrKeys> {
        // SAFETY: the trait's contract is this function's.
        unsafe { VerbsMrs::register(self, addr, len, access) }.map(|r| r.keys())
    }

    fn deregister(&self, lkey: u32) -> Result<()> {
        VerbsMrs::deregister(self, lkey)
    }
}

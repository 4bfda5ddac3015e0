//! Protection domains and memory regions. A PD counts what belongs to it (MRs, QPs, SRQs)
//! so that destroying it while they live is refused (EBUSY), as verbs.

use rdmx::error::{Error, ErrorKind, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::device::Device;

/// `IBV_ACCESS_OPTIONAL_RANGE`: access bits a provider may ignore (verbs.h).
const ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;

/// A protection domain (`ibv_alloc_pd`).
#[derive(Debug)]
pub struct Pd {
    pub(crate) dev: Arc<Device>,
    handle: u64,
    /// MRs, QPs and SRQs created in this PD and not destroyed.
    pub(crate) users: AtomicUsize,
    dead: AtomicBool,
}

impl Pd {
    /// A PD on `dev`; `handle` names it (the glue's `struct ibv_pd *`).
    pub fn new(dev: &Arc<Device>, handle: u64) -> Arc<Pd> {
        Arc::new(Pd {
            dev: Arc::clone(dev),
            handle,
            users: AtomicUsize::new(0),
            dead: AtomicBool::new(false),
        })
    }

    /// InvalidArgument once destroyed.
    pub(crate) fn check_alive(&self) -> Result<()> {
        if self.dead.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "protection domain already deallocated",
            ));
        }
        Ok(())
    }

    pub fn handle(&self) -> u64 {
        self.handle
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// `ibv_reg_mr`: registers `[addr, addr + len)` with `access` (`ibv_access_flags`:
    /// LOCAL_WRITE 1, REMOTE_WRITE 2, REMOTE_READ 4; REMOTE_ATOMIC 8 is accepted and
    /// never exercised: the device has no atomics). REMOTE_WRITE requires LOCAL_WRITE, as
    /// `ibv_reg_mr(3)`; optional bits (0x3ff00000, e.g. RELAXED_ORDERING) are ignored;
    /// other unknown bits are refused (InvalidArgument). The pages are pinned
    /// (mlock) within RLIMIT_MEMLOCK (ResourceLimit otherwise).
    ///
    /// # Safety
    /// The range must stay valid and mapped until [`Mr::dereg`] succeeds: local work
    /// requests and remote peers (REMOTE_*) read and write it from the progress thread at
    /// any time meanwhile, as a NIC would by DMA.
    pub unsafe fn reg_mr(
        self: &Arc<Self>,
        addr: *mut u8,
        len: usize,
        access: u32,
        handle: u64,
    ) -> Result<Mr> {
        self.check_alive()?;
        // verbs' optional access flags (IBV_ACCESS_OPTIONAL_RANGE, e.g. RELAXED_ORDERING,
        // which perftest passes) are hints a provider may ignore; the rest is checked.
        let access = access & !ACCESS_OPTIONAL_RANGE;
        // SAFETY: the caller's contract (above) is MrTable::register's.
        let r = unsafe { self.dev.soft.mrs().register(addr, len, access) }?;
        self.users.fetch_add(1, Ordering::AcqRel);
        Ok(Mr {
            pd: Arc::clone(self),
            handle,
            addr: r.addr,
            len: r.len,
            access: r.access,
            lkey: r.lkey,
            rkey: r.rkey,
            dead: AtomicBool::new(false),
        })
    }

    /// `ibv_dealloc_pd`: Busy while MRs, QPs or SRQs of this PD exist.
    pub fn destroy(&self) -> Result<()> {
        self.check_alive()?;
        let n = self.users.load(Ordering::Acquire);
        if n > 0 {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("dealloc_pd: {n} memory region(s), QP(s) or SRQ(s) still use it"),
            ));
        }
        self.dead.store(true, Ordering::Release);
        Ok(())
    }
}

/// A registered memory region (`ibv_reg_mr`).
#[derive(Debug)]
pub struct Mr {
    pd: Arc<Pd>,
    handle: u64,
    pub addr: u64,
    pub len: u64,
    pub access: u32,
    pub lkey: u32,
    pub rkey: u32,
    dead: AtomicBool,
}

impl Mr {
    pub fn handle(&self) -> u64 {
        self.handle
    }

    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// `ibv_dereg_mr`: Busy while posted work requests (not yet completed) name the
    /// region; after success the memory is no longer touched and the keys are invalid.
    /// A second call is refused (InvalidArgument).
    pub fn dereg(&self) -> Result<()> {
        if self.dead.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("dereg_mr: lkey {:#x} already deregistered", self.lkey),
            ));
        }
        self.pd.dev.soft.mrs().deregister(self.lkey)?;
        self.dead.store(true, Ordering::Release);
        self.pd.users.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }
}

impl Drop for Mr {
    /// A region the application never deregistered (or whose process drops the glue's
    /// objects at exit) is deregistered here, best effort (Busy leaves it registered).
    fn drop(&mut self) {
        if !self.dead.load(Ordering::Acquire) {
            let _ = self.dereg();
        }
    }
}

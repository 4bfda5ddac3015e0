//! Protection domains and memory regions. A PD counts what belongs to it (MRs, QPs, SRQs)
//! so that destroying it while they live is refused (EBUSY), as verbs.

use rdmx::error::{Error, ErrorKind, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::device::Device;

/// `IBV_ACCESS_OPTIONAL_RANGE`: access bits a provider may ignore (verbs.h).
const ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;
/// `IBV_ACCESS_MW_BIND`: memory windows may be bound over the MR (`verbs/mw.rs`); the
/// soft device's region table does not know the bit, the MR keeps it.
const ACCESS_MW_BIND: u32 = 1 << 4;
/// Access bits of features this device lacks, refused with EOPNOTSUPP as rxe does
/// (`rxe_reg_user_mr`: anything outside `RXE_ACCESS_SUPPORTED_MR`) and as the kernel's
/// `ib_check_mr_access` does for ON_DEMAND without ODP: ZERO_BASED (1 << 5), ON_DEMAND
/// (1 << 6), HUGETLB (1 << 7), FLUSH_GLOBAL (1 << 8), FLUSH_PERSISTENT (1 << 9).
const ACCESS_UNSUPPORTED: u32 = 0x3e0;

/// The names of `ACCESS_UNSUPPORTED`'s bits, for the error message.
fn unsupported_access_names(bits: u32) -> String {
    const NAMES: [(u32, &str); 5] = [
        (1 << 5, "ZERO_BASED"),
        (1 << 6, "ON_DEMAND (ODP)"),
        (1 << 7, "HUGETLB"),
        (1 << 8, "FLUSH_GLOBAL"),
        (1 << 9, "FLUSH_PERSISTENT"),
    ];
    let v: Vec<&str> = NAMES
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    v.join(", ")
}

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
    /// never exercised: the device has no atomics; MW_BIND 16 lets memory windows be
    /// bound over it). REMOTE_WRITE requires LOCAL_WRITE, as
    /// `ibv_reg_mr(3)`; optional bits (0x3ff00000, e.g. RELAXED_ORDERING) are
    /// accepted and dropped; ZERO_BASED, ON_DEMAND, HUGETLB and the FLUSH bits are refused
    /// (Unsupported = EOPNOTSUPP, as rxe); other unknown bits are refused
    /// (InvalidArgument). The pages are pinned (mlock) within RLIMIT_MEMLOCK (ResourceLimit
    /// otherwise).
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
        if access & ACCESS_UNSUPPORTED != 0 {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "reg_mr: access flag(s) {} not supported by rdmx0",
                    unsupported_access_names(access & ACCESS_UNSUPPORTED)
                ),
            ));
        }
        let asked = access;
        let access = access & !ACCESS_MW_BIND;
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
            asked,
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
    /// The access flags asked for (with IBV_ACCESS_MW_BIND, which `access` lacks). A u32,
    /// not a bool: the glue's `Option<Mr>` must be None when all-zero (a bool's niche
    /// would be taken for the None instead of the Arc's).
    asked: u32,
    dead: AtomicBool,
}

impl Mr {
    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// Memory windows may be bound over it (IBV_ACCESS_MW_BIND).
    pub fn mw_bind(&self) -> bool {
        self.asked & ACCESS_MW_BIND != 0
    }

    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// `ibv_dereg_mr`: not refused while posted work requests name the region (verbs
    /// refuses deregistration only while memory windows are bound in it: Busy, EBUSY;
    /// programs and rdma-core's tests tear down QPs and SRQs after their MRs). After
    /// success the memory is no longer touched and the keys are invalid: such a work
    /// request completes in error if it reaches the region (`MrTable::revoke`). A second
    /// call is refused (InvalidArgument).
    pub fn dereg(&self) -> Result<()> {
        if self.dead.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("dereg_mr: lkey {:#x} already deregistered", self.lkey),
            ));
        }
        self.pd.dev.soft.mrs().revoke(self.lkey)?;
        self.dead.store(true, Ordering::Release);
        self.pd.users.fetch_sub(1, Ordering::AcqRel);
        Ok(())
    }
}

impl Drop for Mr {
    /// A region the application never deregistered (or whose process drops the glue's
    /// objects at exit) is deregistered here, best effort.
    fn drop(&mut self) {
        if !self.dead.load(Ordering::Acquire) {
            let _ = self.dereg();
        }
    }
}

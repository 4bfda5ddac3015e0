//! Memory regions of the soft provider: caller memory registered under an unpredictable
//! lkey and rkey with verbs access flags, reached by the RC engine through `rc::Memory`.
//!
//! Contract with the caller (stated in the header too): registered memory stays valid and
//! mapped until `deregister` returns, and a region cannot be deregistered while work
//! requests that name it are in flight (`Busy`). `revoke` is verbs' `ibv_dereg_mr`
//! instead, which is not refused for work requests in flight (verbs refuses it only for
//! bound memory windows): that is safe because the engine reaches memory only by looking
//! a key up in this table under a view (a read lock), never through a pointer kept across
//! views. Once `revoke` has taken the write lock and removed the keys, a work request that
//! still names the region fails its next access (a LOC_PROT_ERR or REM_ACCESS_ERR
//! completion) and the memory is never touched again.
//!
//! Registration costs what it costs on a NIC: the pages are pinned (mlock) within
//! RLIMIT_MEMLOCK, and unpinned on deregistration. Pins are counted per page, so regions
//! that share pages (overlapping or adjacent buffers) keep them pinned until the last goes.
//! `soft_pin=false` turns pinning off, for hosts whose limit cannot be raised.
//!
//! The bookkeeping shared with the verbs provider (a registration's extent, keys and work
//! requests in flight; the table by lkey and its deregistration rule) is
//! `crate::provider::mr_table`; what is this provider's own is here: random keys and the
//! table by rkey, page pinning, memory windows, `revoke`, and the engine's view.

use crate::error::{Error, ErrorKind, Result};
use crate::provider::mr_table::{Regions, Registration};
use crate::rc::memory::{Key, MemError, Memory};
use crate::rc::verbs::access;
use parking_lot::{RwLock, RwLockReadGuard};
use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::sys::{memlock_limit, try_random_u32};
use super::window::{ANY_QP, Held, MwBindError, WINDOW_TAG, WindowTable};

/// One registered region.
pub type Region = Registration<SoftRegion>;

/// What a soft region keeps beside the shared bookkeeping.
#[derive(Debug, Default)]
pub struct SoftRegion {
    /// Memory windows bound in it (it cannot be deregistered while there are any).
    windows: AtomicU32,
}

#[derive(Debug, Default)]
struct Tables {
    by_lkey: Regions<SoftRegion>,
    by_rkey: HashMap<u32, Arc<Region>>,
    /// Registrations pinning each page (page number -> count); a page is mlocked while > 0.
    pins: BTreeMap<u64, u32>,
    /// `soft_pin=false`: registrations pin nothing (no mlock, no RLIMIT_MEMLOCK bound).
    unpinned: bool,
}

fn page_size() -> u64 {
    // SAFETY: plain sysconf query.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as u64 } else { 4096 }
}

/// The pages [first, end) that `[addr, addr + len)` touches.
fn pages(addr: u64, len: u64) -> (u64, u64) {
    let ps = page_size();
    (addr / ps, (addr + len).div_ceil(ps))
}

/// Runs of consecutive pages among `pages`, as (first, end).
fn runs(pages: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &p in pages {
        match out.last_mut() {
            Some((_, end)) if *end == p => *end = p + 1,
            _ => out.push((p, p + 1)),
        }
    }
    out
}

impl Tables {
    fn pinned_bytes(&self) -> u64 {
        self.pins.len() as u64 * page_size()
    }

    /// Pins the pages of `[addr, addr + len)` (mlock of those not pinned yet), within
    /// RLIMIT_MEMLOCK. All or nothing.
    fn pin(&mut self, addr: u64, len: u64) -> Result<()> {
        if len == 0 || self.unpinned {
            return Ok(());
        }
        let (first, end) = pages(addr, len);
        let fresh: Vec<u64> = (first..end)
            .filter(|p| !self.pins.contains_key(p))
            .collect();
        let ps = page_size();
        // The kernel enforces RLIMIT_MEMLOCK on mlock exactly as it does when a NIC driver
        // pins pages for ibv_reg_mr (and lifts it for CAP_IPC_LOCK): let it judge, and say
        // clearly what was asked when it refuses.
        let want = self.pinned_bytes() + fresh.len() as u64 * ps;
        let runs = runs(&fresh);
        for (i, &(a, b)) in runs.iter().enumerate() {
            // SAFETY: mlock only pins pages; the range is the caller's registered memory.
            if unsafe { libc::mlock((a * ps) as *const libc::c_void, ((b - a) * ps) as usize) } != 0
            {
                let e = std::io::Error::last_os_error();
                for &(a2, b2) in &runs[..i] {
                    // SAFETY: undoes the mlock just done above.
                    unsafe {
                        libc::munlock((a2 * ps) as *const libc::c_void, ((b2 - a2) * ps) as usize)
                    };
                }
                let limit =
                    memlock_limit().map_or("unlimited".to_string(), |l| format!("{l} bytes"));
                return Err(Error::new(
                    ErrorKind::ResourceLimit,
                    format!(
                        "registering {len} bytes would pin {want} bytes in all: mlock refused ({e}); RLIMIT_MEMLOCK is {limit}: raise it (ulimit -l), or register less (pools reuse one registration)"
                    ),
                ));
            }
        }
        for p in first..end {
            *self.pins.entry(p).or_insert(0) += 1;
        }
        Ok(())
    }

    /// Drops this registration's pin on its pages; munlocks pages nobody pins any more.
    fn unpin(&mut self, addr: u64, len: u64) {
        if len == 0 || self.unpinned {
            return;
        }
        let (first, end) = pages(addr, len);
        let mut freed = Vec::new();
        for p in first..end {
            if let Some(c) = self.pins.get_mut(&p) {
                *c -= 1;
                if *c == 0 {
                    self.pins.remove(&p);
                    freed.push(p);
                }
            }
        }
        let ps = page_size();
        for (a, b) in runs(&freed) {
            // SAFETY: unpins pages this table pinned and nobody else pins.
            unsafe { libc::munlock((a * ps) as *const libc::c_void, ((b - a) * ps) as usize) };
        }
    }
}

/// All regions of one device.
///
/// Readers take the lock with `read_recursive`: the receive path holds a view (a read lock)
/// while it locks a QP, and a post holds its QP's lock while it takes a read lock here. With
/// parking_lot's writer-preferring `read`, a `register` waiting for the write lock between
/// the two would block the second reader behind itself and deadlock all three threads
/// (seen: msgr_faults hung, a messenger worker in post_send, the progress thread in
/// receive, the test thread in register). A writer waits until no reader is left.
#[derive(Debug, Default)]
pub struct MrTable {
    tables: RwLock<Tables>,
    /// Memory windows over the regions (`window.rs`): not under the lock above.
    windows: WindowTable,
}

impl MrTable {
    /// An empty table; `pin_pages` false (`soft_pin=false`) registers without pinning.
    pub fn new(pin_pages: bool) -> MrTable {
        let t = MrTable::default();
        t.tables.write().unpinned = !pin_pages;
        t
    }

    /// Registers `[addr, addr + len)` with `access` (`ibv_access_flags` bits) and returns
    /// the region (its lkey and rkey are random and unique in this table).
    ///
    /// # Safety
    /// The engine reads and writes the range (local and remote work requests) until
    /// `deregister(lkey)` succeeds: it must stay valid and mapped until then, and what the
    /// caller does with it meanwhile follows verbs rules (a buffer named by an outstanding
    /// work request, or exposed for remote writes, may change under the caller).
    pub unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access_flags: u32,
    ) -> Result<Arc<Region>> {
        crate::provider::region::check_region(addr, len, access_flags)?;
        let mut t = self.tables.write();
        t.pin(addr as u64, len as u64)?;
        // Keys are random (not predictable from one registration to the next) and never 0.
        // Bounded: with at most a few million regions in a 2^32 space, 64 draws that all
        // collide mean the randomness is broken, which is reported, not looped on. The top
        // bit is the memory windows' (`WINDOW_TAG`): a region's keys never have it.
        let fresh = |taken: &dyn Fn(u32) -> bool| -> Result<u32> {
            for _ in 0..64 {
                let k = try_random_u32()? & !WINDOW_TAG;
                if k != 0 && !taken(k) {
                    return Ok(k);
                }
            }
            Err(Error::new(
                ErrorKind::Io,
                "memory registration: 64 random keys in a row were taken: kernel randomness is broken",
            ))
        };
        let keys = fresh(&|k: u32| t.by_lkey.contains(k))
            .and_then(|l| Ok((l, fresh(&|k: u32| t.by_rkey.contains_key(&k))?)));
        let (lkey, rkey) = match keys {
            Ok(k) => k,
            Err(e) => {
                t.unpin(addr as u64, len as u64);
                return Err(e);
            }
        };
        let r = Arc::new(Region::new(
            addr as u64,
            len as u64,
            access_flags,
            lkey,
            rkey,
            SoftRegion::default(),
        ));
        t.by_lkey.insert(Arc::clone(&r));
        t.by_rkey.insert(rkey, Arc::clone(&r));
        Ok(r)
    }

    /// Removes the region with `lkey`; `Busy` while work requests name it.
    pub fn deregister(&self, lkey: u32) -> Result<()> {
        let mut t = self.tables.write();
        let r = t.by_lkey.idle(lkey)?;
        windows_bound(r)?;
        let (rkey, addr, len) = (r.rkey, r.addr, r.len);
        t.by_lkey.remove(lkey);
        t.by_rkey.remove(&rkey);
        t.unpin(addr, len);
        Ok(())
    }

    /// Removes the region with `lkey` even while work requests name it (verbs'
    /// `ibv_dereg_mr`; see the module comment): their next access finds no key and fails
    /// with a completion error, and the memory is the caller's again when this returns.
    pub fn revoke(&self, lkey: u32) -> Result<()> {
        let mut t = self.tables.write();
        windows_bound(t.by_lkey.find(lkey)?)?;
        let Some(r) = t.by_lkey.remove(lkey) else {
            return Ok(());
        };
        let n = r.in_flight();
        if n > 0 {
            log::debug!(
                target: "rdmx::soft",
                "memory region lkey {lkey:#x} deregistered while {n} work request(s) name it: they complete in error if they reach it"
            );
        }
        t.by_rkey.remove(&r.rkey);
        t.unpin(r.addr, r.len);
        Ok(())
    }

    /// Binds a memory window over `[addr, addr + len)` of the region `lkey` to QP `qpn`
    /// with `rights` (REMOTE_READ and/or REMOTE_WRITE; the region itself needs no remote
    /// right, and LOCAL_WRITE for REMOTE_WRITE, as a type-2 window on a NIC) and returns
    /// its rkey: valid only in requests arriving on that QP, within that range, until
    /// [`MrTable::invalidate_window`]. The region cannot be deregistered meanwhile.
    pub fn bind_window(
        &self,
        qpn: u32,
        lkey: u32,
        addr: u64,
        len: u64,
        rights: u32,
    ) -> Result<u32> {
        let remote = access::REMOTE_READ | access::REMOTE_WRITE;
        if rights & !remote != 0 || rights == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "memory window: rights {rights:#x}: REMOTE_READ (4) and/or REMOTE_WRITE (2)"
                ),
            ));
        }
        let t = self.tables.read_recursive();
        let Some(r) = t.by_lkey.get(lkey) else {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("memory window: no memory region with lkey {lkey:#x}"),
            ));
        };
        if !r.covers(addr, len) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "memory window: {addr:#x} + {len} is not inside region lkey {lkey:#x} ({:#x} + {})",
                    r.addr, r.len
                ),
            ));
        }
        if rights & access::REMOTE_WRITE != 0 && r.access & access::LOCAL_WRITE == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "memory window: REMOTE_WRITE over a region without LOCAL_WRITE",
            ));
        }
        r.own.windows.fetch_add(1, Ordering::AcqRel);
        let acc = rights | (r.access & access::LOCAL_WRITE);
        self.windows
            .bind(qpn, lkey, addr, len, acc)
            .inspect_err(|_| {
                r.own.windows.fetch_sub(1, Ordering::AcqRel);
            })
    }

    /// Invalidates window `rkey`: when this returns, no access through it is in progress
    /// and none can start (see `window.rs`). False when it was not bound.
    pub fn invalidate_window(&self, rkey: u32) -> bool {
        let Some(lkey) = self.windows.invalidate(rkey) else {
            return false;
        };
        if let Some(r) = self.tables.read_recursive().by_lkey.get(lkey) {
            r.own.windows.fetch_sub(1, Ordering::AcqRel);
        }
        true
    }

    /// Allocates a verbs memory window (`ibv_alloc_mw`): its rkey, which opens nothing
    /// until [`MrTable::bind_mw`].
    pub fn alloc_mw(&self) -> Result<u32> {
        self.windows.alloc()
    }

    /// Binds the verbs window `rkey` names (`IBV_WR_BIND_MW`, `ibv_bind_mw`) with that
    /// rkey (the application's key byte) over `[addr, addr + len)` of region `lkey` with
    /// `rights` (REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC; LOCAL_WRITE is ignored): a type-2
    /// window to QP `qpn`, a type-1 one to every QP. A type-1 bind of length 0 unbinds.
    /// The checks are verbs' (C10-72..75, rxe's `rxe_check_bind_mw`); a refusal is the
    /// bind's IBV_WC_MW_BIND_ERR, with the reason in words. The caller checked that the
    /// region was registered with MW_BIND (this table does not know that bit).
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw(
        &self,
        rkey: u32,
        type1: bool,
        qpn: u32,
        lkey: u32,
        addr: u64,
        len: u64,
        rights: u32,
    ) -> std::result::Result<(), String> {
        let rights = rights & !access::LOCAL_WRITE;
        let remote = access::REMOTE_READ | access::REMOTE_WRITE | access::REMOTE_ATOMIC;
        if rights & !remote != 0 {
            return Err(format!(
                "mw_access_flags {rights:#x}: a window takes REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC"
            ));
        }
        if len == 0 {
            if !type1 {
                return Err("a type-2 window cannot be bound with length 0".into());
            }
            // Unbinding a type-1 window: its old rkey dies.
            let old = self
                .windows
                .unbind(rkey)
                .map_err(|_| format!("rkey {rkey:#x} names no memory window"))?;
            self.release_window_of(old);
            return Ok(());
        }
        let t = self.tables.read_recursive();
        let Some(r) = t.by_lkey.get(lkey) else {
            return Err(format!("no memory region with lkey {lkey:#x}"));
        };
        if !r.covers(addr, len) {
            return Err(format!(
                "{addr:#x} + {len} is not inside the region ({:#x} + {})",
                r.addr, r.len
            ));
        }
        if rights & (access::REMOTE_WRITE | access::REMOTE_ATOMIC) != 0
            && r.access & access::LOCAL_WRITE == 0
        {
            return Err("a writable window over a region without LOCAL_WRITE".into());
        }
        r.own.windows.fetch_add(1, Ordering::AcqRel);
        let acc = rights | (r.access & access::LOCAL_WRITE);
        let qpn = if type1 { ANY_QP } else { qpn };
        drop(t);
        match self.windows.bind_mw(rkey, type1, qpn, lkey, addr, len, acc) {
            Ok(old) => {
                self.release_window_of(old);
                Ok(())
            }
            Err(e) => {
                self.release_window_of(Some(lkey));
                Err(match e {
                    MwBindError::NoWindow => format!("rkey {rkey:#x} names no memory window"),
                    MwBindError::Bound => {
                        "the type-2 window is bound: invalidate it first".to_string()
                    }
                })
            }
        }
    }

    /// `ibv_dealloc_mw`: the window `rkey` names is invalidated if bound (no access through
    /// it is in progress when this returns) and its slot freed. False when `rkey` names no
    /// allocated window.
    pub fn dealloc_mw(&self, rkey: u32) -> bool {
        match self.windows.dealloc(rkey) {
            Ok(lkey) => {
                self.release_window_of(lkey);
                true
            }
            Err(_) => false,
        }
    }

    /// `IBV_WR_LOCAL_INV` (and a received SEND_WITH_INV) of a verbs window: as
    /// [`MrTable::invalidate_window`], refused for what verbs refuses: an rkey that is no
    /// bound window (a region's rkey: this device has no fast-registration MRs), a type-1
    /// window.
    pub fn invalidate_mw(&self, rkey: u32) -> std::result::Result<(), String> {
        if self.windows.is_type1(rkey) {
            return Err(format!(
                "rkey {rkey:#x} is a type-1 window: bind it with length 0 to end it"
            ));
        }
        if !self.invalidate_window(rkey) {
            return Err(format!("rkey {rkey:#x} is no bound memory window"));
        }
        Ok(())
    }

    /// Whether `rkey` is a bound window's rkey now.
    pub fn window_bound(&self, rkey: u32) -> bool {
        self.windows.is_bound(rkey)
    }

    /// A window over region `lkey` ended: the region may be deregistered once none is left.
    fn release_window_of(&self, lkey: Option<u32>) {
        if let Some(lkey) = lkey
            && let Some(r) = self.tables.read_recursive().by_lkey.get(lkey)
        {
            r.own.windows.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Memory windows bound now.
    pub fn windows_bound(&self) -> usize {
        self.windows.bound()
    }

    /// Bytes this table keeps pinned (pages shared by regions counted once).
    pub fn pinned_bytes(&self) -> u64 {
        self.tables.read_recursive().pinned_bytes()
    }

    /// Marks the regions of `lkeys` as named by one more (`up`) or one fewer work request.
    /// Unknown keys are skipped: the engine fails such a WR with LOC_PROT_ERR.
    pub fn hold(&self, lkeys: &[u32], up: bool) {
        self.tables.read_recursive().by_lkey.hold(lkeys, up);
    }

    /// Regions with any remote access, for a connection handshake.
    pub fn exposed(&self) -> Vec<Arc<Region>> {
        self.tables.read_recursive().by_lkey.exposed()
    }

    /// A view for the engine, holding the table's read lock: no region can be deregistered
    /// while a view exists.
    pub fn view(&self) -> MemView<'_> {
        MemView {
            t: self.tables.read_recursive(),
            w: &self.windows,
            qpn: Cell::new(0),
            held: RefCell::new(SmallVec::new()),
        }
    }
}

/// Refuses to remove a region while memory windows are bound in it (as verbs refuses
/// `ibv_dereg_mr` then).
fn windows_bound(r: &Region) -> Result<()> {
    let w = r.own.windows.load(Ordering::Acquire);
    if w > 0 {
        return Err(Error::new(
            ErrorKind::Busy,
            format!(
                "memory region lkey {:#x} has {w} memory window(s) bound: invalidate them first",
                r.lkey
            ),
        ));
    }
    Ok(())
}

impl crate::mem::Registrar for MrTable {
    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: u32,
    ) -> Result<crate::mem::MrKeys> {
        // SAFETY: the trait's contract is this function's (valid until deregistered).
        unsafe { MrTable::register(self, addr, len, access) }.map(|r| r.keys())
    }

    fn deregister(&self, lkey: u32) -> Result<()> {
        MrTable::deregister(self, lkey)
    }
}

/// The engine's access path to registered memory (see `MrTable::view`).
///
/// Remote keys are looked up for the QP the view serves ([`MemView::set_qp`], set by the
/// QP before it hands the view to the engine): a memory window answers only requests that
/// arrived on the QP it is bound to.
pub struct MemView<'a> {
    t: RwLockReadGuard<'a, Tables>,
    w: &'a WindowTable,
    /// The QP whose requests the engine serves now (0, a number no QP has: no window).
    qpn: Cell<u32>,
    /// Windows lent as slices ([`Memory::slice`]): kept from invalidation until the view
    /// is dropped, which is when the slices' lifetime ends.
    held: RefCell<SmallVec<[Held<'a>; 4]>>,
}

impl<'a> MemView<'a> {
    /// Remote keys are looked up for QP `qpn` from now on.
    pub fn set_qp(&self, qpn: u32) {
        self.qpn.set(qpn);
    }

    /// The address of `[addr, addr + len)` behind `key` with `need`, and the hold on the
    /// window when `key` is one (released when dropped).
    fn find(
        &self,
        key: Key,
        addr: u64,
        len: u64,
        need: u32,
    ) -> std::result::Result<(*mut u8, Option<Held<'a>>), MemError> {
        let r = match key {
            Key::Local(k) => self.t.by_lkey.get(k),
            Key::Remote(k) if k & WINDOW_TAG != 0 => {
                let held = self.w.lookup(k, self.qpn.get(), addr, len, need)?;
                return Ok((addr as *mut u8, Some(held)));
            }
            Key::Remote(k) => self.t.by_rkey.get(&k),
        }
        .ok_or(MemError::BadKey)?;
        if r.access & need != need {
            return Err(MemError::Access);
        }
        if !r.covers(addr, len) {
            return Err(MemError::Range);
        }
        Ok((addr as *mut u8, None))
    }
}

impl Drop for MemView<'_> {
    fn drop(&mut self) {
        // The slices lent from windows end here: their holds go (explicitly first, before
        // the read guard, though either order is sound).
        self.held.get_mut().clear();
    }
}

impl Memory for MemView<'_> {
    fn read(
        &self,
        key: Key,
        addr: u64,
        out: &mut [u8],
        need: u32,
    ) -> std::result::Result<(), MemError> {
        let (p, _held) = self.find(key, addr, out.len() as u64, need)?;
        // SAFETY: `find` checked that [addr, addr + len) lies in a registered region, which
        // the registration contract keeps valid while the table holds it (and the read
        // guard in `self` keeps it from being deregistered; a window's hold, `_held`, keeps
        // it from being invalidated until the copy is done). Raw copies, no references to
        // caller memory are formed.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn write(
        &mut self,
        key: Key,
        addr: u64,
        data: &[u8],
        need: u32,
    ) -> std::result::Result<(), MemError> {
        let (p, _held) = self.find(key, addr, data.len() as u64, need | access::LOCAL_WRITE)?;
        // SAFETY: as in `read`; the region was registered with LOCAL_WRITE, i.e. the caller
        // allowed rdmx to write it (a window carries LOCAL_WRITE only when its region has it).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        Ok(())
    }

    fn check(&self, key: Key, addr: u64, len: u64, need: u32) -> std::result::Result<(), MemError> {
        self.find(key, addr, len, need).map(|_| ())
    }

    fn slice(&self, key: Key, addr: u64, len: usize, need: u32) -> Option<&[u8]> {
        let (p, held) = self.find(key, addr, len as u64, need).ok()?;
        if let Some(h) = held {
            // Kept until the view goes (the slice's lifetime), once per window.
            let mut v = self.held.borrow_mut();
            if !v.iter().any(|k| k.id() == h.id()) {
                v.push(h);
            }
        }
        // SAFETY: as in `read`: the range is registered and in bounds, and the slice lives
        // no longer than this view (and so the read guard; deregistration waits for it, and
        // the window's hold, kept in `held` until the view is dropped, makes invalidation wait).
        // Deviation, on purpose: a `&[u8]` promises nobody writes meanwhile, but the
        // application (against verbs rules: a buffer named by an outstanding send is not
        // to be modified) or a peer's RDMA WRITE into a region exposed for remote writes
        // may change these bytes while the ICRC is computed over them and the kernel copies
        // them, as a host may change memory a NIC is DMAing from. The slice is only read
        // byte-wise (CRC) and handed to sendmsg, never used to decide control flow, so the
        // worst outcome is a packet whose ICRC does not match: the peer drops it and the
        // requester retransmits. Copying every payload instead would cost the zero-copy send.
        Some(unsafe { std::slice::from_raw_parts(p, len) })
    }

    /// A SEND_WITH_INVALIDATE from QP `qpn`'s peer (see [`WindowTable::invalidate_remote`]).
    /// The view's own holds on the window (slices it lent) are not waited for: they are
    /// this very caller's, and the bytes they lend stay valid until the view is dropped
    /// (the region cannot be deregistered while the view's read guard lives).
    fn invalidate_remote(&mut self, qpn: u32, rkey: u32) -> std::result::Result<u32, MemError> {
        let own = self.w.hold_id(rkey).map_or(0, |id| {
            u32::from(self.held.get_mut().iter().any(|h| h.id() == id))
        });
        let lkey = self.w.invalidate_remote(rkey, qpn, own)?;
        // The window no longer keeps its region from deregistration.
        if let Some(r) = self.t.by_lkey.get(lkey) {
            r.own.windows.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(lkey)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Registers a test buffer.
    fn reg(t: &MrTable, addr: *mut u8, len: usize, access: u32) -> Result<Arc<Region>> {
        // SAFETY: every test's buffer outlives its table's use of it (the table and its
        // views are dropped, or the region deregistered, before the buffer).
        unsafe { t.register(addr, len, access) }
    }

    /// A view held by one thread (the receive path, which then waits for a QP lock), a
    /// `register` waiting for the write lock, and a `hold` from a third thread (a post that
    /// holds that QP's lock): the `hold` must not queue behind the writer, or the three
    /// deadlock.
    #[test]
    fn a_waiting_writer_does_not_block_readers_while_a_view_is_held() {
        let t = MrTable::default();
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 64];
        let r = reg(&t, a.as_mut_ptr(), 64, access::LOCAL_WRITE).unwrap();
        let b_addr = b.as_mut_ptr() as usize;
        let view = t.view();
        std::thread::scope(|s| {
            let writer = s.spawn(|| reg(&t, b_addr as *mut u8, 64, access::LOCAL_WRITE));
            // Wait (bounded) until the writer is queued: a plain `try_read` then fails.
            let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while t.tables.try_read().is_some() {
                assert!(std::time::Instant::now() < end, "the writer never queued");
                std::thread::yield_now();
            }
            let (tx, rx) = std::sync::mpsc::channel();
            let t2 = &t;
            s.spawn(move || {
                t2.hold(&[r.lkey], true);
                t2.hold(&[r.lkey], false);
                let _ = tx.send(());
            });
            let held = rx.recv_timeout(std::time::Duration::from_secs(10));
            drop(view);
            assert!(held.is_ok(), "hold() blocked behind a waiting writer");
            writer
                .join()
                .unwrap()
                .expect("register after the view is gone");
        });
        drop(b);
    }

    #[test]
    fn keys_are_random_and_access_is_checked() {
        let t = MrTable::default();
        let mut buf = vec![7u8; 64];
        let ro = reg(&t, buf.as_mut_ptr(), 32, access::REMOTE_READ).unwrap();
        let rw = reg(
            &t,
            unsafe_offset(&mut buf, 32),
            32,
            access::LOCAL_WRITE | access::REMOTE_WRITE,
        )
        .unwrap();
        assert_ne!(ro.lkey, ro.rkey);
        assert_ne!(ro.rkey.wrapping_add(1), rw.rkey, "not sequential");
        let e = reg(&t, buf.as_mut_ptr(), 8, access::REMOTE_WRITE).unwrap_err();
        assert!(e.message().contains("require LOCAL_WRITE"), "{e}");
        let e = reg(&t, buf.as_mut_ptr(), 8, 1 << 12).unwrap_err();
        assert!(e.message().contains("unknown bits"), "{e}");

        let mut v = t.view();
        let mut out = [0u8; 4];
        v.read(Key::Remote(ro.rkey), ro.addr, &mut out, access::REMOTE_READ)
            .unwrap();
        assert_eq!(out, [7; 4]);
        assert_eq!(
            v.write(Key::Remote(ro.rkey), ro.addr, &[1], access::REMOTE_WRITE),
            Err(MemError::Access)
        );
        assert_eq!(
            v.read(
                Key::Remote(ro.rkey),
                ro.addr + 30,
                &mut out,
                access::REMOTE_READ
            ),
            Err(MemError::Range)
        );
        v.write(Key::Remote(rw.rkey), rw.addr, &[1, 2], access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(
            v.read(Key::Local(12345), 0, &mut out, 0),
            Err(MemError::BadKey)
        );
        drop(v);
        assert_eq!(&buf[32..34], &[1, 2]);
    }

    #[test]
    fn deregister_waits_for_work_requests_in_flight() {
        let t = MrTable::default();
        let mut buf = vec![0u8; 16];
        let r = reg(&t, buf.as_mut_ptr(), 16, access::LOCAL_WRITE).unwrap();
        t.hold(&[r.lkey], true);
        let e = t.deregister(r.lkey).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy);
        t.hold(&[r.lkey], false);
        t.deregister(r.lkey).unwrap();
        assert_eq!(
            t.deregister(r.lkey).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    /// `revoke` (verbs' dereg) with a work request in flight: accepted; afterwards the
    /// engine's accesses through either key fail instead of touching the memory, and the
    /// late `hold(.., false)` of that work request is harmless.
    #[test]
    fn revoke_with_work_requests_in_flight_makes_later_accesses_fail() {
        let t = MrTable::default();
        let mut buf = vec![0u8; 16];
        let flags = access::LOCAL_WRITE | access::REMOTE_WRITE;
        let r = reg(&t, buf.as_mut_ptr(), 16, flags).unwrap();
        t.hold(&[r.lkey], true);
        assert_eq!(t.deregister(r.lkey).unwrap_err().kind(), ErrorKind::Busy);
        t.revoke(r.lkey).unwrap();
        assert_eq!(t.pinned_bytes(), 0);
        let mut v = t.view();
        let local = v.write(Key::Local(r.lkey), r.addr, &[1], 0);
        let remote = v.write(Key::Remote(r.rkey), r.addr, &[1], access::REMOTE_WRITE);
        assert_eq!(
            (local, remote),
            (Err(MemError::BadKey), Err(MemError::BadKey))
        );
        drop(v);
        t.hold(&[r.lkey], false);
        assert_eq!(buf, [0u8; 16], "memory untouched after revoke");
        assert_eq!(
            t.revoke(r.lkey).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn pages_are_pinned_once_and_unpinned_by_the_last_region() {
        let t = MrTable::default();
        let ps = page_size() as usize;
        let mut buf = vec![0u8; 4 * ps];
        let base = buf.as_mut_ptr();
        let start = base as usize;
        let aligned = start.div_ceil(ps) * ps - start; // first page boundary in buf
        // SAFETY: offsets stay inside `buf`.
        let p0 = unsafe { base.add(aligned) };
        let a = reg(&t, p0, ps, access::LOCAL_WRITE).unwrap();
        assert_eq!(t.pinned_bytes(), ps as u64);
        // Overlapping the same page and the next: one more page pinned, not two.
        // SAFETY: inside `buf`.
        let b = reg(&t, unsafe { p0.add(ps / 2) }, ps, access::LOCAL_WRITE).unwrap();
        assert_eq!(t.pinned_bytes(), 2 * ps as u64);
        t.deregister(a.lkey).unwrap();
        assert_eq!(t.pinned_bytes(), 2 * ps as u64, "b still pins both pages");
        t.deregister(b.lkey).unwrap();
        assert_eq!(t.pinned_bytes(), 0);
    }

    /// SEND_WITH_INV through the engine's view: only a verbs type-2 window bound to the
    /// view's QP may be invalidated (not a region's rkey, a type-1 window, a window of
    /// another QP or a messenger window); a view that lent a slice of the window itself
    /// does not wait for its own hold; the region may be deregistered afterwards.
    #[test]
    fn remote_invalidation_takes_only_a_type2_window_of_the_qp() {
        let t = MrTable::default();
        let mut buf = vec![3u8; 8192];
        let r = reg(&t, buf.as_mut_ptr(), 8192, access::LOCAL_WRITE).unwrap();
        let rights = access::REMOTE_READ | access::REMOTE_WRITE;
        let mw2 = t.alloc_mw().unwrap();
        t.bind_mw(mw2, false, 0x42, r.lkey, r.addr, 4096, rights)
            .unwrap();
        let mw1 = t.alloc_mw().unwrap();
        t.bind_mw(mw1, true, ANY_QP, r.lkey, r.addr, 4096, rights)
            .unwrap();
        let msgr = t.bind_window(0x42, r.lkey, r.addr, 64, rights).unwrap();
        let mut v = t.view();
        v.set_qp(0x42);
        assert_eq!(
            v.invalidate_remote(0x42, r.rkey),
            Err(MemError::BadKey),
            "region"
        );
        assert_eq!(
            v.invalidate_remote(0x42, mw1),
            Err(MemError::BadKey),
            "type 1"
        );
        assert_eq!(
            v.invalidate_remote(0x42, msgr),
            Err(MemError::BadKey),
            "messenger's"
        );
        assert_eq!(
            v.invalidate_remote(0x43, mw2),
            Err(MemError::BadKey),
            "another QP"
        );
        // A slice of the window lent by this very view: no wait for itself.
        let lent = v.slice(Key::Remote(mw2), r.addr, 8, access::REMOTE_READ);
        assert_eq!(lent, Some(&[3u8; 8][..]));
        assert_eq!(v.invalidate_remote(0x42, mw2), Ok(r.lkey));
        assert_eq!(
            v.invalidate_remote(0x42, mw2),
            Err(MemError::BadKey),
            "once"
        );
        assert_eq!(
            v.check(Key::Remote(mw2), r.addr, 8, access::REMOTE_READ),
            Err(MemError::BadKey)
        );
        drop(v);
        assert!(!t.window_bound(mw2));
        assert!(t.window_bound(mw1) && t.window_bound(msgr));
        assert!(t.dealloc_mw(mw1) && t.dealloc_mw(mw2));
        assert!(t.invalidate_window(msgr));
        t.deregister(r.lkey).expect("no window left on the region");
        drop(buf);
    }

    /// A region without remote rights: its rkey opens nothing; a window over part of it
    /// answers only its QP, inside its range; a slice lent from it keeps invalidation
    /// waiting until the view goes; the region cannot be deregistered while it is bound.
    #[test]
    fn windows_scope_remote_access_to_a_qp_and_a_range() {
        let t = MrTable::default();
        let mut buf = vec![5u8; 8192];
        let r = reg(&t, buf.as_mut_ptr(), 8192, access::LOCAL_WRITE).unwrap();
        let mut out = [0u8; 8];
        let v = t.view();
        v.set_qp(0x42);
        assert_eq!(
            v.read(Key::Remote(r.rkey), r.addr, &mut out, access::REMOTE_READ),
            Err(MemError::Access),
            "the region's own rkey"
        );
        drop(v);
        let rights = access::REMOTE_READ | access::REMOTE_WRITE;
        let k = t
            .bind_window(0x42, r.lkey, r.addr + 4096, 4096, rights)
            .unwrap();
        assert_ne!(k, r.rkey);
        let e = t
            .bind_window(0x42, r.lkey, r.addr + 4096, 8192, rights)
            .unwrap_err();
        assert!(e.message().contains("not inside"), "{e}");
        assert_eq!(t.deregister(r.lkey).unwrap_err().kind(), ErrorKind::Busy);
        let mut v = t.view();
        v.set_qp(0x43);
        assert_eq!(
            v.read(Key::Remote(k), r.addr + 4096, &mut out, access::REMOTE_READ),
            Err(MemError::BadKey),
            "another QP"
        );
        v.set_qp(0x42);
        v.write(Key::Remote(k), r.addr + 4096, &[9; 8], access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(
            v.read(Key::Remote(k), r.addr, &mut out, access::REMOTE_READ),
            Err(MemError::Range)
        );
        let lent = v.slice(Key::Remote(k), r.addr + 4096, 8, access::REMOTE_READ);
        assert_eq!(lent, Some(&[9u8; 8][..]));
        std::thread::scope(|s| {
            let inv = s.spawn(|| t.invalidate_window(k));
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!inv.is_finished(), "invalidated while a slice is lent");
            drop(v);
            assert!(inv.join().unwrap());
        });
        let v = t.view();
        v.set_qp(0x42);
        assert_eq!(
            v.read(Key::Remote(k), r.addr + 4096, &mut out, access::REMOTE_READ),
            Err(MemError::BadKey),
            "after invalidation"
        );
        drop(v);
        assert_eq!(t.windows_bound(), 0);
        t.deregister(r.lkey).unwrap();
        assert_eq!(&buf[4096..4104], &[9; 8]);
    }

    /// Verbs windows through the table: the bind's checks (range, LOCAL_WRITE for a
    /// writable window, length 0 only for type 1), a local invalidate refused for type 1,
    /// deregistration refused while bound, deallocation ending a bound window.
    #[test]
    fn verbs_windows_check_what_verbs_checks() {
        let t = MrTable::default();
        let mut buf = vec![0u8; 8192];
        let r = reg(&t, buf.as_mut_ptr(), 8192, access::LOCAL_WRITE).unwrap();
        let ro = reg(&t, unsafe_offset(&mut buf, 4096), 64, 0).unwrap();
        let mw = t.alloc_mw().unwrap();
        let next = |k: u32| (k & !0xff) | (k.wrapping_add(1) & 0xff);
        let k = next(mw);
        let w = access::REMOTE_WRITE;
        let e = t
            .bind_mw(k, false, 9, r.lkey, r.addr + 8000, 256, w)
            .unwrap_err();
        assert!(e.contains("not inside"), "{e}");
        let e = t.bind_mw(k, false, 9, ro.lkey, ro.addr, 64, w).unwrap_err();
        assert!(e.contains("LOCAL_WRITE"), "{e}");
        let e = t.bind_mw(k, false, 9, r.lkey, r.addr, 0, w).unwrap_err();
        assert!(e.contains("length 0"), "{e}");
        t.bind_mw(k, false, 9, r.lkey, r.addr, 4096, w | access::LOCAL_WRITE)
            .unwrap();
        assert!(t.window_bound(k));
        assert_eq!(t.deregister(r.lkey).unwrap_err().kind(), ErrorKind::Busy);
        let mut v = t.view();
        v.set_qp(9);
        v.write(Key::Remote(k), r.addr, &[3; 8], access::REMOTE_WRITE)
            .unwrap();
        drop(v);
        t.invalidate_mw(k).unwrap();
        assert!(t.invalidate_mw(k).is_err(), "once");
        // Type 1: bound for every QP; a local invalidate may not end it; length 0 does.
        let k1 = next(k);
        t.bind_mw(k1, true, 9, r.lkey, r.addr, 64, access::REMOTE_READ)
            .unwrap();
        let v = t.view();
        v.set_qp(1234);
        let mut out = [0u8; 8];
        v.read(Key::Remote(k1), r.addr, &mut out, access::REMOTE_READ)
            .unwrap();
        assert_eq!(out, [3; 8]);
        drop(v);
        assert!(t.invalidate_mw(k1).unwrap_err().contains("type-1"));
        t.bind_mw(next(k1), true, 9, r.lkey, r.addr, 0, 0).unwrap();
        assert!(!t.window_bound(k1));
        t.bind_mw(
            next(next(k1)),
            true,
            9,
            r.lkey,
            r.addr,
            64,
            access::REMOTE_READ,
        )
        .unwrap();
        assert!(t.dealloc_mw(mw));
        assert!(!t.dealloc_mw(mw), "once");
        assert_eq!(t.windows_bound(), 0);
        t.deregister(r.lkey).unwrap();
        t.deregister(ro.lkey).unwrap();
    }

    fn unsafe_offset(buf: &mut [u8], at: usize) -> *mut u8 {
        buf[at..].as_mut_ptr()
    }
}

//! Memory windows of the soft provider: remote access to a byte range of a registered
//! region, granted to one QP and revoked when its use ends (verbs' type-2 memory windows,
//! `ibv_alloc_mw` + `IBV_WR_BIND_MW` + local invalidate, in one call each).
//!
//! A window's rkey is valid only in requests that arrive on the QP it is bound to, only for
//! its range and rights, and only until it is invalidated: the messenger binds one over the
//! chunks it exposes to a peer (rendezvous data, a receive granted for eager writes), so
//! an authenticated peer reaches the bytes meant for its own session and nothing else of
//! the pool, whose registration then carries no remote right at all.
//!
//! Two ways to use a slot:
//! - [`WindowTable::bind`] / [`WindowTable::invalidate`]: a slot is taken at bind and given
//!   back at invalidation (the messenger's windows on the soft provider);
//! - verbs memory windows (`rdmx-ibv`: `ibv_alloc_mw`, `IBV_WR_BIND_MW`, `ibv_bind_mw`,
//!   `IBV_WR_LOCAL_INV`, `ibv_dealloc_mw`): [`WindowTable::alloc`] reserves a slot for the
//!   window's life and gives its rkey; [`WindowTable::bind_mw`] binds it with the rkey the
//!   application chose (verbs lets it change the low 8 bits, the "key", at each bind:
//!   `ibv_inc_rkey`), type 2 to one QP, type 1 to every QP ([`ANY_QP`]); invalidation
//!   leaves the slot reserved; [`WindowTable::dealloc`] gives it back.
//!
//! rkey layout: bit 31 is [`WINDOW_TAG`] (a region's rkey never has it), bits 8..28 the
//! slot index, bits 28..31 and 0..8 change with each window bound in the slot (random for
//! the messenger's; for a verbs window bits 28..31 are fixed at alloc and bits 0..8 are the
//! application's key), so a stale rkey does not name the slot's next window.
//!
//! Cost, by design: binding and invalidating never take the region table's write lock and
//! make no system call. A window is a slot of a table allocated in segments on first use
//! (4,096 slots each, at most [`MAX_WINDOWS`]); free slots are kept in a few lists, each
//! behind its own short mutex, chosen by QP number. A lookup (one per request and per
//! packet, by the RC responder) is a slot index taken from the rkey, one increment and one
//! decrement of the slot's reader count and a few loads.
//!
//! Invalidation is synchronous, as a NIC's local invalidate completes only when no access
//! through the window can follow: the slot's key is cleared first, then invalidation waits
//! until no lookup that saw the old key is still using the memory (the reader count; a
//! zero-copy READ response keeps its count until its packets are handed to the kernel).
//! Only then may the caller reuse the memory for another session.

use crate::error::{Error, ErrorKind, Result};
use crate::rc::memory::MemError;
use parking_lot::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The rkey bit that marks a window (memory regions' rkeys never have it).
pub const WINDOW_TAG: u32 = 1 << 31;
/// Slot index bits of a window rkey (bits `INDEX_SHIFT..INDEX_SHIFT + INDEX_BITS`).
const INDEX_BITS: u32 = 20;
const INDEX_SHIFT: u32 = 8;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
/// The bits of an rkey that change with each window bound in a slot: the low 8 (verbs'
/// "key") and the 3 between the index and the tag.
const GEN_MASK: u32 = 0xff | (0x7 << (INDEX_SHIFT + INDEX_BITS));
/// A verbs window's "key" byte (the application's, at each bind).
pub const KEY_MASK: u32 = 0xff;
/// The QP number of a window bound to every QP (a verbs type-1 window); no QP has it
/// (QP numbers are 24 bits).
pub const ANY_QP: u32 = u32::MAX;
/// `Slot::key` while a verbs window is being bound (never a window's rkey: no tag).
const BINDING: u32 = 1;

/// The slot index of a window rkey.
fn index_of(rkey: u32) -> u32 {
    (rkey >> INDEX_SHIFT) & INDEX_MASK
}

/// Why a verbs window bind was refused (the bind's completion is IBV_WC_MW_BIND_ERR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MwBindError {
    /// The window is not allocated (or was deallocated), or the new rkey names another one.
    NoWindow,
    /// A type-2 window is bound already: invalidate it first.
    Bound,
}
const SEG_BITS: u32 = 12;
const SEG_SLOTS: usize = 1 << SEG_BITS;
const SEGS: usize = 1 << (INDEX_BITS - SEG_BITS);
/// Most windows bound at once per device.
pub const MAX_WINDOWS: usize = SEG_SLOTS * SEGS;
const FREE_LISTS: usize = 8;

#[derive(Debug, Default)]
struct Slot {
    /// The bound window's rkey; 0 when free or invalidated.
    key: AtomicU32,
    qpn: AtomicU32,
    access: AtomicU32,
    /// The lkey of the region the window lies in.
    lkey: AtomicU32,
    addr: AtomicU64,
    len: AtomicU64,
    /// Lookups that saw `key` and may still touch the memory.
    readers: AtomicU32,
    /// The generation of the last window bound here.
    last_gen: AtomicU32,
    /// A verbs window owns the slot (from `alloc` to `dealloc`): its rkey with the key
    /// byte cleared; 0 when the slot serves `bind`/`invalidate`.
    mw: AtomicU32,
}

/// A lookup's hold on a window: the memory stays the window's until it is released.
pub struct Held<'a> {
    slot: &'a Slot,
}

impl Held<'_> {
    /// An identity for de-duplicating holds (the slot's address).
    pub(super) fn id(&self) -> usize {
        self.slot as *const Slot as usize
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.slot.readers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The windows of one device.
#[derive(Debug)]
pub struct WindowTable {
    segs: Box<[OnceLock<Box<[Slot]>>]>,
    free: [Mutex<Vec<u32>>; FREE_LISTS],
    /// Segments allocated (under its lock: only growth takes it).
    grown: Mutex<usize>,
    /// Windows bound now.
    bound: AtomicUsize,
    /// The generation source (SplitMix64 over a random seed).
    seq: AtomicU64,
}

impl Default for WindowTable {
    fn default() -> Self {
        let seed = super::sys::try_random_u32().unwrap_or(0x5eed_1e55);
        WindowTable {
            segs: (0..SEGS).map(|_| OnceLock::new()).collect(),
            free: Default::default(),
            grown: Mutex::new(0),
            bound: AtomicUsize::new(0),
            seq: AtomicU64::new(u64::from(seed) << 32 | u64::from(seed)),
        }
    }
}

/// Spins this long before an invalidation waiting for a lookup logs it.
const SLOW_INVALIDATE: Duration = Duration::from_secs(1);

impl WindowTable {
    fn slot(&self, index: u32) -> Option<&Slot> {
        let i = index as usize;
        let seg = self.segs.get(i >> SEG_BITS)?.get()?;
        seg.get(i & (SEG_SLOTS - 1))
    }

    /// Windows bound now.
    pub fn bound(&self) -> usize {
        self.bound.load(Ordering::Relaxed)
    }

    fn next_gen(&self) -> u32 {
        let mut z = self
            .seq
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) as u32) & GEN_MASK
    }

    /// Publishes a window in slot `s` (whose `key` the caller owns: 0 or [`BINDING`]).
    #[allow(clippy::too_many_arguments)]
    fn publish(&self, s: &Slot, rkey: u32, qpn: u32, lkey: u32, addr: u64, len: u64, access: u32) {
        s.last_gen.store(rkey & GEN_MASK, Ordering::Relaxed);
        s.qpn.store(qpn, Ordering::Relaxed);
        s.access.store(access, Ordering::Relaxed);
        s.lkey.store(lkey, Ordering::Relaxed);
        s.addr.store(addr, Ordering::Relaxed);
        s.len.store(len, Ordering::Relaxed);
        // Publishes the fields above to every lookup that sees this key.
        s.key.store(rkey, Ordering::SeqCst);
        self.bound.fetch_add(1, Ordering::Relaxed);
    }

    /// A free slot index, from `qpn`'s list first, then the others, then a new segment.
    fn take(&self, qpn: u32) -> Result<u32> {
        let home = qpn as usize % FREE_LISTS;
        for k in 0..FREE_LISTS {
            if let Some(i) = self.free[(home + k) % FREE_LISTS].lock().pop() {
                return Ok(i);
            }
        }
        let mut grown = self.grown.lock();
        // Another thread may have grown meanwhile: look once more in our list.
        if let Some(i) = self.free[home].lock().pop() {
            return Ok(i);
        }
        if *grown == SEGS {
            return Err(Error::new(
                ErrorKind::ResourceLimit,
                format!("memory windows: all {MAX_WINDOWS} of the device are bound"),
            ));
        }
        let s = *grown;
        let seg: Box<[Slot]> = (0..SEG_SLOTS).map(|_| Slot::default()).collect();
        let _ = self.segs[s].set(seg);
        *grown += 1;
        let first = (s * SEG_SLOTS) as u32;
        // Slot 0 of segment 0 is never used: its rkey could be the tag alone.
        let skip = u32::from(s == 0);
        self.free[home]
            .lock()
            .extend((first + skip + 1..first + SEG_SLOTS as u32).rev());
        Ok(first + skip)
    }

    /// Binds a window over `[addr, addr + len)` of the region `lkey` with `access`
    /// (REMOTE_READ / REMOTE_WRITE, plus LOCAL_WRITE when the region has it) to QP `qpn`;
    /// returns its rkey. The caller checked the range and rights against the region.
    pub fn bind(&self, qpn: u32, lkey: u32, addr: u64, len: u64, access: u32) -> Result<u32> {
        let index = self.take(qpn)?;
        let Some(s) = self.slot(index) else {
            return Err(Error::fixed(
                ErrorKind::Io,
                "memory windows: a slot vanished",
            ));
        };
        let mut generation = self.next_gen();
        if generation == s.last_gen.load(Ordering::Relaxed) {
            generation = generation.wrapping_add(1) & GEN_MASK;
        }
        let rkey = WINDOW_TAG | generation | index << INDEX_SHIFT;
        self.publish(s, rkey, qpn, lkey, addr, len, access);
        Ok(rkey)
    }

    /// Reserves a slot for a verbs memory window (`ibv_alloc_mw`) and returns its first
    /// rkey (not bound: it opens nothing until [`WindowTable::bind_mw`]).
    pub fn alloc(&self) -> Result<u32> {
        let index = self.take(0)?;
        let Some(s) = self.slot(index) else {
            return Err(Error::fixed(
                ErrorKind::Io,
                "memory windows: a slot vanished",
            ));
        };
        let rkey = WINDOW_TAG | self.next_gen() | index << INDEX_SHIFT;
        s.mw.store(rkey & !KEY_MASK, Ordering::Release);
        Ok(rkey)
    }

    /// Binds the verbs window whose rkey is `rkey` (its slot's fixed bits; the key byte is
    /// the application's) to QP `qpn` ([`ANY_QP`] for a type-1 window) over `[addr, addr +
    /// len)` of region `lkey` with `access`. A type-1 window bound already is rebound
    /// (its old rkey dies first); a type-2 one is refused ([`MwBindError::Bound`]). The
    /// caller checked the range and rights against the region.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_mw(
        &self,
        rkey: u32,
        type1: bool,
        qpn: u32,
        lkey: u32,
        addr: u64,
        len: u64,
        access: u32,
    ) -> std::result::Result<Option<u32>, MwBindError> {
        let s = self.mw_slot(rkey).ok_or(MwBindError::NoWindow)?;
        let mut old_lkey = None;
        if s.key
            .compare_exchange(0, BINDING, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            if !type1 {
                return Err(MwBindError::Bound);
            }
            let old = s.key.load(Ordering::SeqCst);
            if old == BINDING || old == 0 {
                return Err(MwBindError::Bound);
            }
            old_lkey = Some(self.invalidate(old).ok_or(MwBindError::Bound)?);
            s.key
                .compare_exchange(0, BINDING, Ordering::SeqCst, Ordering::SeqCst)
                .map_err(|_| MwBindError::Bound)?;
        }
        self.publish(s, rkey, qpn, lkey, addr, len, access);
        Ok(old_lkey)
    }

    /// The slot of the verbs window `rkey` names (its fixed bits match), if allocated.
    fn mw_slot(&self, rkey: u32) -> Option<&Slot> {
        if rkey & WINDOW_TAG == 0 {
            return None;
        }
        let s = self.slot(index_of(rkey))?;
        let base = s.mw.load(Ordering::Acquire);
        (base != 0 && base == rkey & !KEY_MASK).then_some(s)
    }

    /// Unbinds the verbs window `rkey` names (whatever its key byte): a type-1 bind of
    /// length 0. Returns the lkey of the region it was bound in, if it was bound.
    pub fn unbind(&self, rkey: u32) -> std::result::Result<Option<u32>, MwBindError> {
        let s = self.mw_slot(rkey).ok_or(MwBindError::NoWindow)?;
        let bound = s.key.load(Ordering::SeqCst);
        Ok(if bound & WINDOW_TAG != 0 {
            self.invalidate(bound)
        } else {
            None
        })
    }

    /// Whether `rkey` is bound now to every QP (a verbs type-1 window, which a local
    /// invalidate may not end, o10-37.2.26).
    pub fn is_type1(&self, rkey: u32) -> bool {
        self.is_bound(rkey)
            && self
                .slot(index_of(rkey))
                .is_some_and(|s| s.qpn.load(Ordering::Relaxed) == ANY_QP)
    }

    /// Whether `rkey` is the rkey of a bound window now.
    pub fn is_bound(&self, rkey: u32) -> bool {
        rkey & WINDOW_TAG != 0
            && self
                .slot(index_of(rkey))
                .is_some_and(|s| s.key.load(Ordering::SeqCst) == rkey)
    }

    /// `ibv_dealloc_mw`: invalidates the verbs window `rkey` names if it is bound (the lkey
    /// of its region is returned then), and gives its slot back. Err when `rkey` names no
    /// allocated window.
    pub fn dealloc(&self, rkey: u32) -> std::result::Result<Option<u32>, MwBindError> {
        let lkey = self.unbind(rkey)?;
        let s = self.mw_slot(rkey).ok_or(MwBindError::NoWindow)?;
        s.mw.store(0, Ordering::Release);
        let index = index_of(rkey);
        self.free[0].lock().push(index);
        Ok(lkey)
    }

    /// Invalidates the window `rkey`: when this returns no access through it is in
    /// progress or can start. Returns the lkey of its region; None when `rkey` is not a
    /// bound window (already invalidated, or never bound).
    pub fn invalidate(&self, rkey: u32) -> Option<u32> {
        self.invalidate_holding(rkey, 0)
    }

    /// A SEND_WITH_INVALIDATE's invalidation of `rkey` for a request on QP `qpn` (rxe
    /// `rxe_invalidate_mw`; stricter than rxe, as the IBA asks, in also requiring the
    /// window to be bound to that QP): it must be a verbs type-2 window bound now to
    /// `qpn`. A region's rkey, a type-1 window, a window bound to another QP and the
    /// messenger's windows (their life is the messenger's: a peer cannot end them) are
    /// refused as a bad key. `own` is how many holds on this window the caller has (its
    /// memory view's lent slices): the wait for accesses in progress leaves those out, or
    /// it would wait for itself for ever. Returns the lkey of the region.
    pub fn invalidate_remote(
        &self,
        rkey: u32,
        qpn: u32,
        own: u32,
    ) -> std::result::Result<u32, MemError> {
        let s = self.mw_slot(rkey).ok_or(MemError::BadKey)?;
        let bound_to = s.qpn.load(Ordering::Relaxed);
        if s.key.load(Ordering::SeqCst) != rkey || bound_to == ANY_QP || bound_to != qpn {
            return Err(MemError::BadKey);
        }
        self.invalidate_holding(rkey, own).ok_or(MemError::BadKey)
    }

    /// The identity [`Held::id`] gives a hold on window `rkey`'s slot.
    pub(super) fn hold_id(&self, rkey: u32) -> Option<usize> {
        self.slot(index_of(rkey)).map(|s| s as *const Slot as usize)
    }

    /// [`WindowTable::invalidate`], waiting only until `own` readers are left (the
    /// caller's own holds, which end after it returns).
    fn invalidate_holding(&self, rkey: u32, own: u32) -> Option<u32> {
        if rkey & WINDOW_TAG == 0 {
            return None;
        }
        let index = index_of(rkey);
        let s = self.slot(index)?;
        s.key
            .compare_exchange(rkey, 0, Ordering::SeqCst, Ordering::SeqCst)
            .ok()?;
        // A lookup increments `readers` before it loads `key` (both SeqCst): either it saw
        // the key cleared above, or this load sees its count.
        let start = Instant::now();
        let mut logged = false;
        while s.readers.load(Ordering::SeqCst) > own {
            if !logged && start.elapsed() > SLOW_INVALIDATE {
                logged = true;
                log::warn!(
                    target: "rdmx::soft",
                    "memory window {rkey:#x}: invalidation waits for an access still in progress"
                );
            }
            std::thread::yield_now();
        }
        let lkey = s.lkey.load(Ordering::Relaxed);
        // A verbs window keeps its slot until it is deallocated.
        if s.mw.load(Ordering::Acquire) == 0 {
            let home = s.qpn.load(Ordering::Relaxed) as usize % FREE_LISTS;
            self.free[home].lock().push(index);
        }
        self.bound.fetch_sub(1, Ordering::Relaxed);
        Some(lkey)
    }

    /// Looks up window `rkey` for a request that arrived on QP `qpn`, for `[addr, addr +
    /// len)` with the rights `need`; returns the address and the hold that keeps the
    /// window from being invalidated meanwhile. A window bound to another QP is refused
    /// as an unknown key (a NIC's R_Key violation).
    pub fn lookup(
        &self,
        rkey: u32,
        qpn: u32,
        addr: u64,
        len: u64,
        need: u32,
    ) -> std::result::Result<Held<'_>, MemError> {
        let s = self.slot(index_of(rkey)).ok_or(MemError::BadKey)?;
        s.readers.fetch_add(1, Ordering::SeqCst);
        let held = Held { slot: s };
        if s.key.load(Ordering::SeqCst) != rkey || rkey == 0 {
            return Err(MemError::BadKey);
        }
        let bound_to = s.qpn.load(Ordering::Relaxed);
        if bound_to != qpn && bound_to != ANY_QP {
            return Err(MemError::BadKey);
        }
        if s.access.load(Ordering::Relaxed) & need != need {
            return Err(MemError::Access);
        }
        let (wa, wl) = (
            s.addr.load(Ordering::Relaxed),
            s.len.load(Ordering::Relaxed),
        );
        let end = addr.checked_add(len).ok_or(MemError::Range)?;
        if addr < wa || end > wa + wl {
            return Err(MemError::Range);
        }
        Ok(held)
    }
}

/// The windows of one soft QP's peer (the messenger's scope, `provider::windows`).
#[derive(Debug)]
pub struct SoftQpWindows {
    pub mrs: std::sync::Arc<super::mr::MrTable>,
    pub qpn: u32,
}

impl crate::provider::windows::QpWindows for SoftQpWindows {
    fn bind(&self, lkey: u32, addr: u64, len: u64, rights: u32) -> Result<u32> {
        self.mrs.bind_window(self.qpn, lkey, addr, len, rights)
    }

    fn invalidate(&self, rkey: u32) {
        self.mrs.invalidate_window(rkey);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rc::verbs::access;

    const RW: u32 = access::REMOTE_READ | access::REMOTE_WRITE | access::LOCAL_WRITE;

    #[test]
    fn a_window_answers_only_its_qp_range_and_rights_until_invalidated() {
        let t = WindowTable::default();
        let k = t.bind(0x11, 7, 0x1000, 0x100, access::REMOTE_READ).unwrap();
        assert_ne!(k & WINDOW_TAG, 0);
        let ok = t.lookup(k, 0x11, 0x1000, 0x100, access::REMOTE_READ);
        assert!(ok.is_ok());
        drop(ok);
        let err = |r: std::result::Result<Held<'_>, MemError>| r.err();
        assert_eq!(
            err(t.lookup(k, 0x12, 0x1000, 8, access::REMOTE_READ)),
            Some(MemError::BadKey),
            "another QP"
        );
        assert_eq!(
            err(t.lookup(k, 0x11, 0x10f9, 8, access::REMOTE_READ)),
            Some(MemError::Range)
        );
        assert_eq!(
            err(t.lookup(k, 0x11, 0xff8, 16, access::REMOTE_READ)),
            Some(MemError::Range)
        );
        assert_eq!(
            err(t.lookup(k, 0x11, 0x1000, 8, access::REMOTE_WRITE)),
            Some(MemError::Access)
        );
        assert_eq!(t.invalidate(k), Some(7));
        assert_eq!(t.invalidate(k), None, "once");
        assert_eq!(
            err(t.lookup(k, 0x11, 0x1000, 8, access::REMOTE_READ)),
            Some(MemError::BadKey)
        );
        // The slot is reused with another key: the old one stays dead.
        let k2 = t.bind(0x11, 7, 0x1000, 0x100, RW).unwrap();
        assert_ne!(k2, k);
        assert_eq!(
            err(t.lookup(k, 0x11, 0x1000, 8, access::REMOTE_READ)),
            Some(MemError::BadKey)
        );
        assert!(t.lookup(k2, 0x11, 0x1000, 8, access::REMOTE_WRITE).is_ok());
        assert_eq!(t.bound(), 1);
    }

    /// A verbs window: allocated unbound; bound with the application's key byte (type 2:
    /// once, to one QP; type 1: to every QP, rebound in place); invalidation keeps the
    /// slot reserved; deallocation ends a bound window and frees the slot.
    #[test]
    fn a_verbs_window_keeps_its_slot_and_takes_the_applications_key() {
        let t = WindowTable::default();
        let mw = t.alloc().unwrap();
        assert_ne!(mw & WINDOW_TAG, 0);
        assert!(
            t.lookup(mw, 5, 0, 8, access::REMOTE_READ).is_err(),
            "unbound"
        );
        let k = (mw & !KEY_MASK) | (mw.wrapping_add(1) & KEY_MASK);
        assert_eq!(
            t.bind_mw(k, false, 5, 9, 0x100, 64, access::REMOTE_READ),
            Ok(None)
        );
        assert!(t.lookup(k, 5, 0x100, 64, access::REMOTE_READ).is_ok());
        assert!(
            t.lookup(k, 6, 0x100, 8, access::REMOTE_READ).is_err(),
            "another QP"
        );
        assert_eq!(
            t.bind_mw(k, false, 5, 9, 0x100, 64, access::REMOTE_READ),
            Err(MwBindError::Bound)
        );
        // Another window's key (other fixed bits) is refused.
        let other = k ^ (1 << INDEX_SHIFT);
        assert_eq!(
            t.bind_mw(other, false, 5, 9, 0x100, 64, access::REMOTE_READ),
            Err(MwBindError::NoWindow)
        );
        assert_eq!(t.invalidate(k), Some(9));
        assert!(!t.is_bound(k));
        // Still reserved: a messenger bind does not get the slot.
        let m = t.bind(1, 2, 0, 8, access::REMOTE_READ).unwrap();
        assert_ne!(index_of(m), index_of(k));
        // Type 1: every QP; a rebind ends the old key.
        let k1 = (k & !KEY_MASK) | (k.wrapping_add(1) & KEY_MASK);
        assert_eq!(
            t.bind_mw(k1, true, ANY_QP, 9, 0, 64, access::REMOTE_READ),
            Ok(None)
        );
        assert!(t.is_type1(k1));
        assert!(t.lookup(k1, 77, 0, 8, access::REMOTE_READ).is_ok());
        let k2 = (k1 & !KEY_MASK) | (k1.wrapping_add(1) & KEY_MASK);
        assert_eq!(
            t.bind_mw(k2, true, ANY_QP, 9, 0, 64, access::REMOTE_READ),
            Ok(Some(9))
        );
        assert!(
            t.lookup(k1, 77, 0, 8, access::REMOTE_READ).is_err(),
            "old key dead"
        );
        assert_eq!(t.dealloc(k2), Ok(Some(9)), "bound: invalidated");
        assert!(t.lookup(k2, 77, 0, 8, access::REMOTE_READ).is_err());
        assert_eq!(t.dealloc(k2), Err(MwBindError::NoWindow), "once");
        assert_eq!(t.bound(), 1, "the messenger's window only");
    }

    #[test]
    fn invalidation_waits_for_an_access_in_progress() {
        let t = WindowTable::default();
        let k = t.bind(3, 1, 0, 64, access::REMOTE_READ).unwrap();
        let held = t.lookup(k, 3, 0, 64, access::REMOTE_READ).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                t.invalidate(k);
                done.store(true, Ordering::SeqCst);
            });
            // Bounded: the invalidation must still be waiting while the hold exists.
            for _ in 0..50 {
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(20));
            assert!(!done.load(Ordering::SeqCst), "returned during an access");
            drop(held);
            h.join().unwrap();
        });
        assert!(done.load(Ordering::SeqCst));
        assert!(t.lookup(k, 3, 0, 64, access::REMOTE_READ).is_err());
    }

    #[test]
    fn many_windows_grow_the_table_and_free_slots_are_reused() {
        let t = WindowTable::default();
        let keys: Vec<u32> = (0..(SEG_SLOTS as u32 + 10))
            .map(|i| t.bind(i, 1, 0, 8, access::REMOTE_READ).unwrap())
            .collect();
        let mut uniq = keys.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(uniq.len(), keys.len());
        assert_eq!(*t.grown.lock(), 2);
        for &k in &keys {
            assert!(t.invalidate(k).is_some());
        }
        assert_eq!(t.bound(), 0);
        for i in 0..SEG_SLOTS as u32 {
            t.bind(i, 1, 0, 8, access::REMOTE_READ).unwrap();
        }
        assert_eq!(*t.grown.lock(), 2, "reused, not grown");
    }
}

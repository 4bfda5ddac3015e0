//! Registration cache for caller-owned buffers, after UCX's `ucs_rcache`.
//!
//! Registering memory is slow (a syscall and page pinning on verbs, a table update on the
//! soft provider), and storage daemons send from and receive into the same buffers again
//! and again. [`RegCache::get`] returns a [`Handle`] whose lkey/rkey cover the caller's
//! range, reusing a cached registration when one covers the range with at least the
//! requested access rights; [`RegCache::put`] gives the handle back, and the registration
//! stays cached (least recently used first out) until it is evicted or invalidated.
//!
//! # How regions are made
//!
//! A miss registers a new region: the request aligned out to the page size (so buffers
//! that share pages share a region), merged with every cached region it overlaps (always:
//! valid regions never overlap, which makes a lookup one `BTreeMap` step) and with
//! page-adjacent cached regions that carry exactly the same access (never widening rights
//! across memory no request shared). The merged region carries the union of the rights
//! of everything it absorbed. The absorbed regions leave the lookup at once and are
//! deregistered when their last handle is put: a region is never deregistered while a
//! handle names it.
//!
//! # What callers must do before unmapping memory
//!
//! The cache cannot see `munmap`, `free` or `madvise(MADV_DONTNEED)`. Before memory that
//! went through [`RegCache::get`] is unmapped or given back to an allocator, the caller
//! must:
//! 1. let every work request that uses it complete (poll the completions);
//! 2. put (or [`RegCache::dereg`]) every handle it obtained for that memory;
//! 3. call [`RegCache::invalidate`] on the range (C: `rdmx_mem_invalidate(ctx, ptr, len)`),
//!    so that no later `get` reuses a registration of memory that is gone.
//!
//! Because regions are page-aligned and merged, a region that another handle still holds
//! can extend over the invalidated range; it stays registered until that handle is put
//! (on verbs the pages stay pinned, so that is safe for the NIC; on the soft provider the
//! region's rkey must not be used on the unmapped part). Callers that cannot accept this
//! turn merging off ([`RegCacheOptions::merge`]).
//!
//! # Failures
//!
//! A failed registration leaves the cache as it was (if a merged region cannot be
//! registered, the request alone is tried once more). A deregistration that fails with a
//! transient error (`Busy`: work requests in flight, `Full`, `Timeout`) is kept as
//! *pending* and retried on later misses, invalidations, [`RegCache::retry_pending`] and
//! drop; any other deregistration error is logged and the registration is given up on.

use super::{MrKeys, Registrar};
use crate::error::{Error, ErrorKind, Result};
use parking_lot::Mutex;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Distinguishes caches, so a handle given to the wrong cache is refused, not misread.
static NEXT_CACHE_ID: AtomicU64 = AtomicU64::new(1);

/// The system page size (4096 when `sysconf` does not answer sensibly).
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    match usize::try_from(p) {
        Ok(p) if p.is_power_of_two() => p,
        _ => 4096,
    }
}

/// How a [`RegCache`] behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegCacheOptions {
    /// Most cached regions (the `rcache_entries` knob); 0 turns caching off: every `get`
    /// registers and every `put` deregisters.
    pub max_entries: usize,
    /// Merge a new region with overlapping and same-access adjacent cached ones (UCX
    /// behaviour). Off: the new region covers the aligned request only and replaces
    /// (invalidates) the cached regions it overlaps.
    pub merge: bool,
    /// New regions are aligned out to this (a power of two, at most the page size, so the
    /// extension never reaches an unmapped page); 1 registers exact ranges.
    pub align: usize,
}

impl RegCacheOptions {
    /// `max_entries` regions, merging on, page alignment.
    pub fn new(max_entries: usize) -> Self {
        RegCacheOptions {
            max_entries,
            merge: true,
            align: page_size(),
        }
    }
}

/// Counters and gauges of a [`RegCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegCacheStats {
    /// `get`s served by a cached registration.
    pub hits: u64,
    /// `get`s that had to register.
    pub misses: u64,
    /// Unreferenced regions deregistered to stay within `max_entries`.
    pub evictions: u64,
    /// Regions removed from the lookup by `invalidate` or `dereg`.
    pub invalidations: u64,
    /// Regions absorbed into (or replaced by) a newly registered one.
    pub merged: u64,
    /// Misses that left more than `max_entries` cached regions because all were referenced.
    pub over_limit: u64,
    /// Calls to `Registrar::register` that succeeded.
    pub registrations: u64,
    /// Calls to `Registrar::deregister` that succeeded.
    pub deregistrations: u64,
    /// Deregistrations that failed for good (logged; the registration was given up on).
    pub dereg_errors: u64,
    /// Regions in the lookup now.
    pub entries: u64,
    /// Regions out of the lookup that still have handles (deregistered at their last put).
    pub invalid_referenced: u64,
    /// Deregistrations that failed transiently and wait for a retry.
    pub pending_dereg: u64,
    /// Bytes registered through this cache and not yet deregistered.
    pub registered_bytes: u64,
}

/// A registration lent out by [`RegCache::get`]; give it back with [`RegCache::put`] or
/// [`RegCache::dereg`]. Not `Clone`, so it is given back exactly once.
#[must_use = "a handle that is never put pins its registration in the cache"]
#[derive(Debug, PartialEq, Eq)]
pub struct Handle {
    addr: usize,
    len: usize,
    region_addr: usize,
    region_len: usize,
    access: u32,
    keys: MrKeys,
    id: u64,
    cache: u64,
}

impl Handle {
    /// The start of the range that was asked for.
    pub fn addr(&self) -> usize {
        self.addr
    }
    /// The length of the range that was asked for.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false (`get` refuses empty ranges); here for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The local key to put in SGEs that point into the range.
    pub fn lkey(&self) -> u32 {
        self.keys.lkey
    }
    /// The remote key a peer uses with addresses inside the range.
    pub fn rkey(&self) -> u32 {
        self.keys.rkey
    }
    /// Both keys.
    pub fn keys(&self) -> MrKeys {
        self.keys
    }
    /// The registered region `(addr, len)` that covers the range (it may be larger).
    pub fn region(&self) -> (usize, usize) {
        (self.region_addr, self.region_len)
    }
    /// The access flags of the region (a superset of those asked for).
    pub fn access(&self) -> u32 {
        self.access
    }
}

/// One registration made by the cache.
#[derive(Debug)]
struct Region {
    start: usize,
    end: usize,
    access: u32,
    keys: MrKeys,
    /// Handles lent out.
    refs: usize,
    /// In the lookup (`by_start`); false once merged away, evicted or invalidated.
    valid: bool,
    /// Its LRU tick while it is valid and unreferenced.
    lru: Option<u64>,
}

#[derive(Debug)]
struct Pending {
    lkey: u32,
    len: usize,
}

#[derive(Debug, Default)]
struct Inner {
    /// Every registration the cache still owns (valid ones and invalid referenced ones).
    regions: HashMap<u64, Region>,
    /// Valid regions by start address; they never overlap.
    by_start: BTreeMap<usize, u64>,
    /// Valid unreferenced regions by LRU tick (oldest first): exactly the evictable ones.
    lru: BTreeMap<u64, u64>,
    /// Deregistrations to retry.
    pending: Vec<Pending>,
    next_id: u64,
    tick: u64,
    stats: RegCacheStats,
}

/// Whether a failed deregistration is worth retrying.
fn transient(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::Busy | ErrorKind::Full | ErrorKind::Timeout)
}

impl Inner {
    fn insert(&mut self, start: usize, end: usize, access: u32, keys: MrKeys, valid: bool) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.regions.insert(
            id,
            Region {
                start,
                end,
                access,
                keys,
                refs: 1,
                valid,
                lru: None,
            },
        );
        if valid {
            self.by_start.insert(start, id);
        }
        self.stats.registrations += 1;
        self.stats.registered_bytes += (end - start) as u64;
        id
    }

    /// The valid region covering `[start, end)` with at least `access`, if any.
    fn find_covering(&self, start: usize, end: usize, access: u32) -> Option<u64> {
        let (_, &id) = self.by_start.range(..=start).next_back()?;
        let r = self.regions.get(&id)?;
        (r.end >= end && r.access & access == access).then_some(id)
    }

    /// Valid regions overlapping `[start, end)`.
    fn overlapping(&self, start: usize, end: usize) -> Vec<u64> {
        let mut out = Vec::new();
        for (_, &id) in self.by_start.range(..end).rev() {
            match self.regions.get(&id) {
                // Valid regions are disjoint, so ends fall as starts fall.
                Some(r) if r.end <= start => break,
                Some(_) => out.push(id),
                None => {}
            }
        }
        out
    }

    /// Takes a valid region out of the lookup and the LRU.
    fn unlink(&mut self, id: u64) {
        if let Some(r) = self.regions.get_mut(&id) {
            if r.valid {
                r.valid = false;
                self.by_start.remove(&r.start);
            }
            if let Some(t) = r.lru.take() {
                self.lru.remove(&t);
            }
        }
    }

    /// Unlinks a region and deregisters it if no handle names it.
    fn retire(&mut self, reg: &dyn Registrar, id: u64) {
        self.unlink(id);
        if self.regions.get(&id).is_some_and(|r| r.refs == 0) {
            self.release(reg, id);
        }
    }

    /// Forgets an unlinked, unreferenced region and deregisters it.
    fn release(&mut self, reg: &dyn Registrar, id: u64) {
        if let Some(r) = self.regions.remove(&id) {
            self.deregister(reg, r.keys.lkey, r.end - r.start);
        }
    }

    fn deregister(&mut self, reg: &dyn Registrar, lkey: u32, len: usize) {
        match reg.deregister(lkey) {
            Ok(()) => {
                self.stats.deregistrations += 1;
                self.stats.registered_bytes =
                    self.stats.registered_bytes.saturating_sub(len as u64);
            }
            Err(e) if transient(e.kind()) => {
                log::debug!("rcache: deregistering lkey {lkey:#x} deferred: {e}");
                self.pending.push(Pending { lkey, len });
            }
            Err(e) => {
                log::error!("rcache: deregistering lkey {lkey:#x} failed, giving it up: {e}");
                self.stats.dereg_errors += 1;
                self.stats.registered_bytes =
                    self.stats.registered_bytes.saturating_sub(len as u64);
            }
        }
    }

    fn retry_pending(&mut self, reg: &dyn Registrar) {
        for p in std::mem::take(&mut self.pending) {
            self.deregister(reg, p.lkey, p.len);
        }
    }

    /// Makes a valid region with no handles evictable (most recently used).
    fn park(&mut self, id: u64) {
        if let Some(r) = self.regions.get_mut(&id) {
            if r.valid && r.refs == 0 && r.lru.is_none() {
                self.tick += 1;
                r.lru = Some(self.tick);
                self.lru.insert(self.tick, id);
            }
        }
    }

    /// Evicts least recently used unreferenced regions while over `max`.
    fn enforce_limit(&mut self, reg: &dyn Registrar, max: usize, count_over: bool) {
        while self.by_start.len() > max {
            let Some((_, id)) = self.lru.pop_first() else {
                if count_over {
                    self.stats.over_limit += 1;
                }
                break;
            };
            if let Some(r) = self.regions.get_mut(&id) {
                r.lru = None;
            }
            self.stats.evictions += 1;
            self.retire(reg, id);
        }
    }

    /// Drops one reference; `invalidate` also takes the region out of the lookup.
    fn unref(&mut self, reg: &dyn Registrar, id: u64, max: usize, invalidate: bool) -> Result<()> {
        let Some(r) = self.regions.get_mut(&id) else {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("rcache: handle names region {id}, which this cache does not hold"),
            ));
        };
        r.refs = r.refs.saturating_sub(1);
        let (refs, valid) = (r.refs, r.valid);
        if invalidate && valid {
            self.stats.invalidations += 1;
            self.unlink(id);
        }
        if refs > 0 {
            return Ok(());
        }
        if invalidate || !valid {
            self.retry_pending(reg);
            self.release(reg, id);
        } else {
            self.park(id);
            self.enforce_limit(reg, max, false);
        }
        Ok(())
    }

    fn handle(&self, id: u64, cache: u64, addr: usize, len: usize) -> Result<Handle> {
        let r = self.regions.get(&id).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                "rcache: region vanished (internal error)",
            )
        })?;
        Ok(Handle {
            addr,
            len,
            region_addr: r.start,
            region_len: r.end - r.start,
            access: r.access,
            keys: r.keys,
            id,
            cache,
        })
    }

    #[cfg(test)]
    fn check_invariants(&self, max: usize) {
        let mut prev_end = 0usize;
        for (&start, id) in &self.by_start {
            let r = &self.regions[id];
            assert!(r.valid && r.start == start && r.start < r.end, "{r:?}");
            assert!(prev_end <= r.start, "valid regions overlap at {start:#x}");
            prev_end = r.end;
        }
        for (&t, id) in &self.lru {
            let r = &self.regions[id];
            assert!(r.valid && r.refs == 0 && r.lru == Some(t), "{r:?}");
        }
        let mut bytes = 0usize;
        for (id, r) in &self.regions {
            bytes += r.end - r.start;
            if r.valid {
                assert_eq!(self.by_start.get(&r.start), Some(id));
                assert_eq!(r.refs == 0, r.lru.is_some(), "{r:?}");
            } else {
                assert!(
                    r.refs > 0 && r.lru.is_none(),
                    "invalid unreferenced region kept: {r:?}"
                );
            }
        }
        bytes += self.pending.iter().map(|p| p.len).sum::<usize>();
        assert_eq!(bytes as u64, self.stats.registered_bytes);
        assert!(self.by_start.len() <= max || self.lru.is_empty());
    }
}

/// The registration cache. Thread-safe: one mutex around the whole structure (the
/// registrar is called under it, as UCX does, so concurrent misses on overlapping
/// memory cannot register twice).
pub struct RegCache {
    registrar: Arc<dyn Registrar>,
    opts: RegCacheOptions,
    id: u64,
    inner: Mutex<Inner>,
}

impl fmt::Debug for RegCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegCache")
            .field("opts", &self.opts)
            .field("stats", &self.stats())
            .finish()
    }
}

impl RegCache {
    /// A cache of at most `max_entries` regions (0: caching off), merging, page-aligned.
    pub fn new(registrar: Arc<dyn Registrar>, max_entries: usize) -> Self {
        RegCache {
            registrar,
            opts: RegCacheOptions::new(max_entries),
            id: NEXT_CACHE_ID.fetch_add(1, Ordering::Relaxed),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// A cache with explicit options; `InvalidArgument` if `align` is not a power of two
    /// or exceeds the page size.
    pub fn with_options(registrar: Arc<dyn Registrar>, opts: RegCacheOptions) -> Result<Self> {
        let page = page_size();
        if !opts.align.is_power_of_two() || opts.align > page {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "rcache: align {} is not a power of two between 1 and the page size {page}",
                    opts.align
                ),
            ));
        }
        let mut cache = RegCache::new(registrar, opts.max_entries);
        cache.opts = opts;
        Ok(cache)
    }

    /// The options in force.
    pub fn options(&self) -> RegCacheOptions {
        self.opts
    }

    /// Returns a registration covering `[addr, addr + len)` with at least `access`
    /// (`ibv_access_flags` bits), registering one on a miss.
    ///
    /// # Safety
    /// `[addr, addr + len)` must be mapped memory that stays mapped until the caller has
    /// put every handle on it and called [`RegCache::invalidate`] on it (see the module
    /// documentation); the registrar may be handed the enclosing pages and any cached
    /// regions the new one merges with.
    pub unsafe fn get(&self, addr: *mut u8, len: usize, access: u32) -> Result<Handle> {
        if addr.is_null() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "rcache: addr is NULL",
            ));
        }
        if len == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "rcache: len is 0: an empty range needs no registration",
            ));
        }
        let start = addr.expose_provenance();
        let Some(end) = start.checked_add(len) else {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("rcache: {addr:p} + {len} bytes wraps the address space"),
            ));
        };
        let reg = &*self.registrar;
        let max = self.opts.max_entries;
        let mut guard = self.inner.lock();
        let inner = &mut *guard;

        if max == 0 {
            inner.stats.misses += 1;
            inner.retry_pending(reg);
            // SAFETY: the caller's range, valid per this function's contract.
            let keys = unsafe { reg.register(addr, len, access)? };
            let id = inner.insert(start, end, access, keys, false);
            return inner.handle(id, self.id, start, len);
        }

        if let Some(id) = inner.find_covering(start, end, access) {
            inner.stats.hits += 1;
            if let Some(r) = inner.regions.get_mut(&id) {
                r.refs += 1;
                if let Some(t) = r.lru.take() {
                    inner.lru.remove(&t);
                }
            }
            return inner.handle(id, self.id, start, len);
        }

        inner.stats.misses += 1;
        inner.retry_pending(reg);
        let mask = self.opts.align - 1;
        let a_start = start & !mask;
        let a_end = end.checked_next_multiple_of(self.opts.align).unwrap_or(end);

        // Overlapping valid regions must go (valid regions never overlap).
        let overlapped = inner.overlapping(a_start, a_end);
        let (mut s, mut e, mut acc) = (a_start, a_end, access);
        let mut absorbed = overlapped.clone();
        if self.opts.merge {
            for id in &overlapped {
                if let Some(r) = inner.regions.get(id) {
                    s = s.min(r.start);
                    e = e.max(r.end);
                    acc |= r.access;
                }
            }
            // Same-access neighbours that touch the union, chained.
            while let Some((_, &id)) = inner.by_start.range(..s).next_back() {
                match inner.regions.get(&id) {
                    Some(r) if r.end == s && r.access == acc => {
                        s = r.start;
                        absorbed.push(id);
                    }
                    _ => break,
                }
            }
            while let Some(&id) = inner.by_start.get(&e) {
                match inner.regions.get(&id) {
                    Some(r) if r.access == acc => {
                        e = r.end;
                        absorbed.push(id);
                    }
                    _ => break,
                }
            }
        }

        let ptr = |a: usize| std::ptr::with_exposed_provenance_mut::<u8>(a);
        // SAFETY: `[s, e)` is the caller's range (valid per this function's contract)
        // widened to whole pages (mapped, as mapping is page-granular: `align` is at most
        // the page size) and to valid cached regions (mapped per the cache contract:
        // memory is invalidated before it is unmapped).
        let keys = match unsafe { reg.register(ptr(s), e - s, acc) } {
            Ok(keys) => keys,
            Err(first) if (s, e, acc) != (a_start, a_end, access) => {
                log::warn!(
                    "rcache: registering merged region {:#x}+{} failed ({first}); trying the request alone",
                    s,
                    e - s
                );
                // SAFETY: the caller's range widened to whole pages, as above.
                let keys = unsafe { reg.register(ptr(a_start), a_end - a_start, access)? };
                (s, e, acc) = (a_start, a_end, access);
                absorbed = overlapped;
                keys
            }
            Err(err) => return Err(err),
        };
        inner.stats.merged += absorbed.len() as u64;
        for id in absorbed {
            inner.retire(reg, id);
        }
        let id = inner.insert(s, e, acc, keys, true);
        inner.enforce_limit(reg, max, true);
        inner.handle(id, self.id, start, len)
    }

    /// Gives a handle back. The region stays cached (and evictable once unreferenced);
    /// with caching off, or if the region was invalidated, it is deregistered at its last
    /// put. `InvalidArgument` if the handle came from another cache.
    pub fn put(&self, handle: Handle) -> Result<()> {
        self.check_owner(&handle)?;
        let mut inner = self.inner.lock();
        inner.unref(&*self.registrar, handle.id, self.opts.max_entries, false)
    }

    /// Gives a handle back and invalidates its region (invalidation on deregistration):
    /// no later `get` reuses it, and it is deregistered once its last handle is put.
    pub fn dereg(&self, handle: Handle) -> Result<()> {
        self.check_owner(&handle)?;
        let mut inner = self.inner.lock();
        inner.unref(&*self.registrar, handle.id, self.opts.max_entries, true)
    }

    /// Removes every cached region overlapping `[addr, addr + len)` from the lookup and
    /// deregisters those without handles now (the others at their last put). Call it
    /// before unmapping or freeing memory registered through the cache. Returns how many
    /// regions were invalidated; an empty range invalidates nothing.
    pub fn invalidate(&self, addr: *const u8, len: usize) -> usize {
        if len == 0 {
            return 0;
        }
        let start = addr.expose_provenance();
        let end = start.saturating_add(len);
        let reg = &*self.registrar;
        let mut inner = self.inner.lock();
        inner.retry_pending(reg);
        let ids = inner.overlapping(start, end);
        inner.stats.invalidations += ids.len() as u64;
        for &id in &ids {
            inner.retire(reg, id);
        }
        ids.len()
    }

    /// Retries deregistrations that failed transiently; returns how many still wait.
    pub fn retry_pending(&self) -> usize {
        let mut inner = self.inner.lock();
        inner.retry_pending(&*self.registrar);
        inner.pending.len()
    }

    /// Counters and gauges.
    pub fn stats(&self) -> RegCacheStats {
        let inner = self.inner.lock();
        let mut s = inner.stats;
        s.entries = inner.by_start.len() as u64;
        s.invalid_referenced = (inner.regions.len() - inner.by_start.len()) as u64;
        s.pending_dereg = inner.pending.len() as u64;
        s
    }

    fn check_owner(&self, handle: &Handle) -> Result<()> {
        if handle.cache == self.id {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::InvalidArgument,
                "rcache: the handle belongs to another registration cache",
            ))
        }
    }

    #[cfg(test)]
    fn check_invariants(&self) {
        self.inner.lock().check_invariants(self.opts.max_entries);
    }
}

impl Drop for RegCache {
    /// Deregisters every unreferenced region. Regions that handles still name are left
    /// registered (a handle may still be in use) and logged, as are deregistrations that
    /// keep failing; the provider reclaims both when it is torn down.
    fn drop(&mut self) {
        let reg = &*self.registrar;
        let inner = self.inner.get_mut();
        inner.retry_pending(reg);
        let ids: Vec<u64> = inner.regions.keys().copied().collect();
        let mut leaked = 0usize;
        for id in ids {
            inner.unlink(id);
            if inner.regions.get(&id).is_some_and(|r| r.refs == 0) {
                inner.release(reg, id);
            } else {
                leaked += 1;
            }
        }
        if leaked > 0 {
            log::warn!(
                "rcache dropped with {leaked} region(s) still named by handles: left registered"
            );
        }
        if !inner.pending.is_empty() {
            log::warn!(
                "rcache dropped with {} deregistration(s) still failing: left registered",
                inner.pending.len()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rc::verbs::access::{LOCAL_WRITE, REMOTE_READ, REMOTE_WRITE};
    use std::collections::HashSet;

    const PAGE: usize = 4096;
    const BASE: usize = 0x1000_0000;

    /// An address the fake registrar never dereferences.
    fn p(a: usize) -> *mut u8 {
        std::ptr::without_provenance_mut(a)
    }

    #[derive(Debug, Default)]
    struct FakeState {
        next_key: u32,
        /// lkey -> (addr, len, access) of live registrations.
        live: HashMap<u32, (usize, usize, u32)>,
        /// Every registration ever made: (lkey, addr, len, access).
        log: Vec<(u32, usize, usize, u32)>,
        /// Successful deregistrations, in order.
        deregistered: Vec<u32>,
        /// lkeys the test holds handles for (how many).
        held: HashMap<u32, usize>,
        violations: Vec<String>,
        /// Fail the next n registrations.
        fail_register: usize,
        /// Fail registrations longer than this.
        max_len: Option<usize>,
        /// Fail the next n deregistrations with `Busy`.
        busy: usize,
    }

    #[derive(Debug, Default)]
    struct Fake(Mutex<FakeState>);

    impl Registrar for Fake {
        unsafe fn register(&self, addr: *mut u8, len: usize, access: u32) -> Result<MrKeys> {
            let mut s = self.0.lock();
            if s.fail_register > 0 {
                s.fail_register -= 1;
                return Err(Error::new(ErrorKind::Full, "fake: register failed"));
            }
            if s.max_len.is_some_and(|m| len > m) {
                return Err(Error::new(ErrorKind::InvalidArgument, "fake: too long"));
            }
            s.next_key += 1;
            let lkey = s.next_key;
            let a = addr.expose_provenance();
            s.live.insert(lkey, (a, len, access));
            s.log.push((lkey, a, len, access));
            Ok(MrKeys {
                lkey,
                rkey: lkey | 0x8000_0000,
            })
        }

        fn deregister(&self, lkey: u32) -> Result<()> {
            let mut s = self.0.lock();
            if s.held.get(&lkey).is_some_and(|&n| n > 0) {
                s.violations
                    .push(format!("lkey {lkey} deregistered while held"));
            }
            if s.busy > 0 {
                s.busy -= 1;
                return Err(Error::new(ErrorKind::Busy, "fake: busy"));
            }
            if s.live.remove(&lkey).is_none() {
                s.violations
                    .push(format!("lkey {lkey} deregistered twice or unknown"));
                return Err(Error::new(ErrorKind::InvalidArgument, "fake: no such lkey"));
            }
            s.deregistered.push(lkey);
            Ok(())
        }
    }

    impl Fake {
        fn live(&self) -> usize {
            self.0.lock().live.len()
        }
        fn registrations(&self) -> usize {
            self.0.lock().log.len()
        }
        fn deregistered(&self) -> Vec<u32> {
            self.0.lock().deregistered.clone()
        }
        fn is_live(&self, lkey: u32) -> bool {
            self.0.lock().live.contains_key(&lkey)
        }
        fn assert_clean(&self) {
            let s = self.0.lock();
            assert!(s.violations.is_empty(), "{:?}", s.violations);
        }
    }

    fn cache(max: usize) -> (Arc<Fake>, RegCache) {
        let fake = Arc::new(Fake::default());
        let opts = RegCacheOptions {
            max_entries: max,
            merge: true,
            align: PAGE,
        };
        let c = RegCache::with_options(fake.clone(), opts).unwrap();
        (fake, c)
    }

    /// `get` on fake addresses: the fake registrar never touches memory.
    fn get(c: &RegCache, addr: usize, len: usize, access: u32) -> Handle {
        // SAFETY: the fake registrar does not dereference addresses.
        unsafe { c.get(p(addr), len, access) }.unwrap()
    }

    #[test]
    fn miss_then_hit() {
        let (fake, c) = cache(8);
        let h = get(&c, BASE + 100, 200, LOCAL_WRITE);
        assert_eq!((h.addr(), h.len()), (BASE + 100, 200));
        assert_eq!(h.region(), (BASE, PAGE), "aligned out to the page");
        let keys = h.keys();
        c.put(h).unwrap();
        let h = get(&c, BASE + 100, 200, LOCAL_WRITE);
        assert_eq!(h.keys(), keys);
        assert_eq!(h.rkey(), keys.rkey);
        c.put(h).unwrap();
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.entries), (1, 1, 1));
        assert_eq!(s.registered_bytes, PAGE as u64);
        assert_eq!(fake.registrations(), 1);
        c.check_invariants();
    }

    #[test]
    fn covering_region_serves_sub_ranges() {
        let (fake, c) = cache(8);
        let big = get(&c, BASE, 4 * PAGE, LOCAL_WRITE | REMOTE_READ);
        let small = get(&c, BASE + PAGE + 7, 100, LOCAL_WRITE);
        let read = get(&c, BASE + 3 * PAGE, PAGE, REMOTE_READ);
        assert_eq!(small.lkey(), big.lkey());
        assert_eq!(read.lkey(), big.lkey());
        assert_eq!(fake.registrations(), 1);
        assert_eq!(c.stats().hits, 2);
        for h in [big, small, read] {
            c.put(h).unwrap();
        }
        // A range crossing the region's end is not covered.
        let h = get(&c, BASE + 3 * PAGE, 2 * PAGE, LOCAL_WRITE);
        assert_eq!(
            h.region(),
            (BASE, 5 * PAGE),
            "merged with the overlapped region"
        );
        c.put(h).unwrap();
        c.check_invariants();
    }

    #[test]
    fn overlapping_and_adjacent_ranges_merge_and_old_regions_die_after_their_puts() {
        let (fake, c) = cache(8);
        let a = get(&c, BASE, PAGE, LOCAL_WRITE);
        let b = get(&c, BASE + 2 * PAGE, PAGE, LOCAL_WRITE);
        // Overlaps a's page and touches b: one region over all three pages.
        let m = get(&c, BASE + PAGE - 10, PAGE + 10, LOCAL_WRITE);
        assert_eq!(m.region(), (BASE, 3 * PAGE));
        assert_eq!(fake.registrations(), 3);
        assert!(fake.deregistered().is_empty(), "a and b still referenced");
        assert_eq!(c.stats().entries, 1);
        assert_eq!(c.stats().invalid_referenced, 2);
        c.check_invariants();
        // The old handles still work (their regions stay registered)...
        assert!(fake.is_live(a.lkey()) && fake.is_live(b.lkey()));
        // ...and later gets use the merged region.
        let again = get(&c, BASE, 10, LOCAL_WRITE);
        assert_eq!(again.lkey(), m.lkey());
        let (ak, bk) = (a.lkey(), b.lkey());
        c.put(a).unwrap();
        assert_eq!(fake.deregistered(), vec![ak]);
        c.put(b).unwrap();
        assert_eq!(fake.deregistered(), vec![ak, bk]);
        c.put(m).unwrap();
        c.put(again).unwrap();
        assert_eq!(
            fake.deregistered(),
            vec![ak, bk],
            "the merged region stays cached"
        );
        assert_eq!(c.stats().merged, 2);
        c.check_invariants();
        fake.assert_clean();
    }

    #[test]
    fn unreferenced_merged_regions_are_deregistered_at_once() {
        let (fake, c) = cache(8);
        let a = get(&c, BASE, PAGE, LOCAL_WRITE);
        let ak = a.lkey();
        c.put(a).unwrap();
        let m = get(&c, BASE + PAGE, PAGE, LOCAL_WRITE);
        assert_eq!(m.region(), (BASE, 2 * PAGE));
        assert_eq!(fake.deregistered(), vec![ak]);
        c.put(m).unwrap();
        c.check_invariants();
    }

    #[test]
    fn adjacent_regions_with_other_access_are_not_merged() {
        let (_fake, c) = cache(8);
        let a = get(&c, BASE, PAGE, LOCAL_WRITE | REMOTE_WRITE);
        let b = get(&c, BASE + PAGE, PAGE, LOCAL_WRITE);
        assert_eq!(b.region(), (BASE + PAGE, PAGE));
        assert_eq!(b.access(), LOCAL_WRITE);
        assert_eq!(c.stats().entries, 2);
        c.put(a).unwrap();
        c.put(b).unwrap();
        c.check_invariants();
    }

    #[test]
    fn access_upgrade_registers_the_union() {
        let (fake, c) = cache(8);
        let local = get(&c, BASE, 2 * PAGE, LOCAL_WRITE);
        let remote = get(&c, BASE + 10, 10, REMOTE_READ);
        assert_ne!(remote.lkey(), local.lkey(), "fewer rights: not reused");
        assert_eq!(remote.access(), LOCAL_WRITE | REMOTE_READ);
        assert_eq!(remote.region(), (BASE, 2 * PAGE));
        assert_eq!(c.stats().entries, 1);
        // Both kinds of request now hit the merged region.
        let l2 = get(&c, BASE + PAGE, PAGE, LOCAL_WRITE);
        assert_eq!(l2.lkey(), remote.lkey());
        let lk = local.lkey();
        c.put(local).unwrap();
        assert_eq!(fake.deregistered(), vec![lk]);
        c.put(remote).unwrap();
        c.put(l2).unwrap();
        assert_eq!(fake.live(), 1);
        c.check_invariants();
        fake.assert_clean();
    }

    #[test]
    fn lru_evicts_least_recently_used() {
        let (fake, c) = cache(2);
        let a = get(&c, BASE, PAGE, LOCAL_WRITE);
        let ak = a.lkey();
        c.put(a).unwrap();
        let b = get(&c, BASE + 10 * PAGE, PAGE, LOCAL_WRITE);
        let bk = b.lkey();
        c.put(b).unwrap();
        // Touch a: b becomes the least recently used.
        c.put(get(&c, BASE, 1, LOCAL_WRITE)).unwrap();
        let x = get(&c, BASE + 20 * PAGE, PAGE, LOCAL_WRITE);
        assert_eq!(fake.deregistered(), vec![bk]);
        c.put(x).unwrap();
        let y = get(&c, BASE + 30 * PAGE, PAGE, LOCAL_WRITE);
        assert_eq!(fake.deregistered(), vec![bk, ak]);
        c.put(y).unwrap();
        let s = c.stats();
        assert_eq!((s.evictions, s.entries, s.over_limit), (2, 2, 0));
        c.check_invariants();
    }

    #[test]
    fn referenced_regions_are_never_evicted() {
        let (fake, c) = cache(2);
        let hs: Vec<Handle> = (0..4)
            .map(|i| get(&c, BASE + i * 10 * PAGE, PAGE, LOCAL_WRITE))
            .collect();
        assert!(fake.deregistered().is_empty());
        let s = c.stats();
        assert_eq!((s.entries, s.over_limit, s.evictions), (4, 2, 0));
        c.check_invariants();
        // Each put while over the limit evicts down towards it.
        let keys: Vec<u32> = hs.iter().map(Handle::lkey).collect();
        for h in hs {
            c.put(h).unwrap();
            c.check_invariants();
        }
        assert_eq!(fake.deregistered(), vec![keys[0], keys[1]]);
        assert_eq!(c.stats().entries, 2);
        fake.assert_clean();
    }

    #[test]
    fn invalidate_removes_from_lookup_and_deregisters_once_unreferenced() {
        let (fake, c) = cache(8);
        let a = get(&c, BASE, PAGE, LOCAL_WRITE);
        let b = get(&c, BASE + 10 * PAGE, PAGE, LOCAL_WRITE);
        let (ak, bk) = (a.lkey(), b.lkey());
        c.put(b).unwrap();
        assert_eq!(c.invalidate(p(BASE + 5), 1), 1);
        assert_eq!(c.invalidate(p(BASE + 10 * PAGE + 100), 1), 1);
        assert_eq!(fake.deregistered(), vec![bk], "a is still referenced");
        assert_eq!(c.invalidate(p(BASE), PAGE), 0, "already out of the lookup");
        // A later get does not find the invalidated region.
        let a2 = get(&c, BASE, PAGE, LOCAL_WRITE);
        assert_ne!(a2.lkey(), ak);
        c.put(a).unwrap();
        assert_eq!(fake.deregistered(), vec![bk, ak]);
        c.put(a2).unwrap();
        assert_eq!(c.invalidate(p(BASE), usize::MAX), 1);
        assert_eq!(fake.live(), 0);
        assert_eq!(c.invalidate(p(BASE), 0), 0);
        let s = c.stats();
        assert_eq!((s.invalidations, s.entries, s.registered_bytes), (3, 0, 0));
        c.check_invariants();
        fake.assert_clean();
    }

    #[test]
    fn dereg_invalidates_the_region() {
        let (fake, c) = cache(8);
        let a = get(&c, BASE, PAGE, LOCAL_WRITE);
        let a2 = get(&c, BASE, PAGE, LOCAL_WRITE);
        let ak = a.lkey();
        c.dereg(a).unwrap();
        assert!(fake.deregistered().is_empty(), "a2 still names it");
        let b = get(&c, BASE, PAGE, LOCAL_WRITE);
        assert_ne!(b.lkey(), ak, "not found after dereg");
        c.put(a2).unwrap();
        assert_eq!(fake.deregistered(), vec![ak]);
        let bk = b.lkey();
        c.dereg(b).unwrap();
        assert_eq!(fake.deregistered(), vec![ak, bk]);
        assert_eq!(c.stats().invalidations, 2);
        c.check_invariants();
        fake.assert_clean();
    }

    #[test]
    fn zero_entries_disables_caching() {
        let (fake, c) = cache(0);
        let a = get(&c, BASE + 3, 10, LOCAL_WRITE);
        assert_eq!(a.region(), (BASE + 3, 10), "exact range when not caching");
        let b = get(&c, BASE + 3, 10, LOCAL_WRITE);
        assert_ne!(a.lkey(), b.lkey());
        let (ak, bk) = (a.lkey(), b.lkey());
        c.put(a).unwrap();
        assert_eq!(fake.deregistered(), vec![ak]);
        c.dereg(b).unwrap();
        assert_eq!(fake.deregistered(), vec![ak, bk]);
        let s = c.stats();
        assert_eq!(
            (s.hits, s.misses, s.entries, s.registered_bytes),
            (0, 2, 0, 0)
        );
        c.check_invariants();
    }

    #[test]
    fn bad_input_is_an_error() {
        let (fake, c) = cache(8);
        // SAFETY: all rejected before the registrar is called.
        unsafe {
            let e = c.get(std::ptr::null_mut(), 10, 0).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            let e = c.get(p(BASE), 0, 0).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            let e = c.get(p(usize::MAX - 5), 10, 0).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        }
        assert_eq!(fake.registrations(), 0);
        let (_f2, other) = cache(8);
        let h = get(&other, BASE, 1, 0);
        assert_eq!(c.put(h).unwrap_err().kind(), ErrorKind::InvalidArgument);
        let h = get(&other, BASE, 1, 0);
        assert_eq!(c.dereg(h).unwrap_err().kind(), ErrorKind::InvalidArgument);
        for align in [0, 3, 1 << 40] {
            let opts = RegCacheOptions {
                align,
                ..RegCacheOptions::new(4)
            };
            assert!(RegCache::with_options(fake.clone(), opts).is_err());
        }
        // The last page of the address space: alignment cannot round the end up.
        let h = get(&c, usize::MAX - 10, 10, 0);
        assert_eq!(h.region().0 + h.region().1, usize::MAX);
        c.put(h).unwrap();
        c.check_invariants();
    }

    #[test]
    fn failed_registration_leaves_the_cache_unchanged() {
        let (fake, c) = cache(8);
        let a = get(&c, BASE, PAGE, LOCAL_WRITE);
        fake.0.lock().fail_register = 2;
        // SAFETY: fake addresses.
        let e = unsafe { c.get(p(BASE + PAGE), PAGE, LOCAL_WRITE) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Full);
        assert_eq!(c.stats().entries, 1);
        let a2 = get(&c, BASE, PAGE, LOCAL_WRITE);
        assert_eq!(a2.lkey(), a.lkey());
        c.put(a).unwrap();
        c.put(a2).unwrap();
        c.check_invariants();
    }

    #[test]
    fn merged_registration_failure_falls_back_to_the_request() {
        let (fake, c) = cache(8);
        let a = get(&c, BASE, 4 * PAGE, LOCAL_WRITE);
        let b = get(&c, BASE + 5 * PAGE, PAGE, LOCAL_WRITE);
        fake.0.lock().max_len = Some(2 * PAGE);
        // Overlaps a (merge would be 5 pages, refused) and touches b.
        let m = get(&c, BASE + 3 * PAGE, 2 * PAGE, LOCAL_WRITE);
        assert_eq!(m.region(), (BASE + 3 * PAGE, 2 * PAGE));
        let s = c.stats();
        assert_eq!(
            (s.entries, s.invalid_referenced),
            (2, 1),
            "a replaced, b kept"
        );
        let b2 = get(&c, BASE + 5 * PAGE, 1, LOCAL_WRITE);
        assert_eq!(b2.lkey(), b.lkey());
        for h in [a, b, m, b2] {
            c.put(h).unwrap();
        }
        c.check_invariants();
        fake.assert_clean();
    }

    #[test]
    fn merging_off_replaces_overlapped_regions() {
        let fake = Arc::new(Fake::default());
        let opts = RegCacheOptions {
            max_entries: 8,
            merge: false,
            align: PAGE,
        };
        let c = RegCache::with_options(fake.clone(), opts).unwrap();
        let a = get(&c, BASE, 2 * PAGE, LOCAL_WRITE);
        let b = get(&c, BASE + 2 * PAGE, PAGE, LOCAL_WRITE);
        let m = get(&c, BASE + PAGE, PAGE + 1, REMOTE_READ);
        assert_eq!(m.region(), (BASE + PAGE, 2 * PAGE));
        assert_eq!(m.access(), REMOTE_READ, "no rights widened");
        assert_eq!(c.stats().entries, 1);
        for h in [a, b, m] {
            c.put(h).unwrap();
        }
        assert_eq!(fake.live(), 1);
        c.check_invariants();
        fake.assert_clean();
    }

    #[test]
    fn busy_deregistration_is_retried() {
        let (fake, c) = cache(8);
        let a = get(&c, BASE, PAGE, LOCAL_WRITE);
        let ak = a.lkey();
        fake.0.lock().busy = 2;
        c.dereg(a).unwrap();
        let s = c.stats();
        assert_eq!((s.pending_dereg, s.registered_bytes), (1, PAGE as u64));
        c.check_invariants();
        assert_eq!(c.retry_pending(), 1, "still busy");
        assert_eq!(c.retry_pending(), 0);
        assert_eq!(fake.deregistered(), vec![ak]);
        assert_eq!(c.stats().registered_bytes, 0);
        // Misses retry too.
        let b = get(&c, BASE, PAGE, LOCAL_WRITE);
        let bk = b.lkey();
        fake.0.lock().busy = 1;
        c.dereg(b).unwrap();
        c.put(get(&c, BASE + 10 * PAGE, 1, 0)).unwrap();
        assert_eq!(fake.deregistered(), vec![ak, bk]);
        c.check_invariants();
        fake.assert_clean();
    }

    #[test]
    fn drop_deregisters_unreferenced_and_leaves_referenced() {
        let (fake, c) = cache(8);
        let a = get(&c, BASE, PAGE, LOCAL_WRITE);
        c.put(get(&c, BASE + 10 * PAGE, PAGE, LOCAL_WRITE)).unwrap();
        let ak = a.lkey();
        drop(c);
        assert_eq!(fake.live(), 1);
        assert!(fake.is_live(ak));
        drop(a);
    }

    #[test]
    fn concurrent_gets_and_puts() {
        let (fake, c) = cache(4);
        let c = Arc::new(c);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                    for _ in 0..2000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let off = (x % (16 * PAGE as u64)) as usize;
                        let h = get(&c, BASE + off, 1 + (x >> 40) as usize % PAGE, LOCAL_WRITE);
                        assert!(h.region().0 <= BASE + off);
                        if x % 17 == 0 {
                            c.dereg(h).unwrap();
                        } else {
                            c.put(h).unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        c.check_invariants();
        c.invalidate(p(0), usize::MAX);
        assert_eq!(fake.live(), 0);
        fake.assert_clean();
    }

    use crate::test_rng::Rng;

    #[test]
    fn randomized_sequences_keep_the_invariants() {
        const ACCESS: [u32; 6] = [
            0,
            LOCAL_WRITE,
            REMOTE_READ,
            LOCAL_WRITE | REMOTE_READ,
            LOCAL_WRITE | REMOTE_WRITE,
            LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ,
        ];
        const SPAN: usize = 24 * PAGE;
        for seed in 1..=150u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let fake = Arc::new(Fake::default());
            let opts = RegCacheOptions {
                max_entries: [0, 1, 2, 4, 8][rng.below(5)],
                merge: rng.below(4) != 0,
                align: [1, 64, PAGE][rng.below(3)],
            };
            let c = RegCache::with_options(fake.clone(), opts).unwrap();
            let mut held: Vec<(Handle, u32)> = Vec::new();
            for step in 0..300 {
                let ctx = format!("seed {seed} step {step} {opts:?}");
                match rng.below(20) {
                    0..=9 => {
                        let addr = BASE + rng.below(SPAN);
                        let len = 1 + rng.below(3 * PAGE);
                        let access = ACCESS[rng.below(ACCESS.len())];
                        if rng.below(25) == 0 {
                            fake.0.lock().fail_register = 1 + rng.below(2);
                        }
                        // SAFETY: the fake registrar does not dereference addresses.
                        let Ok(h) = (unsafe { c.get(p(addr), len, access) }) else {
                            fake.0.lock().fail_register = 0;
                            continue;
                        };
                        let (ra, rl) = h.region();
                        assert!(ra <= addr && addr + len <= ra + rl, "{ctx}: {h:?}");
                        assert_eq!(h.access() & access, access, "{ctx}");
                        let s = fake.0.lock();
                        let &(fa, fl, facc) = s.live.get(&h.lkey()).expect("live lkey");
                        assert_eq!((fa, fl, facc), (ra, rl, h.access()), "{ctx}");
                        drop(s);
                        *fake.0.lock().held.entry(h.lkey()).or_default() += 1;
                        held.push((h, access));
                    }
                    10..=14 if !held.is_empty() => {
                        let (h, _) = held.swap_remove(rng.below(held.len()));
                        *fake.0.lock().held.get_mut(&h.lkey()).unwrap() -= 1;
                        c.put(h).unwrap();
                    }
                    15 if !held.is_empty() => {
                        let (h, _) = held.swap_remove(rng.below(held.len()));
                        *fake.0.lock().held.get_mut(&h.lkey()).unwrap() -= 1;
                        c.dereg(h).unwrap();
                    }
                    16 | 17 => {
                        let addr = BASE + rng.below(SPAN);
                        c.invalidate(p(addr), rng.below(4 * PAGE));
                    }
                    18 => fake.0.lock().busy = rng.below(3),
                    _ => {
                        c.retry_pending();
                    }
                }
                c.check_invariants();
                fake.assert_clean();
                // Handles still name live registrations.
                for (h, _) in &held {
                    assert!(fake.is_live(h.lkey()), "{ctx}: {h:?} deregistered");
                }
            }
            for (h, _) in held.drain(..) {
                *fake.0.lock().held.get_mut(&h.lkey()).unwrap() -= 1;
                c.put(h).unwrap();
            }
            fake.0.lock().busy = 0;
            c.invalidate(p(0), usize::MAX);
            assert_eq!(c.retry_pending(), 0);
            let s = c.stats();
            assert_eq!(
                (s.entries, s.invalid_referenced, s.registered_bytes),
                (0, 0, 0)
            );
            assert_eq!(s.dereg_errors, 0);
            fake.assert_clean();
            let st = fake.0.lock();
            assert!(st.live.is_empty(), "seed {seed}: leaked {:?}", st.live);
            let once: HashSet<u32> = st.deregistered.iter().copied().collect();
            assert_eq!(
                once.len(),
                st.deregistered.len(),
                "seed {seed}: double deregistration"
            );
            assert_eq!(st.deregistered.len(), st.log.len(), "seed {seed}");
            assert_eq!(s.registrations as usize, st.log.len());
            assert_eq!(s.deregistrations as usize, st.log.len());
        }
    }
}

//! Pools of fixed-size registered chunks carved from 2 MiB-aligned arenas.
//!
//! A [`Pool`] hands out [`Chunk`]s of `chunk_size` bytes (a power of two, 512 B..2 MiB),
//! each with its address, length and the lkey/rkey of the memory region it lies in.
//!
//! - **Growth.** The first arena is mapped by [`Pool::new`] (so `hugepages = on` without
//!   pages, or a failing registrar, fails there); further arenas are mapped when the free
//!   list runs dry. Arena sizes double from 2 MiB up to 64 MiB, each clipped to what the
//!   cap still needs (rounded up to 2 MiB), so a pool has few memory regions. Chunks are
//!   carved only up to the cap: a pool never hands out more than `max_chunks` chunks, and
//!   the last arena may be partly unused.
//! - **Registration.** Each arena is registered once through the [`Registrar`] (one MR,
//!   with the pool's access flags, covering the chunks carved from it) and deregistered
//!   when the pool is dropped.
//! - **get/put.** O(1) under one mutex: a stack of free chunk indices (`u32`) plus an
//!   in-use bitmap. Finding the arena of an address or index is a binary search over the
//!   arenas (a handful). Exhaustion is [`ErrorKind::Full`]. A double put, or a put of an
//!   address that is not the start of one of this pool's chunks, is
//!   [`ErrorKind::InvalidArgument`] and leaves the pool unchanged.
//! - **Metadata.** About 4.1 bytes per chunk (a free-stack entry and one bit) plus a few
//!   dozen bytes per arena: 0.1% of the pooled bytes for 4K chunks, 0.8% for 512 B.
//! - **Drop.** Dropping a pool deregisters and unmaps every arena even when chunks are
//!   still out (a warning says how many): pointers into those chunks become dangling, and
//!   callers (the C layer) must not use them afterwards. An arena whose deregistration
//!   fails (e.g. `Busy`) is leaked, still mapped, because the registrar may still touch it.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;

use super::arena::{ARENA_ALIGN, Arena, Backing};
use super::{MrKeys, Registrar};
use crate::config::{Hugepages, Settings};
use crate::error::{Error, ErrorKind, Result};

/// Smallest and largest chunk sizes (the `chunk_size` setting's range).
pub const MIN_CHUNK_SIZE: usize = 512;
pub const MAX_CHUNK_SIZE: usize = ARENA_ALIGN;

/// The largest arena a pool maps at once (arena sizes double from 2 MiB up to this).
pub const MAX_ARENA_SIZE: usize = 64 << 20;

/// One chunk handed out by a [`Pool`]: give it back with [`Pool::put`] or, by address,
/// [`Pool::put_addr`].
///
/// A plain handle: it never dereferences `addr`. Reading or writing the chunk's memory is
/// up to the holder (raw pointers, valid while the chunk is out and the pool alive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The first byte (aligned to the chunk size).
    pub addr: *mut u8,
    /// The chunk size in bytes.
    pub len: usize,
    /// The local key of the memory region the chunk lies in.
    pub lkey: u32,
    /// The remote key of the memory region the chunk lies in.
    pub rkey: u32,
    /// The chunk's index in its pool (`0..chunks_total`).
    pub index: u32,
}

// SAFETY: a Chunk is an address plus integers; it never dereferences `addr`, so moving it
// to another thread (and putting it back from there) is sound.
unsafe impl Send for Chunk {}
// SAFETY: see `Send`: `&Chunk` only exposes plain values.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// The address as a u64 (what work requests and SGEs carry).
    pub fn addr_u64(&self) -> u64 {
        self.addr as usize as u64
    }

    pub fn keys(&self) -> MrKeys {
        MrKeys {
            lkey: self.lkey,
            rkey: self.rkey,
        }
    }
}

/// A pool's counters and layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    pub chunk_size: usize,
    /// Chunks carved from arenas so far (never more than `chunks_cap`).
    pub chunks_total: u32,
    pub chunks_in_use: u32,
    /// The most chunks the pool will ever carve (`max_chunks`).
    pub chunks_cap: u32,
    pub arenas: usize,
    pub bytes_mapped: usize,
    /// The weakest backing among the arenas (they differ only when hugetlb pages ran out
    /// while growing under `hugepages = auto`).
    pub backing: Backing,
    /// The pool's own bookkeeping in bytes (free stack, in-use bitmap, arena table).
    pub metadata_bytes: usize,
}

impl fmt::Display for PoolStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} chunks in use ({} carved, {} B each), {} arenas, {} MiB mapped ({} pages), \
             {} B metadata",
            self.chunks_in_use,
            self.chunks_cap,
            self.chunks_total,
            self.chunk_size,
            self.arenas,
            self.bytes_mapped >> 20,
            self.backing,
            self.metadata_bytes
        )
    }
}

/// One arena and the chunks carved from it.
struct Region {
    arena: Arena,
    /// Cached `arena.addr() as usize`.
    base: usize,
    /// Index of the first chunk.
    first: u32,
    /// Chunks carved from this arena (all of it but possibly the last arena's tail).
    carved: u32,
    keys: MrKeys,
}

#[derive(Default)]
struct State {
    /// In growth order (so `first` increases).
    regions: Vec<Region>,
    /// Indices into `regions`, sorted by base address.
    by_addr: Vec<u32>,
    /// Free chunk indices; the top is handed out next.
    free: Vec<u32>,
    /// One bit per carved chunk, set while the chunk is out.
    in_use: Vec<u64>,
    total: u32,
    in_use_count: u32,
    bytes_mapped: usize,
}

impl State {
    fn bit(&self, index: u32) -> bool {
        let i = index as usize;
        self.in_use
            .get(i / 64)
            .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
    }

    fn set_bit(&mut self, index: u32, value: bool) {
        let i = index as usize;
        if let Some(w) = self.in_use.get_mut(i / 64) {
            if value {
                *w |= 1u64 << (i % 64);
            } else {
                *w &= !(1u64 << (i % 64));
            }
        }
    }

    /// The region holding chunk `index` (which must be < total).
    fn region_of_index(&self, index: u32) -> Option<&Region> {
        let pos = self.regions.partition_point(|r| r.first <= index);
        let r = self.regions.get(pos.checked_sub(1)?)?;
        (index - r.first < r.carved).then_some(r)
    }

    /// The region whose arena contains `addr`.
    fn region_of_addr(&self, addr: usize) -> Option<&Region> {
        let pos = self
            .by_addr
            .partition_point(|&ri| self.regions[ri as usize].base <= addr);
        let r = &self.regions[*self.by_addr.get(pos.checked_sub(1)?)? as usize];
        (addr - r.base < r.arena.len()).then_some(r)
    }
}

/// A pool of fixed-size registered chunks. Thread-safe: share it with `Arc<Pool>`.
pub struct Pool {
    registrar: Arc<dyn Registrar>,
    chunk_size: usize,
    shift: u32,
    cap: u32,
    access: u32,
    hugepages: Hugepages,
    state: Mutex<State>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Pool {
    /// A pool of at most `max_chunks` chunks of `chunk_size` bytes (a power of two in
    /// 512..=2 MiB), registered with `access` (`ibv_access_flags` bits), in arenas backed
    /// per `hugepages`. Maps and registers the first arena.
    pub fn new(
        registrar: Arc<dyn Registrar>,
        chunk_size: usize,
        max_chunks: u32,
        access: u32,
        hugepages: Hugepages,
    ) -> Result<Pool> {
        if !chunk_size.is_power_of_two() || !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&chunk_size)
        {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "chunk pool: chunk_size {chunk_size} is not a power of two in \
                     {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}"
                ),
            ));
        }
        if max_chunks == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "chunk pool: max_chunks 0; a pool needs at least one chunk",
            ));
        }
        if (max_chunks as usize).checked_mul(chunk_size).is_none() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "chunk pool: {max_chunks} chunks of {chunk_size} bytes overflow the address space"
                ),
            ));
        }
        let pool = Pool {
            registrar,
            chunk_size,
            shift: chunk_size.trailing_zeros(),
            cap: max_chunks,
            access,
            hugepages,
            state: Mutex::new(State::default()),
        };
        {
            let mut st = pool.state.lock();
            pool.grow(&mut st)?;
            let r = &st.regions[0];
            log::info!(
                "chunk pool: up to {} chunks of {} B ({} MiB), access {:#x}; first arena {} MiB at \
                 {:#x}: {} pages (hugepages = {:?})",
                max_chunks,
                chunk_size,
                (max_chunks as usize * chunk_size) >> 20,
                access,
                r.arena.len() >> 20,
                r.base,
                r.arena.backing(),
                hugepages
            );
        }
        Ok(pool)
    }

    /// A pool per the settings' `chunk_size`, `pool_chunks` and `hugepages`.
    pub fn from_settings(
        registrar: Arc<dyn Registrar>,
        settings: &Settings,
        access: u32,
    ) -> Result<Pool> {
        Pool::new(
            registrar,
            settings.chunk_size as usize,
            settings.pool_chunks,
            access,
            settings.hugepages,
        )
    }

    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    pub fn cap(&self) -> u32 {
        self.cap
    }

    pub fn access(&self) -> u32 {
        self.access
    }

    /// Takes a free chunk, growing the pool by one arena when none is free and the cap
    /// allows. `Full` when all `max_chunks` chunks are out.
    pub fn get(&self) -> Result<Chunk> {
        let mut st = self.state.lock();
        let index = match st.free.pop() {
            Some(i) => i,
            None => {
                self.grow(&mut st)?;
                st.free.pop().ok_or_else(|| self.full_error())?
            }
        };
        st.set_bit(index, true);
        st.in_use_count += 1;
        match self.chunk_of(&st, index) {
            Some(c) => Ok(c),
            None => {
                // Unreachable: free indices are always < total. Undo, do not panic.
                st.set_bit(index, false);
                st.in_use_count -= 1;
                st.free.push(index);
                Err(Error::new(
                    ErrorKind::InvalidValue,
                    format!("chunk pool: free chunk {index} has no arena (internal error)"),
                ))
            }
        }
    }

    /// Gives a chunk back. Rejects (`InvalidArgument`, pool unchanged) a chunk that is not
    /// out, or whose address, index, length or keys are not those of this pool's chunk.
    pub fn put(&self, chunk: Chunk) -> Result<()> {
        let mut st = self.state.lock();
        let index = self.locate(&st, chunk.addr as usize)?;
        let expected = self.chunk_of(&st, index);
        if expected.as_ref() != Some(&chunk) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "chunk pool: put of a chunk that does not match this pool's chunk at {:p} \
                     (given {:?}, expected {:?})",
                    chunk.addr, chunk, expected
                ),
            ));
        }
        self.release(&mut st, index)
    }

    /// Gives back the chunk starting at `addr` (the C ABI's way). Rejects
    /// (`InvalidArgument`, pool unchanged) NULL, an address outside the pool, one inside a
    /// chunk but not at its start, and a chunk that is not out (double put).
    pub fn put_addr(&self, addr: *const u8) -> Result<()> {
        let mut st = self.state.lock();
        let index = self.locate(&st, addr as usize)?;
        self.release(&mut st, index)
    }

    /// The keys of the memory region holding `[addr, addr + len)`, when that range lies
    /// within the carved chunks of one arena of this pool (chunk-in-use state is not
    /// checked). Lets callers post SGEs into pooled memory without looking up the chunk.
    pub fn keys_for(&self, addr: *const u8, len: usize) -> Option<MrKeys> {
        let st = self.state.lock();
        let r = st.region_of_addr(addr as usize)?;
        let carved_end = r.base + ((r.carved as usize) << self.shift);
        let end = (addr as usize).checked_add(len)?;
        (end <= carved_end).then_some(r.keys)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        let st = self.state.lock();
        let backing = st
            .regions
            .iter()
            .map(|r| r.arena.backing())
            .min()
            .unwrap_or(Backing::Plain);
        PoolStats {
            chunk_size: self.chunk_size,
            chunks_total: st.total,
            chunks_in_use: st.in_use_count,
            chunks_cap: self.cap,
            arenas: st.regions.len(),
            bytes_mapped: st.bytes_mapped,
            backing,
            metadata_bytes: std::mem::size_of::<Pool>()
                + st.free.capacity() * std::mem::size_of::<u32>()
                + st.in_use.capacity() * std::mem::size_of::<u64>()
                + st.regions.capacity() * std::mem::size_of::<Region>()
                + st.by_addr.capacity() * std::mem::size_of::<u32>(),
        }
    }

    fn full_error(&self) -> Error {
        Error::new(
            ErrorKind::Full,
            format!(
                "pool of {} chunks of {} bytes is exhausted; raise pool_chunks",
                self.cap, self.chunk_size
            ),
        )
    }

    fn chunk_of(&self, st: &State, index: u32) -> Option<Chunk> {
        let r = st.region_of_index(index)?;
        let offset = ((index - r.first) as usize) << self.shift;
        Some(Chunk {
            addr: r.arena.addr().wrapping_add(offset),
            len: self.chunk_size,
            lkey: r.keys.lkey,
            rkey: r.keys.rkey,
            index,
        })
    }

    /// The index of the chunk starting at `addr`, or why `addr` is not one.
    fn locate(&self, st: &State, addr: usize) -> Result<u32> {
        let reject = |why: String| Err(Error::new(ErrorKind::InvalidArgument, why));
        if addr == 0 {
            return reject("chunk pool: put of a NULL pointer".into());
        }
        let Some(r) = st.region_of_addr(addr) else {
            return reject(format!(
                "chunk pool: put of {addr:#x}, which is not in this pool ({} arenas, {} MiB)",
                st.regions.len(),
                st.bytes_mapped >> 20
            ));
        };
        let offset = addr - r.base;
        let within = (offset >> self.shift) as u32;
        if within >= r.carved {
            return reject(format!(
                "chunk pool: put of {addr:#x}, which lies in the uncarved tail of an arena \
                 (never handed out)"
            ));
        }
        let index = r.first + within;
        let misalign = offset & (self.chunk_size - 1);
        if misalign != 0 {
            return reject(format!(
                "chunk pool: put of {addr:#x}, which is {misalign} bytes into chunk {index} \
                 (starting at {:#x}); put takes a chunk's start address",
                addr - misalign
            ));
        }
        Ok(index)
    }

    fn release(&self, st: &mut State, index: u32) -> Result<()> {
        if !st.bit(index) {
            let addr = self.chunk_of(st, index).map_or(0, |c| c.addr as usize);
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("chunk pool: double put of chunk {index} at {addr:#x} (it is not out)"),
            ));
        }
        st.set_bit(index, false);
        st.in_use_count -= 1;
        st.free.push(index);
        Ok(())
    }

    /// Maps, registers and carves the next arena; `Full` at the cap.
    fn grow(&self, st: &mut State) -> Result<()> {
        let remaining = self.cap - st.total;
        if remaining == 0 {
            return Err(self.full_error());
        }
        let step = ARENA_ALIGN << st.regions.len().min(5);
        let needed = (remaining as usize)
            .saturating_mul(self.chunk_size)
            .next_multiple_of(ARENA_ALIGN);
        let len = step.min(needed).min(MAX_ARENA_SIZE);
        let arena = Arena::new_quiet(len, self.hugepages)?;
        let carved = ((len >> self.shift) as u32).min(remaining);
        let reg_len = (carved as usize) << self.shift;
        // SAFETY: the arena stays mapped until deregistration succeeds: it is owned by
        // `Region` in `self.state`, and `Drop for Pool` unmaps an arena only after
        // `deregister` returned Ok (it leaks it otherwise). On the error path below the
        // registration did not happen, so dropping the arena is fine.
        let keys = unsafe { self.registrar.register(arena.addr(), reg_len, self.access) }.map_err(
            |e| {
                Error::new(
                    e.kind(),
                    format!(
                        "chunk pool: registering a {} MiB arena ({} pages): {}",
                        len >> 20,
                        arena.backing(),
                        e.message()
                    ),
                )
            },
        )?;
        let base = arena.addr() as usize;
        let first = st.total;
        if let Some(prev) = st.regions.last()
            && prev.arena.backing() != arena.backing()
        {
            log::info!(
                "chunk pool: arena {} ({} MiB): {} pages (earlier arenas: {})",
                st.regions.len(),
                len >> 20,
                arena.backing(),
                prev.arena.backing()
            );
        }
        let new_total = first + carved;
        st.free
            .reserve_exact((new_total as usize).saturating_sub(st.free.len()));
        st.free.extend((first..new_total).rev());
        let words = (new_total as usize).div_ceil(64);
        st.in_use
            .reserve_exact(words.saturating_sub(st.in_use.len()));
        st.in_use.resize(words, 0);
        st.regions.reserve_exact(1);
        st.by_addr.reserve_exact(1);
        let ri = st.regions.len() as u32;
        st.regions.push(Region {
            arena,
            base,
            first,
            carved,
            keys,
        });
        let pos = st
            .by_addr
            .partition_point(|&i| st.regions[i as usize].base < base);
        st.by_addr.insert(pos, ri);
        st.total = new_total;
        st.bytes_mapped += len;
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        if st.in_use_count > 0 {
            log::warn!(
                "chunk pool dropped with {} of {} chunks still out; their memory is unmapped now",
                st.in_use_count,
                st.total
            );
        }
        for region in std::mem::take(&mut st.regions) {
            match self.registrar.deregister(region.keys.lkey) {
                Ok(()) => drop(region.arena),
                Err(e) => {
                    log::error!(
                        "chunk pool: deregistering the {} MiB arena at {:#x} (lkey {:#x}) failed: \
                         {e}; leaking it mapped",
                        region.arena.len() >> 20,
                        region.base,
                        region.keys.lkey
                    );
                    std::mem::forget(region.arena);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// A registrar that records calls and hands out keys lkey = 0x100 + n, rkey = 0x200 + n.
    #[derive(Default)]
    struct FakeRegistrar {
        registered: Mutex<HashMap<u32, (usize, usize, u32)>>,
        registers: AtomicUsize,
        deregisters: AtomicUsize,
        fail_register_after: Option<usize>,
        deregister_busy: bool,
    }

    impl Registrar for FakeRegistrar {
        unsafe fn register(&self, addr: *mut u8, len: usize, access: u32) -> Result<MrKeys> {
            let n = self.registers.fetch_add(1, Ordering::SeqCst);
            if self.fail_register_after.is_some_and(|k| n >= k) {
                return Err(Error::new(ErrorKind::Io, "fake registrar: out of MRs"));
            }
            let keys = MrKeys {
                lkey: 0x100 + n as u32,
                rkey: 0x200 + n as u32,
            };
            self.registered
                .lock()
                .insert(keys.lkey, (addr as usize, len, access));
            Ok(keys)
        }

        fn deregister(&self, lkey: u32) -> Result<()> {
            self.deregisters.fetch_add(1, Ordering::SeqCst);
            if self.deregister_busy {
                return Err(Error::new(ErrorKind::Busy, "fake registrar: busy"));
            }
            self.registered
                .lock()
                .remove(&lkey)
                .map(|_| ())
                .ok_or_else(|| Error::new(ErrorKind::InvalidArgument, "unknown lkey"))
        }
    }

    const ACCESS: u32 = 0b111;

    fn pool(cs: usize, cap: u32) -> (Arc<FakeRegistrar>, Pool) {
        let reg = Arc::new(FakeRegistrar::default());
        let p = Pool::new(reg.clone(), cs, cap, ACCESS, Hugepages::Off).unwrap();
        (reg, p)
    }

    #[test]
    fn get_put_round_trip() {
        let (reg, p) = pool(4096, 16);
        let c = p.get().unwrap();
        assert_eq!(c.len, 4096);
        assert_eq!(c.index, 0);
        assert_eq!(
            c.addr as usize % ARENA_ALIGN,
            0,
            "first chunk at the arena start"
        );
        assert_eq!((c.lkey, c.rkey), (0x100, 0x200));
        let (addr, len, access) = reg.registered.lock()[&c.lkey];
        assert_eq!((addr, len, access), (c.addr as usize, 16 * 4096, ACCESS));
        // SAFETY: the chunk is out and the pool alive: 4096 writable bytes.
        unsafe { std::ptr::write_bytes(c.addr, 0xab, c.len) };
        assert_eq!(p.stats().chunks_in_use, 1);
        assert_eq!(p.keys_for(c.addr, 4096), Some(c.keys()));
        let again = c.clone();
        p.put(c).unwrap();
        assert_eq!(p.stats().chunks_in_use, 0);
        // LIFO: the same chunk comes back.
        assert_eq!(p.get().unwrap(), again);
        p.put_addr(again.addr).unwrap();
        let s = p.stats();
        assert_eq!((s.chunks_in_use, s.chunks_total, s.arenas), (0, 16, 1));
        assert_eq!(s.backing, Backing::Plain);
        assert_eq!(s.bytes_mapped, ARENA_ALIGN);
    }

    #[test]
    fn grows_to_exactly_the_cap_then_full() {
        // 1000 x 4K = 4,096,000 B: two 2 MiB arenas, the second only partly carved.
        let (reg, p) = pool(4096, 1000);
        assert_eq!(
            reg.registers.load(Ordering::SeqCst),
            1,
            "first arena at new()"
        );
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for i in 0..1000 {
            let c = p.get().unwrap();
            assert_eq!(c.addr as usize % 4096, 0);
            assert!(seen.insert(c.addr as usize), "chunk {i} handed out twice");
            out.push(c);
        }
        let s = p.stats();
        assert_eq!(
            (s.chunks_total, s.chunks_in_use, s.chunks_cap),
            (1000, 1000, 1000)
        );
        assert_eq!((s.arenas, s.bytes_mapped), (2, 4 << 20));
        assert_eq!(
            reg.registers.load(Ordering::SeqCst),
            2,
            "one registration per arena"
        );
        let regs = reg.registered.lock().clone();
        let mut lens: Vec<usize> = regs.values().map(|v| v.1).collect();
        lens.sort();
        assert_eq!(lens, vec![(1000 - 512) * 4096, 512 * 4096]);
        // Keys match the region each chunk lies in.
        for c in &out {
            let (base, len, _) = regs[&c.lkey];
            assert!(c.addr as usize >= base && c.addr as usize + c.len <= base + len);
            assert_eq!(c.rkey, c.lkey + 0x100);
        }
        for _ in 0..3 {
            let e = p.get().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Full);
            assert_eq!(
                e.message(),
                "pool of 1000 chunks of 4096 bytes is exhausted; raise pool_chunks"
            );
        }
        assert_eq!(p.stats().chunks_total, 1000);
        assert_eq!(
            reg.registers.load(Ordering::SeqCst),
            2,
            "no arena past the cap"
        );
        // After a put the pool serves again, without growing.
        let c = out.pop().unwrap();
        let addr = c.addr;
        p.put(c).unwrap();
        assert_eq!(p.get().unwrap().addr, addr);
        for c in out {
            p.put(c).unwrap();
        }
        drop(p);
        assert_eq!(reg.deregisters.load(Ordering::SeqCst), 2);
        assert!(reg.registered.lock().is_empty());
    }

    #[test]
    fn arenas_double_and_are_clipped_to_the_cap() {
        // 40 MiB of 64K chunks: 2 + 4 + 8 + 16 + (10 left, of a 32 MiB step) MiB.
        let (reg, p) = pool(65536, 640);
        let out: Vec<Chunk> = (0..640).map(|_| p.get().unwrap()).collect();
        let s = p.stats();
        assert_eq!(s.arenas, 5);
        assert_eq!(s.bytes_mapped, 40 << 20);
        assert_eq!(reg.registers.load(Ordering::SeqCst), 5);
        assert_eq!(p.get().unwrap_err().kind(), ErrorKind::Full);
        for c in out {
            p.put_addr(c.addr).unwrap();
        }
        // Chunk sizes at both ends of the range.
        for (cs, cap) in [(512usize, 5000u32), (2 << 20, 3)] {
            let (_, p) = pool(cs, cap);
            let out: Vec<Chunk> = (0..cap).map(|_| p.get().unwrap()).collect();
            assert!(out.iter().all(|c| c.addr as usize % cs == 0 && c.len == cs));
            assert_eq!(p.get().unwrap_err().kind(), ErrorKind::Full);
            assert_eq!(p.stats().chunks_total, cap);
        }
    }

    #[test]
    fn double_put_is_rejected_without_harm() {
        let (_, p) = pool(4096, 8);
        let a = p.get().unwrap();
        let b = p.get().unwrap();
        let a_copy = a.clone();
        p.put(a).unwrap();
        for e in [
            p.put(a_copy.clone()).unwrap_err(),
            p.put_addr(a_copy.addr).unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.message().contains("double put of chunk 0"), "{e}");
        }
        let s = p.stats();
        assert_eq!(s.chunks_in_use, 1);
        // The free list holds each chunk once: 7 distinct gets, then Full.
        let mut got: Vec<Chunk> = (0..7).map(|_| p.get().unwrap()).collect();
        let set: HashSet<usize> = got.iter().map(|c| c.addr as usize).collect();
        assert_eq!(set.len(), 7);
        assert!(!set.contains(&(b.addr as usize)));
        assert_eq!(p.get().unwrap_err().kind(), ErrorKind::Full);
        got.push(b);
        for c in got {
            p.put(c).unwrap();
        }
        assert_eq!(p.stats().chunks_in_use, 0);
    }

    #[test]
    fn foreign_pointers_are_rejected() {
        let (_, p) = pool(4096, 1000);
        let c = p.get().unwrap();
        let in_use_before = p.stats();
        let check = |r: Result<()>, what: &str| {
            let e = r.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.message().contains(what), "expected '{what}' in: {e}");
        };
        check(p.put_addr(std::ptr::null()), "NULL");
        check(
            p.put_addr(c.addr.wrapping_add(100)),
            "100 bytes into chunk 0",
        );
        check(
            p.put_addr(c.addr.wrapping_add(4095)),
            "4095 bytes into chunk 0",
        );
        check(p.put_addr(c.addr.wrapping_sub(1)), "not in this pool");
        let local = 0u64;
        check(p.put_addr((&raw const local).cast()), "not in this pool");
        check(p.put_addr(usize::MAX as *const u8), "not in this pool");
        // Past the carved part of the second arena (1000 - 512 chunks carved there).
        while p.stats().arenas < 2 {
            p.get().unwrap();
        }
        let s = p.stats();
        let tail = {
            let st = p.state.lock();
            let r = &st.regions[1];
            r.base + (r.carved as usize) * 4096
        };
        check(p.put_addr(tail as *const u8), "uncarved tail");
        // A Chunk whose fields do not match.
        let mut forged = c.clone();
        forged.lkey ^= 1;
        check(p.put(forged), "does not match");
        let mut forged = c.clone();
        forged.index += 1;
        check(p.put(forged), "does not match");
        let mut forged = c.clone();
        forged.len = 8192;
        check(p.put(forged), "does not match");
        // Another pool's chunk.
        let (_, other) = pool(4096, 4);
        let oc = other.get().unwrap();
        check(p.put_addr(oc.addr), "not in this pool");
        other.put(oc).unwrap();
        // Nothing changed.
        assert_eq!(p.stats(), s);
        assert_eq!(in_use_before.chunks_total, 512);
        p.put(c).unwrap();
    }

    #[test]
    fn bad_arguments_are_rejected() {
        let reg: Arc<dyn Registrar> = Arc::new(FakeRegistrar::default());
        for cs in [0, 256, 1000, 4097, 4 << 20] {
            let e = Pool::new(reg.clone(), cs, 16, ACCESS, Hugepages::Off).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(e.message().contains("power of two"), "{e}");
        }
        let e = Pool::new(reg.clone(), 4096, 0, ACCESS, Hugepages::Off).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn registration_failures_surface() {
        let reg = Arc::new(FakeRegistrar {
            fail_register_after: Some(0),
            ..Default::default()
        });
        let e = Pool::new(reg, 4096, 16, ACCESS, Hugepages::Off).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(e.message().contains("registering a 2 MiB arena"), "{e}");
        // Failing on the second arena: get() reports it, the pool stays usable.
        let reg = Arc::new(FakeRegistrar {
            fail_register_after: Some(1),
            ..Default::default()
        });
        let p = Pool::new(reg.clone(), 4096, 1000, ACCESS, Hugepages::Off).unwrap();
        let out: Vec<Chunk> = (0..512).map(|_| p.get().unwrap()).collect();
        assert_eq!(p.get().unwrap_err().kind(), ErrorKind::Io);
        assert_eq!(p.stats().arenas, 1);
        let addr = out[511].addr; // LIFO: the last put comes back first
        for c in out {
            p.put(c).unwrap();
        }
        assert_eq!(p.get().unwrap().addr, addr);
    }

    #[test]
    fn hugepages_on_fails_clearly_or_uses_hugetlb() {
        let reg = Arc::new(FakeRegistrar::default());
        match Pool::new(reg.clone(), 4096, 16, ACCESS, Hugepages::On) {
            Ok(p) => assert_eq!(p.stats().backing, Backing::HugeTlb),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Unsupported);
                assert!(e.message().contains("/proc/sys/vm/nr_hugepages"), "{e}");
                assert_eq!(reg.registers.load(Ordering::SeqCst), 0);
            }
        }
        let p = Pool::new(reg, 4096, 16, ACCESS, Hugepages::Auto).unwrap();
        assert_eq!(p.get().unwrap().addr as usize % ARENA_ALIGN, 0);
    }

    #[test]
    fn metadata_is_under_one_percent() {
        for (cs, cap) in [(4096usize, 1024u32), (4096, 65536), (512, 65536)] {
            let (_, p) = pool(cs, cap);
            let out: Vec<Chunk> = (0..cap).map(|_| p.get().unwrap()).collect();
            let s = p.stats();
            let pooled = s.chunks_total as usize * s.chunk_size;
            let ratio = s.metadata_bytes as f64 / pooled as f64;
            assert!(
                ratio <= 0.01,
                "{cs} B x {cap}: {} metadata bytes for {pooled} pooled = {:.3}%",
                s.metadata_bytes,
                ratio * 100.0
            );
            if cs == 4096 {
                assert!(ratio <= 0.0015, "4K chunks: {:.4}%", ratio * 100.0);
            }
            for c in out {
                p.put(c).unwrap();
            }
        }
    }

    #[test]
    fn concurrent_get_put_hands_out_no_duplicates() {
        const THREADS: usize = 4;
        const OPS: usize = 10_000;
        // Below what one thread may hold (40), so Full is hit even without overlap.
        const CAP: u32 = 32;
        let (reg, p) = pool(4096, CAP);
        let p = Arc::new(p);
        let owned: Arc<Vec<AtomicBool>> =
            Arc::new((0..CAP).map(|_| AtomicBool::new(false)).collect());
        let fulls = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (p, owned, fulls) = (p.clone(), owned.clone(), fulls.clone());
                std::thread::spawn(move || {
                    let mut held: Vec<(Chunk, u64)> = Vec::new();
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                    for op in 0..OPS {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let want_get = held.is_empty() || (held.len() < 40 && rng % 3 != 0);
                        if want_get {
                            match p.get() {
                                Ok(c) => {
                                    assert!(
                                        !owned[c.index as usize].swap(true, Ordering::SeqCst),
                                        "chunk {} handed out twice",
                                        c.index
                                    );
                                    let tag = ((t as u64) << 32) | op as u64;
                                    // SAFETY: the chunk is out to this thread only (checked
                                    // above) and 4096 >= 8 bytes, chunk-aligned.
                                    unsafe { c.addr.cast::<u64>().write(tag) };
                                    held.push((c, tag));
                                }
                                Err(e) => {
                                    assert_eq!(e.kind(), ErrorKind::Full);
                                    fulls.fetch_add(1, Ordering::Relaxed);
                                    if held.is_empty() {
                                        // Others hold every chunk.
                                        std::thread::yield_now();
                                        continue;
                                    }
                                    let (c, _) = held.swap_remove(0);
                                    owned[c.index as usize].store(false, Ordering::SeqCst);
                                    p.put(c).unwrap();
                                }
                            }
                        } else {
                            let i = (rng as usize / 3) % held.len();
                            let (c, tag) = held.swap_remove(i);
                            // SAFETY: as above; the chunk is still out to this thread.
                            assert_eq!(unsafe { c.addr.cast::<u64>().read() }, tag);
                            owned[c.index as usize].store(false, Ordering::SeqCst);
                            if op % 2 == 0 {
                                p.put(c).unwrap();
                            } else {
                                p.put_addr(c.addr).unwrap();
                            }
                        }
                    }
                    for (c, _) in held {
                        owned[c.index as usize].store(false, Ordering::SeqCst);
                        p.put(c).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = p.stats();
        assert_eq!((s.chunks_in_use, s.chunks_total), (0, CAP));
        assert_eq!(reg.registers.load(Ordering::SeqCst), 1);
        assert!(
            fulls.load(Ordering::Relaxed) > 0,
            "the cap was never reached"
        );
    }

    #[test]
    fn drop_with_chunks_out_deregisters_and_unmaps() {
        let (reg, p) = pool(4096, 1000);
        let out: Vec<Chunk> = (0..600).map(|_| p.get().unwrap()).collect();
        assert_eq!(p.stats().arenas, 2);
        drop(p);
        assert_eq!(reg.deregisters.load(Ordering::SeqCst), 2);
        assert!(reg.registered.lock().is_empty());
        drop(out); // Handles only: nothing is dereferenced.

        // A registrar that refuses deregistration: the arena is leaked, not unmapped.
        let reg = Arc::new(FakeRegistrar {
            deregister_busy: true,
            ..Default::default()
        });
        let p = Pool::new(reg.clone(), 4096, 4, ACCESS, Hugepages::Off).unwrap();
        let c = p.get().unwrap();
        drop(p);
        assert_eq!(reg.deregisters.load(Ordering::SeqCst), 1);
        // SAFETY: the arena was leaked mapped because deregistration failed.
        unsafe { c.addr.write(7) };
    }

    /// Informal cost of get+put; run with
    /// `cargo test --release mem::pool -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn get_put_cost() {
        let (_, p) = pool(4096, 1024);
        let p = Arc::new(p);
        const N: usize = 2_000_000;
        let t0 = std::time::Instant::now();
        for _ in 0..N {
            let c = p.get().unwrap();
            p.put(std::hint::black_box(c)).unwrap();
        }
        let one = t0.elapsed().as_nanos() as f64 / N as f64;
        let t0 = std::time::Instant::now();
        for _ in 0..N {
            let c = p.get().unwrap();
            p.put_addr(std::hint::black_box(c.addr)).unwrap();
        }
        let by_addr = t0.elapsed().as_nanos() as f64 / N as f64;
        let t0 = std::time::Instant::now();
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for _ in 0..N / 4 {
                        let c = p.get().unwrap();
                        p.put(std::hint::black_box(c)).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let four = t0.elapsed().as_nanos() as f64 / N as f64;
        println!(
            "get+put: {one:.1} ns (put), {by_addr:.1} ns (put_addr), 4 threads: {four:.1} ns/pair \
             wall"
        );
    }
}

//! How the engine reaches memory: through keys with access rights, so it owns no data
//! buffers. The soft provider implements this over registered regions; the simulator over
//! plain vectors.

/// Which key namespace a lookup uses: the local key of an SGE or a peer's remote key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Local(u32),
    Remote(u32),
}

/// Why a memory access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemError {
    /// No region with this key.
    BadKey,
    /// The region lacks the required access right.
    Access,
    /// The range is not entirely inside the region.
    Range,
}

/// Registered memory as the engine sees it. `access` is the right required, as
/// `ibv_access_flags` bits (0 for a local read, which every region allows).
pub trait Memory {
    /// Copies `out.len()` bytes at `addr` of region `key` into `out`.
    fn read(&self, key: Key, addr: u64, out: &mut [u8], access: u32) -> Result<(), MemError>;
    /// Copies `data` to `addr` of region `key`.
    fn write(&mut self, key: Key, addr: u64, data: &[u8], access: u32) -> Result<(), MemError>;
    /// Checks that `[addr, addr + len)` lies in region `key` with `access`, without copying.
    fn check(&self, key: Key, addr: u64, len: u64, access: u32) -> Result<(), MemError>;
    /// Lends `[addr, addr + len)` of region `key` (checked like `check`) for zero-copy
    /// transmit. None when the access is refused or this memory cannot lend: the engine
    /// then copies with `read`, which reports the precise error.
    fn slice(&self, key: Key, addr: u64, len: usize, access: u32) -> Option<&[u8]> {
        let _ = (key, addr, len, access);
        None
    }
    /// A hint that `[addr, addr + len)` of region `key` will be read soon (the responder
    /// gives it when a READ request arrives, so the memory fetch overlaps protocol work, as
    /// a NIC pipelines its DMA reads). Never fails; may do nothing.
    fn prefetch(&self, key: Key, addr: u64, len: u64) {
        let _ = (key, addr, len);
    }
    /// Remote invalidation (a SEND_LAST/ONLY_WITH_INVALIDATE's IETH, as rxe
    /// `invalidate_rkey`): `rkey` must name a type-2 memory window bound now to QP `qpn`
    /// (a region's rkey, a type-1 window, a window bound to another QP or none bound is
    /// refused: the caller completes the receive in error). On success no access through
    /// the window can start any more and the lkey of the region it lay in is returned: READ
    /// requests that arrived before the invalidation and whose responses are still queued
    /// are served through that region (requests execute in order). Must not wait on holds
    /// the caller itself has (an access through this very memory view). Default: refused,
    /// a memory without windows.
    fn invalidate_remote(&mut self, qpn: u32, rkey: u32) -> Result<u32, MemError> {
        let _ = (qpn, rkey);
        Err(MemError::BadKey)
    }
}

/// A scatter/gather element: `length` bytes at `addr` of the region with local key `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// A work request's SGE list: up to two inline (no allocation per WR), more on the heap.
/// Build one with `smallvec![..]` (re-exported as `rdmx::rc::smallvec`), `SgeList::new()`
/// and `push`, or `from(vec)`.
pub type SgeList = smallvec::SmallVec<[Sge; 2]>;

/// Total bytes an SGE list covers.
pub fn sge_total(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

/// Walks `sges` over the byte range `[offset, offset + len)` of the list, calling `f` with
/// each piece (sge, address, length, position within the range).
fn for_each_piece(
    sges: &[Sge],
    mut offset: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, usize, usize) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let mut done = 0usize;
    for sge in sges {
        if done == len {
            break;
        }
        let sl = u64::from(sge.length);
        if offset >= sl {
            offset -= sl;
            continue;
        }
        let n = ((sl - offset) as usize).min(len - done);
        f(sge, sge.addr + offset, n, done)?;
        done += n;
        offset = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(MemError::Range)
    }
}

/// The (lkey, address) of `[offset, offset + len)` of an SGE list when it lies inside a
/// single SGE, i.e. is contiguous in one region.
pub fn contiguous(sges: &[Sge], mut offset: u64, len: u64) -> Option<(u32, u64)> {
    for s in sges {
        let sl = u64::from(s.length);
        if offset < sl {
            return (offset + len <= sl).then_some((s.lkey, s.addr + offset));
        }
        offset -= sl;
    }
    None
}

/// For `[offset, offset + len)` of an SGE list that spans SGEs: where its last SGE's piece
/// starts (relative to `offset`) and that piece's (lkey, address). A packet's payload
/// copies what lies before and lends that piece: a messenger SEND is a small header SGE
/// then a 4 KiB data SGE, and its first packet (header + most of the data) was copied whole.
/// None when the range lies in one SGE or runs past the list.
pub fn last_piece(sges: &[Sge], mut offset: u64, len: u64) -> Option<(u64, u32, u64)> {
    let mut pos = 0;
    for s in sges {
        let sl = u64::from(s.length);
        if offset >= sl {
            offset -= sl;
            continue;
        }
        let n = (sl - offset).min(len - pos);
        if pos + n == len {
            return (pos > 0).then_some((pos, s.lkey, s.addr + offset));
        }
        pos += n;
        offset = 0;
    }
    None
}

/// Gathers `out.len()` bytes starting `offset` bytes into the SGE list.
pub fn gather(mem: &dyn Memory, sges: &[Sge], offset: u64, out: &mut [u8]) -> Result<(), MemError> {
    let len = out.len();
    for_each_piece(sges, offset, len, |sge, addr, n, pos| {
        mem.read(Key::Local(sge.lkey), addr, &mut out[pos..pos + n], 0)
    })
}

/// Scatters `data` starting `offset` bytes into the SGE list (needs LOCAL_WRITE).
pub fn scatter(
    mem: &mut dyn Memory,
    sges: &[Sge],
    offset: u64,
    data: &[u8],
) -> Result<(), MemError> {
    for_each_piece(sges, offset, data.len(), |sge, addr, n, pos| {
        mem.write(
            Key::Local(sge.lkey),
            addr,
            &data[pos..pos + n],
            super::verbs::access::LOCAL_WRITE,
        )
    })
}

/// Checks every SGE of a list against its region (`access` as for `Memory::check`).
pub fn check_sges(mem: &dyn Memory, sges: &[Sge], access: u32) -> Result<(), MemError> {
    sges.iter()
        .try_for_each(|s| mem.check(Key::Local(s.lkey), s.addr, u64::from(s.length), access))
}

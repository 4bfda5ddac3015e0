//! `VecMemory`: registered regions backed by plain vectors. What the simulator tests and the
//! engine benchmark hand the engine; also a compact reference for what `Memory` must check.

use super::memory::{Key, MemError, Memory};
use super::verbs::access;

#[derive(Debug, Clone)]
struct Region {
    addr: u64,
    data: Vec<u8>,
    lkey: u32,
    rkey: u32,
    access: u32,
}

/// A memory window over part of a region (`add_window`).
#[derive(Debug, Clone)]
struct Window {
    rkey: u32,
    /// The QP a type-2 window is bound to; None for a type-1 window.
    qpn: Option<u32>,
    lkey: u32,
    addr: u64,
    len: u64,
    access: u32,
    valid: bool,
}

/// A set of regions, each with an lkey, an rkey and `ibv_access_flags`, and memory
/// windows over them.
#[derive(Debug, Clone, Default)]
pub struct VecMemory {
    regions: Vec<Region>,
    windows: Vec<Window>,
}

impl VecMemory {
    pub fn new() -> VecMemory {
        VecMemory::default()
    }

    /// Adds a zeroed region of `len` bytes at virtual address `addr`; keys are chosen by
    /// the caller (tests pick distinct ones).
    pub fn add_region(&mut self, addr: u64, len: usize, lkey: u32, rkey: u32, access: u32) {
        self.regions.push(Region {
            addr,
            data: vec![0; len],
            lkey,
            rkey,
            access,
        });
    }

    /// Adds a memory window `rkey` over `[addr, addr + len)` of the region `lkey` with
    /// `access` (REMOTE_READ/REMOTE_WRITE): type 2 bound to QP `qpn` when `Some`, type 1
    /// when None. Lookups do not check the QP (this memory does not know which QP asks);
    /// remote invalidation does.
    pub fn add_window(
        &mut self,
        rkey: u32,
        qpn: Option<u32>,
        lkey: u32,
        addr: u64,
        len: u64,
        access: u32,
    ) {
        self.windows.push(Window {
            rkey,
            qpn,
            lkey,
            addr,
            len,
            access,
            valid: true,
        });
    }

    /// Whether window `rkey` is still valid (not invalidated).
    pub fn window_valid(&self, rkey: u32) -> bool {
        self.windows.iter().any(|w| w.rkey == rkey && w.valid)
    }

    /// The bytes of the region holding `lkey` (for test assertions).
    pub fn region(&self, lkey: u32) -> Option<&[u8]> {
        self.regions
            .iter()
            .find(|r| r.lkey == lkey)
            .map(|r| &r.data[..])
    }

    /// Mutable bytes of the region holding `lkey` (to fill source buffers).
    pub fn region_mut(&mut self, lkey: u32) -> Option<&mut [u8]> {
        self.regions
            .iter_mut()
            .find(|r| r.lkey == lkey)
            .map(|r| &mut r.data[..])
    }

    fn find(&self, key: Key, addr: u64, len: u64, need: u32) -> Result<(usize, usize), MemError> {
        if let Key::Remote(k) = key
            && let Some(w) = self.windows.iter().find(|w| w.rkey == k)
        {
            if !w.valid {
                return Err(MemError::BadKey);
            }
            if w.access & need & !access::LOCAL_WRITE != need & !access::LOCAL_WRITE {
                return Err(MemError::Access);
            }
            let end = addr.checked_add(len).ok_or(MemError::Range)?;
            if addr < w.addr || end > w.addr + w.len {
                return Err(MemError::Range);
            }
            return self.find(Key::Local(w.lkey), addr, len, need & access::LOCAL_WRITE);
        }
        let idx = self
            .regions
            .iter()
            .position(|r| match key {
                Key::Local(k) => r.lkey == k,
                Key::Remote(k) => r.rkey == k,
            })
            .ok_or(MemError::BadKey)?;
        let r = &self.regions[idx];
        if r.access & need != need {
            return Err(MemError::Access);
        }
        let start = addr.checked_sub(r.addr).ok_or(MemError::Range)?;
        let end = start.checked_add(len).ok_or(MemError::Range)?;
        if end > r.data.len() as u64 {
            return Err(MemError::Range);
        }
        Ok((idx, start as usize))
    }
}

impl Memory for VecMemory {
    fn read(&self, key: Key, addr: u64, out: &mut [u8], need: u32) -> Result<(), MemError> {
        let (i, at) = self.find(key, addr, out.len() as u64, need)?;
        out.copy_from_slice(&self.regions[i].data[at..at + out.len()]);
        Ok(())
    }

    fn write(&mut self, key: Key, addr: u64, data: &[u8], need: u32) -> Result<(), MemError> {
        let (i, at) = self.find(key, addr, data.len() as u64, need | access::LOCAL_WRITE)?;
        self.regions[i].data[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn check(&self, key: Key, addr: u64, len: u64, need: u32) -> Result<(), MemError> {
        self.find(key, addr, len, need).map(|_| ())
    }

    fn prefetch(&self, key: Key, addr: u64, len: u64) {
        if let Ok((i, at)) = self.find(key, addr, len, 0) {
            prefetch_bytes(&self.regions[i].data[at..at + len as usize]);
        }
    }

    fn slice(&self, key: Key, addr: u64, len: usize, need: u32) -> Option<&[u8]> {
        let (i, at) = self.find(key, addr, len as u64, need).ok()?;
        Some(&self.regions[i].data[at..at + len])
    }

    fn invalidate_remote(&mut self, qpn: u32, rkey: u32) -> Result<u32, MemError> {
        let w = self
            .windows
            .iter_mut()
            .find(|w| w.rkey == rkey && w.valid && w.qpn == Some(qpn))
            .ok_or(MemError::BadKey)?;
        w.valid = false;
        Ok(w.lkey)
    }
}

/// Asks the CPU to start loading `bytes`: a hint for the first cache line only. That starts
/// the page walk and the L2 streamer, which fetches the rest of the page by itself; hinting
/// every line measured no faster (`rdmx-perf engine_bench`) and cost ~450 instructions per
/// 4K response, because each hint waits for a fill buffer.
pub fn prefetch_bytes(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if !bytes.is_empty() {
        // SAFETY: SSE is part of the x86_64 baseline, and a prefetch only hints the cache: it
        // cannot fault or change memory, and `bytes` is a valid borrowed non-empty slice.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                bytes.as_ptr().cast(),
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Asks the CPU to start loading all of `bytes`, one hint per 64-byte line: for a payload
/// that a long computation (the soft provider's ICRC of the packet before) will hide.
pub fn prefetch_lines(bytes: &[u8]) {
    for line in bytes.chunks(64) {
        prefetch_bytes(line);
    }
}

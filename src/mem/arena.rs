//! 2 MiB-aligned anonymous memory arenas, the raw material of chunk pools.
//!
//! An arena is `len` bytes (a multiple of 2 MiB) starting at a 2 MiB boundary, backed by
//! one of (see [`Backing`]):
//!
//! - **hugetlb**: `mmap(MAP_HUGETLB | MAP_HUGE_2MB)`, pages from the reserved pool
//!   (`/proc/sys/vm/nr_hugepages`); reserved at map time, so a successful map never fails
//!   later on a fault;
//! - **THP**: an anonymous mapping over-allocated by 2 MiB and trimmed to the boundary,
//!   then `madvise(MADV_HUGEPAGE)` so the kernel backs it with transparent huge pages;
//! - **plain**: the same aligned mapping with `madvise(MADV_NOHUGEPAGE)`, 4K pages.
//!
//! The `hugepages` setting picks the order ([`candidates`]): `on` is hugetlb or an error
//! naming `/proc/sys/vm/nr_hugepages` (never a silent fallback); `auto` is hugetlb, else
//! THP (when `/sys/kernel/mm/transparent_hugepage/enabled` is not `[never]`), else plain;
//! `off` is plain. The mapping is removed when the arena is dropped.

use std::fmt;
use std::ptr::NonNull;

use crate::config::Hugepages;
use crate::error::{Error, ErrorKind, Result};

/// The alignment and size granule of every arena: one x86-64 huge page.
pub const ARENA_ALIGN: usize = 2 << 20;

const NR_HUGEPAGES: &str = "/proc/sys/vm/nr_hugepages";
const FREE_2M_HUGEPAGES: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";
const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// What backs an arena's pages. Ordered from weakest to strongest (`Plain < Thp < HugeTlb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Backing {
    /// 4K pages (`hugepages = off`, or no huge pages of either kind available).
    Plain,
    /// Transparent huge pages requested with `madvise(MADV_HUGEPAGE)`: best effort, the
    /// kernel may still back parts with 4K pages.
    Thp,
    /// Reserved 2 MiB hugetlb pages (`MAP_HUGETLB | MAP_HUGE_2MB`).
    HugeTlb,
}

impl Backing {
    pub fn as_str(self) -> &'static str {
        match self {
            Backing::Plain => "plain",
            Backing::Thp => "thp",
            Backing::HugeTlb => "hugetlb",
        }
    }
}

impl fmt::Display for Backing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether transparent huge pages can be requested with `madvise`: the kernel has THP
/// and its policy is `[always]` or `[madvise]` (not `[never]`).
pub fn thp_available() -> bool {
    std::fs::read_to_string(THP_ENABLED)
        .map(|s| thp_policy_allows_madvise(&s))
        .unwrap_or(false)
}

fn thp_policy_allows_madvise(enabled: &str) -> bool {
    enabled.contains("[always]") || enabled.contains("[madvise]")
}

/// Free 2 MiB hugetlb pages (`None` when the kernel does not say).
pub fn free_hugepages_2m() -> Option<u64> {
    if let Ok(s) = std::fs::read_to_string(FREE_2M_HUGEPAGES) {
        return s.trim().parse().ok();
    }
    // Older kernels: /proc/meminfo describes the default huge page size only.
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    (field("Hugepagesize:")? == 2048).then_some(())?;
    field("HugePages_Free:")
}

/// The backings tried, in order, for a setting (the fallback logic, without side effects).
pub fn candidates(hugepages: Hugepages, thp_available: bool) -> &'static [Backing] {
    match (hugepages, thp_available) {
        (Hugepages::On, _) => &[Backing::HugeTlb],
        (Hugepages::Auto, true) => &[Backing::HugeTlb, Backing::Thp, Backing::Plain],
        (Hugepages::Auto, false) => &[Backing::HugeTlb, Backing::Plain],
        (Hugepages::Off, _) => &[Backing::Plain],
    }
}

/// One 2 MiB-aligned anonymous mapping, unmapped on drop.
pub struct Arena {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

// SAFETY: an Arena owns its mapping exclusively; it only hands out the address and never
// dereferences it, so moving or sharing the handle across threads is sound. Access to the
// memory itself is the users' business (through raw pointers, under their own `unsafe`).
unsafe impl Send for Arena {}
// SAFETY: see `Send`: `&Arena` only exposes the address, length and backing.
unsafe impl Sync for Arena {}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field("backing", &self.backing)
            .finish()
    }
}

impl Arena {
    /// Maps an arena of `len` bytes (a non-zero multiple of 2 MiB) per `hugepages`, and
    /// logs the backing chosen at info level.
    pub fn new(len: usize, hugepages: Hugepages) -> Result<Arena> {
        let arena = Self::map(len, hugepages)?;
        log::info!(
            "arena of {} MiB at {:p}: {} pages (hugepages = {})",
            len >> 20,
            arena.ptr,
            arena.backing,
            setting_name(hugepages)
        );
        Ok(arena)
    }

    /// [`Arena::new`] logging at debug level only (pools log their own summary).
    pub(crate) fn new_quiet(len: usize, hugepages: Hugepages) -> Result<Arena> {
        let arena = Self::map(len, hugepages)?;
        log::debug!(
            "arena of {} MiB at {:p}: {} pages",
            len >> 20,
            arena.ptr,
            arena.backing
        );
        Ok(arena)
    }

    fn map(len: usize, hugepages: Hugepages) -> Result<Arena> {
        if len == 0 || len % ARENA_ALIGN != 0 || len > isize::MAX as usize - ARENA_ALIGN {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "arena size {len} bytes is not a non-zero multiple of 2 MiB ({ARENA_ALIGN} bytes)"
                ),
            ));
        }
        let thp = thp_available();
        let mut last_err = None;
        for &backing in candidates(hugepages, thp) {
            let result = match backing {
                Backing::HugeTlb => map_hugetlb(len),
                Backing::Thp | Backing::Plain => map_aligned(len, backing),
            };
            match result {
                Ok(arena) => return Ok(arena),
                Err(e) => {
                    log::debug!(
                        "arena of {} MiB: {backing} pages unavailable: {e}",
                        len >> 20
                    );
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| Error::new(ErrorKind::Unsupported, "no arena backing")))
    }

    /// The first byte (2 MiB-aligned).
    pub fn addr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: arenas are at least 2 MiB.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Whether `[addr, addr + len)` lies inside this arena.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let base = self.ptr.as_ptr() as usize;
        addr >= base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= base + self.len)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr + len` is exactly the mapping this arena created and owns; no
        // Rust reference into it outlives the arena (only raw addresses were handed out).
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if rc != 0 {
            log::error!(
                "munmap of the {} MiB arena at {:p} failed: {}",
                self.len >> 20,
                self.ptr,
                std::io::Error::last_os_error()
            );
        }
    }
}

fn setting_name(h: Hugepages) -> &'static str {
    match h {
        Hugepages::Auto => "auto",
        Hugepages::On => "on",
        Hugepages::Off => "off",
    }
}

/// `mmap` of anonymous private read/write memory; the OS error on `MAP_FAILED`.
fn mmap_anon(
    len: usize,
    extra_flags: libc::c_int,
) -> std::result::Result<NonNull<u8>, std::io::Error> {
    // SAFETY: an anonymous private mapping at a kernel-chosen address touches no existing
    // memory; the result is checked against MAP_FAILED before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap returned NULL"))
}

fn map_hugetlb(len: usize) -> Result<Arena> {
    let pages = len / ARENA_ALIGN;
    let ptr = mmap_anon(len, libc::MAP_HUGETLB | libc::MAP_HUGE_2MB).map_err(|e| {
        let free = free_hugepages_2m()
            .map(|n| n.to_string())
            .unwrap_or_else(|| "unknown".into());
        Error::new(
            ErrorKind::Unsupported,
            format!(
                "hugepages = on: cannot map a {} MiB arena from 2 MiB hugetlb pages (needs {pages}, \
                 {free} free): {e}; reserve pages with `echo N > {NR_HUGEPAGES}` or set \
                 hugepages = auto or off",
                len >> 20
            ),
        )
    })?;
    let arena = Arena {
        ptr,
        len,
        backing: Backing::HugeTlb,
    };
    if arena.addr() as usize % ARENA_ALIGN != 0 {
        // Cannot happen for MAP_HUGE_2MB (the kernel aligns to the page size); dropping
        // the arena unmaps it.
        return Err(Error::new(
            ErrorKind::Io,
            format!("hugetlb mapping at {:p} is not 2 MiB-aligned", arena.ptr),
        ));
    }
    Ok(arena)
}

/// Maps `len + 2 MiB`, trims head and tail so `len` bytes start on a 2 MiB boundary, then
/// advises THP on or off per `backing`. A failing `MADV_HUGEPAGE` downgrades to plain.
fn map_aligned(len: usize, backing: Backing) -> Result<Arena> {
    let raw_len = len + ARENA_ALIGN;
    let raw = mmap_anon(raw_len, 0).map_err(|e| {
        Error::new(
            ErrorKind::Io,
            format!("cannot map a {} MiB arena: {e}", len >> 20),
        )
    })?;
    let raw_addr = raw.as_ptr() as usize;
    let head = raw_addr.next_multiple_of(ARENA_ALIGN) - raw_addr;
    let tail = raw_len - head - len;
    // SAFETY: `head <= ARENA_ALIGN` bytes lie inside the `raw_len` mapping, so the aligned
    // start is in bounds of it.
    let aligned = unsafe { raw.as_ptr().add(head) };
    if head > 0 {
        // SAFETY: `[raw, raw + head)` is the unaligned prefix of our own fresh mapping,
        // page-aligned at both ends (mmap returns page-aligned addresses, ARENA_ALIGN is a
        // page multiple); nothing refers to it.
        unsafe { libc::munmap(raw.as_ptr().cast(), head) };
    }
    if tail > 0 {
        // SAFETY: `[aligned + len, raw + raw_len)` is the unused suffix of the same mapping,
        // page-aligned; nothing refers to it.
        unsafe { libc::munmap(aligned.add(len).cast(), tail) };
    }
    let ptr =
        NonNull::new(aligned).ok_or_else(|| Error::new(ErrorKind::Io, "aligned arena is NULL"))?;
    let mut arena = Arena { ptr, len, backing };
    let advice = match backing {
        Backing::Thp => libc::MADV_HUGEPAGE,
        _ => libc::MADV_NOHUGEPAGE,
    };
    // SAFETY: the range is exactly our own live mapping; madvise only changes paging policy.
    let rc = unsafe { libc::madvise(arena.addr().cast(), len, advice) };
    if rc != 0 && backing == Backing::Thp {
        log::debug!(
            "madvise(MADV_HUGEPAGE) on a {} MiB arena failed: {}; using plain pages",
            len >> 20,
            std::io::Error::last_os_error()
        );
        arena.backing = Backing::Plain;
    }
    Ok(arena)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hugetlb_mappable_expected() -> bool {
        let overcommit = std::fs::read_to_string("/proc/sys/vm/nr_overcommit_hugepages")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(0);
        free_hugepages_2m().unwrap_or(0) > 0 || overcommit > 0
    }

    #[test]
    fn candidates_follow_the_setting() {
        use Backing::*;
        assert_eq!(candidates(Hugepages::On, true), &[HugeTlb]);
        assert_eq!(candidates(Hugepages::On, false), &[HugeTlb]);
        assert_eq!(candidates(Hugepages::Auto, true), &[HugeTlb, Thp, Plain]);
        assert_eq!(candidates(Hugepages::Auto, false), &[HugeTlb, Plain]);
        assert_eq!(candidates(Hugepages::Off, true), &[Plain]);
        assert_eq!(candidates(Hugepages::Off, false), &[Plain]);
        assert!(Plain < Thp && Thp < HugeTlb);
    }

    #[test]
    fn thp_policy_parsing() {
        assert!(thp_policy_allows_madvise("always [madvise] never\n"));
        assert!(thp_policy_allows_madvise("[always] madvise never\n"));
        assert!(!thp_policy_allows_madvise("always madvise [never]\n"));
        assert!(!thp_policy_allows_madvise(""));
    }

    #[test]
    fn off_is_plain_and_aligned() {
        for mib in [2, 4, 6, 64] {
            let a = Arena::new(mib << 20, Hugepages::Off).unwrap();
            assert_eq!(a.backing(), Backing::Plain);
            assert_eq!(a.addr() as usize % ARENA_ALIGN, 0);
            assert_eq!(a.len(), mib << 20);
            // The whole range is usable.
            // SAFETY: the arena is a live, exclusively owned RW mapping of `len` bytes.
            unsafe {
                a.addr().write(1);
                a.addr().add(a.len() - 1).write(2);
                assert_eq!(a.addr().read() + a.addr().add(a.len() - 1).read(), 3);
            }
        }
    }

    #[test]
    fn auto_falls_back_in_order() {
        let a = Arena::new(4 << 20, Hugepages::Auto).unwrap();
        eprintln!("hugepages=auto: {} pages", a.backing());
        assert_eq!(a.addr() as usize % ARENA_ALIGN, 0);
        let expected_fallback = if thp_available() {
            Backing::Thp
        } else {
            Backing::Plain
        };
        if hugetlb_mappable_expected() {
            // Pages may be taken by someone else meanwhile; either is correct then.
            assert!(a.backing() == Backing::HugeTlb || a.backing() == expected_fallback);
        } else {
            assert_eq!(a.backing(), expected_fallback);
        }
    }

    #[test]
    fn on_without_hugepages_fails_clearly() {
        match Arena::new(2 << 20, Hugepages::On) {
            Ok(a) => {
                assert!(
                    hugetlb_mappable_expected(),
                    "hugetlb mapped with no free pages?"
                );
                assert_eq!(a.backing(), Backing::HugeTlb);
                assert_eq!(a.addr() as usize % ARENA_ALIGN, 0);
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Unsupported);
                assert!(e.message().contains("/proc/sys/vm/nr_hugepages"), "{e}");
                assert!(e.message().contains("hugetlb"), "{e}");
                eprintln!("hugepages=on: {e}");
            }
        }
        if !hugetlb_mappable_expected() {
            assert!(Arena::new(2 << 20, Hugepages::On).is_err());
        }
    }

    #[test]
    fn bad_sizes_are_rejected() {
        for len in [0, 4096, (2 << 20) + 4096, 3 << 20, usize::MAX] {
            let e = Arena::new(len, Hugepages::Off).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{len}");
            assert!(e.message().contains("multiple of 2 MiB"), "{e}");
        }
    }

    #[test]
    fn contains_checks_bounds() {
        let a = Arena::new(2 << 20, Hugepages::Off).unwrap();
        let base = a.addr() as usize;
        assert!(a.contains(base, a.len()));
        assert!(a.contains(base + 10, 10));
        assert!(!a.contains(base - 1, 1));
        assert!(!a.contains(base + a.len(), 1));
        assert!(!a.contains(base + 1, a.len()));
        assert!(!a.contains(usize::MAX, 2));
    }
}

//! `rdmx_pool_*`, `rdmx_chunk_*` (pooled, pre-registered chunks) and `rdmx_mem_*`
//! (registration of caller buffers through the registration cache).

use super::boundary::{self, handle, out_ptr};
use super::context::rdmx_context;
use super::sized::{sized_out, write_sized};
use super::status::rdmx_status;
use crate::error::{Error, ErrorKind};
use crate::mem::arena::Backing;
use crate::mem::pool::Pool;
use crate::mem::rcache::Handle;
use std::ffi::c_void;

/// A pool of fixed-size chunks carved from 2 MiB-aligned arenas, each arena registered
/// once. Opaque; create with `rdmx_pool_new`, free with `rdmx_pool_free`. Thread-safe.
#[allow(non_camel_case_types)]
pub struct rdmx_pool {
    inner: Pool,
}

/// One chunk: `length` bytes at `addr`, usable in SGEs with `lkey` and by peers with `rkey`
/// (if the pool was created with remote access).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct rdmx_chunk {
    pub addr: *mut c_void,
    pub length: u64,
    pub lkey: u32,
    pub rkey: u32,
}

/// Arena backing: how the pool's memory is mapped (weakest of its arenas).
pub const RDMX_BACKING_PLAIN: u32 = 0;
/// Transparent huge pages (madvise).
pub const RDMX_BACKING_THP: u32 = 1;
/// MAP_HUGETLB 2 MiB pages.
pub const RDMX_BACKING_HUGETLB: u32 = 2;

/// Pool statistics.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_pool_stats {
    /// Set by the caller to `sizeof` this struct before the call; rdmx fills at most that
    /// many bytes and writes back how many it filled (see "Structs that grow" at the top of
    /// this header). The order of the fields is frozen: new fields are only added at the end.
    pub struct_size: usize,
    pub chunk_size: u64,
    /// Chunks carved so far (grows arena by arena up to `chunks_cap`).
    pub chunks_total: u32,
    pub chunks_in_use: u32,
    pub chunks_cap: u32,
    pub arenas: u32,
    pub bytes_mapped: u64,
    /// RDMX_BACKING_*.
    pub backing: u32,
    /// The pool's own bookkeeping.
    pub metadata_bytes: u64,
}

/// A registration made through the cache (plain data; give it back to `rdmx_mem_dereg`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_mem {
    /// The registered region (it covers the range asked for, maybe more).
    pub addr: u64,
    pub length: u64,
    pub lkey: u32,
    pub rkey: u32,
    /// Identifies this registration for `rdmx_mem_dereg`.
    pub id: u64,
}

/// Registration cache statistics.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_rcache_stats {
    /// Set by the caller to `sizeof` this struct before the call; rdmx fills at most that
    /// many bytes and writes back how many it filled (see "Structs that grow" at the top of
    /// this header). The order of the fields is frozen: new fields are only added at the end.
    pub struct_size: usize,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub invalidations: u64,
    pub entries: u64,
    pub registered_bytes: u64,
}

/// Creates a pool of `chunk_size`-byte chunks (0: the config's `chunk_size`, default 4096)
/// holding at most `max_chunks` (0: `pool_chunks`) registered with `access`
/// (RDMX_ACCESS_* bits). Arenas are 2 MiB-aligned, mapped per the config's `hugepages`
/// (`on` without reserved huge pages fails with RDMX_UNSUPPORTED, naming
/// /proc/sys/vm/nr_hugepages). The first arena is mapped and registered here; the pool
/// grows arena by arena as chunks are taken, never beyond `max_chunks`.
///
/// # Safety
/// `ctx` NULL or live; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_pool_new(
    ctx: *mut rdmx_context,
    chunk_size: usize,
    max_chunks: u32,
    access: u32,
    out: *mut *mut rdmx_pool,
) -> rdmx_status {
    boundary::call("rdmx_pool_new", || {
        let out = out_ptr(out)?;
        // SAFETY: `out` checked non-NULL and writable per the contract.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: forwarded contract.
        let ctx = unsafe { handle(ctx, "ctx") }?;
        let p = Box::new(rdmx_pool {
            inner: ctx.inner.pool(chunk_size, max_chunks, access)?,
        });
        // SAFETY: as above.
        unsafe { out.write(Box::into_raw(p)) };
        Ok(())
    })
}

/// Frees a pool: deregisters and unmaps its arenas. NULL is a no-op. Chunks still out
/// become invalid (a warning is logged); an arena that work requests in flight still name
/// is left mapped (and an error logged) rather than unmapped under I/O, so close the
/// connections that use the pool first.
///
/// # Safety
/// `pool` NULL or from `rdmx_pool_new`, not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_pool_free(pool: *mut rdmx_pool) {
    boundary::call_value("rdmx_pool_free", (), || {
        if !pool.is_null() {
            // SAFETY: ownership returns here exactly once, per the contract.
            drop(unsafe { Box::from_raw(pool) });
        }
    })
}

/// Takes a chunk. RDMX_FULL when the pool holds `max_chunks` chunks and all are out.
///
/// # Safety
/// `pool` NULL or live; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_chunk_get(pool: *mut rdmx_pool, out: *mut rdmx_chunk) -> rdmx_status {
    boundary::call("rdmx_chunk_get", || {
        let out = out_ptr(out)?;
        // SAFETY: forwarded contract.
        let pool = unsafe { handle(pool, "pool") }?;
        let c = pool.inner.get()?;
        // SAFETY: `out` checked non-NULL and writable.
        unsafe {
            out.write(rdmx_chunk {
                addr: c.addr.cast(),
                length: c.len as u64,
                lkey: c.lkey,
                rkey: c.rkey,
            })
        };
        Ok(())
    })
}

/// Gives a chunk back by its address. A pointer that is not the start of a chunk of this
/// pool, or a chunk already given back, is rejected (RDMX_INVALID_ARGUMENT, saying which)
/// and the pool is left unchanged.
///
/// # Safety
/// `pool` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_chunk_put(pool: *mut rdmx_pool, addr: *const c_void) -> rdmx_status {
    boundary::call("rdmx_chunk_put", || {
        // SAFETY: forwarded contract.
        unsafe { handle(pool, "pool") }?.inner.put_addr(addr.cast())
    })
}

/// The pool's statistics.
///
/// # Safety
/// `pool` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_pool_get_stats(
    pool: *const rdmx_pool,
    out: *mut rdmx_pool_stats,
) -> rdmx_status {
    boundary::call("rdmx_pool_get_stats", || {
        // SAFETY: forwarded contract.
        let s = unsafe { handle(pool, "pool") }?.inner.stats();
        let v = rdmx_pool_stats {
            struct_size: 0,
            chunk_size: s.chunk_size as u64,
            chunks_total: s.chunks_total,
            chunks_in_use: s.chunks_in_use,
            chunks_cap: s.chunks_cap,
            arenas: s.arenas as u32,
            bytes_mapped: s.bytes_mapped as u64,
            backing: match s.backing {
                Backing::Plain => RDMX_BACKING_PLAIN,
                Backing::Thp => RDMX_BACKING_THP,
                Backing::HugeTlb => RDMX_BACKING_HUGETLB,
            },
            metadata_bytes: s.metadata_bytes as u64,
        };
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, v) }?;
        Ok(())
    })
}

/// Registers `[addr, addr + len)` with at least `access` through the registration cache:
/// a cached registration that covers the range with those rights is reused (no
/// registration cost), else a new one is made (pinning the pages, within RLIMIT_MEMLOCK:
/// RDMX_RESOURCE_LIMIT when refused). `*out` carries the keys; the registered region may
/// be larger than asked (whole pages).
///
/// Release with `rdmx_mem_dereg`: the registration stays cached for the next use of the
/// same memory until it is evicted (beyond `rcache_entries`, least recently used first) or
/// invalidated. BEFORE YOU UNMAP OR FREE MEMORY registered through the cache: let work
/// requests naming it complete, `rdmx_mem_dereg` every handle on it, then
/// `rdmx_mem_invalidate` the range. A cached registration of freed memory would otherwise
/// keep pages pinned and stay reachable by its rkey.
///
/// # Safety
/// `ctx` NULL or live; `addr` valid for `len` bytes until invalidated as above; `out` NULL
/// or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_mem_reg(
    ctx: *mut rdmx_context,
    addr: *mut c_void,
    len: usize,
    access: u32,
    out: *mut rdmx_mem,
) -> rdmx_status {
    boundary::call("rdmx_mem_reg", || {
        let out = out_ptr(out)?;
        // SAFETY: forwarded contract.
        let ctx = unsafe { handle(ctx, "ctx") }?;
        // SAFETY: the caller promises the memory contract stated above.
        let h: Handle = unsafe { ctx.inner.rcache().get(addr.cast(), len, access) }?;
        let m = rdmx_mem {
            addr: h.addr() as u64,
            length: h.len() as u64,
            lkey: h.lkey(),
            rkey: h.rkey(),
            id: ctx.keep_handle(h),
        };
        // SAFETY: `out` checked non-NULL and writable.
        unsafe { out.write(m) };
        Ok(())
    })
}

/// Releases a registration from `rdmx_mem_reg` (it stays cached; see there). A handle
/// released twice or never issued: RDMX_INVALID_ARGUMENT.
///
/// # Safety
/// `ctx` NULL or live; `m` NULL or a live `rdmx_mem`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_mem_dereg(ctx: *mut rdmx_context, m: *const rdmx_mem) -> rdmx_status {
    boundary::call("rdmx_mem_dereg", || {
        // SAFETY: forwarded contract.
        let ctx = unsafe { handle(ctx, "ctx") }?;
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "mem") }?;
        let h = ctx.take_handle(m.id).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "mem id {}: not a live registration of this context (released twice?)",
                    m.id
                ),
            )
        })?;
        ctx.inner.rcache().put(h)
    })
}

/// Removes every cached registration overlapping `[addr, addr + len)` from the cache:
/// later `rdmx_mem_reg` calls register afresh; registrations still held are deregistered
/// when their last handle is released. Call it before unmapping memory (see
/// `rdmx_mem_reg`).
///
/// # Safety
/// `ctx` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_mem_invalidate(
    ctx: *mut rdmx_context,
    addr: *const c_void,
    len: usize,
) -> rdmx_status {
    boundary::call("rdmx_mem_invalidate", || {
        // SAFETY: forwarded contract.
        let ctx = unsafe { handle(ctx, "ctx") }?;
        ctx.inner.rcache().invalidate(addr.cast(), len);
        Ok(())
    })
}

/// The registration cache's statistics.
///
/// # Safety
/// `ctx` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_mem_cache_stats(
    ctx: *const rdmx_context,
    out: *mut rdmx_rcache_stats,
) -> rdmx_status {
    boundary::call("rdmx_mem_cache_stats", || {
        // SAFETY: forwarded contract.
        let s = unsafe { handle(ctx, "ctx") }?.inner.rcache().stats();
        let v = rdmx_rcache_stats {
            struct_size: 0,
            hits: s.hits,
            misses: s.misses,
            evictions: s.evictions,
            invalidations: s.invalidations,
            entries: s.entries,
            registered_bytes: s.registered_bytes,
        };
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, v) }?;
        Ok(())
    })
}

sized_out!(rdmx_pool_stats, rdmx_rcache_stats);

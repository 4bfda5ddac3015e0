//! `rdmx_context_*` and `rdmx_mr_*`: a context (provider + device) and registered memory.

use super::boundary::{self, handle, str_arg};
use super::config::rdmx_config;
use super::sized::{sized_out, write_sized};
use super::status::rdmx_status;
use crate::config::Config;
use crate::msgr::Context;
use std::ffi::{c_char, c_void};

/// Memory may be written by rdmx locally (receives, READ results).
pub const RDMX_ACCESS_LOCAL_WRITE: u32 = 1;
/// Peers may RDMA WRITE into the region (requires RDMX_ACCESS_LOCAL_WRITE).
pub const RDMX_ACCESS_REMOTE_WRITE: u32 = 2;
/// Peers may RDMA READ the region.
pub const RDMX_ACCESS_REMOTE_READ: u32 = 4;

/// An rdmx context: the chosen provider, its device and the registered memory. Opaque;
/// create with `rdmx_context_new`, free with `rdmx_context_free` after every listener and
/// connection made from it. Safe to use from several threads.
#[allow(non_camel_case_types)]
pub struct rdmx_context {
    pub(crate) inner: Context,
    /// `rdmx_context_provider_reason`'s text.
    reason: std::ffi::CString,
    /// Registration-cache handles given to C as ids (`rdmx_mem.id`).
    mem: parking_lot::Mutex<(
        u64,
        std::collections::HashMap<u64, crate::mem::rcache::Handle>,
    )>,
}

impl rdmx_context {
    pub(crate) fn keep_handle(&self, h: crate::mem::rcache::Handle) -> u64 {
        let mut g = self.mem.lock();
        g.0 += 1;
        let id = g.0;
        g.1.insert(id, h);
        id
    }

    pub(crate) fn take_handle(&self, id: u64) -> Option<crate::mem::rcache::Handle> {
        self.mem.lock().1.remove(&id)
    }
}

impl Drop for rdmx_context {
    fn drop(&mut self) {
        // Handles C never released go back to the cache before it is dropped.
        let handles: Vec<_> = self.mem.get_mut().1.drain().map(|(_, h)| h).collect();
        for h in handles {
            let _ = self.inner.rcache().put(h);
        }
    }
}

/// A registered memory region (plain data; the region is identified by `lkey`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_mr {
    pub addr: u64,
    pub length: u64,
    /// Local key: put it in `rdmx_sge.lkey`.
    pub lkey: u32,
    /// Remote key: what a peer names in RDMA READ/WRITE (random, not guessable).
    pub rkey: u32,
    pub access: u32,
}

/// Creates a context from `cfg` (NULL: defaults and `RDMX_*` environment variables). The
/// provider is chosen here (`provider=auto`: verbs when the host has an RDMA device, soft
/// otherwise); `rdmx_context_provider` says which. `*out` receives a context the caller
/// owns; NULL on failure.
///
/// # Safety
/// `cfg` NULL or a live config; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_context_new(
    cfg: *const rdmx_config,
    out: *mut *mut rdmx_context,
) -> rdmx_status {
    boundary::call("rdmx_context_new", || {
        boundary::out_ptr(out)?;
        // SAFETY: `out` is non-NULL and writable per the contract.
        unsafe { out.write(std::ptr::null_mut()) };
        let owned;
        // SAFETY: forwarded contract; NULL means "no config given".
        let config = match unsafe { cfg.as_ref() } {
            Some(c) => c.config(),
            None => {
                owned = Config::from_env()?;
                &owned
            }
        };
        let inner = Context::new(config)?;
        let reason =
            std::ffi::CString::new(inner.provider_reason().replace('\0', " ")).unwrap_or_default();
        let ctx = Box::new(rdmx_context {
            inner,
            reason,
            mem: parking_lot::Mutex::new((0, std::collections::HashMap::new())),
        });
        // SAFETY: as above.
        unsafe { out.write(Box::into_raw(ctx)) };
        Ok(())
    })
}

/// Frees a context. NULL is a no-op. Free its listeners and connections first.
///
/// # Safety
/// `ctx` NULL or from `rdmx_context_new`, not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_context_free(ctx: *mut rdmx_context) {
    boundary::call_value("rdmx_context_free", (), || {
        if !ctx.is_null() {
            // SAFETY: per the contract, ownership returns here exactly once.
            drop(unsafe { Box::from_raw(ctx) });
        }
    })
}

/// The provider the context runs on: "soft" or "verbs". Static; NULL only for a NULL ctx.
///
/// # Safety
/// `ctx` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_context_provider(ctx: *const rdmx_context) -> *const c_char {
    boundary::call_value("rdmx_context_provider", std::ptr::null(), || {
        // SAFETY: forwarded contract.
        match unsafe { ctx.as_ref() }.map(|c| c.inner.provider()) {
            Some("soft") => c"soft".as_ptr(),
            Some(_) => c"verbs".as_ptr(),
            None => std::ptr::null(),
        }
    })
}

/// Why the context runs on its provider, in one line: `provider=auto`'s reasoning (the
/// verbs device, port and GID it opened, or why no device was usable and soft was taken),
/// or the configured choice. Valid as long as the context; NULL only for a NULL ctx.
///
/// # Safety
/// `ctx` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_context_provider_reason(ctx: *const rdmx_context) -> *const c_char {
    boundary::call_value("rdmx_context_provider_reason", std::ptr::null(), || {
        // SAFETY: forwarded contract.
        match unsafe { ctx.as_ref() } {
            Some(c) => c.reason.as_ptr(),
            None => std::ptr::null(),
        }
    })
}

/// Datagrams a context's UDP ports dropped before any connection's QP processed them, as
/// rxe and NICs count them per port (cumulative since `rdmx_context_new`, every connection
/// together; per-connection figures are in `rdmx_counters`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_port_counters {
    /// Set by the caller to `sizeof` this struct before the call; rdmx fills at most that
    /// many bytes and writes back how many it filled (see "Structs that grow" at the top of
    /// this header). The order of the fields is frozen: new fields are only added at the end.
    pub struct_size: usize,
    /// Packets for a QP number no connection of the context has (closed, never existed).
    pub unknown_qpn: u64,
    /// Packets for a connection's QP that did not come from the IP address and UDP port its
    /// peer sends from: dropped before the ICRC and any PSN, rkey or AETH processing.
    pub wrong_source: u64,
    /// Packets from a connection's peer whose ICRC did not match.
    pub bad_icrc: u64,
    /// Datagrams too short to be RoCEv2 packets.
    pub malformed: u64,
    /// Datagrams larger than a receive buffer (dropped).
    pub truncated: u64,
    /// Datagrams the kernel dropped on a full receive queue (SO_RXQ_OVFL).
    pub kernel_drops: u64,
    /// Async events the device reported (provider=verbs: QP, CQ, port and device events;
    /// each connection's own are in `rdmx_counters.async_events`). 0 on soft.
    pub async_events: u64,
    /// Not a datagram: panics caught in the device's progress thread (soft; a completion
    /// hook, a bug). Each failed every QP of the context and was logged at error level;
    /// the thread went on. 0 normally, and on verbs.
    pub progress_panics: u64,
}

/// Fills `*out` with the context's port counters. The caller owns `*out` (plain data,
/// copied); nothing is retained. RDMX_INVALID_ARGUMENT if `ctx` or `out` is NULL.
///
/// # Safety
/// `ctx` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_context_port_counters(
    ctx: *const rdmx_context,
    out: *mut rdmx_port_counters,
) -> rdmx_status {
    boundary::call("rdmx_context_port_counters", || {
        // SAFETY: forwarded contract.
        let ctx = unsafe { handle(ctx, "ctx") }?;
        let p = ctx.inner.port_counters();
        let v = rdmx_port_counters {
            struct_size: 0,
            unknown_qpn: p.unknown_qpn,
            wrong_source: p.wrong_source,
            bad_icrc: p.bad_icrc,
            malformed: p.malformed,
            truncated: p.truncated,
            kernel_drops: p.kernel_drops,
            async_events: p.async_events,
            progress_panics: ctx.inner.progress_stats().progress_panics,
        };
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, v) }?;
        Ok(())
    })
}

/// Registers `[addr, addr + len)` with `access` (RDMX_ACCESS_* bits) and fills `*out`.
/// Regions with remote access are offered to every connection set up afterwards
/// (`rdmx_conn_remote_region` on the peer). Register read-only data with
/// RDMX_ACCESS_REMOTE_READ only: a peer's WRITE into it then fails (REM_ACCESS_ERR).
///
/// The memory must stay valid and mapped until `rdmx_mr_dereg` succeeds, and must not be
/// modified while a send or WRITE naming it is outstanding.
///
/// # Safety
/// `ctx` NULL or live; `addr` valid for `len` bytes as above; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_mr_reg(
    ctx: *mut rdmx_context,
    addr: *mut c_void,
    len: usize,
    access: u32,
    out: *mut rdmx_mr,
) -> rdmx_status {
    boundary::call("rdmx_mr_reg", || {
        // SAFETY: forwarded contract.
        let ctx = unsafe { handle(ctx, "ctx") }?;
        boundary::out_ptr(out)?;
        // SAFETY: the caller promises the memory contract stated above.
        let r = unsafe { ctx.inner.register(addr.cast(), len, access) }?;
        // SAFETY: `out` is non-NULL and writable per the contract.
        unsafe {
            out.write(rdmx_mr {
                addr: r.addr,
                length: r.len,
                lkey: r.lkey,
                rkey: r.rkey,
                access: r.access,
            })
        };
        Ok(())
    })
}

/// Deregisters the region with `lkey`. RDMX_BUSY while work requests that name it are in
/// flight (poll their completions first); after success the memory is the caller's again.
///
/// # Safety
/// `ctx` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_mr_dereg(ctx: *mut rdmx_context, lkey: u32) -> rdmx_status {
    boundary::call("rdmx_mr_dereg", || {
        // SAFETY: forwarded contract.
        unsafe { handle(ctx, "ctx") }?.inner.deregister(lkey)
    })
}

/// Parses "HOST:PORT" arguments for the connection calls.
///
/// # Safety
/// As `str_arg`.
pub(super) unsafe fn addr_arg<'a>(p: *const c_char) -> crate::error::Result<&'a str> {
    // SAFETY: forwarded contract.
    unsafe { str_arg(p, "addr") }
}

sized_out!(rdmx_port_counters);

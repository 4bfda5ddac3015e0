//! `rdmx_blk_*`: the block client (`crate::blk::BlkClient`, docs/block.md). Open a volume
//! on an `rdmx-target`, submit batches of read/write/flush requests into caller buffers
//! with cookies, poll (or wait on the event fd) for completions, free.

use super::boundary::{self, handle, out_ptr, str_arg};
use super::config::rdmx_config;
use super::sized::{sized_out, write_sized};
use super::status::rdmx_status;
use crate::blk::{
    BlkClient, BlkCounters, BlkPaths, Completion, Mode, Op, PathEventKind, PathState, Req,
    VolumeInfo,
};
use crate::config::Config;
use crate::error::{Error, ErrorKind};
use parking_lot::Mutex;
use std::ffi::{c_char, c_void};
use std::time::Duration;

/// `rdmx_blk_req.op`: read `len` bytes at `offset` into `buf`.
pub const RDMX_BLK_READ: u32 = 3;
/// `rdmx_blk_req.op`: write `len` bytes from `buf` at `offset`.
pub const RDMX_BLK_WRITE: u32 = 4;
/// `rdmx_blk_req.op`: make completed writes durable (`offset`, `len`, `buf` ignored).
pub const RDMX_BLK_FLUSH: u32 = 5;
/// `rdmx_blk_open` mode: every IO through the target (request + reply). A read's request
/// names `buf` (registered with local + remote write access, read buffers only) and the
/// target RDMA WRITEs the data there right before its reply: no copy in rdmx
/// (`rdmx_blk_get_counters`).
pub const RDMX_BLK_MODE_RPC: u32 = 0;
/// `rdmx_blk_open` mode: reads and writes are one-sided RDMA READ/WRITE between `buf` and
/// the volume's region (memory volumes only): no copy, no target CPU.
pub const RDMX_BLK_MODE_READ: u32 = 1;

/// A block client: one session to a target, one open volume. Opaque; free with
/// `rdmx_blk_free`. Calls on one handle are serialized (a `rdmx_blk_poll` that waits holds
/// off a `rdmx_blk_submit` from another thread until it returns): submit and poll from one
/// thread, as fio does.
#[allow(non_camel_case_types)]
pub struct rdmx_blk {
    inner: Mutex<Client>,
    efd: i32,
}

/// One path (`rdmx_blk_open`) or several (`rdmx_blk_open_paths`).
enum Client {
    One(Box<BlkClient>),
    Paths(Box<BlkPaths>),
}

impl Client {
    fn counters(&self) -> BlkCounters {
        match self {
            Client::One(c) => c.counters(),
            Client::Paths(c) => c.counters(),
        }
    }
    fn info(&self) -> VolumeInfo {
        match self {
            Client::One(c) => c.info(),
            Client::Paths(c) => c.info(),
        }
    }
    /// # Safety
    /// As `BlkClient::submit`.
    unsafe fn submit(&mut self, reqs: &[Req]) -> crate::error::Result<usize> {
        match self {
            // SAFETY: forwarded contract.
            Client::One(c) => unsafe { c.submit(reqs) },
            // SAFETY: forwarded contract.
            Client::Paths(c) => unsafe { c.submit(reqs) },
        }
    }
    fn poll(
        &mut self,
        out: &mut Vec<Completion>,
        min: usize,
        max: usize,
        t: Duration,
    ) -> crate::error::Result<usize> {
        match self {
            Client::One(c) => c.poll(out, min, max, t),
            Client::Paths(c) => c.poll(out, min, max, t),
        }
    }
    /// # Safety
    /// As `BlkClient::register`.
    unsafe fn register(&mut self, ptr: *mut u8, len: usize) -> crate::error::Result<()> {
        match self {
            // SAFETY: forwarded contract.
            Client::One(c) => unsafe { c.register(ptr, len) },
            // SAFETY: forwarded contract.
            Client::Paths(c) => unsafe { c.register(ptr, len) },
        }
    }
    fn inflight(&self) -> usize {
        match self {
            Client::One(c) => c.inflight(),
            Client::Paths(c) => c.inflight(),
        }
    }
}

/// One IO request. `buf` is caller memory of `len` bytes (4 KiB-aligned offsets and
/// lengths, up to 1 MiB); it is registered through the client's registration cache on
/// first use (no copy either way) and must stay valid and untouched until the request's
/// completion was returned by `rdmx_blk_poll` or `rdmx_blk_free` returned (a read's `buf`
/// is open to the target's RDMA WRITE until then). Any alignment works; page-aligned
/// buffers register fewer pages.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct rdmx_blk_req {
    /// RDMX_BLK_READ, RDMX_BLK_WRITE or RDMX_BLK_FLUSH.
    pub op: u32,
    pub len: u32,
    pub offset: u64,
    pub buf: *mut c_void,
    /// Returned as is in the completion.
    pub cookie: u64,
}

/// One finished request.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_blk_completion {
    pub cookie: u64,
    /// 0, or a negative errno: -EINVAL (misaligned, length 0 or above 1 MiB, unknown op),
    /// -ERANGE (beyond the volume), -EIO (the target is gone or failed the IO), ...
    pub status: i32,
    /// Bytes transferred (the request's length on success, 0 on error).
    pub len: u32,
}

/// A volume's geometry.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_blk_volume {
    pub size: u64,
    pub block_size: u32,
    /// 1 when the volume is a memory volume open to RDMX_BLK_MODE_READ.
    pub one_sided: u32,
}

/// The caller's configuration, or (NULL) one read from the environment.
fn config_or_env(cfg: Option<&rdmx_config>) -> crate::error::Result<std::borrow::Cow<'_, Config>> {
    Ok(match cfg {
        Some(c) => std::borrow::Cow::Borrowed(c.config()),
        None => std::borrow::Cow::Owned(Config::from_env()?),
    })
}

/// An open's wait: `timeout_ms`, or 10 s for 0.
fn open_timeout(timeout_ms: u32) -> Duration {
    if timeout_ms == 0 {
        Duration::from_secs(10)
    } else {
        Duration::from_millis(u64::from(timeout_ms))
    }
}

fn mode_of(mode: u32) -> crate::error::Result<Mode> {
    match mode {
        RDMX_BLK_MODE_RPC => Ok(Mode::Rpc),
        RDMX_BLK_MODE_READ => Ok(Mode::Read),
        _ => Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("mode {mode}: expected RDMX_BLK_MODE_RPC (0) or RDMX_BLK_MODE_READ (1)"),
        )),
    }
}

/// Connects to the `rdmx-target` at `addr` ("HOST:PORT") and opens `volume`, within
/// `timeout_ms` (0: 10 s). `cfg` (NULL: defaults and `RDMX_*` environment variables)
/// carries the transport and `msgr_*` keys; `msgr_threads = 0` (the default) means
/// `rdmx_blk_poll` drives all progress on the caller's thread. `*out` receives a client
/// the caller owns (NULL on failure). RDMX_INVALID_ARGUMENT for an unknown volume,
/// RDMX_UNSUPPORTED for RDMX_BLK_MODE_READ on a file volume, RDMX_AUTH when
/// authentication fails or the target's `--allow` grants this entity (`auth_entity`)
/// nothing on the volume, RDMX_TIMEOUT / RDMX_CLOSED when the target does not answer. A
/// read-only grant opens; its writes complete with -EACCES.
///
/// # Safety
/// `cfg` NULL or live; `addr`, `volume` NULL or NUL-terminated; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_blk_open(
    cfg: *const rdmx_config,
    addr: *const c_char,
    volume: *const c_char,
    mode: u32,
    timeout_ms: u32,
    out: *mut *mut rdmx_blk,
) -> rdmx_status {
    boundary::call("rdmx_blk_open", || {
        let out = out_ptr(out)?;
        // SAFETY: `out` is non-NULL and writable per the contract.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: forwarded contract.
        let addr = unsafe { str_arg(addr, "addr") }?;
        // SAFETY: forwarded contract.
        let volume = unsafe { str_arg(volume, "volume") }?;
        let mode = mode_of(mode)?;
        // SAFETY: forwarded contract; NULL means "no config given".
        let config = config_or_env(unsafe { cfg.as_ref() })?;
        let t = open_timeout(timeout_ms);
        let c = BlkClient::open(&config, addr, volume, mode, t)?;
        let efd = c.event_fd();
        let b = Box::new(rdmx_blk {
            inner: Mutex::new(Client::One(Box::new(c))),
            efd,
        });
        // SAFETY: as above.
        unsafe { out.write(Box::into_raw(b)) };
        Ok(())
    })
}

/// `rdmx_blk_path.state`: the path's session and volume are open; IO may go there.
pub const RDMX_BLK_PATH_UP: u32 = 0;
/// `rdmx_blk_path.state`: failed (or never opened); reconnected after its backoff.
pub const RDMX_BLK_PATH_DOWN: u32 = 1;
/// `rdmx_blk_path.state`: a (re)connect attempt is under way.
pub const RDMX_BLK_PATH_CONNECTING: u32 = 2;

/// Opens `volume` over `n` paths, `addrs[i]` each "HOST:PORT": two `rdmx-target`
/// processes exporting the same file volume, or one target listening on two addresses
/// (docs/failover.md). Returns once every path answered, or once one opened and the others
/// had 200 ms more (they keep connecting in the background), within `timeout_ms` (0: 10
/// s). When a path fails, the IOs in flight on it are re-issued on another path and
/// complete without error; an IO fails (-EIO) only when no path answered for
/// `io_fail_timeout_ms`. `cfg` keys: `blk_path_policy` (standby, active), `blk_failback`,
/// `io_fail_timeout_ms`, `blk_path_retry_min_ms`/`_max_ms`, and each path's transport
/// keys. Only RDMX_BLK_MODE_RPC (RDMX_UNSUPPORTED otherwise); RDMX_INVALID_ARGUMENT for
/// 0 or more than 16 paths or an address that is not HOST:PORT; when no path opens the
/// volume, the first path's error (RDMX_TIMEOUT, RDMX_CLOSED, RDMX_AUTH, ...) with every
/// path's reason in `rdmx_last_error`. Use the handle with every `rdmx_blk_*` call;
/// `rdmx_blk_event_fd` gives -1 (wait in `rdmx_blk_poll`).
///
/// # Safety
/// `cfg` NULL or live; `addrs` NULL or `n` pointers, each NULL or NUL-terminated;
/// `volume` NULL or NUL-terminated; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_blk_open_paths(
    cfg: *const rdmx_config,
    addrs: *const *const c_char,
    n: usize,
    volume: *const c_char,
    mode: u32,
    timeout_ms: u32,
    out: *mut *mut rdmx_blk,
) -> rdmx_status {
    boundary::call("rdmx_blk_open_paths", || {
        let out = out_ptr(out)?;
        // SAFETY: `out` is non-NULL and writable per the contract.
        unsafe { out.write(std::ptr::null_mut()) };
        if addrs.is_null() || n == 0 || n > crate::blk::paths::MAX_PATHS {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "addrs is NULL or n is {n}: give 1..{} addresses",
                    crate::blk::paths::MAX_PATHS
                ),
            ));
        }
        // SAFETY: `addrs` points to `n` pointers per the contract.
        let ptrs = unsafe { std::slice::from_raw_parts(addrs, n) };
        let mut list = Vec::with_capacity(n);
        for (i, &p) in ptrs.iter().enumerate() {
            // SAFETY: each NULL or NUL-terminated per the contract.
            list.push(unsafe { str_arg(p, &format!("addrs[{i}]")) }?.to_string());
        }
        // SAFETY: forwarded contract.
        let volume = unsafe { str_arg(volume, "volume") }?;
        let mode = mode_of(mode)?;
        // SAFETY: forwarded contract; NULL means "no config given".
        let config = config_or_env(unsafe { cfg.as_ref() })?;
        let t = open_timeout(timeout_ms);
        let c = BlkPaths::open(&config, &list, volume, mode, t)?;
        let b = Box::new(rdmx_blk {
            inner: Mutex::new(Client::Paths(Box::new(c))),
            efd: -1,
        });
        // SAFETY: as above.
        unsafe { out.write(Box::into_raw(b)) };
        Ok(())
    })
}

/// One path of a multipath client: its state and counters.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_blk_path {
    /// Set by the caller to `sizeof` this struct (see "Structs that grow" at the top of
    /// this header). Fields are only added at the end.
    pub struct_size: usize,
    /// RDMX_BLK_PATH_UP, RDMX_BLK_PATH_DOWN or RDMX_BLK_PATH_CONNECTING.
    pub state: u32,
    /// 1 when new IO goes to this path (standby: the one active path; active: every up
    /// path).
    pub active: u32,
    /// IOs in flight on it now.
    pub inflight: u64,
    /// IOs sent on it (first sends and re-issues).
    pub issued: u64,
    /// Of those, re-issues of IOs whose earlier path failed.
    pub reissued: u64,
    /// IOs in flight on it when it failed (re-issued elsewhere).
    pub failed_over: u64,
    /// Times it went down.
    pub failures: u64,
    /// Times it came back after a failure.
    pub rejoins: u64,
    /// Reconnect attempts that failed.
    pub connect_errors: u64,
    /// At its last failure with IO in flight: microseconds without a successful
    /// completion (about the detection time under load); 0 if none.
    pub last_detect_us: u64,
}

/// How many paths the client has: the number given to `rdmx_blk_open_paths`, 0 for a
/// client from `rdmx_blk_open` (and for NULL).
///
/// # Safety
/// `blk` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_blk_path_count(blk: *const rdmx_blk) -> usize {
    boundary::call_value("rdmx_blk_path_count", 0, || {
        // SAFETY: forwarded contract.
        unsafe { blk.as_ref() }.map_or(0, |b| match &*b.inner.lock() {
            Client::Paths(p) => p.path_count(),
            Client::One(_) => 0,
        })
    })
}

/// Path `index`'s state and counters (the order of `rdmx_blk_open_paths`' `addrs`).
/// RDMX_INVALID_ARGUMENT for an index at or beyond `rdmx_blk_path_count` (any index for a
/// client from `rdmx_blk_open`).
///
/// # Safety
/// `blk` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_blk_get_path(
    blk: *const rdmx_blk,
    index: usize,
    out: *mut rdmx_blk_path,
) -> rdmx_status {
    boundary::call("rdmx_blk_get_path", || {
        // SAFETY: forwarded contract.
        let b = unsafe { handle(blk, "blk") }?;
        let st = match &*b.inner.lock() {
            Client::Paths(p) => p.path_status(index).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!("path {index}: the client has {} paths", p.path_count()),
                )
            })?,
            Client::One(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "path {index}: a client from rdmx_blk_open has no paths (rdmx_blk_open_paths)"
                    ),
                ));
            }
        };
        let k = st.counters;
        let v = rdmx_blk_path {
            struct_size: 0,
            state: match st.state {
                PathState::Up => RDMX_BLK_PATH_UP,
                PathState::Down => RDMX_BLK_PATH_DOWN,
                PathState::Connecting => RDMX_BLK_PATH_CONNECTING,
            },
            active: u32::from(st.active),
            inflight: st.inflight as u64,
            issued: k.issued,
            reissued: k.reissued,
            failed_over: k.failed_over,
            failures: k.failures,
            rejoins: k.rejoins,
            connect_errors: k.connect_errors,
            last_detect_us: st.last_detect.map_or(0, |d| d.as_micros() as u64),
        };
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, v) }?;
        Ok(())
    })
}

/// `rdmx_blk_path_event.kind`: no event (none happened since the last call).
pub const RDMX_BLK_PATH_EVENT_NONE: u32 = 0;
/// `rdmx_blk_path_event.kind`: the path's session ended (or it did not answer for
/// `io_fail_timeout_ms`); its IO in flight moves to a surviving path. `reason` says why.
pub const RDMX_BLK_PATH_EVENT_DOWN: u32 = 1;
/// `rdmx_blk_path_event.kind`: the path (re)opened the volume.
pub const RDMX_BLK_PATH_EVENT_UP: u32 = 2;
/// `rdmx_blk_path_event.kind`: new IO goes to this path now (standby policy: a failover or
/// a failback).
pub const RDMX_BLK_PATH_EVENT_ACTIVE: u32 = 3;

/// Bytes of `rdmx_blk_path_event.reason`, its terminating NUL included.
pub const RDMX_BLK_PATH_REASON_LEN: usize = 128;

/// A path event of a multipath client (`rdmx_blk_next_path_event`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct rdmx_blk_path_event {
    /// Set by the caller to `sizeof` this struct (see "Structs that grow" at the top of
    /// this header). Fields are only added at the end.
    pub struct_size: usize,
    /// RDMX_BLK_PATH_EVENT_NONE, _DOWN, _UP or _ACTIVE.
    pub kind: u32,
    /// The path's index (the order of `rdmx_blk_open_paths`' `addrs`).
    pub path: u32,
    /// Microseconds from the event to this call.
    pub age_us: u64,
    /// For RDMX_BLK_PATH_EVENT_DOWN, why (NUL-terminated, cut to fit); empty otherwise.
    pub reason: [c_char; RDMX_BLK_PATH_REASON_LEN],
}

impl Default for rdmx_blk_path_event {
    fn default() -> Self {
        rdmx_blk_path_event {
            struct_size: 0,
            kind: RDMX_BLK_PATH_EVENT_NONE,
            path: 0,
            age_us: 0,
            reason: [0; RDMX_BLK_PATH_REASON_LEN],
        }
    }
}

/// Copies `text` into `out` NUL-terminated, cut at a character boundary to fit.
fn copy_reason(text: &str, out: &mut [c_char; RDMX_BLK_PATH_REASON_LEN]) {
    let mut end = text.len().min(RDMX_BLK_PATH_REASON_LEN - 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    for (o, b) in out.iter_mut().zip(&text.as_bytes()[..end]) {
        *o = *b as c_char;
    }
    out[end] = 0;
}

/// Takes the oldest path event of a multipath client (`rdmx_blk_open_paths`) that was not
/// taken yet: a path went down, came up, or became the one new IO goes to. Events happen
/// while the client is polled (`rdmx_blk_poll`); the client keeps the last 1,024. RDMX_OK
/// with `kind` RDMX_BLK_PATH_EVENT_NONE when there is none (take them in a loop until
/// then). A client from `rdmx_blk_open` has no path events (always NONE). Each event is
/// also logged (target `rdmx::blk`).
///
/// # Safety
/// `blk` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_blk_next_path_event(
    blk: *const rdmx_blk,
    out: *mut rdmx_blk_path_event,
) -> rdmx_status {
    boundary::call("rdmx_blk_next_path_event", || {
        // SAFETY: forwarded contract.
        let b = unsafe { handle(blk, "blk") }?;
        let ev = match &mut *b.inner.lock() {
            Client::Paths(p) => p.next_event(),
            Client::One(_) => None,
        };
        let mut v = rdmx_blk_path_event::default();
        if let Some(e) = ev {
            v.path = e.path as u32;
            v.age_us = e.at.elapsed().as_micros() as u64;
            v.kind = match &e.kind {
                PathEventKind::Down(why) => {
                    copy_reason(why, &mut v.reason);
                    RDMX_BLK_PATH_EVENT_DOWN
                }
                PathEventKind::Up => RDMX_BLK_PATH_EVENT_UP,
                PathEventKind::Active => RDMX_BLK_PATH_EVENT_ACTIVE,
            };
        }
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, v) }?;
        Ok(())
    })
}

/// How a client's reads moved (RDMX_BLK_MODE_RPC): placed in `buf` by the target's RDMA
/// WRITE, or copied from the reply (a target that does not place reads).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_blk_counters {
    /// Set by the caller to `sizeof` this struct before the call; rdmx fills at most that
    /// many bytes and writes back how many it filled (see "Structs that grow" at the top of
    /// this header). The order of the fields is frozen: new fields are only added at the end.
    pub struct_size: usize,
    pub placed_reads: u64,
    pub placed_bytes: u64,
    /// The copies rdmx made on reads (0 against an `rdmx-target` of this version).
    pub copied_reads: u64,
    pub copied_bytes: u64,
    /// Replies for requests no longer in flight (answered twice, never sent): ignored.
    pub stray_replies: u64,
    /// Of the placed reads, those answered by the WRITE's immediate value alone (no reply
    /// message; what this client asks of an `rdmx-target` of this version).
    pub imm_replies: u64,
    /// Multipath (`rdmx_blk_open_paths`; 0 otherwise): IOs re-issued on another path after
    /// theirs failed, all paths.
    pub reissued: u64,
    /// Multipath: writes held behind an overlapping outstanding write (the write-ordering
    /// rule, docs/failover.md).
    pub held_writes: u64,
    /// Multipath: IOs failed with -EIO because no path answered for `io_fail_timeout_ms`.
    pub io_timeouts: u64,
}

/// The client's counters.
///
/// # Safety
/// `blk` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_blk_get_counters(
    blk: *const rdmx_blk,
    out: *mut rdmx_blk_counters,
) -> rdmx_status {
    boundary::call("rdmx_blk_get_counters", || {
        // SAFETY: forwarded contract.
        let b = unsafe { handle(blk, "blk") }?;
        let c = b.inner.lock();
        let k = c.counters();
        let f = match &*c {
            Client::Paths(p) => p.failover_counters(),
            Client::One(_) => crate::blk::paths::PathsCounters::default(),
        };
        drop(c);
        let v = rdmx_blk_counters {
            struct_size: 0,
            placed_reads: k.placed_reads,
            placed_bytes: k.placed_bytes,
            copied_reads: k.copied_reads,
            copied_bytes: k.copied_bytes,
            stray_replies: k.stray_replies,
            imm_replies: k.imm_replies,
            reissued: f.reissued,
            held_writes: f.held_writes,
            io_timeouts: f.io_timeouts,
        };
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, v) }?;
        Ok(())
    })
}

/// The volume's size and block size.
///
/// # Safety
/// `blk` NULL or live; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_blk_info(
    blk: *const rdmx_blk,
    out: *mut rdmx_blk_volume,
) -> rdmx_status {
    boundary::call("rdmx_blk_info", || {
        let out = out_ptr(out)?;
        // SAFETY: forwarded contract.
        let b = unsafe { handle(blk, "blk") }?;
        let i = b.inner.lock().info();
        // SAFETY: `out` checked non-NULL and writable.
        unsafe {
            out.write(rdmx_blk_volume {
                size: i.size,
                block_size: i.block_size,
                one_sided: u32::from(i.one_sided),
            })
        };
        Ok(())
    })
}

/// Submits `n` requests in order; `*accepted` receives how many were taken (fewer than `n`
/// when a queue is full: poll, then submit the rest). Requests the client can judge wrong
/// (length 0 or above 1 MiB, NULL `buf`, unknown op) are accepted and complete with
/// -EINVAL. RDMX_CLOSED (nothing accepted) once the target is gone.
///
/// # Safety
/// `blk` NULL or live; `reqs` NULL or `n` readable requests, each `buf` valid for `len`
/// bytes (writable for reads) until its completion is returned; `accepted` NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_blk_submit(
    blk: *mut rdmx_blk,
    reqs: *const rdmx_blk_req,
    n: usize,
    accepted: *mut usize,
) -> rdmx_status {
    boundary::call("rdmx_blk_submit", || {
        let accepted = out_ptr(accepted)?;
        // SAFETY: `accepted` is non-NULL and writable per the contract.
        unsafe { accepted.write(0) };
        // SAFETY: forwarded contract.
        let b = unsafe { handle(blk, "blk") }?;
        if n == 0 {
            return Ok(());
        }
        if reqs.is_null() {
            return Err(Error::new(ErrorKind::InvalidArgument, "reqs is NULL"));
        }
        // SAFETY: `reqs` points to `n` requests per the contract.
        let reqs = unsafe { std::slice::from_raw_parts(reqs, n) };
        let v: Vec<Req> = reqs
            .iter()
            .map(|r| Req {
                op: match r.op {
                    RDMX_BLK_READ => Op::Read,
                    RDMX_BLK_WRITE => Op::Write,
                    RDMX_BLK_FLUSH => Op::Flush,
                    // Completes with -EINVAL (the client refuses Open/Query as IO).
                    _ => Op::Query,
                },
                offset: r.offset,
                len: r.len,
                buf: r.buf.cast(),
                cookie: r.cookie,
            })
            .collect();
        let mut c = b.inner.lock();
        // SAFETY: forwarded contract (buffers valid until their completions).
        let k = unsafe { c.submit(&v) }?;
        // SAFETY: as above.
        unsafe { accepted.write(k) };
        Ok(())
    })
}

/// Moves up to `max` completions into `out` and stores their number in `*n`, waiting up
/// to `timeout_ms` (negative: up to 1 hour; 0: no wait) until at least `min` are
/// there. Drives the client's progress (caller-driven mode).
///
/// # Safety
/// `blk` NULL or live; `out` NULL or `max` writable entries; `n` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_blk_poll(
    blk: *mut rdmx_blk,
    out: *mut rdmx_blk_completion,
    max: usize,
    min: usize,
    timeout_ms: i32,
    n: *mut usize,
) -> rdmx_status {
    boundary::call("rdmx_blk_poll", || {
        let n = out_ptr(n)?;
        // SAFETY: `n` is non-NULL and writable per the contract.
        unsafe { n.write(0) };
        // SAFETY: forwarded contract.
        let b = unsafe { handle(blk, "blk") }?;
        if max == 0 {
            return Ok(());
        }
        let out = out_ptr(out)?;
        let t = if timeout_ms < 0 {
            Duration::from_secs(3600)
        } else {
            Duration::from_millis(timeout_ms as u64)
        };
        let mut v: Vec<Completion> = Vec::with_capacity(max.min(1024));
        let k = b.inner.lock().poll(&mut v, min, max, t)?;
        for (i, c) in v.iter().enumerate().take(k) {
            // SAFETY: `out` has `max` writable entries and `k <= max`.
            unsafe {
                out.add(i).write(rdmx_blk_completion {
                    cookie: c.cookie,
                    status: c.status,
                    len: c.len,
                })
            };
        }
        // SAFETY: as above.
        unsafe { n.write(k) };
        Ok(())
    })
}

/// An eventfd that becomes readable when completions are ready, when the client runs the
/// messenger's worker threads (`msgr_threads` > 0, RDMX_BLK_MODE_RPC); in caller-driven
/// mode nothing progresses between calls: wait in `rdmx_blk_poll` instead. -1 for NULL
/// and for a multipath client (its failover runs inside `rdmx_blk_poll`: wait there).
/// The fd belongs to the client (do not close it).
///
/// # Safety
/// `blk` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_blk_event_fd(blk: *const rdmx_blk) -> i32 {
    boundary::call_value("rdmx_blk_event_fd", -1, || {
        // SAFETY: forwarded contract.
        unsafe { blk.as_ref() }.map_or(-1, |b| b.efd)
    })
}

/// Registers `[addr, addr + len)` once for the client's lifetime (both the messenger's and
/// the one-sided path's registration caches), so that requests with buffers inside it never
/// register per IO (e.g. fio's whole IO buffer area). Optional: buffers outside any
/// registered range are registered on first use and cached. Registered with local write
/// and remote read; in RDMX_BLK_MODE_RPC the first read into the range widens it to remote
/// write too (once: the target WRITEs read data into it).
///
/// # Safety
/// `blk` NULL or live; `[addr, addr + len)` mapped memory that stays mapped until
/// `rdmx_blk_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_blk_mem_register(
    blk: *mut rdmx_blk,
    addr: *mut c_void,
    len: usize,
) -> rdmx_status {
    boundary::call("rdmx_blk_mem_register", || {
        // SAFETY: forwarded contract.
        let b = unsafe { handle(blk, "blk") }?;
        if addr.is_null() || len == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "addr is NULL or len is 0",
            ));
        }
        // SAFETY: forwarded contract (mapped until the client is freed).
        unsafe { b.inner.lock().register(addr.cast(), len) }
    })
}

/// Requests submitted and not yet returned by `rdmx_blk_poll` (0 for NULL).
///
/// # Safety
/// `blk` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_blk_inflight(blk: *const rdmx_blk) -> usize {
    boundary::call_value("rdmx_blk_inflight", 0, || {
        // SAFETY: forwarded contract.
        unsafe { blk.as_ref() }.map_or(0, |b| b.inner.lock().inflight())
    })
}

/// Closes the session and frees the client. Requests still in flight are abandoned: their
/// buffers may be written until this call returns, never after. NULL is a no-op.
///
/// # Safety
/// `blk` NULL or a client from `rdmx_blk_open`, not used again (by any thread) afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_blk_free(blk: *mut rdmx_blk) {
    boundary::call_value("rdmx_blk_free", (), || {
        if !blk.is_null() {
            // SAFETY: ownership returns here exactly once, per the contract.
            drop(unsafe { Box::from_raw(blk) });
        }
    })
}

sized_out!(rdmx_blk_counters, rdmx_blk_path, rdmx_blk_path_event);

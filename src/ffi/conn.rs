//! `rdmx_listener_*`, `rdmx_connect`, `rdmx_conn_*`, `rdmx_post_*`, `rdmx_poll`: RC
//! connections with two-sided SEND/RECV and one-sided RDMA READ/WRITE, each WR carrying a
//! caller cookie that comes back in its completion.

use super::boundary::{self, handle, handle_mut, out_ptr};
use super::context::{addr_arg, rdmx_context};
use super::sized::{sized_out, write_sized};
use super::status::rdmx_status;
use crate::error::{Error, ErrorKind, Result};
use crate::msgr::{Connection, Listener, OnConnect};
use crate::provider::types::{SendReq, Wc};
use crate::rc::verbs::{WcStatus, WrOpcode, send_flags};
use crate::rc::{Sge, SgeList, WcOpcode};
use std::ffi::c_char;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

/// Wait for the previous RDMA READs to complete before this WR (IBV_SEND_FENCE).
pub const RDMX_POST_FENCE: u32 = 1;
/// Ask for a solicited event at the receiver (SEND, WRITE with immediate).
pub const RDMX_POST_SOLICITED: u32 = 4;
/// No completion on success (errors always complete). Default: every WR completes.
pub const RDMX_POST_UNSIGNALED: u32 = 1 << 8;

/// A completion carries immediate data (`imm` is valid).
pub const RDMX_WC_WITH_IMM: u32 = 2;

/// Accepts connections. Opaque; free with `rdmx_listener_free`.
#[allow(non_camel_case_types)]
pub struct rdmx_listener {
    inner: Listener,
}

/// One RC connection. Opaque; free with `rdmx_conn_free`. Posting and polling may happen
/// from different threads; `rdmx_conn_close`/`_free` must not race other calls on it.
///
/// `repr(transparent)` so that the on-connect hook can hand C a `rdmx_conn *` for a
/// connection that is still being set up (see `rdmx_context_set_on_connect`). The header's
/// opaque typedef comes from cbindgen.toml (cbindgen would print a typedef of the field).
#[allow(non_camel_case_types)]
#[repr(transparent)]
pub struct rdmx_conn {
    inner: Connection,
}

/// Called for every new connection (accepted or initiated) once its QP can receive and
/// before the peer is told it may send: post the first receives here. `conn` is lent for
/// the call: `rdmx_conn_close`/`rdmx_conn_free` on it are refused (RDMX_INVALID_ARGUMENT,
/// nothing happens); the accept/connect call returns it afterwards.
/// Return 0 to go on; anything else fails the accept/connect (RDMX_CLOSED).
#[allow(non_camel_case_types)]
pub type rdmx_on_connect =
    Option<unsafe extern "C" fn(user_data: *mut c_void, conn: *mut rdmx_conn) -> i32>;

/// Connections lent to an on-connect hook right now (their handles' addresses): closing
/// or freeing one of them is refused, so the hook's borrow can never become an owner
/// (`rdmx_conn_close` would make a `&mut` from the `&` it was lent, `rdmx_conn_free` would
/// free memory rdmx owns).
static LENT: parking_lot::Mutex<Vec<usize>> = parking_lot::Mutex::new(Vec::new());

/// Err if `c` is lent to an on-connect hook.
fn not_lent(c: *const rdmx_conn, verb: &str) -> Result<()> {
    if LENT.lock().contains(&(c as usize)) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "conn is lent to the on-connect hook: {verb} it after rdmx_connect/rdmx_listener_accept returns it"
            ),
        ));
    }
    Ok(())
}

/// Marks a handle lent for the life of the guard.
struct Lend(usize);
impl Lend {
    fn new(p: *const rdmx_conn) -> Lend {
        LENT.lock().push(p as usize);
        Lend(p as usize)
    }
}
impl Drop for Lend {
    fn drop(&mut self) {
        let mut l = LENT.lock();
        if let Some(i) = l.iter().position(|&x| x == self.0) {
            l.swap_remove(i);
        }
    }
}

/// The user's pointer for the on-connect hook.
struct HookData(*mut c_void);
impl HookData {
    // A method (not `.0`) so closures capture the whole Send/Sync wrapper.
    fn ptr(&self) -> *mut c_void {
        self.0
    }
}
// SAFETY: rdmx never dereferences the pointer; the caller of rdmx_context_set_on_connect
// promises (header docs) that the hook may run on any thread that accepts or connects.
unsafe impl Send for HookData {}
// SAFETY: as above; rdmx only copies the pointer value.
unsafe impl Sync for HookData {}

/// Sets (or, with a NULL `hook`, clears) the hook run on every new connection of `ctx`
/// before the peer may send (see `rdmx_on_connect`). Without it, post receives right after
/// accept/connect and mind the RNR budget (see `rdmx_listener_accept`). `user_data` is
/// passed back untouched and must stay valid while the hook is set.
///
/// # Safety
/// `ctx` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_context_set_on_connect(
    ctx: *mut rdmx_context,
    hook: rdmx_on_connect,
    user_data: *mut c_void,
) -> rdmx_status {
    boundary::call("rdmx_context_set_on_connect", || {
        // SAFETY: forwarded contract.
        let ctx = unsafe { handle(ctx, "ctx") }?;
        let h: Option<OnConnect> = hook.map(|cb| {
            let user = HookData(user_data);
            let f: OnConnect = Arc::new(move |c: &Connection| {
                // `rdmx_conn` is repr(transparent) over `Connection`: the same address is a
                // valid handle for the duration of the call.
                let p = (c as *const Connection).cast_mut().cast::<rdmx_conn>();
                let _lent = Lend::new(p);
                // SAFETY: the caller's function pointer with the documented signature; the
                // handle is valid for the call, and closing or freeing it is refused while
                // it is lent (`not_lent`).
                let rc = unsafe { cb(user.ptr(), p) };
                if rc == 0 {
                    Ok(())
                } else {
                    Err(Error::new(
                        ErrorKind::Closed,
                        format!("the on-connect hook returned {rc}: connection abandoned"),
                    ))
                }
            });
            f
        });
        ctx.inner.set_on_connect(h);
        Ok(())
    })
}

/// A scatter/gather element: `length` bytes at `addr` inside the region with `lkey`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// A region the peer exposed for RDMA READ/WRITE.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_remote_region {
    pub addr: u64,
    pub length: u64,
    pub rkey: u32,
    /// RDMX_ACCESS_REMOTE_READ / RDMX_ACCESS_REMOTE_WRITE bits.
    pub access: u32,
}

/// A work completion. `status` and `opcode` are the verbs values (`ibv_wc_status`,
/// `ibv_wc_opcode`: 0 SEND, 1 RDMA_WRITE, 2 RDMA_READ, 128 RECV, 129 RECV_RDMA_WITH_IMM).
/// For a status other than 0 only `cookie`, `status` and `qp_num` are meaningful.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_completion {
    pub cookie: u64,
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
    /// Immediate data when `flags & RDMX_WC_WITH_IMM`, as sent.
    pub imm: u32,
    pub flags: u32,
    pub qp_num: u32,
}

/// Per-connection counters (the seed's retrans_cnt, out_of_seq, packet_errors and more).
///
/// From `tx_packets` to `tx_errors`: the soft transport's packets (zero with
/// provider=verbs, where a NIC counts packets per port, not per QP). From
/// `wr_send_posted` on: work requests and completions, on both providers.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_counters {
    /// Set by the caller to `sizeof` this struct before the call; rdmx fills at most that
    /// many bytes and writes back how many it filled (see "Structs that grow" at the top of
    /// this header). The order of the fields is frozen: new fields are only added at the end.
    pub struct_size: usize,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub retransmits: u64,
    pub seq_naks_sent: u64,
    pub seq_naks_received: u64,
    pub rnr_naks_sent: u64,
    pub rnr_naks_received: u64,
    pub ack_timeouts: u64,
    pub duplicates_received: u64,
    pub out_of_sequence: u64,
    pub icrc_errors: u64,
    pub malformed: u64,
    /// Packets dropped on purpose by `soft_drop_ratio`.
    pub injected_drops: u64,
    /// Datagrams the kernel dropped on the context's UDP receive queue (SO_RXQ_OVFL).
    pub kernel_drops: u64,
    /// Times the context's process was found not running when its transport was due to
    /// act (CPU starved, stopped), at least 200 us each. Per context.
    pub stalls: u64,
    /// Total time of those stalls, ns: left out of the ACK timers, so a requester does not
    /// charge its own absence to the peer's retry budget. Per context.
    pub stalled_ns: u64,
    /// Duplicate READ requests that queued no replay of their own (the READ's responses
    /// were already queued, or max_dest_rd_atomic replays were): a flood costs nothing.
    pub dropped_duplicate_reads: u64,
    /// READ requests refused because max_dest_rd_atomic READs were still being answered
    /// (the peer ignored its max_rd_atomic): NAK Invalid Request, QP to ERR.
    pub rd_atomic_exceeded: u64,
    /// Datagrams that found the QP's UDP send buffer full and were sent later from its
    /// backlog: back-pressure (posts then find the send queue full), not loss.
    pub tx_deferred: u64,
    /// Datagrams the kernel refused outright (e.g. no route): lost, then retransmitted.
    pub tx_errors: u64,
    /// Send-queue work requests accepted (SEND, WRITE, READ; with or without immediate).
    pub wr_send_posted: u64,
    /// Receive work requests accepted.
    pub wr_recv_posted: u64,
    /// Payload bytes of the accepted SENDs.
    pub send_bytes_posted: u64,
    /// Payload bytes of the accepted RDMA WRITEs.
    pub write_bytes_posted: u64,
    /// Bytes the accepted RDMA READs asked for.
    pub read_bytes_posted: u64,
    /// Completions returned by `rdmx_poll` (every status).
    pub completions: u64,
    /// Bytes delivered by successful receive completions (`byte_len`).
    pub recv_bytes: u64,
    /// Async events the device reported about this connection's QP or CQs (provider=verbs:
    /// QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, CQ_ERR, COMM_EST, ...; an error event also
    /// moves the QP to ERR and sets `rdmx_conn_error`). 0 on soft.
    pub async_events: u64,
    /// Completions returned by `rdmx_poll`, by status: `wc_status[s]` counts status `s`
    /// (0 success, 4 LOC_PROT_ERR, 5 WR_FLUSH_ERR, 10 REM_ACCESS_ERR, 12 RETRY_EXC_ERR, ...;
    /// indices 0..=21 are the `ibv_wc_status` values).
    pub wc_status: [u64; 22],
}

fn timeout_of(ms: i32) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// Listens on `addr` ("IP:PORT", IPv4 or bracketed IPv6 such as `"[::1]:18515"`; `"[::]:PORT"`
/// also takes IPv4 clients; port 0 = any free port, see `rdmx_listener_port`).
///
/// # Safety
/// `ctx` NULL or live; `addr` NULL or NUL-terminated; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_listener_new(
    ctx: *mut rdmx_context,
    addr: *const c_char,
    out: *mut *mut rdmx_listener,
) -> rdmx_status {
    boundary::call("rdmx_listener_new", || {
        let out = out_ptr(out)?;
        // SAFETY: forwarded contract.
        let ctx = unsafe { handle(ctx, "ctx") }?;
        // SAFETY: forwarded contract.
        let addr = unsafe { addr_arg(addr) }?;
        let l = Box::new(rdmx_listener {
            inner: ctx.inner.listen(addr)?,
        });
        // SAFETY: `out` checked non-NULL and writable.
        unsafe { out.write(Box::into_raw(l)) };
        Ok(())
    })
}

/// The TCP port the listener is bound to (0 for a NULL listener).
///
/// # Safety
/// `l` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_listener_port(l: *const rdmx_listener) -> u16 {
    boundary::call_value("rdmx_listener_port", 0, || {
        // SAFETY: forwarded contract.
        unsafe { l.as_ref() }.map_or(0, |l| l.inner.local_addr().port())
    })
}

/// Waits up to `timeout_ms` (-1 = forever) for a connection and sets it up; RDMX_TIMEOUT
/// when none came. `*out` receives a connection the caller owns.
///
/// Post receives right after accepting: the peer may SEND as soon as its `rdmx_connect`
/// returns, and until a receive is posted its SENDs are RNR-NAKed and retried `rnr_retry`
/// times, `min_rnr_timer` apart (defaults: 2 x 0.64 ms), after which they fail with status
/// 13 (RNR_RETRY_EXC_ERR) and the connection breaks. If receives come later, raise
/// `rnr_retry` (7 = retry forever) or have the client wait for the server's first message.
///
/// # Safety
/// `l` NULL or live; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_listener_accept(
    l: *mut rdmx_listener,
    timeout_ms: i32,
    out: *mut *mut rdmx_conn,
) -> rdmx_status {
    boundary::call("rdmx_listener_accept", || {
        let out = out_ptr(out)?;
        // SAFETY: forwarded contract.
        let l = unsafe { handle(l, "listener") }?;
        let c = Box::new(rdmx_conn {
            inner: l.inner.accept(timeout_of(timeout_ms))?,
        });
        // SAFETY: `out` checked non-NULL and writable.
        unsafe { out.write(Box::into_raw(c)) };
        Ok(())
    })
}

/// A listener's handshake counters (`rdmx_listener_counters`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_handshake_counters {
    /// Set by the caller to `sizeof` this struct before the call; rdmx fills at most that
    /// many bytes and writes back how many it filled (see "Structs that grow" at the top of
    /// this header). The order of the fields is frozen: new fields are only added at the end.
    pub struct_size: usize,
    /// Peers that failed authentication (wrong key, unknown entity, no or unwanted
    /// authentication, a replayed or reflected exchange).
    pub auth_failures: u64,
    /// Connections refused at a handshake bound (`handshake_max`, `handshake_per_source`)
    /// or for a malformed auth frame.
    pub refused: u64,
    /// Connections dropped for not sending an auth frame within `handshake_first_bytes_ms`.
    pub timed_out: u64,
    /// Connections that passed authentication (or, with auth=none, spoke).
    pub passed: u64,
    /// Handshake threads that panicked inside rdmx (a bug, or a Rust region filter):
    /// caught and logged at error level; the handshake failed. 0 normally.
    pub panics: u64,
}

/// The listener's handshake counters: authentication failures, refusals, timeouts. A
/// failed handshake never reaches `rdmx_listener_accept`; it is counted here and logged
/// (warn level, rate-limited) with the peer's address and claimed entity.
///
/// # Safety
/// `l` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_listener_counters(
    l: *const rdmx_listener,
    out: *mut rdmx_handshake_counters,
) -> rdmx_status {
    boundary::call("rdmx_listener_counters", || {
        // SAFETY: forwarded contract.
        let l = unsafe { handle(l, "listener") }?;
        let c = l.inner.counters();
        let v = rdmx_handshake_counters {
            struct_size: 0,
            auth_failures: c.auth_failures,
            refused: c.refused,
            timed_out: c.timed_out,
            passed: c.passed,
            panics: c.panics,
        };
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, v) }?;
        Ok(())
    })
}

/// Frees a listener (connections it accepted live on). NULL is a no-op.
///
/// # Safety
/// `l` NULL or from `rdmx_listener_new`, not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_listener_free(l: *mut rdmx_listener) {
    boundary::call_value("rdmx_listener_free", (), || {
        if !l.is_null() {
            // SAFETY: ownership returns here exactly once, per the contract.
            drop(unsafe { Box::from_raw(l) });
        }
    })
}

/// Connects to a listener at `addr` ("HOST:PORT") within `timeout_ms` (-1: the system's
/// TCP timeout) and sets up the RC connection: QP numbers, start PSNs, path MTU (the
/// smaller of both sides'), rd_atomic limits and exposed regions are exchanged over TCP,
/// which then stays open as the liveness signal.
///
/// # Safety
/// `ctx` NULL or live; `addr` NULL or NUL-terminated; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_connect(
    ctx: *mut rdmx_context,
    addr: *const c_char,
    timeout_ms: i32,
    out: *mut *mut rdmx_conn,
) -> rdmx_status {
    boundary::call("rdmx_connect", || {
        let out = out_ptr(out)?;
        // SAFETY: forwarded contract.
        let ctx = unsafe { handle(ctx, "ctx") }?;
        // SAFETY: forwarded contract.
        let addr = unsafe { addr_arg(addr) }?;
        let t = timeout_of(timeout_ms).unwrap_or(Duration::from_secs(120));
        let c = Box::new(rdmx_conn {
            inner: ctx.inner.connect(addr, t)?,
        });
        // SAFETY: `out` checked non-NULL and writable.
        unsafe { out.write(Box::into_raw(c)) };
        Ok(())
    })
}

/// Closes a connection: the peer sees EOF, every outstanding WR completes (flushed), and
/// the memory they named is free to deregister. Completions stay pollable until
/// `rdmx_conn_free`. Later posts give RDMX_CLOSED.
///
/// # Safety
/// `c` NULL or live, not used by another thread during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_conn_close(c: *mut rdmx_conn) -> rdmx_status {
    boundary::call("rdmx_conn_close", || {
        not_lent(c, "close")?;
        // SAFETY: forwarded contract; not a handle lent to a hook (checked above).
        unsafe { handle_mut(c, "conn") }?.inner.close();
        Ok(())
    })
}

/// Closes (if open) and frees a connection. NULL is a no-op.
///
/// # Safety
/// `c` NULL or from `rdmx_connect`/`rdmx_listener_accept`, not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_conn_free(c: *mut rdmx_conn) {
    boundary::call_value("rdmx_conn_free", (), || {
        if c.is_null() {
            return;
        }
        if let Err(e) = not_lent(c, "free") {
            log::error!(target: "rdmx::ffi", "rdmx_conn_free: {}", e.message());
            boundary::set_last_error(&format!("rdmx_conn_free: {}", e.message()));
            return;
        }
        // SAFETY: ownership returns here exactly once, per the contract (and it is not a
        // handle lent to a hook, checked above).
        drop(unsafe { Box::from_raw(c) });
    })
}

/// How many regions the peer exposed.
///
/// # Safety
/// `c` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_conn_remote_region_count(c: *const rdmx_conn) -> usize {
    boundary::call_value("rdmx_conn_remote_region_count", 0, || {
        // SAFETY: forwarded contract.
        unsafe { c.as_ref() }.map_or(0, |c| c.inner.peer_regions().len())
    })
}

/// The connection's path MTU in bytes (256..4096): the smaller of the two sides' offers,
/// each the configured `path_mtu` capped by the active MTU of that side's link to the other.
/// 0 for NULL.
///
/// # Safety
/// `c` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_conn_path_mtu(c: *const rdmx_conn) -> u32 {
    boundary::call_value("rdmx_conn_path_mtu", 0, || {
        // SAFETY: forwarded contract.
        unsafe { c.as_ref() }.map_or(0, |c| c.inner.path_mtu())
    })
}

/// The peer's `i`-th exposed region (in address order).
///
/// # Safety
/// `c` NULL or live; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_conn_remote_region(
    c: *const rdmx_conn,
    i: usize,
    out: *mut rdmx_remote_region,
) -> rdmx_status {
    boundary::call("rdmx_conn_remote_region", || {
        // SAFETY: forwarded contract.
        let c = unsafe { handle(c, "conn") }?;
        let r = c.inner.peer_regions().get(i).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "i: {i} out of range: the peer exposed {} region(s)",
                    c.inner.peer_regions().len()
                ),
            )
        })?;
        let out = out_ptr(out)?;
        // SAFETY: `out` checked non-NULL and writable.
        unsafe {
            out.write(rdmx_remote_region {
                addr: r.addr,
                length: r.len,
                rkey: r.rkey,
                access: r.access,
            })
        };
        Ok(())
    })
}

/// The SGE list of a post call.
///
/// # Safety
/// `sges` NULL (with `n == 0`) or valid for `n` elements.
unsafe fn sge_list(sges: *const rdmx_sge, n: usize) -> Result<SgeList> {
    if n == 0 {
        return Ok(SgeList::new());
    }
    if sges.is_null() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "sges is NULL with n > 0",
        ));
    }
    // SAFETY: non-NULL and valid for `n` elements per the contract.
    let s = unsafe { std::slice::from_raw_parts(sges, n) };
    Ok(s.iter()
        .map(|g| Sge {
            addr: g.addr,
            length: g.length,
            lkey: g.lkey,
        })
        .collect())
}

fn engine_flags(flags: u32) -> Result<u32> {
    let known = RDMX_POST_FENCE | RDMX_POST_SOLICITED | RDMX_POST_UNSIGNALED;
    if flags & !known != 0 {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "flags: unknown bits {:#x}: allowed RDMX_POST_FENCE, RDMX_POST_SOLICITED, RDMX_POST_UNSIGNALED",
                flags & !known
            ),
        ));
    }
    let mut f = flags & (send_flags::FENCE | send_flags::SOLICITED);
    if flags & RDMX_POST_UNSIGNALED == 0 {
        f |= send_flags::SIGNALED;
    }
    Ok(f)
}

#[allow(clippy::too_many_arguments)]
unsafe fn post(
    name: &str,
    c: *mut rdmx_conn,
    opcode: WrOpcode,
    sges: *const rdmx_sge,
    n: usize,
    remote_addr: u64,
    rkey: u32,
    imm: u32,
    cookie: u64,
    flags: u32,
) -> rdmx_status {
    boundary::call(name, || {
        // SAFETY: forwarded contract of the public entry points.
        let c = unsafe { handle(c, "conn") }?;
        let req = SendReq {
            cookie,
            opcode,
            flags: engine_flags(flags)?,
            // SAFETY: forwarded contract.
            sges: unsafe { sge_list(sges, n) }?,
            remote_addr,
            rkey,
            imm,
        };
        c.inner.post_send(std::slice::from_ref(&req)).map(|_| ())
    })
}

/// Posts a SEND of the bytes the SGEs name; the peer receives them into its next posted
/// receive. `cookie` comes back in the completion. RDMX_FULL when `max_send_wr` WRs are
/// outstanding; RDMX_CLOSED on a closed connection.
///
/// # Safety
/// `c` NULL or live; `sges` valid for `n` elements (NULL if 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_post_send(
    c: *mut rdmx_conn,
    sges: *const rdmx_sge,
    n: usize,
    cookie: u64,
    flags: u32,
) -> rdmx_status {
    // SAFETY: forwarded contract.
    unsafe {
        post(
            "rdmx_post_send",
            c,
            WrOpcode::Send,
            sges,
            n,
            0,
            0,
            0,
            cookie,
            flags,
        )
    }
}

/// As `rdmx_post_send`, with 32-bit immediate data delivered in the receive completion.
///
/// # Safety
/// As `rdmx_post_send`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_post_send_imm(
    c: *mut rdmx_conn,
    sges: *const rdmx_sge,
    n: usize,
    imm: u32,
    cookie: u64,
    flags: u32,
) -> rdmx_status {
    // SAFETY: forwarded contract.
    unsafe {
        post(
            "rdmx_post_send_imm",
            c,
            WrOpcode::SendWithImm,
            sges,
            n,
            0,
            0,
            imm,
            cookie,
            flags,
        )
    }
}

/// RDMA READ: fills the local SGEs (their regions need RDMX_ACCESS_LOCAL_WRITE) from
/// `[remote_addr, remote_addr + total length)` of the peer's region `rkey`. Outside the
/// region or without REMOTE_READ: completion with status 10 (REM_ACCESS_ERR).
///
/// # Safety
/// As `rdmx_post_send`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_post_read(
    c: *mut rdmx_conn,
    sges: *const rdmx_sge,
    n: usize,
    remote_addr: u64,
    rkey: u32,
    cookie: u64,
    flags: u32,
) -> rdmx_status {
    // SAFETY: forwarded contract.
    unsafe {
        post(
            "rdmx_post_read",
            c,
            WrOpcode::RdmaRead,
            sges,
            n,
            remote_addr,
            rkey,
            0,
            cookie,
            flags,
        )
    }
}

/// RDMA WRITE of the local SGEs' bytes to the peer's region `rkey` at `remote_addr`. Into
/// a region exposed without REMOTE_WRITE: completion status 10 (REM_ACCESS_ERR).
///
/// # Safety
/// As `rdmx_post_send`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_post_write(
    c: *mut rdmx_conn,
    sges: *const rdmx_sge,
    n: usize,
    remote_addr: u64,
    rkey: u32,
    cookie: u64,
    flags: u32,
) -> rdmx_status {
    // SAFETY: forwarded contract.
    unsafe {
        post(
            "rdmx_post_write",
            c,
            WrOpcode::RdmaWrite,
            sges,
            n,
            remote_addr,
            rkey,
            0,
            cookie,
            flags,
        )
    }
}

/// As `rdmx_post_write`, and the peer's next posted receive completes (opcode 129) with
/// `imm`.
///
/// # Safety
/// As `rdmx_post_send`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_post_write_imm(
    c: *mut rdmx_conn,
    sges: *const rdmx_sge,
    n: usize,
    remote_addr: u64,
    rkey: u32,
    imm: u32,
    cookie: u64,
    flags: u32,
) -> rdmx_status {
    // SAFETY: forwarded contract.
    unsafe {
        post(
            "rdmx_post_write_imm",
            c,
            WrOpcode::RdmaWriteWithImm,
            sges,
            n,
            remote_addr,
            rkey,
            imm,
            cookie,
            flags,
        )
    }
}

/// Posts a receive buffer (SGEs in regions with RDMX_ACCESS_LOCAL_WRITE) for the peer's
/// next SEND or WRITE with immediate.
///
/// # Safety
/// As `rdmx_post_send`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_post_recv(
    c: *mut rdmx_conn,
    sges: *const rdmx_sge,
    n: usize,
    cookie: u64,
) -> rdmx_status {
    boundary::call("rdmx_post_recv", || {
        // SAFETY: forwarded contract.
        let c = unsafe { handle(c, "conn") }?;
        // SAFETY: forwarded contract.
        let sges = unsafe { sge_list(sges, n) }?;
        c.inner.post_recv(&[(cookie, sges)]).map(|_| ())
    })
}

fn to_c(w: &Wc) -> rdmx_completion {
    rdmx_completion {
        cookie: w.cookie,
        status: w.status as u32,
        opcode: w.opcode as u32,
        byte_len: w.byte_len,
        imm: w.imm.unwrap_or(0),
        flags: if w.imm.is_some() { RDMX_WC_WITH_IMM } else { 0 },
        qp_num: w.qp_num,
    }
}

/// Moves up to `max` completions into `out` and stores how many in `*n` (0 is not an
/// error). Send completions come in WR order, receive completions in receive order.
///
/// # Safety
/// `c` NULL or live; `out` valid for `max` elements (NULL if 0); `n` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_poll(
    c: *mut rdmx_conn,
    out: *mut rdmx_completion,
    max: usize,
    n: *mut usize,
) -> rdmx_status {
    boundary::call("rdmx_poll", || {
        // SAFETY: forwarded contract.
        let c = unsafe { handle(c, "conn") }?;
        if max > 0 && out.is_null() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "out is NULL with max > 0",
            ));
        }
        let mut buf = [Wc {
            cookie: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm: None,
            qp_num: 0,
            src_qp: None,
        }; 64];
        let k = c.inner.poll(&mut buf[..max.min(64)]);
        for (i, w) in buf[..k].iter().enumerate() {
            // SAFETY: `out` is valid for `max` >= `k` elements per the contract.
            unsafe { out.add(i).write(to_c(w)) };
        }
        if !n.is_null() {
            // SAFETY: non-NULL and writable per the contract.
            unsafe { n.write(k) };
        }
        Ok(())
    })
}

/// Arms the connection's event fd: it becomes readable when the next completion arrives
/// (at once if completions are queued) or when the peer goes away. Then `poll()`/epoll it,
/// call `rdmx_event_clear`, and `rdmx_poll`.
///
/// # Safety
/// `c` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_req_notify(c: *mut rdmx_conn) -> rdmx_status {
    boundary::call("rdmx_req_notify", || {
        // SAFETY: forwarded contract.
        unsafe { handle(c, "conn") }?.inner.req_notify();
        Ok(())
    })
}

/// The connection's completion event fd (for epoll); -1 for a NULL connection. Owned by
/// rdmx: do not close it.
///
/// # Safety
/// `c` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_event_fd(c: *const rdmx_conn) -> i32 {
    boundary::call_value("rdmx_event_fd", -1, || {
        // SAFETY: forwarded contract.
        unsafe { c.as_ref() }.map_or(-1, |c| c.inner.event_fd())
    })
}

/// Resets the event fd after it fired (before re-arming with `rdmx_req_notify`).
///
/// # Safety
/// `c` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_event_clear(c: *mut rdmx_conn) -> rdmx_status {
    boundary::call("rdmx_event_clear", || {
        // SAFETY: forwarded contract.
        unsafe { handle(c, "conn") }?.inner.clear_event();
        Ok(())
    })
}

/// The connection's counters.
///
/// # Safety
/// `c` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_conn_counters(
    c: *const rdmx_conn,
    out: *mut rdmx_counters,
) -> rdmx_status {
    boundary::call("rdmx_conn_counters", || {
        // SAFETY: forwarded contract.
        let c = unsafe { handle(c, "conn") }?;
        let k = c.inner.counters();
        let v = rdmx_counters {
            struct_size: 0,
            tx_packets: k.tx_packets,
            tx_bytes: k.tx_bytes,
            rx_packets: k.rx_packets,
            rx_bytes: k.rx_bytes,
            retransmits: k.retransmits,
            seq_naks_sent: k.seq_naks_sent,
            seq_naks_received: k.seq_naks_received,
            rnr_naks_sent: k.rnr_naks_sent,
            rnr_naks_received: k.rnr_naks_received,
            ack_timeouts: k.ack_timeouts,
            duplicates_received: k.duplicates_received,
            out_of_sequence: k.out_of_sequence,
            icrc_errors: k.icrc_errors,
            malformed: k.malformed,
            injected_drops: c.inner.injected_drops(),
            kernel_drops: c.inner.kernel_drops(),
            stalls: c.inner.progress_stats().stalls,
            stalled_ns: c.inner.progress_stats().stalled_ns,
            dropped_duplicate_reads: k.dropped_duplicate_reads,
            rd_atomic_exceeded: k.rd_atomic_exceeded,
            tx_deferred: c.inner.tx_deferred(),
            tx_errors: c.inner.tx_errors(),
            wr_send_posted: k.wr_send_posted,
            wr_recv_posted: k.wr_recv_posted,
            send_bytes_posted: k.send_bytes_posted,
            write_bytes_posted: k.write_bytes_posted,
            read_bytes_posted: k.read_bytes_posted,
            completions: k.completions,
            recv_bytes: k.recv_bytes,
            async_events: k.async_events,
            wc_status: k.wc_status,
        };
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, v) }?;
        Ok(())
    })
}

/// Why the connection's QP failed, in words, once a completion reported
/// RETRY_EXC_ERR (12) or RNR_RETRY_EXC_ERR (13): how many retries over how many ms, the
/// timeout / retry_cnt / rnr_retry in force and the likely causes (peer gone or path down;
/// a host starved of CPU, with the load average); with provider=verbs also once the device
/// reported an error async event about the connection's QP (QP_FATAL, QP_ACCESS_ERR,
/// CQ_ERR, ...: the event and its likely cause). NULL if the connection has not failed
/// that way (or `c` is NULL). Owned by the connection: valid until `rdmx_conn_free`.
///
/// # Safety
/// `c` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_conn_error(c: *const rdmx_conn) -> *const c_char {
    boundary::call_value("rdmx_conn_error", std::ptr::null(), || {
        // SAFETY: forwarded contract.
        let Ok(c) = (unsafe { handle(c, "conn") }) else {
            return std::ptr::null();
        };
        c.inner
            .failure_note_c()
            .map_or(std::ptr::null(), |s| s.as_ptr())
    })
}

/// A static name for a work completion status (verbs' ibv_wc_status_str wording), e.g.
/// "transport retry counter exceeded" for 12. Never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn rdmx_wc_status_str(status: u32) -> *const c_char {
    let s: &'static std::ffi::CStr = match status {
        0 => c"success",
        1 => c"local length error",
        2 => c"local QP operation error",
        4 => c"local protection error",
        5 => c"Work Request Flushed Error",
        7 => c"bad response error",
        8 => c"local access error",
        9 => c"remote invalid request error",
        10 => c"remote access error",
        11 => c"remote operation error",
        12 => c"transport retry counter exceeded",
        13 => c"RNR retry counter exceeded",
        19 => c"fatal error",
        21 => c"general error",
        _ => c"unknown",
    };
    s.as_ptr()
}

sized_out!(rdmx_counters, rdmx_handshake_counters);

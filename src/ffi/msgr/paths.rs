//! `rdmx_msgr_connect_paths`, `rdmx_msgr_add_path`, `rdmx_msgr_remove_path`,
//! `rdmx_msgr_path_count`, `rdmx_msgr_path_info`, `rdmx_msgr_next_path_event`: sessions
//! with several paths (docs/failover.md, `Messenger::connect_paths`).

use super::super::boundary::{self, handle, out_ptr};
use super::super::context::addr_arg;
use super::super::sized::{sized_out, write_sized};
use super::super::status::rdmx_status;
use super::{policy_arg, rdmx_msgr};
use crate::error::{Error, ErrorKind};
use crate::msgr::messenger::{PathEvent, PathPolicy, PathState, SessionId};
use std::ffi::c_char;
use std::time::Instant;

/// `path_policy` of `rdmx_msgr_connect_paths`: all traffic on the active path (the
/// lowest-index path up), the others connected and idle (keepalives only) so that a
/// switch costs no handshake. For one preferred path: two switches, or a second path that
/// costs more (another subnet, a slower link), used only when the first fails.
pub const RDMX_PATH_POLICY_STANDBY: u32 = 0;
/// `path_policy` of `rdmx_msgr_connect_paths`: every joined path carries data, each
/// message on the one with the fewest unacknowledged messages. For two NIC ports whose
/// bandwidth is wanted together (spread the load). The receiver holds a message that
/// arrives ahead of an earlier one still on another path (bounded by the sender's
/// `msgr_send_queue_msgs`; its buffers stay taken meanwhile) and delivers in order. When
/// a path fails, a lossless session sends again on the others only what went on it
/// (exactly once, in order); a lossy one completes those sends "in doubt" and the
/// receiver skips them. (The Rust API's immediate messages are refused on such a
/// session: they carry no sequence number to order them across paths.)
pub const RDMX_PATH_POLICY_ACTIVE: u32 = 1;

/// `rdmx_msgr_path.state`: no connection (failed, or not tried yet); retried with the
/// `msgr_reconnect_*` backoff.
pub const RDMX_PATH_DOWN: u32 = 0;
/// `rdmx_msgr_path.state`: a connection attempt or the path-join handshake is under way.
pub const RDMX_PATH_CONNECTING: u32 = 1;
/// `rdmx_msgr_path.state`: joined to the session, idle.
pub const RDMX_PATH_STANDBY: u32 = 2;
/// `rdmx_msgr_path.state`: the session's traffic goes on it (with
/// RDMX_PATH_POLICY_ACTIVE: every joined path).
pub const RDMX_PATH_ACTIVE: u32 = 3;

/// A path of a session (`rdmx_msgr_path_info`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_msgr_path {
    /// Set by the caller to `sizeof` this struct (see "Structs that grow" at the top of
    /// this header). Fields are only added at the end.
    pub struct_size: usize,
    /// RDMX_PATH_DOWN, _CONNECTING, _STANDBY or _ACTIVE.
    pub state: u32,
    /// 1: removed by `rdmx_msgr_remove_path` (its index is not reused).
    pub removed: u32,
    /// Messages (first sends and replays) and their bytes sent on this path.
    pub msgs_sent: u64,
    pub bytes_sent: u64,
    /// Faults of this path's connections (error completion, side-channel EOF, keepalive
    /// loss, refused post, a refused join).
    pub faults: u64,
    /// Times the session's traffic moved to this path.
    pub switches: u64,
    /// Microseconds since this path's last fault; UINT64_MAX if it never failed.
    pub since_last_fault_us: u64,
}

/// `rdmx_msgr_path_event.kind`: none (no event since the last call).
pub const RDMX_PATH_EVENT_NONE: u32 = 0;
/// `rdmx_msgr_path_event.kind`: the path went down (`reason` says why); the session goes
/// on on another path if one is up.
pub const RDMX_PATH_EVENT_DOWN: u32 = 1;
/// `rdmx_msgr_path_event.kind`: the path joined the session (standby).
pub const RDMX_PATH_EVENT_UP: u32 = 2;
/// `rdmx_msgr_path_event.kind`: the session's traffic moved to this path (a failover, or
/// a failback to a preferred path).
pub const RDMX_PATH_EVENT_ACTIVE: u32 = 3;

/// Bytes of `rdmx_msgr_path_event.reason`, its terminating NUL included.
pub const RDMX_PATH_REASON_LEN: usize = 128;

/// A path event of a messenger's session (`rdmx_msgr_next_path_event`).
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct rdmx_msgr_path_event {
    /// Set by the caller to `sizeof` this struct (see "Structs that grow" at the top of
    /// this header). Fields are only added at the end.
    pub struct_size: usize,
    /// RDMX_PATH_EVENT_NONE, _DOWN, _UP or _ACTIVE.
    pub kind: u32,
    /// The path's index (the order of `rdmx_msgr_connect_paths`' `addrs`, then of
    /// `rdmx_msgr_add_path`).
    pub path: u32,
    /// The session.
    pub session: u64,
    /// Microseconds from the event to this call.
    pub age_us: u64,
    /// For RDMX_PATH_EVENT_DOWN, why (NUL-terminated, cut to fit); empty otherwise.
    pub reason: [c_char; RDMX_PATH_REASON_LEN],
}

impl Default for rdmx_msgr_path_event {
    fn default() -> Self {
        rdmx_msgr_path_event {
            struct_size: 0,
            kind: RDMX_PATH_EVENT_NONE,
            path: 0,
            session: 0,
            age_us: 0,
            reason: [0; RDMX_PATH_REASON_LEN],
        }
    }
}

sized_out!(rdmx_msgr_path, rdmx_msgr_path_event);

/// Path events a messenger keeps for `rdmx_msgr_next_path_event` (the oldest go first).
pub(super) const PATH_EVENTS_KEPT: usize = 1024;

/// One path event as the dispatcher was told.
pub(super) struct PathRecord {
    pub session: SessionId,
    pub path: usize,
    pub event: PathEvent,
    pub at: Instant,
}

fn copy_reason(text: &str, out: &mut [c_char; RDMX_PATH_REASON_LEN]) {
    let mut end = text.len().min(RDMX_PATH_REASON_LEN - 1);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    for (o, b) in out.iter_mut().zip(&text.as_bytes()[..end]) {
        *o = *b as c_char;
    }
    out[end] = 0;
}

/// Opens a session to one peer over `n` paths: `addrs[0..n]` ("HOST:PORT" each, of the
/// same messenger: two NIC ports, two subnets; `addrs[0]` preferred; 1 to 16) with
/// `policy` (RDMX_POLICY_*) and `path_policy` (RDMX_PATH_POLICY_STANDBY: one path carries
/// the traffic, the others wait; RDMX_PATH_POLICY_ACTIVE: every joined path carries it,
/// least outstanding first). `*session` receives its id at once; the first path that
/// answers carries the session (a CONNECT event), the others join it. When a path fails
/// its traffic moves to the paths up without a new session: a lossless session replays
/// what the peer has not acknowledged, a lossy one completes those sends with an "in
/// doubt" error text (status RDMX_CLOSED) and goes on. Only when no path is up does the session reconnect
/// (lossless) or end (lossy). Path events: `rdmx_msgr_next_path_event`. The strings are
/// copied; the caller keeps ownership of `addrs`.
///
/// # Safety
/// `m` NULL or live; `addrs` NULL or valid for `n` pointers, each NULL or NUL-terminated;
/// `session` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_connect_paths(
    m: *mut rdmx_msgr,
    addrs: *const *const c_char,
    n: usize,
    policy: u32,
    path_policy: u32,
    session: *mut u64,
) -> rdmx_status {
    boundary::call("rdmx_msgr_connect_paths", || {
        let session = out_ptr(session)?;
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        if addrs.is_null() {
            return Err(Error::fixed(
                ErrorKind::InvalidArgument,
                "rdmx_msgr_connect_paths: addrs is NULL",
            ));
        }
        if n == 0 || n > 16 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("rdmx_msgr_connect_paths: {n} addresses (1 to 16)"),
            ));
        }
        let mut list = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: `addrs` is valid for `n` pointers per the contract.
            let p = unsafe { *addrs.add(i) };
            // SAFETY: each is NULL or NUL-terminated per the contract.
            list.push(unsafe { addr_arg(p) }?);
        }
        let policy = policy_arg(m, policy)?;
        let pp = match path_policy {
            RDMX_PATH_POLICY_STANDBY => PathPolicy::Standby,
            RDMX_PATH_POLICY_ACTIVE => PathPolicy::Active,
            p => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "path_policy {p}: expected RDMX_PATH_POLICY_STANDBY (0) or                          RDMX_PATH_POLICY_ACTIVE (1)"
                    ),
                ));
            }
        };
        let s = m.inner.connect_paths(&list, policy, pp)?;
        // SAFETY: checked non-NULL, writable per the contract.
        unsafe { session.write(s.0) };
        Ok(())
    })
}

/// Adds a path to `session` (opened by this messenger): `addr` ("HOST:PORT", copied);
/// `*index` receives its index. It connects and joins at once if the session is open.
///
/// # Safety
/// `m` NULL or live; `addr` NULL or NUL-terminated; `index` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_add_path(
    m: *mut rdmx_msgr,
    session: u64,
    addr: *const c_char,
    index: *mut u32,
) -> rdmx_status {
    boundary::call("rdmx_msgr_add_path", || {
        let index = out_ptr(index)?;
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        // SAFETY: forwarded contract.
        let addr = unsafe { addr_arg(addr) }?;
        let i = m.inner.add_path(SessionId(session), addr)?;
        // SAFETY: checked non-NULL, writable per the contract.
        unsafe { index.write(i as u32) };
        Ok(())
    })
}

/// Removes path `index` of `session` (opened by this messenger): its connection closes;
/// if it was the active path the traffic moves as on its failure. The last path cannot be
/// removed (RDMX_INVALID_ARGUMENT: close the session instead).
///
/// # Safety
/// `m` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_remove_path(
    m: *mut rdmx_msgr,
    session: u64,
    index: u32,
) -> rdmx_status {
    boundary::call("rdmx_msgr_remove_path", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        m.inner.remove_path(SessionId(session), index as usize)
    })
}

/// How many paths `session` has (removed ones included: indexes are not reused).
///
/// # Safety
/// `m` NULL or live; `n` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_path_count(
    m: *const rdmx_msgr,
    session: u64,
    n: *mut u32,
) -> rdmx_status {
    boundary::call("rdmx_msgr_path_count", || {
        let n = out_ptr(n)?;
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        let k = m.inner.paths(SessionId(session))?.len();
        // SAFETY: checked non-NULL, writable per the contract.
        unsafe { n.write(k as u32) };
        Ok(())
    })
}

/// Path `index` of `session`: state and counters. RDMX_INVALID_ARGUMENT for an index
/// beyond `rdmx_msgr_path_count`.
///
/// # Safety
/// `m` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_path_info(
    m: *const rdmx_msgr,
    session: u64,
    index: u32,
    out: *mut rdmx_msgr_path,
) -> rdmx_status {
    boundary::call("rdmx_msgr_path_info", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        let paths = m.inner.paths(SessionId(session))?;
        let Some(p) = paths.get(index as usize) else {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "rdmx_msgr_path_info: path {index}: the session has {}",
                    paths.len()
                ),
            ));
        };
        let v = rdmx_msgr_path {
            struct_size: 0,
            state: match p.state {
                PathState::Down => RDMX_PATH_DOWN,
                PathState::Connecting => RDMX_PATH_CONNECTING,
                PathState::Standby => RDMX_PATH_STANDBY,
                PathState::Active => RDMX_PATH_ACTIVE,
            },
            removed: u32::from(p.removed),
            msgs_sent: p.counters.msgs_sent,
            bytes_sent: p.counters.bytes_sent,
            faults: p.counters.faults,
            switches: p.counters.switches,
            since_last_fault_us: p
                .since_last_fault
                .map_or(u64::MAX, |d| d.as_micros() as u64),
        };
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, v) }?;
        Ok(())
    })
}

/// Takes the oldest path event of any of the messenger's sessions not taken yet: a path
/// went down, joined, or took the traffic. The messenger keeps the last 1,024 (events
/// happen while it makes progress: worker threads, or `rdmx_msgr_poll`). RDMX_OK with
/// `kind` RDMX_PATH_EVENT_NONE when there is none (take them in a loop until then). Each
/// event is also logged (target `rdmx::msgr`: warn for down, info for the others).
///
/// # Safety
/// `m` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msgr_next_path_event(
    m: *const rdmx_msgr,
    out: *mut rdmx_msgr_path_event,
) -> rdmx_status {
    boundary::call("rdmx_msgr_next_path_event", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        let ev = m.shared.path_events.lock().pop_front();
        let mut v = rdmx_msgr_path_event::default();
        if let Some(e) = ev {
            v.path = e.path as u32;
            v.session = e.session.0;
            v.age_us = e.at.elapsed().as_micros() as u64;
            v.kind = match &e.event {
                PathEvent::Down(why) => {
                    copy_reason(&why.to_string(), &mut v.reason);
                    RDMX_PATH_EVENT_DOWN
                }
                PathEvent::Up => RDMX_PATH_EVENT_UP,
                PathEvent::Active => RDMX_PATH_EVENT_ACTIVE,
            };
        }
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, v) }?;
        Ok(())
    })
}

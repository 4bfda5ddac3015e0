//! `rdmx_session_*`: sending on a session, closing it, its state and counters.

use super::super::boundary::{self, handle, write_str};
use super::super::mem::rdmx_mem;
use super::super::sized::{sized_out, write_sized};
use super::super::status::rdmx_status;
use super::msg::rdmx_msg;
use super::{rdmx_msgr, rdmx_session_counters};
use crate::error::{Error, ErrorKind, Result};
use crate::msgr::messenger::{Fault, OutMessage, Payload, Policy, SessionId, SessionState};
use std::ffi::{c_char, c_void};

/// A data segment from unregistered memory: copied once into pool chunks during
/// `rdmx_session_send` (counted in `copied_bytes`); the memory is the caller's again when
/// the call returns.
pub const RDMX_SEG_COPY: u32 = 0;
/// A chunk from `rdmx_msgr_chunk_get` (`addr` its start, `length` at most its size): no
/// copy, no registration; the messenger owns it once the send is accepted.
pub const RDMX_SEG_CHUNK: u32 = 1;
/// Memory inside a registration from `rdmx_msgr_mem_reg` (`mem`): no copy, no
/// registration per message. The memory must stay valid and unmodified until the send's
/// SEND_COMPLETE event.
pub const RDMX_SEG_MEM: u32 = 2;
/// Data segment `index` of the received message `msg`, sent on as it is (an echo or a
/// forward; no copy): it moves out of `msg` when the send is accepted (`addr`/`length` are
/// ignored).
pub const RDMX_SEG_RECEIVED: u32 = 3;

/// Connecting, or the session handshake is under way.
pub const RDMX_SESSION_CONNECTING: u32 = 0;
/// Open: messages flow.
pub const RDMX_SESSION_OPEN: u32 = 1;
/// Lossless, after a fault: reconnecting (sends queue within the bounds).
pub const RDMX_SESSION_RECONNECTING: u32 = 2;
/// Ended.
pub const RDMX_SESSION_CLOSED: u32 = 3;

/// `rdmx_session_inject_fault`: shut down the TCP side channel (both sides see EOF).
pub const RDMX_FAULT_SIDE_CHANNEL_CLOSE: u32 = 1;
/// `rdmx_session_inject_fault`: move this side's QP to the error state.
pub const RDMX_FAULT_QP_ERROR: u32 = 2;

/// One data segment of a message to send, with where its memory comes from.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct rdmx_msg_iov {
    /// RDMX_SEG_*.
    pub kind: u32,
    /// COPY, CHUNK, MEM: the bytes.
    pub addr: *const c_void,
    pub length: usize,
    /// MEM: the registration covering `[addr, addr + length)`.
    pub mem: *const rdmx_mem,
    /// RECEIVED: the message holding the segment, and its index.
    pub msg: *mut rdmx_msg,
    pub index: usize,
}

/// A session's state.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdmx_session_info {
    /// Set by the caller to `sizeof` this struct before the call; rdmx fills at most that
    /// many bytes and writes back how many it filled (see "Structs that grow" at the top of
    /// this header). The order of the fields is frozen: new fields are only added at the end.
    pub struct_size: usize,
    /// RDMX_SESSION_*.
    pub state: u32,
    /// RDMX_POLICY_LOSSLESS or RDMX_POLICY_LOSSY.
    pub policy: u32,
    /// 1 if this side accepted the session.
    pub incoming: u32,
    /// Credits to send now / receives posted for the peer.
    pub credits: u32,
    pub recv_window: u32,
    /// Messages waiting (for credits or a connection) / sent and not yet acknowledged.
    pub queued: u64,
    pub unacked: u64,
    /// This side's session identity and the peer's (0 until the handshake).
    pub local_id: u64,
    pub peer_id: u64,
}

fn bad(msg: String) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

/// Where a payload came from, to give it back when the message is refused untouched.
enum Origin {
    Plain,
    Chunk(usize),
    Received(*mut rdmx_msg, usize),
}

/// Sends a message on `session`: `type`, a front part of `front_len` bytes (copied; at most
/// 448 bytes go in the SEND's header slot, larger fronts up to 2048 bytes travel in a
/// descriptor chunk) and `n` data segments `iov` (at most 64, each up to 16 MiB; one segment of up to
/// 4 KiB goes eagerly in the SEND, anything larger or more is RDMA READ by the receiver
/// into its pool chunks). `*send_id` (if not NULL) receives the id its SEND_COMPLETE
/// event will carry. Payloads are prepared in this call (copies made, registrations looked
/// up); the message goes out on the next progress pass (at once with worker threads).
///
/// Refusals: RDMX_FULL when the session holds `msgr_send_queue_msgs` messages or
/// `msgr_send_queue_bytes` data bytes (queued + unacknowledged): retry after a SEND_READY
/// event or send completions; RDMX_CLOSED when the session ended; RDMX_INVALID_ARGUMENT for
/// a bad segment or a message beyond the limits. After a refusal by these checks nothing
/// was consumed: chunks and received segments named stay the caller's. If preparing a
/// payload failed (a copy found the pool exhausted: RDMX_FULL, a registration was refused),
/// the last error says "consumed": the chunks and received segments named were released.
///
/// # Safety
/// `m` NULL or live; `front` valid for `front_len` bytes (NULL if 0); `iov` valid for `n`
/// elements (NULL if 0), each naming memory as its kind requires; `send_id` NULL or
/// writable.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn rdmx_session_send(
    m: *mut rdmx_msgr,
    session: u64,
    msg_type: u16,
    front: *const c_void,
    front_len: usize,
    iov: *const rdmx_msg_iov,
    n: usize,
    send_id: *mut u64,
) -> rdmx_status {
    boundary::call("rdmx_session_send", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        if front_len > 0 && front.is_null() {
            return Err(bad("front is NULL with front_len > 0".into()));
        }
        if n > 0 && iov.is_null() {
            return Err(bad("iov is NULL with n > 0".into()));
        }
        if front_len > crate::msgr::messenger::wire::FRONT_MAX {
            return Err(bad(format!(
                "front of {front_len} bytes: at most {}",
                crate::msgr::messenger::wire::FRONT_MAX
            )));
        }
        let front = if front_len == 0 {
            Vec::new()
        } else {
            // SAFETY: non-NULL and valid for `front_len` bytes per the contract.
            unsafe { std::slice::from_raw_parts(front.cast::<u8>(), front_len) }.to_vec()
        };
        let iov: &[rdmx_msg_iov] = if n == 0 {
            &[]
        } else {
            // SAFETY: non-NULL and valid for `n` elements per the contract.
            unsafe { std::slice::from_raw_parts(iov, n) }
        };
        let mut msg = OutMessage::new(msg_type, front);
        let mut origins = Vec::with_capacity(n);
        // Validate every segment before taking anything.
        for (i, v) in iov.iter().enumerate() {
            match v.kind {
                RDMX_SEG_COPY | RDMX_SEG_CHUNK | RDMX_SEG_MEM => {
                    if v.length > 0 && v.addr.is_null() {
                        return Err(bad(format!("iov[{i}]: addr is NULL with length > 0")));
                    }
                }
                RDMX_SEG_RECEIVED => {
                    // SAFETY: forwarded contract (NULL or a live message).
                    let r = unsafe { v.msg.as_ref() }
                        .ok_or_else(|| bad(format!("iov[{i}]: msg is NULL")))?;
                    if !r.has_seg(v.index) {
                        return Err(bad(format!(
                            "iov[{i}]: the message has no data segment {} (it has {}, or it was sent on or released)",
                            v.index,
                            r.seg_count()
                        )));
                    }
                    if iov[..i].iter().any(|w| {
                        w.kind == RDMX_SEG_RECEIVED && w.msg == v.msg && w.index == v.index
                    }) {
                        return Err(bad(format!("iov[{i}]: the same received segment twice")));
                    }
                }
                k => {
                    return Err(bad(format!(
                        "iov[{i}]: kind {k}: expected RDMX_SEG_COPY, _CHUNK, _MEM or _RECEIVED"
                    )));
                }
            }
            if v.kind == RDMX_SEG_MEM {
                // SAFETY: forwarded contract (NULL or a live rdmx_mem).
                let mem = unsafe { v.mem.as_ref() }
                    .ok_or_else(|| bad(format!("iov[{i}]: mem is NULL")))?;
                if !m.shared.mems.lock().1.contains_key(&mem.id) {
                    return Err(bad(format!(
                        "iov[{i}]: mem id {} is not a live rdmx_msgr_mem_reg registration of this messenger",
                        mem.id
                    )));
                }
                let a = v.addr as u64;
                if a < mem.addr || a.saturating_add(v.length as u64) > mem.addr + mem.length {
                    return Err(bad(format!(
                        "iov[{i}]: [{a:#x}, +{}) is not inside the registration [{:#x}, +{})",
                        v.length, mem.addr, mem.length
                    )));
                }
            }
            if v.kind == RDMX_SEG_CHUNK {
                let g = m.shared.chunks.lock();
                let c = g.get(&(v.addr as usize)).ok_or_else(|| {
                    bad(format!(
                        "iov[{i}]: {:p} is not a chunk lent by rdmx_msgr_chunk_get (sent already?)",
                        v.addr
                    ))
                })?;
                if v.length > c.capacity() {
                    return Err(bad(format!(
                        "iov[{i}]: length {} beyond the chunk's {} bytes",
                        v.length,
                        c.capacity()
                    )));
                }
                if iov[..i]
                    .iter()
                    .any(|w| w.kind == RDMX_SEG_CHUNK && w.addr == v.addr)
                {
                    return Err(bad(format!("iov[{i}]: the same chunk twice")));
                }
            }
        }
        // Take what the segments name (all checked present above).
        for v in iov {
            let p = match v.kind {
                RDMX_SEG_COPY => {
                    origins.push(Origin::Plain);
                    // SAFETY: the caller promises `[addr, addr + length)` readable for this
                    // call; prepare copies it inside `send` below.
                    unsafe { Payload::copy_from(v.addr.cast(), v.length) }
                }
                RDMX_SEG_MEM => {
                    origins.push(Origin::Plain);
                    // SAFETY: the caller promises (RDMX_SEG_MEM) the memory stays valid and
                    // unmodified until the send completes; it lies in a live registration.
                    unsafe { Payload::registered(v.addr.cast(), v.length) }
                }
                RDMX_SEG_CHUNK => {
                    let Some(mut c) = m.shared.chunks.lock().remove(&(v.addr as usize)) else {
                        // Raced with a chunk_put/send from another thread: give back what
                        // was taken so far.
                        restore(m, msg, &origins);
                        return Err(bad(format!("{:p}: chunk taken meanwhile", v.addr)));
                    };
                    c.set_len(v.length);
                    origins.push(Origin::Chunk(v.addr as usize));
                    Payload::Chunk(c)
                }
                _ => {
                    // SAFETY: checked non-NULL above; live per the contract.
                    let r = unsafe { &mut *v.msg };
                    let Some(seg) = r.take_seg(v.index) else {
                        restore(m, msg, &origins);
                        return Err(bad(format!("segment {} taken meanwhile", v.index)));
                    };
                    origins.push(Origin::Received(v.msg, v.index));
                    Payload::Received(seg)
                }
            };
            msg.data.push(p);
        }
        match m.inner.send(SessionId(session), msg) {
            Ok(id) => {
                if !send_id.is_null() {
                    // SAFETY: non-NULL and writable per the contract.
                    unsafe { send_id.write(id) };
                }
                Ok(())
            }
            Err(refused) => {
                if refused.msg.data.len() == origins.len() {
                    restore(m, *refused.msg, &origins);
                    Err(refused.error)
                } else {
                    Err(Error::new(
                        refused.error.kind(),
                        format!(
                            "{} (consumed: the chunks and received segments it named were released)",
                            refused.error
                        ),
                    ))
                }
            }
        }
    })
}

/// Gives the chunks and received segments of a refused message back to where they came
/// from.
fn restore(m: &rdmx_msgr, msg: OutMessage, origins: &[Origin]) {
    for (p, o) in msg.data.into_iter().zip(origins) {
        match (p, o) {
            (Payload::Chunk(c), Origin::Chunk(addr)) => {
                m.shared.chunks.lock().insert(*addr, c);
            }
            (Payload::Received(seg), Origin::Received(msg, i)) => {
                // SAFETY: the message was live at the send call's start (its contract) and
                // the call is still running.
                unsafe { &mut **msg }.put_seg(*i, seg);
            }
            _ => {}
        }
    }
}

/// Closes a session now: its connection is closed; queued and unacknowledged sends
/// complete with RDMX_CLOSED (SEND_COMPLETE events); no RESET. The peer sees a fault
/// (lossy: it resets; lossless: it waits for a reconnect and resets after the timeout).
/// An unknown or ended session: RDMX_CLOSED.
///
/// # Safety
/// `m` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_session_close(m: *mut rdmx_msgr, session: u64) -> rdmx_status {
    boundary::call("rdmx_session_close", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        m.inner.close_session(SessionId(session))
    })
}

/// Pauses (`paused` nonzero) or resumes (0) the peer's data messages on `session`:
/// receive-side flow control for an application that cannot keep up, instead of holding
/// messages without bound or closing the session. While paused this side keeps one
/// receive posted, so acknowledgements and keepalives still flow (the session does not
/// time out); the peer's data stops once the credits it already holds (at most
/// `msgr_recv_window` messages) are spent, and its sends wait in its own queue (its
/// `rdmx_session_send` answers RDMX_FULL). Messages already received are still delivered.
/// Idempotent. An unknown or ended session: RDMX_CLOSED.
///
/// # Safety
/// `m` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_session_pause_receive(
    m: *mut rdmx_msgr,
    session: u64,
    paused: u32,
) -> rdmx_status {
    boundary::call("rdmx_session_pause_receive", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        m.inner.pause_receive(SessionId(session), paused != 0)
    })
}

/// A session's state, queue depths, credits and counters. RDMX_INVALID_ARGUMENT for an
/// unknown session (ended sessions are forgotten after their last event).
///
/// # Safety
/// `m` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_session_get_info(
    m: *const rdmx_msgr,
    session: u64,
    out: *mut rdmx_session_info,
) -> rdmx_status {
    boundary::call("rdmx_session_get_info", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        let i = m.inner.session_info(SessionId(session))?;
        let v = rdmx_session_info {
            struct_size: 0,
            state: match i.state {
                SessionState::Connecting => RDMX_SESSION_CONNECTING,
                SessionState::Open => RDMX_SESSION_OPEN,
                SessionState::Reconnecting => RDMX_SESSION_RECONNECTING,
                SessionState::Closed => RDMX_SESSION_CLOSED,
            },
            policy: match i.policy {
                Policy::Lossless => super::RDMX_POLICY_LOSSLESS,
                Policy::Lossy => super::RDMX_POLICY_LOSSY,
            },
            incoming: u32::from(i.incoming),
            credits: i.credits,
            recv_window: i.recv_window,
            queued: i.queued as u64,
            unacked: i.unacked as u64,
            local_id: i.local_id,
            peer_id: i.peer_id,
        };
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, v) }?;
        Ok(())
    })
}

/// A session's counters (messages, bytes, replays, reconnects, credit stalls, copies,
/// RNR NAKs, ...); as `rdmx_session_get_info`'s `counters`.
///
/// # Safety
/// `m` NULL or live; `out` NULL, or its `struct_size` set and writable for that many bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_session_get_counters(
    m: *const rdmx_msgr,
    session: u64,
    out: *mut rdmx_session_counters,
) -> rdmx_status {
    boundary::call("rdmx_session_get_counters", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        let i = m.inner.session_info(SessionId(session))?;
        // SAFETY: `out` is NULL or writable for its `struct_size` bytes per the contract.
        unsafe { write_sized(out, (&i.counters).into()) }?;
        Ok(())
    })
}

/// The session peer's "IP:PORT" into `buf`, snprintf-style (`*out_len` = the length
/// without the NUL; NULL `buf` with `len` 0 asks the size; too small: RDMX_BUFFER_TOO_SMALL).
/// "" while an accepted session's peer is not known.
///
/// # Safety
/// `m` NULL or live; `buf` NULL or valid for `len` bytes; `out_len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_session_peer(
    m: *const rdmx_msgr,
    session: u64,
    buf: *mut c_char,
    len: usize,
    out_len: *mut usize,
) -> rdmx_status {
    boundary::call("rdmx_session_peer", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        let i = m.inner.session_info(SessionId(session))?;
        let s = i.peer.map(|p| p.to_string()).unwrap_or_default();
        // SAFETY: forwarded contract.
        unsafe { write_str(&s, buf, len, out_len) }
    })
}

/// Injects a transport fault (RDMX_FAULT_*) on the session's current connection (tests,
/// as Ceph's `ms_inject_socket_failures`). RDMX_CLOSED when it has none right now.
///
/// # Safety
/// `m` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_session_inject_fault(
    m: *mut rdmx_msgr,
    session: u64,
    fault: u32,
) -> rdmx_status {
    boundary::call("rdmx_session_inject_fault", || -> Result<()> {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(m, "msgr") }?;
        let f = match fault {
            RDMX_FAULT_SIDE_CHANNEL_CLOSE => Fault::SideChannelClose,
            RDMX_FAULT_QP_ERROR => Fault::QpError,
            f => {
                return Err(bad(format!(
                    "fault {f}: expected RDMX_FAULT_SIDE_CHANNEL_CLOSE (1) or RDMX_FAULT_QP_ERROR (2)"
                )));
            }
        };
        m.inner.inject_fault(SessionId(session), f)
    })
}

sized_out!(rdmx_session_info);

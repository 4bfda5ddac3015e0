//! `rdmx_msg_*`: a received message. Its data segments lie in the messenger's pool chunks
//! (page-aligned, 4 KiB each) and are handed to the application without a copy; freeing the
//! message (or releasing a segment) returns them to the pool.

use super::super::boundary::{self, handle, handle_mut};
use super::super::status::rdmx_status;
use crate::error::{Error, ErrorKind};
use crate::msgr::messenger::{InMessage, RxSeg};
use std::ffi::c_void;

/// A received message. Opaque; the application owns it from the MESSAGE event on and frees
/// it with `rdmx_msg_free` (from any thread, also after `rdmx_msgr_free`). Not
/// thread-safe: one thread at a time.
#[allow(non_camel_case_types)]
pub struct rdmx_msg {
    msg_type: u16,
    seq: u64,
    front: Vec<u8>,
    /// None once released or sent on.
    data: Vec<Option<RxSeg>>,
}

impl From<InMessage> for rdmx_msg {
    fn from(m: InMessage) -> Self {
        rdmx_msg {
            msg_type: m.msg_type,
            seq: m.seq,
            front: m.front,
            data: m.data.into_iter().map(Some).collect(),
        }
    }
}

impl rdmx_msg {
    pub(super) fn has_seg(&self, i: usize) -> bool {
        self.data.get(i).is_some_and(Option::is_some)
    }

    pub(super) fn seg_count(&self) -> usize {
        self.data.len()
    }

    pub(super) fn take_seg(&mut self, i: usize) -> Option<RxSeg> {
        self.data.get_mut(i).and_then(Option::take)
    }

    pub(super) fn put_seg(&mut self, i: usize, seg: RxSeg) {
        if let Some(slot) = self.data.get_mut(i) {
            *slot = Some(seg);
        }
    }
}

/// A piece of received data: `len` bytes at `base`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct rdmx_iov {
    pub base: *mut c_void,
    pub len: usize,
}

/// The message's type (as sent); 0 for NULL.
///
/// # Safety
/// `msg` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msg_type(msg: *const rdmx_msg) -> u16 {
    boundary::call_value("rdmx_msg_type", 0, || {
        // SAFETY: forwarded contract.
        unsafe { msg.as_ref() }.map_or(0, |m| m.msg_type)
    })
}

/// The message's sequence number in its session (1, 2, ... in delivery order); 0 for NULL.
///
/// # Safety
/// `msg` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msg_seq(msg: *const rdmx_msg) -> u64 {
    boundary::call_value("rdmx_msg_seq", 0, || {
        // SAFETY: forwarded contract.
        unsafe { msg.as_ref() }.map_or(0, |m| m.seq)
    })
}

/// The front part: its length in `*len` (if not NULL) and a pointer to its bytes (owned by
/// the message, valid until `rdmx_msg_free`; NULL for an empty front or a NULL message).
///
/// # Safety
/// `msg` NULL or live; `len` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msg_front(msg: *const rdmx_msg, len: *mut usize) -> *const c_void {
    boundary::call_value("rdmx_msg_front", std::ptr::null(), || {
        // SAFETY: forwarded contract.
        let m = unsafe { msg.as_ref() };
        let n = m.map_or(0, |m| m.front.len());
        if !len.is_null() {
            // SAFETY: non-NULL and writable per the contract.
            unsafe { len.write(n) };
        }
        match m {
            Some(m) if n > 0 => m.front.as_ptr().cast(),
            _ => std::ptr::null(),
        }
    })
}

/// How many data segments the message came with (released or sent-on ones included); 0 for
/// NULL.
///
/// # Safety
/// `msg` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msg_seg_count(msg: *const rdmx_msg) -> usize {
    boundary::call_value("rdmx_msg_seg_count", 0, || {
        // SAFETY: forwarded contract.
        unsafe { msg.as_ref() }.map_or(0, |m| m.data.len())
    })
}

/// Data segment `i`'s length in bytes; 0 for a NULL message, an index out of range or a
/// segment released or sent on.
///
/// # Safety
/// `msg` NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msg_seg_len(msg: *const rdmx_msg, i: usize) -> usize {
    boundary::call_value("rdmx_msg_seg_len", 0, || {
        // SAFETY: forwarded contract.
        unsafe { msg.as_ref() }
            .and_then(|m| m.data.get(i))
            .and_then(Option::as_ref)
            .map_or(0, RxSeg::len)
    })
}

fn no_seg(i: usize, count: usize) -> Error {
    Error::new(
        ErrorKind::InvalidArgument,
        format!(
            "segment {i}: the message has {count} data segments (or it was released or sent on)"
        ),
    )
}

/// Where data segment `i` lies, without a copy: one `rdmx_iov` per pool chunk, in order,
/// each page-aligned and 4 KiB except the last (a segment of up to 4 KiB is one piece).
/// `*n` (if not NULL) gets the number of pieces in every case; with `max` below it:
/// RDMX_BUFFER_TOO_SMALL (NULL `out` with `max` 0 asks the count). The memory is the
/// application's to read (and write) until the segment is released, sent on, or the message
/// freed.
///
/// # Safety
/// `msg` NULL or live; `out` valid for `max` elements (NULL if 0); `n` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msg_seg_iov(
    msg: *const rdmx_msg,
    i: usize,
    out: *mut rdmx_iov,
    max: usize,
    n: *mut usize,
) -> rdmx_status {
    boundary::call("rdmx_msg_seg_iov", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle(msg, "msg") }?;
        let seg = m
            .data
            .get(i)
            .and_then(Option::as_ref)
            .ok_or_else(|| no_seg(i, m.data.len()))?;
        let pieces: Vec<&[u8]> = seg.chunks().filter(|c| !c.is_empty()).collect();
        if !n.is_null() {
            // SAFETY: non-NULL and writable per the contract.
            unsafe { n.write(pieces.len()) };
        }
        if out.is_null() && max == 0 {
            return Ok(());
        }
        if out.is_null() {
            return Err(Error::fixed(
                ErrorKind::InvalidArgument,
                "out is NULL with max > 0",
            ));
        }
        if max < pieces.len() {
            return Err(Error::new(
                ErrorKind::BufferTooSmall,
                format!("segment {i} is {} pieces; max is {max}", pieces.len()),
            ));
        }
        for (k, p) in pieces.iter().enumerate() {
            // SAFETY: `out` is valid for `max` >= pieces elements per the contract.
            unsafe {
                out.add(k).write(rdmx_iov {
                    base: p.as_ptr().cast_mut().cast(),
                    len: p.len(),
                })
            };
        }
        Ok(())
    })
}

/// Returns data segment `i`'s chunks to the pool now (the rest of the message stays). A
/// segment already released or sent on, or an index out of range: RDMX_INVALID_ARGUMENT.
///
/// # Safety
/// `msg` NULL or live, not used by another thread during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msg_seg_release(msg: *mut rdmx_msg, i: usize) -> rdmx_status {
    boundary::call("rdmx_msg_seg_release", || {
        // SAFETY: forwarded contract.
        let m = unsafe { handle_mut(msg, "msg") }?;
        let count = m.data.len();
        m.take_seg(i).ok_or_else(|| no_seg(i, count))?.release();
        Ok(())
    })
}

/// Frees a received message and returns its data chunks to the pool. NULL is a no-op.
///
/// # Safety
/// `msg` NULL or from a MESSAGE event, not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdmx_msg_free(msg: *mut rdmx_msg) {
    boundary::call_value("rdmx_msg_free", (), || {
        if !msg.is_null() {
            // SAFETY: ownership returns here exactly once, per the contract.
            drop(unsafe { Box::from_raw(msg) });
        }
    })
}

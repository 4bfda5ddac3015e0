//! Preallocated receive space for [`super::UdpPort::recv_batch`]: the slots, addresses and
//! control-message buffers one `recvmmsg` fills, and the per-datagram index of a receive
//! (GRO buffers split into datagrams).

use super::*;
#[derive(Debug, Clone, Copy)]
pub(super) struct RxMeta {
    pub(super) src: Option<SocketAddr>,
    pub(super) dst: SocketAddr,
    /// Offset of the datagram in `RxBatch::buf`.
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) truncated: bool,
}

/// Control-message buffer of one slot, aligned for `cmsghdr`.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub(super) struct CtrlBuf(pub(super) [u8; RX_CTRL_LEN]);

/// Preallocated receive space for [`UdpPort::recv_batch`]: `slots` buffers of `slot_len`
/// bytes, with their address and control-message space. Reused across calls; no allocation
/// after [`RxBatch::new`] except that the per-datagram index grows to the most datagrams
/// one receive split out of GRO buffers (at most 64 per slot).
pub struct RxBatch {
    pub(super) slots: usize,
    pub(super) slot_len: usize,
    /// Datagrams (entries of `meta`) of the last receive.
    pub(super) filled: usize,
    /// Slots (messages) filled by the last receive.
    pub(super) messages: usize,
    pub(super) buf: Vec<u8>,
    pub(super) names: Vec<libc::sockaddr_storage>,
    pub(super) ctrl: Vec<CtrlBuf>,
    pub(super) iovs: Vec<libc::iovec>,
    pub(super) hdrs: Vec<libc::mmsghdr>,
    pub(super) meta: Vec<RxMeta>,
    /// The headers and iovecs point at this batch's buffers (set once: the kernel never
    /// changes the pointers, and the vectors are never resized, so they stay valid).
    pointed: bool,
    /// Headers whose length and flag fields the last `recvmmsg` may have changed.
    pub(super) dirty: usize,
}

// SAFETY: the raw pointers in `iovs` and `hdrs` only ever point into this batch's own heap
// buffers (set by `point` before the first `recvmmsg`; the vectors are never resized, so
// moving the batch does not move them), and are never dereferenced by
// Rust code; everything else is owned plain data. Moving the batch to another thread or
// sharing `&RxBatch` (which only reads `buf` and `meta`) is therefore sound.
unsafe impl Send for RxBatch {}
// SAFETY: see the `Send` impl: `&RxBatch` gives no access to the raw pointers.
unsafe impl Sync for RxBatch {}

impl RxBatch {
    /// Space for `slots` datagrams of up to `slot_len` bytes each. `slots` is capped at
    /// [`MAX_RX_SLOTS`] and `slot_len` at [`MAX_RX_SLOT_LEN`]; a datagram longer than
    /// `slot_len` is dropped (truncated).
    pub fn new(slots: usize, slot_len: usize) -> RxBatch {
        let slots = slots.min(MAX_RX_SLOTS);
        let slot_len = slot_len.min(MAX_RX_SLOT_LEN);
        RxBatch {
            slots,
            slot_len,
            filled: 0,
            messages: 0,
            buf: vec![0; slots * slot_len],
            // SAFETY: sockaddr_storage is plain data; all-zero bytes are a valid value.
            names: vec![unsafe { mem::zeroed() }; slots],
            ctrl: vec![CtrlBuf([0; RX_CTRL_LEN]); slots],
            iovs: vec![
                libc::iovec {
                    iov_base: ptr::null_mut(),
                    iov_len: 0,
                };
                slots
            ],
            // SAFETY: mmsghdr is plain data; all-zero bytes (null pointers) are valid.
            hdrs: vec![unsafe { mem::zeroed() }; slots],
            meta: Vec::with_capacity(slots),
            pointed: false,
            dirty: 0,
        }
    }

    /// Space for `slots` messages of [`MAX_RX_SLOT_LEN`] bytes: what a port with GRO
    /// ([`UdpPort::enable_gro`]) needs. The memory is allocated zeroed and only the pages
    /// the kernel writes are touched.
    pub fn for_gro(slots: usize) -> RxBatch {
        RxBatch::new(slots, MAX_RX_SLOT_LEN)
    }

    /// How many messages (slots) one receive can return: datagrams, unless GRO coalesced
    /// some.
    pub fn capacity(&self) -> usize {
        self.slots
    }

    /// Size of each slot (the longest datagram that is kept).
    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Datagrams received by the last [`UdpPort::recv_batch`] (GRO buffers counted as the
    /// datagrams they hold).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.filled
    }

    /// Slots (messages) filled by the last [`UdpPort::recv_batch`]: fewer than
    /// [`RxBatch::capacity`] means the socket was drained.
    pub fn messages(&self) -> usize {
        self.messages
    }

    /// True when the last receive returned nothing.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    /// Datagram `i` of the last receive; `None` past [`RxBatch::len`], or when that datagram
    /// was truncated or its source address was not IPv4/IPv6 (both to be dropped).
    pub fn get(&self, i: usize) -> Option<RxDatagram<'_>> {
        if i >= self.filled {
            return None;
        }
        let m = self.meta.get(i)?;
        if m.truncated {
            return None;
        }
        Some(RxDatagram {
            src: m.src?,
            dst: m.dst,
            data: self.buf.get(m.start..m.start + m.len)?,
        })
    }

    /// The usable datagrams of the last receive (those [`RxBatch::get`] returns).
    #[cfg(any(test, feature = "udp-baseline"))]
    pub fn iter(&self) -> impl Iterator<Item = RxDatagram<'_>> + '_ {
        (0..self.filled).filter_map(|i| self.get(i))
    }

    /// Makes every header ready for `recvmmsg`: on first use points them at their slot's
    /// buffers; later only resets the fields the kernel wrote in the headers it filled last
    /// time (`dirty`), so an empty poll costs no writes.
    pub(super) fn prepare(&mut self) {
        if !self.pointed {
            self.point();
            self.pointed = true;
            self.dirty = self.slots;
        }
        for h in &mut self.hdrs[..self.dirty] {
            h.msg_len = 0;
            h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = RX_CTRL_LEN as _;
            h.msg_hdr.msg_flags = 0;
        }
        self.dirty = 0;
    }

    /// Points every header at its slot's name, control and data buffers.
    fn point(&mut self) {
        // `wrapping_add` keeps this free of `unsafe`; every offset is in bounds (i < slots,
        // each vector holds `slots` elements, buf.len() == slots * slot_len). One base
        // pointer per vector, so no later borrow invalidates the pointers handed out.
        let base = self.buf.as_mut_ptr();
        for (i, iov) in self.iovs.iter_mut().enumerate() {
            *iov = libc::iovec {
                iov_base: base.wrapping_add(i * self.slot_len).cast(),
                iov_len: self.slot_len,
            };
        }
        let names = self.names.as_mut_ptr();
        let ctrl = self.ctrl.as_mut_ptr();
        let iovs = self.iovs.as_mut_ptr();
        for (i, h) in self.hdrs.iter_mut().enumerate() {
            h.msg_hdr.msg_name = names.wrapping_add(i).cast();
            h.msg_hdr.msg_iov = iovs.wrapping_add(i);
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = ctrl.wrapping_add(i).cast();
        }
    }
}

impl fmt::Debug for RxBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RxBatch")
            .field("slots", &self.slots)
            .field("slot_len", &self.slot_len)
            .field("filled", &self.filled)
            .finish_non_exhaustive()
    }
}

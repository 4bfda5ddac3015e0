//! Building outgoing packets: headers into the caller's buffer, then the payload either
//! copied in after them or, for zero-copy transmit, borrowed straight from registered memory
//! (the way a NIC DMAs from an MR, or `sendmsg` gathers an iovec).

use super::memory::{self, Key, MemError, Memory, Sge};
use super::packet::{self, Hdr};
use super::qp::Qp;
use super::verbs::access;
use crate::wire::ICRC_LEN;

/// One outgoing packet in up to three parts: `buf[..head_len]` (the headers, then any
/// payload bytes copied: those before the lent piece of a payload spanning SGEs), then
/// `payload`, then `tail_len` zero bytes (pad and the ICRC field). When the payload was
/// copied whole into the buffer, `payload` is empty, `tail_len` is 0 and `head_len` is the
/// whole packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxParts<'m> {
    pub head_len: usize,
    pub payload: &'m [u8],
    pub tail_len: usize,
}

impl TxParts<'_> {
    /// Length of the whole packet (the UDP payload).
    pub fn len(&self) -> usize {
        self.head_len + self.payload.len() + self.tail_len
    }

    /// True when the packet is entirely in the caller's buffer.
    pub fn is_contiguous(&self) -> bool {
        self.payload.is_empty() && self.tail_len == 0
    }

    /// Always false: a packet has at least a BTH and the ICRC field.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// The shortest last piece of a payload spanning SGEs that is lent rather than copied
/// (one cache line: below it the extra iovec costs about what the copy does).
const MIN_LENT_PIECE: usize = 64;

/// How a packet's payload is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TxMode {
    /// Copied into the caller's buffer after the headers.
    Copy,
    /// Lent when it lies in one region that can lend it, else copied: the parts can be
    /// handed as they are to a receiver's `handle_packet_vectored`.
    Lend,
    /// As `Lend`, and a payload spanning SGEs copies the pieces before the last after the
    /// headers and lends the last: for a sender that gathers the parts (`sendmsg`).
    Gather,
}

/// Where a packet's payload comes from.
#[derive(Debug, Clone, Copy)]
pub(super) enum PayloadSrc<'s> {
    None,
    /// Bytes `off..` of a local SGE list (SEND/WRITE).
    Local {
        sges: &'s [Sge],
        off: u64,
    },
    /// Memory a READ response reads (checked for REMOTE_READ through a remote key; a
    /// local key is the region of a window a later SEND_WITH_INVALIDATE ended, read with
    /// the rights the READ was granted when it arrived).
    Region {
        key: Key,
        va: u64,
    },
}

/// Why a packet could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EmitError {
    /// The caller's buffer is too small or the header does not fit the opcode.
    Buffer,
    /// The payload's memory refused the access.
    Memory(MemError),
}

impl Qp {
    /// Writes `hdr` and `len` payload bytes from `src`: borrowed (as `mode` allows) when
    /// the bytes are contiguous in memory that can lend them, copied into `buf` otherwise.
    pub(super) fn emit_from<'m>(
        &self,
        hdr: &Hdr,
        len: usize,
        src: PayloadSrc<'_>,
        mem: &'m dyn Memory,
        buf: &mut [u8],
        mode: TxMode,
    ) -> Result<TxParts<'m>, EmitError> {
        let pad = crate::wire::pad_len(len);
        let hlen = packet::emit_header(hdr, pad as u8, buf).ok_or(EmitError::Buffer)?;
        if mode != TxMode::Copy && len > 0 {
            let lent = match src {
                PayloadSrc::None => None,
                PayloadSrc::Local { sges, off } => memory::contiguous(sges, off, len as u64)
                    .and_then(|(lkey, addr)| mem.slice(Key::Local(lkey), addr, len, 0)),
                PayloadSrc::Region { key, va } => mem.slice(key, va, len, read_right(key)),
            };
            if let Some(payload) = lent {
                return Ok(TxParts {
                    head_len: hlen,
                    payload,
                    tail_len: pad + ICRC_LEN,
                });
            }
            // Across SGEs: the pieces before the last are copied after the header, the last
            // (when it is worth an iovec) is lent.
            if mode == TxMode::Gather
                && let PayloadSrc::Local { sges, off } = src
                && let Some((split, lkey, addr)) = memory::last_piece(sges, off, len as u64)
                && len - split as usize >= MIN_LENT_PIECE
                && let Some(payload) = mem.slice(Key::Local(lkey), addr, len - split as usize, 0)
            {
                let end = hlen + split as usize;
                let dst = buf.get_mut(hlen..end).ok_or(EmitError::Buffer)?;
                memory::gather(mem, sges, off, dst).map_err(EmitError::Memory)?;
                return Ok(TxParts {
                    head_len: end,
                    payload,
                    tail_len: pad + ICRC_LEN,
                });
            }
        }
        let end = hlen + len;
        let total = end + pad + ICRC_LEN;
        let dst = buf.get_mut(hlen..end).ok_or(EmitError::Buffer)?;
        match src {
            PayloadSrc::None => {}
            PayloadSrc::Local { sges, off } => {
                memory::gather(mem, sges, off, dst).map_err(EmitError::Memory)?
            }
            PayloadSrc::Region { key, va } => mem
                .read(key, va, dst, read_right(key))
                .map_err(EmitError::Memory)?,
        }
        buf.get_mut(end..total).ok_or(EmitError::Buffer)?.fill(0);
        Ok(TxParts {
            head_len: total,
            payload: &[],
            tail_len: 0,
        })
    }
}

/// The right a READ response's read needs: REMOTE_READ through a remote key; none through
/// a local key (every region allows local reads; see `PayloadSrc::Region`).
fn read_right(key: Key) -> u32 {
    match key {
        Key::Remote(_) => access::REMOTE_READ,
        Key::Local(_) => 0,
    }
}

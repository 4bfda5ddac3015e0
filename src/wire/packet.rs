//! A whole RC packet as carried in a RoCEv2 UDP payload (docs/rc-transport.md §1.1, §1.5, §1.6):
//! BTH, the extension headers its opcode calls for, payload, 0–3 zero pad bytes, 4-byte ICRC.

use super::aeth::{Aeth, AethRepr};
use super::atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr};
use super::atomic_eth::{AtomicEth, AtomicEthRepr};
use super::bth::{self, Bth, BthRepr};
use super::error::{Result, WireError};
use super::icrc::ICRC_LEN;
use super::ieth::{Ieth, IethRepr};
use super::immdt::{ImmDt, ImmDtRepr};
use super::reth::{Reth, RethRepr};

/// Pad bytes after a payload of `payload_len` bytes: `(-len) mod 4` (rxe `(-payload) & 3`).
#[inline]
pub const fn pad_len(payload_len: usize) -> usize {
    payload_len.wrapping_neg() & 3
}

/// A decoded RC packet. Each extension header is `Some` exactly when the opcode carries it
/// (see [`super::Opcode`]); the payload borrows from the parsed buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketRepr<'a> {
    /// `bth.pad_count` is set by [`PacketRepr::parse`] and ignored by [`PacketRepr::emit`],
    /// which derives it from `payload.len()`.
    pub bth: BthRepr,
    pub reth: Option<RethRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub immdt: Option<ImmDtRepr>,
    pub ieth: Option<IethRepr>,
    /// Payload without pad.
    pub payload: &'a [u8],
}

impl<'a> PacketRepr<'a> {
    /// Parses a UDP payload (BTH through ICRC inclusive). Total: any input gives `Ok` or an
    /// error. The ICRC is *not* verified here, because it covers the IP and UDP headers this
    /// function does not see; use [`super::icrc`] (`compute_*` then `check`) first.
    ///
    /// Errors, in the order checked: `Truncated` (no room for BTH + ICRC, or for the
    /// opcode's headers), `BadOpcode`, `BadVersion` (TVer ≠ 0, as rxe), `Unsupported`
    /// (FLUSH, ATOMIC_WRITE: read the PSN with [`Bth`] to NAK), `BadSyndrome`, `BadPadding`
    /// (PadCnt larger than the bytes after the headers, or payload + pad not a multiple of 4),
    /// `BadLength` (bytes after the headers for an opcode without payload).
    ///
    /// Deviations from rxe, which is looser: rxe neither checks 4-byte alignment of
    /// payload + pad nor rejects payload bytes on ACK/READ REQUEST/atomics. Conforming senders
    /// never produce either, and rejecting them here keeps the RC engine from seeing them.
    /// Pad byte values are not checked (rxe does not either); they are zero on emit.
    pub fn parse(buffer: &'a [u8]) -> Result<PacketRepr<'a>> {
        if buffer.len() < bth::HEADER_LEN + ICRC_LEN {
            return Err(WireError::Truncated);
        }
        let bth = checked_bth(buffer)?;
        let op = bth.opcode;
        let header_len = op.header_len();
        let body_end = buffer.len() - ICRC_LEN;
        if body_end < header_len {
            return Err(WireError::Truncated);
        }
        let mut repr = Self::parse_ext_headers(bth, &buffer[..header_len])?;

        let body = buffer.get(header_len..body_end).unwrap_or(&[]);
        let pad = usize::from(bth.pad_count);
        if body.len() % 4 != 0 || pad > body.len() {
            return Err(WireError::BadPadding);
        }
        if !op.has_payload() && !body.is_empty() {
            return Err(WireError::BadLength);
        }
        repr.payload = body.get(..body.len() - pad).unwrap_or(&[]);
        Ok(repr)
    }

    /// Parses a packet that arrives in parts, as a zero-copy sender produced it: `head` is
    /// exactly BTH + the opcode's extension headers, `payload` the payload without pad (pad
    /// and ICRC are not seen; the caller checked the ICRC over all parts). The same checks
    /// as [`PacketRepr::parse`], plus: `head` must be exactly the opcode's header length and
    /// PadCnt must match the payload length (`BadPadding`).
    pub fn parse_parts(head: &'a [u8], payload: &'a [u8]) -> Result<PacketRepr<'a>> {
        let bth = checked_bth(head)?;
        let op = bth.opcode;
        if head.len() != op.header_len() {
            return Err(WireError::BadLength);
        }
        if usize::from(bth.pad_count) != pad_len(payload.len()) {
            return Err(WireError::BadPadding);
        }
        if !op.has_payload() && !payload.is_empty() {
            return Err(WireError::BadLength);
        }
        let mut repr = Self::parse_ext_headers(bth, head)?;
        repr.payload = payload;
        Ok(repr)
    }

    /// The extension headers after the BTH in `headers` (= BTH + ETHs of `bth.opcode`),
    /// payload left empty.
    fn parse_ext_headers(bth: BthRepr, headers: &[u8]) -> Result<PacketRepr<'a>> {
        let op = bth.opcode;
        let mut repr = PacketRepr {
            bth,
            reth: None,
            aeth: None,
            atomic_ack_eth: None,
            atomic_eth: None,
            immdt: None,
            ieth: None,
            payload: &[],
        };
        // Header order is RETH|AtomicETH|AETH, then AtomicAckETH|ImmDt|IETH (rxe_opcode.c
        // offsets); no opcode carries two from the same group.
        let mut at = bth::HEADER_LEN;
        if op.has_reth() {
            repr.reth = Some(RethRepr::parse(&Reth::new_checked(rest(headers, at))?)?);
            at += super::reth::HEADER_LEN;
        }
        if op.has_atomic_eth() {
            let h = AtomicEth::new_checked(rest(headers, at))?;
            repr.atomic_eth = Some(AtomicEthRepr::parse(&h)?);
            at += super::atomic_eth::HEADER_LEN;
        }
        if op.has_aeth() {
            repr.aeth = Some(AethRepr::parse(&Aeth::new_checked(rest(headers, at))?)?);
            at += super::aeth::HEADER_LEN;
        }
        if op.has_atomic_ack_eth() {
            let h = AtomicAckEth::new_checked(rest(headers, at))?;
            repr.atomic_ack_eth = Some(AtomicAckEthRepr::parse(&h)?);
            at += super::atomic_ack_eth::HEADER_LEN;
        }
        if op.has_immdt() {
            repr.immdt = Some(ImmDtRepr::parse(&ImmDt::new_checked(rest(headers, at))?)?);
            at += super::immdt::HEADER_LEN;
        }
        if op.has_ieth() {
            repr.ieth = Some(IethRepr::parse(&Ieth::new_checked(rest(headers, at))?)?);
            at += super::ieth::HEADER_LEN;
        }
        debug_assert_eq!(at, op.header_len());
        Ok(repr)
    }

    /// Whether the `Option` headers and the payload agree with the opcode.
    fn check_headers(&self) -> Result<()> {
        let op = self.bth.opcode;
        if !op.is_supported() {
            return Err(WireError::Unsupported(op));
        }
        let consistent = op.has_reth() == self.reth.is_some()
            && op.has_aeth() == self.aeth.is_some()
            && op.has_atomic_ack_eth() == self.atomic_ack_eth.is_some()
            && op.has_atomic_eth() == self.atomic_eth.is_some()
            && op.has_immdt() == self.immdt.is_some()
            && op.has_ieth() == self.ieth.is_some();
        if !consistent {
            return Err(WireError::HeaderMismatch);
        }
        if !op.has_payload() && !self.payload.is_empty() {
            return Err(WireError::BadLength);
        }
        Ok(())
    }

    /// Bytes of BTH + extension headers for this opcode (§1.6).
    pub const fn header_len(&self) -> usize {
        self.bth.opcode.header_len()
    }

    /// Pad bytes [`PacketRepr::emit`] appends to the payload.
    pub const fn pad_len(&self) -> usize {
        pad_len(self.payload.len())
    }

    /// Bytes [`PacketRepr::emit`] writes: headers + payload + pad + ICRC (the UDP payload).
    pub const fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len() + self.pad_len() + ICRC_LEN
    }

    /// Writes the packet into the front of `buffer` and returns its length
    /// ([`PacketRepr::buffer_len`]). PadCnt is derived from the payload, pad bytes are zero,
    /// and the ICRC field is left zero: fill it with [`super::icrc::store`] once the IP/UDP
    /// headers are known. Errors: `Unsupported`, `HeaderMismatch` (an `Option` header
    /// present/absent against the opcode), `BadLength` (payload on an opcode without one,
    /// or larger than a UDP datagram can carry), `Truncated` (buffer too small). On error
    /// nothing is written.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<usize> {
        self.check_headers()?;
        let len = self.buffer_len();
        // A UDP datagram holds at most 65535 - 8 payload bytes; larger cannot be sent.
        if len > usize::from(u16::MAX) - 8 {
            return Err(WireError::BadLength);
        }
        let out = buffer.get_mut(..len).ok_or(WireError::Truncated)?;

        let mut bth = self.bth;
        // pad_len() < 4, so the cast is lossless.
        bth.pad_count = self.pad_len() as u8;
        bth.emit(&mut Bth::new_unchecked(&mut out[..bth::HEADER_LEN]));
        let mut at = bth::HEADER_LEN;
        if let Some(h) = &self.reth {
            h.emit(&mut Reth::new_unchecked(&mut out[at..at + h.buffer_len()]));
            at += h.buffer_len();
        }
        if let Some(h) = &self.atomic_eth {
            h.emit(&mut AtomicEth::new_unchecked(
                &mut out[at..at + h.buffer_len()],
            ));
            at += h.buffer_len();
        }
        if let Some(h) = &self.aeth {
            h.emit(&mut Aeth::new_unchecked(&mut out[at..at + h.buffer_len()]));
            at += h.buffer_len();
        }
        if let Some(h) = &self.atomic_ack_eth {
            h.emit(&mut AtomicAckEth::new_unchecked(
                &mut out[at..at + h.buffer_len()],
            ));
            at += h.buffer_len();
        }
        if let Some(h) = &self.immdt {
            h.emit(&mut ImmDt::new_unchecked(&mut out[at..at + h.buffer_len()]));
            at += h.buffer_len();
        }
        if let Some(h) = &self.ieth {
            h.emit(&mut Ieth::new_unchecked(&mut out[at..at + h.buffer_len()]));
            at += h.buffer_len();
        }
        let end = at + self.payload.len();
        out[at..end].copy_from_slice(self.payload);
        // Pad and ICRC placeholder.
        out[end..].fill(0);
        Ok(len)
    }
}

/// The BTH at the front of `buffer`, with the checks every parse makes: TVer 0 (as rxe)
/// and an opcode the layer supports.
fn checked_bth(buffer: &[u8]) -> Result<BthRepr> {
    let bth = BthRepr::parse(&Bth::new_checked(buffer)?)?;
    if bth.tver != 0 {
        return Err(WireError::BadVersion(bth.tver));
    }
    if !bth.opcode.is_supported() {
        return Err(WireError::Unsupported(bth.opcode));
    }
    Ok(bth)
}

/// The bytes from `at` on, or an empty slice (so the header's `new_checked` reports
/// `Truncated` instead of a slice index panicking).
#[inline]
fn rest(buffer: &[u8], at: usize) -> &[u8] {
    buffer.get(at..).unwrap_or(&[])
}

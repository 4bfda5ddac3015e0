//! Base Transport Header (docs/rc-transport.md §1.2): 12 bytes, first in every packet.

use super::error::{Result, WireError};
use super::opcode::Opcode;
use super::{MASK_24, read_u24, write_u24};

/// Size of the BTH.
pub const HEADER_LEN: usize = 12;

mod field {
    use core::ops::Range;

    pub const OPCODE: usize = 0;
    /// SE (bit 7) | M (bit 6) | PadCnt (bits 5..4) | TVer (bits 3..0).
    pub const FLAGS: usize = 1;
    pub const PKEY: Range<usize> = 2..4;
    /// FECN (bit 7) | BECN (bit 6) | Resv6a; as a whole "Resv8a", masked for the ICRC.
    pub const RESV8A: usize = 4;
    pub const DEST_QP: Range<usize> = 5..8;
    /// AckReq (bit 7) | Resv7.
    pub const ACK_REQ: usize = 8;
    pub const PSN: Range<usize> = 9..12;
}

/// Offset of the byte masked to 0xFF for the ICRC (§7.1 step 4).
pub(super) const RESV8A_OFFSET: usize = field::RESV8A;

const SE: u8 = 0x80;
const MIG_REQ: u8 = 0x40;
const PAD_SHIFT: u32 = 4;
const PAD_MASK: u8 = 0x30;
const TVER_MASK: u8 = 0x0F;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const RESV6A_MASK: u8 = 0x3F;
const ACK_REQ: u8 = 0x80;
const RESV7_MASK: u8 = 0x7F;

/// A read/write view of a BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is shorter than
    /// [`BTH_LEN`](super::BTH_LEN).
    pub const fn new_unchecked(buffer: T) -> Bth<T> {
        Bth { buffer }
    }

    /// Wraps a buffer after [`Bth::check_len`].
    pub fn new_checked(buffer: T) -> Result<Bth<T>> {
        let bth = Bth::new_unchecked(buffer);
        bth.check_len()?;
        Ok(bth)
    }

    /// `Err(Truncated)` if the buffer cannot hold a BTH.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Raw opcode byte (transport bits included); see [`Opcode::from_u8`].
    #[inline]
    pub fn opcode_raw(&self) -> u8 {
        self.buffer.as_ref()[field::OPCODE]
    }
    #[inline]
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & SE != 0
    }
    #[inline]
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & MIG_REQ != 0
    }
    #[inline]
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] & PAD_MASK) >> PAD_SHIFT
    }
    #[inline]
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & TVER_MASK
    }
    #[inline]
    pub fn pkey(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::PKEY];
        u16::from_be_bytes([b[0], b[1]])
    }
    #[inline]
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & FECN != 0
    }
    #[inline]
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::RESV8A] & BECN != 0
    }
    /// Reserved bits 5..0 of byte 4 (sent as 0, ignored on receive).
    #[inline]
    pub fn resv6a(&self) -> u8 {
        self.buffer.as_ref()[field::RESV8A] & RESV6A_MASK
    }
    #[inline]
    pub fn dest_qp(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::DEST_QP])
    }
    #[inline]
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & ACK_REQ != 0
    }
    /// Reserved bits 6..0 of byte 8 (sent as 0, ignored on receive).
    #[inline]
    pub fn resv7(&self) -> u8 {
        self.buffer.as_ref()[field::ACK_REQ] & RESV7_MASK
    }
    #[inline]
    pub fn psn(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::PSN])
    }
}

#[inline]
fn set_bit(byte: &mut u8, mask: u8, on: bool) {
    if on {
        *byte |= mask;
    } else {
        *byte &= !mask;
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    #[inline]
    pub fn set_opcode_raw(&mut self, value: u8) {
        self.buffer.as_mut()[field::OPCODE] = value;
    }
    #[inline]
    pub fn set_solicited(&mut self, on: bool) {
        set_bit(&mut self.buffer.as_mut()[field::FLAGS], SE, on);
    }
    #[inline]
    pub fn set_mig_req(&mut self, on: bool) {
        set_bit(&mut self.buffer.as_mut()[field::FLAGS], MIG_REQ, on);
    }
    /// Only the low 2 bits of `value` are stored.
    #[inline]
    pub fn set_pad_count(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !PAD_MASK) | ((value << PAD_SHIFT) & PAD_MASK);
    }
    /// Only the low 4 bits of `value` are stored.
    #[inline]
    pub fn set_tver(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !TVER_MASK) | (value & TVER_MASK);
    }
    #[inline]
    pub fn set_pkey(&mut self, value: u16) {
        self.buffer.as_mut()[field::PKEY].copy_from_slice(&value.to_be_bytes());
    }
    #[inline]
    pub fn set_fecn(&mut self, on: bool) {
        set_bit(&mut self.buffer.as_mut()[field::RESV8A], FECN, on);
    }
    #[inline]
    pub fn set_becn(&mut self, on: bool) {
        set_bit(&mut self.buffer.as_mut()[field::RESV8A], BECN, on);
    }
    #[inline]
    pub fn set_resv6a(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[field::RESV8A];
        *b = (*b & !RESV6A_MASK) | (value & RESV6A_MASK);
    }
    /// Only the low 24 bits of `value` are stored.
    #[inline]
    pub fn set_dest_qp(&mut self, value: u32) {
        write_u24(&mut self.buffer.as_mut()[field::DEST_QP], value);
    }
    #[inline]
    pub fn set_ack_req(&mut self, on: bool) {
        set_bit(&mut self.buffer.as_mut()[field::ACK_REQ], ACK_REQ, on);
    }
    #[inline]
    pub fn set_resv7(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[field::ACK_REQ];
        *b = (*b & !RESV7_MASK) | (value & RESV7_MASK);
    }
    /// Only the low 24 bits of `value` are stored.
    #[inline]
    pub fn set_psn(&mut self, value: u32) {
        write_u24(&mut self.buffer.as_mut()[field::PSN], value);
    }
}

/// A decoded BTH. Reserved bits (Resv6a, Resv7) are dropped on parse and sent as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    pub opcode: Opcode,
    /// SE: ask for a solicited event at the responder.
    pub solicited: bool,
    pub mig_req: bool,
    /// PadCnt (0–3). [`super::PacketRepr::emit`] derives it from the payload length.
    pub pad_count: u8,
    /// Transport version; 0 on every valid packet ([`super::PacketRepr::parse`] rejects others).
    pub tver: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    /// 24-bit destination QP number.
    pub dest_qp: u32,
    pub ack_req: bool,
    /// 24-bit packet sequence number.
    pub psn: u32,
}

impl BthRepr {
    /// Decodes a BTH; any byte string gives `Ok` or an error (short buffer: `Truncated`,
    /// non-RC or reserved opcode: `BadOpcode`). TVer is reported, not checked.
    pub fn parse<T: AsRef<[u8]>>(bth: &Bth<T>) -> Result<BthRepr> {
        bth.check_len()?;
        Ok(BthRepr {
            opcode: Opcode::from_u8(bth.opcode_raw())?,
            solicited: bth.solicited(),
            mig_req: bth.mig_req(),
            pad_count: bth.pad_count(),
            tver: bth.tver(),
            pkey: bth.pkey(),
            fecn: bth.fecn(),
            becn: bth.becn(),
            dest_qp: bth.dest_qp(),
            ack_req: bth.ack_req(),
            psn: bth.psn(),
        })
    }

    /// Bytes [`BthRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes every BTH byte (reserved bits 0). Fields wider than their wire width are
    /// truncated (`dest_qp`/`psn` to 24 bits, `pad_count` to 2, `tver` to 4). The view must
    /// hold [`BTH_LEN`](super::BTH_LEN) bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bth: &mut Bth<T>) {
        bth.set_opcode_raw(self.opcode.as_u8());
        bth.buffer.as_mut()[field::FLAGS] = 0;
        bth.set_solicited(self.solicited);
        bth.set_mig_req(self.mig_req);
        bth.set_pad_count(self.pad_count);
        bth.set_tver(self.tver);
        bth.set_pkey(self.pkey);
        bth.buffer.as_mut()[field::RESV8A] = 0;
        bth.set_fecn(self.fecn);
        bth.set_becn(self.becn);
        bth.set_dest_qp(self.dest_qp & MASK_24);
        bth.buffer.as_mut()[field::ACK_REQ] = 0;
        bth.set_ack_req(self.ack_req);
        bth.set_psn(self.psn & MASK_24);
    }
}

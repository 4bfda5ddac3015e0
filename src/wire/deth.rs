//! Datagram Extended Transport Header (docs/rc-transport.md §1.3): 8 bytes after the BTH of
//! every UD packet (rxe_hdr.h `struct rxe_deth`): the Q_Key the receiving QP checks and
//! the sending QP's number.

use super::error::{Result, WireError};
use super::{MASK_24, read_u24, read_u32, write_u24, write_u32};

/// Size of the DETH.
pub const HEADER_LEN: usize = 8;

mod field {
    use core::ops::Range;

    pub const QKEY: Range<usize> = 0..4;
    /// Reserved (sent as 0, ignored on receive).
    pub const RESV: usize = 4;
    pub const SRC_QP: Range<usize> = 5..8;
}

/// A read/write view of a DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Deth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Deth<T> {
        Deth { buffer }
    }

    /// Wraps a buffer after [`Deth::check_len`].
    pub fn new_checked(buffer: T) -> Result<Deth<T>> {
        let h = Deth::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Err(Truncated)` if the buffer cannot hold a DETH.
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

    #[inline]
    pub fn qkey(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::QKEY])
    }
    /// The reserved byte (sent as 0, ignored on receive).
    #[inline]
    pub fn resv(&self) -> u8 {
        self.buffer.as_ref()[field::RESV]
    }
    #[inline]
    pub fn src_qp(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::SRC_QP])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    #[inline]
    pub fn set_qkey(&mut self, value: u32) {
        write_u32(&mut self.buffer.as_mut()[field::QKEY], value);
    }
    #[inline]
    pub fn set_resv(&mut self, value: u8) {
        self.buffer.as_mut()[field::RESV] = value;
    }
    /// Writes the low 24 bits of `value`.
    #[inline]
    pub fn set_src_qp(&mut self, value: u32) {
        write_u24(&mut self.buffer.as_mut()[field::SRC_QP], value & MASK_24);
    }
}

/// A decoded DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DethRepr {
    pub qkey: u32,
    /// 24 bits.
    pub src_qp: u32,
}

impl DethRepr {
    /// Decodes a DETH (`Truncated` if short); the reserved byte is ignored.
    pub fn parse<T: AsRef<[u8]>>(h: &Deth<T>) -> Result<DethRepr> {
        h.check_len()?;
        Ok(DethRepr {
            qkey: h.qkey(),
            src_qp: h.src_qp(),
        })
    }

    /// Bytes [`DethRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the DETH (reserved byte 0); the view must hold
    /// [`DETH_LEN`](super::DETH_LEN) bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Deth<T>) {
        h.set_qkey(self.qkey);
        h.set_resv(0);
        h.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_sit_where_rxe_puts_them() {
        let bytes = [0x11, 0x11, 0x11, 0x11, 0xAA, 0x12, 0x34, 0x56];
        let h = Deth::new_checked(&bytes[..]).unwrap();
        assert_eq!(h.qkey(), 0x1111_1111);
        assert_eq!(h.resv(), 0xAA);
        assert_eq!(h.src_qp(), 0x12_3456);
        let r = DethRepr::parse(&h).unwrap();
        assert_eq!(
            r,
            DethRepr {
                qkey: 0x1111_1111,
                src_qp: 0x12_3456
            }
        );
        let mut out = [0xFFu8; HEADER_LEN];
        r.emit(&mut Deth::new_unchecked(&mut out[..]));
        assert_eq!(out, [0x11, 0x11, 0x11, 0x11, 0x00, 0x12, 0x34, 0x56]);
    }

    #[test]
    fn short_buffers_are_truncated_and_high_qpn_bits_are_dropped() {
        assert_eq!(
            Deth::new_checked(&[0u8; 7][..]).unwrap_err(),
            WireError::Truncated
        );
        let mut out = [0u8; HEADER_LEN];
        Deth::new_unchecked(&mut out[..]).set_src_qp(0xFF00_0001);
        assert_eq!(&out[5..], &[0x00, 0x00, 0x01]);
    }
}

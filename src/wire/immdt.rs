//! Immediate Data header (docs/rc-transport.md §1.3): 4 bytes, in the last/only packet of
//! *_WITH_IMMEDIATE messages.

use super::error::{Result, WireError};
use super::{read_u32, write_u32};

/// Size of the ImmDt.
pub const HEADER_LEN: usize = 4;

mod field {
    use core::ops::Range;

    pub const IMM: Range<usize> = 0..4;
}

/// A read/write view of an ImmDt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmDt<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> ImmDt<T> {
        ImmDt { buffer }
    }

    /// Wraps a buffer after [`ImmDt::check_len`].
    pub fn new_checked(buffer: T) -> Result<ImmDt<T>> {
        let h = ImmDt::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Err(Truncated)` if the buffer cannot hold an ImmDt.
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

    /// The immediate, read big-endian. It is opaque: verbs' `ibv_wc.imm_data` / `wr.imm_data`
    /// hold the wire bytes as-is (network order), i.e. `imm_data == imm.to_be()`.
    #[inline]
    pub fn imm(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::IMM])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    #[inline]
    pub fn set_imm(&mut self, value: u32) {
        write_u32(&mut self.buffer.as_mut()[field::IMM], value);
    }
}

/// A decoded ImmDt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmDtRepr {
    /// See [`ImmDt::imm`] for the byte order.
    pub imm: u32,
}

impl ImmDtRepr {
    /// Decodes an ImmDt (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(h: &ImmDt<T>) -> Result<ImmDtRepr> {
        h.check_len()?;
        Ok(ImmDtRepr { imm: h.imm() })
    }

    /// Bytes [`ImmDtRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the ImmDt; the view must hold [`IMMDT_LEN`](super::IMMDT_LEN) bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut ImmDt<T>) {
        h.set_imm(self.imm);
    }
}

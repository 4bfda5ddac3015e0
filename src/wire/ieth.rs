//! Invalidate Extended Transport Header (docs/rc-transport.md §1.3): 4 bytes, in
//! SEND_LAST/ONLY_WITH_INVALIDATE.

use super::error::{Result, WireError};
use super::{read_u32, write_u32};

/// Size of the IETH.
pub const HEADER_LEN: usize = 4;

mod field {
    use core::ops::Range;

    pub const RKEY: Range<usize> = 0..4;
}

/// A read/write view of an IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ieth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ieth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Ieth<T> {
        Ieth { buffer }
    }

    /// Wraps a buffer after [`Ieth::check_len`].
    pub fn new_checked(buffer: T) -> Result<Ieth<T>> {
        let h = Ieth::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Err(Truncated)` if the buffer cannot hold an IETH.
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

    /// The R_Key the responder must invalidate.
    #[inline]
    pub fn rkey(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::RKEY])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    #[inline]
    pub fn set_rkey(&mut self, value: u32) {
        write_u32(&mut self.buffer.as_mut()[field::RKEY], value);
    }
}

/// A decoded IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IethRepr {
    pub rkey: u32,
}

impl IethRepr {
    /// Decodes an IETH (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(h: &Ieth<T>) -> Result<IethRepr> {
        h.check_len()?;
        Ok(IethRepr { rkey: h.rkey() })
    }

    /// Bytes [`IethRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the IETH; the view must hold [`IETH_LEN`](super::IETH_LEN) bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Ieth<T>) {
        h.set_rkey(self.rkey);
    }
}

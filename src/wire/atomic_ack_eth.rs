//! Atomic Acknowledge Extended Transport Header (docs/rc-transport.md §1.3): 8 bytes, after the
//! AETH in ATOMIC_ACKNOWLEDGE.

use super::error::{Result, WireError};
use super::{read_u64, write_u64};

/// Size of the AtomicAckETH.
pub const HEADER_LEN: usize = 8;

mod field {
    use core::ops::Range;

    pub const ORIG: Range<usize> = 0..8;
}

/// A read/write view of an AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicAckEth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> AtomicAckEth<T> {
        AtomicAckEth { buffer }
    }

    /// Wraps a buffer after [`AtomicAckEth::check_len`].
    pub fn new_checked(buffer: T) -> Result<AtomicAckEth<T>> {
        let h = AtomicAckEth::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Err(Truncated)` if the buffer cannot hold an AtomicAckETH.
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

    /// The remote value before the atomic operation.
    #[inline]
    pub fn orig(&self) -> u64 {
        read_u64(&self.buffer.as_ref()[field::ORIG])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    #[inline]
    pub fn set_orig(&mut self, value: u64) {
        write_u64(&mut self.buffer.as_mut()[field::ORIG], value);
    }
}

/// A decoded AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicAckEthRepr {
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Decodes an AtomicAckETH (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicAckEth<T>) -> Result<AtomicAckEthRepr> {
        h.check_len()?;
        Ok(AtomicAckEthRepr { orig: h.orig() })
    }

    /// Bytes [`AtomicAckEthRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the AtomicAckETH; the view must hold [`ATOMIC_ACK_ETH_LEN`](super::ATOMIC_ACK_ETH_LEN) bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicAckEth<T>) {
        h.set_orig(self.orig);
    }
}

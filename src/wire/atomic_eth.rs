//! Atomic Extended Transport Header (docs/rc-transport.md §1.3): 28 bytes, in COMPARE_SWAP and
//! FETCH_ADD. Packed: the 64-bit fields at offsets 12 and 20 are not 8-byte aligned.

use super::error::{Result, WireError};
use super::{read_u32, read_u64, write_u32, write_u64};

/// Size of the AtomicETH.
pub const HEADER_LEN: usize = 28;

mod field {
    use core::ops::Range;

    pub const VA: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    pub const SWAP_ADD: Range<usize> = 12..20;
    pub const COMPARE: Range<usize> = 20..28;
}

/// A read/write view of an AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicEth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> AtomicEth<T> {
        AtomicEth { buffer }
    }

    /// Wraps a buffer after [`AtomicEth::check_len`].
    pub fn new_checked(buffer: T) -> Result<AtomicEth<T>> {
        let h = AtomicEth::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Err(Truncated)` if the buffer cannot hold an AtomicETH.
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
    pub fn va(&self) -> u64 {
        read_u64(&self.buffer.as_ref()[field::VA])
    }
    #[inline]
    pub fn rkey(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::RKEY])
    }
    /// Swap value (COMPARE_SWAP) or add value (FETCH_ADD).
    #[inline]
    pub fn swap_add(&self) -> u64 {
        read_u64(&self.buffer.as_ref()[field::SWAP_ADD])
    }
    /// Compare value (COMPARE_SWAP; ignored for FETCH_ADD).
    #[inline]
    pub fn compare(&self) -> u64 {
        read_u64(&self.buffer.as_ref()[field::COMPARE])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    #[inline]
    pub fn set_va(&mut self, value: u64) {
        write_u64(&mut self.buffer.as_mut()[field::VA], value);
    }
    #[inline]
    pub fn set_rkey(&mut self, value: u32) {
        write_u32(&mut self.buffer.as_mut()[field::RKEY], value);
    }
    #[inline]
    pub fn set_swap_add(&mut self, value: u64) {
        write_u64(&mut self.buffer.as_mut()[field::SWAP_ADD], value);
    }
    #[inline]
    pub fn set_compare(&mut self, value: u64) {
        write_u64(&mut self.buffer.as_mut()[field::COMPARE], value);
    }
}

/// A decoded AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicEthRepr {
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Decodes an AtomicETH (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(h: &AtomicEth<T>) -> Result<AtomicEthRepr> {
        h.check_len()?;
        Ok(AtomicEthRepr {
            va: h.va(),
            rkey: h.rkey(),
            swap_add: h.swap_add(),
            compare: h.compare(),
        })
    }

    /// Bytes [`AtomicEthRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the AtomicETH; the view must hold [`ATOMIC_ETH_LEN`](super::ATOMIC_ETH_LEN) bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut AtomicEth<T>) {
        h.set_va(self.va);
        h.set_rkey(self.rkey);
        h.set_swap_add(self.swap_add);
        h.set_compare(self.compare);
    }
}

//! RDMA Extended Transport Header (docs/rc-transport.md §1.3): 16 bytes, in RDMA WRITE FIRST/ONLY
//! and RDMA READ REQUEST.

use super::error::{Result, WireError};
use super::{read_u32, read_u64, write_u32, write_u64};

/// Size of the RETH.
pub const HEADER_LEN: usize = 16;

mod field {
    use core::ops::Range;

    pub const VA: Range<usize> = 0..8;
    pub const RKEY: Range<usize> = 8..12;
    pub const DMA_LEN: Range<usize> = 12..16;
}

/// A read/write view of a RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Reth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Reth<T> {
        Reth { buffer }
    }

    /// Wraps a buffer after [`Reth::check_len`].
    pub fn new_checked(buffer: T) -> Result<Reth<T>> {
        let h = Reth::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Err(Truncated)` if the buffer cannot hold a RETH.
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

    /// Remote virtual address.
    #[inline]
    pub fn va(&self) -> u64 {
        read_u64(&self.buffer.as_ref()[field::VA])
    }
    #[inline]
    pub fn rkey(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::RKEY])
    }
    /// Length of the whole message (not of this packet).
    #[inline]
    pub fn dma_len(&self) -> u32 {
        read_u32(&self.buffer.as_ref()[field::DMA_LEN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    #[inline]
    pub fn set_va(&mut self, value: u64) {
        write_u64(&mut self.buffer.as_mut()[field::VA], value);
    }
    #[inline]
    pub fn set_rkey(&mut self, value: u32) {
        write_u32(&mut self.buffer.as_mut()[field::RKEY], value);
    }
    #[inline]
    pub fn set_dma_len(&mut self, value: u32) {
        write_u32(&mut self.buffer.as_mut()[field::DMA_LEN], value);
    }
}

/// A decoded RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RethRepr {
    pub va: u64,
    pub rkey: u32,
    pub dma_len: u32,
}

impl RethRepr {
    /// Decodes a RETH (`Truncated` if short).
    pub fn parse<T: AsRef<[u8]>>(reth: &Reth<T>) -> Result<RethRepr> {
        reth.check_len()?;
        Ok(RethRepr {
            va: reth.va(),
            rkey: reth.rkey(),
            dma_len: reth.dma_len(),
        })
    }

    /// Bytes [`RethRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the RETH; the view must hold [`RETH_LEN`](super::RETH_LEN) bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, reth: &mut Reth<T>) {
        reth.set_va(self.va);
        reth.set_rkey(self.rkey);
        reth.set_dma_len(self.dma_len);
    }
}

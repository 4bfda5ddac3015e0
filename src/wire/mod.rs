//! RoCEv2 packet formats (docs/rc-transport.md §1, §2, §7).
//!
//! Layout follows smoltcp's `wire` module: one file per header, each with a typed view over a
//! byte buffer (`Bth<T: AsRef<[u8]>>`, with a private `field` module of byte ranges,
//! `new_checked`, getters and setters) and a plain-data `*Repr` with `parse`/`emit`/
//! `buffer_len`. [`PacketRepr`] ties them together for a whole RC packet (the UDP payload:
//! BTH, extension headers chosen by the opcode, payload, pad, ICRC), [`ud::UdPacketRepr`] for
//! a UD one (BTH + DETH [+ ImmDt]), and [`icrc`] computes the invariant CRC over the masked
//! IP/UDP/IB headers.
//!
//! This layer never allocates and never does IO. Every `Repr::parse` and [`PacketRepr::parse`]
//! is total: any byte string yields `Ok` or a [`WireError`], never a panic (checked by
//! proptests here and by the `fuzz/` target `wire_parse`). The raw views' getters and setters
//! index without checks, like smoltcp's; build views with `new_checked` (or size the buffer
//! with `buffer_len()`) before using them directly.

mod aeth;
mod atomic_ack_eth;
mod atomic_eth;
mod bth;
mod deth;
mod error;
pub mod icrc;
mod ieth;
mod immdt;
mod opcode;
mod packet;
mod reth;
pub mod ud;

#[cfg(test)]
mod tests;

pub use aeth::{Aeth, AethRepr, HEADER_LEN as AETH_LEN, NakCode, Syndrome};
pub use atomic_ack_eth::{AtomicAckEth, AtomicAckEthRepr, HEADER_LEN as ATOMIC_ACK_ETH_LEN};
pub use atomic_eth::{AtomicEth, AtomicEthRepr, HEADER_LEN as ATOMIC_ETH_LEN};
pub use bth::{Bth, BthRepr, HEADER_LEN as BTH_LEN};
pub use deth::{Deth, DethRepr, HEADER_LEN as DETH_LEN};
pub use error::{Result, WireError};
pub use icrc::ICRC_LEN;
pub use ieth::{HEADER_LEN as IETH_LEN, Ieth, IethRepr};
pub use immdt::{HEADER_LEN as IMMDT_LEN, ImmDt, ImmDtRepr};
pub use opcode::Opcode;
pub use packet::{PacketRepr, pad_len};
pub use reth::{HEADER_LEN as RETH_LEN, Reth, RethRepr};

/// UDP destination port of RoCEv2 (`ROCE_V2_UDP_DPORT`, §1.1).
pub const ROCE_V2_UDP_PORT: u16 = 4791;

/// Mask of 24-bit fields (QP numbers, PSNs, MSNs).
pub const MASK_24: u32 = 0x00FF_FFFF;

/// Reads a 24-bit big-endian field; `b` must hold at least 3 bytes (callers slice a checked
/// `field` range).
#[inline]
fn read_u24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

/// Writes the low 24 bits of `v` big-endian; higher bits are dropped (the field cannot hold
/// them).
#[inline]
fn write_u24(b: &mut [u8], v: u32) {
    let [_, x, y, z] = v.to_be_bytes();
    b[0] = x;
    b[1] = y;
    b[2] = z;
}

#[inline]
fn read_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

#[inline]
fn write_u32(b: &mut [u8], v: u32) {
    b[..4].copy_from_slice(&v.to_be_bytes());
}

#[inline]
fn read_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

#[inline]
fn write_u64(b: &mut [u8], v: u64) {
    b[..8].copy_from_slice(&v.to_be_bytes());
}

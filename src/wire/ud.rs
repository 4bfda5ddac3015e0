//! Unreliable Datagram packets (docs/rc-transport.md §1.3, §2.1; rxe_opcode.c `IB_OPCODE_UD_*`):
//! transport bits 011, two opcodes, SEND_ONLY (0x64) and SEND_ONLY_WITH_IMMEDIATE (0x65),
//! each BTH + DETH (+ ImmDt) + payload + pad + ICRC. A UD message is one packet: there is
//! no segmentation, no ACK and no retransmission, and the PSN only counts.
//!
//! The RC [`super::Opcode`] and [`super::PacketRepr`] stay RC-only (the RC engine matches on
//! them); a UD packet is recognised by [`is_ud_opcode`] on the raw BTH byte and decoded here.
//!
//! Also here: the 40-byte GRH area verbs puts in front of a UD receive buffer
//! ([`grh_ipv4`], [`grh_ipv6`]), which for RoCEv2 holds the packet's IP header as rxe
//! writes it (`rxe_resp.c`, `union rdma_network_hdr`).

use super::MASK_24;
use super::bth::{self, Bth};
use super::deth::{self, Deth, DethRepr};
use super::error::{Result, WireError};
use super::icrc::{ICRC_LEN, IPV4_HEADER_LEN, IPV6_HEADER_LEN, UDP_HEADER_LEN};
use super::immdt::{self, ImmDt, ImmDtRepr};
use super::packet::pad_len;
use core::net::{Ipv4Addr, Ipv6Addr};

/// Transport bits 7..5 of a UD opcode (011).
const UD_TRANSPORT: u8 = 0x60;
const TRANSPORT_MASK: u8 = 0xE0;

/// Bytes of the GRH area at the front of a UD receive buffer (`sizeof(struct ibv_grh)`).
pub const GRH_LEN: usize = 40;

/// P_Key every soft-provider packet carries (rxe: `IB_DEFAULT_PKEY_FULL`).
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// True if BTH byte 0 is a UD opcode (transport 011), known or not.
#[inline]
pub const fn is_ud_opcode(raw: u8) -> bool {
    raw & TRANSPORT_MASK == UD_TRANSPORT
}

/// A UD opcode (ib_pack.h `IB_OPCODE_UD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum UdOpcode {
    SendOnly = 0x64,
    SendOnlyWithImmediate = 0x65,
}

impl UdOpcode {
    /// Decodes BTH byte 0: anything but 0x64/0x65 is `BadOpcode`.
    pub const fn from_u8(value: u8) -> Result<UdOpcode> {
        match value {
            0x64 => Ok(UdOpcode::SendOnly),
            0x65 => Ok(UdOpcode::SendOnlyWithImmediate),
            other => Err(WireError::BadOpcode(other)),
        }
    }

    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// Bytes of BTH + DETH (+ ImmDt).
    pub const fn header_len(self) -> usize {
        match self {
            UdOpcode::SendOnly => bth::HEADER_LEN + deth::HEADER_LEN,
            UdOpcode::SendOnlyWithImmediate => {
                bth::HEADER_LEN + deth::HEADER_LEN + immdt::HEADER_LEN
            }
        }
    }
}

/// A decoded UD packet (the UDP payload). The BTH's MigReq, FECN/BECN, AckReq and
/// reserved bits are not kept: UD senders send them 0 and receivers ignore them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdPacketRepr<'a> {
    /// SE: the sender asked for a solicited event.
    pub solicited: bool,
    pub pkey: u16,
    /// 24 bits.
    pub dest_qp: u32,
    /// 24 bits.
    pub psn: u32,
    pub deth: DethRepr,
    /// The immediate (SEND_ONLY_WITH_IMMEDIATE), read big-endian as [`ImmDt::imm`].
    pub imm: Option<u32>,
    /// Payload without pad.
    pub payload: &'a [u8],
}

impl<'a> UdPacketRepr<'a> {
    /// The opcode this packet is sent with.
    pub const fn opcode(&self) -> UdOpcode {
        if self.imm.is_some() {
            UdOpcode::SendOnlyWithImmediate
        } else {
            UdOpcode::SendOnly
        }
    }

    /// Parses a UDP payload (BTH through ICRC). Total: any input gives `Ok` or an error,
    /// checked in this order: `Truncated`, `BadOpcode` (not 0x64/0x65), `BadVersion`
    /// (TVer ≠ 0), `BadPadding` (PadCnt beyond the body, or payload + pad not a multiple
    /// of 4). The ICRC is not checked here (it covers the IP/UDP headers).
    pub fn parse(buffer: &'a [u8]) -> Result<UdPacketRepr<'a>> {
        let b = Bth::new_checked(buffer)?;
        if buffer.len() < bth::HEADER_LEN + ICRC_LEN {
            return Err(WireError::Truncated);
        }
        let op = UdOpcode::from_u8(b.opcode_raw())?;
        let header_len = op.header_len();
        let body_end = buffer.len() - ICRC_LEN;
        if body_end < header_len {
            return Err(WireError::Truncated);
        }
        if b.tver() != 0 {
            return Err(WireError::BadVersion(b.tver()));
        }
        let deth = DethRepr::parse(&Deth::new_checked(&buffer[bth::HEADER_LEN..header_len])?)?;
        let imm = match op {
            UdOpcode::SendOnly => None,
            UdOpcode::SendOnlyWithImmediate => {
                let at = bth::HEADER_LEN + deth::HEADER_LEN;
                Some(ImmDtRepr::parse(&ImmDt::new_checked(&buffer[at..header_len])?)?.imm)
            }
        };
        let body = &buffer[header_len..body_end];
        let pad = usize::from(b.pad_count());
        if body.len() % 4 != 0 || pad > body.len() {
            return Err(WireError::BadPadding);
        }
        Ok(UdPacketRepr {
            solicited: b.solicited(),
            pkey: b.pkey(),
            dest_qp: b.dest_qp(),
            psn: b.psn(),
            deth,
            imm,
            payload: &body[..body.len() - pad],
        })
    }

    /// Bytes of BTH + DETH (+ ImmDt).
    pub const fn header_len(&self) -> usize {
        self.opcode().header_len()
    }

    /// Bytes [`UdPacketRepr::emit`] writes: headers + payload + pad + ICRC.
    pub const fn buffer_len(&self) -> usize {
        self.header_len() + self.payload.len() + pad_len(self.payload.len()) + ICRC_LEN
    }

    /// Writes the headers only (BTH with PadCnt for a payload of `payload_len` bytes, DETH,
    /// ImmDt) into the front of `buffer`; returns their length. For a sender that gathers
    /// the payload itself (`self.payload` is not read). `Truncated` if `buffer` is too
    /// small (nothing written).
    pub fn emit_headers(&self, payload_len: usize, buffer: &mut [u8]) -> Result<usize> {
        let len = self.header_len();
        let out = buffer.get_mut(..len).ok_or(WireError::Truncated)?;
        let mut b = Bth::new_unchecked(&mut out[..bth::HEADER_LEN]);
        b.set_opcode_raw(self.opcode().as_u8());
        // Every bit of the flags, Resv8a and AckReq bytes is written below.
        b.set_mig_req(false);
        b.set_tver(0);
        b.set_solicited(self.solicited);
        b.set_pad_count(pad_len(payload_len) as u8);
        b.set_pkey(self.pkey);
        b.set_fecn(false);
        b.set_becn(false);
        b.set_resv6a(0);
        b.set_dest_qp(self.dest_qp & MASK_24);
        b.set_ack_req(false);
        b.set_resv7(0);
        b.set_psn(self.psn & MASK_24);
        let at = bth::HEADER_LEN;
        self.deth.emit(&mut Deth::new_unchecked(
            &mut out[at..at + deth::HEADER_LEN],
        ));
        if let Some(imm) = self.imm {
            let at = at + deth::HEADER_LEN;
            ImmDtRepr { imm }.emit(&mut ImmDt::new_unchecked(
                &mut out[at..at + immdt::HEADER_LEN],
            ));
        }
        Ok(len)
    }

    /// Writes the whole packet into the front of `buffer` and returns its length
    /// ([`UdPacketRepr::buffer_len`]): headers, payload, zero pad, and a zero ICRC field
    /// (fill it with [`super::icrc::store`] once the IP/UDP headers are known). `BadLength`
    /// if it exceeds a UDP datagram, `Truncated` if `buffer` is too small; on error nothing
    /// is written.
    pub fn emit(&self, buffer: &mut [u8]) -> Result<usize> {
        let len = self.buffer_len();
        if len > usize::from(u16::MAX) - UDP_HEADER_LEN {
            return Err(WireError::BadLength);
        }
        let out = buffer.get_mut(..len).ok_or(WireError::Truncated)?;
        let at = self.emit_headers(self.payload.len(), out)?;
        let end = at + self.payload.len();
        out[at..end].copy_from_slice(self.payload);
        out[end..].fill(0);
        Ok(len)
    }
}

/// The GRH area of a UD receive from an IPv4 peer, as rxe fills it: 20 zero bytes, then
/// the packet's IPv4 header. A UDP socket does not see that header, so it is rebuilt
/// from what it must hold: version/IHL 0x45, ToS 0, total length (IP + UDP + `ib_len`
/// bytes of UDP payload), identification 0 and DF (as soft-provider senders send),
/// TTL 64 (Linux's default), protocol UDP, the header checksum, the addresses.
pub fn grh_ipv4(src: Ipv4Addr, dst: Ipv4Addr, ib_len: usize) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    let ip = &mut g[GRH_LEN - IPV4_HEADER_LEN..];
    let total = (IPV4_HEADER_LEN + UDP_HEADER_LEN + ib_len).min(usize::from(u16::MAX)) as u16;
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let sum = ip
        .chunks_exact(2)
        .fold(0u32, |s, w| s + u32::from(u16::from_be_bytes([w[0], w[1]])));
    let sum = (sum & 0xFFFF) + (sum >> 16);
    let sum = (sum & 0xFFFF) + (sum >> 16);
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    g
}

/// The GRH area of a UD receive from an IPv6 peer: the packet's IPv6 header (version 6,
/// traffic class and flow label 0, payload length UDP + `ib_len`, next header UDP, hop
/// limit 64, the addresses), which has the GRH's layout.
pub fn grh_ipv6(src: Ipv6Addr, dst: Ipv6Addr, ib_len: usize) -> [u8; GRH_LEN] {
    debug_assert_eq!(IPV6_HEADER_LEN, GRH_LEN);
    let mut g = [0u8; GRH_LEN];
    g[0] = 0x60;
    let plen = (UDP_HEADER_LEN + ib_len).min(usize::from(u16::MAX)) as u16;
    g[4..6].copy_from_slice(&plen.to_be_bytes());
    g[6] = 17;
    g[7] = 64;
    g[8..24].copy_from_slice(&src.octets());
    g[24..40].copy_from_slice(&dst.octets());
    g
}

#[cfg(test)]
mod tests;

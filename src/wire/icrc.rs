//! Invariant CRC of RoCEv2 packets (docs/rc-transport.md §7).
//!
//! CRC-32 is the ordinary Ethernet/zlib one (reflected polynomial 0xEDB88320, init and final
//! XOR 0xFFFFFFFF), computed by crc32fast (SIMD); the ICRC resumes it from the register
//! after the 8-byte 0xFF pseudo-LRH and feeds masked copies of the headers.
//!
//! Input (§7.1): 8 bytes 0xFF, the IP header with its variant fields set to all ones (IPv4:
//! ToS, TTL, header checksum; IPv6: traffic class, flow label, hop limit), the UDP header
//! with checksum 0xFFFF, the BTH with byte 4 (FECN/BECN/Resv6a) 0xFF, then the rest of the
//! transport headers, payload and pad. The 4-byte result is stored least-significant byte
//! first ([`store`], [`received`]).
//!
//! In this module `ib_packet` is always a whole UDP payload *including* the trailing 4-byte
//! ICRC field, which is never fed to the CRC: that is the buffer both the sender (after
//! [`super::PacketRepr::emit`]) and the receiver hold.

use core::net::{SocketAddrV4, SocketAddrV6};

use super::bth;
use super::error::{Result, WireError};

/// Size of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// Size of the UDP header.
pub const UDP_HEADER_LEN: usize = 8;
/// Size of an IPv4 header without options.
pub const IPV4_HEADER_LEN: usize = 20;
/// Size of the fixed IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;
/// Largest IPv4 header (IHL 15).
const IPV4_MAX_HEADER_LEN: usize = 60;

/// IP protocol / IPv6 next header value of UDP.
const IPPROTO_UDP: u8 = 17;

/// Register value after feeding the 8 × 0xFF pseudo-LRH from 0xFFFFFFFF; rxe seeds its CRC
/// with this constant instead of hashing the prefix (a unit test checks the equivalence).
pub const PSEUDO_LRH_SEED: u32 = 0xDEBB_20E3;

/// Advances a CRC register (zlib convention: not yet inverted) over `data`. crc32fast does
/// the work: it is the maintained, SIMD-accelerated implementation of exactly this CRC-32,
/// and a byte-at-a-time table would cost microseconds per 4 KiB packet.
#[inline]
fn update(reg: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(!reg);
    h.update(data);
    !h.finalize()
}

/// The plain zlib/Ethernet CRC-32 of `data` (`crc32(b"123456789") == 0xCBF43926`).
pub fn crc32(data: &[u8]) -> u32 {
    !update(0xFFFF_FFFF, data)
}

/// Incremental ICRC: starts after the pseudo-LRH; feed the masked IP, UDP and BTH headers,
/// then the rest of the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Icrc {
    reg: u32,
}

impl Default for Icrc {
    fn default() -> Icrc {
        Icrc::new()
    }
}

impl Icrc {
    /// A CRC that has already consumed the 8 × 0xFF pseudo-LRH.
    pub const fn new() -> Icrc {
        Icrc {
            reg: PSEUDO_LRH_SEED,
        }
    }

    /// Feeds bytes as they are (no masking).
    pub fn update(&mut self, data: &[u8]) {
        self.reg = update(self.reg, data);
    }

    /// The ICRC value (zlib convention: register inverted). Wire bytes are its
    /// little-endian form.
    pub const fn finish(&self) -> u32 {
        !self.reg
    }
}

/// Sets the IPv4 header fields the ICRC does not cover to all ones (§7.1): ToS (DSCP and
/// ECN), TTL, header checksum. `ip` must hold at least the 20-byte fixed header.
pub fn mask_ipv4(ip: &mut [u8]) {
    ip[1] = 0xFF;
    ip[8] = 0xFF;
    ip[10..12].fill(0xFF);
}

/// Sets the IPv6 header fields the ICRC does not cover to all ones: traffic class and flow
/// label (the version nibble is kept), hop limit.
pub fn mask_ipv6(ip: &mut [u8; IPV6_HEADER_LEN]) {
    ip[0] |= 0x0F;
    ip[1..4].fill(0xFF);
    ip[7] = 0xFF;
}

/// Sets the UDP checksum to all ones, as the ICRC covers it.
pub fn mask_udp(udp: &mut [u8; UDP_HEADER_LEN]) {
    udp[6..8].fill(0xFF);
}

/// Sets BTH byte 4 (FECN, BECN, Resv6a) to all ones, as the ICRC covers it. `bth` must
/// hold the BTH.
pub fn mask_bth(bth: &mut [u8]) {
    bth[bth::RESV8A_OFFSET] = 0xFF;
}

/// ICRC of the masked IP header `ip` followed by `udp_header` (checksum masked) and the IB
/// part of `ib_packet` (BTH byte 4 masked; the trailing ICRC excluded). IP, UDP and BTH go
/// through the CRC as one buffer: fed as small pieces they cost as much as the SIMD pass
/// over a 4 KiB payload.
fn finish_with_udp_ib(ip: &[u8], udp_header: &[u8], ib_packet: &[u8]) -> Result<u32> {
    let udp: &[u8; UDP_HEADER_LEN] = udp_header
        .try_into()
        .map_err(|_| udp_len_error(udp_header))?;
    if ib_packet.len() < bth::HEADER_LEN + ICRC_LEN {
        return Err(WireError::Truncated);
    }
    let mut pre = [0u8; IPV4_MAX_HEADER_LEN + UDP_HEADER_LEN + bth::HEADER_LEN];
    let n = ip.len();
    pre[..n].copy_from_slice(ip);
    let mut udp = *udp;
    mask_udp(&mut udp);
    pre[n..n + UDP_HEADER_LEN].copy_from_slice(&udp);
    let b = n + UDP_HEADER_LEN;
    pre[b..b + bth::HEADER_LEN].copy_from_slice(&ib_packet[..bth::HEADER_LEN]);
    mask_bth(&mut pre[b..]);
    let mut crc = Icrc::new();
    crc.update(&pre[..b + bth::HEADER_LEN]);
    crc.update(&ib_packet[bth::HEADER_LEN..ib_packet.len() - ICRC_LEN]);
    Ok(crc.finish())
}

fn udp_len_error(udp_header: &[u8]) -> WireError {
    if udp_header.len() < UDP_HEADER_LEN {
        WireError::Truncated
    } else {
        WireError::BadLength
    }
}

/// ICRC of a packet carried over IPv4. `ip_header` is the whole IPv4 header as sent
/// (options included; its length must equal IHL × 4), `udp_header` the 8-byte UDP header,
/// `ib_packet` the UDP payload including the ICRC field. ToS, TTL, header checksum and UDP
/// checksum are masked, so their values do not matter. Length fields are hashed as given,
/// not checked against the buffers.
pub fn compute_ipv4(ip_header: &[u8], udp_header: &[u8], ib_packet: &[u8]) -> Result<u32> {
    let len = ip_header.len();
    if len < IPV4_HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let ihl_len = usize::from(ip_header[0] & 0x0F) * 4;
    if len > IPV4_MAX_HEADER_LEN || ihl_len != len {
        return Err(WireError::BadLength);
    }
    let mut ip = [0u8; IPV4_MAX_HEADER_LEN];
    let ip = &mut ip[..len];
    ip.copy_from_slice(ip_header);
    mask_ipv4(ip);
    finish_with_udp_ib(ip, udp_header, ib_packet)
}

/// ICRC of a packet carried over IPv6. `ip_header` is the fixed 40-byte IPv6 header
/// (extension headers are not supported: RoCEv2 senders do not use them), `udp_header` and
/// `ib_packet` as for [`compute_ipv4`]. Traffic class, flow label, hop limit and UDP checksum
/// are masked.
pub fn compute_ipv6(ip_header: &[u8], udp_header: &[u8], ib_packet: &[u8]) -> Result<u32> {
    let ip: &[u8; IPV6_HEADER_LEN] = ip_header.try_into().map_err(|_| {
        if ip_header.len() < IPV6_HEADER_LEN {
            WireError::Truncated
        } else {
            WireError::BadLength
        }
    })?;
    let mut ip = *ip;
    mask_ipv6(&mut ip);
    finish_with_udp_ib(&ip, udp_header, ib_packet)
}

/// The ICRC stored in the last 4 bytes of `ib_packet` (little-endian, §7.1).
pub fn received(ib_packet: &[u8]) -> Result<u32> {
    let start = ib_packet
        .len()
        .checked_sub(ICRC_LEN)
        .ok_or(WireError::Truncated)?;
    let b = &ib_packet[start..];
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Writes `icrc` into the last 4 bytes of `ib_packet` (little-endian).
pub fn store(ib_packet: &mut [u8], icrc: u32) -> Result<()> {
    let start = ib_packet
        .len()
        .checked_sub(ICRC_LEN)
        .ok_or(WireError::Truncated)?;
    ib_packet[start..].copy_from_slice(&icrc.to_le_bytes());
    Ok(())
}

/// `Ok` if `computed` equals the ICRC stored in `ib_packet`, else `BadIcrc`.
pub fn check(ib_packet: &[u8], computed: u32) -> Result<()> {
    let received = received(ib_packet)?;
    if received == computed {
        Ok(())
    } else {
        Err(WireError::BadIcrc { computed, received })
    }
}

/// The IPv4 and UDP headers a Linux UDP socket emits for an `ib_packet` of this length, with
/// the masked fields (ToS, TTL, checksums) left at zero — they do not enter the ICRC.
///
/// Assumptions (the soft provider must arrange for them):
/// * no IP options: version 4, IHL 5;
/// * flags DF, fragment offset 0: set `IP_MTU_DISCOVER = IP_PMTUDISC_DO` on the socket;
/// * identification = `ident`. The ID is *not* masked by the ICRC. Linux writes 0 for DF
///   datagrams sent on an *unconnected* socket (`ip_select_ident`), and rxe does the same
///   (no socket), so pass 0 and send with `sendto` on an unconnected socket. A connected
///   socket uses a per-socket counter, which the sender cannot predict: do not connect it.
///   A receiver using a UDP socket cannot see the peer's ID either, so it verifies assuming
///   0; peers that send other IDs (some NICs) need a raw socket to be verified;
/// * protocol 17, total length = 20 + 8 + `ib_len`; UDP length = 8 + `ib_len`.
///
/// `ib_len` is the UDP payload length, ICRC included. `BadLength` if it does not fit.
pub fn ipv4_headers(
    src: SocketAddrV4,
    dst: SocketAddrV4,
    ident: u16,
    ib_len: usize,
) -> Result<([u8; IPV4_HEADER_LEN], [u8; UDP_HEADER_LEN])> {
    let total = u16::try_from(IPV4_HEADER_LEN + UDP_HEADER_LEN + ib_len)
        .map_err(|_| WireError::BadLength)?;
    let mut ip = [0u8; IPV4_HEADER_LEN];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[4..6].copy_from_slice(&ident.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
    ip[9] = IPPROTO_UDP;
    ip[12..16].copy_from_slice(&src.ip().octets());
    ip[16..20].copy_from_slice(&dst.ip().octets());
    let udp = udp_header(src.port(), dst.port(), total - IPV4_HEADER_LEN as u16);
    Ok((ip, udp))
}

/// The IPv6 and UDP headers a Linux UDP socket emits for an `ib_packet` of this length, with
/// masked fields (traffic class, flow label, hop limit, UDP checksum) left at zero. Assumes
/// no extension headers: next header 17, payload length = UDP length = 8 + `ib_len`.
/// Scope IDs and flow info of the socket addresses do not appear on the wire and are ignored.
pub fn ipv6_headers(
    src: SocketAddrV6,
    dst: SocketAddrV6,
    ib_len: usize,
) -> Result<([u8; IPV6_HEADER_LEN], [u8; UDP_HEADER_LEN])> {
    let udp_len = u16::try_from(UDP_HEADER_LEN + ib_len).map_err(|_| WireError::BadLength)?;
    let mut ip = [0u8; IPV6_HEADER_LEN];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
    ip[6] = IPPROTO_UDP;
    ip[8..24].copy_from_slice(&src.ip().octets());
    ip[24..40].copy_from_slice(&dst.ip().octets());
    Ok((ip, udp_header(src.port(), dst.port(), udp_len)))
}

fn udp_header(src_port: u16, dst_port: u16, len: u16) -> [u8; UDP_HEADER_LEN] {
    let mut udp = [0u8; UDP_HEADER_LEN];
    udp[0..2].copy_from_slice(&src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&len.to_be_bytes());
    udp
}

/// ICRC of `ib_packet` sent from `src` to `dst` over IPv4 by a kernel UDP socket; see
/// [`ipv4_headers`] for the assumed header (pass `ident` 0 for an unconnected DF socket).
pub fn compute_ipv4_addrs(
    src: SocketAddrV4,
    dst: SocketAddrV4,
    ident: u16,
    ib_packet: &[u8],
) -> Result<u32> {
    let (ip, udp) = ipv4_headers(src, dst, ident, ib_packet.len())?;
    compute_ipv4(&ip, &udp, ib_packet)
}

/// ICRC of `ib_packet` sent from `src` to `dst` over IPv6 by a kernel UDP socket; see
/// [`ipv6_headers`].
pub fn compute_ipv6_addrs(src: SocketAddrV6, dst: SocketAddrV6, ib_packet: &[u8]) -> Result<u32> {
    let (ip, udp) = ipv6_headers(src, dst, ib_packet.len())?;
    compute_ipv6(&ip, &udp, ib_packet)
}

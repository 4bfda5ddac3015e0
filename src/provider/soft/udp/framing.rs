//! ICRC framing of soft-provider datagrams (docs/rc-transport.md §7): [`seal`] writes the ICRC of
//! a datagram gathered from parts (the payload straight from registered memory), [`verify`]
//! checks a received one. The ICRC covers the IP and UDP headers the kernel will write,
//! rebuilt here from the addresses.

use super::*;

/// IB bytes `icrc_parts` hashes together with the IP and UDP headers: the longest RC header
/// (BTH + RETH + ImmDt = 32).
const ICRC_PREFIX_IB: usize = 32;
/// Its buffer: IPv6 header + UDP header + `ICRC_PREFIX_IB`.
const ICRC_PREFIX_MAX: usize = icrc::IPV6_HEADER_LEN + icrc::UDP_HEADER_LEN + ICRC_PREFIX_IB;

/// ICRC of a datagram from `src` to `dst` given as consecutive `parts` (the UDP payload; its
/// last 4 bytes are the ICRC field and are not hashed), computed without copying the parts.
/// Mirrors [`icrc::compute_ipv4_addrs`] (identification 0) and [`icrc::compute_ipv6_addrs`].
/// `InvalidInput` if the families differ, the datagram is shorter than BTH + ICRC, or it is
/// too long for one IP packet.
pub fn icrc_parts(src: SocketAddr, dst: SocketAddr, parts: &[&[u8]]) -> io::Result<u32> {
    let total = parts
        .iter()
        .try_fold(0usize, |acc, p| acc.checked_add(p.len()))
        .ok_or_else(|| invalid("datagram length overflows"))?;
    if total < BTH_LEN + ICRC_LEN {
        return Err(invalid("datagram shorter than BTH + ICRC"));
    }
    // The masked IP and UDP headers and the packet's first bytes (its BTH and extension
    // headers, BTH byte 4 masked) go into one buffer and through the CRC in one call: fed
    // as six small pieces they cost as much as the SIMD pass over a 4 KiB payload.
    let mut pre = [0u8; ICRC_PREFIX_MAX];
    let mut n = match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            let (mut ip, mut udp) = icrc::ipv4_headers(s, d, 0, total).map_err(wire_err)?;
            icrc::mask_ipv4(&mut ip);
            icrc::mask_udp(&mut udp);
            pre[..ip.len()].copy_from_slice(&ip);
            pre[ip.len()..ip.len() + udp.len()].copy_from_slice(&udp);
            ip.len() + udp.len()
        }
        (SocketAddr::V6(s), SocketAddr::V6(d)) => {
            let (mut ip, mut udp) = icrc::ipv6_headers(s, d, total).map_err(wire_err)?;
            icrc::mask_ipv6(&mut ip);
            icrc::mask_udp(&mut udp);
            pre[..ip.len()].copy_from_slice(&ip);
            pre[ip.len()..ip.len() + udp.len()].copy_from_slice(&udp);
            ip.len() + udp.len()
        }
        _ => return Err(invalid("source and destination address families differ")),
    };
    let end = total - ICRC_LEN;
    // IB bytes taken into the prefix: at least the BTH (so the masked byte is in it).
    let ib_pre = end.min(ICRC_PREFIX_IB);
    let mut crc = Icrc::new();
    let mut off = 0;
    for part in parts {
        if off >= end {
            break;
        }
        let part = &part[..part.len().min(end - off)];
        let into_pre = ib_pre.saturating_sub(off).min(part.len());
        pre[n..n + into_pre].copy_from_slice(&part[..into_pre]);
        n += into_pre;
        if off + into_pre == ib_pre && into_pre > 0 {
            icrc::mask_bth(&mut pre[n - ib_pre..]);
            crc.update(&pre[..n]);
        }
        crc.update(&part[into_pre..]);
        off += part.len();
    }
    Ok(crc.finish())
}

/// Fills the ICRC field of a datagram from `src` to `dst` made of `head`, `payload` and
/// `tail`: the field is the last 4 bytes of `tail` (pad bytes before it are hashed as they
/// are). For a packet entirely in one buffer, split it so that `tail` is its last 4 bytes.
/// `InvalidInput` if `tail` is shorter than 4 bytes or as for [`icrc_parts`].
pub fn seal(
    src: SocketAddr,
    dst: SocketAddr,
    head: &[u8],
    payload: &[u8],
    tail: &mut [u8],
) -> io::Result<()> {
    if tail.len() < ICRC_LEN {
        return Err(invalid("the tail must hold the 4-byte ICRC field"));
    }
    let value = icrc_parts(src, dst, &[head, payload, tail])?;
    icrc::store(tail, value).map_err(wire_err)
}

/// True if the ICRC in the last 4 bytes of `datagram` (a UDP payload received from `src` at
/// `dst`) is right, assuming IP identification 0 for IPv4. False for any malformed input.
pub fn verify(src: SocketAddr, dst: SocketAddr, datagram: &[u8]) -> bool {
    let computed = match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => icrc::compute_ipv4_addrs(s, d, 0, datagram),
        (SocketAddr::V6(s), SocketAddr::V6(d)) => icrc::compute_ipv6_addrs(s, d, datagram),
        _ => return false,
    };
    computed.is_ok_and(|c| icrc::check(datagram, c).is_ok())
}

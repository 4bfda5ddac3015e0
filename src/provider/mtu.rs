//! Path MTU from the link, as a NIC does.
//!
//! A RoCE NIC's port has an *active MTU*: the largest InfiniBand MTU (256, 512, 1024, 2048 or
//! 4096 bytes of payload per packet) whose packets fit the Ethernet MTU of its netdev after
//! the IP, UDP and RoCE headers (rxe derives it the same way from its netdev,
//! `rxe_set_mtu`). A connection then uses at most that, whatever the application asked for.
//!
//! The soft provider has no netdev of its own: its packets leave through whichever interface
//! routes to the peer. So the active MTU is per connection, from the MTU of the route to the
//! peer ([`route_mtu_of`] on the connected TCP side channel, [`route_mtu`] with a UDP probe
//! socket): [`active_mtu`] is the largest IB MTU with
//! `rc::max_packet_len(mtu) + UDP header + IP header <= link MTU` (the RC engine's worst case
//! packet: BTH, the largest extension headers, pad and ICRC).
//!
//! | link MTU | IPv4 | IPv6 |
//! |---|---|---|
//! | 1280 | 1024 | 1024 |
//! | 1500 | 1024 | 1024 |
//! | 9000 | 4096 | 4096 |
//! | 65536 (`lo`) | 4096 | 4096 |
//!
//! A link below [`min_link_mtu`] cannot carry even 256-byte packets: [`choose`] refuses it
//! with [`ErrorKind::Unsupported`] rather than letting every WR end in RETRY_EXC_ERR.
//!
//! A configured `path_mtu` above the active MTU is clamped (with an info log line), not
//! refused: the configuration is per library, the link per connection, and a NIC's port
//! likewise caps a QP at its active MTU.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::ptr;

use crate::error::{Error, ErrorKind, Result};
use crate::rc::max_packet_len;

/// The MTUs InfiniBand defines (`enum ibv_mtu`), smallest first.
pub const IB_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];
/// UDP header bytes.
pub const UDP_HEADER: u32 = 8;
/// IPv4 header bytes (no options: the soft provider sends none).
pub const IPV4_HEADER: u32 = 20;
/// IPv6 header bytes (no extension headers).
pub const IPV6_HEADER: u32 = 40;

/// Bytes on the link (IP datagram) of the largest packet at IB MTU `ib_mtu`: the RC engine's
/// worst case ([`max_packet_len`]) plus the UDP and IP headers.
pub fn frame_len(ib_mtu: u32, ipv6: bool) -> u32 {
    let ip = if ipv6 { IPV6_HEADER } else { IPV4_HEADER };
    max_packet_len(ib_mtu) as u32 + UDP_HEADER + ip
}

/// The smallest link MTU that carries 256-byte packets.
pub fn min_link_mtu(ipv6: bool) -> u32 {
    frame_len(IB_MTUS[0], ipv6)
}

/// The active MTU of a link: the largest IB MTU whose packets fit `link_mtu`, or None when
/// not even 256 fits (below [`min_link_mtu`]).
pub fn active_mtu(link_mtu: u32, ipv6: bool) -> Option<u32> {
    IB_MTUS
        .iter()
        .rev()
        .copied()
        .find(|&m| frame_len(m, ipv6) <= link_mtu)
}

/// What a connection offers in its hello: the configured `path_mtu`, capped by the active
/// MTU of the link that routes to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathMtu {
    /// `path_mtu` from the configuration.
    pub configured: u32,
    /// MTU of the route to the peer (IP datagram bytes).
    pub link_mtu: u32,
    /// Largest IB MTU that fits `link_mtu` ([`active_mtu`]).
    pub active: u32,
    /// min(configured, active): what this side offers.
    pub offered: u32,
}

impl PathMtu {
    /// Whether the configured value was lowered to fit the link.
    pub fn clamped(&self) -> bool {
        self.offered < self.configured
    }
}

/// The MTU a connection offers over a link of `link_mtu` (IPv6 when `ipv6`): min(configured,
/// active). `route` names the route in the error ("to 10.0.0.2 via eth0").
///
/// Errors: [`ErrorKind::Unsupported`] when the link is below [`min_link_mtu`].
pub fn choose(configured: u32, link_mtu: u32, ipv6: bool, route: &str) -> Result<PathMtu> {
    let active = active_mtu(link_mtu, ipv6).ok_or_else(|| {
        Error::new(
            ErrorKind::Unsupported,
            format!(
                "path MTU: the route {route} has link MTU {link_mtu}, below the {} bytes the \
                 smallest IB MTU (256) needs with {} UDP and RoCE headers",
                min_link_mtu(ipv6),
                if ipv6 { "IPv6," } else { "IPv4," }
            ),
        )
    })?;
    Ok(PathMtu {
        configured,
        link_mtu,
        active,
        offered: configured.min(active),
    })
}

/// The MTU of the route a connected socket uses (`IP_MTU`, or `IPV6_MTU` for an `AF_INET6`
/// socket, IPv4-mapped peers included): the interface's MTU, or a smaller path MTU the kernel
/// learned. `ENOTCONN` when the socket has no route cached.
pub fn route_mtu_of(fd: BorrowedFd<'_>, v6_socket: bool) -> io::Result<u32> {
    let (level, name) = if v6_socket {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    } else {
        (libc::IPPROTO_IP, libc::IP_MTU)
    };
    let value = super::sys::getsockopt_int(fd, level, name)?;
    u32::try_from(value)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("MTU {value}")))
}

/// The MTU of the route to `peer` from this thread's network namespace: a UDP socket
/// `connect()`ed to it (which sends nothing) and [`route_mtu_of`]. Also returns the local
/// address the route picks.
pub fn route_mtu(peer: IpAddr) -> io::Result<(u32, IpAddr)> {
    let peer = peer.to_canonical();
    let any: SocketAddr = if peer.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(any)?;
    // The port is irrelevant to the route; 9 (discard) in case something looks.
    s.connect(SocketAddr::new(peer, 9))?;
    let mtu = route_mtu_of(s.as_fd(), peer.is_ipv6())?;
    Ok((mtu, s.local_addr()?.ip()))
}

/// The name of the interface that holds address `local` (best effort, for log lines: the
/// interface a route from `local` normally leaves by). None when no interface has it or
/// `getifaddrs` fails.
pub fn interface_of(local: IpAddr) -> Option<String> {
    let local = local.to_canonical();
    let mut head: *mut libc::ifaddrs = ptr::null_mut();
    // SAFETY: `head` is a live out-pointer; on success it owns a list freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-NULL ifa_addr points to a sockaddr of the family it names, at least
        // as large as the struct read for that family.
        let ip = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let a = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    IpAddr::from(u32::from_be(a.sin_addr.s_addr).to_be_bytes())
                }
                libc::AF_INET6 => {
                    let a = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    IpAddr::from(a.sin6_addr.s6_addr)
                }
                _ => continue,
            }
        };
        if ip == local {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let name = unsafe { CStr::from_ptr(ifa.ifa_name) };
            found = Some(name.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}

/// "to PEER from LOCAL (dev NAME)", the route as log lines and errors name it.
pub fn describe_route(peer: IpAddr, local: IpAddr) -> String {
    match interface_of(local) {
        Some(dev) => format!(
            "to {} from {} (dev {dev})",
            peer.to_canonical(),
            local.to_canonical()
        ),
        None => format!("to {} from {}", peer.to_canonical(), local.to_canonical()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, TcpListener, TcpStream};

    #[test]
    fn frame_lengths() {
        // 4096 payload + 32 headers (BTH and the largest extension headers) + 3 pad + 4 ICRC
        // + 8 UDP + 20 IPv4.
        assert_eq!(frame_len(4096, false), 4096 + 39 + 28);
        assert_eq!(frame_len(1024, false), 1091);
        assert_eq!(frame_len(1024, true), 1111);
        assert_eq!(min_link_mtu(false), 323);
        assert_eq!(min_link_mtu(true), 343);
    }

    #[test]
    fn active_mtu_of_common_links() {
        for ipv6 in [false, true] {
            assert_eq!(active_mtu(1500, ipv6), Some(1024), "1500 ipv6={ipv6}");
            assert_eq!(active_mtu(9000, ipv6), Some(4096), "9000 ipv6={ipv6}");
            assert_eq!(active_mtu(65536, ipv6), Some(4096), "lo ipv6={ipv6}");
            assert_eq!(active_mtu(1280, ipv6), Some(1024), "1280 ipv6={ipv6}");
            assert_eq!(active_mtu(600, ipv6), Some(512), "600 ipv6={ipv6}");
            // IPv4's minimum reassembly size: 512 + 67 headers is 3 bytes too many.
            assert_eq!(active_mtu(576, ipv6), Some(256), "576 ipv6={ipv6}");
        }
        // Edges: exactly fitting, one byte short.
        assert_eq!(active_mtu(4163, false), Some(4096));
        assert_eq!(active_mtu(4162, false), Some(2048));
        assert_eq!(active_mtu(4183, true), Some(4096));
        assert_eq!(active_mtu(4182, true), Some(2048));
        assert_eq!(active_mtu(2115, false), Some(2048));
        assert_eq!(active_mtu(2114, false), Some(1024));
        assert_eq!(active_mtu(323, false), Some(256));
        assert_eq!(active_mtu(343, true), Some(256));
        // Below 256: none.
        assert_eq!(active_mtu(322, false), None);
        assert_eq!(active_mtu(342, true), None);
        assert_eq!(active_mtu(68, false), None);
        assert_eq!(active_mtu(0, false), None);
    }

    #[test]
    fn choose_clamps_and_keeps_lower() {
        let p = choose(4096, 1500, false, "to x").unwrap();
        assert_eq!(
            p,
            PathMtu {
                configured: 4096,
                link_mtu: 1500,
                active: 1024,
                offered: 1024
            }
        );
        assert!(p.clamped());
        let p = choose(2048, 9000, false, "to x").unwrap();
        assert_eq!((p.active, p.offered, p.clamped()), (4096, 2048, false));
        let p = choose(1024, 1500, true, "to x").unwrap();
        assert_eq!((p.active, p.offered, p.clamped()), (1024, 1024, false));
        let p = choose(256, 65536, false, "to x").unwrap();
        assert_eq!((p.active, p.offered), (4096, 256));
    }

    #[test]
    fn choose_refuses_a_link_below_256() {
        let e = choose(1024, 300, false, "to 10.0.0.2 from 10.0.0.1 (dev veth0)").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert_eq!(
            e.message(),
            "path MTU: the route to 10.0.0.2 from 10.0.0.1 (dev veth0) has link MTU 300, below \
             the 323 bytes the smallest IB MTU (256) needs with IPv4, UDP and RoCE headers"
        );
        let e = choose(1024, 342, true, "to ::1").unwrap_err();
        assert!(e.message().contains("below the 343 bytes"), "{e}");
        assert!(e.message().contains("IPv6,"), "{e}");
    }

    #[test]
    fn loopback_route_is_lo_at_65536() {
        let (mtu, local) = route_mtu(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        assert_eq!(local, IpAddr::V4(Ipv4Addr::LOCALHOST));
        // `lo` is 65536 unless someone changed it; either way 4096 fits.
        assert!(mtu >= 4163, "{mtu}");
        assert_eq!(active_mtu(mtu, false), Some(4096));
        assert_eq!(interface_of(local).as_deref(), Some("lo"));
        assert_eq!(
            describe_route(IpAddr::V4(Ipv4Addr::LOCALHOST), local),
            "to 127.0.0.1 from 127.0.0.1 (dev lo)"
        );
        // IPv6 loopback where the host has it (the kernel reports 65535 there: an IPv6
        // route's MTU is capped at the largest non-jumbo payload).
        if let Ok((mtu6, _)) = route_mtu(IpAddr::V6(Ipv6Addr::LOCALHOST)) {
            assert_eq!(active_mtu(mtu6, true), Some(4096), "{mtu6}");
        }
    }

    #[test]
    fn connected_tcp_socket_reports_its_route() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let (probe, _) = route_mtu(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        assert_eq!(route_mtu_of(c.as_fd(), false).unwrap(), probe);
        assert_eq!(route_mtu_of(s.as_fd(), false).unwrap(), probe);
        // An unconnected socket has no route.
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        let e = route_mtu_of(u.as_fd(), false).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
    }
}

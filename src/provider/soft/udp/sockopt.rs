//! Socket plumbing for [`super::UdpPort`]: socket creation and options, `sockaddr`
//! conversions, the `UDP_SEGMENT` control message and GSO runs, and parsing of received
//! control messages.

use super::*;

pub(super) fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

pub(super) fn wire_err(e: crate::wire::WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e)
}

/// A new non-blocking UDP socket with the options of the module documentation, unbound.
pub(super) fn open_socket(v4: bool) -> io::Result<OwnedFd> {
    let domain = if v4 { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain syscall with constant arguments; it returns a new descriptor or -1.
    let raw = unsafe {
        libc::socket(
            domain,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a freshly created descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let b = fd.as_fd();
    if v4 {
        setsockopt_int(
            b,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )?;
        setsockopt_int(b, libc::IPPROTO_IP, libc::IP_PKTINFO, 1)?;
    } else {
        setsockopt_int(b, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 1)?;
        setsockopt_int(
            b,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )?;
        setsockopt_int(b, libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, 1)?;
        setsockopt_int(b, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)?;
    }
    setsockopt_int(b, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1)?;
    // Best effort: the kernel silently caps these at net.core.{r,w}mem_max.
    let want = SOCKET_BUFFER_BYTES as libc::c_int;
    let _ = setsockopt_int(b, libc::SOL_SOCKET, libc::SO_RCVBUF, want);
    let _ = setsockopt_int(b, libc::SOL_SOCKET, libc::SO_SNDBUF, want);
    Ok(fd)
}

pub(super) fn setsockopt_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` is a live c_int and the length passed is its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            ptr::from_ref(&value).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub(super) fn bind_fd(fd: &OwnedFd, addr: &SocketAddr) -> io::Result<()> {
    // SAFETY: all-zero bytes are a valid sockaddr_in6.
    let mut storage: SockAddrBuf = unsafe { mem::zeroed() };
    let len = write_sockaddr(addr, &mut storage);
    // SAFETY: `storage` holds a sockaddr of `len` bytes and outlives the call.
    let r = unsafe { libc::bind(fd.as_raw_fd(), ptr::from_ref(&storage).cast(), len) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Control-message buffer of one outgoing GSO message, aligned for `cmsghdr`.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub(super) struct GsoCtrl(pub(super) [u8; GSO_CTRL_LEN]);

/// `CMSG_SPACE(sizeof(u16))`: the `msg_controllen` of a GSO message.
// SAFETY: CMSG_SPACE is pure arithmetic on its argument.
pub(super) const GSO_CMSG_SPACE: usize = unsafe { libc::CMSG_SPACE(2) } as usize;

/// Offset of a control message's data after its header (`CMSG_DATA`).
pub(super) const CMSG_DATA_OFFSET: usize =
    mem::size_of::<libc::cmsghdr>().next_multiple_of(mem::size_of::<usize>());

const _: () = assert!(GSO_CMSG_SPACE <= GSO_CTRL_LEN && CMSG_DATA_OFFSET + 2 <= GSO_CMSG_SPACE);

/// Writes the `UDP_SEGMENT` control message (segment size `seg`) into `ctrl`.
pub(super) fn write_gso_cmsg(ctrl: &mut GsoCtrl, seg: u16) {
    // SAFETY: all-zero bytes are a valid cmsghdr (plain integers).
    let mut h: libc::cmsghdr = unsafe { mem::zeroed() };
    // SAFETY: CMSG_LEN is pure arithmetic on its argument.
    h.cmsg_len = unsafe { libc::CMSG_LEN(2) } as _;
    h.cmsg_level = libc::SOL_UDP;
    h.cmsg_type = libc::UDP_SEGMENT;
    // SAFETY: `ctrl.0` holds GSO_CTRL_LEN ≥ size_of::<cmsghdr>() bytes (const assertion
    // above); `write_unaligned` needs no alignment.
    unsafe { ptr::write_unaligned(ctrl.0.as_mut_ptr().cast::<libc::cmsghdr>(), h) };
    ctrl.0[CMSG_DATA_OFFSET..CMSG_DATA_OFFSET + 2].copy_from_slice(&seg.to_ne_bytes());
}

/// Errors with which the kernel refuses GSO itself: no `UDP_SEGMENT` (`ENOPROTOOPT`, before
/// 4.18), no checksum offload or xfrm on the route (`EIO`), a segment size the route cannot
/// carry or another GSO constraint (`EINVAL`).
pub(super) fn gso_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT)
    )
}

/// Length of the GSO run that starts at `chunk[0]` (`lens[i]` = bytes of `chunk[i]`):
/// datagrams to one destination with `lens[0]` bytes each, the last possibly shorter, at
/// most GSO_MAX_SEGMENTS and GSO_MAX_BYTES in all; 1 (a plain datagram) when that run is
/// shorter than GSO_MIN_SEGMENTS or `dst_ok` refuses the destination.
pub(super) fn gso_run(
    chunk: &[TxDatagram<'_>],
    lens: &[usize],
    dst_ok: impl Fn(&SocketAddr) -> bool,
) -> usize {
    let seg = lens[0];
    if seg == 0 || seg > usize::from(u16::MAX) || !dst_ok(&chunk[0].dst) {
        return 1;
    }
    let mut total = seg;
    let mut run = 1;
    while run < chunk.len().min(lens.len()) && run < GSO_MAX_SEGMENTS {
        let len = lens[run];
        if chunk[run].dst != chunk[0].dst || len == 0 || len > seg || total + len > GSO_MAX_BYTES {
            break;
        }
        total += len;
        run += 1;
        if len < seg {
            break; // a shorter datagram can only be the last segment
        }
    }
    if run >= GSO_MIN_SEGMENTS { run } else { 1 }
}

/// Reads the socket address the kernel wrote into `storage` (`len` bytes); `None` for other
/// families or short lengths.
pub(super) fn read_sockaddr(
    storage: &libc::sockaddr_storage,
    len: libc::socklen_t,
) -> Option<SocketAddr> {
    let len = len as usize;
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET if len >= mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, which fits in and is
            // no more aligned than sockaddr_storage; read by value.
            let sin = unsafe { ptr::read(ptr::from_ref(storage).cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len >= mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { ptr::read(ptr::from_ref(storage).cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `ip:port`; an IPv6 link-local address gets the receiving interface as scope, as the
/// kernel does for source addresses.
pub(super) fn with_port(ip: IpAddr, port: u16, ifindex: u32) -> SocketAddr {
    match ip {
        IpAddr::V4(a) => SocketAddr::V4(SocketAddrV4::new(a, port)),
        IpAddr::V6(a) => {
            let link_local = a.segments()[0] & 0xFFC0 == 0xFE80;
            let scope = if link_local { ifindex } else { 0 };
            SocketAddr::V6(SocketAddrV6::new(a, port, 0, scope))
        }
    }
}

/// What the receive control messages said.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct CmsgInfo {
    /// Destination address of the datagram (`IP_PKTINFO.ipi_addr` / `IPV6_PKTINFO`).
    pub(super) dst: Option<IpAddr>,
    /// Receiving interface.
    pub(super) ifindex: u32,
    /// `SO_RXQ_OVFL`: the socket's cumulative drop count when the datagram was queued.
    pub(super) drops: Option<u32>,
    /// `UDP_GRO`: the buffer holds datagrams of this size (the last may be shorter).
    pub(super) gro_seg: Option<u32>,
}

/// Parses a received control buffer (the `msg_controllen` bytes the kernel filled) without
/// trusting it: malformed or truncated messages end the walk.
pub(super) fn parse_cmsgs(buf: &[u8]) -> CmsgInfo {
    let hdr_len = mem::size_of::<libc::cmsghdr>();
    let align = mem::size_of::<usize>();
    let mut info = CmsgInfo::default();
    let mut off = 0;
    while let Some(rest) = buf.get(off..).filter(|r| r.len() >= hdr_len) {
        // SAFETY: `rest` holds at least size_of::<cmsghdr>() bytes; cmsghdr is plain integers,
        // valid for any bytes, and `read_unaligned` needs no alignment.
        let h = unsafe { ptr::read_unaligned(rest.as_ptr().cast::<libc::cmsghdr>()) };
        let len = h.cmsg_len as usize;
        if len < hdr_len || len > rest.len() {
            break;
        }
        // Data starts after the header rounded up to the alignment (CMSG_DATA).
        let data_off = hdr_len.next_multiple_of(align);
        let data = rest.get(data_off..len).unwrap_or(&[]);
        match (h.cmsg_level, h.cmsg_type) {
            (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => {
                if let Some(b) = data.get(..4) {
                    info.drops = Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                }
            }
            (libc::SOL_UDP, libc::UDP_GRO) => {
                if let Some(b) = data.get(..4) {
                    info.gro_seg = Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                }
            }
            (libc::IPPROTO_IP, libc::IP_PKTINFO)
                if data.len() >= mem::size_of::<libc::in_pktinfo>() =>
            {
                // SAFETY: `data` holds a whole in_pktinfo (plain integers); unaligned read.
                let p = unsafe { ptr::read_unaligned(data.as_ptr().cast::<libc::in_pktinfo>()) };
                info.dst = Some(IpAddr::V4(Ipv4Addr::from(p.ipi_addr.s_addr.to_ne_bytes())));
                info.ifindex = p.ipi_ifindex as u32;
            }
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO)
                if data.len() >= mem::size_of::<libc::in6_pktinfo>() =>
            {
                // SAFETY: `data` holds a whole in6_pktinfo (plain data); unaligned read.
                let p = unsafe { ptr::read_unaligned(data.as_ptr().cast::<libc::in6_pktinfo>()) };
                info.dst = Some(IpAddr::V6(Ipv6Addr::from(p.ipi6_addr.s6_addr)));
                info.ifindex = p.ipi6_ifindex;
            }
            _ => {}
        }
        off += len.next_multiple_of(align);
    }
    info
}

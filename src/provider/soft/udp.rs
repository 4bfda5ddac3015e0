//! Non-blocking UDP endpoint for RoCEv2 datagrams (rc-transport.md §1.1), and the ICRC
//! framing of the soft provider (§7).
//!
//! [`UdpPort`] wraps one unconnected UDP socket and moves datagrams in batches: one
//! `sendmmsg` per [`UdpPort::send_batch`] (up to [`SEND_CHUNK`] datagrams, each gathered from
//! up to three parts, so a payload can be sent straight from registered memory) and one
//! `recvmmsg` per [`UdpPort::recv_batch`] into the preallocated slots of an [`RxBatch`].
//!
//! Socket setup, and why:
//! * `IP_MTU_DISCOVER = IP_PMTUDISC_DO` (IPv4): DF is set and, because the socket is never
//!   connected, Linux writes IP identification 0 (`ip_select_ident`). The ICRC covers the
//!   identification, and a receiving UDP socket cannot see it, so both ends assume 0
//!   ([`crate::wire::icrc::ipv4_headers`]). Never `connect()` this socket: a connected socket
//!   uses a per-socket ID counter. Too-large datagrams fail with `EMSGSIZE` rather than being
//!   fragmented.
//! * IPv6: `IPV6_V6ONLY` (an IPv6 port never sees IPv4-mapped traffic, whose ICRC would be the
//!   IPv4 one), `IPV6_MTU_DISCOVER = IPV6_PMTUDISC_DO` and `IPV6_DONTFRAG`.
//! * `IP_PKTINFO` / `IPV6_RECVPKTINFO`: the destination address of each datagram, which the
//!   ICRC covers, also when the port is bound to a wildcard address.
//! * `SO_RXQ_OVFL`: the kernel's receive-queue drop counter, read from a control message.
//! * `SO_RCVBUF` / `SO_SNDBUF` raised to [`SOCKET_BUFFER_BYTES`], best effort (the kernel caps
//!   them at `net.core.rmem_max` / `wmem_max`; [`UdpPort::buffer_sizes`] says what was got).
//!
//! Segmentation offloads (Linux ≥ 4.18 and ≥ 5.0), both opt-in so that plain
//! [`UdpPort::send_batch`] / [`UdpPort::recv_batch`] users see no change:
//! * GSO ([`UdpPort::send_batch_gso`]): a run of at least [`GSO_MIN_SEGMENTS`] consecutive
//!   datagrams to one destination with one length (the last may be shorter) goes as ONE
//!   message with a `UDP_SEGMENT` control message; the kernel cuts it into exactly the
//!   datagrams the plain path would send (per-segment IP/UDP lengths, same addresses and
//!   ports). On loopback it is never cut on the way out: the receiver gets the segments (or,
//!   with GRO, the whole message), and a capture on `lo` shows one super-frame. IPv4 caveat:
//!   when the kernel does cut it (software GSO on a real interface) it numbers the segments'
//!   IP identification 0, 1, 2, ... while the ICRC of every segment assumes 0 (see above), so
//!   segments after the first would carry a wrong ICRC for a receiver that checks the real
//!   header (rxe, a RoCE NIC, a capture). IPv4 GSO is therefore used only towards destinations
//!   that are delivered locally (loopback, or the port's own address); IPv6 has no
//!   identification field and uses GSO towards any destination. Kernels without it
//!   (`ENOPROTOOPT` on the probe, `EIO`/`EINVAL` on a send) turn GSO off for the port, logged
//!   once; the datagrams then go one by one.
//! * GRO ([`UdpPort::enable_gro`]): the kernel may deliver several datagrams of one flow as one
//!   buffer with a `UDP_GRO` control message giving the segment size; [`UdpPort::recv_batch`]
//!   splits it, so [`RxBatch::get`] still yields single datagrams. The batch's slots must then
//!   hold [`MAX_RX_SLOT_LEN`] bytes ([`RxBatch::for_gro`]). On loopback this is what lets a GSO
//!   message reach the receiving socket unsegmented: one skb, one copy, one set of cmsgs.
//!
//! The ICRC covers the source address, which [`seal`] must know before the kernel picks it:
//! bind sending ports to a concrete address ([`UdpPort::bind_qp_port`] on the local IP);
//! a port bound to a wildcard address gets its source address from routing.
//!
//! Linux only (`sendmmsg`, `recvmmsg`, `SO_RXQ_OVFL`, `UDP_SEGMENT`, `UDP_GRO`).

use std::fmt;
use std::io;
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use crate::wire::icrc::{self, Icrc};
use crate::wire::{BTH_LEN, ICRC_LEN};

/// Requested size of the socket send and receive buffers (the kernel doubles the request and
/// caps it at `net.core.{r,w}mem_max` × 2).
pub const SOCKET_BUFFER_BYTES: usize = 4 << 20;

/// Datagrams per `sendmmsg` call; [`UdpPort::send_batch`] splits larger batches.
pub const SEND_CHUNK: usize = 64;

/// Most slots an [`RxBatch`] holds (the kernel's `recvmmsg` limit, `UIO_MAXIOV`).
pub const MAX_RX_SLOTS: usize = 1024;

/// Largest slot an [`RxBatch`] allocates (no UDP payload is larger).
pub const MAX_RX_SLOT_LEN: usize = 65536;

/// Fewest consecutive equal datagrams that [`UdpPort::send_batch_gso`] sends as one GSO
/// message; shorter runs go as plain datagrams. Two or three segments save little (one
/// skb and one cmsg walk each), and a capture on `lo` then shows super-frames for short
/// multi-packet messages (e.g. the MIDDLE packets of a 4-packet READ response) too.
pub const GSO_MIN_SEGMENTS: usize = 4;

/// Most segments in one GSO message (the kernel's `UDP_MAX_SEGMENTS`).
pub const GSO_MAX_SEGMENTS: usize = 64;

/// Most bytes in one GSO message: the UDP payload of one IPv4 packet (65535 - 20 - 8); the
/// kernel refuses larger ones with `EMSGSIZE`.
pub const GSO_MAX_BYTES: usize = 65507;

/// First per-QP UDP source port (rxe: `0xC000 + (hash(qpn) & 0x3FFF)`).
pub const QP_PORT_BASE: u16 = 0xC000;

/// Number of per-QP source ports (0xC000..=0xFFFF).
const QP_PORT_COUNT: u32 = 0x4000;

/// IB bytes `icrc_parts` hashes together with the IP and UDP headers: the longest RC header
/// (BTH + RETH + ImmDt = 32).
const ICRC_PREFIX_IB: usize = 32;
/// Its buffer: IPv6 header + UDP header + `ICRC_PREFIX_IB`.
const ICRC_PREFIX_MAX: usize = icrc::IPV6_HEADER_LEN + icrc::UDP_HEADER_LEN + ICRC_PREFIX_IB;

/// Control-message space per received datagram: `in6_pktinfo` (20 B), the `SO_RXQ_OVFL`
/// `u32` and the `UDP_GRO` `int`, each with a 16-byte header and 8-byte alignment, need 88;
/// the rest is headroom.
const RX_CTRL_LEN: usize = 128;

/// Control-message space of one outgoing GSO message (`UDP_SEGMENT`, a `u16`:
/// `CMSG_SPACE(2)` = 24 on 64-bit Linux).
const GSO_CTRL_LEN: usize = 32;

/// [`UdpPort`] offload states (`gso`, `gro`).
const OFFLOAD_UNKNOWN: u8 = 0;
const OFFLOAD_ON: u8 = 1;
const OFFLOAD_OFF: u8 = 2;

/// Parts of one outgoing datagram, sent in this order (`[head, payload, tail]` for a
/// [`crate::rc::emit::TxParts`] packet). Empty parts are skipped.
#[derive(Debug, Clone, Copy)]
pub struct TxDatagram<'a> {
    /// Destination; must be of the port's address family.
    pub dst: SocketAddr,
    /// The datagram, gathered from these three slices.
    pub parts: [&'a [u8]; 3],
}

/// One received datagram, borrowed from an [`RxBatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RxDatagram<'a> {
    /// Sender's address and port.
    pub src: SocketAddr,
    /// Address the datagram was sent to (from `IP_PKTINFO`/`IPV6_PKTINFO`; the port's bound
    /// address when the kernel gave none) with the port's local port.
    pub dst: SocketAddr,
    /// The UDP payload.
    pub data: &'a [u8],
}

/// A UDP socket for RoCEv2 datagrams; see the module documentation for its options.
#[derive(Debug)]
pub struct UdpPort {
    sock: UdpSocket,
    local: SocketAddr,
    /// Cumulative `SO_RXQ_OVFL` drops, extended from the kernel's wrapping `u32`.
    drops: AtomicU64,
    /// Datagrams received truncated (larger than the slot) and dropped here.
    truncated: AtomicU64,
    /// GSO: not probed yet, usable, or unavailable (OFFLOAD_*).
    gso: AtomicU8,
    /// GRO: not asked for, on, or unavailable (OFFLOAD_*).
    gro: AtomicU8,
    /// The one log line about a missing offload was written.
    offload_logged: AtomicBool,
}

impl UdpPort {
    /// Binds `addr` (port 0: any free port) and configures the socket (module documentation).
    pub fn bind(addr: SocketAddr) -> io::Result<UdpPort> {
        let fd = open_socket(addr.is_ipv4())?;
        bind_fd(&fd, &addr)?;
        UdpPort::from_bound(fd)
    }

    /// Binds a per-QP source port in 0xC000..=0xFFFF on `ip`: first 0xC000 + (hint & 0x3FFF),
    /// then the following ports, wrapping inside the range, until one is free.
    /// `AddrInUse` if all 16384 are taken; other bind errors (e.g. `AddrNotAvailable` for an
    /// address not on this host) are returned at once.
    pub fn bind_qp_port(ip: IpAddr, hint: u32) -> io::Result<UdpPort> {
        let fd = open_socket(ip.is_ipv4())?;
        let first = hint & (QP_PORT_COUNT - 1);
        for k in 0..QP_PORT_COUNT {
            let port = QP_PORT_BASE + ((first + k) & (QP_PORT_COUNT - 1)) as u16;
            match bind_fd(&fd, &SocketAddr::new(ip, port)) {
                Ok(()) => return UdpPort::from_bound(fd),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            "every UDP port in 0xC000..=0xFFFF is in use on this address",
        ))
    }

    fn from_bound(fd: OwnedFd) -> io::Result<UdpPort> {
        let sock = UdpSocket::from(fd);
        let local = sock.local_addr()?;
        Ok(UdpPort {
            sock,
            local,
            drops: AtomicU64::new(0),
            truncated: AtomicU64::new(0),
            gso: AtomicU8::new(OFFLOAD_UNKNOWN),
            gro: AtomicU8::new(OFFLOAD_UNKNOWN),
            offload_logged: AtomicBool::new(false),
        })
    }

    /// The bound address (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The socket descriptor, for `epoll`/`poll` by the progress loop. Do not `connect` it.
    pub fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// The socket's actual (receive, send) buffer sizes in bytes, as the kernel reports them.
    pub fn buffer_sizes(&self) -> io::Result<(usize, usize)> {
        let fd = self.sock.as_fd();
        let rcv = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF)?;
        let snd = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF)?;
        Ok((
            usize::try_from(rcv).unwrap_or(0),
            usize::try_from(snd).unwrap_or(0),
        ))
    }

    /// Datagrams the kernel dropped on this socket's receive queue, cumulative (from the
    /// `SO_RXQ_OVFL` control message; it is updated when a later datagram is received).
    pub fn kernel_drops(&self) -> u64 {
        self.drops.load(Ordering::Relaxed)
    }

    /// Datagrams dropped by [`UdpPort::recv_batch`] because they did not fit their slot.
    pub fn truncated_drops(&self) -> u64 {
        self.truncated.load(Ordering::Relaxed)
    }

    /// Sends `batch` with one `sendmmsg` per [`SEND_CHUNK`] datagrams (`sendto` semantics: the
    /// socket stays unconnected). Returns how many datagrams, from the front, were sent:
    /// fewer than `batch.len()` (possibly 0) when the send buffer is full, or when a later
    /// datagram fails (the caller retries the rest; a persistent failure then comes back as
    /// `Err` for the first one).
    ///
    /// `Err` means `batch[0]` could not be sent and nothing was: e.g. `EMSGSIZE` (larger than
    /// the path MTU; DF is set), `ENETUNREACH`, or `InvalidInput` for a destination of the
    /// other address family. The caller decides whether to drop that datagram.
    pub fn send_batch(&self, batch: &[TxDatagram<'_>]) -> io::Result<usize> {
        self.send_batch_with(batch, false)
    }

    /// [`UdpPort::send_batch`] with UDP GSO: each run of at least [`GSO_MIN_SEGMENTS`]
    /// consecutive datagrams to one destination with one length (the run's last datagram
    /// may be shorter; at most [`GSO_MAX_SEGMENTS`] and [`GSO_MAX_BYTES`] per run) goes as
    /// one message that the kernel segments into exactly those datagrams; the rest go as
    /// plain datagrams, all in one `sendmmsg` per [`SEND_CHUNK`] datagrams. IPv4 runs only
    /// towards locally delivered destinations (module documentation). Same return value and
    /// errors as `send_batch`, counted in datagrams; a partial send never splits a run. Where
    /// the kernel lacks GSO this is `send_batch` (logged once).
    pub fn send_batch_gso(&self, batch: &[TxDatagram<'_>]) -> io::Result<usize> {
        self.send_batch_with(batch, true)
    }

    /// True while this port sends GSO messages (false before the first
    /// [`UdpPort::send_batch_gso`] probed the kernel, and after GSO failed).
    pub fn gso_active(&self) -> bool {
        self.gso.load(Ordering::Relaxed) == OFFLOAD_ON
    }

    fn send_batch_with(&self, batch: &[TxDatagram<'_>], gso: bool) -> io::Result<usize> {
        let gso = gso && self.gso_usable();
        let mut sent = 0;
        for chunk in batch.chunks(SEND_CHUNK) {
            // Chunks too short for a GSO run take the plain path (fewer arrays to set up).
            let r = if gso && chunk.len() >= GSO_MIN_SEGMENTS {
                self.send_chunk_gso(chunk)
            } else {
                self.send_chunk(chunk)
            };
            let n = match r {
                Ok(n) => n,
                // The error belongs to chunk[0]; it is retried (and reported) next call.
                Err(_) if sent > 0 => return Ok(sent),
                Err(e) => return Err(e),
            };
            sent += n;
            if n < chunk.len() {
                break;
            }
        }
        Ok(sent)
    }

    /// Probes UDP_SEGMENT once per port (`getsockopt`; `ENOPROTOOPT` before Linux 4.18).
    fn gso_usable(&self) -> bool {
        match self.gso.load(Ordering::Relaxed) {
            OFFLOAD_ON => true,
            OFFLOAD_OFF => false,
            _ => match getsockopt_int(self.sock.as_fd(), libc::SOL_UDP, libc::UDP_SEGMENT) {
                Ok(_) => {
                    self.gso.store(OFFLOAD_ON, Ordering::Relaxed);
                    true
                }
                Err(e) => {
                    self.gso_failed(&e);
                    false
                }
            },
        }
    }

    /// GSO does not work here: off for the life of the port, logged once per port.
    fn gso_failed(&self, e: &io::Error) {
        self.gso.store(OFFLOAD_OFF, Ordering::Relaxed);
        if !self.offload_logged.swap(true, Ordering::Relaxed) {
            log::warn!(
                target: "rdmx::soft",
                "UDP {}: GSO (UDP_SEGMENT) unavailable ({e}); sending datagrams one by one",
                self.local
            );
        }
    }

    /// May a GSO message go to `dst`? IPv6: yes. IPv4: only when it is delivered locally,
    /// where the kernel never cuts it into IP packets with identification 0, 1, 2, ...
    fn gso_dst_ok(&self, dst: &SocketAddr) -> bool {
        match dst.ip() {
            IpAddr::V6(_) => true,
            IpAddr::V4(ip) => ip.is_loopback() || IpAddr::V4(ip) == self.local.ip(),
        }
    }

    fn send_chunk(&self, chunk: &[TxDatagram<'_>]) -> io::Result<usize> {
        debug_assert!(chunk.len() <= SEND_CHUNK);
        if chunk.is_empty() {
            return Ok(0);
        }
        // SAFETY: sockaddr_in6, iovec and mmsghdr are plain C structs for which all-zero bytes
        // are a valid value (null pointers, zero lengths).
        let mut names: [SockAddrBuf; SEND_CHUNK] = unsafe { mem::zeroed() };
        // SAFETY: as above.
        let mut iovs: [libc::iovec; SEND_CHUNK * 3] = unsafe { mem::zeroed() };
        // SAFETY: as above.
        let mut hdrs: [libc::mmsghdr; SEND_CHUNK] = unsafe { mem::zeroed() };

        // Fill the addresses and iovecs first, then point the headers at them through one
        // base pointer each (no later `&mut` borrow invalidates the pointers).
        let v4 = self.local.is_ipv4();
        let mut count = chunk.len();
        let mut namelens = [0 as libc::socklen_t; SEND_CHUNK];
        let mut niovs = [0usize; SEND_CHUNK];
        for (i, d) in chunk.iter().enumerate() {
            if d.dst.is_ipv4() != v4 {
                if i == 0 {
                    return Err(invalid(
                        "destination address family differs from the port's",
                    ));
                }
                // Send the ones before it; the caller meets the error on its next call.
                count = i;
                break;
            }
            namelens[i] = write_sockaddr(&d.dst, &mut names[i]);
            for part in d.parts.iter().filter(|p| !p.is_empty()) {
                iovs[i * 3 + niovs[i]] = libc::iovec {
                    iov_base: part.as_ptr() as *mut libc::c_void,
                    iov_len: part.len(),
                };
                niovs[i] += 1;
            }
        }
        let names_base = names.as_mut_ptr();
        let iovs_base = iovs.as_mut_ptr();
        for (i, hdr) in hdrs[..count].iter_mut().enumerate() {
            let h = &mut hdr.msg_hdr;
            h.msg_name = names_base.wrapping_add(i).cast();
            h.msg_namelen = namelens[i];
            h.msg_iov = iovs_base.wrapping_add(i * 3);
            h.msg_iovlen = niovs[i] as _;
        }
        self.sendmmsg(&mut hdrs[..count])
    }

    /// `send_chunk` with GSO runs (`gso_run`) as single messages.
    fn send_chunk_gso(&self, chunk: &[TxDatagram<'_>]) -> io::Result<usize> {
        debug_assert!(chunk.len() <= SEND_CHUNK);
        if chunk.is_empty() {
            return Ok(0);
        }
        // SAFETY: sockaddr_in6, iovec and mmsghdr are plain C structs for which all-zero bytes
        // are a valid value (null pointers, zero lengths).
        let mut names: [SockAddrBuf; SEND_CHUNK] = unsafe { mem::zeroed() };
        // SAFETY: as above.
        let mut iovs: [libc::iovec; SEND_CHUNK * 3] = unsafe { mem::zeroed() };
        // SAFETY: as above.
        let mut hdrs: [libc::mmsghdr; SEND_CHUNK] = unsafe { mem::zeroed() };
        let mut ctrls = [GsoCtrl([0; GSO_CTRL_LEN]); SEND_CHUNK / GSO_MIN_SEGMENTS];

        // Fill the iovecs (packed: datagram i's are iovs[first_iov[i]..first_iov[i + 1]]),
        // then group datagrams into messages, then point the headers at addresses, iovecs
        // and control buffers through one base pointer each (no later `&mut` borrow
        // invalidates the pointers).
        let v4 = self.local.is_ipv4();
        let mut count = chunk.len();
        let mut first_iov = [0usize; SEND_CHUNK + 1];
        let mut lens = [0usize; SEND_CHUNK];
        let mut niov = 0;
        for (i, d) in chunk.iter().enumerate() {
            if d.dst.is_ipv4() != v4 {
                if i == 0 {
                    return Err(invalid(
                        "destination address family differs from the port's",
                    ));
                }
                // Send the ones before it; the caller meets the error on its next call.
                count = i;
                break;
            }
            first_iov[i] = niov;
            for part in d.parts.iter().filter(|p| !p.is_empty()) {
                iovs[niov] = libc::iovec {
                    iov_base: part.as_ptr() as *mut libc::c_void,
                    iov_len: part.len(),
                };
                niov += 1;
                lens[i] += part.len();
            }
        }
        first_iov[count] = niov;

        // Messages: (first datagram, datagrams, control buffer); more than one datagram =
        // a GSO message. At most SEND_CHUNK / GSO_MIN_SEGMENTS of those, so `ctrls` suffices.
        let mut msgs = [(0usize, 0usize, 0usize); SEND_CHUNK];
        let mut namelens = [0 as libc::socklen_t; SEND_CHUNK];
        let mut nmsg = 0;
        let mut nctrl = 0;
        let mut i = 0;
        while i < count {
            let run = gso_run(&chunk[i..count], &lens[i..count], |d| self.gso_dst_ok(d));
            namelens[nmsg] = write_sockaddr(&chunk[i].dst, &mut names[nmsg]);
            msgs[nmsg] = (i, run, nctrl);
            if run > 1 {
                write_gso_cmsg(&mut ctrls[nctrl], lens[i] as u16);
                nctrl += 1;
            }
            nmsg += 1;
            i += run;
        }

        let names_base = names.as_mut_ptr();
        let iovs_base = iovs.as_mut_ptr();
        let ctrls_base = ctrls.as_mut_ptr();
        for (m, &(first, run, ctrl)) in msgs[..nmsg].iter().enumerate() {
            let h = &mut hdrs[m].msg_hdr;
            h.msg_name = names_base.wrapping_add(m).cast();
            h.msg_namelen = namelens[m];
            h.msg_iov = iovs_base.wrapping_add(first_iov[first]);
            h.msg_iovlen = (first_iov[first + run] - first_iov[first]) as _;
            if run > 1 {
                h.msg_control = ctrls_base.wrapping_add(ctrl).cast();
                h.msg_controllen = GSO_CMSG_SPACE as _;
            }
        }
        match self.sendmmsg(&mut hdrs[..nmsg]) {
            Ok(done) => Ok(msgs[..done.min(nmsg)].iter().map(|m| m.1).sum()),
            Err(e) if msgs[0].1 > 1 && gso_unsupported(&e) => {
                // The kernel refused the first message, a GSO one. Send the chunk plain; if
                // that works, GSO itself was the problem (no checksum offload on the route,
                // xfrm, an old kernel): off for this port. If the plain send fails too (e.g.
                // EMSGSIZE: the datagrams exceed the path MTU), that is the caller's error.
                let plain = self.send_chunk(&chunk[..count]);
                if matches!(plain, Ok(n) if n > 0) {
                    self.gso_failed(&e);
                }
                plain
            }
            Err(e) => Err(e),
        }
    }

    fn sendmmsg(&self, hdrs: &mut [libc::mmsghdr]) -> io::Result<usize> {
        loop {
            // SAFETY: every header points at a sockaddr, iovecs and (GSO) a control buffer
            // that live in the caller's stack frame with the lengths set in the header, and
            // the iovecs at slices borrowed for the duration of this call;
            // the kernel only reads them (and writes msg_len inside `hdrs`). `hdrs.len()` is
            // at most SEND_CHUNK, so it fits c_uint.
            let r = unsafe {
                libc::sendmmsg(
                    self.raw_fd(),
                    hdrs.as_mut_ptr(),
                    hdrs.len() as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r >= 0 {
                return Ok(r as usize);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(e),
            }
        }
    }

    /// Receives up to `rx.capacity()` messages with one `recvmmsg` (non-blocking) into `rx`,
    /// replacing its previous contents. A message is one datagram, or with GRO
    /// ([`UdpPort::enable_gro`]) several, split here. Returns how many datagrams were received
    /// ([`RxBatch::len`]; `Ok(0)`: nothing queued; [`RxBatch::messages`] counts the filled
    /// slots). A filled slot whose datagram was truncated (longer than the slot) or had an
    /// unusable source address yields `None` from [`RxBatch::get`] and counts in
    /// [`UdpPort::truncated_drops`] (truncation only). Updates [`UdpPort::kernel_drops`].
    /// `Err` is a socket error (rare on an unconnected UDP socket); the port stays usable.
    pub fn recv_batch(&self, rx: &mut RxBatch) -> io::Result<usize> {
        rx.filled = 0;
        rx.messages = 0;
        rx.meta.clear();
        if rx.slots == 0 {
            return Ok(0);
        }
        rx.prepare();
        let n = loop {
            // SAFETY: `prepare` pointed every header at this batch's own name, control and
            // data buffers (iovec lengths = slot_len, controllen = RX_CTRL_LEN, namelen =
            // size of sockaddr_storage), which stay alive and unaliased for the call since
            // `rx` is borrowed mutably. `rx.slots` ≤ MAX_RX_SLOTS fits c_uint.
            let r = unsafe {
                libc::recvmmsg(
                    self.raw_fd(),
                    rx.hdrs.as_mut_ptr(),
                    rx.slots as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    ptr::null_mut(),
                )
            };
            if r >= 0 {
                break (r as usize).min(rx.slots);
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(0),
                _ => return Err(e),
            }
        };
        for i in 0..n {
            let h = &rx.hdrs[i];
            let len = (h.msg_len as usize).min(rx.slot_len);
            let flags = h.msg_hdr.msg_flags;
            let namelen = h.msg_hdr.msg_namelen;
            let ctrl_len = h.msg_hdr.msg_controllen.min(RX_CTRL_LEN);
            let info = parse_cmsgs(&rx.ctrl[i].0[..ctrl_len]);
            if let Some(raw) = info.drops {
                self.note_drops(raw);
            }
            let truncated = flags & libc::MSG_TRUNC != 0;
            if truncated {
                self.truncated.fetch_add(1, Ordering::Relaxed);
            }
            let src = read_sockaddr(&rx.names[i], namelen);
            let dst = match info.dst {
                Some(ip) => with_port(ip, self.local.port(), info.ifindex),
                None => self.local,
            };
            let start = i * rx.slot_len;
            // A GRO buffer: datagrams of `seg` bytes each, the last possibly shorter.
            let seg = match info.gro_seg {
                Some(g) if !truncated && g > 0 && (g as usize) < len => g as usize,
                _ => len.max(1),
            };
            let mut off = 0;
            loop {
                let part = seg.min(len - off);
                rx.meta.push(RxMeta {
                    src,
                    dst,
                    start: start + off,
                    len: part,
                    truncated,
                });
                off += part;
                if off >= len {
                    break;
                }
            }
        }
        rx.messages = n;
        rx.filled = rx.meta.len();
        Ok(rx.filled)
    }

    /// Turns on UDP GRO (`UDP_GRO`, Linux ≥ 5.0): from now on the kernel may deliver several
    /// datagrams of one flow (on loopback: a whole GSO message) as one buffer, which
    /// [`UdpPort::recv_batch`] splits again. Every [`RxBatch`] used with this port must then
    /// have slots of [`MAX_RX_SLOT_LEN`] bytes ([`RxBatch::for_gro`]): a smaller slot would
    /// truncate (and drop) coalesced buffers. Returns whether GRO is on; a kernel without it
    /// leaves it off for the port, logged once, and later calls return false at once.
    pub fn enable_gro(&self) -> bool {
        match self.gro.load(Ordering::Relaxed) {
            OFFLOAD_ON => return true,
            OFFLOAD_OFF => return false,
            _ => {}
        }
        match setsockopt_int(self.sock.as_fd(), libc::SOL_UDP, libc::UDP_GRO, 1) {
            Ok(()) => {
                self.gro.store(OFFLOAD_ON, Ordering::Relaxed);
                true
            }
            Err(e) => {
                self.gro.store(OFFLOAD_OFF, Ordering::Relaxed);
                if !self.offload_logged.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        target: "rdmx::soft",
                        "UDP {}: GRO (UDP_GRO) unavailable ({e}); receiving datagrams one by one",
                        self.local
                    );
                }
                false
            }
        }
    }

    /// True once [`UdpPort::enable_gro`] turned GRO on.
    pub fn gro_active(&self) -> bool {
        self.gro.load(Ordering::Relaxed) == OFFLOAD_ON
    }

    /// Folds the kernel's cumulative, wrapping `u32` drop count into the `u64` total. Counts
    /// that go backwards (a datagram queued before one already seen, read by another thread)
    /// are ignored.
    fn note_drops(&self, raw: u32) {
        let _ = self
            .drops
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cur| {
                let delta = raw.wrapping_sub(cur as u32);
                if delta == 0 || delta > u32::MAX / 2 {
                    None
                } else {
                    Some(cur.wrapping_add(u64::from(delta)))
                }
            });
    }
}

impl AsFd for UdpPort {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl AsRawFd for UdpPort {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

#[derive(Debug, Clone, Copy)]
struct RxMeta {
    src: Option<SocketAddr>,
    dst: SocketAddr,
    /// Offset of the datagram in `RxBatch::buf`.
    start: usize,
    len: usize,
    truncated: bool,
}

/// Control-message buffer of one slot, aligned for `cmsghdr`.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct CtrlBuf([u8; RX_CTRL_LEN]);

/// Preallocated receive space for [`UdpPort::recv_batch`]: `slots` buffers of `slot_len`
/// bytes, with their address and control-message space. Reused across calls; no allocation
/// after [`RxBatch::new`] except that the per-datagram index grows to the most datagrams
/// one receive split out of GRO buffers (at most 64 per slot).
pub struct RxBatch {
    slots: usize,
    slot_len: usize,
    /// Datagrams (entries of `meta`) of the last receive.
    filled: usize,
    /// Slots (messages) filled by the last receive.
    messages: usize,
    buf: Vec<u8>,
    names: Vec<libc::sockaddr_storage>,
    ctrl: Vec<CtrlBuf>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    meta: Vec<RxMeta>,
}

// SAFETY: the raw pointers in `iovs` and `hdrs` only ever point into this batch's own heap
// buffers, are rewritten by `prepare` before each `recvmmsg`, and are never dereferenced by
// Rust code; everything else is owned plain data. Moving the batch to another thread or
// sharing `&RxBatch` (which only reads `buf` and `meta`) is therefore sound.
unsafe impl Send for RxBatch {}
// SAFETY: see the `Send` impl: `&RxBatch` gives no access to the raw pointers.
unsafe impl Sync for RxBatch {}

impl RxBatch {
    /// Space for `slots` datagrams of up to `slot_len` bytes each. `slots` is capped at
    /// [`MAX_RX_SLOTS`] and `slot_len` at [`MAX_RX_SLOT_LEN`]; a datagram longer than
    /// `slot_len` is dropped (truncated).
    pub fn new(slots: usize, slot_len: usize) -> RxBatch {
        let slots = slots.min(MAX_RX_SLOTS);
        let slot_len = slot_len.min(MAX_RX_SLOT_LEN);
        RxBatch {
            slots,
            slot_len,
            filled: 0,
            messages: 0,
            buf: vec![0; slots * slot_len],
            // SAFETY: sockaddr_storage is plain data; all-zero bytes are a valid value.
            names: vec![unsafe { mem::zeroed() }; slots],
            ctrl: vec![CtrlBuf([0; RX_CTRL_LEN]); slots],
            iovs: vec![
                libc::iovec {
                    iov_base: ptr::null_mut(),
                    iov_len: 0,
                };
                slots
            ],
            // SAFETY: mmsghdr is plain data; all-zero bytes (null pointers) are valid.
            hdrs: vec![unsafe { mem::zeroed() }; slots],
            meta: Vec::with_capacity(slots),
        }
    }

    /// Space for `slots` messages of [`MAX_RX_SLOT_LEN`] bytes: what a port with GRO
    /// ([`UdpPort::enable_gro`]) needs. The memory is allocated zeroed and only the pages
    /// the kernel writes are touched.
    pub fn for_gro(slots: usize) -> RxBatch {
        RxBatch::new(slots, MAX_RX_SLOT_LEN)
    }

    /// How many messages (slots) one receive can return: datagrams, unless GRO coalesced
    /// some.
    pub fn capacity(&self) -> usize {
        self.slots
    }

    /// Size of each slot (the longest datagram that is kept).
    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Datagrams received by the last [`UdpPort::recv_batch`] (GRO buffers counted as the
    /// datagrams they hold).
    pub fn len(&self) -> usize {
        self.filled
    }

    /// Slots (messages) filled by the last [`UdpPort::recv_batch`]: fewer than
    /// [`RxBatch::capacity`] means the socket was drained.
    pub fn messages(&self) -> usize {
        self.messages
    }

    /// True when the last receive returned nothing.
    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    /// Datagram `i` of the last receive; `None` past [`RxBatch::len`], or when that datagram
    /// was truncated or its source address was not IPv4/IPv6 (both to be dropped).
    pub fn get(&self, i: usize) -> Option<RxDatagram<'_>> {
        if i >= self.filled {
            return None;
        }
        let m = self.meta.get(i)?;
        if m.truncated {
            return None;
        }
        Some(RxDatagram {
            src: m.src?,
            dst: m.dst,
            data: self.buf.get(m.start..m.start + m.len)?,
        })
    }

    /// The usable datagrams of the last receive (those [`RxBatch::get`] returns).
    pub fn iter(&self) -> impl Iterator<Item = RxDatagram<'_>> + '_ {
        (0..self.filled).filter_map(|i| self.get(i))
    }

    /// Points every header at its slot's buffers.
    fn prepare(&mut self) {
        // `wrapping_add` keeps this free of `unsafe`; every offset is in bounds (i < slots,
        // each vector holds `slots` elements, buf.len() == slots * slot_len). One base
        // pointer per vector, so no later borrow invalidates the pointers handed out.
        let base = self.buf.as_mut_ptr();
        for (i, iov) in self.iovs.iter_mut().enumerate() {
            *iov = libc::iovec {
                iov_base: base.wrapping_add(i * self.slot_len).cast(),
                iov_len: self.slot_len,
            };
        }
        let names = self.names.as_mut_ptr();
        let ctrl = self.ctrl.as_mut_ptr();
        let iovs = self.iovs.as_mut_ptr();
        for (i, h) in self.hdrs.iter_mut().enumerate() {
            h.msg_len = 0;
            h.msg_hdr.msg_name = names.wrapping_add(i).cast();
            h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_iov = iovs.wrapping_add(i);
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = ctrl.wrapping_add(i).cast();
            h.msg_hdr.msg_controllen = RX_CTRL_LEN as _;
            h.msg_hdr.msg_flags = 0;
        }
    }
}

impl fmt::Debug for RxBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RxBatch")
            .field("slots", &self.slots)
            .field("slot_len", &self.slot_len)
            .field("filled", &self.filled)
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------------------------
// ICRC framing

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

// ---------------------------------------------------------------------------------------------
// Socket plumbing

fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn wire_err(e: crate::wire::WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e)
}

/// A new non-blocking UDP socket with the options of the module documentation, unbound.
fn open_socket(v4: bool) -> io::Result<OwnedFd> {
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

fn setsockopt_int(
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

fn getsockopt_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live locals; `len` holds the size of `value`, which the
    // kernel writes at most.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            ptr::from_mut(&mut value).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

fn bind_fd(fd: &OwnedFd, addr: &SocketAddr) -> io::Result<()> {
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

/// Room for a `sockaddr_in` or a `sockaddr_in6` (a `sockaddr_storage` is 128 bytes; the send
/// path keeps SEND_CHUNK of these on the stack).
type SockAddrBuf = libc::sockaddr_in6;

const _: () = assert!(
    mem::size_of::<libc::sockaddr_in>() <= mem::size_of::<SockAddrBuf>()
        && mem::align_of::<libc::sockaddr_in>() <= mem::align_of::<SockAddrBuf>()
);

/// Control-message buffer of one outgoing GSO message, aligned for `cmsghdr`.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct GsoCtrl([u8; GSO_CTRL_LEN]);

/// `CMSG_SPACE(sizeof(u16))`: the `msg_controllen` of a GSO message.
// SAFETY: CMSG_SPACE is pure arithmetic on its argument.
const GSO_CMSG_SPACE: usize = unsafe { libc::CMSG_SPACE(2) } as usize;

/// Offset of a control message's data after its header (`CMSG_DATA`).
const CMSG_DATA_OFFSET: usize =
    mem::size_of::<libc::cmsghdr>().next_multiple_of(mem::size_of::<usize>());

const _: () = assert!(GSO_CMSG_SPACE <= GSO_CTRL_LEN && CMSG_DATA_OFFSET + 2 <= GSO_CMSG_SPACE);

/// Writes the `UDP_SEGMENT` control message (segment size `seg`) into `ctrl`.
fn write_gso_cmsg(ctrl: &mut GsoCtrl, seg: u16) {
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
fn gso_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT)
    )
}

/// Length of the GSO run that starts at `chunk[0]` (`lens[i]` = bytes of `chunk[i]`):
/// datagrams to one destination with `lens[0]` bytes each, the last possibly shorter, at
/// most GSO_MAX_SEGMENTS and GSO_MAX_BYTES in all; 1 (a plain datagram) when that run is
/// shorter than GSO_MIN_SEGMENTS or `dst_ok` refuses the destination.
fn gso_run(
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

/// Writes `addr` as a `sockaddr_in`/`sockaddr_in6` into `out`; returns its length.
fn write_sockaddr(addr: &SocketAddr, out: &mut SockAddrBuf) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: all-zero bytes are a valid sockaddr_in.
            let mut sin: libc::sockaddr_in = unsafe { mem::zeroed() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            // SAFETY: SockAddrBuf (sockaddr_in6) is at least as large and as aligned as
            // sockaddr_in (checked by the const assertion above), so the write stays inside
            // `out` and is aligned.
            unsafe { ptr::write(ptr::from_mut(out).cast::<libc::sockaddr_in>(), sin) };
            mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            // SAFETY: all-zero bytes are a valid sockaddr_in6.
            let mut sin6: libc::sockaddr_in6 = unsafe { mem::zeroed() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            *out = sin6;
            mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Reads the socket address the kernel wrote into `storage` (`len` bytes); `None` for other
/// families or short lengths.
fn read_sockaddr(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
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
fn with_port(ip: IpAddr, port: u16, ifindex: u32) -> SocketAddr {
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
struct CmsgInfo {
    /// Destination address of the datagram (`IP_PKTINFO.ipi_addr` / `IPV6_PKTINFO`).
    dst: Option<IpAddr>,
    /// Receiving interface.
    ifindex: u32,
    /// `SO_RXQ_OVFL`: the socket's cumulative drop count when the datagram was queued.
    drops: Option<u32>,
    /// `UDP_GRO`: the buffer holds datagrams of this size (the last may be shorter).
    gro_seg: Option<u32>,
}

/// Parses a received control buffer (the `msg_controllen` bytes the kernel filled) without
/// trusting it: malformed or truncated messages end the walk.
fn parse_cmsgs(buf: &[u8]) -> CmsgInfo {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Offset of the BTH byte that the ICRC masks to 0xFF (FECN, BECN, Resv6a; §7.1 item 4).
    const BTH_RESV8A_OFFSET: usize = 4;

    /// Waits until `fd` is readable or `ms` pass; true if readable.
    fn wait_readable(fd: RawFd, ms: i32) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        r > 0
    }

    /// Receives into `rx` until `want` usable datagrams arrived (or 2 s pass); returns
    /// (src, dst, bytes) of each.
    fn recv_all(
        port: &UdpPort,
        rx: &mut RxBatch,
        want: usize,
    ) -> Vec<(SocketAddr, SocketAddr, Vec<u8>)> {
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut out = Vec::new();
        while out.len() < want && Instant::now() < deadline {
            if !wait_readable(port.raw_fd(), 100) {
                continue;
            }
            let n = port.recv_batch(rx).expect("recv_batch");
            assert_eq!(n, rx.len());
            for d in rx.iter() {
                out.push((d.src, d.dst, d.data.to_vec()));
            }
        }
        out
    }

    /// Sends all of `batch`, retrying partial sends (bounded).
    fn send_all(port: &UdpPort, batch: &[TxDatagram<'_>]) {
        let mut done = 0;
        for _ in 0..1000 {
            if done == batch.len() {
                return;
            }
            done += port.send_batch(&batch[done..]).expect("send_batch");
        }
        panic!("could not send the batch: {done}/{}", batch.len());
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            // xorshift64*
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    /// A datagram in three parts (head 12..=40 bytes, payload, tail = pad + ICRC field),
    /// sealed for `src` → `dst`; returns the parts.
    fn sealed_parts(
        rng: &mut Rng,
        src: SocketAddr,
        dst: SocketAddr,
        payload_len: usize,
    ) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let head_len = BTH_LEN + rng.below(29);
        let head = rng.bytes(head_len);
        let payload = rng.bytes(payload_len);
        let mut tail = vec![0u8; rng.below(4) + ICRC_LEN];
        seal(src, dst, &head, &payload, &mut tail).expect("seal");
        (head, payload, tail)
    }

    fn roundtrip(sender_addr: SocketAddr, receiver_bind: SocketAddr, receiver_ip: IpAddr) {
        roundtrip_with(sender_addr, receiver_bind, receiver_ip, false);
    }

    fn roundtrip_with(
        sender_addr: SocketAddr,
        receiver_bind: SocketAddr,
        receiver_ip: IpAddr,
        gro: bool,
    ) {
        let a = UdpPort::bind(sender_addr).expect("bind sender");
        let b = UdpPort::bind(receiver_bind).expect("bind receiver");
        assert!(!gro || b.enable_gro());
        let to = SocketAddr::new(receiver_ip, b.local_addr().port());
        let mut rng = Rng(0x1234_5678);
        let dgrams: Vec<_> = (0..5)
            .map(|i| sealed_parts(&mut rng, a.local_addr(), to, i * 700))
            .collect();
        let batch: Vec<_> = dgrams
            .iter()
            .map(|(h, p, t)| TxDatagram {
                dst: to,
                parts: [h, p, t],
            })
            .collect();
        assert_eq!(a.send_batch(&batch).expect("send"), 5);

        let mut rx = if gro {
            RxBatch::for_gro(8)
        } else {
            RxBatch::new(8, 4096)
        };
        let got = recv_all(&b, &mut rx, 5);
        assert_eq!(got.len(), 5);
        for ((src, dst, data), (h, p, t)) in got.iter().zip(&dgrams) {
            assert_eq!(*src, a.local_addr());
            assert_eq!(*dst, to, "destination from PKTINFO");
            assert_eq!(*data, [h.as_slice(), p, t].concat());
            assert!(verify(*src, *dst, data));
        }
        assert_eq!(b.truncated_drops(), 0);
    }

    #[test]
    fn roundtrip_v4_wildcard_receiver_sees_real_destination() {
        roundtrip(
            "127.0.0.1:0".parse().unwrap(),
            "0.0.0.0:0".parse().unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST),
        );
    }

    #[test]
    fn roundtrip_v4_bound_receiver() {
        roundtrip(
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.1:0".parse().unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST),
        );
    }

    /// `None` (and a note) when this host has no usable ::1.
    fn v6_available() -> bool {
        match UdpPort::bind("[::1]:0".parse().unwrap()) {
            Ok(_) => true,
            Err(e) => {
                eprintln!("skipping IPv6 test: cannot bind [::1]: {e}");
                false
            }
        }
    }

    #[test]
    fn roundtrip_v6_wildcard_receiver_sees_real_destination() {
        if !v6_available() {
            return;
        }
        roundtrip(
            "[::1]:0".parse().unwrap(),
            "[::]:0".parse().unwrap(),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        );
    }

    #[test]
    fn big_batches_are_chunked_and_all_arrive() {
        let a = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let to = b.local_addr();
        let bodies: Vec<Vec<u8>> = (0..150u32).map(|i| i.to_be_bytes().repeat(5)).collect();
        let batch: Vec<_> = bodies
            .iter()
            .map(|body| TxDatagram {
                dst: to,
                parts: [&body[..8], &[], &body[8..]],
            })
            .collect();
        send_all(&a, &batch);
        let mut rx = RxBatch::new(32, 64);
        let got = recv_all(&b, &mut rx, 150);
        let got: Vec<_> = got.into_iter().map(|(_, _, d)| d).collect();
        assert_eq!(got, bodies);
        assert_eq!(a.send_batch(&[]).unwrap(), 0);
    }

    #[test]
    fn truncated_datagrams_are_dropped_and_counted() {
        let a = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let big = [7u8; 100];
        let small = [9u8; 10];
        let batch = [
            TxDatagram {
                dst: b.local_addr(),
                parts: [&big, &[], &[]],
            },
            TxDatagram {
                dst: b.local_addr(),
                parts: [&small, &[], &[]],
            },
        ];
        send_all(&a, &batch);
        let mut rx = RxBatch::new(4, 32);
        let got = recv_all(&b, &mut rx, 1);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].2, small);
        assert_eq!(b.truncated_drops(), 1);
        assert!(rx.get(rx.capacity()).is_none());
    }

    #[test]
    fn recv_on_empty_socket_is_ok_zero() {
        let b = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut rx = RxBatch::new(4, 2048);
        assert_eq!(b.recv_batch(&mut rx).unwrap(), 0);
        assert!(rx.is_empty());
        assert!(rx.get(0).is_none());
        let mut none = RxBatch::new(0, 0);
        assert_eq!(b.recv_batch(&mut none).unwrap(), 0);
        // Absurd sizes are capped, not allocated.
        let capped = RxBatch::new(usize::MAX, usize::MAX);
        assert_eq!(capped.capacity(), MAX_RX_SLOTS);
        assert_eq!(capped.slot_len(), MAX_RX_SLOT_LEN);
    }

    #[test]
    fn send_errors_are_errors_not_panics() {
        let a = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let v6dst: SocketAddr = "[::1]:4791".parse().unwrap();
        let e = a
            .send_batch(&[TxDatagram {
                dst: v6dst,
                parts: [b"x", &[], &[]],
            }])
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // Mixed: the first is sent, the bad one is left for the next call.
        let b = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let ok = TxDatagram {
            dst: b.local_addr(),
            parts: [b"y", &[], &[]],
        };
        let bad = TxDatagram {
            dst: v6dst,
            parts: [b"x", &[], &[]],
        };
        assert_eq!(a.send_batch(&[ok, bad, ok]).unwrap(), 1);
        // Too large for one IPv4 datagram.
        let huge = vec![0u8; 70_000];
        let e = a
            .send_batch(&[TxDatagram {
                dst: b.local_addr(),
                parts: [&huge, &[], &[]],
            }])
            .unwrap_err();
        eprintln!("70000-byte datagram: {e}");
    }

    #[test]
    fn bind_qp_port_gives_distinct_ports_in_range() {
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mut ports = Vec::new();
        let mut held = Vec::new();
        for qpn in [17u32, 17, 17, 0x4011, 0x3FFF, 0x3FFF] {
            let p = UdpPort::bind_qp_port(ip, qpn).expect("bind_qp_port");
            let port = p.local_addr().port();
            assert!(port >= QP_PORT_BASE, "port {port:#x}");
            assert!(!ports.contains(&port), "port {port:#x} reused");
            ports.push(port);
            held.push(p);
        }
        // The hint picks the first candidate; taken ones are skipped forward, wrapping
        // 0xFFFF -> 0xC000. (Another process may hold some, so only check the order loosely.)
        let first = u32::from(ports[0]);
        assert!(first >= 0xC000 + 17);
        assert!(ports[1] > ports[0] || ports[1] < 0xC000 + 17);
        assert!(u32::from(ports[4]) == 0xFFFF || u32::from(ports[4]) < 0xC000 + 17);
    }

    #[test]
    fn bind_qp_port_reports_bad_addresses() {
        // 192.0.2.123 (TEST-NET-1) is not an address of this host.
        let e = UdpPort::bind_qp_port(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 123)), 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrNotAvailable);
    }

    #[test]
    fn seal_over_parts_equals_wire_icrc_at_random_splits() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let v4 = |rng: &mut Rng| {
            SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(rng.next() as u32),
                rng.next() as u16,
            ))
        };
        let v6 = |rng: &mut Rng| {
            SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(u128::from(rng.next()) << 64 | u128::from(rng.next())),
                rng.next() as u16,
                rng.next() as u32,
                rng.next() as u32,
            ))
        };
        for case in 0..2000 {
            let ipv6 = case % 2 == 1;
            let (src, dst) = if ipv6 {
                (v6(&mut rng), v6(&mut rng))
            } else {
                (v4(&mut rng), v4(&mut rng))
            };
            let len = BTH_LEN + ICRC_LEN + rng.below(300);
            let mut pkt = rng.bytes(len);
            // Split points anywhere, ICRC field inside the tail.
            let a = rng.below(len - ICRC_LEN + 1);
            let b = a + rng.below(len - ICRC_LEN - a + 1);
            let (head, rest) = pkt.split_at_mut(a);
            let (payload, tail) = rest.split_at_mut(b - a);
            seal(src, dst, head, payload, tail).unwrap();
            let expected = match (src, dst) {
                (SocketAddr::V4(s), SocketAddr::V4(d)) => icrc::compute_ipv4_addrs(s, d, 0, &pkt),
                (SocketAddr::V6(s), SocketAddr::V6(d)) => icrc::compute_ipv6_addrs(s, d, &pkt),
                _ => unreachable!(),
            }
            .unwrap();
            assert_eq!(icrc::received(&pkt).unwrap(), expected, "case {case}");
            assert!(verify(src, dst, &pkt));
            assert_eq!(icrc_parts(src, dst, &[&pkt]).unwrap(), expected);
        }
    }

    #[test]
    fn corrupted_bytes_fail_verify_except_masked_bth_byte() {
        let mut rng = Rng(42);
        let src: SocketAddr = "10.0.0.1:49152".parse().unwrap();
        let dst: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let (h, p, t) = sealed_parts(&mut rng, src, dst, 64);
        let pkt = [h, p, t].concat();
        assert!(verify(src, dst, &pkt));
        for i in 0..pkt.len() {
            let mut bad = pkt.clone();
            bad[i] ^= 0x01;
            assert_eq!(verify(src, dst, &bad), i == BTH_RESV8A_OFFSET, "byte {i}");
        }
        // Wrong addresses or ports fail too.
        assert!(!verify("10.0.0.3:49152".parse().unwrap(), dst, &pkt));
        assert!(!verify(src, "10.0.0.2:4792".parse().unwrap(), &pkt));
        assert!(!verify(src, "[::1]:4791".parse().unwrap(), &pkt));
        assert!(!verify(src, dst, &pkt[..10]));
        assert!(!verify(src, dst, &[]));
    }

    #[test]
    fn seal_rejects_bad_input() {
        let src: SocketAddr = "10.0.0.1:49152".parse().unwrap();
        let dst: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let head = [0u8; 12];
        let mut short = [0u8; 3];
        assert!(seal(src, dst, &head, &[], &mut short).is_err());
        let mut tail = [0u8; 4];
        assert!(seal(src, "[::1]:4791".parse().unwrap(), &head, &[], &mut tail).is_err());
        assert!(seal(src, dst, &head[..8], &[], &mut tail).is_err());
        let huge = vec![0u8; 70_000];
        assert!(seal(src, dst, &head, &huge, &mut tail).is_err());
    }

    /// Builds a control buffer the way the kernel lays it out (CMSG_* macros).
    fn synth_cmsgs(msgs: &[(libc::c_int, libc::c_int, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(level, ty, data) in msgs {
            // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic on the length.
            let (space, len) = unsafe {
                (
                    libc::CMSG_SPACE(data.len() as u32) as usize,
                    libc::CMSG_LEN(data.len() as u32) as usize,
                )
            };
            let start = out.len();
            out.resize(start + space, 0);
            // SAFETY: all-zero bytes are a valid cmsghdr.
            let mut h: libc::cmsghdr = unsafe { mem::zeroed() };
            h.cmsg_len = len as _;
            h.cmsg_level = level;
            h.cmsg_type = ty;
            // SAFETY: `out[start..]` has `space` ≥ size_of::<cmsghdr>() bytes.
            unsafe { ptr::write_unaligned(out[start..].as_mut_ptr().cast(), h) };
            let data_off = start + len - data.len();
            out[data_off..data_off + data.len()].copy_from_slice(data);
        }
        out
    }

    #[test]
    fn cmsg_parsing_on_synthetic_buffers() {
        let drops = 0xFFFF_FFF0u32.to_ne_bytes();
        // SAFETY: all-zero bytes are a valid in_pktinfo.
        let mut pi: libc::in_pktinfo = unsafe { mem::zeroed() };
        pi.ipi_ifindex = 3;
        pi.ipi_addr.s_addr = u32::from_ne_bytes([192, 168, 1, 9]);
        pi.ipi_spec_dst.s_addr = u32::from_ne_bytes([10, 0, 0, 1]);
        // SAFETY: in_pktinfo is plain data; view it as bytes.
        let pi_bytes: [u8; mem::size_of::<libc::in_pktinfo>()] = unsafe { mem::transmute(pi) };
        let buf = synth_cmsgs(&[
            (libc::IPPROTO_IP, libc::IP_PKTINFO, &pi_bytes),
            (libc::SOL_SOCKET, libc::SO_RXQ_OVFL, &drops),
        ]);
        let info = parse_cmsgs(&buf);
        assert_eq!(info.dst, Some(IpAddr::V4(Ipv4Addr::new(192, 168, 1, 9))));
        assert_eq!(info.ifindex, 3);
        assert_eq!(info.drops, Some(0xFFFF_FFF0));

        let mut pi6: libc::in6_pktinfo = libc::in6_pktinfo {
            ipi6_addr: libc::in6_addr { s6_addr: [0; 16] },
            ipi6_ifindex: 7,
        };
        pi6.ipi6_addr.s6_addr = Ipv6Addr::LOCALHOST.octets();
        // SAFETY: in6_pktinfo is plain data; view it as bytes.
        let pi6_bytes: [u8; mem::size_of::<libc::in6_pktinfo>()] = unsafe { mem::transmute(pi6) };
        let buf6 = synth_cmsgs(&[
            (libc::SOL_SOCKET, libc::SO_RXQ_OVFL, &drops),
            (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, &pi6_bytes),
        ]);
        let info = parse_cmsgs(&buf6);
        assert_eq!(info.dst, Some(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert_eq!(info.ifindex, 7);

        // Every truncation and every garbage length is handled without panicking.
        for cut in 0..buf6.len() {
            let _ = parse_cmsgs(&buf6[..cut]);
        }
        let mut garbage = buf.clone();
        for v in [0usize, 1, 15, 17, 4096, usize::MAX] {
            garbage[..mem::size_of::<usize>()].copy_from_slice(&v.to_ne_bytes());
            let _ = parse_cmsgs(&garbage);
        }
        assert_eq!(parse_cmsgs(&[]), CmsgInfo::default());
    }

    #[test]
    fn drop_counter_extends_the_kernel_u32() {
        let p = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        p.note_drops(5);
        assert_eq!(p.kernel_drops(), 5);
        p.note_drops(3); // older datagram: ignored
        assert_eq!(p.kernel_drops(), 5);
        p.note_drops(u32::MAX);
        assert_eq!(p.kernel_drops(), 5); // "backwards" by more than half the range: ignored
        p.note_drops(0x7000_0000);
        p.note_drops(0xE000_0000);
        p.note_drops(2); // wrapped
        assert_eq!(p.kernel_drops(), 0x1_0000_0002);
    }

    #[test]
    fn kernel_drops_counts_receive_queue_overflow() {
        let a = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        // Smallest receive buffer the kernel allows (it rounds 1 up to its minimum).
        setsockopt_int(b.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, 1).unwrap();
        let body = [0u8; 1000];
        let one = [TxDatagram {
            dst: b.local_addr(),
            parts: [&body, &[], &[]],
        }];
        let flood = [one[0]; 200];
        let mut sent = 0;
        for _ in 0..100 {
            if sent >= flood.len() {
                break;
            }
            sent += a.send_batch(&flood[..flood.len() - sent]).unwrap();
        }
        assert!(sent > 0);
        // Drain what was queued; a later datagram carries the updated count. Retry a few
        // rounds in case the loopback backlog was still being processed (bounded).
        let mut rx = RxBatch::new(64, 2048);
        let mut queued = 0;
        for _ in 0..50 {
            wait_readable(b.raw_fd(), 20);
            while b.recv_batch(&mut rx).unwrap() > 0 {
                queued += rx.len();
            }
            if b.kernel_drops() > 0 {
                break;
            }
            send_all(&a, &one);
        }
        eprintln!(
            "flood: sent {sent}, received {queued}, kernel_drops {}",
            b.kernel_drops()
        );
        assert!(b.kernel_drops() > 0);
        assert!(b.kernel_drops() <= sent as u64);
    }

    /// Captures one of our datagrams on `lo` with an AF_PACKET socket (root only) and checks
    /// the IP header the kernel really sent: IPv4 ID 0 with DF, and that wire's ICRC over the
    /// captured headers equals the one `seal` computed from addresses alone.
    fn capture_check(src_bind: SocketAddr, dst_bind: SocketAddr) {
        let a = UdpPort::bind(src_bind).unwrap();
        let b = UdpPort::bind(dst_bind).unwrap();
        // SAFETY: plain syscall; returns a new descriptor or -1.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                i32::from((libc::ETH_P_ALL as u16).to_be()),
            )
        };
        if raw < 0 {
            eprintln!(
                "skipping capture test: AF_PACKET socket: {}",
                io::Error::last_os_error()
            );
            return;
        }
        // SAFETY: fresh descriptor owned by nothing else.
        let cap = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: NUL-terminated constant string.
        let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
        // SAFETY: all-zero bytes are a valid sockaddr_ll.
        let mut sll: libc::sockaddr_ll = unsafe { mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = lo as i32;
        // SAFETY: `sll` is a live sockaddr_ll of the given size.
        let r = unsafe {
            libc::bind(
                cap.as_raw_fd(),
                ptr::from_ref(&sll).cast(),
                mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r != 0 {
            eprintln!(
                "skipping capture test: bind to lo: {}",
                io::Error::last_os_error()
            );
            return;
        }
        let mut rng = Rng(7);
        let (h, p, t) = sealed_parts(&mut rng, a.local_addr(), b.local_addr(), 100);
        let sent = [h.as_slice(), &p, &t].concat();
        send_all(
            &a,
            &[TxDatagram {
                dst: b.local_addr(),
                parts: [&h, &p, &t],
            }],
        );
        let (sport, dport) = (a.local_addr().port(), b.local_addr().port());
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut frame = vec![0u8; 70_000];
        while Instant::now() < deadline {
            if !wait_readable(cap.as_raw_fd(), 100) {
                continue;
            }
            // SAFETY: `frame` is a live writable buffer of the given length.
            let n = unsafe {
                libc::recv(
                    cap.as_raw_fd(),
                    frame.as_mut_ptr().cast(),
                    frame.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n <= 0 {
                continue;
            }
            let pkt = &frame[..n as usize];
            let (ip_len, proto) = match pkt.first().map(|b| b >> 4) {
                Some(4) if pkt.len() >= 20 => (usize::from(pkt[0] & 0x0F) * 4, pkt[9]),
                Some(6) if pkt.len() >= 40 => (40, pkt[6]),
                _ => continue,
            };
            if proto != 17 || pkt.len() < ip_len + 8 {
                continue;
            }
            let (ip, rest) = pkt.split_at(ip_len);
            let (udp, ib) = rest.split_at(8);
            let ports = (
                u16::from_be_bytes([udp[0], udp[1]]),
                u16::from_be_bytes([udp[2], udp[3]]),
            );
            if ports != (sport, dport) {
                continue;
            }
            assert_eq!(ib, sent.as_slice());
            let computed = if ip[0] >> 4 == 4 {
                let id = u16::from_be_bytes([ip[4], ip[5]]);
                let frag = u16::from_be_bytes([ip[6], ip[7]]);
                eprintln!(
                    "captured IPv4: id {id:#06x}, flags/frag {frag:#06x}, ttl {}, tos {:#04x}",
                    ip[8], ip[1]
                );
                assert_eq!(id, 0, "IP identification");
                assert_eq!(frag, 0x4000, "DF set, offset 0");
                icrc::compute_ipv4(ip, udp, ib).unwrap()
            } else {
                eprintln!(
                    "captured IPv6: flow/tc {:02x?}, hop limit {}",
                    &ip[0..4],
                    ip[7]
                );
                icrc::compute_ipv6(ip, udp, ib).unwrap()
            };
            assert_eq!(
                computed,
                icrc::received(ib).unwrap(),
                "ICRC over the real headers"
            );
            return;
        }
        panic!("our datagram was not captured on lo within 2 s");
    }

    #[test]
    fn kernel_sends_ip_id_0_with_df_captured_on_lo() {
        capture_check(
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.1:0".parse().unwrap(),
        );
    }

    #[test]
    fn ipv6_icrc_matches_captured_headers_on_lo() {
        if !v6_available() {
            return;
        }
        capture_check("[::1]:0".parse().unwrap(), "[::1]:0".parse().unwrap());
    }

    // -----------------------------------------------------------------------------------------
    // GSO / GRO

    fn dgram<'a>(dst: SocketAddr, parts: &'a (Vec<u8>, Vec<u8>, Vec<u8>)) -> TxDatagram<'a> {
        TxDatagram {
            dst,
            parts: [&parts.0, &parts.1, &parts.2],
        }
    }

    /// Sealed datagrams `src` → `dst` whose total lengths are `lens` (head 12..=40 bytes,
    /// tail 4..=7, the rest payload), with random content.
    fn sealed_of_lens(
        rng: &mut Rng,
        src: SocketAddr,
        dst: SocketAddr,
        lens: &[usize],
    ) -> Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> {
        lens.iter()
            .map(|&len| {
                let head_len = BTH_LEN + rng.below(29).min(len - BTH_LEN - ICRC_LEN);
                let head = rng.bytes(head_len);
                let tail_len = ICRC_LEN + rng.below(4).min(len - head_len - ICRC_LEN);
                let payload = rng.bytes(len - head.len() - tail_len);
                let mut tail = vec![0u8; tail_len];
                seal(src, dst, &head, &payload, &mut tail).expect("seal");
                (head, payload, tail)
            })
            .collect()
    }

    #[test]
    fn gso_runs_group_equal_lengths_to_one_destination() {
        let a: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let b: SocketAddr = "127.0.0.2:4791".parse().unwrap();
        let body = [0u8; 1];
        let run = |spec: &[(SocketAddr, usize)]| {
            let batch: Vec<_> = spec
                .iter()
                .map(|&(dst, _)| TxDatagram {
                    dst,
                    parts: [&body, &[], &[]],
                })
                .collect();
            let lens: Vec<usize> = spec.iter().map(|s| s.1).collect();
            gso_run(&batch, &lens, |_| true)
        };
        // Equal lengths; a shorter one ends the run; a longer one is not in it.
        assert_eq!(run(&[(a, 100); 5]), 5);
        assert_eq!(run(&[(a, 100), (a, 100), (a, 100), (a, 40), (a, 100)]), 4);
        assert_eq!(run(&[(a, 100), (a, 100), (a, 100), (a, 100), (a, 101)]), 4);
        // Fewer than GSO_MIN_SEGMENTS: plain.
        assert_eq!(run(&[(a, 100), (a, 100), (a, 100), (a, 101)]), 1);
        assert_eq!(run(&[(a, 100), (a, 100), (a, 40)]), 1);
        // Another destination ends the run.
        assert_eq!(run(&[(a, 100), (a, 100), (a, 100), (a, 100), (b, 100)]), 4);
        assert_eq!(run(&[(a, 100), (b, 100), (a, 100), (a, 100), (a, 100)]), 1);
        // Limits: 64 segments, GSO_MAX_BYTES in all, no empty segments.
        assert_eq!(run(&[(a, 100); 100]), GSO_MAX_SEGMENTS);
        assert_eq!(run(&[(a, 4112); 20]), GSO_MAX_BYTES / 4112);
        assert_eq!(run(&[(a, 0); 8]), 1);
        assert_eq!(run(&[(a, 70_000); 8]), 1);
        // The destination filter.
        let batch = [TxDatagram {
            dst: a,
            parts: [&body, &[], &[]],
        }; 8];
        assert_eq!(gso_run(&batch, &[100; 8], |_| false), 1);
        let p = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        assert!(p.gso_dst_ok(&a));
        assert!(p.gso_dst_ok(&p.local_addr()));
        assert!(!p.gso_dst_ok(&"192.0.2.1:4791".parse().unwrap()));
        assert!(p.gso_dst_ok(&"[2001:db8::1]:4791".parse().unwrap()));
    }

    /// A batch with GSO runs (even and uneven last segment), short runs, single datagrams and
    /// two destinations, sent with `send_batch_gso`; each receiver gets exactly the datagrams
    /// of the plain path, in order, with PKTINFO destinations and good ICRCs. Returns the
    /// (datagrams, messages) counts each receiver saw.
    fn gso_roundtrip(bind: &str, gro: bool) -> Vec<(usize, usize)> {
        let bind: SocketAddr = bind.parse().unwrap();
        let a = UdpPort::bind(bind).unwrap();
        let rcv = [UdpPort::bind(bind).unwrap(), UdpPort::bind(bind).unwrap()];
        let mut batches: Vec<RxBatch> = rcv
            .iter()
            .map(|p| {
                if gro {
                    assert!(p.enable_gro(), "UDP_GRO");
                    RxBatch::for_gro(16)
                } else {
                    RxBatch::new(16, 2048)
                }
            })
            .collect();
        let (b, c) = (rcv[0].local_addr(), rcv[1].local_addr());
        let mut rng = Rng(0x6_5050);
        // (destination, length) of each datagram, in order.
        let mut spec: Vec<(SocketAddr, usize)> = Vec::new();
        spec.extend([(b, 1000); 6]); // a run of 6
        spec.extend([(b, 800); 4]); // a run of 5 with a shorter last segment
        spec.push((b, 300));
        spec.extend([(c, 700); 3]); // too short for GSO
        spec.push((c, 1200));
        spec.extend([(c, 64); 70]); // 64 + 6
        spec.extend([(b, 500); 5]);
        spec.push((c, 500)); // another destination right after a run
        let dgrams: Vec<_> = spec
            .iter()
            .map(|&(dst, len)| sealed_of_lens(&mut rng, a.local_addr(), dst, &[len]).remove(0))
            .collect();
        let batch: Vec<_> = spec
            .iter()
            .zip(&dgrams)
            .map(|(&(dst, _), p)| dgram(dst, p))
            .collect();
        let mut done = 0;
        for _ in 0..1000 {
            if done == batch.len() {
                break;
            }
            done += a.send_batch_gso(&batch[done..]).expect("send_batch_gso");
        }
        assert_eq!(done, batch.len());
        assert!(a.gso_active(), "GSO should be usable on loopback");
        let mut seen = Vec::new();
        for (k, port) in rcv.iter().enumerate() {
            let to = port.local_addr();
            let want: Vec<Vec<u8>> = spec
                .iter()
                .zip(&dgrams)
                .filter(|((dst, _), _)| *dst == to)
                .map(|(_, (h, p, t))| [h.as_slice(), p, t].concat())
                .collect();
            let rx = &mut batches[k];
            let mut got = Vec::new();
            let (mut datagrams, mut messages) = (0, 0);
            let deadline = Instant::now() + Duration::from_secs(2);
            while got.len() < want.len() && Instant::now() < deadline {
                if !wait_readable(port.raw_fd(), 100) {
                    continue;
                }
                let n = port.recv_batch(rx).expect("recv_batch");
                assert_eq!(n, rx.len());
                assert!(rx.messages() <= rx.capacity());
                datagrams += n;
                messages += rx.messages();
                for d in rx.iter() {
                    assert_eq!(d.src, a.local_addr());
                    assert_eq!(d.dst, to);
                    assert!(verify(d.src, d.dst, d.data), "ICRC of a received datagram");
                    got.push(d.data.to_vec());
                }
            }
            assert_eq!(got.len(), want.len(), "receiver {k}");
            assert!(
                got == want,
                "receiver {k}: datagrams differ from the plain path's"
            );
            assert_eq!(port.truncated_drops(), 0);
            seen.push((datagrams, messages));
        }
        seen
    }

    #[test]
    fn gso_send_then_plain_receive_v4() {
        for (datagrams, messages) in gso_roundtrip("127.0.0.1:0", false) {
            assert_eq!(
                datagrams, messages,
                "without GRO every message is one datagram"
            );
        }
    }

    #[test]
    fn gso_send_then_gro_receive_v4_coalesces_and_splits() {
        let seen = gso_roundtrip("127.0.0.1:0", true);
        eprintln!("(datagrams, messages) per receiver: {seen:?}");
        // Receiver b: runs of 6, 4 + 1 and 5 arrive as 3 buffers, the rest one by one.
        assert!(
            seen.iter().all(|&(d, m)| m < d),
            "GRO delivered whole GSO messages"
        );
    }

    #[test]
    fn gso_gro_roundtrip_v6() {
        if !v6_available() {
            return;
        }
        gso_roundtrip("[::1]:0", false);
        let seen = gso_roundtrip("[::1]:0", true);
        assert!(seen.iter().all(|&(d, m)| m < d));
    }

    #[test]
    fn gro_receive_of_plain_datagrams_is_unchanged() {
        // GRO on, the sender without GSO: one datagram per slot, PKTINFO and drops as ever.
        roundtrip_with(
            "127.0.0.1:0".parse().unwrap(),
            "0.0.0.0:0".parse().unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            true,
        );
    }

    #[test]
    fn gso_falls_back_to_plain_datagrams_when_the_kernel_refuses() {
        // SO_NO_CHECK (no UDP checksum) makes the kernel refuse GSO with EINVAL: the chunk
        // goes plain, and the port stops trying.
        let a = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        setsockopt_int(a.as_fd(), libc::SOL_SOCKET, libc::SO_NO_CHECK, 1).unwrap();
        let mut rng = Rng(99);
        let dgrams = sealed_of_lens(&mut rng, a.local_addr(), b.local_addr(), &[900; 8]);
        let batch: Vec<_> = dgrams.iter().map(|p| dgram(b.local_addr(), p)).collect();
        assert_eq!(a.send_batch_gso(&batch).unwrap(), 8);
        assert!(!a.gso_active(), "GSO off after EINVAL");
        assert_eq!(a.send_batch_gso(&batch).unwrap(), 8); // plain from now on
        let mut rx = RxBatch::new(32, 2048);
        let got = recv_all(&b, &mut rx, 16);
        assert_eq!(got.len(), 16);
        for (i, (_, _, data)) in got.iter().enumerate() {
            let (h, p, t) = &dgrams[i % 8];
            assert_eq!(*data, [h.as_slice(), p, t].concat());
        }
        // A port whose probe failed (as before Linux 4.18) sends plain datagrams.
        let c = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        c.gso.store(OFFLOAD_OFF, Ordering::Relaxed);
        assert_eq!(c.send_batch_gso(&batch).unwrap(), 8);
        let got = recv_all(&b, &mut rx, 8);
        assert_eq!(got.len(), 8);
        // A port whose GRO failed says so and stays off.
        c.gro.store(OFFLOAD_OFF, Ordering::Relaxed);
        assert!(!c.enable_gro());
        assert!(!c.gro_active());
    }

    #[test]
    fn gso_errors_are_errors_and_runs_are_not_split() {
        let a = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpPort::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        // A destination of the other family: error for the first, the run before it is sent.
        let v6dst: SocketAddr = "[::1]:4791".parse().unwrap();
        let body = [5u8; 100];
        let ok = TxDatagram {
            dst: b.local_addr(),
            parts: [&body, &[], &[]],
        };
        let bad = TxDatagram {
            dst: v6dst,
            parts: [&body, &[], &[]],
        };
        assert_eq!(
            a.send_batch_gso(&[bad, ok]).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(a.send_batch_gso(&[ok, ok, ok, ok, ok, bad, ok]).unwrap(), 5);
        // Larger than one IP packet: refused, nothing sent, GSO still on.
        let huge = vec![0u8; 70_000];
        assert!(
            a.send_batch_gso(&[TxDatagram {
                dst: b.local_addr(),
                parts: [&huge, &[], &[]],
            }])
            .is_err()
        );
        assert!(a.gso_active());
        let mut rx = RxBatch::for_gro(8);
        assert_eq!(recv_all(&b, &mut rx, 5).len(), 5);
    }

    #[test]
    fn gro_cmsg_is_parsed() {
        let seg = 4112i32.to_ne_bytes();
        let buf = synth_cmsgs(&[(libc::SOL_UDP, libc::UDP_GRO, &seg)]);
        assert_eq!(parse_cmsgs(&buf).gro_seg, Some(4112));
        // The GSO control message we send is what CMSG_* would build.
        let mut ctrl = GsoCtrl([0; GSO_CTRL_LEN]);
        write_gso_cmsg(&mut ctrl, 4112);
        let want = synth_cmsgs(&[(libc::SOL_UDP, libc::UDP_SEGMENT, &4112u16.to_ne_bytes())]);
        assert_eq!(&ctrl.0[..GSO_CMSG_SPACE], want.as_slice());
    }

    /// An AF_PACKET socket on `lo` of the calling thread's network namespace (None: not
    /// permitted, with a note).
    fn lo_capture() -> Option<OwnedFd> {
        // SAFETY: plain syscall; returns a new descriptor or -1.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                i32::from((libc::ETH_P_ALL as u16).to_be()),
            )
        };
        if raw < 0 {
            eprintln!(
                "skipping capture: AF_PACKET: {}",
                io::Error::last_os_error()
            );
            return None;
        }
        // SAFETY: fresh descriptor owned by nothing else.
        let cap = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: NUL-terminated constant string.
        let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
        // SAFETY: all-zero bytes are a valid sockaddr_ll.
        let mut sll: libc::sockaddr_ll = unsafe { mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = lo as i32;
        // SAFETY: `sll` is a live sockaddr_ll of the given size.
        let r = unsafe {
            libc::bind(
                cap.as_raw_fd(),
                ptr::from_ref(&sll).cast(),
                mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r != 0 {
            eprintln!("skipping capture: bind lo: {}", io::Error::last_os_error());
            return None;
        }
        Some(cap)
    }

    /// A captured frame: IP header, UDP header, UDP payload.
    type Frame = (Vec<u8>, Vec<u8>, Vec<u8>);

    /// Outgoing UDP frames `sport` → `dport` captured on `cap` (IP header, UDP header, UDP
    /// payload) until `want` frames or 2 s.
    fn captured(cap: &OwnedFd, sport: u16, dport: u16, want: usize) -> Vec<Frame> {
        let mut out = Vec::new();
        let mut frame = vec![0u8; 70_000];
        let deadline = Instant::now() + Duration::from_secs(2);
        while out.len() < want && Instant::now() < deadline {
            if !wait_readable(cap.as_raw_fd(), 100) {
                continue;
            }
            // SAFETY: all-zero bytes are a valid sockaddr_ll.
            let mut from: libc::sockaddr_ll = unsafe { mem::zeroed() };
            let mut from_len = mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: `frame` and `from` are live writable buffers of the given lengths.
            let n = unsafe {
                libc::recvfrom(
                    cap.as_raw_fd(),
                    frame.as_mut_ptr().cast(),
                    frame.len(),
                    libc::MSG_DONTWAIT,
                    ptr::from_mut(&mut from).cast(),
                    &mut from_len,
                )
            };
            // lo shows every frame twice: keep the outgoing copy.
            if n <= 0 || from.sll_pkttype != libc::PACKET_OUTGOING {
                continue;
            }
            let pkt = &frame[..n as usize];
            let (ip_len, proto) = match pkt.first().map(|b| b >> 4) {
                Some(4) if pkt.len() >= 20 => (usize::from(pkt[0] & 0x0F) * 4, pkt[9]),
                Some(6) if pkt.len() >= 40 => (40, pkt[6]),
                _ => continue,
            };
            if proto != 17 || pkt.len() < ip_len + 8 {
                continue;
            }
            let (ip, rest) = pkt.split_at(ip_len);
            let (udp, payload) = rest.split_at(8);
            if (
                u16::from_be_bytes([udp[0], udp[1]]),
                u16::from_be_bytes([udp[2], udp[3]]),
            ) == (sport, dport)
            {
                out.push((ip.to_vec(), udp.to_vec(), payload.to_vec()));
            }
        }
        out
    }

    /// ICRC of `ib` over IP/UDP headers `ip`, `udp` with their length fields set for `ib`
    /// (the headers the kernel writes for one segment of a GSO message).
    fn icrc_with_lengths(ip: &[u8], udp: &[u8], ib: &[u8]) -> u32 {
        let (mut ip, mut udp) = (ip.to_vec(), udp.to_vec());
        let udp_len = (8 + ib.len()) as u16;
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        if ip[0] >> 4 == 4 {
            let total = ip.len() as u16 + udp_len;
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            icrc::compute_ipv4(&ip, &udp, ib).unwrap()
        } else {
            ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
            icrc::compute_ipv6(&ip, &udp, ib).unwrap()
        }
    }

    /// Sends a GSO batch (7 × 1000 bytes + 1 × 333, one message) from `src_bind` to
    /// `dst_bind` and captures it on `lo`. Returns the captured frames and the datagrams the
    /// plain path would have sent.
    fn gso_capture(src_bind: &str, dst_bind: &str) -> Option<(Vec<Frame>, Vec<Vec<u8>>)> {
        let cap = lo_capture()?;
        let a = UdpPort::bind(src_bind.parse().unwrap()).unwrap();
        let b = UdpPort::bind(dst_bind.parse().unwrap()).unwrap();
        let mut rng = Rng(0xCA9);
        let lens = [1000, 1000, 1000, 1000, 1000, 1000, 1000, 333];
        let dgrams = sealed_of_lens(&mut rng, a.local_addr(), b.local_addr(), &lens);
        let batch: Vec<_> = dgrams.iter().map(|p| dgram(b.local_addr(), p)).collect();
        assert_eq!(a.send_batch_gso(&batch).unwrap(), lens.len());
        assert!(a.gso_active());
        let plain: Vec<Vec<u8>> = dgrams
            .iter()
            .map(|(h, p, t)| [h.as_slice(), p, t].concat())
            .collect();
        let frames = captured(
            &cap,
            a.local_addr().port(),
            b.local_addr().port(),
            lens.len(),
        );
        Some((frames, plain))
    }

    /// On `lo` (which offloads UDP segmentation) the capture shows ONE super-frame: IPv4 ID 0
    /// with DF, its payload the plain datagrams back to back; the headers the kernel derives
    /// for each segment (lengths per segment, everything else copied) give each segment's
    /// sealed ICRC.
    fn check_gso_super_frame(src_bind: &str, dst_bind: &str) {
        let Some((frames, plain)) = gso_capture(src_bind, dst_bind) else {
            return;
        };
        assert_eq!(frames.len(), 1, "lo carries the GSO message as one frame");
        let (ip, udp, payload) = &frames[0];
        if ip[0] >> 4 == 4 {
            assert_eq!(u16::from_be_bytes([ip[4], ip[5]]), 0, "IP identification");
            assert_eq!(u16::from_be_bytes([ip[6], ip[7]]), 0x4000, "DF, offset 0");
        }
        assert_eq!(*payload, plain.concat(), "segment bytes");
        for (k, seg) in plain.iter().enumerate() {
            assert_eq!(
                icrc_with_lengths(ip, udp, seg),
                icrc::received(seg).unwrap(),
                "segment {k}: ICRC over its headers"
            );
        }
    }

    #[test]
    fn gso_capture_on_lo_shows_one_super_frame_v4() {
        check_gso_super_frame("127.0.0.1:0", "127.0.0.1:0");
    }

    #[test]
    fn gso_capture_on_lo_shows_one_super_frame_v6() {
        if !v6_available() {
            return;
        }
        check_gso_super_frame("[::1]:0", "[::1]:0");
    }

    /// In a private network namespace whose `lo` has `tx-udp-segmentation` off, the kernel
    /// segments GSO messages in software, so the capture shows the real segments: each must be
    /// byte for byte the plain datagram, with its own lengths. IPv6: each segment's ICRC
    /// matches its captured headers. IPv4: the kernel numbers the segments' IP
    /// identification (0, 1, 2, ... on Linux 6.x), which the ICRC covers; that is why
    /// `send_batch_gso` uses IPv4 GSO only towards locally delivered destinations. Needs
    /// root, `ip` and `ethtool`; skipped otherwise.
    #[test]
    fn gso_software_segments_match_the_plain_datagrams() {
        let t = std::thread::spawn(|| {
            // SAFETY: plain syscall; moves only this thread into a new network namespace
            // (the thread ends with the test).
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                eprintln!(
                    "skipping: unshare(CLONE_NEWNET): {}",
                    io::Error::last_os_error()
                );
                return;
            }
            // Children inherit this thread's namespace.
            let run = |cmd: &str, args: &[&str]| {
                std::process::Command::new(cmd)
                    .args(args)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            };
            if !run("ip", &["link", "set", "lo", "up"])
                || !run("ethtool", &["-K", "lo", "tx-udp-segmentation", "off"])
            {
                eprintln!("skipping: cannot set up lo in a namespace (ip, ethtool?)");
                return;
            }
            let mut cases = vec![("127.0.0.1:0", "127.0.0.1:0")];
            if UdpPort::bind("[::1]:0".parse().unwrap()).is_ok() {
                cases.push(("[::1]:0", "[::1]:0"));
            }
            for (src, dst) in cases {
                let Some((frames, plain)) = gso_capture(src, dst) else {
                    return;
                };
                assert_eq!(frames.len(), plain.len(), "{src}: one frame per segment");
                for (k, ((ip, udp, payload), seg)) in frames.iter().zip(&plain).enumerate() {
                    assert_eq!(payload, seg, "{src}: segment {k} bytes");
                    let udp_len = u16::from_be_bytes([udp[4], udp[5]]);
                    assert_eq!(usize::from(udp_len), 8 + seg.len(), "{src}: UDP length");
                    let real = if ip[0] >> 4 == 4 {
                        let id = u16::from_be_bytes([ip[4], ip[5]]);
                        assert_eq!(u16::from_be_bytes([ip[6], ip[7]]), 0x4000, "DF");
                        eprintln!("IPv4 segment {k}: id {id}");
                        assert!(usize::from(id) == 0 || usize::from(id) == k, "IP id {id}");
                        if id != 0 {
                            continue; // the ICRC assumed 0: wrong on this wire, see above
                        }
                        icrc::compute_ipv4(ip, udp, payload).unwrap()
                    } else {
                        icrc::compute_ipv6(ip, udp, payload).unwrap()
                    };
                    assert_eq!(
                        real,
                        icrc::received(seg).unwrap(),
                        "{src}: segment {k}: ICRC over the captured headers"
                    );
                }
            }
        });
        t.join().unwrap();
    }
}

//! Non-blocking UDP endpoint for RoCEv2 datagrams (docs/rc-transport.md §1.1), and the ICRC
//! framing of the soft provider (§7).
//!
//! Files: this one has [`UdpPort`] (setup, batched send with GSO, batched receive with GRO);
//! `rx_batch.rs` the receive buffers, `framing.rs` the ICRC ([`seal`], [`verify`]),
//! `sockopt.rs` socket options, addresses and control messages, `tests.rs` the tests
//! (loopback round trips, GSO/GRO, captures on `lo`).
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
//!   them at `net.core.rmem_max` / `wmem_max`).
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

mod framing;
mod rx_batch;
mod sockopt;
#[cfg(test)]
mod tests;

use crate::provider::sys::{SockAddrBuf, getsockopt_int, write_sockaddr};
pub use framing::{seal, verify};
pub use rx_batch::RxBatch;
use rx_batch::RxMeta;
use sockopt::*;

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
/// message; a lone datagram goes plain. Two: a 4 KiB messenger message is 4096 + header
/// bytes, a full packet and a short one, and sending the pair as one GSO message halved
/// the CPU a messenger server spends per 4 KiB reply (11-16 -> 6.2-6.9 us, A/B; the
/// kernel's per-datagram route lookup, skb and loopback delivery are paid once). A capture
/// on `lo` shows such a pair as one super-frame: `soft_gso = false` for captures.
pub const GSO_MIN_SEGMENTS: usize = 2;

/// Most segments in one GSO message (the kernel's `UDP_MAX_SEGMENTS`).
pub const GSO_MAX_SEGMENTS: usize = 64;

/// Most bytes in one GSO message: the UDP payload of one IPv4 packet (65535 - 20 - 8); the
/// kernel refuses larger ones with `EMSGSIZE`.
pub const GSO_MAX_BYTES: usize = 65507;

/// First per-QP UDP source port (rxe: `0xC000 + (hash(qpn) & 0x3FFF)`).
pub const QP_PORT_BASE: u16 = 0xC000;

/// Number of per-QP source ports (0xC000..=0xFFFF).
const QP_PORT_COUNT: u32 = 0x4000;

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
/// `rc::emit::TxParts` packet). Empty parts are skipped.
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
    #[cfg(test)]
    pub fn gso_active(&self) -> bool {
        self.gso.load(Ordering::Relaxed) == OFFLOAD_ON
    }

    fn send_batch_with(&self, batch: &[TxDatagram<'_>], gso: bool) -> io::Result<usize> {
        let gso = gso && self.gso_usable();
        let mut sent = 0;
        for chunk in batch.chunks(SEND_CHUNK) {
            // Chunks too short for a GSO run go as plain datagrams.
            let r = self.send_chunk(chunk, gso && chunk.len() >= GSO_MIN_SEGMENTS);
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

    /// One `sendmmsg` for up to [`SEND_CHUNK`] datagrams; with `gso`, runs (`gso_run`) go as
    /// single GSO messages, otherwise every datagram is its own message.
    fn send_chunk(&self, chunk: &[TxDatagram<'_>], gso: bool) -> io::Result<usize> {
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
            let run = if gso {
                gso_run(&chunk[i..count], &lens[i..count], |d| self.gso_dst_ok(d))
            } else {
                1
            };
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
                let plain = self.send_chunk(&chunk[..count], false);
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
            // SAFETY: `prepare` left every header pointing at this batch's own name, control
            // and data buffers (iovec lengths = slot_len, controllen = RX_CTRL_LEN, namelen =
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
                let n = (r as usize).min(rx.slots);
                rx.dirty = n;
                break n;
            }
            rx.dirty = rx.slots; // be safe: reset every header before the next call
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
    #[cfg(test)]
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

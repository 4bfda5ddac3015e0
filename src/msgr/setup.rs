//! Connection setup over the TCP side channel: the [`Hello`] each side sends, its binary
//! encoding, [`negotiate`] (what the local QP is configured with), and the blocking
//! [`exchange`] / [`ready`] steps.
//!
//! Like Ceph's RDMA messenger, rdmx exchanges queue-pair parameters over a TCP connection
//! that then stays open as the liveness signal (EOF = peer gone). Ceph sends a 65-byte ASCII
//! `lid:qpn:psn:peer_qpn:gid`; rdmx sends a versioned, length-prefixed binary message that
//! also carries the MTU, the rd_atomic limits, receive credits and the regions the peer may
//! access with RDMA READ/WRITE.
//!
//! The order of a setup is: connect TCP, authenticate (`crate::msgr::auth`: no QP exists
//! and nothing below is sent until both sides proved the key, or, with `auth = none`, the
//! client spoke first), create the QP, [`exchange_tagged`] hellos (each followed by an
//! HMAC tag under the session key when authenticated), [`negotiate`], bring the QP to
//! RTR/RTS with the result, then [`ready`] so that neither side sends RC traffic before the
//! other side's QP can receive it.
//!
//! # Encoding (all integers big-endian)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | total length in bytes, including these 4 |
//! | 4 | 4 | magic `b"RDMX"` |
//! | 8 | 2 | version: major in the high byte, minor in the low byte |
//! | 10 | 2 | flags: bit 0 [`FLAG_SRC_PORT`] (1.1), bit 1 [`FLAG_ROCE`] (1.2), bit 2 [`FLAG_LIMITS`] (1.3), bit 3 [`FLAG_PATHS`] (1.4); unknown bits are ignored |
//! | 12 | 4 | qpn (24 bits) |
//! | 16 | 4 | psn (24 bits) |
//! | 20 | 2 | path MTU in bytes (256, 512, 1024, 2048 or 4096) |
//! | 22 | 1 | max_rd_atomic |
//! | 23 | 1 | max_dest_rd_atomic |
//! | 24 | 4 | credits |
//! | 28 | 1 | UDP address family tag: 4 or 6 |
//! | 29 | 4 or 16 | UDP IP address |
//! | +0 | 2 | UDP port |
//! | +2 | 2 | region count (at most [`MAX_REGIONS`]) |
//! | +4 | 24 each | regions: addr u64, len u64, rkey u32, access u32 |
//! | end | 2 | with [`FLAG_SRC_PORT`]: the UDP source port of the sender QP's RC packets |
//! | end | 8 + 2 | with [`FLAG_LIMITS`]: the sender's message limits, max_message_bytes u64 and max_segments u16 ([`MsgLimitsWire`]) |
//!
//! [`Hello::decode`] is total: any byte string yields `Ok` or an [`ErrorKind::Parse`] error,
//! never a panic.

use std::hash::{BuildHasher, RandomState};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::provider::mtu;
/// Memory a hello exposes (provider-neutral: `Device::exposed` lists it).
pub use crate::provider::region::Region;
use crate::provider::types::Remote;

/// First bytes of every hello after the length prefix: rejects a peer that is not rdmx (or a
/// stray connection) before any field is trusted.
pub const MAGIC: [u8; 4] = *b"RDMX";
/// Major protocol version. A different major means a different layout: rejected.
pub const VERSION_MAJOR: u8 = 1;
/// Minor protocol version. Minor bumps keep the layout and may only add flag bits, so any
/// minor of a known major is accepted. 1.1 added [`FLAG_SRC_PORT`], 1.2 [`FLAG_ROCE`], 1.3
/// [`FLAG_LIMITS`] (a 1.2 build refuses a hello carrying limits as having trailing bytes),
/// 1.4 [`FLAG_PATHS`].
pub const VERSION_MINOR: u8 = 4;
/// Flag bit: a 2-byte UDP source port follows the regions ([`Hello::src_port`]). Without
/// it (a 1.0 peer), the receiver learns the port from the peer's first RC packet.
pub const FLAG_SRC_PORT: u16 = 1;
/// Flag bit: the sender's QP is a verbs QP (a NIC, or any libibverbs device). Its `udp`
/// address is its RoCEv2 GID (IPv4-mapped GIDs as IPv4) and port 4791, the only UDP port
/// a NIC sends RoCEv2 to; its packets leave from source ports the NIC chooses (so no
/// [`FLAG_SRC_PORT`]). A soft peer can interoperate with it only when its own UDP port is
/// 4791 ([`negotiate`] checks both directions).
pub const FLAG_ROCE: u16 = 2;
/// Flag bit: the sender's message limits follow the source port ([`Hello::limits`]): what
/// its messenger accepts in one message (`msgr_max_message_bytes`, `msgr_max_segments`),
/// so that the other side refuses at `send` what the receiver would refuse. Sent inside
/// the authenticated handshake (with `auth` on, the hello is tagged with the session key).
pub const FLAG_LIMITS: u16 = 4;
/// Flag bit: the sender's messenger takes path-joins (a session hello with
/// `wire::flags::JOIN` adds the connection as another path of an open session:
/// `Messenger::connect_paths`). No bytes follow. A messenger joins a path only to a peer
/// that set it: an older one would take the join for a resume and drop the session's
/// active link.
pub const FLAG_PATHS: u16 = 8;

/// A messenger's message limits as a hello carries them ([`FLAG_LIMITS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgLimitsWire {
    pub max_message_bytes: u64,
    pub max_segments: u16,
}

/// Bytes of [`MsgLimitsWire`] on the wire.
const LIMITS_LEN: usize = 10;
/// RoCEv2's UDP destination port (IANA).
pub const ROCEV2_PORT: u16 = 4791;
/// The version this build sends: major in the high byte, minor in the low byte.
pub const VERSION: u16 = (VERSION_MAJOR as u16) << 8 | VERSION_MINOR as u16;

/// Most regions one hello may expose. Bounds the message (and the allocation before it is
/// parsed) to under 100 KiB; rdmx exposes a few large pooled arenas, not one region per buffer.
pub const MAX_REGIONS: usize = 4096;

/// Mask of 24-bit fields (QP numbers, PSNs).
const MASK_24: u32 = 0x00FF_FFFF;
/// Bytes before the address: length, magic, version, flags, qpn, psn, mtu, two rd_atomic
/// bytes, credits, address tag.
const FIXED_LEN: usize = 4 + 4 + 2 + 2 + 4 + 4 + 2 + 1 + 1 + 4 + 1;
/// Bytes of one encoded region.
const REGION_LEN: usize = 8 + 8 + 4 + 4;
/// Shortest valid hello: IPv4 address, no regions.
pub const MIN_ENCODED_LEN: usize = FIXED_LEN + 4 + 2 + 2;
/// Longest valid hello: IPv6 address and [`MAX_REGIONS`] regions. [`exchange`] refuses a
/// length prefix above this before allocating.
pub const MAX_ENCODED_LEN: usize = FIXED_LEN + 16 + 2 + 2 + MAX_REGIONS * REGION_LEN;

const TAG_IPV4: u8 = 4;
const TAG_IPV6: u8 = 6;

/// The path MTUs InfiniBand defines (`enum ibv_mtu`).
const MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// What each side sends once the TCP side channel is up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version, normally [`VERSION`].
    pub version: u16,
    /// Capability bits; none are defined in 1.0 and receivers ignore unknown bits.
    pub flags: u16,
    /// The sender's QP number (24 bits).
    pub qpn: u32,
    /// The sender's initial send PSN (24 bits), see [`random_psn`].
    pub psn: u32,
    /// IP and UDP port of the sender's soft-provider socket. An unspecified IP (`0.0.0.0`,
    /// `::`) means "the address you reached me at over TCP", see [`peer_udp_addr`].
    pub udp: SocketAddr,
    /// Largest path MTU the sender supports: 256, 512, 1024, 2048 or 4096. rdmx sends
    /// min(configured `path_mtu`, the active MTU of its link to the receiver), see
    /// [`offered_path_mtu`].
    pub path_mtu: u32,
    /// RDMA READ/atomic operations the sender can have outstanding as initiator.
    pub max_rd_atomic: u8,
    /// RDMA READ/atomic operations the sender accepts outstanding as responder.
    pub max_dest_rd_atomic: u8,
    /// Receive credits the sender grants (receive WRs posted for this connection).
    pub credits: u32,
    /// Memory the sender exposes for one-sided access.
    pub regions: Vec<Region>,
    /// The UDP source port the sender's QP sends its RC packets from (its own socket, not
    /// `udp`): the receiver takes RC packets only from it (rxe's `check_addr`). Present
    /// exactly when `flags` has [`FLAG_SRC_PORT`]; encoded after the regions.
    pub src_port: Option<u16>,
    /// The sender's message limits. Present exactly when `flags` has [`FLAG_LIMITS`];
    /// encoded after the source port.
    pub limits: Option<MsgLimitsWire>,
}

/// The parameters the local QP is brought to RTR/RTS with, from both hellos.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// The smaller of the two MTUs: both ends of an RC connection must use the same one.
    pub path_mtu: u32,
    /// Mine, at most the peer's `max_dest_rd_atomic`.
    pub max_rd_atomic: u8,
    /// Mine, as offered.
    pub max_dest_rd_atomic: u8,
    /// My PSN: where my requester starts.
    pub sq_psn: u32,
    /// The peer's PSN: what my responder expects first.
    pub rq_psn: u32,
    /// The peer's QP number.
    pub dest_qpn: u32,
    /// Where to send RoCEv2 packets for the peer.
    pub peer_udp: SocketAddr,
    /// The UDP source port the peer's RC packets come from, if its hello said.
    pub peer_src_port: Option<u16>,
    /// Memory the peer exposes.
    pub peer_regions: Vec<Region>,
    /// Receive credits the peer grants.
    pub peer_credits: u32,
}

impl Negotiated {
    /// What the provider's `connect` takes (the QP's part of the negotiation).
    pub fn remote(&self) -> Remote {
        Remote {
            dest_qpn: self.dest_qpn,
            peer_udp: self.peer_udp,
            peer_src_port: self.peer_src_port,
            sq_psn: self.sq_psn,
            rq_psn: self.rq_psn,
            path_mtu: self.path_mtu,
            max_rd_atomic: self.max_rd_atomic,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
        }
    }
}

/// A random 24-bit start PSN.
///
/// Random start PSNs (as `ibv_rc_pingpong` and Ceph use) make it unlikely that late packets
/// of an earlier QP with the same number fall into the new QP's PSN window.
pub fn random_psn() -> u32 {
    match crate::provider::sys::try_random_u32() {
        Ok(v) => v & MASK_24,
        // Neither getrandom(2) nor /dev/urandom (the error is logged there): a PSN needs to
        // be unpredictable across QPs, not secret, so std's per-process random hash keys
        // are enough.
        Err(_) => RandomState::new().hash_one(Instant::now()) as u32 & MASK_24,
    }
}

/// Where to send UDP packets for a peer that advertised `advertised`: its own IP, unless it
/// is unspecified (a soft provider bound to `0.0.0.0`/`::` does not know which of its
/// addresses the peer can reach), then the IP the TCP connection came from.
///
/// The TCP IP is canonicalized first, so a dual-stack listener's `::ffff:a.b.c.d` becomes
/// plain IPv4 and matches an IPv4-only UDP socket.
pub fn peer_udp_addr(advertised: SocketAddr, peer_tcp_ip: IpAddr) -> SocketAddr {
    if advertised.ip().is_unspecified() {
        SocketAddr::new(peer_tcp_ip.to_canonical(), advertised.port())
    } else {
        advertised
    }
}

impl Hello {
    /// Checks the fields the encoding cannot express or the peer cannot use. Used by
    /// [`Hello::decode`] (as a parse error) and on the local hello by [`exchange`] and
    /// [`negotiate`] (as an invalid argument).
    pub fn validate(&self) -> Result<()> {
        self.check()
            .map_err(|m| Error::new(ErrorKind::InvalidArgument, m))
    }

    fn check(&self) -> std::result::Result<(), String> {
        let major = (self.version >> 8) as u8;
        if major != VERSION_MAJOR {
            return Err(format!(
                "hello: unknown protocol version {}.{}: this build speaks {VERSION_MAJOR}.x",
                major, self.version as u8
            ));
        }
        if self.qpn > MASK_24 {
            return Err(format!("hello: qpn {:#x} exceeds 24 bits", self.qpn));
        }
        if self.psn > MASK_24 {
            return Err(format!("hello: psn {:#x} exceeds 24 bits", self.psn));
        }
        if !MTUS.contains(&self.path_mtu) {
            return Err(format!(
                "hello: invalid path_mtu {}: allowed one of 256, 512, 1024, 2048, 4096",
                self.path_mtu
            ));
        }
        if self.regions.len() > MAX_REGIONS {
            return Err(format!(
                "hello: {} regions: at most {MAX_REGIONS} allowed",
                self.regions.len()
            ));
        }
        if (self.flags & FLAG_SRC_PORT != 0) != self.src_port.is_some() {
            return Err(format!(
                "hello: flag SRC_PORT is {} but the source port is {}",
                if self.flags & FLAG_SRC_PORT != 0 {
                    "set"
                } else {
                    "clear"
                },
                self.src_port
                    .map_or("absent".to_string(), |p| p.to_string())
            ));
        }
        if (self.flags & FLAG_LIMITS != 0) != self.limits.is_some() {
            return Err(format!(
                "hello: flag LIMITS is {} but the limits are {}",
                if self.flags & FLAG_LIMITS != 0 {
                    "set"
                } else {
                    "clear"
                },
                if self.limits.is_some() {
                    "present"
                } else {
                    "absent"
                }
            ));
        }
        for (i, r) in self.regions.iter().enumerate() {
            if r.addr.checked_add(r.len).is_none() {
                return Err(format!(
                    "hello: region {i} (addr {:#x}, len {:#x}) wraps past the end of the \
                     address space",
                    r.addr, r.len
                ));
            }
        }
        Ok(())
    }

    /// Bytes [`Hello::encode`] produces.
    pub fn encoded_len(&self) -> usize {
        let ip = match self.udp {
            SocketAddr::V4(_) => 4,
            SocketAddr::V6(_) => 16,
        };
        FIXED_LEN
            + ip
            + 2
            + 2
            + self.regions.len() * REGION_LEN
            + if self.src_port.is_some() { 2 } else { 0 }
            + if self.limits.is_some() { LIMITS_LEN } else { 0 }
    }

    /// Encodes the hello (layout in the module docs).
    ///
    /// Does not validate: a hello that fails [`Hello::validate`] encodes to bytes that
    /// [`Hello::decode`] rejects (out-of-range fields are written truncated).
    /// An IPv6 address's flow label and scope id are not sent: the scope id names one of the
    /// sender's interfaces and means nothing to the receiver.
    pub fn encode(&self) -> Vec<u8> {
        let len = self.encoded_len();
        let mut b = Vec::with_capacity(len);
        b.extend_from_slice(&(len as u32).to_be_bytes());
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&self.version.to_be_bytes());
        b.extend_from_slice(&self.flags.to_be_bytes());
        b.extend_from_slice(&self.qpn.to_be_bytes());
        b.extend_from_slice(&self.psn.to_be_bytes());
        b.extend_from_slice(&(self.path_mtu as u16).to_be_bytes());
        b.push(self.max_rd_atomic);
        b.push(self.max_dest_rd_atomic);
        b.extend_from_slice(&self.credits.to_be_bytes());
        match self.udp {
            SocketAddr::V4(a) => {
                b.push(TAG_IPV4);
                b.extend_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                b.push(TAG_IPV6);
                b.extend_from_slice(&a.ip().octets());
            }
        }
        b.extend_from_slice(&self.udp.port().to_be_bytes());
        b.extend_from_slice(&(self.regions.len() as u16).to_be_bytes());
        for r in &self.regions {
            b.extend_from_slice(&r.addr.to_be_bytes());
            b.extend_from_slice(&r.len.to_be_bytes());
            b.extend_from_slice(&r.rkey.to_be_bytes());
            b.extend_from_slice(&r.access.to_be_bytes());
        }
        if let Some(p) = self.src_port {
            b.extend_from_slice(&p.to_be_bytes());
        }
        if let Some(l) = self.limits {
            b.extend_from_slice(&l.max_message_bytes.to_be_bytes());
            b.extend_from_slice(&l.max_segments.to_be_bytes());
        }
        debug_assert_eq!(b.len(), len);
        b
    }

    /// Decodes one whole hello, length prefix included. Total: any input gives `Ok` or an
    /// [`ErrorKind::Parse`] error naming the problem (bad magic, unknown major version,
    /// truncated, trailing bytes, too many regions, invalid MTU, qpn/psn over 24 bits,
    /// unknown address tag), never a panic.
    pub fn decode(bytes: &[u8]) -> Result<Hello> {
        decode(bytes).map_err(|m| Error::new(ErrorKind::Parse, m))
    }
}

/// A cursor over the input whose reads fail, rather than panic, past the end.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take<const N: usize>(&mut self, what: &str) -> std::result::Result<[u8; N], String> {
        let Some(chunk) = self.bytes.get(self.pos..self.pos + N) else {
            return Err(format!(
                "hello: truncated: {N} bytes of {what} needed at offset {}, {} left",
                self.pos,
                self.bytes.len() - self.pos
            ));
        };
        self.pos += N;
        Ok(chunk.try_into().expect("slice of length N"))
    }
    fn u8(&mut self, what: &str) -> std::result::Result<u8, String> {
        Ok(self.take::<1>(what)?[0])
    }
    fn u16(&mut self, what: &str) -> std::result::Result<u16, String> {
        Ok(u16::from_be_bytes(self.take(what)?))
    }
    fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        Ok(u32::from_be_bytes(self.take(what)?))
    }
    fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        Ok(u64::from_be_bytes(self.take(what)?))
    }
}

fn decode(bytes: &[u8]) -> std::result::Result<Hello, String> {
    let mut c = Cursor { bytes, pos: 0 };
    let len = c.u32("length prefix")? as usize;
    if len < bytes.len() {
        return Err(format!(
            "hello: {} trailing bytes after the {len} the length prefix announces",
            bytes.len() - len
        ));
    }
    if len > bytes.len() {
        return Err(format!(
            "hello: truncated: length prefix announces {len} bytes, {} present",
            bytes.len()
        ));
    }
    let magic: [u8; 4] = c.take("magic")?;
    if magic != MAGIC {
        return Err(format!(
            "hello: bad magic {magic:02x?}: expected {MAGIC:02x?} (\"RDMX\"); is the peer rdmx?"
        ));
    }
    let version = c.u16("version")?;
    let major = (version >> 8) as u8;
    if major != VERSION_MAJOR {
        // Checked before the rest: another major may lay out the rest differently.
        return Err(format!(
            "hello: unknown protocol version {major}.{}: this build speaks {VERSION_MAJOR}.x",
            version as u8
        ));
    }
    let flags = c.u16("flags")?;
    let qpn = c.u32("qpn")?;
    let psn = c.u32("psn")?;
    let path_mtu = u32::from(c.u16("path_mtu")?);
    let max_rd_atomic = c.u8("max_rd_atomic")?;
    let max_dest_rd_atomic = c.u8("max_dest_rd_atomic")?;
    let credits = c.u32("credits")?;
    let ip = match c.u8("address tag")? {
        TAG_IPV4 => IpAddr::V4(Ipv4Addr::from(c.take::<4>("IPv4 address")?)),
        TAG_IPV6 => IpAddr::V6(Ipv6Addr::from(c.take::<16>("IPv6 address")?)),
        tag => {
            return Err(format!(
                "hello: unknown address tag {tag}: expected {TAG_IPV4} (IPv4) or {TAG_IPV6} (IPv6)"
            ));
        }
    };
    let port = c.u16("UDP port")?;
    let udp = match ip {
        IpAddr::V4(ip) => SocketAddr::V4(SocketAddrV4::new(ip, port)),
        IpAddr::V6(ip) => SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0)),
    };
    let count = usize::from(c.u16("region count")?);
    if count > MAX_REGIONS {
        return Err(format!(
            "hello: {count} regions: at most {MAX_REGIONS} allowed"
        ));
    }
    // The length prefix matched the input, so `count` regions (and the source port and
    // limits, if flagged) must fill the rest exactly.
    let left = bytes.len() - c.pos;
    let port_len = if flags & FLAG_SRC_PORT != 0 { 2 } else { 0 };
    let limits_len = if flags & FLAG_LIMITS != 0 {
        LIMITS_LEN
    } else {
        0
    };
    let tail = port_len + limits_len;
    if left != count * REGION_LEN + tail {
        return Err(format!(
            "hello: {count} regions{}{} need {} bytes, {left} left",
            if port_len > 0 {
                " and the source port"
            } else {
                ""
            },
            if limits_len > 0 {
                " and the limits"
            } else {
                ""
            },
            count * REGION_LEN + tail
        ));
    }
    let mut regions = Vec::with_capacity(count);
    for _ in 0..count {
        regions.push(Region {
            addr: c.u64("region addr")?,
            len: c.u64("region len")?,
            rkey: c.u32("region rkey")?,
            access: c.u32("region access")?,
        });
    }
    let src_port = if port_len > 0 {
        Some(c.u16("source port")?)
    } else {
        None
    };
    let limits = if limits_len > 0 {
        Some(MsgLimitsWire {
            max_message_bytes: c.u64("max_message_bytes")?,
            max_segments: c.u16("max_segments")?,
        })
    } else {
        None
    };
    let hello = Hello {
        version,
        flags,
        qpn,
        psn,
        udp,
        path_mtu,
        max_rd_atomic,
        max_dest_rd_atomic,
        credits,
        regions,
        src_port,
        limits,
    };
    hello.check()?;
    Ok(hello)
}

/// Computes what my QP is configured with from my hello, the peer's and the IP its TCP
/// connection came from.
///
/// - `path_mtu`: the smaller MTU, since both ends must agree and each supports only up to its
///   own.
/// - `max_rd_atomic`: min(mine, the peer's `max_dest_rd_atomic`). The IBTA expects an
///   initiator's depth (READs/atomics it has outstanding) to be at most the responder's
///   resources for them, as the CM's initiator_depth/responder_resources exchange enforces.
///   A responder that runs out may NAK Invalid Request (QP to error); rxe instead recycles its
///   oldest saved resource, so a retried READ whose resource was recycled is silently dropped.
///   A result of 0 means the peer accepts no READs or atomics at all.
/// - `max_dest_rd_atomic`: mine as offered; it sizes my responder's resources, and the peer
///   caps its own initiator depth by it.
/// - `peer_udp`: see [`peer_udp_addr`].
///
/// Errors: [`ErrorKind::InvalidArgument`] when `mine` is invalid, [`ErrorKind::Conflict`] when
/// the major versions differ (a decoded peer hello cannot, but a hand-built one can), and
/// [`ErrorKind::Parse`] when `peer` is otherwise invalid (it came off the wire).
pub fn negotiate(mine: &Hello, peer: &Hello, peer_tcp_ip: IpAddr) -> Result<Negotiated> {
    mine.validate()?;
    let (my_major, peer_major) = (mine.version >> 8, peer.version >> 8);
    if my_major != peer_major {
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "incompatible protocol versions: mine {}.{}, peer's {}.{}; the major versions \
                 must match",
                my_major, mine.version as u8, peer_major, peer.version as u8
            ),
        ));
    }
    peer.check()
        .map_err(|m| Error::new(ErrorKind::Parse, format!("peer's {m}")))?;
    check_interop(mine, peer)?;
    Ok(Negotiated {
        path_mtu: mine.path_mtu.min(peer.path_mtu),
        max_rd_atomic: mine.max_rd_atomic.min(peer.max_dest_rd_atomic),
        max_dest_rd_atomic: mine.max_dest_rd_atomic,
        sq_psn: mine.psn,
        rq_psn: peer.psn,
        dest_qpn: peer.qpn,
        peer_udp: peer_udp_addr(peer.udp, peer_tcp_ip),
        peer_src_port: peer.src_port,
        peer_regions: peer.regions.clone(),
        peer_credits: peer.credits,
    })
}

/// A soft side and a verbs side speak the same RoCEv2 on the wire, so they interoperate
/// when every packet reaches its receiver: a verbs QP (a NIC) sends only to UDP port 4791,
/// so the soft side must listen there (`soft_port = 4791`, the default). Otherwise both
/// sides refuse, each saying what to change, rather than connect and time out.
fn check_interop(mine: &Hello, peer: &Hello) -> Result<()> {
    let my_roce = mine.flags & FLAG_ROCE != 0;
    let peer_roce = peer.flags & FLAG_ROCE != 0;
    if my_roce && !peer_roce && peer.udp.port() != ROCEV2_PORT {
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "provider mismatch: the peer runs the soft provider on UDP port {}, this side \
                 runs provider=verbs, whose device sends RoCEv2 to port {ROCEV2_PORT} only: set \
                 soft_port={ROCEV2_PORT} on the peer (its default), or provider=soft here",
                peer.udp.port()
            ),
        ));
    }
    if !my_roce && peer_roce && mine.udp.port() != ROCEV2_PORT {
        return Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "provider mismatch: the peer runs provider=verbs, whose device sends RoCEv2 to \
                 UDP port {ROCEV2_PORT} only, but this soft provider listens on port {}: set \
                 soft_port={ROCEV2_PORT} here (the default), or provider=soft on the peer",
                mine.udp.port()
            ),
        ));
    }
    Ok(())
}

/// The path MTU this side offers in its hello on the side channel `stream`: the configured
/// `path_mtu`, capped by the active MTU of the link that routes to the peer (see
/// [`crate::provider::mtu`]), as a NIC's port caps a QP at its active MTU.
///
/// The link MTU is the route's (`IP_MTU`/`IPV6_MTU`) of the connected TCP socket: the soft
/// provider advertises a wildcard UDP address, so RoCE packets go to the IP the side channel
/// connects (the same route), and the socket lives in the connection's network namespace
/// whichever thread asks. Should the socket have no route cached, a UDP probe socket
/// connected to the peer's IP answers instead.
///
/// A configured value above the active one is clamped, with an info line naming the
/// configured value, the link MTU, the route and the value used; not refused, since the
/// configuration is per library and the link per connection. Both sides offer their own
/// value and [`negotiate`] takes the smaller, so a link that differs at each end is covered.
///
/// Errors: [`ErrorKind::Unsupported`] when the link cannot carry 256-byte packets,
/// [`ErrorKind::Io`] when neither the socket nor the probe yields the route's MTU.
pub fn offered_path_mtu(stream: &TcpStream, configured: u32) -> Result<mtu::PathMtu> {
    let side = |e: io::Error| Error::new(ErrorKind::Io, format!("side channel: {e}"));
    let peer = stream.peer_addr().map_err(side)?;
    let local = stream.local_addr().map_err(side)?;
    let peer_ip = peer.ip().to_canonical();
    let ipv6 = peer_ip.is_ipv6();
    let (link, local_ip) = match mtu::route_mtu_of(stream.as_fd(), local.is_ipv6()) {
        Ok(m) => (m, local.ip()),
        Err(first) => mtu::route_mtu(peer_ip).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!(
                    "path MTU: the route to {peer_ip}: no MTU from the side channel ({first}) \
                     nor from a UDP probe ({e})"
                ),
            )
        })?,
    };
    let route = mtu::describe_route(peer_ip, local_ip);
    let p = mtu::choose(configured, link, ipv6, &route)?;
    if p.clamped() {
        log::info!(
            target: "rdmx::msgr",
            "path_mtu {configured} (configured) clamped to {} for the route {route}: link MTU \
             {link}, and {configured}-byte packets need {} bytes with {} UDP and RoCE headers",
            p.offered,
            mtu::frame_len(configured, ipv6),
            if ipv6 { "IPv6," } else { "IPv4," }
        );
    }
    Ok(p)
}

/// Sends `mine` and receives the peer's hello, within `timeout` overall.
///
/// The write runs on a scoped thread (over a clone of the socket) while this thread reads:
/// both sides write first, and two hellos of up to ~96 KiB each could otherwise fill both
/// socket buffers and deadlock until the timeout. The length prefix is read first and
/// refused above [`MAX_ENCODED_LEN`] before anything is allocated.
///
/// The socket's read and write timeouts are set per call from one deadline (so a peer that
/// trickles bytes cannot stretch it) and restored to their previous values afterwards.
/// After an error the stream is shut down: the side channel is then unusable, drop it.
///
/// Errors: [`ErrorKind::InvalidArgument`] for an invalid `mine` or a zero timeout,
/// [`ErrorKind::Io`] for IO errors, EOF and timeouts, [`ErrorKind::Parse`] for a malformed
/// hello.
#[cfg(test)]
pub fn exchange(stream: &mut TcpStream, mine: &Hello, timeout: Duration) -> Result<Hello> {
    exchange_tagged(stream, mine, timeout, None)
}

/// [`exchange`] on an authenticated side channel: each hello is followed by a 32-byte
/// HMAC tag under the sending direction's session key (`keys`, and whether this side is
/// the client), and the peer's is checked in constant time before any field is used: a
/// hello whose QPN, PSN, address or regions were changed in transit, or a hello captured
/// from another connection, is refused with [`ErrorKind::Auth`].
pub fn exchange_tagged(
    stream: &mut TcpStream,
    mine: &Hello,
    timeout: Duration,
    keys: Option<(&crate::msgr::auth::SessionKeys, bool)>,
) -> Result<Hello> {
    mine.validate()?;
    with_deadline(stream, timeout, |stream, deadline, peer| {
        let mut out = mine.encode();
        if let Some((k, client)) = keys {
            let tag = k.tag(client, &out);
            out.extend_from_slice(&tag);
        }
        let writer = stream
            .try_clone()
            .map_err(|e| io_error(peer, "cloning the socket for the hello", e))?;
        std::thread::scope(|s| {
            let sent = s.spawn(move || {
                let mut writer = writer;
                write_all_by(&mut writer, &out, deadline, peer, "sending our hello")
            });
            let received = read_hello_tagged(stream, deadline, peer, keys);
            if received.is_err() {
                // Unblocks the writer if the peer is not reading.
                let _ = stream.shutdown(Shutdown::Both);
            }
            let sent = sent.join().expect("hello writer panicked");
            // The read error says more (e.g. "closed before sending") than the write's.
            let hello = received?;
            sent?;
            Ok(hello)
        })
    })
}

/// The one-byte "ready" step both sides take after bringing their QP to RTS: each writes
/// `b'R'` and reads the peer's, so neither sends RC traffic before the other's QP can
/// receive it (a packet to a QP still in INIT is dropped, costing a retransmission timeout).
///
/// A side may also take the step in two halves, [`await_ready`] then [`send_ready`]: the
/// peer writes its byte before reading, so reading first cannot deadlock with a peer that
/// calls `ready` (a listener reads the client's byte while its handshake runs on its own
/// and sends its own when the application accepts the connection).
///
/// Errors: [`ErrorKind::Io`] for IO errors, EOF and timeouts, [`ErrorKind::Parse`] if the
/// byte is not `b'R'`, [`ErrorKind::InvalidArgument`] for a zero timeout.
pub fn ready(stream: &mut TcpStream, timeout: Duration) -> Result<()> {
    with_deadline(stream, timeout, |stream, deadline, peer| {
        // One byte each way fits any socket buffer: no deadlock, no thread needed.
        write_ready_by(stream, deadline, peer)?;
        read_ready_by(stream, deadline, peer)
    })
}

/// The writing half of [`ready`]: sends our ready byte within `timeout`.
pub fn send_ready(stream: &mut TcpStream, timeout: Duration) -> Result<()> {
    with_deadline(stream, timeout, write_ready_by)
}

/// The reading half of [`ready`]: waits up to `timeout` for the peer's ready byte.
pub fn await_ready(stream: &mut TcpStream, timeout: Duration) -> Result<()> {
    with_deadline(stream, timeout, read_ready_by)
}

fn write_ready_by(stream: &mut TcpStream, deadline: Instant, peer: &str) -> Result<()> {
    write_all_by(stream, b"R", deadline, peer, "sending our ready byte")
}

fn read_ready_by(stream: &mut TcpStream, deadline: Instant, peer: &str) -> Result<()> {
    let mut b = [0u8; 1];
    read_exact_by(stream, &mut b, 0, deadline, peer, "the peer's ready byte")?;
    if b[0] != b'R' {
        return Err(Error::new(
            ErrorKind::Parse,
            format!(
                "side channel to {peer}: expected ready byte 0x52 ('R'), got {:#04x}",
                b[0]
            ),
        ));
    }
    Ok(())
}

/// Runs `f` with a deadline `timeout` from now, restoring the socket's timeouts afterwards
/// and shutting it down on error.
fn with_deadline<T>(
    stream: &mut TcpStream,
    timeout: Duration,
    f: impl FnOnce(&mut TcpStream, Instant, &str) -> Result<T>,
) -> Result<T> {
    if timeout.is_zero() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "side channel timeout: invalid value 0: must be positive",
        ));
    }
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "an unconnected peer".to_owned(), |a| a.to_string());
    let (old_read, old_write) = (
        stream.read_timeout().unwrap_or(None),
        stream.write_timeout().unwrap_or(None),
    );
    let deadline = Instant::now() + timeout;
    let result = f(stream, deadline, &peer);
    if result.is_err() {
        let _ = stream.shutdown(Shutdown::Both);
    }
    // Best effort: a failure here means the socket is already unusable, which the caller
    // learns on its next use.
    let _ = stream.set_read_timeout(old_read);
    let _ = stream.set_write_timeout(old_write);
    result
}

/// Reads one hello and, on an authenticated side channel, its tag (checked before the
/// hello is decoded).
fn read_hello_tagged(
    stream: &mut TcpStream,
    deadline: Instant,
    peer: &str,
    keys: Option<(&crate::msgr::auth::SessionKeys, bool)>,
) -> Result<Hello> {
    let Some((k, client)) = keys else {
        return read_hello(stream, deadline, peer);
    };
    let buf = read_hello_bytes(stream, deadline, peer)?;
    let mut tag = [0u8; 32];
    read_exact_by(stream, &mut tag, 0, deadline, peer, "the peer's hello tag")?;
    if !k.verify(!client, &buf, &tag) {
        return Err(Error::new(
            ErrorKind::Auth,
            format!(
                "side channel to {peer}: the peer's hello does not carry the session's tag \
                 (changed in transit, or replayed from another connection): refused"
            ),
        ));
    }
    Hello::decode(&buf).map_err(|e| {
        Error::new(
            ErrorKind::Parse,
            format!("side channel to {peer}: {}", e.message()),
        )
    })
}

/// Reads one hello: the length prefix, a bound check, then the rest.
fn read_hello(stream: &mut TcpStream, deadline: Instant, peer: &str) -> Result<Hello> {
    let buf = read_hello_bytes(stream, deadline, peer)?;
    Hello::decode(&buf).map_err(|e| {
        Error::new(
            ErrorKind::Parse,
            format!("side channel to {peer}: {}", e.message()),
        )
    })
}

/// The bytes of one hello, length prefix included.
fn read_hello_bytes(stream: &mut TcpStream, deadline: Instant, peer: &str) -> Result<Vec<u8>> {
    let mut prefix = [0u8; 4];
    read_exact_by(
        stream,
        &mut prefix,
        0,
        deadline,
        peer,
        "the peer's hello length prefix",
    )?;
    let len = u32::from_be_bytes(prefix) as usize;
    if !(MIN_ENCODED_LEN..=MAX_ENCODED_LEN).contains(&len) {
        return Err(Error::new(
            ErrorKind::Parse,
            format!(
                "side channel to {peer}: hello length {len} out of range \
                 {MIN_ENCODED_LEN}..={MAX_ENCODED_LEN} (first bytes \"{}\"); \
                 is the peer rdmx?",
                prefix.escape_ascii()
            ),
        ));
    }
    let mut buf = vec![0u8; len];
    buf[..4].copy_from_slice(&prefix);
    read_exact_by(stream, &mut buf, 4, deadline, peer, "the peer's hello")?;
    Ok(buf)
}

/// Time left until `deadline`, or a timeout error naming `what` was being waited for.
fn remaining(deadline: Instant, peer: &str, what: &str) -> Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(timed_out(peer, what))
    } else {
        Ok(left)
    }
}

fn timed_out(peer: &str, what: &str) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("side channel to {peer}: timed out {what}"),
    )
}

/// The peer closed the side channel (EOF). `ErrorKind::Io` for now, like timeouts; this and
/// [`timed_out`] are the only places to change for finer kinds.
fn closed(peer: &str, when: &str) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("side channel to {peer}: peer closed the connection {when}"),
    )
}

fn io_error(peer: &str, what: &str, e: io::Error) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("side channel to {peer}: {what}: {e}"),
    )
}

/// Whether an IO error is a socket timeout (`SO_RCVTIMEO`/`SO_SNDTIMEO` report `EAGAIN`).
fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Fills `buf[done..]` (the first `done` bytes are already there: counts in messages cover the
/// whole of `buf`) by `deadline`.
fn read_exact_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    mut done: usize,
    deadline: Instant,
    peer: &str,
    what: &str,
) -> Result<()> {
    while done < buf.len() {
        let wait = format!(
            "waiting for {what} ({done} of {} bytes received)",
            buf.len()
        );
        let left = remaining(deadline, peer, &wait)?;
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| io_error(peer, "setting the read timeout", e))?;
        match stream.read(&mut buf[done..]) {
            Ok(0) => {
                return Err(closed(
                    peer,
                    &format!(
                        "before sending {what} ({done} of {} bytes received)",
                        buf.len()
                    ),
                ));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(timed_out(peer, &wait)),
            Err(e) => return Err(io_error(peer, &format!("reading {what}"), e)),
        }
    }
    Ok(())
}

/// Writes all of `buf` by `deadline`.
fn write_all_by(
    stream: &mut TcpStream,
    buf: &[u8],
    deadline: Instant,
    peer: &str,
    what: &str,
) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let wait = format!("{what} ({done} of {} bytes sent)", buf.len());
        let left = remaining(deadline, peer, &wait)?;
        stream
            .set_write_timeout(Some(left))
            .map_err(|e| io_error(peer, "setting the write timeout", e))?;
        match stream.write(&buf[done..]) {
            Ok(0) => {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("side channel to {peer}: {what}: the socket accepted no bytes"),
                ));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => return Err(timed_out(peer, &wait)),
            Err(e) => return Err(io_error(peer, what, e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rc::verbs::access;
    use proptest::prelude::*;
    use std::net::TcpListener;

    /// A 1.0 hello (no source port): `SMALL`'s bytes.
    fn small() -> Hello {
        Hello {
            version: 0x0100,
            flags: 0,
            qpn: 0x11,
            psn: 0x12_3456,
            udp: "10.0.0.1:4791".parse().unwrap(),
            path_mtu: 1024,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 2,
            credits: 64,
            regions: vec![Region {
                addr: 0x1000,
                len: 0x2000,
                rkey: 0xabcd,
                access: access::REMOTE_READ | access::REMOTE_WRITE,
            }],
            src_port: None,
            limits: None,
        }
    }

    #[rustfmt::skip]
    const SMALL: [u8; 61] = [
        0, 0, 0, 61,                 // total length
        b'R', b'D', b'M', b'X',      // magic
        1, 0,                        // version 1.0
        0, 0,                        // flags
        0, 0, 0, 0x11,               // qpn
        0, 0x12, 0x34, 0x56,         // psn
        0x04, 0x00,                  // path_mtu 1024
        1, 2,                        // max_rd_atomic, max_dest_rd_atomic
        0, 0, 0, 64,                 // credits
        4, 10, 0, 0, 1,              // IPv4 10.0.0.1
        0x12, 0xb7,                  // port 4791
        0, 1,                        // one region
        0, 0, 0, 0, 0, 0, 0x10, 0,   // addr
        0, 0, 0, 0, 0, 0, 0x20, 0,   // len
        0, 0, 0xab, 0xcd,            // rkey
        0, 0, 0, 6,                  // access REMOTE_READ | REMOTE_WRITE
    ];

    /// Decodes `bytes` expecting a parse error whose message contains `needle`.
    fn parse_err(bytes: &[u8], needle: &str) {
        let e = Hello::decode(bytes).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Parse, "{e}");
        assert!(e.message().contains(needle), "{e:?} lacks {needle:?}");
    }

    /// `SMALL` with bytes `at..` replaced by `with`.
    fn patched(at: usize, with: &[u8]) -> Vec<u8> {
        let mut b = SMALL.to_vec();
        b[at..at + with.len()].copy_from_slice(with);
        b
    }

    #[test]
    fn small_hello_literal_bytes() {
        assert_eq!(small().encode(), SMALL);
        assert_eq!(small().encoded_len(), SMALL.len());
        assert_eq!(Hello::decode(&SMALL).unwrap(), small());
    }

    #[test]
    fn the_source_port_follows_the_regions_when_flagged() {
        let mut h = small();
        h.version = VERSION;
        h.flags = FLAG_SRC_PORT;
        h.src_port = Some(0xc011);
        let mut want = SMALL.to_vec();
        want[3] = 63; // total length
        want[9] = VERSION_MINOR; // this build's minor
        want[11] = 1; // flags: SRC_PORT
        want.extend_from_slice(&[0xc0, 0x11]); // source port 0xc011
        assert_eq!(h.encode(), want);
        assert_eq!(h.encoded_len(), want.len());
        assert_eq!(Hello::decode(&want).unwrap(), h);
        // The flag and the field go together.
        let mut no_port = want.clone();
        no_port[3] = 61;
        no_port.truncate(61);
        parse_err(
            &no_port,
            "1 regions and the source port need 26 bytes, 24 left",
        );
        h.src_port = None;
        assert!(
            h.validate()
                .unwrap_err()
                .message()
                .contains("flag SRC_PORT is set")
        );
        h.flags = 0;
        h.src_port = Some(1);
        assert!(
            h.validate()
                .unwrap_err()
                .message()
                .contains("flag SRC_PORT is clear")
        );
    }

    #[test]
    fn the_limits_follow_the_source_port_when_flagged() {
        let mut h = small();
        h.version = VERSION;
        h.flags = FLAG_SRC_PORT | FLAG_LIMITS;
        h.src_port = Some(0xc011);
        h.limits = Some(MsgLimitsWire {
            max_message_bytes: 16 << 20,
            max_segments: 64,
        });
        let mut want = SMALL.to_vec();
        want[3] = 73; // total length
        want[9] = VERSION_MINOR;
        want[11] = 5; // flags: SRC_PORT | LIMITS
        want.extend_from_slice(&[0xc0, 0x11]); // source port 0xc011
        want.extend_from_slice(&[0, 0, 0, 0, 0x01, 0, 0, 0]); // max_message_bytes 16 MiB
        want.extend_from_slice(&[0, 64]); // max_segments 64
        assert_eq!(h.encode(), want);
        assert_eq!(h.encoded_len(), want.len());
        assert_eq!(Hello::decode(&want).unwrap(), h);
        // Flagged without the field (a 1.2 sender setting bit 2): refused by length.
        let mut short = want.clone();
        short[3] = 63;
        short.truncate(63);
        parse_err(
            &short,
            "1 regions and the source port and the limits need 36 bytes, 26 left",
        );
        h.limits = None;
        assert!(
            h.validate()
                .unwrap_err()
                .message()
                .contains("flag LIMITS is set")
        );
    }

    #[test]
    fn ipv6_literal_bytes() {
        let mut h = small();
        h.udp = "[fe80::1%7]:18515".parse().unwrap();
        h.regions.clear();
        let b = h.encode();
        assert_eq!(b.len(), MIN_ENCODED_LEN + 12);
        assert_eq!(&b[..4], &[0, 0, 0, 49]);
        assert_eq!(b[28], 6);
        assert_eq!(
            &b[29..45],
            &Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1).octets()
        );
        assert_eq!(&b[45..49], &[0x48, 0x53, 0, 0]); // port 18515, no regions
        // The scope id names a sender's interface: not sent.
        h.udp = "[fe80::1]:18515".parse().unwrap();
        assert_eq!(Hello::decode(&b).unwrap(), h);
    }

    #[test]
    fn decode_rejects_each_bad_field() {
        parse_err(&patched(4, b"RDMY"), "bad magic");
        parse_err(&patched(8, &[2, 0]), "unknown protocol version 2.0");
        parse_err(&patched(8, &[0, 9]), "unknown protocol version 0.9");
        parse_err(&patched(12, &[1, 0, 0, 0]), "qpn 0x1000000 exceeds 24 bits");
        parse_err(
            &patched(16, &[0xff, 0, 0, 0]),
            "psn 0xff000000 exceeds 24 bits",
        );
        parse_err(&patched(20, &[0x03, 0xe8]), "invalid path_mtu 1000");
        parse_err(&patched(20, &[0x20, 0x00]), "invalid path_mtu 8192");
        parse_err(&patched(28, &[5]), "unknown address tag 5");
        parse_err(&patched(35, &[0, 2]), "2 regions need 48 bytes, 24 left");
        parse_err(&patched(37, &[0xff; 8]), "wraps past the end");
    }

    #[test]
    fn decode_accepts_newer_minor_and_unknown_flags() {
        let h = Hello::decode(&patched(8, &[1, 7])).unwrap();
        assert_eq!(h.version, 0x0107);
        let h = Hello::decode(&patched(10, &[0x80, 0x02])).unwrap();
        assert_eq!(h.flags, 0x8002);
    }

    #[test]
    fn decode_rejects_truncated_and_trailing() {
        for n in 0..SMALL.len() {
            let e = Hello::decode(&SMALL[..n]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Parse);
            assert!(e.message().contains("truncated"), "{n}: {e}");
        }
        // Prefix announcing fewer bytes than given.
        let mut b = SMALL.to_vec();
        b.push(0);
        parse_err(&b, "1 trailing bytes");
        // Consistent prefix but a region count that leaves bytes over.
        parse_err(&patched(35, &[0, 0]), "0 regions need 0 bytes, 24 left");
    }

    #[test]
    fn decode_rejects_too_many_regions() {
        let mut h = small();
        h.regions = vec![Region::default(); MAX_REGIONS];
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        assert_eq!(h.encoded_len(), MAX_ENCODED_LEN - 12); // IPv4: 12 bytes short of IPv6
        h.regions.push(Region::default());
        parse_err(&h.encode(), "4097 regions: at most 4096");
        assert_eq!(h.validate().unwrap_err().kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn random_psn_is_24_bit_and_varies() {
        let psns: Vec<u32> = (0..16).map(|_| random_psn()).collect();
        assert!(psns.iter().all(|&p| p <= MASK_24));
        assert!(psns.iter().any(|&p| p != psns[0]), "{psns:?}");
    }

    #[test]
    fn peer_udp_addr_replaces_only_unspecified() {
        let tcp: IpAddr = "192.168.1.5".parse().unwrap();
        let v4 = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(peer_udp_addr(v4("10.1.1.1:9"), tcp), v4("10.1.1.1:9"));
        assert_eq!(peer_udp_addr(v4("0.0.0.0:9"), tcp), v4("192.168.1.5:9"));
        assert_eq!(peer_udp_addr(v4("[::]:9"), tcp), v4("192.168.1.5:9"));
        let mapped: IpAddr = "::ffff:192.168.1.5".parse().unwrap();
        assert_eq!(peer_udp_addr(v4("0.0.0.0:9"), mapped), v4("192.168.1.5:9"));
        let tcp6: IpAddr = "2001:db8::2".parse().unwrap();
        assert_eq!(peer_udp_addr(v4("[::]:9"), tcp6), v4("[2001:db8::2]:9"));
    }

    fn asymmetric() -> (Hello, Hello) {
        let mut a = small();
        a.udp = "0.0.0.0:5000".parse().unwrap();
        a.path_mtu = 4096;
        a.max_rd_atomic = 16;
        a.max_dest_rd_atomic = 4;
        let mut b = small();
        b.qpn = 0xab_cdef;
        b.psn = 0x00_0042;
        b.udp = "127.0.0.1:6000".parse().unwrap();
        b.path_mtu = 1024;
        b.max_rd_atomic = 2;
        b.max_dest_rd_atomic = 8;
        b.credits = 128;
        b.regions.push(Region {
            addr: 0x7f00_0000_0000,
            len: 1 << 21,
            rkey: 7,
            access: access::REMOTE_READ,
        });
        (a, b)
    }

    /// Checks what each side of the `asymmetric` pair negotiates.
    fn check_asymmetric(a: &Hello, b: &Hello, at_a: &Negotiated, at_b: &Negotiated) {
        assert_eq!(at_a.path_mtu, 1024);
        assert_eq!(at_b.path_mtu, 1024);
        // a can issue 16 but b accepts 8; b can issue 2 and a accepts 4.
        assert_eq!((at_a.max_rd_atomic, at_a.max_dest_rd_atomic), (8, 4));
        assert_eq!((at_b.max_rd_atomic, at_b.max_dest_rd_atomic), (2, 8));
        assert_eq!((at_a.sq_psn, at_a.rq_psn), (a.psn, b.psn));
        assert_eq!((at_b.sq_psn, at_b.rq_psn), (b.psn, a.psn));
        assert_eq!((at_a.dest_qpn, at_b.dest_qpn), (b.qpn, a.qpn));
        assert_eq!(at_a.peer_udp, "127.0.0.1:6000".parse().unwrap());
        // a advertised 0.0.0.0: b uses the TCP peer's IP.
        assert_eq!(at_b.peer_udp, "127.0.0.1:5000".parse().unwrap());
        assert_eq!(at_a.peer_regions, b.regions);
        assert_eq!(at_b.peer_regions, a.regions);
        assert_eq!((at_a.peer_credits, at_b.peer_credits), (128, 64));
    }

    #[test]
    fn negotiate_both_ways() {
        let (a, b) = asymmetric();
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let at_a = negotiate(&a, &b, lo).unwrap();
        let at_b = negotiate(&b, &a, lo).unwrap();
        check_asymmetric(&a, &b, &at_a, &at_b);
    }

    #[test]
    fn negotiate_rejects_incompatible_and_invalid() {
        let (a, mut b) = asymmetric();
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        b.version = 0x0203;
        let e = negotiate(&a, &b, lo).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
        assert_eq!(
            e.message(),
            "incompatible protocol versions: mine 1.0, peer's 2.3; the major versions must match"
        );
        let e = negotiate(&b, &a, lo).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        b.version = 0x0105;
        assert!(
            negotiate(&a, &b, lo).is_ok(),
            "minor versions are compatible"
        );
        b.path_mtu = 1500;
        let e = negotiate(&a, &b, lo).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Parse);
        assert!(
            e.message().contains("peer's hello: invalid path_mtu 1500"),
            "{e}"
        );
        let e = negotiate(&b, &a, lo).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.message().contains("invalid path_mtu 1500"), "{e}");
    }

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        (client, server)
    }

    const T: Duration = Duration::from_secs(5);
    const SHORT: Duration = Duration::from_millis(200);

    #[test]
    fn offered_path_mtu_on_loopback() {
        let (ca, cb) = pair();
        // `lo` (65536 unless changed) fits 4096: the configured value is offered as is.
        for stream in [&ca, &cb] {
            for configured in MTUS {
                let p = offered_path_mtu(stream, configured).unwrap();
                assert_eq!(p.configured, configured);
                assert_eq!(p.active, 4096, "{p:?}");
                assert_eq!(p.offered, configured, "{p:?}");
                assert!(!p.clamped());
                assert!(p.link_mtu >= 4163, "{p:?}");
            }
        }
    }

    #[test]
    fn exchange_negotiate_ready_over_tcp() {
        let (a, b) = asymmetric();
        let (mut ca, mut cb) = pair();
        let b2 = b.clone();
        let peer_b = std::thread::spawn(move || {
            let got = exchange(&mut cb, &b2, T).unwrap();
            let n = negotiate(&b2, &got, cb.peer_addr().unwrap().ip()).unwrap();
            ready(&mut cb, T).unwrap();
            (
                got,
                n,
                cb.read_timeout().unwrap(),
                cb.write_timeout().unwrap(),
            )
        });
        let got_a = exchange(&mut ca, &a, T).unwrap();
        let at_a = negotiate(&a, &got_a, ca.peer_addr().unwrap().ip()).unwrap();
        ready(&mut ca, T).unwrap();
        let (got_b, at_b, rt, wt) = peer_b.join().unwrap();
        assert_eq!(got_a, b);
        assert_eq!(got_b, a);
        check_asymmetric(&a, &b, &at_a, &at_b);
        // Timeouts restored: the side channel stays blocking for liveness reads.
        assert_eq!((rt, wt), (None, None));
        assert_eq!(ca.read_timeout().unwrap(), None);
        assert_eq!(ca.write_timeout().unwrap(), None);
    }

    #[test]
    fn exchange_restores_previous_timeouts() {
        let (mut ca, mut cb) = pair();
        let t = Some(Duration::from_secs(42));
        ca.set_read_timeout(t).unwrap();
        let peer = std::thread::spawn(move || exchange(&mut cb, &small(), T).map(|_| ()));
        exchange(&mut ca, &small(), T).unwrap();
        peer.join().unwrap().unwrap();
        assert_eq!(ca.read_timeout().unwrap(), t);
        assert_eq!(ca.write_timeout().unwrap(), None);
    }

    #[test]
    fn exchange_of_largest_hellos_does_not_deadlock() {
        // Both sides write ~96 KiB before reading.
        let mut h = small();
        h.udp = "[::1]:1".parse().unwrap();
        h.regions = vec![Region::default(); MAX_REGIONS];
        assert_eq!(h.encoded_len(), MAX_ENCODED_LEN);
        let (mut ca, mut cb) = pair();
        let h2 = h.clone();
        let peer = std::thread::spawn(move || exchange(&mut cb, &h2, T));
        assert_eq!(exchange(&mut ca, &h, T).unwrap(), h);
        assert_eq!(peer.join().unwrap().unwrap(), h);
    }

    /// Runs `exchange` against a peer doing `peer`, returning the error and how long it took.
    fn exchange_against(
        timeout: Duration,
        peer: impl FnOnce(TcpStream) + Send + 'static,
    ) -> (Error, Duration) {
        let (mut ca, cb) = pair();
        let peer = std::thread::spawn(move || peer(cb));
        let start = Instant::now();
        let e = exchange(&mut ca, &small(), timeout).unwrap_err();
        let took = start.elapsed();
        peer.join().unwrap();
        (e, took)
    }

    #[test]
    fn exchange_peer_closes_before_sending() {
        let (e, took) = exchange_against(T, drop);
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        // EOF, or a reset when our hello arrived at a closed socket.
        assert!(
            e.message()
                .contains("peer closed the connection before sending the peer's hello")
                || e.message().contains("reset"),
            "{e}"
        );
        assert!(took < T, "EOF must not wait for the timeout");
    }

    #[test]
    fn exchange_peer_closes_mid_hello() {
        let (e, _) = exchange_against(T, |mut s| {
            s.write_all(&SMALL[..20]).unwrap();
            // Read ours so the close is a FIN, not a reset.
            let mut buf = [0u8; SMALL.len()];
            s.read_exact(&mut buf).unwrap();
        });
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        assert!(
            e.message()
                .contains("before sending the peer's hello (20 of 61 bytes received)"),
            "{e}"
        );
    }

    #[test]
    fn exchange_peer_sends_garbage() {
        let (e, _) = exchange_against(T, |mut s| {
            s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        });
        assert_eq!(e.kind(), ErrorKind::Parse, "{e}");
        assert!(
            e.message().contains("hello length 1195725856 out of range"),
            "{e}"
        );

        // A plausible length but a bad body.
        let (e, _) = exchange_against(T, |mut s| {
            s.write_all(&patched(4, b"XXXX")).unwrap();
        });
        assert_eq!(e.kind(), ErrorKind::Parse, "{e}");
        assert!(e.message().contains("bad magic"), "{e}");
    }

    #[test]
    fn exchange_times_out_when_peer_is_silent() {
        let (e, took) = exchange_against(SHORT, |mut s| {
            // Hold the connection open past the timeout without writing.
            let mut buf = [0u8; 1];
            let _ = s.read(&mut buf);
            std::thread::sleep(SHORT * 3);
        });
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        assert!(
            e.message()
                .contains("timed out waiting for the peer's hello length prefix")
        );
        assert!(took >= SHORT && took < SHORT * 3, "{took:?}");
    }

    #[test]
    fn exchange_deadline_covers_a_trickling_peer() {
        let (e, took) = exchange_against(SHORT, |mut s| {
            for &b in &SMALL[..10] {
                if s.write_all(&[b]).is_err() {
                    return;
                }
                std::thread::sleep(SHORT / 4);
            }
        });
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        assert!(e.message().contains("timed out"), "{e}");
        assert!(took < SHORT * 2, "{took:?}");
    }

    #[test]
    fn zero_timeout_and_invalid_hello_are_invalid_arguments() {
        let (mut ca, _cb) = pair();
        let e = exchange(&mut ca, &small(), Duration::ZERO).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let mut h = small();
        h.qpn = 1 << 24;
        let e = exchange(&mut ca, &h, T).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(
            ready(&mut ca, Duration::ZERO).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn ready_errors() {
        // Wrong byte.
        let (mut ca, mut cb) = pair();
        cb.write_all(b"X").unwrap();
        let e = ready(&mut ca, T).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Parse, "{e}");
        assert!(e.message().contains("got 0x58"), "{e}");
        // Peer gone.
        let (mut ca, cb) = pair();
        drop(cb);
        let e = ready(&mut ca, T).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        // Peer silent.
        let (mut ca, _cb) = pair();
        let e = ready(&mut ca, SHORT).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{e}");
        assert!(
            e.message()
                .contains("timed out waiting for the peer's ready byte"),
            "{e}"
        );
    }

    #[test]
    fn ready_in_halves_meets_ready() {
        // A listener reads the client's byte first and sends its own later.
        let (mut client, mut server) = pair();
        let c = std::thread::spawn(move || ready(&mut client, T));
        await_ready(&mut server, T).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!c.is_finished(), "the client waits for our byte");
        send_ready(&mut server, T).unwrap();
        c.join().unwrap().unwrap();
        // The halves report like `ready`.
        let (mut ca, mut cb) = pair();
        cb.write_all(b"X").unwrap();
        let e = await_ready(&mut ca, T).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Parse, "{e}");
        let (mut ca, _cb) = pair();
        let e = await_ready(&mut ca, SHORT).unwrap_err();
        assert!(
            e.message()
                .contains("timed out waiting for the peer's ready byte"),
            "{e}"
        );
        assert_eq!(
            send_ready(&mut ca, Duration::ZERO).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    fn arb_region() -> impl Strategy<Value = Region> {
        (any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>()).prop_map(
            |(addr, len, rkey, access)| Region {
                addr,
                len: len.min(u64::MAX - addr),
                rkey,
                access,
            },
        )
    }

    fn arb_hello() -> impl Strategy<Value = Hello> {
        let addr = prop_oneof![
            (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((ip, p))),
            (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((ip, p))),
        ];
        (
            (any::<u8>(), any::<u16>(), 0..=MASK_24, 0..=MASK_24, addr),
            (
                any::<Option<u16>>(),
                any::<Option<(u64, u16)>>().prop_map(|l| {
                    l.map(|(b, s)| MsgLimitsWire {
                        max_message_bytes: b,
                        max_segments: s,
                    })
                }),
            ),
            (
                prop::sample::select(MTUS.to_vec()),
                any::<u8>(),
                any::<u8>(),
                any::<u32>(),
            ),
            prop::collection::vec(arb_region(), 0..8),
        )
            .prop_map(
                |(
                    (minor, flags, qpn, psn, udp),
                    (src_port, limits),
                    (mtu, rd, dest, credits),
                    regions,
                )| {
                    Hello {
                        version: VERSION & 0xff00 | u16::from(minor),
                        flags: flags & !(FLAG_SRC_PORT | FLAG_LIMITS)
                            | if src_port.is_some() { FLAG_SRC_PORT } else { 0 }
                            | if limits.is_some() { FLAG_LIMITS } else { 0 },
                        src_port,
                        limits,
                        qpn,
                        psn,
                        udp,
                        path_mtu: mtu,
                        max_rd_atomic: rd,
                        max_dest_rd_atomic: dest,
                        credits,
                        regions,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn decode_is_total(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(h) = Hello::decode(&bytes) {
                prop_assert_eq!(h.encode(), bytes);
            }
        }

        /// Arbitrary bytes rarely get past the length and magic; mutate valid encodings too.
        #[test]
        fn decode_of_mutated_hellos_is_total(
            h in arb_hello(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut bytes = h.encode();
            for (i, v) in edits {
                let i = i.index(bytes.len());
                bytes[i] = v;
            }
            for b in [&bytes[..], &bytes[..cut.index(bytes.len())]] {
                if let Ok(d) = Hello::decode(b) {
                    prop_assert_eq!(d.encode(), b);
                }
            }
        }

        #[test]
        fn round_trip(h in arb_hello()) {
            prop_assert!(h.validate().is_ok());
            let bytes = h.encode();
            prop_assert_eq!(bytes.len(), h.encoded_len());
            prop_assert_eq!(Hello::decode(&bytes).unwrap(), h);
        }
    }
}

//! The [`Hello`] each side sends on the side channel: its fields, the checks on them, and
//! its binary encoding (the table in `setup/mod.rs`). Decoding is total.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use super::*;
use crate::error::{Error, ErrorKind, Result};

/// A messenger's message limits as a hello carries them ([`FLAG_LIMITS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsgLimitsWire {
    pub max_message_bytes: u64,
    pub max_segments: u16,
}
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

impl Hello {
    /// Checks the fields the encoding cannot express or the peer cannot use. Used by
    /// [`Hello::decode`] (as a parse error) and on the local hello by [`exchange`] and
    /// [`negotiate`] (as an invalid argument).
    pub fn validate(&self) -> Result<()> {
        self.check()
            .map_err(|m| Error::new(ErrorKind::InvalidArgument, m))
    }

    pub(super) fn check(&self) -> std::result::Result<(), String> {
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

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
//!
//! The files: `hello.rs` (the [`Hello`], its encoding and checks), `negotiate.rs` (both
//! hellos to the QP's parameters, the offered path MTU, PSNs), `exchange.rs` (the blocking
//! steps on the side channel, each within one deadline).

mod exchange;
mod hello;
mod negotiate;
#[cfg(test)]
mod tests;

/// Memory a hello exposes (provider-neutral: `Device::exposed` lists it).
pub use crate::provider::region::Region;
pub use exchange::{await_ready, exchange_tagged, ready, send_ready};
pub use hello::{Hello, MsgLimitsWire};
pub use negotiate::{negotiate, offered_path_mtu, random_psn};

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

//! The messenger's wire format: a fixed 64-byte header at the start of a [`SLOT`]-byte
//! header slot, then (eager) the data segment or (rendezvous) a descriptor block.
//!
//! Credits come with grants: a header that announces `credits` new receives lists (with
//! [`flags::GRANTS`]), after its inline front (padded to 8), one [`GRANT_LEN`]-byte entry
//! per receive, in posting order: the address and rkey of the receive's data chunk
//! (`addr: u64, rkey: u32`). The
//! sender then may RDMA WRITE an eager segment into the chunk of the receive its next SEND
//! consumes (receives are consumed in order) and send the header alone with
//! [`flags::WRITTEN`] (version 3): a 4 KiB message is a 4 KiB WRITE (one packet at MTU 4096)
//! and a short SEND instead of a SEND of 512 + 4096 bytes (two packets), and a batch of them
//! leaves as a run of equal WRITEs and a run of equal SENDs (`Link::flush`).
//!
//! Every SEND with a payload is `[header slot: SLOT bytes][payload: 1..=4096 bytes]`, and
//! every posted receive is `[header slot][one 4 KiB pool chunk]`, so the payload lands at
//! the start of the chunk, page-aligned. A SEND without one is only the header and the
//! inline front (`HDR_LEN + front_len` bytes; version 2: version 1 sent the whole slot, 448
//! bytes of it unused by a 64-byte request, on the wire, through two kernel copies and the
//! ICRC). The payload is one of:
//! - nothing (control messages, and messages without data whose front fits the slot);
//! - eager: the single data segment (`data_len` bytes, at most 4096);
//! - rendezvous (`RNDV`): a descriptor block: the front (when it did not fit the slot),
//!   padded to 8, then per segment `len: u32, parts: u32`, then per part
//!   `addr: u64, len: u32, rkey: u32`: the sender's memory the receiver RDMA READs.
//!
//! All integers are little-endian. Parsing never panics: anything out of bounds or
//! inconsistent is a [`Malformed`] error, which faults the connection.

use crate::error::{Error, ErrorKind};

/// The header slot: header + inline front.
pub const SLOT: usize = 512;
/// The fixed header.
pub const HDR_LEN: usize = 64;
/// The largest front carried in the slot.
pub const FRONT_INLINE_MAX: usize = SLOT - HDR_LEN;
/// The payload area of a receive (one pool chunk).
pub const PAYLOAD_MAX: usize = 4096;
/// The largest front (carried in the descriptor block when larger than the slot room).
pub const FRONT_MAX: usize = 2048;
/// Data segments per message: the wire's bound. A messenger's own is `msgr_max_segments`
/// (at most this), and its bytes per message `msgr_max_message_bytes` (at most
/// `MAX_SEGS` x [`MAX_SEG_LEN`] = 1 GiB): see `settings::MsgLimits`.
pub const MAX_SEGS: usize = 64;
/// RDMA WRITEs before one message ([`super::OutMessage::writes`]).
pub const MAX_WRITES: usize = 16;
/// Bytes per segment entry and per part entry in a descriptor block.
pub const SEG_ENTRY: usize = 8;
pub const PART_ENTRY: usize = 16;
/// The largest data segment (the limit of a u32 length is far off; this one bounds what a
/// peer can make us allocate for one segment).
pub const MAX_SEG_LEN: usize = 16 << 20;

/// Bytes per grant (the data chunk of a receive posted for the peer).
pub const GRANT_LEN: usize = 12;

const MAGIC: u16 = 0x4d58; // "XM"
const VERSION: u8 = 3;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Session handshake: `aux` = sender's session id, `aux2` = the receiver's session id
    /// as the sender knows it (0 = none), `aux3` = last sequence number the sender
    /// delivered from this session; `credits` = receives posted beyond this one. From the
    /// connecting side also `seq` = its messenger's incarnation (a random nonce) and
    /// `msg_type` = the TCP port it listens on (0: none), by which the accepting side
    /// tells a restarted connector (see `shard.rs`).
    Hello = 1,
    /// An application message (`seq` > 0).
    Msg = 2,
    /// Acknowledgement and credits only.
    Ack = 3,
    /// Keepalive probe (`aux` = nonce) and its answer.
    Ping = 4,
    Pong = 5,
    /// The sender closed the session (best effort).
    Bye = 6,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Msg,
            3 => Kind::Ack,
            4 => Kind::Ping,
            5 => Kind::Pong,
            6 => Kind::Bye,
            _ => return None,
        })
    }
}

/// Header flags.
pub mod flags {
    /// The payload is a descriptor block (rendezvous).
    pub const RNDV: u16 = 1;
    /// The sender has messages waiting for credits (the receiver grows its window).
    pub const STARVED: u16 = 2;
    /// Hello: the sender's session is lossy.
    pub const LOSSY: u16 = 4;
    /// Eager: the data segment (`payload_len` bytes) was RDMA WRITTEN into the data chunk
    /// of the receive this message consumed (granted by the receiver); the SEND is the
    /// header, front and grants only.
    pub const WRITTEN: u16 = 8;
    /// The credits this header announces come with grants (the sender's receive chunks
    /// take remote writes: its `msgr_eager_write` is on); without it, none follow.
    pub const GRANTS: u16 = 16;
    /// Hello: a path-join. The link is another path of the session the hello names
    /// (`aux` the sender's id, `aux2` the receiver's), `ack` the path's index (a hello
    /// acknowledges nothing); the
    /// answer carries it too. The session goes on on its current path meanwhile.
    pub const JOIN: u16 = 32;
    /// Ack: the sender moved the session's traffic to this link (a path switch). `aux`:
    /// the switch's number (the accepting side follows the newest and answers with its
    /// own); `aux2`: every message the sender sends after this frame on the link is
    /// numbered above it (a lossy receiver skips what did not arrive: the sender reported
    /// it in doubt, and an immediate message, which carries no number, is numbered from
    /// there).
    pub const SWITCH: u16 = 64;
    /// Hello (a session's, a path-join and its answer): the sender's session uses every
    /// joined path for data (path policy active/active): messages arrive on any link, out
    /// of order across links, and the receiver holds those ahead of a gap. A join answered
    /// without it (a peer built before it) keeps that path out of the session.
    pub const ACTIVE: u16 = 128;
    /// Ack of an active/active lossy session: sequence numbers that will not come (they
    /// went on a link that failed; the sender reported them in doubt). `aux` = the first,
    /// `aux2` (bits 0-63) and `aux3` (bits 64-127) a bitmap: bit `i` names `aux + i`.
    pub const GIVEUP: u16 = 256;
}

/// A receive's data chunk, granted to the peer (it may WRITE eager data there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub addr: u64,
    pub rkey: u32,
}

/// The fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub kind: u8,
    pub flags: u16,
    pub msg_type: u16,
    pub seq: u64,
    /// Cumulative: every message up to this sequence number was delivered.
    pub ack: u64,
    /// New credits granted by this message (receives posted for the peer).
    pub credits: u32,
    pub front_len: u32,
    pub nsegs: u16,
    /// Eager: the bytes of the data segment; rendezvous: the descriptor block's length.
    pub payload_len: u32,
    pub aux: u64,
    pub aux2: u64,
    pub aux3: u64,
}

/// A header or descriptor block the peer should not have sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl From<Malformed> for Error {
    fn from(m: Malformed) -> Error {
        Error::fixed(ErrorKind::InvalidValue, m.0)
    }
}

fn get<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(s) = b.get(at..at + N) {
        out.copy_from_slice(s);
    }
    out
}

impl Header {
    pub fn new(kind: Kind) -> Header {
        Header {
            kind: kind as u8,
            ..Header::default()
        }
    }

    pub fn kind(&self) -> Option<Kind> {
        Kind::from_u8(self.kind)
    }

    /// Writes the header into `out[..HDR_LEN]` (`out` must be at least that long).
    pub fn emit(&self, out: &mut [u8]) {
        let Some(o) = out.get_mut(..HDR_LEN) else {
            return;
        };
        o.fill(0);
        o[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        o[2] = VERSION;
        o[3] = self.kind;
        o[4..6].copy_from_slice(&self.flags.to_le_bytes());
        o[6..8].copy_from_slice(&self.msg_type.to_le_bytes());
        o[8..16].copy_from_slice(&self.seq.to_le_bytes());
        o[16..24].copy_from_slice(&self.ack.to_le_bytes());
        o[24..28].copy_from_slice(&self.credits.to_le_bytes());
        o[28..32].copy_from_slice(&self.front_len.to_le_bytes());
        o[32..34].copy_from_slice(&self.nsegs.to_le_bytes());
        o[36..40].copy_from_slice(&self.payload_len.to_le_bytes());
        o[40..48].copy_from_slice(&self.aux.to_le_bytes());
        o[48..56].copy_from_slice(&self.aux2.to_le_bytes());
        o[56..64].copy_from_slice(&self.aux3.to_le_bytes());
    }

    /// Parses the slot of a received message whose total length was `byte_len` and checks
    /// the header against it.
    pub fn parse(slot: &[u8], byte_len: usize) -> Result<Header, Malformed> {
        if slot.len() < HDR_LEN || byte_len < HDR_LEN {
            return Err(Malformed("message shorter than its header"));
        }
        if u16::from_le_bytes(get(slot, 0)) != MAGIC {
            return Err(Malformed("bad magic in message header"));
        }
        if slot[2] != VERSION {
            return Err(Malformed("unknown message header version"));
        }
        let h = Header {
            kind: slot[3],
            flags: u16::from_le_bytes(get(slot, 4)),
            msg_type: u16::from_le_bytes(get(slot, 6)),
            seq: u64::from_le_bytes(get(slot, 8)),
            ack: u64::from_le_bytes(get(slot, 16)),
            credits: u32::from_le_bytes(get(slot, 24)),
            front_len: u32::from_le_bytes(get(slot, 28)),
            nsegs: u16::from_le_bytes(get(slot, 32)),
            payload_len: u32::from_le_bytes(get(slot, 36)),
            aux: u64::from_le_bytes(get(slot, 40)),
            aux2: u64::from_le_bytes(get(slot, 48)),
            aux3: u64::from_le_bytes(get(slot, 56)),
        };
        let kind = h.kind().ok_or(Malformed("unknown message kind"))?;
        // A payload follows a whole slot; a message without one may end after its grants
        // (shorter than the slot: no payload counted). Written data is not in the SEND.
        let on_wire = if h.has(flags::WRITTEN) {
            0
        } else {
            h.payload_len as usize
        };
        if byte_len.saturating_sub(SLOT) != on_wire || h.payload_len as usize > PAYLOAD_MAX {
            return Err(Malformed(
                "payload length disagrees with the received length",
            ));
        }
        if h.has(flags::GRANTS) && h.credits as usize > (SLOT - HDR_LEN) / GRANT_LEN {
            return Err(Malformed("more credits than a header slot can grant"));
        }
        if kind != Kind::Msg {
            if h.payload_len != 0
                || h.nsegs != 0
                || h.front_len != 0
                || h.flags & flags::WRITTEN != 0
            {
                return Err(Malformed("control message with a payload"));
            }
            return h.check_grants(byte_len);
        }
        if h.seq == 0 {
            return Err(Malformed("message without a sequence number"));
        }
        if h.nsegs as usize > MAX_SEGS || h.front_len as usize > FRONT_MAX {
            return Err(Malformed("too many segments or too large a front"));
        }
        if h.flags & flags::RNDV == 0 {
            if h.front_len as usize > FRONT_INLINE_MAX || h.nsegs > 1 {
                return Err(Malformed(
                    "eager message with a front or segments that do not fit",
                ));
            }
            if h.nsegs == 0 && h.payload_len != 0 {
                return Err(Malformed("eager message with a payload and no segment"));
            }
            // The inline front must have arrived (the rest of the slot holds old bytes).
            if byte_len < HDR_LEN + h.front_len as usize {
                return Err(Malformed("message shorter than its front"));
            }
        }
        if h.has(flags::WRITTEN) && (h.has(flags::RNDV) || h.nsegs != 1 || h.payload_len == 0) {
            return Err(Malformed("written data that is not one eager segment"));
        }
        h.check_grants(byte_len)
    }

    /// Where the grants start in the slot: after the inline front, padded to 8.
    pub fn grants_at(&self) -> usize {
        HDR_LEN + self.inline_front().next_multiple_of(8)
    }

    /// The end of the grants: the shortest the message may be (SEND without payload).
    pub fn grants_end(&self) -> usize {
        match self.granted() {
            // No grants: the header and the inline front, unpadded.
            0 => HDR_LEN + self.inline_front(),
            n => self.grants_at() + n * GRANT_LEN,
        }
    }

    /// How many grants follow the front: one per credit with [`flags::GRANTS`], else none.
    pub fn granted(&self) -> usize {
        if self.has(flags::GRANTS) {
            self.credits as usize
        } else {
            0
        }
    }

    fn inline_front(&self) -> usize {
        if self.kind == Kind::Msg as u8 && !self.has(flags::RNDV) {
            self.front_len as usize
        } else {
            0
        }
    }

    fn check_grants(self, byte_len: usize) -> Result<Header, Malformed> {
        let end = self.grants_end();
        if end > SLOT {
            return Err(Malformed("grants do not fit the header slot"));
        }
        if byte_len < end {
            return Err(Malformed("message shorter than its grants"));
        }
        Ok(self)
    }

    /// The grants of a parsed header, from its slot (none without [`flags::GRANTS`]).
    pub fn grants<'a>(&self, slot: &'a [u8]) -> impl Iterator<Item = Grant> + 'a {
        let at = self.grants_at();
        let n = self.granted();
        slot.get(at..at + n * GRANT_LEN)
            .unwrap_or(&[])
            .chunks_exact(GRANT_LEN)
            .map(|e| Grant {
                addr: u64::from_le_bytes(get(e, 0)),
                rkey: u32::from_le_bytes(get(e, 8)),
            })
    }

    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

/// Writes grants into a slot at `at` (the header's [`Header::grants_at`]); returns how
/// many fit (the rest wait for a later header).
pub fn emit_grants(slot: &mut [u8], at: usize, grants: impl Iterator<Item = Grant>) -> usize {
    let mut n = 0;
    for g in grants {
        let Some(e) = slot.get_mut(at + n * GRANT_LEN..at + (n + 1) * GRANT_LEN) else {
            break;
        };
        e[0..8].copy_from_slice(&g.addr.to_le_bytes());
        e[8..12].copy_from_slice(&g.rkey.to_le_bytes());
        n += 1;
    }
    n
}

/// One part of a rendezvous segment: the sender's memory to READ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub addr: u64,
    pub len: u32,
    pub rkey: u32,
}

/// A rendezvous segment: its length and its parts (which add up to it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegDesc {
    pub len: u32,
    pub parts: Vec<Part>,
}

/// The size of a descriptor block.
pub fn block_len(front_len: usize, segs: &[SegDesc]) -> usize {
    front_len.next_multiple_of(8)
        + segs
            .iter()
            .map(|s| SEG_ENTRY + PART_ENTRY * s.parts.len())
            .sum::<usize>()
}

/// Writes a descriptor block into `out`; returns its length, or None if it does not fit.
pub fn emit_block(out: &mut [u8], front: &[u8], segs: &[SegDesc]) -> Option<usize> {
    let n = block_len(front.len(), segs);
    let o = out.get_mut(..n)?;
    o.fill(0);
    o[..front.len()].copy_from_slice(front);
    let mut at = front.len().next_multiple_of(8);
    for s in segs {
        o[at..at + 4].copy_from_slice(&s.len.to_le_bytes());
        o[at + 4..at + 8].copy_from_slice(&(s.parts.len() as u32).to_le_bytes());
        at += SEG_ENTRY;
        for p in &s.parts {
            o[at..at + 8].copy_from_slice(&p.addr.to_le_bytes());
            o[at + 8..at + 12].copy_from_slice(&p.len.to_le_bytes());
            o[at + 12..at + 16].copy_from_slice(&p.rkey.to_le_bytes());
            at += PART_ENTRY;
        }
    }
    Some(n)
}

/// Parses a descriptor block of `h` (front length, segment count) from `block`.
pub fn parse_block(h: &Header, block: &[u8]) -> Result<(Vec<u8>, Vec<SegDesc>), Malformed> {
    let bad = Malformed("descriptor block out of bounds or inconsistent");
    let front_len = h.front_len as usize;
    let front = block.get(..front_len).ok_or(bad)?.to_vec();
    let mut at = front_len.next_multiple_of(8);
    let mut segs = Vec::with_capacity(h.nsegs as usize);
    for _ in 0..h.nsegs {
        let e = block.get(at..at + SEG_ENTRY).ok_or(bad)?;
        let len = u32::from_le_bytes(get(e, 0));
        let nparts = u32::from_le_bytes(get(e, 4)) as usize;
        at += SEG_ENTRY;
        if len as usize > MAX_SEG_LEN || nparts > block.len() / PART_ENTRY {
            return Err(bad);
        }
        let mut parts = Vec::with_capacity(nparts);
        let mut sum = 0u64;
        for _ in 0..nparts {
            let p = block.get(at..at + PART_ENTRY).ok_or(bad)?;
            let part = Part {
                addr: u64::from_le_bytes(get(p, 0)),
                len: u32::from_le_bytes(get(p, 8)),
                rkey: u32::from_le_bytes(get(p, 12)),
            };
            if part.len == 0 {
                return Err(bad);
            }
            sum += u64::from(part.len);
            parts.push(part);
            at += PART_ENTRY;
        }
        if sum != u64::from(len) {
            return Err(bad);
        }
        segs.push(SegDesc { len, parts });
    }
    if at != block.len() {
        return Err(bad);
    }
    Ok((front, segs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: Kind) -> Header {
        Header {
            seq: 7,
            ack: 5,
            credits: 3,
            msg_type: 9,
            aux: 11,
            aux2: 12,
            aux3: 13,
            ..Header::new(kind)
        }
    }

    #[test]
    fn header_round_trips() {
        let mut h = msg(Kind::Msg);
        h.front_len = 100;
        h.nsegs = 1;
        h.payload_len = 4096;
        let mut slot = [0u8; SLOT];
        h.emit(&mut slot);
        assert_eq!(Header::parse(&slot, SLOT + 4096), Ok(h));
        // The length on the wire must match.
        assert!(Header::parse(&slot, SLOT + 4095).is_err());
        assert!(Header::parse(&slot[..10], SLOT).is_err());
        // With a payload the whole slot comes first.
        assert!(Header::parse(&slot, HDR_LEN + 100).is_err());
    }

    /// A message without payload is its header and front only; one that ends before its
    /// front is malformed; a control message may be its header alone.
    #[test]
    fn a_message_without_payload_ends_after_its_front() {
        let mut h = msg(Kind::Msg);
        h.front_len = 24;
        let mut slot = [0u8; SLOT];
        h.emit(&mut slot);
        assert_eq!(Header::parse(&slot, HDR_LEN + 24), Ok(h));
        assert_eq!(Header::parse(&slot, SLOT), Ok(h));
        assert!(Header::parse(&slot, HDR_LEN + 23).is_err());
        assert!(Header::parse(&slot, HDR_LEN - 1).is_err());
        let c = msg(Kind::Ack);
        c.emit(&mut slot);
        assert_eq!(Header::parse(&slot, HDR_LEN), Ok(c));
    }

    /// Grants follow the inline front (padded to 8) and must have arrived; written data
    /// is one eager segment that is not in the SEND.
    #[test]
    fn grants_follow_the_front_and_written_data_is_not_on_the_wire() {
        let mut h = msg(Kind::Msg);
        h.front_len = 20;
        h.nsegs = 1;
        h.payload_len = 4096;
        h.credits = 2;
        h.flags = flags::GRANTS | flags::WRITTEN;
        assert_eq!(h.grants_at(), HDR_LEN + 24);
        assert_eq!(h.grants_end(), HDR_LEN + 24 + 2 * GRANT_LEN);
        let mut slot = [0u8; SLOT];
        h.emit(&mut slot);
        let g = [
            Grant {
                addr: 0x7f00_0000_1000,
                rkey: 7,
            },
            Grant {
                addr: 0x7f00_0000_2000,
                rkey: 8,
            },
        ];
        assert_eq!(emit_grants(&mut slot, h.grants_at(), g.iter().copied()), 2);
        let end = h.grants_end();
        assert_eq!(Header::parse(&slot, end), Ok(h));
        assert_eq!(h.grants(&slot).collect::<Vec<_>>(), g);
        // The grants must have arrived; the written data is not in the SEND.
        assert!(Header::parse(&slot, end - 1).is_err());
        assert!(Header::parse(&slot, SLOT + 4096).is_err());
        // Without the flag the credits carry no grants.
        let mut plain = h;
        plain.flags = flags::WRITTEN;
        plain.emit(&mut slot);
        assert_eq!(Header::parse(&slot, HDR_LEN + 20), Ok(plain));
        assert_eq!(plain.grants(&slot).count(), 0);
        // Written data must be one eager segment.
        let mut two = h;
        two.nsegs = 2;
        two.emit(&mut slot);
        assert!(Header::parse(&slot, SLOT).is_err());
        // More grants than the slot holds after the front.
        let mut many = h;
        many.front_len = 400;
        many.credits = 10;
        many.emit(&mut slot);
        assert!(Header::parse(&slot, SLOT).is_err());
        // emit_grants stops at the end of the slot.
        let lots = std::iter::repeat_n(g[0], 100);
        assert_eq!(emit_grants(&mut slot, 400, lots), (SLOT - 400) / GRANT_LEN);
    }

    #[test]
    fn garbage_is_malformed_never_a_panic() {
        let mut slot = [0u8; SLOT];
        for seed in 0..2000u32 {
            let mut x = seed.wrapping_mul(2_654_435_761);
            for b in slot.iter_mut() {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *b = x as u8;
            }
            if seed % 2 == 0 {
                slot[0..2].copy_from_slice(&MAGIC.to_le_bytes());
                slot[2] = VERSION;
                slot[3] = (seed % 8) as u8;
            }
            if let Ok(h) = Header::parse(&slot, SLOT + (seed as usize % 5000)) {
                let block = [0u8; PAYLOAD_MAX];
                let _ = parse_block(&h, &block[..h.payload_len as usize]);
            }
        }
        let mut c = msg(Kind::Ack);
        c.payload_len = 1;
        c.emit(&mut slot);
        assert!(Header::parse(&slot, SLOT + 1).is_err());
    }

    #[test]
    fn block_round_trips_and_checks_sums() {
        let segs = vec![
            SegDesc {
                len: 10_000,
                parts: vec![
                    Part {
                        addr: 0x1000,
                        len: 4096,
                        rkey: 1,
                    },
                    Part {
                        addr: 0x9000,
                        len: 5904,
                        rkey: 2,
                    },
                ],
            },
            SegDesc {
                len: 5,
                parts: vec![Part {
                    addr: 3,
                    len: 5,
                    rkey: 3,
                }],
            },
        ];
        let mut out = [0u8; PAYLOAD_MAX];
        let n = emit_block(&mut out, b"front", &segs).unwrap();
        assert_eq!(n, block_len(5, &segs));
        let mut h = Header::new(Kind::Msg);
        h.front_len = 5;
        h.nsegs = 2;
        assert_eq!(
            parse_block(&h, &out[..n]),
            Ok((b"front".to_vec(), segs.clone()))
        );
        out[8] ^= 1; // the first segment's length no longer matches its parts
        assert!(parse_block(&h, &out[..n]).is_err());
        assert!(parse_block(&h, &out[..n - 1]).is_err());
    }
}

//! The block protocol's messages (little endian), carried as messenger fronts.
//!
//! Request (`MSG_REQ`, 32 bytes + the volume name for `Open`):
//! `version u8 | op u8 | flags u16 | vol u32 | req_id u64 | offset u64 | len u32 | rsvd u32`.
//! Write data is the message's one data segment (`len` bytes). A read with the flag
//! [`REQ_PLACE`] names the caller's buffer in 16 more bytes, `buf_addr u64 | buf_rkey u32
//! | rsvd u32` (registered by the client with remote write access): the target RDMA WRITEs
//! the data there, right before the reply's SEND on the same connection, and the reply
//! carries no data. With [`REQ_IMM_REPLY`] as well, a read that succeeds is answered by
//! that WRITE alone, as an RDMA WRITE WITH IMMEDIATE whose 32-bit value is the low half of
//! `req_id` (a messenger immediate message, type `MSG_TYPE_IMM`): no reply message. Errors
//! still get a reply.
//!
//! Reply (`MSG_REPLY`, 24 bytes, 56 for `Open`/`Query`):
//! `version u8 | op u8 | rsvd u16 | status u32 (0 or an errno) | req_id u64 | len u32 | rsvd u32`
//! then for `Open`/`Query`: `vol u32 | block_size u32 | size u64 | region_addr u64 |
//! region_rkey u32 | rdma_port u16 | flags u16`. Read data is the reply's one data segment,
//! unless the request named a buffer ([`REQ_PLACE`]).

/// Messenger message types.
pub const MSG_REQ: u16 = 0x4b01;
pub const MSG_REPLY: u16 = 0x4b02;
pub const VERSION: u8 = 1;
/// Block size every volume has (IO offsets and lengths are multiples of it).
pub const BLOCK: u32 = 4096;
/// Largest IO in one request.
pub const MAX_IO: u32 = 1 << 20;
/// Longest volume name.
pub const NAME_MAX: usize = 255;
pub const REQ_LEN: usize = 32;
/// A request with [`REQ_PLACE`]: the buffer's address and rkey follow the 32 bytes.
pub const REQ_PLACE_LEN: usize = 48;
/// Request flag: the read's data goes to the buffer the request names (RDMA WRITE), not
/// into the reply.
pub const REQ_PLACE: u16 = 1;
/// Request flag (reads with [`REQ_PLACE`] only): answer success with the WRITE's immediate
/// value (`req_id as u32`) instead of a reply message: one packet per 4 KiB read, and no
/// reply SEND, header or parse on either side.
pub const REQ_IMM_REPLY: u16 = 2;
pub const REPLY_LEN: usize = 24;
pub const INFO_LEN: usize = 56;
/// `Info::flags`: the volume's region is open to one-sided READ/WRITE at `rdma_port`.
pub const INFO_ONE_SIDED: u16 = 1;
/// `Info::flags`: this session may only read the volume (`Write` and `Flush` get
/// `EACCES`; the one-sided rkey, if any, allows RDMA READ only).
pub const INFO_READ_ONLY: u16 = 2;

/// Request operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Open a volume by name: the reply carries its handle and [`Info`].
    Open = 1,
    /// The size and block size of an open volume.
    Query = 2,
    Read = 3,
    Write = 4,
    /// Makes the writes that completed durable (file volumes: `fdatasync`).
    Flush = 5,
}

impl Op {
    pub fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Open,
            2 => Op::Query,
            3 => Op::Read,
            4 => Op::Write,
            5 => Op::Flush,
            _ => return None,
        })
    }
}

/// A decoded request header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqHdr {
    pub op: u8,
    pub vol: u32,
    pub req_id: u64,
    pub offset: u64,
    pub len: u32,
    /// `Read` with [`REQ_PLACE`]: the caller's buffer (address, rkey) the target WRITEs.
    pub place: Option<(u64, u32)>,
    /// [`REQ_IMM_REPLY`]: a successful placed read is answered by an immediate message.
    pub imm_reply: bool,
    /// `Open`: the volume's name.
    pub name: Vec<u8>,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}

impl ReqHdr {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(REQ_LEN + self.name.len());
        v.push(VERSION);
        v.push(self.op);
        let mut flags = if self.place.is_some() { REQ_PLACE } else { 0 };
        if self.imm_reply {
            flags |= REQ_IMM_REPLY;
        }
        v.extend_from_slice(&flags.to_le_bytes());
        v.extend_from_slice(&self.vol.to_le_bytes());
        v.extend_from_slice(&self.req_id.to_le_bytes());
        v.extend_from_slice(&self.offset.to_le_bytes());
        v.extend_from_slice(&self.len.to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        if let Some((addr, rkey)) = self.place {
            v.extend_from_slice(&addr.to_le_bytes());
            v.extend_from_slice(&rkey.to_le_bytes());
            v.extend_from_slice(&0u32.to_le_bytes());
        }
        v.extend_from_slice(&self.name);
        v
    }

    /// `None` for a front too short or of another version (the request id, when present,
    /// is returned apart so that the target can still answer it).
    pub fn decode(b: &[u8]) -> Result<ReqHdr, Option<u64>> {
        if b.len() < REQ_LEN {
            return Err((b.len() >= 16).then(|| u64_at(b, 8)));
        }
        if b[0] != VERSION {
            return Err(Some(u64_at(b, 8)));
        }
        let flags = u16_at(b, 2);
        let placed = flags & REQ_PLACE != 0;
        if placed && b.len() < REQ_PLACE_LEN {
            return Err(Some(u64_at(b, 8)));
        }
        let (place, rest) = if placed {
            (Some((u64_at(b, 32), u32_at(b, 40))), REQ_PLACE_LEN)
        } else {
            (None, REQ_LEN)
        };
        Ok(ReqHdr {
            op: b[1],
            vol: u32_at(b, 4),
            req_id: u64_at(b, 8),
            offset: u64_at(b, 16),
            len: u32_at(b, 24),
            place,
            imm_reply: flags & REQ_IMM_REPLY != 0,
            name: b[rest..].to_vec(),
        })
    }
}

/// A volume's description (`Open`/`Query` replies).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Info {
    pub vol: u32,
    pub block_size: u32,
    pub size: u64,
    pub region_addr: u64,
    pub region_rkey: u32,
    pub rdma_port: u16,
    pub flags: u16,
}

/// A decoded reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reply {
    pub op: u8,
    /// 0 or an errno value.
    pub status: u32,
    pub req_id: u64,
    pub len: u32,
    pub info: Option<Info>,
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(INFO_LEN);
        v.push(VERSION);
        v.push(self.op);
        v.extend_from_slice(&0u16.to_le_bytes());
        v.extend_from_slice(&self.status.to_le_bytes());
        v.extend_from_slice(&self.req_id.to_le_bytes());
        v.extend_from_slice(&self.len.to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        if let Some(i) = &self.info {
            v.extend_from_slice(&i.vol.to_le_bytes());
            v.extend_from_slice(&i.block_size.to_le_bytes());
            v.extend_from_slice(&i.size.to_le_bytes());
            v.extend_from_slice(&i.region_addr.to_le_bytes());
            v.extend_from_slice(&i.region_rkey.to_le_bytes());
            v.extend_from_slice(&i.rdma_port.to_le_bytes());
            v.extend_from_slice(&i.flags.to_le_bytes());
        }
        v
    }

    pub fn decode(b: &[u8]) -> Option<Reply> {
        if b.len() < REPLY_LEN || b[0] != VERSION {
            return None;
        }
        let info = (b.len() >= INFO_LEN).then(|| Info {
            vol: u32_at(b, 24),
            block_size: u32_at(b, 28),
            size: u64_at(b, 32),
            region_addr: u64_at(b, 40),
            region_rkey: u32_at(b, 48),
            rdma_port: u16_at(b, 52),
            flags: u16_at(b, 54),
        });
        Some(Reply {
            op: b[1],
            status: u32_at(b, 4),
            req_id: u64_at(b, 8),
            len: u32_at(b, 16),
            info,
        })
    }
}

/// Checks an IO's range against a volume of `size` bytes: the errno to answer, if any.
pub fn check_range(size: u64, offset: u64, len: u32) -> Option<u32> {
    if len == 0 || len > MAX_IO {
        return Some(libc::EINVAL as u32);
    }
    if offset % u64::from(BLOCK) != 0 || len % BLOCK != 0 {
        return Some(libc::EINVAL as u32);
    }
    match offset.checked_add(u64::from(len)) {
        Some(end) if end <= size => None,
        _ => Some(libc::ERANGE as u32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let r = ReqHdr {
            op: Op::Open as u8,
            vol: 7,
            req_id: 99,
            offset: 4096,
            len: 8192,
            place: None,
            imm_reply: false,
            name: b"vol0".to_vec(),
        };
        assert_eq!(ReqHdr::decode(&r.encode()), Ok(r.clone()));
        let placed = ReqHdr {
            op: Op::Read as u8,
            place: Some((0x7f00_0000_1000, 0xabcd)),
            name: Vec::new(),
            ..r.clone()
        };
        let b = placed.encode();
        assert_eq!(b.len(), REQ_PLACE_LEN);
        assert_eq!(ReqHdr::decode(&b), Ok(placed.clone()));
        // The flag without the 16 bytes it announces: refused, the id kept for the reply.
        assert_eq!(ReqHdr::decode(&b[..REQ_LEN]), Err(Some(99)));
        let imm = ReqHdr {
            imm_reply: true,
            ..placed.clone()
        };
        let b = imm.encode();
        assert_eq!(&b[2..4], &(REQ_PLACE | REQ_IMM_REPLY).to_le_bytes());
        assert_eq!(ReqHdr::decode(&b), Ok(imm));
        let p = Reply {
            op: 1,
            status: 0,
            req_id: 5,
            len: 0,
            info: Some(Info {
                vol: 1,
                block_size: 4096,
                size: 1 << 30,
                region_addr: 0x1000,
                region_rkey: 3,
                rdma_port: 1234,
                flags: INFO_ONE_SIDED,
            }),
        };
        assert_eq!(Reply::decode(&p.encode()), Some(p));
        assert_eq!(ReqHdr::decode(&[1, 2, 3]), Err(None));
        assert_eq!(check_range(1 << 20, 0, 4096), None);
        assert_eq!(check_range(1 << 20, 1, 4096), Some(libc::EINVAL as u32));
        assert_eq!(check_range(1 << 20, 0, 100), Some(libc::EINVAL as u32));
        assert_eq!(
            check_range(1 << 20, 1 << 20, 4096),
            Some(libc::ERANGE as u32)
        );
        assert_eq!(
            check_range(1 << 20, u64::MAX - 4095, 4096),
            Some(libc::ERANGE as u32)
        );
        assert_eq!(check_range(u64::MAX, 0, 2 << 20), Some(libc::EINVAL as u32));
    }
}

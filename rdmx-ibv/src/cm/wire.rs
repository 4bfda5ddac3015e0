//! The connection manager's messages between two processes, over the TCP connection the
//! active side opens to the listener's address and port (the rdma_cm port is the TCP
//! port). One message per IB CM MAD it stands for: REQ/REP/RTU/REJ/DREQ/DREP for
//! connected QPs, SIDR_REQ/SIDR_REP for UD. A message is a 4-byte header (kind,
//! version, body length big-endian) and a body of fixed fields followed by the private
//! data.

use std::io;

pub const VERSION: u8 = 1;
/// Bytes of the fixed body fields (see [`Msg::encode`]).
const FIXED: usize = 44;
/// Largest private data any message carries (a SIDR_REQ's 216 bytes; the caller checks
/// the per-kind limit).
pub const MAX_PDATA: usize = 216;
pub const MAX_BODY: usize = FIXED + MAX_PDATA;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Req = 1,
    Rep = 2,
    Rtu = 3,
    Rej = 4,
    Dreq = 5,
    Drep = 6,
    SidrReq = 7,
    SidrRep = 8,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Req,
            2 => Kind::Rep,
            3 => Kind::Rtu,
            4 => Kind::Rej,
            5 => Kind::Dreq,
            6 => Kind::Drep,
            7 => Kind::SidrReq,
            8 => Kind::SidrRep,
            _ => return None,
        })
    }
}

/// One message. Fields a kind does not use are zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    pub kind: Kind,
    /// The sender's QP number (REQ, REP, SIDR_REP).
    pub qpn: u32,
    /// The sender's first send PSN (REQ, REP).
    pub psn: u32,
    /// The sender's GID (index 0 of its rdmx0).
    pub gid: [u8; 16],
    /// The sender's port MTU (`enum ibv_mtu`).
    pub mtu: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    /// REJ: the reason (IB CM: 8 no listener, 28 consumer); SIDR_REP: the status.
    pub status: u8,
    /// SIDR_REP: the Q_Key of the UD QP.
    pub qkey: u32,
    /// The UDP port the sender's QP receives on (4791 unless `soft_port = 0`; see
    /// `verbs::peer_port`).
    pub udp_port: u16,
    pub pdata: Vec<u8>,
}

impl Msg {
    pub fn new(kind: Kind) -> Msg {
        Msg {
            kind,
            qpn: 0,
            psn: 0,
            gid: [0; 16],
            mtu: 0,
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: 0,
            retry_count: 0,
            rnr_retry_count: 0,
            srq: 0,
            status: 0,
            qkey: 0,
            udp_port: 0,
            pdata: Vec::new(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let pd = &self.pdata[..self.pdata.len().min(MAX_PDATA)];
        let body = FIXED + pd.len();
        let mut b = Vec::with_capacity(4 + body);
        b.push(self.kind as u8);
        b.push(VERSION);
        b.extend_from_slice(&(body as u16).to_be_bytes());
        b.extend_from_slice(&self.qpn.to_be_bytes());
        b.extend_from_slice(&self.psn.to_be_bytes());
        b.extend_from_slice(&self.gid);
        b.extend_from_slice(&[
            self.mtu,
            self.responder_resources,
            self.initiator_depth,
            self.flow_control,
            self.retry_count,
            self.rnr_retry_count,
            self.srq,
            self.status,
        ]);
        b.extend_from_slice(&self.qkey.to_be_bytes());
        b.extend_from_slice(&self.udp_port.to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&(pd.len() as u32).to_be_bytes());
        b.extend_from_slice(pd);
        b
    }

    /// Takes one whole message off the front of `buf`: `Ok(None)` when more bytes are
    /// needed, an error for bytes that are no message of ours.
    pub fn take(buf: &mut Vec<u8>) -> io::Result<Option<Msg>> {
        if buf.len() < 4 {
            return Ok(None);
        }
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
        let kind = Kind::from_u8(buf[0]).ok_or_else(|| bad("rdmx cm: unknown message kind"))?;
        if buf[1] != VERSION {
            return Err(bad("rdmx cm: unknown protocol version"));
        }
        let body = u16::from_be_bytes([buf[2], buf[3]]) as usize;
        if !(FIXED..=MAX_BODY).contains(&body) {
            return Err(bad("rdmx cm: bad message length"));
        }
        if buf.len() < 4 + body {
            return Ok(None);
        }
        let b = &buf[4..4 + body];
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let plen = u32_at(40) as usize;
        if plen != body - FIXED {
            return Err(bad("rdmx cm: private data length mismatch"));
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..24]);
        let m = Msg {
            kind,
            qpn: u32_at(0),
            psn: u32_at(4),
            gid,
            mtu: b[24],
            responder_resources: b[25],
            initiator_depth: b[26],
            flow_control: b[27],
            retry_count: b[28],
            rnr_retry_count: b[29],
            srq: b[30],
            status: b[31],
            qkey: u32_at(32),
            udp_port: u16::from_be_bytes([b[36], b[37]]),
            pdata: b[FIXED..].to_vec(),
        };
        buf.drain(..4 + body);
        Ok(Some(m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_waits_for_whole_messages() {
        let mut m = Msg::new(Kind::Rep);
        m.qpn = 0x123456;
        m.psn = 0xabcdef;
        m.gid[15] = 7;
        m.mtu = 3;
        m.retry_count = 7;
        m.status = 28;
        m.qkey = 0x01234567;
        m.udp_port = 4791;
        m.pdata = b"hello".to_vec();
        let bytes = m.encode();
        let mut buf = bytes[..10].to_vec();
        assert_eq!(Msg::take(&mut buf).unwrap(), None);
        buf.extend_from_slice(&bytes[10..]);
        buf.extend_from_slice(&Msg::new(Kind::Rtu).encode());
        assert_eq!(Msg::take(&mut buf).unwrap(), Some(m));
        assert_eq!(Msg::take(&mut buf).unwrap().unwrap().kind, Kind::Rtu);
        assert!(buf.is_empty());
    }

    #[test]
    fn refuses_foreign_bytes() {
        let mut buf = b"GET / HTTP/1.1\r\n".to_vec();
        assert!(Msg::take(&mut buf).is_err());
        let mut bytes = Msg::new(Kind::Req).encode();
        bytes[2] = 0xff;
        assert!(Msg::take(&mut bytes).is_err());
    }
}

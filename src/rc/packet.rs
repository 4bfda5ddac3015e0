//! The engine's view of an RC packet: the header fields it sets or reads, and the payload.
//! Bytes on the wire are produced and parsed by `crate::wire`; this module is the seam.

use crate::wire::{
    AETH_LEN, Aeth, BTH_LEN, Bth, IMMDT_LEN, ImmDt, Opcode, PacketRepr, RETH_LEN, Reth as WireReth,
    WireError,
};

/// RC opcodes as bytes (values from `crate::wire::Opcode`, rc-transport.md §2.1).
pub mod op {
    use crate::wire::Opcode as O;
    pub const SEND_FIRST: u8 = O::SendFirst as u8;
    pub const SEND_MIDDLE: u8 = O::SendMiddle as u8;
    pub const SEND_LAST: u8 = O::SendLast as u8;
    pub const SEND_LAST_IMM: u8 = O::SendLastWithImmediate as u8;
    pub const SEND_ONLY: u8 = O::SendOnly as u8;
    pub const SEND_ONLY_IMM: u8 = O::SendOnlyWithImmediate as u8;
    pub const WRITE_FIRST: u8 = O::RdmaWriteFirst as u8;
    pub const WRITE_MIDDLE: u8 = O::RdmaWriteMiddle as u8;
    pub const WRITE_LAST: u8 = O::RdmaWriteLast as u8;
    pub const WRITE_LAST_IMM: u8 = O::RdmaWriteLastWithImmediate as u8;
    pub const WRITE_ONLY: u8 = O::RdmaWriteOnly as u8;
    pub const WRITE_ONLY_IMM: u8 = O::RdmaWriteOnlyWithImmediate as u8;
    pub const READ_REQUEST: u8 = O::RdmaReadRequest as u8;
    pub const READ_RESP_FIRST: u8 = O::RdmaReadResponseFirst as u8;
    pub const READ_RESP_MIDDLE: u8 = O::RdmaReadResponseMiddle as u8;
    pub const READ_RESP_LAST: u8 = O::RdmaReadResponseLast as u8;
    pub const READ_RESP_ONLY: u8 = O::RdmaReadResponseOnly as u8;
    pub const ACKNOWLEDGE: u8 = O::Acknowledge as u8;
    pub const ATOMIC_ACKNOWLEDGE: u8 = O::AtomicAcknowledge as u8;
}

/// AETH syndrome bytes the engine sends and matches (§1.4).
pub mod syndrome {
    pub const ACK: u8 = 0x1F;
    pub const RNR_NAK: u8 = 0x20;
    pub const NAK_SEQ: u8 = 0x60;
    pub const NAK_INV_REQ: u8 = 0x61;
    pub const NAK_REM_ACCESS: u8 = 0x62;
    pub const NAK_REM_OP: u8 = 0x63;
}

/// RETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reth {
    pub va: u64,
    pub rkey: u32,
    pub len: u32,
}

/// Header fields of a packet to send or just received (payload handled separately).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hdr {
    pub opcode: u8,
    pub dest_qp: u32,
    pub psn: u32,
    pub ack_req: bool,
    pub solicited: bool,
    pub reth: Option<Reth>,
    /// (syndrome, msn)
    pub aeth: Option<(u8, u32)>,
    pub imm: Option<u32>,
}

impl Hdr {
    pub fn new(opcode: u8, dest_qp: u32, psn: u32) -> Hdr {
        Hdr {
            opcode,
            dest_qp,
            psn,
            ack_req: false,
            solicited: false,
            reth: None,
            aeth: None,
            imm: None,
        }
    }
}

/// Parses a UDP payload (BTH .. ICRC; the ICRC is not checked here) into the engine's
/// header view and the payload (pad removed).
pub fn parse(bytes: &[u8]) -> Result<(Hdr, &[u8]), WireError> {
    let p = PacketRepr::parse(bytes)?;
    Ok((hdr_of(&p), p.payload))
}

/// Parses the header part of a packet received in parts (see `PacketRepr::parse_parts`).
pub fn parse_head(head: &[u8], payload: &[u8]) -> Result<Hdr, WireError> {
    PacketRepr::parse_parts(head, payload).map(|p| hdr_of(&p))
}

fn hdr_of(p: &PacketRepr<'_>) -> Hdr {
    Hdr {
        opcode: p.bth.opcode.as_u8(),
        dest_qp: p.bth.dest_qp,
        psn: p.bth.psn,
        ack_req: p.bth.ack_req,
        solicited: p.bth.solicited,
        reth: p.reth.map(|r| Reth {
            va: r.va,
            rkey: r.rkey,
            len: r.dma_len,
        }),
        aeth: p.aeth.map(|a| (a.syndrome.to_u8(), a.msn)),
        imm: p.immdt.map(|i| i.imm),
    }
}

/// Writes BTH and the extension headers of `hdr` (PadCnt = `pad`) at the front of `buf`
/// and returns their length; the caller writes payload, pad and the 4-byte ICRC field.
/// None if `buf` is too small or the headers do not match the opcode. Writes through the
/// wire views' setters (not the Reprs): this runs for every packet.
pub fn emit_header(hdr: &Hdr, pad: u8, buf: &mut [u8]) -> Option<usize> {
    let opcode = Opcode::from_u8(hdr.opcode).ok()?;
    // Exactly the headers the opcode carries; the engine never sends atomics or IETH.
    let matches = opcode.has_reth() == hdr.reth.is_some()
        && opcode.has_aeth() == hdr.aeth.is_some()
        && opcode.has_immdt() == hdr.imm.is_some()
        && !opcode.has_atomic_eth()
        && !opcode.has_atomic_ack_eth()
        && !opcode.has_ieth();
    if !matches {
        return None;
    }
    let len = opcode.header_len();
    let head = buf.get_mut(..len)?;
    // Each header is built in a zeroed local array (reserved bits, TVer, FECN/BECN, MigReq
    // stay zero) and stored whole: the views' bit setters then work on registers, not on
    // the packet buffer.
    let mut b = [0u8; BTH_LEN];
    let mut bth = Bth::new_unchecked(&mut b[..]);
    bth.set_opcode_raw(hdr.opcode);
    bth.set_solicited(hdr.solicited);
    bth.set_pad_count(pad);
    bth.set_pkey(0xFFFF);
    bth.set_dest_qp(hdr.dest_qp);
    bth.set_ack_req(hdr.ack_req);
    bth.set_psn(hdr.psn);
    head[..BTH_LEN].copy_from_slice(&b);
    let mut at = BTH_LEN;
    if let Some(r) = hdr.reth {
        let mut b = [0u8; RETH_LEN];
        let mut v = WireReth::new_unchecked(&mut b[..]);
        v.set_va(r.va);
        v.set_rkey(r.rkey);
        v.set_dma_len(r.len);
        head[at..at + RETH_LEN].copy_from_slice(&b);
        at += RETH_LEN;
    }
    if let Some((syn, msn)) = hdr.aeth {
        let mut b = [0u8; AETH_LEN];
        let mut v = Aeth::new_unchecked(&mut b[..]);
        v.set_syndrome_raw(syn);
        v.set_msn(msn);
        head[at..at + AETH_LEN].copy_from_slice(&b);
        at += AETH_LEN;
    }
    if let Some(imm) = hdr.imm {
        let mut b = [0u8; IMMDT_LEN];
        ImmDt::new_unchecked(&mut b[..]).set_imm(imm);
        head[at..at + IMMDT_LEN].copy_from_slice(&b);
        at += IMMDT_LEN;
    }
    debug_assert_eq!(at, len);
    Some(len)
}

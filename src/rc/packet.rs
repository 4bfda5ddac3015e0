//! The engine's view of an RC packet: the header fields it sets or reads, and the payload.
//! Bytes on the wire are produced and parsed by `crate::wire`; this module is the seam.

use crate::wire::{
    Aeth, AethRepr, Bth, BthRepr, ImmDt, ImmDtRepr, Opcode, PacketRepr, Reth as WireReth, RethRepr,
    Syndrome, WireError,
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
    let hdr = Hdr {
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
    };
    Ok((hdr, p.payload))
}

/// Writes BTH and the extension headers of `hdr` (PadCnt = `pad`) at the front of `buf`
/// and returns their length; the caller writes payload, pad and the 4-byte ICRC field.
/// None if `buf` is too small or the header does not fit the opcode.
pub fn emit_header(hdr: &Hdr, pad: u8, buf: &mut [u8]) -> Option<usize> {
    let opcode = Opcode::from_u8(hdr.opcode).ok()?;
    let bth = BthRepr {
        opcode,
        solicited: hdr.solicited,
        mig_req: false,
        pad_count: pad,
        tver: 0,
        pkey: 0xFFFF,
        fecn: false,
        becn: false,
        dest_qp: hdr.dest_qp,
        ack_req: hdr.ack_req,
        psn: hdr.psn,
    };
    let mut at = bth.buffer_len();
    bth.emit(&mut Bth::new_checked(buf.get_mut(..at)?).ok()?);
    if let Some(r) = hdr.reth {
        let repr = RethRepr {
            va: r.va,
            rkey: r.rkey,
            dma_len: r.len,
        };
        let end = at + repr.buffer_len();
        repr.emit(&mut WireReth::new_checked(buf.get_mut(at..end)?).ok()?);
        at = end;
    }
    if let Some((syn, msn)) = hdr.aeth {
        let repr = AethRepr {
            syndrome: Syndrome::from_u8(syn).ok()?,
            msn,
        };
        let end = at + repr.buffer_len();
        repr.emit(&mut Aeth::new_checked(buf.get_mut(at..end)?).ok()?);
        at = end;
    }
    if let Some(imm) = hdr.imm {
        let repr = ImmDtRepr { imm };
        let end = at + repr.buffer_len();
        repr.emit(&mut ImmDt::new_checked(buf.get_mut(at..end)?).ok()?);
        at = end;
    }
    // Headers must be exactly what the opcode carries (wire checks the same on parse).
    let ok = opcode.has_reth() == hdr.reth.is_some()
        && opcode.has_aeth() == hdr.aeth.is_some()
        && opcode.has_immdt() == hdr.imm.is_some();
    ok.then_some(at)
}

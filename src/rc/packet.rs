//! The engine's view of an RC packet: the header fields it sets or reads, and the payload.
//! Bytes on the wire are produced and parsed by `crate::wire`; this module is the seam.

use crate::wire::{
    AETH_LEN, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN, Aeth, BTH_LEN, Bth, ICRC_LEN, IETH_LEN,
    IMMDT_LEN, Ieth, ImmDt, RETH_LEN, Reth, WireError, pad_len,
};
pub use crate::wire::{AethRepr, NakCode, Opcode, RethRepr, Syndrome};

/// Header fields of a packet to send or just received (payload handled separately).
/// Typed with the wire layer's own values, decoded once by `parse`: the opcode is a
/// [`Opcode`] (an unknown or unsupported opcode byte is rejected at parse, so every `Hdr`
/// holds one the engine can act on), the AETH a [`AethRepr`] whose [`Syndrome`] says ACK,
/// RNR NAK (with its timer) or NAK (with its code), and the RETH a [`RethRepr`]. `ieth` is
/// the IETH's rkey (SEND_LAST/ONLY_WITH_INVALIDATE: the window the responder invalidates).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hdr {
    pub opcode: Opcode,
    pub dest_qp: u32,
    pub psn: u32,
    pub ack_req: bool,
    pub solicited: bool,
    pub reth: Option<RethRepr>,
    pub aeth: Option<AethRepr>,
    pub imm: Option<u32>,
    pub ieth: Option<u32>,
}

impl Hdr {
    pub fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Hdr {
        Hdr {
            opcode,
            dest_qp,
            psn,
            ack_req: false,
            solicited: false,
            reth: None,
            aeth: None,
            imm: None,
            ieth: None,
        }
    }
}

/// Parses a UDP payload (BTH .. ICRC; the ICRC is not checked here) into the engine's
/// header view and the payload (pad removed). Accepts exactly what `PacketRepr::parse`
/// accepts (see `read_hdr`).
pub fn parse(bytes: &[u8]) -> Result<(Hdr, &[u8]), WireError> {
    if bytes.len() < BTH_LEN + ICRC_LEN {
        return Err(WireError::Truncated);
    }
    let body_end = bytes.len() - ICRC_LEN;
    let (hdr, opcode, pad) = read_hdr(&bytes[..body_end])?;
    let body = &bytes[opcode.header_len()..body_end];
    let pad = usize::from(pad);
    if body.len() % 4 != 0 || pad > body.len() {
        return Err(WireError::BadPadding);
    }
    if !opcode.has_payload() && !body.is_empty() {
        return Err(WireError::BadLength);
    }
    Ok((hdr, &body[..body.len() - pad]))
}

/// Parses the header part of a packet received in parts: `head` is exactly BTH + the
/// opcode's extension headers, `payload` the payload without pad. Accepts exactly what
/// `PacketRepr::parse_parts` accepts.
pub fn parse_head(head: &[u8], payload: &[u8]) -> Result<Hdr, WireError> {
    let (hdr, opcode, pad) = read_hdr(head)?;
    if head.len() != opcode.header_len() {
        return Err(WireError::BadLength);
    }
    if usize::from(pad) != pad_len(payload.len()) {
        return Err(WireError::BadPadding);
    }
    if !opcode.has_payload() && !payload.is_empty() {
        return Err(WireError::BadLength);
    }
    Ok(hdr)
}

/// BTH and extension headers at the front of `buf` (which may run on into the payload),
/// read through the wire views' getters straight into a `Hdr`: this runs for every packet,
/// and building a whole `PacketRepr` (every optional header) and converting it cost about
/// twice as much. The checks are `PacketRepr`'s (TVer 0, a supported RC opcode, every
/// header present, a valid AETH syndrome); `tests::parse_agrees_with_packet_repr` holds
/// the two parsers to the same answers on arbitrary bytes. Returns the opcode and PadCnt.
fn read_hdr(buf: &[u8]) -> Result<(Hdr, Opcode, u8), WireError> {
    let bth = Bth::new_checked(buf)?;
    let opcode = Opcode::from_u8(bth.opcode_raw())?;
    if bth.tver() != 0 {
        return Err(WireError::BadVersion(bth.tver()));
    }
    if !opcode.is_supported() {
        return Err(WireError::Unsupported(opcode));
    }
    let headers = buf.get(..opcode.header_len()).ok_or(WireError::Truncated)?;
    let mut hdr = Hdr {
        opcode,
        dest_qp: bth.dest_qp(),
        psn: bth.psn(),
        ack_req: bth.ack_req(),
        solicited: bth.solicited(),
        reth: None,
        aeth: None,
        imm: None,
        ieth: None,
    };
    // Order as in `PacketRepr::parse`: RETH|AtomicETH|AETH, then AtomicAckETH|ImmDt|IETH.
    let mut at = BTH_LEN;
    if opcode.has_reth() {
        let r = Reth::new_unchecked(&headers[at..]);
        hdr.reth = Some(RethRepr {
            va: r.va(),
            rkey: r.rkey(),
            dma_len: r.dma_len(),
        });
        at += RETH_LEN;
    }
    if opcode.has_atomic_eth() {
        at += ATOMIC_ETH_LEN;
    }
    if opcode.has_aeth() {
        let a = Aeth::new_unchecked(&headers[at..]);
        hdr.aeth = Some(AethRepr {
            syndrome: Syndrome::from_u8(a.syndrome_raw())?,
            msn: a.msn(),
        });
        at += AETH_LEN;
    }
    if opcode.has_atomic_ack_eth() {
        at += ATOMIC_ACK_ETH_LEN;
    }
    if opcode.has_immdt() {
        hdr.imm = Some(ImmDt::new_unchecked(&headers[at..]).imm());
        at += IMMDT_LEN;
    }
    if opcode.has_ieth() {
        hdr.ieth = Some(Ieth::new_unchecked(&headers[at..]).rkey());
    }
    Ok((hdr, opcode, bth.pad_count()))
}

/// Writes BTH and the extension headers of `hdr` (PadCnt = `pad`) at the front of `buf`
/// and returns their length; the caller writes payload, pad and the 4-byte ICRC field.
/// None if `buf` is too small or the headers do not match the opcode. Writes through the
/// wire views' setters (not the Reprs): this runs for every packet.
pub fn emit_header(hdr: &Hdr, pad: u8, buf: &mut [u8]) -> Option<usize> {
    let opcode = hdr.opcode;
    // Exactly the headers the opcode carries; the engine never sends atomics.
    let matches = opcode.has_reth() == hdr.reth.is_some()
        && opcode.has_aeth() == hdr.aeth.is_some()
        && opcode.has_immdt() == hdr.imm.is_some()
        && opcode.has_ieth() == hdr.ieth.is_some()
        && !opcode.has_atomic_eth()
        && !opcode.has_atomic_ack_eth();
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
    bth.set_opcode_raw(opcode.as_u8());
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
        let mut v = Reth::new_unchecked(&mut b[..]);
        v.set_va(r.va);
        v.set_rkey(r.rkey);
        v.set_dma_len(r.dma_len);
        head[at..at + RETH_LEN].copy_from_slice(&b);
        at += RETH_LEN;
    }
    if let Some(a) = hdr.aeth {
        let mut b = [0u8; AETH_LEN];
        let mut v = Aeth::new_unchecked(&mut b[..]);
        v.set_syndrome_raw(a.syndrome.to_u8());
        v.set_msn(a.msn);
        head[at..at + AETH_LEN].copy_from_slice(&b);
        at += AETH_LEN;
    }
    if let Some(imm) = hdr.imm {
        let mut b = [0u8; IMMDT_LEN];
        ImmDt::new_unchecked(&mut b[..]).set_imm(imm);
        head[at..at + IMMDT_LEN].copy_from_slice(&b);
        at += IMMDT_LEN;
    }
    if let Some(rkey) = hdr.ieth {
        let mut b = [0u8; IETH_LEN];
        Ieth::new_unchecked(&mut b[..]).set_rkey(rkey);
        head[at..at + IETH_LEN].copy_from_slice(&b);
        at += IETH_LEN;
    }
    debug_assert_eq!(at, len);
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::PacketRepr;
    use proptest::prelude::*;

    /// What `PacketRepr` makes of the same bytes, in the engine's terms.
    fn hdr_of(p: &PacketRepr<'_>) -> Hdr {
        Hdr {
            opcode: p.bth.opcode,
            dest_qp: p.bth.dest_qp,
            psn: p.bth.psn,
            ack_req: p.bth.ack_req,
            solicited: p.bth.solicited,
            reth: p.reth,
            aeth: p.aeth,
            imm: p.immdt.map(|i| i.imm),
            ieth: p.ieth.map(|i| i.rkey),
        }
    }

    /// Bytes that often look like a packet: a real opcode, TVer 0 and a plausible length.
    fn packetish() -> impl Strategy<Value = Vec<u8>> {
        (
            0u8..=0x18,
            any::<bool>(),
            0u8..4,
            prop::collection::vec(any::<u8>(), 0..80),
        )
            .prop_map(|(opcode, tver0, pad, mut rest)| {
                let mut v = vec![opcode, (pad << 4) | if tver0 { 0 } else { 1 }];
                v.append(&mut rest);
                v
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        #[test]
        fn parse_agrees_with_packet_repr(bytes in prop_oneof![
            packetish(),
            prop::collection::vec(any::<u8>(), 0..64),
        ]) {
            let fast = parse(&bytes);
            let repr = PacketRepr::parse(&bytes);
            match (&fast, &repr) {
                (Ok((h, pl)), Ok(p)) => {
                    prop_assert_eq!(*h, hdr_of(p));
                    prop_assert_eq!(*pl, p.payload);
                }
                (Err(_), Err(_)) => {}
                _ => prop_assert!(false, "parse {:?} vs PacketRepr {:?}", fast, repr),
            }
        }

        #[test]
        fn parse_head_agrees_with_parse_parts(
            bytes in packetish(),
            split in 0usize..80,
            payload_len in 0usize..40,
        ) {
            let head = &bytes[..split.min(bytes.len())];
            let payload = vec![0xA5u8; payload_len];
            let fast = parse_head(head, &payload);
            let repr = PacketRepr::parse_parts(head, &payload);
            match (&fast, &repr) {
                (Ok(h), Ok(p)) => prop_assert_eq!(*h, hdr_of(p)),
                (Err(_), Err(_)) => {}
                _ => prop_assert!(false, "parse_head {:?} vs parse_parts {:?}", fast, repr),
            }
        }
    }

    #[test]
    fn parses_a_read_response_only() {
        // READ_RESPONSE_ONLY (0x10), PadCnt 0, dest QP 0x000011, AckReq, PSN 0x123456,
        // AETH ACK MSN 7, 4 payload bytes, ICRC field.
        let bytes = [
            0x10, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x11, 0x80, 0x12, 0x34, 0x56, //
            0x1F, 0x00, 0x00, 0x07, //
            1, 2, 3, 4, //
            0, 0, 0, 0,
        ];
        let (h, payload) = parse(&bytes).unwrap();
        assert_eq!(h.opcode, Opcode::RdmaReadResponseOnly);
        assert_eq!((h.dest_qp, h.psn, h.ack_req), (0x11, 0x12_3456, true));
        assert_eq!(
            h.aeth,
            Some(AethRepr {
                syndrome: Syndrome::ACK_UNLIMITED,
                msn: 7
            })
        );
        assert_eq!(payload, &[1, 2, 3, 4]);
        assert_eq!(parse_head(&bytes[..16], &bytes[16..20]).unwrap(), h);
    }

    /// SEND_ONLY_WITH_INVALIDATE (0x17) and SEND_LAST_WITH_INVALIDATE (0x16): BTH, then the
    /// 4-byte IETH (the rkey), then payload; parsed from literal bytes and emitted back to
    /// the same bytes.
    #[test]
    fn send_with_invalidate_carries_the_ieth_both_ways() {
        // SEND_ONLY_WITH_INVALIDATE, SE, PadCnt 2, dest QP 0x000022, AckReq, PSN 0x000005,
        // IETH rkey 0x8012_3456, 2 payload bytes + 2 pad, ICRC field.
        let only = [
            0x17, 0xA0, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x22, 0x80, 0x00, 0x00, 0x05, //
            0x80, 0x12, 0x34, 0x56, //
            9, 8, 0, 0, //
            0, 0, 0, 0,
        ];
        let (h, payload) = parse(&only).unwrap();
        assert_eq!(h.opcode, Opcode::SendOnlyWithInvalidate);
        assert_eq!(
            (h.dest_qp, h.psn, h.ack_req, h.solicited),
            (0x22, 5, true, true)
        );
        assert_eq!(h.ieth, Some(0x8012_3456));
        assert_eq!((h.imm, h.reth, h.aeth), (None, None, None));
        assert_eq!(payload, &[9, 8]);
        let mut out = [0u8; 16];
        assert_eq!(emit_header(&h, 2, &mut out), Some(16));
        assert_eq!(out, only[..16]);

        // SEND_LAST_WITH_INVALIDATE, PadCnt 0, dest QP 0x000011, no AckReq, PSN 0x00ABCD,
        // IETH rkey 0x0000_0102, 4 payload bytes, ICRC field.
        let last = [
            0x16, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0xAB, 0xCD, //
            0x00, 0x00, 0x01, 0x02, //
            1, 2, 3, 4, //
            0, 0, 0, 0,
        ];
        let (h, payload) = parse(&last).unwrap();
        assert_eq!(h.opcode, Opcode::SendLastWithInvalidate);
        assert_eq!((h.dest_qp, h.psn, h.ack_req), (0x11, 0xABCD, false));
        assert_eq!(h.ieth, Some(0x102));
        assert_eq!(payload, &[1, 2, 3, 4]);
        assert_eq!(parse_head(&last[..16], &last[16..20]).unwrap(), h);
        let mut out = [0u8; 16];
        assert_eq!(emit_header(&h, 0, &mut out), Some(16));
        assert_eq!(out, last[..16]);

        // The IETH is required by these opcodes and refused by every other.
        let mut no_ieth = h;
        no_ieth.ieth = None;
        assert_eq!(emit_header(&no_ieth, 0, &mut out), None);
        let mut send = Hdr::new(Opcode::SendLast, 0x11, 1);
        send.ieth = Some(1);
        assert_eq!(emit_header(&send, 0, &mut out), None);
    }
}

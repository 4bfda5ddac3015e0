//! UD packets on literal bytes: layout, parse/emit round trip, every error, the ICRC of a
//! UD packet (computed independently with Python's zlib over the §7 masked headers), and
//! the GRH area.

use super::*;
use crate::wire::icrc;
use core::net::SocketAddrV4;

/// SEND_ONLY_WITH_IMMEDIATE, PadCnt 3, P_Key 0xFFFF, DestQP 0x11, PSN 0x100, Q_Key
/// 0x11111111, SrcQP 0x22, imm 0xdeadbeef, "hello" + 3 pad, ICRC from 10.0.0.1:0xC123 to
/// 10.0.0.2:4791 (zlib value 0xC5BC54E5, stored little-endian).
const PACKET: [u8; 36] = [
    0x65, 0x30, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x01, 0x00, // BTH
    0x11, 0x11, 0x11, 0x11, 0x00, 0x00, 0x00, 0x22, // DETH
    0xDE, 0xAD, 0xBE, 0xEF, // ImmDt
    b'h', b'e', b'l', b'l', b'o', 0, 0, 0, // payload + pad
    0xE5, 0x54, 0xBC, 0xC5, // ICRC
];

fn repr() -> UdPacketRepr<'static> {
    UdPacketRepr {
        solicited: false,
        pkey: DEFAULT_PKEY,
        dest_qp: 0x11,
        psn: 0x100,
        deth: DethRepr {
            qkey: 0x1111_1111,
            src_qp: 0x22,
        },
        imm: Some(0xDEAD_BEEF),
        payload: b"hello",
    }
}

#[test]
fn a_literal_packet_parses_to_its_fields() {
    assert!(is_ud_opcode(PACKET[0]));
    assert!(!is_ud_opcode(0x04) && !is_ud_opcode(0x24));
    assert_eq!(UdPacketRepr::parse(&PACKET).unwrap(), repr());
}

#[test]
fn emit_writes_the_same_bytes_and_the_icrc_matches_an_independent_computation() {
    let r = repr();
    assert_eq!(r.buffer_len(), PACKET.len());
    let mut out = [0xAAu8; 64];
    let n = r.emit(&mut out).unwrap();
    assert_eq!(n, PACKET.len());
    assert_eq!(&out[..n - 4], &PACKET[..n - 4]);
    assert_eq!(&out[n - 4..n], &[0, 0, 0, 0], "ICRC field left zero");
    let src = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 0xC123);
    let dst = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 4791);
    let c = icrc::compute_ipv4_addrs(src, dst, 0, &out[..n]).unwrap();
    assert_eq!(c, 0xC5BC_54E5);
    icrc::store(&mut out[..n], c).unwrap();
    assert_eq!(&out[..n], &PACKET[..]);
}

#[test]
fn send_only_without_immediate_has_no_immdt_and_no_pad_when_aligned() {
    let r = UdPacketRepr {
        imm: None,
        payload: b"abcd",
        solicited: true,
        ..repr()
    };
    assert_eq!(r.opcode(), UdOpcode::SendOnly);
    assert_eq!(r.header_len(), 20);
    let mut out = [0u8; 28];
    assert_eq!(r.emit(&mut out).unwrap(), 28);
    assert_eq!(&out[..2], &[0x64, 0x80]); // SE set, PadCnt 0, TVer 0
    assert_eq!(&out[20..24], b"abcd");
    assert_eq!(UdPacketRepr::parse(&out).unwrap(), r);
}

#[test]
fn every_malformed_input_is_an_error_not_a_panic() {
    for len in 0..24 {
        assert_eq!(
            UdPacketRepr::parse(&PACKET[..len]).unwrap_err(),
            WireError::Truncated,
            "{len}"
        );
    }
    let mut p = PACKET;
    p[0] = 0x04; // RC SEND_ONLY
    assert_eq!(
        UdPacketRepr::parse(&p).unwrap_err(),
        WireError::BadOpcode(4)
    );
    p[0] = 0x66; // reserved UD code
    assert_eq!(
        UdPacketRepr::parse(&p).unwrap_err(),
        WireError::BadOpcode(0x66)
    );
    let mut p = PACKET;
    p[1] |= 0x01; // TVer 1
    assert_eq!(
        UdPacketRepr::parse(&p).unwrap_err(),
        WireError::BadVersion(1)
    );
    // 35 bytes: payload + pad not a multiple of 4.
    let mut short = PACKET.to_vec();
    short.remove(30);
    assert_eq!(
        UdPacketRepr::parse(&short).unwrap_err(),
        WireError::BadPadding
    );
    // Headers only with PadCnt 3: more pad than body.
    let mut bare = PACKET[..24].to_vec();
    bare.extend_from_slice(&[0; 4]);
    assert_eq!(
        UdPacketRepr::parse(&bare).unwrap_err(),
        WireError::BadPadding
    );
    // Emit into a short buffer writes nothing.
    let mut out = [0x5Au8; 35];
    assert_eq!(repr().emit(&mut out).unwrap_err(), WireError::Truncated);
    assert!(out.iter().all(|b| *b == 0x5A));
    // Every prefix and every single-byte value at each offset: Ok or Err, never a panic.
    for i in 0..PACKET.len() {
        for v in [0x00, 0x30, 0x64, 0x65, 0xFF] {
            let mut p = PACKET;
            p[i] = v;
            let _ = UdPacketRepr::parse(&p);
        }
    }
}

#[test]
fn the_ipv4_grh_area_holds_the_ip_header_in_its_last_20_bytes() {
    let g = grh_ipv4(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), 36);
    assert_eq!(&g[..20], &[0u8; 20]);
    #[rustfmt::skip]
    let ip = [
        0x45, 0x00, 0x00, 0x40, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
        0x26, 0xAB, 10, 0, 0, 1, 10, 0, 0, 2,
    ];
    assert_eq!(&g[20..], &ip);
    // The checksum verifies: the one's complement sum over the header is 0xFFFF.
    let sum = g[20..]
        .chunks_exact(2)
        .fold(0u32, |s, w| s + u32::from(u16::from_be_bytes([w[0], w[1]])));
    assert_eq!((sum & 0xFFFF) + (sum >> 16), 0xFFFF);
}

#[test]
fn the_ipv6_grh_area_is_the_ipv6_header() {
    let s: Ipv6Addr = "fd00::1".parse().unwrap();
    let d: Ipv6Addr = "fd00::2".parse().unwrap();
    let g = grh_ipv6(s, d, 36);
    assert_eq!(&g[..8], &[0x60, 0, 0, 0, 0x00, 44, 17, 64]);
    assert_eq!(&g[8..24], &s.octets());
    assert_eq!(&g[24..], &d.octets());
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn emit_then_parse_gives_the_packet_back(
            solicited: bool,
            pkey: u16,
            dest_qp in 0u32..=MASK_24,
            psn in 0u32..=MASK_24,
            qkey: u32,
            src_qp in 0u32..=MASK_24,
            imm: Option<u32>,
            payload in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let r = UdPacketRepr {
                solicited,
                pkey,
                dest_qp,
                psn,
                deth: DethRepr { qkey, src_qp },
                imm,
                payload: &payload,
            };
            let mut out = vec![0u8; r.buffer_len()];
            prop_assert_eq!(r.emit(&mut out).unwrap(), out.len());
            prop_assert_eq!(out.len() % 4, 0);
            prop_assert_eq!(UdPacketRepr::parse(&out).unwrap(), r);
        }

        #[test]
        fn parse_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = UdPacketRepr::parse(&bytes);
        }
    }
}

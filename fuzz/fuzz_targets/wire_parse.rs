//! Every wire parser must be total: arbitrary bytes give `Ok` or an error, never a panic.
//! Whatever parses must re-emit and re-parse to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmx::wire::{
    Aeth, AethRepr, AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr, Bth, BthRepr, Ieth,
    IethRepr, ImmDt, ImmDtRepr, Opcode, PacketRepr, Reth, RethRepr, Syndrome, icrc,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(packet) = PacketRepr::parse(data) {
        assert_eq!(packet.buffer_len(), data.len());
        let mut out = [0u8; 65536];
        let n = packet.emit(&mut out).expect("a parsed packet re-emits");
        assert_eq!(n, data.len());
        assert_eq!(PacketRepr::parse(&out[..n]), Ok(packet));
    }

    // UD: reserved bits, MigReq, FECN/BECN, AckReq and pad contents are not kept, so the
    // re-emitted packet parses to the same value (not necessarily the same bytes).
    if let Ok(packet) = rdmx::wire::ud::UdPacketRepr::parse(data) {
        assert_eq!(packet.buffer_len(), data.len());
        let mut out = [0u8; 65536];
        let n = packet.emit(&mut out).expect("a parsed UD packet re-emits");
        assert_eq!(n, data.len());
        assert_eq!(rdmx::wire::ud::UdPacketRepr::parse(&out[..n]), Ok(packet));
    }
    let _ = rdmx::wire::DethRepr::parse(&rdmx::wire::Deth::new_unchecked(data));

    let _ = BthRepr::parse(&Bth::new_unchecked(data));
    let _ = RethRepr::parse(&Reth::new_unchecked(data));
    let _ = AethRepr::parse(&Aeth::new_unchecked(data));
    let _ = ImmDtRepr::parse(&ImmDt::new_unchecked(data));
    let _ = IethRepr::parse(&Ieth::new_unchecked(data));
    let _ = AtomicEthRepr::parse(&AtomicEth::new_unchecked(data));
    let _ = AtomicAckEthRepr::parse(&AtomicAckEth::new_unchecked(data));
    if let Some(&b) = data.first() {
        let _ = Opcode::from_u8(b);
        let _ = Syndrome::from_u8(b);
    }

    // ICRC over arbitrary IP/UDP/IB splits: the first byte picks the split points.
    if let Some((&sel, rest)) = data.split_first() {
        let ip_len = usize::from(sel & 0x3F).min(rest.len());
        let (ip, rest) = rest.split_at(ip_len);
        let udp_len = usize::from(sel >> 6) + 7;
        let (udp, ib) = rest.split_at(udp_len.min(rest.len()));
        let _ = icrc::compute_ipv4(ip, udp, ib);
        let _ = icrc::compute_ipv6(ip, udp, ib);
        let _ = icrc::check(ib, 0);
    }
});

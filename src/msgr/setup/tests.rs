//! Tests of the side-channel setup: literal hello bytes, decode's refusals, negotiation,
//! and the exchange over real TCP sockets (timeouts, EOF, garbage, trickling peers).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::exchange::*;
use super::hello::*;
use super::negotiate::*;
use super::*;
use crate::error::{Error, ErrorKind};
use crate::rc::verbs::access;

/// A 1.0 hello (no source port): `SMALL`'s bytes.
fn small() -> Hello {
    Hello {
        version: 0x0100,
        flags: 0,
        qpn: 0x11,
        psn: 0x12_3456,
        udp: "10.0.0.1:4791".parse().unwrap(),
        path_mtu: 1024,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 2,
        credits: 64,
        regions: vec![Region {
            addr: 0x1000,
            len: 0x2000,
            rkey: 0xabcd,
            access: access::REMOTE_READ | access::REMOTE_WRITE,
        }],
        src_port: None,
        limits: None,
    }
}

#[rustfmt::skip]
const SMALL: [u8; 61] = [
    0, 0, 0, 61,                 // total length
    b'R', b'D', b'M', b'X',      // magic
    1, 0,                        // version 1.0
    0, 0,                        // flags
    0, 0, 0, 0x11,               // qpn
    0, 0x12, 0x34, 0x56,         // psn
    0x04, 0x00,                  // path_mtu 1024
    1, 2,                        // max_rd_atomic, max_dest_rd_atomic
    0, 0, 0, 64,                 // credits
    4, 10, 0, 0, 1,              // IPv4 10.0.0.1
    0x12, 0xb7,                  // port 4791
    0, 1,                        // one region
    0, 0, 0, 0, 0, 0, 0x10, 0,   // addr
    0, 0, 0, 0, 0, 0, 0x20, 0,   // len
    0, 0, 0xab, 0xcd,            // rkey
    0, 0, 0, 6,                  // access REMOTE_READ | REMOTE_WRITE
];

/// Decodes `bytes` expecting a parse error whose message contains `needle`.
fn parse_err(bytes: &[u8], needle: &str) {
    let e = Hello::decode(bytes).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Parse, "{e}");
    assert!(e.message().contains(needle), "{e:?} lacks {needle:?}");
}

/// `SMALL` with bytes `at..` replaced by `with`.
fn patched(at: usize, with: &[u8]) -> Vec<u8> {
    let mut b = SMALL.to_vec();
    b[at..at + with.len()].copy_from_slice(with);
    b
}

#[test]
fn small_hello_literal_bytes() {
    assert_eq!(small().encode(), SMALL);
    assert_eq!(small().encoded_len(), SMALL.len());
    assert_eq!(Hello::decode(&SMALL).unwrap(), small());
}

#[test]
fn the_source_port_follows_the_regions_when_flagged() {
    let mut h = small();
    h.version = VERSION;
    h.flags = FLAG_SRC_PORT;
    h.src_port = Some(0xc011);
    let mut want = SMALL.to_vec();
    want[3] = 63; // total length
    want[9] = VERSION_MINOR; // this build's minor
    want[11] = 1; // flags: SRC_PORT
    want.extend_from_slice(&[0xc0, 0x11]); // source port 0xc011
    assert_eq!(h.encode(), want);
    assert_eq!(h.encoded_len(), want.len());
    assert_eq!(Hello::decode(&want).unwrap(), h);
    // The flag and the field go together.
    let mut no_port = want.clone();
    no_port[3] = 61;
    no_port.truncate(61);
    parse_err(
        &no_port,
        "1 regions and the source port need 26 bytes, 24 left",
    );
    h.src_port = None;
    assert!(
        h.validate()
            .unwrap_err()
            .message()
            .contains("flag SRC_PORT is set")
    );
    h.flags = 0;
    h.src_port = Some(1);
    assert!(
        h.validate()
            .unwrap_err()
            .message()
            .contains("flag SRC_PORT is clear")
    );
}

#[test]
fn the_limits_follow_the_source_port_when_flagged() {
    let mut h = small();
    h.version = VERSION;
    h.flags = FLAG_SRC_PORT | FLAG_LIMITS;
    h.src_port = Some(0xc011);
    h.limits = Some(MsgLimitsWire {
        max_message_bytes: 16 << 20,
        max_segments: 64,
    });
    let mut want = SMALL.to_vec();
    want[3] = 73; // total length
    want[9] = VERSION_MINOR;
    want[11] = 5; // flags: SRC_PORT | LIMITS
    want.extend_from_slice(&[0xc0, 0x11]); // source port 0xc011
    want.extend_from_slice(&[0, 0, 0, 0, 0x01, 0, 0, 0]); // max_message_bytes 16 MiB
    want.extend_from_slice(&[0, 64]); // max_segments 64
    assert_eq!(h.encode(), want);
    assert_eq!(h.encoded_len(), want.len());
    assert_eq!(Hello::decode(&want).unwrap(), h);
    // Flagged without the field (a 1.2 sender setting bit 2): refused by length.
    let mut short = want.clone();
    short[3] = 63;
    short.truncate(63);
    parse_err(
        &short,
        "1 regions and the source port and the limits need 36 bytes, 26 left",
    );
    h.limits = None;
    assert!(
        h.validate()
            .unwrap_err()
            .message()
            .contains("flag LIMITS is set")
    );
}

#[test]
fn ipv6_literal_bytes() {
    let mut h = small();
    h.udp = "[fe80::1%7]:18515".parse().unwrap();
    h.regions.clear();
    let b = h.encode();
    assert_eq!(b.len(), MIN_ENCODED_LEN + 12);
    assert_eq!(&b[..4], &[0, 0, 0, 49]);
    assert_eq!(b[28], 6);
    assert_eq!(
        &b[29..45],
        &Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1).octets()
    );
    assert_eq!(&b[45..49], &[0x48, 0x53, 0, 0]); // port 18515, no regions
    // The scope id names a sender's interface: not sent.
    h.udp = "[fe80::1]:18515".parse().unwrap();
    assert_eq!(Hello::decode(&b).unwrap(), h);
}

#[test]
fn decode_rejects_each_bad_field() {
    parse_err(&patched(4, b"RDMY"), "bad magic");
    parse_err(&patched(8, &[2, 0]), "unknown protocol version 2.0");
    parse_err(&patched(8, &[0, 9]), "unknown protocol version 0.9");
    parse_err(&patched(12, &[1, 0, 0, 0]), "qpn 0x1000000 exceeds 24 bits");
    parse_err(
        &patched(16, &[0xff, 0, 0, 0]),
        "psn 0xff000000 exceeds 24 bits",
    );
    parse_err(&patched(20, &[0x03, 0xe8]), "invalid path_mtu 1000");
    parse_err(&patched(20, &[0x20, 0x00]), "invalid path_mtu 8192");
    parse_err(&patched(28, &[5]), "unknown address tag 5");
    parse_err(&patched(35, &[0, 2]), "2 regions need 48 bytes, 24 left");
    parse_err(&patched(37, &[0xff; 8]), "wraps past the end");
}

#[test]
fn decode_accepts_newer_minor_and_unknown_flags() {
    let h = Hello::decode(&patched(8, &[1, 7])).unwrap();
    assert_eq!(h.version, 0x0107);
    let h = Hello::decode(&patched(10, &[0x80, 0x02])).unwrap();
    assert_eq!(h.flags, 0x8002);
}

#[test]
fn decode_rejects_truncated_and_trailing() {
    for n in 0..SMALL.len() {
        let e = Hello::decode(&SMALL[..n]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Parse);
        assert!(e.message().contains("truncated"), "{n}: {e}");
    }
    // Prefix announcing fewer bytes than given.
    let mut b = SMALL.to_vec();
    b.push(0);
    parse_err(&b, "1 trailing bytes");
    // Consistent prefix but a region count that leaves bytes over.
    parse_err(&patched(35, &[0, 0]), "0 regions need 0 bytes, 24 left");
}

#[test]
fn decode_rejects_too_many_regions() {
    let mut h = small();
    h.regions = vec![Region::default(); MAX_REGIONS];
    assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
    assert_eq!(h.encoded_len(), MAX_ENCODED_LEN - 12); // IPv4: 12 bytes short of IPv6
    h.regions.push(Region::default());
    parse_err(&h.encode(), "4097 regions: at most 4096");
    assert_eq!(h.validate().unwrap_err().kind(), ErrorKind::InvalidArgument);
}

#[test]
fn random_psn_is_24_bit_and_varies() {
    let psns: Vec<u32> = (0..16).map(|_| random_psn()).collect();
    assert!(psns.iter().all(|&p| p <= MASK_24));
    assert!(psns.iter().any(|&p| p != psns[0]), "{psns:?}");
}

#[test]
fn peer_udp_addr_replaces_only_unspecified() {
    let tcp: IpAddr = "192.168.1.5".parse().unwrap();
    let v4 = |s: &str| s.parse::<SocketAddr>().unwrap();
    assert_eq!(peer_udp_addr(v4("10.1.1.1:9"), tcp), v4("10.1.1.1:9"));
    assert_eq!(peer_udp_addr(v4("0.0.0.0:9"), tcp), v4("192.168.1.5:9"));
    assert_eq!(peer_udp_addr(v4("[::]:9"), tcp), v4("192.168.1.5:9"));
    let mapped: IpAddr = "::ffff:192.168.1.5".parse().unwrap();
    assert_eq!(peer_udp_addr(v4("0.0.0.0:9"), mapped), v4("192.168.1.5:9"));
    let tcp6: IpAddr = "2001:db8::2".parse().unwrap();
    assert_eq!(peer_udp_addr(v4("[::]:9"), tcp6), v4("[2001:db8::2]:9"));
}

fn asymmetric() -> (Hello, Hello) {
    let mut a = small();
    a.udp = "0.0.0.0:5000".parse().unwrap();
    a.path_mtu = 4096;
    a.max_rd_atomic = 16;
    a.max_dest_rd_atomic = 4;
    let mut b = small();
    b.qpn = 0xab_cdef;
    b.psn = 0x00_0042;
    b.udp = "127.0.0.1:6000".parse().unwrap();
    b.path_mtu = 1024;
    b.max_rd_atomic = 2;
    b.max_dest_rd_atomic = 8;
    b.credits = 128;
    b.regions.push(Region {
        addr: 0x7f00_0000_0000,
        len: 1 << 21,
        rkey: 7,
        access: access::REMOTE_READ,
    });
    (a, b)
}

/// Checks what each side of the `asymmetric` pair negotiates.
fn check_asymmetric(a: &Hello, b: &Hello, at_a: &Negotiated, at_b: &Negotiated) {
    assert_eq!(at_a.path_mtu, 1024);
    assert_eq!(at_b.path_mtu, 1024);
    // a can issue 16 but b accepts 8; b can issue 2 and a accepts 4.
    assert_eq!((at_a.max_rd_atomic, at_a.max_dest_rd_atomic), (8, 4));
    assert_eq!((at_b.max_rd_atomic, at_b.max_dest_rd_atomic), (2, 8));
    assert_eq!((at_a.sq_psn, at_a.rq_psn), (a.psn, b.psn));
    assert_eq!((at_b.sq_psn, at_b.rq_psn), (b.psn, a.psn));
    assert_eq!((at_a.dest_qpn, at_b.dest_qpn), (b.qpn, a.qpn));
    assert_eq!(at_a.peer_udp, "127.0.0.1:6000".parse().unwrap());
    // a advertised 0.0.0.0: b uses the TCP peer's IP.
    assert_eq!(at_b.peer_udp, "127.0.0.1:5000".parse().unwrap());
    assert_eq!(at_a.peer_regions, b.regions);
    assert_eq!(at_b.peer_regions, a.regions);
    assert_eq!((at_a.peer_credits, at_b.peer_credits), (128, 64));
}

#[test]
fn negotiate_both_ways() {
    let (a, b) = asymmetric();
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let at_a = negotiate(&a, &b, lo).unwrap();
    let at_b = negotiate(&b, &a, lo).unwrap();
    check_asymmetric(&a, &b, &at_a, &at_b);
}

#[test]
fn negotiate_rejects_incompatible_and_invalid() {
    let (a, mut b) = asymmetric();
    let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
    b.version = 0x0203;
    let e = negotiate(&a, &b, lo).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert_eq!(
        e.message(),
        "incompatible protocol versions: mine 1.0, peer's 2.3; the major versions must match"
    );
    let e = negotiate(&b, &a, lo).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    b.version = 0x0105;
    assert!(
        negotiate(&a, &b, lo).is_ok(),
        "minor versions are compatible"
    );
    b.path_mtu = 1500;
    let e = negotiate(&a, &b, lo).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Parse);
    assert!(
        e.message().contains("peer's hello: invalid path_mtu 1500"),
        "{e}"
    );
    let e = negotiate(&b, &a, lo).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("invalid path_mtu 1500"), "{e}");
}

fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    (client, server)
}

const T: Duration = Duration::from_secs(5);
const SHORT: Duration = Duration::from_millis(200);

#[test]
fn offered_path_mtu_on_loopback() {
    let (ca, cb) = pair();
    // `lo` (65536 unless changed) fits 4096: the configured value is offered as is.
    for stream in [&ca, &cb] {
        for configured in MTUS {
            let p = offered_path_mtu(stream, configured).unwrap();
            assert_eq!(p.configured, configured);
            assert_eq!(p.active, 4096, "{p:?}");
            assert_eq!(p.offered, configured, "{p:?}");
            assert!(!p.clamped());
            assert!(p.link_mtu >= 4163, "{p:?}");
        }
    }
}

#[test]
fn exchange_negotiate_ready_over_tcp() {
    let (a, b) = asymmetric();
    let (mut ca, mut cb) = pair();
    let b2 = b.clone();
    let peer_b = std::thread::spawn(move || {
        let got = exchange(&mut cb, &b2, T).unwrap();
        let n = negotiate(&b2, &got, cb.peer_addr().unwrap().ip()).unwrap();
        ready(&mut cb, T).unwrap();
        (
            got,
            n,
            cb.read_timeout().unwrap(),
            cb.write_timeout().unwrap(),
        )
    });
    let got_a = exchange(&mut ca, &a, T).unwrap();
    let at_a = negotiate(&a, &got_a, ca.peer_addr().unwrap().ip()).unwrap();
    ready(&mut ca, T).unwrap();
    let (got_b, at_b, rt, wt) = peer_b.join().unwrap();
    assert_eq!(got_a, b);
    assert_eq!(got_b, a);
    check_asymmetric(&a, &b, &at_a, &at_b);
    // Timeouts restored: the side channel stays blocking for liveness reads.
    assert_eq!((rt, wt), (None, None));
    assert_eq!(ca.read_timeout().unwrap(), None);
    assert_eq!(ca.write_timeout().unwrap(), None);
}

#[test]
fn exchange_restores_previous_timeouts() {
    let (mut ca, mut cb) = pair();
    let t = Some(Duration::from_secs(42));
    ca.set_read_timeout(t).unwrap();
    let peer = std::thread::spawn(move || exchange(&mut cb, &small(), T).map(|_| ()));
    exchange(&mut ca, &small(), T).unwrap();
    peer.join().unwrap().unwrap();
    assert_eq!(ca.read_timeout().unwrap(), t);
    assert_eq!(ca.write_timeout().unwrap(), None);
}

#[test]
fn exchange_of_largest_hellos_does_not_deadlock() {
    // Both sides write ~96 KiB before reading.
    let mut h = small();
    h.udp = "[::1]:1".parse().unwrap();
    h.regions = vec![Region::default(); MAX_REGIONS];
    assert_eq!(h.encoded_len(), MAX_ENCODED_LEN);
    let (mut ca, mut cb) = pair();
    let h2 = h.clone();
    let peer = std::thread::spawn(move || exchange(&mut cb, &h2, T));
    assert_eq!(exchange(&mut ca, &h, T).unwrap(), h);
    assert_eq!(peer.join().unwrap().unwrap(), h);
}

/// Runs `exchange` against a peer doing `peer`, returning the error and how long it took.
fn exchange_against(
    timeout: Duration,
    peer: impl FnOnce(TcpStream) + Send + 'static,
) -> (Error, Duration) {
    let (mut ca, cb) = pair();
    let peer = std::thread::spawn(move || peer(cb));
    let start = Instant::now();
    let e = exchange(&mut ca, &small(), timeout).unwrap_err();
    let took = start.elapsed();
    peer.join().unwrap();
    (e, took)
}

#[test]
fn exchange_peer_closes_before_sending() {
    let (e, took) = exchange_against(T, drop);
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    // EOF, or a reset when our hello arrived at a closed socket.
    assert!(
        e.message()
            .contains("peer closed the connection before sending the peer's hello")
            || e.message().contains("reset"),
        "{e}"
    );
    assert!(took < T, "EOF must not wait for the timeout");
}

#[test]
fn exchange_peer_closes_mid_hello() {
    let (e, _) = exchange_against(T, |mut s| {
        s.write_all(&SMALL[..20]).unwrap();
        // Read ours so the close is a FIN, not a reset.
        let mut buf = [0u8; SMALL.len()];
        s.read_exact(&mut buf).unwrap();
    });
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(
        e.message()
            .contains("before sending the peer's hello (20 of 61 bytes received)"),
        "{e}"
    );
}

#[test]
fn exchange_peer_sends_garbage() {
    let (e, _) = exchange_against(T, |mut s| {
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    });
    assert_eq!(e.kind(), ErrorKind::Parse, "{e}");
    assert!(
        e.message().contains("hello length 1195725856 out of range"),
        "{e}"
    );

    // A plausible length but a bad body.
    let (e, _) = exchange_against(T, |mut s| {
        s.write_all(&patched(4, b"XXXX")).unwrap();
    });
    assert_eq!(e.kind(), ErrorKind::Parse, "{e}");
    assert!(e.message().contains("bad magic"), "{e}");
}

#[test]
fn exchange_times_out_when_peer_is_silent() {
    let (e, took) = exchange_against(SHORT, |mut s| {
        // Hold the connection open past the timeout without writing.
        let mut buf = [0u8; 1];
        let _ = s.read(&mut buf);
        std::thread::sleep(SHORT * 3);
    });
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(
        e.message()
            .contains("timed out waiting for the peer's hello length prefix")
    );
    assert!(took >= SHORT && took < SHORT * 3, "{took:?}");
}

#[test]
fn exchange_deadline_covers_a_trickling_peer() {
    let (e, took) = exchange_against(SHORT, |mut s| {
        for &b in &SMALL[..10] {
            if s.write_all(&[b]).is_err() {
                return;
            }
            std::thread::sleep(SHORT / 4);
        }
    });
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.message().contains("timed out"), "{e}");
    assert!(took < SHORT * 2, "{took:?}");
}

#[test]
fn zero_timeout_and_invalid_hello_are_invalid_arguments() {
    let (mut ca, _cb) = pair();
    let e = exchange(&mut ca, &small(), Duration::ZERO).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let mut h = small();
    h.qpn = 1 << 24;
    let e = exchange(&mut ca, &h, T).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        ready(&mut ca, Duration::ZERO).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

#[test]
fn ready_errors() {
    // Wrong byte.
    let (mut ca, mut cb) = pair();
    cb.write_all(b"X").unwrap();
    let e = ready(&mut ca, T).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Parse, "{e}");
    assert!(e.message().contains("got 0x58"), "{e}");
    // Peer gone.
    let (mut ca, cb) = pair();
    drop(cb);
    let e = ready(&mut ca, T).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    // Peer silent.
    let (mut ca, _cb) = pair();
    let e = ready(&mut ca, SHORT).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(
        e.message()
            .contains("timed out waiting for the peer's ready byte"),
        "{e}"
    );
}

#[test]
fn ready_in_halves_meets_ready() {
    // A listener reads the client's byte first and sends its own later.
    let (mut client, mut server) = pair();
    let c = std::thread::spawn(move || ready(&mut client, T));
    await_ready(&mut server, T).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(!c.is_finished(), "the client waits for our byte");
    send_ready(&mut server, T).unwrap();
    c.join().unwrap().unwrap();
    // The halves report like `ready`.
    let (mut ca, mut cb) = pair();
    cb.write_all(b"X").unwrap();
    let e = await_ready(&mut ca, T).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Parse, "{e}");
    let (mut ca, _cb) = pair();
    let e = await_ready(&mut ca, SHORT).unwrap_err();
    assert!(
        e.message()
            .contains("timed out waiting for the peer's ready byte"),
        "{e}"
    );
    assert_eq!(
        send_ready(&mut ca, Duration::ZERO).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

fn arb_region() -> impl Strategy<Value = Region> {
    (any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>()).prop_map(
        |(addr, len, rkey, access)| Region {
            addr,
            len: len.min(u64::MAX - addr),
            rkey,
            access,
        },
    )
}

fn arb_hello() -> impl Strategy<Value = Hello> {
    let addr = prop_oneof![
        (any::<[u8; 4]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((ip, p))),
        (any::<[u8; 16]>(), any::<u16>()).prop_map(|(ip, p)| SocketAddr::from((ip, p))),
    ];
    (
        (any::<u8>(), any::<u16>(), 0..=MASK_24, 0..=MASK_24, addr),
        (
            any::<Option<u16>>(),
            any::<Option<(u64, u16)>>().prop_map(|l| {
                l.map(|(b, s)| MsgLimitsWire {
                    max_message_bytes: b,
                    max_segments: s,
                })
            }),
        ),
        (
            prop::sample::select(MTUS.to_vec()),
            any::<u8>(),
            any::<u8>(),
            any::<u32>(),
        ),
        prop::collection::vec(arb_region(), 0..8),
    )
        .prop_map(
            |(
                (minor, flags, qpn, psn, udp),
                (src_port, limits),
                (mtu, rd, dest, credits),
                regions,
            )| {
                Hello {
                    version: VERSION & 0xff00 | u16::from(minor),
                    flags: flags & !(FLAG_SRC_PORT | FLAG_LIMITS)
                        | if src_port.is_some() { FLAG_SRC_PORT } else { 0 }
                        | if limits.is_some() { FLAG_LIMITS } else { 0 },
                    src_port,
                    limits,
                    qpn,
                    psn,
                    udp,
                    path_mtu: mtu,
                    max_rd_atomic: rd,
                    max_dest_rd_atomic: dest,
                    credits,
                    regions,
                }
            },
        )
}

proptest! {
    #[test]
    fn decode_is_total(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(h) = Hello::decode(&bytes) {
            prop_assert_eq!(h.encode(), bytes);
        }
    }

    /// Arbitrary bytes rarely get past the length and magic; mutate valid encodings too.
    #[test]
    fn decode_of_mutated_hellos_is_total(
        h in arb_hello(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = h.encode();
        for (i, v) in edits {
            let i = i.index(bytes.len());
            bytes[i] = v;
        }
        for b in [&bytes[..], &bytes[..cut.index(bytes.len())]] {
            if let Ok(d) = Hello::decode(b) {
                prop_assert_eq!(d.encode(), b);
            }
        }
    }

    #[test]
    fn round_trip(h in arb_hello()) {
        prop_assert!(h.validate().is_ok());
        let bytes = h.encode();
        prop_assert_eq!(bytes.len(), h.encoded_len());
        prop_assert_eq!(Hello::decode(&bytes).unwrap(), h);
    }
}

//! A hostile process on the same host (issue 16): it sniffs `lo` during a verified RDMA
//! READ run, learns the QP numbers, PSNs, rkey and VA from what it sees, and injects, from
//! its own UDP socket and with correct ICRCs, NAKs on the client's QP for each READ
//! request's PSN and RDMA WRITE ONLYs with the sniffed rkey and VA at the PSNs the server
//! expects next. A QP accepts packets only from its peer's IP and UDP port (as rxe's
//! `check_addr`), so the run has no errors, the server's region is unchanged, nothing
//! injected reached an engine, and every injected packet is counted as a wrong-source drop
//! by the port counters. Junk to unknown QP numbers and runt datagrams are counted too.
//!
//! Sniffing needs CAP_NET_RAW (an AF_PACKET socket); without it the test says so and
//! skips.

mod require;
mod support;

use rdmx::msgr::{Connection, Context};
use rdmx::provider::SendReq;
use rdmx::rc::verbs::send_flags;
use rdmx::rc::{Sge, WcStatus, WrOpcode, smallvec};
use rdmx::wire::{AethRepr, BthRepr, NakCode, Opcode, PacketRepr, RethRepr, Syndrome, icrc};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use support::{config, connect_pair, empty_wc, pattern, register_pair};

const PSN_MASK: u32 = 0xFF_FFFF;
/// The run's path MTU (support::config) and READ size: 4 response packets per READ.
const MTU: u32 = 1024;
const READ_LEN: u32 = 4096;
const REGION: usize = 64 << 10;
/// Verified READs in the run.
const READS: usize = 300;

/// A packet socket on `lo` that sees every IPv4 packet received there.
fn sniffer() -> Result<OwnedFd, String> {
    let proto = (libc::ETH_P_IP as u16).to_be();
    // SAFETY: plain socket(2) call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, i32::from(proto)) };
    if fd < 0 {
        return Err(format!(
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    // SAFETY: a NUL-terminated literal.
    sll.sll_ifindex = unsafe { libc::if_nametoindex(c"lo".as_ptr()) } as i32;
    // SAFETY: `sll` is a valid sockaddr_ll of the length given.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const sll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if r != 0 {
        return Err(format!("bind to lo: {}", std::io::Error::last_os_error()));
    }
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 20_000,
    };
    // SAFETY: `tv` is a valid timeval of the length given.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    Ok(fd)
}

/// The next packet received on `lo` (outgoing copies skipped): (UDP destination port, UDP
/// payload), or None on timeout or for anything but IPv4/UDP.
fn sniff(fd: &OwnedFd, buf: &mut [u8]) -> Option<(u16, std::ops::Range<usize>)> {
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
    // SAFETY: `buf` is writable for its length, `from` for `len` bytes.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            (&raw mut from).cast(),
            &mut len,
        )
    };
    if n < 28 || from.sll_pkttype == libc::PACKET_OUTGOING {
        return None;
    }
    let pkt = &buf[..n as usize];
    let ihl = usize::from(pkt[0] & 0x0F) * 4;
    if pkt[0] >> 4 != 4 || pkt[9] != libc::IPPROTO_UDP as u8 || pkt.len() < ihl + 8 {
        return None;
    }
    let dport = u16::from_be_bytes([pkt[ihl + 2], pkt[ihl + 3]]);
    Some((dport, ihl + 8..pkt.len()))
}

/// What the attacker learned and did.
#[derive(Default)]
struct Loot {
    client_qpn: Option<u32>,
    requests: u64,
    injected: u64,
}

/// A datagram from `src` to `dst` holding `p`, with its ICRC.
fn build(p: &PacketRepr<'_>, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let mut out = vec![0u8; p.buffer_len()];
    let n = p.emit(&mut out).unwrap();
    out.truncate(n);
    let (SocketAddr::V4(s), SocketAddr::V4(d)) = (src, dst) else {
        panic!("IPv4 only: {src} -> {dst}");
    };
    let value = icrc::compute_ipv4_addrs(s, d, 0, &out).unwrap();
    icrc::store(&mut out, value).unwrap();
    out
}

fn bth(opcode: Opcode, dest_qp: u32, psn: u32) -> BthRepr {
    BthRepr {
        opcode,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        tver: 0,
        pkey: 0xFFFF,
        fecn: false,
        becn: false,
        dest_qp,
        ack_req: true,
        psn: psn & PSN_MASK,
    }
}

fn bare(bth: BthRepr) -> PacketRepr<'static> {
    PacketRepr {
        bth,
        reth: None,
        aeth: None,
        atomic_ack_eth: None,
        atomic_eth: None,
        immdt: None,
        ieth: None,
        payload: &[],
    }
}

/// The attacker: sniffs `lo` until `stop`; for each READ request to the server's port it
/// sends, from its own socket, a NAK (PSN sequence error) for the request's PSN to the
/// client's QP and WRITE ONLYs of 0xEE bytes at the request's VA with its rkey at the PSNs
/// the server expects after the READ (and a few later ones, in case the client was faster).
fn attack(fd: &OwnedFd, client_udp: SocketAddr, server_udp: SocketAddr, stop: &AtomicBool) -> Loot {
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let me = sock.local_addr().unwrap();
    let junk = [0xEEu8; MTU as usize];
    let mut loot = Loot::default();
    let mut buf = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Acquire) {
        let Some((dport, range)) = sniff(fd, &mut buf) else {
            continue;
        };
        let Ok(p) = PacketRepr::parse(&buf[range]) else {
            continue; // a GSO bundle of responses, say: only its first BTH would parse
        };
        if dport == client_udp.port() {
            loot.client_qpn = Some(p.bth.dest_qp);
            continue;
        }
        if dport != server_udp.port() || p.bth.opcode != Opcode::RdmaReadRequest {
            continue;
        }
        loot.requests += 1;
        let (Some(client_qpn), Some(reth)) = (loot.client_qpn, p.reth) else {
            continue;
        };
        let psn = p.bth.psn;
        let responses = reth.dma_len.div_ceil(MTU).max(1);
        let mut nak = bare(bth(Opcode::Acknowledge, client_qpn, psn));
        nak.bth.ack_req = false;
        nak.aeth = Some(AethRepr {
            syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
            msn: 0,
        });
        let mut out = vec![build(&nak, me, client_udp)];
        for k in 1..=3 {
            let mut w = bare(bth(
                Opcode::RdmaWriteOnly,
                p.bth.dest_qp,
                psn + k * responses,
            ));
            w.reth = Some(RethRepr {
                va: reth.va,
                rkey: reth.rkey,
                dma_len: MTU,
            });
            w.payload = &junk;
            out.push(build(&w, me, server_udp));
        }
        for (i, d) in out.iter().enumerate() {
            let to = if i == 0 { client_udp } else { server_udp };
            if sock.send_to(d, to).is_ok() {
                loot.injected += 1;
            }
        }
    }
    loot
}

fn wait_one(c: &Connection) -> rdmx::provider::Wc {
    let mut wc = [empty_wc()];
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        if c.poll(&mut wc) == 1 {
            return wc[0];
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    panic!("no completion within 5 s");
}

/// The udp address peers of `ctx` send to on 127.0.0.1.
fn loopback_udp(ctx: &Context) -> SocketAddr {
    SocketAddr::new(
        Ipv4Addr::LOCALHOST.into(),
        ctx.udp_addr_for(Ipv4Addr::LOCALHOST.into()).unwrap().port(),
    )
}

#[test]
fn injected_naks_and_writes_from_another_port_are_dropped_and_counted() {
    let fd = match sniffer() {
        Ok(fd) => fd,
        Err(e) => {
            require::missing(require::NET_RAW, "sniffing lo", e);
            return;
        }
    };
    let a = Context::new(&config(&[])).unwrap();
    let b = Context::new(&config(&[])).unwrap();
    let mut a_buf = vec![0u8; REGION];
    let mut b_buf: Vec<u8> = (0..REGION).map(pattern).collect();
    // SAFETY: both buffers outlive their registrations (deregistered at the end, after the
    // connections are dropped).
    let (ma, mb) = unsafe { register_pair(&a, &mut a_buf, &b, &mut b_buf) };
    let (ca, cb) = connect_pair(&a, &b, "127.0.0.1", "127.0.0.1");
    let (client_udp, server_udp) = (loopback_udp(&a), loopback_udp(&b));
    assert_eq!(a.port_counters(), Default::default());
    assert_eq!(b.port_counters(), Default::default());

    let stop = Arc::new(AtomicBool::new(false));
    let attacker = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || attack(&fd, client_udp, server_udp, &stop))
    };
    // The verified run: READs of 4 KiB at moving offsets, each checked, with a pause after
    // each so that the injected WRITE at the server's next PSN arrives while that PSN is
    // still the expected one.
    let mut errors = 0u64;
    let mut statuses = Vec::new();
    for i in 0..READS {
        let off = (i * 4096 + (i % 7) * 64) % (REGION - READ_LEN as usize);
        a_buf[..READ_LEN as usize].fill(0);
        let wr = SendReq {
            cookie: i as u64,
            opcode: WrOpcode::RdmaRead,
            flags: send_flags::SIGNALED,
            sges: smallvec![Sge {
                addr: ma.addr,
                length: READ_LEN,
                lkey: ma.lkey,
            }],
            remote_addr: mb.addr + off as u64,
            rkey: mb.rkey,
            imm: 0,
        };
        ca.post_send(&[wr]).unwrap();
        let wc = wait_one(&ca);
        if wc.status != WcStatus::Success {
            statuses.push((i, wc.status));
            break;
        }
        if (0..READ_LEN as usize).any(|j| a_buf[j] != pattern(off + j)) {
            errors += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Late injections land before the counters are read.
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Release);
    let loot = attacker.join().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let (pa, pb) = (a.port_counters(), b.port_counters());
    let (ka, kb) = (ca.counters(), cb.counters());
    println!(
        "attacker saw {} READ requests, injected {} packets; client port {pa:?}; server port \
         {pb:?}; client QP {ka:?}; server QP {kb:?}",
        loot.requests, loot.injected
    );
    let changed = (0..REGION).filter(|&j| b_buf[j] != pattern(j)).count();
    assert!(statuses.is_empty(), "failed READs: {statuses:?}");
    assert_eq!(errors, 0, "READs returned wrong bytes");
    assert_eq!(changed, 0, "the server's region was written");
    assert!(
        loot.injected >= 4 * 100,
        "the attack did not run: {}",
        loot.injected
    );
    // Every injected packet was dropped at the port as a wrong source; nothing reached an
    // engine: no NAK was seen, nothing arrived out of sequence, and each side received
    // exactly what the other sent.
    assert_eq!(pa.wrong_source + pb.wrong_source, loot.injected);
    assert_eq!(pa.wrong_source, loot.injected / 4, "NAKs to the client");
    assert_eq!(ka.seq_naks_received, 0);
    assert_eq!(kb.out_of_sequence + kb.duplicates_received, 0);
    assert_eq!(kb.rx_packets, ka.tx_packets);
    assert_eq!(ka.rx_packets, kb.tx_packets);
    for p in [pa, pb] {
        assert_eq!((p.unknown_qpn, p.bad_icrc, p.malformed), (0, 0, 0), "{p:?}");
    }

    // Junk: a well-formed NAK for a QP number nobody has, and runts, from the same socket.
    let sock = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let me = sock.local_addr().unwrap();
    let mut nak = bare(bth(Opcode::Acknowledge, 0x00AB_CDEF, 1));
    nak.aeth = Some(AethRepr {
        syndrome: Syndrome::Nak(NakCode::PsnSequenceError),
        msn: 0,
    });
    let stray = build(&nak, me, server_udp);
    for _ in 0..5 {
        sock.send_to(&stray, server_udp).unwrap();
        sock.send_to(&[0u8; 7], server_udp).unwrap();
    }
    let end = Instant::now() + Duration::from_secs(5);
    while b.port_counters().malformed < 5 || b.port_counters().unknown_qpn < 5 {
        assert!(Instant::now() < end, "{:?}", b.port_counters());
        std::thread::sleep(Duration::from_millis(5));
    }
    let p = b.port_counters();
    assert_eq!((p.unknown_qpn, p.malformed), (5, 5), "{p:?}");

    drop(ca);
    drop(cb);
    a.deregister(ma.lkey).unwrap();
    b.deregister(mb.lkey).unwrap();
}

//! What the soft provider puts on the wire, checked from outside: tcpdump captures a short
//! run on `lo` (SENDs into posted receives, a 4-packet RDMA READ, a 3-packet and a 1-packet
//! RDMA WRITE, a SEND that meets RNR NAKs until the receiver posts a receive), tshark
//! decodes it as InfiniBand/RRoCE, and the test checks opcodes, PSN progression, AckReq and
//! AETH syndromes. It also reads the pcap itself and recomputes every packet's ICRC from the
//! captured IPv4/UDP headers (`rdmx::wire::icrc::compute_ipv4`), and checks IP ID 0 + DF.
//!
//! Skips (with a message) when tshark or tcpdump is missing or capturing is not permitted.

mod require;
mod support;

use rdmx::msgr::{Connection, Context};
use rdmx::provider::SendReq;
use rdmx::provider::Wc;
use rdmx::rc::verbs::send_flags;
use rdmx::rc::{Sge, SgeList, WcOpcode, WcStatus, WrOpcode, smallvec};
use rdmx::wire::icrc;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use support::config;

const SEC: Duration = Duration::from_secs(1);
const PSN_MASK: u32 = 0xFF_FFFF;

// Opcodes (RC, docs/rc-transport.md §2.1).
const SEND_ONLY: u8 = 4;
const WRITE_FIRST: u8 = 6;
const WRITE_MIDDLE: u8 = 7;
const WRITE_LAST: u8 = 8;
const WRITE_ONLY: u8 = 10;
const READ_REQUEST: u8 = 12;
const READ_RESP_FIRST: u8 = 13;
const READ_RESP_MIDDLE: u8 = 14;
const READ_RESP_LAST: u8 = 15;
const ACKNOWLEDGE: u8 = 17;

/// The peer's min_rnr_timer code (12 = 0.64 ms): its RNR NAKs carry 0x20 | 12.
const RNR_CODE: u8 = 12;

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A running tcpdump; stopped (SIGTERM, then SIGKILL) and reaped on drop.
struct Capture {
    child: Child,
    path: PathBuf,
}

impl Capture {
    /// Starts tcpdump on lo for UDP to `ports`; waits (bounded) until it is listening.
    fn start(path: &Path, ports: &[u16]) -> Result<Capture, String> {
        let filter = ports
            .iter()
            .map(|p| format!("udp dst port {p}"))
            .collect::<Vec<_>>()
            .join(" or ");
        let mut child = Command::new("tcpdump")
            .args(["-i", "lo", "-n", "-U", "--immediate-mode", "-s", "0", "-w"])
            .arg(path)
            .arg(&filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("tcpdump: {e}"))?;
        let err = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut cap = Capture {
            child,
            path: path.to_owned(),
        };
        let end = Instant::now() + 5 * SEC;
        let mut said = Vec::new();
        loop {
            match rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
                Ok(l) if l.contains("listening on") => break,
                Ok(l) => said.push(l),
                Err(_) => {
                    cap.stop();
                    return Err(format!(
                        "tcpdump did not start listening (waited up to 5 s): {}",
                        said.join(" | ")
                    ));
                }
            }
        }
        // Drain the rest of its stderr in the background.
        std::thread::spawn(move || while rx.recv().is_ok() {});
        Ok(cap)
    }

    /// SIGTERM (tcpdump flushes and exits), bounded wait, then SIGKILL.
    fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SAFETY: kill(2) on our own, not yet reaped child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let end = Instant::now() + 5 * SEC;
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop();
        if std::env::var_os("RDMX_KEEP_PCAP").is_none() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn wait(c: &Connection, n: usize) -> Vec<Wc> {
    support::poll_for(c, n, 5 * SEC)
}

fn wr(cookie: u64, opcode: WrOpcode, sge: Sge, remote_addr: u64, rkey: u32) -> SendReq {
    SendReq {
        cookie,
        opcode,
        flags: send_flags::SIGNALED,
        sges: smallvec![sge],
        remote_addr,
        rkey,
        imm: 0,
    }
}

/// One decoded packet.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pkt {
    frame: u32,
    dst_port: u16,
    opcode: u8,
    psn: u32,
    ackreq: bool,
    syndrome: Option<u8>,
    dest_qp: u32,
}

fn parse_num(s: &str) -> u32 {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x") {
        u32::from_str_radix(h, 16).unwrap_or_else(|_| panic!("hex {s:?}"))
    } else {
        s.parse().unwrap_or_else(|_| panic!("number {s:?}"))
    }
}

fn parse_bool(s: &str) -> bool {
    matches!(s.trim(), "1" | "True" | "true")
}

/// Decodes `file` with tshark as RRoCE on both soft ports.
fn tshark_decode(file: &Path, ports: [u16; 2]) -> Vec<Pkt> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args([
            "-o",
            &format!("infiniband.rroce.port:{}", ports[0]),
            "-d",
            &format!("udp.port=={},infiniband", ports[1]),
            "--disable-protocol",
            "rpcordma",
            "-T",
            "fields",
            "-E",
            "separator=/t",
            "-e",
            "frame.number",
            "-e",
            "udp.dstport",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.psn",
            "-e",
            "infiniband.bth.a",
            "-e",
            "infiniband.aeth.syndrome",
            "-e",
            "infiniband.bth.destqp",
        ])
        .stderr(Stdio::piped())
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert!(
                f.len() >= 7 && !f[2].is_empty(),
                "tshark did not decode an InfiniBand packet: {l:?}"
            );
            Pkt {
                frame: parse_num(f[0]),
                dst_port: parse_num(f[1]) as u16,
                opcode: parse_num(f[2]) as u8,
                psn: parse_num(f[3]),
                ackreq: parse_bool(f[4]),
                syndrome: (!f[5].is_empty()).then(|| parse_num(f[5]) as u8),
                dest_qp: parse_num(f[6]),
            }
        })
        .collect()
}

/// One captured frame's IP header (IPv4, or the fixed IPv6 header), UDP header and UDP
/// payload.
struct Frame {
    ip: Vec<u8>,
    udp: Vec<u8>,
    payload: Vec<u8>,
}

/// Reads a libpcap file (either byte order, us or ns timestamps) with link type Ethernet
/// (lo), Linux cooked (v1/v2) or raw IP; returns the UDP frames over IPv4 and over IPv6
/// (fixed header only: rdmx sends no extension headers).
fn read_pcap(bytes: &[u8]) -> Vec<Frame> {
    assert!(bytes.len() >= 24, "pcap shorter than its header");
    let magic = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
    let le = match magic {
        0xa1b2_c3d4 | 0xa1b2_3c4d => true,
        0xd4c3_b2a1 | 0x4d3c_b2a1 => false,
        m => panic!("not a libpcap file (magic {m:#x}); pcapng?"),
    };
    let u32_at = |b: &[u8], off: usize| {
        let a: [u8; 4] = b[off..off + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let linktype = u32_at(bytes, 20);
    let l2 = match linktype {
        1 => 14,       // Ethernet (lo)
        113 => 16,     // Linux cooked v1
        276 => 20,     // Linux cooked v2
        12 | 101 => 0, // raw IP
        t => panic!("unsupported pcap link type {t}"),
    };
    let mut frames = Vec::new();
    let mut off = 24;
    while off + 16 <= bytes.len() {
        let incl = u32_at(bytes, off + 8) as usize;
        let orig = u32_at(bytes, off + 12) as usize;
        let data = &bytes[off + 16..(off + 16 + incl).min(bytes.len())];
        off += 16 + incl;
        assert_eq!(incl, orig, "capture truncated a packet (snaplen)");
        let Some(ipb) = data.get(l2..) else { continue };
        if ipb.len() >= 48 && ipb[0] >> 4 == 6 {
            let total = 40 + usize::from(u16::from_be_bytes([ipb[4], ipb[5]]));
            if ipb[6] == 17 && total <= ipb.len() {
                frames.push(Frame {
                    ip: ipb[..40].to_vec(),
                    udp: ipb[40..48].to_vec(),
                    payload: ipb[48..total].to_vec(),
                });
            }
            continue;
        }
        if ipb.len() < 20 || ipb[0] >> 4 != 4 {
            continue;
        }
        let ihl = usize::from(ipb[0] & 0x0F) * 4;
        let total = usize::from(u16::from_be_bytes([ipb[2], ipb[3]]));
        if ipb[9] != 17 || total > ipb.len() || total < ihl + 8 {
            continue;
        }
        frames.push(Frame {
            ip: ipb[..ihl].to_vec(),
            udp: ipb[ihl..ihl + 8].to_vec(),
            payload: ipb[ihl + 8..total].to_vec(),
        });
    }
    frames
}

/// Whether tshark and tcpdump are both installed; says which is missing otherwise.
fn have_capture_tools() -> bool {
    for tool in ["tshark", "tcpdump"] {
        if !have(tool) {
            require::missing(
                require::CAPTURE,
                "the capture check",
                format!("{tool} is not installed"),
            );
            return false;
        }
    }
    true
}

/// Starts a capture of UDP to `ports` into a temporary `NAME-PID.pcap` and lets tcpdump
/// settle; None (with the reason printed) when capturing is not possible here.
fn start_capture(name: &str, ports: &[u16]) -> Option<(Capture, PathBuf)> {
    let file = std::env::temp_dir().join(format!("{name}-{}.pcap", std::process::id()));
    match Capture::start(&file, ports) {
        Ok(c) => {
            std::thread::sleep(Duration::from_millis(50));
            Some((c, file))
        }
        Err(why) => {
            require::missing(require::CAPTURE, "the capture check", why);
            None
        }
    }
}

#[test]
fn capture_decodes_as_rroce_with_expected_opcodes_psns_syndromes_and_icrc() {
    let _g = support::serial();
    if !have_capture_tools() {
        return;
    }
    // timeout 18 (1.07 s): on a loaded machine a 4 ms ACK timer (the default) can expire
    // while the receiver's thread waits for a core, and the spurious go-back-N retransmits
    // would make the packet sequence nondeterministic.
    // soft_gso off: runs of equal packets (the WRITE's FIRST and MIDDLE, the READ's
    // responses) would be one super-frame each in a capture on lo.
    let kv = [
        ("rnr_retry", "7"),
        ("min_rnr_timer", "12"),
        ("timeout", "18"),
        ("soft_gso", "false"),
    ];
    let a = Context::new(&config(&kv)).unwrap();
    let b = Context::new(&config(&kv)).unwrap();
    let mut a_buf: Vec<u8> = (0..64usize << 10).map(|i| (i % 251) as u8).collect();
    let mut b_buf: Vec<u8> = (0..64usize << 10).map(support::pattern).collect();
    // SAFETY: the buffers outlive the connections (dropped at the end of the test, after
    // the connections are closed).
    let (ma, mb) = unsafe { support::register_pair(&a, &mut a_buf, &b, &mut b_buf) };
    let (mut ca, mut cb) = support::connect_pair(&a, &b, "127.0.0.1", "127.0.0.1");
    let (pa, pb) = (a.udp_addr().port(), b.udp_addr().port());

    let Some((mut cap, file)) = start_capture("rdmx-capture", &[pa, pb]) else {
        return;
    };

    let sa = |off: u64, len: u32| Sge {
        addr: ma.addr + off,
        length: len,
        lkey: ma.lkey,
    };
    let sb = |off: u64, len: u32| Sge {
        addr: mb.addr + off,
        length: len,
        lkey: mb.lkey,
    };
    // 1. Three SEND_ONLY into three posted receives.
    let recvs: Vec<(u64, SgeList)> = (0..3)
        .map(|i| (100 + i, smallvec![sb(32768 + i * 4096, 4096)]))
        .collect();
    cb.post_recv(&recvs).unwrap();
    let sends: Vec<SendReq> = (0..3)
        .map(|i| wr(1 + i, WrOpcode::Send, sa(0, 100 * (i as u32 + 1)), 0, 0))
        .collect();
    ca.post_send(&sends).unwrap();
    let c = wait(&ca, 3);
    assert_eq!(c.len(), 3, "{c:?}");
    assert!(c.iter().all(|w| w.status == WcStatus::Success), "{c:?}");
    let r = wait(&cb, 3);
    assert!(
        r.iter()
            .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Recv),
        "{r:?}"
    );
    let (qpn_a, qpn_b) = (c[0].qp_num, r[0].qp_num);
    // 2. A 4000-byte READ: 4 response packets at MTU 1024.
    ca.post_send(&[wr(4, WrOpcode::RdmaRead, sa(4096, 4000), mb.addr, mb.rkey)])
        .unwrap();
    let c = wait(&ca, 1);
    assert_eq!(c.first().map(|w| w.status), Some(WcStatus::Success));
    // 3. A 2500-byte WRITE (FIRST, MIDDLE, LAST) and a 100-byte one (ONLY).
    ca.post_send(&[wr(
        5,
        WrOpcode::RdmaWrite,
        sa(0, 2500),
        mb.addr + 8192,
        mb.rkey,
    )])
    .unwrap();
    assert_eq!(
        wait(&ca, 1).first().map(|w| w.status),
        Some(WcStatus::Success)
    );
    ca.post_send(&[wr(
        6,
        WrOpcode::RdmaWrite,
        sa(0, 100),
        mb.addr + 16384,
        mb.rkey,
    )])
    .unwrap();
    assert_eq!(
        wait(&ca, 1).first().map(|w| w.status),
        Some(WcStatus::Success)
    );
    // 4. A SEND with no receive posted: RNR NAKs (b's min_rnr_timer 12) until b posts one.
    let naks0 = ca.counters().rnr_naks_received;
    ca.post_send(&[wr(7, WrOpcode::Send, sa(0, 64), 0, 0)])
        .unwrap();
    let end = Instant::now() + 2 * SEC;
    while ca.counters().rnr_naks_received < naks0 + 2 && Instant::now() < end {
        std::thread::sleep(Duration::from_micros(100));
    }
    cb.post_recv(&[(103, smallvec![sb(49152, 4096)])]).unwrap();
    let c = wait(&ca, 1);
    assert_eq!(
        c.first().map(|w| (w.cookie, w.status)),
        Some((7, WcStatus::Success))
    );
    assert_eq!(
        wait(&cb, 1).first().map(|w| w.status),
        Some(WcStatus::Success)
    );
    let rnr_naks = ca.counters().rnr_naks_received - naks0;
    assert!(rnr_naks >= 2, "RNR NAKs: {rnr_naks}");
    assert_eq!(cb.counters().rnr_naks_sent, rnr_naks);
    std::thread::sleep(Duration::from_millis(100));
    cap.stop();
    let a_cnt = ca.counters();
    ca.close();
    cb.close();

    // ---- decode with tshark
    let pkts = tshark_decode(&file, [pb, pa]);
    let requests: Vec<&Pkt> = pkts.iter().filter(|p| p.dst_port == pb).collect();
    let responses: Vec<&Pkt> = pkts.iter().filter(|p| p.dst_port == pa).collect();
    let shown: Vec<String> = pkts
        .iter()
        .map(|p| {
            format!(
                "{:>3} {} op={:>2} psn={:#08x} a={} syn={:?}",
                p.frame,
                if p.dst_port == pb { "A->B" } else { "B->A" },
                p.opcode,
                p.psn,
                u8::from(p.ackreq),
                p.syndrome.map(|s| format!("{s:#04x}"))
            )
        })
        .collect();
    println!("{} packets captured:\n{}", pkts.len(), shown.join("\n"));
    assert!(
        requests.iter().all(|p| p.dest_qp == qpn_b),
        "requests go to b's QP"
    );
    assert!(
        responses.iter().all(|p| p.dest_qp == qpn_a),
        "responses go to a's QP"
    );

    // Requests: one PSN per packet, a READ reserves one PSN per response packet; the RNR'd
    // SEND is sent rnr_naks + 1 times with the same PSN.
    let p0 = requests.first().expect("requests captured").psn;
    let at = |k: u32| (p0 + k) & PSN_MASK;
    let mut expected: Vec<(u8, u32, bool)> = vec![
        (SEND_ONLY, at(0), true),
        (SEND_ONLY, at(1), true),
        (SEND_ONLY, at(2), true),
        (READ_REQUEST, at(3), true),
        (WRITE_FIRST, at(7), false),
        (WRITE_MIDDLE, at(8), false),
        (WRITE_LAST, at(9), true),
        (WRITE_ONLY, at(10), true),
    ];
    expected.extend((0..=rnr_naks).map(|_| (SEND_ONLY, at(11), true)));
    let got: Vec<(u8, u32, bool)> = requests
        .iter()
        .map(|p| (p.opcode, p.psn, p.ackreq))
        .collect();
    assert_eq!(
        got, expected,
        "request (opcode, PSN, AckReq) sequence; PSN p0 = {p0:#x}; a's ACK timeouts {}, \
         retransmits {}",
        a_cnt.ack_timeouts, a_cnt.retransmits
    );

    // Responses: the READ's FIRST/MIDDLE/MIDDLE/LAST at the READ's PSNs; ACKs with syndrome
    // 0x1F (ACK, credits "invalid" = no end-to-end credits) and RNR NAKs 0x20 | 12 at the
    // RNR'd SEND's PSN.
    let reads: Vec<(u8, u32)> = responses
        .iter()
        .filter(|p| p.opcode != ACKNOWLEDGE)
        .map(|p| (p.opcode, p.psn))
        .collect();
    assert_eq!(
        reads,
        [
            (READ_RESP_FIRST, at(3)),
            (READ_RESP_MIDDLE, at(4)),
            (READ_RESP_MIDDLE, at(5)),
            (READ_RESP_LAST, at(6)),
        ],
        "READ response opcodes and PSNs"
    );
    for p in responses.iter().filter(|p| p.opcode != ACKNOWLEDGE) {
        let has_aeth = matches!(p.opcode, READ_RESP_FIRST | READ_RESP_LAST);
        assert_eq!(
            p.syndrome.is_some(),
            has_aeth,
            "AETH only on FIRST/LAST: {p:?}"
        );
        if has_aeth {
            assert_eq!(p.syndrome, Some(0x1F), "{p:?}");
        }
    }
    let acks: Vec<&&Pkt> = responses
        .iter()
        .filter(|p| p.opcode == ACKNOWLEDGE)
        .collect();
    let rnr: Vec<&&Pkt> = acks
        .iter()
        .filter(|p| p.syndrome == Some(0x20 | RNR_CODE))
        .copied()
        .collect();
    assert_eq!(
        rnr.len() as u64,
        rnr_naks,
        "one RNR NAK frame per counted RNR NAK"
    );
    assert!(
        rnr.iter().all(|p| p.psn == at(11)),
        "RNR NAKs carry the SEND's PSN"
    );
    for p in &acks {
        let s = p.syndrome.expect("ACK carries an AETH");
        assert!(
            s == 0x1F || s == 0x20 | RNR_CODE,
            "ACK syndrome {s:#x} (expected 0x1f or RNR {:#x}): {p:?}",
            0x20 | RNR_CODE
        );
    }
    let plain: Vec<u32> = acks
        .iter()
        .filter(|p| p.syndrome == Some(0x1F))
        .map(|p| p.psn)
        .collect();
    // Every signaled request's last PSN is acknowledged (possibly by a later, coalesced
    // ACK), ACK PSNs never go backwards, and the last one is the final SEND's.
    let dist = |x: u32| x.wrapping_sub(p0) & PSN_MASK;
    assert!(
        plain.windows(2).all(|w| dist(w[0]) <= dist(w[1])),
        "ACK PSNs ascend: {plain:x?}"
    );
    assert!(
        plain.iter().all(|&x| dist(x) <= 11),
        "ACKs within the requests: {plain:x?}"
    );
    assert_eq!(
        plain.last(),
        Some(&at(11)),
        "the RNR'd SEND is finally ACKed"
    );
    for k in [2, 9, 10] {
        assert!(
            plain.iter().any(|&x| dist(x) >= k),
            "PSN {:#x} acknowledged",
            at(k)
        );
    }

    // ---- the bytes themselves: ICRC over the captured headers, IP ID 0 + DF
    let bytes = std::fs::read(&file).expect("read the pcap");
    let frames = read_pcap(&bytes);
    assert_eq!(frames.len(), pkts.len(), "pcap frames vs decoded packets");
    for (i, f) in frames.iter().enumerate() {
        let id = u16::from_be_bytes([f.ip[4], f.ip[5]]);
        let flags = u16::from_be_bytes([f.ip[6], f.ip[7]]);
        assert_eq!(id, 0, "frame {}: IP ID", i + 1);
        assert_eq!(flags, 0x4000, "frame {}: DF set, no fragment offset", i + 1);
        let computed = icrc::compute_ipv4(&f.ip, &f.udp, &f.payload).unwrap();
        let stored = icrc::received(&f.payload).unwrap();
        assert_eq!(
            computed,
            stored,
            "frame {}: ICRC recomputed from the captured headers",
            i + 1
        );
    }
    // A corrupted byte must change the ICRC (the check above is not vacuous).
    let f = &frames[0];
    let mut bad = f.payload.clone();
    bad[12] ^= 1;
    assert_ne!(
        icrc::compute_ipv4(&f.ip, &f.udp, &bad).unwrap(),
        icrc::received(&bad).unwrap()
    );
    println!(
        "capture: {} requests, {} responses ({} RNR NAKs), {} frames with a correct ICRC, IP ID 0 + DF",
        requests.len(),
        responses.len(),
        rnr_naks,
        frames.len()
    );
    drop(cap);
    drop((ca, cb));
    a.deregister(ma.lkey).unwrap();
    b.deregister(mb.lkey).unwrap();
    // READ moved b's pattern; WRITEs landed in b.
    assert!((0..4000).all(|i| a_buf[4096 + i] == support::pattern(i)));
    assert_eq!(b_buf[8192..8192 + 2500], a_buf[..2500]);
}

/// IPv6: the ICRC each side computed from addresses alone matches the IPv6 headers the
/// kernel actually emitted (flow label, traffic class and hop limit masked), and tshark
/// decodes the traffic as RRoCE.
#[test]
fn ipv6_capture_has_a_correct_icrc_on_every_frame() {
    let _g = support::serial();
    if !have_capture_tools() {
        return;
    }
    if let Err(e) = std::net::UdpSocket::bind("[::1]:0") {
        require::missing(
            require::IPV6,
            "the IPv6 capture check",
            format!("bind [::1]: {e}"),
        );
        return;
    }
    let kv = [("timeout", "18"), ("soft_gso", "false")];
    let a = Context::new(&config(&kv)).unwrap();
    let b = Context::new(&config(&kv)).unwrap();
    let mut a_buf = vec![0u8; 16 << 10];
    let mut b_buf: Vec<u8> = (0..16usize << 10).map(support::pattern).collect();
    // SAFETY: the buffers outlive the connections (closed before the end of the test).
    let (ma, mb) = unsafe { support::register_pair(&a, &mut a_buf, &b, &mut b_buf) };
    let (ca, cb) = support::connect_pair(&a, &b, "[::1]", "[::1]");
    let v6 = "::1".parse().unwrap();
    let (pa, pb) = (
        a.udp_addr_for(v6).expect("IPv6 port").port(),
        b.udp_addr_for(v6).expect("IPv6 port").port(),
    );
    let Some((mut cap, file)) = start_capture("rdmx-capture6", &[pa, pb]) else {
        return;
    };
    let sa = |off: u64, len: u32| Sge {
        addr: ma.addr + off,
        length: len,
        lkey: ma.lkey,
    };
    // A 4000-byte READ (4 responses at MTU 1024) and a 2500-byte WRITE (3 packets + ACK).
    ca.post_send(&[wr(1, WrOpcode::RdmaRead, sa(0, 4000), mb.addr, mb.rkey)])
        .unwrap();
    let c = wait(&ca, 1);
    assert_eq!(
        c.first().map(|w| w.status),
        Some(WcStatus::Success),
        "{c:?}"
    );
    ca.post_send(&[wr(
        2,
        WrOpcode::RdmaWrite,
        sa(0, 2500),
        mb.addr + 8192,
        mb.rkey,
    )])
    .unwrap();
    let c = wait(&ca, 1);
    assert_eq!(
        c.first().map(|w| w.status),
        Some(WcStatus::Success),
        "{c:?}"
    );
    std::thread::sleep(Duration::from_millis(100));
    cap.stop();

    let pkts = tshark_decode(&file, [pa, pb]);
    let frames = read_pcap(&std::fs::read(&file).expect("read the pcap"));
    let _ = std::fs::remove_file(&file);
    assert_eq!(frames.len(), pkts.len(), "pcap frames vs decoded packets");
    assert!(
        frames.iter().all(|f| f.ip.len() == 40),
        "every frame is IPv6"
    );
    let ops: Vec<u8> = pkts.iter().map(|p| p.opcode).collect();
    assert!(
        ops.contains(&READ_REQUEST) && ops.contains(&READ_RESP_LAST),
        "{ops:?}"
    );
    assert!(
        ops.contains(&WRITE_FIRST) && ops.contains(&WRITE_LAST),
        "{ops:?}"
    );
    assert!(frames.len() >= 9, "{} frames", frames.len());
    for (i, f) in frames.iter().enumerate() {
        let computed = icrc::compute_ipv6(&f.ip, &f.udp, &f.payload).unwrap();
        assert_eq!(
            computed,
            icrc::received(&f.payload).unwrap(),
            "frame {}: ICRC recomputed from the captured IPv6 headers",
            i + 1
        );
    }
    println!("IPv6 capture: {} frames, every ICRC correct", frames.len());
    drop((ca, cb));
    a.deregister(ma.lkey).unwrap();
    b.deregister(mb.lkey).unwrap();
    assert!((0..4000).all(|i| a_buf[i] == support::pattern(i)));
    assert_eq!(b_buf[8192..8192 + 2500], a_buf[..2500]);
}

//! perftest across two network namespaces joined by a veth pair (MTU 1500 and 9000),
//! each side under `rdmx-ibv exec` with its namespace's address, and what goes over the
//! veth: tcpdump captures it, tshark decodes every frame as RoCEv2 (InfiniBand over UDP
//! 4791), and every frame's ICRC (as tshark reads it, and as stored) equals the ICRC
//! recomputed from the captured IPv4/UDP headers (`rdmx::wire::icrc`); no frame exceeds
//! the link MTU.
//!
//! Needs root for the namespaces and the capture (skipped, saying so, otherwise), `ip`
//! (iproute2), tcpdump and tshark (scripts/install-deps.sh; their absence fails).

mod ibv_support;

use ibv_support::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Namespaces a (10.231.N.1) and b (10.231.N.2) joined by a veth of `mtu`.
fn veth_pair(tag: &str, n: u8, mtu: u32) -> netns::VethPair {
    netns::VethPair::new(tag, &format!("ri{n}"), &format!("10.231.{n}"), Some(mtu))
        .expect("namespaces and veth (root)")
}

/// tcpdump on a's veth end for UDP 4791; stopped (SIGTERM, then SIGKILL) on stop/drop.
struct Capture {
    child: Child,
    file: PathBuf,
    log: PathBuf,
}

impl Capture {
    fn start(pair: &netns::VethPair, dir: &Path) -> Capture {
        let file = dir.join("veth.pcap");
        let log = dir.join("tcpdump.log");
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &pair.a,
                "tcpdump",
                "-i",
                &pair.veth_a,
                "-s",
                "0",
                "-U",
                "-w",
            ])
            .arg(&file)
            .args(["udp", "port", "4791"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("tcpdump");
        let mut c = Capture { child, file, log };
        let start = Instant::now();
        loop {
            let l = std::fs::read_to_string(&c.log).unwrap_or_default();
            if l.contains("listening on") {
                break;
            }
            if let Ok(Some(st)) = c.child.try_wait() {
                panic!("tcpdump exited ({st}): {l}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "tcpdump did not start: {l}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        c
    }

    fn stop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop();
    }
}

/// (IPv4 header, UDP header, UDP payload, IP total length).
type Frame = (Vec<u8>, Vec<u8>, Vec<u8>, usize);

/// (IPv4 header, UDP header, UDP payload) of every IPv4/UDP frame of a libpcap file
/// (Ethernet link type, as on a veth).
fn pcap_frames(bytes: &[u8]) -> Vec<Frame> {
    assert!(bytes.len() >= 24, "pcap shorter than its header");
    let le = match u32::from_le_bytes(bytes[0..4].try_into().unwrap()) {
        0xa1b2_c3d4 | 0xa1b2_3c4d => true,
        0xd4c3_b2a1 | 0x4d3c_b2a1 => false,
        m => panic!("not a libpcap file (magic {m:#x})"),
    };
    let u32_at = |off: usize| {
        let a: [u8; 4] = bytes[off..off + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    assert_eq!(u32_at(20), 1, "link type Ethernet expected on a veth");
    let mut out = Vec::new();
    let mut off = 24;
    while off + 16 <= bytes.len() {
        let incl = u32_at(off + 8) as usize;
        let orig = u32_at(off + 12) as usize;
        let data = &bytes[off + 16..(off + 16 + incl).min(bytes.len())];
        off += 16 + incl;
        assert_eq!(incl, orig, "capture truncated a frame");
        let Some(ipb) = data.get(14..) else { continue };
        if ipb.len() < 28 || ipb[0] >> 4 != 4 || ipb[9] != 17 {
            continue;
        }
        let ihl = usize::from(ipb[0] & 0x0F) * 4;
        let total = usize::from(u16::from_be_bytes([ipb[2], ipb[3]]));
        assert!(
            total <= ipb.len() && total >= ihl + 8,
            "malformed IPv4 frame"
        );
        out.push((
            ipb[..ihl].to_vec(),
            ipb[ihl..ihl + 8].to_vec(),
            ipb[ihl + 8..total].to_vec(),
            total,
        ));
    }
    out
}

/// tshark's decode: per frame, the BTH opcode and the invariant CRC it reads.
fn tshark_decode(file: &Path) -> Vec<(u32, u32)> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args([
            "-d",
            "udp.port==4791,infiniband",
            "--disable-protocol",
            "rpcordma",
            "-T",
            "fields",
            "-E",
            "separator=/t",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.invariant.crc",
        ])
        .output()
        .expect("tshark");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let num = |s: &str| {
        let s = s.trim();
        s.strip_prefix("0x")
            .map(|h| u32::from_str_radix(h, 16).unwrap())
            .unwrap_or_else(|| s.parse().unwrap_or_else(|_| panic!("not a number: {s:?}")))
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert!(
                f.len() >= 2 && !f[0].is_empty() && !f[1].is_empty(),
                "tshark did not decode a frame as InfiniBand: {l:?}"
            );
            (num(f[0]), num(f[1]))
        })
        .collect()
}

fn root_or_skip() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        require::missing(
            require::NETNS,
            "the veth cases",
            "network namespaces, a veth pair and a capture need root",
        );
        return false;
    }
    for t in ["ip", "tcpdump", "tshark"] {
        require_tool(t);
    }
    true
}

fn veth_case(tag: &str, n: u8, mtu: u32, port: u16) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root_or_skip() {
        return;
    }
    skip_unless_platform!();
    require_tool("ib_read_bw");
    let pair = veth_pair(tag, n, mtu);
    let dir = scratch(&format!("veth-{tag}"));
    let mut cap = Capture::start(&pair, &dir);
    for (i, tool) in [
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_send_lat",
        "ib_read_lat",
    ]
    .iter()
    .enumerate()
    {
        let p = (port + i as u16).to_string();
        let cmd = [
            *tool, "-d", "rdmx0", "-x", "0", "-F", "-p", &p, "-n", "100", "-s", "16384",
        ];
        let (_, c) = pair_in(
            &format!("veth-{tag}-{tool}"),
            (Some(&pair.a), &pair.ip_a),
            (Some(&pair.b), &pair.ip_b),
            &cmd,
            Duration::from_secs(90),
        );
        assert!(
            c.contains("#bytes"),
            "{tool} over the veth (MTU {mtu}):\n{c}"
        );
    }
    cap.stop();

    let bytes = std::fs::read(&cap.file).unwrap();
    let frames = pcap_frames(&bytes);
    assert!(frames.len() > 100, "only {} frames captured", frames.len());
    let decoded = tshark_decode(&cap.file);
    assert_eq!(decoded.len(), frames.len(), "tshark frames vs pcap frames");
    let mut largest = 0;
    for (i, ((iph, udph, payload, total), (_op, tshark_icrc))) in
        frames.iter().zip(&decoded).enumerate()
    {
        let computed = rdmx::wire::icrc::compute_ipv4(iph, udph, payload).unwrap();
        let stored = rdmx::wire::icrc::received(payload).unwrap();
        assert_eq!(
            computed,
            stored,
            "frame {}: ICRC stored {stored:#x}, computed {computed:#x}",
            i + 1
        );
        // tshark shows the four ICRC bytes as a big-endian number; the ICRC is sent
        // least significant byte first.
        let wire = u32::from_be_bytes(payload[payload.len() - 4..].try_into().unwrap());
        assert_eq!(
            *tshark_icrc,
            wire,
            "frame {}: tshark's ICRC field is not the frame's",
            i + 1
        );
        assert_eq!(
            computed.swap_bytes(),
            *tshark_icrc,
            "frame {}: tshark reads ICRC {tshark_icrc:#x}, computed {computed:#x}",
            i + 1
        );
        largest = largest.max(*total);
    }
    assert!(
        largest <= mtu as usize,
        "a {largest}-byte IP packet on a {mtu}-byte link"
    );
    eprintln!(
        "veth MTU {mtu}: {} RoCEv2 frames, every ICRC correct, largest IP packet {largest} bytes",
        frames.len()
    );
}

#[test]
fn veth_mtu_1500() {
    veth_case("m1500", 1, 1500, 18641);
}

#[test]
fn veth_mtu_9000() {
    veth_case("m9000", 2, 9000, 18651);
}

/// tshark's decode of UD frames: per frame, the BTH opcode, the DETH Q_Key and source QP,
/// and the invariant CRC it reads. The CRC may be missing: tshark reads a UD payload whose
/// bytes 2-3 are zero as IPoIB (bytes 0-1 an ethertype) and, when that sub-dissector
/// throws (perftest's buffer bytes once looked like EAPOL), stops before the ICRC; the
/// headers before the payload are always decoded.
fn tshark_decode_ud(file: &Path) -> Vec<(u32, u64, u32, Option<u32>)> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args([
            "-d",
            "udp.port==4791,infiniband",
            "--disable-protocol",
            "rpcordma",
            "-T",
            "fields",
            "-E",
            "separator=/t",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.deth.q_key",
            "-e",
            "infiniband.deth.srcqp",
            "-e",
            "infiniband.invariant.crc",
        ])
        .output()
        .expect("tshark");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let num = |s: &str| -> u64 {
        let s = s.trim();
        s.strip_prefix("0x")
            .map(|h| u64::from_str_radix(h, 16).unwrap())
            .unwrap_or_else(|| s.parse().unwrap_or_else(|_| panic!("not a number: {s:?}")))
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert!(
                f.len() >= 3 && f[..3].iter().all(|x| !x.is_empty()),
                "tshark did not decode a frame as InfiniBand UD (BTH + DETH): {l:?}"
            );
            (
                num(f[0]) as u32,
                num(f[1]),
                num(f[2]) as u32,
                f.get(3).filter(|x| !x.is_empty()).map(|x| num(x) as u32),
            )
        })
        .collect()
}

/// UD across the veth (MTU 1500, so the port's active MTU is 1024): `ibv_ud_pingpong`,
/// `ib_send_bw -c UD -a` and `ib_send_lat -c UD`; every captured frame is a UD SEND
/// (opcode 0x64/0x65) with a DETH carrying the programs' Q_Key (0x11111111) and a source
/// QP, its ICRC is right, and no IP packet exceeds the link MTU.
#[test]
fn veth_ud_mtu_1500() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !root_or_skip() {
        return;
    }
    skip_unless_platform!();
    require_tool("ibv_ud_pingpong");
    require_tool("ib_send_bw");
    let mtu = 1500;
    let pair = veth_pair("ud", 28, mtu);
    let dir = scratch("veth-ud");
    let mut cap = Capture::start(&pair, &dir);
    let runs: [&[&str]; 3] = [
        &[
            "ibv_ud_pingpong",
            "-d",
            "rdmx0",
            "-g",
            "0",
            "-s",
            "1024",
            "-n",
            "100",
            "-p",
            "18671",
        ],
        &[
            "ib_send_bw",
            "-d",
            "rdmx0",
            "-x",
            "0",
            "-F",
            "-c",
            "UD",
            "-a",
            "-n",
            "50",
            "-p",
            "18672",
        ],
        &[
            "ib_send_lat",
            "-d",
            "rdmx0",
            "-x",
            "0",
            "-F",
            "-c",
            "UD",
            "-n",
            "100",
            "-p",
            "18673",
        ],
    ];
    for cmd in runs {
        let (_, c) = pair_in(
            &format!("veth-ud-{}", cmd[0]),
            (Some(&pair.a), &pair.ip_a),
            (Some(&pair.b), &pair.ip_b),
            cmd,
            Duration::from_secs(90),
        );
        assert!(
            c.contains("#bytes") || c.contains("100 iters in"),
            "{} over the veth (MTU {mtu}):\n{c}",
            cmd[0]
        );
    }
    cap.stop();

    let bytes = std::fs::read(&cap.file).unwrap();
    let frames = pcap_frames(&bytes);
    assert!(frames.len() > 200, "only {} frames captured", frames.len());
    let decoded = tshark_decode_ud(&cap.file);
    assert_eq!(decoded.len(), frames.len(), "tshark frames vs pcap frames");
    let mut largest = 0;
    let mut payload_claimed = 0;
    for (i, ((iph, udph, payload, total), (op, qkey, srcqp, tshark_icrc))) in
        frames.iter().zip(&decoded).enumerate()
    {
        assert!(
            matches!(op, 0x64 | 0x65),
            "frame {}: opcode {op:#x} is not a UD SEND",
            i + 1
        );
        assert_eq!(*qkey, 0x1111_1111, "frame {}: DETH Q_Key", i + 1);
        assert!(*srcqp > 1, "frame {}: DETH source QP {srcqp:#x}", i + 1);
        let computed = rdmx::wire::icrc::compute_ipv4(iph, udph, payload).unwrap();
        let stored = rdmx::wire::icrc::received(payload).unwrap();
        assert_eq!(
            computed,
            stored,
            "frame {}: ICRC stored {stored:#x}, computed {computed:#x}",
            i + 1
        );
        match tshark_icrc {
            Some(t) => assert_eq!(
                computed.swap_bytes(),
                *t,
                "frame {}: tshark reads ICRC {t:#x}, computed {computed:#x}",
                i + 1
            ),
            None => payload_claimed += 1,
        }
        // Our own parser agrees with tshark.
        let p = rdmx::wire::ud::UdPacketRepr::parse(payload).unwrap();
        assert_eq!((u64::from(p.deth.qkey), p.deth.src_qp), (*qkey, *srcqp));
        largest = largest.max(*total);
    }
    assert!(
        largest <= mtu as usize,
        "a {largest}-byte IP packet on a {mtu}-byte link"
    );
    assert!(
        payload_claimed * 10 < frames.len(),
        "tshark read the ICRC of only {} of {} frames",
        frames.len() - payload_claimed,
        frames.len()
    );
    eprintln!(
        "veth UD: {} RoCEv2 UD frames (BTH + DETH), every ICRC correct ({payload_claimed} payloads taken by a tshark sub-dissector), largest IP packet {largest} bytes",
        frames.len()
    );
}

//! A deterministic network simulator joining RC queue pairs: seeded loss, duplication,
//! reordering (delay jitter), corruption (bad ICRC: dropped and counted), partitions, on a
//! virtual clock. Packets carry a real ICRC computed for fake IPv4/UDP headers.
#![allow(dead_code)]

use rdmx::rc::verbs::access;
use rdmx::rc::verbs::attr_mask as m;
use rdmx::rc::{Qp, QpAttr, QpCaps, QpState, VecMemory};
use rdmx::wire::{
    AethRepr, BthRepr, ICRC_LEN, ImmDtRepr, Opcode, PacketRepr, RethRepr, WireError, icrc,
};
use std::net::{Ipv4Addr, SocketAddrV4};

/// xorshift64*: small, seedable, good enough for fault injection.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }
}

/// Fault settings of the network.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub loss: f64,
    pub dup: f64,
    pub corrupt: f64,
    /// Base one-way delay and uniform jitter (ns); jitter reorders.
    pub delay: u64,
    pub jitter: u64,
    /// Packets sent in [start, end) are lost (end = u64::MAX: permanent).
    pub partition: Option<(u64, u64)>,
}

impl Faults {
    pub const NONE: Faults = Faults {
        loss: 0.0,
        dup: 0.0,
        corrupt: 0.0,
        delay: 0,
        jitter: 0,
        partition: None,
    };
}

pub struct Node {
    pub qp: Qp,
    pub mem: VecMemory,
    pub addr: SocketAddrV4,
}

struct InFlight {
    at: u64,
    seq: u64,
    to: usize,
    bytes: Vec<u8>,
    /// (head length, payload length) when the sender handed the packet over in parts.
    split: Option<(usize, usize)>,
}

pub struct Sim {
    pub now: u64,
    pub nodes: Vec<Node>,
    pub faults: Faults,
    pub rng: Rng,
    flight: Vec<InFlight>,
    seq: u64,
    buf: Vec<u8>,
    /// (time, receiving node, packet bytes) of every packet delivered, if recording.
    pub trace: Option<Vec<(u64, usize, Vec<u8>)>>,
}

/// The QP attributes for one side of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub mtu: u32,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub access: u32,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            mtu: 256,
            timeout: 5,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
            access: access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ,
        }
    }
}

/// Brings `qp` to RTS towards `dest_qpn` (RESET -> INIT -> RTR -> RTS).
pub fn connect(qp: &mut Qp, dest_qpn: u32, sq_psn: u32, rq_psn: u32, p: &Params) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: p.access,
        port_num: 1,
        ..Default::default()
    };
    qp.modify(&a, m::STATE | m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS)
        .unwrap();
    a.qp_state = QpState::Rtr;
    a.path_mtu = p.mtu;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = p.max_dest_rd_atomic;
    a.min_rnr_timer = p.min_rnr_timer;
    qp.modify(
        &a,
        m::STATE
            | m::AV
            | m::PATH_MTU
            | m::DEST_QPN
            | m::RQ_PSN
            | m::MAX_DEST_RD_ATOMIC
            | m::MIN_RNR_TIMER,
    )
    .unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = sq_psn;
    a.max_rd_atomic = p.max_rd_atomic;
    a.timeout = p.timeout;
    a.retry_cnt = p.retry_cnt;
    a.rnr_retry = p.rnr_retry;
    qp.modify(
        &a,
        m::STATE | m::SQ_PSN | m::MAX_QP_RD_ATOMIC | m::RETRY_CNT | m::RNR_RETRY | m::TIMEOUT,
    )
    .unwrap();
}

impl Sim {
    /// Two nodes (QPNs 0x11 and 0x22) connected with `pa`/`pb`; start PSNs near the 24-bit
    /// wrap when `psn_base` says so.
    pub fn pair(
        seed: u64,
        faults: Faults,
        pa: Params,
        pb: Params,
        caps: QpCaps,
        psn_a: u32,
        psn_b: u32,
    ) -> Sim {
        let mut a = Qp::new(0x11, caps);
        let mut b = Qp::new(0x22, caps);
        connect(&mut a, 0x22, psn_a, psn_b, &pa);
        connect(&mut b, 0x11, psn_b, psn_a, &pb);
        Sim {
            now: 0,
            nodes: vec![
                Node {
                    qp: a,
                    mem: VecMemory::new(),
                    addr: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 0xC011),
                },
                Node {
                    qp: b,
                    mem: VecMemory::new(),
                    addr: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 0xC022),
                },
            ],
            faults,
            rng: Rng::new(seed),
            flight: Vec::new(),
            seq: 0,
            buf: vec![0; 4096 + 64],
            trace: None,
        }
    }

    fn dst_addr(&self, to: usize) -> SocketAddrV4 {
        SocketAddrV4::new(*self.nodes[to].addr.ip(), 4791)
    }

    /// Lets every node transmit what it has, through the faulty network. Each packet is
    /// taken at random through the copying, the zero-copy (vectored) or the gathering
    /// path, and delivered as a whole or (vectored) in parts, so every path of the engine is
    /// exercised.
    fn transmit_all(&mut self) {
        for from in 0..self.nodes.len() {
            let to = 1 - from;
            let dst = self.dst_addr(to);
            loop {
                let vectored = self.rng.chance(0.5);
                let gather = vectored && self.rng.chance(0.5);
                let node = &mut self.nodes[from];
                let (mut pkt, split) = if vectored {
                    let polled = if gather {
                        node.qp
                            .poll_transmit_gather(self.now, &node.mem, &mut self.buf)
                    } else {
                        node.qp
                            .poll_transmit_vectored(self.now, &node.mem, &mut self.buf)
                    };
                    let Some(t) = polled else {
                        break;
                    };
                    let mut pkt = self.buf[..t.head_len].to_vec();
                    pkt.extend_from_slice(t.payload);
                    pkt.resize(t.len(), 0);
                    // Gathered parts are one datagram on the wire (its head may hold payload).
                    let split =
                        (!gather && !t.is_contiguous()).then_some((t.head_len, t.payload.len()));
                    (pkt, split)
                } else {
                    let Some(n) = node.qp.poll_transmit(self.now, &node.mem, &mut self.buf) else {
                        break;
                    };
                    (self.buf[..n].to_vec(), None)
                };
                let c = icrc::compute_ipv4_addrs(node.addr, dst, 0, &pkt).expect("icrc");
                icrc::store(&mut pkt, c).expect("store");
                self.send(to, pkt, split);
            }
        }
    }

    fn send(&mut self, to: usize, mut pkt: Vec<u8>, split: Option<(usize, usize)>) {
        let f = self.faults;
        if let Some((s, e)) = f.partition
            && self.now >= s
            && self.now < e
        {
            return;
        }
        if self.rng.chance(f.loss) {
            return;
        }
        let copies = if self.rng.chance(f.dup) { 2 } else { 1 };
        if self.rng.chance(f.corrupt) {
            let i = self.rng.below(pkt.len() as u64) as usize;
            pkt[i] ^= 1 << self.rng.below(8);
        }
        for _ in 0..copies {
            let at = self.now + f.delay + self.rng.below(f.jitter + 1);
            self.seq += 1;
            self.flight.push(InFlight {
                at,
                seq: self.seq,
                to,
                bytes: pkt.clone(),
                split,
            });
        }
    }

    fn deliver_due(&mut self) {
        loop {
            let Some(i) = self
                .flight
                .iter()
                .enumerate()
                .filter(|(_, p)| p.at <= self.now)
                .min_by_key(|(_, p)| (p.at, p.seq))
                .map(|(i, _)| i)
            else {
                return;
            };
            let p = self.flight.swap_remove(i);
            let from = 1 - p.to;
            let src = self.nodes[from].addr;
            let dst = self.dst_addr(p.to);
            let node = &mut self.nodes[p.to];
            let ok = icrc::compute_ipv4_addrs(src, dst, 0, &p.bytes)
                .and_then(|c| icrc::check(&p.bytes, c))
                .is_ok();
            if std::env::var_os("RDMX_SIM_TRACE").is_some() {
                let h = parse(&p.bytes).map(|(h, pl)| {
                    (
                        h.opcode,
                        h.psn,
                        h.ack_req,
                        h.aeth,
                        h.reth.map(|r| r.dma_len),
                        pl.len(),
                    )
                });
                eprintln!("{:>10} -> {} ok={ok} {:?}", self.now, p.to, h);
            }
            if ok {
                match p.split {
                    Some((h, n)) => node.qp.handle_packet_vectored(
                        self.now,
                        &p.bytes[..h],
                        &p.bytes[h..h + n],
                        &mut node.mem,
                    ),
                    None => node.qp.handle_packet(self.now, &p.bytes, &mut node.mem),
                }
                if let Some(t) = self.trace.as_mut() {
                    t.push((self.now, p.to, p.bytes));
                }
            } else {
                node.qp.record_icrc_error();
            }
        }
    }

    /// The earliest future event (delivery or timer), if any.
    pub fn next_event(&self) -> Option<u64> {
        let d = self.flight.iter().map(|p| p.at).min();
        let t = self.nodes.iter().filter_map(|n| n.qp.next_deadline()).min();
        match (d, t) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs one instant: transmit, deliver, fire timers, transmit again.
    pub fn step(&mut self) {
        self.transmit_all();
        self.deliver_due();
        for n in &mut self.nodes {
            if n.qp.next_deadline().is_some_and(|d| d <= self.now) {
                n.qp.handle_timeout(self.now);
            }
        }
        self.transmit_all();
    }

    /// Advances to the next event, or to `limit`, whichever is first. False when idle.
    pub fn advance(&mut self, limit: u64) -> bool {
        self.step();
        match self.next_event() {
            Some(t) if t <= limit => {
                self.now = self.now.max(t);
                true
            }
            _ => false,
        }
    }
}

/// The header fields of an RC packet that the tests craft or read (the ones the engine acts
/// on), converted from and to the wire layer's [`PacketRepr`].
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
        }
    }
}

/// Parses a UDP payload (BTH .. ICRC; the ICRC is not checked) into its header fields and
/// its payload (pad removed).
pub fn parse(bytes: &[u8]) -> Result<(Hdr, &[u8]), WireError> {
    let p = PacketRepr::parse(bytes)?;
    let hdr = Hdr {
        opcode: p.bth.opcode,
        dest_qp: p.bth.dest_qp,
        psn: p.bth.psn,
        ack_req: p.bth.ack_req,
        solicited: p.bth.solicited,
        reth: p.reth,
        aeth: p.aeth,
        imm: p.immdt.map(|i| i.imm),
    };
    Ok((hdr, p.payload))
}

/// A packet as a hostile (or any) peer would send it: `hdr`'s headers (P_Key 0xFFFF),
/// `payload`, pad to 4 bytes and a zero ICRC field (the engine leaves ICRCs to its caller).
pub fn craft(hdr: &Hdr, payload: &[u8]) -> Vec<u8> {
    let p = PacketRepr {
        bth: BthRepr {
            opcode: hdr.opcode,
            solicited: hdr.solicited,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp: hdr.dest_qp,
            ack_req: hdr.ack_req,
            psn: hdr.psn,
        },
        reth: hdr.reth,
        aeth: hdr.aeth,
        atomic_ack_eth: None,
        atomic_eth: None,
        immdt: hdr.imm.map(|imm| ImmDtRepr { imm }),
        ieth: None,
        payload,
    };
    let mut buf = vec![0u8; p.buffer_len()];
    let n = p.emit(&mut buf).expect("the headers match the opcode");
    debug_assert_eq!(buf[n - ICRC_LEN..], [0; ICRC_LEN]);
    buf
}

/// Everything `qp` has to send now, parsed: (header, payload length) per packet.
pub fn drain_transmit(qp: &mut Qp, now: u64, mem: &VecMemory) -> Vec<(Hdr, usize)> {
    let mut buf = vec![0u8; 4096 + 64];
    let mut out = Vec::new();
    while let Some(n) = qp.poll_transmit(now, mem, &mut buf) {
        let (h, p) = parse(&buf[..n]).expect("engine output parses");
        out.push((h, p.len()));
    }
    out
}

//! Stateful driver for the RC engine (issue 16, item 8), shared by the cargo-fuzz target
//! `rc_qp_state` (fuzz/fuzz_targets/rc_qp_state.rs) and the stable-toolchain test
//! tests/rc_fuzz_state.rs, which feeds it seeded random bytes.
//!
//! The input is a program: each step reads an operation and its arguments from the bytes
//! (past the end every read gives 0, so any input is a whole program). Two QPs (0x11 and
//! 0x22), each backed by a `VecMemory`, are driven through every state by `modify` (valid
//! transitions with random attributes, and random masks), `post_send`/`post_recv` with
//! random SGEs (good, read-only and unknown keys, in and out of bounds), `poll_transmit`
//! (copying and vectored) into an in-memory link, delivery from the link (in order, out of
//! order, duplicated, dropped), arbitrary but well-framed packets built with
//! `PacketRepr::emit` and an ICRC computed as the soft provider does (every RC opcode incl.
//! atomics, invalidate, FLUSH/ATOMIC_WRITE and unknown opcode bytes; PSNs near the ones in
//! use; RETH/AETH/ImmDt/IETH/AtomicETH contents; payloads around the path MTU), timers at
//! random times, and memory revoked for a while (`handle_*` then sees no regions).
//!
//! Checked after every step, besides "no panic": every packet the engine sends parses
//! (`PacketRepr::parse`; the engine's own faster parser is held to PacketRepr's answers by
//! the proptests in src/rc/packet.rs, and parses these packets at the peer), is addressed to the QP's
//! destination, and carries at most a path MTU of payload; `poll_transmit` runs dry within
//! a bound derived from the QP's limits; each completion names a WR that was posted to that
//! QP and not yet completed (so completions are bounded by posted WRs), send and receive
//! completions each come in post order, send completions carry their WR's opcode; the
//! state changes only by `modify` or to ERR; after `handle_timeout` at a deadline the next
//! deadline is later (no busy loop for the caller); a region no access right lets anyone
//! write stays unchanged. At the end both QPs are moved to ERR and every receive WR and
//! signaled send WR still posted must complete.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};

use rdmx::rc::verbs::{access, attr_mask as m, send_flags};
use rdmx::rc::{
    Completion, Qp, QpAttr, QpCaps, QpState, RecvWr, SendWr, Sge, SgeList, VecMemory, WcOpcode,
    WcStatus, WrOpcode, max_packet_len,
};
use rdmx::wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, ICRC_LEN, IethRepr, ImmDtRepr, NakCode,
    Opcode, PacketRepr, RethRepr, Syndrome, icrc,
};

/// The two QPs' numbers.
const QPN: [u32; 2] = [0x11, 0x22];
/// Per node: a read-write region (local and remote), a READ-only region that nobody may
/// write, filled with a pattern.
const RW_LEN: usize = 16 * 1024;
const RO_LEN: usize = 4096;
const MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];
/// Packets kept in flight per direction; older ones are dropped (the link loses them).
const LINK_CAP: usize = 256;

fn rw_addr(node: usize) -> u64 {
    0x1000_0000 + node as u64 * 0x100_0000
}
fn ro_addr(node: usize) -> u64 {
    rw_addr(node) + 0x10_0000
}
fn rw_lkey(node: usize) -> u32 {
    1 + 16 * node as u32
}
fn ro_lkey(node: usize) -> u32 {
    2 + 16 * node as u32
}
fn rw_rkey(node: usize) -> u32 {
    0x100 + node as u32
}
fn ro_rkey(node: usize) -> u32 {
    0x200 + node as u32
}
fn ro_pattern(node: usize) -> Vec<u8> {
    (0..RO_LEN)
        .map(|i| (i as u8) ^ (0x5A + node as u8))
        .collect()
}
fn udp_addr(node: usize) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1 + node as u8), 49152 + node as u16)
}

/// The fuzz input as a stream of numbers; zeros once it is used up.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }
    fn bool(&mut self) -> bool {
        self.u8() & 1 != 0
    }
    /// `0..n`, `n` > 0.
    fn below(&mut self, n: usize) -> usize {
        if n <= 256 {
            usize::from(self.u8()) % n
        } else {
            self.u32() as usize % n
        }
    }
    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())]
    }
}

/// What the driver posted and expects back.
#[derive(Debug, Clone, Copy)]
struct Posted {
    wr_id: u64,
    opcode: WcOpcode,
    /// Receive WRs: the most a completion may report.
    capacity: u64,
    /// Send WRs: must produce a completion (signaled, or `sq_sig_all`).
    signaled: bool,
}

struct Node {
    qp: Qp,
    mem: VecMemory,
    /// Send WRs posted and not completed, in post order (a successful unsignaled WR
    /// completes silently, so it may be skipped over by a later completion).
    sends: VecDeque<Posted>,
    recvs: VecDeque<Posted>,
    /// The state the driver last set (or saw): anything else must be ERR.
    state: QpState,
    /// Steps left during which `handle_*` sees revoked memory (no regions).
    revoked: u32,
    /// PSNs worth aiming crafted packets at: those set by modify and seen on the link.
    psn_hints: [u32; 4],
    caps: QpCaps,
}

/// Everything `run` measured, for the long-running test's report.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub steps: u64,
    pub packets_sent: u64,
    pub packets_delivered: u64,
    pub packets_crafted: u64,
    pub completions: u64,
    pub modifies_ok: u64,
    pub timeouts: u64,
    /// Steps that found each QP in RESET, INIT, RTR, RTS, ERR (states reached).
    pub in_state: [u64; 5],
}

impl std::ops::AddAssign for Stats {
    fn add_assign(&mut self, o: Stats) {
        self.steps += o.steps;
        self.packets_sent += o.packets_sent;
        self.packets_delivered += o.packets_delivered;
        self.packets_crafted += o.packets_crafted;
        self.completions += o.completions;
        self.modifies_ok += o.modifies_ok;
        self.timeouts += o.timeouts;
        for (a, b) in self.in_state.iter_mut().zip(o.in_state) {
            *a += b;
        }
    }
}

struct Driver {
    nodes: [Node; 2],
    /// Packets in flight towards node 0 and node 1.
    link: [VecDeque<Vec<u8>>; 2],
    now: u64,
    next_wr_id: u64,
    empty: VecMemory,
    buf: Vec<u8>,
    stats: Stats,
}

fn state_index(s: QpState) -> usize {
    match s {
        QpState::Reset => 0,
        QpState::Init => 1,
        QpState::Rtr => 2,
        QpState::Rts => 3,
        QpState::Err => 4,
    }
}

/// Runs the program in `data`; panics on a broken invariant.
pub fn run(data: &[u8]) -> Stats {
    let mut input = Input { data, pos: 0 };
    let mut d = Driver::new(&mut input);
    // Most programs start connected, so that traffic flows from the first step.
    if !input.bool() || input.bool() {
        d.connect(&mut input);
    }
    while !input.done() && d.stats.steps < 4096 {
        d.step(&mut input);
        d.check();
        d.stats.steps += 1;
    }
    d.finish();
    d.stats
}

impl Driver {
    fn new(input: &mut Input<'_>) -> Driver {
        let caps = QpCaps {
            max_send_wr: 1 + input.below(32) as u32,
            max_recv_wr: 1 + input.below(32) as u32,
            max_send_sge: 1 + input.below(4) as u32,
            max_recv_sge: 1 + input.below(4) as u32,
            sq_sig_all: input.bool(),
            max_unacked_psns: 1 + input.below(256) as u32,
        };
        let nodes = [0, 1].map(|n| {
            let mut mem = VecMemory::new();
            mem.add_region(
                rw_addr(n),
                RW_LEN,
                rw_lkey(n),
                rw_rkey(n),
                access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ,
            );
            mem.add_region(
                ro_addr(n),
                RO_LEN,
                ro_lkey(n),
                ro_rkey(n),
                access::REMOTE_READ,
            );
            mem.region_mut(ro_lkey(n))
                .expect("just added")
                .copy_from_slice(&ro_pattern(n));
            Node {
                qp: Qp::new(QPN[n], caps),
                mem,
                sends: VecDeque::new(),
                recvs: VecDeque::new(),
                state: QpState::Reset,
                revoked: 0,
                psn_hints: [0; 4],
                caps,
            }
        });
        Driver {
            nodes,
            link: [VecDeque::new(), VecDeque::new()],
            now: 1_000_000,
            next_wr_id: 1,
            empty: VecMemory::new(),
            buf: vec![0u8; max_packet_len(4096)],
            stats: Stats::default(),
        }
    }

    fn step(&mut self, input: &mut Input<'_>) {
        let n = input.below(2);
        for node in &self.nodes {
            self.stats.in_state[state_index(node.qp.state())] += 1;
        }
        match input.below(16) {
            0 => self.modify(n, input),
            1 => self.connect(input),
            2 | 3 => self.post_send(n, input),
            4 => self.post_recv(n, input),
            5 | 6 => {
                let max = 1 + input.below(64);
                self.transmit(n, max, input.bool());
            }
            7..=9 => self.deliver(n, input),
            10 => self.inject(n, input),
            11 => self.post_recv(n, input),
            12 => self.timers(input),
            13 => self.poll_completions(n),
            14 => self.nodes[n].revoked = u32::from(input.u8() % 8),
            _ => {
                // Run both sides dry and deliver everything: lets long exchanges finish.
                for _ in 0..4 {
                    for k in 0..2 {
                        self.transmit(k, usize::MAX, input.bool());
                    }
                    for k in 0..2 {
                        while !self.link[k].is_empty() {
                            self.deliver_one(k, 0, false, input.bool());
                        }
                    }
                }
            }
        }
        for node in &mut self.nodes {
            node.revoked = node.revoked.saturating_sub(1);
        }
    }

    fn mem_of(&mut self, n: usize) -> (&mut Qp, &mut VecMemory) {
        let node = &mut self.nodes[n];
        if node.revoked > 0 {
            (&mut node.qp, &mut self.empty)
        } else {
            (&mut node.qp, &mut node.mem)
        }
    }

    /// A PSN near one in use, or anywhere.
    fn psn(&self, n: usize, input: &mut Input<'_>) -> u32 {
        let node = &self.nodes[n];
        match input.below(8) {
            0 => input.u32() & 0xFF_FFFF,
            k => {
                let base = node.psn_hints[k % 4];
                let delta = i64::from(input.u8() as i8 % 8);
                ((i64::from(base) + delta) & 0xFF_FFFF) as u32
            }
        }
    }

    fn note_psn(&mut self, n: usize, psn: u32) {
        let h = &mut self.nodes[n].psn_hints;
        h.rotate_right(1);
        h[0] = psn;
    }

    /// Random attributes; `valid` gives one of the transitions verbs allows with the mask it
    /// requires, otherwise the mask is random.
    fn modify(&mut self, n: usize, input: &mut Input<'_>) {
        let target = input.pick(&[
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Err,
        ]);
        let peer = QPN[1 - n];
        let attr = QpAttr {
            qp_state: target,
            qp_access_flags: u32::from(input.u8() & 0xF),
            pkey_index: u16::from(input.u8() % 2),
            port_num: 1 + input.u8() % 2,
            path_mtu: if input.below(8) == 0 {
                input.u32()
            } else {
                input.pick(&MTUS)
            },
            dest_qp_num: if input.below(8) == 0 {
                input.u32()
            } else {
                peer
            },
            rq_psn: self.psn(n, input),
            sq_psn: self.psn(n, input),
            max_dest_rd_atomic: input.u8() % 20,
            min_rnr_timer: input.u8() % 40,
            max_rd_atomic: input.u8() % 20,
            timeout: input.u8() % 40,
            retry_cnt: input.u8() % 10,
            rnr_retry: input.u8() % 10,
        };
        let cur = self.nodes[n].qp.state();
        let mask = match (input.below(4), cur, target) {
            (0, _, _) => input.u32() & 0x1F_FFFF,
            (_, QpState::Reset, QpState::Init) => {
                m::STATE | m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS
            }
            (_, QpState::Init, QpState::Rtr) => {
                m::STATE
                    | m::AV
                    | m::PATH_MTU
                    | m::DEST_QPN
                    | m::RQ_PSN
                    | m::MAX_DEST_RD_ATOMIC
                    | m::MIN_RNR_TIMER
            }
            (_, QpState::Rtr, QpState::Rts) => {
                m::STATE
                    | m::SQ_PSN
                    | m::MAX_QP_RD_ATOMIC
                    | m::RETRY_CNT
                    | m::RNR_RETRY
                    | m::TIMEOUT
            }
            (_, QpState::Rts, QpState::Rts) => m::STATE | m::TIMEOUT | m::RETRY_CNT | m::RNR_RETRY,
            _ => m::STATE,
        };
        self.apply_modify(n, &attr, mask);
    }

    fn apply_modify(&mut self, n: usize, attr: &QpAttr, mask: u32) -> bool {
        let node = &mut self.nodes[n];
        let before = node.qp.state();
        let ok = node.qp.modify(attr, mask).is_ok();
        if ok {
            self.stats.modifies_ok += 1;
            // Without the STATE bit a modify keeps the state.
            let target = if mask & m::STATE != 0 {
                attr.qp_state
            } else {
                before
            };
            assert_eq!(node.qp.state(), target, "modify reached its target");
            node.state = target;
            if target == QpState::Reset && mask & m::STATE != 0 {
                // A reset QP discards its WRs without completions (verbs).
                node.sends.clear();
                node.recvs.clear();
            }
            if mask & m::RQ_PSN != 0 {
                self.note_psn(n, attr.rq_psn);
            }
            if mask & m::SQ_PSN != 0 {
                self.note_psn(n, attr.sq_psn);
            }
        } else {
            assert_eq!(node.qp.state(), before, "a refused modify changes nothing");
        }
        ok
    }

    /// Resets both QPs and connects them with random but consistent attributes.
    fn connect(&mut self, input: &mut Input<'_>) {
        let mtu = input.pick(&MTUS);
        let psn = [input.u32() & 0xFF_FFFF, input.u32() & 0xFF_FFFF];
        let rd = input.u8() % 17;
        for n in 0..2 {
            let reset = QpAttr {
                qp_state: QpState::Reset,
                ..QpAttr::default()
            };
            self.apply_modify(n, &reset, m::STATE);
            let mut a = QpAttr {
                qp_state: QpState::Init,
                qp_access_flags: if input.below(4) == 0 {
                    u32::from(input.u8() & 0xF)
                } else {
                    access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ
                },
                port_num: 1,
                ..QpAttr::default()
            };
            assert!(self.apply_modify(n, &a, m::STATE | m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS));
            a.qp_state = QpState::Rtr;
            a.path_mtu = mtu;
            a.dest_qp_num = QPN[1 - n];
            a.rq_psn = psn[1 - n];
            a.max_dest_rd_atomic = rd;
            a.min_rnr_timer = input.u8() % 32;
            assert!(self.apply_modify(
                n,
                &a,
                m::STATE
                    | m::AV
                    | m::PATH_MTU
                    | m::DEST_QPN
                    | m::RQ_PSN
                    | m::MAX_DEST_RD_ATOMIC
                    | m::MIN_RNR_TIMER,
            ));
            if input.below(8) == 0 {
                continue; // stays in RTR: a responder only
            }
            a.qp_state = QpState::Rts;
            a.sq_psn = psn[n];
            a.max_rd_atomic = if input.bool() { rd } else { input.u8() % 17 };
            a.timeout = input.u8() % 24;
            a.retry_cnt = input.u8() % 8;
            a.rnr_retry = input.u8() % 8;
            assert!(self.apply_modify(
                n,
                &a,
                m::STATE
                    | m::SQ_PSN
                    | m::MAX_QP_RD_ATOMIC
                    | m::RETRY_CNT
                    | m::RNR_RETRY
                    | m::TIMEOUT,
            ));
        }
        self.link = [VecDeque::new(), VecDeque::new()];
    }

    fn sges(&mut self, n: usize, input: &mut Input<'_>, max: usize) -> SgeList {
        let mut sges = SgeList::new();
        for _ in 0..input.below(max + 1) {
            let (lkey, base, len) = match input.below(16) {
                0 => (ro_lkey(n), ro_addr(n), RO_LEN),
                1 => (input.u32(), input.u64(), 1 << 20),
                _ => (rw_lkey(n), rw_addr(n), RW_LEN),
            };
            let length = match input.below(4) {
                0 => input.u32() % (len as u32 + 8),
                1 => u32::from(input.u8()),
                _ => u32::from(input.u16() % 5000),
            };
            let off = match input.below(16) {
                0 => input.u64(),
                1 => input.below(len) as u64,
                // Mostly inside the region.
                _ => input.below((len as u64).saturating_sub(u64::from(length)).max(1) as usize)
                    as u64,
            };
            sges.push(Sge {
                addr: base.wrapping_add(off),
                length,
                lkey,
            });
        }
        sges
    }

    fn post_send(&mut self, n: usize, input: &mut Input<'_>) {
        let opcode = input.pick(&[
            WrOpcode::RdmaWrite,
            WrOpcode::RdmaWriteWithImm,
            WrOpcode::Send,
            WrOpcode::SendWithImm,
            WrOpcode::RdmaRead,
        ]);
        let sges = self.sges(n, input, 3);
        let peer = 1 - n;
        let (rkey, base, len) = match input.below(12) {
            0 => (ro_rkey(peer), ro_addr(peer), RO_LEN),
            1 => (input.u32(), input.u64(), RW_LEN),
            _ => (rw_rkey(peer), rw_addr(peer), RW_LEN),
        };
        let total = rdmx::rc::memory::sge_total(&sges);
        let room = if input.below(8) == 0 {
            len as u64
        } else {
            (len as u64).saturating_sub(total).max(1)
        };
        let wr_id = self.next_wr_id;
        self.next_wr_id += 1;
        let wr = SendWr {
            wr_id,
            opcode,
            flags: u32::from(input.u8())
                & (send_flags::SIGNALED | send_flags::SOLICITED | send_flags::FENCE),
            sges,
            remote_addr: base.wrapping_add(input.below(room as usize) as u64),
            rkey,
            imm: input.u32(),
        };
        let signaled = self.nodes[n].caps.sq_sig_all || wr.flags & send_flags::SIGNALED != 0;
        if self.nodes[n].qp.post_send(wr).is_ok() {
            self.nodes[n].sends.push_back(Posted {
                wr_id,
                opcode: opcode.wc_opcode(),
                capacity: 0,
                signaled,
            });
        }
    }

    fn post_recv(&mut self, n: usize, input: &mut Input<'_>) {
        let sges = self.sges(n, input, 3);
        let capacity = rdmx::rc::memory::sge_total(&sges);
        let wr_id = self.next_wr_id;
        self.next_wr_id += 1;
        if self.nodes[n].qp.post_recv(RecvWr { wr_id, sges }).is_ok() {
            self.nodes[n].recvs.push_back(Posted {
                wr_id,
                opcode: WcOpcode::Recv,
                capacity,
                signaled: true,
            });
        }
    }

    /// Everything node `n` has to send (at most `max` packets), checked and put on the
    /// link to its peer. Running dry must happen within the QP's bound.
    fn transmit(&mut self, n: usize, max: usize, vectored: bool) {
        let attr = *self.nodes[n].qp.attr();
        let mtu = attr.path_mtu;
        // Responder: at most 4 * max_dest_rd_atomic + 1 queued items, a READ stream at
        // most a region's worth of packets; requester: at most the window of unacked
        // PSNs (+ one message being segmented), plus its retries' rewinds.
        let stream = (RW_LEN as u64).div_ceil(u64::from(mtu.clamp(256, 4096))) + 1;
        let bound = (4 * u64::from(attr.max_dest_rd_atomic) + 1) * stream
            + 2 * u64::from(self.nodes[n].caps.max_unacked_psns)
            + 2 * stream
            + 16;
        let mut sent = 0u64;
        loop {
            if sent as usize >= max {
                return;
            }
            let now = self.now;
            let node = &mut self.nodes[n];
            let mem: &VecMemory = if node.revoked > 0 {
                &self.empty
            } else {
                &node.mem
            };
            let pkt = if vectored {
                node.qp
                    .poll_transmit_vectored(now, mem, &mut self.buf)
                    .map(|t| {
                        let mut v = self.buf[..t.head_len].to_vec();
                        v.extend_from_slice(t.payload);
                        v.resize(v.len() + t.tail_len, 0);
                        v
                    })
            } else {
                node.qp
                    .poll_transmit(now, mem, &mut self.buf)
                    .map(|len| self.buf[..len].to_vec())
            };
            let Some(mut pkt) = pkt else { return };
            sent += 1;
            assert!(
                sent <= bound,
                "poll_transmit of QP {:#x} did not run dry within {bound} packets",
                QPN[n]
            );
            self.stats.packets_sent += 1;
            assert!(
                pkt.len() <= max_packet_len(mtu),
                "packet longer than max_packet_len"
            );
            let repr = PacketRepr::parse(&pkt).expect("the engine sends packets that parse");
            assert_eq!(
                repr.bth.dest_qp,
                attr.dest_qp_num & 0xFF_FFFF,
                "addressed to the peer"
            );
            assert!(
                repr.payload.len() <= mtu as usize,
                "payload above the path MTU"
            );
            let psn = repr.bth.psn;
            frame(n, &mut pkt);
            let link = &mut self.link[1 - n];
            if link.len() >= LINK_CAP {
                link.pop_front();
            }
            link.push_back(pkt);
            // Requests aim at the peer's expected PSN, responses at our own sent PSNs.
            self.note_psn(1 - n, psn);
            self.note_psn(n, psn);
        }
    }

    /// Delivers one packet in flight to node `n`: an early one (reordering), sometimes
    /// keeping it (duplicate), sometimes dropping it.
    fn deliver(&mut self, n: usize, input: &mut Input<'_>) {
        if self.link[n].is_empty() {
            return;
        }
        let idx = match input.below(4) {
            0 => input.below(self.link[n].len()),
            _ => 0,
        };
        match input.below(8) {
            0 => {
                self.link[n].remove(idx);
            }
            1 => self.deliver_one(n, idx, true, input.bool()),
            _ => self.deliver_one(n, idx, false, input.bool()),
        }
    }

    fn deliver_one(&mut self, n: usize, idx: usize, keep: bool, vectored: bool) {
        let pkt = if keep {
            self.link[n][idx].clone()
        } else {
            self.link[n].remove(idx).expect("index in range")
        };
        self.stats.packets_delivered += 1;
        self.handle(n, &pkt, vectored);
    }

    /// Hands a well-framed packet to node `n` as the soft provider would: ICRC checked,
    /// then the whole packet, or head and payload for a vectored receive.
    fn handle(&mut self, n: usize, pkt: &[u8], vectored: bool) {
        let ok = icrc::compute_ipv4_addrs(udp_addr(1 - n), udp_addr(n), 0, pkt)
            .and_then(|c| icrc::check(pkt, c))
            .is_ok();
        assert!(ok, "the driver frames every packet");
        let now = self.now;
        let (qp, mem) = self.mem_of(n);
        match (vectored, PacketRepr::parse(pkt)) {
            (true, Ok(p)) => {
                let head = p.bth.opcode.header_len();
                qp.handle_packet_vectored(now, &pkt[..head], p.payload, mem);
            }
            _ => qp.handle_packet(now, pkt, mem),
        }
    }

    /// An arbitrary well-framed packet for node `n`.
    fn inject(&mut self, n: usize, input: &mut Input<'_>) {
        let opcode = input.pick(&Opcode::ALL);
        let mtu = self.nodes[n].qp.attr().path_mtu.clamp(256, 4096) as usize;
        let payload_len = match input.below(6) {
            0 => 0,
            1 => mtu,
            2 => mtu + 4 * input.below(3) - 4,
            3 => input.below(mtu + 8),
            _ => input.below(64),
        };
        let payload = vec![input.u8(); payload_len];
        let me = 1 - n;
        let (rkey, va) = match input.below(4) {
            0 => (input.u32(), input.u64()),
            1 => (ro_rkey(n), ro_addr(n) + input.below(RO_LEN) as u64),
            _ => (rw_rkey(n), rw_addr(n) + input.below(RW_LEN) as u64),
        };
        let syndrome = match input.below(6) {
            0 => Syndrome::ACK_UNLIMITED,
            1 => Syndrome::Ack {
                credit_code: input.u8() & 0x1F,
            },
            2 => Syndrome::RnrNak {
                timer: input.u8() & 0x1F,
            },
            3 => Syndrome::Nak(NakCode::PsnSequenceError),
            _ => Syndrome::Nak(NakCode::from_code(input.u8())),
        };
        let dma_len = match input.below(4) {
            0 => input.u32(),
            1 => payload_len as u32,
            _ => input.below(RW_LEN + 1) as u32,
        };
        let p = PacketRepr {
            bth: BthRepr {
                opcode,
                solicited: input.bool(),
                mig_req: input.bool(),
                pad_count: 0,
                tver: 0,
                pkey: 0xFFFF,
                fecn: input.bool(),
                becn: input.bool(),
                dest_qp: if input.below(16) == 0 {
                    input.u32() & 0xFF_FFFF
                } else {
                    QPN[n]
                },
                ack_req: input.bool(),
                psn: self.psn(n, input),
            },
            reth: opcode.has_reth().then_some(RethRepr { va, rkey, dma_len }),
            aeth: opcode.has_aeth().then(|| AethRepr {
                syndrome,
                msn: input.u32() & 0xFF_FFFF,
            }),
            atomic_ack_eth: opcode
                .has_atomic_ack_eth()
                .then(|| AtomicAckEthRepr { orig: input.u64() }),
            atomic_eth: opcode.has_atomic_eth().then(|| AtomicEthRepr {
                va,
                rkey,
                swap_add: input.u64(),
                compare: input.u64(),
            }),
            immdt: opcode.has_immdt().then(|| ImmDtRepr { imm: input.u32() }),
            ieth: opcode.has_ieth().then(|| IethRepr { rkey: input.u32() }),
            payload: if opcode.has_payload() { &payload } else { &[] },
        };
        let mut buf = vec![0u8; p.buffer_len().max(64)];
        let len = match p.emit(&mut buf) {
            Ok(len) => len,
            // FLUSH and ATOMIC_WRITE: PacketRepr does not build them. Send their BTH and
            // headers anyway (the peer must NAK them), or an unknown opcode byte.
            Err(_) => {
                let len = opcode.header_len() + ICRC_LEN;
                let mut b = p.bth;
                b.opcode = Opcode::SendOnly;
                let bytes = PacketRepr {
                    bth: b,
                    reth: None,
                    aeth: None,
                    atomic_ack_eth: None,
                    atomic_eth: None,
                    immdt: None,
                    ieth: None,
                    payload: &[0; 32][..opcode.header_len() - 12],
                };
                let n = bytes.emit(&mut buf).expect("a SEND ONLY builds");
                debug_assert_eq!(n, len);
                buf[0] = opcode.as_u8();
                len
            }
        };
        buf.truncate(len);
        if input.below(16) == 0 {
            // Any opcode byte: UC/UD/CNP, reserved RC codes.
            buf[0] = input.u8();
        }
        frame(me, &mut buf);
        self.stats.packets_crafted += 1;
        self.handle(n, &buf, input.bool());
    }

    fn timers(&mut self, input: &mut Input<'_>) {
        let due = self.nodes.iter().filter_map(|n| n.qp.next_deadline()).min();
        self.now = match (input.below(4), due) {
            (0 | 1, Some(t)) => self.now.max(t),
            (0, None) => self.now,
            (1, None) | (2, _) => self.now + u64::from(input.u16()) * 1000,
            _ => self.now + u64::from(input.u32()) * 4,
        };
        self.stats.timeouts += 1;
        let now = self.now;
        for node in &mut self.nodes {
            let due = node.qp.next_deadline().is_some_and(|t| t <= now);
            node.qp.handle_timeout(now);
            if due {
                assert!(
                    node.qp.next_deadline().is_none_or(|t| t > now),
                    "handle_timeout at a deadline left a deadline due: the caller would spin"
                );
            }
        }
    }

    fn poll_completions(&mut self, n: usize) {
        let node = &mut self.nodes[n];
        while let Some(c) = node.qp.poll_completion() {
            check_completion(node, &c);
            self.stats.completions += 1;
        }
    }

    /// After every step.
    fn check(&mut self) {
        for (n, node) in self.nodes.iter_mut().enumerate() {
            let s = node.qp.state();
            assert!(
                s == node.state || s == QpState::Err,
                "QP {:#x} went from {:?} to {s:?} without modify",
                QPN[n],
                node.state
            );
            node.state = s;
            assert_eq!(
                node.mem.region(ro_lkey(n)).expect("registered"),
                &ro_pattern(n)[..],
                "a region nobody may write was written"
            );
        }
    }

    /// Both QPs to ERR: every receive WR and signaled send WR still posted must complete
    /// (flushed or with its error).
    fn finish(&mut self) {
        for (n, qpn) in QPN.into_iter().enumerate() {
            self.poll_completions(n);
            let err = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            assert!(
                self.apply_modify(n, &err, m::STATE),
                "any state may go to ERR"
            );
            self.transmit(n, usize::MAX, false);
            self.poll_completions(n);
            let node = &mut self.nodes[n];
            // Unsignaled send WRs that succeeded completed silently.
            assert!(
                node.sends.iter().all(|p| !p.signaled) && node.recvs.is_empty(),
                "QP {:#x} in ERR left WRs without completions: sends {:?} recvs {:?}",
                qpn,
                node.sends,
                node.recvs
            );
            assert_eq!(node.qp.poll_completion(), None);
        }
    }
}

/// Checks a completion against what was posted to `node` and forgets its WR (so
/// completions are bounded by posted WRs: each one names an outstanding WR). Both queues
/// complete in post order; a send WR skipped over must be an unsignaled one that succeeded
/// silently.
fn check_completion(node: &mut Node, c: &Completion) {
    assert_eq!(c.qp_num, node.qp.qpn(), "completion for another QP");
    let queue = if c.is_recv {
        &mut node.recvs
    } else {
        &mut node.sends
    };
    let Some(i) = queue.iter().position(|p| p.wr_id == c.wr_id) else {
        panic!(
            "completion {c:?} for a WR not outstanding on QP {:#x} (never posted, already \
             completed, or discarded by a reset)",
            node.qp.qpn()
        );
    };
    let p = queue[i];
    if c.is_recv {
        // Receive WRs complete in order, each with a completion.
        assert_eq!(i, 0, "receive completions out of post order: {c:?}");
        if c.status == WcStatus::Success {
            assert!(matches!(
                c.opcode,
                WcOpcode::Recv | WcOpcode::RecvRdmaWithImm
            ));
            if c.opcode == WcOpcode::Recv {
                assert!(
                    u64::from(c.byte_len) <= p.capacity,
                    "received more than posted room"
                );
            }
        } else {
            assert_eq!(c.opcode, WcOpcode::Recv);
        }
        queue.pop_front();
    } else {
        assert_eq!(
            c.opcode, p.opcode,
            "send completion with another WR's opcode"
        );
        if c.status == WcStatus::Success {
            assert!(p.signaled, "an unsignaled WR completed successfully: {c:?}");
        }
        for skipped in queue.drain(..=i).take(i) {
            assert!(
                !skipped.signaled,
                "signaled WR {} got no completion before WR {} completed",
                skipped.wr_id, c.wr_id
            );
        }
    }
}

/// Fills the ICRC field as the soft provider does for a packet from node `from`.
fn frame(from: usize, pkt: &mut [u8]) {
    let c = icrc::compute_ipv4_addrs(udp_addr(from), udp_addr(1 - from), 0, pkt)
        .expect("a packet the driver frames fits a datagram");
    icrc::store(pkt, c).expect("room for the ICRC");
}

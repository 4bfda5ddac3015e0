//! `rdmx-perf engine_bench`: what the RC engine costs per operation, measured against the
//! copy it carries.
//!
//! Two engines in one process: QP A (requester) keeps `qd` RDMA READs of `size` bytes posted
//! at random 4K-aligned offsets of a 64 MiB pseudo-random region registered on QP B
//! (responder). Packets go A -> B and B -> A through an in-memory link: no loss, no
//! reordering, no ICRC (the ICRC belongs to the wire layer, not the engine), no allocation
//! per packet in the driver. By default the link is zero-copy on the sending side
//! (`poll_transmit_vectored`: headers in a buffer, the payload lent by the sender's
//! registered memory, as a NIC DMAs from an MR or `sendmsg` gathers an iovec), so each
//! block is copied once, by the receiving engine into its destination. `--copy-link` uses
//! `poll_transmit` instead, which copies the payload into the link buffer first. Completions are checked (status, opcode, length) and a sample
//! of the landed blocks (every one with `--verify-all`) is compared with the source.
//!
//! Next to it, in the same run, a bare loop copies `size` bytes from the same sequence of
//! random offsets of the same source region into a destination slot (`copy_from_slice`).
//! The two alternate in short slices so that both see the same machine conditions.
//!
//! Target: engine ops / copy ops >= 0.5, i.e. the protocol costs no more than the copy it
//! carries. (With `--copy-link` the engine moves every byte twice and 0.5 is its ceiling.)
//!
//! Credits: READs in flight are bounded by max_rd_atomic, a u8 that real NICs cap at 16.
//! The bench sets max_rd_atomic = max_dest_rd_atomic = min(qd, 16); with qd > 16 the rest
//! of the posted READs wait in the send queue (posted but not yet on the wire), as on a NIC.

use crate::cli;
use crate::perf::{Rng, json_number};
use rdmx::rc::verbs::attr_mask as m;
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{
    Qp, QpAttr, QpCaps, QpState, SendWr, Sge, VecMemory, WcOpcode, WcStatus, WrOpcode,
    max_packet_len, smallvec,
};
use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

pub const USAGE: &str = "usage: rdmx-perf engine_bench [--seconds S (2)] [--qd N (32)] \
                         [--size BYTES (4096)] [--source-mib M (64)] [--no-align] [--copy-link] [--verify-all] [--max-ops N] [--json]";

/// `rdmx-perf engine_bench --help`.
pub const HELP: &str = "\
Two RC engines in one process exchange RDMA READs of --size bytes through an in-memory link
(no NIC, no sockets), alternating with a bare copy of the same blocks; prints both rates and
their ratio (target >= 0.5: the protocol costs no more than the copy it carries).

options:
  --seconds S       measured time per side, in (0, 3600] (default 2)
  --qd N            READs posted, 1..=4096 (default 32; at most 16 on the wire: max_rd_atomic)
  --size BYTES      bytes per READ, 1..=16 MiB (default 4096)
  --source-mib M    the READ source region, 1..=4096 MiB (default 64)
  --no-align        leave the link buffer where the allocator put it (diagnostic)
  --copy-link       copy each payload into the link buffer first (two copies per block)
  --verify-all      compare every landed block with the source (default: 1 in 64)
  --max-ops N       stop each side after N operations
  --json            stdout is one JSON object only; the table goes to stderr

exit status: 0 measured (PASS or BELOW), 1 content mismatch or engine error, 2 usage error.";

/// Default source region on B (READ source; the copy baseline reads the same bytes).
const SRC_MIB: usize = 64;
const SRC_VA: u64 = 0x0001_0000_0000;
const SRC_LKEY: u32 = 0xB001;
const SRC_RKEY: u32 = 0xB002;
/// Destination slots on A (qd x size).
const DST_VA: u64 = 0x0002_0000_0000;
const DST_LKEY: u32 = 0xA001;
const DST_RKEY: u32 = 0xA002;
const QPN_A: u32 = 0x11;
const QPN_B: u32 = 0x22;
const PATH_MTU: u32 = 4096;
/// Real NICs cap max_rd_atomic / max_dest_rd_atomic at 16.
const MAX_RD_ATOMIC: u32 = 16;
/// Offsets are multiples of this.
const ALIGN: u64 = 4096;
/// Fixed seeds: the engine and the copy loop draw the same offset sequence.
const OFFSET_SEED: u64 = 0x5EED_0FF5;
const FILL_SEED: u64 = 0xF111_DA7A;
/// Without --verify-all, every VERIFY_EVERY-th completion is compared with the source (a
/// sample: the comparison is the bench checking itself, not protocol work, and runs inside
/// the engine's timed slices; `drain` then checks every block still in flight).
const VERIFY_EVERY: u64 = 64;
/// Each side runs in slices of at most this long, alternating.
const SLICE: Duration = Duration::from_millis(250);
const WARMUP: Duration = Duration::from_millis(100);
const CACHE_LINE: usize = 64;
/// BTH + AETH: where the payload of READ_RESPONSE_ONLY/FIRST/LAST starts.
const RESP_HDR_LEN: usize = 16;
/// Copies between clock reads in the baseline loop.
const COPY_BATCH: u32 = 64;

/// Random `ALIGN`-aligned offsets at which `size` bytes fit in the source region.
#[derive(Debug, Clone)]
struct Offsets {
    rng: Rng,
    blocks: u64,
}

impl Offsets {
    fn new(o: &Opts) -> Offsets {
        Offsets {
            rng: Rng::new(OFFSET_SEED),
            blocks: (o.src_len() - o.size) as u64 / ALIGN + 1,
        }
    }
    fn next(&mut self) -> usize {
        ((self.rng.next() % self.blocks) * ALIGN) as usize
    }
}

#[derive(Debug, Clone)]
struct Opts {
    seconds: f64,
    qd: usize,
    size: usize,
    source_mib: usize,
    json: bool,
    verify_all: bool,
    /// Leave the link buffer where the allocator put it (diagnostic).
    no_align: bool,
    copy_link: bool,
    max_ops: u64,
}

impl Opts {
    fn src_len(&self) -> usize {
        self.source_mib << 20
    }
}

/// `engine_bench`'s options, as given.
#[derive(Debug, clap::Parser)]
struct Cli {
    #[arg(long, value_parser = seconds, default_value = "2", allow_hyphen_values = true)]
    seconds: f64,
    #[arg(long, value_parser = cli::qd, default_value = "32", allow_hyphen_values = true)]
    qd: usize,
    #[arg(long, value_parser = size, default_value = "4096", allow_hyphen_values = true)]
    size: usize,
    #[arg(long, value_parser = source_mib, default_value_t = SRC_MIB, allow_hyphen_values = true)]
    source_mib: usize,
    #[arg(long, value_parser = max_ops, allow_hyphen_values = true)]
    max_ops: Option<u64>,
    #[arg(long)]
    json: bool,
    #[arg(long)]
    verify_all: bool,
    #[arg(long)]
    no_align: bool,
    #[arg(long)]
    copy_link: bool,
}

fn seconds(v: &str) -> Result<f64, String> {
    v.parse()
        .ok()
        .filter(|s: &f64| *s > 0.0 && *s <= 3600.0)
        .ok_or_else(|| format!("bad value '{v}': seconds in (0, 3600]"))
}

fn size(v: &str) -> Result<usize, String> {
    Some(cli::number(v)?)
        .filter(|s| (1..=16 << 20).contains(s))
        .ok_or_else(|| format!("must be 1..=16 MiB, got {v}"))
}

fn source_mib(v: &str) -> Result<usize, String> {
    Some(cli::number(v)?)
        .filter(|m| (1..=4096).contains(m))
        .ok_or_else(|| format!("must be 1..=4096, got {v}"))
}

fn max_ops(v: &str) -> Result<u64, String> {
    v.parse()
        .ok()
        .filter(|&n: &u64| n > 0)
        .ok_or_else(|| format!("bad value '{v}'"))
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let c: Cli = cli::parse(args, USAGE)?;
    let o = Opts {
        seconds: c.seconds,
        qd: c.qd,
        size: c.size,
        source_mib: c.source_mib,
        json: c.json,
        verify_all: c.verify_all,
        no_align: c.no_align,
        copy_link: c.copy_link,
        max_ops: c.max_ops.unwrap_or(u64::MAX),
    };
    if o.size > o.src_len() {
        return Err(format!(
            "--size {} exceeds the {} MiB source region",
            o.size, o.source_mib
        ));
    }
    Ok(o)
}

/// RESET -> INIT -> RTR -> RTS towards `dest_qpn` (as tests/common `connect`).
fn connect(
    qp: &mut Qp,
    dest_qpn: u32,
    sq_psn: u32,
    rq_psn: u32,
    rd_atomic: u8,
) -> Result<(), String> {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: access::LOCAL_WRITE | access::REMOTE_READ,
        port_num: 1,
        ..Default::default()
    };
    let qpn = qp.qpn();
    let err = |e: rdmx::Error| format!("modify QP {qpn:#x}: {e}");
    qp.modify(&a, m::STATE | m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS)
        .map_err(err)?;
    a.qp_state = QpState::Rtr;
    a.path_mtu = PATH_MTU;
    a.dest_qp_num = dest_qpn;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = rd_atomic;
    a.min_rnr_timer = 1;
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
    .map_err(err)?;
    a.qp_state = QpState::Rts;
    a.sq_psn = sq_psn;
    a.max_rd_atomic = rd_atomic;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    qp.modify(
        &a,
        m::STATE | m::SQ_PSN | m::MAX_QP_RD_ATOMIC | m::RETRY_CNT | m::RNR_RETRY | m::TIMEOUT,
    )
    .map_err(err)?;
    Ok(())
}

/// The two engines, their memories and the link between them.
struct Engine {
    a: Qp,
    b: Qp,
    mem_a: VecMemory,
    mem_b: VecMemory,
    /// The in-memory link: one packet at a time, handed over at once. Packets start at
    /// `link_off`, chosen so that a READ response payload (after BTH + AETH) sits at the
    /// same offset within a cache line as the source and destination regions, as the two
    /// buffers of the baseline copy do (both come from the same allocator). Without this
    /// the engine's copies run mutually misaligned and measurably slower.
    buf: Vec<u8>,
    link_off: usize,
    offsets: Offsets,
    /// Source offset of the READ posted into each destination slot.
    slot_off: Vec<usize>,
    size: usize,
    verify_all: bool,
    /// Copy every payload into the link buffer (`poll_transmit`) instead of lending it.
    copy_link: bool,
    /// Engine time (ns): advances only while the engine runs, so the ACK timer does not
    /// see the copy slices.
    clock_ns: u64,
    in_flight: usize,
    completed: u64,
    verified: u64,
    mismatches: u64,
}

/// Hands one packet from the link to `qp`: whole, or in the parts its sender produced.
fn deliver(qp: &mut Qp, now: u64, head: &[u8], payload: &[u8], whole: bool, mem: &mut VecMemory) {
    if whole {
        qp.handle_packet(now, head, mem);
    } else {
        qp.handle_packet_vectored(now, head, payload, mem);
    }
}

impl Engine {
    fn new(o: &Opts) -> Result<Engine, String> {
        let rd_atomic = o.qd.min(MAX_RD_ATOMIC as usize) as u8;
        let pkts_per_read = o.size.div_ceil(PATH_MTU as usize).max(1);
        let caps = QpCaps {
            max_send_wr: o.qd as u32,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            sq_sig_all: false,
            // Every PSN of every READ in flight fits the window.
            max_unacked_psns: (usize::from(rd_atomic) * pkts_per_read).max(128) as u32,
        };
        let mut a = Qp::new(QPN_A, caps);
        let mut b = Qp::new(QPN_B, caps);
        // Start PSNs near the 24-bit wrap: the run crosses it early.
        connect(&mut a, QPN_B, 0xFF_FF00, 0x12_3456, rd_atomic)?;
        connect(&mut b, QPN_A, 0x12_3456, 0xFF_FF00, rd_atomic)?;

        let mut mem_a = VecMemory::new();
        mem_a.add_region(
            DST_VA,
            o.qd * o.size,
            DST_LKEY,
            DST_RKEY,
            access::LOCAL_WRITE,
        );
        let mut mem_b = VecMemory::new();
        mem_b.add_region(SRC_VA, o.src_len(), SRC_LKEY, SRC_RKEY, access::REMOTE_READ);
        let src = mem_b.region_mut(SRC_LKEY).expect("just added");
        let mut rng = Rng::new(FILL_SEED);
        for c in src.chunks_exact_mut(8) {
            c.copy_from_slice(&rng.next().to_le_bytes());
        }
        let buf = vec![0u8; max_packet_len(PATH_MTU) + CACHE_LINE];
        let src_at = mem_b.region(SRC_LKEY).expect("source").as_ptr() as usize;
        let resp_payload_at = buf.as_ptr() as usize + RESP_HDR_LEN;
        let link_off = if o.no_align {
            0
        } else {
            (src_at + CACHE_LINE - resp_payload_at % CACHE_LINE) % CACHE_LINE
        };
        Ok(Engine {
            a,
            b,
            mem_a,
            mem_b,
            buf,
            link_off,
            offsets: Offsets::new(o),
            slot_off: vec![0; o.qd],
            size: o.size,
            verify_all: o.verify_all,
            copy_link: o.copy_link,
            clock_ns: 0,
            in_flight: 0,
            completed: 0,
            verified: 0,
            mismatches: 0,
        })
    }

    fn source(&self) -> &[u8] {
        self.mem_b.region(SRC_LKEY).expect("source region")
    }

    /// Posts a READ of `size` bytes at the next random offset into `slot`.
    fn post(&mut self, slot: usize) -> Result<(), String> {
        let off = self.offsets.next();
        self.slot_off[slot] = off;
        let wr = SendWr {
            wr_id: slot as u64,
            opcode: WrOpcode::RdmaRead,
            flags: send_flags::SIGNALED,
            sges: smallvec![Sge {
                addr: DST_VA + (slot * self.size) as u64,
                length: self.size as u32,
                lkey: DST_LKEY,
            }],
            remote_addr: SRC_VA + off as u64,
            rkey: SRC_RKEY,
            imm: 0,
        };
        self.a
            .post_send(wr)
            .map_err(|e| format!("post_send: {e}"))?;
        self.in_flight += 1;
        Ok(())
    }

    fn fill(&mut self) -> Result<(), String> {
        for slot in 0..self.slot_off.len() {
            self.post(slot)?;
        }
        Ok(())
    }

    /// Compares a landed block with its source.
    fn verify(&mut self, slot: usize) {
        let off = self.slot_off[slot];
        let dst = self.mem_a.region(DST_LKEY).expect("destination region");
        let got = &dst[slot * self.size..(slot + 1) * self.size];
        let want = &self.source()[off..off + self.size];
        let same = got == want;
        self.verified += 1;
        self.mismatches += u64::from(!same);
    }

    /// One round: A's requests to B, B's responses to A, timers, completions (reposted if
    /// `repost`). Returns the completions of the round.
    fn round(&mut self, repost: bool) -> Result<u64, String> {
        let now = self.clock_ns;
        let mut packets = 0u64;
        let buf = &mut self.buf[self.link_off..];
        if self.copy_link {
            while let Some(n) = self.a.poll_transmit(now, &self.mem_a, buf) {
                self.b.handle_packet(now, &buf[..n], &mut self.mem_b);
                packets += 1;
            }
            while let Some(n) = self.b.poll_transmit(now, &self.mem_b, buf) {
                self.a.handle_packet(now, &buf[..n], &mut self.mem_a);
                packets += 1;
            }
        } else {
            // Zero-copy transmit: headers in `buf`, payload lent by the sender's memory
            // (as a NIC DMAs from an MR, or sendmsg gathers an iovec); the receiver copies it
            // once into place.
            while let Some(t) = self.a.poll_transmit_vectored(now, &self.mem_a, buf) {
                deliver(
                    &mut self.b,
                    now,
                    &buf[..t.head_len],
                    t.payload,
                    t.is_contiguous(),
                    &mut self.mem_b,
                );
                packets += 1;
            }
            while let Some(t) = self.b.poll_transmit_vectored(now, &self.mem_b, buf) {
                deliver(
                    &mut self.a,
                    now,
                    &buf[..t.head_len],
                    t.payload,
                    t.is_contiguous(),
                    &mut self.mem_a,
                );
                packets += 1;
            }
        }
        for qp in [&mut self.a, &mut self.b] {
            if qp.next_deadline().is_some_and(|d| d <= now) {
                qp.handle_timeout(now);
            }
        }
        if let Some(c) = self.b.poll_completion() {
            return Err(format!("unexpected completion on the responder: {c:?}"));
        }
        let mut done = 0u64;
        while let Some(c) = self.a.poll_completion() {
            if c.status != WcStatus::Success
                || c.opcode != WcOpcode::RdmaRead
                || c.byte_len as usize != self.size
            {
                return Err(format!(
                    "bad completion {c:?} after {} good ones; requester counters {:?}",
                    self.completed,
                    self.a.counters()
                ));
            }
            let slot = c.wr_id as usize;
            self.in_flight -= 1;
            self.completed += 1;
            done += 1;
            if self.verify_all || self.completed % VERIFY_EVERY == 0 {
                self.verify(slot);
            }
            if repost {
                self.post(slot)?;
            }
        }
        if packets == 0 && done == 0 && self.in_flight > 0 {
            return Err(format!(
                "engine stalled with {} READs outstanding (deadline {:?}); A {:?}; B {:?}",
                self.in_flight,
                self.a.next_deadline(),
                self.a.counters(),
                self.b.counters()
            ));
        }
        Ok(done)
    }

    /// Runs for `dur` or until `max_ops` completions; returns (completions, time).
    fn run_for(&mut self, dur: Duration, max_ops: u64) -> Result<(u64, Duration), String> {
        let start = Instant::now();
        let base = self.clock_ns;
        let mut ops = 0u64;
        loop {
            ops += self.round(true)?;
            let el = start.elapsed();
            self.clock_ns = base + el.as_nanos() as u64;
            if el >= dur || ops >= max_ops {
                return Ok((ops, el));
            }
        }
    }

    /// Completes what is outstanding (untimed), checking every block.
    fn drain(&mut self) -> Result<(), String> {
        self.verify_all = true;
        while self.in_flight > 0 {
            self.round(false)?;
        }
        Ok(())
    }
}

/// The baseline: `size`-byte copies from the same random offsets into rotating slots
/// (`qd` of them, starting at the same offset within a cache line as the source).
struct Copier {
    offsets: Offsets,
    dst: Vec<u8>,
    dst_off: usize,
    slots: usize,
    next_slot: usize,
    size: usize,
}

impl Copier {
    fn new(o: &Opts, src: &[u8]) -> Copier {
        let dst = vec![0u8; o.qd * o.size + CACHE_LINE];
        let (s, d) = (src.as_ptr() as usize, dst.as_ptr() as usize);
        Copier {
            offsets: Offsets::new(o),
            dst,
            dst_off: (s + CACHE_LINE - d % CACHE_LINE) % CACHE_LINE,
            slots: o.qd,
            next_slot: 0,
            size: o.size,
        }
    }

    fn run_for(&mut self, src: &[u8], dur: Duration, max_ops: u64) -> (u64, Duration) {
        let start = Instant::now();
        let mut ops = 0u64;
        loop {
            for _ in 0..COPY_BATCH {
                let off = self.offsets.next();
                let slot = self.next_slot;
                self.next_slot = if slot + 1 == self.slots { 0 } else { slot + 1 };
                let at = self.dst_off + slot * self.size;
                let d = &mut self.dst[at..at + self.size];
                d.copy_from_slice(black_box(&src[off..off + self.size]));
                black_box(d);
            }
            ops += u64::from(COPY_BATCH);
            let el = start.elapsed();
            if el >= dur || ops >= max_ops {
                return (ops, el);
            }
        }
    }
}

fn rate(ops: u64, t: Duration) -> f64 {
    if t.is_zero() {
        0.0
    } else {
        ops as f64 / t.as_secs_f64()
    }
}

fn bench(o: &Opts) -> Result<bool, String> {
    let mut eng = Engine::new(o)?;
    let mut copy = Copier::new(o, eng.source());
    eng.fill()?;

    // Warm-up (untimed): faults in the destination pages, settles the caches.
    eng.run_for(WARMUP, u64::MAX)?;
    copy.run_for(eng.source(), WARMUP, u64::MAX);
    let warm_completed = eng.completed;

    let total = Duration::from_secs_f64(o.seconds);
    let slices = (total.as_secs_f64() / SLICE.as_secs_f64()).ceil().max(1.0) as u32;
    let slice = total / slices;
    let (mut e_ops, mut e_time) = (0u64, Duration::ZERO);
    let (mut c_ops, mut c_time) = (0u64, Duration::ZERO);
    for _ in 0..slices {
        if c_ops < o.max_ops {
            let (n, t) = copy.run_for(eng.source(), slice, o.max_ops - c_ops);
            c_ops += n;
            c_time += t;
        }
        if e_ops < o.max_ops {
            let (n, t) = eng.run_for(slice, o.max_ops - e_ops)?;
            e_ops += n;
            e_time += t;
        }
    }
    eng.drain()?;

    let e_rate = rate(e_ops, e_time);
    let c_rate = rate(c_ops, c_time);
    let ratio = if c_rate > 0.0 { e_rate / c_rate } else { 0.0 };
    let size = o.size as f64;
    let ns = |r: f64| if r > 0.0 { 1e9 / r } else { 0.0 };
    let ca = eng.a.counters();
    let cb = eng.b.counters();
    let pass = ratio >= 0.5;
    let in_flight = o.qd.min(MAX_RD_ATOMIC as usize);
    // The readable figures; with --json they go to stderr, so stdout is the JSON alone.
    macro_rules! say {
        ($($arg:tt)*) => {
            if o.json {
                eprintln!($($arg)*)
            } else {
                println!($($arg)*)
            }
        };
    }

    say!(
        "# rdmx engine_bench: {} B RDMA READ, qd {} ({} in flight: max_rd_atomic), path MTU {}, \
         source {} MiB, link payload {}, {:.2} s per side in {} alternating slices",
        o.size,
        o.qd,
        in_flight,
        PATH_MTU,
        o.source_mib,
        if o.no_align {
            "as allocated"
        } else {
            "co-aligned"
        },
        o.seconds,
        slices
    );
    say!(
        "{:<22} {:>14} {:>10} {:>10} {:>12}",
        "",
        "ops/s",
        "GB/s",
        "ns/op",
        "ops"
    );
    say!(
        "{:<22} {:>14.0} {:>10.3} {:>10.1} {:>12}",
        "engine (RC READ)",
        e_rate,
        e_rate * size / 1e9,
        ns(e_rate),
        e_ops
    );
    say!(
        "{:<22} {:>14.0} {:>10.3} {:>10.1} {:>12}",
        "copy (copy_from_slice)",
        c_rate,
        c_rate * size / 1e9,
        ns(c_rate),
        c_ops
    );
    say!(
        "ratio engine/copy      {:>14.3}   target >= 0.50: {}",
        ratio,
        if pass { "PASS" } else { "BELOW" }
    );
    say!(
        "verified {} of {} READs against the source: {} mismatches; \
         A tx/rx packets {}/{}, retransmits {}, ack timeouts {}; B duplicates {}, \
         out of sequence {}",
        eng.verified,
        eng.completed,
        eng.mismatches,
        ca.tx_packets,
        ca.rx_packets,
        ca.retransmits,
        ca.ack_timeouts,
        cb.duplicates_received,
        cb.out_of_sequence
    );
    if eng.completed <= warm_completed {
        return Err("no READ completed in the measured run".to_string());
    }
    if o.json {
        let j = serde_json::json!({
            "bench": "engine_bench",
            "size": o.size,
            "qd": o.qd,
            "in_flight": in_flight,
            "seconds": o.seconds,
            "engine_ops": e_ops,
            "copy_ops": c_ops,
            "engine_ops_per_sec": json_number(e_rate, 1),
            "engine_gb_per_sec": json_number(e_rate * size / 1e9, 4),
            "copy_ops_per_sec": json_number(c_rate, 1),
            "copy_gb_per_sec": json_number(c_rate * size / 1e9, 4),
            "ratio": json_number(ratio, 4),
            "target": 0.5,
            "pass": pass,
            "verified": eng.verified,
            "mismatches": eng.mismatches,
            "retransmits": ca.retransmits,
        });
        println!("{j}");
    }
    if eng.mismatches > 0 {
        eprintln!(
            "rdmx-perf: engine_bench: {} of {} verified READs differ from the source",
            eng.mismatches, eng.verified
        );
    }
    Ok(eng.mismatches == 0)
}

/// Exit status: 0 measured (PASS or BELOW), 1 content mismatch or engine error, 2 usage.
pub fn main(args: &[String]) -> ExitCode {
    let o = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("rdmx-perf: {e}");
            return ExitCode::from(2);
        }
    };
    match bench(&o) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("rdmx-perf: engine_bench: {e}");
            ExitCode::from(1)
        }
    }
}

//! The block client and target at large IO sizes and depths (issue 27): 1 MiB writes kept
//! 32 and 128 deep, each block read back and checked. Every wait is bounded.

use rdmx::blk::target::{Target, VolumeSpec};
use rdmx::blk::{BlkClient, Completion, Mode, Req, proto::Op};
use rdmx::config::Config;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
const MIB: usize = 1 << 20;

/// As tests/blk.rs: a retry budget that survives a busy 2-core host (the tests check data,
/// not timers).
fn cfg() -> Config {
    rdmx::logging::init();
    let mut c = Config::new();
    c.set("timeout", "17").unwrap();
    c
}

/// A page-aligned buffer of `n` 1 MiB blocks.
struct Bufs {
    ptr: *mut u8,
    len: usize,
}

impl Bufs {
    fn new(blocks: usize) -> Bufs {
        let len = blocks * MIB;
        let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Bufs { ptr, len }
    }
    fn block(&mut self, i: usize) -> &mut [u8] {
        assert!((i + 1) * MIB <= self.len);
        // SAFETY: within the allocation, which this borrow owns.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * MIB), MIB) }
    }
    fn at(&self, i: usize) -> *mut u8 {
        assert!((i + 1) * MIB <= self.len);
        // SAFETY: within the allocation.
        unsafe { self.ptr.add(i * MIB) }
    }
}

impl Drop for Bufs {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).unwrap();
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// The content of volume block `blk` in round `round`.
fn fill(b: &mut [u8], blk: usize, round: u64) {
    let mut x = (blk as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ round;
    for w in b.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
}

/// Keeps `depth` IOs of 1 MiB in flight until `total` completed: `op` on volume block
/// `i % blocks` for the i-th IO, in buffer slot `i % depth`. Before a write the slot is
/// filled with that block's content; `check` sees a read's buffer.
fn run_deep(
    c: &mut BlkClient,
    bufs: &mut Bufs,
    op: Op,
    depth: usize,
    total: usize,
    blocks: usize,
    mut check: impl FnMut(usize, &[u8]),
) {
    let end = Instant::now() + Duration::from_secs(90);
    let mut next = 0;
    let mut done = 0;
    let mut out: Vec<Completion> = Vec::new();
    let mut slot_of = vec![usize::MAX; depth];
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let mut max_inflight = 0;
    while done < total {
        assert!(
            Instant::now() < end,
            "{op:?} x{total} at depth {depth}: {done} done in 90 s"
        );
        while next < total
            && let Some(&s) = free.last()
        {
            let blk = next % blocks;
            if op == Op::Write {
                fill(bufs.block(s), blk, 7);
            }
            let r = Req {
                op,
                offset: (blk * MIB) as u64,
                len: MIB as u32,
                buf: bufs.at(s),
                cookie: s as u64,
            };
            // SAFETY: the slot's buffer is not touched until its completion came back.
            let k = unsafe { c.submit(std::slice::from_ref(&r)) }.unwrap();
            if k == 0 {
                break;
            }
            free.pop();
            slot_of[s] = blk;
            next += 1;
        }
        max_inflight = max_inflight.max(c.inflight());
        out.clear();
        c.poll(&mut out, 1, 64, Duration::from_millis(20)).unwrap();
        for d in &out {
            assert_eq!(d.status, 0, "{op:?} at depth {depth}: {d:?}");
            assert_eq!(d.len, MIB as u32);
            let s = d.cookie as usize;
            if op == Op::Read {
                check(slot_of[s], bufs.block(s));
            }
            free.push(s);
            done += 1;
        }
    }
    assert!(
        max_inflight >= depth.min(total) / 2,
        "the client kept only {max_inflight} of {depth} in flight"
    );
}

fn writes_then_reads(mode: Mode, depth: usize, blocks: usize, total: usize) {
    let specs: Vec<VolumeSpec> = [format!("m0=mem:{blocks}M")]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let t = Target::start(&cfg(), "127.0.0.1:0", &specs).unwrap();
    let mut c = BlkClient::open(&cfg(), &t.addr().to_string(), "m0", mode, T).unwrap();
    let mut bufs = Bufs::new(depth);
    run_deep(
        &mut c,
        &mut bufs,
        Op::Write,
        depth,
        total,
        blocks,
        |_, _| {},
    );
    let mut want = vec![0u8; MIB];
    let mut checked = 0;
    run_deep(
        &mut c,
        &mut bufs,
        Op::Read,
        depth,
        blocks,
        blocks,
        |blk, got| {
            fill(&mut want, blk, 7);
            if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
                panic!("block {blk}: byte {i} differs after {mode:?} writes at depth {depth}");
            }
            checked += 1;
        },
    );
    assert_eq!(checked, blocks);
}

#[test]
fn one_mib_writes_at_depth_32_rpc() {
    writes_then_reads(Mode::Rpc, 32, 48, 160);
}

#[test]
fn one_mib_writes_at_depth_128_rpc() {
    writes_then_reads(Mode::Rpc, 128, 160, 384);
}

#[test]
fn one_mib_writes_at_depth_32_one_sided() {
    writes_then_reads(Mode::Read, 32, 48, 160);
}

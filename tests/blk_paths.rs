//! The multipath block client (src/blk/paths.rs, docs/failover.md): two in-process targets
//! export the same file volume; one is stopped mid-IO (its sessions close: what a killed
//! `rdmx-target` looks like to the client) and the IO goes on on the other with no error
//! and every acknowledged write readable; a path rejoins and takes the IO back (failback);
//! active/active spreads IO; with no path left an IO fails only after
//! `io_fail_timeout_ms`. Every wait is bounded.

use rdmx::blk::target::{Target, VolumeSpec};
use rdmx::blk::{BlkPaths, Completion, Mode, Op, PathEventKind, PathPolicy, PathState, Req};
use rdmx::config::Config;
use rdmx::error::ErrorKind;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
const BLOCKS: usize = 64;
const BS: usize = 4096;

/// As tests/blk.rs: a retry budget of 4.3 s (many messengers in one process on a shared
/// host); the peers that stop are seen by their side channel.
fn cfg(extra: &[(&str, &str)]) -> Config {
    let mut c = Config::new();
    c.set("timeout", "17").unwrap();
    for (k, v) in extra {
        c.set(k, v).unwrap();
    }
    c
}

/// An 8 MiB file, removed on drop.
struct Vol(PathBuf);

impl Vol {
    fn new(tag: &str) -> Vol {
        let dir = std::env::temp_dir().join(format!("rdmx-blk-paths-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vol.img");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(8 << 20).unwrap();
        Vol(path)
    }
    fn spec(&self) -> VolumeSpec {
        format!("f0=file:{}", self.0.display()).parse().unwrap()
    }
}

impl Drop for Vol {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
    }
}

fn target(v: &Vol, listen: &str) -> Target {
    Target::start(&cfg(&[]), listen, &[v.spec()]).unwrap()
}

/// Page-aligned block buffers, one per block.
struct Bufs {
    ptr: *mut u8,
}

impl Bufs {
    fn new() -> Bufs {
        let layout = std::alloc::Layout::from_size_align(BLOCKS * BS, 4096).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        Bufs { ptr }
    }
    fn ptr(&self, b: usize) -> *mut u8 {
        assert!(b < BLOCKS);
        // SAFETY: within the allocation.
        unsafe { self.ptr.add(b * BS) }
    }
    /// Block `b`'s buffer, while no request on it is in flight (the workload below never
    /// touches a block with a request in flight).
    fn block(&mut self, b: usize) -> &mut [u8] {
        // SAFETY: within the allocation, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(b), BS) }
    }
}

impl Drop for Bufs {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(BLOCKS * BS, 4096).unwrap();
        // SAFETY: allocated with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// Block `b`'s content at version `v` (0: never written, zeros).
fn fill(buf: &mut [u8], b: usize, v: u64) {
    if v == 0 {
        buf.fill(0);
        return;
    }
    for (i, x) in buf.iter_mut().enumerate() {
        *x = (i as u64 ^ (b as u64).wrapping_mul(131) ^ v.wrapping_mul(7919)) as u8;
    }
    buf[..8].copy_from_slice(&v.to_le_bytes());
}

fn holds(buf: &[u8], b: usize, v: u64) -> bool {
    let mut want = vec![0u8; BS];
    fill(&mut want, b, v);
    buf == want.as_slice()
}

/// A write/read-verify workload at queue depth `qd`, one request per block at a time, so
/// that every read has one right answer: the block's last acknowledged version.
struct Load {
    bufs: Bufs,
    acked: Vec<u64>,
    /// Per block: the op in flight and the version it writes.
    busy: Vec<Option<(Op, u64)>>,
    next_version: u64,
    rng: u64,
    done: u64,
    errors: Vec<Completion>,
    bad_reads: usize,
}

impl Load {
    fn new() -> Load {
        Load {
            bufs: Bufs::new(),
            acked: vec![0; BLOCKS],
            busy: vec![None; BLOCKS],
            next_version: 1,
            rng: 0x9e37_79b9_7f4a_7c15,
            done: 0,
            errors: Vec::new(),
            bad_reads: 0,
        }
    }

    fn rand(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Runs until `ios` more IOs completed, with `hook` called after each poll with the
    /// number completed so far in this call.
    fn run(
        &mut self,
        c: &mut BlkPaths,
        ios: u64,
        qd: usize,
        mut hook: impl FnMut(u64, &mut BlkPaths),
    ) {
        let start = self.done;
        let end = Instant::now() + Duration::from_secs(60);
        let mut out = Vec::new();
        while self.done - start < ios {
            assert!(
                Instant::now() < end,
                "the workload did not finish within 60 s"
            );
            let inflight = self.busy.iter().filter(|b| b.is_some()).count();
            let mut reqs = Vec::new();
            for _ in inflight..qd {
                let b = (self.rand() % BLOCKS as u64) as usize;
                if self.busy[b].is_some() || reqs.iter().any(|r: &Req| r.cookie == b as u64) {
                    continue;
                }
                let write = self.rand() % 10 < 4;
                let (op, v) = if write {
                    let v = self.next_version;
                    self.next_version += 1;
                    fill(self.bufs.block(b), b, v);
                    (Op::Write, v)
                } else {
                    (Op::Read, 0)
                };
                self.busy[b] = Some((op, v));
                reqs.push(Req {
                    op,
                    offset: (b * BS) as u64,
                    len: BS as u32,
                    buf: self.bufs.ptr(b),
                    cookie: b as u64,
                });
            }
            if !reqs.is_empty() {
                // SAFETY: the buffers live in `self.bufs`, untouched until completion.
                let k = unsafe { c.submit(&reqs) }.unwrap();
                assert_eq!(k, reqs.len(), "the multipath client takes every request");
            }
            out.clear();
            c.poll(&mut out, 1, 64, Duration::from_millis(50)).unwrap();
            for d in &out {
                let b = d.cookie as usize;
                let (op, v) = self.busy[b]
                    .take()
                    .expect("a completion for a block in flight");
                self.done += 1;
                if d.status != 0 {
                    self.errors.push(*d);
                    continue;
                }
                if op == Op::Write {
                    self.acked[b] = v;
                } else if !holds(self.bufs.block(b), b, self.acked[b]) {
                    self.bad_reads += 1;
                }
            }
            hook(self.done - start, c);
        }
    }

    /// Waits for everything in flight.
    fn drain(&mut self, c: &mut BlkPaths) {
        let end = Instant::now() + T;
        let mut out = Vec::new();
        while self.busy.iter().any(|b| b.is_some()) {
            assert!(
                Instant::now() < end,
                "IO in flight did not complete within {T:?}"
            );
            out.clear();
            c.poll(&mut out, 1, 64, Duration::from_millis(50)).unwrap();
            for d in &out {
                let b = d.cookie as usize;
                let (op, v) = self.busy[b].take().unwrap();
                if d.status != 0 {
                    self.errors.push(*d);
                } else if op == Op::Write {
                    self.acked[b] = v;
                }
            }
        }
    }

    /// Reads every block back through `c`: each must hold its last acknowledged version.
    fn verify_all(&mut self, c: &mut BlkPaths) {
        self.drain(c);
        for b in 0..BLOCKS {
            self.bufs.block(b).fill(0xee);
        }
        let reqs: Vec<Req> = (0..BLOCKS)
            .map(|b| Req {
                op: Op::Read,
                offset: (b * BS) as u64,
                len: BS as u32,
                buf: self.bufs.ptr(b),
                cookie: b as u64,
            })
            .collect();
        // SAFETY: as in `run`.
        assert_eq!(unsafe { c.submit(&reqs) }.unwrap(), BLOCKS);
        let mut out = Vec::new();
        let end = Instant::now() + T;
        while out.len() < BLOCKS {
            assert!(
                Instant::now() < end,
                "read-back did not complete within {T:?}"
            );
            c.poll(&mut out, 1, 64, Duration::from_millis(50)).unwrap();
        }
        for d in &out {
            assert_eq!(d.status, 0, "read-back of block {}", d.cookie);
            let b = d.cookie as usize;
            assert!(
                holds(self.bufs.block(b), b, self.acked[b]),
                "block {b} does not hold its last acknowledged write (version {})",
                self.acked[b]
            );
        }
    }
}

fn addrs(ts: &[&Target]) -> Vec<String> {
    ts.iter().map(|t| t.addr().to_string()).collect()
}

#[test]
fn standby_a_stopped_target_costs_no_error_and_loses_no_write() {
    let v = Vol::new("standby");
    let t0 = target(&v, "127.0.0.1:0");
    let t1 = target(&v, "127.0.0.1:0");
    let mut c = BlkPaths::open(&cfg(&[]), &addrs(&[&t0, &t1]), "f0", Mode::Rpc, T).unwrap();
    assert_eq!(c.policy(), PathPolicy::Standby);
    assert_eq!(c.info().size, 8 << 20);
    assert_eq!(c.path_count(), 2);
    let mut load = Load::new();
    load.run(&mut c, 300, 16, |_, _| {});
    // Standby: everything went to the first path.
    assert!(c.path_status(0).unwrap().active);
    assert_eq!(c.path_status(1).unwrap().counters.issued, 0);
    // Stop the first target with IO in flight.
    let mut t0 = Some(t0);
    load.run(&mut c, 600, 16, |n, _| {
        if n >= 10 && t0.is_some() {
            drop(t0.take());
        }
    });
    load.verify_all(&mut c);
    assert!(load.errors.is_empty(), "IO errors: {:?}", load.errors);
    assert_eq!(load.bad_reads, 0);
    let p0 = c.path_status(0).unwrap();
    let p1 = c.path_status(1).unwrap();
    assert!(p0.counters.failures >= 1, "{p0:?}");
    assert_ne!(p0.state, PathState::Up, "{p0:?}");
    assert!(p1.active && p1.counters.issued > 0, "{p1:?}");
    assert_eq!(p1.counters.reissued, c.failover_counters().reissued);
    let ev = c.take_events();
    assert!(
        ev.iter()
            .any(|e| e.path == 0 && matches!(e.kind, PathEventKind::Down(_))),
        "{ev:?}"
    );
    assert!(
        ev.iter()
            .any(|e| e.path == 1 && e.kind == PathEventKind::Active),
        "{ev:?}"
    );
    assert_eq!(c.failover_counters().io_timeouts, 0);
}

/// A target bound again on the address it had (its port freed when it stopped).
fn restart(v: &Vol, addr: &str) -> Target {
    let end = Instant::now() + T;
    loop {
        match Target::start(&cfg(&[]), addr, &[v.spec()]) {
            Ok(t) => return t,
            Err(e) => {
                assert!(Instant::now() < end, "cannot listen on {addr} again: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

#[test]
fn a_path_rejoins_and_takes_the_io_back() {
    let v = Vol::new("rejoin");
    let t0 = target(&v, "127.0.0.1:0");
    let t1 = target(&v, "127.0.0.1:0");
    let a0 = t0.addr().to_string();
    let c0 = cfg(&[("blk_path_retry_max_ms", "100")]);
    let mut c = BlkPaths::open(&c0, &addrs(&[&t0, &t1]), "f0", Mode::Rpc, T).unwrap();
    let mut load = Load::new();
    load.run(&mut c, 100, 8, |_, _| {});
    drop(t0);
    load.run(&mut c, 200, 8, |_, _| {});
    assert!(c.path_status(1).unwrap().active);
    let _t0 = restart(&v, &a0);
    // The path reconnects within its backoff (at most 100 ms here) and, with failback,
    // new IO goes back to it.
    let end = Instant::now() + T;
    let before = c.path_status(0).unwrap().counters.issued;
    while c.path_status(0).unwrap().counters.issued == before {
        assert!(
            Instant::now() < end,
            "path 0 did not rejoin: {:?}",
            c.path_status(0)
        );
        load.run(&mut c, 8, 8, |_, _| {});
    }
    let p0 = c.path_status(0).unwrap();
    assert_eq!(p0.state, PathState::Up);
    assert!(p0.active && p0.counters.rejoins == 1, "{p0:?}");
    load.verify_all(&mut c);
    assert!(load.errors.is_empty(), "IO errors: {:?}", load.errors);
    assert_eq!(load.bad_reads, 0);
}

#[test]
fn active_active_spreads_io_and_survives_a_stop() {
    let v = Vol::new("active");
    let t0 = target(&v, "127.0.0.1:0");
    let t1 = target(&v, "127.0.0.1:0");
    let c0 = cfg(&[("blk_path_policy", "active")]);
    let mut c = BlkPaths::open(&c0, &addrs(&[&t0, &t1]), "f0", Mode::Rpc, T).unwrap();
    assert_eq!(c.policy(), PathPolicy::Active);
    let mut load = Load::new();
    load.run(&mut c, 400, 16, |_, _| {});
    let (i0, i1) = (
        c.path_status(0).unwrap().counters.issued,
        c.path_status(1).unwrap().counters.issued,
    );
    assert!(i0 > 0 && i1 > 0, "both paths carry IO: {i0} and {i1}");
    let mut t1 = Some(t1);
    load.run(&mut c, 400, 16, |n, _| {
        if n >= 10 && t1.is_some() {
            drop(t1.take());
        }
    });
    load.verify_all(&mut c);
    assert!(load.errors.is_empty(), "IO errors: {:?}", load.errors);
    assert_eq!(load.bad_reads, 0);
    assert!(c.path_status(1).unwrap().counters.failures >= 1);
    drop(t0);
}

#[test]
fn with_no_path_left_an_io_fails_after_io_fail_timeout() {
    let v = Vol::new("timeout");
    let t0 = target(&v, "127.0.0.1:0");
    let c0 = cfg(&[("io_fail_timeout_ms", "1500")]);
    let mut c = BlkPaths::open(&c0, &addrs(&[&t0]), "f0", Mode::Rpc, T).unwrap();
    let mut load = Load::new();
    load.run(&mut c, 20, 4, |_, _| {});
    load.drain(&mut c);
    drop(t0);
    let mut buf = vec![0u8; BS];
    let req = Req {
        op: Op::Read,
        offset: 0,
        len: BS as u32,
        buf: buf.as_mut_ptr(),
        cookie: 77,
    };
    // SAFETY: `buf` outlives the request (waited for below).
    assert_eq!(unsafe { c.submit(&[req]) }.unwrap(), 1);
    let mut out = Vec::new();
    // Not failed at once: it waits for a path.
    c.poll(&mut out, 0, 1, Duration::ZERO).unwrap();
    assert!(out.is_empty(), "failed before io_fail_timeout: {out:?}");
    let end = Instant::now() + T;
    while out.is_empty() {
        assert!(Instant::now() < end, "no error within {T:?}");
        c.poll(&mut out, 1, 1, Duration::from_millis(100)).unwrap();
    }
    assert_eq!(out[0].cookie, 77);
    assert_eq!(out[0].status, -libc::EIO);
    assert_eq!(c.failover_counters().io_timeouts, 1);
    assert_eq!(c.inflight(), 0);
}

#[test]
fn bad_opens_are_refused_clearly() {
    let v = Vol::new("bad");
    let t0 = target(&v, "127.0.0.1:0");
    let a0 = t0.addr().to_string();
    let c0 = cfg(&[]);
    let none: [&str; 0] = [];
    let e = BlkPaths::open(&c0, &none, "f0", Mode::Rpc, T).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = BlkPaths::open(&c0, &[a0.as_str(), "nonsense"], "f0", Mode::Rpc, T).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("nonsense"), "{e}");
    let e = BlkPaths::open(&c0, &[a0.as_str()], "f0", Mode::Read, T).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    let e = BlkPaths::open(&c0, &[a0.as_str()], "nope", Mode::Rpc, T).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    // A path that is down at open does not stop the others; it is retried.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut c = BlkPaths::open(&c0, &[dead.as_str(), a0.as_str()], "f0", Mode::Rpc, T).unwrap();
    assert_ne!(c.path_status(0).unwrap().state, PathState::Up);
    assert!(c.path_status(1).unwrap().active);
    let mut load = Load::new();
    load.run(&mut c, 50, 4, |_, _| {});
    load.verify_all(&mut c);
    assert!(load.errors.is_empty());
    // No path at all.
    let e = BlkPaths::open(
        &c0,
        &[dead.as_str()],
        "f0",
        Mode::Rpc,
        Duration::from_secs(2),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no path opened it"), "{e}");
}

/// The write-ordering rule through the client: overlapping writes submitted together go out
/// one after the other (the second held until the first completed), so the last one
/// submitted is what the volume holds, and the count of held writes says so.
#[test]
fn overlapping_writes_are_held_and_land_in_submission_order() {
    let v = Vol::new("order");
    let t0 = target(&v, "127.0.0.1:0");
    let t1 = target(&v, "127.0.0.1:0");
    // Active/active: the writes could go to either path; the rule holds across paths.
    let c0 = cfg(&[("blk_path_policy", "active")]);
    let mut c = BlkPaths::open(&c0, &addrs(&[&t0, &t1]), "f0", Mode::Rpc, T).unwrap();
    let mut bufs = Bufs::new();
    // Blocks 0..4 carry versions 1..4 of block 0's content; each write covers block 0 (the
    // last two 8 KiB, covering blocks 0 and 1 of the volume).
    for k in 0..4 {
        fill(bufs.block(k), 0, k as u64 + 1);
    }
    let mut reqs = Vec::new();
    for k in 0..4usize {
        reqs.push(Req {
            op: Op::Write,
            offset: 0,
            len: if k < 2 { BS as u32 } else { 2 * BS as u32 },
            buf: bufs.ptr(k),
            cookie: k as u64,
        });
    }
    // 8 KiB writes read two blocks of the buffer: blocks k and k + 1 (k = 2: 2, 3; k = 3:
    // 3, 4).
    // SAFETY: `bufs` outlives the requests (waited for below).
    assert_eq!(unsafe { c.submit(&reqs) }.unwrap(), 4);
    let mut out = Vec::new();
    let end = Instant::now() + T;
    while out.len() < 4 {
        assert!(Instant::now() < end, "writes did not complete within {T:?}");
        c.poll(&mut out, 1, 4, Duration::from_millis(50)).unwrap();
    }
    assert!(out.iter().all(|d| d.status == 0), "{out:?}");
    // Completions come back in submission order: each waited for the one before.
    let order: Vec<u64> = out.iter().map(|d| d.cookie).collect();
    assert_eq!(order, vec![0, 1, 2, 3]);
    assert_eq!(c.failover_counters().held_writes, 3);
    // The volume's block 0 holds the last write's first block (version 4 of block 0).
    let r = Req {
        op: Op::Read,
        offset: 0,
        len: BS as u32,
        buf: bufs.ptr(10),
        cookie: 9,
    };
    // SAFETY: as above.
    assert_eq!(unsafe { c.submit(&[r]) }.unwrap(), 1);
    out.clear();
    while out.is_empty() {
        assert!(Instant::now() < end, "read did not complete within {T:?}");
        c.poll(&mut out, 1, 1, Duration::from_millis(50)).unwrap();
    }
    assert_eq!(out[0].status, 0);
    assert!(
        holds(bufs.block(10), 0, 4),
        "block 0 does not hold the last write"
    );
    drop((t0, t1));
}

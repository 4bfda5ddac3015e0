//! Acknowledged writes are never lost or resurrected (issue 30 point 4; `fio/failover.sh`
//! runs it): writes 4 KiB blocks that carry a sequence number through the multipath block
//! client while the harness kills or black-holes a path, logs every acknowledgement, and
//! later (after a killed target restarted on the same file) reads every block back through
//! the paths that answer and checks each against the log.
//!
//! ```text
//! blk_seqcheck write PATHS VOLUME BLOCKS SECS LOG [KEY=VALUE ...]
//! blk_seqcheck check PATHS VOLUME BLOCKS LOG [KEY=VALUE ...]
//! ```
//! PATHS: ADDR:PORT,ADDR:PORT. `write` keeps 16 writes in flight (one per block at a time)
//! on random blocks among the first BLOCKS for SECS seconds and appends to LOG one line per
//! completion: `A BLOCK SEQ` (acknowledged) or `E BLOCK SEQ` (failed: in doubt). `check`
//! reads the blocks and prints `lost=N resurrected=N checked=N`: a block must hold its last
//! acknowledged write, or a newer one that failed (in doubt); holding an older acknowledged
//! write is a resurrection, anything else (older never-acknowledged data, zeros, garbage)
//! a loss. Exit status 1 if either is nonzero or an IO failed, 2 for usage errors.

use rdmx::blk::{BlkPaths, Mode, Op, Req};
use rdmx::config::Config;
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

const BS: usize = 4096;
const QD: usize = 16;
const MAGIC: &[u8; 8] = b"RDMXSEQ1";

/// Block `b` written with sequence number `seq`.
fn fill(buf: &mut [u8], b: u64, seq: u64) {
    buf[..8].copy_from_slice(MAGIC);
    buf[8..16].copy_from_slice(&b.to_le_bytes());
    buf[16..24].copy_from_slice(&seq.to_le_bytes());
    let mut x = seq ^ (b << 32) ^ 0x9e37_79b9_7f4a_7c15;
    for chunk in buf[24..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = chunk.len();
        chunk.copy_from_slice(&x.to_le_bytes()[..n]);
    }
}

/// The sequence number block `b` holds: Some(0) for zeros (never written), None for
/// anything that is not a whole block written by `fill` for `b`.
fn parse(buf: &[u8], b: u64) -> Option<u64> {
    if buf.iter().all(|&x| x == 0) {
        return Some(0);
    }
    let seq = u64::from_le_bytes(buf[16..24].try_into().ok()?);
    let mut want = vec![0u8; BS];
    fill(&mut want, b, seq);
    (buf == want.as_slice()).then_some(seq)
}

fn config(sets: &[String]) -> Result<Config, String> {
    let mut c = Config::from_env().map_err(|e| e.to_string())?;
    for kv in sets {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("'{kv}' is not KEY=VALUE"))?;
        c.set(k, v).map_err(|e| e.to_string())?;
    }
    Ok(c)
}

fn open(paths: &str, volume: &str, sets: &[String]) -> Result<BlkPaths, String> {
    let list: Vec<&str> = paths.split(',').filter(|s| !s.is_empty()).collect();
    BlkPaths::open(
        &config(sets)?,
        &list,
        volume,
        Mode::Rpc,
        Duration::from_secs(10),
    )
    .map_err(|e| format!("open {volume} over {paths}: {e}"))
}

fn aligned(blocks: usize) -> Vec<u8> {
    // Over-allocate and use a page-aligned window (O_DIRECT targets need no alignment
    // from the client; page alignment registers fewer pages).
    vec![0u8; (blocks + 1) * BS]
}

fn window(v: &mut [u8]) -> &mut [u8] {
    let off = v.as_ptr().align_offset(BS);
    let n = v.len() - BS;
    &mut v[off..off + n]
}

fn print_paths(c: &BlkPaths) {
    let k = c.failover_counters();
    println!(
        "reissued={} held_writes={} io_timeouts={}",
        k.reissued, k.held_writes, k.io_timeouts
    );
    for i in 0..c.path_count() {
        if let Some(p) = c.path_status(i) {
            println!(
                "path {i} {} {:?} issued={} reissued={} failures={} rejoins={} detect_ms={}",
                p.addr,
                p.state,
                p.counters.issued,
                p.counters.reissued,
                p.counters.failures,
                p.counters.rejoins,
                p.last_detect.map_or(-1.0, |d| d.as_secs_f64() * 1e3)
            );
        }
    }
}

fn write(
    paths: &str,
    volume: &str,
    blocks: u64,
    secs: u64,
    log: &str,
    sets: &[String],
) -> Result<bool, String> {
    // The buffers are declared before the client: dropped after it (its connections closed
    // first) on every return.
    let mut mem = aligned(QD);
    let mut c = open(paths, volume, sets)?;
    let mut out = std::io::BufWriter::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{log}: {e}"))?,
    );
    let bufs = window(&mut mem);
    let base = bufs.as_mut_ptr();
    // slot -> (block, seq) in flight
    let mut slots: Vec<Option<(u64, u64)>> = vec![None; QD];
    let mut busy: HashSet<u64> = HashSet::new();
    let mut seq = {
        // Sequence numbers keep growing across runs on one LOG.
        let f = std::fs::File::open(log).map_err(|e| e.to_string())?;
        std::io::BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok())
            .max()
            .unwrap_or(0)
    };
    let mut rng = 0x2545_f491_4f6c_dd1d_u64 ^ seq;
    let end = Instant::now() + Duration::from_secs(secs);
    let hard_end = end + Duration::from_secs(120);
    let (mut acked, mut failed) = (0u64, 0u64);
    let mut done = Vec::new();
    loop {
        let now = Instant::now();
        assert!(
            now < hard_end,
            "IO did not drain within 120 s after the run"
        );
        if now < end {
            let mut reqs = Vec::new();
            for (i, s) in slots.iter_mut().enumerate() {
                if s.is_some() {
                    continue;
                }
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let b = rng % blocks;
                // One write per block at a time (the workload's own rule: every read-back
                // then has one right answer).
                if !busy.insert(b) {
                    continue;
                }
                seq += 1;
                // SAFETY: slot `i` of the window, not in flight.
                let buf = unsafe { std::slice::from_raw_parts_mut(base.add(i * BS), BS) };
                fill(buf, b, seq);
                *s = Some((b, seq));
                reqs.push(Req {
                    op: Op::Write,
                    offset: b * BS as u64,
                    len: BS as u32,
                    buf: buf.as_mut_ptr(),
                    cookie: i as u64,
                });
            }
            if !reqs.is_empty() {
                // SAFETY: the window outlives the client's IO (drained below).
                let k = unsafe { c.submit(&reqs) }.map_err(|e| e.to_string())?;
                for r in &reqs[k..] {
                    slots[r.cookie as usize] = None;
                    busy.remove(&(r.offset / BS as u64));
                }
            }
        } else if slots.iter().all(Option::is_none) {
            break;
        }
        done.clear();
        c.poll(&mut done, 1, QD, Duration::from_millis(20))
            .map_err(|e| e.to_string())?;
        for d in &done {
            let (b, s) = slots[d.cookie as usize].take().expect("a slot in flight");
            busy.remove(&b);
            if d.status == 0 {
                acked += 1;
                writeln!(out, "A {b} {s}").map_err(|e| e.to_string())?;
            } else {
                failed += 1;
                writeln!(out, "E {b} {s}").map_err(|e| e.to_string())?;
            }
        }
    }
    out.flush().map_err(|e| e.to_string())?;
    println!("writes acked={acked} failed={failed}");
    print_paths(&c);
    for e in c.take_events() {
        println!("event path {} {:?}", e.path, e.kind);
    }
    Ok(failed == 0)
}

fn check(
    paths: &str,
    volume: &str,
    blocks: u64,
    log: &str,
    sets: &[String],
) -> Result<bool, String> {
    // The log: per block, the last acknowledged seq, every acknowledged seq, failed seqs.
    let f = std::fs::File::open(log).map_err(|e| format!("{log}: {e}"))?;
    let mut last: HashMap<u64, u64> = HashMap::new();
    let mut acked: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut doubt: HashMap<u64, Vec<u64>> = HashMap::new();
    for line in std::io::BufReader::new(f).lines() {
        let line = line.map_err(|e| e.to_string())?;
        let mut w = line.split_whitespace();
        let (Some(kind), Some(b), Some(s)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        let (b, s): (u64, u64) = (
            b.parse().map_err(|_| line.clone())?,
            s.parse().map_err(|_| line.clone())?,
        );
        match kind {
            "A" => {
                let l = last.entry(b).or_insert(0);
                *l = (*l).max(s);
                acked.entry(b).or_default().push(s);
            }
            "E" => doubt.entry(b).or_default().push(s),
            _ => return Err(format!("bad log line '{line}'")),
        }
    }
    let mut mem = aligned(QD);
    let mut c = open(paths, volume, sets)?;
    let bufs = window(&mut mem);
    let base = bufs.as_mut_ptr();
    let (mut lost, mut resurrected, mut checked, mut errors) = (0u64, 0u64, 0u64, 0u64);
    let mut next = 0u64;
    let mut inflight = 0usize;
    let mut free: Vec<usize> = (0..QD).collect();
    let mut slot_block = [0u64; QD];
    let end = Instant::now() + Duration::from_secs(300);
    let mut done = Vec::new();
    while checked + errors < blocks {
        if Instant::now() > end {
            return Err("read-back did not finish within 300 s".into());
        }
        while next < blocks && inflight < QD {
            let i = free.pop().expect("a free slot");
            slot_block[i] = next;
            let r = Req {
                op: Op::Read,
                offset: next * BS as u64,
                len: BS as u32,
                // SAFETY: slot `i` of the window.
                buf: unsafe { base.add(i * BS) },
                cookie: i as u64,
            };
            // SAFETY: the window outlives the IO (drained by this loop).
            if unsafe { c.submit(&[r]) }.map_err(|e| e.to_string())? == 0 {
                free.push(i);
                break;
            }
            next += 1;
            inflight += 1;
        }
        done.clear();
        c.poll(&mut done, 1, QD, Duration::from_millis(50))
            .map_err(|e| e.to_string())?;
        for d in &done {
            let i = d.cookie as usize;
            let b = slot_block[i];
            inflight -= 1;
            free.push(i);
            if d.status != 0 {
                errors += 1;
                eprintln!("read of block {b} failed: {}", d.status);
                continue;
            }
            checked += 1;
            // SAFETY: slot `i`, its read completed.
            let buf = unsafe { std::slice::from_raw_parts(base.add(i * BS), BS) };
            let held = parse(buf, b);
            let want = last.get(&b).copied().unwrap_or(0);
            let newer_in_doubt = |s: u64| s > want && doubt.get(&b).is_some_and(|v| v.contains(&s));
            match held {
                Some(s) if s == want || newer_in_doubt(s) => {}
                Some(s) if s < want && acked.get(&b).is_some_and(|v| v.contains(&s)) => {
                    resurrected += 1;
                    eprintln!("block {b}: holds acknowledged seq {s}, last acknowledged {want}");
                }
                other => {
                    lost += 1;
                    eprintln!("block {b}: holds {other:?}, last acknowledged {want}");
                }
            }
        }
    }
    println!("lost={lost} resurrected={resurrected} checked={checked} read_errors={errors}");
    print_paths(&c);
    Ok(lost == 0 && resurrected == 0 && errors == 0)
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: blk_seqcheck write PATHS VOLUME BLOCKS SECS LOG [KEY=VALUE ...]\n       \
                 blk_seqcheck check PATHS VOLUME BLOCKS LOG [KEY=VALUE ...]";
    let num = |s: &String| s.parse::<u64>().ok().filter(|&n| n > 0);
    let r = match a.first().map(String::as_str) {
        Some("write") if a.len() >= 6 => match (num(&a[3]), num(&a[4])) {
            (Some(b), Some(s)) => write(&a[1], &a[2], b, s, &a[5], &a[6..]),
            _ => Err(format!("BLOCKS and SECS must be positive numbers\n{usage}")),
        },
        Some("check") if a.len() >= 5 => match num(&a[3]) {
            Some(b) => check(&a[1], &a[2], b, &a[4], &a[5..]),
            None => Err(format!("BLOCKS must be a positive number\n{usage}")),
        },
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    match r {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("blk_seqcheck: {e}");
            std::process::exit(2);
        }
    }
}

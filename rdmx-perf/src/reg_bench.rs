//! `rdmx-perf reg_bench [--seconds S] [--json]`: what a 4K buffer's registration costs three
//! ways, in one run on the soft provider (registration pins pages there, as on a NIC):
//! per-IO register + deregister, pooled chunk get + put, and a registration-cache hit
//! (get + put of a buffer the cache holds). Targets: pooled >= 10x cheaper than per-IO
//! registration (the seed reports -83%, about 6x), cache hit >= 5x cheaper, pool metadata
//! <= 1% of pooled bytes.

use rdmx::config::Config;
use rdmx::msgr::Context;
use rdmx::rc::verbs::access;
use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::cli;
use crate::perf::{Fail, Report, exit_status};

pub const USAGE: &str = "usage: rdmx-perf reg_bench [--seconds S (1)] [--json]";

/// `rdmx-perf reg_bench --help`.
pub const HELP: &str = "\
What a 4K buffer's registration costs three ways on the soft provider (which pins pages,
as a NIC does): per-IO register + deregister, a pooled chunk's get + put, and a
registration-cache hit. Targets: pooled >= 10x and cache hit >= 5x cheaper than per-IO
registration, pool metadata <= 1% of pooled bytes (a missed target is reported, not an
error).

options:
  --seconds S  time per measurement, in (0, 60] (default 1)
  --json       stdout is one JSON object only; the table goes to stderr

exit status: 0 measured, 1 the run failed, 2 usage error.";

const SIZE: usize = 4096;

/// Runs `op` in batches until `dur` passed; returns ns per op.
fn time_per_op(dur: Duration, mut op: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < dur && n < 50_000_000 {
        for _ in 0..64 {
            op()?;
        }
        n += 64;
    }
    Ok(start.elapsed().as_nanos() as f64 / n as f64)
}

/// `(seconds, json)`.
fn parse(args: &[String]) -> Result<(f64, bool), String> {
    let a: Args = cli::parse(args, USAGE)?;
    Ok((a.seconds, a.json))
}

/// `reg_bench`'s options.
#[derive(Debug, clap::Parser)]
struct Args {
    #[arg(long, value_parser = seconds, default_value = "1", allow_hyphen_values = true)]
    seconds: f64,
    #[arg(long)]
    json: bool,
}

fn seconds(v: &str) -> Result<f64, String> {
    v.parse()
        .ok()
        .filter(|s: &f64| *s > 0.0 && *s <= 60.0)
        .ok_or_else(|| format!("needs a number in (0, 60], got '{v}'"))
}

/// The three costs, measured in one run (`rdmx-perf tune` uses them too).
#[derive(Debug, Clone)]
pub struct RegFigures {
    pub provider: String,
    pub backing: String,
    /// ns per register + deregister of a 4K buffer.
    pub per_io_ns: f64,
    /// ns per pooled chunk get + put.
    pub pooled_ns: f64,
    /// ns per registration-cache hit (get + put).
    pub hit_ns: f64,
    pub metadata_pct: f64,
}

/// Measures each cost for `secs` seconds, on `provider` (None: the environment's).
pub fn measure(secs: f64, provider: Option<&str>) -> Result<RegFigures, String> {
    let mut cfg = Config::from_env().map_err(|e| e.to_string())?;
    cfg.set("soft_port", "0").map_err(|e| e.to_string())?;
    if let Some(p) = provider {
        cfg.set("provider", p)
            .map_err(|e| format!("provider {p}: {e}"))?;
    }
    let ctx = Context::new(&cfg).map_err(|e| format!("context: {e}"))?;
    let dur = Duration::from_secs_f64(secs);

    // 1. Per-IO registration of a page-aligned 4K buffer.
    let mut buf = vec![0u8; 2 * SIZE];
    let off = buf.as_ptr().align_offset(SIZE);
    // SAFETY: `off + SIZE <= 2 * SIZE`: inside `buf`, which outlives every registration.
    let p = unsafe { buf.as_mut_ptr().add(off) };
    let per_io = time_per_op(dur, || {
        // SAFETY: `p` points at SIZE live bytes; deregistered right after.
        let m = unsafe { ctx.register(p, SIZE, access::LOCAL_WRITE) }.map_err(|e| e.to_string())?;
        ctx.deregister(black_box(m.lkey)).map_err(|e| e.to_string())
    })?;

    // 2. Pooled chunk get + put.
    let pool = ctx
        .pool(SIZE, 1024, access::LOCAL_WRITE)
        .map_err(|e| format!("pool: {e}"))?;
    let pooled = time_per_op(dur, || {
        let c = pool.get().map_err(|e| e.to_string())?;
        pool.put(black_box(c)).map_err(|e| e.to_string())
    })?;
    let ps = pool.stats();
    let metadata_pct =
        100.0 * ps.metadata_bytes as f64 / (ps.chunks_total as f64 * ps.chunk_size as f64);

    // 3. Registration-cache hit on a buffer the cache already holds.
    let rc = ctx.rcache();
    // SAFETY: as in 1.; invalidated before `buf` goes away.
    let warm = unsafe { rc.get(p, SIZE, access::LOCAL_WRITE) }.map_err(|e| e.to_string())?;
    let hit = time_per_op(dur, || {
        // SAFETY: as above.
        let h = unsafe { rc.get(p, SIZE, access::LOCAL_WRITE) }.map_err(|e| e.to_string())?;
        rc.put(black_box(h)).map_err(|e| e.to_string())
    })?;
    rc.put(warm).map_err(|e| e.to_string())?;
    rc.invalidate(p, SIZE);

    drop(buf);
    Ok(RegFigures {
        provider: ctx.provider().to_string(),
        backing: ps.backing.as_str().to_string(),
        per_io_ns: per_io,
        pooled_ns: pooled,
        hit_ns: hit,
        metadata_pct,
    })
}

fn run(secs: f64, json: bool) -> Result<(), String> {
    let f = measure(secs, None)?;
    let (per_io, pooled, hit, metadata_pct) = (f.per_io_ns, f.pooled_ns, f.hit_ns, f.metadata_pct);
    let pool_x = per_io / pooled;
    let hit_x = per_io / hit;
    let mut r = Report::new("reg_bench");
    r.str("provider", f.provider);
    r.str("backing", f.backing);
    r.int("size", SIZE as u64);
    r.num("per_io_reg_ns", per_io, 1);
    r.num("pool_get_put_ns", pooled, 1);
    r.num("cache_hit_ns", hit, 1);
    r.num("pool_speedup", pool_x, 1);
    r.num("cache_speedup", hit_x, 1);
    r.num("pool_metadata_pct", metadata_pct, 3);
    r.print(json);
    let targets = format!(
        "  targets: pooled >= 10x ({}), cache hit >= 5x ({}), metadata <= 1% ({})",
        verdict(pool_x >= 10.0),
        verdict(hit_x >= 5.0),
        verdict(metadata_pct <= 1.0)
    );
    if json {
        eprintln!("{targets}");
    } else {
        println!("{targets}");
    }
    Ok(())
}

fn verdict(ok: bool) -> &'static str {
    if ok { "PASS" } else { "BELOW" }
}

/// Exit 0 when the run completed (a missed target is reported, not an error), 1 when it
/// failed, 2 on a usage error.
pub fn main(args: &[String]) -> ExitCode {
    let r = parse(args)
        .map_err(Fail::Usage)
        .and_then(|(secs, json)| run(secs, json).map_err(Fail::Run));
    exit_status(r, "rdmx-perf: reg_bench")
}

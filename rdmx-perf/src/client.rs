//! The client tests: `read_bw write_bw send_bw read_lat send_lat`.
//!
//! * READ: `qd` READs of `size` bytes at random offsets of the server's region (4K-aligned
//!   when `size` is a multiple of 4K, else 64-aligned) into per-slot local buffers; every
//!   landed block is compared with the server's pattern (its first and last bytes are
//!   poisoned before each post, so a READ that lands nothing is caught too).
//! * WRITE: the same offsets; the source is a local copy of the server's pattern at the same
//!   offset, so writes keep the region's content intact for READ clients.
//! * SEND (send_bw): `qd` SENDs of `size` bytes; the server reposts its receives.
//! * send_lat: one SEND whose first byte is a ping; the server answers with a SEND of the
//!   same size; latency is the round trip (post to the answer's receive completion).
//!
//! Latency per op is post-to-completion (for the bandwidth tests too). Any non-success
//! completion or verification mismatch counts in `errors`, stops the run (it drains what is
//! outstanding) and makes the exit status 1; a bad command line or configuration exits 2.

use rdmx::Config;
use rdmx::config::Settings;
use rdmx::msgr::{Connection, Context};
use rdmx::provider::SendReq;
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{Sge, WcOpcode, WcStatus, WrOpcode, smallvec};
use std::process::ExitCode;
use std::time::Duration;

use crate::cli;
use crate::perf::{
    Clock, Fail, Histogram, MAX_SEND, PING, PONG, READY_IMM, READY_TIMEOUT, Report, Rng, Waiter,
    build_config, check_pattern, fill_pattern, pattern_byte,
};
use crate::server::empty_wc;
use crate::tune::stats::{self as server_stats, ServerStats};

pub const USAGE: &str = "usage: rdmx-perf {read_bw|write_bw|send_bw|read_lat|send_lat} --connect ADDR:PORT \
     [--size BYTES (4096)] [--qd N (bw: 32, lat: 1)] [--duration SECONDS (5)] [--batch N (config post_batch, 32)] \
     [--verify N (bw: 16, lat: 1)] [--idle-conns N (0)] [--set KEY=VALUE]... [--profile NAME] [--json]";

/// `rdmx-perf TEST --help`.
pub const HELP: &str = "\
Runs one test against `rdmx-perf server` for --duration seconds and prints its figures:
  read_bw   RDMA READs of --size bytes at random offsets of the server's 64 MiB region,
            --qd in flight; landed blocks are checked against the server's pattern
  write_bw  RDMA WRITEs of --size bytes at random offsets (the same pattern, written back)
  send_bw   SENDs of --size bytes (at most 4 MiB), --qd in flight
  read_lat  one READ at a time (qd 1)
  send_lat  one SEND at a time, answered by the server with a SEND of the same size

options:
  --connect ADDR:PORT  the server's address (required)
  --size BYTES         bytes per operation; K/M/G suffixes are binary (default 4096)
  --qd N               operations in flight, bandwidth tests (default 32; latency tests: 1);
                       over 256 also raises max_send_wr to N unless it is set
  --duration SECONDS   how long to run, in (0, 3600] (default 5)
  --batch N            work requests per post call (default: the config's post_batch, 32;
                       at most --qd)
  --verify N           check every Nth READ's content (default: bandwidth 16, latency 1)
  --idle-conns N       before the run, open N more connections to the server on the same
                       context and keep them open, unused, until it ends (default 0; for
                       the cost of idle connections: bench/scale.sh)
  --set KEY=VALUE      a configuration knob (`rdmx-perf config` lists them); repeatable
  --profile NAME       a configuration profile (e.g. ceph-after)
  --json               stdout is one JSON object only; the table goes to stderr

output: ops_per_sec; bw_gbit_per_sec (10^9 bits/s, perftest's Gb/sec) and bw_mib_per_sec
(2^20 bytes/s, perftest's MB/sec); latency percentiles in us (lat_*_us); transport counters.
exit status: 0 the run completed without errors, 1 the run failed (setup, connection,
completion errors, mismatches), 2 usage or configuration error.";

/// How long to wait for the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long outstanding ops may take to complete after the duration ended.
const DRAIN_TIMEOUT: u64 = 5_000_000_000;
/// Largest local buffer the tool allocates.
const MAX_LOCAL: usize = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Test {
    ReadBw,
    WriteBw,
    SendBw,
    ReadLat,
    SendLat,
}

impl Test {
    fn parse(s: &str) -> Option<Test> {
        Some(match s {
            "read_bw" => Test::ReadBw,
            "write_bw" => Test::WriteBw,
            "send_bw" => Test::SendBw,
            "read_lat" => Test::ReadLat,
            "send_lat" => Test::SendLat,
            _ => return None,
        })
    }
    fn name(self) -> &'static str {
        match self {
            Test::ReadBw => "read_bw",
            Test::WriteBw => "write_bw",
            Test::SendBw => "send_bw",
            Test::ReadLat => "read_lat",
            Test::SendLat => "send_lat",
        }
    }
    fn is_lat(self) -> bool {
        matches!(self, Test::ReadLat | Test::SendLat)
    }
    fn opcode(self) -> WrOpcode {
        match self {
            Test::ReadBw | Test::ReadLat => WrOpcode::RdmaRead,
            Test::WriteBw => WrOpcode::RdmaWrite,
            Test::SendBw | Test::SendLat => WrOpcode::Send,
        }
    }
}

#[derive(Debug, Clone)]
struct Args {
    test: Test,
    connect: String,
    size: usize,
    qd: usize,
    duration: f64,
    /// WRs per post call; None = the config's `post_batch` (the seed: 32 per call beat 16).
    batch: Option<usize>,
    /// Check every Nth READ's content against the server's pattern (1 = every READ).
    verify: u64,
    json: bool,
    profile: Option<String>,
    sets: Vec<(String, String)>,
    /// Extra connections opened before the run and left unused (`--idle-conns`).
    idle_conns: usize,
    /// `rdmx-perf tune`: beside the bulk ops, one SEND ping at a time on the same
    /// connection, its round trips in their own histogram (a latency stream beside a bulk
    /// one).
    lat_stream: bool,
    /// `rdmx-perf tune`: ask the server for its CPU time, stalls and counters before and
    /// after the run (over this connection, see `tune/stats.rs`).
    server_stats: bool,
}

impl Args {
    /// WRs per post call (resolved from the config in `run`).
    fn batch(&self) -> usize {
        self.batch.unwrap_or(1)
    }
}

/// The options of a client test, as given (defaults that depend on the test are applied
/// in [`parse`]).
#[derive(Debug, clap::Parser)]
struct Cli {
    #[arg(long, value_name = "ADDR:PORT", allow_hyphen_values = true)]
    connect: String,
    #[arg(long, value_parser = cli::size, default_value = "4096", allow_hyphen_values = true)]
    size: usize,
    #[arg(long, value_parser = cli::number, allow_hyphen_values = true)]
    qd: Option<usize>,
    #[arg(long, value_parser = cli::duration, default_value = "5", allow_hyphen_values = true)]
    duration: f64,
    #[arg(long, value_parser = cli::number, allow_hyphen_values = true)]
    batch: Option<usize>,
    #[arg(long, value_parser = cli::number, allow_hyphen_values = true)]
    verify: Option<usize>,
    #[arg(long, value_parser = cli::number, default_value = "0", allow_hyphen_values = true)]
    idle_conns: usize,
    #[arg(long)]
    json: bool,
    #[arg(long, allow_hyphen_values = true)]
    profile: Option<String>,
    #[arg(long, value_parser = cli::set, allow_hyphen_values = true)]
    set: Vec<(String, String)>,
}

fn parse(test: Test, args: &[String]) -> Result<Args, String> {
    let Cli {
        connect,
        size,
        qd,
        duration,
        batch,
        verify,
        idle_conns,
        json,
        profile,
        set: sets,
    } = cli::parse(args, USAGE)?;
    let qd = if test.is_lat() { 1 } else { qd.unwrap_or(32) };
    // Checking the pattern costs about as much as the copy itself; a bandwidth run
    // samples (a wrong byte anywhere still shows within 16 READs), latency runs check all.
    let verify = verify.unwrap_or(if test.is_lat() { 1 } else { 16 });
    if qd == 0 || batch == Some(0) || verify == 0 {
        return Err(format!(
            "--qd, --batch and --verify must be at least 1\n{USAGE}"
        ));
    }
    if size == 0 {
        return Err("--size must be at least 1 byte".into());
    }
    if matches!(test, Test::SendBw | Test::SendLat) && size > MAX_SEND {
        return Err(format!(
            "--size {size}: the server's receives take at most {MAX_SEND} bytes per SEND"
        ));
    }
    Ok(Args {
        test,
        connect,
        size,
        qd,
        duration,
        batch,
        verify: verify as u64,
        json,
        profile,
        sets,
        idle_conns,
        lat_stream: false,
        server_stats: false,
    })
}

/// A client run as `rdmx-perf tune` asks for it: the same code path as the command line's
/// tests, with the knobs in `cfg` and the extras of [`Args`] the command line does not
/// offer.
#[derive(Debug, Clone)]
pub struct Spec {
    /// read_bw, write_bw, send_bw, read_lat or send_lat.
    pub test: &'static str,
    pub connect: String,
    pub size: usize,
    pub qd: usize,
    pub duration: f64,
    /// WRs per post call; None = the config's post_batch.
    pub batch: Option<usize>,
    pub lat_stream: bool,
    pub server_stats: bool,
}

/// What a [`Spec`] run measured.
#[derive(Debug)]
pub struct Measured {
    /// The figures the command line prints (ops_per_sec, lat_*_us, counters, ...).
    pub report: Report,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Every op's latency (post to completion; send_lat: round trip).
    pub hist: Histogram,
    /// The latency stream's round trips (`lat_stream`).
    pub stream: Option<Histogram>,
    /// Silences with ops outstanding: time from a completion (or the post that ended a
    /// time with nothing outstanding) to the next completion (bandwidth tests and read_lat).
    pub gaps: Option<Histogram>,
    /// This process's CPU time during the ops (user + system, every thread), ns.
    pub client_cpu_ns: u64,
    /// The server's difference over the run (`server_stats`).
    pub server: Option<ServerStats>,
    /// Completions lost to a full CQ on this side (None: the provider cannot count them).
    pub cq_overflows: Option<u64>,
}

/// Runs `spec` with `cfg` (built by the caller, e.g. with `perf::build_config`).
pub fn measure(spec: &Spec, cfg: &Config) -> Result<Measured, String> {
    let test = Test::parse(spec.test).ok_or_else(|| format!("unknown test '{}'", spec.test))?;
    let a = Args {
        test,
        connect: spec.connect.clone(),
        size: spec.size,
        qd: if test.is_lat() { 1 } else { spec.qd },
        duration: spec.duration,
        batch: spec.batch,
        verify: if test.is_lat() { 1 } else { 16 },
        json: true,
        profile: None,
        sets: Vec::new(),
        idle_conns: 0,
        lat_stream: spec.lat_stream,
        server_stats: spec.server_stats,
    };
    let s = cfg.settings().map_err(|e| format!("configuration: {e}"))?;
    let need = a.qd + usize::from(a.lat_stream);
    if (s.max_send_wr as usize) < need {
        return Err(format!(
            "qd {} needs max_send_wr >= {need}, got {}",
            a.qd, s.max_send_wr
        ));
    }
    let (report, out) = run(&a, cfg)?;
    Ok(Measured {
        report,
        errors: out.errors,
        first_error: out.first_error,
        hist: out.hist.unwrap_or_else(Histogram::new),
        stream: out.stream,
        gaps: out.gaps,
        client_cpu_ns: out.cpu_ns,
        server: out.server,
        cq_overflows: out.cq_overflows,
    })
}

/// Registered local memory, deregistered on drop (after the connection is gone).
struct Local<'a> {
    ctx: &'a Context,
    _buf: Box<[u8]>,
    ptr: *mut u8,
    addr: u64,
    lkey: u32,
}

impl<'a> Local<'a> {
    fn new(ctx: &'a Context, buf: Box<[u8]>) -> Result<Local<'a>, String> {
        let mut buf = buf;
        let ptr = buf.as_mut_ptr();
        // SAFETY: `buf` is owned by the returned value, which deregisters before freeing it.
        let mr = unsafe { ctx.register(ptr, buf.len(), access::LOCAL_WRITE) }
            .map_err(|e| format!("register {} bytes: {e}", buf.len()))?;
        Ok(Local {
            ctx,
            _buf: buf,
            ptr,
            addr: mr.addr,
            lkey: mr.lkey,
        })
    }
}

impl Drop for Local<'_> {
    fn drop(&mut self) {
        for _ in 0..200 {
            if self.ctx.deregister(self.lkey).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Still named by WRs: leak the memory rather than free it under the engine.
        std::mem::forget(std::mem::take(&mut self._buf));
    }
}

/// What a run produced.
#[derive(Debug, Default)]
struct Outcome {
    ops: u64,
    elapsed_ns: u64,
    errors: u64,
    verified: u64,
    first_error: Option<String>,
    // For `measure` (rdmx-perf tune):
    hist: Option<Histogram>,
    stream: Option<Histogram>,
    gaps: Option<Histogram>,
    cpu_ns: u64,
    server: Option<ServerStats>,
    cq_overflows: Option<u64>,
}

impl Outcome {
    fn error(&mut self, msg: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(msg);
        }
    }
}

pub fn main(test_name: &str, args: &[String]) -> ExitCode {
    let who = format!("rdmx-perf: {test_name}");
    let Some(test) = Test::parse(test_name) else {
        return Fail::Usage(format!("unknown test '{test_name}'\n{USAGE}")).exit("rdmx-perf");
    };
    let (a, cfg) = match parse(test, args).and_then(|a| configure(&a).map(|cfg| (a, cfg))) {
        Ok(x) => x,
        Err(e) => return Fail::Usage(e).exit(&who),
    };
    match run(&a, &cfg) {
        Ok((report, out)) => {
            report.print(a.json);
            if out.errors > 0 {
                eprintln!(
                    "rdmx-perf: {}: {} error(s); first: {}",
                    test.name(),
                    out.errors,
                    out.first_error.as_deref().unwrap_or("?")
                );
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => Fail::Run(e).exit(&who),
    }
}

/// Why the connection gave up, if it did with a retry-exhausted error (": ..." or "").
fn failure_words(conn: &Connection) -> String {
    conn.failure_note()
        .map_or_else(String::new, |n| format!(": {n}"))
}

/// The configuration of a run (errors are usage errors: the command line, the environment
/// or the profile asks for something invalid).
fn configure(a: &Args) -> Result<Config, String> {
    let mut extra = Vec::new();
    if a.qd > 256 {
        extra.push(("max_send_wr", a.qd.to_string(), format!("--qd {}", a.qd)));
    }
    let cfg = build_config(a.profile.as_deref(), &a.sets, &extra)?;
    let s = cfg.settings().map_err(|e| format!("configuration: {e}"))?;
    if (s.max_send_wr as usize) < a.qd {
        return Err(format!(
            "--qd {} is more than max_send_wr = {} (set --set max_send_wr={} or lower --qd)",
            a.qd, s.max_send_wr, a.qd
        ));
    }
    Ok(cfg)
}

fn run(a: &Args, cfg: &Config) -> Result<(Report, Outcome), String> {
    // Best effort; if pinning is refused, registration says so.
    crate::perf::ensure_memlock((a.qd * a.size) as u64 + (16 << 20));
    let ctx = Context::new(cfg).map_err(|e| format!("context: {e}"))?;
    let s = ctx.settings().clone();
    let a = &Args {
        batch: Some(a.batch.unwrap_or(s.post_batch as usize).clamp(1, a.qd)),
        ..a.clone()
    };
    // The receive for the server's "ready" SEND, posted by the on-connect hook: before the
    // server may send. (Posted after connect returns, a client starved of CPU was too late
    // for the server's rnr_retry and the server's QP ended with RNR_RETRY_EXC_ERR.)
    let ready_buf = Local::new(&ctx, vec![0u8; 64].into_boxed_slice())?;
    let ready_sge = Sge {
        addr: ready_buf.addr,
        length: 64,
        lkey: ready_buf.lkey,
    };
    ctx.set_on_connect(Some(std::sync::Arc::new(move |c: &Connection| {
        c.post_recv(&[(READY, smallvec![ready_sge])]).map(|_| ())
    })));
    let conn = ctx
        .connect(&a.connect, CONNECT_TIMEOUT)
        .map_err(|e| once_prefixed("connect to", &a.connect, &e.to_string()))?;
    wait_ready(&conn)?;
    // Idle connections: each gets the server's ready message (into the same 64 bytes, the
    // hook posts its receive) and is then left alone until the run ends.
    let mut idle = Vec::with_capacity(a.idle_conns);
    for i in 0..a.idle_conns {
        let c = ctx.connect(&a.connect, CONNECT_TIMEOUT).map_err(|e| {
            format!(
                "idle connection {} of {}: {}",
                i + 1,
                a.idle_conns,
                once_prefixed("connect to", &a.connect, &e.to_string())
            )
        })?;
        wait_ready(&c)
            .map_err(|e| format!("idle connection {} of {}: {e}", i + 1, a.idle_conns))?;
        idle.push(c);
    }
    ctx.set_on_connect(None);
    let need = match a.test.opcode() {
        WrOpcode::RdmaRead => access::REMOTE_READ,
        WrOpcode::RdmaWrite => access::REMOTE_WRITE,
        _ => 0,
    };
    let region = conn
        .peer_regions()
        .iter()
        .find(|r| r.access & need == need && r.len >= a.size as u64)
        .copied();
    let region = match (need, region) {
        (0, _) => None, // SENDs name no remote memory
        (_, Some(r)) => Some(r),
        (_, None) => {
            return Err(format!(
                "the server exposes no region with {} access of at least {} bytes (is it an rdmx-perf server?)",
                if need == access::REMOTE_READ {
                    "REMOTE_READ"
                } else {
                    "REMOTE_WRITE"
                },
                a.size
            ));
        }
    };
    let local_len = match a.test {
        Test::WriteBw => region.map_or(0, |r| r.len as usize),
        Test::SendLat => 2 * a.size,
        _ => a.qd * a.size,
    };
    if local_len > MAX_LOCAL {
        return Err(format!(
            "local buffer of {local_len} bytes (qd x size, or the server region for write_bw) is over the {} MiB limit",
            MAX_LOCAL >> 20
        ));
    }
    let mut buf = vec![0u8; local_len].into_boxed_slice();
    match a.test {
        Test::WriteBw => fill_pattern(&mut buf, 0),
        Test::SendLat => buf[0] = PING,
        _ => {}
    }
    let local = Local::new(&ctx, buf)?;
    // Stats request and answer, and the latency stream's ping and answer (rdmx-perf tune).
    let ctl = Local::new(&ctx, vec![0u8; CTL_LEN].into_boxed_slice())?;
    let clock = Clock::new();
    let before = if a.server_stats {
        Some(fetch_server_stats(&conn, &ctl, &clock)?)
    } else {
        None
    };
    let mut hist = Histogram::new();
    let cpu0 = server_stats::process_cpu_ns();
    let mut out = if a.test == Test::SendLat {
        send_lat(a, &conn, &local, &s, &clock, &mut hist)
    } else {
        ops_loop(a, &conn, &local, &ctl, region, &s, &clock, &mut hist)
    };
    out.cpu_ns = server_stats::process_cpu_ns().saturating_sub(cpu0);
    if let Some(before) = before {
        // A run that failed may have left the QP in error: no answer then, and the run's
        // own error says why.
        if out.errors == 0 {
            let after = fetch_server_stats(&conn, &ctl, &clock)?;
            out.server = Some(after.since(&before));
        }
    }
    out.cq_overflows = conn.cq_overflows();
    let c = conn.counters();
    // Negotiated: path_mtu capped by both sides' links, not the configured value.
    let path_mtu = conn.path_mtu();
    let injected = conn.injected_drops();
    let kdrops = conn.kernel_drops();
    let stalls = conn.progress_stats();
    drop(conn);
    drop(idle);
    drop(local);
    drop(ctl);
    drop(ready_buf);

    let secs = out.elapsed_ns as f64 / 1e9;
    let ops_per_sec = if secs > 0.0 {
        out.ops as f64 / secs
    } else {
        0.0
    };
    let mut r = Report::new(a.test.name());
    r.str("provider", ctx.provider());
    r.str("progress", format!("{:?}", s.progress).to_lowercase());
    r.str("poll_mode", format!("{:?}", s.poll_mode).to_lowercase());
    r.str("server", a.connect.clone());
    r.str(
        "latency",
        if a.test == Test::SendLat {
            "round trip"
        } else {
            "post to completion"
        },
    );
    r.int("size", a.size as u64);
    r.int("qd", a.qd as u64);
    r.int("batch", a.batch() as u64);
    r.int("path_mtu", u64::from(path_mtu));
    r.int("idle_conns", a.idle_conns as u64);
    r.num("duration_s", secs, 3);
    r.int("ops", out.ops);
    r.num("ops_per_sec", ops_per_sec, 1);
    r.bandwidth(ops_per_sec, a.size as u64);
    r.latency(&hist);
    r.int("retransmits", c.retransmits);
    r.int("rnr_naks", c.rnr_naks_received);
    r.int("ack_timeouts", c.ack_timeouts);
    r.int("seq_naks", c.seq_naks_received);
    r.int("duplicates", c.duplicates_received);
    r.int("out_of_sequence", c.out_of_sequence);
    r.int("icrc_errors", c.icrc_errors);
    r.int("malformed", c.malformed);
    r.int("tx_packets", c.tx_packets);
    r.int("rx_packets", c.rx_packets);
    r.int("kernel_drops", kdrops);
    r.int("injected_drops", injected);
    // Time this process was not running when its transport was due (left out of the ACK
    // timers: its own absence is not charged to the peer).
    r.int("stalls", stalls.stalls);
    r.num("stalled_ms", stalls.stalled_ns as f64 / 1e6, 1);
    r.num("max_stall_ms", stalls.max_stall_ns as f64 / 1e6, 1);
    r.int("verified", out.verified);
    r.int("errors", out.errors);
    if let Some(st) = &out.stream {
        let us = |ns: u64| ns as f64 / 1000.0;
        r.int("stream_ops", st.count());
        r.num("stream_p50_us", us(st.quantile(0.50)), 2);
        r.num("stream_p99_us", us(st.quantile(0.99)), 2);
        r.num("stream_p999_us", us(st.quantile(0.999)), 2);
    }
    out.hist = Some(hist);
    Ok((r, out))
}

/// `"{what} {addr}: {msg}"`, or `msg` alone when it already says `what` (the library's
/// connect and listen errors name the address they resolved).
pub fn once_prefixed(what: &str, addr: &str, msg: &str) -> String {
    if msg.contains(what) {
        msg.to_string()
    } else {
        format!("{what} {addr}: {msg}")
    }
}

/// Posts the receive for the server's ready message and waits for it.
/// Cookie of the receive for the server's ready message.
const READY: u64 = u64::MAX;

/// Waits for the server's ready message (its receive was posted by the on-connect hook).
fn wait_ready(conn: &Connection) -> Result<(), String> {
    let clock = Clock::new();
    let deadline = READY_TIMEOUT.as_nanos() as u64;
    let mut wcs = vec![empty_wc(); 4];
    loop {
        let n = conn.poll(&mut wcs);
        if let Some(wc) = wcs[..n].first() {
            return match (wc.cookie, wc.status, wc.imm) {
                (READY, WcStatus::Success, Some(READY_IMM)) => Ok(()),
                (READY, WcStatus::Success, imm) => Err(format!(
                    "the server's first message is not rdmx-perf's ready message (immediate {imm:?})"
                )),
                (_, status, _) => Err(format!(
                    "waiting for the server's ready message: {:?} completed with {status:?}",
                    wc.opcode
                )),
            };
        }
        if clock.now() > deadline {
            return Err(format!(
                "no ready message from the server within {READY_TIMEOUT:?} (is it an rdmx-perf server?)"
            ));
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// The control buffer of a run: stats answer, stats request, stream ping, stream answer.
const CTL_LEN: usize = 2 * server_stats::ANSWER_LEN + 2 * STREAM_SIZE;
/// Bytes of a latency-stream ping (and of its answer).
const STREAM_SIZE: usize = 64;
/// Cookies of the control WRs (the ops' cookies are their slots, below qd).
const STATS_RECV: u64 = u64::MAX - 10;
const STATS_SEND: u64 = u64::MAX - 11;
const STREAM_SEND: u64 = u64::MAX - 20;
const STREAM_RECV: u64 = u64::MAX - 21;

/// Asks the server for its [`ServerStats`] on `conn` (nothing else outstanding on it).
fn fetch_server_stats(
    conn: &Connection,
    ctl: &Local<'_>,
    clock: &Clock,
) -> Result<ServerStats, String> {
    let len = server_stats::ANSWER_LEN;
    // SAFETY: byte `len` of `ctl` is the request's; no WR names it now.
    unsafe { ctl.ptr.add(len).write_volatile(server_stats::REQUEST) };
    let recv = (
        STATS_RECV,
        smallvec![Sge {
            addr: ctl.addr,
            length: len as u32,
            lkey: ctl.lkey,
        }],
    );
    conn.post_recv(std::slice::from_ref(&recv))
        .map_err(|e| format!("stats request: post_recv: {e}"))?;
    let req = SendReq {
        cookie: STATS_SEND,
        opcode: WrOpcode::Send,
        flags: send_flags::SIGNALED,
        sges: smallvec![Sge {
            addr: ctl.addr + len as u64,
            length: 1,
            lkey: ctl.lkey,
        }],
        remote_addr: 0,
        rkey: 0,
        imm: 0,
    };
    conn.post_send(std::slice::from_ref(&req))
        .map_err(|e| format!("stats request: post_send: {e}"))?;
    let deadline = clock.now() + READY_TIMEOUT.as_nanos() as u64;
    let (mut sent, mut answer) = (false, None);
    let mut wcs = vec![empty_wc(); 4];
    while !(sent && answer.is_some()) {
        let n = conn.poll(&mut wcs);
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "stats request: {:?} completed with {:?}{}",
                    wc.opcode,
                    wc.status,
                    failure_words(conn)
                ));
            }
            match (wc.cookie, wc.imm) {
                (STATS_SEND, _) => sent = true,
                (STATS_RECV, Some(server_stats::ANSWER_IMM)) => {
                    // SAFETY: the receive completed; the engine no longer writes `ctl`'s
                    // first `len` bytes.
                    let b = unsafe { std::slice::from_raw_parts(ctl.ptr, len) };
                    answer = ServerStats::decode(&b[..(wc.byte_len as usize).min(len)]);
                    if answer.is_none() {
                        return Err(format!(
                            "stats answer of {} bytes is too short (an older rdmx-perf server?)",
                            wc.byte_len
                        ));
                    }
                }
                (STATS_RECV, imm) => {
                    return Err(format!(
                        "the server's answer to a stats request has immediate {imm:?}, not rdmx-perf's stats answer (an older rdmx-perf server?)"
                    ));
                }
                (c, _) => return Err(format!("stats request: unexpected completion {c:#x}")),
            }
        }
        if n == 0 {
            if clock.now() > deadline {
                return Err(format!(
                    "no answer to a stats request within {READY_TIMEOUT:?} (an older rdmx-perf server does not answer them)"
                ));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    answer.ok_or_else(|| "stats request: no answer".to_string())
}

/// The bandwidth loop (and read_lat, with qd 1).
#[allow(clippy::too_many_arguments)]
fn ops_loop(
    a: &Args,
    conn: &Connection,
    local: &Local<'_>,
    ctl: &Local<'_>,
    region: Option<rdmx::msgr::Region>,
    s: &Settings,
    clock: &Clock,
    hist: &mut Histogram,
) -> Outcome {
    let mut waiter = Waiter::new(s);
    let opcode = a.test.opcode();
    let is_read = opcode == WrOpcode::RdmaRead;
    let size = a.size as u64;
    let (raddr, rlen, rkey) = region.map_or((0, 0, 0), |r| (r.addr, r.len, r.rkey));
    let align: u64 = if size % 4096 == 0 { 4096 } else { 64 };
    let slots_span = rlen.saturating_sub(size) / align + 1;
    let mut rng = Rng::new(clock.now() ^ u64::from(std::process::id()));
    let mut posted_at = vec![0u64; a.qd];
    let mut offset = vec![0u64; a.qd];
    // Whether the READ in flight in each slot is one of the sampled ones (`--verify`).
    let mut check_this = vec![false; a.qd];
    let mut posted_reads = 0u64;
    let mut free: Vec<usize> = (0..a.qd).rev().collect();
    let mut wrs: Vec<SendReq> = Vec::with_capacity(a.batch());
    let mut wcs = vec![empty_wc(); 64];
    let mut out = Outcome::default();
    let mut stream = LatStream::new(a.lat_stream, ctl);
    // Silences: how long the connection went without a completion while ops were
    // outstanding (an RC requester's ACK timer restarts on every answer, so these, not the
    // ops' latencies, are what a timeout must outlast). `quiet_since`: the last completion,
    // or the post that ended a time with nothing outstanding.
    let mut gaps = Histogram::new();
    let mut quiet_since: Option<u64> = None;
    let start = clock.now();
    let end = start + (a.duration * 1e9) as u64;
    let mut last = start;
    let mut stopping = false;
    loop {
        let now = clock.now();
        if !stopping && (now >= end || out.errors > 0) {
            stopping = true;
        }
        if stopping && free.len() == a.qd && !stream.outstanding() {
            break;
        }
        if stopping && now > end + DRAIN_TIMEOUT {
            out.error(format!(
                "{} op(s) still outstanding {} s after the run ended",
                a.qd - free.len(),
                DRAIN_TIMEOUT / 1_000_000_000
            ));
            break;
        }
        if !stopping {
            if let Err(e) = stream.start(conn, clock) {
                out.error(e);
                stopping = true;
            }
        }
        // Post: every free slot, `batch` WRs per call.
        while !stopping && !free.is_empty() {
            wrs.clear();
            let k = free.len().min(a.batch());
            for _ in 0..k {
                let slot = free.pop().unwrap_or_default();
                let off = if rlen > 0 {
                    (rng.next() % slots_span) * align
                } else {
                    0
                };
                offset[slot] = off;
                if is_read {
                    check_this[slot] = posted_reads % a.verify == 0;
                    posted_reads += 1;
                }
                let slot_addr = local.addr + slot as u64 * size;
                let src = match opcode {
                    WrOpcode::RdmaWrite => local.addr + off,
                    _ => slot_addr,
                };
                if is_read && check_this[slot] {
                    poison(local, slot as u64 * size, size, off);
                }
                wrs.push(SendReq {
                    cookie: slot as u64,
                    opcode,
                    flags: send_flags::SIGNALED,
                    sges: smallvec![Sge {
                        addr: src,
                        length: a.size as u32,
                        lkey: local.lkey,
                    }],
                    remote_addr: raddr + off,
                    rkey,
                    imm: 0,
                });
            }
            let t = clock.now();
            let posted = match conn.post_send(&wrs) {
                Ok(n) => n,
                Err(e) if e.kind() == rdmx::ErrorKind::Full => 0,
                Err(e) => {
                    out.error(format!("post_send: {e}"));
                    stopping = true;
                    0
                }
            };
            for w in &wrs[..posted] {
                posted_at[w.cookie as usize] = t;
            }
            if posted > 0 && quiet_since.is_none() {
                quiet_since = Some(t);
            }
            for w in wrs[posted..].iter().rev() {
                free.push(w.cookie as usize);
            }
            if posted < wrs.len() {
                break;
            }
        }
        if stopping && free.len() == a.qd && !stream.outstanding() {
            break;
        }
        let n = conn.poll(&mut wcs);
        if n == 0 {
            let now = clock.now();
            let max_sleep = if stopping {
                Duration::from_millis(10)
            } else {
                Duration::from_nanos(end.saturating_sub(now).clamp(1000, 10_000_000))
            };
            waiter.idle(conn, now, max_sleep);
            continue;
        }
        waiter.busy();
        let t = clock.now();
        if let Some(q) = quiet_since {
            gaps.record(t.saturating_sub(q));
        }
        for wc in &wcs[..n] {
            if stream.owns(wc.cookie) {
                if let Err(e) = stream.completed(wc, t) {
                    out.error(e);
                }
                continue;
            }
            let slot = wc.cookie as usize;
            if slot >= a.qd {
                out.error(format!("completion with unknown cookie {:#x}", wc.cookie));
                continue;
            }
            hist.record(t.saturating_sub(posted_at[slot]));
            free.push(slot);
            last = t;
            if wc.status != WcStatus::Success {
                let at = if rlen > 0 {
                    format!(" (remote offset {:#x})", offset[slot])
                } else {
                    String::new()
                };
                out.error(format!(
                    "{:?} completed with {:?}{at}{}",
                    wc.opcode,
                    wc.status,
                    failure_words(conn)
                ));
                continue;
            }
            if wc.byte_len as u64 != size && is_read {
                out.error(format!(
                    "READ completed with {} bytes, expected {size}",
                    wc.byte_len
                ));
                continue;
            }
            out.ops += 1;
            if is_read && check_this[slot] {
                // SAFETY: the READ completed: the engine no longer writes this slot.
                let got =
                    unsafe { std::slice::from_raw_parts(local.ptr.add(slot * a.size), a.size) };
                match check_pattern(got, offset[slot]) {
                    None => out.verified += 1,
                    Some(i) => out.error(format!(
                        "READ of {size} bytes at offset {:#x}: byte {i} is {:#04x}, expected {:#04x}",
                        offset[slot],
                        got[i],
                        pattern_byte(offset[slot] + i as u64)
                    )),
                }
            }
        }
        quiet_since = (free.len() < a.qd).then_some(t);
    }
    out.elapsed_ns = last.saturating_sub(start).max(1);
    out.stream = stream.hist;
    out.gaps = Some(gaps);
    out
}

/// The latency stream beside the bulk ops (`Args::lat_stream`): one 64-byte SEND ping at a
/// time on the same connection, answered by the server's PONG; its round trips go to their
/// own histogram. Its completions share the bulk ops' CQs (one CQ with separate_cqs =
/// false), which is what the seed's "separate send/recv CQs" row is about.
struct LatStream {
    hist: Option<Histogram>,
    addr: u64,
    ptr: *mut u8,
    lkey: u32,
    /// (ping sent, answer received) of the ping in flight; None: none in flight.
    inflight: Option<(bool, bool)>,
    recv_posted: bool,
    t0: u64,
}

impl LatStream {
    fn new(on: bool, ctl: &Local<'_>) -> LatStream {
        let at = 2 * server_stats::ANSWER_LEN;
        LatStream {
            hist: on.then(Histogram::new),
            addr: ctl.addr + at as u64,
            // SAFETY: `at + 2 * STREAM_SIZE == CTL_LEN`: inside `ctl`.
            ptr: unsafe { ctl.ptr.add(at) },
            lkey: ctl.lkey,
            inflight: None,
            recv_posted: false,
            t0: 0,
        }
    }

    fn outstanding(&self) -> bool {
        self.inflight.is_some() || self.recv_posted
    }

    fn owns(&self, cookie: u64) -> bool {
        cookie == STREAM_SEND || cookie == STREAM_RECV
    }

    /// Posts the next ping if the stream is on and none is in flight.
    fn start(&mut self, conn: &Connection, clock: &Clock) -> Result<(), String> {
        if self.hist.is_none() || self.inflight.is_some() {
            return Ok(());
        }
        let sge = |off: u64| Sge {
            addr: self.addr + off,
            length: STREAM_SIZE as u32,
            lkey: self.lkey,
        };
        if !self.recv_posted {
            // SAFETY: the answer's first byte; no WR names the answer slot now.
            unsafe { self.ptr.add(STREAM_SIZE).write_volatile(0) };
            let recv = (STREAM_RECV, smallvec![sge(STREAM_SIZE as u64)]);
            conn.post_recv(std::slice::from_ref(&recv))
                .map_err(|e| format!("latency stream: post_recv: {e}"))?;
            self.recv_posted = true;
        }
        // SAFETY: the ping's first byte; no WR names the ping slot now.
        unsafe { self.ptr.write_volatile(PING) };
        let ping = SendReq {
            cookie: STREAM_SEND,
            opcode: WrOpcode::Send,
            flags: send_flags::SIGNALED,
            sges: smallvec![sge(0)],
            remote_addr: 0,
            rkey: 0,
            imm: 0,
        };
        self.t0 = clock.now();
        match conn.post_send(std::slice::from_ref(&ping)) {
            Ok(1) => {
                self.inflight = Some((false, false));
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(e) if e.kind() == rdmx::ErrorKind::Full => Ok(()),
            Err(e) => Err(format!("latency stream: post_send: {e}")),
        }
    }

    fn completed(&mut self, wc: &rdmx::provider::Wc, now: u64) -> Result<(), String> {
        if wc.status != WcStatus::Success {
            return Err(format!(
                "latency stream: {:?} completed with {:?}",
                wc.opcode, wc.status
            ));
        }
        let (mut sent, mut answered) = self.inflight.unwrap_or((false, false));
        if wc.cookie == STREAM_SEND {
            sent = true;
        } else {
            answered = true;
            self.recv_posted = false;
            // SAFETY: the receive completed; the engine no longer writes the answer slot.
            let first = unsafe { self.ptr.add(STREAM_SIZE).read_volatile() };
            if first != PONG {
                return Err(format!(
                    "latency stream: answer starts {first:#04x}, expected {PONG:#04x}"
                ));
            }
            if let Some(h) = &mut self.hist {
                h.record(now.saturating_sub(self.t0));
            }
        }
        self.inflight = if sent && answered {
            None
        } else {
            Some((sent, answered))
        };
        Ok(())
    }
}

/// Writes the complement of the expected pattern into the first and last (up to) 8 bytes
/// of a READ slot, so a READ that lands nothing fails verification.
fn poison(local: &Local<'_>, at: u64, size: u64, off: u64) {
    let n = size.min(8);
    for i in (0..n).chain(size - n..size) {
        // SAFETY: `at + i` is inside the slot; no WR names this slot now (it is free).
        unsafe {
            local
                .ptr
                .add((at + i) as usize)
                .write_volatile(!pattern_byte(off + i))
        };
    }
}

/// send_lat: one ping at a time, answered by the server with a SEND of the same size.
fn send_lat(
    a: &Args,
    conn: &Connection,
    local: &Local<'_>,
    s: &Settings,
    clock: &Clock,
    hist: &mut Histogram,
) -> Outcome {
    const SEND: u64 = 1;
    const RECV: u64 = 2;
    let mut waiter = Waiter::new(s);
    let size = a.size as u64;
    let recv = (
        RECV,
        smallvec![Sge {
            addr: local.addr + size,
            length: a.size as u32,
            lkey: local.lkey,
        }],
    );
    let ping = SendReq {
        cookie: SEND,
        opcode: WrOpcode::Send,
        flags: send_flags::SIGNALED,
        sges: smallvec![Sge {
            addr: local.addr,
            length: a.size as u32,
            lkey: local.lkey,
        }],
        remote_addr: 0,
        rkey: 0,
        imm: 0,
    };
    let mut wcs = vec![empty_wc(); 16];
    let mut out = Outcome::default();
    let start = clock.now();
    let end = start + (a.duration * 1e9) as u64;
    let mut last = start;
    'ops: while clock.now() < end && out.errors == 0 {
        if let Err(e) = conn.post_recv(std::slice::from_ref(&recv)) {
            out.error(format!("post_recv: {e}"));
            break;
        }
        // SAFETY: the receive slot is named by the posted receive only; mark it stale.
        unsafe { local.ptr.add(a.size).write_volatile(0) };
        let t0 = clock.now();
        if let Err(e) = conn.post_send(std::slice::from_ref(&ping)) {
            out.error(format!("post_send: {e}"));
            break;
        }
        let (mut sent, mut answered) = (false, false);
        let deadline = t0 + DRAIN_TIMEOUT;
        while !(sent && answered) {
            let n = conn.poll(&mut wcs);
            let now = clock.now();
            if n == 0 {
                if now > deadline {
                    out.error(format!(
                        "no answer within {} s (sent: {sent}, answered: {answered})",
                        DRAIN_TIMEOUT / 1_000_000_000
                    ));
                    break 'ops;
                }
                waiter.idle(conn, now, Duration::from_millis(10));
                continue;
            }
            waiter.busy();
            for wc in &wcs[..n] {
                if wc.status != WcStatus::Success {
                    out.error(format!(
                        "{:?} completed with {:?}{}",
                        wc.opcode,
                        wc.status,
                        failure_words(conn)
                    ));
                    continue;
                }
                match (wc.cookie, wc.opcode) {
                    (SEND, WcOpcode::Send) => sent = true,
                    (RECV, WcOpcode::Recv) => {
                        answered = true;
                        hist.record(now - t0);
                        last = now;
                        // SAFETY: the receive completed; the engine no longer writes it.
                        let first = unsafe { local.ptr.add(a.size).read_volatile() };
                        if wc.byte_len as u64 != size || first != PONG {
                            out.error(format!(
                                "answer of {} bytes starting {first:#04x}, expected {size} starting {PONG:#04x}",
                                wc.byte_len
                            ));
                        } else {
                            out.ops += 1;
                            out.verified += 1;
                        }
                    }
                    other => out.error(format!("unexpected completion {other:?}")),
                }
            }
            if out.errors > 0 {
                break 'ops;
            }
        }
    }
    // After an error the QP may still hold the receive; closing the connection flushes it.
    out.elapsed_ns = last.saturating_sub(start).max(1);
    out
}

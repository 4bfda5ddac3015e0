//! The messenger tests: `msg_bw rpc_bw rpc_lat`, through `rdmx::msgr::Messenger` (sessions,
//! credits, acknowledgements: what a storage daemon uses), served by `rdmx-perf server`.
//!
//! * msg_bw: one-way messages (type [`MSG`], a 16-byte front, one data segment of `--size`
//!   bytes), `--qd` outstanding; an op completes when the server acknowledged it
//!   (`on_send_complete`). Data of up to 4 KiB comes from pool chunks (eager SEND, no copy),
//!   larger from a buffer registered through the registration cache (the receiver READs it).
//! * rpc_bw / rpc_lat: a 64-byte request (type [`REQ`]: id, size, offset) answered by a
//!   reply (type [`REP`]) carrying `--size` bytes of the server's patterned region at that
//!   offset (the OSD read shape; the server sends it from registered memory without a copy);
//!   every `--verify`th reply's data is checked against the pattern. rpc_lat: `--qd 1`.
//!   Latency: request sent to reply delivered.
//!
//! The client's messenger is driven by this thread (`msgr_threads = 0` unless set): one
//! `poll` (which spins, or sleeps on a contended CPU, until something completes: at most
//! [`IDLE_POLL`]), then the callbacks. The server's messenger
//! listens on a second port; the client learns it from the server's ready message on a
//! plain connection to `--connect` (so every test takes the same address).

use rdmx::Config;
use rdmx::msgr::messenger::{
    Dispatcher, InMessage, OutMessage, Payload, Policy, SendId, SessionId,
};
use rdmx::msgr::{Connection, Context, Messenger};
use rdmx::rc::Sge;
use rdmx::rc::smallvec;
use rdmx::rc::verbs::access;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use crate::cli;
use crate::perf::{
    Clock, Fail, Histogram, READY_IMM, READY_TIMEOUT, Report, Rng, SERVER_REGION, build_config,
    check_pattern, fill_pattern, pattern_byte,
};
use crate::server::empty_wc;

/// Message types.
pub const MSG: u16 = 0x4d31; // one-way
pub const REQ: u16 = 0x5251; // request
pub const REP: u16 = 0x5250; // reply
/// The request's front: id (8), size (8), offset (8), padding: 64 bytes.
pub const REQ_FRONT: usize = 64;
/// Most idle sessions (`--idle-sessions`): each is a TCP side channel and a QP on both sides.
const MAX_IDLE: usize = 10_000;
/// How long the client's `poll` may wait when nothing completed: the messenger's own
/// spin-then-sleep decides (it spins its budget while the thread gets a CPU, sleeps at once
/// on a contended one), where a `poll(0)` loop spins on regardless. Under two CPU hogs on
/// 2 cores a client spinning on `poll(0)` held the CPU the server's worker needed: rpc_bw
/// 43-63K ops/s against 63-99K waiting in `poll` (alternating runs, 2026-12-03); on a
/// quiet host the same (168-225K against 183-210K). Short enough to see the run's end.
const IDLE_POLL: Duration = Duration::from_millis(1);
/// Largest reply (`--size` of rpc tests).
pub const MAX_REPLY: usize = 4 << 20;
/// The first bytes of the server's ready message when it serves the messenger tests,
/// followed by the messenger's TCP port (u16, little endian).
pub const READY_MSGR: &[u8; 4] = b"MSGR";

pub const USAGE: &str = "usage: rdmx-perf {msg_bw|rpc_bw|rpc_lat} --connect ADDR:PORT \
     [--size BYTES (4096)] [--qd N (bw: 32, lat: 1)] [--duration SECONDS (5)] \
     [--verify N (msg_bw: -, rpc_bw: 16, rpc_lat: 1)] [--idle-sessions N (0)] [--set KEY=VALUE]... \
     [--profile NAME] [--json]";

pub const HELP: &str = "\
Runs one messenger test against `rdmx-perf server` for --duration seconds:
  msg_bw   one-way messages with one data segment of --size bytes, --qd unacknowledged
  rpc_bw   64-byte requests, each answered by a reply carrying --size bytes of the server's
           patterned region (the OSD read shape), --qd outstanding
  rpc_lat  rpc_bw with one request at a time

options:
  --connect ADDR:PORT  the server's address, as for the other tests (required); the server's
                       messenger port is learned from it
  --size BYTES         data bytes per message / reply; K/M/G suffixes are binary (default
                       4096; at most 4M)
  --qd N               outstanding messages or requests (default 32; rpc_lat: 1)
  --duration SECONDS   how long to run, in (0, 3600] (default 5)
  --verify N           rpc tests: check every Nth reply's data (default rpc_bw 16, rpc_lat 1)
  --idle-sessions N    first open N more sessions to the server that stay idle during the
                       test (0..=10000, default 0): what many sessions cost the busy one
                       (bench/scale.sh TEST=rpc_lat)
  --set KEY=VALUE      a configuration knob, msgr_* included (`rdmx-perf config`); repeatable
  --profile NAME       a configuration profile (e.g. ceph-after)
  --json               stdout is one JSON object only; the table goes to stderr

The client's messenger runs on the test's thread (msgr_threads = 0) unless --set says
otherwise. Latency: msg_bw send to acknowledgement; rpc tests request sent to reply
delivered. Output keys as the other tests (ops, ops_per_sec, bw_*, lat_*_us) plus the
session counters (credit_stalls, replays, reconnects, rnr_naks, ...).
exit status: 0 the run completed without errors, 1 the run failed, 2 usage error.";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Test {
    MsgBw,
    RpcBw,
    RpcLat,
}

impl Test {
    fn name(self) -> &'static str {
        match self {
            Test::MsgBw => "msg_bw",
            Test::RpcBw => "rpc_bw",
            Test::RpcLat => "rpc_lat",
        }
    }
}

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
    verify: Option<usize>,
    #[arg(long = "idle-sessions", value_parser = cli::number, default_value = "0", allow_hyphen_values = true)]
    idle: usize,
    #[arg(long)]
    json: bool,
    #[arg(long, allow_hyphen_values = true)]
    profile: Option<String>,
    #[arg(long, value_parser = cli::set, allow_hyphen_values = true)]
    set: Vec<(String, String)>,
}

struct Args {
    test: Test,
    connect: String,
    size: usize,
    qd: usize,
    duration: f64,
    verify: u64,
    idle: usize,
    json: bool,
    profile: Option<String>,
    sets: Vec<(String, String)>,
}

fn parse(test: Test, args: &[String]) -> Result<Args, String> {
    let c: Cli = cli::parse(args, USAGE)?;
    let qd = if test == Test::RpcLat {
        1
    } else {
        c.qd.unwrap_or(32)
    };
    let verify = c
        .verify
        .unwrap_or(if test == Test::RpcLat { 1 } else { 16 });
    if !(1..=4096).contains(&qd) || verify == 0 {
        return Err(format!(
            "--qd must be 1..=4096 and --verify at least 1\n{USAGE}"
        ));
    }
    if c.idle > MAX_IDLE {
        return Err(format!("--idle-sessions must be 0..={MAX_IDLE}\n{USAGE}"));
    }
    if c.size == 0 || c.size > MAX_REPLY {
        return Err(format!("--size must be 1..={MAX_REPLY} bytes\n{USAGE}"));
    }
    Ok(Args {
        test,
        connect: c.connect,
        size: c.size,
        qd,
        duration: c.duration,
        verify: verify as u64,
        idle: c.idle,
        json: c.json,
        profile: c.profile,
        sets: c.set,
    })
}

pub fn main(name: &str, args: &[String]) -> ExitCode {
    let who = format!("rdmx-perf: {name}");
    let test = match name {
        "msg_bw" => Test::MsgBw,
        "rpc_bw" => Test::RpcBw,
        _ => Test::RpcLat,
    };
    let a = match parse(test, args) {
        Ok(a) => a,
        Err(e) => return Fail::Usage(e).exit(&who),
    };
    let cfg = match build_config(a.profile.as_deref(), &a.sets, &[]).and_then(|c| {
        c.settings()
            .map(|_| c)
            .map_err(|e| format!("configuration: {e}"))
    }) {
        Ok(c) => c,
        Err(e) => return Fail::Usage(e).exit(&who),
    };
    match run(&a, &cfg) {
        Ok((report, errors, first)) => {
            report.print(a.json);
            if errors > 0 {
                eprintln!(
                    "rdmx-perf: {}: {errors} error(s); first: {}",
                    test.name(),
                    first.unwrap_or_default()
                );
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => Fail::Run(e).exit(&who),
    }
}

// ---- client ----

/// What the callbacks saw (they run inside `poll`, on the test's thread).
#[derive(Default)]
struct Seen {
    connected: bool,
    /// Sessions opened (the test's and the idle ones).
    connects: usize,
    reset: Option<String>,
    /// Send completions: (id, ok or why not).
    done: Vec<(SendId, Result<(), String>)>,
    replies: VecDeque<InMessage>,
}

struct ClientSide(Mutex<Seen>);

impl Dispatcher for ClientSide {
    fn on_connect(&self, _m: &Messenger, _s: SessionId, _peer: SocketAddr, _incoming: bool) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        s.connected = true;
        s.connects += 1;
    }
    fn on_message(&self, _m: &Messenger, _s: SessionId, msg: InMessage) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replies
            .push_back(msg);
    }
    fn on_send_complete(
        &self,
        _m: &Messenger,
        _s: SessionId,
        id: SendId,
        status: rdmx::error::Result<()>,
    ) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .done
            .push((id, status.map_err(|e| e.to_string())));
    }
    fn on_reset(&self, _m: &Messenger, _s: SessionId, why: &rdmx::Error) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).reset = Some(why.to_string());
    }
}

/// Asks the server at `addr` (its RC listener) for its messenger's address.
fn discover(cfg: &Config, addr: &str) -> Result<String, String> {
    let ctx = Context::new(cfg).map_err(|e| format!("context: {e}"))?;
    let mut buf = vec![0u8; 64];
    let ptr = buf.as_mut_ptr();
    // SAFETY: `buf` outlives the registration: deregistered below after the connection is
    // dropped (which flushes the receive naming it).
    let mr = unsafe { ctx.register(ptr, buf.len(), access::LOCAL_WRITE) }
        .map_err(|e| format!("register: {e}"))?;
    let sge = Sge {
        addr: mr.addr,
        length: 64,
        lkey: mr.lkey,
    };
    ctx.set_on_connect(Some(Arc::new(move |c: &Connection| {
        c.post_recv(&[(1, smallvec![sge])]).map(|_| ())
    })));
    let r = (|| {
        let conn = ctx
            .connect(addr, Duration::from_secs(10))
            .map_err(|e| crate::client::once_prefixed("connect to", addr, &e.to_string()))?;
        let clock = Clock::new();
        let mut wcs = vec![empty_wc(); 4];
        loop {
            let n = conn.poll(&mut wcs);
            if let Some(wc) = wcs[..n].first() {
                if wc.imm != Some(READY_IMM) || wc.byte_len < 6 {
                    return Err("the server's ready message is not rdmx-perf's".to_string());
                }
                // SAFETY: the receive completed: the engine no longer writes `buf`.
                let got = unsafe { std::slice::from_raw_parts(ptr, 6) };
                if &got[..4] != READY_MSGR {
                    return Err("the server does not serve the messenger tests".to_string());
                }
                let port = u16::from_le_bytes([got[4], got[5]]);
                let host = conn.peer().ip();
                return Ok(SocketAddr::new(host, port).to_string());
            }
            if clock.now() > READY_TIMEOUT.as_nanos() as u64 {
                return Err(format!("no ready message within {READY_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    })();
    ctx.set_on_connect(None);
    for _ in 0..100 {
        if ctx.deregister(mr.lkey).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(buf);
    r
}

#[derive(Default)]
struct Outcome {
    ops: u64,
    errors: u64,
    verified: u64,
    first_error: Option<String>,
    elapsed_ns: u64,
}

impl Outcome {
    fn error(&mut self, e: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(e);
        }
    }
}

type Run = (Report, u64, Option<String>);

fn run(a: &Args, cfg: &Config) -> Result<Run, String> {
    let maddr = discover(cfg, &a.connect)?;
    crate::perf::ensure_memlock((a.qd * a.size) as u64 + (128 << 20));
    let seen = Arc::new(ClientSide(Mutex::new(Seen::default())));
    let m = Messenger::new(cfg, Arc::clone(&seen) as Arc<dyn Dispatcher>)
        .map_err(|e| format!("messenger: {e}"))?;
    let workers = m.settings().threads > 0;
    let s = m
        .connect(&maddr, Policy::Lossless)
        .map_err(|e| format!("connect to {maddr}: {e}"))?;
    let clock = Clock::new();
    let pump = |wait: Duration| {
        if workers {
            std::thread::sleep(wait.min(Duration::from_micros(50)));
        } else {
            let _ = m.poll(wait);
        }
    };
    while !seen.0.lock().unwrap_or_else(|e| e.into_inner()).connected {
        if let Some(r) = &seen.0.lock().unwrap_or_else(|e| e.into_inner()).reset {
            return Err(format!("session to {maddr}: {r}"));
        }
        if clock.now() > 10_000_000_000 {
            return Err(format!("no session to {maddr} within 10 s"));
        }
        pump(Duration::from_millis(1));
    }
    // Idle sessions, a few connects at a time (each is a TCP handshake on a helper thread).
    let mut idle = Vec::with_capacity(a.idle);
    let opened = || seen.0.lock().unwrap_or_else(|e| e.into_inner()).connects;
    while idle.len() < a.idle || opened() < 1 + a.idle {
        if let Some(r) = &seen.0.lock().unwrap_or_else(|e| e.into_inner()).reset {
            return Err(format!("an idle session to {maddr}: {r}"));
        }
        if clock.now() > 120_000_000_000 {
            return Err(format!(
                "{} of {} idle sessions open after 120 s",
                opened() - 1,
                a.idle
            ));
        }
        if idle.len() < a.idle && idle.len() < opened() + 32 {
            let s = m
                .connect(&maddr, Policy::Lossless)
                .map_err(|e| format!("idle session to {maddr}: {e}"))?;
            idle.push(s);
        } else {
            pump(Duration::from_millis(1));
        }
    }
    // msg_bw sources above 4 KiB: one registered buffer per slot.
    let mut big = if a.test == Test::MsgBw && a.size > 4096 {
        vec![0u8; a.qd * a.size]
    } else {
        Vec::new()
    };
    fill_pattern(&mut big, 0);
    let mut hist = Histogram::new();
    let out = drive(a, &m, s, &seen, &big, &clock, &mut hist);
    let info = m.session_info(s).ok();
    let _ = m.close_session(s);
    for &i in &idle {
        let _ = m.close_session(i);
    }
    // The session's last callbacks (sends failed by the close) before the buffers go.
    for _ in 0..10 {
        pump(Duration::from_millis(1));
    }
    drop(m);
    // Registered through the cache: the messenger's context is gone with it.
    drop(big);

    let secs = out.elapsed_ns as f64 / 1e9;
    let ops_per_sec = if secs > 0.0 {
        out.ops as f64 / secs
    } else {
        0.0
    };
    let mut r = Report::new(a.test.name());
    r.str("server", a.connect.clone());
    r.str("messenger", maddr);
    r.str(
        "latency",
        if a.test == Test::MsgBw {
            "send to acknowledgement"
        } else {
            "request to reply"
        },
    );
    r.int("size", a.size as u64);
    r.int("qd", a.qd as u64);
    r.int("idle_sessions", a.idle as u64);
    r.int(
        "msgr_threads",
        if workers {
            cfg.get_u64("msgr_threads").unwrap_or(0)
        } else {
            0
        },
    );
    r.num("duration_s", secs, 3);
    r.int("ops", out.ops);
    r.num("ops_per_sec", ops_per_sec, 1);
    r.bandwidth(ops_per_sec, a.size as u64);
    r.latency(&hist);
    let c = info.map(|i| i.counters).unwrap_or_default();
    r.int("msgs_sent", c.msgs_sent);
    r.int("msgs_received", c.msgs_received);
    r.int("credit_stalls", c.credit_stalls);
    r.int("full_refusals", c.full_refusals);
    r.int("eager_segments", c.eager_segments);
    r.int("written_segments", c.written_segments);
    r.int("read_segments", c.read_segments);
    r.int("copied_bytes", c.copied_bytes);
    r.int("replays", c.replays);
    r.int("reconnects", c.reconnects);
    r.int("faults", c.faults);
    r.int("rnr_naks", c.rnr_naks);
    r.int("verified", out.verified);
    r.int("errors", out.errors);
    Ok((r, out.errors, out.first_error))
}

const DRAIN_NS: u64 = 5_000_000_000;

/// The test loop: keeps `qd` ops outstanding until the duration ends, then drains.
#[allow(clippy::too_many_arguments)]
fn drive(
    a: &Args,
    m: &Messenger,
    s: SessionId,
    seen: &ClientSide,
    big: &[u8],
    clock: &Clock,
    hist: &mut Histogram,
) -> Outcome {
    let workers = m.settings().threads > 0;
    let mut out = Outcome::default();
    let mut rng = Rng::new(clock.now() ^ u64::from(std::process::id()));
    let size = a.size as u64;
    let span = (SERVER_REGION as u64).saturating_sub(size) / 4096 + 1;
    // Outstanding ops by id: msg_bw the SendId, rpc the request id; (posted at, offset).
    let mut outstanding: std::collections::HashMap<u64, (u64, u64)> =
        std::collections::HashMap::with_capacity(a.qd * 2);
    let mut free_slots: Vec<usize> = (0..a.qd).rev().collect();
    let mut slot_of: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    let mut next_req = 1u64;
    let mut received = 0u64;
    let start = clock.now();
    let end = start + (a.duration * 1e9) as u64;
    let mut last = start;
    let mut done = Vec::new();
    let mut replies = VecDeque::new();
    loop {
        let now = clock.now();
        let stopping = now >= end || out.errors > 0;
        if stopping && outstanding.is_empty() {
            break;
        }
        if stopping && now > end + DRAIN_NS {
            out.error(format!(
                "{} op(s) outstanding {} s after the run ended",
                outstanding.len(),
                DRAIN_NS / 1_000_000_000
            ));
            break;
        }
        // Post while there is room.
        while !stopping && outstanding.len() < a.qd {
            let t = clock.now();
            let (msg, off, slot) = match a.test {
                Test::MsgBw => {
                    let mut front = vec![0u8; 16];
                    front[..8].copy_from_slice(&next_req.to_le_bytes());
                    front[8..].copy_from_slice(&size.to_le_bytes());
                    let (p, slot) = if a.size <= 4096 {
                        match m.alloc_chunk() {
                            Ok(mut c) => {
                                c.set_len(a.size);
                                c.as_mut_slice()[..8].copy_from_slice(&next_req.to_le_bytes());
                                (Payload::Chunk(c), None)
                            }
                            Err(e) => {
                                out.error(format!("alloc_chunk: {e}"));
                                break;
                            }
                        }
                    } else {
                        let slot = free_slots.pop().unwrap_or_default();
                        let b = &big[slot * a.size..(slot + 1) * a.size];
                        // SAFETY: `big` outlives the messenger (dropped after it) and is not
                        // written while sends name it.
                        (
                            unsafe { Payload::registered(b.as_ptr(), b.len()) },
                            Some(slot),
                        )
                    };
                    (OutMessage::new(MSG, front).with(p), 0, slot)
                }
                Test::RpcBw | Test::RpcLat => {
                    let off = (rng.next() % span) * 4096;
                    let mut front = vec![0u8; REQ_FRONT];
                    front[..8].copy_from_slice(&next_req.to_le_bytes());
                    front[8..16].copy_from_slice(&size.to_le_bytes());
                    front[16..24].copy_from_slice(&off.to_le_bytes());
                    (OutMessage::new(REQ, front), off, None)
                }
            };
            match m.send(s, msg) {
                Ok(id) => {
                    let key = if a.test == Test::MsgBw { id } else { next_req };
                    outstanding.insert(key, (t, off));
                    if let Some(slot) = slot {
                        slot_of.insert(key, slot);
                    }
                    next_req += 1;
                }
                Err(r) if r.kind() == rdmx::ErrorKind::Full => {
                    if let Some(slot) = slot {
                        free_slots.push(slot);
                    }
                    break;
                }
                Err(r) => {
                    out.error(format!("send: {r}"));
                    break;
                }
            }
        }
        // Progress and callbacks.
        let got = {
            let g = seen.0.lock().unwrap_or_else(|e| e.into_inner());
            !g.done.is_empty() || !g.replies.is_empty()
        };
        if !got {
            if workers {
                std::thread::yield_now();
            } else if let Err(e) = m.poll(IDLE_POLL) {
                out.error(format!("poll: {e}"));
            }
        }
        {
            let mut g = seen.0.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::swap(&mut done, &mut g.done);
            std::mem::swap(&mut replies, &mut g.replies);
            if let Some(r) = g.reset.take() {
                out.error(format!("session reset: {r}"));
            }
        }
        let t = clock.now();
        for (id, st) in done.drain(..) {
            if let Err(e) = st {
                out.error(format!("send {id}: {e}"));
            }
            if a.test == Test::MsgBw {
                if let Some((at, _)) = outstanding.remove(&id) {
                    hist.record(t.saturating_sub(at));
                    out.ops += 1;
                    last = t;
                }
                if let Some(slot) = slot_of.remove(&id) {
                    free_slots.push(slot);
                }
            }
        }
        for msg in replies.drain(..) {
            if msg.msg_type != REP || msg.front.len() < 8 {
                out.error(format!(
                    "unexpected message type {:#x} with a {}-byte front",
                    msg.msg_type,
                    msg.front.len()
                ));
                continue;
            }
            let mut idb = [0u8; 8];
            idb.copy_from_slice(&msg.front[..8]);
            let id = u64::from_le_bytes(idb);
            let Some((at, off)) = outstanding.remove(&id) else {
                out.error(format!("reply to unknown request {id}"));
                continue;
            };
            hist.record(t.saturating_sub(at));
            last = t;
            let len: usize = msg.data.iter().map(|d| d.len()).sum();
            if msg.data.len() != 1 || len != a.size {
                out.error(format!(
                    "reply {id}: {} segment(s), {len} bytes; expected 1 of {}",
                    msg.data.len(),
                    a.size
                ));
                continue;
            }
            received += 1;
            if received % a.verify == 0 {
                let mut at_off = off;
                let mut bad = None;
                for piece in msg.data[0].chunks() {
                    if let Some(i) = check_pattern(piece, at_off) {
                        bad = Some((at_off - off + i as u64, piece[i]));
                        break;
                    }
                    at_off += piece.len() as u64;
                }
                match bad {
                    None => out.verified += 1,
                    Some((i, b)) => out.error(format!(
                        "reply {id} (offset {off:#x}): byte {i} is {b:#04x}, expected {:#04x}",
                        pattern_byte(off + i)
                    )),
                }
            }
            out.ops += 1;
        }
    }
    out.elapsed_ns = last.saturating_sub(start).max(1);
    out
}

// ---- server ----

/// The server's messenger: swallows one-way messages, answers requests with the patterned
/// region's bytes (registered through the messenger's cache: no copy), queues replies the
/// session refuses (Full) until `on_send_ready`.
struct ServerSide {
    region: &'static [u8],
    pending: Mutex<std::collections::HashMap<SessionId, VecDeque<OutMessage>>>,
}

impl ServerSide {
    fn flush(&self, m: &Messenger, s: SessionId) {
        let mut g = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let Some(q) = g.get_mut(&s) else { return };
        while let Some(msg) = q.pop_front() {
            match m.send(s, msg) {
                Ok(_) => {}
                Err(r) if r.kind() == rdmx::ErrorKind::Full => {
                    q.push_front(*r.msg);
                    return;
                }
                Err(_) => {
                    q.clear();
                    break;
                }
            }
        }
        g.remove(&s);
    }
}

impl Dispatcher for ServerSide {
    fn on_message(&self, m: &Messenger, s: SessionId, msg: InMessage) {
        if msg.msg_type != REQ || msg.front.len() < 24 {
            return; // one-way: dropping it releases its chunks
        }
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&msg.front[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let (id, size, off) = (word(0), word(8) as usize, word(16) as usize);
        let size = size.min(MAX_REPLY);
        let off = off.min(self.region.len() - size);
        let data = &self.region[off..off + size];
        // SAFETY: the region is leaked (lives as long as the process) and never written.
        let p = unsafe { Payload::registered(data.as_ptr(), data.len()) };
        let reply = OutMessage::new(REP, id.to_le_bytes().to_vec()).with(p);
        let mut g = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(q) = g.get_mut(&s) {
            q.push_back(reply);
            return;
        }
        drop(g);
        if let Err(r) = m.send(s, reply)
            && r.kind() == rdmx::ErrorKind::Full
        {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(s)
                .or_default()
                .push_back(*r.msg);
        }
    }

    fn on_send_ready(&self, m: &Messenger, s: SessionId) {
        self.flush(m, s);
    }

    fn on_send_complete(
        &self,
        m: &Messenger,
        s: SessionId,
        _id: SendId,
        _st: rdmx::error::Result<()>,
    ) {
        if self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&s)
        {
            self.flush(m, s);
        }
    }

    fn on_reset(&self, _m: &Messenger, s: SessionId, _why: &rdmx::Error) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&s);
    }
}

/// Starts the server's messenger on `ip`, port 0 (one worker thread unless `msgr_threads`
/// is set). The messenger and its region live as long as the process.
pub fn serve(cfg: &Config, ip: std::net::IpAddr) -> Result<SocketAddr, String> {
    let mut cfg = cfg.clone();
    if cfg
        .source("msgr_threads")
        .is_ok_and(|s| s == rdmx::config::Source::Default)
    {
        cfg.set("msgr_threads", "1")
            .map_err(|e| format!("msgr_threads: {e}"))?;
    }
    let region: &'static mut [u8] = Box::leak(vec![0u8; SERVER_REGION].into_boxed_slice());
    fill_pattern(region, 0);
    let region: &'static [u8] = region;
    let d = Arc::new(ServerSide {
        region,
        pending: Mutex::new(std::collections::HashMap::new()),
    });
    let m = Messenger::new(&cfg, d).map_err(|e| format!("messenger: {e}"))?;
    // Registered once, as a daemon registers its cache: every reply is a slice of it, a
    // cache hit (a registration per reply pins and unpins pages: mlock/munlock per IO).
    crate::perf::ensure_memlock(2 * SERVER_REGION as u64 + (128 << 20));
    // SAFETY: the region is leaked (lives as long as the process) and never written again.
    let h = unsafe { m.mem_reg(region.as_ptr().cast_mut(), region.len()) }
        .map_err(|e| format!("messenger: register the region: {e}"))?;
    // Never given back: the registration stays referenced (not evictable) for the life of
    // the process, as the messenger.
    let _ = h;
    let addr = m
        .listen(&SocketAddr::new(ip, 0).to_string())
        .map_err(|e| format!("messenger listen: {e}"))?;
    // The server runs until killed: the messenger stays.
    std::mem::forget(m);
    Ok(addr)
}

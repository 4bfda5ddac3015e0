//! `rdmx-perf server`: serves every test until killed.
//!
//! One region of [`SERVER_REGION`] bytes, filled with the pattern (a function of the offset,
//! so clients verify READs without a copy of it) and registered LOCAL_WRITE | REMOTE_READ |
//! REMOTE_WRITE before the listener starts, so every handshake exposes it. WRITE clients
//! write the same pattern back (see `client.rs`), so the region keeps it.
//!
//! Each connection is served on its own thread, which keeps `max_recv_wr` receives posted
//! (reposted on completion) into a per-connection area, answers pings (a SEND whose first
//! byte is [`PING`]) with a SEND of the same size, and ends when the peer goes away. At
//! most `--max-conns` connections are served at once (default [`MAX_CONNS`]): one more is
//! closed as soon as it is set up, counted and logged at warn (`RDMX_LOG`), so a peer
//! opening connections in a loop costs the server at most that many threads, areas and
//! receive queues. Once
//! its receives are posted it sends the client a 1-byte SEND with immediate [`READY_IMM`]:
//! clients start only then (a SEND before the receives are posted meets RNR NAKs).
//! The server's tool defaults add `max_recv_wr = 4096` to the shared ones (soft_port = 0,
//! path_mtu = 4096); any user value wins.

use rdmx::msgr::{Connection, Context};
use rdmx::provider::SendReq;
use rdmx::provider::Wc;
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{QpState, Sge, SgeList, WcOpcode, WcStatus, WrOpcode, smallvec};
use std::io::Write;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::cli;
use crate::client::once_prefixed;
use crate::perf::{
    Clock, Fail, MAX_SEND, PING, PONG, READY_IMM, SERVER_REGION, Waiter, build_config, fill_pattern,
};

pub const USAGE: &str = "usage: rdmx-perf server --listen ADDR:PORT [--max-conns N] [--set KEY=VALUE]... [--profile NAME]";

/// Connections served at once by default (bench/scale.sh holds 1,000 idle ones).
pub const MAX_CONNS: usize = 1024;

/// `rdmx-perf server --help`.
pub const HELP: &str = "\
Serves read_bw, write_bw, send_bw, read_lat and send_lat clients until killed: exposes a
64 MiB patterned region (REMOTE_READ | REMOTE_WRITE), keeps max_recv_wr receives posted per
connection, answers send_lat pings and `rdmx-perf tune`'s stats requests (its CPU time,
stalls and the connection's counters). A messenger on a second port serves msg_bw, rpc_bw
and rpc_lat (one worker thread unless msgr_threads is set; clients learn its port from the
ready message of a connection to ADDR:PORT). Its first stdout line is
  rdmx-perf server listening on ADDR:PORT (provider ..., UDP ADDR:PORT, ..., messenger ADDR:PORT)
and each finished connection is summed up on stderr.

options:
  --listen ADDR:PORT  where to accept connections (port 0 = any free port; required)
  --max-conns N       connections served at once (default 1024); one more is closed at
                      once, counted and logged (warn). Each costs a thread, an 8 MiB area
                      and max_recv_wr posted receives
  --set KEY=VALUE     a configuration knob (`rdmx-perf config` lists them); repeatable
  --profile NAME      a configuration profile (e.g. ceph-after)

rdmx-perf defaults beneath the user's values: soft_port = 0, path_mtu = 4096 and, for the
server, max_recv_wr = 4096.
exit status (it runs until killed): 1 setup failed, 2 usage or configuration error.";

#[derive(Debug, clap::Parser)]
struct Args {
    #[arg(long, value_name = "ADDR:PORT", allow_hyphen_values = true)]
    listen: String,
    #[arg(long, allow_hyphen_values = true)]
    profile: Option<String>,
    #[arg(long = "set", value_parser = cli::set, allow_hyphen_values = true)]
    sets: Vec<(String, String)>,
    #[arg(long = "max-conns", value_parser = cli::count, default_value_t = MAX_CONNS)]
    max_conns: usize,
}

fn parse(args: &[String]) -> Result<Args, String> {
    cli::parse(args, USAGE)
}

/// Runs the server; returns only on a usage or setup error.
pub fn main(args: &[String]) -> Result<(), Fail> {
    let a = parse(args).map_err(Fail::Usage)?;
    // Deep receive queue by default: at a few hundred thousand SENDs/s, 4096 posted
    // receives give the reposting thread ~10 ms of slack before the sender meets RNR NAKs
    // (rnr_retry = 2 by default: three late reposts in a row end the connection).
    let mut extra = vec![(
        "max_recv_wr",
        SERVER_RECV_WR.to_string(),
        "the rdmx-perf server's default".to_string(),
    )];
    // RoCEv2 is received on the --listen address too, not on every address.
    if let Some(ip) = std::net::ToSocketAddrs::to_socket_addrs(a.listen.as_str())
        .ok()
        .and_then(|mut it| it.next())
        .map(|sa| sa.ip())
        .filter(|ip| !ip.is_unspecified())
    {
        extra.push((
            "soft_addr",
            ip.to_string(),
            "the rdmx-perf server's --listen address".to_string(),
        ));
    }
    let cfg = build_config(a.profile.as_deref(), &a.sets, &extra).map_err(Fail::Usage)?;
    // Best effort; if pinning is refused, registration says so.
    crate::perf::ensure_memlock(SERVER_REGION as u64 + (64 << 20));
    let ctx = Context::new(&cfg).map_err(|e| Fail::Run(format!("context: {e}")))?;
    // The region lives as long as the process (the server runs until killed).
    let region: &'static mut [u8] = Box::leak(vec![0u8; SERVER_REGION].into_boxed_slice());
    fill_pattern(region, 0);
    // SAFETY: `region` is leaked: valid for the life of the process; only the engine writes
    // it after this point (clients' WRITEs, which carry the same pattern).
    let mr = unsafe {
        ctx.register(
            region.as_mut_ptr(),
            region.len(),
            access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE,
        )
    }
    .map_err(|e| Fail::Run(format!("register {} MiB: {e}", SERVER_REGION >> 20)))?;
    let listener = ctx
        .listen(&a.listen)
        .map_err(|e| Fail::Run(once_prefixed("listen on", &a.listen, &e.to_string())))?;
    // The messenger tests (msg_bw, rpc_bw, rpc_lat) on a second port, told to clients in
    // the ready message.
    let msgr = match crate::msgr_bench::serve(&cfg, listener.local_addr().ip()) {
        Ok(a) => {
            MSGR_PORT.store(a.port(), Ordering::Relaxed);
            a.to_string()
        }
        Err(e) => {
            eprintln!("rdmx-perf server: no messenger tests: {e}");
            "none".to_string()
        }
    };
    let s = ctx.settings();
    println!(
        "rdmx-perf server listening on {} (provider {}, UDP {}, region {} MiB rkey {:#x}, path_mtu {}, progress {:?}, poll_mode {:?}, messenger {msgr})",
        listener.local_addr(),
        ctx.provider(),
        ctx.udp_addr_for(listener.local_addr().ip())
            .map_or_else(|| "none".to_string(), |u| u.to_string()),
        SERVER_REGION >> 20,
        mr.rkey,
        s.path_mtu.bytes(),
        s.progress,
        s.poll_mode,
    );
    let _ = std::io::stdout().flush();
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let refused = AtomicU64::new(0);
    loop {
        match listener.accept(None) {
            Ok(conn) => {
                let id = NEXT.fetch_add(1, Ordering::Relaxed);
                let peer = conn.peer();
                if ACTIVE.load(Ordering::Acquire) >= a.max_conns {
                    let n = refused.fetch_add(1, Ordering::Relaxed) + 1;
                    // The first refusals each, then one line per 1,000: a peer in a loop
                    // does not flood the log.
                    if n <= 10 || n % 1000 == 0 {
                        log::warn!(
                            "rdmx-perf server: connection {id} from {peer} refused: {} \
                             connections served already (--max-conns); {n} refused so far",
                            a.max_conns
                        );
                    }
                    drop(conn);
                    continue;
                }
                log::info!("rdmx-perf server: connection {id} from {peer}");
                ACTIVE.fetch_add(1, Ordering::AcqRel);
                let slot = Slot;
                let ctx = ctx.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("serve-{id}"))
                    .spawn(move || {
                        let _slot = slot;
                        serve(&ctx, conn, id)
                    });
                if let Err(e) = spawned {
                    eprintln!("rdmx-perf server: connection {id}: no thread: {e}");
                }
            }
            Err(e) => {
                eprintln!("rdmx-perf server: accept: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The context's port counters, for the per-connection lines: hostile or stray traffic
/// that never reached a QP's engine (cumulative for the server process).
fn port_drops(ctx: &Context) -> String {
    let p = ctx.port_counters();
    format!(
        "port drops (this server, all connections): {} unknown QPN, {} wrong source, {} bad ICRC, {} malformed, {} truncated, {} kernel",
        p.unknown_qpn, p.wrong_source, p.bad_icrc, p.malformed, p.truncated, p.kernel_drops
    )
}

/// Connections being served (threads running `serve`).
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// A served connection's place in [`ACTIVE`], given back when its thread ends (also when
/// the thread could not start: the closure, and with it the slot, is dropped).
struct Slot;

impl Drop for Slot {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The messenger's TCP port (0: none), sent in every connection's ready message.
static MSGR_PORT: AtomicU16 = AtomicU16::new(0);

/// The server's default receive queue depth (user-overridable).
pub const SERVER_RECV_WR: u32 = 4096;

/// Per-connection memory: receives land in the first half, answers go from the second;
/// the ready message's payload follows, then the stats answer (`rdmx-perf tune`).
const AREA: usize = 2 * MAX_SEND + READY_LEN + crate::tune::stats::ANSWER_LEN;
/// Where the stats answer is written in the area.
const STATS_AT: usize = 2 * MAX_SEND + READY_LEN;
/// The ready message: `MSGR`, the messenger's port (u16 LE), 2 bytes of padding.
const READY_LEN: usize = 8;

fn serve(ctx: &Context, conn: Connection, id: u64) {
    let peer = conn.peer();
    let mut area = vec![0u8; AREA];
    area[MAX_SEND..2 * MAX_SEND].fill(PONG);
    area[2 * MAX_SEND..2 * MAX_SEND + 4].copy_from_slice(crate::msgr_bench::READY_MSGR);
    area[2 * MAX_SEND + 4..2 * MAX_SEND + 6]
        .copy_from_slice(&MSGR_PORT.load(Ordering::Relaxed).to_le_bytes());
    let base = area.as_mut_ptr();
    // SAFETY: `area` outlives the registration: it is deregistered below, after the
    // connection is dropped (which flushes every WR naming it).
    let mr = match unsafe { ctx.register(base, AREA, access::LOCAL_WRITE) } {
        Ok(m) => m,
        Err(e) => {
            eprintln!("rdmx-perf server: connection {id} from {peer}: register: {e}");
            return;
        }
    };
    let stats = run(ctx, &conn, mr.addr, mr.lkey, base);
    let c = conn.counters();
    match stats {
        Ok((recvs, pings)) => eprintln!(
            "rdmx-perf server: connection {id} from {peer} done: {recvs} receives, {pings} pings answered; packets tx {} rx {}, {} retransmits, {} duplicates received, {} out of sequence, {} seq_naks sent, {} rnr_naks sent, {} ack_timeouts, {} icrc errors, {} malformed, {} injected drops; this process stalled {} times for {:.1} ms (longest {:.1} ms); {}",
            c.tx_packets,
            c.rx_packets,
            c.retransmits,
            c.duplicates_received,
            c.out_of_sequence,
            c.seq_naks_sent,
            c.rnr_naks_sent,
            c.ack_timeouts,
            c.icrc_errors,
            c.malformed,
            conn.injected_drops(),
            conn.progress_stats().stalls,
            conn.progress_stats().stalled_ns as f64 / 1e6,
            conn.progress_stats().max_stall_ns as f64 / 1e6,
            port_drops(ctx),
        ),
        Err(e) => eprintln!(
            "rdmx-perf server: connection {id} from {peer}: {e}; {}",
            port_drops(ctx)
        ),
    }
    drop(conn);
    // The WRs naming the area are flushed by now; retry briefly in case one is finishing.
    for _ in 0..100 {
        if ctx.deregister(mr.lkey).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(area);
}

/// Cookies: receives are `RECV_TAG | i`, answers `PONG_TAG`.
const RECV_TAG: u64 = 1 << 63;
const PONG_TAG: u64 = 1 << 62;

fn run(
    ctx: &Context,
    conn: &Connection,
    addr: u64,
    lkey: u32,
    base: *mut u8,
) -> Result<(u64, u64), String> {
    let s = ctx.settings();
    let recv_sge = smallvec![Sge {
        addr,
        length: MAX_SEND as u32,
        lkey,
    }];
    let nrecv = s.max_recv_wr as usize;
    let wrs: Vec<(u64, SgeList)> = (0..nrecv as u64)
        .map(|i| (RECV_TAG | i, recv_sge.clone()))
        .collect();
    let mut posted = 0;
    while posted < wrs.len() {
        posted += conn
            .post_recv(&wrs[posted..])
            .map_err(|e| format!("post_recv: {e}"))?;
    }
    // Tell the client its receives are in place: the handshake completes before this thread
    // can post any, and a SEND arriving before them meets RNR NAKs (three end the QP with
    // the default rnr_retry = 2). The client posted its receive for this right after
    // connecting, well before this point.
    let ready = SendReq {
        cookie: PONG_TAG,
        opcode: WrOpcode::Send,
        flags: send_flags::SIGNALED,
        sges: smallvec![Sge {
            addr: addr + 2 * MAX_SEND as u64,
            length: READY_LEN as u32,
            lkey,
        }],
        remote_addr: 0,
        rkey: 0,
        imm: READY_IMM,
    };
    let mut answers: Vec<SendReq> = vec![SendReq {
        opcode: WrOpcode::SendWithImm,
        ..ready
    }];
    let clock = Clock::new();
    let mut waiter = Waiter::new(s);
    let mut wcs = vec![empty_wc(); s.poll_batch.max(16) as usize];
    let (mut recvs, mut pings) = (0u64, 0u64);
    let mut reposts: Vec<(u64, SgeList)> = Vec::with_capacity(wcs.len());
    // Answers not yet posted (the send queue was full) are posted first on the next pass.
    loop {
        if !answers.is_empty() {
            match conn.post_send(&answers) {
                Ok(k) => drop(answers.drain(..k)),
                Err(e) if e.kind() == rdmx::ErrorKind::Full => {}
                Err(e) if e.kind() == rdmx::ErrorKind::Closed => return Ok((recvs, pings)),
                Err(e) => return Err(format!("post_send: {e}")),
            }
        }
        let n = conn.poll(&mut wcs);
        if n == 0 {
            if conn.qp_state() == QpState::Err {
                return Ok((recvs, pings));
            }
            let max_sleep = if answers.is_empty() {
                Duration::from_millis(100)
            } else {
                Duration::from_millis(1)
            };
            waiter.idle(conn, clock.now(), max_sleep);
            continue;
        }
        waiter.busy();
        reposts.clear();
        for wc in &wcs[..n] {
            if wc.status == WcStatus::WrFlushErr {
                return Ok((recvs, pings)); // the peer went away
            }
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "completion {:?} for {:?} (cookie {:#x})",
                    wc.status, wc.opcode, wc.cookie
                ));
            }
            if wc.opcode != WcOpcode::Recv {
                continue; // an answer was acknowledged
            }
            recvs += 1;
            let first = if wc.byte_len > 0 {
                // SAFETY: the receive completed, so the engine wrote its first byte; nothing
                // writes the area while we read one byte (the next SEND needs a new receive,
                // which is reposted below, after this read).
                unsafe { base.read_volatile() }
            } else {
                0
            };
            reposts.push((wc.cookie, recv_sge.clone()));
            if first == crate::tune::stats::REQUEST {
                // `rdmx-perf tune` asks for this process's CPU time, stalls and this
                // connection's counters (one request outstanding at a time per connection).
                let answer = crate::tune::stats::answer(ctx, conn);
                // SAFETY: the stats slot is inside the registered area and no WR names it
                // now: the client sends its next request only after this answer arrived.
                unsafe {
                    std::ptr::copy_nonoverlapping(answer.as_ptr(), base.add(STATS_AT), answer.len())
                };
                answers.push(SendReq {
                    cookie: PONG_TAG,
                    opcode: WrOpcode::SendWithImm,
                    flags: send_flags::SIGNALED,
                    sges: smallvec![Sge {
                        addr: addr + STATS_AT as u64,
                        length: answer.len() as u32,
                        lkey,
                    }],
                    remote_addr: 0,
                    rkey: 0,
                    imm: crate::tune::stats::ANSWER_IMM,
                });
            } else if first == PING {
                pings += 1;
                answers.push(SendReq {
                    cookie: PONG_TAG,
                    opcode: WrOpcode::Send,
                    flags: send_flags::SIGNALED,
                    sges: smallvec![Sge {
                        addr: addr + MAX_SEND as u64,
                        length: wc.byte_len,
                        lkey,
                    }],
                    remote_addr: 0,
                    rkey: 0,
                    imm: 0,
                });
            }
        }
        let mut done = 0;
        while done < reposts.len() {
            match conn.post_recv(&reposts[done..]) {
                Ok(k) => done += k,
                Err(e) if e.kind() == rdmx::ErrorKind::Closed => return Ok((recvs, pings)),
                Err(e) => return Err(format!("post_recv: {e}")),
            }
        }
    }
}

pub fn empty_wc() -> Wc {
    Wc::EMPTY
}

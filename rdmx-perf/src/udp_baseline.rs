//! The UDP baseline: what this host's loopback path carries with the same batching as the
//! soft provider and none of its reliability.
//!
//! `udp_server` answers every 64-byte request with a 4096-byte reply: the request's first 16
//! bytes, then the bytes of the 4K block the request names in a 64 MiB patterned region
//! (the same region size and random 4K-aligned offsets as `read_bw`, so the baseline pays
//! the same memory traffic a 4K random read does). `udp_read` keeps `qd` requests in flight; both sides use the soft
//! provider's `UdpPort` (sendmmsg / recvmmsg batches). Nothing is retransmitted: a slot whose
//! reply has not come within [`LOSS_TIMEOUT_NS`] counts as lost and is reused (a late reply
//! is recognised by its sequence number and ignored).
//!
//! Both sides use the soft provider's offloads too (GSO on send, GRO on receive), so the
//! baseline is what the same batching can carry.
//!
//! Both sides wait like the soft provider's default: the server as its progress thread
//! (drain the socket, then sleep in ppoll), the client as `poll_mode=adaptive` (spin the
//! default `polling_us` on empty receives, then sleep in ppoll).

use rdmx::provider::soft::udp_baseline::{RxBatch, TxDatagram, UdpPort, poll_readable};
use std::io::Write;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use crate::cli;
use crate::perf::{Clock, Fail, Histogram, Report, Rng, SERVER_REGION, exit_status, fill_pattern};

pub const SERVER_USAGE: &str = "usage: rdmx-perf udp_server --listen ADDR:PORT [--no-offload]";
pub const CLIENT_USAGE: &str = "usage: rdmx-perf udp_read --connect ADDR:PORT [--qd N (32)] [--duration SECONDS (5)] [--no-offload] [--json]";

/// `rdmx-perf udp_server --help`.
pub const SERVER_HELP: &str = "\
The UDP baseline's server: answers every 64-byte request with a 4096-byte reply (a block of
a 64 MiB patterned region), with the soft provider's batching (sendmmsg/recvmmsg) and
offloads (GSO/GRO), and no reliability. Runs until killed; its first stdout line is
  rdmx-perf udp_server listening on ADDR:PORT (...)

options:
  --listen ADDR:PORT  the UDP address to bind (port 0 = any free port; required)
  --no-offload        plain sendmmsg/recvmmsg, without GSO/GRO

exit status (it runs until killed): 1 setup failed, 2 usage error.";

/// `rdmx-perf udp_read --help`.
pub const CLIENT_HELP: &str = "\
The UDP baseline's client: keeps --qd 64-byte requests for random 4K blocks in flight to
`rdmx-perf udp_server` for --duration seconds; a reply not back within 50 ms counts as lost
(nothing is retransmitted). read_bw is compared with this.

options:
  --connect ADDR:PORT  the udp_server's address (required)
  --qd N               requests in flight, 1..=4096 (default 32)
  --duration SECONDS   how long to run, in (0, 3600] (default 5)
  --no-offload         plain sendmmsg/recvmmsg, without GSO/GRO
  --json               stdout is one JSON object only; the table goes to stderr

output: as read_bw's (ops_per_sec, bw_gbit_per_sec, bw_mib_per_sec, lat_*_us), and lost,
stale_replies, bad_replies.
exit status: 0 replies came, 1 no reply or a socket error, 2 usage error.";

const REQ_LEN: usize = 64;
const REPLY_LEN: usize = 4096;
/// Echoed request header: magic, slot, sequence.
const HDR_LEN: usize = 16;
/// The requested block's offset follows the header in a request.
const OFF_END: usize = HDR_LEN + 8;
const MAGIC: u32 = 0x5544_5052; // "UDPR"
/// A reply not back within this is lost. Long enough for a server that a busy host did not
/// schedule for a while (docs/busy-hosts.md: tens of ms), so only real losses count.
const LOSS_TIMEOUT_NS: u64 = 500_000_000;
/// Empty receives are spun this long before sleeping: poll_mode=adaptive's default
/// `polling_us`, so both sides of the comparison wait alike.
fn spin_ns() -> u64 {
    rdmx::Config::new()
        .settings()
        .map_or(100_000, |s| u64::from(s.polling_us) * 1000)
}
const BATCH: usize = 64;

fn resolve(a: &str) -> Result<SocketAddr, String> {
    a.to_socket_addrs()
        .map_err(|e| format!("address '{a}': {e}"))?
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| format!("address '{a}': no IPv4 address"))
}

/// `udp_server --listen ADDR:PORT`: runs until killed (returns only on a usage or setup
/// error).
/// `udp_server`'s options.
#[derive(Debug, clap::Parser)]
struct ServerArgs {
    #[arg(long, value_name = "ADDR:PORT", allow_hyphen_values = true)]
    listen: String,
    #[arg(long)]
    no_offload: bool,
}

/// `udp_read`'s options.
#[derive(Debug, clap::Parser)]
struct ClientArgs {
    #[arg(long, value_name = "ADDR:PORT", allow_hyphen_values = true)]
    connect: String,
    #[arg(long, value_parser = cli::qd, default_value = "32", allow_hyphen_values = true)]
    qd: usize,
    #[arg(long, value_parser = cli::duration, default_value = "5", allow_hyphen_values = true)]
    duration: f64,
    #[arg(long)]
    json: bool,
    #[arg(long)]
    no_offload: bool,
}

pub fn server(args: &[String]) -> Result<(), Fail> {
    let ServerArgs { listen, no_offload } = cli::parse(args, SERVER_USAGE).map_err(Fail::Usage)?;
    let offload = !no_offload;
    let addr = resolve(&listen).map_err(Fail::Usage)?;
    let port = UdpPort::bind(addr).map_err(|e| Fail::Run(format!("bind UDP {addr}: {e}")))?;
    println!(
        "rdmx-perf udp_server listening on {} ({REQ_LEN}-byte requests, {REPLY_LEN}-byte replies)",
        port.local_addr()
    );
    let _ = std::io::stdout().flush();
    let region: Vec<u8> = {
        let mut r = vec![0u8; SERVER_REGION];
        fill_pattern(&mut r, 0);
        r
    };
    // The same offloads as the soft provider (GRO on receive, GSO on send) unless
    // --no-offload asks for plain sendmmsg/recvmmsg only.
    if offload {
        port.enable_gro();
    }
    let mut rx = RxBatch::for_gro(BATCH);
    let mut ready = Vec::new();
    let mut hdrs: Vec<([u8; HDR_LEN], usize, SocketAddr)> = Vec::with_capacity(BATCH);
    loop {
        let n = port
            .recv_batch(&mut rx)
            .map_err(|e| Fail::Run(format!("recv: {e}")))?;
        if n == 0 {
            let _ = poll_readable(&[port.raw_fd()], Duration::from_millis(100), &mut ready);
            continue;
        }
        hdrs.clear();
        for d in rx.iter() {
            if d.data.len() >= OFF_END {
                let mut h = [0u8; HDR_LEN];
                h.copy_from_slice(&d.data[..HDR_LEN]);
                let off = u64::from_le_bytes(d.data[HDR_LEN..OFF_END].try_into().unwrap_or([0; 8]));
                // Any offset the client names is clamped into the region.
                let off = (off as usize).min(SERVER_REGION - REPLY_LEN) & !(REPLY_LEN - 1);
                hdrs.push((h, off, d.src));
            }
        }
        let batch: Vec<TxDatagram<'_>> = hdrs
            .iter()
            .map(|(h, off, src)| TxDatagram {
                dst: *src,
                parts: [&h[..], &region[off + HDR_LEN..off + REPLY_LEN], &[]],
            })
            .collect();
        let mut sent = 0;
        // Bounded retries when the send buffer is full; what is still unsent is lost.
        for _ in 0..1000 {
            if sent == batch.len() {
                break;
            }
            let r = if offload {
                port.send_batch_gso(&batch[sent..])
            } else {
                port.send_batch(&batch[sent..])
            };
            match r {
                Ok(0) => std::thread::yield_now(),
                Ok(k) => sent += k,
                Err(_) => sent += 1, // that datagram cannot be sent: drop it
            }
        }
    }
}

/// `udp_read --connect ADDR:PORT --qd N --duration S [--json]`.
pub fn client(args: &[String]) -> ExitCode {
    exit_status(client_run(args), "rdmx-perf: udp_read")
}

fn client_run(args: &[String]) -> Result<(), Fail> {
    let ClientArgs {
        connect,
        qd,
        duration,
        json,
        no_offload,
    } = cli::parse(args, CLIENT_USAGE).map_err(Fail::Usage)?;
    let offload = !no_offload;
    let server = resolve(&connect).map_err(Fail::Usage)?;
    let local: SocketAddr = if server.ip().is_loopback() {
        "127.0.0.1:0"
    } else {
        "0.0.0.0:0"
    }
    .parse()
    .map_err(|e| Fail::Run(format!("{e}")))?;
    let port = UdpPort::bind(local).map_err(|e| Fail::Run(format!("bind UDP {local}: {e}")))?;

    let clock = Clock::new();
    let mut hist = Histogram::new();
    let mut seq = vec![0u64; qd];
    let mut posted_at = vec![0u64; qd];
    let mut in_flight = vec![false; qd];
    let mut free: Vec<usize> = (0..qd).rev().collect();
    let mut reqs = vec![[0u8; REQ_LEN]; qd];
    if offload {
        port.enable_gro();
    }
    let mut rx = RxBatch::for_gro(BATCH);
    let mut ready = Vec::new();
    let (mut ops, mut lost, mut stale, mut bad) = (0u64, 0u64, 0u64, 0u64);
    let mut next_seq = 1u64;
    let mut rng = Rng::new(clock.now() ^ u64::from(std::process::id()));
    let start = clock.now();
    let end = start + (duration * 1e9) as u64;
    let mut last = start;
    let spin = spin_ns();
    let mut idle_since: Option<u64> = None;
    let mut next_scan = start + 1_000_000;
    loop {
        let now = clock.now();
        let stopping = now >= end;
        if stopping && free.len() == qd {
            break;
        }
        if stopping && now > end + 2 * LOSS_TIMEOUT_NS {
            break;
        }
        // Send a request for every free slot, in one batch.
        if !stopping && !free.is_empty() {
            let slots: Vec<usize> = std::mem::take(&mut free);
            for &s in &slots {
                seq[s] = next_seq;
                next_seq += 1;
                let r = &mut reqs[s];
                r[0..4].copy_from_slice(&MAGIC.to_le_bytes());
                r[4..8].copy_from_slice(&(s as u32).to_le_bytes());
                r[8..16].copy_from_slice(&seq[s].to_le_bytes());
                let block = rng.next() % (SERVER_REGION / REPLY_LEN) as u64;
                r[HDR_LEN..OFF_END].copy_from_slice(&(block * REPLY_LEN as u64).to_le_bytes());
            }
            let batch: Vec<TxDatagram<'_>> = slots
                .iter()
                .map(|&s| TxDatagram {
                    dst: server,
                    parts: [&reqs[s][..], &[], &[]],
                })
                .collect();
            let sent = if offload {
                port.send_batch_gso(&batch)
            } else {
                port.send_batch(&batch)
            }
            .map_err(|e| Fail::Run(format!("send: {e}")))?;
            let t = clock.now();
            for &s in &slots[..sent] {
                posted_at[s] = t;
                in_flight[s] = true;
            }
            free.extend_from_slice(&slots[sent..]);
        }
        let n = port
            .recv_batch(&mut rx)
            .map_err(|e| Fail::Run(format!("recv: {e}")))?;
        let t = clock.now();
        for d in rx.iter() {
            let b = d.data;
            if b.len() != REPLY_LEN || b[0..4] != MAGIC.to_le_bytes() {
                bad += 1;
                continue;
            }
            let s = u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize;
            let q = u64::from_le_bytes(b[8..16].try_into().unwrap_or([0; 8]));
            if s >= qd || !in_flight[s] || seq[s] != q {
                stale += 1;
                continue;
            }
            in_flight[s] = false;
            hist.record(t - posted_at[s]);
            ops += 1;
            last = t;
            free.push(s);
        }
        if t >= next_scan {
            next_scan = t + 1_000_000;
            for s in 0..qd {
                if in_flight[s] && t - posted_at[s] > LOSS_TIMEOUT_NS {
                    in_flight[s] = false;
                    lost += 1;
                    free.push(s);
                }
            }
        }
        if n > 0 || !free.is_empty() && !stopping {
            idle_since = None;
            continue;
        }
        let since = *idle_since.get_or_insert(t);
        if t - since >= spin {
            let _ = poll_readable(&[port.raw_fd()], Duration::from_millis(1), &mut ready);
        } else {
            std::hint::spin_loop();
        }
    }
    let secs = last.saturating_sub(start).max(1) as f64 / 1e9;
    let ops_per_sec = ops as f64 / secs;
    let mut r = Report::new("udp_read");
    r.str("server", server.to_string());
    r.int("size", REPLY_LEN as u64);
    r.int("request_size", REQ_LEN as u64);
    r.str(
        "offload",
        if offload { "gso+gro" } else { "none" }.to_string(),
    );
    r.int("qd", qd as u64);
    r.num("duration_s", secs, 3);
    r.int("ops", ops);
    r.num("ops_per_sec", ops_per_sec, 1);
    r.bandwidth(ops_per_sec, REPLY_LEN as u64);
    r.latency(&hist);
    r.int("lost", lost);
    r.int("stale_replies", stale);
    r.int("bad_replies", bad);
    r.int("kernel_drops", port.kernel_drops());
    r.print(json);
    if ops == 0 {
        return Err(Fail::Run(format!(
            "no reply from {server} (is `rdmx-perf udp_server` running there?)"
        )));
    }
    Ok(())
}

//! Per-process rdmx counters written to a file, for harnesses that run many verbs
//! processes (ceph-harness: every daemon and client under `rdmx-ibv exec`) and must show
//! that the bytes went over rdmx.
//!
//! Off unless the environment names a directory in `RDMXIBV_STATS_DIR` (not an `RDMX_*`
//! name: those are rdmx configuration keys). When set, the first device opened starts a
//! thread that writes `DIR/rdmx-<ip>-<pid>.stats` every 500 ms and at exit (`atexit`), so a
//! process killed with SIGKILL leaves its last snapshot. The file is `key value` lines:
//! the QP counters summed over every QP the process ever had (live ones read now,
//! destroyed ones folded in at destroy), the device's `qp_override` count, port drops,
//! progress stalls, work completions by status, and the first error completions (time,
//! QP, peer, status) so a harness can tell when the QPs to a peer reported
//! RETRY_EXC_ERR.
//!
//! Cost when off: one `OnceLock` read per QP create/destroy and per error completion.

use parking_lot::Mutex;
use rdmx::provider::soft::qp::SoftQp;
use rdmx::rc::Counters;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::device::Device;

/// The environment variable naming the directory.
pub const STATS_DIR_VAR: &str = "RDMXIBV_STATS_DIR";
/// Error completions kept with their time (the first ones: enough to see when each QP
/// failed; later ones are only counted).
const MAX_EVENTS: usize = 256;
const PERIOD: Duration = Duration::from_millis(500);

struct Registry {
    dir: PathBuf,
    live: Mutex<Vec<(u32, Weak<SoftQp>)>>,
    retired: Mutex<Counters>,
    created: AtomicU64,
    completions: AtomicU64,
    /// Error completions by `enum ibv_wc_status` (1..=21; larger values counted in 22).
    statuses: [AtomicU64; 23],
    events: Mutex<Vec<String>>,
    device: Mutex<Weak<Device>>,
    /// The device's lines as last rendered while it was open (kept after it closes).
    device_lines: Mutex<String>,
    started: OnceLock<()>,
}

fn registry() -> Option<&'static Registry> {
    static REG: OnceLock<Option<Registry>> = OnceLock::new();
    REG.get_or_init(|| {
        let dir = std::env::var_os(STATS_DIR_VAR).filter(|d| !d.is_empty())?;
        Some(Registry {
            dir: PathBuf::from(dir),
            live: Mutex::new(Vec::new()),
            retired: Mutex::new(Counters::default()),
            created: AtomicU64::new(0),
            completions: AtomicU64::new(0),
            statuses: std::array::from_fn(|_| AtomicU64::new(0)),
            events: Mutex::new(Vec::new()),
            device: Mutex::new(Weak::new()),
            device_lines: Mutex::new(String::new()),
            started: OnceLock::new(),
        })
    })
    .as_ref()
}

/// A device was opened: starts the writer (once per process).
pub(crate) fn device_opened(dev: &Arc<Device>) {
    let Some(r) = registry() else { return };
    *r.device.lock() = Arc::downgrade(dev);
    r.started.get_or_init(|| {
        if let Err(e) = std::fs::create_dir_all(&r.dir) {
            log::warn!(target: "rdmx::ibv", "{STATS_DIR_VAR}={}: {e}", r.dir.display());
        }
        let spawned = std::thread::Builder::new()
            .name("rdmx-stats".into())
            .spawn(move || {
                loop {
                    write(r);
                    std::thread::sleep(PERIOD);
                }
            });
        if let Err(e) = spawned {
            log::warn!(target: "rdmx::ibv", "stats writer thread: {e}");
        }
        extern "C" fn at_exit() {
            if let Some(r) = registry() {
                write(r);
            }
        }
        // SAFETY: registers a plain extern "C" function without arguments.
        unsafe { libc::atexit(at_exit) };
    });
}

pub(crate) fn qp_created(qp: &Arc<SoftQp>) {
    let Some(r) = registry() else { return };
    r.created.fetch_add(1, Ordering::Relaxed);
    r.live.lock().push((qp.qpn(), Arc::downgrade(qp)));
}

pub(crate) fn qp_destroyed(qp: &SoftQp) {
    let Some(r) = registry() else { return };
    let c = qp.counters();
    add(&mut r.retired.lock(), &c);
    let qpn = qp.qpn();
    r.live
        .lock()
        .retain(|(n, w)| *n != qpn && w.strong_count() > 0);
}

/// A polled completion with a status other than success.
pub(crate) fn wc_error(status: u32, qpn: u32) {
    let Some(r) = registry() else { return };
    r.statuses[(status as usize).min(22)].fetch_add(1, Ordering::Relaxed);
    // Flushes follow every error; keep the first error of other kinds with its time.
    if status == 5 {
        return;
    }
    let peer: Option<IpAddr> = r
        .live
        .lock()
        .iter()
        .find(|(n, _)| *n == qpn)
        .and_then(|(_, w)| w.upgrade())
        .and_then(|q| q.peer_source().0);
    let mut ev = r.events.lock();
    if ev.len() < MAX_EVENTS {
        let peer = peer.map_or_else(|| "-".to_string(), |p| p.to_string());
        ev.push(format!("{} {qpn:#x} {peer} {status}", unix_ms()));
    }
}

/// Completions polled (errors are also counted by status in [`wc_error`]).
pub(crate) fn wc_polled(n: usize) {
    let Some(r) = registry() else { return };
    if n > 0 {
        r.completions.fetch_add(n as u64, Ordering::Relaxed);
    }
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn add(t: &mut Counters, c: &Counters) {
    t.tx_packets += c.tx_packets;
    t.tx_bytes += c.tx_bytes;
    t.rx_packets += c.rx_packets;
    t.rx_bytes += c.rx_bytes;
    t.retransmits += c.retransmits;
    t.seq_naks_sent += c.seq_naks_sent;
    t.seq_naks_received += c.seq_naks_received;
    t.rnr_naks_sent += c.rnr_naks_sent;
    t.rnr_naks_received += c.rnr_naks_received;
    t.ack_timeouts += c.ack_timeouts;
    t.duplicates_received += c.duplicates_received;
    t.out_of_sequence += c.out_of_sequence;
    t.icrc_errors += c.icrc_errors;
    t.malformed += c.malformed;
}

fn render(r: &Registry) -> String {
    let mut total = *r.retired.lock();
    let live: Vec<Arc<SoftQp>> = r
        .live
        .lock()
        .iter()
        .filter_map(|(_, w)| w.upgrade())
        .collect();
    for q in &live {
        add(&mut total, &q.counters());
    }
    let mut s = String::new();
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
    let _ = writeln!(s, "pid {}", std::process::id());
    let _ = writeln!(s, "comm {}", comm.trim());
    let _ = writeln!(s, "time_ms {}", unix_ms());
    let _ = writeln!(s, "qps_created {}", r.created.load(Ordering::Relaxed));
    let _ = writeln!(s, "qps_live {}", live.len());
    let _ = writeln!(s, "completions {}", r.completions.load(Ordering::Relaxed));
    let t = &total;
    for (k, v) in [
        ("tx_packets", t.tx_packets),
        ("tx_bytes", t.tx_bytes),
        ("rx_packets", t.rx_packets),
        ("rx_bytes", t.rx_bytes),
        ("retransmits", t.retransmits),
        ("seq_naks_sent", t.seq_naks_sent),
        ("seq_naks_received", t.seq_naks_received),
        ("rnr_naks_sent", t.rnr_naks_sent),
        ("rnr_naks_received", t.rnr_naks_received),
        ("ack_timeouts", t.ack_timeouts),
        ("duplicates_received", t.duplicates_received),
        ("out_of_sequence", t.out_of_sequence),
        ("icrc_errors", t.icrc_errors),
    ] {
        let _ = writeln!(s, "{k} {v}");
    }
    if let Some(d) = r.device.lock().upgrade() {
        let ds = d.stats();
        let pc = d.soft().port_counters();
        let ps = d.soft().progress_stats();
        let mut l = String::new();
        let _ = writeln!(l, "ip {}", d.ip());
        let _ = writeln!(l, "qp_overrides {}", ds.qp_overrides);
        let _ = writeln!(l, "async_events {}", ds.async_events);
        let _ = writeln!(l, "port_unknown_qpn {}", pc.unknown_qpn);
        let _ = writeln!(l, "port_kernel_drops {}", pc.kernel_drops);
        let _ = writeln!(l, "progress_stalls {}", ps.stalls);
        let _ = writeln!(l, "progress_max_stall_ns {}", ps.max_stall_ns);
        *r.device_lines.lock() = l;
    }
    s.push_str(&r.device_lines.lock());
    // Process-wide, so current at exit too (the device's lines are as last rendered).
    let _ = writeln!(
        s,
        "cq_event_spun {}",
        crate::glue::cq_event::SPUN.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        s,
        "cq_event_waits {}",
        crate::glue::cq_event::WAITS.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        s,
        "cq_event_waits_received {}",
        crate::glue::cq_event::WAITS_RECEIVED.load(Ordering::Relaxed)
    );
    for (i, c) in r.statuses.iter().enumerate() {
        let v = c.load(Ordering::Relaxed);
        if v > 0 {
            let _ = writeln!(s, "wc_status_{i} {v}");
        }
    }
    for e in r.events.lock().iter() {
        let _ = writeln!(s, "wc_error {e}");
    }
    s
}

fn write(r: &Registry) {
    let text = render(r);
    let ip = text
        .lines()
        .find_map(|l| l.strip_prefix("ip "))
        .unwrap_or("none");
    let name = format!("rdmx-{ip}-{}.stats", std::process::id());
    let path = r.dir.join(&name);
    let tmp = r.dir.join(format!(".{name}.tmp"));
    if std::fs::write(&tmp, &text).is_ok() {
        let _ = std::fs::rename(&tmp, &path);
    }
}

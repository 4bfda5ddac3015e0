//! The soft device: a UDP port per IP family (IPv4, and IPv6 where the host has it) that
//! receives every QP's RoCEv2 traffic of that family, the memory
//! regions, the QPs, and the progress engine that feeds received packets to QPs, fires
//! their timers (whether or not the application polls) and notices dead peers (TCP EOF on
//! a watched side channel).
//!
//! One job per file under `device/`:
//! - this file: the device and what it shares with its threads (`Shared`), opening it;
//! - `ports.rs`: the receiving UDP ports, their addresses and MTUs;
//! - `qps.rs`: RC QP creation and destruction, QP numbers; `ud.rs`: UD QPs;
//! - `timers.rs`: the QPs' deadlines and the device's timer heap;
//! - `pass.rs`: one progress pass (send, receive, timers, stall accounting);
//! - `thread.rs`: the progress thread (sleep, wake, panics); `learner.rs`: who receives
//!   for a verbs application;
//! - `caller.rs`: progress=inline, the application's threads driving the device;
//! - `batching.rs`: posts and ACKs deferred to the next pass while the application polls;
//! - `watch.rs`: side channels watched for a dead peer;
//! - `stats.rs`: counters; `ready.rs`: the provider-neutral readiness interface.

use crate::config::{Progress, Settings};
use crate::error::{Error, ErrorKind, Result};
use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap as HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use super::mr::MrTable;
use super::qp::SoftQp;
use super::sys::EventFd;
use super::udp::{RxBatch, UdpPort};

mod answers;
mod batching;
mod caller;
/// Who receives for a verbs application: the progress thread's learning (`thread_rx`).
mod learner;
mod pass;
mod ports;
mod qps;
mod ready;
mod stats;
mod thread;
mod timers;
/// UD QPs: their table, create/destroy and receive dispatch (`device/ud.rs`).
mod ud;
mod watch;

#[cfg(test)]
mod tests;

pub(crate) use timers::{DeviceTimers, TimerCell};

use pass::RX_BATCH;
use ports::RxPort;
use stats::StatCounters;
use thread::progress_thread;
use watch::WatchSet;

/// What the device shares with its progress thread and the application's threads.
struct Shared {
    settings: Settings,
    mrs: Arc<MrTable>,
    /// The IPv4 port, then the IPv6 one if the host has IPv6.
    ports: Vec<RxPort>,
    qps: RwLock<HashMap<u32, Arc<SoftQp>>>,
    /// UD QPs (`device/ud.rs`); numbers unique across both tables.
    ud_qps: ud::UdTable,
    /// TCP side channels to watch for EOF: fd -> QP.
    watches: Mutex<HashMap<RawFd, u32>>,
    /// The same fds, as the epoll set the progress thread polls.
    watch_set: WatchSet,
    /// Every QP's timer (heap), the thread's planned wakeup and its wake fd.
    timers: Arc<DeviceTimers>,
    stop: AtomicBool,
    /// Serializes receive processing (the thread, or an inline poller).
    rx: Mutex<RxBatch>,
    epoch: Instant,
    /// Last time the application drove progress itself (progress=inline), ns.
    last_app_poll: AtomicU64,
    /// CQs an application armed and waits on (verbs `ibv_req_notify_cq`; counted by the
    /// CQs themselves, [`Cq::count_armings_in`](super::cq::Cq::count_armings_in)): while
    /// one is armed the progress thread receives, whatever the application's last poll
    /// (see [`Shared::app_polls`]).
    armed_cqs: Arc<AtomicUsize>,
    /// Learned by the progress thread (progress=inline): the application waits without
    /// polling (on a completion channel, or spinning on memory an RDMA WRITE lands in), so
    /// the thread receives even while the application also polls now and then. Set by an
    /// arming, or when looks of the thread find RDMA WRITEs (READ, atomic requests) the
    /// application left queued, cleared when the wakeups it finds redundant (the
    /// application had taken what woke the thread: it polls) outweigh the needed ones:
    /// `device/learner.rs`, docs/ibv-device.md "Who receives".
    thread_rx: AtomicBool,
    /// A verbs program's WRITE answers (`device/answers.rs`): whether its passes hold ACKs
    /// for them, and who receives for a memory spinner between its polls.
    answers: answers::Answers,
    /// The progress thread sleeps with the receiving sockets in its poll set (an arming
    /// then needs no wakeup).
    thread_watching: AtomicBool,
    /// The progress thread, woken by a datagram, found the receive lock taken by an
    /// application poll and sleeps without the sockets (which would wake it again at once
    /// while the datagram waits for that poll) until the poll ends: the application's
    /// [`SoftDevice::progress_inline`] signals its wake fd then ([`Shared::rx_free`]).
    rx_wanted: AtomicBool,
    /// Application threads asleep on the receiving sockets themselves (progress=inline,
    /// [`SoftDevice::app_watch`]): they receive when they wake, so the progress thread
    /// does not wait on the sockets (one wakeup per packet batch instead of two).
    app_watchers: AtomicUsize,
    /// An application thread waits for its completion events on the receiving sockets
    /// itself ([`SoftDevice::app_watch_events`]: rdmx-ibv's `ibv_get_cq_event`): between
    /// two such waits (its poll and re-arming) the progress thread stays off the sockets
    /// for the handover time, as for a polling application, instead of sleeping on them and
    /// waking with it for the next datagram.
    event_watcher: AtomicBool,
    /// Readable when the progress thread ran a pass (progress=inline, app-driven): a thread
    /// asleep on [`SoftDevice::rx_fds`] wakes for what that pass completed, since the
    /// sockets it drained no longer say so. Reset by `rx_fds`.
    app_wake: EventFd,
    /// QPs posted to through [`SoftDevice::post_send_batched`] while the application was
    /// polling: their packets leave at the next progress pass.
    doorbells: Mutex<Vec<Arc<SoftQp>>>,
    /// `doorbells` is not empty (checked without the lock on every pass).
    doorbells_rung: AtomicBool,
    /// QPs whose positive ACKs an application pass held back (`progress_once`), and since
    /// when (engine ns, the oldest hold): sent by a post on the QP, by a pass after
    /// [`ACK_HOLD_NS`](batching::ACK_HOLD_NS), or when the application stops polling.
    held_acks: Mutex<Vec<Arc<SoftQp>>>,
    /// Engine ns of the oldest hold in `held_acks`; 0 = none.
    held_since: AtomicU64,
    /// The application drives the device from threads that answer what they receive
    /// ([`SoftDevice::set_app_driven`]): its passes hold ACKs, and the progress thread
    /// leaves receiving to it while it polls.
    hold_acks: AtomicBool,
    /// Real time left out of the engine clock (`now`): the device was not listening.
    stalled_ns: AtomicU64,
    /// When the last progress pass ended (engine ns): up to then the device was listening.
    last_pass: AtomicU64,
    stats: StatCounters,
}

/// The device's counters (provider-neutral: `crate::provider::types`).
pub use crate::provider::types::{PortCounters, ProgressStats};

/// A soft RDMA device.
pub struct SoftDevice {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SoftDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftDevice")
            .field("udp", &self.udp_addrs())
            .finish()
    }
}

impl SoftDevice {
    /// Opens the device: binds the UDP ports (`soft_port` on each of `bind_ips`, at most
    /// one per IP family; 0 = any free port) and starts the progress thread. The first
    /// address must bind; a later one that cannot (say, IPv6 on a host without it) is
    /// logged and left out, and QPs of its family are refused.
    pub fn open(settings: &Settings, bind_ips: &[IpAddr]) -> Result<SoftDevice> {
        let mut ports: Vec<RxPort> = Vec::new();
        for (i, ip) in bind_ips.iter().enumerate() {
            if ports
                .iter()
                .any(|p| p.sock.local_addr().is_ipv4() == ip.is_ipv4())
            {
                continue;
            }
            let addr = SocketAddr::new(*ip, settings.soft_port);
            match UdpPort::bind(addr) {
                Ok(sock) => ports.push(RxPort {
                    sock,
                    qps: AtomicUsize::new(0),
                }),
                Err(e) if i > 0 => {
                    log::info!(target: "rdmx::soft", "soft provider: no UDP port on {addr} ({e}); connections over that family are refused");
                }
                Err(e) => {
                    let hint = if e.kind() == std::io::ErrorKind::AddrNotAvailable {
                        "no interface of this host has that address"
                    } else {
                        "another rdmx process on this host? set soft_port=0 for any free port"
                    };
                    return Err(Error::new(
                        ErrorKind::Io,
                        format!("soft provider: cannot bind UDP {addr}: {e} ({hint})"),
                    ));
                }
            }
        }
        if ports.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "soft provider: no address to bind",
            ));
        }
        let shared = Arc::new(Shared {
            settings: settings.clone(),
            mrs: Arc::new(MrTable::new(settings.soft_pin)),
            ports,
            qps: RwLock::new(HashMap::default()),
            ud_qps: RwLock::new(HashMap::default()),
            watches: Mutex::new(HashMap::default()),
            watch_set: WatchSet::new()?,
            timers: Arc::new(DeviceTimers::new()?),
            stop: AtomicBool::new(false),
            rx: Mutex::new(RxBatch::new(RX_BATCH, crate::rc::max_packet_len(4096) + 64)),
            epoch: Instant::now(),
            last_app_poll: AtomicU64::new(0),
            armed_cqs: Arc::new(AtomicUsize::new(0)),
            thread_rx: AtomicBool::new(false),
            answers: answers::Answers::default(),
            thread_watching: AtomicBool::new(false),
            rx_wanted: AtomicBool::new(false),
            app_watchers: AtomicUsize::new(0),
            event_watcher: AtomicBool::new(false),
            app_wake: EventFd::new()?,
            doorbells: Mutex::new(Vec::new()),
            doorbells_rung: AtomicBool::new(false),
            held_acks: Mutex::new(Vec::new()),
            held_since: AtomicU64::new(0),
            hold_acks: AtomicBool::new(false),
            stalled_ns: AtomicU64::new(0),
            last_pass: AtomicU64::new(0),
            stats: StatCounters::default(),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("rdmx-progress".into())
            .spawn(move || progress_thread(&s))
            .map_err(|e| Error::new(ErrorKind::Io, format!("progress thread: {e}")))?;
        let dev = SoftDevice {
            shared,
            thread: Some(thread),
        };
        log::info!(target: "rdmx::soft", "soft device on UDP {:?}", dev.udp_addrs());
        Ok(dev)
    }

    pub fn settings(&self) -> &Settings {
        &self.shared.settings
    }

    /// The memory region table as a shared registrar (for pools and the registration cache).
    pub fn mrs_arc(&self) -> Arc<MrTable> {
        Arc::clone(&self.shared.mrs)
    }

    pub fn mrs(&self) -> &MrTable {
        &self.shared.mrs
    }

    /// Nanoseconds on the device's clock (what the engine's timers run on): real time
    /// since the device opened, less the time it was not listening ([`ProgressStats`]).
    pub fn now(&self) -> u64 {
        self.shared.now()
    }

    pub fn progress_mode(&self) -> Progress {
        self.shared.settings.progress
    }
}

impl Drop for SoftDevice {
    fn drop(&mut self) {
        self.shared.release_acks(self.shared.now(), 0);
        self.shared.stop.store(true, Ordering::Release);
        self.shared.timers.wake.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn now(&self) -> u64 {
        (self.epoch.elapsed().as_nanos() as u64)
            .saturating_sub(self.stalled_ns.load(Ordering::Relaxed))
    }
}

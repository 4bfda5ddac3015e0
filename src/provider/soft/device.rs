//! The soft device: a UDP port per IP family (IPv4, and IPv6 where the host has it) that
//! receives every QP's RoCEv2 traffic of that family, the memory
//! regions, the QPs, and the progress engine that feeds received packets to QPs, fires
//! their timers (whether or not the application polls) and notices dead peers (TCP EOF on
//! a watched side channel).

use crate::config::{Progress, Settings};
use crate::error::{Error, ErrorKind, Result};
use crate::rc::QpCaps;
use crate::wire::{BTH_LEN, Bth};
use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::cq::Cq;
use super::diagnose::StallLog;
use super::mr::MrTable;
use super::qp::{Received, SendReq, SoftQp, TxOptions};
use super::sys::{self, EventFd};
use super::udp::{self, RxBatch, UdpPort};

/// Who receives for a verbs application: the progress thread's learning (`thread_rx`).
mod learner;
/// UD QPs: their table, create/destroy and receive dispatch (`device/ud.rs`).
mod ready;
mod ud;

use learner::{Learner, Seen, Verdict};

/// Messages per recvmmsg call (datagrams, or GRO buffers of several).
const RX_BATCH: usize = 64;
/// Receive with UDP GRO: on first use the device port turns `UDP_GRO` on and its receive
/// batch becomes [`RX_BATCH`] slots of 64 KiB (4 MiB, touched only as filled), so a GSO
/// message from a local peer arrives as one buffer. `false`: one datagram per slot.
const USE_GRO: bool = true;
/// Most datagrams one progress pass takes from the socket (timers and posts must not starve).
const RX_PASS_DATAGRAMS: usize = 16 * RX_BATCH;
/// Longest sleep of the progress thread when no timer is armed (it also wakes on traffic,
/// on posts that need it, and on side-channel events).
const IDLE_SLEEP: Duration = Duration::from_millis(100);
/// A progress pass that starts this much later than one was due means the process was not
/// running (CPU starved, stopped): that time is left out of the engine's clock. Smaller
/// delays are ordinary wakeup jitter (timer slack is 50 us) and count as listening.
const STALL_MIN_NS: u64 = 200_000;
/// What a phase of a progress pass may take when the process runs: a base plus a
/// generous cost per datagram received (a GRO message holds up to 64 KiB) or QP driven
/// (its sends). Time beyond was time the process did not run, inside the pass.
const PASS_BASE_NS: u64 = 1_000_000;
const PASS_PER_ITEM_NS: u64 = 50_000;

/// QPs one progress pass drives (inline: a pass runs per poll, so no heap allocation).
type Touched = SmallVec<[Arc<SoftQp>; 4]>;
/// Most stale heap entries one pass repairs at the top (see [`DeviceTimers::settle`]).
const SETTLE_MAX: usize = 64;

/// Timer heap entries reserved when a device opens (16 bytes each). Entries are live QP
/// deadlines plus stale ones waiting to be popped (lazy deletion), a few per busy QP.
const TIMER_HEAP_RESERVE: usize = 1024;

/// One QP's timer as the device sees it: the engine's earliest deadline, published by the
/// QP whenever its engine is touched, so reading it needs no lock, and where the QP stands
/// in the device's timer heap. Shared by the QP and its heap entries (which never keep the
/// QP itself alive).
#[derive(Debug)]
pub(crate) struct TimerCell {
    qpn: u32,
    /// The engine's earliest deadline (device clock ns; u64::MAX: none). Written under the
    /// QP's lock, so in order.
    deadline: AtomicU64,
    /// The earliest entry of this QP in the heap (u64::MAX: none), written under the heap
    /// lock. `queued <= deadline` whenever the QP has a deadline, except for a QP a pass
    /// took from the heap and is about to drive (which publishes again).
    queued: AtomicU64,
}

impl TimerCell {
    pub fn new(qpn: u32) -> TimerCell {
        TimerCell {
            qpn,
            deadline: AtomicU64::new(u64::MAX),
            queued: AtomicU64::new(u64::MAX),
        }
    }

    /// The published deadline.
    pub fn deadline(&self) -> Option<u64> {
        let d = self.deadline.load(Ordering::Acquire);
        (d != u64::MAX).then_some(d)
    }

    /// Publishes the engine's deadline `d` (called under the QP's lock after anything
    /// touched its engine). The device's heap is told only when `d` comes before the QP's
    /// entry there: a deadline that moves later (every ACK) costs an atomic store; the
    /// heap learns it when the old entry comes due. `timers`: None for a QP outside a
    /// device (unit tests).
    #[inline]
    pub fn publish(self: &Arc<Self>, d: Option<u64>, timers: Option<&Arc<DeviceTimers>>) {
        let d = d.unwrap_or(u64::MAX);
        // SeqCst store then load here, SeqCst store of `queued` then load of `deadline` in
        // `take_due`: one of the two sides sees the other's write, so a deadline is never
        // left without an entry at or before it.
        if self.deadline.load(Ordering::Relaxed) != d {
            self.deadline.store(d, Ordering::SeqCst);
        }
        if d < self.queued.load(Ordering::SeqCst)
            && let Some(t) = timers
        {
            t.arm(self, d);
        }
    }
}

/// A heap entry: `cell`'s QP had a deadline at `at` when it was pushed (it may have moved
/// later since: checked when the entry comes to the top).
struct Entry {
    at: u64,
    cell: Arc<TimerCell>,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Entry) -> bool {
        self.cmp(o) == CmpOrdering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Entry) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    /// Reversed: `BinaryHeap` is a max-heap, the earliest deadline must be on top.
    fn cmp(&self, o: &Entry) -> CmpOrdering {
        (o.at, o.cell.qpn).cmp(&(self.at, self.cell.qpn))
    }
}

/// The device's timers: a min-heap of (deadline, QP) with lazy deletion, fed by QPs whose
/// deadline came earlier than their entry, so a progress pass pops only due entries and the
/// progress thread sleeps until the heap's minimum. Idle QPs cost a pass nothing.
pub(crate) struct DeviceTimers {
    heap: Mutex<BinaryHeap<Entry>>,
    /// The heap's minimum (u64::MAX: empty), written under the heap lock: the earliest
    /// armed timer, when a pass is due (stall accounting). It may be early (a QP's deadline
    /// moved later since its entry was pushed), never late; a pass that drove QPs repairs
    /// it ([`DeviceTimers::settle`]).
    min: AtomicU64,
    /// When the progress thread will wake next (ns on the device clock).
    planned_wake: AtomicU64,
    /// Wakes the progress thread.
    wake: EventFd,
}

impl std::fmt::Debug for DeviceTimers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTimers")
            .field("entries", &self.heap.lock().len())
            .field("min", &self.min.load(Ordering::Relaxed))
            .finish()
    }
}

impl DeviceTimers {
    fn new() -> Result<DeviceTimers> {
        Ok(DeviceTimers {
            // Room for the entries of a busy device up front: `arm` runs on the posting
            // thread, and a heap that grows there allocates on the data path (seen once in
            // alloc_free under load 14: a refused post pushed the heap past 32 entries).
            heap: Mutex::new(BinaryHeap::with_capacity(TIMER_HEAP_RESERVE)),
            min: AtomicU64::new(u64::MAX),
            planned_wake: AtomicU64::new(0),
            wake: EventFd::new()?,
        })
    }

    /// The earliest armed timer (u64::MAX: none); possibly early, never late.
    fn min(&self) -> u64 {
        self.min.load(Ordering::Acquire)
    }

    fn store_min(&self, heap: &BinaryHeap<Entry>) {
        let m = heap.peek().map_or(u64::MAX, |e| e.at);
        self.min.store(m, Ordering::Release);
    }

    /// `cell`'s QP has a deadline at `d`, earlier than its entry: pushes one, and wakes the
    /// progress thread if it planned to sleep past `d` (timers fire whether or not the
    /// application polls).
    #[cold]
    fn arm(&self, cell: &Arc<TimerCell>, d: u64) {
        {
            let mut heap = self.heap.lock();
            if d >= cell.queued.load(Ordering::SeqCst) {
                return; // another thread pushed it meanwhile
            }
            cell.queued.store(d, Ordering::SeqCst);
            heap.push(Entry {
                at: d,
                cell: Arc::clone(cell),
            });
            if d < self.min.load(Ordering::Relaxed) {
                self.min.store(d, Ordering::Release);
            }
        }
        self.wake_by(d);
    }

    /// Wakes the progress thread if it planned to sleep past `d`.
    fn wake_by(&self, d: u64) {
        if d < self.planned_wake.load(Ordering::Acquire) {
            self.planned_wake.store(d, Ordering::Release);
            self.wake.signal();
        }
    }

    /// Pops the entries due at `now`: a QP whose deadline is due goes to `due` (and leaves
    /// the heap: driving it publishes its next deadline); one whose deadline moved later
    /// is pushed again at it; stale entries are dropped. Nothing is locked when nothing is
    /// due.
    fn take_due(&self, now: u64, due: &mut SmallVec<[Arc<TimerCell>; 4]>) {
        if self.min() > now {
            return;
        }
        let mut heap = self.heap.lock();
        while heap.peek().is_some_and(|e| e.at <= now) {
            let Some(e) = heap.pop() else { break };
            let cell = e.cell;
            if cell.queued.load(Ordering::SeqCst) != e.at {
                continue; // a duplicate: the QP's entry is another one
            }
            cell.queued.store(u64::MAX, Ordering::SeqCst);
            let d = cell.deadline.load(Ordering::SeqCst);
            if d <= now {
                due.push(cell);
            } else if d != u64::MAX {
                cell.queued.store(d, Ordering::SeqCst);
                heap.push(Entry { at: d, cell });
            }
        }
        self.store_min(&heap);
    }

    /// Makes the heap's top exact (its QP's deadline is the entry's), so `min` is the
    /// earliest deadline of any QP: entries whose QP's deadline moved later are pushed
    /// again at it, duplicates dropped (at most [`SETTLE_MAX`]). Run by a pass that drove
    /// QPs (their deadlines moved). Returns the minimum.
    fn settle(&self) -> u64 {
        let mut heap = self.heap.lock();
        for _ in 0..SETTLE_MAX {
            let Some(top) = heap.peek() else { break };
            let cell = &top.cell;
            let at = top.at;
            if cell.queued.load(Ordering::SeqCst) != at {
                heap.pop();
                continue;
            }
            let d = cell.deadline.load(Ordering::SeqCst);
            if d == at {
                break;
            }
            // The deadline moved (later, or earlier by a QP that is about to push it).
            let Some(e) = heap.pop() else { break };
            e.cell.queued.store(d, Ordering::SeqCst);
            if d != u64::MAX {
                heap.push(Entry {
                    at: d,
                    cell: e.cell,
                });
            }
        }
        self.store_min(&heap);
        self.min()
    }

    /// Entries in the heap (QPs with a deadline, plus stale entries not yet dropped).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.heap.lock().len()
    }
}

/// A receiving UDP port (one per IP family) and how many QPs of its family exist: a port
/// without QPs is not polled, so an unused family costs no syscalls.
struct RxPort {
    sock: UdpPort,
    qps: AtomicUsize,
}

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
    /// CQs themselves, [`Cq::count_armings_in`]): while one is armed the progress thread
    /// receives, whatever the application's last poll (see [`Shared::app_polls`]).
    armed_cqs: Arc<AtomicUsize>,
    /// Learned by the progress thread (progress=inline): the application waits without
    /// polling (on a completion channel, or spinning on memory an RDMA WRITE lands in), so
    /// the thread receives even while the application also polls now and then. Set by an
    /// arming, or when looks of the thread find RDMA WRITEs (READ, atomic requests) the
    /// application left queued, cleared when the wakeups it finds redundant (the
    /// application had taken what woke the thread: it polls) outweigh the needed ones:
    /// `device/learner.rs`, docs/ibv-device.md "Who receives".
    thread_rx: AtomicBool,
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
    /// [`ACK_HOLD_NS`], or when the application stops polling.
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

/// How well the device kept listening (see [`ProgressStats`]).
#[derive(Default)]
struct StatCounters {
    stalls: AtomicU64,
    /// Panics caught in the progress thread (see `progress_thread`).
    progress_panics: AtomicU64,
    /// Times the progress thread learned that the application waits without polling and
    /// took over receiving (`thread_rx`; an arming is not counted).
    takeovers: AtomicU64,
    max_stall_ns: AtomicU64,
    timers_deferred: AtomicU64,
    /// The latest stalls, for failure reports (shared with the QPs).
    log: Arc<StallLog>,
    /// Datagrams dropped before a QP's engine saw them.
    port: PortCells,
}

/// The counters behind [`PortCounters`] (relaxed: bumped per dropped datagram by the
/// receiving thread, read whenever asked).
#[derive(Default)]
struct PortCells {
    unknown_qpn: AtomicU64,
    wrong_source: AtomicU64,
    bad_icrc: AtomicU64,
    malformed: AtomicU64,
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
            mrs: Arc::new(MrTable::default()),
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
            thread_watching: AtomicBool::new(false),
            rx_wanted: AtomicBool::new(false),
            app_watchers: AtomicUsize::new(0),
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

    /// The UDP address peers send to: the first port's (IPv4 unless the device was opened
    /// for IPv6 only).
    pub fn udp_addr(&self) -> SocketAddr {
        self.shared.ports[0].sock.local_addr()
    }

    /// The UDP address peers of this family send to, if the device has a port for it.
    pub fn udp_addr_for(&self, ip: IpAddr) -> Option<SocketAddr> {
        self.shared
            .port_for(ip)
            .map(|i| self.shared.ports[i].sock.local_addr())
    }

    /// Every receiving UDP address (one per family).
    pub fn udp_addrs(&self) -> Vec<SocketAddr> {
        self.shared
            .ports
            .iter()
            .map(|p| p.sock.local_addr())
            .collect()
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

    /// How well the device kept listening (stalls left out of the engine clock).
    pub fn progress_stats(&self) -> ProgressStats {
        let s = &self.shared;
        ProgressStats {
            stalls: s.stats.stalls.load(Ordering::Relaxed),
            stalled_ns: s.stalled_ns.load(Ordering::Relaxed),
            max_stall_ns: s.stats.max_stall_ns.load(Ordering::Relaxed),
            timers_deferred: s.stats.timers_deferred.load(Ordering::Relaxed),
            progress_panics: s.stats.progress_panics.load(Ordering::Relaxed),
        }
    }

    /// Datagrams dropped on the device's UDP ports before reaching a QP (all families).
    pub fn port_counters(&self) -> PortCounters {
        let c = &self.shared.stats.port;
        let (truncated, kernel_drops) = self.shared.ports.iter().fold((0, 0), |(t, k), p| {
            (t + p.sock.truncated_drops(), k + p.sock.kernel_drops())
        });
        PortCounters {
            unknown_qpn: c.unknown_qpn.load(Ordering::Relaxed),
            wrong_source: c.wrong_source.load(Ordering::Relaxed),
            bad_icrc: c.bad_icrc.load(Ordering::Relaxed),
            malformed: c.malformed.load(Ordering::Relaxed),
            truncated,
            kernel_drops,
            async_events: 0,
        }
    }

    /// Kernel receive-queue drops on the device's UDP port (SO_RXQ_OVFL).
    pub fn kernel_drops(&self) -> u64 {
        self.shared
            .ports
            .iter()
            .map(|p| p.sock.kernel_drops())
            .sum()
    }

    /// Creates a QP (RESET) whose packets leave from `local_ip`, with its CQs.
    pub fn create_qp(
        &self,
        caps: QpCaps,
        local_ip: IpAddr,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
    ) -> Result<Arc<SoftQp>> {
        let ip = local_ip.to_canonical();
        let Some(port) = self.shared.port_for(ip) else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "soft provider: no {} UDP port on this device (the host refused to bind one)",
                    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
                ),
            ));
        };
        let shared = &self.shared;
        let qp = self.add_qp(
            &mut |qpn| {
                let qp = SoftQp::new(
                    qpn,
                    caps,
                    ip,
                    Arc::clone(&send_cq),
                    Arc::clone(&recv_cq),
                    TxOptions {
                        drop_ppb: shared.settings.soft_drop_ppb,
                        gso: shared.settings.soft_gso,
                    },
                    Arc::clone(&shared.stats.log),
                )?;
                qp.attach_timers(Arc::clone(&shared.timers));
                Ok(qp)
            },
            &mut sys::try_random_u32,
        )?;
        self.shared.ports[port].qps.fetch_add(1, Ordering::AcqRel);
        // The progress thread may be asleep without watching this port yet.
        self.shared.timers.wake.signal();
        Ok(qp)
    }

    /// Registers the QP `make` builds for a fresh QP number ([`pick_qpn`], from `draw`).
    /// The number is picked under the read lock and the QP (which binds its UDP port) is
    /// built outside any lock, then inserted only if its number is still free: a live QP
    /// is never replaced, and a racing `create_qp` that took the number makes this one
    /// pick again.
    fn add_qp(
        &self,
        make: &mut dyn FnMut(u32) -> Result<SoftQp>,
        draw: &mut dyn FnMut() -> Result<u32>,
    ) -> Result<Arc<SoftQp>> {
        for _ in 0..QPN_RACES {
            let qpn = {
                let qps = self.shared.qps.read();
                pick_qpn(&|q| qps.contains_key(&q) || self.shared.is_ud_qpn(q), draw)?
            };
            let qp = Arc::new(make(qpn)?);
            let mut qps = self.shared.qps.write();
            if !self.shared.is_ud_qpn(qpn)
                && let std::collections::hash_map::Entry::Vacant(v) = qps.entry(qpn)
            {
                v.insert(Arc::clone(&qp));
                return Ok(qp);
            }
            log::debug!(target: "rdmx::soft", "QP {qpn:#x}: taken meanwhile; picking again");
        }
        Err(Error::new(
            ErrorKind::Busy,
            format!("soft provider: no free QP number after {QPN_RACES} races with other QPs"),
        ))
    }

    /// For an application that drives the device (progress=inline) from threads that
    /// answer what they receive, as the messenger does (it turns this on; off by default):
    /// - its passes hold positive ACKs back until its answer, a post on the same QP,
    ///   carries them (`held_acks`);
    /// - while it polls or watches the sockets, the progress thread runs passes only for a
    ///   due timer or a side-channel event, instead of taking the receive lock it polls
    ///   with (a messenger worker found it taken ~100,000 times a second at 60K rpc/s).
    ///
    /// A verbs application or a raw connection user keeps the plain behaviour: it may
    /// receive and then stop polling, and its peer must not wait for its next poll.
    pub fn set_app_driven(&self, on: bool) {
        self.shared.hold_acks.store(on, Ordering::Relaxed);
        if on {
            self.shared.thread_rx.store(false, Ordering::SeqCst);
        }
        if !on {
            self.shared.release_acks(self.shared.now(), 0);
        }
    }

    /// Sends the ACKs an application pass held back on `qp` (`held_acks`), before the QP
    /// leaves RTS or the device: a NIC has acknowledged what the application saw complete,
    /// and a peer that got no ACK for its last message would retry it into an error (an
    /// application that received, then destroyed its QP or went to ERR).
    pub fn send_held_acks(&self, qp: &SoftQp) {
        if qp.acks_held.load(Ordering::Acquire) {
            qp.drive(&self.shared.mrs, self.shared.now(), false, false);
        }
    }

    /// Forgets a QP (after it was drained): its packets are dropped from now on. ACKs it
    /// still held go first.
    pub fn destroy_qp(&self, qpn: u32) {
        let qp = self.shared.qps.read().get(&qpn).cloned();
        if let Some(qp) = qp {
            self.send_held_acks(&qp);
        }
        if let Some(qp) = self.shared.qps.write().remove(&qpn)
            && let Some(port) = self.shared.port_for(qp.local_udp().ip())
        {
            self.shared.ports[port].qps.fetch_sub(1, Ordering::AcqRel);
        }
        let mut w = self.shared.watches.lock();
        w.retain(|fd, q| {
            if *q == qpn {
                self.shared.watch_set.remove(*fd);
            }
            *q != qpn
        });
    }

    /// Watches a TCP side channel: when its peer closes, the QP goes to ERR (flushing
    /// every outstanding WR) and its CQ channel is signaled.
    pub fn watch(&self, fd: RawFd, qpn: u32) {
        let mut w = self.shared.watches.lock();
        w.insert(fd, qpn);
        self.shared.watch_set.add(fd);
    }

    pub fn unwatch(&self, fd: RawFd) {
        let mut w = self.shared.watches.lock();
        if w.remove(&fd).is_some() {
            self.shared.watch_set.remove(fd);
        }
    }

    /// Wakes the progress thread (e.g. after a post whose packets the caller could not
    /// send, or to re-evaluate timers).
    pub fn kick(&self) {
        self.shared.timers.wake.signal();
    }

    /// A caller armed a timer due at `deadline`: wakes the progress thread if it planned
    /// to sleep past it (timers fire whether or not the application polls). A QP of this
    /// device already told the device's timer heap when its engine armed the timer, so this
    /// is one atomic load in the common case.
    pub fn timer_armed(&self, deadline: Option<u64>) {
        if let Some(d) = deadline {
            self.shared.timers.wake_by(d);
        }
    }

    /// Posts send WRs to `qp` (as [`SoftQp::post_send`]) for a caller that posts one WR at
    /// a time and then polls, as verbs applications do (perftest, Ceph): while the
    /// application drives progress (progress=inline, it polled within the inline handover
    /// time and the device does not know it to wait otherwise: [`Shared::app_polls`], the
    /// same test the progress thread makes) the packets are not sent
    /// by this call but by the next progress pass, which the application's next poll (of
    /// any thread) runs, so the WRs posted between two polls leave in one `sendmmsg`
    /// instead of one system call each (a NIC's doorbell costs ~100 ns, a system call here
    /// a few us: perftest's ib_read_bw went from ~0.3x to ~0.9x of rdmx-perf read_bw). If
    /// the application stops polling, arming a CQ (`app_sleeping`) or the progress
    /// thread's look after the handover time sends them. Otherwise they leave at once.
    pub fn post_send_batched(&self, qp: &Arc<SoftQp>, wrs: &[SendReq]) -> (usize, Option<Error>) {
        let s = &self.shared;
        let now = s.now();
        let polling = s.app_polls(now);
        let (n, err) = qp.post_send_then(&s.mrs, now, wrs, !polling);
        // After the post: a pass that cleared the flag before driving sees these WRs.
        if polling && n > 0 {
            s.ring(qp);
        }
        (n, err)
    }

    /// One pass of progress from the caller's thread (progress=inline, or busy polling):
    /// receive what is queued, run due timers. Skipped if another thread is at it.
    pub fn progress_inline(&self) {
        // The pass reads the clock anyway; reuse its reading (a poll loop calls this
        // millions of times a second).
        let hold = self.shared.settings.progress == Progress::Inline
            && self.shared.hold_acks.load(Ordering::Relaxed);
        let now = match self.shared.progress_once(false, hold) {
            Some(pass) => pass.now,
            None => self.shared.now(),
        };
        self.shared.last_app_poll.store(now, Ordering::Relaxed);
        self.shared.rx_free();
    }

    /// The active MTU (IB MTU bytes, 256..4096) of the link that holds the device's first
    /// address, as a NIC port reports it: the interface that has the address (its MTU in
    /// `/sys/class/net`), else the route to the address itself (loopback: 4096). 1024 when
    /// neither says (the smallest common link, 1500 bytes).
    pub fn port_active_mtu(&self) -> u32 {
        let ip = self.udp_addr().ip();
        let v6 = ip.to_canonical().is_ipv6();
        let link = super::mtu::interface_of(ip)
            .and_then(|dev| std::fs::read_to_string(format!("/sys/class/net/{dev}/mtu")).ok())
            .and_then(|t| t.trim().parse::<u32>().ok())
            .or_else(|| super::mtu::route_mtu(ip).ok().map(|(m, _)| m));
        link.and_then(|l| super::mtu::active_mtu(l, v6))
            .unwrap_or(1024)
    }

    /// The active MTU (IB MTU bytes) of the route to `peer`: what a connection to it may
    /// use at most. Unsupported when the link cannot carry even 256-byte packets; Io when
    /// there is no route.
    pub fn route_active_mtu(&self, peer: IpAddr) -> Result<u32> {
        let (link, local) = super::mtu::route_mtu(peer)
            .map_err(|e| Error::new(ErrorKind::Io, format!("path MTU: no route to {peer}: {e}")))?;
        let route = super::mtu::describe_route(peer, local);
        super::mtu::choose(4096, link, peer.to_canonical().is_ipv6(), &route).map(|p| p.active)
    }

    /// progress=inline: the receiving sockets an application thread may sleep on itself
    /// (poll(2) for POLLIN) between [`SoftDevice::app_watch`]`(true)` and `(false)`, and
    /// then receive with its next poll, and last the device's wake fd: readable once the
    /// progress thread ran a pass after this call (an app-driven device: it completes work
    /// on its own only for due timers and side-channel events, and drains the sockets when
    /// it does). Call it before looking at the CQs to decide what to wait for; the caller
    /// does not read the fds (the next call resets the wake fd). Nothing with
    /// progress=thread.
    pub fn rx_fds(&self, out: &mut Vec<RawFd>) {
        if self.shared.settings.progress != Progress::Inline {
            return;
        }
        let at = out.len();
        for p in &self.shared.ports {
            if p.qps.load(Ordering::Acquire) > 0 {
                out.push(p.sock.raw_fd());
            }
        }
        if out.len() > at {
            // Reset now: a pass of the progress thread after this call (completions the
            // caller has not seen when it decides what to wait for) makes it readable.
            self.shared.app_wake.clear();
            out.push(self.shared.app_wake.raw_fd());
        }
    }

    /// An application thread starts (`true`) or stops (`false`) sleeping on
    /// [`SoftDevice::rx_fds`]. While one does, the progress thread does not wait on the
    /// sockets (as while the application polls: it wakes for timers, side channels and
    /// every handover interval, and receives what is queued then); a stop counts as a
    /// poll, so the progress thread takes over only after the usual handover time. What
    /// waits on the doorbell list (held ACKs, batched posts) is sent first: the progress
    /// thread does not run passes while a thread watches.
    pub fn app_watch(&self, on: bool) {
        if on {
            let now = self.shared.now();
            self.shared.ring_doorbells(now);
            self.shared.release_acks(now, 0);
            self.shared.app_watchers.fetch_add(1, Ordering::AcqRel);
        } else {
            self.shared
                .last_app_poll
                .store(self.shared.now(), Ordering::Relaxed);
            self.shared.app_watchers.fetch_sub(1, Ordering::AcqRel);
        }
    }

    pub fn progress_mode(&self) -> Progress {
        self.shared.settings.progress
    }

    /// The application is about to sleep on a completion channel instead of polling
    /// (progress=inline): the progress thread takes over receiving at once rather than
    /// after the inline handover time; what waits on the doorbell list is sent now. The
    /// thread is woken only if it sleeps without the receiving sockets.
    pub fn app_sleeping(&self) {
        self.app_stops_polling(true);
    }

    /// What [`SoftDevice::app_sleeping`] does; `wake`: wake the progress thread if it
    /// does not watch the sockets.
    fn app_stops_polling(&self, wake: bool) {
        let s = &self.shared;
        if s.settings.progress == Progress::Inline {
            let now = s.now();
            s.ring_doorbells(now);
            s.release_acks(now, 0);
            s.last_app_poll.store(0, Ordering::Relaxed);
            // SeqCst with the thread's store of `thread_watching` before it reads
            // `thread_rx`/`armed_cqs`: either it sees this arming, or this sees it did
            // not watch and wakes it.
            if wake && !s.thread_watching.load(Ordering::SeqCst) {
                s.timers.wake.signal();
            }
        }
    }

    /// As [`SoftDevice::app_sleeping`], for a verbs application that armed a CQ
    /// (`ibv_req_notify_cq`): such an application waits on its channel, polls once after
    /// each event and re-arms, so the thread also keeps receiving across that gap
    /// (`thread_rx`) until it finds the application polling for what it waits for.
    pub fn app_waits_on_channel(&self) {
        let s = &self.shared;
        if s.settings.progress == Progress::Inline
            && !s.hold_acks.load(Ordering::Relaxed)
            && s.thread_rx.swap(true, Ordering::SeqCst)
        {
            // The thread already receives for this application (the re-arming after an
            // event, every iteration of `ibv_rc_pingpong -e`): it sleeps on the sockets,
            // or is awake and will (only it clears `thread_rx`, and not while a CQ is
            // armed). Waking it would cost an eventfd write here and an empty pass there.
            self.app_stops_polling(false);
            return;
        }
        self.app_sleeping();
    }

    /// The tally of armed CQs the progress thread looks at: a verbs CQ counts itself in
    /// it while armed ([`Cq::count_armings_in`]).
    pub fn armed_cqs(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.shared.armed_cqs)
    }

    /// Whether the progress thread has learned that the application waits without
    /// polling (and so receives for it): a look for tests and diagnostics.
    pub fn thread_receives(&self) -> bool {
        self.shared.thread_rx.load(Ordering::Relaxed)
    }

    /// How many times the progress thread learned from the traffic that the application
    /// waits without polling (an RDMA WRITE or READ left queued at two looks in a row) and
    /// took over receiving; armings are not counted. A look for tests and diagnostics: a
    /// polling program should never see it move.
    pub fn thread_takeovers(&self) -> u64 {
        self.shared.stats.takeovers.load(Ordering::Relaxed)
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
    /// progress=inline: whether the application receives for itself, by polling: it
    /// polled within the inline handover time, arms no CQ, and has not been found to
    /// wait without polling (`thread_rx`). The progress thread then leaves the sockets to
    /// it, and posts wait for its next poll (the doorbell list).
    fn app_polls(&self, now: u64) -> bool {
        self.settings.progress == Progress::Inline
            && self.armed_cqs.load(Ordering::SeqCst) == 0
            && !self.thread_rx.load(Ordering::SeqCst)
            && now.saturating_sub(self.last_app_poll.load(Ordering::Relaxed))
                < inline_handover_ns(self)
    }

    /// After an application's poll (its pass released the receive lock, or skipped): if
    /// the progress thread found the lock taken and waits for it (`rx_wanted`), wake it to
    /// receive what the poll left (a datagram that came after its receive). A load per
    /// poll otherwise. The fence pairs with the thread's between setting the flag and
    /// trying the lock again: either this sees the flag, or the thread's try finds the
    /// lock free.
    /// (An app-driven caller, the messenger, never has the thread wait: no fence per poll.)
    #[inline]
    fn rx_free(&self) {
        if self.hold_acks.load(Ordering::Relaxed) {
            return;
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.rx_wanted.load(Ordering::Relaxed) && self.rx_wanted.swap(false, Ordering::AcqRel) {
            self.timers.wake.signal();
        }
    }

    /// Index of the receiving port for `ip`'s family.
    fn port_for(&self, ip: IpAddr) -> Option<usize> {
        let v4 = ip.to_canonical().is_ipv4();
        self.ports
            .iter()
            .position(|p| p.sock.local_addr().is_ipv4() == v4)
    }

    fn now(&self) -> u64 {
        (self.epoch.elapsed().as_nanos() as u64)
            .saturating_sub(self.stalled_ns.load(Ordering::Relaxed))
    }

    /// Called at the start of every progress pass (under the receive lock, so passes do not
    /// race here). A pass was due when the earliest timer expired; if this one starts
    /// later than that and later than the previous pass ended, no thread of this process
    /// ran a pass in between (CPU starved, stopped, or no thread was awake to do it): that
    /// time leaves the engine clock. The pass then receives what arrived meanwhile before
    /// the timer fires (at the clock reading of its deadline), so the window a requester
    /// charges to its peer is time it was listening. Gaps with no timer due (an
    /// application that polls now and then, an idle device) are not stalls.
    fn account_stall(&self) -> u64 {
        let now = self.now();
        let due = self
            .last_pass
            .load(Ordering::Relaxed)
            .max(self.timers.min());
        self.stall(now, now.saturating_sub(due))
    }

    /// Leaves `late` ns before `now` out of the engine clock if it is a stall (at least
    /// STALL_MIN_NS); returns the engine clock after that.
    fn stall(&self, now: u64, late: u64) -> u64 {
        if late < STALL_MIN_NS {
            return now;
        }
        self.stalled_ns.fetch_add(late, Ordering::Relaxed);
        self.stats.stalls.fetch_add(1, Ordering::Relaxed);
        self.stats.max_stall_ns.fetch_max(late, Ordering::Relaxed);
        self.stats.log.record(now - late, late);
        now - late
    }

    /// A phase of a pass that handled `work` datagrams or QPs from `start` to `now`, with
    /// the earliest timer at `timer`: time beyond what that work can take and beyond the
    /// timer was time the process did not run inside the pass (preempted or stopped) while
    /// a timer was due. Returns the clock with that time left out.
    fn stall_inside(&self, start: u64, now: u64, work: usize, timer: u64) -> u64 {
        let budget = PASS_BASE_NS + PASS_PER_ITEM_NS * work as u64;
        let late = now.saturating_sub(start.saturating_add(budget).max(timer));
        self.stall(now, late)
    }

    /// Puts `qp` on the doorbell list (WRs posted while the application polls): the next
    /// pass drives it, or an application thread that stops polling.
    fn ring(&self, qp: &Arc<SoftQp>) {
        if !qp.doorbell.swap(true, Ordering::AcqRel) {
            self.doorbells.lock().push(Arc::clone(qp));
            self.doorbells_rung.store(true, Ordering::Release);
        }
    }

    /// Puts `qp` on the list of held ACKs (see `held_acks`).
    fn hold_acks_of(&self, qp: &Arc<SoftQp>, now: u64) {
        if !qp.acks_held.swap(true, Ordering::AcqRel) {
            self.held_acks.lock().push(Arc::clone(qp));
            let _ = self.held_since.compare_exchange(
                0,
                now.max(1),
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }

    /// Sends the held ACKs if the oldest was held at least `min_age` ns before `now`
    /// (0: whatever their age).
    fn release_acks(&self, now: u64, min_age: u64) {
        let since = self.held_since.load(Ordering::Acquire);
        if since == 0 || now.saturating_sub(since) < min_age {
            return;
        }
        let held: Touched = {
            let mut l = self.held_acks.lock();
            self.held_since.store(0, Ordering::Release);
            l.drain(..).collect()
        };
        for qp in held {
            // Cleared before the drive: a hold after this lists the QP again.
            qp.acks_held.store(false, Ordering::Release);
            qp.drive(&self.mrs, now, false, false);
        }
    }

    /// Drives the QPs on the doorbell list, if any.
    fn ring_doorbells(&self, now: u64) {
        // A load first: every poll passes here, a swap would write the line each time.
        if !(self.doorbells_rung.load(Ordering::Acquire)
            && self.doorbells_rung.swap(false, Ordering::AcqRel))
        {
            return;
        }
        let rung: Touched = self.doorbells.lock().drain(..).collect();
        for qp in rung {
            // Cleared before the drive: a post after this rings again.
            qp.doorbell.store(false, Ordering::Release);
            qp.drive(&self.mrs, now, false, false);
        }
    }

    /// Receives queued datagrams (up to a bound), runs due timers, checks watched side
    /// channels. `wait` = block on the receive lock instead of skipping when it is busy.
    /// Returns the time the pass ran at and the datagrams it took, or None if it skipped
    /// (the lock was busy).
    /// `hold_acks`: the application's own pass (progress=inline), which is about to run
    /// its callbacks: positive ACKs that are all a QP has to send wait in `held_acks`, so
    /// the answer it posts carries them in the same `sendmmsg` (a pass after
    /// [`ACK_HOLD_NS`] or the application going to sleep sends them otherwise). Measured,
    /// request/reply paid a `sendmmsg` of its own for the ACK on both sides, before the
    /// answer.
    fn progress_once(&self, wait: bool, hold_acks: bool) -> Option<Pass> {
        let rx = if wait {
            Some(self.rx.lock())
        } else {
            self.rx.try_lock()
        };
        let mut rx = rx?;
        let start = self.account_stall();
        if USE_GRO && rx.slot_len() < udp::MAX_RX_SLOT_LEN {
            let mut gro = false;
            for p in &self.ports {
                gro |= p.sock.enable_gro();
            }
            if gro {
                // GRO buffers need 64 KiB slots; nothing was received since GRO went on.
                *rx = RxBatch::for_gro(RX_BATCH);
            }
        }
        let mut touched: Touched = SmallVec::new();
        // Posted since the last pass: sent first, before receiving, as the post would have,
        // so batching adds no latency to a lone request. Held ACKs go when old enough (an
        // application pass) or now (the progress thread's: the application stopped).
        self.ring_doorbells(start);
        self.release_acks(start, if hold_acks { ACK_HOLD_NS } else { 0 });
        let timer_at_start = self.timers.min();
        let mut start = start;
        let mut drained = true;
        let mut now = start;
        let mut taken_total = 0;
        let mut silent = 0;
        // A process stopped or preempted while receiving may have missed what arrived
        // meanwhile: that time leaves the clock and the socket is read once more before
        // any timer fires. (Once: a pass that is merely slow, say under valgrind, must
        // still run its timers.)
        for round in 0..2 {
            let mut taken = 0;
            drained = true;
            for port in self
                .ports
                .iter()
                .filter(|p| p.qps.load(Ordering::Acquire) > 0)
            {
                let (d, n) = self.receive_from(&port.sock, &mut rx, &mut touched, &mut silent);
                drained &= d;
                taken += n;
            }
            taken_total += taken;
            let read = self.now();
            now = self.stall_inside(start, read, taken, timer_at_start);
            if now == read || round == 1 {
                break;
            }
            start = now;
        }
        // Responses for what arrived, and every due timer, but only once every packet that
        // arrived before now has been processed: an ACK queued behind the pass's bound
        // must not lose the race against its own timer. Only due heap entries are looked
        // at: idle QPs cost nothing.
        let mut due: Touched = SmallVec::new();
        if drained {
            let mut cells: SmallVec<[Arc<TimerCell>; 4]> = SmallVec::new();
            self.timers.take_due(now, &mut cells);
            if !cells.is_empty() {
                let qps = self.qps.read();
                for c in &cells {
                    // A destroyed QP's entry just leaves the heap.
                    if let Some(qp) = qps.get(&c.qpn)
                        && !touched.iter().any(|q| Arc::ptr_eq(q, qp))
                    {
                        due.push(Arc::clone(qp));
                    }
                }
            }
        } else {
            self.stats.timers_deferred.fetch_add(1, Ordering::Relaxed);
            self.timers.wake.signal(); // the thread comes back for the rest at once
        }
        // Driving publishes each QP's next deadline to the heap (a new or earlier one wakes
        // the thread if it planned to sleep past it).
        for qp in touched.iter().chain(due.iter()) {
            if qp.drive(&self.mrs, now, drained, hold_acks) {
                self.hold_acks_of(qp, now);
            }
        }
        // Deadlines of the QPs driven moved: make the heap's minimum exact again.
        let driven = touched.len() + due.len();
        let timer = if driven > 0 {
            self.timers.settle()
        } else {
            self.timers.min()
        };
        // Stopped while sending: the deadlines just armed must not count that time.
        let end = self.stall_inside(now, self.now(), driven, timer);
        self.last_pass.store(end, Ordering::Relaxed);
        drop(rx);
        Some(Pass {
            now,
            taken: taken_total,
            silent,
        })
    }

    /// Receives from `port` (bounded: at most 16 batches and RX_PASS_DATAGRAMS datagrams,
    /// so timers and posts are not starved) and feeds each datagram to its QP; the QPs fed
    /// are added to `touched`, and the processed packets that complete nothing at this end
    /// ([`learner::completes_nothing_here`]) are counted in `silent`. Returns whether the
    /// socket was drained (false: the bound stopped it with datagrams still queued) and
    /// the messages taken.
    fn receive_from(
        &self,
        port: &UdpPort,
        rx: &mut RxBatch,
        touched: &mut Touched,
        silent: &mut usize,
    ) -> (bool, usize) {
        let mut taken = 0;
        for _ in 0..16 {
            let n = match port.recv_batch(rx) {
                Ok(n) => n,
                Err(e) => {
                    log::warn!(target: "rdmx::soft", "recv on {}: {e}", port.local_addr());
                    0
                }
            };
            if n == 0 {
                return (true, taken);
            }
            let now = self.now();
            let qps = self.qps.read();
            let mut view = self.mrs.view();
            let drops = &self.stats.port;
            for i in 0..n {
                // Truncated datagrams are counted by the port.
                let Some(d) = rx.get(i) else { continue };
                let Ok(bth) = Bth::new_checked(d.data) else {
                    drops.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if d.data.len() < BTH_LEN + 4 {
                    drops.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let Some(qp) = qps.get(&bth.dest_qp()) else {
                    if self.receive_ud(&mut view, bth.dest_qp(), &d) {
                        continue;
                    }
                    drops.unknown_qpn.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                // The source check comes first (rxe `check_addr`): a stranger's packet
                // costs no ICRC and never reaches the engine.
                let counter = match qp.receive(&mut view, now, d.src, d.dst, d.data) {
                    Received::Processed => {
                        if learner::completes_nothing_here(bth.opcode_raw()) {
                            *silent += 1;
                        }
                        if !touched.iter().any(|q| Arc::ptr_eq(q, qp)) {
                            touched.push(Arc::clone(qp));
                        }
                        continue;
                    }
                    Received::WrongSource => &drops.wrong_source,
                    Received::BadIcrc => &drops.bad_icrc,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            taken += n;
            if rx.messages() < rx.capacity() {
                return (true, taken);
            }
            if taken >= RX_PASS_DATAGRAMS {
                return (false, taken);
            }
        }
        (false, taken)
    }

    /// Side channels among `fds` that poll reported readable: a closed one means the peer
    /// is gone.
    fn check_watches(&self, fds: &[RawFd]) {
        let dead: Vec<(RawFd, u32)> = {
            let mut w = self.watches.lock();
            let dead: Vec<(RawFd, u32)> = fds
                .iter()
                .filter(|fd| w.contains_key(fd) && sys::peer_closed(**fd))
                .map(|fd| (*fd, w[fd]))
                .collect();
            // No longer watched (dead, or unwatched meanwhile): out of the epoll set, which
            // would otherwise report it again at once.
            for fd in fds {
                if !w.contains_key(fd) {
                    self.watch_set.remove(*fd);
                }
            }
            for (fd, _) in &dead {
                w.remove(fd);
                self.watch_set.remove(*fd);
            }
            dead
        };
        for (_, qpn) in dead {
            if let Some(qp) = self.qps.read().get(&qpn).cloned() {
                log::info!(target: "rdmx::soft", "QP {qpn:#x}: peer closed the side channel; flushing");
                qp.fail(&self.mrs, self.now());
                qp.send_cq.wake_waiters();
            }
        }
    }

    /// The earliest armed timer of any QP (possibly early: a pass then finds nothing due
    /// and repairs it; never late).
    fn next_deadline(&self) -> Option<u64> {
        let m = self.timers.min();
        (m != u64::MAX).then_some(m)
    }
}

/// What a progress pass did.
struct Pass {
    /// The engine time it ran at.
    now: u64,
    /// Datagrams (or GRO messages) it took from the sockets.
    taken: usize,
    /// Of the packets in them, those a QP processed that complete nothing at this end
    /// (RDMA WRITE without immediate, READ and atomic requests): the application learns of
    /// them by looking at its memory, never by polling ([`learner::completes_nothing_here`]).
    silent: usize,
}

/// How long an application pass holds back positive ACKs at most (see `held_acks`): long
/// enough for its callbacks to post the answer that carries them, and below every ACK
/// timeout from code 4 (67 us) up (codes 1-3, 8-33 us, no userspace responder meets).
const ACK_HOLD_NS: u64 = 50_000;

/// How long after the application's last poll the thread takes over receiving
/// (progress=inline): `polling_us`, at most 1 ms. While the application polls, the thread
/// looks this often whether it still does (a passive side, e.g. a target only serving RDMA
/// READs, that stops polling is answered within this), and whether it left datagrams
/// queued (then it waits elsewhere: `thread_rx`). 0: the thread always receives.
fn inline_handover_ns(s: &Shared) -> u64 {
    u64::from(s.settings.polling_us).min(MAX_HANDOVER_US) * 1000
}

/// The cap on `polling_us` as the inline handover time.
const MAX_HANDOVER_US: u64 = 1000;
/// Longest sleep of the progress thread without the sockets after it found the receive
/// lock taken (the poll that holds it wakes the thread when it ends: `rx_wanted`).
const RX_BUSY_MAX_WAIT: Duration = Duration::from_millis(1);
/// The progress thread: [`progress_loop`] until the device stops. A panic in a pass (a
/// completion hook it ran, a bug) would otherwise end the thread silently and with it every
/// timer of the device (ACK timeouts, retransmissions, held ACKs): it is caught, counted
/// (`ProgressStats::progress_panics`), logged at error level, every QP of the device is
/// failed (its work flushes; what it was doing cannot be trusted), and the loop starts
/// again.
fn progress_thread(s: &Shared) {
    while !s.stop.load(Ordering::Acquire) {
        let Err(payload) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| progress_loop(s)))
        else {
            return;
        };
        s.stats.progress_panics.fetch_add(1, Ordering::Relaxed);
        let qps: Vec<Arc<SoftQp>> = s.qps.read().values().cloned().collect();
        log::error!(
            target: "rdmx::soft",
            "progress thread panicked: {}; failing the device's {} QPs and going on",
            crate::logging::panic_message(payload.as_ref()),
            qps.len()
        );
        for qp in qps {
            qp.fail(&s.mrs, s.now());
        }
    }
}

fn progress_loop(s: &Shared) {
    // The poll set, owned by the loop (no allocation per loop): the wake fd, the receiving
    // ports while this thread receives, and the epoll set of watched side channels (one
    // fd however many connections the device has).
    let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(2 + s.ports.len());
    let mut events: Vec<libc::epoll_event> = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut readable: Vec<RawFd> = Vec::with_capacity(64);
    let inline = s.settings.progress == Progress::Inline;
    let t = &s.timers;
    let mut learner = Learner::default();
    // The last pass found the receive lock taken by an application poll: while this thread
    // receives for the application (`thread_rx`, a CQ armed), it waits for that poll to
    // end (`rx_wanted`); otherwise the application polls again and receives for itself.
    let mut lock_busy = false;
    let mut app_back = false;
    while !s.stop.load(Ordering::Acquire) {
        let now = s.now();
        // progress=thread: this thread receives. progress=inline: the caller's poll does
        // while it polls (`app_polls`: recently, no CQ armed, not learned to wait
        // elsewhere), or it sleeps on the sockets itself (`app_watchers`); this thread
        // then only runs timers and watches side channels, and looks every handover time.
        let handover = Duration::from_nanos(inline_handover_ns(s));
        let app_polling = inline
            && (std::mem::take(&mut app_back)
                || s.app_watchers.load(Ordering::Acquire) > 0
                || s.app_polls(now));
        // After a busy lock, sleep without the sockets (still readable: the datagram waits
        // for the poll that holds the lock) until that poll ends and signals.
        let watch = !app_polling && !lock_busy;
        pfds.clear();
        pfds.push(sys::pollin(t.wake.raw_fd()));
        pfds.push(sys::pollin(s.watch_set.raw_fd()));
        if watch {
            pfds.extend(
                s.ports
                    .iter()
                    .filter(|p| p.qps.load(Ordering::Acquire) > 0)
                    .map(|p| sys::pollin(p.sock.raw_fd())),
            );
            s.thread_watching.store(true, Ordering::SeqCst);
        }
        // Announce the longest sleep first, then look at the deadlines: a timer armed
        // between the two sees the long sleep and kicks; one before is in the heap's
        // minimum.
        t.planned_wake
            .store(now + IDLE_SLEEP.as_nanos() as u64, Ordering::Release);
        let mut timeout = match s.next_deadline() {
            Some(d) if d <= now => Duration::ZERO,
            Some(d) => Duration::from_nanos(d - now).min(IDLE_SLEEP),
            None => IDLE_SLEEP,
        };
        if app_polling {
            // Look again when the caller may have stopped polling.
            timeout = timeout.min(handover);
        }
        if lock_busy {
            // The poll signals when it ends; this bounds the wait if it never does.
            timeout = timeout.min(RX_BUSY_MAX_WAIT);
            lock_busy = false;
        }
        t.planned_wake
            .store(now + timeout.as_nanos() as u64, Ordering::Release);
        if let Err(e) = sys::poll_set(&mut pfds, timeout) {
            log::error!(target: "rdmx::soft", "progress: {e}");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Before anything reads `armed_cqs`/`thread_rx` again (see `app_sleeping`).
        s.thread_watching.store(false, Ordering::SeqCst);
        let socket_woke = watch && pfds[2..].iter().any(|p| p.revents != 0);
        if pfds[0].revents != 0 {
            // (Read only when signaled: one system call less per wakeup by a datagram.)
            t.wake.clear();
        }
        readable.clear();
        if pfds[1].revents != 0 {
            s.watch_set.ready(&mut events, &mut readable);
        }
        let side_channel_event = !readable.is_empty();
        // Inline while an app-driven caller (the messenger) polls: its passes receive and
        // run the timers, so this thread steps in only for a due timer (the caller may be
        // asleep on the sockets, which a timer does not wake) or a side-channel event. A pass of its own would
        // hold the receive lock the caller's next poll needs: measured, a messenger worker
        // found it taken ~100,000 times a second at 60K rpc/s, each time a pass with nothing
        // and a poll(2) that returned at once on the still unread socket.
        let after = s.now();
        let app_driven = inline && s.hold_acks.load(Ordering::Relaxed);
        let still_polling = app_driven
            && (s.app_watchers.load(Ordering::Acquire) > 0
                || after.saturating_sub(s.last_app_poll.load(Ordering::Relaxed))
                    < handover.as_nanos() as u64);
        if still_polling && !side_channel_event && s.next_deadline().is_none_or(|d| d > after) {
            continue;
        }
        // Inline: skip if the caller is at it (try-lock); thread: wait for the lock. Before
        // acting on a side-channel event always receive first (waiting for the lock): a peer
        // that answers (e.g. with a NAK) and then closes must have its answer processed
        // before its EOF fails the QP.
        let last_poll = s.last_app_poll.load(Ordering::Relaxed);
        let mut pass = s.progress_once(!inline || side_channel_event, false);
        let learning = inline && !app_driven;
        let mut absent = after.saturating_sub(last_poll);
        let receiver = s.thread_rx.load(Ordering::SeqCst) || s.armed_cqs.load(Ordering::SeqCst) > 0;
        if pass.is_none() && socket_woke && learning && !receiver {
            // The application had stopped polling for the handover time and polls again
            // (its poll holds the lock): it receives for itself from now on, as while it
            // polls; this thread's next sleep is a look. (Its `last_app_poll` is written
            // when the poll ends; until then the sockets would wake this thread again at
            // once.)
            app_back = true;
        } else if pass.is_none() && socket_woke && learning {
            // Woken by a datagram while an application poll holds the receive lock, while
            // this thread receives for the application: ask that poll to wake this thread
            // when it ends (`rx_wanted`), then try once more
            // (it may have ended before it could see the flag). The datagram may have come
            // after the poll's receive, and a program that stops polling right after (a
            // memory spinner that got its own completion, a waiter going back to sleep)
            // would leave it for the next timer or look. Backing off 20 us instead cost
            // such a datagram the backoff plus the timer slack (up to 70 us); blocking on
            // the lock would make every poll skip its receive whenever the lock was handed
            // to this thread before it ran again (milliseconds on a loaded host).
            s.rx_wanted.store(true, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            pass = s.progress_once(false, false);
            if pass.is_some() {
                s.rx_wanted.store(false, Ordering::Relaxed);
            } else {
                lock_busy = true;
            }
            absent = 0;
        }
        if learning {
            learner_step(
                s,
                &mut learner,
                app_polling,
                socket_woke,
                pass.as_ref(),
                absent,
                after,
            );
        }
        if side_channel_event {
            s.check_watches(&readable);
        }
        if app_driven {
            // An app-driven caller may sleep on the sockets this pass drained.
            s.app_wake.signal();
        }
    }
}

/// Feeds what a pass of the progress thread saw to the learner and applies its verdict
/// to `thread_rx` (see `device/learner.rs`): `looked` = the pass was a look at the
/// handover interval, `woke` = a socket woke the thread, `absent` = ns since the
/// application's last poll when it began at `at`.
fn learner_step(
    s: &Shared,
    learner: &mut Learner,
    looked: bool,
    woke: bool,
    pass: Option<&Pass>,
    absent: u64,
    at: u64,
) {
    let seen = Seen {
        looked,
        woke,
        took: pass.map(|p| (p.taken, p.silent)),
        absent,
        at,
    };
    let receiving = s.thread_rx.load(Ordering::SeqCst);
    let armed = s.armed_cqs.load(Ordering::SeqCst) > 0;
    match learner.after_pass(receiving, armed, &seen) {
        Verdict::Keep => {}
        Verdict::TakeOver => {
            log::debug!(target: "rdmx::soft", "progress: an RDMA WRITE or READ waited {absent} ns for an application that polls now and then; the progress thread receives");
            s.stats.takeovers.fetch_add(1, Ordering::Relaxed);
            s.thread_rx.store(true, Ordering::SeqCst);
        }
        Verdict::GiveBack => {
            // The learner saw no CQ armed. An arming racing this store may be undone by
            // it, harmlessly: its tally keeps the thread receiving until it fires
            // (`app_polls`), and the next arming sets `thread_rx` again.
            log::debug!(target: "rdmx::soft", "progress: the application polls for what it waits for; it receives");
            s.thread_rx.store(false, Ordering::SeqCst);
        }
    }
}

/// The watched TCP side channels as one epoll set (readable or hung up), so the progress
/// thread polls one fd however many connections there are.
struct WatchSet(OwnedFd);

impl WatchSet {
    fn new() -> Result<WatchSet> {
        // SAFETY: epoll_create1 takes no pointers; a valid fd is returned or -1.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!("epoll_create1: {}", std::io::Error::last_os_error()),
            ));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        Ok(WatchSet(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd) -> std::io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            u64: fd as u64,
        };
        // SAFETY: `ev` lives for the call; the kernel copies it (and ignores it for DEL).
        if unsafe { libc::epoll_ctl(self.raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn add(&self, fd: RawFd) {
        let r = match self.ctl(libc::EPOLL_CTL_ADD, fd) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => self.ctl(libc::EPOLL_CTL_MOD, fd),
            r => r,
        };
        if let Err(e) = r {
            log::warn!(target: "rdmx::soft", "side channel fd {fd}: cannot watch: {e}");
        }
    }

    /// Stops watching `fd` (already gone from the set if it was closed: ignored).
    fn remove(&self, fd: RawFd) {
        let _ = self.ctl(libc::EPOLL_CTL_DEL, fd);
    }

    /// The watched fds that are ready now, into `out` (`events`: the caller's buffer).
    fn ready(&self, events: &mut [libc::epoll_event], out: &mut Vec<RawFd>) {
        // SAFETY: `events` is a live buffer of `events.len()` entries the kernel fills;
        // timeout 0 does not block.
        let n = unsafe {
            libc::epoll_wait(
                self.raw_fd(),
                events.as_mut_ptr(),
                events.len().min(i32::MAX as usize) as i32,
                0,
            )
        };
        for e in events.iter().take(n.max(0) as usize) {
            out.push(e.u64 as RawFd);
        }
    }
}

/// QP numbers are 24 bits.
const QPN_MASK: u32 = 0x00FF_FFFF;
/// Random QP numbers [`pick_qpn`] draws before it scans for a free one.
const QPN_DRAWS: usize = 32;
/// Times `add_qp` picks again when another `create_qp` took its number meanwhile.
const QPN_RACES: usize = 8;

/// Whether `qpn` may name a new QP: 0 (SMI) and 1 (GSI) are reserved by IB, and 0xFFFFFF
/// is the multicast QP number.
fn qpn_assignable(qpn: u32) -> bool {
    qpn > 1 && qpn < QPN_MASK
}

/// A number for a new QP: a random 24-bit value from `draw` (kernel randomness), so one
/// connection's QP number says nothing about the next one's, skipping reserved numbers and
/// live ones (`is_live`), so a live QP is never replaced. After [`QPN_DRAWS`] draws that
/// all hit (a nearly full table) it scans from a random point; [`ErrorKind::Full`] when
/// every number is taken. Errors of `draw` are passed on.
fn pick_qpn(is_live: &dyn Fn(u32) -> bool, draw: &mut dyn FnMut() -> Result<u32>) -> Result<u32> {
    for _ in 0..QPN_DRAWS {
        let qpn = draw()? & QPN_MASK;
        if qpn_assignable(qpn) && !is_live(qpn) {
            return Ok(qpn);
        }
    }
    let start = draw()?;
    (0..=QPN_MASK)
        .map(|i| start.wrapping_add(i) & QPN_MASK)
        .find(|&q| qpn_assignable(q) && !is_live(q))
        .ok_or_else(|| {
            Error::new(
                ErrorKind::Full,
                format!(
                    "soft provider: every QP number is in use ({} QPs)",
                    QPN_MASK - 2
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn settings() -> Settings {
        let mut c = Config::new();
        c.set("soft_port", "0").unwrap();
        c.settings().unwrap()
    }

    fn cq() -> Arc<Cq> {
        Arc::new(Cq::new(4, Arc::new(EventFd::new().unwrap())))
    }

    #[test]
    fn a_family_without_a_port_is_refused_clearly_and_ports_count_their_qps() {
        let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let dev = SoftDevice::open(&settings(), &[IpAddr::V4(Ipv4Addr::UNSPECIFIED)]).unwrap();
        assert_eq!(dev.udp_addrs().len(), 1);
        assert!(dev.udp_addr_for(IpAddr::V6(Ipv6Addr::LOCALHOST)).is_none());
        let e = dev
            .create_qp(
                QpCaps::default(),
                IpAddr::V6(Ipv6Addr::LOCALHOST),
                cq(),
                cq(),
            )
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert!(e.message().contains("no IPv6 UDP port"), "{e}");
        // An IPv4-mapped address is IPv4.
        let mapped = IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped());
        let qp = dev
            .create_qp(QpCaps::default(), mapped, cq(), cq())
            .unwrap();
        assert!(qp.local_udp().is_ipv4());
        let qp2 = dev.create_qp(QpCaps::default(), v4, cq(), cq()).unwrap();
        assert_eq!(dev.shared.ports[0].qps.load(Ordering::Acquire), 2);
        dev.destroy_qp(qp.qpn());
        dev.destroy_qp(qp2.qpn());
        dev.destroy_qp(qp2.qpn()); // twice: no underflow
        assert_eq!(dev.shared.ports[0].qps.load(Ordering::Acquire), 0);
    }

    /// A `draw` that returns `seq` in turn.
    fn scripted(seq: &[u32]) -> impl FnMut() -> Result<u32> + '_ {
        let mut it = seq.iter();
        move || Ok(*it.next().expect("scripted draws ran out"))
    }

    #[test]
    fn qp_numbers_skip_reserved_and_live_ones_and_never_replace_a_qp() {
        let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let dev = SoftDevice::open(&settings(), &[v4]).unwrap();
        let a = dev.create_qp(QpCaps::default(), v4, cq(), cq()).unwrap();
        let live = a.qpn();
        assert!(qpn_assignable(live), "{live:#x}");
        // Forced collisions: 0, 1 and 0xFFFFFF are reserved, `live` (also with high bits
        // set) is taken; the first free draw wins.
        let draws = [0, 1, QPN_MASK, live, live | 0x5A00_0000, live ^ 0x80_0000];
        let mut draw = scripted(&draws);
        let mut built = Vec::new();
        let b = dev
            .add_qp(
                &mut |qpn| {
                    built.push(qpn);
                    SoftQp::new(
                        qpn,
                        QpCaps::default(),
                        v4,
                        cq(),
                        cq(),
                        TxOptions::default(),
                        Default::default(),
                    )
                },
                &mut draw,
            )
            .unwrap();
        assert_eq!(b.qpn(), live ^ 0x80_0000);
        assert_eq!(built, [b.qpn()]);
        // The live QP is still the one registered under its number.
        assert!(Arc::ptr_eq(&dev.shared.qps.read()[&live], &a));
        assert_eq!(dev.shared.qps.read().len(), 2);
        // A randomness failure is an error, not a QP.
        let e = dev
            .add_qp(&mut |_| unreachable!(), &mut || {
                Err(Error::new(ErrorKind::Io, "kernel randomness: none"))
            })
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        dev.destroy_qp(a.qpn());
        dev.destroy_qp(b.qpn());
    }

    #[test]
    fn a_nearly_full_table_scans_and_a_full_one_says_so() {
        // Every draw hits a live number: the scan finds the one free number.
        let free = 0x12_3456;
        let mut always_live = || Ok(free + 1);
        assert_eq!(pick_qpn(&|q| q != free, &mut always_live).unwrap(), free);
        // The scan wraps past 0xFFFFFF and skips the reserved numbers.
        let mut high = || Ok(QPN_MASK);
        assert_eq!(pick_qpn(&|q| q > 2, &mut high).unwrap(), 2);
        let e = pick_qpn(&|_| true, &mut always_live).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Full);
        assert!(e.message().contains("every QP number is in use"), "{e}");
    }

    #[test]
    fn consecutive_qp_numbers_are_not_sequential() {
        let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let dev = SoftDevice::open(&settings(), &[v4]).unwrap();
        let qps: Vec<_> = (0..4)
            .map(|_| dev.create_qp(QpCaps::default(), v4, cq(), cq()).unwrap())
            .collect();
        let n: Vec<u32> = qps.iter().map(|q| q.qpn()).collect();
        println!("QP numbers: {n:x?}");
        for w in n.windows(2) {
            assert!(qpn_assignable(w[1]), "{n:x?}");
            // A counter gives w[0] + 1; random numbers do so with probability 2^-24.
            assert_ne!(w[1], (w[0] + 1) & QPN_MASK, "sequential QP numbers: {n:x?}");
        }
        for q in &qps {
            dev.destroy_qp(q.qpn());
        }
    }

    #[test]
    fn the_timer_heap_pops_only_due_qps_and_follows_moved_deadlines() {
        let t = Arc::new(DeviceTimers::new().unwrap());
        let cells: Vec<Arc<TimerCell>> = (0..1000).map(|q| Arc::new(TimerCell::new(q))).collect();
        // 998 idle QPs (no deadline) cost nothing: not in the heap.
        for c in &cells {
            c.publish(None, Some(&t));
        }
        assert_eq!((t.len(), t.min()), (0, u64::MAX));
        let (a, b) = (&cells[7], &cells[500]);
        a.publish(Some(1_000), Some(&t));
        b.publish(Some(5_000), Some(&t));
        assert_eq!((t.len(), t.min()), (2, 1_000));
        let mut due = SmallVec::new();
        t.take_due(999, &mut due);
        assert!(due.is_empty());
        // `a`'s deadline moves later (an ACK): no heap work, the entry is found stale when
        // due and pushed again at the new deadline.
        a.publish(Some(2_000), Some(&t));
        assert_eq!((t.len(), t.min()), (2, 1_000));
        t.take_due(1_500, &mut due);
        assert!(due.is_empty());
        assert_eq!((t.len(), t.min()), (2, 2_000));
        // Earlier again: pushed at once; the later entry is a duplicate, dropped.
        a.publish(Some(1_800), Some(&t));
        assert_eq!((t.len(), t.min()), (3, 1_800));
        t.take_due(2_000, &mut due);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].qpn, 7);
        assert_eq!((t.len(), t.min()), (1, 5_000));
        // Driving the due QP publishes its next deadline (its entry left the heap).
        a.publish(Some(9_000), Some(&t));
        assert_eq!((t.len(), t.min()), (2, 5_000));
        // `b` moved later: settle makes the minimum exact without waiting for it.
        b.publish(Some(20_000), Some(&t));
        assert_eq!(t.settle(), 9_000);
        // A deadline cleared (ACKed, QP in ERR): the entry leaves at settle.
        a.publish(None, Some(&t));
        assert_eq!(t.settle(), 20_000);
        due.clear();
        t.take_due(u64::MAX - 1, &mut due);
        assert_eq!(due.len(), 1);
        assert_eq!((t.len(), t.min()), (0, u64::MAX));
    }

    #[test]
    fn a_qps_deadline_is_read_without_its_lock_and_reaches_the_device() {
        let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let dev = SoftDevice::open(&settings(), &[v4]).unwrap();
        let qp = dev.create_qp(QpCaps::default(), v4, cq(), cq()).unwrap();
        assert_eq!(qp.next_deadline(), None);
        assert_eq!(dev.shared.timers.min(), u64::MAX);
        dev.destroy_qp(qp.qpn());
    }

    /// The progress thread's request to be woken when an application poll ends
    /// (`rx_wanted`, set when it found the receive lock taken while it receives for the
    /// application) is answered by the next poll, once: the flag is taken and the wake fd
    /// signaled. An app-driven caller (the messenger) never answers (no fence per poll;
    /// the thread never asks it).
    #[test]
    fn a_poll_wakes_the_thread_that_waits_for_the_receive_lock() {
        let v4 = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let dev = SoftDevice::open(&settings(), &[v4]).unwrap();
        let s = &dev.shared;
        dev.progress_inline();
        assert!(!s.rx_wanted.load(Ordering::SeqCst));
        s.rx_wanted.store(true, Ordering::SeqCst);
        dev.progress_inline();
        assert!(!s.rx_wanted.load(Ordering::SeqCst), "the poll answered");
        dev.set_app_driven(true);
        s.rx_wanted.store(true, Ordering::SeqCst);
        dev.progress_inline();
        assert!(
            s.rx_wanted.load(Ordering::SeqCst),
            "an app-driven poll does not look"
        );
    }

    #[test]
    fn opening_needs_the_first_address_only() {
        // A second address of the same family is skipped; a later one that cannot bind is
        // logged and left out (its family is then refused); the first one must bind.
        let s = settings();
        let dev = SoftDevice::open(
            &s,
            &[
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                // Documentation prefix, not on this host: cannot bind.
                "2001:db8::1".parse().unwrap(),
            ],
        )
        .unwrap();
        assert_eq!(dev.udp_addrs().len(), 1);
        assert!(dev.udp_addr().ip().is_loopback());
        assert!(dev.udp_addr_for("::1".parse().unwrap()).is_none());
        let e = SoftDevice::open(&s, &["192.0.2.1".parse().unwrap()]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        let e = SoftDevice::open(&s, &[]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
}

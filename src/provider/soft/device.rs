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
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::cq::Cq;
use super::mr::MrTable;
use super::qp::SoftQp;
use super::sys::{self, EventFd};
use super::udp::{self, RxBatch, UdpPort};

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

/// QPs one progress pass drives (inline: a pass runs per poll, so no heap allocation).
type Touched = SmallVec<[Arc<SoftQp>; 4]>;

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
    /// TCP side channels to watch for EOF: fd -> QP.
    watches: Mutex<HashMap<RawFd, u32>>,
    wake: EventFd,
    stop: AtomicBool,
    /// Serializes receive processing (the thread, or an inline poller).
    rx: Mutex<RxBatch>,
    epoch: Instant,
    next_qpn: AtomicU32,
    /// When the progress thread will wake next (ns on the device clock).
    planned_wake: AtomicU64,
    /// Last time the application drove progress itself (progress=inline), ns.
    last_app_poll: AtomicU64,
}

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
                    return Err(Error::new(
                        ErrorKind::Io,
                        format!(
                            "soft provider: cannot bind UDP {addr}: {e} (another rdmx process on this host? set soft_port=0 for any free port)"
                        ),
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
            watches: Mutex::new(HashMap::default()),
            wake: EventFd::new()?,
            stop: AtomicBool::new(false),
            rx: Mutex::new(RxBatch::new(RX_BATCH, crate::rc::max_packet_len(4096) + 64)),
            epoch: Instant::now(),
            // QPNs start at a random point (never 0 or 1, which IB reserves).
            next_qpn: AtomicU32::new((sys::random_u32() & 0x7F_FFFF) | 0x10),
            planned_wake: AtomicU64::new(0),
            last_app_poll: AtomicU64::new(0),
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

    /// Nanoseconds on the device's clock (what the engine's timers run on).
    pub fn now(&self) -> u64 {
        self.shared.now()
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
        let qpn = self.shared.next_qpn.fetch_add(1, Ordering::Relaxed) & 0x00FF_FFFF;
        let qp = Arc::new(SoftQp::new(
            qpn,
            caps,
            ip,
            send_cq,
            recv_cq,
            self.shared.settings.soft_drop_ppb,
        )?);
        self.shared.qps.write().insert(qpn, Arc::clone(&qp));
        self.shared.ports[port].qps.fetch_add(1, Ordering::AcqRel);
        // The progress thread may be asleep without watching this port yet.
        self.shared.wake.signal();
        Ok(qp)
    }

    /// Forgets a QP (after it was drained): its packets are dropped from now on.
    pub fn destroy_qp(&self, qpn: u32) {
        if let Some(qp) = self.shared.qps.write().remove(&qpn)
            && let Some(port) = self.shared.port_for(qp.local_udp().ip())
        {
            self.shared.ports[port].qps.fetch_sub(1, Ordering::AcqRel);
        }
        self.shared.watches.lock().retain(|_, q| *q != qpn);
    }

    /// Watches a TCP side channel: when its peer closes, the QP goes to ERR (flushing
    /// every outstanding WR) and its CQ channel is signaled.
    pub fn watch(&self, fd: RawFd, qpn: u32) {
        self.shared.watches.lock().insert(fd, qpn);
        self.shared.wake.signal();
    }

    pub fn unwatch(&self, fd: RawFd) {
        self.shared.watches.lock().remove(&fd);
    }

    /// Wakes the progress thread (e.g. after a post whose packets the caller could not
    /// send, or to re-evaluate timers).
    pub fn kick(&self) {
        self.shared.wake.signal();
    }

    /// A caller armed a timer due at `deadline`: wakes the progress thread if it planned
    /// to sleep past it (timers fire whether or not the application polls). One atomic
    /// load in the common case; a wakeup only when the new deadline is the earliest.
    pub fn timer_armed(&self, deadline: Option<u64>) {
        if let Some(d) = deadline
            && d < self.shared.planned_wake.load(Ordering::Acquire)
        {
            self.shared.planned_wake.store(d, Ordering::Release);
            self.shared.wake.signal();
        }
    }

    /// One pass of progress from the caller's thread (progress=inline, or busy polling):
    /// receive what is queued, run due timers. Skipped if another thread is at it.
    pub fn progress_inline(&self) {
        // The pass reads the clock anyway; reuse its reading (a poll loop calls this
        // millions of times a second).
        let now = match self.shared.progress_once(false) {
            Some(now) => now,
            None => self.shared.now(),
        };
        self.shared.last_app_poll.store(now, Ordering::Relaxed);
    }

    pub fn progress_mode(&self) -> Progress {
        self.shared.settings.progress
    }
}

impl Drop for SoftDevice {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.signal();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    /// Index of the receiving port for `ip`'s family.
    fn port_for(&self, ip: IpAddr) -> Option<usize> {
        let v4 = ip.to_canonical().is_ipv4();
        self.ports
            .iter()
            .position(|p| p.sock.local_addr().is_ipv4() == v4)
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Receives queued datagrams (up to a bound), runs due timers, checks watched side
    /// channels. `wait` = block on the receive lock instead of skipping when it is busy.
    /// Returns the time the pass ran at, or None if it skipped (the lock was busy).
    fn progress_once(&self, wait: bool) -> Option<u64> {
        let rx = if wait {
            Some(self.rx.lock())
        } else {
            self.rx.try_lock()
        };
        let mut rx = rx?;
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
        for port in self
            .ports
            .iter()
            .filter(|p| p.qps.load(Ordering::Acquire) > 0)
        {
            self.receive_from(&port.sock, &mut rx, &mut touched);
        }
        drop(rx);
        let now = self.now();
        // Responses for what arrived, and every due timer.
        let due: Touched = self
            .qps
            .read()
            .values()
            .filter(|q| q.next_deadline().is_some_and(|d| d <= now))
            .cloned()
            .collect();
        for qp in touched.iter().chain(due.iter()) {
            qp.drive(&self.mrs, now);
        }
        Some(now)
    }

    /// Receives from `port` (bounded: at most 16 batches and RX_PASS_DATAGRAMS datagrams,
    /// so timers and posts are not starved) and feeds each datagram to its QP; the QPs fed
    /// are added to `touched`.
    fn receive_from(&self, port: &UdpPort, rx: &mut RxBatch, touched: &mut Touched) {
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
                break;
            }
            let now = self.now();
            let qps = self.qps.read();
            let mut view = self.mrs.view();
            for i in 0..n {
                let Some(d) = rx.get(i) else { continue };
                let Ok(bth) = Bth::new_checked(d.data) else {
                    continue;
                };
                if d.data.len() < BTH_LEN + 4 {
                    continue;
                }
                let Some(qp) = qps.get(&bth.dest_qp()) else {
                    continue;
                };
                let ok = udp::verify(d.src, d.dst, d.data);
                qp.receive(&mut view, now, d.data, ok);
                if !touched.iter().any(|q| Arc::ptr_eq(q, qp)) {
                    touched.push(Arc::clone(qp));
                }
            }
            taken += n;
            if rx.messages() < rx.capacity() || taken >= RX_PASS_DATAGRAMS {
                break;
            }
        }
    }

    /// Side channels among `fds` that poll reported readable: a closed one means the peer
    /// is gone.
    fn check_watches(&self, fds: &[RawFd]) {
        let dead: Vec<(RawFd, u32)> = {
            let w = self.watches.lock();
            fds.iter()
                .filter(|fd| w.contains_key(fd) && sys::peer_closed(**fd))
                .map(|fd| (*fd, w[fd]))
                .collect()
        };
        for (fd, qpn) in dead {
            self.watches.lock().remove(&fd);
            if let Some(qp) = self.qps.read().get(&qpn).cloned() {
                log::info!(target: "rdmx::soft", "QP {qpn:#x}: peer closed the side channel; flushing");
                qp.fail(&self.mrs);
                qp.send_cq.wake_waiters();
            }
        }
    }

    fn next_deadline(&self) -> Option<u64> {
        self.qps
            .read()
            .values()
            .filter_map(|q| q.next_deadline())
            .min()
    }
}

/// How long after the application's last poll the thread takes over receiving
/// (progress=inline): a passive side (e.g. a target only serving RDMA READs) that stops
/// polling is still answered within this.
fn inline_handover(s: &Shared) -> Duration {
    Duration::from_micros(u64::from(s.settings.polling_us).max(1000))
}

fn progress_thread(s: &Shared) {
    let mut fds: Vec<RawFd> = Vec::new();
    let mut ready = Vec::new();
    let inline = s.settings.progress == Progress::Inline;
    while !s.stop.load(Ordering::Acquire) {
        let now = s.now();
        // progress=thread: this thread receives. progress=inline: the caller's poll does,
        // and this thread only runs timers and watches side channels, unless the caller
        // has not polled for a while.
        let handover = inline_handover(s);
        let app_polling = inline
            && now.saturating_sub(s.last_app_poll.load(Ordering::Relaxed))
                < handover.as_nanos() as u64;
        fds.clear();
        fds.push(s.wake.raw_fd());
        if !app_polling {
            fds.extend(
                s.ports
                    .iter()
                    .filter(|p| p.qps.load(Ordering::Acquire) > 0)
                    .map(|p| p.sock.raw_fd()),
            );
        }
        fds.extend(s.watches.lock().keys().copied());
        // Announce the longest sleep first, then look at the deadlines: a post between the
        // two sees the long sleep and kicks; one before is in `next_deadline`.
        s.planned_wake
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
        s.planned_wake
            .store(now + timeout.as_nanos() as u64, Ordering::Release);
        if let Err(e) = sys::poll_readable(&fds, timeout, &mut ready) {
            log::error!(target: "rdmx::soft", "progress: {e}");
            std::thread::sleep(Duration::from_millis(10));
        }
        s.wake.clear();
        let readable: Vec<RawFd> = ready.iter().map(|&i| fds[i]).collect();
        let side_channel_event = {
            let w = s.watches.lock();
            readable.iter().any(|fd| w.contains_key(fd))
        };
        // Inline: skip if the caller is at it (try-lock); thread: wait for the lock. Before
        // acting on a side-channel event always receive first (waiting for the lock): a peer
        // that answers (e.g. with a NAK) and then closes must have its answer processed
        // before its EOF fails the QP.
        s.progress_once(!inline || side_channel_event);
        s.check_watches(&readable);
    }
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

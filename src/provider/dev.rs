//! The provider seam the messenger uses: a [`Device`] (soft or verbs) and a connection's
//! [`Qp`] with its CQs and completion channel. Enums, not trait objects: one predictable
//! branch per call on the post and poll paths, no dynamic dispatch, no allocation. The
//! soft provider's public objects (`SoftDevice`, `SoftQp`, `Cq`, `MrTable`) are untouched:
//! `Soft` wraps them; `rdmx-ibv` builds on them directly.

use super::ready::{DeviceReadiness, Hook, QpReadiness};
use super::region::{MrInfo, Region};
use super::soft::cq::Cq;
use super::soft::device::SoftDevice;
use super::soft::qp::{SoftQp, Timers};
use super::sys::EventFd;
use super::types::{PortCounters, ProgressStats, Remote, SendReq, Wc};
#[cfg(feature = "verbs")]
use super::verbs::{VerbsDevice, qp::VerbsQp};
use super::wr_stats::WrStats;
use crate::config::{CqLayout, PollMode, Progress, Settings};
use crate::error::{Error, ErrorKind, Result};
use crate::mem::Registrar;
use crate::rc::verbs::{QpState, access};
use crate::rc::{Counters, QpCaps, SgeList};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;

/// `$e` on the device, whichever provider it is (each arm typed by its own provider).
macro_rules! dev_both {
    ($self:expr, $d:ident => $e:expr) => {
        match $self {
            Device::Soft($d) => $e,
            #[cfg(feature = "verbs")]
            Device::Verbs($d) => $e,
        }
    };
}

/// A context's device.
#[derive(Debug)]
pub(crate) enum Device {
    Soft(SoftDevice),
    // Boxed: one per context, and it keeps the enum the soft device's size.
    #[cfg(feature = "verbs")]
    Verbs(Box<VerbsDevice>),
}

/// The [`MrInfo`] of a region-table entry (soft `mr::Region`, verbs `mr::VRegion`: the same
/// five public fields beside each provider's own state).
macro_rules! mr_info {
    ($r:expr) => {
        MrInfo {
            addr: $r.addr,
            len: $r.len,
            lkey: $r.lkey,
            rkey: $r.rkey,
            access: $r.access,
        }
    };
}

/// What this side puts in its hello for its QP: where peers send, capability flags, the
/// UDP source port of its packets (soft only), the path MTU it offers, and its rd_atomic
/// values.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Endpoint {
    pub udp: SocketAddr,
    pub roce: bool,
    pub src_port: Option<u16>,
}

impl Device {
    /// One progress pass from the caller's thread where the settings leave progress to
    /// polling callers (soft provider, progress=inline or poll_mode=busy: receive what is
    /// queued, run due timers); nothing otherwise (a NIC needs none).
    pub fn progress(&self, s: &Settings) {
        match self {
            Device::Soft(d) => {
                if s.progress == Progress::Inline || s.poll_mode == PollMode::Busy {
                    d.progress_inline();
                }
            }
            #[cfg(feature = "verbs")]
            Device::Verbs(_) => {}
        }
    }

    pub fn registrar(&self) -> Arc<dyn Registrar> {
        match self {
            Device::Soft(d) => d.mrs_arc(),
            #[cfg(feature = "verbs")]
            Device::Verbs(d) => d.mrs_arc(),
        }
    }

    /// # Safety
    /// The memory must stay valid and mapped until `deregister` succeeds.
    pub unsafe fn register(&self, addr: *mut u8, len: usize, acc: u32) -> Result<MrInfo> {
        dev_both!(self, d => {
            // SAFETY: forwarded contract.
            unsafe { d.mrs().register(addr, len, acc) }.map(|r| mr_info!(r))
        })
    }

    /// Whether the device binds memory windows (the messenger's scoped rkeys): the soft
    /// device always; a verbs device when it has type-2 windows (rdmx-ibv's `rdmx0`
    /// does; a NIC without them does not, see docs/security.md).
    pub fn binds_windows(&self) -> bool {
        match self {
            Device::Soft(_) => true,
            #[cfg(feature = "verbs")]
            Device::Verbs(d) => d.windows().is_some(),
        }
    }

    /// The memory windows of `qp`'s peer (`provider/windows.rs`); None when the device
    /// binds none.
    pub fn windows(&self, qp: &Qp) -> Option<Arc<dyn super::windows::QpWindows>> {
        match (self, qp) {
            (Device::Soft(d), Qp::Soft(q)) => Some(Arc::new(super::soft::window::SoftQpWindows {
                mrs: d.mrs_arc(),
                qpn: q.qp.qpn(),
            })),
            #[cfg(feature = "verbs")]
            (Device::Verbs(d), Qp::Verbs(q)) => {
                Some(Arc::new(super::verbs::window::VerbsQpWindows {
                    windows: d.windows()?,
                    qp: Arc::downgrade(q),
                }))
            }
            #[cfg(feature = "verbs")]
            _ => None,
        }
    }

    pub fn deregister(&self, lkey: u32) -> Result<()> {
        match self {
            Device::Soft(d) => d.mrs().deregister(lkey),
            #[cfg(feature = "verbs")]
            Device::Verbs(d) => d.mrs().deregister(lkey),
        }
    }

    /// Regions with remote access, for the hello.
    pub fn exposed(&self) -> Vec<Region> {
        dev_both!(self, d => d.mrs().exposed().iter().map(|r| mr_info!(r).exposed()).collect())
    }

    /// Soft: the UDP address; verbs: the GID's address and RoCEv2's port.
    pub fn udp_addr(&self) -> SocketAddr {
        match self {
            Device::Soft(d) => d.udp_addr(),
            #[cfg(feature = "verbs")]
            Device::Verbs(d) => d.endpoint(),
        }
    }

    pub fn udp_addr_for(&self, ip: IpAddr) -> Option<SocketAddr> {
        match self {
            Device::Soft(d) => d.udp_addr_for(ip),
            #[cfg(feature = "verbs")]
            Device::Verbs(d) => Some(d.endpoint()).filter(|_| ip.is_ipv4() || ip.is_ipv6()),
        }
    }

    /// Soft only (a NIC's drops are in its own counters): 0 on verbs.
    pub fn kernel_drops(&self) -> u64 {
        match self {
            Device::Soft(d) => d.kernel_drops(),
            #[cfg(feature = "verbs")]
            Device::Verbs(_) => 0,
        }
    }

    pub fn port_counters(&self) -> PortCounters {
        match self {
            Device::Soft(d) => d.port_counters(),
            #[cfg(feature = "verbs")]
            Device::Verbs(d) => PortCounters {
                async_events: d.async_events(),
                ..PortCounters::default()
            },
        }
    }

    pub fn progress_stats(&self) -> ProgressStats {
        match self {
            Device::Soft(d) => d.progress_stats(),
            #[cfg(feature = "verbs")]
            Device::Verbs(_) => ProgressStats::default(),
        }
    }

    /// The hello's endpoint for a QP whose side channel's local address is `local_ip`.
    pub fn endpoint(&self, qp: &Qp, local_ip: IpAddr) -> Result<Endpoint> {
        match (self, qp) {
            (Device::Soft(d), Qp::Soft(q)) => Ok(Endpoint {
                udp: d.udp_addr_for(local_ip).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Unsupported,
                        format!("soft provider: no UDP port for {local_ip}'s family on this host"),
                    )
                })?,
                roce: false,
                src_port: Some(q.qp.local_udp().port()),
            }),
            #[cfg(feature = "verbs")]
            (Device::Verbs(d), Qp::Verbs(_)) => Ok(Endpoint {
                udp: d.endpoint(),
                roce: true,
                src_port: None,
            }),
            #[cfg(feature = "verbs")]
            _ => unreachable!("a QP is made by its own device"),
        }
    }

    /// The path MTU offered (soft: capped by the route's link; verbs: by the port's
    /// active MTU, as a NIC caps it) and the rd_atomic values (verbs: capped by the
    /// device's limits).
    pub fn rd_atomic_offer(&self, s: &Settings) -> (u8, u8) {
        match self {
            Device::Soft(_) => (s.max_rd_atomic, s.max_dest_rd_atomic),
            #[cfg(feature = "verbs")]
            Device::Verbs(d) => d.rd_atomic_offer(),
        }
    }

    /// The verbs port's active MTU (None on soft: the route decides).
    pub fn port_mtu(&self) -> Option<u32> {
        match self {
            Device::Soft(_) => None,
            #[cfg(feature = "verbs")]
            Device::Verbs(d) => Some(d.active_mtu()),
        }
    }

    /// Creates a connection's QP (soft: RESET; verbs: INIT) with its CQs and channel.
    pub fn create_qp(&self, s: &Settings, local_ip: IpAddr) -> Result<Qp> {
        match self {
            Device::Soft(d) => {
                let channel = Arc::new(EventFd::new()?);
                let (send_cq, recv_cq) = match s.cq_layout() {
                    CqLayout::Separate { send, recv } => (
                        Arc::new(Cq::new(send as usize, Arc::clone(&channel))),
                        Arc::new(Cq::new(recv as usize, Arc::clone(&channel))),
                    ),
                    CqLayout::Shared { size } => {
                        let cq = Arc::new(Cq::new(size as usize, Arc::clone(&channel)));
                        (Arc::clone(&cq), cq)
                    }
                };
                let caps = QpCaps {
                    max_send_wr: s.max_send_wr,
                    max_recv_wr: s.max_recv_wr,
                    max_send_sge: s.max_send_sge,
                    max_recv_sge: s.max_recv_sge,
                    sq_sig_all: false,
                    max_unacked_psns: 128.max(s.max_send_wr),
                };
                // With `soft_addr`, packets leave from that address (the one the hello
                // advertises): a peer accepts RC packets only from its peer's address
                // (rxe's check_addr; a NIC's QP is bound to its GID the same way).
                let src = s.soft_addr.map_or(local_ip, |a| a.to_canonical());
                let src = if src.is_ipv4() == local_ip.is_ipv4() {
                    src
                } else {
                    local_ip
                };
                let qp = d.create_qp(caps, src, Arc::clone(&send_cq), Arc::clone(&recv_cq))?;
                Ok(Qp::Soft(SoftLink {
                    qp,
                    send_cq,
                    recv_cq,
                    channel,
                    stats: Box::default(),
                }))
            }
            #[cfg(feature = "verbs")]
            Device::Verbs(d) => Ok(Qp::Verbs(d.create_qp()?)),
        }
    }
}

/// Each provider's readiness (`provider::ready`), one branch per call.
impl DeviceReadiness for Device {
    fn set_caller_driven(&self, on: bool) {
        dev_both!(self, d => d.set_caller_driven(on))
    }

    fn wait_fds(&self, out: &mut Vec<RawFd>) {
        dev_both!(self, d => d.wait_fds(out))
    }

    fn caller_watches(&self, on: bool) {
        dev_both!(self, d => d.caller_watches(on))
    }

    fn caller_stops_polling(&self) {
        dev_both!(self, d => d.caller_stops_polling())
    }
}

/// The soft provider's objects of one connection.
#[derive(Debug)]
pub(crate) struct SoftLink {
    qp: Arc<SoftQp>,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
    channel: Arc<EventFd>,
    // Boxed: keeps the enum's variants of similar size.
    stats: Box<WrStats>,
}

/// A connection's QP, CQs and completion channel.
#[derive(Debug)]
pub(crate) enum Qp {
    Soft(SoftLink),
    #[cfg(feature = "verbs")]
    Verbs(Arc<VerbsQp>),
}

macro_rules! both {
    ($self:expr, $q:ident => $soft:expr, $v:ident => $verbs:expr) => {
        match $self {
            Qp::Soft($q) => $soft,
            #[cfg(feature = "verbs")]
            Qp::Verbs($v) => $verbs,
        }
    };
}

impl QpReadiness for SoftLink {
    fn may_have_completions(&self) -> bool {
        self.send_cq.maybe_nonempty() || self.recv_cq.maybe_nonempty()
    }

    /// The CQs must be this QP's alone (a hook per CQ).
    fn on_first_completion(&self, hook: Hook) -> bool {
        let h = Arc::clone(&hook);
        self.send_cq.on_first(Box::new(move || h()))
            && (Arc::ptr_eq(&self.send_cq, &self.recv_cq)
                || self.recv_cq.on_first(Box::new(move || hook())))
    }

    fn arm(&self) {
        self.send_cq.req_notify();
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.req_notify();
        }
    }

    fn disarm(&self) {
        self.send_cq.disarm();
        self.recv_cq.disarm();
    }

    fn event_fd(&self) -> RawFd {
        self.channel.raw_fd()
    }

    fn clear_event(&self) {
        self.channel.clear()
    }
}

/// Each provider's readiness (`provider::ready`), one branch per call.
impl QpReadiness for Qp {
    fn may_have_completions(&self) -> bool {
        both!(self, q => q.may_have_completions(), v => QpReadiness::may_have_completions(&**v))
    }

    fn on_first_completion(&self, hook: Hook) -> bool {
        both!(self, q => q.on_first_completion(hook), v => QpReadiness::on_first_completion(&**v, hook))
    }

    fn arm(&self) {
        both!(self, q => q.arm(), v => QpReadiness::arm(&**v))
    }

    fn disarm(&self) {
        both!(self, q => q.disarm(), v => QpReadiness::disarm(&**v))
    }

    fn event_fd(&self) -> RawFd {
        both!(self, q => q.event_fd(), v => QpReadiness::event_fd(&**v))
    }

    fn clear_event(&self) {
        both!(self, q => q.clear_event(), v => QpReadiness::clear_event(&**v))
    }
}

impl Qp {
    pub fn qpn(&self) -> u32 {
        both!(self, q => q.qp.qpn(), v => v.qpn())
    }

    /// Brings the QP to RTS with the negotiated values and the config's knobs.
    pub fn connect(&self, n: &Remote, s: &Settings) -> Result<()> {
        match self {
            Qp::Soft(q) => q.qp.connect(
                n,
                &Timers {
                    timeout: s.timeout,
                    retry_cnt: s.retry_cnt,
                    rnr_retry: s.rnr_retry,
                    min_rnr_timer: s.min_rnr_timer,
                    access: access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ,
                },
            ),
            #[cfg(feature = "verbs")]
            Qp::Verbs(v) => {
                let dgid = match n.peer_udp.ip() {
                    IpAddr::V4(a) => a.to_ipv6_mapped(),
                    IpAddr::V6(a) => a,
                };
                v.connect(&super::verbs::qp::Connect {
                    dest_qpn: n.dest_qpn,
                    dgid,
                    sq_psn: n.sq_psn,
                    rq_psn: n.rq_psn,
                    path_mtu: n.path_mtu,
                    max_rd_atomic: n.max_rd_atomic,
                    max_dest_rd_atomic: n.max_dest_rd_atomic,
                })
            }
        }
    }

    pub fn peer_gone(&self) -> bool {
        both!(self, q => q.qp.peer_gone(), v => v.peer_gone())
    }

    pub fn post_send(&self, dev: &Device, wrs: &[SendReq]) -> (usize, Option<Error>) {
        let r = self.post_send_on(dev, wrs);
        self.stats().posted_sends(&wrs[..r.0.min(wrs.len())]);
        r
    }

    fn post_send_on(&self, dev: &Device, wrs: &[SendReq]) -> (usize, Option<Error>) {
        match (self, dev) {
            (Qp::Soft(q), Device::Soft(d)) => {
                let r = q.qp.post_send(d.mrs(), d.now(), wrs);
                d.timer_armed(q.qp.next_deadline());
                r
            }
            #[cfg(feature = "verbs")]
            (Qp::Verbs(v), _) => v.post_send(wrs),
            #[cfg(feature = "verbs")]
            _ => unreachable!("a QP is made by its own device"),
        }
    }

    pub fn post_recv(&self, dev: &Device, wrs: &[(u64, SgeList)]) -> (usize, Option<Error>) {
        let r = self.post_recv_on(dev, wrs);
        self.stats().posted_recvs(r.0);
        r
    }

    fn post_recv_on(&self, dev: &Device, wrs: &[(u64, SgeList)]) -> (usize, Option<Error>) {
        match (self, dev) {
            (Qp::Soft(q), Device::Soft(d)) => q.qp.post_recv(d.mrs(), wrs),
            #[cfg(feature = "verbs")]
            (Qp::Verbs(v), _) => v.post_recv(wrs),
            #[cfg(feature = "verbs")]
            _ => unreachable!("a QP is made by its own device"),
        }
    }

    pub fn poll(&self, dev: &Device, s: &Settings, out: &mut [Wc]) -> usize {
        dev.progress(s);
        self.poll_cq(out)
    }

    /// [`Qp::poll`] without the device's progress pass: the caller ran it
    /// ([`Device::progress`]) for all the QPs it is about to poll.
    pub fn poll_cq(&self, out: &mut [Wc]) -> usize {
        let n = self.poll_on(out);
        self.stats().completed(&out[..n]);
        n
    }

    fn poll_on(&self, out: &mut [Wc]) -> usize {
        match self {
            Qp::Soft(q) => {
                let n = q.send_cq.poll(out);
                if Arc::ptr_eq(&q.send_cq, &q.recv_cq) {
                    return n;
                }
                n + q.recv_cq.poll(&mut out[n..])
            }
            #[cfg(feature = "verbs")]
            Qp::Verbs(v) => v.poll(out),
        }
    }

    /// The caller stops polling and sleeps on [`QpReadiness::event_fd`]: the device
    /// receives for it from now on, and the QP's CQs are armed.
    pub fn req_notify(&self, dev: &Device) {
        dev.caller_stops_polling();
        self.arm();
    }

    /// The connection's WR-level counters (posts, bytes, completions by status, async
    /// events; both providers), and on soft the engine's packet counters (on verbs those
    /// stay zero: a NIC counts packets per port, in its `hw_counters`, not per QP).
    pub fn counters(&self) -> Counters {
        let mut c = both!(self, q => q.qp.counters(), _v => Counters::default());
        self.stats().fill(&mut c);
        c
    }

    fn stats(&self) -> &WrStats {
        both!(self, q => &q.stats, v => v.stats())
    }

    pub fn failure_note(&self) -> Option<String> {
        both!(self, q => q.qp.failure_note(), v => v.failure_note())
    }

    pub fn injected_drops(&self) -> u64 {
        both!(self, q => q.qp.injected_drops(), _v => 0)
    }

    /// Completions lost to a full CQ (soft: counted by its CQs; a shared CQ counted once).
    /// `None` on verbs: a NIC reports an overrun as IBV_EVENT_CQ_ERR, not as a count.
    pub fn cq_overflows(&self) -> Option<u64> {
        match self {
            Qp::Soft(q) => Some(if Arc::ptr_eq(&q.send_cq, &q.recv_cq) {
                q.send_cq.overflows()
            } else {
                q.send_cq.overflows() + q.recv_cq.overflows()
            }),
            #[cfg(feature = "verbs")]
            Qp::Verbs(_) => None,
        }
    }

    pub fn tx_deferred(&self) -> u64 {
        both!(self, q => q.qp.tx_deferred(), _v => 0)
    }

    pub fn tx_errors(&self) -> u64 {
        both!(self, q => q.qp.tx_errors(), _v => 0)
    }

    pub fn state(&self) -> QpState {
        both!(self, q => q.qp.state(), v => v.state())
    }

    /// Watches the side channel `fd`: EOF fails the QP.
    pub fn watch(&self, dev: &Device, fd: RawFd) {
        match (self, dev) {
            (Qp::Soft(q), Device::Soft(d)) => d.watch(fd, q.qp.qpn()),
            #[cfg(feature = "verbs")]
            (Qp::Verbs(v), Device::Verbs(d)) => d.watch(fd, v),
            #[cfg(feature = "verbs")]
            _ => unreachable!("a QP is made by its own device"),
        }
    }

    pub fn unwatch(&self, dev: &Device, fd: RawFd) {
        match dev {
            Device::Soft(d) => d.unwatch(fd),
            #[cfg(feature = "verbs")]
            Device::Verbs(d) => d.unwatch(fd),
        }
    }

    /// QP to ERR now (every outstanding WR completes flushed); the QP stays known to its
    /// device (fault injection: the connection's side channel stays open).
    pub fn fail(&self, dev: &Device) {
        match (self, dev) {
            (Qp::Soft(q), Device::Soft(d)) => {
                d.send_held_acks(&q.qp);
                q.qp.fail(d.mrs(), d.now());
            }
            #[cfg(feature = "verbs")]
            (Qp::Verbs(v), _) => v.fail(),
            #[cfg(feature = "verbs")]
            _ => unreachable!("a QP is made by its own device"),
        }
    }

    /// QP to ERR (every outstanding WR completes flushed); soft also forgets the QP.
    /// Completions stay pollable until the QP is dropped.
    pub fn close(&self, dev: &Device) {
        match (self, dev) {
            (Qp::Soft(q), Device::Soft(d)) => {
                d.send_held_acks(&q.qp);
                q.qp.fail(d.mrs(), d.now());
                d.destroy_qp(q.qp.qpn());
            }
            #[cfg(feature = "verbs")]
            (Qp::Verbs(v), Device::Verbs(d)) => {
                v.fail();
                d.forget(v);
            }
            #[cfg(feature = "verbs")]
            _ => unreachable!("a QP is made by its own device"),
        }
    }

    /// After `close` and `unwatch`: waits (up to 1 s) until the connection holds its verbs
    /// QP alone, so that dropping it destroys the QP now and the regions its flushed WRs
    /// named are free when the drop returns. The device's watcher thread holds a QP for a
    /// moment while it handles a side-channel EOF or an async event; a drop that raced it
    /// left the QP to the watcher, and a region deregistered right after dropping both ends
    /// of a connection was still `Busy` (5 runs in 40 beside two busy loops).
    pub fn settle(&self) {
        #[cfg(feature = "verbs")]
        if let Qp::Verbs(v) = self {
            let end = std::time::Instant::now() + std::time::Duration::from_secs(1);
            while Arc::strong_count(v) > 1 && std::time::Instant::now() < end {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }

    /// Undoes `create_qp` after a failed setup.
    pub fn destroy(&self, dev: &Device) {
        // Dropping the last Arc destroys a verbs QP.
        if let (Qp::Soft(q), Device::Soft(d)) = (self, dev) {
            d.destroy_qp(q.qp.qpn());
        }
    }
}

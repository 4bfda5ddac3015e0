//! A soft-provider queue pair: the sans-IO RC engine (`rc::Qp`) behind a lock, its own UDP
//! source port (fixed for its life, in 0xC000-0xFFFF, as rxe), the CQs its completions go
//! to, and the bookkeeping that maps engine WR ids back to caller cookies and keeps memory
//! regions pinned while WRs name them.

use crate::error::{Error, ErrorKind, Result};
use crate::rc::memory::SgeList;
use crate::rc::verbs::{QpState, WcStatus, attr_mask as m, send_flags};
use crate::rc::{Counters, PostError, PostQueue, QpAttr, QpCaps, RecvWr, SendWr, max_packet_len};
use parking_lot::Mutex;
use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::cq::Cq;
use super::device::{DeviceTimers, TimerCell};
use super::diagnose::{HostEvidence, StallLog, describe};
use super::mr::{MemView, MrTable};
use super::sys::try_random_u32;
use super::udp::{self, TxDatagram, UdpPort};
use crate::provider::types::Wc;

mod local;
mod verbs;
/// The provider-neutral work request and connection parameters (`crate::provider::types`).
pub use crate::provider::types::{Remote, SendReq};
pub use verbs::QpErrorEvent;

/// Packets sent per sendmmsg call.
const TX_BATCH: usize = 32;
/// One packet of a send batch: head length (in `heads`), payload lent by memory, tail
/// length (in `tails`), and whether it is still to be sent.
type TxSlot<'m> = (usize, &'m [u8], usize, bool);

/// While datagrams wait in a QP's [`TxBacklog`], the device drives the QP again after this
/// long, doubling per attempt that still finds the socket full, up to
/// [`BACKLOG_RETRY_MAX_NS`]. (A progress pass costs a few microseconds; a UDP send buffer
/// drains at link speed, megabytes per millisecond.)
const BACKLOG_RETRY_MIN_NS: u64 = 50_000;
const BACKLOG_RETRY_MAX_NS: u64 = 1_000_000;

/// How a QP puts its packets on the wire (the `soft_drop_ratio` and `soft_gso` keys).
#[derive(Debug, Clone, Copy, Default)]
pub struct TxOptions {
    /// Outgoing packets dropped on purpose, in parts per billion.
    pub drop_ppb: u32,
    /// Runs of equal-length packets to the peer go as UDP GSO messages
    /// ([`UdpPort::send_batch_gso`]: IPv6 always, IPv4 towards locally delivered peers only);
    /// `false`: one datagram per packet (a capture on `lo` then shows every packet, where
    /// it otherwise shows a GSO run as one super-frame).
    pub gso: bool,
}

/// The QP's timer and retry knobs (from the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timers {
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub access: u32,
}

#[derive(Debug)]
struct Pending {
    cookie: u64,
    lkeys: SmallVec<[u32; 2]>,
    /// The caller asked for a success completion (errors are always reported).
    signaled: bool,
}

#[derive(Debug)]
struct Inner {
    qp: crate::rc::Qp,
    peer: Option<SocketAddr>,
    next_id: u64,
    pending: HashMap<u64, Pending>,
    heads: Vec<Vec<u8>>,
    tails: Vec<[u8; 8]>,
    /// Deterministic per-QP drop decisions for `soft_drop_ratio` (xorshift).
    drop_state: u64,
    /// Datagrams the UDP socket had no room for, waiting to be sent first.
    backlog: TxBacklog,
    /// An error completion (not a flush) reached a CQ since the last reset: the
    /// application learnt the QP's error from it (no async event then, as NICs).
    error_completed: bool,
    /// Local operations (memory window bind, invalidate) waiting for their turn in the
    /// send CQ (`qp/local.rs`).
    local: local::LocalOps,
}

/// Datagrams the QP's UDP socket had no room for (a short `sendmmsg` count), sealed and
/// copied out of the memory they borrowed from, oldest first. While any are held the engine
/// is asked for nothing new: its send queue (at most `max_send_wr` WRs) holds the rest, and
/// a post that finds that queue full is refused with `Full`. That is the back-pressure; no
/// thread sleeps and nothing is turned into a loss that only the ACK timer would repair.
/// The device drives the QP again at `retry_at` (published with the engine's deadline, so
/// the device's timer heap wakes a progress pass), and every post or received packet tries
/// too. At most one send batch ([`TX_BATCH`] datagrams) is ever held: the copy is bounded by
/// TX_BATCH x the largest packet per QP, and is only made when the socket is full.
#[derive(Debug, Default)]
struct TxBacklog {
    bytes: Vec<u8>,
    /// End offset in `bytes` of each datagram.
    ends: SmallVec<[usize; TX_BATCH]>,
    /// Datagrams of `ends` sent so far.
    sent: usize,
    /// Consecutive attempts that found the socket full (sets the retry delay).
    blocked: u32,
    /// When the device should try again (engine clock, ns) while datagrams are held.
    retry_at: Option<u64>,
}

impl TxBacklog {
    fn is_empty(&self) -> bool {
        self.sent == self.ends.len()
    }

    /// Takes copies of `rest` (the datagrams of a batch the socket did not take).
    #[cold]
    fn hold(&mut self, rest: &[TxDatagram<'_>], now: u64) {
        debug_assert!(self.is_empty());
        self.bytes.clear();
        self.ends.clear();
        self.sent = 0;
        for d in rest {
            for part in d.parts {
                self.bytes.extend_from_slice(part);
            }
            self.ends.push(self.bytes.len());
        }
        self.blocked = 0;
        self.still_blocked(now);
    }

    /// The socket was full again: retry later (exponential, capped).
    fn still_blocked(&mut self, now: u64) {
        let delay = (BACKLOG_RETRY_MIN_NS << self.blocked.min(8)).min(BACKLOG_RETRY_MAX_NS);
        self.blocked = self.blocked.saturating_add(1);
        self.retry_at = Some(now.saturating_add(delay));
    }

    /// Everything was sent (or dropped with the QP): no retry.
    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
        self.sent = 0;
        self.blocked = 0;
        self.retry_at = None;
    }

    /// The held datagrams not sent yet, as one batch to `peer`.
    fn pending(&self, peer: SocketAddr) -> SmallVec<[TxDatagram<'_>; TX_BATCH]> {
        (self.sent..self.ends.len())
            .map(|i| {
                let start = if i == 0 { 0 } else { self.ends[i - 1] };
                TxDatagram {
                    dst: peer,
                    parts: [&self.bytes[start..self.ends[i]], &[], &[]],
                }
            })
            .collect()
    }
}

/// What [`SoftQp::receive`] did with a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// From the peer, ICRC right: the engine processed it.
    Processed,
    /// Not from the connected peer's IP and UDP port (or the QP is not connected): dropped
    /// before the ICRC or any engine processing (rxe `check_addr`).
    WrongSource,
    /// From the peer, but the ICRC did not match: dropped (counted by the QP too).
    BadIcrc,
}

/// [`SoftQp::peer_port`]: the peer's source port is known (low 16 bits hold it).
const PORT_KNOWN: u32 = 1 << 16;

/// One queue pair of the soft provider.
#[derive(Debug)]
pub struct SoftQp {
    qpn: u32,
    inner: Mutex<Inner>,
    pub send_cq: Arc<Cq>,
    pub recv_cq: Arc<Cq>,
    sock: UdpPort,
    drop_ppb: u32,
    gso: bool,
    /// Packets not sent because of `soft_drop_ratio`.
    injected_drops: AtomicU64,
    /// Datagrams that found the UDP socket full and waited in the backlog.
    tx_deferred: AtomicU64,
    /// Datagrams the kernel refused outright (lost; the engine retransmits them).
    tx_errors: AtomicU64,
    /// Set when the peer is known to be gone (TCP EOF): the QP is in ERR.
    peer_gone: AtomicBool,
    /// Why the requester gave up (RETRY_EXC_ERR, RNR_RETRY_EXC_ERR), in words; set once.
    failure_note: Mutex<Option<String>>,
    /// The device's stall record (for failure notes).
    stalls: Arc<StallLog>,
    /// The IP (canonical: IPv4-mapped IPv6 as IPv4) the peer's packets come from: its QP's
    /// UDP socket binds the IP its side channel uses, which is the one the handshake gives
    /// as the peer's UDP address. Set by `connect`; until then every packet is refused.
    peer_ip: OnceLock<IpAddr>,
    /// The UDP source port of the peer's packets, `PORT_KNOWN | port` once known, else 0.
    /// The peer's QP sends from its own port (0xC000 + its QPN's low bits, or the next free
    /// one), which the handshake carries (hello 1.1, `src_port`): set by `connect`. Only
    /// with a 1.0 peer, whose hello lacks it, is the port of the first packet from the
    /// peer's IP with a right ICRC taken; from then on only that exact address is accepted.
    peer_port: AtomicU32,
    /// The engine's earliest deadline, published whenever the engine is touched (so
    /// `next_deadline` takes no lock), and this QP's place in the device's timer heap.
    timer: Arc<TimerCell>,
    /// The device's timers, told when this QP's deadline comes earlier (unset outside a
    /// device: unit tests).
    device_timers: OnceLock<Arc<DeviceTimers>>,
    /// What a verbs QP adds (its SRQ, its async error events): `verbs.rs`.
    verbs: OnceLock<verbs::Hooks>,
    /// Set while the QP waits in its device's doorbell list (posted, not yet driven).
    pub(crate) doorbell: AtomicBool,
    /// Set while the QP waits in its device's list of held ACKs ([`SoftQp::drive`]).
    pub(crate) acks_held: AtomicBool,
}

impl SoftQp {
    /// A QP in RESET with its own UDP source port on `local_ip`.
    pub fn new(
        qpn: u32,
        caps: QpCaps,
        local_ip: IpAddr,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        tx: TxOptions,
        stalls: Arc<StallLog>,
    ) -> Result<SoftQp> {
        let sock = UdpPort::bind_qp_port(local_ip, qpn).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("QP {qpn:#x}: no UDP source port in 0xC000-0xFFFF on {local_ip}: {e}"),
            )
        })?;
        Ok(SoftQp {
            qpn,
            inner: Mutex::new(Inner {
                qp: crate::rc::Qp::new(qpn, caps),
                peer: None,
                next_id: 1,
                pending: HashMap::default(),
                // Allocated on first use (`drive_locked`): an idle QP sends a packet or
                // two per batch, and 32 eager buffers cost ~135 KiB per QP.
                heads: vec![Vec::new(); TX_BATCH],
                tails: vec![[0u8; 8]; TX_BATCH],
                drop_state: u64::from(try_random_u32()?) << 1 | 1,
                backlog: TxBacklog::default(),
                error_completed: false,
                local: local::LocalOps::default(),
            }),
            send_cq,
            recv_cq,
            sock,
            drop_ppb: tx.drop_ppb,
            gso: tx.gso,
            injected_drops: AtomicU64::new(0),
            tx_deferred: AtomicU64::new(0),
            tx_errors: AtomicU64::new(0),
            peer_gone: AtomicBool::new(false),
            failure_note: Mutex::new(None),
            stalls,
            peer_ip: OnceLock::new(),
            peer_port: AtomicU32::new(0),
            timer: Arc::new(TimerCell::new(qpn)),
            device_timers: OnceLock::new(),
            verbs: OnceLock::new(),
            doorbell: AtomicBool::new(false),
            acks_held: AtomicBool::new(false),
        })
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The UDP address this QP sends from.
    pub fn local_udp(&self) -> SocketAddr {
        self.sock.local_addr()
    }

    /// RESET -> INIT -> RTR -> RTS towards `r`.
    pub fn connect(&self, r: &Remote, t: &Timers) -> Result<()> {
        let mut g = self.inner.lock();
        let qp = &mut g.qp;
        let mut a = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: t.access,
            port_num: 1,
            ..Default::default()
        };
        qp.modify(&a, m::STATE | m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS)?;
        a.qp_state = QpState::Rtr;
        a.path_mtu = r.path_mtu;
        a.dest_qp_num = r.dest_qpn;
        a.rq_psn = r.rq_psn;
        a.max_dest_rd_atomic = r.max_dest_rd_atomic;
        a.min_rnr_timer = t.min_rnr_timer;
        qp.modify(
            &a,
            m::STATE
                | m::AV
                | m::PATH_MTU
                | m::DEST_QPN
                | m::RQ_PSN
                | m::MAX_DEST_RD_ATOMIC
                | m::MIN_RNR_TIMER,
        )?;
        a.qp_state = QpState::Rts;
        a.sq_psn = r.sq_psn;
        a.max_rd_atomic = r.max_rd_atomic;
        a.timeout = t.timeout;
        a.retry_cnt = t.retry_cnt;
        a.rnr_retry = t.rnr_retry;
        qp.modify(
            &a,
            m::STATE | m::SQ_PSN | m::MAX_QP_RD_ATOMIC | m::RETRY_CNT | m::RNR_RETRY | m::TIMEOUT,
        )?;
        g.peer = Some(r.peer_udp);
        let _ = self.peer_ip.set(r.peer_udp.ip().to_canonical());
        if let Some(p) = r.peer_src_port {
            self.peer_port
                .store(PORT_KNOWN | u32::from(p), Ordering::Release);
        }
        Ok(())
    }

    pub fn state(&self) -> QpState {
        self.inner.lock().qp.state()
    }

    pub fn counters(&self) -> Counters {
        *self.inner.lock().qp.counters()
    }

    pub fn injected_drops(&self) -> u64 {
        self.injected_drops.load(Ordering::Relaxed)
    }

    /// Datagrams that found the UDP socket's send buffer full and were sent later from the
    /// QP's backlog (back-pressure, not loss).
    pub fn tx_deferred(&self) -> u64 {
        self.tx_deferred.load(Ordering::Relaxed)
    }

    /// Datagrams the kernel refused outright (e.g. larger than the route's MTU, no route):
    /// lost, and repaired by the engine's retransmission.
    pub fn tx_errors(&self) -> u64 {
        self.tx_errors.load(Ordering::Relaxed)
    }

    /// Why the QP's requester gave up, in words, if it did.
    pub fn failure_note(&self) -> Option<String> {
        self.failure_note.lock().clone()
    }

    pub fn peer_gone(&self) -> bool {
        self.peer_gone.load(Ordering::Acquire)
    }

    /// Posts a chain of send WRs in order and sends what is ready. Returns how many were
    /// posted and, if the chain stopped early, the error of the first WR not posted (as
    /// `bad_wr`). Posting in ERR completes at once with WR_FLUSH_ERR, as verbs.
    pub fn post_send(&self, mrs: &MrTable, now: u64, wrs: &[SendReq]) -> (usize, Option<Error>) {
        self.post_send_then(mrs, now, wrs, true)
    }

    /// As [`SoftQp::post_send`], but with `send_now` false the packets stay in the engine
    /// until the QP is next driven (the doorbell is rung later: see
    /// `SoftDevice::post_send_batched`).
    pub(crate) fn post_send_then(
        &self,
        mrs: &MrTable,
        now: u64,
        wrs: &[SendReq],
        send_now: bool,
    ) -> (usize, Option<Error>) {
        let mut g = self.inner.lock();
        self.publish_ack_timer_early(&g, now);
        let mut posted = 0;
        let mut err = None;
        for w in wrs {
            if let Err(e) = self.room_in_err(&g, &self.send_cq, PostQueue::Send) {
                err = Some(e);
                break;
            }
            let lkeys: SmallVec<[u32; 2]> = w.sges.iter().map(|s| s.lkey).collect();
            let id = g.next_id;
            g.next_id += 1;
            mrs.hold(&lkeys, true);
            // The engine signals every WR so the provider learns when each one's memory is
            // free; the caller's SIGNALED flag decides whether it sees the success.
            let r = g.qp.post_send(SendWr {
                wr_id: id,
                opcode: w.opcode,
                flags: w.flags | send_flags::SIGNALED,
                sges: w.sges.clone(),
                remote_addr: w.remote_addr,
                rkey: w.rkey,
                imm: w.imm,
            });
            match r {
                Ok(()) => {
                    let signaled = w.flags & send_flags::SIGNALED != 0;
                    g.local.sent(id);
                    g.pending.insert(
                        id,
                        Pending {
                            cookie: w.cookie,
                            lkeys,
                            signaled,
                        },
                    );
                    posted += 1;
                    if g.qp.state() == QpState::Err {
                        // Flushed at once: into the CQ now, so the next WR sees its room.
                        self.collect(&mut g, mrs);
                    }
                }
                Err(e) => {
                    mrs.hold(&lkeys, false);
                    // The engine's typed refusal: converting formats nothing.
                    err = Some(e.into());
                    break;
                }
            }
        }
        if posted == 0 {
            // Refused outright (a full send queue, a bad WR): nothing changed in the engine,
            // and a caller retrying a refused post in a loop must not do transmit work
            // (retransmissions, the backlog) on every try; the device's timers do that.
            self.publish_deadline(&g);
            return (posted, err);
        }
        if send_now {
            // Send at once from the caller's thread: lowest latency, no wakeup needed.
            let view = mrs.view();
            self.drive_locked(&mut g, &view, now);
            drop(view);
        }
        self.collect(&mut g, mrs);
        self.publish_deadline(&g);
        (posted, err)
    }

    /// Posts a chain of receive WRs (cookie, SGEs).
    pub fn post_recv(&self, mrs: &MrTable, wrs: &[(u64, SgeList)]) -> (usize, Option<Error>) {
        let mut g = self.inner.lock();
        let mut posted = 0;
        let mut err = None;
        for (cookie, sges) in wrs {
            if let Err(e) = self.room_in_err(&g, &self.recv_cq, PostQueue::Recv) {
                err = Some(e);
                break;
            }
            let lkeys: SmallVec<[u32; 2]> = sges.iter().map(|s| s.lkey).collect();
            let id = g.next_id;
            g.next_id += 1;
            mrs.hold(&lkeys, true);
            match g.qp.post_recv(RecvWr {
                wr_id: id,
                sges: sges.clone(),
            }) {
                Ok(()) => {
                    g.pending.insert(
                        id,
                        Pending {
                            cookie: *cookie,
                            lkeys,
                            signaled: true,
                        },
                    );
                    posted += 1;
                    if g.qp.state() == QpState::Err {
                        self.collect(&mut g, mrs);
                    }
                }
                Err(e) => {
                    mrs.hold(&lkeys, false);
                    // The engine's typed refusal: converting formats nothing.
                    err = Some(e.into());
                    break;
                }
            }
        }
        self.collect(&mut g, mrs);
        self.publish_deadline(&g);
        (posted, err)
    }

    /// Feeds one datagram received from `src` at `dst` (its BTH names this QP): packets
    /// that are not from the connected peer's IP and UDP port are dropped before anything
    /// else (rxe `check_addr`), then the ICRC is checked, then the engine processes it.
    /// Per packet: an atomic load and an address comparison before the ICRC.
    pub fn receive(
        &self,
        view: &mut MemView<'_>,
        now: u64,
        src: SocketAddr,
        dst: SocketAddr,
        data: &[u8],
    ) -> Received {
        let Some(&ip) = self.peer_ip.get() else {
            return Received::WrongSource; // not connected: there is no peer yet
        };
        let port = self.peer_port.load(Ordering::Acquire);
        if (port != 0 && port != PORT_KNOWN | u32::from(src.port()))
            || src.ip().to_canonical() != ip
        {
            return Received::WrongSource;
        }
        if !udp::verify(src, dst, data) {
            self.inner.lock().qp.record_icrc_error();
            return Received::BadIcrc;
        }
        if port == 0 {
            self.learn_peer_port(src);
        }
        let mut g = self.inner.lock();
        self.srq_refill(&mut g, data);
        // Remote keys in this packet are this QP's to use (memory windows are per QP).
        view.set_qp(self.qpn);
        g.qp.handle_packet(now, data, view);
        self.publish_deadline(&g);
        Received::Processed
    }

    /// The first packet from the peer's IP with a right ICRC names the port it sends from.
    /// (Packets are received by one thread at a time, the device's receive lock holder.)
    #[cold]
    fn learn_peer_port(&self, src: SocketAddr) {
        self.peer_port
            .store(PORT_KNOWN | u32::from(src.port()), Ordering::Release);
        log::debug!(target: "rdmx::soft", "QP {:#x}: the peer sends from {src}", self.qpn);
    }

    /// Where the peer's packets are accepted from: its IP (once connected) and UDP source
    /// port (once its first packet arrived).
    pub fn peer_source(&self) -> (Option<IpAddr>, Option<u16>) {
        let port = self.peer_port.load(Ordering::Acquire);
        (
            self.peer_ip.get().copied(),
            (port != 0).then_some(port as u16),
        )
    }

    /// Runs due timers (if `timers`: the caller has processed every packet received so
    /// far), sends what is ready and moves completions to the CQs.
    ///
    /// With `hold_acks`, positive ACKs are not sent when they are all there is to send
    /// ([`crate::rc::Qp::only_acks_to_send`]); returns whether some were held: the caller
    /// must see that the QP is driven again soon (the device's doorbell list), and a post
    /// meanwhile sends them with its request.
    pub fn drive(&self, mrs: &MrTable, now: u64, timers: bool, hold_acks: bool) -> bool {
        let mut g = self.inner.lock();
        if timers && g.qp.next_deadline().is_some_and(|d| d <= now) {
            g.qp.handle_timeout(now);
        }
        let held = hold_acks && g.backlog.is_empty() && g.qp.only_acks_to_send();
        if !held {
            let view = mrs.view();
            self.drive_locked(&mut g, &view, now);
        }
        self.collect(&mut g, mrs);
        self.publish_deadline(&g);
        held
    }

    /// The engine's earliest deadline as last published (after every post, packet, drive
    /// and failure): one atomic load, no lock.
    pub fn next_deadline(&self) -> Option<u64> {
        self.timer.deadline()
    }

    /// Joins the device's timer heap (once, at creation): from then on a deadline that
    /// comes earlier than this QP's entry there is pushed to it.
    pub(crate) fn attach_timers(&self, timers: Arc<DeviceTimers>) {
        let _ = self.device_timers.set(timers);
        self.publish_deadline(&self.inner.lock());
    }

    /// Before a post arms the ACK timer (at `now` + timeout), tells the device about it: if
    /// this thread is stopped or preempted between arming and the publish that follows the
    /// post, the device's stall accounting sees a timer due meanwhile and leaves that time
    /// out of the engine clock; otherwise the timer would fire at resume and charge the
    /// absence to the peer. Early is harmless (a pass finds nothing due and repairs the
    /// heap); in steady state a deadline is already armed earlier and this is two atomic
    /// loads.
    #[inline]
    fn publish_ack_timer_early(&self, g: &Inner, now: u64) {
        if g.qp.state() != QpState::Rts {
            return;
        }
        let code = g.qp.attr().timeout;
        if let Some(t) = crate::config::encoding::ack_timeout_ns(code).filter(|t| *t > 0) {
            let d = now.saturating_add(t);
            if self.timer.deadline().is_none_or(|cur| d < cur) {
                self.timer.publish(Some(d), self.device_timers.get());
            }
        }
    }

    /// Publishes the engine's deadline, or the backlog's retry if earlier (the caller holds
    /// the lock, so in order).
    #[inline]
    fn publish_deadline(&self, g: &Inner) {
        let d = match (g.qp.next_deadline(), g.backlog.retry_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.timer.publish(d, self.device_timers.get());
    }

    /// The peer is gone (TCP EOF) or the QP is closed: ERR, which flushes every
    /// outstanding WR. `now`: the device clock.
    pub fn fail(&self, mrs: &MrTable, now: u64) {
        self.peer_gone.store(true, Ordering::Release);
        let mut g = self.inner.lock();
        // ACKs still queued (held by an application pass, see the device's `held_acks`,
        // whose release may be racing this) leave first: a NIC had sent them already.
        if g.backlog.is_empty() && g.qp.only_acks_to_send() {
            let view = mrs.view();
            self.drive_locked(&mut g, &view, now);
        }
        let err = QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        };
        let _ = g.qp.modify(&err, m::STATE);
        g.backlog.clear(); // nothing more goes to a gone peer
        self.collect(&mut g, mrs);
        self.publish_deadline(&g);
    }

    /// Sends every packet the engine has ready, in sendmmsg batches, after whatever waits in
    /// the backlog; stops (keeping the rest in the engine) when the socket is full.
    fn drive_locked(&self, g: &mut Inner, view: &MemView<'_>, now: u64) {
        let Some(peer) = g.peer else { return };
        // READ responses read memory through this QP's remote keys (windows are per QP).
        view.set_qp(self.qpn);
        if !g.backlog.is_empty() && !self.flush_backlog(g, peer, now) {
            return;
        }
        let src = self.sock.local_addr();
        loop {
            let Inner {
                qp,
                heads,
                tails,
                drop_state,
                backlog,
                ..
            } = &mut *g;
            // 1. Packets from the engine: headers into `heads`, payloads lent by memory.
            // Stack lists of at most TX_BATCH: this runs for every batch sent.
            let mut pkts: SmallVec<[TxSlot<'_>; TX_BATCH]> = SmallVec::new();
            for head in heads.iter_mut() {
                if head.is_empty() {
                    head.resize(max_packet_len(4096), 0);
                }
                let Some(t) = qp.poll_transmit_gather(now, view, head) else {
                    break;
                };
                pkts.push((t.head_len, t.payload, t.tail_len, true));
            }
            if pkts.is_empty() {
                return;
            }
            let full = pkts.len() == TX_BATCH;
            // 2. Loss injection and the ICRC, which covers the IP/UDP headers. The next
            // packet's payload (often cold memory: a READ's source block) is prefetched
            // while this one's CRC runs, so the fetches overlap. Every line is hinted: measured
            // in place (TSC cycles per packet for this stage, read_bw 4K qd 32), every line
            // ~1400-1470, first line only ~1480-1680, two packets ahead ~1590-1740, no hint
            // ~1900-2000. (The engine bench's copy-bound loop prefers first-line hints.)
            let lent: SmallVec<[&[u8]; TX_BATCH]> = pkts.iter().map(|p| p.1).collect();
            if let Some(first) = lent.first() {
                crate::rc::vec_memory::prefetch_lines(first);
            }
            for (i, (hl, payload, tl, keep)) in pkts.iter_mut().enumerate() {
                if let Some(next) = lent.get(i + 1) {
                    crate::rc::vec_memory::prefetch_lines(next);
                }
                if self.drop_ppb > 0 {
                    *drop_state ^= *drop_state << 13;
                    *drop_state ^= *drop_state >> 7;
                    *drop_state ^= *drop_state << 17;
                    if *drop_state % 1_000_000_000 < u64::from(self.drop_ppb) {
                        self.injected_drops.fetch_add(1, Ordering::Relaxed);
                        *keep = false;
                        continue;
                    }
                }
                let sealed = if *tl == 0 {
                    let (body, icrc) = heads[i][..*hl].split_at_mut(*hl - 4);
                    udp::seal(src, peer, body, &[], icrc)
                } else {
                    udp::seal(src, peer, &heads[i][..*hl], payload, &mut tails[i][..*tl])
                };
                if let Err(e) = sealed {
                    log::error!(target: "rdmx::soft", "QP {:#x}: ICRC: {e}", self.qpn);
                    *keep = false;
                }
            }
            // 3. One sendmmsg for the batch (runs of equal-length packets as GSO messages).
            let batch: SmallVec<[TxDatagram<'_>; TX_BATCH]> = pkts
                .iter()
                .enumerate()
                .filter(|(_, p)| p.3)
                .map(|(i, &(hl, payload, tl, _))| TxDatagram {
                    dst: peer,
                    parts: [&heads[i][..hl], payload, &tails[i][..tl]],
                })
                .collect();
            let sent = self.send_all(&batch, peer);
            if sent < batch.len() {
                // The socket is full: keep the rest, ask the engine for nothing more.
                backlog.hold(&batch[sent..], now);
                self.tx_deferred
                    .fetch_add((batch.len() - sent) as u64, Ordering::Relaxed);
                return;
            }
            if !full {
                return;
            }
        }
    }

    /// Sends what waits in the backlog; true when it is empty afterwards. A QP in ERR drops
    /// it (its peer is gone or will discard it).
    #[cold]
    fn flush_backlog(&self, g: &mut Inner, peer: SocketAddr, now: u64) -> bool {
        if g.qp.state() == QpState::Err {
            g.backlog.clear();
            return true;
        }
        let sent = {
            let batch = g.backlog.pending(peer);
            self.send_all(&batch, peer)
        };
        let b = &mut g.backlog;
        b.sent += sent;
        if b.is_empty() {
            b.clear();
            true
        } else {
            b.still_blocked(now);
            false
        }
    }

    /// Sends a batch (with GSO when [`TxOptions::gso`]) until the socket is full; returns how many
    /// datagrams, from the front, are done: sent, or refused outright by the kernel (lost and
    /// counted; the engine retransmits them). Never waits.
    fn send_all(&self, batch: &[TxDatagram<'_>], peer: SocketAddr) -> usize {
        let mut at = 0;
        while at < batch.len() {
            let r = if self.gso {
                self.sock.send_batch_gso(&batch[at..])
            } else {
                self.sock.send_batch(&batch[at..])
            };
            match r {
                Ok(0) => break, // send buffer full
                Ok(n) => at += n,
                Err(e) => {
                    log::debug!(target: "rdmx::soft", "QP {:#x}: send to {peer}: {e}", self.qpn);
                    self.tx_errors.fetch_add(1, Ordering::Relaxed);
                    at += 1;
                }
            }
        }
        at
    }

    /// Describes a retry-exhausted failure once (logged, and kept for `failure_note`),
    /// before its completion reaches the CQ, so a caller that sees the status finds the
    /// words.
    #[cold]
    fn describe_failure(&self, g: &Inner) {
        let Some(f) = g.qp.failure() else { return };
        let mut note = self.failure_note.lock();
        if note.is_some() {
            return;
        }
        let (n, ns) = self.stalls.since(f.at_ns.saturating_sub(f.silent_ns));
        let text = describe(self.qpn, g.peer, f, &HostEvidence::sample(n, ns));
        log::warn!(target: "rdmx::soft", "{text}");
        *note = Some(text);
    }

    /// In ERR a post completes at once (flushed) into `cq`: refused with `Full` while the
    /// CQ has no room, so posting in a loop against a dead connection cannot overrun it.
    /// The refusal is typed (formatted only if someone reads it).
    fn room_in_err(&self, g: &Inner, cq: &Cq, queue: PostQueue) -> Result<()> {
        if g.qp.state() == QpState::Err && cq.len() >= cq.capacity() {
            return Err(PostError::FlushCqFull {
                queue,
                qpn: self.qpn,
                capacity: cq.capacity(),
            }
            .into());
        }
        Ok(())
    }

    /// Moves engine completions to the CQs, mapping WR ids to cookies and releasing the
    /// regions the WRs named. A completion that does not fit (the CQ is full) overruns
    /// the CQ: as on a NIC (IBV_EVENT_CQ_ERR), the QP goes to error, and what does not fit
    /// of its flushed WRs is counted by the CQ (`Cq::overflows`).
    fn collect(&self, g: &mut Inner, mrs: &MrTable) {
        if g.qp.failure().is_some() {
            self.describe_failure(g);
        }
        if self.move_completions(g, mrs) && g.qp.state() != QpState::Err {
            log::error!(
                target: "rdmx::soft",
                "QP {:#x}: completion queue overrun (size send_cq_size/recv_cq_size for the WRs outstanding, and poll): the QP goes to error",
                self.qpn
            );
            let err = QpAttr {
                qp_state: QpState::Err,
                ..Default::default()
            };
            let _ = g.qp.modify(&err, m::STATE);
            self.move_completions(g, mrs);
        }
        self.verbs_after_collect(g);
    }

    /// The body of `collect`; returns whether a completion did not fit its CQ.
    fn move_completions(&self, g: &mut Inner, mrs: &MrTable) -> bool {
        let mut overrun = false;
        while let Some(c) = g.qp.poll_completion() {
            if !c.is_recv && g.local.any() {
                // Local operations posted before this WR complete before it.
                overrun |= self.release_locals(g, c.wr_id);
            }
            if !c.is_recv {
                g.local.done(c.wr_id);
            }
            let Some(p) = g.pending.remove(&c.wr_id) else {
                continue;
            };
            mrs.hold(&p.lkeys, false);
            if !c.is_recv && c.status == WcStatus::Success && !p.signaled {
                continue; // unsignaled send: done, nothing to report
            }
            if !matches!(c.status, WcStatus::Success | WcStatus::WrFlushErr) {
                g.error_completed = true;
            }
            let wc = Wc {
                cookie: p.cookie,
                status: c.status,
                opcode: c.opcode,
                byte_len: c.byte_len,
                imm: c.imm,
                qp_num: c.qp_num,
                src_qp: None,
            };
            let fits = if c.is_recv {
                self.recv_cq.push_solicited(wc, c.solicited)
            } else {
                self.send_cq.push(wc)
            };
            overrun |= !fits;
        }
        if g.local.any() {
            overrun |= self.release_locals(g, u64::MAX);
        }
        overrun
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::sys::EventFd;
    use crate::rc::verbs::WrOpcode;
    use std::net::Ipv4Addr;

    fn cq() -> Arc<Cq> {
        Arc::new(Cq::new(4, Arc::new(EventFd::new().unwrap())))
    }

    fn remote(peer_src_port: Option<u16>) -> Remote {
        Remote {
            dest_qpn: 0x22,
            peer_udp: "127.0.0.1:4791".parse().unwrap(),
            peer_src_port,
            sq_psn: 1,
            rq_psn: 1,
            path_mtu: 1024,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
        }
    }

    const TIMERS: Timers = Timers {
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 2,
        min_rnr_timer: 12,
        access: 0,
    };

    fn qp() -> SoftQp {
        SoftQp::new(
            0x4321,
            QpCaps::default(),
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            cq(),
            cq(),
            TxOptions {
                drop_ppb: 0,
                gso: true,
            },
            Arc::new(StallLog::default()),
        )
        .unwrap()
    }

    #[test]
    fn the_peer_source_port_from_the_handshake_is_enforced_before_any_packet() {
        let q = qp();
        q.connect(&remote(Some(0xc022)), &TIMERS).unwrap();
        assert_eq!(
            q.peer_source(),
            (Some(IpAddr::V4(Ipv4Addr::LOCALHOST)), Some(0xc022))
        );
        // A packet from the peer's IP but another port is refused at once (nothing learnt).
        let mrs = MrTable::default();
        let mut view = mrs.view();
        let dst: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let junk = [0u8; 32];
        for port in [0xc023, 4791, 50000] {
            let src = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
            assert_eq!(
                q.receive(&mut view, 0, src, dst, &junk),
                Received::WrongSource
            );
        }
        assert_eq!(q.peer_source().1, Some(0xc022));
    }

    #[test]
    fn without_a_port_in_the_handshake_it_is_learnt_from_a_good_packet_only() {
        let q = qp();
        q.connect(&remote(None), &TIMERS).unwrap();
        assert_eq!(q.peer_source().1, None);
        // A packet with a bad ICRC teaches nothing.
        let mrs = MrTable::default();
        let mut view = mrs.view();
        let src: SocketAddr = "127.0.0.1:50000".parse().unwrap();
        let dst: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        assert_eq!(
            q.receive(&mut view, 0, src, dst, &[0u8; 32]),
            Received::BadIcrc
        );
        assert_eq!(q.peer_source().1, None);
    }

    #[test]
    fn posting_in_error_stops_at_a_full_cq_instead_of_overrunning_it() {
        let q = qp(); // CQs of 4
        q.connect(&remote(Some(0xc022)), &TIMERS).unwrap();
        let mrs = MrTable::default();
        q.fail(&mrs, 0);
        let wr = |cookie| SendReq {
            cookie,
            opcode: WrOpcode::Send,
            flags: send_flags::SIGNALED,
            sges: SgeList::new(),
            remote_addr: 0,
            rkey: 0,
            imm: 0,
        };
        let wrs: Vec<SendReq> = (0..6).map(wr).collect();
        let (n, e) = q.post_send(&mrs, 0, &wrs);
        assert_eq!(n, 4, "four flushed completions fit the CQ");
        let e = e.expect("the fifth is refused");
        assert_eq!(e.kind(), ErrorKind::Full);
        assert!(e.message().contains("poll them first"), "{e}");
        assert_eq!(q.send_cq.overflows(), 0);
        // Polling makes room again.
        let mut out = [crate::provider::soft::cq::Wc {
            cookie: 0,
            status: WcStatus::Success,
            opcode: crate::rc::WcOpcode::Send,
            byte_len: 0,
            imm: None,
            qp_num: 0,
            src_qp: None,
        }; 4];
        assert_eq!(q.send_cq.poll(&mut out), 4);
        assert!(out.iter().all(|w| w.status == WcStatus::WrFlushErr));
        let (n, e) = q.post_send(&mrs, 0, &wrs[..1]);
        assert_eq!((n, e.map(|e| e.kind())), (1, None));
        // Receives likewise.
        let recvs: Vec<(u64, SgeList)> = (0..5).map(|i| (i, SgeList::new())).collect();
        let (n, e) = q.post_recv(&mrs, &recvs);
        assert_eq!((n, e.map(|e| e.kind())), (4, Some(ErrorKind::Full)));
    }
}

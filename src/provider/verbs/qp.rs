//! One RC connection's verbs objects: a completion channel, its send and receive CQs
//! (separate or shared, sized by the config), the RC QP brought INIT -> RTR -> RTS with
//! every knob of the config, post chains and batched polling.
//!
//! Work request ids are ours: a sequence number per queue (receives tagged with
//! [`RECV_TAG`]) indexing a ring of slots that hold the caller's cookie, the lkeys the WR
//! names (held against deregistration until it completes) and whether the caller asked
//! for a completion. RC completes each queue in order, so a signaled send's completion
//! retires every unsignaled one before it (as the NIC frees their SQ slots). No allocation
//! on the post and poll paths: WRs and SGEs are built in stack arrays, slots are reused.

use super::device::{Limits, Pd, mtu_enum};
use super::mr::VerbsMrs;
use crate::config::{CqLayout, Settings};
use crate::error::{Error, ErrorKind, Result};
use crate::provider::sys::EventFd;
use crate::provider::types::{SendReq, Wc};
use crate::provider::wr_stats::WrStats;
use crate::rc::memory::SgeList;
use crate::rc::verbs::{QpState, WcOpcode, WcStatus, WrOpcode, access, send_flags};
use parking_lot::Mutex;
use rdma_sys as ib;
use smallvec::SmallVec;
use std::net::Ipv6Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Receive WR ids carry this bit (a shared CQ mixes both queues, and an error
/// completion's opcode is undefined in verbs).
const RECV_TAG: u64 = 1 << 63;
/// Most WRs one `ibv_post_send`/`ibv_post_recv` chain holds (stack arrays); `post_batch`
/// chooses up to this many.
const CHAIN: usize = 32;
/// Most SGEs one chain carries in all.
const CHAIN_SGES: usize = 64;
/// Most completions one `ibv_poll_cq` call takes (stack array); `poll_batch` up to this.
const POLL: usize = 32;
/// Completions `req_notify` may find already queued and keep for the next poll.
const STASH: usize = 32;
/// Completion events `clear_event` reads at most per call (the channel is non-blocking).
const MAX_EVENTS: usize = 64;

/// The knobs the data path reads, resolved at creation.
#[derive(Debug, Clone, Copy)]
struct Knobs {
    signal_interval: u32,
    post_batch: usize,
    poll_batch: usize,
    max_inline: u32,
    max_send_sge: usize,
    max_recv_sge: usize,
}

/// What RTR/RTS need from the handshake.
#[derive(Debug, Clone, Copy)]
pub struct Connect {
    pub dest_qpn: u32,
    pub dgid: Ipv6Addr,
    pub sq_psn: u32,
    pub rq_psn: u32,
    pub path_mtu: u32,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
}

#[derive(Debug, Default)]
struct Slot {
    cookie: u64,
    opcode: Option<WrOpcode>,
    caller_signaled: bool,
    /// A memory window bind ([`local::BIND`]) or local invalidate ([`local::INV`])
    /// (`qp/local.rs`), never the caller's; 0 for the caller's WRs.
    local: u8,
    lkeys: SmallVec<[u32; 2]>,
}

/// Posted, not yet completed WRs of one queue: `head..tail` (sequence numbers).
#[derive(Debug)]
struct Ring {
    slots: Box<[Slot]>,
    head: u64,
    tail: u64,
    /// Unsignaled sends posted since the last signaled one.
    run: u32,
}

impl Ring {
    fn new(cap: u32) -> Ring {
        Ring {
            slots: (0..cap.max(1)).map(|_| Slot::default()).collect(),
            head: 0,
            tail: 0,
            run: 0,
        }
    }
    fn cap(&self) -> u64 {
        self.slots.len() as u64
    }
    fn room(&self) -> u64 {
        self.cap() - (self.tail - self.head)
    }
    fn slot(&mut self, seq: u64) -> &mut Slot {
        let i = (seq % self.cap()) as usize;
        &mut self.slots[i]
    }
}

/// The raw objects, destroyed in reverse order of creation.
#[derive(Debug)]
struct Raw {
    channel: *mut ib::ibv_comp_channel,
    send_cq: *mut ib::ibv_cq,
    recv_cq: *mut ib::ibv_cq,
    qp: *mut ib::ibv_qp,
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: each object was created by the matching ibv_create_* and is destroyed
        // once, QP first (it references the CQs), then the CQs (each only once when
        // shared), then the channel (which the CQs reference). Every event read from the
        // channel was acked at once (`clear_event`), so ibv_destroy_cq does not wait.
        unsafe {
            if !self.qp.is_null() {
                ib::ibv_destroy_qp(self.qp);
            }
            if !self.recv_cq.is_null() && self.recv_cq != self.send_cq {
                ib::ibv_destroy_cq(self.recv_cq);
            }
            if !self.send_cq.is_null() {
                ib::ibv_destroy_cq(self.send_cq);
            }
            if !self.channel.is_null() {
                ib::ibv_destroy_comp_channel(self.channel);
            }
        }
    }
}

/// A verbs RC QP with its CQs and completion channel.
#[derive(Debug)]
pub struct VerbsQp {
    raw: Raw,
    mrs: Arc<VerbsMrs>,
    pd: Arc<Pd>,
    qpn: u32,
    port: u8,
    gid_index: u8,
    sl: u8,
    traffic_class: u8,
    active_mtu: u32,
    timers: (u8, u8, u8, u8),
    knobs: Knobs,
    sq: Mutex<Ring>,
    rq: Mutex<Ring>,
    /// Completions `req_notify` found queued, delivered first by the next poll.
    stash: Mutex<SmallVec<[Wc; STASH]>>,
    /// Signaled while `stash` holds completions (the event fd watches it).
    wake: EventFd,
    /// epoll over the completion channel and `wake`: the caller's event fd.
    epoll: OwnedFd,
    peer_gone: AtomicBool,
    failure: Mutex<Option<String>>,
    /// WR-level counters (`provider::dev` counts posts and polls; the device's async
    /// event reader counts events).
    stats: WrStats,
    /// Local invalidates completed and not yet collected by their waiter: (send-queue
    /// sequence, succeeded) (`qp/local.rs`).
    local_done: Mutex<SmallVec<[(u64, bool); 4]>>,
}

mod local;

// SAFETY: the raw pointers are libibverbs objects, usable from any thread (the provider
// locks its queues); the rings, stash and note are behind mutexes.
unsafe impl Send for VerbsQp {}
// SAFETY: as above.
unsafe impl Sync for VerbsQp {}

/// Copies `sges` into `sg` from `*at` (advanced past them); returns the WR's `sg_list` (NULL
/// for none) and `num_sge`. The caller checked that they fit.
fn fill_sges(
    sg: &mut [ib::ibv_sge; CHAIN_SGES],
    at: &mut usize,
    sges: &SgeList,
) -> (*mut ib::ibv_sge, libc::c_int) {
    if sges.is_empty() {
        return (std::ptr::null_mut(), 0);
    }
    for (k, s) in sges.iter().enumerate() {
        sg[*at + k] = ib::ibv_sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        };
    }
    let first: *mut ib::ibv_sge = &mut sg[*at];
    *at += sges.len();
    (first, sges.len() as libc::c_int)
}

/// How many WRs of a refused chain of `n` at `base` were posted: those before `bad` (all
/// of them refused when `bad` is NULL).
///
/// # Safety
/// `bad` is NULL or points into the chain at `base`.
unsafe fn posted_before<T>(base: *mut T, bad: *mut T, n: usize) -> usize {
    if bad.is_null() {
        return 0;
    }
    // SAFETY: per the contract, both are in one array.
    (unsafe { bad.offset_from(base) }).clamp(0, n as isize) as usize
}

fn errno_error(what: &str, rc: i32) -> Error {
    let e = std::io::Error::from_raw_os_error(rc);
    let kind = match rc {
        libc::EINVAL => ErrorKind::InvalidArgument,
        libc::ENOMEM => ErrorKind::Full,
        _ => ErrorKind::Io,
    };
    Error::new(kind, format!("verbs: {what}: {e}"))
}

fn last_error(what: &str) -> Error {
    let e = std::io::Error::last_os_error();
    let kind = match e.raw_os_error() {
        Some(libc::EINVAL) => ErrorKind::InvalidArgument,
        Some(libc::ENOMEM) => ErrorKind::ResourceLimit,
        _ => ErrorKind::Io,
    };
    Error::new(kind, format!("verbs: {what}: {e}"))
}

fn status_of(s: u32) -> WcStatus {
    match s {
        0 => WcStatus::Success,
        1 => WcStatus::LocLenErr,
        2 => WcStatus::LocQpOpErr,
        4 => WcStatus::LocProtErr,
        5 => WcStatus::WrFlushErr,
        6 => WcStatus::MwBindErr,
        7 => WcStatus::BadRespErr,
        8 => WcStatus::LocAccessErr,
        9 => WcStatus::RemInvReqErr,
        10 => WcStatus::RemAccessErr,
        11 => WcStatus::RemOpErr,
        12 => WcStatus::RetryExcErr,
        13 => WcStatus::RnrRetryExcErr,
        19 => WcStatus::FatalErr,
        _ => WcStatus::GeneralErr,
    }
}

const EMPTY_WC: Wc = Wc {
    cookie: 0,
    status: WcStatus::Success,
    opcode: WcOpcode::Send,
    byte_len: 0,
    imm: None,
    qp_num: 0,
    src_qp: None,
};

impl VerbsQp {
    /// Creates the channel, the CQs and the QP (brought to INIT), per the settings.
    /// `offer` gives the rd_atomic values the hello offers (already capped by the device).
    pub fn create(
        pd: &Arc<Pd>,
        mrs: &Arc<VerbsMrs>,
        s: &Settings,
        port: u8,
        gid_index: u8,
        active_mtu: u32,
        limits: &Limits,
    ) -> Result<VerbsQp> {
        let ctx = pd.ctx;
        let mut raw = Raw {
            channel: std::ptr::null_mut(),
            send_cq: std::ptr::null_mut(),
            recv_cq: std::ptr::null_mut(),
            qp: std::ptr::null_mut(),
        };
        // SAFETY: `ctx` is an open device context (held by the Arc<Pd>).
        raw.channel = unsafe { ib::ibv_create_comp_channel(ctx) };
        if raw.channel.is_null() {
            return Err(last_error("ibv_create_comp_channel"));
        }
        // SAFETY: the channel is live; its fd is owned by libibverbs and stays open until
        // ibv_destroy_comp_channel; making it non-blocking is what verbs applications do
        // to poll it (ibv_get_cq_event then fails with EAGAIN instead of sleeping).
        let chan_fd = unsafe { (*raw.channel).fd };
        // SAFETY: fcntl on a valid fd with integer arguments.
        let fl = unsafe { libc::fcntl(chan_fd, libc::F_GETFL) };
        // SAFETY: as above.
        if fl < 0 || unsafe { libc::fcntl(chan_fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
            return Err(last_error("completion channel: fcntl O_NONBLOCK"));
        }
        let mk_cq = |n: u32, ch: *mut ib::ibv_comp_channel| -> Result<*mut ib::ibv_cq> {
            // SAFETY: open context, live channel; no CQ context pointer is used.
            let cq =
                unsafe { ib::ibv_create_cq(ctx, n as libc::c_int, std::ptr::null_mut(), ch, 0) };
            if cq.is_null() {
                return Err(last_error(&format!("ibv_create_cq of {n} entries")));
            }
            Ok(cq)
        };
        match s.cq_layout() {
            CqLayout::Separate { send, recv } => {
                raw.send_cq = mk_cq(send, raw.channel)?;
                raw.recv_cq = mk_cq(recv, raw.channel)?;
            }
            CqLayout::Shared { size } => {
                raw.send_cq = mk_cq(size, raw.channel)?;
                raw.recv_cq = raw.send_cq;
            }
        }
        // SAFETY: plain data; zero is valid for every field.
        let mut init: ib::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = raw.send_cq;
        init.recv_cq = raw.recv_cq;
        init.qp_type = ib::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.cap = ib::ibv_qp_cap {
            max_send_wr: s.max_send_wr,
            max_recv_wr: s.max_recv_wr,
            max_send_sge: s.max_send_sge,
            max_recv_sge: s.max_recv_sge,
            max_inline_data: s.max_inline_data,
        };
        // SAFETY: live PD, CQs of the same context, a live init struct.
        raw.qp = unsafe { ib::ibv_create_qp(pd.pd, &mut init) };
        if raw.qp.is_null() {
            let e = last_error("ibv_create_qp");
            return Err(Error::new(
                e.kind(),
                format!(
                    "{} (max_send_wr={} max_recv_wr={} max_send_sge={} max_recv_sge={} \
                     max_inline_data={}; device max_qp_wr={} max_sge={})",
                    e.message(),
                    s.max_send_wr,
                    s.max_recv_wr,
                    s.max_send_sge,
                    s.max_recv_sge,
                    s.max_inline_data,
                    limits.max_qp_wr,
                    limits.max_sge
                ),
            ));
        }
        // ibv_create_qp writes back the capacities it granted (a NIC may round up, or
        // grant less inline data than asked for on some devices).
        if init.cap.max_inline_data < s.max_inline_data {
            log::info!(target: "rdmx::verbs", "max_inline_data {} (configured) lowered to {} by the device", s.max_inline_data, init.cap.max_inline_data);
        }
        // SAFETY: the QP is live.
        let qpn = unsafe { (*raw.qp).qp_num };
        // SAFETY: plain data.
        let mut a: ib::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ib::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
        let mask = ib::ibv_qp_attr_mask::IBV_QP_STATE
            | ib::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ib::ibv_qp_attr_mask::IBV_QP_PORT
            | ib::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        // SAFETY: live QP, live attr, a mask naming the fields set.
        let rc = unsafe { ib::ibv_modify_qp(raw.qp, &mut a, mask.0 as libc::c_int) };
        if rc != 0 {
            return Err(errno_error("ibv_modify_qp to INIT", rc));
        }
        // The caller's event fd: epoll over the channel and our stash wakeup.
        let wake = EventFd::new()?;
        // SAFETY: plain syscall.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(last_error("epoll_create1"));
        }
        // SAFETY: `ep` is a fresh fd we own from here on.
        let epoll = unsafe { OwnedFd::from_raw_fd(ep) };
        for fd in [chan_fd, wake.raw_fd()] {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: fd as u64,
            };
            // SAFETY: valid epoll fd, valid fd, live event struct.
            if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
                return Err(last_error("epoll_ctl"));
            }
        }
        Ok(VerbsQp {
            raw,
            mrs: Arc::clone(mrs),
            pd: Arc::clone(pd),
            qpn,
            port,
            gid_index,
            sl: s.sl,
            traffic_class: s.traffic_class,
            active_mtu,
            timers: (s.timeout, s.retry_cnt, s.rnr_retry, s.min_rnr_timer),
            knobs: Knobs {
                signal_interval: s.signal_interval.max(1),
                post_batch: (s.post_batch as usize).clamp(1, CHAIN),
                poll_batch: (s.poll_batch as usize).clamp(1, POLL),
                max_inline: init.cap.max_inline_data,
                max_send_sge: s.max_send_sge as usize,
                max_recv_sge: s.max_recv_sge as usize,
            },
            sq: Mutex::new(Ring::new(s.max_send_wr)),
            rq: Mutex::new(Ring::new(s.max_recv_wr)),
            stash: Mutex::new(SmallVec::new()),
            wake,
            epoll,
            peer_gone: AtomicBool::new(false),
            failure: Mutex::new(None),
            stats: WrStats::default(),
            local_done: Mutex::new(SmallVec::new()),
        })
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    pub(crate) fn stats(&self) -> &WrStats {
        &self.stats
    }

    /// The device context the QP belongs to (identity only).
    pub(crate) fn ctx(&self) -> usize {
        self.pd.ctx as usize
    }

    /// The `struct ibv_qp *` async events name (identity only, never dereferenced here).
    pub(crate) fn raw_qp(&self) -> usize {
        self.raw.qp as usize
    }

    /// The `struct ibv_cq *`s async events name (send, receive; equal when shared).
    pub(crate) fn raw_cqs(&self) -> (usize, usize) {
        (self.raw.send_cq as usize, self.raw.recv_cq as usize)
    }

    /// The device reported an async event about this QP or one of its CQs (read and
    /// acknowledged by the device's event reader): counted; an error event moves the QP
    /// to ERR unless the device did (outstanding WRs complete flushed) and becomes the
    /// connection's failure note unless a completion already explained the failure.
    pub(crate) fn async_event(&self, what: &str, error: Option<&str>) {
        let Some(why) = error else {
            self.stats.async_event();
            log::debug!(target: "rdmx::verbs", "QP {:#x}: async event {what}", self.qpn);
            return;
        };
        // The note first, then the count: whoever sees the count sees the note.
        {
            let mut f = self.failure.lock();
            if f.is_none() {
                *f = Some(format!(
                    "{what} on QP {:#x} (async event from the device): {why}; the QP is in \
                     the error state, outstanding work requests complete flushed",
                    self.qpn
                ));
            }
        }
        self.stats.async_event();
        log::warn!(target: "rdmx::verbs", "QP {:#x}: async event {what}: {why}", self.qpn);
        // A NIC moved the QP to ERR before raising the event (QP_FATAL, QP_*_ERR): no
        // modify then, which could drop what the device still sends (a NAK to the peer).
        if self.state() != QpState::Err {
            self.fail();
        }
    }

    /// RTR then RTS with the handshake's values and the config's timers, QoS and MTU.
    pub fn connect(&self, c: &Connect) -> Result<()> {
        let mut mtu = c.path_mtu;
        if mtu > self.active_mtu {
            log::info!(target: "rdmx::verbs", "path_mtu {mtu} clamped to {} (the port's active MTU)", self.active_mtu);
            mtu = self.active_mtu;
        }
        let (timeout, retry_cnt, rnr_retry, min_rnr_timer) = self.timers;
        // SAFETY: plain data.
        let mut a: ib::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ib::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = mtu_enum(mtu);
        a.dest_qp_num = c.dest_qpn;
        a.rq_psn = c.rq_psn;
        a.max_dest_rd_atomic = c.max_dest_rd_atomic;
        a.min_rnr_timer = min_rnr_timer;
        a.ah_attr.is_global = 1;
        a.ah_attr.port_num = self.port;
        a.ah_attr.sl = self.sl;
        a.ah_attr.grh.dgid.raw = c.dgid.octets();
        a.ah_attr.grh.sgid_index = self.gid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.grh.traffic_class = self.traffic_class;
        use ib::ibv_qp_attr_mask as m;
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER;
        // SAFETY: live QP, live attr, the mask names the fields set.
        let rc = unsafe { ib::ibv_modify_qp(self.raw.qp, &mut a, mask.0 as libc::c_int) };
        if rc != 0 {
            return Err(errno_error(
                &format!(
                    "ibv_modify_qp to RTR (dest QP {:#x}, GID {}, path MTU {mtu}, \
                     max_dest_rd_atomic {})",
                    c.dest_qpn, c.dgid, c.max_dest_rd_atomic
                ),
                rc,
            ));
        }
        // SAFETY: plain data.
        let mut a: ib::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ib::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = c.sq_psn;
        a.timeout = timeout;
        a.retry_cnt = retry_cnt;
        a.rnr_retry = rnr_retry;
        a.max_rd_atomic = c.max_rd_atomic;
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_MAX_QP_RD_ATOMIC;
        // SAFETY: as above.
        let rc = unsafe { ib::ibv_modify_qp(self.raw.qp, &mut a, mask.0 as libc::c_int) };
        if rc != 0 {
            return Err(errno_error(
                &format!(
                    "ibv_modify_qp to RTS (timeout {timeout}, retry_cnt {retry_cnt}, \
                     rnr_retry {rnr_retry}, max_rd_atomic {})",
                    c.max_rd_atomic
                ),
                rc,
            ));
        }
        Ok(())
    }

    /// The QP's state as the device reports it.
    pub fn state(&self) -> QpState {
        // SAFETY: plain data.
        let mut a: ib::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: plain data.
        let mut init: ib::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live QP and out-structs.
        let rc = unsafe {
            ib::ibv_query_qp(
                self.raw.qp,
                &mut a,
                ib::ibv_qp_attr_mask::IBV_QP_STATE.0 as libc::c_int,
                &mut init,
            )
        };
        if rc != 0 {
            return QpState::Err;
        }
        match a.qp_state {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 | 4 => QpState::Rts,
            _ => QpState::Err,
        }
    }

    /// Moves the QP to ERR: every outstanding WR completes flushed.
    pub fn fail(&self) {
        // SAFETY: plain data.
        let mut a: ib::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ib::ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: live QP, live attr; moving to ERR is allowed from any state.
        let rc = unsafe {
            ib::ibv_modify_qp(
                self.raw.qp,
                &mut a,
                ib::ibv_qp_attr_mask::IBV_QP_STATE.0 as libc::c_int,
            )
        };
        if rc != 0 {
            log::debug!(target: "rdmx::verbs", "QP {:#x}: modify to ERR: {}", self.qpn, std::io::Error::from_raw_os_error(rc));
        }
    }

    /// The side channel reported EOF: posts are refused from now on, and the QP fails.
    /// What the device already received completes first, with its own status: a peer
    /// that NAKed a request (remote access error) and then closed leaves REM_ACCESS_ERR,
    /// not a flush, as a NIC would have handled the NAK before the host saw the FIN.
    pub fn set_peer_gone(&self) {
        self.stash_queued();
        log::debug!(target: "rdmx::verbs", "QP {:#x}: peer gone; {} completion(s) taken before the flush", self.qpn, self.stash.lock().len());
        self.peer_gone.store(true, Ordering::Release);
        self.fail();
    }

    /// Moves completions already queued (polling also drives a device that progresses
    /// in its poll) into the stash, which the next `poll` returns first; the event fd
    /// becomes readable if the stash holds any. The stash lock is held while polling, as
    /// `poll` holds it, so completions keep their order.
    fn stash_queued(&self) {
        let mut st = self.stash.lock();
        let room = STASH - st.len();
        if room > 0 {
            let mut tmp = [EMPTY_WC; STASH];
            let k = self.poll_cqs(&mut tmp[..room]);
            st.extend_from_slice(&tmp[..k]);
        }
        if !st.is_empty() {
            self.wake.signal();
        }
    }

    pub fn peer_gone(&self) -> bool {
        self.peer_gone.load(Ordering::Acquire)
    }

    pub fn failure_note(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// Posts a chain of send WRs in `post_batch` chains; (posted, the error that stopped
    /// the rest).
    pub fn post_send(&self, wrs: &[SendReq]) -> (usize, Option<Error>) {
        let mut sq = self.sq.lock();
        self.post_in_chains(
            &mut sq,
            wrs,
            "post_send: the send queue",
            ": poll completions first",
            |q, c| self.post_send_chain(q, c),
        )
    }

    /// Posts `wrs` in chains of at most `post_batch` WRs (and the ring's room) with `chain`;
    /// stops at the first refusal. `what`/`hint` name the queue in the Full error.
    fn post_in_chains<T>(
        &self,
        ring: &mut Ring,
        wrs: &[T],
        what: &str,
        hint: &str,
        mut chain: impl FnMut(&mut Ring, &[T]) -> (usize, Option<Error>),
    ) -> (usize, Option<Error>) {
        let mut done = 0;
        while done < wrs.len() {
            let room = ring.room() as usize;
            if room == 0 {
                let e = Error::new(
                    ErrorKind::Full,
                    format!("{what} is full ({} WRs outstanding){hint}", ring.cap()),
                );
                return (done, Some(e));
            }
            let n = (wrs.len() - done).min(self.knobs.post_batch).min(room);
            match chain(ring, &wrs[done..done + n]) {
                (k, None) => done += k,
                (k, Some(e)) => return (done + k, Some(e)),
            }
        }
        (done, None)
    }

    fn post_send_chain(&self, sq: &mut Ring, wrs: &[SendReq]) -> (usize, Option<Error>) {
        // SAFETY: ibv_send_wr and ibv_sge are plain C data (pointers, integers, unions
        // thereof): all-zero is a valid value of each.
        let mut ws: [ib::ibv_send_wr; CHAIN] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut sg: [ib::ibv_sge; CHAIN_SGES] = unsafe { std::mem::zeroed() };
        let mut nsg = 0;
        let mut n = 0;
        let mut stop = None;
        let first_seq = sq.tail;
        for r in wrs.iter().take(CHAIN) {
            if r.sges.len() > self.knobs.max_send_sge {
                stop = Some(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "post_send: {} SGEs, max_send_sge is {}",
                        r.sges.len(),
                        self.knobs.max_send_sge
                    ),
                ));
                break;
            }
            if nsg + r.sges.len() > CHAIN_SGES {
                break;
            }
            let total: u64 = r.sges.iter().map(|s| u64::from(s.length)).sum();
            let may_inline = !matches!(r.opcode, WrOpcode::RdmaRead)
                && total <= u64::from(self.knobs.max_inline);
            if r.flags & send_flags::INLINE != 0 && !may_inline {
                stop = Some(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "post_send: INLINE with {total} bytes: the QP takes at most {} inline \
                         (max_inline_data), and never for RDMA READ",
                        self.knobs.max_inline
                    ),
                ));
                break;
            }
            // Small SENDs and WRITEs go inline (`max_inline_data`): no DMA read of the
            // buffer, which is reusable as soon as the post returns.
            let inline = may_inline && total > 0;
            let caller_signaled = r.flags & send_flags::SIGNALED != 0;
            let signaled = caller_signaled || sq.run + 1 >= self.knobs.signal_interval;
            sq.run = if signaled { 0 } else { sq.run + 1 };
            let seq = sq.tail;
            let slot = sq.slot(seq);
            slot.cookie = r.cookie;
            slot.opcode = Some(r.opcode);
            slot.caller_signaled = caller_signaled;
            slot.local = 0;
            slot.lkeys.clear();
            if !inline {
                slot.lkeys.extend(r.sges.iter().map(|s| s.lkey));
                self.mrs.hold(&slot.lkeys, true);
            }
            sq.tail += 1;
            let w = &mut ws[n];
            w.wr_id = seq;
            (w.sg_list, w.num_sge) = fill_sges(&mut sg, &mut nsg, &r.sges);
            // WrOpcode's values are ibv_wr_opcode's.
            w.opcode = r.opcode as u32;
            w.send_flags = (r.flags & (send_flags::FENCE | send_flags::SOLICITED))
                | if signaled { send_flags::SIGNALED } else { 0 }
                | if inline { send_flags::INLINE } else { 0 };
            if matches!(r.opcode, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm) {
                w.imm_data_invalidated_rkey_union.imm_data = r.imm.to_be();
            }
            if r.opcode == WrOpcode::SendWithInv {
                // The union's other member: the rkey to invalidate, in host order.
                w.imm_data_invalidated_rkey_union.invalidated_rkey = r.imm;
            }
            w.wr.rdma = ib::rdma_t {
                remote_addr: r.remote_addr,
                rkey: r.rkey,
            };
            n += 1;
        }
        if n == 0 {
            return (0, stop);
        }
        let base = ws.as_mut_ptr();
        for i in 0..n - 1 {
            // SAFETY: i + 1 < n <= CHAIN: both elements are in `ws`; only raw pointers
            // derived from `base` touch it until the post.
            unsafe { (*base.add(i)).next = base.add(i + 1) };
        }
        let mut bad: *mut ib::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: a live QP; `ws[..n]` is a NULL-terminated chain whose SGE pointers point
        // into `sg`, both alive for the call (the provider copies WRs, and inline data,
        // before returning). rdma-sys's ibv_post_send calls `context->ops.post_send` as
        // verbs.h's static inline does (layout checked by the layout test).
        let rc = unsafe { ib::ibv_post_send(self.raw.qp, base, &mut bad) };
        if rc == 0 {
            return (n, stop);
        }
        // SAFETY: `bad` is NULL or an element of the chain at `base`.
        let posted = unsafe { posted_before(base, bad, n) };
        self.unpost(sq, first_seq, posted, n);
        (posted, Some(errno_error("ibv_post_send", rc)))
    }

    /// After a refused post: the WRs from `first_seq + posted` to `first_seq + n` were not
    /// posted; their slots and region holds are given back.
    fn unpost(&self, ring: &mut Ring, first_seq: u64, posted: usize, n: usize) {
        for seq in first_seq + posted as u64..first_seq + n as u64 {
            let slot = ring.slot(seq);
            self.mrs.hold(&slot.lkeys, false);
            slot.lkeys.clear();
        }
        ring.tail = first_seq + posted as u64;
    }

    /// Posts receive WRs (cookie, SGEs).
    pub fn post_recv(&self, wrs: &[(u64, SgeList)]) -> (usize, Option<Error>) {
        let mut rq = self.rq.lock();
        self.post_in_chains(&mut rq, wrs, "post_recv: the receive queue", "", |q, c| {
            self.post_recv_chain(q, c)
        })
    }

    fn post_recv_chain(&self, rq: &mut Ring, wrs: &[(u64, SgeList)]) -> (usize, Option<Error>) {
        // SAFETY: plain C data, all-zero valid.
        let mut ws: [ib::ibv_recv_wr; CHAIN] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut sg: [ib::ibv_sge; CHAIN_SGES] = unsafe { std::mem::zeroed() };
        let (mut n, mut nsg) = (0, 0);
        let mut stop = None;
        let first_seq = rq.tail;
        for (cookie, sges) in wrs.iter().take(CHAIN) {
            if sges.len() > self.knobs.max_recv_sge {
                stop = Some(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "post_recv: {} SGEs, max_recv_sge is {}",
                        sges.len(),
                        self.knobs.max_recv_sge
                    ),
                ));
                break;
            }
            if nsg + sges.len() > CHAIN_SGES {
                break;
            }
            let seq = rq.tail;
            let slot = rq.slot(seq);
            slot.cookie = *cookie;
            slot.opcode = None;
            slot.caller_signaled = true;
            slot.lkeys.clear();
            slot.lkeys.extend(sges.iter().map(|s| s.lkey));
            self.mrs.hold(&slot.lkeys, true);
            rq.tail += 1;
            let w = &mut ws[n];
            w.wr_id = RECV_TAG | seq;
            (w.sg_list, w.num_sge) = fill_sges(&mut sg, &mut nsg, sges);
            n += 1;
        }
        if n == 0 {
            return (0, stop);
        }
        let base = ws.as_mut_ptr();
        for i in 0..n - 1 {
            // SAFETY: i + 1 < n <= CHAIN: both elements are in `ws`; only raw pointers
            // derived from `base` touch it until the post.
            unsafe { (*base.add(i)).next = base.add(i + 1) };
        }
        let mut bad: *mut ib::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live QP; a NULL-terminated chain with SGEs in `sg`, alive for the call.
        let rc = unsafe { ib::ibv_post_recv(self.raw.qp, base, &mut bad) };
        if rc == 0 {
            return (n, stop);
        }
        // SAFETY: `bad` is NULL or an element of the chain at `base`.
        let posted = unsafe { posted_before(base, bad, n) };
        self.unpost(rq, first_seq, posted, n);
        (posted, Some(errno_error("ibv_post_recv", rc)))
    }

    /// Moves up to `out.len()` completions into `out`: those `req_notify` found first,
    /// then the send CQ, then the receive CQ (one `ibv_poll_cq` of up to `poll_batch`
    /// each).
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let mut n = 0;
        // Held across the CQ poll: the side-channel watcher may stash completions
        // (`set_peer_gone`), and none may overtake those.
        let mut st = self.stash.lock();
        if !st.is_empty() {
            let k = st.len().min(out.len());
            out[..k].copy_from_slice(&st[..k]);
            st.drain(..k);
            n = k;
            if st.is_empty() {
                self.wake.clear();
            }
        }
        n + self.poll_cqs(&mut out[n..])
    }

    fn poll_cqs(&self, out: &mut [Wc]) -> usize {
        let mut n = self.poll_cq(self.raw.send_cq, out);
        if self.raw.recv_cq != self.raw.send_cq {
            n += self.poll_cq(self.raw.recv_cq, &mut out[n..]);
        }
        n
    }

    fn poll_cq(&self, cq: *mut ib::ibv_cq, out: &mut [Wc]) -> usize {
        let want = out.len().min(self.knobs.poll_batch);
        if want == 0 {
            return 0;
        }
        // SAFETY: ibv_wc is plain C data; all-zero is valid.
        let mut wcs: [ib::ibv_wc; POLL] = unsafe { std::mem::zeroed() };
        // SAFETY: a live CQ; `wcs` has room for `want` <= POLL entries. rdma-sys calls
        // `context->ops.poll_cq` as verbs.h's static inline does.
        let got = unsafe { ib::ibv_poll_cq(cq, want as i32, wcs.as_mut_ptr()) };
        if got <= 0 {
            if got < 0 {
                log::warn!(target: "rdmx::verbs", "QP {:#x}: ibv_poll_cq failed ({got})", self.qpn);
            }
            return 0;
        }
        let mut n = 0;
        for w in &wcs[..got as usize] {
            if let Some(wc) = self.convert(w) {
                out[n] = wc;
                n += 1;
            }
        }
        n
    }

    /// One device completion as the caller sees it; None for a completion the caller did
    /// not ask for (a send signaled only to retire unsignaled ones).
    fn convert(&self, w: &ib::ibv_wc) -> Option<Wc> {
        let status = status_of(w.status);
        if status != WcStatus::Success && status != WcStatus::WrFlushErr {
            self.note_failure(status);
        }
        if w.wr_id & RECV_TAG != 0 {
            let seq = w.wr_id & !RECV_TAG;
            let mut rq = self.rq.lock();
            if seq < rq.head || seq >= rq.tail {
                log::warn!(target: "rdmx::verbs", "QP {:#x}: receive completion for unknown WR {seq}", self.qpn);
                return None;
            }
            // In order: anything before `seq` (never, on RC) is retired with it.
            let mut cookie = 0;
            for s in rq.head..=seq {
                let slot = rq.slot(s);
                self.mrs.hold(&slot.lkeys, false);
                slot.lkeys.clear();
                cookie = slot.cookie;
            }
            rq.head = seq + 1;
            let inv = status == WcStatus::Success
                && w.wc_flags & ib::ibv_wc_flags::IBV_WC_WITH_INV.0 != 0;
            let opcode = if status == WcStatus::Success && w.opcode == 129 {
                WcOpcode::RecvRdmaWithImm
            } else if inv {
                WcOpcode::RecvWithInv
            } else {
                WcOpcode::Recv
            };
            // SAFETY: both members of the union are a plain u32, so reading either is
            // sound; with IBV_WC_WITH_INV it is invalidated_rkey (host order).
            let rkey = unsafe { w.imm_data_invalidated_rkey_union.invalidated_rkey };
            let inv_rkey = inv.then_some(rkey);
            return Some(Wc {
                cookie,
                status,
                opcode,
                byte_len: w.byte_len,
                // WcOpcode::RecvWithInv: `imm` is the invalidated rkey.
                imm: inv_rkey.or_else(|| self.imm(w)),
                qp_num: w.qp_num,
                src_qp: None,
            });
        }
        let seq = w.wr_id;
        let mut sq = self.sq.lock();
        if seq < sq.head || seq >= sq.tail {
            log::warn!(target: "rdmx::verbs", "QP {:#x}: send completion for unknown WR {seq}", self.qpn);
            return None;
        }
        let (mut cookie, mut opcode, mut asked, mut local) = (0, WrOpcode::Send, false, 0);
        for s in sq.head..=seq {
            let slot = sq.slot(s);
            self.mrs.hold(&slot.lkeys, false);
            slot.lkeys.clear();
            cookie = slot.cookie;
            opcode = slot.opcode.unwrap_or(WrOpcode::Send);
            asked = slot.caller_signaled;
            local = std::mem::take(&mut slot.local);
        }
        sq.head = seq + 1;
        if local != 0 {
            // A window bind or invalidate (`qp/local.rs`): its waiter learns the outcome;
            // the caller never sees it (a failed bind ends the QP, which its own WRs'
            // flushes report).
            drop(sq);
            if status != WcStatus::Success && status != WcStatus::WrFlushErr {
                log::warn!(target: "rdmx::verbs", "QP {:#x}: memory window operation failed: {status:?}", self.qpn);
            }
            if local == local::INV {
                self.local_done
                    .lock()
                    .push((seq, status == WcStatus::Success));
            }
            return None;
        }
        if status == WcStatus::Success && !asked {
            return None;
        }
        Some(Wc {
            cookie,
            status,
            opcode: opcode.wc_opcode(),
            byte_len: w.byte_len,
            imm: None,
            qp_num: w.qp_num,
            src_qp: None,
        })
    }

    fn imm(&self, w: &ib::ibv_wc) -> Option<u32> {
        if w.wc_flags & ib::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            // SAFETY: with IBV_WC_WITH_IMM the union holds imm_data (network order).
            Some(u32::from_be(unsafe {
                w.imm_data_invalidated_rkey_union.imm_data
            }))
        } else {
            None
        }
    }

    fn note_failure(&self, status: WcStatus) {
        let mut f = self.failure.lock();
        if f.is_some() {
            return;
        }
        let (timeout, retry_cnt, rnr_retry, min_rnr_timer) = self.timers;
        let ack_ns = crate::config::encoding::ack_timeout_ns(timeout).unwrap_or(0);
        *f = match status {
            WcStatus::RetryExcErr => Some(format!(
                "RETRY_EXC_ERR on QP {:#x}: the device got no ACK for a request after \
                 retry_cnt={retry_cnt} retries of the local ACK timeout (timeout={timeout}: \
                 {:.1} ms each, about {:.1} ms in all; a NIC may wait up to 4x longer): the \
                 peer is unreachable (link down, black hole, peer host gone) or its QP is gone",
                self.qpn,
                ack_ns as f64 / 1e6,
                ack_ns as f64 * f64::from(retry_cnt + 1) / 1e6
            )),
            WcStatus::RnrRetryExcErr => Some(format!(
                "RNR_RETRY_EXC_ERR on QP {:#x}: the peer answered rnr_retry={rnr_retry} SENDs \
                 with RNR NAK (no receive posted; its min_rnr_timer sets the wait, ours is \
                 {min_rnr_timer}): the peer does not post receives fast enough",
                self.qpn
            )),
            _ => None,
        };
    }

    /// Arms both CQs: the event fd becomes readable on the next completion, or at once if
    /// completions are already queued (they are kept for the next poll).
    pub fn req_notify(&self) {
        for cq in [self.raw.send_cq, self.raw.recv_cq] {
            // SAFETY: a live CQ bound to our channel; rdma-sys calls
            // `context->ops.req_notify_cq` as verbs.h's static inline does.
            let rc = unsafe { ib::ibv_req_notify_cq(cq, 0) };
            if rc != 0 {
                log::warn!(target: "rdmx::verbs", "QP {:#x}: ibv_req_notify_cq: {}", self.qpn, std::io::Error::from_raw_os_error(rc));
            }
            if self.raw.recv_cq == self.raw.send_cq {
                break;
            }
        }
        // Completions that arrived before the arm raise no event: look for them now.
        self.stash_queued();
    }

    /// The caller's event fd (epoll over the completion channel and the stash wakeup).
    pub fn event_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Reads (and acks) the channel's pending events; clears the stash wakeup if the
    /// stash is empty.
    pub fn clear_event(&self) {
        for _ in 0..MAX_EVENTS {
            let mut cq: *mut ib::ibv_cq = std::ptr::null_mut();
            let mut ctx: *mut libc::c_void = std::ptr::null_mut();
            // SAFETY: live non-blocking channel; out-pointers are live locals.
            let rc = unsafe { ib::ibv_get_cq_event(self.raw.channel, &mut cq, &mut ctx) };
            if rc != 0 || cq.is_null() {
                break;
            }
            // SAFETY: `cq` is one of our CQs (the only ones on this channel); acked at
            // once so destroying it never waits.
            unsafe { ib::ibv_ack_cq_events(cq, 1) };
        }
        if self.stash.lock().is_empty() {
            self.wake.clear();
        }
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // WRs never completed (the connection is gone): their regions are free again.
        for q in [&self.sq, &self.rq] {
            let mut r = q.lock();
            for s in r.head..r.tail {
                let slot = r.slot(s);
                self.mrs.hold(&slot.lkeys, false);
                slot.lkeys.clear();
            }
            r.head = r.tail;
        }
    }
}

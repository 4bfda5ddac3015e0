//! RC queue pairs (UD ones: `ud.rs`): creation with CQs and an optional SRQ, `modify` through verbs' state
//! machine (RESET -> INIT -> RTR -> RTS, -> ERR, -> RESET) with the peer's address taken
//! from the AV's GID at RTR, `query`, posting, and the operator's `qp_override`.

mod attr;
mod inline;
mod overrides;
pub mod ud;

pub use attr::{AhAttr, QpAttr, gid_to_ip, ip_to_gid, mtu_from_ibv, mtu_to_ibv, qp_state_from_ibv};
pub use ud::{QPT_UD, UdQp, UdSendWr};

use parking_lot::Mutex;
use rdmx::error::{Error, ErrorKind, Result};
use rdmx::provider::soft::device::SoftDevice;
use rdmx::provider::soft::qp::{QpErrorEvent, SendReq, SoftQp};
use rdmx::rc::verbs::{attr_mask as m, send_flags};
use rdmx::rc::{QpCaps, QpState, SgeList, WrOpcode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::cq::Cq;
use super::device::limits;
use super::events::{EventTally, event_type};
use super::pd::Pd;
use super::srq::Srq;
use inline::InlineArena;
use overrides::Overrides;

/// `IBV_QP_CUR_STATE`: the state the caller believes the QP is in.
const CUR_STATE: u32 = 1 << 1;

/// `struct ibv_qp_cap`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr` (RC).
#[derive(Debug, Clone)]
pub struct InitAttr {
    pub send_cq: Arc<Cq>,
    pub recv_cq: Arc<Cq>,
    /// Receives come from this SRQ (`cap.max_recv_wr`/`max_recv_sge` are then ignored and
    /// `post_recv` on the QP is refused, as verbs).
    pub srq: Option<Arc<Srq>>,
    pub cap: QpCap,
    /// Every send WR completes with a completion (else only IBV_SEND_SIGNALED ones do).
    pub sq_sig_all: bool,
    /// `enum ibv_qp_type`: only [`super::QPT_RC`] (2); others are Unsupported.
    pub qp_type: u32,
}

impl InitAttr {
    /// A QP (RC or UD) made with these attributes now uses its PD, CQs and SRQ: each
    /// counts it (a CQ, SRQ or PD with QPs refuses destruction, EBUSY), as does the device.
    pub(super) fn take_refs(&self, pd: &Pd) {
        self.adjust_refs(pd, true);
    }

    /// The QP is gone: undoes [`InitAttr::take_refs`].
    pub(super) fn drop_refs(&self, pd: &Pd) {
        self.adjust_refs(pd, false);
    }

    fn adjust_refs(&self, pd: &Pd, up: bool) {
        let step = |c: &std::sync::atomic::AtomicUsize| {
            if up {
                c.fetch_add(1, Ordering::AcqRel);
            } else {
                c.fetch_sub(1, Ordering::AcqRel);
            }
        };
        step(&pd.users);
        step(&self.send_cq.qps);
        step(&self.recv_cq.qps);
        if let Some(srq) = &self.srq {
            step(&srq.qps);
        }
        if up {
            pd.dev.qps.fetch_add(1, Ordering::Relaxed);
        } else {
            pd.dev.qps.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// `struct ibv_send_wr` (one WR; the glue walks the `next` chain into a slice).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub opcode: WrOpcode,
    /// `enum ibv_send_flags`: SIGNALED 2, SOLICITED 4, INLINE 8 (FENCE 1 is accepted: the
    /// engine executes in order anyway).
    pub send_flags: u32,
    pub sg_list: SgeList,
    /// `__be32 imm_data` as it lies in memory (SEND_WITH_IMM, RDMA_WRITE_WITH_IMM); for
    /// SEND_WITH_INV the union's `invalidate_rkey` (host order).
    pub imm_data: u32,
    /// `wr.rdma.remote_addr` / `wr.rdma.rkey` (RDMA READ/WRITE).
    pub remote_addr: u64,
    pub rkey: u32,
}

/// `struct ibv_recv_wr` (one WR).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sg_list: SgeList,
}

/// An RC queue pair (`ibv_create_qp`).
#[derive(Debug)]
pub struct Qp {
    pd: Arc<Pd>,
    handle: u64,
    soft: Arc<SoftQp>,
    /// As created, with the caps granted.
    init: InitAttr,
    /// Inline arena and the sequence number of the next send WR posted (see `inline.rs`).
    send: Mutex<SendSide>,
    /// The AV given at RTR (for `query`).
    ah: Mutex<AhAttr>,
    overrides: Overrides,
    /// Async event records written about this QP.
    events: Arc<EventTally>,
    dead: AtomicBool,
}

#[derive(Debug)]
struct SendSide {
    arena: Option<InlineArena>,
    seq: u64,
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

impl Qp {
    /// An RC QP in RESET on `pd`'s device with a QP number the device picks (random,
    /// never 0/1, unique in the device); `handle` names it (`struct ibv_qp *`). The caps
    /// are checked against the device limits (InvalidArgument); `cap.max_inline_data` is
    /// at most the device's (1024) and a buffer of `(max_send_wr + 1) x max_inline_data`
    /// bytes is registered for inline sends. `query` reports the caps granted.
    pub fn new(pd: &Arc<Pd>, init: &InitAttr, handle: u64) -> Result<Arc<Qp>> {
        pd.check_alive()?;
        if init.qp_type != super::QPT_RC {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "create_qp: qp_type {}: the soft provider implements RC (2) and UD (4)",
                    init.qp_type
                ),
            ));
        }
        init.send_cq.check_alive()?;
        init.recv_cq.check_alive()?;
        if let Some(srq) = &init.srq {
            srq.check_alive()?;
        }
        let dev = &pd.dev;
        for cq in [&init.send_cq, &init.recv_cq] {
            if !Arc::ptr_eq(&cq.dev, dev) {
                return Err(invalid("create_qp: a CQ of another device".into()));
            }
        }
        let c = init.cap;
        let (max_recv_wr, max_recv_sge) = match &init.srq {
            // The engine's own queue only ever holds the WQE taken for the packet at hand.
            Some(srq) => (4, srq.query().max_sge),
            None => (c.max_recv_wr, c.max_recv_sge),
        };
        if c.max_send_wr > limits::MAX_QP_WR
            || max_recv_wr > limits::MAX_QP_WR
            || c.max_send_sge > limits::MAX_SGE
            || max_recv_sge > limits::MAX_SGE
            || c.max_inline_data > limits::MAX_INLINE
        {
            return Err(invalid(format!(
                "create_qp: caps {c:?} exceed the device's (max_qp_wr {}, max_sge {}, max_inline_data {})",
                limits::MAX_QP_WR,
                limits::MAX_SGE,
                limits::MAX_INLINE
            )));
        }
        let caps = QpCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge,
            // The provider asks the engine for every completion and filters (SoftQp).
            sq_sig_all: false,
            ..QpCaps::default()
        };
        let arena = match c.max_inline_data {
            0 => None,
            n => Some(InlineArena::new(dev.soft.mrs(), c.max_send_wr, n)?),
        };
        let soft = match dev.soft.create_qp(
            caps,
            dev.ip,
            Arc::clone(&init.send_cq.soft),
            Arc::clone(&init.recv_cq.soft),
        ) {
            Ok(q) => q,
            Err(e) => {
                if let Some(a) = arena {
                    a.release(dev.soft.mrs());
                }
                return Err(e);
            }
        };
        let events = Arc::clone(&dev.events);
        let tally = Arc::new(EventTally::default());
        let t = Arc::clone(&tally);
        let hook = Box::new(move |e: QpErrorEvent| {
            if e.fatal {
                t.emit(|| events.raise(handle, event_type::QP_FATAL));
            }
            if e.last_wqe {
                t.emit(|| events.raise(handle, event_type::QP_LAST_WQE_REACHED));
            }
        });
        soft.attach_verbs(init.srq.as_ref().map(|s| Arc::clone(&s.soft)), hook)?;
        super::stats::qp_created(&soft);
        init.take_refs(pd);
        log::debug!(target: "rdmx::ibv", "QP {:#x} created ({:?}, srq {})", soft.qpn(), c, init.srq.is_some());
        Ok(Arc::new(Qp {
            pd: Arc::clone(pd),
            handle,
            soft,
            init: init.clone(),
            send: Mutex::new(SendSide { arena, seq: 0 }),
            ah: Mutex::new(AhAttr::default()),
            overrides: Overrides::default(),
            events: tally,
            dead: AtomicBool::new(false),
        }))
    }

    pub(crate) fn check_alive(&self) -> Result<()> {
        if self.dead.load(Ordering::Acquire) {
            return Err(invalid(format!(
                "QP {:#x} already destroyed",
                self.soft.qpn()
            )));
        }
        Ok(())
    }

    /// The soft QP (for the local operations of `verbs/mw.rs`).
    pub(crate) fn soft_qp(&self) -> &Arc<SoftQp> {
        &self.soft
    }

    /// Every send WR completes with a completion.
    pub(crate) fn sq_sig_all(&self) -> bool {
        self.init.sq_sig_all
    }

    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// Async event records written about this QP (each one the application must
    /// acknowledge before the QP's memory may go); final once destroyed.
    pub fn events_written(&self) -> u64 {
        self.events.written()
    }

    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.soft.qpn()
    }

    /// The transport's counters (packets, retransmissions, NAKs, ...).
    pub fn counters(&self) -> rdmx::rc::Counters {
        self.soft.counters()
    }

    /// The current state.
    pub fn state(&self) -> QpState {
        self.soft.state()
    }

    /// `ibv_modify_qp` with `mask` of `enum ibv_qp_attr_mask` bits. Transitions and
    /// required/optional masks as verbs for RC (RESET->INIT: STATE|PKEY_INDEX|PORT|
    /// ACCESS_FLAGS; INIT->RTR: STATE|AV|PATH_MTU|DEST_QPN|RQ_PSN|MAX_DEST_RD_ATOMIC|
    /// MIN_RNR_TIMER; RTR->RTS: STATE|SQ_PSN|MAX_QP_RD_ATOMIC|RETRY_CNT|RNR_RETRY|TIMEOUT;
    /// any -> ERR or RESET). CUR_STATE is checked against the current state; SQD/SQE,
    /// alternate paths and unknown bits are refused. At RTR the AV's `dgid` gives the
    /// peer's IP (IPv4-mapped -> IPv4), its UDP port is `soft_port` (or what the
    /// connection manager learnt, `peer_port`); `sgid_index` must be
    /// 0; `path_mtu` above the route's active MTU is lowered (logged). Attributes listed in
    /// the config's `qp_override` are replaced by the config's values (logged once per QP
    /// and attribute, counted). On error nothing changes.
    pub fn modify(&self, attr: &QpAttr, mask: u32) -> Result<()> {
        self.check_alive()?;
        let dev = &self.pd.dev;
        let qpn = self.soft.qpn();
        let cur = self.soft.state();
        if mask & CUR_STATE != 0 && attr.cur_qp_state != cur {
            return Err(invalid(format!(
                "modify_qp: QP {qpn:#x}: cur_qp_state {:?} but the QP is in {cur:?}",
                attr.cur_qp_state
            )));
        }
        let mask = mask & !CUR_STATE;
        let mut attr = *attr;
        let replaced = overrides::apply(dev.settings(), &mut attr, mask);
        let mut path_mtu = 1024;
        if mask & m::PATH_MTU != 0 {
            path_mtu = mtu_from_ibv(attr.path_mtu)?;
        }
        let mut peer = None;
        if mask & m::AV != 0 {
            let ah = &attr.ah_attr;
            if ah.sgid_index != 0 {
                return Err(invalid(format!(
                    "modify_qp: ah_attr.grh.sgid_index {}: the GID table has one entry (0)",
                    ah.sgid_index
                )));
            }
            let ip = gid_to_ip(&ah.dgid);
            if ip.is_ipv4() != dev.ip.is_ipv4() || ip.is_unspecified() {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "modify_qp: QP {qpn:#x}: dgid {ip} is not reachable from the device's address {}",
                        dev.ip
                    ),
                ));
            }
            peer = Some(super::peer_port::peer(dev, ip, attr.dest_qp_num));
            if mask & m::PATH_MTU != 0 {
                match dev.soft.route_active_mtu(ip) {
                    Ok(active) if active < path_mtu => {
                        log::info!(target: "rdmx::ibv", "QP {qpn:#x}: path_mtu {path_mtu} -> {active} (the route to {ip})");
                        path_mtu = active;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        log::info!(target: "rdmx::ibv", "QP {qpn:#x}: {e}; path_mtu {path_mtu} kept")
                    }
                }
            }
        }
        let a = rdmx::rc::QpAttr {
            qp_state: attr.qp_state,
            qp_access_flags: attr.qp_access_flags,
            pkey_index: attr.pkey_index,
            port_num: attr.port_num,
            path_mtu,
            dest_qp_num: attr.dest_qp_num,
            rq_psn: attr.rq_psn,
            sq_psn: attr.sq_psn,
            max_dest_rd_atomic: attr.max_dest_rd_atomic,
            min_rnr_timer: attr.min_rnr_timer,
            max_rd_atomic: attr.max_rd_atomic,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
        };
        if mask & m::PORT != 0 {
            super::device::check_port(attr.port_num)?;
        }
        if mask & m::PKEY_INDEX != 0 && attr.pkey_index != 0 {
            return Err(invalid(format!(
                "modify_qp: pkey_index {}: the P_Key table has one entry (0)",
                attr.pkey_index
            )));
        }
        if mask & m::STATE != 0 && matches!(a.qp_state, QpState::Err | QpState::Reset) {
            // ACKs held for the application's next post go before the QP stops sending.
            dev.soft.send_held_acks(&self.soft);
        }
        self.soft.modify(dev.soft.mrs(), &a, mask, peer)?;
        if mask & m::AV != 0 {
            *self.ah.lock() = attr.ah_attr;
        }
        if !replaced.is_empty() {
            let n = self.overrides.record(qpn, &replaced);
            dev.overrides.fetch_add(n, Ordering::Relaxed);
        }
        Ok(())
    }

    /// `ibv_query_qp`: the current attributes (the whole struct is filled, `mask` is
    /// accepted for verbs' sake) including `cur_qp_state` and the granted caps, and the
    /// init attributes.
    pub fn query(&self, mask: u32) -> (QpAttr, InitAttr) {
        let _ = mask;
        let a = self.soft.attr();
        let q = QpAttr {
            qp_state: a.qp_state,
            cur_qp_state: a.qp_state,
            path_mtu: mtu_to_ibv(a.path_mtu),
            qkey: 0,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: a.qp_access_flags,
            cap: self.init.cap,
            ah_attr: *self.ah.lock(),
            pkey_index: a.pkey_index,
            en_sqd_async_notify: 0,
            sq_draining: 0,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
        };
        (q, self.init.clone())
    }

    /// `ibv_post_send`: posts in order; on the first refusal returns its index (`bad_wr`)
    /// and why (InvalidArgument: not in RTS (or ERR, where WRs complete at once with
    /// WR_FLUSH_ERR), too many SGEs, inline data above `max_inline_data`, an opcode
    /// needing a field it lacks; Full: `max_send_wr` outstanding). Signaled completions
    /// per `sq_sig_all` or IBV_SEND_SIGNALED; errors always complete. INLINE data is
    /// copied during the call (the SGEs' lkeys are then ignored, as verbs).
    ///
    /// # Safety
    /// For WRs with IBV_SEND_INLINE, each SGE's `[addr, addr + length)` must be readable
    /// for the duration of the call. Other SGEs are not dereferenced here (the engine
    /// reaches them through their memory regions).
    pub unsafe fn post_send(&self, wrs: &[SendWr]) -> std::result::Result<(), (usize, Error)> {
        self.check_alive().map_err(|e| (0, e))?;
        let dev = &self.pd.dev;
        let mut side = self.send.lock();
        let mut chunk: Vec<SendReq> = Vec::with_capacity(wrs.len().min(64));
        // Index in `wrs` of chunk[0].
        let mut base = 0;
        for (i, w) in wrs.iter().enumerate() {
            let inline = w.send_flags & send_flags::INLINE != 0;
            if inline && w.opcode == WrOpcode::RdmaRead {
                post_chunk(&dev.soft, &self.soft, &mut side, &chunk, base)?;
                return Err((
                    i,
                    invalid("post_send: IBV_SEND_INLINE with RDMA_READ".into()),
                ));
            }
            let mut flags = w.send_flags & !send_flags::INLINE;
            if self.init.sq_sig_all {
                flags |= send_flags::SIGNALED;
            }
            let mut sges = w.sg_list.clone();
            if inline {
                // The slot is free only once every WR before this one was accepted.
                post_chunk(&dev.soft, &self.soft, &mut side, &chunk, base)?;
                chunk.clear();
                base = i;
                let seq = side.seq;
                let Some(arena) = side.arena.as_mut() else {
                    return Err((
                        i,
                        invalid(format!(
                            "post_send: IBV_SEND_INLINE on QP {:#x} created with max_inline_data 0",
                            self.soft.qpn()
                        )),
                    ));
                };
                // SAFETY: this function's contract: inline SGEs are readable now.
                let sge = unsafe { arena.fill(seq, &w.sg_list) }.map_err(|e| (i, e))?;
                sges = SgeList::new();
                if sge.length > 0 {
                    sges.push(sge);
                }
            }
            chunk.push(SendReq {
                cookie: w.wr_id,
                opcode: w.opcode,
                flags,
                sges,
                remote_addr: w.remote_addr,
                rkey: w.rkey,
                // SendReq::imm: the immediate in wire order, or the rkey to invalidate.
                imm: if w.opcode == WrOpcode::SendWithInv {
                    w.imm_data
                } else {
                    u32::from_be(w.imm_data)
                },
            });
        }
        post_chunk(&dev.soft, &self.soft, &mut side, &chunk, base)
    }

    /// `ibv_post_recv`: as `post_send` (refused in RESET, and on a QP with an SRQ).
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), (usize, Error)> {
        self.check_alive().map_err(|e| (0, e))?;
        if self.init.srq.is_some() {
            return Err((
                0,
                invalid(format!(
                    "post_recv: QP {:#x} takes its receives from an SRQ (use post_srq_recv)",
                    self.soft.qpn()
                )),
            ));
        }
        let v: Vec<(u64, SgeList)> = wrs.iter().map(|w| (w.wr_id, w.sg_list.clone())).collect();
        match self.soft.post_recv(self.pd.dev.soft.mrs(), &v) {
            (_, None) => Ok(()),
            (n, Some(e)) => Err((n, e)),
        }
    }

    /// Attributes of this QP that `qp_override` replaced so far.
    pub fn overrides(&self) -> u64 {
        self.overrides.count()
    }

    /// `ibv_destroy_qp`: the QP leaves the device (its packets are dropped from now on);
    /// outstanding WRs are discarded without completions, as verbs.
    pub fn destroy(&self) -> Result<()> {
        if !self.teardown() {
            return self.check_alive();
        }
        Ok(())
    }

    /// Leaves the device, then resets the engine (waiting for a progress pass that may
    /// still drive it), then frees the inline arena; releases the counts it held; stops
    /// its async events. False if it was already torn down.
    fn teardown(&self) -> bool {
        if self.dead.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.events.close();
        let dev = &self.pd.dev;
        super::stats::qp_destroyed(&self.soft);
        dev.soft.destroy_qp(self.soft.qpn());
        self.soft.discard_all(dev.soft.mrs());
        if let Some(a) = self.send.lock().arena.take() {
            a.release(dev.soft.mrs());
        }
        self.init.drop_refs(&self.pd);
        true
    }
}

impl Drop for Qp {
    /// A QP the application never destroyed leaves the device here (its arena must not
    /// be freed while the engine may read it).
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// Posts `chunk` (WRs `base..` of the caller's list) to the engine and advances the send
/// sequence by the WRs accepted; the first refusal is returned with its index in the
/// caller's list.
fn post_chunk(
    dev: &SoftDevice,
    soft: &Arc<SoftQp>,
    side: &mut SendSide,
    chunk: &[SendReq],
    base: usize,
) -> std::result::Result<(), (usize, Error)> {
    if chunk.is_empty() {
        return Ok(());
    }
    // Batched: an application posting one WR per call and then polling gets one sendmmsg
    // per poll, not per post.
    let (n, err) = dev.post_send_batched(soft, chunk);
    side.seq += n as u64;
    match err {
        None => Ok(()),
        Some(e) => Err((base + n, e)),
    }
}

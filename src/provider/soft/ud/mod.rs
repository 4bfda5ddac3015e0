//! Unreliable Datagram queue pairs of the soft provider (verbs `IBV_QPT_UD`, RoCEv2 UD:
//! BTH + DETH, docs/ibv-device.md "UD QPs").
//!
//! A UD QP has no engine: nothing is acknowledged or retransmitted, so a post builds one
//! packet per WR (the payload gathered from registered memory, at most the port's active
//! MTU: no segmentation), seals its ICRC and sends it from the QP's own UDP source port to
//! the address the WR's address handle names; the send completes when the datagram left.
//! The PSN only counts. A received packet (dispatched by the device on its BTH DestQP,
//! `device/ud.rs`) is checked (ICRC, state RTR/RTS, P_Key, Q_Key) and takes the oldest
//! receive WQE (the QP's or its SRQ's): the 40-byte GRH area, then the payload, are
//! scattered into it. Without a WQE the packet is dropped and counted, as rxe does.
//! Source addresses are not filtered: any peer may send to a UD QP that knows its Q_Key.

use crate::error::{Error, ErrorKind, Result};
use crate::rc::memory::{self, SgeList, sge_total};
use crate::rc::verbs::{QpState, WcOpcode, WcStatus, WrOpcode, attr_mask as m, send_flags};
use crate::wire::ud::{DEFAULT_PKEY, GRH_LEN, UdPacketRepr, grh_ipv4, grh_ipv6};
use crate::wire::{DethRepr, MASK_24};
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::cq::{Cq, Wc};
use super::mr::{MemView, MrTable};
use super::srq::SoftSrq;
use super::udp::{self, TxDatagram, UdpPort};

#[cfg(test)]
mod tests;

/// `IBV_QP_QKEY` (`enum ibv_qp_attr_mask`).
pub const ATTR_QKEY: u32 = 1 << 6;

/// Packets per `sendmmsg` of one post.
const TX_BATCH: usize = 32;

/// Largest header of a UD packet (BTH + DETH + ImmDt) plus pad and ICRC.
const MAX_OVERHEAD: usize = 24 + 3 + 4;

/// The queue sizes of a UD QP (as `ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
}

/// The attributes `ibv_modify_qp` sets on a UD QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdAttr {
    pub qp_state: QpState,
    pub qkey: u32,
    pub sq_psn: u32,
    pub pkey_index: u16,
    pub port_num: u8,
}

impl Default for UdAttr {
    fn default() -> Self {
        UdAttr {
            qp_state: QpState::Reset,
            qkey: 0,
            sq_psn: 0,
            pkey_index: 0,
            port_num: 1,
        }
    }
}

/// Where a UD send goes: the resolved address handle (the peer device's UDP address), the
/// destination QP and the Q_Key it expects (`wr.ud`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdDest {
    pub addr: SocketAddr,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// What a UD send carries: SGEs of registered memory, or bytes copied at post time
/// (IBV_SEND_INLINE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UdData<'a> {
    Sges(SgeList),
    Inline(&'a [u8]),
}

/// One UD send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdSendReq<'a> {
    pub cookie: u64,
    /// SEND or SEND_WITH_IMM (anything else is refused at post).
    pub opcode: WrOpcode,
    /// SIGNALED, SOLICITED (others ignored).
    pub flags: u32,
    pub data: UdData<'a>,
    /// The immediate as the wire carries it (SEND_WITH_IMM).
    pub imm: u32,
    pub dest: UdDest,
}

/// A UD QP's counters (cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdCounters {
    /// Packets sent.
    pub sent: u64,
    /// Datagrams the kernel refused or had no room for (lost, as on a wire).
    pub tx_lost: u64,
    /// Messages delivered into a receive WQE (successful completions).
    pub received: u64,
    /// Packets whose DETH Q_Key differed from the QP's (dropped).
    pub qkey_violations: u64,
    /// Packets whose P_Key does not match the port's (dropped).
    pub pkey_violations: u64,
    /// Packets that found no receive WQE (dropped).
    pub no_recv_wqe: u64,
    /// Packets that arrived before RTR or after ERR/RESET (dropped).
    pub not_ready: u64,
    /// Packets that do not parse as UD (dropped).
    pub malformed: u64,
    /// Packets with a wrong ICRC (dropped).
    pub bad_icrc: u64,
}

#[derive(Debug, Default)]
struct CounterCells {
    sent: AtomicU64,
    tx_lost: AtomicU64,
    received: AtomicU64,
    qkey_violations: AtomicU64,
    pkey_violations: AtomicU64,
    no_recv_wqe: AtomicU64,
    not_ready: AtomicU64,
    malformed: AtomicU64,
    bad_icrc: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A posted receive WQE.
#[derive(Debug)]
struct RecvWqe {
    cookie: u64,
    sges: SgeList,
}

#[derive(Debug)]
struct Inner {
    attr: UdAttr,
    /// Next PSN to send (24 bits).
    psn: u32,
    rq: VecDeque<RecvWqe>,
    /// Packet buffers of one send batch (allocated on first use).
    bufs: Vec<Vec<u8>>,
}

/// One UD queue pair.
#[derive(Debug)]
pub struct UdQp {
    qpn: u32,
    caps: UdCaps,
    /// Largest message (the port's active MTU).
    mtu: u32,
    sock: UdpPort,
    pub send_cq: Arc<Cq>,
    pub recv_cq: Arc<Cq>,
    srq: Option<Arc<SoftSrq>>,
    inner: Mutex<Inner>,
    counters: CounterCells,
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

/// What [`UdQp::receive`] did with a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdReceived {
    /// Delivered into a WQE (its completion is in the receive CQ, possibly an error).
    Delivered,
    /// Dropped, counted by the QP ([`UdCounters`]).
    Dropped,
}

impl UdQp {
    /// A UD QP in RESET with its own UDP source port on `local_ip`; messages of at most
    /// `mtu` bytes. Receives come from `srq` if given.
    pub fn new(
        qpn: u32,
        caps: UdCaps,
        mtu: u32,
        local_ip: IpAddr,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        srq: Option<Arc<SoftSrq>>,
    ) -> Result<UdQp> {
        let sock = UdpPort::bind_qp_port(local_ip, qpn).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("UD QP {qpn:#x}: no UDP source port in 0xC000-0xFFFF on {local_ip}: {e}"),
            )
        })?;
        Ok(UdQp {
            qpn,
            caps,
            mtu,
            sock,
            send_cq,
            recv_cq,
            srq,
            inner: Mutex::new(Inner {
                attr: UdAttr::default(),
                psn: 0,
                rq: VecDeque::new(),
                bufs: Vec::new(),
            }),
            counters: CounterCells::default(),
        })
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    pub fn caps(&self) -> UdCaps {
        self.caps
    }

    /// The largest message a send may carry (the port's active MTU).
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// The UDP address this QP sends from.
    pub fn local_udp(&self) -> SocketAddr {
        self.sock.local_addr()
    }

    pub fn state(&self) -> QpState {
        self.inner.lock().attr.qp_state
    }

    /// The current attributes (`qp_state` is the current state; `sq_psn` the next PSN).
    pub fn attr(&self) -> UdAttr {
        let g = self.inner.lock();
        UdAttr {
            sq_psn: g.psn,
            ..g.attr
        }
    }

    pub fn counters(&self) -> UdCounters {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        UdCounters {
            sent: l(&c.sent),
            tx_lost: l(&c.tx_lost),
            received: l(&c.received),
            qkey_violations: l(&c.qkey_violations),
            pkey_violations: l(&c.pkey_violations),
            no_recv_wqe: l(&c.no_recv_wqe),
            not_ready: l(&c.not_ready),
            malformed: l(&c.malformed),
            bad_icrc: l(&c.bad_icrc),
        }
    }

    /// `ibv_modify_qp` for UD, with the kernel's (`ib_modify_qp_is_ok`) required and
    /// optional masks: RESET->INIT STATE|PKEY_INDEX|PORT|QKEY; INIT->INIT
    /// [PKEY_INDEX|PORT|QKEY]; INIT->RTR STATE [PKEY_INDEX|QKEY]; RTR->RTS STATE|SQ_PSN
    /// [QKEY]; RTS->RTS [QKEY]; any -> ERR or RESET: STATE. A missing required or an
    /// unexpected attribute, or another transition, is InvalidArgument and changes nothing.
    /// ERR flushes the QP's own receive WQEs (WR_FLUSH_ERR); RESET discards them.
    pub fn modify(&self, mrs: &MrTable, attr: &UdAttr, mask: u32) -> Result<()> {
        use QpState::{Init, Reset, Rtr, Rts};
        let mut g = self.inner.lock();
        let cur = g.attr.qp_state;
        let to = if mask & m::STATE != 0 {
            attr.qp_state
        } else {
            cur
        };
        let (required, optional) = match (cur, to) {
            (Reset, Init) => (m::STATE | m::PKEY_INDEX | m::PORT | ATTR_QKEY, 0),
            (Init, Init) => (0, m::PKEY_INDEX | m::PORT | ATTR_QKEY),
            (Init, Rtr) => (m::STATE, m::PKEY_INDEX | ATTR_QKEY),
            (Rtr, Rts) => (m::STATE | m::SQ_PSN, ATTR_QKEY),
            (Rts, Rts) => (0, ATTR_QKEY),
            (_, QpState::Err) | (_, Reset) => (m::STATE, 0),
            _ => {
                return Err(invalid(format!(
                    "modify_qp: UD QP {:#x}: no transition {cur:?} -> {to:?}",
                    self.qpn
                )));
            }
        };
        if mask & required != required || mask & !(required | optional | m::STATE) != 0 {
            return Err(invalid(format!(
                "modify_qp: UD QP {:#x} {cur:?} -> {to:?}: attribute mask {mask:#x}, expected {required:#x} and optionally {optional:#x}",
                self.qpn
            )));
        }
        if mask & m::PKEY_INDEX != 0 && attr.pkey_index != 0 {
            return Err(invalid(format!(
                "modify_qp: pkey_index {}: the P_Key table has one entry (0)",
                attr.pkey_index
            )));
        }
        if mask & m::PORT != 0 && attr.port_num != 1 {
            return Err(invalid(format!(
                "modify_qp: port_num {}: the device has one port (1)",
                attr.port_num
            )));
        }
        if mask & ATTR_QKEY != 0 {
            g.attr.qkey = attr.qkey;
        }
        if mask & m::SQ_PSN != 0 {
            g.psn = attr.sq_psn & MASK_24;
        }
        if mask & m::PKEY_INDEX != 0 {
            g.attr.pkey_index = attr.pkey_index;
        }
        if mask & m::PORT != 0 {
            g.attr.port_num = attr.port_num;
        }
        g.attr.qp_state = to;
        match to {
            QpState::Err if cur != QpState::Err => self.flush_rq(&mut g, mrs),
            Reset => {
                for w in g.rq.drain(..) {
                    hold(mrs, &w.sges, false);
                }
                g.attr = UdAttr::default();
                g.psn = 0;
            }
            _ => {}
        }
        Ok(())
    }

    /// Completes every receive WQE of the QP's own queue with WR_FLUSH_ERR.
    fn flush_rq(&self, g: &mut Inner, mrs: &MrTable) {
        for w in g.rq.drain(..) {
            hold(mrs, &w.sges, false);
            self.recv_cq.push(self.wc(
                w.cookie,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
                None,
                None,
            ));
        }
    }

    fn wc(
        &self,
        cookie: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
        src_qp: Option<u32>,
    ) -> Wc {
        Wc {
            cookie,
            status,
            opcode,
            byte_len,
            imm,
            qp_num: self.qpn,
            src_qp,
        }
    }

    /// For destroy: RESET, discarding the receive WQEs without completions.
    pub fn discard_all(&self, mrs: &MrTable) {
        let reset = UdAttr::default();
        let _ = self.modify(mrs, &reset, m::STATE);
    }

    /// Posts receive WQEs (cookie, SGEs). Refused in RESET (InvalidArgument), on a QP with
    /// an SRQ, with more than `max_recv_sge` SGEs, or with `max_recv_wr` queued (Full). In
    /// ERR each completes at once with WR_FLUSH_ERR.
    pub fn post_recv(&self, mrs: &MrTable, wrs: &[(u64, SgeList)]) -> (usize, Option<Error>) {
        if self.srq.is_some() {
            return (
                0,
                Some(invalid(format!(
                    "post_recv: UD QP {:#x} takes its receives from an SRQ",
                    self.qpn
                ))),
            );
        }
        let mut g = self.inner.lock();
        for (i, (cookie, sges)) in wrs.iter().enumerate() {
            let refuse = if g.attr.qp_state == QpState::Reset {
                Some(invalid(format!(
                    "post_recv: UD QP {:#x} is in RESET",
                    self.qpn
                )))
            } else if sges.len() > self.caps.max_recv_sge as usize {
                Some(invalid(format!(
                    "post_recv: {} SGEs exceed max_recv_sge {}",
                    sges.len(),
                    self.caps.max_recv_sge
                )))
            } else if g.rq.len() >= self.caps.max_recv_wr as usize {
                Some(Error::new(
                    ErrorKind::Full,
                    format!(
                        "post_recv: UD QP {:#x}: receive queue full ({} WQEs = max_recv_wr)",
                        self.qpn, self.caps.max_recv_wr
                    ),
                ))
            } else {
                None
            };
            if let Some(e) = refuse {
                return (i, Some(e));
            }
            if g.attr.qp_state == QpState::Err {
                self.recv_cq.push(self.wc(
                    *cookie,
                    WcStatus::WrFlushErr,
                    WcOpcode::Recv,
                    0,
                    None,
                    None,
                ));
                continue;
            }
            hold(mrs, sges, true);
            g.rq.push_back(RecvWqe {
                cookie: *cookie,
                sges: sges.clone(),
            });
        }
        (wrs.len(), None)
    }

    /// Posts send WRs in order: each is one packet, sent before this returns (one
    /// `sendmmsg` per [`TX_BATCH`] WRs), then completed (signaled ones, and errors). A WR
    /// is refused (and the chain stops there, as `bad_wr`) when the QP is not in RTS
    /// (InvalidArgument; in ERR it completes with WR_FLUSH_ERR instead), its opcode is not
    /// SEND/SEND_WITH_IMM, it has more than `max_send_sge` SGEs, or its message exceeds
    /// the MTU (UD does not segment). A WR whose SGEs name memory it may not read
    /// completes with LOC_PROT_ERR and moves the QP to ERR.
    pub fn post_send(&self, mrs: &MrTable, wrs: &[UdSendReq<'_>]) -> (usize, Option<Error>) {
        let mut g = self.inner.lock();
        let mut done = 0;
        while done < wrs.len() {
            let (n, err) = self.send_batch(&mut g, mrs, &wrs[done..]);
            done += n;
            if err.is_some() {
                return (done, err);
            }
            if n == 0 {
                break;
            }
        }
        (done, None)
    }

    /// Checks one WR against the QP; the refusal `post_send` reports.
    fn check_wr(&self, w: &UdSendReq<'_>, len: u64) -> Result<()> {
        if !matches!(w.opcode, WrOpcode::Send | WrOpcode::SendWithImm) {
            return Err(invalid(format!(
                "post_send: UD QP {:#x}: opcode {:?}: UD carries SEND and SEND_WITH_IMM only",
                self.qpn, w.opcode
            )));
        }
        if let UdData::Sges(s) = &w.data
            && s.len() > self.caps.max_send_sge as usize
        {
            return Err(invalid(format!(
                "post_send: {} SGEs exceed max_send_sge {}",
                s.len(),
                self.caps.max_send_sge
            )));
        }
        if len > u64::from(self.mtu) {
            return Err(invalid(format!(
                "post_send: UD QP {:#x}: a {len}-byte message exceeds the MTU ({} bytes): UD does not segment",
                self.qpn, self.mtu
            )));
        }
        Ok(())
    }

    /// Builds, sends and completes up to [`TX_BATCH`] WRs from the front of `wrs`.
    fn send_batch(
        &self,
        g: &mut Inner,
        mrs: &MrTable,
        wrs: &[UdSendReq<'_>],
    ) -> (usize, Option<Error>) {
        let state = g.attr.qp_state;
        if state == QpState::Err {
            for w in wrs {
                self.send_cq.push(self.wc(
                    w.cookie,
                    WcStatus::WrFlushErr,
                    WcOpcode::Send,
                    0,
                    None,
                    None,
                ));
            }
            return (wrs.len(), None);
        }
        if state != QpState::Rts {
            return (
                0,
                Some(invalid(format!(
                    "post_send: UD QP {:#x} is in {state:?}, not RTS",
                    self.qpn
                ))),
            );
        }
        if g.bufs.is_empty() {
            g.bufs = vec![vec![0u8; self.mtu as usize + MAX_OVERHEAD]; TX_BATCH];
        }
        let src = self.sock.local_addr();
        let view = mrs.view();
        // (WR index, packet length) of the packets built.
        let mut built: SmallVec<[(usize, usize); TX_BATCH]> = SmallVec::new();
        let mut refused = None;
        let mut prot_err = None;
        for (i, w) in wrs.iter().take(TX_BATCH).enumerate() {
            let len = match &w.data {
                UdData::Sges(s) => sge_total(s),
                UdData::Inline(b) => b.len() as u64,
            };
            if let Err(e) = self.check_wr(w, len) {
                refused = Some((i, e));
                break;
            }
            let psn = g.psn;
            let buf = &mut g.bufs[built.len()];
            let repr = UdPacketRepr {
                solicited: w.flags & send_flags::SOLICITED != 0,
                pkey: DEFAULT_PKEY,
                dest_qp: w.dest.remote_qpn & MASK_24,
                psn,
                deth: DethRepr {
                    qkey: w.dest.remote_qkey,
                    src_qp: self.qpn,
                },
                imm: (w.opcode == WrOpcode::SendWithImm).then_some(w.imm),
                payload: &[],
            };
            // Headers for this payload length, then the payload straight into the packet.
            let plen = len as usize;
            let pad = crate::wire::pad_len(plen);
            let hl = match repr.emit_headers(plen, buf) {
                Ok(h) => h,
                Err(e) => {
                    refused = Some((i, invalid(format!("post_send: {e}"))));
                    break;
                }
            };
            let body = &mut buf[hl..hl + plen];
            let copied = match &w.data {
                UdData::Sges(s) => memory::gather(&view, s, 0, body).is_ok(),
                UdData::Inline(b) => {
                    body.copy_from_slice(b);
                    true
                }
            };
            if !copied {
                prot_err = Some(i);
                break;
            }
            buf[hl + plen..hl + plen + pad + 4].fill(0);
            let total = hl + plen + pad + 4;
            let (head, tail) = buf[..total].split_at_mut(total - 4);
            if let Err(e) = udp::seal(src, w.dest.addr, head, &[], tail) {
                refused = Some((i, invalid(format!("post_send: UD QP {:#x}: {e}", self.qpn))));
                break;
            }
            g.psn = (psn + 1) & MASK_24;
            built.push((i, total));
        }
        drop(view);
        if !built.is_empty() {
            let batch: SmallVec<[TxDatagram<'_>; TX_BATCH]> = built
                .iter()
                .enumerate()
                .map(|(k, &(i, total))| TxDatagram {
                    dst: wrs[i].dest.addr,
                    parts: [&g.bufs[k][..total], &[], &[]],
                })
                .collect();
            let sent = match self.sock.send_batch(&batch) {
                Ok(n) => n,
                Err(e) => {
                    log::debug!(target: "rdmx::soft", "UD QP {:#x}: send: {e}", self.qpn);
                    0
                }
            };
            self.counters.sent.fetch_add(sent as u64, Ordering::Relaxed);
            self.counters
                .tx_lost
                .fetch_add((batch.len() - sent) as u64, Ordering::Relaxed);
            // Unreliable: a datagram the kernel refused is lost as on a wire; the WR
            // completes either way, as a NIC's does once the packet left its port.
            for &(i, _) in &built {
                let w = &wrs[i];
                if w.flags & send_flags::SIGNALED != 0 {
                    self.push_send(self.wc(
                        w.cookie,
                        WcStatus::Success,
                        WcOpcode::Send,
                        0,
                        None,
                        None,
                    ));
                }
            }
        }
        let n = built.len();
        if let Some(i) = prot_err {
            let w = &wrs[i];
            self.push_send(self.wc(
                w.cookie,
                WcStatus::LocProtErr,
                WcOpcode::Send,
                0,
                None,
                None,
            ));
            g.attr.qp_state = QpState::Err;
            self.flush_rq(g, mrs);
            log::debug!(target: "rdmx::soft", "UD QP {:#x}: send WR {:#x}: local protection error; QP in ERR", self.qpn, w.cookie);
            return (n + 1, None);
        }
        match refused {
            Some((_, e)) => (n, Some(e)),
            None => (n, None),
        }
    }

    fn push_send(&self, wc: Wc) {
        if !self.send_cq.push(wc) {
            log::error!(target: "rdmx::soft", "UD QP {:#x}: send completion queue overrun", self.qpn);
        }
    }

    /// A datagram from `src` at `dst` whose BTH names this QP: ICRC, parse, state (RTR or
    /// RTS), P_Key, Q_Key, a receive WQE; then the GRH area and the payload are scattered
    /// into the WQE and its completion (RECV, byte_len = 40 + payload, src_qp, GRH) goes
    /// to the receive CQ. A WQE too small for both completes with LOC_LEN_ERR (with an
    /// SRQ: REM_INV_REQ_ERR, as rxe); one whose memory cannot be written, LOC_PROT_ERR.
    /// Every drop is counted.
    pub fn receive(
        &self,
        mrs: &MrTable,
        view: &mut MemView<'_>,
        src: SocketAddr,
        dst: SocketAddr,
        data: &[u8],
    ) -> UdReceived {
        let c = &self.counters;
        if !udp::verify(src, dst, data) {
            bump(&c.bad_icrc);
            log::trace!(target: "rdmx::soft", "UD QP {:#x}: bad ICRC from {src}", self.qpn);
            return UdReceived::Dropped;
        }
        let Ok(p) = UdPacketRepr::parse(data) else {
            bump(&c.malformed);
            log::trace!(target: "rdmx::soft", "UD QP {:#x}: malformed packet from {src}", self.qpn);
            return UdReceived::Dropped;
        };
        let mut g = self.inner.lock();
        if !matches!(g.attr.qp_state, QpState::Rtr | QpState::Rts) {
            log::trace!(target: "rdmx::soft", "UD QP {:#x}: packet in {:?}", self.qpn, g.attr.qp_state);
            bump(&c.not_ready);
            return UdReceived::Dropped;
        }
        // P_Key match: low 15 bits equal, one side a full member (the port's is 0xFFFF).
        if p.pkey & 0x7FFF != DEFAULT_PKEY & 0x7FFF {
            bump(&c.pkey_violations);
            return UdReceived::Dropped;
        }
        if p.deth.qkey != g.attr.qkey {
            log::trace!(target: "rdmx::soft", "UD QP {:#x}: Q_Key {:#x} from {src}, expected {:#x}", self.qpn, p.deth.qkey, g.attr.qkey);
            bump(&c.qkey_violations);
            return UdReceived::Dropped;
        }
        let wqe = match &self.srq {
            Some(srq) => srq.take().map(|(cookie, sges)| RecvWqe { cookie, sges }),
            None => g.rq.pop_front(),
        };
        // The lock stays held until the completion is queued: a destroy (RESET) that
        // returns has no delivery into a WQE of this QP still in progress.
        let Some(wqe) = wqe else {
            log::trace!(target: "rdmx::soft", "UD QP {:#x}: no receive WQE for a packet from {src}", self.qpn);
            bump(&c.no_recv_wqe);
            return UdReceived::Dropped;
        };
        let grh = match (src.ip().to_canonical(), dst.ip().to_canonical()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => grh_ipv4(s, d, data.len()),
            (IpAddr::V6(s), IpAddr::V6(d)) => grh_ipv6(s, d, data.len()),
            // Not reachable: the port is of one family (udp::verify refused mixed ones).
            _ => [0; GRH_LEN],
        };
        let byte_len = (GRH_LEN + p.payload.len()) as u32;
        let status = if sge_total(&wqe.sges) < u64::from(byte_len) {
            if self.srq.is_some() {
                WcStatus::RemInvReqErr
            } else {
                WcStatus::LocLenErr
            }
        } else if memory::scatter(view, &wqe.sges, 0, &grh).is_err()
            || memory::scatter(view, &wqe.sges, GRH_LEN as u64, p.payload).is_err()
        {
            WcStatus::LocProtErr
        } else {
            WcStatus::Success
        };
        hold(mrs, &wqe.sges, false);
        if status == WcStatus::Success {
            bump(&c.received);
        }
        let wc = self.wc(
            wqe.cookie,
            status,
            WcOpcode::Recv,
            byte_len,
            p.imm,
            Some(p.deth.src_qp),
        );
        if !self.recv_cq.push_solicited(wc, p.solicited) {
            log::error!(target: "rdmx::soft", "UD QP {:#x}: receive completion queue overrun", self.qpn);
        }
        drop(g);
        log::trace!(target: "rdmx::soft", "UD QP {:#x}: {byte_len} bytes from QP {:#x} at {src}: {status:?}", self.qpn, p.deth.src_qp);
        UdReceived::Delivered
    }
}

/// Holds (or releases) the regions `sges` name while a WQE names them.
fn hold(mrs: &MrTable, sges: &[memory::Sge], up: bool) {
    let lkeys: SmallVec<[u32; 2]> = sges.iter().map(|s| s.lkey).collect();
    mrs.hold(&lkeys, up);
}

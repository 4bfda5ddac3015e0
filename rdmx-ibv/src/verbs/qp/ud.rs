//! UD queue pairs (`IBV_QPT_UD`) on the soft provider's `UdQp`: creation with CQs and an
//! optional SRQ, `modify` with the UD masks (Q_Key at INIT, SQ_PSN at RTS), `query`, and
//! posting sends whose `wr.ud` names an address handle, the remote QPN and Q_Key. The RC
//! [`super::Qp`] is untouched: the glue holds one or the other.

use rdmx::error::{Error, ErrorKind, Result};
use rdmx::provider::soft::ud::{UdAttr, UdCaps, UdData, UdDest, UdQp as SoftUdQp, UdSendReq};
use rdmx::rc::verbs::send_flags;
use rdmx::rc::{QpState, SgeList, WrOpcode};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::super::ah::Ah;
use super::super::device::limits;
use super::super::pd::Pd;
use super::{CUR_STATE, InitAttr, QpAttr, RecvWr, mtu_to_ibv};

/// `IBV_QPT_UD`.
pub const QPT_UD: u32 = 4;

/// `ibv_wc.sl` of a UD receive: what ConnectX NICs report through rdma-core's mlx5
/// provider for RoCE (the CQE's packet type: bit 3 = UDP header present, i.e. RoCEv2;
/// bits 2..0 = L3 header, 2 IPv4, 1 IPv6), not a service level (RoCE has none here).
/// UCX's `ud_verbs` (1.11 to 1.17) reads the GRH area as IPv4 or IPv6 by these bits and,
/// with anything else (rxe's 0), looks for an IPv6 destination GID in an IPv4 header and
/// drops every packet; every other program ignores `sl` on RoCE.
pub fn roce_v2_sl(device_ip: IpAddr) -> u8 {
    if device_ip.is_ipv4() {
        0x8 | 0x2
    } else {
        0x8 | 0x1
    }
}

/// One UD send WR (`struct ibv_send_wr` with `wr.ud`).
#[derive(Debug, Clone)]
pub struct UdSendWr {
    pub wr_id: u64,
    /// SEND or SEND_WITH_IMM.
    pub opcode: WrOpcode,
    /// SIGNALED, SOLICITED, INLINE.
    pub send_flags: u32,
    pub sg_list: SgeList,
    /// `__be32 imm_data` as it lies in memory.
    pub imm_data: u32,
    /// `wr.ud.ah`.
    pub ah: Arc<Ah>,
    pub remote_qpn: u32,
    pub remote_qkey: u32,
}

/// A UD queue pair.
#[derive(Debug)]
pub struct UdQp {
    pd: Arc<Pd>,
    handle: u64,
    soft: Arc<SoftUdQp>,
    init: InitAttr,
    dead: AtomicBool,
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

impl UdQp {
    /// A UD QP in RESET on `pd`'s device (caps checked against the device limits;
    /// `max_inline_data` up to the device's, copied at post time).
    pub fn new(pd: &Arc<Pd>, init: &InitAttr, handle: u64) -> Result<Arc<UdQp>> {
        pd.check_alive()?;
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
        if c.max_send_wr > limits::MAX_QP_WR
            || c.max_recv_wr > limits::MAX_QP_WR
            || c.max_send_sge > limits::MAX_SGE
            || c.max_recv_sge > limits::MAX_SGE
            || c.max_inline_data > limits::MAX_INLINE
        {
            return Err(invalid(format!(
                "create_qp: caps {c:?} exceed the device's (max_qp_wr {}, max_sge {}, max_inline_data {})",
                limits::MAX_QP_WR,
                limits::MAX_SGE,
                limits::MAX_INLINE
            )));
        }
        let caps = UdCaps {
            max_send_wr: c.max_send_wr,
            max_recv_wr: c.max_recv_wr,
            max_send_sge: c.max_send_sge,
            max_recv_sge: c.max_recv_sge,
        };
        let soft = dev.soft.create_ud_qp(
            caps,
            dev.ip,
            Arc::clone(&init.send_cq.soft),
            Arc::clone(&init.recv_cq.soft),
            init.srq.as_ref().map(|s| Arc::clone(&s.soft)),
        )?;
        init.take_refs(pd);
        log::debug!(target: "rdmx::ibv", "UD QP {:#x} created ({c:?}, srq {})", soft.qpn(), init.srq.is_some());
        Ok(Arc::new(UdQp {
            pd: Arc::clone(pd),
            handle,
            soft,
            init: init.clone(),
            dead: AtomicBool::new(false),
        }))
    }

    fn check_alive(&self) -> Result<()> {
        if self.dead.load(Ordering::Acquire) {
            return Err(invalid(format!(
                "UD QP {:#x} already destroyed",
                self.soft.qpn()
            )));
        }
        Ok(())
    }

    pub fn handle(&self) -> u64 {
        self.handle
    }

    pub fn qp_num(&self) -> u32 {
        self.soft.qpn()
    }

    pub fn state(&self) -> QpState {
        self.soft.state()
    }

    /// The soft QP's counters (Q_Key violations, drops without a WQE, ...).
    pub fn counters(&self) -> rdmx::provider::soft::ud::UdCounters {
        self.soft.counters()
    }

    /// The largest message a send may carry (the port's active MTU).
    pub fn mtu(&self) -> u32 {
        self.soft.mtu()
    }

    /// `ibv_modify_qp` for UD (masks as `rdmx::provider::soft::ud::UdQp::modify`;
    /// CUR_STATE is checked against the current state).
    pub fn modify(&self, attr: &QpAttr, mask: u32) -> Result<()> {
        self.check_alive()?;
        let cur = self.soft.state();
        if mask & CUR_STATE != 0 && attr.cur_qp_state != cur {
            return Err(invalid(format!(
                "modify_qp: UD QP {:#x}: cur_qp_state {:?} but the QP is in {cur:?}",
                self.soft.qpn(),
                attr.cur_qp_state
            )));
        }
        let a = UdAttr {
            qp_state: attr.qp_state,
            qkey: attr.qkey,
            sq_psn: attr.sq_psn,
            pkey_index: attr.pkey_index,
            port_num: attr.port_num,
        };
        self.soft
            .modify(self.pd.dev.soft.mrs(), &a, mask & !CUR_STATE)
    }

    /// `ibv_query_qp`: state, Q_Key, next SQ PSN, P_Key index, port, path MTU (the
    /// port's), caps; and the init attributes.
    pub fn query(&self) -> (QpAttr, InitAttr) {
        let a = self.soft.attr();
        let q = QpAttr {
            qp_state: a.qp_state,
            cur_qp_state: a.qp_state,
            path_mtu: mtu_to_ibv(self.soft.mtu()),
            qkey: a.qkey,
            sq_psn: a.sq_psn,
            pkey_index: a.pkey_index,
            port_num: a.port_num,
            cap: self.init.cap,
            ..QpAttr::default()
        };
        (q, self.init.clone())
    }

    /// `ibv_post_send`: each WR is one packet to its AH, sent before this returns. On the
    /// first refusal returns its index (`bad_wr`) and why: not RTS, an opcode other than
    /// SEND/SEND_WITH_IMM, too many SGEs, inline data above `max_inline_data`, a
    /// destroyed AH or one of another PD, or a message above the MTU.
    ///
    /// # Safety
    /// For WRs with IBV_SEND_INLINE, each SGE's `[addr, addr + length)` must be readable
    /// for the duration of the call.
    pub unsafe fn post_send(&self, wrs: &[UdSendWr]) -> std::result::Result<(), (usize, Error)> {
        self.check_alive().map_err(|e| (0, e))?;
        // Inline bytes of the whole chain, copied now (the caller may reuse its buffers).
        let mut inline: Vec<u8> = Vec::new();
        let mut ranges: Vec<Option<(usize, usize)>> = Vec::with_capacity(wrs.len());
        let mut stop: Option<(usize, Error)> = None;
        for (i, w) in wrs.iter().enumerate() {
            let checked = w.ah.check_alive().and_then(|()| {
                if !Arc::ptr_eq(w.ah.pd(), &self.pd) {
                    return Err(invalid(
                        "post_send: wr.ud.ah belongs to another protection domain".into(),
                    ));
                }
                Ok(())
            });
            if let Err(e) = checked {
                stop = Some((i, e));
                break;
            }
            if w.send_flags & send_flags::INLINE == 0 {
                ranges.push(None);
                continue;
            }
            let total: u64 = w.sg_list.iter().map(|s| u64::from(s.length)).sum();
            if total > u64::from(self.init.cap.max_inline_data) {
                stop = Some((
                    i,
                    invalid(format!(
                        "post_send: {total} bytes of inline data exceed max_inline_data {}",
                        self.init.cap.max_inline_data
                    )),
                ));
                break;
            }
            let start = inline.len();
            for s in &w.sg_list {
                if s.length == 0 {
                    continue;
                }
                // SAFETY: this function's contract: inline SGEs are readable now.
                let src =
                    unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) };
                inline.extend_from_slice(src);
            }
            ranges.push(Some((start, inline.len())));
        }
        let reqs: Vec<UdSendReq<'_>> = wrs
            .iter()
            .zip(&ranges)
            .map(|(w, r)| UdSendReq {
                cookie: w.wr_id,
                opcode: w.opcode,
                flags: w.send_flags
                    | if self.init.sq_sig_all {
                        send_flags::SIGNALED
                    } else {
                        0
                    },
                data: match r {
                    Some((a, b)) => UdData::Inline(&inline[*a..*b]),
                    None => UdData::Sges(w.sg_list.clone()),
                },
                imm: u32::from_be(w.imm_data),
                dest: UdDest {
                    addr: crate::verbs::peer_port::ud_dest(w.ah.dest(), w.remote_qpn),
                    remote_qpn: w.remote_qpn,
                    remote_qkey: w.remote_qkey,
                },
            })
            .collect();
        let (n, err) = self.soft.post_send(self.pd.dev.soft.mrs(), &reqs);
        if let Some(e) = err {
            return Err((n, e));
        }
        match stop {
            Some(s) => Err(s),
            None => Ok(()),
        }
    }

    /// `ibv_post_recv` (refused in RESET and on a QP with an SRQ). Each buffer must hold
    /// the 40-byte GRH area before the payload.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), (usize, Error)> {
        self.check_alive().map_err(|e| (0, e))?;
        let v: Vec<(u64, SgeList)> = wrs.iter().map(|w| (w.wr_id, w.sg_list.clone())).collect();
        match self.soft.post_recv(self.pd.dev.soft.mrs(), &v) {
            (_, None) => Ok(()),
            (n, Some(e)) => Err((n, e)),
        }
    }

    /// `ibv_destroy_qp`: leaves the device; posted receives are discarded.
    pub fn destroy(&self) -> Result<()> {
        if !self.teardown() {
            return self.check_alive();
        }
        Ok(())
    }

    fn teardown(&self) -> bool {
        if self.dead.swap(true, Ordering::AcqRel) {
            return false;
        }
        let dev = &self.pd.dev;
        dev.soft.destroy_ud_qp(self.soft.qpn());
        self.soft.discard_all(dev.soft.mrs());
        self.init.drop_refs(&self.pd);
        true
    }
}

impl Drop for UdQp {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

//! What a verbs QP (libibverbs semantics, `rdmx-ibv`) needs of a soft QP beyond
//! `connect`: stepwise `modify` with the peer's address at RTR, the attributes for
//! `ibv_query_qp`, a shared receive queue, and a hook when the QP enters ERR (async events
//! QP_FATAL and QP_LAST_WQE_REACHED). Kept apart from `qp.rs` (the data path): this file
//! only adds methods, and `qp.rs` calls two of them (`srq_refill` per received packet of an
//! SRQ QP, `verbs_after_collect` after completions moved).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Inner, Pending, SoftQp};
use crate::error::{Error, ErrorKind, Result};
use crate::provider::soft::mr::MrTable;
use crate::provider::soft::srq::SoftSrq;
use crate::rc::verbs::{QpState, attr_mask as m};
use crate::rc::{QpAttr, RecvWr};

/// Why the hook of [`SoftQp::attach_verbs`] runs: the QP entered ERR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpErrorEvent {
    /// The QP went to ERR by itself (a NAK, a CQ overrun, the peer's error), not by the
    /// application's modify, nor by exhausted retries (the failed WR's completion says
    /// RETRY_EXC_ERR/RNR_RETRY_EXC_ERR): verbs' IBV_EVENT_QP_FATAL.
    pub fatal: bool,
    /// The QP takes its receives from an SRQ: verbs' IBV_EVENT_QP_LAST_WQE_REACHED (its
    /// WQEs are flushed by the time the hook runs).
    pub last_wqe: bool,
}

type ErrorHook = Box<dyn Fn(QpErrorEvent) + Send + Sync>;

/// A verbs QP's additions (set once by `attach_verbs`).
pub(super) struct Hooks {
    srq: Option<Arc<SoftSrq>>,
    on_error: ErrorHook,
    /// ERR was reported (cleared by a reset).
    reported: AtomicBool,
    /// The application asked for ERR (no QP_FATAL then).
    by_app: AtomicBool,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("srq", &self.srq.is_some())
            .field("reported", &self.reported)
            .finish()
    }
}

impl SoftQp {
    /// Makes this a verbs QP (once, before it is brought up): receives come from `srq` if
    /// given (the QP's own `post_recv` should then not be used), and `on_error` runs when
    /// the QP enters ERR, under the QP's lock (so it must only queue the event).
    pub fn attach_verbs(&self, srq: Option<Arc<SoftSrq>>, on_error: ErrorHook) -> Result<()> {
        self.verbs
            .set(Hooks {
                srq,
                on_error,
                reported: AtomicBool::new(false),
                by_app: AtomicBool::new(false),
            })
            .map_err(|_| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!("QP {:#x}: verbs hooks already attached", self.qpn),
                )
            })
    }

    /// `ibv_modify_qp` on the engine (`rc::Qp::modify`: the transition and masks are
    /// checked there; on error nothing changes). `peer` is the peer's UDP address, required
    /// for INIT -> RTR (the AV); the peer's UDP source port is learnt from its first packet.
    /// A QP reset and brought up again may go to the same peer IP only (Unsupported
    /// otherwise: packets are filtered by the first peer's IP). Moving to RESET discards
    /// every outstanding WR without a completion (releasing the regions they held); moving
    /// to ERR flushes them into the CQs.
    pub fn modify(
        &self,
        mrs: &MrTable,
        attr: &QpAttr,
        mask: u32,
        peer: Option<SocketAddr>,
    ) -> Result<()> {
        let mut g = self.inner.lock();
        let target = if mask & m::STATE != 0 {
            attr.qp_state
        } else {
            g.qp.state()
        };
        let to_rtr = target == QpState::Rtr && g.qp.state() == QpState::Init;
        if to_rtr {
            let Some(p) = peer else {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "modify_qp: QP {:#x}: INIT -> RTR needs the peer's address (AV)",
                        self.qpn
                    ),
                ));
            };
            if let Some(ip) = self.peer_ip.get()
                && *ip != p.ip().to_canonical()
            {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "modify_qp: QP {:#x} was connected to {ip} before its reset; the soft provider cannot move it to {}: create a new QP",
                        self.qpn,
                        p.ip()
                    ),
                ));
            }
        }
        if target == QpState::Err
            && let Some(h) = self.verbs.get()
        {
            h.by_app
                .store(g.qp.state() != QpState::Err, Ordering::Release);
        }
        g.qp.modify(attr, mask)?;
        if to_rtr && let Some(p) = peer {
            g.peer = Some(p);
            let _ = self.peer_ip.set(p.ip().to_canonical());
        }
        if target == QpState::Reset {
            self.forget_all(&mut g, mrs);
        }
        self.collect(&mut g, mrs);
        self.publish_deadline(&g);
        Ok(())
    }

    /// The engine's attributes (`qp_state` is the current state).
    pub fn attr(&self) -> QpAttr {
        *self.inner.lock().qp.attr()
    }

    /// For destroy: the QP goes to RESET, discarding every outstanding WR without a
    /// completion and releasing the regions they held.
    pub fn discard_all(&self, mrs: &MrTable) {
        let mut g = self.inner.lock();
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..Default::default()
        };
        let _ = g.qp.modify(&reset, m::STATE);
        self.forget_all(&mut g, mrs);
        self.publish_deadline(&g);
    }

    /// After a reset: no WR is outstanding (the engine forgot them), the peer's source
    /// port is learnt again, nothing is sent until RTR names a peer.
    fn forget_all(&self, g: &mut Inner, mrs: &MrTable) {
        for (_, p) in g.pending.drain() {
            mrs.hold(&p.lkeys, false);
        }
        g.peer = None;
        g.error_completed = false;
        g.local.reset();
        self.peer_port.store(0, Ordering::Release);
        if let Some(h) = self.verbs.get() {
            h.reported.store(false, Ordering::Release);
            h.by_app.store(false, Ordering::Release);
        }
    }

    /// Before the engine processes `data`: if it would need a receive WQE the QP lacks,
    /// one moves from the SRQ (its regions stay held by the QP's pending entry). Runs per
    /// received packet of SRQ QPs only.
    #[inline]
    pub(super) fn srq_refill(&self, g: &mut Inner, data: &[u8]) {
        let Some(srq) = self.verbs.get().and_then(|h| h.srq.as_ref()) else {
            return;
        };
        if !g.qp.wants_recv_wqe(data) {
            return;
        }
        let Some((cookie, sges)) = srq.take() else {
            return; // the engine RNR-NAKs
        };
        let id = g.next_id;
        g.next_id += 1;
        let lkeys = sges.iter().map(|s| s.lkey).collect();
        match g.qp.post_recv(RecvWr { wr_id: id, sges }) {
            Ok(()) => {
                g.pending.insert(
                    id,
                    Pending {
                        cookie,
                        lkeys,
                        signaled: true,
                    },
                );
            }
            Err(e) => {
                // Cannot happen (the queue was empty and sized for the SRQ's SGEs); the WQE
                // is lost, which the log says.
                log::error!(target: "rdmx::soft", "QP {:#x}: SRQ WQE {cookie:#x} not taken: {e}", self.qpn);
            }
        }
    }

    /// After completions moved: a verbs QP that entered ERR reports it once.
    #[inline]
    pub(super) fn verbs_after_collect(&self, g: &Inner) {
        let Some(h) = self.verbs.get() else { return };
        if g.qp.state() != QpState::Err || h.reported.swap(true, Ordering::AcqRel) {
            return;
        }
        (h.on_error)(QpErrorEvent {
            // An error a WR's completion reports (retries exhausted, a NAK: remote access,
            // invalid request, remote operation; a local length or protection error) is
            // reported by that completion only, as NICs and rxe do, not by an async event
            // as well: Ceph's QP_FATAL handler dereferences its QP without a check, and by
            // the time it reads the event it has faulted and destroyed that QP. What no
            // completion reports (a responder's access violation on a WRITE or READ, a CQ
            // overrun, the peer's error) is QP_FATAL.
            fatal: !h.by_app.load(Ordering::Acquire)
                && g.qp.failure().is_none()
                && !g.error_completed,
            last_wqe: h.srq.is_some(),
        });
    }
}

//! Local operations of a verbs QP (a memory window bind, a local invalidate: `rdmx-ibv`'s
//! `IBV_WR_BIND_MW`, `ibv_bind_mw`, `IBV_WR_LOCAL_INV`). They put nothing on the wire:
//! the caller performs the operation on the device's window table when it is posted,
//! and this file gives its completion a place in the send queue's order, as a NIC
//! executes a bind or invalidate WQE in turn: the completion reaches the send CQ after
//! those of every send WR posted before it, and before those of every send WR posted after
//! it (which the engine cannot complete before the earlier ones either).
//!
//! Performing the operation at post time rather than when the QP reaches it is what
//! verbs allows: a bind takes effect before any later WR of the queue runs (o10-37.2.x;
//! the application's ordering guarantee), and an invalidate that the application posted
//! means it is done with the window (a NIC may run it as soon as earlier WRs are sent).
//!
//! A failed operation (IBV_WC_MW_BIND_ERR, LOC_QP_OP_ERR) ends the QP, as a NIC's local
//! error does: the QP goes to ERR, the send WRs posted before it complete flushed, then
//! the operation's error completion.

use std::collections::VecDeque;

use super::{Inner, SoftQp};
use crate::error::{Error, ErrorKind, Result};
use crate::provider::soft::cq::Wc;
use crate::provider::soft::mr::MrTable;
use crate::rc::QpAttr;
use crate::rc::verbs::{QpState, WcOpcode, WcStatus, attr_mask as m};

/// The local operations of one QP waiting for their turn.
#[derive(Debug, Default)]
pub(super) struct LocalOps {
    /// Engine id of the last send WR posted (0: none yet).
    last_posted: u64,
    /// Engine id of the last send WR the engine completed.
    last_done: u64,
    /// (engine id of the last send WR posted before it, its completion, signaled).
    waiting: VecDeque<(u64, Wc, bool)>,
}

impl LocalOps {
    /// A send WR with engine id `id` was posted.
    #[inline]
    pub(super) fn sent(&mut self, id: u64) {
        self.last_posted = id;
    }

    /// The engine completed send WR `id` (in order).
    #[inline]
    pub(super) fn done(&mut self, id: u64) {
        self.last_done = id;
    }

    /// Whether any operation waits (a test per send completion: usually false).
    #[inline]
    pub(super) fn any(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The next operation whose turn came before send WR `before` completes (every send
    /// WR posted before it is complete): `before` = u64::MAX for "now".
    pub(super) fn next_ready(&mut self, before: u64) -> Option<(Wc, bool)> {
        let &(after, _, _) = self.waiting.front()?;
        // Send WRs complete in order: when `before` completes, every send WR before it has.
        let turn = if before == u64::MAX {
            after <= self.last_done
        } else {
            after < before
        };
        if turn {
            return self.waiting.pop_front().map(|(_, wc, s)| (wc, s));
        }
        None
    }

    /// After a reset: nothing is outstanding (the engine forgot its WRs too).
    pub(super) fn reset(&mut self) {
        self.waiting.clear();
        self.last_done = self.last_posted;
    }
}

impl SoftQp {
    /// Queues the completion of a local operation the caller performed (`status`
    /// Success) or refused (an error status) for send WR `cookie`: it reaches the send CQ
    /// in the send queue's order (see the module comment). In ERR the caller must not
    /// have performed it: the completion is WR_FLUSH_ERR whatever `status` says. Refused
    /// (InvalidArgument) in states that take no send WR (RESET, INIT, RTR), as a post.
    pub fn post_local(
        &self,
        mrs: &MrTable,
        cookie: u64,
        opcode: WcOpcode,
        status: WcStatus,
        signaled: bool,
    ) -> Result<()> {
        let mut g = self.inner.lock();
        let state = g.qp.state();
        let status = match state {
            QpState::Rts => status,
            QpState::Err => WcStatus::WrFlushErr,
            s => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("post_send: QP {:#x} is in {s:?}, needs RTS", self.qpn),
                ));
            }
        };
        let wc = Wc {
            cookie,
            status,
            opcode,
            byte_len: 0,
            imm: None,
            qp_num: self.qpn,
            src_qp: None,
        };
        let after = g.local.last_posted;
        g.local.waiting.push_back((after, wc, signaled));
        if state == QpState::Rts && status != WcStatus::Success {
            log::debug!(
                target: "rdmx::soft",
                "QP {:#x}: local operation {opcode:?} failed ({status:?}): the QP goes to error",
                self.qpn
            );
            let err = QpAttr {
                qp_state: QpState::Err,
                ..Default::default()
            };
            let _ = g.qp.modify(&err, m::STATE);
        }
        self.collect(&mut g, mrs);
        self.publish_deadline(&g);
        Ok(())
    }

    /// Moves local completions whose turn came before send WR `before` into the send CQ
    /// (u64::MAX: all whose earlier send WRs are complete); returns whether one did not
    /// fit.
    pub(super) fn release_locals(&self, g: &mut Inner, before: u64) -> bool {
        let mut overrun = false;
        while let Some((wc, signaled)) = g.local.next_ready(before) {
            if wc.status == WcStatus::Success && !signaled {
                continue;
            }
            if !matches!(wc.status, WcStatus::Success | WcStatus::WrFlushErr) {
                g.error_completed = true;
            }
            overrun |= !self.send_cq.push(wc);
        }
        overrun
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(cookie: u64) -> Wc {
        Wc {
            cookie,
            ..Wc::EMPTY
        }
    }

    #[test]
    fn an_operation_waits_for_the_send_wrs_posted_before_it() {
        let mut l = LocalOps::default();
        // Nothing outstanding: ready at once.
        l.waiting.push_back((l.last_posted, wc(1), true));
        assert_eq!(l.next_ready(u64::MAX).map(|(w, _)| w.cookie), Some(1));
        // Sends 5 and 7 posted, then the operation, then send 9.
        l.sent(5);
        l.sent(7);
        l.waiting.push_back((l.last_posted, wc(2), true));
        l.sent(9);
        assert!(l.next_ready(u64::MAX).is_none(), "5 and 7 not complete");
        assert!(l.next_ready(5).is_none(), "before 5 completes");
        l.done(5);
        assert!(l.next_ready(7).is_none(), "before 7 completes");
        l.done(7);
        // Before 9's completion is pushed, the operation goes.
        assert_eq!(l.next_ready(9).map(|(w, _)| w.cookie), Some(2));
        l.done(9);
        assert!(!l.any());
        l.sent(11);
        l.waiting.push_back((l.last_posted, wc(3), true));
        l.reset();
        assert!(!l.any());
        l.waiting.push_back((l.last_posted, wc(4), true));
        assert_eq!(l.next_ready(u64::MAX).map(|(w, _)| w.cookie), Some(4));
    }
}

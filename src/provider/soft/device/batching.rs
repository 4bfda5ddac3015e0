//! Sends deferred to the next progress pass while the application polls (progress=inline):
//! WRs posted between two polls (the doorbell list, one `sendmmsg` for all of them) and
//! positive ACKs an application pass holds back so the answer it posts carries them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::super::qp::{SendReq, SoftQp};
use super::pass::Touched;
use super::{Shared, SoftDevice};
use crate::error::Error;

impl SoftDevice {
    /// Sends the ACKs an application pass held back on `qp` (`held_acks`), before the QP
    /// leaves RTS or the device: a NIC has acknowledged what the application saw complete,
    /// and a peer that got no ACK for its last message would retry it into an error (an
    /// application that received, then destroyed its QP or went to ERR).
    pub fn send_held_acks(&self, qp: &SoftQp) {
        if qp.acks_held.load(Ordering::Acquire) {
            qp.drive(&self.shared.mrs, self.shared.now(), false, false);
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
}

impl Shared {
    /// Puts `qp` on the doorbell list (WRs posted while the application polls): the next
    /// pass drives it, or an application thread that stops polling.
    pub(super) fn ring(&self, qp: &Arc<SoftQp>) {
        if !qp.doorbell.swap(true, Ordering::AcqRel) {
            self.doorbells.lock().push(Arc::clone(qp));
            self.doorbells_rung.store(true, Ordering::Release);
        }
    }

    /// Puts `qp` on the list of held ACKs (see `held_acks`).
    pub(super) fn hold_acks_of(&self, qp: &Arc<SoftQp>, now: u64) {
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
    pub(super) fn release_acks(&self, now: u64, min_age: u64) {
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
    pub(super) fn ring_doorbells(&self, now: u64) {
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
}

/// How long an application pass holds back positive ACKs at most (see `held_acks`): long
/// enough for its callbacks to post the answer that carries them, and below every ACK
/// timeout from code 4 (67 us) up (codes 1-3, 8-33 us, no userspace responder meets).
pub(super) const ACK_HOLD_NS: u64 = 50_000;

/// The same for a verbs program's pass (`device/answers.rs`): its answer to a WRITE (a
/// spinner sees its memory written and posts) comes within microseconds of the poll that
/// landed it, before its next poll; a program that polls on without answering (a sink of
/// WRITEs) sends its ACKs at its next poll this much later, not after 50 us.
pub(super) const VERBS_ACK_HOLD_NS: u64 = 10_000;

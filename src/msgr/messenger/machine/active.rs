//! Path policy active/active (`PathPolicy::Active`, issue 30 point 1): every joined link
//! of the session carries data.
//!
//! - Sender: each message goes on the joined link with the fewest unacknowledged messages
//!   that has a data credit ([`Machine::least_loaded`]); each held message records its
//!   link (`Out::lid`). Sequence numbers stay per session, acknowledgements cumulative.
//! - Receiver: a message ahead of a gap is held (`got`) and handed over when the gap
//!   fills; duplicates are dropped. `received` is the highest number below which nothing
//!   is missing: the driver delivers, in order, what it holds up to there
//!   ([`Machine::deliverable`]).
//! - A link fails ([`Machine::lose_link`]): what went on it and was not acknowledged is
//!   sent again on the others (lossless: the receiver's hold fills, duplicates dropped:
//!   exactly once, in order) or reported in doubt (lossy) and named in a
//!   [`flags::GIVEUP`] frame, so that the receiver's hold skips those numbers. The
//!   receiver forgets what it accepted on the failed link and had not delivered (its data
//!   went with the link): lossless, the sender sends it again; lossy, it is given up. No
//!   switch frame, no rewind of the other links: each side moves on by itself (the
//!   accepting side does not wait for the connecting side's choice). With no link left,
//!   the single-path rules apply (lossless reconnects, lossy ends).
//! - Immediate messages carry no sequence number, so their place among messages that
//!   arrive out of order across links is unknown: an active/active session refuses them
//!   (`InvalidArgument` at send).
//!
//! Give-up frames, not a per-link watermark: the numbers a failed link carried interleave
//! with the survivors' (1, 3, 5 on it; 2, 4, 6 on another), so no single number says
//! which ones will not come, and a watermark per link needs each message to carry the
//! previous number sent on its link. A bitmap of 128 numbers from a base (three header
//! fields, no payload) names them; the sender keeps them until the peer's cumulative
//! acknowledgement passes them and sends them again when a link fails (the one a frame
//! went on may be it).

use super::{Action, LinkState, Machine, Out, Verdict};
use crate::error::{Error, ErrorKind, Result};
use crate::msgr::messenger::types::{Policy, SessionState};
use crate::msgr::messenger::wire::{Header, Kind, Malformed, flags};
use std::collections::VecDeque;
use std::time::Instant;

/// Numbers a peer may have us skip at once (a bound on what a broken peer makes us keep).
const MAX_SKIPPED: usize = 1 << 16;

/// The error of an immediate message on an active/active session.
pub fn imm_refused() -> Error {
    Error::fixed(
        ErrorKind::InvalidArgument,
        "send: immediate messages (OutMessage::immediate) need a session with one data \
         path: on an active/active session (PathPolicy::Active) they carry no sequence \
         number to order them against messages on other paths",
    )
}

/// The link `lid` of a session, by field (so that the caller may borrow the rest).
pub(super) fn find_link<'a>(
    link: &'a mut Option<LinkState>,
    standby: &'a mut [LinkState],
    lid: u64,
) -> Option<&'a mut LinkState> {
    link.iter_mut()
        .chain(standby.iter_mut())
        .find(|l| l.lid == lid)
}

/// Inserts `m` into `q` by sequence number (the queues stay sorted: a replay goes before
/// the messages sent after it).
pub(super) fn insert_sorted<M>(q: &mut VecDeque<Out<M>>, m: Out<M>) {
    if q.back().is_none_or(|b| b.seq < m.seq) {
        q.push_back(m);
    } else {
        let at = q.partition_point(|o| o.seq < m.seq);
        q.insert(at, m);
    }
}

impl<M> Machine<M> {
    /// Sets the path policy: active/active (every joined link carries data) or not (one
    /// active link, the others standby). Connecting side, before its first link; the
    /// accepting side learns it from the hello ([`flags::ACTIVE`]).
    pub fn set_active(&mut self, on: bool) {
        self.active = on;
    }

    /// Whether the session is active/active.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The highest sequence number the driver may hand over: it delivers, in order, the
    /// accepted messages up to it (active/active holds those ahead of a gap; a lossy
    /// session skips the numbers given up).
    pub fn deliverable(&self) -> u64 {
        self.received
    }

    /// Messages accepted and not delivered, ahead of a gap or not (active/active).
    #[cfg(test)]
    pub fn held_ahead(&self) -> usize {
        self.got.len()
    }

    /// A message on joined link `lid`, active/active: held if new (handed over once
    /// nothing before it is missing), dropped if delivered, held or given up already.
    /// Err: the hold is full. What it holds the peer has not had acknowledged, so its
    /// send queue bounds it; twice ours (the same config on both sides, and room for a
    /// lossy peer's sends given up while this side still holds them) stops a broken or
    /// hostile peer from taking the data pool with numbers far ahead.
    pub(super) fn on_msg_active(
        &mut self,
        lid: u64,
        seq: u64,
    ) -> std::result::Result<Verdict, Malformed> {
        if seq <= self.received || self.got.contains_key(&seq) || self.skipped.contains(&seq) {
            self.counters.duplicates_dropped += 1;
            return Ok(Verdict::Duplicate);
        }
        if self.got.len() >= 2 * self.rules.send_queue_msgs.max(1) {
            return Err(Malformed(
                "messages ahead of a gap beyond twice msgr_send_queue_msgs",
            ));
        }
        self.got.insert(seq, lid);
        self.advance();
        Ok(Verdict::Accept(seq))
    }

    /// `received` up to the last number before a gap.
    fn advance(&mut self) {
        loop {
            let n = self.received + 1;
            if !self.got.contains_key(&n) && !self.skipped.contains(&n) {
                break;
            }
            self.received = n;
        }
    }

    /// Message `seq` was handed over (active/active bookkeeping).
    pub(super) fn delivered_active(&mut self, seq: u64) {
        self.got.remove(&seq);
        while self.skipped.first().is_some_and(|&n| n <= seq) {
            self.skipped.pop_first();
        }
    }

    /// A [`flags::GIVEUP`] frame: the numbers it names will not come (a lossy peer's
    /// sends on a link that failed); the hold skips them. Err: a peer that names more than
    /// this side keeps.
    pub(super) fn on_giveup(&mut self, h: &Header) -> std::result::Result<(), Malformed> {
        if !self.active || self.policy != Policy::Lossy {
            return Err(Malformed(
                "give-up frame on a session that cannot lose messages",
            ));
        }
        for i in 0..128u64 {
            let word = if i < 64 { h.aux2 } else { h.aux3 };
            if word >> (i % 64) & 1 == 0 {
                continue;
            }
            let n = h.aux.saturating_add(i);
            if n > self.delivered {
                self.skipped.insert(n);
            }
        }
        if self.skipped.len() > MAX_SKIPPED {
            return Err(Malformed("give-up frames name too many messages"));
        }
        self.advance();
        Ok(())
    }

    /// Whether joined link `lid` is the one a message goes on now: no other joined link
    /// with a data credit has fewer unacknowledged messages (ties: this one).
    pub(super) fn least_loaded(&self, lid: u64) -> bool {
        let Some(mine) = self.link_state(lid).map(|l| l.out) else {
            return false;
        };
        !self
            .link
            .iter()
            .chain(self.standby.iter())
            .any(|l| l.lid != lid && l.hello_done && l.credits.can_send_data() && l.out < mine)
    }

    /// Link `lid` is gone (active/active; the caller closes it). Sender: what went on it
    /// and was not acknowledged is queued again in order (lossless) or completes in doubt
    /// and is given up (lossy). Receiver: what it accepted there and had not delivered is
    /// forgotten (its data went with the link; the peer sends it again, or gives it up).
    pub(super) fn lose_link(&mut self, lid: u64, why: &Error) {
        let held = std::mem::take(&mut self.unacked);
        let mut lost = Vec::new();
        for m in held {
            if m.lid == lid {
                lost.push(m);
            } else {
                self.unacked.push_back(m);
            }
        }
        if self.policy == Policy::Lossy {
            let e = super::paths::in_doubt(why);
            for m in lost {
                self.held_bytes -= m.shape.bytes;
                self.giveup.insert(m.seq);
                self.notify(super::Notice::SendDone(m.seq, Err(e.clone())));
            }
            // Sent again from the first: the frame that named them may have gone on this
            // link.
            if !self.giveup.is_empty() {
                self.giveup_from = Some(0);
            }
            if self.refused && self.has_room(0) {
                self.refused = false;
                self.notify(super::Notice::Ready);
            }
        } else {
            for mut m in lost {
                m.replay = true;
                m.lid = 0;
                insert_sorted(&mut self.waiting, m);
            }
        }
        self.got.retain(|_, l| *l != lid);
        self.received = self.delivered;
        self.advance();
    }

    /// Every link goes (a reconnect resumes on one): everything unacknowledged is queued
    /// again in order, the hold emptied (the links' data went with them).
    pub(super) fn rewind_active(&mut self) {
        for mut m in std::mem::take(&mut self.unacked) {
            m.replay = true;
            m.lid = 0;
            insert_sorted(&mut self.waiting, m);
        }
        for l in self.link.iter_mut().chain(self.standby.iter_mut()) {
            l.out = 0;
        }
        self.got.clear();
        self.skipped.clear();
        self.received = self.delivered;
    }

    /// Active/active, the primary link failed with another joined: the lowest-index one
    /// becomes the primary (the one the driver reports first; nothing moves, no switch).
    pub(super) fn promote(&mut self, i: usize) {
        let l = self.standby.remove(i);
        let lid = l.lid;
        self.link = Some(l);
        // Only the primary acknowledges, and what it last said may have died with it (an
        // acknowledgement queued on it, or refused at posting): the new primary says again
        // how far this side delivered, or a peer with nothing more to send waits for ever
        // (seed 579,711).
        self.acked_to_peer = 0;
        self.actions.push_back(Action::Activate { link: lid });
    }

    /// A fault of the primary link of an active/active session with another link joined:
    /// it closes, what it carried replays on the others (or is given up), another becomes
    /// the primary. False: not that case (the single-path rules apply).
    pub(super) fn fault_active(&mut self, now: Instant, e: &Error) -> bool {
        if !self.active || self.state != SessionState::Open || self.best_standby().is_none() {
            return false;
        }
        let Some(l) = self.link.take() else {
            return false;
        };
        self.void_posts(l.lid);
        self.lose_link(l.lid, e);
        self.actions.push_back(Action::CloseLink {
            link: l.lid,
            drain: false,
        });
        self.path_down(now, l.path, e.clone(), l.hello_done);
        if let Some(i) = self.best_standby() {
            self.promote(i);
        }
        true
    }

    /// A give-up frame on link `lid` when one is due: the next 128 numbers from
    /// `giveup_from`.
    pub(super) fn send_giveup(&mut self, lid: u64, free: &mut usize) {
        let Some(from) = self.giveup_from else {
            return;
        };
        let Some(&base) = self.giveup.range(from..).next() else {
            self.giveup_from = None;
            return;
        };
        let Some(l) = find_link(&mut self.link, &mut self.standby, lid) else {
            return;
        };
        if !l.credits.can_send_control() {
            l.credits.room_to_speak();
            return;
        }
        if *free == 0 {
            return;
        }
        *free -= 1;
        let (mut lo, mut hi) = (0u64, 0u64);
        for &n in self.giveup.range(base..base.saturating_add(128)) {
            let i = n - base;
            if i < 64 {
                lo |= 1 << i;
            } else {
                hi |= 1 << (i - 64);
            }
        }
        let mut h = Header::new(Kind::Ack);
        h.flags |= flags::GIVEUP;
        h.ack = self.delivered;
        h.aux = base;
        h.aux2 = lo;
        h.aux3 = hi;
        let owed = self.announce_on(lid, &mut h);
        self.acked_to_peer = self.delivered;
        self.actions.push_back(Action::Post {
            link: lid,
            header: h,
            msg: None,
            owed,
        });
        let next = base.saturating_add(128);
        self.giveup_from = self.giveup.range(next..).next().map(|_| next);
    }

    /// The peer acknowledged up to `ack` (active/active): the links' counts of what they
    /// carry, and the give-ups it has seen.
    pub(super) fn acked_active(&mut self, lid: u64) {
        if let Some(l) = find_link(&mut self.link, &mut self.standby, lid) {
            l.out = l.out.saturating_sub(1);
        }
    }

    pub(super) fn prune_giveup(&mut self, ack: u64) {
        while self.giveup.first().is_some_and(|&n| n <= ack) {
            self.giveup.pop_first();
        }
        if self.giveup.is_empty() {
            self.giveup_from = None;
        }
    }

    /// Whether a pass has work on a joined link other than the primary (active/active):
    /// messages and a data credit, an acknowledgement or credits to announce, a give-up.
    pub(super) fn active_wants_pass(&self) -> bool {
        if self.giveup_from.is_some() {
            return true;
        }
        self.link
            .iter()
            .chain(self.standby.iter())
            .filter(|l| l.hello_done)
            .any(|l| {
                (!self.waiting.is_empty() && l.credits.can_send_data())
                    || (l.credits.can_send_control() && l.credits.announce_due())
                    || l.credits.deficit() > 0
            })
    }

    /// The send checks of an active/active session beyond [`super::check_send`].
    pub(super) fn check_active(&self, imm: bool) -> Result<()> {
        if self.active && imm {
            return Err(imm_refused());
        }
        Ok(())
    }
}

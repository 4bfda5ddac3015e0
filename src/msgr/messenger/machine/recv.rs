//! Frames in: credits and liveness every frame brings, acknowledgements, the hello that
//! answers ours, and the order of messages (the next one is accepted, an old one is a
//! duplicate, a gap is a fault).

use super::rules::{self, Order};
use super::{Machine, Verdict};
use crate::error::{Error, ErrorKind};
use crate::msgr::messenger::types::{Policy, SessionState};
use crate::msgr::messenger::wire::{Header, Kind, Malformed, flags};
use std::time::Instant;

impl<M> Machine<M> {
    /// A receive of link `lid` completed with a parsed header (the driver checked the
    /// bytes: a malformed one is [`Machine::on_link_error`] with `InvalidValue`).
    pub fn on_frame(&mut self, now: Instant, lid: u64, h: &Header) -> Verdict {
        if let Some(i) = self.standby.iter().position(|l| l.lid == lid) {
            return self.on_standby_frame(now, i, h);
        }
        let Some(l) = self.link.as_mut().filter(|l| l.lid == lid) else {
            return Verdict::Stale;
        };
        // Every frame consumed one of our receives and announces the peer's.
        l.credits.on_receive();
        l.credits.on_grant(h.credits);
        l.live.last_heard = now;
        if h.has(flags::STARVED) {
            l.credits.grow();
        }
        let Some(kind) = h.kind() else {
            return self.malformed(now, "unknown message kind");
        };
        if kind != Kind::Hello {
            self.on_ack(h.ack);
        }
        match kind {
            Kind::Hello => self.on_hello(now, h),
            Kind::Msg => self.on_msg(now, lid, h.seq),
            Kind::Ack if h.has(flags::GIVEUP) => match self.on_giveup(h) {
                Ok(()) => Verdict::Consumed,
                Err(m) => {
                    self.counters.malformed += 1;
                    self.fault(now, m.into(), false);
                    Verdict::Fault
                }
            },
            Kind::Ack if h.has(flags::SWITCH) => {
                self.note_switch(h.aux, h.aux2);
                Verdict::Consumed
            }
            Kind::Ack | Kind::Ping | Kind::Pong => Verdict::Consumed,
            Kind::Bye => {
                self.fault(
                    now,
                    Error::fixed(ErrorKind::Closed, "the peer closed the session"),
                    true,
                );
                Verdict::Fault
            }
        }
    }

    /// An immediate message (RDMA WRITE WITH IMMEDIATE) arrived on link `lid`: the next
    /// sequence number, in order with the others (RC delivers in order). It carries no
    /// header: no acknowledgement or credit.
    pub fn on_imm(&mut self, now: Instant, lid: u64) -> Verdict {
        if let Some(i) = self.standby.iter().position(|l| l.lid == lid) {
            return self.on_standby_imm(now, i);
        }
        let Some(l) = self.link.as_mut().filter(|l| l.lid == lid) else {
            return Verdict::Stale;
        };
        l.credits.on_receive();
        l.live.last_heard = now;
        if !l.hello_done {
            return self.malformed(now, "immediate message before the session hello");
        }
        if self.active {
            // Refused at send (it has no number to order it by across links).
            return self.malformed(now, "immediate message on an active/active session");
        }
        self.received += 1;
        self.counters.imm_received += 1;
        Verdict::Accept(self.received)
    }

    /// Message `seq` (accepted before, its data complete) went to the application. Messages
    /// are handed over in the order they were accepted.
    pub fn on_delivered(&mut self, seq: u64) {
        // A lossy session skips what a failed path lost (its sender reported it in doubt).
        debug_assert!(
            seq == self.delivered + 1 || (self.policy == Policy::Lossy && seq > self.delivered),
            "delivery out of order"
        );
        debug_assert!(seq <= self.received, "delivery of a message not accepted");
        if self.active {
            self.delivered_active(seq);
        }
        self.delivered = seq;
        self.delivered_in_pass = true;
        self.counters.msgs_received += 1;
    }

    fn on_msg(&mut self, now: Instant, lid: u64, seq: u64) -> Verdict {
        if !self.link.as_ref().is_some_and(|l| l.hello_done) {
            return self.malformed(now, "message before the session hello");
        }
        if self.active {
            return match self.on_msg_active(lid, seq) {
                Ok(v) => v,
                Err(m) => self.malformed(now, m.0),
            };
        }
        match rules::order(self.received, seq) {
            Order::Old => {
                self.counters.duplicates_dropped += 1;
                Verdict::Duplicate
            }
            // What a failed path lost (the sender reported it in doubt and went on on
            // another path): a lossy session accepts the gap; in order all the same.
            Order::Gap if self.policy == Policy::Lossy => {
                self.received = seq;
                Verdict::Accept(seq)
            }
            // Sent on this link before the peer saw our switch to it (it goes again after
            // the peer's answer).
            Order::Gap if !self.switch_acked => {
                self.counters.duplicates_dropped += 1;
                Verdict::Duplicate
            }
            Order::Gap => self.malformed(now, "message sequence gap"),
            Order::Next => {
                self.received = seq;
                Verdict::Accept(seq)
            }
        }
    }

    /// The hello that answers ours (connecting side): the peer's session id, and how far
    /// it delivered (those sends complete; the rest replays). An answer without an id, or
    /// with another id than before, means the peer does not know the session any more
    /// (it restarted, or ended the session): reset.
    fn on_hello(&mut self, now: Instant, h: &Header) -> Verdict {
        let done = self.link.as_ref().is_some_and(|l| l.hello_done);
        if self.incoming || done {
            return self.malformed(now, "unexpected session hello");
        }
        if h.aux == 0 || (self.peer_id != 0 && self.peer_id != h.aux) {
            self.fault(
                now,
                Error::fixed(
                    ErrorKind::Closed,
                    "the peer restarted (new session identity): session reset",
                ),
                true,
            );
            return Verdict::Fault;
        }
        if let Some(l) = self.link.as_mut() {
            l.hello_done = true;
        }
        self.peer_id = h.aux;
        self.on_ack(h.aux3);
        if let Some(p) = self.link.as_ref().map(|l| l.path) {
            self.path_up(p);
        }
        self.opened(now);
        Verdict::Consumed
    }

    fn malformed(&mut self, now: Instant, why: &'static str) -> Verdict {
        self.counters.malformed += 1;
        self.fault(now, Malformed(why).into(), false);
        Verdict::Fault
    }

    /// The session is (again) open on its link.
    pub(super) fn opened(&mut self, now: Instant) {
        self.schedule_paths(now);
        self.state = SessionState::Open;
        self.backoff = None;
        self.down_since = None;
        if !self.announced {
            self.announced = true;
            self.notify(super::Notice::Connected);
        }
    }
}

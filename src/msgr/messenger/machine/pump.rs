//! What goes out in a pass: messages within credits and send-queue room, then at most one
//! control frame (acknowledgement, credit announcement or keepalive), then the
//! silent-peer check.

use super::active::{find_link, insert_sorted};
use super::rules::{self, ControlIn};
use super::{Action, Machine, SqRoom};
use crate::error::{Error, ErrorKind};
use crate::msgr::messenger::types::SessionState;
use crate::msgr::messenger::wire::{Header, Kind, flags};
use std::time::Instant;

impl<M> Machine<M> {
    /// A pass's sending step on the current link, `room` being its free send-queue entries.
    /// Emits [`Action::Post`]/[`Action::PostImm`] in order; a post the link refuses is a
    /// fault the driver reports ([`Machine::on_link_error`]).
    pub fn pump(&mut self, now: Instant, room: SqRoom) {
        if self.state == SessionState::Closed {
            return;
        }
        self.maybe_failback();
        let Some(lid) = self.link.as_ref().filter(|l| l.hello_done).map(|l| l.lid) else {
            return;
        };
        self.pump_link(now, lid, room);
    }

    /// [`Machine::pump`] on link `lid`: the primary one, or (active/active) any joined one.
    /// The session-wide acknowledgement rules (held a pass, owed) run on the primary only;
    /// every link announces its own credits and sends its keepalives.
    pub(super) fn pump_link(&mut self, now: Instant, lid: u64, room: SqRoom) {
        let primary = self.link.as_ref().is_some_and(|l| l.lid == lid);
        let mut free = room.free;
        if !primary || self.send_switch(&mut free) {
            if self.active {
                self.send_giveup(lid, &mut free);
            }
            self.send_messages(lid, &mut free, room.reserve);
        }
        self.send_control(now, lid, free, primary);
        let msg_in_pass = std::mem::take(&mut self.msg_in_pass);
        let Some(l) = find_link(&mut self.link, &mut self.standby, lid) else {
            return;
        };
        let sent = l.sent_in_pass;
        if sent {
            // Stamped once per pass (a clock read per message showed in profiles); the
            // acknowledgement or keepalive just queued counts: a receiver that only
            // acknowledges must not look silent and ping every pass.
            l.live.last_sent = now;
        }
        if msg_in_pass {
            l.live.last_msg = now;
        }
        l.sent_in_pass = false;
        let dead = l
            .live
            .dead(now, self.rules.keepalive, self.rules.keepalive_timeout);
        if primary {
            if sent {
                self.ack_deferred = false;
            }
            self.delivered_in_pass = false;
        }
        if dead {
            let e = Error::new(
                ErrorKind::Timeout,
                format!(
                    "keepalive: nothing heard from the peer for {:?}",
                    self.rules.keepalive_timeout
                ),
            );
            match self.standby.iter().position(|l| l.lid == lid) {
                Some(i) => self.standby_fault(now, i, e),
                None => self.fault(now, e, false),
            }
        }
    }

    /// Messages, oldest first, while a data credit (one stays for control) and send-queue
    /// room (`reserve` entries stay for control) last on link `lid` (active/active: while
    /// it is the least loaded, [`Machine::least_loaded`]).
    fn send_messages(&mut self, lid: u64, free: &mut usize, reserve: usize) {
        let Some(path) = self.link_state(lid).map(|l| l.path) else {
            return;
        };
        while let Some(m) = self.waiting.front() {
            let (need, imm, shape) = (m.shape.sq_need, m.shape.imm, m.shape);
            if self.active && !self.least_loaded(lid) {
                // Another link takes the next one (its pump, this pass or the next).
                return;
            }
            let Some(l) = find_link(&mut self.link, &mut self.standby, lid) else {
                return;
            };
            if !l.credits.can_send_data() || free.saturating_sub(reserve) < need {
                if !self.stalled {
                    self.stalled = true;
                    self.counters.credit_stalls += 1;
                }
                return;
            }
            self.stalled = false;
            *free -= need;
            if self.active {
                l.out += 1;
            }
            let Some(mut m) = self.waiting.pop_front() else {
                return;
            };
            if let Some(value) = imm {
                // No header: nothing rides on it (`acked_to_peer` stays).
                l.credits.on_send(0);
                l.sent_in_pass = true;
                self.counters.imm_sent += 1;
                self.actions.push_back(Action::PostImm {
                    link: lid,
                    seq: m.seq,
                    value,
                });
            } else {
                let mut h = Header::new(Kind::Msg);
                h.seq = m.seq;
                h.ack = self.delivered;
                h.msg_type = shape.msg_type;
                h.nsegs = shape.nsegs;
                h.front_len = shape.front_len;
                if shape.rndv {
                    h.flags |= flags::RNDV;
                }
                if rules::starved(self.waiting.len(), l.credits.tx) {
                    h.flags |= flags::STARVED;
                }
                let owed = self.announce_on(lid, &mut h);
                self.acked_to_peer = self.delivered;
                self.actions.push_back(Action::Post {
                    link: lid,
                    header: h,
                    msg: Some(m.seq),
                    owed,
                });
            }
            if m.replay {
                self.counters.replays += 1;
            } else {
                self.counters.msgs_sent += 1;
                self.counters.bytes_sent += shape.bytes;
            }
            if let Some(p) = self.paths.get_mut(path) {
                p.counters.msgs_sent += 1;
                p.counters.bytes_sent += shape.bytes;
            }
            self.counters.remote_writes += u64::from(shape.writes);
            self.counters.remote_write_bytes += shape.write_bytes;
            m.replay = true;
            m.lid = lid;
            if self.active {
                // A replay goes before what the other links carry after it: the queue
                // stays in order for the cumulative acknowledgements.
                insert_sorted(&mut self.unacked, m);
            } else {
                self.unacked.push_back(m);
            }
            self.msg_in_pass = true;
        }
    }

    /// An acknowledgement, credit announcement or keepalive on link `lid`, when due. One
    /// due after messages were delivered since the last pump waits one pass: their
    /// callbacks run after it, and an answer sent from one (a reply) carries both. A pass
    /// that delivers nothing new sends them; so does this one when the peer is down to its
    /// control credit. (Announcing at once cost request/reply a control message each way
    /// per round trip, and each consumed a receive whose repost was owed again.) A link
    /// other than the primary (active/active) acknowledges only with what it sends anyway.
    fn send_control(&mut self, now: Instant, lid: u64, free: usize, primary: bool) {
        let Some(l) = find_link(&mut self.link, &mut self.standby, lid) else {
            return;
        };
        if l.sent_in_pass {
            // The ping check below sees this pass's messages.
            l.live.last_sent = now;
        }
        let ping_due = l.live.ping_due(now, self.rules.ping());
        let can_control = l.credits.can_send_control();
        let c = rules::control(ControlIn {
            ack_owed: primary && self.delivered > self.acked_to_peer,
            sent_in_pass: l.sent_in_pass,
            delivered_in_pass: primary && self.delivered_in_pass,
            ack_deferred: primary && self.ack_deferred,
            announce_due: l.credits.announce_due(),
            ping_due,
            peer_can_send_data: l.credits.peer_can_send_data(),
            can_send_control: can_control,
            sq_free: free,
        });
        let tx = l.credits.tx;
        if c.needs_receive {
            l.credits.room_to_speak();
        }
        // (With no entry free the rule sends no frame.)
        l.ping_blocked = ping_due && can_control && free == 0;
        if primary {
            self.ack_deferred = c.deferred;
        }
        let Some(kind) = c.frame else { return };
        let ping = kind == Kind::Ping;
        let mut h = Header::new(kind);
        h.ack = self.delivered;
        // Out of credits with messages waiting: say so here too (immediate messages carry
        // no header, so a side that sends only those grows the peer's window through its
        // acknowledgements).
        if self.stalled || (self.waiting.len() > 1 && tx <= 2) {
            h.flags |= flags::STARVED;
        }
        let owed = self.announce_on(lid, &mut h);
        self.acked_to_peer = self.delivered;
        if ping {
            self.counters.keepalives_sent += 1;
            if let Some(l) = find_link(&mut self.link, &mut self.standby, lid) {
                l.credits.shrink();
                l.live.last_ping = now;
            }
        }
        self.actions.push_back(Action::Post {
            link: lid,
            header: h,
            msg: None,
            owed,
        });
    }

    /// Puts the credits owed into header `h` (with grants, as many as its slot holds after
    /// the inline front) and takes a credit for sending it. Returns the credits owed
    /// before (the driver grants the oldest of those receives).
    pub(super) fn announce(&mut self, h: &mut Header) -> u32 {
        match self.link.as_ref().map(|l| l.lid) {
            Some(lid) => self.announce_on(lid, h),
            None => 0,
        }
    }

    /// [`Machine::announce`] on link `lid` (the active one or a standby path's).
    pub(super) fn announce_on(&mut self, lid: u64, h: &mut Header) -> u32 {
        let eager_write = self.rules.eager_write;
        let Some(l) = self.link_state_mut(lid) else {
            return 0;
        };
        let owed = l.credits.owed;
        h.credits = rules::announce(h, owed, eager_write);
        l.credits.on_send(h.credits);
        l.sent_in_pass = true;
        owed
    }
}

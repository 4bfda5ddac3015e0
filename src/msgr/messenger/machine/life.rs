//! Links up and down: the connecting side's attempts and hello, the accepting side's
//! answer, faults (replay or end), the peer's restart, reconnect backoff and the timers.

use super::{Action, HelloId, LinkState, Machine, Notice};
use crate::error::{Error, ErrorKind};
use crate::msgr::messenger::credits::Credits;
use crate::msgr::messenger::keepalive::Liveness;
use crate::msgr::messenger::types::{Policy, SessionState};
use crate::msgr::messenger::wire::{Header, Kind, flags};
use std::net::SocketAddr;
use std::time::Instant;

impl<M> Machine<M> {
    /// Time passed: the connecting side starts a due attempt ([`Action::Connect`]), the
    /// accepting side of a lossless session gives up on a peer that did not come back
    /// within twice the reconnect timeout.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state == SessionState::Closed {
            return;
        }
        if self.incoming {
            if self.link.is_none()
                && let Some(since) = self.down_since
                && now.saturating_duration_since(since) >= self.rules.reconnect_timeout * 2
            {
                let e = Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "the peer did not reconnect within {:?}",
                        self.rules.reconnect_timeout * 2
                    ),
                );
                self.end(e, true);
            }
            return;
        }
        if self.state == SessionState::Open {
            // Open on a path: the others rejoin on their own schedules.
            self.retry_paths(now);
            return;
        }
        if self.link.is_some() || self.session_attempt.is_some() {
            return;
        }
        if self.backoff.is_some_and(|b| b.next_at <= now)
            && let Some(p) = self.next_attempt_path()
        {
            self.session_attempt = Some(p);
            self.paths[p].connecting = true;
            self.actions.push_back(Action::Connect { path: p });
        }
    }

    /// Connecting side: the attempt made a connection whose on-connect hook posted
    /// receives (`credits`: [`super::Rules::credits`]). The hello goes on it: our id, the
    /// peer's as we know it, how far we delivered, and who we are across restarts.
    /// Returns the link's generation. The attempt was on `path`: the session-level attempt
    /// (no path up: the hello resumes the session on it) or a path rejoining an open
    /// session (a path-join hello: [`Machine::join_link`] at the peer).
    pub fn link_up(&mut self, now: Instant, path: usize, credits: Credits, id: HelloId) -> u64 {
        if let Some(p) = self.paths.get_mut(path) {
            p.connecting = false;
        }
        if self.session_attempt != Some(path) {
            return self.join_up(now, path, credits, id);
        }
        self.session_attempt = None;
        self.switch_due = false;
        self.switch_acked = true;
        self.failback_due = false;
        let lid = self.new_link(now, path, credits);
        let mut h = Header::new(Kind::Hello);
        // The path it came on (an older peer ignores a hello's ack).
        h.ack = path as u64;
        h.aux = id.claimed.unwrap_or(self.id);
        h.aux2 = self.peer_id;
        h.aux3 = self.delivered;
        h.seq = id.incarnation;
        h.msg_type = id.port;
        if self.policy == Policy::Lossy {
            h.flags |= flags::LOSSY;
        }
        if self.active {
            h.flags |= flags::ACTIVE;
        }
        let owed = self.announce(&mut h);
        if self.peer_id != 0 {
            self.counters.reconnects += 1;
        }
        self.acked_to_peer = self.delivered;
        self.actions.push_back(Action::Post {
            link: lid,
            header: h,
            msg: None,
            owed,
        });
        lid
    }

    /// Connecting side: the attempt failed (or its hello could not be posted): another
    /// after the backoff, or the end when the budget is spent (a lossy session does not
    /// retry).
    pub fn attempt_failed(&mut self, now: Instant, path: usize, e: Error) {
        if let Some(p) = self.paths.get_mut(path) {
            p.connecting = false;
        }
        if self.session_attempt != Some(path) {
            // A path's rejoin attempt.
            self.path_down(now, path, e, false);
            return;
        }
        self.session_attempt = None;
        self.next_try = path + 1;
        self.paths[path].counters.faults += 1;
        self.paths[path].last_fault = Some((e.clone(), now));
        let more =
            self.policy == Policy::Lossless && self.backoff.as_mut().is_some_and(|b| b.failed(now));
        if !more {
            let e = Error::new(e.kind(), format!("connecting gave up: {e}"));
            self.end(e, true);
        }
    }

    /// Accepting side: a link whose hello `h` names this session (or makes it). The
    /// peer's id, how far it delivered (those sends complete), then our hello: the session
    /// is open. `credits`: the pending link's, the hello's receive consumed. Returns the
    /// link's generation; a link the session had is closed first (the peer reconnected
    /// before this side noticed the old one died).
    /// A resuming hello means the connecting side has no path up: every other link of
    /// the session goes too.
    pub fn accept_link(&mut self, now: Instant, credits: Credits, h: &Header) -> u64 {
        if let Some(old) = self.link.as_ref().map(|l| l.lid) {
            self.counters.faults += 1;
            self.drop_link(old);
        }
        self.drop_standby_all();
        // The connecting side chooses the path policy; its hello says it.
        self.active = h.has(flags::ACTIVE);
        let path = self.path_index(h.ack);
        if self.announced {
            self.counters.reconnects += 1;
        }
        self.peer_id = h.aux;
        let lid = self.new_link(now, path, credits);
        if let Some(l) = self.link.as_mut() {
            l.hello_done = true;
        }
        self.path_up(path);
        self.on_ack(h.aux3);
        let mut r = Header::new(Kind::Hello);
        r.aux = self.id;
        r.aux2 = self.peer_id;
        r.aux3 = self.delivered;
        if self.policy == Policy::Lossy {
            r.flags |= flags::LOSSY;
        }
        let owed = self.announce(&mut r);
        self.acked_to_peer = self.delivered;
        self.actions.push_back(Action::Post {
            link: lid,
            header: r,
            msg: None,
            owed,
        });
        self.opened(now);
        lid
    }

    /// Accepting side: the connecting messenger at `addr` said hello with incarnation
    /// `inc`. Another incarnation than this session's peer means its process restarted
    /// (two live processes cannot listen on one address): what it had not acknowledged is
    /// lost, the session resets. Returns whether it did.
    pub fn on_peer_incarnation(&mut self, addr: SocketAddr, inc: u64) -> bool {
        match self.peer_entity {
            Some((a, mine)) if a == addr && mine != inc && self.state != SessionState::Closed => {
                let e = Error::new(
                    ErrorKind::Closed,
                    format!(
                        "the peer messenger at {addr} restarted (a new incarnation \
                         connected): session reset"
                    ),
                );
                self.end(e, true);
                true
            }
            _ => false,
        }
    }

    /// The link `lid` failed: an error completion (QP error, retry exceeded, flush), the
    /// side channel's end, a post refused, a malformed frame (`InvalidValue`, counted) or a
    /// message over this side's limits (`ResourceLimit`: it would only come again, so the
    /// session ends). A failure of a link the session no longer has is ignored.
    pub fn on_link_error(&mut self, now: Instant, lid: u64, e: Error) {
        if let Some(i) = self.standby.iter().position(|l| l.lid == lid) {
            return self.standby_fault(now, i, e);
        }
        if self.link.as_ref().is_none_or(|l| l.lid != lid) {
            return;
        }
        if e.kind() == ErrorKind::InvalidValue {
            self.counters.malformed += 1;
        }
        let end = e.kind() == ErrorKind::ResourceLimit;
        self.fault(now, e, end);
    }

    /// A fault on the current link: it closes. Another path up takes the traffic (the
    /// connecting side switches to the lowest-index one at once; the accepting side waits
    /// for its switch): a lossless session replays there what the peer has not
    /// acknowledged, a lossy one reports those sends in doubt and goes on. With no path
    /// up, a lossless session reconnects (the connecting side) or waits (the accepting
    /// side), a lossy one ends, as does any session when `end` (the peer closed or
    /// restarted, an oversized message).
    pub(super) fn fault(&mut self, now: Instant, e: Error, end: bool) {
        self.counters.faults += 1;
        if !end && self.fault_active(now, &e) {
            return;
        }
        let failed = self.link.as_ref().map(|l| (l.lid, l.path, l.hello_done));
        if let Some((lid, path, up)) = failed {
            self.drop_link(lid);
            self.path_down(now, path, e.clone(), up);
        }
        if end {
            self.end(e, true);
            return;
        }
        if self.state != SessionState::Reconnecting
            && self.state != SessionState::Connecting
            && let Some(i) = self.best_standby()
        {
            if self.policy == Policy::Lossy {
                self.fail_in_doubt(&e);
            }
            if self.incoming {
                // The connecting side decides where the traffic goes (its switch).
                self.state = SessionState::Reconnecting;
                self.down_since.get_or_insert(now);
            } else {
                self.switch_to(i);
            }
            return;
        }
        // No path up: the links still joining go too (a reconnect resumes on one path).
        self.drop_standby_all();
        if self.policy == Policy::Lossy {
            self.end(e, true);
            return;
        }
        self.state = SessionState::Reconnecting;
        if self.incoming {
            self.down_since.get_or_insert(now);
        } else if let Some(b) = self.backoff.as_mut() {
            // The link failed before the peer answered its hello (the session did not open
            // on it, or its hello could not be posted): a failed attempt, within the
            // budget, not a free one at once (an acceptor that takes connections and drops
            // them would be hammered for ever).
            if let Some((_, path, _)) = failed {
                self.next_try = path + 1;
            }
            if !b.failed(now) {
                let e = Error::new(e.kind(), format!("connecting gave up: {e}"));
                self.end(e, true);
            }
        } else {
            self.backoff = Some(self.rules.backoff(now));
            self.next_try = 0;
        }
    }

    /// Ends the session: every held send fails, then (if `reset`) `Reset`.
    pub(super) fn end(&mut self, e: Error, reset: bool) {
        if let Some(lid) = self.link.as_ref().map(|l| l.lid) {
            self.drop_link(lid);
        }
        self.drop_standby_all();
        self.session_attempt = None;
        self.giveup.clear();
        self.giveup_from = None;
        self.fail_all(&e);
        self.state = SessionState::Closed;
        if reset {
            self.notify(Notice::Reset(e));
        }
    }

    /// The link is gone: what it sent and was not acknowledged goes to the front of the
    /// queue (sent again on the next), what it was receiving is dropped (the peer sends it
    /// again).
    pub(super) fn drop_link(&mut self, lid: u64) {
        self.link = None;
        // Posts for it that the driver has not carried out yet are void (a post it refused
        // faulted the link in the middle of a batch): their messages are queued again.
        self.void_posts(lid);
        self.rewind();
        self.actions.push_back(Action::CloseLink {
            link: lid,
            drain: false,
        });
    }

    pub(super) fn void_posts(&mut self, lid: u64) {
        self.actions.retain(|a| {
            !matches!(a, Action::Post { link, .. } | Action::PostImm { link, .. } if *link == lid)
        });
    }

    /// The traffic leaves the active link: what it was receiving is dropped (the peer
    /// sends it again on the next), what it sent and was not acknowledged goes to the
    /// front of the queue.
    pub(super) fn rewind(&mut self) {
        self.received = self.delivered;
        self.ack_deferred = false;
        self.delivered_in_pass = false;
        if self.active {
            // Every link goes: what any carried is queued again, in order.
            self.rewind_active();
            return;
        }
        while let Some(mut m) = self.unacked.pop_back() {
            m.replay = true;
            self.waiting.push_front(m);
        }
    }

    pub(super) fn new_link(&mut self, now: Instant, path: usize, mut credits: Credits) -> u64 {
        credits.set_paused(self.recv_paused);
        let lid = self.alloc_lid();
        self.link = Some(LinkState::new(lid, path, now, credits));
        lid
    }

    pub(super) fn alloc_lid(&mut self) -> u64 {
        let lid = self.next_lid;
        self.next_lid += 1;
        lid
    }
}

impl LinkState {
    pub(super) fn new(lid: u64, path: usize, now: Instant, credits: Credits) -> LinkState {
        LinkState {
            lid,
            path,
            credits,
            live: Liveness::new(now),
            hello_done: false,
            sent_in_pass: false,
            ping_blocked: false,
            drain: false,
            out: 0,
        }
    }
}

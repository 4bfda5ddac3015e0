//! A session's paths (issue 30): several connections to the same peer, one of them active.
//!
//! The connecting side owns the paths: it connects each (the first hello resumes or makes
//! the session; the others are path-joins, [`flags::JOIN`]), keeps the idle ones alive
//! (keepalives only: a switch costs no handshake), retries a failed one with backoff
//! (`msgr_reconnect_min_ms` doubling to `_max_ms`, without a budget while the session
//! lives on another path), and decides where the traffic goes: the lowest-index path up.
//! When the active path fails it switches at once, and when a preferred path rejoins it
//! moves back (`msgr_path_failback`). A switch is a [`flags::SWITCH`] frame, the first
//! thing on the new active link, numbered (`aux`); the accepting side follows the newest
//! one: what it sends goes on the link the connecting side chose.
//!
//! Data is taken only from the active link; a message arriving on another (sent before
//! the switch) is dropped, and its sender sends it again: a switch rewinds both sides as
//! a reconnect does (the unacknowledged messages go again on the new link, exactly once
//! and in order thanks to the sequence numbers; a lossy session reports them in doubt
//! instead and accepts the gap they leave). The session becomes `Reconnecting`
//! (lossless) or ends (lossy) only when no path is up.
//!
//! With the active/active policy (`active.rs`) every joined link carries data instead, and
//! there is no switch, no failback and no rewind of the links that did not fail.

use super::{Action, LinkState, Machine, Notice, SqRoom, Verdict};
use crate::error::{Error, ErrorKind};
use crate::msgr::messenger::credits::Credits;
use crate::msgr::messenger::types::{PathCounters, PathEvent, PathState, Policy, SessionState};
use crate::msgr::messenger::wire::{Header, Kind, flags};
use std::time::{Duration, Instant};

use super::HelloId;

/// What the machine keeps of one path besides its link.
#[derive(Debug, Clone, Default)]
pub struct PathMeta {
    pub counters: PathCounters,
    /// The last fault: why, and when.
    pub last_fault: Option<(Error, Instant)>,
    pub removed: bool,
    /// Connecting side: an attempt on it is under way.
    pub(super) connecting: bool,
    /// Connecting side, the session open on another path: when to try it again, and the
    /// delay that led there (doubled at each failure).
    retry_at: Option<Instant>,
    delay: Duration,
}

/// The error a lossy send gets when the path it went on failed before the peer
/// acknowledged it: it may or may not have been delivered.
pub fn in_doubt(e: &Error) -> Error {
    Error::new(
        ErrorKind::Closed,
        format!("in doubt: the path it went on failed before the peer acknowledged it ({e})"),
    )
}

/// Whether a send's error is [`in_doubt`] (the session went on on another path).
pub fn is_in_doubt(e: &Error) -> bool {
    e.message().starts_with("in doubt:")
}

impl<M> Machine<M> {
    /// Connecting side: adds a path (its address is the driver's). It is connected at once
    /// if the session is open, else when it is its turn. Returns its index.
    pub fn add_path(&mut self, now: Instant) -> usize {
        self.paths.push(PathMeta {
            retry_at: Some(now),
            ..PathMeta::default()
        });
        self.paths.len() - 1
    }

    /// Removes path `i`: its link closes (the active one's traffic moves to another path
    /// as on a fault of it). The last path left cannot be removed.
    pub fn remove_path(&mut self, now: Instant, i: usize) -> crate::error::Result<()> {
        if self.paths.get(i).is_none_or(|p| p.removed) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("remove_path: the session has no path {i}"),
            ));
        }
        if self.live_paths() <= 1 {
            return Err(Error::fixed(
                ErrorKind::InvalidArgument,
                "remove_path: the last path of a session cannot be removed (close the session)",
            ));
        }
        self.paths[i].removed = true;
        self.paths[i].retry_at = None;
        let why = Error::fixed(ErrorKind::Closed, "the path was removed");
        if let Some(k) = self.standby.iter().position(|l| l.path == i) {
            self.standby_fault(now, k, why);
        } else if self.link.as_ref().is_some_and(|l| l.path == i) {
            self.fault(now, why, false);
            // Not a fault of the transport.
            self.counters.faults -= 1;
        }
        if self.next_try == i {
            self.next_try = i + 1;
        }
        Ok(())
    }

    /// Paths not removed.
    pub fn live_paths(&self) -> usize {
        self.paths.iter().filter(|p| !p.removed).count()
    }

    pub fn path_count(&self) -> usize {
        self.paths.len()
    }

    pub fn path(&self, i: usize) -> Option<&PathMeta> {
        self.paths.get(i)
    }

    /// The index of the active path (its link carries the traffic).
    pub fn active_path(&self) -> Option<usize> {
        self.link.as_ref().filter(|l| l.hello_done).map(|l| l.path)
    }

    /// What path `i` is doing now.
    pub fn path_state(&self, i: usize) -> PathState {
        if self
            .link
            .as_ref()
            .is_some_and(|l| l.path == i && l.hello_done)
        {
            return PathState::Active;
        }
        let link = self
            .link
            .iter()
            .chain(self.standby.iter())
            .find(|l| l.path == i);
        match link {
            // Active/active: every joined path carries data.
            Some(l) if l.hello_done && self.active => PathState::Active,
            Some(l) if l.hello_done => PathState::Standby,
            Some(_) => PathState::Connecting,
            None if self.paths.get(i).is_some_and(|p| p.connecting) => PathState::Connecting,
            None => PathState::Down,
        }
    }

    /// The standby links (joined paths, and paths joining).
    #[cfg(test)]
    pub fn standby_links(&self) -> impl Iterator<Item = &LinkState> {
        self.standby.iter()
    }

    /// Whether an attempt of path `path` that connects now would join the open session
    /// (not resume it).
    pub fn is_join_attempt(&self, path: usize) -> bool {
        self.session_attempt != Some(path)
    }

    /// A connection attempt on path `path` is under way.
    #[cfg(test)]
    pub fn attempting(&self, path: usize) -> bool {
        self.paths.get(path).is_some_and(|p| p.connecting)
    }

    /// Accepting side: a path-join hello `h` ([`flags::JOIN`]) names this session: the
    /// link becomes a standby path of it (one this path had goes). Answers with a
    /// path-join hello. `credits`: the pending link's, the hello's receive consumed.
    /// Returns the link's generation.
    pub fn join_link(&mut self, now: Instant, credits: Credits, h: &Header) -> u64 {
        let path = self.path_index(h.ack);
        let lid = self.alloc_lid();
        let mut credits = credits;
        credits.set_paused(self.recv_paused);
        let mut l = LinkState::new(lid, path, now, credits);
        l.hello_done = true;
        self.standby.push(l);
        // The link this path had is dead (the connecting side would not rejoin it else).
        let why = || Error::fixed(ErrorKind::Closed, "the path rejoined on a new connection");
        if let Some(k) = self
            .standby
            .iter()
            .position(|l| l.path == path && l.lid != lid)
        {
            self.standby_fault(now, k, why());
        }
        if self.link.as_ref().is_some_and(|l| l.path == path) {
            self.fault(now, why(), false);
        }
        // (`aux3` of a join is the driver's MAC, not an acknowledgement.)
        let mut r = Header::new(Kind::Hello);
        r.flags |= flags::JOIN;
        r.aux = self.id;
        r.aux2 = self.peer_id;
        r.ack = path as u64;
        self.post_join_hello(lid, r);
        self.path_up(path);
        self.path_event(path, PathEvent::Up);
        // Active/active, waiting with no link (the others failed while the peer kept
        // this one): no switch frame will come, the session goes on here at once (the
        // peer replays what it sent on the failed links; so does this side).
        if self.active && self.link.is_none() && self.state == SessionState::Reconnecting {
            if let Some(i) = self.standby.iter().position(|l| l.lid == lid) {
                self.promote(i);
                self.opened(now);
            }
        }
        lid
    }

    /// Connecting side: an attempt of path `path` connected while the session is open on
    /// another: the path-join hello goes on it. (One that connects after the session went
    /// down is closed: a reconnect resumes the session on one path first.)
    pub(super) fn join_up(
        &mut self,
        now: Instant,
        path: usize,
        credits: Credits,
        id: HelloId,
    ) -> u64 {
        let lid = self.alloc_lid();
        let open = self.state == SessionState::Open && self.peer_id != 0;
        if !open || self.paths.get(path).is_none_or(|p| p.removed) {
            self.actions.push_back(Action::CloseLink {
                link: lid,
                drain: false,
            });
            if open {
                return lid;
            }
            let e = Error::fixed(
                ErrorKind::Closed,
                "the session went down while it connected",
            );
            self.path_down(now, path, e, false);
            return lid;
        }
        let mut credits = credits;
        credits.set_paused(self.recv_paused);
        self.standby.push(LinkState::new(lid, path, now, credits));
        let mut h = Header::new(Kind::Hello);
        h.flags |= flags::JOIN;
        h.aux = self.id;
        h.aux2 = self.peer_id;
        // `aux3`: the driver's MAC (`auth::pathjoin`).
        h.ack = path as u64;
        h.seq = id.incarnation;
        h.msg_type = id.port;
        self.post_join_hello(lid, h);
        lid
    }

    /// A frame on standby link `i`: its credits and liveness; the join's answer
    /// (connecting side), the connecting side's switch to it (accepting side),
    /// acknowledgements. Data on it is dropped (sent before a switch: it comes again on
    /// the active link).
    pub(super) fn on_standby_frame(&mut self, now: Instant, i: usize, h: &Header) -> Verdict {
        let l = &mut self.standby[i];
        l.credits.on_receive();
        l.credits.on_grant(h.credits);
        l.live.last_heard = now;
        if h.has(flags::STARVED) {
            l.credits.grow();
        }
        let (path, joined) = (l.path, l.hello_done);
        let Some(kind) = h.kind() else {
            return self.standby_malformed(now, i, "unknown message kind");
        };
        if kind != Kind::Hello {
            self.on_ack(h.ack);
        }
        match kind {
            Kind::Hello => {
                if self.incoming || joined {
                    return self.standby_malformed(now, i, "unexpected path hello");
                }
                if !h.has(flags::JOIN) || h.aux == 0 || h.aux != self.peer_id {
                    let e = Error::fixed(
                        ErrorKind::Closed,
                        "the peer refused the path-join (it does not know the session)",
                    );
                    self.standby_fault(now, i, e);
                    return Verdict::Fault;
                }
                if self.active && !h.has(flags::ACTIVE) {
                    // It would take data only on the first path and drop the rest
                    // (never acknowledged, never sent again): this path stays out.
                    let e = Error::fixed(
                        ErrorKind::Unsupported,
                        "the peer does not support active/active paths (an older build): \
                         the session runs on its first path",
                    );
                    self.standby_fault(now, i, e);
                    return Verdict::Fault;
                }
                self.standby[i].hello_done = true;
                self.path_up(path);
                self.path_event(path, PathEvent::Up);
                if self.rules.path_failback
                    && !self.active
                    && self.active_path().is_some_and(|a| path < a)
                {
                    self.failback_due = true;
                }
                Verdict::Consumed
            }
            // Active/active: data on any joined link.
            Kind::Msg if self.active && joined => {
                let lid = self.standby[i].lid;
                match self.on_msg_active(lid, h.seq) {
                    Ok(v) => v,
                    Err(m) => self.standby_malformed(now, i, m.0),
                }
            }
            Kind::Msg => {
                self.counters.duplicates_dropped += 1;
                Verdict::Stale
            }
            Kind::Ack if h.has(flags::GIVEUP) => match self.on_giveup(h) {
                Ok(()) => Verdict::Consumed,
                Err(m) => self.standby_malformed(now, i, m.0),
            },
            Kind::Ack if h.has(flags::SWITCH) && self.incoming => {
                self.follow_switch(now, i, h.aux, h.aux2);
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

    /// An immediate message on standby link `i`: sent before a switch, dropped (a lossy
    /// session's sender reported it in doubt).
    pub(super) fn on_standby_imm(&mut self, now: Instant, i: usize) -> Verdict {
        let l = &mut self.standby[i];
        l.credits.on_receive();
        l.live.last_heard = now;
        self.counters.duplicates_dropped += 1;
        Verdict::Stale
    }

    fn standby_malformed(&mut self, now: Instant, i: usize, why: &'static str) -> Verdict {
        // Counted by `standby_fault` (an `InvalidValue`).
        let e = crate::msgr::messenger::wire::Malformed(why).into();
        self.standby_fault(now, i, e);
        Verdict::Fault
    }

    /// Standby link `i` failed: it closes, its path is down (and retried, connecting
    /// side). An accepting side left with no path up ends a lossy session.
    pub(super) fn standby_fault(&mut self, now: Instant, i: usize, e: Error) {
        let l = self.standby.remove(i);
        self.counters.faults += 1;
        if e.kind() == ErrorKind::InvalidValue {
            self.counters.malformed += 1;
        }
        self.void_posts(l.lid);
        if self.active {
            // What it carried goes on the others (or is given up).
            self.lose_link(l.lid, &e);
        }
        self.actions.push_back(Action::CloseLink {
            link: l.lid,
            drain: false,
        });
        let end = e.kind() == ErrorKind::ResourceLimit;
        self.path_down(now, l.path, e.clone(), l.hello_done);
        if end {
            self.end(e, true);
            return;
        }
        if self.incoming
            && self.link.is_none()
            && self.state != SessionState::Closed
            && self.best_standby().is_none()
            && self.policy == Policy::Lossy
        {
            self.end(e, true);
        }
    }

    /// Path `path` is down: counted, told (if it was up), and (connecting side, not
    /// removed) retried after the backoff.
    pub(super) fn path_down(&mut self, now: Instant, path: usize, e: Error, was_up: bool) {
        let (min, max) = (self.rules.reconnect_min, self.rules.reconnect_max);
        let incoming = self.incoming;
        let Some(p) = self.paths.get_mut(path) else {
            return;
        };
        p.counters.faults += 1;
        p.last_fault = Some((e.clone(), now));
        if !incoming && !p.removed {
            p.delay = if p.delay.is_zero() {
                min
            } else {
                (p.delay * 2).min(max)
            };
            p.retry_at = Some(now + p.delay);
        }
        if was_up {
            self.path_event(path, PathEvent::Down(e));
        }
    }

    /// Tells the application about path `path` (a session with one path has no path
    /// events: its faults are the session's, as before paths existed).
    pub(super) fn path_event(&mut self, path: usize, ev: PathEvent) {
        if self.paths.len() > 1 {
            self.notify(Notice::Path(path, ev));
        }
    }

    /// Path `path` answered: its backoff starts again from the minimum.
    pub(super) fn path_up(&mut self, path: usize) {
        if let Some(p) = self.paths.get_mut(path) {
            p.delay = Duration::ZERO;
            p.retry_at = None;
        }
    }

    /// Connecting side, open: an attempt on each path that is down, not removed, and due.
    pub(super) fn retry_paths(&mut self, now: Instant) {
        for i in 0..self.paths.len() {
            let has_link = self
                .link
                .iter()
                .chain(self.standby.iter())
                .any(|l| l.path == i);
            let p = &mut self.paths[i];
            if p.removed || p.connecting || has_link {
                continue;
            }
            if p.retry_at.is_some_and(|t| t <= now) {
                p.connecting = true;
                p.retry_at = None;
                self.actions.push_back(Action::Connect { path: i });
            }
        }
    }

    /// When [`Machine::handle_timeout`] has a path to retry, or a standby link's
    /// keepalive or silent-peer timeout is due.
    pub(super) fn paths_timeout(&self) -> Option<Instant> {
        let r = &self.rules;
        // As the active link's: a keepalive waits for a credit to go with (a frame brings
        // it) or a send-queue entry (a completion does); until then only the silent-peer
        // timeout is timed.
        let keep = self
            .standby
            .iter()
            .filter(|l| l.hello_done)
            .filter_map(|l| match l.credits.can_send_control() && !l.ping_blocked {
                true => l.live.next_due(r.ping(), r.keepalive_timeout),
                false => {
                    r.keepalive?;
                    l.live.last_heard.checked_add(r.keepalive_timeout)
                }
            });
        let retry = (!self.incoming && self.state == SessionState::Open)
            .then(|| {
                self.paths
                    .iter()
                    .enumerate()
                    .filter(|(i, p)| {
                        !p.removed
                            && !p.connecting
                            && !self
                                .link
                                .iter()
                                .chain(self.standby.iter())
                                .any(|l| l.path == *i)
                    })
                    .filter_map(|(_, p)| p.retry_at)
                    .min()
            })
            .flatten();
        keep.chain(retry).min()
    }

    /// Whether a standby link has a receive to post.
    pub(super) fn standby_wants_pass(&self) -> bool {
        self.standby
            .iter()
            .filter(|l| l.hello_done)
            .any(|l| l.credits.deficit() > 0)
    }

    /// The standby link to switch to: the lowest-index path joined.
    pub(super) fn best_standby(&self) -> Option<usize> {
        self.standby
            .iter()
            .enumerate()
            .filter(|(_, l)| l.hello_done)
            .min_by_key(|(_, l)| l.path)
            .map(|(i, _)| i)
    }

    /// Connecting side: the traffic moves to standby link `i`. The active link (if any:
    /// a failback) stays as a standby one; both sides rewind (a lossy session reports
    /// what the old link carried unacknowledged in doubt); the SWITCH frame goes first.
    pub(super) fn switch_to(&mut self, i: usize) {
        let l = self.standby.remove(i);
        if let Some(old) = self.link.take() {
            // Called from a pump's start (no post of this pass is queued for it yet, so
            // its credits stay right).
            self.rewind();
            self.demote(old);
            if self.policy == Policy::Lossy {
                let e = Error::fixed(ErrorKind::Closed, "failback to a preferred path");
                self.fail_in_doubt(&e);
            }
        }
        let (lid, path) = (l.lid, l.path);
        self.link = Some(l);
        self.switch_epoch += 1;
        self.switch_due = true;
        self.switch_acked = false;
        self.failback_due = false;
        self.activated(lid, path);
    }

    /// Posts a path-join hello (or its answer) `h` on link `lid`: the policy flag, and the
    /// credits that link owes.
    fn post_join_hello(&mut self, lid: u64, mut h: Header) {
        if self.policy == Policy::Lossy {
            h.flags |= flags::LOSSY;
        }
        if self.active {
            // The answer says it too: a peer built before active/active does not, and
            // would drop the data sent on the path.
            h.flags |= flags::ACTIVE;
        }
        let owed = self.announce_on(lid, &mut h);
        self.actions.push_back(Action::Post {
            link: lid,
            header: h,
            msg: None,
            owed,
        });
    }

    /// Accepting side: the connecting side's switch number `epoch` arrived on standby link
    /// `i`: the traffic goes there (unless a newer switch was followed already).
    fn follow_switch(&mut self, now: Instant, i: usize, epoch: u64, before: u64) {
        if epoch <= self.switch_epoch {
            return;
        }
        self.switch_epoch = epoch;
        let l = self.standby.remove(i);
        if let Some(old) = self.link.take() {
            self.rewind();
            self.demote(old);
        }
        self.resend_after_switch();
        let (lid, path) = (l.lid, l.path);
        self.link = Some(l);
        self.skip_in_doubt(before);
        self.activated(lid, path);
        self.opened(now);
    }

    /// The active link `old` becomes a standby one (the traffic moved): its window falls
    /// to the minimum at once, so the receives it grew to are not posted again as the
    /// peer's frames consume them and their chunks go back to the pool (the peer spends
    /// its surplus of credits there: [`Machine::pump_standby`]).
    fn demote(&mut self, mut old: LinkState) {
        old.credits.shrink();
        old.drain = true;
        self.standby.push(old);
    }

    /// A lossy session's receiver, at the peer's switch frame (`before`: every message the
    /// peer sends after it on this link is numbered above): what did not arrive up to
    /// there is lost (the peer reported it in doubt), so the next message, an immediate one
    /// too (it carries no number), is `before + 1` or later.
    fn skip_in_doubt(&mut self, before: u64) {
        if self.policy == Policy::Lossy && before > self.received {
            self.received = before;
        }
    }

    /// Accepting side: after following a switch, what it sent and the peer has not
    /// acknowledged goes again (the peer dropped what came on another link), after its
    /// answer; a lossy session reports it in doubt instead.
    fn resend_after_switch(&mut self) {
        while let Some(mut m) = self.unacked.pop_back() {
            m.replay = true;
            self.waiting.push_front(m);
        }
        if self.policy == Policy::Lossy {
            let e = Error::fixed(ErrorKind::Closed, "the peer switched paths");
            self.fail_in_doubt(&e);
        }
        self.switch_due = true;
    }

    /// The session (re)opened: the paths without a link are tried now (connecting side).
    pub(super) fn schedule_paths(&mut self, now: Instant) {
        if self.incoming {
            return;
        }
        for i in 0..self.paths.len() {
            let has_link = self
                .link
                .iter()
                .chain(self.standby.iter())
                .any(|l| l.path == i);
            let p = &mut self.paths[i];
            if !p.removed && !p.connecting && !has_link {
                p.retry_at.get_or_insert(now);
            }
        }
    }

    /// The SWITCH frame on the active link, before its messages: false while it cannot go
    /// (no control credit or send-queue room: it asks for a receive to announce).
    pub(super) fn send_switch(&mut self, free: &mut usize) -> bool {
        if !self.switch_due {
            return true;
        }
        let Some(l) = self.link.as_mut() else {
            return false;
        };
        if !l.credits.can_send_control() {
            l.credits.room_to_speak();
            return false;
        }
        if *free == 0 {
            return false;
        }
        *free -= 1;
        let lid = l.lid;
        let mut h = Header::new(Kind::Ack);
        h.flags |= flags::SWITCH;
        h.ack = self.delivered;
        h.aux = self.switch_epoch;
        // Every message after this frame on the link is numbered above `aux2`: the first
        // one waiting (unsent, or to replay) comes next.
        h.aux2 = self
            .waiting
            .front()
            .map_or(self.next_seq - 1, |m| m.seq - 1);
        let owed = self.announce(&mut h);
        self.acked_to_peer = self.delivered;
        self.actions.push_back(Action::Post {
            link: lid,
            header: h,
            msg: None,
            owed,
        });
        self.switch_due = false;
        true
    }

    /// A switch's bookkeeping: the driver is told, the path counted, the application told.
    fn activated(&mut self, lid: u64, path: usize) {
        self.actions.push_back(Action::Activate { link: lid });
        if let Some(p) = self.paths.get_mut(path) {
            p.counters.switches += 1;
        }
        self.path_event(path, PathEvent::Active);
    }

    /// A SWITCH on the active link. Accepting side: a newer switch to the link it sends on
    /// already (the peer left it and came back): it sends again what the peer dropped
    /// meanwhile, after its answer. Connecting side: the answer to its last switch.
    pub(super) fn note_switch(&mut self, epoch: u64, before: u64) {
        if self.incoming {
            if epoch > self.switch_epoch {
                self.switch_epoch = epoch;
                self.resend_after_switch();
                self.skip_in_doubt(before);
            }
        } else if epoch == self.switch_epoch {
            self.switch_acked = true;
            self.skip_in_doubt(before);
        }
    }

    /// Connecting side, at a pump's start: the failback a rejoined preferred path asked
    /// for (a lossy session waits until nothing is unacknowledged: nothing in doubt).
    pub(super) fn maybe_failback(&mut self) {
        if !self.failback_due || self.incoming || self.active {
            return;
        }
        if self.policy == Policy::Lossy && !self.unacked.is_empty() {
            return;
        }
        let Some(active) = self.active_path() else {
            self.failback_due = false;
            return;
        };
        match self.best_standby() {
            Some(i) if self.standby[i].path < active => self.switch_to(i),
            _ => self.failback_due = false,
        }
    }

    /// A lossy session's sends that went on a link that failed (or that the traffic
    /// left) and were not acknowledged: each completes with [`in_doubt`]; the session
    /// goes on.
    pub(super) fn fail_in_doubt(&mut self, why: &Error) {
        let e = in_doubt(why);
        let mut failed = Vec::new();
        self.waiting.retain(|m| {
            if m.replay {
                failed.push((m.seq, m.shape.bytes));
                false
            } else {
                true
            }
        });
        for (seq, bytes) in failed {
            self.held_bytes -= bytes;
            self.notify(Notice::SendDone(seq, Err(e.clone())));
        }
        if self.refused && self.has_room(0) {
            self.refused = false;
            self.notify(Notice::Ready);
        }
    }

    /// Control on standby link `lid` in a pass: the keepalive when due, announcing the
    /// credits owed (`room`: its send-queue entries), then the silent-peer check. On an
    /// active/active session a joined link is pumped as the primary one is ([`Machine::pump`]:
    /// messages, acknowledgements, credits).
    pub fn pump_standby(&mut self, now: Instant, lid: u64, room: SqRoom) {
        if self.state == SessionState::Closed {
            return;
        }
        let Some(i) = self
            .standby
            .iter()
            .position(|l| l.lid == lid && l.hello_done)
        else {
            return;
        };
        if self.active && self.state == SessionState::Open {
            return self.pump_link(now, lid, room);
        }
        let mut free = room.free;
        let (ping, keepalive, timeout) = (
            self.rules.ping(),
            self.rules.keepalive,
            self.rules.keepalive_timeout,
        );
        let l = &mut self.standby[i];
        l.ping_blocked = false;
        // Credits are announced with the keepalive only: an announcement of its own would
        // consume a receive the peer then announces back, for ever on an idle link with a
        // small window (2-3 receives); nothing else uses a standby link.
        if l.live.ping_due(now, ping) {
            if !l.credits.can_send_control() {
                l.credits.room_to_speak();
            } else if free > 0 {
                let mut h = Header::new(Kind::Ping);
                h.ack = self.delivered;
                let owed = self.announce_on(lid, &mut h);
                let l = &mut self.standby[i];
                l.live.pinged(now);
                l.sent_in_pass = false;
                l.credits.shrink();
                self.counters.keepalives_sent += 1;
                self.actions.push_back(Action::Post {
                    link: lid,
                    header: h,
                    msg: None,
                    owed,
                });
                free -= 1;
            } else {
                l.ping_blocked = true;
            }
        }
        self.drain_standby(i, free.saturating_sub(room.reserve));
        if self.standby[i].live.dead(now, keepalive, timeout) {
            let e = Error::new(
                ErrorKind::Timeout,
                format!("keepalive: nothing heard on the path for {timeout:?}"),
            );
            self.standby_fault(now, i, e);
        }
    }

    /// Standby link `i` (`free` send-queue entries beyond the control reserve) that was
    /// the active one: the credits beyond what a standby link holds (the minimum window)
    /// are spent on empty acknowledgements, once. A link that was active keeps the receives the peer's window
    /// grew to there; the peer, whose window on it fell to the minimum
    /// ([`Machine::demote`]), does not post them again as these consume them, so their
    /// chunks go back to its pool. Without it a peer whose pool they held could not post
    /// receives on the new active link, and with keepalives off nothing ever consumed them
    /// (seed 741,131: the connector starved for good, the two sides passing one-credit
    /// announcements back and forth). They announce nothing (an announcement would be
    /// answered), and a link that never carried the traffic is left alone: a peer whose
    /// minimum window is larger would post its receives again and announce them at its
    /// next keepalive.
    fn drain_standby(&mut self, i: usize, free: usize) {
        let keep = self.rules.recv_window_min.max(2);
        let delivered = self.delivered;
        let l = &mut self.standby[i];
        if !l.drain {
            return;
        }
        let n = (l.credits.tx.saturating_sub(keep) as usize).min(free);
        for _ in 0..n {
            l.credits.on_send(0);
            let mut h = Header::new(Kind::Ack);
            h.ack = delivered;
            self.actions.push_back(Action::Post {
                link: l.lid,
                header: h,
                msg: None,
                owed: 0,
            });
        }
        l.drain = l.credits.tx > keep;
    }

    /// Every standby link closes (the session ends, or resumes on one path).
    pub(super) fn drop_standby_all(&mut self) {
        for l in std::mem::take(&mut self.standby) {
            self.void_posts(l.lid);
            self.actions.push_back(Action::CloseLink {
                link: l.lid,
                drain: false,
            });
        }
    }

    /// The path a peer's hello names (`ack`), made known here if new (accepting side).
    pub(super) fn path_index(&mut self, named: u64) -> usize {
        // A peer cannot make this side keep an unbounded list.
        let i = (named as usize).min(MAX_PATHS - 1);
        while self.paths.len() <= i {
            self.paths.push(PathMeta::default());
        }
        i
    }

    /// Connecting side without a path up: the path of the next session-level attempt (in
    /// turn from `next_try`, skipping removed ones and those with an attempt under way).
    pub(super) fn next_attempt_path(&mut self) -> Option<usize> {
        let n = self.paths.len();
        (0..n)
            .map(|k| (self.next_try + k) % n)
            .find(|&i| !self.paths[i].removed && !self.paths[i].connecting)
    }
}

/// The most paths a session has (an accepting side keeps at most this many).
pub const MAX_PATHS: usize = 16;

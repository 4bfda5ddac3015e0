//! The session machine: every rule about what a messenger session does next, in one
//! struct fed `(now, event)` and emitting [`Action`]s. No sockets, threads, locks or OS
//! clock: time is passed in, frames and callbacks come out. Modelled on quinn-proto's
//! `Connection` and on this crate's RC engine; `docs/messenger-machine.md` describes the
//! events, actions, states and the simulator that drives two of them through faulty links
//! (`sim/`, tests only).
//!
//! What it decides: sequence numbers, cumulative acknowledgements and which sends they
//! complete; replay of unacknowledged messages on the next link (lossless) or their
//! failure (lossy); duplicate and out-of-order frames; the send-queue bound (`Full`, then
//! `Ready`); credits (what may be sent, what to announce, the window) and when an ack or
//! a credit announcement goes or waits a pass; keepalive and the silent-peer timeout;
//! the hello exchange, a peer's restart (new session id or new incarnation), reconnect
//! backoff and the accepting side's wait; close. What it does not: buffers, memory
//! registration, posting, READs of rendezvous data, the wire bytes beyond the header
//! (the driver: `link.rs`, `shard.rs`).
//!
//! One job per file: `action` (what comes out), `send` (application sends, acks,
//! completion of sends, close), `recv` (frames in, delivery order), `pump` (what goes
//! out in a pass), `life` (links up and down, faults, reconnect, timers), `rules` (the
//! decisions as pure functions). The running messenger drives it: `session.rs` feeds it
//! what a link reports and carries out its actions, `shard.rs` runs the passes.

mod action;
mod active;
#[cfg(test)]
mod active_tests;
mod life;
mod paths;
#[cfg(test)]
mod paths_tests;
mod pump;
mod recv;
mod rules;
mod send;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub use action::{Action, HelloId, Notice, SqRoom, Verdict};
pub use active::imm_refused;
pub use paths::{MAX_PATHS, PathMeta, is_in_doubt};
pub use send::{check_send, has_room};

use super::credits::Credits;
use super::keepalive::{Backoff, Liveness, PingRule};
use super::settings::MsgrSettings;
use super::types::{Policy, SessionCounters, SessionState};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The settings the rules read (from `msgr_*`: see [`MsgrSettings`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    pub keepalive: Option<Duration>,
    /// A keepalive also goes this long after a message the peer has not answered with
    /// anything (see [`PingRule`]): the transport's retry budget, so that a link dead in
    /// both directions is found in about twice that, not `keepalive` later.
    pub probe: Option<Duration>,
    pub keepalive_timeout: Duration,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    pub reconnect_timeout: Duration,
    pub reconnect_attempts: u32,
    pub send_queue_msgs: usize,
    pub send_queue_bytes: u64,
    pub recv_window_min: u32,
    pub recv_window: u32,
    /// Our receives are granted to the peer (`msgr_eager_write`): announcements carry
    /// grants, as many as the header slot holds.
    pub eager_write: bool,
    /// A preferred (lower-index) path that rejoins takes the traffic back
    /// (`msgr_path_failback`).
    pub path_failback: bool,
}

impl Rules {
    /// When keepalives go.
    pub fn ping(&self) -> PingRule {
        PingRule {
            interval: self.keepalive,
            probe: self.probe,
        }
    }

    pub fn from_settings(s: &MsgrSettings) -> Rules {
        Rules {
            keepalive: s.keepalive,
            probe: s.probe,
            keepalive_timeout: s.keepalive_timeout,
            reconnect_min: s.reconnect_min,
            reconnect_max: s.reconnect_max,
            reconnect_timeout: s.reconnect_timeout,
            reconnect_attempts: s.reconnect_attempts,
            send_queue_msgs: s.send_queue_msgs,
            send_queue_bytes: s.send_queue_bytes,
            recv_window_min: s.recv_window_min,
            recv_window: s.recv_window,
            eager_write: s.eager_write,
            path_failback: s.path_failback,
        }
    }

    /// The credits of a new link whose receives (`posted`) the on-connect hook posted.
    pub fn credits(&self, posted: u32) -> Credits {
        Credits::new(posted, self.recv_window_min, self.recv_window)
    }

    fn backoff(&self, now: Instant) -> Backoff {
        Backoff::new(
            now,
            self.reconnect_min,
            self.reconnect_max,
            self.reconnect_timeout,
            self.reconnect_attempts,
        )
    }
}

/// What the rules need to know of a message (its body is the driver's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shape {
    pub msg_type: u16,
    pub front_len: u32,
    pub nsegs: u16,
    /// Sent as a descriptor block (the peer READs the data).
    pub rndv: bool,
    /// An immediate message: the value its last WRITE carries (no header).
    pub imm: Option<u32>,
    /// Front + data + write bytes (the send-queue bound counts them).
    pub bytes: u64,
    /// Send-queue entries the message takes.
    pub sq_need: usize,
    /// RDMA WRITEs before the message and their bytes (lossy sessions only).
    pub writes: u32,
    pub write_bytes: u64,
}

/// A message held by the session: waiting for credits, or sent and not acknowledged.
#[derive(Debug)]
pub struct Out<M> {
    pub seq: u64,
    pub shape: Shape,
    /// Sent before on an earlier link.
    pub replay: bool,
    /// The link it went on (0: not sent since it was queued or requeued). Active/active
    /// replays only what went on a link that failed.
    pub lid: u64,
    pub body: M,
}

/// The protocol state of one link of the session: the active one, or a standby path's
/// (receives are per QP, so credits and liveness are per link).
#[derive(Debug, Clone)]
pub struct LinkState {
    pub lid: u64,
    /// The path it is a connection of.
    pub path: usize,
    pub credits: Credits,
    pub live: Liveness,
    /// The peer's hello arrived (messages may flow).
    pub hello_done: bool,
    /// Something was posted since the last pump (an explicit ack would be redundant).
    sent_in_pass: bool,
    /// A keepalive was due at the last pump and the send queue had no entry for it (a
    /// black-holed link's queue fills and nothing completes until its retries run out).
    /// Its timer then waits for the completion that frees an entry, an event that brings
    /// a pump, instead of coming due again at once: only the silent-peer deadline is timed.
    ping_blocked: bool,
    /// It was the active link: the credits its peer's window grew to there go back
    /// (`Machine::drain_standby`), then this is cleared.
    drain: bool,
    /// Active/active: messages sent on it and not acknowledged (least outstanding).
    pub out: u32,
}

/// One session's protocol state.
#[derive(Debug)]
pub struct Machine<M> {
    rules: Rules,
    pub id: u64,
    pub peer_id: u64,
    pub policy: Policy,
    /// The accepting side (its peer reconnects to it).
    pub incoming: bool,
    pub state: SessionState,
    next_seq: u64,
    waiting: VecDeque<Out<M>>,
    unacked: VecDeque<Out<M>>,
    /// Bytes of `waiting` and `unacked`.
    held_bytes: u64,
    /// A send was refused with `Full`: `Ready` follows when there is room.
    refused: bool,
    /// The last sequence number delivered to the application, and the last accepted
    /// for delivery (its data may still be read).
    delivered: u64,
    received: u64,
    /// The last sequence number the peer was told of.
    acked_to_peer: u64,
    /// Messages were delivered since the last pump (their acknowledgement may wait a pass).
    delivered_in_pass: bool,
    /// The acknowledgement of messages delivered in the last pass was held back a pass.
    ack_deferred: bool,
    /// A message went in this pump (`Liveness::last_msg`, stamped once per pump).
    msg_in_pass: bool,
    /// Messages wait for credits (counted once per stall).
    stalled: bool,
    /// `Connected` was told.
    announced: bool,
    /// Connecting side: the reconnect budget and schedule (no path up).
    backoff: Option<Backoff>,
    /// Accepting side of a lossless session without a link: since when.
    down_since: Option<Instant>,
    /// Accepting side: the connecting messenger's address and incarnation.
    pub peer_entity: Option<(SocketAddr, u64)>,
    /// The active link: the session's traffic goes on it.
    link: Option<LinkState>,
    /// The links of the other paths (joined, or joining: `hello_done` false).
    standby: Vec<LinkState>,
    /// The session's paths (index = preference).
    paths: Vec<PathMeta>,
    /// Connecting side without a path up: the path of the session-level attempt under way,
    /// and where the next one goes.
    session_attempt: Option<usize>,
    next_try: usize,
    /// Connecting side: switches made (each [`wire::flags::SWITCH`] frame carries its
    /// number); accepting side: the last one followed (an older one, overtaken on another
    /// link, is ignored).
    switch_epoch: u64,
    /// A SWITCH frame is due on the active link (before any message on it): the
    /// connecting side's switch, or the accepting side's answer to one.
    switch_due: bool,
    /// Connecting side: the accepting side answered the last switch. Until then a message
    /// beyond the next one is dropped, not a fault: the peer sent it on this link before
    /// it saw the switch (it follows, and sends it again after its answer).
    switch_acked: bool,
    /// A preferred path rejoined: the next pump moves the traffic back to it (a lossy
    /// session waits until nothing is unacknowledged, so that a failback puts nothing in
    /// doubt).
    failback_due: bool,
    next_lid: u64,
    /// The application paused the peer's data (`Messenger::pause_receive`): every link's
    /// credits keep a window of one receive (`Credits::set_paused`).
    recv_paused: bool,
    /// Path policy active/active (`PathPolicy::Active`): every joined link carries data,
    /// each message on the one with the fewest unacknowledged messages (`active.rs`).
    active: bool,
    /// Active/active receiver: messages accepted and not delivered (those ahead of a gap
    /// among them), with the link each came on. `received` is then the highest number
    /// below which nothing is missing.
    got: BTreeMap<u64, u64>,
    /// Active/active lossy receiver: numbers above `delivered` the peer gave up.
    skipped: BTreeSet<u64>,
    /// Active/active lossy sender: numbers given up (reported in doubt) that the peer may
    /// not know of yet (pruned by its acknowledgements), and the first one the next
    /// [`wire::flags::GIVEUP`] frame names (None: none due).
    giveup: BTreeSet<u64>,
    giveup_from: Option<u64>,
    actions: VecDeque<Action>,
    pub counters: SessionCounters,
}

impl<M> Machine<M> {
    /// A connecting session (it asks for its first connection at once) or an accepting
    /// one (made when a peer's first hello arrives: [`Machine::accept_link`] follows).
    pub fn new(rules: Rules, id: u64, policy: Policy, incoming: bool, now: Instant) -> Self {
        Machine {
            rules,
            id,
            peer_id: 0,
            policy,
            incoming,
            state: SessionState::Connecting,
            next_seq: 1,
            waiting: VecDeque::new(),
            unacked: VecDeque::new(),
            held_bytes: 0,
            refused: false,
            delivered: 0,
            received: 0,
            acked_to_peer: 0,
            delivered_in_pass: false,
            ack_deferred: false,
            msg_in_pass: false,
            stalled: false,
            announced: false,
            backoff: (!incoming).then(|| rules.backoff(now)),
            down_since: None,
            peer_entity: None,
            link: None,
            standby: Vec::new(),
            paths: vec![PathMeta::default()],
            session_attempt: None,
            next_try: 0,
            switch_epoch: 0,
            switch_due: false,
            switch_acked: true,
            failback_due: false,
            next_lid: 1,
            recv_paused: false,
            active: false,
            got: BTreeMap::new(),
            skipped: BTreeSet::new(),
            giveup: BTreeSet::new(),
            giveup_from: None,
            actions: VecDeque::new(),
            counters: SessionCounters::default(),
        }
    }

    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The next action for the driver.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    #[cfg(test)]
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// The current link's protocol state.
    pub fn link(&self) -> Option<&LinkState> {
        self.link.as_ref()
    }

    /// The generation of the current link.
    #[cfg(test)]
    pub fn link_id(&self) -> Option<u64> {
        self.link.as_ref().map(|l| l.lid)
    }

    #[cfg(test)]
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Messages accepted and not yet delivered (their data is being received).
    #[cfg(test)]
    pub fn receiving(&self) -> u64 {
        self.received - self.delivered
    }

    pub fn queued(&self) -> usize {
        self.waiting.len()
    }

    pub fn unacked_len(&self) -> usize {
        self.unacked.len()
    }

    pub fn held_msgs(&self) -> usize {
        self.waiting.len() + self.unacked.len()
    }

    /// The bytes of the messages held (the send-queue bound counts them; the driver's
    /// submit gate is told them).
    pub fn held_bytes(&self) -> u64 {
        self.held_bytes
    }

    /// The body of a sent, unacknowledged message (what [`Action::Post`] names).
    pub fn unacked(&self, seq: u64) -> Option<&Out<M>> {
        self.unacked.iter().rev().find(|m| m.seq == seq)
    }

    /// [`Machine::unacked`], to change the driver's own part of its body (the rkeys a
    /// rendezvous message is exposed through to the current link's peer).
    pub fn unacked_mut(&mut self, seq: u64) -> Option<&mut Out<M>> {
        self.unacked.iter_mut().rev().find(|m| m.seq == seq)
    }

    /// The bodies of every message held (waiting and unacknowledged), for the driver's
    /// own state in them (windows bound for a link that ended).
    pub fn bodies_mut(&mut self) -> impl Iterator<Item = &mut M> {
        self.waiting
            .iter_mut()
            .chain(self.unacked.iter_mut())
            .map(|o| &mut o.body)
    }

    /// The earliest time [`Machine::handle_timeout`] or a pump has something to do that
    /// no other event brings: a keepalive, the silent-peer timeout, a reconnect attempt,
    /// the accepting side's give-up. None: nothing timed.
    // The driver runs passes on its own cadence; the simulator runs on these.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == SessionState::Closed {
            return None;
        }
        let own = self.active_timeout();
        let paths = self.paths_timeout();
        match (own, paths) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn active_timeout(&self) -> Option<Instant> {
        match &self.link {
            // A keepalive waits for a credit to go with (a frame brings it), or for a
            // send-queue entry (a completion brings it): until then only the silent-peer
            // timeout is timed.
            Some(l) if !l.credits.can_send_control() || l.ping_blocked => {
                self.rules.keepalive?;
                l.live.last_heard.checked_add(self.rules.keepalive_timeout)
            }
            Some(l) => l
                .live
                .next_due(self.rules.ping(), self.rules.keepalive_timeout),
            None if self.incoming => self
                .down_since
                .map(|t| t + self.rules.reconnect_timeout * 2),
            None if self.session_attempt.is_some() => None,
            None => self.backoff.map(|b| b.next_at),
        }
    }

    /// Whether the next pump has something to do without any new event: an acknowledgement
    /// or credits held back a pass, or owed with a credit to send them, or messages
    /// waiting with credits for them (send-queue room permitting). A driver runs another
    /// pass at once when this holds (the shard's worker does after any callback).
    // The driver runs passes on its own cadence; the simulator runs on these.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn wants_pass(&self) -> bool {
        if self.state == SessionState::Open && self.standby_wants_pass() {
            return true;
        }
        if self.active && self.state == SessionState::Open && self.active_wants_pass() {
            return true;
        }
        let Some(l) = self.link.as_ref().filter(|l| l.hello_done) else {
            return false;
        };
        self.state == SessionState::Open
            && ((self.switch_due && l.credits.can_send_control())
                || (self.failback_due
                    && (self.policy == Policy::Lossless || self.unacked.is_empty()))
                || (l.credits.can_send_control()
                && (self.ack_deferred
                    || self.delivered > self.acked_to_peer
                    || l.credits.announce_due()))
                || (!self.waiting.is_empty() && l.credits.can_send_data())
                // A frame waits for a receive to announce (`Credits::room_to_speak`).
                || l.credits.deficit() > 0)
    }

    /// Whether the session has nothing to do at `now` as far as the rules go: open, nothing
    /// waiting, nothing to acknowledge or announce, every receive of the window posted,
    /// no keepalive due. (The driver adds what only it knows: completions queued, data
    /// being read, posts not taken.)
    pub fn quiet(&self, now: Instant) -> bool {
        let Some(l) = self.link.as_ref() else {
            return false;
        };
        self.state == SessionState::Open
            && l.hello_done
            // Paths to keep alive or to retry: the session's passes must run.
            && self.standby.is_empty()
            && self.live_paths() <= 1
            && !self.switch_due
            && !self.failback_due
            && self.waiting.is_empty()
            && self.delivered <= self.acked_to_peer
            && !self.ack_deferred
            && self.received == self.delivered
            && self.got.is_empty()
            && self.giveup_from.is_none()
            && l.credits.deficit() == 0
            && !l.credits.announce_due()
            && l.live
                .next_due(self.rules.ping(), self.rules.keepalive_timeout)
                .is_none_or(|t| now < t)
    }

    /// Receives to post on the current link to reach the window (the driver posts what
    /// its pool allows and reports [`Machine::on_posted`]).
    pub fn receives_wanted(&self) -> u32 {
        self.link.as_ref().map_or(0, |l| l.credits.deficit())
    }

    /// Pauses or resumes the peer's data messages (its control frames keep flowing): see
    /// `credits.rs`. Holds for the links made later too.
    pub fn set_receive_paused(&mut self, paused: bool) {
        self.recv_paused = paused;
        for l in self.link.iter_mut().chain(self.standby.iter_mut()) {
            l.credits.set_paused(paused);
        }
    }

    /// Whether the application paused the peer's data.
    pub fn receive_paused(&self) -> bool {
        self.recv_paused
    }

    /// Receives wanted on every link of the session (the simulator's pool check).
    #[cfg(test)]
    pub fn receives_wanted_all(&self) -> u32 {
        self.link
            .iter()
            .chain(self.standby.iter())
            .map(|l| l.credits.deficit())
            .sum()
    }

    /// [`Machine::receives_wanted`] for any link of the session (a standby path's too).
    pub fn receives_wanted_on(&self, lid: u64) -> u32 {
        self.link_state(lid).map_or(0, |l| l.credits.deficit())
    }

    /// `n` receives were posted on link `lid` (the active one or a standby path's).
    pub fn on_posted(&mut self, lid: u64, n: u32) {
        if let Some(l) = self.link_state_mut(lid) {
            l.credits.on_posted(n);
        }
    }

    /// The protocol state of link `lid`, active or standby.
    pub fn link_state(&self, lid: u64) -> Option<&LinkState> {
        self.link
            .iter()
            .chain(self.standby.iter())
            .find(|l| l.lid == lid)
    }

    fn link_state_mut(&mut self, lid: u64) -> Option<&mut LinkState> {
        self.link
            .iter_mut()
            .chain(self.standby.iter_mut())
            .find(|l| l.lid == lid)
    }

    fn notify(&mut self, n: Notice) {
        self.actions.push_back(Action::Notify(n));
    }
}

//! A session as the shard drives it: its session machine (`machine::Machine`, which
//! decides sequence numbers, acknowledgements, replay, credits, keepalive, faults,
//! reconnects and close), its current link, and what only the driver knows: where to
//! (re)connect, the attempt under way, the messages being received (their data and
//! READs), parking. A pass feeds the machine what the link found ([`Session::on_link_event`]),
//! hands complete messages over in order, reposts the receives the machine wants, pumps
//! it, and carries out its actions ([`Session::exec`]): posts, link closes, callbacks.
//! The messages the machine holds (waiting for credits, sent and not acknowledged) carry
//! an [`OutMsg`] body: the memory the driver posts from, released when the send
//! completes.

use crate::error::{Error, ErrorKind, Result};
use crate::mem::pool::{Chunk, Pool};
use crate::msgr::Connection;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use super::buffers::TxSeg;
use super::link::{
    Body, CONTROL_RESERVE, Link, LinkEvent, Received, RecvSlot, RxBuild, RxEntry, TxWrite,
};
use super::machine::{Action, Machine, Notice, Shape, SqRoom, Verdict};
use super::settings::{MsgLimits, MsgrSettings};
use super::submit::{Gate, Submitted};
use super::types::{
    InMessage, MSG_TYPE_IMM, PathEvent, PathInfo, RxSeg, SendId, SessionId, SessionInfo,
    SessionState,
};
use super::wire::{self, FRONT_INLINE_MAX, Header, PAYLOAD_MAX, SegDesc, flags};

/// A link being closed may drain its last sends (a bye, a refusing hello) this long.
pub const CLOSE_DRAIN: Duration = Duration::from_millis(200);

/// A prepared outgoing message: what the driver posts (the machine holds it with its
/// sequence number and [`Shape`]).
pub struct OutMsg {
    pub front: Vec<u8>,
    pub segs: Vec<TxSeg>,
    /// RDMA WRITEs posted right before the SEND (lossy sessions only: never replayed).
    pub writes: Vec<TxWrite>,
}

impl OutMsg {
    /// Eager: no segment or one small one, and the front fits the slot.
    pub fn eager(&self, eager_max: usize, max_sge: usize) -> bool {
        self.front.len() <= FRONT_INLINE_MAX
            && match self.segs.as_slice() {
                [] => true,
                [s] => s.len <= eager_max.min(PAYLOAD_MAX) && s.parts.len() < max_sge,
                _ => false,
            }
    }

    /// What the machine's rules need to know of it: `imm` for an immediate message,
    /// `bytes` its front + data + write bytes. Send-queue entries: its WRITEs, the WRITE
    /// of an eager segment (`msgr_eager_write`) and the SEND.
    pub fn shape(
        &self,
        msg_type: u16,
        imm: Option<u32>,
        bytes: u64,
        eager_max: usize,
        max_sge: usize,
    ) -> Shape {
        Shape {
            msg_type,
            front_len: self.front.len() as u32,
            nsegs: self.segs.len() as u16,
            rndv: imm.is_none() && !self.eager(eager_max, max_sge),
            imm,
            bytes,
            sq_need: usize::from(imm.is_none())
                + usize::from(self.segs.len() == 1)
                + self.writes.iter().map(|w| w.wrs(max_sge)).sum::<usize>(),
            writes: self.writes.len() as u32,
            write_bytes: self.writes.iter().map(|w| w.seg.len as u64).sum(),
        }
    }

    fn descs(&self) -> Vec<SegDesc> {
        self.segs
            .iter()
            .map(|s| SegDesc {
                len: s.len as u32,
                parts: s.parts.to_vec(),
            })
            .collect()
    }
}

/// What the callbacks will be told, in order.
pub enum Event {
    Connect(SessionId, SocketAddr, bool),
    Message(SessionId, InMessage),
    SendDone(SessionId, SendId, Result<()>),
    Ready(SessionId),
    Reset(SessionId, Error),
    Path(SessionId, usize, PathEvent),
}

/// A connection attempt running on its own thread: the connection and the receives its
/// on-connect hook posted.
pub type Attempt = Receiver<Result<(Connection, Vec<RecvSlot>)>>;

pub struct Session {
    /// The protocol: every decision about the session.
    pub m: Machine<OutMsg>,
    /// The current (active) link and its generation in the machine (actions name it).
    pub link: Option<(u64, Link)>,
    /// The links of the session's other paths (joined or joining): keepalives and credit
    /// announcements only, until the machine activates one ([`Action::Activate`]).
    pub standby: Vec<(u64, Link)>,
    /// The session's path secret (`auth::pathjoin`), from the authenticated handshake of
    /// the connection it opened on; None with `auth = none`. Path-joins carry a MAC with it.
    pub path_secret: Option<zeroize::Zeroizing<[u8; 32]>>,
    /// Connecting side: each path's address (by path index), and the attempts under way.
    pub addrs: Vec<String>,
    pub attempts: Vec<(usize, Attempt)>,
    /// The paths the machine asked a connection attempt for ([`Action::Connect`]): the
    /// shard starts them.
    pub want_connect: Vec<usize>,
    pub peer: Option<SocketAddr>,
    /// Where the application's sends wait for the next pass (`submit.rs`): shared with
    /// the shard's gate index, which `send` looks it up in.
    pub gate: Arc<Gate>,
    /// The sends taken from the gate by this pass (scratch, reused).
    submits: VecDeque<Submitted>,
    /// What the machine held (messages, bytes) when the gate was last told.
    gate_seen: (usize, u64),
    /// Looked at by every pass of its shard (not parked: see `park.rs`).
    pub active: bool,
    /// Active and found quiet by every pass since then (parked after `PARK_AFTER`).
    pub quiet_since: Option<Instant>,
    /// Parked: the earliest keepalive time queued for it in the shard's heap.
    pub keepalive_queued: Option<Instant>,
}

impl Session {
    pub fn new(m: Machine<OutMsg>) -> Session {
        Session {
            link: None,
            standby: Vec::new(),
            path_secret: None,
            addrs: Vec::new(),
            attempts: Vec::new(),
            want_connect: Vec::new(),
            peer: None,
            gate: Arc::new(Gate::new(m.policy)),
            submits: VecDeque::new(),
            gate_seen: (0, 0),
            active: false,
            quiet_since: None,
            keepalive_queued: None,
            m,
        }
    }

    pub fn id(&self) -> u64 {
        self.m.id
    }

    pub fn sid(&self) -> SessionId {
        SessionId(self.m.id)
    }

    /// The current link.
    pub fn link(&self) -> Option<&Link> {
        self.link.as_ref().map(|(_, l)| l)
    }

    fn link_mut(&mut self, lid: u64) -> Option<&mut Link> {
        find_link(&mut self.link, &mut self.standby, lid)
    }

    /// The session's paths: state and counters.
    pub fn paths(&self, now: Instant) -> Vec<PathInfo> {
        (0..self.m.path_count())
            .filter_map(|i| {
                let p = self.m.path(i)?;
                Some(PathInfo {
                    index: i,
                    remote: self.addrs.get(i).cloned(),
                    state: self.m.path_state(i),
                    counters: p.counters,
                    last_fault: p.last_fault.as_ref().map(|(e, _)| e.clone()),
                    since_last_fault: p
                        .last_fault
                        .as_ref()
                        .map(|(_, t)| now.saturating_duration_since(*t)),
                    removed: p.removed,
                })
            })
            .collect()
    }

    pub fn info(&self) -> SessionInfo {
        let l = self.m.link();
        // Sends at the gate are queued too, and its refusals counted.
        let (at_gate, refusals) = self.gate.pending();
        let mut counters = self.m.counters;
        counters.full_refusals += refusals;
        SessionInfo {
            state: self.m.state,
            policy: self.m.policy,
            peer: self.peer,
            incoming: self.m.incoming,
            local_id: self.m.id,
            peer_id: self.m.peer_id,
            queued: self.m.queued() + at_gate,
            unacked: self.m.unacked_len(),
            credits: l.map_or(0, |l| l.credits.tx),
            recv_window: l.map_or(0, |l| l.credits.window),
            recv_paused: self.m.receive_paused(),
            counters,
        }
    }

    /// Gives the machine the sends queued at the gate since the last pass, in order (the
    /// sequence numbers the application was given are the machine's).
    pub fn take_submitted(&mut self, ev: &mut Vec<Event>) {
        let mut q = std::mem::take(&mut self.submits);
        self.gate
            .take(&mut q, (self.m.held_msgs(), self.m.held_bytes()));
        self.enqueue_submitted(&mut q, ev);
        self.submits = q;
        self.gate_seen = (self.m.held_msgs(), self.m.held_bytes());
    }

    /// After a step that may have freed room (acknowledgements): tells the gate what the
    /// machine holds, and queues the `on_send_ready` owed to a send the gate refused.
    pub fn sync_gate(&mut self, ev: &mut Vec<Event>) {
        let held = (self.m.held_msgs(), self.m.held_bytes());
        if held == self.gate_seen {
            return;
        }
        self.gate_seen = held;
        let s = self.gate.sync(self.m.rules(), held);
        self.m.counters.full_refusals += s.refusals;
        if s.ready && self.m.state != SessionState::Closed {
            ev.push(Event::Ready(self.sid()));
        }
    }

    /// The session ends, or the application closes it: the gate refuses every later send,
    /// and the sends it held go to the machine. An open machine then fails them with the
    /// rest when it closes; one that ended already fails them here, before its `on_reset`.
    pub fn close_gate(&mut self, ev: &mut Vec<Event>) {
        let mut q = std::mem::take(&mut self.submits);
        self.m.counters.full_refusals += self.gate.close(&mut q);
        self.enqueue_submitted(&mut q, ev);
        self.submits = q;
    }

    /// The peer's advertised limits on the current link (its hello) go to the gate: a send
    /// the peer would refuse, and end the session for, is refused at `send`.
    pub fn note_peer_limits(&mut self) {
        if let Some(l) = self.link().and_then(|l| l.conn.peer_limits()) {
            self.gate.set_peer_limits(MsgLimits::from_wire(l));
        }
    }

    fn enqueue_submitted(&mut self, q: &mut VecDeque<Submitted>, ev: &mut Vec<Event>) {
        let sid = self.sid();
        for s in q.drain(..) {
            match self.m.enqueue(s.out, s.shape) {
                Ok(seq) => {
                    debug_assert_eq!(seq, s.seq, "the gate's sequence numbers are the machine's");
                    self.m.counters.copied_bytes += s.copied;
                }
                // The machine ended in this pass before the gate closed: the send fails with
                // the session's error, before its on_reset (the last callback).
                Err((_, e)) => fail_before_reset(ev, sid, s.seq, e),
            }
        }
    }

    /// When the machine's keepalive or silent-peer check comes due (parking's timer).
    pub fn next_keepalive(&self) -> Option<Instant> {
        let r = self.m.rules();
        self.m
            .link()
            .and_then(|l| l.live.next_due(r.ping(), r.keepalive_timeout))
    }

    /// Whether this pass may skip the session: the machine has nothing to do
    /// (`Machine::quiet`: open, nothing to send, acknowledge, announce, repost or ping),
    /// and neither has the link (nothing being received or unposted, no completion
    /// queued). A pass looks at such a session for the price of this check (its fields
    /// and an atomic load per CQ), not a poll and a pump, and after `PARK_AFTER` of it not
    /// at all (`park.rs`): `TEST=rpc_lat bench/scale.sh`, 1,000 idle sessions beside a
    /// busy one.
    pub fn quiet(&self, now: Instant) -> bool {
        let Some((_, link)) = self.link.as_ref() else {
            return false;
        };
        // (The machine is never quiet with standby paths: they are kept alive.)
        self.m.quiet(now) && link.is_quiet() && !link.conn.may_have_completions()
    }

    /// What a poll of link `lid` found, fed to the machine: an accepted message is queued
    /// for delivery (its data read first if it came as descriptors), anything else gives
    /// its payload chunk back.
    pub fn on_link_event(
        &mut self,
        now: Instant,
        lid: u64,
        e: LinkEvent,
        s: &MsgrSettings,
        pool: &Pool,
    ) {
        match e {
            LinkEvent::ReadDone => {}
            LinkEvent::Imm(v) => {
                if let Verdict::Accept(seq) = self.m.on_imm(now, lid)
                    && let Some((_, link)) = self.link.as_mut()
                {
                    // Its WRITEs have landed (RC, in order): nothing to read.
                    link.rx.push_back(RxEntry {
                        seq,
                        msg_type: MSG_TYPE_IMM,
                        front: v.to_le_bytes().to_vec(),
                        eager: None,
                        segs: Vec::new(),
                        reads_in_flight: 0,
                    });
                }
            }
            LinkEvent::Recv(r) if !self.join_answer_ok(lid, &r.h) => {
                if let Some(c) = r.data {
                    self.give_back(c, pool);
                }
                let e = Error::fixed(
                    ErrorKind::Auth,
                    "path-join: the answer's MAC is wrong (not the session's peer)",
                );
                self.m.on_link_error(now, lid, e);
            }
            LinkEvent::Recv(r) => match self.m.on_frame(now, lid, &r.h) {
                Verdict::Accept(seq) => {
                    if let Err(e) = self.accept(lid, seq, r, s, pool) {
                        self.m.on_link_error(now, lid, e);
                    }
                }
                _ => {
                    if let Some(c) = r.data {
                        self.give_back(c, pool);
                    }
                }
            },
        }
    }

    /// The session opened: its path secret from the connection it opened on (with auth).
    pub fn note_path_secret(&mut self) {
        if self.path_secret.is_none()
            && let Some(b) = self.link().and_then(|l| l.conn.binding())
        {
            self.path_secret = Some(crate::msgr::auth::pathjoin::path_secret(b));
        }
    }

    /// Whether a frame on link `lid` that is a path-join answer carries the right MAC (a
    /// frame that is not one, or a session without auth, passes).
    fn join_answer_ok(&self, lid: u64, h: &Header) -> bool {
        if self.m.incoming || h.kind() != Some(wire::Kind::Hello) || !h.has(flags::JOIN) {
            return true;
        }
        let Some((_, link)) = self.standby.iter().find(|(l, _)| *l == lid) else {
            return true;
        };
        match (self.path_secret.as_deref(), link.conn.binding()) {
            (_, None) => true,
            (Some(s), Some(b)) => {
                use crate::msgr::auth::pathjoin::{Role, verify};
                verify(s, Role::Answer, h.aux2, h.aux, h.ack, b, h.aux3)
            }
            (None, Some(_)) => false,
        }
    }

    /// A payload chunk nobody will hand out: to the link's spares, or the pool.
    fn give_back(&mut self, c: Chunk, pool: &Pool) {
        match self.link.as_mut() {
            Some((_, l)) => l.give_back(c),
            None => {
                let _ = pool.put(c);
            }
        }
    }

    /// Message `seq` (the machine accepted it: the next in order, or with active/active
    /// one ahead of a gap) is queued for delivery on link `lid`, which holds its buffers
    /// until then. `Err`: a descriptor block that does not parse, or a message over this
    /// side's limits (`ResourceLimit`: the machine ends the session rather than have it
    /// replayed).
    fn accept(
        &mut self,
        lid: u64,
        seq: u64,
        r: Received,
        s: &MsgrSettings,
        pool: &Pool,
    ) -> Result<()> {
        let id = self.m.id;
        let peer = self.peer;
        let Some(link) = find_link(&mut self.link, &mut self.standby, lid) else {
            if let Some(c) = r.data {
                let _ = pool.put(c);
            }
            return Ok(());
        };
        let mut entry = RxEntry {
            seq,
            msg_type: r.h.msg_type,
            front: r.front,
            eager: None,
            segs: Vec::new(),
            reads_in_flight: 0,
        };
        let counters = &mut self.m.counters;
        if r.h.has(flags::RNDV) {
            let Some(c) = r.data else {
                return Err(
                    wire::Malformed("rendezvous message without a descriptor block").into(),
                );
            };
            // SAFETY: the receive completed; the chunk is ours and holds `payload_len`
            // (<= its size, checked by the header parse) bytes.
            let block = unsafe { std::slice::from_raw_parts(c.addr, r.h.payload_len as usize) };
            let parsed = wire::parse_block(&r.h, block);
            link.give_back(c);
            let (front, segs) = parsed?;
            // Within this side's limits, before a chunk is taken for it (`post_reads`).
            let bytes = segs.iter().map(|g| u64::from(g.len)).sum();
            if let Err(e) = s.limits.check_recv(segs.len(), bytes) {
                counters.oversized += 1;
                warn_oversized(id, peer, &e);
                return Err(e);
            }
            entry.front = front;
            entry.segs = segs
                .into_iter()
                .map(|desc| RxBuild {
                    desc,
                    chunks: Default::default(),
                    next: 0,
                })
                .collect();
            counters.read_segments += entry.segs.len() as u64;
        } else if r.h.nsegs == 1 {
            entry.eager = r.data.map(|c| (c, r.h.payload_len as usize));
            counters.eager_segments += 1;
            if r.h.has(flags::WRITTEN) {
                counters.written_segments += 1;
            }
        } else if let Some(c) = r.data {
            link.give_back(c);
        }
        link.rx.push_back(entry);
        Ok(())
    }

    /// The protocol steps of a pass on the current link after its poll: READs of
    /// rendezvous data, in-order delivery, the receives the machine wants reposted, the
    /// machine's pump, its actions, one post of what they queued.
    pub fn step(
        &mut self,
        now: Instant,
        data_pool: &Arc<Pool>,
        ev: &mut Vec<Event>,
        closing: &mut Vec<(Link, Instant)>,
    ) {
        if self.link.is_none() {
            return;
        }
        match self.deliver(data_pool, ev) {
            Ok(()) => {
                if let Some((_, link)) = self.link.as_ref() {
                    let room = SqRoom {
                        free: link.sq_room(),
                        reserve: CONTROL_RESERVE,
                    };
                    self.m.pump(now, room);
                }
            }
            Err((failed, e)) => self.m.on_link_error(now, failed, e),
        }
        self.exec(now, ev, closing);
        self.flush(now, ev, closing);
        self.step_standby(now, ev, closing);
    }

    /// The standby paths' part of a pass: receives reposted, keepalives and credit
    /// announcements, one post each.
    pub fn step_standby(
        &mut self,
        now: Instant,
        ev: &mut Vec<Event>,
        closing: &mut Vec<(Link, Instant)>,
    ) {
        if self.standby.is_empty() {
            return;
        }
        let lids: smallvec::SmallVec<[u64; 4]> = self.standby.iter().map(|(l, _)| *l).collect();
        for lid in lids {
            let Some(link) = self
                .standby
                .iter_mut()
                .find(|(l, _)| *l == lid)
                .map(|(_, l)| l)
            else {
                continue;
            };
            match link.replenish(self.m.receives_wanted_on(lid)) {
                Ok(n) => {
                    self.m.on_posted(lid, n);
                    let room = SqRoom {
                        free: link.sq_room(),
                        reserve: CONTROL_RESERVE,
                    };
                    self.m.pump_standby(now, lid, room);
                }
                Err(e) => self.m.on_link_error(now, lid, e),
            }
            self.exec(now, ev, closing);
            if let Some((_, link)) = self.standby.iter_mut().find(|(l, _)| *l == lid) {
                let r = link.flush();
                take_counters(&mut self.m, link);
                if let Err(e) = r {
                    self.m.on_link_error(now, lid, e);
                    self.exec(now, ev, closing);
                }
            }
        }
    }

    /// READs, delivery in order, receives reposted. `Err`: the link that failed (a READ
    /// or a repost it refused) and why.
    fn deliver(
        &mut self,
        data_pool: &Arc<Pool>,
        ev: &mut Vec<Event>,
    ) -> std::result::Result<(), (u64, Error)> {
        if self.m.is_active() {
            return self.deliver_active(data_pool, ev);
        }
        let sid = self.sid();
        let Some((lid, link)) = self.link.as_mut() else {
            return Ok(());
        };
        let lid = *lid;
        post_reads(link).map_err(|e| (lid, e))?;
        while link.rx.front().is_some_and(|e| e.complete()) {
            let Some(e) = link.rx.pop_front() else { break };
            let (msg, bytes) = into_message(e, data_pool);
            self.m.on_delivered(msg.seq);
            self.m.counters.bytes_received += bytes;
            ev.push(Event::Message(sid, msg));
        }
        let n = link
            .replenish(self.m.receives_wanted())
            .map_err(|e| (lid, e))?;
        self.m.on_posted(lid, n);
        Ok(())
    }

    /// [`Session::deliver`] of an active/active session: every link's READs, then the
    /// messages of all links in sequence order up to where nothing is missing
    /// (`Machine::deliverable`); one ahead of a gap stays in its link's `rx`, buffers and
    /// all, until the gap fills (or its link fails: the machine forgets it, the peer sends
    /// it again). The standby links repost in `step_standby`.
    fn deliver_active(
        &mut self,
        data_pool: &Arc<Pool>,
        ev: &mut Vec<Event>,
    ) -> std::result::Result<(), (u64, Error)> {
        let sid = self.sid();
        for (lid, link) in self.link.iter_mut().chain(self.standby.iter_mut()) {
            post_reads(link).map_err(|e| (*lid, e))?;
        }
        loop {
            let upto = self.m.deliverable();
            // The lowest number held on any link (a link's own queue is out of order
            // after a replay: what went on a failed link comes after what it carried).
            let lowest = self
                .link
                .iter()
                .chain(self.standby.iter())
                .flat_map(|(lid, l)| l.rx.iter().enumerate().map(move |(i, e)| (e.seq, *lid, i)))
                .min();
            let Some((seq, lid, i)) = lowest.filter(|(seq, _, _)| *seq <= upto) else {
                break;
            };
            let Some(link) = self.link_mut(lid) else {
                break;
            };
            if !link.rx[i].complete() {
                break;
            }
            let Some(e) = link.rx.remove(i) else { break };
            let (msg, bytes) = into_message(e, data_pool);
            debug_assert_eq!(msg.seq, seq);
            self.m.on_delivered(seq);
            self.m.counters.bytes_received += bytes;
            ev.push(Event::Message(sid, msg));
        }
        let Some((lid, link)) = self.link.as_mut() else {
            return Ok(());
        };
        let lid = *lid;
        let n = link
            .replenish(self.m.receives_wanted())
            .map_err(|e| (lid, e))?;
        self.m.on_posted(lid, n);
        Ok(())
    }

    /// Posts what the link queued (one batch), and takes its counters; a refusal faults it.
    pub fn flush(&mut self, now: Instant, ev: &mut Vec<Event>, closing: &mut Vec<(Link, Instant)>) {
        let Some((lid, link)) = self.link.as_mut() else {
            return;
        };
        let r = link.flush();
        take_counters(&mut self.m, link);
        if let Err(e) = r {
            self.m.on_link_error(now, *lid, e);
            self.exec(now, ev, closing);
        }
    }

    /// Posts what the standby links queued (a join hello, a keepalive).
    pub fn flush_standby(
        &mut self,
        now: Instant,
        ev: &mut Vec<Event>,
        closing: &mut Vec<(Link, Instant)>,
    ) {
        let mut failed: smallvec::SmallVec<[(u64, Error); 2]> = smallvec::SmallVec::new();
        for (lid, link) in &mut self.standby {
            let r = link.flush();
            take_counters(&mut self.m, link);
            if let Err(e) = r {
                failed.push((*lid, e));
            }
        }
        for (lid, e) in failed {
            self.m.on_link_error(now, lid, e);
        }
        self.exec(now, ev, closing);
    }

    /// Carries out the machine's actions, in order: posts queued on the link (a post it
    /// refuses is a fault of that link, whose actions follow), links closed (a drained one
    /// goes to `closing`), callbacks queued in `ev`. A connection attempt it asks for is
    /// left to the shard ([`Session::want_connect`]).
    pub fn exec(&mut self, now: Instant, ev: &mut Vec<Event>, closing: &mut Vec<(Link, Instant)>) {
        while let Some(a) = self.m.poll_action() {
            match a {
                Action::Connect { path } => self.want_connect.push(path),
                Action::Activate { link } => self.activate(now, link),
                Action::Post {
                    link,
                    mut header,
                    msg,
                    owed,
                } => {
                    if let Err(e) = self.post(link, &mut header, msg, owed) {
                        self.m.on_link_error(now, link, e);
                    }
                }
                Action::PostImm { link, seq, value } => {
                    if let Err(e) = self.post_imm(link, seq, value) {
                        self.m.on_link_error(now, link, e);
                    }
                }
                Action::CloseLink { link, drain } => {
                    let active = self.link.as_ref().is_some_and(|(l, _)| *l == link);
                    let taken = if active {
                        self.link.take()
                    } else {
                        let k = self.standby.iter().position(|(l, _)| *l == link);
                        k.map(|k| self.standby.remove(k))
                    };
                    if let Some((_, mut l)) = taken {
                        take_counters(&mut self.m, &mut l);
                        if active && !self.m.is_active() {
                            // Windows bound for this link's QP end (a replay binds new ones;
                            // active/active: only what went on it replays, and it rebinds
                            // them when posted again, the others' stay bound).
                            let segs = self.m.bodies_mut().flat_map(|b| b.segs.iter_mut());
                            segs.for_each(TxSeg::unexpose);
                        }
                        if drain {
                            let _ = l.flush();
                            closing.push((l, now + CLOSE_DRAIN));
                        }
                        // Otherwise dropped here: the connection closes first, then every
                        // chunk it held (posted, being received) returns to the pools.
                    }
                }
                Action::Notify(n) => self.notify(n, ev),
            }
        }
    }

    /// The machine moved the traffic to standby link `lid`: it becomes the current link;
    /// the one that was stays as a standby one, what it was receiving dropped (the peer
    /// sends it again on the new link). A link with READs in flight for those messages
    /// cannot give their chunks back while it lives: it closes instead (its path rejoins).
    fn activate(&mut self, now: Instant, lid: u64) {
        let Some(k) = self.standby.iter().position(|(l, _)| *l == lid) else {
            return;
        };
        let new = self.standby.remove(k);
        if self.m.is_active() {
            // Only which link is the primary (reported first) changes: nothing moves.
            if let Some(old) = self.link.replace(new) {
                self.standby.push(old);
            }
            self.note_peer_limits();
            return;
        }
        if let Some((old_lid, mut old)) = self.link.replace(new) {
            // Windows bound for the old link's QP end (the messages go again on the new).
            let segs = self.m.bodies_mut().flat_map(|b| b.segs.iter_mut());
            segs.for_each(TxSeg::unexpose);
            if old.discard_rx() {
                self.standby.push((old_lid, old));
            } else {
                take_counters(&mut self.m, &mut old);
                drop(old);
                let e = Error::fixed(
                    ErrorKind::Closed,
                    "the path left with READs in flight: closed, to rejoin",
                );
                self.m.on_link_error(now, old_lid, e);
            }
        }
        self.note_peer_limits();
    }

    fn notify(&mut self, n: Notice, ev: &mut Vec<Event>) {
        let sid = self.sid();
        ev.push(match n {
            Notice::Connected => {
                self.note_path_secret();
                // The accepting side knows the path policy from the hello by now.
                self.gate.set_active(self.m.is_active());
                let Some(p) = self.peer.or_else(|| self.link().map(|l| l.conn.peer())) else {
                    return;
                };
                self.peer = Some(p);
                Event::Connect(sid, p, self.m.incoming)
            }
            Notice::SendDone(seq, r) => Event::SendDone(sid, seq, r),
            Notice::Ready => Event::Ready(sid),
            Notice::Reset(e) => {
                log::debug!(target: "rdmx::msgr", "session {:#x}: reset: {e}", self.m.id);
                Event::Reset(sid, e)
            }
            Notice::Path(i, pe) => {
                let to = self
                    .addrs
                    .get(i)
                    .map_or_else(String::new, |a| format!(" ({a})"));
                match &pe {
                    PathEvent::Down(e) => log::warn!(
                        target: "rdmx::msgr",
                        "session {:#x}: path {i}{to} down: {e}", self.m.id
                    ),
                    PathEvent::Up => log::info!(
                        target: "rdmx::msgr",
                        "session {:#x}: path {i}{to} up (standby)", self.m.id
                    ),
                    PathEvent::Active => log::info!(
                        target: "rdmx::msgr",
                        "session {:#x}: traffic switched to path {i}{to}", self.m.id
                    ),
                }
                Event::Path(sid, i, pe)
            }
        });
    }

    /// Queues the SEND of `h` on link `lid` (if it is still the current one): a control
    /// frame, or data message `msg` from the body the machine holds for it.
    fn post(&mut self, lid: u64, h: &mut Header, msg: Option<u64>, owed: u32) -> Result<()> {
        let Some(seq) = msg else {
            // A control frame: on the active link or a standby path's.
            let (incoming, secret) = (self.m.incoming, self.path_secret.clone());
            return match self.link_mut(lid) {
                Some(link) => {
                    if h.kind() == Some(wire::Kind::Hello) && h.has(flags::JOIN) {
                        sign_join(h, incoming, secret.as_deref(), link.conn.binding());
                    }
                    link.queue(h, &[], Body::None, owed)
                }
                None => Ok(()),
            };
        };
        // On the link the machine chose (the active one; active/active: any joined one).
        let Some(link) = find_link(&mut self.link, &mut self.standby, lid) else {
            return Ok(());
        };
        let Some(o) = self.m.unacked_mut(seq) else {
            return Err(Error::new(
                ErrorKind::Closed,
                format!("messenger: post of message {seq}, which the session does not hold"),
            ));
        };
        if o.shape.rndv {
            // Scoped rkeys: the peer READs through windows bound for its QP (`scope.rs`).
            super::scope::expose_all(link.scope.as_ref(), &mut o.body.segs)?;
        }
        let m = &o.body;
        if !o.shape.rndv {
            let body = match m.segs.first() {
                Some(g) => Body::Eager(&g.parts, &g.lkeys),
                None => Body::None,
            };
            link.queue_msg(h, &m.front, body, &m.writes, owed)
        } else {
            let mut block = [0u8; PAYLOAD_MAX];
            let n = wire::emit_block(&mut block, &m.front, &m.descs()).ok_or_else(|| {
                Error::fixed(ErrorKind::InvalidArgument, "descriptor block too large")
            })?;
            link.queue_msg(h, &[], Body::Block(&block[..n]), &m.writes, owed)
        }
    }

    /// Queues immediate message `seq` (its WRITEs, the last carrying `value`) on `lid`.
    fn post_imm(&mut self, lid: u64, seq: u64, value: u32) -> Result<()> {
        let Some(link) = find_link(&mut self.link, &mut self.standby, lid) else {
            return Ok(());
        };
        match self.m.unacked(seq) {
            Some(o) => link.queue_imm(&o.body.writes, value),
            None => Err(Error::new(
                ErrorKind::Closed,
                format!("messenger: post of immediate {seq}, which the session does not hold"),
            )),
        }
    }
}

/// Link `lid` among the current one and the standby ones. Takes the two fields rather than
/// the session, so that a caller may hold the link and use the machine (`self.m`) at once.
fn find_link<'a>(
    link: &'a mut Option<(u64, Link)>,
    standby: &'a mut [(u64, Link)],
    lid: u64,
) -> Option<&'a mut Link> {
    link.iter_mut()
        .chain(standby.iter_mut())
        .find(|(l, _)| *l == lid)
        .map(|(_, l)| l)
}

/// Posts the READs of a link's rendezvous messages, oldest first, as far as the pool and
/// the send queue allow.
fn post_reads(link: &mut Link) -> Result<()> {
    for i in 0..link.rx.len() {
        let all_posted = link.rx[i]
            .segs
            .iter()
            .all(|g| g.next >= g.desc.len as usize);
        if !all_posted && !link.post_reads(i)? {
            break;
        }
    }
    Ok(())
}

/// A received message whose data is complete, as the application gets it, and its bytes.
fn into_message(e: RxEntry, data_pool: &Arc<Pool>) -> (InMessage, u64) {
    let mut data = Vec::new();
    let mut bytes = e.front.len() as u64;
    if let Some((c, len)) = e.eager {
        bytes += len as u64;
        data.push(RxSeg {
            chunks: smallvec::smallvec![c],
            pool: Arc::clone(data_pool),
            len,
        });
    }
    for g in e.segs {
        bytes += u64::from(g.desc.len);
        data.push(RxSeg {
            chunks: g.chunks,
            pool: Arc::clone(data_pool),
            len: g.desc.len as usize,
        });
    }
    let msg = InMessage {
        msg_type: e.msg_type,
        seq: e.seq,
        front: e.front,
        data,
    };
    (msg, bytes)
}

/// Puts the path-join MAC into the join hello `h` (`incoming`: the accepting side's answer)
/// when the session and the link have secrets (auth on); 0 otherwise.
fn sign_join(
    h: &mut Header,
    incoming: bool,
    secret: Option<&[u8; 32]>,
    binding: Option<&[u8; 32]>,
) {
    use crate::msgr::auth::pathjoin::{Role, mac};
    h.aux3 = match (secret, binding) {
        (Some(s), Some(b)) if incoming => mac(s, Role::Answer, h.aux2, h.aux, h.ack, b),
        (Some(s), Some(b)) => mac(s, Role::Join, h.aux, h.aux2, h.ack, b),
        _ => 0,
    };
}

/// Completes send `seq` of session `sid` with an error, before the session's `on_reset` in
/// `ev` if it is there (then with its error), else last.
fn fail_before_reset(ev: &mut Vec<Event>, sid: SessionId, seq: u64, e: Error) {
    let reset = ev
        .iter()
        .rposition(|x| matches!(x, Event::Reset(s, _) if *s == sid));
    match reset {
        Some(i) => {
            let err = match &ev[i] {
                Event::Reset(_, why) => why.clone(),
                _ => e,
            };
            ev.insert(i, Event::SendDone(sid, seq, Err(err)));
        }
        None => ev.push(Event::SendDone(sid, seq, Err(e))),
    }
}

/// The link's counters not yet added to the session's.
fn take_counters(m: &mut Machine<OutMsg>, l: &mut Link) {
    m.counters.rnr_naks += l.take_rnr();
    m.counters.send_completions += std::mem::take(&mut l.send_wcs);
    m.counters.partial_posts += std::mem::take(&mut l.partial_posts);
}

/// Logs a peer's message refused for its size at most once a second, process-wide: a peer
/// that keeps opening sessions to send them must not flood the log (each is counted in
/// `SessionCounters::oversized` all the same).
fn warn_oversized(id: u64, peer: Option<SocketAddr>, e: &Error) {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    static NEXT_MS: AtomicU64 = AtomicU64::new(0);
    static SKIPPED: AtomicU64 = AtomicU64::new(0);
    let now = EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64;
    let due = NEXT_MS.load(Relaxed);
    if now < due
        || NEXT_MS
            .compare_exchange(due, now + 1000, Relaxed, Relaxed)
            .is_err()
    {
        SKIPPED.fetch_add(1, Relaxed);
        return;
    }
    let skipped = match SKIPPED.swap(0, Relaxed) {
        0 => String::new(),
        n => format!(" ({n} more since the last line)"),
    };
    let peer = peer.map_or_else(|| "?".to_string(), |p| p.to_string());
    log::warn!(target: "rdmx::msgr", "session {id:#x} (peer {peer}): {e}{skipped}");
}

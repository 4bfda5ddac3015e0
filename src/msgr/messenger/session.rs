//! A session's state: identities, sequence numbers, the messages waiting for credits and
//! those sent but not acknowledged (kept for replay), what was delivered; and the protocol
//! steps on its current link (receive, deliver in order, send within credits, acknowledge,
//! keep alive).
//!
//! Replay: on a fault the unacknowledged messages go back to the front of the waiting
//! queue, in order; the next link's hello tells how far the peer delivered (everything up
//! to it completes), and the rest is sent again. The receiver drops a sequence number it
//! already delivered, so each message is delivered exactly once, in order.

use crate::error::{Error, ErrorKind, Result};
use crate::mem::pool::Pool;
use crate::msgr::Connection;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::mpsc::Receiver;
use std::time::Instant;

use super::buffers::TxSeg;
use super::keepalive::Backoff;
use super::link::{Body, Link, LinkEvent, Received, RecvSlot, RxBuild, RxEntry, TxWrite};
use super::machine::rules::{self, ControlIn, Order};
use super::settings::MsgrSettings;
use super::types::{
    InMessage, MSG_TYPE_IMM, Policy, RxSeg, SendId, SessionCounters, SessionId, SessionInfo,
    SessionState,
};
use super::wire::{self, FRONT_INLINE_MAX, Header, Kind, Malformed, PAYLOAD_MAX, SegDesc, flags};

/// A prepared outgoing message.
pub struct OutMsg {
    pub seq: u64,
    pub msg_type: u16,
    pub front: Vec<u8>,
    pub segs: Vec<TxSeg>,
    /// RDMA WRITEs posted right before the SEND (lossy sessions only: never replayed).
    pub writes: Vec<TxWrite>,
    /// An immediate message: the value its last WRITE carries (no SEND).
    pub imm: Option<u32>,
    /// Front + data + write bytes.
    pub bytes: u64,
    /// Sent before on an earlier link.
    pub replay: bool,
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

    /// Send-queue entries the message takes: its WRITEs, the WRITE of an eager segment
    /// (`msgr_eager_write`) and the SEND.
    pub fn sq_need(&self, max_sge: usize) -> usize {
        usize::from(self.imm.is_none())
            + usize::from(self.segs.len() == 1)
            + self.writes.iter().map(|w| w.wrs(max_sge)).sum::<usize>()
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
}

/// A connection attempt running on its own thread: the connection and the receives its
/// on-connect hook posted.
pub type Attempt = Receiver<Result<(Connection, Vec<RecvSlot>)>>;

pub struct Session {
    pub id: u64,
    pub peer_id: u64,
    pub policy: Policy,
    pub incoming: bool,
    /// Connecting side: where to (re)connect.
    pub addr: Option<String>,
    pub peer: Option<SocketAddr>,
    pub state: SessionState,
    pub next_seq: u64,
    pub waiting: VecDeque<OutMsg>,
    pub unacked: VecDeque<OutMsg>,
    /// Data + front bytes of `waiting` and `unacked`.
    pub held_bytes: u64,
    /// The message limits the peer advertised in its last hello (None: not known yet).
    pub peer_limits: Option<super::settings::MsgLimits>,
    /// A send was refused with Full: tell `on_send_ready` when there is room.
    pub refused: bool,
    pub delivered: u64,
    pub acked_to_peer: u64,
    pub link: Option<Link>,
    pub counters: SessionCounters,
    pub backoff: Option<Backoff>,
    pub attempt: Option<Attempt>,
    /// `on_connect` was reported.
    pub announced: bool,
    /// Accepting side of a lossless session without a link: since when.
    pub down_since: Option<Instant>,
    /// Messages are waiting for credits (counted once per stall).
    pub stalled: bool,
    /// The acknowledgement of messages delivered in the last pass was held back for a
    /// pass (an answer may carry it).
    pub ack_deferred: bool,
    /// Accepting side: the connecting messenger's address (its IP, its listening port)
    /// and incarnation, when its hello named them: a new incarnation at that address
    /// means the peer restarted (see `Core::attach_incoming`).
    pub peer_entity: Option<(SocketAddr, u64)>,
    /// Looked at by every pass of its shard (not parked: see `park.rs`).
    pub active: bool,
    /// Active and found quiet by every pass since then (parked after `PARK_AFTER`).
    pub quiet_since: Option<Instant>,
    /// Parked: the earliest keepalive time queued for it in the shard's heap.
    pub keepalive_queued: Option<Instant>,
}

impl Session {
    pub fn new(id: u64, policy: Policy, incoming: bool) -> Session {
        Session {
            id,
            peer_id: 0,
            policy,
            incoming,
            addr: None,
            peer: None,
            state: SessionState::Connecting,
            next_seq: 1,
            waiting: VecDeque::new(),
            unacked: VecDeque::new(),
            held_bytes: 0,
            peer_limits: None,
            refused: false,
            delivered: 0,
            acked_to_peer: 0,
            link: None,
            counters: SessionCounters::default(),
            backoff: None,
            attempt: None,
            announced: false,
            down_since: None,
            stalled: false,
            ack_deferred: false,
            peer_entity: None,
            active: false,
            quiet_since: None,
            keepalive_queued: None,
        }
    }

    pub fn sid(&self) -> SessionId {
        SessionId(self.id)
    }

    pub fn held_msgs(&self) -> usize {
        self.waiting.len() + self.unacked.len()
    }

    /// Whether a new message of `bytes` fits the bounds.
    pub fn has_room(&self, s: &MsgrSettings, bytes: u64) -> bool {
        self.held_msgs() < s.send_queue_msgs
            && (self.held_bytes == 0 || self.held_bytes + bytes <= s.send_queue_bytes)
    }

    pub fn info(&self) -> SessionInfo {
        SessionInfo {
            state: self.state,
            policy: self.policy,
            peer: self.peer,
            incoming: self.incoming,
            local_id: self.id,
            peer_id: self.peer_id,
            queued: self.waiting.len(),
            unacked: self.unacked.len(),
            credits: self.link.as_ref().map_or(0, |l| l.credits.tx),
            recv_window: self.link.as_ref().map_or(0, |l| l.credits.window),
            counters: self.counters,
        }
    }

    /// Everything up to `ack` was delivered by the peer: those sends complete.
    pub fn on_ack(&mut self, ack: u64, s: &MsgrSettings, ev: &mut Vec<Event>) {
        let sid = self.sid();
        while self.unacked.front().is_some_and(|m| m.seq <= ack) {
            if let Some(m) = self.unacked.pop_front() {
                self.held_bytes -= m.bytes;
                ev.push(Event::SendDone(sid, m.seq, Ok(())));
            }
        }
        while self
            .waiting
            .front()
            .is_some_and(|m| m.replay && m.seq <= ack)
        {
            if let Some(m) = self.waiting.pop_front() {
                self.held_bytes -= m.bytes;
                ev.push(Event::SendDone(sid, m.seq, Ok(())));
            }
        }
        if self.refused && self.has_room(s, 0) {
            self.refused = false;
            ev.push(Event::Ready(sid));
        }
    }

    /// Every send still held fails with `err`.
    pub fn fail_all(&mut self, err: &Error, ev: &mut Vec<Event>) {
        let sid = self.sid();
        for m in self.unacked.drain(..).chain(self.waiting.drain(..)) {
            ev.push(Event::SendDone(sid, m.seq, Err(err.clone())));
        }
        self.held_bytes = 0;
    }

    /// The link is gone: what it sent and was not acknowledged is sent again on the next.
    pub fn drop_link(&mut self) {
        self.link = None;
        while let Some(mut m) = self.unacked.pop_back() {
            m.replay = true;
            self.waiting.push_front(m);
        }
    }

    /// Handles the header fields every message carries.
    fn on_header(&mut self, h: &Header, s: &MsgrSettings, ev: &mut Vec<Event>) {
        if let Some(l) = self.link.as_mut() {
            if h.has(flags::STARVED) {
                l.credits.grow();
            }
        }
        if h.kind != Kind::Hello as u8 {
            self.on_ack(h.ack, s, ev);
        }
    }

    /// Handles what a link poll found. `Err` = a fault (malformed or unexpected).
    pub fn on_link_event(
        &mut self,
        e: LinkEvent,
        s: &MsgrSettings,
        ev: &mut Vec<Event>,
    ) -> Result<()> {
        let r = match e {
            LinkEvent::ReadDone => return Ok(()),
            LinkEvent::Imm(v) => return self.on_imm(v),
            LinkEvent::Recv(r) => r,
        };
        self.on_header(&r.h, s, ev);
        let Some(kind) = r.h.kind() else {
            return Err(Malformed("unknown message kind").into());
        };
        match kind {
            Kind::Hello => self.on_hello(r, s, ev),
            Kind::Msg => self.on_msg(r, s),
            Kind::Ack | Kind::Ping | Kind::Pong => Ok(()),
            Kind::Bye => Err(Error::fixed(
                ErrorKind::Closed,
                "the peer closed the session",
            )),
        }
    }

    /// The hello that answers ours (connecting side).
    fn on_hello(&mut self, r: Received, s: &MsgrSettings, ev: &mut Vec<Event>) -> Result<()> {
        let Some(link) = self.link.as_mut() else {
            return Ok(());
        };
        if self.incoming || link.hello_done {
            return Err(Malformed("unexpected session hello").into());
        }
        if r.h.aux == 0 || (self.peer_id != 0 && self.peer_id != r.h.aux) {
            return Err(Error::fixed(
                ErrorKind::Closed,
                "the peer restarted (new session identity): session reset",
            ));
        }
        link.hello_done = true;
        self.peer_id = r.h.aux;
        self.on_ack(r.h.aux3, s, ev);
        self.opened(ev);
        Ok(())
    }

    /// The session is (again) open on its link.
    pub fn opened(&mut self, ev: &mut Vec<Event>) {
        self.state = SessionState::Open;
        self.backoff = None;
        self.down_since = None;
        if !self.announced {
            self.announced = true;
            if let Some(p) = self
                .peer
                .or_else(|| self.link.as_ref().map(|l| l.conn.peer()))
            {
                self.peer = Some(p);
                ev.push(Event::Connect(self.sid(), p, self.incoming));
            }
        }
    }

    /// An immediate message (RDMA WRITE WITH IMMEDIATE): the next sequence number, in
    /// order with the others (RC delivers in order); its WRITEs have landed.
    fn on_imm(&mut self, value: u32) -> Result<()> {
        let Some(link) = self.link.as_mut() else {
            return Ok(());
        };
        if !link.hello_done {
            return Err(Malformed("immediate message before the session hello").into());
        }
        let seq = self.delivered + link.rx.len() as u64 + 1;
        link.rx.push_back(RxEntry {
            seq,
            msg_type: MSG_TYPE_IMM,
            front: value.to_le_bytes().to_vec(),
            eager: None,
            segs: Vec::new(),
            reads_in_flight: 0,
        });
        self.counters.imm_received += 1;
        Ok(())
    }

    fn on_msg(&mut self, r: Received, s: &MsgrSettings) -> Result<()> {
        let Some(link) = self.link.as_mut() else {
            return Ok(());
        };
        if !link.hello_done {
            return Err(Malformed("message before the session hello").into());
        }
        match rules::order(self.delivered + link.rx.len() as u64, r.h.seq) {
            Order::Next => {}
            Order::Old => {
                self.counters.duplicates_dropped += 1;
                if let Some(c) = r.data {
                    link.give_back(c);
                }
                return Ok(());
            }
            Order::Gap => {
                if let Some(c) = r.data {
                    link.give_back(c);
                }
                return Err(Malformed("message sequence gap").into());
            }
        }
        let mut entry = RxEntry {
            seq: r.h.seq,
            msg_type: r.h.msg_type,
            front: r.front,
            eager: None,
            segs: Vec::new(),
            reads_in_flight: 0,
        };
        if r.h.has(flags::RNDV) {
            let Some(c) = r.data else {
                return Err(Malformed("rendezvous message without a descriptor block").into());
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
                self.counters.oversized += 1;
                warn_oversized(self.id, self.peer, &e);
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
            self.counters.read_segments += entry.segs.len() as u64;
        } else if r.h.nsegs == 1 {
            match r.data {
                Some(c) => entry.eager = Some((c, r.h.payload_len as usize)),
                None => entry.eager = None,
            }
            self.counters.eager_segments += 1;
            if r.h.has(flags::WRITTEN) {
                self.counters.written_segments += 1;
            }
        } else if let Some(c) = r.data {
            link.give_back(c);
        }
        link.rx.push_back(entry);
        Ok(())
    }

    /// Whether this pass may skip the session: open on a link with no completion queued,
    /// nothing being received, nothing to send, acknowledge, announce, repost or ping, and
    /// the peer not overdue (no keepalive due). A pass looks at such a session for the
    /// price of this check (its fields and an atomic load per CQ), not a poll and a pump,
    /// and after `PARK_AFTER` of it not at all (`park.rs`): `TEST=rpc_lat
    /// bench/scale.sh`, 1,000 idle sessions beside a busy one.
    pub fn quiet(&self, now: Instant, s: &MsgrSettings) -> bool {
        let Some(link) = self.link.as_ref() else {
            return false;
        };
        self.state == SessionState::Open
            && link.hello_done
            && self.waiting.is_empty()
            && self.delivered <= self.acked_to_peer
            && !self.ack_deferred
            && link.is_quiet()
            && !link.credits.announce_due()
            && link
                .live
                .next_due(s.keepalive, s.keepalive_timeout)
                .is_none_or(|t| now < t)
            && !link.conn.may_have_completions()
    }

    /// The protocol steps after a poll: READs, in-order delivery, receives, sends within
    /// credits, acknowledgement/credit/keepalive messages. `Err` = a fault.
    pub fn pump(
        &mut self,
        now: Instant,
        s: &MsgrSettings,
        data_pool: &Arc<Pool>,
        ev: &mut Vec<Event>,
    ) -> Result<()> {
        let sid = self.sid();
        let Some(link) = self.link.as_mut() else {
            return Ok(());
        };
        // READs of rendezvous messages, oldest first.
        for i in 0..link.rx.len() {
            let all_posted = link.rx[i]
                .segs
                .iter()
                .all(|g| g.next >= g.desc.len as usize);
            if !all_posted && !link.post_reads(i)? {
                break;
            }
        }
        // Deliver in order.
        let mut delivered_now = false;
        while link.rx.front().is_some_and(|e| e.complete()) {
            delivered_now = true;
            let Some(e) = link.rx.pop_front() else { break };
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
            self.delivered = e.seq;
            self.counters.msgs_received += 1;
            self.counters.bytes_received += bytes;
            ev.push(Event::Message(
                sid,
                InMessage {
                    msg_type: e.msg_type,
                    seq: e.seq,
                    front: e.front,
                    data,
                },
            ));
        }
        link.replenish()?;
        if !link.hello_done {
            return Ok(());
        }
        // Messages, within credits.
        let max_sge = link.max_sge();
        while let Some(m) = self.waiting.front() {
            if !link.credits.can_send_data() || link.data_room() < m.sq_need(max_sge) {
                if !self.stalled {
                    self.stalled = true;
                    self.counters.credit_stalls += 1;
                }
                break;
            }
            self.stalled = false;
            if let Some(v) = m.imm {
                // No header: no acknowledgement or credits ride on it (`acked_to_peer`
                // stays; the ACK logic below sends them).
                link.queue_imm(&m.writes, v)?;
                self.counters.imm_sent += 1;
            } else {
                let mut h = Header::new(Kind::Msg);
                h.seq = m.seq;
                h.ack = self.delivered;
                h.msg_type = m.msg_type;
                h.nsegs = m.segs.len() as u16;
                h.front_len = m.front.len() as u32;
                if rules::starved(self.waiting.len() - 1, link.credits.tx) {
                    h.flags |= flags::STARVED;
                }
                if m.eager(s.eager_max, max_sge) {
                    let body = match m.segs.first() {
                        Some(g) => Body::Eager(&g.parts, &g.lkeys),
                        None => Body::None,
                    };
                    link.queue_msg(&mut h, &m.front, body, &m.writes)?;
                } else {
                    h.flags |= flags::RNDV;
                    let mut block = [0u8; PAYLOAD_MAX];
                    let n =
                        wire::emit_block(&mut block, &m.front, &m.descs()).ok_or_else(|| {
                            Error::fixed(ErrorKind::InvalidArgument, "descriptor block too large")
                        })?;
                    link.queue_msg(&mut h, &[], Body::Block(&block[..n]), &m.writes)?;
                }
                self.acked_to_peer = self.delivered;
            }
            if let Some(mut m) = self.waiting.pop_front() {
                if m.replay {
                    self.counters.replays += 1;
                } else {
                    self.counters.msgs_sent += 1;
                    self.counters.bytes_sent += m.bytes;
                }
                self.counters.remote_writes += m.writes.len() as u64;
                self.counters.remote_write_bytes +=
                    m.writes.iter().map(|w| w.seg.len as u64).sum::<u64>();
                m.replay = true;
                self.unacked.push_back(m);
            }
        }
        // Acknowledgement, credits, keepalive. An acknowledgement or a credit announcement
        // due after messages were delivered in this pass waits one pass: their callbacks
        // run after it, and an answer sent from one (a reply) carries both. A pass that
        // delivers nothing new sends them; so does this one when the peer is down to its
        // control credit. (Announcing at once cost request/reply a control message each
        // way per round trip, and each consumed a receive whose repost was owed again:
        // twice the SENDs of the exchange itself.)
        if link.sent_in_pass {
            link.live.last_sent = now;
        }
        // The decision is the session machine's rule (`machine::rules::control`).
        let c = rules::control(ControlIn {
            ack_owed: self.delivered > self.acked_to_peer,
            sent_in_pass: link.sent_in_pass,
            delivered_in_pass: delivered_now,
            ack_deferred: self.ack_deferred,
            announce_due: link.credits.announce_due(),
            ping_due: link.live.ping_due(now, s.keepalive),
            peer_can_send_data: link.credits.peer_can_send_data(),
            can_send_control: link.credits.can_send_control(),
            sq_free: link.sq_room(),
        });
        self.ack_deferred = c.deferred;
        if c.needs_receive {
            // Posted by the next pass (the session is not quiet with a deficit).
            link.credits.room_to_speak();
        }
        if let Some(kind) = c.frame {
            let ping = kind == Kind::Ping;
            let mut h = Header::new(kind);
            h.ack = self.delivered;
            // Out of credits with messages waiting: say so here too (immediate messages
            // carry no header, so a side that sends only those grows the peer's window
            // through its ACKs).
            if self.stalled || (self.waiting.len() > 1 && link.credits.tx <= 2) {
                h.flags |= flags::STARVED;
            }
            link.queue(&mut h, &[], Body::None)?;
            self.acked_to_peer = self.delivered;
            if ping {
                self.counters.keepalives_sent += 1;
                link.credits.shrink();
            }
        }
        if link.sent_in_pass {
            self.ack_deferred = false;
            // Stamped here too: the acknowledgement or keepalive just queued counts (a
            // receiver that only acknowledges must not look silent and ping every pass).
            link.live.last_sent = now;
        }
        link.sent_in_pass = false;
        link.flush()?;
        self.counters.rnr_naks += link.take_rnr();
        self.counters.send_completions += std::mem::take(&mut link.send_wcs);
        self.counters.partial_posts += std::mem::take(&mut link.partial_posts);
        if link.live.dead(now, s.keepalive, s.keepalive_timeout) {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "keepalive: nothing heard from the peer for {:?}",
                    s.keepalive_timeout
                ),
            ));
        }
        Ok(())
    }
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

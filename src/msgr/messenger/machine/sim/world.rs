//! Two processes driving session machines through simulated links: process 0 connects
//! (one session at a time; a new one after a reset), process 1 accepts (its sessions are
//! made by hellos, as `shard.rs` does: resume a known session, refuse a resume of an
//! unknown one, reset the sessions of an older incarnation at the connector's address).
//! Each event is followed by a pass of the process it concerns, as a shard's worker runs
//! one: timers, receives reposted within the pool, delivery in order, the pump.

use super::ledger::Ledger;
use super::net::{Ev, Fault, Frame, Link, MS, Ns, Queue, Rng, US};
use crate::error::{Error, ErrorKind};
use crate::msgr::messenger::credits::Credits;
use crate::msgr::messenger::machine::{Action, Machine, Notice, Rules, SqRoom};
use crate::msgr::messenger::types::{PathEvent, Policy, SessionState};
use crate::msgr::messenger::wire::Header;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The connecting process and the accepting one.
pub const CONN: usize = 0;
pub const ACC: usize = 1;
/// Send-queue entries of a link end.
pub const MAX_SQ: usize = 32;
/// Most links a simulated session holds at once (one per path, 3 paths, and a link
/// being replaced).
pub const MAX_LINKS: usize = 8;
/// How long RC retries through a black hole before RETRY_EXC_ERR.
pub const RETRY_BUDGET: Ns = 10 * MS;

/// One run's settings, drawn from its seed.
#[derive(Debug, Clone)]
pub struct Params {
    pub rules: Rules,
    pub lossy: bool,
    /// Messages each process's application sends in all.
    pub quota: [u32; 2],
    /// Receive chunks each process has (its pool).
    pub pool: [u32; 2],
    /// The application holds what it received for a while (`Release` gives it back).
    pub slow: [bool; 2],
    /// The connector listens (its hello names its address: a restart is seen at once).
    pub conn_listens: bool,
    /// Gap between an application's sends.
    pub send_gap: Ns,
    /// The connector's paths to the acceptor (1 = a session as before issue 30).
    pub paths: usize,
    /// Path policy active/active (every joined path carries data); standby if false.
    pub active: bool,
    pub faults: Vec<(Ns, Fault)>,
}

pub struct Sess {
    pub m: Machine<u64>,
    /// The machine's link ids and the simulated links of the session (one per path at
    /// most), and which one is active (its traffic).
    pub links: Vec<(u64, usize)>,
    pub active: Option<u64>,
    /// Accepted messages (sequence number, message id, link) not yet delivered, by
    /// sequence number (active/active accepts them out of order across links).
    pub rx: VecDeque<(u64, Option<u64>, u64)>,
}

#[derive(Default)]
pub struct Proc {
    pub inc: u64,
    pub sessions: Vec<Option<Sess>>,
    /// Free receive chunks, and chunks the slow application holds.
    pub pool: u32,
    pub held: u32,
    /// Accepted links waiting for their hello, with their credits.
    pub pending: Vec<(usize, Credits)>,
    pub by_peer: FxHashMap<u64, usize>,
    pub entities: FxHashMap<SocketAddr, u64>,
    /// Messages its application sent, and whether it waits for `Ready`.
    pub sent: u32,
    pub waits_ready: bool,
    pub next_wake: Option<Ns>,
}

pub struct World {
    pub now: Ns,
    t0: Instant,
    pub rng: Rng,
    pub q: Queue,
    pub links: Vec<Link>,
    pub procs: [Proc; 2],
    pub ledger: Ledger,
    pub p: Params,
    pub next_id: u64,
    /// A black hole on each path: nothing crosses it from the first instant to the second.
    pub holes: Vec<Option<(Ns, Ns)>>,
    /// Path events seen (down, up, active) at either side.
    pub path_events: [u32; 3],
    /// Sessions reset (lossless ones, and all).
    pub resets: [u32; 2],
    pub trace: Option<Vec<String>>,
    pub err: Option<String>,
}

pub fn conn_addr() -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], 6800))
}

impl World {
    pub fn new(p: Params, rng: Rng, trace: bool) -> World {
        let mut w = World {
            now: 0,
            t0: Instant::now(),
            rng,
            q: Queue::default(),
            links: Vec::new(),
            procs: [Proc::default(), Proc::default()],
            ledger: Ledger::default(),
            next_id: 1,
            holes: vec![None; p.paths.max(1)],
            path_events: [0; 3],
            resets: [0; 2],
            trace: trace.then(Vec::new),
            err: None,
            p,
        };
        for side in [CONN, ACC] {
            w.procs[side].inc = w.rng.next() | 1;
            w.procs[side].pool = w.p.pool[side];
            w.q.push(0, Ev::AppSend { side });
            if w.p.slow[side] {
                w.q.push(MS, Ev::Release { side });
            }
        }
        for &(t, f) in &w.p.faults {
            w.q.push(t, Ev::Fault(f));
        }
        w.open_session();
        w
    }

    pub fn at(&self) -> Instant {
        self.t0 + Duration::from_nanos(self.now)
    }

    pub fn violation(&mut self, what: String) {
        if self.err.is_none() {
            self.err = Some(format!("t={}us: {what}", self.now / US));
        }
    }

    pub fn log(&mut self, f: impl FnOnce() -> String) {
        if let Some(t) = self.trace.as_mut() {
            t.push(format!("{:>10}us {}", self.now / US, f()));
        }
    }

    pub fn policy(&self) -> Policy {
        if self.p.lossy {
            Policy::Lossy
        } else {
            Policy::Lossless
        }
    }

    pub fn sess(&mut self, side: usize, si: usize) -> Option<&mut Sess> {
        self.procs[side].sessions.get_mut(si)?.as_mut()
    }

    /// The connector's application opens a session (at start, and after a reset).
    pub fn open_session(&mut self) {
        let id = self.next_id << 8;
        self.next_id += 1;
        let now = self.at();
        let mut m = Machine::new(self.p.rules, id, self.policy(), false, now);
        m.set_active(self.p.active);
        for _ in 1..self.p.paths {
            m.add_path(now);
        }
        self.procs[CONN].sessions.push(Some(Sess {
            m,
            links: Vec::new(),
            active: None,
            rx: VecDeque::new(),
        }));
        self.log(|| format!("conn: new session {id:#x}"));
        self.wake(CONN, self.now);
    }

    pub fn wake(&mut self, side: usize, at: Ns) {
        let at = at.max(self.now);
        if self.procs[side]
            .next_wake
            .is_none_or(|t| at < t || t < self.now)
        {
            self.procs[side].next_wake = Some(at);
            self.q.push(at, Ev::Wake { side });
        }
    }

    pub fn handle(&mut self, t: Ns, ev: Ev) {
        self.now = t;
        if self.trace.is_some() {
            let s = format!("{ev:?}");
            self.log(|| s);
        }
        let side = match ev {
            Ev::Arrive { link, to, frame } => {
                self.arrive(link, to, frame);
                to
            }
            Ev::SqDone {
                link,
                side,
                entries,
            } => {
                let l = &mut self.links[link];
                l.sq[side] = l.sq[side].saturating_sub(entries);
                side
            }
            Ev::LinkErr { link, side, why } => {
                self.link_err(link, side, why);
                side
            }
            Ev::Connected { sess, inc, path } => {
                if self.procs[CONN].inc == inc {
                    self.connected(sess, path);
                }
                CONN
            }
            Ev::Wake { side } => {
                if self.procs[side].next_wake == Some(t) {
                    self.procs[side].next_wake = None;
                }
                side
            }
            Ev::AppSend { side } => {
                self.app_send(side);
                side
            }
            Ev::Release { side } => {
                let pr = &mut self.procs[side];
                let n = pr.held.min(2);
                pr.held -= n;
                pr.pool += n;
                let gap = self.rng.range(200 * US, 3 * MS);
                self.q.push(t + gap, Ev::Release { side });
                side
            }
            Ev::Fault(f) => {
                self.fault(f);
                return;
            }
        };
        self.pass(side);
    }

    /// One pass of a process over its sessions.
    pub fn pass(&mut self, side: usize) {
        for si in 0..self.procs[side].sessions.len() {
            self.drive(side, si);
        }
        // Accepted links waiting for a hello keep their window posted.
        let mut pend = std::mem::take(&mut self.procs[side].pending);
        for (li, c) in pend.iter_mut() {
            let k = c.deficit().min(self.procs[side].pool);
            self.procs[side].pool -= k;
            self.links[*li].posted[side] += k;
            c.on_posted(k);
        }
        self.procs[side].pending = pend;
        let mut next: Option<Ns> = None;
        for s in self.procs[side].sessions.iter().flatten() {
            // A pass that needs receives waits for the pool (a release brings a pass).
            let starved = s.m.receives_wanted_all() > 0 && self.procs[side].pool == 0;
            let t = if s.m.wants_pass() && !starved {
                Some(self.now + US)
            } else {
                s.m.poll_timeout()
                    .map(|i| i.saturating_duration_since(self.t0).as_nanos() as Ns)
            };
            next = match (next, t) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        if let Some(t) = next {
            self.wake(side, t.max(self.now + 1));
        }
    }

    fn drive(&mut self, side: usize, si: usize) {
        let now = self.at();
        let Some(s) = self.sess(side, si) else { return };
        if s.m.state == SessionState::Closed && s.links.is_empty() {
            return;
        }
        s.m.handle_timeout(now);
        self.exec(side, si);
        // Receives up to the window on every link, as the pool allows.
        let mut links = [(0u64, 0usize); MAX_LINKS];
        let n = match self.sess(side, si) {
            Some(s) => {
                let n = s.links.len().min(MAX_LINKS);
                links[..n].copy_from_slice(&s.links[..n]);
                n
            }
            None => 0,
        };
        for &(lid, li) in &links[..n] {
            let pool = self.procs[side].pool;
            let Some(s) = self.sess(side, si) else { return };
            let k = s.m.receives_wanted_on(lid).min(pool);
            s.m.on_posted(lid, k);
            self.procs[side].pool -= k;
            self.links[li].posted[side] += k;
        }
        // Delivery, in order, of what nothing is missing before.
        let slow = self.p.slow[side];
        let lossy = self.p.lossy;
        while let Some(s) = self.sess(side, si)
            && s.rx.front().is_some_and(|e| e.0 <= s.m.deliverable())
            && let Some((seq, body, _)) = s.rx.pop_front()
        {
            let (me, peer) = (s.m.id, s.m.peer_id);
            s.m.on_delivered(seq);
            if let Some(b) = body
                && let Err(e) = self.ledger.on_deliver(me, peer, seq, b, lossy)
            {
                self.violation(e);
            }
            if slow {
                self.procs[side].held += 1;
            } else {
                self.procs[side].pool += 1;
            }
        }
        let (mut links, active) = (
            [(0u64, 0usize); MAX_LINKS],
            self.sess(side, si).and_then(|s| s.active),
        );
        let n = match self.sess(side, si) {
            Some(s) => {
                let n = s.links.len().min(MAX_LINKS);
                links[..n].copy_from_slice(&s.links[..n]);
                n
            }
            None => return,
        };
        for &(lid, li) in &links[..n] {
            let free = MAX_SQ.saturating_sub(self.links[li].sq[side]);
            let Some(s) = self.sess(side, si) else { return };
            if Some(lid) == active {
                s.m.pump(now, SqRoom { free, reserve: 1 });
            } else {
                s.m.pump_standby(now, lid, SqRoom { free, reserve: 1 });
            }
            self.exec(side, si);
        }
        self.exec(side, si);
    }

    /// Carries out a session's actions.
    pub fn exec(&mut self, side: usize, si: usize) {
        loop {
            let Some(s) = self.sess(side, si) else { return };
            let Some(a) = s.m.poll_action() else { return };
            let id = s.m.id;
            // The session's links (at most one per path): a copy without an allocation.
            let mut links = [(0u64, 0usize); MAX_LINKS];
            let n = s.links.len().min(MAX_LINKS);
            links[..n].copy_from_slice(&s.links[..n]);
            let find = |l: u64| links[..n].iter().copied().find(|c| c.0 == l);
            if self.trace.is_some() {
                let txt = format!("  {} sess {id:#x}: {a:?}", ["conn", "acc"][side]);
                self.log(|| txt);
            }
            match a {
                Action::Connect { path } => {
                    let d = self.rng.range(100 * US, 2 * MS);
                    let inc = self.procs[side].inc;
                    self.q.push(
                        self.now + d,
                        Ev::Connected {
                            sess: si,
                            inc,
                            path,
                        },
                    );
                }
                Action::Activate { link } => {
                    let Some(s) = self.sess(side, si) else { return };
                    if s.links.iter().all(|c| c.0 != link) {
                        self.violation(format!("activate link {link}, not the session's"));
                        return;
                    }
                    if s.active != Some(link) {
                        s.active = Some(link);
                        // What the old active link was receiving comes again (active/active:
                        // nothing moves, the link is only the first one pumped).
                        if !s.m.is_active() {
                            let n = s.rx.len() as u32;
                            s.rx.clear();
                            self.procs[side].pool += n;
                        }
                    }
                }
                Action::Post {
                    link,
                    header,
                    msg,
                    owed,
                } => {
                    if header.credits > owed {
                        let c = header.credits;
                        self.violation(format!("announced {c} credits of {owed} owed"));
                    }
                    let Some((lid, li)) = find(link) else {
                        self.violation(format!("post on link {link}, not the session's"));
                        return;
                    };
                    let s = self.sess(side, si).expect("session");
                    let (body, need) = match msg {
                        Some(seq) => match s.m.unacked(seq) {
                            Some(o) => (Some(o.body), o.shape.sq_need),
                            None => {
                                self.violation(format!("post of {seq}, not held"));
                                return;
                            }
                        },
                        None => (None, 1),
                    };
                    let f = Frame {
                        header,
                        imm: false,
                        body,
                    };
                    if !self.post(side, li, f, need) {
                        let now = self.at();
                        let s = self.sess(side, si).expect("session");
                        s.m.on_link_error(
                            now,
                            lid,
                            Error::fixed(ErrorKind::Closed, "post refused"),
                        );
                    }
                }
                Action::PostImm { link, seq, value } => {
                    let Some((lid, li)) = find(link) else {
                        self.violation(format!("immediate on link {link}, not the session's"));
                        return;
                    };
                    let s = self.sess(side, si).expect("session");
                    let Some((body, need, imm)) =
                        s.m.unacked(seq)
                            .map(|o| (o.body, o.shape.sq_need, o.shape.imm))
                    else {
                        self.violation(format!("immediate {seq}, not held"));
                        return;
                    };
                    if imm != Some(value) {
                        self.violation(format!("immediate {seq} carries {value}, not {imm:?}"));
                    }
                    let f = Frame {
                        header: Header::default(),
                        imm: true,
                        body: Some(body),
                    };
                    if !self.post(side, li, f, need) {
                        let now = self.at();
                        let s = self.sess(side, si).expect("session");
                        s.m.on_link_error(
                            now,
                            lid,
                            Error::fixed(ErrorKind::Closed, "post refused"),
                        );
                    }
                }
                Action::CloseLink { link, drain } => {
                    if let Some((_, li)) = find(link) {
                        self.close_end(side, li, drain);
                        let s = self.sess(side, si).expect("session");
                        s.links.retain(|c| c.0 != link);
                        if s.m.is_active() {
                            // What this link brought and was not delivered goes with it.
                            let n = s.rx.len();
                            s.rx.retain(|e| e.2 != link);
                            let back = (n - s.rx.len()) as u32;
                            if s.active == Some(link) {
                                s.active = None;
                            }
                            self.procs[side].pool += back;
                        } else if s.active == Some(link) {
                            s.active = None;
                            let n = s.rx.len() as u32;
                            s.rx.clear();
                            self.procs[side].pool += n;
                        }
                    }
                }
                Action::Notify(Notice::Connected) => {}
                Action::Notify(Notice::Path(path, ev)) => {
                    let k = match ev {
                        PathEvent::Down(_) => 0,
                        PathEvent::Up => 1,
                        PathEvent::Active => 2,
                    };
                    self.path_events[k] += 1;
                    if path >= self.p.paths.max(1) {
                        self.violation(format!("event of path {path}: no such path"));
                    }
                }
                Action::Notify(Notice::SendDone(seq, r)) => {
                    // A lossy session that went on on another path reports in doubt what
                    // the failed one carried.
                    let in_doubt = self.p.lossy
                        && r.as_ref()
                            .is_err_and(crate::msgr::messenger::machine::is_in_doubt);
                    let s = self.sess(side, si).expect("session");
                    if r.is_err() && s.m.state != SessionState::Closed && !in_doubt {
                        self.violation(format!("send {seq} failed on a session not ended"));
                    }
                    if let Err(e) = self.ledger.on_done(id, seq, r.is_ok()) {
                        self.violation(e);
                    }
                }
                Action::Notify(Notice::Ready) => {
                    if self.procs[side].waits_ready {
                        self.procs[side].waits_ready = false;
                        self.q.push(self.now, Ev::AppSend { side });
                    }
                }
                Action::Notify(Notice::Reset(why)) => {
                    self.resets[side] += 1;
                    if std::env::var_os("RDMX_MSGR_SIM_WHY").is_some() {
                        eprintln!("reset side {side} lossy {}: {why}", self.p.lossy);
                    }
                    // The application goes on with its next session.
                    self.procs[side].waits_ready = false;
                    self.q.push(self.now, Ev::AppSend { side });
                    if side == CONN {
                        self.open_session();
                    }
                }
            }
        }
    }
}

impl World {
    /// Both applications sent everything, every send completed (or died), and every session
    /// is open or ended (none waits for a reconnect).
    pub fn settled(&self) -> bool {
        self.procs[CONN].sent >= self.p.quota[CONN]
            && self.procs[ACC].sent >= self.p.quota[ACC]
            && self.ledger.pending() == 0
            && self.procs.iter().all(|p| {
                p.sessions
                    .iter()
                    .flatten()
                    .all(|s| matches!(s.m.state, SessionState::Open | SessionState::Closed))
            })
    }
}

impl World {
    /// The processes' pools and sessions, for a failure message.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for (i, p) in self.procs.iter().enumerate() {
            out += &format!(
                "[proc {i}: pool {} held {} pending links {}; ",
                p.pool,
                p.held,
                p.pending.len()
            );
            for s in p.sessions.iter().flatten() {
                out += &format!(
                    "sess {:#x} {:?} queued {} unacked {} links {:?} active {:?} credits {:?}; ",
                    s.m.id,
                    s.m.state,
                    s.m.queued(),
                    s.m.unacked_len(),
                    s.links,
                    s.active,
                    s.m.link().map(|l| &l.credits)
                );
            }
            out += "] ";
        }
        out
    }
}

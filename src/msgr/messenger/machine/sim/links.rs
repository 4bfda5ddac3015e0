//! The network side of the simulated processes: posting on a link (where the credit and
//! send-queue invariants are checked), frames arriving, links failing and closing,
//! connection attempts, and the accepting side's hello handling.

use super::net::{Ev, Frame, Link, MS, US};
use super::world::{ACC, CONN, MAX_SQ, RETRY_BUDGET, Sess, World, conn_addr};
use crate::error::{Error, ErrorKind};
use crate::msgr::messenger::credits::Credits;
use crate::msgr::messenger::machine::{HelloId, Machine, Verdict};
use crate::msgr::messenger::types::{Policy, SessionState};
use crate::msgr::messenger::wire::{Header, Kind, flags};
use std::collections::VecDeque;

impl World {
    /// Posts `f` from `side` on link `li`, taking `need` send-queue entries. False: the
    /// link refused it (its QP failed).
    pub(super) fn post(&mut self, side: usize, li: usize, f: Frame, need: usize) -> bool {
        let to = 1 - side;
        let now = self.now;
        let l = &mut self.links[li];
        if l.failed || !l.open[side] {
            return false;
        }
        if l.posted[to] <= l.in_flight[to] {
            let (p, i) = (l.posted[to], l.in_flight[to]);
            self.violation(format!(
                "side {side} sent without a credit ({p} receives posted, {i} in flight)"
            ));
            return false;
        }
        if l.sq[side] + need > MAX_SQ {
            let u = l.sq[side];
            self.violation(format!("send queue overrun: {u} + {need} > {MAX_SQ}"));
            return false;
        }
        l.sq[side] += need;
        l.in_flight[to] += 1;
        let delay = 5 * US + self.rng.below(25 * US);
        let mut arrive = (now + delay).max(l.last_arrival[to]);
        if let Some((start, end)) = self.holes[l.path]
            && arrive >= start
            && arrive < end
        {
            if end - now > RETRY_BUDGET {
                // RC gives up on it: RETRY_EXC_ERR at the sender; the frame (or only the
                // acknowledgement of it) was lost in the hole: in doubt.
                let l = &mut self.links[li];
                if l.retry_at[side].is_none() {
                    l.retry_at[side] = Some(now + RETRY_BUDGET);
                    self.q.push(
                        now + RETRY_BUDGET,
                        Ev::LinkErr {
                            link: li,
                            side,
                            why: "retry exceeded",
                        },
                    );
                }
                if !self.rng.pct(30) {
                    let l = &mut self.links[li];
                    l.cutoff[to] = l.cutoff[to].min(arrive.saturating_sub(1));
                }
            } else {
                arrive = end + delay;
            }
        }
        let l = &mut self.links[li];
        l.last_arrival[to] = arrive;
        self.q.push(
            arrive,
            Ev::Arrive {
                link: li,
                to,
                frame: f,
            },
        );
        self.q.push(
            arrive + delay,
            Ev::SqDone {
                link: li,
                side,
                entries: need,
            },
        );
        true
    }

    /// `side` lets go of its end of link `li`: its posted receives return to its pool, the
    /// QP is gone, and the peer learns by the side channel a little later (after what was
    /// in flight to it, or part of it).
    pub(super) fn close_end(&mut self, side: usize, li: usize, drain: bool) {
        let to = 1 - side;
        let now = self.now;
        let keep = if drain { MS } else { self.rng.below(200 * US) };
        let eof = now + self.rng.range(50 * US, 3 * MS);
        let l = &mut self.links[li];
        if !l.open[side] {
            return;
        }
        l.open[side] = false;
        l.failed = true;
        let back = l.posted[side];
        l.posted[side] = 0;
        l.cutoff[to] = l.cutoff[to].min(now + keep);
        let peer_open = l.open[to];
        self.procs[side].pool += back;
        if peer_open {
            self.q.push(
                eof,
                Ev::LinkErr {
                    link: li,
                    side: to,
                    why: "side channel EOF",
                },
            );
        }
    }

    pub(super) fn arrive(&mut self, li: usize, to: usize, f: Frame) {
        let now = self.now;
        let l = &mut self.links[li];
        l.in_flight[to] = l.in_flight[to].saturating_sub(1);
        if !l.open[to] || now > l.cutoff[to] || l.inc[to] != self.procs[to].inc {
            return; // lost with the link
        }
        l.posted[to] -= 1;
        let Some(si) = l.sess[to] else {
            return self.first_frame(li, f);
        };
        let Some(lid) = l.lid[to] else { return };
        let at = self.at();
        let Some(s) = self.sess(to, si) else {
            self.procs[to].pool += 1;
            return;
        };
        let v = if f.imm {
            s.m.on_imm(at, lid)
        } else {
            s.m.on_frame(at, lid, &f.header)
        };
        match v {
            Verdict::Accept(seq) => {
                if s.active != Some(lid) && !s.m.is_active() {
                    self.violation(format!(
                        "a message accepted on link {lid}, not the active one"
                    ));
                    return;
                }
                if s.rx.iter().any(|e| e.0 == seq) {
                    self.violation(format!("message {seq} accepted twice"));
                    return;
                }
                let at = s.rx.partition_point(|e| e.0 < seq);
                s.rx.insert(at, (seq, f.body, lid));
            }
            _ => self.procs[to].pool += 1,
        }
        self.exec(to, si);
    }

    pub(super) fn link_err(&mut self, li: usize, side: usize, why: &'static str) {
        let l = &mut self.links[li];
        l.failed = true;
        l.cutoff[side] = l.cutoff[side].min(self.now);
        if !l.open[side] || l.inc[side] != self.procs[side].inc {
            return;
        }
        match (l.sess[side], l.lid[side]) {
            (Some(si), Some(lid)) => {
                let at = self.at();
                if let Some(s) = self.sess(side, si) {
                    s.m.on_link_error(at, lid, Error::fixed(ErrorKind::Closed, why));
                }
                self.exec(side, si);
            }
            _ => {
                // An accepted link that never said hello.
                self.procs[side].pending.retain(|(p, _)| *p != li);
                self.close_end(side, li, false);
            }
        }
    }

    /// A connection attempt of the connector's session `si` ends: made (receives posted
    /// on both sides by the on-connect hooks, the accepting side waits for the hello) or
    /// refused (the accepting side's pool could not post, or a connect failure).
    pub(super) fn connected(&mut self, si: usize, path: usize) {
        let w = self.p.rules.recv_window_min;
        let refused = self.procs[ACC].pool < w || self.procs[CONN].pool < w || self.rng.pct(5);
        let at = self.at();
        let inc = self.procs[CONN].inc;
        let port = if self.p.conn_listens { 6800 } else { 0 };
        let credits = self.p.rules.credits(w);
        let li = self.links.len();
        let Some(s) = self.sess(CONN, si) else { return };
        if !s.m.attempting(path) {
            return;
        }
        if refused {
            s.m.attempt_failed(at, path, Error::fixed(ErrorKind::Io, "connect refused"));
            return self.exec(CONN, si);
        }
        let id = HelloId {
            claimed: None,
            incarnation: inc,
            port,
        };
        let lid = s.m.link_up(at, path, credits, id);
        s.links.push((lid, li));
        if s.m.link().is_some_and(|l| l.lid == lid) {
            s.active = Some(lid);
        }
        self.links.push(Link {
            path,
            lid: [Some(lid), None],
            sess: [Some(si), None],
            open: [true, true],
            posted: [w, w],
            cutoff: [u64::MAX, u64::MAX],
            inc: [inc, self.procs[ACC].inc],
            ..Link::default()
        });
        for side in [CONN, ACC] {
            self.procs[side].pool -= w;
        }
        self.procs[ACC].pending.push((li, self.p.rules.credits(w)));
        self.exec(CONN, si);
    }

    /// The first frame of an accepted link: its hello (anything else is malformed and
    /// closes it), handled as `Core::attach_incoming` does.
    fn first_frame(&mut self, li: usize, f: Frame) {
        self.procs[ACC].pool += 1;
        let Some(k) = self.procs[ACC].pending.iter().position(|(p, _)| *p == li) else {
            return;
        };
        let (_, mut credits) = self.procs[ACC].pending.swap_remove(k);
        let h = f.header;
        if f.imm || h.kind() != Some(Kind::Hello) {
            self.violation(format!("an accepted link began with {:?}", h.kind()));
            return self.close_end(ACC, li, false);
        }
        credits.on_receive();
        credits.on_grant(h.credits);
        let at = self.at();
        // Another incarnation at the connector's address: it restarted.
        if h.seq != 0 && h.msg_type != 0 {
            let prev = self.procs[ACC].entities.insert(conn_addr(), h.seq);
            if prev.is_some_and(|p| p != h.seq) {
                for si in 0..self.procs[ACC].sessions.len() {
                    if let Some(s) = self.sess(ACC, si) {
                        s.m.on_peer_incarnation(conn_addr(), h.seq);
                    }
                    self.exec(ACC, si);
                }
            }
        }
        let known = self.procs[ACC].by_peer.get(&h.aux).copied().filter(|&si| {
            self.procs[ACC].sessions[si]
                .as_ref()
                .is_some_and(|s| s.m.state != SessionState::Closed)
        });
        if h.has(flags::JOIN) {
            return self.join(li, known, credits, &h);
        }
        let si = match known {
            Some(si) => si,
            None if h.aux2 != 0 || h.aux == 0 => {
                // It resumes a session this process does not have: a hello without an
                // identity says so, and the link goes.
                let r = Frame {
                    header: Header::new(Kind::Hello),
                    imm: false,
                    body: None,
                };
                self.post(ACC, li, r, 1);
                return self.close_end(ACC, li, true);
            }
            None => {
                let id = (self.next_id << 8) | 1;
                self.next_id += 1;
                let policy = if h.has(flags::LOSSY) {
                    Policy::Lossy
                } else {
                    Policy::Lossless
                };
                let mut m = Machine::new(self.p.rules, id, policy, true, at);
                if h.seq != 0 && h.msg_type != 0 {
                    m.peer_entity = Some((conn_addr(), h.seq));
                }
                self.procs[ACC].sessions.push(Some(Sess {
                    m,
                    links: Vec::new(),
                    active: None,
                    rx: VecDeque::new(),
                }));
                let si = self.procs[ACC].sessions.len() - 1;
                self.procs[ACC].by_peer.insert(h.aux, si);
                si
            }
        };
        let Some(s) = self.sess(ACC, si) else { return };
        let lid = s.m.accept_link(at, credits, &h);
        let mut back = 0;
        if s.active.take().is_some() {
            // What the previous link was receiving comes again.
            back = s.rx.len() as u32;
            s.rx.clear();
        }
        s.links.push((lid, li));
        s.active = Some(lid);
        self.procs[ACC].pool += back;
        self.links[li].lid[ACC] = Some(lid);
        self.links[li].sess[ACC] = Some(si);
        // The links it had (their CloseLink actions name them) go in this exec.
        self.exec(ACC, si);
    }

    /// A path-join hello: the link becomes a standby path of the session it names (as
    /// `Core::attach_incoming` does); one naming no open session is refused (a hello
    /// without an identity) and closed.
    fn join(&mut self, li: usize, known: Option<usize>, credits: Credits, h: &Header) {
        let Some(si) = known else {
            let r = Frame {
                header: Header::new(Kind::Hello),
                imm: false,
                body: None,
            };
            self.post(ACC, li, r, 1);
            return self.close_end(ACC, li, true);
        };
        let at = self.at();
        let Some(s) = self.sess(ACC, si) else { return };
        let lid = s.m.join_link(at, credits, h);
        s.links.push((lid, li));
        self.links[li].lid[ACC] = Some(lid);
        self.links[li].sess[ACC] = Some(si);
        self.exec(ACC, si);
    }
}

//! The applications (each sends its quota of messages, waiting for `Ready` after `Full`),
//! the faults of the schedule, and the bounds checked after every event.

use super::net::{Ev, Fault, MS, US};
use super::world::{ACC, CONN, MAX_LINKS, Proc, World};
use crate::msgr::messenger::machine::Shape;
use crate::msgr::messenger::types::SessionState;
use crate::msgr::messenger::wire::FRONT_INLINE_MAX;

impl World {
    /// The application of `side` sends a burst on its newest open session.
    pub(super) fn app_send(&mut self, side: usize) {
        let quota = self.p.quota[side];
        if self.procs[side].sent >= quota || self.procs[side].waits_ready {
            return;
        }
        let Some(si) = self.procs[side].sessions.iter().rposition(|s| {
            s.as_ref()
                .is_some_and(|s| s.m.state != SessionState::Closed)
        }) else {
            // None yet (the accepting side before a hello): look again later.
            let gap = self.p.send_gap.max(100 * US);
            self.q.push(self.now + gap, Ev::AppSend { side });
            return;
        };
        // Immediate messages: refused on an active/active session (their place among
        // messages arriving on several links is unknown).
        let lossy = self.p.lossy && !self.p.active;
        for _ in 0..self.rng.range(1, 4) {
            if self.procs[side].sent >= quota {
                break;
            }
            let shape = self.shape(lossy);
            // The body is the ledger's id for the message (the next one it records).
            let id = self.ledger.sent.len() as u64;
            let Some(s) = self.sess(side, si) else { return };
            let from = s.m.id;
            match s.m.enqueue(id, shape) {
                Ok(seq) => {
                    self.ledger.on_send(from, seq);
                    self.procs[side].sent += 1;
                }
                Err((_, e)) if e.kind() == crate::error::ErrorKind::Full => {
                    self.procs[side].waits_ready = true;
                    return;
                }
                Err(_) => break,
            }
        }
        let gap = self.rng.below(self.p.send_gap + 1);
        self.q.push(self.now + gap, Ev::AppSend { side });
    }

    fn shape(&mut self, lossy: bool) -> Shape {
        if lossy && self.rng.pct(10) {
            return Shape {
                msg_type: 0xffff,
                imm: Some(self.rng.next() as u32),
                bytes: 4096,
                sq_need: 1,
                writes: 1,
                write_bytes: 4096,
                ..Shape::default()
            };
        }
        let bytes = self.rng.range(1, 9000);
        let rndv = bytes > 4096 || self.rng.pct(10);
        Shape {
            msg_type: 1,
            front_len: self.rng.below(FRONT_INLINE_MAX as u64 + 1) as u32,
            nsegs: 1,
            rndv,
            imm: None,
            bytes,
            sq_need: if rndv { 1 } else { 2 },
            writes: 0,
            write_bytes: 0,
        }
    }

    pub(super) fn fault(&mut self, f: Fault) {
        self.log(|| format!("FAULT {f:?}"));
        match f {
            Fault::QpError(side)
            | Fault::SideChannel(side)
            | Fault::PathQpError(side, _)
            | Fault::PathSideChannel(side, _) => {
                let only = match f {
                    Fault::PathQpError(_, p) | Fault::PathSideChannel(_, p) => Some(p),
                    _ => None,
                };
                let first = if matches!(f, Fault::QpError(_) | Fault::PathQpError(..)) {
                    "completion with status error"
                } else {
                    "side channel closed"
                };
                for li in 0..self.links.len() {
                    let l = &self.links[li];
                    if !(l.open[0] && l.open[1]) || only.is_some_and(|p| p != l.path) {
                        continue;
                    }
                    // Both ends learn, each at its own time, in either order with the
                    // completions still in flight.
                    let (d0, d1) = (self.rng.below(2 * MS), self.rng.below(2 * MS));
                    self.links[li].failed = true;
                    self.q.push(
                        self.now + d0,
                        Ev::LinkErr {
                            link: li,
                            side,
                            why: first,
                        },
                    );
                    self.q.push(
                        self.now + d1,
                        Ev::LinkErr {
                            link: li,
                            side: 1 - side,
                            why: "side channel EOF",
                        },
                    );
                }
            }
            Fault::BlackHole(len) => {
                for h in &mut self.holes {
                    *h = Some((self.now, self.now + len));
                }
            }
            Fault::PathHole(p, len) => {
                if let Some(h) = self.holes.get_mut(p) {
                    *h = Some((self.now, self.now + len));
                }
            }
            Fault::Restart(side) => self.restart(side),
        }
    }

    /// Process `side` dies (its links close: the peer learns by the side channel) and
    /// starts again with a new incarnation and nothing of the old one.
    fn restart(&mut self, side: usize) {
        for li in 0..self.links.len() {
            if self.links[li].open[side] && self.links[li].inc[side] == self.procs[side].inc {
                self.close_end(side, li, false);
            }
        }
        let old = std::mem::take(&mut self.procs[side]);
        for s in old.sessions.into_iter().flatten() {
            self.ledger.died(s.m.id);
        }
        let p = &mut self.procs[side];
        p.inc = self.rng.next() | 1;
        p.pool = self.p.pool[side];
        // The application goes on where the old one stopped (it counts what it sent).
        p.sent = old.sent;
        self.q.push(self.now, Ev::AppSend { side });
        if side == CONN {
            self.open_session();
        }
    }

    /// The bounds every step keeps: held messages within the send-queue bound, receives
    /// posted within the window, the pool's count whole.
    pub(super) fn check_bounds(&mut self) {
        let max_window = self.p.rules.recv_window.max(self.p.rules.recv_window_min);
        for side in [CONN, ACC] {
            let p: &Proc = &self.procs[side];
            for s in p.sessions.iter().flatten() {
                if s.m.held_msgs() > self.p.rules.send_queue_msgs {
                    let n = s.m.held_msgs();
                    return self.violation(format!("{n} messages held: over the bound"));
                }
                let over =
                    s.m.link()
                        .into_iter()
                        .chain(s.m.standby_links())
                        .find(|l| l.credits.posted > max_window)
                        .map(|l| l.credits.posted);
                if let Some(n) = over {
                    return self.violation(format!("{n} receives posted: over the window"));
                }
                // The receiver's hold (active/active): what it accepted and has not
                // delivered, the peer has not had acknowledged, so the peer's send queue
                // bounds it (lossless: a lossy sender forgets what it gave up first).
                if !self.p.lossy && s.rx.len() > self.p.rules.send_queue_msgs {
                    let n = s.rx.len();
                    return self.violation(format!("{n} messages held for delivery"));
                }
                // A link per path at most (and the simulator's copies hold them all).
                if s.links.len() > self.p.paths.max(1) || s.links.len() > MAX_LINKS {
                    let n = s.links.len();
                    return self.violation(format!("{n} links for {} paths", self.p.paths));
                }
            }
            if p.pool + p.held > self.p.pool[side] {
                return self.violation(format!("side {side}: more chunks than the pool"));
            }
        }
        for l in &self.links {
            for side in [CONN, ACC] {
                if l.open[side] && l.posted[side] > max_window {
                    let n = l.posted[side];
                    return self.violation(format!("link: {n} receives posted"));
                }
            }
        }
    }
}

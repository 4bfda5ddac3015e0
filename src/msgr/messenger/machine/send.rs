//! The application's side: sends (sequence numbers, the queue bound), acknowledgements
//! completing them, failing them, and closing the session.

use super::{Action, Machine, Notice, Out, Rules, Shape};
use crate::error::{Error, ErrorKind, Result};
use crate::msgr::messenger::types::{Policy, SessionState};
use crate::msgr::messenger::wire::{Header, Kind};

fn closed_error(what: &str) -> Error {
    Error::new(ErrorKind::Closed, format!("{what}: the session is closed"))
}

/// The send-queue bound (`msgr_send_queue_msgs`/`_bytes`): whether a new message of `bytes`
/// fits beside `held_msgs` messages of `held_bytes` (a single message larger than the byte
/// bound still goes when nothing is held).
pub fn has_room(rules: &Rules, held_msgs: usize, held_bytes: u64, bytes: u64) -> bool {
    held_msgs < rules.send_queue_msgs
        && (held_bytes == 0 || held_bytes + bytes <= rules.send_queue_bytes)
}

/// The checks of a send of `shape` to a session with `policy` (`closed`: it ended) that
/// holds `held_msgs` messages of `held_bytes`: `Closed`, `InvalidArgument` (WRITEs on a
/// lossless session), `Full`. [`Machine::admit`] applies them to what the machine holds;
/// the driver's submit gate (`submit.rs`) to what the machine held at its last pass plus
/// the sends queued for the next, so that a send it accepts is one the machine accepts.
pub fn check_send(
    rules: &Rules,
    policy: Policy,
    closed: bool,
    held_msgs: usize,
    held_bytes: u64,
    shape: &Shape,
) -> Result<()> {
    if closed {
        return Err(closed_error("send"));
    }
    if shape.writes > 0 && policy == Policy::Lossless {
        return Err(Error::fixed(
            ErrorKind::InvalidArgument,
            "send: RDMA WRITEs before a message (OutMessage::writes) need a lossy \
             session: a lossless one would replay the message on a new connection \
             without them",
        ));
    }
    if !has_room(rules, held_msgs, held_bytes, shape.bytes) {
        return Err(Error::new(
            ErrorKind::Full,
            format!(
                "send: the session holds {held_msgs} messages / {held_bytes} bytes (bounds \
                 msgr_send_queue_msgs {}, msgr_send_queue_bytes {}); retry after \
                 on_send_ready",
                rules.send_queue_msgs, rules.send_queue_bytes
            ),
        ));
    }
    Ok(())
}

impl<M> Machine<M> {
    /// Whether a new message of `bytes` fits the bounds ([`has_room`]).
    pub fn has_room(&self, bytes: u64) -> bool {
        has_room(&self.rules, self.held_msgs(), self.held_bytes, bytes)
    }

    /// Checks a send of `shape` before the driver prepares its payload ([`check_send`]);
    /// `Full` is counted, and `Ready` follows when there is room.
    pub fn admit(&mut self, shape: &Shape) -> Result<()> {
        let closed = self.state == SessionState::Closed;
        let r = check_send(
            &self.rules,
            self.policy,
            closed,
            self.held_msgs(),
            self.held_bytes,
            shape,
        )
        .and_then(|()| self.check_active(shape.imm.is_some()));
        if r.as_ref().is_err_and(|e| e.kind() == ErrorKind::Full) {
            self.refused = true;
            self.counters.full_refusals += 1;
        }
        r
    }

    /// Queues an admitted message (the driver prepared its body meanwhile, so the bound is
    /// checked again: the answer is the same as [`Machine::admit`]'s). Returns its
    /// sequence number, the send's id.
    pub fn enqueue(&mut self, body: M, shape: Shape) -> std::result::Result<u64, (M, Error)> {
        if let Err(e) = self.admit(&shape) {
            return Err((body, e));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.held_bytes += shape.bytes;
        self.waiting.push_back(Out {
            seq,
            shape,
            replay: false,
            lid: 0,
            body,
        });
        Ok(seq)
    }

    /// Everything up to `ack` was delivered by the peer: those sends complete (held
    /// replays too: the peer's hello said it has them).
    pub fn on_ack(&mut self, ack: u64) {
        while self.unacked.front().is_some_and(|m| m.seq <= ack) {
            if let Some(m) = self.unacked.pop_front() {
                self.held_bytes -= m.shape.bytes;
                if self.active {
                    self.acked_active(m.lid);
                }
                self.notify(Notice::SendDone(m.seq, Ok(())));
            }
        }
        if self.active {
            self.prune_giveup(ack);
        }
        while self
            .waiting
            .front()
            .is_some_and(|m| m.replay && m.seq <= ack)
        {
            if let Some(m) = self.waiting.pop_front() {
                self.held_bytes -= m.shape.bytes;
                self.notify(Notice::SendDone(m.seq, Ok(())));
            }
        }
        if self.refused && self.has_room(0) {
            self.refused = false;
            self.notify(Notice::Ready);
        }
    }

    /// Every send still held fails with `err`, oldest first.
    pub(super) fn fail_all(&mut self, err: &Error) {
        let held: Vec<u64> = self
            .unacked
            .drain(..)
            .chain(self.waiting.drain(..))
            .map(|m| m.seq)
            .collect();
        for seq in held {
            self.notify(Notice::SendDone(seq, Err(err.clone())));
        }
        self.held_bytes = 0;
    }

    /// The application closes the session: a best-effort bye on an open link (the peer
    /// resets at once instead of waiting), the link drains and closes, held sends fail
    /// with `Closed`; no `Reset`.
    pub fn close(&mut self) {
        self.shut(None);
    }

    /// The driver ends the session for `e` (a callback of it panicked): as
    /// [`Machine::close`], but held sends fail with `e` and `Reset(e)` follows.
    pub fn close_for(&mut self, e: Error) {
        self.shut(Some(e));
    }

    fn shut(&mut self, reset: Option<Error>) {
        if self.state == SessionState::Closed {
            return;
        }
        if let Some(l) = self.link.as_mut()
            && l.hello_done
            && l.credits.can_send_control()
        {
            let mut h = Header::new(Kind::Bye);
            h.ack = self.delivered;
            let lid = l.lid;
            let owed = self.announce(&mut h);
            self.actions.push_back(Action::Post {
                link: lid,
                header: h,
                msg: None,
                owed,
            });
        }
        if let Some(l) = self.link.take() {
            self.actions.push_back(Action::CloseLink {
                link: l.lid,
                drain: true,
            });
        }
        let is_reset = reset.is_some();
        let e = reset.unwrap_or_else(|| Error::fixed(ErrorKind::Closed, "the session was closed"));
        self.end(e, is_reset);
    }
}

//! The submit gate: how an application's `send` hands a message to its session without
//! waiting for the shard's pass.
//!
//! Each session has a [`Gate`]: a short lock (held for a few comparisons and a push, by the
//! sending thread or by the pass, never across a pass or any I/O) over the session's
//! submit queue and what the bound needs to know. A send checks the machine's send rules
//! ([`check_send`]) against what the machine held at its last pass plus what waits here,
//! takes the next sequence number and queues the prepared message; the pass takes the
//! queue into the machine (`Machine::enqueue`, in order) before it sends. Because the gate
//! counts what it let through until the pass has told it what the machine holds, a send the
//! gate accepts is one the machine accepts: nothing is ever queued past the bound, and the
//! sequence numbers it hands out are the machine's.
//!
//! A send refused `Full` here owes the application `on_send_ready`: the pass tells the gate
//! what the machine holds after each step that can free room ([`Gate::sync`]), which says
//! when the Ready is due. The session's end closes the gate in the same pass that ended the
//! machine ([`Gate::close`]): sends after it are refused `Closed`, and those queued before
//! it complete with the session's error before its `on_reset` (`Session::close_gate`).
//!
//! Why a lock per session and not a lock-free queue (crossbeam's `ArrayQueue`): the bound
//! is the session's, in messages and bytes, and must be checked and consumed in one step
//! with the sequence number taken; the queue is taken whole when the session ends. The
//! lock is only ever contended by the pass's take, which swaps two `VecDeque`s.

use crate::error::{Error, ErrorKind, Result};
use parking_lot::Mutex;
use std::collections::VecDeque;

use super::machine::{Rules, Shape, check_send, has_room};
use super::session::OutMsg;
use super::settings::MsgLimits;
use super::types::Policy;

/// A send that passed the gate, for the pass to give the machine.
pub struct Submitted {
    /// The sequence number the application was given (the machine assigns the same).
    pub seq: u64,
    pub out: OutMsg,
    pub shape: Shape,
    /// Payload bytes copied on the sending thread (`SessionCounters::copied_bytes`).
    pub copied: u64,
}

/// What a [`Gate::sync`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Synced {
    /// A send was refused `Full` and there is room now: `on_send_ready` is due.
    pub ready: bool,
    /// Refusals counted at the gate since the last sync.
    pub refusals: u64,
}

struct GateState {
    policy: Policy,
    /// The session ended (or is closing): every send is refused `Closed`.
    closed: bool,
    /// The sequence number of the next send.
    next_seq: u64,
    /// What the machine held (messages, bytes) when the pass last told the gate: never
    /// less than what it holds (it grows only by what the pass takes from here).
    machine_msgs: usize,
    machine_bytes: u64,
    /// Sends waiting for the pass, and their bytes.
    queue: VecDeque<Submitted>,
    queued_bytes: u64,
    /// The session is on its shard's list of sessions with sends (see [`Gate::submit`]).
    listed: bool,
    /// A send was refused `Full` since the last `Ready`.
    refused: bool,
    /// `Full` refusals not yet added to the machine's counters.
    refusals: u64,
    /// The limits the peer advertised in its last hello (set by the pass).
    peer_limits: Option<MsgLimits>,
    /// The session is active/active: immediate messages are refused (`machine/active.rs`).
    active: bool,
}

impl GateState {
    fn held(&self) -> (usize, u64) {
        (
            self.machine_msgs + self.queue.len(),
            self.machine_bytes + self.queued_bytes,
        )
    }

    /// The machine's rules on everything held, and the peer's advertised limits (`data`:
    /// the message's data segments and bytes).
    fn check(&mut self, rules: &Rules, shape: &Shape, data: (usize, u64)) -> Result<()> {
        let (msgs, bytes) = self.held();
        let r = check_send(rules, self.policy, self.closed, msgs, bytes, shape);
        let r = match r {
            Ok(()) if self.active && shape.imm.is_some() => {
                Err(crate::msgr::messenger::machine::imm_refused())
            }
            r => r,
        };
        if let Err(e) = r {
            if e.kind() == ErrorKind::Full {
                self.refused = true;
                self.refusals += 1;
            }
            return Err(e);
        }
        // What the peer would refuse, and end the session for, is refused here.
        if let Some(peer) = self.peer_limits
            && let Err(e) = peer.check_send(data.0, data.1)
        {
            return Err(Error::new(
                e.kind(),
                format!("{} (the peer's advertised limit)", e.message()),
            ));
        }
        Ok(())
    }
}

/// A session's submit gate (see the module doc).
pub struct Gate(Mutex<GateState>);

impl Gate {
    /// The gate of a new session (whose machine's first sequence number is 1).
    pub fn new(policy: Policy) -> Gate {
        Gate(Mutex::new(GateState {
            policy,
            closed: false,
            next_seq: 1,
            machine_msgs: 0,
            machine_bytes: 0,
            queue: VecDeque::new(),
            queued_bytes: 0,
            listed: false,
            refused: false,
            refusals: 0,
            peer_limits: None,
            active: false,
        }))
    }

    /// A send's checks before its payload is prepared: the machine's rules
    /// ([`check_send`]) on what is held, and the peer's limits (`data`: the message's data
    /// segments and bytes). A `Full` is counted and owes a `Ready`.
    pub fn admit(&self, rules: &Rules, shape: &Shape, data: (usize, u64)) -> Result<()> {
        self.0.lock().check(rules, shape, data)
    }

    /// Queues a prepared send after checking again (another thread's send may have taken
    /// the room meanwhile, or the session ended): its sequence number, and whether the
    /// caller must put the session on its shard's submit list (it was not on it). Refused:
    /// the message back with the error.
    pub fn submit(
        &self,
        rules: &Rules,
        out: OutMsg,
        shape: Shape,
        data: (usize, u64),
        copied: u64,
    ) -> std::result::Result<(u64, bool), (OutMsg, Error)> {
        let mut g = self.0.lock();
        if let Err(e) = g.check(rules, &shape, data) {
            return Err((out, e));
        }
        let seq = g.next_seq;
        g.next_seq += 1;
        g.queued_bytes += shape.bytes;
        g.queue.push_back(Submitted {
            seq,
            out,
            shape,
            copied,
        });
        let list = !g.listed;
        g.listed = true;
        Ok((seq, list))
    }

    /// The pass takes the queued sends (appended to `into`, oldest first) for a machine
    /// that holds `held` (messages, bytes) now; the session leaves the submit list.
    pub fn take(&self, into: &mut VecDeque<Submitted>, held: (usize, u64)) {
        let mut g = self.0.lock();
        g.listed = false;
        if g.queue.is_empty() {
            g.machine_msgs = held.0;
            g.machine_bytes = held.1;
            return;
        }
        g.machine_msgs = held.0 + g.queue.len();
        g.machine_bytes = held.1 + g.queued_bytes;
        g.queued_bytes = 0;
        if into.is_empty() {
            std::mem::swap(into, &mut g.queue);
        } else {
            into.append(&mut g.queue);
        }
    }

    /// The pass tells the gate what the machine holds now (after acknowledgements freed
    /// room): whether a `Ready` is due, and the refusals to count.
    pub fn sync(&self, rules: &Rules, held: (usize, u64)) -> Synced {
        let mut g = self.0.lock();
        g.machine_msgs = held.0;
        g.machine_bytes = held.1;
        let (msgs, bytes) = g.held();
        let ready = g.refused && !g.closed && has_room(rules, msgs, bytes, 0);
        if ready {
            g.refused = false;
        }
        Synced {
            ready,
            refusals: std::mem::take(&mut g.refusals),
        }
    }

    /// The session ends: later sends are refused `Closed`; the queued ones are appended to
    /// `into` (the caller completes them). Returns the refusals not yet counted.
    pub fn close(&self, into: &mut VecDeque<Submitted>) -> u64 {
        let mut g = self.0.lock();
        g.closed = true;
        g.listed = false;
        g.queued_bytes = 0;
        into.append(&mut g.queue);
        std::mem::take(&mut g.refusals)
    }

    /// The limits the peer advertised on the session's current link.
    /// The session is active/active (its machine refuses immediate messages: so does the
    /// gate, at `send`).
    pub fn set_active(&self, on: bool) {
        self.0.lock().active = on;
    }

    pub fn set_peer_limits(&self, l: MsgLimits) {
        self.0.lock().peer_limits = Some(l);
    }

    /// Sends waiting for the pass, and refusals not yet counted (for `session_info`).
    pub fn pending(&self) -> (usize, u64) {
        let g = self.0.lock();
        (g.queue.len(), g.refusals)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rules(msgs: usize, bytes: u64) -> Rules {
        Rules {
            keepalive: None,
            probe: None,
            keepalive_timeout: Duration::from_secs(1),
            reconnect_min: Duration::from_millis(1),
            reconnect_max: Duration::from_millis(1),
            reconnect_timeout: Duration::from_secs(1),
            reconnect_attempts: 1,
            send_queue_msgs: msgs,
            send_queue_bytes: bytes,
            recv_window_min: 1,
            recv_window: 1,
            eager_write: false,
            path_failback: true,
        }
    }

    fn msg() -> OutMsg {
        OutMsg {
            front: vec![1, 2, 3],
            segs: Vec::new(),
            writes: Vec::new(),
        }
    }

    fn shape(bytes: u64) -> Shape {
        Shape {
            bytes,
            ..Shape::default()
        }
    }

    #[test]
    fn the_bound_counts_what_the_machine_holds_and_what_waits() {
        let r = rules(3, 1000);
        let g = Gate::new(Policy::Lossless);
        // Sequence numbers from 1; the first sets the listing.
        assert_eq!(
            g.submit(&r, msg(), shape(10), (0, 0), 0)
                .map_err(|(_, e)| e)
                .unwrap(),
            (1, true)
        );
        assert_eq!(
            g.submit(&r, msg(), shape(10), (0, 0), 0)
                .map_err(|(_, e)| e)
                .unwrap(),
            (2, false)
        );
        // The pass takes them into a machine holding one message already.
        let mut q = VecDeque::new();
        g.take(&mut q, (1, 10));
        assert_eq!(q.iter().map(|s| s.seq).collect::<Vec<_>>(), [1, 2]);
        // 3 held now (1 + 2 taken): the bound is reached, refused Full and counted.
        let (out, e) = g.submit(&r, msg(), shape(10), (0, 0), 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Full);
        assert_eq!(out.front, [1, 2, 3]);
        assert_eq!(
            g.admit(&r, &shape(10), (0, 0)).unwrap_err().kind(),
            ErrorKind::Full
        );
        // The machine still holds 3: no Ready; two refusals to count.
        assert_eq!(
            g.sync(&r, (3, 30)),
            Synced {
                ready: false,
                refusals: 2
            }
        );
        // Acknowledgements freed room: Ready, once.
        assert!(g.sync(&r, (2, 20)).ready);
        assert!(!g.sync(&r, (2, 20)).ready);
        // The next send is listed again (the take cleared it), with the next number.
        assert_eq!(
            g.submit(&r, msg(), shape(10), (0, 0), 0)
                .map_err(|(_, e)| e)
                .unwrap(),
            (3, true)
        );
    }

    #[test]
    fn the_byte_bound_lets_one_large_message_through_when_nothing_is_held() {
        let r = rules(100, 1000);
        let g = Gate::new(Policy::Lossless);
        assert_eq!(
            g.submit(&r, msg(), shape(5000), (0, 0), 0)
                .map_err(|(_, e)| e)
                .unwrap()
                .0,
            1
        );
        let (_, e) = g.submit(&r, msg(), shape(1), (0, 0), 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Full);
        // The machine took it and it was acknowledged: 10 + 990 fit, 1 more does not.
        let mut q = VecDeque::new();
        g.take(&mut q, (0, 0));
        assert!(g.sync(&r, (0, 0)).ready);
        g.submit(&r, msg(), shape(10), (0, 0), 0)
            .map_err(|(_, e)| e)
            .unwrap();
        g.submit(&r, msg(), shape(990), (0, 0), 0)
            .map_err(|(_, e)| e)
            .unwrap();
        let (_, e) = g.submit(&r, msg(), shape(1), (0, 0), 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Full);
    }

    #[test]
    fn a_closed_gate_refuses_and_hands_back_what_waited() {
        let r = rules(8, 1 << 20);
        let g = Gate::new(Policy::Lossy);
        g.submit(&r, msg(), shape(1), (0, 0), 0)
            .map_err(|(_, e)| e)
            .unwrap();
        g.submit(&r, msg(), shape(1), (0, 0), 0)
            .map_err(|(_, e)| e)
            .unwrap();
        let mut q = VecDeque::new();
        assert_eq!(g.close(&mut q), 0);
        assert_eq!(q.len(), 2);
        let (_, e) = g.submit(&r, msg(), shape(1), (0, 0), 0).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Closed);
        assert_eq!(g.pending(), (0, 0));
    }

    #[test]
    fn writes_need_a_lossy_session_and_the_peer_limits_apply() {
        let r = rules(8, 1 << 20);
        let g = Gate::new(Policy::Lossless);
        let writes = Shape {
            writes: 1,
            ..Shape::default()
        };
        assert_eq!(
            g.admit(&r, &writes, (0, 0)).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        g.set_peer_limits(MsgLimits {
            max_message_bytes: 100,
            max_segments: 1,
        });
        let e = g.admit(&r, &shape(200), (1, 200)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.message().contains("the peer's advertised limit"), "{e}");
        g.admit(&r, &shape(50), (1, 50)).unwrap();
    }
}

//! Who receives for a verbs application (progress=inline, not app-driven): what the
//! progress thread learns from its own passes about an application that waits without
//! polling. The device keeps the answer in `Shared::thread_rx`; this module decides when
//! it changes, from what each pass of the thread saw (no clock or lock of its own, so the
//! rule is tested on its own below). See docs/ibv-device.md, "Who receives".
//!
//! The evidence that an application waits elsewhere is a packet that **completes nothing
//! at this end** (an RDMA WRITE without immediate, a READ or atomic request), found still
//! queued at a look while the application has not polled for [`APP_ABSENT_NS`]: nothing it
//! polls will ever tell it about such a packet, so a program that needs it (`ib_write_lat`
//! spins on the last byte of its buffer until the peer's WRITE lands) never takes it
//! itself. A packet it polls for (a SEND, a WRITE with immediate, an ACK or READ response
//! that completes its own WR) found queued proves nothing: a polling program that was
//! preempted (2 cores, both processes busy) leaves those queued too, and takes them at its
//! next poll. Time alone cannot tell the two apart; the opcode can.

use crate::wire::Opcode;

/// A look of the progress thread that finds a packet that completes nothing queued while
/// the application has not polled for this long counts towards taking over: a program
/// that polls takes what arrives within a few microseconds.
pub(super) const APP_ABSENT_NS: u64 = 20_000;
/// While the thread receives for the application: a wakeup whose packets the application
/// polls for is needed when the application had not polled for this long (it sleeps on a
/// channel, or spins on memory); otherwise redundant (it polls and was about to take it).
pub(super) const APP_POLLING_NS: u64 = 5_000;
/// Looks in a row that must find such packets left by an absent application before the
/// thread takes over: one could be a program preempted right before it would have polled
/// (hysteresis; a memory spinner leaves one at every look, so it costs it one more
/// handover interval, once).
pub(super) const ENTER_LOOKS: u32 = 2;
/// While the thread receives for the application, a score: it starts at `SCORE_START`,
/// gains `SCORE_NEEDED` (up to `SCORE_MAX`) for each needed wakeup, loses 1 for each
/// redundant one (the application had taken the datagram, or had polled within
/// [`APP_POLLING_NS`] and the packets were ones it polls for); at 0, and no sooner than
/// [`RX_HOLD_NS`] after it began, the thread gives receiving back, unless a CQ is armed.
pub(super) const SCORE_START: u32 = 256;
pub(super) const SCORE_NEEDED: u32 = 8;
pub(super) const SCORE_MAX: u32 = 1024;
/// Least time the thread keeps receiving once it took over. A memory spinner polls its
/// send CQ between two WRITEs and sometimes takes the peer's WRITE itself (it arrives a
/// few microseconds after that poll), so some of the thread's wakeups are redundant;
/// giving back costs the spinner two handover waits before the thread takes over again.
/// Only a program that received packets that complete nothing, with none of it taken
/// for a long while, gets here, so a polling program pays for this hold rarely.
pub(super) const RX_HOLD_NS: u64 = 200_000_000;

/// Whether a packet with BTH opcode `raw` completes nothing at the end that receives it:
/// an RDMA WRITE without immediate (its FIRST and MIDDLE packets too, which a WRITE with
/// immediate shares: only its LAST completes), an RDMA READ request, an atomic request (and
/// the unsupported FLUSH / ATOMIC_WRITE). SENDs and WRITEs with immediate consume a receive
/// WQE, responses (ACK, READ response, atomic ACK) complete the receiver's own WRs: an
/// application learns of those by polling. UD and unknown opcodes: false.
pub(crate) fn completes_nothing_here(raw: u8) -> bool {
    matches!(
        Opcode::from_u8(raw),
        Ok(Opcode::RdmaWriteFirst
            | Opcode::RdmaWriteMiddle
            | Opcode::RdmaWriteLast
            | Opcode::RdmaWriteOnly
            | Opcode::RdmaReadRequest
            | Opcode::CompareSwap
            | Opcode::FetchAdd
            | Opcode::Flush
            | Opcode::AtomicWrite)
    )
}

/// What one pass of the progress thread saw.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Seen {
    /// The pass was a look: the thread woke at the handover interval while the
    /// application counted as polling (it did not receive for it).
    pub looked: bool,
    /// A receiving socket woke the thread (it receives for the application).
    pub woke: bool,
    /// What the pass took: (datagrams, packets that complete nothing here). None: the
    /// receive lock was busy (the application was receiving).
    pub took: Option<(usize, usize)>,
    /// Nanoseconds since the application's last poll when the pass began (0 when it was
    /// found receiving).
    pub absent: u64,
    /// When the pass began (engine ns).
    pub at: u64,
}

/// What the device does after a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Nothing changes.
    Keep,
    /// The application waits without polling: the thread receives (`thread_rx` on).
    TakeOver,
    /// The application polls for what it waits for: it receives (`thread_rx` off).
    GiveBack,
}

/// The learner's state (owned by the progress thread).
#[derive(Debug, Default)]
pub(super) struct Learner {
    /// Looks in a row that found packets that complete nothing, left by an absent
    /// application.
    stale_looks: u32,
    /// The learner's view of `thread_rx` (an arming sets it from another thread).
    on: bool,
    /// While `on`: see [`SCORE_START`].
    score: u32,
    /// When `on` became true (engine ns).
    since: u64,
}

impl Learner {
    /// After a pass of the thread: `receiving` = `thread_rx` as it stands (an arming may
    /// have set it), `armed` = a CQ is armed (the thread never gives back then).
    pub fn after_pass(&mut self, receiving: bool, armed: bool, seen: &Seen) -> Verdict {
        if receiving != self.on {
            // Set by an arming (or cleared by `set_app_driven`).
            self.on = receiving;
            self.score = SCORE_START;
            self.since = seen.at;
            self.stale_looks = 0;
        }
        let Some((taken, silent)) = seen.took else {
            // The application held the receive lock: it is receiving. (The device waits
            // for the lock after a socket wakeup, so this is a look or a race.)
            return if seen.woke {
                self.redundant(armed, seen.at)
            } else {
                Verdict::Keep
            };
        };
        if seen.looked && !self.on {
            return self.look(taken, silent, seen);
        }
        if seen.woke && self.on {
            let needed = silent > 0 || (taken > 0 && seen.absent >= APP_POLLING_NS);
            if needed {
                self.score = (self.score + SCORE_NEEDED).min(SCORE_MAX);
                return Verdict::Keep;
            }
            return self.redundant(armed, seen.at);
        }
        Verdict::Keep
    }

    /// A look at the handover interval while the application counts as polling.
    fn look(&mut self, taken: usize, silent: usize, seen: &Seen) -> Verdict {
        if silent > 0 && seen.absent >= APP_ABSENT_NS {
            self.stale_looks += 1;
            if self.stale_looks >= ENTER_LOOKS {
                self.stale_looks = 0;
                self.on = true;
                self.score = SCORE_START;
                self.since = seen.at;
                return Verdict::TakeOver;
            }
        } else if taken > 0 || seen.absent < APP_ABSENT_NS {
            // It polls: it had polled just now, or what waited is what it polls for (a
            // preempted poller takes that at its next poll).
            self.stale_looks = 0;
        }
        // Nothing queued while it was away: a spinner whose peer has not sent yet, or an
        // idle poller; no evidence either way.
        Verdict::Keep
    }

    fn redundant(&mut self, armed: bool, at: u64) -> Verdict {
        if !self.on {
            return Verdict::Keep;
        }
        self.score = self.score.saturating_sub(1);
        if self.score > 0 || at.saturating_sub(self.since) < RX_HOLD_NS {
            return Verdict::Keep;
        }
        if armed {
            self.score = SCORE_START;
            self.since = at;
            return Verdict::Keep;
        }
        self.on = false;
        Verdict::GiveBack
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEND_ONLY: u8 = 0x04;
    const WRITE_ONLY: u8 = 0x0A;
    const ACK: u8 = 0x11;
    const HANDOVER: u64 = 1_000_000;

    fn look(at: u64, absent: u64, taken: usize, silent: usize) -> Seen {
        Seen {
            looked: true,
            woke: false,
            took: Some((taken, silent)),
            absent,
            at,
        }
    }

    fn wake(at: u64, absent: u64, taken: usize, silent: usize) -> Seen {
        Seen {
            looked: false,
            woke: true,
            took: Some((taken, silent)),
            absent,
            at,
        }
    }

    #[test]
    fn packets_that_complete_nothing_are_writes_reads_and_atomics() {
        for op in Opcode::ALL {
            let silent = completes_nothing_here(op.as_u8());
            let expected = op.is_request()
                && !op.generates_recv_cqe()
                && !matches!(
                    op,
                    Opcode::SendFirst | Opcode::SendMiddle | Opcode::SendLast
                );
            // WRITE_LAST_WITH_IMMEDIATE generates a CQE: not silent; SEND_FIRST/MIDDLE
            // belong to a SEND, which completes.
            assert_eq!(silent, expected, "{}", op.name());
        }
        assert!(completes_nothing_here(WRITE_ONLY));
        assert!(!completes_nothing_here(SEND_ONLY));
        assert!(!completes_nothing_here(ACK));
        // UD SEND_ONLY (transport bits 011) and garbage: not RC, not silent.
        assert!(!completes_nothing_here(0x64));
        assert!(!completes_nothing_here(0xFF));
    }

    /// A polling program (SENDs and ACKs) preempted at every look, for longer than the
    /// absence threshold: the thread never takes over. (The rule before: any datagram
    /// queued at two looks in a row, which took `ibv_rc_pingpong` for a waiter.)
    #[test]
    fn a_preempted_poller_is_never_taken_for_a_waiter() {
        let mut l = Learner::default();
        for i in 1..=1000 {
            let v = l.after_pass(false, false, &look(i * HANDOVER, 300_000, 2, 0));
            assert_eq!(v, Verdict::Keep, "look {i}");
        }
    }

    /// `ib_write_lat`: every look finds the peer's WRITE queued, the application away.
    #[test]
    fn a_memory_spinner_is_taken_over_after_two_looks_and_kept() {
        let mut l = Learner::default();
        assert_eq!(
            l.after_pass(false, false, &look(HANDOVER, 900_000, 1, 1)),
            Verdict::Keep
        );
        // A look with nothing queued (its peer has not written yet) breaks no row.
        assert_eq!(
            l.after_pass(false, false, &look(2 * HANDOVER, 900_000, 0, 0)),
            Verdict::Keep
        );
        assert_eq!(
            l.after_pass(false, false, &look(3 * HANDOVER, 900_000, 1, 1)),
            Verdict::TakeOver
        );
        // Then, for 10 s of iterations: the WRITE lands by the thread (needed, however
        // soon after the spinner's last poll), the ACK of its own WRITE is taken by its
        // poll (redundant), sometimes the WRITE too.
        let mut at = 3 * HANDOVER;
        for i in 0..200_000u64 {
            at += 50_000;
            let v = if i % 3 == 0 {
                l.after_pass(true, false, &wake(at, 0, 0, 0))
            } else {
                l.after_pass(true, false, &wake(at, 2_000, 1, 1))
            };
            assert_eq!(v, Verdict::Keep, "iteration {i}");
            assert_eq!(
                l.after_pass(true, false, &wake(at + 10_000, 1_000, 0, 0)),
                Verdict::Keep
            );
        }
    }

    /// One look that finds a WRITE left by a preempted poller, then a look that finds it
    /// polling: the row is broken, one preemption does not flip the mode.
    #[test]
    fn one_stale_look_does_not_flip_the_mode() {
        let mut l = Learner::default();
        for i in 0..100 {
            let at = (2 * i + 1) * HANDOVER;
            assert_eq!(
                l.after_pass(false, false, &look(at, 50_000, 1, 1)),
                Verdict::Keep
            );
            assert_eq!(
                l.after_pass(false, false, &look(at + HANDOVER, 1_000, 0, 0)),
                Verdict::Keep
            );
        }
        // A SEND found with the WRITE breaks nothing (the WRITE waited all the same), but
        // a SEND alone does.
        assert_eq!(
            l.after_pass(false, false, &look(500 * HANDOVER, 50_000, 1, 1)),
            Verdict::Keep
        );
        assert_eq!(
            l.after_pass(false, false, &look(501 * HANDOVER, 50_000, 1, 0)),
            Verdict::Keep
        );
        assert_eq!(
            l.after_pass(false, false, &look(502 * HANDOVER, 50_000, 2, 1)),
            Verdict::Keep
        );
        assert_eq!(
            l.after_pass(false, false, &look(503 * HANDOVER, 50_000, 2, 1)),
            Verdict::TakeOver
        );
    }

    /// An application that armed (the device set `thread_rx`) and then polls instead: its
    /// redundant wakeups hand receiving back after the hold, not while a CQ is armed.
    #[test]
    fn a_waiter_that_turns_to_polling_gets_receiving_back_after_the_hold() {
        let mut l = Learner::default();
        let mut at = 1_000;
        // Woken while armed, the application asleep: needed.
        for _ in 0..100 {
            at += 30_000;
            assert_eq!(
                l.after_pass(true, true, &wake(at, 25_000, 2, 0)),
                Verdict::Keep
            );
        }
        // It polls now: the thread finds the lock busy or nothing left, or what it took
        // the application polled for 1 us before.
        let mut verdicts = Vec::new();
        while at < RX_HOLD_NS * 3 {
            at += 20_000;
            let seen = match at / 20_000 % 3 {
                0 => Seen {
                    took: None,
                    ..wake(at, 0, 0, 0)
                },
                1 => wake(at, 0, 0, 0),
                _ => wake(at, 1_000, 1, 0),
            };
            // Armed when the hold runs out: not given back then; the hold starts again.
            let armed = at < RX_HOLD_NS * 3 / 2;
            let v = l.after_pass(true, armed, &seen);
            if v == Verdict::GiveBack {
                verdicts.push(at);
                break;
            }
        }
        assert_eq!(verdicts.len(), 1, "given back once");
        assert!(
            verdicts[0] >= RX_HOLD_NS * 3 / 2,
            "not before the hold, nor while armed: {}",
            verdicts[0]
        );
        // Given back: its wakeups no longer count.
        assert_eq!(
            l.after_pass(false, false, &wake(at + 1, 0, 0, 0)),
            Verdict::Keep
        );
    }
}

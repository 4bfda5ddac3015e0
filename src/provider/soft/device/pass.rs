//! One progress pass: send what waits, receive what is queued on the ports (bounded) and
//! feed it to the QPs, run the due timers, and keep time the process did not run out of
//! the engine clock (stall accounting).

use smallvec::SmallVec;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::super::qp::{Received, SoftQp};
use super::super::udp::{self, RxBatch, UdpPort};
use super::Shared;
use super::learner;
use super::timers::TimerCell;
use crate::wire::{BTH_LEN, Bth};

/// Messages per recvmmsg call (datagrams, or GRO buffers of several).
pub(super) const RX_BATCH: usize = 64;
/// Receive with UDP GRO: on first use the device port turns `UDP_GRO` on and its receive
/// batch becomes [`RX_BATCH`] slots of 64 KiB (4 MiB, touched only as filled), so a GSO
/// message from a local peer arrives as one buffer. `false`: one datagram per slot.
const USE_GRO: bool = true;
/// Most datagrams one progress pass takes from the socket (timers and posts must not starve).
const RX_PASS_DATAGRAMS: usize = 16 * RX_BATCH;
/// A progress pass that starts this much later than one was due means the process was not
/// running (CPU starved, stopped): that time is left out of the engine's clock. Smaller
/// delays are ordinary wakeup jitter (timer slack is 50 us) and count as listening.
const STALL_MIN_NS: u64 = 200_000;
/// What a phase of a progress pass may take when the process runs: a base plus a
/// generous cost per datagram received (a GRO message holds up to 64 KiB) or QP driven
/// (its sends). Time beyond was time the process did not run, inside the pass.
const PASS_BASE_NS: u64 = 1_000_000;
const PASS_PER_ITEM_NS: u64 = 50_000;

/// QPs one progress pass drives (inline: a pass runs per poll, so no heap allocation).
pub(super) type Touched = SmallVec<[Arc<SoftQp>; 4]>;

impl Shared {
    /// Called at the start of every progress pass (under the receive lock, so passes do not
    /// race here). A pass was due when the earliest timer expired; if this one starts
    /// later than that and later than the previous pass ended, no thread of this process
    /// ran a pass in between (CPU starved, stopped, or no thread was awake to do it): that
    /// time leaves the engine clock. The pass then receives what arrived meanwhile before
    /// the timer fires (at the clock reading of its deadline), so the window a requester
    /// charges to its peer is time it was listening. Gaps with no timer due (an
    /// application that polls now and then, an idle device) are not stalls.
    fn account_stall(&self) -> u64 {
        let now = self.now();
        let due = self
            .last_pass
            .load(Ordering::Relaxed)
            .max(self.timers.min());
        self.stall(now, now.saturating_sub(due))
    }

    /// Leaves `late` ns before `now` out of the engine clock if it is a stall (at least
    /// STALL_MIN_NS); returns the engine clock after that.
    fn stall(&self, now: u64, late: u64) -> u64 {
        if late < STALL_MIN_NS {
            return now;
        }
        self.stalled_ns.fetch_add(late, Ordering::Relaxed);
        self.stats.stalls.fetch_add(1, Ordering::Relaxed);
        self.stats.max_stall_ns.fetch_max(late, Ordering::Relaxed);
        self.stats.log.record(now - late, late);
        now - late
    }

    /// A phase of a pass that handled `work` datagrams or QPs from `start` to `now`, with
    /// the earliest timer at `timer`: time beyond what that work can take and beyond the
    /// timer was time the process did not run inside the pass (preempted or stopped) while
    /// a timer was due. Returns the clock with that time left out.
    fn stall_inside(&self, start: u64, now: u64, work: usize, timer: u64) -> u64 {
        let budget = PASS_BASE_NS + PASS_PER_ITEM_NS * work as u64;
        let late = now.saturating_sub(start.saturating_add(budget).max(timer));
        self.stall(now, late)
    }

    /// Receives queued datagrams (up to a bound), runs due timers, checks watched side
    /// channels. `wait` = block on the receive lock instead of skipping when it is busy.
    /// Returns the time the pass ran at and the datagrams it took, or None if it skipped
    /// (the lock was busy).
    /// `hold_ns` (0: no hold): the application's own pass (progress=inline), which is
    /// about to run its callbacks: positive ACKs that are all a QP has to send wait in
    /// `held_acks`, so the answer it posts carries them in the same `sendmmsg` (a pass once
    /// they are `hold_ns` old, or the application going to sleep, sends them otherwise:
    /// `ACK_HOLD_NS` for the messenger, `VERBS_ACK_HOLD_NS` for a verbs program).
    /// Measured, request/reply paid a `sendmmsg` of its own for the ACK on both sides,
    /// before the answer.
    pub(super) fn progress_once(&self, wait: bool, hold_ns: u64) -> Option<Pass> {
        let hold_acks = hold_ns > 0;
        let rx = if wait {
            Some(self.rx.lock())
        } else {
            self.rx.try_lock()
        };
        let mut rx = rx?;
        let start = self.account_stall();
        if USE_GRO && rx.slot_len() < udp::MAX_RX_SLOT_LEN {
            let mut gro = false;
            for p in &self.ports {
                gro |= p.sock.enable_gro();
            }
            if gro {
                // GRO buffers need 64 KiB slots; nothing was received since GRO went on.
                *rx = RxBatch::for_gro(RX_BATCH);
            }
        }
        let mut touched: Touched = SmallVec::new();
        // Posted since the last pass: sent first, before receiving, as the post would have,
        // so batching adds no latency to a lone request. Held ACKs go when old enough (an
        // application pass) or now (the progress thread's: the application stopped).
        self.ring_doorbells(start);
        self.release_acks(start, hold_ns);
        let timer_at_start = self.timers.min();
        let mut start = start;
        let mut drained = true;
        let mut now = start;
        let mut taken_total = 0;
        let mut silent = 0;
        // A process stopped or preempted while receiving may have missed what arrived
        // meanwhile: that time leaves the clock and the socket is read once more before
        // any timer fires. (Once: a pass that is merely slow, say under valgrind, must
        // still run its timers.)
        for round in 0..2 {
            let mut taken = 0;
            drained = true;
            for port in self
                .ports
                .iter()
                .filter(|p| p.qps.load(Ordering::Acquire) > 0)
            {
                let (d, n) = self.receive_from(&port.sock, &mut rx, &mut touched, &mut silent);
                drained &= d;
                taken += n;
            }
            taken_total += taken;
            let read = self.now();
            now = self.stall_inside(start, read, taken, timer_at_start);
            if now == read || round == 1 {
                break;
            }
            start = now;
        }
        // Responses for what arrived, and every due timer, but only once every packet that
        // arrived before now has been processed: an ACK queued behind the pass's bound
        // must not lose the race against its own timer. Only due heap entries are looked
        // at: idle QPs cost nothing.
        let mut due: Touched = SmallVec::new();
        if drained {
            let mut cells: SmallVec<[Arc<TimerCell>; 4]> = SmallVec::new();
            self.timers.take_due(now, &mut cells);
            if !cells.is_empty() {
                let qps = self.qps.read();
                for c in &cells {
                    // A destroyed QP's entry just leaves the heap.
                    if let Some(qp) = qps.get(&c.qpn)
                        && !touched.iter().any(|q| Arc::ptr_eq(q, qp))
                    {
                        due.push(Arc::clone(qp));
                    }
                }
            }
        } else {
            self.stats.timers_deferred.fetch_add(1, Ordering::Relaxed);
            self.timers.wake.signal(); // the thread comes back for the rest at once
        }
        // Driving publishes each QP's next deadline to the heap (a new or earlier one wakes
        // the thread if it planned to sleep past it).
        for qp in touched.iter().chain(due.iter()) {
            if qp.drive(&self.mrs, now, drained, hold_acks) {
                self.hold_acks_of(qp, now);
            }
        }
        // Deadlines of the QPs driven moved: make the heap's minimum exact again.
        let driven = touched.len() + due.len();
        let timer = if driven > 0 {
            self.timers.settle()
        } else {
            self.timers.min()
        };
        // Stopped while sending: the deadlines just armed must not count that time.
        let end = self.stall_inside(now, self.now(), driven, timer);
        self.last_pass.store(end, Ordering::Relaxed);
        drop(rx);
        Some(Pass {
            now,
            taken: taken_total,
            silent,
        })
    }

    /// Receives from `port` (bounded: at most 16 batches and RX_PASS_DATAGRAMS datagrams,
    /// so timers and posts are not starved) and feeds each datagram to its QP; the QPs fed
    /// are added to `touched`, and the processed packets that complete nothing at this end
    /// ([`learner::completes_nothing_here`]) are counted in `silent`. Returns whether the
    /// socket was drained (false: the bound stopped it with datagrams still queued) and
    /// the messages taken.
    fn receive_from(
        &self,
        port: &UdpPort,
        rx: &mut RxBatch,
        touched: &mut Touched,
        silent: &mut usize,
    ) -> (bool, usize) {
        let mut taken = 0;
        for _ in 0..16 {
            let n = match port.recv_batch(rx) {
                Ok(n) => n,
                Err(e) => {
                    log::warn!(target: "rdmx::soft", "recv on {}: {e}", port.local_addr());
                    0
                }
            };
            if n == 0 {
                return (true, taken);
            }
            let now = self.now();
            let qps = self.qps.read();
            let mut view = self.mrs.view();
            let drops = &self.stats.port;
            for i in 0..n {
                // Truncated datagrams are counted by the port.
                let Some(d) = rx.get(i) else { continue };
                let Ok(bth) = Bth::new_checked(d.data) else {
                    drops.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if d.data.len() < BTH_LEN + 4 {
                    drops.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let Some(qp) = qps.get(&bth.dest_qp()) else {
                    if self.receive_ud(&mut view, bth.dest_qp(), &d) {
                        continue;
                    }
                    drops.unknown_qpn.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                // The source check comes first (rxe `check_addr`): a stranger's packet
                // costs no ICRC and never reaches the engine.
                let counter = match qp.receive(&mut view, now, d.src, d.dst, d.data) {
                    Received::Processed => {
                        if learner::completes_nothing_here(bth.opcode_raw()) {
                            *silent += 1;
                        }
                        if !touched.iter().any(|q| Arc::ptr_eq(q, qp)) {
                            touched.push(Arc::clone(qp));
                        }
                        continue;
                    }
                    Received::WrongSource => &drops.wrong_source,
                    Received::BadIcrc => &drops.bad_icrc,
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            taken += n;
            if rx.messages() < rx.capacity() {
                return (true, taken);
            }
            if taken >= RX_PASS_DATAGRAMS {
                return (false, taken);
            }
        }
        (false, taken)
    }
}

/// What a progress pass did.
pub(super) struct Pass {
    /// The engine time it ran at.
    pub(super) now: u64,
    /// Datagrams (or GRO messages) it took from the sockets.
    pub(super) taken: usize,
    /// Of the packets in them, those a QP processed that complete nothing at this end
    /// (RDMA WRITE without immediate, READ and atomic requests): the application learns of
    /// them by looking at its memory, never by polling ([`learner::completes_nothing_here`]).
    pub(super) silent: usize,
}

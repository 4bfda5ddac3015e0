//! The progress thread: sleeps until a timer is due, a datagram arrives (while it
//! receives), a side channel closes or someone wakes it; then runs a pass. It survives a
//! panic in a pass, and learns who receives for a verbs application (`learner.rs`).

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::super::qp::SoftQp;
use super::super::sys;
use super::caller::inline_handover_ns;
use super::learner::{Learner, Seen, Verdict};
use super::pass::Pass;
use super::{Shared, SoftDevice};
use crate::config::Progress;

/// Longest sleep of the progress thread when no timer is armed (it also wakes on traffic,
/// on posts that need it, and on side-channel events). Below the usual ACK timeouts (every
/// code from 12, 16.8 ms, up; rdmx's and perftest's default 14 is 67 ms): a post arms its
/// QP's ACK timer, and the poster wakes the thread only when the timer comes before the
/// thread's planned wake (`DeviceTimers::wake_by`). At 100 ms every post of a program that
/// does not poll (a memory spinner, a waiter on a channel) wrote the thread's eventfd and
/// cost it a wakeup with an empty pass (docs/ibv-device.md). An idle thread wakes 100 times
/// a second for it.
const IDLE_SLEEP: Duration = Duration::from_millis(10);
/// Longest sleep of the progress thread without the sockets after it found the receive
/// lock taken (the poll that holds it wakes the thread when it ends: `rx_wanted`).
const RX_BUSY_MAX_WAIT: Duration = Duration::from_millis(1);

impl SoftDevice {
    /// Wakes the progress thread (e.g. after a post whose packets the caller could not
    /// send, or to re-evaluate timers).
    pub fn kick(&self) {
        self.shared.timers.wake.signal();
    }

    /// A caller armed a timer due at `deadline`: wakes the progress thread if it planned
    /// to sleep past it (timers fire whether or not the application polls). A QP of this
    /// device already told the device's timer heap when its engine armed the timer, so this
    /// is one atomic load in the common case.
    pub fn timer_armed(&self, deadline: Option<u64>) {
        if let Some(d) = deadline {
            self.shared.timers.wake_by(d);
        }
    }
}

impl Shared {
    /// The earliest armed timer of any QP (possibly early: a pass then finds nothing due
    /// and repairs it; never late).
    fn next_deadline(&self) -> Option<u64> {
        let m = self.timers.min();
        (m != u64::MAX).then_some(m)
    }
}

/// The progress thread: [`progress_loop`] until the device stops. A panic in a pass (a
/// completion hook it ran, a bug) would otherwise end the thread silently and with it every
/// timer of the device (ACK timeouts, retransmissions, held ACKs): it is caught, counted
/// (`ProgressStats::progress_panics`), logged at error level, every QP of the device is
/// failed (its work flushes; what it was doing cannot be trusted), and the loop starts
/// again.
pub(super) fn progress_thread(s: &Shared) {
    while !s.stop.load(Ordering::Acquire) {
        let Err(payload) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| progress_loop(s)))
        else {
            return;
        };
        s.stats.progress_panics.fetch_add(1, Ordering::Relaxed);
        let qps: Vec<Arc<SoftQp>> = s.qps.read().values().cloned().collect();
        log::error!(
            target: "rdmx::soft",
            "progress thread panicked: {}; failing the device's {} QPs and going on",
            crate::logging::panic_message(payload.as_ref()),
            qps.len()
        );
        for qp in qps {
            qp.fail(&s.mrs, s.now());
        }
    }
}

fn progress_loop(s: &Shared) {
    // The poll set, owned by the loop (no allocation per loop): the wake fd, the receiving
    // ports while this thread receives, and the epoll set of watched side channels (one
    // fd however many connections the device has).
    let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(2 + s.ports.len());
    let mut events: Vec<libc::epoll_event> = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut readable: Vec<RawFd> = Vec::with_capacity(64);
    let inline = s.settings.progress == Progress::Inline;
    let t = &s.timers;
    let mut learner = Learner::default();
    // The last pass found the receive lock taken by an application poll: while this thread
    // receives for the application (`thread_rx`, a CQ armed), it waits for that poll to
    // end (`rx_wanted`); otherwise the application polls again and receives for itself.
    let mut lock_busy = false;
    let mut app_back = false;
    while !s.stop.load(Ordering::Acquire) {
        let now = s.now();
        // progress=thread: this thread receives. progress=inline: the caller's poll does
        // while it polls (`app_polls`: recently, no CQ armed, not learned to wait
        // elsewhere), or it sleeps on the sockets itself (`app_watchers`); this thread
        // then only runs timers and watches side channels, and looks every handover time.
        let handover = Duration::from_nanos(inline_handover_ns(s));
        let app_polling = inline
            && (std::mem::take(&mut app_back)
                || s.app_watchers.load(Ordering::Acquire) > 0
                || s.app_polls(now)
                || s.event_watcher_recent(now));
        // After a busy lock, sleep without the sockets (still readable: the datagram waits
        // for the poll that holds the lock) until that poll ends and signals.
        let watch = !app_polling && !lock_busy;
        pfds.clear();
        pfds.push(sys::pollin(t.wake.raw_fd()));
        pfds.push(sys::pollin(s.watch_set.raw_fd()));
        if watch {
            pfds.extend(
                s.ports
                    .iter()
                    .filter(|p| p.qps.load(Ordering::Acquire) > 0)
                    .map(|p| sys::pollin(p.sock.raw_fd())),
            );
            s.thread_watching.store(true, Ordering::SeqCst);
        }
        // Announce the longest sleep first, then look at the deadlines: a timer armed
        // between the two sees the long sleep and kicks; one before is in the heap's
        // minimum.
        t.planned_wake
            .store(now + IDLE_SLEEP.as_nanos() as u64, Ordering::Release);
        let mut timeout = match s.next_deadline() {
            Some(d) if d <= now => Duration::ZERO,
            Some(d) => Duration::from_nanos(d - now).min(IDLE_SLEEP),
            None => IDLE_SLEEP,
        };
        if app_polling {
            // Look again when the caller may have stopped polling.
            timeout = timeout.min(handover);
        }
        // A hold ends by `ACK_HOLD_NS`: the application's passes release it while it polls,
        // this thread otherwise (a verbs program that stopped polling, or this thread's own
        // hold for a spinner).
        let held = s.held_since.load(Ordering::Acquire);
        if held != 0 && !app_polling && !s.hold_acks.load(Ordering::Relaxed) {
            timeout = timeout.min(Duration::from_nanos(
                (held + super::batching::ACK_HOLD_NS).saturating_sub(now),
            ));
        }
        if lock_busy {
            // The poll signals when it ends; this bounds the wait if it never does.
            timeout = timeout.min(RX_BUSY_MAX_WAIT);
            lock_busy = false;
        }
        t.planned_wake
            .store(now + timeout.as_nanos() as u64, Ordering::Release);
        if let Err(e) = sys::poll_set(&mut pfds, timeout) {
            log::error!(target: "rdmx::soft", "progress: {e}");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Before anything reads `armed_cqs`/`thread_rx` again (see `app_sleeping`).
        s.thread_watching.store(false, Ordering::SeqCst);
        let socket_woke = watch && pfds[2..].iter().any(|p| p.revents != 0);
        if pfds[0].revents != 0 {
            // (Read only when signaled: one system call less per wakeup by a datagram.)
            t.wake.clear();
        }
        readable.clear();
        if pfds[1].revents != 0 {
            s.watch_set.ready(&mut events, &mut readable);
        }
        let side_channel_event = !readable.is_empty();
        // Inline while an app-driven caller (the messenger) polls: its passes receive and
        // run the timers, so this thread steps in only for a due timer (the caller may be
        // asleep on the sockets, which a timer does not wake) or a side-channel event. A pass of its own would
        // hold the receive lock the caller's next poll needs: measured, a messenger worker
        // found it taken ~100,000 times a second at 60K rpc/s, each time a pass with nothing
        // and a poll(2) that returned at once on the still unread socket.
        let after = s.now();
        let app_driven = inline && s.hold_acks.load(Ordering::Relaxed);
        let still_polling = app_driven
            && (s.app_watchers.load(Ordering::Acquire) > 0
                || after.saturating_sub(s.last_app_poll.load(Ordering::Relaxed))
                    < handover.as_nanos() as u64);
        if still_polling && !side_channel_event && s.next_deadline().is_none_or(|d| d > after) {
            continue;
        }
        // Inline: skip if the caller is at it (try-lock); thread: wait for the lock. Before
        // acting on a side-channel event always receive first (waiting for the lock): a peer
        // that answers (e.g. with a NAK) and then closes must have its answer processed
        // before its EOF fails the QP.
        let last_poll = s.last_app_poll.load(Ordering::Relaxed);
        // Receiving for a memory spinner, this thread holds ACKs for its answer too: the
        // peer polls for the ACK, and the WRITE it spins on should come with it
        // (`answers.rs`).
        let thread_hold = if inline
            && !app_driven
            && s.answers.spinner()
            && s.thread_rx.load(Ordering::Relaxed)
            && s.armed_cqs.load(Ordering::Relaxed) == 0
        {
            super::batching::ACK_HOLD_NS
        } else {
            0
        };
        let mut pass = s.progress_once(!inline || side_channel_event, thread_hold);
        let learning = inline && !app_driven;
        let mut absent = after.saturating_sub(last_poll);
        let receiver = s.thread_rx.load(Ordering::SeqCst) || s.armed_cqs.load(Ordering::SeqCst) > 0;
        if pass.is_none() && socket_woke && learning && !receiver {
            // The application had stopped polling for the handover time and polls again
            // (its poll holds the lock): it receives for itself from now on, as while it
            // polls; this thread's next sleep is a look. (Its `last_app_poll` is written
            // when the poll ends; until then the sockets would wake this thread again at
            // once.)
            app_back = true;
        } else if pass.is_none() && socket_woke && learning {
            // Woken by a datagram while an application poll holds the receive lock, while
            // this thread receives for the application: ask that poll to wake this thread
            // when it ends (`rx_wanted`), then try once more
            // (it may have ended before it could see the flag). The datagram may have come
            // after the poll's receive, and a program that stops polling right after (a
            // memory spinner that got its own completion, a waiter going back to sleep)
            // would leave it for the next timer or look. Backing off 20 us instead cost
            // such a datagram the backoff plus the timer slack (up to 70 us); blocking on
            // the lock would make every poll skip its receive whenever the lock was handed
            // to this thread before it ran again (milliseconds on a loaded host).
            s.rx_wanted.store(true, Ordering::SeqCst);
            std::sync::atomic::fence(Ordering::SeqCst);
            pass = s.progress_once(false, thread_hold);
            if pass.is_some() {
                s.rx_wanted.store(false, Ordering::Relaxed);
            } else {
                lock_busy = true;
            }
            absent = 0;
        }
        if learning {
            if let Some(p) = pass.as_ref() {
                s.answers.thread_landed(p.silent);
            }
            learner_step(
                s,
                &mut learner,
                app_polling,
                socket_woke,
                pass.as_ref(),
                absent,
                after,
            );
        }
        if side_channel_event {
            s.check_watches(&readable);
        }
        if app_driven {
            // An app-driven caller may sleep on the sockets this pass drained.
            s.app_wake.signal();
        }
    }
}

/// Feeds what a pass of the progress thread saw to the learner and applies its verdict
/// to `thread_rx` (see `device/learner.rs`): `looked` = the pass was a look at the
/// handover interval, `woke` = a socket woke the thread, `absent` = ns since the
/// application's last poll when it began at `at`.
fn learner_step(
    s: &Shared,
    learner: &mut Learner,
    looked: bool,
    woke: bool,
    pass: Option<&Pass>,
    absent: u64,
    at: u64,
) {
    let seen = Seen {
        looked,
        woke,
        took: pass.map(|p| (p.taken, p.silent)),
        absent,
        at,
    };
    // The thread counts as receiving for a spinner even while its own polls land the WRITEs
    // (`answers.rs` turns `thread_rx` off and on per poll): the learner's view, score
    // and hold change only with its own verdicts.
    let receiving = s.thread_rx.load(Ordering::SeqCst) || s.answers.spinner();
    let armed = s.armed_cqs.load(Ordering::SeqCst) > 0;
    match learner.after_pass(receiving, armed, &seen) {
        Verdict::Keep => {}
        Verdict::TakeOver => {
            log::debug!(target: "rdmx::soft", "progress: an RDMA WRITE or READ waited {absent} ns for an application that polls now and then; the progress thread receives");
            s.stats.takeovers.fetch_add(1, Ordering::Relaxed);
            s.answers.set_spinner(true);
            s.thread_rx.store(true, Ordering::SeqCst);
        }
        Verdict::GiveBack => {
            // The learner saw no CQ armed. An arming racing this store may be undone by
            // it, harmlessly: its tally keeps the thread receiving until it fires
            // (`app_polls`), and the next arming sets `thread_rx` again.
            log::debug!(target: "rdmx::soft", "progress: the application polls for what it waits for; it receives");
            s.thread_rx.store(false, Ordering::SeqCst);
            s.answers.set_spinner(false);
        }
    }
}

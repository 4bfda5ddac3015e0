//! Completion queues: bounded FIFOs of work completions, with `req_notify` semantics on a
//! completion channel (an eventfd a daemon can put in its epoll set).

use crate::rc::WcStatus;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::error::Result;

/// The completion channel a [`Cq`] signals (`ibv_comp_channel`; provider-neutral).
pub use crate::provider::sys::EventFd;
/// A work completion (provider-neutral, `crate::provider::types`).
pub use crate::provider::types::Wc;

/// Called when an armed CQ notifies (after its channel is signaled): a verbs completion
/// channel writes the CQ's handle to its pipe from here. Runs on whichever thread added
/// the completion (the progress thread, or the application's), with no CQ lock held.
pub struct NotifyHook(Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for NotifyHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NotifyHook")
    }
}

/// Least time between two overflow log lines of one CQ.
const OVERFLOW_LOG_INTERVAL_NS: u64 = 10_000_000_000;

/// One completion queue.
#[derive(Debug)]
pub struct Cq {
    q: Mutex<VecDeque<Wc>>,
    cap: usize,
    channel: Arc<EventFd>,
    armed: AtomicBool,
    /// Armed for solicited (and error) completions only (`ibv_req_notify_cq(cq, 1)`).
    solicited_only: AtomicBool,
    /// Also run on a notification (verbs completion channels).
    hook: OnceLock<NotifyHook>,
    /// Run when a push finds the queue empty, armed or not (`Cq::on_first`).
    first: OnceLock<NotifyHook>,
    /// Counts this CQ while it is armed (`Cq::count_armings_in`): the soft device's tally
    /// of CQs an application waits on.
    arm_tally: OnceLock<Arc<AtomicUsize>>,
    overflows: AtomicU64,
    /// Entries queued, as of the last push or poll: a lock-free look for a caller that
    /// polls many CQs and skips the empty ones.
    queued: AtomicUsize,
    /// When (ns since `born`) the next overflow may be logged.
    next_log_ns: AtomicU64,
    /// Overflow log lines written.
    overflow_logs: AtomicU64,
    born: Instant,
}

impl Cq {
    /// A CQ of `cap` entries that signals `channel` when armed.
    pub fn new(cap: usize, channel: Arc<EventFd>) -> Cq {
        Cq {
            q: Mutex::new(VecDeque::with_capacity(cap.min(1 << 16))),
            cap: cap.max(1),
            channel,
            armed: AtomicBool::new(false),
            solicited_only: AtomicBool::new(false),
            hook: OnceLock::new(),
            first: OnceLock::new(),
            arm_tally: OnceLock::new(),
            overflows: AtomicU64::new(0),
            queued: AtomicUsize::new(0),
            next_log_ns: AtomicU64::new(0),
            overflow_logs: AtomicU64::new(0),
            born: Instant::now(),
        }
    }

    /// A CQ of `cap` entries whose notifications run `hook` (instead of signaling a
    /// channel: its own one is signaled only by [`Cq::wake_waiters`]).
    pub fn with_notify(cap: usize, hook: Box<dyn Fn() + Send + Sync>) -> Result<Cq> {
        let cq = Cq::new(cap, Arc::new(EventFd::new()?));
        let _ = cq.hook.set(NotifyHook(hook));
        Ok(cq)
    }

    /// Adds a completion; false if the CQ was full. Config validation sizes CQs so that
    /// this cannot happen (the cliff the seed warns about), but the CQ does not rely on it:
    /// a full CQ keeps what it holds and drops the new completion (verbs: a CQ overrun loses
    /// completions and is an asynchronous error, after which the QPs feeding the CQ should
    /// go to ERR; the caller decides that on a false return). Each drop is counted
    /// (`overflows`); the log says so once, then at most once per 10 s with the running
    /// count, never once per completion, and never with the CQ's lock held (a log sink
    /// may poll this CQ).
    pub fn push(&self, wc: Wc) -> bool {
        self.push_solicited(wc, false)
    }

    /// As [`Cq::push`], for a receive completion whose message was `solicited` (a CQ armed
    /// for solicited completions only notifies for those and for errors).
    pub fn push_solicited(&self, wc: Wc, solicited: bool) -> bool {
        // The arming is looked at under the queue's lock, as `arm` sets it: an arming
        // either comes before this entry (and may fire for it) or after it (and does not:
        // the entry was already queued).
        let (full, fire) = {
            let mut q = self.q.lock();
            let full = q.len() >= self.cap;
            let mut fire = false;
            if !full {
                // The hook runs before `queued` shows the entry: whoever sees
                // `maybe_nonempty` can also see what the hook did.
                if q.is_empty()
                    && let Some(h) = self.first.get()
                {
                    (h.0)();
                }
                q.push_back(wc);
                self.queued.store(q.len(), Ordering::Release);
                let wanted = solicited
                    || wc.status != WcStatus::Success
                    || !self.solicited_only.load(Ordering::Acquire);
                fire = wanted && self.take_arming();
            }
            (full, fire)
        };
        if full {
            self.overflowed(&wc);
            return false;
        }
        if fire {
            self.notify();
        }
        true
    }

    /// Clears the arming; true if the CQ was armed (the caller then notifies).
    fn take_arming(&self) -> bool {
        let was = self.armed.swap(false, Ordering::AcqRel);
        if was && let Some(t) = self.arm_tally.get() {
            t.fetch_sub(1, Ordering::SeqCst);
        }
        was
    }

    /// Sets the arming; true if the CQ was not armed before.
    fn set_arming(&self) -> bool {
        let was = self.armed.swap(true, Ordering::AcqRel);
        if !was && let Some(t) = self.arm_tally.get() {
            t.fetch_add(1, Ordering::SeqCst);
        }
        !was
    }

    /// Counts this CQ in `tally` while it is armed (incremented when an arming is set,
    /// decremented when it fires, is taken back, or the CQ goes): the soft device learns
    /// that its application waits on a channel rather than polling. Once per CQ: false if
    /// a tally was set.
    pub fn count_armings_in(&self, tally: Arc<AtomicUsize>) -> bool {
        self.arm_tally.set(tally).is_ok()
    }

    /// Whether the CQ is armed and has not fired.
    pub fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Acquire)
    }

    /// One notification: runs the hook of a CQ that has one (a verbs completion channel
    /// writes its record there), else signals the channel. A CQ with a hook signals its
    /// own channel only for [`Cq::wake_waiters`]: nobody sleeps on it for notifications,
    /// and the write cost an eventfd system call per completion event on the thread that
    /// added the completion (the progress thread, for a program waiting on a channel).
    fn notify(&self) {
        match self.hook.get() {
            Some(h) => (h.0)(),
            None => self.channel.signal(),
        }
    }

    /// Counts a dropped completion and logs, rate-limited (called without the lock).
    #[cold]
    fn overflowed(&self, wc: &Wc) {
        let n = self.overflows.fetch_add(1, Ordering::Relaxed) + 1;
        let now = self.born.elapsed().as_nanos() as u64;
        let due = self.next_log_ns.load(Ordering::Relaxed);
        if now < due
            || self
                .next_log_ns
                .compare_exchange(
                    due,
                    now.saturating_add(OVERFLOW_LOG_INTERVAL_NS),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        self.overflow_logs.fetch_add(1, Ordering::Relaxed);
        #[cfg(test)]
        tests::REPORT_HOOK.with(|h| {
            if let Some(h) = h.borrow().as_ref() {
                h(self)
            }
        });
        log::error!(
            target: "rdmx::cq",
            "completion queue overflow ({} entries, not polled fast enough): {n} completions \
             lost so far, the latest {wc:?} (logged at most every 10 s)",
            self.cap
        );
    }

    /// Sets what runs (on the thread that pushed, with the CQ's lock held: it must not
    /// touch the CQ) when a completion lands in an empty queue, armed or not: a caller that
    /// skips the CQs it found empty (`maybe_nonempty`) learns which to look at again
    /// without a look at each. Runs before `maybe_nonempty` turns true. Once per CQ: false
    /// if one was set.
    pub fn on_first(&self, hook: Box<dyn Fn() + Send + Sync>) -> bool {
        self.first.set(NotifyHook(hook)).is_ok()
    }

    /// Moves up to `out.len()` completions into `out`; returns how many.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let mut q = self.q.lock();
        let n = out.len().min(q.len());
        for (slot, wc) in out.iter_mut().zip(q.drain(..n)) {
            *slot = wc;
        }
        self.queued.store(q.len(), Ordering::Release);
        n
    }

    /// Arms the channel for rdmx's own waiters (the messenger, `rdmx_req_notify`): the
    /// next completion added signals it, and if completions are already queued it
    /// signals at once, so a waiter that arms and then sleeps cannot miss them. Verbs
    /// applications get [`Cq::arm`] instead.
    pub fn req_notify(&self) {
        self.arm(false);
        if !self.q.lock().is_empty() && self.take_arming() {
            self.notify();
        }
    }

    /// `ibv_req_notify_cq(cq, solicited_only)`, the verbs contract: the next completion
    /// added *after* this call signals (with `solicited_only`: the next solicited receive
    /// completion or error completion); completions already queued never do (the
    /// application polls them after arming, as verbs programs do). Arming an armed CQ
    /// keeps one pending notification; an arming for any completion is not narrowed by a
    /// later solicited-only one (as rxe and the IB spec: "next completion" wins until it
    /// fires).
    pub fn arm(&self, solicited_only: bool) {
        let _q = self.q.lock();
        if !self.armed.load(Ordering::Acquire) || self.solicited_only.load(Ordering::Acquire) {
            self.solicited_only.store(solicited_only, Ordering::Release);
        }
        self.set_arming();
    }

    /// Takes back an arming that has not fired: a thread that woke for another reason (its
    /// receiving sockets) and polls again has no use for the signal, which would cost an
    /// eventfd write now and a wakeup when it next sleeps.
    pub fn disarm(&self) {
        self.take_arming();
    }

    /// Signals the channel regardless of arming (a QP failed: waiters must look).
    pub fn wake_waiters(&self) {
        self.channel.signal();
    }

    pub fn len(&self) -> usize {
        self.q.lock().len()
    }

    /// Whether completions may be queued, without the lock: exact once the pushes and polls
    /// before the call are visible; a push racing it shows at the caller's next look.
    pub fn maybe_nonempty(&self) -> bool {
        self.queued.load(Ordering::Acquire) > 0
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Most completions the CQ holds (a push beyond drops, see `push`).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Completions dropped because the CQ was full.
    pub fn overflows(&self) -> u64 {
        self.overflows.load(Ordering::Relaxed)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // An armed CQ that goes leaves the tally.
        self.take_arming();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::sys::poll_readable;
    use crate::rc::WcOpcode;
    use std::cell::RefCell;
    use std::time::Duration;

    type Hook = Box<dyn Fn(&Cq)>;

    thread_local! {
        /// Runs where an overflow is logged (this thread's CQs only).
        pub(super) static REPORT_HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    fn wc(cookie: u64) -> Wc {
        Wc {
            cookie,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm: None,
            qp_num: 1,
            src_qp: None,
        }
    }

    /// The lock-free look follows pushes and polls, overflow included.
    #[test]
    fn maybe_nonempty_tracks_the_queue() {
        let cq = Cq::new(2, Arc::new(EventFd::new().unwrap()));
        assert!(!cq.maybe_nonempty());
        cq.push(wc(1));
        cq.push(wc(2));
        assert!(!cq.push(wc(3)));
        assert!(cq.maybe_nonempty());
        let mut out = [wc(0); 1];
        assert_eq!(cq.poll(&mut out), 1);
        assert!(cq.maybe_nonempty(), "one left");
        assert_eq!(cq.poll(&mut out), 1);
        assert!(!cq.maybe_nonempty());
    }

    /// The first-completion hook runs for a push into an empty queue only, armed or not,
    /// and once set it stays.
    #[test]
    fn on_first_runs_when_the_queue_was_empty() {
        let cq = Cq::new(4, Arc::new(EventFd::new().unwrap()));
        let runs = Arc::new(AtomicU64::new(0));
        let r = Arc::clone(&runs);
        assert!(cq.on_first(Box::new(move || {
            r.fetch_add(1, Ordering::Relaxed);
        })));
        assert!(!cq.on_first(Box::new(|| {})), "set once");
        cq.push(wc(1));
        cq.push(wc(2));
        assert_eq!(
            runs.load(Ordering::Relaxed),
            1,
            "the second found one queued"
        );
        let mut out = [wc(0); 4];
        assert_eq!(cq.poll(&mut out), 2);
        cq.push(wc(3));
        assert_eq!(runs.load(Ordering::Relaxed), 2, "emptied by the poll");
    }

    #[test]
    fn fifo_bounded_and_notifies_once_armed() {
        let ch = Arc::new(EventFd::new().unwrap());
        let cq = Cq::new(2, Arc::clone(&ch));
        let mut ready = Vec::new();
        cq.push(wc(1));
        poll_readable(&[ch.raw_fd()], Duration::ZERO, &mut ready).unwrap();
        assert!(ready.is_empty(), "not armed: no signal");
        cq.req_notify(); // already non-empty: signals at once
        poll_readable(&[ch.raw_fd()], Duration::ZERO, &mut ready).unwrap();
        assert_eq!(ready, vec![0]);
        ch.clear();
        assert!(cq.push(wc(2)));
        assert!(!cq.push(wc(3))); // overflow
        assert_eq!(cq.overflows(), 1);
        let mut out = [wc(0); 4];
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!((out[0].cookie, out[1].cookie), (1, 2));
        cq.req_notify();
        cq.push(wc(4));
        poll_readable(&[ch.raw_fd()], Duration::ZERO, &mut ready).unwrap();
        assert_eq!(ready, vec![0]);
        // An arming taken back does not fire; a new one does.
        ch.clear();
        assert_eq!(cq.poll(&mut out), 1);
        cq.req_notify();
        cq.disarm();
        cq.push(wc(5));
        poll_readable(&[ch.raw_fd()], Duration::ZERO, &mut ready).unwrap();
        assert!(ready.is_empty(), "disarmed: no signal");
        cq.req_notify();
        poll_readable(&[ch.raw_fd()], Duration::ZERO, &mut ready).unwrap();
        assert_eq!(ready, vec![0]);
    }

    fn signaled(ch: &EventFd) -> bool {
        let mut ready = Vec::new();
        poll_readable(&[ch.raw_fd()], Duration::ZERO, &mut ready).unwrap();
        let s = !ready.is_empty();
        ch.clear();
        s
    }

    /// A CQ with a notify hook (a verbs completion channel) runs the hook, once per arming,
    /// and leaves its own channel alone (an eventfd write nobody reads); `wake_waiters`
    /// still signals it.
    #[test]
    fn a_hooked_cq_runs_its_hook_instead_of_signaling() {
        let hits = Arc::new(AtomicUsize::new(0));
        let h = Arc::clone(&hits);
        let cq = Cq::with_notify(
            4,
            Box::new(move || {
                h.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap();
        cq.arm(false);
        cq.push(wc(1));
        cq.push(wc(2));
        assert_eq!(
            hits.load(Ordering::SeqCst),
            1,
            "one notification per arming"
        );
        assert!(
            !signaled(&cq.channel),
            "the hook replaces the channel's signal"
        );
        cq.wake_waiters();
        assert!(signaled(&cq.channel));
        assert_eq!(hits.load(Ordering::SeqCst), 1);
    }

    fn with_status(cookie: u64, status: WcStatus) -> Wc {
        Wc {
            status,
            ..wc(cookie)
        }
    }

    /// `ibv_req_notify_cq`: entries queued when the CQ is armed never signal, only the
    /// next new one does, once per arming.
    #[test]
    fn arm_signals_for_the_next_new_completion_only() {
        let ch = Arc::new(EventFd::new().unwrap());
        let cq = Cq::new(8, Arc::clone(&ch));
        cq.push(wc(1));
        cq.push(wc(2));
        cq.arm(false);
        assert!(!signaled(&ch), "queued before the arming: no event");
        assert!(cq.is_armed());
        cq.push(wc(3));
        assert!(signaled(&ch), "the next new completion signals");
        assert!(!cq.is_armed());
        cq.push(wc(4));
        assert!(!signaled(&ch), "one event per arming");
        // Arming twice leaves one notification.
        cq.arm(false);
        cq.arm(false);
        cq.push(wc(5));
        cq.push(wc(6));
        assert!(signaled(&ch));
        assert!(!cq.is_armed());
        // rdmx's own req_notify still signals at once for what is queued.
        cq.req_notify();
        assert!(signaled(&ch));
        assert!(!cq.is_armed());
    }

    /// `ibv_req_notify_cq(cq, 1)`: only a solicited completion or an error completion
    /// signals; an arming for any completion is not narrowed by a later solicited one,
    /// and a solicited arming is widened by a later one for any.
    #[test]
    fn solicited_only_arming_waits_for_solicited_or_error_completions() {
        let ch = Arc::new(EventFd::new().unwrap());
        let cq = Cq::new(16, Arc::clone(&ch));
        cq.arm(true);
        cq.push(wc(1));
        cq.push_solicited(wc(2), false);
        assert!(!signaled(&ch), "unsolicited successes do not signal");
        cq.push_solicited(wc(3), true);
        assert!(signaled(&ch), "a solicited receive signals");
        cq.arm(true);
        cq.push(with_status(4, WcStatus::WrFlushErr));
        assert!(signaled(&ch), "an error completion signals");
        // Any, then solicited-only: stays "any".
        cq.arm(false);
        cq.arm(true);
        cq.push(wc(5));
        assert!(signaled(&ch), "next-completion arming kept");
        // Solicited-only, then any: widened.
        cq.arm(true);
        cq.arm(false);
        cq.push(wc(6));
        assert!(signaled(&ch), "widened to any completion");
    }

    /// The device's tally counts armed CQs: up at an arming, down when it fires, is taken
    /// back, or the CQ goes.
    #[test]
    fn the_arm_tally_follows_armings() {
        let tally = Arc::new(AtomicUsize::new(0));
        let ch = Arc::new(EventFd::new().unwrap());
        let a = Cq::new(4, Arc::clone(&ch));
        let b = Cq::new(4, Arc::clone(&ch));
        assert!(a.count_armings_in(Arc::clone(&tally)));
        assert!(!a.count_armings_in(Arc::clone(&tally)), "once");
        assert!(b.count_armings_in(Arc::clone(&tally)));
        a.arm(false);
        a.arm(false);
        b.arm(true);
        assert_eq!(tally.load(Ordering::SeqCst), 2);
        a.push(wc(1));
        assert_eq!(tally.load(Ordering::SeqCst), 1, "fired");
        b.push(wc(2));
        assert_eq!(
            tally.load(Ordering::SeqCst),
            1,
            "not solicited: still armed"
        );
        b.disarm();
        assert_eq!(tally.load(Ordering::SeqCst), 0);
        a.arm(false);
        drop(a);
        assert_eq!(tally.load(Ordering::SeqCst), 0, "an armed CQ that goes");
    }

    /// A push racing an arming: the entry either fires the arming or was queued before it,
    /// never both missed (entry after the arming, no event) nor an event for an old entry.
    #[test]
    fn arming_and_pushing_race_without_lost_or_stale_events() {
        for _ in 0..200 {
            let ch = Arc::new(EventFd::new().unwrap());
            let cq = Arc::new(Cq::new(4, Arc::clone(&ch)));
            let c2 = Arc::clone(&cq);
            let t = std::thread::spawn(move || c2.push(wc(1)));
            cq.arm(false);
            t.join().unwrap();
            // Either the push came after the arming (event, disarmed) or before it (no
            // event, still armed).
            assert_ne!(signaled(&ch), cq.is_armed());
        }
    }

    /// A CQ nobody polls, flooded: it keeps its first `cap` completions, counts every
    /// lost one, logs once (not 100,000 times), and logs without its lock held.
    #[test]
    fn overflow_is_counted_and_logged_once_without_the_lock() {
        let ch = Arc::new(EventFd::new().unwrap());
        let cq = Cq::new(4, Arc::clone(&ch));
        let lock_free_when_logging = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&lock_free_when_logging);
        REPORT_HOOK.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |cq: &Cq| {
                // Where a log sink would run: it must be able to take the CQ's lock.
                if cq.q.try_lock().is_some() {
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            }))
        });
        let pushed = (0..100_004).filter(|&i| cq.push(wc(i))).count();
        REPORT_HOOK.with(|h| h.borrow_mut().take());
        assert_eq!(pushed, 4);
        assert_eq!(cq.len(), cq.capacity());
        assert_eq!(cq.overflows(), 100_000);
        assert_eq!(cq.overflow_logs.load(Ordering::Relaxed), 1);
        assert_eq!(lock_free_when_logging.load(Ordering::Relaxed), 1);
        let mut out = [wc(0); 8];
        assert_eq!(cq.poll(&mut out), 4);
        assert_eq!(
            out[..4].iter().map(|w| w.cookie).collect::<Vec<_>>(),
            vec![0, 1, 2, 3],
            "the oldest are kept, the new ones dropped"
        );
        assert!(cq.push(wc(9)), "room again once polled");
    }
}

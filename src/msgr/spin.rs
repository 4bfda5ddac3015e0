//! Polling before sleeping, that steps aside on a busy host.
//!
//! A progress loop that keeps polling for a while after its last event answers the next one
//! without a wake-up: measured on an idle host, a messenger server that polls 50 us gave
//! rpc_lat p50 24.6-28.4 us where one that sleeps at once gives 32.6-38.5 us. But on a host
//! whose cores are all busy, a polling thread is time-sliced with the other runnable ones
//! and holds the core its peer needs: spinning 1 ms gave rpc_bw 5-14K ops/s against 26-36K
//! sleeping at once (load 4-6 on 2 cores).
//!
//! So a [`Spinner`] polls for its budget only while its thread gets a CPU when it wants one:
//! every [`WINDOW`] it reads the thread's scheduler statistics
//! (`/proc/thread-self/schedstat`: time on a CPU, time runnable but waiting for one) and
//! the thread counts as contended while more than [`CONTENDED_PERCENT`] of its runnable
//! time in the last window was waiting. A contended thread sleeps at once after an empty
//! poll (a sleeper is woken when its work comes; a spinner waits for a time slice).
//!
//! Measured on this project's 2-core hosts (fio rpc mode against rdmx-target, 2 s windows):
//! fio's thread and the target's waited 1.6-2.8% of their runnable time on an idle host and
//! 19-56% beside two busy loops; the share does not depend on whether the thread spins or
//! sleeps. The count of involuntary context switches, which this used before, does not
//! separate them (fio: ~400/s in both cases), and one preemption cost a flat 100 ms of
//! sleeping at every empty poll: fio was preempted 8 times in a 4 s run on an idle host,
//! slept through ~0.8 s of it between batches, and paid a wake-up per batch there.

use std::time::{Duration, Instant};

/// The scheduling attributes of `sched_setattr(2)` (`SCHED_ATTR_SIZE_VER0`, 48 bytes).
#[repr(C)]
#[derive(Debug, Default)]
struct SchedAttr {
    size: u32,
    sched_policy: u32,
    sched_flags: u64,
    sched_nice: i32,
    sched_priority: u32,
    /// For SCHED_OTHER/SCHED_BATCH (Linux 6.12+, EEVDF): the task's slice, in ns.
    sched_runtime: u64,
    sched_deadline: u64,
    sched_period: u64,
}

/// Asks the kernel for a shorter time slice for the calling thread (its policy and nice
/// value unchanged). On a busy host this is what gets a messenger worker onto a CPU when
/// its work arrives: the kernel's EEVDF scheduler (Linux 6.6+) lets a thread that wakes
/// preempt the running one only once that one has run its slice, unless the waking thread's
/// slice is shorter (`PREEMPT_SHORT`, 6.12+: a custom slice through `sched_runtime`). A
/// worker woken by a request behind a CPU hog otherwise waits for the hog's slice (a few
/// ms) on every wake-up. The slice does not change the thread's share of the CPU (its
/// weight, from nice), only how soon it runs and how long at a time. Kernels before 6.12
/// accept the call and ignore the value. `slice` is clamped by the kernel to 0.1-100 ms.
///
/// Why not `sched_yield` while spinning (as rdmx-ibv's `poll_yield_after`): under EEVDF a
/// yield moves the thread's deadline a whole slice later each time, so a thread that
/// yields on every empty poll falls behind every other runnable thread exactly when its
/// work arrives; the spinning here stops instead (a contended [`Spinner`] sleeps at once),
/// and the short slice makes the wake-up prompt.
pub(crate) fn set_thread_slice(slice: Duration) -> std::io::Result<()> {
    // SAFETY: sched_getscheduler(0) reads the calling thread's policy; no pointers.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SCHED_RESET_ON_FORK may be or-ed in; real-time and deadline threads have no slice.
    let policy = policy & !libc::SCHED_RESET_ON_FORK;
    if policy != libc::SCHED_OTHER && policy != libc::SCHED_BATCH {
        return Ok(());
    }
    // getpriority returns -1 for nice -1 too: errno tells them apart.
    // SAFETY: __errno_location returns this thread's errno; getpriority has no pointers
    // (PRIO_PROCESS with 0: the calling thread on Linux).
    let nice = unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, 0)
    };
    if nice == -1 && std::io::Error::last_os_error().raw_os_error() != Some(0) {
        return Err(std::io::Error::last_os_error());
    }
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_policy: policy as u32,
        sched_nice: nice,
        sched_runtime: slice.as_nanos().min(u128::from(u64::MAX)) as u64,
        ..SchedAttr::default()
    };
    // SAFETY: sched_setattr(0 = this thread, a valid sched_attr of the size it says, flags 0).
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's slice as the kernel keeps it (`sched_getattr`: the `sched_runtime`
/// of a SCHED_OTHER thread, 6.12+; zero on kernels without custom slices).
#[cfg(test)]
pub(crate) fn thread_slice() -> std::io::Result<Duration> {
    let mut attr = SchedAttr::default();
    let size = std::mem::size_of::<SchedAttr>() as u32;
    // SAFETY: sched_getattr(0 = this thread) writes at most `size` bytes into `attr`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut SchedAttr,
            size,
            0u32,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Duration::from_nanos(attr.sched_runtime))
}

/// How often a spinning thread's share of waiting is measured.
pub(crate) const WINDOW: Duration = Duration::from_millis(20);
/// A thread that waited for a CPU more than this share of its runnable time is contended.
pub(crate) const CONTENDED_PERCENT: u64 = 10;
/// A window with less runnable time than this (the thread slept) leaves the verdict as it
/// was: too little to tell.
const MIN_RUNNABLE_NS: u64 = 1_000_000;

/// A thread's scheduler times (nanoseconds since it started): on a CPU, and runnable but
/// waiting for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SchedTimes {
    pub on_cpu: u64,
    pub waiting: u64,
}

/// Parses `/proc/<tid>/schedstat`: "on_cpu_ns run_delay_ns timeslices".
fn parse_schedstat(s: &str) -> Option<SchedTimes> {
    let mut it = s.split_ascii_whitespace().map(str::parse::<u64>);
    Some(SchedTimes {
        on_cpu: it.next()?.ok()?,
        waiting: it.next()?.ok()?,
    })
}

/// The calling thread's scheduler times; None where the kernel does not keep them (no
/// `CONFIG_SCHED_INFO`): such a thread is never counted as contended.
fn thread_sched_times() -> Option<SchedTimes> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    parse_schedstat(&s)
}

/// The calling thread's id (a spinner may be used by more than one thread over time; a
/// window spans one thread only).
fn thread_id() -> u64 {
    thread_local! {
        // Read once per thread: `poll_again` asks on every empty poll, and gettid is a
        // system call.
        static TID: u64 = {
            // SAFETY: gettid has no preconditions.
            unsafe { libc::gettid() as u64 }
        };
    }
    TID.with(|t| *t)
}

/// Whether a thread is contended, from its scheduler times measured every [`WINDOW`].
#[derive(Debug, Default)]
struct Contention {
    /// The last measurement: when, on which thread, the times.
    last: Option<(Instant, u64, SchedTimes)>,
    contended: bool,
}

impl Contention {
    /// The verdict at `now`, measuring again (with `read`, on thread `tid`) when the last
    /// measurement is a [`WINDOW`] old.
    fn at(&mut self, now: Instant, tid: u64, read: impl FnOnce() -> Option<SchedTimes>) -> bool {
        if let Some((at, t, _)) = self.last
            && t == tid
            && now.saturating_duration_since(at) < WINDOW
        {
            return self.contended;
        }
        let Some(times) = read() else {
            self.last = None;
            self.contended = false;
            return false;
        };
        if let Some((_, t, prev)) = self.last
            && t == tid
        {
            let on_cpu = times.on_cpu.saturating_sub(prev.on_cpu);
            let waiting = times.waiting.saturating_sub(prev.waiting);
            let runnable = on_cpu + waiting;
            if runnable >= MIN_RUNNABLE_NS {
                self.contended = waiting * 100 > runnable * CONTENDED_PERCENT;
            }
        }
        self.last = Some((now, tid, times));
        self.contended
    }
}

/// The polling state of one progress loop.
#[derive(Debug)]
pub(crate) struct Spinner {
    /// How long to poll after the last event: None = always (`poll_mode=busy`: the caller
    /// asked for it, no backing off), zero = sleep at once.
    budget: Option<Duration>,
    /// The first empty poll since the last event or sleep.
    idle_since: Option<Instant>,
    /// Slept since the last work: no polling until there is some.
    spent: bool,
    contention: Contention,
    /// Spins given up because the thread was contended, since `take_backoffs`.
    backoffs: u64,
}

impl Spinner {
    pub(crate) fn new(budget: Option<Duration>) -> Spinner {
        Spinner {
            budget,
            idle_since: None,
            spent: false,
            contention: Contention::default(),
            backoffs: 0,
        }
    }

    /// The loop found work: the next empty poll starts a new spin.
    #[inline]
    pub(crate) fn work(&mut self) {
        self.idle_since = None;
        self.spent = false;
    }

    /// The loop slept: no more polling until it finds work again (a wake-up for a timer
    /// alone does not start a spin).
    pub(crate) fn slept(&mut self) {
        self.work();
        self.spent = true;
    }

    /// After an empty poll at `now`: whether to poll again (false: sleep, then `slept`).
    pub(crate) fn poll_again(&mut self, now: Instant) -> bool {
        self.poll_again_with(now, thread_id(), thread_sched_times)
    }

    /// `poll_again` on thread `tid`, whose scheduler times `read` gives (read once per
    /// [`WINDOW`] at most).
    fn poll_again_with(
        &mut self,
        now: Instant,
        tid: u64,
        read: impl FnOnce() -> Option<SchedTimes>,
    ) -> bool {
        let Some(budget) = self.budget else {
            return true;
        };
        if budget.is_zero() || self.spent {
            return false;
        }
        let since = *self.idle_since.get_or_insert(now);
        if self.contention.at(now, tid, read) {
            self.backoffs += 1;
            self.work();
            return false;
        }
        if now.saturating_duration_since(since) < budget {
            true
        } else {
            self.work();
            false
        }
    }

    /// How often polling was given up because the thread was contended, since the last
    /// call (for the owner's counter).
    pub(crate) fn take_backoffs(&mut self) -> u64 {
        std::mem::take(&mut self.backoffs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// Scheduler times that never show waiting.
    fn idle() -> Option<SchedTimes> {
        Some(SchedTimes {
            on_cpu: 0,
            waiting: 0,
        })
    }

    #[test]
    fn polls_for_its_budget_then_sleeps() {
        let t0 = Instant::now();
        let mut s = Spinner::new(Some(us(50)));
        let polls: Vec<bool> = (0..8)
            .map(|i| s.poll_again_with(t0 + us(10 * i), 1, idle))
            .collect();
        // 0, 10, ..., 40 us into the idle time: poll; 50: sleep.
        assert_eq!(&polls[..6], &[true, true, true, true, true, false]);
        // A wake-up with nothing to do sleeps again; work starts a new spin.
        s.slept();
        assert!(!s.poll_again_with(t0 + us(1000), 1, idle));
        s.work();
        assert!(s.poll_again_with(t0 + us(1001), 1, idle));
        assert_eq!(s.take_backoffs(), 0);
    }

    #[test]
    fn zero_never_polls_and_none_always_does() {
        let t0 = Instant::now();
        let mut zero = Spinner::new(Some(Duration::ZERO));
        let mut always = Spinner::new(None);
        let mut n = 0;
        let mut waiting = || {
            // All runnable time spent waiting: contended, were anyone asking.
            n += 10_000_000;
            Some(SchedTimes {
                on_cpu: 0,
                waiting: n,
            })
        };
        for i in 0..4 {
            let now = t0 + Duration::from_millis(30 * i);
            assert!(!zero.poll_again_with(now, 1, &mut waiting));
            // Busy polling was asked for: it does not back off.
            assert!(always.poll_again_with(now, 1, &mut waiting));
        }
        assert_eq!(always.take_backoffs(), 0);
    }

    /// Scheduler times of a thread that runs `cpu_us` and waits `wait_us` per window.
    struct Clock {
        cpu_us: u64,
        wait_us: u64,
        times: SchedTimes,
        reads: u32,
    }

    impl Clock {
        fn new() -> Clock {
            Clock {
                cpu_us: 0,
                wait_us: 0,
                times: SchedTimes {
                    on_cpu: 5_000_000_000,
                    waiting: 7_000_000,
                },
                reads: 0,
            }
        }

        fn rates(&mut self, cpu_us: u64, wait_us: u64) -> &mut Clock {
            self.cpu_us = cpu_us;
            self.wait_us = wait_us;
            self
        }

        fn read(&mut self) -> Option<SchedTimes> {
            self.reads += 1;
            self.times.on_cpu += self.cpu_us * 1000;
            self.times.waiting += self.wait_us * 1000;
            Some(self.times)
        }
    }

    #[test]
    fn a_thread_that_waits_for_a_cpu_sleeps_at_once_until_it_does_not() {
        let mut at = Instant::now();
        let mut s = Spinner::new(Some(us(1000)));
        let mut c = Clock::new();
        // Idle host: 19.6 ms on the CPU, 0.4 ms waiting (2%) per window: polls.
        c.rates(19_600, 400);
        for _ in 0..3 {
            s.work();
            assert!(s.poll_again_with(at, 1, || c.read()));
            assert!(s.poll_again_with(at + us(10), 1, || c.read()));
            at += WINDOW;
        }
        // Measured once per window, not per poll.
        assert_eq!(c.reads, 3);
        assert_eq!(s.take_backoffs(), 0);
        // Busy host: 10 ms on the CPU, 10 ms waiting per window (50%): an empty poll sleeps
        // at once, right after work too, every time.
        c.rates(10_000, 10_000);
        for _ in 0..3 {
            s.work();
            assert!(!s.poll_again_with(at, 1, || c.read()));
            s.work();
            assert!(!s.poll_again_with(at + us(10), 1, || c.read()));
            at += WINDOW;
        }
        assert_eq!(s.take_backoffs(), 6);
        // 8% waiting is not contended; 12% is.
        for (cpu, wait, polls) in [(23_000, 2_000, true), (22_000, 3_000, false)] {
            c.rates(cpu, wait);
            s.work();
            assert_eq!(s.poll_again_with(at, 1, || c.read()), polls, "{wait}/{cpu}");
            at += WINDOW;
        }
        // A window the thread mostly slept through (0.5 ms runnable, all of it waiting)
        // tells nothing: the verdict stands.
        c.rates(23_000, 2_000);
        s.work();
        assert!(s.poll_again_with(at, 1, || c.read()));
        at += WINDOW;
        c.rates(0, 500);
        s.work();
        assert!(s.poll_again_with(at, 1, || c.read()));
    }

    #[test]
    fn a_window_spans_one_thread_and_missing_statistics_mean_not_contended() {
        let t0 = Instant::now();
        let mut s = Spinner::new(Some(us(1000)));
        let mut busy = Clock::new();
        busy.rates(10_000, 10_000);
        assert!(s.poll_again_with(t0, 1, || busy.read()));
        assert!(!s.poll_again_with(t0 + WINDOW, 1, || busy.read()));
        // Another thread takes the spinner: it measures at once (the verdict was the
        // other thread's), and its first reading is only a baseline (no delta across
        // threads), so the verdict stands until its own window.
        s.work();
        let mut other = Clock::new();
        other.times.waiting = 0;
        assert!(!s.poll_again_with(t0 + WINDOW + us(1), 2, || other.read()));
        assert_eq!(other.reads, 1);
        other.rates(20_000, 0);
        s.work();
        assert!(s.poll_again_with(t0 + WINDOW * 2 + us(1), 2, || other.read()));
        // No schedstat: polling as budgeted.
        busy.rates(10_000, 10_000);
        let _ = s.poll_again_with(t0 + WINDOW * 3, 2, || busy.read());
        s.work();
        assert!(s.poll_again_with(t0 + WINDOW * 4, 2, || None));
        assert!(s.poll_again_with(t0 + WINDOW * 4 + us(5), 2, || None));
    }

    #[test]
    fn a_thread_gets_the_slice_it_asks_for() {
        // On a thread of its own: the test harness's threads are shared.
        std::thread::spawn(|| {
            // SAFETY: getpriority has no pointers.
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
            let before = thread_slice().expect("sched_getattr");
            set_thread_slice(Duration::from_micros(150)).expect("sched_setattr");
            let after = thread_slice().expect("sched_getattr");
            if before.is_zero() {
                // A kernel without custom slices (before 6.12) keeps none to read back.
                assert!(after.is_zero(), "{after:?}");
            } else {
                assert_eq!(after, Duration::from_micros(150), "was {before:?}");
            }
            // Nice is kept.
            // SAFETY: getpriority has no pointers.
            assert_eq!(unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }, nice);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn reads_this_threads_schedstat() {
        assert_eq!(
            parse_schedstat("374599 1200 2\n"),
            Some(SchedTimes {
                on_cpu: 374_599,
                waiting: 1200
            })
        );
        assert_eq!(parse_schedstat("12\n"), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
        // The kernels this project runs on keep them (CONFIG_SCHED_INFO), and a thread
        // that computes for 10 ms of its CPU time shows most of it (the kernel brings the
        // figure up to date at its ticks and switches).
        let t0 = thread_sched_times().expect("/proc/thread-self/schedstat");
        let cpu = || {
            let mut t = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: a valid timespec to write into.
            unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
            Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
        };
        let (c0, wall) = (cpu(), Instant::now());
        while cpu() - c0 < Duration::from_millis(10) && wall.elapsed() < Duration::from_secs(5) {
            std::hint::spin_loop();
        }
        let t1 = thread_sched_times().expect("/proc/thread-self/schedstat");
        assert!(t1.on_cpu - t0.on_cpu >= 5_000_000, "{t0:?} -> {t1:?}");
    }
}

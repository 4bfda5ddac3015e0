//! The messenger's polling before sleeping backs off while its thread waits for a CPU
//! (`src/msgr/spin.rs`): a caller polling with a long spin budget, time-sliced on one CPU
//! with a busy thread of the same process, stops polling and sleeps (counted in
//! `spin_backoffs`), where `poll_mode=busy` keeps polling as asked.

use rdmx::config::Config;
use rdmx::msgr::messenger::{Dispatcher, InMessage, Messenger, SessionId};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

struct Quiet;

impl Dispatcher for Quiet {
    fn on_message(&self, _m: &Messenger, _s: SessionId, _msg: InMessage) {}
}

fn messenger(kv: &[(&str, &str)]) -> Messenger {
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    c.set("msgr_threads", "0").unwrap();
    for (k, v) in kv {
        c.set(k, v).unwrap();
    }
    Messenger::new(&c, Arc::new(Quiet)).unwrap()
}

/// Pins the calling thread (and the threads it spawns afterwards) to the CPU it runs on.
fn pin_to_one_cpu() {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the libc macros only touch it;
    // sched_getcpu and sched_setaffinity(0, ...) act on the calling thread.
    unsafe {
        let cpu = libc::sched_getcpu().max(0) as usize;
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "sched_setaffinity"
        );
    }
}

/// Polls `m` for `wall` on one CPU shared with a busy thread; returns the messenger's
/// backoff count and the CPU time this thread used.
fn poll_beside_a_hog(m: &Messenger, wall: Duration) -> (u64, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        pin_to_one_cpu(); // the hog below inherits the pin
        let st = Arc::clone(&stop);
        let hog = s.spawn(move || {
            let end = Instant::now() + Duration::from_secs(20);
            while !st.load(Ordering::Relaxed) && Instant::now() < end {
                std::hint::spin_loop();
            }
        });
        let cpu0 = thread_cpu();
        let end = Instant::now() + wall;
        while Instant::now() < end {
            m.poll(Duration::from_millis(20)).unwrap();
        }
        let used = thread_cpu() - cpu0;
        stop.store(true, Ordering::Relaxed);
        hog.join().unwrap();
        (m.stats().spin_backoffs, used)
    })
}

fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[test]
fn a_preempted_poller_backs_off_and_a_busy_one_does_not() {
    // One test (one thread pinned at a time): a 1 s budget would otherwise spin through
    // the whole second.
    let wall = Duration::from_millis(600);
    let adaptive = messenger(&[("poll_mode", "adaptive"), ("polling_us", "1000000")]);
    let (backoffs, used) = poll_beside_a_hog(&adaptive, wall);
    assert!(
        backoffs >= 1,
        "the adaptive poller never backed off (CPU {used:?} of {wall:?})"
    );
    // It slept instead of taking its half of the CPU (measured: 14-17 ms of 600, its first
    // 20 ms window of measuring, half of it on the CPU).
    assert!(
        used < wall / 8,
        "the adaptive poller used {used:?} of {wall:?} beside a busy thread ({backoffs} backoffs)"
    );
    drop(adaptive);

    let busy = messenger(&[("poll_mode", "busy")]);
    let (backoffs, used) = poll_beside_a_hog(&busy, wall);
    assert_eq!(backoffs, 0, "poll_mode=busy never backs off");
    // Time-sliced with the hog, it took its share of the CPU (measured: 300 ms of 600).
    assert!(
        used > wall / 6,
        "the busy poller used only {used:?} of {wall:?}"
    );
}

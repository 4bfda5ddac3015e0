//! The seeded simulator: two processes drive session machines through simulated RC
//! links under a fault schedule drawn from the seed (QP errors, side-channel closes in
//! either order against completions, black holes of any length, either process
//! restarting, slow consumers, small pools and windows that starve credits, keepalive
//! timers racing traffic), and the invariants are checked after every event:
//! - every message is delivered at most once, in order, to the session it was sent to;
//!   a send completes once, `Ok` only if delivered; `Err` only when its session ended
//!   (lossy: every send of unknown fate is reported);
//! - lossless sessions without a restart or an outage beyond the reconnect budget
//!   never reset and deliver everything exactly once;
//! - no frame is sent without a receive posted for it (credits never negative) and no
//!   send queue overruns; held messages and posted receives stay within their bounds;
//! - everything completes within [`BOUND`] of virtual time after the last fault (no
//!   credit deadlock, no lost wake-up).
//!
//! `RDMX_MSGR_SIM_SEEDS=N` runs N seeds (default 10,000), from `RDMX_MSGR_SIM_FIRST`
//! (default 0), on `RDMX_MSGR_SIM_THREADS` threads (default 1; a long run gives it the
//! host's cores); a failing seed prints its trace and the command that replays it alone:
//! `RDMX_MSGR_SIM_SEED=<seed> cargo test -p rdmx --lib msgr::messenger::machine::sim::one_seed -- --nocapture`.

mod app;
mod ledger;
mod links;
mod net;
mod world;

use super::Rules;
use ledger::Fate;
use net::{Fault, MS, Ns, Rng, US};
use std::time::Duration;
use world::{Params, World};

/// Virtual time after the last fault within which everything must have completed.
pub const BOUND: Ns = 5_000 * MS;

/// What a run did (the long run reports the totals).
#[derive(Debug, Default, Clone, Copy)]
pub struct Summary {
    /// Sessions reset at the connector and at the acceptor.
    pub resets_by_side: [u32; 2],
    pub sent: usize,
    pub failed: usize,
    pub died: usize,
    pub resets: u32,
    pub faults: usize,
    pub replays: u64,
    pub duplicates: u64,
    pub events: u64,
    /// Path events: down, up (joined), active (switches).
    pub path_events: [u32; 3],
    /// Messages sent on each of the first three paths, both sides (active/active seeds
    /// only, and those sessions: both paths carry data).
    pub active_path_msgs: [u64; 3],
    /// Active/active seeds.
    pub active_seeds: u32,
}

/// A black hole's length: mostly short, some beyond the retry budget, a few beyond the
/// keepalive timeout and near the reconnect budget.
fn hole_len(rng: &mut Rng) -> Ns {
    match rng.below(10) {
        0..7 => rng.range(100 * US, 8 * MS),
        7..9 => rng.range(8 * MS, 60 * MS),
        _ => rng.range(60 * MS, 1_000 * MS),
    }
}

fn params(rng: &mut Rng) -> Params {
    let lossy = rng.pct(30);
    let win_min = rng.range(2, 6) as u32;
    // `msgr_recv_window` is at least 4 (config/keys.rs): at 2, two sides with data
    // queued spend every credit announcing the one the other just used.
    let win = (win_min << rng.below(4)).max(4);
    let rules = Rules {
        keepalive: (!rng.pct(10)).then(|| Duration::from_millis(rng.range(5, 40))),
        // A probe shorter than the keepalive (the driver's rule), or none.
        probe: rng.pct(50).then(|| Duration::from_millis(rng.range(2, 5))),
        keepalive_timeout: Duration::from_millis(100),
        reconnect_min: Duration::from_millis(1),
        reconnect_max: Duration::from_millis(16),
        reconnect_timeout: Duration::from_millis(300),
        reconnect_attempts: 0,
        send_queue_msgs: rng.range(2, 64) as usize,
        send_queue_bytes: rng.range(16 << 10, 1 << 20),
        recv_window_min: win_min,
        recv_window: win,
        eager_write: rng.pct(50),
        path_failback: rng.pct(70),
    };
    let mut pool = [0; 2];
    for p in &mut pool {
        *p = rng.range(u64::from(3 * win_min + 2), u64::from(4 * win + 8)) as u32;
    }
    // Sessions of one path (as before issue 30), two and three.
    let paths = match rng.below(100) {
        0..40 => 1,
        40..85 => 2,
        _ => 3,
    };
    let mut faults = Vec::new();
    for _ in 0..rng.below(7) {
        let at = rng.below(300 * MS);
        let side = rng.below(2) as usize;
        let path = rng.below(paths) as usize;
        let roll = if paths == 1 {
            rng.below(100)
        } else {
            // Half the faults hit one path.
            match rng.below(100) {
                0..50 => rng.below(100),
                r => 100 + r,
            }
        };
        let f = match roll {
            0..30 => Fault::QpError(side),
            30..60 => Fault::SideChannel(side),
            60..90 => Fault::BlackHole(hole_len(rng)),
            90..100 => Fault::Restart(side),
            100..120 => Fault::PathQpError(side, path),
            120..130 => Fault::PathSideChannel(side, path),
            _ => Fault::PathHole(path, hole_len(rng)),
        };
        faults.push((at, f));
    }
    // Active/active for half the multipath seeds (drawn last: the draws above are as
    // before it existed).
    let active = paths > 1 && rng.pct(50);
    if active {
        // The receiver's hold (messages ahead of a gap a failed link left) keeps their
        // chunks until the replay fills the gap, and the replay needs receives posted:
        // the pool must hold the peer's send queue (the hold's bound) beyond the windows,
        // or the hold starves the replay (seed 4318: pool 0, 7 held, the gap message
        // waiting for a credit). docs/failover.md states the rule for the driver's pool.
        for p in &mut pool {
            *p += rules.send_queue_msgs as u32;
        }
    }
    Params {
        rules,
        lossy,
        quota: [rng.range(10, 150) as u32, rng.range(0, 100) as u32],
        pool,
        slow: [rng.pct(15), rng.pct(15)],
        conn_listens: rng.pct(70),
        send_gap: rng.range(0, 500 * US),
        paths: paths as usize,
        active,
        faults,
    }
}

/// Runs one seed. `trace`: keep the event list (returned with the error).
pub fn run(seed: u64, trace: bool) -> Result<Summary, (String, Vec<String>)> {
    let mut rng = Rng::new(seed);
    let p = params(&mut rng);
    run_params(p, rng, trace)
}

/// Runs a schedule whose parameters are given (the scenario tests), with `rng` for the
/// rest (delays, which frames a failure keeps).
pub fn run_params(p: Params, rng: Rng, trace: bool) -> Result<Summary, (String, Vec<String>)> {
    // No reset is expected of a lossless session when no process restarts and no outage
    // comes near the reconnect budget.
    // With several paths, a long outage of one path alone is calm too (the others carry
    // the session), unless another path is out meanwhile.
    let long = |f: &Fault| match *f {
        Fault::BlackHole(len) if len >= 60 * MS => Some((None, len)),
        Fault::PathHole(p, len) if len >= 60 * MS => Some((Some(p), len)),
        _ => None,
    };
    let outages: Vec<(Option<usize>, Ns, Ns)> = p
        .faults
        .iter()
        .filter_map(|(t, f)| long(f).map(|(path, len)| (path, *t, t + len + 400 * MS)))
        .collect();
    let overlapping = outages.iter().enumerate().any(|(i, a)| {
        a.0.is_none()
            || p.paths == 1
            || outages[i + 1..]
                .iter()
                .any(|b| (b.0.is_none() || b.0 != a.0) && a.1 < b.2 && b.1 < a.2)
    });
    let calm = !p.lossy
        && !overlapping
        && p.faults
            .iter()
            .all(|(_, f)| !matches!(f, Fault::Restart(_)));
    let faults_end = p
        .faults
        .iter()
        .map(|(t, f)| match f {
            Fault::BlackHole(len) | Fault::PathHole(_, len) => t + len,
            _ => *t,
        })
        .max()
        .unwrap_or(0);
    let nfaults = p.faults.len();
    let mut w = World::new(p, rng, trace);
    let mut events = 0u64;
    let mut finished = false;
    while let Some((t, ev)) = w.q.pop() {
        if t > faults_end + BOUND {
            break;
        }
        w.handle(t, ev);
        w.check_bounds();
        events += 1;
        if events > 2_000_000 {
            let state = w.describe();
            w.violation(format!("runaway: {events} events; {state}"));
        }
        if w.err.is_some() {
            break;
        }
        if t >= faults_end && w.settled() {
            finished = true;
            break;
        }
    }
    // Nothing left to happen (no keepalive, nothing timed) and nothing owed: settled.
    finished |= w.err.is_none() && w.q.is_empty() && w.settled();
    if w.err.is_none() && !finished {
        let (a, b) = (w.procs[0].sent, w.procs[1].sent);
        let pending = w.ledger.pending();
        let state = w.describe();
        w.violation(format!(
            "not settled {} ms after the last fault: {pending} sends pending, sent {a}/{} \
             and {b}/{}; {state}",
            BOUND / MS,
            w.p.quota[0],
            w.p.quota[1]
        ));
    }
    if w.err.is_none() && calm && (w.resets != [0, 0] || w.ledger.count(Fate::Err) > 0) {
        let r = w.resets;
        w.violation(format!(
            "a lossless session reset without cause: resets {r:?}"
        ));
    }
    if let Some(e) = w.err.take() {
        return Err((e, w.trace.take().unwrap_or_default()));
    }
    let mut s = Summary {
        resets_by_side: w.resets,
        sent: w.ledger.sent.len(),
        failed: w.ledger.count(Fate::Err),
        died: w.ledger.count(Fate::Died),
        resets: w.resets[0] + w.resets[1],
        faults: nfaults,
        events,
        path_events: w.path_events,
        ..Summary::default()
    };
    for p in &w.procs {
        for m in p.sessions.iter().flatten().map(|s| &s.m) {
            s.replays += m.counters.replays;
            s.duplicates += m.counters.duplicates_dropped;
            if m.is_active() {
                for (i, n) in s.active_path_msgs.iter_mut().enumerate() {
                    *n += m.path(i).map_or(0, |p| p.counters.msgs_sent);
                }
            }
        }
    }
    s.active_seeds = u32::from(w.p.active);
    Ok(s)
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs `seed`; on a violation prints its trace (the last lines) and the replay command.
fn check(seed: u64) -> Summary {
    match run(seed, false) {
        Ok(s) => s,
        Err((e, _)) => {
            let (_, trace) = run(seed, true).err().unwrap_or_default();
            let from = trace.len().saturating_sub(400);
            eprintln!("--- seed {seed}: last {} events ---", trace.len() - from);
            for line in &trace[from..] {
                eprintln!("{line}");
            }
            panic!(
                "seed {seed}: {e}\nreplay: RDMX_MSGR_SIM_SEED={seed} cargo test -p rdmx --lib \
                 msgr::messenger::machine::sim::one_seed -- --nocapture"
            );
        }
    }
}

impl Summary {
    /// Adds another run's counts to these.
    fn add(&mut self, s: &Summary) {
        for k in 0..2 {
            self.resets_by_side[k] += s.resets_by_side[k];
        }
        self.sent += s.sent;
        self.failed += s.failed;
        self.died += s.died;
        self.resets += s.resets;
        self.faults += s.faults;
        self.replays += s.replays;
        self.duplicates += s.duplicates;
        self.events += s.events;
        for k in 0..3 {
            self.path_events[k] += s.path_events[k];
            self.active_path_msgs[k] += s.active_path_msgs[k];
        }
        self.active_seeds += s.active_seeds;
    }
}

/// Seeds `first..first + n` on `threads` threads (contiguous shares), summed. The first
/// failing seed stops the others at their next seed, and its panic (with the trace and
/// the replay command, printed by [`check`]) is the test's.
fn run_seeds(first: u64, n: u64, threads: u64) -> Summary {
    use std::sync::atomic::{AtomicBool, Ordering};
    let threads = threads.clamp(1, n.max(1));
    let stop = AtomicBool::new(false);
    let per = n.div_ceil(threads);
    std::thread::scope(|sc| {
        let workers: Vec<_> = (0..threads)
            .map(|k| {
                let (from, to) = (first + k * per, (first + (k + 1) * per).min(first + n));
                let stop = &stop;
                sc.spawn(move || {
                    let mut t = Summary::default();
                    for seed in from..to {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        match std::panic::catch_unwind(|| check(seed)) {
                            Ok(s) => t.add(&s),
                            Err(e) => {
                                stop.store(true, Ordering::Relaxed);
                                std::panic::resume_unwind(e);
                            }
                        }
                    }
                    t
                })
            })
            .collect();
        let mut t = Summary::default();
        let mut failed = None;
        for w in workers {
            match w.join() {
                Ok(s) => t.add(&s),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            std::panic::resume_unwind(e);
        }
        t
    })
}

/// Seeds that once failed, run on their own in every `cargo test` (each names what it
/// found).
#[test]
fn seeds_that_once_failed_pass() {
    // A keepalive due behind a black-holed link's full send queue: its timer came due
    // again at once, 1,000 passes per microsecond (the 1M-seed run of 2026-12-04).
    check(549_854);
    // Active/active: the acknowledgement of the primary's last pump was refused with the
    // link, and the peer, with nothing more to send, waited for it for ever.
    check(579_711);
    // Failback with keepalives off: the old path kept the receives the acceptor's window
    // had grown to, its pool was empty, and the connector starved on the new path for
    // good (one-credit announcements passed back and forth).
    check(741_131);
}

#[test]
fn seeds_split_over_threads_cover_the_range_once() {
    // Summed counts over threads equal the single-thread run's (every seed ran once).
    let one = run_seeds(7, 23, 1);
    let three = run_seeds(7, 23, 3);
    assert_eq!(format!("{one:?}"), format!("{three:?}"));
    assert!(one.events > 0);
}

#[test]
fn seeded_schedules_hold_every_invariant() {
    let n = env("RDMX_MSGR_SIM_SEEDS").unwrap_or(10_000);
    let first = env("RDMX_MSGR_SIM_FIRST").unwrap_or(0);
    let threads = env("RDMX_MSGR_SIM_THREADS").unwrap_or(1);
    let t = run_seeds(first, n, threads);
    eprintln!("msgr sim: {n} seeds from {first}: {t:?}");
    // The schedules do exercise what they claim to. (Duplicates stay rare: a hello says
    // how far its side delivered, so a replay starts after it; counted all the same.)
    assert!(t.faults > n as usize && t.replays > 0 && t.resets > 0 && t.died > 0);
    if n >= 1_000 {
        // Paths went down, joined and took the traffic over.
        assert!(t.path_events.iter().all(|&k| k > 0), "{t:?}");
        // Active/active seeds ran, and their sessions' data went on both first paths.
        assert!(t.active_seeds > 0 && t.active_path_msgs[..2].iter().all(|&k| k > 0));
    }
}

/// A schedule of one lossless session, 200 messages each way, with `faults`.
fn scenario(faults: Vec<(Ns, Fault)>, conn_listens: bool) -> Summary {
    paths_scenario(1, false, faults, conn_listens)
}

/// [`scenario`] with `paths` paths, lossless or lossy (keepalive on: idle paths are
/// watched).
fn paths_scenario(
    paths: usize,
    lossy: bool,
    faults: Vec<(Ns, Fault)>,
    conn_listens: bool,
) -> Summary {
    policy_scenario(paths, lossy, false, faults, conn_listens)
}

/// [`paths_scenario`] with the path policy: active/active (`active`) or standby.
fn policy_scenario(
    paths: usize,
    lossy: bool,
    active: bool,
    faults: Vec<(Ns, Fault)>,
    conn_listens: bool,
) -> Summary {
    let mut rng = Rng::new(7);
    let mut p = params(&mut rng);
    p.paths = paths;
    p.active = active;
    if paths > 1 {
        p.rules.keepalive = Some(Duration::from_millis(10));
        p.rules.path_failback = true;
    }
    p.lossy = lossy;
    p.quota = [200, 200];
    p.slow = [false, false];
    p.conn_listens = conn_listens;
    p.send_gap = 600 * US; // ~60 ms of traffic: the faults hit it
    p.faults = faults;
    match run_params(p, rng, true) {
        Ok(s) => s,
        Err((e, trace)) => {
            for line in &trace[trace.len().saturating_sub(100)..] {
                eprintln!("{line}");
            }
            panic!("{e}");
        }
    }
}

#[test]
fn lossless_replays_across_qp_errors_side_channel_closes_and_a_black_hole() {
    let s = scenario(
        vec![
            (5 * MS, Fault::QpError(0)),
            (12 * MS, Fault::SideChannel(1)),
            (20 * MS, Fault::BlackHole(30 * MS)),
            (60 * MS, Fault::QpError(1)),
        ],
        true,
    );
    assert_eq!(s.resets, 0);
    assert_eq!((s.failed, s.died), (0, 0));
    assert!(s.replays > 0, "{s:?}");
}

#[test]
fn a_failed_path_moves_the_session_to_another_without_a_reset_and_fails_back() {
    // QP error, side-channel close and a black hole beyond the retry budget, each on
    // path 0 (the active one) alone.
    for f in [
        Fault::PathQpError(0, 0),
        Fault::PathSideChannel(1, 0),
        Fault::PathHole(0, 200 * MS),
    ] {
        let s = paths_scenario(2, false, vec![(15 * MS, f)], true);
        assert_eq!(s.resets, 0, "{f:?}: {s:?}");
        assert_eq!((s.failed, s.died), (0, 0), "{f:?}: {s:?}");
        let [down, _, active] = s.path_events;
        // Down (at either side); active: the switch to path 1 at both sides, then (once
        // path 0 answers again, before the traffic ends unless it is a long hole) the
        // failback to path 0 at both.
        let failback = !matches!(f, Fault::PathHole(..));
        let want = if failback { 4 } else { 2 };
        assert!(down >= 1 && active >= want, "{f:?}: {s:?}");
    }
}

#[test]
fn a_flapping_path_loses_nothing() {
    let faults = (0..6)
        .map(|k| {
            (
                5 * MS + k * 12 * MS,
                Fault::PathHole(0, 4 * MS + k * 3 * MS),
            )
        })
        .chain([(30 * MS, Fault::PathQpError(0, 0))])
        .collect();
    let s = paths_scenario(2, false, faults, true);
    assert_eq!(s.resets, 0, "{s:?}");
    assert_eq!((s.failed, s.died), (0, 0), "{s:?}");
}

#[test]
fn all_paths_down_then_one_back_reconnects_without_a_reset() {
    // Both paths out (each its own hole), path 1 back after 80 ms, path 0 after 250 ms:
    // the session reconnects on path 1 within the budget (300 ms), path 0 rejoins later.
    let s = paths_scenario(
        2,
        false,
        vec![
            (10 * MS, Fault::PathHole(0, 250 * MS)),
            (10 * MS, Fault::PathHole(1, 80 * MS)),
        ],
        true,
    );
    assert_eq!(s.resets, 0, "{s:?}");
    assert_eq!((s.failed, s.died), (0, 0), "{s:?}");
    assert!(s.replays > 0, "{s:?}");
}

#[test]
fn a_lossy_session_reports_in_doubt_sends_and_goes_on_on_another_path() {
    let s = paths_scenario(2, true, vec![(15 * MS, Fault::PathQpError(0, 0))], true);
    assert_eq!(s.resets, 0, "no reset: another path was up: {s:?}");
    assert!(s.path_events[2] >= 1, "{s:?}");
}

#[test]
fn active_active_uses_both_paths_and_a_failed_one_loses_nothing() {
    // QP error, side-channel close and a black hole beyond the retry budget, each on
    // path 0 alone, with both paths carrying data.
    for f in [
        Fault::PathQpError(0, 0),
        Fault::PathSideChannel(1, 0),
        Fault::PathHole(0, 200 * MS),
        Fault::PathQpError(1, 1),
    ] {
        let s = policy_scenario(2, false, true, vec![(15 * MS, f)], true);
        assert_eq!(s.resets, 0, "{f:?}: {s:?}");
        assert_eq!((s.failed, s.died), (0, 0), "{f:?}: {s:?}");
        assert!(s.path_events[0] >= 1, "{f:?}: {s:?}");
        let [p0, p1, _] = s.active_path_msgs;
        assert!(p0 > 20 && p1 > 20, "both paths carry data: {f:?}: {s:?}");
    }
    // Without a fault: no replay, nothing dropped as a duplicate.
    let s = policy_scenario(3, false, true, vec![], true);
    assert_eq!((s.resets, s.failed, s.replays), (0, 0, 0), "{s:?}");
    assert!(s.active_path_msgs.iter().all(|&k| k > 10), "{s:?}");
}

#[test]
fn active_active_lossy_gives_up_what_a_failed_path_carried_and_goes_on() {
    for f in [Fault::PathQpError(0, 0), Fault::PathHole(1, 200 * MS)] {
        let s = policy_scenario(2, true, true, vec![(15 * MS, f)], true);
        assert_eq!(s.resets, 0, "no reset: another path was up: {f:?}: {s:?}");
        assert_eq!(s.died, 0, "{f:?}: {s:?}");
    }
}

#[test]
fn a_restarted_listening_connector_is_seen_at_its_next_hello() {
    let s = scenario(vec![(10 * MS, Fault::Restart(0))], true);
    // The acceptor resets the old session when the new incarnation says hello, long
    // before its 600 ms give-up (the run settles within the bound either way; the
    // trace of a failure shows which).
    assert_eq!(s.resets_by_side, [0, 1], "{s:?}");
}

#[test]
fn a_restarted_acceptor_resets_the_connector_at_its_next_hello() {
    let s = scenario(vec![(10 * MS, Fault::Restart(1))], true);
    assert_eq!(s.resets_by_side[0], 1, "{s:?}");
}

#[test]
fn seed_costs() {
    if let Some(n) = env("RDMX_MSGR_SIM_COSTS") {
        for seed in 0..n {
            let t = std::time::Instant::now();
            let paths = params(&mut Rng::new(seed)).paths;
            let r = run(seed, false);
            eprintln!(
                "seed {seed}: {paths} paths {:?} {:?}",
                t.elapsed(),
                r.map(|s| (s.events, s.path_events))
            );
        }
    }
}

#[test]
fn one_seed() {
    if let Some(seed) = env("RDMX_MSGR_SIM_SEED") {
        let (r, trace) = match run(seed, true) {
            Ok(s) => (Ok(s), Vec::new()),
            Err((e, t)) => (Err(e), t),
        };
        for line in &trace {
            eprintln!("{line}");
        }
        eprintln!("seed {seed}: {r:?}");
        r.unwrap();
    }
}

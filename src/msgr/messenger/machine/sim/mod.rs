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
//! `RDMX_MSGR_SIM_SEEDS=N` runs N seeds (default 10,000); a failing seed prints its
//! trace and the command that replays it alone:
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
}

fn params(rng: &mut Rng) -> Params {
    let lossy = rng.pct(30);
    let win_min = rng.range(2, 6) as u32;
    // `msgr_recv_window` is at least 4 (config/keys.rs): at 2, two sides with data
    // queued spend every credit announcing the one the other just used.
    let win = (win_min << rng.below(4)).max(4);
    let rules = Rules {
        keepalive: (!rng.pct(10)).then(|| Duration::from_millis(rng.range(5, 40))),
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
    };
    let mut pool = [0; 2];
    for p in &mut pool {
        *p = rng.range(u64::from(3 * win_min + 2), u64::from(4 * win + 8)) as u32;
    }
    let mut faults = Vec::new();
    for _ in 0..rng.below(7) {
        let at = rng.below(300 * MS);
        let f = match rng.below(100) {
            0..30 => Fault::QpError(rng.below(2) as usize),
            30..60 => Fault::SideChannel(rng.below(2) as usize),
            60..90 => Fault::BlackHole(match rng.below(10) {
                0..7 => rng.range(100 * US, 8 * MS),
                7..9 => rng.range(8 * MS, 60 * MS),
                _ => rng.range(60 * MS, 1_000 * MS),
            }),
            _ => Fault::Restart(rng.below(2) as usize),
        };
        faults.push((at, f));
    }
    Params {
        rules,
        lossy,
        quota: [rng.range(10, 150) as u32, rng.range(0, 100) as u32],
        pool,
        slow: [rng.pct(15), rng.pct(15)],
        conn_listens: rng.pct(70),
        send_gap: rng.range(0, 500 * US),
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
    let calm = !p.lossy
        && p.faults.iter().all(|(_, f)| match f {
            Fault::Restart(_) => false,
            Fault::BlackHole(len) => *len < 60 * MS,
            _ => true,
        });
    let faults_end = p
        .faults
        .iter()
        .map(|(t, f)| match f {
            Fault::BlackHole(len) => t + len,
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
        ..Summary::default()
    };
    for p in &w.procs {
        for m in p.sessions.iter().flatten().map(|s| &s.m) {
            s.replays += m.counters.replays;
            s.duplicates += m.counters.duplicates_dropped;
        }
    }
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

#[test]
fn seeded_schedules_hold_every_invariant() {
    let n = env("RDMX_MSGR_SIM_SEEDS").unwrap_or(10_000);
    let first = env("RDMX_MSGR_SIM_FIRST").unwrap_or(0);
    let mut t = Summary::default();
    for seed in first..first + n {
        let s = check(seed);
        t.sent += s.sent;
        t.failed += s.failed;
        t.died += s.died;
        t.resets += s.resets;
        t.faults += s.faults;
        t.replays += s.replays;
        t.duplicates += s.duplicates;
        t.events += s.events;
    }
    eprintln!("msgr sim: {n} seeds from {first}: {t:?}");
    // The schedules do exercise what they claim to. (Duplicates stay rare: a hello says
    // how far its side delivered, so a replay starts after it; counted all the same.)
    assert!(t.faults > n as usize && t.replays > 0 && t.resets > 0 && t.died > 0);
}

/// A schedule of one lossless session, 200 messages each way, with `faults`.
fn scenario(faults: Vec<(Ns, Fault)>, conn_listens: bool) -> Summary {
    let mut rng = Rng::new(7);
    let mut p = params(&mut rng);
    p.lossy = false;
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
            let r = run(seed, false);
            eprintln!("seed {seed}: {:?} {:?}", t.elapsed(), r.map(|s| s.events));
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

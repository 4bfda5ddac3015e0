//! The timer advisor's measurements: the path for `--duration` (a third each: read_lat for
//! the round trip, read_bw at the user's queue depth for the wait an ACK timer sees, the
//! responder's and requester's stalls and loss, send_bw at that depth for RNR NAKs), and
//! `--verify`: read_bw again with the recommendation and with each seed profile, counting
//! what was really sent twice.

use super::advisor::{self, Advice, Path, Timers};
use super::hw_counters;
use super::sweeps::{Plan, round_order};
use crate::client::{Measured, Spec, measure};
use crate::perf::{Histogram, build_config};

/// The seed's profiles the advisor compares with.
pub const PROFILES: &[&str] = &["ceph-before", "ceph-after"];

fn quantiles(h: &Histogram) -> [u64; 4] {
    [
        h.quantile(0.50),
        h.quantile(0.99),
        h.quantile(0.9999),
        h.max(),
    ]
}

/// A client run; Err when it could not run or ended with errors.
fn run(
    plan: &Plan,
    test: &'static str,
    qd: usize,
    secs: f64,
    profile: Option<&str>,
    extra: &[(String, String)],
) -> Result<Measured, String> {
    let m = run_lenient(plan, test, qd, secs, profile, extra)?;
    if m.errors > 0 {
        return Err(format!(
            "{test}: {}",
            m.first_error.as_deref().unwrap_or("errors")
        ));
    }
    Ok(m)
}

/// A client run; Ok with its counters even when it ended with errors.
fn run_lenient(
    plan: &Plan,
    test: &'static str,
    qd: usize,
    secs: f64,
    profile: Option<&str>,
    extra: &[(String, String)],
) -> Result<Measured, String> {
    let mut sets = plan.sets.clone();
    if let Some(p) = &plan.provider {
        sets.insert(0, ("provider".to_string(), p.clone()));
    }
    sets.extend(extra.iter().cloned());
    let cfg = build_config(profile, &sets, &[])?;
    measure(
        &Spec {
            test,
            connect: plan.connect.clone(),
            size: 4096,
            qd,
            duration: secs,
            batch: None,
            lat_stream: false,
            server_stats: true,
        },
        &cfg,
    )
}

fn count(m: &Measured, k: &str) -> u64 {
    m.report.get(k).unwrap_or(0.0) as u64
}

/// Measures the path for `secs` seconds in all.
pub fn measure_path(plan: &Plan, secs: f64, progress: &dyn Fn(&str)) -> Result<Path, String> {
    let third = (secs / 3.0).max(0.05);
    progress("advisor: round trip (read_lat)");
    let lat = run(plan, "read_lat", 1, third, None, &[])?;
    progress(&format!("advisor: wait at qd {} (read_bw)", plan.qd));
    let bw = run(plan, "read_bw", plan.qd, third, None, &[])?;
    progress(&format!("advisor: RNR NAKs at qd {} (send_bw)", plan.qd));
    // rnr_retry 7 (wait forever): the probe counts RNR NAKs instead of ending at the third
    // (an RNR_RETRY_EXC_ERR would hide how many there were).
    let forever = [("rnr_retry".to_string(), "7".to_string())];
    let sb = run_lenient(plan, "send_bw", plan.qd, third, None, &forever)?;
    let rnr_note = sb.first_error.clone();
    let srv = bw.server.unwrap_or_default();
    let gaps = bw.gaps.clone().unwrap_or_else(Histogram::new);
    let mut sets = plan.sets.clone();
    if let Some(p) = &plan.provider {
        sets.insert(0, ("provider".to_string(), p.clone()));
    }
    let rd_atomic = build_config(None, &sets, &[])
        .and_then(|c| c.settings().map_err(|e| e.to_string()))
        .map_or(16, |s| u64::from(s.max_rd_atomic));
    let seconds = bw.report.get("duration_s").unwrap_or(third);
    let lost = ["seq_naks", "out_of_sequence", "kernel_drops"]
        .iter()
        .map(|k| count(&bw, k))
        .sum();
    Ok(Path {
        rtt_ns: quantiles(&lat.hist),
        wait_ns: quantiles(&bw.hist),
        gap_ns: quantiles(&gaps),
        gaps: gaps.count(),
        qd: plan.qd as u64,
        resent_per_timeout: (plan.qd as u64).min(rd_atomic),
        ops: count(&bw, "ops"),
        ops_per_sec: bw.report.get("ops_per_sec").unwrap_or(0.0),
        seconds,
        server_stalls: srv.stalls,
        server_stalled_ns: srv.stalled_ns,
        server_max_stall_ns: srv.max_stall_ns,
        client_stalls: count(&bw, "stalls"),
        client_stalled_ns: (bw.report.get("stalled_ms").unwrap_or(0.0) * 1e6) as u64,
        client_max_stall_ns: (bw.report.get("max_stall_ms").unwrap_or(0.0) * 1e6) as u64,
        rnr_naks: count(&sb, "rnr_naks"),
        rnr_note,
        counted: bw.report.get_str("provider") != Some("verbs"),
        sends: count(&sb, "ops"),
        lost,
        tx_packets: count(&bw, "tx_packets") + srv.tx_packets,
    })
}

/// The timers of a profile (with the user's --set values), evaluated on `p`.
pub fn profile_timers(plan: &Plan, name: &str, p: &Path) -> Result<Timers, String> {
    let cfg = build_config(Some(name), &plan.sets, &[])?;
    let s = cfg.settings().map_err(|e| e.to_string())?;
    Ok(advisor::evaluate(
        name,
        s.timeout,
        s.retry_cnt,
        s.rnr_retry,
        s.min_rnr_timer,
        p,
    ))
}

/// The `--set`s that apply a timer set.
pub fn timer_sets(t: &Timers) -> Vec<(String, String)> {
    [
        ("timeout", t.timeout),
        ("retry_cnt", t.retry_cnt),
        ("rnr_retry", t.rnr_retry),
        ("min_rnr_timer", t.min_rnr_timer),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// One `--verify` row: a timer set rerun with read_bw. Counts are sums over its runs; None
/// where a run could not count them (verbs: no per-connection packet counters; the port's
/// hw_counters give ACK timeouts and duplicates where the device has them).
#[derive(Debug, Clone)]
pub struct Verified {
    pub timers: Timers,
    pub runs: usize,
    pub ops_per_sec: Option<f64>,
    pub tx_packets: Option<u64>,
    /// Client: requests sent again, ACK timer expiries; server: duplicates it received.
    pub retransmits: Option<u64>,
    pub ack_timeouts: Option<u64>,
    pub duplicates: Option<u64>,
    /// retransmits / tx_packets (the client's).
    pub retransmit_fraction: Option<f64>,
    pub errors: u64,
    pub note: Option<String>,
}

/// Adds a run's count to a row's sum; unknown in any run makes the sum unknown.
fn add(sum: &mut Option<u64>, v: Option<u64>, first: bool) {
    *sum = if first {
        v
    } else {
        sum.zip(v).map(|(a, b)| a + b)
    };
}

/// The verbs port's hw_counters directory for `plan`'s configuration, if on verbs.
fn verbs_port(plan: &Plan) -> Option<std::path::PathBuf> {
    let mut sets = plan.sets.clone();
    if let Some(p) = &plan.provider {
        sets.insert(0, ("provider".to_string(), p.clone()));
    }
    let s = build_config(None, &sets, &[]).ok()?.settings().ok()?;
    let (name, _) = rdmx::provider::resolve(&s).ok()?;
    if name != "verbs" {
        return None;
    }
    hw_counters::dir(&s.device, s.port)
}

/// Reruns read_bw at the user's depth with each timer set, `rounds` times in alternating
/// order, `secs` per run.
pub fn verify(plan: &Plan, sets: &[Timers], secs: f64, progress: &dyn Fn(&str)) -> Vec<Verified> {
    let mut out: Vec<Verified> = sets
        .iter()
        .map(|t| Verified {
            timers: t.clone(),
            runs: 0,
            ops_per_sec: None,
            tx_packets: None,
            retransmits: None,
            ack_timeouts: None,
            duplicates: None,
            retransmit_fraction: None,
            errors: 0,
            note: None,
        })
        .collect();
    let mut ops: Vec<Vec<f64>> = vec![Vec::new(); sets.len()];
    let port = verbs_port(plan);
    for round in 0..plan.rounds {
        for i in round_order(sets.len(), round) {
            let t = &sets[i];
            progress(&format!("verify: {} round {}", t.name, round + 1));
            let v = &mut out[i];
            let hw_before = port.as_deref().map(hw_counters::read);
            match run(plan, "read_bw", plan.qd, secs, None, &timer_sets(t)) {
                Ok(m) => {
                    let first = v.runs == 0;
                    v.runs += 1;
                    ops[i].push(m.report.get("ops_per_sec").unwrap_or(0.0));
                    if m.report.get_str("provider") == Some("verbs") {
                        // Per port, from the NIC (None where it has no such counter).
                        let hw = match (&hw_before, port.as_deref()) {
                            (Some(b), Some(d)) => hw_counters::delta(b, &hw_counters::read(d)),
                            _ => vec![None; hw_counters::NAMES.len()],
                        };
                        add(&mut v.tx_packets, None, first);
                        add(&mut v.retransmits, None, first);
                        add(&mut v.ack_timeouts, hw[0], first);
                        add(&mut v.duplicates, hw[1], first);
                    } else {
                        add(&mut v.tx_packets, Some(count(&m, "tx_packets")), first);
                        add(&mut v.retransmits, Some(count(&m, "retransmits")), first);
                        add(&mut v.ack_timeouts, Some(count(&m, "ack_timeouts")), first);
                        add(
                            &mut v.duplicates,
                            m.server.map(|s| s.duplicates_received),
                            first,
                        );
                    }
                }
                Err(e) => {
                    v.errors += 1;
                    v.note.get_or_insert(e);
                }
            }
        }
    }
    for (v, o) in out.iter_mut().zip(ops.iter_mut()) {
        v.ops_per_sec = super::sweeps::median(o);
        v.retransmit_fraction = v
            .retransmits
            .zip(v.tx_packets.filter(|&n| n > 0))
            .map(|(r, n)| r as f64 / n as f64);
    }
    out
}

/// The advisor's whole result.
#[derive(Debug, Clone)]
pub struct AdvisorResult {
    pub path: Path,
    pub advice: Advice,
    pub profiles: Vec<Timers>,
    pub verified: Option<Vec<Verified>>,
}

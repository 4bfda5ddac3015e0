//! `rdmx-perf tune`: the seed article's tuning table as a command. Against one
//! `rdmx-perf server` it sweeps the knobs the article tuned (`sweeps.rs`), measures the path
//! and recommends the four RC timers (`path.rs` measures, `advisor.rs` decides), optionally
//! checks the recommendation against the seed's profiles (`--verify`), prints tables or
//! one JSON object (`report.rs`) and draws a PNG per sweep (`plot.rs`, `plot.py`). The
//! server's CPU time, stalls and counters come from the server itself, over each run's own
//! connection (`stats.rs`).

pub mod advisor;
pub mod hw_counters;
pub mod path;
pub mod plot;
pub mod report;
pub mod stats;
pub mod sweeps;

use crate::cli;
use crate::perf::Fail;
use report::TuneResult;
use std::process::ExitCode;
use sweeps::Plan;

pub const USAGE: &str = "usage: rdmx-perf tune --connect ADDR:PORT [--provider soft|verbs] [--quick] [--json] \
     [--plot DIR] [--duration SECONDS (5; quick: 1)] [--verify] [--qd N (32)] [--rounds N (3; quick: 2)] \
     [--run-seconds S (1; quick: 0.15)] [--set KEY=VALUE]...";

/// `rdmx-perf tune --help`.
pub const HELP: &str = "\
Runs the seed article's tuning table against one `rdmx-perf server` and prints one table per
knob, each row the median of --rounds runs taken in alternating order:
  max_send_wr    64..1024 at QD = depth (read_bw 4 KiB)
  post_batch     WRs per post call 1/8/16/32/64 (read_bw 64 B, qd 128)
  cq_size        send CQ 1x/1.5x/2x/4x of the WRs it serves, with CQ overruns counted
  cq_sharing     shared vs separate send/recv CQs: p99/p99.9 of a ping stream beside bulk READs
  poll_mode      busy vs event vs adaptive: ops/s, CPU us per op (getrusage of this process
                 and, asked over the connection, of the server), p50/p99
  registration   per-IO registration vs pooled chunk vs registration-cache hit (local)
Then the timer advisor: measures the path for --duration (RTT p50/p99/p99.99, the wait at
--qd, stalls of both ends, RNR NAKs at --qd, loss), recommends timeout, retry_cnt, rnr_retry
and min_rnr_timer with its reasons, the dead-peer detection time
(retry_cnt + 1) x 4.096 us x 2^timeout and the predicted spurious-retransmission fraction,
and compares with the profiles ceph-before and ceph-after on the same path.

options:
  --connect ADDR:PORT  the rdmx-perf server (required; it must be this version: older
                       servers do not answer the stats request)
  --provider P         soft or verbs for the client side (default: the configuration's)
  --quick              short runs (--run-seconds 0.15, --rounds 2, --duration 1)
  --json               stdout is one JSON object only; the tables go to stderr
  --plot DIR           write DIR/tune.json and DIR/tune-<sweep>.png (python3-matplotlib)
  --duration SECONDS   the advisor's measurement in all (default 5; quick 1); each
                       --verify run takes a third of it
  --verify             rerun read_bw at --qd with the recommendation, ceph-before and
                       ceph-after; report retransmits, duplicates, ACK timeouts
  --qd N               the queue depth the advisor and the poll/CQ-sharing sweeps use (32)
  --rounds N           runs per row (default 3; quick 2)
  --run-seconds S      seconds per sweep run (default 1; quick 0.15)
  --set KEY=VALUE      a knob for every client run, beneath each row's own; repeatable

exit status: 0 measured (rows that failed say why in their note), 1 nothing could be
measured (no server, or every run failed), 2 usage error.";

#[derive(Debug, clap::Parser)]
struct Args {
    #[arg(long, value_name = "ADDR:PORT", allow_hyphen_values = true)]
    connect: String,
    #[arg(long, value_parser = provider, allow_hyphen_values = true)]
    provider: Option<String>,
    #[arg(long)]
    quick: bool,
    #[arg(long)]
    json: bool,
    #[arg(long, allow_hyphen_values = true)]
    plot: Option<std::path::PathBuf>,
    #[arg(long, value_parser = cli::duration, allow_hyphen_values = true)]
    duration: Option<f64>,
    #[arg(long)]
    verify: bool,
    #[arg(long, value_parser = cli::qd, default_value = "32", allow_hyphen_values = true)]
    qd: usize,
    #[arg(long, value_parser = rounds, allow_hyphen_values = true)]
    rounds: Option<usize>,
    #[arg(long, value_parser = cli::duration, allow_hyphen_values = true)]
    run_seconds: Option<f64>,
    #[arg(long, value_parser = cli::set, allow_hyphen_values = true)]
    set: Vec<(String, String)>,
}

fn provider(v: &str) -> Result<String, String> {
    match v {
        "soft" | "verbs" => Ok(v.to_string()),
        _ => Err(format!("must be soft or verbs, got '{v}'")),
    }
}

fn rounds(v: &str) -> Result<usize, String> {
    v.parse()
        .ok()
        .filter(|n| (1..=100).contains(n))
        .ok_or_else(|| format!("must be 1..=100, got {v}"))
}

pub fn main(args: &[String]) -> ExitCode {
    let who = "rdmx-perf: tune";
    let a: Args = match cli::parse(args, USAGE) {
        Ok(a) => a,
        Err(e) => return Fail::Usage(e).exit(who),
    };
    // The user's --set values must make a valid configuration on their own.
    let mut sets = a.set.clone();
    if let Some(p) = &a.provider {
        sets.insert(0, ("provider".into(), p.clone()));
    }
    let cfg = match crate::perf::build_config(None, &sets, &[]) {
        Ok(c) => c,
        Err(e) => return Fail::Usage(e).exit(who),
    };
    // The provider the client runs get (provider=auto: verbs if a device is usable).
    let provider_used = cfg
        .settings()
        .ok()
        .and_then(|s| rdmx::provider::resolve(&s).ok())
        .map_or_else(|| "unknown".to_string(), |(name, _)| name.to_string());
    let plan = Plan {
        connect: a.connect.clone(),
        provider: a.provider.clone(),
        sets: a.set.clone(),
        qd: a.qd,
        run_seconds: a.run_seconds.unwrap_or(if a.quick { 0.15 } else { 1.0 }),
        rounds: a.rounds.unwrap_or(if a.quick { 2 } else { 3 }),
    };
    let duration = a.duration.unwrap_or(if a.quick { 1.0 } else { 5.0 });
    let progress = |what: &str| eprintln!("rdmx-perf tune: {what}");
    // The advisor first: it fails fast and clearly when the server is not there (or is an
    // older one that does not answer stats requests).
    let (advisor, advisor_error) = match advise(&plan, duration, a.verify, &progress) {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(e)),
    };
    let sweeps = sweeps::run_all(&plan, &progress);
    let measured_any = sweeps
        .iter()
        .filter(|s| s.name != "registration")
        .any(|s| s.rows.iter().any(|r| r.runs > 0));
    let result = TuneResult {
        server: a.connect.clone(),
        provider: provider_used,
        quick: a.quick,
        rounds: plan.rounds,
        run_seconds: plan.run_seconds,
        qd: plan.qd,
        sweeps,
        advisor,
        advisor_error,
    };
    let json = result.json().to_string();
    if a.json {
        eprint!("{}", result.table());
        println!("{json}");
    } else {
        print!("{}", result.table());
    }
    if let Some(dir) = &a.plot {
        match plot::plot(dir, &json) {
            Ok(paths) => {
                for p in paths {
                    eprintln!("rdmx-perf tune: wrote {}", p.display());
                }
            }
            Err(e) => return Fail::Run(e).exit(who),
        }
    }
    if !measured_any && result.advisor.is_none() {
        return Fail::Run(format!(
            "nothing was measured against {} ({})",
            a.connect,
            result
                .advisor_error
                .as_deref()
                .unwrap_or("every run failed")
        ))
        .exit(who);
    }
    ExitCode::SUCCESS
}

/// The advisor: measure, recommend, compare, and with `verify` rerun.
fn advise(
    plan: &Plan,
    duration: f64,
    verify: bool,
    progress: &dyn Fn(&str),
) -> Result<path::AdvisorResult, String> {
    let p = path::measure_path(plan, duration, progress)?;
    let advice = advisor::advise(&p);
    let profiles = path::PROFILES
        .iter()
        .map(|n| path::profile_timers(plan, n, &p))
        .collect::<Result<Vec<_>, _>>()?;
    let verified = verify.then(|| {
        let sets: Vec<_> = std::iter::once(advice.timers.clone())
            .chain(profiles.iter().cloned())
            .collect();
        // Alternating rounds as the sweeps, a third of --duration per run.
        path::verify(plan, &sets, (duration / 3.0).max(0.1), progress)
    });
    Ok(path::AdvisorResult {
        path: p,
        advice,
        profiles,
        verified,
    })
}

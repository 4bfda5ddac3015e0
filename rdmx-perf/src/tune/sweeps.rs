//! The sweeps of the seed's tuning table: which knob, which values, which client run
//! measures each value, and what the article claimed. Every row is measured `rounds` times,
//! the rows of a sweep in alternating order (forward, backward, ...) so that a drifting
//! host weighs on every row alike; a row's figures are the medians of its runs (counts:
//! their sums).

use crate::client::{Measured, Spec, measure};
use crate::perf::build_config;
use crate::reg_bench;

/// What `tune` was asked to do, as the sweeps need it.
#[derive(Debug, Clone)]
pub struct Plan {
    pub connect: String,
    /// `--provider`, passed to every client run.
    pub provider: Option<String>,
    /// The user's `--set`s, beneath each row's own knob.
    pub sets: Vec<(String, String)>,
    pub qd: usize,
    pub run_seconds: f64,
    pub rounds: usize,
}

/// One row as measured.
#[derive(Debug, Clone)]
pub struct Row {
    pub label: String,
    /// Where the row sits on the plot's x axis.
    pub x: f64,
    pub runs: usize,
    pub errors: u64,
    /// Medians (counts: sums), in the sweep's column order; None: no run measured it.
    pub figures: Figures,
    /// Why the row has no figures (the knob cannot take this value here), or the first
    /// error of its runs.
    pub note: Option<String>,
}

/// A sweep's claim from the article, as a reference on the plot: the factor the article
/// reports for `metric` at some rows, relative to the row `baseline`.
#[derive(Debug, Clone)]
pub struct Claim {
    pub text: &'static str,
    pub metric: &'static str,
    pub baseline: &'static str,
    pub points: Vec<(&'static str, f64)>,
    /// Claims without a number, marked at a row: (label, what the article says there).
    pub marks: Vec<(&'static str, &'static str)>,
}

/// A sweep and its rows.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub name: &'static str,
    pub knob: &'static str,
    /// What each row runs.
    pub runs: String,
    pub claim: Claim,
    pub columns: Vec<&'static str>,
    /// The figures the plot draws: throughput, then p99.
    pub plot: Vec<&'static str>,
    pub notes: Vec<String>,
    pub rows: Vec<Row>,
}

/// A row before it is measured: its client run and knob settings.
struct RowSpec {
    label: String,
    x: f64,
    spec: Spec,
    sets: Vec<(String, String)>,
}

/// Figures of a server run, in table order.
const RUN_COLUMNS: &[&str] = &[
    "ops_per_sec",
    "lat_p50_us",
    "lat_p99_us",
    "lat_p999_us",
    "cpu_us_per_op",
    "client_cpu_us_per_op",
    "server_cpu_us_per_op",
    "retransmits",
];
/// Columns that are counts: summed over runs, not medians.
const SUMMED: &[&str] = &["retransmits", "cq_overflows"];

fn set(k: &str, v: impl ToString) -> (String, String) {
    (k.to_string(), v.to_string())
}

fn spec(plan: &Plan, test: &'static str, size: usize, qd: usize, batch: Option<usize>) -> Spec {
    Spec {
        test,
        connect: plan.connect.clone(),
        size,
        qd,
        duration: plan.run_seconds,
        batch,
        lat_stream: false,
        server_stats: true,
    }
}

/// The figures of one client run (None: the run did not measure it).
fn figures_of(m: &Measured, columns: &[&'static str]) -> Figures {
    let ops = m.report.get("ops").unwrap_or(0.0);
    let per_op = |ns: u64| (ops > 0.0).then(|| ns as f64 / 1000.0 / ops);
    let client = per_op(m.client_cpu_ns);
    let server = m.server.as_ref().and_then(|s| per_op(s.cpu_ns));
    let us = |q: f64| m.stream.as_ref().map(|h| h.quantile(q) as f64 / 1000.0);
    columns
        .iter()
        .map(|&c| {
            let v = match c {
                "cpu_us_per_op" => client.zip(server).map(|(a, b)| a + b),
                "client_cpu_us_per_op" => client,
                "server_cpu_us_per_op" => server,
                "cq_overflows" => m.cq_overflows.map(|n| n as f64),
                // A NIC counts retransmissions per port, not per connection: not known.
                "retransmits" if m.report.get_str("provider") == Some("verbs") => None,
                "stream_p99_us" => us(0.99),
                "stream_p999_us" => us(0.999),
                other => m.report.get(other),
            };
            (c, v)
        })
        .collect()
}

/// The median of `v` (the mean of the middle two for an even count); None when empty.
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The order of a sweep's rows in round `round`: forward, then backward, alternating.
pub fn round_order(rows: usize, round: usize) -> Vec<usize> {
    if round % 2 == 0 {
        (0..rows).collect()
    } else {
        (0..rows).rev().collect()
    }
}

/// A run's figures, in column order (None: not measured).
type Figures = Vec<(&'static str, Option<f64>)>;
/// Per row: every run's figures (or its error).
type Runs = Vec<Vec<Result<Figures, String>>>;

/// Measures `specs` in alternating rounds and folds each row's runs.
fn measure_rows(
    plan: &Plan,
    specs: &[RowSpec],
    columns: &[&'static str],
    progress: &dyn Fn(&str),
) -> Vec<Row> {
    let mut runs: Runs = vec![Vec::new(); specs.len()];
    for round in 0..plan.rounds {
        for i in round_order(specs.len(), round) {
            let r = &specs[i];
            progress(&format!("{} round {}", r.label, round + 1));
            let mut sets = plan.sets.clone();
            if let Some(p) = &plan.provider {
                sets.insert(0, set("provider", p));
            }
            sets.extend(r.sets.iter().cloned());
            let one = build_config(None, &sets, &[])
                .map_err(|e| format!("not run: {e}"))
                .and_then(|cfg| measure(&r.spec, &cfg))
                .and_then(|m| {
                    if m.errors > 0 {
                        Err(m
                            .first_error
                            .clone()
                            .unwrap_or_else(|| format!("{} error(s)", m.errors)))
                    } else {
                        Ok(figures_of(&m, columns))
                    }
                });
            runs[i].push(one);
        }
    }
    specs
        .iter()
        .zip(runs)
        .map(|(s, rs)| fold(&s.label, s.x, columns, &rs))
        .collect()
}

/// One row from its runs: medians of the runs that measured, sums of counts, the first
/// error as the note.
fn fold(label: &str, x: f64, columns: &[&'static str], runs: &[Result<Figures, String>]) -> Row {
    let ok: Vec<&Figures> = runs.iter().filter_map(|r| r.as_ref().ok()).collect();
    let figures = columns
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let mut vals: Vec<f64> = ok.iter().filter_map(|f| f[i].1).collect();
            let v = if SUMMED.contains(&c) {
                (!vals.is_empty()).then(|| vals.iter().sum())
            } else {
                median(&mut vals)
            };
            (c, v)
        })
        .collect();
    Row {
        label: label.to_string(),
        x,
        runs: ok.len(),
        errors: (runs.len() - ok.len()) as u64,
        figures,
        note: runs.iter().find_map(|r| r.as_ref().err().cloned()),
    }
}

fn columns(extra: &[&'static str]) -> Vec<&'static str> {
    RUN_COLUMNS.iter().chain(extra).copied().collect()
}

/// The five sweeps against the server, then registration (local), measured.
pub fn run_all(plan: &Plan, progress: &dyn Fn(&str)) -> Vec<Sweep> {
    let soft = plan.provider.as_deref() != Some("verbs");
    let mut out = Vec::new();

    // 1. Send queue depth at QD = depth.
    let specs: Vec<RowSpec> = [64usize, 128, 256, 384, 512, 1024]
        .iter()
        .map(|&n| RowSpec {
            label: n.to_string(),
            x: n as f64,
            spec: spec(plan, "read_bw", 4096, n, None),
            sets: vec![set("max_send_wr", n)],
        })
        .collect();
    let cols = columns(&[]);
    out.push(Sweep {
        name: "max_send_wr",
        knob: "max_send_wr (= READs in flight)",
        runs: "read_bw 4 KiB, qd = max_send_wr".into(),
        claim: Claim {
            text: "QP depth 128 -> 256: +23% throughput, flat past 384",
            metric: "ops_per_sec",
            baseline: "128",
            points: vec![
                ("128", 1.0),
                ("256", 1.23),
                ("384", 1.23),
                ("512", 1.23),
                ("1024", 1.23),
            ],
            marks: vec![],
        },
        rows: measure_rows(plan, &specs, &cols, progress),
        columns: cols,
        plot: vec!["ops_per_sec", "lat_p99_us"],
        notes: vec![
            "READs in flight are also bounded by max_rd_atomic (16): deeper queues wait in the requester, not on the wire".into(),
        ],
    });

    // 2. WRs per post call, small messages.
    let specs: Vec<RowSpec> = [1usize, 8, 16, 32, 64]
        .iter()
        .map(|&b| RowSpec {
            label: b.to_string(),
            x: b as f64,
            spec: spec(plan, "read_bw", 64, 128, Some(b)),
            sets: vec![],
        })
        .collect();
    let cols = columns(&[]);
    out.push(Sweep {
        name: "post_batch",
        knob: "WRs per post call",
        runs: "read_bw 64 B, qd 128, max_send_wr 256".into(),
        claim: Claim {
            text: "32 WRs per post instead of 16: +37% small-message throughput",
            metric: "ops_per_sec",
            baseline: "16",
            points: vec![("16", 1.0), ("32", 1.37)],
            marks: vec![],
        },
        rows: measure_rows(plan, &specs, &cols, progress),
        columns: cols,
        plot: vec!["ops_per_sec", "lat_p99_us"],
        notes: if soft {
            vec!["soft: a post call is a lock and a queue push, not an MMIO doorbell; posts between two polls already leave in one sendmmsg".into()]
        } else {
            vec![]
        },
    });

    // 3. CQ size relative to the WRs it serves.
    let wrs = 256usize;
    let specs: Vec<RowSpec> = [(1.0f64, "1x"), (1.5, "1.5x"), (2.0, "2x"), (4.0, "4x")]
        .iter()
        .map(|&(f, l)| RowSpec {
            label: l.to_string(),
            x: f,
            spec: spec(plan, "read_bw", 4096, wrs, None),
            sets: vec![
                set("max_send_wr", wrs),
                set("send_cq_size", (wrs as f64 * f) as usize),
            ],
        })
        .collect();
    let cols = columns(&["cq_overflows"]);
    out.push(Sweep {
        name: "cq_size",
        knob: "send_cq_size / WRs it serves",
        runs: "read_bw 4 KiB, qd 256, max_send_wr 256".into(),
        claim: Claim {
            text: "CQ = 1.5-2x the WRs sharing it, or a performance cliff (overflow)",
            metric: "ops_per_sec",
            baseline: "2x",
            points: vec![("1.5x", 1.0), ("2x", 1.0), ("4x", 1.0)],
            marks: vec![("1x", "article: a cliff below 1.5x")],
        },
        rows: measure_rows(plan, &specs, &cols, progress),
        columns: cols,
        plot: vec!["ops_per_sec", "lat_p99_us"],
        notes: vec![
            "below 1x is refused by the configuration (rdmx_config_validate: the overflow cliff), so the sweep starts at 1x".into(),
            "a client that frees a slot only when it polls its completion cannot overrun a CQ of >= 1x its WRs; the cliff needs several QPs on one CQ or unsignaled sends counted wrong".into(),
        ],
    });

    // 4. Shared vs separate send/recv CQs: a latency stream beside a bulk one.
    let specs: Vec<RowSpec> = [(true, "separate"), (false, "shared")]
        .iter()
        .enumerate()
        .map(|(i, &(sep, l))| RowSpec {
            label: l.to_string(),
            x: i as f64,
            spec: Spec {
                lat_stream: true,
                ..spec(plan, "read_bw", 4096, plan.qd.min(255), None)
            },
            sets: vec![set("separate_cqs", sep)],
        })
        .collect();
    let cols = columns(&["stream_p99_us", "stream_p999_us"]);
    out.push(Sweep {
        name: "cq_sharing",
        knob: "separate_cqs",
        runs: format!(
            "read_bw 4 KiB qd {} (bulk) + one 64 B SEND ping at a time on the same QP (stream)",
            plan.qd.min(255)
        ),
        claim: Claim {
            text: "separate send/recv CQs: p99.9 42 -> 27 us (trading system)",
            metric: "stream_p999_us",
            baseline: "shared",
            points: vec![("shared", 1.0), ("separate", 27.0 / 42.0)],
            marks: vec![],
        },
        rows: measure_rows(plan, &specs, &cols, progress),
        columns: cols,
        plot: vec!["ops_per_sec", "stream_p99_us", "stream_p999_us"],
        notes: if soft {
            vec!["soft: one poll call drains the send CQ, then the receive CQ; a shared CQ is the same queue in completion order".into()]
        } else {
            vec![]
        },
    });

    // 5. Completion mode.
    let specs: Vec<RowSpec> = ["busy", "event", "adaptive"]
        .iter()
        .enumerate()
        .map(|(i, &m)| RowSpec {
            label: m.to_string(),
            x: i as f64,
            spec: spec(plan, "read_bw", 4096, plan.qd, None),
            sets: vec![set("poll_mode", m)],
        })
        .collect();
    let cols = columns(&[]);
    out.push(Sweep {
        name: "poll_mode",
        knob: "poll_mode (client)",
        runs: format!("read_bw 4 KiB qd {}", plan.qd),
        claim: Claim {
            text: "pure polling: -15% CPU against event-driven completion (AI cluster)",
            metric: "cpu_us_per_op",
            baseline: "event",
            points: vec![("event", 1.0), ("busy", 0.85)],
            marks: vec![],
        },
        rows: measure_rows(plan, &specs, &cols, progress),
        columns: cols,
        plot: vec!["ops_per_sec", "lat_p99_us", "cpu_us_per_op"],
        notes: vec![
            "the client's poll_mode varies; the server keeps the mode it was started with (its CPU is in server_cpu_us_per_op)".into(),
            "CPU is getrusage (user + system, every thread) of the client process and, over the run's connection, of the server process".into(),
        ],
    });

    // 6. Registration (local: no server involved).
    out.push(registration(plan, progress));
    out
}

/// Per-IO registration vs pooled chunk vs registration-cache hit, `rounds` times.
fn registration(plan: &Plan, progress: &dyn Fn(&str)) -> Sweep {
    let cols: Vec<&'static str> = vec!["ns_per_op", "ops_per_sec"];
    let labels = ["per-IO", "pool", "cache"];
    let mut ns: [Vec<f64>; 3] = Default::default();
    let mut err = None;
    let mut backing = String::new();
    // Each measurement gets a third of a run's time per way (at least 20 ms).
    let secs = (plan.run_seconds / 3.0).max(0.02);
    for round in 0..plan.rounds {
        progress(&format!("registration round {}", round + 1));
        match reg_bench::measure(secs, plan.provider.as_deref()) {
            Ok(f) => {
                backing = f.backing;
                for (v, x) in ns.iter_mut().zip([f.per_io_ns, f.pooled_ns, f.hit_ns]) {
                    v.push(x);
                }
            }
            Err(e) => err = err.or(Some(e)),
        }
    }
    let rows = labels
        .iter()
        .zip(ns.iter_mut())
        .enumerate()
        .map(|(i, (l, v))| {
            let runs = v.len();
            let m = median(v);
            Row {
                label: l.to_string(),
                x: i as f64,
                runs,
                errors: (plan.rounds - runs) as u64,
                figures: vec![
                    ("ns_per_op", m),
                    ("ops_per_sec", m.filter(|&n| n > 0.0).map(|n| 1e9 / n)),
                ],
                note: err.clone(),
            }
        })
        .collect();
    Sweep {
        name: "registration",
        knob: "how a 4 KiB IO buffer is registered",
        runs: format!("reg_bench in this process (arena backing: {backing})"),
        claim: Claim {
            text: "a registration pool instead of register/deregister per IO: -83% registration overhead",
            metric: "ns_per_op",
            baseline: "per-IO",
            points: vec![("per-IO", 1.0), ("pool", 0.17)],
            marks: vec![],
        },
        rows,
        columns: cols,
        plot: vec!["ops_per_sec", "ns_per_op"],
        notes: vec![
            "local: no server; no latency distribution (each figure is a mean over a timed loop)".into(),
            "soft: registration pins pages (mlock) and fills a table, as a NIC's driver does, but there is no NIC page table (MTT) to update: a NIC's per-IO registration costs more".into(),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_alternation() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(round_order(3, 0), [0, 1, 2]);
        assert_eq!(round_order(3, 1), [2, 1, 0]);
        assert_eq!(round_order(3, 2), [0, 1, 2]);
    }

    #[test]
    fn a_row_folds_medians_sums_and_errors() {
        let cols = ["ops_per_sec", "retransmits"];
        let run =
            |ops: f64, rt: f64| Ok(vec![("ops_per_sec", Some(ops)), ("retransmits", Some(rt))]);
        let runs = vec![
            run(10.0, 1.0),
            Err("boom".to_string()),
            run(30.0, 2.0),
            run(20.0, 0.0),
        ];
        let r = fold("x", 1.0, &cols, &runs);
        assert_eq!((r.runs, r.errors), (3, 1));
        assert_eq!(r.figures[0], ("ops_per_sec", Some(20.0)));
        assert_eq!(r.figures[1], ("retransmits", Some(3.0)));
        assert_eq!(r.note.as_deref(), Some("boom"));
        let none = fold("y", 0.0, &cols, &[Err("no".into())]);
        assert_eq!(none.figures[0].1, None);
    }
}

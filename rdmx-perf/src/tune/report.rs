//! `tune`'s output: one table per sweep, the advisor's path, recommendation and comparison,
//! the verification; and all of it as one JSON object (`--json`, and the input of the
//! plot script).

use super::advisor::{Path, Timers};
use super::path::{AdvisorResult, Verified};
use super::sweeps::Sweep;
use crate::perf::json_number;
use serde_json::{Map, Value, json};
use std::fmt::Write as _;

/// What a whole `tune` run produced.
#[derive(Debug, Clone)]
pub struct TuneResult {
    pub server: String,
    pub provider: String,
    pub quick: bool,
    pub rounds: usize,
    pub run_seconds: f64,
    pub qd: usize,
    pub sweeps: Vec<Sweep>,
    pub advisor: Option<AdvisorResult>,
    /// Why the advisor has no result, when it failed.
    pub advisor_error: Option<String>,
}

fn num(v: Option<f64>, decimals: usize) -> Value {
    v.map_or(Value::Null, |x| json_number(x, decimals))
}

fn decimals(column: &str) -> usize {
    match column {
        "retransmits" | "cq_overflows" => 0,
        "ops_per_sec" | "ns_per_op" => 1,
        c if c.contains("cpu") => 3,
        _ => 2,
    }
}

fn sweep_json(s: &Sweep) -> Value {
    let rows: Vec<Value> = s
        .rows
        .iter()
        .map(|r| {
            let mut o = Map::new();
            o.insert("label".into(), r.label.clone().into());
            o.insert("x".into(), json_number(r.x, 3));
            o.insert("runs".into(), r.runs.into());
            o.insert("errors".into(), r.errors.into());
            for (c, v) in &r.figures {
                o.insert((*c).into(), num(*v, decimals(c)));
            }
            o.insert(
                "note".into(),
                r.note.clone().map_or(Value::Null, Value::from),
            );
            Value::Object(o)
        })
        .collect();
    json!({
        "name": s.name,
        "knob": s.knob,
        "runs": s.runs,
        "claim": {
            "text": s.claim.text,
            "metric": s.claim.metric,
            "baseline": s.claim.baseline,
            "points": s.claim.points.iter()
                .map(|(l, f)| json!({"label": l, "factor": json_number(*f, 4)}))
                .collect::<Vec<_>>(),
            "marks": s.claim.marks.iter()
                .map(|(l, t)| json!({"label": l, "text": t}))
                .collect::<Vec<_>>(),
        },
        "columns": s.columns,
        "plot": s.plot,
        "notes": s.notes,
        "rows": rows,
    })
}

fn ms(ns: u64) -> Value {
    json_number(ns as f64 / 1e6, 3)
}

fn timers_json(t: &Timers) -> Value {
    json!({
        "name": t.name,
        "timeout": t.timeout,
        "retry_cnt": t.retry_cnt,
        "rnr_retry": t.rnr_retry,
        "min_rnr_timer": t.min_rnr_timer,
        "ack_timeout_ms": ms(rdmx::config::encoding::ack_timeout_ns(t.timeout).unwrap_or(0)),
        "detection_ms": if t.detection_ns == u64::MAX { Value::Null } else { ms(t.detection_ns) },
        "predicted_spurious_fraction": json_number(t.spurious_fraction, 12),
        "rnr_wait_ms": ms(t.rnr_wait_ns),
        "rnr_give_up_ms": t.rnr_give_up_ns.map_or(Value::Null, ms),
    })
}

fn path_json(p: &Path) -> Value {
    let q = |v: [u64; 4]| {
        json!({"p50_us": json_number(v[0] as f64 / 1e3, 2), "p99_us": json_number(v[1] as f64 / 1e3, 2),
               "p9999_us": json_number(v[2] as f64 / 1e3, 2), "max_us": json_number(v[3] as f64 / 1e3, 2)})
    };
    json!({
        "rtt": q(p.rtt_ns),
        "wait_at_qd": q(p.wait_ns),
        "silence_at_qd": q(p.gap_ns),
        "silences": p.gaps,
        "qd": p.qd,
        "resent_per_timeout": p.resent_per_timeout,
        "ops": p.ops,
        "ops_per_sec": json_number(p.ops_per_sec, 1),
        "seconds": json_number(p.seconds, 3),
        "server_stalls": p.server_stalls,
        "server_stalled_ms": ms(p.server_stalled_ns),
        "server_max_stall_ms": ms(p.server_max_stall_ns),
        "client_stalls": p.client_stalls,
        "client_stalled_ms": ms(p.client_stalled_ns),
        "client_max_stall_ms": ms(p.client_max_stall_ns),
        "rnr_naks": p.rnr_naks,
        "sends": p.sends,
        "rnr_probe_error": p.rnr_note.clone().map_or(Value::Null, Value::from),
        "counted": p.counted,
        "lost": p.lost,
        "tx_packets": p.tx_packets,
    })
}

fn verified_json(v: &Verified) -> Value {
    json!({
        "name": v.timers.name,
        "timers": timers_json(&v.timers),
        "runs": v.runs,
        "ops_per_sec": num(v.ops_per_sec, 1),
        "tx_packets": v.tx_packets,
        "retransmits": v.retransmits,
        "duplicates": v.duplicates,
        "ack_timeouts": v.ack_timeouts,
        "retransmit_fraction": num(v.retransmit_fraction, 6),
        "predicted_spurious_fraction": json_number(v.timers.spurious_fraction, 12),
        "errors": v.errors,
        "note": v.note.clone().map_or(Value::Null, Value::from),
    })
}

impl TuneResult {
    pub fn json(&self) -> Value {
        let advisor = match &self.advisor {
            Some(a) => json!({
                "path": path_json(&a.path),
                "recommended": timers_json(&a.advice.timers),
                "reasons": a.advice.reasons.iter()
                    .map(|(k, r)| (k.to_string(), Value::from(r.clone())))
                    .collect::<Map<String, Value>>(),
                "profiles": a.profiles.iter().map(timers_json).collect::<Vec<_>>(),
                "verify": a.verified.as_ref()
                    .map_or(Value::Null, |v| v.iter().map(verified_json).collect()),
            }),
            None => json!({"error": self.advisor_error}),
        };
        json!({
            "test": "tune",
            "server": self.server,
            "provider": self.provider,
            "quick": self.quick,
            "rounds": self.rounds,
            "run_seconds": json_number(self.run_seconds, 3),
            "qd": self.qd,
            "sweeps": self.sweeps.iter().map(sweep_json).collect::<Vec<_>>(),
            "advisor": advisor,
        })
    }

    /// The readable tables.
    pub fn table(&self) -> String {
        let mut s = format!(
            "# rdmx-perf tune  server={}  provider={}  rounds={}  run_seconds={}  qd={}{}\n",
            self.server,
            self.provider,
            self.rounds,
            self.run_seconds,
            self.qd,
            if self.quick { "  (quick)" } else { "" }
        );
        for sw in &self.sweeps {
            sweep_table(&mut s, sw);
        }
        match (&self.advisor, &self.advisor_error) {
            (Some(a), _) => advisor_table(&mut s, a),
            (None, Some(e)) => {
                let _ = writeln!(s, "\n## timer advisor: not measured: {e}");
            }
            (None, None) => {}
        }
        s
    }
}

fn cell(v: Option<f64>, column: &str) -> String {
    match v {
        None => "-".to_string(),
        Some(x) => format!("{x:.*}", decimals(column)),
    }
}

fn sweep_table(s: &mut String, sw: &Sweep) {
    let _ = writeln!(
        s,
        "\n## {}: {}\n# runs: {}\n# article: {}",
        sw.name, sw.knob, sw.runs, sw.claim.text
    );
    for n in &sw.notes {
        let _ = writeln!(s, "# note: {n}");
    }
    let mut header = format!("{:<10} {:>4}", "value", "runs");
    for c in &sw.columns {
        let _ = write!(header, " {:>w$}", c, w = c.len().max(8));
    }
    let _ = writeln!(s, "{header}");
    for r in &sw.rows {
        let mut line = format!("{:<10} {:>4}", r.label, r.runs);
        for (c, v) in &r.figures {
            let _ = write!(line, " {:>w$}", cell(*v, c), w = c.len().max(8));
        }
        if let Some(n) = &r.note {
            let _ = write!(line, "  [{} failed: {n}]", r.errors);
        }
        let _ = writeln!(s, "{line}");
    }
}

/// A count, or "n/a" where the provider cannot count it.
fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "n/a".to_string(), |n| n.to_string())
}

fn advisor_table(s: &mut String, a: &AdvisorResult) {
    let p = &a.path;
    let us = |ns: u64| ns as f64 / 1e3;
    let _ = writeln!(
        s,
        "\n## timer advisor: the path\n\
         RTT (read_lat)            p50 {:.1} us  p99 {:.1} us  p99.99 {:.1} us  max {:.1} us\n\
         wait at qd {:<4} (read_bw) p50 {:.1} us  p99 {:.1} us  p99.99 {:.1} us  max {:.1} us  ({} READs, {:.0} ops/s)\n\
         silences (no completion)  p50 {:.1} us  p99 {:.1} us  p99.99 {:.1} us  max {:.1} us  ({} of them; a timeout resends {})\n\
         server stalls             {} in {:.2} s, {:.3} ms in all, longest {:.3} ms\n\
         client stalls             {}, {:.3} ms in all, longest {:.3} ms (left out of its own timers)\n\
         RNR NAKs at qd {:<4}       {} in {} SENDs\n\
         loss                      {} of {} packets (sequence NAKs, out of sequence, kernel drops)",
        us(p.rtt_ns[0]),
        us(p.rtt_ns[1]),
        us(p.rtt_ns[2]),
        us(p.rtt_ns[3]),
        p.qd,
        us(p.wait_ns[0]),
        us(p.wait_ns[1]),
        us(p.wait_ns[2]),
        us(p.wait_ns[3]),
        p.ops,
        p.ops_per_sec,
        us(p.gap_ns[0]),
        us(p.gap_ns[1]),
        us(p.gap_ns[2]),
        us(p.gap_ns[3]),
        p.gaps,
        p.resent_per_timeout,
        p.server_stalls,
        p.seconds,
        p.server_stalled_ns as f64 / 1e6,
        p.server_max_stall_ns as f64 / 1e6,
        p.client_stalls,
        p.client_stalled_ns as f64 / 1e6,
        p.client_max_stall_ns as f64 / 1e6,
        p.qd,
        p.rnr_naks,
        p.sends,
        p.lost,
        p.tx_packets,
    );
    if !p.counted {
        let _ = writeln!(
            s,
            "(verbs: stalls, RNR NAKs and loss are not counted per connection, so the zeros \
             above are unknowns; the NIC keeps per-port hw_counters)"
        );
    }
    if let Some(n) = &p.rnr_note {
        let _ = writeln!(s, "(the RNR probe ended with: {n})");
    }
    let _ = writeln!(s, "\n## timer advisor: recommendation");
    for (k, r) in &a.advice.reasons {
        let _ = writeln!(s, "{k:<14} {r}");
    }
    let _ = writeln!(
        s,
        "\n{:<12} {:>7} {:>9} {:>9} {:>13} {:>12} {:>14} {:>12} {:>13}",
        "timers",
        "timeout",
        "retry_cnt",
        "rnr_retry",
        "min_rnr_timer",
        "ack_timeout",
        "dead peer after",
        "spurious (pred.)",
        "RNR give-up"
    );
    for t in std::iter::once(&a.advice.timers).chain(&a.profiles) {
        let fmt_ms = |ns: u64| format!("{:.3} ms", ns as f64 / 1e6);
        let _ = writeln!(
            s,
            "{:<12} {:>7} {:>9} {:>9} {:>13} {:>12} {:>15} {:>16.2e} {:>13}",
            t.name,
            t.timeout,
            t.retry_cnt,
            t.rnr_retry,
            t.min_rnr_timer,
            fmt_ms(rdmx::config::encoding::ack_timeout_ns(t.timeout).unwrap_or(0)),
            if t.detection_ns == u64::MAX {
                "never".to_string()
            } else {
                fmt_ms(t.detection_ns)
            },
            t.spurious_fraction,
            t.rnr_give_up_ns.map_or("never".to_string(), fmt_ms),
        );
    }
    if let Some(vs) = &a.verified {
        let _ = writeln!(
            s,
            "\n## --verify: read_bw qd {} with each timer set\n{:<12} {:>4} {:>11} {:>10} {:>11} {:>10} {:>12} {:>16} {:>16}",
            p.qd,
            "timers",
            "runs",
            "ops/s",
            "tx_packets",
            "retransmits",
            "duplicates",
            "ack_timeouts",
            "retransmitted",
            "predicted"
        );
        for v in vs {
            let _ = writeln!(
                s,
                "{:<12} {:>4} {:>11} {:>10} {:>11} {:>10} {:>12} {:>16} {:>16.2e}{}",
                v.timers.name,
                v.runs,
                v.ops_per_sec.map_or("-".into(), |o| format!("{o:.0}")),
                opt(v.tx_packets),
                opt(v.retransmits),
                opt(v.duplicates),
                opt(v.ack_timeouts),
                v.retransmit_fraction
                    .map_or("-".into(), |f| format!("{f:.2e}")),
                v.timers.spurious_fraction,
                v.note
                    .as_ref()
                    .map_or(String::new(), |n| format!("  [{} failed: {n}]", v.errors)),
            );
        }
    }
}

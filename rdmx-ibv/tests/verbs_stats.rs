//! Per-process counters (`verbs/stats.rs`): with `RDMXIBV_STATS_DIR` set, a process
//! writes `rdmx-<ip>-<pid>.stats` with its QP counters (destroyed QPs included), the
//! completions it polled and its error completions with the peer. Its own test binary:
//! the variable is read once per process, before the first device opens.

mod verbs_support;

use rdmx_ibv::verbs::stats::STATS_DIR_VAR;
use rdmx_ibv::verbs::*;
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};
use verbs_support::*;

/// A stats file of this process (named after the address of the device it last saw open:
/// this test has two devices).
fn read_stats(dir: &Path, path: &Path) -> Option<(HashMap<String, String>, Vec<String>)> {
    let text = std::fs::read_to_string(dir.join(path)).ok()?;
    let mut kv = HashMap::new();
    let mut errors = Vec::new();
    for line in text.lines() {
        let (k, v) = line.split_once(' ')?;
        if k == "wc_error" {
            errors.push(v.to_string());
        } else {
            kv.insert(k.to_string(), v.to_string());
        }
    }
    Some((kv, errors))
}

fn num(kv: &HashMap<String, String>, k: &str) -> u64 {
    kv.get(k).and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[test]
fn a_process_writes_its_counters_and_error_completions() {
    let dir = std::env::temp_dir().join(format!("rdmx-stats-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // SAFETY: set before any thread of this test binary reads the environment (the only
    // test here; devices open below).
    unsafe { std::env::set_var(STATS_DIR_VAR, &dir) };

    let a = Side::new("127.0.74.6", &Opts::default());
    let b = Side::new("127.0.74.7", &Opts::default());
    bring_up(&a, &b, 10, 2);
    bring_up(&b, &a, 10, 2);
    b.post_recv(1, 0, 8);
    a.post(a.wr(1, WrOpcode::Send, 0, 8)).unwrap();
    assert_eq!(wait_wc(&b.rcq).status, 0);
    assert_eq!(wait_wc(&a.scq).status, 0);
    drop(b); // the peer is gone: the next send ends in RETRY_EXC_ERR
    a.post(a.wr(2, WrOpcode::Send, 0, 8)).unwrap();
    let w = wait_wc(&a.scq);
    assert_eq!(w.status, WcStatus::RetryExcErr as u32);

    // The writer runs every 500 ms: wait for a snapshot that has seen the error.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (kv, errors) = loop {
        let suffix = format!("-{}.stats", std::process::id());
        let found = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().ends_with(&suffix))
            .filter_map(|p| read_stats(&dir, &p))
            .find(|(kv, _)| num(kv, "wc_status_12") >= 1);
        if let Some(f) = found {
            break f;
        }
        assert!(
            Instant::now() < deadline,
            "no stats file with the error in {dir:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // Both devices' QPs are counted by the process (b's destroyed QP folded in).
    assert!(num(&kv, "qps_created") >= 2, "{kv:?}");
    assert!(num(&kv, "tx_packets") >= 2, "{kv:?}");
    assert!(num(&kv, "rx_packets") >= 2, "{kv:?}");
    assert!(num(&kv, "retransmits") >= 1, "{kv:?}");
    assert!(num(&kv, "completions") >= 3, "{kv:?}");
    assert_eq!(
        kv.get("pid").map(String::as_str),
        Some(&*std::process::id().to_string())
    );
    // The error completion names its QP's peer and status 12.
    assert!(
        errors.iter().any(|e| e.ends_with(" 127.0.74.7 12")),
        "{errors:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

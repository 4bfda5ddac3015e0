//! `rdmx-perf reg_bench` runs and reports its three costs (figures, not timing asserts:
//! the ratios are for the benchmark's reader, these machines are shared).

use std::process::Command;

fn field(json: &str, key: &str) -> Option<f64> {
    let at = json.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &json[at..];
    let end = rest.find([',', '}'])?;
    rest[..end].parse().ok()
}

#[test]
fn reg_bench_reports_all_three_costs() {
    let out = Command::new(env!("CARGO_BIN_EXE_rdmx-perf"))
        .args(["reg_bench", "--seconds", "0.1", "--json"])
        .output()
        .expect("run rdmx-perf");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // With --json, stdout is the JSON object alone; the table and targets go to stderr.
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let json = stdout.trim_end();
    assert!(json.starts_with('{') && json.ends_with('}'), "{stdout}");
    for key in [
        "per_io_reg_ns",
        "pool_get_put_ns",
        "cache_hit_ns",
        "pool_metadata_pct",
    ] {
        let v = field(json, key).unwrap_or_else(|| panic!("{key} missing in {json}"));
        assert!(v > 0.0, "{key} = {v} in {json}");
    }
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("targets:"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Without --json, the table and targets are on stdout.
    let table = Command::new(env!("CARGO_BIN_EXE_rdmx-perf"))
        .args(["reg_bench", "--seconds", "0.05"])
        .output()
        .expect("run rdmx-perf");
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("targets:") && text.contains("per_io_reg_ns"),
        "{text}"
    );
    let bad = Command::new(env!("CARGO_BIN_EXE_rdmx-perf"))
        .args(["reg_bench", "--seconds", "nope"])
        .output()
        .expect("run rdmx-perf");
    assert_eq!(bad.status.code(), Some(2), "a usage error exits 2");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--seconds"));
}

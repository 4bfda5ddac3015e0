//! rdmx-perf end to end on 127.0.0.1: a server process, every test with `--json` (the last
//! stdout line parsed), the UDP baseline, loss injection, and the usage and setup errors.
//! Every spawned process is killed by a guard when the test ends, pass or fail.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_rdmx-perf");

/// A background process, killed (and reaped) on drop; its stderr is kept for messages.
struct Proc {
    child: Child,
    addr: String,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `rdmx-perf <kind> --listen 127.0.0.1:0 <extra>` and reads the address it
/// listens on from its first stdout line.
fn start(kind: &str, extra: &[&str]) -> Proc {
    start_on(kind, "127.0.0.1:0", extra)
}

/// As `start`, listening on `listen`.
fn start_on(kind: &str, listen: &str, extra: &[&str]) -> Proc {
    let mut child = Command::new(BIN)
        .arg(kind)
        .args(["--listen", listen])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rdmx-perf server");
    let stderr = Arc::new(Mutex::new(String::new()));
    let mut err = child.stderr.take().expect("stderr");
    let sink = Arc::clone(&stderr);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            if let Ok(mut s) = sink.lock() {
                s.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
    });
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("server stdout");
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = out.read_to_end(&mut sink);
    });
    let mut p = Proc {
        child,
        addr: String::new(),
        stderr,
    };
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .map(str::to_string);
    match addr {
        Some(a) => p.addr = a,
        None => {
            std::thread::sleep(Duration::from_millis(100));
            panic!(
                "{kind} did not print its address; stdout: {line:?}, stderr: {}",
                p.stderr.lock().map(|s| s.clone()).unwrap_or_default()
            );
        }
    }
    p
}

/// Runs the binary to completion (bounded by the tool's own time limits).
fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run rdmx-perf")
}

/// The value of a number field of a flat JSON object (minimal parsing: enough for ours).
fn field(json: &str, key: &str) -> Option<f64> {
    let pat = format!("\"{key}\":");
    let rest = &json[json.find(&pat)? + pat.len()..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

/// Runs a client test with `--json` and returns its JSON line, checking the basics.
fn client(server: &Proc, test: &str, extra: &[&str]) -> String {
    let mut args = vec![
        test,
        "--connect",
        &server.addr,
        "--duration",
        "0.4",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = run(&args);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "{test} {extra:?} failed ({}): stdout {stdout}\nstderr {stderr}\nserver stderr {}",
        out.status,
        server.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    );
    let last = stdout.lines().last().unwrap_or_default().to_string();
    assert!(
        last.starts_with('{') && last.ends_with('}'),
        "{test}: last line is not one JSON object: {last:?}"
    );
    last
}

const RDMX_FIELDS: &[&str] = &[
    "ops_per_sec",
    "gbps",
    "lat_p50_us",
    "lat_p99_us",
    "lat_p999_us",
    "retransmits",
    "rnr_naks",
    "ack_timeouts",
    "errors",
    "kernel_drops",
    "injected_drops",
    "size",
    "qd",
];

#[test]
fn every_test_runs_against_one_server_and_reports_json() {
    let server = start("server", &[]);
    for (test, extra) in [
        (
            "read_bw",
            &["--size", "4096", "--qd", "8", "--verify", "1"][..],
        ),
        ("write_bw", &["--size", "4096", "--qd", "8", "--batch", "4"]),
        ("send_bw", &["--size", "4096", "--qd", "8"]),
        ("read_lat", &["--size", "4096"]),
        ("send_lat", &["--size", "64"]),
        // Several packets per op (path MTU 4096) and an unaligned size.
        (
            "read_bw",
            &["--size", "10000", "--qd", "4", "--verify", "1"],
        ),
        ("read_lat", &["--size", "100", "--set", "poll_mode=busy"]),
        (
            "read_bw",
            &["--size", "4096", "--qd", "8", "--set", "progress=thread"],
        ),
    ] {
        let j = client(&server, test, extra);
        for f in RDMX_FIELDS {
            assert!(field(&j, f).is_some(), "{test}: field {f} missing in {j}");
        }
        assert!(j.contains(&format!("\"test\":\"{test}\"")), "{j}");
        assert!(field(&j, "ops_per_sec").unwrap_or(0.0) > 0.0, "{test}: {j}");
        assert_eq!(field(&j, "errors"), Some(0.0), "{test}: {j}");
        if test.ends_with("_lat") {
            assert_eq!(field(&j, "qd"), Some(1.0), "{test}: {j}");
        }
        if test.starts_with("read") {
            // --verify 1 (and latency runs) check every READ; the default samples 1 in 16.
            let ops = field(&j, "ops").unwrap_or(0.0);
            let every = extra.contains(&"--verify") || test.ends_with("_lat");
            let want = if every { ops } else { (ops / 16.0).ceil() };
            let got = field(&j, "verified").unwrap_or(-1.0);
            assert!(
                (got - want).abs() <= 1.0 + want * 0.01,
                "{test}: verified {got}, expected about {want}: {j}"
            );
        }
        let p50 = field(&j, "lat_p50_us").unwrap_or(0.0);
        let p99 = field(&j, "lat_p99_us").unwrap_or(0.0);
        assert!(p50 > 0.0 && p50 <= p99, "{test}: {j}");
    }
}

#[test]
fn reads_stay_correct_under_injected_loss_on_both_sides() {
    let server = start("server", &["--set", "soft_drop_ratio=0.01"]);
    let j = client(
        &server,
        "read_bw",
        &["--qd", "8", "--set", "soft_drop_ratio=0.01"],
    );
    assert_eq!(field(&j, "errors"), Some(0.0), "{j}");
    assert!(field(&j, "ops_per_sec").unwrap_or(0.0) > 0.0, "{j}");
    assert!(field(&j, "injected_drops").unwrap_or(0.0) > 0.0, "{j}");
    assert!(field(&j, "retransmits").unwrap_or(0.0) > 0.0, "{j}");
}

/// The soft provider over IPv6 loopback, every READ's content checked.
#[test]
fn reads_over_ipv6_are_correct() {
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        eprintln!("skipping: this host has no IPv6 loopback");
        return;
    }
    let server = start_on("server", "[::1]:0", &[]);
    assert!(server.addr.starts_with("[::1]:"), "{}", server.addr);
    let j = client(&server, "read_bw", &["--qd", "8", "--verify", "1"]);
    assert_eq!(field(&j, "errors"), Some(0.0), "{j}");
    assert!(field(&j, "verified").unwrap_or(0.0) > 0.0, "{j}");
}

#[test]
fn udp_baseline_reports_rate_latency_and_loss() {
    let server = start("udp_server", &[]);
    let out = run(&[
        "udp_read",
        "--connect",
        &server.addr,
        "--qd",
        "8",
        "--duration",
        "0.3",
        "--json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = stdout.lines().last().unwrap_or_default();
    assert!(field(j, "ops_per_sec").unwrap_or(0.0) > 0.0, "{j}");
    assert!(field(j, "lat_p50_us").is_some(), "{j}");
    assert!(field(j, "lost").is_some(), "{j}");
}

fn fails_with(args: &[&str], needle: &str) {
    let out = run(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(
        stderr.contains(needle),
        "{args:?}: stderr should mention {needle:?}: {stderr}"
    );
}

#[test]
fn usage_and_setup_errors_exit_nonzero_with_a_message() {
    fails_with(
        &["bogus_bw", "--connect", "127.0.0.1:1"],
        "unknown subcommand 'bogus_bw'",
    );
    fails_with(&["read_bw", "--size", "4096"], "--connect");
    fails_with(
        &["read_bw", "--connect", "127.0.0.1:1", "--qd", "x"],
        "not a number",
    );
    fails_with(
        &["read_bw", "--connect", "127.0.0.1:1", "--frobnicate"],
        "unknown option",
    );
    fails_with(
        &[
            "read_bw",
            "--connect",
            "127.0.0.1:1",
            "--set",
            "no_such_key=1",
        ],
        "no_such_key",
    );
    fails_with(&["server"], "--listen");
    fails_with(&["udp_read", "--qd", "4"], "--connect");
    // Nothing listens on port 1: a setup failure, not a hang.
    fails_with(
        &["read_bw", "--connect", "127.0.0.1:1", "--duration", "0.2"],
        "connect",
    );
    // A READ larger than the server's region cannot run.
    let server = start("server", &[]);
    fails_with(
        &[
            "read_bw",
            "--connect",
            &server.addr,
            "--size",
            "128M",
            "--qd",
            "1",
            "--duration",
            "0.2",
        ],
        "no region",
    );
}

#[test]
fn config_and_engine_bench_still_work() {
    let out = run(&["config", "--set", "soft_port=0"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("soft_port = 0"));
    let out = run(&["engine_bench", "--seconds", "0.2", "--json"]);
    assert!(
        out.status.success() || out.status.code() == Some(1),
        "engine_bench ran: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

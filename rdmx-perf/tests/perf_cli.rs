//! rdmx-perf end to end on 127.0.0.1: a server process, every test with `--json` (stdout
//! is exactly one JSON object), the UDP baseline, loss injection, `--help`, and the usage
//! errors (exit 2) and run failures (exit 1) with their messages.
//! Every spawned process is killed by a guard when the test ends, pass or fail.

#[path = "../../tests/require/mod.rs"]
mod require;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_rdmx-perf");

/// A background process, killed (and reaped) on drop; its stderr is kept for messages.
struct Proc {
    child: Child,
    addr: String,
    /// The first stdout line (the "listening on" line).
    line: String,
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
        line: line.clone(),
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

/// Checks that `text` is one flat JSON object and nothing else (what `| jq` needs): `{`,
/// `"key":value` pairs separated by commas, `}`, where a value is a string, a number,
/// true, false or null. Returns the keys, or what is wrong and where.
fn json_object_keys(text: &str) -> Result<Vec<String>, String> {
    let b = text.trim_end_matches('\n').as_bytes();
    let err = |i: usize, what: &str| Err(format!("{what} at byte {i} of {text:?}"));
    let string_end = |mut i: usize| -> Option<usize> {
        // b[i] is the opening quote; returns the index after the closing one.
        i += 1;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 2,
                b'"' => return Some(i + 1),
                c if c < 0x20 => return None,
                _ => i += 1,
            }
        }
        None
    };
    if b.first() != Some(&b'{') {
        return err(0, "not an object");
    }
    let mut keys = Vec::new();
    let mut i = 1;
    loop {
        if b.get(i) != Some(&b'"') {
            return err(i, "expected a key");
        }
        let Some(k_end) = string_end(i) else {
            return err(i, "unterminated key");
        };
        keys.push(text[i + 1..k_end - 1].to_string());
        i = k_end;
        if b.get(i) != Some(&b':') {
            return err(i, "expected ':'");
        }
        i += 1;
        let v_end = match b.get(i) {
            Some(b'"') => match string_end(i) {
                Some(e) => e,
                None => return err(i, "unterminated string"),
            },
            _ => {
                let e = b[i..]
                    .iter()
                    .position(|&c| c == b',' || c == b'}')
                    .map_or(b.len(), |p| i + p);
                let v = &text[i..e];
                if !(v == "true" || v == "false" || v == "null" || v.parse::<f64>().is_ok()) {
                    return err(i, "bad value");
                }
                e
            }
        };
        i = v_end;
        match b.get(i) {
            Some(b',') => i += 1,
            Some(b'}') if i + 1 == b.len() => return Ok(keys),
            _ => return err(i, "expected ',' or a final '}'"),
        }
    }
}

#[test]
fn the_json_checker_can_fail() {
    assert!(json_object_keys(r#"{"a":1,"b":"x\"y","c":true,"d":null}"#).is_ok());
    for bad in [
        "# table\n{\"a\":1}",
        "{\"a\":1}\n{\"b\":2}",
        "{\"a\":1} trailing",
        "{\"a\":x}",
        "{\"a\":1,}",
        "",
    ] {
        assert!(json_object_keys(bad).is_err(), "{bad:?} passed");
    }
}

/// The value of a number field of a flat JSON object (minimal parsing: enough for ours).
fn field(json: &str, key: &str) -> Option<f64> {
    let pat = format!("\"{key}\":");
    let rest = &json[json.find(&pat)? + pat.len()..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    rest[..end].trim().parse().ok()
}

/// Runs a client test with `--json` and returns its stdout, checking it is one JSON object
/// (the readable table goes to stderr).
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
    if let Err(e) = json_object_keys(&stdout) {
        panic!("{test}: stdout is not one JSON object: {e}");
    }
    assert!(stderr.contains("ops_per_sec"), "{test}: no table on stderr");
    stdout.trim_end().to_string()
}

const RDMX_FIELDS: &[&str] = &[
    "ops_per_sec",
    "bw_gbit_per_sec",
    "bw_mib_per_sec",
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
        check_bandwidth_units(&j);
    }
}

/// bw_gbit_per_sec is 10^9 bits/s (perftest's Gb/sec), bw_mib_per_sec 2^20 bytes/s
/// (perftest's MB/sec), both of ops_per_sec x size.
fn check_bandwidth_units(j: &str) {
    let bytes = field(j, "ops_per_sec").unwrap_or(0.0) * field(j, "size").unwrap_or(0.0);
    let gbit = field(j, "bw_gbit_per_sec").unwrap_or(-1.0);
    let mib = field(j, "bw_mib_per_sec").unwrap_or(-1.0);
    assert!(
        (gbit - bytes * 8.0 / 1e9).abs() <= 0.001 + 1e-6 * gbit,
        "Gb/s: {j}"
    );
    assert!(
        (mib - bytes / 1048576.0).abs() <= 0.01 + 1e-6 * mib,
        "MiB/s: {j}"
    );
    assert!(!j.contains("\"gbps\""), "{j}");
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
fn the_server_receives_rocev2_on_its_listen_address_only() {
    let server = start("server", &[]);
    assert!(
        server.line.contains("(provider soft, UDP 127.0.0.1:"),
        "{}",
        server.line
    );
    let j = client(&server, "read_bw", &["--qd", "4", "--verify", "1"]);
    assert_eq!(field(&j, "errors"), Some(0.0), "{j}");
    // Every address when asked for every address (IPv6 too where the host has it).
    let any = start_on("server", "0.0.0.0:0", &[]);
    assert!(any.line.contains("UDP 0.0.0.0:"), "{}", any.line);
    // An explicit soft_addr wins over the --listen address.
    let set = start_on("server", "127.0.0.1:0", &["--set", "soft_addr=0.0.0.0"]);
    assert!(set.line.contains("UDP 0.0.0.0:"), "{}", set.line);
}

#[test]
fn reads_over_ipv6_are_correct() {
    if let Err(e) = std::net::UdpSocket::bind("[::1]:0") {
        require::missing(
            require::IPV6,
            "the IPv6 read case",
            format!("bind [::1]: {e}"),
        );
        return;
    }
    let server = start_on("server", "[::1]:0", &[]);
    assert!(server.addr.starts_with("[::1]:"), "{}", server.addr);
    // RoCEv2 is received on the --listen address only.
    assert!(server.line.contains("UDP [::1]:"), "{}", server.line);
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
        // Long enough that a server a busy host leaves unscheduled for a while still
        // answers within the run.
        "1",
        "--json",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if let Err(e) = json_object_keys(&stdout) {
        panic!("udp_read: stdout is not one JSON object: {e}");
    }
    let j = stdout.as_str();
    assert!(field(j, "ops_per_sec").unwrap_or(0.0) > 0.0, "{j}");
    assert!(field(j, "lat_p50_us").is_some(), "{j}");
    assert!(field(j, "lost").is_some(), "{j}");
    check_bandwidth_units(j);
}

/// Runs `args`, expects exit status `code` (2 usage error, 1 run failure) and `needle` in
/// stderr; returns stderr.
fn fails_with(args: &[&str], code: i32, needle: &str) -> String {
    let out = run(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{args:?} should exit {code}: {stderr}"
    );
    assert!(
        stderr.contains(needle),
        "{args:?}: stderr should mention {needle:?}: {stderr}"
    );
    stderr
}

#[test]
fn usage_errors_exit_2_and_run_failures_exit_1() {
    fails_with(
        &["bogus_bw", "--connect", "127.0.0.1:1"],
        2,
        "unknown subcommand 'bogus_bw'",
    );
    fails_with(&[], 2, "usage: rdmx-perf");
    fails_with(&["read_bw", "--size", "4096"], 2, "--connect");
    fails_with(
        &["read_bw", "--connect", "127.0.0.1:1", "--qd", "x"],
        2,
        "not a number",
    );
    // A bad knob is a usage error too, found before connecting.
    fails_with(
        &[
            "read_bw",
            "--connect",
            "127.0.0.1:1",
            "--set",
            "no_such_key=1",
        ],
        2,
        "no_such_key",
    );
    // --qd over what max_send_wr allows: said about --qd, not about a "tool default".
    let e = fails_with(
        &["read_bw", "--connect", "127.0.0.1:1", "--qd", "100000"],
        2,
        "--qd 100000",
    );
    assert!(!e.contains("tool default"), "{e}");
    fails_with(
        &[
            "read_bw",
            "--connect",
            "127.0.0.1:1",
            "--qd",
            "300",
            "--set",
            "max_send_wr=256",
        ],
        2,
        "--qd 300 is more than max_send_wr = 256",
    );
    // Every subcommand: an unknown option is a usage error.
    for cmd in [
        "server",
        "read_bw",
        "write_bw",
        "send_bw",
        "read_lat",
        "send_lat",
        "udp_server",
        "udp_read",
        "engine_bench",
        "reg_bench",
        "config",
    ] {
        fails_with(&[cmd, "--frobnicate"], 2, "unknown option '--frobnicate'");
    }
    fails_with(&["server"], 2, "--listen");
    fails_with(&["udp_server"], 2, "--listen");
    fails_with(&["udp_read", "--qd", "4"], 2, "--connect");
    fails_with(&["reg_bench", "--seconds", "nope"], 2, "--seconds");
    fails_with(&["engine_bench", "--qd", "0"], 2, "--qd");
    fails_with(&["config", "--set", "path_mtu=1000"], 2, "path_mtu");
    // Nothing listens on port 1: a run failure, not a hang; the address said once.
    let e = fails_with(
        &["read_bw", "--connect", "127.0.0.1:1", "--duration", "0.2"],
        1,
        "connect to 127.0.0.1:1",
    );
    assert_eq!(e.matches("connect to").count(), 1, "{e}");
    // An address this host does not have: the server cannot bind its RoCEv2 port there
    // (run failure), and says so.
    fails_with(
        &["server", "--listen", "192.0.2.1:0"],
        1,
        "cannot bind UDP 192.0.2.1:0",
    );
    fails_with(
        &["server", "--listen", "192.0.2.1:0"],
        1,
        "no interface of this host has that address",
    );
}

#[test]
fn help_lists_every_subcommand_and_exits_0() {
    const ALL: &[&str] = &[
        "server",
        "read_bw",
        "write_bw",
        "send_bw",
        "read_lat",
        "send_lat",
        "udp_server",
        "udp_read",
        "engine_bench",
        "reg_bench",
        "config",
        "help",
    ];
    for flag in ["--help", "-h", "help"] {
        let out = run(&[flag]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{flag}: {stdout}");
        assert!(out.stderr.is_empty(), "{flag}: stderr {:?}", out.stderr);
        for name in ALL {
            assert!(
                stdout
                    .lines()
                    .any(|l| l.split_whitespace().next() == Some(name)),
                "{flag}: {name} is not listed:\n{stdout}"
            );
        }
    }
}

#[test]
fn a_subcommand_help_prints_its_options_and_exits_0() {
    for (args, options) in [
        (
            &["read_bw", "--help"][..],
            &["--connect", "--size", "--qd", "--duration", "--json"][..],
        ),
        (&["send_lat", "-h"], &["--connect", "--size"]),
        // --help wins over the other arguments, even invalid ones.
        (&["read_bw", "--bogus", "--help"], &["--verify"]),
        (&["help", "write_bw"], &["--batch"]),
        (&["server", "--help"], &["--listen", "--set", "--profile"]),
        (&["udp_server", "--help"], &["--listen", "--no-offload"]),
        (&["udp_read", "--help"], &["--connect", "--qd"]),
        (&["engine_bench", "--help"], &["--seconds", "--copy-link"]),
        (&["reg_bench", "--help"], &["--seconds", "--json"]),
        (&["config", "--help"], &["--profile", "--file", "--server"]),
    ] {
        let out = run(args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stdout}");
        assert!(
            stdout.starts_with("usage: rdmx-perf "),
            "{args:?}: {stdout}"
        );
        for o in options {
            assert!(stdout.contains(o), "{args:?}: {o} missing:\n{stdout}");
        }
    }
    fails_with(&["help", "bogus"], 2, "unknown subcommand 'bogus'");
}

#[test]
fn json_alone_on_stdout_for_the_benches() {
    for args in [
        &["engine_bench", "--seconds", "0.1", "--json"][..],
        &["reg_bench", "--seconds", "0.05", "--json"],
    ] {
        let out = run(args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Err(e) = json_object_keys(&stdout) {
            panic!("{args:?}: stdout is not one JSON object: {e}");
        }
    }
}

/// A SEND that fails (the server keeps one receive posted, the client allows no RNR retry)
/// is reported without a remote offset: SENDs name no remote memory.
#[test]
fn a_failed_send_names_no_remote_offset() {
    let server = start("server", &["--set", "max_recv_wr=1"]);
    let out = run(&[
        "send_bw",
        "--connect",
        &server.addr,
        "--qd",
        "8",
        "--duration",
        "1",
        "--set",
        "rnr_retry=0",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Send completed with"), "{stderr}");
    assert!(!stderr.contains("offset"), "{stderr}");
}

/// A peer that is not rdmx: its first bytes are shown as text, not as a list of numbers.
#[test]
fn a_non_rdmx_peer_is_shown_by_its_first_bytes() {
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n");
            std::thread::sleep(Duration::from_secs(2));
        }
    });
    let e = fails_with(&["read_bw", "--connect", &addr], 1, "first bytes \"SSH-\"");
    assert!(e.contains("is the peer rdmx?"), "{e}");
}

#[test]
fn config_shows_the_values_rdmx_perf_uses_with_range_and_meaning() {
    let out = run(&["config"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let line = |key: &str| {
        stdout
            .lines()
            .position(|l| l.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("{key} missing:\n{stdout}"))
    };
    let lines: Vec<&str> = stdout.lines().collect();
    // The tool default, not the library's 1024, and said to be the tool's.
    let mtu = line("path_mtu");
    assert!(
        lines[mtu].starts_with("path_mtu = 4096  # rdmx-perf default"),
        "{}",
        lines[mtu]
    );
    assert!(lines[mtu].contains("clamped"), "{}", lines[mtu]);
    // Range and meaning under each key.
    assert!(
        lines[mtu + 1].contains("256, 512, 1024, 2048, 4096") && lines[mtu + 1].contains("MTU"),
        "{}",
        lines[mtu + 1]
    );
    let retry = line("rnr_retry");
    assert!(lines[retry + 1].contains("0..7"), "{}", lines[retry + 1]);
    assert!(lines[line("soft_port")].starts_with("soft_port = 0  # rdmx-perf default"));
    // A user value wins over the tool default.
    let out = run(&["config", "--set", "path_mtu=1024"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("\npath_mtu = 1024  # set"), "{s}");
    // The server's values.
    let out = run(&["config", "--server"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("\nmax_recv_wr = 4096  # "), "{s}");
    // Sources a user has.
    assert!(stdout.contains("IBTA"), "{stdout}");
    assert!(!stdout.contains("rc-transport"), "{stdout}");
}

/// A READ larger than the server's region cannot run.
#[test]
fn a_read_larger_than_the_server_region_fails() {
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
        1,
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

/// The messenger tests against the same server as the others: JSON with the common keys,
/// no errors, every reply's data checked (rpc_lat), replies larger than a chunk (READ).
#[test]
fn messenger_tests_run_against_the_same_server() {
    let server = start("server", &[]);
    assert!(
        server.line.contains("messenger 127.0.0.1:"),
        "{}",
        server.line
    );
    for (test, extra) in [
        ("msg_bw", &["--size", "4096", "--qd", "8"][..]),
        ("msg_bw", &["--size", "65536", "--qd", "4"]),
        ("rpc_bw", &["--size", "4096", "--qd", "8", "--verify", "1"]),
        ("rpc_bw", &["--size", "20000", "--qd", "4", "--verify", "1"]),
        ("rpc_lat", &["--size", "4096"]),
        ("rpc_lat", &["--size", "64", "--set", "msgr_threads=1"]),
        // Beside idle sessions: each pass skips them (they stay open: no reset).
        ("rpc_lat", &["--size", "4096", "--idle-sessions", "50"]),
    ] {
        let j = client(&server, test, extra);
        for f in [
            "ops",
            "ops_per_sec",
            "bw_gbit_per_sec",
            "bw_mib_per_sec",
            "lat_p50_us",
            "lat_p99_us",
            "lat_p999_us",
            "size",
            "qd",
            "rnr_naks",
            "credit_stalls",
            "replays",
            "reconnects",
            "errors",
        ] {
            assert!(field(&j, f).is_some(), "{test}: field {f} missing in {j}");
        }
        assert!(j.contains(&format!("\"test\":\"{test}\"")), "{j}");
        assert!(field(&j, "ops").unwrap_or(0.0) > 0.0, "{test}: {j}");
        assert_eq!(field(&j, "errors"), Some(0.0), "{test}: {j}");
        assert_eq!(field(&j, "rnr_naks"), Some(0.0), "{test}: {j}");
        if test == "rpc_lat" {
            assert_eq!(field(&j, "qd"), Some(1.0), "{test}: {j}");
        }
        let idle = if extra.contains(&"--idle-sessions") {
            50.0
        } else {
            0.0
        };
        assert_eq!(field(&j, "idle_sessions"), Some(idle), "{test}: {j}");
        if test.starts_with("rpc") {
            assert_eq!(field(&j, "verified"), field(&j, "ops"), "{test}: {j}");
        }
        let p50 = field(&j, "lat_p50_us").unwrap_or(0.0);
        let p99 = field(&j, "lat_p99_us").unwrap_or(0.0);
        assert!(p50 > 0.0 && p50 <= p99, "{test}: {j}");
        check_bandwidth_units(&j);
    }
    // The same server still serves the RC tests.
    let j = client(&server, "read_lat", &["--size", "4096"]);
    assert_eq!(field(&j, "errors"), Some(0.0), "{j}");
    fails_with(&["rpc_bw", "--size", "4096"], 2, "--connect");
    fails_with(
        &["rpc_bw", "--connect", &server.addr, "--size", "0"],
        2,
        "--size must be",
    );
    fails_with(&["msg_bw", "--connect", "127.0.0.1:1"], 1, "127.0.0.1:1");
    fails_with(
        &[
            "rpc_lat",
            "--connect",
            &server.addr,
            "--idle-sessions",
            "10001",
        ],
        2,
        "--idle-sessions must be 0..=10000",
    );
}

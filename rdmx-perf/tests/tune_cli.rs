//! `rdmx-perf tune --quick` end to end on 127.0.0.1 against a server process: the JSON's
//! shape, that every sweep produced measured rows, that the server's side (CPU, counters)
//! came from the server, the advisor's figures and `--verify`'s rows; with matplotlib
//! installed (scripts/install-deps.sh), one PNG per sweep. Then the usage errors (exit 2)
//! and a run with no server (exit 1). The server is killed by a guard, pass or fail.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_rdmx-perf");

/// The server process, killed (and reaped) on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server() -> Server {
    let mut child = Command::new(BIN)
        .args(["server", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn rdmx-perf server");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("server stdout");
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = out.read_to_end(&mut sink);
    });
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .map(str::to_string);
    let mut s = Server {
        child,
        addr: String::new(),
    };
    s.addr = addr.unwrap_or_else(|| panic!("no address in the server's line {line:?}"));
    s
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run rdmx-perf")
}

/// Whether Debian's python has matplotlib (what --plot runs).
fn have_matplotlib() -> bool {
    Command::new("/usr/bin/python3")
        .args(["-c", "import matplotlib"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} is not a number in {v}"))
}

/// Each sweep, with the rows it must have.
const SWEEPS: &[(&str, &[&str])] = &[
    ("max_send_wr", &["64", "128", "256", "384", "512", "1024"]),
    ("post_batch", &["1", "8", "16", "32", "64"]),
    ("cq_size", &["1x", "1.5x", "2x", "4x"]),
    ("cq_sharing", &["separate", "shared"]),
    ("poll_mode", &["busy", "event", "adaptive"]),
    ("registration", &["per-IO", "pool", "cache"]),
];

#[test]
fn quick_run_measures_every_sweep_and_the_advisor() {
    let srv = server();
    let dir = std::env::temp_dir().join(format!("rdmx-tune-test-{}", std::process::id()));
    let plot = have_matplotlib();
    let dir_s = dir.to_string_lossy().to_string();
    let mut args = vec![
        "tune",
        "--connect",
        &srv.addr,
        "--quick",
        "--verify",
        "--json",
    ];
    if plot {
        args.extend(["--plot", &dir_s]);
    } else {
        eprintln!(
            "no matplotlib for /usr/bin/python3: --plot not tested (scripts/install-deps.sh installs it)"
        );
    }
    let t0 = Instant::now();
    let out = run(&args);
    let took = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\n{stderr}", out.status);
    assert_eq!(
        stdout.lines().count(),
        1,
        "stdout is one JSON line: {stdout}"
    );
    let j: Value = serde_json::from_str(&stdout).expect("stdout is JSON");
    eprintln!("tune --quick --verify took {took:?}");

    assert_eq!(j["test"], "tune");
    assert_eq!(j["quick"], true);
    assert_eq!(j["rounds"], 2);
    // provider=auto on a host without an RDMA device: the soft provider, named as used.
    assert_eq!(j["provider"], "soft");
    let sweeps = j["sweeps"].as_array().expect("sweeps");
    let names: Vec<&str> = sweeps.iter().map(|s| s["name"].as_str().unwrap()).collect();
    let want: Vec<&str> = SWEEPS.iter().map(|s| s.0).collect();
    assert_eq!(names, want);
    for (s, (name, labels)) in sweeps.iter().zip(SWEEPS) {
        let rows = s["rows"].as_array().expect("rows");
        let got: Vec<&str> = rows.iter().map(|r| r["label"].as_str().unwrap()).collect();
        assert_eq!(&got, labels, "{name}");
        assert!(s["claim"]["text"].as_str().is_some_and(|t| !t.is_empty()));
        let cols: Vec<&str> = s["columns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        for r in rows {
            assert!(
                num(r, "runs") >= 1.0,
                "{name} {}: no run measured: {r}",
                r["label"]
            );
            assert!(num(r, "ops_per_sec") > 0.0, "{name}: {r}");
            for c in &cols {
                assert!(r.get(*c).is_some(), "{name}: column {c} missing in {r}");
            }
            if *name != "registration" {
                assert!(num(r, "lat_p99_us") > 0.0, "{name}: {r}");
                // CPU of both sides; the server's came over the connection.
                assert!(num(r, "client_cpu_us_per_op") > 0.0, "{name}: {r}");
                assert!(num(r, "server_cpu_us_per_op") > 0.0, "{name}: {r}");
                assert_eq!(num(r, "retransmits").fract(), 0.0);
            } else {
                assert!(num(r, "ns_per_op") > 0.0, "{r}");
            }
            match *name {
                "cq_size" => assert_eq!(num(r, "cq_overflows"), 0.0, "{r}"),
                "cq_sharing" => {
                    assert!(num(r, "stream_p999_us") >= num(r, "stream_p99_us"), "{r}");
                    assert!(num(r, "stream_p99_us") > 0.0, "{r}");
                }
                _ => {}
            }
        }
    }

    let a = &j["advisor"];
    assert!(a.get("error").is_none(), "advisor failed: {a}");
    let p = &a["path"];
    assert!(num(&p["rtt"], "p50_us") > 0.0, "{p}");
    assert!(
        num(&p["rtt"], "p9999_us") >= num(&p["rtt"], "p99_us"),
        "{p}"
    );
    assert!(
        num(p, "silences") > 0.0 && num(p, "ops") > 0.0 && num(p, "sends") > 0.0,
        "{p}"
    );
    assert!(
        num(&p["silence_at_qd"], "max_us") >= num(&p["silence_at_qd"], "p50_us"),
        "{p}"
    );
    for k in [
        "server_stalls",
        "client_stalls",
        "rnr_naks",
        "lost",
        "tx_packets",
    ] {
        assert!(p[k].is_u64(), "{k} in {p}");
    }
    let rec = &a["recommended"];
    let t = num(rec, "timeout");
    assert!((1.0..=20.0).contains(&t), "{rec}");
    let detect = (num(rec, "retry_cnt") + 1.0) * 4.096e-3 * 2f64.powf(t);
    assert!(
        (num(rec, "detection_ms") - detect).abs() < 1e-3 * detect + 1e-3,
        "{rec}: detection is (retry_cnt + 1) x 4.096 us x 2^timeout"
    );
    assert!(num(rec, "predicted_spurious_fraction") >= 0.0);
    for k in ["timeout", "retry_cnt", "rnr_retry", "min_rnr_timer"] {
        assert!(
            a["reasons"][k].as_str().is_some_and(|r| r.len() > 20),
            "no reason for {k}: {a}"
        );
    }
    let profiles = a["profiles"].as_array().expect("profiles");
    let pt: Vec<(&str, f64)> = profiles
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), num(p, "timeout")))
        .collect();
    assert_eq!(pt, [("ceph-before", 14.0), ("ceph-after", 10.0)]);
    let v = a["verify"].as_array().expect("--verify rows");
    let vn: Vec<&str> = v.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(vn, ["recommended", "ceph-before", "ceph-after"]);
    for r in v {
        for k in [
            "retransmits",
            "duplicates",
            "ack_timeouts",
            "tx_packets",
            "errors",
        ] {
            assert!(r[k].is_u64(), "{k} in {r}");
        }
        assert!(num(r, "runs") + num(r, "errors") == 2.0, "{r}");
    }
    // The recommendation ran clean (the profiles may not, on a busy host).
    assert!(
        num(&v[0], "runs") >= 1.0 && num(&v[0], "tx_packets") > 0.0,
        "{}",
        v[0]
    );

    if plot {
        for (name, _) in SWEEPS {
            let png = dir.join(format!("tune-{name}.png"));
            let head = std::fs::read(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
            assert!(
                head.starts_with(b"\x89PNG") && head.len() > 5_000,
                "{}",
                png.display()
            );
        }
        let data: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("tune.json")).unwrap()).unwrap();
        assert_eq!(data, j, "tune.json is the --json object");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn usage_errors_exit_2_and_no_server_exits_1() {
    let o = run(&["tune"]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("--connect ADDR:PORT is required"), "{e}");
    let o = run(&["tune", "--connect", "127.0.0.1:1", "--provider", "ib"]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("--provider: must be soft or verbs, got 'ib'"),
        "{e}"
    );
    let o = run(&["tune", "--connect", "127.0.0.1:1", "--set", "rnr_retry=9"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = run(&["tune", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains("timer advisor"));

    // Port 1 on loopback: nothing listens; every run is refused at once.
    let o = run(&[
        "tune",
        "--connect",
        "127.0.0.1:1",
        "--quick",
        "--rounds",
        "1",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("nothing was measured against 127.0.0.1:1"),
        "{e}"
    );
    // Still one JSON object on stdout, with each row's failure in its note.
    let j: Value = serde_json::from_slice(&o.stdout).expect("JSON even when nothing ran");
    let note = &j["sweeps"][0]["rows"][0]["note"];
    assert!(
        note.as_str().is_some_and(|n| n.contains("127.0.0.1:1")),
        "{note}"
    );
    assert!(j["advisor"]["error"].is_string(), "{}", j["advisor"]);
}

//! A host that does not run the transport for a while (SIGSTOP here; CPU starvation does
//! the same in slices). IB semantics: a requester charges an ACK timeout to its retry
//! budget only for time it was listening, and a responder that is really gone ends the
//! requester's QP with RETRY_EXC_ERR after (retry_cnt + 1) x timeout.
//!
//! - the requester process is stopped for 20x its ACK timeout, twice, in a verified
//!   `rdmx-perf read_bw` with retry_cnt 1 (charging the stops would take 20 timeouts per
//!   stop; retry_cnt 1 tolerates one timeout charged by a stop that lands in the few
//!   instructions between a clock reading and the timer's publication on a loaded host):
//!   no error, every READ verified, and the stops show as stalls;
//! - the responder process is stopped: RETRY_EXC_ERR in (retry_cnt + 1) x timeout
//!   (+-50% + 10 ms, plus any time this process itself was not running) for both seed
//!   profiles, with a message that says what happened in the user's terms.
//!
//! It lives in rdmx-perf's package because the first test runs the `rdmx-perf` binary
//! (`CARGO_BIN_EXE_rdmx-perf` is set only for the package that builds it); it shares the
//! library tests' peer-process support module.

#[path = "../../tests/support/mod.rs"]
mod support;

use rdmx::config::encoding::ack_timeout_ns;
use rdmx::rc::{WcStatus, WrOpcode};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use support::{Local, Peer, PeerSpec, continue_process, serial, stop_process, within_tolerance};

const BIN: &str = env!("CARGO_BIN_EXE_rdmx-perf");
const SEC: Duration = Duration::from_secs(1);

/// Entry point of the peer process (does nothing unless RDMXTEST_PEER is set).
#[test]
#[ignore = "the peer process of the other tests; run by them"]
fn support_peer_main() {
    support::peer_main();
}

/// A child process killed and reaped on drop (SIGCONT first, in case it is stopped).
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The number after `"key":` in a flat JSON object.
fn json_num(json: &str, key: &str) -> f64 {
    let pat = format!("\"{key}\":");
    let at = json
        .find(&pat)
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + pat.len();
    json[at..]
        .split([',', '}'])
        .next()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{key} is not a number in {json}"))
}

#[test]
fn a_stopped_requester_does_not_charge_its_absence_to_the_peer() {
    let _g = serial();
    let mut server = Proc(
        Command::new(BIN)
            .args(["server", "--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn server"),
    );
    let mut line = String::new();
    let mut out = BufReader::new(server.0.stdout.take().expect("stdout"));
    out.read_line(&mut line).expect("server line");
    // Keep draining: a closed pipe would kill the server at its next line.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    // The library's default timeout; retry_cnt 1: two timeouts charged in a row end the run
    // (a stop charged as before would charge 20).
    let timeout = rdmx::Config::new().settings().unwrap().timeout;
    let per_try = Duration::from_nanos(ack_timeout_ns(timeout).unwrap());
    let stop_for = per_try * 20;
    let stops = 2u32;
    let duration = (stop_for + SEC / 2) * stops + 2 * SEC;
    let mut client = Proc(
        Command::new(BIN)
            .args(["read_bw", "--connect", &addr, "--qd", "32", "--verify", "1"])
            .args(["--duration", &format!("{:.1}", duration.as_secs_f64())])
            .args(["--set", "retry_cnt=1", "--json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn read_bw"),
    );
    std::thread::sleep(SEC);
    for _ in 0..stops {
        stop_process(client.0.id());
        std::thread::sleep(stop_for);
        continue_process(client.0.id());
        std::thread::sleep(SEC / 2);
    }
    let mut out = String::new();
    let mut err = String::new();
    client
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    client
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = client.0.wait().expect("read_bw exits");
    assert!(
        status.success(),
        "read_bw with the requester stopped {stops} x {stop_for:?} (20 x timeout {timeout}): {status}\n{err}\n{out}"
    );
    let ops = json_num(&out, "ops");
    assert!(ops > 0.0, "{out}");
    assert_eq!(json_num(&out, "errors"), 0.0, "{out}");
    assert_eq!(
        json_num(&out, "verified"),
        ops,
        "every READ verified: {out}"
    );
    // Charged as before the clock change, each stop would cost 20 timeouts. One timeout
    // was seen once in CI with both stops counted as stalls (2.58 s of 2.68 s) and not
    // explained yet (the note of 2026-11-30 says so); retry_cnt 1 absorbs one.
    let timeouts = json_num(&out, "ack_timeouts");
    assert!(timeouts <= 1.0, "{timeouts} ACK timeouts charged: {out}");
    // How much of the stops was left out of the ACK timer (from a due timer's deadline on)
    // is reported, not asserted: under CPU hogs a stop can land where no deadline is
    // visible to the device yet (a post between arming it and publishing it), and then no
    // stall is counted although nothing was charged either (the assertions above hold).
    let stalled = Duration::from_secs_f64(json_num(&out, "stalled_ms") / 1e3);
    println!(
        "requester stopped {stops} x {stop_for:?} (timeout {timeout} = {per_try:?}, retry_cnt 1): {ops} READs verified, stalled {stalled:?}, 0 errors"
    );
}

/// The responder stops answering (SIGSTOP) after a good READ: the next READ ends with
/// RETRY_EXC_ERR in (retry_cnt + 1) x timeout, and the connection says why.
fn stopped_responder(profile: &str) {
    let _g = serial();
    let kv = [("profile", profile), ("retry_cnt", "7")];
    let peer = Peer::spawn(&PeerSpec::new("127.0.0.1", &kv, 8), None);
    let l = Local::connect(&kv, "127.0.0.1", peer.tcp_port);
    let s = l.ctx.settings().clone();
    let per_try = Duration::from_nanos(ack_timeout_ns(s.timeout).unwrap());
    let expected = per_try * (u32::from(s.retry_cnt) + 1);
    l.conn
        .post_send(&[l.wr(1, WrOpcode::RdmaRead, 0, 4096, 0, true)])
        .unwrap();
    let c = l.wait(1, 5 * SEC);
    assert_eq!(
        c.first().map(|(w, _)| (w.cookie, w.status)),
        Some((1, WcStatus::Success)),
        "warm-up READ"
    );
    assert!(l.conn.failure_note().is_none());
    peer.stop();
    let before = l.conn.progress_stats();
    let t0 = Instant::now();
    l.conn
        .post_send(&[l.wr(2, WrOpcode::RdmaRead, 0, 4096, 8192, true)])
        .unwrap();
    let got = l.wait(1, expected * 3 + 2 * SEC);
    let after = l.conn.progress_stats();
    continue_process(peer.pid);
    let (w, t) = got.first().expect("a completion for the READ");
    assert_eq!((w.cookie, w.status), (2, WcStatus::RetryExcErr));
    // Time this process itself did not run is not charged to the peer: it adds to the
    // wall-clock time to RETRY_EXC_ERR.
    let stalled = Duration::from_nanos(after.stalled_ns - before.stalled_ns);
    let t_err = (*t - t0).saturating_sub(stalled);
    assert!(
        within_tolerance(t_err, expected),
        "{profile}: RETRY_EXC_ERR after {t_err:?} (+{stalled:?} stalled), expected {expected:?} +-50% + 10 ms"
    );
    let note = l.conn.failure_note().expect("a failure note");
    for want in [
        "RETRY_EXC_ERR".to_string(),
        format!("{} ACK timeout(s)", u32::from(s.retry_cnt) + 1),
        format!("retry_cnt {}", s.retry_cnt),
        format!("timeout {} = ", s.timeout),
        "peer is gone or the path is down".to_string(),
        "starved of CPU".to_string(),
        "load average".to_string(),
    ] {
        assert!(
            note.contains(&want),
            "{profile}: {want:?} missing in {note}"
        );
    }
    println!("{profile}: RETRY_EXC_ERR after {t_err:?} (expected {expected:?}): {note}");
}

#[test]
fn a_stopped_responder_ends_the_qp_in_time_ceph_after() {
    stopped_responder("ceph-after");
}

#[test]
fn a_stopped_responder_ends_the_qp_in_time_ceph_before() {
    stopped_responder("ceph-before");
}

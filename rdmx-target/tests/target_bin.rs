//! The rdmx-target binary (issue 27): RDMX_LOG works (a line per session and per volume
//! opened), and a slow consumer (reads whose replies it never drains) stalls itself, not
//! the target: the target's RSS stays bounded and a normal client beside it keeps getting
//! replies. Every wait is bounded.

#[path = "../../tests/blk_io/mod.rs"]
mod blk_io;

use rdmx::blk::proto::{MSG_REQ, Op, Reply, ReqHdr};
use rdmx::blk::{BlkClient, Mode};
use rdmx::config::Config;
use rdmx::msgr::messenger::{Dispatcher, InMessage, Messenger, OutMessage, Policy, SessionId};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

/// A running rdmx-target: killed on drop; `stop` ends it with SIGTERM and returns stderr.
struct Running {
    child: Child,
    addr: String,
}

fn spawn(args: &[&str], log: Option<&str>) -> Running {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rdmx-target"));
    cmd.args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("RDMX_LOG");
    if let Some(l) = log {
        cmd.env("RDMX_LOG", l);
    }
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .strip_prefix("rdmx-target listening on ")
        .and_then(|r| r.split_whitespace().next())
        .map(str::to_string)
        .unwrap_or_else(|| {
            // Seen once in CI (the `lifted` run): the target exited before listening. Its
            // stderr says why.
            let _ = child.kill();
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("unexpected first line: {line:?}; args {args:?}; stderr:\n{err}")
        });
    Running { child, addr }
}

impl Running {
    fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    }

    /// SIGTERM, wait (bounded), and the whole stderr.
    fn stop(mut self) -> String {
        // SAFETY: signals our own child by its pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + T;
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < end, "rdmx-target did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        err
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cfg() -> Config {
    let mut c = Config::new();
    c.set("timeout", "17").unwrap();
    c
}

/// Reads 4 KiB at offset 0 and waits for it.
fn read4k(c: &mut BlkClient, buf: &mut [u8]) -> i32 {
    blk_io::io_4k(c, Op::Read, buf, T)
}

#[test]
fn rdmx_log_info_prints_a_line_per_session() {
    let t = spawn(&["--volume", "m0=mem:1M"], Some("info"));
    let mut c = BlkClient::open(&cfg(), &t.addr, "m0", Mode::Rpc, T).unwrap();
    let mut buf = vec![0u8; 4096];
    assert_eq!(read4k(&mut c, &mut buf), 0);
    drop(c);
    std::thread::sleep(Duration::from_millis(100));
    let err = t.stop();
    assert!(
        err.contains("rdmx-target: session") && err.contains("from 127.0.0.1:"),
        "no session line in:\n{err}"
    );
    assert!(err.contains("entity none (auth off)"), "{err}");
    assert!(!err.contains("rcache dropped"), "{err}");
    assert!(err.contains("opened volume 'm0' read-write"), "{err}");
    assert!(err.contains("no --allow given"), "{err}");
    // The default level (warn): the start-up warning, no session lines.
    let t = spawn(&["--volume", "m0=mem:1M"], None);
    let c = BlkClient::open(&cfg(), &t.addr, "m0", Mode::Rpc, T).unwrap();
    drop(c);
    let err = t.stop();
    assert!(err.contains("no --allow given"), "{err}");
    assert!(!err.contains("rdmx-target: session"), "{err}");
    // Stopping puts its registrations back before the messenger's cache goes.
    assert!(!err.contains("rcache dropped"), "{err}");
}

#[test]
fn refusals_are_logged_at_warn() {
    let t = spawn(
        &["--volume", "m0=mem:1M", "--allow", "m0=client.a:rw"],
        None,
    );
    let e = BlkClient::open(&cfg(), &t.addr, "m0", Mode::Rpc, T).unwrap_err();
    assert!(e.to_string().contains("Permission denied"), "{e}");
    let err = t.stop();
    assert!(
        err.contains("refused: open of volume 'm0' not granted"),
        "{err}"
    );
    assert!(err.contains("1 refused by access control"), "{err}");
}

#[test]
fn bad_allow_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_rdmx-target"))
        .args(["--listen", "127.0.0.1:0", "--volume", "m0=mem:1M"])
        .args(["--allow", "m0=client.a:rx"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("access 'rx' is neither 'rw' nor 'ro'"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_rdmx-target"))
        .args(["--listen", "127.0.0.1:0", "--volume", "m0=mem:1M"])
        .args(["--allow", "v9=client.a:rw"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no such volume"), "{err}");
}

/// Holds every reply (never drops one): the client's pool fills and the target's replies
/// stay unacknowledged, while its requests keep going.
struct Hoard(Mutex<Vec<InMessage>>, AtomicU64);
impl Dispatcher for Hoard {
    fn on_message(&self, _m: &Messenger, _s: SessionId, msg: InMessage) {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.lock().unwrap().push(msg);
    }
}

/// Runs a slow consumer (`reads` unplaced 512 KiB reads of a file volume, never drained)
/// beside a normal client against a target started with `limits`; returns the target's
/// RSS growth (KiB), the normal client's completed reads and the target's stderr.
fn slow_consumer(limits: &[&str], reads: u64) -> (u64, u64, String) {
    // A directory per call: the tests run in parallel threads of one process, and each
    // removes its directory at the end (a shared one lost a running test's volume in CI).
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "rdmx-target-slow-{}-{}",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("vol");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    let vol = format!("f0=file:{}", path.display());
    let mut args = vec!["--volume", vol.as_str()];
    args.extend_from_slice(limits);
    let t = spawn(&args, Some("warn"));
    let mut normal = BlkClient::open(&cfg(), &t.addr, "f0", Mode::Rpc, T).unwrap();
    let mut buf = vec![0u8; 4096];
    assert_eq!(read4k(&mut normal, &mut buf), 0);
    let rss0 = t.rss_kib();
    // The normal client reads on its own thread throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let beside = std::thread::spawn(move || {
        let mut n = 0u64;
        let mut buf = vec![0u8; 4096];
        while !stop2.load(Ordering::Relaxed) {
            assert_eq!(read4k(&mut normal, &mut buf), 0);
            n += 1;
        }
        n
    });
    let hoard = Arc::new(Hoard(Mutex::new(Vec::new()), AtomicU64::new(0)));
    let mut mc = cfg();
    rdmx::blk::apply_defaults(&mut mc).unwrap();
    let m = Messenger::new(&mc, hoard.clone()).unwrap();
    let s = m.connect(&t.addr, Policy::Lossy).unwrap();
    let req = |op: Op, id: u64, offset: u64, len: u32, name: &[u8]| {
        ReqHdr {
            op: op as u8,
            vol: 0,
            req_id: id,
            offset,
            len,
            place: None,
            imm_reply: false,
            name: name.to_vec(),
        }
        .encode()
    };
    m.send(s, OutMessage::new(MSG_REQ, req(Op::Open, 0, 0, 0, b"f0")))
        .unwrap();
    let end = Instant::now() + T;
    while hoard.1.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < end, "no open reply");
        m.poll(Duration::from_millis(20)).unwrap();
    }
    let open = Reply::decode(&hoard.0.lock().unwrap()[0].front).unwrap();
    assert_eq!(open.status, 0);
    // Unplaced 512 KiB reads, as fast as the session takes them, for at most 15 s.
    let (mut sent, end) = (0u64, Instant::now() + Duration::from_secs(15));
    while sent < reads && Instant::now() < end {
        let off = (sent % 120) << 19;
        match m.send(
            s,
            OutMessage::new(MSG_REQ, req(Op::Read, sent + 1, off, 512 << 10, b"")),
        ) {
            Ok(_) => sent += 1,
            Err(r) if r.kind() == rdmx::ErrorKind::Full => {
                m.poll(Duration::from_millis(5)).unwrap();
            }
            // Closed by the target (over `max_deferred`): that is its answer.
            Err(_) => break,
        }
        if sent % 16 == 0 {
            m.poll(Duration::ZERO).unwrap();
        }
    }
    // Let the target take what was sent.
    let settle = Instant::now() + Duration::from_secs(2);
    while Instant::now() < settle {
        m.poll(Duration::from_millis(20)).unwrap();
    }
    let rss1 = t.rss_kib();
    stop.store(true, Ordering::Relaxed);
    let n = beside.join().unwrap();
    eprintln!(
        "slow consumer {limits:?}: {sent} reads sent, {} replies held; target RSS {rss0} -> {rss1} KiB; normal client {n} reads",
        hoard.1.load(Ordering::Relaxed)
    );
    drop(m);
    let err = t.stop();
    let _ = std::fs::remove_dir_all(&dir);
    (rss1.saturating_sub(rss0), n, err)
}

#[test]
fn a_slow_consumer_stalls_itself_not_the_target() {
    let (grew, normal, err) = slow_consumer(&["--session-bufs", "8"], 800);
    assert!(grew < 48 << 10, "target RSS grew {grew} KiB\n{err}");
    assert!(
        normal >= 20,
        "the normal client completed {normal} reads\n{err}"
    );
    assert!(err.contains("over its quota"), "{err}");
    // The consumer's messenger still acknowledges what it receives (and holds), so its
    // session may drain and stall again before its pool is full: one stall or more.
    let stalls: u64 = err
        .split(" stalls,")
        .next()
        .and_then(|head| head.rsplit('(').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(stalls >= 1, "{err}");
    // Paused, not closed: the consumer's requests wait in its own send queue, so the few
    // set aside stay far below `max_deferred` and the session lives on, costing nothing.
    assert!(err.contains(" 0 sessions closed"), "{err}");
    // The same run with the bounds lifted (as before them): the target holds an IO buffer
    // per reply the consumer never drains.
    let lifted = [
        "--session-bufs",
        "1000000",
        "--max-backlog",
        "1000000",
        "--io-bufs",
        "1000000",
    ];
    let (unbounded, _, err) = slow_consumer(&lifted, 800);
    assert!(
        unbounded > grew + (32 << 10),
        "without bounds the target grew {unbounded} KiB, with them {grew} KiB\n{err}"
    );
}

/// The safety net behind flow control: with `max_deferred` below what the client already
/// had on the wire when the target paused it (its credits: at least the 3 data messages
/// the minimum receive window of 4 allows, and it keeps sending), the session is closed.
/// (At 64, the default window, flow control kept it out of reach in a CI run: 5 stalls,
/// 131 requests set aside in all, none closed.)
#[test]
fn a_consumer_that_keeps_sending_while_stalled_is_closed() {
    let (_, normal, err) = slow_consumer(&["--session-bufs", "8", "--max-deferred", "1"], 800);
    assert!(
        normal >= 20,
        "the normal client completed {normal} reads\n{err}"
    );
    assert!(err.contains("closed: it kept sending"), "{err}");
    assert!(err.contains("1 sessions closed"), "{err}");
}

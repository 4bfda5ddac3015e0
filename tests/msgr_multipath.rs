//! A session over two paths through the public API (issue 30 point 1): one listening
//! messenger reached at two addresses (127.0.0.1 and 127.0.0.2), a session whose numbered
//! messages flow while the active path's connection is faulted (a QP error, then a closed
//! side channel). Lossless: every message arrives exactly once and in order, no reset, the
//! path events say down then active on the other path, the counters agree, and the faulted
//! path rejoins and (failback) takes the traffic back. Lossy: the sends the failed path
//! carried unacknowledged complete "in doubt", nothing is delivered twice or out of
//! order, and the session goes on without a reset.
//!
//! A real black hole too (where nftables is usable: `RDMX_TEST_REQUIRE=nft` or `all` makes
//! it mandatory): the UDP datagrams of path 0 towards the accepting side are dropped (an
//! nft table named for this test and its pid, removed after), the RC retries run out
//! (RETRY_EXC_ERR), the session moves to path 1, and path 0 rejoins once the table is gone.
//!
//! Active/active (`PathPolicy::Active`): both paths carry messages (each path's counters
//! on both sides), a QP error and a black hole of path 0 mid-stream lose nothing
//! (lossless: exactly once, in order, no reset), a lossy session reports what the failed
//! path carried in doubt and delivers the rest in order; immediate messages are refused.
//!
//! Behaviour, not timing: every wait is bounded generously.

use rdmx::msgr::messenger::{
    Dispatcher, Fault, InMessage, Messenger, PathEvent, PathPolicy, PathState, Policy, SessionId,
    is_in_doubt,
};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod require;
mod support;
use support::msgr_faults::{config, fnv, message, page};

#[derive(Default)]
struct Side {
    /// The last sequence number delivered, and messages out of order, twice or corrupt.
    last: AtomicU64,
    bad: AtomicU64,
    delivered: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    in_doubt: AtomicU64,
    resets: AtomicU64,
    session: Mutex<Option<SessionId>>,
    /// Path events in order: (path, "down" | "up" | "active").
    paths: Mutex<Vec<(usize, &'static str)>>,
    lossy: bool,
}

impl Dispatcher for Side {
    fn on_connect(&self, _m: &Messenger, s: SessionId, _p: std::net::SocketAddr, _i: bool) {
        *self.session.lock().unwrap() = Some(s);
    }
    fn on_message(&self, _m: &Messenger, _s: SessionId, msg: InMessage) {
        let seq = u64::from_le_bytes(msg.front[..8].try_into().unwrap());
        let sum = u64::from_le_bytes(msg.front[8..16].try_into().unwrap());
        let data = msg.data[0].to_vec();
        let last = self.last.load(Ordering::Relaxed);
        // Lossless: the next one exactly; lossy: a later one (what a failed path lost is
        // skipped), never an earlier one again.
        let in_order = if self.lossy {
            seq > last
        } else {
            seq == last + 1
        };
        if !in_order || fnv(&data) != sum || data != page(seq) {
            eprintln!("bad message: seq {seq} after {last}");
            self.bad.fetch_add(1, Ordering::Relaxed);
        }
        self.last.store(seq.max(last), Ordering::Relaxed);
        self.delivered.fetch_add(1, Ordering::Relaxed);
    }
    fn on_send_complete(
        &self,
        _m: &Messenger,
        _s: SessionId,
        _id: u64,
        r: rdmx::error::Result<()>,
    ) {
        match r {
            Ok(()) => self.ok.fetch_add(1, Ordering::Relaxed),
            Err(e) if is_in_doubt(&e) => self.in_doubt.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                eprintln!("send failed: {e}");
                self.failed.fetch_add(1, Ordering::Relaxed)
            }
        };
    }
    fn on_reset(&self, _m: &Messenger, _s: SessionId, why: &rdmx::Error) {
        eprintln!("reset: {why}");
        self.resets.fetch_add(1, Ordering::Relaxed);
    }
    fn on_path(&self, _m: &Messenger, _s: SessionId, path: usize, ev: &PathEvent) {
        let k = match ev {
            PathEvent::Down(_) => "down",
            PathEvent::Up => "up",
            PathEvent::Active => "active",
        };
        self.paths.lock().unwrap().push((path, k));
    }
}

const LIMIT: Duration = Duration::from_secs(60);

fn wait(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < LIMIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Two messengers, the acceptor listening on every loopback address; a session from `a`
/// to it over 127.0.0.1 (path 0, preferred) and 127.0.0.2 (path 1), both joined.
fn pair(policy: Policy) -> (Messenger, Messenger, Arc<Side>, Arc<Side>, SessionId) {
    pair_with(policy, &[], &[])
}

/// [`pair`] with extra config for the connecting (`ka`) and accepting (`kb`) sides.
fn pair_with(
    policy: Policy,
    ka: &[(&str, &str)],
    kb: &[(&str, &str)],
) -> (Messenger, Messenger, Arc<Side>, Arc<Side>, SessionId) {
    pair_policy(policy, PathPolicy::Standby, ka, kb)
}

/// [`pair_with`] with the path policy (active/active: both paths `Active` once joined).
fn pair_policy(
    policy: Policy,
    pp: PathPolicy,
    ka: &[(&str, &str)],
    kb: &[(&str, &str)],
) -> (Messenger, Messenger, Arc<Side>, Arc<Side>, SessionId) {
    let lossy = policy == Policy::Lossy;
    let da = Arc::new(Side {
        lossy,
        ..Side::default()
    });
    let db = Arc::new(Side {
        lossy,
        ..Side::default()
    });
    let kv = [("msgr_keepalive_timeout_ms", "1000")];
    let with = |extra: &[(&str, &str)]| {
        let all: Vec<(&str, &str)> = kv.iter().chain(extra).copied().collect();
        config(&all)
    };
    let a = Messenger::new(&with(ka), da.clone()).unwrap();
    let b = Messenger::new(&with(kb), db.clone()).unwrap();
    let port = b.listen("0.0.0.0:0").unwrap().port();
    let p0 = format!("127.0.0.1:{port}");
    let p1 = format!("127.0.0.2:{port}");
    let s = a.connect_paths(&[&p0, &p1], policy, pp).unwrap();
    let second = match pp {
        PathPolicy::Active => PathState::Active,
        _ => PathState::Standby,
    };
    wait("both paths up", || {
        let p = a.paths(s).unwrap();
        p[0].state == PathState::Active && p[1].state == second
    });
    wait("the accepting side's session", || {
        db.session.lock().unwrap().is_some()
    });
    let info = a.paths(s).unwrap();
    assert_eq!(info[0].remote.as_deref(), Some(p0.as_str()));
    assert_eq!(info[1].remote.as_deref(), Some(p1.as_str()));
    (a, b, da, db, s)
}

/// Sends `from..to` on `s`, retrying while the queue is full.
fn send_range(a: &Messenger, s: SessionId, from: u64, to: u64) {
    let start = Instant::now();
    let mut seq = from;
    while seq < to {
        match a.send(s, message(seq)) {
            Ok(_) => seq += 1,
            Err(r) if r.error.kind() == rdmx::error::ErrorKind::Full => {
                assert!(start.elapsed() < LIMIT, "send {seq}: full for too long");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(r) => panic!("send {seq}: {}", r.error),
        }
    }
}

fn events(d: &Side) -> Vec<(usize, &'static str)> {
    d.paths.lock().unwrap().clone()
}

#[test]
fn lossless_fails_over_exactly_once_in_order_and_fails_back() {
    let _serial = support::serial();
    let (a, _b, da, db, s) = pair(Policy::Lossless);
    const N: u64 = 3000;
    let mut next = 1;
    for (round, fault) in [Fault::QpError, Fault::SideChannelClose]
        .into_iter()
        .enumerate()
    {
        // Traffic, then the fault on the active path (path 0) with messages in flight.
        send_range(&a, s, next, next + N / 4);
        next += N / 4;
        a.inject_fault(s, fault).unwrap();
        send_range(&a, s, next, next + N / 4);
        next += N / 4;
        // Down, then the traffic on path 1 (the events of this round: cleared below).
        wait("the switch to path 1", || {
            let e = events(&da);
            let down = e.iter().rposition(|&x| x == (0, "down"));
            let active = e.iter().rposition(|&x| x == (1, "active"));
            matches!((down, active), (Some(d), Some(a)) if d < a)
        });
        // Path 0 is retried, rejoins, and (failback) takes the traffic back.
        wait("the failback to path 0", || {
            let p = a.paths(s).unwrap();
            p[0].state == PathState::Active
                && p[1].state == PathState::Standby
                && p[0].counters.switches == round as u64 + 1
        });
        da.paths.lock().unwrap().clear();
    }
    wait("every message delivered and acknowledged", || {
        db.last.load(Ordering::Relaxed) == next - 1 && da.ok.load(Ordering::Relaxed) == next - 1
    });
    assert_eq!(db.bad.load(Ordering::Relaxed), 0, "exactly once, in order");
    assert_eq!(db.delivered.load(Ordering::Relaxed), next - 1);
    assert_eq!(da.failed.load(Ordering::Relaxed), 0);
    assert_eq!(da.resets.load(Ordering::Relaxed), 0);
    assert_eq!(db.resets.load(Ordering::Relaxed), 0);
    let p = a.paths(s).unwrap();
    assert_eq!(p[0].counters.faults, 2, "{p:?}");
    assert_eq!(p[1].counters.switches, 2, "{p:?}");
    assert!(p[0].last_fault.is_some());
    let sent: u64 = p.iter().map(|x| x.counters.msgs_sent).sum();
    assert!(sent >= next - 1, "{p:?}");
    assert!(p[1].counters.msgs_sent > 0, "path 1 carried traffic: {p:?}");
    let info = a.session_info(s).unwrap();
    assert_eq!(info.counters.reconnects, 0, "no new session, no reconnect");
    // The accepting side followed: its view of the paths.
    let sb = db.session.lock().unwrap().unwrap();
    let pb = _b.paths(sb).unwrap();
    assert_eq!(pb.len(), 2);
    assert_eq!(pb[0].state, PathState::Active, "{pb:?}");
}

#[test]
fn lossy_reports_in_doubt_sends_and_goes_on_without_a_reset() {
    let _serial = support::serial();
    let (a, _b, da, db, s) = pair(Policy::Lossy);
    send_range(&a, s, 1, 500);
    a.inject_fault(s, Fault::QpError).unwrap();
    send_range(&a, s, 500, 1000);
    wait("the switch to path 1", || {
        events(&da).contains(&(1, "active"))
    });
    send_range(&a, s, 1000, 1200);
    wait("every send completed", || {
        da.ok.load(Ordering::Relaxed)
            + da.in_doubt.load(Ordering::Relaxed)
            + da.failed.load(Ordering::Relaxed)
            == 1199
    });
    assert_eq!(da.failed.load(Ordering::Relaxed), 0, "only in-doubt errors");
    assert_eq!(da.resets.load(Ordering::Relaxed), 0);
    assert_eq!(db.resets.load(Ordering::Relaxed), 0);
    assert_eq!(db.bad.load(Ordering::Relaxed), 0, "at most once, in order");
    // Everything acknowledged was delivered; the in-doubt ones at most once.
    let delivered = db.delivered.load(Ordering::Relaxed);
    let ok = da.ok.load(Ordering::Relaxed);
    assert!(delivered >= ok && delivered <= 1199, "{delivered} {ok}");
    assert_eq!(
        db.last.load(Ordering::Relaxed),
        1199,
        "the last ones arrived"
    );
}

#[test]
fn paths_can_be_added_and_removed_and_bad_addresses_are_refused() {
    let _serial = support::serial();
    let (a, _b, da, db, s) = pair(Policy::Lossless);
    let port = _b.paths(db.session.lock().unwrap().unwrap()).unwrap().len();
    assert_eq!(port, 2);
    let e = a.add_path(s, "no-such-host-rdmx:1").unwrap_err();
    assert_eq!(e.kind(), rdmx::error::ErrorKind::InvalidArgument);
    let e = a
        .connect_paths(&[], Policy::Lossless, PathPolicy::Standby)
        .unwrap_err();
    assert_eq!(e.kind(), rdmx::error::ErrorKind::InvalidArgument);
    // Remove the active path: the traffic moves to path 1, nothing lost.
    send_range(&a, s, 1, 200);
    a.remove_path(s, 0).unwrap();
    send_range(&a, s, 200, 400);
    wait("delivery", || db.last.load(Ordering::Relaxed) == 399);
    let p = a.paths(s).unwrap();
    assert!(p[0].removed && p[1].state == PathState::Active, "{p:?}");
    // The last path stays.
    assert!(a.remove_path(s, 1).is_err());
    // A third path (the same acceptor again) joins as standby.
    let addr = p[1].remote.clone().unwrap();
    assert_eq!(a.add_path(s, &addr).unwrap(), 2);
    wait("path 2 joined", || {
        a.paths(s).unwrap()[2].state == PathState::Standby
    });
    assert_eq!(db.bad.load(Ordering::Relaxed), 0);
    assert_eq!(da.resets.load(Ordering::Relaxed), 0);
}

/// A keyring file (mode 600) in a directory of its own (named for this test and its pid),
/// removed on drop.
struct Keyring(std::path::PathBuf);

impl Keyring {
    fn new(entity: &str, key: &str) -> Keyring {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("rdmx-mpath-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("keyring");
        std::fs::write(&f, format!("[{entity}]\n    key = {key}\n")).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        Keyring(f)
    }
    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for Keyring {
    fn drop(&mut self) {
        if let Some(d) = self.0.parent() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

#[test]
fn with_auth_the_joins_carry_the_sessions_mac_and_failover_works() {
    let _serial = support::serial();
    let k = Keyring::new(
        "client.mpath",
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
    );
    let ka = [
        ("auth_keyring", k.path()),
        ("auth_entity", "client.mpath".into()),
    ];
    let kb = [("auth_keyring", k.path()), ("auth_entity", "osd.0".into())];
    let ka: Vec<(&str, &str)> = ka.iter().map(|(a, b)| (*a, b.as_str())).collect();
    let kb: Vec<(&str, &str)> = kb.iter().map(|(a, b)| (*a, b.as_str())).collect();
    // Both paths joined: the accepting side verified path 1's MAC.
    let (a, b, da, db, s) = pair_with(Policy::Lossless, &ka, &kb);
    assert_eq!(b.stats().path_join_refusals, 0);
    send_range(&a, s, 1, 300);
    a.inject_fault(s, Fault::QpError).unwrap();
    send_range(&a, s, 300, 600);
    wait("delivery", || db.last.load(Ordering::Relaxed) == 599);
    // Path 0 rejoins (a MAC'd join again) and takes the traffic back.
    wait("the failback to path 0", || {
        let p = a.paths(s).unwrap();
        p[0].state == PathState::Active && p[1].state == PathState::Standby
    });
    assert_eq!(db.bad.load(Ordering::Relaxed), 0);
    assert_eq!(da.resets.load(Ordering::Relaxed), 0);
    assert_eq!(b.stats().path_join_refusals, 0);
    let sb = db.session.lock().unwrap().unwrap();
    assert_eq!(b.session_entity(sb).as_deref(), Some("client.mpath"));
}

/// An nftables table dropping UDP datagrams to one address and port (one path's traffic
/// towards the accepting side: the soft provider announces, per connection, the UDP
/// address of the side channel's local IP). Deleted on drop.
struct PathHole(String);

impl PathHole {
    fn new(ip: &str, port: u16) -> Result<PathHole, String> {
        let table = format!("rdmx_mpath_{}", std::process::id());
        let script = format!(
            "table ip {table} {{\n  chain output {{\n    type filter hook output priority -10; \
             policy accept;\n    ip daddr {ip} udp dport {port} drop\n  }}\n}}\n"
        );
        nft(&script)?;
        Ok(PathHole(table))
    }
}

impl Drop for PathHole {
    fn drop(&mut self) {
        if let Err(e) = nft(&format!("delete table ip {}\n", self.0)) {
            eprintln!("warning: removing {}: {e}", self.0);
        }
    }
}

fn nft(script: &str) -> Result<(), String> {
    use std::io::Write;
    let mut c = std::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft: {e}"))?;
    c.stdin
        .take()
        .ok_or("nft: no stdin")?
        .write_all(script.as_bytes())
        .map_err(|e| format!("nft: {e}"))?;
    let out = c.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[test]
fn a_black_hole_on_the_active_path_moves_the_session_and_the_path_rejoins() {
    let _serial = support::serial();
    let Some(()) = require::or_skip(support::nft_usable(), require::NFT, "a path's black hole")
    else {
        return;
    };
    let (a, b, da, db, s) = pair(Policy::Lossless);
    send_range(&a, s, 1, 300);
    wait("delivery before the hole", || {
        db.last.load(Ordering::Relaxed) == 299
    });
    let hole = PathHole::new("127.0.0.1", b.udp_port()).unwrap();
    // Traffic into the hole: RC retries run out on path 0 (timeout 12 x retry_cnt 3:
    // ~70 ms), the session moves to path 1, nothing is lost.
    send_range(&a, s, 300, 900);
    wait("the switch to path 1", || {
        let e = events(&da);
        e.contains(&(0, "down")) && e.contains(&(1, "active"))
    });
    wait("delivery through path 1", || {
        db.last.load(Ordering::Relaxed) == 899
    });
    let p = a.paths(s).unwrap();
    assert_eq!(p[1].state, PathState::Active, "{p:?}");
    eprintln!("path 0's fault under the hole: {:?}", p[0].last_fault);
    assert!(p[0].last_fault.is_some(), "{p:?}");
    drop(hole);
    // Path 0 answers again: it rejoins and takes the traffic back.
    wait("the failback to path 0", || {
        a.paths(s).unwrap()[0].state == PathState::Active
    });
    send_range(&a, s, 900, 1000);
    wait("delivery after the failback", || {
        db.last.load(Ordering::Relaxed) == 999 && da.ok.load(Ordering::Relaxed) == 999
    });
    assert_eq!(db.bad.load(Ordering::Relaxed), 0, "exactly once, in order");
    assert_eq!(db.delivered.load(Ordering::Relaxed), 999);
    assert_eq!(da.resets.load(Ordering::Relaxed), 0);
    assert_eq!(db.resets.load(Ordering::Relaxed), 0);
}

/// Messages each path carried, at the connecting side and at the accepting side.
fn path_msgs(a: &Messenger, s: SessionId, b: &Messenger, db: &Side) -> ([u64; 2], [u64; 2]) {
    let pa = a.paths(s).unwrap();
    let sb = db.session.lock().unwrap().unwrap();
    let pb = b.paths(sb).unwrap();
    let n = |p: &[rdmx::msgr::messenger::PathInfo], i: usize| {
        p.get(i).map_or(0, |x| x.counters.msgs_sent)
    };
    ([n(&pa, 0), n(&pa, 1)], [n(&pb, 0), n(&pb, 1)])
}

/// Replies from the accepting side: it sends `from..to` back on its session.
fn reply_range(b: &Messenger, db: &Side, from: u64, to: u64) {
    let sb = db.session.lock().unwrap().unwrap();
    send_range(b, sb, from, to);
}

#[test]
fn active_active_spreads_messages_on_both_paths_and_a_qp_error_loses_nothing() {
    let _serial = support::serial();
    let (a, b, da, db, s) = pair_policy(Policy::Lossless, PathPolicy::Active, &[], &[]);
    // Both directions, so that both sides' senders spread.
    send_range(&a, s, 1, 1000);
    reply_range(&b, &db, 1, 500);
    wait("delivery on both sides", || {
        db.last.load(Ordering::Relaxed) == 999 && da.last.load(Ordering::Relaxed) == 499
    });
    let (ma, mb) = path_msgs(&a, s, &b, &db);
    eprintln!("messages per path: connecting side {ma:?}, accepting side {mb:?}");
    assert!(ma.iter().all(|&n| n > 0), "both paths carry data: {ma:?}");
    assert!(mb.iter().all(|&n| n > 0), "both paths carry data: {mb:?}");
    // A QP error on a path with messages in flight on both.
    send_range(&a, s, 1000, 1500);
    a.inject_fault(s, Fault::QpError).unwrap();
    send_range(&a, s, 1500, 3000);
    wait("every message delivered and acknowledged", || {
        db.last.load(Ordering::Relaxed) == 2999 && da.ok.load(Ordering::Relaxed) == 2999
    });
    assert!(
        events(&da).iter().any(|e| e.1 == "down"),
        "{:?}",
        events(&da)
    );
    assert_eq!(db.bad.load(Ordering::Relaxed), 0, "exactly once, in order");
    assert_eq!(db.delivered.load(Ordering::Relaxed), 2999);
    assert_eq!(da.failed.load(Ordering::Relaxed), 0);
    assert_eq!(da.resets.load(Ordering::Relaxed), 0);
    assert_eq!(db.resets.load(Ordering::Relaxed), 0);
    let info = a.session_info(s).unwrap();
    assert_eq!(info.counters.reconnects, 0, "no new session, no reconnect");
    // The failed path rejoins and carries data again.
    wait("both paths active again", || {
        let p = a.paths(s).unwrap();
        p.iter().all(|x| x.state == PathState::Active)
    });
    let (before, _) = path_msgs(&a, s, &b, &db);
    send_range(&a, s, 3000, 3400);
    wait("delivery after the rejoin", || {
        db.last.load(Ordering::Relaxed) == 3399
    });
    let (after, _) = path_msgs(&a, s, &b, &db);
    assert!(
        after[0] > before[0] && after[1] > before[1],
        "both paths carry data after the rejoin: {before:?} -> {after:?}"
    );
    assert_eq!(db.bad.load(Ordering::Relaxed), 0);
}

#[test]
fn active_active_lossy_reports_in_doubt_and_delivers_in_order() {
    let _serial = support::serial();
    let (a, _b, da, db, s) = pair_policy(Policy::Lossy, PathPolicy::Active, &[], &[]);
    send_range(&a, s, 1, 500);
    a.inject_fault(s, Fault::QpError).unwrap();
    send_range(&a, s, 500, 1500);
    wait("every send completed", || {
        da.ok.load(Ordering::Relaxed) + da.in_doubt.load(Ordering::Relaxed) == 1499
    });
    wait("the last one delivered", || {
        db.last.load(Ordering::Relaxed) == 1499
    });
    eprintln!(
        "lossy: {} delivered, {} in doubt",
        db.delivered.load(Ordering::Relaxed),
        da.in_doubt.load(Ordering::Relaxed)
    );
    assert_eq!(db.bad.load(Ordering::Relaxed), 0, "at most once, in order");
    assert_eq!(
        da.failed.load(Ordering::Relaxed),
        0,
        "in doubt, or delivered"
    );
    assert_eq!(da.resets.load(Ordering::Relaxed), 0);
    assert_eq!(db.resets.load(Ordering::Relaxed), 0);
    // Everything acknowledged was delivered.
    assert!(db.delivered.load(Ordering::Relaxed) >= da.ok.load(Ordering::Relaxed));
    // Immediate messages have no place in the order across paths: refused at send.
    use rdmx::msgr::messenger::{OutMessage, Payload};
    let imm = OutMessage::immediate(7).with_write(Payload::Copy(vec![0; 8]), 0, 0);
    let e = a.send(s, imm).map(|_| ()).unwrap_err().error;
    assert_eq!(e.kind(), rdmx::error::ErrorKind::InvalidArgument, "{e}");
    assert!(e.message().contains("active/active"), "{e}");
}

#[test]
fn active_active_black_hole_of_one_path_loses_nothing() {
    let _serial = support::serial();
    let Some(()) = require::or_skip(support::nft_usable(), require::NFT, "a path's black hole")
    else {
        return;
    };
    let (a, b, da, db, s) = pair_policy(Policy::Lossless, PathPolicy::Active, &[], &[]);
    send_range(&a, s, 1, 300);
    wait("delivery before the hole", || {
        db.last.load(Ordering::Relaxed) == 299
    });
    let (ma, _) = path_msgs(&a, s, &b, &db);
    assert!(ma.iter().all(|&n| n > 0), "both paths carry data: {ma:?}");
    let hole = PathHole::new("127.0.0.1", b.udp_port()).unwrap();
    // Messages go on both paths into the hole: path 0's RC retries run out, what it
    // carried goes again on path 1, nothing is lost.
    send_range(&a, s, 300, 1500);
    wait("path 0 down", || events(&da).contains(&(0, "down")));
    wait("delivery through path 1", || {
        db.last.load(Ordering::Relaxed) == 1499
    });
    let p = a.paths(s).unwrap();
    eprintln!("path 0's fault under the hole: {:?}", p[0].last_fault);
    assert!(p[0].last_fault.is_some(), "{p:?}");
    drop(hole);
    wait("path 0 back", || {
        a.paths(s)
            .unwrap()
            .iter()
            .all(|x| x.state == PathState::Active)
    });
    send_range(&a, s, 1500, 2000);
    wait("delivery after the rejoin", || {
        db.last.load(Ordering::Relaxed) == 1999 && da.ok.load(Ordering::Relaxed) == 1999
    });
    assert_eq!(db.bad.load(Ordering::Relaxed), 0, "exactly once, in order");
    assert_eq!(db.delivered.load(Ordering::Relaxed), 1999);
    assert_eq!(da.failed.load(Ordering::Relaxed), 0);
    assert_eq!(da.resets.load(Ordering::Relaxed), 0);
    assert_eq!(db.resets.load(Ordering::Relaxed), 0);
}

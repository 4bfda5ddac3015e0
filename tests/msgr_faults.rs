//! Fault injection the way Ceph's test_msgr injects socket failures: two messengers
//! exchange numbered messages both ways (front = sequence number + checksum, 4 KiB data)
//! while faults hit at random every 50-200 ms: the side channel closed, a QP forced to
//! error, a UDP black hole longer than the retry budget (where nftables is usable).
//! Lossless: every message delivered exactly once, in order, content verified, at least one
//! reconnect, pools back to baseline. Lossy: resets reported, failed sends completed, no hang.
//! `MSGR_FAULT_MESSAGES` (default 20,000 each way; 100000 for the full run) sets the count.

use rdmx::error::ErrorKind;
use rdmx::msgr::messenger::{Dispatcher, Fault, InMessage, Messenger, Policy, SessionId};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod require;
mod support;
use support::msgr_faults::{config, fnv, message, page, rand};

#[derive(Default)]
struct Side {
    connects: AtomicU64,
    next: AtomicU64,
    bad: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    resets: AtomicU64,
    /// Probes (seq `PROBE`) delivered: the lossy test sends them after injecting a fault.
    probes: AtomicU64,
    session: Mutex<Option<SessionId>>,
}

/// Sequence number of the lossy test's probes. A probe sent after the fault is injected
/// but before the connection notices it (a closed side channel is seen by the provider's
/// next look at it; the QP carries traffic until then) is delivered like any message:
/// whole, and after every numbered message of its round. Far above any count the lossless
/// test sends.
const PROBE: u64 = 1 << 40;

impl Dispatcher for Side {
    fn on_connect(&self, _m: &Messenger, s: SessionId, _p: std::net::SocketAddr, _i: bool) {
        *self.session.lock().unwrap() = Some(s);
        self.connects.fetch_add(1, Ordering::Relaxed);
    }
    fn on_message(&self, _m: &Messenger, _s: SessionId, msg: InMessage) {
        let seq = u64::from_le_bytes(msg.front[..8].try_into().unwrap());
        let sum = u64::from_le_bytes(msg.front[8..16].try_into().unwrap());
        let want = self.next.load(Ordering::Relaxed) + 1;
        let data = msg.data[0].to_vec();
        if seq == PROBE && fnv(&data) == sum && data == page(seq) {
            self.probes.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.probes.load(Ordering::Relaxed) > 0
            || seq != want
            || fnv(&data) != sum
            || data != page(seq)
        {
            eprintln!("bad message: seq {seq}, expected {want}");
            self.bad.fetch_add(1, Ordering::Relaxed);
        }
        self.next.store(seq, Ordering::Relaxed);
    }
    fn on_send_complete(
        &self,
        _m: &Messenger,
        _s: SessionId,
        _id: u64,
        r: rdmx::error::Result<()>,
    ) {
        if r.is_ok() {
            self.ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn on_reset(&self, _m: &Messenger, _s: SessionId, why: &rdmx::Error) {
        eprintln!("reset: {why}");
        self.resets.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn lossless_exactly_once_in_order_under_injected_faults() {
    let n: u64 = std::env::var("MSGR_FAULT_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let _serial = support::serial();
    let (da, db) = (Arc::new(Side::default()), Arc::new(Side::default()));
    let a = Messenger::new(&config(&[]), da.clone()).unwrap();
    let b = Messenger::new(&config(&[]), db.clone()).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let base = (
        a.stats().data_pool.chunks_in_use,
        b.stats().data_pool.chunks_in_use,
    );
    let sa = a.connect(&addr.to_string(), Policy::Lossless).unwrap();
    let start = Instant::now();
    let limit = Duration::from_secs(30 + n / 100);
    while db.session.lock().unwrap().is_none() {
        assert!(start.elapsed() < limit);
        std::thread::sleep(Duration::from_millis(1));
    }
    let sb = db.session.lock().unwrap().unwrap();
    let black_hole =
        require::or_skip(support::nft_usable(), require::NFT, "the UDP black holes").is_some();
    let ports = [a.udp_port(), b.udp_port()];
    let mut rng = 0x1234_5678_9abc_def1u64 ^ u64::from(std::process::id());
    let mut next_fault = Instant::now() + Duration::from_millis(50 + rand(&mut rng) % 150);
    let (mut sent_a, mut sent_b, mut faults) = (0u64, 0u64, [0u32; 3]);
    let mut hole: Option<(support::UdpBlackHole, Instant)> = None;
    loop {
        assert!(
            start.elapsed() < limit,
            "stuck: a sent {sent_a} b got {}, b sent {sent_b} a got {}; a {:?} b {:?}",
            db.next.load(Ordering::Relaxed),
            da.next.load(Ordering::Relaxed),
            a.session_info(sa)
                .map(|i| (i.state, i.queued, i.unacked, i.counters)),
            b.session_info(sb)
                .map(|i| (i.state, i.queued, i.unacked, i.counters)),
        );
        let mut progressed = false;
        for (m, s, sent) in [(&a, sa, &mut sent_a), (&b, sb, &mut sent_b)] {
            while *sent < n {
                match m.send(s, message(*sent + 1)) {
                    Ok(_) => {
                        *sent += 1;
                        progressed = true;
                    }
                    Err(r) if r.kind() == ErrorKind::Full => break,
                    Err(r) => panic!("send: {r}"),
                }
            }
        }
        if hole
            .as_ref()
            .is_some_and(|(_, until)| Instant::now() >= *until)
        {
            hole = None;
        }
        let all_done = da.next.load(Ordering::Relaxed) == n
            && db.next.load(Ordering::Relaxed) == n
            && da.ok.load(Ordering::Relaxed) == n
            && db.ok.load(Ordering::Relaxed) == n;
        if all_done {
            break;
        }
        if Instant::now() >= next_fault && hole.is_none() {
            let kinds = if black_hole { 3 } else { 2 };
            let kind = (faults.iter().sum::<u32>() % kinds) as u64;
            let who = if rand(&mut rng) % 2 == 0 {
                (&a, sa)
            } else {
                (&b, sb)
            };
            match kind {
                0 => {
                    let _ = who.0.inject_fault(who.1, Fault::SideChannelClose);
                }
                1 => {
                    let _ = who.0.inject_fault(who.1, Fault::QpError);
                }
                _ => {
                    let h = support::UdpBlackHole::ports(&ports).unwrap();
                    hole = Some((h, Instant::now() + Duration::from_millis(150)));
                }
            }
            faults[kind as usize] += 1;
            next_fault = Instant::now() + Duration::from_millis(50 + rand(&mut rng) % 150);
        }
        if !progressed {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    drop(hole);
    let (ia, ib) = (a.session_info(sa).unwrap(), b.session_info(sb).unwrap());
    println!(
        "{n} messages each way in {:.2} s; faults injected: side channel {} / QP error {} / \
         black hole {}; a: {:?}; b: {:?}",
        start.elapsed().as_secs_f64(),
        faults[0],
        faults[1],
        faults[2],
        ia.counters,
        ib.counters
    );
    assert_eq!(
        da.bad.load(Ordering::Relaxed) + db.bad.load(Ordering::Relaxed),
        0
    );
    assert_eq!(
        da.failed.load(Ordering::Relaxed) + db.failed.load(Ordering::Relaxed),
        0
    );
    assert_eq!(
        da.resets.load(Ordering::Relaxed) + db.resets.load(Ordering::Relaxed),
        0
    );
    assert!(ia.counters.reconnects > 0, "no reconnect happened");
    assert_eq!(a.stats().missed_wakes + b.stats().missed_wakes, 0);
    // The accepting side counts the reconnects whose hello reached it (an attempt can die
    // in a black hole after its TCP setup).
    assert!(ib.counters.reconnects >= 1 && ib.counters.reconnects <= ia.counters.reconnects);
    // Pools back to baseline once the session is gone.
    a.close_session(sa).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    // (b's session goes at once when the bye arrives; when a closed it mid-reconnect, b
    // keeps an empty session until its reconnect timeout: it holds no chunk.)
    while !(a.stats().data_pool.chunks_in_use == base.0
        && b.stats().data_pool.chunks_in_use == base.1)
    {
        assert!(
            Instant::now() < end,
            "pools not back: a {:?} b {:?}",
            a.stats(),
            b.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(a.stats().header_pool.chunks_in_use, 0);
    assert_eq!(
        b.stats().copy_chunks_in_use + a.stats().copy_chunks_in_use,
        0
    );
}

#[test]
fn lossy_faults_reset_and_fail_sends_without_hanging() {
    let _serial = support::serial();
    let (da, db) = (Arc::new(Side::default()), Arc::new(Side::default()));
    let a = Messenger::new(&config(&[("msgr_policy", "lossy")]), da.clone()).unwrap();
    let b = Messenger::new(&config(&[]), db.clone()).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let start = Instant::now();
    let mut probes = 0;
    for round in 0..3u64 {
        let s = a.connect(&addr.to_string(), Policy::Lossy).unwrap();
        for d in [&da, &db] {
            d.next.store(0, Ordering::Relaxed);
            d.probes.store(0, Ordering::Relaxed);
        }
        let mut sent = 0;
        while sent < 200 {
            match a.send(s, message(sent + 1)) {
                Ok(_) => sent += 1,
                Err(r) if r.kind() == ErrorKind::Full => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(r) => panic!("{r}"),
            }
        }
        // The fault comes once both sides hold the session (before that, b has no session
        // to reset: a link that dies before its hello is just dropped).
        while db.connects.load(Ordering::Relaxed) <= round {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "b never connected"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let fault = if round % 2 == 0 {
            Fault::SideChannelClose
        } else {
            Fault::QpError
        };
        while a.inject_fault(s, fault).is_err() {
            assert!(start.elapsed() < Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(1));
        }
        // Sends after the fault are refused or fail; nothing hangs.
        while da.resets.load(Ordering::Relaxed) <= round {
            assert!(start.elapsed() < Duration::from_secs(20), "no reset on a");
            let _ = a.send(s, message(PROBE));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            a.send(s, message(1))
                .is_err_and(|r| r.kind() == ErrorKind::Closed)
        );
        while db.resets.load(Ordering::Relaxed) <= round {
            assert!(start.elapsed() < Duration::from_secs(20), "no reset on b");
            std::thread::sleep(Duration::from_millis(1));
        }
        // A delivered probe went on the same QP after the 200: all of them came first.
        if db.probes.load(Ordering::Relaxed) > 0 {
            assert_eq!(db.next.load(Ordering::Relaxed), 200);
        }
        probes += db.probes.load(Ordering::Relaxed);
    }
    let done = da.ok.load(Ordering::Relaxed) + da.failed.load(Ordering::Relaxed);
    println!(
        "lossy: {} resets on a, {} on b; sends ok {} failed {}; probes delivered {probes}",
        da.resets.load(Ordering::Relaxed),
        db.resets.load(Ordering::Relaxed),
        da.ok.load(Ordering::Relaxed),
        da.failed.load(Ordering::Relaxed)
    );
    assert_eq!(db.bad.load(Ordering::Relaxed), 0);
    // Every accepted send completed, one way or the other (the sends refused with
    // Closed are not counted).
    assert!(done >= 600);
    assert!(a.sessions().is_empty() && b.sessions().is_empty());
}

/// Threads of this process whose name starts with `prefix` (the kernel keeps 15 bytes).
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("comm"))
                        .is_ok_and(|c| c.trim_end().starts_with(prefix))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Dropping a messenger whose lossless session is reconnecting ends the attempt too: its
/// helper thread, blocked in a handshake with a peer that accepted the TCP connection and
/// never answers, is cancelled and joined, instead of holding the messenger's context,
/// pools and provider thread until its handshake times out (10 s).
#[test]
fn drop_during_a_reconnect_ends_the_attempt() {
    let _serial = support::serial();
    let a = Messenger::new(&config(&[]), Arc::new(Side::default())).unwrap();
    let addr = a.listen("127.0.0.1:0").unwrap();
    let side = Arc::new(Side::default());
    let b = Messenger::new(
        &config(&[("msgr_reconnect_timeout_ms", "30000")]),
        Arc::clone(&side) as Arc<dyn Dispatcher>,
    )
    .unwrap();
    let s = b.connect(&addr.to_string(), Policy::Lossless).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while side.connects.load(Ordering::Relaxed) == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(side.connects.load(Ordering::Relaxed), 1, "connected");
    let before = threads_named("rdmx-msgr-conne");
    // The peer goes; a TCP listener that never answers takes its port: each reconnect's
    // handshake blocks.
    drop(a);
    let mute = std::net::TcpListener::bind(addr).expect("rebind the port");
    let end = Instant::now() + Duration::from_secs(10);
    while threads_named("rdmx-msgr-conne") <= before && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        threads_named("rdmx-msgr-conne") > before,
        "a reconnect attempt is running (session {:?})",
        b.session_info(s).map(|i| i.state)
    );
    std::thread::sleep(Duration::from_millis(100)); // into its handshake
    let t = Instant::now();
    drop(b);
    let dropped_in = t.elapsed();
    let end = Instant::now() + Duration::from_secs(5);
    while threads_named("rdmx-msgr-conne") > before && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    let gone_in = t.elapsed();
    drop(mute);
    assert_eq!(
        threads_named("rdmx-msgr-conne"),
        before,
        "the attempt's thread is gone after the drop (waited {gone_in:?})"
    );
    assert!(
        dropped_in < Duration::from_secs(2),
        "the drop waited {dropped_in:?} for the attempt"
    );
}

//! Credit flow control: a sender bursts messages at a receiver that consumes slowly. No RNR
//! NAK ever (credits: a sender never goes beyond the receives posted for it), every
//! message arrives in order, the sender gets `Full` at its bound instead of growing, and
//! both sides' memory stays under the configured bounds.
//! `MSGR_BURST_MESSAGES` (default 100000) sets the count.

use rdmx::config::Config;
use rdmx::error::ErrorKind;
use rdmx::msgr::Policy;
use rdmx::msgr::messenger::{Dispatcher, InMessage, Messenger, OutMessage, Payload, SessionId};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Slow {
    next: AtomicU64,
    bad: AtomicU64,
    held: Mutex<Vec<InMessage>>,
    ready: AtomicU64,
    done: AtomicU64,
}

impl Dispatcher for Slow {
    fn on_message(&self, _m: &Messenger, _s: SessionId, msg: InMessage) {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let seq = u64::from_le_bytes(msg.front[..8].try_into().unwrap());
        if seq != n || msg.data.first().map(|d| d.as_slice().unwrap()[0]) != Some(seq as u8) {
            self.bad.fetch_add(1, Ordering::Relaxed);
        }
        // A slow consumer: it keeps the last few messages' chunks for a while and
        // sleeps now and then.
        let mut h = self.held.lock().unwrap();
        h.push(msg);
        if h.len() > 64 {
            h.drain(..32);
        }
        if n % 512 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    fn on_send_complete(
        &self,
        _m: &Messenger,
        _s: SessionId,
        _id: u64,
        r: rdmx::error::Result<()>,
    ) {
        assert!(r.is_ok());
        self.done.fetch_add(1, Ordering::Relaxed);
    }
    fn on_send_ready(&self, _m: &Messenger, _s: SessionId) {
        self.ready.fetch_add(1, Ordering::Relaxed);
    }
}

fn config(kv: &[(&str, &str)]) -> Config {
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    for (k, v) in kv {
        c.set(k, v).unwrap();
    }
    c
}

#[test]
fn a_burst_at_a_slow_consumer_never_rnrs_and_stays_bounded() {
    let total: u64 = std::env::var("MSGR_BURST_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let (qmsgs, qbytes) = (512u64, 1u64 << 20);
    let kv = [
        ("msgr_send_queue_msgs", "512"),
        ("msgr_send_queue_bytes", "1048576"),
        ("msgr_pool_chunks", "4096"),
        ("msgr_recv_window", "32"),
        ("msgr_threads", "1"),
    ];
    let (da, db) = (Arc::new(Slow::default()), Arc::new(Slow::default()));
    let a = Messenger::new(&config(&kv), da.clone()).unwrap();
    let b = Messenger::new(&config(&kv), db.clone()).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let s = a.connect(&addr.to_string(), Policy::Lossless).unwrap();
    let start = Instant::now();
    let (mut sent, mut full, mut max_held, mut max_pool) = (0u64, 0u64, 0usize, 0u32);
    while sent < total {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "stuck at {sent}"
        );
        let mut c = a.alloc_chunk().unwrap();
        c.as_mut_slice()[0] = (sent + 1) as u8;
        c.set_len(64);
        let msg = OutMessage::new(1, (sent + 1).to_le_bytes().to_vec()).with(Payload::Chunk(c));
        match a.send(s, msg) {
            Ok(_) => sent += 1,
            Err(r) if r.kind() == ErrorKind::Full => {
                full += 1;
                let i = a.session_info(s).unwrap();
                max_held = max_held.max(i.queued + i.unacked);
                max_pool = max_pool.max(a.stats().data_pool.chunks_in_use);
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(r) => panic!("send: {r}"),
        }
    }
    while db.next.load(Ordering::Relaxed) < total || da.done.load(Ordering::Relaxed) < total {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "not all arrived"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let secs = start.elapsed().as_secs_f64();
    let ia = a.session_info(s).unwrap();
    let sb = b.sessions()[0];
    let ib = b.session_info(sb).unwrap();
    let (pa, pb) = (a.stats().data_pool, b.stats().data_pool);
    println!(
        "{total} messages in {secs:.2} s ({:.0}/s); sender Full {full} times, held at most \
         {max_held} (bound {qmsgs} msgs / {qbytes} B), data pool at most {max_pool} chunks; \
         credit stalls {}; window {}; rnr a {} b {}; pools a {pa} b {pb}",
        total as f64 / secs,
        ia.counters.credit_stalls,
        ib.recv_window,
        ia.counters.rnr_naks,
        ib.counters.rnr_naks
    );
    assert_eq!(db.bad.load(Ordering::Relaxed), 0);
    assert_eq!(ia.counters.rnr_naks + ib.counters.rnr_naks, 0);
    assert!(full > 0, "the bound was never reached: not a burst");
    assert!(max_held <= qmsgs as usize);
    assert!(
        da.ready.load(Ordering::Relaxed) > 0,
        "on_send_ready after Full"
    );
    assert!(pa.chunks_total <= 4096 && pb.chunks_total <= 4096);
}

/// Counts messages in order; nothing held.
#[derive(Default)]
struct Counter {
    next: AtomicU64,
    bad: AtomicU64,
    resets: AtomicU64,
}

impl Dispatcher for Counter {
    fn on_message(&self, _m: &Messenger, _s: SessionId, msg: InMessage) {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        if u64::from_le_bytes(msg.front[..8].try_into().unwrap()) != n {
            self.bad.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn on_reset(&self, _m: &Messenger, _s: SessionId, _e: &rdmx::error::Error) {
        self.resets.fetch_add(1, Ordering::Relaxed);
    }
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(30), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `Messenger::pause_receive`: the paused side gets at most the credits its peer already
/// held, the peer's sends back up to `Full` in its own queue, keepalives keep the session
/// open however long the pause, and a resume delivers everything in order.
#[test]
fn a_paused_receiver_stalls_its_sender_and_resumes() {
    let window = 32u64;
    let kv = [
        ("msgr_send_queue_msgs", "64"),
        ("msgr_recv_window", "32"),
        ("msgr_keepalive_ms", "50"),
        ("msgr_keepalive_timeout_ms", "400"),
        ("msgr_threads", "1"),
    ];
    let (da, db) = (Arc::new(Counter::default()), Arc::new(Counter::default()));
    let a = Messenger::new(&config(&kv), da.clone()).unwrap();
    let b = Messenger::new(&config(&kv), db.clone()).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let s = a.connect(&addr.to_string(), Policy::Lossless).unwrap();
    let msg = |n: u64| OutMessage::new(1, n.to_le_bytes().to_vec());
    a.send(s, msg(1)).unwrap();
    wait_for("first message", || db.next.load(Ordering::Relaxed) == 1);
    let sb = b.sessions()[0];
    b.pause_receive(sb, true).unwrap();
    b.pause_receive(sb, true).unwrap(); // idempotent
    assert!(b.session_info(sb).unwrap().recv_paused);
    // Send until the sender's own queue is full.
    let mut sent = 1u64;
    let t0 = Instant::now();
    loop {
        assert!(t0.elapsed() < Duration::from_secs(30), "never Full");
        match a.send(s, msg(sent + 1)) {
            Ok(_) => sent += 1,
            Err(r) if r.kind() == ErrorKind::Full => break,
            Err(r) => panic!("send: {r}"),
        }
    }
    // Let keepalives run for many intervals (past the keepalive timeout several times):
    // the session stays open and the paused side gets no more than the peer's credits.
    std::thread::sleep(Duration::from_millis(1500));
    let got = db.next.load(Ordering::Relaxed);
    let (ia, ib) = (a.session_info(s).unwrap(), b.session_info(sb).unwrap());
    println!(
        "paused: sent {sent}, delivered {got}, sender queued {} unacked {}, b window {}",
        ia.queued, ia.unacked, ib.recv_window
    );
    assert!(
        got <= 1 + window,
        "{got} delivered while paused (at most the {window} credits held)"
    );
    assert!(sent > got + 16, "the sender's queue took the rest");
    assert_eq!(ib.state, rdmx::msgr::messenger::SessionState::Open);
    assert_eq!(
        da.resets.load(Ordering::Relaxed) + db.resets.load(Ordering::Relaxed),
        0
    );
    b.pause_receive(sb, false).unwrap();
    assert!(!b.session_info(sb).unwrap().recv_paused);
    wait_for("everything after the resume", || {
        db.next.load(Ordering::Relaxed) == sent
    });
    assert_eq!(db.bad.load(Ordering::Relaxed), 0, "in order, exactly once");
    assert!(matches!(
        b.pause_receive(rdmx::msgr::messenger::SessionId(12345), true),
        Err(e) if e.kind() == ErrorKind::Closed
    ));
}

//! 1,000 idle sessions to one server: they all open, stay open with keepalives, and the
//! memory per idle session (RSS growth, excluding the pools' shared buffers) is printed
//! against the 64 KiB target. `MSGR_IDLE_SESSIONS` sets the count.

use rdmx::config::Config;
use rdmx::msgr::Policy;
use rdmx::msgr::messenger::{Dispatcher, InMessage, Messenger, SessionId};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Count {
    connected: AtomicU64,
    resets: AtomicU64,
}

impl Dispatcher for Count {
    fn on_connect(&self, _m: &Messenger, _s: SessionId, _p: std::net::SocketAddr, _i: bool) {
        self.connected.fetch_add(1, Ordering::Relaxed);
    }
    fn on_message(&self, _m: &Messenger, _s: SessionId, _msg: InMessage) {}
    fn on_reset(&self, _m: &Messenger, _s: SessionId, _why: &rdmx::Error) {
        self.resets.fetch_add(1, Ordering::Relaxed);
    }
}

fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let l = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
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
fn a_thousand_idle_sessions_to_one_server() {
    let n: u64 = std::env::var("MSGR_IDLE_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let kv = [
        ("msgr_threads", "1"),
        ("msgr_keepalive_ms", "200"),
        ("msgr_keepalive_timeout_ms", "30000"),
        ("max_send_wr", "64"),
        ("max_recv_wr", "64"),
    ];
    let (dc, ds) = (Arc::new(Count::default()), Arc::new(Count::default()));
    let client = Messenger::new(&config(&kv), dc.clone()).unwrap();
    let server = Messenger::new(&config(&kv), ds.clone()).unwrap();
    let addr = server.listen("127.0.0.1:0").unwrap().to_string();
    let pools = |m: &Messenger| {
        let s = m.stats();
        (s.data_pool.bytes_mapped + s.header_pool.bytes_mapped) as u64
    };
    let (rss0, pools0) = (rss(), pools(&client) + pools(&server));
    let start = Instant::now();
    for _ in 0..n {
        client.connect(&addr, Policy::Lossless).unwrap();
        // A few at a time: each connect is a TCP handshake on a helper thread.
        while dc.connected.load(Ordering::Relaxed) + 32 < client.sessions().len() as u64 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    while dc.connected.load(Ordering::Relaxed) < n || ds.connected.load(Ordering::Relaxed) < n {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "only {} up",
            dc.connected.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let up = start.elapsed();
    // Idle for a few keepalive rounds.
    std::thread::sleep(Duration::from_millis(1000));
    let (rss1, pools1) = (rss(), pools(&client) + pools(&server));
    let grown = rss1.saturating_sub(rss0);
    let shared = pools1.saturating_sub(pools0);
    let per = grown.saturating_sub(shared) as f64 / (2 * n) as f64;
    let st = client.stats();
    let ss = server.stats();
    println!(
        "parked: client {} server {} of {n}; missed wakes {} / {}; server keepalives {}",
        n as usize - st.active_sessions,
        n as usize - ss.active_sessions,
        st.missed_wakes,
        ss.missed_wakes,
        ss.totals.keepalives_sent
    );
    println!(
        "{n} sessions up in {:.2} s; RSS +{} KiB, pools' shared buffers +{} KiB; per idle \
         session endpoint excluding shared buffers: {:.1} KiB (target <= 64 KiB); including \
         them: {:.1} KiB; keepalives sent {}; client data chunks in use {}",
        up.as_secs_f64(),
        grown >> 10,
        shared >> 10,
        per / 1024.0,
        grown as f64 / (2 * n) as f64 / 1024.0,
        st.totals.keepalives_sent,
        st.data_pool.chunks_in_use
    );
    assert_eq!(
        dc.resets.load(Ordering::Relaxed) + ds.resets.load(Ordering::Relaxed),
        0
    );
    assert_eq!(server.sessions().len() as u64, n);
    // Parked sessions still keep alive (their keepalive times wake them): a second of
    // 200 ms keepalives is several per session on the side that hears nothing else.
    assert!(
        st.totals.keepalives_sent + ss.totals.keepalives_sent >= 2 * n,
        "keepalives: client {} server {}",
        st.totals.keepalives_sent,
        ss.totals.keepalives_sent
    );
    assert_eq!(st.missed_wakes + ss.missed_wakes, 0);
}

//! Measurement (ignored by default; run with `--ignored --nocapture`): one-way message
//! rate through the messenger for 4K/8K/16K/64K data, 4K both eager (SEND into the posted
//! chunk) and rendezvous (RDMA READ by the receiver), so docs/messenger.md can say where
//! the switch belongs. Worker threads on both sides, 32 outstanding.

use rdmx::config::Config;
use rdmx::error::ErrorKind;
use rdmx::msgr::Policy;
use rdmx::msgr::messenger::{Dispatcher, InMessage, Messenger, OutMessage, Payload, SessionId};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Sink {
    got: AtomicU64,
}

impl Dispatcher for Sink {
    fn on_message(&self, _m: &Messenger, _s: SessionId, _msg: InMessage) {
        self.got.fetch_add(1, Ordering::Relaxed);
    }
}

fn run(size: usize, eager_max: &str) -> f64 {
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    c.set("msgr_threads", "1").unwrap();
    c.set("msgr_eager_max", eager_max).unwrap();
    c.set("msgr_send_queue_msgs", "32").unwrap();
    let (da, db) = (Arc::new(Sink::default()), Arc::new(Sink::default()));
    let a = Messenger::new(&c, da).unwrap();
    let b = Messenger::new(&c, db.clone()).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let s = a.connect(&addr.to_string(), Policy::Lossless).unwrap();
    let buf = vec![7u8; size];
    let mut sent = 0u64;
    let mut start = None;
    let dur = Duration::from_secs(2);
    loop {
        // SAFETY: `buf` lives until the end of this function and is never modified.
        let p = unsafe { Payload::registered(buf.as_ptr(), buf.len()) };
        match a.send(s, OutMessage::new(1, vec![0; 16]).with(p)) {
            Ok(_) => sent += 1,
            Err(r) if r.kind() == ErrorKind::Full => std::thread::sleep(Duration::from_micros(20)),
            Err(r) => panic!("{r}"),
        }
        if sent == 1000 && start.is_none() {
            start = Some((Instant::now(), db.got.load(Ordering::Relaxed)));
        }
        if let Some((t, g)) = start
            && t.elapsed() >= dur
        {
            let n = db.got.load(Ordering::Relaxed) - g;
            return n as f64 / t.elapsed().as_secs_f64();
        }
    }
}

#[test]
#[ignore]
fn eager_versus_read_by_size() {
    for (size, eager) in [
        (4096, "4096"),
        (4096, "0"),
        (8192, "4096"),
        (16384, "4096"),
        (65536, "4096"),
    ] {
        let rate = run(size, eager);
        println!(
            "size {size:>6} {}: {rate:>8.0} msg/s, {:>7.1} MB/s",
            if size <= eager.parse().unwrap() {
                "eager"
            } else {
                "READ "
            },
            rate * size as f64 / 1e6
        );
    }
}

//! Large messages through the messenger (issue 27): 1 MiB messages at depth 32 and 128,
//! 16 MiB segments, messages of the largest size the settings allow, content checked.

use rdmx::config::Config;
use rdmx::msgr::messenger::{
    Dispatcher, InMessage, Messenger, OutMessage, Payload, Policy, SessionId,
};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Log {
    msgs: Mutex<Vec<(SessionId, InMessage)>>,
    done: Mutex<Vec<(u64, bool)>>,
    resets: Mutex<Vec<String>>,
    connected: Mutex<Vec<SessionId>>,
}

impl Dispatcher for Log {
    fn on_connect(&self, _m: &Messenger, s: SessionId, _p: std::net::SocketAddr, _i: bool) {
        self.connected.lock().unwrap().push(s);
    }
    fn on_message(&self, _m: &Messenger, s: SessionId, msg: InMessage) {
        self.msgs.lock().unwrap().push((s, msg));
    }
    fn on_send_complete(&self, _m: &Messenger, _s: SessionId, id: u64, r: rdmx::error::Result<()>) {
        self.done.lock().unwrap().push((id, r.is_ok()));
    }
    fn on_reset(&self, _m: &Messenger, _s: SessionId, e: &rdmx::error::Error) {
        self.resets.lock().unwrap().push(e.to_string());
    }
}

fn config(kv: &[(&str, &str)]) -> Config {
    rdmx::logging::init();
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    c.set("timeout", "17").unwrap();
    for (k, v) in kv {
        c.set(k, v).unwrap();
    }
    c
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Sends `n` messages of `segs` segments of `len` bytes from a to b, `depth` at most
/// unacknowledged, and checks every byte.
fn stream(kv: &[(&str, &str)], n: usize, depth: usize, segs: usize, len: usize, registered: bool) {
    let la = Arc::new(Log::default());
    let lb = Arc::new(Log::default());
    let a = Messenger::new(&config(kv), la.clone()).unwrap();
    let b = Messenger::new(&config(kv), lb.clone()).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let s = a.connect(&addr.to_string(), Policy::Lossless).unwrap();
    let bufs: Vec<Vec<u8>> = (0..depth.min(n) * segs)
        .map(|i| pattern(i as u64 + 1, len))
        .collect();
    let end = Instant::now() + Duration::from_secs(60);
    let mut sent = 0;
    let mut checked = 0;
    while checked < n {
        assert!(
            Instant::now() < end,
            "timed out: sent {sent}, checked {checked}: a {:?} b {:?} pools a {} b {}",
            a.session_info(s).map(|i| i.counters),
            b.sessions().first().map(|&t| b
                .session_info(t)
                .map(|i| (i.counters, i.queued, i.unacked, i.credits))),
            a.stats().data_pool,
            b.stats().data_pool,
        );
        assert!(
            la.resets.lock().unwrap().is_empty() && lb.resets.lock().unwrap().is_empty(),
            "session reset: {:?} {:?}",
            la.resets.lock().unwrap(),
            lb.resets.lock().unwrap()
        );
        let done = la.done.lock().unwrap().len();
        assert!(la.done.lock().unwrap().iter().all(|d| d.1), "a send failed");
        while sent < n && sent - done < depth {
            let mut msg = OutMessage::new(1, (sent as u64).to_le_bytes().to_vec());
            for k in 0..segs {
                let b = &bufs[(sent % depth) * segs + k];
                msg.data.push(if registered {
                    // SAFETY: `bufs` lives until the end and is not modified.
                    unsafe { Payload::registered(b.as_ptr(), b.len()) }
                } else {
                    Payload::Copy(b.clone())
                });
            }
            match a.send(s, msg) {
                Ok(_) => sent += 1,
                Err(r) if r.kind() == rdmx::error::ErrorKind::Full => break,
                Err(r) => panic!("send: {r}"),
            }
        }
        a.poll(Duration::ZERO).unwrap();
        b.poll(Duration::from_micros(100)).unwrap();
        let got = std::mem::take(&mut *lb.msgs.lock().unwrap());
        for (_, m) in got {
            let i = u64::from_le_bytes(m.front[..8].try_into().unwrap()) as usize;
            assert_eq!(i, checked, "in order");
            assert_eq!(m.data.len(), segs);
            for (k, seg) in m.data.iter().enumerate() {
                assert!(
                    seg.to_vec() == bufs[(i % depth) * segs + k],
                    "data of {i}/{k}"
                );
            }
            checked += 1;
        }
    }
}

#[test]
fn one_mib_at_depth_32() {
    stream(&[], 96, 32, 1, 1 << 20, true);
}

#[test]
fn one_mib_at_depth_128() {
    stream(&[], 256, 128, 1, 1 << 20, true);
}

#[test]
fn sixteen_mib_segment() {
    stream(&[], 3, 1, 1, 16 << 20, true);
}

#[test]
fn almost_sixteen_mib_segment() {
    stream(&[], 3, 1, 1, 16320 << 10, true);
}

//! Large messages through the messenger (issue 27), two messengers in one process driven by
//! the caller: 1 MiB messages kept 32 and 128 deep, 16 MiB segments and messages of the
//! largest size the limits allow (`msgr_max_message_bytes`, `msgr_max_segments`), content
//! checked; posts the send queue takes only part of, resumed; sends over the limits
//! refused, and a peer's message over this side's limits refused before anything is
//! allocated for it (counted, the session ended). Every wait is bounded. The depth, 16 MiB
//! and partial-post cases run again on the verbs provider under `rdmx-ibv exec` (whose
//! QP counts its send queue itself).

use rdmx::config::Config;
use rdmx::error::ErrorKind;
use rdmx::msgr::messenger::{
    Dispatcher, Fault, InMessage, Messenger, OutMessage, Payload, Policy, SessionId,
};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod support;

const MIB: usize = 1 << 20;

#[derive(Default)]
struct Log {
    msgs: Mutex<Vec<(SessionId, InMessage)>>,
    done: Mutex<Vec<(u64, Result<(), ErrorKind>)>>,
    resets: Mutex<Vec<(SessionId, String)>>,
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
        self.done
            .lock()
            .unwrap()
            .push((id, r.map_err(|e| e.kind())));
    }
    fn on_reset(&self, _m: &Messenger, s: SessionId, e: &rdmx::error::Error) {
        self.resets.lock().unwrap().push((s, e.to_string()));
    }
}

/// The transport's retry budget raised as in tests/blk.rs (a busy 2-core host must not
/// turn into RETRY_EXC_ERR: these tests check data, not timers).
fn config(kv: &[(&str, &str)]) -> Config {
    rdmx::logging::init();
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    c.set("timeout", "17").unwrap();
    support::apply_provider(&mut c);
    for (k, v) in kv {
        c.set(k, v).unwrap();
    }
    c
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Two messengers (a connects to b) with their logs; a's session.
struct Pair {
    a: Messenger,
    b: Messenger,
    la: Arc<Log>,
    lb: Arc<Log>,
    s: SessionId,
}

impl Pair {
    fn new(ka: &[(&str, &str)], kb: &[(&str, &str)]) -> Pair {
        Pair::new_with(ka, kb, |_| {})
    }

    /// As `new`, with `before(b)` run before b listens.
    fn new_with(ka: &[(&str, &str)], kb: &[(&str, &str)], before: impl Fn(&Messenger)) -> Pair {
        let la = Arc::new(Log::default());
        let lb = Arc::new(Log::default());
        let a = Messenger::new(&config(ka), la.clone()).unwrap();
        let b = Messenger::new(&config(kb), lb.clone()).unwrap();
        before(&b);
        let addr = b.listen("127.0.0.1:0").unwrap();
        let s = a.connect(&addr.to_string(), Policy::Lossless).unwrap();
        let p = Pair { a, b, la, lb, s };
        p.drive("connect", |p| !p.lb.connected.lock().unwrap().is_empty());
        p
    }

    /// b's side of the session.
    fn bs(&self) -> SessionId {
        self.lb.connected.lock().unwrap()[0]
    }

    fn pass(&self) {
        self.a.poll(Duration::ZERO).unwrap();
        self.b.poll(Duration::from_micros(100)).unwrap();
    }

    /// Polls both until `done` or 60 s.
    fn drive(&self, what: &str, mut done: impl FnMut(&Pair) -> bool) {
        let end = Instant::now() + Duration::from_secs(60);
        while !done(self) {
            assert!(Instant::now() < end, "{what}: timed out");
            self.pass();
        }
    }

    fn no_resets(&self) {
        let (ra, rb) = (
            self.la.resets.lock().unwrap(),
            self.lb.resets.lock().unwrap(),
        );
        assert!(
            ra.is_empty() && rb.is_empty(),
            "session reset: {ra:?} {rb:?}"
        );
    }

    /// Sends `n` messages of `segs` segments of `len` bytes from a to b, `depth` at most
    /// unacknowledged (and what the send queue bounds take), and checks every byte.
    fn stream(&self, n: usize, depth: usize, segs: usize, len: usize) {
        let bufs: Vec<Vec<u8>> = (0..depth.min(n) * segs)
            .map(|i| pattern(i as u64 + 1, len))
            .collect();
        let done0 = self.la.done.lock().unwrap().len();
        let end = Instant::now() + Duration::from_secs(60);
        let (mut sent, mut checked) = (0, 0);
        while checked < n {
            assert!(
                Instant::now() < end,
                "{n} x {segs} x {len} B at depth {depth}: sent {sent}, checked {checked} in 60 s"
            );
            self.no_resets();
            let done = {
                let d = self.la.done.lock().unwrap();
                assert!(d.iter().all(|d| d.1.is_ok()), "a send failed: {d:?}");
                d.len() - done0
            };
            while sent < n && sent - done < depth {
                let mut msg = OutMessage::new(1, (sent as u64).to_le_bytes().to_vec());
                for k in 0..segs {
                    let b = &bufs[(sent % depth) * segs + k];
                    // SAFETY: `bufs` lives until the end and is not modified.
                    msg.data
                        .push(unsafe { Payload::registered(b.as_ptr(), b.len()) });
                }
                match self.a.send(self.s, msg) {
                    Ok(_) => sent += 1,
                    Err(r) if r.kind() == ErrorKind::Full => break,
                    Err(r) => panic!("send: {r}"),
                }
            }
            self.pass();
            for (_, m) in std::mem::take(&mut *self.lb.msgs.lock().unwrap()) {
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
        self.drive("the last acknowledgements", |p| {
            p.la.done.lock().unwrap().len() - done0 == n
        });
        self.no_resets();
    }
}

#[test]
fn one_mib_messages_32_deep() {
    Pair::new(&[], &[]).stream(96, 32, 1, MIB);
}

#[test]
fn one_mib_messages_128_deep() {
    // 128 MiB outstanding: the session's byte bound and the receiver's pool hold it.
    let big = [
        ("msgr_send_queue_bytes", "268435456"),
        ("msgr_pool_chunks", "65536"),
    ];
    let p = Pair::new(&big, &big);
    p.stream(256, 128, 1, MIB);
    let c = p.b.session_info(p.bs()).unwrap().counters;
    assert_eq!(c.faults, 0);
    assert_eq!(c.msgs_received, 256);
}

/// A 16 MiB segment is 256 READs of 64 KiB: the whole default send queue (it ended the
/// session: the acknowledgement found no room); 16,320 KiB (255 READs) worked.
#[test]
fn sixteen_mib_segments() {
    let p = Pair::new(&[], &[]);
    p.stream(3, 1, 1, 16 * MIB);
    p.stream(2, 1, 1, 16 * MIB - 64 * 1024);
    p.stream(4, 2, 1, 16 * MIB);
}

/// Messages of the largest size the limits allow: the default (16 MiB, 64 segments) and a
/// raised one (half the default pool, 32 MiB, as two 16 MiB segments).
#[test]
fn messages_of_the_maximum_size() {
    let p = Pair::new(&[], &[]);
    let lim = p.b.settings().limits;
    assert_eq!(lim.max_message_bytes, 16 * MIB as u64);
    assert_eq!(lim.max_segments, 64);
    p.stream(2, 1, 64, 16 * MIB / 64);
    p.stream(2, 1, 1, 16 * MIB);
    drop(p);
    let max = [("msgr_max_message_bytes", "33554432")];
    let p = Pair::new(&max, &max);
    assert_eq!(p.b.settings().limits.max_message_bytes, 32 * MIB as u64);
    p.stream(2, 1, 2, 16 * MIB);
}

/// A post the send queue takes only part of (or none of) goes on later, in order: on the
/// sender (SENDs) and on the receiver (READs), every post of the run cut in half.
#[test]
fn partial_posts_are_resumed() {
    let p = Pair::new(&[], &[]);
    p.a.inject_fault(p.s, Fault::PartialPosts { posts: 100_000 })
        .unwrap();
    p.b.inject_fault(p.bs(), Fault::PartialPosts { posts: 100_000 })
        .unwrap();
    p.stream(64, 32, 2, 300 * 1024);
    // Small messages too: batches of SENDs (and eager WRITEs) cut short.
    p.stream(400, 64, 1, 4096);
    let ca = p.a.session_info(p.s).unwrap().counters;
    let cb = p.b.session_info(p.bs()).unwrap().counters;
    println!("a: {ca:?}\nb: {cb:?}");
    assert!(ca.partial_posts > 10, "a: {ca:?}");
    assert!(cb.partial_posts > 10, "b: {cb:?}");
    assert_eq!(ca.faults + cb.faults, 0);
}

/// Sends over this side's limits are refused at `send`, with the key named.
#[test]
fn sends_over_the_limits_are_refused() {
    let p = Pair::new(&[("msgr_max_segments", "8")], &[]);
    let big = vec![1u8; 16 * MIB];
    let mut m = OutMessage::new(1, vec![]);
    // SAFETY: `big` outlives the call (refused before anything is registered).
    m.data
        .push(unsafe { Payload::registered(big.as_ptr(), big.len()) });
    m.data.push(Payload::Copy(vec![2]));
    let r = p.a.send(p.s, m).unwrap_err();
    assert_eq!(r.kind(), ErrorKind::InvalidArgument);
    assert!(r.to_string().contains("msgr_max_message_bytes"), "{r}");
    let mut m = OutMessage::new(1, vec![]);
    for _ in 0..9 {
        m.data.push(Payload::Copy(vec![3; 10]));
    }
    let r = p.a.send(p.s, m).unwrap_err();
    assert_eq!(r.kind(), ErrorKind::InvalidArgument);
    assert!(r.to_string().contains("msgr_max_segments"), "{r}");
    // The session is unharmed.
    p.stream(2, 1, 8, 2 * MIB);
}

/// Each side's hello advertises its limits (protocol 1.3, `FLAG_LIMITS`): a send over the
/// peer's is refused at `send`, naming the key, and nothing reaches the peer.
#[test]
fn sends_over_the_peers_advertised_limits_are_refused() {
    let p = Pair::new(
        &[],
        &[
            ("msgr_max_message_bytes", "2097152"),
            ("msgr_max_segments", "4"),
        ],
    );
    p.stream(2, 2, 4, 512 * 1024);
    for (what, segs, len, key) in [
        ("bytes", 1, 3 * MIB, "msgr_max_message_bytes"),
        ("segments", 5, 8192, "msgr_max_segments"),
    ] {
        let mut m = OutMessage::new(1, vec![]);
        for i in 0..segs {
            m.data.push(Payload::Copy(pattern(i, len)));
        }
        let r = p.a.send(p.s, m).unwrap_err();
        assert_eq!(r.kind(), ErrorKind::InvalidArgument, "{what}");
        let text = r.to_string();
        assert!(
            text.contains(key) && text.contains("peer's advertised"),
            "{what}: {text}"
        );
    }
    // Within them: delivered; nothing was refused on b's side.
    p.stream(2, 2, 4, 512 * 1024);
    assert_eq!(p.b.stats().totals.oversized, 0);
    p.no_resets();
}

/// A peer that announces a message over this side's limits (one that did not learn them:
/// here b's hellos advertise none, as a build before protocol 1.3) is refused before a
/// chunk is taken for the message: counted, the session ended on both sides, the pool as
/// before.
#[test]
fn a_peer_over_the_limits_is_refused() {
    for (what, segs, len) in [("bytes", 1, 3 * MIB), ("segments", 5, 8192)] {
        let p = Pair::new_with(
            &[],
            &[
                ("msgr_max_message_bytes", "2097152"),
                ("msgr_max_segments", "4"),
            ],
            |b| b.advertise_limits(false),
        );
        p.stream(2, 2, 4, 512 * 1024);
        let before = p.b.stats().data_pool.chunks_in_use;
        let bs = p.bs();
        let bufs: Vec<Vec<u8>> = (0..segs).map(|i| pattern(i, len)).collect();
        let mut m = OutMessage::new(1, vec![]);
        for b in &bufs {
            // SAFETY: `bufs` outlives the send, which fails or completes below.
            m.data
                .push(unsafe { Payload::registered(b.as_ptr(), b.len()) });
        }
        let id = p.a.send(p.s, m).unwrap();
        p.drive(what, |p| {
            !p.lb.resets.lock().unwrap().is_empty()
                && p.la.done.lock().unwrap().iter().any(|d| d.0 == id)
        });
        let reset = p.lb.resets.lock().unwrap()[0].clone();
        assert_eq!(reset.0, bs);
        assert!(reset.1.contains("refused"), "{what}: {}", reset.1);
        assert!(p.lb.msgs.lock().unwrap().is_empty(), "{what}: delivered");
        let done = p.la.done.lock().unwrap().clone();
        assert!(
            done.iter().any(|d| d.0 == id && d.1.is_err()),
            "{what}: the send did not fail: {done:?}"
        );
        let st = p.b.stats();
        assert_eq!(st.totals.oversized, 1, "{what}: {:?}", st.totals);
        assert_eq!(st.totals.malformed, 0);
        assert!(
            st.data_pool.chunks_in_use <= before,
            "{what}: {} chunks in use, {before} before",
            st.data_pool.chunks_in_use
        );
        assert!(p.b.sessions().is_empty());
    }
}

/// A limit the pool cannot hold is refused at creation; the default is lowered to it.
#[test]
fn limits_fit_the_pool() {
    let e = Messenger::new(
        &config(&[
            ("msgr_pool_chunks", "1024"),
            ("msgr_max_message_bytes", "4194304"),
        ]),
        Arc::new(Log::default()),
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict);
    assert!(e.to_string().contains("msgr_max_message_bytes"), "{e}");
    let m = Messenger::new(
        &config(&[("msgr_pool_chunks", "1024")]),
        Arc::new(Log::default()),
    )
    .unwrap();
    assert_eq!(m.settings().limits.max_message_bytes, 2 * MIB as u64);
}

#[test]
fn large_messages_on_verbs_under_rdmx_ibv() {
    support::rerun_under_rdmx_ibv(
        "127.0.0.2",
        &[
            "one_mib_messages_32_deep",
            "sixteen_mib_segments",
            "partial_posts_are_resumed",
        ],
        Duration::from_secs(180),
    );
}

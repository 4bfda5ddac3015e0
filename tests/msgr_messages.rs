//! Messenger messages end to end on loopback (two messengers in one process, caller-driven
//! progress): front + 0..n data segments of every kind up to 4 MiB, content checked; eager
//! (written into granted chunks, or inline) and rendezvous paths; send completions; the
//! pools back to their baseline afterwards. On the soft provider, and again on the verbs
//! provider under `rdmx-ibv exec` (`messenger_cases_on_verbs_under_rdmx_ibv`).

use rdmx::config::Config;
use rdmx::msgr::messenger::{
    Dispatcher, InMessage, Messenger, OutMessage, Payload, Policy, SessionId,
};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod support;

#[derive(Default)]
struct Log {
    msgs: Mutex<Vec<(SessionId, InMessage)>>,
    done: Mutex<Vec<(u64, bool)>>,
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
}

fn config(kv: &[(&str, &str)]) -> Config {
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    support::apply_provider(&mut c);
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

/// Polls both until `done` or 20 s.
fn drive(a: &Messenger, b: &Messenger, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < end, "timed out");
        a.poll(Duration::ZERO).unwrap();
        b.poll(Duration::from_micros(100)).unwrap();
    }
}

#[test]
fn messages_of_every_shape_arrive_intact_and_pools_return_to_baseline() {
    let la = Arc::new(Log::default());
    let lb = Arc::new(Log::default());
    let a = Messenger::new(&config(&[]), la.clone()).unwrap();
    let b = Messenger::new(&config(&[]), lb.clone()).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let base_a = a.stats();
    let base_b = b.stats();
    let s = a.connect(&addr.to_string(), Policy::Lossless).unwrap();
    drive(&a, &b, || !la.connected.lock().unwrap().is_empty());
    assert_eq!(la.connected.lock().unwrap()[0], s);

    // (front length, segment lengths, payload kind)
    let shapes: Vec<(usize, Vec<usize>, u8)> = vec![
        (0, vec![], 0),
        (10, vec![], 0),
        (448, vec![], 0),
        (1000, vec![], 0), // front too large for the slot: descriptor block
        (64, vec![4096], 0),
        (64, vec![4096], 1),
        (64, vec![4096], 2),
        (64, vec![100], 3),
        (64, vec![8192], 3),
        (64, vec![65536], 3),
        (64, vec![4096, 4096, 4096], 0),
        (200, vec![4 << 20], 3),
        (200, vec![4 << 20], 2),
        (32, vec![1, 4095, 4097, 12345], 3),
    ];
    let mut regs: Vec<Vec<u8>> = Vec::new();
    let mut expect = Vec::new();
    for (i, (front_len, segs, kind)) in shapes.iter().enumerate() {
        let front = pattern(i as u64, *front_len);
        let mut msg = OutMessage::new(i as u16, front.clone());
        let mut want = Vec::new();
        for (j, &len) in segs.iter().enumerate() {
            let bytes = pattern((i * 100 + j) as u64, len);
            let p = match kind {
                0 if len <= 4096 => {
                    let mut c = a.alloc_chunk().unwrap();
                    c.as_mut_slice()[..len].copy_from_slice(&bytes);
                    c.set_len(len);
                    Payload::Chunk(c)
                }
                2 => {
                    regs.push(bytes.clone());
                    let r = regs.last().unwrap();
                    // SAFETY: `regs` keeps the buffer alive and unmodified until the end.
                    unsafe { Payload::registered(r.as_ptr(), r.len()) }
                }
                _ => Payload::Copy(bytes.clone()),
            };
            msg.data.push(p);
            want.push(bytes);
        }
        a.send(s, msg).unwrap();
        expect.push((i as u16, front, want));
    }
    let n = expect.len();
    drive(&a, &b, || {
        lb.msgs.lock().unwrap().len() == n && la.done.lock().unwrap().len() == n
    });
    let got = std::mem::take(&mut *lb.msgs.lock().unwrap());
    for ((_, m), (t, front, want)) in got.iter().zip(&expect) {
        assert_eq!(m.msg_type, *t);
        assert_eq!(&m.front, front, "front of message {t}");
        assert_eq!(m.data.len(), want.len());
        for (seg, w) in m.data.iter().zip(want) {
            assert_eq!(seg.len(), w.len());
            assert_eq!(seg.as_ptr() as usize % 4096, 0, "page-aligned");
            assert!(seg.to_vec() == *w, "data of message {t}");
        }
    }
    let done = la.done.lock().unwrap().clone();
    assert!(done.iter().all(|&(_, ok)| ok));
    assert_eq!(
        done.iter().map(|d| d.0).collect::<Vec<_>>(),
        (1..=n as u64).collect::<Vec<_>>()
    );
    // Echo one received 4 MiB segment back, zero-copy.
    let mut got = got;
    let (bs, mut big) = got.remove(11);
    let seg = big.data.remove(0);
    let echo = OutMessage::new(99, vec![]).with(Payload::Received(seg));
    b.send(bs, echo).unwrap();
    drive(&a, &b, || !la.msgs.lock().unwrap().is_empty());
    let back = la.msgs.lock().unwrap().remove(0).1;
    assert!(back.data[0].to_vec() == expect[11].2[0]);
    let info = a.session_info(s).unwrap();
    println!("counters a: {:?}", info.counters);
    assert_eq!(info.counters.rnr_naks, 0);
    assert!(info.counters.copied_bytes > 4 << 20);
    let rb = b.session_info(bs).unwrap().counters;
    println!("counters b: {rb:?}");
    assert!(rb.read_segments > 0 && rb.eager_segments > 0);
    drop((got, big, back));
    // Everything released: only the posted receives remain out.
    drive(&a, &b, || lb.done.lock().unwrap().len() == 1);
    let (sa, sb) = (a.stats(), b.stats());
    let posted = |m: &Messenger| {
        m.sessions()
            .iter()
            .map(|&s| m.session_info(s).unwrap().recv_window)
            .sum::<u32>()
    };
    println!("pools a: {} / b: {}", sa.data_pool, sb.data_pool);
    assert!(sa.data_pool.chunks_in_use <= base_a.data_pool.chunks_in_use + posted(&a) + 8);
    assert!(sb.data_pool.chunks_in_use <= base_b.data_pool.chunks_in_use + posted(&b) + 8);
    assert_eq!(sa.copy_chunks_in_use, 0);
    a.close_session(s).unwrap();
    drive(&a, &b, || {
        b.sessions().is_empty() && a.sessions().is_empty()
    });
    for _ in 0..20 {
        a.poll(Duration::from_millis(5)).unwrap();
        b.poll(Duration::from_millis(5)).unwrap();
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(
        sa.data_pool.chunks_in_use, base_a.data_pool.chunks_in_use,
        "{}",
        sa.data_pool
    );
    assert_eq!(
        sb.data_pool.chunks_in_use, base_b.data_pool.chunks_in_use,
        "{}",
        sb.data_pool
    );
    assert_eq!(sa.header_pool.chunks_in_use, 0);
    assert_eq!(sb.header_pool.chunks_in_use, 0);
}

/// `msgr_eager_write`: a receiver that has it on grants its receive chunks, and a sender
/// that has it on WRITES eager data into them (then a short SEND); when either side has it
/// off the data rides in the SEND. Every combination delivers the same bytes, and the
/// receiver's `written_segments` says which path they took.
#[test]
fn eager_data_is_written_into_granted_chunks_or_sent_inline() {
    for (send_on, recv_on) in [(true, true), (true, false), (false, true)] {
        let flag = |on: bool| if on { "true" } else { "false" };
        let la = Arc::new(Log::default());
        let lb = Arc::new(Log::default());
        let a =
            Messenger::new(&config(&[("msgr_eager_write", flag(send_on))]), la.clone()).unwrap();
        let b =
            Messenger::new(&config(&[("msgr_eager_write", flag(recv_on))]), lb.clone()).unwrap();
        let addr = b.listen("127.0.0.1:0").unwrap();
        let base_b = b.stats();
        let s = a.connect(&addr.to_string(), Policy::Lossless).unwrap();
        drive(&a, &b, || !la.connected.lock().unwrap().is_empty());
        // 4 KiB and smaller segments, fronts of several sizes (a large front leaves no room
        // for grants in its slot), more messages than the receive window.
        let sizes = [4096usize, 100, 4096, 1, 4000];
        let fronts = [64usize, 0, 448, 8, 300];
        let n = 300;
        for i in 0..n {
            let len = sizes[i % sizes.len()];
            let mut c = a.alloc_chunk().unwrap();
            c.as_mut_slice()[..len].copy_from_slice(&pattern(i as u64, len));
            c.set_len(len);
            let front = pattern(1000 + i as u64, fronts[i % fronts.len()]);
            let mut msg = OutMessage::new(1, front).with(Payload::Chunk(c));
            let end = Instant::now() + Duration::from_secs(20);
            while let Err(r) = a.send(s, msg) {
                assert_eq!(r.kind(), rdmx::error::ErrorKind::Full, "{r}");
                assert!(Instant::now() < end, "the queue never drained");
                msg = *r.msg;
                a.poll(Duration::ZERO).unwrap();
                b.poll(Duration::from_micros(100)).unwrap();
            }
        }
        drive(&a, &b, || lb.msgs.lock().unwrap().len() == n);
        let got = std::mem::take(&mut *lb.msgs.lock().unwrap());
        for (i, (_, m)) in got.iter().enumerate() {
            let len = sizes[i % sizes.len()];
            assert_eq!(m.front, pattern(1000 + i as u64, fronts[i % fronts.len()]));
            assert_eq!(m.data.len(), 1);
            assert!(m.data[0].to_vec() == pattern(i as u64, len), "message {i}");
        }
        let bs = got[0].0;
        drop(got);
        let rb = b.session_info(bs).unwrap().counters;
        println!("eager_write sender {send_on} receiver {recv_on}: {rb:?}");
        assert_eq!(rb.eager_segments, n as u64);
        let want = if send_on && recv_on { n as u64 } else { 0 };
        assert_eq!(rb.written_segments, want);
        assert_eq!(rb.rnr_naks, 0);
        a.close_session(s).unwrap();
        drive(&a, &b, || {
            b.sessions().is_empty() && a.sessions().is_empty()
        });
        assert_eq!(
            b.stats().data_pool.chunks_in_use,
            base_b.data_pool.chunks_in_use
        );
    }
}

/// Two messengers made with `kv`, `a` connected to `b` (both saw the connect): the logs,
/// the messengers and `a`'s session.
fn connected_pair(kv: &[(&str, &str)]) -> (Arc<Log>, Arc<Log>, Messenger, Messenger, SessionId) {
    let la = Arc::new(Log::default());
    let lb = Arc::new(Log::default());
    let a = Messenger::new(&config(kv), la.clone()).unwrap();
    let b = Messenger::new(&config(kv), lb.clone()).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let s = a.connect(&addr.to_string(), Policy::Lossless).unwrap();
    drive(&a, &b, || {
        !la.connected.lock().unwrap().is_empty() && !lb.connected.lock().unwrap().is_empty()
    });
    (la, lb, a, b, s)
}

/// Takes the messages `log` received and checks they are `pattern(i, len)` in order.
fn assert_in_order(log: &Log, len: usize) {
    let got = std::mem::take(&mut *log.msgs.lock().unwrap());
    for (i, (_, m)) in got.iter().enumerate() {
        assert_eq!(
            m.front,
            pattern(i as u64, len),
            "message {i} in order, intact"
        );
    }
}

/// `msgr_rx_batch`: a pass takes at most that many messages from a session's link, so the
/// answers sent from their callbacks leave before the next ones are taken; 0 takes all.
#[test]
fn a_pass_takes_at_most_rx_batch_messages() {
    for (batch, n) in [("4", 32usize), ("0", 32)] {
        // A window of 64 from the start: the sender may send all 32 before the
        // receiver polls.
        let window = [("msgr_recv_window_min", "64"), ("msgr_rx_batch", batch)];
        let (_la, lb, a, b, s) = connected_pair(&window);
        for i in 0..n {
            a.send(s, OutMessage::new(7, pattern(i as u64, 32)))
                .unwrap();
        }
        let end = Instant::now() + Duration::from_secs(20);
        while a.session_info(s).unwrap().counters.msgs_sent < n as u64 {
            assert!(
                Instant::now() < end,
                "the sender never posted them all: {:?}",
                a.session_info(s).unwrap().counters
            );
            a.poll(Duration::ZERO).unwrap();
        }
        // All of them are on their way (loopback); the receiver polls only now.
        std::thread::sleep(Duration::from_millis(50));
        let mut passes = Vec::new();
        while lb.msgs.lock().unwrap().len() < n {
            assert!(Instant::now() < end, "timed out");
            let k = b.poll(Duration::from_micros(100)).unwrap();
            if k > 0 {
                passes.push(k);
            }
        }
        assert_in_order(&lb, 32);
        println!("msgr_rx_batch {batch}: messages per pass {passes:?}");
        let most = *passes.iter().max().unwrap();
        if batch == "4" {
            assert!(most <= 4, "a pass took {most} messages: {passes:?}");
        } else {
            assert!(
                most > 4,
                "no pass took more than 4 without a limit: {passes:?}"
            );
        }
        a.close_session(s).unwrap();
        drive(&a, &b, || {
            b.sessions().is_empty() && a.sessions().is_empty()
        });
    }
}

/// A batch of SENDs posted together asks for one completion, its last (selective
/// signaling): 32 messages sent in one pass cost the sender a handful of send-queue
/// completions, not 32, and still arrive in order and intact.
#[test]
fn a_batch_of_sends_takes_one_completion() {
    let n = 32usize;
    let (_la, lb, a, b, s) = connected_pair(&[("msgr_recv_window_min", "64")]);
    let before = a.session_info(s).unwrap().counters.send_completions;
    for i in 0..n {
        a.send(s, OutMessage::new(7, pattern(i as u64, 32)))
            .unwrap();
    }
    drive(&a, &b, || {
        lb.msgs.lock().unwrap().len() == n && a.session_info(s).unwrap().unacked == 0
    });
    let c = a.session_info(s).unwrap().counters;
    assert_in_order(&lb, 32);
    let wcs = c.send_completions - before;
    println!("{} messages sent, {wcs} send completions", c.msgs_sent);
    assert!(wcs >= 1, "the batch's last SEND is signaled: {c:?}");
    assert!(wcs <= 4, "{wcs} send completions for {n} messages: {c:?}");
}

/// Sessions left idle (a pass skips them after a look: `Session::quiet`) wake for what
/// comes: 20 sessions idle for 100 ms, then a message each way on every one, all delivered
/// on the session it was sent on, and none reset.
#[test]
fn idle_sessions_wake_for_messages() {
    let n = 20usize;
    let la = Arc::new(Log::default());
    let lb = Arc::new(Log::default());
    let a = Messenger::new(&config(&[]), la.clone()).unwrap();
    let b = Messenger::new(&config(&[]), lb.clone()).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap().to_string();
    let mine: Vec<SessionId> = (0..n)
        .map(|_| a.connect(&addr, Policy::Lossless).unwrap())
        .collect();
    drive(&a, &b, || {
        la.connected.lock().unwrap().len() == n && lb.connected.lock().unwrap().len() == n
    });
    let end = Instant::now() + Duration::from_millis(100);
    while Instant::now() < end {
        a.poll(Duration::ZERO).unwrap();
        b.poll(Duration::from_micros(200)).unwrap();
    }
    // Idle: parked, passes skip them (a keepalive round may be waking a few).
    let parked = |m: &Messenger| n - m.stats().active_sessions;
    assert!(
        parked(&a) >= n / 2 && parked(&b) >= n / 2,
        "parked: a {} b {} of {n}",
        parked(&a),
        parked(&b)
    );
    for (i, &s) in mine.iter().enumerate() {
        a.send(s, OutMessage::new(9, pattern(i as u64, 16)))
            .unwrap();
    }
    drive(&a, &b, || lb.msgs.lock().unwrap().len() == n);
    let theirs: Vec<SessionId> = lb.msgs.lock().unwrap().iter().map(|(s, _)| *s).collect();
    for (s, m) in lb.msgs.lock().unwrap().iter() {
        b.send(*s, OutMessage::new(10, m.front.clone())).unwrap();
    }
    drive(&a, &b, || la.msgs.lock().unwrap().len() == n);
    let mut echoed: Vec<(SessionId, Vec<u8>)> = la
        .msgs
        .lock()
        .unwrap()
        .iter()
        .map(|(s, m)| (*s, m.front.clone()))
        .collect();
    echoed.sort_by_key(|(s, _)| mine.iter().position(|x| x == s));
    for (i, (s, front)) in echoed.iter().enumerate() {
        assert_eq!(*s, mine[i], "echo {i} on its own session");
        assert_eq!(*front, pattern(i as u64, 16), "echo {i} intact");
    }
    let mut distinct = theirs;
    distinct.sort_by_key(|s| s.0);
    distinct.dedup();
    assert_eq!(distinct.len(), n, "one message per accepted session");
    for &s in &mine {
        assert_eq!(a.session_info(s).unwrap().counters.faults, 0);
    }
    // Every parked session was woken by what it had to do, none by the periodic look.
    assert_eq!(a.stats().missed_wakes + b.stats().missed_wakes, 0);
}

/// A receiver that only acknowledges (one-way traffic) is not silent: it sends no
/// keepalive while messages flow, and the sender keeps its whole window (a keepalive
/// shrinks the window it announces). 300 ms of traffic against a 20 ms keepalive.
#[test]
fn a_busy_one_way_session_sends_no_keepalives() {
    let kv = [
        ("msgr_keepalive_ms", "20"),
        ("msgr_keepalive_timeout_ms", "5000"),
    ];
    let (_la, lb, a, b, s) = connected_pair(&kv);
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < Duration::from_millis(300) {
        // Keep the queue fed: a few messages per round, both sides polled.
        for _ in 0..4 {
            if a.send(s, OutMessage::new(3, pattern(sent, 16))).is_ok() {
                sent += 1;
            }
        }
        a.poll(Duration::ZERO).unwrap();
        b.poll(Duration::ZERO).unwrap();
    }
    drive(&a, &b, || lb.msgs.lock().unwrap().len() as u64 == sent);
    let bs = lb.msgs.lock().unwrap()[0].0;
    let rb = b.session_info(bs).unwrap().counters;
    println!("{sent} messages in 300 ms; receiver {rb:?}");
    assert!(sent > 1000, "only {sent} messages in 300 ms");
    // The traffic itself (the receiver's acknowledgements) shows it alive; a keepalive or
    // two around the start and the end at most.
    assert!(
        rb.keepalives_sent <= 2,
        "the receiver sent {} keepalives during traffic",
        rb.keepalives_sent
    );
    a.close_session(s).unwrap();
    drive(&a, &b, || {
        b.sessions().is_empty() && a.sessions().is_empty()
    });
}

/// The cases above on the verbs provider: this binary again under `rdmx-ibv exec`
/// (libibverbs -> rdmx's device -> the soft transport), so registration with remote write,
/// unsignaled WRITEs and READs go through `ibv_*` calls.
#[test]
fn messenger_cases_on_verbs_under_rdmx_ibv() {
    support::rerun_under_rdmx_ibv(
        "127.0.0.2",
        &[
            "messages_of_every_shape_arrive_intact_and_pools_return_to_baseline",
            "eager_data_is_written_into_granted_chunks_or_sent_inline",
        ],
        Duration::from_secs(120),
    );
}

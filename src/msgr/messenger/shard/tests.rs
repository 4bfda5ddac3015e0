//! The driver's locking, through the public API on loopback (soft provider): `send` does
//! not wait for a pass.

use crate::config::Config;
use crate::error::{ErrorKind, Result as RdmxResult};
use crate::msgr::Policy;
use crate::msgr::messenger::{Dispatcher, InMessage, Messenger, OutMessage, SessionId};

use super::{PassStage, ShardState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Generous bounds: a loaded host is slow, a deadlock never ends.
const WAIT: Duration = Duration::from_secs(20);

#[derive(Default)]
struct Record {
    /// The fronts' first 8 bytes (a counter) in delivery order.
    got: Mutex<Vec<u64>>,
    done: Mutex<Vec<(u64, bool)>>,
    ready: AtomicU64,
    /// Send completions and resets, in callback order.
    log: Mutex<Vec<String>>,
}

impl Dispatcher for Record {
    fn on_message(&self, _m: &Messenger, _s: SessionId, msg: InMessage) {
        let n = u64::from_le_bytes(msg.front[..8].try_into().unwrap());
        self.got.lock().unwrap().push(n);
    }
    fn on_send_complete(&self, _m: &Messenger, _s: SessionId, id: u64, r: RdmxResult<()>) {
        self.done.lock().unwrap().push((id, r.is_ok()));
        let what = if r.is_ok() { "ok" } else { "err" };
        self.log.lock().unwrap().push(format!("done {id} {what}"));
    }
    fn on_reset(&self, _m: &Messenger, _s: SessionId, why: &crate::error::Error) {
        self.log.lock().unwrap().push(format!("reset: {why}"));
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

fn msg(n: u64) -> OutMessage {
    OutMessage::new(7, n.to_le_bytes().to_vec())
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + WAIT;
    while !ok() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A pass held up with its shard locked (here by a test hook; in life by a slow device
/// pass or a CQ hook): sends from another thread still return at once, within the
/// send-queue bound, and refuse past it with `Full` (the message handed back, never
/// queued); once the pass goes on, what was accepted is delivered once, in order, every
/// accepted send completes, and the refused sender gets `on_send_ready`.
#[test]
fn send_does_not_wait_for_a_pass_held_up_with_the_shard_locked() {
    let kv = [("msgr_threads", "1"), ("msgr_send_queue_msgs", "4")];
    let (da, db) = (Arc::new(Record::default()), Arc::new(Record::default()));
    let a = Messenger::new(&config(&kv), da.clone()).unwrap();
    let b = Messenger::new(&config(&kv), db.clone()).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let s = a.connect(&addr.to_string(), Policy::Lossless).unwrap();
    // One message through, acknowledged: the session is open and holds nothing.
    assert_eq!(a.send(s, msg(1)).unwrap(), 1);
    wait_for("the first send's completion", || {
        da.done.lock().unwrap().as_slice() == [(1, true)]
    });

    // The hook blocks the next pass of a's only shard until released.
    let hold = Hold::install(&a, PassStage::Start, |_| true);
    a.core.shards[0].wake.signal();
    hold.entered();

    // The worker is inside a pass with the shard's state locked: six sends from another
    // thread. Four fit the bound (4 messages), two are refused Full with their message.
    let sender = {
        let a = a.clone();
        std::thread::spawn(move || {
            (2..8u64)
                .map(|n| {
                    a.send(s, msg(n)).map_err(|r| {
                        (
                            r.kind(),
                            u64::from_le_bytes(r.msg.front[..8].try_into().unwrap()),
                        )
                    })
                })
                .collect::<Vec<_>>()
        })
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(sender.join());
    });
    let results = rx
        .recv_timeout(WAIT)
        .expect("the sends returned while the pass was held up (a send waited for the pass)")
        .expect("the sending thread panicked");
    assert_eq!(
        results,
        vec![
            Ok(2),
            Ok(3),
            Ok(4),
            Ok(5),
            Err((ErrorKind::Full, 6)),
            Err((ErrorKind::Full, 7)),
        ]
    );
    // Nothing went out while the pass was held.
    assert_eq!(db.got.lock().unwrap().as_slice(), [1]);
    hold.release();

    // The pass goes on: 2..=5 arrive once, in order; each completes; room again: Ready.
    wait_for("delivery of the accepted sends", || {
        db.got.lock().unwrap().len() >= 5
    });
    wait_for("their completions and on_send_ready", || {
        da.done.lock().unwrap().len() >= 5 && da.ready.load(Ordering::Relaxed) >= 1
    });
    assert_eq!(db.got.lock().unwrap().as_slice(), [1, 2, 3, 4, 5]);
    assert_eq!(
        da.done.lock().unwrap().as_slice(),
        [(1, true), (2, true), (3, true), (4, true), (5, true)]
    );
    let info = a.session_info(s).unwrap();
    assert_eq!(info.counters.full_refusals, 2);
    drop(hold);
    // The refused messages can go now, with the next numbers.
    assert_eq!(a.send(s, msg(6)).unwrap(), 6);
    assert_eq!(a.send(s, msg(7)).unwrap(), 7);
    wait_for("the retried sends", || db.got.lock().unwrap().len() >= 7);
    assert_eq!(db.got.lock().unwrap().as_slice(), [1, 2, 3, 4, 5, 6, 7]);
}

/// Sends accepted at the gate before the application closes the session complete with an
/// error (one completion each, in order), and later ones are refused `Closed`. Poll mode:
/// no pass runs between the sends and the close.
#[test]
fn sends_at_the_gate_fail_in_order_when_the_session_is_closed() {
    let (da, db) = (Arc::new(Record::default()), Arc::new(Record::default()));
    let a = Messenger::new(&config(&[("msgr_threads", "0")]), da.clone()).unwrap();
    let b = Messenger::new(&config(&[("msgr_threads", "1")]), db.clone()).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let s = a.connect(&addr.to_string(), Policy::Lossless).unwrap();
    assert_eq!(a.send(s, msg(1)).unwrap(), 1);
    poll_until(&a, "the first send's completion", || {
        da.done.lock().unwrap().len() == 1
    });
    for n in 2..5u64 {
        assert_eq!(a.send(s, msg(n)).unwrap(), n);
    }
    // They wait at the gate (queued: session_info counts them).
    assert_eq!(a.session_info(s).unwrap().queued, 3);
    a.close_session(s).unwrap();
    let r = a.send(s, msg(9)).unwrap_err();
    assert_eq!(r.kind(), ErrorKind::Closed);
    poll_until(&a, "a completion for every accepted send", || {
        da.done.lock().unwrap().len() >= 4
    });
    assert_eq!(
        da.done.lock().unwrap().as_slice(),
        [(1, true), (2, false), (3, false), (4, false)]
    );
    assert_eq!(db.got.lock().unwrap().as_slice(), [1]);
    assert!(
        da.log
            .lock()
            .unwrap()
            .iter()
            .all(|l| !l.starts_with("reset"))
    );
}

/// A lossy session that ends in a pass while another thread sends: the sends that reach its
/// gate before the pass closes it complete with the session's error before `on_reset`
/// (the last callback), and later ones are refused `Closed`.
#[test]
fn sends_racing_a_lossy_fault_complete_before_the_reset() {
    let (da, db) = (Arc::new(Record::default()), Arc::new(Record::default()));
    let a = Messenger::new(&config(&[("msgr_threads", "0")]), da.clone()).unwrap();
    let b = Messenger::new(&config(&[("msgr_threads", "1")]), db.clone()).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let s = a.connect(&addr.to_string(), Policy::Lossy).unwrap();
    assert_eq!(a.send(s, msg(1)).unwrap(), 1);
    poll_until(&a, "the first send's completion", || {
        da.done.lock().unwrap().len() == 1
    });

    // Hold the pass that ended the session, after its sessions were driven.
    let hold = Hold::install(&a, PassStage::Driven, |st| {
        st.sessions
            .values()
            .any(|x| x.m.state == crate::msgr::messenger::SessionState::Closed)
    });
    a.inject_fault(s, crate::msgr::messenger::Fault::QpError)
        .unwrap();
    let poller = {
        let (a, da) = (a.clone(), da.clone());
        std::thread::spawn(move || {
            let end = Instant::now() + WAIT * 2;
            while Instant::now() < end
                && !da
                    .log
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|l| l.starts_with("reset"))
            {
                a.poll(Duration::from_millis(5)).unwrap();
            }
        })
    };
    hold.entered();
    // The machine ended; its gate is open until the pass goes on.
    assert_eq!(a.send(s, msg(2)).unwrap(), 2);
    assert_eq!(a.send(s, msg(3)).unwrap(), 3);
    hold.release();
    poller.join().unwrap();
    assert_eq!(a.send(s, msg(4)).unwrap_err().kind(), ErrorKind::Closed);
    let log = da.log.lock().unwrap().clone();
    let n = log.len();
    assert!(n >= 3, "{log:?}");
    assert_eq!(&log[n - 3..n - 1], ["done 2 err", "done 3 err"], "{log:?}");
    assert!(log[n - 1].starts_with("reset"), "{log:?}");
    assert_eq!(
        log.iter().filter(|l| l.starts_with("reset")).count(),
        1,
        "{log:?}"
    );
}

/// Drives a poll-mode messenger until `ok` (bounded).
fn poll_until(m: &Messenger, what: &str, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + WAIT;
    while !ok() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        m.poll(Duration::from_millis(5)).unwrap();
    }
}

/// A pass held up at a stage of the test hook, once, when `when` holds for its shard.
struct Hold {
    entered: mpsc::Receiver<()>,
    release: mpsc::Sender<()>,
    m: Messenger,
}

impl Hold {
    fn install(
        m: &Messenger,
        at: PassStage,
        when: impl Fn(&ShardState) -> bool + Send + Sync + 'static,
    ) -> Hold {
        let armed = AtomicBool::new(true);
        let (entered_tx, entered) = mpsc::channel::<()>();
        let (release, release_rx) = mpsc::channel::<()>();
        let (entered_tx, release_rx) = (Mutex::new(entered_tx), Mutex::new(release_rx));
        *m.core.pass_hook.lock() = Some(Arc::new(move |stage, st| {
            if stage == at && when(st) && armed.swap(false, Ordering::AcqRel) {
                let _ = entered_tx.lock().unwrap().send(());
                // Bounded: a send that waited for this pass fails its own bound first.
                let _ = release_rx.lock().unwrap().recv_timeout(WAIT * 2);
            }
        }));
        Hold {
            entered,
            release,
            m: m.clone(),
        }
    }

    fn entered(&self) {
        self.entered
            .recv_timeout(WAIT)
            .expect("a pass reached the hook");
    }

    fn release(&self) {
        let _ = self.release.send(());
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let _ = self.release.send(());
        *self.m.core.pass_hook.lock() = None;
    }
}

/// A worker whose pass panics (here the test hook, once, in a pass over a session; in life a
/// bug of the messenger) is not lost: the panic is counted (`worker_panics`), the sessions
/// of its shard are ended (`on_reset` with the panic's message; the peer is told), and the
/// worker goes on: a new session on the same messenger delivers.
#[test]
fn a_worker_whose_pass_panics_ends_its_sessions_and_goes_on() {
    let kv = [("msgr_threads", "1")];
    let (da, db) = (Arc::new(Record::default()), Arc::new(Record::default()));
    let a = Messenger::new(&config(&kv), da.clone()).unwrap();
    let b = Messenger::new(&config(&kv), db.clone()).unwrap();
    let addr = b.listen("127.0.0.1:0").unwrap();
    let s = a.connect(&addr.to_string(), Policy::Lossy).unwrap();
    a.send(s, msg(1)).unwrap();
    wait_for("the first message", || db.got.lock().unwrap().contains(&1));

    let armed = AtomicBool::new(true);
    *a.core.pass_hook.lock() = Some(Arc::new(move |stage, st: &ShardState| {
        if stage == PassStage::Start
            && !st.sessions.is_empty()
            && armed.swap(false, Ordering::AcqRel)
        {
            panic!("a pass goes wrong on purpose");
        }
    }));
    wait_for("the panic counted", || a.stats().worker_panics == 1);
    wait_for("the session's reset", || {
        da.log.lock().unwrap().iter().any(|l| {
            l.starts_with("reset: ")
                && l.contains("messenger worker 0 panicked: a pass goes wrong on purpose")
        })
    });
    assert!(!a.sessions().contains(&s), "the shard's session was ended");

    let s2 = a.connect(&addr.to_string(), Policy::Lossy).unwrap();
    a.send(s2, msg(2)).unwrap();
    wait_for("the new session's message", || {
        db.got.lock().unwrap().contains(&2)
    });
    let st = a.stats();
    assert_eq!((st.worker_panics, st.dispatcher_panics), (1, 0));
    *a.core.pass_hook.lock() = None;
}

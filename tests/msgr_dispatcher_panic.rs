//! A dispatcher callback that panics does not kill the shard worker that called it: the
//! panic is caught, counted (`MsgrStats::dispatcher_panics`), its session is ended (this
//! side gets `on_reset`, the peer sees the session closed), and the other sessions on the
//! same worker keep going. Bounded waits only; nothing here measures time.

use rdmx::error::Error;
use rdmx::msgr::messenger::{Dispatcher, InMessage, Messenger, OutMessage, Policy, SessionId};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod support;

/// The message type the server's dispatcher panics on.
const POISON: u16 = 0xdead;

#[derive(Default)]
struct Log {
    connected: Mutex<Vec<SessionId>>,
    msgs: Mutex<Vec<(SessionId, u16)>>,
    resets: Mutex<Vec<(SessionId, String)>>,
    /// Panic in on_reset too (a panic while reporting the end of a session).
    panic_on_reset: bool,
}

impl Dispatcher for Log {
    fn on_connect(&self, _m: &Messenger, s: SessionId, _p: std::net::SocketAddr, _i: bool) {
        self.connected.lock().unwrap().push(s);
    }
    fn on_message(&self, _m: &Messenger, s: SessionId, msg: InMessage) {
        if msg.msg_type == POISON {
            panic!("poisoned message on session {:#x}", s.0);
        }
        self.msgs.lock().unwrap().push((s, msg.msg_type));
    }
    fn on_reset(&self, _m: &Messenger, s: SessionId, why: &Error) {
        self.resets.lock().unwrap().push((s, why.to_string()));
        if self.panic_on_reset {
            panic!("on_reset panics too");
        }
    }
}

/// Polls the client (caller-driven) until `done`, at most 20 s.
fn drive(client: &Messenger, what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        client.poll(Duration::from_millis(1)).unwrap();
    }
}

fn send(m: &Messenger, s: SessionId, msg_type: u16) {
    m.send(s, OutMessage::new(msg_type, vec![7u8; 64]))
        .unwrap_or_else(|e| panic!("send type {msg_type:#x}: {e:?}"));
}

fn panicking_on_message_ends_only_its_session(policy: Policy, panic_on_reset: bool) {
    // One worker thread: both sessions are on it, so the second shows it survived.
    let server_log = Arc::new(Log {
        panic_on_reset,
        ..Log::default()
    });
    let server = Messenger::new(
        &support::config(&[("msgr_threads", "1")]),
        server_log.clone(),
    )
    .unwrap();
    let addr = server.listen("127.0.0.1:0").unwrap().to_string();
    let client_log = Arc::new(Log::default());
    let client = Messenger::new(&support::config(&[]), client_log.clone()).unwrap();
    let a = client.connect(&addr, policy).unwrap();
    let b = client.connect(&addr, policy).unwrap();
    drive(&client, "two sessions", || {
        client_log.connected.lock().unwrap().len() == 2
            && server_log.connected.lock().unwrap().len() == 2
    });
    for s in [a, b] {
        send(&client, s, 1);
    }
    drive(&client, "the first messages", || {
        server_log.msgs.lock().unwrap().len() == 2
    });
    assert_eq!(server.stats().dispatcher_panics, 0);

    send(&client, a, POISON);
    // The server's session for `a` ends (its on_reset) and the client sees `a` reset: the
    // server closed it.
    drive(&client, "the poisoned session's resets", || {
        !server_log.resets.lock().unwrap().is_empty()
            && client_log
                .resets
                .lock()
                .unwrap()
                .iter()
                .any(|(s, _)| *s == a)
    });
    let resets = server_log.resets.lock().unwrap().clone();
    assert_eq!(resets.len(), 1, "{resets:?}");
    assert!(
        resets[0].1.contains("on_message panicked") && resets[0].1.contains("poisoned message"),
        "{resets:?}"
    );
    let want = if panic_on_reset { 2 } else { 1 };
    // on_reset records the reset before it panics, on the server's worker: the count
    // follows a moment later.
    drive(&client, "the panics counted", || {
        server.stats().dispatcher_panics >= want
    });
    assert_eq!(server.stats().dispatcher_panics, want);
    assert_eq!(server.stats().sessions, 1);
    assert!(
        !client_log
            .resets
            .lock()
            .unwrap()
            .iter()
            .any(|(s, _)| *s == b),
        "the other session was reset too"
    );

    // The worker lives: the other session's messages still arrive, and a new session works.
    for t in 2..12 {
        send(&client, b, t);
    }
    drive(&client, "the other session's messages", || {
        server_log.msgs.lock().unwrap().len() == 12
    });
    let got: Vec<u16> = server_log
        .msgs
        .lock()
        .unwrap()
        .iter()
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(&got[2..], &(2..12).collect::<Vec<u16>>()[..]);
    let c = client.connect(&addr, policy).unwrap();
    drive(&client, "a new session", || {
        client_log.connected.lock().unwrap().contains(&c)
    });
    send(&client, c, 42);
    drive(&client, "the new session's message", || {
        server_log
            .msgs
            .lock()
            .unwrap()
            .iter()
            .any(|(_, t)| *t == 42)
    });
    assert_eq!(server.stats().dispatcher_panics, want);
}

#[test]
fn a_panic_in_on_message_resets_its_lossless_session_and_the_worker_goes_on() {
    let _g = support::serial();
    panicking_on_message_ends_only_its_session(Policy::Lossless, false);
}

#[test]
fn a_panic_in_on_message_resets_its_lossy_session_and_the_worker_goes_on() {
    let _g = support::serial();
    panicking_on_message_ends_only_its_session(Policy::Lossy, false);
}

/// on_reset panicking as well (called for the session the first panic ended): counted
/// too, and nothing else happens to the session (it is gone).
#[test]
fn a_panic_in_on_reset_is_counted_and_harmless() {
    let _g = support::serial();
    panicking_on_message_ends_only_its_session(Policy::Lossless, true);
}

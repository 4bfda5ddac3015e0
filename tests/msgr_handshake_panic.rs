//! A panic on a listener's handshake thread (here the application's region filter, which
//! runs while the hello is built) does not end the thread silently: it is caught, counted
//! (`HandshakeCounters::panics`, C `rdmx_handshake_counters.panics`), logged at error level,
//! the handshake fails (`accept` returns its error, the client's connect fails) and its slot
//! is freed. Before, the slot stayed taken: with `handshake_max = 1` every later client was
//! refused.

use rdmx::config::Config;
use rdmx::msgr::{Context, Region};
use rdmx::rc::verbs::access;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

const T: Duration = Duration::from_secs(10);

fn ctx(handshake_max: &str) -> Context {
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    c.set("handshake_max", handshake_max).unwrap();
    Context::new(&c).unwrap()
}

#[test]
fn a_panicking_handshake_is_caught_counted_and_frees_its_slot() {
    let server = ctx("1");
    let client = ctx("256");
    // A region with remote access, so that the hello asks the filter about it.
    let pool = server
        .pool(4096, 16, access::REMOTE_READ | access::LOCAL_WRITE)
        .unwrap();
    let chunk = pool.get().unwrap();
    let panicking = Arc::new(AtomicBool::new(true));
    let p = Arc::clone(&panicking);
    server.set_region_filter(Some(Arc::new(move |_: Option<&str>, _: &Region| {
        assert!(
            !p.load(Ordering::Acquire),
            "a region filter panics on purpose"
        );
        true
    })));
    let l = server.listen("127.0.0.1:0").unwrap();
    let addr = format!("127.0.0.1:{}", l.local_addr().port());
    let (flipped_tx, flipped) = mpsc::channel();
    let srv = std::thread::spawn(move || {
        let first = l.accept(Some(T)).map(|_| ());
        let panics = l.counters().panics;
        panicking.store(false, Ordering::Release);
        flipped_tx.send(()).unwrap();
        let second = l.accept(Some(T));
        (first, panics, second.map(|_| ()), l.counters().panics)
    });

    let e = client.connect(&addr, T).err();
    assert!(e.is_some(), "the first handshake fails on both sides");
    flipped.recv_timeout(T).unwrap();
    let c = client.connect(&addr, T).expect("the slot was freed");
    let (first, panics, second, panics_after) = srv.join().unwrap();
    let why = first.unwrap_err();
    assert!(
        why.message()
            .contains("panicked: a region filter panics on purpose"),
        "{why}"
    );
    assert_eq!(panics, 1);
    assert!(second.is_ok(), "{second:?}");
    assert_eq!(panics_after, 1);
    assert!(!c.peer_regions().is_empty());
    drop((c, chunk, pool));
}

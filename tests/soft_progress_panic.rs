//! A panic in the soft device's progress thread does not end it silently (which would stop
//! every timer and, with progress=thread, every receive of the context): it is caught,
//! counted (`Context::progress_stats().progress_panics`), the device's QPs are failed, and
//! the thread goes on, so connections made afterwards work. The panic comes from a
//! completion hook (`Connection::on_first_completion`), which the progress thread runs
//! when a completion it produced lands in an empty CQ: a legitimate way for code outside
//! the device to run, and panic, on that thread. Soft provider only (verbs has no progress
//! thread and no such hook).

use rdmx::config::Config;
use rdmx::msgr::{Connection, Context};
use rdmx::provider::SendReq;
use rdmx::provider::Wc;
use rdmx::rc::verbs::send_flags;
use rdmx::rc::{Sge, WcStatus, WrOpcode, smallvec};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

mod support;

const LEN: usize = 8192;

fn ctx() -> Context {
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    // The progress thread receives (and so produces the READ's completion).
    c.set("progress", "thread").unwrap();
    Context::new(&c).unwrap()
}

/// Polls until `n` completions arrived (bounded: 10 s).
fn wait(c: &Connection, n: usize) -> Vec<Wc> {
    support::poll_for(c, n, Duration::from_secs(10))
}

fn read(cookie: u64, local: Sge, remote_addr: u64, rkey: u32) -> SendReq {
    SendReq {
        cookie,
        opcode: WrOpcode::RdmaRead,
        flags: send_flags::SIGNALED,
        sges: smallvec![local],
        remote_addr,
        rkey,
        imm: 0,
    }
}

#[test]
fn a_panicking_hook_on_the_progress_thread_is_caught_counted_and_survived() {
    if support::on_verbs() {
        return; // no progress thread, no completion hooks
    }
    let mut a_buf = vec![0u8; LEN];
    let mut b_buf: Vec<u8> = (0..LEN).map(support::pattern).collect();
    let (a, b) = (ctx(), ctx());
    // SAFETY: both buffers outlive their registrations (deregistered at the end, after
    // the connections are dropped).
    let (ma, mb) = unsafe { support::register_pair(&a, &mut a_buf, &b, &mut b_buf) };
    let local = |off: u64, len: u32| Sge {
        addr: ma.addr + off,
        length: len,
        lkey: ma.lkey,
    };
    assert_eq!(a.progress_stats().progress_panics, 0);

    let (ca, cb) = support::connect_pair(&a, &b, "127.0.0.1", "127.0.0.1");
    let ran = Arc::new(AtomicU32::new(0));
    let r = Arc::clone(&ran);
    let hooked = ca.on_first_completion(Arc::new(move || {
        r.fetch_add(1, Ordering::Relaxed);
        panic!("a completion hook panics on the progress thread");
    }));
    assert!(hooked, "a soft QP takes a completion hook");
    ca.post_send(&[read(1, local(0, 4096), mb.addr, mb.rkey)])
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while a.progress_stats().progress_panics == 0 {
        assert!(Instant::now() < end, "no panic counted within 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ran.load(Ordering::Relaxed), 1);
    assert_eq!(a.progress_stats().progress_panics, 1);
    // The device's QPs were failed: a later WR on `ca` does not succeed.
    // (The READ's own completion is lost: the hook runs before the entry is queued, and
    // the panic unwound through that push. The QP is in error instead.)
    match ca.post_send(&[read(2, local(4096, 4096), mb.addr, mb.rkey)]) {
        Err(_) => {}
        Ok(_) => {
            let c = wait(&ca, 1);
            assert_eq!(c.len(), 1, "the WR posted after the panic completes");
            assert_ne!(c[0].status, WcStatus::Success, "{:?}", c[0]);
        }
    }
    drop((ca, cb));

    // The thread goes on: a new connection on the same context moves bytes (with
    // progress=thread nothing would receive them otherwise).
    let (ca, cb) = support::connect_pair(&a, &b, "127.0.0.1", "127.0.0.1");
    ca.post_send(&[read(3, local(0, LEN as u32), mb.addr, mb.rkey)])
        .unwrap();
    let c = wait(&ca, 1);
    assert_eq!(c.len(), 1, "the READ after the panic completed");
    assert_eq!(c[0].status, WcStatus::Success, "{:?}", c[0]);
    assert_eq!(a_buf, b_buf);
    assert_eq!(a.progress_stats().progress_panics, 1);
    // The other context's thread never panicked.
    assert_eq!(b.progress_stats().progress_panics, 0);
    drop((ca, cb));
    a.deregister(ma.lkey).unwrap();
    b.deregister(mb.lkey).unwrap();
}

//! The CQ overflow cliff through the public API (`Connection::cq_overflows`, which
//! `rdmx-perf tune`'s CQ sweep reports): a send CQ of exactly its WRs (1x, the smallest the
//! configuration accepts) holds every completion of a caller that polls before it posts
//! again; a caller that keeps posting into freed send-queue slots without polling overruns
//! it, the completions that do not fit are counted, and the QP goes to error as a NIC's does
//! on IBV_EVENT_CQ_ERR. Soft provider only (verbs: the NIC raises CQ_ERR, no count: None).

use rdmx::config::Config;
use rdmx::msgr::{Connection, Context};
use rdmx::provider::SendReq;
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{QpState, Sge, WrOpcode, smallvec};
use std::time::{Duration, Instant};

mod support;

const WRS: usize = 4;

fn ctx() -> Context {
    let mut c = Config::new();
    for (k, v) in [
        ("soft_port", "0"),
        ("max_send_wr", "4"),
        ("send_cq_size", "4"),
        ("post_batch", "4"),
        ("signal_interval", "1"),
        // The engine completes WRs while nobody polls.
        ("progress", "thread"),
    ] {
        c.set(k, v).unwrap();
    }
    Context::new(&c).unwrap()
}

fn write(conn: &Connection, cookie: u64, lkey: u32, addr: u64, raddr: u64, rkey: u32) -> bool {
    let wr = SendReq {
        cookie,
        opcode: WrOpcode::RdmaWrite,
        flags: send_flags::SIGNALED,
        sges: smallvec![Sge {
            addr,
            length: 64,
            lkey,
        }],
        remote_addr: raddr,
        rkey,
        imm: 0,
    };
    conn.post_send(std::slice::from_ref(&wr))
        .is_ok_and(|n| n == 1)
}

#[test]
fn posting_without_polling_overruns_a_1x_cq_and_is_counted() {
    if support::on_verbs() {
        eprintln!("skipping: the verbs provider counts no CQ overflows (the NIC raises CQ_ERR)");
        return;
    }
    // Declared before the contexts: dropped after them and their connections.
    let mut target = vec![0u8; 4096];
    let mut src = vec![7u8; 4096];
    let (a, b) = (ctx(), ctx());
    // SAFETY: `target` outlives the contexts (declared before them).
    unsafe {
        b.register(
            target.as_mut_ptr(),
            target.len(),
            access::LOCAL_WRITE | access::REMOTE_WRITE,
        )
    }
    .unwrap();
    let (ca, _cb) = support::connect_pair(&a, &b, "127.0.0.1", "127.0.0.1");
    let region = ca.peer_regions()[0];
    // SAFETY: as above.
    let mr = unsafe { a.register(src.as_mut_ptr(), src.len(), access::LOCAL_WRITE) }.unwrap();
    assert_eq!(ca.cq_overflows(), Some(0));

    // Keep posting as send-queue slots free up, never polling: the 5th completion finds
    // the CQ full. Bounded: 10 s, 1000 posts.
    let end = Instant::now() + Duration::from_secs(10);
    let mut posted = 0u64;
    while ca.cq_overflows() == Some(0) && Instant::now() < end && posted < 1000 {
        if write(&ca, posted, mr.lkey, mr.addr, region.addr, region.rkey) {
            posted += 1;
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let overflows = ca.cq_overflows().unwrap();
    assert!(
        overflows > 0,
        "{posted} WRITEs posted without polling, no overflow of a {WRS}-entry CQ"
    );
    assert!(posted > WRS as u64, "{posted}");
    // The overrun puts the QP in error, as a NIC's CQ_ERR does.
    let end = Instant::now() + Duration::from_secs(5);
    while ca.qp_state() != QpState::Err && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(ca.qp_state(), QpState::Err);
}

#[test]
fn a_caller_that_polls_before_posting_again_never_overruns_a_1x_cq() {
    if support::on_verbs() {
        eprintln!("skipping: soft provider only");
        return;
    }
    let mut target = vec![0u8; 4096];
    let mut src = vec![7u8; 4096];
    let (a, b) = (ctx(), ctx());
    // SAFETY: `target` outlives the contexts (declared before them).
    unsafe {
        b.register(
            target.as_mut_ptr(),
            target.len(),
            access::LOCAL_WRITE | access::REMOTE_WRITE,
        )
    }
    .unwrap();
    let (ca, _cb) = support::connect_pair(&a, &b, "127.0.0.1", "127.0.0.1");
    let region = ca.peer_regions()[0];
    // SAFETY: as above.
    let mr = unsafe { a.register(src.as_mut_ptr(), src.len(), access::LOCAL_WRITE) }.unwrap();
    let mut wcs = [support::empty_wc(); 8];
    let (mut outstanding, mut done, mut next) = (0usize, 0usize, 0u64);
    let end = Instant::now() + Duration::from_secs(10);
    // 200 WRITEs, at most WRS outstanding: a slot is reused only after its completion was
    // polled (what rdmx-perf's clients do).
    while done < 200 && Instant::now() < end {
        // Exactly 200 posted: more (a last batch past 200) would make `done` overshoot.
        while outstanding < WRS
            && next < 200
            && write(&ca, next, mr.lkey, mr.addr, region.addr, region.rkey)
        {
            outstanding += 1;
            next += 1;
        }
        let n = ca.poll(&mut wcs);
        outstanding -= n;
        done += n;
        if n == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    assert_eq!(done, 200, "completions polled");
    assert_eq!(ca.cq_overflows(), Some(0));
    assert_ne!(ca.qp_state(), QpState::Err);
}

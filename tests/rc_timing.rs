//! Timer semantics on the virtual clock, table-driven over parameter sets that include the
//! seed's Ceph profiles: against a black-holed peer RETRY_EXC_ERR arrives after
//! (retry_cnt + 1) x timeout; against a responder with no receives, exactly rnr_retry + 1
//! RNR NAKs precede RNR_RETRY_EXC_ERR, spaced by the responder's min_rnr_timer;
//! rnr_retry = 7 never errors.

mod common;

use common::{Faults, Params, Sim};
use rdmx::config::encoding::{ack_timeout_ns, rnr_timer_ns};
use rdmx::rc::verbs::access;
use rdmx::rc::{QpCaps, QpState, SendWr, Sge, WcStatus, WrOpcode, smallvec};

/// One "tick" of tolerance: the simulator jumps straight to deadlines, so timers fire
/// exactly on time; 1 us covers any rounding a change might introduce.
const TICK_NS: u64 = 1_000;

fn post_sends(sim: &mut Sim, n: u64) {
    sim.nodes[0]
        .mem
        .add_region(0x1000, 4096, 1, 0, access::LOCAL_WRITE);
    for i in 0..n {
        let sge = Sge {
            addr: 0x1000,
            length: 64,
            lkey: 1,
        };
        // Only the first is signaled: error completions must come for all of them anyway.
        let flags = if i == 0 {
            rdmx::rc::verbs::send_flags::SIGNALED
        } else {
            0
        };
        sim.nodes[0]
            .qp
            .post_send(SendWr {
                wr_id: i,
                opcode: WrOpcode::Send,
                flags,
                sges: smallvec![sge],
                remote_addr: 0,
                rkey: 0,
                imm: 0,
            })
            .unwrap();
    }
}

/// Runs until node A has a completion (or `limit`); returns (time, completions).
fn run_until_completion(sim: &mut Sim, limit: u64) -> (u64, Vec<rdmx::rc::Completion>) {
    loop {
        let busy = sim.advance(limit);
        let done: Vec<_> = std::iter::from_fn(|| sim.nodes[0].qp.poll_completion()).collect();
        if !done.is_empty() || !busy {
            return (sim.now, done);
        }
    }
}

#[test]
fn black_holed_peer_gives_retry_exc_err_after_retry_cnt_plus_one_timeouts() {
    // (name, timeout code, retry_cnt)
    let table = [
        ("ceph-before", 14u8, 7u8),
        ("ceph-after", 10, 7),
        ("no retries", 8, 0),
        ("three retries", 5, 3),
        ("shortest timer", 1, 2),
    ];
    for (name, timeout, retry_cnt) in table {
        let p = Params {
            timeout,
            retry_cnt,
            ..Params::default()
        };
        let faults = Faults {
            partition: Some((0, u64::MAX)),
            ..Faults::NONE
        };
        let mut sim = Sim::pair(1, faults, p, p, QpCaps::default(), 0, 0);
        post_sends(&mut sim, 3);
        let (t, done) = run_until_completion(&mut sim, 100_000_000_000_000);
        let expected = (u64::from(retry_cnt) + 1) * ack_timeout_ns(timeout).unwrap();
        assert!(
            t.abs_diff(expected) <= TICK_NS,
            "{name}: RETRY_EXC_ERR at {t} ns, expected {expected} ns"
        );
        // The failed WR first, then the rest flushed, all completed though unsignaled.
        let got: Vec<_> = done.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            got,
            vec![
                (0, WcStatus::RetryExcErr),
                (1, WcStatus::WrFlushErr),
                (2, WcStatus::WrFlushErr)
            ],
            "{name}"
        );
        let c = sim.nodes[0].qp.counters();
        assert_eq!(
            c.retransmits,
            u64::from(retry_cnt) * 3,
            "{name}: each retry resends the 3 SENDs"
        );
        assert_eq!(c.ack_timeouts, u64::from(retry_cnt) + 1, "{name}");
        assert_eq!(sim.nodes[0].qp.state(), QpState::Err, "{name}");
        // The figures a driver reports with the error.
        let f = *sim.nodes[0].qp.failure().expect("failure figures");
        assert_eq!(f.status, WcStatus::RetryExcErr, "{name}");
        assert_eq!(f.at_ns, t, "{name}");
        assert!(f.silent_ns.abs_diff(expected) <= TICK_NS, "{name}: {f:?}");
        assert_eq!(
            (f.ack_timeouts, f.retries, f.timeout, f.retry_cnt),
            (
                u32::from(retry_cnt) + 1,
                u32::from(retry_cnt),
                timeout,
                retry_cnt
            ),
            "{name}"
        );
    }
}

#[test]
fn timeout_zero_means_no_ack_timer() {
    let p = Params {
        timeout: 0,
        ..Params::default()
    };
    let faults = Faults {
        partition: Some((0, u64::MAX)),
        ..Faults::NONE
    };
    let mut sim = Sim::pair(1, faults, p, p, QpCaps::default(), 0, 0);
    post_sends(&mut sim, 1);
    let (_, done) = run_until_completion(&mut sim, 1_000_000_000_000);
    assert!(
        done.is_empty(),
        "no timer: the WR waits forever, never errors"
    );
    assert_eq!(sim.nodes[0].qp.next_deadline(), None);
    assert_eq!(sim.nodes[0].qp.state(), QpState::Rts);
}

/// Times at which node A received an RNR NAK.
fn rnr_nak_times(sim: &Sim) -> Vec<u64> {
    sim.trace
        .as_ref()
        .unwrap()
        .iter()
        .filter(|(_, to, _)| *to == 0)
        .filter_map(|(t, _, b)| {
            let (h, _) = common::parse(b).ok()?;
            h.aeth
                .filter(|a| matches!(a.syndrome, rdmx::wire::Syndrome::RnrNak { .. }))
                .map(|_| *t)
        })
        .collect()
}

#[test]
fn rnr_naks_follow_rnr_retry_and_the_responders_min_rnr_timer() {
    // (name, requester rnr_retry, requester timeout, responder min_rnr_timer)
    let table = [
        ("ceph-before", 7u8, 14u8, 0u8),
        ("ceph-after", 2, 10, 12),
        ("no rnr retries", 0, 10, 12),
        ("ack timer shorter than the rnr wait", 3, 1, 14),
        ("six retries, 0.01 ms", 6, 10, 1),
        ("ceph-after timer, ceph-before wait", 2, 10, 0),
    ];
    for (name, rnr_retry, timeout, min_rnr_timer) in table {
        let pa = Params {
            rnr_retry,
            timeout,
            ..Params::default()
        };
        let pb = Params {
            min_rnr_timer,
            ..Params::default()
        };
        let mut sim = Sim::pair(2, Faults::NONE, pa, pb, QpCaps::default(), 0, 0);
        sim.trace = Some(Vec::new());
        post_sends(&mut sim, 2);
        let wait = rnr_timer_ns(min_rnr_timer).unwrap();
        if rnr_retry == 7 {
            // Infinite: 50 waits pass without an error (bounded by virtual time).
            let (_, done) = run_until_completion(&mut sim, 50 * wait + wait / 2);
            assert!(
                done.is_empty(),
                "{name}: rnr_retry=7 must never error: {done:?}"
            );
            let times = rnr_nak_times(&sim);
            assert_eq!(times.len(), 51, "{name}");
            assert!(
                times.windows(2).all(|w| w[1] - w[0] == wait),
                "{name}: spacing"
            );
            assert_eq!(sim.nodes[0].qp.state(), QpState::Rts);
            continue;
        }
        let (t, done) = run_until_completion(&mut sim, 1_000_000_000_000);
        let times = rnr_nak_times(&sim);
        assert_eq!(
            times.len(),
            usize::from(rnr_retry) + 1,
            "{name}: RNR NAKs before the error"
        );
        for w in times.windows(2) {
            assert_eq!(
                w[1] - w[0],
                wait,
                "{name}: spacing = responder's min_rnr_timer"
            );
        }
        assert_eq!(
            t,
            u64::from(rnr_retry) * wait,
            "{name}: error right at the last NAK"
        );
        let got: Vec<_> = done.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            got,
            vec![(0, WcStatus::RnrRetryExcErr), (1, WcStatus::WrFlushErr)],
            "{name}"
        );
        let f = *sim.nodes[0].qp.failure().expect("failure figures");
        assert_eq!(
            (
                f.status,
                f.retries,
                f.ack_timeouts,
                f.rnr_retry,
                f.peer_rnr_timer
            ),
            (
                WcStatus::RnrRetryExcErr,
                u32::from(rnr_retry),
                0,
                rnr_retry,
                min_rnr_timer
            ),
            "{name}: {f:?}"
        );
        let (a, b) = (sim.nodes[0].qp.counters(), sim.nodes[1].qp.counters());
        assert_eq!(a.rnr_naks_received, u64::from(rnr_retry) + 1, "{name}");
        assert_eq!(b.rnr_naks_sent, a.rnr_naks_received, "{name}");
        assert_eq!(
            a.ack_timeouts, 0,
            "{name}: the ACK timer never cuts an RNR wait short"
        );
    }
}

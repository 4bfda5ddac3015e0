//! Notifications through the verbs objects: completion channel records (one per arm,
//! solicited-only arming), SRQ receives and their events (SRQ_LIMIT_REACHED,
//! QP_LAST_WQE_REACHED), flush on error, QP_FATAL on an access error.

mod verbs_support;

use rdmx_ibv::verbs::*;
use std::time::Duration;
use verbs_support::*;

const SHORT: Duration = Duration::from_millis(200);

#[test]
fn completion_channel_one_event_per_arm_and_solicited_only() {
    let (a, b) = pair(
        "127.0.72.2",
        "127.0.72.3",
        &Opts::default(),
        &Opts::default(),
    );
    let fd = b.chan.fd();
    // Not armed: no event.
    b.post_recv(1, 0, 64);
    a.post(a.wr(1, WrOpcode::Send, 0, 8)).unwrap();
    assert_eq!(wait_wc(&b.rcq).wr_id, 1);
    assert!(read_record::<8>(fd, SHORT).is_none());
    // Armed: the CQ's handle, once.
    b.rcq.req_notify(false).unwrap();
    b.post_recv(2, 0, 64);
    b.post_recv(3, 0, 64);
    a.post(a.wr(2, WrOpcode::Send, 0, 8)).unwrap();
    a.post(a.wr(3, WrOpcode::Send, 0, 8)).unwrap();
    let rec = read_record::<8>(fd, WAIT).expect("a completion event");
    assert_eq!(u64::from_ne_bytes(rec), b.rcq.handle());
    assert_eq!(wait_wc(&b.rcq).wr_id, 2);
    assert_eq!(wait_wc(&b.rcq).wr_id, 3);
    assert!(read_record::<8>(fd, SHORT).is_none(), "one event per arm");
    // Solicited only: an unsolicited send completes without an event, a solicited one
    // signals.
    b.rcq.req_notify(true).unwrap();
    b.post_recv(4, 0, 64);
    b.post_recv(5, 0, 64);
    a.post(a.wr(4, WrOpcode::Send, 0, 8)).unwrap();
    assert_eq!(wait_wc(&b.rcq).wr_id, 4);
    assert!(read_record::<8>(fd, SHORT).is_none(), "not solicited");
    let mut wr = a.wr(5, WrOpcode::Send, 0, 8);
    wr.send_flags |= send_flags::SOLICITED;
    a.post(wr).unwrap();
    let rec = read_record::<8>(fd, WAIT).expect("a solicited event");
    assert_eq!(u64::from_ne_bytes(rec), b.rcq.handle());
    assert_eq!(wait_wc(&b.rcq).wr_id, 5);
    // The send side's CQ shares the channel: arming it reports its own handle.
    a.scq.req_notify(false).unwrap();
    let mut drained = [WorkCompletion::default(); 8];
    while a.scq.poll(&mut drained) > 0 {}
    b.post_recv(6, 0, 64);
    a.scq.req_notify(false).unwrap();
    a.post(a.wr(6, WrOpcode::Send, 0, 8)).unwrap();
    let rec = read_record::<8>(a.chan.fd(), WAIT).expect("a send completion event");
    assert!([a.scq.handle()].contains(&u64::from_ne_bytes(rec)));
    // A channel in use cannot be destroyed; a CQ in use neither.
    assert_eq!(a.chan.destroy().unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(a.scq.destroy().unwrap_err().kind(), ErrorKind::Busy);
}

#[test]
fn srq_feeds_its_qps_and_raises_limit_and_last_wqe_events() {
    let ob = Opts {
        srq: true,
        ..Opts::default()
    };
    let (a, b) = pair("127.0.72.4", "127.0.72.5", &Opts::default(), &ob);
    let srq = b.srq.as_ref().unwrap();
    // The QP's own post_recv is refused: receives come from the SRQ.
    let e =
        b.qp.post_recv(&[RecvWr {
            wr_id: 0,
            sg_list: b.sge(0, 64),
        }])
        .unwrap_err();
    assert_eq!((e.0, e.1.kind()), (0, ErrorKind::InvalidArgument));
    for i in 0..4 {
        b.post_srq_recv(i, i as usize * 64, 64);
    }
    srq.modify(
        &SrqAttr {
            srq_limit: 2,
            ..Default::default()
        },
        srq_attr_mask::LIMIT,
    )
    .unwrap();
    assert_eq!(srq.query().srq_limit, 2);
    for i in 0..3u64 {
        a.write(0, &[i as u8; 8]);
        a.post(a.wr(i, WrOpcode::Send, 0, 8)).unwrap();
        assert_eq!(wait_wc(&a.scq).status, 0);
        let r = wait_wc(&b.rcq);
        assert_eq!((r.wr_id, r.status, r.qp_num), (i, 0, b.qp.qp_num()));
        assert_eq!(b.read(i as usize * 64, 8), [i as u8; 8]);
    }
    // Below 2 WQEs left: SRQ_LIMIT_REACHED, once, and the limit is disarmed.
    assert_eq!(
        async_event(&b.dev, WAIT),
        Some((srq.handle(), event_type::SRQ_LIMIT_REACHED))
    );
    assert_eq!(srq.query().srq_limit, 0);
    // An empty SRQ means RNR: the sender waits (rnr_retry 7 = forever) until a WQE comes.
    a.post(a.wr(3, WrOpcode::Send, 0, 8)).unwrap();
    assert_eq!(wait_wc(&b.rcq).wr_id, 3);
    a.post(a.wr(4, WrOpcode::Send, 0, 8)).unwrap();
    no_wc(&b.rcq, Duration::from_millis(100));
    b.post_srq_recv(4, 0, 64);
    assert_eq!(wait_wc(&b.rcq).wr_id, 4);
    assert_eq!(wait_wc(&a.scq).status, 0);
    assert_eq!(wait_wc(&a.scq).status, 0);
    // The application moves B's QP to ERR: LAST_WQE_REACHED (no QP_FATAL: it asked).
    b.post_srq_recv(5, 0, 64);
    b.qp.modify(
        &QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        },
        attr_mask::STATE,
    )
    .unwrap();
    assert_eq!(
        async_event(&b.dev, WAIT),
        Some((b.qp.handle(), event_type::QP_LAST_WQE_REACHED))
    );
    assert!(async_event(&b.dev, SHORT).is_none());
    // The SRQ keeps its WQE (it was never taken), the SRQ cannot go while the QP uses it.
    assert_eq!(srq.destroy().unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(b.qp.query(0).0.cur_qp_state, QpState::Err);
}

#[test]
fn flush_on_error_and_posting_in_the_wrong_state() {
    let a = Side::new("127.0.72.6", &Opts::default());
    let b = Side::new("127.0.72.7", &Opts::default());
    // RESET: no receives, no sends.
    let e =
        a.qp.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: a.sge(0, 8),
        }])
        .unwrap_err();
    assert_eq!(e.1.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        a.post(a.wr(1, WrOpcode::Send, 0, 8)).unwrap_err().1.kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(a.qp.query(0).0.cur_qp_state, QpState::Reset);
    // INIT takes receives, refuses sends; RTR likewise.
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    let mask = attr_mask::STATE | attr_mask::PKEY_INDEX | attr_mask::PORT | attr_mask::ACCESS_FLAGS;
    a.qp.modify(&init, mask).unwrap();
    assert_eq!(a.qp.state(), QpState::Init);
    a.post_recv(1, 0, 8);
    a.post_recv(2, 8, 8);
    assert_eq!(
        a.post(a.wr(1, WrOpcode::Send, 0, 8)).unwrap_err().1.kind(),
        ErrorKind::InvalidArgument
    );
    // A transition the state machine does not allow, and a missing attribute.
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    assert_eq!(
        a.qp.modify(&rts, attr_mask::STATE).unwrap_err().kind(),
        ErrorKind::InvalidValue
    );
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..Default::default()
    };
    assert!(a.qp.modify(&rtr, attr_mask::STATE).is_err());
    assert_eq!(a.qp.state(), QpState::Init, "nothing changed");
    // CUR_STATE that does not match.
    let bad = QpAttr {
        qp_state: QpState::Err,
        cur_qp_state: QpState::Rts,
        ..Default::default()
    };
    assert_eq!(
        a.qp.modify(&bad, attr_mask::STATE | (1 << 1))
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    // ERR: every outstanding receive flushes; a post flushes at once; no QP_FATAL (the
    // application asked).
    a.qp.modify(
        &QpAttr {
            qp_state: QpState::Err,
            cur_qp_state: QpState::Init,
            ..Default::default()
        },
        attr_mask::STATE | (1 << 1),
    )
    .unwrap();
    for id in [1, 2] {
        let w = wait_wc(&a.rcq);
        assert_eq!((w.wr_id, w.status), (id, WcStatus::WrFlushErr as u32));
    }
    a.post(a.wr(9, WrOpcode::Send, 0, 8)).unwrap();
    let w = wait_wc(&a.scq);
    assert_eq!((w.wr_id, w.status), (9, WcStatus::WrFlushErr as u32));
    assert!(async_event(&a.dev, SHORT).is_none());
    // RESET, then up again towards B: works like a fresh QP.
    a.qp.modify(
        &QpAttr {
            qp_state: QpState::Reset,
            ..Default::default()
        },
        attr_mask::STATE,
    )
    .unwrap();
    bring_up(&a, &b, 14, 7);
    bring_up(&b, &a, 14, 7);
    b.post_recv(7, 0, 8);
    a.post(a.wr(7, WrOpcode::Send, 0, 8)).unwrap();
    assert_eq!(wait_wc(&b.rcq).status, 0);
    assert_eq!(wait_wc(&a.scq).status, 0);
}

#[test]
fn a_read_without_remote_read_access_fails_both_qps() {
    let ob = Opts {
        access: access::LOCAL_WRITE | access::REMOTE_WRITE,
        ..Opts::default()
    };
    let (a, b) = pair("127.0.72.8", "127.0.72.9", &Opts::default(), &ob);
    a.post_recv(1, 0, 8);
    let mut wr = a.wr(5, WrOpcode::RdmaRead, 0, 64);
    wr.remote_addr = b.addr(0);
    wr.rkey = b.mr.rkey;
    a.post(wr).unwrap();
    let w = wait_wc(&a.scq);
    assert_eq!((w.wr_id, w.status), (5, WcStatus::RemAccessErr as u32));
    // The requester's QP went to ERR: its receive flushes. The error completion reported
    // it, so no async event as well (as NICs: an affiliated event is for errors no
    // completion can report).
    let w = wait_wc(&a.rcq);
    assert_eq!((w.wr_id, w.status), (1, WcStatus::WrFlushErr as u32));
    assert_eq!(a.qp.state(), QpState::Err);
    // The responder had no WR to fail (a READ consumes none): it NAKed, went to ERR and
    // raises QP_FATAL (its progress thread did it).
    assert_eq!(
        async_event(&b.dev, WAIT),
        Some((b.qp.handle(), event_type::QP_FATAL))
    );
    assert_eq!(async_event(&a.dev, Duration::from_millis(200)), None);
}

/// `ibv_req_notify_cq` (verbs contract): completions queued when the CQ is armed raise no
/// event; the next new one does, once. (perftest's `-e` loops poll once per event: an
/// event for an old entry made them read an empty CQ.)
#[test]
fn arming_does_not_signal_for_completions_already_queued() {
    let (a, b) = pair(
        "127.0.73.2",
        "127.0.73.3",
        &Opts::default(),
        &Opts::default(),
    );
    let fd = b.chan.fd();
    b.post_recv(1, 0, 64);
    b.post_recv(2, 64, 64);
    a.post(a.wr(1, WrOpcode::Send, 0, 8)).unwrap();
    // Acknowledged: b's receive completion is queued (b has not polled).
    assert_eq!(wait_wc(&a.scq).status, 0);
    b.rcq.req_notify(false).unwrap();
    assert!(
        read_record::<8>(fd, SHORT).is_none(),
        "an event for a completion queued before the arming"
    );
    a.post(a.wr(2, WrOpcode::Send, 0, 8)).unwrap();
    let rec = read_record::<8>(fd, WAIT).expect("an event for the new completion");
    assert_eq!(u64::from_ne_bytes(rec), b.rcq.handle());
    assert_eq!(wait_wc(&b.rcq).wr_id, 1);
    assert_eq!(wait_wc(&b.rcq).wr_id, 2);
    assert!(read_record::<8>(fd, SHORT).is_none(), "one event per arm");
    assert_eq!(wait_wc(&a.scq).status, 0);
}

/// Solicited-only arming: an error completion (a receive flushed when the QP goes to
/// ERR) signals too.
#[test]
fn solicited_only_arming_signals_an_error_completion() {
    let (_a, b) = pair(
        "127.0.73.4",
        "127.0.73.5",
        &Opts::default(),
        &Opts::default(),
    );
    b.post_recv(1, 0, 64);
    b.rcq.req_notify(true).unwrap();
    b.qp.modify(
        &QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        },
        attr_mask::STATE,
    )
    .unwrap();
    let rec = read_record::<8>(b.chan.fd(), WAIT).expect("an event for the flush");
    assert_eq!(u64::from_ne_bytes(rec), b.rcq.handle());
    let w = wait_wc(&b.rcq);
    assert_eq!((w.wr_id, w.status), (1, WcStatus::WrFlushErr as u32));
}

/// `ibv_rc_pingpong -e` arms, polls once, posts its answer and sleeps on the channel: with
/// a CQ armed the answer leaves at once (it waited for the next poll, up to the handover
/// time: 1.1 ms per iteration), and the progress thread receives for the sleeper.
#[test]
fn with_a_cq_armed_posts_leave_at_once_and_the_thread_receives() {
    let (a, b) = pair(
        "127.0.73.6",
        "127.0.73.7",
        &Opts::default(),
        &Opts::default(),
    );
    let mut wc = [WorkCompletion::default(); 4];
    for i in 0..20u64 {
        b.post_recv(i, 0, 64);
        b.rcq.req_notify(false).unwrap();
        a.scq.req_notify(false).unwrap();
        a.scq.poll(&mut wc); // a polled just now, and would batch without the arming
        let before = a.qp.counters().tx_packets;
        a.post(a.wr(i, WrOpcode::Send, 0, 8)).unwrap();
        assert_eq!(
            a.qp.counters().tx_packets - before,
            1,
            "round {i}: the post waited for a poll that does not come"
        );
        assert!(a.dev.soft().thread_receives());
        // b sleeps on its channel; its progress thread receives.
        let rec = read_record::<8>(b.chan.fd(), WAIT).expect("b's event");
        assert_eq!(u64::from_ne_bytes(rec), b.rcq.handle());
        assert_eq!(wait_wc(&b.rcq).wr_id, i);
        let rec = read_record::<8>(a.chan.fd(), WAIT).expect("a's event");
        assert_eq!(u64::from_ne_bytes(rec), a.scq.handle());
        assert_eq!(wait_wc(&a.scq).status, 0);
    }
}

/// `ib_write_lat`: each side polls its send CQ, then spins on the last byte of its buffer
/// until the peer's RDMA WRITE lands, without polling. The progress thread learns that
/// datagrams wait for an application that polls only now and then, and receives for it.
#[test]
fn a_program_spinning_on_memory_gets_its_writes_landed_by_the_progress_thread() {
    let (a, b) = pair(
        "127.0.73.8",
        "127.0.73.9",
        &Opts::default(),
        &Opts::default(),
    );
    let mut wc = [WorkCompletion::default(); 4];
    let mut learned = false;
    let mut lands = Vec::new();
    for i in 1..=300u32 {
        b.scq.poll(&mut wc); // b polled just now (for its own sends, as ib_write_lat)
        let byte = (i % 251) as u8;
        a.write(0, &[byte; 8]);
        let mut w = a.wr(u64::from(i), WrOpcode::RdmaWrite, 0, 8);
        w.remote_addr = b.addr(0);
        w.rkey = b.mr.rkey;
        let t = std::time::Instant::now();
        a.post(w).unwrap();
        // Rings a's doorbell (and may already find the completion).
        let got = a.scq.poll(&mut wc);
        // b spins on memory.
        while b.read(7, 1)[0] != byte {
            assert!(t.elapsed() < WAIT, "round {i}: the WRITE never landed");
            std::hint::spin_loop();
        }
        lands.push(t.elapsed());
        learned |= b.dev.soft().thread_receives();
        if got == 0 {
            wc[0] = wait_wc(&a.scq);
        }
        assert_eq!((wc[0].wr_id, wc[0].status), (u64::from(i), 0));
    }
    lands.sort();
    eprintln!(
        "WRITE landed after p50 {:?}, p90 {:?} (handover 1 ms)",
        lands[lands.len() / 2],
        lands[lands.len() * 9 / 10]
    );
    assert!(
        learned,
        "b's progress thread never took over receiving for the memory spinner"
    );
    assert!(b.dev.soft().thread_takeovers() >= 1);
}

/// A polling program on a busy host (`ibv_rc_pingpong` on 2 cores, both processes
/// running): it polls its CQs, but is preempted for a few hundred microseconds between
/// polls, less than the handover time (1 ms), so the progress thread's looks find the
/// peer's SENDs and ACKs waiting for it. Those end in completions it polls for: the thread
/// must not take over receiving, which cost every packet a thread wakeup (1.8x slower
/// polling `ibv_rc_pingpong`). The two sides of one process stand for two programs: each
/// polls both its CQs, answers what it received, then is "preempted" (sleeps).
#[test]
fn a_preempted_polling_program_keeps_receiving_itself() {
    const ROUNDS: u64 = 150;
    const PREEMPTED: Duration = Duration::from_micros(300);
    let (a, b) = pair(
        "127.0.75.2",
        "127.0.75.3",
        &Opts::default(),
        &Opts::default(),
    );
    let mut wc = [WorkCompletion::default(); 4];
    b.post_recv(0, 0, 64);
    a.post_recv(0, 64, 64);
    a.post(a.wr(0, WrOpcode::Send, 0, 8)).unwrap();
    // Pings a sent and pongs b sent, and when the exchange must be over.
    let (mut pings, mut pongs) = (1u64, 0u64);
    let deadline = std::time::Instant::now() + WAIT;
    let mut taken_for_waiter = Vec::new();
    while pongs < ROUNDS || pings <= ROUNDS {
        assert!(
            std::time::Instant::now() < deadline,
            "ping-pong stuck at ping {pings}, pong {pongs}"
        );
        // a polls: each pong it receives is answered with the next ping.
        while a.scq.poll(&mut wc) > 0 {
            assert_eq!(wc[0].status, 0);
        }
        while a.rcq.poll(&mut wc[..1]) > 0 {
            assert_eq!(wc[0].status, 0);
            if pings <= ROUNDS {
                a.post_recv(pings, 64, 64);
                a.post(a.wr(pings, WrOpcode::Send, 0, 8)).unwrap();
                pings += 1;
            }
        }
        std::thread::sleep(PREEMPTED);
        // b polls: each ping is answered with a pong.
        while b.scq.poll(&mut wc) > 0 {
            assert_eq!(wc[0].status, 0);
        }
        while b.rcq.poll(&mut wc[..1]) > 0 {
            assert_eq!(wc[0].status, 0);
            b.post_recv(wc[0].wr_id + 1, 0, 64);
            b.post(b.wr(wc[0].wr_id, WrOpcode::Send, 0, 8)).unwrap();
            pongs += 1;
        }
        std::thread::sleep(PREEMPTED);
        for (side, d) in [("a", &a), ("b", &b)] {
            if d.dev.soft().thread_receives() {
                taken_for_waiter.push((side, pings));
            }
        }
    }
    assert!(
        taken_for_waiter.is_empty(),
        "the progress thread took a polling program for a waiter {} times over {ROUNDS} rounds (side, at ping; first ones): {:?}",
        taken_for_waiter.len(),
        &taken_for_waiter[..taken_for_waiter.len().min(6)]
    );
    assert_eq!(
        (
            a.dev.soft().thread_takeovers(),
            b.dev.soft().thread_takeovers()
        ),
        (0, 0)
    );
}

/// `polling_us` is the inline handover time, capped at 1 ms: 1.5 ms after its last poll an
/// application with polling_us = 5000 no longer counts as polling (its post leaves at
/// once); with polling_us = 0 it never does.
#[test]
fn polling_us_is_the_handover_capped_at_one_ms() {
    for (polling_us, wait) in [("5000", Duration::from_micros(1500)), ("0", Duration::ZERO)] {
        let o = Opts {
            extra: vec![("polling_us", polling_us)],
            ..Opts::default()
        };
        let (ip_a, ip_b) = if polling_us == "0" {
            ("127.0.73.10", "127.0.73.11")
        } else {
            ("127.0.73.12", "127.0.73.13")
        };
        let (a, b) = pair(ip_a, ip_b, &o, &Opts::default());
        let mut wc = [WorkCompletion::default(); 1];
        a.scq.poll(&mut wc);
        std::thread::sleep(wait);
        let before = a.qp.counters().tx_packets;
        let mut w = a.wr(1, WrOpcode::RdmaWrite, 0, 8);
        w.remote_addr = b.addr(0);
        w.rkey = b.mr.rkey;
        a.post(w).unwrap();
        assert_eq!(
            a.qp.counters().tx_packets - before,
            1,
            "polling_us {polling_us}: the post was held for a poll"
        );
        assert_eq!(wait_wc(&a.scq).status, 0);
    }
}

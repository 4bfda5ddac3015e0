//! Each rule on literal inputs: headers built by hand, times as offsets from one instant.

use super::*;
use crate::error::{Error, ErrorKind};
use crate::msgr::messenger::wire::{Header, Kind, flags};
use std::time::{Duration, Instant};

/// The rules the machine tests run with (`paths_tests.rs` too, with a longer send queue).
pub(super) fn rules() -> Rules {
    Rules {
        keepalive: Some(Duration::from_millis(100)),
        probe: None,
        keepalive_timeout: Duration::from_millis(500),
        reconnect_min: Duration::from_millis(10),
        reconnect_max: Duration::from_millis(40),
        reconnect_timeout: Duration::from_millis(1000),
        reconnect_attempts: 0,
        send_queue_msgs: 4,
        send_queue_bytes: 1 << 20,
        recv_window_min: 4,
        recv_window: 16,
        eager_write: false,
        path_failback: true,
    }
}

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(super) fn shape() -> Shape {
    Shape {
        bytes: 100,
        sq_need: 1,
        front_len: 100,
        ..Shape::default()
    }
}

/// The rules of the multipath and active/active tests: [`rules`] with a 16-message send
/// queue.
pub(super) fn multipath_rules() -> Rules {
    Rules {
        send_queue_msgs: 16,
        ..rules()
    }
}

/// The headers posted, in order, with the link each went on.
pub(super) fn posted_on(acts: &[Action]) -> Vec<(u64, Header)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Post { link, header, .. } => Some((*link, *header)),
            _ => None,
        })
        .collect()
}

/// The send completions reported, with their results.
pub(super) fn send_results(acts: &[Action]) -> Vec<(u64, Result<(), Error>)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Notify(Notice::SendDone(s, r)) => Some((*s, r.clone())),
            _ => None,
        })
        .collect()
}

/// A link's failure as a completion reports it.
pub(super) fn retry_exc() -> Error {
    Error::fixed(ErrorKind::Closed, "completion with status RETRY_EXC_ERR")
}

pub(super) fn actions(m: &mut Machine<u32>) -> Vec<Action> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

/// The headers posted, in order.
fn posted(acts: &[Action]) -> Vec<Header> {
    posted_on(acts).into_iter().map(|(_, h)| h).collect()
}

fn done(acts: &[Action]) -> Vec<(u64, bool)> {
    send_results(acts)
        .into_iter()
        .map(|(s, r)| (s, r.is_ok()))
        .collect()
}

fn has_reset(acts: &[Action]) -> bool {
    acts.iter()
        .any(|a| matches!(a, Action::Notify(Notice::Reset(_))))
}

pub(super) fn room() -> SqRoom {
    SqRoom {
        free: 64,
        reserve: 1,
    }
}

/// A connecting machine whose link is up and whose peer (id 0x200) answered its hello
/// with `credits` credits: returns it, its link and the hello it sent.
fn open_connector(policy: Policy, t0: Instant, credits: u32) -> (Machine<u32>, u64, Header) {
    open_connector_posting(policy, t0, credits, 4)
}

/// [`open_connector`] with `posted` receives on its link.
fn open_connector_posting(
    policy: Policy,
    t0: Instant,
    credits: u32,
    posted: u32,
) -> (Machine<u32>, u64, Header) {
    let mut a = Machine::new(rules(), 0x100, policy, false, t0);
    a.handle_timeout(t0);
    assert!(matches!(actions(&mut a)[..], [Action::Connect { path: 0 }]));
    let lid = a.link_up(t0, 0, rules().credits(posted), HelloId::default());
    let hello = self::posted(&actions(&mut a))[0];
    let mut answer = Header::new(Kind::Hello);
    answer.aux = 0x200;
    answer.aux2 = 0x100;
    answer.credits = credits;
    assert_eq!(a.on_frame(t0, lid, &answer), Verdict::Consumed);
    assert!(
        actions(&mut a)
            .iter()
            .any(|x| matches!(x, Action::Notify(Notice::Connected)))
    );
    (a, lid, hello)
}

fn ack(n: u64, credits: u32) -> Header {
    let mut h = Header::new(Kind::Ack);
    h.ack = n;
    h.credits = credits;
    h
}

pub(super) fn msg(seq: u64) -> Header {
    let mut h = Header::new(Kind::Msg);
    h.seq = seq;
    h
}

#[test]
fn hello_carries_identity_and_announces_the_posted_receives() {
    let t0 = Instant::now();
    let (_, _, hello) = open_connector(Policy::Lossy, t0, 3);
    assert_eq!(hello.kind(), Some(Kind::Hello));
    assert_eq!((hello.aux, hello.aux2, hello.aux3), (0x100, 0, 0));
    assert!(hello.has(flags::LOSSY));
    // 4 receives posted: the hello's own receive at the peer is the one both sides post
    // beyond the announced ones.
    assert_eq!(hello.credits, 3);
}

#[test]
fn a_cumulative_ack_completes_sends_in_order_and_ready_follows_full() {
    let t0 = Instant::now();
    let (mut a, lid, _) = open_connector(Policy::Lossless, t0, 8);
    for i in 0..4 {
        assert_eq!(a.enqueue(i, shape()).unwrap(), u64::from(i) + 1);
    }
    let e = a.enqueue(9, shape()).unwrap_err();
    assert_eq!(e.1.kind(), ErrorKind::Full);
    a.pump(t0, room());
    let acts = actions(&mut a);
    let seqs: Vec<u64> = posted(&acts).iter().map(|h| h.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4]);
    assert_eq!(a.on_frame(t0, lid, &ack(2, 0)), Verdict::Consumed);
    let acts = actions(&mut a);
    assert_eq!(done(&acts), vec![(1, true), (2, true)]);
    assert!(matches!(acts.last(), Some(Action::Notify(Notice::Ready))));
    assert_eq!(a.unacked_len(), 2);
    // An older ack again changes nothing.
    a.on_frame(t0, lid, &ack(1, 0));
    assert!(done(&actions(&mut a)).is_empty());
}

#[test]
fn data_keeps_a_control_credit_and_waits_for_grants() {
    let t0 = Instant::now();
    let (mut a, lid, _) = open_connector(Policy::Lossless, t0, 3);
    for i in 0..3 {
        a.enqueue(i, shape()).unwrap();
    }
    a.pump(t0, room());
    let acts = actions(&mut a);
    // 3 credits: two messages, the last credit kept for control.
    let sent: Vec<u64> = posted(&acts)
        .iter()
        .filter(|h| h.seq > 0)
        .map(|h| h.seq)
        .collect();
    assert_eq!(sent, vec![1, 2]);
    assert_eq!(a.link().unwrap().credits.tx, 1);
    assert_eq!(a.counters.credit_stalls, 1);
    // The first of them carried STARVED (messages behind it, credits nearly gone).
    assert!(!posted(&acts)[0].has(flags::STARVED));
    assert!(posted(&acts)[1].has(flags::STARVED));
    a.on_posted(lid, a.receives_wanted()); // the hello's answer consumed one
    assert!(!a.wants_pass(), "nothing to do until the peer grants");
    a.on_frame(t0, lid, &ack(0, 2));
    assert!(a.wants_pass());
    a.pump(t0, room());
    let sent: Vec<u64> = posted(&actions(&mut a)).iter().map(|h| h.seq).collect();
    assert_eq!(sent, vec![3]);
}

#[test]
fn send_queue_room_bounds_a_pass_and_keeps_the_control_reserve() {
    let t0 = Instant::now();
    let (mut a, _, _) = open_connector(Policy::Lossless, t0, 16);
    for i in 0..4 {
        a.enqueue(i, shape()).unwrap();
    }
    a.pump(
        t0,
        SqRoom {
            free: 3,
            reserve: 1,
        },
    );
    assert_eq!(posted(&actions(&mut a)).len(), 2);
}

#[test]
fn messages_are_accepted_in_order_duplicates_dropped_gaps_fault() {
    let t0 = Instant::now();
    let (mut a, lid, _) = open_connector(Policy::Lossless, t0, 3);
    assert_eq!(a.on_frame(t0, lid, &msg(1)), Verdict::Accept(1));
    assert_eq!(a.on_frame(t0, lid, &msg(2)), Verdict::Accept(2));
    assert_eq!(a.receiving(), 2);
    a.on_delivered(1);
    assert_eq!(a.on_frame(t0, lid, &msg(2)), Verdict::Duplicate);
    assert_eq!(a.on_frame(t0, lid, &msg(1)), Verdict::Duplicate);
    assert_eq!(a.counters.duplicates_dropped, 2);
    assert_eq!(a.on_frame(t0, lid, &msg(4)), Verdict::Fault);
    assert_eq!(a.counters.malformed, 1);
    assert_eq!(a.state, SessionState::Reconnecting);
    // Frames of the failed link that were still queued are not the session's any more.
    assert_eq!(a.on_frame(t0, lid, &msg(3)), Verdict::Stale);
    // What was accepted and not delivered comes again on the next link.
    assert_eq!(a.receiving(), 0);
    assert_eq!(a.delivered(), 1);
}

#[test]
fn an_ack_waits_a_pass_for_an_answer_then_goes_alone() {
    let t0 = Instant::now();
    // 8 receives: the peer keeps data credits after two messages.
    let (mut a, lid, _) = open_connector_posting(Policy::Lossless, t0, 8, 8);
    a.pump(t0, room());
    actions(&mut a);
    assert_eq!(a.on_frame(t0, lid, &msg(1)), Verdict::Accept(1));
    a.on_delivered(1);
    a.pump(t0, room());
    assert!(posted(&actions(&mut a)).is_empty(), "held back a pass");
    assert!(a.wants_pass());
    // An answer sent meanwhile carries it.
    a.enqueue(7, shape()).unwrap();
    a.pump(t0, room());
    let hs = posted(&actions(&mut a));
    assert_eq!(hs.len(), 1);
    assert_eq!((hs[0].kind(), hs[0].ack), (Some(Kind::Msg), 1));
    // Without an answer the next pass sends the ack alone.
    assert_eq!(a.on_frame(t0, lid, &msg(2)), Verdict::Accept(2));
    a.on_delivered(2);
    a.pump(t0, room());
    assert!(posted(&actions(&mut a)).is_empty());
    a.pump(t0, room());
    let hs = posted(&actions(&mut a));
    assert_eq!((hs[0].kind(), hs[0].ack), (Some(Kind::Ack), 2));
    assert!(!a.wants_pass());
    // Down to its control credit, the peer gets the ack at once.
    for seq in 3..=6 {
        assert_eq!(a.on_frame(t0, lid, &msg(seq)), Verdict::Accept(seq));
        a.on_delivered(seq);
    }
    a.pump(t0, room());
    let hs = posted(&actions(&mut a));
    assert_eq!((hs[0].kind(), hs[0].ack), (Some(Kind::Ack), 6));
}

#[test]
fn replay_after_reconnect_sends_what_the_peer_did_not_deliver() {
    let t0 = Instant::now();
    let (mut a, lid, _) = open_connector(Policy::Lossless, t0, 8);
    for i in 0..3 {
        a.enqueue(i, shape()).unwrap();
    }
    a.pump(t0, room());
    actions(&mut a);
    a.on_link_error(
        t0 + ms(1),
        lid,
        Error::fixed(ErrorKind::Closed, "completion with status RetryExcErr"),
    );
    let acts = actions(&mut a);
    assert!(matches!(acts[..], [Action::CloseLink { link, .. }] if link == lid));
    assert_eq!(a.state, SessionState::Reconnecting);
    assert!(done(&acts).is_empty(), "lossless: nothing fails");
    // The first attempt goes at once.
    a.handle_timeout(t0 + ms(1));
    assert!(matches!(actions(&mut a)[..], [Action::Connect { path: 0 }]));
    let lid2 = a.link_up(t0 + ms(2), 0, rules().credits(4), HelloId::default());
    let hello = posted(&actions(&mut a))[0];
    assert_eq!(
        (hello.aux, hello.aux2),
        (0x100, 0x200),
        "resumes the session"
    );
    assert_eq!(a.counters.reconnects, 1);
    // The peer delivered message 1 before the fault.
    let mut answer = Header::new(Kind::Hello);
    answer.aux = 0x200;
    answer.aux3 = 1;
    answer.credits = 8;
    a.on_frame(t0 + ms(2), lid2, &answer);
    assert_eq!(done(&actions(&mut a)), vec![(1, true)]);
    a.pump(t0 + ms(2), room());
    let seqs: Vec<u64> = posted(&actions(&mut a)).iter().map(|h| h.seq).collect();
    assert_eq!(seqs, vec![2, 3]);
    assert_eq!(a.counters.replays, 2);
    assert_eq!(a.counters.msgs_sent, 3);
}

#[test]
fn lossy_fault_reports_every_send_in_doubt_and_resets() {
    let t0 = Instant::now();
    let (mut a, lid, _) = open_connector(Policy::Lossy, t0, 3);
    for i in 0..3 {
        a.enqueue(i, shape()).unwrap();
    }
    a.pump(t0, room()); // 1 and 2 sent, 3 waits for credits
    actions(&mut a);
    a.on_link_error(
        t0,
        lid,
        Error::fixed(ErrorKind::Closed, "side channel closed"),
    );
    let acts = actions(&mut a);
    assert_eq!(done(&acts), vec![(1, false), (2, false), (3, false)]);
    assert!(has_reset(&acts));
    assert_eq!(a.state, SessionState::Closed);
    assert_eq!(
        a.enqueue(4, shape()).unwrap_err().1.kind(),
        ErrorKind::Closed
    );
    assert_eq!(a.poll_timeout(), None);
}

#[test]
fn keepalive_pings_when_idle_and_a_silent_peer_faults() {
    let t0 = Instant::now();
    let (mut a, lid, _) = open_connector(Policy::Lossless, t0, 8);
    a.pump(t0, room());
    actions(&mut a);
    let due = a.poll_timeout().unwrap();
    assert_eq!(due, t0 + ms(100));
    a.pump(due, room());
    let hs = posted(&actions(&mut a));
    assert_eq!(hs.len(), 1);
    assert_eq!(hs[0].kind(), Some(Kind::Ping));
    assert_eq!(a.counters.keepalives_sent, 1);
    // Heard at 150 ms: dead at 650.
    a.on_frame(t0 + ms(150), lid, &ack(0, 0));
    a.pump(t0 + ms(649), room());
    assert_eq!(a.state, SessionState::Open);
    actions(&mut a);
    a.pump(t0 + ms(650), room());
    assert_eq!(a.state, SessionState::Reconnecting);
    assert!(
        actions(&mut a)
            .iter()
            .any(|x| matches!(x, Action::CloseLink { .. }))
    );
}

/// A probe (`Rules::probe`): a message the peer answers with nothing brings a keepalive
/// after the probe interval, long before the keepalive interval (a link dead both ways:
/// the transport acknowledged the message, the answer never comes), then one per
/// interval while the peer stays silent; hearing from it stops them.
#[test]
fn a_message_the_peer_never_answers_brings_a_probe() {
    let t0 = Instant::now();
    let r = Rules {
        probe: Some(ms(20)),
        ..rules()
    };
    let mut a = Machine::new(r, 0x100, Policy::Lossless, false, t0);
    a.handle_timeout(t0);
    actions(&mut a);
    let lid = a.link_up(t0, 0, r.credits(4), HelloId::default());
    actions(&mut a);
    let mut answer = Header::new(Kind::Hello);
    answer.aux = 0x200;
    answer.aux2 = 0x100;
    answer.credits = 8;
    a.on_frame(t0, lid, &answer);
    actions(&mut a);
    a.pump(t0, room());
    actions(&mut a);
    assert_eq!(a.poll_timeout(), Some(t0 + ms(100)), "idle: the keepalive");
    a.enqueue(1, shape()).unwrap();
    a.pump(t0 + ms(5), room());
    assert_eq!(posted(&actions(&mut a))[0].kind(), Some(Kind::Msg));
    assert_eq!(a.poll_timeout(), Some(t0 + ms(20)), "the probe");
    a.pump(t0 + ms(20), room());
    let hs = posted(&actions(&mut a));
    assert_eq!(hs.len(), 1);
    assert_eq!(hs[0].kind(), Some(Kind::Ping));
    assert_eq!(a.poll_timeout(), Some(t0 + ms(40)), "the next probe");
    // The peer answers: no probe until another message goes unanswered.
    a.on_frame(t0 + ms(30), lid, &ack(1, 1));
    actions(&mut a);
    a.pump(t0 + ms(30), room());
    actions(&mut a);
    assert!(a.poll_timeout().is_some_and(|t| t >= t0 + ms(100)));
}

/// A keepalive due while the link's send queue is full cannot go, and its timer does not
/// come due again at once: until a pump finds room (the completion that frees an entry
/// brings one) only the silent-peer deadline is timed. The simulator's seed 549854 spun
/// on such a timer behind a black-holed link (1,000 passes per microsecond).
#[test]
fn a_keepalive_behind_a_full_send_queue_waits_for_room_not_the_clock() {
    let t0 = Instant::now();
    let (mut a, _, _) = open_connector(Policy::Lossless, t0, 8);
    a.pump(t0, room());
    actions(&mut a);
    let due = a.poll_timeout().unwrap();
    assert_eq!(due, t0 + ms(100));
    a.pump(
        due,
        SqRoom {
            free: 0,
            reserve: 1,
        },
    );
    assert!(posted(&actions(&mut a)).is_empty());
    assert_eq!(
        a.poll_timeout(),
        Some(t0 + ms(500)),
        "the silent-peer deadline, not the keepalive that cannot go"
    );
    a.pump(due + ms(1), room());
    let hs = posted(&actions(&mut a));
    assert_eq!(hs.len(), 1);
    assert_eq!(hs[0].kind(), Some(Kind::Ping));
    assert_eq!(a.poll_timeout(), Some(due + ms(101)), "the next keepalive");
}

#[test]
fn starved_peer_grows_the_window_and_a_ping_shrinks_it() {
    let t0 = Instant::now();
    let (mut a, lid, _) = open_connector(Policy::Lossless, t0, 8);
    let mut h = ack(0, 0);
    h.flags |= flags::STARVED;
    a.on_frame(t0, lid, &h);
    assert_eq!(a.link().unwrap().credits.window, 8);
    assert_eq!(a.receives_wanted(), 6); // 4 posted, the hello's answer and the ack consumed
    a.on_posted(lid, 6);
    assert_eq!(a.receives_wanted(), 0);
    a.pump(t0, room()); // the hello's pass (and the announcement of the new receives)
    a.pump(t0 + ms(100), room()); // idle: the keepalive goes and the window falls back
    assert_eq!(a.link().unwrap().credits.window, 4);
}

#[test]
fn a_hello_without_our_session_resets_the_connector() {
    let t0 = Instant::now();
    let (mut a, lid, _) = open_connector(Policy::Lossless, t0, 8);
    a.enqueue(1, shape()).unwrap();
    a.on_link_error(t0, lid, Error::fixed(ErrorKind::Closed, "side channel EOF"));
    a.handle_timeout(t0);
    actions(&mut a);
    let lid2 = a.link_up(t0, 0, rules().credits(4), HelloId::default());
    actions(&mut a);
    // The peer restarted: it answers with no identity.
    a.on_frame(t0, lid2, &Header::new(Kind::Hello));
    let acts = actions(&mut a);
    assert!(has_reset(&acts));
    assert_eq!(done(&acts), vec![(1, false)]);
}

#[test]
fn a_new_incarnation_resets_a_lossless_accepted_session() {
    let t0 = Instant::now();
    let mut b: Machine<u32> = Machine::new(rules(), 0x300, Policy::Lossless, true, t0);
    let addr: std::net::SocketAddr = "10.0.0.1:6800".parse().unwrap();
    b.peer_entity = Some((addr, 7));
    let mut hello = Header::new(Kind::Hello);
    hello.aux = 0x100;
    hello.credits = 3;
    let mut c = rules().credits(4);
    c.on_receive();
    c.on_grant(3);
    b.accept_link(t0, c, &hello);
    b.enqueue(1, shape()).unwrap();
    actions(&mut b);
    assert!(!b.on_peer_incarnation(addr, 7), "the same process");
    assert!(!b.on_peer_incarnation("10.0.0.2:6800".parse().unwrap(), 8));
    assert!(b.on_peer_incarnation(addr, 8));
    let acts = actions(&mut b);
    assert_eq!(done(&acts), vec![(1, false)]);
    assert!(has_reset(&acts));
    assert_eq!(b.state, SessionState::Closed);
}

#[test]
fn the_accepting_side_answers_resumes_and_gives_up_after_twice_the_timeout() {
    let t0 = Instant::now();
    let mut b: Machine<u32> = Machine::new(rules(), 0x300, Policy::Lossless, true, t0);
    let mut hello = Header::new(Kind::Hello);
    hello.aux = 0x100;
    hello.credits = 3;
    let lid = b.accept_link(t0, rules().credits(4), &hello);
    let acts = actions(&mut b);
    let r = posted(&acts)[0];
    assert_eq!((r.kind(), r.aux, r.aux2), (Some(Kind::Hello), 0x300, 0x100));
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::Notify(Notice::Connected)))
    );
    b.enqueue(1, shape()).unwrap();
    b.on_link_error(t0, lid, Error::fixed(ErrorKind::Closed, "QP error"));
    assert_eq!(b.state, SessionState::Reconnecting);
    assert_eq!(b.poll_timeout(), Some(t0 + ms(2000)));
    b.handle_timeout(t0 + ms(1999));
    assert_eq!(b.state, SessionState::Reconnecting);
    actions(&mut b);
    b.handle_timeout(t0 + ms(2000));
    let acts = actions(&mut b);
    assert!(has_reset(&acts));
    assert_eq!(done(&acts), vec![(1, false)]);
}

#[test]
fn reconnect_backs_off_and_gives_up() {
    let t0 = Instant::now();
    let mut r = rules();
    r.reconnect_attempts = 3;
    let mut a: Machine<u32> = Machine::new(r, 0x100, Policy::Lossless, false, t0);
    a.handle_timeout(t0);
    assert!(matches!(actions(&mut a)[..], [Action::Connect { path: 0 }]));
    a.handle_timeout(t0);
    assert!(actions(&mut a).is_empty(), "one attempt at a time");
    let refused = || Error::fixed(ErrorKind::Io, "connection refused");
    a.attempt_failed(t0, 0, refused());
    assert_eq!(a.poll_timeout(), Some(t0 + ms(10)));
    a.handle_timeout(t0 + ms(9));
    assert!(actions(&mut a).is_empty());
    a.handle_timeout(t0 + ms(10));
    assert!(matches!(actions(&mut a)[..], [Action::Connect { path: 0 }]));
    a.attempt_failed(t0 + ms(10), 0, refused());
    assert_eq!(a.poll_timeout(), Some(t0 + ms(30)));
    a.handle_timeout(t0 + ms(30));
    actions(&mut a);
    a.attempt_failed(t0 + ms(30), 0, refused());
    assert!(has_reset(&actions(&mut a)));
    assert_eq!(a.state, SessionState::Closed);
}

#[test]
fn a_link_lost_before_the_hello_answer_is_a_failed_attempt() {
    let t0 = Instant::now();
    let mut r = rules();
    r.reconnect_attempts = 2;
    let mut a: Machine<u32> = Machine::new(r, 0x100, Policy::Lossless, false, t0);
    a.handle_timeout(t0);
    assert!(matches!(actions(&mut a)[..], [Action::Connect { path: 0 }]));
    let lid = a.link_up(t0, 0, r.credits(4), HelloId::default());
    actions(&mut a);
    // The acceptor took the connection and dropped it without answering.
    a.on_link_error(t0, lid, Error::fixed(ErrorKind::Closed, "side channel EOF"));
    actions(&mut a);
    assert_eq!(a.state, SessionState::Reconnecting);
    assert_eq!(
        a.poll_timeout(),
        Some(t0 + ms(10)),
        "backed off, not at once"
    );
    a.handle_timeout(t0 + ms(10));
    assert!(matches!(actions(&mut a)[..], [Action::Connect { path: 0 }]));
    let lid = a.link_up(t0 + ms(10), 0, r.credits(4), HelloId::default());
    actions(&mut a);
    a.on_link_error(
        t0 + ms(10),
        lid,
        Error::fixed(ErrorKind::Closed, "side channel EOF"),
    );
    assert!(
        has_reset(&actions(&mut a)),
        "the budget of 2 attempts is spent"
    );
    assert_eq!(a.state, SessionState::Closed);
}

#[test]
fn close_sends_a_bye_and_fails_held_sends_without_reset() {
    let t0 = Instant::now();
    let (mut a, lid, _) = open_connector(Policy::Lossless, t0, 2);
    a.enqueue(1, shape()).unwrap();
    a.close();
    let acts = actions(&mut a);
    assert_eq!(posted(&acts)[0].kind(), Some(Kind::Bye));
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::CloseLink { link, drain: true } if *link == lid))
    );
    assert_eq!(done(&acts), vec![(1, false)]);
    assert!(!has_reset(&acts));
}

#[test]
fn close_for_an_error_says_bye_and_resets_with_it() {
    let t0 = Instant::now();
    let (mut a, lid, _) = open_connector(Policy::Lossless, t0, 2);
    a.enqueue(1, shape()).unwrap();
    a.close_for(Error::fixed(ErrorKind::Io, "on_message panicked"));
    let acts = actions(&mut a);
    assert_eq!(posted(&acts)[0].kind(), Some(Kind::Bye));
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::CloseLink { link, drain: true } if *link == lid))
    );
    assert_eq!(done(&acts), vec![(1, false)]);
    let why = acts.iter().find_map(|x| match x {
        Action::Notify(Notice::Reset(e)) => Some(e.kind()),
        _ => None,
    });
    assert_eq!(why, Some(ErrorKind::Io));
    assert_eq!(a.state, SessionState::Closed);
    a.close();
    assert!(actions(&mut a).is_empty(), "closing twice does nothing");
}

#[test]
fn the_peers_bye_resets_even_a_lossless_session() {
    let t0 = Instant::now();
    let (mut a, lid, _) = open_connector(Policy::Lossless, t0, 2);
    a.on_frame(t0, lid, &Header::new(Kind::Bye));
    assert!(has_reset(&actions(&mut a)));
    assert_eq!(a.state, SessionState::Closed);
}

#[test]
fn an_oversized_message_ends_the_session_rather_than_replay_it() {
    let t0 = Instant::now();
    let (mut a, lid, _) = open_connector(Policy::Lossless, t0, 2);
    a.on_link_error(t0, lid, Error::fixed(ErrorKind::ResourceLimit, "too large"));
    assert!(has_reset(&actions(&mut a)));
}

#[test]
fn grants_are_bounded_by_the_slot_room_after_the_front() {
    let t0 = Instant::now();
    let mut r = rules();
    r.eager_write = true;
    r.recv_window_min = 64;
    r.recv_window = 64;
    let mut a: Machine<u32> = Machine::new(r, 1, Policy::Lossless, false, t0);
    a.handle_timeout(t0);
    let lid = a.link_up(t0, 0, r.credits(64), HelloId::default());
    let hello = posted(&actions(&mut a))[0];
    // (512 - 64) / 12 = 37 grants in a hello; the rest wait for later headers.
    assert_eq!(hello.credits, 37);
    assert!(hello.has(flags::GRANTS));
    assert_eq!(a.link().unwrap().credits.owed, 63 - 37);
    let _ = lid;
}

#[test]
fn writes_need_a_lossy_session() {
    let t0 = Instant::now();
    let mut a: Machine<u32> = Machine::new(rules(), 1, Policy::Lossless, false, t0);
    let s = Shape {
        writes: 1,
        ..shape()
    };
    assert_eq!(a.admit(&s).unwrap_err().kind(), ErrorKind::InvalidArgument);
}

#[test]
fn rules_come_from_the_msgr_keys() {
    let mut c = crate::config::Config::new();
    c.set("msgr_keepalive_ms", "250").unwrap();
    c.set("msgr_recv_window", "32").unwrap();
    let s = MsgrSettings::from_config(&c).unwrap();
    let r = Rules::from_settings(&s);
    assert_eq!(r.keepalive, Some(ms(250)));
    assert_eq!((r.recv_window_min, r.recv_window), (s.recv_window_min, 32));
    assert_eq!(r.send_queue_msgs, s.send_queue_msgs);
    let m: Machine<u32> = Machine::new(r, 1, Policy::Lossless, false, Instant::now());
    assert_eq!(m.rules(), &r);
}

#[test]
fn an_open_idle_session_is_quiet_until_something_is_owed() {
    let t0 = Instant::now();
    let (mut a, lid, _) = open_connector(Policy::Lossless, t0, 8);
    assert!(!a.quiet(t0), "the answer's receive is not reposted yet");
    a.on_posted(lid, a.receives_wanted());
    a.pump(t0, room()); // announces the reposted receive? not due: half the window
    actions(&mut a);
    assert!(a.quiet(t0));
    assert!(!a.quiet(t0 + ms(100)), "keepalive due");
    a.enqueue(1, shape()).unwrap();
    assert!(!a.quiet(t0));
    assert_eq!(a.held_bytes(), 100);
    a.pump(t0, room());
    assert!(a.has_actions());
    assert_eq!(a.link_id(), Some(lid));
}

//! The active/active rules (`active.rs`), each on literal inputs: the hello says the
//! policy, messages go on the least loaded link, the receiver holds what comes ahead of a
//! gap and drops duplicates, a failed link replays only what went on it (lossless) or
//! reports it in doubt and gives it up (lossy), immediate messages are refused.

use super::tests::{
    actions, ms, msg, multipath_rules, posted_on, retry_exc, room, send_results, shape,
};
use super::*;
use crate::error::{Error, ErrorKind};
use crate::msgr::messenger::types::PathState;
use crate::msgr::messenger::wire::{Header, Kind, flags};
use std::time::Instant;

/// The data messages posted: (link, sequence number).
fn sent(acts: &[Action]) -> Vec<(u64, u64)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Post {
                link,
                msg: Some(seq),
                ..
            } => Some((*link, *seq)),
            _ => None,
        })
        .collect()
}

fn ack(n: u64) -> Header {
    let mut h = Header::new(Kind::Ack);
    h.ack = n;
    h
}

/// A connecting active/active machine with two paths, open on path 0 (peer 0x200) and
/// path 1 joined: returns it and the two links. Both hellos say the policy.
fn two_active(policy: Policy, t0: Instant) -> (Machine<u32>, u64, u64) {
    let mut a = Machine::new(multipath_rules(), 0x100, policy, false, t0);
    a.set_active(true);
    assert_eq!(a.add_path(t0), 1);
    a.handle_timeout(t0);
    actions(&mut a);
    let l0 = a.link_up(t0, 0, multipath_rules().credits(8), HelloId::default());
    let hello = posted_on(&actions(&mut a));
    assert!(
        hello[0].1.has(flags::ACTIVE),
        "the session hello says active"
    );
    let mut answer = Header::new(Kind::Hello);
    answer.aux = 0x200;
    answer.aux2 = 0x100;
    answer.credits = 8;
    assert_eq!(a.on_frame(t0, l0, &answer), Verdict::Consumed);
    actions(&mut a);
    a.handle_timeout(t0);
    assert!(matches!(actions(&mut a)[..], [Action::Connect { path: 1 }]));
    let l1 = a.link_up(t0, 1, multipath_rules().credits(8), HelloId::default());
    let join = posted_on(&actions(&mut a));
    assert!(join[0].1.has(flags::JOIN) && join[0].1.has(flags::ACTIVE));
    let mut ok = Header::new(Kind::Hello);
    ok.flags |= flags::JOIN | flags::ACTIVE;
    ok.aux = 0x200;
    ok.aux2 = 0x100;
    ok.ack = 1;
    ok.credits = 8;
    assert_eq!(a.on_frame(t0, l1, &ok), Verdict::Consumed);
    actions(&mut a);
    // Both carry data.
    assert_eq!(a.path_state(0), PathState::Active);
    assert_eq!(a.path_state(1), PathState::Active);
    (a, l0, l1)
}

/// One pass: the primary link's pump, then the other's.
fn pass(a: &mut Machine<u32>, t: Instant, l1: u64) -> Vec<Action> {
    a.pump(t, room());
    a.pump_standby(t, l1, room());
    actions(a)
}

#[test]
fn each_message_goes_on_the_link_with_the_fewest_unacknowledged() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_active(Policy::Lossless, t0);
    for i in 0..4 {
        a.enqueue(i, shape()).unwrap();
    }
    // Ties go to the link pumped: 1 on path 0 (then it has more out than path 1), 2 and
    // 3 on path 1 (tie, then one more); 4 on path 0 at the next pass.
    assert_eq!(sent(&pass(&mut a, t0, l1)), vec![(l0, 1), (l1, 2), (l1, 3)]);
    assert_eq!(sent(&pass(&mut a, t0, l1)), vec![(l0, 4)]);
    assert_eq!(a.link_state(l0).unwrap().out, 2);
    assert_eq!(a.link_state(l1).unwrap().out, 2);
    assert_eq!(a.path(0).unwrap().counters.msgs_sent, 2);
    assert_eq!(a.path(1).unwrap().counters.msgs_sent, 2);
    // A cumulative ack on either link completes in order and frees both links' counts.
    a.on_frame(t0, l1, &ack(3));
    let d: Vec<u64> = send_results(&actions(&mut a))
        .iter()
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(d, vec![1, 2, 3]);
    assert_eq!(a.link_state(l0).unwrap().out, 1);
    assert_eq!(a.link_state(l1).unwrap().out, 0);
    // A link without a data credit is passed over: path 1 has none left.
    for l in a.standby.iter_mut() {
        l.credits.tx = 1;
    }
    a.enqueue(9, shape()).unwrap();
    a.enqueue(9, shape()).unwrap();
    assert_eq!(sent(&pass(&mut a, t0, l1)), vec![(l0, 5), (l0, 6)]);
}

#[test]
fn the_receiver_holds_what_comes_ahead_of_a_gap_and_drops_duplicates() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_active(Policy::Lossless, t0);
    assert_eq!(a.on_frame(t0, l1, &msg(2)), Verdict::Accept(2));
    assert_eq!(a.on_frame(t0, l1, &msg(3)), Verdict::Accept(3));
    assert_eq!(a.deliverable(), 0, "1 is missing: 2 and 3 are held");
    assert_eq!(a.held_ahead(), 2);
    assert_eq!(a.on_frame(t0, l0, &msg(3)), Verdict::Duplicate);
    assert_eq!(a.on_frame(t0, l0, &msg(1)), Verdict::Accept(1));
    assert_eq!(a.deliverable(), 3);
    for s in 1..=3 {
        a.on_delivered(s);
    }
    assert_eq!(a.held_ahead(), 0);
    assert_eq!(a.on_frame(t0, l1, &msg(2)), Verdict::Duplicate);
    assert_eq!(a.counters.duplicates_dropped, 2);
    // Not quiet while something is held.
    assert_eq!(a.on_frame(t0, l1, &msg(5)), Verdict::Accept(5));
    assert!(!a.quiet(t0));
}

/// Only the primary acknowledges. An acknowledgement that went with it when it failed
/// (queued on it, or refused at posting) is said again on the new primary: a peer with
/// nothing more to send would otherwise wait for ever (the simulator's seed 579,711).
#[test]
fn the_new_primary_acknowledges_again_what_the_failed_one_may_have_lost() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_active(Policy::Lossy, t0);
    for s in 1..=3 {
        assert_eq!(a.on_frame(t0, l1, &msg(s)), Verdict::Accept(s));
        a.on_delivered(s);
    }
    // The acknowledgement goes on the primary (after the pass it is held back).
    let mut acked = Vec::new();
    for k in 1..=3 {
        acked.extend(posted_on(&pass(&mut a, t0 + ms(k), l1)));
    }
    assert!(
        acked.iter().any(|(l, h)| *l == l0 && h.ack == 3),
        "{acked:?}"
    );
    assert!(!acked.iter().any(|(l, h)| *l == l1 && h.ack == 3));
    // Its post is refused: the primary is gone, and that acknowledgement with it.
    a.on_link_error(
        t0 + ms(4),
        l0,
        Error::fixed(ErrorKind::Closed, "post refused"),
    );
    let acts = actions(&mut a);
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::Activate { link } if *link == l1))
    );
    assert!(a.wants_pass(), "an acknowledgement is owed again");
    let again = posted_on(&pass(&mut a, t0 + ms(5), l1));
    assert!(
        again.iter().any(|(l, h)| *l == l1 && h.ack == 3),
        "{again:?}"
    );
}

#[test]
fn a_failed_link_replays_only_what_went_on_it_in_order() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_active(Policy::Lossless, t0);
    for i in 0..4 {
        a.enqueue(i, shape()).unwrap();
    }
    pass(&mut a, t0, l1);
    pass(&mut a, t0, l1);
    // 1 and 4 went on path 0, 2 and 3 on path 1. Path 0 brought message 7, held (6 is
    // missing): it goes with the link.
    assert_eq!(a.on_frame(t0, l0, &msg(7)), Verdict::Accept(7));
    a.on_link_error(t0, l0, retry_exc());
    let acts = actions(&mut a);
    assert!(matches!(acts[0], Action::CloseLink { link, .. } if link == l0));
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::Activate { link } if *link == l1))
    );
    assert!(
        !acts
            .iter()
            .any(|x| matches!(x, Action::Notify(Notice::Reset(_) | Notice::SendDone(..))))
    );
    assert_eq!(a.state, SessionState::Open);
    assert_eq!(
        a.held_ahead(),
        0,
        "what path 0 brought and was not delivered goes"
    );
    // No switch frame: 1 and 4 again, in order, on path 1; 2 and 3 stay where they are.
    let acts = pass(&mut a, t0 + ms(1), l1);
    let h = posted_on(&acts);
    assert!(!h.iter().any(|(_, h)| h.has(flags::SWITCH)));
    assert_eq!(sent(&acts), vec![(l1, 1), (l1, 4)]);
    assert_eq!(a.counters.replays, 2);
    assert_eq!(a.unacked_len(), 4);
    // Message 7 comes again on path 1: accepted (it was forgotten with path 0).
    assert_eq!(a.on_frame(t0, l1, &msg(7)), Verdict::Accept(7));
    a.on_frame(t0, l1, &ack(4));
    let d: Vec<u64> = send_results(&actions(&mut a))
        .iter()
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(d, vec![1, 2, 3, 4]);
    // Path 0 is retried after the backoff.
    a.handle_timeout(t0 + ms(10));
    assert!(matches!(actions(&mut a)[..], [Action::Connect { path: 0 }]));
}

#[test]
fn a_lossy_failed_link_reports_its_sends_in_doubt_and_gives_their_numbers_up() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_active(Policy::Lossy, t0);
    for i in 0..4 {
        a.enqueue(i, shape()).unwrap();
    }
    pass(&mut a, t0, l1);
    pass(&mut a, t0, l1);
    a.on_link_error(t0, l1, retry_exc());
    let acts = actions(&mut a);
    let d = send_results(&acts);
    assert_eq!(d.iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![2, 3]);
    assert!(d.iter().all(|(_, r)| r.as_ref().is_err_and(is_in_doubt)));
    assert!(
        !acts
            .iter()
            .any(|x| matches!(x, Action::Notify(Notice::Reset(_))))
    );
    // The give-up frame on the link left: 2 and 3, as bits 0 and 1 from 2.
    let h = posted_on(&pass(&mut a, t0, l1));
    let g: Vec<_> = h.iter().filter(|(_, h)| h.has(flags::GIVEUP)).collect();
    assert_eq!(g.len(), 1);
    assert_eq!(
        (g[0].0, g[0].1.aux, g[0].1.aux2, g[0].1.aux3),
        (l0, 2, 0b11, 0)
    );
    // Sent once; again only if a link fails before the peer's ack passes them.
    assert!(
        !posted_on(&pass(&mut a, t0, l1))
            .iter()
            .any(|(_, h)| h.has(flags::GIVEUP))
    );
    a.on_frame(t0, l0, &ack(4));
    assert_eq!(send_results(&actions(&mut a)).len(), 2);
    assert!(a.giveup.is_empty());
}

#[test]
fn a_lossy_receiver_skips_the_numbers_given_up() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_active(Policy::Lossy, t0);
    assert_eq!(a.on_frame(t0, l1, &msg(2)), Verdict::Accept(2));
    assert_eq!(a.on_frame(t0, l1, &msg(4)), Verdict::Accept(4));
    assert_eq!(a.deliverable(), 0);
    // 1 and 3 went on a link that failed at the peer.
    let mut g = Header::new(Kind::Ack);
    g.flags |= flags::GIVEUP;
    g.aux = 1;
    g.aux2 = 0b101;
    assert_eq!(a.on_frame(t0, l0, &g), Verdict::Consumed);
    assert_eq!(a.deliverable(), 4);
    a.on_delivered(2);
    a.on_delivered(4);
    // 3 arrives late: it was given up.
    assert_eq!(a.on_frame(t0, l0, &msg(3)), Verdict::Duplicate);
    assert_eq!(a.on_frame(t0, l0, &msg(5)), Verdict::Accept(5));
    assert_eq!(a.deliverable(), 5);
}

#[test]
fn a_give_up_on_a_lossless_session_is_malformed() {
    let t0 = Instant::now();
    let (mut a, l0, _) = two_active(Policy::Lossless, t0);
    let mut g = Header::new(Kind::Ack);
    g.flags |= flags::GIVEUP;
    g.aux = 1;
    g.aux2 = 1;
    assert_eq!(a.on_frame(t0, l0, &g), Verdict::Fault);
    assert_eq!(a.counters.malformed, 1);
}

#[test]
fn an_active_session_refuses_immediate_messages() {
    let t0 = Instant::now();
    let (mut a, _, _) = two_active(Policy::Lossy, t0);
    let imm = Shape {
        imm: Some(7),
        writes: 1,
        ..shape()
    };
    let e = a.enqueue(1, imm).unwrap_err().1;
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("immediate"), "{e}");
    // A standby session takes them.
    let mut b: Machine<u32> = Machine::new(multipath_rules(), 1, Policy::Lossy, false, t0);
    assert!(b.enqueue(1, imm).is_ok());
}

#[test]
fn the_accepting_side_learns_the_policy_and_moves_on_by_itself() {
    let t0 = Instant::now();
    let mut b: Machine<u32> = Machine::new(multipath_rules(), 0x200, Policy::Lossless, true, t0);
    let mut c = multipath_rules().credits(8);
    c.on_receive();
    c.on_grant(8);
    let mut hello = Header::new(Kind::Hello);
    hello.flags |= flags::ACTIVE;
    hello.aux = 0x100;
    hello.credits = 8;
    let l0 = b.accept_link(t0, c.clone(), &hello);
    assert!(b.is_active());
    let mut join = Header::new(Kind::Hello);
    join.flags |= flags::JOIN | flags::ACTIVE;
    join.aux = 0x100;
    join.aux2 = 0x200;
    join.ack = 1;
    join.credits = 8;
    let l1 = b.join_link(t0, c, &join);
    let answer = posted_on(&actions(&mut b));
    let join_answer = answer.iter().find(|(l, _)| *l == l1).unwrap().1;
    assert!(join_answer.has(flags::JOIN) && join_answer.has(flags::ACTIVE));
    // Data on the joined link is taken.
    assert_eq!(b.on_frame(t0, l1, &msg(1)), Verdict::Accept(1));
    for i in 0..2 {
        b.enqueue(i, shape()).unwrap();
    }
    assert_eq!(sent(&pass(&mut b, t0, l1)), vec![(l0, 1), (l1, 2)]);
    // Its link 0 fails: no wait for a switch frame, 1 goes again on link 1 at once.
    b.on_link_error(t0, l0, retry_exc());
    actions(&mut b);
    assert_eq!(b.state, SessionState::Open);
    assert_eq!(sent(&pass(&mut b, t0, l1)), vec![(l1, 1)]);
}

#[test]
fn no_link_left_falls_back_to_the_single_path_rules() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_active(Policy::Lossless, t0);
    for i in 0..3 {
        a.enqueue(i, shape()).unwrap();
    }
    pass(&mut a, t0, l1);
    a.on_link_error(t0, l1, retry_exc());
    a.on_link_error(t0, l0, retry_exc());
    let acts = actions(&mut a);
    assert!(
        !acts
            .iter()
            .any(|x| matches!(x, Action::Notify(Notice::Reset(_))))
    );
    assert_eq!(a.state, SessionState::Reconnecting);
    // Everything queued again in order for the reconnect.
    assert_eq!(a.unacked_len(), 0);
    assert_eq!(a.queued(), 3);
}

#[test]
fn an_accepting_side_left_with_no_link_goes_on_on_the_next_join() {
    // Simulator seed 843: both of its links failed while the peer kept a third joining;
    // no switch frame comes with active/active, so the join takes the session at once.
    let t0 = Instant::now();
    let mut b: Machine<u32> = Machine::new(multipath_rules(), 0x200, Policy::Lossless, true, t0);
    let mut c = multipath_rules().credits(8);
    c.on_receive();
    c.on_grant(8);
    let mut hello = Header::new(Kind::Hello);
    hello.flags |= flags::ACTIVE;
    hello.aux = 0x100;
    hello.credits = 8;
    let l0 = b.accept_link(t0, c.clone(), &hello);
    b.enqueue(1, shape()).unwrap();
    b.pump(t0, room());
    actions(&mut b);
    b.on_link_error(t0, l0, retry_exc());
    actions(&mut b);
    assert_eq!(b.state, SessionState::Reconnecting);
    let mut join = Header::new(Kind::Hello);
    join.flags |= flags::JOIN | flags::ACTIVE;
    join.aux = 0x100;
    join.aux2 = 0x200;
    join.ack = 1;
    join.credits = 8;
    let l1 = b.join_link(t0, c, &join);
    let acts = actions(&mut b);
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::Activate { link } if *link == l1))
    );
    assert_eq!(b.state, SessionState::Open);
    // What went on the failed link goes again on the new one.
    b.pump(t0, room());
    assert_eq!(sent(&actions(&mut b)), vec![(l1, 1)]);
}

#[test]
fn the_hold_is_bounded_by_twice_the_send_queue() {
    let t0 = Instant::now();
    let (mut a, _, l1) = two_active(Policy::Lossless, t0);
    // 1 never comes; 2..=33 are held (twice the send queue of 16), 34 is one too many.
    for seq in 2..=33 {
        assert_eq!(a.on_frame(t0, l1, &msg(seq)), Verdict::Accept(seq));
    }
    assert_eq!(a.on_frame(t0, l1, &msg(34)), Verdict::Fault);
    assert_eq!(a.counters.malformed, 1, "counted once");
    // The link that brought them goes, and what it brought with it.
    assert_eq!(a.held_ahead(), 0);
    assert!(
        actions(&mut a)
            .iter()
            .any(|x| matches!(x, Action::CloseLink { link, .. } if *link == l1))
    );
}

#[test]
fn a_peer_whose_join_answer_does_not_say_active_keeps_the_path_out() {
    // A peer built before active/active answers a join without the flag: it would drop
    // the data sent on that path (never acknowledged, never sent again).
    let t0 = Instant::now();
    let mut a: Machine<u32> = Machine::new(multipath_rules(), 0x100, Policy::Lossless, false, t0);
    a.set_active(true);
    a.add_path(t0);
    a.handle_timeout(t0);
    actions(&mut a);
    let l0 = a.link_up(t0, 0, multipath_rules().credits(8), HelloId::default());
    let mut answer = Header::new(Kind::Hello);
    answer.aux = 0x200;
    answer.aux2 = 0x100;
    answer.credits = 8;
    a.on_frame(t0, l0, &answer);
    a.handle_timeout(t0);
    actions(&mut a);
    let l1 = a.link_up(t0, 1, multipath_rules().credits(8), HelloId::default());
    actions(&mut a);
    let mut old = Header::new(Kind::Hello);
    old.flags |= flags::JOIN;
    old.aux = 0x200;
    old.aux2 = 0x100;
    old.ack = 1;
    old.credits = 8;
    assert_eq!(a.on_frame(t0, l1, &old), Verdict::Fault);
    assert!(
        actions(&mut a)
            .iter()
            .any(|x| matches!(x, Action::CloseLink { link, .. } if *link == l1))
    );
    assert_eq!(a.path_state(1), PathState::Down);
    let why = a.path(1).unwrap().last_fault.as_ref().unwrap().0.clone();
    assert_eq!(why.kind(), ErrorKind::Unsupported, "{why}");
    // The session goes on on path 0.
    assert_eq!(a.state, SessionState::Open);
    a.enqueue(1, shape()).unwrap();
    a.pump(t0, room());
    assert_eq!(sent(&actions(&mut a)), vec![(l0, 1)]);
}

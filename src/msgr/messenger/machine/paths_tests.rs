//! The path rules (`paths.rs`), each on literal inputs: joins, the switch on a fault of
//! the active path (lossless replay, lossy in doubt), the accepting side following the
//! newest switch, failback, retries of a failed path, and no path up.

use super::tests::{actions, ms, multipath_rules, posted_on, retry_exc, room, send_results, shape};
use super::*;
use crate::error::ErrorKind;
use crate::msgr::messenger::types::{PathEvent, PathState};
use crate::msgr::messenger::wire::{Header, Kind, flags};
use std::time::Instant;

fn path_events(acts: &[Action]) -> Vec<(usize, &'static str)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Notify(Notice::Path(i, e)) => Some((
                *i,
                match e {
                    PathEvent::Down(_) => "down",
                    PathEvent::Up => "up",
                    PathEvent::Active => "active",
                },
            )),
            _ => None,
        })
        .collect()
}

/// A connecting machine with two paths, open on path 0 (peer 0x200), path 1 joined:
/// returns it and the two links.
fn two_paths(policy: Policy, t0: Instant) -> (Machine<u32>, u64, u64) {
    let mut a = Machine::new(multipath_rules(), 0x100, policy, false, t0);
    assert_eq!(a.add_path(t0), 1);
    a.handle_timeout(t0);
    assert!(matches!(actions(&mut a)[..], [Action::Connect { path: 0 }]));
    let l0 = a.link_up(t0, 0, multipath_rules().credits(8), HelloId::default());
    let mut answer = Header::new(Kind::Hello);
    answer.aux = 0x200;
    answer.aux2 = 0x100;
    answer.credits = 8;
    assert_eq!(a.on_frame(t0, l0, &answer), Verdict::Consumed);
    actions(&mut a);
    // Open: path 1 is tried at once.
    a.handle_timeout(t0);
    assert!(matches!(actions(&mut a)[..], [Action::Connect { path: 1 }]));
    assert_eq!(a.path_state(1), PathState::Connecting);
    let l1 = a.link_up(t0, 1, multipath_rules().credits(8), HelloId::default());
    let join = posted_on(&actions(&mut a));
    assert_eq!(join.len(), 1);
    let (on, h) = join[0];
    assert_eq!(on, l1);
    assert!(h.has(flags::JOIN));
    assert_eq!((h.aux, h.aux2, h.ack), (0x100, 0x200, 1));
    let mut ok = Header::new(Kind::Hello);
    ok.flags |= flags::JOIN;
    ok.aux = 0x200;
    ok.aux2 = 0x100;
    ok.ack = 1;
    ok.credits = 8;
    assert_eq!(a.on_frame(t0, l1, &ok), Verdict::Consumed);
    assert_eq!(path_events(&actions(&mut a)), vec![(1, "up")]);
    assert_eq!(a.path_state(0), PathState::Active);
    assert_eq!(a.path_state(1), PathState::Standby);
    (a, l0, l1)
}

#[test]
fn a_fault_of_the_active_path_switches_and_replays_there_without_a_reset() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_paths(Policy::Lossless, t0);
    for i in 0..3 {
        a.enqueue(i, shape()).unwrap();
    }
    a.pump(t0, room());
    assert_eq!(posted_on(&actions(&mut a)).len(), 3);
    a.on_link_error(t0, l0, retry_exc());
    let acts = actions(&mut a);
    assert!(matches!(acts[0], Action::CloseLink { link, .. } if link == l0));
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::Activate { link } if *link == l1))
    );
    assert_eq!(path_events(&acts), vec![(0, "down"), (1, "active")]);
    assert!(
        !acts
            .iter()
            .any(|x| matches!(x, Action::Notify(Notice::Reset(_))))
    );
    assert_eq!(a.state, SessionState::Open);
    // The switch frame first, then the three messages again, in order, on path 1.
    a.pump(t0, room());
    let p = posted_on(&actions(&mut a));
    assert!(p.iter().all(|(l, _)| *l == l1));
    assert!(p[0].1.has(flags::SWITCH));
    assert_eq!(p[0].1.aux, 1, "the first switch");
    let seqs: Vec<u64> = p[1..].iter().map(|(_, h)| h.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    assert_eq!(a.counters.replays, 3);
    let c0 = a.path(0).unwrap();
    assert_eq!((c0.counters.faults, c0.counters.msgs_sent), (1, 3));
    assert_eq!(a.path(1).unwrap().counters.switches, 1);
    // Path 0 is retried after the backoff's minimum.
    a.handle_timeout(t0 + ms(5));
    assert!(actions(&mut a).is_empty());
    a.handle_timeout(t0 + ms(10));
    assert!(matches!(actions(&mut a)[..], [Action::Connect { path: 0 }]));
}

#[test]
fn a_lossy_session_reports_in_doubt_sends_and_goes_on() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_paths(Policy::Lossy, t0);
    for i in 0..2 {
        a.enqueue(i, shape()).unwrap();
    }
    a.pump(t0, room());
    actions(&mut a);
    a.enqueue(7, shape()).unwrap(); // not sent yet: it goes on path 1
    a.on_link_error(t0, l0, retry_exc());
    let acts = actions(&mut a);
    let d = send_results(&acts);
    assert_eq!(d.len(), 2);
    for (seq, r) in &d {
        let e = r.as_ref().unwrap_err();
        assert!(is_in_doubt(e), "send {seq}: {e}");
    }
    assert!(
        !acts
            .iter()
            .any(|x| matches!(x, Action::Notify(Notice::Reset(_))))
    );
    a.pump(t0, room());
    let p = posted_on(&actions(&mut a));
    assert!(p[0].1.has(flags::SWITCH));
    assert_eq!(p[0].1.aux2, 2, "every message after it is numbered above");
    assert_eq!((p[1].0, p[1].1.seq), (l1, 3));
}

#[test]
fn a_lossy_receiver_accepts_the_gap_a_failed_path_left() {
    let t0 = Instant::now();
    let (mut a, l0, _) = two_paths(Policy::Lossy, t0);
    let mut m = Header::new(Kind::Msg);
    m.seq = 1;
    assert_eq!(a.on_frame(t0, l0, &m), Verdict::Accept(1));
    a.on_delivered(1);
    m.seq = 4;
    assert_eq!(a.on_frame(t0, l0, &m), Verdict::Accept(4));
    a.on_delivered(4);
    m.seq = 3;
    assert_eq!(a.on_frame(t0, l0, &m), Verdict::Duplicate);
}

#[test]
fn a_lossy_receiver_numbers_an_immediate_after_a_switch_from_the_switch_frame() {
    let t0 = Instant::now();
    let (mut b, _, l1) = acceptor(Policy::Lossy, t0);
    // The peer sent 1..=4 before it switched (all lost here) and says so: the immediate
    // message that follows the switch on path 1 is number 5.
    let mut sw = switch(1);
    sw.aux2 = 4;
    b.on_frame(t0, l1, &sw);
    actions(&mut b);
    assert_eq!(b.on_imm(t0, l1), Verdict::Accept(5));
}

#[test]
fn no_path_up_is_todays_reconnect() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_paths(Policy::Lossless, t0);
    a.on_link_error(t0, l1, retry_exc());
    assert_eq!(path_events(&actions(&mut a)), vec![(1, "down")]);
    assert_eq!(a.state, SessionState::Open);
    a.on_link_error(t0, l0, retry_exc());
    actions(&mut a);
    assert_eq!(a.state, SessionState::Reconnecting);
    // The reconnect goes to path 0 first, then in turn.
    a.handle_timeout(t0);
    assert!(matches!(actions(&mut a)[..], [Action::Connect { path: 0 }]));
    a.attempt_failed(t0, 0, retry_exc());
    a.handle_timeout(t0 + ms(10));
    assert!(matches!(actions(&mut a)[..], [Action::Connect { path: 1 }]));
    // A lossy session with no path up ends.
    let (mut b, l0, l1) = two_paths(Policy::Lossy, t0);
    b.on_link_error(t0, l1, retry_exc());
    b.on_link_error(t0, l0, retry_exc());
    let acts = actions(&mut b);
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::Notify(Notice::Reset(_))))
    );
    assert_eq!(b.state, SessionState::Closed);
}

/// Path 0 of a connecting machine from `two_paths` comes back after a fault: its retry at
/// `t`, the link up 1 ms later, the peer's join answer 1 ms after that. Returns the new
/// link; the answer's actions are left to the caller.
fn path_0_rejoins(a: &mut Machine<u32>, t: Instant) -> u64 {
    a.handle_timeout(t);
    assert!(matches!(actions(a)[..], [Action::Connect { path: 0 }]));
    let l = a.link_up(
        t + ms(1),
        0,
        multipath_rules().credits(8),
        HelloId::default(),
    );
    actions(a);
    let mut ok = Header::new(Kind::Hello);
    ok.flags |= flags::JOIN;
    ok.aux = 0x200;
    ok.aux2 = 0x100;
    ok.credits = 8;
    a.on_frame(t + ms(2), l, &ok);
    l
}

#[test]
fn a_preferred_path_that_rejoins_takes_the_traffic_back() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_paths(Policy::Lossless, t0);
    a.on_link_error(t0, l0, retry_exc());
    actions(&mut a);
    a.pump(t0, room());
    actions(&mut a);
    let l2 = path_0_rejoins(&mut a, t0 + ms(10));
    assert_eq!(path_events(&actions(&mut a)), vec![(0, "up")]);
    a.pump(t0 + ms(12), room());
    let acts = actions(&mut a);
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::Activate { link } if *link == l2))
    );
    assert_eq!(path_events(&acts), vec![(0, "active")]);
    let p = posted_on(&acts);
    assert!(p[0].1.has(flags::SWITCH) && p[0].0 == l2);
    assert_eq!(p[0].1.aux, 2, "the second switch");
    // Path 1 stays up, as a standby path.
    assert_eq!(a.path_state(1), PathState::Standby);
    assert!(a.standby_links().any(|l| l.lid == l1));
    // Without failback the traffic stays.
    let mut r = multipath_rules();
    r.path_failback = false;
    let (mut b, l0, _) = two_paths(Policy::Lossless, t0);
    b.rules = r;
    b.on_link_error(t0, l0, retry_exc());
    actions(&mut b);
    path_0_rejoins(&mut b, t0 + ms(10));
    b.pump(t0 + ms(12), room());
    assert!(
        !actions(&mut b)
            .iter()
            .any(|x| matches!(x, Action::Activate { .. }))
    );
    assert_eq!(b.path_state(1), PathState::Active);
}

/// Failback (seed 741,131): path 1 carried the traffic and its windows grew; once path 0
/// takes it back, path 1 falls to the minimum window (the receives the peer's frames
/// consume there are not posted again) and this side spends its surplus credits there on
/// empty acknowledgements, once, so the peer's receives go back to its pool.
#[test]
fn a_demoted_path_gives_back_the_receives_its_window_grew_to() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_paths(Policy::Lossless, t0);
    a.on_link_error(t0, l0, retry_exc());
    a.pump(t0, room());
    actions(&mut a);
    // On path 1 the peer starves (our window grows) and grants 20 more credits.
    let mut grant = Header::new(Kind::Ack);
    grant.flags |= flags::STARVED;
    grant.credits = 20;
    for _ in 0..3 {
        a.on_frame(t0 + ms(1), l1, &grant);
    }
    a.on_posted(l1, a.receives_wanted_on(l1));
    assert_eq!(a.link_state(l1).unwrap().credits.window, 16);
    let tx = a.link_state(l1).unwrap().credits.tx;
    assert!(tx > 40, "{tx}");
    // Path 0 rejoins and takes the traffic back.
    path_0_rejoins(&mut a, t0 + ms(10));
    a.pump(t0 + ms(12), room());
    assert_eq!(
        path_events(&actions(&mut a)),
        vec![(0, "up"), (0, "active")]
    );
    let c = &a.link_state(l1).unwrap().credits;
    assert_eq!(c.window, multipath_rules().recv_window_min);
    assert!(c.posted > c.window);
    // The peer's frames there consume receives that are not posted again.
    a.on_frame(t0 + ms(13), l1, &Header::new(Kind::Ack));
    assert_eq!(a.receives_wanted_on(l1), 0);
    // The surplus goes on empty acknowledgements, within the send queue's room (one
    // entry stays for control).
    let sq = |free| SqRoom { free, reserve: 1 };
    a.pump_standby(t0 + ms(13), l1, sq(4));
    let p = posted_on(&actions(&mut a));
    assert_eq!(p.len(), 3);
    assert!(
        p.iter()
            .all(|(l, h)| *l == l1 && h.kind() == Some(Kind::Ack) && h.credits == 0)
    );
    a.pump_standby(t0 + ms(14), l1, sq(64));
    let rest = posted_on(&actions(&mut a)).len() as u32;
    assert_eq!(3 + rest, tx - multipath_rules().recv_window_min);
    assert_eq!(
        a.link_state(l1).unwrap().credits.tx,
        multipath_rules().recv_window_min
    );
    // Once: credits the peer grants there later stay (its keepalive announces them).
    grant.flags = 0;
    a.on_frame(t0 + ms(15), l1, &grant);
    a.pump_standby(t0 + ms(15), l1, sq(64));
    assert!(posted_on(&actions(&mut a)).is_empty());
}

#[test]
fn a_refused_join_is_a_path_fault_not_a_reset() {
    let t0 = Instant::now();
    let mut a = Machine::new(multipath_rules(), 0x100, Policy::Lossless, false, t0);
    a.add_path(t0);
    a.handle_timeout(t0);
    actions(&mut a);
    let l0 = a.link_up(t0, 0, multipath_rules().credits(8), HelloId::default());
    let mut answer = Header::new(Kind::Hello);
    answer.aux = 0x200;
    answer.aux2 = 0x100;
    a.on_frame(t0, l0, &answer);
    a.handle_timeout(t0);
    actions(&mut a);
    let l1 = a.link_up(t0, 1, multipath_rules().credits(8), HelloId::default());
    actions(&mut a);
    // A hello without identity: the peer does not know the session on that path.
    assert_eq!(
        a.on_frame(t0, l1, &Header::new(Kind::Hello)),
        Verdict::Fault
    );
    let acts = actions(&mut a);
    assert!(matches!(acts[..], [Action::CloseLink { link, .. }] if link == l1));
    assert_eq!(a.state, SessionState::Open);
    assert_eq!(a.path(1).unwrap().counters.faults, 1);
    assert_eq!(a.path_state(1), PathState::Down);
}

/// A pending accepted link's credits after a hello granting 8 (as the driver hands them
/// over).
fn granted() -> crate::msgr::messenger::credits::Credits {
    let mut c = multipath_rules().credits(8);
    c.on_receive();
    c.on_grant(8);
    c
}

/// An accepting machine open on a link of path 0 (peer 0x100), with path 1 joined.
fn acceptor(policy: Policy, t0: Instant) -> (Machine<u32>, u64, u64) {
    let mut b = Machine::new(multipath_rules(), 0x200, policy, true, t0);
    let mut hello = Header::new(Kind::Hello);
    hello.aux = 0x100;
    hello.credits = 8;
    let l0 = b.accept_link(t0, granted(), &hello);
    actions(&mut b);
    let mut join = Header::new(Kind::Hello);
    join.flags |= flags::JOIN;
    join.aux = 0x100;
    join.aux2 = 0x200;
    join.ack = 1;
    join.credits = 8;
    let l1 = b.join_link(t0, granted(), &join);
    let acts = actions(&mut b);
    let p = posted_on(&acts);
    assert_eq!(p.len(), 1);
    assert!(p[0].1.has(flags::JOIN) && p[0].0 == l1);
    assert_eq!((p[0].1.aux, p[0].1.aux2, p[0].1.ack), (0x200, 0x100, 1));
    assert_eq!(path_events(&acts), vec![(1, "up")]);
    (b, l0, l1)
}

fn switch(epoch: u64) -> Header {
    let mut h = Header::new(Kind::Ack);
    h.flags |= flags::SWITCH;
    h.aux = epoch;
    h
}

#[test]
fn the_accepting_side_follows_the_newest_switch_and_takes_data_only_there() {
    let t0 = Instant::now();
    let (mut b, l0, l1) = acceptor(Policy::Lossless, t0);
    for i in 0..2 {
        b.enqueue(i, shape()).unwrap();
    }
    b.pump(t0, room());
    assert!(posted_on(&actions(&mut b)).iter().all(|(l, _)| *l == l0));
    // Data on the standby path (sent before a switch) is dropped.
    let mut m = Header::new(Kind::Msg);
    m.seq = 1;
    assert_eq!(b.on_frame(t0, l1, &m), Verdict::Stale);
    // The switch: traffic to path 1, this side's unacknowledged messages again there.
    assert_eq!(b.on_frame(t0, l1, &switch(1)), Verdict::Consumed);
    let acts = actions(&mut b);
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::Activate { link } if *link == l1))
    );
    assert_eq!(path_events(&acts), vec![(1, "active")]);
    b.pump(t0, room());
    let p = posted_on(&actions(&mut b));
    // Its answer first (the connecting side drops what came before it), then the resends.
    assert!(p[0].1.has(flags::SWITCH) && p[0].1.aux == 1 && p[0].0 == l1);
    let seqs: Vec<(u64, u64)> = p[1..].iter().map(|(l, h)| (*l, h.seq)).collect();
    assert_eq!(seqs, vec![(l1, 1), (l1, 2)]);
    assert_eq!(b.on_frame(t0, l1, &m), Verdict::Accept(1));
    // Data on the old link now is dropped; an older switch (overtaken) is ignored.
    m.seq = 2;
    assert_eq!(b.on_frame(t0, l0, &m), Verdict::Stale);
    assert_eq!(b.on_frame(t0, l0, &switch(1)), Verdict::Consumed);
    assert!(
        !actions(&mut b)
            .iter()
            .any(|x| matches!(x, Action::Activate { .. }))
    );
    assert_eq!(b.path_state(1), PathState::Active);
    assert_eq!(b.path_state(0), PathState::Standby);
}

#[test]
fn an_accepting_side_that_loses_its_active_path_waits_for_the_switch() {
    let t0 = Instant::now();
    let (mut b, l0, l1) = acceptor(Policy::Lossless, t0);
    b.enqueue(1, shape()).unwrap();
    b.pump(t0, room());
    actions(&mut b);
    b.on_link_error(t0, l0, retry_exc());
    let acts = actions(&mut b);
    assert_eq!(path_events(&acts), vec![(0, "down")]);
    assert!(
        !acts
            .iter()
            .any(|x| matches!(x, Action::Notify(Notice::Reset(_))))
    );
    assert_eq!(b.state, SessionState::Reconnecting);
    b.pump(t0, room());
    assert!(
        posted_on(&actions(&mut b)).is_empty(),
        "nothing until the switch"
    );
    b.on_frame(t0 + ms(1), l1, &switch(1));
    assert_eq!(b.state, SessionState::Open);
    actions(&mut b);
    b.pump(t0 + ms(1), room());
    let p = posted_on(&actions(&mut b));
    assert!(p[0].1.has(flags::SWITCH));
    assert_eq!((p[1].0, p[1].1.seq), (l1, 1));
    // Without a switch, the accepting side gives up after twice the reconnect timeout.
    let (mut c, l0, _) = acceptor(Policy::Lossless, t0);
    c.on_link_error(t0, l0, retry_exc());
    actions(&mut c);
    c.handle_timeout(t0 + ms(2000));
    assert!(
        actions(&mut c)
            .iter()
            .any(|x| matches!(x, Action::Notify(Notice::Reset(_))))
    );
}

#[test]
fn a_rejoin_replaces_the_paths_old_link_and_a_resume_drops_every_path() {
    let t0 = Instant::now();
    let (mut b, l0, l1) = acceptor(Policy::Lossless, t0);
    let mut join = Header::new(Kind::Hello);
    join.flags |= flags::JOIN;
    join.aux = 0x100;
    join.aux2 = 0x200;
    join.ack = 1;
    let l2 = b.join_link(t0, multipath_rules().credits(8), &join);
    let acts = actions(&mut b);
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::CloseLink { link, .. } if *link == l1))
    );
    assert!(b.standby_links().any(|l| l.lid == l2));
    // A resuming hello: the connecting side has no path up; everything else goes.
    let mut hello = Header::new(Kind::Hello);
    hello.aux = 0x100;
    hello.aux2 = 0x200;
    let l3 = b.accept_link(t0, multipath_rules().credits(8), &hello);
    let acts = actions(&mut b);
    for l in [l0, l2] {
        assert!(
            acts.iter()
                .any(|x| matches!(x, Action::CloseLink { link, .. } if *link == l))
        );
    }
    assert_eq!(b.standby_links().count(), 0);
    assert_eq!(b.link().map(|l| l.lid), Some(l3));
}

#[test]
fn the_connecting_side_drops_a_gap_until_the_peer_answers_its_switch() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_paths(Policy::Lossless, t0);
    a.on_link_error(t0, l0, retry_exc());
    actions(&mut a);
    // Sent by the peer on link 1 before it saw the switch: dropped, not a fault.
    let mut m = Header::new(Kind::Msg);
    m.seq = 5;
    assert_eq!(a.on_frame(t0, l1, &m), Verdict::Duplicate);
    m.seq = 1;
    assert_eq!(a.on_frame(t0, l1, &m), Verdict::Accept(1));
    a.on_delivered(1);
    // The answer; a gap after it is a broken peer again.
    assert_eq!(a.on_frame(t0, l1, &switch(1)), Verdict::Consumed);
    m.seq = 5;
    assert_eq!(a.on_frame(t0, l1, &m), Verdict::Fault);
}

#[test]
fn a_newer_switch_to_the_link_in_use_resends_what_the_peer_dropped() {
    let t0 = Instant::now();
    let (mut b, l0, _) = acceptor(Policy::Lossless, t0);
    b.enqueue(1, shape()).unwrap();
    b.pump(t0, room());
    actions(&mut b);
    // The peer went to path 1 and came back before this side saw the first switch.
    b.on_frame(t0, l0, &switch(2));
    b.pump(t0, room());
    let p = posted_on(&actions(&mut b));
    assert!(p[0].1.has(flags::SWITCH) && p[0].1.aux == 2);
    assert_eq!((p[1].0, p[1].1.seq), (l0, 1));
}

#[test]
fn a_silent_standby_path_is_pinged_then_dropped() {
    let t0 = Instant::now();
    let (mut a, _, l1) = two_paths(Policy::Lossless, t0);
    pumps_one_ping(&mut a, t0 + ms(100), l1);
    a.pump_standby(
        t0 + ms(500),
        l1,
        SqRoom {
            free: 8,
            reserve: 1,
        },
    );
    let acts = actions(&mut a);
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::CloseLink { link, .. } if *link == l1))
    );
    assert_eq!(path_events(&acts), vec![(1, "down")]);
    assert_eq!(a.state, SessionState::Open);
}

/// A standby path's keepalive behind a full send queue waits for room, not the clock
/// (as the active link's: `a_keepalive_behind_a_full_send_queue_waits_for_room_not_the_clock`).
#[test]
fn a_standby_keepalive_behind_a_full_send_queue_waits_for_room() {
    let t0 = Instant::now();
    let (mut a, _, l1) = two_paths(Policy::Lossless, t0);
    let full = SqRoom {
        free: 0,
        reserve: 1,
    };
    a.pump_standby(t0 + ms(100), l1, full);
    assert!(posted_on(&actions(&mut a)).is_empty());
    let next = a.paths_timeout().unwrap();
    assert!(next > t0 + ms(100), "due again at once: {:?}", next - t0);
    pumps_one_ping(&mut a, t0 + ms(101), l1);
}

/// Standby link `l`'s pump at `t`, with send-queue room, posts one keepalive on it.
fn pumps_one_ping(a: &mut Machine<u32>, t: Instant, l: u64) {
    a.pump_standby(
        t,
        l,
        SqRoom {
            free: 8,
            reserve: 1,
        },
    );
    let p = posted_on(&actions(a));
    assert_eq!(p.len(), 1);
    assert_eq!((p[0].0, p[0].1.kind()), (l, Some(Kind::Ping)));
}

#[test]
fn removing_the_active_path_moves_the_traffic_and_the_last_path_stays() {
    let t0 = Instant::now();
    let (mut a, l0, l1) = two_paths(Policy::Lossless, t0);
    a.remove_path(t0, 0).unwrap();
    let acts = actions(&mut a);
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::CloseLink { link, .. } if *link == l0))
    );
    assert!(
        acts.iter()
            .any(|x| matches!(x, Action::Activate { link } if *link == l1))
    );
    assert!(a.path(0).unwrap().removed);
    let e = a.remove_path(t0, 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    // A removed path is not retried.
    a.handle_timeout(t0 + ms(100));
    assert!(actions(&mut a).is_empty());
}

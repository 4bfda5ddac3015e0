//! `poll_yield_after`: a thread that keeps polling an empty CQ yields its core after that
//! many empty polls in a row (verbs/spin.rs); a completion starts the count again; 0 never
//! yields. Counted per thread, so tests running beside this one do not disturb it.

mod verbs_support;

use rdmx_ibv::verbs::spin::yields_on_this_thread;
use rdmx_ibv::verbs::*;
use verbs_support::*;

fn poll_empty(cq: &Cq, times: usize) {
    let mut wc = [WorkCompletion::default(); 4];
    for _ in 0..times {
        assert_eq!(cq.poll(&mut wc), 0);
    }
}

#[test]
fn empty_polls_past_the_threshold_yield_and_a_completion_resets_the_count() {
    let (a, b) = pair(
        "127.0.74.21",
        "127.0.74.22",
        &Opts {
            extra: vec![("poll_yield_after", "8")],
            ..Opts::default()
        },
        &Opts::default(),
    );
    let exchange = |id: u64| {
        b.post_recv(id, 0, 64);
        a.post(a.wr(id, WrOpcode::Send, 0, 64)).unwrap();
        let wc = wait_wc(&a.scq);
        assert_eq!((wc.wr_id, wc.status), (id, 0));
    };
    // The poll that returns the completion starts the count at 0.
    exchange(1);
    let y0 = yields_on_this_thread();
    poll_empty(&a.scq, 20);
    assert_eq!(
        yields_on_this_thread() - y0,
        12,
        "20 empty polls, 8 allowed"
    );

    exchange(2);
    let y1 = yields_on_this_thread();
    poll_empty(&a.scq, 8);
    assert_eq!(yields_on_this_thread(), y1, "the count started again");
    poll_empty(&a.scq, 1);
    assert_eq!(yields_on_this_thread(), y1 + 1);
}

#[test]
fn zero_never_yields() {
    let (a, _b) = pair(
        "127.0.74.23",
        "127.0.74.24",
        &Opts {
            extra: vec![("poll_yield_after", "0")],
            ..Opts::default()
        },
        &Opts::default(),
    );
    let y0 = yields_on_this_thread();
    poll_empty(&a.scq, 500);
    assert_eq!(yields_on_this_thread(), y0);
}

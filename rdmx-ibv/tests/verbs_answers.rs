//! Verbs programs that answer RDMA WRITEs with RDMA WRITEs while spinning on memory
//! (`ib_write_lat`): their own polls land each other's WRITEs (`device/answers.rs` in the
//! soft provider). Alone in its test binary: its figure is a share of polls, which other
//! tests' threads on the same two cores would make noisy.

mod verbs_support;

use rdmx_ibv::verbs::*;
use verbs_support::*;

/// `ib_write_lat` on both sides, in two threads: each side posts an RDMA WRITE, polls its
/// send CQ until the completion, then spins on its own memory (without polling) until the
/// peer's WRITE lands; the server side waits first. Once the sides are found spinning, the
/// ACK each polls for and the peer's answering WRITE travel together (the peer held the ACK
/// for its answer; the engine sends the WRITE first), so the poll that returns the
/// completion has landed the WRITE and no progress thread is woken for it
/// (`device/answers.rs`).
#[test]
fn memory_spinners_land_each_others_writes_in_their_own_polls() {
    const ROUNDS: u32 = 2000;
    let (a, b) = pair(
        "127.0.73.12",
        "127.0.73.13",
        &Opts::default(),
        &Opts::default(),
    );
    // Each side's source byte is at 0..8, the peer's WRITE lands at 64..72.
    let run = |me: &Side, peer: &Side, server: bool| {
        let deadline = std::time::Instant::now() + WAIT;
        let mut wc = [WorkCompletion::default(); 1];
        let spin = |i: u32| {
            let byte = (i % 251) as u8 + 1;
            while me.read(71, 1)[0] != byte {
                assert!(
                    std::time::Instant::now() < deadline,
                    "round {i}: the WRITE never landed"
                );
                std::hint::spin_loop();
            }
        };
        for i in 1..=ROUNDS {
            if server {
                spin(i);
            }
            me.write(0, &[(i % 251) as u8 + 1; 8]);
            let mut w = me.wr(u64::from(i), WrOpcode::RdmaWrite, 0, 8);
            w.remote_addr = peer.addr(64);
            w.rkey = peer.mr.rkey;
            me.post(w).unwrap();
            while me.scq.poll(&mut wc) == 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "round {i}: no completion"
                );
            }
            assert_eq!((wc[0].wr_id, wc[0].status), (u64::from(i), 0));
            if !server {
                spin(i);
            }
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| run(&b, &a, true));
        run(&a, &b, false);
    });
    let (a_app, a_thread) = a.dev.soft().writes_landed();
    let (b_app, b_thread) = b.dev.soft().writes_landed();
    eprintln!(
        "WRITEs landed by the side's own polls / by its progress thread: a {a_app}/{a_thread}, \
         b {b_app}/{b_thread}; takeovers a {} b {}",
        a.dev.soft().thread_takeovers(),
        b.dev.soft().thread_takeovers()
    );
    // Every WRITE was landed by one or the other (a retransmitted one may count twice).
    assert!(a_app + a_thread >= u64::from(ROUNDS));
    assert!(b_app + b_thread >= u64::from(ROUNDS));
    // Measured alone: 99.9% by the sides' own polls (whether or not a side was ever found
    // spinning: held ACKs can make the exchange right from the start); with the ACK sent
    // ahead of the WRITE, most by the threads.
    let (app, thread) = (a_app + b_app, a_thread + b_thread);
    assert!(
        app >= 2 * thread,
        "the sides' own polls landed {app} WRITEs, the threads {thread}"
    );
}

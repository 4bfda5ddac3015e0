//! Error paths of the RC engine through its public API: remote access and invalid request
//! NAKs, local protection errors, and what happens to the QPs on each side.

mod common;

use common::{Faults, Params, Sim};
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{
    Completion, QpCaps, QpState, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WrOpcode, smallvec,
};

const A_BUF: u32 = 1;
const B_RO: u32 = 2; // exposed read-only (rkey 0x200)
const B_RW: u32 = 3; // exposed read-write (rkey 0x300)

fn sim(pb: Params) -> Sim {
    let pa = Params::default();
    let mut s = Sim::pair(
        3,
        Faults {
            delay: 500,
            ..Faults::NONE
        },
        pa,
        pb,
        QpCaps::default(),
        10,
        20,
    );
    s.nodes[0]
        .mem
        .add_region(0x1000, 8192, A_BUF, 0x100, access::LOCAL_WRITE);
    s.nodes[1]
        .mem
        .add_region(0x10_0000, 4096, B_RO, 0x200, access::REMOTE_READ);
    s.nodes[1].mem.add_region(
        0x20_0000,
        4096,
        B_RW,
        0x300,
        access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ,
    );
    s
}

fn wr(opcode: WrOpcode, lkey: u32, remote_addr: u64, rkey: u32, len: u32) -> SendWr {
    SendWr {
        wr_id: 7,
        opcode,
        flags: send_flags::SIGNALED,
        sges: smallvec![Sge {
            addr: 0x1000,
            length: len,
            lkey,
        }],
        remote_addr,
        rkey,
        imm: 0,
    }
}

fn run(s: &mut Sim) -> (Vec<Completion>, Vec<Completion>) {
    while s.advance(10_000_000_000) {}
    let a = std::iter::from_fn(|| s.nodes[0].qp.poll_completion()).collect();
    let b = std::iter::from_fn(|| s.nodes[1].qp.poll_completion()).collect();
    (a, b)
}

fn statuses(c: &[Completion]) -> Vec<(u64, WcStatus)> {
    c.iter().map(|c| (c.wr_id, c.status)).collect()
}

#[test]
fn read_outside_the_region_is_a_remote_access_error() {
    let mut s = sim(Params::default());
    s.nodes[0]
        .qp
        .post_send(wr(WrOpcode::RdmaRead, A_BUF, 0x10_0000 + 4000, 0x200, 200))
        .unwrap();
    let (a, _) = run(&mut s);
    assert_eq!(statuses(&a), vec![(7, WcStatus::RemAccessErr)]);
    assert_eq!(s.nodes[0].qp.state(), QpState::Err);
    assert_eq!(
        s.nodes[1].qp.state(),
        QpState::Err,
        "the responder moves to ERR after the NAK"
    );
}

#[test]
fn write_into_a_read_only_region_is_a_remote_access_error() {
    let mut s = sim(Params::default());
    s.nodes[0]
        .qp
        .post_send(wr(WrOpcode::RdmaWrite, A_BUF, 0x10_0000, 0x200, 64))
        .unwrap();
    let (a, _) = run(&mut s);
    assert_eq!(statuses(&a), vec![(7, WcStatus::RemAccessErr)]);
    assert!(
        s.nodes[1].mem.region(B_RO).unwrap().iter().all(|&b| b == 0),
        "nothing written"
    );
}

#[test]
fn unknown_rkey_is_a_remote_access_error_and_a_good_one_works() {
    let mut s = sim(Params::default());
    s.nodes[0]
        .qp
        .post_send(wr(WrOpcode::RdmaWrite, A_BUF, 0x20_0000, 0x300, 64))
        .unwrap();
    s.nodes[0]
        .qp
        .post_send(SendWr {
            wr_id: 8,
            ..wr(WrOpcode::RdmaWrite, A_BUF, 0x20_0000, 0x999, 64)
        })
        .unwrap();
    let (a, _) = run(&mut s);
    assert_eq!(
        statuses(&a),
        vec![(7, WcStatus::Success), (8, WcStatus::RemAccessErr)]
    );
}

#[test]
fn read_on_a_qp_without_remote_read_is_an_invalid_request() {
    let pb = Params {
        access: access::LOCAL_WRITE | access::REMOTE_WRITE,
        ..Params::default()
    };
    let mut s = sim(pb);
    s.nodes[0]
        .qp
        .post_send(wr(WrOpcode::RdmaRead, A_BUF, 0x20_0000, 0x300, 64))
        .unwrap();
    let (a, _) = run(&mut s);
    assert_eq!(statuses(&a), vec![(7, WcStatus::RemInvReqErr)]);
}

#[test]
fn bad_local_key_is_a_local_protection_error_and_flushes_the_rest() {
    let mut s = sim(Params::default());
    s.nodes[0]
        .qp
        .post_send(wr(WrOpcode::Send, 99, 0, 0, 64))
        .unwrap();
    s.nodes[0]
        .qp
        .post_send(SendWr {
            wr_id: 8,
            ..wr(WrOpcode::Send, A_BUF, 0, 0, 64)
        })
        .unwrap();
    let (a, _) = run(&mut s);
    assert_eq!(
        statuses(&a),
        vec![(7, WcStatus::LocProtErr), (8, WcStatus::WrFlushErr)]
    );
    // Posting in ERR completes at once with a flush.
    s.nodes[0]
        .qp
        .post_send(SendWr {
            wr_id: 9,
            ..wr(WrOpcode::Send, A_BUF, 0, 0, 64)
        })
        .unwrap();
    assert_eq!(
        s.nodes[0].qp.poll_completion().map(|c| (c.wr_id, c.status)),
        Some((9, WcStatus::WrFlushErr))
    );
}

#[test]
fn send_larger_than_the_receive_buffer_fails_both_sides() {
    let mut s = sim(Params::default());
    s.nodes[1]
        .qp
        .post_recv(RecvWr {
            wr_id: 50,
            sges: smallvec![Sge {
                addr: 0x20_0000,
                length: 100,
                lkey: B_RW,
            }],
        })
        .unwrap();
    s.nodes[1]
        .qp
        .post_recv(RecvWr {
            wr_id: 51,
            sges: smallvec![Sge {
                addr: 0x20_0100,
                length: 100,
                lkey: B_RW,
            }],
        })
        .unwrap();
    s.nodes[0]
        .qp
        .post_send(wr(WrOpcode::Send, A_BUF, 0, 0, 300))
        .unwrap();
    let (a, b) = run(&mut s);
    assert_eq!(statuses(&a), vec![(7, WcStatus::RemInvReqErr)]);
    assert_eq!(
        statuses(&b),
        vec![(50, WcStatus::LocLenErr), (51, WcStatus::WrFlushErr)]
    );
    assert!(b.iter().all(|c| c.opcode == WcOpcode::Recv && c.is_recv));
}

#[test]
fn send_with_imm_and_write_with_imm_deliver_the_immediate() {
    let mut s = sim(Params::default());
    for k in 0..2 {
        s.nodes[1]
            .qp
            .post_recv(RecvWr {
                wr_id: 60 + k,
                sges: smallvec![Sge {
                    addr: 0x20_0000,
                    length: 64,
                    lkey: B_RW,
                }],
            })
            .unwrap();
    }
    s.nodes[0]
        .qp
        .post_send(SendWr {
            imm: 0x1234_5678,
            ..wr(WrOpcode::SendWithImm, A_BUF, 0, 0, 16)
        })
        .unwrap();
    s.nodes[0]
        .qp
        .post_send(SendWr {
            wr_id: 8,
            imm: 0xABCD,
            ..wr(WrOpcode::RdmaWriteWithImm, A_BUF, 0x20_0800, 0x300, 32)
        })
        .unwrap();
    let (a, b) = run(&mut s);
    assert_eq!(
        statuses(&a),
        vec![(7, WcStatus::Success), (8, WcStatus::Success)]
    );
    assert_eq!(a[1].opcode, WcOpcode::RdmaWrite);
    let got: Vec<_> = b
        .iter()
        .map(|c| (c.wr_id, c.opcode, c.byte_len, c.imm))
        .collect();
    assert_eq!(
        got,
        vec![
            (60, WcOpcode::Recv, 16, Some(0x1234_5678)),
            (61, WcOpcode::RecvRdmaWithImm, 32, Some(0xABCD))
        ]
    );
}

#[test]
fn posting_beyond_the_queue_or_sge_limits_is_refused() {
    let caps = QpCaps {
        max_send_wr: 2,
        max_send_sge: 1,
        max_recv_wr: 1,
        ..QpCaps::default()
    };
    let p = Params::default();
    let mut s = Sim::pair(4, Faults::NONE, p, p, caps, 0, 0);
    let a = &mut s.nodes[0].qp;
    let mut two_sges = wr(WrOpcode::Send, A_BUF, 0, 0, 8);
    two_sges.sges.push(two_sges.sges[0]);
    let e = a.post_send(two_sges).unwrap_err();
    assert_eq!(e.message(), "post_send: 2 SGEs exceed max_send_sge 1");
    a.post_send(wr(WrOpcode::Send, A_BUF, 0, 0, 8)).unwrap();
    a.post_send(wr(WrOpcode::Send, A_BUF, 0, 0, 8)).unwrap();
    let e = a.post_send(wr(WrOpcode::Send, A_BUF, 0, 0, 8)).unwrap_err();
    assert_eq!(
        e.message(),
        "post_send: send queue full (2 WRs outstanding = max_send_wr)"
    );
    let b = &mut s.nodes[1].qp;
    let rwr = RecvWr {
        wr_id: 1,
        sges: smallvec![],
    };
    b.post_recv(rwr.clone()).unwrap();
    let e = b.post_recv(rwr).unwrap_err();
    assert_eq!(
        e.message(),
        "post_recv: receive queue full (1 WRs outstanding = max_recv_wr)"
    );
}

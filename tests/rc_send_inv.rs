//! SEND_WITH_INV (remote invalidation of a memory window) through the RC engine's public
//! API: the requester's SEND_FIRST/MIDDLE/SEND_LAST_WITH_INVALIDATE (or ONLY) with the IETH,
//! the responder's invalidation of a type-2 window bound to its QP, the receive completion
//! that names the rkey, the errors rxe gives for keys that cannot be invalidated, and the
//! order of requests around the invalidation (a READ before it is still served, a WRITE
//! after it is refused).

mod common;

use common::{Faults, Params, Sim};
use rdmx::rc::verbs::{access, attr_mask, send_flags};
use rdmx::rc::{
    Completion, QpAttr, QpCaps, QpState, RecvWr, SendWr, Sge, WcOpcode, WcStatus, WrOpcode,
    smallvec,
};

const A_BUF: u32 = 1;
const B_RW: u32 = 3; // rkey 0x300, at 0x20_0000
const B_RECV: u32 = 4; // receive buffers, at 0x30_0000
/// A window over the first KiB of B_RW (its own rkey namespace: tag bit 31).
const WIN: u32 = 0x8000_0101;
const WIN_VA: u64 = 0x20_0000;
const B_QPN: u32 = 0x22;

/// Two connected QPs (path MTU 256) with regions; a window `WIN` on B bound to `bound_to`
/// (Some(QP): type 2; None: type 1).
fn sim(bound_to: Option<u32>) -> Sim {
    let mut s = Sim::pair(
        5,
        Faults::NONE,
        Params::default(),
        Params::default(),
        QpCaps::default(),
        10,
        20,
    );
    s.nodes[0]
        .mem
        .add_region(0x1000, 8192, A_BUF, 0x100, access::LOCAL_WRITE);
    let rw = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
    s.nodes[1].mem.add_region(0x20_0000, 4096, B_RW, 0x300, rw);
    s.nodes[1]
        .mem
        .add_region(0x30_0000, 4096, B_RECV, 0x400, access::LOCAL_WRITE);
    s.nodes[1].mem.add_window(
        WIN,
        bound_to,
        B_RW,
        WIN_VA,
        1024,
        access::REMOTE_READ | access::REMOTE_WRITE,
    );
    for (i, b) in s.nodes[0]
        .mem
        .region_mut(A_BUF)
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        *b = i as u8;
    }
    for (i, b) in s.nodes[1]
        .mem
        .region_mut(B_RW)
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        *b = (i as u8) ^ 0x5A;
    }
    s.nodes[1]
        .qp
        .post_recv(RecvWr {
            wr_id: 60,
            sges: smallvec![Sge {
                addr: 0x30_0000,
                length: 4096,
                lkey: B_RECV,
            }],
        })
        .unwrap();
    s
}

fn wr(wr_id: u64, opcode: WrOpcode, len: u32, remote_addr: u64, rkey: u32, imm: u32) -> SendWr {
    SendWr {
        wr_id,
        opcode,
        flags: send_flags::SIGNALED,
        sges: smallvec![Sge {
            addr: 0x1000,
            length: len,
            lkey: A_BUF,
        }],
        remote_addr,
        rkey,
        imm,
    }
}

fn send_inv(wr_id: u64, len: u32, rkey: u32) -> SendWr {
    wr(wr_id, WrOpcode::SendWithInv, len, 0, 0, rkey)
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

/// Every packet node `i` has ready now.
fn transmit(s: &mut Sim, i: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 4096 + 64];
    let n = &mut s.nodes[i];
    while let Some(len) = n.qp.poll_transmit(0, &n.mem, &mut buf) {
        out.push(buf[..len].to_vec());
    }
    out
}

fn deliver(s: &mut Sim, to: usize, packets: &[Vec<u8>]) {
    let n = &mut s.nodes[to];
    for p in packets {
        n.qp.handle_packet(0, p, &mut n.mem);
    }
}

/// A posts WR 8: an RDMA READ of the window's first 600 bytes into its buffer at 0x1800.
fn post_window_read(s: &mut Sim) {
    let mut read = wr(8, WrOpcode::RdmaRead, 600, WIN_VA, WIN, 0);
    read.sges[0].addr = 0x1800;
    s.nodes[0].qp.post_send(read).unwrap();
}

/// The wire: a 600-byte SEND_WITH_INV is SEND_FIRST, SEND_MIDDLE, SEND_LAST_WITH_INVALIDATE
/// (0x16) with the rkey in the IETH; a short one is SEND_ONLY_WITH_INVALIDATE (0x17).
#[test]
fn the_ieth_rides_on_the_last_or_only_packet() {
    let mut s = sim(Some(B_QPN));
    s.nodes[0].qp.post_send(send_inv(7, 600, WIN)).unwrap();
    let pkts = transmit(&mut s, 0);
    let opcodes: Vec<u8> = pkts.iter().map(|p| p[0]).collect();
    assert_eq!(opcodes, vec![0x00, 0x01, 0x16]);
    // BTH (12 bytes), then the IETH: the rkey, big-endian.
    assert_eq!(pkts[2][12..16], WIN.to_be_bytes());
    assert_eq!(pkts[2].len(), 12 + 4 + (600 - 512) + 4);

    let mut s = sim(Some(B_QPN));
    s.nodes[0].qp.post_send(send_inv(7, 0, WIN)).unwrap();
    let pkts = transmit(&mut s, 0);
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0][0], 0x17);
    assert_eq!(pkts[0][12..16], WIN.to_be_bytes());
}

/// A type-2 window bound to the responder's QP: the receive completes as RecvWithInv with
/// the rkey in `imm`, the window is gone, the send completes as SEND, and an RDMA WRITE
/// through the window afterwards is NAKed Remote Access.
#[test]
fn send_with_inv_ends_a_bound_type2_window_and_a_write_through_it_then_fails() {
    let mut s = sim(Some(B_QPN));
    s.nodes[0].qp.post_send(send_inv(7, 600, WIN)).unwrap();
    let (a, b) = run(&mut s);
    assert_eq!(statuses(&a), vec![(7, WcStatus::Success)]);
    assert_eq!(a[0].opcode, WcOpcode::Send);
    let got: Vec<_> = b
        .iter()
        .map(|c| (c.wr_id, c.status, c.opcode, c.byte_len, c.imm, c.is_recv))
        .collect();
    assert_eq!(
        got,
        vec![(
            60,
            WcStatus::Success,
            WcOpcode::RecvWithInv,
            600,
            Some(WIN),
            true
        )]
    );
    assert!(b[0].opcode.is_recv());
    assert!(!s.nodes[1].mem.window_valid(WIN));
    let recv = s.nodes[1].mem.region(B_RECV).unwrap();
    let sent = s.nodes[0].mem.region(A_BUF).unwrap();
    assert_eq!(recv[..600], sent[..600], "the payload is delivered");

    s.nodes[0]
        .qp
        .post_send(wr(8, WrOpcode::RdmaWrite, 64, WIN_VA, WIN, 0))
        .unwrap();
    let (a, _) = run(&mut s);
    assert_eq!(statuses(&a), vec![(8, WcStatus::RemAccessErr)]);
    assert_eq!(s.nodes[1].qp.state(), QpState::Err);
    assert_eq!(
        s.nodes[1].mem.region(B_RW).unwrap()[0],
        0x5A,
        "nothing was written through the dead window"
    );
}

/// What rxe does (`RESPST_ERR_INVALIDATE_RKEY`, class J) when the rkey cannot be
/// invalidated: the receive completes with REM_INV_REQ_ERR and the responder's QP goes to
/// ERR; no NAK is sent, the SEND is ACKed as its AckReq asks, so the requester's SEND
/// completes successfully (what it sends next goes unanswered).
fn refused(bound_to: Option<u32>, rkey: u32) {
    let mut s = sim(bound_to);
    s.nodes[0].qp.post_send(send_inv(7, 16, rkey)).unwrap();
    let (a, b) = run(&mut s);
    assert_eq!(statuses(&a), vec![(7, WcStatus::Success)], "rkey {rkey:#x}");
    assert_eq!(statuses(&b), vec![(60, WcStatus::RemInvReqErr)]);
    assert_eq!(s.nodes[1].qp.state(), QpState::Err);
    assert_eq!(
        s.nodes[0].qp.state(),
        QpState::Rts,
        "no NAK reached the requester"
    );
    assert!(s.nodes[1].mem.window_valid(WIN), "the window is untouched");
}

#[test]
fn a_region_rkey_cannot_be_invalidated() {
    refused(Some(B_QPN), 0x300);
}

#[test]
fn a_window_of_another_qp_cannot_be_invalidated() {
    refused(Some(0x33), WIN);
}

#[test]
fn a_type1_window_cannot_be_invalidated() {
    refused(None, WIN);
}

#[test]
fn an_unknown_rkey_cannot_be_invalidated() {
    refused(Some(B_QPN), WIN ^ 0x100);
}

/// Requests execute in order: a READ through the window that arrived before the
/// SEND_WITH_INV, and whose responses are still queued when the invalidation happens, is
/// served (its data as the window showed it); a READ after it is refused.
#[test]
fn a_read_queued_before_the_invalidation_is_still_served() {
    let mut s = sim(Some(B_QPN));
    let buf_b: Vec<u8> = s.nodes[1].mem.region(B_RW).unwrap()[..600].to_vec();
    post_window_read(&mut s);
    s.nodes[0].qp.post_send(send_inv(9, 8, WIN)).unwrap();
    let requests = transmit(&mut s, 0);
    assert_eq!(
        requests.iter().map(|p| p[0]).collect::<Vec<_>>(),
        vec![0x0C, 0x17],
        "READ request, then SEND_ONLY_WITH_INVALIDATE"
    );
    // Both requests reach B before it sends anything: the READ's responses are queued
    // when the SEND_WITH_INV invalidates the window.
    deliver(&mut s, 1, &requests);
    assert!(!s.nodes[1].mem.window_valid(WIN), "invalidated at once");
    let b: Vec<_> = std::iter::from_fn(|| s.nodes[1].qp.poll_completion()).collect();
    assert_eq!(
        b.iter()
            .map(|c| (c.wr_id, c.opcode, c.imm))
            .collect::<Vec<_>>(),
        vec![(60, WcOpcode::RecvWithInv, Some(WIN))]
    );
    let responses = transmit(&mut s, 1);
    let opcodes: Vec<u8> = responses.iter().map(|p| p[0]).collect();
    assert_eq!(
        &opcodes[..3],
        &[0x0D, 0x0E, 0x0F],
        "READ response FIRST/MIDDLE/LAST"
    );
    deliver(&mut s, 0, &responses);
    let (a, _) = run(&mut s);
    assert_eq!(
        statuses(&a),
        vec![(8, WcStatus::Success), (9, WcStatus::Success)]
    );
    assert_eq!(
        s.nodes[0].mem.region(A_BUF).unwrap()[0x800..0x800 + 600],
        buf_b[..],
        "the READ returned the window's bytes"
    );
    assert_eq!(s.nodes[1].qp.state(), QpState::Rts);

    // After it, a READ through the window is refused.
    let mut read = wr(10, WrOpcode::RdmaRead, 64, WIN_VA, WIN, 0);
    read.sges[0].addr = 0x1800;
    s.nodes[0].qp.post_send(read).unwrap();
    let (a, _) = run(&mut s);
    assert_eq!(statuses(&a), vec![(10, WcStatus::RemAccessErr)]);
}

/// The order rule with all three requests in flight at once: READ, SEND_WITH_INV, WRITE,
/// all through the window, delivered to B before it answers anything. The READ (before the
/// invalidation) is served in full, the SEND invalidates, the WRITE (after it) is refused
/// with a Remote Access NAK and writes nothing.
#[test]
fn read_then_send_with_inv_then_write_in_one_burst() {
    let mut s = sim(Some(B_QPN));
    let buf_b: Vec<u8> = s.nodes[1].mem.region(B_RW).unwrap()[..600].to_vec();
    post_window_read(&mut s);
    s.nodes[0].qp.post_send(send_inv(9, 8, WIN)).unwrap();
    s.nodes[0]
        .qp
        .post_send(wr(10, WrOpcode::RdmaWrite, 64, WIN_VA + 64, WIN, 0))
        .unwrap();
    let requests = transmit(&mut s, 0);
    assert_eq!(
        requests.iter().map(|p| p[0]).collect::<Vec<_>>(),
        vec![0x0C, 0x17, 0x0A],
        "READ request, SEND_ONLY_WITH_INVALIDATE, RDMA_WRITE_ONLY"
    );
    deliver(&mut s, 1, &requests);
    let responses = transmit(&mut s, 1);
    deliver(&mut s, 0, &responses);
    let (a, b) = run(&mut s);
    assert_eq!(
        statuses(&a),
        vec![
            (8, WcStatus::Success),
            (9, WcStatus::Success),
            (10, WcStatus::RemAccessErr)
        ]
    );
    assert_eq!(
        b.iter()
            .map(|c| (c.wr_id, c.opcode, c.imm))
            .collect::<Vec<_>>(),
        vec![(60, WcOpcode::RecvWithInv, Some(WIN))]
    );
    assert_eq!(
        s.nodes[0].mem.region(A_BUF).unwrap()[0x800..0x800 + 600],
        buf_b[..],
        "the READ returned the window's bytes"
    );
    assert_eq!(
        s.nodes[1].mem.region(B_RW).unwrap()[64..128],
        buf_b[64..128],
        "the WRITE after the invalidation wrote nothing"
    );
}

/// A refused SEND_WITH_INV after a READ, in one burst: the READ, executed before it, is
/// still answered in full before the responder's QP goes to ERR (as rxe, which answers a
/// READ before it looks at the next request); the receive completes REM_INV_REQ_ERR.
#[test]
fn a_read_before_a_refused_send_with_inv_is_still_answered() {
    let mut s = sim(Some(B_QPN));
    let buf_b: Vec<u8> = s.nodes[1].mem.region(B_RW).unwrap()[..600].to_vec();
    post_window_read(&mut s);
    s.nodes[0].qp.post_send(send_inv(9, 8, 0x300)).unwrap(); // a region's rkey
    let requests = transmit(&mut s, 0);
    deliver(&mut s, 1, &requests);
    assert_eq!(s.nodes[1].qp.state(), QpState::Err);
    let responses = transmit(&mut s, 1);
    deliver(&mut s, 0, &responses);
    let (a, b) = run(&mut s);
    assert_eq!(
        statuses(&a),
        vec![(8, WcStatus::Success), (9, WcStatus::Success)]
    );
    assert_eq!(statuses(&b), vec![(60, WcStatus::RemInvReqErr)]);
    assert_eq!(
        s.nodes[0].mem.region(A_BUF).unwrap()[0x800..0x800 + 600],
        buf_b[..],
        "the READ returned the window's bytes"
    );
    assert!(s.nodes[1].mem.window_valid(WIN));
}

/// The other side of that rule: a QP that fails on its own side (here a modify to ERR; the
/// same path as retries exhausted or a local error) drops the READ responses it had
/// queued: its peer may be gone, and a zero-copy response that cannot leave would hold the
/// window it reads through (on the soft provider, an invalidation then waits for it; a
/// veth taken down made the messenger's link fault 1 s late that way).
#[test]
fn a_qp_failing_on_its_own_side_drops_queued_read_responses() {
    let mut s = sim(Some(B_QPN));
    post_window_read(&mut s);
    s.nodes[0]
        .qp
        .post_send(wr(9, WrOpcode::Send, 8, 0, 0, 0))
        .unwrap();
    let requests = transmit(&mut s, 0);
    deliver(&mut s, 1, &requests);
    // Queued at B now: the READ's responses, then the SEND's ACK.
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    s.nodes[1].qp.modify(&attr, attr_mask::STATE).unwrap();
    let opcodes: Vec<u8> = transmit(&mut s, 1).iter().map(|p| p[0]).collect();
    assert!(
        opcodes.iter().all(|&o| o == 0x11),
        "only the ACK leaves a QP in ERR, no READ response (0x0d-0x10): {opcodes:x?}"
    );
}

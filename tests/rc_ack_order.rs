//! The order of a QP's two flows in one transmit batch: requests leave before positive ACKs
//! queued with them (so a held ACK and the answer it was held for arrive answer first, and a
//! peer polling for the ACK finds the answer already received), while a READ response, which
//! answers the peer's request, still leaves first.

mod common;

use common::{Faults, Params, Sim, drain_transmit};
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{QpCaps, SendWr, Sge, WrOpcode, smallvec};
use rdmx::wire::Opcode;

const BUF: u32 = 1; // lkey of each node's buffer, at 0x1000
const RW: u32 = 2; // rkey 0x200 of each node's remote-accessible region, at 0x20_0000

fn sim() -> Sim {
    let mut s = Sim::pair(
        7,
        Faults::NONE,
        Params::default(),
        Params::default(),
        QpCaps::default(),
        10,
        20,
    );
    let rw = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
    for n in &mut s.nodes {
        n.mem
            .add_region(0x1000, 4096, BUF, 0x100, access::LOCAL_WRITE);
        n.mem.add_region(0x20_0000, 4096, RW, 0x200, rw);
    }
    s
}

fn wr(wr_id: u64, opcode: WrOpcode, len: u32) -> SendWr {
    SendWr {
        wr_id,
        opcode,
        flags: send_flags::SIGNALED,
        sges: smallvec![Sge {
            addr: 0x1000,
            length: len,
            lkey: BUF,
        }],
        remote_addr: 0x20_0000,
        rkey: 0x200,
        imm: 0,
    }
}

/// Node `from`'s packets, handed to the other node.
fn deliver_all(s: &mut Sim, from: usize) -> Vec<Opcode> {
    let mut buf = vec![0u8; 4096 + 64];
    let mut pkts = Vec::new();
    {
        let n = &mut s.nodes[from];
        while let Some(len) = n.qp.poll_transmit(0, &n.mem, &mut buf) {
            pkts.push(buf[..len].to_vec());
        }
    }
    let to = &mut s.nodes[1 - from];
    let mut ops = Vec::new();
    for p in &pkts {
        ops.push(common::parse(p).expect("engine output parses").0.opcode);
        to.qp.handle_packet(0, p, &mut to.mem);
    }
    ops
}

#[test]
fn an_answer_leaves_before_the_ack_queued_with_it() {
    let mut s = sim();
    // A writes to B; B has the ACK queued and answers with a WRITE of its own before it
    // transmits (what a driver holding ACKs for the answer does).
    s.nodes[0]
        .qp
        .post_send(wr(1, WrOpcode::RdmaWrite, 8))
        .unwrap();
    assert_eq!(deliver_all(&mut s, 0), [Opcode::RdmaWriteOnly]);
    assert!(s.nodes[1].qp.only_acks_to_send());
    s.nodes[1]
        .qp
        .post_send(wr(2, WrOpcode::RdmaWrite, 8))
        .unwrap();
    let b = &mut s.nodes[1];
    let out = drain_transmit(&mut b.qp, 0, &b.mem);
    let ops: Vec<Opcode> = out.iter().map(|(h, _)| h.opcode).collect();
    assert_eq!(ops, [Opcode::RdmaWriteOnly, Opcode::Acknowledge]);
}

#[test]
fn a_read_response_still_leaves_before_a_request() {
    let mut s = sim();
    s.nodes[0]
        .qp
        .post_send(wr(1, WrOpcode::RdmaRead, 64))
        .unwrap();
    assert_eq!(deliver_all(&mut s, 0), [Opcode::RdmaReadRequest]);
    assert!(!s.nodes[1].qp.only_acks_to_send());
    s.nodes[1]
        .qp
        .post_send(wr(2, WrOpcode::RdmaWrite, 8))
        .unwrap();
    let b = &mut s.nodes[1];
    let out = drain_transmit(&mut b.qp, 0, &b.mem);
    let ops: Vec<Opcode> = out.iter().map(|(h, _)| h.opcode).collect();
    assert_eq!(ops, [Opcode::RdmaReadResponseOnly, Opcode::RdmaWriteOnly]);
}

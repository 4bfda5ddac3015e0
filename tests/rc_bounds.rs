//! Bounded from the network (issue 16, item 3): every queue a peer's packets can grow has a
//! bound and a defined behaviour at it. Each test plays a hostile peer, feeding crafted
//! packets straight into a responder QP through the public engine API, and measures the
//! queue by what comes out of `poll_transmit` and the counters.

mod common;

use common::{Hdr, Params, connect, craft, drain_transmit};
use rdmx::error::ErrorKind;
use rdmx::rc::verbs::{access, attr_mask};
use rdmx::rc::{
    Qp, QpAttr, QpCaps, QpState, RecvWr, SendWr, Sge, VecMemory, WcStatus, WrOpcode, smallvec,
};
use rdmx::wire::{NakCode, Opcode, RethRepr, Syndrome};

const FLOOD: u32 = 100_000;
/// The responder's expected PSN at the start.
const E: u32 = 100;
const ME: u32 = 0x22;
const RKEY: u32 = 0x200;
const VA: u64 = 0x10_0000;

/// A responder QP in RTS (max_dest_rd_atomic 4, path MTU 256) exposing 8 KiB for READ.
fn responder(caps: QpCaps) -> (Qp, VecMemory) {
    let mut qp = Qp::new(ME, caps);
    connect(&mut qp, 0x11, 7, E, &Params::default());
    let mut mem = VecMemory::new();
    mem.add_region(VA, 8192, 2, RKEY, access::REMOTE_READ);
    (qp, mem)
}

fn read_req(psn: u32, va: u64, len: u32) -> Vec<u8> {
    let mut h = Hdr::new(Opcode::RdmaReadRequest, ME, psn & 0xFF_FFFF);
    h.ack_req = true;
    h.reth = Some(RethRepr {
        va,
        rkey: RKEY,
        dma_len: len,
    });
    craft(&h, &[])
}

fn feed(qp: &mut Qp, mem: &mut VecMemory, pkt: &[u8]) {
    qp.handle_packet(0, pkt, mem);
}

/// (opcode, PSN) of each packet.
fn ops(pkts: &[(Hdr, usize)]) -> Vec<(Opcode, u32)> {
    pkts.iter().map(|(h, _)| (h.opcode, h.psn)).collect()
}

fn ack(syn: Syndrome, psn: u32) -> (Opcode, u32, Option<Syndrome>) {
    (Opcode::Acknowledge, psn, Some(syn))
}

fn acks(pkts: &[(Hdr, usize)]) -> Vec<(Opcode, u32, Option<Syndrome>)> {
    pkts.iter()
        .map(|(h, _)| (h.opcode, h.psn, h.aeth.map(|a| a.syndrome)))
        .collect()
}

/// The four responses of a 1 KiB READ at PSN `p`.
fn read_stream(p: u32) -> Vec<(Opcode, u32)> {
    vec![
        (Opcode::RdmaReadResponseFirst, p),
        (Opcode::RdmaReadResponseMiddle, p + 1),
        (Opcode::RdmaReadResponseMiddle, p + 2),
        (Opcode::RdmaReadResponseLast, p + 3),
    ]
}

/// §5.4: a duplicate READ is answered by replaying it, but a flood of duplicates queues one
/// replay, not one per duplicate (was: 100,000 replays, 400,000 packets queued).
#[test]
fn duplicate_read_flood_queues_one_replay() {
    let (mut qp, mut mem) = responder(QpCaps::default());
    feed(&mut qp, &mut mem, &read_req(E, VA, 1024));
    assert_eq!(ops(&drain_transmit(&mut qp, 0, &mem)), read_stream(E));
    for _ in 0..FLOOD {
        feed(&mut qp, &mut mem, &read_req(E, VA, 1024));
    }
    assert_eq!(
        ops(&drain_transmit(&mut qp, 0, &mem)),
        read_stream(E),
        "one replay"
    );
    let c = *qp.counters();
    assert_eq!(c.duplicates_received, u64::from(FLOOD));
    assert_eq!(c.dropped_duplicate_reads, u64::from(FLOOD) - 1);
    assert_eq!(qp.state(), QpState::Rts, "duplicates are not an error");
    // Once the replay is out, the next duplicate is replayed again.
    feed(&mut qp, &mut mem, &read_req(E, VA, 1024));
    assert_eq!(ops(&drain_transmit(&mut qp, 0, &mem)), read_stream(E));
}

/// Duplicates of every saved READ, interleaved, mid-stream ones included: at most one
/// response stream per READ is queued.
#[test]
fn duplicates_of_several_reads_queue_one_stream_each() {
    let (mut qp, mut mem) = responder(QpCaps::default());
    for k in 0..4 {
        feed(
            &mut qp,
            &mut mem,
            &read_req(E + 4 * k, VA + 1024 * u64::from(k), 1024),
        );
    }
    assert_eq!(drain_transmit(&mut qp, 0, &mem).len(), 16);
    for i in 0..FLOOD {
        let k = i % 4;
        let j = (i / 4) % 4; // the duplicate asks from the j-th packet on
        let va = VA + 1024 * u64::from(k) + 256 * u64::from(j);
        feed(
            &mut qp,
            &mut mem,
            &read_req(E + 4 * k + j, va, 1024 - 256 * j),
        );
    }
    let pkts = drain_transmit(&mut qp, 0, &mem);
    // The first duplicate of each READ asked from its first packet: that stream is queued;
    // the rest joined it.
    let want: Vec<_> = (0..4).flat_map(|k| read_stream(E + 4 * k)).collect();
    assert_eq!(ops(&pkts), want);
    assert_eq!(qp.counters().dropped_duplicate_reads, u64::from(FLOOD) - 4);
}

/// A duplicate of a READ whose responses are being sent rewinds that stream to the
/// duplicate's PSN (the requester lost what was sent from there) instead of queueing a
/// second one; a duplicate of what is still to come is dropped.
#[test]
fn duplicate_of_a_stream_in_progress_rewinds_it() {
    let (mut qp, mut mem) = responder(QpCaps::default());
    feed(&mut qp, &mut mem, &read_req(E, VA, 1024));
    let mut buf = vec![0u8; 4096];
    for _ in 0..3 {
        qp.poll_transmit(0, &mem, &mut buf).unwrap(); // E, E+1, E+2 sent
    }
    feed(&mut qp, &mut mem, &read_req(E + 1, VA + 256, 768));
    feed(&mut qp, &mut mem, &read_req(E + 3, VA + 768, 256)); // still to come
    assert_eq!(
        ops(&drain_transmit(&mut qp, 0, &mem)),
        read_stream(E)[1..].to_vec()
    );
    assert_eq!(qp.counters().dropped_duplicate_reads, 2);
}

/// §5.5: a peer with more READs outstanding than our max_dest_rd_atomic (4) is told so
/// with NAK Invalid Request and the QP goes to ERR; nothing beyond 4 READs' responses is
/// ever queued (was: 100,000 queued).
#[test]
fn reads_beyond_max_dest_rd_atomic_are_refused() {
    let (mut qp, mut mem) = responder(QpCaps::default());
    for k in 0..FLOOD {
        feed(&mut qp, &mut mem, &read_req(E + k, VA, 64));
    }
    let pkts = drain_transmit(&mut qp, 0, &mem);
    // The four READs within the limit came first and are answered (in order, as rxe), then
    // the NAK; nothing after it.
    let only = |p| {
        (
            Opcode::RdmaReadResponseOnly,
            p,
            Some(Syndrome::ACK_UNLIMITED),
        )
    };
    let mut want: Vec<_> = (0..4).map(|k| only(E + k)).collect();
    want.push(ack(Syndrome::Nak(NakCode::InvalidRequest), E + 4));
    assert_eq!(acks(&pkts), want, "the READs before the NAK, then the NAK");
    assert_eq!(qp.state(), QpState::Err);
    assert_eq!(qp.counters().rd_atomic_exceeded, 1);
}

/// Within the limit, READs whose responses have gone out free their resource: a peer
/// that keeps to max_dest_rd_atomic outstanding is served for ever.
#[test]
fn reads_within_max_dest_rd_atomic_are_served() {
    let (mut qp, mut mem) = responder(QpCaps::default());
    let mut psn = E;
    for _ in 0..1000 {
        for _ in 0..4 {
            feed(&mut qp, &mut mem, &read_req(psn, VA, 64));
            psn += 1;
        }
        let pkts = drain_transmit(&mut qp, 0, &mem);
        assert_eq!(pkts.len(), 4);
        assert!(
            pkts.iter()
                .all(|(h, _)| h.opcode == Opcode::RdmaReadResponseOnly)
        );
    }
    assert_eq!(qp.state(), QpState::Rts);
    assert_eq!(qp.counters().rd_atomic_exceeded, 0);
}

/// §5.2: every SEND without a receive WQE earns an RNR NAK, but a flood of them queues
/// one (was: one per packet).
#[test]
fn rnr_nak_flood_queues_one_nak() {
    let (mut qp, mut mem) = responder(QpCaps::default());
    let mut h = Hdr::new(Opcode::SendOnly, ME, E);
    h.ack_req = true;
    let pkt = craft(&h, &[7; 16]);
    for _ in 0..FLOOD {
        feed(&mut qp, &mut mem, &pkt);
    }
    let pkts = drain_transmit(&mut qp, 0, &mem);
    let rnr = Syndrome::RnrNak {
        timer: Params::default().min_rnr_timer,
    };
    assert_eq!(acks(&pkts), vec![ack(rnr, E)]);
    assert_eq!(qp.counters().rnr_naks_sent, 1, "counted as sent");
    assert_eq!(qp.state(), QpState::Rts);
}

/// §3.3/§3.4: gaps (sequence NAK) and duplicate SEND/WRITEs (re-ACK) each want an
/// answer; flooded, they coalesce into the latest one (was: one per gap).
#[test]
fn sequence_naks_and_reacks_coalesce() {
    let (mut qp, mut mem) = responder(QpCaps::default());
    mem.add_region(
        0x20_0000,
        64,
        3,
        0x300,
        access::LOCAL_WRITE | access::REMOTE_WRITE,
    );
    let write = |psn: u32, ack_req: bool| {
        let mut h = Hdr::new(Opcode::RdmaWriteOnly, ME, psn);
        h.ack_req = ack_req;
        h.reth = Some(RethRepr {
            va: 0x20_0000,
            rkey: 0x300,
            dma_len: 8,
        });
        craft(&h, &[1; 8])
    };
    let n = FLOOD / 2;
    for k in 0..n {
        // In sequence, no AckReq (clears "NAK sent"), then a gap: a sequence NAK each time.
        feed(&mut qp, &mut mem, &write(E + k, false));
        feed(&mut qp, &mut mem, &write(E + k + 5, true));
    }
    let pkts = drain_transmit(&mut qp, 0, &mem);
    assert_eq!(
        acks(&pkts),
        vec![ack(Syndrome::Nak(NakCode::PsnSequenceError), E + n)]
    );
    assert_eq!(qp.counters().seq_naks_sent, 1);
    // Duplicates of accepted WRITEs: re-ACKed with the last accepted PSN, once.
    for k in 0..FLOOD {
        feed(&mut qp, &mut mem, &write(E + k % n, false));
    }
    let pkts = drain_transmit(&mut qp, 0, &mem);
    assert_eq!(acks(&pkts), vec![ack(Syndrome::ACK_UNLIMITED, E + n - 1)]);
    assert_eq!(qp.state(), QpState::Rts);
}

/// ACKs between READ response streams: at most one per gap between streams, so the whole
/// queue stays within a few items per READ resource whatever is interleaved.
#[test]
fn mixed_flood_stays_bounded() {
    let (mut qp, mut mem) = responder(QpCaps::default());
    for k in 0..4 {
        feed(
            &mut qp,
            &mut mem,
            &read_req(E + 4 * k, VA + 1024 * u64::from(k), 1024),
        );
    }
    let mut h = Hdr::new(Opcode::SendOnly, ME, E + 16);
    h.ack_req = true;
    let send = craft(&h, &[7; 16]);
    for i in 0..FLOOD {
        let k = i % 4;
        feed(
            &mut qp,
            &mut mem,
            &read_req(E + 4 * k, VA + 1024 * u64::from(k), 1024),
        );
        feed(&mut qp, &mut mem, &send); // RNR NAK
        feed(&mut qp, &mut mem, &read_req(E + 17 + i, VA, 64)); // a gap: sequence NAK
    }
    let pkts = drain_transmit(&mut qp, 0, &mem);
    // 4 original streams (each duplicate joined its own), then one NAK: the RNR NAKs for
    // PSN E+16 coalesced into the latest, the sequence NAKs behind them dropped (the RNR
    // NAK's wait is the news).
    let want: Vec<_> = (0..4).flat_map(|k| read_stream(E + 4 * k)).collect();
    assert_eq!(ops(&pkts[..16]), want);
    let rnr = Syndrome::RnrNak {
        timer: Params::default().min_rnr_timer,
    };
    assert_eq!(acks(&pkts[16..]), vec![ack(rnr, E + 16)]);
    assert_eq!(qp.counters().rnr_naks_sent, 1);
    assert_eq!(qp.state(), QpState::Rts);
}

fn send_wr(id: u64) -> SendWr {
    SendWr {
        wr_id: id,
        opcode: WrOpcode::Send,
        flags: 0,
        sges: smallvec![],
        remote_addr: 0,
        rkey: 0,
        imm: 0,
    }
}

fn recv_wr(id: u64) -> RecvWr {
    RecvWr {
        wr_id: id,
        sges: smallvec![Sge {
            addr: VA,
            length: 64,
            lkey: 2,
        }],
    }
}

/// §4.8: a WR posted in ERR completes at once with WR_FLUSH_ERR, but still holds its queue
/// slot until that completion is polled: past max_send_wr / max_recv_wr waiting, posting
/// is refused with Full (was: accepted without limit, completions growing for ever).
#[test]
fn posting_in_err_is_bounded_by_the_queue_sizes() {
    let caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 6,
        ..QpCaps::default()
    };
    let (mut qp, mut mem) = responder(caps);
    for k in 0..2 {
        qp.post_recv(recv_wr(k)).unwrap();
    }
    // A hostile peer's bad opcode sequence puts the QP in ERR (NAK Invalid Request);
    // the two posted receives are flushed.
    feed(
        &mut qp,
        &mut mem,
        &craft(&Hdr::new(Opcode::SendLast, ME, E), &[1; 4]),
    );
    assert_eq!(qp.state(), QpState::Err);
    let mut sends_ok = 0;
    let mut recvs_ok = 0;
    for k in 0..u64::from(FLOOD) {
        match qp.post_send(send_wr(100 + k)) {
            Ok(()) => sends_ok += 1,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Full);
                assert_eq!(
                    e.message(),
                    "post_send: send queue full (8 WRs outstanding = max_send_wr)"
                );
            }
        }
        match qp.post_recv(recv_wr(1_000_000 + k)) {
            Ok(()) => recvs_ok += 1,
            Err(e) => assert_eq!(e.kind(), ErrorKind::Full),
        }
    }
    assert_eq!((sends_ok, recvs_ok), (8, 6 - 2));
    // Polling frees the slots: one send and one receive completion polled, one more each.
    let mut first_send = None;
    let mut first_recv = None;
    let mut all = Vec::new();
    while let Some(c) = qp.poll_completion() {
        all.push(c);
    }
    assert_eq!(all.len(), 14);
    assert!(all.iter().all(|c| c.status == WcStatus::WrFlushErr));
    for c in &all {
        if c.is_recv {
            first_recv.get_or_insert(c.wr_id);
        } else {
            first_send.get_or_insert(c.wr_id);
        }
    }
    assert_eq!((first_send, first_recv), (Some(100), Some(0)));
    for k in 0..8 {
        qp.post_send(send_wr(k)).unwrap();
    }
    assert!(qp.post_send(send_wr(9)).is_err());
    for k in 0..6 {
        qp.post_recv(recv_wr(k)).unwrap();
    }
    assert!(qp.post_recv(recv_wr(9)).is_err());
    // A reset QP forgets its completions; nothing is refused on its way back up.
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    qp.modify(&reset, attr_mask::STATE).unwrap();
    assert!(qp.poll_completion().is_none());
}

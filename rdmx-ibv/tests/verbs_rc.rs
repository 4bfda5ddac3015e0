//! The RC data path through the verbs objects, between two devices on their own loopback
//! addresses: SEND/RECV, SEND_WITH_IMM, RDMA WRITE[_WITH_IMM], RDMA READ (the passive side
//! never polls: its progress thread serves it), inline and unsignaled sends, query_qp.

mod verbs_support;

use rdmx_ibv::verbs::*;
use std::time::Duration;
use verbs_support::*;

#[test]
fn send_imm_write_read_between_two_devices() {
    let (a, b) = pair(
        "127.0.71.2",
        "127.0.71.3",
        &Opts::default(),
        &Opts::default(),
    );
    // SEND / RECV.
    b.post_recv(1, 0, 1024);
    a.write(4096, b"hello, verbs");
    a.post(a.wr(10, WrOpcode::Send, 4096, 12)).unwrap();
    let s = wait_wc(&a.scq);
    assert_eq!(
        (s.wr_id, s.status, s.opcode, s.qp_num),
        (10, 0, 0, a.qp.qp_num())
    );
    let r = wait_wc(&b.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len, r.wc_flags),
        (1, 0, 128, 12, 0)
    );
    assert_eq!(r.qp_num, b.qp.qp_num());
    assert_eq!(b.read(0, 12), b"hello, verbs");

    // SEND_WITH_IMM: imm_data travels as the bytes the application stored.
    b.post_recv(2, 1024, 1024);
    let imm = 0x1234_5678u32.to_be();
    let mut wr = a.wr(11, WrOpcode::SendWithImm, 4096, 5);
    wr.imm_data = imm;
    a.post(wr).unwrap();
    assert_eq!(wait_wc(&a.scq).status, 0);
    let r = wait_wc(&b.rcq);
    assert_eq!((r.wr_id, r.opcode, r.byte_len), (2, 128, 5));
    assert_eq!(r.wc_flags & wc_flags::WITH_IMM, wc_flags::WITH_IMM);
    assert_eq!(r.imm_data, imm);

    // RDMA WRITE: B does not poll; its memory changes.
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    a.write(8192, &data);
    let mut wr = a.wr(12, WrOpcode::RdmaWrite, 8192, data.len() as u32);
    wr.remote_addr = b.addr(16384);
    wr.rkey = b.mr.rkey;
    a.post(wr).unwrap();
    let s = wait_wc(&a.scq);
    assert_eq!((s.wr_id, s.status, s.opcode), (12, 0, 1));
    assert_eq!(b.read(16384, data.len()), data);

    // RDMA WRITE_WITH_IMM: a receive completion RECV_RDMA_WITH_IMM with the length.
    b.post_recv(3, 0, 16);
    let mut wr = a.wr(13, WrOpcode::RdmaWriteWithImm, 8192, 100);
    wr.remote_addr = b.addr(32768);
    wr.rkey = b.mr.rkey;
    wr.imm_data = 7u32.to_be();
    a.post(wr).unwrap();
    assert_eq!(wait_wc(&a.scq).status, 0);
    let r = wait_wc(&b.rcq);
    assert_eq!((r.wr_id, r.status, r.opcode, r.byte_len), (3, 0, 129, 100));
    assert_eq!(r.imm_data, 7u32.to_be());
    assert_eq!(b.read(32768, 100), data[..100]);

    // RDMA READ: B's memory into A's; B makes no call.
    b.write(40000, &data[..5000]);
    let mut wr = a.wr(14, WrOpcode::RdmaRead, 20000, 5000);
    wr.remote_addr = b.addr(40000);
    wr.rkey = b.mr.rkey;
    a.post(wr).unwrap();
    let s = wait_wc(&a.scq);
    assert_eq!((s.wr_id, s.status, s.opcode, s.byte_len), (14, 0, 2, 5000));
    assert_eq!(a.read(20000, 5000), data[..5000]);

    // query_qp: RTS with what was set.
    let (q, init) = a.qp.query(0);
    assert_eq!((q.qp_state, q.cur_qp_state), (QpState::Rts, QpState::Rts));
    assert_eq!(q.dest_qp_num, b.qp.qp_num());
    assert_eq!((q.timeout, q.retry_cnt, q.path_mtu), (14, 7, 3));
    assert_eq!(q.ah_attr.dgid, b.dev.gid(0).unwrap());
    assert_eq!(init.cap.max_send_wr, 64);
    assert!(init.srq.is_none());
}

#[test]
fn inline_and_unsignaled_sends() {
    let oa = Opts {
        sq_sig_all: false,
        max_inline: 128,
        ..Opts::default()
    };
    let (a, b) = pair("127.0.71.4", "127.0.71.5", &oa, &Opts::default());
    for i in 0..20u64 {
        b.post_recv(i, i as usize * 256, 256);
    }
    // 19 unsignaled inline sends from one buffer rewritten after every post (inline data
    // is copied at post time), then one signaled.
    for i in 0..20u64 {
        let msg = format!("inline message {i:02}");
        a.write(0, msg.as_bytes());
        let mut wr = a.wr(100 + i, WrOpcode::Send, 0, msg.len() as u32);
        wr.send_flags = send_flags::INLINE | if i == 19 { send_flags::SIGNALED } else { 0 };
        wr.sg_list[0].lkey = 0xdead_beef; // ignored for inline data, as verbs
        a.post(wr).unwrap();
        a.write(0, b"XXXXXXXXXXXXXXXXXX");
    }
    for i in 0..20u64 {
        let r = wait_wc(&b.rcq);
        assert_eq!((r.wr_id, r.status), (i, 0));
        let want = format!("inline message {i:02}");
        assert_eq!(b.read(i as usize * 256, want.len()), want.as_bytes());
    }
    let s = wait_wc(&a.scq);
    assert_eq!(s.wr_id, 119, "only the signaled send completes");
    no_wc(&a.scq, Duration::from_millis(50));
    // Too much inline data is refused at post time, with its index.
    let mut wr = a.wr(200, WrOpcode::Send, 0, 129);
    wr.send_flags = send_flags::INLINE;
    let ok = a.wr(199, WrOpcode::Send, 0, 1);
    b.post_recv(50, 0, 16);
    // SAFETY: the SGEs name A's own buffer.
    let (i, e) = unsafe { a.qp.post_send(&[ok, wr]) }.unwrap_err();
    assert_eq!((i, e.kind()), (1, ErrorKind::InvalidArgument));
    assert_eq!(
        wait_wc(&b.rcq).wr_id,
        50,
        "the WR before the bad one was posted"
    );
    assert_eq!(wait_wc(&a.scq).wr_id, 199);
    // Inline with many SGEs, gathered in order.
    a.write(1000, b"abc");
    a.write(2000, b"defg");
    let mut wr = a.wr(201, WrOpcode::Send, 1000, 3);
    wr.sg_list.push(Sge {
        addr: a.addr(2000),
        length: 4,
        lkey: 0,
    });
    wr.send_flags = send_flags::INLINE | send_flags::SIGNALED;
    b.post_recv(51, 0, 16);
    a.post(wr).unwrap();
    assert_eq!(wait_wc(&a.scq).wr_id, 201);
    let r = wait_wc(&b.rcq);
    assert_eq!((r.wr_id, r.byte_len), (51, 7));
    assert_eq!(b.read(0, 7), b"abcdefg");
}

#[test]
fn many_sends_in_flight_reuse_the_inline_slots() {
    // More inline WRs than the send queue holds, posted as fast as the queue takes them:
    // every message arrives intact (a slot is never reused while its WR may be resent).
    let oa = Opts {
        max_inline: 64,
        ..Opts::default()
    };
    let (a, b) = pair("127.0.71.6", "127.0.71.7", &oa, &Opts::default());
    let total = 500u64;
    let mut next_recv = 0u64;
    let mut got = 0u64;
    let mut sent = 0u64;
    let t = std::time::Instant::now();
    while got < total {
        assert!(t.elapsed() < WAIT, "stuck at {got}/{total}");
        while next_recv < total && next_recv < got + 60 {
            b.post_recv(next_recv, (next_recv % 60) as usize * 64, 64);
            next_recv += 1;
        }
        if sent < total && sent < next_recv {
            let msg = (sent as u32).to_le_bytes().repeat(16);
            a.write(0, &msg);
            let mut wr = a.wr(sent, WrOpcode::Send, 0, 64);
            wr.send_flags = send_flags::INLINE | send_flags::SIGNALED;
            match a.post(wr) {
                Ok(()) => sent += 1,
                Err((_, e)) => assert_eq!(e.kind(), ErrorKind::Full),
            }
        }
        let mut wc = [WorkCompletion::default(); 16];
        let n = a.scq.poll(&mut wc);
        assert!(wc[..n].iter().all(|w| w.status == 0));
        let n = b.rcq.poll(&mut wc);
        for w in &wc[..n] {
            assert_eq!((w.wr_id, w.status), (got, 0));
            let v = b.read((got % 60) as usize * 64, 64);
            assert_eq!(v, (got as u32).to_le_bytes().repeat(16), "message {got}");
            got += 1;
        }
    }
}

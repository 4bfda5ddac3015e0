//! UD QPs on a real soft device (loopback): delivery with the GRH, completion fields,
//! Q_Key and missing-WQE drops, MTU limits, short buffers, modify masks, flushes.

use super::*;
use crate::config::Config;
use crate::provider::soft::device::SoftDevice;
use crate::provider::sys::EventFd;
use crate::rc::memory::Sge;
use crate::rc::verbs::access;
use crate::wire::ud::grh_ipv4;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const QKEY: u32 = 0x1111_1111;

fn device() -> SoftDevice {
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    SoftDevice::open(&c.settings().unwrap(), &[LO]).unwrap()
}

fn cq() -> Arc<Cq> {
    Arc::new(Cq::new(64, Arc::new(EventFd::new().unwrap())))
}

const CAPS: UdCaps = UdCaps {
    max_send_wr: 16,
    max_recv_wr: 16,
    max_send_sge: 2,
    max_recv_sge: 2,
};

/// A UD QP brought to RTS with Q_Key `QKEY`.
fn ud_qp(dev: &SoftDevice) -> Arc<UdQp> {
    let qp = dev.create_ud_qp(CAPS, LO, cq(), cq(), None).unwrap();
    let mrs = dev.mrs();
    let a = UdAttr {
        qp_state: QpState::Init,
        qkey: QKEY,
        ..UdAttr::default()
    };
    qp.modify(mrs, &a, m::STATE | m::PKEY_INDEX | m::PORT | ATTR_QKEY)
        .unwrap();
    let a = UdAttr {
        qp_state: QpState::Rtr,
        ..a
    };
    qp.modify(mrs, &a, m::STATE).unwrap();
    let a = UdAttr {
        qp_state: QpState::Rts,
        sq_psn: 0x00FF_FFFF,
        ..a
    };
    qp.modify(mrs, &a, m::STATE | m::SQ_PSN).unwrap();
    qp
}

/// A registered buffer (leaked: the device outlives nothing here but the test).
fn region(dev: &SoftDevice, len: usize) -> (&'static mut [u8], u32) {
    let buf: &'static mut [u8] = Box::leak(vec![0u8; len].into_boxed_slice());
    // SAFETY: the buffer is leaked, so it stays valid for as long as the region exists.
    let r = unsafe {
        dev.mrs()
            .register(buf.as_mut_ptr(), len, access::LOCAL_WRITE)
    }
    .unwrap();
    (buf, r.lkey)
}

fn sge(buf: &[u8], lkey: u32, off: usize, len: usize) -> SgeList {
    let mut l = SgeList::new();
    l.push(Sge {
        addr: buf.as_ptr() as u64 + off as u64,
        length: len as u32,
        lkey,
    });
    l
}

/// A signaled SEND (with `imm`: SEND_WITH_IMM) of `data` to `to`'s QP on `dev`.
fn req<'a>(
    dev: &SoftDevice,
    to: &UdQp,
    cookie: u64,
    imm: Option<u32>,
    data: UdData<'a>,
    qkey: u32,
) -> UdSendReq<'a> {
    UdSendReq {
        cookie,
        opcode: if imm.is_some() {
            WrOpcode::SendWithImm
        } else {
            WrOpcode::Send
        },
        flags: send_flags::SIGNALED,
        data,
        imm: imm.unwrap_or(0),
        dest: UdDest {
            addr: dev.udp_addr(),
            remote_qpn: to.qpn(),
            remote_qkey: qkey,
        },
    }
}

/// Polls `c` (driving the device) until a completion arrives or 2 s pass.
fn wait(dev: &SoftDevice, c: &Cq) -> Option<Wc> {
    let end = Instant::now() + Duration::from_secs(2);
    let mut out = [Wc {
        cookie: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qp_num: 0,
        src_qp: None,
    }];
    while Instant::now() < end {
        dev.progress_inline();
        if c.poll(&mut out) == 1 {
            return Some(out[0]);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

#[test]
fn a_send_arrives_behind_the_grh_with_the_ud_completion_fields() {
    let dev = device();
    let (a, b) = (ud_qp(&dev), ud_qp(&dev));
    let (buf, lkey) = region(&dev, 256);
    let (n, e) = b.post_recv(dev.mrs(), &[(7, sge(buf, lkey, 0, 256))]);
    assert_eq!((n, e.map(|e| e.to_string())), (1, None));
    let (src, skey) = region(&dev, 5);
    src.copy_from_slice(b"hello");
    let w = req(
        &dev,
        &b,
        9,
        Some(0xDEAD_BEEF),
        UdData::Sges(sge(src, skey, 0, 5)),
        QKEY,
    );
    assert_eq!(a.post_send(dev.mrs(), &[w]).0, 1);
    let s = wait(&dev, &a.send_cq).expect("send completion");
    assert_eq!(
        (s.cookie, s.status, s.opcode),
        (9, WcStatus::Success, WcOpcode::Send)
    );
    let r = wait(&dev, &b.recv_cq).expect("receive completion");
    assert_eq!(r.cookie, 7);
    assert_eq!(r.status, WcStatus::Success);
    assert_eq!(r.opcode, WcOpcode::Recv);
    assert_eq!(r.byte_len, 40 + 5);
    assert_eq!(r.imm, Some(0xDEAD_BEEF));
    assert_eq!(r.qp_num, b.qpn());
    assert_eq!(r.src_qp, Some(a.qpn()));
    assert_eq!(&buf[40..45], b"hello");
    // The GRH area: 20 zero bytes, then the IPv4 header of the packet (UDP payload 36
    // bytes: BTH 12 + DETH 8 + ImmDt 4 + 8 payload/pad + ICRC 4).
    assert_eq!(
        &buf[..40],
        &grh_ipv4(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST, 36)
    );
    // The PSN only counts (it wrapped from 0xFFFFFF), nothing is acknowledged.
    assert_eq!(a.attr().sq_psn, 0);
    assert_eq!(a.counters().sent, 1);
    assert_eq!(b.counters().received, 1);
    // Inline data and a plain SEND: no imm.
    b.post_recv(dev.mrs(), &[(8, sge(buf, lkey, 0, 256))]);
    a.post_send(
        dev.mrs(),
        &[req(&dev, &b, 10, None, UdData::Inline(b"xy"), QKEY)],
    );
    let r = wait(&dev, &b.recv_cq).expect("second receive");
    assert_eq!((r.cookie, r.byte_len, r.imm), (8, 42, None));
    assert_eq!(&buf[40..42], b"xy");
}

#[test]
fn a_wrong_qkey_or_a_missing_wqe_drops_the_packet_and_counts_it() {
    let dev = device();
    let (a, b) = (ud_qp(&dev), ud_qp(&dev));
    let (buf, lkey) = region(&dev, 128);
    b.post_recv(dev.mrs(), &[(1, sge(buf, lkey, 0, 128))]);
    a.post_send(
        dev.mrs(),
        &[req(&dev, &b, 1, None, UdData::Inline(b"bad"), QKEY + 1)],
    );
    assert!(
        wait(&dev, &a.send_cq).is_some(),
        "the sender completes anyway"
    );
    let end = Instant::now() + Duration::from_secs(2);
    while b.counters().qkey_violations == 0 && Instant::now() < end {
        dev.progress_inline();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(b.counters().qkey_violations, 1);
    assert!(b.recv_cq.is_empty(), "no completion for a dropped packet");
    // The WQE is still there for a packet with the right Q_Key.
    a.post_send(
        dev.mrs(),
        &[req(&dev, &b, 2, None, UdData::Inline(b"ok"), QKEY)],
    );
    let r = wait(&dev, &b.recv_cq).expect("delivered");
    assert_eq!((r.cookie, r.byte_len), (1, 42));
    // Now no WQE is posted: dropped and counted.
    a.post_send(
        dev.mrs(),
        &[req(&dev, &b, 3, None, UdData::Inline(b"lost"), QKEY)],
    );
    let end = Instant::now() + Duration::from_secs(2);
    while b.counters().no_recv_wqe == 0 && Instant::now() < end {
        dev.progress_inline();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(b.counters().no_recv_wqe, 1);
    assert_eq!(b.counters().received, 1);
}

#[test]
fn an_mtu_sized_message_passes_and_a_larger_one_is_refused_at_post() {
    let dev = device();
    let (a, b) = (ud_qp(&dev), ud_qp(&dev));
    let mtu = a.mtu() as usize;
    assert!((256..=4096).contains(&mtu), "{mtu}");
    let (buf, lkey) = region(&dev, 40 + mtu);
    let (src, skey) = region(&dev, mtu + 1);
    for (i, x) in src.iter_mut().enumerate() {
        *x = i as u8;
    }
    b.post_recv(dev.mrs(), &[(1, sge(buf, lkey, 0, 40 + mtu))]);
    let big = req(
        &dev,
        &b,
        1,
        None,
        UdData::Sges(sge(src, skey, 0, mtu + 1)),
        QKEY,
    );
    let (n, e) = a.post_send(dev.mrs(), &[big]);
    let e = e.expect("refused");
    assert_eq!((n, e.kind()), (0, ErrorKind::InvalidArgument));
    assert!(e.message().contains("exceeds the MTU"), "{e}");
    assert!(a.send_cq.is_empty());
    let fit = req(
        &dev,
        &b,
        2,
        None,
        UdData::Sges(sge(src, skey, 0, mtu)),
        QKEY,
    );
    assert_eq!(a.post_send(dev.mrs(), &[fit]).0, 1);
    let r = wait(&dev, &b.recv_cq).expect("MTU-sized message");
    assert_eq!(
        (r.status, r.byte_len as usize),
        (WcStatus::Success, 40 + mtu)
    );
    assert_eq!(&buf[40..40 + mtu], &src[..mtu]);
}

#[test]
fn a_receive_buffer_without_room_for_the_grh_completes_with_a_length_error() {
    let dev = device();
    let (a, b) = (ud_qp(&dev), ud_qp(&dev));
    let (buf, lkey) = region(&dev, 64);
    b.post_recv(dev.mrs(), &[(5, sge(buf, lkey, 0, 40))]);
    a.post_send(
        dev.mrs(),
        &[req(&dev, &b, 1, None, UdData::Inline(b"x"), QKEY)],
    );
    let r = wait(&dev, &b.recv_cq).expect("completion");
    assert_eq!((r.cookie, r.status), (5, WcStatus::LocLenErr));
}

#[test]
fn modify_follows_the_ud_masks_and_err_flushes_receives() {
    let dev = device();
    let qp = dev.create_ud_qp(CAPS, LO, cq(), cq(), None).unwrap();
    let mrs = dev.mrs();
    let init = UdAttr {
        qp_state: QpState::Init,
        qkey: 5,
        ..UdAttr::default()
    };
    // RESET -> INIT needs the Q_Key; RC attributes are refused.
    let e = qp
        .modify(mrs, &init, m::STATE | m::PKEY_INDEX | m::PORT)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = qp
        .modify(
            mrs,
            &init,
            m::STATE | m::PKEY_INDEX | m::PORT | ATTR_QKEY | m::AV,
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(qp.state(), QpState::Reset);
    // Receives are refused in RESET, sends before RTS.
    let (buf, lkey) = region(&dev, 64);
    assert_eq!(qp.post_recv(mrs, &[(1, sge(buf, lkey, 0, 64))]).0, 0);
    qp.modify(mrs, &init, m::STATE | m::PKEY_INDEX | m::PORT | ATTR_QKEY)
        .unwrap();
    assert_eq!(qp.attr().qkey, 5);
    assert_eq!(qp.post_recv(mrs, &[(1, sge(buf, lkey, 0, 64))]).0, 1);
    let (n, e) = qp.post_send(mrs, &[req(&dev, &qp, 1, None, UdData::Inline(b"x"), 5)]);
    assert_eq!(
        (n, e.map(|e| e.kind())),
        (0, Some(ErrorKind::InvalidArgument))
    );
    // RTR -> RTS needs SQ_PSN.
    let rtr = UdAttr {
        qp_state: QpState::Rtr,
        ..init
    };
    qp.modify(mrs, &rtr, m::STATE).unwrap();
    let rts = UdAttr {
        qp_state: QpState::Rts,
        ..init
    };
    assert!(qp.modify(mrs, &rts, m::STATE).is_err());
    // ERR flushes the posted receive.
    let err = UdAttr {
        qp_state: QpState::Err,
        ..init
    };
    qp.modify(mrs, &err, m::STATE).unwrap();
    let w = wait(&dev, &qp.recv_cq).expect("flushed");
    assert_eq!((w.cookie, w.status), (1, WcStatus::WrFlushErr));
    // A send in ERR completes flushed.
    qp.post_send(mrs, &[req(&dev, &qp, 2, None, UdData::Inline(b"x"), 5)]);
    let w = wait(&dev, &qp.send_cq).expect("flushed send");
    assert_eq!((w.cookie, w.status), (2, WcStatus::WrFlushErr));
    dev.destroy_ud_qp(qp.qpn());
}

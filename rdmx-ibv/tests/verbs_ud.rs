//! UD through the verbs objects, between two devices on their own loopback addresses:
//! address handles, SEND/SEND_WITH_IMM with the 40-byte GRH in front of the payload, the
//! UD completion fields, Q_Key checks, MTU-sized messages (and larger ones refused at
//! post), the UD modify masks, and the AH's and QP type's refusals.

mod verbs_support;

use rdmx_ibv::verbs::*;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;
use verbs_support::*;

const QKEY: u32 = 0x1111_1111;
/// `IBV_QP_QKEY`.
const ATTR_QKEY: u32 = 1 << 6;
const BUFLEN: usize = 16 * 1024;

struct UdSide {
    ip: Ipv4Addr,
    pd: Arc<Pd>,
    buf: Box<[u8]>,
    mr: Mr,
    scq: Arc<Cq>,
    rcq: Arc<Cq>,
    qp: Arc<UdQp>,
    // Last: dropped after the QP (fields drop in order).
    _dev: Arc<Device>,
}

impl UdSide {
    fn new(ip: &str) -> UdSide {
        let dev = Device::open(&settings(ip, &[])).expect("open device");
        let pd = Pd::new(&dev, 0x1000);
        let mut buf = vec![0u8; BUFLEN].into_boxed_slice();
        // SAFETY: the buffer outlives the region (Drop deregisters it first).
        let mr =
            unsafe { pd.reg_mr(buf.as_mut_ptr(), buf.len(), access::LOCAL_WRITE, 0x2000) }.unwrap();
        let scq = Cq::new(&dev, 64, None, 0x3000).unwrap();
        let rcq = Cq::new(&dev, 64, None, 0x4000).unwrap();
        let qp = UdQp::new(&pd, &init(&scq, &rcq, QPT_UD), 0x6000).unwrap();
        let mut a = QpAttr {
            qp_state: QpState::Init,
            qkey: QKEY,
            port_num: 1,
            ..QpAttr::default()
        };
        qp.modify(
            &a,
            attr_mask::STATE | attr_mask::PKEY_INDEX | attr_mask::PORT | ATTR_QKEY,
        )
        .unwrap();
        a.qp_state = QpState::Rtr;
        qp.modify(&a, attr_mask::STATE).unwrap();
        a.qp_state = QpState::Rts;
        a.sq_psn = 0x42;
        qp.modify(&a, attr_mask::STATE | attr_mask::SQ_PSN).unwrap();
        UdSide {
            ip: ip.parse().unwrap(),
            pd,
            buf,
            mr,
            scq,
            rcq,
            qp,
            _dev: dev,
        }
    }

    fn sge(&self, off: usize, len: usize) -> SgeList {
        let mut l = SgeList::new();
        l.push(Sge {
            addr: self.buf.as_ptr() as u64 + off as u64,
            length: len as u32,
            lkey: self.mr.lkey,
        });
        l
    }

    fn ah_to(&self, peer: &UdSide) -> Arc<Ah> {
        Ah::new(&self.pd, &ah_attr(peer.ip)).unwrap()
    }

    fn send(
        &self,
        ah: &Arc<Ah>,
        to: &UdSide,
        off: usize,
        len: usize,
        imm: Option<u32>,
        qkey: u32,
    ) -> Result<()> {
        let wr = UdSendWr {
            wr_id: 77,
            opcode: if imm.is_some() {
                WrOpcode::SendWithImm
            } else {
                WrOpcode::Send
            },
            send_flags: send_flags::SIGNALED,
            sg_list: self.sge(off, len),
            imm_data: imm.unwrap_or(0),
            ah: Arc::clone(ah),
            remote_qpn: to.qp.qp_num(),
            remote_qkey: qkey,
        };
        // SAFETY: no INLINE flag: the SGE is not dereferenced here.
        unsafe { self.qp.post_send(&[wr]) }.map_err(|(_, e)| e)
    }
}

impl Drop for UdSide {
    fn drop(&mut self) {
        let _ = self.qp.destroy();
        let _ = self.mr.dereg();
    }
}

fn init(scq: &Arc<Cq>, rcq: &Arc<Cq>, qp_type: u32) -> InitAttr {
    InitAttr {
        send_cq: Arc::clone(scq),
        recv_cq: Arc::clone(rcq),
        srq: None,
        cap: QpCap {
            max_send_wr: 32,
            max_recv_wr: 32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        },
        sq_sig_all: false,
        qp_type,
    }
}

fn ah_attr(ip: Ipv4Addr) -> AhAttr {
    AhAttr {
        dgid: ip.to_ipv6_mapped().octets(),
        is_global: true,
        port_num: 1,
        hop_limit: 64,
        ..AhAttr::default()
    }
}

#[test]
fn ud_send_through_an_ah_lands_behind_the_grh_with_ud_completion_fields() {
    let a = UdSide::new("127.0.72.2");
    let b = UdSide::new("127.0.72.3");
    let ah = a.ah_to(&b);
    b.qp.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: b.sge(0, 1024),
    }])
    .unwrap();
    let msg = b"datagram over rdmx0";
    a.buf_write(4096, msg);
    let imm = 0xCAFE_F00Du32.to_be();
    a.send(&ah, &b, 4096, msg.len(), Some(imm), QKEY).unwrap();
    let s = wait_wc(&a.scq);
    assert_eq!(
        (s.wr_id, s.status, s.opcode, s.qp_num),
        (77, 0, 0, a.qp.qp_num())
    );
    let r = wait_wc(&b.rcq);
    assert_eq!((r.wr_id, r.status, r.opcode), (5, 0, 128));
    assert_eq!(r.byte_len as usize, 40 + msg.len());
    assert_eq!(r.qp_num, b.qp.qp_num());
    assert_eq!(r.src_qp, a.qp.qp_num());
    assert_eq!(r.wc_flags, wc_flags::GRH | wc_flags::WITH_IMM);
    assert_eq!(r.imm_data, imm);
    // sl: the RoCEv2/IPv4 packet type as ConnectX reports it (UCX reads it).
    assert_eq!((r.pkey_index, r.slid, r.sl), (0, 0, 0xA));
    assert_eq!(&b.buf[40..40 + msg.len()], msg);
    // RoCEv2 over IPv4 (rxe): 20 zero bytes, then the IPv4 header with both addresses.
    assert_eq!(&b.buf[..20], &[0u8; 20]);
    assert_eq!(b.buf[20], 0x45);
    assert_eq!(b.buf[29], 17, "protocol UDP");
    assert_eq!(&b.buf[32..36], &a.ip.octets());
    assert_eq!(&b.buf[36..40], &b.ip.octets());
    // query_qp: the Q_Key, the next PSN (one packet sent from 0x42), RTS.
    let (q, ia) = a.qp.query();
    assert_eq!((q.qp_state, q.qkey, q.sq_psn), (QpState::Rts, QKEY, 0x43));
    assert_eq!(ia.qp_type, QPT_UD);
}

impl UdSide {
    fn buf_write(&self, off: usize, bytes: &[u8]) {
        // SAFETY: the buffer is ours and nothing else writes it during the test.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.buf.as_ptr().add(off).cast_mut(),
                bytes.len(),
            )
        };
    }
}

#[test]
fn a_wrong_qkey_is_dropped_and_counted_and_the_wqe_stays_for_the_right_one() {
    let a = UdSide::new("127.0.72.4");
    let b = UdSide::new("127.0.72.5");
    let ah = a.ah_to(&b);
    b.qp.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: b.sge(0, 256),
    }])
    .unwrap();
    a.buf_write(1000, b"xx");
    a.send(&ah, &b, 1000, 2, None, QKEY ^ 1).unwrap();
    assert_eq!(wait_wc(&a.scq).status, 0, "the sender cannot know");
    no_wc(&b.rcq, Duration::from_millis(300));
    assert_eq!(b.qp.counters().qkey_violations, 1);
    a.send(&ah, &b, 1000, 2, None, QKEY).unwrap();
    let r = wait_wc(&b.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.byte_len, r.wc_flags),
        (1, 0, 42, wc_flags::GRH)
    );
    // No WQE left: the next one is dropped and counted.
    a.send(&ah, &b, 1000, 2, None, QKEY).unwrap();
    no_wc(&b.rcq, Duration::from_millis(300));
    assert_eq!(b.qp.counters().no_recv_wqe, 1);
}

#[test]
fn an_mtu_sized_message_passes_through_the_device_and_a_larger_one_is_refused() {
    let a = UdSide::new("127.0.72.6");
    let b = UdSide::new("127.0.72.7");
    let mtu = a.qp.mtu() as usize;
    assert_eq!(mtu, 4096, "loopback: the port's active MTU is 4096");
    let ah = a.ah_to(&b);
    let data: Vec<u8> = (0..mtu).map(|i| (i * 13) as u8).collect();
    a.buf_write(8192, &data);
    let e = a.send(&ah, &b, 8192, mtu + 1, None, QKEY).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("exceeds the MTU"), "{e}");
    no_wc(&a.scq, Duration::from_millis(100));
    b.qp.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: b.sge(0, 40 + mtu),
    }])
    .unwrap();
    a.send(&ah, &b, 8192, mtu, None, QKEY).unwrap();
    assert_eq!(wait_wc(&a.scq).status, 0);
    let r = wait_wc(&b.rcq);
    assert_eq!((r.status, r.byte_len as usize), (0, 40 + mtu));
    assert_eq!(&b.buf[40..40 + mtu], &data[..]);
}

#[test]
fn address_handles_and_qp_types_refuse_what_roce_cannot_do() {
    let a = UdSide::new("127.0.72.8");
    // No GRH, another GID index, an IPv6 GID on an IPv4 device, a multicast GID.
    let mut at = ah_attr(Ipv4Addr::new(127, 0, 72, 9));
    at.is_global = false;
    assert_eq!(
        Ah::new(&a.pd, &at).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let mut at = ah_attr(Ipv4Addr::new(127, 0, 72, 9));
    at.sgid_index = 1;
    assert_eq!(
        Ah::new(&a.pd, &at).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let mut at = ah_attr(Ipv4Addr::new(127, 0, 72, 9));
    at.dgid = "fd00::9".parse::<std::net::Ipv6Addr>().unwrap().octets();
    assert_eq!(
        Ah::new(&a.pd, &at).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    // An AH keeps its PD busy until destroyed; a destroyed AH is refused by post_send.
    let ah = Ah::new(&a.pd, &ah_attr(Ipv4Addr::new(127, 0, 72, 9))).unwrap();
    assert_eq!(ah.dest().to_string(), "127.0.72.9:4791");
    ah.destroy().unwrap();
    assert!(ah.destroy().is_err(), "twice");
    let e = a.send(&ah, &a, 0, 1, None, QKEY).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    // max_ah, as query_device says, is enforced; a destroyed (or dropped) AH frees its slot.
    let max = a.pd.device().query_device().max_ah as usize;
    assert_eq!(max, 65536);
    let attr = ah_attr(Ipv4Addr::new(127, 0, 72, 9));
    let mut ahs: Vec<Arc<Ah>> = (0..max).map(|_| Ah::new(&a.pd, &attr).unwrap()).collect();
    assert_eq!(
        Ah::new(&a.pd, &attr).unwrap_err().kind(),
        ErrorKind::ResourceLimit
    );
    ahs.pop().unwrap().destroy().unwrap();
    ahs.push(Ah::new(&a.pd, &attr).unwrap());
    ahs.truncate(1);
    ahs.push(Ah::new(&a.pd, &attr).unwrap());
    drop(ahs);
    // UC (3) is not implemented; RC QPs still are.
    assert_eq!(
        Qp::new(&a.pd, &init(&a.scq, &a.rcq, 3), 0x7000)
            .unwrap_err()
            .kind(),
        ErrorKind::Unsupported
    );
    // UD modify masks: RESET -> INIT without a Q_Key, and an RC attribute, are refused.
    let q = UdQp::new(&a.pd, &init(&a.scq, &a.rcq, QPT_UD), 0x7100).unwrap();
    let at = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    let base = attr_mask::STATE | attr_mask::PKEY_INDEX | attr_mask::PORT;
    assert!(q.modify(&at, base).is_err());
    assert!(
        q.modify(&at, base | ATTR_QKEY | attr_mask::DEST_QPN)
            .is_err()
    );
    q.modify(&at, base | ATTR_QKEY).unwrap();
    assert_eq!(q.state(), QpState::Init);
    q.destroy().unwrap();
}

#[test]
fn a_ud_qp_on_an_srq_takes_its_receives_from_it() {
    let a = UdSide::new("127.0.72.10");
    let b = UdSide::new("127.0.72.11");
    let srq = Srq::new(
        &b.pd,
        &SrqAttr {
            max_wr: 8,
            max_sge: 1,
            srq_limit: 0,
        },
        0x5000,
    )
    .unwrap();
    let mut ia = init(&b.scq, &b.rcq, QPT_UD);
    ia.srq = Some(Arc::clone(&srq));
    let q = UdQp::new(&b.pd, &ia, 0x7200).unwrap();
    let mut at = QpAttr {
        qp_state: QpState::Init,
        qkey: QKEY,
        port_num: 1,
        ..QpAttr::default()
    };
    q.modify(
        &at,
        attr_mask::STATE | attr_mask::PKEY_INDEX | attr_mask::PORT | ATTR_QKEY,
    )
    .unwrap();
    at.qp_state = QpState::Rtr;
    q.modify(&at, attr_mask::STATE).unwrap();
    // Receives go to the SRQ, not the QP.
    let wr = RecvWr {
        wr_id: 9,
        sg_list: b.sge(2048, 256),
    };
    assert!(q.post_recv(std::slice::from_ref(&wr)).is_err());
    srq.post_recv(&[wr]).unwrap();
    let ah = a.ah_to(&b);
    a.buf_write(0, b"via srq");
    let w = UdSendWr {
        wr_id: 1,
        opcode: WrOpcode::Send,
        send_flags: send_flags::SIGNALED,
        sg_list: a.sge(0, 7),
        imm_data: 0,
        ah,
        remote_qpn: q.qp_num(),
        remote_qkey: QKEY,
    };
    // SAFETY: no INLINE flag.
    unsafe { a.qp.post_send(&[w]) }.unwrap();
    let r = wait_wc(&b.rcq);
    assert_eq!(
        (r.wr_id, r.status, r.byte_len, r.qp_num),
        (9, 0, 47, q.qp_num())
    );
    assert_eq!(&b.buf[2048 + 40..2048 + 47], b"via srq");
    q.destroy().unwrap();
    srq.destroy().unwrap();
}

//! Device queries, object lifetimes (EBUSY rules), refusals of bad input, qp_override, and
//! RETRY_EXC_ERR when the peer's device goes away.

mod verbs_support;

use rdmx_ibv::verbs::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use verbs_support::*;

#[test]
fn device_port_and_gid_report_the_soft_device() {
    let dev = Device::open(&settings("127.0.73.2", &[])).unwrap();
    let d = dev.query_device();
    assert!(d.fw_ver.starts_with("rdmx "));
    assert_eq!(d.atomic_cap, 0, "the engine has no atomics");
    assert_eq!((d.phys_port_cnt, d.max_pkeys), (1, 1));
    assert!(d.max_qp_wr >= 1024 && d.max_sge >= 2 && d.max_srq > 0 && d.max_srq_wr > 0);
    assert!(d.max_qp_rd_atom >= 16 && d.max_qp_init_rd_atom >= 16);
    assert_eq!(d.node_guid.to_be_bytes()[..3], [0x02, b'r', b'x']);
    let p = dev.query_port(1).unwrap();
    assert_eq!((p.state, p.link_layer, p.max_mtu), (4, 2, 5));
    assert_eq!(p.active_mtu, 5, "loopback carries 4096-byte packets");
    assert_eq!((p.gid_tbl_len, p.pkey_tbl_len), (1, 1));
    assert_eq!(
        dev.query_port(2).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let gid = dev.gid(0).unwrap();
    assert_eq!(
        gid,
        "::ffff:127.0.73.2"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets()
    );
    assert_eq!(dev.gid(1).unwrap_err().kind(), ErrorKind::InvalidArgument);
    // A second device on the same address and port is refused clearly.
    let e = Device::open(&settings("127.0.73.2", &[])).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
}

#[test]
fn lifetimes_follow_verbs_ebusy_rules_and_bad_input_is_refused() {
    let dev = Device::open(&settings("127.0.73.3", &[])).unwrap();
    let pd = Pd::new(&dev, 1);
    let mut buf = vec![0u8; 8192];
    // REMOTE_WRITE without LOCAL_WRITE, and unknown bits: refused as ibv_reg_mr (flags
    // of features the device lacks: verbs_mr.rs).
    for bad in [access::REMOTE_WRITE, 0x1000] {
        // SAFETY: `buf` outlives every registration here (none succeeds).
        let e = unsafe { pd.reg_mr(buf.as_mut_ptr(), buf.len(), bad, 2) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
    // An optional access bit (IBV_ACCESS_RELAXED_ORDERING) is ignored.
    // SAFETY: `buf` outlives the region (deregistered at once).
    let ro = unsafe { pd.reg_mr(buf.as_mut_ptr(), 64, access::LOCAL_WRITE | 1 << 20, 2) }.unwrap();
    assert_eq!(ro.access, access::LOCAL_WRITE);
    ro.dereg().unwrap();
    // SAFETY: `buf` outlives the region (deregistered below).
    let mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), buf.len(), access::LOCAL_WRITE, 2) }.unwrap();
    let cq = Cq::new(&dev, 16, None, 3).unwrap();
    assert_eq!(
        Cq::new(&dev, 0, None, 3).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let init = |qp_type, sges| InitAttr {
        send_cq: Arc::clone(&cq),
        recv_cq: Arc::clone(&cq),
        srq: None,
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: sges,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
        qp_type,
    };
    assert_eq!(
        Qp::new(&pd, &init(3, 1), 4).unwrap_err().kind(),
        ErrorKind::Unsupported
    );
    assert_eq!(
        Qp::new(&pd, &init(QPT_RC, 1000), 4).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let qp = Qp::new(&pd, &init(QPT_RC, 1), 4).unwrap();
    assert!(qp.qp_num() > 1 && qp.qp_num() < 0xFF_FFFF);
    assert_eq!(dev.stats().qps, 1);
    // Too many SGEs in a WR: refused at post (INIT takes receives).
    qp.modify(
        &QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            ..Default::default()
        },
        attr_mask::STATE | attr_mask::PKEY_INDEX | attr_mask::PORT | attr_mask::ACCESS_FLAGS,
    )
    .unwrap();
    let sge = Sge {
        addr: buf.as_ptr() as u64,
        length: 8,
        lkey: mr.lkey,
    };
    let e = qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: SgeList::from_vec(vec![sge; 2]),
        }])
        .unwrap_err();
    assert_eq!((e.0, e.1.kind()), (0, ErrorKind::InvalidArgument));
    // A posted receive names the MR: deregistering is still allowed (verbs refuses it only
    // for bound memory windows; verbs_mr.rs shows what happens to that receive).
    qp.post_recv(&[RecvWr {
        wr_id: 2,
        sg_list: SgeList::from_vec(vec![sge]),
    }])
    .unwrap();
    mr.dereg().unwrap();
    assert_eq!(mr.dereg().unwrap_err().kind(), ErrorKind::InvalidArgument);
    // The PD and CQ are in use.
    assert_eq!(pd.destroy().unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(cq.destroy().unwrap_err().kind(), ErrorKind::Busy);
    qp.destroy().unwrap();
    assert_eq!(qp.destroy().unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert_eq!(dev.stats().qps, 0);
    cq.destroy().unwrap();
    pd.destroy().unwrap();
}

#[test]
fn qp_override_replaces_the_applications_timers_logs_once_and_counts() {
    let o = Opts {
        extra: vec![
            ("qp_override", "timeout,retry_cnt,min_rnr_timer"),
            ("timeout", "12"),
            ("retry_cnt", "5"),
            ("min_rnr_timer", "12"),
        ],
        ..Opts::default()
    };
    let a = Side::new("127.0.73.4", &o);
    let b = Side::new("127.0.73.5", &Opts::default());
    // What Ceph passes: timeout 18, retry_cnt 7, min_rnr_timer 18 (bring_up: 12 at RTR).
    bring_up(&a, &b, 18, 7);
    bring_up(&b, &a, 18, 7);
    let (q, _) = a.qp.query(0);
    assert_eq!((q.timeout, q.retry_cnt, q.min_rnr_timer), (12, 5, 12));
    assert_eq!(q.rnr_retry, 7, "not listed: the application's value");
    // timeout 18 -> 12 and retry_cnt 7 -> 5 replaced; min_rnr_timer was 12 already.
    assert_eq!(a.qp.overrides(), 2);
    assert_eq!(a.dev.stats().qp_overrides, 2);
    // B has no override: the application's values.
    let (q, _) = b.qp.query(0);
    assert_eq!((q.timeout, q.retry_cnt), (18, 7));
    assert_eq!(b.qp.overrides(), 0);
    // RTS -> RTS with the application's timeout again: replaced again, counted again.
    a.qp.modify(
        &QpAttr {
            qp_state: QpState::Rts,
            timeout: 18,
            ..Default::default()
        },
        attr_mask::STATE | attr_mask::TIMEOUT,
    )
    .unwrap();
    assert_eq!(a.qp.query(0).0.timeout, 12);
    assert_eq!(a.qp.overrides(), 3);
    // Traffic still flows.
    b.post_recv(1, 0, 8);
    a.post(a.wr(1, WrOpcode::Send, 0, 8)).unwrap();
    assert_eq!(wait_wc(&b.rcq).status, 0);
}

#[test]
fn retry_exc_err_when_the_peer_device_is_gone() {
    let a = Side::new("127.0.73.6", &Opts::default());
    let b = Side::new("127.0.73.7", &Opts::default());
    // timeout 10 = 4.2 ms, 2 retries: the error comes within tens of milliseconds.
    bring_up(&a, &b, 10, 2);
    bring_up(&b, &a, 10, 2);
    b.post_recv(1, 0, 8);
    a.post(a.wr(1, WrOpcode::Send, 0, 8)).unwrap();
    assert_eq!(wait_wc(&a.scq).status, 0);
    drop(b); // the peer's QP and device are gone: nothing answers any more
    a.post_recv(7, 0, 8);
    let t = Instant::now();
    a.post(a.wr(2, WrOpcode::Send, 0, 8)).unwrap();
    let w = wait_wc(&a.scq);
    assert_eq!((w.wr_id, w.status), (2, WcStatus::RetryExcErr as u32));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let w = wait_wc(&a.rcq);
    assert_eq!((w.wr_id, w.status), (7, WcStatus::WrFlushErr as u32));
    // Reported by the completion only, as NICs and rxe do: no QP_FATAL (Ceph's handler
    // of it crashes on a QP it already destroyed after the error completion).
    assert_eq!(async_event(&a.dev, Duration::from_millis(200)), None);
    assert_eq!(a.qp.state(), QpState::Err);
}

#[test]
fn max_mr_size_is_unbounded_as_on_rxe_pinned_or_not() {
    // RLIMIT_MEMLOCK binds at registration (tests/soft_pin.rs), not through max_mr_size.
    for (ip, pin) in [("127.0.73.20", "true"), ("127.0.73.21", "false")] {
        let dev = Device::open(&settings(ip, &[("soft_pin", pin)])).unwrap();
        assert_eq!(dev.query_device().max_mr_size, u64::MAX, "soft_pin={pin}");
    }
}

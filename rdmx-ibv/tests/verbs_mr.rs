//! Memory regions as verbs has them: `ibv_dereg_mr` is not refused while work requests
//! name the region, and what reaches the region afterwards fails with a completion error
//! without touching the memory; `ibv_reg_mr`'s access flags as rxe takes them.

mod verbs_support;

use rdmx_ibv::verbs::*;
use verbs_support::*;

/// `IBV_WC_LOC_PROT_ERR`, `IBV_WC_REM_ACCESS_ERR` (verbs.h `enum ibv_wc_status`).
const LOC_PROT_ERR: u32 = 4;
const REM_ACCESS_ERR: u32 = 10;

/// A second region of `len` bytes on `side`'s PD (the side's own stays registered).
fn extra_mr(side: &Side, buf: &mut [u8], flags: u32) -> Mr {
    // SAFETY: every caller keeps `buf` alive past the region's deregistration (the test
    // drops it last) and past any work request naming it.
    unsafe { side.pd.reg_mr(buf.as_mut_ptr(), buf.len(), flags, 77) }.unwrap()
}

#[test]
fn dereg_with_a_posted_receive_then_the_send_into_it_fails_without_touching_it() {
    let (a, b) = pair(
        "127.0.86.2",
        "127.0.86.3",
        &Opts::default(),
        &Opts::default(),
    );
    let mut rbuf = vec![0u8; 4096];
    let mr = extra_mr(&b, &mut rbuf, access::LOCAL_WRITE);
    let mut sg = SgeList::new();
    sg.push(Sge {
        addr: rbuf.as_ptr() as u64,
        length: 4096,
        lkey: mr.lkey,
    });
    b.qp.post_recv(&[RecvWr {
        wr_id: 5,
        sg_list: sg,
    }])
    .unwrap();
    // The receive still names the region: verbs deregisters anyway.
    mr.dereg().unwrap();
    a.write(0, b"must not land");
    a.post(a.wr(6, WrOpcode::Send, 0, 13)).unwrap();
    let r = wait_wc(&b.rcq);
    assert_eq!((r.wr_id, r.status), (5, LOC_PROT_ERR), "{r:?}");
    let s = wait_wc(&a.scq);
    assert_eq!(s.wr_id, 6);
    assert_ne!(
        s.status, 0,
        "the sender learns its SEND was not placed: {s:?}"
    );
    assert_eq!(rbuf, vec![0u8; 4096], "deregistered memory was written");
}

#[test]
fn rdma_write_to_a_deregistered_rkey_is_a_remote_access_error() {
    let (a, b) = pair(
        "127.0.86.4",
        "127.0.86.5",
        &Opts::default(),
        &Opts::default(),
    );
    let mut target = vec![0u8; 4096];
    let mr = extra_mr(&b, &mut target, access::LOCAL_WRITE | access::REMOTE_WRITE);
    let (rkey, raddr) = (mr.rkey, mr.addr);
    // First the region works...
    a.write(0, b"first");
    let mut wr = a.wr(1, WrOpcode::RdmaWrite, 0, 5);
    wr.remote_addr = raddr;
    wr.rkey = rkey;
    a.post(wr).unwrap();
    assert_eq!(wait_wc(&a.scq).status, 0);
    // ...then it is gone: the same WRITE is refused by the responder.
    mr.dereg().unwrap();
    a.write(0, b"again");
    let mut wr = a.wr(2, WrOpcode::RdmaWrite, 0, 5);
    wr.remote_addr = raddr;
    wr.rkey = rkey;
    a.post(wr).unwrap();
    let s = wait_wc(&a.scq);
    assert_eq!((s.wr_id, s.status), (2, REM_ACCESS_ERR), "{s:?}");
    assert_eq!(&target[..5], b"first");
}

#[test]
fn reg_mr_access_flags_as_rxe() {
    let dev = Device::open(&settings("127.0.86.6", &[])).unwrap();
    let pd = Pd::new(&dev, 1);
    let mut buf = vec![0u8; 4096];
    // MW_BIND is accepted (and dropped: no memory windows here), as the kernel does.
    // SAFETY: `buf` outlives every region here (each is deregistered at once).
    let mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), 64, access::LOCAL_WRITE | 1 << 4, 2) }.unwrap();
    assert_eq!(mr.access, access::LOCAL_WRITE);
    mr.dereg().unwrap();
    // ZERO_BASED, ON_DEMAND, HUGETLB, FLUSH_GLOBAL, FLUSH_PERSISTENT: EOPNOTSUPP.
    for bit in 5..10 {
        // SAFETY: as above (none succeeds).
        let e = unsafe { pd.reg_mr(buf.as_mut_ptr(), 64, access::LOCAL_WRITE | 1 << bit, 2) }
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "bit {bit}: {e}");
    }
    // A bit no verbs.h defines stays InvalidArgument.
    // SAFETY: as above.
    let e = unsafe { pd.reg_mr(buf.as_mut_ptr(), 64, 1 << 14, 2) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    pd.destroy().unwrap();
}

#[test]
fn vendor_id_is_rxes() {
    let dev = Device::open(&settings("127.0.86.7", &[])).unwrap();
    let d = dev.query_device();
    assert_eq!((d.vendor_id, d.vendor_part_id), (0xff_ffff, 0));
}

//! Shared by the `verbs_*` tests: two devices in one process on their own loopback
//! addresses (UDP 4791 each, as two processes under `rdmx-ibv exec` would have), PD, MR,
//! CQs, an RC QP each, brought up through INIT/RTR/RTS exchanging QPN/PSN/GID in-process.
//! Every wait is bounded.

#![allow(dead_code)]

use rdmx::config::{Config, Settings};
use rdmx_ibv::verbs::*;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most time any wait takes before the test fails.
pub const WAIT: Duration = Duration::from_secs(10);

pub fn settings(ip: &str, extra: &[(&str, &str)]) -> Settings {
    let mut c = Config::new();
    c.set("provider", "soft").unwrap();
    c.set("soft_addr", ip).unwrap();
    c.set("soft_port", "4791").unwrap();
    for (k, v) in extra {
        c.set(k, v).unwrap();
    }
    c.settings().unwrap()
}

/// One side: device, PD, a registered buffer, CQs (one channel), a QP.
pub struct Side {
    pub dev: Arc<Device>,
    pub pd: Arc<Pd>,
    pub buf: Box<[u8]>,
    pub mr: Mr,
    pub chan: Arc<CompChannel>,
    pub scq: Arc<Cq>,
    pub rcq: Arc<Cq>,
    pub srq: Option<Arc<Srq>>,
    pub qp: Arc<Qp>,
}

pub struct Opts {
    pub access: u32,
    pub sq_sig_all: bool,
    pub max_inline: u32,
    pub srq: bool,
    pub extra: Vec<(&'static str, &'static str)>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            access: access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ,
            sq_sig_all: true,
            max_inline: 0,
            srq: false,
            extra: Vec::new(),
        }
    }
}

pub const BUF: usize = 64 * 1024;

impl Side {
    pub fn new(ip: &str, o: &Opts) -> Side {
        let dev = Device::open(&settings(ip, &o.extra)).expect("open device");
        let pd = Pd::new(&dev, 0x1000);
        let mut buf = vec![0u8; BUF].into_boxed_slice();
        // SAFETY: `buf` lives as long as the Side, whose Drop destroys the QP and
        // deregisters the region before the fields (the buffer) are dropped.
        let mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), buf.len(), o.access, 0x2000) }.unwrap();
        let chan = CompChannel::new().unwrap();
        let scq = Cq::new(&dev, 256, Some(Arc::clone(&chan)), 0x3000).unwrap();
        let rcq = Cq::new(&dev, 256, Some(Arc::clone(&chan)), 0x4000).unwrap();
        let srq = o.srq.then(|| {
            Srq::new(
                &pd,
                &SrqAttr {
                    max_wr: 64,
                    max_sge: 1,
                    srq_limit: 0,
                },
                0x5000,
            )
            .unwrap()
        });
        let qp = Qp::new(
            &pd,
            &InitAttr {
                send_cq: Arc::clone(&scq),
                recv_cq: Arc::clone(&rcq),
                srq: srq.clone(),
                cap: QpCap {
                    max_send_wr: 64,
                    max_recv_wr: 64,
                    max_send_sge: 2,
                    max_recv_sge: 2,
                    max_inline_data: o.max_inline,
                },
                sq_sig_all: o.sq_sig_all,
                qp_type: QPT_RC,
            },
            0x6000,
        )
        .unwrap();
        Side {
            dev,
            pd,
            buf,
            mr,
            chan,
            scq,
            rcq,
            srq,
            qp,
        }
    }

    pub fn addr(&self, off: usize) -> u64 {
        self.buf.as_ptr() as u64 + off as u64
    }

    pub fn sge(&self, off: usize, len: u32) -> SgeList {
        let mut l = SgeList::new();
        l.push(Sge {
            addr: self.addr(off),
            length: len,
            lkey: self.mr.lkey,
        });
        l
    }

    pub fn post_recv(&self, wr_id: u64, off: usize, len: u32) {
        self.qp
            .post_recv(&[RecvWr {
                wr_id,
                sg_list: self.sge(off, len),
            }])
            .unwrap();
    }

    pub fn post_srq_recv(&self, wr_id: u64, off: usize, len: u32) {
        self.srq
            .as_ref()
            .unwrap()
            .post_recv(&[RecvWr {
                wr_id,
                sg_list: self.sge(off, len),
            }])
            .unwrap();
    }

    /// Posts one send WR (not inline).
    pub fn post(&self, wr: SendWr) -> std::result::Result<(), (usize, Error)> {
        // SAFETY: no INLINE flag is set by callers of this helper with foreign memory;
        // inline SGEs name this side's buffer, readable for the call.
        unsafe { self.qp.post_send(&[wr]) }
    }

    pub fn wr(&self, wr_id: u64, opcode: WrOpcode, off: usize, len: u32) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            send_flags: send_flags::SIGNALED,
            sg_list: self.sge(off, len),
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
        }
    }

    pub fn write(&self, off: usize, bytes: &[u8]) {
        // SAFETY: plain write into our own buffer: the tests only do this while no WR
        // names that range (the engine reads and writes the buffer through raw pointers).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.buf.as_ptr().add(off).cast_mut(),
                bytes.len(),
            )
        };
    }

    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        // SAFETY: reads our own buffer (volatile-ish: the engine writes it from another
        // thread; the tests read after a completion says the write happened).
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().add(off), len).to_vec() }
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        let _ = self.qp.destroy();
        let _ = self.mr.dereg();
    }
}

/// RESET -> INIT -> RTR -> RTS for `a` towards `b` (with `b`'s QPN, PSN and GID), the
/// attributes an application like ibv_rc_pingpong passes.
pub fn bring_up(a: &Side, b: &Side, timeout: u8, retry_cnt: u8) {
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: access::REMOTE_WRITE | access::REMOTE_READ | access::LOCAL_WRITE,
        ..Default::default()
    };
    a.qp.modify(
        &init,
        attr_mask::STATE | attr_mask::PKEY_INDEX | attr_mask::PORT | attr_mask::ACCESS_FLAGS,
    )
    .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: 3,
        dest_qp_num: b.qp.qp_num(),
        rq_psn: 0x100 + (b.qp.qp_num() & 0xff),
        max_dest_rd_atomic: 16,
        min_rnr_timer: 12,
        ah_attr: AhAttr {
            dgid: b.dev.gid(0).unwrap(),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    a.qp.modify(
        &rtr,
        attr_mask::STATE
            | attr_mask::AV
            | attr_mask::PATH_MTU
            | attr_mask::DEST_QPN
            | attr_mask::RQ_PSN
            | attr_mask::MAX_DEST_RD_ATOMIC
            | attr_mask::MIN_RNR_TIMER,
    )
    .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0x100 + (a.qp.qp_num() & 0xff),
        timeout,
        retry_cnt,
        rnr_retry: 7,
        max_rd_atomic: 16,
        ..Default::default()
    };
    a.qp.modify(
        &rts,
        attr_mask::STATE
            | attr_mask::SQ_PSN
            | attr_mask::TIMEOUT
            | attr_mask::RETRY_CNT
            | attr_mask::RNR_RETRY
            | attr_mask::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

/// Two connected sides on `ip_a` and `ip_b`.
pub fn pair(ip_a: &str, ip_b: &str, oa: &Opts, ob: &Opts) -> (Side, Side) {
    let a = Side::new(ip_a, oa);
    let b = Side::new(ip_b, ob);
    bring_up(&a, &b, 14, 7);
    bring_up(&b, &a, 14, 7);
    (a, b)
}

/// The next completion of `cq`, polled for at most [`WAIT`].
pub fn wait_wc(cq: &Cq) -> WorkCompletion {
    let t = Instant::now();
    let mut wc = [WorkCompletion::default(); 1];
    loop {
        if cq.poll(&mut wc) == 1 {
            return wc[0];
        }
        assert!(t.elapsed() < WAIT, "no completion within {WAIT:?}");
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Asserts that `cq` yields no completion for `d` (polling).
pub fn no_wc(cq: &Cq, d: Duration) {
    let t = Instant::now();
    let mut wc = [WorkCompletion::default(); 1];
    while t.elapsed() < d {
        assert_eq!(cq.poll(&mut wc), 0, "unexpected completion {:?}", wc[0]);
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Reads one record of `N` bytes from `fd` within `d` (None if none came).
pub fn read_record<const N: usize>(fd: RawFd, d: Duration) -> Option<[u8; N]> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let r = unsafe { libc::poll(&mut p, 1, d.as_millis() as i32) };
    if r <= 0 {
        return None;
    }
    let mut b = [0u8; N];
    // SAFETY: reads N bytes into a live buffer.
    let n = unsafe { libc::read(fd, b.as_mut_ptr().cast(), N) };
    assert_eq!(n, N as isize, "short record");
    Some(b)
}

/// The next async event (element, type) within `d`.
pub fn async_event(dev: &Device, d: Duration) -> Option<(u64, u32)> {
    read_record::<16>(dev.async_fd(), d).map(|b| {
        (
            u64::from_ne_bytes(b[..8].try_into().unwrap()),
            u32::from_ne_bytes(b[8..12].try_into().unwrap()),
        )
    })
}

//! `soft_pin`: the soft provider pins registered pages within RLIMIT_MEMLOCK as a NIC driver
//! does (a registration beyond the limit is refused with ResourceLimit), and with
//! `soft_pin=false` pins nothing, so a region larger than the limit registers and carries
//! RDMA WRITEs. One test in its own binary: it lowers this process's memlock limit.

use rdmx::config::Config;
use rdmx::error::ErrorKind;
use rdmx::msgr::Context;
use rdmx::provider::SendReq;
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{Sge, WcStatus, WrOpcode, smallvec};
use std::time::Duration;

mod require;
mod support;

/// The memlock limit this test runs under (lowering the soft limit needs no privilege).
const LIMIT: u64 = 2 << 20;
/// A region four times that.
const BIG: usize = 8 << 20;

fn ctx(pin: &str) -> Context {
    let mut c = Config::new();
    c.set("provider", "soft").unwrap();
    c.set("soft_port", "0").unwrap();
    c.set("soft_pin", pin).unwrap();
    Context::new(&c).unwrap()
}

/// VmLck of this process in KiB (what it has mlocked).
fn locked_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("VmLck:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Drops CAP_IPC_LOCK from this thread's effective set (capabilities are per thread): with
/// it, mlock ignores RLIMIT_MEMLOCK, as the kernel's ib_umem_get does for a NIC.
fn drop_ipc_lock() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_IPC_LOCK: u32 = 14;
    let mut h = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget/capset read and write the header and two data words we pass; pid 0 is
    // the calling thread.
    unsafe {
        assert_eq!(libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()), 0);
        d[0].effective &= !(1 << CAP_IPC_LOCK);
        assert_eq!(libc::syscall(libc::SYS_capset, &h, d.as_ptr()), 0);
    }
}

#[test]
fn pinned_registrations_stay_within_memlock_and_soft_pin_false_pins_nothing() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the struct we pass; lowering the soft
    // limit is always permitted.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r), 0);
        r.rlim_cur = r.rlim_cur.min(LIMIT);
        assert_eq!(libc::setrlimit(libc::RLIMIT_MEMLOCK, &r), 0);
    }
    drop_ipc_lock();
    let mut big = vec![0u8; BIG];

    // Pinned (the default): beyond the limit is refused, with the limit named.
    let pinned = ctx("true");
    // SAFETY: `big` outlives every registration of it (each is deregistered below).
    let e = unsafe { pinned.register(big.as_mut_ptr(), BIG, access::LOCAL_WRITE) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ResourceLimit, "{e}");
    assert!(e.to_string().contains("RLIMIT_MEMLOCK"), "{e}");
    // Within it, the pages are locked while registered.
    let mut src = vec![0u8; 16 << 10];
    let before = locked_kib();
    // SAFETY: `src` outlives its registration.
    let ms = unsafe { pinned.register(src.as_mut_ptr(), src.len(), access::LOCAL_WRITE) }.unwrap();
    assert!(
        locked_kib() >= before + 16,
        "pinned region: VmLck {before} -> {} KiB",
        locked_kib()
    );

    // Unpinned: the big region registers and locks nothing.
    let unpinned = ctx("false");
    let before = locked_kib();
    // SAFETY: as above.
    let mb = unsafe {
        unpinned.register(
            big.as_mut_ptr(),
            BIG,
            access::LOCAL_WRITE | access::REMOTE_WRITE,
        )
    }
    .unwrap();
    assert_eq!(locked_kib(), before, "soft_pin=false locked pages");

    // And it carries IO: a WRITE from the pinned side lands 6 MiB into it.
    let (ca, _cb) = support::connect_pair(&pinned, &unpinned, "127.0.0.1", "127.0.0.1");
    for (i, x) in src.iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    let off = 6u64 << 20;
    ca.post_send(&[SendReq {
        cookie: 1,
        opcode: WrOpcode::RdmaWrite,
        flags: send_flags::SIGNALED,
        sges: smallvec![Sge {
            addr: ms.addr,
            length: src.len() as u32,
            lkey: ms.lkey,
        }],
        remote_addr: mb.addr + off,
        rkey: mb.rkey,
        imm: 0,
    }])
    .unwrap();
    let wc = support::poll_for(&ca, 1, Duration::from_secs(10));
    assert_eq!(wc.len(), 1, "no completion for the WRITE");
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(big[off as usize..off as usize + src.len()], src[..]);

    drop(ca);
    pinned.deregister(ms.lkey).unwrap();
    unpinned.deregister(mb.lkey).unwrap();
}

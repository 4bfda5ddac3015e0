//! What only the verbs provider does, run under `rdmx-ibv exec` (this binary re-executed
//! with `provider=verbs`, device `rdmx0` at 127.0.0.2): `provider=auto` picks the device
//! and says why; device, port and GID selection errors name the knob; a soft side and a
//! verbs side interoperate when the soft side listens on RoCEv2's port 4791, and refuse
//! each other clearly otherwise; the event fd follows the soft provider's contract.

use rdmx::config::Config;
use rdmx::msgr::Context;
use rdmx::provider::SendReq;
use rdmx::provider::Wc;
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{Sge, WcOpcode, WcStatus, WrOpcode, smallvec};
use std::time::{Duration, Instant};

mod support;

fn cfg(kv: &[(&str, &str)]) -> Config {
    let mut c = Config::new();
    c.set("path_mtu", "1024").unwrap();
    for (k, v) in kv {
        c.set(k, v).unwrap();
    }
    c
}

const EMPTY: Wc = Wc {
    cookie: 0,
    status: WcStatus::Success,
    opcode: WcOpcode::Send,
    byte_len: 0,
    imm: None,
    qp_num: 0,
    src_qp: None,
};

fn wait(c: &rdmx::msgr::Connection, n: usize) -> Vec<Wc> {
    support::poll_for(c, n, Duration::from_secs(10))
}

/// Skips (returns true) outside the rdmx-ibv run.
fn outside() -> bool {
    !support::on_verbs()
}

#[test]
fn auto_picks_the_verbs_device_and_says_why() {
    if outside() {
        return;
    }
    let ctx = Context::new(&cfg(&[("provider", "auto")])).unwrap();
    assert_eq!(ctx.provider(), "verbs");
    let why = ctx.provider_reason();
    assert!(
        why.starts_with("provider=auto: device rdmx0 port 1 GID[0] 127.0.0.2 (RoCE v2)"),
        "{why}"
    );
    let (name, why2) = rdmx::provider::resolve(ctx.settings()).unwrap();
    assert_eq!((name, why2.as_str()), ("verbs", why));
    // The soft provider is still chosen when asked for.
    let soft = Context::new(&cfg(&[("provider", "soft"), ("soft_port", "0")])).unwrap();
    assert_eq!(soft.provider(), "soft");
    assert_eq!(soft.provider_reason(), "provider=soft configured");
}

#[test]
fn device_port_and_gid_errors_name_the_knob() {
    if outside() {
        return;
    }
    let e = Context::new(&cfg(&[("provider", "verbs"), ("device", "mlx5_9")])).unwrap_err();
    assert_eq!(e.kind(), rdmx::ErrorKind::Unsupported, "{e}");
    assert!(
        e.message()
            .contains("device=\"mlx5_9\" not found (devices: rdmx0)"),
        "{e}"
    );
    let e = Context::new(&cfg(&[("provider", "verbs"), ("port", "2")])).unwrap_err();
    assert!(e.message().contains("no device has port 2 active"), "{e}");
    let e = Context::new(&cfg(&[("provider", "verbs"), ("gid_index", "3")])).unwrap_err();
    assert_eq!(e.kind(), rdmx::ErrorKind::InvalidArgument, "{e}");
    assert!(
        e.message()
            .contains("gid_index=3: rdmx0 port 1 has 1 GID entries"),
        "{e}"
    );
    // auto falls back to soft, with the reason.
    let ctx = Context::new(&cfg(&[
        ("provider", "auto"),
        ("device", "mlx5_9"),
        ("soft_port", "0"),
    ]))
    .unwrap();
    assert_eq!(ctx.provider(), "soft");
    assert!(
        ctx.provider_reason()
            .contains("but none usable: verbs: device=\"mlx5_9\" not found"),
        "{}",
        ctx.provider_reason()
    );
    // A configuration above the device's limits is refused before any connection.
    let e = Context::new(&cfg(&[("provider", "verbs"), ("max_send_sge", "32")]));
    if let Err(e) = e {
        assert!(
            e.message().contains("max_send_sge=32 exceeds max_sge="),
            "{e}"
        );
    }
}

/// Moves a READ, a WRITE and a SEND with immediate between `a` and `b` (b exposes memory).
fn exchange_bytes(a: &Context, b: &Context) {
    let mut a_buf = vec![0u8; 16384];
    let mut b_buf: Vec<u8> = (0..16384u32).map(|i| (i * 7 + 3) as u8).collect();
    // SAFETY: the buffers outlive the registrations (deregistered below).
    let (ma, mb) = unsafe { support::register_pair(a, &mut a_buf, b, &mut b_buf) };
    let (ca, cb) = support::connect_pair(a, b, "127.0.0.1", "127.0.0.1");
    let sge = |addr, length| Sge {
        addr,
        length,
        lkey: ma.lkey,
    };
    let wr = |cookie, opcode, s, remote_addr| SendReq {
        cookie,
        opcode,
        flags: send_flags::SIGNALED,
        sges: smallvec![s],
        remote_addr,
        rkey: mb.rkey,
        imm: 0x1234_5678,
    };
    ca.post_send(&[wr(1, WrOpcode::RdmaRead, sge(ma.addr, 5000), mb.addr + 7)])
        .unwrap();
    let c = wait(&ca, 1);
    assert_eq!((c[0].cookie, c[0].status), (1, WcStatus::Success), "{c:?}");
    assert_eq!(a_buf[..5000], b_buf[7..5007]);
    a_buf[8000..9000].fill(0x5A);
    ca.post_send(&[wr(
        2,
        WrOpcode::RdmaWrite,
        sge(ma.addr + 8000, 1000),
        mb.addr + 12000,
    )])
    .unwrap();
    assert_eq!(wait(&ca, 1)[0].status, WcStatus::Success);
    assert!(b_buf[12000..13000].iter().all(|&x| x == 0x5A));
    cb.post_recv(&[(
        9,
        smallvec![Sge {
            addr: mb.addr,
            length: 4096,
            lkey: mb.lkey,
        }],
    )])
    .unwrap();
    ca.post_send(&[wr(3, WrOpcode::SendWithImm, sge(ma.addr + 8000, 100), 0)])
        .unwrap();
    assert_eq!(wait(&ca, 1)[0].status, WcStatus::Success);
    let r = wait(&cb, 1);
    assert_eq!(
        (r[0].cookie, r[0].status, r[0].byte_len, r[0].imm),
        (9, WcStatus::Success, 100, Some(0x1234_5678))
    );
    drop((ca, cb));
    a.deregister(ma.lkey).unwrap();
    b.deregister(mb.lkey).unwrap();
}

#[test]
fn soft_and_verbs_interoperate_when_the_soft_side_uses_port_4791() {
    if outside() {
        return;
    }
    // The verbs device holds 127.0.0.2:4791; the soft context takes 127.0.0.4:4791.
    let verbs = Context::new(&cfg(&[("provider", "verbs")])).unwrap();
    let soft = Context::new(&cfg(&[
        ("provider", "soft"),
        ("soft_addr", "127.0.0.4"),
        ("soft_port", "4791"),
    ]))
    .unwrap();
    exchange_bytes(&verbs, &soft);
    exchange_bytes(&soft, &verbs);
}

#[test]
fn soft_on_another_port_and_verbs_refuse_each_other() {
    if outside() {
        return;
    }
    let verbs = Context::new(&cfg(&[("provider", "verbs")])).unwrap();
    let soft = Context::new(&cfg(&[("provider", "soft"), ("soft_port", "0")])).unwrap();
    let l = soft.listen("127.0.0.1:0").unwrap();
    let port = l.local_addr().port();
    let t = std::thread::spawn(move || l.accept(Some(Duration::from_secs(10))));
    let e = verbs
        .connect(&format!("127.0.0.1:{port}"), Duration::from_secs(10))
        .unwrap_err();
    assert_eq!(e.kind(), rdmx::ErrorKind::Conflict, "{e}");
    assert!(
        e.message()
            .contains("provider mismatch: the peer runs the soft provider on UDP port")
            && e.message().contains("set soft_port=4791 on the peer"),
        "{e}"
    );
    let e = t.join().unwrap().unwrap_err();
    assert_eq!(e.kind(), rdmx::ErrorKind::Conflict, "{e}");
    assert!(
        e.message()
            .contains("provider mismatch: the peer runs provider=verbs")
            && e.message().contains("set soft_port=4791 here"),
        "{e}"
    );
}

#[test]
fn event_fd_fires_on_a_completion_and_at_once_when_one_is_queued() {
    if outside() {
        return;
    }
    let a = Context::new(&cfg(&[("provider", "verbs")])).unwrap();
    let b = Context::new(&cfg(&[("provider", "verbs")])).unwrap();
    let mut a_buf = vec![0u8; 4096];
    let mut b_buf = vec![1u8; 4096];
    // SAFETY: the buffers outlive the registrations.
    let (ma, mb) = unsafe { support::register_pair(&a, &mut a_buf, &b, &mut b_buf) };
    let (ca, _cb) = support::connect_pair(&a, &b, "127.0.0.1", "127.0.0.1");
    let readable = |fd, ms| {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, ms) == 1 }
    };
    let fd = ca.event_fd();
    let read = SendReq {
        cookie: 1,
        opcode: WrOpcode::RdmaRead,
        flags: send_flags::SIGNALED,
        sges: smallvec![Sge {
            addr: ma.addr,
            length: 64,
            lkey: ma.lkey,
        }],
        remote_addr: mb.addr,
        rkey: mb.rkey,
        imm: 0,
    };
    // Armed, then a completion: the fd fires.
    ca.req_notify();
    assert!(!readable(fd, 0), "nothing yet");
    ca.post_send(std::slice::from_ref(&read)).unwrap();
    assert!(readable(fd, 5000), "fires on the completion");
    ca.clear_event();
    assert_eq!(wait(&ca, 1)[0].cookie, 1);
    assert!(!readable(fd, 0), "cleared");
    // A completion already queued when arming: readable at once, and poll returns it.
    ca.post_send(&[SendReq { cookie: 2, ..read }]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    ca.req_notify();
    assert!(
        readable(fd, 0),
        "a queued completion makes the fd readable at once"
    );
    ca.clear_event();
    let c = wait(&ca, 1);
    assert_eq!((c[0].cookie, c[0].status), (2, WcStatus::Success));
    assert!(!readable(fd, 0));
    assert_eq!(a_buf[..64], b_buf[..64]);
    let _ = access::LOCAL_WRITE;
}

/// Signal interval and SQ accounting: 200 unsignaled SENDs of 16 bytes (inline) and one
/// signaled: one completion, and the send queue never fills (the forced signals retire
/// the unsignaled ones).
#[test]
fn unsignaled_runs_are_retired_by_forced_signals() {
    if outside() {
        return;
    }
    let kv = [
        ("provider", "verbs"),
        ("max_send_wr", "32"),
        ("max_recv_wr", "256"),
        ("signal_interval", "8"),
    ];
    let (a, b) = (
        Context::new(&cfg(&kv)).unwrap(),
        Context::new(&cfg(&kv)).unwrap(),
    );
    let mut a_buf = vec![3u8; 4096];
    let mut b_buf = vec![0u8; 256 * 16];
    // SAFETY: the buffers outlive the registrations.
    let (ma, mb) = unsafe { support::register_pair(&a, &mut a_buf, &b, &mut b_buf) };
    let (ca, cb) = support::connect_pair(&a, &b, "127.0.0.1", "127.0.0.1");
    let recvs: Vec<(u64, rdmx::rc::SgeList)> = (0..201u64)
        .map(|i| {
            (
                i,
                smallvec![Sge {
                    addr: mb.addr + (i % 256) * 16,
                    length: 16,
                    lkey: mb.lkey,
                }],
            )
        })
        .collect();
    assert_eq!(cb.post_recv(&recvs[..200]).unwrap(), 200);
    let mut sent = 0;
    let mut got = Vec::new();
    let mut buf = [EMPTY; 8];
    let end = Instant::now() + Duration::from_secs(10);
    while sent < 200 && Instant::now() < end {
        let wr = SendReq {
            cookie: sent,
            opcode: WrOpcode::Send,
            flags: 0,
            sges: smallvec![Sge {
                addr: ma.addr,
                length: 16,
                lkey: ma.lkey,
            }],
            remote_addr: 0,
            rkey: 0,
            imm: 0,
        };
        match ca.post_send(&[wr]) {
            Ok(n) => sent += n as u64,
            Err(e) if e.kind() == rdmx::ErrorKind::Full => {}
            Err(e) => panic!("{e}"),
        }
        let k = ca.poll(&mut buf);
        got.extend_from_slice(&buf[..k]);
    }
    assert_eq!(sent, 200);
    assert!(
        got.is_empty(),
        "no completion for unsignaled successes: {got:?}"
    );
    assert_eq!(wait(&cb, 200).len(), 200);
    drop((ca, cb));
    a.deregister(ma.lkey).unwrap();
    b.deregister(mb.lkey).unwrap();
}

/// Connection::counters() on verbs: posts, bytes, completions by status, bytes received
/// (the packet counters stay zero: a NIC counts packets per port, not per QP).
#[test]
fn counters_report_posts_bytes_and_completions_by_status() {
    if outside() {
        return;
    }
    let a = Context::new(&cfg(&[("provider", "verbs")])).unwrap();
    let b = Context::new(&cfg(&[("provider", "verbs")])).unwrap();
    let mut a_buf = vec![0u8; 16384];
    let mut b_buf = vec![7u8; 16384];
    // SAFETY: the buffers outlive the registrations (deregistered below).
    let (ma, mb) = unsafe { support::register_pair(&a, &mut a_buf, &b, &mut b_buf) };
    let (ca, cb) = support::connect_pair(&a, &b, "127.0.0.1", "127.0.0.1");
    assert_eq!(ca.counters(), rdmx::rc::Counters::default());
    let sge = |addr, length| Sge {
        addr,
        length,
        lkey: ma.lkey,
    };
    let wr = |cookie, opcode, s, remote_addr, flags| SendReq {
        cookie,
        opcode,
        flags,
        sges: smallvec![s],
        remote_addr,
        rkey: mb.rkey,
        imm: 5,
    };
    cb.post_recv(&[
        (
            1,
            smallvec![Sge {
                addr: mb.addr,
                length: 4096,
                lkey: mb.lkey,
            }],
        ),
        (
            2,
            smallvec![Sge {
                addr: mb.addr + 4096,
                length: 4096,
                lkey: mb.lkey,
            }],
        ),
    ])
    .unwrap();
    // An unsignaled WRITE (no completion for the caller), a READ, a SEND with immediate.
    ca.post_send(&[
        wr(
            10,
            WrOpcode::RdmaWrite,
            sge(ma.addr, 1000),
            mb.addr + 8192,
            0,
        ),
        wr(
            11,
            WrOpcode::RdmaRead,
            sge(ma.addr + 4096, 3000),
            mb.addr,
            send_flags::SIGNALED,
        ),
        wr(
            12,
            WrOpcode::SendWithImm,
            sge(ma.addr, 300),
            0,
            send_flags::SIGNALED,
        ),
    ])
    .unwrap();
    assert_eq!(wait(&ca, 2).len(), 2);
    let r = wait(&cb, 1);
    assert_eq!((r[0].cookie, r[0].byte_len), (1, 300), "{r:?}");
    // A READ outside b's region: REM_ACCESS_ERR (10).
    ca.post_send(&[wr(
        13,
        WrOpcode::RdmaRead,
        sge(ma.addr, 64),
        mb.addr + 16384,
        send_flags::SIGNALED,
    )])
    .unwrap();
    let e = wait(&ca, 1);
    assert_eq!((e[0].cookie, e[0].status), (13, WcStatus::RemAccessErr));
    let k = ca.counters();
    assert_eq!(
        (k.wr_send_posted, k.wr_recv_posted, k.completions),
        (4, 0, 3),
        "{k:?}"
    );
    assert_eq!(
        (
            k.write_bytes_posted,
            k.read_bytes_posted,
            k.send_bytes_posted
        ),
        (1000, 3064, 300)
    );
    assert_eq!((k.wc_status[0], k.wc_status[10]), (2, 1), "{k:?}");
    assert_eq!(k.wc_status.iter().sum::<u64>(), k.completions);
    assert_eq!(
        (k.tx_packets, k.rx_packets),
        (0, 0),
        "no packet counters on verbs"
    );
    let k = cb.counters();
    assert_eq!(
        (
            k.wr_recv_posted,
            k.completions,
            k.recv_bytes,
            k.wc_status[0]
        ),
        (2, 1, 300, 1),
        "{k:?}"
    );
    drop((ca, cb));
    a.deregister(ma.lkey).unwrap();
    b.deregister(mb.lkey).unwrap();
}

/// A peer's WRITE into memory exposed read-only: the requester's completion says
/// REM_ACCESS_ERR; the responder has no completion for it, only the device's async event
/// (its QP went to ERR by itself), which the provider reads from the async fd: counted,
/// the QP in ERR, its receives flushed, the connection's failure note naming the event.
#[test]
fn async_qp_error_event_fails_the_responder_connection() {
    if outside() {
        return;
    }
    let a = Context::new(&cfg(&[("provider", "verbs")])).unwrap();
    let b = Context::new(&cfg(&[("provider", "verbs")])).unwrap();
    let mut a_buf = vec![1u8; 4096];
    let mut b_buf = vec![2u8; 8192];
    // SAFETY: the buffers outlive the registrations (deregistered below).
    let ma = unsafe { a.register(a_buf.as_mut_ptr(), a_buf.len(), access::LOCAL_WRITE) }.unwrap();
    // SAFETY: as above.
    let mb_rx = unsafe { b.register(b_buf.as_mut_ptr(), 4096, access::LOCAL_WRITE) }.unwrap();
    // SAFETY: as above.
    let mb_ro =
        unsafe { b.register(b_buf.as_mut_ptr().add(4096), 4096, access::REMOTE_READ) }.unwrap();
    let (ca, cb) = support::connect_pair(&a, &b, "127.0.0.1", "127.0.0.1");
    // Per context; under rdmx-ibv a process's contexts share one event queue, so either
    // context may have read the event: the two together count it.
    let device_events = || a.port_counters().async_events + b.port_counters().async_events;
    let before = device_events();
    cb.post_recv(&[(
        7,
        smallvec![Sge {
            addr: mb_rx.addr,
            length: 4096,
            lkey: mb_rx.lkey,
        }],
    )])
    .unwrap();
    assert!(cb.failure_note().is_none());
    ca.post_send(&[SendReq {
        cookie: 1,
        opcode: WrOpcode::RdmaWrite,
        flags: send_flags::SIGNALED,
        sges: smallvec![Sge {
            addr: ma.addr,
            length: 64,
            lkey: ma.lkey,
        }],
        remote_addr: mb_ro.addr,
        rkey: mb_ro.rkey,
        imm: 0,
    }])
    .unwrap();
    let e = wait(&ca, 1);
    assert_eq!((e[0].cookie, e[0].status), (1, WcStatus::RemAccessErr));
    // The responder: its receive flushed, the event read within a few seconds.
    let r = wait(&cb, 1);
    assert_eq!(
        (r[0].cookie, r[0].status),
        (7, WcStatus::WrFlushErr),
        "{r:?}"
    );
    let end = Instant::now() + Duration::from_secs(5);
    while cb.counters().async_events == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    let k = cb.counters();
    assert_eq!(k.async_events, 1, "{k:?}");
    assert_eq!(k.wc_status[5], 1);
    assert_eq!(cb.qp_state(), rdmx::rc::QpState::Err);
    let note = cb.failure_note().expect("a failure note");
    assert!(
        note.starts_with("QP_FATAL on QP ") && note.contains("async event from the device"),
        "{note}"
    );
    assert!(device_events() > before);
    assert_eq!(b_buf[4096..4160], [2u8; 64], "read-only memory untouched");
    drop((ca, cb));
    a.deregister(ma.lkey).unwrap();
    b.deregister(mb_rx.lkey).unwrap();
    b.deregister(mb_ro.lkey).unwrap();
}

#[test]
fn verbs_cases_under_rdmx_ibv() {
    support::rerun_under_rdmx_ibv(
        "127.0.0.2",
        &[
            "auto_picks_the_verbs_device_and_says_why",
            "device_port_and_gid_errors_name_the_knob",
            "soft_and_verbs_interoperate_when_the_soft_side_uses_port_4791",
            "soft_on_another_port_and_verbs_refuse_each_other",
            "event_fd_fires_on_a_completion_and_at_once_when_one_is_queued",
            "unsignaled_runs_are_retired_by_forced_signals",
            "counters_report_posts_bytes_and_completions_by_status",
            "async_qp_error_event_fails_the_responder_connection",
        ],
        Duration::from_secs(120),
    );
}

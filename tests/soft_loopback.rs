//! The soft provider end to end on 127.0.0.1, in one process: two contexts, a listener and
//! a connection, SEND/RECV both ways, RDMA READ and WRITE, and the access errors.

use rdmx::config::Config;
use rdmx::msgr::{Connection, Context, MrInfo};
use rdmx::provider::SendReq;
use rdmx::provider::Wc;
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{Sge, WcOpcode, WcStatus, WrOpcode, smallvec};
use std::time::{Duration, Instant};

mod require;
mod support;

fn ctx(extra: &[(&str, &str)]) -> Context {
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    c.set("path_mtu", "1024").unwrap();
    support::apply_provider(&mut c);
    for (k, v) in extra {
        c.set(k, v).unwrap();
    }
    Context::new(&c).unwrap()
}

fn pair(extra: &[(&str, &str)]) -> (Context, Context, Connection, Connection) {
    let (a, b) = (ctx(extra), ctx(extra));
    let (ca, cb) = support::connect_pair(&a, &b, "127.0.0.1", "127.0.0.1");
    (a, b, ca, cb)
}

/// Polls until `n` completions arrived (bounded: 10 s).
fn wait(c: &Connection, n: usize) -> Vec<Wc> {
    support::poll_for(c, n, Duration::from_secs(10))
}

fn send(cookie: u64, opcode: WrOpcode, sge: Sge, remote_addr: u64, rkey: u32) -> SendReq {
    SendReq {
        cookie,
        opcode,
        flags: send_flags::SIGNALED,
        sges: smallvec![sge],
        remote_addr,
        rkey,
        imm: 7,
    }
}

#[test]
fn send_recv_read_write_move_the_right_bytes() {
    move_the_right_bytes("127.0.0.1", "127.0.0.1");
}

/// The same over IPv6 loopback: IPv6 sockets, the IPv6 ICRC pseudo-header on both sides.
#[test]
fn send_recv_read_write_move_the_right_bytes_over_ipv6() {
    if let Err(e) = std::net::UdpSocket::bind("[::1]:0") {
        require::missing(
            require::IPV6,
            "the IPv6 loopback case",
            format!("bind [::1]: {e}"),
        );
        return;
    }
    move_the_right_bytes("[::1]", "[::1]");
}

/// A listener on the IPv6 wildcard (dual stack) takes an IPv4 client: the side channel's
/// IPv4-mapped addresses are recognized and the QPs use IPv4 UDP and the IPv4 ICRC.
#[test]
fn dual_stack_listener_takes_an_ipv4_client() {
    if let Err(e) = std::net::TcpListener::bind("[::]:0") {
        require::missing(
            require::IPV6,
            "the dual-stack case",
            format!("bind [::]: {e}"),
        );
        return;
    }
    move_the_right_bytes("[::]", "127.0.0.1");
}

/// Connects a client on `host` to a listener on `listen` and moves bytes every way.
fn move_the_right_bytes(listen: &str, host: &str) {
    let mut a_buf = vec![0u8; 64 << 10];
    let mut b_buf: Vec<u8> = (0..64u32 << 10).map(|i| (i * 7 + 3) as u8).collect();
    let mut b_ro = vec![0xABu8; 4096];
    let (a, b) = (ctx(&[]), ctx(&[]));
    // SAFETY: the buffers outlive the contexts' use of them (deregistered at the end).
    let (ma, mb) = unsafe { support::register_pair(&a, &mut a_buf, &b, &mut b_buf) };
    // SAFETY: as above.
    let mro = unsafe { b.register(b_ro.as_mut_ptr(), b_ro.len(), access::REMOTE_READ) }.unwrap();
    let (ca, cb) = support::connect_pair(&a, &b, listen, host);
    assert_eq!(
        a.provider(),
        if support::on_verbs() { "verbs" } else { "soft" }
    );
    let v6 = host.starts_with('[');
    assert_eq!(ca.peer().is_ipv6(), v6, "side channel family");
    assert_eq!(
        ca.peer_regions().len(),
        2,
        "b exposes its two remote-access regions"
    );
    assert!(
        cb.peer_regions().is_empty(),
        "a exposes nothing (local access only)"
    );

    // READ 10,000 bytes (10 packets at MTU 1024) from b into a.
    let rd = Sge {
        addr: ma.addr,
        length: 10_000,
        lkey: ma.lkey,
    };
    ca.post_send(&[send(1, WrOpcode::RdmaRead, rd, mb.addr + 123, mb.rkey)])
        .unwrap();
    let c = wait(&ca, 1);
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].cookie, c[0].status, c[0].opcode, c[0].byte_len),
        (1, WcStatus::Success, WcOpcode::RdmaRead, 10_000)
    );
    assert_eq!(a_buf[..10_000], b_buf[123..10_123]);

    // WRITE 3000 bytes from a to b at offset 40,000.
    for (i, x) in a_buf[20_000..23_000].iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    let wr = Sge {
        addr: ma.addr + 20_000,
        length: 3000,
        lkey: ma.lkey,
    };
    ca.post_send(&[send(2, WrOpcode::RdmaWrite, wr, mb.addr + 40_000, mb.rkey)])
        .unwrap();
    let c = wait(&ca, 1);
    assert_eq!((c[0].cookie, c[0].status), (2, WcStatus::Success));
    assert_eq!(b_buf[40_000..43_000], a_buf[20_000..23_000]);

    // SEND b -> a into a posted receive, with immediate data.
    ca.post_recv(&[(
        10,
        smallvec![Sge {
            addr: ma.addr + 30_000,
            length: 5000,
            lkey: ma.lkey,
        }],
    )])
    .unwrap();
    let sd = Sge {
        addr: mb.addr,
        length: 4500,
        lkey: mb.lkey,
    };
    cb.post_send(&[SendReq {
        opcode: WrOpcode::SendWithImm,
        ..send(3, WrOpcode::Send, sd, 0, 0)
    }])
    .unwrap();
    let rb = wait(&cb, 1);
    assert_eq!(
        (rb[0].cookie, rb[0].status, rb[0].opcode),
        (3, WcStatus::Success, WcOpcode::Send)
    );
    let ra = wait(&ca, 1);
    assert_eq!(
        (
            ra[0].cookie,
            ra[0].status,
            ra[0].opcode,
            ra[0].byte_len,
            ra[0].imm
        ),
        (10, WcStatus::Success, WcOpcode::Recv, 4500, Some(7))
    );
    assert_eq!(a_buf[30_000..34_500], b_buf[..4500]);

    // WRITE into the read-only region: REM_ACCESS_ERR, and the connection is dead.
    let wr = Sge {
        addr: ma.addr,
        length: 16,
        lkey: ma.lkey,
    };
    ca.post_send(&[send(4, WrOpcode::RdmaWrite, wr, mro.addr, mro.rkey)])
        .unwrap();
    let c = wait(&ca, 1);
    assert_eq!((c[0].cookie, c[0].status), (4, WcStatus::RemAccessErr));
    assert!(b_ro.iter().all(|&x| x == 0xAB));
    // Every datagram passed its ICRC check (a wrong pseudo-header would fail them all).
    // (The verbs provider has no engine counters: the device keeps its own.)
    for c in [&ca, &cb].into_iter().filter(|_| !support::on_verbs()) {
        let k = c.counters();
        assert!(k.rx_packets > 0);
        assert_eq!(k.icrc_errors, 0, "{host}: {k:?}");
    }
    drop((ca, cb));
    a.deregister(ma.lkey).unwrap();
    b.deregister(mb.lkey).unwrap();
    b.deregister(mro.lkey).unwrap();
}

#[test]
fn read_outside_the_peer_region_and_bad_lkey_fail_cleanly() {
    let mut a_buf = vec![0u8; 8192];
    let mut b_buf = vec![1u8; 8192];
    let (a, b) = (ctx(&[]), ctx(&[]));
    // SAFETY: buffers outlive the use.
    let ma = unsafe { a.register(a_buf.as_mut_ptr(), a_buf.len(), access::LOCAL_WRITE) }.unwrap();
    // SAFETY: as above.
    let mb = unsafe {
        b.register(
            b_buf.as_mut_ptr(),
            b_buf.len(),
            access::LOCAL_WRITE | access::REMOTE_READ,
        )
    }
    .unwrap();
    let l = b.listen("127.0.0.1:0").unwrap();
    let port = l.local_addr().port();
    let t = std::thread::spawn(move || l.accept(Some(Duration::from_secs(10))).unwrap());
    let ca = a
        .connect(&format!("127.0.0.1:{port}"), Duration::from_secs(10))
        .unwrap();
    let _cb = t.join().unwrap();
    let rd = Sge {
        addr: ma.addr,
        length: 100,
        lkey: ma.lkey,
    };
    ca.post_send(&[send(1, WrOpcode::RdmaRead, rd, mb.addr + 8150, mb.rkey)])
        .unwrap();
    let c = wait(&ca, 1);
    assert_eq!((c[0].cookie, c[0].status), (1, WcStatus::RemAccessErr));
    // The connection is in ERR now: a new WR completes flushed.
    ca.post_send(&[send(2, WrOpcode::Send, rd, 0, 0)]).unwrap();
    let c = wait(&ca, 1);
    assert_eq!((c[0].cookie, c[0].status), (2, WcStatus::WrFlushErr));
    // Memory named by no WR in flight deregisters; the peer's too.
    a.deregister(ma.lkey).unwrap();
    b.deregister(mb.lkey).unwrap();
}

#[test]
fn closed_peer_flushes_outstanding_work_and_refuses_posts() {
    let (a, _b, ca, cb) = pair(&[]);
    let mut buf = vec![0u8; 4096];
    // SAFETY: buffer outlives the use.
    let m = unsafe { a.register(buf.as_mut_ptr(), buf.len(), access::LOCAL_WRITE) }.unwrap();
    // A receive that will never be matched, then the peer goes away.
    ca.post_recv(&[(
        5,
        smallvec![Sge {
            addr: m.addr,
            length: 4096,
            lkey: m.lkey,
        }],
    )])
    .unwrap();
    assert_eq!(
        a.deregister(m.lkey).unwrap_err().kind(),
        rdmx::ErrorKind::Busy
    );
    let t0 = Instant::now();
    drop(cb);
    let c = wait(&ca, 1);
    assert_eq!(
        (c[0].cookie, c[0].status),
        (5, WcStatus::WrFlushErr),
        "flushed within {:?}",
        t0.elapsed()
    );
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "EOF noticed in {:?}",
        t0.elapsed()
    );
    let sge = Sge {
        addr: m.addr,
        length: 8,
        lkey: m.lkey,
    };
    let e = ca
        .post_send(&[send(6, WrOpcode::Send, sge, 0, 0)])
        .unwrap_err();
    assert_eq!(e.kind(), rdmx::ErrorKind::Closed);
    a.deregister(m.lkey).unwrap();
}

#[test]
fn on_connect_hook_posts_receives_before_the_peer_may_send() {
    let (a, b) = (ctx(&[]), ctx(&[]));
    let mut a_buf = vec![9u8; 4096];
    let mut b_buf = vec![0u8; 4096];
    // SAFETY: buffers outlive the use.
    let ma = unsafe { a.register(a_buf.as_mut_ptr(), a_buf.len(), access::LOCAL_WRITE) }.unwrap();
    // SAFETY: as above.
    let mb = unsafe { b.register(b_buf.as_mut_ptr(), b_buf.len(), access::LOCAL_WRITE) }.unwrap();
    let (addr, lkey) = (mb.addr, mb.lkey);
    b.set_on_connect(Some(std::sync::Arc::new(move |c: &Connection| {
        c.post_recv(&[(
            77,
            smallvec![Sge {
                addr,
                length: 4096,
                lkey,
            }],
        )])
        .map(|_| ())
    })));
    let l = b.listen("127.0.0.1:0").unwrap();
    let port = l.local_addr().port();
    let t = std::thread::spawn(move || l.accept(Some(Duration::from_secs(10))).unwrap());
    // rnr_retry 0 on the sender: a single RNR NAK would fail the SEND.
    let mut cfg = Config::new();
    cfg.set("soft_port", "0").unwrap();
    cfg.set("rnr_retry", "0").unwrap();
    let a2 = Context::new(&cfg).unwrap();
    drop(a);
    // SAFETY: as above.
    let ma2 = unsafe { a2.register(a_buf.as_mut_ptr(), a_buf.len(), access::LOCAL_WRITE) }.unwrap();
    let ca = a2
        .connect(&format!("127.0.0.1:{port}"), Duration::from_secs(10))
        .unwrap();
    let sge = Sge {
        addr: ma2.addr,
        length: 1000,
        lkey: ma2.lkey,
    };
    ca.post_send(&[send(1, WrOpcode::Send, sge, 0, 0)]).unwrap(); // at once
    let c = wait(&ca, 1);
    assert_eq!((c[0].cookie, c[0].status), (1, WcStatus::Success));
    let cb = t.join().unwrap();
    let r = wait(&cb, 1);
    assert_eq!(
        (r[0].cookie, r[0].status, r[0].byte_len),
        (77, WcStatus::Success, 1000)
    );
    assert_eq!(ca.counters().rnr_naks_received, 0);
    assert_eq!(b_buf[..1000], [9u8; 1000]);
    let _ = ma;
    // A hook that fails abandons the connection on that side.
    b.set_on_connect(Some(std::sync::Arc::new(|_c: &Connection| {
        Err(rdmx::Error::new(rdmx::ErrorKind::InvalidValue, "no"))
    })));
    let l = b.listen("127.0.0.1:0").unwrap();
    let port = l.local_addr().port();
    let t = std::thread::spawn(move || l.accept(Some(Duration::from_secs(10))));
    assert!(
        a2.connect(&format!("127.0.0.1:{port}"), Duration::from_secs(10))
            .is_err()
    );
    assert!(t.join().unwrap().is_err());
}

/// The tests above again, on the verbs provider: this binary under `rdmx-ibv exec` with
/// `provider=verbs` (rdmx verbs -> libibverbs -> rdmx0 -> the soft transport).
#[test]
fn verbs_provider_passes_the_same_tests_under_rdmx_ibv() {
    support::rerun_under_rdmx_ibv(
        "127.0.0.2",
        &[
            "send_recv_read_write_move_the_right_bytes",
            "send_recv_read_write_move_the_right_bytes_over_ipv6",
            "dual_stack_listener_takes_an_ipv4_client",
            "read_outside_the_peer_region_and_bad_lkey_fail_cleanly",
            "closed_peer_flushes_outstanding_work_and_refuses_posts",
            "on_connect_hook_posts_receives_before_the_peer_may_send",
        ],
        Duration::from_secs(120),
    );
}

/// progress=inline: a thread that sleeps on the context's receiving sockets itself
/// (`rx_fds` + `app_watch`, the messenger's worker) is woken by the peer's packet and
/// receives it with its next poll; progress=thread offers no sockets (its thread receives).
#[test]
fn a_thread_sleeping_on_the_receiving_sockets_is_woken_and_receives() {
    if support::on_verbs() {
        return; // a NIC receives without the host: no sockets to offer
    }
    let (a, b, ca, cb) = pair(&[("progress", "inline")]);
    let mut fds = Vec::new();
    b.rx_fds(&mut fds);
    assert!(
        !fds.is_empty(),
        "progress=inline offers the receiving sockets"
    );
    let mut a_buf = vec![0x5Au8; 4096];
    let mut b_buf = vec![0u8; 4096];
    // SAFETY: the buffers outlive their registrations (the contexts go first).
    let (ma, mb) = unsafe { support::register_pair(&a, &mut a_buf, &b, &mut b_buf) };
    cb.post_recv(&[(
        5,
        smallvec![Sge {
            addr: mb.addr,
            length: 4096,
            lkey: mb.lkey,
        }],
    )])
    .unwrap();
    // Let the progress thread see that nobody polls (the handover), then watch.
    std::thread::sleep(Duration::from_millis(5));
    cb.arm();
    b.app_watch(true);
    let sd = Sge {
        addr: ma.addr,
        length: 1000,
        lkey: ma.lkey,
    };
    ca.post_send(&[send(9, WrOpcode::Send, sd, 0, 0)]).unwrap();
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .chain(std::iter::once(&cb.event_fd()))
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: a valid pollfd array of the length given.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, 5000) };
    b.app_watch(false);
    assert!(n > 0, "the packet woke the watching thread within 5 s");
    let got = wait(&cb, 1);
    assert_eq!(
        (got[0].cookie, got[0].status, got[0].byte_len),
        (5, WcStatus::Success, 1000)
    );
    assert_eq!(b_buf[..1000], a_buf[..1000]);
    assert_eq!(wait(&ca, 1)[0].status, WcStatus::Success);
    drop((ca, cb));

    let (_a, t, _ca, _cb) = pair(&[("progress", "thread")]);
    let mut none = Vec::new();
    t.rx_fds(&mut none);
    assert!(none.is_empty(), "progress=thread: its thread receives");
}

/// progress=inline with `Context::set_app_driven` (the messenger's setting): a poll that
/// receives a SEND holds its ACK back briefly (the soft device's `held_acks`), so that the
/// answer the application posts next carries it in the
/// same `sendmmsg`; an application that keeps polling without answering, or that stops
/// polling, still sends it, long before the peer's ACK timer.
#[test]
fn a_polling_receiver_sends_the_ack_with_its_answer() {
    if support::on_verbs() {
        return; // a NIC acknowledges by itself
    }
    let (a, b, ca, cb) = pair(&[("progress", "inline")]);
    let mut a_buf = vec![0x11u8; 8192];
    let mut b_buf = vec![0x22u8; 8192];
    // SAFETY: the buffers outlive their registrations (the contexts go first).
    let (ma, mb) = unsafe { support::register_pair(&a, &mut a_buf, &b, &mut b_buf) };
    let sge = |m: &MrInfo, off: u64, len: u32| Sge {
        addr: m.addr + off,
        length: len,
        lkey: m.lkey,
    };
    let recvs = |m, base: u64| -> Vec<(u64, rdmx::rc::SgeList)> {
        (0..12)
            .map(|i| (base + i, smallvec![sge(m, 4096, 4096)]))
            .collect()
    };
    ca.post_recv(&recvs(&ma, 100)).unwrap();
    cb.post_recv(&recvs(&mb, 200)).unwrap();
    let mut buf = [support::empty_wc(); 16];
    // Cookies of the successful completions seen so far, both connections.
    let seen = std::cell::RefCell::new(std::collections::HashSet::new());
    // Polls `c` without sleeping until a completion with `cookie` (5 s bound).
    let spin_for = |c: &Connection, cookie: u64, buf: &mut [Wc]| -> bool {
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if seen.borrow().contains(&cookie) {
                return true;
            }
            let k = c.poll(buf);
            seen.borrow_mut().extend(
                buf[..k]
                    .iter()
                    .filter(|w| w.status == WcStatus::Success)
                    .map(|w| w.cookie),
            );
        }
        false
    };
    cb.poll(&mut buf); // b polls: its own passes receive from now on

    // 0. Off by default (a verbs application, a raw connection): the ACK leaves on receipt,
    // and the answer's post sends the answer alone.
    ca.post_send(&[send(30, WrOpcode::Send, sge(&ma, 0, 100), 0, 0)])
        .unwrap();
    assert!(
        spin_for(&cb, 200, &mut buf),
        "b received the unheld request"
    );
    let before = cb.counters().tx_packets;
    cb.post_send(&[send(31, WrOpcode::Send, sge(&mb, 0, 100), 0, 0)])
        .unwrap();
    assert_eq!(
        cb.counters().tx_packets - before,
        1,
        "without ack holding the ACK left before the answer"
    );
    assert!(spin_for(&ca, 30, &mut buf) && spin_for(&ca, 100, &mut buf));
    assert!(spin_for(&cb, 31, &mut buf));
    a.set_app_driven(true);
    b.set_app_driven(true);

    // 1. Request, then the answer: the ACK leaves with the answer. Up to 5 rounds: when this
    // thread is away for the handover time (1 ms) on a loaded host, b's progress thread
    // receives the request itself and acknowledges at once.
    let mut rounds = Vec::new();
    for i in 0..5u64 {
        ca.post_send(&[send(10 + i, WrOpcode::Send, sge(&ma, 0, 100), 0, 0)])
            .unwrap();
        assert!(spin_for(&cb, 201 + i, &mut buf), "b received request {i}");
        let before = cb.counters().tx_packets;
        cb.post_send(&[send(20 + i, WrOpcode::Send, sge(&mb, 0, 100), 0, 0)])
            .unwrap();
        let sent = cb.counters().tx_packets - before;
        assert!(spin_for(&ca, 10 + i, &mut buf), "request {i} acknowledged");
        assert!(spin_for(&ca, 101 + i, &mut buf), "a received answer {i}");
        assert!(spin_for(&cb, 20 + i, &mut buf), "answer {i} acknowledged");
        rounds.push(sent);
        if sent == 2 {
            break;
        }
    }
    // The answer's post sent the held ACK with it: b's transmit count grew by both.
    assert_eq!(
        rounds.last(),
        Some(&2),
        "packets the answer's post sent, per round: {rounds:?}"
    );

    // 2. A one-way SEND and a receiver that polls on without answering: the ACK goes after
    // the hold bound.
    ca.post_send(&[send(3, WrOpcode::Send, sge(&ma, 0, 100), 0, 0)])
        .unwrap();
    let next_rx = 201 + rounds.len() as u64;
    assert!(
        spin_for(&cb, next_rx, &mut buf),
        "b received the one-way SEND"
    );
    let t = Instant::now();
    let mut acked = false;
    while !acked && t.elapsed() < Duration::from_secs(5) {
        cb.poll(&mut buf);
        let k = ca.poll(&mut buf);
        acked = buf[..k]
            .iter()
            .any(|w| w.cookie == 3 && w.status == WcStatus::Success);
    }
    assert!(acked, "a polling receiver sends the held ACK");

    // 3. The same, and the receiver stops polling (arms its CQ to sleep): the ACK goes.
    ca.post_send(&[send(4, WrOpcode::Send, sge(&ma, 0, 100), 0, 0)])
        .unwrap();
    assert!(
        spin_for(&cb, next_rx + 1, &mut buf),
        "b received the second one-way SEND"
    );
    cb.req_notify();
    let t = Instant::now();
    assert!(
        spin_for(&ca, 4, &mut buf),
        "the ACK left when the receiver stopped polling"
    );
    let sleeper_ack = t.elapsed();
    let c = ca.counters();
    assert_eq!(
        (c.retransmits, c.ack_timeouts),
        (0, 0),
        "no ACK was late enough for a's 67 ms timer"
    );
    assert!(
        sleeper_ack < Duration::from_millis(50),
        "ACK after the receiver armed its CQ: {sleeper_ack:?}"
    );

    // 4. The receiver takes the message and closes at once: the held ACK leaves before its
    // QP does, so the sender's SEND succeeds (not flushed by the close, nor retried into
    // RETRY_EXC_ERR).
    ca.post_send(&[send(5, WrOpcode::Send, sge(&ma, 0, 100), 0, 0)])
        .unwrap();
    assert!(
        spin_for(&cb, next_rx + 2, &mut buf),
        "b received the last SEND"
    );
    drop(cb);
    let end = Instant::now() + Duration::from_secs(5);
    let mut last = None;
    while last.is_none() && Instant::now() < end {
        let k = ca.poll(&mut buf);
        last = buf[..k].iter().find(|w| w.cookie == 5).map(|w| w.status);
    }
    assert_eq!(
        last,
        Some(WcStatus::Success),
        "the SEND a closing receiver took"
    );
}

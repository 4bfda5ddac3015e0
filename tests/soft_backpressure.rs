//! Back-pressure instead of sleeping or losing packets when a QP's UDP send buffer is full
//! (issue 16, item 6).
//!
//! Two network namespaces joined by a veth pair; b's end of the link is shaped by a token
//! bucket (`tc qdisc tbf`, 100 Mbit/s, a queue far larger than a socket's send buffer), so the
//! datagrams b's QP sends queue in the qdisc, still charged to the socket, and the socket's
//! send buffer fills: `sendmmsg` returns short counts. a READs 2 x 16 MiB from b: a
//! requester's window keeps its own packets in flight few (128 PSNs), but a responder
//! answers a READ with all its response packets at once.
//!
//! Before: the sender slept up to 8 x 1 ms per batch holding the QP lock, then dropped what
//! was left, which the peer saw as gaps (NAK, go-back-N retransmission). Now the rest of
//! the batch waits in the QP's backlog and the engine is asked for nothing more until the
//! socket takes it: every READ completes, every byte arrives, datagrams are counted as
//! deferred (`tx_deferred` > 0), none as refused (`tx_errors` = 0), and more than four
//! re-requests happen only if something on the way dropped a packet (the requester's
//! socket queue, the host's input backlogs, the tbf qdisc, the veth devices).
//! Skipped, with the reason printed, where namespaces or tc cannot be used (a failure under
//! `RDMX_TEST_REQUIRE=all`: tests/require/mod.rs).

mod require;
mod support;

use rdmx::msgr::{Connection, Context, MrInfo};
use rdmx::provider::SendReq;
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{Sge, WcOpcode, WcStatus, WrOpcode, smallvec};
use std::time::{Duration, Instant};
use support::{NetnsPair, empty_wc, in_netns, run, serial};

/// READs posted; each answer is sent at once by the responder.
const READS: usize = 2;

/// One READ's length: 16 MiB (16,384 packets at the veth's 1024-byte path MTU), or more on a
/// host whose sockets may hold more: a send buffer is at most 2 x net.core.wmem_max (8 MiB
/// on a host tuned to 4 MiB), and the answer must not fit. (A requester's own packets never
/// fill it: its window keeps 128 PSNs in flight.)
fn read_len() -> usize {
    let wmem_max: usize = std::fs::read_to_string("/proc/sys/net/core/wmem_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    (4 * wmem_max)
        .next_power_of_two()
        .clamp(16 << 20, 128 << 20)
}

struct Side {
    ctx: Context,
    buf: Vec<u8>,
    mr: MrInfo,
}

impl Side {
    fn new(ns: &str, len: usize) -> Side {
        // timeout 18 (1.07 s): what waits in the qdisc (at most the 8 MiB send buffer) takes
        // 0.7 s to cross the shaped link, so an ACK timer never fires merely because packets
        // wait there (each response that arrives restarts it).
        let ctx = in_netns(Some(ns), || {
            Context::new(&support::config(&[
                ("timeout", "18"),
                ("max_send_wr", "64"),
            ]))
            .expect("context")
        });
        let mut buf = vec![0u8; len];
        // SAFETY: `buf` lives in the returned value, whose Drop deregisters it; connections
        // are dropped (flushing every WR naming it) before the sides.
        let mr = unsafe {
            ctx.register(
                buf.as_mut_ptr(),
                buf.len(),
                access::LOCAL_WRITE | access::REMOTE_READ,
            )
        }
        .expect("register");
        Side { ctx, buf, mr }
    }

    fn sge(&self, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.mr.addr + off as u64,
            length: len as u32,
            lkey: self.mr.lkey,
        }
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        let _ = self.ctx.deregister(self.mr.lkey);
    }
}

fn connect(pair: &NetnsPair, a: &Side, b: &Side) -> (Connection, Connection) {
    let l = in_netns(Some(&pair.a), || {
        a.ctx.listen(&format!("{}:0", pair.ip_a)).expect("listen")
    });
    let port = l.local_addr().port();
    std::thread::scope(|s| {
        let accepted = s.spawn(|| {
            in_netns(Some(&pair.a), || {
                l.accept(Some(Duration::from_secs(10))).expect("accept")
            })
        });
        let cb = in_netns(Some(&pair.b), || {
            b.ctx
                .connect(&format!("{}:{port}", pair.ip_a), Duration::from_secs(10))
                .expect("connect")
        });
        (accepted.join().unwrap(), cb)
    })
}

/// Packets dropped by the kernel's per-CPU input backlogs, all CPUs (second column of
/// /proc/net/softnet_stat, hex); 0 if unreadable.
fn softnet_drops() -> u64 {
    std::fs::read_to_string("/proc/net/softnet_stat")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|h| u64::from_str_radix(h, 16).ok())
        .sum()
}

/// Packets dropped on the path between the two namespaces, outside the sockets: the tbf
/// qdisc on b's veth (`tc -s`: "dropped N", e.g. a GSO packet it could not segment and
/// queue) and both veth devices' rx/tx drop counters; 0 for what cannot be read.
fn path_drops(pair: &NetnsPair) -> u64 {
    let out = |args: &[&str]| {
        std::process::Command::new(args[0])
            .args(&args[1..])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let qdisc = out(&[
        "ip",
        "netns",
        "exec",
        &pair.b,
        "tc",
        "-s",
        "qdisc",
        "show",
        "dev",
        &pair.veth_b,
    ]);
    let mut n: u64 = qdisc
        .split("dropped ")
        .skip(1)
        .filter_map(|t| {
            t.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    for (ns, dev) in [(&pair.a, &pair.veth_a), (&pair.b, &pair.veth_b)] {
        for stat in ["rx_dropped", "tx_dropped"] {
            let f = format!("/sys/class/net/{dev}/statistics/{stat}");
            n += out(&["ip", "netns", "exec", ns, "cat", &f])
                .trim()
                .parse::<u64>()
                .unwrap_or(0);
        }
    }
    n
}

/// Keeps this thread, and the device threads the sides start from it, on the CPU it runs
/// on. A veth hands each packet to the input backlog of the CPU that transmits it (the
/// sender's, or the one whose tbf timer fired), and two CPUs' backlogs drain independently:
/// unpinned, READ responses arrived reordered (PSN 84 before 81-83, no drop anywhere), and
/// the requester rightly re-requested from the gap (go-back-N), 8-15 times a run on kernel
/// 6.18. On one CPU: none. The responder's own order is what this test checks.
fn pin_to_one_cpu() {
    // SAFETY: sched_getcpu has no preconditions; the cpu_set_t is zeroed, then one bit set
    // by CPU_SET, and passed with its size to sched_setaffinity for this thread (0).
    unsafe {
        let cpu = libc::sched_getcpu();
        assert!(
            cpu >= 0,
            "sched_getcpu: {}",
            std::io::Error::last_os_error()
        );
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        let r = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(
            r,
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[test]
fn a_full_send_buffer_defers_datagrams_instead_of_dropping_them() {
    let _g = serial();
    let pair = match NetnsPair::create() {
        Ok(p) => p,
        Err(why) => {
            require::missing(require::NETNS, "the deferred-datagram case", why);
            return;
        }
    };
    // 100 Mbit/s with a 256 MiB queue: everything b sends waits in the qdisc, charged to its
    // socket, instead of being dropped there. Not faster: a sender through a veth also does
    // the receiving side's work in its softirqs, and on a slow host (kernel 6.18, 2026-12-01)
    // that capped even a plain UDP loop near 400 Mbit/s, so at 400 the buffer never filled.
    if let Err(why) = run(&[
        "ip",
        "netns",
        "exec",
        &pair.b,
        "tc",
        "qdisc",
        "add",
        "dev",
        &pair.veth_b,
        "root",
        "tbf",
        "rate",
        "100mbit",
        "burst",
        "64kb",
        "limit",
        "256mb",
    ]) {
        require::missing(
            require::TC,
            "the deferred-datagram case (tc's tbf qdisc)",
            why,
        );
        return;
    }
    pin_to_one_cpu();
    let read_len = read_len();
    let buf_len = READS * read_len;
    let mut a = Side::new(&pair.a, buf_len);
    let mut b = Side::new(&pair.b, buf_len);
    let (ca, cb) = connect(&pair, &a, &b);
    let remote = ca.peer_regions()[0];

    let mut x = u64::from(support::random_u32()) << 1 | 1;
    for v in b.buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *v = (x >> 24) as u8;
    }
    a.buf.fill(0);
    let wrs: Vec<SendReq> = (0..READS)
        .map(|i| SendReq {
            cookie: i as u64,
            opcode: WrOpcode::RdmaRead,
            flags: send_flags::SIGNALED,
            sges: smallvec![a.sge(i * read_len, read_len)],
            remote_addr: remote.addr + (i * read_len) as u64,
            rkey: remote.rkey,
            imm: 0,
        })
        .collect();
    let softnet_before = softnet_drops();
    let started = Instant::now();
    let mut longest_post = Duration::ZERO;
    let mut posted = 0;
    let mut done = Vec::new();
    let mut wcs = [empty_wc(); 16];
    let end = started + Duration::from_secs(30);
    while done.len() < READS {
        assert!(
            Instant::now() < end,
            "{} of {READS} READs completed within 30 s; a's counters {:?}, b's deferred {}",
            done.len(),
            ca.counters(),
            cb.tx_deferred()
        );
        if posted < READS {
            let t = Instant::now();
            posted += ca.post_send(&wrs[posted..]).unwrap_or(0);
            longest_post = longest_post.max(t.elapsed());
        }
        let n = ca.poll(&mut wcs);
        done.extend_from_slice(&wcs[..n]);
        let _ = cb.poll(&mut wcs);
        if n == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    let took = started.elapsed();
    for w in &done {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
        assert_eq!(w.opcode, WcOpcode::RdmaRead, "{w:?}");
    }
    if let Some(i) = a.buf.iter().zip(&b.buf).position(|(x, y)| x != y) {
        panic!("byte {i} of the {buf_len} read differs");
    }
    let k = ca.counters();
    let (deferred, errors) = (cb.tx_deferred(), cb.tx_errors());
    // Receive-path drops: a's socket queue, the host's per-CPU input backlogs (a veth
    // delivers through them; SO_RXQ_OVFL does not see those), and what a's device threw
    // away (truncated, bad ICRC, malformed, wrong source, unknown QPN).
    let pc = a.ctx.port_counters();
    let rx_drops = ca.kernel_drops()
        + softnet_drops().saturating_sub(softnet_before)
        + pc.truncated
        + pc.bad_icrc
        + pc.malformed
        + pc.wrong_source
        + pc.unknown_qpn;
    let path = path_drops(&pair);
    println!(
        "{READS} x {read_len} B READs over a 100 Mbit/s shaped veth in {took:?}: \
         tx_deferred {deferred}, tx_errors {errors}, retransmits {}, ack_timeouts {}, \
         receiver kernel drops {rx_drops}, path drops {path}, longest post_send {longest_post:?}; \
         responder's counters {:?}; requester's {:?}",
        k.retransmits,
        k.ack_timeouts,
        cb.counters(),
        k
    );
    assert!(
        deferred > 0,
        "the send buffer never filled: the test did not exercise back-pressure"
    );
    assert_eq!(errors, 0, "datagrams refused by the kernel");
    // Losing datagrams at the sender (the old behaviour: the rest of a batch after 8 ms of a
    // full socket) leaves gaps all through the 16 MiB answers and re-requests by the dozen.
    // Up to four are allowed without a counted drop: CI under load saw 1-3 with every drop
    // counter above at 0, before the test pinned itself to one CPU (reordering between two
    // CPUs' input backlogs, `pin_to_one_cpu`); pinned, 0 in every run seen.
    assert!(
        k.retransmits <= 4 || rx_drops + path > 0,
        "{} READs re-requested with no drop on the way: the responder lost datagrams",
        k.retransmits
    );
    drop((ca, cb));
}

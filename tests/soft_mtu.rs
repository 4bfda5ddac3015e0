//! Path MTU from the link: two network namespaces joined by a veth pair, one context in each,
//! both configured with path_mtu = 4096 (unless a case says otherwise).
//!
//! - veth MTU 1500: each side's active MTU is 1024 (a 2048-byte payload needs 2115 bytes
//!   with IPv4, UDP and RoCE headers), so the connection runs at 1024 and says why in an info
//!   line; before, every 4096-byte packet was dropped (DF) and the first READ ended in
//!   RETRY_EXC_ERR;
//! - veth MTU 9000: 4096;
//! - the two ends' MTUs differ (9000 and 1500): each offers its own active MTU, the smaller
//!   wins on both sides;
//! - path_mtu configured below the active MTU (2048 at 9000): the configured value wins;
//! - a link below 323 bytes (not even 256-byte packets fit): refused, Unsupported.
//!
//! Every case moves 4 KiB and 64 KiB READs, WRITEs and SENDs both ways and checks every
//! byte, and checks that the READ responses went out in packets of the negotiated MTU.
//! Skipped, with the reason printed, where namespaces cannot be created (a failure under
//! `RDMX_TEST_REQUIRE=all`: tests/require/mod.rs).

mod require;
mod support;

use rdmx::msgr::MrInfo;
use rdmx::msgr::{Connection, Context};
use rdmx::provider::SendReq;
use rdmx::provider::Wc;
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{Sge, WcOpcode, WcStatus, WrOpcode, smallvec};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use support::{NetnsPair, empty_wc, in_netns, run, serial};

/// Each side's buffer: four 64 KiB areas.
const AREA: usize = 64 << 10;
/// Source of this side's READ answers, WRITEs and SENDs.
const SRC: usize = 0;
/// Where this side's READs land.
const READ_DST: usize = AREA;
/// Where the peer's WRITEs land.
const WRITE_DST: usize = 2 * AREA;
/// Where the peer's SENDs land.
const RECV_DST: usize = 3 * AREA;
const BUF_LEN: usize = 4 * AREA;

const SIZES: [usize; 2] = [4 << 10, 64 << 10];

/// One side: a context created inside its namespace and a registered buffer it exposes.
struct Side {
    ctx: Context,
    buf: Vec<u8>,
    mr: MrInfo,
}

impl Side {
    fn new(ns: &str, path_mtu: &str) -> Side {
        let ctx = in_netns(Some(ns), || {
            Context::new(&support::config(&[("path_mtu", path_mtu)])).expect("context")
        });
        let mut buf = vec![0u8; BUF_LEN];
        // SAFETY: `buf` lives in the returned value, whose Drop deregisters it; the tests
        // drop their connections (flushing every WR that names it) first.
        let mr = unsafe {
            ctx.register(
                buf.as_mut_ptr(),
                buf.len(),
                access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE,
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

    /// Fills `[off, off + len)` with fresh random bytes.
    fn fill(&mut self, off: usize, len: usize) {
        let mut x = u64::from(support::random_u32()) << 32 | u64::from(support::random_u32()) | 1;
        for b in &mut self.buf[off..off + len] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = (x >> 24) as u8;
        }
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        let _ = self.ctx.deregister(self.mr.lkey);
    }
}

fn set_mtu(ns: &str, dev: &str, mtu: u32) -> Result<(), String> {
    run(&[
        "ip",
        "-n",
        ns,
        "link",
        "set",
        "dev",
        dev,
        "mtu",
        &mtu.to_string(),
    ])
}

/// Log lines rdmx emitted at info or above (installed once for the binary).
fn log_lines() -> Arc<Mutex<Vec<String>>> {
    static LINES: OnceLock<Arc<Mutex<Vec<String>>>> = OnceLock::new();
    LINES
        .get_or_init(|| {
            let lines = Arc::new(Mutex::new(Vec::new()));
            let l2 = Arc::clone(&lines);
            rdmx::logging::set_sink(
                Some(Box::new(move |_, msg| {
                    l2.lock().unwrap().push(msg.to_owned())
                })),
                log::LevelFilter::Info,
            );
            lines
        })
        .clone()
}

/// The namespaces with each veth end's MTU set, or None (printed why) where this machine
/// does not allow namespaces.
fn namespaces(mtu_a: u32, mtu_b: u32) -> Option<NetnsPair> {
    let pair = match NetnsPair::create() {
        Ok(p) => p,
        Err(why) => {
            require::missing(require::NETNS, "the veth MTU case", why);
            return None;
        }
    };
    set_mtu(&pair.a, &pair.veth_a, mtu_a).expect("veth MTU");
    set_mtu(&pair.b, &pair.veth_b, mtu_b).expect("veth MTU");
    Some(pair)
}

/// Connects b (dialing from its namespace) to a listener of a on a's veth address (accepting
/// in a's namespace); returns
/// (a's connection, b's).
fn connect(pair: &NetnsPair, a: &Side, b: &Side) -> (Connection, Connection) {
    let l = in_netns(Some(&pair.a), || {
        a.ctx.listen(&format!("{}:0", pair.ip_a)).expect("listen")
    });
    let port = l.local_addr().port();
    std::thread::scope(|s| {
        // Each side's QP creates its UDP socket on the calling thread: accept in a's namespace.
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

/// Polls both connections until `want(a's completions, b's)` holds; bounded: 10 s.
fn drive(
    ca: &Connection,
    cb: &Connection,
    want: impl Fn(&[Wc], &[Wc]) -> bool,
) -> (Vec<Wc>, Vec<Wc>) {
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    let mut wcs = [empty_wc(); 16];
    let end = Instant::now() + Duration::from_secs(10);
    while !want(&got_a, &got_b) {
        assert!(
            Instant::now() < end,
            "no completion within 10 s: a got {got_a:?}, b got {got_b:?}; a's counters {:?}, \
             b's {:?}",
            ca.counters(),
            cb.counters()
        );
        let n = ca.poll(&mut wcs);
        got_a.extend_from_slice(&wcs[..n]);
        let m = cb.poll(&mut wcs);
        got_b.extend_from_slice(&wcs[..m]);
        if n + m == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    (got_a, got_b)
}

fn same_bytes(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
        panic!(
            "{what}: byte {i} of {} differs: got {:#04x}, want {:#04x}",
            want.len(),
            got[i],
            want[i]
        );
    }
}

fn success(what: &str, wcs: &[Wc], opcode: WcOpcode, len: usize) {
    assert_eq!(wcs.len(), 1, "{what}: {wcs:?}");
    let w = &wcs[0];
    assert_eq!(w.status, WcStatus::Success, "{what}: {w:?}");
    assert_eq!(w.opcode, opcode, "{what}: {w:?}");
    if opcode != WcOpcode::RdmaWrite {
        assert_eq!(w.byte_len as usize, len, "{what}: {w:?}");
    }
}

/// READ, WRITE and SEND of each of [`SIZES`] from `req` to `resp` (connections `cq`, `cr`),
/// every byte checked. The READ responses must go out in packets of `mtu` bytes.
fn transfers(
    name: &str,
    (req, cq): (&mut Side, &Connection),
    (resp, cr): (&mut Side, &Connection),
    mtu: u32,
) {
    let remote = cq.peer_regions()[0];
    assert_eq!(
        (remote.addr, remote.rkey),
        (resp.mr.addr, resp.mr.rkey),
        "{name}: the peer exposes its buffer"
    );
    for len in SIZES {
        let what = |op: &str| format!("{name}: {op} of {len} bytes at path MTU {mtu}");

        // READ: req's READ_DST <- resp's SRC.
        resp.fill(SRC, len);
        req.buf[READ_DST..READ_DST + len].fill(0);
        let (before_q, before_r) = (cq.counters(), cr.counters());
        let wr = SendReq {
            cookie: 1,
            opcode: WrOpcode::RdmaRead,
            flags: send_flags::SIGNALED,
            sges: smallvec![req.sge(READ_DST, len)],
            remote_addr: remote.addr + SRC as u64,
            rkey: remote.rkey,
            imm: 0,
        };
        assert_eq!(cq.post_send(&[wr]).unwrap(), 1);
        let (q, _) = drive(cq, cr, |q, _| !q.is_empty());
        success(&what("READ"), &q, WcOpcode::RdmaRead, len);
        same_bytes(
            &what("READ"),
            &req.buf[READ_DST..READ_DST + len],
            &resp.buf[SRC..SRC + len],
        );
        // The responder answered in packets of the path MTU: len / mtu of them (a few more
        // only if something was retransmitted).
        let (after_q, after_r) = (cq.counters(), cr.counters());
        let packets = after_r.tx_packets - before_r.tx_packets;
        let resent = (after_r.retransmits - before_r.retransmits)
            + (after_q.retransmits - before_q.retransmits);
        let expected = (len as u64).div_ceil(u64::from(mtu));
        assert!(
            packets >= expected && packets <= expected + resent,
            "{}: the responder sent {packets} packets, expected {expected} (+{resent} \
             retransmitted)",
            what("READ")
        );

        // WRITE: req's SRC -> resp's WRITE_DST.
        req.fill(SRC, len);
        resp.buf[WRITE_DST..WRITE_DST + len].fill(0);
        let wr = SendReq {
            cookie: 2,
            opcode: WrOpcode::RdmaWrite,
            flags: send_flags::SIGNALED,
            sges: smallvec![req.sge(SRC, len)],
            remote_addr: remote.addr + WRITE_DST as u64,
            rkey: remote.rkey,
            imm: 0,
        };
        assert_eq!(cq.post_send(&[wr]).unwrap(), 1);
        let (q, _) = drive(cq, cr, |q, _| !q.is_empty());
        success(&what("WRITE"), &q, WcOpcode::RdmaWrite, len);
        same_bytes(
            &what("WRITE"),
            &resp.buf[WRITE_DST..WRITE_DST + len],
            &req.buf[SRC..SRC + len],
        );

        // SEND: req's SRC -> resp's RECV_DST (a receive of the full area).
        req.fill(SRC, len);
        resp.buf[RECV_DST..RECV_DST + AREA].fill(0);
        assert_eq!(
            cr.post_recv(&[(3, smallvec![resp.sge(RECV_DST, AREA)])])
                .unwrap(),
            1
        );
        let wr = SendReq {
            cookie: 4,
            opcode: WrOpcode::Send,
            flags: send_flags::SIGNALED,
            sges: smallvec![req.sge(SRC, len)],
            remote_addr: 0,
            rkey: 0,
            imm: 0,
        };
        assert_eq!(cq.post_send(&[wr]).unwrap(), 1);
        let (q, r) = drive(cq, cr, |q, r| !q.is_empty() && !r.is_empty());
        success(&what("SEND"), &q, WcOpcode::Send, len);
        success(&what("SEND (receive)"), &r, WcOpcode::Recv, len);
        same_bytes(
            &what("SEND"),
            &resp.buf[RECV_DST..RECV_DST + len],
            &req.buf[SRC..SRC + len],
        );
        assert!(
            resp.buf[RECV_DST + len..RECV_DST + AREA]
                .iter()
                .all(|&b| b == 0),
            "{}: nothing past the message",
            what("SEND")
        );
    }
}

/// One case: veth MTUs (a's end, b's end), configured path_mtu on each side, and what each
/// side must find: (active MTU at a, active MTU at b, negotiated path MTU).
fn case(name: &str, mtus: (u32, u32), configured: (&str, &str), expect: (u32, u32, u32)) {
    let _serial = serial();
    let logs = log_lines();
    let Some(pair) = namespaces(mtus.0, mtus.1) else {
        return;
    };
    let mut a = Side::new(&pair.a, configured.0);
    let mut b = Side::new(&pair.b, configured.1);
    let (ca, cb) = connect(&pair, &a, &b);
    let (active_a, active_b, path) = expect;
    println!(
        "[{name}] veth MTU {}/{}, path_mtu {}/{}: link {}/{}, active {}/{}, path MTU {}/{}",
        mtus.0,
        mtus.1,
        configured.0,
        configured.1,
        ca.link_mtu(),
        cb.link_mtu(),
        ca.active_mtu(),
        cb.active_mtu(),
        ca.path_mtu(),
        cb.path_mtu()
    );
    assert_eq!((ca.link_mtu(), cb.link_mtu()), mtus, "{name}: link MTUs");
    assert_eq!(
        (ca.active_mtu(), cb.active_mtu()),
        (active_a, active_b),
        "{name}: active MTUs"
    );
    assert_eq!(
        (ca.path_mtu(), cb.path_mtu()),
        (path, path),
        "{name}: negotiated path MTU"
    );

    // A clamped side says so: configured value, link MTU, route (with the veth's name) and
    // the value used. A side that was not clamped says nothing of the kind.
    let lines = logs.lock().unwrap().clone();
    for (side, ns_dev, mtu, active, configured) in [
        ("a", &pair.veth_a, mtus.0, active_a, configured.0),
        ("b", &pair.veth_b, mtus.1, active_b, configured.1),
    ] {
        let configured: u32 = configured.parse().unwrap();
        let want =
            format!("path_mtu {configured} (configured) clamped to {active} for the route to ");
        let found = lines
            .iter()
            .find(|l| l.contains(&want) && l.contains(&format!("(dev {ns_dev}): link MTU {mtu},")));
        if let Some(l) = found {
            println!("[{name}] side {side} logged: {l}");
        }
        if configured > active {
            assert!(
                found.is_some(),
                "{name}: side {side} logs its clamp ({want}... dev {ns_dev} ... link MTU {mtu}); \
                 lines: {lines:#?}"
            );
        } else {
            assert!(
                !lines
                    .iter()
                    .any(|l| l.contains(&format!("(dev {ns_dev}): link MTU"))),
                "{name}: side {side} was not clamped: {lines:#?}"
            );
        }
    }

    transfers(name, (&mut b, &cb), (&mut a, &ca), path);
    transfers(name, (&mut a, &ca), (&mut b, &cb), path);
    let (ka, kb) = (ca.counters(), cb.counters());
    println!(
        "[{name}] done: a tx {} rx {} retransmits {}, b tx {} rx {} retransmits {}",
        ka.tx_packets, ka.rx_packets, ka.retransmits, kb.tx_packets, kb.rx_packets, kb.retransmits
    );
    drop((ca, cb));
}

/// The failure this fixes: at 1500 a 4096-byte payload does not fit, so both sides offer
/// 1024 (and log the clamp) and everything moves.
#[test]
fn veth_1500_clamps_4096_to_1024() {
    case("1500", (1500, 1500), ("4096", "4096"), (1024, 1024, 1024));
}

#[test]
fn veth_9000_runs_at_4096() {
    case("9000", (9000, 9000), ("4096", "4096"), (4096, 4096, 4096));
}

/// a's end at 9000 offers 4096, b's at 1500 offers 1024: both run at 1024 (a's 4096-byte
/// packets would not even enter b's end of the veth).
#[test]
fn ends_that_differ_take_the_smaller() {
    case(
        "9000/1500",
        (9000, 1500),
        ("4096", "4096"),
        (4096, 1024, 1024),
    );
}

/// path_mtu below the active MTU wins, and is not a clamp.
#[test]
fn configured_below_active_wins() {
    case(
        "9000 path_mtu 2048",
        (9000, 9000),
        ("2048", "4096"),
        (4096, 4096, 2048),
    );
}

/// A link that cannot carry even 256-byte packets (MTU 300 < 256 + 67 header bytes): both
/// sides refuse the connection with a clear Unsupported error instead of connecting and
/// ending every WR in RETRY_EXC_ERR. (TCP still works there: the side channel comes up.)
#[test]
fn link_below_256_is_refused() {
    let _serial = serial();
    let Some(pair) = namespaces(300, 300) else {
        return;
    };
    let a = Side::new(&pair.a, "4096");
    let b = Side::new(&pair.b, "4096");
    let l = in_netns(Some(&pair.a), || {
        a.ctx.listen(&format!("{}:0", pair.ip_a)).expect("listen")
    });
    let port = l.local_addr().port();
    let (ea, eb) = std::thread::scope(|s| {
        let accepted = s.spawn(|| {
            in_netns(Some(&pair.a), || {
                l.accept(Some(Duration::from_secs(10))).unwrap_err()
            })
        });
        let eb = in_netns(Some(&pair.b), || {
            b.ctx
                .connect(&format!("{}:{port}", pair.ip_a), Duration::from_secs(10))
                .unwrap_err()
        });
        (accepted.join().unwrap(), eb)
    });
    for (side, e, dev, peer) in [
        ("a", &ea, &pair.veth_a, pair.ip_b),
        ("b", &eb, &pair.veth_b, pair.ip_a),
    ] {
        println!("[300] side {side}: {e}");
        assert_eq!(e.kind(), rdmx::ErrorKind::Unsupported, "side {side}: {e}");
        assert!(
            e.message().contains(&format!(
                "path MTU: the route to {peer} from {} (dev {dev}) has link MTU 300, below the \
                 323 bytes the smallest IB MTU (256) needs",
                if side == "a" { pair.ip_a } else { pair.ip_b }
            )),
            "side {side}: {e}"
        );
    }
}

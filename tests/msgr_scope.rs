//! Per-session remote access to the messenger's memory (issue 27, `msgr_scoped_rkeys`):
//! a peer reaches, through the rkeys it legitimately received, only the bytes meant for
//! its own session, on its own connection, and only while they are granted.
//!
//! A messenger S serves a real client A (echo traffic, eager-write and rendezvous sized,
//! content verified all along) and "rogue" peers: authenticated-as-anyone RC connections
//! to S's listener that speak the messenger protocol by hand (hello, a request, an ACK)
//! and then use the rkeys S told them (the eager-write grants in S's headers, the
//! rendezvous parts of S's reply) in raw RDMA READs and WRITEs:
//! - inside their grant, while granted: allowed (the protocol needs it);
//! - at a chunk that holds A's data, with either kind of rkey: refused;
//! - just outside the grant: refused;
//! - from another connection (another session's QP): refused;
//! - after the grant ended (the reply acknowledged; the granted receive consumed):
//!   refused.
//!
//! A refusal is a remote access error on the rogue's QP. Before the scoping, the pool's
//! rkey (one for all sessions, with remote read and write) came in every grant and
//! descriptor, and every one of these accesses succeeded. Every wait is bounded.
//!
//! On the soft provider (memory windows of its window table), and again on the verbs
//! provider under `rdmx-ibv exec` (`scoping_holds_on_verbs_under_rdmx_ibv`: windows bound
//! with IBV_WR_BIND_MW on the peer's QP and ended with IBV_WR_LOCAL_INV, through
//! libibverbs and rdmx's device `rdmx0`).

use rdmx::config::Config;
use rdmx::msgr::messenger::wire::{self, Grant, HDR_LEN, Header, Kind, Part, SLOT};
use rdmx::msgr::messenger::{
    Dispatcher, InMessage, Messenger, OutMessage, Payload, Policy, SessionId,
};
use rdmx::msgr::{Connection, Context, MrInfo};
use rdmx::provider::SendReq;
use rdmx::provider::Wc;
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{Sge, WcOpcode, WcStatus, WrOpcode, smallvec};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod support;

const T: Duration = Duration::from_secs(10);
const ECHO: u16 = 2;
const CANARY: u16 = 3;
const ASK: u16 = 7;
const ANSWER: u16 = 8;
const ANSWER_LEN: usize = 64 << 10;
const PAGE: u64 = 4096;

fn config(kv: &[(&str, &str)]) -> Config {
    rdmx::logging::init();
    let mut c = Config::new();
    c.set("provider", "soft").unwrap();
    c.set("soft_port", "0").unwrap();
    c.set("timeout", "17").unwrap();
    // Under `rdmx-ibv exec` (the verbs rerun below): provider=verbs.
    support::apply_provider(&mut c);
    for (k, v) in kv {
        c.set(k, v).unwrap();
    }
    c
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

/// S: echoes A's messages (forwarding the received segments: rendezvous from pool chunks
/// for the large ones), keeps A's canaries (their chunks hold A's data while kept) and
/// answers a rogue's request with 64 KiB (rendezvous).
#[derive(Default)]
struct Server {
    canaries: Mutex<Vec<InMessage>>,
}

impl Dispatcher for Server {
    fn on_message(&self, m: &Messenger, s: SessionId, mut msg: InMessage) {
        match msg.msg_type {
            ECHO => {
                let mut out = OutMessage::new(ECHO, msg.front.clone());
                for seg in msg.data.drain(..) {
                    out = out.with(Payload::Received(seg));
                }
                m.send(s, out).expect("echo");
            }
            CANARY => self.canaries.lock().unwrap().push(msg),
            ASK => {
                let out = OutMessage::new(ANSWER, Vec::new())
                    .with(Payload::Copy(pattern(77, ANSWER_LEN)));
                m.send(s, out).expect("answer");
            }
            _ => {}
        }
    }
}

/// A: checks every echo against what it sent.
#[derive(Default)]
struct Client {
    echoes: Mutex<Vec<InMessage>>,
    resets: AtomicU64,
}

impl Dispatcher for Client {
    fn on_message(&self, _m: &Messenger, _s: SessionId, msg: InMessage) {
        self.echoes.lock().unwrap().push(msg);
    }
    fn on_reset(&self, _m: &Messenger, _s: SessionId, _e: &rdmx::error::Error) {
        self.resets.fetch_add(1, Ordering::Relaxed);
    }
}

struct World {
    s: Messenger,
    a: Messenger,
    server: std::sync::Arc<Server>,
    client: std::sync::Arc<Client>,
    sa: SessionId,
    addr: String,
    sent: u64,
    verified: u64,
    scoped: bool,
}

impl World {
    fn new() -> World {
        let server = std::sync::Arc::new(Server::default());
        let client = std::sync::Arc::new(Client::default());
        // The soft provider's default: msgr_scoped_rkeys = true.
        let s = Messenger::new(&config(&[]), server.clone()).unwrap();
        let a = Messenger::new(&config(&[]), client.clone()).unwrap();
        let addr = s.listen("127.0.0.1:0").unwrap().to_string();
        let sa = a.connect(&addr, Policy::Lossless).unwrap();
        World {
            s,
            a,
            server,
            client,
            sa,
            addr,
            sent: 0,
            verified: 0,
            scoped: true,
        }
    }

    /// The size of A's `n`th echo: 4 KiB (eager: an RDMA WRITE into S's granted chunk),
    /// 200 KiB and 12 KiB (rendezvous, S READs A's copy chunks, then A READs S's pool
    /// chunks).
    fn echo_len(n: u64) -> usize {
        [4096, 200 << 10, 12 << 10][(n % 3) as usize]
    }

    /// One pass of both messengers; A keeps up to 4 echoes in flight and checks each.
    fn pass(&mut self) {
        self.s.poll(Duration::ZERO).unwrap();
        self.a.poll(Duration::from_micros(200)).unwrap();
        let got: Vec<InMessage> = std::mem::take(&mut *self.client.echoes.lock().unwrap());
        for m in got {
            let n = u64::from_le_bytes(m.front[..8].try_into().unwrap());
            assert_eq!(n, self.verified, "echoes in order");
            assert_eq!(m.data.len(), 1);
            assert_eq!(
                m.data[0].to_vec(),
                pattern(n, Self::echo_len(n)),
                "echo {n} intact"
            );
            self.verified += 1;
        }
        while self.sent < self.verified + 4 {
            let n = self.sent;
            let out = OutMessage::new(ECHO, n.to_le_bytes().to_vec())
                .with(Payload::Copy(pattern(n, Self::echo_len(n))));
            if self.a.send(self.sa, out).is_err() {
                break;
            }
            self.sent += 1;
        }
    }

    /// A sends a canary (4 KiB) that S keeps; returns its address in S's pool.
    fn canary(&mut self) -> (u64, Vec<u8>) {
        let data = pattern(0xca, 4096);
        self.a
            .send(
                self.sa,
                OutMessage::new(CANARY, Vec::new()).with(Payload::Copy(data.clone())),
            )
            .unwrap();
        let end = Instant::now() + T;
        loop {
            if let Some(m) = self.server.canaries.lock().unwrap().last() {
                return (m.data[0].as_ptr() as u64, data);
            }
            assert!(Instant::now() < end, "the canary never arrived");
            self.pass();
        }
    }

    /// A's session goes on: 12 more echoes, each intact, and it was never reset.
    fn goes_on(&mut self) {
        let target = self.verified + 12;
        let end = Instant::now() + Duration::from_secs(60);
        while self.verified < target {
            assert!(
                Instant::now() < end,
                "A's echoes stalled at {}",
                self.verified
            );
            self.pass();
        }
        assert_eq!(
            self.client.resets.load(Ordering::Relaxed),
            0,
            "A was never reset"
        );
    }

    fn canary_intact(&self, data: &[u8]) {
        let c = self.server.canaries.lock().unwrap();
        assert_eq!(
            c.last().unwrap().data[0].to_vec(),
            data,
            "A's data untouched"
        );
    }
}

const RECVS: usize = 16;
const STRIDE: usize = SLOT + 4096;
const SEND_AT: usize = RECVS * STRIDE;
const SCRATCH_AT: usize = SEND_AT + SLOT;
const BUF_LEN: usize = SCRATCH_AT + 4096;

/// A peer of S that speaks the messenger protocol by hand over a raw RC connection.
struct Rogue {
    conn: Option<Connection>,
    ctx: Context,
    buf: Vec<u8>,
    mr: MrInfo,
    next_recv: usize,
    grants: VecDeque<Option<Grant>>,
    /// SENDs after the hello (each consumes one of S's receives and its grant).
    sent: u64,
    msgs: VecDeque<(Header, Vec<u8>)>,
    done: VecDeque<Wc>,
    cookie: u64,
}

static IDS: AtomicU64 = AtomicU64::new(1);

impl Rogue {
    fn new(w: &mut World) -> Rogue {
        // Receives of [header slot][data chunk], as the messenger posts them.
        let ctx = Context::new(&config(&[("max_recv_sge", "2")])).unwrap();
        // S accepts in its passes: connect from another thread while driving it.
        let (c2, addr) = (ctx.clone(), w.addr.clone());
        let t = std::thread::spawn(move || c2.connect(&addr, T));
        while !t.is_finished() {
            w.pass();
        }
        let conn = t.join().unwrap().unwrap();
        assert_eq!(
            conn.peer_regions().is_empty(),
            w.scoped,
            "S's hello names no region when its pool has no remote right: {:?}",
            conn.peer_regions()
        );
        let mut buf = vec![0u8; BUF_LEN];
        // SAFETY: `buf` lives in the rogue and is deregistered in its drop, after the
        // connection is closed.
        let mr = unsafe { ctx.register(buf.as_mut_ptr(), buf.len(), access::LOCAL_WRITE) }.unwrap();
        let wrs: Vec<(u64, rdmx::rc::SgeList)> = (0..RECVS)
            .map(|i| {
                let at = mr.addr + (i * STRIDE) as u64;
                (
                    i as u64,
                    smallvec![
                        Sge {
                            addr: at,
                            length: SLOT as u32,
                            lkey: mr.lkey
                        },
                        Sge {
                            addr: at + SLOT as u64,
                            length: 4096,
                            lkey: mr.lkey
                        }
                    ],
                )
            })
            .collect();
        assert_eq!(conn.post_recv(&wrs).unwrap(), RECVS);
        let mut r = Rogue {
            conn: Some(conn),
            ctx,
            buf,
            mr,
            next_recv: 0,
            grants: VecDeque::new(),
            sent: 0,
            msgs: VecDeque::new(),
            done: VecDeque::new(),
            cookie: 1000,
        };
        let mut h = Header::new(Kind::Hello);
        h.aux = IDS.fetch_add(1, Ordering::Relaxed) << 20 | u64::from(std::process::id());
        h.credits = (RECVS - 1) as u32;
        r.send_hdr(w, h);
        r.wait_msg(w, Kind::Hello);
        r
    }

    fn conn(&self) -> &Connection {
        self.conn.as_ref().unwrap()
    }

    fn poll_once(&mut self) {
        let mut wcs = [Wc::EMPTY; 16];
        let n = self.conn().poll(&mut wcs);
        for wc in &wcs[..n] {
            if wc.opcode != WcOpcode::Recv {
                self.done.push_back(*wc);
                continue;
            }
            if wc.status != WcStatus::Success {
                continue; // flushed after a refused access
            }
            let i = self.next_recv;
            assert_eq!(wc.cookie, i as u64, "receives complete in order");
            self.next_recv += 1;
            let at = i * STRIDE;
            let slot = &self.buf[at..at + SLOT];
            let h = Header::parse(slot, wc.byte_len as usize).expect("S's header");
            if h.has(wire::flags::GRANTS) {
                self.grants.extend(h.grants(slot).map(Some));
            } else {
                self.grants.extend((0..h.credits).map(|_| None));
            }
            let data = self.buf[at + SLOT..at + SLOT + h.payload_len as usize].to_vec();
            self.msgs.push_back((h, data));
        }
    }

    /// Waits (driving S and A) for a message of `kind` from S.
    fn wait_msg(&mut self, w: &mut World, kind: Kind) -> (Header, Vec<u8>) {
        let end = Instant::now() + T;
        loop {
            self.poll_once();
            if let Some(i) = self.msgs.iter().position(|(h, _)| h.kind() == Some(kind)) {
                return self.msgs.remove(i).unwrap();
            }
            assert!(Instant::now() < end, "no {kind:?} from S");
            w.pass();
        }
    }

    fn post(&mut self, opcode: WrOpcode, sge: Sge, addr: u64, rkey: u32) -> u64 {
        self.cookie += 1;
        let c = self.cookie;
        let n = self
            .conn()
            .post_send(&[SendReq {
                cookie: c,
                opcode,
                flags: send_flags::SIGNALED,
                sges: smallvec![sge],
                remote_addr: addr,
                rkey,
                imm: 0,
            }])
            .unwrap();
        assert_eq!(n, 1);
        c
    }

    fn wait_wc(&mut self, w: &mut World, cookie: u64) -> WcStatus {
        let end = Instant::now() + T;
        loop {
            self.poll_once();
            if let Some(i) = self.done.iter().position(|wc| wc.cookie == cookie) {
                return self.done.remove(i).unwrap().status;
            }
            assert!(Instant::now() < end, "no completion for WR {cookie}");
            w.pass();
        }
    }

    /// Sends a header-only message (consuming S's next receive, and its grant).
    fn send_hdr(&mut self, w: &mut World, h: Header) {
        if h.kind() != Some(Kind::Hello) {
            self.grants.pop_front();
            self.sent += 1;
        }
        h.emit(&mut self.buf[SEND_AT..SEND_AT + SLOT]);
        let sge = Sge {
            addr: self.mr.addr + SEND_AT as u64,
            length: HDR_LEN as u32,
            lkey: self.mr.lkey,
        };
        let c = self.post(WrOpcode::Send, sge, 0, 0);
        assert_eq!(self.wait_wc(w, c), WcStatus::Success, "send {:?}", h.kind());
    }

    /// Asks S for its 64 KiB answer; returns the answer's header and first part.
    fn ask(&mut self, w: &mut World) -> (Header, Part) {
        let mut h = Header::new(Kind::Msg);
        h.seq = 1;
        h.msg_type = ASK;
        self.send_hdr(w, h);
        let (h, block) = self.wait_msg(w, Kind::Msg);
        assert_eq!(h.msg_type, ANSWER);
        assert!(h.has(wire::flags::RNDV), "64 KiB go by rendezvous");
        let (_, segs) = wire::parse_block(&h, &block).expect("descriptor block");
        (h, segs[0].parts[0])
    }

    /// One RDMA READ or WRITE of `len` bytes at S's `addr` with `rkey`: its status.
    fn rdma(&mut self, w: &mut World, op: WrOpcode, addr: u64, rkey: u32, len: u32) -> WcStatus {
        if op == WrOpcode::RdmaWrite {
            self.buf[SCRATCH_AT..SCRATCH_AT + len as usize].fill(0xee);
        }
        let sge = Sge {
            addr: self.mr.addr + SCRATCH_AT as u64,
            length: len,
            lkey: self.mr.lkey,
        };
        let c = self.post(op, sge, addr, rkey);
        self.wait_wc(w, c)
    }

    fn scratch(&self, len: usize) -> &[u8] {
        &self.buf[SCRATCH_AT..SCRATCH_AT + len]
    }

    /// The next grant S gave (the receive this rogue's next SEND consumes).
    fn next_grant(&self) -> Grant {
        self.grants
            .front()
            .copied()
            .flatten()
            .expect("S grants its receives (msgr_eager_write)")
    }
}

impl Drop for Rogue {
    fn drop(&mut self) {
        drop(self.conn.take());
        let _ = self.ctx.deregister(self.mr.lkey);
    }
}

/// The address next to a 4 KiB chunk at `addr`, in the same 2 MiB arena (so in the same
/// registration: the pool's rkey would cover it).
fn neighbour(addr: u64) -> u64 {
    if (addr + PAGE) % (2 << 20) != 0 {
        addr + PAGE
    } else {
        addr - PAGE
    }
}

/// Whether S refused a rogue's access. The refusal is the rogue's REM_ACCESS_ERR; S's
/// QP, the responder, goes to error too (verbs), so S ends that link and closes its side
/// channel, and a rogue that learns of the closed side channel before it has processed
/// the NAK sees its WR flushed instead (the provider moves a QP whose peer is gone to
/// ERR): the race is the verbs provider's (its watcher thread reads the EOF at once),
/// and either way the access did not complete. A success is never a refusal.
fn refused(st: WcStatus) -> bool {
    matches!(st, WcStatus::RemAccessErr | WcStatus::WrFlushErr)
}

fn assert_refused(st: WcStatus, what: &str) {
    assert!(
        refused(st),
        "{what}: {st:?}, want a refusal (REM_ACCESS_ERR)"
    );
}

#[test]
fn a_peer_reaches_only_what_is_granted_to_its_own_session_while_granted() {
    let mut w = World::new();
    let end = Instant::now() + Duration::from_secs(60);
    while w.verified < 12 {
        assert!(Instant::now() < end, "A's echoes stalled at {}", w.verified);
        w.pass();
    }
    let (a_chunk, a_data) = w.canary();

    // Inside its grants, while granted: the protocol's own accesses work.
    let mut r1 = Rogue::new(&mut w);
    let (_, p1) = r1.ask(&mut w);
    let n = p1.len.min(4096);
    let st = r1.rdma(&mut w, WrOpcode::RdmaRead, p1.addr, p1.rkey, n);
    assert_eq!(st, WcStatus::Success, "READ of its own rendezvous part");
    assert_eq!(r1.scratch(n as usize), &pattern(77, n as usize)[..]);
    let g = r1.next_grant();
    let st = r1.rdma(&mut w, WrOpcode::RdmaWrite, g.addr, g.rkey, 4096);
    assert_eq!(st, WcStatus::Success, "WRITE into its own granted receive");

    // Another session's QP with r1's (valid) rendezvous rkey: refused; r1 still reads.
    let mut r2 = Rogue::new(&mut w);
    let st = r2.rdma(&mut w, WrOpcode::RdmaRead, p1.addr, p1.rkey, n);
    assert_refused(st, "r1's rkey on r2's QP");
    drop(r2);
    let st = r1.rdma(&mut w, WrOpcode::RdmaRead, p1.addr, p1.rkey, n);
    assert_eq!(st, WcStatus::Success, "still r1's while granted");

    // Just outside the rendezvous part: refused.
    let past = p1.addr + u64::from(p1.len);
    let st = r1.rdma(&mut w, WrOpcode::RdmaRead, past, p1.rkey, 64);
    assert_refused(st, "READ past its part");
    drop(r1);

    // A's data, with each kind of rkey a peer is given, READ and WRITE: refused.
    type Pick = fn(&Part, &Grant) -> u32;
    let cases: [(&str, WrOpcode, Pick); 3] = [
        ("READ with a grant's rkey", WrOpcode::RdmaRead, |_, g| {
            g.rkey
        }),
        ("WRITE with a grant's rkey", WrOpcode::RdmaWrite, |_, g| {
            g.rkey
        }),
        ("READ with a rendezvous rkey", WrOpcode::RdmaRead, |p, _| {
            p.rkey
        }),
    ];
    for (what, op, pick) in cases {
        let mut r = Rogue::new(&mut w);
        let (_, p) = r.ask(&mut w);
        let g = r.next_grant();
        let st = r.rdma(&mut w, op, a_chunk, pick(&p, &g), 4096);
        assert_refused(st, &format!("A's chunk: {what}"));
        w.canary_intact(&a_data);
    }

    // Next to its granted chunk (same arena): refused.
    let mut r3 = Rogue::new(&mut w);
    let g = r3.next_grant();
    let st = r3.rdma(&mut w, WrOpcode::RdmaWrite, neighbour(g.addr), g.rkey, 4096);
    assert_refused(st, "WRITE next to its grant");
    drop(r3);

    // After the grant ended. The rendezvous part: once r4 acknowledged the answer, its
    // READ is refused (a few may still succeed until S has processed the ACK).
    let mut r4 = Rogue::new(&mut w);
    let (h, p) = r4.ask(&mut w);
    let mut ack = Header::new(Kind::Ack);
    ack.ack = h.seq;
    r4.send_hdr(&mut w, ack);
    let end = Instant::now() + T;
    loop {
        let st = r4.rdma(&mut w, WrOpcode::RdmaRead, p.addr, p.rkey, 64);
        if refused(st) {
            break;
        }
        assert_eq!(st, WcStatus::Success);
        assert!(Instant::now() < end, "READ still allowed after the ACK");
        for _ in 0..10 {
            w.pass();
        }
    }
    drop(r4);
    // A granted receive: once r5's SEND consumed it, a WRITE into it is refused.
    let mut r5 = Rogue::new(&mut w);
    let g = r5.next_grant();
    let mut m = Header::new(Kind::Msg);
    m.seq = 1;
    m.msg_type = 99; // S ignores it
    r5.send_hdr(&mut w, m);
    let end = Instant::now() + T;
    loop {
        let st = r5.rdma(&mut w, WrOpcode::RdmaWrite, g.addr, g.rkey, 64);
        if refused(st) {
            break;
        }
        assert_eq!(st, WcStatus::Success);
        assert!(
            Instant::now() < end,
            "WRITE still allowed after the receive"
        );
        for _ in 0..10 {
            w.pass();
        }
    }
    drop(r5);

    // A's traffic went on all along, every echo intact, and goes on.
    w.canary_intact(&a_data);
    w.goes_on();
    let st = w.a.session_info(w.sa).unwrap();
    assert!(
        st.counters.written_segments > 0,
        "eager writes ran: {:?}",
        st.counters
    );
    assert!(
        st.counters.read_segments > 0,
        "rendezvous ran: {:?}",
        st.counters
    );
}

/// A peer that sends SEND_WITH_INVALIDATE naming the window of the receive its SEND
/// consumes (its own grant): the messenger never sends one, so S ends that peer's link (on
/// verbs the receive completes with the invalidation: a protocol fault; on the soft
/// provider the window is not a verbs window and the receive completes with
/// REM_INV_REQ_ERR) and nothing else: A's session goes on, every echo intact.
#[test]
fn a_send_with_invalidate_ends_only_the_senders_link() {
    let mut w = World::new();
    let end = Instant::now() + Duration::from_secs(60);
    while w.verified < 6 {
        assert!(Instant::now() < end, "A's echoes stalled at {}", w.verified);
        w.pass();
    }
    let before = w.s.stats().totals;
    let mut r = Rogue::new(&mut w);
    let g = r.next_grant();
    r.grants.pop_front();
    r.sent += 1;
    let mut h = Header::new(Kind::Msg);
    h.seq = 1;
    h.msg_type = 99; // S would ignore it
    h.emit(&mut r.buf[SEND_AT..SEND_AT + SLOT]);
    r.cookie += 1;
    let c = r.cookie;
    let sge = Sge {
        addr: r.mr.addr + SEND_AT as u64,
        length: HDR_LEN as u32,
        lkey: r.mr.lkey,
    };
    let posted = r
        .conn()
        .post_send(&[SendReq {
            cookie: c,
            opcode: WrOpcode::SendWithInv,
            flags: send_flags::SIGNALED,
            sges: smallvec![sge],
            remote_addr: 0,
            rkey: 0,
            imm: g.rkey,
        }])
        .unwrap();
    assert_eq!(posted, 1);
    r.wait_wc(&mut w, c);
    // S ended the link: whatever the rogue sends next fails (S's QP is in error or gone,
    // its side channel closed), within the retry budget.
    let end = Instant::now() + T;
    loop {
        let mut h = Header::new(Kind::Ping);
        h.seq = 0;
        h.emit(&mut r.buf[SEND_AT..SEND_AT + SLOT]);
        r.cookie += 1;
        let c = r.cookie;
        let req = SendReq {
            cookie: c,
            opcode: WrOpcode::Send,
            flags: send_flags::SIGNALED,
            sges: smallvec![sge],
            remote_addr: 0,
            rkey: 0,
            imm: 0,
        };
        // Refused at the post (the side channel closed) or completed in error.
        if r.conn().post_send(&[req]).is_err() || r.wait_wc(&mut w, c) != WcStatus::Success {
            break;
        }
        assert!(
            Instant::now() < end,
            "S kept the link of a peer that invalidated"
        );
        for _ in 0..10 {
            w.pass();
        }
    }
    drop(r);
    let after = w.s.stats().totals;
    assert!(after.faults > before.faults, "S counted the link's fault");
    if support::on_verbs() {
        // The receive completed with the invalidation: a protocol error, counted as such
        // (not mistaken for a send completion out of order).
        assert!(
            after.malformed > before.malformed,
            "a SEND_WITH_INVALIDATE is a malformed frame: {after:?}"
        );
    }
    w.goes_on();
}

/// With `msgr_scoped_rkeys=false` (the comparison setting) the pool's own rkey is what a
/// peer gets, so the same READ of A's chunk succeeds: the switch is what the test above
/// measures against.
#[test]
fn without_scoping_the_pool_rkey_reaches_another_sessions_chunk() {
    let server = std::sync::Arc::new(Server::default());
    let client = std::sync::Arc::new(Client::default());
    let off = [("msgr_scoped_rkeys", "false")];
    let s = Messenger::new(&config(&off), server.clone()).unwrap();
    let a = Messenger::new(&config(&[]), client.clone()).unwrap();
    let addr = s.listen("127.0.0.1:0").unwrap().to_string();
    let sa = a.connect(&addr, Policy::Lossless).unwrap();
    let mut w = World {
        s,
        a,
        server,
        client,
        sa,
        addr,
        sent: 0,
        verified: 0,
        scoped: false,
    };
    let (a_chunk, a_data) = w.canary();
    let mut r = Rogue::new(&mut w);
    let g = r.next_grant();
    // The grant's rkey is the pool's: A's chunk (in the same arena) reads.
    if a_chunk / (2 << 20) == g.addr / (2 << 20) {
        let st = r.rdma(&mut w, WrOpcode::RdmaRead, a_chunk, g.rkey, 4096);
        assert_eq!(st, WcStatus::Success);
        assert_eq!(r.scratch(4096), &a_data[..]);
    }
    let st = r.rdma(&mut w, WrOpcode::RdmaRead, neighbour(g.addr), g.rkey, 4096);
    assert_eq!(
        st,
        WcStatus::Success,
        "the pool rkey covers the whole arena"
    );
}

/// The two tests above on the verbs provider: this binary again under `rdmx-ibv exec`
/// (rdmx's verbs provider -> libibverbs -> `rdmx0` -> the soft transport), where the
/// windows are type-2 memory windows bound with IBV_WR_BIND_MW on the peer's QP and ended
/// with IBV_WR_LOCAL_INV. The same refusals hold (another session's chunk, one byte past
/// a part, another peer's rkey, after the grant ended), and without scoping the same
/// accesses succeed.
#[test]
fn scoping_holds_on_verbs_under_rdmx_ibv() {
    support::rerun_under_rdmx_ibv(
        "127.0.93.10",
        &[
            "a_peer_reaches_only_what_is_granted_to_its_own_session_while_granted",
            "a_send_with_invalidate_ends_only_the_senders_link",
            "without_scoping_the_pool_rkey_reaches_another_sessions_chunk",
        ],
        Duration::from_secs(180),
    );
}

//! rdmx-target's isolation of sessions (issue 27): a volume handle is valid only on the
//! session that opened it, one-sided rkeys are per session (told only in its Open reply,
//! revoked when it ends), no hello carries a region, `--allow` without an authenticated
//! entity opens nothing, and a slow consumer stalls itself, not the target. Every wait is
//! bounded.

mod blk_io;

use rdmx::blk::proto::{INFO_ONE_SIDED, MSG_REQ, Op, Reply, ReqHdr};
use rdmx::blk::target::{AllowSpec, Limits, Target, TargetOptions, VolumeSpec};
use rdmx::blk::{BlkClient, Mode, Req};
use rdmx::config::Config;
use rdmx::msgr::messenger::{
    Dispatcher, InMessage, Messenger, OutMessage, Payload, Policy, SessionId,
};
use rdmx::msgr::{Connection, Context};
use rdmx::provider::SendReq;
use rdmx::provider::Wc;
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{Sge, WcStatus, WrOpcode, smallvec};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

fn cfg() -> Config {
    let mut c = Config::new();
    c.set("timeout", "17").unwrap();
    c
}

fn specs(v: &[&str]) -> Vec<VolumeSpec> {
    v.iter().map(|s| s.parse().unwrap()).collect()
}

fn target(v: &[&str]) -> Target {
    Target::start(&cfg(), "127.0.0.1:0", &specs(v)).unwrap()
}

/// Keeps every message it receives (never drops one: also the slow consumer).
struct Sink(parking_lot::Mutex<Vec<InMessage>>);
impl Dispatcher for Sink {
    fn on_message(&self, _m: &Messenger, _s: SessionId, msg: InMessage) {
        self.0.lock().push(msg);
    }
}

/// A session of our own to the target, speaking the block protocol by hand.
struct Raw {
    m: Messenger,
    s: SessionId,
    sink: Arc<Sink>,
}

fn hdr(op: Op, vol: u32, id: u64, offset: u64, len: u32, name: &[u8]) -> ReqHdr {
    ReqHdr {
        op: op as u8,
        vol,
        req_id: id,
        offset,
        len,
        place: None,
        imm_reply: false,
        name: name.to_vec(),
    }
}

impl Raw {
    fn new(t: &Target) -> Raw {
        let sink = Arc::new(Sink(parking_lot::Mutex::new(Vec::new())));
        let mut mc = cfg();
        rdmx::blk::apply_defaults(&mut mc).unwrap();
        let m = Messenger::new(&mc, sink.clone()).unwrap();
        let s = m.connect(&t.addr().to_string(), Policy::Lossy).unwrap();
        Raw { m, s, sink }
    }

    fn send(&self, h: ReqHdr, data: Option<Vec<u8>>) {
        let mut msg = OutMessage::new(MSG_REQ, h.encode());
        if let Some(d) = data {
            msg = msg.with(Payload::Copy(d));
        }
        self.m.send(self.s, msg).unwrap();
    }

    /// The reply to request `id` (waits for it).
    fn reply(&self, id: u64) -> Reply {
        let end = Instant::now() + T;
        loop {
            if let Some(r) = self
                .sink
                .0
                .lock()
                .iter()
                .filter_map(|m| Reply::decode(&m.front))
                .find(|r| r.req_id == id)
            {
                return r;
            }
            assert!(Instant::now() < end, "no reply to request {id}");
            self.m.poll(Duration::from_millis(20)).unwrap();
        }
    }

    /// Sends one request and waits for its reply.
    fn call(&self, h: ReqHdr, data: Option<Vec<u8>>) -> Reply {
        let id = h.req_id;
        self.send(h, data);
        self.reply(id)
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_handle_is_valid_only_on_the_session_that_opened_it() {
    let t = target(&["m0=mem:1M", "m1=mem:1M"]);
    // Session A opens m0 and writes it.
    let mut a = BlkClient::open(&cfg(), &t.addr().to_string(), "m0", Mode::Rpc, T).unwrap();
    let mut buf = vec![0x5au8; 4096];
    assert_eq!(one_io(&mut a, Op::Write, &mut buf), 0);
    let before = t.stats().access_denied.load(Ordering::Relaxed);
    // Session B names m0's handle (0) without opening it: refused, whatever the op.
    let b = Raw::new(&t);
    let ebadf = libc::EBADF as u32;
    assert_eq!(
        b.call(hdr(Op::Read, 0, 1, 0, 4096, b""), None).status,
        ebadf
    );
    assert_eq!(b.call(hdr(Op::Query, 0, 2, 0, 0, b""), None).status, ebadf);
    assert_eq!(
        b.call(hdr(Op::Write, 0, 3, 0, 4096, b""), Some(vec![1; 4096]))
            .status,
        ebadf
    );
    assert_eq!(b.call(hdr(Op::Flush, 0, 4, 0, 0, b""), None).status, ebadf);
    // A handle no volume has: the same answer (no oracle of which volumes exist).
    assert_eq!(
        b.call(hdr(Op::Read, 9, 5, 0, 4096, b""), None).status,
        ebadf
    );
    // B opens m1 (handle 1): that handle works, m0's still does not.
    let r = b.call(hdr(Op::Open, 0, 6, 0, 0, b"m1"), None);
    assert_eq!((r.status, r.info.map(|i| i.vol)), (0, Some(1)));
    assert_eq!(
        b.call(hdr(Op::Read, 0, 7, 0, 4096, b""), None).status,
        ebadf
    );
    assert_eq!(b.call(hdr(Op::Read, 1, 8, 0, 4096, b""), None).status, 0);
    assert_eq!(b.call(hdr(Op::Query, 1, 9, 0, 0, b""), None).status, 0);
    assert_eq!(
        t.stats().access_denied.load(Ordering::Relaxed) - before,
        6,
        "each refusal is counted"
    );
    // m0 was never written through B.
    let mut out = vec![0u8; 4096];
    let req = Req {
        op: Op::Read,
        offset: 0,
        len: 4096,
        buf: out.as_mut_ptr(),
        cookie: 2,
    };
    // SAFETY: `out` outlives the request, which is waited for.
    assert_eq!(unsafe { a.submit(&[req]) }.unwrap(), 1);
    let mut done = Vec::new();
    let end = Instant::now() + T;
    while done.is_empty() {
        assert!(Instant::now() < end);
        a.poll(&mut done, 1, 1, Duration::from_millis(100)).unwrap();
    }
    assert_eq!(done[0].status, 0);
    assert!(out.iter().all(|&x| x == 0x5a));
    // Per-session state goes with the session.
    assert_eq!(t.session_states(), 2);
    drop(a);
    drop(b);
    wait_until("the target to drop the sessions' state", || {
        t.session_states() == 0
    });
}

/// Posts one RDMA op of 4 KiB between `local` and the target's `addr`/`rkey` on a fresh
/// connection to the one-sided listener and returns its completion status.
fn one_sided(t: &Target, op: WrOpcode, local: &mut [u8], addr: u64, rkey: u32) -> WcStatus {
    let mut c = cfg();
    rdmx::blk::apply_defaults(&mut c).unwrap();
    let ctx = Context::new(&c).unwrap();
    let conn: Connection = ctx.connect(&t.rdma_addr().unwrap().to_string(), T).unwrap();
    // The one-sided listener's hello discloses no region.
    assert!(conn.peer_regions().is_empty(), "{:?}", conn.peer_regions());
    // SAFETY: `local` outlives the registration (deregistered below, after the op completed).
    let mr = unsafe { ctx.register(local.as_mut_ptr(), local.len(), access::LOCAL_WRITE) }.unwrap();
    conn.post_send(&[SendReq {
        cookie: 1,
        opcode: op,
        flags: send_flags::SIGNALED,
        sges: smallvec![Sge {
            addr: mr.addr,
            length: 4096,
            lkey: mr.lkey,
        }],
        remote_addr: addr,
        rkey,
        imm: 0,
    }])
    .unwrap();
    let mut wcs = [Wc::EMPTY; 4];
    let end = Instant::now() + T;
    let status = loop {
        let n = conn.poll(&mut wcs);
        if n > 0 {
            break wcs[0].status;
        }
        assert!(Instant::now() < end, "no completion");
        std::thread::sleep(Duration::from_micros(200));
    };
    drop(conn);
    let _ = ctx.deregister(mr.lkey);
    status
}

#[test]
fn one_sided_rkeys_are_per_session_and_revoked_when_it_ends() {
    let t = target(&["m0=mem:1M"]);
    let a = Raw::new(&t);
    let b = Raw::new(&t);
    let ia = a.call(hdr(Op::Open, 0, 1, 0, 0, b"m0"), None).info.unwrap();
    let ib = b.call(hdr(Op::Open, 0, 1, 0, 0, b"m0"), None).info.unwrap();
    assert!(ia.flags & INFO_ONE_SIDED != 0 && ib.flags & INFO_ONE_SIDED != 0);
    assert_ne!(
        ia.region_rkey, ib.region_rkey,
        "one registration per session"
    );
    assert_eq!(ia.region_addr, ib.region_addr);
    // Opening again on the same session keeps its registration.
    let again = a.call(hdr(Op::Open, 0, 2, 0, 0, b"m0"), None).info.unwrap();
    assert_eq!(again.region_rkey, ia.region_rkey);
    // A writes a block through the target; both rkeys read it one-sided.
    assert_eq!(
        a.call(
            hdr(Op::Write, 0, 3, 8192, 4096, b""),
            Some(vec![0xc3; 4096])
        )
        .status,
        0
    );
    let mut got = vec![0u8; 4096];
    let st = one_sided(
        &t,
        WrOpcode::RdmaRead,
        &mut got,
        ia.region_addr + 8192,
        ia.region_rkey,
    );
    assert_eq!(st, WcStatus::Success);
    assert!(got.iter().all(|&x| x == 0xc3));
    // A's session ends: its rkey is revoked, B's still works.
    a.m.close_session(a.s).unwrap();
    wait_until("the target to end A's session", || t.session_states() == 1);
    let mut got = vec![0u8; 4096];
    let st = one_sided(
        &t,
        WrOpcode::RdmaRead,
        &mut got,
        ia.region_addr + 8192,
        ia.region_rkey,
    );
    assert_eq!(
        st,
        WcStatus::RemAccessErr,
        "A's rkey after A's session ended"
    );
    let st = one_sided(
        &t,
        WrOpcode::RdmaRead,
        &mut got,
        ib.region_addr + 8192,
        ib.region_rkey,
    );
    assert_eq!(st, WcStatus::Success);
    assert!(got.iter().all(|&x| x == 0xc3));
    drop(b);
}

#[test]
fn the_messenger_hello_carries_no_region() {
    // Before: the memory volume (registered in the messenger's context for reads sent by
    // rendezvous) and the pool were in the hello any bare connect received.
    let t = target(&["m0=mem:1M"]);
    let mut c = cfg();
    rdmx::blk::apply_defaults(&mut c).unwrap();
    let ctx = Context::new(&c).unwrap();
    let conn = ctx.connect(&t.addr().to_string(), T).unwrap();
    assert!(conn.peer_regions().is_empty(), "{:?}", conn.peer_regions());
}

#[test]
fn allow_without_an_authenticated_entity_opens_nothing() {
    // Until the side channel authenticates an entity (auth = none), a target given --allow
    // refuses every open; without --allow, everything opens (checked by the other tests).
    let opts = TargetOptions {
        allow: vec!["m0=client.a:rw".parse::<AllowSpec>().unwrap()],
        limits: Limits::default(),
    };
    let t = Target::start_with(&cfg(), "127.0.0.1:0", &specs(&["m0=mem:1M"]), &opts).unwrap();
    let e = BlkClient::open(&cfg(), &t.addr().to_string(), "m0", Mode::Rpc, T).unwrap_err();
    assert!(e.to_string().contains("Permission denied"), "{e}");
    let r = Raw::new(&t);
    assert_eq!(
        r.call(hdr(Op::Open, 0, 1, 0, 0, b"m0"), None).status,
        libc::EACCES as u32
    );
    assert!(t.stats().access_denied.load(Ordering::Relaxed) >= 2);
    // Bad grants are refused at start with a reason.
    let bad = TargetOptions {
        allow: vec!["nope=client.a:rw".parse::<AllowSpec>().unwrap()],
        limits: Limits::default(),
    };
    let e = Target::start_with(&cfg(), "127.0.0.1:0", &specs(&["m0=mem:1M"]), &bad).unwrap_err();
    assert!(e.to_string().contains("no such volume"), "{e}");
}

/// A keyring file (mode 600) in a directory of its own, removed on drop.
struct Keyring(std::path::PathBuf);

impl Keyring {
    fn new(entries: &[(&str, &str)]) -> Keyring {
        use std::os::unix::fs::PermissionsExt;
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rdmx-target-acl-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keyring");
        let text: String = entries
            .iter()
            .map(|(e, k)| format!("[{e}]\n    key = {k}\n"))
            .collect();
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        Keyring(path)
    }

    fn cfg(&self, entity: &str) -> Config {
        let mut c = cfg();
        c.set("auth_keyring", &self.0.display().to_string())
            .unwrap();
        c.set("auth_entity", entity).unwrap();
        c
    }
}

impl Drop for Keyring {
    fn drop(&mut self) {
        if let Some(d) = self.0.parent() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// One 4 KiB request through `c`, waited for; its status.
fn one_io(c: &mut BlkClient, op: Op, buf: &mut [u8]) -> i32 {
    blk_io::io_4k(c, op, buf, T)
}

#[test]
fn allow_grants_each_authenticated_entity_its_own_access() {
    const KA: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const KB: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";
    const KC: &str = "QEFCQ0RFRkdISUpLTE1OT1BRUlNUVVZXWFlaW1xdXl8=";
    let server = Keyring::new(&[("client.a", KA), ("client.b", KB), ("client.c", KC)]);
    let (ka, kb, kc) = (
        Keyring::new(&[("client.a", KA)]),
        Keyring::new(&[("client.b", KB)]),
        Keyring::new(&[("client.c", KC)]),
    );
    let opts = TargetOptions {
        allow: vec![
            "m0=client.a:rw".parse::<AllowSpec>().unwrap(),
            "m0=client.b:ro".parse::<AllowSpec>().unwrap(),
        ],
        limits: Limits::default(),
    };
    let t = Target::start_with(
        &server.cfg("osd.0"),
        "127.0.0.1:0",
        &specs(&["m0=mem:1M"]),
        &opts,
    )
    .unwrap();
    let addr = t.addr().to_string();
    // client.a (rw): writes, then reads back what it wrote.
    let mut a = BlkClient::open(&ka.cfg("client.a"), &addr, "m0", Mode::Rpc, T).unwrap();
    let mut w = vec![0xa5u8; 4096];
    assert_eq!(one_io(&mut a, Op::Write, &mut w), 0);
    // client.b (ro): opens and reads a's block; its write is refused.
    let mut b = BlkClient::open(&kb.cfg("client.b"), &addr, "m0", Mode::Rpc, T).unwrap();
    let mut r = vec![0u8; 4096];
    assert_eq!(one_io(&mut b, Op::Read, &mut r), 0);
    assert_eq!(r, w);
    let denied = t.stats().access_denied.load(Ordering::Relaxed);
    let mut w2 = vec![0x11u8; 4096];
    assert_ne!(
        one_io(&mut b, Op::Write, &mut w2),
        0,
        "a read-only grant wrote"
    );
    assert!(t.stats().access_denied.load(Ordering::Relaxed) > denied);
    // client.c (a valid key, no grant) opens nothing.
    let e = BlkClient::open(&kc.cfg("client.c"), &addr, "m0", Mode::Rpc, T).unwrap_err();
    assert_eq!(e.kind(), rdmx::ErrorKind::Auth, "{e}");
    assert!(e.to_string().contains("Permission denied"), "{e}");
    // client.c claiming to be client.a with its own key: refused at authentication.
    let e = BlkClient::open(&kc.cfg("client.a"), &addr, "m0", Mode::Rpc, T).unwrap_err();
    assert_eq!(e.kind(), rdmx::ErrorKind::Auth, "{e}");
    // a's block is unchanged by b's refused write.
    assert_eq!(one_io(&mut a, Op::Read, &mut r), 0);
    assert_eq!(r, w);
}

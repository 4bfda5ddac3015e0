//! Helpers for the cross-process tests: a peer process (this test binary re-executed), the
//! in-process side of a connection, network namespaces joined by a veth pair, and UDP
//! black holes made of nftables rules. Every wait is bounded; every guard cleans up on drop
//! (also when a test panics).
//!
//! The peer: a test file declares
//! `#[test] #[ignore] fn support_peer_main() { support::peer_main() }`; [`Peer::spawn`]
//! re-executes the binary with `--exact support_peer_main --include-ignored` and
//! `RDMXTEST_PEER=<spec>`. The peer listens, prints `RDMXPEER LISTEN tcp=.. udp=..`, accepts
//! one connection, prints `RDMXPEER CONNECTED`, then reports every completion
//! (`RDMXPEER WC ...`) and obeys commands on its stdin (`recv N`, `counters`, `exit`).
//! Stdin EOF (the test died) ends it too, and it never lives longer than [`PEER_LIFETIME`].
#![allow(dead_code)]

pub mod msgr_faults;

use rdmx::config::Config;
use rdmx::msgr::MrInfo;
use rdmx::msgr::{Connection, Context};
use rdmx::provider::SendReq;
use rdmx::provider::Wc;
use rdmx::rc::verbs::{access, send_flags};
use rdmx::rc::{Sge, WcOpcode, WcStatus, WrOpcode, smallvec};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Environment variable carrying the peer's spec (not `RDMX_`: those are configuration
/// keys, and `rdmx-ibv exec` refuses unknown ones).
pub const PEER_ENV: &str = "RDMXTEST_PEER";
/// Environment variable naming the [`NetnsPair`] a verbs rerun of the namespace cases
/// runs in (see [`rerun_in_netns_under_rdmx_ibv`]).
pub const NETNS_ENV: &str = "RDMXTEST_NETNS";
/// Tag of the lines the peer prints (libtest's own lines lack it).
const TAG: &str = "RDMXPEER ";
/// Upper bound on a peer's life.
pub const PEER_LIFETIME: Duration = Duration::from_secs(60);
/// Size of the peer's exposed region (REMOTE_READ | REMOTE_WRITE | LOCAL_WRITE); receive
/// buffers live in its upper half.
pub const PEER_REGION: usize = 64 << 10;
/// Receive buffer size the peer posts.
pub const PEER_RECV_LEN: u32 = 4096;

/// Registers `a_buf` on `a` with local write, and `b_buf` on `b` with local write and remote
/// read and write: the layout of the in-process tests (a reads from and writes to b).
///
/// # Safety
/// Both buffers must outlive their registrations: the caller deregisters them after the
/// connections naming them are closed.
pub unsafe fn register_pair(
    a: &Context,
    a_buf: &mut [u8],
    b: &Context,
    b_buf: &mut [u8],
) -> (MrInfo, MrInfo) {
    // SAFETY: the caller keeps both buffers alive past their deregistration.
    let ma = unsafe { a.register(a_buf.as_mut_ptr(), a_buf.len(), access::LOCAL_WRITE) }.unwrap();
    // SAFETY: as above.
    let mb = unsafe {
        b.register(
            b_buf.as_mut_ptr(),
            b_buf.len(),
            access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE,
        )
    }
    .unwrap();
    (ma, mb)
}

/// Connects `a` to a listener of `b` on `listen` ("IP", IPv6 in brackets; port 0), dialing
/// it at `host`; returns (a's connection, b's). Bounded: 10 s.
pub fn connect_pair(
    a: &Context,
    b: &Context,
    listen: &str,
    host: &str,
) -> (Connection, Connection) {
    let l = b.listen(&format!("{listen}:0")).unwrap();
    let port = l.local_addr().port();
    let t = std::thread::spawn(move || l.accept(Some(Duration::from_secs(10))).unwrap());
    let ca = a
        .connect(&format!("{host}:{port}"), Duration::from_secs(10))
        .unwrap();
    (ca, t.join().unwrap())
}

/// Polls `c` until `n` completions arrived or `within` passed; returns what arrived.
pub fn poll_for(c: &Connection, n: usize, within: Duration) -> Vec<Wc> {
    let mut got = Vec::new();
    let mut buf = [empty_wc(); 16];
    let end = Instant::now() + within;
    while got.len() < n && Instant::now() < end {
        let k = c.poll(&mut buf);
        got.extend_from_slice(&buf[..k]);
        if k == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    got
}

/// The byte at offset `i` of the peer's region.
pub fn pattern(i: usize) -> u8 {
    (i * 7 + 3) as u8
}

/// Serializes the timing tests of one binary (2 shared cores: parallel tests would skew
/// each other's timers).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// An rdmx config: soft port 0 (any free port), MTU 1024, the provider under test
/// ([`apply_provider`]), then `kv` in order.
pub fn config(kv: &[(&str, &str)]) -> Config {
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    c.set("path_mtu", "1024").unwrap();
    apply_provider(&mut c);
    for (k, v) in kv {
        c.set(k, v)
            .unwrap_or_else(|e| panic!("config {k}={v}: {e}"));
    }
    c
}

/// The provider the provider suite runs on: `RDMX_PROVIDER` when set (the configuration
/// key's own variable: [`rerun_under_rdmx_ibv`] runs a test binary again under
/// `rdmx-ibv exec --set provider=verbs`), else the default config's.
pub fn apply_provider(c: &mut Config) {
    if let Ok(p) = std::env::var("RDMX_PROVIDER") {
        c.set("provider", &p)
            .unwrap_or_else(|e| panic!("RDMX_PROVIDER={p}: {e}"));
    }
}

/// The peer process's device address on the verbs provider (this side's is 127.0.0.2).
pub const VERBS_PEER_IP: &str = "127.0.0.3";

/// Whether this test process runs the suite on the verbs provider (under `rdmx-ibv`).
pub fn on_verbs() -> bool {
    std::env::var("RDMX_PROVIDER").is_ok_and(|p| p == "verbs")
}

/// `target/<profile>/rdmx-ibv`, next to this test binary's `deps/` directory. `cargo
/// test` does not build it (nor the provider library): `cargo build --workspace` does,
/// as `scripts/test.sh` runs before the tests.
pub fn rdmx_ibv_launcher() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let l = dir.join("rdmx-ibv");
    assert!(
        l.exists() && dir.join("librdmx_ibv.so").exists(),
        "{} or librdmx_ibv.so missing: run `cargo build --workspace` first (scripts/test.sh does)",
        l.display()
    );
    l
}

/// Runs `tests` of this test binary again with `provider=verbs` under `rdmx-ibv exec --ip
/// ip`: libibverbs then sees rdmx's device `rdmx0` (the soft transport underneath), and
/// the same tests drive rdmx's verbs provider. Asserts they all pass; bounded by
/// `deadline`. A no-op inside such a run.
pub fn rerun_under_rdmx_ibv(ip: &str, tests: &[&str], deadline: Duration) {
    if std::env::var_os("RDMX_PROVIDER").is_some() {
        return;
    }
    let mut cmd = Command::new(rdmx_ibv_launcher());
    cmd.args(["exec", "--ip", ip, "--set", "provider=verbs", "--"]);
    rerun(cmd, tests, deadline);
}

/// [`rerun_under_rdmx_ibv`] for the namespace cases: the launcher runs inside `pair.b`
/// (`ip netns exec B rdmx-ibv exec --ip IP_B ...`): a process's device has the one
/// address its launcher was given, and its UDP socket is opened in the namespace the
/// process runs in, so this side must start there rather than join it from a thread as
/// the soft cases do ([`in_netns`]). The cases find the pair in [`NETNS_ENV`]; their peer
/// runs likewise in `pair.a` ([`Peer::spawn`]).
pub fn rerun_in_netns_under_rdmx_ibv(pair: &NetnsPair, tests: &[&str], deadline: Duration) {
    if std::env::var_os("RDMX_PROVIDER").is_some() {
        return;
    }
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &pair.b])
        .arg(rdmx_ibv_launcher())
        .args(["exec", "--ip", &pair.ip_b.to_string()])
        .args(["--set", "provider=verbs", "--"])
        .env(NETNS_ENV, pair.encode());
    rerun(cmd, tests, deadline);
}

/// Runs this test binary's `tests` through `cmd` (a launcher prefix), bounded by
/// `deadline`; every test must pass.
fn rerun(mut cmd: Command, tests: &[&str], deadline: Duration) {
    cmd.arg(std::env::current_exe().unwrap())
        .args(["--exact", "--test-threads=1", "--nocapture"])
        .args(tests)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn rdmx-ibv exec");
    let end = Instant::now() + deadline;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let Some(status) = status else {
        panic!("provider=verbs run exceeded {deadline:?}\n{stdout}\n{stderr}");
    };
    assert!(
        status.success(),
        "provider=verbs under rdmx-ibv failed ({status}):\n{stdout}\n{stderr}"
    );
    let want = format!("{} passed", tests.len());
    assert!(
        stdout.contains(&want),
        "expected '{want}' (every test ran, none filtered out):\n{stdout}"
    );
    eprintln!("provider=verbs under rdmx-ibv: {want}");
}

/// What the peer process does.
#[derive(Debug, Clone)]
pub struct PeerSpec {
    /// IPv4 address to listen on (TCP; the soft UDP port binds 0.0.0.0).
    pub bind: String,
    /// Config keys on top of [`config`]'s base.
    pub config: Vec<(String, String)>,
    /// Receives posted right after the connection is up.
    pub recvs: u32,
}

impl PeerSpec {
    pub fn new(bind: &str, kv: &[(&str, &str)], recvs: u32) -> PeerSpec {
        PeerSpec {
            bind: bind.to_owned(),
            config: kv
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            recvs,
        }
    }

    fn encode(&self) -> String {
        let cfg: Vec<String> = self
            .config
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect();
        format!(
            "bind={};recvs={};cfg={}",
            self.bind,
            self.recvs,
            cfg.join(",")
        )
    }

    fn decode(s: &str) -> PeerSpec {
        let mut spec = PeerSpec {
            bind: "127.0.0.1".into(),
            config: Vec::new(),
            recvs: 0,
        };
        for part in s.split(';') {
            let (k, v) = part.split_once('=').unwrap_or((part, ""));
            match k {
                "bind" => spec.bind = v.to_owned(),
                "recvs" => spec.recvs = v.parse().expect("recvs"),
                "cfg" => {
                    spec.config = v
                        .split(',')
                        .filter(|x| !x.is_empty())
                        .map(|kv| {
                            let (a, b) = kv.split_once(':').expect("cfg k:v");
                            (a.to_owned(), b.to_owned())
                        })
                        .collect()
                }
                _ => panic!("peer spec: unknown part {part:?}"),
            }
        }
        spec
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{TAG}{line}");
    let _ = out.flush();
}

fn wc_line(w: &Wc) -> String {
    format!(
        "WC cookie={} status={:?} opcode={:?} len={}",
        w.cookie, w.status, w.opcode, w.byte_len
    )
}

/// The peer process's body (see the module docs). Returns at once when [`PEER_ENV`] is not
/// set, so running the ignored test by hand is harmless.
pub fn peer_main() {
    let Ok(spec) = std::env::var(PEER_ENV) else {
        return;
    };
    let spec = PeerSpec::decode(&spec);
    let kv: Vec<(&str, &str)> = spec
        .config
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let ctx = Context::new(&config(&kv)).expect("peer context");
    // The region lives as long as the process.
    let region: &'static mut [u8] = Box::leak(
        (0..PEER_REGION)
            .map(pattern)
            .collect::<Vec<u8>>()
            .into_boxed_slice(),
    );
    // SAFETY: leaked, so valid for the rest of the process.
    let mr = unsafe {
        ctx.register(
            region.as_mut_ptr(),
            region.len(),
            access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE,
        )
    }
    .expect("peer register");
    let l = ctx
        .listen(&format!("{}:0", spec.bind))
        .expect("peer listen");
    say(&format!(
        "LISTEN tcp={} udp={} pid={}",
        l.local_addr().port(),
        ctx.udp_addr().port(),
        std::process::id()
    ));
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                return;
            }
        }
        let _ = tx.send("exit".into());
    });
    let conn = l
        .accept(Some(Duration::from_secs(20)))
        .expect("peer accept");
    let mut next_recv = 0u64;
    let post_recvs = |n: u32, next: &mut u64| {
        for _ in 0..n {
            let slot = *next % 8;
            let sge = Sge {
                addr: mr.addr + (PEER_REGION / 2) as u64 + slot * u64::from(PEER_RECV_LEN),
                length: PEER_RECV_LEN,
                lkey: mr.lkey,
            };
            conn.post_recv(&[(1000 + *next, smallvec![sge])])
                .expect("peer post_recv");
            *next += 1;
        }
    };
    post_recvs(spec.recvs, &mut next_recv);
    // Only now: the other side sends once it reads this, and must not meet RNR NAKs.
    say("CONNECTED");
    let end = Instant::now() + PEER_LIFETIME;
    let mut wcs = [empty_wc(); 16];
    while Instant::now() < end {
        let n = conn.poll(&mut wcs);
        for w in &wcs[..n] {
            say(&wc_line(w));
        }
        match rx.try_recv() {
            Ok(cmd) => {
                let words: Vec<&str> = cmd.split_whitespace().collect();
                match words.as_slice() {
                    ["recv", n] => {
                        let n: u32 = n.parse().expect("recv N");
                        post_recvs(n, &mut next_recv);
                        say(&format!("POSTED n={n}"));
                    }
                    ["counters"] => {
                        let c = conn.counters();
                        say(&format!(
                            "COUNTERS rnr_naks_sent={} rx_packets={} tx_packets={} duplicates_received={}",
                            c.rnr_naks_sent, c.rx_packets, c.tx_packets, c.duplicates_received
                        ));
                    }
                    ["exit"] => break,
                    _ => say(&format!("UNKNOWN {cmd}")),
                }
            }
            Err(mpsc::TryRecvError::Empty) => {}
            Err(mpsc::TryRecvError::Disconnected) => break,
        }
        if n == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    say("EXIT");
}

pub fn empty_wc() -> Wc {
    Wc {
        cookie: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qp_num: 0,
        src_qp: None,
    }
}

/// A running peer process; killed (SIGKILL) and reaped on drop.
pub struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    /// Tagged lines received but not yet consumed by [`Peer::expect`].
    backlog: VecDeque<String>,
    /// Everything the peer printed (for failure messages).
    transcript: Vec<String>,
    pub pid: u32,
    pub tcp_port: u16,
    pub udp_port: u16,
    reaped: bool,
}

impl Peer {
    /// Starts the peer (inside `netns` if given) and waits for its LISTEN line.
    pub fn spawn(spec: &PeerSpec, netns: Option<&str>) -> Peer {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = match netns {
            // On verbs the launcher runs inside the namespace, with the peer's address.
            Some(ns) if on_verbs() => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns])
                    .arg(rdmx_ibv_launcher())
                    .args(["exec", "--ip", &spec.bind, "--"])
                    .arg(&exe);
                c
            }
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&exe);
                c
            }
            // On the verbs provider (this binary under `rdmx-ibv exec`), the peer needs a
            // device of its own: RoCEv2 has one UDP port, so one address per process.
            None if on_verbs() => {
                let mut c = Command::new(rdmx_ibv_launcher());
                c.args(["exec", "--ip", VERBS_PEER_IP, "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args([
            "--exact",
            "support_peer_main",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PEER_ENV, spec.encode())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("spawn peer");
        let rx = line_reader(child.stdout.take().expect("peer stdout"));
        let pid = child.id();
        let mut p = Peer {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            backlog: VecDeque::new(),
            transcript: Vec::new(),
            pid,
            tcp_port: 0,
            udp_port: 0,
            reaped: false,
        };
        let l = p.expect("LISTEN", Duration::from_secs(20));
        p.tcp_port = field(&l, "tcp").parse().expect("tcp port");
        p.udp_port = field(&l, "udp").parse().expect("udp port");
        let real_pid: u32 = field(&l, "pid").parse().expect("pid");
        assert_eq!(
            real_pid, pid,
            "the peer must be the spawned process itself (ip netns exec execs)"
        );
        p
    }

    /// Waits up to `timeout` for a tagged line starting with `what`; returns it without the
    /// tag. Lines skipped over stay available to later calls.
    pub fn expect(&mut self, what: &str, timeout: Duration) -> String {
        if let Some(i) = self.backlog.iter().position(|l| l.starts_with(what)) {
            return self.backlog.remove(i).unwrap();
        }
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.transcript.push(line.clone());
                    let Some(i) = line.find(TAG) else { continue };
                    let body = line[i + TAG.len()..].to_owned();
                    if body.starts_with(what) {
                        return body;
                    }
                    self.backlog.push_back(body);
                }
                Err(e) => panic!(
                    "peer {}: no '{what}' line within {timeout:?} ({e:?}); it printed:\n{}",
                    self.pid,
                    self.transcript.join("\n")
                ),
            }
        }
    }

    /// Tagged lines that arrived so far and were not consumed (non-blocking).
    pub fn drain(&mut self) -> Vec<String> {
        while let Ok(line) = self.lines.try_recv() {
            self.transcript.push(line.clone());
            if let Some(i) = line.find(TAG) {
                self.backlog.push_back(line[i + TAG.len()..].to_owned());
            }
        }
        self.backlog.drain(..).collect()
    }

    /// Sends a command line to the peer's stdin.
    pub fn command(&mut self, cmd: &str) {
        let s = self.stdin.as_mut().expect("peer stdin");
        writeln!(s, "{cmd}").expect("write to peer");
        s.flush().expect("flush to peer");
    }

    /// The peer's counters line, parsed into (name, value) pairs.
    pub fn counters(&mut self) -> Vec<(String, u64)> {
        self.command("counters");
        let l = self.expect("COUNTERS", Duration::from_secs(5));
        l.split_whitespace()
            .skip(1)
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
            .collect()
    }

    pub fn counter(&mut self, name: &str) -> u64 {
        self.counters()
            .into_iter()
            .find(|(k, _)| k == name)
            .unwrap_or_else(|| panic!("peer counter {name}"))
            .1
    }

    /// Sends `sig` to the peer.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: plain kill(2) on our own child's pid (not yet reaped).
        let r = unsafe { libc::kill(self.pid as libc::pid_t, sig) };
        assert_eq!(
            r,
            0,
            "kill({}, {sig}): {}",
            self.pid,
            std::io::Error::last_os_error()
        );
    }

    /// SIGSTOP, then waits (bounded: 2 s) until every thread of the peer is stopped, so
    /// nothing it does afterwards can answer a packet.
    pub fn stop(&self) {
        stop_process(self.pid);
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if self.reaped {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stdin.take();
        self.kill();
    }
}

/// SIGSTOP `pid`, then waits (bounded: 2 s) until every thread of it is stopped, so
/// nothing it does afterwards can answer a packet.
pub fn stop_process(pid: u32) {
    // SAFETY: plain kill(2) on a child of ours (not yet reaped).
    let r = unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
    assert_eq!(r, 0, "SIGSTOP {pid}: {}", std::io::Error::last_os_error());
    let end = Instant::now() + Duration::from_secs(2);
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("tasks of a stopped process")
            .filter_map(|e| e.ok())
            .map(|e| std::fs::read_to_string(e.path().join("stat")).unwrap_or_default())
            .collect::<Vec<_>>();
        // The state is the field after the parenthesized command name.
        let stopped = tasks.iter().all(|st| {
            st.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
        });
        if stopped && !tasks.is_empty() {
            return;
        }
        assert!(Instant::now() < end, "{pid} did not stop: {tasks:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// SIGCONT `pid`.
pub fn continue_process(pid: u32) {
    // SAFETY: plain kill(2) on a child of ours (not yet reaped).
    let r = unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) };
    assert_eq!(r, 0, "SIGCONT {pid}: {}", std::io::Error::last_os_error());
}

/// The value of `key=value` in a line (panics if absent).
pub fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// This process's side of a connection: a context, a registered 64 KiB buffer and the
/// connection to a peer.
pub struct Local {
    pub conn: Connection,
    pub ctx: Context,
    pub buf: Vec<u8>,
    pub lkey: u32,
    pub addr: u64,
}

impl Local {
    pub fn connect(kv: &[(&str, &str)], peer_ip: &str, tcp_port: u16) -> Local {
        let ctx = Context::new(&config(kv)).expect("context");
        let mut buf = vec![0u8; 64 << 10];
        // SAFETY: `buf` is owned by the returned value, which drops `conn` (releasing every
        // WR that names it) before the buffer; see Drop below.
        let mr = unsafe { ctx.register(buf.as_mut_ptr(), buf.len(), access::LOCAL_WRITE) }
            .expect("register");
        let conn = ctx
            .connect(&format!("{peer_ip}:{tcp_port}"), Duration::from_secs(10))
            .expect("connect to peer");
        Local {
            conn,
            ctx,
            buf,
            lkey: mr.lkey,
            addr: mr.addr,
        }
    }

    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + off,
            length: len,
            lkey: self.lkey,
        }
    }

    /// The peer's first exposed region (addr, rkey).
    pub fn peer_region(&self) -> (u64, u32) {
        let r = self
            .conn
            .peer_regions()
            .first()
            .expect("the peer exposes a region");
        (r.addr, r.rkey)
    }

    /// A WR. `signaled` selects IBV_SEND_SIGNALED. READ/WRITE target the peer's region at
    /// `remote_off`.
    pub fn wr(
        &self,
        cookie: u64,
        opcode: WrOpcode,
        off: u64,
        len: u32,
        remote_off: u64,
        signaled: bool,
    ) -> SendReq {
        let (raddr, rkey) = match opcode {
            WrOpcode::Send | WrOpcode::SendWithImm => (0, 0),
            _ => self.peer_region(),
        };
        SendReq {
            cookie,
            opcode,
            flags: if signaled { send_flags::SIGNALED } else { 0 },
            sges: smallvec![self.sge(off, len)],
            remote_addr: raddr + remote_off,
            rkey,
            imm: 0,
        }
    }

    /// Polls until `n` completions arrived or `timeout` passed; each with its arrival time.
    pub fn wait(&self, n: usize, timeout: Duration) -> Vec<(Wc, Instant)> {
        let mut got = Vec::new();
        let mut buf = [empty_wc(); 16];
        let end = Instant::now() + timeout;
        while got.len() < n && Instant::now() < end {
            let k = self.conn.poll(&mut buf);
            let now = Instant::now();
            got.extend(buf[..k].iter().map(|w| (*w, now)));
            if k == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        got
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // Closing flushes every WR, so the buffer is no longer named by anything.
        self.conn.close();
        let _ = self.ctx.deregister(self.lkey);
    }
}

/// True if `measured` is within +-50% + 10 ms of `expected`.
pub fn within_tolerance(measured: Duration, expected: Duration) -> bool {
    let slack = expected / 2 + Duration::from_millis(10);
    measured + slack >= expected && measured <= expected + slack
}

// ------------------------------------------------------------------------------------------
// Commands

/// Runs a command; Err with its output when it fails.
pub fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `nft -f -` with `script` (inside `netns` if given).
fn nft(netns: Option<&str>, script: &str) -> Result<(), String> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "nft", "-f", "-"]);
            c
        }
        None => {
            let mut c = Command::new("nft");
            c.args(["-f", "-"]);
            c
        }
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft: {e}"))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .map_err(|e| format!("nft stdin: {e}"))?;
    let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft ({}) failed: {}\nscript:\n{script}",
            netns.unwrap_or("host"),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Ok if nftables can be used here (installed, and we may change rules); else why not.
pub fn nft_usable() -> Result<(), String> {
    run(&["nft", "list", "tables"])
}

static SEQ: AtomicU32 = AtomicU32::new(0);

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// An nftables table that drops UDP (only UDP: the TCP side channel stays up, so the peer
/// looks alive). Deleted on drop.
pub struct UdpBlackHole {
    netns: Option<String>,
    table: String,
}

impl UdpBlackHole {
    /// Drops UDP datagrams arriving for `ports` (on the host: loopback traffic).
    pub fn ports(ports: &[u16]) -> Result<UdpBlackHole, String> {
        let mut ports = ports.to_vec();
        ports.sort_unstable();
        ports.dedup();
        let set: Vec<String> = ports.iter().map(u16::to_string).collect();
        let table = unique("rdmx_bh_");
        nft(
            None,
            &format!(
                "table inet {table} {{\n  chain input {{\n    type filter hook input priority -10; policy accept;\n    udp dport {{ {} }} drop\n  }}\n}}\n",
                set.join(", ")
            ),
        )?;
        Ok(UdpBlackHole { netns: None, table })
    }

    /// Drops every UDP datagram in and out of namespace `ns`.
    pub fn namespace(ns: &str) -> Result<UdpBlackHole, String> {
        let table = unique("rdmx_bh_");
        nft(
            Some(ns),
            &format!(
                "table inet {table} {{\n  chain input {{\n    type filter hook input priority -10; policy accept;\n    meta l4proto udp drop\n  }}\n  chain output {{\n    type filter hook output priority -10; policy accept;\n    meta l4proto udp drop\n  }}\n}}\n"
            ),
        )?;
        Ok(UdpBlackHole {
            netns: Some(ns.to_owned()),
            table,
        })
    }
}

impl Drop for UdpBlackHole {
    fn drop(&mut self) {
        if let Err(e) = nft(
            self.netns.as_deref(),
            &format!("delete table inet {}\n", self.table),
        ) {
            eprintln!("warning: removing black hole: {e}");
        }
    }
}

// ------------------------------------------------------------------------------------------
// Network namespaces

/// Two network namespaces joined by a veth pair, `a` = 10.X.Y.1/24, `b` = 10.X.Y.2/24 (a
/// random /24), loopbacks up. Deleted on drop.
pub struct NetnsPair {
    pub a: String,
    pub b: String,
    pub ip_a: Ipv4Addr,
    pub ip_b: Ipv4Addr,
    pub veth_a: String,
    pub veth_b: String,
    created: Vec<String>,
}

impl NetnsPair {
    /// Creates the pair; Err(why) when this machine does not allow it (callers skip).
    pub fn create() -> Result<NetnsPair, String> {
        remove_stale_namespaces();
        let pid = std::process::id();
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let r = random_u32();
        let (x, y) = ((r >> 8) as u8, r as u8);
        let mut p = NetnsPair {
            a: format!("rdmxt-{pid}-{n}-a"),
            b: format!("rdmxt-{pid}-{n}-b"),
            ip_a: Ipv4Addr::new(10, x, y, 1),
            ip_b: Ipv4Addr::new(10, x, y, 2),
            veth_a: format!("rxa{pid}{n}"),
            veth_b: format!("rxb{pid}{n}"),
            created: Vec::new(),
        };
        if p.veth_a.len() > 15 {
            p.veth_a = format!("rxa{}", r & 0xFFFFFF);
            p.veth_b = format!("rxb{}", r & 0xFFFFFF);
        }
        run(&["ip", "netns", "add", &p.a])?;
        p.created.push(p.a.clone());
        run(&["ip", "netns", "add", &p.b])?;
        p.created.push(p.b.clone());
        run(&[
            "ip", "link", "add", &p.veth_a, "netns", &p.a, "type", "veth", "peer", "name",
            &p.veth_b, "netns", &p.b,
        ])?;
        for (ns, dev, ip) in [(&p.a, &p.veth_a, p.ip_a), (&p.b, &p.veth_b, p.ip_b)] {
            run(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                dev,
            ])?;
            run(&["ip", "-n", ns, "link", "set", dev, "up"])?;
            run(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        // Bounded wait for the veth to carry traffic (carrier up on both ends).
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let up = [(&p.a, &p.veth_a), (&p.b, &p.veth_b)]
                .iter()
                .all(|(ns, dev)| {
                    Command::new("ip")
                        .args(["-n", ns, "-o", "link", "show", dev])
                        .output()
                        .map(|o| {
                            let s = String::from_utf8_lossy(&o.stdout).into_owned();
                            s.contains("LOWER_UP") && !s.contains("NO-CARRIER")
                        })
                        .unwrap_or(false)
                });
            if up {
                break;
            }
            if Instant::now() > end {
                return Err("veth pair did not come up within 5 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(p)
    }

    /// The pair as one line, for [`NETNS_ENV`].
    pub fn encode(&self) -> String {
        format!(
            "{} {} {} {} {} {}",
            self.a, self.b, self.ip_a, self.ip_b, self.veth_a, self.veth_b
        )
    }

    /// The pair a rerun was given in [`NETNS_ENV`] (owned by the process that made it:
    /// not deleted on drop).
    pub fn from_env() -> Option<NetnsPair> {
        let v = std::env::var(NETNS_ENV).ok()?;
        let f: Vec<&str> = v.split_whitespace().collect();
        let [a, b, ip_a, ip_b, veth_a, veth_b] = f[..] else {
            panic!("{NETNS_ENV}={v}: want 'a b ip_a ip_b veth_a veth_b'");
        };
        Some(NetnsPair {
            a: a.into(),
            b: b.into(),
            ip_a: ip_a.parse().expect("ip_a"),
            ip_b: ip_b.parse().expect("ip_b"),
            veth_a: veth_a.into(),
            veth_b: veth_b.into(),
            created: Vec::new(),
        })
    }

    /// Sets `ns`'s veth end up or down.
    pub fn set_link(&self, ns: &str, up: bool) -> Result<(), String> {
        let dev = if ns == self.a {
            &self.veth_a
        } else {
            &self.veth_b
        };
        run(&[
            "ip",
            "-n",
            ns,
            "link",
            "set",
            dev,
            if up { "up" } else { "down" },
        ])
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        for ns in self.created.drain(..).rev() {
            if let Err(e) = run(&["ip", "netns", "del", &ns]) {
                eprintln!("warning: {e}");
            }
        }
    }
}

/// Deletes `rdmxt-<pid>-*` namespaces left behind by test processes that no longer exist
/// (a run killed before its guards ran).
fn remove_stale_namespaces() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix("rdmxt-") else {
            continue;
        };
        let Some(pid) = rest.split('-').next() else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run(&["ip", "netns", "del", name]);
        }
    }
}

/// Runs `f` on a new thread that first joins network namespace `ns` (None: stays in this
/// one). Sockets `f` creates, and threads it starts, live in that namespace; this thread is
/// unaffected. A panic in `f` is re-raised here.
pub fn in_netns<T: Send>(ns: Option<&str>, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        let h = s.spawn(move || {
            if let Some(ns) = ns {
                let f = std::fs::File::open(format!("/var/run/netns/{ns}"))
                    .unwrap_or_else(|e| panic!("open netns {ns}: {e}"));
                // SAFETY: setns on a valid namespace fd; affects only this thread.
                let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(r, 0, "setns {ns}: {}", std::io::Error::last_os_error());
            }
            f()
        });
        match h.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        }
    })
}

/// A random u32 from the kernel (getrandom), falling back to the clock.
pub fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: writes at most 4 bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    if n == 4 {
        u32::from_ne_bytes(b)
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ std::process::id())
            .unwrap_or(0x5eed)
    }
}

/// Takes one end of a [`NetnsPair`]'s veth down; back up on drop.
pub struct LinkDown<'a> {
    pair: &'a NetnsPair,
    ns: String,
}

impl<'a> LinkDown<'a> {
    pub fn new(pair: &'a NetnsPair, ns: &str) -> Result<LinkDown<'a>, String> {
        pair.set_link(ns, false)?;
        Ok(LinkDown {
            pair,
            ns: ns.to_owned(),
        })
    }
}

impl Drop for LinkDown<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.pair.set_link(&self.ns, true) {
            eprintln!("warning: {e}");
        }
    }
}

/// The lines a child process writes to `out`, as they come, from a thread of their own
/// (ends at EOF or when the receiver is dropped).
pub fn line_reader(out: std::process::ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

//! `rdmx-perf server --max-conns N` (issue 27): connection N+1 is closed at once, counted
//! and logged at warn; a served connection that ends frees its place; RDMX_LOG=info logs
//! each connection served. Every wait is bounded; the server is killed on drop.

use rdmx::config::Config;
use rdmx::msgr::{Connection, Context};
use rdmx::provider::Wc;
use rdmx::rc::verbs::access;
use rdmx::rc::{QpState, Sge, WcStatus, smallvec};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
/// The ready message's immediate (`perf::READY_IMM`, "RDYR").
const READY_IMM: u32 = 0x5244_5952;

struct Server {
    child: Child,
    addr: String,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server(extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rdmx-perf"))
        .args([
            "server",
            "--listen",
            "127.0.0.1:0",
            "--set",
            "max_recv_wr=16",
        ])
        .args(extra)
        .env("RDMX_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&stderr);
    let mut err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = err.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = out.read_to_end(&mut sink);
    });
    let addr = line
        .split("listening on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    Server {
        child,
        addr,
        stderr,
    }
}

/// A client connection with one receive posted for the server's ready message.
struct Client {
    conn: Connection,
    _ctx: Context,
    _buf: Vec<u8>,
}

fn client(addr: &str) -> Client {
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    let ctx = Context::new(&c).unwrap();
    let mut buf = vec![0u8; 64];
    // SAFETY: `buf` lives in the client with the context and the connection.
    let mr = unsafe { ctx.register(buf.as_mut_ptr(), buf.len(), access::LOCAL_WRITE) }.unwrap();
    let conn = ctx.connect(addr, T).unwrap();
    conn.post_recv(&[(
        1,
        smallvec![Sge {
            addr: mr.addr,
            length: 64,
            lkey: mr.lkey,
        }],
    )])
    .unwrap();
    Client {
        conn,
        _ctx: ctx,
        _buf: buf,
    }
}

impl Client {
    /// Whether the server served this connection (its ready message came) or closed it.
    fn served(&self) -> bool {
        let mut wcs = [Wc::EMPTY; 4];
        let end = Instant::now() + T;
        loop {
            let n = self.conn.poll(&mut wcs);
            if n > 0 {
                return wcs[0].status == WcStatus::Success && wcs[0].imm == Some(READY_IMM);
            }
            if self.conn.qp_state() == QpState::Err {
                return false;
            }
            assert!(Instant::now() < end, "neither served nor closed");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn wait_for(s: &Server, what: &str) {
    let end = Instant::now() + T;
    while !s.stderr.lock().unwrap().contains(what) {
        assert!(
            Instant::now() < end,
            "no '{what}' in:\n{}",
            s.stderr.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn connections_beyond_max_conns_are_refused_and_logged() {
    let s = server(&["--max-conns", "2"]);
    let a = client(&s.addr);
    let b = client(&s.addr);
    assert!(a.served() && b.served());
    let c = client(&s.addr);
    assert!(
        !c.served(),
        "a third connection was served with --max-conns 2"
    );
    wait_for(
        &s,
        "refused: 2 connections served already (--max-conns); 1 refused so far",
    );
    wait_for(&s, "rdmx-perf server: connection 1 from 127.0.0.1:");
    // One served connection ends: its place is free again.
    drop(a);
    wait_for(&s, " done: ");
    let end = Instant::now() + T;
    loop {
        let d = client(&s.addr);
        if d.served() {
            break;
        }
        // The server may not have seen the first connection end yet.
        assert!(
            Instant::now() < end,
            "no place freed:\n{}",
            s.stderr.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop((b, c));
}

#[test]
fn max_conns_zero_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_rdmx-perf"))
        .args(["server", "--listen", "127.0.0.1:0", "--max-conns", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--max-conns: must be at least 1"), "{err}");
}

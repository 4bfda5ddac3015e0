//! An authorized client beside an attack (issue 27 point 8; bench/auth.sh runs it): an
//! rdmx-target (in this process, `auth` required) serves a 64 MiB memory volume; each round
//! measures, once quiet and once under attack (order alternating by round), the time a
//! keyholder takes to open the volume (median of OPENS fresh sessions) and its 4 KiB
//! random-read IOPS at queue depth 32 for SECS seconds. The attack runs in a child process
//! (this program with `--attack`), kept up for the whole phase: SILENT TCP connections that
//! never send a byte, from 16 loopback source addresses (each dropped one is opened again),
//! and a slow consumer (an authenticated session that sends 512 KiB reads and never drains a
//! reply). Prints per-round figures, the CPU time each process used in the phase (so the
//! attacker's own share of the cores is visible), the medians and the ratios.
//!
//! Usage: `target_under_attack [ROUNDS [SECS [SILENT [OPENS]]]]` (default 3 5 500 20).
//! With `PIN=1` the target and the keyholder run on CPU 0 and the attacker on CPU 1, in
//! both phases: the attacker then spends its own core, as it would on another host, and
//! the ratio is what the attack costs the target.

use rdmx::blk::proto::{MSG_REQ, Op, ReqHdr};
use rdmx::blk::target::{Limits, Target, TargetOptions, VolumeSpec};
use rdmx::blk::{BlkClient, Completion, Mode, Req};
use rdmx::config::Config;
use rdmx::msgr::messenger::{Dispatcher, InMessage, Messenger, OutMessage, Policy, SessionId};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEY_GOOD: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const KEY_SLOW: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";
const T: Duration = Duration::from_secs(10);
const VOL_BYTES: u64 = 64 << 20;

fn keyring(dir: &std::path::Path, name: &str, entries: &[(&str, &str)]) -> String {
    let p = dir.join(name);
    let text: String = entries
        .iter()
        .map(|(e, k)| format!("[{e}]\n    key = {k}\n"))
        .collect();
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.to_str().unwrap().to_string()
}

fn config(ring: &str, entity: &str) -> Config {
    let mut c = Config::new();
    c.set("auth_keyring", ring).unwrap();
    c.set("auth_entity", entity).unwrap();
    c
}

/// A TCP connection to `to` from `from` that never sends (None when refused at once).
fn silent_one(from: Ipv4Addr, to: SocketAddr) -> Option<TcpStream> {
    // SAFETY: plain socket calls on a socket this function owns; results checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a new socket owned by nothing else.
    let s = unsafe { TcpStream::from_raw_fd(fd) };
    let sa = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    };
    let SocketAddr::V4(to) = to else { return None };
    let (src, dst) = (sa(from, 0), sa(*to.ip(), to.port()));
    let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
    // SAFETY: valid sockaddr_in values of the given length.
    let ok = unsafe {
        libc::bind(fd, std::ptr::from_ref(&src).cast(), len) == 0
            && libc::connect(fd, std::ptr::from_ref(&dst).cast(), len) == 0
    };
    ok.then_some(s)
}

/// Keeps `n` silent connections open until `stop` (the target drops each at its
/// first-bytes deadline or refuses it at its caps: it is opened again).
fn silent_attack(to: SocketAddr, n: usize, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut held: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        let mut opened = 0u64;
        while !stop.load(Ordering::Relaxed) {
            for (i, slot) in held.iter_mut().enumerate() {
                let dead = match slot {
                    None => true,
                    Some(s) => {
                        let mut b = [0u8; 64];
                        s.set_nonblocking(true).ok();
                        // EOF, a refusal frame or a reset: gone; WouldBlock: still held.
                        !matches!(
                            std::io::Read::read(s, &mut b),
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
                        )
                    }
                };
                if dead {
                    let from = Ipv4Addr::new(127, 0, 9, 2 + (i % 16) as u8);
                    *slot = silent_one(from, to);
                    opened += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        opened
    })
}

/// Holds every reply and never drains one.
struct Hoard(Mutex<Vec<InMessage>>, AtomicU64);
impl Dispatcher for Hoard {
    fn on_message(&self, _m: &Messenger, _s: SessionId, msg: InMessage) {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.lock().unwrap().push(msg);
    }
}

fn req(op: Op, id: u64, offset: u64, len: u32, name: &[u8]) -> Vec<u8> {
    ReqHdr {
        op: op as u8,
        vol: 0,
        req_id: id,
        offset,
        len,
        place: None,
        imm_reply: false,
        name: name.to_vec(),
    }
    .encode()
}

/// A slow consumer as client.slow until `stop`: 512 KiB reads as fast as its session
/// takes them; replies are kept, never released. When the target closes the session (over
/// its deferral bounds) it opens another. Returns the reads sent and the sessions used.
fn slow_consumer(
    addr: String,
    ring: String,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(u64, u64)> {
    std::thread::spawn(move || {
        let (mut sent, mut sessions) = (0u64, 0u64);
        let mut mc = config(&ring, "client.slow");
        rdmx::blk::apply_defaults(&mut mc).unwrap();
        while !stop.load(Ordering::Relaxed) {
            let hoard = Arc::new(Hoard(Mutex::new(Vec::new()), AtomicU64::new(0)));
            let m = Messenger::new(&mc, hoard.clone()).unwrap();
            let Ok(s) = m.connect(&addr, Policy::Lossy) else {
                continue;
            };
            sessions += 1;
            if m.send(s, OutMessage::new(MSG_REQ, req(Op::Open, 0, 0, 0, b"m0")))
                .is_err()
            {
                continue;
            }
            while !stop.load(Ordering::Relaxed) {
                let off = (sent % 120) << 19;
                match m.send(
                    s,
                    OutMessage::new(MSG_REQ, req(Op::Read, sent + 1, off, 512 << 10, b"")),
                ) {
                    Ok(_) => sent += 1,
                    Err(r) if r.kind() == rdmx::ErrorKind::Full => {
                        let _ = m.poll(Duration::from_millis(5));
                    }
                    Err(_) => break,
                }
                if sent % 16 == 0 {
                    let _ = m.poll(Duration::ZERO);
                }
            }
        }
        (sent, sessions)
    })
}

/// Median time of `n` opens of m0 by client.good (each session closed before the next).
fn open_time(addr: &str, cfg: &Config, n: usize) -> f64 {
    let mut v: Vec<f64> = (0..n)
        .map(|_| {
            let t0 = Instant::now();
            let c = BlkClient::open(cfg, addr, "m0", Mode::Rpc, T).expect("open");
            let us = t0.elapsed().as_secs_f64() * 1e6;
            drop(c);
            us
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[n / 2]
}

/// 4 KiB random reads at queue depth 32 for `secs`: IOPS (errors abort).
fn iops(addr: &str, cfg: &Config, secs: u64) -> f64 {
    const QD: usize = 32;
    let mut c = BlkClient::open(cfg, addr, "m0", Mode::Rpc, T).expect("open");
    let mut bufs = vec![0u8; QD * 4096];
    let base = bufs.as_mut_ptr();
    let mut free: Vec<usize> = (0..QD).collect();
    let mut out: Vec<Completion> = Vec::with_capacity(QD);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let (mut done, t0) = (0u64, Instant::now());
    let end = t0 + Duration::from_secs(secs);
    while Instant::now() < end {
        let reqs: Vec<Req> = free
            .drain(..)
            .map(|slot| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                Req {
                    op: Op::Read,
                    offset: (rng % (VOL_BYTES / 4096)) * 4096,
                    len: 4096,
                    // SAFETY: inside `bufs` (slot < QD).
                    buf: unsafe { base.add(slot * 4096) },
                    cookie: slot as u64,
                }
            })
            .collect();
        // SAFETY: each slot's 4 KiB of `bufs` is used by one request at a time and
        // `bufs` outlives the client (dropped first, below).
        let took = unsafe { c.submit(&reqs) }.expect("submit");
        for r in &reqs[took..] {
            free.push(r.cookie as usize);
        }
        out.clear();
        c.poll(&mut out, 1, QD, Duration::from_millis(100))
            .expect("poll");
        for x in &out {
            assert_eq!(x.status, 0, "read failed");
            free.push(x.cookie as usize);
            done += 1;
        }
    }
    let r = done as f64 / t0.elapsed().as_secs_f64();
    drop(c);
    drop(bufs);
    r
}

/// CPU seconds (user + system) this process has used so far.
fn cpu_self() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Pins the calling process (all its later threads) to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` < CPU_SETSIZE for the CPUs this is called with (0 and 1).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is this thread; the set is valid for its size.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    assert_eq!(r, 0, "sched_setaffinity to CPU {cpu} failed");
}

/// The attacker's side (`--attack ADDR SLOW_RING SILENT`): runs until its stdin closes,
/// then prints `silent_connects reads sessions cpu_seconds` and exits.
fn attacker(args: &[String]) {
    let (addr, ring, silent) = (args[0].clone(), args[1].clone(), args[2].parse().unwrap());
    if std::env::var("PIN").as_deref() == Ok("1") {
        pin(1);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let a = silent_attack(addr.parse().unwrap(), silent, Arc::clone(&stop));
    let s = slow_consumer(addr, ring, Arc::clone(&stop));
    println!("ready");
    let mut b = [0u8; 1];
    while matches!(std::io::Read::read(&mut std::io::stdin(), &mut b), Ok(n) if n > 0) {}
    stop.store(true, Ordering::Relaxed);
    let (opened, (reads, sessions)) = (a.join().unwrap(), s.join().unwrap());
    println!("{opened} {reads} {sessions} {:.3}", cpu_self());
}

/// The attack as a child process, started and brought to its steady state.
struct Attack {
    t0: Instant,
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Attack {
    fn start(addr: &str, ring: &str, silent: usize) -> Attack {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let t0 = Instant::now();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--attack", addr, ring, &silent.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("attacker process");
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "attacker did not start");
        // Let the attack reach its steady state (every silent slot taken, the slow
        // consumer's session stalled).
        std::thread::sleep(Duration::from_secs(2));
        Attack { t0, child, out }
    }

    /// Stops the attack: (silent connects, slow reads, slow sessions, attacker cores
    /// used on average since it started).
    fn stop(mut self) -> (u64, u64, u64, f64) {
        use std::io::BufRead;
        drop(self.child.stdin.take());
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        self.child.wait().unwrap();
        let v: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(v.len(), 4, "attacker said {line:?}");
        (
            v[0].parse().unwrap(),
            v[1].parse().unwrap(),
            v[2].parse().unwrap(),
            v[3].parse::<f64>().unwrap() / self.t0.elapsed().as_secs_f64(),
        )
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("--attack") {
        attacker(&argv[2..]);
        return;
    }
    let pinned = std::env::var("PIN").as_deref() == Ok("1");
    if pinned {
        pin(0);
    }
    let arg = |i: usize, d: u64| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(d)
    };
    let (rounds, secs, silent, opens) = (arg(1, 3), arg(2, 5), arg(3, 500) as usize, arg(4, 20));
    let dir = std::env::temp_dir().join(format!("rdmx-attack-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let server_ring = keyring(
        &dir,
        "server",
        &[("client.good", KEY_GOOD), ("client.slow", KEY_SLOW)],
    );
    let good_ring = keyring(&dir, "good", &[("client.good", KEY_GOOD)]);
    let slow_ring = keyring(&dir, "slow", &[("client.slow", KEY_SLOW)]);
    let specs: Vec<VolumeSpec> = vec!["m0=mem:64M".parse().unwrap()];
    let opts = TargetOptions {
        allow: vec![],
        limits: Limits::default(),
    };
    let t = Target::start_with(&config(&server_ring, "osd.0"), "127.0.0.1:0", &specs, &opts)
        .expect("target");
    let addr = t.addr().to_string();
    let good = config(&good_ring, "client.good");
    let (mut quiet_open, mut quiet_iops, mut atk_open, mut atk_iops) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let order = if r % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for attack in order {
            let attackers = attack.then(|| Attack::start(&addr, &slow_ring, silent));
            let (wall0, cpu0) = (Instant::now(), cpu_self());
            let o = open_time(&addr, &good, opens as usize);
            let i = iops(&addr, &good, secs);
            let (wall, cpu) = (wall0.elapsed().as_secs_f64(), cpu_self() - cpu0);
            let what = if let Some(a) = attackers {
                let (opened, reads, sessions, acpu) = a.stop();
                atk_open.push(o);
                atk_iops.push(i);
                format!(
                    "attack ({silent} silent, {opened} silent connects, slow consumer: \
                     {reads} reads in {sessions} sessions; attacker {acpu:.2} cores)"
                )
            } else {
                quiet_open.push(o);
                quiet_iops.push(i);
                "quiet".to_string()
            };
            println!(
                "round {r} {what}: open median {o:.0} us, 4K randread QD32 {i:.0} IOPS; \
                 target+keyholder CPU {:.2} cores over {wall:.1} s",
                cpu / wall
            );
        }
    }
    let (qo, qi, ao, ai) = (
        median(&mut quiet_open),
        median(&mut quiet_iops),
        median(&mut atk_open),
        median(&mut atk_iops),
    );
    println!(
        "medians{}: open quiet {qo:.0} us, under attack {ao:.0} us (target <= 100,000 us); \
         IOPS quiet {qi:.0}, under attack {ai:.0}; ratio {:.3}",
        if pinned {
            " (PIN=1: attacker on CPU 1, target and keyholder on CPU 0)"
        } else {
            ""
        },
        ai / qi
    );
    let st = t.stats();
    println!("target: {st:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

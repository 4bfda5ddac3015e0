//! A listener's unauthenticated connections: the [`server`](super::server) state machine
//! driven from the accepting thread over non-blocking sockets registered in one epoll set,
//! so that a connection costs an fd and a few hundred bytes until its peer authenticated
//! (no thread, no QP), with the bounds of [`Limits`]: a deadline for each auth frame
//! (`handshake_first_bytes_ms`), and caps per source address and in total. Every refusal
//! is counted ([`GateStats`]) and logged at warn level, rate-limited.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::server::{ServerHandshake, Step};
use super::{AuthConfig, Authenticated, proto};
use crate::error::{Error, ErrorKind, Result};

/// A listener's handshake counters (shared with its stats readers).
#[derive(Debug, Default)]
pub struct GateStats {
    /// Peers that failed authentication (wrong key, unknown entity, no or unwanted
    /// authentication, replay, reflection).
    pub auth_failures: AtomicU64,
    /// Connections refused by a handshake limit (per source, total) or for a malformed
    /// auth frame.
    pub refused: AtomicU64,
    /// Connections dropped for not sending an auth frame in time.
    pub timed_out: AtomicU64,
    /// Connections that passed (authenticated, or auth=none).
    pub passed: AtomicU64,
    /// Handshake threads that panicked (caught: the handshake failed, its slot freed).
    pub panics: AtomicU64,
}

/// A snapshot of [`GateStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HandshakeCounters {
    pub auth_failures: u64,
    pub refused: u64,
    pub timed_out: u64,
    pub passed: u64,
    /// Handshake threads that panicked (caught: the handshake failed, its slot freed).
    pub panics: u64,
}

impl GateStats {
    pub fn snapshot(&self) -> HandshakeCounters {
        HandshakeCounters {
            auth_failures: self.auth_failures.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            passed: self.passed.load(Ordering::Relaxed),
            panics: self.panics.load(Ordering::Relaxed),
        }
    }
}

struct Waiting {
    tcp: TcpStream,
    peer: SocketAddr,
    hs: ServerHandshake,
    /// When its next frame is due.
    deadline: Instant,
}

/// Warn lines per second before the rest are only counted (and summed in the next line).
const LOG_PER_SEC: u32 = 10;

/// Rate limit of warn lines (a flood of refusals must not become a flood of log lines).
#[derive(Debug)]
pub(crate) struct LogLimit {
    window: Instant,
    lines: u32,
    suppressed: u64,
}

impl LogLimit {
    pub(crate) fn new() -> LogLimit {
        LogLimit {
            window: Instant::now(),
            lines: 0,
            suppressed: 0,
        }
    }

    /// Whether a line may go out now, and how many were suppressed before it.
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        if now.saturating_duration_since(self.window) >= Duration::from_secs(1) {
            self.window = now;
            self.lines = 0;
        }
        if self.lines >= LOG_PER_SEC {
            self.suppressed += 1;
            return None;
        }
        self.lines += 1;
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// The unauthenticated connections of one listener.
pub struct Gate {
    cfg: Arc<AuthConfig>,
    epoll: OwnedFd,
    conns: HashMap<u64, Waiting>,
    per_source: HashMap<IpAddr, usize>,
    next: u64,
    /// Connections that passed in `admit` (their first frame was already in), for the
    /// next `drive`.
    ready: Vec<Passed>,
    pub stats: Arc<GateStats>,
    log: LogLimit,
    local: String,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("waiting", &self.conns.len())
            .finish()
    }
}

/// A connection that passed the gate: set it up (QP, tagged hellos) next.
pub struct Passed {
    pub tcp: TcpStream,
    pub peer: SocketAddr,
    pub auth: Authenticated,
}

impl Gate {
    pub fn new(cfg: Arc<AuthConfig>, local: SocketAddr) -> Result<Gate> {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(Error::new(
                ErrorKind::Io,
                format!("listen: epoll_create1: {}", std::io::Error::last_os_error()),
            ));
        }
        // SAFETY: `fd` is a new epoll fd owned by nothing else.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Gate {
            cfg,
            epoll,
            conns: HashMap::new(),
            per_source: HashMap::new(),
            next: 0,
            ready: Vec::new(),
            stats: Arc::default(),
            log: LogLimit::new(),
            local: local.to_string(),
        })
    }

    /// Readable when a waiting connection has bytes (for the accepting thread's poll).
    pub fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// Connections waiting for their peer's next auth frame.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// The earliest deadline of a waiting connection.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.conns.values().map(|w| w.deadline).min()
    }

    /// A warn line, at most [`LOG_PER_SEC`] a second (the rest counted into the next).
    fn warn(&mut self, now: Instant, line: String) {
        if let Some(suppressed) = self.log.allow(now) {
            let local = &self.local;
            if suppressed > 0 {
                log::warn!(target: "rdmx::auth", "listener {local}: {line} ({suppressed} similar lines suppressed)");
            } else {
                log::warn!(target: "rdmx::auth", "listener {local}: {line}");
            }
        }
    }

    /// Takes a new TCP connection, or refuses it when a limit is reached: `others` is the
    /// number of this listener's handshakes past the gate (set-ups running or not yet
    /// accepted), which count towards `handshake_max`.
    pub fn admit(&mut self, tcp: TcpStream, peer: SocketAddr, others: usize, now: Instant) {
        let l = self.cfg.limits;
        let ip = peer.ip().to_canonical();
        let from_ip = self.per_source.get(&ip).copied().unwrap_or(0);
        let refusal = if from_ip >= l.per_source {
            Some(format!(
                "{from_ip} unauthenticated handshakes from {ip} (handshake_per_source)"
            ))
        } else if self.conns.len() + others >= l.max {
            // At the total cap a newcomer takes the place of the oldest unauthenticated
            // handshake of the source holding the most: silent connections from many
            // addresses would otherwise keep every keyholder out until their deadlines,
            // and the attacker's source is the one that holds the most.
            match self.eviction_victim(ip) {
                Some(victim) => {
                    if let Some(w) = self.remove(victim) {
                        self.stats.refused.fetch_add(1, Ordering::Relaxed);
                        self.warn(
                            now,
                            format!(
                                "dropped {}: the oldest unauthenticated handshake of the \
                                 busiest source, to admit {peer} (handshake_max {})",
                                w.peer, l.max
                            ),
                        );
                    }
                    None
                }
                None => Some(format!(
                    "{} handshakes in progress (handshake_max)",
                    self.conns.len() + others
                )),
            }
        } else {
            None
        };
        if let Some(why) = refusal {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            self.warn(now, format!("refused {peer}: {why}"));
            let mut tcp = tcp;
            let _ = tcp.set_nonblocking(true);
            let f = proto::Frame::Refuse(proto::RefuseCode::Busy, why).encode();
            let _ = tcp.write(&f);
            return;
        }
        if tcp.set_nonblocking(true).is_err() {
            return;
        }
        tcp.set_nodelay(true).ok();
        let id = self.next;
        self.next += 1;
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            u64: id,
        };
        // SAFETY: both fds are open; `ev` is a valid epoll_event.
        let r = unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                tcp.as_raw_fd(),
                &mut ev,
            )
        };
        if r != 0 {
            log::debug!(target: "rdmx::auth", "epoll_ctl: {}", std::io::Error::last_os_error());
            return;
        }
        *self.per_source.entry(ip).or_default() += 1;
        self.conns.insert(
            id,
            Waiting {
                tcp,
                peer,
                hs: ServerHandshake::new(),
                deadline: now + l.first_bytes.min(l.timeout),
            },
        );
        // A client writes its first frame right after connecting: it is usually here
        // already. Taking it now keeps a burst of legitimate connections from one address
        // (a client opening many sessions) from counting against the per-source cap.
        let mut passed = std::mem::take(&mut self.ready);
        self.step(id, now, &mut passed);
        self.ready = passed;
    }

    /// The handshake to drop for a newcomer from `newcomer` at the total cap: the oldest
    /// of the source with the most waiting (None when nothing waits, or when that source
    /// is the newcomer's own and holds only one).
    fn eviction_victim(&self, newcomer: IpAddr) -> Option<u64> {
        let (&busiest, &n) = self.per_source.iter().max_by_key(|(_, n)| **n)?;
        if busiest == newcomer && n <= 1 {
            return None;
        }
        self.conns
            .iter()
            .filter(|(_, w)| w.peer.ip().to_canonical() == busiest)
            .map(|(id, _)| *id)
            .min()
    }

    fn remove(&mut self, id: u64) -> Option<Waiting> {
        let w = self.conns.remove(&id)?;
        // SAFETY: both fds are open; a NULL event is allowed for EPOLL_CTL_DEL.
        unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                w.tcp.as_raw_fd(),
                std::ptr::null_mut(),
            );
        }
        let ip = w.peer.ip().to_canonical();
        if let Some(n) = self.per_source.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&ip);
            }
        }
        Some(w)
    }

    /// Reads what arrived, advances the handshakes, drops the late ones; returns the
    /// connections that passed (blocking again, ready for their set-up).
    pub fn drive(&mut self, now: Instant) -> Vec<Passed> {
        let mut passed = std::mem::take(&mut self.ready);
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 64];
        // SAFETY: `events` is a valid buffer of 64 epoll_event; timeout 0 = no wait.
        let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), events.as_mut_ptr(), 64, 0) };
        for ev in events.iter().take(n.max(0) as usize) {
            let id = ev.u64;
            self.step(id, now, &mut passed);
        }
        if self.next_deadline().is_some_and(|d| d <= now) {
            let late: Vec<u64> = self
                .conns
                .iter()
                .filter(|(_, w)| w.deadline <= now)
                .map(|(&id, _)| id)
                .collect();
            for id in late {
                if let Some(w) = self.remove(id) {
                    self.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                    let claimed = w.hs.claimed().unwrap_or("(none yet)").to_string();
                    let line = format!(
                        "dropped {}: no auth frame within {:?} (claimed entity {claimed})",
                        w.peer, self.cfg.limits.first_bytes
                    );
                    self.warn(now, line);
                }
            }
        }
        passed
    }

    fn step(&mut self, id: u64, now: Instant, passed: &mut Vec<Passed>) {
        let mut buf = [0u8; proto::MAX_FRAME];
        let issued: Vec<[u8; proto::N]> = self
            .conns
            .iter()
            .filter(|&(&other, _)| other != id)
            .filter_map(|(_, w)| w.hs.issued_nonce())
            .collect();
        let Some(w) = self.conns.get_mut(&id) else {
            return;
        };
        let mut got = Vec::new();
        let mut eof = false;
        loop {
            match w.tcp.read(&mut buf) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(k) => {
                    got.extend_from_slice(&buf[..k]);
                    if got.len() > 2 * proto::MAX_FRAME {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    eof = true;
                    break;
                }
            }
        }
        let step = if got.is_empty() {
            None
        } else {
            let cfg = Arc::clone(&self.cfg);
            Some(w.hs.on_bytes(&got, &cfg, &|n| issued.contains(n)))
        };
        match step {
            Some(Step::Wait(send)) if !eof => {
                if !send.is_empty() && w.tcp.write_all(&send).is_err() {
                    self.remove(id);
                    return;
                }
                w.deadline = now + self.cfg.limits.first_bytes.min(self.cfg.limits.timeout);
            }
            Some(Step::Done(send, auth)) if !eof => {
                let Some(w) = self.remove(id) else { return };
                let mut tcp = w.tcp;
                if tcp.write_all(&send).is_err() || tcp.set_nonblocking(false).is_err() {
                    return;
                }
                self.stats.passed.fetch_add(1, Ordering::Relaxed);
                passed.push(Passed {
                    tcp,
                    peer: w.peer,
                    auth,
                });
            }
            Some(Step::Fail {
                send,
                reason,
                entity,
                protocol,
            }) => {
                let Some(mut w) = self.remove(id) else { return };
                let _ = w.tcp.write(&send);
                let claimed = entity.as_deref().unwrap_or("(none)");
                if protocol {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    self.warn(
                        now,
                        format!("refused {}: {reason} (claimed entity {claimed})", w.peer),
                    );
                } else {
                    self.stats.auth_failures.fetch_add(1, Ordering::Relaxed);
                    self.warn(
                        now,
                        format!(
                            "authentication failed for {} claiming entity {claimed}: {reason}",
                            w.peer
                        ),
                    );
                }
            }
            _ => {
                // EOF (the peer left mid-handshake) or nothing read: drop on EOF.
                if eof {
                    self.remove(id);
                }
            }
        }
    }
}

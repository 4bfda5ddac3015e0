//! Listener and connection: TCP side channel setup (QP numbers, PSNs, addresses, MTU,
//! rd_atomic limits, exposed regions), then RC traffic on the soft provider, with the TCP
//! connection kept open as the liveness signal (EOF = peer gone: every outstanding WR
//! completes with an error or a flush).

use crate::config::{CqLayout, PollMode, Progress};
use crate::error::{Error, ErrorKind, Result};
use crate::provider::soft::cq::{Cq, Wc};
use crate::provider::soft::device::ProgressStats;
use crate::provider::soft::qp::{Remote, SendReq, SoftQp, Timers};
use crate::provider::soft::sys::EventFd;
use crate::rc::verbs::{QpState, access};
use crate::rc::{Counters, QpCaps, SgeList};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::context::{Context, closed};
use super::setup::{self, Hello, Region};
use crate::provider::soft::mtu::PathMtu;

/// Handshake deadline once the TCP connection is up.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Accepts connections on a TCP address.
#[derive(Debug)]
pub struct Listener {
    ctx: Context,
    tcp: TcpListener,
}

/// One RC connection.
#[derive(Debug)]
pub struct Connection {
    ctx: Context,
    tcp: TcpStream,
    qp: Arc<SoftQp>,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
    channel: Arc<EventFd>,
    peer_regions: Vec<Region>,
    peer: SocketAddr,
    /// This side's offer (configured, link and active MTU) and the negotiated path MTU.
    mtu: (PathMtu, u32),
    closed: bool,
    /// `failure_note_c`'s text, made on first request.
    failure_c: std::sync::OnceLock<std::ffi::CString>,
}

fn resolve(addr: &str) -> Result<SocketAddr> {
    let mut it = addr.to_socket_addrs().map_err(|e| {
        Error::new(
            ErrorKind::InvalidArgument,
            format!("address '{addr}': {e} (expected HOST:PORT, e.g. 127.0.0.1:18515)"),
        )
    })?;
    it.next().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidArgument,
            format!("address '{addr}': resolves to no address"),
        )
    })
}

impl Context {
    /// Listens for connections on `addr` ("IP:PORT"; port 0 = any free port).
    pub fn listen(&self, addr: &str) -> Result<Listener> {
        let a = resolve(addr)?;
        let tcp = TcpListener::bind(a)
            .map_err(|e| Error::new(ErrorKind::Io, format!("listen on {a}: {e}")))?;
        Ok(Listener {
            ctx: self.clone(),
            tcp,
        })
    }

    /// Connects to a listener at `addr` within `timeout` and sets up the RC connection.
    pub fn connect(&self, addr: &str, timeout: Duration) -> Result<Connection> {
        let a = resolve(addr)?;
        let tcp = TcpStream::connect_timeout(&a, timeout).map_err(|e| {
            let kind = if e.kind() == std::io::ErrorKind::TimedOut {
                ErrorKind::Timeout
            } else {
                ErrorKind::Io
            };
            Error::new(kind, format!("connect to {a}: {e}"))
        })?;
        Connection::establish(self.clone(), tcp)
    }
}

impl Listener {
    pub fn local_addr(&self) -> SocketAddr {
        self.tcp
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// Waits up to `timeout` (None = forever) for a connection and sets it up.
    pub fn accept(&self, timeout: Option<Duration>) -> Result<Connection> {
        let tcp = match timeout {
            None => self.tcp.accept().map(|(s, _)| s),
            Some(t) => {
                let deadline = Instant::now() + t;
                self.tcp.set_nonblocking(true).ok();
                let r = loop {
                    match self.tcp.accept() {
                        Ok((s, _)) => break Ok(s),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            if Instant::now() >= deadline {
                                self.tcp.set_nonblocking(false).ok();
                                return Err(Error::new(
                                    ErrorKind::Timeout,
                                    format!(
                                        "accept on {}: no connection within {t:?}",
                                        self.local_addr()
                                    ),
                                ));
                            }
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        Err(e) => break Err(e),
                    }
                };
                self.tcp.set_nonblocking(false).ok();
                r
            }
        }
        .map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("accept on {}: {e}", self.local_addr()),
            )
        })?;
        tcp.set_nonblocking(false).ok();
        Connection::establish(self.ctx.clone(), tcp)
    }
}

impl Connection {
    fn establish(ctx: Context, mut tcp: TcpStream) -> Result<Connection> {
        let s = &ctx.shared.settings;
        tcp.set_nodelay(true).ok();
        let local_ip = tcp
            .local_addr()
            .map_err(|e| Error::new(ErrorKind::Io, format!("side channel: {e}")))?
            .ip()
            .to_canonical();
        let peer = tcp
            .peer_addr()
            .map_err(|e| Error::new(ErrorKind::Io, format!("side channel: {e}")))?;
        let channel = Arc::new(EventFd::new()?);
        let (send_cq, recv_cq) = match s.cq_layout() {
            CqLayout::Separate { send, recv } => (
                Arc::new(Cq::new(send as usize, Arc::clone(&channel))),
                Arc::new(Cq::new(recv as usize, Arc::clone(&channel))),
            ),
            CqLayout::Shared { size } => {
                let cq = Arc::new(Cq::new(size as usize, Arc::clone(&channel)));
                (Arc::clone(&cq), cq)
            }
        };
        let caps = QpCaps {
            max_send_wr: s.max_send_wr,
            max_recv_wr: s.max_recv_wr,
            max_send_sge: s.max_send_sge,
            max_recv_sge: s.max_recv_sge,
            sq_sig_all: false,
            max_unacked_psns: 128.max(s.max_send_wr),
        };
        let offer = setup::offered_path_mtu(&tcp, s.path_mtu.bytes())?;
        let dev = &ctx.shared.dev;
        let qp = dev.create_qp(caps, local_ip, Arc::clone(&send_cq), Arc::clone(&recv_cq))?;
        let result = (|| {
            let mine = Hello {
                version: setup::VERSION,
                flags: 0,
                qpn: qp.qpn(),
                psn: setup::random_psn(),
                udp: dev.udp_addr_for(local_ip).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Unsupported,
                        format!("soft provider: no UDP port for {local_ip}'s family on this host"),
                    )
                })?,
                path_mtu: offer.offered,
                max_rd_atomic: s.max_rd_atomic,
                max_dest_rd_atomic: s.max_dest_rd_atomic,
                credits: s.effective_credits(),
                regions: dev
                    .mrs()
                    .exposed()
                    .iter()
                    .map(|r| Region {
                        addr: r.addr,
                        len: r.len,
                        rkey: r.rkey,
                        access: r.access,
                    })
                    .collect(),
            };
            let theirs = setup::exchange(&mut tcp, &mine, HANDSHAKE)?;
            let n = setup::negotiate(&mine, &theirs, peer.ip())?;
            qp.connect(
                &Remote {
                    dest_qpn: n.dest_qpn,
                    peer_udp: n.peer_udp,
                    sq_psn: n.sq_psn,
                    rq_psn: n.rq_psn,
                    path_mtu: n.path_mtu,
                    max_rd_atomic: n.max_rd_atomic,
                    max_dest_rd_atomic: n.max_dest_rd_atomic,
                },
                &Timers {
                    timeout: s.timeout,
                    retry_cnt: s.retry_cnt,
                    rnr_retry: s.rnr_retry,
                    min_rnr_timer: s.min_rnr_timer,
                    access: access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ,
                },
            )?;
            Ok((n.peer_regions, theirs.path_mtu, n.path_mtu))
        })();
        let (peer_regions, peer_mtu, path_mtu) = match result {
            Ok(r) => r,
            Err(e) => {
                dev.destroy_qp(qp.qpn());
                return Err(e);
            }
        };
        let mut conn = Connection {
            ctx,
            tcp,
            qp,
            send_cq,
            recv_cq,
            channel,
            peer_regions,
            peer,
            mtu: (offer, path_mtu),
            closed: false,
            failure_c: std::sync::OnceLock::new(),
        };
        // The QP can receive now; the peer sends only after `ready`. In between, the
        // application's hook posts its first receives (dropping `conn` on error cleans up).
        let hook = conn.ctx.shared.on_connect.read().clone();
        if let Some(hook) = hook {
            hook(&conn)?;
        }
        setup::ready(&mut conn.tcp, HANDSHAKE)?;
        let dev = &conn.ctx.shared.dev;
        dev.watch(conn.tcp.as_raw_fd(), conn.qp.qpn());
        log::info!(
            target: "rdmx::msgr",
            "connected to {peer}: QP {:#x}, {} peer region(s), path MTU {path_mtu} (offered \
             {}: configured {}, active {} on link MTU {}; the peer offered {peer_mtu})",
            conn.qp.qpn(),
            conn.peer_regions.len(),
            offer.offered,
            offer.configured,
            offer.active,
            offer.link_mtu,
        );
        Ok(conn)
    }

    fn check_open(&self, what: &str) -> Result<()> {
        if self.closed {
            return Err(closed(format!(
                "{what}: connection to {} is closed",
                self.peer
            )));
        }
        if self.qp.peer_gone() {
            return Err(closed(format!(
                "{what}: peer {} went away (side channel closed)",
                self.peer
            )));
        }
        Ok(())
    }

    /// Posts a chain of send-queue WRs (SEND, WRITE, READ, with or without immediate).
    /// Returns how many were posted; `Full` when the send queue has no room at all.
    pub fn post_send(&self, wrs: &[SendReq]) -> Result<usize> {
        self.check_open("post_send")?;
        let dev = &self.ctx.shared.dev;
        let (n, err) = self.qp.post_send(dev.mrs(), dev.now(), wrs);
        dev.timer_armed(self.qp.next_deadline());
        match err {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    /// Posts a chain of receive WRs (cookie, SGEs).
    pub fn post_recv(&self, wrs: &[(u64, SgeList)]) -> Result<usize> {
        self.check_open("post_recv")?;
        let (n, err) = self.qp.post_recv(self.ctx.shared.dev.mrs(), wrs);
        match err {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    /// Moves up to `out.len()` completions (send CQ first, then receive CQ) into `out`.
    /// With progress=inline or poll_mode=busy the call also drives the engine.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        let s = &self.ctx.shared.settings;
        if s.progress == Progress::Inline || s.poll_mode == PollMode::Busy {
            self.ctx.shared.dev.progress_inline();
        }
        let n = self.send_cq.poll(out);
        if Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            return n;
        }
        n + self.recv_cq.poll(&mut out[n..])
    }

    /// Arms the event fd: it becomes readable when the next completion arrives (or at once
    /// if completions are queued). Read it with `clear_event` after it fired.
    /// With progress=inline this also tells the device the caller stops polling, so its
    /// progress thread receives in the meantime (arm only right before sleeping).
    pub fn req_notify(&self) {
        self.ctx.shared.dev.app_sleeping();
        self.send_cq.req_notify();
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.req_notify();
        }
    }

    /// The completion channel's fd, for epoll/poll.
    pub fn event_fd(&self) -> RawFd {
        self.channel.raw_fd()
    }

    pub fn clear_event(&self) {
        self.channel.clear();
    }

    pub fn counters(&self) -> Counters {
        self.qp.counters()
    }

    /// Why the connection's QP gave up, in words, if it ended with RETRY_EXC_ERR or
    /// RNR_RETRY_EXC_ERR: retries over how long, the knobs in force, the likely causes.
    pub fn failure_note(&self) -> Option<String> {
        self.qp.failure_note()
    }

    /// `failure_note` as a C string that lives as long as the connection (for the C ABI).
    pub fn failure_note_c(&self) -> Option<&std::ffi::CStr> {
        if let Some(s) = self.failure_c.get() {
            return Some(s);
        }
        let note = self.failure_note()?.replace('\0', " ");
        let s = std::ffi::CString::new(note).unwrap_or_default();
        Some(self.failure_c.get_or_init(|| s))
    }

    /// How well the device kept listening (time it was not running is left out of its
    /// timers): see [`ProgressStats`].
    pub fn progress_stats(&self) -> ProgressStats {
        self.ctx.shared.dev.progress_stats()
    }

    /// Packets not sent because of `soft_drop_ratio`.
    pub fn injected_drops(&self) -> u64 {
        self.qp.injected_drops()
    }

    /// Datagrams the kernel dropped on the context's UDP receive queue.
    pub fn kernel_drops(&self) -> u64 {
        self.ctx.kernel_drops()
    }

    /// The memory the peer exposed for one-sided access.
    pub fn peer_regions(&self) -> &[Region] {
        &self.peer_regions
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The path MTU the connection uses: the smaller of the two sides' offers, each the
    /// configured `path_mtu` capped by that side's active MTU (see [`Self::active_mtu`]).
    pub fn path_mtu(&self) -> u32 {
        self.mtu.1
    }

    /// This side's active MTU: the largest IB MTU whose packets fit the MTU of the link
    /// that routes to the peer ([`crate::provider::soft::mtu`]).
    pub fn active_mtu(&self) -> u32 {
        self.mtu.0.active
    }

    /// The MTU (IP datagram bytes) of the route to the peer, as found at setup.
    pub fn link_mtu(&self) -> u32 {
        self.mtu.0.link_mtu
    }

    pub fn qp_state(&self) -> QpState {
        self.qp.state()
    }

    /// Closes the connection: the peer sees EOF, this QP goes to ERR so every outstanding
    /// WR completes (flushed) and releases the memory it names, then the QP is destroyed.
    /// Completions produced stay pollable until the connection is dropped.
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        let dev = &self.ctx.shared.dev;
        dev.unwatch(self.tcp.as_raw_fd());
        let _ = self.tcp.shutdown(std::net::Shutdown::Both);
        self.qp.fail(dev.mrs());
        dev.destroy_qp(self.qp.qpn());
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
    }
}

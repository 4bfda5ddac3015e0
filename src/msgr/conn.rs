//! Listener and connection: TCP side channel setup (QP numbers, PSNs, addresses, MTU,
//! rd_atomic limits, exposed regions), then RC traffic on the context's provider (soft or
//! verbs, through `provider::dev`'s enums: this file names neither), with the TCP
//! connection kept open as the liveness signal (EOF = peer gone: every outstanding WR
//! completes with an error or a flush).

use crate::error::{Error, ErrorKind, Result};
use crate::provider::dev::Qp;
use crate::provider::ready::QpReadiness;
use crate::provider::sys::{self, EventFd};
use crate::provider::types::{ProgressStats, SendReq, Wc};
use crate::rc::verbs::QpState;
use crate::rc::{Counters, SgeList};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::auth::gate::{Gate, HandshakeCounters, Passed};
use super::auth::{self, Authenticated};
use super::context::{Context, closed};
use super::setup::{self, Hello, Region};
use crate::provider::mtu::PathMtu;

/// New TCP connections one accept pass takes from the backlog (the rest wait for the next
/// pass, so that a flood does not hold the accepting thread).
const ACCEPT_BATCH: usize = 64;
/// Longest single wait inside `accept` before it looks at its queues again (a safety net:
/// every event that matters also wakes it).
const ACCEPT_SLICE: Duration = Duration::from_secs(1);

/// Accepts connections on a TCP address.
///
/// A new TCP connection first passes the listener's [`Gate`] (`src/msgr/auth/gate.rs`):
/// its authentication runs over a non-blocking socket driven by `accept` itself, with no
/// thread and no QP, under the handshake bounds (`handshake_first_bytes_ms` per auth frame,
/// `handshake_per_source`, `handshake_max`; refusals are counted in [`Listener::counters`]
/// and logged). Only a peer that authenticated (or, with `auth = none`, said so in its
/// first frame) gets a set-up thread, a QP and this side's hello, with its own deadline
/// (`handshake_timeout_ms`), so a client that connects and stays silent holds up no other
/// client: `accept` returns whichever connection is set up first. The on-connect hook
/// still runs in `accept`, on the caller's thread. A client that does not finish its
/// set-up in time is dropped (logged at debug level); other set-up failures are returned
/// by `accept`. Several threads may accept on one listener at once.
#[derive(Debug)]
pub struct Listener {
    ctx: Context,
    /// Non-blocking for its whole life (accepts wait in poll(2), never toggle the mode).
    tcp: TcpListener,
    handshakes: Arc<Handshakes>,
    handshake_timeout: Duration,
    /// Connections not yet authenticated.
    gate: Mutex<Gate>,
}

/// A listener's handshakes, shared with the threads that run them.
#[derive(Debug)]
struct Handshakes {
    /// `handshake_max`.
    max: usize,
    state: Mutex<HandshakeState>,
    /// Signaled when a handshake ends (`accept` waits on it with the listening socket).
    wake: EventFd,
}

#[derive(Debug, Default)]
struct HandshakeState {
    /// Handshakes that ended and were not yet taken by `accept`: the connection (with the
    /// peer's offered path MTU, for the log line) or the error.
    done: VecDeque<Result<(Connection, u32)>>,
    /// Set-ups running or in `done` (with the gate's connections at most `handshake_max`).
    slots: usize,
    /// The sockets of running handshakes (clones), shut down when the listener goes.
    running: HashMap<u64, TcpStream>,
    next_id: u64,
    closed: bool,
}

/// A few fds.
pub type SmallFds = smallvec::SmallVec<[RawFd; 2]>;

/// One RC connection.
#[derive(Debug)]
pub struct Connection {
    ctx: Context,
    tcp: TcpStream,
    qp: Qp,
    peer_regions: Vec<Region>,
    peer: SocketAddr,
    /// The peer's authenticated entity (None with `auth = none`).
    peer_entity: Option<String>,
    /// The message limits the peer's hello advertised (None: it sent none).
    peer_limits: Option<setup::MsgLimitsWire>,
    /// The peer's hello set [`setup::FLAG_PATHS`] (its messenger takes path-joins).
    peer_paths: bool,
    /// This connection's own secret from its authenticated handshake
    /// ([`crate::msgr::auth::SessionKeys::session`]: bound to both nonces and the key
    /// exchange); None with `auth = none`. Path-joins are bound with it.
    binding: Option<zeroize::Zeroizing<[u8; 32]>>,
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
        tcp.set_nonblocking(true)
            .map_err(|e| Error::new(ErrorKind::Io, format!("listen on {a}: {e}")))?;
        let auth = Arc::clone(&self.shared.auth);
        auth.warn_if_none(&format!("listening on {a}"));
        let local = tcp.local_addr().unwrap_or(a);
        Ok(Listener {
            ctx: self.clone(),
            tcp,
            handshakes: Arc::new(Handshakes {
                max: auth.limits.max,
                state: Mutex::new(HandshakeState::default()),
                wake: EventFd::new()?,
            }),
            handshake_timeout: auth.limits.timeout,
            gate: Mutex::new(Gate::new(auth, local)?),
        })
    }

    /// Connects to a listener at `addr` within `timeout` and sets up the RC connection.
    pub fn connect(&self, addr: &str, timeout: Duration) -> Result<Connection> {
        self.connect_cancellable(addr, timeout, &ConnectCancel::new()?)
    }

    /// [`Context::connect`] that another thread may abort with [`ConnectCancel::cancel`]
    /// (`Closed` then): the TCP connect waits on the cancel's eventfd too, and a handshake
    /// in progress fails at once (its side channel is shut down).
    pub fn connect_cancellable(
        &self,
        addr: &str,
        timeout: Duration,
        cancel: &ConnectCancel,
    ) -> Result<Connection> {
        let a = resolve(addr)?;
        let tcp = match tcp_connect(&a, Instant::now() + timeout, cancel.wake.raw_fd()) {
            Ok(Some(t)) => t,
            Ok(None) => return Err(closed(format!("connect to {a}: cancelled"))),
            Err(e) => {
                let kind = if e.kind() == std::io::ErrorKind::TimedOut {
                    ErrorKind::Timeout
                } else {
                    ErrorKind::Io
                };
                return Err(Error::new(kind, format!("connect to {a}: {e}")));
            }
        };
        // The handshake blocks on the side channel: a cancel shuts it down.
        *cancel.tcp.lock() = tcp.try_clone().ok();
        let auth_cfg = Arc::clone(&self.shared.auth);
        auth_cfg.warn_if_none(&format!("connecting to {a}"));
        let hs = auth_cfg.limits.timeout;
        let r = if cancel.cancelled() {
            Err(closed(format!("connect to {a}: cancelled")))
        } else {
            let mut tcp = tcp;
            // Authenticate first: no QP exists and nothing is disclosed until both sides
            // proved the key.
            auth::client::run(&mut tcp, &auth_cfg, Instant::now() + hs)
                .and_then(|auth| Connection::prepare(self.clone(), tcp, hs, auth, true))
                .and_then(|(mut conn, peer_mtu)| {
                    conn.go_live(peer_mtu, |tcp| setup::ready(tcp, hs))?;
                    Ok(conn)
                })
        };
        *cancel.tcp.lock() = None;
        match r {
            Err(e) if cancel.cancelled() => Err(closed(format!(
                "connect to {a}: cancelled ({})",
                e.message()
            ))),
            r => r,
        }
    }
}

/// Aborts a [`Context::connect_cancellable`] running on another thread (a messenger shutting
/// down while a reconnect is under way).
#[derive(Debug)]
pub struct ConnectCancel {
    stop: std::sync::atomic::AtomicBool,
    /// Readable once cancelled: the non-blocking TCP connect polls it with the socket.
    wake: EventFd,
    /// The side channel while its handshake runs (a clone: shutting it down ends the
    /// handshake's blocking reads and writes).
    tcp: Mutex<Option<TcpStream>>,
}

impl ConnectCancel {
    pub fn new() -> Result<ConnectCancel> {
        Ok(ConnectCancel {
            stop: std::sync::atomic::AtomicBool::new(false),
            wake: EventFd::new()?,
            tcp: Mutex::new(None),
        })
    }

    pub fn cancel(&self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.wake.signal();
        if let Some(t) = self.tcp.lock().as_ref() {
            let _ = t.shutdown(std::net::Shutdown::Both);
        }
    }

    fn cancelled(&self) -> bool {
        self.stop.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// A TCP connection to `a`, established by `deadline`: a non-blocking connect polled with
/// `cancel` (an eventfd; None when it became readable first). The stream is blocking.
fn tcp_connect(
    a: &SocketAddr,
    deadline: Instant,
    cancel: RawFd,
) -> std::io::Result<Option<TcpStream>> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let family = if a.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain syscall; the result is checked before use.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket just created and owned by nothing else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: all-zero bytes are a valid sockaddr_in6 (the buffer type).
    let mut sa: sys::SockAddrBuf = unsafe { std::mem::zeroed() };
    let len = sys::write_sockaddr(a, &mut sa);
    // SAFETY: `sa` holds a sockaddr of `len` bytes; `fd` is our socket.
    let r = unsafe { libc::connect(fd, std::ptr::from_ref(&sa).cast(), len) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "connection timed out",
                ));
            }
            let mut p = [
                libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                },
                libc::pollfd {
                    fd: cancel,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
            // SAFETY: `p` is a valid array of 2 pollfd.
            let n = unsafe { libc::poll(p.as_mut_ptr(), 2, ms) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if p[1].revents != 0 {
                return Ok(None);
            }
            if p[0].revents != 0 {
                break;
            }
        }
        let mut err: libc::c_int = 0;
        let mut l = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `err` and `l` are valid for the int SO_ERROR writes.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                std::ptr::from_mut(&mut err).cast(),
                &mut l,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if err != 0 {
            return Err(std::io::Error::from_raw_os_error(err));
        }
    }
    let tcp = TcpStream::from(sock);
    tcp.set_nonblocking(false)?;
    Ok(Some(tcp))
}

impl Listener {
    pub fn local_addr(&self) -> SocketAddr {
        self.tcp
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// How long a client may take over its set-up once it authenticated (default
    /// `handshake_timeout_ms`, 10 s); one that takes longer is dropped. Applies to set-ups
    /// started afterwards.
    pub fn set_handshake_timeout(&mut self, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "handshake timeout: invalid value 0: must be positive",
            ));
        }
        self.handshake_timeout = timeout;
        Ok(())
    }

    /// Handshakes running now (TCP connections accepted whose setup has not ended:
    /// unauthenticated ones at the gate and set-ups on their threads).
    pub fn handshakes_in_progress(&self) -> usize {
        self.handshakes.state.lock().running.len() + self.gate.lock().len()
    }

    /// The listener's handshake counters: authentication failures, refusals by a limit,
    /// connections dropped for silence, connections that passed.
    pub fn counters(&self) -> HandshakeCounters {
        self.gate.lock().stats.snapshot()
    }

    /// The fds `accept` waits on (a handshake ended; a client waits in the backlog; an
    /// unauthenticated connection sent bytes), for a caller that polls them itself between
    /// accept calls. A caller that sleeps on them must also call again by
    /// [`Listener::next_deadline`].
    pub fn wait_fds(&self) -> SmallFds {
        let mut v = SmallFds::new();
        v.push(self.handshakes.wake.raw_fd());
        v.push(self.tcp.as_raw_fd());
        v.push(self.gate.lock().fd());
        v
    }

    /// When the earliest unauthenticated connection's deadline passes (it is dropped by
    /// the accept call after it).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.gate.lock().next_deadline()
    }

    /// [`Listener::accept`] without waiting, for a caller that looks often (a busy
    /// messenger shard, every millisecond): None when nothing is ready, found by a
    /// zero-timeout poll of [`Listener::wait_fds`]. A failing accept(2) allocates and frees
    /// a file, and the `Timeout` error formats the local address (a getsockname): 2% of a
    /// messenger server's CPU at 150K requests/s before.
    pub fn try_accept(&self) -> Result<Option<Connection>> {
        let mut ready = Vec::new();
        sys::poll_readable(&self.wait_fds(), Duration::ZERO, &mut ready)?;
        let due = self.next_deadline().is_some_and(|d| d <= Instant::now());
        if ready.is_empty() && !due {
            return Ok(None);
        }
        match self.accept(Some(Duration::ZERO)) {
            Ok(c) => Ok(Some(c)),
            Err(e) if e.kind() == ErrorKind::Timeout => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Waits up to `timeout` (None = forever) for a connection that completed its setup
    /// and returns it, after running the on-connect hook and telling the peer it may send.
    /// Handshakes run concurrently (see [`Listener`]); `Timeout` when none completed in
    /// time. A handshake that failed (other than by timing out) is returned as its error.
    pub fn accept(&self, timeout: Option<Duration>) -> Result<Connection> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut ready = Vec::new();
        loop {
            if let Some(done) = self.handshakes.take() {
                let (mut conn, peer_mtu) = done?;
                let fd = conn.tcp.as_raw_fd();
                let hs = self.handshake_timeout;
                conn.go_live(peer_mtu, |tcp| {
                    setup::send_ready(tcp, hs)?;
                    // Its handshake may have ended a while before this accept call.
                    if sys::peer_closed(fd) {
                        return Err(closed(format!(
                            "side channel to {}: the peer left before the connection was \
                             accepted",
                            conn_peer(tcp)
                        )));
                    }
                    Ok(())
                })?;
                return Ok(conn);
            }
            self.start_handshakes()?;
            let wait = match deadline {
                None => ACCEPT_SLICE,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(Error::new(
                            ErrorKind::Timeout,
                            format!(
                                "accept on {}: no connection within {:?}",
                                self.local_addr(),
                                timeout.unwrap_or_default()
                            ),
                        ));
                    }
                    left.min(ACCEPT_SLICE)
                }
            };
            let wait = match self.next_deadline() {
                Some(d) => wait.min(d.saturating_duration_since(Instant::now())),
                None => wait,
            };
            sys::poll_readable(&self.wait_fds(), wait, &mut ready)?;
        }
    }

    /// Takes the TCP connections waiting in the backlog to the gate (which refuses those
    /// over a limit), advances the unauthenticated ones, and starts a set-up thread for
    /// each that passed.
    fn start_handshakes(&self) -> Result<()> {
        let r = self.admit_new();
        let passed = self.gate.lock().drive(Instant::now());
        for p in passed {
            if !self.handshakes.reserve() {
                // The gate counted this one in; the set-ups filled up meanwhile.
                log::warn!(
                    target: "rdmx::auth",
                    "listener {}: dropped {} after authentication: {} set-ups in progress \
                     (handshake_max)",
                    self.local_addr(),
                    p.peer,
                    self.handshakes.max
                );
                continue;
            }
            if let Err(e) = self.spawn_handshake(p) {
                self.handshakes.release();
                return Err(e);
            }
        }
        r
    }

    /// Moves up to [`ACCEPT_BATCH`] connections from the backlog to the gate.
    fn admit_new(&self) -> Result<()> {
        for _ in 0..ACCEPT_BATCH {
            let (tcp, peer) = match self.tcp.accept() {
                Ok(s) => s,
                Err(e) => {
                    match e.kind() {
                        std::io::ErrorKind::WouldBlock => return Ok(()),
                        // A client that reset before we took it, or a signal: next one.
                        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::Interrupted => {
                            continue;
                        }
                        _ => {
                            return Err(Error::new(
                                ErrorKind::Io,
                                format!("accept on {}: {e}", self.local_addr()),
                            ));
                        }
                    }
                }
            };
            let others = self.handshakes.state.lock().slots;
            self.gate.lock().admit(tcp, peer, others, Instant::now());
        }
        Ok(())
    }

    /// Runs the set-up of an authenticated connection on a thread of its own; its result
    /// goes to `done`.
    fn spawn_handshake(&self, passed: Passed) -> Result<()> {
        let Passed { tcp, peer, auth } = passed;
        let io = |e: std::io::Error| {
            Error::new(
                ErrorKind::Io,
                format!("accept on {}: handshake: {e}", self.local_addr()),
            )
        };
        tcp.set_nonblocking(false).map_err(io)?;
        let id = {
            let clone = tcp.try_clone().map_err(io)?;
            let mut st = self.handshakes.state.lock();
            let id = st.next_id;
            st.next_id += 1;
            st.running.insert(id, clone);
            id
        };
        let ctx = self.ctx.clone();
        let hs = Arc::clone(&self.handshakes);
        let timeout = self.handshake_timeout;
        let stats = Arc::clone(&self.gate.lock().stats);
        let entity = auth.peer_entity.clone();
        let spawned = std::thread::Builder::new()
            .name("rdmx-handshake".into())
            .spawn(move || {
                let started = Instant::now();
                // A panic here (a bug, or the application's region filter, which runs in the
                // hello) would end the thread without `finish`: the slot would stay taken
                // and, after `handshake_max` of them, every client be refused. Caught,
                // counted (`HandshakeCounters::panics`), logged; the handshake fails.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    Connection::prepare(ctx, tcp, timeout, auth, false).and_then(
                        |(mut conn, mtu)| {
                            let left = timeout.saturating_sub(started.elapsed());
                            setup::await_ready(&mut conn.tcp, left.max(Duration::from_millis(1)))?;
                            Ok((conn, mtu))
                        },
                    )
                }))
                .unwrap_or_else(|payload| {
                    stats
                        .panics
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let why = crate::logging::panic_message(payload.as_ref());
                    log::error!(target: "rdmx::msgr", "handshake with {peer} panicked: {why}");
                    Err(Error::new(
                        ErrorKind::Closed,
                        format!("handshake with {peer} panicked: {why}"),
                    ))
                });
                if let Err(e) = &r
                    && e.kind() == ErrorKind::Auth
                {
                    // A hello whose tag does not verify: changed in transit or replayed.
                    stats
                        .auth_failures
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    log::warn!(
                        target: "rdmx::auth",
                        "authentication failed for {peer} (entity {}): {e}",
                        entity.as_deref().unwrap_or("(none)")
                    );
                }
                hs.finish(id, peer, r, started.elapsed() >= timeout, timeout);
            });
        if let Err(e) = spawned {
            self.handshakes.state.lock().running.remove(&id);
            return Err(io(e));
        }
        Ok(())
    }
}

fn conn_peer(tcp: &TcpStream) -> String {
    tcp.peer_addr()
        .map_or_else(|_| "the peer".to_string(), |a| a.to_string())
}

impl Handshakes {
    /// Takes a slot for a new handshake if there is room.
    fn reserve(&self) -> bool {
        let mut st = self.state.lock();
        if st.slots >= self.max {
            return false;
        }
        st.slots += 1;
        true
    }

    fn release(&self) {
        let mut st = self.state.lock();
        st.slots = st.slots.saturating_sub(1);
    }

    /// The oldest ended handshake, if any. With none, clears the wakeup: it fires again
    /// when the next one ends (or a slot frees).
    fn take(&self) -> Option<Result<(Connection, u32)>> {
        let mut st = self.state.lock();
        match st.done.pop_front() {
            Some(d) => {
                st.slots = st.slots.saturating_sub(1);
                Some(d)
            }
            None => {
                self.wake.clear();
                None
            }
        }
    }

    /// A handshake thread's end: its result is queued for `accept`, except when it ran
    /// out of time (a silent or slow client: dropped) or the listener is gone.
    fn finish(
        &self,
        id: u64,
        peer: SocketAddr,
        r: Result<(Connection, u32)>,
        timed_out: bool,
        timeout: Duration,
    ) {
        let mut st = self.state.lock();
        st.running.remove(&id);
        let drop_it = st.closed || (r.is_err() && timed_out);
        if drop_it {
            st.slots = st.slots.saturating_sub(1);
        } else {
            st.done.push_back(r);
            self.wake.signal();
            return;
        }
        // A slot freed: an accept waiting at the limit may take the next client.
        self.wake.signal();
        let closed = st.closed;
        drop(st);
        match r {
            Err(e) if !closed => log::debug!(
                target: "rdmx::msgr",
                "accept: dropped {peer}: no handshake within {timeout:?}: {e}"
            ),
            _ => log::debug!(
                target: "rdmx::msgr",
                "accept: dropped {peer}: the listener closed during its handshake"
            ),
        }
        // `r` (a connection, if any) is dropped here, outside the lock.
    }
}

impl Drop for Listener {
    /// Ends running handshakes at once (their sockets are shut down) and drops the
    /// connections set up but not accepted.
    fn drop(&mut self) {
        let (done, running) = {
            let mut st = self.handshakes.state.lock();
            st.closed = true;
            (
                std::mem::take(&mut st.done),
                std::mem::take(&mut st.running),
            )
        };
        for s in running.values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        drop(done);
    }
}

impl Connection {
    /// The part of a setup that waits for the peer, once it authenticated (`auth`; the
    /// session keys tag both hellos): creates the QP, exchanges hellos within `timeout`
    /// and brings the QP to RTS. Returns the connection (not yet watched, the peer not yet
    /// told it may send) and the peer's offered path MTU. `client`: this side connected.
    fn prepare(
        ctx: Context,
        mut tcp: TcpStream,
        timeout: Duration,
        auth: Authenticated,
        client: bool,
    ) -> Result<(Connection, u32)> {
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
        let mut offer = setup::offered_path_mtu(&tcp, s.path_mtu.bytes())?;
        let dev = &ctx.shared.dev;
        if let Some(port) = dev.port_mtu() {
            // A NIC caps a QP at its port's active MTU (the verbs device says which).
            offer.active = offer.active.min(port);
            offer.offered = offer.offered.min(port);
            if offer.clamped() {
                log::info!(
                    target: "rdmx::msgr",
                    "path_mtu {} (configured) clamped to {}: the verbs port's active MTU is \
                     {port}, the route's link MTU {}",
                    offer.configured,
                    offer.offered,
                    offer.link_mtu
                );
            }
        }
        let qp = dev.create_qp(s, local_ip)?;
        let result = (|| {
            let ep = dev.endpoint(&qp, local_ip)?;
            let (max_rd_atomic, max_dest_rd_atomic) = dev.rd_atomic_offer(s);
            let limits = *ctx.shared.hello_limits.read();
            let mine = Hello {
                version: setup::VERSION,
                flags: if ep.src_port.is_some() {
                    setup::FLAG_SRC_PORT
                } else {
                    0
                } | if ep.roce { setup::FLAG_ROCE } else { 0 }
                    | if limits.is_some() {
                        setup::FLAG_LIMITS
                    } else {
                        0
                    }
                    | setup::FLAG_PATHS,
                src_port: ep.src_port,
                limits,
                qpn: qp.qpn(),
                psn: setup::random_psn(),
                udp: ep.udp,
                path_mtu: offer.offered,
                max_rd_atomic,
                max_dest_rd_atomic,
                credits: s.effective_credits(),
                regions: {
                    let filter = ctx.shared.region_filter.read().clone();
                    let mut r = ctx.hello_regions();
                    if let Some(f) = filter {
                        r.retain(|region| f(auth.peer_entity.as_deref(), region));
                    }
                    r
                },
            };
            let keys = auth.keys.as_ref().map(|k| (k, client));
            let theirs = setup::exchange_tagged(&mut tcp, &mine, timeout, keys)?;
            let n = setup::negotiate(&mine, &theirs, peer.ip())?;
            qp.connect(&n.remote(), s)?;
            let paths = theirs.flags & setup::FLAG_PATHS != 0;
            Ok((
                n.peer_regions,
                theirs.path_mtu,
                n.path_mtu,
                theirs.limits,
                paths,
            ))
        })();
        let (peer_regions, peer_mtu, path_mtu, peer_limits, peer_paths) = match result {
            Ok(r) => r,
            Err(e) => {
                qp.destroy(dev);
                return Err(e);
            }
        };
        let binding = auth.keys.as_ref().map(|k| k.session.clone());
        let conn = Connection {
            ctx,
            tcp,
            qp,
            peer_regions,
            peer,
            peer_entity: auth.peer_entity,
            peer_limits,
            peer_paths,
            binding,
            mtu: (offer, path_mtu),
            closed: false,
            failure_c: std::sync::OnceLock::new(),
        };
        Ok((conn, peer_mtu))
    }

    /// The rest of a setup, on the caller's thread: the application's hook posts its
    /// first receives (the QP can receive now; the peer sends only after our ready byte),
    /// then `ready` takes the ready step, then the side channel is watched. On error the
    /// caller drops the connection, which cleans up.
    fn go_live(
        &mut self,
        peer_mtu: u32,
        ready: impl FnOnce(&mut TcpStream) -> Result<()>,
    ) -> Result<()> {
        let hook = self.ctx.shared.on_connect.read().clone();
        if let Some(hook) = hook {
            hook(self)?;
        }
        ready(&mut self.tcp)?;
        self.qp.watch(&self.ctx.shared.dev, self.tcp.as_raw_fd());
        let offer = self.mtu.0;
        log::info!(
            target: "rdmx::msgr",
            "connected to {}: QP {:#x}, {} peer region(s), path MTU {} (offered {}: \
             configured {}, active {} on link MTU {}; the peer offered {peer_mtu})",
            self.peer,
            self.qp.qpn(),
            self.peer_regions.len(),
            self.mtu.1,
            offer.offered,
            offer.configured,
            offer.active,
            offer.link_mtu,
        );
        Ok(())
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

    /// The provider's QP (what memory windows for this peer are bound on).
    pub(crate) fn provider_qp(&self) -> &crate::provider::dev::Qp {
        &self.qp
    }

    pub(crate) fn context(&self) -> &Context {
        &self.ctx
    }

    /// Posts a chain of send-queue WRs (SEND, WRITE, READ, with or without immediate).
    /// Returns how many were posted; `Full` when the send queue has no room at all.
    pub fn post_send(&self, wrs: &[SendReq]) -> Result<usize> {
        self.check_open("post_send")?;
        let (n, err) = self.qp.post_send(&self.ctx.shared.dev, wrs);
        match err {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    /// Posts a chain of receive WRs (cookie, SGEs).
    pub fn post_recv(&self, wrs: &[(u64, SgeList)]) -> Result<usize> {
        self.check_open("post_recv")?;
        let (n, err) = self.qp.post_recv(&self.ctx.shared.dev, wrs);
        match err {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    /// Moves up to `out.len()` completions (send CQ first, then receive CQ) into `out`.
    /// With progress=inline or poll_mode=busy the call also drives the engine.
    pub fn poll(&self, out: &mut [Wc]) -> usize {
        self.qp
            .poll(&self.ctx.shared.dev, &self.ctx.shared.settings, out)
    }

    /// Whether [`Connection::poll_cq`] may find completions (a look without the CQ's lock
    /// on the soft provider; always true on verbs).
    pub fn may_have_completions(&self) -> bool {
        self.qp.may_have_completions()
    }

    /// Runs `hook` (on the thread that completed the work, no lock of this connection
    /// held) when a completion lands in one of its empty CQs; false if the provider cannot
    /// tell (verbs), and then only a poll tells. See [`QpReadiness::on_first_completion`].
    pub fn on_first_completion(&self, hook: Arc<dyn Fn() + Send + Sync>) -> bool {
        self.qp.on_first_completion(hook)
    }

    /// [`Connection::poll`] without the device's progress pass: for a caller that polls
    /// many connections of one context and ran [`Context::progress`] once before them (one
    /// receive call per pass instead of one per connection).
    pub fn poll_cq(&self, out: &mut [Wc]) -> usize {
        self.qp.poll_cq(out)
    }

    /// Arms the event fd: it becomes readable when the next completion arrives (or at once
    /// if completions are queued). Read it with `clear_event` after it fired.
    /// With progress=inline this also tells the device the caller stops polling, so its
    /// progress thread receives in the meantime (arm only right before sleeping).
    pub fn req_notify(&self) {
        self.qp.req_notify(&self.ctx.shared.dev);
    }

    /// Arms the event fd as `req_notify` does, for a caller that sleeps on the context's
    /// receiving sockets too (`Context::app_watch`): the device is not told it stops polling.
    pub fn arm(&self) {
        self.qp.arm();
    }

    /// Takes back an [`Connection::arm`] that has not fired, for a thread that woke for
    /// another reason and polls again (soft provider; nothing on verbs).
    pub fn disarm(&self) {
        self.qp.disarm();
    }

    /// The completion channel's fd, for epoll/poll.
    pub fn event_fd(&self) -> RawFd {
        self.qp.event_fd()
    }

    pub fn clear_event(&self) {
        self.qp.clear_event();
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

    /// Completions lost because a CQ of this connection was full (the QP then went to
    /// error, as a NIC's does on a CQ overrun); `None` where the provider cannot count them
    /// (verbs: the NIC raises IBV_EVENT_CQ_ERR instead).
    pub fn cq_overflows(&self) -> Option<u64> {
        self.qp.cq_overflows()
    }

    /// Packets not sent because of `soft_drop_ratio`.
    pub fn injected_drops(&self) -> u64 {
        self.qp.injected_drops()
    }

    /// Datagrams that found the QP's UDP send buffer full and were sent later (back-pressure:
    /// the sender waited, nothing was lost).
    pub fn tx_deferred(&self) -> u64 {
        self.qp.tx_deferred()
    }

    /// Datagrams the kernel refused outright (lost; the transport retransmitted them).
    pub fn tx_errors(&self) -> u64 {
        self.qp.tx_errors()
    }

    /// Datagrams the kernel dropped on the context's UDP receive queue.
    pub fn kernel_drops(&self) -> u64 {
        self.ctx.kernel_drops()
    }

    /// The memory the peer exposed for one-sided access.
    /// The message limits the peer's hello advertised (its messenger's
    /// `msgr_max_message_bytes` and `msgr_max_segments`); None when it sent none (a plain
    /// connection, or a build before protocol 1.3).
    pub fn peer_limits(&self) -> Option<setup::MsgLimitsWire> {
        self.peer_limits
    }

    /// This connection's secret from its authenticated handshake (None with `auth = none`):
    /// both ends have it, nobody else (the messenger's path-join MAC).
    pub fn binding(&self) -> Option<&[u8; 32]> {
        self.binding.as_deref()
    }

    /// Whether the peer's messenger takes path-joins ([`setup::FLAG_PATHS`], protocol 1.4).
    pub fn peer_takes_paths(&self) -> bool {
        self.peer_paths
    }

    pub fn peer_regions(&self) -> &[Region] {
        &self.peer_regions
    }

    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The peer's entity as authenticated on the side channel: the client's name on an
    /// accepted connection, the listener's on a connected one; None with `auth = none`.
    pub fn peer_entity(&self) -> Option<&str> {
        self.peer_entity.as_deref()
    }

    /// The path MTU the connection uses: the smaller of the two sides' offers, each the
    /// configured `path_mtu` capped by that side's active MTU (see [`Self::active_mtu`]).
    pub fn path_mtu(&self) -> u32 {
        self.mtu.1
    }

    /// This side's active MTU: the largest IB MTU whose packets fit the MTU of the link
    /// that routes to the peer (`src/provider/mtu.rs`).
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

    /// Fault injection (tests): shuts the TCP side channel down, so both sides see EOF and
    /// move their QPs to ERR, as when the peer's process dies.
    pub fn inject_side_channel_close(&self) {
        let _ = self.tcp.shutdown(std::net::Shutdown::Both);
    }

    /// Fault injection (tests): moves this side's QP to ERR now (outstanding work
    /// flushes); the side channel stays open.
    pub fn inject_qp_error(&self) {
        self.qp.fail(&self.ctx.shared.dev);
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
        self.qp.unwatch(dev, self.tcp.as_raw_fd());
        // The QP first: its held ACKs (soft) leave before the peer sees our EOF, which
        // fails its QP and would flush a SEND we took but had not acknowledged yet.
        self.qp.close(dev);
        let _ = self.tcp.shutdown(std::net::Shutdown::Both);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close();
        self.qp.settle();
    }
}

//! The active side: `rdma_connect`'s TCP connect (bounded), the REQ, then the reader.

use super::*;

/// `rdma_connect`: connects in a thread (the call returns at once, as librdmacm's), sends
/// the REQ and reads the answer.
pub fn connect(id: &Arc<Id>, fd: OwnedFd, dst: SocketAddr, req: Msg) -> Result<(), c_int> {
    let id2 = id.clone();
    std::thread::Builder::new()
        .name("rdmx-cm-conn".into())
        .spawn(move || active(id2, fd, dst, req))
        .map(|_| ())
        .map_err(|_| libc::ENOMEM)
}

pub(super) fn active(id: Arc<Id>, fd: OwnedFd, dst: SocketAddr, req: Msg) {
    let grace = Instant::now() + REFUSED_GRACE;
    let r = loop {
        match tcp_connect(&fd, dst) {
            // Nobody listens yet: maybe in a moment ([`REFUSED_GRACE`]).
            Err(e) if e == libc::ECONNREFUSED && Instant::now() < grace && !id.is_destroyed() => {
                forget_peer(&fd);
                std::thread::sleep(Duration::from_millis(5));
            }
            r => break r,
        }
    };
    let mut st = id.st.lock();
    if id.is_destroyed() || st.state != State::Connecting {
        return;
    }
    if let Err(e) = r {
        st.state = State::Done;
        if e == libc::ECONNREFUSED {
            // Nobody listens on that port: the kernel CM's REJ "invalid service ID".
            id::post(
                &id,
                &st,
                None,
                EV_REJECTED,
                REJ_INVALID_SERVICE_ID as i32,
                &[],
                REJ_PDATA,
                Fixup::QpToErr,
                |_| {},
            );
        } else {
            let status = if e == libc::ETIMEDOUT {
                -libc::ETIMEDOUT
            } else {
                -e
            };
            post_bare(&id, &st, EV_UNREACHABLE, status, Fixup::None);
        }
        return;
    }
    let s = Arc::new(TcpStream::from(fd));
    tune(&s);
    st.sock = Some(s.clone());
    st.local = s.local_addr().ok();
    st.deadline = Some((Instant::now() + REPLY_TIMEOUT, Wait::Rep));
    if send(&st, &req).is_err() {
        st.state = State::Done;
        st.sock = None;
        post_bare(&id, &st, EV_UNREACHABLE, -libc::ECONNRESET, Fixup::None);
        return;
    }
    drop(st);
    reader(id, s);
}

/// Non-blocking connect with [`CONNECT_TIMEOUT`].
/// Returns a socket whose connect failed to the unconnected state (connect to AF_UNSPEC),
/// keeping its bound address: without it Linux answers the next connect ECONNABORTED.
fn forget_peer(fd: &OwnedFd) {
    // SAFETY: connect(2) on our own socket with a zeroed sockaddr of family AF_UNSPEC.
    unsafe {
        let mut sa: libc::sockaddr = std::mem::zeroed();
        sa.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
        libc::connect(
            fd.as_raw_fd(),
            &sa,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        );
    }
}

pub(super) fn tcp_connect(fd: &OwnedFd, dst: SocketAddr) -> Result<(), c_int> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl/connect/poll/getsockopt on our own socket with valid buffers.
    unsafe {
        let fl = libc::fcntl(raw, libc::F_GETFL);
        libc::fcntl(raw, libc::F_SETFL, fl | libc::O_NONBLOCK);
        let mut ss: libc::sockaddr_storage = std::mem::zeroed();
        dev::to_c(dst, &mut ss);
        let r = libc::connect(
            raw,
            (&ss as *const libc::sockaddr_storage).cast(),
            dev::c_len(dst),
        );
        let res = if r == 0 {
            Ok(())
        } else {
            let e = crate::cm::chan::errno();
            if e != libc::EINPROGRESS {
                Err(e)
            } else {
                let mut p = libc::pollfd {
                    fd: raw,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                let n = libc::poll(&mut p, 1, CONNECT_TIMEOUT.as_millis() as c_int);
                if n == 0 {
                    Err(libc::ETIMEDOUT)
                } else if n < 0 {
                    Err(crate::cm::chan::errno())
                } else {
                    let mut err: c_int = 0;
                    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
                    libc::getsockopt(
                        raw,
                        libc::SOL_SOCKET,
                        libc::SO_ERROR,
                        (&mut err as *mut c_int).cast(),
                        &mut len,
                    );
                    if err == 0 { Ok(()) } else { Err(err) }
                }
            }
        };
        libc::fcntl(raw, libc::F_SETFL, fl & !libc::O_NONBLOCK);
        res
    }
}

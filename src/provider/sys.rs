//! Small OS pieces both providers and their users need: an eventfd (wakeups and
//! completion channels), kernel randomness (rkeys, QP numbers, PSNs, incarnations;
//! getrandom(2) or `/dev/urandom`), poll(2) over a set of fds, `sockaddr` encoding, and RLIMIT_MEMLOCK.

use crate::error::{Error, ErrorKind, Result};
use smallvec::SmallVec;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

fn os_error(what: &str) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("{what}: {}", std::io::Error::last_os_error()),
    )
}

/// A non-blocking eventfd: `signal` makes it readable until `clear`.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    pub fn new() -> Result<EventFd> {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(os_error("eventfd"));
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd { fd })
    }

    /// Makes the fd readable (adds 1 to the counter; never blocks).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own eventfd. EAGAIN (counter at its
        // maximum) still leaves the fd readable, which is all a signal needs.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets the counter so the fd is no longer readable.
    pub fn clear(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our own non-blocking eventfd; EAGAIN
        // (already clear) is fine.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Calls getrandom(2) at most this often for one request (EINTR, short reads) before
/// falling back to `/dev/urandom`: randomness never loops forever.
const GETRANDOM_TRIES: usize = 16;
/// Where randomness comes from when getrandom(2) is missing or refused.
const URANDOM: &str = "/dev/urandom";

/// Fills `buf` with kernel randomness: getrandom(2), or `/dev/urandom` where getrandom is
/// missing (ENOSYS: kernels before 3.17), refused (EPERM: some seccomp filters) or keeps
/// being interrupted. Errors ([`ErrorKind::Io`]) only when both sources fail, naming both.
pub fn fill_random(buf: &mut [u8]) -> Result<()> {
    fill_random_from(buf, &mut getrandom, std::path::Path::new(URANDOM))
}

/// One getrandom(2) call into `buf`.
fn getrandom(buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: writes at most `buf.len()` bytes into `buf`, which is live for the call.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// [`fill_random`] with its sources as parameters (tests replace them).
fn fill_random_from(
    buf: &mut [u8],
    getrandom: &mut dyn FnMut(&mut [u8]) -> std::io::Result<usize>,
    fallback: &std::path::Path,
) -> Result<()> {
    let mut filled = 0;
    let mut why = format!("interrupted or short {GETRANDOM_TRIES} times");
    for _ in 0..GETRANDOM_TRIES {
        if filled == buf.len() {
            return Ok(());
        }
        match getrandom(&mut buf[filled..]) {
            Ok(n) => filled += n.min(buf.len() - filled),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                why = e.to_string();
                break;
            }
        }
    }
    if filled == buf.len() {
        return Ok(());
    }
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log::warn!(
            target: "rdmx::soft",
            "getrandom(2): {why}; reading {} instead",
            fallback.display()
        );
    }
    std::fs::File::open(fallback)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, buf))
        .map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!(
                    "kernel randomness: getrandom(2): {why}; {}: {e}",
                    fallback.display()
                ),
            )
        })
}

/// A random u32 from the kernel ([`fill_random`]).
pub fn try_random_u32() -> Result<u32> {
    let mut v = [0u8; 4];
    fill_random(&mut v)?;
    Ok(u32::from_ne_bytes(v))
}

/// The RLIMIT_MEMLOCK soft limit in bytes; None when unlimited.
pub(crate) fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0
        || r.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(r.rlim_cur)
}

/// An integer socket option of `fd` (getsockopt(2)).
pub(crate) fn getsockopt_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
) -> std::io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live locals; `len` holds the size of `value`, which the
    // kernel writes at most.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            std::ptr::from_mut(&mut value).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(value)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Room for a `sockaddr_in` or a `sockaddr_in6` (a `sockaddr_storage` is 128 bytes; the send
/// path keeps SEND_CHUNK of these on the stack).
pub(crate) type SockAddrBuf = libc::sockaddr_in6;

const _: () = assert!(
    std::mem::size_of::<libc::sockaddr_in>() <= std::mem::size_of::<SockAddrBuf>()
        && std::mem::align_of::<libc::sockaddr_in>() <= std::mem::align_of::<SockAddrBuf>()
);

/// Writes `addr` as a `sockaddr_in`/`sockaddr_in6` into `out`; returns its length.
pub(crate) fn write_sockaddr(addr: &SocketAddr, out: &mut SockAddrBuf) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(a) => {
            // SAFETY: all-zero bytes are a valid sockaddr_in.
            let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            // SAFETY: SockAddrBuf (sockaddr_in6) is at least as large and as aligned as
            // sockaddr_in (checked by the const assertion above), so the write stays inside
            // `out` and is aligned.
            unsafe { std::ptr::write(std::ptr::from_mut(out).cast::<libc::sockaddr_in>(), sin) };
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            // SAFETY: all-zero bytes are a valid sockaddr_in6.
            let mut sin6: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            *out = sin6;
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// A random u64 for values that must be distinct rather than secret (a messenger's
/// incarnation, session ids): kernel randomness ([`fill_random`]), or, where neither
/// getrandom(2) nor `/dev/urandom` answers (logged), the clock mixed with the process id
/// and a stack address.
pub fn random_u64() -> u64 {
    let mut v = [0u8; 8];
    match fill_random(&mut v) {
        Ok(()) => u64::from_ne_bytes(v),
        Err(e) => {
            log::warn!(target: "rdmx::sys", "{e}; using the clock instead");
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            t ^ (&v as *const [u8; 8] as u64).rotate_left(32) ^ u64::from(std::process::id())
        }
    }
}

/// Waits until one of `fds` is readable (or hung up) or `timeout` passes; returns the fds
/// that are ready, as indices into `fds`, in `ready`. Up to 8 fds it allocates nothing;
/// a loop over a larger or changing set keeps its own buffer with [`poll_set`].
pub fn poll_readable(fds: &[RawFd], timeout: Duration, ready: &mut Vec<usize>) -> Result<()> {
    ready.clear();
    let mut pfds: SmallVec<[libc::pollfd; 8]> = fds.iter().map(|&fd| pollin(fd)).collect();
    ppoll(&mut pfds, timeout)?;
    ready.extend(
        pfds.iter()
            .enumerate()
            .filter(|(_, p)| p.revents != 0)
            .map(|(i, _)| i),
    );
    Ok(())
}

/// A `pollfd` asking for readability and hang-ups (`POLLIN | POLLRDHUP`), for [`poll_set`].
pub fn pollin(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    }
}

/// Waits until one of the caller's `pfds` (see [`pollin`]) is ready or `timeout` passes;
/// each entry's `revents` says (0: not ready). The caller owns and reuses the buffer, so a
/// loop polls without allocating. Returns how many entries are ready (0 on a timeout or
/// a signal).
pub fn poll_set(pfds: &mut [libc::pollfd], timeout: Duration) -> Result<usize> {
    ppoll(pfds, timeout)
}

fn ppoll(pfds: &mut [libc::pollfd], timeout: Duration) -> Result<usize> {
    for p in pfds.iter_mut() {
        p.revents = 0;
    }
    // ppoll: nanosecond timeouts, so a 0.64 ms RNR wait is not rounded to 0 (a spin) or
    // to 1 ms.
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `pfds` is a live, correctly sized array of pollfd; `ts` lives for the call;
    // a NULL sigmask keeps the current one.
    let n = unsafe {
        libc::ppoll(
            pfds.as_mut_ptr(),
            pfds.len() as libc::nfds_t,
            &ts,
            std::ptr::null(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            for p in pfds.iter_mut() {
                p.revents = 0;
            }
            return Ok(0);
        }
        return Err(Error::new(ErrorKind::Io, format!("poll: {e}")));
    }
    Ok(n as usize)
}

/// True when the TCP peer has closed (or reset) the connection on `fd`. Bytes the peer
/// sent after the handshake are read and dropped (nothing is expected there), so a
/// readable-but-open side channel does not make the caller's poll spin.
pub fn peer_closed(fd: RawFd) -> bool {
    let mut b = [0u8; 256];
    // Bounded: a misbehaving peer cannot keep us here.
    for _ in 0..16 {
        // SAFETY: reads at most `b.len()` bytes into `b`.
        let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
        if n == 0 {
            return true;
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
            );
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventfd_signals_until_cleared() {
        let e = EventFd::new().unwrap();
        let mut ready = Vec::new();
        poll_readable(&[e.raw_fd()], Duration::ZERO, &mut ready).unwrap();
        assert!(ready.is_empty());
        e.signal();
        e.signal();
        poll_readable(&[e.raw_fd()], Duration::ZERO, &mut ready).unwrap();
        assert_eq!(ready, vec![0]);
        e.clear();
        poll_readable(&[e.raw_fd()], Duration::ZERO, &mut ready).unwrap();
        assert!(ready.is_empty());
    }

    fn enosys(_: &mut [u8]) -> std::io::Result<usize> {
        Err(std::io::Error::from_raw_os_error(libc::ENOSYS))
    }

    #[test]
    fn without_getrandom_randomness_comes_from_the_fallback_file() {
        let dir = std::env::temp_dir().join(format!("rdmx-sys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("urandom");
        std::fs::write(&path, [1u8, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        let mut b = [0u8; 4];
        fill_random_from(&mut b, &mut enosys, &path).unwrap();
        assert_eq!(b, [1, 2, 3, 4]);
        // Always interrupted: bounded, then the fallback.
        let mut calls = 0;
        let mut eintr = |_: &mut [u8]| {
            calls += 1;
            Err(std::io::Error::from_raw_os_error(libc::EINTR))
        };
        let mut b = [0u8; 2];
        fill_random_from(&mut b, &mut eintr, &path).unwrap();
        assert_eq!(calls, GETRANDOM_TRIES);
        assert_eq!(b, [1, 2]);
        std::fs::remove_dir_all(&dir).unwrap();
        // The real fallback works too.
        let mut b = [0u8; 32];
        fill_random_from(&mut b, &mut enosys, std::path::Path::new(URANDOM)).unwrap();
        assert!(b.iter().any(|&x| x != 0));
    }

    #[test]
    fn without_any_source_randomness_fails_clearly_instead_of_looping() {
        let mut b = [0u8; 4];
        let e = fill_random_from(&mut b, &mut enosys, std::path::Path::new("/nonexistent/x"))
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(e.message().contains("getrandom(2): "), "{e}");
        assert!(e.message().contains("/nonexistent/x: "), "{e}");
    }

    #[test]
    fn short_getrandom_reads_are_continued() {
        let mut next = 10u8;
        let mut one_byte = |b: &mut [u8]| {
            b[0] = next;
            next += 1;
            Ok(1)
        };
        let mut b = [0u8; 4];
        fill_random_from(
            &mut b,
            &mut one_byte,
            std::path::Path::new("/nonexistent/x"),
        )
        .unwrap();
        assert_eq!(b, [10, 11, 12, 13]);
    }

    #[test]
    fn random_values_differ() {
        let v: Vec<u32> = (0..8).map(|_| try_random_u32().unwrap()).collect();
        assert!(v.windows(2).any(|w| w[0] != w[1]));
        let w: Vec<u64> = (0..8).map(|_| random_u64()).collect();
        assert!(w.windows(2).any(|p| p[0] != p[1]));
    }
}

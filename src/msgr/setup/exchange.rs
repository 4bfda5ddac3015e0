//! The blocking steps on the side channel: the hello exchange (tagged under the session key
//! when authenticated) and the ready byte, each within one deadline that a trickling peer
//! cannot stretch.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use super::*;
use crate::error::{Error, ErrorKind, Result};

/// Sends `mine` and receives the peer's hello, within `timeout` overall.
///
/// The write runs on a scoped thread (over a clone of the socket) while this thread reads:
/// both sides write first, and two hellos of up to ~96 KiB each could otherwise fill both
/// socket buffers and deadlock until the timeout. The length prefix is read first and
/// refused above [`MAX_ENCODED_LEN`] before anything is allocated.
///
/// The socket's read and write timeouts are set per call from one deadline (so a peer that
/// trickles bytes cannot stretch it) and restored to their previous values afterwards.
/// After an error the stream is shut down: the side channel is then unusable, drop it.
///
/// Errors: [`ErrorKind::InvalidArgument`] for an invalid `mine` or a zero timeout,
/// [`ErrorKind::Io`] for IO errors, EOF and timeouts, [`ErrorKind::Parse`] for a malformed
/// hello.
#[cfg(test)]
pub fn exchange(stream: &mut TcpStream, mine: &Hello, timeout: Duration) -> Result<Hello> {
    exchange_tagged(stream, mine, timeout, None)
}

/// [`exchange`] on an authenticated side channel: each hello is followed by a 32-byte
/// HMAC tag under the sending direction's session key (`keys`, and whether this side is
/// the client), and the peer's is checked in constant time before any field is used: a
/// hello whose QPN, PSN, address or regions were changed in transit, or a hello captured
/// from another connection, is refused with [`ErrorKind::Auth`].
pub fn exchange_tagged(
    stream: &mut TcpStream,
    mine: &Hello,
    timeout: Duration,
    keys: Option<(&crate::msgr::auth::SessionKeys, bool)>,
) -> Result<Hello> {
    mine.validate()?;
    with_deadline(stream, timeout, |stream, deadline, peer| {
        let mut out = mine.encode();
        if let Some((k, client)) = keys {
            let tag = k.tag(client, &out);
            out.extend_from_slice(&tag);
        }
        let writer = stream
            .try_clone()
            .map_err(|e| io_error(peer, "cloning the socket for the hello", e))?;
        std::thread::scope(|s| {
            let sent = s.spawn(move || {
                let mut writer = writer;
                write_all_by(&mut writer, &out, deadline, peer, "sending our hello")
            });
            let received = read_hello_tagged(stream, deadline, peer, keys);
            if received.is_err() {
                // Unblocks the writer if the peer is not reading.
                let _ = stream.shutdown(Shutdown::Both);
            }
            let sent = sent.join().expect("hello writer panicked");
            // The read error says more (e.g. "closed before sending") than the write's.
            let hello = received?;
            sent?;
            Ok(hello)
        })
    })
}

/// The one-byte "ready" step both sides take after bringing their QP to RTS: each writes
/// `b'R'` and reads the peer's, so neither sends RC traffic before the other's QP can
/// receive it (a packet to a QP still in INIT is dropped, costing a retransmission timeout).
///
/// A side may also take the step in two halves, [`await_ready`] then [`send_ready`]: the
/// peer writes its byte before reading, so reading first cannot deadlock with a peer that
/// calls `ready` (a listener reads the client's byte while its handshake runs on its own
/// and sends its own when the application accepts the connection).
///
/// Errors: [`ErrorKind::Io`] for IO errors, EOF and timeouts, [`ErrorKind::Parse`] if the
/// byte is not `b'R'`, [`ErrorKind::InvalidArgument`] for a zero timeout.
pub fn ready(stream: &mut TcpStream, timeout: Duration) -> Result<()> {
    with_deadline(stream, timeout, |stream, deadline, peer| {
        // One byte each way fits any socket buffer: no deadlock, no thread needed.
        write_ready_by(stream, deadline, peer)?;
        read_ready_by(stream, deadline, peer)
    })
}

/// The writing half of [`ready`]: sends our ready byte within `timeout`.
pub fn send_ready(stream: &mut TcpStream, timeout: Duration) -> Result<()> {
    with_deadline(stream, timeout, write_ready_by)
}

/// The reading half of [`ready`]: waits up to `timeout` for the peer's ready byte.
pub fn await_ready(stream: &mut TcpStream, timeout: Duration) -> Result<()> {
    with_deadline(stream, timeout, read_ready_by)
}

fn write_ready_by(stream: &mut TcpStream, deadline: Instant, peer: &str) -> Result<()> {
    write_all_by(stream, b"R", deadline, peer, "sending our ready byte")
}

fn read_ready_by(stream: &mut TcpStream, deadline: Instant, peer: &str) -> Result<()> {
    let mut b = [0u8; 1];
    read_exact_by(stream, &mut b, 0, deadline, peer, "the peer's ready byte")?;
    if b[0] != b'R' {
        return Err(Error::new(
            ErrorKind::Parse,
            format!(
                "side channel to {peer}: expected ready byte 0x52 ('R'), got {:#04x}",
                b[0]
            ),
        ));
    }
    Ok(())
}

/// Runs `f` with a deadline `timeout` from now, restoring the socket's timeouts afterwards
/// and shutting it down on error.
fn with_deadline<T>(
    stream: &mut TcpStream,
    timeout: Duration,
    f: impl FnOnce(&mut TcpStream, Instant, &str) -> Result<T>,
) -> Result<T> {
    if timeout.is_zero() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "side channel timeout: invalid value 0: must be positive",
        ));
    }
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "an unconnected peer".to_owned(), |a| a.to_string());
    let (old_read, old_write) = (
        stream.read_timeout().unwrap_or(None),
        stream.write_timeout().unwrap_or(None),
    );
    let deadline = Instant::now() + timeout;
    let result = f(stream, deadline, &peer);
    if result.is_err() {
        let _ = stream.shutdown(Shutdown::Both);
    }
    // Best effort: a failure here means the socket is already unusable, which the caller
    // learns on its next use.
    let _ = stream.set_read_timeout(old_read);
    let _ = stream.set_write_timeout(old_write);
    result
}

/// Reads one hello and, on an authenticated side channel, its tag (checked before the
/// hello is decoded).
fn read_hello_tagged(
    stream: &mut TcpStream,
    deadline: Instant,
    peer: &str,
    keys: Option<(&crate::msgr::auth::SessionKeys, bool)>,
) -> Result<Hello> {
    let Some((k, client)) = keys else {
        return read_hello(stream, deadline, peer);
    };
    let buf = read_hello_bytes(stream, deadline, peer)?;
    let mut tag = [0u8; 32];
    read_exact_by(stream, &mut tag, 0, deadline, peer, "the peer's hello tag")?;
    if !k.verify(!client, &buf, &tag) {
        return Err(Error::new(
            ErrorKind::Auth,
            format!(
                "side channel to {peer}: the peer's hello does not carry the session's tag \
                 (changed in transit, or replayed from another connection): refused"
            ),
        ));
    }
    Hello::decode(&buf).map_err(|e| {
        Error::new(
            ErrorKind::Parse,
            format!("side channel to {peer}: {}", e.message()),
        )
    })
}

/// Reads one hello: the length prefix, a bound check, then the rest.
fn read_hello(stream: &mut TcpStream, deadline: Instant, peer: &str) -> Result<Hello> {
    let buf = read_hello_bytes(stream, deadline, peer)?;
    Hello::decode(&buf).map_err(|e| {
        Error::new(
            ErrorKind::Parse,
            format!("side channel to {peer}: {}", e.message()),
        )
    })
}

/// The bytes of one hello, length prefix included.
fn read_hello_bytes(stream: &mut TcpStream, deadline: Instant, peer: &str) -> Result<Vec<u8>> {
    let mut prefix = [0u8; 4];
    read_exact_by(
        stream,
        &mut prefix,
        0,
        deadline,
        peer,
        "the peer's hello length prefix",
    )?;
    let len = u32::from_be_bytes(prefix) as usize;
    if !(MIN_ENCODED_LEN..=MAX_ENCODED_LEN).contains(&len) {
        return Err(Error::new(
            ErrorKind::Parse,
            format!(
                "side channel to {peer}: hello length {len} out of range \
                 {MIN_ENCODED_LEN}..={MAX_ENCODED_LEN} (first bytes \"{}\"); \
                 is the peer rdmx?",
                prefix.escape_ascii()
            ),
        ));
    }
    let mut buf = vec![0u8; len];
    buf[..4].copy_from_slice(&prefix);
    read_exact_by(stream, &mut buf, 4, deadline, peer, "the peer's hello")?;
    Ok(buf)
}

/// Time left until `deadline`, or a timeout error naming `what` was being waited for.
fn remaining(deadline: Instant, peer: &str, what: &str) -> Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(timed_out(peer, what))
    } else {
        Ok(left)
    }
}

fn timed_out(peer: &str, what: &str) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("side channel to {peer}: timed out {what}"),
    )
}

/// The peer closed the side channel (EOF). `ErrorKind::Io` for now, like timeouts; this and
/// [`timed_out`] are the only places to change for finer kinds.
fn closed(peer: &str, when: &str) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("side channel to {peer}: peer closed the connection {when}"),
    )
}

fn io_error(peer: &str, what: &str, e: io::Error) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("side channel to {peer}: {what}: {e}"),
    )
}

/// Whether an IO error is a socket timeout (`SO_RCVTIMEO`/`SO_SNDTIMEO` report `EAGAIN`).
fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Fills `buf[done..]` (the first `done` bytes are already there: counts in messages cover the
/// whole of `buf`) by `deadline`.
fn read_exact_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    mut done: usize,
    deadline: Instant,
    peer: &str,
    what: &str,
) -> Result<()> {
    while done < buf.len() {
        let wait = format!(
            "waiting for {what} ({done} of {} bytes received)",
            buf.len()
        );
        let left = remaining(deadline, peer, &wait)?;
        stream
            .set_read_timeout(Some(left))
            .map_err(|e| io_error(peer, "setting the read timeout", e))?;
        match stream.read(&mut buf[done..]) {
            Ok(0) => {
                return Err(closed(
                    peer,
                    &format!(
                        "before sending {what} ({done} of {} bytes received)",
                        buf.len()
                    ),
                ));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // The socket's timeout counts kernel ticks and can end up to a tick before
            // the deadline (a 200 ms wait measured 199.0 ms): the deadline decides, in
            // `remaining` at the top of the loop.
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(io_error(peer, &format!("reading {what}"), e)),
        }
    }
    Ok(())
}

/// Writes all of `buf` by `deadline`.
fn write_all_by(
    stream: &mut TcpStream,
    buf: &[u8],
    deadline: Instant,
    peer: &str,
    what: &str,
) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let wait = format!("{what} ({done} of {} bytes sent)", buf.len());
        let left = remaining(deadline, peer, &wait)?;
        stream
            .set_write_timeout(Some(left))
            .map_err(|e| io_error(peer, "setting the write timeout", e))?;
        match stream.write(&buf[done..]) {
            Ok(0) => {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("side channel to {peer}: {what}: the socket accepted no bytes"),
                ));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // As in `read_exact_by`: the deadline decides, not the socket's tick.
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(io_error(peer, what, e)),
        }
    }
    Ok(())
}

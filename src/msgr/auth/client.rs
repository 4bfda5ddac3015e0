//! The connecting side of the exchange (blocking, with one deadline).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use super::proto::{self, Ephemeral, Frame, Mode, Opening, RefuseCode};
use super::{AuthConfig, Authenticated, SessionKeys, auth_error};
use crate::error::{Error, ErrorKind, Result};

/// Authenticates to the listener at the other end of `tcp` by `deadline`. Returns what
/// was established; `ErrorKind::Auth` when either side refuses the other.
pub fn run(tcp: &mut TcpStream, cfg: &AuthConfig, deadline: Instant) -> Result<Authenticated> {
    let peer = tcp
        .peer_addr()
        .map_or_else(|_| "the peer".to_string(), |a| a.to_string());
    let keyring = cfg.keyring();
    let secret = if cfg.required {
        let k = keyring.as_ref().and_then(|k| k.secret(&cfg.entity));
        Some(k.ok_or_else(|| {
            auth_error(format!(
                "connect to {peer}: auth_entity {} has no key in the keyring",
                cfg.entity
            ))
        })?)
    } else {
        None
    };
    let eph = Ephemeral::new()?;
    let mine = Opening {
        version: proto::AUTH_VERSION,
        mode: if secret.is_some() {
            Mode::Secret
        } else {
            Mode::None
        },
        nonce: proto::nonce()?,
        public: eph.public,
        entity: cfg.entity.clone(),
    };
    write_frame(tcp, &Frame::ClientHello(mine.clone()), deadline, &peer)?;
    let Some(k) = secret else {
        return match read_frame(tcp, deadline, &peer)? {
            Frame::Accept(_) => Ok(Authenticated::default()),
            Frame::Refuse(code, text) => Err(refused(&peer, code, &text)),
            f => Err(unexpected(&peer, &f)),
        };
    };
    let theirs = match read_frame(tcp, deadline, &peer)? {
        Frame::ServerHello(o) if o.mode == Mode::Secret => o,
        Frame::Refuse(code, text) => return Err(refused(&peer, code, &text)),
        f => return Err(unexpected(&peer, &f)),
    };
    if theirs.nonce == mine.nonce || theirs.public == mine.public {
        return Err(auth_error(format!(
            "authentication with {peer}: the server echoed our challenge (a reflection): refused"
        )));
    }
    let th = proto::transcript_hash(&mine, &theirs);
    write_frame(
        tcp,
        &Frame::ClientFinish(proto::client_proof(k, &th)),
        deadline,
        &peer,
    )?;
    let proof = match read_frame(tcp, deadline, &peer)? {
        Frame::Accept(p) => p,
        Frame::Refuse(code, text) => return Err(refused(&peer, code, &text)),
        f => return Err(unexpected(&peer, &f)),
    };
    if !proto::verify_server(k, &th, &proof) {
        return Err(auth_error(format!(
            "authentication with {peer}: the server ({}) did not prove it holds the key of {}: \
             the keys differ, or this is not the server meant",
            theirs.entity, cfg.entity
        )));
    }
    let dh = eph.agree(&theirs.public).ok_or_else(|| {
        auth_error(format!(
            "authentication with {peer}: the server's ephemeral key is a low-order point"
        ))
    })?;
    Ok(Authenticated {
        peer_entity: Some(theirs.entity),
        keys: Some(SessionKeys::derive(k, &dh, &th)),
    })
}

fn refused(peer: &str, code: RefuseCode, text: &str) -> Error {
    let why = match code {
        RefuseCode::Failed => "authentication failed",
        RefuseCode::Required => "the listener requires authentication",
        RefuseCode::Unavailable => "the listener does not authenticate (it has no keyring)",
        RefuseCode::Busy => "too many handshakes",
        RefuseCode::Protocol => "protocol error",
    };
    let kind = if code == RefuseCode::Busy {
        ErrorKind::Full
    } else {
        ErrorKind::Auth
    };
    Error::new(
        kind,
        // The server's text says it (e.g. "authentication failed"); the code's words
        // are for a refusal without one.
        format!(
            "{peer} refused the connection: {}",
            if text.is_empty() { why } else { text }
        ),
    )
}

fn unexpected(peer: &str, f: &Frame) -> Error {
    let name = match f {
        Frame::ClientHello(_) => "a client hello",
        Frame::ServerHello(_) => "a server hello of another mode",
        Frame::ClientFinish(_) => "a client finish",
        Frame::Accept(_) => "an accept before any proof",
        Frame::Refuse(..) => "a refusal",
    };
    auth_error(format!(
        "authentication with {peer}: unexpected frame: {name}"
    ))
}

fn left(deadline: Instant, peer: &str, what: &str) -> Result<std::time::Duration> {
    let l = deadline.saturating_duration_since(Instant::now());
    if l.is_zero() {
        return Err(Error::new(
            ErrorKind::Timeout,
            format!("authentication with {peer}: timed out {what}"),
        ));
    }
    Ok(l)
}

fn io(peer: &str, what: &str, e: std::io::Error) -> Error {
    let kind = if matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ) {
        ErrorKind::Timeout
    } else {
        ErrorKind::Io
    };
    Error::new(kind, format!("authentication with {peer}: {what}: {e}"))
}

pub(crate) fn write_frame(
    tcp: &mut TcpStream,
    f: &Frame,
    deadline: Instant,
    peer: &str,
) -> Result<()> {
    tcp.set_write_timeout(Some(left(deadline, peer, "sending")?))
        .map_err(|e| io(peer, "send timeout", e))?;
    tcp.write_all(&f.encode())
        .map_err(|e| io(peer, "sending an auth frame", e))
}

/// Reads one frame (at most [`proto::MAX_FRAME`] bytes) by `deadline`.
pub(crate) fn read_frame(tcp: &mut TcpStream, deadline: Instant, peer: &str) -> Result<Frame> {
    let mut buf = vec![0u8; 8];
    let mut have = 0;
    let mut want = 8;
    loop {
        while have < want {
            tcp.set_read_timeout(Some(left(deadline, peer, "waiting for an auth frame")?))
                .map_err(|e| io(peer, "read timeout", e))?;
            match tcp.read(&mut buf[have..want]) {
                Ok(0) => {
                    return Err(Error::new(
                        ErrorKind::Closed,
                        format!(
                            "authentication with {peer}: the peer closed the connection \
                             ({have} bytes of an auth frame received)"
                        ),
                    ));
                }
                Ok(n) => have += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(peer, "waiting for an auth frame", e)),
            }
        }
        let len = Frame::length(&buf[..have])
            .map_err(|m| Error::new(ErrorKind::Auth, format!("authentication with {peer}: {m}")))?
            .unwrap_or(8);
        if len <= have {
            break;
        }
        buf.resize(len, 0);
        want = len;
    }
    let r = Frame::decode(&buf[..want]);
    r.map_err(|m| Error::new(ErrorKind::Auth, format!("authentication with {peer}: {m}")))
}

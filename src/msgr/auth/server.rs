//! The accepting side of the exchange as a state machine fed the bytes that arrived (no
//! IO, no clock): [`gate`](super::gate) drives one per unauthenticated connection.

use super::proto::{self, Ephemeral, Frame, Mode, Opening, RefuseCode};
use super::{AuthConfig, Authenticated, SessionKeys};
use zeroize::Zeroizing;

/// What the gate does next with a connection.
#[derive(Debug)]
pub enum Step {
    /// Needs more bytes (after sending `send`, if any).
    Wait(Vec<u8>),
    /// Authenticated (or `auth = none` and the client said so): send `send`, then set up
    /// the connection.
    Done(Vec<u8>, Authenticated),
    /// Refused: send `send` (a Refuse frame) and close. `reason` is for the log line only
    /// (the client is told less); `entity` what the client claimed, if it said.
    Fail {
        send: Vec<u8>,
        reason: String,
        entity: Option<String>,
        /// A limit or a malformed frame rather than a failed proof.
        protocol: bool,
    },
}

enum State {
    Hello,
    /// Boxed: a waiting connection's state is small until its client said hello.
    Finish(Box<Finish>),
    Over,
}

struct Finish {
    client: Opening,
    server: Opening,
    eph: Ephemeral,
    /// The client's secret, or a random stand-in for an unknown entity (so that an
    /// unknown name fails at the same step, with the same answer, as a wrong key).
    key: Zeroizing<Vec<u8>>,
    known: bool,
}

/// A refusal: the client is told the code's text only for a failed proof (no hint of
/// which check failed), the reason otherwise.
fn refuse(code: RefuseCode, reason: String, protocol: bool, entity: Option<String>) -> Step {
    let told = match code {
        RefuseCode::Failed => "authentication failed".to_string(),
        _ => reason.clone(),
    };
    Step::Fail {
        send: Frame::Refuse(code, told).encode(),
        reason,
        entity,
        protocol,
    }
}

/// One connection's server side.
pub struct ServerHandshake {
    buf: Vec<u8>,
    state: State,
}

impl Default for ServerHandshake {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerHandshake {
    pub fn new() -> ServerHandshake {
        ServerHandshake {
            buf: Vec::new(),
            state: State::Hello,
        }
    }

    /// The client entity claimed so far.
    pub fn claimed(&self) -> Option<&str> {
        match &self.state {
            State::Finish(f) => Some(&f.client.entity),
            _ => None,
        }
    }

    /// The nonce this side issued, while it waits for the client's proof.
    pub fn issued_nonce(&self) -> Option<[u8; proto::N]> {
        match &self.state {
            State::Finish(f) => Some(f.server.nonce),
            _ => None,
        }
    }

    /// Feeds bytes read from the connection. `reflected` says whether a nonce is one this
    /// listener issued to another connection (a reflected challenge).
    pub fn on_bytes(
        &mut self,
        data: &[u8],
        cfg: &AuthConfig,
        reflected: &dyn Fn(&[u8; proto::N]) -> bool,
    ) -> Step {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            let len = match Frame::length(&self.buf) {
                Ok(Some(len)) => len,
                Ok(None) => return Step::Wait(out),
                Err(m) => return self.fail(RefuseCode::Protocol, m, true),
            };
            if self.buf.len() < len {
                return Step::Wait(out);
            }
            let frame: Vec<u8> = self.buf.drain(..len).collect();
            let frame = match Frame::decode(&frame) {
                Ok(f) => f,
                Err(m) => return self.fail(RefuseCode::Protocol, m, true),
            };
            match self.on_frame(frame, cfg, reflected) {
                Step::Wait(send) => out.extend(send),
                Step::Done(send, a) => {
                    out.extend(send);
                    if !self.buf.is_empty() {
                        return self.fail(
                            RefuseCode::Protocol,
                            "bytes after the last auth frame".into(),
                            true,
                        );
                    }
                    return Step::Done(out, a);
                }
                fail => return fail,
            }
        }
    }

    fn fail(&mut self, code: RefuseCode, reason: String, protocol: bool) -> Step {
        let entity = self.claimed().map(str::to_string);
        self.state = State::Over;
        refuse(code, reason, protocol, entity)
    }

    fn on_frame(
        &mut self,
        frame: Frame,
        cfg: &AuthConfig,
        reflected: &dyn Fn(&[u8; proto::N]) -> bool,
    ) -> Step {
        match (std::mem::replace(&mut self.state, State::Over), frame) {
            (State::Hello, Frame::ClientHello(c)) => self.on_client_hello(c, cfg, reflected),
            (State::Finish(f), Frame::ClientFinish(proof)) => {
                let Finish {
                    client,
                    server,
                    eph,
                    key,
                    known,
                } = *f;
                let who = Some(client.entity.clone());
                let th = proto::transcript_hash(&client, &server);
                let ok = proto::verify_client(&key, &th, &proof);
                if !known {
                    return refuse(RefuseCode::Failed, "unknown entity".into(), false, who);
                }
                if !ok {
                    let why = "wrong proof (a different key, or a replayed exchange)";
                    return refuse(RefuseCode::Failed, why.into(), false, who);
                }
                let Some(dh) = eph.agree(&client.public) else {
                    let why = "low-order ephemeral key";
                    return refuse(RefuseCode::Failed, why.into(), false, who);
                };
                self.state = State::Over;
                Step::Done(
                    Frame::Accept(proto::server_proof(&key, &th)).encode(),
                    Authenticated {
                        peer_entity: Some(client.entity),
                        keys: Some(SessionKeys::derive(&key, &dh, &th)),
                    },
                )
            }
            (_, f) => {
                let what = match f {
                    Frame::ClientHello(_) => "a second client hello",
                    Frame::ClientFinish(_) => "a finish before the hello",
                    _ => "a server's frame from a client",
                };
                self.fail(RefuseCode::Protocol, format!("unexpected {what}"), true)
            }
        }
    }

    fn on_client_hello(
        &mut self,
        c: Opening,
        cfg: &AuthConfig,
        reflected: &dyn Fn(&[u8; proto::N]) -> bool,
    ) -> Step {
        if c.version != proto::AUTH_VERSION {
            return self.fail(
                RefuseCode::Protocol,
                format!(
                    "auth version {} (this build speaks {})",
                    c.version,
                    proto::AUTH_VERSION
                ),
                true,
            );
        }
        let entity = c.entity.clone();
        match (c.mode, cfg.required) {
            (Mode::None, false) => {
                self.state = State::Over;
                return Step::Done(
                    Frame::Accept([0; proto::N]).encode(),
                    Authenticated::default(),
                );
            }
            (Mode::None, true) => {
                self.state = State::Over;
                return Step::Fail {
                    send: Frame::Refuse(
                        RefuseCode::Required,
                        "this listener requires authentication: set auth_keyring and auth_entity"
                            .into(),
                    )
                    .encode(),
                    reason: "the client offered no authentication (auth=none)".into(),
                    entity: Some(entity),
                    protocol: false,
                };
            }
            (Mode::Secret, false) => {
                self.state = State::Over;
                return Step::Fail {
                    send: Frame::Refuse(
                        RefuseCode::Unavailable,
                        "this listener does not authenticate (auth=none: it has no keyring)".into(),
                    )
                    .encode(),
                    reason: "the client asked for authentication; this side has no keyring".into(),
                    entity: Some(entity),
                    protocol: false,
                };
            }
            (Mode::Secret, true) => {}
        }
        if reflected(&c.nonce) {
            self.state = State::Over;
            return Step::Fail {
                send: Frame::Refuse(RefuseCode::Failed, "authentication failed".into()).encode(),
                reason: "reflected challenge: the client's nonce is one this listener issued"
                    .into(),
                entity: Some(entity),
                protocol: false,
            };
        }
        let (eph, nonce) = match (Ephemeral::new(), proto::nonce()) {
            (Ok(e), Ok(n)) => (e, n),
            (Err(e), _) | (_, Err(e)) => {
                return self.fail(RefuseCode::Protocol, format!("randomness: {e}"), true);
            }
        };
        let keyring = cfg.keyring();
        let secret = keyring.as_ref().and_then(|k| k.secret(&c.entity));
        let known = secret.is_some();
        let key = Zeroizing::new(match secret {
            Some(k) => k.to_vec(),
            None => proto::nonce().map(|n| n.to_vec()).unwrap_or_default(),
        });
        let server = Opening {
            version: proto::AUTH_VERSION,
            mode: Mode::Secret,
            nonce,
            public: eph.public,
            entity: cfg.entity.clone(),
        };
        let send = Frame::ServerHello(server.clone()).encode();
        self.state = State::Finish(Box::new(Finish {
            client: c,
            server,
            eph,
            key,
            known,
        }));
        Step::Wait(send)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn cfg(keyring: &str) -> AuthConfig {
        // One directory per call: tests run in parallel threads of one process, and two
        // with keyrings of the same length shared a directory that one removed while the
        // other wrote.
        static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rdmx-server-sm-{}-{}",
            std::process::id(),
            CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("k");
        std::fs::write(&p, keyring).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut c = Config::new();
        c.set("auth_keyring", p.to_str().unwrap()).unwrap();
        c.set("auth_entity", "osd.0").unwrap();
        let a = AuthConfig::from_config(&c).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        a
    }

    const RING: &str = "[client.a]\nkey = AAECAwQFBgcICQoLDA0ODw==\n";
    const KEY: [u8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

    fn hello(eph: &Ephemeral, nonce: u8, entity: &str) -> Opening {
        Opening {
            version: proto::AUTH_VERSION,
            mode: Mode::Secret,
            nonce: [nonce; 32],
            public: eph.public,
            entity: entity.into(),
        }
    }

    /// Runs a client against the machine with literal ephemeral keys; `key` is the client's.
    fn exchange(c: &AuthConfig, key: &[u8], entity: &str) -> (Step, Option<Opening>) {
        let mut hs = ServerHandshake::new();
        let eph = Ephemeral::from_bytes([3; 32]);
        let mine = hello(&eph, 1, entity);
        let Step::Wait(out) =
            hs.on_bytes(&Frame::ClientHello(mine.clone()).encode(), c, &|_| false)
        else {
            panic!("no server hello")
        };
        let Ok(Frame::ServerHello(theirs)) = Frame::decode(&out) else {
            panic!("not a server hello")
        };
        let th = proto::transcript_hash(&mine, &theirs);
        let finish = Frame::ClientFinish(proto::client_proof(key, &th)).encode();
        // Byte by byte: frames split anywhere are reassembled.
        let mut last = None;
        for b in &finish {
            last = Some(hs.on_bytes(std::slice::from_ref(b), c, &|_| false));
        }
        (last.unwrap(), Some(theirs))
    }

    #[test]
    fn right_key_passes_with_keys_both_sides_agree_on() {
        let c = cfg(RING);
        let (step, theirs) = exchange(&c, &KEY, "client.a");
        let Step::Done(out, auth) = step else {
            panic!("{step:?}")
        };
        assert_eq!(auth.peer_entity.as_deref(), Some("client.a"));
        let Ok(Frame::Accept(proof)) = Frame::decode(&out) else {
            panic!()
        };
        let eph = Ephemeral::from_bytes([3; 32]);
        let mine = hello(&eph, 1, "client.a");
        let theirs = theirs.unwrap();
        let th = proto::transcript_hash(&mine, &theirs);
        assert!(proto::verify_server(&KEY, &th, &proof));
        // The client derives the same keys.
        let dh = eph.agree(&theirs.public).unwrap();
        let k = SessionKeys::derive(&KEY, &dh, &th);
        let server_keys = auth.keys.unwrap();
        assert!(server_keys.verify(true, b"x", &k.tag(true, b"x")));
    }

    #[test]
    fn wrong_key_unknown_entity_and_garbage_fail() {
        let c = cfg(RING);
        let (step, _) = exchange(&c, &[9; 16], "client.a");
        assert!(
            matches!(step, Step::Fail { protocol: false, ref reason, .. } if reason.contains("wrong proof"))
        );
        let (step, _) = exchange(&c, &KEY, "client.b");
        assert!(
            matches!(step, Step::Fail { protocol: false, ref reason, .. } if reason == "unknown entity")
        );
        let mut hs = ServerHandshake::new();
        let step = hs.on_bytes(b"\x00\x00\x00\x10RDXA\x03junkjunk", &c, &|_| false);
        assert!(
            matches!(step, Step::Fail { protocol: true, .. }),
            "{step:?}"
        );
        // A finish first.
        let mut hs = ServerHandshake::new();
        let step = hs.on_bytes(&Frame::ClientFinish([0; 32]).encode(), &c, &|_| false);
        assert!(
            matches!(step, Step::Fail { protocol: true, ref reason, .. } if reason.contains("finish before"))
        );
        // A reflected nonce.
        let mut hs = ServerHandshake::new();
        let eph = Ephemeral::from_bytes([3; 32]);
        let f = Frame::ClientHello(hello(&eph, 1, "client.a")).encode();
        let step = hs.on_bytes(&f, &c, &|n| n == &[1; 32]);
        assert!(
            matches!(step, Step::Fail { protocol: false, ref reason, .. } if reason.contains("reflected"))
        );
    }
}

//! The authentication exchange's frames and cryptography (no IO).
//!
//! ```text
//! client                                         server
//! ClientHello{version, mode, nonce_c, pub_c, entity_c} ->
//!                   <- ServerHello{version, mode, nonce_s, pub_s, entity_s}
//! ClientFinish{proof_c}                                ->   (server checks proof_c)
//!                   <- Accept{proof_s} or Refuse{code, text}
//! (client checks proof_s; both derive the session keys; then the QP hellos, each
//!  followed by an HMAC tag under the direction's key)
//! ```
//!
//! - `th = SHA-256(transcript)`, the transcript being a label, the version, both entity
//!   names (length-prefixed), both nonces and both X25519 public keys: every proof binds
//!   all of them, so a proof from another exchange (a replay) or of the other role (a
//!   reflected challenge: the labels differ) does not verify.
//! - `proof_c = HMAC-SHA256(K, "rdmx-auth client proof" || th)`,
//!   `proof_s = HMAC-SHA256(K, "rdmx-auth server proof" || th)`, K the client entity's
//!   secret from the keyring. Compared in constant time (`hmac`'s `verify_slice`, built on
//!   `subtle`).
//! - Session keys: HKDF-SHA256 with salt `th` over `K || X25519(eph_c, eph_s)`: the ephemeral
//!   exchange gives forward secrecy (a key leaked later does not open a recorded session),
//!   K makes a relay that lacks it unable to derive them. Expanded to one key per direction
//!   for the hello tags and a session key.
//!
//! Frames: `len u32 (whole frame) | "RDXA" | type u8 | body`, at most [`MAX_FRAME`] bytes;
//! decoding is total (any bytes give a frame or a message, never a panic).

use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use super::keyring::{MAX_ENTITY, valid_entity};

type HmacSha256 = Hmac<Sha256>;

/// Frame magic: tells an auth frame from an rdmx hello ("RDMX") or a stray client.
pub const MAGIC: [u8; 4] = *b"RDXA";
/// Version of this exchange (bound into every proof).
pub const AUTH_VERSION: u16 = 1;
/// Largest frame either side accepts: a peer cannot make us allocate more before it
/// authenticated.
pub const MAX_FRAME: usize = 512;
/// Header bytes: length, magic, type.
pub const HEADER: usize = 4 + 4 + 1;
/// Bytes of a nonce, a public key, a proof, a tag.
pub const N: usize = 32;
/// Longest refusal text.
pub const MAX_TEXT: usize = 256;

/// What a ClientHello asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No authentication (`auth = none` on the client).
    None = 0,
    /// The shared-secret challenge-response.
    Secret = 1,
}

/// Why a server refused (the client maps every code to `ErrorKind::Auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseCode {
    /// Wrong key, unknown entity, bad proof, replay or reflection: one code, so a prober
    /// learns nothing of which.
    Failed = 1,
    /// The server requires authentication and the client offered none.
    Required = 2,
    /// The client asked for authentication and the server has no keyring.
    Unavailable = 3,
    /// A handshake limit (per source address, total) was reached.
    Busy = 4,
    /// A malformed frame.
    Protocol = 5,
}

impl RefuseCode {
    fn from_u8(v: u8) -> Option<RefuseCode> {
        Some(match v {
            1 => RefuseCode::Failed,
            2 => RefuseCode::Required,
            3 => RefuseCode::Unavailable,
            4 => RefuseCode::Busy,
            5 => RefuseCode::Protocol,
            _ => return None,
        })
    }
}

/// One side's opening: both hellos share the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opening {
    pub version: u16,
    pub mode: Mode,
    pub nonce: [u8; N],
    pub public: [u8; N],
    pub entity: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    ClientHello(Opening),
    ServerHello(Opening),
    ClientFinish([u8; N]),
    Accept([u8; N]),
    Refuse(RefuseCode, String),
}

const T_CLIENT_HELLO: u8 = 1;
const T_SERVER_HELLO: u8 = 2;
const T_CLIENT_FINISH: u8 = 3;
const T_ACCEPT: u8 = 4;
const T_REFUSE: u8 = 5;

impl Frame {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; 4];
        b.extend_from_slice(&MAGIC);
        match self {
            Frame::ClientHello(o) | Frame::ServerHello(o) => {
                b.push(if matches!(self, Frame::ClientHello(_)) {
                    T_CLIENT_HELLO
                } else {
                    T_SERVER_HELLO
                });
                b.extend_from_slice(&o.version.to_be_bytes());
                b.push(o.mode as u8);
                b.extend_from_slice(&o.nonce);
                b.extend_from_slice(&o.public);
                let name = &o.entity.as_bytes()[..o.entity.len().min(MAX_ENTITY)];
                b.push(name.len() as u8);
                b.extend_from_slice(name);
            }
            Frame::ClientFinish(p) => {
                b.push(T_CLIENT_FINISH);
                b.extend_from_slice(p);
            }
            Frame::Accept(p) => {
                b.push(T_ACCEPT);
                b.extend_from_slice(p);
            }
            Frame::Refuse(code, text) => {
                b.push(T_REFUSE);
                b.push(*code as u8);
                let mut end = text.len().min(MAX_TEXT);
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                b.push(end as u8);
                b.extend_from_slice(&text.as_bytes()[..end]);
            }
        }
        let len = b.len() as u32;
        b[..4].copy_from_slice(&len.to_be_bytes());
        b
    }

    /// How many bytes the frame starting `buf` has, once its length prefix is in: `Ok(None)`
    /// with fewer than 4 bytes, an error for a length out of range or a bad magic (as soon
    /// as 8 bytes are in).
    pub fn length(buf: &[u8]) -> Result<Option<usize>, String> {
        if buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if !(HEADER..=MAX_FRAME).contains(&len) {
            return Err(format!(
                "auth frame length {len} out of range {HEADER}..={MAX_FRAME} (first bytes \"{}\"); \
                 is the peer rdmx? (of a version with authentication)",
                buf[..4].escape_ascii()
            ));
        }
        if buf.len() >= 8 && buf[4..8] != MAGIC {
            return Err(format!(
                "auth frame: bad magic {:02x?}: expected \"RDXA\" (a peer without authentication \
                 support, or not rdmx)",
                &buf[4..8]
            ));
        }
        Ok(Some(len))
    }

    /// Decodes one whole frame. Total: never panics.
    pub fn decode(buf: &[u8]) -> Result<Frame, String> {
        let len = Frame::length(buf)?.ok_or("auth frame: truncated length prefix")?;
        if len != buf.len() {
            return Err(format!(
                "auth frame: length prefix {len}, {} bytes given",
                buf.len()
            ));
        }
        if buf.len() < HEADER {
            return Err("auth frame: truncated header".into());
        }
        let body = &buf[HEADER..];
        let exact = |n: usize, what: &str| {
            if body.len() == n {
                Ok(())
            } else {
                Err(format!(
                    "auth {what}: {} body bytes, {n} expected",
                    body.len()
                ))
            }
        };
        match buf[8] {
            t @ (T_CLIENT_HELLO | T_SERVER_HELLO) => {
                let fixed = 2 + 1 + N + N + 1;
                if body.len() < fixed {
                    return Err(format!("auth hello: truncated: {} body bytes", body.len()));
                }
                let version = u16::from_be_bytes([body[0], body[1]]);
                let mode = match body[2] {
                    0 => Mode::None,
                    1 => Mode::Secret,
                    m => return Err(format!("auth hello: unknown mode {m}")),
                };
                let nonce: [u8; N] = body[3..3 + N].try_into().map_err(|_| "nonce")?;
                let public: [u8; N] = body[3 + N..3 + 2 * N].try_into().map_err(|_| "key")?;
                let nlen = usize::from(body[fixed - 1]);
                exact(fixed + nlen, "hello")?;
                let entity = std::str::from_utf8(&body[fixed..])
                    .ok()
                    .filter(|s| valid_entity(s))
                    .ok_or_else(|| {
                        format!(
                            "auth hello: invalid entity name \"{}\"",
                            body[fixed..].escape_ascii()
                        )
                    })?
                    .to_string();
                let o = Opening {
                    version,
                    mode,
                    nonce,
                    public,
                    entity,
                };
                Ok(if t == T_CLIENT_HELLO {
                    Frame::ClientHello(o)
                } else {
                    Frame::ServerHello(o)
                })
            }
            T_CLIENT_FINISH => {
                exact(N, "finish")?;
                Ok(Frame::ClientFinish(body.try_into().map_err(|_| "proof")?))
            }
            T_ACCEPT => {
                exact(N, "accept")?;
                Ok(Frame::Accept(body.try_into().map_err(|_| "proof")?))
            }
            T_REFUSE => {
                if body.len() < 2 {
                    return Err("auth refuse: truncated".into());
                }
                let code = RefuseCode::from_u8(body[0]).unwrap_or(RefuseCode::Failed);
                exact(2 + usize::from(body[1]), "refuse")?;
                Ok(Frame::Refuse(
                    code,
                    String::from_utf8_lossy(&body[2..]).into_owned(),
                ))
            }
            t => Err(format!("auth frame: unknown type {t}")),
        }
    }
}

/// The hash of everything both proofs bind.
pub fn transcript_hash(client: &Opening, server: &Opening) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"rdmx-auth transcript v1");
    h.update(AUTH_VERSION.to_be_bytes());
    for o in [client, server] {
        h.update([o.entity.len() as u8]);
        h.update(o.entity.as_bytes());
    }
    h.update(client.nonce);
    h.update(server.nonce);
    h.update(client.public);
    h.update(server.public);
    h.finalize().into()
}

const CLIENT_LABEL: &[u8] = b"rdmx-auth client proof";
const SERVER_LABEL: &[u8] = b"rdmx-auth server proof";

fn mac(key: &[u8], label: &[u8], data: &[u8]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    m.update(label);
    m.update(data);
    m
}

/// The client's proof over `th` with secret `k`.
pub fn client_proof(k: &[u8], th: &[u8; 32]) -> [u8; N] {
    mac(k, CLIENT_LABEL, th).finalize().into_bytes().into()
}

/// The server's proof over `th` with secret `k`.
pub fn server_proof(k: &[u8], th: &[u8; 32]) -> [u8; N] {
    mac(k, SERVER_LABEL, th).finalize().into_bytes().into()
}

/// Checks a client proof in constant time.
pub fn verify_client(k: &[u8], th: &[u8; 32], proof: &[u8; N]) -> bool {
    mac(k, CLIENT_LABEL, th).verify_slice(proof).is_ok()
}

/// Checks a server proof in constant time.
pub fn verify_server(k: &[u8], th: &[u8; 32], proof: &[u8; N]) -> bool {
    mac(k, SERVER_LABEL, th).verify_slice(proof).is_ok()
}

/// The keys an authenticated side channel uses after the proofs.
#[derive(Clone)]
pub struct SessionKeys {
    /// Tags what the client sends.
    pub c2s: Zeroizing<[u8; 32]>,
    /// Tags what the server sends.
    pub s2c: Zeroizing<[u8; 32]>,
    /// For what later binds to this session.
    pub session: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}

impl SessionKeys {
    /// HKDF-SHA256(salt = th, ikm = K || dh) expanded per direction.
    pub fn derive(k: &[u8], dh: &[u8; 32], th: &[u8; 32]) -> SessionKeys {
        let mut ikm = Zeroizing::new(Vec::with_capacity(k.len() + 32));
        ikm.extend_from_slice(k);
        ikm.extend_from_slice(dh);
        let hk = Hkdf::<Sha256>::new(Some(th), &ikm);
        let expand = |info: &[u8]| {
            let mut out = Zeroizing::new([0u8; 32]);
            hk.expand(info, out.as_mut())
                .expect("32 bytes is a valid HKDF-SHA256 length");
            out
        };
        SessionKeys {
            c2s: expand(b"rdmx-auth hello c2s"),
            s2c: expand(b"rdmx-auth hello s2c"),
            session: expand(b"rdmx-auth session"),
        }
    }

    /// The tag of `bytes` sent by the client (`from_client`) or the server.
    pub fn tag(&self, from_client: bool, bytes: &[u8]) -> [u8; N] {
        let k = if from_client { &self.c2s } else { &self.s2c };
        mac(k.as_ref(), b"rdmx hello", bytes)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Checks a tag in constant time.
    pub fn verify(&self, from_client: bool, bytes: &[u8], tag: &[u8]) -> bool {
        let k = if from_client { &self.c2s } else { &self.s2c };
        mac(k.as_ref(), b"rdmx hello", bytes)
            .verify_slice(tag)
            .is_ok()
    }
}

/// An ephemeral X25519 key pair from kernel randomness.
pub struct Ephemeral {
    secret: x25519_dalek::StaticSecret,
    pub public: [u8; N],
}

impl Ephemeral {
    pub fn new() -> crate::error::Result<Ephemeral> {
        let mut b = Zeroizing::new([0u8; 32]);
        crate::provider::sys::fill_random(b.as_mut())?;
        Ok(Ephemeral::from_bytes(*b))
    }

    /// From given secret bytes (tests with literal inputs).
    pub fn from_bytes(b: [u8; 32]) -> Ephemeral {
        let secret = x25519_dalek::StaticSecret::from(b);
        let public = x25519_dalek::PublicKey::from(&secret).to_bytes();
        Ephemeral { secret, public }
    }

    /// The shared secret with `peer`, or None for a non-contributory result (a low-order
    /// point that would force a known shared value).
    pub fn agree(&self, peer: &[u8; N]) -> Option<Zeroizing<[u8; 32]>> {
        let s = self
            .secret
            .diffie_hellman(&x25519_dalek::PublicKey::from(*peer));
        s.was_contributory().then(|| Zeroizing::new(s.to_bytes()))
    }
}

/// 32 random bytes.
pub fn nonce() -> crate::error::Result<[u8; N]> {
    let mut b = [0u8; N];
    crate::provider::sys::fill_random(&mut b)?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opening(entity: &str, fill: u8) -> Opening {
        Opening {
            version: AUTH_VERSION,
            mode: Mode::Secret,
            nonce: [fill; N],
            public: [fill.wrapping_add(1); N],
            entity: entity.into(),
        }
    }

    #[test]
    fn frames_round_trip() {
        let frames = [
            Frame::ClientHello(opening("client.fio", 1)),
            Frame::ServerHello(opening("osd.0", 7)),
            Frame::ClientFinish([3; N]),
            Frame::Accept([4; N]),
            Frame::Refuse(RefuseCode::Busy, "too many".into()),
        ];
        for f in frames {
            let b = f.encode();
            assert!(b.len() <= MAX_FRAME);
            assert_eq!(Frame::length(&b).unwrap(), Some(b.len()));
            assert_eq!(Frame::decode(&b).unwrap(), f);
        }
    }

    #[test]
    fn decode_rejects_garbage_truncated_and_oversized() {
        let good = Frame::ClientHello(opening("client.fio", 1)).encode();
        for cut in 0..good.len() {
            assert!(Frame::decode(&good[..cut]).is_err(), "cut {cut}");
        }
        let e = Frame::length(b"GET / HTTP/1.1\r\n").unwrap_err();
        assert!(e.contains("out of range"), "{e}");
        let mut big = good.clone();
        big[..4].copy_from_slice(&(MAX_FRAME as u32 + 1).to_be_bytes());
        assert!(Frame::length(&big).unwrap_err().contains("out of range"));
        let mut magic = good.clone();
        magic[4..8].copy_from_slice(b"RDMX");
        assert!(Frame::length(&magic).unwrap_err().contains("bad magic"));
        let mut name = good.clone();
        let last = name.len() - 1;
        name[last] = b' ';
        assert!(Frame::decode(&name).unwrap_err().contains("invalid entity"));
        let mut t = good;
        t[8] = 99;
        assert!(Frame::decode(&t).unwrap_err().contains("unknown type"));
        // Arbitrary bytes never panic.
        let mut x: u32 = 1;
        for len in 0..300usize {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            let _ = Frame::decode(&bytes);
        }
    }

    /// Literal inputs: fixed secrets, nonces and ephemeral keys give fixed proofs, and
    /// the proofs change with every bound field.
    #[test]
    fn proofs_bind_every_field_and_the_role() {
        let k = [0x42u8; 16];
        let c = opening("client.fio", 1);
        let s = opening("osd.0", 9);
        let th = transcript_hash(&c, &s);
        let pc = client_proof(&k, &th);
        let ps = server_proof(&k, &th);
        assert_ne!(
            pc, ps,
            "a reflected proof must not verify as the other role"
        );
        assert!(verify_client(&k, &th, &pc));
        assert!(!verify_client(&k, &th, &ps));
        assert!(verify_server(&k, &th, &ps));
        assert!(!verify_server(&k, &th, &pc));
        assert!(!verify_client(&[0x43; 16], &th, &pc), "wrong key");
        // Each field changes the transcript.
        let mut variants = Vec::new();
        let mut c2 = c.clone();
        c2.nonce[0] ^= 1;
        variants.push((c2, s.clone()));
        let mut s2 = s.clone();
        s2.nonce[31] ^= 1;
        variants.push((c.clone(), s2));
        let mut c3 = c.clone();
        c3.public[5] ^= 1;
        variants.push((c3, s.clone()));
        let mut s3 = s.clone();
        s3.entity = "osd.1".into();
        variants.push((c.clone(), s3));
        let mut c4 = c.clone();
        c4.entity = "client.fi".into();
        variants.push((c4, s.clone()));
        for (a, b) in variants {
            assert!(!verify_client(&k, &transcript_hash(&a, &b), &pc));
        }
        // Deterministic: the same literal inputs always give the same proof.
        assert_eq!(client_proof(&k, &th), pc);
    }

    #[test]
    fn x25519_agrees_and_keys_are_directional() {
        let a = Ephemeral::from_bytes([1; 32]);
        let b = Ephemeral::from_bytes([2; 32]);
        let sa = a.agree(&b.public).unwrap();
        let sb = b.agree(&a.public).unwrap();
        assert_eq!(*sa, *sb);
        // A low-order point (all zero) is refused.
        assert!(a.agree(&[0; 32]).is_none());
        let th = [5u8; 32];
        let k1 = SessionKeys::derive(&[7; 16], &sa, &th);
        let k2 = SessionKeys::derive(&[7; 16], &sb, &th);
        let tag = k1.tag(true, b"hello");
        assert!(k2.verify(true, b"hello", &tag));
        assert!(!k2.verify(false, b"hello", &tag), "direction bound");
        assert!(!k2.verify(true, b"hellp", &tag), "content bound");
        let k3 = SessionKeys::derive(&[8; 16], &sa, &th);
        assert!(!k3.verify(true, b"hello", &tag), "secret bound");
        assert_ne!(*k1.c2s, *k1.s2c);
    }
}

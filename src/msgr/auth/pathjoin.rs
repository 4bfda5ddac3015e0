//! The messenger's path-join MAC: binds a connection that joins a session as another path
//! to that session (`docs/security.md`, "Path binding"). Keyed by the session's path
//! secret, derived from the authenticated handshake of the connection the session opened
//! on (both ends have it, nobody else); over both session ids, the path index and the
//! joining connection's own handshake secret (bound to both of its nonces and its key
//! exchange), with a role label so that an answer never verifies as a join. Truncated to
//! 64 bits (it travels in a header field); compared in constant time.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

type HmacSha256 = Hmac<Sha256>;

/// Which side computes the MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The connecting side's path-join hello.
    Join,
    /// The accepting side's answer.
    Answer,
}

/// The session's path secret from the handshake secret of the connection it opened on.
pub fn path_secret(first_binding: &[u8; 32]) -> Zeroizing<[u8; 32]> {
    let mut m = HmacSha256::new_from_slice(first_binding).expect("HMAC takes any key length");
    m.update(b"rdmx msgr path secret v1");
    Zeroizing::new(m.finalize().into_bytes().into())
}

/// The MAC of a path-join (or its answer) of connector session `conn_id` and acceptor
/// session `acc_id` on path `path` over a connection whose handshake secret is `binding`.
pub fn mac(
    secret: &[u8; 32],
    role: Role,
    conn_id: u64,
    acc_id: u64,
    path: u64,
    binding: &[u8; 32],
) -> u64 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(match role {
        Role::Join => b"rdmx path-join v1 join  ",
        Role::Answer => b"rdmx path-join v1 answer",
    });
    m.update(&conn_id.to_le_bytes());
    m.update(&acc_id.to_le_bytes());
    m.update(&path.to_le_bytes());
    m.update(binding);
    let out = m.finalize().into_bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&out[..8]);
    u64::from_le_bytes(first)
}

/// Whether `got` is the MAC [`mac`] computes for these inputs (constant time).
pub fn verify(
    secret: &[u8; 32],
    role: Role,
    conn_id: u64,
    acc_id: u64,
    path: u64,
    binding: &[u8; 32],
    got: u64,
) -> bool {
    let want = mac(secret, role, conn_id, acc_id, path, binding);
    bool::from(want.to_le_bytes().ct_eq(&got.to_le_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_mac_binds_every_input_and_the_role() {
        let s = path_secret(&[7; 32]);
        let b = [9u8; 32];
        let m = mac(&s, Role::Join, 1, 2, 1, &b);
        assert!(verify(&s, Role::Join, 1, 2, 1, &b, m));
        assert!(!verify(&s, Role::Answer, 1, 2, 1, &b, m), "role");
        assert!(!verify(&s, Role::Join, 3, 2, 1, &b, m), "session");
        assert!(!verify(&s, Role::Join, 1, 3, 1, &b, m), "peer session");
        assert!(!verify(&s, Role::Join, 1, 2, 0, &b, m), "path");
        assert!(!verify(&s, Role::Join, 1, 2, 1, &[8; 32], m), "connection");
        let other = path_secret(&[6; 32]);
        assert!(!verify(&other, Role::Join, 1, 2, 1, &b, m), "secret");
        assert!(!verify(&s, Role::Join, 1, 2, 1, &b, m ^ 1));
    }
}

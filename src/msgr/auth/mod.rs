//! Side-channel authentication: both ends prove they hold the client entity's shared
//! secret (a Ceph-style keyring, [`keyring`]) with an HMAC challenge-response over both
//! nonces, both entity names and the protocol version, plus an ephemeral X25519 exchange
//! for forward secrecy ([`proto`]); the session keys derived from both then tag the QP
//! hellos (QPNs, GIDs, UDP ports, regions), so nothing a data path will trust is taken
//! from a peer that has not proved itself. [`client`] runs the connecting side (blocking,
//! on the connecting thread); [`server`] is the accepting side's state machine and
//! [`gate`] drives it for a listener without a thread or a QP per connection, with the
//! handshake bounds (first-bytes deadline, per-source and total caps). See
//! `docs/security.md`.

pub mod client;
pub mod gate;
pub mod keyring;
pub mod pathjoin;
pub mod proto;
pub mod server;

use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub use keyring::Keyring;
pub use proto::SessionKeys;

/// What a finished handshake established.
#[derive(Debug, Clone, Default)]
pub struct Authenticated {
    /// The peer's entity as proved (the client's on a listener, the server's claimed name
    /// on a connecting side); None with `auth = none`.
    pub peer_entity: Option<String>,
    /// The keys that tag the rest of the handshake; None with `auth = none`.
    pub keys: Option<SessionKeys>,
}

/// Handshake bounds of a listener (config keys `handshake_*`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A connection's first auth frame, and each later one, must arrive within this.
    pub first_bytes: Duration,
    /// The whole handshake (auth, QP hellos, ready step).
    pub timeout: Duration,
    /// Handshakes a listener runs at once (unauthenticated ones, set-ups in progress and
    /// set-ups not yet accepted).
    pub max: usize,
    /// Unauthenticated handshakes from one source address at once.
    pub per_source: usize,
}

/// A context's authentication settings (`auth`, `auth_keyring`, `auth_entity`) and
/// handshake limits.
#[derive(Debug)]
pub struct AuthConfig {
    pub required: bool,
    /// This side's name: the client entity whose key a connecting side proves; a
    /// listener's own name, sent in its hello.
    pub entity: String,
    /// `auth_keyring`'s path ("" = none) and its keys; [`AuthConfig::reload_keyring`]
    /// swaps them (key rotation) for handshakes that start afterwards.
    path: String,
    keyring: parking_lot::RwLock<Option<Arc<Keyring>>>,
    pub limits: Limits,
    /// `auth = none` warned once.
    warned: AtomicBool,
}

impl AuthConfig {
    /// Reads and checks the keys; loads the keyring (refusing one others may read).
    pub fn from_config(c: &Config) -> Result<AuthConfig> {
        let mode = c.get("auth")?;
        let path = c.get("auth_keyring")?;
        let entity = c.get("auth_entity")?;
        if !keyring::valid_entity(&entity) {
            return Err(Error::new(
                ErrorKind::InvalidValue,
                format!(
                    "auth_entity: invalid value '{entity}': allowed 1..{} letters, digits, '.', \
                     '_', '-' (e.g. client.fio)",
                    keyring::MAX_ENTITY
                ),
            ));
        }
        let keyring = if path.is_empty() {
            None
        } else {
            Some(Keyring::load(std::path::Path::new(&path))?)
        };
        let required = match (mode.as_str(), keyring.is_some()) {
            ("none", true) => {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "auth=none with auth_keyring={path}: a configured keyring means \
                         authentication is required; leave auth unset (or 'required'), or \
                         drop auth_keyring to run without authentication"
                    ),
                ));
            }
            ("required", false) => {
                return Err(Error::new(
                    ErrorKind::Auth,
                    "auth=required needs a keyring: set auth_keyring to a keyring file \
                     ([client.NAME] key = BASE64, mode 600)",
                ));
            }
            (_, has) => has,
        };
        if required
            && let Some(k) = keyring.as_ref()
            && k.secret(&entity).is_none()
            && k.len() == 1
        {
            log::info!(
                target: "rdmx::auth",
                "auth_entity {entity} has no key in {path}: connecting will fail (accepting \
                 uses the keys of the connecting entities)"
            );
        }
        let ms = |k: &str| c.get_u64(k).map(Duration::from_millis);
        Ok(AuthConfig {
            required,
            entity,
            path,
            keyring: parking_lot::RwLock::new(keyring.map(Arc::new)),
            limits: Limits {
                first_bytes: ms("handshake_first_bytes_ms")?,
                timeout: ms("handshake_timeout_ms")?,
                max: c.get_u64("handshake_max")? as usize,
                per_source: c.get_u64("handshake_per_source")? as usize,
            },
            warned: AtomicBool::new(false),
        })
    }

    /// The keys in force.
    pub fn keyring(&self) -> Option<Arc<Keyring>> {
        self.keyring.read().clone()
    }

    /// Reads `auth_keyring` again (after a key rotation); the keys in force stay if the
    /// file is now unusable (the error says why). Connections already set up keep going.
    pub fn reload_keyring(&self) -> Result<()> {
        if self.path.is_empty() {
            return Err(Error::fixed(
                ErrorKind::Auth,
                "reload_keyring: no auth_keyring is configured",
            ));
        }
        let k = Keyring::load(std::path::Path::new(&self.path))?;
        *self.keyring.write() = Some(Arc::new(k));
        Ok(())
    }

    /// With `auth = none`: a warning, once per context, when it first listens or connects.
    pub fn warn_if_none(&self, what: &str) {
        if !self.required && !self.warned.swap(true, Ordering::Relaxed) {
            log::warn!(
                target: "rdmx::auth",
                "{what} with auth=none: peers are not authenticated and any peer that reaches \
                 the port gets the QP numbers and exposed regions; set auth_keyring (see \
                 docs/security.md)"
            );
        }
    }
}

/// An authentication failure.
pub(crate) fn auth_error(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Auth, msg)
}

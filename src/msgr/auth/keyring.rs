//! Ceph-style keyrings: one shared secret per entity.
//!
//! ```text
//! [client.fio]
//!     key = AQBx...==
//! ```
//!
//! Sections name entities (`client.fio`, `osd.0`); the `key` line holds the base64 secret.
//! Other lines (`caps mon = ...`) are ignored, as are `#` and `;` comments. A key made by
//! `ceph-authtool --gen-print-key` (a 28-byte Ceph `CryptoKey`: type, creation time, length,
//! a 16-byte secret) is used by its secret; any other base64 value of at least
//! [`MIN_SECRET`] bytes is the secret itself (e.g. `head -c 32 /dev/urandom | base64`).

use crate::error::{Error, ErrorKind, Result};
use base64::Engine as _;
use std::collections::HashMap;
use std::path::Path;
use zeroize::Zeroizing;

/// Shortest secret accepted (128 bits, a Ceph AES key's size).
pub const MIN_SECRET: usize = 16;
/// Longest secret accepted.
pub const MAX_SECRET: usize = 128;
/// Longest entity name (`client.fio`): it travels in the first auth frame.
pub const MAX_ENTITY: usize = 64;

/// The secrets of a keyring, by entity name.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: HashMap<String, Zeroizing<Vec<u8>>>,
}

impl std::fmt::Debug for Keyring {
    /// Names only: a secret never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.keys.keys().collect();
        names.sort();
        f.debug_struct("Keyring").field("entities", &names).finish()
    }
}

/// Whether `name` is a valid entity name: 1..=64 bytes of letters, digits, `.`, `_`, `-`.
pub fn valid_entity(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_ENTITY
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn auth_err(msg: String) -> Error {
    Error::new(ErrorKind::Auth, msg)
}

impl Keyring {
    /// Reads the keyring at `path`, refusing a file that group or others may access (the
    /// secrets would be readable by any local user).
    pub fn load(path: &Path) -> Result<Keyring> {
        use std::os::unix::fs::MetadataExt;
        let shown = path.display();
        let meta =
            std::fs::metadata(path).map_err(|e| auth_err(format!("auth_keyring {shown}: {e}")))?;
        let mode = meta.mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(auth_err(format!(
                "auth_keyring {shown}: mode {mode:04o} lets group or others access the secrets; \
                 refusing it: run 'chmod 600 {shown}' (owner only)"
            )));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| auth_err(format!("auth_keyring {shown}: {e}")))?;
        Keyring::parse(&text, &shown.to_string())
    }

    /// Parses keyring text; `origin` names it in messages ("origin:line: ...").
    pub fn parse(text: &str, origin: &str) -> Result<Keyring> {
        let mut keys = HashMap::new();
        let mut section: Option<String> = None;
        for (i, raw) in text.lines().enumerate() {
            let at = format!("{origin}:{}", i + 1);
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            if let Some(rest) = line.strip_prefix('[') {
                let name = rest.strip_suffix(']').map(str::trim).ok_or_else(|| {
                    auth_err(format!("{at}: section header without ']': {line:?}"))
                })?;
                if !valid_entity(name) {
                    return Err(auth_err(format!(
                        "{at}: invalid entity name {name:?}: 1..{MAX_ENTITY} letters, digits, '.', '_', '-'"
                    )));
                }
                section = Some(name.to_string());
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                return Err(auth_err(format!(
                    "{at}: expected 'key = BASE64' or a [section], got {:?}",
                    line.chars().take(40).collect::<String>()
                )));
            };
            if k.trim() != "key" {
                continue; // caps and other settings: not ours
            }
            let Some(name) = &section else {
                return Err(auth_err(format!("{at}: a key before any [entity] section")));
            };
            let secret =
                decode_key(v.trim()).map_err(|m| auth_err(format!("{at}: {name}: {m}")))?;
            if keys.insert(name.clone(), secret).is_some() {
                return Err(auth_err(format!("{at}: a second key for {name}")));
            }
        }
        if keys.is_empty() {
            return Err(auth_err(format!("{origin}: no [entity] with a key")));
        }
        Ok(Keyring { keys })
    }

    /// The secret of `entity`, if the keyring holds it.
    pub fn secret(&self, entity: &str) -> Option<&[u8]> {
        self.keys.get(entity).map(|k| k.as_slice())
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// A key line's value: base64, a Ceph `CryptoKey` (type 1 = AES, u32 seconds, u32 nanos,
/// u16 length 16, the secret; little-endian) or a raw secret.
fn decode_key(b64: &str) -> std::result::Result<Zeroizing<Vec<u8>>, String> {
    let bytes = Zeroizing::new(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("key is not base64: {e}"))?,
    );
    if bytes.len() == 28 && bytes[0..2] == [1, 0] && bytes[10..12] == [16, 0] {
        return Ok(Zeroizing::new(bytes[12..28].to_vec()));
    }
    if !(MIN_SECRET..=MAX_SECRET).contains(&bytes.len()) {
        return Err(format!(
            "key is {} bytes: {MIN_SECRET}..{MAX_SECRET} allowed (e.g. 'head -c 32 /dev/urandom | base64' \
             or 'ceph-authtool --gen-print-key')",
            bytes.len()
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sections_keys_and_ceph_keys() {
        // A key from ceph-authtool --gen-print-key: AES, 16-byte secret.
        let text = "# comment\n[client.fio]\n    key = AQBxb2xlAAAAABAAAQIDBAUGBwgJCgsMDQ4PEA==\n    caps osd = \"allow rw\"\n\n[osd.0]\nkey=AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n";
        let k = Keyring::parse(text, "t").unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(
            k.secret("client.fio").unwrap(),
            &(1u8..=16).collect::<Vec<_>>()[..]
        );
        assert_eq!(
            k.secret("osd.0").unwrap(),
            &(0u8..32).collect::<Vec<_>>()[..]
        );
        assert!(k.secret("client.admin").is_none());
        assert!(!format!("{k:?}").contains("AAEC"), "no secret in Debug");
    }

    #[test]
    fn rejects_bad_keyrings() {
        let cases = [
            ("key = AAAA\n", "before any [entity]"),
            ("[client.a\nkey = x\n", "without ']'"),
            ("[client a]\n", "invalid entity name"),
            ("[client.a]\nkey = !!!\n", "not base64"),
            ("[client.a]\nkey = AAAA\n", "3 bytes"),
            ("[client.a]\njunk\n", "expected 'key = BASE64'"),
            ("", "no [entity] with a key"),
            (
                "[a]\nkey = AAECAwQFBgcICQoLDA0ODw==\nkey = AAECAwQFBgcICQoLDA0ODw==\n",
                "a second key",
            ),
        ];
        for (text, want) in cases {
            let e = Keyring::parse(text, "f").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Auth);
            assert!(e.message().contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn refuses_a_keyring_others_can_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("rdmx-keyring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("k");
        std::fs::write(&p, "[client.a]\nkey = AAECAwQFBgcICQoLDA0ODw==\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Keyring::load(&p).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Auth);
        assert!(
            e.message().contains("mode 0644") && e.message().contains("chmod 600"),
            "{e}"
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Keyring::load(&p).unwrap().secret("client.a").is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn entity_names() {
        assert!(valid_entity("client.fio"));
        assert!(valid_entity("osd.12"));
        assert!(!valid_entity(""));
        assert!(!valid_entity("a b"));
        assert!(!valid_entity(&"a".repeat(65)));
    }
}

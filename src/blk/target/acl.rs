//! Who may open which volume: the grant table of `rdmx-target --allow`.
//!
//! `--allow VOLUME=ENTITY:rw|ro[,ENTITY:rw|ro...]` (repeatable). With no `--allow` at all
//! the table is open: every session may open every volume read-write (the behaviour before
//! access control, for benchmarks and a trusted network; the target warns at start). With
//! at least one `--allow`, the table is closed: a session may open a volume only if its
//! authenticated entity is granted on it, and a session without an authenticated entity
//! (auth = none) may open nothing. A volume no `--allow` names is then opened by nobody.

use rustc_hash::FxHashMap as HashMap;

/// What an entity may do with a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    /// Read and query (one-sided: RDMA READ only).
    ReadOnly,
    /// Read, write, flush (one-sided: RDMA READ and WRITE).
    ReadWrite,
}

impl Access {
    pub fn may_write(self) -> bool {
        self == Access::ReadWrite
    }
}

/// One `--allow` argument: a volume and its grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowSpec {
    pub volume: String,
    pub grants: Vec<(String, Access)>,
}

/// Longest entity name (Ceph's are `type.id`, e.g. `client.admin`, `osd.12`).
pub const ENTITY_MAX: usize = 128;

/// Checks an entity name: 1..=ENTITY_MAX bytes of `[A-Za-z0-9._-]`.
pub fn check_entity(e: &str) -> std::result::Result<(), String> {
    if e.is_empty() || e.len() > ENTITY_MAX {
        return Err(format!("entity '{e}': must be 1..{ENTITY_MAX} bytes"));
    }
    if let Some(c) = e
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "entity '{e}': character '{c}' not allowed (letters, digits, '.', '_', '-')"
        ));
    }
    Ok(())
}

impl std::str::FromStr for AllowSpec {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<AllowSpec, String> {
        let bad = |why: String| {
            format!("--allow '{s}': {why} (expected VOLUME=ENTITY:rw|ro[,ENTITY:rw|ro...])")
        };
        let (volume, rest) = s.split_once('=').ok_or_else(|| bad("no '='".to_string()))?;
        let volume = volume.trim();
        if volume.is_empty() {
            return Err(bad("no volume name".to_string()));
        }
        let mut grants: Vec<(String, Access)> = Vec::new();
        for g in rest.split(',') {
            let g = g.trim();
            let (entity, access) = g
                .rsplit_once(':')
                .ok_or_else(|| bad(format!("grant '{g}' has no ':rw' or ':ro'")))?;
            let access = match access {
                "rw" => Access::ReadWrite,
                "ro" => Access::ReadOnly,
                other => {
                    return Err(bad(format!(
                        "grant '{g}': access '{other}' is neither 'rw' nor 'ro'"
                    )));
                }
            };
            check_entity(entity).map_err(bad)?;
            if grants.iter().any(|(e, _)| e == entity) {
                return Err(bad(format!("entity '{entity}' granted twice")));
            }
            grants.push((entity.to_string(), access));
        }
        Ok(AllowSpec {
            volume: volume.to_string(),
            grants,
        })
    }
}

/// The grant table: `None` = open (no `--allow` given).
#[derive(Debug, Clone, Default)]
pub struct Acl {
    table: Option<HashMap<String, HashMap<String, Access>>>,
}

impl Acl {
    /// Builds the table from `--allow` arguments for the volumes `volumes` (names). Errors:
    /// a grant on a volume the target does not serve, or the same (volume, entity) granted
    /// by two arguments.
    pub fn new(specs: &[AllowSpec], volumes: &[&str]) -> std::result::Result<Acl, String> {
        if specs.is_empty() {
            return Ok(Acl { table: None });
        }
        let mut table: HashMap<String, HashMap<String, Access>> = HashMap::default();
        for s in specs {
            if !volumes.contains(&s.volume.as_str()) {
                return Err(format!(
                    "--allow {}=...: no such volume (volumes: {})",
                    s.volume,
                    volumes.join(", ")
                ));
            }
            let t = table.entry(s.volume.clone()).or_default();
            for (e, a) in &s.grants {
                if t.insert(e.clone(), *a).is_some() {
                    return Err(format!(
                        "--allow {}: entity '{e}' granted twice on this volume",
                        s.volume
                    ));
                }
            }
        }
        Ok(Acl { table: Some(table) })
    }

    /// Whether no `--allow` was given (everything allowed).
    pub fn is_open(&self) -> bool {
        self.table.is_none()
    }

    /// Volumes (of `volumes`) nobody may open: named by no `--allow` of a closed table.
    pub fn unreachable<'a>(&self, volumes: &[&'a str]) -> Vec<&'a str> {
        match &self.table {
            None => Vec::new(),
            Some(t) => volumes
                .iter()
                .filter(|v| !t.contains_key(**v))
                .copied()
                .collect(),
        }
    }

    /// What `entity` (the session's authenticated entity; `None` with auth = none) may do
    /// with `volume`: `None` = nothing (the request gets EACCES).
    pub fn access(&self, volume: &str, entity: Option<&str>) -> Option<Access> {
        match &self.table {
            None => Some(Access::ReadWrite),
            Some(t) => t.get(volume)?.get(entity?).copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> AllowSpec {
        s.parse().unwrap()
    }

    #[test]
    fn parses_grants() {
        assert_eq!(
            spec("v0=client.a:rw,client.b:ro"),
            AllowSpec {
                volume: "v0".into(),
                grants: vec![
                    ("client.a".into(), Access::ReadWrite),
                    ("client.b".into(), Access::ReadOnly)
                ],
            }
        );
        assert_eq!(
            spec(" v1 = osd.12:ro ").grants,
            vec![("osd.12".into(), Access::ReadOnly)]
        );
    }

    #[test]
    fn refuses_malformed_grants_with_a_reason() {
        let err = |s: &str| s.parse::<AllowSpec>().unwrap_err();
        assert!(err("v0").contains("no '='"), "{}", err("v0"));
        assert!(err("=client.a:rw").contains("no volume name"));
        assert!(err("v0=client.a").contains("has no ':rw' or ':ro'"));
        assert!(err("v0=client.a:wr").contains("access 'wr' is neither"));
        assert!(err("v0=:rw").contains("must be 1.."));
        assert!(err("v0=client a:rw").contains("character ' ' not allowed"));
        assert!(err("v0=client.a:rw,").contains("has no ':rw' or ':ro'"));
        assert!(err("v0=client.a:rw,client.a:ro").contains("granted twice"));
        let long = format!("v0={}:rw", "x".repeat(ENTITY_MAX + 1));
        assert!(err(&long).contains("must be 1.."));
    }

    #[test]
    fn table_checks_volumes_and_duplicates() {
        let vols = ["v0", "v1"];
        let e = Acl::new(&[spec("v9=client.a:rw")], &vols).unwrap_err();
        assert!(e.contains("no such volume") && e.contains("v0, v1"), "{e}");
        let e = Acl::new(&[spec("v0=client.a:rw"), spec("v0=client.a:ro")], &vols).unwrap_err();
        assert!(e.contains("granted twice"), "{e}");
        // Two arguments for one volume with different entities merge.
        let a = Acl::new(&[spec("v0=client.a:rw"), spec("v0=client.b:ro")], &vols).unwrap();
        assert_eq!(a.access("v0", Some("client.b")), Some(Access::ReadOnly));
        assert_eq!(a.unreachable(&vols), vec!["v1"]);
    }

    #[test]
    fn decisions() {
        let open = Acl::new(&[], &["v0"]).unwrap();
        assert!(open.is_open());
        // No --allow: everything, with or without an entity.
        assert_eq!(open.access("v0", None), Some(Access::ReadWrite));
        assert_eq!(open.access("v0", Some("client.x")), Some(Access::ReadWrite));
        let a = Acl::new(
            &[
                spec("v0=client.a:rw,client.b:ro"),
                spec("secret=client.a:ro"),
            ],
            &["v0", "secret", "other"],
        )
        .unwrap();
        assert!(!a.is_open());
        assert_eq!(a.access("v0", Some("client.a")), Some(Access::ReadWrite));
        assert_eq!(a.access("v0", Some("client.b")), Some(Access::ReadOnly));
        assert_eq!(a.access("secret", Some("client.a")), Some(Access::ReadOnly));
        assert_eq!(a.access("secret", Some("client.b")), None);
        assert_eq!(a.access("v0", Some("client.c")), None);
        // A volume no --allow names: nobody.
        assert_eq!(a.access("other", Some("client.a")), None);
        // With --allow given, no authenticated entity (auth = none) gets nothing.
        assert_eq!(a.access("v0", None), None);
        // Names are compared exactly.
        assert_eq!(a.access("v0", Some("Client.a")), None);
        assert_eq!(a.access("V0", Some("client.a")), None);
        assert!(!Access::ReadOnly.may_write() && Access::ReadWrite.may_write());
    }
}

//! Every knob rdmx has: default, range, one-line meaning, validation (alone and across
//! fields), the InfiniBand encodings the knobs use, named profiles, and the sources a value
//! can come from.
//!
//! Where things are: the key table is `config/keys.rs` (start there), profiles
//! `config/profiles.rs`, Ceph `ms_async_rdma_*` names `config/aliases.rs`, cross-field rules
//! `config/validate.rs`, the file syntax `config/parse.rs`, IB encodings `config/encoding.rs`.
//!
//! CONTRACT (used by `src/ffi/` and later layers; keep these signatures):
//! - `Config::new()` — defaults only. `Config::from_env()` — defaults + `RDMX_<KEY>` vars.
//! - `set(key, value)` is an explicit set (highest precedence). `set_from(key, value, src)`.
//! - `get(key)` — the effective value, canonically formatted; `source(key)`.
//! - `load_file(path)` / `load_str(text, origin)` — ceph.conf-like; all-or-nothing.
//! - `validate()` — cross-field rules; `dump()` — `key = value  # source` for every key.
//! - `encoding::{rnr_timer_ns, ack_timeout_ns, Mtu}`.
//!
//! Precedence, lowest first: defaults, profile, file, env, explicit set. Each source has its
//! own layer; the effective value is the one in the highest layer holding the key, so the
//! order of calls never matters. The profile layer is derived from the effective `profile`.

use crate::error::{Error, ErrorKind, Result};
use std::collections::BTreeMap;
use std::path::Path;

pub mod aliases;
mod dump;
pub mod encoding;
pub mod env;
pub mod keys;
mod parse;
pub mod profiles;
pub mod settings;
mod suggest;
mod typed;
mod validate;
mod value;

#[cfg(test)]
mod tests;

pub use aliases::{ALIASES, Alias, AliasTarget, Transform};
pub use encoding::Mtu;
pub use keys::{KEYS, KeySpec, Kind, keys_text, normalize_key};
pub use profiles::{PROFILES, Profile};
pub use settings::{CqLayout, Hugepages, PollMode, Progress, Provider, QpOverride, Settings};

use aliases::CEPH_PREFIX;
use value::Value;

/// Where an effective value came from, in increasing precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Default,
    Profile,
    File,
    Env,
    Explicit,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Default => "default",
            Source::Profile => "profile",
            Source::File => "file",
            Source::Env => "env",
            Source::Explicit => "set",
        }
    }
}

/// A value held by one layer, with where it was written (for `dump()`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    value: Value,
    /// "path:line" for a file, the variable for env, empty for set.
    origin: String,
    /// The Ceph name it was given as, if any.
    via: Option<&'static str>,
}

/// Values of one source by key index (into `KEYS`).
type Layer = BTreeMap<usize, Entry>;

/// A key's effective value and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Effective {
    value: Value,
    source: Source,
    /// The profile name, file position or variable name; empty for defaults and set.
    origin: String,
    via: Option<&'static str>,
}

/// A configuration: layered values per source; the effective value of a key is the one
/// from the highest-precedence source that set it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    file: Layer,
    env: Layer,
    explicit: Layer,
}

/// A key name resolved to a key of the table, possibly through a Ceph alias.
#[derive(Debug, Clone, Copy)]
struct Target {
    index: usize,
    spec: &'static KeySpec,
    alias: Option<&'static Alias>,
}

impl Config {
    pub fn new() -> Config {
        Config::default()
    }

    /// Defaults plus the process's `RDMX_<KEY>` variables.
    pub fn from_env() -> Result<Config> {
        Config::from_env_vars(env::process_vars()?)
    }

    /// Defaults plus the given `(variable, value)` pairs, as if they were the environment.
    pub fn from_env_vars<I, K, V>(vars: I) -> Result<Config>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut config = Config::new();
        config.load_env_vars(vars)?;
        Ok(config)
    }

    /// Applies `RDMX_<KEY>` variables at env precedence; other variables are ignored.
    /// An unknown `RDMX_` variable is an UnknownKey error naming it. All-or-nothing.
    pub fn load_env_vars<I, K, V>(&mut self, vars: I) -> Result<()>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut parsed = Vec::new();
        for (name, raw) in vars {
            let name = name.as_ref();
            let Some(key) = name.strip_prefix(env::ENV_PREFIX) else {
                continue;
            };
            if env::NON_CONFIG_ENV_VARS.contains(&name) {
                continue;
            }
            let target = resolve(key).map_err(|e| match e.kind() {
                ErrorKind::UnknownKey => unknown_env_var(name, key),
                _ => prefixed(name, e),
            })?;
            let value = parse_for(target, raw.as_ref()).map_err(|e| prefixed(name, e))?;
            parsed.push((target, value, name.to_string()));
        }
        for (target, value, origin) in parsed {
            insert(&mut self.env, target, value, origin);
        }
        Ok(())
    }

    /// An explicit set: wins over every other source.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        self.set_from(key, value, Source::Explicit)
    }

    /// Sets `key` in the layer of `source` (File, Env or Explicit). The value is checked
    /// alone; cross-field rules wait for `validate()`. Default and Profile cannot be set:
    /// defaults are fixed and the profile layer comes from the `profile` key.
    pub fn set_from(&mut self, key: &str, value: &str, source: Source) -> Result<()> {
        let target = resolve(key)?;
        let value = parse_for(target, value)?;
        let layer = self.layer_mut(source)?;
        insert(layer, target, value, String::new());
        Ok(())
    }

    /// The effective value of `key` (or of the key a Ceph name maps to), canonically
    /// formatted: decimal numbers, true/false, lower-case words.
    pub fn get(&self, key: &str) -> Result<String> {
        let target = resolve(key)?;
        Ok(self.effective(target.index).value.to_string())
    }

    /// Which source the effective value of `key` came from.
    pub fn source(&self, key: &str) -> Result<Source> {
        let target = resolve(key)?;
        Ok(self.effective(target.index).source)
    }

    /// The effective value of a numeric key.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let target = resolve(key)?;
        match self.effective(target.index).value {
            Value::Uint(n) => Ok(n),
            _ => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("{}: not a number (use get)", target.spec.name),
            )),
        }
    }

    /// The effective value of a boolean key.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let target = resolve(key)?;
        match self.effective(target.index).value {
            Value::Bool(b) => Ok(b),
            _ => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("{}: not a boolean (use get)", target.spec.name),
            )),
        }
    }

    pub fn load_file(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::new(ErrorKind::Io, format!("{}: {e}", path.display())))?;
        self.load_str(&text, &path.display().to_string())
    }

    /// Applies ceph.conf-like text at file precedence. `origin` names it in messages
    /// ("origin:line: ..."). All-or-nothing: any bad line and nothing is applied. Several
    /// loads merge; a later load overrides an earlier one key by key.
    pub fn load_str(&mut self, text: &str, origin: &str) -> Result<()> {
        let mut parsed = Vec::new();
        for line in parse::parse_file(text, origin)? {
            let at = format!("{origin}:{}", line.line);
            let target = resolve(&line.key).map_err(|e| prefixed(&at, e))?;
            let value = parse_for(target, &line.value).map_err(|e| prefixed(&at, e))?;
            parsed.push((target, value, at));
        }
        for (target, value, at) in parsed {
            insert(&mut self.file, target, value, at);
        }
        Ok(())
    }

    /// Checks the cross-field rules on the effective values (Conflict error naming every
    /// broken rule).
    pub fn validate(&self) -> Result<()> {
        self.settings().map(|_| ())
    }

    /// Every effective value, typed and validated across fields.
    pub fn settings(&self) -> Result<Settings> {
        let settings = self.settings_unchecked()?;
        validate::check(&settings)?;
        Ok(settings)
    }

    /// The CQs a QP gets, auto sizes resolved (no cross-field check).
    pub fn cq_layout(&self) -> Result<CqLayout> {
        Ok(self.settings_unchecked()?.cq_layout())
    }

    /// `key = value  # source` for every key, in table order.
    pub fn dump(&self) -> String {
        dump::dump(self)
    }

    /// Typed values without the cross-field rules.
    fn settings_unchecked(&self) -> Result<Settings> {
        let lookup = |name: &str| keys::index_of(name).map(|i| self.effective(i).value);
        typed::Reader { lookup: &lookup }.settings()
    }

    fn layer_mut(&mut self, source: Source) -> Result<&mut Layer> {
        match source {
            Source::File => Ok(&mut self.file),
            Source::Env => Ok(&mut self.env),
            Source::Explicit => Ok(&mut self.explicit),
            Source::Default => Err(Error::new(
                ErrorKind::InvalidArgument,
                "source 'default' cannot be set: defaults are fixed (use set, a file or env)",
            )),
            Source::Profile => Err(Error::new(
                ErrorKind::InvalidArgument,
                "source 'profile' cannot be set key by key: set profile = NAME instead",
            )),
        }
    }

    /// The value of key `index` from the highest layer holding it.
    fn effective(&self, index: usize) -> Effective {
        let layers = [
            (&self.explicit, Source::Explicit),
            (&self.env, Source::Env),
            (&self.file, Source::File),
        ];
        for (layer, source) in layers {
            if let Some(entry) = layer.get(&index) {
                return Effective {
                    value: entry.value.clone(),
                    source,
                    origin: entry.origin.clone(),
                    via: entry.via,
                };
            }
        }
        let spec = KEYS.get(index);
        if let Some(found) = spec.and_then(|s| self.profile_value(s)) {
            return found;
        }
        let default = spec.map_or("", |s| s.default);
        Effective {
            // Defaults are tested to parse; the Text fallback only avoids a panic path.
            value: spec
                .and_then(|s| value::parse(s, s.default, s.name).ok())
                .unwrap_or_else(|| Value::Text(default.to_string())),
            source: Source::Default,
            origin: String::new(),
            via: None,
        }
    }

    /// The value the effective profile gives `spec`, if any.
    fn profile_value(&self, spec: &KeySpec) -> Option<Effective> {
        if spec.name == "profile" {
            return None; // a profile cannot choose the profile
        }
        let profile_index = keys::index_of("profile")?;
        let Value::Word(name) = self.effective(profile_index).value else {
            return None;
        };
        let profile = profiles::find(name)?;
        let (_, raw) = profile.values.iter().find(|(k, _)| *k == spec.name)?;
        Some(Effective {
            value: value::parse(spec, raw, spec.name).ok()?,
            source: Source::Profile,
            origin: profile.name.to_string(),
            via: None,
        })
    }
}

/// The table entry for `key` (normalized; a Ceph alias resolves to its rdmx key).
pub fn lookup_key(key: &str) -> Result<&'static KeySpec> {
    resolve(key).map(|t| t.spec)
}

/// Resolves a user-written key: normalized, then looked up in the key table and the Ceph
/// alias table. Unknown -> UnknownKey with a suggestion; rejected Ceph name -> InvalidValue.
fn resolve(raw: &str) -> Result<Target> {
    let name = normalize_key(raw);
    if let Some(index) = keys::index_of(&name) {
        return target(index, None, raw);
    }
    if let Some(alias) = aliases::find(&name) {
        return match alias.target {
            AliasTarget::Key { key, .. } => match keys::index_of(key) {
                Some(index) => target(index, Some(alias), raw),
                None => Err(unknown_key(raw, &name)),
            },
            AliasTarget::Rejected => Err(Error::new(
                ErrorKind::InvalidValue,
                format!("{}: not supported by rdmx: {}", alias.name, alias.why),
            )),
        };
    }
    Err(unknown_key(raw, &name))
}

fn target(index: usize, alias: Option<&'static Alias>, raw: &str) -> Result<Target> {
    let spec = KEYS
        .get(index)
        .ok_or_else(|| unknown_key(raw, &normalize_key(raw)))?;
    Ok(Target { index, spec, alias })
}

/// Parses `raw` for the resolved key, applying the alias's transform first.
fn parse_for(target: Target, raw: &str) -> Result<Value> {
    let spec = target.spec;
    let Some(alias) = target.alias else {
        return value::parse(spec, raw, spec.name);
    };
    let shown = format!("{} (rdmx key '{}')", alias.name, spec.name);
    match alias.target {
        AliasTarget::Key {
            transform: Transform::BoolToOnOff,
            ..
        } => {
            let as_bool = KeySpec {
                kind: Kind::Bool,
                ..*spec
            };
            let on = value::parse(&as_bool, raw, &shown)? == Value::Bool(true);
            value::parse(spec, if on { "on" } else { "off" }, &shown)
        }
        _ => value::parse(spec, raw, &shown),
    }
}

fn insert(layer: &mut Layer, target: Target, value: Value, origin: String) {
    let via = target.alias.map(|a| a.name);
    layer.insert(target.index, Entry { value, origin, via });
}

/// Every name a user may write: keys, then Ceph names.
fn known_names() -> impl Iterator<Item = &'static str> {
    KEYS.iter()
        .map(|k| k.name)
        .chain(ALIASES.iter().map(|a| a.name))
}

fn unknown_key(raw: &str, normalized: &str) -> Error {
    let mut message = format!("unknown key '{}'", value::quote(raw.trim()));
    let suggestion = if normalized.starts_with(CEPH_PREFIX) {
        suggest::did_you_mean(normalized, ALIASES.iter().map(|a| a.name))
    } else {
        suggest::did_you_mean(normalized, known_names())
    };
    if let Some(best) = suggestion {
        message.push_str(&format!(" (did you mean '{best}'?)"));
    }
    if normalized.starts_with(CEPH_PREFIX) && suggestion.is_none() {
        message.push_str(": this Ceph option has no rdmx equivalent");
    }
    Error::new(ErrorKind::UnknownKey, message)
}

/// Whether `name` is an `RDMX_` variable that is not rdmx's: no configuration key or Ceph
/// name, not one of [`env::NON_CONFIG_ENV_VARS`], and not close enough to one to be a typo
/// of it (no "did you mean"). A program's own `RDMX_HOME` is foreign; `RDMX_RNR_RETYR` is
/// not (a misspelt key that would otherwise be dropped silently). A launcher that runs
/// other people's programs (`rdmx-ibv exec`) leaves foreign variables alone instead of
/// refusing them; [`Config::from_env`] still refuses every unknown `RDMX_` variable.
pub fn is_foreign_env_var(name: &str) -> bool {
    let Some(key) = name.strip_prefix(env::ENV_PREFIX) else {
        return false;
    };
    if env::NON_CONFIG_ENV_VARS.contains(&name) {
        return false;
    }
    match resolve(key) {
        Err(e) if e.kind() == ErrorKind::UnknownKey => {
            suggest::did_you_mean(&normalize_key(key), known_names()).is_none()
        }
        _ => false,
    }
}

fn unknown_env_var(var: &str, key: &str) -> Error {
    let mut message = format!("unknown environment variable '{}'", value::quote(var));
    if let Some(best) = suggest::did_you_mean(&normalize_key(key), known_names()) {
        message.push_str(&format!(" (did you mean '{}'?)", env::var_name(best)));
    }
    Error::new(ErrorKind::UnknownKey, message)
}

/// The same error with "where: " in front (file position or variable name).
fn prefixed(at: &str, error: Error) -> Error {
    Error::new(error.kind(), format!("{at}: {}", error.message()))
}

//! Parsing one value for one key, and the "invalid value" message every rejection uses:
//! `KEY: invalid value 'VALUE': allowed WHAT`.

use super::keys::{KeySpec, Kind};
use super::profiles;
use super::suggest::did_you_mean;
use crate::error::{Error, ErrorKind, Result};
use std::fmt;

/// A validated value in its canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    Uint(u64),
    Bool(bool),
    /// A word from the key's list (or a profile name).
    Word(&'static str),
    /// Free text (device names).
    Text(String),
    /// A fraction in parts per billion (`Kind::Ratio`).
    Ppb(u64),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Uint(n) => write!(f, "{n}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Word(w) => f.write_str(w),
            Value::Text(t) => f.write_str(t),
            Value::Ppb(n) => {
                let (int, frac) = (n / PPB, n % PPB);
                if frac == 0 {
                    write!(f, "{int}")
                } else {
                    let digits = format!("{frac:09}");
                    write!(f, "{int}.{}", digits.trim_end_matches('0'))
                }
            }
        }
    }
}

/// Longest free-text value (`Kind::Text`: a path, a name).
const MAX_TEXT: usize = 4096;

/// Longest device name: IBV_SYSFS_NAME_MAX (64) including the terminating NUL.
const MAX_DEVICE_NAME: usize = 63;

/// Parses `raw` for `spec`. `shown` is the name the user wrote the key as (the key itself, or
/// "ms_async_rdma_x (rdmx key 'y')" for a Ceph alias).
pub(crate) fn parse(spec: &KeySpec, raw: &str, shown: &str) -> Result<Value> {
    let text = raw.trim();
    let parsed = match spec.kind {
        Kind::Uint { min, max, .. } => parse_uint(text)
            .filter(|n| (min..=max).contains(n))
            .map(Value::Uint),
        Kind::PowerOfTwo { min, max } => parse_uint(text)
            .filter(|n| (min..=max).contains(n) && n.is_power_of_two())
            .map(Value::Uint),
        Kind::Numbers(list) => parse_uint(text)
            .filter(|n| list.contains(n))
            .map(Value::Uint),
        Kind::Words(list) => find_word(list, text).map(Value::Word),
        Kind::WordSet(list) => parse_word_set(list, text).map(Value::Text),
        Kind::Bool => parse_bool(text).map(Value::Bool),
        Kind::DeviceName => is_device_name(text).then(|| Value::Text(text.to_string())),
        Kind::Profile => find_word(&profiles::names(), &normalize_profile(text)).map(Value::Word),
        Kind::Ratio => parse_ppb(text).map(Value::Ppb),
        Kind::IpAddr => (text.is_empty() || text.parse::<std::net::IpAddr>().is_ok())
            .then(|| Value::Text(text.to_string())),
        Kind::Text => (text.len() <= MAX_TEXT && !text.chars().any(char::is_control))
            .then(|| Value::Text(text.to_string())),
    };
    parsed.ok_or_else(|| invalid(spec, raw, shown))
}

fn invalid(spec: &KeySpec, raw: &str, shown: &str) -> Error {
    let mut message = format!(
        "{shown}: invalid value '{}': allowed {}",
        quote(raw),
        allowed(spec.kind)
    );
    if spec.kind == Kind::Profile {
        let names = profiles::names();
        if let Some(best) = did_you_mean(&normalize_profile(raw), names.iter().copied()) {
            message.push_str(&format!(" (did you mean '{best}'?)"));
        }
    }
    Error::new(ErrorKind::InvalidValue, message)
}

/// What a kind allows, as the tail of "allowed ...".
pub(crate) fn allowed(kind: Kind) -> String {
    match kind {
        Kind::Uint { min, max, note: "" } => format!("{min}..{max}"),
        Kind::Uint { min, max, note } => format!("{min}..{max} ({note})"),
        Kind::PowerOfTwo { min, max } => format!("a power of two in {min}..{max}"),
        Kind::Numbers(list) => {
            let items: Vec<String> = list.iter().map(u64::to_string).collect();
            format!("one of {}", items.join(", "))
        }
        Kind::Words(list) => format!("one of {}", list.join(", ")),
        Kind::WordSet(list) => format!(
            "a comma-separated list of {} (each at most once; empty = none)",
            list.join(", ")
        ),
        Kind::Bool => "true or false (also 1/0, yes/no, on/off)".to_string(),
        Kind::DeviceName => format!(
            "a device name of letters, digits, '_', '-', '.' (at most {MAX_DEVICE_NAME}; empty = first device)"
        ),
        Kind::Profile => format!("one of {}", profiles::names().join(", ")),
        Kind::Ratio => "a decimal fraction in 0..1 with at most 9 decimals, e.g. 0.001".to_string(),
        Kind::Text => format!("text on one line, at most {MAX_TEXT} bytes (empty = unset)"),
        Kind::IpAddr => {
            "an IPv4 or IPv6 address without port or brackets, e.g. 10.0.0.2 or fd00::2 (empty = every address)"
                .to_string()
        }
    }
}

/// A decimal number: digits only (no sign, no spaces, no 0x), no overflow.
pub(crate) fn parse_uint(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.bytes().try_fold(0u64, |acc, digit| {
        acc.checked_mul(10)?.checked_add(u64::from(digit - b'0'))
    })
}

/// One, in parts per billion.
pub(crate) const PPB: u64 = 1_000_000_000;

/// "0", "1", "0.001", ".5": a fraction in 0..=1 as parts per billion; at most 9 decimals.
pub(crate) fn parse_ppb(text: &str) -> Option<u64> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if (int.is_empty() && frac.is_empty()) || frac.len() > 9 {
        return None;
    }
    let int = if int.is_empty() { 0 } else { parse_uint(int)? };
    let frac_digits = if frac.is_empty() {
        0
    } else {
        parse_uint(frac)?
    };
    let scaled = frac_digits * 10u64.pow(9 - frac.len() as u32);
    let total = int.checked_mul(PPB)?.checked_add(scaled)?;
    (total <= PPB).then_some(total)
}

pub(crate) fn parse_bool(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Some(true),
        "false" | "0" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// "Timeout, rnr_retry" -> "timeout,rnr_retry" (list order); None for an unknown or
/// repeated word or an empty item.
fn parse_word_set(list: &[&'static str], text: &str) -> Option<String> {
    if text.is_empty() {
        return Some(String::new());
    }
    let mut seen = vec![false; list.len()];
    for item in text.split(',') {
        let i = list
            .iter()
            .position(|w| w.eq_ignore_ascii_case(item.trim()))?;
        if std::mem::replace(&mut seen[i], true) {
            return None;
        }
    }
    let words: Vec<&str> = list
        .iter()
        .zip(&seen)
        .filter(|(_, s)| **s)
        .map(|(w, _)| *w)
        .collect();
    Some(words.join(","))
}

fn find_word(list: &[&'static str], text: &str) -> Option<&'static str> {
    list.iter().copied().find(|w| w.eq_ignore_ascii_case(text))
}

fn is_device_name(text: &str) -> bool {
    text.len() <= MAX_DEVICE_NAME
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Profile names are written with dashes; accept "Ceph_After" too.
fn normalize_profile(text: &str) -> String {
    text.trim().to_ascii_lowercase().replace('_', "-")
}

/// A user value fit for an error message: control characters escaped, long values cut.
pub(crate) fn quote(raw: &str) -> String {
    const MAX_SHOWN: usize = 64;
    let mut out = String::new();
    for (i, c) in raw.chars().enumerate() {
        if i == MAX_SHOWN {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

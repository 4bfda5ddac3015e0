//! The ceph.conf-like file syntax: `key = value` lines, `#`/`;` comments, `[section]` headers.
//! Only syntax lives here; keys and values are checked by the caller.

use crate::error::{Error, ErrorKind, Result};

use super::value::quote;

/// One `key = value` line of a section rdmx applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileLine {
    /// 1-based line number.
    pub line: usize,
    pub key: String,
    pub value: String,
}

/// Sections whose keys apply (keys before any header apply too).
const APPLIED_SECTIONS: [&str; 2] = ["global", "rdmx"];

/// Parses `text`; returns the lines of applied sections, or the first malformed line
/// (anywhere, even in skipped sections) as a Parse error "origin:N: ...".
pub(crate) fn parse_file(text: &str, origin: &str) -> Result<Vec<FileLine>> {
    let mut applied = true;
    let mut out = Vec::new();
    for (index, raw_line) in text.lines().enumerate() {
        let number = index + 1;
        let line = raw_line.trim();
        let fail = |what: &str| {
            Error::new(
                ErrorKind::Parse,
                format!("{origin}:{number}: {what}, got '{}'", quote(line)),
            )
        };
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let header = strip_comment(rest).trim_end();
            let name = header
                .strip_suffix(']')
                .map(str::trim)
                .filter(|n| !n.is_empty() && !n.contains(['[', ']']))
                .ok_or_else(|| fail("expected '[section]'"))?;
            applied = APPLIED_SECTIONS
                .iter()
                .any(|s| s.eq_ignore_ascii_case(name));
            continue;
        }
        let Some((key, rest)) = line.split_once('=') else {
            return Err(fail("expected 'key = value'"));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(fail("expected 'key = value'"));
        }
        let value = parse_value(rest).map_err(fail)?;
        if applied {
            out.push(FileLine {
                line: number,
                key: key.to_string(),
                value,
            });
        }
    }
    Ok(out)
}

/// The value after '=': trailing comment removed, trimmed; `"..."` quotes allowed (so an
/// empty value can be written `""`). Errors say what is wrong with a quoted value.
fn parse_value(rest: &str) -> std::result::Result<String, &'static str> {
    let rest = rest.trim_start();
    if let Some(quoted) = rest.strip_prefix('"') {
        let (inner, after) = quoted
            .split_once('"')
            .ok_or("unterminated '\"' in the value")?;
        let after = after.trim_start();
        if !(after.is_empty() || after.starts_with('#') || after.starts_with(';')) {
            return Err("expected a comment or nothing after the closing '\"'");
        }
        return Ok(inner.to_string());
    }
    Ok(strip_comment(rest).trim().to_string())
}

/// Text before a `#` or `;` comment (rdmx values never contain either).
fn strip_comment(text: &str) -> &str {
    match text.find(['#', ';']) {
        Some(at) => &text[..at],
        None => text,
    }
}

//! The subcommands' options, parsed with clap (derive) and held to rdmx-perf's conventions:
//! no binary name (the dispatcher in `main.rs` has taken the subcommand off), no clap
//! `--help`/`--version` (the dispatcher prints our own help texts, and `--help` wins over
//! any other argument, valid or not), a repeated option overrides the earlier one, and
//! every error is one of our messages followed by the subcommand's usage line, so that a
//! usage error reads as before and exits 2 (the caller maps `Err` to `Fail::Usage`).

use clap::Parser;
use clap::error::{ContextKind, ContextValue, ErrorKind};

/// Parses `args` (the subcommand's arguments) into `T`; `Err` is the message to print.
pub fn parse<T: Parser>(args: &[String], usage: &str) -> Result<T, String> {
    let cmd = T::command()
        .no_binary_name(true)
        .disable_help_flag(true)
        .disable_version_flag(true)
        .args_override_self(true);
    cmd.try_get_matches_from(args)
        .and_then(|m| T::from_arg_matches(&m))
        .map_err(|e| message(&e, usage))
}

/// Our wording for a clap error.
fn message(e: &clap::Error, usage: &str) -> String {
    let context = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => s.clone(),
        Some(ContextValue::Strings(v)) => v.join(", "),
        _ => String::new(),
    };
    // "--qd <N>" names the option as "--qd" in messages, "--connect ADDR:PORT" when missing.
    let arg = context(ContextKind::InvalidArg);
    let flag = arg.split_whitespace().next().unwrap_or_default();
    let what = match e.kind() {
        ErrorKind::UnknownArgument => format!("unknown option '{arg}'"),
        ErrorKind::MissingRequiredArgument => {
            format!("{} is required", arg.replace(['<', '>'], ""))
        }
        ErrorKind::InvalidValue if context(ContextKind::InvalidValue).is_empty() => {
            format!("{flag} needs a value")
        }
        ErrorKind::ValueValidation => match std::error::Error::source(e) {
            Some(why) => format!("{flag}: {why}"),
            None => format!("{flag}: bad value '{}'", context(ContextKind::InvalidValue)),
        },
        _ => e.render().to_string().trim_end().to_string(),
    };
    format!("{what}\n{usage}")
}

/// A count: a non-negative integer.
pub fn number(v: &str) -> Result<usize, String> {
    v.parse().map_err(|_| format!("'{v}' is not a number"))
}

/// A count of at least 1.
pub fn count(v: &str) -> Result<usize, String> {
    match number(v)? {
        0 => Err(format!("must be at least 1, got {v}")),
        n => Ok(n),
    }
}

/// A count in `1..=4096` (queue depths).
pub fn qd(v: &str) -> Result<usize, String> {
    number(v)?;
    v.parse()
        .ok()
        .filter(|q| (1..=4096).contains(q))
        .ok_or_else(|| format!("must be 1..=4096, got {v}"))
}

/// A run time in seconds, in (0, 3600].
pub fn duration(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|d| d.is_finite() && *d > 0.0 && *d <= 3600.0)
        .ok_or_else(|| format!("'{v}' is not a number of seconds in (0, 3600]"))
}

/// Bytes, with an optional binary K/M/G suffix.
pub fn size(v: &str) -> Result<usize, String> {
    crate::perf::parse_size(v)
}

/// `KEY=VALUE` of `--set`.
pub fn set(v: &str) -> Result<(String, String), String> {
    crate::perf::parse_set(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Parser)]
    struct Opts {
        #[arg(long, value_name = "ADDR:PORT", allow_hyphen_values = true)]
        connect: String,
        #[arg(long, value_parser = qd, default_value = "32")]
        qd: usize,
        #[arg(long, value_parser = set)]
        set: Vec<(String, String)>,
        #[arg(long)]
        json: bool,
    }

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn errors_are_ours_with_the_usage_line() {
        let p = |a: &[&str]| parse::<Opts>(&args(a), "usage: x").unwrap_err();
        assert_eq!(p(&["--frob"]), "unknown option '--frob'\nusage: x");
        assert_eq!(p(&["stray"]), "unknown option 'stray'\nusage: x");
        assert_eq!(
            p(&["--qd", "4"]),
            "--connect ADDR:PORT is required\nusage: x"
        );
        assert_eq!(p(&["--connect"]), "--connect needs a value\nusage: x");
        assert_eq!(
            p(&["--connect", "a", "--qd", "x"]),
            "--qd: 'x' is not a number\nusage: x"
        );
        assert_eq!(
            p(&["--connect", "a", "--qd", "0"]),
            "--qd: must be 1..=4096, got 0\nusage: x"
        );
        let e = p(&["--connect", "a", "--set", "k"]);
        assert!(e.starts_with("--set: expects KEY=VALUE, got 'k'\n"), "{e}");
    }

    #[test]
    fn later_options_win_and_sets_accumulate() {
        let o: Opts = parse(
            &args(&[
                "--qd",
                "4",
                "--connect",
                "-a",
                "--qd",
                "8",
                "--json",
                "--json",
            ]),
            "",
        )
        .unwrap();
        assert_eq!((o.connect.as_str(), o.qd, o.json), ("-a", 8, true));
        let o: Opts = parse(
            &args(&["--connect", "a", "--set", "a=1", "--set", "b = 2"]),
            "",
        )
        .unwrap();
        assert_eq!(o.set, [("a".into(), "1".into()), ("b".into(), "2".into())]);
    }
}

//! The layering rule, checked on the source tree (a test, run by `cargo test --lib`): the
//! messenger, block IO and the C API use the provider-neutral modules (`types`, `sys`,
//! `mtu`, `region`, `ready`, `dev`); those and the verbs provider never reach into the soft
//! provider; nothing under `provider/` reaches up into the messenger, block IO or the C API.
//! A cycle once ran `provider/dev.rs -> msgr::setup -> provider::soft` (issue 29), and the
//! shared vocabulary lived in `provider::soft`, so the verbs provider depended on the soft
//! one. This test fails when such an import comes back.

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    fn src() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
    }

    /// The code lines of `file` (comment lines left out: docs may name any module) that
    /// contain one of `needles`, as "path:line: text".
    fn offending(file: &Path, needles: &[&str]) -> Vec<String> {
        let text = std::fs::read_to_string(file).unwrap();
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim_start().starts_with("//"))
            .filter(|(_, l)| needles.iter().any(|n| l.contains(n)))
            .map(|(i, l)| format!("{}:{}: {}", file.display(), i + 1, l.trim()))
            .collect()
    }

    fn check(files: &[PathBuf], needles: &[&str], rule: &str) {
        let bad: Vec<String> = files.iter().flat_map(|f| offending(f, needles)).collect();
        assert!(bad.is_empty(), "{rule}:\n{}", bad.join("\n"));
    }

    fn under(rel: &str) -> Vec<PathBuf> {
        let mut v = Vec::new();
        rust_files(&src().join(rel), &mut v);
        assert!(!v.is_empty(), "no sources under src/{rel}");
        v
    }

    #[test]
    fn the_provider_never_imports_the_layers_above_it() {
        // This file names the layers in its needles.
        let mut files = under("provider");
        files.retain(|f| !f.ends_with("provider/layering.rs"));
        check(
            &files,
            &["crate::msgr", "crate::blk", "crate::ffi"],
            "provider/ must not use the messenger, block IO or the C API",
        );
    }

    #[test]
    fn the_verbs_provider_and_the_neutral_modules_do_not_use_the_soft_provider() {
        let mut files = under("provider/verbs");
        for f in ["types.rs", "sys.rs", "mtu.rs", "region.rs", "wr_stats.rs"] {
            files.push(src().join("provider").join(f));
        }
        check(
            &files,
            &["provider::soft", "super::soft", "super::super::soft"],
            "the verbs provider and the neutral modules must not use the soft provider",
        );
    }

    #[test]
    fn the_messenger_block_io_and_c_api_use_the_soft_provider_only_where_listed() {
        // Memory windows are soft-only by design (docs/security.md): the messenger's scoped
        // rkeys bind them through the soft region table (`Device::windows`).
        let allowed = [src().join("msgr/messenger/scope.rs")];
        let mut files = under("msgr");
        files.extend(under("blk"));
        files.extend(under("ffi"));
        files.retain(|f| !allowed.contains(f));
        check(
            &files,
            &["provider::soft"],
            "msgr/, blk/ and ffi/ must use the provider-neutral modules, not provider::soft",
        );
    }

    /// The check itself finds what it looks for (a rule that can never fail tests nothing).
    #[test]
    fn the_check_finds_an_offending_line() {
        let dir = std::env::temp_dir().join(format!("rdmx-layering-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("x.rs");
        std::fs::write(
            &f,
            "// crate::msgr in a comment\nuse crate::msgr::setup::Region;\n",
        )
        .unwrap();
        let found = offending(&f, &["crate::msgr"]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].ends_with(":2: use crate::msgr::setup::Region;"));
    }
}

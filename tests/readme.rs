//! The README stays true where a test can tell: its C example is the file that
//! `ffi-tests/run.sh` compiles and runs (`examples/msgr_client.c`), its layout table names
//! every top-level directory and every module of `src/`, and `docs/README.md` indexes every
//! page of `docs/`.

use std::fs;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The README's fenced block that follows the marker line `<!-- PATH -->`.
fn block_after(readme: &str, marker: &str) -> String {
    let at = readme
        .find(marker)
        .unwrap_or_else(|| panic!("README.md has no '{marker}'"));
    let rest = &readme[at + marker.len()..];
    let open = rest.find("```c\n").expect("a ```c block after the marker") + "```c\n".len();
    let close = rest[open..].find("```\n").expect("the block's end");
    rest[open..open + close].to_string()
}

#[test]
fn readme_c_example_is_examples_msgr_client_c() {
    let readme = read("README.md");
    let in_readme = block_after(&readme, "<!-- examples/msgr_client.c -->");
    let file = read("examples/msgr_client.c");
    assert!(
        in_readme == file,
        "README.md's example differs from examples/msgr_client.c (which ffi-tests/run.sh \
         builds and runs): copy the file into the README verbatim"
    );
    // A client sending a 4 KiB payload and handling the reply, as the README says.
    for part in [
        "static char page[4096]",
        "rdmx_session_send",
        "RDMX_MSGR_EVENT_MESSAGE",
    ] {
        assert!(file.contains(part), "examples/msgr_client.c lacks {part}");
    }
}

/// The README's "## Layout" section.
fn layout(readme: &str) -> &str {
    let at = readme
        .find("\n## Layout\n")
        .expect("README.md has a Layout section");
    let rest = &readme[at + 1..];
    match rest[3..].find("\n## ") {
        Some(end) => &rest[..end + 3],
        None => rest,
    }
}

#[test]
fn readme_layout_covers_every_top_level_dir_and_src_module() {
    let readme = read("README.md");
    let table = layout(&readme);
    let mut missing = Vec::new();
    for e in fs::read_dir(root()).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        // Build output and git's own; other hidden entries (.ci) count.
        if !e.path().is_dir() || name == "target" || name == ".git" {
            continue;
        }
        if !table.contains(&format!("`{name}/")) && !table.contains(&format!("`{name}`")) {
            missing.push(name);
        }
    }
    for e in fs::read_dir(root().join("src")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        let path = format!("src/{name}");
        if !table.contains(&format!("`{path}")) {
            missing.push(path);
        }
    }
    assert!(
        missing.is_empty(),
        "README.md's Layout table does not name: {missing:?}"
    );
}

#[test]
fn docs_index_lists_every_page() {
    let index = read("docs/README.md");
    assert!(index.contains("## Design documents") && index.contains("## Benchmark logs"));
    let mut missing = Vec::new();
    for e in fs::read_dir(root().join("docs")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "README.md" && !index.contains(&format!("({name}")) {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "docs/README.md does not list: {missing:?}"
    );
}

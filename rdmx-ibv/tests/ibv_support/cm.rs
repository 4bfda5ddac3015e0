//! What the connection-manager tests share: `tests/c/cm_events.c`, a librdmacm program
//! that prints each event it gets as `EVENT name status=S len=L pdata=P`, built once per
//! test binary.

use super::{require_tool, scratch};
use std::path::PathBuf;
use std::process::Command;

/// Builds `tests/c/cm_events.c` (-Wall -Wextra -Werror) into a scratch directory named
/// `build_dir`, returns the executable.
pub fn cm_events_exe(build_dir: &str) -> PathBuf {
    require_tool("cc");
    let exe = scratch(build_dir).join("cm_events");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/cm_events.c");
    let cc = Command::new("cc")
        .args([
            "-std=gnu11",
            "-g",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
        ])
        .arg(&exe)
        .arg(src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    exe
}

/// The event lines (`name status=S len=L pdata=P`) of a cm_events output.
pub fn events(out: &str) -> Vec<&str> {
    out.lines()
        .filter_map(|l| l.strip_prefix("EVENT "))
        .collect()
}

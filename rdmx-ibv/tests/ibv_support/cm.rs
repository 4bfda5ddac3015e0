//! What the connection-manager tests share: `tests/c/cm_events.c`, a librdmacm program
//! that prints each event it gets as `EVENT name status=S len=L pdata=P`, built once per
//! test binary.

use super::build_c;
use std::path::PathBuf;

/// Builds `tests/c/cm_events.c` into a scratch directory named `build_dir`.
pub fn cm_events_exe(build_dir: &str) -> PathBuf {
    build_c(
        build_dir,
        "tests/c/cm_events.c",
        "gnu11",
        &[],
        &["-lrdmacm", "-libverbs"],
    )
}

/// The event lines (`name status=S len=L pdata=P`) of a cm_events output.
pub fn events(out: &str) -> Vec<&str> {
    out.lines()
        .filter_map(|l| l.strip_prefix("EVENT "))
        .collect()
}

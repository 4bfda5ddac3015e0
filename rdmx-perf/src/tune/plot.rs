//! `--plot DIR`: writes `DIR/tune.json` and runs the plot script (`plot.py`, compiled into
//! the binary) with Debian's python3-matplotlib. matplotlib rather than a plotting crate:
//! it is already a dependency of the project (the Ceph harness draws its PNGs with it,
//! `scripts/install-deps.sh` installs it), it is the well-kept standard, and the plotters
//! crate would add a font/raster stack to the build of every rdmx-perf user for a feature
//! few of them run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The script, fed to `python3 -`.
const SCRIPT: &str = include_str!("plot.py");

/// Writes `json` to `dir/tune.json` and one PNG per sweep; returns the PNGs' paths.
pub fn plot(dir: &Path, json: &str) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("--plot {}: {e}", dir.display()))?;
    let data = dir.join("tune.json");
    std::fs::write(&data, json).map_err(|e| format!("{}: {e}", data.display()))?;
    // Debian's python, where python3-matplotlib is, not a python3 earlier in PATH (a
    // pyenv shim, a venv): as ceph-harness/lib.sh does.
    let python = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| !p.starts_with('/') || Path::new(p).exists())
        .unwrap_or("python3");
    let mut child = Command::new(python)
        .arg("-")
        .arg(&data)
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!("python3 (for --plot; Debian: apt-get install python3-matplotlib): {e}")
        })?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(SCRIPT.as_bytes())
            .map_err(|e| format!("python3: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let hint = if err.contains("No module named 'matplotlib'") {
            " (install python3-matplotlib: scripts/install-deps.sh does)"
        } else {
            ""
        };
        return Err(format!(
            "the plot script failed{hint}: {}",
            err.trim_end().lines().last().unwrap_or("")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect())
}

//! On verbs a NIC counts retransmission events per port, not per QP (the connection's packet
//! counters stay zero, docs/verbs-provider.md), so `--verify` on `--provider verbs` reads
//! the port's `hw_counters` before and after each run. They mix every QP and process on the
//! port: run tune on an otherwise quiet port. Names are the mlx5 ones (rxe has a subset);
//! a missing file is reported as not available, never as zero.

use std::path::{Path, PathBuf};

/// The counters read, in what `--verify` reports them as.
pub const NAMES: &[(&str, &str)] = &[
    ("local_ack_timeout_err", "ack_timeouts"),
    ("duplicate_request", "duplicates"),
    ("packet_seq_err", "seq_naks"),
    ("out_of_sequence", "out_of_sequence"),
    ("rnr_nak_retry_err", "rnr_retry_exceeded"),
];

const SYSFS: &str = "/sys/class/infiniband";

/// The port's `hw_counters` directory: `device` (empty: the first device listed) and `port`.
pub fn dir(device: &str, port: u8) -> Option<PathBuf> {
    let dev = if device.is_empty() {
        let mut names: Vec<String> = std::fs::read_dir(SYSFS)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().to_string()))
            .collect();
        names.sort();
        names.into_iter().next()?
    } else {
        device.to_string()
    };
    let d = Path::new(SYSFS)
        .join(dev)
        .join("ports")
        .join(port.to_string())
        .join("hw_counters");
    d.is_dir().then_some(d)
}

/// The counters of [`NAMES`] in `dir` (None for a counter the device does not have).
pub fn read(dir: &Path) -> Vec<Option<u64>> {
    NAMES
        .iter()
        .map(|(file, _)| {
            std::fs::read_to_string(dir.join(file))
                .ok()
                .and_then(|s| s.trim().parse().ok())
        })
        .collect()
}

/// `after - before` per counter (None where either is missing).
pub fn delta(before: &[Option<u64>], after: &[Option<u64>]) -> Vec<Option<u64>> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| a.zip(*b).map(|(a, b)| a.saturating_sub(b)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_exists_and_differences_need_both() {
        let d = std::env::temp_dir().join(format!("rdmx-tune-hw-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("local_ack_timeout_err"), "12\n").unwrap();
        std::fs::write(d.join("duplicate_request"), "bogus").unwrap();
        let r = read(&d);
        assert_eq!(r, [Some(12), None, None, None, None]);
        let after = [Some(15), Some(3), None, None, None];
        assert_eq!(delta(&r, &after), [Some(3), None, None, None, None]);
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(super::dir("no-such-device-rdmx", 1), None);
    }
}

//! Named profiles: sets of keys applied when `profile = NAME`, beneath file, env and explicit
//! values (Source::Profile precedence).

/// A named set of key values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    pub name: &'static str,
    /// Why the profile exists, in one line.
    pub help: &'static str,
    /// (key, value) pairs, keys canonical, values as a user would write them.
    pub values: &'static [(&'static str, &'static str)],
}

/// The value of the `profile` key meaning "no profile".
pub const NO_PROFILE: &str = "none";

/// Every profile. Values come from the seed article (docs/seed-notes.md) unless noted.
pub static PROFILES: &[Profile] = &[
    Profile {
        name: "ceph-before",
        help: "the Ceph cluster's timers before tuning: infinite RNR retry, 655 ms RNR wait, 67 ms ACK timeout",
        values: &[
            ("rnr_retry", "7"),
            ("min_rnr_timer", "0"),
            ("timeout", "14"),
        ],
    },
    Profile {
        name: "ceph-after",
        help: "the Ceph cluster's tuned timers: 2 RNR retries, 0.64 ms RNR wait, 4.2 ms ACK timeout (aggressive: suits a NIC; a userspace transport on a busy host may be away longer than 8 x 4.2 ms and see RETRY_EXC_ERR)",
        values: &[
            ("rnr_retry", "2"),
            ("min_rnr_timer", "12"),
            ("timeout", "10"),
        ],
    },
    Profile {
        name: "trading",
        help: "tail latency: separate CQs, deep send queue, shallow receive queue, busy polling",
        values: &[
            ("separate_cqs", "true"),
            ("max_send_wr", "512"),
            ("max_recv_wr", "128"),
            ("poll_mode", "busy"),
        ],
    },
    Profile {
        // Not from the seed: deeper queues than the 384 knee, bigger batches, busy polling
        // (seed: polling saves CPU in throughput-bound AI clusters).
        name: "throughput",
        help: "bulk transfer: deep queues, fewer signaled sends, bigger poll batches, busy polling",
        values: &[
            ("max_send_wr", "1024"),
            ("max_recv_wr", "1024"),
            ("signal_interval", "64"),
            ("post_batch", "32"),
            ("poll_batch", "64"),
            ("poll_mode", "busy"),
        ],
    },
];

/// The profile called `name` (canonical form, see `value::parse`).
pub fn find(name: &str) -> Option<&'static Profile> {
    PROFILES.iter().find(|p| p.name == name)
}

/// "none" and every profile name, for error messages.
pub(crate) fn names() -> Vec<&'static str> {
    std::iter::once(NO_PROFILE)
        .chain(PROFILES.iter().map(|p| p.name))
        .collect()
}

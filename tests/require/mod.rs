//! What a test needs from the host, and what it does when the host lacks it.
//!
//! Some tests need network namespaces, nftables, tc, IPv6, CAP_NET_RAW, a capture tool or
//! unprivileged user namespaces. Where the host lacks one, such a test cannot run its case.
//! By default it skips the case, printing why (stdout and stderr, so both `cargo test` and
//! `--nocapture` show it). With `RDMX_TEST_REQUIRE=all` (set by `scripts/test.sh`) the
//! missing capability fails the test instead, naming it: a CI run that passes has run every
//! case. `RDMX_TEST_REQUIRE` may also name capabilities, comma-separated
//! (`RDMX_TEST_REQUIRE=netns,ipv6`), to require only those.
//!
//! One file shared by every test crate: `mod require;` in `tests/`, and
//! `#[path = "../../tests/require/mod.rs"] mod require;` in `rdmx-ibv/` and `rdmx-perf/`.
//! The shell scripts use the same variable through `scripts/require.sh`; the C programs in
//! `ffi-tests/` through `ffi-tests/require.h`.
#![allow(dead_code)]

use std::fmt::Display;

/// Network namespaces and a veth pair (`ip netns`, root).
pub const NETNS: &str = "netns";
/// `nft` able to add and delete a table (root, nf_tables).
pub const NFT: &str = "nft";
/// tc's tbf qdisc (sch_tbf).
pub const TC: &str = "tc";
/// An IPv6 loopback address (::1).
pub const IPV6: &str = "ipv6";
/// A raw packet socket (CAP_NET_RAW).
pub const NET_RAW: &str = "net_raw";
/// A packet capture tool (tshark, tcpdump).
pub const CAPTURE: &str = "capture";
/// Unprivileged user namespaces (`unshare -r`).
pub const USERNS: &str = "userns";
/// Whatever `rdmx-ibv exec` needs to run a program (LD_PRELOAD of the provider).
pub const IBV_EXEC: &str = "ibv_exec";

/// Whether `RDMX_TEST_REQUIRE` makes `capability` mandatory: `all`, or a comma-separated
/// list that names it.
pub fn required(capability: &str) -> bool {
    required_by(
        std::env::var("RDMX_TEST_REQUIRE").ok().as_deref(),
        capability,
    )
}

fn required_by(var: Option<&str>, capability: &str) -> bool {
    var.is_some_and(|v| {
        v.split(',')
            .map(str::trim)
            .any(|c| c.eq_ignore_ascii_case("all") || c.eq_ignore_ascii_case(capability))
    })
}

/// The host lacks `capability` (`why`: the error that showed it). Panics, naming it, when
/// it is required; otherwise prints the skip line. The caller returns after this.
#[track_caller]
pub fn missing(capability: &str, what: &str, why: impl Display) {
    if required(capability) {
        panic!(
            "RDMX_TEST_REQUIRE={}: this test needs {capability} ({what}), which is missing here: \
             {why}",
            std::env::var("RDMX_TEST_REQUIRE").unwrap_or_default()
        );
    }
    let line = format!(
        "skipping {what}: needs {capability}, missing here: {why} \
         (RDMX_TEST_REQUIRE=all would fail instead)"
    );
    println!("{line}");
    eprintln!("{line}");
}

/// `Ok(v)` -> `Some(v)`; `Err(why)` -> [`missing`] then `None`.
#[track_caller]
pub fn or_skip<T, E: Display>(r: Result<T, E>, capability: &str, what: &str) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(why) => {
            missing(capability, what, why);
            None
        }
    }
}

#[test]
fn require_parses_all_and_lists() {
    assert!(!required_by(None, NETNS));
    assert!(!required_by(Some(""), NETNS));
    assert!(required_by(Some("all"), NETNS));
    assert!(required_by(Some("ALL"), IPV6));
    assert!(required_by(Some("ipv6, netns"), NETNS));
    assert!(!required_by(Some("ipv6,nft"), NETNS));
}

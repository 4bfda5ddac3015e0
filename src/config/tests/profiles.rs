//! Profiles: their values, their precedence in both call orders, unknown names.

use super::failure;
use crate::config::{Config, PROFILES, Source};
use crate::error::ErrorKind;

/// Expected profile contents, written out (not read from the table).
const EXPECTED: &[(&str, &[(&str, &str)])] = &[
    (
        "ceph-before",
        &[
            ("rnr_retry", "7"),
            ("min_rnr_timer", "0"),
            ("timeout", "14"),
        ],
    ),
    (
        "ceph-after",
        &[
            ("rnr_retry", "2"),
            ("min_rnr_timer", "12"),
            ("timeout", "10"),
        ],
    ),
    (
        "trading",
        &[
            ("separate_cqs", "true"),
            ("max_send_wr", "512"),
            ("max_recv_wr", "128"),
            ("poll_mode", "busy"),
        ],
    ),
    (
        "throughput",
        &[
            ("max_send_wr", "1024"),
            ("max_recv_wr", "1024"),
            ("signal_interval", "64"),
            ("post_batch", "32"),
            ("poll_batch", "64"),
            ("poll_mode", "busy"),
        ],
    ),
];

#[test]
fn every_profile_applies_its_values_at_profile_precedence() {
    assert_eq!(PROFILES.len(), EXPECTED.len());
    for (name, values) in EXPECTED {
        let mut config = Config::new();
        config.set("profile", name).unwrap();
        assert_eq!(config.get("profile").unwrap(), *name);
        for (key, value) in *values {
            assert_eq!(config.get(key).unwrap(), *value, "{name}: {key}");
            assert_eq!(
                config.source(key).unwrap(),
                Source::Profile,
                "{name}: {key}"
            );
        }
        // Keys the profile leaves alone keep their defaults.
        assert_eq!(config.source("soft_port").unwrap(), Source::Default);
        // Every profile is consistent on top of the defaults.
        config.validate().unwrap();
        assert_eq!(config.settings().unwrap().profile, Some(*name));
    }
}

#[test]
fn profile_values_are_the_seed_columns() {
    let mut config = Config::new();
    config.set("profile", "ceph-before").unwrap();
    let before = config.settings().unwrap();
    assert!(before.rnr_retry_infinite());
    assert_eq!(before.min_rnr_timer_ns(), 655_360_000);
    assert_eq!(before.ack_timeout_ns(), Some(67_108_864));
    config.set("profile", "ceph-after").unwrap();
    let after = config.settings().unwrap();
    assert!(!after.rnr_retry_infinite());
    assert_eq!(after.min_rnr_timer_ns(), 640_000);
    assert_eq!(after.ack_timeout_ns(), Some(4_194_304));
}

#[test]
fn explicit_key_then_profile_keeps_the_key() {
    let mut config = Config::new();
    config.set("timeout", "5").unwrap();
    config.set("profile", "ceph-before").unwrap();
    assert_eq!(config.get("timeout").unwrap(), "5");
    assert_eq!(config.source("timeout").unwrap(), Source::Explicit);
    assert_eq!(config.get("rnr_retry").unwrap(), "7");
    assert_eq!(config.source("rnr_retry").unwrap(), Source::Profile);
}

#[test]
fn profile_then_explicit_key_keeps_the_key() {
    let mut config = Config::new();
    config.set("profile", "ceph-before").unwrap();
    config.set("timeout", "5").unwrap();
    assert_eq!(config.get("timeout").unwrap(), "5");
    assert_eq!(config.source("timeout").unwrap(), Source::Explicit);
    assert_eq!(config.get("min_rnr_timer").unwrap(), "0");
}

#[test]
fn file_and_env_values_also_beat_the_profile() {
    let mut config = Config::from_env_vars([("RDMX_RNR_RETRY", "1")]).unwrap();
    config
        .load_str("profile = ceph-before\nmin_rnr_timer = 3\n", "t.conf")
        .unwrap();
    assert_eq!(config.get("rnr_retry").unwrap(), "1");
    assert_eq!(config.get("min_rnr_timer").unwrap(), "3");
    assert_eq!(config.get("timeout").unwrap(), "14");
    assert_eq!(config.source("timeout").unwrap(), Source::Profile);
}

#[test]
fn the_highest_source_of_profile_chooses_the_profile() {
    let mut config = Config::new();
    config.set("profile", "ceph-after").unwrap();
    config
        .load_str("profile = ceph-before\n", "t.conf")
        .unwrap();
    assert_eq!(config.get("rnr_retry").unwrap(), "2");
    config.set("profile", "none").unwrap();
    assert_eq!(config.get("timeout").unwrap(), "14");
    assert_eq!(config.source("timeout").unwrap(), Source::Default);
    assert_eq!(config.settings().unwrap().profile, None);
}

#[test]
fn changing_the_profile_replaces_its_values() {
    let mut config = Config::new();
    config.set("profile", "trading").unwrap();
    assert_eq!(config.get("max_recv_wr").unwrap(), "128");
    config.set("profile", "ceph-before").unwrap();
    assert_eq!(config.get("max_recv_wr").unwrap(), "256");
    assert_eq!(config.source("max_recv_wr").unwrap(), Source::Default);
}

#[test]
fn profile_names_are_forgiving_about_case_and_underscores() {
    let mut config = Config::new();
    config.set("profile", " Ceph_After ").unwrap();
    assert_eq!(config.get("profile").unwrap(), "ceph-after");
    config.set("profile", "NONE").unwrap();
    assert_eq!(config.get("profile").unwrap(), "none");
}

#[test]
fn unknown_profile_lists_the_known_ones() {
    let mut config = Config::new();
    let allowed = "allowed one of none, ceph-before, ceph-after, trading, throughput";
    assert_eq!(
        failure(config.set("profile", "ceph-befor")),
        (
            ErrorKind::InvalidValue,
            format!("profile: invalid value 'ceph-befor': {allowed} (did you mean 'ceph-before'?)")
        )
    );
    assert_eq!(
        failure(config.set("profile", "fast")),
        (
            ErrorKind::InvalidValue,
            format!("profile: invalid value 'fast': {allowed}")
        )
    );
    assert_eq!(config.get("profile").unwrap(), "none");
}

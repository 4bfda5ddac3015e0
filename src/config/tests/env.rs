//! RDMX_<KEY> environment variables (passed in, so the process environment is untouched).

use super::failure;
use crate::config::{Config, Source};
use crate::error::ErrorKind;

#[test]
fn rdmx_variables_set_keys_at_env_precedence() {
    let config = Config::from_env_vars([
        ("RDMX_RNR_RETRY", "3"),
        ("RDMX_PATH_MTU", "4096"),
        ("RDMX_POLL_MODE", "busy"),
        ("PATH", "/usr/bin"),
        ("rdmx_sl", "9"),
        ("HOME", "/root"),
    ])
    .unwrap();
    assert_eq!(config.get("rnr_retry").unwrap(), "3");
    assert_eq!(config.source("rnr_retry").unwrap(), Source::Env);
    assert_eq!(config.get("path_mtu").unwrap(), "4096");
    assert_eq!(config.get("poll_mode").unwrap(), "busy");
    // Lower-case names are not ours.
    assert_eq!(config.get("sl").unwrap(), "0");
}

#[test]
fn owned_strings_work_too() {
    let vars = vec![("RDMX_SL".to_string(), "4".to_string())];
    let config = Config::from_env_vars(vars).unwrap();
    assert_eq!(config.get("sl").unwrap(), "4");
}

#[test]
fn unknown_rdmx_variable_is_named() {
    assert_eq!(
        failure(Config::from_env_vars([("RDMX_RNR_RETYR", "3")])),
        (
            ErrorKind::UnknownKey,
            "unknown environment variable 'RDMX_RNR_RETYR' (did you mean 'RDMX_RNR_RETRY'?)"
                .to_string()
        )
    );
    assert_eq!(
        failure(Config::from_env_vars([("RDMX_BOGUS", "3")])),
        (
            ErrorKind::UnknownKey,
            "unknown environment variable 'RDMX_BOGUS'".to_string()
        )
    );
}

#[test]
fn invalid_value_names_the_variable_and_the_key() {
    assert_eq!(
        failure(Config::from_env_vars([("RDMX_RNR_RETRY", "8")])),
        (
            ErrorKind::InvalidValue,
            "RDMX_RNR_RETRY: rnr_retry: invalid value '8': allowed 0..7 (7 = infinite)".to_string()
        )
    );
}

#[test]
fn env_is_all_or_nothing() {
    let mut config = Config::new();
    let result = config.load_env_vars([("RDMX_SL", "3"), ("RDMX_PORT", "0")]);
    assert_eq!(
        failure(result),
        (
            ErrorKind::InvalidValue,
            "RDMX_PORT: port: invalid value '0': allowed 1..255".to_string()
        )
    );
    assert_eq!(config.get("sl").unwrap(), "0");
    assert_eq!(config.source("sl").unwrap(), Source::Default);
}

#[test]
fn ceph_names_work_in_env() {
    let config = Config::from_env_vars([("RDMX_MS_ASYNC_RDMA_SL", "3")]).unwrap();
    assert_eq!(config.get("sl").unwrap(), "3");
    assert_eq!(config.source("sl").unwrap(), Source::Env);
    assert_eq!(
        failure(Config::from_env_vars([("RDMX_MS_ASYNC_RDMA_CM", "true")])),
        (
            ErrorKind::InvalidValue,
            "RDMX_MS_ASYNC_RDMA_CM: ms_async_rdma_cm: not supported by rdmx: rdmx exchanges QP details over a TCP side channel, not rdma_cm"
                .to_string()
        )
    );
}

#[test]
fn non_config_rdmx_variables_are_left_alone() {
    let config = Config::from_env_vars([("RDMX_LOG", "debug")]).unwrap();
    assert_eq!(config, Config::new());
    let config = Config::from_env_vars([("RDMX_TEST_REQUIRE", "all")]).unwrap();
    assert_eq!(config, Config::new());
}

#[test]
fn from_env_reads_the_process_environment() {
    // Nothing sets RDMX_ variables in the test environment (but RDMX_TEST_REQUIRE, which
    // is not configuration); this only checks it does not fail.
    if std::env::vars_os().all(|(k, _)| {
        let k = k.to_string_lossy();
        !k.starts_with("RDMX_") || k == "RDMX_TEST_REQUIRE"
    }) {
        assert_eq!(Config::from_env().unwrap(), Config::new());
    }
}

#[test]
fn foreign_rdmx_variables_are_those_far_from_every_key() {
    use crate::config::is_foreign_env_var;
    // A program's own variables: no key is near.
    assert!(is_foreign_env_var("RDMX_HOME"));
    assert!(is_foreign_env_var("RDMX_MY_APP_BUILD_DIR"));
    // Keys, Ceph names, rdmx's own non-config variables, and typos of keys are rdmx's.
    for ours in [
        "RDMX_RNR_RETRY",
        "RDMX_MS_ASYNC_RDMA_SL",
        "RDMX_LOG",
        "RDMX_RNR_RETYR",
        "RDMX_POLING_US",
        "RDMX_MS_ASYNC_RDMA_CM",
    ] {
        assert!(!is_foreign_env_var(ours), "{ours}");
    }
    // Not an RDMX_ variable at all: not ours to judge.
    assert!(!is_foreign_env_var("HOME"));
}

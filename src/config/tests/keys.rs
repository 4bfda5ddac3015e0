//! Every key's default and range edges; value forms; key normalization; unknown keys.

use super::failure;
use crate::config::{Config, KEYS, Source, lookup_key};
use crate::error::ErrorKind;

/// (key, default, min, max, note shown after the range).
const UINT_KEYS: &[(&str, &str, u64, u64, &str)] = &[
    ("port", "1", 1, 255, ""),
    ("gid_index", "0", 0, 255, ""),
    ("max_send_wr", "256", 1, 32768, ""),
    ("max_recv_wr", "256", 1, 32768, ""),
    ("max_send_sge", "2", 1, 32, ""),
    ("max_recv_sge", "1", 1, 32, ""),
    ("max_inline_data", "64", 0, 1024, ""),
    (
        "send_cq_size",
        "0",
        0,
        4194304,
        "0 = auto: 2 x the WRs sharing the CQ",
    ),
    (
        "recv_cq_size",
        "0",
        0,
        4194304,
        "0 = auto: 2 x the WRs sharing the CQ",
    ),
    ("signal_interval", "16", 1, 32768, ""),
    ("post_batch", "32", 1, 32768, ""),
    ("timeout", "14", 0, 31, "0 = no ACK timer"),
    ("retry_cnt", "7", 0, 7, "7 = seven retries"),
    ("rnr_retry", "2", 0, 7, "7 = infinite"),
    (
        "min_rnr_timer",
        "12",
        0,
        31,
        "timer code; 0 = 655.36 ms, the longest",
    ),
    ("max_rd_atomic", "16", 0, 255, ""),
    ("max_dest_rd_atomic", "16", 0, 255, ""),
    ("sl", "0", 0, 15, ""),
    ("traffic_class", "0", 0, 255, ""),
    ("pool_chunks", "1024", 1, 16777216, ""),
    ("rcache_entries", "1024", 0, 1048576, "0 = cache off"),
    ("polling_us", "1000", 0, 1000000, ""),
    ("poll_batch", "32", 1, 1024, ""),
    ("credits", "0", 0, 32768, "0 = auto = max_recv_wr"),
    ("soft_port", "4791", 0, 65535, "0 = any free port"),
    ("poll_yield_after", "64", 0, 1000000, "0 = never yield"),
    (
        "msgr_threads",
        "0",
        0,
        64,
        "0 = the caller drives progress with poll()",
    ),
    ("msgr_keepalive_ms", "1000", 0, 3600000, "0 = no keepalive"),
    ("msgr_keepalive_timeout_ms", "5000", 1, 3600000, ""),
    ("msgr_reconnect_min_ms", "10", 1, 60000, ""),
    ("msgr_reconnect_max_ms", "1000", 1, 60000, ""),
    ("msgr_reconnect_timeout_ms", "60000", 1, 86400000, ""),
    (
        "msgr_reconnect_attempts",
        "0",
        0,
        1000000,
        "0 = no limit but the timeout",
    ),
    ("msgr_send_queue_msgs", "4096", 1, 1048576, ""),
    ("msgr_send_queue_bytes", "67108864", 4096, 1099511627776, ""),
    ("msgr_recv_window", "64", 4, 32768, ""),
    ("msgr_recv_window_min", "4", 2, 32768, ""),
    ("msgr_pool_chunks", "16384", 64, 16777216, ""),
    ("msgr_eager_max", "4096", 0, 4096, ""),
    ("msgr_rx_batch", "16", 0, 65536, "0 = no limit"),
    (
        "msgr_worker_slice_us",
        "0",
        0,
        100000,
        "0 = the kernel's default slice",
    ),
    ("msgr_max_message_bytes", "16777216", 4096, 1073741824, ""),
    ("msgr_max_segments", "64", 1, 64, ""),
    ("handshake_first_bytes_ms", "500", 1, 60000, ""),
    ("handshake_timeout_ms", "10000", 1, 600000, ""),
    ("handshake_max", "256", 1, 65536, ""),
    ("handshake_per_source", "32", 1, 65536, ""),
    ("msgr_max_pending_links", "256", 1, 1048576, ""),
    ("msgr_max_sessions", "4096", 1, 16777216, ""),
    ("msgr_max_sessions_per_entity", "1024", 1, 16777216, ""),
    ("io_fail_timeout_ms", "30000", 1, 86400000, ""),
    ("blk_path_retry_min_ms", "10", 1, 60000, ""),
    ("blk_path_retry_max_ms", "1000", 1, 600000, ""),
];

/// Keys with other kinds, and their defaults.
const OTHER_KEYS: &[(&str, &str)] = &[
    ("provider", "auto"),
    ("device", ""),
    ("separate_cqs", "true"),
    ("path_mtu", "1024"),
    ("chunk_size", "4096"),
    ("hugepages", "auto"),
    ("poll_mode", "adaptive"),
    ("profile", "none"),
    ("soft_drop_ratio", "0"),
    ("soft_gso", "true"),
    ("soft_pin", "true"),
    ("soft_addr", ""),
    ("progress", "inline"),
    ("qp_override", ""),
    ("msgr_policy", "lossless"),
    ("msgr_eager_write", "true"),
    ("msgr_path_failback", "true"),
    ("msgr_scoped_rkeys", "true"),
    ("auth", "auto"),
    ("auth_keyring", ""),
    ("auth_entity", "client.admin"),
    ("blk_path_policy", "standby"),
    ("blk_failback", "true"),
];

fn range_message(key: &str, value: &str, min: u64, max: u64, note: &str) -> String {
    let note = if note.is_empty() {
        String::new()
    } else {
        format!(" ({note})")
    };
    format!("{key}: invalid value '{value}': allowed {min}..{max}{note}")
}

#[test]
fn every_key_is_covered_by_these_tests() {
    let mut tested: Vec<&str> = UINT_KEYS.iter().map(|k| k.0).collect();
    tested.extend(OTHER_KEYS.iter().map(|k| k.0));
    tested.sort_unstable();
    let mut table: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
    table.sort_unstable();
    assert_eq!(tested, table);
}

#[test]
fn every_key_has_help_and_a_default_that_parses() {
    for spec in KEYS {
        assert!(!spec.help.is_empty(), "{} has no help", spec.name);
        let mut config = Config::new();
        config.set(spec.name, spec.default).unwrap();
        assert_eq!(config.get(spec.name).unwrap(), spec.default);
    }
}

#[test]
fn defaults() {
    let config = Config::new();
    for (key, default, ..) in UINT_KEYS {
        assert_eq!(config.get(key).unwrap(), *default, "{key}");
        assert_eq!(config.source(key).unwrap(), Source::Default, "{key}");
    }
    for (key, default) in OTHER_KEYS {
        assert_eq!(config.get(key).unwrap(), *default, "{key}");
        assert_eq!(config.source(key).unwrap(), Source::Default, "{key}");
    }
}

#[test]
fn numeric_range_edges() {
    for &(key, _, min, max, note) in UINT_KEYS {
        let mut config = Config::new();
        for ok in [min, max] {
            config.set(key, &ok.to_string()).unwrap();
            assert_eq!(config.get(key).unwrap(), ok.to_string(), "{key}");
            assert_eq!(config.source(key).unwrap(), Source::Explicit, "{key}");
        }
        let mut beyond = vec![max + 1];
        if min > 0 {
            beyond.push(min - 1);
        }
        for bad in beyond {
            let text = bad.to_string();
            assert_eq!(
                failure(config.set(key, &text)),
                (
                    ErrorKind::InvalidValue,
                    range_message(key, &text, min, max, note)
                )
            );
        }
        // A rejected set leaves the last good value.
        assert_eq!(config.get(key).unwrap(), max.to_string(), "{key}");
    }
}

#[test]
fn messages_from_the_issue() {
    let mut config = Config::new();
    assert_eq!(
        failure(config.set("rnr_retry", "8")).1,
        "rnr_retry: invalid value '8': allowed 0..7 (7 = infinite)"
    );
    assert_eq!(
        failure(config.set("path_mtu", "1000")).1,
        "path_mtu: invalid value '1000': allowed one of 256, 512, 1024, 2048, 4096"
    );
    assert_eq!(
        failure(config.set("timeout", "32")).1,
        "timeout: invalid value '32': allowed 0..31 (0 = no ACK timer)"
    );
}

#[test]
fn numbers_are_plain_decimal() {
    let mut config = Config::new();
    for bad in [
        "",
        " ",
        "-1",
        "+1",
        "1x",
        "x1",
        "0x10",
        "1 2",
        "1.0",
        "1_0",
        "18446744073709551616",
        "99999999999999999999999999",
    ] {
        assert_eq!(
            failure(config.set("rnr_retry", bad)),
            (
                ErrorKind::InvalidValue,
                format!("rnr_retry: invalid value '{bad}': allowed 0..7 (7 = infinite)")
            )
        );
    }
    config.set("rnr_retry", " 3 ").unwrap();
    assert_eq!(config.get("rnr_retry").unwrap(), "3");
    config.set("max_send_wr", "0512").unwrap();
    assert_eq!(config.get("max_send_wr").unwrap(), "512");
}

#[test]
fn path_mtu_values() {
    let mut config = Config::new();
    for ok in ["256", "512", "1024", "2048", "4096"] {
        config.set("path_mtu", ok).unwrap();
        assert_eq!(config.get("path_mtu").unwrap(), ok);
    }
    for bad in ["128", "255", "257", "4097", "8192", "0"] {
        assert_eq!(
            failure(config.set("path_mtu", bad)),
            (
                ErrorKind::InvalidValue,
                format!(
                    "path_mtu: invalid value '{bad}': allowed one of 256, 512, 1024, 2048, 4096"
                )
            )
        );
    }
}

#[test]
fn chunk_size_is_a_power_of_two_in_range() {
    let mut config = Config::new();
    for ok in ["512", "1024", "4096", "131072", "2097152"] {
        config.set("chunk_size", ok).unwrap();
        assert_eq!(config.get("chunk_size").unwrap(), ok);
    }
    for bad in ["256", "511", "513", "1000", "2097153", "4194304", "0"] {
        assert_eq!(
            failure(config.set("chunk_size", bad)),
            (
                ErrorKind::InvalidValue,
                format!(
                    "chunk_size: invalid value '{bad}': allowed a power of two in 512..2097152"
                )
            )
        );
    }
}

#[test]
fn booleans() {
    let mut config = Config::new();
    for (given, canonical) in [
        ("true", "true"),
        ("false", "false"),
        ("1", "true"),
        ("0", "false"),
        ("yes", "true"),
        ("no", "false"),
        ("on", "true"),
        ("off", "false"),
        ("TRUE", "true"),
        (" Off ", "false"),
    ] {
        config.set("separate_cqs", given).unwrap();
        assert_eq!(config.get("separate_cqs").unwrap(), canonical, "{given}");
        assert_eq!(
            config.get_bool("separate_cqs").unwrap(),
            canonical == "true"
        );
    }
    // soft_gso reaches the soft provider's settings (the QPs' TxOptions).
    assert!(config.settings().unwrap().soft_gso);
    config.set("soft_gso", "off").unwrap();
    assert!(!config.settings().unwrap().soft_gso);
    // soft_pin reaches the soft provider's settings (its MrTable).
    assert!(config.settings().unwrap().soft_pin);
    config.set("soft_pin", "false").unwrap();
    assert!(!config.settings().unwrap().soft_pin);
    for bad in ["", "2", "y", "maybe", "truee"] {
        assert_eq!(
            failure(config.set("separate_cqs", bad)),
            (
                ErrorKind::InvalidValue,
                format!(
                    "separate_cqs: invalid value '{bad}': allowed true or false (also 1/0, yes/no, on/off)"
                )
            )
        );
    }
}

#[test]
fn word_keys() {
    let cases: &[(&str, &[&str], &str)] = &[
        ("provider", &["auto", "soft", "verbs"], "auto, soft, verbs"),
        ("hugepages", &["auto", "on", "off"], "auto, on, off"),
        (
            "poll_mode",
            &["busy", "event", "adaptive"],
            "busy, event, adaptive",
        ),
        ("progress", &["thread", "inline"], "thread, inline"),
    ];
    for &(key, words, allowed) in cases {
        let mut config = Config::new();
        for word in words {
            config.set(key, &word.to_uppercase()).unwrap();
            assert_eq!(config.get(key).unwrap(), *word);
        }
        for bad in ["", "rxe", "true", "1"] {
            assert_eq!(
                failure(config.set(key, bad)),
                (
                    ErrorKind::InvalidValue,
                    format!("{key}: invalid value '{bad}': allowed one of {allowed}")
                )
            );
        }
    }
}

#[test]
fn device_names() {
    let mut config = Config::new();
    let longest = "d".repeat(63);
    for ok in [
        "mlx5_0",
        "rxe0",
        "rocep1s0f0",
        "a.b-c_d",
        "",
        longest.as_str(),
    ] {
        config.set("device", ok).unwrap();
        assert_eq!(config.get("device").unwrap(), ok);
    }
    let too_long = "d".repeat(64);
    for bad in ["mlx5 0", "a/b", "../x", "dév", too_long.as_str()] {
        assert_eq!(
            failure(config.set("device", bad)),
            (
                ErrorKind::InvalidValue,
                format!(
                    "device: invalid value '{bad}': allowed a device name of letters, digits, '_', '-', '.' (at most 63; empty = first device)"
                )
            )
        );
    }
}

#[test]
fn messages_quote_control_characters_and_cut_long_values() {
    let mut config = Config::new();
    assert_eq!(
        failure(config.set("sl", "1\n2")).1,
        "sl: invalid value '1\\n2': allowed 0..15"
    );
    let long = "9".repeat(100);
    assert_eq!(
        failure(config.set("sl", &long)).1,
        format!("sl: invalid value '{}...': allowed 0..15", "9".repeat(64))
    );
}

#[test]
fn keys_are_normalized() {
    let mut config = Config::new();
    for (written, value) in [
        ("RNR_RETRY", "1"),
        ("rnr-retry", "3"),
        ("  rnr retry  ", "4"),
        ("Rnr  Retry", "5"),
    ] {
        config.set(written, value).unwrap();
        assert_eq!(config.get("rnr_retry").unwrap(), value);
        assert_eq!(config.get(written).unwrap(), value);
    }
    assert_eq!(lookup_key("Max-Send-WR").unwrap().name, "max_send_wr");
}

#[test]
fn unknown_keys_suggest_the_closest() {
    let mut config = Config::new();
    let cases = [
        (
            "rnr_retyr",
            "unknown key 'rnr_retyr' (did you mean 'rnr_retry'?)",
        ),
        (
            "RNR-RETYR",
            "unknown key 'RNR-RETYR' (did you mean 'rnr_retry'?)",
        ),
        (
            "max_sendwr",
            "unknown key 'max_sendwr' (did you mean 'max_send_wr'?)",
        ),
        ("timout", "unknown key 'timout' (did you mean 'timeout'?)"),
        ("mtu", "unknown key 'mtu'"),
        ("", "unknown key ''"),
        ("frobnicate", "unknown key 'frobnicate'"),
        (
            "ms_async_rdma_bufer_size",
            "unknown key 'ms_async_rdma_bufer_size' (did you mean 'ms_async_rdma_buffer_size'?)",
        ),
        (
            "ms_async_rdma_zzz_option_xyz",
            "unknown key 'ms_async_rdma_zzz_option_xyz': this Ceph option has no rdmx equivalent",
        ),
    ];
    for (key, message) in cases {
        assert_eq!(
            failure(config.set(key, "1")),
            (ErrorKind::UnknownKey, message.to_string())
        );
        assert_eq!(
            failure(config.get(key)),
            (ErrorKind::UnknownKey, message.to_string())
        );
        assert_eq!(failure(config.source(key)).0, ErrorKind::UnknownKey);
    }
}

#[test]
fn typed_getters() {
    let config = Config::new();
    assert_eq!(config.get_u64("max_send_wr").unwrap(), 256);
    assert!(config.get_bool("separate_cqs").unwrap());
    assert_eq!(
        failure(config.get_u64("provider")),
        (
            ErrorKind::InvalidArgument,
            "provider: not a number (use get)".to_string()
        )
    );
    assert_eq!(
        failure(config.get_bool("port")),
        (
            ErrorKind::InvalidArgument,
            "port: not a boolean (use get)".to_string()
        )
    );
}

#[test]
fn set_from_rejects_the_derived_sources() {
    let mut config = Config::new();
    assert_eq!(
        failure(config.set_from("rnr_retry", "3", Source::Default)).0,
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        failure(config.set_from("rnr_retry", "3", Source::Profile)).0,
        ErrorKind::InvalidArgument
    );
    assert_eq!(config.get("rnr_retry").unwrap(), "2");
}

#[test]
fn keys_text_has_one_line_per_key() {
    let text = crate::config::keys_text();
    assert_eq!(text.lines().count(), KEYS.len());
    assert!(text.contains(
        "rnr_retry [default \"2\"] allowed 0..7 (7 = infinite): retries after an RNR NAK"
    ));
    assert_eq!(
        lookup_key("ms_async_rdma_sl").unwrap().kind.allowed(),
        "0..15"
    );
}

#[test]
fn qp_override_takes_a_set_of_attribute_names() {
    let mut config = Config::new();
    assert_eq!(config.settings().unwrap().qp_override, Default::default());
    config
        .set("qp_override", " Min_RNR_Timer , timeout")
        .unwrap();
    assert_eq!(config.get("qp_override").unwrap(), "timeout,min_rnr_timer");
    let o = config.settings().unwrap().qp_override;
    assert!(o.timeout && o.min_rnr_timer && !o.retry_cnt && !o.rnr_retry);
    config
        .set("qp_override", "timeout,retry_cnt,rnr_retry,min_rnr_timer")
        .unwrap();
    let o = config.settings().unwrap().qp_override;
    assert!(o.timeout && o.retry_cnt && o.rnr_retry && o.min_rnr_timer);
    config.set("qp_override", "").unwrap();
    assert!(!config.settings().unwrap().qp_override.any());
    for bad in [
        "sq_psn",
        "timeout,timeout",
        "timeout,",
        ",",
        "timeout;retry_cnt",
    ] {
        assert_eq!(
            failure(config.set("qp_override", bad)),
            (
                ErrorKind::InvalidValue,
                format!(
                    "qp_override: invalid value '{bad}': allowed a comma-separated list of timeout, retry_cnt, rnr_retry, min_rnr_timer (each at most once; empty = none)"
                )
            ),
            "{bad}"
        );
    }
}

#[test]
fn ratio_keys_take_decimal_fractions() {
    let mut config = Config::new();
    for (given, shown) in [
        ("0", "0"),
        ("0.001", "0.001"),
        (".5", "0.5"),
        ("1", "1"),
        ("1.0", "1"),
        ("0.000000001", "0.000000001"),
    ] {
        config.set("soft_drop_ratio", given).unwrap();
        assert_eq!(config.get("soft_drop_ratio").unwrap(), shown, "{given}");
    }
    config.set("soft_drop_ratio", "0.001").unwrap();
    assert_eq!(config.settings().unwrap().soft_drop_ppb, 1_000_000);
    for bad in [
        "",
        ".",
        "1.5",
        "2",
        "-0.1",
        "0.0000000001",
        "1e-3",
        "0.1.2",
        "abc",
    ] {
        assert_eq!(
            failure(config.set("soft_drop_ratio", bad)),
            (
                ErrorKind::InvalidValue,
                format!(
                    "soft_drop_ratio: invalid value '{bad}': allowed a decimal fraction in 0..1 with at most 9 decimals, e.g. 0.001"
                )
            ),
            "{bad}"
        );
    }
}

#[test]
fn soft_addr_takes_an_ip_address_or_nothing() {
    let mut config = Config::new();
    for ok in ["127.0.0.1", "10.0.0.2", "::1", "fd00::2", ""] {
        config.set("soft_addr", ok).unwrap();
        let want = (!ok.is_empty()).then(|| ok.parse().unwrap());
        assert_eq!(config.settings().unwrap().soft_addr, want, "{ok}");
    }
    for bad in [
        "127.0.0.1:4791",
        "[::1]",
        "localhost",
        "10.0.0",
        "1.2.3.4.5",
    ] {
        let (kind, message) = failure(config.set("soft_addr", bad));
        assert_eq!(kind, ErrorKind::InvalidValue, "{bad}");
        assert!(
            message.contains("allowed an IPv4 or IPv6 address without port or brackets"),
            "{bad}: {message}"
        );
    }
}

#[test]
fn text_keys_take_one_line_of_text() {
    let mut c = Config::new();
    c.set("auth_keyring", "/etc/ceph/ceph.client.fio.keyring")
        .unwrap();
    assert_eq!(
        c.get("auth_keyring").unwrap(),
        "/etc/ceph/ceph.client.fio.keyring"
    );
    let e = c.set("auth_keyring", "a\nb").unwrap_err();
    assert_eq!(e.kind(), crate::error::ErrorKind::InvalidValue);
    assert!(e.message().contains("text on one line"), "{e}");
    let long = "x".repeat(4097);
    assert!(c.set("auth_entity", &long).is_err());
    assert!(c.set("auth", "sometimes").is_err());
    c.set("auth", "REQUIRED").unwrap();
    assert_eq!(c.get("auth").unwrap(), "required");
}

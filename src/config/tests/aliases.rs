//! Ceph `ms_async_rdma_*` names: every mapped one and every rejected one.

use super::failure;
use crate::config::{ALIASES, AliasTarget, Config, Source};
use crate::error::ErrorKind;

/// (Ceph name, value given, rdmx key, value expected there).
const MAPPED: &[(&str, &str, &str, &str)] = &[
    (
        "ms_async_rdma_buffer_size",
        "131072",
        "chunk_size",
        "131072",
    ),
    ("ms_async_rdma_send_buffers", "1024", "max_send_wr", "1024"),
    (
        "ms_async_rdma_receive_buffers",
        "32768",
        "pool_chunks",
        "32768",
    ),
    (
        "ms_async_rdma_receive_queue_len",
        "4096",
        "max_recv_wr",
        "4096",
    ),
    ("ms_async_rdma_polling_us", "1000", "polling_us", "1000"),
    ("ms_async_rdma_gid_idx", "3", "gid_index", "3"),
    ("ms_async_rdma_sl", "3", "sl", "3"),
    ("ms_async_rdma_dscp", "96", "traffic_class", "96"),
    ("ms_async_rdma_device_name", "mlx5_1", "device", "mlx5_1"),
    ("ms_async_rdma_port_num", "2", "port", "2"),
    ("ms_async_rdma_enable_hugepage", "true", "hugepages", "on"),
    ("ms_async_op_threads", "3", "msgr_threads", "3"),
];

/// (Ceph name, the reason given).
const REJECTED: &[(&str, &str)] = &[
    (
        "ms_async_rdma_support_srq",
        "rdmx's messenger uses no SRQ: each connection posts its own receives and grants credits for them, so receivers are not starved (SRQs exist for verbs applications under rdmx-ibv, which keep their own setting)",
    ),
    (
        "ms_async_rdma_cm",
        "rdmx exchanges QP details over a TCP side channel, not rdma_cm",
    ),
    (
        "ms_async_rdma_type",
        "rdmx speaks RoCEv2 RC only (no InfiniBand or iWARP)",
    ),
    ("ms_async_rdma_roce_ver", "rdmx speaks RoCEv2 only"),
    ("ms_async_rdma_local_gid", "rdmx picks the GID by gid_index"),
];

#[test]
fn the_alias_table_is_exactly_what_is_tested() {
    let mut tested: Vec<&str> = MAPPED.iter().map(|m| m.0).collect();
    tested.extend(REJECTED.iter().map(|r| r.0));
    let table: Vec<&str> = ALIASES.iter().map(|a| a.name).collect();
    assert_eq!(tested, table);
    for alias in ALIASES {
        assert!(!alias.why.is_empty(), "{}", alias.name);
        if let AliasTarget::Key { key, .. } = alias.target {
            let mapped = MAPPED.iter().find(|m| m.0 == alias.name).unwrap();
            assert_eq!(key, mapped.2);
        }
    }
}

#[test]
fn every_mapped_name_sets_its_rdmx_key() {
    for &(alias, given, key, expected) in MAPPED {
        let mut config = Config::new();
        config.set(alias, given).unwrap();
        assert_eq!(config.get(key).unwrap(), expected, "{alias}");
        assert_eq!(config.get(alias).unwrap(), expected, "{alias}");
        assert_eq!(config.source(key).unwrap(), Source::Explicit, "{alias}");
        assert_eq!(config.source(alias).unwrap(), Source::Explicit, "{alias}");
        // In a file (Ceph's spaced spelling too) and in env.
        let mut config = Config::new();
        let spaced = alias.replace('_', " ");
        config
            .load_str(&format!("[global]\n{spaced} = {given}\n"), "ceph.conf")
            .unwrap();
        assert_eq!(config.get(key).unwrap(), expected, "{alias} in a file");
        let var = format!("RDMX_{}", alias.to_uppercase());
        let config = Config::from_env_vars([(var.as_str(), given)]).unwrap();
        assert_eq!(config.get(key).unwrap(), expected, "{alias} in env");
    }
}

#[test]
fn get_on_an_alias_reads_the_rdmx_key() {
    let mut config = Config::new();
    config.set("chunk_size", "8192").unwrap();
    assert_eq!(config.get("ms_async_rdma_buffer_size").unwrap(), "8192");
    assert_eq!(config.get("ms_async_rdma_enable_hugepage").unwrap(), "auto");
    assert_eq!(
        config.source("ms_async_rdma_buffer_size").unwrap(),
        Source::Explicit
    );
}

#[test]
fn enable_hugepage_maps_booleans_to_on_off() {
    let mut config = Config::new();
    for (given, expected) in [
        ("true", "on"),
        ("false", "off"),
        ("1", "on"),
        ("0", "off"),
        ("yes", "on"),
        ("no", "off"),
    ] {
        config.set("ms_async_rdma_enable_hugepage", given).unwrap();
        assert_eq!(config.get("hugepages").unwrap(), expected, "{given}");
    }
    assert_eq!(
        failure(config.set("ms_async_rdma_enable_hugepage", "auto")),
        (
            ErrorKind::InvalidValue,
            "ms_async_rdma_enable_hugepage (rdmx key 'hugepages'): invalid value 'auto': allowed true or false (also 1/0, yes/no, on/off)"
                .to_string()
        )
    );
}

#[test]
fn alias_values_are_checked_against_the_rdmx_range() {
    let mut config = Config::new();
    let cases = [
        (
            "ms_async_rdma_sl",
            "16",
            "ms_async_rdma_sl (rdmx key 'sl'): invalid value '16': allowed 0..15",
        ),
        (
            "ms_async_rdma_buffer_size",
            "100000",
            "ms_async_rdma_buffer_size (rdmx key 'chunk_size'): invalid value '100000': allowed a power of two in 512..2097152",
        ),
        (
            "ms_async_rdma_receive_buffers",
            "0",
            "ms_async_rdma_receive_buffers (rdmx key 'pool_chunks'): invalid value '0': allowed 1..16777216",
        ),
        (
            "ms_async_rdma_dscp",
            "256",
            "ms_async_rdma_dscp (rdmx key 'traffic_class'): invalid value '256': allowed 0..255",
        ),
    ];
    for (alias, value, message) in cases {
        assert_eq!(
            failure(config.set(alias, value)),
            (ErrorKind::InvalidValue, message.to_string())
        );
    }
}

#[test]
fn every_rejected_name_says_why() {
    for &(alias, why) in REJECTED {
        let message = format!("{alias}: not supported by rdmx: {why}");
        let mut config = Config::new();
        for value in ["true", "false", "0", "", "ib"] {
            assert_eq!(
                failure(config.set(alias, value)),
                (ErrorKind::InvalidValue, message.clone()),
                "{alias}"
            );
        }
        assert_eq!(
            failure(config.get(alias)),
            (ErrorKind::InvalidValue, message.clone())
        );
        assert_eq!(
            failure(config.load_str(&format!("[global]\n{alias} = 1\n"), "ceph.conf")),
            (ErrorKind::InvalidValue, format!("ceph.conf:2: {message}"))
        );
        let var = format!("RDMX_{}", alias.to_uppercase());
        assert_eq!(
            failure(Config::from_env_vars([(var.as_str(), "1")])),
            (ErrorKind::InvalidValue, format!("{var}: {message}"))
        );
        assert_eq!(config, Config::new());
    }
}

#[test]
fn other_ceph_names_are_unknown_with_a_suggestion() {
    let mut config = Config::new();
    assert_eq!(
        failure(config.set("ms_async_rdma_polling_usec", "5")),
        (
            ErrorKind::UnknownKey,
            "unknown key 'ms_async_rdma_polling_usec' (did you mean 'ms_async_rdma_polling_us'?)"
                .to_string()
        )
    );
    assert_eq!(
        failure(config.set("ms_async_rdma_support_srk", "5")),
        (
            ErrorKind::UnknownKey,
            "unknown key 'ms_async_rdma_support_srk' (did you mean 'ms_async_rdma_support_srq'?)"
                .to_string()
        )
    );
}

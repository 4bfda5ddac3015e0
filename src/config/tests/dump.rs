//! dump(): every key, in table order, with its source.

use crate::config::{Config, KEYS, Source};

const DEFAULT_DUMP: &str = "\
provider = auto  # default
device = \"\"  # default (first device)
port = 1  # default
gid_index = 0  # default
max_send_wr = 256  # default
max_recv_wr = 256  # default
max_send_sge = 2  # default
max_recv_sge = 1  # default
max_inline_data = 64  # default
send_cq_size = 0  # default (auto: 512 = 2 x 256 WRs)
recv_cq_size = 0  # default (auto: 512 = 2 x 256 WRs)
separate_cqs = true  # default
signal_interval = 16  # default
post_batch = 32  # default
timeout = 14  # default
retry_cnt = 7  # default
rnr_retry = 2  # default
min_rnr_timer = 12  # default
qp_override = \"\"  # default
path_mtu = 1024  # default
max_rd_atomic = 16  # default
max_dest_rd_atomic = 16  # default
sl = 0  # default
traffic_class = 0  # default
chunk_size = 4096  # default
pool_chunks = 1024  # default
hugepages = auto  # default
rcache_entries = 1024  # default
poll_mode = adaptive  # default
polling_us = 1000  # default
poll_batch = 32  # default
credits = 0  # default (auto: 256 = max_recv_wr)
soft_port = 4791  # default
soft_addr = \"\"  # default
soft_drop_ratio = 0  # default
soft_gso = true  # default
soft_pin = true  # default
progress = inline  # default
poll_yield_after = 64  # default
msgr_policy = lossless  # default
msgr_threads = 0  # default
msgr_keepalive_ms = 1000  # default
msgr_keepalive_timeout_ms = 5000  # default
msgr_reconnect_min_ms = 10  # default
msgr_reconnect_max_ms = 1000  # default
msgr_reconnect_timeout_ms = 60000  # default
msgr_reconnect_attempts = 0  # default
msgr_send_queue_msgs = 4096  # default
msgr_send_queue_bytes = 67108864  # default
msgr_recv_window = 64  # default
msgr_recv_window_min = 4  # default
msgr_pool_chunks = 16384  # default
msgr_eager_max = 4096  # default
msgr_eager_write = true  # default
msgr_path_failback = true  # default
msgr_scoped_rkeys = true  # default
msgr_rx_batch = 16  # default
msgr_worker_slice_us = 0  # default
msgr_max_message_bytes = 16777216  # default
msgr_max_segments = 64  # default
auth = auto  # default
auth_keyring = \"\"  # default
auth_entity = client.admin  # default
handshake_first_bytes_ms = 500  # default
handshake_timeout_ms = 10000  # default
handshake_max = 256  # default
handshake_per_source = 32  # default
msgr_max_pending_links = 256  # default
msgr_max_sessions = 4096  # default
msgr_max_sessions_per_entity = 1024  # default
blk_path_policy = standby  # default
blk_failback = true  # default
io_fail_timeout_ms = 30000  # default
blk_path_retry_min_ms = 10  # default
blk_path_retry_max_ms = 1000  # default
profile = none  # default
";

#[test]
fn default_dump_is_exact() {
    assert_eq!(Config::new().dump(), DEFAULT_DUMP);
    assert_eq!(Config::new().dump().lines().count(), KEYS.len());
}

fn line_of(dump: &str, key: &str) -> String {
    dump.lines()
        .find(|l| l.starts_with(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("no line for {key} in\n{dump}"))
        .to_string()
}

#[test]
fn every_source_is_shown() {
    let mut config =
        Config::from_env_vars([("RDMX_SL", "3"), ("RDMX_MS_ASYNC_RDMA_DSCP", "96")]).unwrap();
    config
        .load_str(
            "[rdmx]\nprofile = ceph-before\nport = 2\n",
            "/etc/rdmx.conf",
        )
        .unwrap();
    config.set("max_send_wr", "512").unwrap();
    config
        .set("ms_async_rdma_enable_hugepage", "false")
        .unwrap();
    let dump = config.dump();
    assert_eq!(
        line_of(&dump, "rnr_retry"),
        "rnr_retry = 7  # profile ceph-before"
    );
    assert_eq!(
        line_of(&dump, "timeout"),
        "timeout = 14  # profile ceph-before"
    );
    assert_eq!(line_of(&dump, "port"), "port = 2  # file /etc/rdmx.conf:3");
    assert_eq!(
        line_of(&dump, "profile"),
        "profile = ceph-before  # file /etc/rdmx.conf:2"
    );
    assert_eq!(line_of(&dump, "sl"), "sl = 3  # env RDMX_SL");
    assert_eq!(
        line_of(&dump, "traffic_class"),
        "traffic_class = 96  # env RDMX_MS_ASYNC_RDMA_DSCP (as ms_async_rdma_dscp)"
    );
    assert_eq!(line_of(&dump, "max_send_wr"), "max_send_wr = 512  # set");
    assert_eq!(
        line_of(&dump, "hugepages"),
        "hugepages = off  # set (as ms_async_rdma_enable_hugepage)"
    );
    assert_eq!(
        line_of(&dump, "send_cq_size"),
        "send_cq_size = 0  # default (auto: 1024 = 2 x 512 WRs)"
    );
    assert_eq!(line_of(&dump, "retry_cnt"), "retry_cnt = 7  # default");
}

#[test]
fn shared_and_explicit_cq_sizes() {
    let mut config = Config::new();
    config.set("separate_cqs", "false").unwrap();
    config.set("max_recv_wr", "128").unwrap();
    let dump = config.dump();
    assert_eq!(
        line_of(&dump, "send_cq_size"),
        "send_cq_size = 0  # default (auto, shared CQ: 768 = 2 x (256 + 128) WRs)"
    );
    assert_eq!(
        line_of(&dump, "recv_cq_size"),
        "recv_cq_size = 0  # default (unused: separate_cqs = false)"
    );
    config.set("separate_cqs", "true").unwrap();
    config.set("send_cq_size", "1000").unwrap();
    config.set("credits", "64").unwrap();
    let dump = config.dump();
    assert_eq!(line_of(&dump, "send_cq_size"), "send_cq_size = 1000  # set");
    assert_eq!(
        line_of(&dump, "recv_cq_size"),
        "recv_cq_size = 0  # default (auto: 256 = 2 x 128 WRs)"
    );
    assert_eq!(line_of(&dump, "credits"), "credits = 64  # set");
}

#[test]
fn a_dump_loads_back_to_the_same_values() {
    let mut config = Config::new();
    config.set("profile", "trading").unwrap();
    config.set("device", "mlx5_0").unwrap();
    config.set("path_mtu", "4096").unwrap();
    let mut reloaded = Config::new();
    reloaded.load_str(&config.dump(), "dump").unwrap();
    for spec in KEYS {
        assert_eq!(
            reloaded.get(spec.name).unwrap(),
            config.get(spec.name).unwrap(),
            "{}",
            spec.name
        );
        assert_eq!(reloaded.source(spec.name).unwrap(), Source::File);
    }
    let mut empty_device = Config::new();
    empty_device.load_str(DEFAULT_DUMP, "dump").unwrap();
    assert_eq!(empty_device.get("device").unwrap(), "");
}

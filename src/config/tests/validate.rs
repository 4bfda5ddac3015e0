//! Cross-field rules (validate / settings) and typed settings.

use super::failure;
use crate::config::{Config, CqLayout, Hugepages, Mtu, PollMode, Provider};
use crate::error::ErrorKind;

const CLIFF: &str =
    "completion-queue overflow cliff: a full CQ loses completions and puts the QP in error";

fn config_with(pairs: &[(&str, &str)]) -> Config {
    let mut config = Config::new();
    for (key, value) in pairs {
        config.set(key, value).unwrap();
    }
    config
}

fn conflict(pairs: &[(&str, &str)]) -> String {
    let config = config_with(pairs);
    let (kind, message) = failure(config.validate());
    assert_eq!(kind, ErrorKind::Conflict);
    assert_eq!(failure(config.settings()), (kind, message.clone()));
    message
}

#[test]
fn defaults_are_consistent() {
    Config::new().validate().unwrap();
}

#[test]
fn send_cq_smaller_than_send_queue() {
    assert_eq!(
        conflict(&[("send_cq_size", "100")]),
        format!(
            "send_cq_size = 100 is smaller than max_send_wr = 256: {CLIFF}; set send_cq_size >= 256, or 0 for auto (512)"
        )
    );
    config_with(&[("send_cq_size", "256")]).validate().unwrap();
}

#[test]
fn recv_cq_smaller_than_receive_queue() {
    assert_eq!(
        conflict(&[("max_recv_wr", "1000"), ("recv_cq_size", "999")]),
        format!(
            "recv_cq_size = 999 is smaller than max_recv_wr = 1000: {CLIFF}; set recv_cq_size >= 1000, or 0 for auto (2000)"
        )
    );
    config_with(&[("max_recv_wr", "1000"), ("recv_cq_size", "1000")])
        .validate()
        .unwrap();
}

#[test]
fn shared_cq_must_hold_both_queues() {
    assert_eq!(
        conflict(&[("separate_cqs", "false"), ("send_cq_size", "511")]),
        format!(
            "send_cq_size = 511 is smaller than max_send_wr + max_recv_wr = 256 + 256 = 512 (separate_cqs = false: sends and receives share this CQ): {CLIFF}; set send_cq_size >= 512, or 0 for auto (1024)"
        )
    );
    config_with(&[("separate_cqs", "false"), ("send_cq_size", "512")])
        .validate()
        .unwrap();
}

#[test]
fn shared_cq_needs_recv_cq_size_zero() {
    assert_eq!(
        conflict(&[("separate_cqs", "no"), ("recv_cq_size", "4096")]),
        "recv_cq_size = 4096 but separate_cqs = false: sends and receives share one CQ sized by send_cq_size, so recv_cq_size must be 0"
    );
}

#[test]
fn signal_interval_within_the_send_queue() {
    assert_eq!(
        conflict(&[
            ("max_send_wr", "64"),
            ("signal_interval", "65"),
            ("post_batch", "8")
        ]),
        "signal_interval = 65 is larger than max_send_wr = 64: the send queue fills before a signaled completion frees it; set signal_interval <= 64"
    );
    config_with(&[("max_send_wr", "64"), ("signal_interval", "64")])
        .validate()
        .unwrap();
}

#[test]
fn post_batch_within_the_send_queue() {
    assert_eq!(
        conflict(&[("max_send_wr", "16"), ("post_batch", "17")]),
        "post_batch = 17 is larger than max_send_wr = 16: one post call cannot chain more WRs than the send queue holds; set post_batch <= 16"
    );
    config_with(&[("max_send_wr", "16"), ("post_batch", "16")])
        .validate()
        .unwrap();
}

#[test]
fn credits_within_posted_receives() {
    assert_eq!(
        conflict(&[("credits", "257")]),
        "credits = 257 is larger than max_recv_wr = 256: more credits than posted receives sends peers into RNR; set credits <= 256, or 0 for auto (= max_recv_wr)"
    );
    config_with(&[("credits", "256")]).validate().unwrap();
}

#[test]
fn inline_data_within_a_chunk() {
    assert_eq!(
        conflict(&[("chunk_size", "512"), ("max_inline_data", "1024")]),
        "max_inline_data = 1024 is larger than chunk_size = 512: inline data is copied from one chunk; set max_inline_data <= 512"
    );
    config_with(&[("chunk_size", "512"), ("max_inline_data", "512")])
        .validate()
        .unwrap();
}

#[test]
fn all_broken_rules_are_reported_together() {
    let message = conflict(&[("max_send_wr", "8"), ("credits", "300")]);
    assert_eq!(
        message,
        "signal_interval = 16 is larger than max_send_wr = 8: the send queue fills before a signaled completion frees it; set signal_interval <= 8; \
post_batch = 32 is larger than max_send_wr = 8: one post call cannot chain more WRs than the send queue holds; set post_batch <= 8; \
credits = 300 is larger than max_recv_wr = 256: more credits than posted receives sends peers into RNR; set credits <= 256, or 0 for auto (= max_recv_wr)"
    );
}

#[test]
fn rules_wait_for_validate_and_do_not_depend_on_order() {
    // Growing both in either order: every set succeeds, the end state is valid.
    let mut a = Config::new();
    a.set("signal_interval", "1000").unwrap();
    a.set("max_send_wr", "1000").unwrap();
    a.validate().unwrap();
    let mut b = Config::new();
    b.set("max_send_wr", "1000").unwrap();
    b.set("signal_interval", "1000").unwrap();
    b.validate().unwrap();
    // A conflict across sources is found the same way.
    let mut c = Config::from_env_vars([("RDMX_SEND_CQ_SIZE", "100")]).unwrap();
    c.load_str("max_send_wr = 50\n", "t.conf").unwrap();
    c.validate().unwrap();
    c.set("max_send_wr", "101").unwrap();
    assert_eq!(failure(c.validate()).0, ErrorKind::Conflict);
}

#[test]
fn typed_settings_of_the_defaults() {
    let s = Config::new().settings().unwrap();
    assert_eq!(s.provider, Provider::Auto);
    assert_eq!(s.device, "");
    assert_eq!((s.port, s.gid_index), (1, 0));
    assert_eq!((s.max_send_wr, s.max_recv_wr), (256, 256));
    assert_eq!(
        (s.max_send_sge, s.max_recv_sge, s.max_inline_data),
        (2, 1, 64)
    );
    assert_eq!((s.send_cq_size, s.recv_cq_size), (0, 0));
    assert!(s.separate_cqs);
    assert_eq!((s.signal_interval, s.post_batch), (16, 32));
    assert_eq!(
        (s.timeout, s.retry_cnt, s.rnr_retry, s.min_rnr_timer),
        (14, 7, 2, 12)
    );
    assert_eq!(s.path_mtu, Mtu::Mtu1024);
    assert_eq!((s.max_rd_atomic, s.max_dest_rd_atomic), (16, 16));
    assert_eq!((s.sl, s.traffic_class), (0, 0));
    assert_eq!((s.chunk_size, s.pool_chunks), (4096, 1024));
    assert_eq!(s.hugepages, Hugepages::Auto);
    assert_eq!(s.rcache_entries, 1024);
    assert_eq!(s.poll_mode, PollMode::Adaptive);
    assert_eq!((s.polling_us, s.poll_batch, s.credits), (1000, 32, 0));
    assert_eq!(s.soft_port, 4791);
    assert_eq!(s.profile, None);
    assert_eq!(
        s.cq_layout(),
        CqLayout::Separate {
            send: 512,
            recv: 512
        }
    );
    assert_eq!(s.effective_credits(), 256);
    assert_eq!(s.ack_timeout_ns(), Some(67_108_864));
    assert_eq!(s.min_rnr_timer_ns(), 640_000);
    assert!(!s.rnr_retry_infinite());
}

#[test]
fn typed_settings_follow_the_values() {
    let config = config_with(&[
        ("provider", "soft"),
        ("device", "rxe0"),
        ("path_mtu", "4096"),
        ("hugepages", "off"),
        ("poll_mode", "event"),
        ("timeout", "0"),
        ("credits", "100"),
        ("soft_port", "65535"),
    ]);
    let s = config.settings().unwrap();
    assert_eq!(s.provider, Provider::Soft);
    assert_eq!(s.device, "rxe0");
    assert_eq!(s.path_mtu, Mtu::Mtu4096);
    assert_eq!(s.hugepages, Hugepages::Off);
    assert_eq!(s.poll_mode, PollMode::Event);
    assert_eq!(s.ack_timeout_ns(), None, "timeout 0 = no ACK timer");
    assert_eq!(s.effective_credits(), 100);
    assert_eq!(s.soft_port, 65535);
}

#[test]
fn cq_layout_resolves_auto_sizes() {
    let config = config_with(&[("max_send_wr", "100"), ("max_recv_wr", "300")]);
    assert_eq!(
        config.cq_layout().unwrap(),
        CqLayout::Separate {
            send: 200,
            recv: 600
        }
    );
    let config = config_with(&[("max_send_wr", "100"), ("recv_cq_size", "300")]);
    assert_eq!(
        config.cq_layout().unwrap(),
        CqLayout::Separate {
            send: 200,
            recv: 300
        }
    );
    let config = config_with(&[
        ("separate_cqs", "false"),
        ("max_send_wr", "100"),
        ("max_recv_wr", "300"),
    ]);
    assert_eq!(config.cq_layout().unwrap(), CqLayout::Shared { size: 800 });
    let config = config_with(&[("separate_cqs", "false"), ("send_cq_size", "4096")]);
    assert_eq!(config.cq_layout().unwrap(), CqLayout::Shared { size: 4096 });
    assert_eq!(
        CqLayout::resolve(false, 0, 0, 32768, 32768),
        CqLayout::Shared { size: 131072 }
    );
}

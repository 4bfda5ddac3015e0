//! What the messenger fault tests (msgr_faults.rs in one process, msgr_process_faults.rs
//! across two) share: numbered messages with a checksummed 4 KiB page, their check, a small
//! PRNG, and the config with a short retry budget.

use rdmx::config::Config;
use rdmx::msgr::messenger::{OutMessage, Payload};

pub fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

pub fn page(seq: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|i| (seq.wrapping_mul(31) ^ i) as u8)
        .collect()
}

pub fn message(seq: u64) -> OutMessage {
    let data = page(seq);
    let mut front = seq.to_le_bytes().to_vec();
    front.extend_from_slice(&fnv(&data).to_le_bytes());
    OutMessage::new(7, front).with(Payload::Copy(data))
}

pub fn rand(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Both processes' config: a short retry budget (timeout 16.8 ms x 4 tries, so a 150 ms
/// black hole exceeds it), keepalive 50 ms / 2 s, fast reconnects, one worker thread.
pub fn config(kv: &[(&str, &str)]) -> Config {
    let mut c = Config::new();
    c.set("soft_port", "0").unwrap();
    for (k, v) in [
        ("timeout", "12"),
        ("retry_cnt", "3"),
        ("msgr_keepalive_ms", "50"),
        ("msgr_keepalive_timeout_ms", "2000"),
        ("msgr_reconnect_min_ms", "5"),
        ("msgr_reconnect_max_ms", "100"),
        ("msgr_threads", "1"),
    ]
    .iter()
    .chain(kv)
    {
        c.set(k, v)
            .unwrap_or_else(|e| panic!("config {k}={v}: {e}"));
    }
    c
}

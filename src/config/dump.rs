//! `Config::dump()`: every effective key as `key = value  # source`, in table order. The
//! output loads back with `load_str` (empty values are written `""`).

use super::settings::AUTO_CQ_FACTOR;
use super::value::Value;
use super::{Config, Effective, KEYS, Source, keys};
use std::fmt::Write as _;

pub(super) fn dump(config: &Config) -> String {
    let uint = |name: &str| match keys::index_of(name).map(|i| config.effective(i).value) {
        Some(Value::Uint(n)) => n,
        _ => 0,
    };
    let separate = keys::index_of("separate_cqs")
        .map(|i| config.effective(i).value)
        .is_none_or(|v| v != Value::Bool(false));
    let (send_wr, recv_wr) = (uint("max_send_wr"), uint("max_recv_wr"));
    let factor = u64::from(AUTO_CQ_FACTOR);

    let mut out = String::new();
    for (index, spec) in KEYS.iter().enumerate() {
        let effective = config.effective(index);
        let value = match &effective.value {
            Value::Text(t) if t.is_empty() => "\"\"".to_string(),
            v => v.to_string(),
        };
        let is_zero = effective.value == Value::Uint(0);
        let note = match spec.name {
            "send_cq_size" if is_zero && separate => {
                format!("auto: {} = {factor} x {send_wr} WRs", factor * send_wr)
            }
            "send_cq_size" if is_zero => format!(
                "auto, shared CQ: {} = {factor} x ({send_wr} + {recv_wr}) WRs",
                factor * (send_wr + recv_wr)
            ),
            "recv_cq_size" if is_zero && separate => {
                format!("auto: {} = {factor} x {recv_wr} WRs", factor * recv_wr)
            }
            "recv_cq_size" if !separate => "unused: separate_cqs = false".to_string(),
            "credits" if is_zero => format!("auto: {recv_wr} = max_recv_wr"),
            "device" if value == "\"\"" => "first device".to_string(),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{} = {value}  # {}",
            spec.name,
            describe(&effective, &note)
        );
    }
    out
}

/// "file /etc/x.conf:3 (as ms_async_rdma_sl) (auto: ...)".
fn describe(effective: &Effective, note: &str) -> String {
    let mut text = effective.source.as_str().to_string();
    let show_origin = matches!(
        effective.source,
        Source::Profile | Source::File | Source::Env
    );
    if show_origin && !effective.origin.is_empty() {
        text.push(' ');
        text.push_str(&effective.origin);
    }
    if let Some(alias) = effective.via {
        let _ = write!(text, " (as {alias})");
    }
    if !note.is_empty() {
        let _ = write!(text, " ({note})");
    }
    text
}

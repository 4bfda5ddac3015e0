//! Cross-field rules: values fine alone but not together. They run in `validate()` and
//! `settings()`, never in `set`, because users set keys one at a time.

use super::settings::{AUTO_CQ_FACTOR, Settings};
use crate::error::{Error, ErrorKind, Result};

const CQ_CLIFF: &str = "completion-queue overflow cliff: a full CQ loses completions and \
                        puts the QP in error";

/// Every broken rule, joined with "; " (one Conflict error), so users fix all in one go.
pub(crate) fn check(s: &Settings) -> Result<()> {
    let mut problems = Vec::new();
    check_cqs(s, &mut problems);
    if s.signal_interval > s.max_send_wr {
        problems.push(format!(
            "signal_interval = {} is larger than max_send_wr = {}: the send queue fills before \
             a signaled completion frees it; set signal_interval <= {}",
            s.signal_interval, s.max_send_wr, s.max_send_wr
        ));
    }
    if s.post_batch > s.max_send_wr {
        problems.push(format!(
            "post_batch = {} is larger than max_send_wr = {}: one post call cannot chain more \
             WRs than the send queue holds; set post_batch <= {}",
            s.post_batch, s.max_send_wr, s.max_send_wr
        ));
    }
    if s.credits > s.max_recv_wr {
        problems.push(format!(
            "credits = {} is larger than max_recv_wr = {}: more credits than posted receives \
             sends peers into RNR; set credits <= {}, or 0 for auto (= max_recv_wr)",
            s.credits, s.max_recv_wr, s.max_recv_wr
        ));
    }
    if s.max_inline_data > s.chunk_size {
        problems.push(format!(
            "max_inline_data = {} is larger than chunk_size = {}: inline data is copied from \
             one chunk; set max_inline_data <= {}",
            s.max_inline_data, s.chunk_size, s.chunk_size
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::Conflict, problems.join("; ")))
    }
}

/// A CQ must hold a completion for every WR that can complete on it.
fn check_cqs(s: &Settings, problems: &mut Vec<String>) {
    let auto = |wrs: u32| wrs.saturating_mul(AUTO_CQ_FACTOR);
    if s.separate_cqs {
        for (cq, size, wr_key, wrs) in [
            ("send_cq_size", s.send_cq_size, "max_send_wr", s.max_send_wr),
            ("recv_cq_size", s.recv_cq_size, "max_recv_wr", s.max_recv_wr),
        ] {
            if size != 0 && size < wrs {
                problems.push(format!(
                    "{cq} = {size} is smaller than {wr_key} = {wrs}: {CQ_CLIFF}; set {cq} >= \
                     {wrs}, or 0 for auto ({})",
                    auto(wrs)
                ));
            }
        }
        return;
    }
    let wrs = s.max_send_wr.saturating_add(s.max_recv_wr);
    if s.send_cq_size != 0 && s.send_cq_size < wrs {
        problems.push(format!(
            "send_cq_size = {} is smaller than max_send_wr + max_recv_wr = {} + {} = {wrs} \
             (separate_cqs = false: sends and receives share this CQ): {CQ_CLIFF}; set \
             send_cq_size >= {wrs}, or 0 for auto ({})",
            s.send_cq_size,
            s.max_send_wr,
            s.max_recv_wr,
            auto(wrs)
        ));
    }
    if s.recv_cq_size != 0 {
        problems.push(format!(
            "recv_cq_size = {} but separate_cqs = false: sends and receives share one CQ sized \
             by send_cq_size, so recv_cq_size must be 0",
            s.recv_cq_size
        ));
    }
}

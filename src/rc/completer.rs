//! Completer: ACK/NAK and READ-response processing, the local ACK timer, go-back-N,
//! retry_cnt and rnr_retry (docs/rc-transport.md §3.4, §4.2-§4.8).
//!
//! Deviation from rxe, on purpose: retry_cnt = 7 means seven retries (hardware and the
//! spec), not infinite; only rnr_retry = 7 is infinite.

use super::memory::{self, Memory};
use super::packet::{AethRepr, Hdr, NakCode, Opcode, Syndrome};
use super::psn;
use super::qp::{Qp, whole_packets};
use super::verbs::WcStatus;
use super::wr::Completion;

/// rnr_retry = 7 never runs out (§4.3).
const RNR_INFINITE: u8 = 7;

impl Qp {
    pub(super) fn on_response(
        &mut self,
        now: u64,
        hdr: &Hdr,
        payload: &[u8],
        mem: &mut dyn Memory,
    ) {
        // Nothing may complete that did not happen: a response for a PSN never sent is junk.
        if psn::diff(hdr.psn, self.req.sent_psn_high) >= 0 {
            self.counters.malformed += 1;
            return;
        }
        match hdr.opcode {
            Opcode::Acknowledge => {
                let Some(AethRepr { syndrome, .. }) = hdr.aeth else {
                    self.counters.malformed += 1;
                    return;
                };
                match syndrome {
                    Syndrome::Ack { .. } => self.ack_until(now, psn::add(hdr.psn, 1)),
                    Syndrome::RnrNak { timer } => self.on_rnr_nak(now, hdr.psn, timer),
                    Syndrome::Nak(code) => self.on_nak(now, hdr.psn, code),
                }
            }
            Opcode::RdmaReadResponseFirst
            | Opcode::RdmaReadResponseMiddle
            | Opcode::RdmaReadResponseLast
            | Opcode::RdmaReadResponseOnly => self.on_read_response(now, hdr, payload, mem),
            _ => self.counters.malformed += 1,
        }
    }

    /// Acknowledges every PSN before `upto` (exclusive): completes SEND/WRITE WRs, notices
    /// READ responses that must have been lost, resets retry counters on progress.
    fn ack_until(&mut self, now: u64, upto: u32) {
        let mut progress = false;
        let mut read_lost = false;
        while let Some(w) = self.req.sq.front() {
            if !w.started {
                break;
            }
            if w.is_read() {
                // An ACK beyond the READ's next expected response: those responses were lost.
                let expected = psn::add(
                    w.first_psn,
                    whole_packets(w.read_received, self.attr.path_mtu),
                );
                read_lost = psn::diff(upto, expected) > 0;
                break;
            }
            let last = w.last_psn();
            if psn::diff(upto, last) > 0 {
                self.req.comp_psn = psn::add(last, 1);
                self.complete_head(WcStatus::Success);
                progress = true;
            } else {
                if psn::diff(upto, self.req.comp_psn) > 0 {
                    self.req.comp_psn = upto;
                    progress = true;
                }
                break;
            }
        }
        if progress {
            self.on_progress(now);
        }
        if read_lost && !self.retry_under_way() {
            self.retry(now);
        }
    }

    fn on_progress(&mut self, now: u64) {
        self.req.waiting_since = self.req.outstanding().then_some(now);
        self.req.timeouts_since_progress = 0;
        self.req.retries_since_progress = 0;
        self.req.retry_left = self.attr.retry_cnt;
        self.req.rnr_left = self.attr.rnr_retry;
        self.req.retry_psn = None;
        // Everything before comp_psn is done: never resend it.
        if psn::diff(self.req.next_psn, self.req.comp_psn) < 0 {
            self.req.rewind(self.attr.path_mtu);
        }
        self.req.ack_deadline = if self.req.outstanding() {
            self.ack_timeout_ns().map(|t| now + t)
        } else {
            None
        };
    }

    fn on_rnr_nak(&mut self, now: u64, nak_psn: u32, code: u8) {
        self.counters.rnr_naks_received += 1;
        if psn::diff(nak_psn, self.req.comp_psn) < 0 {
            return; // stale: about a PSN already acknowledged
        }
        self.ack_until(now, nak_psn);
        if self.req.sq.is_empty() {
            return;
        }
        if self.req.rnr_left == 0 {
            self.record_failure(now, WcStatus::RnrRetryExcErr, code);
            self.fail_head(WcStatus::RnrRetryExcErr);
            return;
        }
        if self.attr.rnr_retry != RNR_INFINITE {
            self.req.rnr_left -= 1;
        }
        self.req.retries_since_progress += 1;
        // Wait what the responder asked for; the ACK timer does not cut the wait short.
        let wait = crate::config::encoding::rnr_timer_ns(code).unwrap_or(0);
        self.req.rnr_until = Some(now + wait);
        self.req.ack_deadline = None;
    }

    fn on_nak(&mut self, now: u64, nak_psn: u32, code: NakCode) {
        if code == NakCode::PsnSequenceError {
            self.counters.seq_naks_received += 1;
        }
        if psn::diff(nak_psn, self.req.comp_psn) < 0 {
            return; // stale: about a PSN already acknowledged
        }
        self.ack_until(now, nak_psn);
        if self.req.sq.is_empty() {
            return;
        }
        let status = match code {
            NakCode::PsnSequenceError => {
                // Part of a retry already under way, or fallout of an RNR wait: not new.
                if !self.retry_under_way() && self.req.rnr_until.is_none() {
                    self.retry(now);
                }
                return;
            }
            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
            _ => WcStatus::RemOpErr,
        };
        self.fail_head(status);
    }

    fn on_read_response(&mut self, now: u64, hdr: &Hdr, payload: &[u8], mem: &mut dyn Memory) {
        // Responses imply ACKs for every earlier request.
        self.ack_until(now, hdr.psn);
        let mtu = u64::from(self.attr.path_mtu);
        let Some(w) = self.req.sq.front() else { return };
        if !w.is_read() || !w.started {
            return;
        }
        let expected = psn::add(
            w.first_psn,
            whole_packets(w.read_received, self.attr.path_mtu),
        );
        if hdr.psn != expected {
            return; // duplicate or ahead of a gap: ignored, the timer or a retry recovers
        }
        let is_first_psn = hdr.psn == w.first_psn;
        let is_last_psn = hdr.psn == w.last_psn();
        let opcode_ok = match hdr.opcode {
            Opcode::RdmaReadResponseOnly => is_first_psn && is_last_psn,
            Opcode::RdmaReadResponseFirst => is_first_psn && !is_last_psn,
            Opcode::RdmaReadResponseMiddle => !is_first_psn && !is_last_psn,
            _ => !is_first_psn && is_last_psn, // LAST
        };
        let want = (w.len - w.read_received).min(mtu) as usize;
        if !opcode_ok || payload.len() != want {
            self.counters.malformed += 1;
            return;
        }
        let off = w.read_received;
        if memory::scatter(mem, &w.wr.sges, off, payload).is_err() {
            self.fail_head(WcStatus::LocProtErr);
            return;
        }
        let w = self.req.sq.front_mut().expect("checked above");
        w.read_received += payload.len() as u64;
        self.req.comp_psn = psn::add(hdr.psn, 1);
        if is_last_psn {
            self.req.rd_outstanding = self.req.rd_outstanding.saturating_sub(1);
            self.complete_head(WcStatus::Success);
        }
        self.on_progress(now);
    }

    /// Pops the oldest send WQE and completes it (errors always; success if signaled).
    fn complete_head(&mut self, status: WcStatus) {
        let Some(w) = self.req.sq.pop_front() else {
            return;
        };
        if self.req.send_idx > 0 {
            self.req.send_idx -= 1;
        } else {
            self.req.send_off = 0;
        }
        let signaled = self.caps.sq_sig_all || w.wr.flags & super::verbs::send_flags::SIGNALED != 0;
        if status != WcStatus::Success || signaled {
            self.completions.push_back(Completion {
                wr_id: w.wr.wr_id,
                status,
                opcode: w.wr.opcode.wc_opcode(),
                byte_len: w.len as u32,
                imm: None,
                qp_num: self.qpn,
                is_recv: false,
                solicited: false,
            });
        }
    }

    /// Completes the oldest WR with `status`, then ERR and flush (§4.8).
    fn fail_head(&mut self, status: WcStatus) {
        if let Some(w) = self.req.sq.front_mut() {
            w.error = Some(status);
        }
        self.enter_error();
    }

    /// A go-back-N from comp_psn already happened and nothing progressed since: NAKs and
    /// ACKs from the old flight are fallout of it, not new losses (rxe's `started_retry`).
    /// Only the ACK timer starts another retry then.
    fn retry_under_way(&self) -> bool {
        self.req.retry_psn == Some(self.req.comp_psn)
    }

    /// Keeps the figures of a retry-exhausted failure for `Qp::failure`.
    fn record_failure(&mut self, now: u64, status: WcStatus, peer_rnr_timer: u8) {
        let since = self.req.waiting_since.unwrap_or(now);
        self.failure = Some(super::Failure {
            status,
            at_ns: now,
            silent_ns: now.saturating_sub(since),
            ack_timeouts: self.req.timeouts_since_progress,
            retries: self.req.retries_since_progress,
            timeout: self.attr.timeout,
            retry_cnt: self.attr.retry_cnt,
            rnr_retry: self.attr.rnr_retry,
            peer_rnr_timer,
        });
    }

    /// Go-back-N, consuming one retry; RETRY_EXC_ERR when none are left.
    fn retry(&mut self, now: u64) {
        if self.req.retry_left == 0 {
            self.record_failure(now, WcStatus::RetryExcErr, 0);
            self.fail_head(WcStatus::RetryExcErr);
            return;
        }
        self.req.retry_left -= 1;
        self.req.retries_since_progress += 1;
        self.req.retry_psn = Some(self.req.comp_psn);
        self.req.ack_deadline = None;
        self.req.rewind(self.attr.path_mtu);
    }

    pub(super) fn on_timers(&mut self, now: u64) {
        if let Some(t) = self.req.rnr_until
            && now >= t
        {
            self.req.rnr_until = None;
            self.req.rewind(self.attr.path_mtu);
        }
        if let Some(t) = self.req.ack_deadline
            && now >= t
        {
            self.req.ack_deadline = None;
            if self.req.rnr_until.is_none() && self.req.outstanding() {
                self.counters.ack_timeouts += 1;
                self.req.timeouts_since_progress += 1;
                self.retry(now);
            }
        }
    }
}

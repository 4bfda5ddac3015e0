//! Requester: the send queue, segmentation by path MTU, PSN assignment (a READ consumes one
//! PSN per response packet), AckReq, max_rd_atomic credits, IBV_SEND_FENCE and the window
//! of unacknowledged PSNs (docs/rc-transport.md §2.2, §3.2, §5.5).

use std::collections::VecDeque;

use super::emit::{PayloadSrc, TxParts};
use super::memory::{self, Memory, sge_total};
use super::packet::{Hdr, Reth, op};
use super::psn;
use super::qp::{Qp, packets_for};
use super::verbs::{QpState, WcStatus, WrOpcode, access, send_flags};
use super::wr::SendWr;
use crate::error::{Error, ErrorKind, Result};

/// rxe sets AckReq at least this often inside long messages (§3.4).
const MAX_PKTS_PER_ACKREQ: u32 = 64;
/// Largest message (RETH DMA length is 32 bits; the responder rejects > 2^31).
const MAX_MSG_LEN: u64 = 1 << 31;

/// A posted send WR and its progress.
#[derive(Debug)]
pub(super) struct SendWqe {
    pub wr: SendWr,
    pub len: u64,
    /// Packets (request packets for SEND/WRITE, response packets for READ) = PSNs used.
    pub npkts: u32,
    /// Set when first transmitted; retransmissions reuse it.
    pub first_psn: u32,
    pub started: bool,
    /// READ: bytes placed so far (in order).
    pub read_received: u64,
    pub has_rd_credit: bool,
    /// The error this WR completes with when the QP is flushed (None: WR_FLUSH_ERR).
    pub error: Option<WcStatus>,
}

impl SendWqe {
    pub fn last_psn(&self) -> u32 {
        psn::add(self.first_psn, self.npkts - 1)
    }
    pub fn is_read(&self) -> bool {
        self.wr.opcode == WrOpcode::RdmaRead
    }
}

#[derive(Debug, Default)]
pub(super) struct Requester {
    pub sq: VecDeque<SendWqe>,
    /// Next WQE to transmit and bytes of it already segmented.
    pub send_idx: usize,
    pub send_off: u64,
    /// PSN of the next request packet (rewound by go-back-N).
    pub next_psn: u32,
    /// One past the highest PSN ever transmitted.
    pub sent_psn_high: u32,
    /// Oldest PSN not yet acknowledged.
    pub comp_psn: u32,
    pub rd_outstanding: u32,
    pub retry_left: u8,
    pub rnr_left: u8,
    pub ack_deadline: Option<u64>,
    pub rnr_until: Option<u64>,
    /// comp_psn at the last go-back-N, until progress: a NAK for the same PSN is part of
    /// that retry, not a new one (rxe's `started_retry`).
    pub retry_psn: Option<u32>,
    pub pkts_since_ackreq: u32,
    /// Since when the requester has waited without progress (the last ACK or response,
    /// or the first transmission after idle), with the timeouts and retries spent since:
    /// the figures a retry-exhausted error reports.
    pub waiting_since: Option<u64>,
    pub timeouts_since_progress: u32,
    pub retries_since_progress: u32,
}

impl Requester {
    pub fn reset_psn(&mut self, sq_psn: u32) {
        self.next_psn = sq_psn & psn::PSN_MASK;
        self.sent_psn_high = self.next_psn;
        self.comp_psn = self.next_psn;
    }

    pub fn push(&mut self, wr: SendWr, mtu: u32) -> Result<()> {
        let len = sge_total(&wr.sges);
        if len > MAX_MSG_LEN {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("post_send: message of {len} bytes exceeds 2^31"),
            ));
        }
        let npkts = packets_for(len, mtu);
        self.sq.push_back(SendWqe {
            wr,
            len,
            npkts,
            first_psn: 0,
            started: false,
            read_received: 0,
            has_rd_credit: false,
            error: None,
        });
        Ok(())
    }

    /// Whether `next_request` could produce a packet now (ignoring credits and window).
    pub fn has_sendable(&self) -> bool {
        self.rnr_until.is_none() && self.send_idx < self.sq.len()
    }

    /// Packets are outstanding (sent and not acknowledged).
    pub fn outstanding(&self) -> bool {
        psn::diff(self.sent_psn_high, self.comp_psn) > 0
    }

    /// Go-back-N (§4.6): resume from the oldest unacknowledged PSN, mid-message for a
    /// SEND/WRITE, and with a READ re-issued for its remaining bytes.
    pub fn rewind(&mut self, mtu: u32) {
        self.send_idx = 0;
        self.next_psn = self.comp_psn;
        self.send_off = 0;
        self.pkts_since_ackreq = 0;
        if let Some(w) = self.sq.front()
            && w.started
            && !w.is_read()
        {
            let acked = psn::diff(self.comp_psn, w.first_psn).max(0) as u64;
            self.send_off = (acked * u64::from(mtu)).min(w.len);
        }
    }
}

fn send_opcode(wr: WrOpcode, first: bool, last: bool) -> u8 {
    let imm = matches!(wr, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
    let write = matches!(wr, WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm);
    match (write, first, last, imm) {
        (false, true, true, false) => op::SEND_ONLY,
        (false, true, true, true) => op::SEND_ONLY_IMM,
        (false, true, false, _) => op::SEND_FIRST,
        (false, false, false, _) => op::SEND_MIDDLE,
        (false, false, true, false) => op::SEND_LAST,
        (false, false, true, true) => op::SEND_LAST_IMM,
        (true, true, true, false) => op::WRITE_ONLY,
        (true, true, true, true) => op::WRITE_ONLY_IMM,
        (true, true, false, _) => op::WRITE_FIRST,
        (true, false, false, _) => op::WRITE_MIDDLE,
        (true, false, true, false) => op::WRITE_LAST,
        (true, false, true, true) => op::WRITE_LAST_IMM,
    }
}

impl Qp {
    /// Builds the next request packet, if the send queue, credits and window allow.
    pub(super) fn next_request<'m>(
        &mut self,
        now: u64,
        mem: &'m dyn Memory,
        buf: &mut [u8],
        vectored: bool,
    ) -> Option<TxParts<'m>> {
        if self.state != QpState::Rts || !self.req.has_sendable() {
            return None;
        }
        let window = self.caps.max_unacked_psns.max(1) as i32;
        if psn::diff(self.req.next_psn, self.req.comp_psn) >= window {
            return None;
        }
        let mtu = self.attr.path_mtu;
        let idx = self.req.send_idx;
        // Fence: wait until every earlier READ has completed.
        let fenced = self.req.sq[idx].wr.flags & send_flags::FENCE != 0
            && self.req.sq.iter().take(idx).any(|w| w.is_read());
        if fenced {
            return None;
        }
        if self.req.sq[idx].is_read() && !self.req.sq[idx].has_rd_credit {
            if self.req.rd_outstanding >= u32::from(self.attr.max_rd_atomic) {
                return None;
            }
            self.req.rd_outstanding += 1;
            self.req.sq[idx].has_rd_credit = true;
        }
        if !self.req.sq[idx].started {
            let w = &self.req.sq[idx];
            let need = if w.is_read() { access::LOCAL_WRITE } else { 0 };
            if memory::check_sges(mem, &w.wr.sges, need).is_err() {
                // A bad local key fails the WR itself (LOC_PROT_ERR) and the QP (§4.8);
                // earlier WRs are flushed first so completions stay in WR order.
                self.req.sq[idx].error = Some(WcStatus::LocProtErr);
                self.enter_error();
                return None;
            }
            let next_psn = self.req.next_psn;
            let w = &mut self.req.sq[idx];
            w.first_psn = next_psn;
            w.started = true;
        }
        let dest_qp = self.attr.dest_qp_num;
        let psn_now = self.req.next_psn;
        let retransmit = psn::diff(psn_now, self.req.sent_psn_high) < 0;
        let w = &self.req.sq[idx];
        let (n, consumed, done) = if w.is_read() {
            let remaining = w.len - w.read_received;
            let mut h = Hdr::new(op::READ_REQUEST, dest_qp, psn_now);
            h.ack_req = true;
            h.reth = Some(Reth {
                va: w.wr.remote_addr + w.read_received,
                rkey: w.wr.rkey,
                len: remaining as u32,
            });
            let pkts = packets_for(remaining, mtu);
            let t = self
                .emit_from(&h, 0, PayloadSrc::None, mem, buf, vectored)
                .ok()?;
            (t, pkts, true)
        } else {
            let off = self.req.send_off;
            let take = (w.len - off).min(u64::from(mtu));
            let first = off == 0;
            let last = off + take == w.len;
            let mut h = Hdr::new(send_opcode(w.wr.opcode, first, last), dest_qp, psn_now);
            h.ack_req = last || self.req.pkts_since_ackreq + 1 >= MAX_PKTS_PER_ACKREQ;
            h.solicited = last && w.wr.flags & send_flags::SOLICITED != 0;
            if first
                && matches!(
                    w.wr.opcode,
                    WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm
                )
            {
                h.reth = Some(Reth {
                    va: w.wr.remote_addr,
                    rkey: w.wr.rkey,
                    len: w.len as u32,
                });
            }
            if last
                && matches!(
                    w.wr.opcode,
                    WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm
                )
            {
                h.imm = Some(w.wr.imm);
            }
            let src = PayloadSrc::Local {
                sges: &w.wr.sges,
                off,
            };
            let ack_req = h.ack_req;
            let n = self
                .emit_from(&h, take as usize, src, mem, buf, vectored)
                .ok()?;
            self.req.pkts_since_ackreq = if ack_req {
                0
            } else {
                self.req.pkts_since_ackreq + 1
            };
            (n, 1, last)
        };
        if done {
            self.req.send_idx += 1;
            self.req.send_off = 0;
        } else {
            self.req.send_off += u64::from(mtu);
        }
        self.req.next_psn = psn::add(psn_now, consumed);
        if psn::diff(self.req.next_psn, self.req.sent_psn_high) > 0 {
            self.req.sent_psn_high = self.req.next_psn;
        }
        if retransmit {
            self.counters.retransmits += 1;
        }
        if self.req.ack_deadline.is_none() {
            self.req.ack_deadline = self.ack_timeout_ns().map(|t| now + t);
        }
        if self.req.waiting_since.is_none() {
            self.req.waiting_since = Some(now);
        }
        Some(n)
    }

    /// The local ACK timeout in ns; None for timeout = 0 (no timer).
    pub(super) fn ack_timeout_ns(&self) -> Option<u64> {
        match crate::config::encoding::ack_timeout_ns(self.attr.timeout) {
            Some(0) | None => None,
            Some(t) => Some(t),
        }
    }
}

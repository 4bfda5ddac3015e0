//! Requester: the send queue, segmentation by path MTU, PSN assignment (a READ consumes one
//! PSN per response packet), AckReq, max_rd_atomic credits, IBV_SEND_FENCE and the window
//! of unacknowledged PSNs (docs/rc-transport.md §2.2, §3.2, §5.5).

use std::collections::VecDeque;

use super::emit::{EmitError, PayloadSrc, TxMode, TxParts};
use super::memory::{self, Memory, sge_total};
use super::packet::{Hdr, Opcode, RethRepr};
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

fn send_opcode(wr: WrOpcode, first: bool, last: bool) -> Opcode {
    let imm = matches!(wr, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
    let write = matches!(wr, WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm);
    if wr == WrOpcode::SendWithInv && last {
        // The IETH rides on the last packet only (FIRST/MIDDLE are plain SEND packets).
        return if first {
            Opcode::SendOnlyWithInvalidate
        } else {
            Opcode::SendLastWithInvalidate
        };
    }
    match (write, first, last, imm) {
        (false, true, true, false) => Opcode::SendOnly,
        (false, true, true, true) => Opcode::SendOnlyWithImmediate,
        (false, true, false, _) => Opcode::SendFirst,
        (false, false, false, _) => Opcode::SendMiddle,
        (false, false, true, false) => Opcode::SendLast,
        (false, false, true, true) => Opcode::SendLastWithImmediate,
        (true, true, true, false) => Opcode::RdmaWriteOnly,
        (true, true, true, true) => Opcode::RdmaWriteOnlyWithImmediate,
        (true, true, false, _) => Opcode::RdmaWriteFirst,
        (true, false, false, _) => Opcode::RdmaWriteMiddle,
        (true, false, true, false) => Opcode::RdmaWriteLast,
        (true, false, true, true) => Opcode::RdmaWriteLastWithImmediate,
    }
}

impl Qp {
    /// Builds the next request packet, if the send queue, credits and window allow.
    pub(super) fn next_request<'m>(
        &mut self,
        now: u64,
        mem: &'m dyn Memory,
        buf: &mut [u8],
        mode: TxMode,
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
            let mut h = Hdr::new(Opcode::RdmaReadRequest, dest_qp, psn_now);
            h.ack_req = true;
            h.reth = Some(RethRepr {
                va: w.wr.remote_addr + w.read_received,
                rkey: w.wr.rkey,
                dma_len: remaining as u32,
            });
            let pkts = packets_for(remaining, mtu);
            let t = match self.emit_from(&h, 0, PayloadSrc::None, mem, buf, mode) {
                Ok(t) => t,
                Err(e) => return self.request_not_built(idx, e),
            };
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
                h.reth = Some(RethRepr {
                    va: w.wr.remote_addr,
                    rkey: w.wr.rkey,
                    dma_len: w.len as u32,
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
            if last && w.wr.opcode == WrOpcode::SendWithInv {
                h.ieth = Some(w.wr.imm); // the rkey to invalidate (SendWr::imm)
            }
            let src = PayloadSrc::Local {
                sges: &w.wr.sges,
                off,
            };
            let ack_req = h.ack_req;
            let n = match self.emit_from(&h, take as usize, src, mem, buf, mode) {
                Ok(n) => n,
                Err(e) => return self.request_not_built(idx, e),
            };
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

    /// A request packet of WQE `idx` could not be built (after its first PSN and READ
    /// credit were taken): rather than leave a send queue that never moves, the WR
    /// completes in error and the QP enters ERR (§4.8), as a bad local key found at the
    /// first transmission does. LOC_PROT_ERR when its memory refused the access (it was
    /// deregistered or lost its rights after the post); LOC_LEN_ERR when the caller's
    /// buffer is smaller than the packet (`poll_transmit` needs `max_packet_len(path_mtu)`
    /// bytes), which no later call with the same buffer would fix.
    fn request_not_built<'m>(&mut self, idx: usize, e: EmitError) -> Option<TxParts<'m>> {
        self.req.sq[idx].error = Some(match e {
            EmitError::Memory(_) => WcStatus::LocProtErr,
            EmitError::Buffer => WcStatus::LocLenErr,
        });
        self.enter_error();
        None
    }

    /// The local ACK timeout in ns; None for timeout = 0 (no timer).
    pub(super) fn ack_timeout_ns(&self) -> Option<u64> {
        match crate::config::encoding::ack_timeout_ns(self.attr.timeout) {
            Some(0) | None => None,
            Some(t) => Some(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::memory::{Key, MemError, Sge};
    use super::super::verbs::attr_mask as m;
    use super::super::{QpAttr, QpCaps, VecMemory, max_packet_len};
    use super::*;
    use std::cell::Cell;

    type MemResult = std::result::Result<(), MemError>;

    const MTU: u32 = 256;
    const LKEY: u32 = 0x100;

    fn rts() -> Qp {
        let mut qp = Qp::new(0x11, QpCaps::default());
        let mut a = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ,
            ..Default::default()
        };
        qp.modify(&a, m::STATE | m::PKEY_INDEX | m::PORT | m::ACCESS_FLAGS)
            .unwrap();
        a.qp_state = QpState::Rtr;
        a.path_mtu = MTU;
        a.dest_qp_num = 0x22;
        a.max_dest_rd_atomic = 4;
        qp.modify(
            &a,
            m::STATE
                | m::AV
                | m::PATH_MTU
                | m::DEST_QPN
                | m::RQ_PSN
                | m::MAX_DEST_RD_ATOMIC
                | m::MIN_RNR_TIMER,
        )
        .unwrap();
        a.qp_state = QpState::Rts;
        a.max_rd_atomic = 4;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        qp.modify(
            &a,
            m::STATE | m::SQ_PSN | m::MAX_QP_RD_ATOMIC | m::RETRY_CNT | m::RNR_RETRY | m::TIMEOUT,
        )
        .unwrap();
        qp
    }

    fn memory() -> VecMemory {
        let mut mem = VecMemory::new();
        mem.add_region(0x1000, 4096, LKEY, 0x200, access::LOCAL_WRITE);
        mem
    }

    fn wr(wr_id: u64, opcode: WrOpcode, len: u32) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            flags: send_flags::SIGNALED,
            sges: smallvec::smallvec![Sge {
                addr: 0x1000,
                length: len,
                lkey: LKEY,
            }],
            remote_addr: 0x9000,
            rkey: 0x300,
            imm: 0,
        }
    }

    /// The statuses of every completion queued, in order.
    fn statuses(qp: &mut Qp) -> Vec<(u64, WcStatus)> {
        std::iter::from_fn(|| qp.poll_completion())
            .map(|c| (c.wr_id, c.status))
            .collect()
    }

    #[test]
    fn a_buffer_too_small_for_the_packet_fails_the_wr_instead_of_stalling() {
        for (opcode, len) in [(WrOpcode::Send, 200), (WrOpcode::RdmaRead, 200)] {
            let mem = memory();
            let mut qp = rts();
            qp.post_send(wr(1, opcode, len)).unwrap();
            qp.post_send(wr(2, WrOpcode::Send, 8)).unwrap();
            // Room for the headers but not the payload (SEND), or not even the headers (READ).
            let mut small = vec![0u8; 20];
            assert_eq!(qp.poll_transmit(0, &mem, &mut small), None);
            assert_eq!(qp.state(), QpState::Err, "{opcode:?}");
            assert!(!qp.wants_transmit());
            assert_eq!(
                statuses(&mut qp),
                [(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)],
                "{opcode:?}"
            );
            // A buffer of the documented size works (a fresh QP).
            let mut qp = rts();
            qp.post_send(wr(1, opcode, len)).unwrap();
            let mut buf = vec![0u8; max_packet_len(MTU)];
            assert!(qp.poll_transmit(0, &mem, &mut buf).is_some());
            assert_eq!(qp.state(), QpState::Rts);
        }
    }

    /// A SEND of a small SGE then a large one (a messenger header, then its data), sent by
    /// a gathering driver: the packet spanning both copies the small piece after its
    /// headers and lends the large one; the next packet, inside one SGE, is lent whole; the
    /// bytes are the message's. `poll_transmit_vectored` (whose parts a receiver may take
    /// as they are) copies the spanning packet whole.
    #[test]
    fn a_packet_spanning_sges_lends_its_last_piece() {
        let mut mem = VecMemory::new();
        mem.add_region(0x1000, 4096, LKEY, 0x200, access::LOCAL_WRITE);
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        mem.write(Key::Local(LKEY), 0x1000, &data, access::LOCAL_WRITE)
            .unwrap();
        let mut qp = rts();
        let mut w = wr(1, WrOpcode::Send, 0);
        w.sges = smallvec::smallvec![
            Sge {
                addr: 0x1000,
                length: 40,
                lkey: LKEY,
            },
            Sge {
                addr: 0x1800,
                length: 400,
                lkey: LKEY,
            },
        ];
        qp.post_send(w.clone()).unwrap();
        let mut lending = rts();
        lending.post_send(w).unwrap();
        let want: Vec<u8> = [&data[..40], &data[0x800..0x800 + 400]].concat();
        let mut buf = vec![0u8; max_packet_len(MTU)];
        let mut got = Vec::new();
        let mut heads = Vec::new();
        while let Some(t) = qp.poll_transmit_gather(0, &mem, &mut buf) {
            heads.push((t.head_len, t.payload.len(), t.payload.as_ptr()));
            // The BTH (12 bytes) is a SEND FIRST/LAST's only header.
            got.extend_from_slice(&buf[12..t.head_len]);
            got.extend_from_slice(t.payload);
        }
        assert_eq!(heads.len(), 2, "{heads:?}");
        // Packet 1: BTH + 40 copied bytes, then 216 bytes lent from the second SGE.
        assert_eq!((heads[0].0, heads[0].1), (12 + 40, 216), "{heads:?}");
        assert_eq!(
            heads[0].2,
            mem.slice(Key::Local(LKEY), 0x1800, 216, 0)
                .unwrap()
                .as_ptr()
        );
        // Packet 2: the remaining 184 bytes, lent.
        assert_eq!((heads[1].0, heads[1].1), (12, 184), "{heads:?}");
        assert_eq!(got, want);
        let t = lending.poll_transmit_vectored(0, &mem, &mut buf).unwrap();
        assert!(t.is_contiguous() && t.head_len == 12 + 256 + 4, "{t:?}");
    }

    /// Memory that refuses reads once `fail` is set (a region deregistered mid-message).
    struct Revocable {
        mem: VecMemory,
        fail: Cell<bool>,
    }

    impl Memory for Revocable {
        fn read(&self, key: Key, addr: u64, out: &mut [u8], a: u32) -> MemResult {
            if self.fail.get() {
                return Err(MemError::BadKey);
            }
            self.mem.read(key, addr, out, a)
        }
        fn write(&mut self, key: Key, addr: u64, data: &[u8], a: u32) -> MemResult {
            self.mem.write(key, addr, data, a)
        }
        fn check(&self, key: Key, addr: u64, len: u64, a: u32) -> MemResult {
            self.mem.check(key, addr, len, a)
        }
    }

    #[test]
    fn memory_revoked_mid_message_fails_the_wr_with_loc_prot_err() {
        let mem = Revocable {
            mem: memory(),
            fail: Cell::new(false),
        };
        let mut qp = rts();
        // Three packets at MTU 256.
        qp.post_send(wr(7, WrOpcode::Send, 600)).unwrap();
        let mut buf = vec![0u8; max_packet_len(MTU)];
        assert!(qp.poll_transmit(0, &mem, &mut buf).is_some());
        mem.fail.set(true);
        assert_eq!(qp.poll_transmit(0, &mem, &mut buf), None);
        assert_eq!(qp.state(), QpState::Err);
        assert_eq!(statuses(&mut qp), [(7, WcStatus::LocProtErr)]);
    }
}

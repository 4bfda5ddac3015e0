//! Responder: expected PSN, in-sequence / duplicate / future packets (§3.3, §5.4), RNR NAK
//! with the responder's own min_rnr_timer (§5.2), access checks and NAKs (§5.3), READ
//! resources (max_dest_rd_atomic, §5.5), receive completions (§5.6) and coalesced ACKs.

use std::collections::VecDeque;

use super::emit::{EmitError, PayloadSrc, TxParts};
use super::memory::{self, Key, Memory, sge_total};
use super::packet::{Hdr, op, syndrome};
use super::psn;
use super::qp::{Qp, packets_for};
use super::verbs::{WcOpcode, WcStatus, access};
use super::wr::{Completion, RecvWr};

/// How many queued READ responses `prefetch_next_response` hints ahead.
const PREFETCH_AHEAD: usize = 4;

/// A READ the responder executed, kept for replay of duplicates.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReadRes {
    pub first_psn: u32,
    pub last_psn: u32,
    pub va: u64,
    pub rkey: u32,
    pub len: u64,
}

/// Something the responder has to send.
#[derive(Debug, Clone, Copy)]
pub(super) enum RespItem {
    /// ACKNOWLEDGE with this syndrome and PSN (ACK, RNR NAK or NAK).
    Ack { syn: u8, psn: u32 },
    /// READ responses for `res` from `psn` on.
    Read { res: ReadRes, psn: u32 },
}

impl RespItem {
    pub fn is_ack(&self) -> bool {
        matches!(self, RespItem::Ack { .. })
    }
}

#[derive(Debug)]
enum InMsg {
    Send {
        wr: RecvWr,
        off: u64,
    },
    Write {
        va: u64,
        rkey: u32,
        total: u64,
        off: u64,
    },
}

#[derive(Debug, Default)]
pub(super) struct Responder {
    pub rq: VecDeque<RecvWr>,
    pub epsn: u32,
    pub msn: u32,
    nak_sent: bool,
    /// PSN of the last SEND/WRITE packet accepted (what duplicates are re-ACKed with).
    ack_psn: Option<u32>,
    cur: Option<InMsg>,
    resources: VecDeque<ReadRes>,
    pub out: VecDeque<RespItem>,
}

impl Responder {
    pub fn reset_psn(&mut self, rq_psn: u32) {
        self.epsn = rq_psn & psn::PSN_MASK;
    }

    pub fn take_current_recv(&mut self) -> Option<RecvWr> {
        match self.cur.take() {
            Some(InMsg::Send { wr, .. }) => Some(wr),
            _ => None,
        }
    }

    /// Queues an ACK/NAK. A queued plain ACK is replaced by the newer one (coalescing: an
    /// ACK or NAK for PSN p acknowledges everything before p); a queued NAK is never
    /// replaced, since the requester must see it (an RNR NAK's wait, an error's cause).
    fn push_ack(&mut self, syn: u8, psn: u32) {
        if let Some(RespItem::Ack { syn: s, .. }) = self.out.back()
            && *s == syndrome::ACK
        {
            self.out.pop_back();
        }
        self.out.push_back(RespItem::Ack { syn, psn });
    }
}

/// Why a request was refused: which NAK to send and what to complete locally.
enum Refuse {
    InvReq,
    RemAccess,
    RemOp,
}

fn needs_recv_wqe(opcode: u8) -> bool {
    matches!(
        opcode,
        op::SEND_FIRST
            | op::SEND_ONLY
            | op::SEND_ONLY_IMM
            | op::WRITE_LAST_IMM
            | op::WRITE_ONLY_IMM
    )
}

impl Qp {
    pub(super) fn on_request(&mut self, hdr: &Hdr, payload: &[u8], mem: &mut dyn Memory) {
        let d = psn::diff(hdr.psn, self.resp.epsn);
        if d > 0 {
            self.counters.out_of_sequence += 1;
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                self.counters.seq_naks_sent += 1;
                let e = self.resp.epsn;
                self.resp.push_ack(syndrome::NAK_SEQ, e);
            }
            return;
        }
        if d < 0 {
            self.counters.duplicates_received += 1;
            self.on_duplicate(hdr);
            return;
        }
        self.resp.nak_sent = false;
        if let Err(r) = self.execute(hdr, payload, mem) {
            let syn = match r {
                Refuse::InvReq => syndrome::NAK_INV_REQ,
                Refuse::RemAccess => syndrome::NAK_REM_ACCESS,
                Refuse::RemOp => syndrome::NAK_REM_OP,
            };
            self.resp.push_ack(syn, hdr.psn);
            self.enter_error();
        }
    }

    fn on_duplicate(&mut self, hdr: &Hdr) {
        if hdr.opcode == op::READ_REQUEST {
            let Some(reth) = hdr.reth else { return };
            let mtu = u64::from(self.attr.path_mtu);
            let found = self.resp.resources.iter().find(|r| {
                let k = psn::diff(hdr.psn, r.first_psn);
                k >= 0
                    && psn::diff(r.last_psn, hdr.psn) >= 0
                    && r.rkey == reth.rkey
                    && reth.va == r.va + k as u64 * mtu
                    && reth.va + u64::from(reth.len) <= r.va + r.len
            });
            // Replay (re-reading memory); a recycled resource means silent drop (§5.4).
            if let Some(res) = found.copied() {
                self.resp
                    .out
                    .push_back(RespItem::Read { res, psn: hdr.psn });
            }
            return;
        }
        // SEND/WRITE duplicates: re-ACK, never re-deliver.
        let p = self
            .resp
            .ack_psn
            .unwrap_or_else(|| psn::add(self.resp.epsn, psn::PSN_MASK));
        self.resp.push_ack(syndrome::ACK, p);
    }

    fn execute(&mut self, hdr: &Hdr, payload: &[u8], mem: &mut dyn Memory) -> Result<(), Refuse> {
        let mtu = self.attr.path_mtu as usize;
        let opc = hdr.opcode;
        let starts = matches!(
            opc,
            op::SEND_FIRST
                | op::SEND_ONLY
                | op::SEND_ONLY_IMM
                | op::WRITE_FIRST
                | op::WRITE_ONLY
                | op::WRITE_ONLY_IMM
                | op::READ_REQUEST
        );
        // Opcode sequence: a new message only when none is open; continuations only of
        // the matching kind.
        match (&self.resp.cur, starts) {
            (Some(_), true) => return Err(Refuse::InvReq),
            (None, false) => return Err(Refuse::InvReq),
            (Some(InMsg::Send { .. }), false)
                if !matches!(opc, op::SEND_MIDDLE | op::SEND_LAST | op::SEND_LAST_IMM) =>
            {
                return Err(Refuse::InvReq);
            }
            (Some(InMsg::Write { .. }), false)
                if !matches!(opc, op::WRITE_MIDDLE | op::WRITE_LAST | op::WRITE_LAST_IMM) =>
            {
                return Err(Refuse::InvReq);
            }
            _ => {}
        }
        // Packet length rules (§2.2).
        let len_ok = match opc {
            op::SEND_FIRST | op::SEND_MIDDLE | op::WRITE_FIRST | op::WRITE_MIDDLE => {
                payload.len() == mtu
            }
            op::SEND_LAST | op::SEND_LAST_IMM | op::WRITE_LAST | op::WRITE_LAST_IMM => {
                (1..=mtu).contains(&payload.len())
            }
            op::READ_REQUEST => payload.is_empty(),
            _ => payload.len() <= mtu,
        };
        if !len_ok {
            return Err(Refuse::InvReq);
        }
        if opc == op::READ_REQUEST {
            return self.start_read(hdr, mem);
        }
        // RNR: a packet that needs a receive WQE and finds none is NAKed, not dropped (§5.2).
        if needs_recv_wqe(opc) && self.resp.rq.is_empty() {
            self.counters.rnr_naks_sent += 1;
            let code = self.attr.min_rnr_timer & 0x1F;
            self.resp.push_ack(syndrome::RNR_NAK | code, hdr.psn);
            return Ok(());
        }
        match opc {
            op::SEND_FIRST | op::SEND_ONLY | op::SEND_ONLY_IMM => {
                let wr = self.resp.rq.pop_front().expect("checked non-empty");
                self.resp.cur = Some(InMsg::Send { wr, off: 0 });
            }
            op::WRITE_FIRST | op::WRITE_ONLY | op::WRITE_ONLY_IMM => {
                let reth = hdr.reth.ok_or(Refuse::InvReq)?;
                if self.attr.qp_access_flags & access::REMOTE_WRITE == 0 {
                    return Err(Refuse::InvReq);
                }
                let total = u64::from(reth.len);
                if total > 1 << 31 {
                    return Err(Refuse::InvReq);
                }
                if total > 0 {
                    mem.check(Key::Remote(reth.rkey), reth.va, total, access::REMOTE_WRITE)
                        .map_err(|_| Refuse::RemAccess)?;
                }
                self.resp.cur = Some(InMsg::Write {
                    va: reth.va,
                    rkey: reth.rkey,
                    total,
                    off: 0,
                });
            }
            _ => {}
        }
        let last = matches!(
            opc,
            op::SEND_LAST
                | op::SEND_LAST_IMM
                | op::SEND_ONLY
                | op::SEND_ONLY_IMM
                | op::WRITE_LAST
                | op::WRITE_LAST_IMM
                | op::WRITE_ONLY
                | op::WRITE_ONLY_IMM
        );
        let qpn = self.qpn;
        match self.resp.cur.as_mut().expect("set above") {
            InMsg::Send { wr, off } => {
                if *off + payload.len() as u64 > sge_total(&wr.sges) {
                    let id = wr.wr_id;
                    self.resp.cur = None;
                    self.push_completion(id, WcStatus::LocLenErr, WcOpcode::Recv, true);
                    return Err(Refuse::InvReq);
                }
                if memory::scatter(mem, &wr.sges, *off, payload).is_err() {
                    let id = wr.wr_id;
                    self.resp.cur = None;
                    self.push_completion(id, WcStatus::LocProtErr, WcOpcode::Recv, true);
                    return Err(Refuse::RemOp);
                }
                *off += payload.len() as u64;
            }
            InMsg::Write {
                va,
                rkey,
                total,
                off,
            } => {
                let after = *off + payload.len() as u64;
                if after > *total || (last != (after == *total)) {
                    return Err(Refuse::InvReq);
                }
                if !payload.is_empty() {
                    mem.write(
                        Key::Remote(*rkey),
                        *va + *off,
                        payload,
                        access::REMOTE_WRITE,
                    )
                    .map_err(|_| Refuse::RemAccess)?;
                }
                *off = after;
            }
        }
        if last {
            match self.resp.cur.take() {
                Some(InMsg::Send { wr, off }) => self.completions.push_back(Completion {
                    wr_id: wr.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::Recv,
                    byte_len: off as u32,
                    imm: hdr.imm,
                    qp_num: qpn,
                    is_recv: true,
                }),
                Some(InMsg::Write { total, .. }) if hdr.imm.is_some() => {
                    let wr = self.resp.rq.pop_front().expect("checked non-empty");
                    self.completions.push_back(Completion {
                        wr_id: wr.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::RecvRdmaWithImm,
                        byte_len: total as u32,
                        imm: hdr.imm,
                        qp_num: qpn,
                        is_recv: true,
                    });
                }
                _ => {}
            }
            self.resp.msn = psn::add(self.resp.msn, 1);
        }
        self.resp.ack_psn = Some(hdr.psn);
        self.resp.epsn = psn::add(hdr.psn, 1);
        if hdr.ack_req {
            self.resp.push_ack(syndrome::ACK, hdr.psn);
        }
        Ok(())
    }

    fn start_read(&mut self, hdr: &Hdr, mem: &dyn Memory) -> Result<(), Refuse> {
        let reth = hdr.reth.ok_or(Refuse::InvReq)?;
        if self.attr.qp_access_flags & access::REMOTE_READ == 0 || self.attr.max_dest_rd_atomic == 0
        {
            return Err(Refuse::InvReq);
        }
        let len = u64::from(reth.len);
        if len > 1 << 31 {
            return Err(Refuse::InvReq);
        }
        // Checked here so a bad rkey is NAKed with the request's PSN; re-checked on every
        // response packet (the region may be deregistered meanwhile). Zero-length READs skip
        // the rkey check (§5.3).
        if len > 0 {
            mem.check(Key::Remote(reth.rkey), reth.va, len, access::REMOTE_READ)
                .map_err(|_| Refuse::RemAccess)?;
        }
        let npkts = packets_for(len, self.attr.path_mtu);
        let res = ReadRes {
            first_psn: hdr.psn,
            last_psn: psn::add(hdr.psn, npkts - 1),
            va: reth.va,
            rkey: reth.rkey,
            len,
        };
        if self.resp.resources.len() >= usize::from(self.attr.max_dest_rd_atomic) {
            self.resp.resources.pop_front(); // rxe recycles the oldest (§5.5)
        }
        self.resp.resources.push_back(res);
        self.resp
            .out
            .push_back(RespItem::Read { res, psn: hdr.psn });
        self.resp.epsn = psn::add(hdr.psn, npkts);
        self.resp.msn = psn::add(self.resp.msn, 1);
        Ok(())
    }

    /// Hints the memory of the next READ responses' payloads, so their fetch overlaps the
    /// sending of this one (a NIC pipelines its DMA reads the same way). The next
    /// `PREFETCH_AHEAD` queued responses are hinted each time, so each payload is hinted
    /// several times, the last just before it is sent; one hint, given only one response
    /// ahead, measured ~5% slower in `rdmx-perf engine_bench` (and hinting at request
    /// arrival slower still: the lines are gone again by the time they are sent).
    fn prefetch_next_response(&self, mem: &dyn Memory) {
        let mtu = u64::from(self.attr.path_mtu);
        for item in self.resp.out.iter().take(PREFETCH_AHEAD) {
            if let RespItem::Read { res, psn: p } = item {
                let off = psn::diff(*p, res.first_psn).max(0) as u64 * mtu;
                let n = res.len.saturating_sub(off).min(mtu);
                if n > 0 {
                    mem.prefetch(Key::Remote(res.rkey), res.va + off, n);
                }
            }
        }
    }

    /// Builds the next response packet (ACK/NAK or READ response), if any.
    pub(super) fn next_response<'m>(
        &mut self,
        mem: &'m dyn Memory,
        buf: &mut [u8],
        vectored: bool,
    ) -> Option<TxParts<'m>> {
        let item = *self.resp.out.front()?;
        let dest_qp = self.attr.dest_qp_num;
        let msn = self.resp.msn;
        match item {
            RespItem::Ack { syn, psn: p } => {
                self.resp.out.pop_front();
                let mut h = Hdr::new(op::ACKNOWLEDGE, dest_qp, p);
                h.aeth = Some((syn, msn));
                self.emit_from(&h, 0, PayloadSrc::None, mem, buf, vectored)
                    .ok()
            }
            RespItem::Read { res, psn: p } => {
                let mtu = u64::from(self.attr.path_mtu);
                let k = psn::diff(p, res.first_psn).max(0) as u64;
                let off = k * mtu;
                let n = (res.len.saturating_sub(off)).min(mtu) as usize;
                let first = p == res.first_psn;
                let last = p == res.last_psn;
                let opcode = match (first, last) {
                    (true, true) => op::READ_RESP_ONLY,
                    (true, false) => op::READ_RESP_FIRST,
                    (false, true) => op::READ_RESP_LAST,
                    (false, false) => op::READ_RESP_MIDDLE,
                };
                let mut h = Hdr::new(opcode, dest_qp, p);
                if opcode != op::READ_RESP_MIDDLE {
                    h.aeth = Some((syndrome::ACK, msn));
                }
                let src = PayloadSrc::Remote {
                    rkey: res.rkey,
                    va: res.va + off,
                };
                let t = match self.emit_from(&h, n, src, mem, buf, vectored) {
                    Ok(t) => t,
                    Err(EmitError::Buffer) => return None,
                    Err(EmitError::Memory(_)) => {
                        // The region went away or lost its rights since the request.
                        self.resp.out.pop_front();
                        self.resp.push_ack(syndrome::NAK_REM_ACCESS, p);
                        self.enter_error();
                        return self.next_response(mem, buf, vectored);
                    }
                };
                if last {
                    self.resp.out.pop_front();
                } else if let Some(RespItem::Read { psn, .. }) = self.resp.out.front_mut() {
                    *psn = psn::add(p, 1);
                }
                self.prefetch_next_response(mem);
                Some(t)
            }
        }
    }
}

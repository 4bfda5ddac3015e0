//! Responder: expected PSN, in-sequence / duplicate / future packets (§3.3, §5.4), RNR NAK
//! with the responder's own min_rnr_timer (§5.2), access checks and NAKs (§5.3), READ
//! resources (max_dest_rd_atomic, §5.5), receive completions (§5.6) and coalesced ACKs.
//!
//! Bounded from the network: whatever a peer sends, `out` holds at most
//! `max_dest_rd_atomic` READ response streams for new READs (one more is refused with NAK
//! Invalid Request and QP ERR, §5.5), at most one stream per saved READ resource and at most
//! `max_dest_rd_atomic` replays (further duplicates are dropped and counted, §5.4), and
//! at most one ACK/NAK between two streams (coalesced, §3.4): at most
//! 4 * max_dest_rd_atomic + 1 items.

use std::collections::VecDeque;

use super::emit::{EmitError, PayloadSrc, TxMode, TxParts};
use super::memory::{self, Key, Memory, sge_total};
use super::packet::{AethRepr, Hdr, NakCode, Opcode, Syndrome};
use super::psn;
use super::qp::{Qp, packets_for};
use super::verbs::{QpState, WcOpcode, WcStatus, access};
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
    /// The key its responses read through: `Key::Remote(rkey)`, or the region's lkey once
    /// a SEND_WITH_INVALIDATE that came after the READ invalidated the window `rkey` names
    /// (requests execute in order: the READ was authorised before the invalidation).
    pub src: Key,
}

/// Something the responder has to send.
#[derive(Debug, Clone, Copy)]
pub(super) enum RespItem {
    /// ACKNOWLEDGE with this syndrome and PSN (ACK, RNR NAK or NAK).
    Ack { syn: Syndrome, psn: u32 },
    /// READ responses for `res` from `psn` on; `replay` when a duplicate asked for them
    /// again (§5.4), not a new READ.
    Read {
        res: ReadRes,
        psn: u32,
        replay: bool,
    },
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

    /// Queues an ACK/NAK, coalesced with one at the tail of the queue, so a flood of
    /// requests that each want an answer (duplicates, RNR, gaps) queues one, not one each.
    /// An ACK or NAK for PSN p acknowledges everything before p (§3.4), so the newer
    /// replaces a queued plain ACK, and replaces a queued sequence or RNR NAK if its PSN is
    /// later (the NAK's news is stale once a later PSN is accepted or refused) or the same
    /// and it is an ACK (accepted after all) or an RNR NAK (the fresher wait); an earlier
    /// one says nothing the NAK does not, and is dropped, as is a sequence NAK for the PSN
    /// an RNR NAK refused. An error NAK (the QP is going to ERR) replaces any of them and
    /// is never replaced: the requester must learn why (§5.3).
    fn push_ack(&mut self, syn: Syndrome, psn: u32) {
        if let Some(RespItem::Ack { syn: s, psn: q }) = self.out.back_mut() {
            let newer = match *s {
                Syndrome::Ack { .. } => true,
                s if is_error_nak(s) => false,
                // A sequence NAK for the PSN an RNR NAK refused follows from that refusal
                // (the SEND after it found a gap): the RNR NAK's wait is what counts.
                _ => match psn::diff(psn, *q) {
                    d if d > 0 => true,
                    0 => syn != NAK_SEQ,
                    _ => is_error_nak(syn),
                },
            };
            if newer {
                (*s, *q) = (syn, psn);
            }
            return;
        }
        self.out.push_back(RespItem::Ack { syn, psn });
    }

    /// Whether something is queued and all of it is positive ACKs (no NAK, no READ
    /// response).
    pub fn only_acks_queued(&self) -> bool {
        !self.out.is_empty()
            && self.out.iter().all(|i| {
                matches!(
                    i,
                    RespItem::Ack {
                        syn: Syndrome::Ack { .. },
                        ..
                    }
                )
            })
    }

    /// READ response streams queued for new READs (not replays).
    fn reads_queued(&self) -> usize {
        self.out
            .iter()
            .filter(|i| matches!(i, RespItem::Read { replay: false, .. }))
            .count()
    }
}

/// The syndromes the responder sends (§1.4): ACK without credit information (0x1F, as
/// rxe), the sequence NAK and the error NAKs.
const ACK: Syndrome = Syndrome::ACK_UNLIMITED;
const NAK_SEQ: Syndrome = Syndrome::Nak(NakCode::PsnSequenceError);
const NAK_INV_REQ: Syndrome = Syndrome::Nak(NakCode::InvalidRequest);
const NAK_REM_ACCESS: Syndrome = Syndrome::Nak(NakCode::RemoteAccessError);
const NAK_REM_OP: Syndrome = Syndrome::Nak(NakCode::RemoteOperationalError);

/// A NAK after which the responder's QP goes to ERR (Invalid Request, Remote Access,
/// Remote Operational: 0x61..0x7F; 0x60 is the sequence NAK).
fn is_error_nak(syn: Syndrome) -> bool {
    matches!(syn, Syndrome::Nak(code) if code != NakCode::PsnSequenceError)
}

/// Why a request was refused: which NAK to send and what to complete locally.
enum Refuse {
    InvReq,
    RemAccess,
    RemOp,
}

fn needs_recv_wqe(opcode: Opcode) -> bool {
    matches!(
        opcode,
        Opcode::SendFirst
            | Opcode::SendOnly
            | Opcode::SendOnlyWithImmediate
            | Opcode::SendOnlyWithInvalidate
            | Opcode::RdmaWriteLastWithImmediate
            | Opcode::RdmaWriteOnlyWithImmediate
    )
}

impl Qp {
    /// Whether `packet` (a request as `handle_packet` takes it), processed now, would need
    /// a receive WQE and find the receive queue empty: a SEND starting a message or a
    /// WRITE_WITH_IMM's last packet, at the expected PSN, in RTR/RTS, with no WQE queued.
    /// A driver with a shared receive queue moves one WQE to this QP then (so the packet
    /// is not RNR-NAKed while the SRQ has WQEs), and only then: duplicates, packets out of
    /// sequence and other states consume nothing.
    pub fn wants_recv_wqe(&self, packet: &[u8]) -> bool {
        if !matches!(self.state, QpState::Rtr | QpState::Rts) || !self.resp.rq.is_empty() {
            return false;
        }
        let Ok(bth) = crate::wire::Bth::new_checked(packet) else {
            return false;
        };
        let Ok(opc) = Opcode::from_u8(bth.opcode_raw()) else {
            return false;
        };
        needs_recv_wqe(opc) && bth.psn() == self.resp.epsn
    }

    pub(super) fn on_request(&mut self, hdr: &Hdr, payload: &[u8], mem: &mut dyn Memory) {
        let d = psn::diff(hdr.psn, self.resp.epsn);
        if d > 0 {
            self.counters.out_of_sequence += 1;
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                let e = self.resp.epsn;
                self.resp.push_ack(NAK_SEQ, e);
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
                Refuse::InvReq => NAK_INV_REQ,
                Refuse::RemAccess => NAK_REM_ACCESS,
                Refuse::RemOp => NAK_REM_OP,
            };
            self.resp.push_ack(syn, hdr.psn);
            self.enter_error_answering();
        }
    }

    fn on_duplicate(&mut self, hdr: &Hdr) {
        if hdr.opcode == Opcode::RdmaReadRequest {
            let Some(reth) = hdr.reth else { return };
            let mtu = u64::from(self.attr.path_mtu);
            let found = self.resp.resources.iter().find(|r| {
                let k = psn::diff(hdr.psn, r.first_psn);
                k >= 0
                    && psn::diff(r.last_psn, hdr.psn) >= 0
                    && r.rkey == reth.rkey
                    && reth.va == r.va + k as u64 * mtu
                    && reth.va + u64::from(reth.dma_len) <= r.va + r.len
            });
            // Replay (re-reading memory); a recycled resource means silent drop (§5.4).
            if let Some(res) = found.copied() {
                self.replay_read(res, hdr.psn);
            }
            return;
        }
        // SEND/WRITE duplicates: re-ACK, never re-deliver.
        let p = self
            .resp
            .ack_psn
            .unwrap_or_else(|| psn::add(self.resp.epsn, psn::PSN_MASK));
        self.resp.push_ack(ACK, p);
    }

    /// Queues the responses of `res` again from PSN `p` for a duplicate READ, bounded:
    /// one response stream per READ, as rxe keeps one per resource (§5.4: a duplicate
    /// restarts the resource's responses). A duplicate of a READ whose responses (original
    /// or replay) are still queued joins that stream, rewinding it to `p` if `p` is earlier
    /// (the requester lost what was sent from there) and is otherwise dropped; with
    /// `max_dest_rd_atomic` replays queued, a further one is dropped (the requester's
    /// retry timer asks again). Both drops are counted in `dropped_duplicate_reads`.
    fn replay_read(&mut self, res: ReadRes, p: u32) {
        let mut replays = 0;
        for item in self.resp.out.iter_mut() {
            if let RespItem::Read {
                res: r,
                psn: cur,
                replay,
            } = item
            {
                if r.first_psn == res.first_psn && r.rkey == res.rkey {
                    if psn::diff(p, *cur) < 0 {
                        *cur = p;
                    }
                    self.counters.dropped_duplicate_reads += 1;
                    return;
                }
                replays += usize::from(*replay);
            }
        }
        if replays >= usize::from(self.attr.max_dest_rd_atomic) {
            self.counters.dropped_duplicate_reads += 1;
            return;
        }
        self.resp.out.push_back(RespItem::Read {
            res,
            psn: p,
            replay: true,
        });
    }

    fn execute(&mut self, hdr: &Hdr, payload: &[u8], mem: &mut dyn Memory) -> Result<(), Refuse> {
        let mtu = self.attr.path_mtu as usize;
        let opc = hdr.opcode;
        let starts = matches!(
            opc,
            Opcode::SendFirst
                | Opcode::SendOnly
                | Opcode::SendOnlyWithImmediate
                | Opcode::SendOnlyWithInvalidate
                | Opcode::RdmaWriteFirst
                | Opcode::RdmaWriteOnly
                | Opcode::RdmaWriteOnlyWithImmediate
                | Opcode::RdmaReadRequest
        );
        // Opcode sequence: a new message only when none is open; continuations only of
        // the matching kind.
        match (&self.resp.cur, starts) {
            (Some(_), true) => return Err(Refuse::InvReq),
            (None, false) => return Err(Refuse::InvReq),
            (Some(InMsg::Send { .. }), false)
                if !matches!(
                    opc,
                    Opcode::SendMiddle
                        | Opcode::SendLast
                        | Opcode::SendLastWithImmediate
                        | Opcode::SendLastWithInvalidate
                ) =>
            {
                return Err(Refuse::InvReq);
            }
            (Some(InMsg::Write { .. }), false)
                if !matches!(
                    opc,
                    Opcode::RdmaWriteMiddle
                        | Opcode::RdmaWriteLast
                        | Opcode::RdmaWriteLastWithImmediate
                ) =>
            {
                return Err(Refuse::InvReq);
            }
            _ => {}
        }
        // Packet length rules (§2.2).
        let len_ok = match opc {
            Opcode::SendFirst
            | Opcode::SendMiddle
            | Opcode::RdmaWriteFirst
            | Opcode::RdmaWriteMiddle => payload.len() == mtu,
            Opcode::SendLast
            | Opcode::SendLastWithImmediate
            | Opcode::SendLastWithInvalidate
            | Opcode::RdmaWriteLast
            | Opcode::RdmaWriteLastWithImmediate => (1..=mtu).contains(&payload.len()),
            Opcode::RdmaReadRequest => payload.is_empty(),
            _ => payload.len() <= mtu,
        };
        if !len_ok {
            return Err(Refuse::InvReq);
        }
        if opc == Opcode::RdmaReadRequest {
            return self.start_read(hdr, mem);
        }
        // RNR: a packet that needs a receive WQE and finds none is NAKed, not dropped (§5.2).
        if needs_recv_wqe(opc) && self.resp.rq.is_empty() {
            let code = self.attr.min_rnr_timer & 0x1F;
            self.resp
                .push_ack(Syndrome::RnrNak { timer: code }, hdr.psn);
            return Ok(());
        }
        match opc {
            Opcode::SendFirst
            | Opcode::SendOnly
            | Opcode::SendOnlyWithImmediate
            | Opcode::SendOnlyWithInvalidate => {
                let wr = self.resp.rq.pop_front().expect("checked non-empty");
                self.resp.cur = Some(InMsg::Send { wr, off: 0 });
            }
            Opcode::RdmaWriteFirst | Opcode::RdmaWriteOnly | Opcode::RdmaWriteOnlyWithImmediate => {
                let reth = hdr.reth.ok_or(Refuse::InvReq)?;
                if self.attr.qp_access_flags & access::REMOTE_WRITE == 0 {
                    return Err(Refuse::InvReq);
                }
                let total = u64::from(reth.dma_len);
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
            Opcode::SendLast
                | Opcode::SendLastWithImmediate
                | Opcode::SendLastWithInvalidate
                | Opcode::SendOnly
                | Opcode::SendOnlyWithImmediate
                | Opcode::SendOnlyWithInvalidate
                | Opcode::RdmaWriteLast
                | Opcode::RdmaWriteLastWithImmediate
                | Opcode::RdmaWriteOnly
                | Opcode::RdmaWriteOnlyWithImmediate
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
                Some(InMsg::Send { wr, off }) => {
                    let (opcode, imm) = match hdr.ieth {
                        Some(rkey) => {
                            if !self.invalidate_remote(rkey, mem) {
                                // rxe (Class J): the receive completes in error, the SEND
                                // is acknowledged as asked (no NAK: the requester's SEND
                                // completes successfully), then the QP goes to ERR and
                                // later requests go unanswered.
                                self.push_completion(
                                    wr.wr_id,
                                    WcStatus::RemInvReqErr,
                                    WcOpcode::Recv,
                                    true,
                                );
                                if hdr.ack_req {
                                    self.resp.push_ack(ACK, hdr.psn);
                                }
                                self.enter_error_answering();
                                return Ok(());
                            }
                            (WcOpcode::RecvWithInv, Some(rkey))
                        }
                        None => (WcOpcode::Recv, hdr.imm),
                    };
                    self.completions.push_back(Completion {
                        wr_id: wr.wr_id,
                        status: WcStatus::Success,
                        opcode,
                        byte_len: off as u32,
                        imm,
                        qp_num: qpn,
                        is_recv: true,
                        solicited: hdr.solicited,
                    })
                }
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
                        solicited: hdr.solicited,
                    });
                }
                _ => {}
            }
            self.resp.msn = psn::add(self.resp.msn, 1);
        }
        self.resp.ack_psn = Some(hdr.psn);
        self.resp.epsn = psn::add(hdr.psn, 1);
        if hdr.ack_req {
            self.resp.push_ack(ACK, hdr.psn);
        }
        Ok(())
    }

    /// A SEND_WITH_INVALIDATE's invalidation of window `rkey` (at the message's end, as rxe
    /// `invalidate_rkey`): false when the memory refuses it (no type-2 window of this QP).
    /// Requests execute in order: a READ that arrived earlier and whose responses are still
    /// queued is served through the window's region from now on (its rkey opens nothing
    /// any more), and every request after this one finds the window gone. Replays of such a
    /// READ (a duplicate request) look the rkey up again and fail, as in rxe
    /// (`rxe_recheck_mr`).
    fn invalidate_remote(&mut self, rkey: u32, mem: &mut dyn Memory) -> bool {
        let Ok(lkey) = mem.invalidate_remote(self.qpn, rkey) else {
            return false;
        };
        for item in self.resp.out.iter_mut() {
            if let RespItem::Read { res, .. } = item
                && res.src == Key::Remote(rkey)
            {
                res.src = Key::Local(lkey);
            }
        }
        true
    }

    fn start_read(&mut self, hdr: &Hdr, mem: &dyn Memory) -> Result<(), Refuse> {
        let reth = hdr.reth.ok_or(Refuse::InvReq)?;
        let max_dest = usize::from(self.attr.max_dest_rd_atomic);
        if self.attr.qp_access_flags & access::REMOTE_READ == 0 || max_dest == 0 {
            return Err(Refuse::InvReq);
        }
        // Responder resources (§5.5): a READ whose responses are not all sent holds one. A
        // requester within its max_rd_atomic (at most our max_dest_rd_atomic, exchanged at
        // setup) cannot have more outstanding: it returns a credit only on the last
        // response. One more means it ignored the limit: NAK Invalid Request and QP ERR,
        // as the IBTA lets a responder that runs out do (rxe, which answers each READ
        // before taking the next packet, never queues responses, so never runs out).
        if self.resp.out.len() >= max_dest && self.resp.reads_queued() >= max_dest {
            self.counters.rd_atomic_exceeded += 1;
            return Err(Refuse::InvReq);
        }
        let len = u64::from(reth.dma_len);
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
            src: Key::Remote(reth.rkey),
        };
        if self.resp.resources.len() >= usize::from(self.attr.max_dest_rd_atomic) {
            self.resp.resources.pop_front(); // rxe recycles the oldest (§5.5)
        }
        self.resp.resources.push_back(res);
        self.resp.out.push_back(RespItem::Read {
            res,
            psn: hdr.psn,
            replay: false,
        });
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
            if let RespItem::Read { res, psn: p, .. } = item {
                let off = psn::diff(*p, res.first_psn).max(0) as u64 * mtu;
                let n = res.len.saturating_sub(off).min(mtu);
                if n > 0 {
                    mem.prefetch(res.src, res.va + off, n);
                }
            }
        }
    }

    /// Builds the next response packet (ACK/NAK or READ response), if any.
    pub(super) fn next_response<'m>(
        &mut self,
        mem: &'m dyn Memory,
        buf: &mut [u8],
        mode: TxMode,
    ) -> Option<TxParts<'m>> {
        let item = *self.resp.out.front()?;
        let dest_qp = self.attr.dest_qp_num;
        let msn = self.resp.msn;
        match item {
            RespItem::Ack { syn, psn: p } => {
                self.resp.out.pop_front();
                let mut h = Hdr::new(Opcode::Acknowledge, dest_qp, p);
                h.aeth = Some(AethRepr { syndrome: syn, msn });
                let t = self
                    .emit_from(&h, 0, PayloadSrc::None, mem, buf, mode)
                    .ok()?;
                // Counted as sent, not as queued: a queued NAK may be coalesced away.
                match syn {
                    NAK_SEQ => self.counters.seq_naks_sent += 1,
                    Syndrome::RnrNak { .. } => self.counters.rnr_naks_sent += 1,
                    _ => {}
                }
                Some(t)
            }
            RespItem::Read { res, psn: p, .. } => {
                let mtu = u64::from(self.attr.path_mtu);
                let k = psn::diff(p, res.first_psn).max(0) as u64;
                let off = k * mtu;
                let n = (res.len.saturating_sub(off)).min(mtu) as usize;
                let first = p == res.first_psn;
                let last = p == res.last_psn;
                let opcode = match (first, last) {
                    (true, true) => Opcode::RdmaReadResponseOnly,
                    (true, false) => Opcode::RdmaReadResponseFirst,
                    (false, true) => Opcode::RdmaReadResponseLast,
                    (false, false) => Opcode::RdmaReadResponseMiddle,
                };
                let mut h = Hdr::new(opcode, dest_qp, p);
                if opcode != Opcode::RdmaReadResponseMiddle {
                    h.aeth = Some(AethRepr { syndrome: ACK, msn });
                }
                let src = PayloadSrc::Region {
                    key: res.src,
                    va: res.va + off,
                };
                let t = match self.emit_from(&h, n, src, mem, buf, mode) {
                    Ok(t) => t,
                    Err(EmitError::Buffer) => return None,
                    Err(EmitError::Memory(_)) => {
                        // The region went away or lost its rights since the request.
                        self.resp.out.pop_front();
                        self.resp.push_ack(NAK_REM_ACCESS, p);
                        self.enter_error();
                        return self.next_response(mem, buf, mode);
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

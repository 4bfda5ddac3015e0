//! The RC queue pair as a sans-IO state machine. Inputs: `post_send`, `post_recv`,
//! `modify`, `handle_packet` (with the time it arrived), `handle_timeout` (with the time).
//! Outputs: `poll_transmit` (packets), `poll_completion`, `next_deadline`. No sockets and no
//! clock inside: time is nanoseconds on whatever clock the caller runs (a simulator's or the
//! OS's).
//!
//! Packets handed in and out are RoCEv2 UDP payloads (BTH .. payload, pad, ICRC). The
//! ICRC covers the IP/UDP headers, so it belongs to whoever knows them: the engine leaves
//! the field zero on output and does not check it on input (`crate::wire::icrc` does).

use std::collections::VecDeque;
use std::fmt;

use super::attr::{QpAttr, check_modify};
use super::counters::Counters;
use super::emit::{TxMode, TxParts};
use super::memory::{Memory, sge_total};
use super::packet::{self, Hdr, Opcode};
use super::requester::Requester;
use super::responder::Responder;
use super::verbs::{QpState, WcOpcode, WcStatus, attr_mask};
use super::wr::{Completion, RecvWr, SendWr};
use crate::error::{ErrorKind, Result};
use crate::wire::ICRC_LEN;

/// Sizes fixed at QP creation (`ibv_qp_init_attr.cap` and friends).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    /// Signal every send WR regardless of IBV_SEND_SIGNALED (`sq_sig_all`).
    pub sq_sig_all: bool,
    /// Most request PSNs in flight without an ACK (rxe uses 128).
    pub max_unacked_psns: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 4,
            sq_sig_all: false,
            max_unacked_psns: 128,
        }
    }
}

/// Largest packet `poll_transmit` writes for a path MTU: headers (at most 32 bytes for RC
/// without atomics) + payload + pad + ICRC.
pub fn max_packet_len(path_mtu: u32) -> usize {
    path_mtu as usize + 32 + 3 + ICRC_LEN
}

/// Packets a message of `len` bytes takes at path MTU `mtu` (at least one: a zero-length
/// message is one packet). `mtu` is a power of two (`modify` admits 256..4096 only), so
/// this shifts instead of dividing: it runs several times per operation.
#[inline]
pub(super) fn packets_for(len: u64, mtu: u32) -> u32 {
    debug_assert!(mtu.is_power_of_two());
    (len.saturating_add(u64::from(mtu) - 1) >> mtu.trailing_zeros()).max(1) as u32
}

/// Whole packets in `bytes` at path MTU `mtu` (a power of two, as for `packets_for`).
#[inline]
pub(super) fn whole_packets(bytes: u64, mtu: u32) -> u32 {
    debug_assert!(mtu.is_power_of_two());
    (bytes >> mtu.trailing_zeros()) as u32
}

/// The queue a post was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PostQueue {
    Send,
    Recv,
}

impl PostQueue {
    /// The verb that posts to it ("post_send", "post_recv").
    pub fn verb(self) -> &'static str {
        match self {
            PostQueue::Send => "post_send",
            PostQueue::Recv => "post_recv",
        }
    }

    fn name(self) -> &'static str {
        match self {
            PostQueue::Send => "send queue",
            PostQueue::Recv => "receive queue",
        }
    }

    /// The configuration key of its depth.
    pub fn wr_key(self) -> &'static str {
        match self {
            PostQueue::Send => "max_send_wr",
            PostQueue::Recv => "max_recv_wr",
        }
    }

    /// The configuration key of its SGE limit.
    pub fn sge_key(self) -> &'static str {
        match self {
            PostQueue::Send => "max_send_sge",
            PostQueue::Recv => "max_recv_sge",
        }
    }
}

/// Why `Qp::post_send`/`post_recv` refused a WR. Plain data (no allocation): the message
/// is made by `Display` (or `crate::Error`'s, after `into()`) only when someone needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostError {
    /// `outstanding` WRs fill the queue (`limit` = its depth); in ERR, flushed completions
    /// not yet polled hold the slots. Retry after polling. Kind `Full`.
    QueueFull {
        queue: PostQueue,
        outstanding: usize,
        limit: u32,
    },
    /// The WR has `n` SGEs, more than the QP's `limit`. Kind `InvalidArgument`.
    TooManySges {
        queue: PostQueue,
        n: usize,
        limit: u32,
    },
    /// The QP's state does not take posts to this queue (send: RTS or ERR; receive: INIT,
    /// RTR, RTS or ERR). Kind `InvalidArgument`.
    WrongState {
        queue: PostQueue,
        qpn: u32,
        state: QpState,
    },
    /// A send of `len` bytes, more than a message may carry (2^31). Kind
    /// `InvalidArgument`.
    MessageTooLong { len: u64 },
    /// The QP is in ERR, where a post completes at once (flushed), and the completion
    /// queue it would go to holds `capacity` completions not yet polled: refused rather
    /// than overrunning it. Kind `Full`.
    FlushCqFull {
        queue: PostQueue,
        qpn: u32,
        capacity: usize,
    },
}

impl PostError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            PostError::QueueFull { .. } | PostError::FlushCqFull { .. } => ErrorKind::Full,
            _ => ErrorKind::InvalidArgument,
        }
    }

    /// The message, formatted (allocates: prefer `Display` where that matters).
    pub fn message(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PostError::QueueFull {
                queue, outstanding, ..
            } => write!(
                f,
                "{}: {} full ({outstanding} WRs outstanding = {})",
                queue.verb(),
                queue.name(),
                queue.wr_key()
            ),
            PostError::TooManySges { queue, n, limit } => write!(
                f,
                "{}: {n} SGEs exceed {} {limit}",
                queue.verb(),
                queue.sge_key()
            ),
            PostError::WrongState {
                queue: PostQueue::Send,
                qpn,
                state,
            } => write!(f, "post_send: QP {qpn:#x} is in {state:?}, needs RTS"),
            PostError::WrongState {
                queue: PostQueue::Recv,
                qpn,
                state,
            } => write!(f, "post_recv: QP {qpn:#x} is in {state:?}"),
            PostError::MessageTooLong { len } => {
                write!(f, "post_send: message of {len} bytes exceeds 2^31")
            }
            PostError::FlushCqFull {
                queue,
                qpn,
                capacity,
            } => write!(
                f,
                "{}: QP {qpn:#x} is in error and its completion queue is full ({capacity} flushed completions): poll them first",
                queue.verb()
            ),
        }
    }
}

impl std::error::Error for PostError {}

/// Largest message a send WR may carry (as `Requester::push` checks).
const MAX_MSG_LEN: u64 = 1 << 31;

/// Refuses a post when the queue (`len` WRs of at most `max_wr`) is full or the WR has
/// more SGEs than `max_sge`. Runs on every post; the refusal is plain data.
#[inline]
fn check_room(
    queue: PostQueue,
    len: usize,
    max_wr: u32,
    sges: usize,
    max_sge: u32,
) -> std::result::Result<(), PostError> {
    if len >= max_wr as usize {
        return Err(PostError::QueueFull {
            queue,
            outstanding: len,
            limit: max_wr,
        });
    }
    if sges > max_sge as usize {
        return Err(PostError::TooManySges {
            queue,
            n: sges,
            limit: max_sge,
        });
    }
    Ok(())
}

/// One RC queue pair.
#[derive(Debug)]
pub struct Qp {
    pub(super) qpn: u32,
    pub(super) caps: QpCaps,
    pub(super) state: QpState,
    pub(super) attr: QpAttr,
    pub(super) req: Requester,
    pub(super) resp: Responder,
    pub(super) completions: VecDeque<Completion>,
    pub(super) counters: Counters,
    pub(super) failure: Option<super::Failure>,
}

impl Qp {
    /// A QP in RESET.
    pub fn new(qpn: u32, caps: QpCaps) -> Qp {
        Qp {
            qpn: qpn & 0x00FF_FFFF,
            caps,
            state: QpState::Reset,
            attr: QpAttr::default(),
            req: Requester::default(),
            resp: Responder::default(),
            completions: VecDeque::new(),
            counters: Counters::default(),
            failure: None,
        }
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    pub fn state(&self) -> QpState {
        self.state
    }

    pub fn attr(&self) -> &QpAttr {
        &self.attr
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Why the requester gave up, if it ended the QP with RETRY_EXC_ERR or
    /// RNR_RETRY_EXC_ERR (cleared by a reset).
    pub fn failure(&self) -> Option<&super::Failure> {
        self.failure.as_ref()
    }

    /// Counts a packet for this QP whose ICRC did not match (the caller checks ICRCs).
    pub fn record_icrc_error(&mut self) {
        self.counters.icrc_errors += 1;
    }

    /// `ibv_modify_qp`: applies the attributes named by `mask` (verbs `attr_mask` bits) if
    /// the transition and every attribute are valid; otherwise changes nothing and names
    /// the offending field.
    pub fn modify(&mut self, attr: &QpAttr, mask: u32) -> Result<()> {
        let target = check_modify(self.state, attr, mask)?;
        let m = |b: u32| mask & b != 0;
        let a = &mut self.attr;
        if m(attr_mask::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if m(attr_mask::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if m(attr_mask::PORT) {
            a.port_num = attr.port_num;
        }
        if m(attr_mask::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if m(attr_mask::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num;
        }
        if m(attr_mask::RQ_PSN) {
            a.rq_psn = attr.rq_psn;
            self.resp.reset_psn(attr.rq_psn);
        }
        if m(attr_mask::SQ_PSN) {
            a.sq_psn = attr.sq_psn;
            self.req.reset_psn(attr.sq_psn);
        }
        if m(attr_mask::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if m(attr_mask::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer;
        }
        if m(attr_mask::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if m(attr_mask::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if m(attr_mask::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt;
            self.req.retry_left = attr.retry_cnt;
        }
        if m(attr_mask::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry;
            self.req.rnr_left = attr.rnr_retry;
        }
        let from = self.state;
        self.state = target;
        a.qp_state = target;
        match target {
            QpState::Err if from != QpState::Err => self.flush_all(false),
            QpState::Reset => {
                // A reset QP forgets its queues (verbs: WRs are discarded, no completions).
                self.req = Requester::default();
                self.resp = Responder::default();
                self.completions.clear();
                self.failure = None;
            }
            _ => {}
        }
        Ok(())
    }

    /// `ibv_post_send` for one WR (post a chain by calling this per WR; a failure stops
    /// the chain there, as `bad_wr` does). In ERR the WR completes at once with
    /// WR_FLUSH_ERR (§4.8), but still takes a send queue slot until that completion is
    /// polled (as a NIC's does): with `max_send_wr` send completions waiting, the post is
    /// refused (Full), so completions in ERR stay bounded by the queue sizes.
    pub fn post_send(&mut self, wr: SendWr) -> std::result::Result<(), PostError> {
        match self.state {
            QpState::Rts => {}
            QpState::Err => {
                check_room(
                    PostQueue::Send,
                    self.completions_waiting(false),
                    self.caps.max_send_wr,
                    wr.sges.len(),
                    self.caps.max_send_sge,
                )?;
                self.push_completion(wr.wr_id, WcStatus::WrFlushErr, wr.opcode.wc_opcode(), false);
                return Ok(());
            }
            state => {
                return Err(PostError::WrongState {
                    queue: PostQueue::Send,
                    qpn: self.qpn,
                    state,
                });
            }
        }
        check_room(
            PostQueue::Send,
            self.req.sq.len(),
            self.caps.max_send_wr,
            wr.sges.len(),
            self.caps.max_send_sge,
        )?;
        let len = sge_total(&wr.sges);
        if len > MAX_MSG_LEN {
            return Err(PostError::MessageTooLong { len });
        }
        self.req
            .push(wr, self.attr.path_mtu)
            .map_err(|_| PostError::MessageTooLong { len })
    }

    /// `ibv_post_recv` for one WR. In ERR the WR completes at once with WR_FLUSH_ERR,
    /// bounded as `post_send`'s: refused (Full) with `max_recv_wr` receive completions
    /// waiting to be polled.
    pub fn post_recv(&mut self, wr: RecvWr) -> std::result::Result<(), PostError> {
        match self.state {
            QpState::Init | QpState::Rtr | QpState::Rts => {}
            QpState::Err => {
                check_room(
                    PostQueue::Recv,
                    self.completions_waiting(true),
                    self.caps.max_recv_wr,
                    wr.sges.len(),
                    self.caps.max_recv_sge,
                )?;
                self.push_completion(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, true);
                return Ok(());
            }
            state @ QpState::Reset => {
                return Err(PostError::WrongState {
                    queue: PostQueue::Recv,
                    qpn: self.qpn,
                    state,
                });
            }
        }
        check_room(
            PostQueue::Recv,
            self.resp.rq.len(),
            self.caps.max_recv_wr,
            wr.sges.len(),
            self.caps.max_recv_sge,
        )?;
        self.resp.rq.push_back(wr);
        Ok(())
    }

    /// Feeds one received packet (BTH .. ICRC; the caller has checked the ICRC).
    pub fn handle_packet(&mut self, now: u64, bytes: &[u8], mem: &mut dyn Memory) {
        match packet::parse(bytes) {
            Ok((hdr, payload)) => self.handle_hdr(now, &hdr, payload, bytes.len(), mem),
            Err(_) => self.counters.malformed += 1,
        }
    }

    /// Feeds one received packet given in the parts `poll_transmit_vectored` produced:
    /// `head` = BTH and extension headers, `payload` without pad (pad and ICRC, already
    /// checked by the caller, are not passed).
    pub fn handle_packet_vectored(
        &mut self,
        now: u64,
        head: &[u8],
        payload: &[u8],
        mem: &mut dyn Memory,
    ) {
        match packet::parse_head(head, payload) {
            Ok(hdr) => {
                let len =
                    head.len() + payload.len() + crate::wire::pad_len(payload.len()) + ICRC_LEN;
                self.handle_hdr(now, &hdr, payload, len, mem)
            }
            Err(_) => self.counters.malformed += 1,
        }
    }

    fn handle_hdr(
        &mut self,
        now: u64,
        hdr: &Hdr,
        payload: &[u8],
        len: usize,
        mem: &mut dyn Memory,
    ) {
        if hdr.dest_qp != self.qpn {
            self.counters.malformed += 1;
            return;
        }
        self.counters.rx_packets += 1;
        self.counters.rx_bytes += len as u64;
        let is_response =
            (Opcode::RdmaReadResponseFirst..=Opcode::AtomicAcknowledge).contains(&hdr.opcode);
        match (is_response, self.state) {
            (true, QpState::Rts) => self.on_response(now, hdr, payload, mem),
            (false, QpState::Rtr | QpState::Rts) => self.on_request(hdr, payload, mem),
            _ => {} // dropped: not a state that takes this packet (§5.1)
        }
    }

    /// Runs timers that are due at `now` (call at or after `next_deadline`).
    pub fn handle_timeout(&mut self, now: u64) {
        self.on_timers(now);
    }

    /// The next time `handle_timeout` must be called, if any timer is armed.
    pub fn next_deadline(&self) -> Option<u64> {
        match (self.req.ack_deadline, self.req.rnr_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Writes the next packet to send into `buf` (at least `max_packet_len(path_mtu)`
    /// bytes) and returns its length, or None if nothing is ready. Responses (ACKs, NAKs,
    /// READ responses) go before new requests.
    pub fn poll_transmit(&mut self, now: u64, mem: &dyn Memory, buf: &mut [u8]) -> Option<usize> {
        self.transmit(now, mem, buf, TxMode::Copy)
            .map(|t| t.head_len)
    }

    /// As `poll_transmit`, but a payload that lies contiguously in memory that can lend it
    /// (`Memory::slice`) is borrowed instead of copied: the packet is `buf[..head_len]`,
    /// `payload`, then `tail_len` zero bytes. A driver sends the three parts as one datagram
    /// (an iovec), so the payload is copied once, by the link, not twice. `buf[..head_len]`
    /// holds only headers when `payload` is not empty: the parts can be handed to a
    /// receiver's `handle_packet_vectored`.
    pub fn poll_transmit_vectored<'m>(
        &mut self,
        now: u64,
        mem: &'m dyn Memory,
        buf: &mut [u8],
    ) -> Option<TxParts<'m>> {
        self.transmit(now, mem, buf, TxMode::Lend)
    }

    /// As `poll_transmit_vectored`, and a payload spanning SGEs is copied only up to its
    /// last SGE's piece, which is lent: `buf[..head_len]` is the headers then the copied
    /// bytes. For a sender that gathers the parts into one datagram (the soft provider's
    /// `sendmmsg`): a messenger SEND (header SGE, then a 4 KiB data SGE) no longer copies
    /// its first packet whole.
    pub fn poll_transmit_gather<'m>(
        &mut self,
        now: u64,
        mem: &'m dyn Memory,
        buf: &mut [u8],
    ) -> Option<TxParts<'m>> {
        self.transmit(now, mem, buf, TxMode::Gather)
    }

    fn transmit<'m>(
        &mut self,
        now: u64,
        mem: &'m dyn Memory,
        buf: &mut [u8],
        mode: TxMode,
    ) -> Option<TxParts<'m>> {
        // Responses first (a NAK or READ response answers the peer's requests), except
        // positive ACKs: requests leave before them. A driver that held ACKs back for the
        // application's answer (`only_acks_to_send`) sends them in one batch with it, and
        // a peer that polls for the ACK then finds the answer (an RDMA WRITE it spins on,
        // say) already received when its poll returns the completion. The two flows of a
        // QP have no order between them; a coalesced ACK covers everything before its PSN.
        let t = if self.resp.only_acks_queued() {
            match self.next_request(now, mem, buf, mode) {
                Some(t) => t,
                None => self.next_response(mem, buf, mode)?,
            }
        } else {
            match self.next_response(mem, buf, mode) {
                Some(t) => t,
                None => self.next_request(now, mem, buf, mode)?,
            }
        };
        self.counters.tx_packets += 1;
        self.counters.tx_bytes += t.len() as u64;
        Some(t)
    }

    /// The next completion, in the order the work requests finished (send completions in
    /// send-WR order, receive completions in receive-WR order).
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// Whether anything is waiting to be sent (so a driver knows to call `poll_transmit`).
    pub fn wants_transmit(&self) -> bool {
        !self.resp.out.is_empty() || self.req.has_sendable()
    }

    /// Whether all there is to send is positive ACKs: no request, NAK or READ response. A
    /// driver may then hold them back briefly, to send them with the request the
    /// application is about to post (its answer to what was just received), as a NIC
    /// coalesces ACKs; an ACK for PSN p acknowledges everything before it (§3.4), so one
    /// held back is merged with the next.
    pub fn only_acks_to_send(&self) -> bool {
        !self.req.has_sendable() && self.resp.only_acks_queued()
    }

    /// Completions waiting to be polled, receive ones or send ones (run only in ERR).
    #[cold]
    fn completions_waiting(&self, is_recv: bool) -> usize {
        self.completions
            .iter()
            .filter(|c| c.is_recv == is_recv)
            .count()
    }

    pub(super) fn push_completion(
        &mut self,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        is_recv: bool,
    ) {
        self.completions.push_back(Completion {
            wr_id,
            status,
            opcode,
            byte_len: 0,
            imm: None,
            qp_num: self.qpn,
            is_recv,
            solicited: false,
        });
    }

    /// Moves to ERR and flushes every outstanding send and receive WR (§4.8). Queued READ
    /// responses are dropped: the QP failed on its own side (retries exhausted, a local
    /// error, a modify), and the peer may be gone (a response that cannot leave would hold
    /// its memory window until it does).
    pub(super) fn enter_error(&mut self) {
        self.enter_error_with(false);
    }

    /// As [`Qp::enter_error`], for the responder refusing a request (an error NAK, or a
    /// SEND_WITH_INVALIDATE whose invalidation failed): the READ responses queued before
    /// that answer still go out, since those READs came first and were executed in order
    /// (rxe answers a READ in full before it looks at the next request; the answer without
    /// them would fail READs the peer was entitled to). The peer is there: it just sent.
    pub(super) fn enter_error_answering(&mut self) {
        self.enter_error_with(true);
    }

    fn enter_error_with(&mut self, answer_reads: bool) {
        if self.state != QpState::Err {
            self.state = QpState::Err;
            self.attr.qp_state = QpState::Err;
            self.flush_all(answer_reads);
        }
    }

    fn flush_all(&mut self, answer_reads: bool) {
        self.req.ack_deadline = None;
        self.req.rnr_until = None;
        let sq: Vec<_> = self.req.sq.drain(..).collect();
        for w in sq {
            let status = w.error.unwrap_or(WcStatus::WrFlushErr);
            self.push_completion(w.wr.wr_id, status, w.wr.opcode.wc_opcode(), false);
        }
        self.req.send_idx = 0;
        self.req.send_off = 0;
        let mut rq: Vec<RecvWr> = self.resp.take_current_recv().into_iter().collect();
        rq.extend(self.resp.rq.drain(..));
        for w in rq {
            self.push_completion(w.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, true);
        }
        // Queued acknowledgements still go out (a NAK: the peer must learn why); READ
        // responses only with `answer_reads`, and only those queued before the last
        // acknowledgement (see `enter_error_answering`).
        let upto = if answer_reads {
            self.resp
                .out
                .iter()
                .rposition(|i| i.is_ack())
                .map_or(0, |k| k + 1)
        } else {
            0
        };
        let mut at = 0;
        self.resp.out.retain(|i| {
            at += 1;
            at <= upto || i.is_ack()
        });
    }
}

//! One live connection of a session: its posted receives (`[header slot][data chunk]`),
//! its send queue (SENDs with their header slots and descriptor blocks, READs of
//! rendezvous segments), the peer's grants, and the rendezvous receptions in progress.
//! Its credits and liveness are the session machine's (`machine::LinkState`): the link
//! posts what the machine decided (headers with their credits) and reports what came. Dropping a link closes the connection first (the QP is destroyed, so nothing
//! writes our memory any more), then returns every chunk it held.

use crate::error::{Error, ErrorKind, Result};
use crate::mem::pool::{Chunk, Pool};
use crate::msgr::Connection;
use crate::provider::types::{SendReq, Wc};
use crate::rc::verbs::send_flags;
use crate::rc::{Sge, SgeList, WcOpcode, WcStatus, WrOpcode};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::Arc;

use super::buffers::TxSeg;
use super::scope::Scope;
use super::wire::{self, Grant, HDR_LEN, Header, Malformed, Part, SLOT, SegDesc};

/// One posted receive.
pub struct RecvSlot {
    pub hdr: Chunk,
    pub data: Chunk,
    /// The window the data chunk is granted to the peer through (0: none; `scope.rs`).
    pub window: u32,
}

enum SqWork {
    Send {
        slot: Chunk,
        block: Option<Chunk>,
    },
    Read {
        seq: u64,
    },
    /// An RDMA WRITE before a message (its source memory is held by the message).
    Write,
}

/// A prepared RDMA WRITE into the peer's memory ([`super::OutMessage::writes`]).
pub struct TxWrite {
    pub seg: TxSeg,
    pub addr: u64,
    pub rkey: u32,
}

impl TxWrite {
    /// Work requests it takes with `max_sge` SGEs each (0 for an empty write).
    pub fn wrs(&self, max_sge: usize) -> usize {
        self.seg.parts.len().div_ceil(max_sge.max(1))
    }
}

/// A WR not yet posted and the send-queue entry that tracks it.
type Queued = (SendReq, SqEntry);

struct SqEntry {
    cookie: u64,
    work: SqWork,
}

/// A message as it came off the wire.
pub struct Received {
    pub h: Header,
    /// The inline front (eager messages).
    pub front: Vec<u8>,
    /// The payload chunk when the message carried a payload (eager data or a descriptor
    /// block); the link keeps the chunk otherwise.
    pub data: Option<Chunk>,
}

/// What a poll found.
pub enum LinkEvent {
    Recv(Received),
    /// An immediate message (RDMA WRITE WITH IMMEDIATE) and its value.
    Imm(u32),
    ReadDone,
}

/// A rendezvous segment being READ.
pub struct RxBuild {
    pub desc: SegDesc,
    pub chunks: SmallVec<[Chunk; 1]>,
    /// The next byte of the segment to READ (all posted at `desc.len`).
    pub next: usize,
}

/// A message being received (waiting for its READs, or for an earlier one).
pub struct RxEntry {
    pub seq: u64,
    pub msg_type: u16,
    pub front: Vec<u8>,
    /// Eager data (a payload chunk and its length) or rendezvous segments.
    pub eager: Option<(Chunk, usize)>,
    pub segs: Vec<RxBuild>,
    pub reads_in_flight: u32,
}

impl RxEntry {
    pub fn complete(&self) -> bool {
        self.reads_in_flight == 0 && self.segs.iter().all(|s| s.next >= s.desc.len as usize)
    }
}

/// The data of a SEND.
pub enum Body<'a> {
    None,
    /// Eager data: parts with their lkeys.
    Eager(&'a [Part], &'a [u32]),
    /// A descriptor block to copy into a payload chunk.
    Block(&'a [u8]),
}

pub struct Link {
    pub conn: Connection,
    data: Arc<Pool>,
    slots: Arc<Pool>,
    recvs: VecDeque<(u64, RecvSlot)>,
    spare_hdr: Vec<Chunk>,
    spare_data: Vec<Chunk>,
    sq: VecDeque<SqEntry>,
    /// Entries of `sq` that are READs (posted, not completed): at most [`Link::max_reads`].
    reads_queued: usize,
    next_cookie: u64,
    max_sq: usize,
    max_sge: usize,
    pub rx: VecDeque<RxEntry>,
    /// RNR NAKs of the connection already added to the session's counters.
    pub rnr_seen: u64,
    /// Send-queue completions polled and not yet counted by the session.
    pub send_wcs: u64,
    /// SENDs built by [`Link::queue`] and not yet handed to the connection: a pass posts
    /// them in one call ([`Link::flush`]), so the provider sends them in one batch.
    unposted: SmallVec<[SendReq; 8]>,
    /// Scratch lists of [`Link::writes_first`] (WRITEs, others), kept with their capacity:
    /// it runs for every batch of answers.
    reorder: (Vec<Queued>, Vec<Queued>),
    /// The data chunks of the receives the peer posted for us, in the order our SENDs will
    /// consume them (see `wire.rs`); None for a receive announced without a grant.
    grants: VecDeque<Option<Grant>>,
    /// SENDs queued on this link (the first, the hello, takes the one receive each side
    /// posts before the handshake, which has no grant).
    sends: u64,
    /// Eager data goes as an RDMA WRITE into the granted chunk, and our receives are
    /// granted (`msgr_eager_write`; set before the first send: the pool must take remote
    /// writes).
    pub eager_write: bool,
    /// Posts the QP took only part of (or none of, being full): the rest went on a later
    /// pass (added to the session's counters by the pass).
    pub partial_posts: u64,
    /// Posts still to cut short ([`super::Fault::PartialPosts`], tests).
    pub inject_partial: u32,
    /// Its CQs tell the shard when a completion lands in them (`park.rs`): the session
    /// may be parked while quiet. Not on verbs, where only a poll tells.
    pub parkable: bool,
    /// Windows for this link's peer (`msgr_scoped_rkeys`): what it may READ or WRITE.
    pub scope: Option<Scope>,
}

/// Send-queue entries kept for a control message (acknowledgement, credits, keepalive):
/// data messages and READs leave them free, so the SEND that acknowledges what the peer
/// sent (and returns its credits) always finds room. Without it a receiver whose READs
/// filled the send queue (a 16 MiB segment is 256 READs of 64 KiB, the whole default
/// queue; 1 MiB writes 32 deep are 512) could not queue its acknowledgement, and the
/// refusal ended the connection.
pub const CONTROL_RESERVE: usize = 1;

/// Most grants a link keeps: more than any receive window (`msgr_recv_window` <= 32,768),
/// so a peer that announces more is malformed, and the queue stays bounded.
const MAX_GRANTS: usize = 65_536;

impl Link {
    /// A link over `conn`, whose on-connect hook posted `slots`.
    pub fn new(
        conn: Connection,
        slots: Vec<RecvSlot>,
        data: Arc<Pool>,
        slot_pool: Arc<Pool>,
        max_sq: usize,
        max_sge: usize,
    ) -> Link {
        let scope = Scope::for_conn(&conn);
        Link {
            scope,
            conn,
            data,
            slots: slot_pool,
            recvs: slots
                .into_iter()
                .enumerate()
                .map(|(i, s)| (i as u64, s))
                .collect(),
            spare_hdr: Vec::new(),
            spare_data: Vec::new(),
            sq: VecDeque::new(),
            reads_queued: 0,
            next_cookie: 1 << 32,
            max_sq,
            max_sge: max_sge.max(2),
            rx: VecDeque::new(),
            rnr_seen: 0,
            send_wcs: 0,
            unposted: SmallVec::new(),
            reorder: (Vec::new(), Vec::new()),
            grants: VecDeque::new(),
            sends: 0,
            eager_write: false,
            parkable: false,
            partial_posts: 0,
            inject_partial: 0,
        }
    }

    /// Posts receives on a connection (the on-connect hook): `n` slots of `[header slot]
    /// [data chunk]`. Returns the slots taken (posted or not: they may be released only
    /// once the connection is gone) and the error, if not all could be posted.
    pub fn post_initial(
        conn: &Connection,
        n: u32,
        data: &Pool,
        slot_pool: &Pool,
    ) -> (Vec<RecvSlot>, Option<Error>) {
        let mut out = Vec::with_capacity(n as usize);
        let mut wrs = Vec::with_capacity(n as usize);
        for i in 0..n {
            let hdr = match slot_pool.get() {
                Ok(c) => c,
                Err(e) => return (out, Some(e)),
            };
            let d = match data.get() {
                Ok(c) => c,
                Err(e) => {
                    let _ = slot_pool.put(hdr);
                    return (out, Some(e));
                }
            };
            wrs.push((u64::from(i), recv_sges(&hdr, &d)));
            out.push(RecvSlot {
                hdr,
                data: d,
                window: 0,
            });
        }
        match conn.post_recv(&wrs) {
            Ok(k) if k == wrs.len() => (out, None),
            Ok(_) => (
                out,
                Some(Error::fixed(
                    ErrorKind::Full,
                    "messenger: the receive queue took fewer receives than the window (raise max_recv_wr)",
                )),
            ),
            Err(e) => (out, Some(e)),
        }
    }

    /// Nothing being received (READs, delivery), nothing unposted (see `Session::quiet`).
    pub fn is_quiet(&self) -> bool {
        self.rx.is_empty() && self.unposted.is_empty()
    }

    /// Free send-queue entries. The link counts an entry from its post until the
    /// completion that retires it is polled (an unsignaled WR: a later signaled one's), so
    /// the QP always has at least this much room: both the soft engine and a verbs QP free
    /// a WR's slot no later than that completion, and both take `max_send_wr` WRs of any
    /// size (a READ of many packets, or one waiting for `max_rd_atomic`, is one WR).
    pub fn sq_room(&self) -> usize {
        self.max_sq.saturating_sub(self.sq.len())
    }

    /// Send-queue entries a data message may take: the free ones but the control
    /// reserve ([`CONTROL_RESERVE`]).
    pub fn data_room(&self) -> usize {
        self.sq_room().saturating_sub(CONTROL_RESERVE)
    }

    /// READs the send queue may hold at once: half of it, so the answers the session
    /// sends meanwhile (a target's replies to the writes it is reading) find room too.
    /// More would not go faster: only `max_rd_atomic` of them are on the wire at a time.
    fn max_reads(&self) -> usize {
        (self.max_sq / 2).max(1)
    }

    /// READs that may be posted now.
    fn read_room(&self) -> usize {
        self.data_room()
            .min(self.max_reads().saturating_sub(self.reads_queued))
    }

    /// Posts up to `want` receives (pool permitting; the machine's
    /// `receives_wanted`). Returns how many were posted (none on an error).
    pub fn replenish(&mut self, want: u32) -> Result<u32> {
        if want == 0 {
            return Ok(0);
        }
        let mut wrs: SmallVec<[(u64, SgeList); 8]> = SmallVec::new();
        let mut slots = Vec::new();
        for _ in 0..want {
            let Some(hdr) = self.spare_hdr.pop().or_else(|| self.slots.get().ok()) else {
                break;
            };
            let Some(d) = self.spare_data.pop().or_else(|| self.data.get().ok()) else {
                self.spare_hdr.push(hdr);
                break;
            };
            let cookie = self.next_cookie;
            self.next_cookie += 1;
            wrs.push((cookie, recv_sges(&hdr, &d)));
            slots.push((
                cookie,
                RecvSlot {
                    hdr,
                    data: d,
                    window: 0,
                },
            ));
        }
        if wrs.is_empty() {
            return Ok(0);
        }
        let posted = self.conn.post_recv(&wrs);
        let n = *posted.as_ref().unwrap_or(&0);
        let mut slots = slots.into_iter();
        for s in slots.by_ref().take(n) {
            self.recvs.push_back(s);
        }
        for (_, s) in slots {
            self.spare_hdr.push(s.hdr);
            self.spare_data.push(s.data);
        }
        posted.map(|_| n as u32)
    }

    /// Sends a control frame now that announces no credits (the accepting side's refusal
    /// of a link: a hello without an identity): [`Link::queue`] then [`Link::flush`].
    pub fn send_bare(&mut self, h: &mut Header) -> Result<()> {
        h.credits = 0;
        self.queue(h, &[], Body::None, 0)?;
        self.flush()
    }

    /// Posts the SENDs queued since the last flush, in one call. An error is a fault (the
    /// caller drops the link, which returns their chunks).
    pub fn flush(&mut self) -> Result<()> {
        if self.unposted.is_empty() {
            return Ok(());
        }
        self.writes_first();
        // Only the batch's last WR asks for a completion: one completion returns every
        // entry before it (a send queue completes in order, and an error completes with its
        // error whatever the flag), so a batch costs one CQ entry, not one per message.
        let last = self.unposted.len() - 1;
        for (i, w) in self.unposted.iter_mut().enumerate() {
            if i == last {
                w.flags |= send_flags::SIGNALED;
            } else {
                w.flags &= !send_flags::SIGNALED;
            }
        }
        let n = post(&self.conn, &self.unposted, &mut self.inject_partial);
        let want = self.unposted.len();
        // Why it refused (say, the side channel closed and the QP went to ERR): a pass posts
        // before it polls, so this may be the first the session hears of the fault. A full
        // send queue is not a fault: what it did not take stays queued, in order, and the
        // next flush (every pass while anything is unposted: `is_quiet`) posts it.
        match n {
            Ok(k) if k == want => {
                self.unposted.clear();
                Ok(())
            }
            Ok(k) => {
                self.unposted.drain(..k);
                self.partial_posts += 1;
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::Full => {
                self.partial_posts += 1;
                Ok(())
            }
            Err(e) => {
                self.unposted.clear();
                Err(Error::new(
                    ErrorKind::Closed,
                    format!("messenger: the connection refused a send: {}", e.message()),
                ))
            }
        }
    }

    /// Moves the queued RDMA WRITEs ahead of the queued SENDs, each kind in its order (and
    /// the send-queue entries that track them alike: completions come in posting order).
    /// Every message's WRITEs still precede its SEND; a batch of 4 KiB answers (a WRITE of
    /// the data and a small SEND each, the block read path) then leaves as a run of equal
    /// WRITE packets and a run of equal SENDs, two GSO messages with the soft provider
    /// instead of one per answer.
    fn writes_first(&mut self) {
        let is_write = |w: &SendReq| w.opcode == WrOpcode::RdmaWrite;
        let k = self.unposted.len();
        // Already in that order (no WRITE, or none after a SEND): nothing to move.
        let first_other = self.unposted.iter().position(|w| !is_write(w));
        if first_other.is_none_or(|i| !self.unposted[i..].iter().any(is_write)) {
            return;
        }
        let Some(at) = self.sq.len().checked_sub(k) else {
            return; // not the entries of `unposted` (cannot happen): keep the order
        };
        // A stable partition through the scratch lists: the containers keep their
        // capacity, so a batch allocates nothing here.
        let (writes, others) = &mut self.reorder;
        for (w, e) in self.unposted.drain(..).zip(self.sq.drain(at..)) {
            if is_write(&w) {
                writes.push((w, e));
            } else {
                others.push((w, e));
            }
        }
        for (w, e) in writes.drain(..).chain(others.drain(..)) {
            self.unposted.push(w);
            self.sq.push_back(e);
        }
    }

    /// Builds one message's SEND and queues it for the next [`Link::flush`]: `h` carries
    /// the credits the session machine decided (`Action::Post`), granting the oldest
    /// `h.credits` of the newest `owed` receives; `front` goes inline after the header.
    /// The machine checked credits and send-queue room.
    pub fn queue(&mut self, h: &mut Header, front: &[u8], body: Body<'_>, owed: u32) -> Result<()> {
        self.queue_msg(h, front, body, &[], owed)
    }

    /// [`Link::queue`] with RDMA WRITEs queued before the SEND (same QP: they have landed
    /// when the peer sees the SEND; [`Link::flush`] posts a batch's WRITEs first). The caller checked room for them
    /// ([`TxWrite::wrs`] each, plus one for the SEND).
    pub fn queue_msg(
        &mut self,
        h: &mut Header,
        front: &[u8],
        body: Body<'_>,
        writes: &[TxWrite],
        owed: u32,
    ) -> Result<()> {
        let nw: usize = writes.iter().map(|w| w.wrs(self.max_sge)).sum();
        // Eager data goes into the chunk of the receive this SEND consumes when the peer
        // granted it (every SEND after the hello's).
        let write_data = self.eager_write
            && self.sends > 0
            && self.grants.front().is_some_and(Option::is_some)
            && matches!(body, Body::Eager(parts, _) if !parts.is_empty());
        if self.sq_room() < nw + 1 + usize::from(write_data) {
            return Err(Error::fixed(ErrorKind::Full, "messenger: send queue full"));
        }
        let slot = self.spare_hdr.pop().map_or_else(|| self.slots.get(), Ok)?;
        let mut block_chunk = None;
        let mut data_write = None;
        let mut sges: SgeList = SgeList::new();
        sges.push(Sge {
            addr: slot.addr_u64(),
            length: SLOT as u32,
            lkey: slot.lkey,
        });
        match body {
            Body::None => h.payload_len = 0,
            Body::Eager(parts, lkeys) => {
                let mut n = 0;
                let mut data = SgeList::new();
                for (p, &lkey) in parts.iter().zip(lkeys) {
                    data.push(Sge {
                        addr: p.addr,
                        length: p.len,
                        lkey,
                    });
                    n += p.len;
                }
                h.payload_len = n;
                if write_data {
                    data_write = Some(data);
                } else {
                    sges.extend(data);
                }
            }
            Body::Block(bytes) => {
                let c = match self.spare_data.pop().map_or_else(|| self.data.get(), Ok) {
                    Ok(c) => c,
                    Err(e) => {
                        self.spare_hdr.push(slot);
                        return Err(e);
                    }
                };
                let n = bytes.len().min(c.len);
                // SAFETY: the chunk is ours (from the pool or our spares, not posted).
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), c.addr, n) };
                sges.push(Sge {
                    addr: c.addr_u64(),
                    length: n as u32,
                    lkey: c.lkey,
                });
                h.payload_len = n as u32;
                block_chunk = Some(c);
            }
        }
        self.queue_writes(writes);
        // The receive this SEND consumes: the hello's has no grant.
        let grant = if self.sends > 0 {
            self.grants.pop_front().flatten()
        } else {
            None
        };
        self.sends += 1;
        if let (Some(data), Some(g)) = (data_write, grant) {
            self.queue_write(data, g.addr, g.rkey);
            h.flags |= wire::flags::WRITTEN;
        }
        // Grant the receives posted since the last announcement, oldest first: as many as
        // the machine announced (`machine::rules::announce`: the slot's room after the
        // front, with `eager_write`).
        let at = h.grants_at();
        let first = self.recvs.len().saturating_sub(owed as usize);
        debug_assert!(
            h.credits as usize <= self.recvs.len() - first,
            "announced more than owed"
        );
        // Scoped rkeys: each granted chunk through a window bound for this peer. Out of
        // windows (the device's table is full), these credits go without grants: the peer
        // then sends their eager data in the SEND.
        if let Some(sc) = &self.scope {
            let bound = self
                .recvs
                .range_mut(first..)
                .take(h.granted())
                .try_for_each(|(_, r)| {
                    if r.window == 0 {
                        r.window = sc.grant(&r.data)?;
                    }
                    Ok::<(), Error>(())
                });
            if let Err(e) = bound {
                log::debug!(target: "rdmx::msgr", "messenger: credits without grants: {e}");
                h.flags &= !wire::flags::GRANTS;
            }
        }
        // SAFETY: the slot is ours (from the pool or our spares, not posted); SLOT bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(slot.addr, SLOT) };
        h.emit(out);
        let n = front.len().min(SLOT - HDR_LEN);
        out[HDR_LEN..HDR_LEN + n].copy_from_slice(&front[..n]);
        let granted = self.recvs.range(first..).take(h.granted());
        wire::emit_grants(
            out,
            at,
            granted.map(|(_, r)| Grant {
                addr: r.data.addr_u64(),
                rkey: if r.window != 0 { r.window } else { r.data.rkey },
            }),
        );
        if h.payload_len == 0 || h.has(wire::flags::WRITTEN) {
            // No payload in the SEND: the header, front and grants only (wire version 2+).
            sges[0].length = h.grants_end().min(SLOT) as u32;
        }
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let wr = SendReq {
            cookie,
            opcode: WrOpcode::Send,
            flags: send_flags::SIGNALED,
            sges,
            remote_addr: 0,
            rkey: 0,
            imm: 0,
        };
        self.unposted.push(wr);
        self.sq.push_back(SqEntry {
            cookie,
            work: SqWork::Send {
                slot,
                block: block_chunk,
            },
        });
        Ok(())
    }

    /// Queues an immediate message ([`super::OutMessage::immediate`]): `writes`, the last
    /// work request an RDMA WRITE WITH IMMEDIATE carrying `value`. It consumes one of the
    /// peer's receives like a SEND (a credit and that receive's grant, unused), and carries
    /// no header: no acknowledgement or credit rides on it. The caller checked credits and
    /// send-queue room ([`TxWrite::wrs`] each); `writes` is not empty (`send` checks).
    pub fn queue_imm(&mut self, writes: &[TxWrite], value: u32) -> Result<()> {
        let nw: usize = writes.iter().map(|w| w.wrs(self.max_sge)).sum();
        if nw == 0 || self.sq_room() < nw {
            return Err(Error::fixed(ErrorKind::Full, "messenger: send queue full"));
        }
        self.queue_writes(writes);
        if let Some(w) = self.unposted.last_mut() {
            w.opcode = WrOpcode::RdmaWriteWithImm;
            w.imm = value;
        }
        // The receive it consumes (never the hello's: an immediate follows the hello).
        self.grants.pop_front();
        self.sends += 1;
        Ok(())
    }

    /// Queues `writes` (one WR per `max_sge` parts).
    fn queue_writes(&mut self, writes: &[TxWrite]) {
        for w in writes {
            let mut off = 0u64;
            let parts = w.seg.parts.iter().zip(&w.seg.lkeys);
            let parts: SmallVec<[(&Part, &u32); 4]> = parts.collect();
            for group in parts.chunks(self.max_sge) {
                let mut sges = SgeList::new();
                let mut n = 0u64;
                for &(p, &lkey) in group {
                    sges.push(Sge {
                        addr: p.addr,
                        length: p.len,
                        lkey,
                    });
                    n += u64::from(p.len);
                }
                self.queue_write(sges, w.addr.wrapping_add(off), w.rkey);
                off += n;
            }
        }
    }

    /// Queues an RDMA WRITE for the next [`Link::flush`], unsignaled: the batch's last work
    /// request, posted after it and signaled, completes it (see `flush` and `complete`).
    fn queue_write(&mut self, sges: SgeList, remote_addr: u64, rkey: u32) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        self.unposted.push(SendReq {
            cookie,
            opcode: WrOpcode::RdmaWrite,
            flags: 0,
            sges,
            remote_addr,
            rkey,
            imm: 0,
        });
        self.sq.push_back(SqEntry {
            cookie,
            work: SqWork::Write,
        });
    }

    /// Posts READs for entry `idx` (rendezvous) while the send queue has room for them
    /// ([`Link::read_room`]). The chunks of all the message's segments are taken from the
    /// pool at once, or none: a message holding part of what it needs while other messages
    /// (of this or other sessions) hold the rest would wait for ever on the shared pool.
    /// Returns Ok(false) when it has to wait (pool, queue, or a post the QP took only part
    /// of: the rest goes on a later pass).
    pub fn post_reads(&mut self, idx: usize) -> Result<bool> {
        // The send queue completes in posting order: queued SENDs go first.
        self.flush()?;
        if !self.unposted.is_empty() {
            return Ok(false); // the QP did not take them all: READs go after them
        }
        let max_sge = self.max_sge;
        let room = self.read_room();
        let chunk_size = self.data.chunk_size();
        let Some(e) = self.rx.get_mut(idx) else {
            return Ok(true);
        };
        if !take_chunks(&self.data, e) {
            return Ok(false);
        }
        let seq = e.seq;
        let mut wrs: SmallVec<[SendReq; 8]> = SmallVec::new();
        // Where each WR starts (segment, byte): a WR the QP does not take is built again.
        let mut starts: SmallVec<[(usize, usize); 8]> = SmallVec::new();
        'segs: for (si, seg) in e.segs.iter_mut().enumerate() {
            let len = seg.desc.len as usize;
            while seg.next < len {
                if wrs.len() >= room {
                    break 'segs;
                }
                // The remote part holding byte `next`, and the offset in it.
                let (mut off, mut part) = (seg.next, None);
                for p in &seg.desc.parts {
                    if off < p.len as usize {
                        part = Some(*p);
                        break;
                    }
                    off -= p.len as usize;
                }
                let Some(p) = part else {
                    return Err(Malformed("rendezvous parts do not cover the segment").into());
                };
                // Local SGEs from `next` on, up to max_sge chunks, within the remote part.
                let mut sges = SgeList::new();
                let mut pos = seg.next;
                let end = seg.next + (p.len as usize - off);
                while pos < end && sges.len() < max_sge {
                    let ci = pos / chunk_size;
                    let co = pos % chunk_size;
                    let n = (chunk_size - co).min(end - pos);
                    let c = &seg.chunks[ci];
                    sges.push(Sge {
                        addr: c.addr_u64() + co as u64,
                        length: n as u32,
                        lkey: c.lkey,
                    });
                    pos += n;
                }
                let cookie = self.next_cookie;
                self.next_cookie += 1;
                wrs.push(SendReq {
                    cookie,
                    opcode: WrOpcode::RdmaRead,
                    flags: send_flags::SIGNALED,
                    sges,
                    remote_addr: p.addr + off as u64,
                    rkey: p.rkey,
                    imm: 0,
                });
                starts.push((si, seg.next));
                seg.next = pos;
            }
        }
        if wrs.is_empty() {
            return Ok(e.segs.iter().all(|s| s.next >= s.desc.len as usize));
        }
        let n = match post(&self.conn, &wrs, &mut self.inject_partial) {
            Ok(n) => n,
            Err(err) if err.kind() == ErrorKind::Full => 0,
            Err(err) => return Err(err),
        };
        if n < wrs.len() {
            // The QP took only the first `n`: the others are built again next time, from
            // the first one's start (each segment back to its earliest untaken byte).
            self.partial_posts += 1;
            for &(si, start) in starts[n..].iter().rev() {
                e.segs[si].next = start;
            }
        }
        e.reads_in_flight += n as u32;
        for w in &wrs[..n] {
            self.sq.push_back(SqEntry {
                cookie: w.cookie,
                work: SqWork::Read { seq },
            });
        }
        self.reads_queued += n;
        Ok(n == wrs.len() && e.segs.iter().all(|s| s.next >= s.desc.len as usize))
    }

    /// Takes up to `max` completions, of which at most `max_recv` receives (it asks the
    /// CQ for no more entries than receives may still come). An error completion, or one
    /// that does not match what was posted, is a fault (returned as the error).
    pub fn poll(&mut self, max: usize, max_recv: usize, out: &mut Vec<LinkEvent>) -> Result<usize> {
        let mut wcs = [empty_wc(); 32];
        let mut total = 0;
        let mut recvs = 0;
        while total < max && recvs < max_recv {
            let want = (max - total).min(max_recv - recvs).min(32);
            // The pass ran the device's progress once for all links (`Context::progress`).
            let n = self.conn.poll_cq(&mut wcs[..want]);
            if n == 0 {
                break;
            }
            // One allocation for the chunk rather than a growth per doubling.
            out.reserve(n);
            total += n;
            for wc in &wcs[..n] {
                if wc.opcode.is_recv() {
                    recvs += 1;
                }
                self.complete(wc, out)?;
            }
        }
        Ok(total)
    }

    fn complete(&mut self, wc: &Wc, out: &mut Vec<LinkEvent>) -> Result<()> {
        if wc.status != WcStatus::Success {
            let note = self.conn.failure_note().unwrap_or_default();
            return Err(Error::new(
                ErrorKind::Closed,
                format!("completion with status {:?} {note}", wc.status),
            ));
        }
        let mismatch = || Error::fixed(ErrorKind::Closed, "completion out of order");
        match wc.opcode {
            WcOpcode::RecvWithInv => {
                // The peer sent SEND_WITH_INV, which the protocol never does: it ended one
                // of this link's windows early. A protocol fault (the session replays on a
                // new link); the receive is consumed, and its slot (whose window is the
                // one ended, or another) goes through the scope like any other.
                if let Some((_, mut slot)) = self.recvs.pop_front() {
                    if let Some(sc) = &self.scope {
                        sc.end(std::mem::take(&mut slot.window));
                    }
                    self.spare_hdr.push(slot.hdr);
                    self.spare_data.push(slot.data);
                }
                return Err(Malformed(
                    "the peer sent SEND_WITH_INVALIDATE (not part of the protocol)",
                )
                .into());
            }
            WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => {
                let (cookie, mut slot) = self.recvs.pop_front().ok_or_else(mismatch)?;
                if cookie != wc.cookie {
                    self.recvs.push_front((cookie, slot));
                    return Err(mismatch());
                }
                // The receive is consumed: its grant ends before the chunk is used again.
                if let Some(sc) = &self.scope {
                    sc.end(std::mem::take(&mut slot.window));
                }
                if wc.opcode == WcOpcode::RecvRdmaWithImm {
                    // An immediate message: the receive's buffers were not touched.
                    self.spare_hdr.push(slot.hdr);
                    self.spare_data.push(slot.data);
                    let Some(v) = wc.imm else {
                        return Err(Malformed("RDMA WRITE WITH IMMEDIATE without its value").into());
                    };
                    out.push(LinkEvent::Imm(v));
                    self.trim_spares();
                    return Ok(());
                }
                // SAFETY: the receive completed: the slot is ours again and holds
                // `byte_len` bytes of which the first SLOT are the header slot.
                let bytes = unsafe { std::slice::from_raw_parts(slot.hdr.addr, SLOT) };
                let parsed = Header::parse(bytes, wc.byte_len as usize);
                let parsed = parsed.and_then(|h| {
                    if self.grants.len() + h.credits as usize > MAX_GRANTS {
                        return Err(Malformed("more credits than any receive window"));
                    }
                    Ok(h)
                });
                let h = match parsed {
                    Ok(h) => h,
                    Err(m) => {
                        self.spare_hdr.push(slot.hdr);
                        self.spare_data.push(slot.data);
                        return Err(m.into());
                    }
                };
                // The credits and the chunks behind them, in one place (a sender's WRITE
                // targets the grant its SEND's receive was announced with).
                if h.has(wire::flags::GRANTS) {
                    self.grants.extend(h.grants(bytes).map(Some));
                } else {
                    self.grants.extend((0..h.credits).map(|_| None));
                }
                let front = if h.has(wire::flags::RNDV) {
                    Vec::new()
                } else {
                    let n = h.front_len as usize;
                    bytes[HDR_LEN..HDR_LEN + n].to_vec()
                };
                self.spare_hdr.push(slot.hdr);
                let data = if h.payload_len > 0 || h.nsegs > 0 {
                    Some(slot.data)
                } else {
                    self.spare_data.push(slot.data);
                    None
                };
                out.push(LinkEvent::Recv(Received { h, front, data }));
            }
            _ => {
                self.send_wcs += 1;
                // WRITEs and all but a flush's last SEND are unsignaled: a later WR's
                // completion means they completed (a send queue completes in order; a
                // failed WR completes with its error, which faulted above). READs are
                // signaled, each completing before anything posted after it.
                while self.sq.front().is_some_and(|e| {
                    matches!(e.work, SqWork::Write | SqWork::Send { .. }) && e.cookie != wc.cookie
                }) {
                    if let Some(SqEntry {
                        work: SqWork::Send { slot, block },
                        ..
                    }) = self.sq.pop_front()
                    {
                        self.spare_hdr.push(slot);
                        if let Some(b) = block {
                            self.spare_data.push(b);
                        }
                    }
                }
                let e = self.sq.pop_front().ok_or_else(mismatch)?;
                if e.cookie != wc.cookie {
                    self.sq.push_front(e);
                    return Err(mismatch());
                }
                match e.work {
                    SqWork::Send { slot, block } => {
                        self.spare_hdr.push(slot);
                        if let Some(b) = block {
                            self.spare_data.push(b);
                        }
                    }
                    SqWork::Read { seq } => {
                        self.reads_queued = self.reads_queued.saturating_sub(1);
                        if let Some(r) = self.rx.iter_mut().find(|r| r.seq == seq) {
                            r.reads_in_flight = r.reads_in_flight.saturating_sub(1);
                        }
                        out.push(LinkEvent::ReadDone);
                    }
                    SqWork::Write => {}
                }
            }
        }
        self.trim_spares();
        Ok(())
    }

    /// Keeps spares small: an idle link holds only what it has posted.
    fn trim_spares(&mut self) {
        while self.spare_hdr.len() > 4 {
            if let Some(c) = self.spare_hdr.pop() {
                let _ = self.slots.put(c);
            }
        }
        while self.spare_data.len() > 4 {
            if let Some(c) = self.spare_data.pop() {
                let _ = self.data.put(c);
            }
        }
    }

    /// The messages being received are dropped (the traffic moved to another path: the
    /// peer sends them again there), their chunks returned. False, and nothing dropped,
    /// when a READ is in flight into one of them (its chunks are the device's until the
    /// QP is gone: the caller closes the link instead).
    pub fn discard_rx(&mut self) -> bool {
        if self.rx.iter().any(|e| e.reads_in_flight > 0) {
            return false;
        }
        for e in self.rx.drain(..) {
            if let Some((c, _)) = e.eager {
                let _ = self.data.put(c);
            }
            for s in e.segs {
                for c in s.chunks {
                    let _ = self.data.put(c);
                }
            }
        }
        true
    }

    /// Returns a payload chunk the session did not hand out.
    pub fn give_back(&mut self, c: Chunk) {
        self.spare_data.push(c);
    }

    /// The RNR NAKs of the connection not yet counted.
    pub fn take_rnr(&mut self) -> u64 {
        let c = self.conn.counters();
        let total = c.rnr_naks_sent + c.rnr_naks_received;
        let new = total.saturating_sub(self.rnr_seen);
        self.rnr_seen = total;
        new
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // The QP goes first: once it is destroyed nothing writes or reads our chunks.
        self.conn.close();
        for (_, s) in self.recvs.drain(..) {
            if let Some(sc) = &self.scope {
                sc.end(s.window);
            }
            let _ = self.slots.put(s.hdr);
            let _ = self.data.put(s.data);
        }
        for e in self.sq.drain(..) {
            if let SqWork::Send { slot, block } = e.work {
                let _ = self.slots.put(slot);
                if let Some(b) = block {
                    let _ = self.data.put(b);
                }
            }
        }
        for e in self.rx.drain(..) {
            if let Some((c, _)) = e.eager {
                let _ = self.data.put(c);
            }
            for s in e.segs {
                for c in s.chunks {
                    let _ = self.data.put(c);
                }
            }
        }
        for c in self.spare_hdr.drain(..) {
            let _ = self.slots.put(c);
        }
        for c in self.spare_data.drain(..) {
            let _ = self.data.put(c);
        }
    }
}

/// Takes the pool chunks entry `e`'s segments still lack, all of them or none (see
/// [`Link::post_reads`]). Whether the entry has them all now.
fn take_chunks(pool: &Pool, e: &mut RxEntry) -> bool {
    let size = pool.chunk_size();
    let need: usize = e
        .segs
        .iter()
        .map(|s| {
            (s.desc.len as usize)
                .div_ceil(size)
                .saturating_sub(s.chunks.len())
        })
        .sum();
    if need == 0 {
        return true;
    }
    // A look before taking: a message waiting for the pool costs one look per pass, not
    // thousands of chunks taken and given back.
    let st = pool.stats();
    if (st.chunks_cap - st.chunks_in_use) < need as u32 {
        return false;
    }
    let had: SmallVec<[usize; 4]> = e.segs.iter().map(|s| s.chunks.len()).collect();
    for seg in e.segs.iter_mut() {
        let len = seg.desc.len as usize;
        while seg.chunks.len() * size < len {
            match pool.get() {
                Ok(c) => seg.chunks.push(c),
                Err(_) => {
                    // Another session took them meanwhile (or an arena could not be
                    // mapped): give back what this call took, and wait.
                    for (seg, &h) in e.segs.iter_mut().zip(&had) {
                        for c in seg.chunks.drain(h..) {
                            let _ = pool.put(c);
                        }
                    }
                    return false;
                }
            }
        }
    }
    true
}

/// Posts `wrs` on `conn`; with an injected partial post pending
/// ([`super::Fault::PartialPosts`]) only the first half of them, as a QP with less room
/// would take them, and a single one every other time not at all (as a full QP).
fn post(conn: &Connection, wrs: &[SendReq], inject: &mut u32) -> Result<usize> {
    if *inject > 0 {
        *inject -= 1;
        let k = wrs.len() / 2;
        if k > 0 {
            return conn.post_send(&wrs[..k]);
        }
        if *inject % 2 == 1 {
            return Err(Error::fixed(
                ErrorKind::Full,
                "messenger: injected: the send queue took none of the work requests",
            ));
        }
    }
    conn.post_send(wrs)
}

fn recv_sges(hdr: &Chunk, data: &Chunk) -> SgeList {
    let mut s = SgeList::new();
    s.push(Sge {
        addr: hdr.addr_u64(),
        length: SLOT as u32,
        lkey: hdr.lkey,
    });
    s.push(Sge {
        addr: data.addr_u64(),
        length: data.len as u32,
        lkey: data.lkey,
    });
    s
}

fn empty_wc() -> Wc {
    Wc {
        cookie: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qp_num: 0,
        src_qp: None,
    }
}

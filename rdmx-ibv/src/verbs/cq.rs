//! Completion channels and completion queues.
//!
//! A [`CompChannel`] is a pipe: on an armed CQ's next completion (or next solicited one,
//! or error one, with `solicited_only`) the CQ's 8-byte handle is written to it, which is
//! the `struct ib_uverbs_comp_event_desc { u64 cq_handle; }` libibverbs' `ibv_get_cq_event`
//! reads and casts to `struct ibv_cq *`. One event per arm, as verbs.

use rdmx::config::Progress;
use rdmx::error::{Error, ErrorKind, Result};
use rdmx::provider::soft::cq::{Cq as SoftCq, Wc};
use rdmx::rc::WcOpcode;
use rdmx::rc::verbs::wc_flags;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::device::{Device, limits};
use super::events::EventTally;
use super::sys::RecordPipe;

/// A completion channel (`ibv_create_comp_channel`).
#[derive(Debug)]
pub struct CompChannel {
    pipe: RecordPipe,
    /// CQs using this channel and not destroyed.
    cqs: AtomicUsize,
    /// Events lost because the application did not read the channel (pipe full).
    dropped: AtomicU64,
    dead: AtomicBool,
}

impl CompChannel {
    pub fn new() -> Result<Arc<CompChannel>> {
        Ok(Arc::new(CompChannel {
            pipe: RecordPipe::new()?,
            cqs: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            dead: AtomicBool::new(false),
        }))
    }

    /// The read end (`ibv_comp_channel.fd`): 8-byte CQ handles.
    pub fn fd(&self) -> RawFd {
        self.pipe.read_fd()
    }

    /// `ibv_destroy_comp_channel`: Busy while CQs use it.
    pub fn destroy(&self) -> Result<()> {
        let n = self.cqs.load(Ordering::Acquire);
        if n > 0 {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("destroy_comp_channel: {n} completion queue(s) still use it"),
            ));
        }
        self.dead.store(true, Ordering::Release);
        Ok(())
    }

    /// Events lost because the pipe was full (the application stopped reading it).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Writes one `ib_uverbs_comp_event_desc` for the CQ `handle`; false if it was dropped.
    fn notify(&self, handle: u64) -> bool {
        let written = self.pipe.write_record(&handle.to_ne_bytes());
        if !written {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed);
            if n % 1024 == 0 {
                log::warn!(
                    target: "rdmx::ibv",
                    "completion event for CQ {handle:#x} dropped: the channel is not read (pipe full; {} dropped so far)",
                    n + 1
                );
            }
        }
        written
    }
}

/// One work completion, the fields of `struct ibv_wc` in verbs numbering.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkCompletion {
    pub wr_id: u64,
    /// `enum ibv_wc_status`.
    pub status: u32,
    /// `enum ibv_wc_opcode` (RECV 128, RECV_RDMA_WITH_IMM 129). Meaningful only for
    /// successful completions, as verbs (set anyway where known).
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `__be32 imm_data` as it lies in memory (the wire bytes, native-read), valid with
    /// `wc_flags & WITH_IMM`; with `wc_flags & WITH_INV` the union's `invalidated_rkey`
    /// (host order).
    pub imm_data: u32,
    pub qp_num: u32,
    /// 0: verbs defines `src_qp` for UD only.
    pub src_qp: u32,
    /// `enum ibv_wc_flags` (GRH = 1, WITH_IMM = 2, WITH_INV = 8).
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

impl WorkCompletion {
    fn from_soft(w: &Wc) -> WorkCompletion {
        // A receive that a SEND_WITH_INV ended: verbs' IBV_WC_RECV with IBV_WC_WITH_INV,
        // and the rkey in the union `imm_data`/`invalidated_rkey` in host order (not the
        // wire's big-endian immediate).
        let inv = w.opcode == WcOpcode::RecvWithInv;
        let (opcode, imm_data, imm_flag) = match (inv, w.imm) {
            (true, rkey) => (WcOpcode::Recv as u32, rkey.unwrap_or(0), wc_flags::WITH_INV),
            (false, Some(imm)) => (w.opcode as u32, imm.to_be(), wc_flags::WITH_IMM),
            (false, None) => (w.opcode as u32, 0, 0),
        };
        WorkCompletion {
            wr_id: w.cookie,
            status: w.status as u32,
            opcode,
            byte_len: w.byte_len,
            imm_data,
            qp_num: w.qp_num,
            // UD receives: the sender's QPN, and the GRH area in front of the payload
            // (pkey_index, slid, sl stay 0: one P_Key, RoCE has no LIDs or SLs here).
            src_qp: w.src_qp.unwrap_or(0),
            wc_flags: imm_flag | if w.src_qp.is_some() { wc_flags::GRH } else { 0 },
            ..Default::default()
        }
    }
}

/// Completions converted per batch of a poll.
const POLL_CHUNK: usize = 32;

/// A completion queue (`ibv_create_cq`).
#[derive(Debug)]
pub struct Cq {
    pub(crate) dev: Arc<Device>,
    pub(crate) soft: Arc<SoftCq>,
    handle: u64,
    channel: Option<Arc<CompChannel>>,
    /// Channel records written about this CQ.
    events: Arc<EventTally>,
    /// QPs using this CQ (as send or receive CQ, counted once per use).
    pub(crate) qps: AtomicUsize,
    inline: bool,
    /// `poll_yield_after` (verbs/spin.rs).
    yield_after: u32,
    dead: AtomicBool,
}

impl Cq {
    /// A CQ of at least `cqe` entries (1..=max_cqe, InvalidArgument otherwise) whose
    /// notifications, when armed, go to `channel`; `handle` names it (`struct ibv_cq *`).
    pub fn new(
        dev: &Arc<Device>,
        cqe: u32,
        channel: Option<Arc<CompChannel>>,
        handle: u64,
    ) -> Result<Arc<Cq>> {
        if cqe == 0 || cqe > limits::MAX_CQE {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("create_cq: cqe {cqe}: allowed 1..{}", limits::MAX_CQE),
            ));
        }
        if let Some(c) = &channel
            && c.dead.load(Ordering::Acquire)
        {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "create_cq: the completion channel was destroyed",
            ));
        }
        let events = Arc::new(EventTally::default());
        let hook: Box<dyn Fn() + Send + Sync> = match &channel {
            Some(c) => {
                let c = Arc::clone(c);
                let events = Arc::clone(&events);
                Box::new(move || events.emit(|| c.notify(handle)))
            }
            None => Box::new(|| {}),
        };
        let soft = Arc::new(SoftCq::with_notify(cqe as usize, hook)?);
        // Armed CQs tell the device's progress thread to receive (the application sleeps).
        soft.count_armings_in(dev.soft.armed_cqs());
        if let Some(c) = &channel {
            c.cqs.fetch_add(1, Ordering::AcqRel);
        }
        Ok(Arc::new(Cq {
            dev: Arc::clone(dev),
            soft,
            handle,
            channel,
            events,
            qps: AtomicUsize::new(0),
            inline: dev.settings().progress == Progress::Inline,
            yield_after: dev.settings().poll_yield_after,
            dead: AtomicBool::new(false),
        }))
    }

    pub fn handle(&self) -> u64 {
        self.handle
    }

    /// Completion channel records written about this CQ (each one the application must
    /// acknowledge with `ibv_ack_cq_events` before the CQ's memory may go).
    pub fn events_written(&self) -> u64 {
        self.events.written()
    }

    /// The number of entries (`ibv_cq.cqe`).
    pub fn cqe(&self) -> u32 {
        self.soft.capacity() as u32
    }

    /// Completions lost because the CQ was full (a CQ overrun; the QP that overran it went
    /// to ERR).
    pub fn overflows(&self) -> u64 {
        self.soft.overflows()
    }

    /// `ibv_poll_cq`: moves up to `out.len()` completions into `out`, oldest first; returns
    /// how many. With `progress=inline` a poll first drives the device (receives what
    /// arrived, runs due timers), so a busy-polling application needs no other call.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        if self.inline {
            self.dev.soft.progress_inline();
        }
        let mut buf = [Wc::EMPTY; POLL_CHUNK];
        let mut done = 0;
        while done < out.len() {
            let want = (out.len() - done).min(POLL_CHUNK);
            let n = self.soft.poll(&mut buf[..want]);
            for (o, w) in out[done..done + n].iter_mut().zip(&buf[..n]) {
                *o = WorkCompletion::from_soft(w);
                if w.src_qp.is_some() {
                    o.sl = super::qp::ud::roce_v2_sl(self.dev.ip);
                }
                if o.status != 0 {
                    super::stats::wc_error(o.status, o.qp_num);
                }
            }
            super::stats::wc_polled(n);
            done += n;
            if n < want {
                break;
            }
        }
        if self.inline {
            self.dev.soft.after_app_poll(done > 0);
        }
        super::spin::after_poll(done, self.yield_after);
        done
    }

    /// `ibv_req_notify_cq`: the next completion added after this call (`solicited_only`:
    /// the next solicited receive completion or error completion) writes this CQ's handle
    /// to its channel, once. Completions already queued do not (the verbs contract: the
    /// application polls them after arming; perftest's `-e` loops poll exactly once per
    /// event and would read an empty CQ otherwise). A CQ without a channel accepts the
    /// call (nothing is written, as verbs). Tells the device the application waits on a
    /// channel (progress=inline: its progress thread receives while the CQ is armed, see
    /// docs/ibv-device.md "Who receives").
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.dead.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "req_notify_cq: CQ destroyed",
            ));
        }
        self.soft.arm(solicited_only);
        self.dev.soft.app_waits_on_channel();
        Ok(())
    }

    /// `ibv_destroy_cq`: Busy while QPs use it. No channel record is written after it
    /// returns; [`Cq::events_written`] is then final.
    pub fn destroy(&self) -> Result<()> {
        let n = self.qps.load(Ordering::Acquire);
        if n > 0 && !self.dead.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("destroy_cq: {n} QP(s) still use it"),
            ));
        }
        if self.dead.swap(true, Ordering::AcqRel) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "destroy_cq: already destroyed",
            ));
        }
        self.events.close();
        // Its QPs are gone; an arming left would keep the device receiving for nobody.
        self.soft.disarm();
        if let Some(c) = &self.channel {
            c.cqs.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(())
    }

    pub(crate) fn check_alive(&self) -> Result<()> {
        if self.dead.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "completion queue already destroyed",
            ));
        }
        Ok(())
    }
}

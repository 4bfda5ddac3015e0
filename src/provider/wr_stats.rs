//! Work-request counters of one connection, kept by the provider seam for both providers:
//! WRs accepted by the post calls and their bytes, completions handed to the caller by
//! status, bytes received, async events. The soft engine counts packets as well; on verbs
//! these are what a connection can know (a NIC counts packets per port, not per QP).
//!
//! Relaxed atomics, added once per post or poll call (not per WR), so the data path pays
//! a handful of uncontended `fetch_add`s.

use super::types::{SendReq, Wc};
use crate::rc::counters::WC_STATUS_COUNT;
use crate::rc::{Counters, WcStatus, WrOpcode};
use std::sync::atomic::{AtomicU64, Ordering, Ordering::Relaxed};

#[derive(Debug, Default)]
pub(crate) struct WrStats {
    send_posted: AtomicU64,
    recv_posted: AtomicU64,
    send_bytes: AtomicU64,
    write_bytes: AtomicU64,
    read_bytes: AtomicU64,
    completions: AtomicU64,
    recv_bytes: AtomicU64,
    status: [AtomicU64; WC_STATUS_COUNT],
    async_events: AtomicU64,
}

fn add(a: &AtomicU64, n: u64) {
    if n != 0 {
        a.fetch_add(n, Relaxed);
    }
}

impl WrStats {
    /// `wrs` were accepted by the provider.
    pub fn posted_sends(&self, wrs: &[SendReq]) {
        let (mut send, mut write, mut read) = (0u64, 0u64, 0u64);
        for w in wrs {
            let len: u64 = w.sges.iter().map(|s| u64::from(s.length)).sum();
            match w.opcode {
                WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => send += len,
                WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => write += len,
                WrOpcode::RdmaRead => read += len,
            }
        }
        add(&self.send_posted, wrs.len() as u64);
        add(&self.send_bytes, send);
        add(&self.write_bytes, write);
        add(&self.read_bytes, read);
    }

    /// `n` receive WRs were accepted.
    pub fn posted_recvs(&self, n: usize) {
        add(&self.recv_posted, n as u64);
    }

    /// `wcs` were handed to the caller.
    pub fn completed(&self, wcs: &[Wc]) {
        if wcs.is_empty() {
            return;
        }
        let mut ok = 0u64;
        let mut recv_bytes = 0u64;
        for w in wcs {
            if w.status == WcStatus::Success {
                ok += 1;
                if w.opcode.is_recv() {
                    recv_bytes += u64::from(w.byte_len);
                }
            } else {
                let i = (w.status as usize).min(WC_STATUS_COUNT - 1);
                self.status[i].fetch_add(1, Relaxed);
            }
        }
        add(&self.completions, wcs.len() as u64);
        add(&self.status[0], ok);
        add(&self.recv_bytes, recv_bytes);
    }

    /// One async event about the connection's QP or CQs. Release (and Acquire in
    /// `fill`): what the event's handler wrote before counting it (the failure note) is
    /// seen by whoever sees the count.
    pub fn async_event(&self) {
        self.async_events.fetch_add(1, Ordering::Release);
    }

    /// Writes the WR-level fields of `c`.
    pub fn fill(&self, c: &mut Counters) {
        c.wr_send_posted = self.send_posted.load(Relaxed);
        c.wr_recv_posted = self.recv_posted.load(Relaxed);
        c.send_bytes_posted = self.send_bytes.load(Relaxed);
        c.write_bytes_posted = self.write_bytes.load(Relaxed);
        c.read_bytes_posted = self.read_bytes.load(Relaxed);
        c.completions = self.completions.load(Relaxed);
        c.recv_bytes = self.recv_bytes.load(Relaxed);
        for (o, a) in c.wc_status.iter_mut().zip(&self.status) {
            *o = a.load(Relaxed);
        }
        c.async_events = self.async_events.load(Ordering::Acquire);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rc::{Sge, WcOpcode};

    fn wr(opcode: WrOpcode, lens: &[u32]) -> SendReq {
        SendReq {
            cookie: 0,
            opcode,
            flags: 0,
            sges: lens
                .iter()
                .map(|&length| Sge {
                    addr: 0,
                    length,
                    lkey: 1,
                })
                .collect(),
            remote_addr: 0,
            rkey: 0,
            imm: 0,
        }
    }

    fn wc(status: WcStatus, opcode: WcOpcode, byte_len: u32) -> Wc {
        Wc {
            cookie: 0,
            status,
            opcode,
            byte_len,
            imm: None,
            qp_num: 0,
            src_qp: None,
        }
    }

    #[test]
    fn counts_posts_bytes_and_completions_by_status() {
        let s = WrStats::default();
        s.posted_sends(&[
            wr(WrOpcode::Send, &[100, 28]),
            wr(WrOpcode::SendWithImm, &[]),
            wr(WrOpcode::RdmaWrite, &[4096]),
            wr(WrOpcode::RdmaRead, &[512]),
            wr(WrOpcode::SendWithInv, &[3]),
        ]);
        s.posted_recvs(3);
        s.completed(&[
            wc(WcStatus::Success, WcOpcode::Recv, 77),
            wc(WcStatus::Success, WcOpcode::RecvWithInv, 5),
            wc(WcStatus::Success, WcOpcode::RdmaRead, 512),
            wc(WcStatus::RemAccessErr, WcOpcode::Send, 0),
            wc(WcStatus::WrFlushErr, WcOpcode::Recv, 0),
            wc(WcStatus::WrFlushErr, WcOpcode::Recv, 0),
        ]);
        s.async_event();
        let mut c = Counters::default();
        s.fill(&mut c);
        assert_eq!((c.wr_send_posted, c.wr_recv_posted), (5, 3));
        assert_eq!(
            (
                c.send_bytes_posted,
                c.write_bytes_posted,
                c.read_bytes_posted
            ),
            (131, 4096, 512)
        );
        assert_eq!((c.completions, c.recv_bytes, c.async_events), (6, 82, 1));
        assert_eq!((c.wc_status[0], c.wc_status[5], c.wc_status[10]), (3, 2, 1));
        assert_eq!(c.wc_status.iter().sum::<u64>(), c.completions);
        // The engine's packet counters are left alone.
        assert_eq!((c.tx_packets, c.rx_bytes), (0, 0));
    }
}

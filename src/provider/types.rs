//! The vocabulary both providers and their users (the messenger, block IO, the C API)
//! share: a send work request, a work completion, the parameters that bring a QP to RTS,
//! and a device's port and progress counters. Provider-neutral: the soft and the verbs provider both take and report these, and
//! this module imports neither (nor the messenger).

use crate::rc::memory::SgeList;
use crate::rc::verbs::{WcOpcode, WcStatus, WrOpcode};
use std::net::SocketAddr;

/// One send work request as the provider takes it (a cookie instead of a WR id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendReq {
    pub cookie: u64,
    pub opcode: WrOpcode,
    pub flags: u32,
    pub sges: SgeList,
    pub remote_addr: u64,
    pub rkey: u32,
    pub imm: u32,
}

/// A work completion as the provider reports it: the caller's cookie instead of the
/// engine's internal WR id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    pub cookie: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    pub imm: Option<u32>,
    pub qp_num: u32,
    /// A UD receive: the sending QP's number (the packet's DETH SrcQP); its buffer starts
    /// with the 40-byte GRH area, as verbs' `IBV_WC_GRH`. None for every other completion.
    pub src_qp: Option<u32>,
}

impl Wc {
    /// A blank completion, to fill a buffer that `poll` writes into.
    pub const EMPTY: Wc = Wc {
        cookie: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qp_num: 0,
        src_qp: None,
    };
}

/// The connection parameters `connect` needs (from the handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    pub dest_qpn: u32,
    pub peer_udp: SocketAddr,
    /// The UDP source port of the peer QP's packets, if the handshake said (else learnt
    /// from its first packet).
    pub peer_src_port: Option<u16>,
    pub sq_psn: u32,
    pub rq_psn: u32,
    pub path_mtu: u32,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
}

/// Datagrams a soft device dropped on its UDP ports (every family together) before any QP
/// processed them, as rxe and NICs count them per port: traffic that reached the host but
/// not an RC engine. Cumulative since the device opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Well-formed packets whose BTH names no QP of this device (destroyed, never existed).
    pub unknown_qpn: u64,
    /// Packets for a QP that did not come from the IP and UDP port its connected peer sends
    /// from (or for a QP not connected yet), dropped before the ICRC or any PSN, rkey or
    /// AETH processing.
    pub wrong_source: u64,
    /// Packets from the QP's peer whose ICRC did not match.
    pub bad_icrc: u64,
    /// Datagrams too short for a BTH and an ICRC. (Packets from a QP's peer that do not
    /// parse are counted by that QP: `Counters::malformed`.)
    pub malformed: u64,
    /// Datagrams larger than a receive buffer (dropped).
    pub truncated: u64,
    /// Datagrams the kernel dropped on a full receive queue (`SO_RXQ_OVFL`).
    pub kernel_drops: u64,
    /// Async events the device reported (verbs provider: QP, CQ, port and device events,
    /// read from the device's async fd; the soft provider raises none).
    pub async_events: u64,
}

/// How well a soft device kept listening on a busy host: the engine's clock (and so every
/// ACK timeout) leaves out time the process was not running. A NIC listens whatever the
/// host CPU does; a userspace transport only when it is scheduled, so a requester that was
/// itself starved or stopped must not charge that time to its peer's retry budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgressStats {
    /// Progress passes that started at least 200 us after one was due.
    pub stalls: u64,
    /// Total time left out of the engine clock by those stalls, ns.
    pub stalled_ns: u64,
    /// Longest single stall, ns.
    pub max_stall_ns: u64,
    /// Passes that left due timers for the next pass because received packets were still
    /// queued (packets are processed before timers fire).
    pub timers_deferred: u64,
    /// Panics caught in the device's progress thread (a hook run there, a bug): each
    /// failed every QP of the device and was logged at error level; the thread went on,
    /// so timers keep running for the QPs made afterwards. 0 normally.
    pub progress_panics: u64,
}

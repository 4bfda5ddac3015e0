//! Verbs enum values (rdma-core `libibverbs/verbs.h`, docs/rc-transport.md §6). The engine speaks
//! these numbers so that completions and statuses mean what they mean on a NIC.

/// `enum ibv_wc_status` (the subset RC produces).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocProtErr = 4,
    WrFlushErr = 5,
    /// A memory window bind failed (rdmx-ibv's local operations, not the engine's).
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    FatalErr = 19,
    GeneralErr = 21,
}

/// `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WcOpcode {
    Send = 0,
    RdmaWrite = 1,
    RdmaRead = 2,
    /// A memory window bind (rdmx-ibv's local operations, not the engine's).
    BindMw = 5,
    /// A local invalidate (rdmx-ibv's local operations, not the engine's).
    LocalInv = 6,
    Recv = 128,
    RecvRdmaWithImm = 129,
    /// A receive completed by a SEND_*_WITH_INVALIDATE that invalidated the memory window
    /// whose rkey the completion's `imm` holds. Not an `ibv_wc_opcode` value: verbs reports
    /// this as IBV_WC_RECV with `wc_flags & IBV_WC_WITH_INV` and `invalidated_rkey` (a union
    /// with `imm_data`, as `imm` is here). rdmx-ibv and the verbs provider convert both
    /// ways; everything that treats `Recv` as a receive treats this as one too. The
    /// messenger never posts IBV_WR_SEND_WITH_INV; one from a peer faults that peer's link
    /// as a malformed frame (`msgr/messenger/link.rs`).
    RecvWithInv = 130,
}

impl WcOpcode {
    /// Whether this completes a receive WR (a receive-queue completion).
    pub fn is_recv(self) -> bool {
        matches!(
            self,
            WcOpcode::Recv | WcOpcode::RecvRdmaWithImm | WcOpcode::RecvWithInv
        )
    }
}

/// `enum ibv_wr_opcode` (the RC operations the engine implements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WrOpcode {
    RdmaWrite = 0,
    RdmaWriteWithImm = 1,
    Send = 2,
    SendWithImm = 3,
    RdmaRead = 4,
    /// IBV_WR_SEND_WITH_INV: a SEND whose last packet carries an IETH asking the responder
    /// to invalidate the memory window whose rkey `SendWr::imm` holds (verbs' union
    /// `imm_data`/`invalidate_rkey`; here the rkey in host order). Completes as SEND.
    SendWithInv = 9,
}

impl WrOpcode {
    /// The send-side completion opcode (verbs: SEND_WITH_IMM completes as SEND, etc.).
    pub fn wc_opcode(self) -> WcOpcode {
        match self {
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => WcOpcode::Send,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
        }
    }
}

/// `enum ibv_send_flags` bits.
pub mod send_flags {
    pub const FENCE: u32 = 1;
    pub const SIGNALED: u32 = 2;
    pub const SOLICITED: u32 = 4;
    pub const INLINE: u32 = 8;
}

/// `enum ibv_access_flags` bits.
pub mod access {
    pub const LOCAL_WRITE: u32 = 1;
    pub const REMOTE_WRITE: u32 = 2;
    pub const REMOTE_READ: u32 = 4;
    pub const REMOTE_ATOMIC: u32 = 8;
}

/// `enum ibv_wc_flags` bits.
pub mod wc_flags {
    /// The receive buffer starts with a 40-byte GRH (UD).
    pub const GRH: u32 = 1;
    pub const WITH_IMM: u32 = 2;
    /// A SEND_WITH_INV invalidated the rkey in `invalidated_rkey` (IBV_WC_WITH_INV).
    pub const WITH_INV: u32 = 8;
}

/// `enum ibv_qp_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpState {
    Reset = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    Err = 6,
}

/// `enum ibv_qp_attr_mask` bits.
pub mod attr_mask {
    pub const STATE: u32 = 1 << 0;
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    pub const PKEY_INDEX: u32 = 1 << 4;
    pub const PORT: u32 = 1 << 5;
    pub const AV: u32 = 1 << 7;
    pub const PATH_MTU: u32 = 1 << 8;
    pub const TIMEOUT: u32 = 1 << 9;
    pub const RETRY_CNT: u32 = 1 << 10;
    pub const RNR_RETRY: u32 = 1 << 11;
    pub const RQ_PSN: u32 = 1 << 12;
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    pub const SQ_PSN: u32 = 1 << 16;
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    pub const DEST_QPN: u32 = 1 << 20;
}

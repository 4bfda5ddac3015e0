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
}

impl WrOpcode {
    /// The send-side completion opcode (verbs: SEND_WITH_IMM completes as SEND, etc.).
    pub fn wc_opcode(self) -> WcOpcode {
        match self {
            WrOpcode::Send | WrOpcode::SendWithImm => WcOpcode::Send,
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

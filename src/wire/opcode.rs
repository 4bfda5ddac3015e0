//! RC opcodes (docs/rc-transport.md §2.1) and the headers each carries (§1.3, §1.6).

use core::fmt;

use super::error::{Result, WireError};

// Per-opcode properties, as rxe's `rxe_opcode[].mask` (rxe_opcode.c).
const RETH: u16 = 1 << 0;
const AETH: u16 = 1 << 1;
const IMMDT: u16 = 1 << 2;
const IETH: u16 = 1 << 3;
const ATOMIC_ETH: u16 = 1 << 4;
const ATOMIC_ACK_ETH: u16 = 1 << 5;
const FETH: u16 = 1 << 6;
const PAYLOAD: u16 = 1 << 7;
const START: u16 = 1 << 8;
const MIDDLE: u16 = 1 << 9;
const END: u16 = 1 << 10;
const REQUEST: u16 = 1 << 11;
const RWR: u16 = 1 << 12;
const CQE: u16 = 1 << 13;
/// Known opcodes this layer does not build or parse (IBA 1.5 extensions).
const UNSUPPORTED: u16 = 1 << 14;

/// An RC opcode (BTH byte 0 with transport bits 7..5 = 000). Values are exactly ib_pack.h's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Opcode {
    SendFirst = 0x00,
    SendMiddle = 0x01,
    SendLast = 0x02,
    SendLastWithImmediate = 0x03,
    SendOnly = 0x04,
    SendOnlyWithImmediate = 0x05,
    RdmaWriteFirst = 0x06,
    RdmaWriteMiddle = 0x07,
    RdmaWriteLast = 0x08,
    RdmaWriteLastWithImmediate = 0x09,
    RdmaWriteOnly = 0x0A,
    RdmaWriteOnlyWithImmediate = 0x0B,
    RdmaReadRequest = 0x0C,
    RdmaReadResponseFirst = 0x0D,
    RdmaReadResponseMiddle = 0x0E,
    RdmaReadResponseLast = 0x0F,
    RdmaReadResponseOnly = 0x10,
    Acknowledge = 0x11,
    AtomicAcknowledge = 0x12,
    CompareSwap = 0x13,
    FetchAdd = 0x14,
    SendLastWithInvalidate = 0x16,
    SendOnlyWithInvalidate = 0x17,
    /// IBA 1.5, optional. Known so that a responder can NAK Invalid Request; see
    /// [`Opcode::is_supported`].
    Flush = 0x1C,
    /// IBA 1.5, optional. Known so that a responder can NAK Invalid Request; see
    /// [`Opcode::is_supported`].
    AtomicWrite = 0x1D,
}

impl Opcode {
    /// Every known RC opcode, in value order.
    pub const ALL: [Opcode; 25] = [
        Opcode::SendFirst,
        Opcode::SendMiddle,
        Opcode::SendLast,
        Opcode::SendLastWithImmediate,
        Opcode::SendOnly,
        Opcode::SendOnlyWithImmediate,
        Opcode::RdmaWriteFirst,
        Opcode::RdmaWriteMiddle,
        Opcode::RdmaWriteLast,
        Opcode::RdmaWriteLastWithImmediate,
        Opcode::RdmaWriteOnly,
        Opcode::RdmaWriteOnlyWithImmediate,
        Opcode::RdmaReadRequest,
        Opcode::RdmaReadResponseFirst,
        Opcode::RdmaReadResponseMiddle,
        Opcode::RdmaReadResponseLast,
        Opcode::RdmaReadResponseOnly,
        Opcode::Acknowledge,
        Opcode::AtomicAcknowledge,
        Opcode::CompareSwap,
        Opcode::FetchAdd,
        Opcode::SendLastWithInvalidate,
        Opcode::SendOnlyWithInvalidate,
        Opcode::Flush,
        Opcode::AtomicWrite,
    ];

    /// Decodes BTH byte 0. Non-RC transports (UC, UD, CNP, ...) and reserved RC codes
    /// (0x15, 0x18–0x1B, 0x1E, 0x1F) give [`WireError::BadOpcode`].
    pub const fn from_u8(value: u8) -> Result<Opcode> {
        Ok(match value {
            0x00 => Opcode::SendFirst,
            0x01 => Opcode::SendMiddle,
            0x02 => Opcode::SendLast,
            0x03 => Opcode::SendLastWithImmediate,
            0x04 => Opcode::SendOnly,
            0x05 => Opcode::SendOnlyWithImmediate,
            0x06 => Opcode::RdmaWriteFirst,
            0x07 => Opcode::RdmaWriteMiddle,
            0x08 => Opcode::RdmaWriteLast,
            0x09 => Opcode::RdmaWriteLastWithImmediate,
            0x0A => Opcode::RdmaWriteOnly,
            0x0B => Opcode::RdmaWriteOnlyWithImmediate,
            0x0C => Opcode::RdmaReadRequest,
            0x0D => Opcode::RdmaReadResponseFirst,
            0x0E => Opcode::RdmaReadResponseMiddle,
            0x0F => Opcode::RdmaReadResponseLast,
            0x10 => Opcode::RdmaReadResponseOnly,
            0x11 => Opcode::Acknowledge,
            0x12 => Opcode::AtomicAcknowledge,
            0x13 => Opcode::CompareSwap,
            0x14 => Opcode::FetchAdd,
            0x16 => Opcode::SendLastWithInvalidate,
            0x17 => Opcode::SendOnlyWithInvalidate,
            0x1C => Opcode::Flush,
            0x1D => Opcode::AtomicWrite,
            other => return Err(WireError::BadOpcode(other)),
        })
    }

    /// The BTH byte 0 value.
    #[inline]
    pub const fn as_u8(self) -> u8 {
        self as u8
    }

    /// The name used by ib_pack.h (`IB_OPCODE_RC_` prefix dropped).
    pub const fn name(self) -> &'static str {
        match self {
            Opcode::SendFirst => "SEND_FIRST",
            Opcode::SendMiddle => "SEND_MIDDLE",
            Opcode::SendLast => "SEND_LAST",
            Opcode::SendLastWithImmediate => "SEND_LAST_WITH_IMMEDIATE",
            Opcode::SendOnly => "SEND_ONLY",
            Opcode::SendOnlyWithImmediate => "SEND_ONLY_WITH_IMMEDIATE",
            Opcode::RdmaWriteFirst => "RDMA_WRITE_FIRST",
            Opcode::RdmaWriteMiddle => "RDMA_WRITE_MIDDLE",
            Opcode::RdmaWriteLast => "RDMA_WRITE_LAST",
            Opcode::RdmaWriteLastWithImmediate => "RDMA_WRITE_LAST_WITH_IMMEDIATE",
            Opcode::RdmaWriteOnly => "RDMA_WRITE_ONLY",
            Opcode::RdmaWriteOnlyWithImmediate => "RDMA_WRITE_ONLY_WITH_IMMEDIATE",
            Opcode::RdmaReadRequest => "RDMA_READ_REQUEST",
            Opcode::RdmaReadResponseFirst => "RDMA_READ_RESPONSE_FIRST",
            Opcode::RdmaReadResponseMiddle => "RDMA_READ_RESPONSE_MIDDLE",
            Opcode::RdmaReadResponseLast => "RDMA_READ_RESPONSE_LAST",
            Opcode::RdmaReadResponseOnly => "RDMA_READ_RESPONSE_ONLY",
            Opcode::Acknowledge => "ACKNOWLEDGE",
            Opcode::AtomicAcknowledge => "ATOMIC_ACKNOWLEDGE",
            Opcode::CompareSwap => "COMPARE_SWAP",
            Opcode::FetchAdd => "FETCH_ADD",
            Opcode::SendLastWithInvalidate => "SEND_LAST_WITH_INVALIDATE",
            Opcode::SendOnlyWithInvalidate => "SEND_ONLY_WITH_INVALIDATE",
            Opcode::Flush => "FLUSH",
            Opcode::AtomicWrite => "ATOMIC_WRITE",
        }
    }

    /// The §2.1 row of this opcode as flag bits.
    const fn flags(self) -> u16 {
        match self {
            Opcode::SendFirst => PAYLOAD | START | REQUEST | RWR,
            Opcode::SendMiddle => PAYLOAD | MIDDLE | REQUEST,
            Opcode::SendLast => PAYLOAD | END | REQUEST | CQE,
            Opcode::SendLastWithImmediate => IMMDT | PAYLOAD | END | REQUEST | CQE,
            Opcode::SendOnly => PAYLOAD | START | END | REQUEST | RWR | CQE,
            Opcode::SendOnlyWithImmediate => IMMDT | PAYLOAD | START | END | REQUEST | RWR | CQE,
            Opcode::RdmaWriteFirst => RETH | PAYLOAD | START | REQUEST,
            Opcode::RdmaWriteMiddle => PAYLOAD | MIDDLE | REQUEST,
            Opcode::RdmaWriteLast => PAYLOAD | END | REQUEST,
            Opcode::RdmaWriteLastWithImmediate => IMMDT | PAYLOAD | END | REQUEST | RWR | CQE,
            Opcode::RdmaWriteOnly => RETH | PAYLOAD | START | END | REQUEST,
            Opcode::RdmaWriteOnlyWithImmediate => {
                RETH | IMMDT | PAYLOAD | START | END | REQUEST | RWR | CQE
            }
            Opcode::RdmaReadRequest => RETH | START | END | REQUEST,
            Opcode::RdmaReadResponseFirst => AETH | PAYLOAD | START,
            Opcode::RdmaReadResponseMiddle => PAYLOAD | MIDDLE,
            Opcode::RdmaReadResponseLast => AETH | PAYLOAD | END,
            Opcode::RdmaReadResponseOnly => AETH | PAYLOAD | START | END,
            Opcode::Acknowledge => AETH | START | END,
            Opcode::AtomicAcknowledge => AETH | ATOMIC_ACK_ETH | START | END,
            Opcode::CompareSwap | Opcode::FetchAdd => ATOMIC_ETH | START | END | REQUEST,
            Opcode::SendLastWithInvalidate => IETH | PAYLOAD | END | REQUEST | CQE,
            Opcode::SendOnlyWithInvalidate => IETH | PAYLOAD | START | END | REQUEST | RWR | CQE,
            Opcode::Flush => FETH | RETH | START | END | REQUEST | UNSUPPORTED,
            // 8 bytes of payload: the value to write.
            Opcode::AtomicWrite => RETH | PAYLOAD | START | END | REQUEST | UNSUPPORTED,
        }
    }

    #[inline]
    const fn has(self, flag: u16) -> bool {
        self.flags() & flag != 0
    }

    /// Carries a RETH (16 bytes).
    pub const fn has_reth(self) -> bool {
        self.has(RETH)
    }
    /// Carries an AETH (4 bytes).
    pub const fn has_aeth(self) -> bool {
        self.has(AETH)
    }
    /// Carries an ImmDt (4 bytes).
    pub const fn has_immdt(self) -> bool {
        self.has(IMMDT)
    }
    /// Carries an IETH (4 bytes).
    pub const fn has_ieth(self) -> bool {
        self.has(IETH)
    }
    /// Carries an AtomicETH (28 bytes).
    pub const fn has_atomic_eth(self) -> bool {
        self.has(ATOMIC_ETH)
    }
    /// Carries an AtomicAckETH (8 bytes).
    pub const fn has_atomic_ack_eth(self) -> bool {
        self.has(ATOMIC_ACK_ETH)
    }
    /// Carries a FETH (4 bytes; FLUSH only).
    pub const fn has_feth(self) -> bool {
        self.has(FETH)
    }
    /// May carry payload bytes (§2.1 "Payload" column not "none").
    pub const fn has_payload(self) -> bool {
        self.has(PAYLOAD)
    }
    /// First (or only) packet of a message.
    pub const fn is_start(self) -> bool {
        self.has(START)
    }
    /// Middle packet of a message.
    pub const fn is_middle(self) -> bool {
        self.has(MIDDLE)
    }
    /// Last (or only) packet of a message.
    pub const fn is_end(self) -> bool {
        self.has(END)
    }
    /// Sent by the requester (0x00–0x0C, 0x13, 0x14, 0x16, 0x17, and FLUSH/ATOMIC_WRITE).
    pub const fn is_request(self) -> bool {
        self.has(REQUEST)
    }
    /// Sent by the responder (0x0D–0x12).
    pub const fn is_response(self) -> bool {
        !self.has(REQUEST)
    }
    /// Consumes a receive WQE at the responder (rxe `RXE_RWR_MASK`).
    pub const fn consumes_recv_wqe(self) -> bool {
        self.has(RWR)
    }
    /// Generates a receive completion at the responder (rxe `RXE_COMP_MASK`).
    pub const fn generates_recv_cqe(self) -> bool {
        self.has(CQE)
    }
    /// Whether [`super::PacketRepr`] can parse and emit it. FLUSH and ATOMIC_WRITE are known
    /// (so they are not [`WireError::BadOpcode`]) but not implemented: parsing them yields
    /// [`WireError::Unsupported`] and the responder answers NAK Invalid Request.
    pub const fn is_supported(self) -> bool {
        !self.has(UNSUPPORTED)
    }

    /// Bytes of BTH + extension headers (§1.6; excludes payload, pad and ICRC).
    pub const fn header_len(self) -> usize {
        let mut len = super::bth::HEADER_LEN;
        if self.has_reth() {
            len += super::reth::HEADER_LEN;
        }
        if self.has_aeth() {
            len += super::aeth::HEADER_LEN;
        }
        if self.has_immdt() {
            len += super::immdt::HEADER_LEN;
        }
        if self.has_ieth() {
            len += super::ieth::HEADER_LEN;
        }
        if self.has_atomic_eth() {
            len += super::atomic_eth::HEADER_LEN;
        }
        if self.has_atomic_ack_eth() {
            len += super::atomic_ack_eth::HEADER_LEN;
        }
        if self.has_feth() {
            len += FETH_LEN;
        }
        len
    }
}

/// FLUSH extended transport header size (IBA 1.5); only used for [`Opcode::header_len`].
const FETH_LEN: usize = 4;

impl TryFrom<u8> for Opcode {
    type Error = WireError;
    fn try_from(value: u8) -> Result<Opcode> {
        Opcode::from_u8(value)
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> u8 {
        op as u8
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

//! ACK Extended Transport Header (docs/rc-transport.md §1.3, §1.4): 4 bytes, in ACKNOWLEDGE,
//! ATOMIC_ACKNOWLEDGE and RDMA READ RESPONSE FIRST/LAST/ONLY.

use core::fmt;

use super::error::{Result, WireError};
use super::{MASK_24, read_u24, write_u24};

/// Size of the AETH.
pub const HEADER_LEN: usize = 4;

mod field {
    use core::ops::Range;

    pub const SYNDROME: usize = 0;
    pub const MSN: Range<usize> = 1..4;
}

const RESERVED_BIT: u8 = 0x80;
const TYPE_MASK: u8 = 0x60;
const TYPE_ACK: u8 = 0x00;
const TYPE_RNR_NAK: u8 = 0x20;
const TYPE_NAK: u8 = 0x60;
const VALUE_MASK: u8 = 0x1F;

/// Credits per credit code 0..=30 (rdmavt rc.c `credit_table`, §1.4).
const CREDIT_TABLE: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// NAK codes (low 5 bits of a 0x60–0x7F syndrome; names as Wireshark's value strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0 (syndrome 0x60).
    PsnSequenceError,
    /// 1 (0x61).
    InvalidRequest,
    /// 2 (0x62).
    RemoteAccessError,
    /// 3 (0x63).
    RemoteOperationalError,
    /// 4 (0x64), RD only.
    InvalidRdRequest,
    /// 5..=31 (0x65–0x7F), reserved. Kept rather than rejected because rxe's completer turns
    /// an unexpected NAK into a REM_OP_ERR completion instead of dropping the packet.
    Reserved(u8),
}

impl NakCode {
    /// Decodes a 5-bit NAK code (higher bits ignored).
    #[inline]
    pub const fn from_code(code: u8) -> NakCode {
        match code & VALUE_MASK {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            other => NakCode::Reserved(other),
        }
    }

    /// The 5-bit code (a `Reserved` value is truncated to 5 bits).
    #[inline]
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(code) => code & VALUE_MASK,
        }
    }
}

impl fmt::Display for NakCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NakCode::PsnSequenceError => f.write_str("PSN Sequence Error"),
            NakCode::InvalidRequest => f.write_str("Invalid Request"),
            NakCode::RemoteAccessError => f.write_str("Remote Access Error"),
            NakCode::RemoteOperationalError => f.write_str("Remote Operational Error"),
            NakCode::InvalidRdRequest => f.write_str("Invalid RD Request"),
            NakCode::Reserved(code) => write!(f, "Reserved NAK code {code}"),
        }
    }
}

/// The AETH syndrome byte (§1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// 0x00–0x1F: ACK with a 5-bit credit code; 31 = no credit information.
    Ack { credit_code: u8 },
    /// 0x20–0x3F: RNR NAK with the 5-bit RNR timer code (§4.4) to wait at least.
    RnrNak { timer: u8 },
    /// 0x60–0x7F: NAK.
    Nak(NakCode),
}

impl Syndrome {
    /// Credit code 31: "invalid", no end-to-end credits (rxe's `AETH_ACK_UNLIMITED`).
    pub const CREDIT_CODE_INVALID: u8 = 31;
    /// ACK without credit information, as rxe always sends (syndrome 0x1F).
    pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack {
        credit_code: Syndrome::CREDIT_CODE_INVALID,
    };

    /// Decodes the syndrome byte; bit 7 set or type 10b (0x40–0x5F) give `BadSyndrome`.
    #[inline]
    pub const fn from_u8(value: u8) -> Result<Syndrome> {
        if value & RESERVED_BIT != 0 {
            return Err(WireError::BadSyndrome(value));
        }
        let low = value & VALUE_MASK;
        match value & TYPE_MASK {
            TYPE_ACK => Ok(Syndrome::Ack { credit_code: low }),
            TYPE_RNR_NAK => Ok(Syndrome::RnrNak { timer: low }),
            TYPE_NAK => Ok(Syndrome::Nak(NakCode::from_code(low))),
            // Type 10b (0x40–0x5F) is reserved.
            _ => Err(WireError::BadSyndrome(value)),
        }
    }

    /// Encodes the syndrome byte; 5-bit values are truncated to 5 bits.
    #[inline]
    pub const fn to_u8(self) -> u8 {
        match self {
            Syndrome::Ack { credit_code } => TYPE_ACK | (credit_code & VALUE_MASK),
            Syndrome::RnrNak { timer } => TYPE_RNR_NAK | (timer & VALUE_MASK),
            Syndrome::Nak(code) => TYPE_NAK | code.code(),
        }
    }

    /// For an ACK, the credits its code stands for (rdmavt's table); `None` for credit code
    /// 31 (no credit information) and for NAKs.
    pub const fn credits(self) -> Option<u32> {
        match self {
            Syndrome::Ack { credit_code } if (credit_code as usize) < CREDIT_TABLE.len() => {
                Some(CREDIT_TABLE[credit_code as usize])
            }
            _ => None,
        }
    }

    /// An RNR NAK or a NAK (anything but an ACK).
    pub const fn is_nak(self) -> bool {
        !matches!(self, Syndrome::Ack { .. })
    }
}

/// A read/write view of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aeth<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Aeth<T> {
    /// Wraps a buffer without checking its length; getters panic if it is too short.
    pub const fn new_unchecked(buffer: T) -> Aeth<T> {
        Aeth { buffer }
    }

    /// Wraps a buffer after [`Aeth::check_len`].
    pub fn new_checked(buffer: T) -> Result<Aeth<T>> {
        let h = Aeth::new_unchecked(buffer);
        h.check_len()?;
        Ok(h)
    }

    /// `Err(Truncated)` if the buffer cannot hold an AETH.
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The raw syndrome byte; see [`Syndrome::from_u8`].
    #[inline]
    pub fn syndrome_raw(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }
    /// 24-bit message sequence number.
    #[inline]
    pub fn msn(&self) -> u32 {
        read_u24(&self.buffer.as_ref()[field::MSN])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    #[inline]
    pub fn set_syndrome_raw(&mut self, value: u8) {
        self.buffer.as_mut()[field::SYNDROME] = value;
    }
    /// Only the low 24 bits of `value` are stored.
    #[inline]
    pub fn set_msn(&mut self, value: u32) {
        write_u24(&mut self.buffer.as_mut()[field::MSN], value);
    }
}

/// A decoded AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    pub syndrome: Syndrome,
    /// 24-bit MSN.
    pub msn: u32,
}

impl AethRepr {
    /// Decodes an AETH (`Truncated` if short, `BadSyndrome` for reserved syndromes).
    pub fn parse<T: AsRef<[u8]>>(h: &Aeth<T>) -> Result<AethRepr> {
        h.check_len()?;
        Ok(AethRepr {
            syndrome: Syndrome::from_u8(h.syndrome_raw())?,
            msn: h.msn(),
        })
    }

    /// Bytes [`AethRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the AETH (MSN truncated to 24 bits); the view must hold [`AETH_LEN`](super::AETH_LEN) bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Aeth<T>) {
        h.set_syndrome_raw(self.syndrome.to_u8());
        h.set_msn(self.msn & MASK_24);
    }
}

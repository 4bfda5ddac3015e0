//! Errors of the wire layer.

use core::fmt;

use super::opcode::Opcode;

/// Why a byte string is not a well-formed RC packet (or a buffer is too small to emit one).
///
/// Every parser of this module returns one of these instead of panicking; the RC engine maps
/// them to "drop silently" (rxe does so for malformed packets and bad ICRCs) or, for
/// [`WireError::BadOpcode`] / [`WireError::Unsupported`], to a NAK Invalid Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireError {
    /// The buffer is shorter than the headers (or the trailer) it must hold.
    Truncated,
    /// A length field disagrees with the buffer, or a value does not fit its field.
    BadLength,
    /// The opcode is not an RC opcode (transport bits 7..5 ≠ 000) or is a reserved RC code.
    BadOpcode(u8),
    /// A known RC opcode this layer does not build or parse (FLUSH, ATOMIC_WRITE).
    ///
    /// The raw BTH fields are still readable through [`super::Bth`], so a responder can NAK
    /// Invalid Request with the right PSN.
    Unsupported(Opcode),
    /// BTH TVer ≠ 0 (rxe drops such packets).
    BadVersion(u8),
    /// PadCnt exceeds the bytes after the headers, or payload + pad is not a multiple of 4.
    BadPadding,
    /// An AETH syndrome in a reserved range (bit 7 set, or type 10b).
    BadSyndrome(u8),
    /// The ICRC recomputed over the masked packet does not match the trailer.
    BadIcrc {
        /// The value computed here (the zlib CRC-32 value; wire bytes are its little-endian form).
        computed: u32,
        /// The value found in the packet's last 4 bytes, read little-endian.
        received: u32,
    },
    /// A [`super::PacketRepr`] whose extension headers do not match its opcode (emit only).
    HeaderMismatch,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated => f.write_str("truncated packet or buffer too small"),
            WireError::BadLength => f.write_str("length field inconsistent with buffer"),
            WireError::BadOpcode(op) => write!(f, "not an RC opcode: {op:#04x}"),
            WireError::Unsupported(op) => write!(f, "unsupported RC opcode: {op}"),
            WireError::BadVersion(v) => write!(f, "BTH transport version {v} (expected 0)"),
            WireError::BadPadding => f.write_str("bad PadCnt or unaligned payload"),
            WireError::BadSyndrome(s) => write!(f, "reserved AETH syndrome {s:#04x}"),
            WireError::BadIcrc { computed, received } => {
                write!(
                    f,
                    "bad ICRC: computed {computed:#010x}, received {received:#010x}"
                )
            }
            WireError::HeaderMismatch => f.write_str("extension headers do not match the opcode"),
        }
    }
}

impl std::error::Error for WireError {}

/// Result of the wire layer.
pub type Result<T> = core::result::Result<T, WireError>;

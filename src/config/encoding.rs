//! InfiniBand encodings used by QP attributes (docs/rc-transport.md §4.2, §4.4, §6): the RNR timer
//! code, the local ACK timeout code and the path MTU enum.

use std::fmt::Write as _;

/// RNR timer per 5-bit code in nanoseconds (`enum ib_rnr_timeout`, Wireshark's value strings).
/// Code 0 is the longest (655.36 ms), not zero. Code 25 is 61.44 ms: rxe's 61410 us is a typo.
const RNR_TIMER_NS: [u64; 32] = [
    655_360_000, // 0
    10_000,      // 1
    20_000,      // 2
    30_000,      // 3
    40_000,      // 4
    60_000,      // 5
    80_000,      // 6
    120_000,     // 7
    160_000,     // 8
    240_000,     // 9
    320_000,     // 10
    480_000,     // 11
    640_000,     // 12
    960_000,     // 13
    1_280_000,   // 14
    1_920_000,   // 15
    2_560_000,   // 16
    3_840_000,   // 17
    5_120_000,   // 18
    7_680_000,   // 19
    10_240_000,  // 20
    15_360_000,  // 21
    20_480_000,  // 22
    30_720_000,  // 23
    40_960_000,  // 24
    61_440_000,  // 25
    81_920_000,  // 26
    122_880_000, // 27
    163_840_000, // 28
    245_760_000, // 29
    327_680_000, // 30
    491_520_000, // 31
];

/// Largest valid 5-bit code (timeout and min_rnr_timer are both 5-bit fields).
pub const MAX_CODE: u8 = 31;

/// RNR timer (5-bit code used by `min_rnr_timer` and RNR NAKs) in nanoseconds; `None` for
/// codes above 31. Code 0 is the longest, 655.36 ms.
pub fn rnr_timer_ns(code: u8) -> Option<u64> {
    RNR_TIMER_NS.get(usize::from(code)).copied()
}

/// The RNR timer code whose timer is the shortest one that still lasts at least `ns`.
/// Codes 1..=31 grow with the code; code 0 (655.36 ms) is the longest and only chosen when
/// nothing shorter suffices. `None` if `ns` exceeds 655.36 ms.
pub fn rnr_timer_code_for_ns(ns: u64) -> Option<u8> {
    (1..=MAX_CODE)
        .chain(std::iter::once(0))
        .find(|&code| rnr_timer_ns(code).is_some_and(|t| t >= ns))
}

/// The local ACK timeout unit: 4.096 us.
const ACK_TIMEOUT_UNIT_NS: u64 = 4096;

/// Local ACK timeout, 4096 ns x 2^code; `Some(0)` for code 0 (no timer); `None` above 31.
pub fn ack_timeout_ns(code: u8) -> Option<u64> {
    match code {
        0 => Some(0),
        1..=MAX_CODE => Some(ACK_TIMEOUT_UNIT_NS << code),
        _ => None,
    }
}

/// The smallest ACK timeout code whose timeout lasts at least `ns`; `Some(0)` (no timer) for
/// `ns == 0`, `None` if `ns` exceeds the longest timer (code 31, about 8796 s).
pub fn ack_timeout_code_for_ns(ns: u64) -> Option<u8> {
    if ns == 0 {
        return Some(0);
    }
    (1..=MAX_CODE).find(|&code| ack_timeout_ns(code).is_some_and(|t| t >= ns))
}

/// Path MTU: the payload bytes per packet, as `enum ibv_mtu` encodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mtu {
    Mtu256,
    Mtu512,
    Mtu1024,
    Mtu2048,
    Mtu4096,
}

impl Mtu {
    /// Every MTU, smallest first.
    pub const ALL: [Mtu; 5] = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];

    /// Payload bytes per packet.
    pub fn bytes(self) -> u32 {
        match self {
            Mtu::Mtu256 => 256,
            Mtu::Mtu512 => 512,
            Mtu::Mtu1024 => 1024,
            Mtu::Mtu2048 => 2048,
            Mtu::Mtu4096 => 4096,
        }
    }

    /// The `enum ibv_mtu` value: IBV_MTU_256 = 1 .. IBV_MTU_4096 = 5.
    pub fn ibv_value(self) -> u8 {
        match self {
            Mtu::Mtu256 => 1,
            Mtu::Mtu512 => 2,
            Mtu::Mtu1024 => 3,
            Mtu::Mtu2048 => 4,
            Mtu::Mtu4096 => 5,
        }
    }

    /// The `enum ibv_mtu` constant name.
    pub fn ibv_name(self) -> &'static str {
        match self {
            Mtu::Mtu256 => "IBV_MTU_256",
            Mtu::Mtu512 => "IBV_MTU_512",
            Mtu::Mtu1024 => "IBV_MTU_1024",
            Mtu::Mtu2048 => "IBV_MTU_2048",
            Mtu::Mtu4096 => "IBV_MTU_4096",
        }
    }

    pub fn from_bytes(bytes: u64) -> Option<Mtu> {
        Mtu::ALL.into_iter().find(|m| u64::from(m.bytes()) == bytes)
    }

    pub fn from_ibv_value(value: u8) -> Option<Mtu> {
        Mtu::ALL.into_iter().find(|m| m.ibv_value() == value)
    }
}

/// A duration in the units the reference tables use: "8.192 µs", "1.049 ms", "1.074 s"
/// (three decimals, rounded half up). Zero is "0 ns".
pub fn format_duration_ns(ns: u64) -> String {
    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;
    let (unit_ns, unit) = match ns {
        0 => return "0 ns".to_string(),
        n if n < US => return format!("{n} ns"),
        n if n < MS => (US, "µs"),
        n if n < S => (MS, "ms"),
        _ => (S, "s"),
    };
    // u128: ns * 1000 overflows u64 for the longest timers.
    let thousandths = (u128::from(ns) * 1000 + u128::from(unit_ns) / 2) / u128::from(unit_ns);
    format!("{}.{:03} {unit}", thousandths / 1000, thousandths % 1000)
}

/// The three encoding tables as text (what `rdmx-perf --tables` and the main job print).
pub fn tables_text() -> String {
    let mut out = String::new();
    out.push_str("RNR timer (min_rnr_timer, RNR NAK syndrome): code -> timer; 0 is the longest\n");
    for code in 0..=MAX_CODE {
        let ns = rnr_timer_ns(code).unwrap_or(0);
        let _ = writeln!(out, "  {code:2}  {:>10.2} ms", ns as f64 / 1e6);
    }
    out.push_str("Local ACK timeout (timeout): code -> 4.096 us x 2^code; 0 = no timer\n");
    for code in 0..=MAX_CODE {
        let text = match ack_timeout_ns(code) {
            Some(0) | None => "no timer".to_string(),
            Some(ns) => format_duration_ns(ns),
        };
        let _ = writeln!(out, "  {code:2}  {text:>14}");
    }
    out.push_str("Path MTU (path_mtu): bytes -> enum ibv_mtu\n");
    for mtu in Mtu::ALL {
        let _ = writeln!(
            out,
            "  {:4}  {} = {}",
            mtu.bytes(),
            mtu.ibv_name(),
            mtu.ibv_value()
        );
    }
    out
}

//! 24-bit PSN arithmetic (docs/rc-transport.md §3.1): mod 2^24 with a half-window ordering.

pub const PSN_MASK: u32 = 0x00FF_FFFF;

/// `a + n` mod 2^24.
#[inline]
pub fn add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// Signed distance `a - b` in the half window: > 0 means a is ahead of b.
#[inline]
pub fn diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b)) << 8) as i32 >> 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_orders_in_half_window() {
        assert_eq!(add(PSN_MASK, 1), 0);
        assert_eq!(add(PSN_MASK - 1, 3), 1);
        assert_eq!(diff(1, PSN_MASK), 2);
        assert_eq!(diff(PSN_MASK, 1), -2);
        assert_eq!(diff(5, 5), 0);
        assert_eq!(diff(0x7F_FFFF, 0), 0x7F_FFFF);
        assert_eq!(diff(0x80_0000, 0), -0x80_0000);
    }
}

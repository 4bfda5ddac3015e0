//! The encodings, entry by entry, against the tables of docs/rc-transport.md §4.2, §4.4 and §6.

use crate::config::encoding::{
    Mtu, ack_timeout_code_for_ns, ack_timeout_ns, format_duration_ns, rnr_timer_code_for_ns,
    rnr_timer_ns, tables_text,
};

/// §4.4, copied as written (milliseconds).
const RNR_TABLE_MS: [(u8, &str); 32] = [
    (0, "655.36"),
    (1, "0.01"),
    (2, "0.02"),
    (3, "0.03"),
    (4, "0.04"),
    (5, "0.06"),
    (6, "0.08"),
    (7, "0.12"),
    (8, "0.16"),
    (9, "0.24"),
    (10, "0.32"),
    (11, "0.48"),
    (12, "0.64"),
    (13, "0.96"),
    (14, "1.28"),
    (15, "1.92"),
    (16, "2.56"),
    (17, "3.84"),
    (18, "5.12"),
    (19, "7.68"),
    (20, "10.24"),
    (21, "15.36"),
    (22, "20.48"),
    (23, "30.72"),
    (24, "40.96"),
    (25, "61.44"),
    (26, "81.92"),
    (27, "122.88"),
    (28, "163.84"),
    (29, "245.76"),
    (30, "327.68"),
    (31, "491.52"),
];

/// §4.2, copied as written.
const ACK_TABLE: [(u8, &str); 31] = [
    (1, "8.192 µs"),
    (2, "16.384 µs"),
    (3, "32.768 µs"),
    (4, "65.536 µs"),
    (5, "131.072 µs"),
    (6, "262.144 µs"),
    (7, "524.288 µs"),
    (8, "1.049 ms"),
    (9, "2.097 ms"),
    (10, "4.194 ms"),
    (11, "8.389 ms"),
    (12, "16.777 ms"),
    (13, "33.554 ms"),
    (14, "67.109 ms"),
    (15, "134.218 ms"),
    (16, "268.435 ms"),
    (17, "536.871 ms"),
    (18, "1.074 s"),
    (19, "2.147 s"),
    (20, "4.295 s"),
    (21, "8.590 s"),
    (22, "17.180 s"),
    (23, "34.360 s"),
    (24, "68.719 s"),
    (25, "137.439 s"),
    (26, "274.878 s"),
    (27, "549.756 s"),
    (28, "1099.512 s"),
    (29, "2199.023 s"),
    (30, "4398.047 s"),
    (31, "8796.093 s"),
];

/// "655.36" -> 655_360_000 ns, with integer arithmetic only.
fn ms_text_to_ns(text: &str) -> u64 {
    let (whole, frac) = text.split_once('.').unwrap();
    assert_eq!(frac.len(), 2, "{text}");
    whole.parse::<u64>().unwrap() * 1_000_000 + frac.parse::<u64>().unwrap() * 10_000
}

#[test]
fn rnr_timer_every_code() {
    for (code, ms) in RNR_TABLE_MS {
        assert_eq!(rnr_timer_ns(code), Some(ms_text_to_ns(ms)), "code {code}");
    }
    assert_eq!(
        rnr_timer_ns(25),
        Some(61_440_000),
        "not rxe's 61410 us typo"
    );
    assert_eq!(rnr_timer_ns(0), Some(655_360_000), "code 0 is the longest");
    for code in 32..=u8::MAX {
        assert_eq!(rnr_timer_ns(code), None, "code {code}");
    }
}

#[test]
fn rnr_timer_every_duration_back_to_its_code() {
    for (code, ms) in RNR_TABLE_MS {
        let ns = ms_text_to_ns(ms);
        assert_eq!(rnr_timer_code_for_ns(ns), Some(code), "{ms} ms");
        // One ns more needs the next longer timer: code + 1, code 0 after 31, none after 0.
        let next = match code {
            0 => None,
            31 => Some(0),
            c => Some(c + 1),
        };
        assert_eq!(rnr_timer_code_for_ns(ns + 1), next, "{ms} ms + 1 ns");
    }
    assert_eq!(rnr_timer_code_for_ns(0), Some(1));
    assert_eq!(
        rnr_timer_code_for_ns(500_000),
        Some(12),
        "0.5 ms -> 0.64 ms"
    );
}

#[test]
fn ack_timeout_every_code() {
    assert_eq!(ack_timeout_ns(0), Some(0), "code 0 = no timer");
    for (code, text) in ACK_TABLE {
        let ns = ack_timeout_ns(code).unwrap();
        assert_eq!(ns, 4096u64 << code, "code {code}");
        assert_eq!(format_duration_ns(ns), text, "code {code}");
    }
    for code in 32..=u8::MAX {
        assert_eq!(ack_timeout_ns(code), None, "code {code}");
    }
}

#[test]
fn ack_timeout_every_duration_back_to_its_code() {
    assert_eq!(ack_timeout_code_for_ns(0), Some(0));
    for (code, _) in ACK_TABLE {
        let ns = 4096u64 << code;
        assert_eq!(ack_timeout_code_for_ns(ns), Some(code), "code {code}");
        let next = if code == 31 { None } else { Some(code + 1) };
        assert_eq!(ack_timeout_code_for_ns(ns + 1), next, "code {code} + 1 ns");
    }
    assert_eq!(ack_timeout_code_for_ns(1), Some(1));
    assert_eq!(
        ack_timeout_code_for_ns(4_000_000),
        Some(10),
        "4 ms -> 4.19 ms"
    );
}

#[test]
fn seed_reading_notes_hold() {
    // docs/seed-notes.md: timeout 14 = 67 ms, 10 = 4.2 ms; min_rnr_timer 12 = 0.64 ms.
    assert_eq!(format_duration_ns(ack_timeout_ns(14).unwrap()), "67.109 ms");
    assert_eq!(format_duration_ns(ack_timeout_ns(10).unwrap()), "4.194 ms");
    assert_eq!(rnr_timer_ns(12), Some(640_000));
}

#[test]
fn mtu_every_entry_both_ways() {
    let table: [(Mtu, u32, u8, &str); 5] = [
        (Mtu::Mtu256, 256, 1, "IBV_MTU_256"),
        (Mtu::Mtu512, 512, 2, "IBV_MTU_512"),
        (Mtu::Mtu1024, 1024, 3, "IBV_MTU_1024"),
        (Mtu::Mtu2048, 2048, 4, "IBV_MTU_2048"),
        (Mtu::Mtu4096, 4096, 5, "IBV_MTU_4096"),
    ];
    assert_eq!(Mtu::ALL.len(), table.len());
    for (mtu, bytes, ibv, name) in table {
        assert_eq!(mtu.bytes(), bytes);
        assert_eq!(mtu.ibv_value(), ibv);
        assert_eq!(mtu.ibv_name(), name);
        assert_eq!(Mtu::from_bytes(u64::from(bytes)), Some(mtu));
        assert_eq!(Mtu::from_ibv_value(ibv), Some(mtu));
    }
    for bytes in [0, 128, 1000, 1500, 8192, 9000] {
        assert_eq!(Mtu::from_bytes(bytes), None, "{bytes}");
    }
    for ibv in [0, 6, 255] {
        assert_eq!(Mtu::from_ibv_value(ibv), None, "{ibv}");
    }
}

#[test]
fn durations_format_like_the_reference() {
    assert_eq!(format_duration_ns(0), "0 ns");
    assert_eq!(format_duration_ns(999), "999 ns");
    assert_eq!(format_duration_ns(1_000), "1.000 µs");
    assert_eq!(format_duration_ns(1_999_500), "2.000 ms");
    assert_eq!(format_duration_ns(u64::MAX), "18446744073.710 s");
}

#[test]
fn tables_text_lists_every_entry() {
    let text = tables_text();
    assert!(text.contains("   0      655.36 ms\n"), "{text}");
    assert!(text.contains("  25       61.44 ms\n"), "{text}");
    assert!(text.contains("   0        no timer\n"), "{text}");
    assert!(text.contains("  14       67.109 ms\n"), "{text}");
    assert!(text.contains("  31      8796.093 s\n"), "{text}");
    assert!(text.contains("  4096  IBV_MTU_4096 = 5\n"), "{text}");
    assert_eq!(text.lines().count(), 3 + 32 + 32 + 5);
}

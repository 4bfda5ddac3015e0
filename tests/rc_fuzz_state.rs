//! Stateful fuzzing of the RC engine on the stable toolchain (issue 16, item 8): the driver
//! of the cargo-fuzz target `rc_qp_state` (fuzz/driver/rc_qp_state.rs: two QPs backed by
//! `VecMemory` in every state, fed well-framed arbitrary packets, operations and timers,
//! with invariants checked after every step) run on seeded random programs.
//!
//! `cargo test --test rc_fuzz_state` runs a few seconds' worth. For a long run:
//!   RDMX_FUZZ_ITERS=2000000 cargo test --release --test rc_fuzz_state -- --nocapture
//! (`RDMX_FUZZ_SEED` picks the first seed; a failure prints the seed that reproduces it,
//! and `RDMX_FUZZ_ITERS=1 RDMX_FUZZ_SEED=<seed>` replays it alone).

#[path = "../fuzz/driver/rc_qp_state.rs"]
mod driver;

use std::time::Instant;

/// Programs per plain `cargo test` run.
const DEFAULT_ITERS: u64 = 1000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
    })
}

/// xorshift64*: a program of 64..8192 random bytes per seed.
fn program(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let len = 64 + (next() % 8128) as usize;
    (0..len).map(|_| (next() >> 32) as u8).collect()
}

#[test]
fn random_programs_keep_the_engine_invariants() {
    let iters = env_u64("RDMX_FUZZ_ITERS").unwrap_or(DEFAULT_ITERS);
    let first = env_u64("RDMX_FUZZ_SEED").unwrap_or(1);
    let start = Instant::now();
    let mut total = driver::Stats::default();
    for seed in first..first + iters {
        let data = program(seed);
        let stats = std::panic::catch_unwind(|| driver::run(&data)).unwrap_or_else(|e| {
            eprintln!("rc_fuzz_state: seed {seed} failed; replay with RDMX_FUZZ_ITERS=1 RDMX_FUZZ_SEED={seed}");
            std::panic::resume_unwind(e)
        });
        total += stats;
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "rc_fuzz_state: {iters} programs (seeds {first}..{}) in {secs:.1} s: {total:?}",
        first + iters
    );
    // Every state was reached, and traffic flowed.
    assert!(total.in_state.iter().all(|&n| n > 0), "{total:?}");
    assert!(
        total.packets_delivered > 0 && total.completions > 0,
        "{total:?}"
    );
}

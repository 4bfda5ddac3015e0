//! Stateful fuzzing of the RC engine: the input is a program for two QPs backed by
//! `VecMemory` (modify through every state, posts, well-framed arbitrary packets, link
//! delivery, timers, revoked memory) with the engine's invariants checked after every step;
//! see fuzz/driver/rc_qp_state.rs. `cargo +nightly fuzz run rc_qp_state`. The same driver
//! runs on stable as tests/rc_fuzz_state.rs.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../driver/rc_qp_state.rs"]
mod driver;

fuzz_target!(|data: &[u8]| {
    driver::run(data);
});

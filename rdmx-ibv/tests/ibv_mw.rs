//! Memory windows through unmodified libibverbs, in C (`tests/c/ibv_mw.c`, its QP bring-up in
//! `tests/c/qp_pair.h`, built here with cc -Wall -Wextra -Werror and run under
//! `rdmx-ibv exec`): `ibv_alloc_mw` (type 1, 2; 3 refused), `IBV_WR_BIND_MW`, `ibv_bind_mw`,
//! `IBV_WR_LOCAL_INV`, `IBV_WR_SEND_WITH_INV`, `ibv_dealloc_mw`; the completions' opcodes
//! and statuses (IBV_WC_BIND_MW, IBV_WC_LOCAL_INV, IBV_WC_MW_BIND_ERR for a region without
//! MW_BIND or a range outside it, LOC_QP_OP_ERR for invalidating a type-1 window, a receive
//! with IBV_WC_WITH_INV and `invalidated_rkey`, REM_INV_REQ_ERR for an rkey a SEND_WITH_INV
//! may not end); what the rkey opens (its range and rights, on its QP, until invalidated
//! or deallocated: otherwise IBV_WC_REM_ACCESS_ERR at the requester); the region's own
//! rkey opening nothing; `ibv_dereg_mr` refused (EBUSY) while a window is
//! bound; a bind's completion waiting for a SEND posted before it.
//!
//! The rules themselves are unit-tested in `src/provider/soft/window.rs` and `mr.rs`, the
//! completion order in `src/provider/soft/qp/local.rs`.

mod ibv_support;

use ibv_support::*;

#[test]
fn c_program_memory_windows() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_tool("cc");
    skip_unless_platform!();
    let exe = build_c("ibv_mw", "tests/c/ibv_mw.c", "gnu11", &[], &["-libverbs"]);
    let dir = exe.parent().unwrap();
    let out = run_alone(dir, "ibv_mw", "127.0.93.2", &[exe.to_str().unwrap()]);
    assert!(out.contains("ibv_mw: all passed"), "{out}");
}

//! The memory window ops: `alloc_mw`, `dealloc_mw`, `bind_mw` (`ibv_bind_mw`, type 1),
//! and the conversion of the send WRs `IBV_WR_BIND_MW` and `IBV_WR_LOCAL_INV` that
//! `post_send` hands to [`crate::verbs::Qp::post_local`] (see `verbs/mw.rs`).
//! `IBV_WR_SEND_WITH_INV` is no local op: it is a SEND the RC engine sends with an IETH
//! (`glue/objects.rs` posts it like a SEND).

use super::objects::{c_zeroed, free_obj, mr_inner, obj, pd_obj_inner, rc_qp_inner};
use super::{fail, fail_post, guard, set_errno};
use crate::verbs::{BindMr, BindWr, LocalOp, MW_TYPE_1, Mw};
use rdma_sys::{ibv_mw, ibv_mw_bind, ibv_mw_bind_info, ibv_pd, ibv_qp, ibv_send_wr};
use std::ffi::c_int;
use std::ptr::null_mut;
use std::sync::Arc;

const MAGIC_MW: u64 = 0x7264_6d78_4d57_0006;

/// `IBV_WR_LOCAL_INV`, `IBV_WR_BIND_MW`.
const WR_LOCAL_INV: u32 = 7;
const WR_BIND_MW: u32 = 8;

#[repr(C)]
struct MwObj {
    mw: ibv_mw,
    magic: u64,
    inner: Option<Arc<Mw>>,
}

/// The live window behind `mw`, if it is one of ours.
///
/// # Safety
/// `mw` is NULL or points to a `struct ibv_mw` (of ours, as libibverbs dispatches).
unsafe fn mw_inner<'a>(mw: *mut ibv_mw) -> Option<&'a Arc<Mw>> {
    // SAFETY: forwarded contract.
    unsafe { obj::<MwObj>(mw.cast(), |o| o.magic, MAGIC_MW) }.and_then(|o| o.inner.as_ref())
}

/// `ibv_inc_rkey` (verbs.h): the next key of a window, its low 8 bits incremented.
fn inc_rkey(rkey: u32) -> u32 {
    (rkey & 0xffff_ff00) | (rkey.wrapping_add(1) & 0xff)
}

/// Whether `opcode` is a local operation `post_send` hands to `post_local`.
pub(super) fn is_local(opcode: u32) -> bool {
    opcode == WR_LOCAL_INV || opcode == WR_BIND_MW
}

/// A bind of `mw` with the key `rkey` and the caller's `info`; errno when `info.mr` is not
/// a live MR of ours.
///
/// # Safety
/// `info.mr` is NULL or an MR pointer the caller got from `ibv_reg_mr`.
unsafe fn bind_op(
    wr_id: u64,
    send_flags: u32,
    mw: &Arc<Mw>,
    rkey: u32,
    info: &ibv_mw_bind_info,
) -> Result<LocalOp, c_int> {
    let mr = if info.mr.is_null() {
        None
    } else {
        // SAFETY: per the contract.
        let Some(m) = (unsafe { mr_inner(info.mr) }) else {
            return Err(libc::EINVAL);
        };
        Some(BindMr {
            lkey: m.lkey,
            pd: Arc::clone(m.pd()),
            mw_bind: m.mw_bind(),
        })
    };
    Ok(LocalOp::Bind(BindWr {
        wr_id,
        send_flags,
        mw: Arc::clone(mw),
        rkey,
        mr,
        addr: info.addr,
        length: info.length,
        access: info.mw_access_flags,
    }))
}

/// Converts a send WR of a local opcode ([`is_local`]); errno when it names no window or
/// region of ours.
///
/// # Safety
/// `w` is the caller's WR; for BIND_MW its `bind_mw` member is the one in use.
pub(super) unsafe fn local_op(w: &ibv_send_wr) -> Result<LocalOp, c_int> {
    if w.opcode == WR_LOCAL_INV {
        return Ok(LocalOp::LocalInv {
            wr_id: w.wr_id,
            send_flags: w.send_flags,
            // SAFETY: for *_INV opcodes the union holds the rkey to invalidate.
            rkey: unsafe { w.imm_data_invalidated_rkey_union.invalidated_rkey },
        });
    }
    // SAFETY: BIND_MW uses the bind_mw member (rxe's `convert_send_wr`).
    let b = unsafe { &w.bind_mw_tso_union.bind_mw };
    if w.num_sge != 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's window pointer.
    let Some(mw) = (unsafe { mw_inner(b.mw) }) else {
        return Err(libc::EINVAL);
    };
    // SAFETY: the caller's MR pointer.
    unsafe { bind_op(w.wr_id, w.send_flags, mw, b.rkey, &b.bind_info) }
}

pub(crate) unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, type_: u32) -> *mut ibv_mw {
    guard("alloc_mw", null_mut(), || {
        // SAFETY: libibverbs passes a PD of ours.
        let Some(p) = (unsafe { pd_obj_inner(pd) }) else {
            set_errno(libc::EINVAL);
            return null_mut();
        };
        let mut b = Box::new(MwObj {
            mw: c_zeroed(),
            magic: 0,
            inner: None,
        });
        let handle = &*b as *const MwObj as u64;
        let m = match p.alloc_mw(type_, handle) {
            Ok(m) => m,
            Err(e) => {
                set_errno(fail("alloc_mw", &e));
                return null_mut();
            }
        };
        // SAFETY: pd is a live PD of ours.
        b.mw.context = unsafe { (*pd).context };
        b.mw.pd = pd;
        b.mw.rkey = m.rkey();
        b.mw.handle = 0;
        b.mw.type_ = type_;
        b.inner = Some(m);
        b.magic = MAGIC_MW;
        Box::into_raw(b).cast()
    })
}

pub(crate) unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    guard("dealloc_mw", libc::EIO, || {
        // SAFETY: libibverbs passes a window it got from alloc_mw.
        let Some(m) = (unsafe { mw_inner(mw) }) else {
            return libc::EINVAL;
        };
        if let Err(e) = m.dealloc() {
            return fail("dealloc_mw", &e);
        }
        // SAFETY: ours, deallocated; the caller does not use it afterwards.
        unsafe { free_obj(mw.cast::<MwObj>(), |o| o.magic = 0) };
        0
    })
}

/// `ibv_bind_mw` (libibverbs checked the type is 1 and the PDs): posts a bind WR with the
/// window's next key and, once posted, sets `mw->rkey` to it (as rxe: an application that
/// gets an error completion undoes that).
pub(crate) unsafe extern "C" fn bind_mw(
    qp: *mut ibv_qp,
    mw: *mut ibv_mw,
    mw_bind: *mut ibv_mw_bind,
) -> c_int {
    guard("bind_mw", libc::EIO, || {
        // SAFETY: libibverbs passes a QP and a window of ours, and the caller's bind.
        let (Some(q), Some(m), Some(b)) = (
            unsafe { rc_qp_inner(qp) },
            unsafe { mw_inner(mw) },
            unsafe { mw_bind.as_ref() },
        ) else {
            return libc::EINVAL;
        };
        if m.kind() != MW_TYPE_1 {
            return libc::EINVAL;
        }
        // SAFETY: mw is live (checked above).
        let rkey = inc_rkey(unsafe { (*mw).rkey });
        // SAFETY: the caller's bind info.
        let op = match unsafe { bind_op(b.wr_id, b.send_flags, m, rkey, &b.bind_info) } {
            Ok(op) => op,
            Err(errno) => return errno,
        };
        if let Err(e) = q.post_local(&op) {
            return fail_post("bind_mw", &e);
        }
        // SAFETY: as above.
        unsafe { (*mw).rkey = rkey };
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inc_rkey_changes_only_the_key_byte() {
        assert_eq!(inc_rkey(0x8123_45fe), 0x8123_45ff);
        assert_eq!(inc_rkey(0x8123_45ff), 0x8123_4500);
    }
}

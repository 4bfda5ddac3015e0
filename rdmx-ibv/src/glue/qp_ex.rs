//! `ibv_create_qp_ex`: the extended QP constructor, as far as this device goes. libibverbs
//! itself sends a `comp_mask` of exactly IBV_QP_INIT_ATTR_PD to `create_qp`; anything else
//! arrives here. Accepted, as rxe (`providers/rxe/rxe.c`, `check_qp_init_attr`): PD
//! (required: no XRC domains here) and CREATE_FLAGS with no flag set. Refused with
//! EOPNOTSUPP, as rxe refuses what it lacks: any other `comp_mask` bit (XRCD, MAX_TSO_HEADER,
//! IND_TABLE, RX_HASH, SEND_OPS_FLAGS: the `ibv_wr_*` posting API is not implemented, so
//! `ibv_qp_to_qp_ex` stays NULL) and any create flag. Everything else (QP type, caps, CQs,
//! SRQ) is `create_qp`'s, which this calls.

use super::objects::create_qp;
use super::{guard, set_errno};
use rdma_sys::{ibv_context, ibv_qp, ibv_qp_init_attr, ibv_qp_init_attr_ex};
use std::ptr::null_mut;

/// `IBV_QP_INIT_ATTR_PD`.
const MASK_PD: u32 = 1 << 0;
/// `IBV_QP_INIT_ATTR_CREATE_FLAGS`.
const MASK_CREATE_FLAGS: u32 = 1 << 2;

/// Why `attr` cannot be created here, as (errno, message); None when it can.
pub(crate) fn refusal(attr: &ibv_qp_init_attr_ex) -> Option<(i32, String)> {
    let unsupported = attr.comp_mask & !(MASK_PD | MASK_CREATE_FLAGS);
    if unsupported != 0 {
        return Some((
            libc::EOPNOTSUPP,
            format!(
                "comp_mask bits {unsupported:#x} not supported (XRCD, TSO, RSS, send_ops_flags)"
            ),
        ));
    }
    if attr.comp_mask & MASK_CREATE_FLAGS != 0 && attr.create_flags != 0 {
        return Some((
            libc::EOPNOTSUPP,
            format!("create_flags {:#x} not supported", attr.create_flags),
        ));
    }
    if attr.comp_mask & MASK_PD == 0 || attr.pd.is_null() {
        return Some((
            libc::EINVAL,
            "a PD is required (comp_mask IBV_QP_INIT_ATTR_PD)".into(),
        ));
    }
    None
}

/// The provider op `create_qp_ex` (see the module comment).
///
/// # Safety
/// libibverbs' contract: `ctx` is a context of ours, `attr` the caller's attributes.
pub(crate) unsafe extern "C" fn create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard("create_qp_ex", null_mut(), || {
        // SAFETY: NULL or the caller's attributes.
        let Some(a) = (unsafe { attr.as_mut() }) else {
            set_errno(libc::EINVAL);
            return null_mut();
        };
        if let Some((errno, why)) = refusal(a) {
            log::debug!("rdmx-ibv: ibv_create_qp_ex: {why}");
            set_errno(errno);
            return null_mut();
        }
        // SAFETY: the PD is the caller's (create_qp checks it is one of ours); ctx is ours.
        if unsafe { (*a.pd).context } != ctx {
            set_errno(libc::EINVAL);
            return null_mut();
        }
        let mut init = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
        };
        // SAFETY: create_qp's contract is this function's.
        let qp = unsafe { create_qp(a.pd, &mut init) };
        if !qp.is_null() {
            // The granted capabilities, as create_qp reports them.
            a.cap = init.cap;
        }
        qp
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(comp_mask: u32, create_flags: u32, pd: bool) -> ibv_qp_init_attr_ex {
        // SAFETY: all-zero is a valid ibv_qp_init_attr_ex (pointers NULL, integers 0).
        let mut a: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
        a.comp_mask = comp_mask;
        a.create_flags = create_flags;
        if pd {
            a.pd = std::ptr::NonNull::dangling().as_ptr();
        }
        a
    }

    #[test]
    fn comp_mask_and_create_flags_are_checked_as_rxe() {
        assert!(refusal(&attr(MASK_PD, 0, true)).is_none());
        assert!(refusal(&attr(MASK_PD | MASK_CREATE_FLAGS, 0, true)).is_none());
        for bit in [1 << 1, 1 << 3, 1 << 4, 1 << 5, 1 << 6] {
            let r = refusal(&attr(MASK_PD | bit, 0, true)).unwrap();
            assert_eq!(r.0, libc::EOPNOTSUPP, "comp_mask bit {bit:#x}");
        }
        let r = refusal(&attr(MASK_PD | MASK_CREATE_FLAGS, 2, true)).unwrap();
        assert_eq!(r.0, libc::EOPNOTSUPP);
        assert_eq!(refusal(&attr(0, 0, true)).unwrap().0, libc::EINVAL);
        assert_eq!(refusal(&attr(MASK_PD, 0, false)).unwrap().0, libc::EINVAL);
    }
}

//! Address handle ops (`ibv_create_ah`, `ibv_destroy_ah`) for UD sends. The object is a
//! box whose first member is `struct ibv_ah` (libibverbs fills its `context` and `pd`
//! after `create_ah` returns), then a magic word, then the [`crate::verbs::Ah`].
//! Multicast (`ibv_attach_mcast`/`ibv_detach_mcast`) is not implemented: libibverbs'
//! dummy ops answer EOPNOTSUPP.

use super::objects::{ah_from_ibv, c_zeroed, pd_obj_inner};
use super::{fail, guard, set_errno};
use crate::verbs::Ah;
use rdma_sys::{ibv_ah, ibv_ah_attr, ibv_pd};
use std::ffi::c_int;
use std::ptr::null_mut;
use std::sync::Arc;

const MAGIC_AH: u64 = 0x7264_6d78_4148_0006;

#[repr(C)]
struct AhObj {
    ah: ibv_ah,
    magic: u64,
    inner: Option<Arc<Ah>>,
}

/// The verbs AH behind `ah`, if it is a live one of ours.
///
/// # Safety
/// `ah` is NULL or a pointer an application got from `ibv_create_ah` (of any provider:
/// a foreign one is told apart by the magic word only if it is at least as large).
pub(crate) unsafe fn ah_of(ah: *mut ibv_ah) -> Option<Arc<Ah>> {
    if ah.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    let o = unsafe { &*ah.cast::<AhObj>() };
    (o.magic == MAGIC_AH).then(|| o.inner.clone()).flatten()
}

pub(crate) unsafe extern "C" fn create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard("create_ah", null_mut(), || {
        // SAFETY: libibverbs passes a PD of ours and the caller's attributes.
        let (Some(p), Some(a)) = (unsafe { pd_obj_inner(pd) }, unsafe { attr.as_ref() }) else {
            set_errno(libc::EINVAL);
            return null_mut();
        };
        let ah = match Ah::new(&p, &ah_from_ibv(a)) {
            Ok(ah) => ah,
            Err(e) => {
                set_errno(fail("create_ah", &e));
                return null_mut();
            }
        };
        let mut b = Box::new(AhObj {
            ah: c_zeroed(),
            magic: 0,
            inner: None,
        });
        b.ah.pd = pd;
        // SAFETY: a PD of ours holds its context.
        b.ah.context = unsafe { (*pd).context };
        b.inner = Some(ah);
        b.magic = MAGIC_AH;
        Box::into_raw(b).cast()
    })
}

pub(crate) unsafe extern "C" fn destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard("destroy_ah", libc::EIO, || {
        if ah.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: libibverbs passes an AH it got from create_ah.
        let o = unsafe { &mut *ah.cast::<AhObj>() };
        if o.magic != MAGIC_AH {
            return libc::EINVAL;
        }
        if let Some(inner) = &o.inner
            && let Err(e) = inner.destroy()
        {
            return fail("destroy_ah", &e);
        }
        o.magic = 0;
        // SAFETY: ours (magic), destroyed by this call alone; no event record names an AH,
        // and a UD post copies the AH's address, so nothing reads the box afterwards.
        drop(unsafe { Box::from_raw(ah.cast::<AhObj>()) });
        0
    })
}

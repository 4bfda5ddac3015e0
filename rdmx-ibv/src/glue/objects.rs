//! The verbs objects' ops: PD, MR, CQ, SRQ, QP, posting and polling.
//!
//! Each object handed to libibverbs is a `Box` of a `#[repr(C)]` struct whose first member
//! is the libibverbs structure (`struct ibv_pd`, `struct verbs_mr`, `struct verbs_cq`,
//! `struct verbs_srq`, `struct verbs_qp`), so the pointer libibverbs keeps is the box's
//! address; that address is the `handle` of the [`crate::verbs`] object inside, which is
//! what completion channel records and async events carry back. A `magic` word after it
//! tells our objects from anything else passed in (and from destroyed ones, best effort).
//!
//! Return conventions are libibverbs' (as `providers/rxe/rxe.c`): constructors return NULL
//! and set errno; destroy/modify/query/notify return an errno; posts return an errno and
//! set `*bad_wr`; poll returns the count or a negative value.

use super::channel;
use super::context::{device_of, state};
use super::retire::{Retired, read_locked};
use super::{fail, fail_post, guard, set_errno};
use crate::abi::{IBV_MR_TYPE_MR, verbs_cq, verbs_mr, verbs_qp, verbs_srq};
use crate::verbs::{
    self, AhAttr, Cq, InitAttr, Mr, Pd, QPT_UD, Qp, QpAttr, QpCap, RecvWr, SendWr, Sge, SgeList,
    Srq, SrqAttr, UdQp, UdSendWr, WorkCompletion, WrOpcode, attr_mask,
};
use rdma_sys::{
    ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_mr, ibv_pd, ibv_qp, ibv_qp_attr,
    ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr, ibv_sge, ibv_srq, ibv_srq_attr, ibv_srq_init_attr,
    ibv_wc,
};
use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::Arc;

const MAGIC_PD: u64 = 0x7264_6d78_5044_0001;
const MAGIC_MR: u64 = 0x7264_6d78_4d52_0002;
const MAGIC_CQ: u64 = 0x7264_6d78_4351_0003;
const MAGIC_SRQ: u64 = 0x7264_6d78_5352_0004;
const MAGIC_QP: u64 = 0x7264_6d78_5150_0005;

/// `IBV_QP_CUR_STATE` (`enum ibv_qp_attr_mask`).
const IBV_QP_CUR_STATE: u32 = 1 << 1;

/// Longest work request chain one post walks (a longer one, or a cycle, is EINVAL).
const MAX_CHAIN: usize = 1 << 16;
/// Most SGEs read from one work request (the device allows fewer; more is EINVAL).
const MAX_SGE_READ: c_int = 1024;

#[repr(C)]
struct PdObj {
    pd: ibv_pd,
    magic: u64,
    inner: Option<Arc<Pd>>,
}

#[repr(C)]
struct MrObj {
    vmr: verbs_mr,
    magic: u64,
    inner: Option<Mr>,
}

#[repr(C)]
struct CqObj {
    vcq: verbs_cq,
    magic: u64,
    inner: Option<Arc<Cq>>,
}

#[repr(C)]
struct SrqObj {
    vsrq: verbs_srq,
    magic: u64,
    inner: Option<Arc<Srq>>,
}

#[repr(C)]
struct QpObj {
    vqp: verbs_qp,
    magic: u64,
    /// An RC QP, or (`ud`) a UD one; never both.
    inner: Option<Arc<Qp>>,
    ud: Option<Arc<UdQp>>,
}

/// An all-zero C struct (bindgen: integers, raw pointers, arrays, unions and
/// `Option<fn>`, for each of which all-zero is valid: NULL, 0, None), as libibverbs'
/// providers `calloc` theirs. The Rust fields of our objects are written explicitly
/// beside it: nothing assumes what an all-zero `Option` is.
pub(super) fn c_zeroed<T: CStruct>() -> T {
    // SAFETY: `CStruct` promises that all-zero is a valid `T`.
    unsafe { std::mem::zeroed() }
}

/// The C structs our objects embed (rdma-sys's, and `abi`'s `verbs_*` that wrap them), for
/// which all-zero is a valid value.
///
/// # Safety
/// Implement only for C structs whose every field is valid all-zero.
pub(super) unsafe trait CStruct {}
// SAFETY: plain C data (integers, pointers, unions, `Option<fn>`).
unsafe impl CStruct for ibv_pd {}
// SAFETY: plain C data (integers, pointers, unions, `Option<fn>`).
unsafe impl CStruct for verbs_mr {}
// SAFETY: plain C data (integers, pointers, unions, `Option<fn>`).
unsafe impl CStruct for verbs_cq {}
// SAFETY: plain C data (integers, pointers, unions, `Option<fn>`).
unsafe impl CStruct for verbs_srq {}
// SAFETY: plain C data (integers, pointers, unions, `Option<fn>`).
unsafe impl CStruct for verbs_qp {}
// SAFETY: plain C data (integers, pointers, unions, `Option<fn>`).
unsafe impl CStruct for rdma_sys::ibv_mw {}
// SAFETY: plain C data (integers, pointers, unions, `Option<fn>`).
unsafe impl CStruct for rdma_sys::ibv_ah {}

/// Looks up our object behind `ptr` (the address of its first member) if its magic word
/// matches.
///
/// # Safety
/// `ptr` is NULL or points to at least `size_of::<T>()` readable bytes (an object of this
/// provider, as libibverbs only dispatches ours here).
pub(super) unsafe fn obj<'a, T>(
    ptr: *mut c_void,
    magic_of: impl Fn(&T) -> u64,
    magic: u64,
) -> Option<&'a T> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    let o = unsafe { &*ptr.cast::<T>() };
    (magic_of(o) == magic).then_some(o)
}

unsafe fn pd_obj<'a>(pd: *mut ibv_pd) -> Option<&'a PdObj> {
    // SAFETY: forwarded contract.
    unsafe { obj::<PdObj>(pd.cast(), |o| o.magic, MAGIC_PD) }
}
unsafe fn cq_obj<'a>(cq: *mut ibv_cq) -> Option<&'a CqObj> {
    // SAFETY: forwarded contract.
    unsafe { obj::<CqObj>(cq.cast(), |o| o.magic, MAGIC_CQ) }
}
unsafe fn srq_obj<'a>(srq: *mut ibv_srq) -> Option<&'a SrqObj> {
    // SAFETY: forwarded contract.
    unsafe { obj::<SrqObj>(srq.cast(), |o| o.magic, MAGIC_SRQ) }
}
unsafe fn qp_obj<'a>(qp: *mut ibv_qp) -> Option<&'a QpObj> {
    // SAFETY: forwarded contract.
    unsafe { obj::<QpObj>(qp.cast(), |o| o.magic, MAGIC_QP) }
}

/// The verbs PD behind `pd`, if it is a live one of ours.
///
/// # Safety
/// As [`obj`].
pub(super) unsafe fn pd_obj_inner(pd: *mut ibv_pd) -> Option<Arc<Pd>> {
    // SAFETY: forwarded contract.
    unsafe { pd_obj(pd) }.and_then(|o| o.inner.clone())
}

/// The live MR behind `mr`, if it is one of ours.
///
/// # Safety
/// As [`obj`].
pub(super) unsafe fn mr_inner<'a>(mr: *mut ibv_mr) -> Option<&'a Mr> {
    // SAFETY: forwarded contract.
    unsafe { obj::<MrObj>(mr.cast(), |o| o.magic, MAGIC_MR) }.and_then(|o| o.inner.as_ref())
}

/// The RC QP behind `qp`, if it is one of ours of that type.
///
/// # Safety
/// As [`obj`].
pub(super) unsafe fn rc_qp_inner<'a>(qp: *mut ibv_qp) -> Option<&'a Arc<Qp>> {
    // SAFETY: forwarded contract.
    unsafe { qp_obj(qp) }.and_then(|o| o.inner.as_ref())
}

/// The UD QP behind `qp`, if it is one of ours of that type.
///
/// # Safety
/// As [`obj`].
unsafe fn ud_obj<'a>(qp: *mut ibv_qp) -> Option<&'a Arc<UdQp>> {
    // SAFETY: forwarded contract.
    unsafe { qp_obj(qp) }.and_then(|o| o.ud.as_ref())
}

fn init_mutex_cond(mutex: *mut c_void, cond: *mut c_void) {
    // SAFETY: both point to zeroed pthread objects inside a box we own.
    unsafe {
        libc::pthread_mutex_init(mutex.cast(), std::ptr::null());
        libc::pthread_cond_init(cond.cast(), std::ptr::null());
    }
}

// ---- PD and MR --------------------------------------------------------------------

pub(crate) unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    guard("alloc_pd", null_mut(), || {
        // SAFETY: libibverbs dispatches only contexts of ours here.
        let dev = match unsafe { device_of(ctx) } {
            Ok(d) => d,
            Err(e) => {
                set_errno(e);
                return null_mut();
            }
        };
        let mut b = Box::new(PdObj {
            pd: c_zeroed(),
            magic: 0,
            inner: None,
        });
        let handle = &*b as *const PdObj as u64;
        b.pd.context = ctx;
        b.inner = Some(Pd::new(&dev, handle));
        b.magic = MAGIC_PD;
        Box::into_raw(b).cast()
    })
}

pub(crate) unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    guard("dealloc_pd", libc::EIO, || {
        // SAFETY: libibverbs passes a PD it got from alloc_pd.
        let Some(o) = (unsafe { pd_obj(pd) }) else {
            return libc::EINVAL;
        };
        if let Some(inner) = &o.inner {
            if let Err(e) = inner.destroy() {
                return fail("dealloc_pd", &e);
            }
        }
        // SAFETY: the object is ours (magic) and no longer used by anything (destroy
        // succeeded: no MR, QP or SRQ left).
        unsafe { free_obj(pd.cast::<PdObj>(), |o| o.magic = 0) };
        0
    })
}

/// Drops a boxed object after `clear` (which clears its magic word).
///
/// # Safety
/// `p` came from `Box::into_raw` of a `T` and is not used afterwards.
pub(super) unsafe fn free_obj<T>(p: *mut T, clear: impl FnOnce(&mut T)) {
    // SAFETY: per the contract.
    let mut b = unsafe { Box::from_raw(p) };
    clear(&mut b);
    drop(b);
}

/// Frees a boxed object.
///
/// # Safety
/// `p` came from `Box::into_raw` of a `T` and is not used afterwards.
unsafe fn free_box<T>(p: usize) {
    // SAFETY: per the contract.
    drop(unsafe { Box::from_raw(p as *mut T) });
}

/// Ends the life of an object whose destroy succeeded: `clear` (which clears its magic
/// word and drops its rdmx part) runs now; its memory is freed now, or once the
/// application has acknowledged the `written` event records that name it (`acked` reads
/// its count; see [`super::retire`]).
///
/// # Safety
/// `p` came from `Box::into_raw` of a `T` of the context `ctx`, its destroy succeeded (no
/// record is written about it any more), and the caller does not use it afterwards.
unsafe fn retire<T>(
    p: *mut T,
    ctx: *mut ibv_context,
    written: u64,
    acked: unsafe fn(usize) -> u32,
    clear: impl FnOnce(&mut T),
) {
    // SAFETY: per the contract, the box is live and ours alone.
    clear(unsafe { &mut *p });
    let r = Retired {
        ptr: p as usize,
        written,
        acked,
        free: free_box::<T>,
    };
    // SAFETY: ctx is the object's context (alive while its objects are); the object is
    // handed to its list, which alone frees it.
    unsafe {
        match state(ctx) {
            Some(s) => s.retired.retire(r),
            None => free_box::<T>(r.ptr),
        }
    }
}

/// A CQ, SRQ or QP object: destroyed the same way (see [`destroy_obj`]).
trait EventObj {
    /// `destroy` for a CQ, SRQ or QP; the verbs object's records written (final after it).
    fn destroy_inner(&self) -> Option<Result<u64, rdmx::error::Error>>;
    fn magic(&self) -> u64;
    /// The object's `struct ibv_context *`.
    fn context(&self) -> *mut ibv_context;
    /// Clears the magic word and drops the verbs object.
    fn clear(&mut self);
}

macro_rules! event_obj {
    ($t:ty, |$o:ident| $ctx:expr) => {
        impl EventObj for $t {
            fn destroy_inner(&self) -> Option<Result<u64, rdmx::error::Error>> {
                let i = self.inner.as_ref()?;
                Some(i.destroy().map(|()| i.events_written()))
            }
            fn magic(&self) -> u64 {
                self.magic
            }
            fn context(&self) -> *mut ibv_context {
                let $o = self;
                $ctx
            }
            fn clear(&mut self) {
                self.magic = 0;
                self.inner = None;
            }
        }
    };
}
event_obj!(CqObj, |o| {
    // SAFETY: every member of verbs_cq's union starts with the plain `struct ibv_cq`.
    unsafe { o.vcq.cq.context }
});
event_obj!(SrqObj, |o| o.vsrq.srq.context);
impl EventObj for QpObj {
    fn destroy_inner(&self) -> Option<Result<u64, rdmx::error::Error>> {
        if let Some(u) = &self.ud {
            // A UD QP raises no async event.
            return Some(u.destroy().map(|()| 0));
        }
        let i = self.inner.as_ref()?;
        Some(i.destroy().map(|()| i.events_written()))
    }
    fn magic(&self) -> u64 {
        self.magic
    }
    fn context(&self) -> *mut ibv_context {
        // SAFETY: every member of verbs_qp's union starts with the plain `struct ibv_qp`.
        unsafe { self.vqp.u.qp.context }
    }
    fn clear(&mut self) {
        self.magic = 0;
        self.inner = None;
        self.ud = None;
    }
}

/// `ibv_destroy_cq`/`_srq`/`_qp`: destroys the verbs object (its own rules: EBUSY while
/// used, EINVAL when destroyed already, so only one call gets past this), then retires the
/// box: freed once the application acknowledged the event records written about it.
///
/// # Safety
/// `p` is NULL or an object handed out by this provider's create op of type `T`.
unsafe fn destroy_obj<T: EventObj>(
    p: *mut c_void,
    magic: u64,
    acked: unsafe fn(usize) -> u32,
) -> c_int {
    // SAFETY: per the contract.
    let Some(o) = (unsafe { obj::<T>(p, |o| o.magic(), magic) }) else {
        return libc::EINVAL;
    };
    let ctx = o.context();
    let written = match o.destroy_inner() {
        Some(Ok(w)) => w,
        Some(Err(e)) => return fail("destroy", &e),
        None => 0,
    };
    // SAFETY: ours, destroyed by this call alone (a second destroy fails above). The mutex
    // and cond libibverbs initialised hold no resources on Linux.
    unsafe { retire(p.cast::<T>(), ctx, written, acked, |o| o.clear()) };
    0
}

/// `ibv_qp.events_completed`.
unsafe fn qp_acked(p: usize) -> u32 {
    let q = p as *mut ibv_qp;
    // SAFETY: a live QpObj, whose first member is the ibv_qp (mutex initialised at create).
    unsafe {
        read_locked(
            (&raw mut (*q).mutex).cast(),
            &raw const (*q).events_completed,
        )
    }
}

/// `ibv_srq.events_completed`.
unsafe fn srq_acked(p: usize) -> u32 {
    let q = p as *mut ibv_srq;
    // SAFETY: a live SrqObj, whose first member is the ibv_srq.
    unsafe {
        read_locked(
            (&raw mut (*q).mutex).cast(),
            &raw const (*q).events_completed,
        )
    }
}

/// `ibv_cq.comp_events_completed` (the provider raises no CQ async event).
unsafe fn cq_acked(p: usize) -> u32 {
    let c = p as *mut ibv_cq;
    // SAFETY: a live CqObj, whose first member is the ibv_cq.
    unsafe {
        read_locked(
            (&raw mut (*c).mutex).cast(),
            &raw const (*c).comp_events_completed,
        )
    }
}

pub(crate) unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    _hca_va: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard("reg_mr", null_mut(), || {
        // SAFETY: libibverbs passes a PD of ours.
        let Some(p) = (unsafe { pd_obj(pd) }).and_then(|o| o.inner.clone()) else {
            set_errno(libc::EINVAL);
            return null_mut();
        };
        let mut b = Box::new(MrObj {
            vmr: c_zeroed(),
            magic: 0,
            inner: None,
        });
        let handle = &*b as *const MrObj as u64;
        // SAFETY: verbs' contract: the application keeps the range mapped until
        // ibv_dereg_mr succeeds (the same promise a NIC's DMA relies on).
        let mr = match unsafe { p.reg_mr(addr.cast(), length, access as u32, handle) } {
            Ok(m) => m,
            Err(e) => {
                set_errno(fail("reg_mr", &e));
                return null_mut();
            }
        };
        let m = &mut b.vmr.ibv_mr;
        m.context = b_context_of(pd);
        m.pd = pd;
        m.addr = addr;
        m.length = length;
        m.lkey = mr.lkey;
        m.rkey = mr.rkey;
        b.vmr.mr_type = IBV_MR_TYPE_MR;
        b.vmr.access = access;
        b.inner = Some(mr);
        b.magic = MAGIC_MR;
        Box::into_raw(b).cast()
    })
}

fn b_context_of(pd: *mut ibv_pd) -> *mut ibv_context {
    // SAFETY: pd is a live PD of ours (checked by the caller).
    unsafe { (*pd).context }
}

pub(crate) unsafe extern "C" fn dereg_mr(vmr: *mut verbs_mr) -> c_int {
    guard("dereg_mr", libc::EIO, || {
        // SAFETY: libibverbs passes an MR it got from reg_mr.
        let Some(o) = (unsafe { obj::<MrObj>(vmr.cast(), |o| o.magic, MAGIC_MR) }) else {
            return libc::EINVAL;
        };
        if let Some(inner) = &o.inner {
            if let Err(e) = inner.dereg() {
                return fail("dereg_mr", &e);
            }
        }
        // SAFETY: ours, deregistered.
        unsafe { free_obj(vmr.cast::<MrObj>(), |o| o.magic = 0) };
        0
    })
}

// ---- CQ ---------------------------------------------------------------------------

pub(crate) unsafe extern "C" fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    chan: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    guard("create_cq", null_mut(), || {
        // SAFETY: libibverbs dispatches only contexts of ours here.
        let dev = match unsafe { device_of(ctx) } {
            Ok(d) => d,
            Err(e) => {
                set_errno(e);
                return null_mut();
            }
        };
        if cqe < 1 {
            set_errno(libc::EINVAL);
            return null_mut();
        }
        // As the kernel's create_cq (comp_vector is unsigned there, so negative ones are
        // out of range too): EINVAL unless comp_vector < the context's num_comp_vectors.
        // SAFETY: ctx is a live context of ours (device_of checked it).
        let vectors = unsafe { (*ctx).num_comp_vectors };
        if comp_vector < 0 || comp_vector >= vectors {
            log::debug!(
                "rdmx-ibv: ibv_create_cq: comp_vector {comp_vector} out of range (num_comp_vectors {vectors})"
            );
            set_errno(libc::EINVAL);
            return null_mut();
        }
        let channel = if chan.is_null() {
            None
        } else {
            match channel::lookup(chan) {
                Some(c) => Some(c),
                None => {
                    log::error!(
                        "rdmx-ibv: ibv_create_cq: the completion channel was not made by \
                         rdmx-ibv (run the program under `rdmx-ibv exec`, which preloads the \
                         provider so that ibv_create_comp_channel makes rdmx channels)"
                    );
                    set_errno(libc::EINVAL);
                    return null_mut();
                }
            }
        };
        let mut b = Box::new(CqObj {
            vcq: c_zeroed(),
            magic: 0,
            inner: None,
        });
        let handle = &*b as *const CqObj as u64;
        let cq = match Cq::new(&dev, cqe as u32, channel, handle) {
            Ok(c) => c,
            Err(e) => {
                set_errno(fail("create_cq", &e));
                return null_mut();
            }
        };
        // SAFETY: writing the plain ibv_cq member of the union; libibverbs fills the rest
        // (verbs_init_cq).
        let base: &mut std::mem::ManuallyDrop<ibv_cq> = unsafe { &mut b.vcq.cq };
        base.cqe = cq.cqe().min(c_int::MAX as u32) as c_int;
        b.inner = Some(cq);
        b.magic = MAGIC_CQ;
        Box::into_raw(b).cast()
    })
}

pub(crate) unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    guard("destroy_cq", libc::EIO, || {
        // SAFETY: libibverbs passes a CQ it got from create_cq.
        unsafe { destroy_obj::<CqObj>(cq.cast(), MAGIC_CQ, cq_acked) }
    })
}

/// Completions converted per batch in `poll_cq` (stack buffer).
const POLL_BATCH: usize = 16;

pub(crate) unsafe extern "C" fn poll_cq(
    cq: *mut ibv_cq,
    num_entries: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    guard("poll_cq", -1, || {
        // SAFETY: libibverbs passes a CQ of ours.
        let Some(c) = (unsafe { cq_obj(cq) }).and_then(|o| o.inner.as_ref()) else {
            return -1;
        };
        if num_entries <= 0 {
            return 0;
        }
        if wc.is_null() {
            return -1;
        }
        let want = num_entries as usize;
        let mut done = 0usize;
        let mut buf = [WorkCompletion::default(); POLL_BATCH];
        while done < want {
            let n = (want - done).min(POLL_BATCH);
            let got = c.poll(&mut buf[..n]);
            for (i, w) in buf[..got].iter().enumerate() {
                // SAFETY: the caller's array has num_entries entries; done + i < want.
                let out = unsafe { &mut *wc.add(done + i) };
                out.wr_id = w.wr_id;
                out.status = w.status;
                out.opcode = w.opcode;
                out.vendor_err = w.vendor_err;
                out.byte_len = w.byte_len;
                out.imm_data_invalidated_rkey_union.imm_data = w.imm_data;
                out.qp_num = w.qp_num;
                out.src_qp = w.src_qp;
                out.wc_flags = w.wc_flags;
                out.pkey_index = w.pkey_index;
                out.slid = w.slid;
                out.sl = w.sl;
                out.dlid_path_bits = w.dlid_path_bits;
            }
            done += got;
            if got < n {
                break;
            }
        }
        done as c_int
    })
}

pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard("req_notify_cq", libc::EIO, || {
        // SAFETY: libibverbs passes a CQ of ours.
        let Some(c) = (unsafe { cq_obj(cq) }).and_then(|o| o.inner.as_ref()) else {
            return libc::EINVAL;
        };
        match c.req_notify(solicited_only != 0) {
            Ok(()) => 0,
            Err(e) => fail("req_notify_cq", &e),
        }
    })
}

// ---- SRQ --------------------------------------------------------------------------

pub(crate) unsafe extern "C" fn create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    guard("create_srq", null_mut(), || {
        // SAFETY: libibverbs passes a PD of ours and the caller's attributes.
        let (Some(p), Some(init)) = (
            unsafe { pd_obj(pd) }.and_then(|o| o.inner.clone()),
            unsafe { init.as_mut() },
        ) else {
            set_errno(libc::EINVAL);
            return null_mut();
        };
        let mut b = Box::new(SrqObj {
            vsrq: c_zeroed(),
            magic: 0,
            inner: None,
        });
        let handle = &*b as *const SrqObj as u64;
        let attr = SrqAttr {
            max_wr: init.attr.max_wr,
            max_sge: init.attr.max_sge,
            srq_limit: init.attr.srq_limit,
        };
        let srq = match Srq::new(&p, &attr, handle) {
            Ok(s) => s,
            Err(e) => {
                set_errno(fail("create_srq", &e));
                return null_mut();
            }
        };
        // verbs reports the sizes granted back in the init attributes.
        let got = srq.query();
        init.attr.max_wr = got.max_wr;
        init.attr.max_sge = got.max_sge;
        b.inner = Some(srq);
        b.magic = MAGIC_SRQ;
        Box::into_raw(b).cast()
    })
}

pub(crate) unsafe extern "C" fn modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    guard("modify_srq", libc::EIO, || {
        // SAFETY: libibverbs passes an SRQ of ours and the caller's attributes.
        let (Some(s), Some(a)) = (
            unsafe { srq_obj(srq) }.and_then(|o| o.inner.as_ref()),
            unsafe { attr.as_ref() },
        ) else {
            return libc::EINVAL;
        };
        let v = SrqAttr {
            max_wr: a.max_wr,
            max_sge: a.max_sge,
            srq_limit: a.srq_limit,
        };
        match s.modify(&v, mask as u32) {
            Ok(()) => 0,
            Err(e) => fail("modify_srq", &e),
        }
    })
}

pub(crate) unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    guard("query_srq", libc::EIO, || {
        // SAFETY: libibverbs passes an SRQ of ours and the caller's attributes.
        let (Some(s), Some(a)) = (
            unsafe { srq_obj(srq) }.and_then(|o| o.inner.as_ref()),
            unsafe { attr.as_mut() },
        ) else {
            return libc::EINVAL;
        };
        let q = s.query();
        a.max_wr = q.max_wr;
        a.max_sge = q.max_sge;
        a.srq_limit = q.srq_limit;
        0
    })
}

pub(crate) unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    guard("destroy_srq", libc::EIO, || {
        // SAFETY: libibverbs passes an SRQ it got from create_srq.
        unsafe { destroy_obj::<SrqObj>(srq.cast(), MAGIC_SRQ, srq_acked) }
    })
}

pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard("post_srq_recv", libc::EIO, || {
        // SAFETY: libibverbs passes an SRQ of ours.
        let Some(s) = (unsafe { srq_obj(srq) }).and_then(|o| o.inner.as_ref()) else {
            set_bad(bad_wr, wr);
            return libc::EINVAL;
        };
        // SAFETY: wr is the caller's chain.
        unsafe { post_recv_chain(wr, bad_wr, |wrs| s.post_recv(wrs)) }
    })
}

// ---- QP ---------------------------------------------------------------------------

pub(crate) unsafe extern "C" fn create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard("create_qp", null_mut(), || {
        // SAFETY: libibverbs passes a PD of ours and the caller's attributes; the CQ and
        // SRQ pointers in them are the application's objects of this context.
        let (Some(p), Some(init)) = (
            unsafe { pd_obj(pd) }.and_then(|o| o.inner.clone()),
            unsafe { init.as_mut() },
        ) else {
            set_errno(libc::EINVAL);
            return null_mut();
        };
        // SAFETY: as above.
        let send_cq = unsafe { cq_obj(init.send_cq) }.and_then(|o| o.inner.clone());
        // SAFETY: as above.
        let recv_cq = unsafe { cq_obj(init.recv_cq) }.and_then(|o| o.inner.clone());
        let (Some(send_cq), Some(recv_cq)) = (send_cq, recv_cq) else {
            set_errno(libc::EINVAL);
            return null_mut();
        };
        let srq = if init.srq.is_null() {
            None
        } else {
            // SAFETY: as above.
            match unsafe { srq_obj(init.srq) }.and_then(|o| o.inner.clone()) {
                Some(s) => Some(s),
                None => {
                    set_errno(libc::EINVAL);
                    return null_mut();
                }
            }
        };
        let ia = InitAttr {
            send_cq,
            recv_cq,
            srq,
            cap: QpCap {
                max_send_wr: init.cap.max_send_wr,
                max_recv_wr: init.cap.max_recv_wr,
                max_send_sge: init.cap.max_send_sge,
                max_recv_sge: init.cap.max_recv_sge,
                max_inline_data: init.cap.max_inline_data,
            },
            sq_sig_all: init.sq_sig_all != 0,
            qp_type: init.qp_type,
        };
        let mut b = Box::new(QpObj {
            vqp: c_zeroed(),
            magic: 0,
            inner: None,
            ud: None,
        });
        let handle = &*b as *const QpObj as u64;
        let (qp_num, granted) = if ia.qp_type == QPT_UD {
            match UdQp::new(&p, &ia, handle) {
                Ok(q) => {
                    let n = q.qp_num();
                    b.ud = Some(q);
                    (n, ia.clone())
                }
                Err(e) => {
                    set_errno(fail("create_qp", &e));
                    return null_mut();
                }
            }
        } else {
            match Qp::new(&p, &ia, handle) {
                Ok(q) => {
                    let (_, granted) = q.query(0);
                    let n = q.qp_num();
                    b.inner = Some(q);
                    (n, granted)
                }
                Err(e) => {
                    set_errno(fail("create_qp", &e));
                    return null_mut();
                }
            }
        };
        init.cap.max_send_wr = granted.cap.max_send_wr;
        init.cap.max_recv_wr = granted.cap.max_recv_wr;
        init.cap.max_send_sge = granted.cap.max_send_sge;
        init.cap.max_recv_sge = granted.cap.max_recv_sge;
        init.cap.max_inline_data = granted.cap.max_inline_data;
        // SAFETY: writing the plain ibv_qp member of the union (comp_mask stays 0: no
        // extended QP, so ibv_qp_to_qp_ex returns NULL).
        unsafe {
            let q: &mut ibv_qp = &mut b.vqp.u.qp;
            q.context = b_context_of(pd);
            q.qp_context = init.qp_context;
            q.pd = pd;
            q.send_cq = init.send_cq;
            q.recv_cq = init.recv_cq;
            q.srq = init.srq;
            q.handle = 0;
            q.qp_num = qp_num;
            q.state = 0; // IBV_QPS_RESET
            q.qp_type = init.qp_type;
            q.events_completed = 0;
            init_mutex_cond(
                std::ptr::addr_of_mut!(q.mutex).cast(),
                std::ptr::addr_of_mut!(q.cond).cast(),
            );
        }
        b.magic = MAGIC_QP;
        Box::into_raw(b).cast()
    })
}

pub(super) fn ah_from_ibv(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        // SAFETY: reading the raw bytes of a GID union (any bit pattern is valid).
        dgid: unsafe { a.grh.dgid.raw },
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global != 0,
        port_num: a.port_num,
    }
}

fn ah_to_ibv(a: &AhAttr, out: &mut ibv_ah_attr) {
    out.grh.dgid.raw = a.dgid;
    out.grh.flow_label = a.flow_label;
    out.grh.sgid_index = a.sgid_index;
    out.grh.hop_limit = a.hop_limit;
    out.grh.traffic_class = a.traffic_class;
    out.dlid = a.dlid;
    out.sl = a.sl;
    out.src_path_bits = a.src_path_bits;
    out.static_rate = a.static_rate;
    out.is_global = u8::from(a.is_global);
    out.port_num = a.port_num;
}

pub(crate) unsafe extern "C" fn modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard("modify_qp", libc::EIO, || {
        // SAFETY: libibverbs passes a QP of ours and the caller's attributes.
        let (Some(o), Some(a)) = (unsafe { qp_obj(qp) }, unsafe { attr.as_ref() }) else {
            return libc::EINVAL;
        };
        let mask = mask as u32;
        let mut v = QpAttr::default();
        if mask & attr_mask::STATE != 0 {
            match verbs::qp::qp_state_from_ibv(a.qp_state) {
                Ok(s) => v.qp_state = s,
                Err(e) => return fail("modify_qp", &e),
            }
        }
        if mask & IBV_QP_CUR_STATE != 0 {
            match verbs::qp::qp_state_from_ibv(a.cur_qp_state) {
                Ok(s) => v.cur_qp_state = s,
                Err(e) => return fail("modify_qp", &e),
            }
        }
        v.path_mtu = a.path_mtu;
        v.qkey = a.qkey;
        v.rq_psn = a.rq_psn;
        v.sq_psn = a.sq_psn;
        v.dest_qp_num = a.dest_qp_num;
        v.qp_access_flags = a.qp_access_flags;
        v.cap = QpCap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        };
        v.ah_attr = ah_from_ibv(&a.ah_attr);
        v.pkey_index = a.pkey_index;
        v.en_sqd_async_notify = a.en_sqd_async_notify;
        v.sq_draining = a.sq_draining;
        v.max_rd_atomic = a.max_rd_atomic;
        v.max_dest_rd_atomic = a.max_dest_rd_atomic;
        v.min_rnr_timer = a.min_rnr_timer;
        v.port_num = a.port_num;
        v.timeout = a.timeout;
        v.retry_cnt = a.retry_cnt;
        v.rnr_retry = a.rnr_retry;
        let r = match (&o.inner, &o.ud) {
            (Some(q), _) => q.modify(&v, mask),
            (None, Some(u)) => u.modify(&v, mask),
            (None, None) => return libc::EINVAL,
        };
        match r {
            Ok(()) => 0,
            Err(e) => fail("modify_qp", &e),
        }
    })
}

pub(crate) unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard("query_qp", libc::EIO, || {
        // SAFETY: libibverbs passes a QP of ours and the caller's output structures.
        let (Some(o), Some(a), Some(init)) =
            (unsafe { qp_obj(qp) }, unsafe { attr.as_mut() }, unsafe {
                init.as_mut()
            })
        else {
            return libc::EINVAL;
        };
        let (v, ia) = match (&o.inner, &o.ud) {
            (Some(q), _) => q.query(mask as u32),
            (None, Some(u)) => u.query(),
            (None, None) => return libc::EINVAL,
        };
        // SAFETY: all-zero is a valid ibv_qp_attr (integers, GIDs); fields RC does not use
        // (alternate path, rate limit) read as zero.
        *a = unsafe { std::mem::zeroed() };
        a.qp_state = v.qp_state as u32;
        a.cur_qp_state = v.cur_qp_state as u32;
        a.path_mtu = v.path_mtu;
        a.qkey = v.qkey;
        a.rq_psn = v.rq_psn;
        a.sq_psn = v.sq_psn;
        a.dest_qp_num = v.dest_qp_num;
        a.qp_access_flags = v.qp_access_flags;
        a.cap.max_send_wr = v.cap.max_send_wr;
        a.cap.max_recv_wr = v.cap.max_recv_wr;
        a.cap.max_send_sge = v.cap.max_send_sge;
        a.cap.max_recv_sge = v.cap.max_recv_sge;
        a.cap.max_inline_data = v.cap.max_inline_data;
        ah_to_ibv(&v.ah_attr, &mut a.ah_attr);
        a.pkey_index = v.pkey_index;
        a.en_sqd_async_notify = v.en_sqd_async_notify;
        a.sq_draining = v.sq_draining;
        a.max_rd_atomic = v.max_rd_atomic;
        a.max_dest_rd_atomic = v.max_dest_rd_atomic;
        a.min_rnr_timer = v.min_rnr_timer;
        a.port_num = v.port_num;
        a.timeout = v.timeout;
        a.retry_cnt = v.retry_cnt;
        a.rnr_retry = v.rnr_retry;
        // SAFETY: the QP's own ibv_qp (ours) holds the application's pointers.
        let base = unsafe { &*qp };
        init.qp_context = base.qp_context;
        init.send_cq = ia.send_cq.handle() as *mut ibv_cq;
        init.recv_cq = ia.recv_cq.handle() as *mut ibv_cq;
        init.srq = ia
            .srq
            .as_ref()
            .map_or(null_mut(), |s| s.handle() as *mut ibv_srq);
        init.cap = a.cap;
        init.qp_type = ia.qp_type;
        init.sq_sig_all = c_int::from(ia.sq_sig_all);
        0
    })
}

pub(crate) unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    guard("destroy_qp", libc::EIO, || {
        // SAFETY: libibverbs passes a QP it got from create_qp.
        unsafe { destroy_obj::<QpObj>(qp.cast(), MAGIC_QP, qp_acked) }
    })
}

fn set_bad<T>(bad_wr: *mut *mut T, wr: *mut T) {
    if !bad_wr.is_null() {
        // SAFETY: the caller's out pointer.
        unsafe { *bad_wr = wr };
    }
}

/// Reads a WR's SGE list.
///
/// # Safety
/// `sg` points to `n` SGEs (when `n > 0`).
unsafe fn sges(sg: *const ibv_sge, n: c_int) -> Option<SgeList> {
    if !(0..=MAX_SGE_READ).contains(&n) || (n > 0 && sg.is_null()) {
        return None;
    }
    let mut out = SgeList::new();
    for i in 0..n as usize {
        // SAFETY: per the contract.
        let s = unsafe { &*sg.add(i) };
        out.push(Sge {
            addr: s.addr,
            length: s.length,
            lkey: s.lkey,
        });
    }
    Some(out)
}

fn wr_opcode(v: u32) -> Option<WrOpcode> {
    Some(match v {
        0 => WrOpcode::RdmaWrite,
        1 => WrOpcode::RdmaWriteWithImm,
        2 => WrOpcode::Send,
        3 => WrOpcode::SendWithImm,
        4 => WrOpcode::RdmaRead,
        9 => WrOpcode::SendWithInv,
        _ => return None,
    })
}

thread_local! {
    static SEND_WRS: RefCell<(Vec<SendWr>, Vec<*mut ibv_send_wr>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
    static RECV_WRS: RefCell<(Vec<RecvWr>, Vec<*mut ibv_recv_wr>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}

pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    guard("post_send", libc::EIO, || {
        // SAFETY: libibverbs passes a QP of ours.
        if let Some(u) = unsafe { ud_obj(qp) } {
            // SAFETY: wr is the caller's chain.
            return unsafe { post_send_ud(u, wr, bad_wr) };
        }
        // SAFETY: libibverbs passes a QP of ours.
        let Some(q) = (unsafe { qp_obj(qp) }).and_then(|o| o.inner.as_ref()) else {
            set_bad(bad_wr, wr);
            return libc::EINVAL;
        };
        SEND_WRS.with(|cell| {
            let mut fresh = (Vec::new(), Vec::new());
            let mut borrowed = cell.try_borrow_mut();
            let (wrs, ptrs) = match borrowed.as_mut() {
                Ok(b) => &mut **b,
                Err(_) => &mut fresh,
            };
            wrs.clear();
            ptrs.clear();
            // The first WR that cannot be converted (posted WRs stop before it), and why.
            let mut refused: Option<(*mut ibv_send_wr, c_int)> = None;
            // Index in `ptrs` of `wrs[0]`: a local operation posts the WRs before it first.
            let mut base = 0;
            let mut p = wr;
            while !p.is_null() {
                if ptrs.len() >= MAX_CHAIN {
                    refused = Some((p, libc::EINVAL));
                    break;
                }
                // SAFETY: p is a WR of the caller's chain.
                let w = unsafe { &*p };
                if super::mw::is_local(w.opcode) {
                    // A memory window bind or a local invalidate takes its turn after the
                    // WRs before it.
                    if !wrs.is_empty() {
                        // SAFETY: as below.
                        if let Err((i, e)) = unsafe { q.post_send(wrs) } {
                            set_bad(bad_wr, ptrs.get(base + i).copied().unwrap_or(wr));
                            return fail_post("post_send", &e);
                        }
                        wrs.clear();
                    }
                    // SAFETY: the caller's WR of a local opcode.
                    let posted = unsafe { super::mw::local_op(w) }
                        .and_then(|op| q.post_local(&op).map_err(|e| fail_post("post_send", &e)));
                    if let Err(errno) = posted {
                        set_bad(bad_wr, p);
                        return errno;
                    }
                    ptrs.push(p);
                    base = ptrs.len();
                    p = w.next;
                    continue;
                }
                // SAFETY: the WR's SGE list as the caller gave it.
                let (Some(op), Some(sg)) = (wr_opcode(w.opcode), unsafe { sges(w.sg_list, w.num_sge) })
                else {
                    // An opcode the RC QP does not take (atomics and the rest), or a bad SGE list.
                    refused = Some((p, libc::EINVAL));
                    break;
                };
                let (remote_addr, rkey) = match op {
                    // SAFETY: the rdma member of the union is the one RDMA opcodes use.
                    WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm | WrOpcode::RdmaRead => unsafe {
                        (w.wr.rdma.remote_addr, w.wr.rdma.rkey)
                    },
                    _ => (0, 0),
                };
                wrs.push(SendWr {
                    wr_id: w.wr_id,
                    opcode: op,
                    send_flags: w.send_flags,
                    sg_list: sg,
                    // SAFETY: reading the imm_data member of a u32 union.
                    imm_data: unsafe { w.imm_data_invalidated_rkey_union.imm_data },
                    remote_addr,
                    rkey,
                });
                ptrs.push(p);
                p = w.next;
            }
            // SAFETY: inline SGEs point to memory the caller keeps readable for the call,
            // verbs' contract for IBV_SEND_INLINE.
            let res = if wrs.is_empty() { Ok(()) } else { unsafe { q.post_send(wrs) } };
            match res {
                Err((i, e)) => {
                    set_bad(bad_wr, ptrs.get(base + i).copied().unwrap_or(wr));
                    fail_post("post_send", &e)
                }
                Ok(()) => match refused {
                    Some((p, errno)) => {
                        set_bad(bad_wr, p);
                        errno
                    }
                    None => 0,
                },
            }
        })
    })
}

/// Converts and posts a receive chain with `post`.
///
/// # Safety
/// `wr` is NULL or the caller's chain of receive WRs.
unsafe fn post_recv_chain(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: impl FnOnce(&[RecvWr]) -> Result<(), (usize, verbs::Error)>,
) -> c_int {
    RECV_WRS.with(|cell| {
        let mut fresh = (Vec::new(), Vec::new());
        let mut borrowed = cell.try_borrow_mut();
        let (wrs, ptrs) = match borrowed.as_mut() {
            Ok(b) => &mut **b,
            Err(_) => &mut fresh,
        };
        wrs.clear();
        ptrs.clear();
        let mut refused: Option<*mut ibv_recv_wr> = None;
        let mut p = wr;
        while !p.is_null() {
            if ptrs.len() >= MAX_CHAIN {
                refused = Some(p);
                break;
            }
            // SAFETY: p is a WR of the caller's chain.
            let w = unsafe { &*p };
            // SAFETY: the WR's SGE list as the caller gave it.
            let Some(sg) = (unsafe { sges(w.sg_list, w.num_sge) }) else {
                refused = Some(p);
                break;
            };
            wrs.push(RecvWr {
                wr_id: w.wr_id,
                sg_list: sg,
            });
            ptrs.push(p);
            p = w.next;
        }
        let res = if wrs.is_empty() { Ok(()) } else { post(wrs) };
        match res {
            Err((i, e)) => {
                set_bad(bad_wr, ptrs.get(i).copied().unwrap_or(wr));
                fail_post("post_recv", &e)
            }
            Ok(()) => match refused {
                Some(p) => {
                    set_bad(bad_wr, p);
                    libc::EINVAL
                }
                None => 0,
            },
        }
    })
}

pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    guard("post_recv", libc::EIO, || {
        // SAFETY: libibverbs passes a QP of ours.
        if let Some(u) = unsafe { ud_obj(qp) } {
            // SAFETY: wr is the caller's chain.
            return unsafe { post_recv_chain(wr, bad_wr, |wrs| u.post_recv(wrs)) };
        }
        // SAFETY: libibverbs passes a QP of ours.
        let Some(q) = (unsafe { qp_obj(qp) }).and_then(|o| o.inner.as_ref()) else {
            set_bad(bad_wr, wr);
            return libc::EINVAL;
        };
        // SAFETY: wr is the caller's chain.
        unsafe { post_recv_chain(wr, bad_wr, |wrs| q.post_recv(wrs)) }
    })
}

/// `post_send` on a UD QP: converts the chain (`wr.ud`: AH, remote QPN and Q_Key) and
/// posts it. A WR that cannot be converted (an opcode UD lacks is refused by the QP; a
/// NULL or foreign AH, a bad SGE list here) stops the chain there with EINVAL.
///
/// # Safety
/// `wr` is NULL or the caller's chain of send WRs.
unsafe fn post_send_ud(u: &UdQp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    let mut wrs: Vec<UdSendWr> = Vec::new();
    let mut ptrs: Vec<*mut ibv_send_wr> = Vec::new();
    let mut refused: Option<*mut ibv_send_wr> = None;
    let mut p = wr;
    while !p.is_null() {
        if ptrs.len() >= MAX_CHAIN {
            refused = Some(p);
            break;
        }
        // SAFETY: p is a WR of the caller's chain.
        let w = unsafe { &*p };
        // SAFETY: the WR's SGE list as the caller gave it; the ud member of the union is
        // the one UD QPs use (its AH pointer is checked by magic).
        let (Some(op), Some(sg), Some(ah)) = (
            wr_opcode(w.opcode),
            unsafe { sges(w.sg_list, w.num_sge) },
            unsafe { super::ah::ah_of(w.wr.ud.ah) },
        ) else {
            refused = Some(p);
            break;
        };
        wrs.push(UdSendWr {
            wr_id: w.wr_id,
            opcode: op,
            send_flags: w.send_flags,
            sg_list: sg,
            // SAFETY: reading the imm_data member of a u32 union.
            imm_data: unsafe { w.imm_data_invalidated_rkey_union.imm_data },
            ah,
            // SAFETY: as above.
            remote_qpn: unsafe { w.wr.ud.remote_qpn },
            // SAFETY: as above.
            remote_qkey: unsafe { w.wr.ud.remote_qkey },
        });
        ptrs.push(p);
        p = w.next;
    }
    let res = if wrs.is_empty() {
        Ok(())
    } else {
        // SAFETY: inline SGEs point to memory the caller keeps readable for the call.
        unsafe { u.post_send(&wrs) }
    };
    match res {
        Err((i, e)) => {
            set_bad(bad_wr, ptrs.get(i).copied().unwrap_or(wr));
            fail_post("post_send", &e)
        }
        Ok(()) => match refused {
            Some(p) => {
                set_bad(bad_wr, p);
                libc::EINVAL
            }
            None => 0,
        },
    }
}

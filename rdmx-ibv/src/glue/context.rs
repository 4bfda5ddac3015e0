//! Device matching and allocation, contexts (`ibv_open_device`), and the device and port
//! queries.

use super::{IBDEV_PREFIX, fail, guard, set_errno};
use crate::abi::{
    _verbs_init_and_alloc_context, verbs_context_ops, verbs_device, verbs_set_ops, verbs_sysfs_dev,
    verbs_uninit_context,
};
use crate::verbs::Device;
use parking_lot::Mutex;
use rdma_sys::{
    ibv_context, ibv_device, ibv_device_attr_ex, ibv_port_attr, ibv_query_device_ex_input,
    verbs_context,
};
use std::ffi::{c_int, c_void};
use std::mem::{offset_of, size_of};
use std::sync::{Arc, Weak};

/// A context as libibverbs allocates it for us (`_verbs_init_and_alloc_context`, zeroed):
/// the `verbs_context` first, then the device it opened. `state` is NULL until
/// `alloc_context` succeeds.
#[repr(C)]
pub(crate) struct Context {
    pub(crate) vctx: verbs_context,
    state: *mut ContextState,
}

pub(crate) struct ContextState {
    pub(crate) dev: Arc<Device>,
    /// Destroyed objects kept for their unacknowledged event records (freed with the
    /// context at the latest).
    pub(crate) retired: super::retire::RetiredList,
}

/// The device of this process: every context of the process shares it (one UDP port 4791
/// per address, one progress thread). Kept while a context uses it.
static DEVICE: Mutex<Weak<Device>> = Mutex::new(Weak::new());

/// The context a verbs object belongs to, from its `struct ibv_context *`.
///
/// # Safety
/// `ctx` is NULL or a context allocated by [`alloc_context`] and not freed.
pub(crate) unsafe fn state<'a>(ctx: *mut ibv_context) -> Option<&'a ContextState> {
    if ctx.is_null() {
        return None;
    }
    let off = offset_of!(Context, vctx) + offset_of!(verbs_context, context);
    // SAFETY: per the contract, ctx is the `context` member of a Context's vctx.
    let c = unsafe { &*(ctx.cast::<u8>().sub(off).cast::<Context>()) };
    if c.state.is_null() {
        return None;
    }
    // SAFETY: state was set from Box::into_raw in alloc_context and lives until
    // free_context.
    Some(unsafe { &*c.state })
}

/// The device of an `ibv_context *` as an errno result (ENODEV for a context that is not
/// ours).
///
/// # Safety
/// As [`state`].
pub(crate) unsafe fn device_of(ctx: *mut ibv_context) -> Result<Arc<Device>, c_int> {
    // SAFETY: forwarded contract.
    match unsafe { state(ctx) } {
        Some(s) => Ok(s.dev.clone()),
        None => Err(libc::ENODEV),
    }
}

/// Whether `ctx` is a context of this provider (its device's ops are ours).
///
/// # Safety
/// `ctx` is NULL or a live `struct ibv_context *` of libibverbs.
pub(crate) unsafe fn is_ours(ctx: *mut ibv_context) -> bool {
    if ctx.is_null() {
        return false;
    }
    // SAFETY: a live context points to its device, a verbs_device (libibverbs allocates
    // every device through a provider's alloc_device).
    unsafe {
        let dev = (*ctx).device;
        !dev.is_null() && std::ptr::eq((*dev.cast::<verbs_device>()).ops, &super::DEVICE_OPS)
    }
}

pub(crate) unsafe extern "C" fn match_device(sysfs_dev: *mut verbs_sysfs_dev) -> bool {
    guard("match_device", false, || {
        if sysfs_dev.is_null() {
            return false;
        }
        // SAFETY: libibverbs passes a live sysfs device whose ibdev_name is NUL-terminated
        // within its 64 bytes (it fills it with a bounded copy).
        let name = unsafe { &(*sysfs_dev).ibdev_name };
        let bytes: Vec<u8> = name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        bytes.starts_with(IBDEV_PREFIX.as_bytes())
    })
}

pub(crate) unsafe extern "C" fn alloc_device(
    _sysfs_dev: *mut verbs_sysfs_dev,
) -> *mut verbs_device {
    guard("alloc_device", std::ptr::null_mut(), || {
        // SAFETY: calloc of a plain C structure; zero is a valid verbs_device (libibverbs
        // fills ops, refcount, sysfs and the ibv_device names after we return).
        let dev = unsafe { libc::calloc(1, size_of::<verbs_device>()) }.cast::<verbs_device>();
        if dev.is_null() {
            set_errno(libc::ENOMEM);
        }
        dev
    })
}

pub(crate) unsafe extern "C" fn uninit_device(dev: *mut verbs_device) {
    guard("uninit_device", (), || {
        // SAFETY: dev came from alloc_device's calloc (or is NULL).
        unsafe { libc::free(dev.cast()) }
    })
}

/// The device of this process, opened on first use from the rdmx configuration in the
/// environment (`RDMX_*`: `soft_addr`, `qp_override`, a profile, ...).
fn open_device() -> Result<Arc<Device>, String> {
    let mut slot = DEVICE.lock();
    if let Some(d) = slot.upgrade() {
        return Ok(d);
    }
    // Foreign RDMX_ variables (the program's own) are left alone, as the launcher did.
    let settings = crate::launcher::env::config_from_env()
        .and_then(|c| c.settings().map_err(|e| e.to_string()))
        .map_err(|e| format!("rdmx configuration (RDMX_* variables): {e}"))?;
    let dev = Device::open(&settings).map_err(|e| format!("opening the soft device: {e}"))?;
    *slot = Arc::downgrade(&dev);
    Ok(dev)
}

pub(crate) unsafe extern "C" fn alloc_context(
    device: *mut ibv_device,
    cmd_fd: c_int,
    _private_data: *mut c_void,
) -> *mut verbs_context {
    guard("alloc_context", std::ptr::null_mut(), || {
        rdmx::logging::init();
        let dev = match open_device() {
            Ok(d) => d,
            Err(e) => {
                // ibv_open_device only says NULL; the reason must reach the operator.
                eprintln!("rdmx-ibv: cannot open rdmx0: {e}");
                if cmd_fd >= 0 {
                    // SAFETY: alloc_context owns cmd_fd and must close it on failure.
                    unsafe { libc::close(cmd_fd) };
                }
                set_errno(libc::ENODEV);
                return std::ptr::null_mut();
            }
        };
        // SAFETY: alloc_size covers a Context whose verbs_context is at offset 0, as the
        // function's contract asks; it closes cmd_fd itself on failure.
        let raw = unsafe {
            _verbs_init_and_alloc_context(
                device,
                cmd_fd,
                size_of::<Context>(),
                offset_of!(Context, vctx) as *mut verbs_context,
                0,
            )
        }
        .cast::<Context>();
        if raw.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: raw is a zeroed, initialised Context of ours; the async fd is a dup
        // libibverbs closes in verbs_uninit_context.
        unsafe {
            let vctx = std::ptr::addr_of_mut!((*raw).vctx);
            verbs_set_ops(vctx, &CONTEXT_OPS);
            let afd = libc::fcntl(dev.async_fd(), libc::F_DUPFD_CLOEXEC, 3);
            if afd < 0 {
                let err = *libc::__errno_location();
                verbs_uninit_context(vctx);
                libc::free(raw.cast());
                set_errno(err);
                return std::ptr::null_mut();
            }
            (*vctx).context.async_fd = afd;
            (*vctx).context.num_comp_vectors = 1;
            (*raw).state = Box::into_raw(Box::new(ContextState {
                dev,
                retired: Default::default(),
            }));
            vctx
        }
    })
}

unsafe extern "C" fn free_context(ctx: *mut ibv_context) {
    guard("free_context", (), || {
        if ctx.is_null() {
            return;
        }
        let off = offset_of!(Context, vctx) + offset_of!(verbs_context, context);
        // SAFETY: libibverbs frees only contexts alloc_context returned; state came from
        // Box::into_raw; the allocation is libibverbs' calloc.
        unsafe {
            let c = ctx.cast::<u8>().sub(off).cast::<Context>();
            let state = std::mem::replace(&mut (*c).state, std::ptr::null_mut());
            if !state.is_null() {
                drop(Box::from_raw(state));
            }
            verbs_uninit_context(std::ptr::addr_of_mut!((*c).vctx));
            libc::free(c.cast());
        }
    })
}

/// Copies `s` into a C char array, NUL-terminated, truncated to fit.
fn copy_cstr(dst: &mut [std::ffi::c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as std::ffi::c_char;
    }
    if let Some(z) = dst.get_mut(n) {
        *z = 0;
    }
}

unsafe extern "C" fn query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    guard("query_device_ex", libc::EIO, || {
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: input is NULL or the caller's struct.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return libc::EINVAL;
        }
        // SAFETY: ctx is a context of ours (libibverbs dispatched through our ops).
        let dev = match unsafe { device_of(ctx) } {
            Ok(d) => d,
            Err(e) => return e,
        };
        let a = dev.query_device();
        // SAFETY: all-zero is a valid ibv_device_attr_ex (integers and arrays).
        let mut ex: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        let o = &mut ex.orig_attr;
        copy_cstr(&mut o.fw_ver, &a.fw_ver);
        o.node_guid = a.node_guid.to_be();
        o.sys_image_guid = a.sys_image_guid.to_be();
        o.max_mr_size = a.max_mr_size;
        o.page_size_cap = a.page_size_cap;
        o.vendor_id = a.vendor_id;
        o.vendor_part_id = a.vendor_part_id;
        o.hw_ver = a.hw_ver;
        o.max_qp = a.max_qp as c_int;
        o.max_qp_wr = a.max_qp_wr as c_int;
        o.device_cap_flags = a.device_cap_flags;
        o.max_sge = a.max_sge as c_int;
        o.max_sge_rd = a.max_sge_rd as c_int;
        o.max_cq = a.max_cq as c_int;
        o.max_cqe = a.max_cqe as c_int;
        o.max_mr = a.max_mr as c_int;
        o.max_pd = a.max_pd as c_int;
        o.max_qp_rd_atom = a.max_qp_rd_atom as c_int;
        o.max_ee_rd_atom = a.max_ee_rd_atom as c_int;
        o.max_res_rd_atom = a.max_res_rd_atom as c_int;
        o.max_qp_init_rd_atom = a.max_qp_init_rd_atom as c_int;
        o.max_ee_init_rd_atom = a.max_ee_init_rd_atom as c_int;
        o.atomic_cap = a.atomic_cap;
        o.max_ee = a.max_ee as c_int;
        o.max_rdd = a.max_rdd as c_int;
        o.max_mw = a.max_mw as c_int;
        o.max_raw_ipv6_qp = a.max_raw_ipv6_qp as c_int;
        o.max_raw_ethy_qp = a.max_raw_ethy_qp as c_int;
        o.max_mcast_grp = a.max_mcast_grp as c_int;
        o.max_mcast_qp_attach = a.max_mcast_qp_attach as c_int;
        o.max_total_mcast_qp_attach = a.max_total_mcast_qp_attach as c_int;
        o.max_ah = a.max_ah as c_int;
        o.max_fmr = a.max_fmr as c_int;
        o.max_map_per_fmr = a.max_map_per_fmr as c_int;
        o.max_srq = a.max_srq as c_int;
        o.max_srq_wr = a.max_srq_wr as c_int;
        o.max_srq_sge = a.max_srq_sge as c_int;
        o.max_pkeys = a.max_pkeys;
        o.local_ca_ack_delay = a.local_ca_ack_delay;
        o.phys_port_cnt = a.phys_port_cnt;
        ex.phys_port_cnt_ex = u32::from(a.phys_port_cnt);
        let n = attr_size.min(size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's buffer holds attr_size bytes (ibv_query_device passes the
        // size of its ibv_device_attr); we copy no more than that.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&ex as *const ibv_device_attr_ex).cast::<u8>(),
                attr.cast::<u8>(),
                n,
            )
        };
        0
    })
}

unsafe extern "C" fn query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    guard("query_port", libc::EIO, || {
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: ctx is a context of ours.
        let dev = match unsafe { device_of(ctx) } {
            Ok(d) => d,
            Err(e) => return e,
        };
        let p = match dev.query_port(port) {
            Ok(p) => p,
            Err(e) => return fail("query_port", &e),
        };
        // SAFETY: libibverbs passes a whole ibv_port_attr of its (installed) size, which
        // is rdma-sys's, zeroed.
        let a = unsafe { &mut *attr };
        a.state = p.state;
        a.max_mtu = p.max_mtu;
        a.active_mtu = p.active_mtu;
        a.gid_tbl_len = p.gid_tbl_len;
        a.port_cap_flags = p.port_cap_flags;
        a.max_msg_sz = p.max_msg_sz;
        a.bad_pkey_cntr = p.bad_pkey_cntr;
        a.qkey_viol_cntr = p.qkey_viol_cntr;
        a.pkey_tbl_len = p.pkey_tbl_len;
        a.lid = p.lid;
        a.sm_lid = p.sm_lid;
        a.lmc = p.lmc;
        a.max_vl_num = p.max_vl_num;
        a.sm_sl = p.sm_sl;
        a.subnet_timeout = p.subnet_timeout;
        a.init_type_reply = p.init_type_reply;
        a.active_width = p.active_width;
        a.active_speed = p.active_speed;
        a.phys_state = p.phys_state;
        a.link_layer = p.link_layer;
        0
    })
}

/// The ops of every context of this provider (libibverbs' dummies, which fail with
/// EOPNOTSUPP, stand in for the NULL ones).
pub(crate) static CONTEXT_OPS: verbs_context_ops = {
    use super::objects as o;
    verbs_context_ops {
        advise_mr: None,
        alloc_dm: None,
        alloc_mw: Some(super::mw::alloc_mw),
        alloc_null_mr: None,
        alloc_parent_domain: None,
        alloc_pd: Some(o::alloc_pd),
        alloc_td: None,
        async_event: None,
        attach_counters_point_flow: None,
        attach_mcast: None,
        bind_mw: Some(super::mw::bind_mw),
        close_xrcd: None,
        cq_event: None,
        create_ah: Some(super::ah::create_ah),
        create_counters: None,
        create_cq: Some(o::create_cq),
        create_cq_ex: None,
        create_flow: None,
        create_flow_action_esp: None,
        create_qp: Some(o::create_qp),
        create_qp_ex: Some(super::qp_ex::create_qp_ex),
        create_rwq_ind_table: None,
        create_srq: Some(o::create_srq),
        create_srq_ex: None,
        create_wq: None,
        dealloc_mw: Some(super::mw::dealloc_mw),
        dealloc_pd: Some(o::dealloc_pd),
        dealloc_td: None,
        dereg_mr: Some(o::dereg_mr),
        destroy_ah: Some(super::ah::destroy_ah),
        destroy_counters: None,
        destroy_cq: Some(o::destroy_cq),
        destroy_flow: None,
        destroy_flow_action: None,
        destroy_qp: Some(o::destroy_qp),
        destroy_rwq_ind_table: None,
        destroy_srq: Some(o::destroy_srq),
        destroy_wq: None,
        detach_mcast: None,
        free_context: Some(free_context),
        free_dm: None,
        get_srq_num: None,
        import_dm: None,
        import_mr: None,
        import_pd: None,
        modify_cq: None,
        modify_flow_action_esp: None,
        modify_qp: Some(o::modify_qp),
        modify_qp_rate_limit: None,
        modify_srq: Some(o::modify_srq),
        modify_wq: None,
        open_qp: None,
        open_xrcd: None,
        poll_cq: Some(o::poll_cq),
        post_recv: Some(o::post_recv),
        post_send: Some(o::post_send),
        post_srq_ops: None,
        post_srq_recv: Some(o::post_srq_recv),
        query_device_ex: Some(query_device_ex),
        query_ece: None,
        query_port: Some(query_port),
        query_qp: Some(o::query_qp),
        query_qp_data_in_order: None,
        query_rt_values: None,
        query_srq: Some(o::query_srq),
        read_counters: None,
        reg_dm_mr: None,
        reg_dmabuf_mr: None,
        reg_mr: Some(o::reg_mr),
        req_notify_cq: Some(o::req_notify_cq),
        rereg_mr: None,
        resize_cq: None,
        set_ece: None,
        unimport_dm: None,
        unimport_mr: None,
        unimport_pd: None,
    }
};

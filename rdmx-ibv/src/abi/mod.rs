//! libibverbs' private provider ABI, `IBVERBS_PRIVATE_34` (rdma-core v35..v56; Debian 12
//! ships v44): the structures of `infiniband/driver.h` a provider shares with libibverbs,
//! and the four private functions it imports.
//!
//! `driver.h` is not installed by libibverbs-dev, so these are written by hand.
//! `tests/abi_layout.rs` checks every size and offset listed in [`LAYOUT`] against a C
//! probe compiled with rdma-core v55's `driver.h` (the sources the `ibverbs-sys` crate
//! vendors; `driver.h` is the same in v44 and v55 but for `ibv_cmd_*` helper prototypes)
//! over the installed (v44) public headers. Public `ibv_*` structures come from `rdma-sys`
//! (bindgen of the installed headers), so the structures embedding them (`verbs_qp`,
//! `verbs_device`, ...) take the installed library's sizes: v55's `struct ibv_qp_ex` grew
//! by one pointer (`wr_flush`), which is why the probe uses the installed public headers.
//!
//! Build-time guard: `build.rs` refuses to build when the installed `libibverbs.so.1`
//! does not export `verbs_register_driver_34@IBVERBS_PRIVATE_34`. Load-time guard: the
//! provider links with `-z defs` and imports the four functions below with their version,
//! so a libibverbs without `IBVERBS_PRIVATE_34` refuses to load it ("version
//! `IBVERBS_PRIVATE_34' not found") instead of calling into a different ABI; the launcher
//! checks the same with `dlvsym` before running anything ([`private_abi_available`]).

#![allow(non_camel_case_types)]

use rdma_sys::{
    ibv_ah, ibv_ah_attr, ibv_async_event, ibv_comp_channel, ibv_context, ibv_cq, ibv_cq_ex,
    ibv_device, ibv_device_attr_ex, ibv_mr, ibv_mw, ibv_mw_bind, ibv_pd, ibv_port_attr, ibv_qp,
    ibv_qp_attr, ibv_qp_ex, ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_query_device_ex_input,
    ibv_recv_wr, ibv_send_wr, ibv_srq, ibv_srq_attr, ibv_srq_init_attr, ibv_wc, verbs_context,
};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};

/// The private ABI number this provider is written for (`IBVERBS_PABI_VERSION`).
pub const PABI_VERSION: u32 = 34;
/// The version node of the private symbols.
pub const PRIVATE_VERSION: &str = "IBVERBS_PRIVATE_34";
/// The registration function of this ABI.
pub const REGISTER_SYMBOL: &str = "verbs_register_driver_34";
/// The file name suffix libibverbs appends to `RDMAV_DRIVERS` entries.
pub const PROVIDER_SUFFIX: &str = "-rdmav34.so";

/// `IBV_SYSFS_NAME_MAX`.
pub const SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const SYSFS_PATH_MAX: usize = 256;

/// `VERBS_MATCH_SENTINEL`, the end of a match table.
pub const VERBS_MATCH_SENTINEL: u8 = 0;

/// `IBV_MR_TYPE_MR` (`enum ibv_mr_type`).
pub const IBV_MR_TYPE_MR: u32 = 0;

/// ccan's `struct list_node`.
#[repr(C)]
#[derive(Debug)]
pub struct list_node {
    pub next: *mut list_node,
    pub prev: *mut list_node,
}

/// `struct verbs_match_ent`.
#[repr(C)]
pub struct verbs_match_ent {
    pub driver_data: *mut c_void,
    /// `union { const char *modalias; uint64_t driver_id; } u`.
    pub u: u64,
    pub vendor: u16,
    pub device: u16,
    pub kind: u8,
}

// SAFETY: a match table is immutable static data (null pointers and integers).
unsafe impl Sync for verbs_match_ent {}

/// `struct verbs_sysfs_dev`: a device libibverbs found in sysfs.
#[repr(C)]
pub struct verbs_sysfs_dev {
    pub entry: list_node,
    pub provider_data: *mut c_void,
    pub match_: *const verbs_match_ent,
    pub flags: c_uint,
    pub sysfs_name: [c_char; SYSFS_NAME_MAX],
    pub sysfs_cdev: libc::dev_t,
    pub ibdev_name: [c_char; SYSFS_NAME_MAX],
    pub ibdev_path: [c_char; SYSFS_PATH_MAX],
    pub modalias: [c_char; 512],
    pub node_guid: u64,
    pub driver_id: u32,
    /// `enum ibv_node_type`.
    pub node_type: c_int,
    pub ibdev_idx: c_int,
    pub num_ports: u32,
    pub abi_ver: u32,
    pub time_created: libc::timespec,
}

/// `struct verbs_device_ops`: what a provider registers.
#[repr(C)]
pub struct verbs_device_ops {
    pub name: *const c_char,
    pub match_min_abi_version: u32,
    pub match_max_abi_version: u32,
    pub match_table: *const verbs_match_ent,
    pub static_providers: *const *const verbs_device_ops,
    pub match_device: Option<unsafe extern "C" fn(sysfs_dev: *mut verbs_sysfs_dev) -> bool>,
    pub alloc_context: Option<
        unsafe extern "C" fn(
            device: *mut ibv_device,
            cmd_fd: c_int,
            private_data: *mut c_void,
        ) -> *mut verbs_context,
    >,
    pub import_context:
        Option<unsafe extern "C" fn(device: *mut ibv_device, cmd_fd: c_int) -> *mut verbs_context>,
    pub alloc_device:
        Option<unsafe extern "C" fn(sysfs_dev: *mut verbs_sysfs_dev) -> *mut verbs_device>,
    pub uninit_device: Option<unsafe extern "C" fn(device: *mut verbs_device)>,
}

// SAFETY: the ops table is immutable static data (function pointers and pointers to
// other immutable statics).
unsafe impl Sync for verbs_device_ops {}

/// `struct verbs_device`: `struct ibv_device` first, as libibverbs' `verbs_get_device`
/// assumes.
#[repr(C)]
pub struct verbs_device {
    pub device: ibv_device,
    pub ops: *const verbs_device_ops,
    /// `atomic_int`.
    pub refcount: c_int,
    pub entry: list_node,
    pub sysfs: *mut verbs_sysfs_dev,
    pub core_support: u64,
}

/// `struct verbs_mr`: what `ibv_dereg_mr` finds around the `struct ibv_mr` it is given.
#[repr(C)]
pub struct verbs_mr {
    pub ibv_mr: ibv_mr,
    /// `enum ibv_mr_type`.
    pub mr_type: u32,
    pub access: c_int,
}

/// The `union { struct ibv_qp qp; struct ibv_qp_ex qp_ex; }` of `struct verbs_qp`.
#[repr(C)]
pub union verbs_qp_u {
    pub qp: std::mem::ManuallyDrop<ibv_qp>,
    pub qp_ex: std::mem::ManuallyDrop<ibv_qp_ex>,
}

/// `struct verbs_qp`: `ibv_qp_to_qp_ex` reads `comp_mask` (0: no extended QP).
#[repr(C)]
pub struct verbs_qp {
    pub u: verbs_qp_u,
    pub comp_mask: u32,
    pub xrcd: *mut c_void,
}

/// `struct verbs_cq`.
#[repr(C)]
pub union verbs_cq {
    pub cq: std::mem::ManuallyDrop<ibv_cq>,
    pub cq_ex: std::mem::ManuallyDrop<ibv_cq_ex>,
}

/// `struct verbs_srq`.
#[repr(C)]
pub struct verbs_srq {
    pub srq: ibv_srq,
    /// `enum ibv_srq_type` (0 = IBV_SRQT_BASIC).
    pub srq_type: u32,
    pub xrcd: *mut c_void,
    pub cq: *mut ibv_cq,
    pub srq_num: u32,
}

/// A slot of `struct verbs_context_ops` this provider leaves NULL (libibverbs then uses
/// its dummy, which fails with EOPNOTSUPP).
pub type UnusedOp = Option<unsafe extern "C" fn()>;

/// `struct verbs_context_ops`: every op a provider can give, in `driver.h`'s order
/// (alphabetical). `verbs_set_ops` copies the non-NULL ones into the context.
#[repr(C)]
pub struct verbs_context_ops {
    pub advise_mr: UnusedOp,
    pub alloc_dm: UnusedOp,
    pub alloc_mw: Option<unsafe extern "C" fn(pd: *mut ibv_pd, type_: u32) -> *mut ibv_mw>,
    pub alloc_null_mr: UnusedOp,
    pub alloc_parent_domain: UnusedOp,
    pub alloc_pd: Option<unsafe extern "C" fn(context: *mut ibv_context) -> *mut ibv_pd>,
    pub alloc_td: UnusedOp,
    pub async_event:
        Option<unsafe extern "C" fn(context: *mut ibv_context, event: *mut ibv_async_event)>,
    pub attach_counters_point_flow: UnusedOp,
    pub attach_mcast: UnusedOp,
    pub bind_mw: Option<
        unsafe extern "C" fn(qp: *mut ibv_qp, mw: *mut ibv_mw, mw_bind: *mut ibv_mw_bind) -> c_int,
    >,
    pub close_xrcd: UnusedOp,
    pub cq_event: Option<unsafe extern "C" fn(cq: *mut ibv_cq)>,
    pub create_ah:
        Option<unsafe extern "C" fn(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah>,
    pub create_counters: UnusedOp,
    pub create_cq: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            cqe: c_int,
            channel: *mut ibv_comp_channel,
            comp_vector: c_int,
        ) -> *mut ibv_cq,
    >,
    pub create_cq_ex: UnusedOp,
    pub create_flow: UnusedOp,
    pub create_flow_action_esp: UnusedOp,
    pub create_qp:
        Option<unsafe extern "C" fn(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp>,
    pub create_qp_ex: Option<
        unsafe extern "C" fn(ctx: *mut ibv_context, attr: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp,
    >,
    pub create_rwq_ind_table: UnusedOp,
    pub create_srq:
        Option<unsafe extern "C" fn(pd: *mut ibv_pd, attr: *mut ibv_srq_init_attr) -> *mut ibv_srq>,
    pub create_srq_ex: UnusedOp,
    pub create_wq: UnusedOp,
    pub dealloc_mw: Option<unsafe extern "C" fn(mw: *mut ibv_mw) -> c_int>,
    pub dealloc_pd: Option<unsafe extern "C" fn(pd: *mut ibv_pd) -> c_int>,
    pub dealloc_td: UnusedOp,
    pub dereg_mr: Option<unsafe extern "C" fn(vmr: *mut verbs_mr) -> c_int>,
    pub destroy_ah: Option<unsafe extern "C" fn(ah: *mut ibv_ah) -> c_int>,
    pub destroy_counters: UnusedOp,
    pub destroy_cq: Option<unsafe extern "C" fn(cq: *mut ibv_cq) -> c_int>,
    pub destroy_flow: UnusedOp,
    pub destroy_flow_action: UnusedOp,
    pub destroy_qp: Option<unsafe extern "C" fn(qp: *mut ibv_qp) -> c_int>,
    pub destroy_rwq_ind_table: UnusedOp,
    pub destroy_srq: Option<unsafe extern "C" fn(srq: *mut ibv_srq) -> c_int>,
    pub destroy_wq: UnusedOp,
    pub detach_mcast: UnusedOp,
    pub free_context: Option<unsafe extern "C" fn(context: *mut ibv_context)>,
    pub free_dm: UnusedOp,
    pub get_srq_num: UnusedOp,
    pub import_dm: UnusedOp,
    pub import_mr: UnusedOp,
    pub import_pd: UnusedOp,
    pub modify_cq: UnusedOp,
    pub modify_flow_action_esp: UnusedOp,
    pub modify_qp: Option<
        unsafe extern "C" fn(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int,
    >,
    pub modify_qp_rate_limit: UnusedOp,
    pub modify_srq: Option<
        unsafe extern "C" fn(srq: *mut ibv_srq, attr: *mut ibv_srq_attr, mask: c_int) -> c_int,
    >,
    pub modify_wq: UnusedOp,
    pub open_qp: UnusedOp,
    pub open_xrcd: UnusedOp,
    pub poll_cq:
        Option<unsafe extern "C" fn(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int>,
    pub post_recv: Option<
        unsafe extern "C" fn(
            qp: *mut ibv_qp,
            wr: *mut ibv_recv_wr,
            bad_wr: *mut *mut ibv_recv_wr,
        ) -> c_int,
    >,
    pub post_send: Option<
        unsafe extern "C" fn(
            qp: *mut ibv_qp,
            wr: *mut ibv_send_wr,
            bad_wr: *mut *mut ibv_send_wr,
        ) -> c_int,
    >,
    pub post_srq_ops: UnusedOp,
    pub post_srq_recv: Option<
        unsafe extern "C" fn(
            srq: *mut ibv_srq,
            wr: *mut ibv_recv_wr,
            bad_wr: *mut *mut ibv_recv_wr,
        ) -> c_int,
    >,
    pub query_device_ex: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            input: *const ibv_query_device_ex_input,
            attr: *mut ibv_device_attr_ex,
            attr_size: usize,
        ) -> c_int,
    >,
    pub query_ece: UnusedOp,
    pub query_port: Option<
        unsafe extern "C" fn(
            context: *mut ibv_context,
            port_num: u8,
            port_attr: *mut ibv_port_attr,
        ) -> c_int,
    >,
    pub query_qp: Option<
        unsafe extern "C" fn(
            qp: *mut ibv_qp,
            attr: *mut ibv_qp_attr,
            attr_mask: c_int,
            init_attr: *mut ibv_qp_init_attr,
        ) -> c_int,
    >,
    pub query_qp_data_in_order: UnusedOp,
    pub query_rt_values: UnusedOp,
    pub query_srq:
        Option<unsafe extern "C" fn(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int>,
    pub read_counters: UnusedOp,
    pub reg_dm_mr: UnusedOp,
    pub reg_dmabuf_mr: UnusedOp,
    pub reg_mr: Option<
        unsafe extern "C" fn(
            pd: *mut ibv_pd,
            addr: *mut c_void,
            length: usize,
            hca_va: u64,
            access: c_int,
        ) -> *mut ibv_mr,
    >,
    pub req_notify_cq:
        Option<unsafe extern "C" fn(cq: *mut ibv_cq, solicited_only: c_int) -> c_int>,
    pub rereg_mr: UnusedOp,
    pub resize_cq: UnusedOp,
    pub set_ece: UnusedOp,
    pub unimport_dm: UnusedOp,
    pub unimport_mr: UnusedOp,
    pub unimport_pd: UnusedOp,
}

// SAFETY: the ops table is immutable static data (function pointers).
unsafe impl Sync for verbs_context_ops {}

unsafe extern "C" {
    /// Adds a provider to libibverbs' list (called from the provider's constructor).
    pub fn verbs_register_driver_34(ops: *const verbs_device_ops);
    /// Allocates `alloc_size` zeroed bytes and initialises the `verbs_context` at
    /// `context_offset` in them (no kernel command). Closes `cmd_fd` on failure.
    pub fn _verbs_init_and_alloc_context(
        device: *mut ibv_device,
        cmd_fd: c_int,
        alloc_size: usize,
        context_offset: *mut verbs_context,
        driver_id: u32,
    ) -> *mut c_void;
    /// Copies the non-NULL ops into the context.
    pub fn verbs_set_ops(vctx: *mut verbs_context, ops: *const verbs_context_ops);
    /// Releases what `_verbs_init_and_alloc_context` set up (closes `cmd_fd` and
    /// `async_fd`), not the allocation.
    pub fn verbs_uninit_context(vctx: *mut verbs_context);
}

/// One checked layout fact: `("verbs_qp", Some("comp_mask"), offset)` or
/// `("verbs_qp", None, size)`.
pub type LayoutFact = (&'static str, Option<&'static str>, usize);

macro_rules! facts {
    ($( $ty:ident : [ $( $field:ident $(as $cname:literal)? ),* ] ),* $(,)?) => {
        &[ $(
            (stringify!($ty), None, size_of::<$ty>()),
            $( (stringify!($ty), Some(facts!(@name $field $($cname)?)), offset_of!($ty, $field)), )*
        )* ]
    };
    (@name $field:ident $cname:literal) => { $cname };
    (@name $field:ident) => { stringify!($field) };
}

/// Every size and offset this crate relies on, private and public structures; checked
/// against C by `tests/abi_layout.rs`.
pub const LAYOUT: &[LayoutFact] = facts! {
    verbs_match_ent: [driver_data, u, vendor, device, kind],
    verbs_sysfs_dev: [entry, provider_data, match_ as "match", flags, sysfs_name, sysfs_cdev,
        ibdev_name, ibdev_path, modalias, node_guid, driver_id, node_type, ibdev_idx,
        num_ports, abi_ver, time_created],
    verbs_device_ops: [name, match_min_abi_version, match_max_abi_version, match_table,
        static_providers, match_device, alloc_context, import_context, alloc_device,
        uninit_device],
    verbs_device: [device, ops, refcount, entry, sysfs, core_support],
    verbs_mr: [ibv_mr, mr_type, access],
    verbs_qp: [comp_mask, xrcd],
    verbs_cq: [],
    verbs_srq: [srq, srq_type, xrcd, cq, srq_num],
    verbs_context_ops: [advise_mr, alloc_pd, async_event, cq_event, create_cq, create_qp,
        create_srq, dealloc_pd, dereg_mr, destroy_cq, destroy_qp, destroy_srq, free_context,
        modify_qp, modify_srq, poll_cq, post_recv, post_send, post_srq_recv, query_device_ex,
        query_port, query_qp, query_srq, reg_mr, req_notify_cq, unimport_pd],
    verbs_context: [query_port, context],
    ibv_context: [device, cmd_fd, async_fd, num_comp_vectors, mutex],
    ibv_device: [node_type, transport_type, name, dev_name, dev_path, ibdev_path],
    ibv_comp_channel: [context, fd, refcnt],
    ibv_cq: [context, channel, cq_context, handle, cqe, comp_events_completed,
        async_events_completed],
    ibv_pd: [context, handle],
    ibv_mr: [context, pd, addr, length, handle, lkey, rkey],
    ibv_srq: [context, srq_context, pd, handle, events_completed],
    ibv_qp: [context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type,
        events_completed],
    ibv_wc: [wr_id, status, opcode, vendor_err, byte_len, qp_num, src_qp, wc_flags,
        pkey_index, slid, sl, dlid_path_bits],
    ibv_send_wr: [wr_id, next, sg_list, num_sge, opcode, send_flags, wr],
    ibv_recv_wr: [wr_id, next, sg_list, num_sge],
    ibv_qp_init_attr: [qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all],
    ibv_qp_attr: [qp_state, cur_qp_state, path_mtu, qkey, rq_psn, sq_psn, dest_qp_num,
        qp_access_flags, cap, ah_attr, pkey_index, max_rd_atomic, max_dest_rd_atomic,
        min_rnr_timer, port_num, timeout, retry_cnt, rnr_retry],
    ibv_srq_init_attr: [srq_context, attr],
    ibv_srq_attr: [max_wr, max_sge, srq_limit],
    ibv_port_attr: [state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz,
        pkey_tbl_len, active_width, active_speed, phys_state, link_layer, flags],
    ibv_device_attr_ex: [orig_attr, comp_mask],
    ibv_async_event: [element, event_type],
};

/// The private ABI guard at run time: whether the libibverbs this process uses exports
/// `verbs_register_driver_34@IBVERBS_PRIVATE_34`. `Err` says why not (library missing, or
/// the symbol with that version absent: another rdma-core private ABI).
pub fn private_abi_available() -> Result<(), String> {
    // SAFETY: dlopen with a constant NUL-terminated name; the handle is only used for
    // dlvsym and closed below.
    let lib = unsafe {
        libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_LOCAL,
        )
    };
    if lib.is_null() {
        return Err(format!("cannot load libibverbs.so.1: {}", dlerror_text()));
    }
    // SAFETY: valid handle, constant NUL-terminated names.
    let sym = unsafe {
        libc::dlvsym(
            lib,
            c"verbs_register_driver_34".as_ptr(),
            c"IBVERBS_PRIVATE_34".as_ptr(),
        )
    };
    // SAFETY: the handle came from dlopen above and nothing from it is used afterwards.
    unsafe { libc::dlclose(lib) };
    if sym.is_null() {
        return Err(format!(
            "the installed libibverbs.so.1 does not export {REGISTER_SYMBOL}@{PRIVATE_VERSION}: \
             rdmx-ibv's provider is built for libibverbs' private ABI {PABI_VERSION} \
             (rdma-core v35..v56); rebuild rdmx-ibv against this rdma-core after checking \
             src/abi against its infiniband/driver.h"
        ));
    }
    Ok(())
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated thread-local string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (above).
    unsafe { std::ffi::CStr::from_ptr(e) }
        .to_string_lossy()
        .into_owned()
}

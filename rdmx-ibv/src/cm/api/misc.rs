//! Options, ports, devices, event names.

use super::*;

#[unsafe(no_mangle)]
pub extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    _optlen: usize,
) -> c_int {
    guard("rdma_set_option", -1, || {
        let Some(idr) = Id::lookup(id) else {
            return fail(libc::EINVAL);
        };
        if optval.is_null() {
            return fail(libc::EINVAL);
        }
        // RDMA_OPTION_ID (0): TOS (0), REUSEADDR (1), AFONLY (2), ACK_TIMEOUT (3);
        // RDMA_OPTION_IB (1): PATH (1). ACK_TIMEOUT (a u8, as the kernel reads it) sets
        // the QP's local ACK timeout at RTS; the others are accepted and have no effect
        // on the soft transport (no ToS, one path, sockets reuse addresses already);
        // anything else is the kernel's ENOSYS.
        match (level, optname) {
            (0, 3) => {
                // SAFETY: the caller's option value (at least one byte).
                let v = unsafe { *(optval as *const u8) };
                if v > 31 {
                    return fail(libc::EINVAL);
                }
                idr.st.lock().ack_timeout = Some(v);
                0
            }
            (0, 0..=2) | (1, 1) => 0,
            _ => fail(libc::ENOSYS),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    guard("rdma_notify", -1, || {
        if Id::lookup(id).is_none() {
            return fail(libc::EINVAL);
        }
        0
    })
}

pub(super) fn port_of(sa: *const libc::sockaddr) -> u16 {
    // SAFETY: the storage member of an id's route holds a socket address or zeros.
    unsafe { dev::from_c(sa) }.map_or(0, |a| a.port().to_be())
}

/// # Safety
/// `id` is a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller's promise.
    guard("rdma_get_src_port", 0, || unsafe {
        port_of(&(*id).route.addr.src_addr_union.src_addr)
    })
}

/// # Safety
/// `id` is a live id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller's promise.
    guard("rdma_get_dst_port", 0, || unsafe {
        port_of(&(*id).route.addr.dst_addr_union.dst_addr)
    })
}

/// # Safety
/// `num_devices` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    guard("rdma_get_devices", std::ptr::null_mut(), || {
        let ctx = dev::dev().map(|d| d.ctx).ok();
        // SAFETY: calloc of two pointers, freed by rdma_free_devices.
        let list = unsafe { libc::calloc(2, std::mem::size_of::<*mut ibv_context>()) }
            as *mut *mut ibv_context;
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return list;
        }
        // SAFETY: list holds two slots; the caller's out-pointer.
        unsafe {
            if let Some(c) = ctx {
                *list = c;
            }
            if !num_devices.is_null() {
                *num_devices = c_int::from(ctx.is_some());
            }
        }
        list
    })
}

/// # Safety
/// `list` came from rdma_get_devices.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: the caller's promise (calloc'd by rdma_get_devices).
    guard("rdma_free_devices", (), || unsafe {
        libc::free(list.cast())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn rdma_event_str(event: u32) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 17] = [
        c"RDMA_CM_EVENT_ADDR_RESOLVED",
        c"RDMA_CM_EVENT_ADDR_ERROR",
        c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        c"RDMA_CM_EVENT_ROUTE_ERROR",
        c"RDMA_CM_EVENT_CONNECT_REQUEST",
        c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        c"RDMA_CM_EVENT_CONNECT_ERROR",
        c"RDMA_CM_EVENT_UNREACHABLE",
        c"RDMA_CM_EVENT_REJECTED",
        c"RDMA_CM_EVENT_ESTABLISHED",
        c"RDMA_CM_EVENT_DISCONNECTED",
        c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        c"RDMA_CM_EVENT_MULTICAST_JOIN",
        c"RDMA_CM_EVENT_MULTICAST_ERROR",
        c"RDMA_CM_EVENT_ADDR_CHANGE",
        c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        c"UNKNOWN EVENT",
    ];
    NAMES[(event as usize).min(16)].as_ptr()
}

//! The route and path record of an id (RoCE: made from the addresses, no SA).

use super::*;

/// The route of a new id: addresses, GIDs, one path record (RoCE's, from the addresses).
///
/// # Safety
/// `b` is an id box no other thread uses.
pub unsafe fn fill_route(
    b: &mut id::IdBox,
    dev: &Dev,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
) {
    let c = &mut b.id;
    c.verbs = dev.ctx;
    c.port_num = 1;
    if c.pd.is_null() {
        c.pd = dev.pd;
    }
    // SAFETY: writing the storage members of the address unions.
    unsafe {
        if let Some(l) = local {
            dev::to_c(l, &mut c.route.addr.src_addr_union.src_storage);
        }
        if let Some(r) = remote {
            dev::to_c(r, &mut c.route.addr.dst_addr_union.dst_storage);
        }
        let ib = &mut c.route.addr.addr.ibaddr;
        ib.sgid.raw = dev.gid;
        if let Some(r) = remote {
            ib.dgid.raw = dev::ip_gid(r.ip());
        }
        ib.pkey = 0xffffu16.to_be();
    }
    fill_path(b, dev, remote);
}

/// The path record of `rdma_resolve_route` for RoCE: GIDs, P_Key, MTU, hop limit.
pub fn fill_path(b: &mut id::IdBox, dev: &Dev, remote: Option<SocketAddr>) {
    let p = &mut b.path;
    p.sgid.raw = dev.gid;
    if let Some(r) = remote {
        p.dgid.raw = dev::ip_gid(r.ip());
    }
    p.pkey = 0xffffu16.to_be();
    p.hop_limit = 64;
    p.reversible = 1;
    p.numb_path = 1;
    p.mtu_selector = 2; // exactly
    p.mtu = dev.mtu;
    p.rate_selector = 2;
    p.rate = 3; // 10 Gb/s, what the sysfs tree reports
    p.packet_life_time_selector = 2;
    p.packet_life_time = 16; // CMA_IBOE_PACKET_LIFETIME
    b.id.route.path_rec = &mut b.path;
    b.id.route.num_paths = 1;
}

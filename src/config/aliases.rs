//! Ceph's `ms_async_rdma_*` option names, so a ceph.conf RDMA section carries over: each maps
//! onto an rdmx key (with a value transform) or is rejected with the reason it means nothing
//! here.

/// How a Ceph value becomes the rdmx key's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transform {
    /// The value carries over unchanged (still checked against the rdmx key's range).
    Same,
    /// A Ceph boolean becomes on/off (enable_hugepage -> hugepages).
    BoolToOnOff,
}

/// What a Ceph name does in rdmx.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AliasTarget {
    Key {
        key: &'static str,
        transform: Transform,
    },
    /// No meaning in rdmx; setting it is an error that gives `why`.
    Rejected,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alias {
    pub name: &'static str,
    pub target: AliasTarget,
    pub why: &'static str,
}

/// The prefix every Ceph RDMA messenger option has.
pub const CEPH_PREFIX: &str = "ms_async_rdma_";

const fn same(name: &'static str, key: &'static str, why: &'static str) -> Alias {
    Alias {
        name,
        target: AliasTarget::Key {
            key,
            transform: Transform::Same,
        },
        why,
    }
}

const fn rejected(name: &'static str, why: &'static str) -> Alias {
    Alias {
        name,
        target: AliasTarget::Rejected,
        why,
    }
}

pub static ALIASES: &[Alias] = &[
    same(
        "ms_async_rdma_buffer_size",
        "chunk_size",
        "Ceph's registered buffer chunk is rdmx's pool chunk",
    ),
    same(
        "ms_async_rdma_send_buffers",
        "max_send_wr",
        "Ceph sizes its send queue by its send buffer count",
    ),
    same(
        "ms_async_rdma_receive_buffers",
        "pool_chunks",
        "Ceph's receive buffer count is the size of rdmx's chunk pool",
    ),
    same(
        "ms_async_rdma_receive_queue_len",
        "max_recv_wr",
        "receives posted per queue",
    ),
    same(
        "ms_async_rdma_polling_us",
        "polling_us",
        "the same: busy-poll time before sleeping on the completion channel",
    ),
    same(
        "ms_async_rdma_gid_idx",
        "gid_index",
        "the same GID table index",
    ),
    same("ms_async_rdma_sl", "sl", "the same service level"),
    same(
        "ms_async_rdma_dscp",
        "traffic_class",
        "Ceph puts dscp unshifted into the GRH traffic_class byte, so the value carries over as is",
    ),
    same(
        "ms_async_rdma_device_name",
        "device",
        "the same device name",
    ),
    same("ms_async_rdma_port_num", "port", "the same port number"),
    Alias {
        name: "ms_async_rdma_enable_hugepage",
        target: AliasTarget::Key {
            key: "hugepages",
            transform: Transform::BoolToOnOff,
        },
        why: "true -> on (require huge pages), false -> off",
    },
    same(
        "ms_async_op_threads",
        "msgr_threads",
        "Ceph's messenger worker threads are the messenger's worker threads",
    ),
    rejected(
        "ms_async_rdma_support_srq",
        "rdmx's messenger uses no SRQ: each connection posts its own receives and grants credits for them, so receivers are not starved (SRQs exist for verbs applications under rdmx-ibv, which keep their own setting)",
    ),
    rejected(
        "ms_async_rdma_cm",
        "rdmx exchanges QP details over a TCP side channel, not rdma_cm",
    ),
    rejected(
        "ms_async_rdma_type",
        "rdmx speaks RoCEv2 RC only (no InfiniBand or iWARP)",
    ),
    rejected("ms_async_rdma_roce_ver", "rdmx speaks RoCEv2 only"),
    rejected("ms_async_rdma_local_gid", "rdmx picks the GID by gid_index"),
];

/// The alias called `name` (normalized).
pub fn find(name: &str) -> Option<&'static Alias> {
    ALIASES.iter().find(|a| a.name == name)
}

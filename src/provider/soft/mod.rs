//! The soft provider: the RC engine on UDP sockets (RoCEv2 framing), with memory
//! regions, completion queues, queue pairs and a progress engine.

pub mod cq;
pub mod device;
pub(crate) mod diagnose;
pub mod mr;
pub mod qp;
pub mod srq;
pub mod ud;
pub(crate) mod udp;
pub mod window;

// The provider-neutral OS pieces and route MTU (`crate::provider::{sys, mtu}`), under the
// names the soft provider's files use.
pub(crate) use super::{mtu, sys};

/// Not part of the API (no stability promise): the soft provider's UDP socket layer
/// (sendmmsg/recvmmsg batches with GSO/GRO) and its poll(2) wait. Public only with the
/// `udp-baseline` feature, which `rdmx-perf` enables: its `udp_server`/`udp_read` baseline,
/// the bare UDP loop `read_bw` is compared with, must move datagrams through the same
/// batching and offloads as the provider for the comparison to mean anything.
#[cfg(feature = "udp-baseline")]
pub mod udp_baseline {
    pub use super::sys::poll_readable;
    pub use super::udp::{RxBatch, TxDatagram, UdpPort};
}

//! rdmx as a libibverbs device: unmodified verbs programs run on the soft transport.
//!
//! - [`verbs`]: the verbs objects (device, PD, MR, CQ, completion channel, SRQ, RC QP)
//!   on top of rdmx's soft provider, in safe Rust.
//! - [`abi`]: libibverbs' private provider ABI (`IBVERBS_PRIVATE_34`), hand-written and
//!   checked against rdma-core's `driver.h` by `tests/abi_layout.rs`.
//! - [`glue`]: the provider libibverbs loads (`librdmx-rdmav34.so` = this crate's
//!   cdylib), which registers itself from a constructor and maps every provider op onto
//!   [`verbs`]; it also replaces `ibv_create_comp_channel`/`ibv_destroy_comp_channel`
//!   when preloaded.
//! - [`cm`]: the RDMA connection manager (librdmacm's API, exported by the preloaded
//!   provider).
//! - [`launcher`]: `rdmx-ibv exec` (fake sysfs tree, private mount namespace with
//!   `/dev/infiniband/uverbs0`, environment) (`src/bin/rdmx-ibv.rs`).

pub mod abi;
pub mod cm;
pub mod glue;
pub mod launcher;
pub mod verbs;

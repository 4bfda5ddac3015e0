//! rdmx as a libibverbs device: unmodified verbs programs run on the soft transport.
//!
//! - [`verbs`]: the verbs objects (device, PD, MR, CQ, completion channel, SRQ, RC QP)
//!   on top of rdmx's soft provider, in safe Rust.
//! - the provider glue that libibverbs loads (`librdmx-rdmav34.so`), and the
//!   `rdmx-ibv exec` launcher (`src/bin/rdmx-ibv.rs`).

pub mod verbs;

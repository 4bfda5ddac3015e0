//! Memory-pooled registration: 2 MiB-aligned arenas, pools of fixed-size chunks carved
//! from them (each arena registered once), and a registration cache for caller buffers.
//! Knows nothing about connections: registration goes through [`Registrar`], which the
//! providers implement.

use crate::error::Result;

/// The keys of one registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrKeys {
    pub lkey: u32,
    pub rkey: u32,
}

/// Registers memory with a provider (the soft provider's `MrTable`, later verbs).
pub trait Registrar: Send + Sync {
    /// Registers `[addr, addr + len)` with `access` (`ibv_access_flags` bits).
    ///
    /// # Safety
    /// The memory must stay valid and mapped until `deregister(lkey)` succeeds.
    unsafe fn register(&self, addr: *mut u8, len: usize, access: u32) -> Result<MrKeys>;
    /// Removes the registration with `lkey` (`Busy` while work requests name it).
    fn deregister(&self, lkey: u32) -> Result<()>;
}

pub mod arena;
pub mod pool;
pub mod rcache;

//! The engines of the domains that keep data of their own: what a domain's tools ask
//! of the storage, and the checks every backend applies before its SQL.
//!
//! The traits live here, in the contract, so that a domain crate depends on `loadout`
//! alone: `loadout-store` implements them per backend (its `sqlite/` and `postgres/`
//! modules hold only SQL), and a tool reaches them through
//! [`Storage::memory_engine`](crate::Storage::memory_engine) and
//! [`Storage::scratchpad_engine`](crate::Storage::scratchpad_engine).

pub mod memory;
pub mod scratchpad;

pub use memory::MemoryEngine;
pub use scratchpad::ScratchpadEngine;

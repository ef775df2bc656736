//! The hub that links every domain crate.
//!
//! The linker drops a crate nothing references, and with it the tools it submitted
//! to inventory. Each domain crate is named here once, so anything that depends on
//! this crate (the `loadout` binary, the integration tests) gets every tool.
//! `cargo xtask lint` fails when a crate under `domains/` is missing from this list.

pub use loadout_domain_core as core;
pub use loadout_domain_filesystem as filesystem;
pub use loadout_domain_memory as memory;
pub use loadout_domain_scratchpad as scratchpad;

/// Builds the registry of every linked domain. Calling a function of this crate is
/// what keeps the `pub use` lines above from being dropped.
pub fn registry() -> Result<loadout::Registry, loadout::RegistryError> {
    core::link();
    filesystem::link();
    memory::link();
    scratchpad::link();
    loadout::Registry::from_inventory()
}

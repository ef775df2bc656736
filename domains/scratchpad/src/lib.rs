//! placeholder

/// Referenced by the `loadout-domains` hub so the linker keeps this crate.
pub fn link() {}

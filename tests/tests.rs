//! The one integration-test binary: each module is one concern.

mod cli;
mod mcp;
mod registry;
mod ui;

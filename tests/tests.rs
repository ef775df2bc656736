//! The one integration-test binary: each module is one concern.

mod cli;
mod registry;
mod ui;

//! The one integration-test binary: each module is one concern.

mod cli;
mod http;
mod mcp;
mod registry;
mod support;
mod ui;

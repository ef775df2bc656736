//! The one integration-test binary: each module is one concern.

mod chat;
mod cli;
mod crash;
mod hardening;
mod hardening2;
mod http;
mod mcp;
mod properties;
mod registry;
mod replicas;
mod support;
mod telemetry;

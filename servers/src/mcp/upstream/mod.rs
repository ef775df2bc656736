//! Upstream MCP servers as domains.
//!
//! The config file's `[servers]` table (`loadout.toml`, see [`crate::config`]) lists
//! servers, run as a child process over stdio or reached over streamable HTTP:
//!
//! ```toml
//! [servers.time]
//! command = "uvx"
//! args = ["mcp-server-time"]
//! env = { TZ = "UTC" }
//! keywords = ["time zone", "convert time"]
//! description = "Current time and time-zone conversion."   # optional
//!
//! [servers.search]
//! url = "https://mcp.example.com/mcp"
//! headers = { Authorization = "Bearer <token>" }
//! keywords = ["web search"]
//! ```
//!
//! Each server's tools become domain `mcp_<server>` with tool names
//! `<server>__<tool>` (kept to `[a-z0-9_-]{1,64}`), descriptions and schemas from
//! the server, keywords from the config. Calls are forwarded with rmcp's client. A
//! server that exits, or an HTTP server that stops answering on our session, is
//! reconnected with backoff (a fresh session, its tools listed again); a
//! `tools/list_changed` from it re-lists its tools, and the catalog is rebuilt.
//!
//! Header values are never logged or quoted in an error: credentials belong there,

mod client;
mod config;
mod failure;
mod forwarding;
mod reconcile;
mod supervision;

use std::sync::Mutex;
use std::time::Duration;

pub use config::ServerConfig;
pub(crate) use config::check_servers;
pub use forwarding::UpstreamClient;
pub use reconcile::{Reconciled, Upstreams};
pub use supervision::Upstream;

/// Time to start a server and list its tools before it is reported as failing.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// An unreachable HTTP host fails within this instead of the OS's minutes.
const HTTP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// An idle HTTP upstream is pinged this often: a server that restarted has
/// forgotten our session, so without a check we would miss its `list_changed`
/// until the next call failed.
const HEALTH_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);
/// Headers the streamable HTTP transport sets itself; a configured one would clash.
const TRANSPORT_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "last-event-id",
    "mcp-protocol-version",
    "mcp-session-id",
];

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests;

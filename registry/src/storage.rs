//! What tools see of the storage a server opened: the settings, the data dir, and the
//! engines of the domains with data of their own (scratchpad, memory). The backends
//! themselves live in `loadout-store`; this crate holds no driver.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;

use tokio::sync::watch;

use crate::engine::{MemoryEngine, ScratchpadEngine};

/// A boxed future that can be sent between threads: what the methods of a trait
/// object return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("cannot open database {url}: {message}")]
    Open { url: String, message: String },
    #[error("unsupported database URL `{url}`: {reason}")]
    BadUrl { url: String, reason: String },
    #[error(
        "database schema version {found} is newer than this binary knows ({known}); upgrade loadout"
    )]
    SchemaTooNew { found: i64, known: i64 },
    #[error("database error: {0}")]
    Database(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("invalid input: {0}")]
    Invalid(String),
    /// The database cannot be reached right now (server down, connection lost, file
    /// busy). Retrying later succeeds once it is back.
    #[error("database unavailable: {0}")]
    Unavailable(String),
}

/// What a backend's settings listener reports (PostgreSQL `LISTEN/NOTIFY`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SettingsChange {
    /// Changes with every settings write by any replica, and whenever the listener
    /// connects or loses its connection (a write may have been missed).
    pub generation: u64,
    /// The listener is connected: a write by anyone will change `generation`.
    pub listening: bool,
}

/// The storage behind [`Settings`](crate::Settings) and [`ToolContext`](crate::ToolContext).
pub trait Storage: Send + Sync + std::fmt::Debug + 'static {
    fn settings_all(&self) -> BoxFuture<'_, Result<BTreeMap<String, String>, StoreError>>;
    fn setting_set<'a>(
        &'a self,
        key: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    /// Whether the key had a value.
    fn setting_unset<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// Changes whenever anyone writes a setting; asked where there is no listener.
    fn settings_version(&self) -> BoxFuture<'_, Result<i64, StoreError>>;
    /// The backend's change notifications, where it has them.
    fn settings_changes(&self) -> Option<watch::Receiver<SettingsChange>>;
    /// The directory for per-session files.
    fn data_dir(&self) -> &Path;
    /// Where the `memory` domain keeps its notes on this storage; `None` where it has
    /// no engine for it.
    fn memory_engine(&self) -> Option<&dyn MemoryEngine> {
        None
    }
    /// The scratch database of one session namespace (a checked name of letters,
    /// digits, `_` and `-`) on this storage; `None` where it has no engine for it.
    fn scratchpad_engine<'a>(
        &'a self,
        namespace: &'a str,
    ) -> Option<Box<dyn ScratchpadEngine + 'a>> {
        let _ = namespace;
        None
    }
}

//! All state a user expects to survive a restart and to be shared between processes:
//! settings, sessions and their messages, tool calls, each turn's routing decision,
//! the router's per-session state, and the audit log.
//!
//! [`Store`] is the one interface; the backend underneath (embedded SQLite by default)
//! is chosen by a database URL and is invisible to the router and the servers.
//! Domains that keep their own data (scratchpad, memory) reach the backend through
//! [`Store::backend`] and implement each engine themselves.

mod sqlite;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

pub use sqlite::SqliteStore;

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
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Database(e.to_string())
    }
}

/// The engine behind a [`Store`].
#[non_exhaustive]
pub enum StoreBackend {
    Sqlite(SqliteStore),
}

/// Handle to the state backend; cheap to clone.
#[derive(Clone)]
pub struct Store {
    backend: Arc<StoreBackend>,
    data_dir: Arc<PathBuf>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("url", &self.url_masked())
            .finish()
    }
}

/// One row of the audit log of tool calls.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AuditRow {
    pub at_ms: i64,
    pub client: String,
    pub tool: String,
    /// Arguments with secret-looking values masked.
    pub args: serde_json::Value,
    /// `ok`, or the error kind.
    pub outcome: String,
    pub detail: Option<String>,
    pub duration_ms: f64,
}

/// One routing decision, as the decision log keeps it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DecisionRow {
    pub at_ms: i64,
    pub session: Option<String>,
    pub turn: i64,
    /// The message, or its hash when the privacy setting asks for that.
    pub message: String,
    pub n_tools: i64,
    pub tokens: i64,
    /// Domains with stage and score, as JSON.
    pub reasons: serde_json::Value,
}

/// A message of a session.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MessageRow {
    pub turn: i64,
    pub role: String,
    pub content: serde_json::Value,
    pub at_ms: i64,
}

/// The router's memory of one domain in one session.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SessionDomainState {
    pub domain: String,
    /// Last turn a tool of this domain was called or it was explicitly loaded.
    pub last_used_turn: i64,
    /// Stays loaded for the rest of the session (mid-workflow state).
    pub pinned: bool,
    /// Unloaded by the model (`unload_tools`); kept out until used again.
    pub unloaded: bool,
}

impl Store {
    /// Opens the backend a URL names: `None` or a `sqlite:` URL or plain path →
    /// SQLite (default: `loadout.db` in `data_dir`). Migrations run before this returns.
    pub async fn connect(database_url: Option<&str>, data_dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|e| StoreError::Open {
            url: data_dir.display().to_string(),
            message: format!("cannot create data dir: {e}"),
        })?;
        let backend = match database_url {
            None => StoreBackend::Sqlite(SqliteStore::open(&data_dir.join("loadout.db")).await?),
            Some(url) => match url.split_once(':') {
                Some(("sqlite", rest)) => {
                    let path = rest.trim_start_matches("//");
                    if path.is_empty() {
                        return Err(StoreError::BadUrl {
                            url: url.to_owned(),
                            reason: "no file path after `sqlite:`".into(),
                        });
                    }
                    StoreBackend::Sqlite(SqliteStore::open(Path::new(path)).await?)
                }
                Some(("postgres" | "postgresql", _)) => {
                    return Err(StoreError::BadUrl {
                        url: mask_url_password(url),
                        reason: "this build has no PostgreSQL backend yet".into(),
                    });
                }
                Some((scheme, _)) => {
                    return Err(StoreError::BadUrl {
                        url: mask_url_password(url),
                        reason: format!(
                            "unknown scheme `{scheme}`; use sqlite:PATH or postgres://…"
                        ),
                    });
                }
                None => {
                    return Err(StoreError::BadUrl {
                        url: url.to_owned(),
                        reason: "expected sqlite:PATH or postgres://…".into(),
                    });
                }
            },
        };
        Ok(Store {
            backend: Arc::new(backend),
            data_dir: Arc::new(data_dir.to_path_buf()),
        })
    }

    /// Opens SQLite in a directory: the common case for tests and the CLI.
    pub async fn open_dir(data_dir: &Path) -> Result<Store, StoreError> {
        Store::connect(None, data_dir).await
    }

    pub fn backend(&self) -> &StoreBackend {
        &self.backend
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The database URL with any password masked, for messages.
    pub fn url_masked(&self) -> String {
        match &*self.backend {
            StoreBackend::Sqlite(s) => format!("sqlite:{}", s.path().display()),
        }
    }

    pub async fn settings_all(&self) -> Result<BTreeMap<String, String>, StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.settings_all().await,
        }
    }

    pub async fn setting_set(&self, key: &str, value: &str) -> Result<(), StoreError> {
        validate_setting_key(key)?;
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.setting_set(key, value).await,
        }
    }

    /// Removes a setting; `Ok(false)` when it had no value.
    pub async fn setting_unset(&self, key: &str) -> Result<bool, StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.setting_unset(key).await,
        }
    }

    /// A token that changes whenever settings may have been written by any process;
    /// caches compare it to decide whether to reload.
    pub async fn settings_version(&self) -> Result<i64, StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.settings_version().await,
        }
    }

    pub async fn session_create(&self) -> Result<String, StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.session_create().await,
        }
    }

    /// Creates the session if it does not exist (clients may pick their own ids).
    pub async fn session_ensure(&self, id: &str) -> Result<(), StoreError> {
        validate_session_id(id)?;
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.session_ensure(id).await,
        }
    }

    pub async fn session_exists(&self, id: &str) -> Result<bool, StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.session_exists(id).await,
        }
    }

    /// Number of user turns so far: the router's clock for stickiness.
    pub async fn session_turn(&self, id: &str) -> Result<i64, StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.session_turn(id).await,
        }
    }

    /// Appends a message; a `user` message starts a new turn. Returns the turn.
    pub async fn message_append(
        &self,
        session: &str,
        role: &str,
        content: &serde_json::Value,
    ) -> Result<i64, StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.message_append(session, role, content).await,
        }
    }

    pub async fn messages(&self, session: &str) -> Result<Vec<MessageRow>, StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.messages(session).await,
        }
    }

    pub async fn session_domains(
        &self,
        session: &str,
    ) -> Result<Vec<SessionDomainState>, StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.session_domains(session).await,
        }
    }

    pub async fn session_domain_put(
        &self,
        session: &str,
        state: &SessionDomainState,
    ) -> Result<(), StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.session_domain_put(session, state).await,
        }
    }

    /// Records that a domain was used now, for the cross-session warm rule.
    pub async fn domain_used(&self, domain: &str, at_ms: i64) -> Result<(), StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.domain_used(domain, at_ms).await,
        }
    }

    /// Domains used by any session since `since_ms`.
    pub async fn domains_used_since(&self, since_ms: i64) -> Result<Vec<String>, StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.domains_used_since(since_ms).await,
        }
    }

    pub async fn decisions_insert(&self, rows: &[DecisionRow]) -> Result<(), StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.decisions_insert(rows).await,
        }
    }

    pub async fn decisions(&self, session: &str) -> Result<Vec<DecisionRow>, StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.decisions(session).await,
        }
    }

    pub async fn audit_insert(&self, rows: &[AuditRow]) -> Result<(), StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.audit_insert(rows).await,
        }
    }

    /// The newest `n` audit rows, oldest first.
    pub async fn audit_tail(&self, n: usize) -> Result<Vec<AuditRow>, StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.audit_tail(n).await,
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Setting keys are lowercase identifiers: they appear in error messages and URLs.
pub fn validate_setting_key(key: &str) -> Result<(), StoreError> {
    let ok = !key.is_empty()
        && key.len() <= 128
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "setting key `{}` must be 1-128 characters of a-z, 0-9, `_` or `.`",
            key.chars().take(80).collect::<String>()
        )))
    }
}

/// Session ids name files (scratchpad) and rows: keep them to a safe alphabet.
pub fn validate_session_id(id: &str) -> Result<(), StoreError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "session id `{}` must be 1-64 characters of A-Z, a-z, 0-9, `_` or `-`",
            id.chars().take(80).collect::<String>()
        )))
    }
}

/// Replaces the password of a URL with `***`.
pub fn mask_url_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests;

//! `loadout-store`: all state a user expects to survive a restart and to be shared
//! between processes: settings, sessions and their messages, each turn's routing
//! decision, the router's per-session state, and the audit log.
//!
//! [`Store`] is the one interface; the backend underneath (embedded SQLite by default,
//! PostgreSQL for several replicas) is chosen by a database URL. Each backend is split
//! by concern: migrations, settings, sessions, decisions, audit, and its connections.
//! The engines of the domains that keep data of their own (`loadout::engine`: memory,
//! scratchpad) are implemented here, per backend (`sqlite/memory.rs`,
//! `postgres/scratchpad/`, ...), and reached through [`loadout::Storage`].
//!
//! Depends on the `loadout` contract only; never on a domain or a server.

mod clients;
mod decisions;
mod learned;
pub mod postgres;
pub mod sqlite;
#[doc(hidden)]
pub mod testing;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

pub use clients::ClientRow;
pub use deadpool_postgres;
pub use decisions::{
    DecisionRow, DomainReason, LOGGED_NOT_SENT, MessageLogging, Reasons, ToolReason, sha256_hex,
};
pub use learned::{
    LearnOutcome, LearnedRow, LearnedToolSummary, LearnedWrite, MAX_LEARNED_MESSAGE_BYTES,
    MERGE_MIN_COSINE, normalized_text, summarize as summarize_learned,
};
pub use loadout::{SettingsChange, StoreError, validate_setting_key};
pub use postgres::{PostgresStore, describe_error as describe_pg_error, is_connection_error};
pub use sqlite::SqliteStore;
pub use tokio_postgres;

/// Newest schema version this binary knows, on every backend.
pub const SCHEMA_VERSION: i64 = sqlite::SCHEMA_VERSION;
const _: () = assert!(sqlite::SCHEMA_VERSION == postgres::SCHEMA_VERSION);

/// Pause before the one retry of a failed log write.
pub const RETRY_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// The engine behind a [`Store`].
#[non_exhaustive]
pub enum StoreBackend {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
}

/// Calls the same method on whichever backend is underneath.
macro_rules! dispatch {
    ($self:ident, $store:ident => $call:expr) => {
        match &*$self.backend {
            StoreBackend::Sqlite($store) => $call,
            StoreBackend::Postgres($store) => $call,
        }
    };
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

/// A message of a session.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MessageRow {
    pub turn: i64,
    pub role: String,
    pub content: serde_json::Value,
    pub at_ms: i64,
}

/// See [`Store::session_snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSnapshot {
    /// User turns so far (0 for a session that does not exist yet).
    pub turn: i64,
    /// The tools the latest turn carries into a follow-up with no evidence of its
    /// own (the router's `carry_over`), stored with that turn's message.
    pub carry: Vec<String>,
    pub domains: Vec<SessionDomainState>,
    /// Tools called with success in the session's latest turn (stored `tool`
    /// messages), with the turn of each call.
    pub recent_calls: Vec<(i64, String)>,
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
    /// Opens the backend a URL names: `None` or a `sqlite:PATH` URL → SQLite (default:
    /// `loadout.db` in `data_dir`); `postgres://…` or `postgresql://…` → PostgreSQL
    /// (no TLS). Migrations run before this returns. An unreachable server is
    /// [`StoreError::Open`] naming the URL with its password masked.
    pub async fn connect(database_url: Option<&str>, data_dir: &Path) -> Result<Store, StoreError> {
        // Credentials and conversations live here: a folder created now is its
        // user's alone.
        let created = {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(data_dir)
        };
        created.map_err(|e| StoreError::Open {
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
                    StoreBackend::Postgres(PostgresStore::connect(url).await?)
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
            StoreBackend::Postgres(s) => s.url_masked().to_owned(),
        }
    }

    /// Notifications of settings writes by any process, where the backend has them
    /// (PostgreSQL); `None` on SQLite, where [`settings_version`](Self::settings_version)
    /// is cheap enough to ask on every read.
    pub fn settings_changes(&self) -> Option<tokio::sync::watch::Receiver<SettingsChange>> {
        match &*self.backend {
            StoreBackend::Sqlite(_) => None,
            StoreBackend::Postgres(s) => Some(s.settings_changes()),
        }
    }

    pub async fn settings_all(&self) -> Result<BTreeMap<String, String>, StoreError> {
        dispatch!(self, s => s.settings_all().await)
    }

    pub async fn setting_set(&self, key: &str, value: &str) -> Result<(), StoreError> {
        validate_setting_key(key)?;
        dispatch!(self, s => s.setting_set(key, value).await)
    }

    /// Removes a setting; `Ok(false)` when it had no value.
    pub async fn setting_unset(&self, key: &str) -> Result<bool, StoreError> {
        dispatch!(self, s => s.setting_unset(key).await)
    }

    /// A token that changes whenever settings may have been written by any process;
    /// caches compare it to decide whether to reload.
    pub async fn settings_version(&self) -> Result<i64, StoreError> {
        dispatch!(self, s => s.settings_version().await)
    }

    pub async fn session_create(&self) -> Result<String, StoreError> {
        dispatch!(self, s => s.session_create().await)
    }

    /// Creates the session if it does not exist (clients may pick their own ids).
    pub async fn session_ensure(&self, id: &str) -> Result<(), StoreError> {
        validate_session_id(id)?;
        dispatch!(self, s => s.session_ensure(id).await)
    }

    /// Opens session `id` to `client` (`None`: the operator, who may use every
    /// session): creates it, owned by `client`, when it does not exist. `Ok(false)`
    /// when it belongs to someone else: another client, or the operator.
    pub async fn session_claim(&self, id: &str, client: Option<&str>) -> Result<bool, StoreError> {
        dispatch!(self, s => s.session_claim(id, client).await)
    }

    /// A new session owned by `client` (`None`: the operator's).
    pub async fn session_create_for(&self, client: Option<&str>) -> Result<String, StoreError> {
        let id = new_session_id();
        self.session_claim(&id, client).await?;
        Ok(id)
    }

    pub async fn session_exists(&self, id: &str) -> Result<bool, StoreError> {
        dispatch!(self, s => s.session_exists(id).await)
    }

    /// Number of user turns so far: the router's clock for stickiness.
    pub async fn session_turn(&self, id: &str) -> Result<i64, StoreError> {
        dispatch!(self, s => s.session_turn(id).await)
    }

    /// Appends a message; a `user` message starts a new turn. Returns the turn.
    pub async fn message_append(
        &self,
        session: &str,
        role: &str,
        content: &serde_json::Value,
    ) -> Result<i64, StoreError> {
        dispatch!(self, s => s.message_append(session, role, content, &[]).await)
    }

    /// Appends the user message that starts a new turn together with that turn's
    /// carry-over list, in one write. Returns the turn.
    pub async fn turn_append(
        &self,
        session: &str,
        message: &serde_json::Value,
        carry: &[String],
    ) -> Result<i64, StoreError> {
        dispatch!(self, s => s.message_append(session, "user", message, carry).await)
    }

    /// Replaces the carry-over list of turn `turn`, unless the session has moved on
    /// to a later turn (then that turn's list stands).
    pub async fn session_carry_put(
        &self,
        session: &str,
        turn: i64,
        carry: &[String],
    ) -> Result<(), StoreError> {
        validate_session_id(session)?;
        dispatch!(self, s => s.session_carry_put(session, turn, carry).await)
    }

    pub async fn messages(&self, session: &str) -> Result<Vec<MessageRow>, StoreError> {
        dispatch!(self, s => s.messages(session).await)
    }

    /// The text of the user message that started turn `turn` of `session`, if any.
    pub async fn user_message(
        &self,
        session: &str,
        turn: i64,
    ) -> Result<Option<String>, StoreError> {
        let stored = dispatch!(self, s => s.user_message(session, turn).await)?;
        Ok(stored.map(|content| match serde_json::from_str(&content) {
            Ok(serde_json::Value::String(text)) => text,
            _ => content,
        }))
    }

    /// Records tools a client's own model called in turn `turn` (what `/api/route`
    /// requests report in `called`) as successful `tool` messages of that turn, so the
    /// session's history and a replay of it know them. One write; nothing for a turn
    /// the session has not reached, or for an empty list.
    pub async fn calls_reported(
        &self,
        session: &str,
        turn: i64,
        names: &[String],
    ) -> Result<(), StoreError> {
        validate_session_id(session)?;
        if turn < 1 || names.is_empty() {
            return Ok(());
        }
        let rows: Vec<(String, String)> = names
            .iter()
            .map(|name| {
                let content = serde_json::json!({"name": name, "ok": true, "reported": true});
                (name.clone(), content.to_string())
            })
            .collect();
        dispatch!(self, s => s.calls_reported(session, turn, rows).await)
    }

    /// Sessions with a message at or after `since_ms`, most recently active first, at
    /// most `limit`.
    pub async fn sessions_active_since(
        &self,
        since_ms: i64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        dispatch!(self, s => s.sessions_active_since(since_ms, limit).await)
    }

    pub async fn session_domains(
        &self,
        session: &str,
    ) -> Result<Vec<SessionDomainState>, StoreError> {
        dispatch!(self, s => s.session_domains(session).await)
    }

    pub async fn session_domain_put(
        &self,
        session: &str,
        state: &SessionDomainState,
    ) -> Result<(), StoreError> {
        dispatch!(self, s => s.session_domain_put(session, state).await)
    }

    /// Records that a domain was used now, for the cross-session warm rule.
    pub async fn domain_used(&self, domain: &str, at_ms: i64) -> Result<(), StoreError> {
        dispatch!(self, s => s.domain_used(domain, at_ms).await)
    }

    /// Domains used by any session since `since_ms`.
    pub async fn domains_used_since(&self, since_ms: i64) -> Result<Vec<String>, StoreError> {
        dispatch!(self, s => s.domains_used_since(since_ms).await)
    }

    /// Domains used by any session since `since_ms` with the time of their last use,
    /// most recent first (ties by name): the warm domains, ranked.
    pub async fn domains_used_since_by_recency(
        &self,
        since_ms: i64,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        dispatch!(self, s => s.domains_used_since_by_recency(since_ms).await)
    }

    /// What routing a session's next turn reads, in one round trip where the backend
    /// allows: its turn count, its domain states and the tools called in its latest
    /// turn.
    pub async fn session_snapshot(&self, session: &str) -> Result<SessionSnapshot, StoreError> {
        match &*self.backend {
            StoreBackend::Sqlite(s) => s.session_snapshot(session).await,
            StoreBackend::Postgres(s) => {
                let ((turn, carry), domains, recent_calls) = tokio::try_join!(
                    s.session_head(session),
                    s.session_domains(session),
                    s.latest_turn_calls(session)
                )?;
                Ok(SessionSnapshot {
                    turn,
                    carry,
                    domains,
                    recent_calls,
                })
            }
        }
    }

    /// Writes a batch of decision rows in one transaction, retried once after
    /// [`RETRY_AFTER`] if it fails; on SQLite on the log connection.
    pub async fn decisions_insert(&self, rows: Vec<DecisionRow>) -> Result<(), StoreError> {
        dispatch!(self, s => s.decisions_insert(rows).await)
    }

    pub async fn decisions(&self, session: &str) -> Result<Vec<DecisionRow>, StoreError> {
        dispatch!(self, s => s.decisions(session).await)
    }

    /// The session's first logged decision: which domains were active when it began.
    pub async fn first_decision(&self, session: &str) -> Result<Option<DecisionRow>, StoreError> {
        dispatch!(self, s => s.first_decision(session).await)
    }

    /// Deletes up to `limit` of the decision log's oldest rows, in the order they
    /// were written, up to the first row stamped at or after `before_ms`, and returns
    /// how many went. Cheap when nothing is that old.
    ///
    /// A row whose clock was behind, written after a row within retention, stays
    /// until the rows before it go: the log is only ever cut at its old end, so on
    /// SQLite a session's chain of rows (see `sqlite/migrations.rs`) never loses a link in the
    /// middle. A row stamped more than [`FUTURE_SLACK_MS`] ahead of this machine's
    /// clock (a clock that was wrong and has been corrected) does not hold retention
    /// back.
    pub async fn decisions_prune(&self, before_ms: i64, limit: usize) -> Result<usize, StoreError> {
        dispatch!(self, s => s.decisions_prune(before_ms, limit).await)
    }

    /// Writes audit rows in one transaction, on the request connection: the call's
    /// answer waits for it, so that an acknowledged call is never missing from the log.
    pub async fn audit_insert(&self, rows: Vec<AuditRow>) -> Result<(), StoreError> {
        dispatch!(self, s => s.audit_insert(rows).await)
    }

    /// The newest `n` audit rows, oldest first.
    pub async fn audit_tail(&self, n: usize) -> Result<Vec<AuditRow>, StoreError> {
        dispatch!(self, s => s.audit_tail(n).await)
    }

    /// Learns a message and the tools its turn called with success, within the
    /// learned memory's bounds, in one transaction: tools `write.session` already
    /// taught today are dropped (a session counts once per tool per day, so that one
    /// user cannot steer routing for everyone; a write with no session, an example or
    /// an import, is exempt); a near-duplicate (the same tools, and the same words or
    /// vectors of one model at least [`MERGE_MIN_COSINE`] alike) moves the stored
    /// entry's time and count instead of adding one; and each tool keeps its newest
    /// `per_tool` entries (an entry left with no tool is deleted).
    pub async fn learned_insert(
        &self,
        write: LearnedWrite,
        per_tool: usize,
    ) -> Result<LearnOutcome, StoreError> {
        let write = learned::checked(write)?;
        if write.tools.is_empty() {
            return Ok(LearnOutcome::Nothing);
        }
        dispatch!(self, s => s.learned_insert(write, per_tool).await)
    }

    /// The learned entries, oldest first, with their tools: all of them, or those
    /// naming `tool`. Vectors come only for entries of encoder `vectors_of`.
    pub async fn learned_rows(
        &self,
        tool: Option<&str>,
        vectors_of: Option<&str>,
    ) -> Result<Vec<LearnedRow>, StoreError> {
        dispatch!(self, s => s.learned_rows(tool, vectors_of).await)
    }

    /// What was learned, per tool (or for `tool` only).
    pub async fn learned_summary(
        &self,
        tool: Option<&str>,
    ) -> Result<Vec<LearnedToolSummary>, StoreError> {
        let rows = self.learned_rows(tool, None).await?;
        let mut summary = learned::summarize(&rows);
        if let Some(tool) = tool {
            summary.retain(|s| s.tool == tool);
        }
        Ok(summary)
    }

    /// Adds a client; `false` when one of that name exists (nothing written).
    pub async fn client_insert(&self, row: ClientRow) -> Result<bool, StoreError> {
        dispatch!(self, s => s.client_insert(row).await)
    }

    /// Every client, by name.
    pub async fn clients_list(&self) -> Result<Vec<ClientRow>, StoreError> {
        dispatch!(self, s => s.clients_list().await)
    }

    /// Removes a client, and with it its token; `false` when there was none.
    pub async fn client_revoke(&self, name: &str) -> Result<bool, StoreError> {
        dispatch!(self, s => s.client_revoke(name).await)
    }

    /// The client whose token has this hex SHA-256, if any.
    pub async fn client_by_token_hash(&self, hash: &str) -> Result<Option<ClientRow>, StoreError> {
        dispatch!(self, s => s.client_by_token_hash(hash).await)
    }

    /// Forgets what was learned for `tool` (`None`: everything); returns how many
    /// entry links went.
    pub async fn learned_forget(&self, tool: Option<&str>) -> Result<usize, StoreError> {
        dispatch!(self, s => s.learned_forget(tool).await)
    }

    /// Gives entries learned without a vector (imports, a process without the dense
    /// stage) their vector from encoder `model`; an entry that has one keeps it.
    /// Returns how many were set.
    pub async fn learned_set_vectors(
        &self,
        model: &str,
        vectors: Vec<(i64, Vec<f32>)>,
    ) -> Result<usize, StoreError> {
        let vectors: Vec<(i64, Vec<f32>)> = vectors
            .into_iter()
            .filter(|(_, v)| !v.is_empty() && v.iter().all(|x| x.is_finite()))
            .collect();
        if vectors.is_empty() {
            return Ok(0);
        }
        dispatch!(self, s => s.learned_set_vectors(model, vectors).await)
    }

    /// A counter every write of the learned memory moves, by any process: replicas
    /// poll it to know when to rebuild their index.
    pub async fn learned_version(&self) -> Result<i64, StoreError> {
        dispatch!(self, s => s.learned_version().await)
    }

    /// The newest `n` rows of the decision log, oldest first.
    pub async fn decisions_tail(&self, n: usize) -> Result<Vec<DecisionRow>, StoreError> {
        dispatch!(self, s => s.decisions_tail(n).await)
    }
}

/// 128 random bits from the OS as hex; session ids must not be guessable.
pub(crate) fn new_session_id() -> String {
    let mut bytes = [0u8; 16];
    if getrandom_fill(&mut bytes).is_err() {
        // Fall back to time and address entropy; ids stay unique, if guessable.
        let seed = now_ms() as u128 ^ (&bytes as *const _ as usize as u128) << 64;
        bytes = seed.to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn getrandom_fill(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// How far ahead of this machine's clock a decision row may be stamped and still
/// count as recent for retention: other replicas' clocks differ by far less.
pub const FUTURE_SLACK_MS: i64 = 24 * 60 * 60 * 1000;

/// The newest stamp retention takes at face value (see [`Store::decisions_prune`]).
pub(crate) fn retention_horizon_ms() -> i64 {
    now_ms().saturating_add(FUTURE_SLACK_MS)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The tool a message records a successful call of: `{"name": …, "ok": true}` in a
/// `tool` message. Kept in a column of its own, so that routing reads a turn's calls
/// without parsing results (PostgreSQL's `jsonb` refuses a `\u0000` escape, which a
/// result may hold, and one such row would fail every later turn of the session).
pub fn called_tool<'a>(role: &str, content: &'a serde_json::Value) -> Option<&'a str> {
    (role == "tool" && content.get("ok") == Some(&serde_json::Value::Bool(true)))
        .then(|| content.get("name").and_then(serde_json::Value::as_str))
        .flatten()
}

/// A carry-over list as stored: a JSON array of tool names.
pub(crate) fn carry_json(carry: &[String]) -> Result<String, StoreError> {
    serde_json::to_string(carry)
        .map_err(|e| StoreError::Database(format!("encoding the carry-over list: {e}")))
}

/// A stored carry-over list; anything unreadable carries nothing (a follow-up then
/// routes on its own evidence) rather than failing the turn.
pub(crate) fn parse_carry(text: &str) -> Vec<String> {
    serde_json::from_str(text).unwrap_or_default()
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
    // The last `@`: a password written with an unescaped `@` stays masked whole.
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

impl loadout::Storage for Store {
    fn settings_all(&self) -> loadout::BoxFuture<'_, Result<BTreeMap<String, String>, StoreError>> {
        Box::pin(Store::settings_all(self))
    }

    fn setting_set<'a>(
        &'a self,
        key: &'a str,
        value: &'a str,
    ) -> loadout::BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::setting_set(self, key, value))
    }

    fn setting_unset<'a>(
        &'a self,
        key: &'a str,
    ) -> loadout::BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(Store::setting_unset(self, key))
    }

    fn settings_version(&self) -> loadout::BoxFuture<'_, Result<i64, StoreError>> {
        Box::pin(Store::settings_version(self))
    }

    fn settings_changes(&self) -> Option<tokio::sync::watch::Receiver<SettingsChange>> {
        Store::settings_changes(self)
    }

    fn data_dir(&self) -> &Path {
        Store::data_dir(self)
    }

    fn memory_engine(&self) -> Option<&dyn loadout::engine::MemoryEngine> {
        Some(match &*self.backend {
            StoreBackend::Sqlite(store) => store,
            StoreBackend::Postgres(store) => store,
        })
    }

    fn scratchpad_engine<'a>(
        &'a self,
        namespace: &'a str,
    ) -> Option<Box<dyn loadout::engine::ScratchpadEngine + 'a>> {
        Some(match &*self.backend {
            StoreBackend::Sqlite(_) => Box::new(sqlite::scratchpad::Scratchpad {
                path: self
                    .data_dir
                    .join("scratchpad")
                    .join(format!("{namespace}.db")),
            }),
            StoreBackend::Postgres(store) => {
                Box::new(postgres::scratchpad::Scratchpad { store, namespace })
            }
        })
    }
}

#[cfg(test)]
mod tests;

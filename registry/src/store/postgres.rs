//! The PostgreSQL backend: what several replicas of `loadout serve` / `loadout mcp`
//! share.
//!
//! - Connections come from a pool (`deadpool-postgres` over `tokio-postgres`) that
//!   replaces broken connections by itself: when the server goes away, operations
//!   fail with [`StoreError::Unavailable`], and succeed again once it is back,
//!   without rebuilding the [`Store`](super::Store).
//! - Connections are plain TCP or Unix sockets (`NoTls`): run PostgreSQL on a
//!   trusted network or loopback; a URL asking for `sslmode=require` is refused
//!   when connecting.
//! - Migrations carry the same version numbers and meaning as SQLite's, run under
//!   an advisory lock so that replicas starting together do not race, and refuse a
//!   schema newer than this binary.
//! - Settings: every write bumps `settings_epoch` in the same transaction and sends
//!   `NOTIFY loadout_settings`; a listener task (its own connection, reconnecting
//!   with backoff) turns notifications into [`SettingsChange`]s that the
//!   [`Settings`](crate::Settings) cache subscribes to.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, Transaction,
};
use tokio::sync::watch;
use tokio_postgres::{AsyncMessage, NoTls};

use super::{
    AuditRow, DecisionRow, LogPace, MessageRow, Reasons, SessionDomainState, SettingsChange,
    StoreError, called_tool, carry_json, mask_url_password, new_session_id, now_ms, parse_carry,
    validate_session_id,
};

/// Versioned migrations, applied in order at connect. Never edit a shipped one: add
/// one, under the same number as SQLite's migration of the same meaning.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        r#"
    CREATE TABLE settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_ms BIGINT NOT NULL
    );
    -- Bumped in the same transaction as every settings write: caches compare it.
    CREATE TABLE settings_epoch (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        epoch BIGINT NOT NULL
    );
    INSERT INTO settings_epoch (id, epoch) VALUES (1, 0);
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        created_ms BIGINT NOT NULL,
        n_turns BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE messages (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        turn BIGINT NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        at_ms BIGINT NOT NULL
    );
    CREATE INDEX messages_by_session ON messages(session_id, id);
    CREATE TABLE session_domains (
        session_id TEXT NOT NULL,
        domain TEXT NOT NULL,
        last_used_turn BIGINT NOT NULL,
        pinned BOOLEAN NOT NULL DEFAULT false,
        unloaded BOOLEAN NOT NULL DEFAULT false,
        PRIMARY KEY (session_id, domain)
    );
    CREATE TABLE domain_use (
        domain TEXT PRIMARY KEY,
        last_used_ms BIGINT NOT NULL
    );
    CREATE TABLE tool_history (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at_ms BIGINT NOT NULL,
        session_id TEXT,
        turn BIGINT NOT NULL,
        message TEXT NOT NULL,
        n_tools BIGINT NOT NULL,
        tokens BIGINT NOT NULL,
        reasons TEXT NOT NULL
    );
    CREATE INDEX tool_history_by_session ON tool_history(session_id, id);
    CREATE TABLE audit_log (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at_ms BIGINT NOT NULL,
        client TEXT NOT NULL,
        tool TEXT NOT NULL,
        args TEXT NOT NULL,
        outcome TEXT NOT NULL,
        detail TEXT,
        duration_ms DOUBLE PRECISION NOT NULL
    );
    "#,
    ),
    // SQLite's version 2 adds the settings counter this schema has had from version
    // 1 (`settings_epoch`); the versions stay equal across backends.
    (2, "SELECT 1"),
    (
        3,
        "CREATE INDEX messages_by_turn ON messages(session_id, turn);",
    ),
    (
        4,
        // SQLite moved its decision log to a file of its own; PostgreSQL's stays
        // where it is. The version keeps both backends' numbers equal.
        "SELECT 1;",
    ),
    (
        5,
        // As SQLite's: the latest turn's carry-over list, written with the turn's
        // message, and the tool a successful `tool` message ran (read without a
        // `jsonb` cast, which fails on a `\u0000` escape in a tool's result; rows with
        // one are left out of the backfill).
        r#"
    ALTER TABLE sessions ADD COLUMN carry TEXT NOT NULL DEFAULT '[]';
    ALTER TABLE messages ADD COLUMN called TEXT;
    UPDATE messages SET called = content::jsonb->>'name'
        WHERE role = 'tool' AND strpos(content, '\u0000') = 0
          AND jsonb_typeof(content::jsonb->'name') = 'string'
          AND (content::jsonb->'ok') = 'true'::jsonb;
    "#,
    ),
];

/// Newest schema version this binary knows; equal to SQLite's.
pub const SCHEMA_VERSION: i64 = 5;

/// The channel settings writes notify on.
pub const SETTINGS_CHANNEL: &str = "loadout_settings";

/// Advisory lock keys (arbitrary, fixed): migrations, domain schemas.
const MIGRATION_LOCK: i64 = 0x6c6f_6164_6f75_7401;
const DOMAIN_SCHEMA_LOCK: i64 = 0x6c6f_6164_6f75_7402;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const POOL_SIZE: usize = 16;
/// How long a request waits for a free connection before it is told the database
/// is unavailable.
const POOL_WAIT: Duration = Duration::from_secs(10);
const LISTENER_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// PostgreSQL state backend.
pub struct PostgresStore {
    pool: Pool,
    url_masked: String,
    listener: SettingsListener,
    /// Domain schemas already ensured through this store (see [`Self::ensure_schema`]).
    ensured: Mutex<HashSet<&'static str>>,
}

impl PostgresStore {
    /// Connects, checks the server is reachable and brings the schema up to date.
    /// An unreachable server is [`StoreError::Open`] naming the URL, password masked.
    pub async fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        let url_masked = mask_url_password(url);
        let mut config: tokio_postgres::Config =
            url.parse()
                .map_err(|e: tokio_postgres::Error| StoreError::BadUrl {
                    url: url_masked.clone(),
                    reason: error_chain(&e),
                })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("loadout");
        }
        // Notice a silently dead peer (no FIN) within about a minute.
        config.keepalives_idle(Duration::from_secs(30));

        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(CONNECT_TIMEOUT + Duration::from_secs(1)))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(|e| StoreError::Open {
                url: url_masked.clone(),
                message: e.to_string(),
            })?;
        let mut client = pool.get().await.map_err(|e| StoreError::Open {
            url: url_masked.clone(),
            message: describe_pool_error(&e),
        })?;
        migrate(&mut client).await.map_err(|e| match e {
            MigrateError::Store(e) => e,
            MigrateError::Pg(e) => StoreError::Open {
                url: url_masked.clone(),
                message: format!("cannot apply migrations: {}", error_chain(&e)),
            },
        })?;
        drop(client);
        let listener = SettingsListener::spawn(config, url_masked.clone());
        Ok(PostgresStore {
            pool,
            url_masked,
            listener,
            ensured: Mutex::new(HashSet::new()),
        })
    }

    /// The URL with its password masked.
    pub fn url_masked(&self) -> &str {
        &self.url_masked
    }

    /// A pooled connection, for domains that keep their own tables. Broken
    /// connections are replaced by the pool; while the server is down this is
    /// [`StoreError::Unavailable`].
    pub async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(|e| {
            StoreError::Unavailable(format!(
                "cannot reach PostgreSQL at {}: {}",
                self.url_masked,
                describe_pool_error(&e)
            ))
        })
    }

    /// Converts a driver error: connection failures become
    /// [`StoreError::Unavailable`] naming the server, the rest
    /// [`StoreError::Database`] with the server's message.
    pub fn error(&self, e: tokio_postgres::Error) -> StoreError {
        if is_connection_error(&e) {
            StoreError::Unavailable(format!(
                "lost the connection to PostgreSQL at {}: {}",
                self.url_masked,
                error_chain(&e)
            ))
        } else {
            StoreError::Database(describe_error(&e))
        }
    }

    /// Runs `sql` (idempotent DDL: `CREATE … IF NOT EXISTS`) once per store under
    /// an advisory lock, so that replicas creating a domain's tables together do not
    /// race. `name` identifies the schema and its version, e.g. `memory/1`.
    pub async fn ensure_schema(&self, name: &'static str, sql: &str) -> Result<(), StoreError> {
        if self.ensured_lock().contains(name) {
            return Ok(());
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&DOMAIN_SCHEMA_LOCK])
            .await
            .map_err(|e| self.error(e))?;
        tx.batch_execute(sql).await.map_err(|e| self.error(e))?;
        tx.commit().await.map_err(|e| self.error(e))?;
        self.ensured_lock().insert(name);
        Ok(())
    }

    fn ensured_lock(&self) -> std::sync::MutexGuard<'_, HashSet<&'static str>> {
        self.ensured.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notifications of settings writes by any replica.
    pub fn settings_changes(&self) -> watch::Receiver<SettingsChange> {
        self.listener.changes.clone()
    }

    pub async fn settings_all(&self) -> Result<BTreeMap<String, String>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("SELECT key, value FROM settings")
            .await
            .map_err(|e| self.error(e))?;
        let rows = client.query(&stmt, &[]).await.map_err(|e| self.error(e))?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    pub async fn setting_set(&self, key: &str, value: &str) -> Result<(), StoreError> {
        if value.contains('\0') {
            return Err(StoreError::Invalid(format!(
                "the value of `{key}` contains a NUL character, which PostgreSQL cannot store"
            )));
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        tx.execute(
            "INSERT INTO settings(key, value, updated_ms) VALUES ($1, $2, $3)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_ms = excluded.updated_ms",
            &[&key, &value, &now_ms()],
        )
        .await
        .map_err(|e| self.error(e))?;
        bump_settings_epoch(&tx).await.map_err(|e| self.error(e))?;
        tx.commit().await.map_err(|e| self.error(e))
    }

    pub async fn setting_unset(&self, key: &str) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        let n_deleted = tx
            .execute("DELETE FROM settings WHERE key = $1", &[&key])
            .await
            .map_err(|e| self.error(e))?;
        if n_deleted > 0 {
            bump_settings_epoch(&tx).await.map_err(|e| self.error(e))?;
        }
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(n_deleted > 0)
    }

    /// The settings epoch: changes with every settings write by any replica.
    pub async fn settings_version(&self) -> Result<i64, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("SELECT epoch FROM settings_epoch WHERE id = 1")
            .await
            .map_err(|e| self.error(e))?;
        let row = client
            .query_opt(&stmt, &[])
            .await
            .map_err(|e| self.error(e))?;
        match row {
            Some(row) => row.try_get(0).map_err(|e| self.error(e)),
            None => Ok(0),
        }
    }

    pub async fn session_create(&self) -> Result<String, StoreError> {
        let id = new_session_id();
        self.session_ensure(&id).await?;
        Ok(id)
    }

    pub async fn session_ensure(&self, id: &str) -> Result<(), StoreError> {
        validate_session_id(id)?;
        self.execute(
            "INSERT INTO sessions(id, created_ms) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
            &[&id, &now_ms()],
        )
        .await
        .map(drop)
    }

    pub async fn session_exists(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .query_opt("SELECT 1 FROM sessions WHERE id = $1", &[&id])
            .await?
            .is_some())
    }

    pub async fn session_turn(&self, id: &str) -> Result<i64, StoreError> {
        match self
            .query_opt("SELECT n_turns FROM sessions WHERE id = $1", &[&id])
            .await?
        {
            Some(row) => row.try_get(0).map_err(|e| self.error(e)),
            None => Ok(0),
        }
    }

    pub async fn message_append(
        &self,
        session: &str,
        role: &str,
        content: &serde_json::Value,
        carry: &[String],
    ) -> Result<i64, StoreError> {
        validate_session_id(session)?;
        let called = called_tool(role, content);
        let content = content.to_string();
        let carry = carry_json(carry)?;
        let is_user = role == "user";
        // One statement: creates the session if needed, counts the turn (the row
        // lock orders concurrent appends from several replicas), replaces the
        // carry-over list on a user message, and stores the message.
        let row = self
            .query_one(
                "WITH s AS (
                    INSERT INTO sessions(id, created_ms, n_turns, carry)
                    VALUES ($1, $2, CASE WHEN $3 THEN 1 ELSE 0 END, $6)
                    ON CONFLICT (id) DO UPDATE
                        SET n_turns = sessions.n_turns + CASE WHEN $3 THEN 1 ELSE 0 END,
                            carry = CASE WHEN $3 THEN $6 ELSE sessions.carry END
                    RETURNING n_turns
                 )
                 INSERT INTO messages(session_id, turn, role, content, at_ms, called)
                 SELECT $1, s.n_turns, $4, $5, $2, $7 FROM s
                 RETURNING turn",
                &[
                    &session,
                    &now_ms(),
                    &is_user,
                    &role,
                    &content,
                    &carry,
                    &called,
                ],
            )
            .await?;
        row.try_get(0).map_err(|e| self.error(e))
    }

    pub async fn session_carry_put(
        &self,
        session: &str,
        turn: i64,
        carry: &[String],
    ) -> Result<(), StoreError> {
        let carry = carry_json(carry)?;
        self.execute(
            "UPDATE sessions SET carry = $1 WHERE id = $2 AND n_turns = $3",
            &[&carry, &session, &turn],
        )
        .await?;
        Ok(())
    }

    /// The session's turn count and the latest turn's carry-over list.
    pub async fn session_head(&self, id: &str) -> Result<(i64, Vec<String>), StoreError> {
        match self
            .query_opt("SELECT n_turns, carry FROM sessions WHERE id = $1", &[&id])
            .await?
        {
            Some(row) => {
                let turn: i64 = row.try_get(0).map_err(|e| self.error(e))?;
                let carry: String = row.try_get(1).map_err(|e| self.error(e))?;
                Ok((turn, parse_carry(&carry)))
            }
            None => Ok((0, Vec::new())),
        }
    }

    pub async fn calls_reported(
        &self,
        session: &str,
        turn: i64,
        rows: Vec<(String, String)>,
    ) -> Result<(), StoreError> {
        let (names, contents): (Vec<String>, Vec<String>) = rows.into_iter().unzip();
        // One statement for every row; only a turn the session has reached.
        self.execute(
            "INSERT INTO messages(session_id, turn, role, content, at_ms, called)
             SELECT $1, $2, 'tool', r.content, $3, r.name
             FROM unnest($4::text[], $5::text[]) WITH ORDINALITY AS r(name, content, n)
             WHERE EXISTS (SELECT 1 FROM sessions WHERE id = $1 AND n_turns >= $2)
             ORDER BY r.n",
            &[&session, &turn, &now_ms(), &names, &contents],
        )
        .await?;
        Ok(())
    }

    pub async fn sessions_active_since(
        &self,
        since_ms: i64,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        let rows = self
            .query(
                "SELECT session_id FROM messages GROUP BY session_id
                 HAVING MAX(at_ms) >= $1 ORDER BY MAX(at_ms) DESC, session_id LIMIT $2",
                &[&since_ms, &limit],
            )
            .await?;
        rows.iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    pub async fn messages(&self, session: &str) -> Result<Vec<MessageRow>, StoreError> {
        let rows = self
            .query(
                "SELECT turn, role, content, at_ms FROM messages WHERE session_id = $1 ORDER BY id",
                &[&session],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let content: String = r.try_get(2)?;
                Ok(MessageRow {
                    turn: r.try_get(0)?,
                    role: r.try_get(1)?,
                    content: serde_json::from_str(&content)
                        .unwrap_or(serde_json::Value::String(content)),
                    at_ms: r.try_get(3)?,
                })
            })
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    /// The tools the session called with success in its latest turn, oldest first,
    /// with the turn of each call.
    pub async fn latest_turn_calls(&self, session: &str) -> Result<Vec<(i64, String)>, StoreError> {
        let rows = self
            .query(
                "SELECT m.turn, m.called FROM messages m
                 JOIN sessions s ON s.id = m.session_id
                 WHERE m.session_id = $1 AND m.turn >= s.n_turns AND m.called IS NOT NULL
                 ORDER BY m.id",
                &[&session],
            )
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    pub async fn session_domains(
        &self,
        session: &str,
    ) -> Result<Vec<SessionDomainState>, StoreError> {
        let rows = self
            .query(
                "SELECT domain, last_used_turn, pinned, unloaded FROM session_domains
                 WHERE session_id = $1 ORDER BY domain",
                &[&session],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(SessionDomainState {
                    domain: r.try_get(0)?,
                    last_used_turn: r.try_get(1)?,
                    pinned: r.try_get(2)?,
                    unloaded: r.try_get(3)?,
                })
            })
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    pub async fn session_domain_put(
        &self,
        session: &str,
        state: &SessionDomainState,
    ) -> Result<(), StoreError> {
        validate_session_id(session)?;
        self.execute(
            "INSERT INTO session_domains(session_id, domain, last_used_turn, pinned, unloaded)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (session_id, domain) DO UPDATE SET
               last_used_turn = excluded.last_used_turn,
               pinned = excluded.pinned,
               unloaded = excluded.unloaded",
            &[
                &session,
                &state.domain,
                &state.last_used_turn,
                &state.pinned,
                &state.unloaded,
            ],
        )
        .await
        .map(drop)
    }

    pub async fn domain_used(&self, domain: &str, at_ms: i64) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO domain_use(domain, last_used_ms) VALUES ($1, $2)
             ON CONFLICT (domain) DO UPDATE
                SET last_used_ms = GREATEST(domain_use.last_used_ms, excluded.last_used_ms)",
            &[&domain, &at_ms],
        )
        .await
        .map(drop)
    }

    pub async fn domains_used_since(&self, since_ms: i64) -> Result<Vec<String>, StoreError> {
        let rows = self
            .query(
                "SELECT domain FROM domain_use WHERE last_used_ms >= $1 ORDER BY domain",
                &[&since_ms],
            )
            .await?;
        rows.iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(|e| self.error(e))
    }

    /// One statement per batch: the rows travel as arrays and are unnested in order.
    /// PostgreSQL writes in its own processes; `_pace` changes nothing here.
    pub async fn decisions_insert(
        &self,
        rows: Vec<DecisionRow>,
        _pace: LogPace,
    ) -> Result<(), StoreError> {
        // Compact reasons are SQLite's row format; this log stores the JSON. Written
        // out off the runtime's workers: a batch of a thousand rows takes a few
        // milliseconds, which requests on that worker would wait for.
        let (rows, reasons) = tokio::task::spawn_blocking(move || {
            let reasons: Vec<String> = rows.iter().map(|r| r.reasons.json().into_owned()).collect();
            (rows, reasons)
        })
        .await
        .map_err(|e| StoreError::Database(format!("writing reasons as JSON: {e}")))?;
        let written = retry_once(|| self.decisions_insert_once(&rows, &reasons)).await;
        Reasons::recycle(rows);
        written
    }

    async fn decisions_insert_once(
        &self,
        rows: &[DecisionRow],
        reasons: &[String],
    ) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let at_ms: Vec<i64> = rows.iter().map(|r| r.at_ms).collect();
        let sessions: Vec<Option<&str>> = rows.iter().map(|r| r.session.as_deref()).collect();
        let turns: Vec<i64> = rows.iter().map(|r| r.turn).collect();
        let messages: Vec<Cow<'_, str>> = rows.iter().map(|r| without_nul(&r.message)).collect();
        let n_tools: Vec<i64> = rows.iter().map(|r| r.n_tools).collect();
        let tokens: Vec<i64> = rows.iter().map(|r| r.tokens).collect();
        self.execute(
            "INSERT INTO tool_history(at_ms, session_id, turn, message, n_tools, tokens, reasons)
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::bigint[], $4::text[],
                                  $5::bigint[], $6::bigint[], $7::text[])",
            &[
                &at_ms, &sessions, &turns, &messages, &n_tools, &tokens, &reasons,
            ],
        )
        .await
        .map(drop)
    }

    pub async fn decisions(&self, session: &str) -> Result<Vec<DecisionRow>, StoreError> {
        let rows = self
            .query(
                "SELECT at_ms, session_id, turn, message, n_tools, tokens, reasons
                 FROM tool_history WHERE session_id = $1 ORDER BY id",
                &[&session],
            )
            .await?;
        rows.iter()
            .map(decision_row)
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    pub async fn first_decision(&self, session: &str) -> Result<Option<DecisionRow>, StoreError> {
        self.query_opt(
            "SELECT at_ms, session_id, turn, message, n_tools, tokens, reasons
             FROM tool_history WHERE session_id = $1 ORDER BY id LIMIT 1",
            &[&session],
        )
        .await?
        .as_ref()
        .map(decision_row)
        .transpose()
        .map_err(|e| self.error(e))
    }

    pub async fn decisions_tail(&self, n: usize) -> Result<Vec<DecisionRow>, StoreError> {
        self.newest(
            "SELECT at_ms, session_id, turn, message, n_tools, tokens, reasons FROM
             (SELECT * FROM tool_history ORDER BY id DESC LIMIT $1) AS newest ORDER BY id",
            n,
            decision_row,
        )
        .await
    }

    pub async fn decisions_prune(&self, before_ms: i64, limit: usize) -> Result<usize, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // The oldest row first: when it is recent, nothing is old and no scan runs.
        let oldest = self
            .query_opt("SELECT at_ms FROM tool_history ORDER BY id LIMIT 1", &[])
            .await?
            .map(|row| row.try_get::<_, i64>(0))
            .transpose()
            .map_err(|e| self.error(e))?;
        let horizon_ms = super::retention_horizon_ms();
        if oldest.is_none_or(|at_ms| at_ms >= before_ms && at_ms <= horizon_ms) {
            return Ok(0);
        }
        let n = self
            .execute(
                "DELETE FROM tool_history WHERE id IN
                   (SELECT id FROM tool_history
                     WHERE id < coalesce((SELECT min(id) FROM tool_history
                                           WHERE at_ms >= $1 AND at_ms <= $3),
                                         9223372036854775807)
                     ORDER BY id LIMIT $2)",
                &[&before_ms, &limit, &horizon_ms],
            )
            .await?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    pub async fn audit_insert(
        &self,
        rows: Vec<AuditRow>,
        _pace: LogPace,
    ) -> Result<(), StoreError> {
        retry_once(|| self.audit_insert_once(&rows)).await
    }

    async fn audit_insert_once(&self, rows: &[AuditRow]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let at_ms: Vec<i64> = rows.iter().map(|r| r.at_ms).collect();
        let clients: Vec<Cow<'_, str>> = rows.iter().map(|r| without_nul(&r.client)).collect();
        let tools: Vec<Cow<'_, str>> = rows.iter().map(|r| without_nul(&r.tool)).collect();
        let args: Vec<String> = rows.iter().map(|r| r.args.to_string()).collect();
        let outcomes: Vec<Cow<'_, str>> = rows.iter().map(|r| without_nul(&r.outcome)).collect();
        let details: Vec<Option<Cow<'_, str>>> = rows
            .iter()
            .map(|r| r.detail.as_deref().map(without_nul))
            .collect();
        let durations: Vec<f64> = rows.iter().map(|r| r.duration_ms).collect();
        self.execute(
            "INSERT INTO audit_log(at_ms, client, tool, args, outcome, detail, duration_ms)
             SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::text[],
                                  $5::text[], $6::text[], $7::float8[])",
            &[
                &at_ms, &clients, &tools, &args, &outcomes, &details, &durations,
            ],
        )
        .await
        .map(drop)
    }

    pub async fn audit_tail(&self, n: usize) -> Result<Vec<AuditRow>, StoreError> {
        self.newest(
            "SELECT at_ms, client, tool, args, outcome, detail, duration_ms FROM
             (SELECT * FROM audit_log ORDER BY id DESC LIMIT $1) AS newest ORDER BY id",
            n,
            |r| {
                let args: String = r.try_get(3)?;
                Ok(AuditRow {
                    at_ms: r.try_get(0)?,
                    client: r.try_get(1)?,
                    tool: r.try_get(2)?,
                    args: serde_json::from_str(&args).unwrap_or(serde_json::Value::Null),
                    outcome: r.try_get(4)?,
                    detail: r.try_get(5)?,
                    duration_ms: r.try_get(6)?,
                })
            },
        )
        .await
    }

    /// The rows `sql` returns for the newest `n` rows (`$1`), each made by `row`.
    async fn newest<T>(
        &self,
        sql: &str,
        n: usize,
        row: impl Fn(&tokio_postgres::Row) -> Result<T, tokio_postgres::Error>,
    ) -> Result<Vec<T>, StoreError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let rows = self.query(sql, &[&n]).await?;
        rows.iter()
            .map(row)
            .collect::<Result<_, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))
    }

    async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(|e| self.error(e))?;
        client
            .execute(&stmt, params)
            .await
            .map_err(|e| self.error(e))
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(|e| self.error(e))?;
        client.query(&stmt, params).await.map_err(|e| self.error(e))
    }

    async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(|e| self.error(e))?;
        client
            .query_opt(&stmt, params)
            .await
            .map_err(|e| self.error(e))
    }

    async fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<tokio_postgres::Row, StoreError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(|e| self.error(e))?;
        client
            .query_one(&stmt, params)
            .await
            .map_err(|e| self.error(e))
    }
}

/// PostgreSQL text cannot hold NUL characters: log rows (decisions, audit) keep
/// them as U+FFFD rather than failing to be written.
fn without_nul(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\u{fffd}"))
    } else {
        Cow::Borrowed(text)
    }
}

/// Bumps the epoch and notifies listeners; both take effect at commit.
async fn bump_settings_epoch(tx: &Transaction<'_>) -> Result<(), tokio_postgres::Error> {
    tx.execute(
        "WITH e AS (UPDATE settings_epoch SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch)
         SELECT pg_notify($1, epoch::text) FROM e",
        &[&SETTINGS_CHANNEL],
    )
    .await
    .map(drop)
}

enum MigrateError {
    Store(StoreError),
    Pg(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for MigrateError {
    fn from(e: tokio_postgres::Error) -> Self {
        MigrateError::Pg(e)
    }
}

/// Applies pending migrations in one transaction holding an advisory lock. A newer
/// schema is refused before anything is written (the transaction rolls back).
async fn migrate(client: &mut Object) -> Result<(), MigrateError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL, applied_ms BIGINT NOT NULL)",
    )
    .await?;
    let found: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0)::bigint FROM schema_version",
            &[],
        )
        .await?
        .try_get(0)?;
    if found > SCHEMA_VERSION {
        return Err(MigrateError::Store(StoreError::SchemaTooNew {
            found,
            known: SCHEMA_VERSION,
        }));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO schema_version(version, applied_ms) VALUES ($1, $2)",
            &[version, &now_ms()],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Owns the task that listens for settings notifications; stops it when dropped.
struct SettingsListener {
    changes: watch::Receiver<SettingsChange>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SettingsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SettingsListener {
    fn spawn(config: tokio_postgres::Config, url_masked: String) -> SettingsListener {
        let (sender, changes) = watch::channel(SettingsChange::default());
        let task = tokio::spawn(listen(config, url_masked, sender));
        SettingsListener { changes, task }
    }
}

/// Keeps a connection with `LISTEN loadout_settings` open, reconnecting with
/// backoff. Every notification, every (re)connect and every loss bumps the
/// generation: caches drop what they hold, since writes may have been missed.
async fn listen(
    config: tokio_postgres::Config,
    url_masked: String,
    sender: watch::Sender<SettingsChange>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                let (note_tx, mut note_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
                // The connection must be polled for the LISTEN to go through, and
                // afterwards to receive notifications; it ends when the link breaks.
                let driver = tokio::spawn(async move {
                    loop {
                        match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                            Some(Ok(AsyncMessage::Notification(_))) => {
                                if note_tx.send(()).is_err() {
                                    break;
                                }
                            }
                            Some(Ok(_)) => {}
                            Some(Err(e)) => {
                                tracing::debug!("settings listener connection ended: {e}");
                                break;
                            }
                            None => break,
                        }
                    }
                });
                match client
                    .batch_execute(&format!("LISTEN {SETTINGS_CHANNEL}"))
                    .await
                {
                    Ok(()) => {
                        backoff = Duration::from_millis(100);
                        sender.send_modify(|c| {
                            c.generation += 1;
                            c.listening = true;
                        });
                        while note_rx.recv().await.is_some() {
                            sender.send_modify(|c| c.generation += 1);
                        }
                        tracing::warn!(
                            "lost the settings listener connection to {url_masked}; reconnecting"
                        );
                    }
                    Err(e) => {
                        tracing::warn!(
                            "cannot listen for settings changes on {url_masked}: {}",
                            error_chain(&e)
                        );
                    }
                }
                driver.abort();
                sender.send_modify(|c| {
                    c.generation += 1;
                    c.listening = false;
                });
            }
            Err(e) => {
                tracing::debug!(
                    "settings listener cannot connect to {url_masked}: {}",
                    error_chain(&e)
                );
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(LISTENER_BACKOFF_MAX);
    }
}

/// Whether an error means the server could not be reached or the connection broke
/// (as opposed to an error the server reported about a statement).
pub fn is_connection_error(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(db) = e.as_db_error() {
        let code = db.code().code();
        // Class 08: connection exception; 57P01-03: shutdown, crash, cannot connect now.
        return code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03");
    }
    let message = e.to_string();
    std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
        || message.starts_with("error communicating")
        || message.starts_with("error connecting")
        || message.starts_with("timeout")
}

/// The server's message for a statement error (with detail and hint), or the
/// driver's error chain.
pub fn describe_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut message = db.message().to_owned();
            if let Some(detail) = db.detail() {
                message.push_str(&format!(" ({detail})"));
            }
            if let Some(hint) = db.hint() {
                message.push_str(&format!("; hint: {hint}"));
            }
            message
        }
        None => error_chain(e),
    }
}

/// An error and its causes, `: `-separated (the driver's own Display omits causes).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

fn describe_pool_error(e: &PoolError) -> String {
    match e {
        PoolError::Backend(e) => error_chain(e),
        PoolError::Timeout(kind) => format!("timed out ({kind:?}) waiting for a connection"),
        other => other.to_string(),
    }
}

fn decision_row(r: &tokio_postgres::Row) -> Result<DecisionRow, tokio_postgres::Error> {
    Ok(DecisionRow {
        at_ms: r.try_get(0)?,
        session: r.try_get(1)?,
        turn: r.try_get(2)?,
        message: r.try_get(3)?,
        n_tools: r.try_get(4)?,
        tokens: r.try_get(5)?,
        reasons: Reasons::from_text(r.try_get(6)?),
    })
}

/// Runs a log write, and once more after [`super::RETRY_AFTER`] if it fails.
async fn retry_once<F, W>(write: W) -> Result<(), StoreError>
where
    W: Fn() -> F,
    F: std::future::Future<Output = Result<(), StoreError>>,
{
    match write().await {
        Err(e) => {
            tracing::debug!("log write failed, retrying: {e}");
            tokio::time::sleep(super::RETRY_AFTER).await;
            write().await
        }
        ok => ok,
    }
}

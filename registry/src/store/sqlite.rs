//! The embedded SQLite backend: one file, WAL, a busy timeout so that the chat
//! server and an MCP server can share it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OptionalExtension, params};

use super::priority::LogPriority;
use super::{
    AuditRow, DecisionRow, LogPace, MessageRow, Reasons, SessionDomainState, SessionSnapshot,
    StoreError, called_tool, carry_json, new_session_id, now_ms, parse_carry, validate_session_id,
};
use crate::router::LogNames;

/// Chains each session's rows of the decision log (see its migration 3); rows
/// already chained get the same links again.
macro_rules! chain_sessions_sql {
    () => {
        "
    UPDATE decisions.tool_history AS t SET prev_id =
        (SELECT max(p.id) FROM decisions.tool_history AS p
          WHERE p.session_id = t.session_id AND p.id < t.id)
        WHERE t.session_id IS NOT NULL;
    INSERT OR REPLACE INTO decisions.session_last(session_id, last_id)
        SELECT session_id, max(id) FROM decisions.tool_history
         WHERE session_id IS NOT NULL GROUP BY session_id;
    "
    };
}

/// Versioned migrations, applied in order at open. Never edit a shipped one: add one.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        r#"
    CREATE TABLE settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_ms INTEGER NOT NULL
    );
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        created_ms INTEGER NOT NULL,
        n_turns INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        turn INTEGER NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        at_ms INTEGER NOT NULL
    );
    CREATE INDEX messages_by_session ON messages(session_id, id);
    CREATE TABLE session_domains (
        session_id TEXT NOT NULL,
        domain TEXT NOT NULL,
        last_used_turn INTEGER NOT NULL,
        pinned INTEGER NOT NULL DEFAULT 0,
        unloaded INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (session_id, domain)
    );
    CREATE TABLE domain_use (
        domain TEXT PRIMARY KEY,
        last_used_ms INTEGER NOT NULL
    );
    CREATE TABLE tool_history (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at_ms INTEGER NOT NULL,
        session_id TEXT,
        turn INTEGER NOT NULL,
        message TEXT NOT NULL,
        n_tools INTEGER NOT NULL,
        tokens INTEGER NOT NULL,
        reasons TEXT NOT NULL
    );
    CREATE INDEX tool_history_by_session ON tool_history(session_id, id);
    CREATE TABLE audit_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at_ms INTEGER NOT NULL,
        client TEXT NOT NULL,
        tool TEXT NOT NULL,
        args TEXT NOT NULL,
        outcome TEXT NOT NULL,
        detail TEXT,
        duration_ms REAL NOT NULL
    );
    "#,
    ),
    (
        2,
        // A counter that only settings writes move, by any connection or process:
        // `PRAGMA data_version` also moved with every decision-log commit, which made
        // every settings recheck reload the table under load.
        r#"
    CREATE TABLE settings_version (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        version INTEGER NOT NULL
    );
    INSERT INTO settings_version(id, version) VALUES (1, 0);
    CREATE TRIGGER settings_version_on_insert AFTER INSERT ON settings
        BEGIN UPDATE settings_version SET version = version + 1 WHERE id = 1; END;
    CREATE TRIGGER settings_version_on_update AFTER UPDATE ON settings
        BEGIN UPDATE settings_version SET version = version + 1 WHERE id = 1; END;
    CREATE TRIGGER settings_version_on_delete AFTER DELETE ON settings
        BEGIN UPDATE settings_version SET version = version + 1 WHERE id = 1; END;
    "#,
    ),
    (
        3,
        // Routing a session's turn reads the tools called in its latest turn.
        "CREATE INDEX messages_by_turn ON messages(session_id, turn);",
    ),
    (
        4,
        // The decision log moves to its own file (see `DECISIONS`). `OR IGNORE`: if
        // a crash lands between the two files' commits, the copy runs again. The
        // log's file is already at its newest version here, so the columns are
        // named, and the copied rows are chained as its migration 3 chains rows.
        concat!(
            "INSERT OR IGNORE INTO decisions.tool_history
                 (id, at_ms, session_id, turn, message, n_tools, tokens, reasons)
                 SELECT id, at_ms, session_id, turn, message, n_tools, tokens, reasons
                   FROM main.tool_history;
             DROP TABLE main.tool_history;",
            chain_sessions_sql!()
        ),
    ),
    (
        5,
        // `carry`: the tools the latest turn carries into a follow-up with no
        // evidence of its own (a JSON array), written with the turn's message, so
        // that router state lives in the store, not in one replica's memory or the
        // background decision log. `called`: the tool a successful `tool` message
        // ran, so routing reads the latest turn's calls without parsing results.
        "ALTER TABLE sessions ADD COLUMN carry TEXT NOT NULL DEFAULT '[]';
         ALTER TABLE messages ADD COLUMN called TEXT;
         UPDATE messages SET called = json_extract(content, '$.name')
             WHERE role = 'tool' AND json_valid(content)
               AND json_extract(content, '$.ok') = 1
               AND json_type(content, '$.name') = 'text';",
    ),
];

/// Newest schema version this binary knows.
pub const SCHEMA_VERSION: i64 = 5;

/// Schema name of the decision log's file, attached to both connections.
///
/// The decision log (`tool_history`, a row per routed message) lives in a file of its
/// own, written with `synchronous = OFF`. In one file with the rest, each checkpoint
/// `fsync`ed the log's pages with the settings and sessions, and on 2 cores at 11,800
/// logged requests/s that alone took `/api/route` p99 from 0.4 ms to 3-5 ms. Without
/// `fsync`, a crash of the process still loses nothing that was committed (SQLite's
/// WAL is in the page cache); a power cut may lose the last seconds of decisions, or
/// leave the file unreadable, in which case it is moved aside at the next start (see
/// [`attach_decisions`]). Settings, sessions, memories and the audit log stay in the
/// main file with `synchronous = NORMAL`.
const DECISIONS: &str = "decisions";

const DECISIONS_MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        r#"
    CREATE TABLE decisions.tool_history (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at_ms INTEGER NOT NULL,
        session_id TEXT,
        turn INTEGER NOT NULL,
        message TEXT NOT NULL,
        n_tools INTEGER NOT NULL,
        tokens INTEGER NOT NULL,
        reasons TEXT NOT NULL
    );
    CREATE INDEX decisions.tool_history_by_session ON tool_history(session_id, id);
    "#,
    ),
    (
        2,
        // Two writes fewer per row; the log thread's cost per row is what logging
        // costs a loaded server. AUTOINCREMENT updated `sqlite_sequence` after every
        // insert (ids are only ever ordered, and retention deletes the oldest rows,
        // so the plain rowid stays increasing), and rows of one-off requests, which
        // have no session, were indexed under NULL, where nothing looks them up.
        r#"
    CREATE TABLE decisions.tool_history_new (
        id INTEGER PRIMARY KEY,
        at_ms INTEGER NOT NULL,
        session_id TEXT,
        turn INTEGER NOT NULL,
        message TEXT NOT NULL,
        n_tools INTEGER NOT NULL,
        tokens INTEGER NOT NULL,
        reasons TEXT NOT NULL
    );
    INSERT INTO decisions.tool_history_new SELECT * FROM decisions.tool_history;
    DROP TABLE decisions.tool_history;
    ALTER TABLE decisions.tool_history_new RENAME TO tool_history;
    CREATE INDEX decisions.tool_history_by_session ON tool_history(session_id, id)
        WHERE session_id IS NOT NULL;
    "#,
    ),
    (
        3,
        // Each row of a session points to the session's previous row (`prev_id`),
        // and `session_last` holds each session's newest row: a session's decisions
        // are read by walking back from there. This replaces the index on
        // `(session_id, id)`, whose leaves are spread over the sessions: a batch of
        // rows from 64 sessions dirtied about 64 index pages, and the log wrote 4.7
        // times the bytes of the rows themselves to its WAL (9.4 times with 1,000
        // sessions); now a batch appends its rows and updates a page or two of
        // `session_last`.
        concat!(
            "
    ALTER TABLE decisions.tool_history ADD COLUMN prev_id INTEGER;
    CREATE TABLE decisions.session_last (
        session_id TEXT PRIMARY KEY,
        last_id INTEGER NOT NULL
    ) WITHOUT ROWID;",
            chain_sessions_sql!(),
            "DROP INDEX decisions.tool_history_by_session;"
        ),
    ),
    (
        4,
        // Reasons in the compact form (a BLOB in `reasons`), whose tool and domain
        // names are indices in a router's names, kept once in `catalogs` (found by
        // their SHA-256): a row of the shared catalog takes 0.3-0.6 KB instead of
        // 1-2 KB, and the bytes were most of what a row cost the log thread. Rows
        // with JSON text (older ones, or ones not made by a router) have no catalog.
        // `last_row_id` is the newest row that refers to the catalog, so that
        // retention can delete catalogs no row refers to any more.
        r#"
    CREATE TABLE decisions.catalogs (
        id INTEGER PRIMARY KEY,
        digest TEXT NOT NULL UNIQUE,
        names TEXT NOT NULL,
        last_row_id INTEGER NOT NULL
    );
    ALTER TABLE decisions.tool_history ADD COLUMN catalog_id INTEGER;
    "#,
    ),
];

/// Newest schema version of the decision log's file this binary knows.
const DECISIONS_SCHEMA_VERSION: i64 = 4;

/// A session's decisions, oldest first: the walk back from its newest row along
/// `prev_id`. Each step must stay in the session and go to a smaller id, so a chain
/// cut by retention ends where the rows were deleted, and no chain can loop.
const SESSION_DECISIONS_SQL: &str = "
    WITH RECURSIVE chain(id) AS (
        SELECT last_id FROM decisions.session_last WHERE session_id = ?1
        UNION ALL
        SELECT t.prev_id FROM decisions.tool_history AS t JOIN chain ON t.id = chain.id
         WHERE t.session_id = ?1 AND t.prev_id < t.id
    )
    SELECT t.at_ms, t.session_id, t.turn, t.message, t.n_tools, t.tokens, t.reasons,
           t.catalog_id
      FROM chain JOIN decisions.tool_history AS t ON t.id = chain.id
     WHERE t.session_id = ?1
     ORDER BY t.id";

/// The decision log's file next to the main one: `loadout.db` → `loadout.decisions.db`.
pub fn decisions_path(path: &Path) -> PathBuf {
    path.with_extension(format!("{DECISIONS}.db"))
}

/// SQLite state backend.
#[derive(Clone)]
pub struct SqliteStore {
    path: PathBuf,
    /// The connection for requests, owned by a thread of its own that runs their
    /// jobs in arrival order. See [`ConnectionThread`].
    conn: ConnectionThread<LogThreadAlive>,
    /// The background log writers' own connection, on a thread of its own at a lower
    /// CPU priority: a batch of decision or audit rows being written never holds the
    /// lock that routing and tool calls wait on (WAL lets the main connection read
    /// meanwhile), and on a saturated machine requests get the CPU first.
    log_conn: ConnectionThread<LogPriority>,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and brings its schema up to date.
    pub async fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let path = path.to_path_buf();
        let opened = path.clone();
        let (conn, log_conn) =
            tokio::task::spawn_blocking(move || -> Result<(Connection, Connection), StoreError> {
                let open_err = |e: &dyn std::fmt::Display| StoreError::Open {
                    url: format!("sqlite:{}", opened.display()),
                    message: e.to_string(),
                };
                if let Some(parent) = opened.parent()
                    && !parent.as_os_str().is_empty()
                {
                    std::fs::create_dir_all(parent).map_err(|e| open_err(&e))?;
                }
                let mut conn = Connection::open(&opened).map_err(|e| open_err(&e))?;
                configure(&conn).map_err(|e| open_err(&e))?;
                // Checkpoints run on the log connection (below), not inside a
                // request's commit, where copying the WAL back stalled it.
                conn.pragma_update(None, "wal_autocheckpoint", 0)
                    .map_err(|e| open_err(&e))?;
                // Refuse a newer main schema before touching the log's file.
                check_version(&conn, "main", SCHEMA_VERSION)?;
                attach_decisions(&mut conn, &opened)?;
                migrate(&mut conn, "main", MIGRATIONS, SCHEMA_VERSION)?;
                let log_conn = Connection::open(&opened).map_err(|e| open_err(&e))?;
                configure(&log_conn).map_err(|e| open_err(&e))?;
                attach(&log_conn, &decisions_path(&opened)).map_err(|e| open_err(&e))?;
                log_conn
                    .pragma_update(None, "wal_autocheckpoint", LOG_AUTOCHECKPOINT_PAGES)
                    .map_err(|e| open_err(&e))?;
                Ok((conn, log_conn))
            })
            .await
            .map_err(|e| StoreError::Database(e.to_string()))??;
        let log_conn = ConnectionThread::start("loadout-sqlite-log", log_conn, || {
            let priority = LogPriority::lower();
            tracing::debug!("log writer thread priority: {priority:?}");
            priority
        })?;
        spawn_checkpoints(log_conn.downgrade());
        Ok(SqliteStore {
            path,
            conn: ConnectionThread::start("loadout-db", conn, {
                let log = log_conn.clone();
                move || LogThreadAlive { _log: log }
            })?,
            log_conn,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the connection on a blocking thread. Domains use this for their
    /// own tables in the shared database.
    pub async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        self.conn.run(|conn, _| f(conn)).await
    }

    /// Like [`call`](Self::call), on the log writers' connection, at the priority
    /// `pace` asks for.
    async fn call_log<R, F>(&self, pace: LogPace, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        self.log_conn
            .run(move |conn, priority| {
                let _catch_up = (pace == LogPace::CatchUp).then(|| priority.catch_up());
                f(conn)
            })
            .await
    }

    pub async fn settings_all(&self) -> Result<BTreeMap<String, String>, StoreError> {
        self.call(|c| {
            let mut stmt = c.prepare_cached("SELECT key, value FROM settings")?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<Result<BTreeMap<_, _>, _>>()?)
        })
        .await
    }

    pub async fn setting_set(&self, key: &str, value: &str) -> Result<(), StoreError> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.call(move |c| {
            c.prepare_cached(
                "INSERT INTO settings(key, value, updated_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value, updated_ms = excluded.updated_ms",
            )?
            .execute(params![key, value, now_ms()])?;
            Ok(())
        })
        .await
    }

    pub async fn setting_unset(&self, key: &str) -> Result<bool, StoreError> {
        let key = key.to_owned();
        self.call(move |c| {
            Ok(c.prepare_cached("DELETE FROM settings WHERE key = ?1")?
                .execute([key])?
                > 0)
        })
        .await
    }

    /// The settings counter (migration 2): moved by every settings write through any
    /// connection or process, and by nothing else.
    pub async fn settings_version(&self) -> Result<i64, StoreError> {
        self.call(|c| {
            Ok(
                c.prepare_cached("SELECT version FROM settings_version WHERE id = 1")?
                    .query_row([], |r| r.get(0))
                    .optional()?
                    .unwrap_or(0),
            )
        })
        .await
    }

    pub async fn session_create(&self) -> Result<String, StoreError> {
        let id = new_session_id();
        self.session_ensure(&id).await?;
        Ok(id)
    }

    pub async fn session_ensure(&self, id: &str) -> Result<(), StoreError> {
        validate_session_id(id)?;
        let id = id.to_owned();
        self.call(move |c| {
            c.prepare_cached("INSERT OR IGNORE INTO sessions(id, created_ms) VALUES (?1, ?2)")?
                .execute(params![id, now_ms()])?;
            Ok(())
        })
        .await
    }

    pub async fn session_exists(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.call(move |c| {
            Ok(c.prepare_cached("SELECT 1 FROM sessions WHERE id = ?1")?
                .query_row([id], |_| Ok(()))
                .optional()?
                .is_some())
        })
        .await
    }

    pub async fn session_carry_put(
        &self,
        session: &str,
        turn: i64,
        carry: &[String],
    ) -> Result<(), StoreError> {
        let (session, carry) = (session.to_owned(), carry_json(carry)?);
        self.call(move |c| {
            c.prepare_cached("UPDATE sessions SET carry = ?1 WHERE id = ?2 AND n_turns = ?3")?
                .execute(params![carry, session, turn])?;
            Ok(())
        })
        .await
    }

    pub async fn session_turn(&self, id: &str) -> Result<i64, StoreError> {
        let id = id.to_owned();
        self.call(move |c| Ok(read_session_turn(c, &id)?)).await
    }

    pub async fn message_append(
        &self,
        session: &str,
        role: &str,
        content: &serde_json::Value,
        carry: &[String],
    ) -> Result<i64, StoreError> {
        validate_session_id(session)?;
        let called = called_tool(role, content).map(str::to_owned);
        let (session, role, content) = (session.to_owned(), role.to_owned(), content.to_string());
        let carry = carry_json(carry)?;
        self.call(move |c| {
            let tx = c.transaction()?;
            // One statement creates the session or counts the turn (a user message
            // also replaces the carry-over list), and returns the count; statements
            // are cached (this runs on every routed session turn).
            let added = i64::from(role == "user");
            let turn: i64 = tx
                .prepare_cached(
                    "INSERT INTO sessions(id, created_ms, n_turns, carry) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT(id) DO UPDATE SET n_turns = n_turns + excluded.n_turns,
                         carry = CASE WHEN excluded.n_turns > 0 THEN excluded.carry ELSE carry END
                     RETURNING n_turns",
                )?
                .query_row(params![session, now_ms(), added, carry], |r| r.get(0))?;
            tx.prepare_cached(
                "INSERT INTO messages(session_id, turn, role, content, at_ms, called)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![session, turn, role, content, now_ms(), called])?;
            tx.commit()?;
            Ok(turn)
        })
        .await
    }

    pub async fn calls_reported(
        &self,
        session: &str,
        turn: i64,
        rows: Vec<(String, String)>,
    ) -> Result<(), StoreError> {
        let session = session.to_owned();
        self.call(move |c| {
            let tx = c.transaction()?;
            {
                // Only a turn the session has reached: the count is the latest turn.
                let mut insert = tx.prepare_cached(
                    "INSERT INTO messages(session_id, turn, role, content, at_ms, called)
                     SELECT ?1, ?2, 'tool', ?3, ?4, ?5
                     WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?1 AND n_turns >= ?2)",
                )?;
                for (name, content) in &rows {
                    insert.execute(params![session, turn, content, now_ms(), name])?;
                }
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn sessions_active_since(
        &self,
        since_ms: i64,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        self.call(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT session_id FROM messages GROUP BY session_id
                 HAVING MAX(at_ms) >= ?1 ORDER BY MAX(at_ms) DESC, session_id LIMIT ?2",
            )?;
            let rows = stmt.query_map(params![since_ms, limit], |r| r.get(0))?;
            Ok(rows.collect::<Result<Vec<String>, _>>()?)
        })
        .await
    }

    pub async fn messages(&self, session: &str) -> Result<Vec<MessageRow>, StoreError> {
        let session = session.to_owned();
        self.call(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT turn, role, content, at_ms FROM messages WHERE session_id = ?1 ORDER BY id",
            )?;
            let rows = stmt.query_map([session], |r| {
                let content: String = r.get(2)?;
                Ok(MessageRow {
                    turn: r.get(0)?,
                    role: r.get(1)?,
                    content: serde_json::from_str(&content)
                        .unwrap_or(serde_json::Value::String(content)),
                    at_ms: r.get(3)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    pub async fn session_snapshot(
        &self,
        session: &str,
        warm_since_ms: i64,
    ) -> Result<SessionSnapshot, StoreError> {
        let session = session.to_owned();
        self.call(move |c| {
            // One read transaction: the four reads see the same commit.
            let tx = c.transaction()?;
            let (turn, carry) = read_session_head(&tx, &session)?;
            let snapshot = SessionSnapshot {
                turn,
                carry,
                domains: read_session_domains(&tx, &session)?,
                warm: read_domains_used_since(&tx, warm_since_ms)?,
                recent_calls: read_calls_since(&tx, &session, turn)?,
            };
            tx.commit()?;
            Ok(snapshot)
        })
        .await
    }

    pub async fn session_domains(
        &self,
        session: &str,
    ) -> Result<Vec<SessionDomainState>, StoreError> {
        let session = session.to_owned();
        self.call(move |c| Ok(read_session_domains(c, &session)?))
            .await
    }

    pub async fn session_domain_put(
        &self,
        session: &str,
        state: &SessionDomainState,
    ) -> Result<(), StoreError> {
        validate_session_id(session)?;
        let (session, state) = (session.to_owned(), state.clone());
        self.call(move |c| {
            c.prepare_cached(
                "INSERT INTO session_domains(session_id, domain, last_used_turn, pinned, unloaded)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT(session_id, domain) DO UPDATE SET
                   last_used_turn = excluded.last_used_turn,
                   pinned = excluded.pinned,
                   unloaded = excluded.unloaded",
            )?
            .execute(params![
                session,
                state.domain,
                state.last_used_turn,
                state.pinned,
                state.unloaded
            ])?;
            Ok(())
        })
        .await
    }

    pub async fn domain_used(&self, domain: &str, at_ms: i64) -> Result<(), StoreError> {
        let domain = domain.to_owned();
        self.call(move |c| {
            c.prepare_cached(
                "INSERT INTO domain_use(domain, last_used_ms) VALUES (?1, ?2)
                 ON CONFLICT(domain) DO UPDATE SET last_used_ms = max(last_used_ms, excluded.last_used_ms)",
            )?
            .execute(params![domain, at_ms])?;
            Ok(())
        })
        .await
    }

    pub async fn domains_used_since(&self, since_ms: i64) -> Result<Vec<String>, StoreError> {
        self.call(move |c| Ok(read_domains_used_since(c, since_ms)?))
            .await
    }

    pub async fn decisions_insert(
        &self,
        rows: Vec<DecisionRow>,
        pace: LogPace,
    ) -> Result<(), StoreError> {
        self.call_log(pace, move |c| {
            let written = retry_once(c, |c| insert_decisions(c, &rows));
            // Freed here, on the log thread, not on a request's thread; their
            // reasons' buffers go back to be filled again.
            Reasons::recycle(rows);
            written
        })
        .await
    }

    pub async fn decisions(&self, session: &str) -> Result<Vec<DecisionRow>, StoreError> {
        let session = session.to_owned();
        self.call(move |c| {
            let mut stmt = c.prepare_cached(SESSION_DECISIONS_SQL)?;
            let rows = stmt.query_map([session], decision_row)?;
            let rows = rows.collect::<Result<Vec<_>, _>>()?;
            with_reasons(c, rows)
        })
        .await
    }

    pub async fn first_decision(&self, session: &str) -> Result<Option<DecisionRow>, StoreError> {
        let session = session.to_owned();
        self.call(move |c| {
            // The walk goes back to the first row; a session has one per turn.
            let mut stmt = c.prepare_cached(&format!("{SESSION_DECISIONS_SQL} LIMIT 1"))?;
            let row = stmt.query_row([session], decision_row).optional()?;
            Ok(with_reasons(c, row.into_iter().collect())?.pop())
        })
        .await
    }

    pub async fn decisions_tail(&self, n: usize) -> Result<Vec<DecisionRow>, StoreError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.call(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT at_ms, session_id, turn, message, n_tools, tokens, reasons, catalog_id
                   FROM (SELECT * FROM decisions.tool_history ORDER BY id DESC LIMIT ?1)
                  ORDER BY id",
            )?;
            let rows = stmt.query_map([n], decision_row)?;
            let rows = rows.collect::<Result<Vec<_>, _>>()?;
            with_reasons(c, rows)
        })
        .await
    }

    pub async fn decisions_prune(&self, before_ms: i64, limit: usize) -> Result<usize, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.call_log(LogPace::Idle, move |c| {
            // The oldest row first: when it is recent, nothing is old and no scan runs.
            let oldest: Option<i64> = c
                .prepare_cached("SELECT at_ms FROM decisions.tool_history ORDER BY id LIMIT 1")?
                .query_row([], |r| r.get(0))
                .optional()?;
            let horizon_ms = super::retention_horizon_ms();
            if oldest.is_none_or(|at_ms| at_ms >= before_ms && at_ms <= horizon_ms) {
                return Ok(0);
            }
            let tx = c.transaction()?;
            let n = tx
                .prepare_cached(
                    "DELETE FROM decisions.tool_history WHERE id IN
                       (SELECT id FROM decisions.tool_history
                         WHERE id < coalesce((SELECT min(id) FROM decisions.tool_history
                                               WHERE at_ms >= ?1 AND at_ms <= ?3),
                                             9223372036854775807)
                         ORDER BY id LIMIT ?2)",
                )?
                .execute(params![before_ms, limit, horizon_ms])?;
            // Sessions whose newest row is gone. With the table emptied, every one:
            // new rows may then take the ids of deleted ones, and no chain may lead
            // to them.
            tx.prepare_cached(
                "DELETE FROM decisions.session_last WHERE last_id <
                   coalesce((SELECT min(id) FROM decisions.tool_history), 9223372036854775807)",
            )?
            .execute([])?;
            // Catalogs whose newest row is gone: no row refers to them. A writer
            // that still routes with those names stores them again with its next
            // batch (it looks its catalog up in each batch's transaction).
            tx.prepare_cached(
                "DELETE FROM decisions.catalogs WHERE last_row_id <
                   coalesce((SELECT min(id) FROM decisions.tool_history), 9223372036854775807)",
            )?
            .execute([])?;
            tx.commit()?;
            Ok(n)
        })
        .await
    }

    pub async fn audit_insert(&self, rows: Vec<AuditRow>, pace: LogPace) -> Result<(), StoreError> {
        self.call_log(pace, move |c| {
            insert_batch(
                c,
                "INSERT INTO audit_log(at_ms, client, tool, args, outcome, detail, duration_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                &rows,
                |stmt, row| {
                    stmt.execute(params![
                        row.at_ms,
                        row.client,
                        row.tool,
                        row.args.to_string(),
                        row.outcome,
                        row.detail,
                        row.duration_ms
                    ])
                },
            )
        })
        .await
    }

    pub async fn audit_tail(&self, n: usize) -> Result<Vec<AuditRow>, StoreError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.call(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT at_ms, client, tool, args, outcome, detail, duration_ms FROM
                 (SELECT * FROM audit_log ORDER BY id DESC LIMIT ?1) ORDER BY id",
            )?;
            let rows = stmt.query_map([n], |r| {
                let args: String = r.get(3)?;
                Ok(AuditRow {
                    at_ms: r.get(0)?,
                    client: r.get(1)?,
                    tool: r.get(2)?,
                    args: serde_json::from_str(&args).unwrap_or(serde_json::Value::Null),
                    outcome: r.get(4)?,
                    detail: r.get(5)?,
                    duration_ms: r.get(6)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }
}

/// Pragmas every connection to a shared file needs.
pub fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Every statement of the store stays prepared (rusqlite keeps 16 by default).
    conn.set_prepared_statement_cache_capacity(64);
    // The bundled SQLite is built with STAT4, under which a statement comparing a
    // bound parameter with an indexed column is compiled again whenever the value
    // changes (in case another plan suits it better): the session reads were
    // re-prepared on almost every routed turn. Our queries have one right plan.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

/// Attaches the decision log's file to `conn` as [`DECISIONS`] and brings its schema
/// up to date. A file that is not a readable database (a power cut while it was
/// written without `fsync`) is renamed `…decisions.db.corrupt-<ms>`, kept for
/// inspection, and a new one is started: the decision log is worth less than a
/// server that starts.
fn attach_decisions(conn: &mut Connection, main: &Path) -> Result<(), StoreError> {
    let path = decisions_path(main);
    let open_err = |e: &dyn std::fmt::Display| StoreError::Open {
        url: format!("sqlite:{}", path.display()),
        message: e.to_string(),
    };
    let attached = attach(conn, &path)
        .map_err(StoreError::from)
        .and_then(|()| {
            migrate(
                conn,
                DECISIONS,
                DECISIONS_MIGRATIONS,
                DECISIONS_SCHEMA_VERSION,
            )
        });
    match attached {
        Err(StoreError::Database(message)) if is_unreadable(&message) => {
            let _ = conn.execute_batch(&format!("DETACH DATABASE {DECISIONS}"));
            let aside = PathBuf::from(format!("{}.corrupt-{}", path.display(), now_ms()));
            tracing::warn!(
                "decision log {} is not a readable database ({message}); moved to {} and started anew",
                path.display(),
                aside.display()
            );
            std::fs::rename(&path, &aside).map_err(|e| open_err(&e))?;
            for suffix in ["-wal", "-shm"] {
                let side = PathBuf::from(format!("{}{suffix}", path.display()));
                if side.exists() {
                    let _ = std::fs::rename(&side, format!("{}{suffix}", aside.display()));
                }
            }
            attach(conn, &path).map_err(|e| open_err(&e))?;
            migrate(
                conn,
                DECISIONS,
                DECISIONS_MIGRATIONS,
                DECISIONS_SCHEMA_VERSION,
            )
        }
        other => other,
    }
}

fn is_unreadable(message: &str) -> bool {
    message.contains("not a database") || message.contains("malformed")
}

/// Page size of a new decision log file. The log appends rows of about 1 KB, a
/// few thousand a second under load, and SQLite writes each WAL frame and each
/// checkpointed page with a system call of its own: at 15k logged requests/s, 4 KB
/// pages took 9.4k `pwrite`s a second, 16 KB pages 2.3k, and `/api/route` p99 fell
/// from 1.70 to 1.21 ms (medians of 5 alternating runs). A file that exists keeps
/// the page size it was made with.
const DECISIONS_PAGE_SIZE: i64 = 16 * 1024;

/// Attaches the decision log's file with the pragmas it is written under.
fn attach(conn: &Connection, path: &Path) -> rusqlite::Result<()> {
    conn.execute(
        &format!("ATTACH DATABASE ?1 AS {DECISIONS}"),
        [path.to_string_lossy()],
    )?;
    // Takes effect only before the file's first page is written.
    conn.pragma_update(Some(DECISIONS), "page_size", DECISIONS_PAGE_SIZE)?;
    conn.pragma_update(Some(DECISIONS), "journal_mode", "WAL")?;
    conn.pragma_update(Some(DECISIONS), "synchronous", "OFF")?;
    Ok(())
}

/// Refuses a schema newer than `known` in `schema` (`main` or [`DECISIONS`]).
fn check_version(conn: &Connection, schema: &str, known: i64) -> Result<(), StoreError> {
    let has_table: bool = conn.query_row(
        &format!("SELECT count(*) > 0 FROM {schema}.sqlite_master WHERE name = 'schema_version'"),
        [],
        |r| r.get(0),
    )?;
    if !has_table {
        return Ok(());
    }
    let found: i64 = conn.query_row(
        &format!("SELECT COALESCE(MAX(version), 0) FROM {schema}.schema_version"),
        [],
        |r| r.get(0),
    )?;
    if found > known {
        return Err(StoreError::SchemaTooNew { found, known });
    }
    Ok(())
}

fn migrate(
    conn: &mut Connection,
    schema: &str,
    migrations: &[(i64, &str)],
    known: i64,
) -> Result<(), StoreError> {
    conn.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS {schema}.schema_version (version INTEGER NOT NULL, applied_ms INTEGER NOT NULL)"
    ))?;
    let found: i64 = conn.query_row(
        &format!("SELECT COALESCE(MAX(version), 0) FROM {schema}.schema_version"),
        [],
        |r| r.get(0),
    )?;
    if found > known {
        return Err(StoreError::SchemaTooNew { found, known });
    }
    for (version, sql) in migrations.iter().filter(|(v, _)| *v > found) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.execute(
            &format!("INSERT INTO {schema}.schema_version(version, applied_ms) VALUES (?1, ?2)"),
            params![version, now_ms()],
        )?;
        tx.commit()?;
    }
    Ok(())
}

/// User turns of a session so far (0 for one that does not exist yet).
fn read_session_turn(c: &Connection, session: &str) -> rusqlite::Result<i64> {
    Ok(
        c.prepare_cached("SELECT n_turns FROM sessions WHERE id = ?1")?
            .query_row([session], |r| r.get(0))
            .optional()?
            .unwrap_or(0),
    )
}

const SESSION_HEAD_SQL: &str = "SELECT n_turns, carry FROM sessions WHERE id = ?1";
const CALLS_SINCE_SQL: &str = "SELECT turn, called FROM messages
     WHERE session_id = ?1 AND turn >= ?2 AND called IS NOT NULL
     ORDER BY id";
const SESSION_DOMAINS_SQL: &str = "SELECT domain, last_used_turn, pinned, unloaded
     FROM session_domains WHERE session_id = ?1 ORDER BY domain";

/// The session's turn count and the latest turn's carry-over list.
fn read_session_head(c: &Connection, session: &str) -> rusqlite::Result<(i64, Vec<String>)> {
    let head: Option<(i64, String)> = c
        .prepare_cached(SESSION_HEAD_SQL)?
        .query_row([session], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(head.map_or((0, Vec::new()), |(turn, carry)| (turn, parse_carry(&carry))))
}

/// The tools a session called with success from `turn` on, oldest first, with the
/// turn of each call.
fn read_calls_since(
    c: &Connection,
    session: &str,
    turn: i64,
) -> rusqlite::Result<Vec<(i64, String)>> {
    let mut stmt = c.prepare_cached(CALLS_SINCE_SQL)?;
    let rows = stmt.query_map(params![session, turn], |r| Ok((r.get(0)?, r.get(1)?)))?;
    rows.collect()
}

fn read_session_domains(
    c: &Connection,
    session: &str,
) -> rusqlite::Result<Vec<SessionDomainState>> {
    let mut stmt = c.prepare_cached(SESSION_DOMAINS_SQL)?;
    let rows = stmt.query_map([session], |r| {
        Ok(SessionDomainState {
            domain: r.get(0)?,
            last_used_turn: r.get(1)?,
            pinned: r.get(2)?,
            unloaded: r.get(3)?,
        })
    })?;
    rows.collect()
}

fn read_domains_used_since(c: &Connection, since_ms: i64) -> rusqlite::Result<Vec<String>> {
    let mut stmt =
        c.prepare_cached("SELECT domain FROM domain_use WHERE last_used_ms >= ?1 ORDER BY domain")?;
    let rows = stmt.query_map([since_ms], |r| r.get(0))?;
    rows.collect()
}

/// A decision row as read, and its compact reasons with their catalog's id, which
/// [`with_reasons`] decodes.
type ReadDecision = (DecisionRow, Option<(i64, Vec<u8>)>);

fn decision_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ReadDecision> {
    let (reasons, compact) = match (r.get_ref(6)?, r.get::<_, Option<i64>>(7)?) {
        // Decoded by `with_reasons`, which needs the catalog; `null` until then.
        (ValueRef::Blob(bytes), Some(catalog)) => {
            (Reasons::null(), Some((catalog, bytes.to_vec())))
        }
        (ValueRef::Text(text), _) => (
            Reasons::from_text(String::from_utf8_lossy(text).into_owned()),
            None,
        ),
        _ => (Reasons::null(), None),
    };
    Ok((
        DecisionRow {
            at_ms: r.get(0)?,
            session: r.get(1)?,
            turn: r.get(2)?,
            message: r.get(3)?,
            n_tools: r.get(4)?,
            tokens: r.get(5)?,
            reasons,
        },
        compact,
    ))
}

/// The rows with their compact reasons decoded to JSON, each catalog read once.
/// Reasons whose catalog is missing or unreadable read as `null`.
fn with_reasons(c: &Connection, rows: Vec<ReadDecision>) -> Result<Vec<DecisionRow>, StoreError> {
    let mut catalogs: HashMap<i64, Option<LogNames>> = HashMap::new();
    let mut read = c.prepare_cached("SELECT names FROM decisions.catalogs WHERE id = ?1")?;
    let mut out = Vec::with_capacity(rows.len());
    for (mut row, compact) in rows {
        if let Some((catalog, bytes)) = compact {
            let names = match catalogs.entry(catalog) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let text: Option<String> =
                        read.query_row([catalog], |r| r.get(0)).optional()?;
                    let names = text.as_deref().and_then(LogNames::from_stored);
                    if names.is_none() {
                        tracing::warn!("decision-log catalog {catalog} missing or unreadable");
                    }
                    e.insert(names)
                }
            };
            if let Some(names) = names {
                row.reasons = Reasons::from_compact(&bytes, names);
            }
        }
        out.push(row);
    }
    Ok(out)
}

/// Runs `write` once more after [`RETRY_AFTER`] if it fails: a database held by
/// another process for longer than the busy timeout is the usual cause. On the log
/// thread, so the pause delays only later log rows.
fn retry_once(
    c: &mut Connection,
    write: impl Fn(&mut Connection) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    write(c).or_else(|e| {
        tracing::debug!("log write failed, retrying: {e}");
        std::thread::sleep(super::RETRY_AFTER);
        write(c)
    })
}

/// Inserts a batch of log rows in one transaction, retried once (see [`retry_once`]).
fn insert_batch<R>(
    c: &mut Connection,
    sql: &str,
    rows: &[R],
    insert: impl Fn(&mut rusqlite::CachedStatement<'_>, &R) -> rusqlite::Result<usize>,
) -> Result<(), StoreError> {
    retry_once(c, |c| {
        let tx = c.transaction()?;
        {
            let mut stmt = tx.prepare_cached(sql)?;
            for row in rows {
                insert(&mut stmt, row)?;
            }
        }
        tx.commit()?;
        Ok(())
    })
}

/// Appends decision rows in one transaction, each row of a session pointing to the
/// session's previous one, and moves each session's `session_last` to its newest
/// row (see the decision log's migration 3).
fn insert_decisions(c: &mut Connection, rows: &[DecisionRow]) -> Result<(), StoreError> {
    let tx = c.transaction()?;
    {
        // So that another process sharing the file cannot append to a session
        // between the read of its newest row and the write of the next.
        lock_decisions(&tx)?;
        let mut newest =
            tx.prepare_cached("SELECT last_id FROM decisions.session_last WHERE session_id = ?1")?;
        let mut insert = tx.prepare_cached(
            "INSERT INTO decisions.tool_history
                 (at_ms, session_id, turn, message, n_tools, tokens, reasons, prev_id, catalog_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?;
        // Each session's newest row so far, read once per batch.
        let mut last: HashMap<&str, i64> = Default::default();
        // The catalogs of the batch's compact rows (one, unless the router was
        // rebuilt): the names' address, the catalog's id, the newest row using it.
        let mut catalogs: Vec<(*const LogNames, i64, i64)> = Vec::new();
        for row in rows {
            let prev = match row.session.as_deref() {
                None => None,
                Some(session) => match last.get(session) {
                    Some(&id) => Some(id),
                    None => newest
                        .query_row([session], |r| r.get::<_, i64>(0))
                        .optional()?,
                },
            };
            let json;
            // The row's reasons, and for compact ones the index of their catalog in
            // `catalogs`.
            let (reasons, slot) = match row.reasons.compact() {
                Some((names, bytes)) => {
                    let at = Arc::as_ptr(names);
                    let slot = match catalogs.iter().position(|c| c.0 == at) {
                        Some(i) => i,
                        None => {
                            catalogs.push((at, catalog_id(&tx, names)?, 0));
                            catalogs.len() - 1
                        }
                    };
                    (ToSqlOutput::Borrowed(ValueRef::Blob(bytes)), Some(slot))
                }
                None => {
                    json = row.reasons.json();
                    (ToSqlOutput::Borrowed(ValueRef::Text(json.as_bytes())), None)
                }
            };
            let catalog = slot.map(|i| catalogs[i].1);
            insert.execute(params![
                row.at_ms,
                row.session,
                row.turn,
                row.message,
                row.n_tools,
                row.tokens,
                reasons,
                prev,
                catalog
            ])?;
            let id = tx.last_insert_rowid();
            if let Some(session) = row.session.as_deref() {
                last.insert(session, id);
            }
            if let Some(i) = slot {
                catalogs[i].2 = id;
            }
        }
        let mut used = tx.prepare_cached(
            "UPDATE decisions.catalogs SET last_row_id = max(last_row_id, ?2) WHERE id = ?1",
        )?;
        for (_, catalog, newest) in &catalogs {
            used.execute(params![catalog, newest])?;
        }
        let mut put = tx.prepare_cached(
            "INSERT INTO decisions.session_last(session_id, last_id) VALUES (?1, ?2)
             ON CONFLICT(session_id) DO UPDATE SET last_id = excluded.last_id",
        )?;
        for (session, id) in &last {
            put.execute(params![session, id])?;
        }
    }
    tx.commit()?;
    Ok(())
}

/// The id of `names`' catalog, stored now if no row has used those names yet.
fn catalog_id(tx: &rusqlite::Transaction<'_>, names: &LogNames) -> rusqlite::Result<i64> {
    let stored = names.stored();
    let found: Option<i64> = tx
        .prepare_cached("SELECT id FROM decisions.catalogs WHERE digest = ?1")?
        .query_row([&stored.digest], |r| r.get(0))
        .optional()?;
    match found {
        Some(id) => Ok(id),
        None => {
            tx.prepare_cached(
                "INSERT INTO decisions.catalogs(digest, names, last_row_id) VALUES (?1, ?2, 0)",
            )?
            .execute(params![stored.digest, stored.json])?;
            Ok(tx.last_insert_rowid())
        }
    }
}

/// Takes the decision log file's write lock for the transaction `tx` has begun, and
/// only that file's: `BEGIN IMMEDIATE` would take the main file's too, and sessions'
/// writes on the request connection would wait for the log's batch.
fn lock_decisions(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    // A write statement takes its file's lock even when it changes nothing.
    tx.prepare_cached("UPDATE decisions.session_last SET last_id = last_id WHERE 0")?
        .execute([])?;
    Ok(())
}

/// How often the WAL is copied back into the database file. Each checkpoint ends in
/// two `fsync`s, and on the small virtual machines this is measured on, an `fsync`
/// stalls every thread of the process for a few milliseconds, longer the more it
/// flushes: at 8k logged requests/s, `/api/route` p99 was 5-6 ms checkpointing every
/// second, 13-25 ms every 5 s, 4-4.7 ms every 250 ms (0.6 ms with no checkpoints).
/// Small and frequent wins; an idle WAL costs nothing to check.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// WAL pages after which the log connection checkpoints on its own commit even
/// before the timer (SQLite's default).
const LOG_AUTOCHECKPOINT_PAGES: i64 = 1_000;

/// The request thread's own state: a handle on the log thread, let go only after
/// the request connection has closed, so that the log connection always closes last.
/// The last connection to close checkpoints the WAL into the file and deletes it;
/// two closing at once can each see the other still open and leave the WAL behind.
struct LogThreadAlive {
    _log: ConnectionThread<LogPriority>,
}

/// A job for a [`ConnectionThread`], with the thread's own state `S`.
type Job<S> = Box<dyn FnOnce(&mut Connection, &S) + Send>;

/// A connection owned by one OS thread that runs the jobs sent to it, in arrival
/// order; the thread ends when the last sender is gone (the store was dropped).
///
/// The request connection used to be a fair async mutex plus one `spawn_blocking`
/// per call. Each call then cost a hand-off to a pool thread and back, and the next
/// waiter only started once its own task had been scheduled again: under session
/// load the profile was mostly context switches. A thread of its own drains its
/// queue without waiting in between.
struct ConnectionThread<S> {
    jobs: Arc<std::sync::mpsc::Sender<Job<S>>>,
}

impl<S> Clone for ConnectionThread<S> {
    fn clone(&self) -> Self {
        ConnectionThread {
            jobs: self.jobs.clone(),
        }
    }
}

impl<S: 'static> ConnectionThread<S> {
    /// Starts the thread; `state` runs on it first (the log thread lowers its own
    /// priority there).
    fn start(
        name: &str,
        mut conn: Connection,
        state: impl FnOnce() -> S + Send + 'static,
    ) -> Result<ConnectionThread<S>, StoreError> {
        let (jobs, queue) = std::sync::mpsc::channel::<Job<S>>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let state = state();
                for job in queue {
                    job(&mut conn, &state);
                }
                // The connection closes before the state goes (see `LogThreadAlive`).
                drop(conn);
                drop(state);
            })
            .map_err(|e| StoreError::Database(format!("starting the thread {name}: {e}")))?;
        Ok(ConnectionThread {
            jobs: Arc::new(jobs),
        })
    }

    /// Runs `f` on the thread and waits for its result without holding a runtime
    /// thread.
    async fn run<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        F: FnOnce(&mut Connection, &S) -> Result<R, StoreError> + Send + 'static,
        R: Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job: Job<S> = Box::new(move |conn, state| {
            // A panic in `f` is reported like a failed storage task; the thread and
            // its connection carry on (an open transaction rolls back when dropped).
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(conn, state)))
                .unwrap_or_else(|_| Err(StoreError::Database("storage task panicked".into())));
            let _ = reply.send(result);
        });
        let stopped = || StoreError::Database("the storage thread has stopped".into());
        self.jobs.send(job).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    fn downgrade(&self) -> std::sync::Weak<std::sync::mpsc::Sender<Job<S>>> {
        Arc::downgrade(&self.jobs)
    }
}

/// A passive checkpoint every [`CHECKPOINT_EVERY`] on the log connection, while the
/// store lives: it never waits for readers or writers, and no request pays for it.
/// The log connection also checkpoints on its own commits past
/// [`LOG_AUTOCHECKPOINT_PAGES`]. The last connection to close checkpoints what is
/// left.
fn spawn_checkpoints(jobs: std::sync::Weak<std::sync::mpsc::Sender<Job<LogPriority>>>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut every = tokio::time::interval(CHECKPOINT_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            let Some(jobs) = jobs.upgrade() else {
                return;
            };
            let log_conn = ConnectionThread { jobs };
            let result = log_conn
                .run(|c, _| {
                    c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))?;
                    Ok(())
                })
                .await;
            if let Err(e) = result {
                tracing::debug!("WAL checkpoint: {e}");
            }
        }
    });
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use thread_priority::{NormalThreadSchedulePolicy, ThreadSchedulePolicy};

    /// The policy the log thread runs a job of `pace` under.
    async fn policy_for(store: &SqliteStore, pace: LogPace) -> ThreadSchedulePolicy {
        store
            .call_log(pace, |_| {
                thread_priority::unix::thread_schedule_policy()
                    .map_err(|e| StoreError::Database(format!("reading the policy: {e:?}")))
            })
            .await
            .expect("policy")
    }

    #[tokio::test]
    async fn the_writers_pace_decides_the_log_threads_priority() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("loadout.db"))
            .await
            .expect("open");
        let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
        let other = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Other);
        let here = std::thread::spawn(LogPriority::lower)
            .join()
            .expect("probe");
        if here != LogPriority::Idle {
            // This machine refuses the way back from SCHED_IDLE: the thread stays
            // at nice 19 for every pace.
            assert_eq!(policy_for(&store, LogPace::CatchUp).await, other);
            return;
        }
        assert_eq!(policy_for(&store, LogPace::Idle).await, idle);
        assert_eq!(policy_for(&store, LogPace::CatchUp).await, other);
        // Catching up is for one batch; the next idle-paced job is idle again.
        assert_eq!(policy_for(&store, LogPace::Idle).await, idle);
    }

    /// The statements of a routed session turn stay compiled from one turn to the
    /// next, whatever session they are bound to (see `configure`).
    #[tokio::test]
    async fn a_session_turns_statements_are_not_compiled_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("loadout.db"))
            .await
            .expect("store");
        for i in 0..5 {
            let session = format!("session-{i}");
            let state = SessionDomainState {
                domain: "weather".into(),
                last_used_turn: 1,
                pinned: false,
                unloaded: false,
            };
            store
                .session_domain_put(&session, &state)
                .await
                .expect("domain");
            store
                .message_append(&session, "user", &serde_json::json!("hello"), &[])
                .await
                .expect("turn");
            store.session_snapshot(&session, 0).await.expect("snapshot");
        }
        let (runs, recompiled) = store
            .call(|c| {
                let mut runs = 0;
                let mut recompiled = 0;
                for sql in [SESSION_DOMAINS_SQL, CALLS_SINCE_SQL, SESSION_HEAD_SQL] {
                    let statement = c.prepare_cached(sql)?;
                    runs += statement.get_status(rusqlite::StatementStatus::Run);
                    recompiled += statement.get_status(rusqlite::StatementStatus::RePrepare);
                }
                Ok((runs, recompiled))
            })
            .await
            .expect("status");
        assert_eq!(runs, 15, "the snapshot's three reads ran once per turn");
        assert_eq!(recompiled, 0);
    }

    /// While the log holds its file's write lock, another connection can still
    /// write the main file (a session's turn), and cannot write the log's file.
    #[tokio::test]
    async fn the_log_locks_its_own_file_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("loadout.db");
        let store = SqliteStore::open(&path).await.expect("open");
        let other_path = path.clone();
        let (main_write, log_write) = store
            .call_log(LogPace::CatchUp, move |c| {
                let tx = c.transaction()?;
                lock_decisions(&tx)?;
                let other = Connection::open(&other_path)?;
                attach(&other, &decisions_path(&other_path))?;
                other.busy_timeout(std::time::Duration::ZERO)?;
                let main_write = other.execute(
                    "INSERT INTO settings(key, value, updated_ms) VALUES ('k', 'v', 0)",
                    [],
                );
                let log_write = other.execute(
                    "INSERT INTO decisions.session_last(session_id, last_id) VALUES ('s', 1)",
                    [],
                );
                drop(tx);
                Ok((
                    main_write.map_err(|e| e.to_string()),
                    log_write.map_err(|e| e.to_string()),
                ))
            })
            .await
            .expect("log job");
        assert_eq!(main_write, Ok(1));
        let refused = log_write.expect_err("the log's file is locked");
        assert!(refused.contains("locked"), "{refused}");
    }

    /// Versions 2 to 4 of the decision log's file keep every row and its id,
    /// number new rows after them, and chain each session's rows in place of the
    /// index on sessions, old rows included.
    #[tokio::test]
    async fn the_decision_log_upgrades_to_plain_rowids_and_chained_sessions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("loadout.db");
        let store = SqliteStore::open(&path).await.expect("open");
        store
            .call(|c| {
                // Back to version 1, as that version made it.
                c.execute_batch(
                    "DROP TABLE decisions.tool_history; DROP TABLE decisions.session_last;
                     DROP TABLE decisions.catalogs;",
                )?;
                c.execute_batch(DECISIONS_MIGRATIONS[0].1)?;
                c.execute_batch(
                    "INSERT INTO decisions.tool_history VALUES
                         (40, 1, 't', 1, 'other', 3, 100, '{}'),
                         (41, 1, 's', 1, 'first', 3, 100, '{}'),
                         (42, 2, NULL, 1, 'one-off', 3, 100, '{}'),
                         (43, 2, 's', 2, 'second', 3, 100, '{}');
                     DELETE FROM decisions.schema_version WHERE version > 1;",
                )?;
                Ok(())
            })
            .await
            .expect("downgrade");
        drop(store);
        let store = SqliteStore::open(&path).await.expect("upgrade");
        let row = |session: Option<&str>| DecisionRow {
            at_ms: 3,
            session: session.map(str::to_owned),
            turn: 3,
            message: "third".into(),
            n_tools: 3,
            tokens: 100,
            reasons: Reasons::from_text("{}".into()),
        };
        store
            .decisions_insert(vec![row(Some("s")), row(None)], LogPace::CatchUp)
            .await
            .expect("insert");
        let kept = store.decisions("s").await.expect("decisions");
        let messages: Vec<&str> = kept.iter().map(|r| r.message.as_str()).collect();
        assert_eq!(messages, ["first", "second", "third"]);
        let first = store.first_decision("s").await.expect("first");
        assert_eq!(first.map(|r| r.message), Some("first".into()));
        let (ids, table, indexes) = store
            .call(|c| {
                let ids = c
                    .prepare("SELECT id, prev_id FROM decisions.tool_history ORDER BY id")?
                    .query_map([], |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, Option<i64>>(1)?))
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                let table: String = c.query_row(
                    "SELECT sql FROM decisions.sqlite_master WHERE name = 'tool_history'",
                    [],
                    |r| r.get(0),
                )?;
                let indexes = c
                    .prepare(
                        "SELECT name FROM decisions.sqlite_master
                         WHERE type = 'index' AND tbl_name = 'tool_history'",
                    )?
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok((ids, table, indexes))
            })
            .await
            .expect("inspect");
        assert_eq!(
            ids,
            [
                (40, None),
                (41, None),
                (42, None),
                (43, Some(41)),
                (44, Some(43)),
                (45, None)
            ]
        );
        assert!(!table.contains("AUTOINCREMENT"), "{table}");
        // Appending a row writes the table alone: no index spread over sessions.
        assert!(indexes.is_empty(), "{indexes:?}");
    }
}

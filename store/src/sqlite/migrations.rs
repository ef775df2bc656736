//! The schema of both files, applied at open, and the refusal of a newer one.
//!
//! Migrations are numbered and applied in order; a shipped one is never edited, a
//! change adds one. Version 1 is the schema as first released.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, params};

use super::{DECISIONS, Error, decisions_path};
use crate::{StoreError, now_ms};

/// The main file: settings, sessions, messages, router state, audit log, learned
/// memory.
pub(super) const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        r#"
    CREATE TABLE settings (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_ms INTEGER NOT NULL
    );
    -- Moved by every settings write, by any connection or process, and by nothing
    -- else: caches compare it (`PRAGMA data_version` moves with every commit).
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
    -- `carry`: the tools the latest turn carries into a follow-up with no evidence
    -- of its own (a JSON array), written with the turn's message.
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        created_ms INTEGER NOT NULL,
        n_turns INTEGER NOT NULL DEFAULT 0,
        carry TEXT NOT NULL DEFAULT '[]'
    );
    -- `called`: the tool a successful `tool` message ran, so that routing reads a
    -- turn's calls without parsing results.
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        turn INTEGER NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        at_ms INTEGER NOT NULL,
        called TEXT
    );
    CREATE INDEX messages_by_session ON messages(session_id, id);
    CREATE INDEX messages_by_turn ON messages(session_id, turn);
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
    -- The learned memory: past messages and the tools their turns called with
    -- success. `normalized`: the message's words, to merge repeats; `vector`: the
    -- message's vector from encoder `model`, little-endian f32s.
    CREATE TABLE learned_entries (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at_ms INTEGER NOT NULL,
        session TEXT,
        source TEXT NOT NULL,
        message TEXT NOT NULL,
        normalized TEXT NOT NULL,
        model TEXT,
        vector BLOB,
        n_merged INTEGER NOT NULL DEFAULT 1
    );
    CREATE TABLE learned_tools (
        entry_id INTEGER NOT NULL REFERENCES learned_entries(id) ON DELETE CASCADE,
        tool TEXT NOT NULL,
        PRIMARY KEY (tool, entry_id)
    );
    CREATE INDEX learned_tools_by_entry ON learned_tools(entry_id);
    -- A session teaches a tool at most once per day (UTC day number).
    CREATE TABLE learned_session_days (
        session TEXT NOT NULL,
        tool TEXT NOT NULL,
        day INTEGER NOT NULL,
        PRIMARY KEY (session, tool, day)
    );
    CREATE INDEX learned_session_days_by_day ON learned_session_days(day);
    -- Moved by every write of the learned memory: replicas poll it to rebuild.
    CREATE TABLE learned_version (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        version INTEGER NOT NULL
    );
    INSERT INTO learned_version(id, version) VALUES (1, 0);
    "#,
    ),
    (
        2,
        r#"
    -- Issue 40: clients told apart by their own token, stored as its SHA-256 only.
    -- `domains` and `tools` are JSON arrays (empty: no limit of that kind).
    CREATE TABLE clients (
        name TEXT PRIMARY KEY,
        token_sha256 TEXT NOT NULL UNIQUE,
        domains TEXT NOT NULL,
        tools TEXT NOT NULL,
        rate_per_min INTEGER,
        read_only INTEGER NOT NULL,
        created_ms INTEGER NOT NULL
    );
    "#,
    ),
    (
        3,
        r#"
    -- Issue 40: a session belongs to the client that started it (NULL: the
    -- operator's); another client's token cannot route or chat in it.
    ALTER TABLE sessions ADD COLUMN client TEXT;
    "#,
    ),
];

/// Newest schema version of the main file this binary knows.
pub const SCHEMA_VERSION: i64 = 3;

/// The decision log's file. A row is one append: each row of a session points to
/// the session's previous row (`prev_id`) and `session_last` holds each session's
/// newest, so a batch writes its rows and a page or two, where an index on
/// `(session_id, id)` would rewrite a page per session in the batch.
pub(super) const DECISIONS_MIGRATIONS: &[(i64, &str)] = &[(
    1,
    r#"
    CREATE TABLE decisions.tool_history (
        id INTEGER PRIMARY KEY,
        at_ms INTEGER NOT NULL,
        session_id TEXT,
        turn INTEGER NOT NULL,
        message TEXT NOT NULL,
        n_tools INTEGER NOT NULL,
        tokens INTEGER NOT NULL,
        reasons TEXT NOT NULL,
        prev_id INTEGER
    );
    CREATE TABLE decisions.session_last (
        session_id TEXT PRIMARY KEY,
        last_id INTEGER NOT NULL
    ) WITHOUT ROWID;
    "#,
)];

/// Newest schema version of the decision log's file this binary knows.
pub(super) const DECISIONS_SCHEMA_VERSION: i64 = 1;

/// Attaches the decision log's file to `conn` as [`DECISIONS`] and brings its schema
/// up to date. A file that is not a readable database (a power cut while it was
/// written without `fsync`) is renamed `…decisions.db.corrupt-<ms>`, kept for
/// inspection, and a new one is started: the decision log is worth less than a
/// server that starts.
pub(super) fn attach_decisions(conn: &mut Connection, main: &Path) -> Result<(), StoreError> {
    let path = decisions_path(main);
    let open_err = |e: &dyn std::fmt::Display| StoreError::Open {
        url: format!("sqlite:{}", path.display()),
        message: e.to_string(),
    };
    let attached = attach(conn, &path)
        .map_err(|e| StoreError::from(Error::from(e)))
        .and_then(|()| migrate_decisions(conn));
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
            migrate_decisions(conn)
        }
        other => other,
    }
}

fn migrate_decisions(conn: &mut Connection) -> Result<(), StoreError> {
    migrate(
        conn,
        DECISIONS,
        DECISIONS_MIGRATIONS,
        DECISIONS_SCHEMA_VERSION,
    )
}

fn is_unreadable(message: &str) -> bool {
    message.contains("not a database") || message.contains("malformed")
}

/// Page size of a new decision log file: the log appends rows of about 1 KB, and
/// larger pages take fewer system calls per row. A file that exists keeps its own.
const DECISIONS_PAGE_SIZE: i64 = 16 * 1024;

/// Attaches the decision log's file with the pragmas it is written under: without
/// `fsync`, since a process crash loses nothing SQLite committed (see
/// `SqliteStore::open`).
pub(super) fn attach(conn: &Connection, path: &Path) -> rusqlite::Result<()> {
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
pub(super) fn check_version(conn: &Connection, schema: &str, known: i64) -> Result<(), StoreError> {
    let found = (|| -> rusqlite::Result<Option<i64>> {
        let has_table: bool = conn.query_row(
            &format!(
                "SELECT count(*) > 0 FROM {schema}.sqlite_master WHERE name = 'schema_version'"
            ),
            [],
            |r| r.get(0),
        )?;
        if !has_table {
            return Ok(None);
        }
        conn.query_row(
            &format!("SELECT COALESCE(MAX(version), 0) FROM {schema}.schema_version"),
            [],
            |r| r.get(0),
        )
        .map(Some)
    })()
    .map_err(Error::from)?;
    match found {
        Some(found) if found > known => Err(StoreError::SchemaTooNew { found, known }),
        _ => Ok(()),
    }
}

pub(super) fn migrate(
    conn: &mut Connection,
    schema: &str,
    migrations: &[(i64, &str)],
    known: i64,
) -> Result<(), StoreError> {
    check_version(conn, schema, known)?;
    let apply = |conn: &mut Connection| -> Result<(), Error> {
        conn.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {schema}.schema_version (version INTEGER NOT NULL, applied_ms INTEGER NOT NULL)"
        ))?;
        let found: i64 = conn.query_row(
            &format!("SELECT COALESCE(MAX(version), 0) FROM {schema}.schema_version"),
            [],
            |r| r.get(0),
        )?;
        for (version, sql) in migrations.iter().filter(|(v, _)| *v > found) {
            let tx = conn.transaction()?;
            tx.execute_batch(sql)?;
            tx.execute(
                &format!(
                    "INSERT INTO {schema}.schema_version(version, applied_ms) VALUES (?1, ?2)"
                ),
                params![version, now_ms()],
            )?;
            tx.commit()?;
        }
        Ok(())
    };
    apply(conn).map_err(StoreError::from)
}

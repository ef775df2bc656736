//! The schema, applied at connect under an advisory lock so that replicas starting
//! together do not race, and the refusal of a newer one. Version numbers and
//! meaning are SQLite's.

use deadpool_postgres::Object;

use crate::{StoreError, now_ms};

/// Advisory lock key (arbitrary, fixed) of migrations.
const MIGRATION_LOCK: i64 = 0x6c6f_6164_6f75_7401;

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
    -- `carry`: the tools the latest turn carries into a follow-up with no evidence
    -- of its own (a JSON array), written with the turn's message.
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        created_ms BIGINT NOT NULL,
        n_turns BIGINT NOT NULL DEFAULT 0,
        carry TEXT NOT NULL DEFAULT '[]'
    );
    -- `called`: the tool a successful `tool` message ran, read without a `jsonb`
    -- cast, which fails on a `\u0000` escape in a tool's result.
    CREATE TABLE messages (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions(id),
        turn BIGINT NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        at_ms BIGINT NOT NULL,
        called TEXT
    );
    CREATE INDEX messages_by_session ON messages(session_id, id);
    CREATE INDEX messages_by_turn ON messages(session_id, turn);
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
    CREATE TABLE learned_entries (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at_ms BIGINT NOT NULL,
        session TEXT,
        source TEXT NOT NULL,
        message TEXT NOT NULL,
        normalized TEXT NOT NULL,
        model TEXT,
        vector BYTEA,
        n_merged BIGINT NOT NULL DEFAULT 1
    );
    CREATE TABLE learned_tools (
        entry_id BIGINT NOT NULL REFERENCES learned_entries(id) ON DELETE CASCADE,
        tool TEXT NOT NULL,
        PRIMARY KEY (tool, entry_id)
    );
    CREATE INDEX learned_tools_by_entry ON learned_tools(entry_id);
    CREATE TABLE learned_session_days (
        session TEXT NOT NULL,
        tool TEXT NOT NULL,
        day BIGINT NOT NULL,
        PRIMARY KEY (session, tool, day)
    );
    CREATE INDEX learned_session_days_by_day ON learned_session_days(day);
    -- Its row lock orders learned writes of every replica; replicas poll it.
    CREATE TABLE learned_version (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        version BIGINT NOT NULL
    );
    INSERT INTO learned_version (id, version) VALUES (1, 0);
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
        rate_per_min BIGINT,
        read_only BOOLEAN NOT NULL,
        created_ms BIGINT NOT NULL
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

/// Newest schema version this binary knows; equal to SQLite's.
pub const SCHEMA_VERSION: i64 = 3;

pub(super) enum MigrateError {
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
pub(super) async fn migrate(client: &mut Object) -> Result<(), MigrateError> {
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

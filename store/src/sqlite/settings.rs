//! Settings on SQLite: a table, and a counter every write moves.

use std::collections::BTreeMap;

use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use crate::{StoreError, now_ms};

impl SqliteStore {
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
            checkpoint_now(c);
            Ok(())
        })
        .await
    }

    pub async fn setting_unset(&self, key: &str) -> Result<bool, StoreError> {
        let key = key.to_owned();
        self.call(move |c| {
            let removed = c
                .prepare_cached("DELETE FROM settings WHERE key = ?1")?
                .execute([key])?
                > 0;
            checkpoint_now(c);
            Ok(removed)
        })
        .await
    }

    /// The settings counter: moved by every settings write through any connection
    /// or process, and by nothing else.
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
}

/// Copies the WAL into the database file now (PASSIVE: waits for no one), so that a
/// setting, once acknowledged, is in the main file even if the WAL is later lost or
/// cut; the periodic checkpoint would leave up to its interval in the WAL alone.
/// Settings are written rarely, so the request pays this seldom.
fn checkpoint_now(c: &rusqlite::Connection) {
    if let Err(e) = c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::debug!("WAL checkpoint after a settings write: {e}");
    }
}

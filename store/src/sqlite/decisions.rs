//! The decision log on SQLite, in a file of its own (see `SqliteStore::open`),
//! written by the log connection.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, params};

use super::{Error, SqliteStore};
use crate::{DecisionRow, Reasons, StoreError, retention_horizon_ms};

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
    SELECT t.at_ms, t.session_id, t.turn, t.message, t.n_tools, t.tokens, t.reasons
      FROM chain JOIN decisions.tool_history AS t ON t.id = chain.id
     WHERE t.session_id = ?1
     ORDER BY t.id";

impl SqliteStore {
    /// Appends a batch in one transaction (retried once, after [`crate::RETRY_AFTER`],
    /// if it fails: another process holding the file past the busy timeout is the
    /// usual cause).
    pub async fn decisions_insert(&self, rows: Vec<DecisionRow>) -> Result<(), StoreError> {
        self.call_log(move |c| {
            insert_decisions(c, &rows).or_else(|e| {
                tracing::debug!("log write failed, retrying: {}", StoreError::from(e));
                std::thread::sleep(crate::RETRY_AFTER);
                insert_decisions(c, &rows)
            })
        })
        .await
    }

    pub async fn decisions(&self, session: &str) -> Result<Vec<DecisionRow>, StoreError> {
        let session = session.to_owned();
        self.call(move |c| {
            let mut stmt = c.prepare_cached(SESSION_DECISIONS_SQL)?;
            let rows = stmt.query_map([session], decision_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    pub async fn first_decision(&self, session: &str) -> Result<Option<DecisionRow>, StoreError> {
        let session = session.to_owned();
        self.call(move |c| {
            // The walk goes back to the first row; a session has one per turn.
            let mut stmt = c.prepare_cached(&format!("{SESSION_DECISIONS_SQL} LIMIT 1"))?;
            Ok(stmt.query_row([session], decision_row).optional()?)
        })
        .await
    }

    pub async fn decisions_tail(&self, n: usize) -> Result<Vec<DecisionRow>, StoreError> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        self.call(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT at_ms, session_id, turn, message, n_tools, tokens, reasons
                   FROM (SELECT * FROM decisions.tool_history ORDER BY id DESC LIMIT ?1)
                  ORDER BY id",
            )?;
            let rows = stmt.query_map([n], decision_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    pub async fn decisions_prune(&self, before_ms: i64, limit: usize) -> Result<usize, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.call_log(move |c| {
            // The oldest row first: when it is recent, nothing is old and no scan runs.
            let oldest: Option<i64> = c
                .prepare_cached("SELECT at_ms FROM decisions.tool_history ORDER BY id LIMIT 1")?
                .query_row([], |r| r.get(0))
                .optional()?;
            let horizon_ms = retention_horizon_ms();
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
            tx.commit()?;
            Ok(n)
        })
        .await
    }
}

fn decision_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<DecisionRow> {
    let reasons: String = r.get(6)?;
    Ok(DecisionRow {
        at_ms: r.get(0)?,
        session: r.get(1)?,
        turn: r.get(2)?,
        message: r.get(3)?,
        n_tools: r.get(4)?,
        tokens: r.get(5)?,
        reasons: Reasons::from_json(&reasons),
    })
}

/// Appends decision rows in one transaction, each row of a session pointing to the
/// session's previous one, and moves each session's `session_last` to its newest row.
fn insert_decisions(c: &mut Connection, rows: &[DecisionRow]) -> Result<(), Error> {
    let tx = c.transaction()?;
    {
        // So that another process sharing the file cannot append to a session
        // between the read of its newest row and the write of the next.
        lock_decisions(&tx)?;
        let mut newest =
            tx.prepare_cached("SELECT last_id FROM decisions.session_last WHERE session_id = ?1")?;
        let mut insert = tx.prepare_cached(
            "INSERT INTO decisions.tool_history
                 (at_ms, session_id, turn, message, n_tools, tokens, reasons, prev_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        // Each session's newest row so far, read once per batch.
        let mut last: HashMap<&str, i64> = HashMap::new();
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
            insert.execute(params![
                row.at_ms,
                row.session,
                row.turn,
                row.message,
                row.n_tools,
                row.tokens,
                row.reasons.to_json(),
                prev,
            ])?;
            if let Some(session) = row.session.as_deref() {
                last.insert(session, tx.last_insert_rowid());
            }
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

/// Takes the decision log file's write lock for the transaction `tx` has begun, and
/// only that file's: `BEGIN IMMEDIATE` would take the main file's too, and sessions'
/// writes on the request connection would wait for the log's batch.
fn lock_decisions(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    // A write statement takes its file's lock even when it changes nothing.
    tx.prepare_cached("UPDATE decisions.session_last SET last_id = last_id WHERE 0")?
        .execute([])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{attach, decisions_path};
    use super::*;

    /// While the log holds its file's write lock, another connection can still
    /// write the main file (a session's turn), and cannot write the log's file.
    #[tokio::test]
    async fn the_log_locks_its_own_file_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("loadout.db");
        let store = SqliteStore::open(&path).await.expect("open");
        let other_path = path.clone();
        let (main_write, log_write) = store
            .call_log(move |c| {
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
}

//! The audit log on SQLite: one row per tool call, written before the call's answer
//! goes out, so that a crash loses none.

use rusqlite::params;

use super::SqliteStore;
use crate::{AuditRow, StoreError};

impl SqliteStore {
    pub async fn audit_insert(&self, rows: Vec<AuditRow>) -> Result<(), StoreError> {
        self.call(move |c| {
            let tx = c.transaction()?;
            {
                let mut stmt = tx.prepare_cached(
                    "INSERT INTO audit_log(at_ms, client, tool, args, outcome, detail, duration_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )?;
                for row in &rows {
                    stmt.execute(params![
                        row.at_ms,
                        row.client,
                        row.tool,
                        row.args.to_string(),
                        row.outcome,
                        row.detail,
                        row.duration_ms
                    ])?;
                }
            }
            tx.commit()?;
            Ok(())
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

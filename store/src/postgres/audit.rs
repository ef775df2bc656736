//! The audit log on PostgreSQL: one row per tool call, written before the call's
//! answer goes out.

use std::borrow::Cow;

use super::{PostgresStore, retry_once, without_nul};
use crate::{AuditRow, StoreError};

impl PostgresStore {
    pub async fn audit_insert(&self, rows: Vec<AuditRow>) -> Result<(), StoreError> {
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
}

//! The decision log on PostgreSQL: a table beside the others, written by the
//! background writer in one statement per batch.

use std::borrow::Cow;

use super::{PostgresStore, retry_once, without_nul};
use crate::{DecisionRow, Reasons, StoreError, retention_horizon_ms};

impl PostgresStore {
    /// One statement per batch: the rows travel as arrays and are unnested in order.
    pub async fn decisions_insert(&self, rows: Vec<DecisionRow>) -> Result<(), StoreError> {
        let reasons: Vec<String> = rows.iter().map(|r| r.reasons.to_json()).collect();
        retry_once(|| self.decisions_insert_once(&rows, &reasons)).await
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
        let horizon_ms = retention_horizon_ms();
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
}

fn decision_row(r: &tokio_postgres::Row) -> Result<DecisionRow, tokio_postgres::Error> {
    Ok(DecisionRow {
        at_ms: r.try_get(0)?,
        session: r.try_get(1)?,
        turn: r.try_get(2)?,
        message: r.try_get(3)?,
        n_tools: r.try_get(4)?,
        tokens: r.try_get(5)?,
        reasons: Reasons::from_json(r.try_get(6)?),
    })
}

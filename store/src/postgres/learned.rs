//! The learned memory on PostgreSQL, shared by every replica. A write takes the row
//! lock of `learned_version` first, so that two replicas learning the same message at
//! once merge it instead of adding it twice.

use super::{PostgresStore, without_nul};
use crate::StoreError;
use crate::learned::{
    self, Candidate, LearnOutcome, LearnedRow, LearnedStatements, LearnedWrite, vector_bytes,
    vector_from_bytes, with_tools,
};

impl PostgresStore {
    pub async fn learned_insert(
        &self,
        write: LearnedWrite,
        per_tool: usize,
    ) -> Result<LearnOutcome, StoreError> {
        let per_tool = i64::try_from(per_tool.max(1)).unwrap_or(i64::MAX);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        let outcome = learned::write(&mut Statements { tx: &tx }, &write, per_tool)
            .await
            .map_err(|e| self.error(e))?;
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(outcome)
    }

    pub async fn learned_rows(
        &self,
        tool: Option<&str>,
        vectors_of: Option<&str>,
    ) -> Result<Vec<LearnedRow>, StoreError> {
        let rows = self
            .query(
                "SELECT id, at_ms, session, source, message, model,
                        CASE WHEN $2::text IS NOT NULL AND model = $2::text THEN vector END, n_merged
                 FROM learned_entries
                 WHERE $1::text IS NULL OR id IN (SELECT entry_id FROM learned_tools WHERE tool = $1::text)
                 ORDER BY id",
                &[&tool, &vectors_of],
            )
            .await?;
        let rows = rows
            .iter()
            .map(|r| {
                let vector: Option<Vec<u8>> = r.try_get(6)?;
                Ok(LearnedRow {
                    id: r.try_get(0)?,
                    at_ms: r.try_get(1)?,
                    session: r.try_get(2)?,
                    source: r.try_get(3)?,
                    message: r.try_get(4)?,
                    tools: Vec::new(),
                    model: r.try_get(5)?,
                    vector: vector.as_deref().and_then(vector_from_bytes),
                    n_merged: r.try_get(7)?,
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))?;
        let links = self
            .query(
                "SELECT entry_id, tool FROM learned_tools
                 WHERE $1::text IS NULL OR entry_id IN (SELECT entry_id FROM learned_tools WHERE tool = $1::text)
                 ORDER BY entry_id, tool",
                &[&tool],
            )
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<Vec<(i64, String)>, tokio_postgres::Error>>()
            .map_err(|e| self.error(e))?;
        Ok(with_tools(rows, links))
    }

    pub async fn learned_forget(&self, tool: Option<&str>) -> Result<usize, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        let forget = async {
            tx.execute(
                "UPDATE learned_version SET version = version + 1 WHERE id = 1",
                &[],
            )
            .await?;
            let n = match tool {
                Some(tool) => {
                    let n = tx
                        .execute("DELETE FROM learned_tools WHERE tool = $1", &[&tool])
                        .await?;
                    tx.execute(
                        "DELETE FROM learned_entries e WHERE NOT EXISTS
                         (SELECT 1 FROM learned_tools t WHERE t.entry_id = e.id)",
                        &[],
                    )
                    .await?;
                    tx.execute("DELETE FROM learned_session_days WHERE tool = $1", &[&tool])
                        .await?;
                    n
                }
                None => {
                    let n = tx.execute("DELETE FROM learned_tools", &[]).await?;
                    tx.execute("DELETE FROM learned_entries", &[]).await?;
                    tx.execute("DELETE FROM learned_session_days", &[]).await?;
                    n
                }
            };
            Ok::<u64, tokio_postgres::Error>(n)
        };
        let n = forget.await.map_err(|e| self.error(e))?;
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    pub async fn learned_set_vectors(
        &self,
        model: &str,
        vectors: Vec<(i64, Vec<f32>)>,
    ) -> Result<usize, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        let set = async {
            let mut n = 0;
            for (id, vector) in &vectors {
                n += tx
                    .execute(
                        "UPDATE learned_entries SET model = $2, vector = $3
                         WHERE id = $1 AND vector IS NULL",
                        &[id, &model, &vector_bytes(vector)],
                    )
                    .await?;
            }
            if n > 0 {
                tx.execute(
                    "UPDATE learned_version SET version = version + 1 WHERE id = 1",
                    &[],
                )
                .await?;
            }
            Ok::<u64, tokio_postgres::Error>(n)
        };
        let n = set.await.map_err(|e| self.error(e))?;
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    pub async fn learned_version(&self) -> Result<i64, StoreError> {
        match self
            .query_opt("SELECT version FROM learned_version WHERE id = 1", &[])
            .await?
        {
            Some(row) => row.try_get(0).map_err(|e| self.error(e)),
            None => Ok(0),
        }
    }
}

/// The learned write's statements on PostgreSQL, in one transaction.
struct Statements<'a> {
    tx: &'a deadpool_postgres::Transaction<'a>,
}

impl LearnedStatements for Statements<'_> {
    type Error = tokio_postgres::Error;

    async fn bump_version(&mut self) -> Result<(), Self::Error> {
        self.tx
            .execute(
                "UPDATE learned_version SET version = version + 1 WHERE id = 1",
                &[],
            )
            .await
            .map(drop)
    }

    async fn forget_days_before(&mut self, oldest_kept: i64) -> Result<(), Self::Error> {
        self.tx
            .execute(
                "DELETE FROM learned_session_days WHERE day < $1",
                &[&oldest_kept],
            )
            .await
            .map(drop)
    }

    async fn first_today(
        &mut self,
        session: &str,
        tool: &str,
        day: i64,
    ) -> Result<bool, Self::Error> {
        let n = self
            .tx
            .execute(
                "INSERT INTO learned_session_days(session, tool, day) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
                &[&session, &tool, &day],
            )
            .await?;
        Ok(n == 1)
    }

    async fn entries_of(
        &mut self,
        tool: &str,
    ) -> Result<Vec<(Candidate, Vec<String>)>, Self::Error> {
        let rows = self
            .tx
            .query(
                "SELECT e.id, e.normalized, e.model, e.vector,
                        (SELECT array_agg(u.tool) FROM learned_tools u WHERE u.entry_id = e.id)
                 FROM learned_entries e JOIN learned_tools t ON t.entry_id = e.id
                 WHERE t.tool = $1",
                &[&tool],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let vector: Option<Vec<u8>> = row.try_get(3)?;
                let names: Option<Vec<String>> = row.try_get(4)?;
                Ok((
                    Candidate {
                        id: row.try_get(0)?,
                        normalized: row.try_get(1)?,
                        model: row.try_get(2)?,
                        vector: vector.as_deref().and_then(vector_from_bytes),
                    },
                    names.unwrap_or_default(),
                ))
            })
            .collect()
    }

    async fn merge(
        &mut self,
        id: i64,
        write: &LearnedWrite,
        vector: Option<&[u8]>,
    ) -> Result<(), Self::Error> {
        self.tx
            .execute(
                "UPDATE learned_entries SET at_ms = GREATEST(at_ms, $2), n_merged = n_merged + 1,
                     model = CASE WHEN vector IS NULL THEN $3 ELSE model END,
                     vector = COALESCE(vector, $4)
                 WHERE id = $1",
                &[&id, &write.at_ms, &write.model, &vector],
            )
            .await
            .map(drop)
    }

    async fn add_entry(
        &mut self,
        write: &LearnedWrite,
        normalized: &str,
        vector: Option<&[u8]>,
    ) -> Result<i64, Self::Error> {
        // PostgreSQL's text holds no NUL; the normalized words never had one.
        let (message, source) = (without_nul(&write.message), without_nul(&write.source));
        self.tx
            .query_one(
                "INSERT INTO learned_entries(at_ms, session, source, message, normalized, model, vector)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
                &[
                    &write.at_ms,
                    &write.session,
                    &source.as_ref(),
                    &message.as_ref(),
                    &normalized,
                    &write.model,
                    &vector,
                ],
            )
            .await?
            .try_get(0)
    }

    async fn link(&mut self, id: i64, tool: &str, per_tool: i64) -> Result<(), Self::Error> {
        self.tx
            .execute(
                "INSERT INTO learned_tools(entry_id, tool) VALUES ($1, $2)",
                &[&id, &tool],
            )
            .await?;
        let dropped = self
            .tx
            .query(
                "DELETE FROM learned_tools WHERE tool = $1 AND entry_id IN
                 (SELECT t.entry_id FROM learned_tools t JOIN learned_entries e ON e.id = t.entry_id
                  WHERE t.tool = $1 ORDER BY e.at_ms DESC, e.id DESC OFFSET $2)
                 RETURNING entry_id",
                &[&tool, &per_tool],
            )
            .await?;
        for row in &dropped {
            let entry: i64 = row.try_get(0)?;
            self.tx
                .execute(
                    "DELETE FROM learned_entries e WHERE e.id = $1 AND NOT EXISTS
                     (SELECT 1 FROM learned_tools t WHERE t.entry_id = $1)",
                    &[&entry],
                )
                .await?;
        }
        Ok(())
    }
}

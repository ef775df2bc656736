//! The learned memory on SQLite, written and read on the log writer's connection:
//! learning and index builds run in the background, and a build's read of every
//! vector never holds up the requests queued on the request connection.

use rusqlite::{OptionalExtension, Transaction, params};

use super::{Error, SqliteStore};
use crate::StoreError;
use crate::learned::{
    self, Candidate, LearnOutcome, LearnedRow, LearnedStatements, LearnedWrite, vector_bytes,
    vector_from_bytes, with_tools,
};

/// Separates the tool names `group_concat` joins (no tool name holds it).
const SEP: char = '\u{1f}';

impl SqliteStore {
    pub async fn learned_insert(
        &self,
        write: LearnedWrite,
        per_tool: usize,
    ) -> Result<LearnOutcome, StoreError> {
        let per_tool = i64::try_from(per_tool.max(1)).unwrap_or(i64::MAX);
        self.call_log(move |c| {
            let tx = c.transaction()?;
            let mut statements = Statements { tx: &tx };
            let written = learned::write(&mut statements, &write, per_tool);
            let outcome = learned::now_or_never(written)
                .ok_or_else(|| StoreError::Database("a learned write on SQLite waited".into()))??;
            tx.commit()?;
            Ok(outcome)
        })
        .await
    }

    pub async fn learned_rows(
        &self,
        tool: Option<&str>,
        vectors_of: Option<&str>,
    ) -> Result<Vec<LearnedRow>, StoreError> {
        let (tool, vectors_of) = (tool.map(str::to_owned), vectors_of.map(str::to_owned));
        self.call_log(move |c| {
            let filter = "(?1 IS NULL OR id IN (SELECT entry_id FROM learned_tools WHERE tool = ?1))";
            let mut stmt = c.prepare_cached(&format!(
                "SELECT id, at_ms, session, source, message, model,
                        CASE WHEN ?2 IS NOT NULL AND model = ?2 THEN vector END, n_merged
                 FROM learned_entries WHERE {filter} ORDER BY id"
            ))?;
            let rows = stmt
                .query_map(params![tool, vectors_of], |r| {
                    let vector: Option<Vec<u8>> = r.get(6)?;
                    Ok(LearnedRow {
                        id: r.get(0)?,
                        at_ms: r.get(1)?,
                        session: r.get(2)?,
                        source: r.get(3)?,
                        message: r.get(4)?,
                        tools: Vec::new(),
                        model: r.get(5)?,
                        vector: vector.as_deref().and_then(vector_from_bytes),
                        n_merged: r.get(7)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let mut stmt = c.prepare_cached(
                "SELECT entry_id, tool FROM learned_tools
                 WHERE ?1 IS NULL OR entry_id IN (SELECT entry_id FROM learned_tools WHERE tool = ?1)
                 ORDER BY entry_id, tool",
            )?;
            let links = stmt
                .query_map(params![tool], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<Vec<(i64, String)>, _>>()?;
            Ok(with_tools(rows, links))
        })
        .await
    }

    pub async fn learned_forget(&self, tool: Option<&str>) -> Result<usize, StoreError> {
        let tool = tool.map(str::to_owned);
        self.call_log(move |c| {
            let tx = c.transaction()?;
            let n = match &tool {
                Some(tool) => {
                    let n = tx.execute("DELETE FROM learned_tools WHERE tool = ?1", [tool])?;
                    tx.execute(
                        "DELETE FROM learned_entries WHERE NOT EXISTS
                         (SELECT 1 FROM learned_tools WHERE entry_id = learned_entries.id)",
                        [],
                    )?;
                    tx.execute("DELETE FROM learned_session_days WHERE tool = ?1", [tool])?;
                    n
                }
                None => {
                    let n = tx.execute("DELETE FROM learned_tools", [])?;
                    tx.execute("DELETE FROM learned_entries", [])?;
                    tx.execute("DELETE FROM learned_session_days", [])?;
                    n
                }
            };
            tx.execute(
                "UPDATE learned_version SET version = version + 1 WHERE id = 1",
                [],
            )?;
            tx.commit()?;
            Ok(n)
        })
        .await
    }

    pub async fn learned_set_vectors(
        &self,
        model: &str,
        vectors: Vec<(i64, Vec<f32>)>,
    ) -> Result<usize, StoreError> {
        let model = model.to_owned();
        self.call_log(move |c| {
            let tx = c.transaction()?;
            let mut n = 0;
            for (id, vector) in &vectors {
                n += tx
                    .prepare_cached(
                        "UPDATE learned_entries SET model = ?2, vector = ?3
                         WHERE id = ?1 AND vector IS NULL",
                    )?
                    .execute(params![id, model, vector_bytes(vector)])?;
            }
            if n > 0 {
                tx.execute(
                    "UPDATE learned_version SET version = version + 1 WHERE id = 1",
                    [],
                )?;
            }
            tx.commit()?;
            Ok(n)
        })
        .await
    }

    pub async fn learned_version(&self) -> Result<i64, StoreError> {
        self.call(|c| {
            Ok(
                c.prepare_cached("SELECT version FROM learned_version WHERE id = 1")?
                    .query_row([], |r| r.get(0))
                    .optional()?
                    .unwrap_or(0),
            )
        })
        .await
    }
}

/// The learned write's statements on SQLite, in the log connection's transaction.
struct Statements<'a> {
    tx: &'a Transaction<'a>,
}

impl LearnedStatements for Statements<'_> {
    type Error = Error;

    async fn bump_version(&mut self) -> Result<(), Error> {
        self.tx
            .prepare_cached("UPDATE learned_version SET version = version + 1 WHERE id = 1")?
            .execute([])?;
        Ok(())
    }

    async fn forget_days_before(&mut self, oldest_kept: i64) -> Result<(), Error> {
        self.tx
            .prepare_cached("DELETE FROM learned_session_days WHERE day < ?1")?
            .execute([oldest_kept])?;
        Ok(())
    }

    async fn first_today(&mut self, session: &str, tool: &str, day: i64) -> Result<bool, Error> {
        let n = self
            .tx
            .prepare_cached(
                "INSERT OR IGNORE INTO learned_session_days(session, tool, day) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![session, tool, day])?;
        Ok(n == 1)
    }

    async fn entries_of(&mut self, tool: &str) -> Result<Vec<(Candidate, Vec<String>)>, Error> {
        let mut stmt = self.tx.prepare_cached(
            "SELECT e.id, e.normalized, e.model, e.vector,
                    (SELECT group_concat(u.tool, char(31)) FROM learned_tools u WHERE u.entry_id = e.id)
             FROM learned_entries e JOIN learned_tools t ON t.entry_id = e.id
             WHERE t.tool = ?1",
        )?;
        let rows = stmt.query_map([tool], |r| {
            let vector: Option<Vec<u8>> = r.get(3)?;
            let joined: Option<String> = r.get(4)?;
            Ok((
                Candidate {
                    id: r.get(0)?,
                    normalized: r.get(1)?,
                    model: r.get(2)?,
                    vector: vector.as_deref().and_then(vector_from_bytes),
                },
                joined
                    .unwrap_or_default()
                    .split(SEP)
                    .map(str::to_owned)
                    .collect(),
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    async fn merge(
        &mut self,
        id: i64,
        write: &LearnedWrite,
        vector: Option<&[u8]>,
    ) -> Result<(), Error> {
        self.tx
            .prepare_cached(
                "UPDATE learned_entries SET at_ms = max(at_ms, ?2), n_merged = n_merged + 1,
                     model = CASE WHEN vector IS NULL THEN ?3 ELSE model END,
                     vector = COALESCE(vector, ?4)
                 WHERE id = ?1",
            )?
            .execute(params![id, write.at_ms, write.model, vector])?;
        Ok(())
    }

    async fn add_entry(
        &mut self,
        write: &LearnedWrite,
        normalized: &str,
        vector: Option<&[u8]>,
    ) -> Result<i64, Error> {
        Ok(self
            .tx
            .prepare_cached(
                "INSERT INTO learned_entries(at_ms, session, source, message, normalized, model, vector)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) RETURNING id",
            )?
            .query_row(
                params![
                    write.at_ms,
                    write.session,
                    write.source,
                    write.message,
                    normalized,
                    write.model,
                    vector
                ],
                |r| r.get(0),
            )?)
    }

    async fn link(&mut self, id: i64, tool: &str, per_tool: i64) -> Result<(), Error> {
        self.tx
            .prepare_cached("INSERT INTO learned_tools(entry_id, tool) VALUES (?1, ?2)")?
            .execute(params![id, tool])?;
        let dropped: Vec<i64> = self
            .tx
            .prepare_cached(
                "DELETE FROM learned_tools WHERE tool = ?1 AND entry_id IN
                 (SELECT t.entry_id FROM learned_tools t JOIN learned_entries e ON e.id = t.entry_id
                  WHERE t.tool = ?1 ORDER BY e.at_ms DESC, e.id DESC LIMIT -1 OFFSET ?2)
                 RETURNING entry_id",
            )?
            .query_map(params![tool, per_tool], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        for entry in dropped {
            self.tx
                .prepare_cached(
                    "DELETE FROM learned_entries WHERE id = ?1 AND NOT EXISTS
                     (SELECT 1 FROM learned_tools WHERE entry_id = ?1)",
                )?
                .execute([entry])?;
        }
        Ok(())
    }
}

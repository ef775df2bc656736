//! The learned memory on SQLite, written and read on the log writer's connection:
//! learning and index builds run in the background, and a build's read of every
//! vector never holds up the requests queued on the request connection.

use rusqlite::{OptionalExtension, Transaction, params};

use super::{Error, SqliteStore};
use crate::StoreError;
use crate::learned::{
    Candidate, DAY_MS, LearnOutcome, LearnedRow, LearnedWrite, near_duplicate, normalized_text,
    vector_bytes, vector_from_bytes, with_tools,
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
            let outcome = insert(&tx, &write, per_tool)?;
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

/// The bounds of [`crate::Store::learned_insert`], in one transaction.
fn insert(
    tx: &Transaction<'_>,
    write: &LearnedWrite,
    per_tool: i64,
) -> Result<LearnOutcome, Error> {
    let day = write.at_ms.div_euclid(DAY_MS);
    tx.prepare_cached("DELETE FROM learned_session_days WHERE day < ?1")?
        .execute([day - 1])?;
    let mut tools = Vec::with_capacity(write.tools.len());
    for tool in &write.tools {
        let fresh = match &write.session {
            Some(session) => {
                tx.prepare_cached(
                    "INSERT OR IGNORE INTO learned_session_days(session, tool, day) VALUES (?1, ?2, ?3)",
                )?
                .execute(params![session, tool, day])?
                    == 1
            }
            None => true,
        };
        if fresh {
            tools.push(tool.clone());
        }
    }
    let Some(first) = tools.first() else {
        return Ok(LearnOutcome::Nothing);
    };
    let normalized = normalized_text(&write.message);
    let candidates = {
        let mut stmt = tx.prepare_cached(
            "SELECT e.id, e.normalized, e.model, e.vector,
                    (SELECT group_concat(u.tool, char(31)) FROM learned_tools u WHERE u.entry_id = e.id)
             FROM learned_entries e JOIN learned_tools t ON t.entry_id = e.id
             WHERE t.tool = ?1",
        )?;
        let rows = stmt.query_map([first], |r| {
            let vector: Option<Vec<u8>> = r.get(3)?;
            let joined: Option<String> = r.get(4)?;
            Ok((
                Candidate {
                    id: r.get(0)?,
                    normalized: r.get(1)?,
                    model: r.get(2)?,
                    vector: vector.as_deref().and_then(vector_from_bytes),
                },
                joined.unwrap_or_default(),
            ))
        })?;
        let mut same_tools = Vec::new();
        for row in rows {
            let (candidate, joined) = row?;
            let mut names: Vec<&str> = joined.split(SEP).collect();
            names.sort_unstable();
            if names.iter().copied().eq(tools.iter().map(String::as_str)) {
                same_tools.push(candidate);
            }
        }
        same_tools
    };
    let vector = write.vector.as_deref().map(vector_bytes);
    let outcome = if let Some(id) = near_duplicate(write, &normalized, &candidates) {
        tx.prepare_cached(
            "UPDATE learned_entries SET at_ms = max(at_ms, ?2), n_merged = n_merged + 1,
                 model = CASE WHEN vector IS NULL THEN ?3 ELSE model END,
                 vector = COALESCE(vector, ?4)
             WHERE id = ?1",
        )?
        .execute(params![id, write.at_ms, write.model, vector])?;
        LearnOutcome::Merged { id, tools }
    } else {
        let id: i64 = tx
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
            )?;
        for tool in &tools {
            tx.prepare_cached("INSERT INTO learned_tools(entry_id, tool) VALUES (?1, ?2)")?
                .execute(params![id, tool])?;
            // The tool's oldest links beyond the cap go; an entry left with no tool
            // goes with them.
            let dropped: Vec<i64> = tx
                .prepare_cached(
                    "DELETE FROM learned_tools WHERE tool = ?1 AND entry_id IN
                     (SELECT t.entry_id FROM learned_tools t JOIN learned_entries e ON e.id = t.entry_id
                      WHERE t.tool = ?1 ORDER BY e.at_ms DESC, e.id DESC LIMIT -1 OFFSET ?2)
                     RETURNING entry_id",
                )?
                .query_map(params![tool, per_tool], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            for entry in dropped {
                tx.prepare_cached(
                    "DELETE FROM learned_entries WHERE id = ?1 AND NOT EXISTS
                     (SELECT 1 FROM learned_tools WHERE entry_id = ?1)",
                )?
                .execute([entry])?;
            }
        }
        LearnOutcome::Added { id, tools }
    };
    tx.prepare_cached("UPDATE learned_version SET version = version + 1 WHERE id = 1")?
        .execute([])?;
    Ok(outcome)
}

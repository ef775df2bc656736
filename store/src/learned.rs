//! The learned memory's rows: past messages and the tools their turns called with
//! success, with where each was learned from. Both backends keep them in the same
//! three tables (`learned_entries`, `learned_tools`, `learned_session_days`) and apply
//! the same bounds when one is written (see [`crate::Store::learned_insert`]).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::StoreError;

/// A message to learn from, as the server hands it over.
#[derive(Debug, Clone, PartialEq)]
pub struct LearnedWrite {
    pub at_ms: i64,
    /// The session that taught it; `None` (examples, imports) is not held to the
    /// once-per-day rule.
    pub session: Option<String>,
    /// `chat`, `route`, `repair`, `mcp_search`, `example`, `import`.
    pub source: String,
    pub message: String,
    pub tools: Vec<String>,
    /// The encoder `vector` comes from.
    pub model: Option<String>,
    pub vector: Option<Vec<f32>>,
}

/// What [`crate::Store::learned_insert`] did with a write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum LearnOutcome {
    /// A new entry for these tools.
    Added { id: i64, tools: Vec<String> },
    /// A near-duplicate of entry `id` (same tools, same words or a cosine of at
    /// least [`MERGE_MIN_COSINE`]): its time and count moved instead.
    Merged { id: i64, tools: Vec<String> },
    /// The session already taught each of these tools today, or there was nothing
    /// to learn.
    Nothing,
}

/// One stored entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LearnedRow {
    pub id: i64,
    pub at_ms: i64,
    pub session: Option<String>,
    pub source: String,
    pub message: String,
    pub tools: Vec<String>,
    pub model: Option<String>,
    /// Only when asked for with the entry's model.
    #[serde(skip)]
    pub vector: Option<Vec<f32>>,
    /// How many writes this entry stands for (1 + near-duplicates merged into it).
    pub n_merged: i64,
}

/// What `loadout learned` prints per tool.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LearnedToolSummary {
    pub tool: String,
    pub entries: usize,
    /// Writes the entries stand for, near-duplicates included.
    pub uses: i64,
    /// Entries per source.
    pub sources: BTreeMap<String, usize>,
    pub newest_ms: i64,
    /// The newest entry's message.
    pub example: String,
}

/// Two entries with the same tools whose vectors (of one model) are at least this
/// similar are one entry.
pub const MERGE_MIN_COSINE: f32 = 0.95;

/// Longest message kept, in bytes (the router refuses longer ones anyway).
pub const MAX_LEARNED_MESSAGE_BYTES: usize = 32 * 1024;

/// Milliseconds of a day, for the once-per-day rule (UTC days).
pub(crate) const DAY_MS: i64 = 24 * 60 * 60 * 1000;

/// The words of a message, lowercased, one space apart: two messages that differ
/// only in case, spacing or punctuation are the same message.
pub fn normalized_text(message: &str) -> String {
    message
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A vector as stored: little-endian `f32`s.
pub(crate) fn vector_bytes(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A stored vector; `None` for bytes that are not whole `f32`s.
pub(crate) fn vector_from_bytes(bytes: &[u8]) -> Option<Vec<f32>> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() || a.is_empty() {
        return 0.0;
    }
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    if na <= 0.0 || nb <= 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}

/// A write checked and tidied before it reaches a backend: tools sorted and
/// deduplicated, the message trimmed, a vector of non-finite values dropped.
pub(crate) fn checked(mut write: LearnedWrite) -> Result<LearnedWrite, StoreError> {
    write.message = write.message.trim().to_owned();
    if write.message.is_empty() {
        return Err(StoreError::Invalid("a learned message is empty".into()));
    }
    if write.message.len() > MAX_LEARNED_MESSAGE_BYTES {
        return Err(StoreError::Invalid(format!(
            "a learned message is {} bytes; the limit is {MAX_LEARNED_MESSAGE_BYTES}",
            write.message.len()
        )));
    }
    if let Some(session) = &write.session {
        crate::validate_session_id(session)?;
    }
    write.tools.retain(|t| !t.trim().is_empty());
    write.tools.sort();
    write.tools.dedup();
    if write
        .vector
        .as_ref()
        .is_some_and(|v| v.is_empty() || v.iter().any(|x| !x.is_finite()))
        || write.model.is_none()
    {
        write.vector = None;
    }
    if write.vector.is_none() {
        write.model = None;
    }
    Ok(write)
}

/// A stored entry that may be `write`'s near-duplicate.
pub(crate) struct Candidate {
    pub id: i64,
    pub normalized: String,
    pub model: Option<String>,
    pub vector: Option<Vec<f32>>,
}

/// The near-duplicate `write` merges into among `candidates` (entries with exactly
/// its tools), if any.
pub(crate) fn near_duplicate(
    write: &LearnedWrite,
    normalized: &str,
    candidates: &[Candidate],
) -> Option<i64> {
    candidates
        .iter()
        .find(|c| {
            c.normalized == normalized
                || match (&write.model, &write.vector, &c.model, &c.vector) {
                    (Some(m), Some(v), Some(cm), Some(cv)) if m == cm => {
                        cosine(v, cv) >= MERGE_MIN_COSINE
                    }
                    _ => false,
                }
        })
        .map(|c| c.id)
}

/// The statements of one learned write, a method each: a backend holds their SQL and
/// nothing of the algorithm, which is [`write`] alone. (On SQLite every method is
/// ready at once; see [`now_or_never`].)
pub(crate) trait LearnedStatements {
    type Error;
    /// Moves the learned version, which tells every learner to rebuild its index.
    async fn bump_version(&mut self) -> Result<(), Self::Error>;
    /// Forgets which tools sessions taught on days before `oldest_kept`.
    async fn forget_days_before(&mut self, oldest_kept: i64) -> Result<(), Self::Error>;
    /// Notes that `session` taught `tool` on `day`; whether it had not before.
    async fn first_today(
        &mut self,
        session: &str,
        tool: &str,
        day: i64,
    ) -> Result<bool, Self::Error>;
    /// The entries linked to `tool`, each with the names of all its tools.
    async fn entries_of(
        &mut self,
        tool: &str,
    ) -> Result<Vec<(Candidate, Vec<String>)>, Self::Error>;
    /// Merges `write` into entry `id`: its time moves, its count grows, and it takes
    /// the vector if it had none.
    async fn merge(
        &mut self,
        id: i64,
        write: &LearnedWrite,
        vector: Option<&[u8]>,
    ) -> Result<(), Self::Error>;
    /// A new entry for `write`; its id.
    async fn add_entry(
        &mut self,
        write: &LearnedWrite,
        normalized: &str,
        vector: Option<&[u8]>,
    ) -> Result<i64, Self::Error>;
    /// Links `tool` to entry `id`, then drops the tool's oldest links beyond
    /// `per_tool` and any entry left with no tool.
    async fn link(&mut self, id: i64, tool: &str, per_tool: i64) -> Result<(), Self::Error>;
}

/// The bounds of [`crate::Store::learned_insert`], in the caller's transaction: once
/// per session, tool and day; a near-duplicate merged; at most `per_tool` entries a
/// tool. The version moves first: on PostgreSQL its row lock orders this write after
/// any other replica's, so that two replicas learning one message merge it.
pub(crate) async fn write<S: LearnedStatements>(
    statements: &mut S,
    write: &LearnedWrite,
    per_tool: i64,
) -> Result<LearnOutcome, S::Error> {
    statements.bump_version().await?;
    let day = write.at_ms.div_euclid(DAY_MS);
    statements.forget_days_before(day - 1).await?;
    let mut tools = Vec::with_capacity(write.tools.len());
    for tool in &write.tools {
        let fresh = match &write.session {
            Some(session) => statements.first_today(session, tool, day).await?,
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
    let candidates: Vec<Candidate> = statements
        .entries_of(first)
        .await?
        .into_iter()
        .filter_map(|(candidate, mut names)| {
            // Compared sorted by bytes: a server's collation may order names otherwise.
            names.sort_unstable();
            (names == tools).then_some(candidate)
        })
        .collect();
    let vector = write.vector.as_deref().map(vector_bytes);
    if let Some(id) = near_duplicate(write, &normalized, &candidates) {
        statements.merge(id, write, vector.as_deref()).await?;
        return Ok(LearnOutcome::Merged { id, tools });
    }
    let id = statements
        .add_entry(write, &normalized, vector.as_deref())
        .await?;
    for tool in &tools {
        statements.link(id, tool, per_tool).await?;
    }
    Ok(LearnOutcome::Added { id, tools })
}

/// The output of a future whose every `.await` is ready at once, as [`write`] is over
/// SQLite's synchronous statements; `None` if it was not.
pub(crate) fn now_or_never<F: std::future::Future>(future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => None,
    }
}

/// Per tool: its entries' count, sources, newest time and newest message; sorted by
/// tool name.
pub fn summarize(rows: &[LearnedRow]) -> Vec<LearnedToolSummary> {
    let mut by_tool: BTreeMap<&str, LearnedToolSummary> = BTreeMap::new();
    for row in rows {
        for tool in &row.tools {
            let summary = by_tool
                .entry(tool.as_str())
                .or_insert_with(|| LearnedToolSummary {
                    tool: tool.clone(),
                    entries: 0,
                    uses: 0,
                    sources: BTreeMap::new(),
                    newest_ms: i64::MIN,
                    example: String::new(),
                });
            summary.entries += 1;
            summary.uses += row.n_merged;
            *summary.sources.entry(row.source.clone()).or_default() += 1;
            if row.at_ms >= summary.newest_ms {
                summary.newest_ms = row.at_ms;
                summary.example = row.message.clone();
            }
        }
    }
    by_tool.into_values().collect()
}

/// Joins entries with their `(entry_id, tool)` links (both sorted by entry id); an
/// entry with no link left is dropped.
pub(crate) fn with_tools(mut rows: Vec<LearnedRow>, links: Vec<(i64, String)>) -> Vec<LearnedRow> {
    let mut by_entry: std::collections::HashMap<i64, Vec<String>> =
        std::collections::HashMap::new();
    for (id, tool) in links {
        by_entry.entry(id).or_default().push(tool);
    }
    rows.retain_mut(|row| match by_entry.remove(&row.id) {
        Some(mut tools) => {
            tools.sort();
            row.tools = tools;
            true
        }
        None => false,
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized_text_ignores_case_spacing_and_punctuation() {
        assert_eq!(
            normalized_text("  What's the WEATHER in Paris?! "),
            "what s the weather in paris"
        );
    }

    #[test]
    fn vectors_roundtrip_through_bytes() {
        let v = vec![0.5, -1.25, 3.0];
        assert_eq!(vector_from_bytes(&vector_bytes(&v)), Some(v));
        assert_eq!(vector_from_bytes(&[1, 2, 3]), None);
    }
}

//! The `memory` domain's engine: long-term notes, found again by ranked full-text
//! search.

use serde::Serialize;

use crate::{BoxFuture, ToolError};

/// Most words of a recall query that are searched.
pub const MAX_QUERY_TERMS: usize = 32;

/// A stored memory.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Memory {
    pub id: i64,
    pub content: String,
    pub tags: Vec<String>,
    /// UTC, RFC 3339.
    pub created: String,
    pub updated: String,
}

/// A memory found by `recall`, with its relevance (higher is better).
#[derive(Debug, Clone, Serialize)]
pub struct RecalledMemory {
    #[serde(flatten)]
    pub memory: Memory,
    /// From the engine, the raw rank (BM25, `ts_rank`); from `recall`, relevance from
    /// 0 to 1 relative to the query's best match.
    pub score: f64,
}

#[derive(Debug, Serialize)]
pub struct Remembered {
    #[serde(flatten)]
    pub memory: Memory,
    /// The same text was already stored; nothing new was written.
    pub duplicate: bool,
}

#[derive(Debug, Serialize)]
pub struct Forgotten {
    pub id: i64,
    /// The text that was deleted.
    pub content: String,
}

#[derive(Debug, Serialize)]
pub struct MemoryPage {
    pub memories: Vec<Memory>,
    /// All memories matching the filter.
    pub total: i64,
    pub offset: u32,
}

/// Where memories are kept: one implementation per storage backend. Arguments come
/// checked and normalized by the domain's tools.
pub trait MemoryEngine: Send + Sync {
    fn remember(
        &self,
        content: String,
        tags: Vec<String>,
    ) -> BoxFuture<'_, Result<Remembered, ToolError>>;
    /// `query` has at least one word ([`query_terms`]).
    fn recall<'a>(
        &'a self,
        query: &'a str,
        tag: Option<String>,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<RecalledMemory>, ToolError>>;
    fn update(
        &self,
        id: i64,
        content: Option<String>,
        tags: Option<Vec<String>>,
    ) -> BoxFuture<'_, Result<Memory, ToolError>>;
    fn forget(&self, id: i64) -> BoxFuture<'_, Result<Forgotten, ToolError>>;
    fn list(
        &self,
        tag: Option<String>,
        limit: u32,
        offset: u32,
    ) -> BoxFuture<'_, Result<MemoryPage, ToolError>>;
}

/// The words of a recall query: runs of letters and digits, lowercased, without
/// duplicates, at most [`MAX_QUERY_TERMS`]. Nothing else the user wrote survives, so
/// no search syntax of any engine can be injected.
pub fn query_terms(query: &str) -> Vec<String> {
    let mut terms: Vec<String> = Vec::new();
    for word in query.split(|c: char| !c.is_alphanumeric()) {
        if word.is_empty() {
            continue;
        }
        let term = word.to_lowercase();
        if !terms.contains(&term) {
            terms.push(term);
        }
        if terms.len() == MAX_QUERY_TERMS {
            break;
        }
    }
    terms
}

/// The message of an id that names no memory.
pub fn not_found(id: i64) -> ToolError {
    ToolError::execution(format!(
        "no memory with id {id}; use recall or list_memories to find ids"
    ))
}

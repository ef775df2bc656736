//! The `memory` domain: long-term notes the model keeps for the user across
//! sessions, found again by ranked full-text search.
//!
//! Tools are engine-neutral: each asks [`engine`] for the [`MemoryEngine`] of the
//! storage it runs on (the store implements it on SQLite with FTS5 and `bm25()`, on
//! PostgreSQL with a `tsvector` column, a GIN index and `ts_rank`), with the same
//! behaviour and the same tests. Arguments are checked here, once, before any engine
//! sees them. Depends on `loadout` only, never on a storage driver or another domain
//! crate.

pub use loadout::engine::memory::{
    Forgotten, MAX_QUERY_TERMS, Memory, MemoryEngine, MemoryPage, RecalledMemory, Remembered,
    query_terms,
};
use loadout::{ToolContext, ToolError};
use schemars::JsonSchema;
use serde::Deserialize;

loadout::domain! {
    name: "memory",
    description: "Long-term memory across conversations: remember facts, preferences and notes about the user, recall them by meaning-bearing words, update or forget them.",
    keywords: [
        "memory", "remember", "recall", "note", "notes", "forget", "preference",
        "fact", "remind", "기억", "메모", "잊어",
    ],
}

/// Referenced by the `loadout-domains` hub so the linker keeps this crate.
pub fn link() {}

/// Longest memory text, in characters.
pub const MAX_CONTENT_CHARS: usize = 10_000;
/// Most tags per memory, and longest tag in characters.
pub const MAX_TAGS: usize = 20;
pub const MAX_TAG_CHARS: usize = 50;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RememberArgs {
    /// What to remember, as a self-contained sentence, e.g. "Mina prefers window seats on flights".
    pub content: String,
    /// Optional labels for grouping and filtering, e.g. `["travel", "preferences"]`.
    #[serde(default)]
    pub tags: Vec<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecallArgs {
    /// Words to look for, e.g. "flight seat preference". Any word may match; memories
    /// matching more and rarer words rank first.
    pub query: String,
    /// Only memories with this tag.
    #[serde(default)]
    pub tag: Option<String>,
    /// Most memories to return: default 10, at most 100.
    #[serde(default)]
    pub limit: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateMemoryArgs {
    /// The memory's id (from `recall` or `list_memories`).
    pub id: i64,
    /// New text; unchanged when omitted.
    #[serde(default)]
    pub content: Option<String>,
    /// New tags, replacing the old ones; unchanged when omitted.
    #[serde(default)]
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForgetArgs {
    /// The memory's id (from `recall` or `list_memories`).
    pub id: i64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListMemoriesArgs {
    /// Only memories with this tag.
    #[serde(default)]
    pub tag: Option<String>,
    /// Most memories to return: default 20, at most 200.
    #[serde(default)]
    pub limit: Option<u32>,
    /// Memories to skip, for paging.
    #[serde(default)]
    pub offset: Option<u32>,
}

/// The engine of the storage `ctx` runs on.
pub fn engine(ctx: &ToolContext) -> Result<&dyn MemoryEngine, ToolError> {
    ctx.storage()
        .memory_engine()
        .ok_or_else(|| ToolError::execution("memory is not supported on this storage backend yet"))
}

/// Stores a fact, preference or note about the user in long-term memory, kept across conversations.
///
/// Write one self-contained sentence per memory; storing the same text twice returns
/// the existing memory.
#[loadout::tool(
    domain = "memory",
    keywords = ["remember", "save", "note", "keep in mind", "기억해", "메모"],
    read_only = false,
    destructive = false,
    idempotent = true,
    open_world = false
)]
pub async fn remember(args: RememberArgs, ctx: &ToolContext) -> Result<Remembered, ToolError> {
    let content = check_content(&args.content)?;
    let tags = normalize_tags(&args.tags)?;
    engine(ctx)?.remember(content, tags).await
}

/// Searches long-term memory by words and returns the best-matching memories, most relevant first.
///
/// Use it before answering questions about the user's preferences, plans or earlier
/// conversations. The query is plain words; search syntax is treated as text.
#[loadout::tool(
    domain = "memory",
    keywords = ["recall", "search memory", "what do you know", "remember when", "기억나"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub async fn recall(args: RecallArgs, ctx: &ToolContext) -> Result<Vec<RecalledMemory>, ToolError> {
    if query_terms(&args.query).is_empty() {
        return Err(ToolError::execution(
            "the query has no searchable words; give a few words such as \"birthday gift\"",
        ));
    }
    let limit = bounded_limit(args.limit, 10, 100)?;
    let tag = args.tag.as_deref().map(normalize_tag).transpose()?;
    let mut found = engine(ctx)?.recall(&args.query, tag, limit).await?;
    relative_scores(&mut found);
    Ok(found)
}

/// Replaces the engines' raw ranks with relevance from 0 to 1 relative to the best
/// match (1), rounded to 3 decimals. Raw ranks mean nothing to a reader: SQLite's
/// BM25 of a word that most memories contain is clamped to about 1e-6, and
/// PostgreSQL's `ts_rank` is on another scale altogether.
pub fn relative_scores(found: &mut [RecalledMemory]) {
    let best = found.iter().map(|m| m.score).fold(0.0_f64, f64::max);
    for memory in found {
        let relative = if best > 0.0 && memory.score.is_finite() {
            (memory.score / best).clamp(0.0, 1.0)
        } else {
            // No positive rank to compare with: the engine ranked them alike.
            1.0
        };
        memory.score = (relative * 1000.0).round() / 1000.0;
    }
}

/// Changes the text or tags of a stored memory, by id.
#[loadout::tool(
    domain = "memory",
    keywords = ["update memory", "correct", "change", "edit note", "수정"],
    read_only = false,
    destructive = false,
    idempotent = true,
    open_world = false
)]
pub async fn update_memory(args: UpdateMemoryArgs, ctx: &ToolContext) -> Result<Memory, ToolError> {
    if args.content.is_none() && args.tags.is_none() {
        return Err(ToolError::execution(
            "nothing to change: give `content`, `tags` or both",
        ));
    }
    let content = args.content.as_deref().map(check_content).transpose()?;
    let tags = args.tags.as_deref().map(normalize_tags).transpose()?;
    engine(ctx)?.update(args.id, content, tags).await
}

/// Deletes a memory for good, by id.
#[loadout::tool(
    domain = "memory",
    keywords = ["forget", "delete memory", "remove note", "잊어", "삭제"],
    read_only = false,
    destructive = true,
    idempotent = false,
    open_world = false
)]
pub async fn forget(args: ForgetArgs, ctx: &ToolContext) -> Result<Forgotten, ToolError> {
    engine(ctx)?.forget(args.id).await
}

/// Lists stored memories, newest first, optionally only those with a tag.
#[loadout::tool(
    domain = "memory",
    keywords = ["list memories", "all notes", "what do you remember", "기억 목록"],
    read_only = true,
    idempotent = true,
    open_world = false
)]
pub async fn list_memories(
    args: ListMemoriesArgs,
    ctx: &ToolContext,
) -> Result<MemoryPage, ToolError> {
    let limit = bounded_limit(args.limit, 20, 200)?;
    let offset = args.offset.unwrap_or(0);
    let tag = args.tag.as_deref().map(normalize_tag).transpose()?;
    engine(ctx)?.list(tag, limit, offset).await
}

fn check_content(content: &str) -> Result<String, ToolError> {
    let content = content.trim();
    if content.is_empty() {
        return Err(ToolError::execution("`content` is empty"));
    }
    let n_chars = content.chars().count();
    if n_chars > MAX_CONTENT_CHARS {
        return Err(ToolError::execution(format!(
            "`content` has {n_chars} characters; at most {MAX_CONTENT_CHARS}"
        )));
    }
    // Line breaks and tabs are text; NUL and other control characters are not, and
    // would reach whoever reads the memory back (a terminal, a prompt).
    if let Some(c) = content
        .chars()
        .find(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    {
        return Err(ToolError::execution(format!(
            "`content` contains the control character U+{:04X}; send text",
            u32::from(c)
        )));
    }
    Ok(content.to_owned())
}

/// Bidirectional embeddings, overrides and isolates: they make a text read in
/// another order than it is stored.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

fn normalize_tag(tag: &str) -> Result<String, ToolError> {
    let tag = tag.trim().to_lowercase();
    if tag.is_empty() {
        return Err(ToolError::execution("tags must not be empty"));
    }
    if let Some(c) = tag.chars().find(|c| c.is_control() || is_bidi_control(*c)) {
        return Err(ToolError::execution(format!(
            "a tag contains the control character U+{:04X}; tags are words on one line",
            u32::from(c)
        )));
    }
    if tag.chars().count() > MAX_TAG_CHARS {
        return Err(ToolError::execution(format!(
            "tag `{}…` is longer than {MAX_TAG_CHARS} characters",
            tag.chars().take(MAX_TAG_CHARS).collect::<String>()
        )));
    }
    Ok(tag)
}

/// Trimmed, lowercased, without duplicates, in the order given.
fn normalize_tags(tags: &[String]) -> Result<Vec<String>, ToolError> {
    if tags.len() > MAX_TAGS {
        return Err(ToolError::execution(format!(
            "{} tags given; at most {MAX_TAGS}",
            tags.len()
        )));
    }
    let mut normalized: Vec<String> = Vec::with_capacity(tags.len());
    for tag in tags {
        let tag = normalize_tag(tag)?;
        if !normalized.contains(&tag) {
            normalized.push(tag);
        }
    }
    Ok(normalized)
}

fn bounded_limit(limit: Option<u32>, default: u32, max: u32) -> Result<u32, ToolError> {
    match limit {
        None => Ok(default),
        Some(0) => Err(ToolError::execution("`limit` must be at least 1")),
        Some(n) => Ok(n.min(max)),
    }
}

#[cfg(test)]
mod tests;

//! Clients told apart by their own bearer token (issue 40): each row names a client,
//! the SHA-256 of its token (the token itself is shown once and never stored), and
//! what it may see and call.

use serde::Serialize;

/// One client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClientRow {
    pub name: String,
    /// Hex SHA-256 of the token.
    #[serde(skip)]
    pub token_sha256: String,
    /// The domains it sees (besides core); empty: every domain.
    pub domains: Vec<String>,
    /// The tools it sees, besides those of `domains`; empty with `domains` empty:
    /// every tool.
    pub tools: Vec<String>,
    /// Most requests a minute; `None`: no limit of its own.
    pub rate_per_min: Option<u32>,
    /// Only tools marked read-only.
    pub read_only: bool,
    pub created_ms: i64,
}

/// A list column as stored (a JSON array of strings).
pub(crate) fn list_to_text(list: &[String]) -> String {
    serde_json::to_string(list).unwrap_or_else(|_| "[]".to_owned())
}

/// A list column read back; a value no version wrote reads as empty.
pub(crate) fn list_from_text(text: &str) -> Vec<String> {
    serde_json::from_str(text).unwrap_or_default()
}

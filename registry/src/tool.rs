//! What a tool is, wherever it was declared.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{ToolContext, ToolError};

/// The future a type-erased tool call returns.
pub type CallFuture = Pin<Box<dyn Future<Output = Result<serde_json::Value, ToolError>> + Send>>;

/// A type-erased tool body: validated arguments in, JSON value or error out.
pub type CallFn = fn(ToolContext, serde_json::Value) -> CallFuture;

/// Product tier a tool or domain belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    #[default]
    Free,
    Pro,
}

/// MCP tool annotations; `None` means "not stated".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Annotations {
    #[serde(rename = "readOnlyHint", skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(rename = "destructiveHint", skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    #[serde(rename = "idempotentHint", skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    #[serde(rename = "openWorldHint", skip_serializing_if = "Option::is_none")]
    pub open_world: Option<bool>,
}

impl Annotations {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The link-time record `#[tool]` submits. Const data and fn pointers only, because
/// inventory keeps it in a `static`; the schema is built on first use.
#[derive(Debug)]
pub struct ToolEntry {
    pub name: &'static str,
    pub domain: &'static str,
    pub keywords: &'static [&'static str],
    pub examples: &'static [&'static str],
    pub conflicts: &'static [&'static str],
    pub description: &'static str,
    pub title: Option<&'static str>,
    pub tier: Option<Tier>,
    pub annotations: Annotations,
    /// A call starts state the rest of the session works on (a scratchpad table):
    /// the tool's domain stays loaded for the session.
    pub pins_domain: bool,
    pub input_schema: fn() -> serde_json::Value,
    pub call: CallFn,
    /// Where the tool was written, for error messages naming both duplicates.
    pub file: &'static str,
    pub line: u32,
}

inventory::collect!(ToolEntry);

/// How a call to a tool is carried out.
#[derive(Clone)]
pub enum Backend {
    /// A Rust function registered with `#[tool]`.
    Native(CallFn),
    /// Declared in a toolkit file with nothing behind it: it routes, but a call
    /// answers "no backend".
    None,
    /// Carried out by something outside this crate (an upstream MCP server); the
    /// servers install the handler.
    External(Arc<dyn ExternalCall>),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Native(_) => "Native",
            Backend::None => "None",
            Backend::External(_) => "External",
        })
    }
}

/// A tool backend supplied at run time (e.g. a forwarded MCP call).
pub trait ExternalCall: Send + Sync {
    /// The result as a plain value (text, or JSON), what a model reads in chat.
    fn call(&self, tool: &str, args: serde_json::Value) -> CallFuture;
    /// The result in the backend's own protocol, unflattened (for an upstream MCP
    /// server, its `CallToolResult` as JSON, images and links included), for a server
    /// that speaks the same protocol to pass on. `None`: the backend has no such form.
    fn call_raw(&self, _tool: &str, _args: serde_json::Value) -> Option<CallFuture> {
        None
    }
}

/// A tool as the registry and router see it, whether it came from `#[tool]` or from a
/// toolkit file.
#[derive(Debug, Clone)]
pub struct Tool {
    pub name: String,
    pub domain: String,
    pub title: Option<String>,
    /// The full description sent to models.
    pub description: String,
    /// First sentence of the description: the short hint for tools not sent.
    pub hint: String,
    pub keywords: Vec<String>,
    pub examples: Vec<String>,
    pub conflicts: Vec<String>,
    pub tier: Tier,
    pub annotations: Annotations,
    /// A call pins the tool's domain for the rest of the session.
    pub pins_domain: bool,
    pub input_schema: Arc<serde_json::Value>,
    pub backend: Backend,
    /// `file:line` of a macro tool, or the toolkit file path.
    pub origin: String,
}

impl Tool {
    pub fn from_entry(entry: &ToolEntry, domain_tier: Tier) -> Tool {
        let description = entry.description.trim().to_owned();
        Tool {
            name: entry.name.to_owned(),
            domain: entry.domain.to_owned(),
            title: entry.title.map(str::to_owned),
            hint: first_sentence(&description),
            description,
            keywords: entry.keywords.iter().map(|k| k.to_string()).collect(),
            examples: entry.examples.iter().map(|k| k.to_string()).collect(),
            conflicts: entry.conflicts.iter().map(|k| k.to_string()).collect(),
            tier: entry.tier.unwrap_or(domain_tier),
            annotations: entry.annotations,
            pins_domain: entry.pins_domain,
            input_schema: Arc::new((entry.input_schema)()),
            backend: Backend::Native(entry.call),
            origin: format!("{}:{}", entry.file, entry.line),
        }
    }
}

/// The first sentence of a description: up to the first `.`, `!` or `?` that ends a
/// word and is followed by whitespace or the end, or the first line.
pub fn first_sentence(text: &str) -> String {
    let text = text.trim();
    let first_para = text.split("\n\n").next().unwrap_or(text);
    let bytes = first_para.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if matches!(b, b'.' | b'!' | b'?') {
            let next = bytes.get(i + 1);
            // "e.g." and "1.5" are not sentence ends: require whitespace after.
            if next.is_none_or(|c| c.is_ascii_whitespace()) {
                let candidate = &first_para[..=i];
                if !candidate.ends_with("e.g.") && !candidate.ends_with("i.e.") {
                    return candidate.split_whitespace().collect::<Vec<_>>().join(" ");
                }
            }
        }
    }
    first_para.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::first_sentence;

    #[test]
    fn first_sentence_stops_at_the_first_sentence_end() {
        assert_eq!(first_sentence("Adds numbers. Then more."), "Adds numbers.");
        assert_eq!(
            first_sentence("Use e.g. 1.5 units. More."),
            "Use e.g. 1.5 units."
        );
        assert_eq!(
            first_sentence("No end mark\nsecond line"),
            "No end mark second line"
        );
        assert_eq!(first_sentence("Para one\n\nPara two."), "Para one");
    }
}

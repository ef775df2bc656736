//! Errors at the crate's boundary: building a registry, and calling a tool.

use serde::Serialize;

/// Why a registry could not be built. Each message names the definitions involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    #[error("duplicate tool name `{name}`: defined at {first} and at {second}")]
    DuplicateTool {
        name: String,
        first: String,
        second: String,
    },
    #[error("duplicate domain `{name}`: declared at {first} and at {second}")]
    DuplicateDomain {
        name: String,
        first: String,
        second: String,
    },
    #[error(
        "tool `{tool}` ({origin}) names domain `{domain}`, which is not declared; declare it with `loadout::domain!` or in a toolkit file"
    )]
    UndeclaredDomain {
        tool: String,
        domain: String,
        origin: String,
    },
    #[error("invalid {what} name `{name}` ({origin}): {reason}")]
    InvalidName {
        what: &'static str,
        name: String,
        origin: String,
        reason: &'static str,
    },
    #[error("toolkit {path}: {message}")]
    Toolkit { path: String, message: String },
    #[error("tool `{tool}` ({origin}): input schema is not a valid JSON schema: {message}")]
    InvalidSchema {
        tool: String,
        origin: String,
        message: String,
    },
}

/// Why a tool call failed. The tool body runs only if arguments validated and the
/// domain is configured.
#[derive(Debug, Clone, thiserror::Error, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolError {
    #[error("unknown tool `{name}`")]
    UnknownTool { name: String },
    #[error("invalid arguments{}: {message}", field.as_ref().map(|f| format!(" at `{f}`")).unwrap_or_default())]
    InvalidArgs {
        /// JSON pointer-like path of the offending field, when known.
        field: Option<String>,
        message: String,
    },
    #[error(
        "not configured: set {} (domain `{domain}`); {}",
        missing.join(", "),
        how_to_set(missing)
    )]
    NotConfigured {
        domain: String,
        missing: Vec<String>,
    },
    #[error("tool `{name}` has no backend: it was declared in a toolkit file and only routes")]
    NoBackend { name: String },
    #[error("{0}")]
    Execution(String),
    #[error("tool `{name}` panicked: {message}")]
    Panicked { name: String, message: String },
    /// The call outlived its wall clock and was stopped.
    #[error("tool `{name}` ran longer than {seconds} s and was stopped")]
    Timeout { name: String, seconds: u64 },
    /// The store failed; the message says whether it is down (retry) or damaged.
    #[error("storage: {0}")]
    Storage(String),
}

impl ToolError {
    /// The JSON-RPC error code a server should answer with, where the failure is a
    /// protocol error rather than a tool result: only a tool that does not exist.
    /// Invalid arguments are a tool result with `isError` since MCP 2025-11-25
    /// (SEP-1303), so that the model reads the message and retries.
    pub fn json_rpc_code(&self) -> Option<i32> {
        match self {
            ToolError::UnknownTool { .. } => Some(-32602),
            _ => None,
        }
    }

    pub fn execution(message: impl std::fmt::Display) -> ToolError {
        ToolError::Execution(message.to_string())
    }
}

/// Who can set the missing keys: the model for credentials and names, the user for
/// keys that widen what tools reach ([`crate::Trust::Operator`]).
fn how_to_set(missing: &[String]) -> String {
    let operator: Vec<&str> = missing
        .iter()
        .map(String::as_str)
        .filter(|key| crate::trust_of(key) == crate::Trust::Operator)
        .collect();
    if operator.is_empty() {
        return "the `set_setting` tool or `loadout settings set` does it".into();
    }
    let others = if operator.len() < missing.len() {
        "; the `set_setting` tool sets the others"
    } else {
        ""
    };
    format!(
        "ask the user to set {} from the dashboard, the settings API or `loadout settings set` (the `set_setting` tool may not: it widens what tools can reach){others}",
        operator.join(", ")
    )
}

impl From<crate::StoreError> for ToolError {
    fn from(e: crate::StoreError) -> Self {
        ToolError::Storage(e.to_string())
    }
}

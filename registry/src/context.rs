//! What a tool body can reach besides its arguments.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;

use crate::{Registry, Settings, Storage};

/// The meta-tools' names: the core tools that change a conversation's tool selection
/// through its [`SessionControl`]. Defined here once, for core and the servers.
pub mod meta {
    pub const SEARCH_TOOLS: &str = "search_tools";
    pub const LOAD_TOOLS: &str = "load_tools";
    pub const UNLOAD_TOOLS: &str = "unload_tools";
    pub const LOAD_ALL_FOR_THIS_TURN: &str = "load_all_for_this_turn";
    pub const ALL: [&str; 4] = [
        SEARCH_TOOLS,
        LOAD_TOOLS,
        UNLOAD_TOOLS,
        LOAD_ALL_FOR_THIS_TURN,
    ];
    /// MCP only: runs any tool by name, for clients that list a few tools and reach
    /// the rest through `search_tools`. The MCP server answers it; it is no registry
    /// tool, so it is not in [`ALL`] and the router never offers it.
    pub const CALL_TOOL: &str = "call_tool";
}

/// What a [`SessionControl`] method answers: a JSON result for the model, or a
/// message saying why the request was refused.
pub type ControlFuture<'a> = Pin<Box<dyn Future<Output = Result<Value, String>> + Send + 'a>>;

/// The tool selection of the conversation a call belongs to, as the meta-tools
/// (`search_tools`, `load_tools`, `unload_tools`, `load_all_for_this_turn`) change it.
///
/// The server that runs the conversation implements it (the chat loop over the turn's
/// routed session); tools reach it through [`ToolContext::session_control`]. MCP has
/// none: a connection's tool list is constant, and the MCP server answers
/// `search_tools` itself. A change is visible to the caller's next
/// model step within the same turn.
pub trait SessionControl: Send + Sync {
    /// Tools matching `query` (at most `limit`): name, domain, hint, and whether each
    /// is already available.
    fn search<'a>(&'a self, query: &'a str, limit: usize) -> ControlFuture<'a>;
    /// Makes tools available; each name is a tool or a domain.
    fn load<'a>(&'a self, names: &'a [String]) -> ControlFuture<'a>;
    /// Takes tools away again; each name is a tool or a domain (meaning all its tools).
    fn unload<'a>(&'a self, names: &'a [String]) -> ControlFuture<'a>;
    /// Sends every active tool until the next user message.
    fn load_all_for_this_turn(&self) -> ControlFuture<'_>;
}

/// Passed to tools that ask for it (`ctx: &ToolContext`). Cheap to clone.
#[derive(Clone)]
pub struct ToolContext {
    settings: Settings,
    registry: Arc<Registry>,
    session: Option<String>,
    client: String,
    session_control: Option<Arc<dyn SessionControl>>,
}

impl std::fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolContext")
            .field("settings", &self.settings)
            .field("registry", &self.registry)
            .field("session", &self.session)
            .field("client", &self.client)
            .field("session_control", &self.session_control.is_some())
            .finish()
    }
}

impl ToolContext {
    pub fn new(registry: Arc<Registry>, settings: Settings) -> ToolContext {
        ToolContext {
            settings,
            registry,
            session: None,
            client: "local".into(),
            session_control: None,
        }
    }

    /// The same context inside a conversation whose tool selection the meta-tools
    /// may change.
    pub fn with_session_control(mut self, control: Arc<dyn SessionControl>) -> ToolContext {
        self.session_control = Some(control);
        self
    }

    /// The conversation's tool selection, when the caller routes tools per message;
    /// `None` for callers that expose every tool (CLI, plain MCP).
    pub fn session_control(&self) -> Option<&Arc<dyn SessionControl>> {
        self.session_control.as_ref()
    }

    /// The same context for a session (scratchpad databases, router state).
    pub fn with_session(mut self, session: impl Into<String>) -> ToolContext {
        self.session = Some(session.into());
        self
    }

    /// Names the caller (an MCP client's name, `chat`, `cli`) for the audit log.
    pub fn with_client(mut self, client: impl Into<String>) -> ToolContext {
        self.client = client.into();
        self
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The storage the server opened: a domain with data of its own asks it for its
    /// engine ([`Storage::memory_engine`], [`Storage::scratchpad_engine`]).
    pub fn storage(&self) -> &dyn Storage {
        &**self.settings.storage()
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// The namespace for per-session data: the session id, or `default` outside a
    /// session (CLI calls, MCP clients).
    pub fn namespace(&self) -> &str {
        self.session.as_deref().unwrap_or("default")
    }

    pub fn client(&self) -> &str {
        &self.client
    }
}

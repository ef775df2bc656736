//! What a tool body can reach besides its arguments.

use std::sync::Arc;

use crate::{Registry, Settings, Store};

/// Passed to tools that ask for it (`ctx: &ToolContext`). Cheap to clone.
#[derive(Clone, Debug)]
pub struct ToolContext {
    settings: Settings,
    registry: Arc<Registry>,
    session: Option<String>,
    client: String,
}

impl ToolContext {
    pub fn new(registry: Arc<Registry>, settings: Settings) -> ToolContext {
        ToolContext {
            settings,
            registry,
            session: None,
            client: "local".into(),
        }
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

    pub fn store(&self) -> &Store {
        self.settings.store()
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

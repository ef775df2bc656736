//! What the MCP server lists: the registry and every tool's MCP definition, built
//! once from the registry (no second registration site) and rebuilt only when an
//! upstream server's tool list changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use loadout::{Registry, Tool};
use loadout_router::{Hint, Router, RouterConfig};
use rmcp::model::Tool as McpTool;

/// One consistent view: the registry calls go to, and the definitions clients see.
pub struct Catalog {
    pub registry: Arc<Registry>,
    /// Every tool's MCP definition, in registry (name) order.
    pub tools: Vec<McpTool>,
    /// Position of each tool in `tools`, by name.
    positions: HashMap<String, usize>,
    /// The ranking `search_tools` uses, the chat's own: built on the first search,
    /// since a client that never searches should not pay for its indexes, and again
    /// when the config's `[router]` changed since (a reload).
    router: Mutex<Option<Arc<Router>>>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("tools", &self.tools.len())
            .finish()
    }
}

impl Catalog {
    pub fn new(registry: Arc<Registry>) -> Catalog {
        let tools: Vec<McpTool> = registry
            .all_tools()
            .iter()
            .filter_map(to_mcp_tool)
            .collect();
        let positions = tools
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.to_string(), i))
            .collect();
        Catalog {
            registry,
            tools,
            positions,
            router: Mutex::new(None),
        }
    }

    pub fn mcp_tool(&self, name: &str) -> Option<&McpTool> {
        self.positions.get(name).map(|&i| &self.tools[i])
    }

    /// `search_tools` over MCP: every tool (one that needs settings says so when
    /// called), ranked as the router ranks them for chat. `config`: the router's
    /// tunables in force; the router is built on the first search and again when
    /// they change. `on_build` gets the router when this search built it (to attach
    /// its dense stage). Lexical: the server's `search_tools` embeds the query first
    /// and searches [`Catalog::router`] itself.
    pub fn search(
        &self,
        query: &str,
        limit: usize,
        config: &RouterConfig,
        on_build: impl FnOnce(&Arc<Router>),
    ) -> Vec<Hint> {
        let router = self.router(config, on_build);
        router.search(query, None, None, None, limit)
    }

    /// The router `search_tools` ranks with, built on first use and again when
    /// `config` changed (`on_build` gets it then).
    pub fn router(
        &self,
        config: &RouterConfig,
        on_build: impl FnOnce(&Arc<Router>),
    ) -> Arc<Router> {
        {
            let mut cached = self.router.lock().unwrap_or_else(|p| p.into_inner());
            match &*cached {
                Some(router) if router.config() == config => router.clone(),
                // Building the router counts every tool's tokens: a tenth of a second
                // or more for a few hundred tools. Searches meanwhile wait for it.
                _ => {
                    let router = crate::routing::off_worker(|| {
                        Arc::new(Router::new(self.registry.clone(), config.clone()))
                    });
                    *cached = Some(router.clone());
                    on_build(&router);
                    router
                }
            }
        }
    }
}

/// The registry's MCP export mapped onto rmcp's type. A tool whose schema is not a
/// JSON object cannot be listed over MCP; it is left out with a warning (the registry
/// never builds such a tool from `#[tool]`, only a malformed upstream could).
pub fn to_mcp_tool(tool: &Tool) -> Option<McpTool> {
    match serde_json::from_value::<McpTool>(loadout::export::mcp(tool)) {
        Ok(mcp_tool) => Some(mcp_tool),
        Err(e) => {
            tracing::warn!("tool `{}` left out of tools/list: {e}", tool.name);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_tool_is_listed_with_its_schema() {
        let registry = Arc::new(loadout_domains::registry().expect("registry"));
        let catalog = Catalog::new(registry.clone());
        assert_eq!(catalog.tools.len(), registry.all_tools().len());
        let calculate = catalog.mcp_tool("calculate").expect("calculate listed");
        assert_eq!(
            calculate.input_schema.get("type").and_then(|t| t.as_str()),
            Some("object")
        );
        assert!(
            calculate
                .description
                .as_deref()
                .is_some_and(|d| !d.is_empty())
        );
        assert!(calculate.annotations.is_some());
    }

    #[test]
    fn search_builds_its_router_once_per_config() {
        let registry = Arc::new(loadout_domains::registry().expect("registry"));
        let catalog = Catalog::new(registry);
        let mut builds = Vec::new();
        let mut search = |config: &RouterConfig| {
            let hits = catalog.search("remember my locker code", 3, config, |router| {
                builds.push(router.config().token_budget)
            });
            assert!(hits.iter().any(|h| h.name == "remember"), "{hits:?}");
        };
        let defaults = RouterConfig::default();
        let reloaded = RouterConfig {
            token_budget: 1234,
            ..RouterConfig::default()
        };
        search(&defaults);
        search(&defaults);
        search(&reloaded);
        search(&reloaded);
        assert_eq!(builds, [defaults.token_budget, 1234]);
    }
}

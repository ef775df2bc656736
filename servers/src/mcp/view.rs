//! What one MCP endpoint lists and reaches: its view. A view is fixed by the command
//! line (`--dynamic`, `--max-tools`, `--domains`) or the HTTP path
//! (`/mcp/domains/a,b`), so its `tools/list` is the same for every connection and
//! every request: the protocol (2026-07-28) lets only the request's authorization
//! change it. It changes when the tools themselves do (an upstream server's new tool
//! list, a reload), and clients are then told.
//!
//! Every tool of the view stays reachable whether listed or not: called directly,
//! through `call_tool`, or found with `search_tools`.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use loadout::{Registry, RegistryError};
use rmcp::model::Tool as McpTool;

use super::catalog::Catalog;
use super::meta;

/// Which tools an endpoint serves and how many it lists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct View {
    /// `None`: every domain. `Some`: the always-on domains (core) and these.
    pub domains: Option<BTreeSet<String>>,
    /// List core, `search_tools` and `call_tool` only.
    pub dynamic: bool,
    /// Never list more tools than this (at least 2: `search_tools` and `call_tool`).
    pub max_tools: Option<usize>,
}

/// Domain names from `a,b` (the `--domains` value, or an endpoint's path): trimmed,
/// deduplicated and sorted, so that `b, a` and `a,b` are the same view.
pub fn parse_domain_set(text: &str) -> BTreeSet<String> {
    text.split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The message refusing names that are no domain of `registry`, or `None` when
/// every name is one.
pub fn unknown_domains(
    registry: &Registry,
    domains: &BTreeSet<String>,
) -> Option<(Vec<String>, String)> {
    let unknown: Vec<String> = domains
        .iter()
        .filter(|d| registry.domain(d).is_none())
        .cloned()
        .collect();
    if unknown.is_empty() {
        return None;
    }
    let known: Vec<&str> = registry.domains().iter().map(|d| d.name.as_str()).collect();
    let names: Vec<String> = unknown.iter().map(|d| format!("`{d}`")).collect();
    let message = format!(
        "unknown domain{} {}; known domains: {}",
        if unknown.len() == 1 { "" } else { "s" },
        names.join(", "),
        known.join(", ")
    );
    Some((unknown, message))
}

/// A view over one catalog and one warm snapshot: what its connections list.
pub struct ViewState {
    /// The view's tools only, without the chat-only meta-tools: what calls and
    /// `search_tools` reach, and what core's `list_tools` reports.
    pub catalog: Arc<Catalog>,
    /// `tools/list`, in this order.
    pub listed: Vec<McpTool>,
    /// Every tool of the view is listed (so `search_tools` and `call_tool` are not).
    pub complete: bool,
    pub search_tools: McpTool,
    pub call_tool: McpTool,
    base: Arc<Catalog>,
    warm: Arc<[String]>,
}

impl ViewState {
    /// `reuse`: the state this one replaces; its catalog is kept when the base did
    /// not change (only the warm domains did), and with it the search's ranking.
    pub fn build(
        view: &View,
        base: &Arc<Catalog>,
        warm: &Arc<[String]>,
        reuse: Option<&ViewState>,
    ) -> Result<ViewState, RegistryError> {
        let catalog = match reuse {
            Some(old) if Arc::ptr_eq(&old.base, base) => old.catalog.clone(),
            _ => Arc::new(Catalog::new(scope(&base.registry, view.domains.as_ref())?)),
        };
        let search_tools = meta::search_tools_definition(base.mcp_tool(meta::SEARCH_TOOLS));
        let call_tool = meta::call_tool_definition();
        let (listed, complete) = listed_tools(view, &catalog, warm, &search_tools, &call_tool);
        Ok(ViewState {
            catalog,
            listed,
            complete,
            search_tools,
            call_tool,
            base: base.clone(),
            warm: warm.clone(),
        })
    }

    pub fn is_built_from(&self, base: &Arc<Catalog>, warm: &Arc<[String]>) -> bool {
        Arc::ptr_eq(&self.base, base) && Arc::ptr_eq(&self.warm, warm)
    }

    pub fn listed_names(&self) -> Vec<String> {
        self.listed.iter().map(|t| t.name.to_string()).collect()
    }

    /// The definition of any tool the view reaches, listed or not.
    pub fn definition(&self, name: &str) -> Option<&McpTool> {
        match name {
            meta::SEARCH_TOOLS => Some(&self.search_tools),
            meta::CALL_TOOL => Some(&self.call_tool),
            _ => self.catalog.mcp_tool(name),
        }
    }

    /// The server's instructions: how to reach the tools that are not listed.
    pub fn instructions(&self) -> Option<String> {
        (!self.complete).then(|| {
            format!(
                "This server lists {} of its {} tools; search_tools finds any tool by what it does and returns its description and input schema. Run a tool that is not listed with call_tool {{name, arguments}}.",
                self.listed.len(),
                self.catalog.tools.len()
            )
        })
    }
}

/// The registry restricted to a view: its domains (all, or the always-on ones and
/// `domains`), without the meta-tools that change a chat session's selection.
fn scope(
    registry: &Registry,
    domains: Option<&BTreeSet<String>>,
) -> Result<Arc<Registry>, RegistryError> {
    let in_scope = |domain: &loadout::Domain| {
        domain.always_on || domains.is_none_or(|set| set.contains(&domain.name))
    };
    let kept: Vec<loadout::Domain> = registry
        .domains()
        .iter()
        .filter(|d| in_scope(d))
        .cloned()
        .collect();
    let kept_names: HashSet<&str> = kept.iter().map(|d| d.name.as_str()).collect();
    let tools = registry
        .all_tools()
        .iter()
        .filter(|t| kept_names.contains(t.domain.as_str()))
        .filter(|t| !loadout::meta::ALL.contains(&t.name.as_str()))
        .cloned()
        .collect();
    Ok(Arc::new(Registry::from_parts(kept, tools)?))
}

/// The constant list, and whether it holds every tool of the view:
/// - every tool, when nothing limits the list or they all fit;
/// - else `search_tools`, `call_tool` and core, then (with `--max-tools`, not
///   `--dynamic`) the warm domains' tools, most recently used domain first, whole
///   domains only, each that still fits; never more than `max_tools`.
///
/// `search_tools` and `call_tool` come first: a client that cuts the list anyway
/// keeps the way to every tool.
fn listed_tools(
    view: &View,
    catalog: &Catalog,
    warm: &[String],
    search_tools: &McpTool,
    call_tool: &McpTool,
) -> (Vec<McpTool>, bool) {
    let all = &catalog.tools;
    if !view.dynamic && view.max_tools.is_none_or(|n| all.len() <= n) {
        return (all.clone(), true);
    }
    let registry = &catalog.registry;
    let limit = view.max_tools.unwrap_or(usize::MAX);
    let mut listed = vec![search_tools.clone(), call_tool.clone()];
    for domain in registry.domains().iter().filter(|d| d.always_on) {
        listed.extend(tools_of(catalog, domain));
    }
    if !view.dynamic {
        for name in warm {
            let Some(domain) = registry.domain(name).filter(|d| !d.always_on) else {
                continue;
            };
            let tools: Vec<McpTool> = tools_of(catalog, domain).collect();
            if listed.len() + tools.len() <= limit {
                listed.extend(tools);
            }
        }
    }
    listed.truncate(limit);
    (listed, false)
}

fn tools_of<'a>(
    catalog: &'a Catalog,
    domain: &'a loadout::Domain,
) -> impl Iterator<Item = McpTool> + 'a {
    domain
        .tools
        .iter()
        .filter_map(|name| catalog.mcp_tool(name).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Arc<Catalog> {
        Arc::new(Catalog::new(Arc::new(
            loadout_domains::registry().expect("registry"),
        )))
    }

    fn names(state: &ViewState) -> Vec<String> {
        state.listed_names()
    }

    fn warm(names: &[&str]) -> Arc<[String]> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn core_names(base: &Catalog) -> Vec<String> {
        let registry = &base.registry;
        registry
            .all_tools()
            .iter()
            .filter(|t| registry.domain(&t.domain).is_some_and(|d| d.always_on))
            .filter(|t| !loadout::meta::ALL.contains(&t.name.as_str()))
            .map(|t| t.name.clone())
            .collect()
    }

    #[test]
    fn everything_is_listed_when_nothing_limits_the_list_or_it_fits() {
        let base = base();
        let n_tools = base.tools.len() - loadout::meta::ALL.len();
        for max_tools in [None, Some(n_tools), Some(1000)] {
            let view = View {
                max_tools,
                ..View::default()
            };
            let state = ViewState::build(&view, &base, &warm(&[]), None).expect("view");
            assert!(state.complete);
            assert_eq!(state.listed.len(), n_tools);
            assert!(state.instructions().is_none());
            // No meta-tool: every tool is there already.
            let listed = names(&state);
            for meta in loadout::meta::ALL.iter().chain([&meta::CALL_TOOL]) {
                assert!(!listed.iter().any(|n| n == meta), "{meta} in {listed:?}");
            }
        }
    }

    #[test]
    fn dynamic_lists_search_call_and_core_whatever_is_warm() {
        let base = base();
        let view = View {
            dynamic: true,
            ..View::default()
        };
        let state = ViewState::build(&view, &base, &warm(&["memory"]), None).expect("view");
        let mut expected = vec![meta::SEARCH_TOOLS.to_owned(), meta::CALL_TOOL.to_owned()];
        expected.extend(core_names(&base));
        assert_eq!(names(&state), expected);
        assert!(!state.complete);
        let instructions = state.instructions().expect("instructions");
        assert!(instructions.contains("search_tools") && instructions.contains("call_tool"));
        // Every tool of the view is reachable, listed or not.
        assert!(state.definition("read_file").is_some());
        assert!(state.definition(meta::CALL_TOOL).is_some());
        assert!(state.definition(loadout::meta::LOAD_TOOLS).is_none());
    }

    #[test]
    fn a_limit_lists_core_then_whole_warm_domains_newest_first_never_more() {
        let base = base();
        let core = core_names(&base).len();
        let domain_size = |name: &str| base.registry.domain(name).expect("domain").tools.len();
        let (memory, scratchpad) = (domain_size("memory"), domain_size("scratchpad"));
        // Room for core and memory but not scratchpad: memory is skipped only if
        // it comes second and does not fit.
        let limit = 2 + core + memory;
        let view = View {
            max_tools: Some(limit),
            ..View::default()
        };
        let state =
            ViewState::build(&view, &base, &warm(&["scratchpad", "memory"]), None).expect("view");
        let listed = names(&state);
        assert!(listed.len() <= limit);
        if scratchpad <= memory {
            assert!(listed.contains(&"create_table".to_owned()), "{listed:?}");
        } else {
            assert!(!listed.contains(&"create_table".to_owned()), "{listed:?}");
            assert!(listed.contains(&"remember".to_owned()), "{listed:?}");
        }
        assert_eq!(listed[..2], [meta::SEARCH_TOOLS, meta::CALL_TOOL]);

        // Unknown and always-on names among the warm ones are skipped.
        let state =
            ViewState::build(&view, &base, &warm(&["nope", "core", "memory"]), None).expect("view");
        assert_eq!(names(&state).len(), limit);
        assert!(names(&state).contains(&"recall".to_owned()));

        // Smaller than core: cut, search_tools and call_tool kept.
        let view = View {
            max_tools: Some(3),
            ..View::default()
        };
        let state = ViewState::build(&view, &base, &warm(&["memory"]), None).expect("view");
        assert_eq!(names(&state).len(), 3);
        assert_eq!(names(&state)[..2], [meta::SEARCH_TOOLS, meta::CALL_TOOL]);
    }

    #[test]
    fn domain_sets_keep_core_and_those_domains() {
        let base = base();
        let view = View {
            domains: Some(parse_domain_set(" memory , memory,")),
            ..View::default()
        };
        let state = ViewState::build(&view, &base, &warm(&[]), None).expect("view");
        let listed = names(&state);
        assert!(listed.contains(&"recall".to_owned()) && listed.contains(&"calculate".to_owned()));
        assert!(!listed.contains(&"read_file".to_owned()), "{listed:?}");
        assert!(state.definition("read_file").is_none(), "out of the view");
        assert_eq!(state.catalog.registry.domains().len(), 2);

        let set = parse_domain_set("memory,calendar,weather");
        let (unknown, message) = unknown_domains(&base.registry, &set).expect("unknown");
        assert_eq!(unknown, ["calendar", "weather"]);
        assert!(message.contains("`calendar`") && message.contains("known domains: core"));
        assert!(unknown_domains(&base.registry, &parse_domain_set("memory")).is_none());
    }

    #[test]
    fn a_rebuild_for_new_warm_domains_keeps_the_catalog() {
        let base = base();
        let view = View {
            max_tools: Some(12),
            ..View::default()
        };
        let first = ViewState::build(&view, &base, &warm(&[]), None).expect("view");
        let warm = warm(&["memory"]);
        let second = ViewState::build(&view, &base, &warm, Some(&first)).expect("view");
        assert!(Arc::ptr_eq(&first.catalog, &second.catalog));
        assert!(second.is_built_from(&base, &warm) && !first.is_built_from(&base, &warm));
    }
}

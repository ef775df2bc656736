//! `loadout mcp --dynamic`: the client first sees only `core` (with its meta-tools)
//! and loads what it needs. The loaded set belongs to one MCP connection (one stdio
//! process, one HTTP session); loading or unloading sends
//! `notifications/tools/list_changed`.
//!
//! The meta-tools' definitions are core's (`search_tools`, `load_tools`,
//! `unload_tools`: one definition for chat and MCP); over MCP their calls are answered
//! here, since they change what this connection lists, which the registry knows
//! nothing about. Core's `load_all_for_this_turn` is not listed: an MCP connection has
//! no turns. `search_tools` ranks with the router (see [`super::catalog::Catalog::search`]).

use std::collections::BTreeSet;
use std::sync::LazyLock;

use loadout::Registry;
use rmcp::ErrorData as McpError;
use serde_json::{Value, json};

pub use loadout::meta::{LOAD_ALL_FOR_THIS_TURN, LOAD_TOOLS, SEARCH_TOOLS, UNLOAD_TOOLS};

/// The domain whose tools are always listed in dynamic mode.
pub const CORE_DOMAIN: &str = "core";

const DEFAULT_SEARCH_LIMIT: usize = 10;
const MAX_SEARCH_LIMIT: usize = 50;

pub fn is_meta_tool(name: &str) -> bool {
    name != LOAD_ALL_FOR_THIS_TURN && loadout::meta::ALL.contains(&name)
}

/// Whether a tool is listed in this mode: without `--dynamic` every tool is listed
/// already, so the meta-tools would only cost tokens; with it, everything but
/// `load_all_for_this_turn`.
pub fn is_listed_meta(name: &str, dynamic: bool) -> bool {
    if name == LOAD_ALL_FOR_THIS_TURN {
        return false;
    }
    dynamic || !is_meta_tool(name)
}

/// Whether a registry tool is listed without loading.
pub fn is_core(registry: &Registry, tool: &str) -> bool {
    registry.tool(tool).is_some_and(|t| t.domain == CORE_DOMAIN)
}

/// `search_tools` arguments.
#[derive(Debug)]
pub struct SearchArgs {
    pub query: String,
    pub limit: usize,
}

pub fn parse_search_args(args: &Value) -> Result<SearchArgs, McpError> {
    let object = args_object(args)?;
    check_known_fields(object, &["query", "limit"])?;
    let query = match object.get("query") {
        Some(Value::String(q)) if !q.trim().is_empty() => q.clone(),
        Some(Value::String(_)) => return Err(invalid_field("query", "must not be empty")),
        Some(_) => return Err(invalid_field("query", "must be a string")),
        None => return Err(invalid_field("query", "is required")),
    };
    let limit = match object.get("limit") {
        None | Some(Value::Null) => DEFAULT_SEARCH_LIMIT,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_SEARCH_LIMIT as u64).contains(&n) => n as usize,
            _ => {
                return Err(invalid_field(
                    "limit",
                    &format!("must be an integer from 1 to {MAX_SEARCH_LIMIT}"),
                ));
            }
        },
    };
    Ok(SearchArgs { query, limit })
}

/// `load_tools` / `unload_tools` arguments: the names.
pub fn parse_names(args: &Value) -> Result<Vec<String>, McpError> {
    let object = args_object(args)?;
    check_known_fields(object, &["names"])?;
    let names = match object.get("names") {
        Some(Value::Array(items)) => items,
        // A lone string is a common slip of small models; accept it.
        Some(Value::String(name)) => return Ok(vec![name.clone()]),
        Some(_) => return Err(invalid_field("names", "must be an array of strings")),
        None => return Err(invalid_field("names", "is required")),
    };
    if names.is_empty() {
        return Err(invalid_field(
            "names",
            "must name at least one tool or domain",
        ));
    }
    names
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) => Ok(s.trim().to_owned()),
            _ => Err(invalid_field(&format!("names/{i}"), "must be a string")),
        })
        .collect()
}

fn args_object(args: &Value) -> Result<&serde_json::Map<String, Value>, McpError> {
    static EMPTY: LazyLock<serde_json::Map<String, Value>> = LazyLock::new(Default::default);
    match args {
        Value::Object(map) => Ok(map),
        Value::Null => Ok(&EMPTY),
        _ => Err(McpError::invalid_params(
            "invalid arguments: expected a JSON object",
            None,
        )),
    }
}

fn check_known_fields(
    object: &serde_json::Map<String, Value>,
    known: &[&str],
) -> Result<(), McpError> {
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(unknown) => Err(invalid_field(unknown, "is not a parameter of this tool")),
        None => Ok(()),
    }
}

fn invalid_field(field: &str, problem: &str) -> McpError {
    McpError::invalid_params(
        format!("invalid arguments at `{field}`: {problem}"),
        Some(json!({"field": field})),
    )
}

/// Tool names a list of tool or domain names stands for; names that are neither
/// come back separately.
pub fn resolve_names(registry: &Registry, names: &[String]) -> (BTreeSet<String>, Vec<String>) {
    let mut tools = BTreeSet::new();
    let mut unknown = Vec::new();
    for name in names {
        if let Some(tool) = registry.tool(name) {
            tools.insert(tool.name.clone());
        } else if let Some(domain) = registry.domain(name) {
            tools.extend(domain.tools.iter().cloned());
        } else {
            unknown.push(name.clone());
        }
    }
    (tools, unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Registry {
        loadout_domains::registry().expect("registry")
    }

    #[test]
    fn core_defines_the_meta_tools_this_module_answers() {
        let registry = registry();
        for name in loadout::meta::ALL {
            let tool = registry.tool(name).expect("core meta-tool");
            assert_eq!(tool.domain, CORE_DOMAIN);
        }
        let properties = |name: &str| -> Vec<String> {
            registry.tool(name).expect("tool").input_schema["properties"]
                .as_object()
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default()
        };
        // The arguments this module parses are the ones core's definitions declare.
        assert_eq!(properties(SEARCH_TOOLS), ["limit", "query"]);
        assert_eq!(properties(LOAD_TOOLS), ["names"]);
        assert_eq!(properties(UNLOAD_TOOLS), ["names"]);
        assert!(!is_listed_meta(LOAD_ALL_FOR_THIS_TURN, true));
        assert!(is_listed_meta(LOAD_TOOLS, true) && !is_listed_meta(LOAD_TOOLS, false));
        assert!(is_listed_meta("calculate", false));
    }

    #[test]
    fn search_finds_every_tool_by_words_of_its_purpose() {
        let catalog = super::super::catalog::Catalog::new(std::sync::Arc::new(registry()));
        let config = loadout_router::RouterConfig::default();
        let hits = catalog.search("read a file", 5, &config, |_| {});
        assert_eq!(hits.first().map(|h| h.name.as_str()), Some("read_file"));
        let hits = catalog.search("파일 읽기", 5, &config, |_| {});
        assert!(hits.iter().any(|h| h.name == "read_file"), "{hits:?}");
        assert!(catalog.search("zzzz qqqq", 5, &config, |_| {}).is_empty());
        // Found although its domain needs settings no one has set.
        assert!(
            catalog
                .search("list the files in a folder", 5, &config, |_| {})
                .iter()
                .any(|h| h.domain == "filesystem")
        );
        assert_eq!(catalog.search("memory", 3, &config, |_| {}).len(), 3);
    }

    #[test]
    fn names_resolve_to_tools_and_domains() {
        let registry = registry();
        let (tools, unknown) = resolve_names(
            &registry,
            &["filesystem".into(), "calculate".into(), "nope".into()],
        );
        assert!(tools.contains("read_file") && tools.contains("calculate"));
        assert_eq!(unknown, ["nope"]);
    }

    #[test]
    fn bad_arguments_name_the_field() {
        let err = parse_names(&json!({"names": [1]})).expect_err("error");
        assert!(err.message.contains("names/0"), "{}", err.message);
        let err = parse_search_args(&json!({})).expect_err("error");
        assert!(err.message.contains("`query`"), "{}", err.message);
        let err = parse_search_args(&json!({"query": "x", "limit": 0})).expect_err("error");
        assert!(err.message.contains("`limit`"), "{}", err.message);
    }
}

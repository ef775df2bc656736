//! The two tools that reach every other tool over MCP: `search_tools` finds tools by
//! what they do and gives their full definitions, `call_tool` runs any of them by
//! name. With them, a client that lists few tools (a `--max-tools` limit, `--dynamic`)
//! and never re-lists still reaches every tool.
//!
//! Their arguments are checked here, and a mistake is a tool result with `isError`
//! naming the field, as for any tool, so that the model reads it and retries.

use std::sync::{Arc, LazyLock};

use rmcp::model::{CallToolResult, ContentBlock, Tool as McpTool};
use serde_json::{Map, Value, json};

pub use loadout::meta::{CALL_TOOL, SEARCH_TOOLS};

const DEFAULT_SEARCH_LIMIT: usize = 10;
const MAX_SEARCH_LIMIT: usize = 50;

const SEARCH_TOOLS_DESCRIPTION: &str = "Finds tools among all of this server's tools by what they do (most are not listed). Returns each match's name, domain, description and input schema, whether its domain is configured and the settings keys it still needs; run one with call_tool.";

const CALL_TOOL_DESCRIPTION: &str = "Runs any tool of this server by name, listed or not, with its arguments (search_tools gives each tool's name and input schema); answers with that tool's own result.";

/// Tools no MCP client calls: they change a routed chat session's tool selection,
/// which an MCP connection does not have (its list is constant).
pub fn is_chat_only(name: &str) -> bool {
    name != SEARCH_TOOLS && loadout::meta::ALL.contains(&name)
}

/// `search_tools` as MCP lists it: core's definition (one input schema for chat and
/// MCP) with a description for MCP, where it finds unlisted tools, not unsent ones.
pub fn search_tools_definition(core: Option<&McpTool>) -> McpTool {
    let mut tool = core.cloned().unwrap_or_else(|| {
        McpTool::new(
            SEARCH_TOOLS,
            "",
            object(json!({
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"],
            })),
        )
    });
    tool.description = Some(SEARCH_TOOLS_DESCRIPTION.into());
    tool
}

/// `call_tool`'s definition.
pub fn call_tool_definition() -> McpTool {
    static SCHEMA: LazyLock<Arc<Map<String, Value>>> = LazyLock::new(|| {
        object(json!({
            "type": "object",
            "properties": {
                "name": {
                    "type": "string",
                    "description": "The tool's name, as search_tools gives it."
                },
                "arguments": {
                    "type": "object",
                    "description": "The tool's arguments, as its input schema says."
                }
            },
            "required": ["name"],
            "additionalProperties": false
        }))
    });
    McpTool::new(CALL_TOOL, CALL_TOOL_DESCRIPTION, SCHEMA.clone())
}

fn object(value: Value) -> Arc<Map<String, Value>> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::default(),
    }
}

/// `search_tools` arguments.
#[derive(Debug)]
pub struct SearchArgs {
    pub query: String,
    pub limit: usize,
}

pub fn parse_search_args(args: &Value) -> Result<SearchArgs, CallToolResult> {
    let object = args_object(SEARCH_TOOLS, args)?;
    check_known_fields(SEARCH_TOOLS, object, &["query", "limit"])?;
    let query = match object.get("query") {
        Some(Value::String(q)) if !q.trim().is_empty() => q.clone(),
        Some(Value::String(_)) => {
            return Err(invalid_field(SEARCH_TOOLS, "query", "must not be empty"));
        }
        Some(_) => return Err(invalid_field(SEARCH_TOOLS, "query", "must be a string")),
        None => return Err(invalid_field(SEARCH_TOOLS, "query", "is required")),
    };
    let limit = match object.get("limit") {
        None | Some(Value::Null) => DEFAULT_SEARCH_LIMIT,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_SEARCH_LIMIT as u64).contains(&n) => n as usize,
            _ => {
                return Err(invalid_field(
                    SEARCH_TOOLS,
                    "limit",
                    &format!("must be an integer from 1 to {MAX_SEARCH_LIMIT}"),
                ));
            }
        },
    };
    Ok(SearchArgs { query, limit })
}

/// `call_tool` arguments: the tool's name and its arguments (`null` when absent).
pub fn parse_call_args(args: &Value) -> Result<(String, Value), CallToolResult> {
    let object = args_object(CALL_TOOL, args)?;
    check_known_fields(CALL_TOOL, object, &["name", "arguments"])?;
    let name = match object.get("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name.trim().to_owned(),
        Some(Value::String(_)) => {
            return Err(invalid_field(CALL_TOOL, "name", "must not be empty"));
        }
        Some(_) => return Err(invalid_field(CALL_TOOL, "name", "must be a string")),
        None => return Err(invalid_field(CALL_TOOL, "name", "is required")),
    };
    if name == CALL_TOOL {
        return Err(invalid_field(CALL_TOOL, "name", "must name another tool"));
    }
    let arguments = match object.get("arguments") {
        None | Some(Value::Null) => Value::Null,
        Some(arguments @ Value::Object(_)) => arguments.clone(),
        Some(_) => {
            return Err(invalid_field(
                CALL_TOOL,
                "arguments",
                "must be an object (the tool's arguments by name)",
            ));
        }
    };
    Ok((name, arguments))
}

fn args_object<'a>(tool: &str, args: &'a Value) -> Result<&'a Map<String, Value>, CallToolResult> {
    static EMPTY: LazyLock<Map<String, Value>> = LazyLock::new(Default::default);
    match args {
        Value::Object(map) => Ok(map),
        Value::Null => Ok(&EMPTY),
        _ => Err(invalid(
            tool,
            "invalid arguments: expected a JSON object".into(),
        )),
    }
}

fn check_known_fields(
    tool: &str,
    object: &Map<String, Value>,
    known: &[&str],
) -> Result<(), CallToolResult> {
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(unknown) => Err(invalid_field(
            tool,
            unknown,
            "is not a parameter of this tool",
        )),
        None => Ok(()),
    }
}

fn invalid_field(tool: &str, field: &str, problem: &str) -> CallToolResult {
    invalid(tool, format!("invalid arguments at `{field}`: {problem}"))
}

fn invalid(tool: &str, message: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!("{tool}: {message}"))])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(result: CallToolResult) -> String {
        assert_eq!(result.is_error, Some(true));
        result
            .content
            .first()
            .and_then(|c| c.as_text())
            .map(|t| t.text.clone())
            .unwrap_or_default()
    }

    #[test]
    fn core_defines_search_tools_with_the_arguments_parsed_here() {
        let registry = loadout_domains::registry().expect("registry");
        let core = registry.tool(SEARCH_TOOLS).expect("core's search_tools");
        let core = super::super::catalog::to_mcp_tool(core).expect("MCP definition");
        let tool = search_tools_definition(Some(&core));
        assert_eq!(tool.input_schema, core.input_schema);
        let properties: Vec<&String> = tool.input_schema["properties"]
            .as_object()
            .map(|p| p.keys().collect())
            .unwrap_or_default();
        assert_eq!(properties, ["limit", "query"]);
        assert!(registry.tool(CALL_TOOL).is_none(), "call_tool is MCP's own");
        assert!(is_chat_only(loadout::meta::LOAD_TOOLS) && !is_chat_only(SEARCH_TOOLS));
        assert!(!is_chat_only("calculate"));
    }

    #[test]
    fn bad_arguments_are_tool_errors_naming_the_field() {
        let cases: [(Value, &str); 8] = [
            (json!({}), "`query`"),
            (json!({"query": "x", "limit": 0}), "`limit`"),
            (json!({"query": 3}), "`query`"),
            (json!({"query": "x", "extra": 1}), "`extra`"),
            (json!("x"), "expected a JSON object"),
            (json!({"query": "  "}), "`query`"),
            (json!({"query": "x", "limit": 51}), "`limit`"),
            (json!({"query": "x", "limit": "5"}), "`limit`"),
        ];
        for (args, field) in cases {
            let text = message(parse_search_args(&args).expect_err("invalid"));
            assert!(text.contains(field), "{args}: {text}");
        }
        let cases: [(Value, &str); 6] = [
            (json!({}), "`name`"),
            (json!({"name": 5}), "`name`"),
            (json!({"name": ""}), "`name`"),
            (
                json!({"name": "calculate", "arguments": "1+1"}),
                "`arguments`",
            ),
            (json!({"name": "call_tool"}), "`name`"),
            (json!({"name": "x", "args": {}}), "`args`"),
        ];
        for (args, field) in cases {
            let text = message(parse_call_args(&args).expect_err("invalid"));
            assert!(text.contains(field), "{args}: {text}");
        }
        assert_eq!(
            parse_call_args(&json!({"name": " calculate ", "arguments": {"expression": "1"}}))
                .expect("valid"),
            ("calculate".to_owned(), json!({"expression": "1"}))
        );
        assert_eq!(
            parse_call_args(&json!({"name": "current_time"})).expect("valid"),
            ("current_time".to_owned(), Value::Null)
        );
    }
}

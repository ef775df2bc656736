//! What a call's outcome becomes on the wire and in the audit log: the one place the
//! handler's error mapping (see [`super::handler`]) is decided.

use loadout::{CallOutput, ToolError};
use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, ContentBlock, ErrorCode};
use serde_json::{Value, json};

use super::{jsonrpc, meta};
use crate::log_writer::error_kind;

/// What the audit log keeps of one call's outcome.
pub(super) struct CallRecord {
    pub(super) outcome: String,
    pub(super) detail: Option<String>,
}

impl CallRecord {
    pub(super) fn ok() -> CallRecord {
        CallRecord {
            outcome: "ok".into(),
            detail: None,
        }
    }

    /// A result's record: `ok`, or `outcome` with its message.
    pub(super) fn of(result: &CallToolResult, outcome: &str) -> CallRecord {
        if result.is_error == Some(true) {
            CallRecord {
                outcome: outcome.into(),
                detail: first_text(result),
            }
        } else {
            CallRecord::ok()
        }
    }
}

pub(super) fn malformed_request(method: &str, params: Option<&Value>) -> McpError {
    if method == "tools/call" {
        let (field, problem) = match params {
            None | Some(Value::Null) => ("params", "is required: an object with `name`"),
            Some(params) if !params.is_object() => ("params", "must be an object"),
            Some(params) => match (params.get("name"), params.get("arguments")) {
                (None, _) => ("name", "is required"),
                (Some(name), _) if !name.is_string() => ("name", "must be a string"),
                (_, Some(args)) if !args.is_object() && !args.is_null() => {
                    ("arguments", "must be an object")
                }
                _ => (
                    "params",
                    "do not match tools/call (`name`, `arguments`, `_meta`)",
                ),
            },
        };
        return McpError::invalid_params(
            format!("invalid tools/call params at `{field}`: {problem}"),
            Some(json!({"field": field})),
        );
    }
    if jsonrpc::is_standard_request(method) {
        return McpError::invalid_params(
            format!("invalid params for `{method}`"),
            Some(json!({"method": method})),
        );
    }
    McpError::new(
        ErrorCode::METHOD_NOT_FOUND,
        format!("method not found: {method}"),
        None,
    )
}

/// Maps a registry call's result onto MCP, and what the audit log keeps of it.
pub(super) fn map_result(
    name: &str,
    result: Result<CallOutput, ToolError>,
    complete: bool,
) -> (Result<CallToolResult, McpError>, CallRecord) {
    let error = match result {
        Ok(CallOutput::Value(value)) => return (Ok(success(value)), CallRecord::ok()),
        Ok(CallOutput::Raw(value)) => {
            return match upstream_result(value) {
                Ok(result) => {
                    let record = CallRecord::of(&result, "execution");
                    (Ok(result), record)
                }
                Err(message) => {
                    let record = CallRecord {
                        outcome: "execution".into(),
                        detail: Some(message.clone()),
                    };
                    (Ok(tool_error(message)), record)
                }
            };
        }
        Err(error) => error,
    };
    let record = CallRecord {
        outcome: error_kind(&error),
        detail: Some(error.to_string()),
    };
    let response = match &error {
        ToolError::UnknownTool { name } => {
            let how = if meta::is_chat_only(name) {
                "it changes a routed chat session's tools, and an MCP connection's list is constant: search_tools finds tools by what they do and call_tool runs them"
            } else if complete {
                "tools/list shows every tool"
            } else {
                "search_tools finds tools by what they do"
            };
            Err(McpError::invalid_params(
                format!("unknown tool `{name}`: no tool has this name here; {how}"),
                Some(json!({"tool": name})),
            ))
        }
        ToolError::InvalidArgs { field, message } => Ok(tool_error(format!(
            "invalid arguments for `{name}`{}: {message}",
            field
                .as_ref()
                .map(|f| format!(" at `{f}`"))
                .unwrap_or_default()
        ))),
        _ => Ok(tool_error(error.to_string())),
    };
    (response, record)
}

/// An upstream server's result as it sent it, for this server's client: its content
/// blocks (images, audio, links, embedded resources), its structured content and its
/// `isError` unchanged. Metadata of the protocol itself belonged to the upstream hop.
pub(super) fn upstream_result(value: Value) -> Result<CallToolResult, String> {
    let mut result: CallToolResult = serde_json::from_value(value)
        .map_err(|e| format!("the upstream server's result is not a tool result: {e}"))?;
    result
        .result_type
        .get_or_insert(rmcp::model::ResultType::COMPLETE);
    if let Some(meta) = &mut result.meta {
        meta.retain(|key, _| !key.starts_with("io.modelcontextprotocol/"));
        if meta.is_empty() {
            result.meta = None;
        }
    }
    Ok(result)
}

pub(super) fn success(value: Value) -> CallToolResult {
    match value {
        Value::String(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
        // Objects go out as structured content too (with the same JSON as text for
        // clients that read only text).
        Value::Object(_) => CallToolResult::structured(value),
        other => CallToolResult::success(vec![ContentBlock::text(other.to_string())]),
    }
}

pub(super) fn tool_error(message: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

pub(super) fn first_text(result: &CallToolResult) -> Option<String> {
    result
        .content
        .iter()
        .find_map(|c| c.as_text())
        .map(|t| t.text.chars().take(1000).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unknown_tool_is_a_protocol_error() {
        let (response, record) = map_result(
            "calculate",
            Err(ToolError::InvalidArgs {
                field: Some("expression".into()),
                message: "expected a string".into(),
            }),
            true,
        );
        let result = response.expect("a tool result the model reads");
        assert_eq!(result.is_error, Some(true));
        assert!(
            first_text(&result)
                .is_some_and(|t| t.contains("`calculate`") && t.contains("`expression`")),
            "{result:?}"
        );
        assert_eq!(record.outcome, "invalid_args");

        let (response, record) = map_result(
            "read_file",
            Err(ToolError::NotConfigured {
                domain: "filesystem".into(),
                missing: vec!["filesystem_roots".into()],
            }),
            true,
        );
        let result = response.expect("tool result");
        assert_eq!(result.is_error, Some(true));
        assert!(first_text(&result).is_some_and(|t| t.contains("filesystem_roots")));
        assert_eq!(record.outcome, "not_configured");

        let (response, _) = map_result(
            "x",
            Err(ToolError::Panicked {
                name: "x".into(),
                message: "boom".into(),
            }),
            true,
        );
        assert_eq!(response.expect("tool result").is_error, Some(true));

        for (name, complete, says) in [
            ("nope", true, "tools/list"),
            ("nope", false, "search_tools"),
            ("load_tools", false, "call_tool"),
        ] {
            let (response, record) = map_result(
                name,
                Err(ToolError::UnknownTool { name: name.into() }),
                complete,
            );
            let error = response.expect_err("protocol error");
            assert_eq!(error.code, ErrorCode::INVALID_PARAMS);
            assert!(error.message.contains(says), "{}", error.message);
            assert_eq!(record.outcome, "unknown_tool");
        }
    }

    #[test]
    fn an_upstream_result_passes_through_whole() {
        let sent = json!({
            "content": [
                {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"},
                {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"},
                {"type": "resource_link", "uri": "file:///a.txt", "name": "a.txt", "mimeType": "text/plain"},
                {"type": "resource", "resource": {"uri": "file:///b.txt", "text": "bee", "mimeType": "text/plain"}},
                {"type": "text", "text": "done", "annotations": {"audience": ["user"]}}
            ],
            "structuredContent": {"width": 1, "height": 1},
            "_meta": {"io.modelcontextprotocol/related-task": {"taskId": "t"}, "vendor/x": 1}
        });
        let (response, record) = map_result("up__draw", Ok(CallOutput::Raw(sent.clone())), false);
        let result = response.expect("result");
        assert_eq!(record.outcome, "ok");
        let out = serde_json::to_value(&result).expect("JSON");
        assert_eq!(out["content"], sent["content"]);
        assert_eq!(out["structuredContent"], sent["structuredContent"]);
        assert_eq!(out["_meta"], json!({"vendor/x": 1}));

        let (response, record) = map_result(
            "up__fail",
            Ok(CallOutput::Raw(
                json!({"content": [{"type": "text", "text": "no such city"}], "isError": true}),
            )),
            false,
        );
        assert_eq!(response.expect("result").is_error, Some(true));
        assert_eq!(
            (record.outcome.as_str(), record.detail.as_deref()),
            ("execution", Some("no such city"))
        );
        let (response, _) = map_result("up__odd", Ok(CallOutput::Raw(json!({"x": 1}))), false);
        assert_eq!(response.expect("result").is_error, Some(true));
    }

    #[test]
    fn malformed_requests_name_what_is_wrong() {
        let cases = [
            (None, "`params`"),
            (Some(json!({})), "`name`"),
            (Some(json!({"name": 5})), "`name`"),
            (
                Some(json!({"name": "calculate", "arguments": "1+1"})),
                "`arguments`",
            ),
            (Some(json!([1])), "`params`"),
        ];
        for (params, field) in cases {
            let error = malformed_request("tools/call", params.as_ref());
            assert_eq!(error.code, ErrorCode::INVALID_PARAMS);
            assert!(error.message.contains(field), "{}", error.message);
        }
        assert_eq!(
            malformed_request("tools/list", Some(&json!({"cursor": 5}))).code,
            ErrorCode::INVALID_PARAMS
        );
        assert_eq!(
            malformed_request("tools/frobnicate", None).code,
            ErrorCode::METHOD_NOT_FOUND
        );
    }
}

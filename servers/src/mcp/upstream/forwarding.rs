//! Calls forwarded to an upstream server: its tools as registry tools, its
//! notifications, its results as JSON.

use std::sync::Weak;

use loadout::{CallFuture, ExternalCall, ToolError};
use rmcp::model::{CallToolResult, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::NotificationContext;
use rmcp::{ClientHandler, RoleClient};
use serde_json::Value;

use super::supervision::{Upstream, Wake};

/// rmcp client callbacks for one upstream.
pub struct UpstreamClient {
    pub(super) upstream: Weak<Upstream>,
}

impl ClientHandler for UpstreamClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("loadout", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(upstream) = self.upstream.upgrade() {
            let _ = upstream.wake.send(Wake::Relist);
        }
    }
}

/// The registry backend of one imported tool.
pub(super) struct ForwardedTool {
    pub(super) upstream: Weak<Upstream>,
    pub(super) original: String,
}

impl ForwardedTool {
    /// The call, its result mapped by `map` (flattened for chat, or as JSON).
    pub(super) fn forward(
        &self,
        args: Value,
        map: fn(CallToolResult) -> Result<Value, ToolError>,
    ) -> CallFuture {
        use tracing::Instrument as _;
        let upstream = self.upstream.upgrade();
        let original = self.original.clone();
        // Made here, not in the future: the registry runs that on a task of its own,
        // where the calling tool's span is no longer the current one.
        let span = match &upstream {
            Some(upstream) => crate::telemetry::upstream_span(&upstream.slug, &original),
            None => tracing::Span::none(),
        };
        Box::pin(async move {
            match upstream {
                Some(upstream) => map(upstream
                    .call_result(&original, args)
                    .instrument(span)
                    .await?),
                None => Err(ToolError::Execution(
                    "the upstream MCP server was shut down".into(),
                )),
            }
        })
    }
}

impl ExternalCall for ForwardedTool {
    fn call(&self, _tool: &str, args: Value) -> CallFuture {
        self.forward(args, result_value)
    }

    /// The upstream's `CallToolResult` unchanged (images, audio, links, embedded
    /// resources, its own structured content and `isError`), for `loadout mcp` to
    /// pass on.
    fn call_raw(&self, _tool: &str, args: Value) -> Option<CallFuture> {
        Some(self.forward(args, |result| {
            serde_json::to_value(result)
                .map_err(|e| ToolError::Execution(format!("upstream result is not JSON: {e}")))
        }))
    }
}

/// An upstream result as a registry value: its structured content, its text, or
/// (for images and other blocks) the content list as JSON. `isError` becomes an
/// execution error with the server's text.
pub(super) fn result_value(result: CallToolResult) -> Result<Value, ToolError> {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect();
    if result.is_error == Some(true) {
        let message = if texts.is_empty() {
            "the upstream tool reported an error".to_owned()
        } else {
            texts.join("\n")
        };
        return Err(ToolError::Execution(message));
    }
    if let Some(structured) = result.structured_content {
        return Ok(structured);
    }
    if texts.len() == result.content.len() {
        return Ok(Value::String(texts.join("\n")));
    }
    serde_json::to_value(&result.content)
        .map(|content| serde_json::json!({ "content": content }))
        .map_err(|e| ToolError::Execution(format!("upstream result is not JSON: {e}")))
}

pub(super) fn first_sentence(text: &str) -> String {
    let line = text.lines().next().unwrap_or(text);
    match line.find(". ") {
        Some(i) => line[..=i].to_owned(),
        None => line.to_owned(),
    }
}

//! The MCP `ServerHandler`: tools/list from the catalog, tools/call through
//! [`Registry::call`](loadout::Registry::call), one audit row per call.
//!
//! Error mapping, the one place it is decided: invalid arguments and unknown tools
//! are JSON-RPC errors (-32602) naming the field or the tool; everything else that
//! goes wrong once the call is routed (not configured, execution failure, panic, no
//! backend, storage) is a tool result with `isError: true` carrying the message, so
//! the model reads it.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use loadout::settings::mask_json_secrets;
use loadout::{ToolContext, ToolError};
use loadout_store::{AuditRow, now_ms};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    SubscriptionFilter, Tool as McpTool,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext, SubscriptionSink};
use rmcp::{ErrorData as McpError, Peer, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::catalog::Catalog;
use super::dynamic;
use crate::app::App;
use crate::log_writer::AuditWriter;

/// Longest argument JSON kept whole in the audit log; longer ones are cut.
const MAX_AUDIT_ARGS_BYTES: usize = 8 * 1024;

/// State every connection shares.
pub struct Shared {
    pub app: App,
    pub catalog: watch::Sender<Arc<Catalog>>,
    pub audit: AuditWriter,
    pub dynamic: bool,
}

impl Shared {
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.borrow().clone()
    }
}

/// One MCP connection (a stdio process, an HTTP session, or one stateless request).
#[derive(Clone)]
pub struct McpHandler {
    shared: Arc<Shared>,
    connection: Arc<Connection>,
    /// Serve only protocol versions with sessions: dynamic mode over HTTP keeps its
    /// loaded tools per session, which stateless (2026-07-28) requests do not have.
    sessions_only: bool,
}

/// Per-connection state. Dropped with the last handler clone, which also ends the
/// task that forwards catalog changes.
struct Connection {
    /// Tools loaded with `load_tools` (dynamic mode).
    loaded: Mutex<BTreeSet<String>>,
    /// The client of a session-based connection, kept from `notifications/initialized`.
    peer: Mutex<Option<Peer<RoleServer>>>,
    /// Open `subscriptions/listen` streams (2026-07-28 clients).
    sinks: Mutex<Vec<SubscriptionSink>>,
    watching_catalog: AtomicBool,
    alive: watch::Sender<()>,
}

impl McpHandler {
    pub fn new(shared: Arc<Shared>, sessions_only: bool) -> McpHandler {
        McpHandler {
            shared,
            connection: Arc::new(Connection {
                loaded: Mutex::new(BTreeSet::new()),
                peer: Mutex::new(None),
                sinks: Mutex::new(Vec::new()),
                watching_catalog: AtomicBool::new(false),
                alive: watch::Sender::new(()),
            }),
            sessions_only,
        }
    }

    /// What this connection lists: everything, or in dynamic mode core, the
    /// meta-tools and what was loaded.
    fn listed_tools(&self, catalog: &Catalog) -> Vec<McpTool> {
        let dynamic_mode = self.shared.dynamic;
        let loaded = lock(&self.connection.loaded);
        catalog
            .tools
            .iter()
            .filter(|t| dynamic::is_listed_meta(&t.name, dynamic_mode))
            .filter(|t| {
                !dynamic_mode
                    || dynamic::is_core(&catalog.registry, &t.name)
                    || loaded.contains(&*t.name)
            })
            .cloned()
            .collect()
    }

    fn is_listed(&self, catalog: &Catalog, name: &str) -> bool {
        !self.shared.dynamic
            || dynamic::is_core(&catalog.registry, name)
            || lock(&self.connection.loaded).contains(name)
    }

    /// Sends `notifications/tools/list_changed` to this connection's client, on
    /// whichever channel it has: its session, or its `subscriptions/listen` streams.
    async fn notify_tools_changed(&self, request_peer: Option<&Peer<RoleServer>>) {
        let peer = lock(&self.connection.peer).clone().or_else(|| {
            // A session whose `initialized` notification has not been seen yet.
            request_peer.filter(|p| p.peer_info().is_some()).cloned()
        });
        if let Some(peer) = peer
            && let Err(e) = peer.notify_tool_list_changed().await
        {
            tracing::debug!("tools/list_changed not sent: {e}");
        }
        let sinks = lock(&self.connection.sinks).clone();
        for sink in sinks {
            if let Err(e) = sink.notify_tool_list_changed().await {
                tracing::debug!("tools/list_changed not sent on a listen stream: {e}");
            }
        }
    }

    /// Forwards catalog changes (an upstream server's new tool list) to this
    /// connection's client, once per connection, for as long as it lives.
    fn watch_catalog(&self) {
        if self
            .connection
            .watching_catalog
            .swap(true, Ordering::AcqRel)
        {
            return;
        }
        let mut changes = self.shared.catalog.subscribe();
        let mut alive = self.connection.alive.subscribe();
        let shared = Arc::downgrade(&self.shared);
        let connection: Weak<Connection> = Arc::downgrade(&self.connection);
        let sessions_only = self.sessions_only;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { break },
                    // Err: the connection was dropped.
                    _ = alive.changed() => break,
                }
                let (Some(shared), Some(connection)) = (shared.upgrade(), connection.upgrade())
                else {
                    break;
                };
                let handler = McpHandler {
                    shared,
                    connection,
                    sessions_only,
                };
                handler.notify_tools_changed(None).await;
            }
        });
    }

    async fn call_meta_tool(
        &self,
        name: &str,
        args: &Value,
        catalog: &Catalog,
        request_peer: &Peer<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let registry = &catalog.registry;
        match name {
            dynamic::SEARCH_TOOLS => {
                let search = dynamic::parse_search_args(args)?;
                let loaded = lock(&self.connection.loaded).clone();
                // The first search builds the ranking; its dense stage follows in the
                // background (lexical until then), from the data dir's vector cache.
                let app = &self.shared.app;
                let attach = |router: &Arc<loadout_router::Router>| {
                    let (app, router) = (app.clone(), router.clone());
                    tokio::spawn(async move { app.attach_dense_stage_to(router).await });
                };
                let results: Vec<Value> = catalog
                    .search(&search.query, search.limit, &app.config().router, attach)
                    .into_iter()
                    .map(|hit| {
                        let listed = dynamic::is_core(registry, &hit.name)
                            || loaded.contains(hit.name.as_str());
                        let mut result = hit.to_json();
                        result["loaded"] = json!(listed);
                        result
                    })
                    .collect();
                let note = if results.is_empty() {
                    "No tool matched; try other words."
                } else {
                    "Load tools with load_tools (tool or domain names); they are then in your tool list."
                };
                Ok(success(json!({"results": results, "note": note})))
            }
            dynamic::LOAD_TOOLS => {
                let names = dynamic::parse_names(args)?;
                let (tools, unknown) = dynamic::resolve_names(registry, &names);
                if tools.is_empty() {
                    return Ok(tool_error(format!(
                        "unknown tool or domain: {}; search_tools finds names",
                        unknown.join(", ")
                    )));
                }
                let newly_loaded: Vec<String> = {
                    let mut loaded = lock(&self.connection.loaded);
                    tools
                        .iter()
                        .filter(|t| !dynamic::is_core(registry, t))
                        .filter(|t| loaded.insert((*t).clone()))
                        .cloned()
                        .collect()
                };
                if !newly_loaded.is_empty() {
                    self.notify_tools_changed(Some(request_peer)).await;
                }
                let needs_settings = self.missing_settings(catalog, &tools).await;
                let mut result = json!({
                    "loaded": newly_loaded,
                    "listed": tools,
                });
                if !unknown.is_empty() {
                    result["unknown"] = json!(unknown);
                }
                if !needs_settings.is_empty() {
                    result["needs_settings"] = json!(needs_settings);
                    result["note"] = json!(
                        "Some domains are not configured: set the keys listed (the set_setting tool does it) before calling their tools."
                    );
                }
                Ok(success(result))
            }
            dynamic::UNLOAD_TOOLS => {
                let names = dynamic::parse_names(args)?;
                let (tools, unknown) = dynamic::resolve_names(registry, &names);
                let unloaded: Vec<String> = {
                    let mut loaded = lock(&self.connection.loaded);
                    tools
                        .iter()
                        .filter(|t| loaded.remove(*t))
                        .cloned()
                        .collect()
                };
                if !unloaded.is_empty() {
                    self.notify_tools_changed(Some(request_peer)).await;
                }
                let mut result = json!({"unloaded": unloaded});
                if !unknown.is_empty() {
                    result["unknown"] = json!(unknown);
                }
                Ok(success(result))
            }
            other => Err(McpError::invalid_params(
                format!("unknown tool `{other}`"),
                Some(json!({"tool": other})),
            )),
        }
    }

    /// Domains among `tools` that still need settings, with the keys.
    async fn missing_settings(
        &self,
        catalog: &Catalog,
        tools: &BTreeSet<String>,
    ) -> BTreeMap<String, Vec<String>> {
        let Ok(settings) = self.shared.app.settings.snapshot().await else {
            return BTreeMap::new();
        };
        let domains: BTreeSet<&str> = tools
            .iter()
            .filter_map(|t| catalog.registry.tool(t))
            .map(|t| t.domain.as_str())
            .collect();
        domains
            .into_iter()
            .filter_map(|d| {
                let missing = catalog.registry.missing_settings(d, &settings);
                (!missing.is_empty()).then(|| (d.to_owned(), missing))
            })
            .collect()
    }

    async fn audit(
        &self,
        client: &str,
        tool: &str,
        args: &Value,
        call: &CallRecord,
        started: Instant,
    ) {
        self.shared
            .audit
            .record(AuditRow {
                at_ms: now_ms(),
                client: client.to_owned(),
                tool: tool.chars().take(128).collect(),
                args: audit_args(args),
                outcome: call.outcome.clone(),
                detail: call.detail.clone(),
                duration_ms: started.elapsed().as_secs_f64() * 1000.0,
            })
            .await;
    }
}

/// What the audit log keeps of one call's outcome.
struct CallRecord {
    outcome: String,
    detail: Option<String>,
}

impl ServerHandler for McpHandler {
    fn get_info(&self) -> ServerConfig {
        let mut config = ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("loadout", env!("CARGO_PKG_VERSION")));
        if self.shared.dynamic {
            config = config.with_instructions(
                "Only core tools are listed at first. Call search_tools to find a tool for a task, then load_tools with its name or domain; the tool list then includes it. unload_tools keeps the list short.",
            );
        }
        config
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        if self.sessions_only {
            Cow::Borrowed(ProtocolVersion::known_up_to(
                &ProtocolVersion::LATEST_WITH_INITIALIZE,
            ))
        } else {
            Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
        }
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        *lock(&self.connection.peer) = Some(context.peer);
        self.watch_catalog();
    }

    fn accepted_subscription_filter(
        &self,
        _requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(SubscriptionFilter::builder().tools_list_changed().build())
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), McpError> {
        let sink = context.sink().clone();
        let id = sink.id().clone();
        lock(&self.connection.sinks).push(sink);
        self.watch_catalog();
        context.cancelled().await;
        lock(&self.connection.sinks).retain(|s| *s.id() != id);
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let catalog = self.shared.catalog();
        Ok(ListToolsResult::with_all_items(self.listed_tools(&catalog)))
    }

    fn get_tool(&self, name: &str) -> Option<McpTool> {
        let catalog = self.shared.catalog();
        catalog.mcp_tool(name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let started = Instant::now();
        let client = client_name(&context);
        let name = request.name.to_string();
        let args = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        let catalog = self.shared.catalog();

        let (response, record) = if self.shared.dynamic && dynamic::is_meta_tool(&name) {
            let response = self
                .call_meta_tool(&name, &args, &catalog, &context.peer)
                .await;
            let record = match &response {
                Ok(result) if result.is_error == Some(true) => CallRecord {
                    outcome: "execution".into(),
                    detail: first_text(result),
                },
                Ok(_) => CallRecord {
                    outcome: "ok".into(),
                    detail: None,
                },
                Err(e) => CallRecord {
                    outcome: "invalid_args".into(),
                    detail: Some(e.message.to_string()),
                },
            };
            (response, record)
        } else if !self.is_listed(&catalog, &name) && catalog.registry.tool(&name).is_some() {
            let message = format!(
                "tool `{name}` is not loaded: call load_tools with [\"{name}\"] first, then call it"
            );
            let record = CallRecord {
                outcome: "not_loaded".into(),
                detail: Some(message.clone()),
            };
            (Ok(tool_error(message)), record)
        } else {
            let ctx = ToolContext::new(catalog.registry.clone(), self.shared.app.settings.clone())
                .with_client(client.clone());
            let result = catalog.registry.call(&name, args.clone(), ctx).await;
            map_result(&name, result, self.shared.dynamic)
        };
        self.audit(&client, &name, &args, &record, started).await;
        response.map(CallToolResponse::from)
    }
}

/// Maps a registry call's result onto MCP, and what the audit log keeps of it.
fn map_result(
    name: &str,
    result: Result<Value, ToolError>,
    dynamic: bool,
) -> (Result<CallToolResult, McpError>, CallRecord) {
    match result {
        Ok(value) => (
            Ok(success(value)),
            CallRecord {
                outcome: "ok".into(),
                detail: None,
            },
        ),
        Err(error) => {
            let record = CallRecord {
                outcome: error_kind(&error),
                detail: Some(error.to_string()),
            };
            let response = match &error {
                ToolError::InvalidArgs { field, .. } => Err(McpError::invalid_params(
                    error.to_string(),
                    Some(json!({"tool": name, "field": field})),
                )),
                ToolError::UnknownTool { name } => {
                    let how = if dynamic {
                        "search_tools finds tools by what they do"
                    } else {
                        "tools/list shows every tool"
                    };
                    Err(McpError::invalid_params(
                        format!("unknown tool `{name}`: no tool has this name; {how}"),
                        Some(json!({"tool": name})),
                    ))
                }
                _ if error.json_rpc_code().is_some() => Err(McpError::invalid_params(
                    error.to_string(),
                    Some(json!({"tool": name})),
                )),
                _ => Ok(tool_error(error.to_string())),
            };
            (response, record)
        }
    }
}

fn success(value: Value) -> CallToolResult {
    match value {
        Value::String(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
        // Objects go out as structured content too (with the same JSON as text for
        // clients that read only text).
        Value::Object(_) => CallToolResult::structured(value),
        other => CallToolResult::success(vec![ContentBlock::text(other.to_string())]),
    }
}

fn tool_error(message: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

fn first_text(result: &CallToolResult) -> Option<String> {
    result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
}

/// The `kind` tag of a tool error (`invalid_args`, `not_configured`, ...).
fn error_kind(error: &ToolError) -> String {
    serde_json::to_value(error)
        .ok()
        .and_then(|v| v.get("kind").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| "error".into())
}

/// The client's name from its `initialize` (or the request's metadata), for the
/// audit log; `mcp` when it gave none.
fn client_name(context: &RequestContext<RoleServer>) -> String {
    context
        .client_info()
        .map(|info| info.name.chars().take(64).collect::<String>())
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| "mcp".into())
}

/// Arguments as the audit log keeps them: secrets masked, size bounded.
fn audit_args(args: &Value) -> Value {
    let masked = mask_json_secrets(args);
    let text = masked.to_string();
    if text.len() <= MAX_AUDIT_ARGS_BYTES {
        return masked;
    }
    let mut cut = MAX_AUDIT_ARGS_BYTES;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    json!({"truncated": true, "bytes": text.len(), "prefix": &text[..cut]})
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_protocol_errors_or_tool_errors() {
        let (response, record) = map_result(
            "calculate",
            Err(ToolError::InvalidArgs {
                field: Some("expression".into()),
                message: "expected a string".into(),
            }),
            false,
        );
        let error = response.expect_err("protocol error");
        assert_eq!(error.code.0, -32602);
        assert!(error.message.contains("`expression`"));
        assert_eq!(record.outcome, "invalid_args");

        let (response, record) = map_result(
            "read_file",
            Err(ToolError::NotConfigured {
                domain: "filesystem".into(),
                missing: vec!["filesystem_roots".into()],
            }),
            false,
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
            false,
        );
        assert_eq!(response.expect("tool result").is_error, Some(true));
    }

    #[test]
    fn audit_args_mask_secrets_and_stay_small() {
        let masked = audit_args(&json!({"key": "llm_api_key", "value": "sk-123456789abcdef"}));
        assert!(!masked.to_string().contains("123456789"));
        let big = audit_args(&json!({"content": "x".repeat(100_000)}));
        assert_eq!(big["truncated"], json!(true));
        assert!(big.to_string().len() < 2 * MAX_AUDIT_ARGS_BYTES);
    }
}

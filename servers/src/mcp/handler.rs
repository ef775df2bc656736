//! The MCP `ServerHandler`: tools/list is the connection's view ([`super::view`]),
//! tools/call goes through [`Registry::call_passthrough`](loadout::Registry::call_passthrough),
//! one audit row per call under the name of the tool that ran.
//!
//! Error mapping, the one place it is decided: a tool that does not exist is a
//! JSON-RPC error (-32602) naming it, and so are `tools/call` params that are not an
//! object with a string `name`. Everything that goes wrong once a tool is found
//! (invalid arguments, not configured, execution failure, panic, no backend,
//! storage) is a tool result with `isError: true` carrying the message, so that the
//! model reads it and retries (SEP-1303). Inside `call_tool`, an unknown name is an
//! argument of `call_tool`, so a tool result too.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use loadout::ToolContext;
use loadout_store::{AuditRow, now_ms};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CustomRequest, CustomResult,
    ErrorCode, Implementation, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, SubscriptionFilter, Tool as McpTool,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext, SubscriptionSink};
use rmcp::{ErrorData as McpError, Peer, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::catalog::Catalog;
use super::meta;
use super::results::{CallRecord, malformed_request, map_result, success, tool_error};
use super::view::{View, ViewState};
use crate::app::App;
use crate::learning::{LearnEvent, LearnSource, LearnText, Learner, learning_allowed};
use crate::log_writer::{AuditWriter, audit_args};

/// A domain's use is written to the store at most this often (the warm rule only
/// needs the day it was last used).
const DOMAIN_USE_WRITE_INTERVAL_MS: i64 = 5 * 60 * 1000;
const DOMAIN_USE_WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
/// How long a `search_tools` query stays the reason for a call of a tool it found.
const SEARCH_TEACHES_FOR: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// State every connection shares.
pub struct Shared {
    pub app: App,
    /// Every tool: linked, toolkit and upstream domains.
    pub catalog: watch::Sender<Arc<Catalog>>,
    /// The domains used in the warm window, most recently used first: read when the
    /// server starts and when its tools or config change, never per request, so
    /// that a list with `--max-tools` does not change as a side effect of calls.
    pub warm: watch::Sender<Arc<[String]>>,
    pub audit: AuditWriter,
    views: Mutex<HashMap<View, Arc<ViewState>>>,
    /// When each domain's use was last written to the store.
    domain_use_written: Mutex<HashMap<String, i64>>,
    /// Learns `search_tools` queries from the calls that follow them, and keeps the
    /// learned index `search_tools` ranks with; started on the first search, over the
    /// router of that search (the cell follows the router when it is rebuilt).
    learner: std::sync::OnceLock<(Learner, Arc<std::sync::RwLock<Arc<loadout_router::Router>>>)>,
}

impl Shared {
    pub fn new(app: App, catalog: Arc<Catalog>, warm: Arc<[String]>, audit: AuditWriter) -> Shared {
        Shared {
            app,
            catalog: watch::Sender::new(catalog),
            warm: watch::Sender::new(warm),
            audit,
            views: Mutex::new(HashMap::new()),
            domain_use_written: Mutex::new(HashMap::new()),
            learner: std::sync::OnceLock::new(),
        }
    }

    /// Writes the learning events queued so far (at shutdown), for a few seconds at
    /// most.
    pub async fn flush_learning(&self) {
        if let Some((learner, _)) = self.learner.get() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), learner.flush()).await;
        }
    }

    /// The learner over `router` (the catalog's search router), started on first use.
    fn learner_for(&self, router: &Arc<loadout_router::Router>) -> Learner {
        let (learner, cell) = self.learner.get_or_init(|| {
            let cell = Arc::new(std::sync::RwLock::new(router.clone()));
            (Learner::start(self.app.store().clone(), cell.clone()), cell)
        });
        let mut current = cell.write().unwrap_or_else(|p| p.into_inner());
        if !Arc::ptr_eq(&current, router) {
            *current = router.clone();
            learner.rebuild_soon();
        }
        learner.clone()
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.borrow().clone()
    }

    /// The view's state for the catalog and warm domains in force, built once for
    /// each of them.
    pub fn view_state(&self, view: &View) -> Result<Arc<ViewState>, McpError> {
        let base = self.catalog();
        let warm = self.warm.borrow().clone();
        let mut views = lock(&self.views);
        let old = views.get(view);
        if let Some(state) = old.filter(|s| s.is_built_from(&base, &warm)) {
            return Ok(state.clone());
        }
        let state = ViewState::build(view, &base, &warm, old.map(|s| &**s))
            .map(Arc::new)
            .map_err(|e| McpError::internal_error(format!("tool list: {e}"), None))?;
        views.insert(view.clone(), state.clone());
        Ok(state)
    }

    /// Reads the warm domains again; connections whose list changes are told.
    pub async fn refresh_warm(&self) {
        let warm = read_warm(&self.app).await;
        self.warm.send_if_modified(|current| {
            let changed = **current != *warm;
            if changed {
                *current = warm;
            }
            changed
        });
    }

    /// Records that a tool's domain was used, for the warm rule (chat's, and this
    /// server's next start), at most every few minutes per domain. Waited for, but
    /// not long: a store that does not answer costs the call a second at most.
    async fn note_domain_use(&self, catalog: &Catalog, tool: &str) {
        let Some(domain) = catalog
            .registry
            .tool(tool)
            .and_then(|t| catalog.registry.domain(&t.domain))
            .filter(|d| !d.always_on)
        else {
            return;
        };
        let now = now_ms();
        {
            let mut written = lock(&self.domain_use_written);
            match written.get(&domain.name) {
                Some(&at) if now - at < DOMAIN_USE_WRITE_INTERVAL_MS => return,
                _ => written.insert(domain.name.clone(), now),
            };
        }
        let write = self.app.store().domain_used(&domain.name, now);
        match tokio::time::timeout(DOMAIN_USE_WRITE_TIMEOUT, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("use of domain `{}` not recorded: {e}", domain.name),
            Err(_) => tracing::warn!("use of domain `{}` not recorded in time", domain.name),
        }
    }
}

/// The domains used in the warm window, most recently used first; none when the
/// store cannot say (the list is then core and the meta-tools, which still reach all).
pub async fn read_warm(app: &App) -> Arc<[String]> {
    let since = now_ms() - crate::routing::WARM_WINDOW_MS;
    match app.store().domains_used_since_by_recency(since).await {
        Ok(domains) => domains.into_iter().map(|(domain, _)| domain).collect(),
        Err(e) => {
            tracing::warn!("warm domains unknown: {e}");
            Arc::from([])
        }
    }
}

/// One MCP connection (a stdio process, an HTTP session, or one stateless request)
/// to one view.
#[derive(Clone)]
pub struct McpHandler {
    shared: Arc<Shared>,
    view: Arc<View>,
    connection: Arc<Connection>,
}

/// Per-connection state. Dropped with the last handler clone, which also ends the
/// task that forwards list changes.
struct Connection {
    /// Stands for the connection in the learned memory's once-a-day rule.
    id: String,
    /// The latest `search_tools` query and the tools it returned.
    last_search: Mutex<Option<LastSearch>>,
    /// The client of a session-based connection, kept from `notifications/initialized`.
    peer: Mutex<Option<Peer<RoleServer>>>,
    /// Open `subscriptions/listen` streams (2026-07-28 clients).
    sinks: Mutex<Vec<SubscriptionSink>>,
    watching_catalog: AtomicBool,
    alive: watch::Sender<()>,
}

impl McpHandler {
    /// Cheap and spawns nothing: the HTTP service makes one per stateless request.
    pub fn new(shared: Arc<Shared>, view: Arc<View>) -> McpHandler {
        McpHandler {
            shared,
            view,
            connection: Arc::new(Connection {
                id: connection_id(),
                last_search: Mutex::new(None),
                peer: Mutex::new(None),
                sinks: Mutex::new(Vec::new()),
                watching_catalog: AtomicBool::new(false),
                alive: watch::Sender::new(()),
            }),
        }
    }

    fn state(&self) -> Result<Arc<ViewState>, McpError> {
        self.shared.view_state(&self.view)
    }

    /// Sends `notifications/tools/list_changed` to this connection's client, on
    /// whichever channel it has: its session, or its `subscriptions/listen` streams.
    async fn notify_tools_changed(&self) {
        let peer = lock(&self.connection.peer).clone();
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

    /// Tells this connection's client when its list changes (an upstream server's
    /// new tools, a reload), once per connection, for as long as it lives.
    fn watch_catalog(&self) {
        if self
            .connection
            .watching_catalog
            .swap(true, Ordering::AcqRel)
        {
            return;
        }
        let mut catalog = self.shared.catalog.subscribe();
        let mut warm = self.shared.warm.subscribe();
        let mut alive = self.connection.alive.subscribe();
        let shared = Arc::downgrade(&self.shared);
        let connection: Weak<Connection> = Arc::downgrade(&self.connection);
        let view = self.view.clone();
        let mut listed = self.state().map(|s| s.listed_names()).unwrap_or_default();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = catalog.changed() => if changed.is_err() { break },
                    changed = warm.changed() => if changed.is_err() { break },
                    // Err: the connection was dropped.
                    _ = alive.changed() => break,
                }
                let (Some(shared), Some(connection)) = (shared.upgrade(), connection.upgrade())
                else {
                    break;
                };
                let handler = McpHandler {
                    shared,
                    view: view.clone(),
                    connection,
                };
                let Ok(state) = handler.state() else {
                    continue;
                };
                let now = state.listed_names();
                if now != listed {
                    listed = now;
                    handler.notify_tools_changed().await;
                }
            }
        });
    }

    /// Runs one tool of the view, as a direct tools/call or through `call_tool`, and
    /// writes its audit row under its own name.
    async fn run(
        &self,
        state: &ViewState,
        name: &str,
        args: Value,
        client: &str,
        token_client: Option<&crate::clients::Client>,
        started: Instant,
    ) -> Result<CallToolResult, McpError> {
        let registry = &state.catalog.registry;
        // A client's token calls only its own tools (issue 40); a name no tool has
        // is answered as any unknown tool is.
        if let Some(outside) = token_client.filter(|c| {
            name != meta::SEARCH_TOOLS
                && registry.tool(name).is_some()
                && !c.may_use(registry, name)
        }) {
            let message = format!(
                "refused: tool `{name}` is not among the tools of client `{}`",
                outside.0.name
            );
            let record = CallRecord {
                outcome: "refused".into(),
                detail: Some(message.clone()),
            };
            self.audit(client, token_client, name, &args, &record, started)
                .await;
            return Err(McpError::invalid_params(
                message,
                Some(json!({"tool": name, "client": outside.0.name})),
            ));
        }
        let (response, record) = if name == meta::SEARCH_TOOLS {
            let result = self.search(state, &args, token_client).await;
            let record = CallRecord::of(&result, "invalid_args");
            (Ok(result), record)
        } else {
            let ctx = ToolContext::new(registry.clone(), self.shared.app.settings.clone())
                .with_client(client.to_owned());
            let result = registry.call_passthrough(name, args.clone(), ctx).await;
            map_result(name, result, state.complete)
        };
        if record.outcome == "ok" {
            self.shared.note_domain_use(&state.catalog, name).await;
            if name != meta::SEARCH_TOOLS {
                self.learn_from_search(name).await;
            }
        }
        self.audit(client, token_client, name, &args, &record, started)
            .await;
        response
    }

    /// `search_tools`: every tool of the view ranked by the router, with the full
    /// definition a client needs to call it.
    async fn search(
        &self,
        state: &ViewState,
        args: &Value,
        token_client: Option<&crate::clients::Client>,
    ) -> CallToolResult {
        let search = match meta::parse_search_args(args) {
            Ok(search) => search,
            Err(result) => return result,
        };
        // The first search builds the ranking; its dense stage follows in the
        // background (lexical until then), from the data dir's vector cache.
        let app = &self.shared.app;
        let attach = |router: &Arc<loadout_router::Router>| {
            let (app, router) = (app.clone(), router.clone());
            tokio::spawn(async move { app.attach_dense_stage_to(router).await });
        };
        let catalog = &state.catalog;
        let router = catalog.router(&app.config().router, attach);
        let learner = self.shared.learner_for(&router);
        let learned = learner.index_for(&router);
        // One read for every hit; without it the answer leaves configuration out.
        let settings = app.settings.snapshot().await.ok();
        let no_settings = std::collections::BTreeMap::new();
        let bound_by = settings.as_deref().unwrap_or(&no_settings);
        let vectors = crate::routing::message_vectors(&router, bound_by, &search.query).await;
        // A client's search ranks every tool and keeps the best of its own, so that it
        // still gets `limit` results.
        let ranked = match token_client {
            Some(_) => catalog.registry.all_tools().len(),
            None => search.limit,
        };
        let mut hits = router.search(
            &search.query,
            None,
            learned.as_deref(),
            vectors.as_ref(),
            ranked,
        );
        if let Some(client) = token_client {
            hits.retain(|hit| client.may_use(&catalog.registry, &hit.name));
            hits.truncate(search.limit);
        }
        if settings.as_deref().is_some_and(learning_allowed) {
            *lock(&self.connection.last_search) = Some(LastSearch {
                at: Instant::now(),
                query: search.query.clone(),
                tools: hits.iter().map(|h| h.name.to_string()).collect(),
            });
        }
        let listed: HashSet<&str> = state.listed.iter().map(|t| &*t.name).collect();
        let results: Vec<Value> = hits
            .iter()
            .filter_map(|hit| {
                let tool = catalog.mcp_tool(&hit.name)?;
                let mut result = json!({
                    "name": hit.name,
                    "domain": hit.domain,
                    "description": tool.description,
                    "inputSchema": tool.input_schema,
                    "listed": listed.contains(hit.name.as_str()),
                });
                if let Some(title) = &tool.title {
                    result["title"] = json!(title);
                }
                if let Some(annotations) = &tool.annotations {
                    result["annotations"] = json!(annotations);
                }
                if let Some(settings) = &settings {
                    let missing = catalog.registry.missing_settings(&hit.domain, settings);
                    result["configured"] = json!(missing.is_empty());
                    if !missing.is_empty() {
                        result["how_to_configure"] = json!(loadout::where_to_set(&missing));
                    }
                    result["needs_settings"] = json!(missing);
                }
                Some(result)
            })
            .collect();
        let note = if results.is_empty() {
            "No tool matched; try other words."
        } else {
            "Run one with call_tool {\"name\": ..., \"arguments\": {...}} (a listed one can also be called directly). A domain that is not configured needs its settings first: its how_to_configure says where they are set."
        };
        success(json!({"results": results, "note": note}))
    }

    /// A successful call of a tool the connection's latest `search_tools` returned
    /// (a few minutes ago at most) teaches that query the tool: MCP has no chat
    /// message, but the model's query says what it wanted. Only the first such call:
    /// the tools called after it are the workflow's next steps, not what was asked.
    async fn learn_from_search(&self, tool: &str) {
        let query = {
            let mut last = lock(&self.connection.last_search);
            match last.take() {
                Some(search)
                    if search.at.elapsed() <= SEARCH_TEACHES_FOR
                        && search.tools.iter().any(|t| t == tool) =>
                {
                    search.query
                }
                other => {
                    *last = other;
                    return;
                }
            }
        };
        let Some((learner, _)) = self.shared.learner.get() else {
            return;
        };
        match self.shared.app.settings.snapshot().await {
            Ok(settings) if learning_allowed(&settings) => {}
            _ => return,
        }
        learner.record(LearnEvent {
            message: LearnText::Message(query),
            tools: vec![tool.to_owned()],
            session: Some(self.connection.id.clone()),
            source: LearnSource::McpSearch,
        });
    }

    async fn audit(
        &self,
        client: &str,
        token_client: Option<&crate::clients::Client>,
        tool: &str,
        args: &Value,
        call: &CallRecord,
        started: Instant,
    ) {
        self.shared
            .audit
            .record_for(
                token_client,
                AuditRow {
                    at_ms: now_ms(),
                    client: client.to_owned(),
                    tool: tool.chars().take(128).collect(),
                    args: audit_args(args),
                    outcome: call.outcome.clone(),
                    detail: call.detail.clone(),
                    duration_ms: started.elapsed().as_secs_f64() * 1000.0,
                },
            )
            .await;
    }
}

impl ServerHandler for McpHandler {
    #[allow(deprecated)] // SEP-2577 deprecates logging; clients still call logging/setLevel.
    fn get_info(&self) -> ServerConfig {
        let mut config = ServerConfig::new(
            ServerCapabilities::builder()
                .enable_logging()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("loadout", env!("CARGO_PKG_VERSION")));
        if let Some(instructions) = self.state().ok().and_then(|s| s.instructions()) {
            config = config.with_instructions(instructions);
        }
        config
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

    /// Loadout sends no log messages, so every level is honoured as it is.
    #[allow(deprecated)] // SEP-2577, as above.
    async fn set_level(
        &self,
        _request: rmcp::model::SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let state = self.state()?;
        let listed = match token_client(&context) {
            // The same list for every request of that client's token.
            Some(client) => state
                .listed
                .iter()
                .filter(|tool| {
                    *tool.name == *meta::SEARCH_TOOLS
                        || *tool.name == *meta::CALL_TOOL
                        || client.may_use(&state.catalog.registry, &tool.name)
                })
                .cloned()
                .collect(),
            None => state.listed.clone(),
        };
        Ok(ListToolsResult::with_all_items(listed))
    }

    fn get_tool(&self, name: &str) -> Option<McpTool> {
        self.state().ok()?.definition(name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        use tracing::Instrument as _;
        if !crate::telemetry::enabled() {
            return self
                .call_tool_untraced(request, context)
                .await
                .map(Into::into);
        }
        // The call's span is a child of the caller's trace: `_meta.traceparent`
        // (SEP-414), else the HTTP request's `traceparent` header.
        let span = crate::telemetry::tool_span(&request.name);
        let from_meta = context
            .meta
            .get_traceparent()
            .or_else(|| request.meta.as_ref().and_then(|m| m.get_traceparent()))
            .map(str::to_owned);
        match from_meta {
            Some(traceparent) => {
                let state = context.meta.get_tracestate().map(str::to_owned);
                crate::telemetry::set_remote_parent(&span, &traceparent, state.as_deref());
            }
            None => {
                if let Some(parts) = context.extensions.get::<axum::http::request::Parts>() {
                    crate::telemetry::set_parent_from_headers(&span, &parts.headers);
                }
            }
        }
        let result = self
            .call_tool_untraced(request, context)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(result) if result.is_error == Some(true) => "error",
            Ok(_) => "ok",
            Err(_) => "error",
        };
        crate::telemetry::end_tool_span(&span, outcome);
        result.map(Into::into)
    }

    /// A request rmcp could not read as any request it knows, standard ones with bad
    /// params included (they fall through to here): -32602 naming the field for
    /// `tools/call` and the other standard methods, -32601 for unknown methods.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        Err(malformed_request(&request.method, request.params.as_ref()))
    }
}

impl McpHandler {
    async fn call_tool_untraced(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let started = Instant::now();
        let client = client_name(&context);
        let by_token = token_client(&context);
        let state = self.state()?;
        let name = request.name.to_string();
        let args = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        if name != meta::CALL_TOOL {
            let result = self
                .run(&state, &name, args, &client, by_token.as_ref(), started)
                .await?;
            return Ok(result);
        }
        let (inner, inner_args) = match meta::parse_call_args(&args) {
            Ok(parsed) => parsed,
            Err(result) => {
                let record = CallRecord::of(&result, "invalid_args");
                self.audit(&client, by_token.as_ref(), &name, &args, &record, started)
                    .await;
                return Ok(result);
            }
        };
        let listed = state.listed.iter().any(|tool| *tool.name == *inner);
        let result = match self
            .run(
                &state,
                &inner,
                inner_args,
                &client,
                by_token.as_ref(),
                started,
            )
            .await
        {
            // The name is `call_tool`'s argument: a mistake the model can fix.
            Err(e) if e.code == ErrorCode::INVALID_PARAMS => tool_error(format!(
                "call_tool: invalid arguments at `name`: {}",
                e.message
            )),
            other => other?,
        };
        // A tool the connection's list left out, run: a routing miss repaired.
        if !listed && result.is_error != Some(true) && state.catalog.registry.tool(&inner).is_some()
        {
            crate::metrics::record_miss_repaired("call_tool");
        }
        Ok(result)
    }
}

/// The Loadout client the request's token names (issue 40), if any.
fn token_client(context: &RequestContext<RoleServer>) -> Option<crate::clients::Client> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<crate::clients::Client>())
        .cloned()
}

/// The client's name for the audit log: the Loadout client its token names (issue
/// 40), else the name from its `initialize` (or the request's metadata); `mcp` when
/// it gave none.
fn client_name(context: &RequestContext<RoleServer>) -> String {
    if let Some(crate::clients::Client(row)) = token_client(context) {
        return row.name.clone();
    }
    context
        .client_info()
        .map(|info| info.name.chars().take(64).collect::<String>())
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| "mcp".into())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The latest `search_tools` of a connection.
struct LastSearch {
    at: Instant,
    query: String,
    tools: Vec<String>,
}

/// A connection's id for the learned memory: `mcp-` and 32 hex digits, unguessable
/// enough to keep connections apart (it names no stored session).
fn connection_id() -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let word = |salt: u64| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(n ^ salt);
        hasher.write_i64(now_ms());
        hasher.write_u32(std::process::id());
        hasher.finish()
    };
    format!("mcp-{:016x}{:016x}", word(0), word(u64::MAX))
}

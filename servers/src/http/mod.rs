//! `loadout serve`: the chat and dashboard server (axum).
//!
//! `app()` builds the whole router from state, so tests drive it with `oneshot`
//! and no socket. One module per resource; `error.rs` maps every failure to a
//! status and a JSON body. The dashboard is one embedded HTML page at `/`; the MCP
//! server is mounted at `/mcp`.

mod audit;
pub mod chat;
mod clients;
mod dashboard;
mod domains;
mod extract;
mod openapi;
mod prometheus;
mod route;
mod sessions;
mod settings;

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::app::App;
use crate::log_writer::AuditWriter;
use crate::mcp::{AllowedHosts, BearerToken, HostArgs, McpServer, SessionArgs};

pub use crate::api_error::ApiError;

/// Largest request body accepted (a chat message with some history).
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Longest a request may take, except a chat turn.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest a chat turn may take: every model step may use its whole timeout, plus a
/// minute for the tools.
pub const CHAT_TIMEOUT: Duration =
    Duration::from_secs(chat::MAX_STEPS as u64 * chat::llm::MODEL_TIMEOUT.as_secs() + 60);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to listen on; anything but loopback requires a bearer token.
    #[arg(long, default_value = "127.0.0.1:7878")]
    addr: SocketAddr,
    /// Also route and serve the toolkit files (`*.json`) of this directory; their
    /// tools answer "no backend" when called.
    #[arg(long, value_name = "DIR")]
    catalog: Option<std::path::PathBuf>,
    #[command(flatten)]
    hosts: HostArgs,
    #[command(flatten)]
    sessions: SessionArgs,
}

/// What every handler can reach.
#[derive(Clone, Debug)]
pub struct HttpState {
    pub app: App,
    /// Required bearer token, when the server is reachable beyond loopback.
    pub token: Option<BearerToken>,
    /// The Host names every route answers to (any, with a token).
    pub hosts: AllowedHosts,
    /// The bounds of `/mcp`'s sessions.
    pub sessions: SessionArgs,
    /// The audit log of tool calls (chat turns and `/mcp`).
    pub audit: AuditWriter,
    /// The model client, shared by every chat turn.
    pub llm: chat::llm::LlmClient,
    /// The MCP server mounted at `/mcp`, when started.
    pub mcp: Option<McpServer>,
    /// Tool definitions as `/api/route` sends them, cached as text.
    pub openai_definitions: Arc<route::OpenAiDefinitions>,
}

impl HttpState {
    /// State without the MCP endpoint; starts the audit writer on the current runtime.
    pub fn new(app: App, token: Option<BearerToken>) -> HttpState {
        let audit = AuditWriter::new(app.store().clone());
        let openai_definitions = Arc::new(route::OpenAiDefinitions::new(&app.registry));
        HttpState {
            openai_definitions,
            app,
            hosts: AllowedHosts::for_server(token.as_ref(), &HostArgs::default()),
            sessions: SessionArgs::default(),
            token,
            audit,
            llm: chat::llm::LlmClient::default(),
            mcp: None,
        }
    }

    /// Also answers requests for these host names (`--allowed-host`).
    pub fn with_allowed_hosts(mut self, args: &HostArgs) -> HttpState {
        self.hosts = AllowedHosts::for_server(self.token.as_ref(), args);
        self
    }

    /// Bounds `/mcp`'s sessions (`--mcp-max-sessions`, `--mcp-idle-minutes`).
    pub fn with_session_limits(mut self, sessions: SessionArgs) -> HttpState {
        self.sessions = sessions;
        self
    }

    /// Starts the MCP server that `/mcp` serves (sharing this state's audit writer).
    pub async fn with_mcp(mut self) -> anyhow::Result<HttpState> {
        let server = McpServer::start(
            self.app.clone(),
            self.audit.clone(),
            crate::mcp::Options::default(),
        )
        .await?;
        self.mcp = Some(server);
        Ok(self)
    }

    /// Chat and `/api/route` route the upstream MCP servers' tools too (`loadout.toml`):
    /// the app's registry becomes the one `/mcp` serves (linked, toolkit and upstream
    /// domains), and when an upstream's tool list changes, turns that start after it
    /// route with a router over the new registry. Calls to upstream tools go through
    /// the live connections. Call before anything routes: the router is built from
    /// the registry on first use.
    pub fn with_upstream_tools(mut self) -> HttpState {
        let Some(mcp) = &self.mcp else {
            return self;
        };
        // Subscribed first, so that a change right after the read is not missed.
        let changes = mcp.registry_changes();
        let registry = mcp.registry();
        if !Arc::ptr_eq(&registry, &self.app.registry) {
            // The OpenAI definitions cache follows the router's registry by itself.
            self.app = self.app.with_other_registry(registry);
        }
        // Followed even with no upstream server yet: a reload may add one.
        tokio::spawn(follow_upstream_tools(self.app.clone(), changes));
        self
    }

    /// Ends open MCP streams and writes every queued log row.
    pub async fn shutdown(&self) {
        if let Some(mcp) = &self.mcp {
            mcp.shutdown().await;
        }
        self.app.shutdown_routing().await;
    }
}

/// Replaces the router whenever the MCP server's registry changes; see
/// [`HttpState::with_upstream_tools`]. The indexes and token counts are built on a
/// blocking thread (a tenth of a second or more); the dense stage's vectors of new
/// tool texts follow in the background, as at start.
async fn follow_upstream_tools(app: App, mut changes: crate::mcp::RegistryChanges) {
    while let Some(registry) = changes.next().await {
        match app.replace_router(registry).await {
            Ok(router) => tracing::info!(
                "[router] upstream tools changed: routing {} tools",
                router.registry().all_tools().len()
            ),
            Err(e) => {
                tracing::warn!("upstream tools changed, but the router was not rebuilt: {e:#}");
                return;
            }
        }
    }
}

/// The whole HTTP application.
pub fn app(state: HttpState) -> Router {
    // Before any request: calls and turns are counted from the first one.
    crate::metrics::install();
    let api = Router::new()
        .route("/api/sessions", post(sessions::create))
        .route("/api/sessions/{id}", get(sessions::show))
        .route("/api/settings", get(settings::list))
        .route(
            "/api/settings/{key}",
            get(settings::show)
                .put(settings::put)
                .delete(settings::delete),
        )
        .route("/api/domains", get(domains::list))
        .route("/api/audit", get(audit::tail))
        .route("/api/clients", get(clients::list))
        .route("/metrics", get(prometheus::metrics))
        .route("/openapi.json", get(openapi::document))
        .route_layer(axum::middleware::from_fn_with_state(
            REQUEST_TIMEOUT,
            deadline,
        ));
    // The endpoints a client's own token may use (issue 40); the rest are the
    // operator's.
    let for_clients = Router::new()
        .route("/api/route", post(route::route))
        .route_layer(axum::middleware::from_fn_with_state(
            REQUEST_TIMEOUT,
            deadline,
        ))
        .route(
            "/api/chat",
            post(chat::chat)
                .route_layer(axum::middleware::from_fn_with_state(CHAT_TIMEOUT, deadline)),
        );
    let (api, for_clients) = match &state.token {
        Some(token) => (
            api.route_layer(axum::middleware::from_fn_with_state(
                token.clone(),
                crate::mcp::require_bearer,
            )),
            for_clients.route_layer(axum::middleware::from_fn_with_state(
                crate::clients::Gate {
                    token: token.clone(),
                    store: state.app.store().clone(),
                    limits: state.app.rate_limits.clone(),
                },
                crate::clients::require_operator_or_client,
            )),
        ),
        None => (api, for_clients),
    };
    let api = api.merge(for_clients);
    // The page holds no data: every call it makes goes through the API's auth.
    let page = Router::new()
        .route("/", get(dashboard::page))
        .route("/favicon.svg", get(dashboard::favicon))
        .route("/favicon.ico", get(dashboard::favicon))
        .route_layer(axum::middleware::from_fn_with_state(
            REQUEST_TIMEOUT,
            deadline,
        ));
    let mut router = api
        .merge(page)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(refuse_announced_oversize))
        .layer(axum::middleware::from_fn_with_state(
            state.hosts.clone(),
            crate::mcp::require_allowed_host,
        ))
        .with_state(state.clone());
    if let Some(mcp) = &state.mcp {
        // The same token and hosts as the API's, checked by the same middleware.
        router = router.merge(crate::mcp::http_router(
            mcp,
            state.token.clone(),
            state.hosts.clone(),
            &state.sessions,
        ));
    }
    // Outermost: the request's span covers its auth and its answer. Without a
    // collector the layer is left out, so requests pay nothing for it.
    if crate::telemetry::enabled() {
        router = router.layer(axum::middleware::from_fn(crate::telemetry::trace_request));
    }
    router
}

/// Answers a request that takes longer than `limit` with a JSON timeout error
/// (`from_fn_with_state(limit, deadline)`).
async fn deadline(
    axum::extract::State(limit): axum::extract::State<Duration>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout(format!(
            "the request took longer than {} s",
            limit.as_secs_f64()
        ))
        .into_response(),
    }
}

/// 413 at once for a body whose `Content-Length` is past [`MAX_BODY_BYTES`]: the
/// body limit alone would first wait for bytes that never come (30 s, then 400).
async fn refuse_announced_oversize(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    match crate::mcp::content_length(request.headers()) {
        Some(length) if length > MAX_BODY_BYTES as u64 => ApiError::PayloadTooLarge(format!(
            "request body of {length} bytes; at most {MAX_BODY_BYTES}"
        ))
        .into_response(),
        _ => next.run(request).await,
    }
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::NotFound(format!("no such endpoint: {}", uri.path()))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::MethodNotAllowed(format!("{method} is not allowed on {}", uri.path()))
}

pub async fn run(app: App, args: Args) -> anyhow::Result<ExitCode> {
    let token = BearerToken::for_address(args.addr, "loadout")?;
    // Before anything is built from the registry: chat, `/api/route` and `/mcp` all
    // see the toolkit domains (a toolkit domain named like a linked one is skipped).
    let app = match &args.catalog {
        Some(dir) => app.with_other_registry(crate::app::with_toolkits(&app.registry, dir)?),
        None => app,
    };
    crate::retention::spawn(app.store.clone(), app.settings.clone());
    let state = HttpState::new(app, token)
        .with_allowed_hosts(&args.hosts)
        .with_session_limits(args.sessions.clone())
        .with_mcp()
        .await?
        .with_upstream_tools();
    // Built before listening: the first routed message would otherwise wait for the
    // router's indexes and token counts (a third of a second) on a runtime thread.
    state.app.routing();
    state.app.attach_dense_stage().await;
    spawn_learn_examples(&state.app);
    tokio::spawn(crate::app::reload_on_hangup(state.app.clone()));
    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", args.addr))?;
    let local = listener.local_addr()?;
    eprintln!("loadout: serving on http://{local} (dashboard at /, MCP at /mcp)");
    let stopping = state.clone();
    crate::listener::serve(
        listener,
        self::app(state.clone()),
        crate::listener::Limits::default(),
        async move {
            shutdown_signal().await;
            // Open MCP streams end here, which lets the graceful shutdown finish.
            if let Some(mcp) = &stopping.mcp {
                mcp.shutdown().await;
            }
        },
    )
    .await;
    // Queued log rows are written; a stuck upstream server does not hold the exit.
    if tokio::time::timeout(crate::app::SHUTDOWN_GRACE, state.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "shutting down took longer than {} s: exiting",
            crate::app::SHUTDOWN_GRACE.as_secs()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Queues the examples of the tools served (linked and toolkit files) for the
/// learned memory, once, in the background (source `example`, no session).
fn spawn_learn_examples(app: &App) {
    let app = app.clone();
    tokio::spawn(async move {
        match app.settings.snapshot().await {
            Ok(settings) if crate::learning::learning_allowed(&settings) => {}
            _ => return,
        }
        let routing = app.routing();
        routing.learner.learn_examples(&routing.router()).await;
    });
}

/// Ctrl-C or SIGTERM: stop accepting, finish requests in flight.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    use super::*;

    #[tokio::test]
    async fn a_request_past_its_deadline_gets_a_json_timeout() {
        let app: Router = Router::new()
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "done"
                }),
            )
            .route("/fast", get(|| async { "done" }))
            .route_layer(axum::middleware::from_fn_with_state(
                Duration::from_millis(50),
                deadline,
            ));
        let get_path = |path: &'static str| {
            let app = app.clone();
            async move {
                let request = Request::get(path).body(Body::empty()).expect("request");
                let response = app.oneshot(request).await.expect("response");
                let status = response.status();
                let body = response.into_body().collect().await.expect("body");
                (status, body.to_bytes())
            }
        };
        let (status, body) = get_path("/slow").await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
        let body: serde_json::Value = serde_json::from_slice(&body).expect("JSON body");
        assert_eq!(body["error"]["kind"], "timeout", "{body}");
        let (status, body) = get_path("/fast").await;
        assert_eq!((status, &body[..]), (StatusCode::OK, &b"done"[..]));
    }
}

//! MCP over streamable HTTP: `/mcp` serves the server's view, `/mcp/domains/a,b`
//! core and domains `a` and `b` (tool groups, one endpoint per set, as GitHub's
//! toolsets and MCPJungle's groups do). Each endpoint is a service of its own with its
//! own sessions, so a session opened on one path is unknown on another.
//!
//! Bodies that are not MCP messages are answered here as JSON-RPC says (400 with a
//! JSON-RPC error), before rmcp, which would answer 415 in plain text.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::StreamableHttpServerConfig;
use rmcp::transport::StreamableHttpService;
use serde_json::{Value, json};
use tokio_stream::StreamExt as _;

use super::McpServer;
use super::auth::{self, AllowedHosts, BearerToken};
use super::handler::{McpHandler, Shared};
use super::jsonrpc::{self, Incoming};
use super::sessions::{BoundedSessions, SessionArgs, SessionLedger};
use super::view::{self, View};

/// Largest request body, as rmcp's own limit.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// A body not received within this is refused (a client that opens a request and
/// trickles bytes holds no connection for long).
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Distinct domain sets served at once; each keeps its sessions.
const MAX_DOMAIN_SETS: usize = 256;

type Service = StreamableHttpService<McpHandler, BoundedSessions>;

/// The MCP endpoints as an axum router. With a token, every request must carry it
/// (`Authorization: Bearer …`) and any `Host` and `Origin` is accepted; without one,
/// only the `hosts` (loopback and `--allowed-host`) are, in `Host` and `Origin`
/// (DNS-rebinding protection), checked before the body is read.
pub fn http_router(
    server: &McpServer,
    token: Option<BearerToken>,
    hosts: AllowedHosts,
    sessions: &SessionArgs,
) -> axum::Router {
    let mut config = StreamableHttpServerConfig::default();
    // rmcp checks the same list again, after the guard below.
    config = match hosts.names() {
        None => config.disable_allowed_hosts().disable_allowed_origins(),
        Some(names) => {
            let origins: Vec<String> = names
                .iter()
                .flat_map(|name| {
                    let host = if name.contains(':') {
                        format!("[{name}]")
                    } else {
                        name.clone()
                    };
                    [format!("http://{host}:*"), format!("https://{host}:*")]
                })
                .collect();
            config
                .with_allowed_hosts(names.iter().cloned())
                .with_allowed_origins(origins)
        }
    };
    let cancel = config.cancellation_token.clone();
    server
        .on_shutdown
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(Box::new(move || cancel.cancel()));
    let endpoints = Arc::new(Endpoints {
        shared: server.shared.clone(),
        view: server.view.clone(),
        config,
        domain_sets: Mutex::new(HashMap::new()),
        ledger: SessionLedger::new(sessions),
    });
    let ledger = endpoints.ledger.clone();
    let router = axum::Router::new()
        .route_service("/mcp", endpoints.service((*server.view).clone()))
        .route(
            "/mcp/domains/{set}",
            axum::routing::any(domain_set_endpoint),
        )
        .with_state(endpoints)
        .layer(axum::middleware::from_fn_with_state(ledger, jsonrpc_guard));
    let router = match token {
        // A client's token is served the view of its own domains (issue 40): the
        // request is checked, and its path chosen, before the MCP routes see it.
        Some(token) => {
            let gate = crate::clients::Gate {
                token,
                store: server.shared.app.store().clone(),
                limits: server.shared.app.rate_limits.clone(),
            };
            let gate = axum::routing::any(move |request: Request| {
                let (router, gate) = (router.clone(), gate.clone());
                async move { crate::clients::mcp_gate(gate, router, request).await }
            });
            axum::Router::new()
                .route("/mcp", gate.clone())
                .route("/mcp/domains/{set}", gate)
        }
        None => router,
    };
    // Outermost: a foreign Origin is refused before the body is parsed.
    router.layer(axum::middleware::from_fn_with_state(
        hosts,
        auth::require_allowed_host,
    ))
}

struct Endpoints {
    shared: Arc<Shared>,
    /// The server's view, which domain sets narrow.
    view: Arc<View>,
    config: StreamableHttpServerConfig,
    domain_sets: Mutex<HashMap<View, Service>>,
    /// Every endpoint's sessions, bounded together.
    ledger: Arc<SessionLedger>,
}

impl Endpoints {
    fn service(&self, view: View) -> Service {
        let (shared, view) = (self.shared.clone(), Arc::new(view));
        StreamableHttpService::new(
            move || Ok(McpHandler::new(shared.clone(), view.clone())),
            Arc::new(self.ledger.manager()),
            self.config.clone(),
        )
    }
}

/// `/mcp/domains/{set}`: core and the set's domains. A name that is no domain (now:
/// upstream servers come and go) is refused by name.
async fn domain_set_endpoint(
    State(endpoints): State<Arc<Endpoints>>,
    Path(set): Path<String>,
    request: Request,
) -> Response {
    let domains = view::parse_domain_set(&set);
    let registry = endpoints.shared.catalog().registry.clone();
    if domains.is_empty() {
        return jsonrpc_response(
            StatusCode::NOT_FOUND,
            jsonrpc::error(
                Value::Null,
                jsonrpc::INVALID_PARAMS,
                "no domain named: use /mcp/domains/a,b",
            ),
        );
    }
    if let Some((unknown, message)) = view::unknown_domains(&registry, &domains) {
        let mut body = jsonrpc::error(Value::Null, jsonrpc::INVALID_PARAMS, message);
        body["error"]["data"] = json!({"unknown": unknown});
        return jsonrpc_response(StatusCode::NOT_FOUND, body);
    }
    let view = View {
        domains: Some(domains),
        ..(*endpoints.view).clone()
    };
    let service = {
        let mut sets = endpoints
            .domain_sets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match sets.get(&view) {
            Some(service) => service.clone(),
            None if sets.len() >= MAX_DOMAIN_SETS => {
                return jsonrpc_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    jsonrpc::error(
                        Value::Null,
                        jsonrpc::INVALID_REQUEST,
                        format!("more than {MAX_DOMAIN_SETS} domain sets are in use"),
                    ),
                );
            }
            None => {
                let service = endpoints.service(view.clone());
                sets.insert(view, service.clone());
                service
            }
        }
    };
    service.handle(request).await.into_response()
}

/// Answers a POSTed JSON body that is not an MCP message: unparsable (-32700) or
/// not a message (-32600, or -32602 for a standard request's bad params), status 400
/// with the JSON-RPC error; an unknown notification is accepted and dropped (202).
/// A session ended by `DELETE` answers 204 where rmcp answers 202: the Python SDK
/// takes only 200 and 204 as success and warns on every close otherwise.
/// Everything else goes on to rmcp unchanged.
async fn jsonrpc_guard(
    State(ledger): State<Arc<SessionLedger>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() == Method::DELETE {
        let response = next.run(request).await;
        if response.status() != StatusCode::ACCEPTED {
            return response;
        }
        let (mut parts, _) = response.into_parts();
        parts.status = StatusCode::NO_CONTENT;
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.remove(header::CONTENT_TYPE);
        return Response::from_parts(parts, Body::empty());
    }
    let is_json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
        });
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    // Refused at once on what it announces, rather than after waiting for the body.
    if let Some(length) = content_length(request.headers())
        && length > MAX_BODY_BYTES as u64
    {
        return jsonrpc_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            jsonrpc::oversized(&[], &[], MAX_BODY_BYTES),
        );
    }
    if !is_json {
        // rmcp answers 415 in plain text; a client reads a JSON-RPC error.
        return jsonrpc_response(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            jsonrpc::error(
                Value::Null,
                jsonrpc::INVALID_REQUEST,
                "Invalid Request: POST /mcp takes a JSON-RPC message with Content-Type: application/json",
            ),
        );
    }
    let (parts, body) = request.into_parts();
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, read_body(body)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(refusal)) => return refusal,
        Err(_) => {
            return jsonrpc_response(
                StatusCode::REQUEST_TIMEOUT,
                jsonrpc::error(
                    Value::Null,
                    jsonrpc::INVALID_REQUEST,
                    format!(
                        "request body not received within {} s",
                        BODY_TIMEOUT.as_secs()
                    ),
                ),
            );
        }
    };
    match jsonrpc::classify(&bytes) {
        Incoming::Message(message) => {
            let opens_session = !parts.headers.contains_key("mcp-session-id")
                && matches!(
                    &*message,
                    rmcp::model::JsonRpcMessage::Request(r)
                        if matches!(r.request, rmcp::model::ClientRequest::InitializeRequest(_))
                );
            if opens_session && let Err(full) = ledger.admit().await {
                let mut response = jsonrpc_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    jsonrpc::error(
                        jsonrpc_id(&message),
                        jsonrpc::INVALID_REQUEST,
                        format!(
                            "{} MCP sessions are open, the most this server keeps; retry later",
                            full.max_sessions
                        ),
                    ),
                );
                let seconds = full.retry_after.as_secs().max(1);
                if let Ok(value) = header::HeaderValue::from_str(&seconds.to_string()) {
                    response.headers_mut().insert(header::RETRY_AFTER, value);
                }
                return response;
            }
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Incoming::Ignored => StatusCode::ACCEPTED.into_response(),
        Incoming::Reply(reply) => jsonrpc_response(StatusCode::BAD_REQUEST, reply),
    }
}

/// The body, at most [`MAX_BODY_BYTES`] (413 beyond, whatever `Content-Length` says).
async fn read_body(body: Body) -> Result<Vec<u8>, Response> {
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            jsonrpc_response(
                StatusCode::BAD_REQUEST,
                jsonrpc::error(
                    Value::Null,
                    jsonrpc::INVALID_REQUEST,
                    format!("request body unreadable: {e}"),
                ),
            )
        })?;
        if bytes.len() + chunk.len() > MAX_BODY_BYTES {
            let head_len = bytes.len().min(64 * 1024);
            return Err(jsonrpc_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                jsonrpc::oversized(&bytes[..head_len], &[], MAX_BODY_BYTES),
            ));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// The `Content-Length` a request announces, if it is a number.
pub fn content_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A request's id as JSON, `null` for other messages.
fn jsonrpc_id(message: &rmcp::model::ClientJsonRpcMessage) -> Value {
    match message {
        rmcp::model::JsonRpcMessage::Request(r) => {
            serde_json::to_value(&r.id).unwrap_or(Value::Null)
        }
        _ => Value::Null,
    }
}

fn jsonrpc_response(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

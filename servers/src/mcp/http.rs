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
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use serde_json::{Value, json};
use tokio_stream::StreamExt as _;

use super::McpServer;
use super::auth::BearerToken;
use super::handler::{McpHandler, Shared};
use super::jsonrpc::{self, Incoming};
use super::view::{self, View};

/// Largest request body, as rmcp's own limit.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
/// A body not received within this is refused (a client that opens a request and
/// trickles bytes holds no connection for long).
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Distinct domain sets served at once; each keeps its sessions.
const MAX_DOMAIN_SETS: usize = 256;

type Service = StreamableHttpService<McpHandler, LocalSessionManager>;

/// The MCP endpoints as an axum router. With a token, every request must carry it
/// (`Authorization: Bearer …`) and any `Host` and `Origin` is accepted; without one,
/// only loopback `Host` and `Origin` headers are (DNS-rebinding protection).
pub fn http_router(server: &McpServer, token: Option<BearerToken>) -> axum::Router {
    let mut config = StreamableHttpServerConfig::default();
    config = if token.is_some() {
        config.disable_allowed_hosts().disable_allowed_origins()
    } else {
        config.with_allowed_origins(["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*"])
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
    });
    let router = axum::Router::new()
        .route_service("/mcp", endpoints.service((*server.view).clone()))
        .route(
            "/mcp/domains/{set}",
            axum::routing::any(domain_set_endpoint),
        )
        .with_state(endpoints)
        .layer(axum::middleware::from_fn(jsonrpc_guard));
    match token {
        // A client's token is served the view of its own domains (issue 40): the
        // request is checked, and its path chosen, before the MCP routes see it.
        Some(token) => {
            let store = server.shared.app.store().clone();
            let gate = axum::routing::any(move |request: Request| {
                let (router, token, store) = (router.clone(), token.clone(), store.clone());
                async move { crate::clients::mcp_gate(token, store, router, request).await }
            });
            axum::Router::new()
                .route("/mcp", gate.clone())
                .route("/mcp/domains/{set}", gate)
        }
        None => router,
    }
}

struct Endpoints {
    shared: Arc<Shared>,
    /// The server's view, which domain sets narrow.
    view: Arc<View>,
    config: StreamableHttpServerConfig,
    domain_sets: Mutex<HashMap<View, Service>>,
}

impl Endpoints {
    fn service(&self, view: View) -> Service {
        let (shared, view) = (self.shared.clone(), Arc::new(view));
        StreamableHttpService::new(
            move || Ok(McpHandler::new(shared.clone(), view.clone())),
            Arc::new(LocalSessionManager::default()),
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
async fn jsonrpc_guard(request: Request, next: Next) -> Response {
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
    if request.method() != Method::POST || !is_json {
        return next.run(request).await;
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
        Incoming::Message(_) => {
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

fn jsonrpc_response(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

//! Clients told apart by their own bearer token (issue 40): the middleware that
//! recognises a client's token beside the operator's, and what a client may see.
//!
//! `LOADOUT_TOKEN` stays the operator's token, with everything; without a token (a
//! loopback address) nothing here runs.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use loadout::Registry;
use loadout_router::Selection;
use loadout_store::{ClientRow, Store, sha256_hex};

use crate::http::ApiError;
use crate::mcp::BearerToken;

/// The client a request's token named, in the request's extensions.
#[derive(Debug, Clone)]
pub struct Client(pub Arc<ClientRow>);

impl Client {
    /// Whether the client may see and call `tool`: a tool of an always-on domain, of
    /// one of its domains or one of its tools (every tool when it lists neither), and
    /// with `read_only` only tools marked read-only.
    pub fn may_use(&self, registry: &Registry, tool: &str) -> bool {
        let row = &self.0;
        let Some(tool) = registry.tool(tool) else {
            return false;
        };
        let always_on = registry.domain(&tool.domain).is_some_and(|d| d.always_on);
        let listed = (row.domains.is_empty() && row.tools.is_empty())
            || always_on
            || row.domains.contains(&tool.domain)
            || row.tools.iter().any(|t| *t == *tool.name);
        listed && (!row.read_only || tool.annotations.read_only == Some(true))
    }

    /// The selection as this client may see it: tools, hints and unconfigured domains
    /// outside its set are left out, and the counts follow.
    pub fn filter(&self, registry: &Registry, selection: &Selection) -> Selection {
        let mut seen = selection.clone();
        seen.tools.retain(|t| self.may_use(registry, &t.name));
        seen.hints.retain(|h| self.may_use(registry, &h.name));
        let row = &self.0;
        if !row.domains.is_empty() || !row.tools.is_empty() {
            seen.unconfigured
                .retain(|u| row.domains.iter().any(|d| *d == *u.domain));
        }
        seen.n_tools = seen.tools.len();
        seen.tokens = seen.tools.iter().map(|t| t.tokens).sum();
        seen
    }
}

/// axum middleware for the endpoints a client may use: the operator's token passes
/// as it is; a client's token passes with its [`Client`] in the request's extensions;
/// anything else gets 401, as [`crate::mcp::require_bearer`] answers.
pub async fn require_operator_or_client(
    State((token, store)): State<(BearerToken, Store)>,
    mut request: Request,
    next: Next,
) -> Response {
    match client_of(&token, &store, authorization_of(&request)).await {
        Ok(Some(client)) => {
            request.extensions_mut().insert(client);
            next.run(request).await
        }
        Ok(None) => next.run(request).await,
        Err(response) => response,
    }
}

/// The client a request's bearer token names: `Ok(None)` for the operator's token,
/// `Err` with the 401 answer for anything else.
async fn client_of(
    token: &BearerToken,
    store: &Store,
    authorization: Option<String>,
) -> Result<Option<Client>, Response> {
    if let Some(authorization) = authorization.as_deref() {
        if token.accepts(authorization) {
            return Ok(None);
        }
        // Only the hash is stored, so the lookup is by hash: a token that is not a
        // client's costs one indexed read.
        if let Some(presented) = bearer_credentials(authorization) {
            match store.client_by_token_hash(&sha256_hex(presented)).await {
                Ok(Some(row)) => return Ok(Some(Client(Arc::new(row)))),
                Ok(None) => {}
                Err(e) => return Err(ApiError::from(e).into_response()),
            }
        }
    }
    let mut response = ApiError::Unauthorized.into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    Err(response)
}

/// The MCP endpoints beyond loopback: the operator's token reaches the path asked
/// for; a client limited to domains is served `/mcp/domains/<its domains>` whatever
/// path it asks for, so that its `tools/list`, `search_tools` and `call_tool` are
/// that view's (a call outside it is refused by name, as any view refuses); a
/// client limited by tool names or to read-only tools is refused here, since no MCP
/// view serves those limits yet.
pub async fn mcp_gate(
    token: BearerToken,
    store: Store,
    mcp: axum::Router,
    mut request: Request,
) -> Response {
    use tower::ServiceExt as _;
    let client = match client_of(&token, &store, authorization_of(&request)).await {
        Ok(client) => client,
        Err(response) => return response,
    };
    if let Some(client) = &client {
        // rmcp hands the request's parts to the handler: the audit names the client.
        request.extensions_mut().insert(client.clone());
    }
    if let Some(Client(row)) = &client {
        if !row.tools.is_empty() || row.read_only {
            let message = format!(
                "client `{}` is limited by tool names or to read-only tools, which MCP does not serve yet; use /api/route",
                row.name
            );
            return (
                axum::http::StatusCode::FORBIDDEN,
                axum::Json(serde_json::json!({"error": {"kind": "forbidden", "message": message}})),
            )
                .into_response();
        }
        if !row.domains.is_empty() {
            let path = format!("/mcp/domains/{}", row.domains.join(","));
            let query = request
                .uri()
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default();
            match format!("{path}{query}").parse() {
                Ok(uri) => *request.uri_mut() = uri,
                Err(_) => return ApiError::BadRequest("bad request path".into()).into_response(),
            }
        }
    }
    match mcp.oneshot(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    }
}

/// The `Authorization` header, owned: a borrow of the request held across the
/// store's read would make the middleware's future not `Send`.
fn authorization_of(request: &Request) -> Option<String> {
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The token of an `Authorization: Bearer <token>` value (scheme in any case).
fn bearer_credentials(authorization: &str) -> Option<&str> {
    let (scheme, credentials) = authorization.split_once(' ')?;
    let credentials = credentials.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !credentials.is_empty()).then_some(credentials)
}

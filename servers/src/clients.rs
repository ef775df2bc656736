//! Clients told apart by their own bearer token (issue 40): the middleware that
//! recognises a client's token beside the operator's, and what a client may see.
//!
//! `LOADOUT_TOKEN` stays the operator's token, with everything; without a token (a
//! loopback address) nothing here runs.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    /// with `read_only` only tools marked read-only (and the session meta-tools).
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
        // The session meta-tools (`load_tools`, ...) change which tools a turn sends,
        // never data: a read-only client keeps them, and what they load is still
        // narrowed to its set.
        listed
            && (!row.read_only
                || tool.annotations.read_only == Some(true)
                || loadout::meta::ALL.contains(&&*tool.name))
    }

    /// Whether the client may hear of `domain` at all: always-on, one of its domains,
    /// or the domain of one of its tools (every domain when it lists neither).
    pub fn may_see_domain(&self, registry: &Registry, domain: &str) -> bool {
        let row = &self.0;
        (row.domains.is_empty() && row.tools.is_empty())
            || registry.domain(domain).is_some_and(|d| d.always_on)
            || row.domains.iter().any(|d| d == domain)
            || row
                .tools
                .iter()
                .any(|t| registry.tool(t).is_some_and(|t| *t.domain == *domain))
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

type Limiter = governor::DefaultDirectRateLimiter;
/// Each client's rate, and the limiter made for it.
type Limiters = HashMap<String, (NonZeroU32, Arc<Limiter>)>;

/// One `governor` limiter per client with a rate (`clients add --rate N/min`), shared
/// by `/api` and `/mcp` so that both count against one budget. A limiter is made at
/// a client's first request and made again when its rate changes (revoked and added
/// again); the operator's token has none.
#[derive(Debug, Clone, Default)]
pub struct RateLimits {
    limiters: Arc<Mutex<Limiters>>,
}

impl RateLimits {
    /// `Err(wait)` when the client is over its rate: how long until its next request
    /// would be let through.
    pub fn check(&self, client: &Client) -> Result<(), Duration> {
        let Some(rate) = client.0.rate_per_min.and_then(NonZeroU32::new) else {
            return Ok(());
        };
        let limiter = {
            let mut limiters = self
                .limiters
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            match limiters.get(&client.0.name) {
                Some((known, limiter)) if *known == rate => limiter.clone(),
                _ => {
                    // A whole minute's requests may come at once; then one every
                    // 60/N seconds.
                    let limiter = Arc::new(Limiter::direct(governor::Quota::per_minute(rate)));
                    limiters.insert(client.0.name.clone(), (rate, limiter.clone()));
                    limiter
                }
            }
        };
        limiter.check().map_err(|not_until| {
            use governor::clock::Clock as _;
            not_until.wait_time_from(governor::clock::DefaultClock::default().now())
        })
    }
}

/// What the client gates need: the operator's token, the store that knows the
/// clients' tokens, and the clients' rate limiters.
#[derive(Debug, Clone)]
pub struct Gate {
    pub token: BearerToken,
    pub store: Store,
    pub limits: RateLimits,
}

/// 429 with `Retry-After` (whole seconds, at least 1) for a client over its rate.
fn too_many_requests(client: &Client, wait: Duration, body: serde_json::Value) -> Response {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut response =
        (axum::http::StatusCode::TOO_MANY_REQUESTS, axum::Json(body)).into_response();
    response.headers_mut().insert(
        header::RETRY_AFTER,
        header::HeaderValue::from(seconds.max(1)),
    );
    tracing::debug!(
        "client `{}` over its rate: retry after {seconds} s",
        client.0.name
    );
    response
}

/// The message a client over its rate reads.
fn over_rate_message(client: &Client) -> String {
    format!(
        "client `{}` is over its rate of {} requests a minute; retry after the time in Retry-After",
        client.0.name,
        client.0.rate_per_min.unwrap_or_default()
    )
}

/// axum middleware for the endpoints a client may use: the operator's token passes
/// as it is; a client's token passes with its [`Client`] in the request's extensions,
/// within its rate (429 past it); anything else gets 401, as
/// [`crate::mcp::require_bearer`] answers.
pub async fn require_operator_or_client(
    State(gate): State<Gate>,
    mut request: Request,
    next: Next,
) -> Response {
    match client_of(&gate.token, &gate.store, authorization_of(&request)).await {
        Ok(Some(client)) => {
            if let Err(wait) = gate.limits.check(&client) {
                let body = serde_json::json!({"error": {"kind": "rate_limited", "message": over_rate_message(&client)}});
                return too_many_requests(&client, wait, body);
            }
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
/// for; a client over its rate gets 429 with a JSON-RPC error; a client limited to
/// domains only is served `/mcp/domains/<its domains>` whatever path it asks for.
/// The handler then narrows `tools/list`, `search_tools` and `call_tool` to what
/// [`Client::may_use`] allows (tool names, read-only), refusing a call outside by name.
pub async fn mcp_gate(gate: Gate, mcp: axum::Router, mut request: Request) -> Response {
    use tower::ServiceExt as _;
    let client = match client_of(&gate.token, &gate.store, authorization_of(&request)).await {
        Ok(client) => client,
        Err(response) => return response,
    };
    if let Some(client) = &client {
        if let Err(wait) = gate.limits.check(client) {
            // The request's id is not read (its body is not parsed here): JSON-RPC
            // answers an undetermined id with null.
            let body = serde_json::json!({
                "jsonrpc": "2.0",
                "id": null,
                "error": {"code": -32000, "message": over_rate_message(client), "data": {"retry_after_s": wait.as_secs_f64().ceil()}},
            });
            return too_many_requests(client, wait, body);
        }
        // rmcp hands the request's parts to the handler: the audit names the client,
        // and the lists and calls are narrowed to its tools.
        request.extensions_mut().insert(client.clone());
    }
    if let Some(Client(row)) = &client {
        // With tool names of its own, the client needs the whole view (its tools may
        // be of any domain); the handler narrows it.
        if !row.domains.is_empty() && row.tools.is_empty() {
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

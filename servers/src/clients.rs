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
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(authorization) = authorization {
        if token.accepts(&authorization) {
            return next.run(request).await;
        }
        if let Some(presented) = bearer_credentials(&authorization) {
            // Only the hash is stored, so the lookup is by hash: a token that is not
            // a client's costs one indexed read.
            match store.client_by_token_hash(&sha256_hex(presented)).await {
                Ok(Some(row)) => {
                    request.extensions_mut().insert(Client(Arc::new(row)));
                    return next.run(request).await;
                }
                Ok(None) => {}
                Err(e) => return ApiError::from(e).into_response(),
            }
        }
    }
    let mut response = ApiError::Unauthorized.into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    response
}

/// The token of an `Authorization: Bearer <token>` value (scheme in any case).
fn bearer_credentials(authorization: &str) -> Option<&str> {
    let (scheme, credentials) = authorization.split_once(' ')?;
    let credentials = credentials.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !credentials.is_empty()).then_some(credentials)
}

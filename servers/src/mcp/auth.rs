//! The one bearer-token check of every listener beyond loopback: `/api` and `/mcp` of
//! `loadout serve`, and `loadout mcp --http`; and the one Host/Origin check
//! (DNS-rebinding protection) of every listener without a token.
//!
//! The token is trimmed once, when it is loaded, and its length is checked after
//! that; a request must then present exactly it. The scheme is matched without regard
//! to case (RFC 9110 §11.1), and a refusal is the API's documented error body.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api_error::ApiError;

/// Shortest token accepted, after trimming.
pub const MIN_TOKEN_CHARS: usize = 16;

/// The token clients must send as `Authorization: Bearer <token>`.
#[derive(Clone)]
pub struct BearerToken(Arc<str>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(********)")
    }
}

impl BearerToken {
    /// A configured token, trimmed; refused when shorter than [`MIN_TOKEN_CHARS`]
    /// once trimmed, so that padding cannot make a short token pass.
    pub fn new(token: &str) -> anyhow::Result<BearerToken> {
        let token = token.trim();
        if token.chars().count() < MIN_TOKEN_CHARS {
            anyhow::bail!(
                "LOADOUT_TOKEN must be at least {MIN_TOKEN_CHARS} characters (surrounding spaces do not count)"
            );
        }
        Ok(BearerToken(token.into()))
    }

    /// A random token (192 bits from the OS), for when none is configured.
    pub fn generate() -> anyhow::Result<BearerToken> {
        let mut bytes = [0u8; 24];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
            .map_err(|e| anyhow::anyhow!("cannot read random bytes for a token: {e}"))?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(BearerToken(hex.into()))
    }

    /// The token a server on `addr` requires: none on loopback; `LOADOUT_TOKEN`, or a
    /// fresh random one printed once on stderr (after `announce`), on any other
    /// address. An empty `LOADOUT_TOKEN` counts as unset.
    pub fn for_address(addr: SocketAddr, announce: &str) -> anyhow::Result<Option<BearerToken>> {
        if !needs_token(&addr) {
            return Ok(None);
        }
        match std::env::var("LOADOUT_TOKEN") {
            Ok(token) if !token.trim().is_empty() => BearerToken::new(&token).map(Some),
            _ => {
                let token = BearerToken::generate()?;
                eprintln!(
                    "{announce}: listening beyond loopback; bearer token (shown once): {}",
                    token.as_str()
                );
                Ok(Some(token))
            }
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Constant-time in the content of the presented token (its length may show).
    pub fn matches(&self, presented: &str) -> bool {
        let expected = self.0.as_bytes();
        let presented = presented.as_bytes();
        let mut difference = expected.len() ^ presented.len();
        for (i, &b) in presented.iter().enumerate() {
            difference |= usize::from(
                b ^ expected
                    .get(i % expected.len().max(1))
                    .copied()
                    .unwrap_or(0),
            );
        }
        difference == 0
    }

    /// Whether an `Authorization` header value carries this token: scheme `Bearer`
    /// in any case, then the token exactly.
    pub fn accepts(&self, authorization: &str) -> bool {
        let Some((scheme, credentials)) = authorization.split_once(' ') else {
            return false;
        };
        scheme.eq_ignore_ascii_case("bearer") && self.matches(credentials.trim_start_matches(' '))
    }
}

/// `--allowed-host`: the Host names a server without a token answers to, besides
/// loopback's.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct HostArgs {
    /// Also answer requests for this host name (e.g. a name in /etc/hosts that points
    /// to loopback); repeat or separate with commas. Without a token, any other
    /// `Host` or `Origin` is refused with 403 (DNS-rebinding protection).
    #[arg(
        long = "allowed-host",
        value_name = "HOST",
        env = "LOADOUT_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
}

/// Host names (no port) a server answers to; `None`: any (a server with a token,
/// where the token is what keeps other sites out).
#[derive(Clone, Debug)]
pub struct AllowedHosts(Option<Arc<[String]>>);

impl AllowedHosts {
    /// `localhost`, `127.0.0.1` and `::1`, and `extra` (lowercased, without brackets).
    pub fn loopback_and(extra: &[String]) -> AllowedHosts {
        let names = ["localhost", "127.0.0.1", "::1"]
            .into_iter()
            .map(str::to_owned)
            .chain(extra.iter().map(|h| normalize_host(h)))
            .filter(|h| !h.is_empty())
            .collect();
        AllowedHosts(Some(names))
    }

    /// The rule of a server: with a token, any host; else loopback and `args`'.
    pub fn for_server(token: Option<&BearerToken>, args: &HostArgs) -> AllowedHosts {
        match token {
            Some(_) => AllowedHosts(None),
            None => AllowedHosts::loopback_and(&args.allowed_hosts),
        }
    }

    /// The names allowed, `None` for any.
    pub fn names(&self) -> Option<&[String]> {
        self.0.as_deref()
    }

    /// Why a request with these headers is refused, if it is: its `Host` (or the
    /// URI's authority, as HTTP/2 sends it) or its `Origin` names a host not allowed.
    /// A request with neither is no browser's, so no rebinding.
    pub fn refusal(&self, uri: &axum::http::Uri, headers: &HeaderMap) -> Option<String> {
        let allowed = self.0.as_deref()?;
        let allows = |host: &str| allowed.iter().any(|a| *a == normalize_host(host));
        let host = match headers.get(header::HOST) {
            Some(value) => match value
                .to_str()
                .ok()
                .and_then(|v| axum::http::uri::Authority::try_from(v).ok())
            {
                Some(authority) => Some(authority.host().to_owned()),
                None => return Some("the Host header is malformed".to_owned()),
            },
            None => uri.authority().map(|a| a.host().to_owned()),
        };
        if let Some(host) = host
            && !allows(&host)
        {
            return Some(format!(
                "Host `{}` is not allowed (DNS-rebinding protection); start the server with --allowed-host to allow it",
                host.chars().take(64).collect::<String>()
            ));
        }
        let origin = headers.get(header::ORIGIN)?;
        let origin_host = origin
            .to_str()
            .ok()
            .and_then(|v| axum::http::Uri::try_from(v).ok())
            .filter(|u| matches!(u.scheme_str(), Some("http" | "https")))
            .and_then(|u| u.host().map(str::to_owned));
        match origin_host {
            Some(host) if allows(&host) => None,
            _ => Some(format!(
                "Origin `{}` is not allowed (DNS-rebinding protection)",
                String::from_utf8_lossy(origin.as_bytes())
                    .chars()
                    .take(64)
                    .collect::<String>()
            )),
        }
    }
}

fn normalize_host(host: &str) -> String {
    host.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

/// axum middleware: 403 unless the request's Host and Origin are allowed, checked
/// before anything reads the body. `/mcp` answers with a JSON-RPC error, the rest
/// with the API's error body.
pub async fn require_allowed_host(
    State(hosts): State<AllowedHosts>,
    request: Request,
    next: Next,
) -> Response {
    let Some(reason) = hosts.refusal(request.uri(), request.headers()) else {
        return next.run(request).await;
    };
    tracing::warn!("refused a request: {reason}");
    if request.uri().path().starts_with("/mcp") {
        let body = super::jsonrpc::error(
            serde_json::Value::Null,
            super::jsonrpc::INVALID_REQUEST,
            reason,
        );
        (
            StatusCode::FORBIDDEN,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    } else {
        ApiError::Forbidden(reason).into_response()
    }
}

/// Whether an address needs a token: anything but loopback.
pub fn needs_token(addr: &SocketAddr) -> bool {
    !addr.ip().is_loopback()
}

/// axum middleware: 401 (`{"error": {"kind": "unauthorized", …}}`) unless the
/// request carries the bearer token.
pub async fn require_bearer(
    State(token): State<BearerToken>,
    request: Request,
    next: Next,
) -> Response {
    let accepted = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| token.accepts(v));
    if accepted {
        next.run(request).await
    } else {
        let mut response = ApiError::Unauthorized.into_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_only_themselves() {
        let token = BearerToken::new("0123456789abcdef").expect("token");
        assert!(token.matches("0123456789abcdef"));
        assert!(!token.matches("0123456789abcdeF"));
        assert!(!token.matches("0123456789abcdef0"));
        assert!(!token.matches(""));
        assert!(BearerToken::new("short").is_err());
        let generated = BearerToken::generate().expect("token");
        assert_eq!(generated.as_str().len(), 48);
    }

    /// Issue 31, defect 7: the token is trimmed once at load (a padded token still
    /// works), a padded short token is refused, and the scheme's case does not matter.
    #[test]
    fn one_rule_for_the_token_and_the_scheme() {
        let padded = BearerToken::new("  0123456789abcdef-token \n").expect("token");
        assert!(padded.accepts("Bearer 0123456789abcdef-token"));
        assert!(padded.accepts("bearer 0123456789abcdef-token"));
        assert!(padded.accepts("BEARER  0123456789abcdef-token"));
        assert!(!padded.accepts("Bearer  0123456789abcdef-token x"));
        assert!(!padded.accepts("Basic 0123456789abcdef-token"));
        assert!(!padded.accepts("Bearer"));
        assert!(!padded.accepts("0123456789abcdef-token"));
        let short = BearerToken::new("   short-token      ");
        assert!(
            short.is_err(),
            "a short token padded to 16 characters passed"
        );
    }
}

//! The one bearer-token check of every listener beyond loopback: `/api` and `/mcp` of
//! `loadout serve`, and `loadout mcp --http`.
//!
//! The token is trimmed once, when it is loaded, and its length is checked after
//! that; a request must then present exactly it. The scheme is matched without regard
//! to case (RFC 9110 §11.1), and a refusal is the API's documented error body.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::http::ApiError;

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

//! Bearer-token check for the MCP HTTP endpoint when it listens beyond loopback.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The token clients must send as `Authorization: Bearer <token>`.
#[derive(Clone)]
pub struct BearerToken(Arc<str>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(********)")
    }
}

impl BearerToken {
    /// A token must be long enough not to be guessed.
    pub fn new(token: &str) -> anyhow::Result<BearerToken> {
        let token = token.trim();
        if token.len() < 16 {
            anyhow::bail!("LOADOUT_TOKEN must be at least 16 characters");
        }
        Ok(BearerToken(token.into()))
    }

    /// A random token (128 bits from the OS), for when none is configured.
    pub fn generate() -> anyhow::Result<BearerToken> {
        let mut bytes = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
            .map_err(|e| anyhow::anyhow!("cannot read random bytes for a token: {e}"))?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(BearerToken(hex.into()))
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
}

/// Whether an address needs a token: anything but loopback.
pub fn needs_token(addr: &SocketAddr) -> bool {
    !addr.ip().is_loopback()
}

/// axum middleware: 401 unless the request carries the bearer token.
pub async fn require_bearer(
    State(token): State<BearerToken>,
    request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match presented {
        Some(presented) if token.matches(presented) => next.run(request).await,
        _ => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            axum::Json(serde_json::json!({
                "error": "unauthorized: send `Authorization: Bearer <LOADOUT_TOKEN>`"
            })),
        )
            .into_response(),
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
        assert_eq!(generated.as_str().len(), 32);
    }
}

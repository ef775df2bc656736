//! Bearer-token auth for servers reachable beyond loopback.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, HttpState};

/// The token the server will require: none on loopback; `LOADOUT_TOKEN`, or a fresh
/// random one printed once, on any other address.
pub fn token_for(addr: SocketAddr) -> anyhow::Result<Option<Arc<str>>> {
    if addr.ip().is_loopback() {
        return Ok(None);
    }
    if let Ok(token) = std::env::var("LOADOUT_TOKEN") {
        if token.len() < 16 {
            anyhow::bail!("LOADOUT_TOKEN must be at least 16 characters");
        }
        return Ok(Some(token.into()));
    }
    let token = random_token()?;
    eprintln!("loadout: listening beyond loopback; bearer token (shown once): {token}");
    Ok(Some(token.into()))
}

pub async fn require_token(
    State(state): State<HttpState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(expected) = &state.token else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        next.run(request).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}

/// Compares without an early exit, so timing does not reveal a matching prefix.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8;
    for (i, &byte) in b.iter().enumerate() {
        diff |= a.get(i).copied().unwrap_or(0) ^ byte;
    }
    diff == 0 && a.len() == b.len()
}

fn random_token() -> anyhow::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn compares_whole_tokens() {
        assert!(constant_time_eq(b"secret-token", b"secret-token"));
        assert!(!constant_time_eq(b"secret-toke", b"secret-token"));
        assert!(!constant_time_eq(b"secret-token!", b"secret-token"));
        assert!(!constant_time_eq(b"", b"secret-token"));
    }
}

//! Issue 31's hardening: one auth rule for `/api` and `/mcp`, settings the model may
//! not set, listener limits, private files, refused non-regular files, lost
//! databases. Each test failed before its fix.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};

use crate::support::send_request;

/// `/api` and `/mcp` of `loadout serve`, with `token` required.
async fn app_with_mcp(token: &str) -> (tempfile::TempDir, axum::Router) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = loadout_server::app::Config::in_data_dir(dir.path().to_path_buf());
    let app = loadout_server::app::App::open(&config)
        .await
        .expect("open app");
    let token = loadout_server::mcp::BearerToken::new(token).expect("token");
    let state = loadout_server::http::HttpState::new(app, Some(token))
        .with_mcp()
        .await
        .expect("mcp");
    (dir, loadout_server::http::app(state))
}

fn request(uri: &str, authorization: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder().uri(uri).header("host", "localhost");
    if uri == "/mcp" {
        builder = builder
            .method("POST")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
    }
    if let Some(authorization) = authorization {
        builder = builder.header("authorization", authorization);
    }
    let body = if uri == "/mcp" {
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "auth-test", "version": "1"}}})
        .to_string()
    } else {
        String::new()
    };
    builder.body(Body::from(body)).expect("request")
}

/// Defect 7: a token configured with surrounding spaces works on both paths, the
/// scheme is case-insensitive on both, and both refuse with the documented body.
#[tokio::test]
async fn api_and_mcp_share_one_bearer_check() {
    let (_dir, app) = app_with_mcp("  0123456789abcdef-token \n").await;
    for uri in ["/api/domains", "/mcp"] {
        for authorization in [
            "Bearer 0123456789abcdef-token",
            "bearer 0123456789abcdef-token",
            "BEARER 0123456789abcdef-token",
        ] {
            let (status, body) = send_request(&app, request(uri, Some(authorization))).await;
            assert_eq!(
                status,
                StatusCode::OK,
                "{uri} with `{authorization}`: {}",
                String::from_utf8_lossy(&body)
            );
        }
        for authorization in [
            None,
            Some("Bearer wrong-token-of-enough-length"),
            Some("Bearer  0123456789abcdef-token x"),
            Some("Basic 0123456789abcdef-token"),
        ] {
            let (status, body) = send_request(&app, request(uri, authorization)).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri} {authorization:?}");
            let body: Value = serde_json::from_slice(&body).expect("JSON body");
            assert_eq!(body["error"]["kind"], "unauthorized", "{uri}: {body}");
            assert!(body["error"]["message"].is_string(), "{uri}: {body}");
        }
    }
}

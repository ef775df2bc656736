//! Issue 36's hardening: one Host/Origin rule for every route, bounded MCP
//! sessions, writes that wait instead of failing, errors by the book. Each test
//! failed before its fix.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};

use crate::support::send_request;

/// `loadout serve` on loopback (no token), `/mcp` included, answering also to
/// `extra_hosts`.
async fn loopback_app(extra_hosts: &[&str]) -> (tempfile::TempDir, axum::Router) {
    loopback_app_with(extra_hosts, loadout_server::mcp::SessionArgs::default()).await
}

async fn loopback_app_with(
    extra_hosts: &[&str],
    sessions: loadout_server::mcp::SessionArgs,
) -> (tempfile::TempDir, axum::Router) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = loadout_server::app::Config::in_data_dir(dir.path().to_path_buf());
    let app = loadout_server::app::App::open(&config)
        .await
        .expect("open app");
    let hosts = loadout_server::mcp::HostArgs {
        allowed_hosts: extra_hosts.iter().map(|h| (*h).to_owned()).collect(),
    };
    let state = loadout_server::http::HttpState::new(app, None)
        .with_allowed_hosts(&hosts)
        .with_session_limits(sessions)
        .with_mcp()
        .await
        .expect("mcp");
    (dir, loadout_server::http::app(state))
}

fn with_host(
    method: &str,
    uri: &str,
    host: &str,
    origin: Option<&str>,
    body: &str,
) -> Request<Body> {
    let mut builder = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", host)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(origin) = origin {
        builder = builder.header("origin", origin);
    }
    builder.body(Body::from(body.to_owned())).expect("request")
}

fn initialize() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "hardening-test", "version": "1"}}})
    .to_string()
}

/// N2: a DNS-rebinding page (Host and Origin `evil.example`) could read and write
/// settings through `/api` of a loopback server, which `/mcp` refused.
#[tokio::test]
async fn every_route_refuses_a_foreign_host_or_origin() {
    let (_dir, app) = loopback_app(&["loadout.test"]).await;
    let put = json!({"value": "[\"/\"]"}).to_string();
    let evil = "http://evil.example:7878";
    for (method, uri, body) in [
        ("PUT", "/api/settings/filesystem_roots", put.as_str()),
        ("GET", "/api/settings", ""),
        ("GET", "/api/settings/filesystem_roots", ""),
        ("POST", "/api/sessions", "{}"),
        ("GET", "/metrics", ""),
        ("GET", "/", ""),
    ] {
        for (host, origin) in [
            ("evil.example:7878", Some(evil)),
            ("evil.example:7878", None),
            ("localhost:7878", Some(evil)),
            ("127.0.0.1:7878", Some("null")),
        ] {
            let request = with_host(method, uri, host, origin, body);
            let (status, bytes) = send_request(&app, request).await;
            assert_eq!(
                status,
                StatusCode::FORBIDDEN,
                "{method} {uri} Host {host} Origin {origin:?}: {}",
                String::from_utf8_lossy(&bytes)
            );
            let body: Value = serde_json::from_slice(&bytes).expect("JSON body");
            assert_eq!(body["error"]["kind"], "forbidden", "{body}");
        }
    }
    // Loopback names (and the configured one) pass, and nothing was written.
    for host in [
        "localhost:7878",
        "127.0.0.1:7878",
        "[::1]:7878",
        "LOCALHOST",
        "loadout.test:80",
    ] {
        let origin = format!("http://{host}");
        let request = with_host("GET", "/api/settings", host, Some(&origin), "");
        let (status, bytes) = send_request(&app, request).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "Host {host}: {}",
            String::from_utf8_lossy(&bytes)
        );
    }
    let request = with_host(
        "GET",
        "/api/settings/filesystem_roots",
        "localhost",
        None,
        "",
    );
    let (status, _) = send_request(&app, request).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "the refused PUT wrote nothing"
    );
    // `/mcp` follows the same list, rmcp's own check included.
    let request = with_host(
        "POST",
        "/mcp",
        "loadout.test:7878",
        Some("http://loadout.test:7878"),
        &initialize(),
    );
    let (status, bytes) = send_request(&app, request).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
}

/// N8: `POST /mcp` with a foreign Origin and a body that is no JSON was answered
/// -32700 (parsed first); the Origin is refused first, with a JSON-RPC body.
#[tokio::test]
async fn mcp_refuses_a_foreign_origin_before_parsing() {
    let (_dir, app) = loopback_app(&[]).await;
    for origin in ["http://evil.example:7878", "null"] {
        let request = with_host("POST", "/mcp", "localhost:7878", Some(origin), "{not json");
        let (status, bytes) = send_request(&app, request).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{}",
            String::from_utf8_lossy(&bytes)
        );
        let body: Value = serde_json::from_slice(&bytes).expect("JSON-RPC body");
        assert_eq!(body["jsonrpc"], "2.0", "{body}");
        assert_eq!(body["error"]["code"], -32600, "{body}");
    }
    let request = with_host("POST", "/mcp", "evil.example", None, &initialize());
    let (status, _) = send_request(&app, request).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// N3: every `initialize` opened a session kept 300 s, without bound (20,000 in
/// 12 s took 2.1 GB). At the cap, and with no session idle long enough to close,
/// `initialize` gets 503 with Retry-After; a closed session frees its slot.
#[tokio::test]
async fn mcp_sessions_are_capped() {
    use tower::ServiceExt as _;
    let sessions = loadout_server::mcp::SessionArgs {
        max_sessions: 2,
        idle_minutes: 30,
    };
    let (_dir, app) = loopback_app_with(&[], sessions).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let request = with_host("POST", "/mcp", "localhost", None, &initialize());
        let response = app.clone().oneshot(request).await.expect("response");
        assert_eq!(response.status(), StatusCode::OK);
        let id = response
            .headers()
            .get("mcp-session-id")
            .expect("a session id")
            .to_str()
            .expect("ASCII")
            .to_owned();
        ids.push(id);
    }
    let request = with_host("POST", "/mcp", "localhost", None, &initialize());
    let response = app.clone().oneshot(request).await.expect("response");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let retry_after: u64 = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in seconds");
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let (_, bytes) = crate::support::send_request(
        &app,
        with_host("POST", "/mcp", "localhost", None, &initialize()),
    )
    .await;
    let body: Value = serde_json::from_slice(&bytes).expect("JSON-RPC body");
    assert_eq!(body["id"], 1, "{body}");
    assert_eq!(body["error"]["code"], -32600, "{body}");
    // The sessions open still work, and closing one makes room.
    let mut request = with_host("DELETE", "/mcp", "localhost", None, "");
    request
        .headers_mut()
        .insert("mcp-session-id", ids[0].parse().expect("header value"));
    let (status, _) = crate::support::send_request(&app, request).await;
    assert!(status.is_success(), "{status}");
    let request = with_host("POST", "/mcp", "localhost", None, &initialize());
    let (status, bytes) = crate::support::send_request(&app, request).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
}

/// N6: a body announcing 10^12 bytes waited 30 s for bytes that never came, then got
/// 400 "failed to buffer"; it gets 413 at once, on `/api` and `/mcp`.
#[tokio::test]
async fn an_announced_oversized_body_is_refused_at_once() {
    let (_dir, app) = loopback_app(&[]).await;
    for uri in ["/api/settings/llm_model", "/api/route", "/mcp"] {
        let method = if uri.starts_with("/api/settings") {
            "PUT"
        } else {
            "POST"
        };
        let mut request = with_host(method, uri, "localhost", None, "");
        request.headers_mut().insert(
            "content-length",
            "1000000000000".parse().expect("header value"),
        );
        let sent = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            send_request(&app, request),
        );
        let (status, bytes) = sent.await.expect("answered at once");
        assert_eq!(
            status,
            StatusCode::PAYLOAD_TOO_LARGE,
            "{uri}: {}",
            String::from_utf8_lossy(&bytes)
        );
        let body: Value = serde_json::from_slice(&bytes).expect("JSON body");
        if uri == "/mcp" {
            assert_eq!(body["error"]["code"], -32600, "{body}");
        } else {
            assert_eq!(body["error"]["kind"], "payload_too_large", "{body}");
        }
    }
}

/// `POST /mcp` with a body that is not JSON as `text/plain`, or with no
/// Content-Type, got 415 with a plain-text body; every `/mcp` refusal is JSON-RPC.
#[tokio::test]
async fn mcp_refuses_other_media_types_as_json_rpc() {
    let (_dir, app) = loopback_app(&[]).await;
    for content_type in [Some("text/plain"), None] {
        let mut request = with_host("POST", "/mcp", "localhost", None, "{not json");
        match content_type {
            Some(value) => {
                request
                    .headers_mut()
                    .insert("content-type", value.parse().expect("header value"));
            }
            None => {
                request.headers_mut().remove("content-type");
            }
        }
        let (status, bytes) = send_request(&app, request).await;
        assert_eq!(
            status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{content_type:?}"
        );
        let body: Value = serde_json::from_slice(&bytes).expect("JSON-RPC body");
        assert_eq!(body["jsonrpc"], "2.0", "{body}");
        assert_eq!(body["error"]["code"], -32600, "{body}");
    }
}

/// N5: `router_dense = off` on a running serve changed nothing until restart, and
/// nothing said so. Its declaration says it is read at start, and PUT answers so;
/// a key read at each turn answers without the note.
#[tokio::test]
async fn a_setting_read_at_start_says_so_when_set() {
    let (_dir, app) = loopback_app(&[]).await;
    for (key, value) in [("router_dense", "off"), ("embeddings_model", "mini")] {
        let body = json!({"value": value}).to_string();
        let request = with_host(
            "PUT",
            &format!("/api/settings/{key}"),
            "localhost",
            None,
            &body,
        );
        let (status, bytes) = send_request(&app, request).await;
        assert_eq!(status, StatusCode::OK, "{key}");
        let answer: Value = serde_json::from_slice(&bytes).expect("JSON body");
        assert_eq!(answer["restart_required"], true, "{answer}");
        assert!(
            answer["note"]
                .as_str()
                .is_some_and(|n| n.contains("restart")),
            "{answer}"
        );
    }
    let body = json!({"value": "small"}).to_string();
    let request = with_host("PUT", "/api/settings/llm_model", "localhost", None, &body);
    let (status, bytes) = send_request(&app, request).await;
    assert_eq!(status, StatusCode::OK);
    let answer: Value = serde_json::from_slice(&bytes).expect("JSON body");
    assert_eq!(answer.get("restart_required"), None, "{answer}");
    assert_eq!(
        loadout::applies_of("router_dense"),
        loadout::Applies::Restart
    );
}

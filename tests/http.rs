//! The chat server's API through `app()` + `oneshot`: no socket.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::support::{
    client_row, domain_decision, http_app, logged_selections, send, send_request,
};

#[tokio::test]
async fn settings_are_masked_on_read_and_deletable() {
    let (_dir, app) = http_app(None).await;
    let (status, _) = send(
        &app,
        "PUT",
        "/api/settings/llm_api_key",
        Some(json!({"value": "sk-abcdefghijklmnop"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = send(&app, "GET", "/api/settings/llm_api_key", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["value"], "********mnop");
    let (_, body) = send(&app, "GET", "/api/settings", None).await;
    assert_eq!(body["settings"]["llm_api_key"], "********mnop");
    let (status, _) = send(&app, "DELETE", "/api/settings/llm_api_key", None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = send(&app, "GET", "/api/settings/llm_api_key", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["kind"], "not_found");
}

#[tokio::test]
async fn malformed_bodies_and_keys_get_clear_json_errors() {
    let (_dir, app) = http_app(None).await;
    let request = Request::builder()
        .method("PUT")
        .uri("/api/settings/some_key")
        .header("content-type", "application/json")
        .body(Body::from("{not json"))
        .expect("request");
    let (status, bytes) = send_request(&app, request).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let body: Value = serde_json::from_slice(&bytes).expect("error body is JSON");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("malformed JSON"),
        "{body}"
    );

    let (status, body) = send(
        &app,
        "PUT",
        "/api/settings/Bad%20Key",
        Some(json!({"value": "x"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, _) = send(
        &app,
        "PUT",
        "/api/settings/k",
        Some(json!({"value": "x", "extra": 1})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn oversized_bodies_are_refused_with_413() {
    let (_dir, app) = http_app(None).await;
    let huge = "x".repeat(loadout_server::http::MAX_BODY_BYTES + 1);
    let (status, body) = send(&app, "PUT", "/api/settings/k", Some(json!({"value": huge}))).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["error"]["kind"], "payload_too_large");
}

#[tokio::test]
async fn sessions_are_created_and_read_back() {
    let (_dir, app) = http_app(None).await;
    let (status, body) = send(&app, "POST", "/api/sessions", None).await;
    assert_eq!(status, StatusCode::CREATED);
    let id = body["id"].as_str().expect("id").to_owned();
    let (status, body) = send(&app, "GET", &format!("/api/sessions/{id}"), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["turn"], 0);
    let (status, _) = send(&app, "GET", "/api/sessions/nope", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = send(&app, "GET", "/api/sessions/..%2Fetc", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn domains_say_why_they_are_inactive() {
    let (_dir, app) = http_app(None).await;
    let (status, body) = send(&app, "GET", "/api/domains", None).await;
    assert_eq!(status, StatusCode::OK);
    let filesystem = body["domains"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == "filesystem"))
        .expect("filesystem domain");
    assert_eq!(filesystem["active"], false);
    assert_eq!(filesystem["missing_settings"], json!(["filesystem_roots"]));
}

#[tokio::test]
async fn a_token_is_required_when_configured() {
    let (_dir, app) = http_app(Some("0123456789abcdef-token")).await;
    let (status, body) = send(&app, "GET", "/api/domains", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["kind"], "unauthorized");
    let request = Request::builder()
        .uri("/api/domains")
        .header("authorization", "Bearer 0123456789abcdef-token")
        .body(Body::empty())
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn openapi_document_lists_every_endpoint_the_app_serves() {
    let (_dir, app) = http_app(None).await;
    let (status, body) = send(&app, "GET", "/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    let endpoints = [
        ("/api/sessions", "post"),
        ("/api/sessions/{id}", "get"),
        ("/api/settings", "get"),
        ("/api/settings/{key}", "get"),
        ("/api/settings/{key}", "put"),
        ("/api/settings/{key}", "delete"),
        ("/api/domains", "get"),
        ("/api/route", "post"),
        ("/api/chat", "post"),
        ("/api/audit", "get"),
        ("/api/clients", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
        ("/", "get"),
    ];
    for (path, method) in endpoints {
        assert!(
            body["paths"][path][method].is_object(),
            "{method} {path} is not documented"
        );
        // ...and the app serves it: anything but the JSON 404/405 of a path or
        // method it does not know.
        let uri = path
            .replace("{id}", "some-session")
            .replace("{key}", "some_key");
        let (status, answer) = send(&app, &method.to_uppercase(), &uri, None).await;
        assert!(
            ![StatusCode::NOT_FOUND, StatusCode::METHOD_NOT_ALLOWED].contains(&status)
                || answer["error"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.contains("no such endpoint") && !m.contains("not allowed")),
            "{method} {uri}: {status} {answer}"
        );
    }
    let documented: usize = body["paths"]
        .as_object()
        .expect("paths")
        .values()
        .map(|p| p.as_object().map_or(0, |m| m.len()))
        .sum();
    assert_eq!(
        documented,
        endpoints.len(),
        "an endpoint is documented but not listed here"
    );
}

/// The session's logged selections, waiting for the background writer's flush.

#[tokio::test]
async fn decision_log_setting_keeps_the_message_its_hash_or_nothing() {
    let (_dir, app) = http_app(None).await;
    let (_, created) = send(&app, "POST", "/api/sessions", None).await;
    let session = created["id"].as_str().expect("session id").to_owned();
    let route = |message: &'static str| {
        let app = app.clone();
        let session = session.clone();
        async move {
            let (status, body) = send(
                &app,
                "POST",
                "/api/route",
                Some(json!({"session": session, "message": message})),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
    };

    route("remember that my parrot is called Polly").await;
    let rows = logged_selections(&app, &session, 1).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0]["message"],
        "remember that my parrot is called Polly"
    );
    assert!(rows[0]["reasons"]["domains"].is_array(), "{}", rows[0]);

    send(
        &app,
        "PUT",
        "/api/settings/decision_log",
        Some(json!({"value": "hash"})),
    )
    .await;
    route("what is my parrot called").await;
    let rows = logged_selections(&app, &session, 2).await;
    assert_eq!(rows.len(), 2);
    let hashed = rows[1]["message"].as_str().unwrap_or_default();
    assert!(
        hashed.starts_with("sha256:") && !hashed.contains("parrot"),
        "{hashed}"
    );

    send(
        &app,
        "PUT",
        "/api/settings/decision_log",
        Some(json!({"value": "off"})),
    )
    .await;
    route("and my cat?").await;
    send(
        &app,
        "PUT",
        "/api/settings/decision_log",
        Some(json!({"value": "plain"})),
    )
    .await;
    route("thanks").await;
    let rows = logged_selections(&app, &session, 3).await;
    let messages: Vec<&str> = rows.iter().filter_map(|r| r["message"].as_str()).collect();
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert_eq!(messages[2], "thanks", "the `off` turn left no row");
}

/// Stages of the tools a routed turn sent, by tool name.
fn sent_stages(routed: &Value) -> Vec<(String, String)> {
    routed["selection"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["name"].as_str().unwrap_or_default().to_owned(),
                t["stage"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_follow_up_carries_the_last_turn_over_with_the_log_off_and_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let open = || async {
        let config = loadout_server::app::Config::in_data_dir(dir.path().to_path_buf());
        let app_state = loadout_server::app::App::open(&config)
            .await
            .expect("open app");
        loadout_server::http::app(loadout_server::http::HttpState::new(app_state, None))
    };
    let app = open().await;
    for (key, value) in [("decision_log", "off"), ("router_dense", "off")] {
        let (status, body) = send(
            &app,
            "PUT",
            &format!("/api/settings/{key}"),
            Some(json!({"value": value})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (_, created) = send(&app, "POST", "/api/sessions", None).await;
    let session = created["id"].as_str().expect("session id").to_owned();
    let (status, first) = send(
        &app,
        "POST",
        "/api/route",
        Some(json!({"session": session, "message": "remember that my parrot is called Polly"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert!(
        sent_stages(&first)
            .iter()
            .any(|(name, _)| name == "remember"),
        "{}",
        first["summary"]
    );
    // A new process on the same data dir: nothing of the session is in memory, and
    // the decision log, being off, holds nothing either.
    drop(app);
    let app = open().await;
    let (status, second) = send(
        &app,
        "POST",
        "/api/route",
        Some(json!({"session": session, "message": "yes, do it"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["turn"], 2);
    assert!(
        sent_stages(&second)
            .iter()
            .any(|(name, _)| name == "remember"),
        "{}",
        second["summary"]
    );
}

#[tokio::test]
async fn unknown_endpoints_and_methods_get_json_errors() {
    let (_dir, app) = http_app(None).await;
    let (status, body) = send(&app, "GET", "/api/nothing-here", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["kind"], "not_found", "{body}");
    let (status, body) = send(&app, "DELETE", "/api/route", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body["error"]["kind"], "method_not_allowed", "{body}");
}

#[tokio::test]
async fn route_answers_with_openai_tools_hints_reasons_and_tokens() {
    let (_dir, app) = http_app(None).await;
    let (status, routed) = send(
        &app,
        "POST",
        "/api/route",
        Some(json!({"message": "remember that my parrot is called Polly"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{routed}");
    let tools = routed["tools"].as_array().expect("tools");
    let selected = routed["selection"]["tools"].as_array().expect("selection");
    assert!(!tools.is_empty());
    let sent: Vec<&str> = tools
        .iter()
        .map(|t| {
            assert_eq!(t["type"], "function", "{t}");
            assert!(t["function"]["parameters"].is_object(), "{t}");
            t["function"]["name"].as_str().expect("name")
        })
        .collect();
    let chosen: Vec<&str> = selected
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        sent, chosen,
        "the definitions are the selection's tools, in order"
    );
    assert!(sent.contains(&"remember"));
    let selection = &routed["selection"];
    let tokens = selection["tokens"].as_u64().expect("tokens");
    assert!(tokens > 0 && tokens <= selection["all_tools_tokens"].as_u64().expect("all"));
    assert!(selection["hints"].is_array(), "{selection}");
    let memory = selection["domains"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["domain"] == "memory"))
        .expect("memory decision");
    assert_eq!(memory["stage"], "keyword");
    assert!(memory["reason"].as_str().is_some_and(|r| !r.is_empty()));
}

#[tokio::test]
async fn route_names_an_unconfigured_domain_that_fits_the_message() {
    let (_dir, app) = http_app(None).await;
    let (status, routed) = send(
        &app,
        "POST",
        "/api/route",
        Some(json!({"message": "read the file notes.txt from my documents folder"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{routed}");
    let unconfigured = &routed["selection"]["unconfigured"];
    assert_eq!(unconfigured[0]["domain"], "filesystem", "{routed}");
    assert_eq!(
        unconfigured[0]["missing_settings"],
        json!(["filesystem_roots"])
    );
    assert!(
        routed["summary"]
            .as_str()
            .is_some_and(|s| s.contains("filesystem (not configured: set filesystem_roots)")),
        "{}",
        routed["summary"]
    );
    // A message about something configured names nothing.
    let (_, other) = send(
        &app,
        "POST",
        "/api/route",
        Some(json!({"message": "remember that my parrot is called Polly"})),
    )
    .await;
    assert!(other["selection"].get("unconfigured").is_none(), "{other}");
}

#[tokio::test]
async fn route_refuses_bad_messages_and_names_with_clear_errors() {
    let (_dir, app) = http_app(None).await;
    let cases = [
        (
            json!({"message": "x".repeat(loadout_server::routing::MAX_MESSAGE_BYTES + 1)}),
            StatusCode::PAYLOAD_TOO_LARGE,
            "limit",
        ),
        (json!({"message": "   "}), StatusCode::BAD_REQUEST, "empty"),
        (
            json!({"message": "hi", "called": ["no_such_tool"]}),
            StatusCode::BAD_REQUEST,
            "no_such_tool",
        ),
        (
            json!({"message": "hi", "session": "../etc"}),
            StatusCode::BAD_REQUEST,
            "session id",
        ),
        (json!({"text": "hi"}), StatusCode::BAD_REQUEST, "message"),
    ];
    for (body, expected, named) in cases {
        let (status, answer) = send(&app, "POST", "/api/route", Some(body.clone())).await;
        assert_eq!(status, expected, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(named), "{named:?} not in {message:?}");
    }
}

#[tokio::test]
async fn a_session_id_the_client_chose_starts_a_session() {
    let (_dir, app) = http_app(None).await;
    let (status, routed) = send(
        &app,
        "POST",
        "/api/route",
        Some(json!({"session": "client-conversation-42", "message": "hello there"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{routed}");
    assert_eq!(routed["turn"], 1);
    let (status, shown) = send(&app, "GET", "/api/sessions/client-conversation-42", None).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["turn"], 1);
}

/// PostgreSQL stops under a serving app: routing a session's turn answers 503 with
/// a clear JSON error, and the same app serves again once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_answers_503_and_service_resumes_without_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((t, mut outage)) =
        loadout_store::testing::postgres_outage_store(dir.path(), "HTTP outage test").await
    else {
        return;
    };
    let registry = std::sync::Arc::new(loadout_domains::registry().expect("registry"));
    let app_state = loadout_server::app::App::with_registry(registry, t.store.clone());
    let app = loadout_server::http::app(loadout_server::http::HttpState::new(app_state, None));
    let route = || {
        send(
            &app,
            "POST",
            "/api/route",
            Some(json!({"session": "outage", "message": "remember the milk"})),
        )
    };
    let (status, body) = route().await;
    assert_eq!(status, StatusCode::OK, "{body}");

    outage.stop();
    let (status, body) = route().await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["kind"], "unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("database unavailable"), "{message}");
    assert!(
        !message.contains(":loadout_test@"),
        "password shown: {message}"
    );

    outage.end();
    let started = std::time::Instant::now();
    loop {
        let (status, body) = route().await;
        if status == StatusCode::OK {
            assert_eq!(body["turn"], 2, "the session goes on: {body}");
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the app did not recover: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The decision log's table is gone (a damaged log file): routing answers as usual,
/// and the rows it could not write are counted as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_decision_log_never_fails_a_routing_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = loadout_server::app::Config::in_data_dir(dir.path().to_path_buf());
    let app_state = loadout_server::app::App::open(&config)
        .await
        .expect("open app");
    let state = loadout_server::http::HttpState::new(app_state, None);
    let app = loadout_server::http::app(state.clone());
    let loadout_store::StoreBackend::Sqlite(sqlite) = state.app.store().backend() else {
        unreachable!("the default store is SQLite");
    };
    sqlite
        .call(|c| Ok(c.execute_batch("DROP TABLE decisions.tool_history;")?))
        .await
        .expect("drop the log's table");
    for turn in 1..=20 {
        let (status, body) = send(
            &app,
            "POST",
            "/api/route",
            Some(json!({"session": "unlogged", "message": "remember my parrot is Polly"})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["turn"], turn);
    }
    let decisions = &state.app.routing().decisions;
    let started = std::time::Instant::now();
    while decisions.n_dropped() < 20 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{} rows counted as dropped",
            decisions.n_dropped()
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Random request bodies, paths and headers against every JSON endpoint: whatever
/// arrives, the answer is a JSON error with a 4xx status or a success, never a 5xx
/// or a dropped connection. Seeded, so a failure replays.
#[tokio::test]
async fn random_requests_get_json_answers_and_never_a_server_error() {
    let (_dir, app) = http_app(None).await;
    let mut rng = crate::support::Rng(0x5eed_u64);
    let mut next = move || rng.next();
    let strings = [
        "",
        "weather in Busan and then restart the container",
        "부산 날씨 그리고 일정",
        "../../etc/passwd",
        "%2e%2e%2f",
        "İ🙂\u{0}\u{200b}",
        "a b c",
        "load_tools",
        "calculate",
        "\"quoted\"",
    ];
    let values = |n: usize| -> Value {
        match n % 9 {
            0 => Value::Null,
            1 => json!(true),
            2 => json!(-1),
            3 => json!(1e300),
            4 => json!(u64::MAX),
            5 => json!(strings[n / 9 % strings.len()]),
            6 => json!([strings[n / 9 % strings.len()], 3]),
            7 => json!({"nested": {"deeper": [1, {"x": null}]}}),
            _ => json!("x".repeat(n % 5000)),
        }
    };
    let fields = [
        "message",
        "session",
        "called",
        "token_budget",
        "value",
        "id",
        "extra",
    ];
    let paths = [
        ("POST", "/api/route"),
        ("POST", "/api/chat"),
        ("POST", "/api/sessions"),
        ("PUT", "/api/settings/llm_model"),
        ("PUT", "/api/settings/..%2F..%2Fx"),
        ("GET", "/api/sessions/..%2Fetc"),
        ("GET", "/api/sessions/%E2%80%8B"),
        ("DELETE", "/api/settings/"),
        ("GET", "/api/domains"),
    ];
    let mut seen = std::collections::BTreeMap::new();
    for round in 0..1500 {
        let (method, path) = paths[next() % paths.len()];
        let body = match next() % 6 {
            // Raw bytes: not JSON, not UTF-8, truncated JSON, deeply nested JSON.
            0 => (0..next() % 64).map(|_| next() as u8).collect::<Vec<u8>>(),
            1 => b"{\"message\": \"weather".to_vec(),
            2 => format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes(),
            _ => {
                let mut object = serde_json::Map::new();
                for _ in 0..next() % 5 {
                    object.insert(fields[next() % fields.len()].into(), values(next()));
                }
                serde_json::to_vec(&Value::Object(object)).expect("json")
            }
        };
        let content_type = ["application/json", "text/plain", ""][next() % 3];
        let mut request = Request::builder().method(method).uri(path);
        if !content_type.is_empty() {
            request = request.header("content-type", content_type);
        }
        let request = request.body(Body::from(body.clone())).expect("request");
        let (status, bytes) = send_request(&app, request).await;
        *seen.entry(status.as_u16()).or_insert(0) += 1;
        let shown = String::from_utf8_lossy(&body);
        let shown: String = shown.chars().take(200).collect();
        assert!(
            !status.is_server_error(),
            "round {round}: {method} {path} {content_type:?} {shown:?} → {status}: {}",
            String::from_utf8_lossy(&bytes)
        );
        let answer: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!("round {round}: {method} {path} → {status}, not JSON ({e})")
        });
        if !status.is_success() {
            assert!(
                answer["error"]["kind"].is_string() && answer["error"]["message"].is_string(),
                "round {round}: {method} {path} → {status}: {answer}"
            );
        }
    }
    // Both paths ran: bodies that routed, and bodies refused by the extractors.
    assert!(
        seen.contains_key(&200) && seen.contains_key(&400),
        "{seen:?}"
    );
}

/// Issue 32: audit times are shown as ISO 8601 UTC (stored as epoch milliseconds).
#[tokio::test]
async fn the_audit_endpoint_shows_calls_with_iso_times() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = loadout_server::app::Config::in_data_dir(dir.path().to_path_buf());
    let app_state = loadout_server::app::App::open(&config)
        .await
        .expect("open app");
    let row = |at_ms: i64, tool: &str| loadout_store::AuditRow {
        at_ms,
        client: "chat".into(),
        tool: tool.into(),
        args: json!({"key": "filesystem_roots"}),
        outcome: "ok".into(),
        detail: None,
        duration_ms: 1.5,
    };
    app_state
        .store()
        .audit_insert(vec![
            row(1_795_736_467_123, "get_setting"),
            row(1_795_736_468_000, "calculate"),
        ])
        .await
        .expect("insert");
    let app = loadout_server::http::app(loadout_server::http::HttpState::new(app_state, None));
    let (status, body) = send(&app, "GET", "/api/audit", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let calls = body["calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 2, "{body}");
    assert_eq!(calls[0]["at"], "2026-11-26T23:41:07.123Z");
    assert_eq!(calls[0]["tool"], "get_setting");
    assert_eq!(calls[0]["args"]["key"], "filesystem_roots");
    assert_eq!(calls[1]["at"], "2026-11-26T23:41:08.000Z");
    let (_, body) = send(&app, "GET", "/api/audit?tail=1", None).await;
    assert_eq!(body["calls"][0]["tool"], "calculate", "{body}");
    let (status, body) = send(&app, "GET", "/api/audit?tail=0", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["kind"], "bad_request");
}

/// Issue 32: browsers asked for `/favicon.ico` and got a 404.
#[tokio::test]
async fn the_dashboard_has_an_icon() {
    let (_dir, app) = http_app(Some("0123456789abcdef-token")).await;
    let (status, page) = send(&app, "GET", "/", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.as_str()
            .is_some_and(|p| p.contains(r#"rel="icon""#) && p.contains("/favicon.svg")),
        "the page names no icon"
    );
    for path in ["/favicon.svg", "/favicon.ico"] {
        let request = Request::get(path).body(Body::empty()).expect("request");
        let response = app.clone().oneshot(request).await.expect("response");
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        assert_eq!(
            response.headers()["content-type"],
            "image/svg+xml",
            "{path}"
        );
    }
}

/// Issue 32: `/metrics` needs the bearer token beyond loopback, like the API.
#[tokio::test]
async fn metrics_need_the_token_when_one_is_configured() {
    let (_dir, app) = http_app(Some("0123456789abcdef-token")).await;
    let (status, body) = send(&app, "GET", "/metrics", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["kind"], "unauthorized");
    let request = Request::get("/metrics")
        .header("authorization", "Bearer 0123456789abcdef-token")
        .body(Body::empty())
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .is_ok_and(|t| t.starts_with("text/plain; version=0.0.4"))
    );
}

/// A one-off `/api/route` of `message`: its selection.
async fn route_once(app: &axum::Router, message: &str) -> Value {
    let (status, body) = send(app, "POST", "/api/route", Some(json!({"message": message}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

fn sent_tools(routed: &Value) -> Vec<String> {
    routed["selection"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

/// An app whose [`App`](loadout_server::app::App) the test keeps (its learner, its
/// store).
async fn http_app_with_state() -> (tempfile::TempDir, loadout_server::app::App, axum::Router) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = loadout_server::app::Config::in_data_dir(dir.path().to_path_buf());
    let app_state = loadout_server::app::App::open(&config)
        .await
        .expect("open app");
    let router = loadout_server::http::app(loadout_server::http::HttpState::new(
        app_state.clone(),
        None,
    ));
    (dir, app_state, router)
}

/// Issue 29: what a client's model called for a message (`/api/route`'s `called`,
/// reported with the next turn) is learned; a later message like it, in another
/// session, gets that tool from the learned stage, which its reasons name. Before
/// anything was learned the same message did not get it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_called_for_a_message_is_routed_to_a_similar_message_later() {
    let (_dir, app_state, app) = http_app_with_state().await;
    let taught = "remember to zorblax the quarterly frobnication ledgers";
    let probe = "remember to zorblax the monthly frobnication ledgers";
    let before = route_once(&app, probe).await;
    assert!(
        !sent_tools(&before).iter().any(|t| t == "list_tables"),
        "list_tables was sent before anything was learned: {before}"
    );
    for (message, called) in [(taught, json!([])), ("thanks", json!(["list_tables"]))] {
        let (status, body) = send(
            &app,
            "POST",
            "/api/route",
            Some(json!({"session": "teacher", "message": message, "called": called})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    app_state.routing().learner.flush().await;
    let rows = app_state
        .store()
        .learned_rows(Some("list_tables"), None)
        .await
        .expect("learned rows");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].message, taught);
    assert_eq!(rows[0].source, "route");
    assert_eq!(rows[0].session.as_deref(), Some("teacher"));

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let after = loop {
        let routed = route_once(&app, probe).await;
        if sent_tools(&routed).iter().any(|t| t == "list_tables") {
            break routed;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "list_tables never routed from what was learned: {routed}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let tool = after["selection"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["name"] == "list_tables")
        .expect("list_tables");
    assert_eq!(tool["stage"], "scored", "{tool}");
    let scratchpad = domain_decision(&after["selection"], "scratchpad");
    assert!(
        scratchpad["reason"]
            .as_str()
            .is_some_and(|r| r.contains("learned")),
        "{scratchpad}"
    );
}

/// Issue 29: with `decision_log = hash`, or `learning = off`, nothing of a message
/// is learned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_learned_when_the_decision_log_hashes_or_learning_is_off() {
    for (key, value) in [("decision_log", "hash"), ("learning", "off")] {
        let (_dir, app_state, app) = http_app_with_state().await;
        let (status, body) = send(
            &app,
            "PUT",
            &format!("/api/settings/{key}"),
            Some(json!({"value": value})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        for (message, called) in [
            ("zorblax the quarterly frobnication ledgers", json!([])),
            ("thanks", json!(["list_tables"])),
        ] {
            let (status, body) = send(
                &app,
                "POST",
                "/api/route",
                Some(json!({"session": "private", "message": message, "called": called})),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        app_state.routing().learner.flush().await;
        let rows = app_state
            .store()
            .learned_rows(None, None)
            .await
            .expect("learned rows");
        assert!(rows.is_empty(), "{key} = {value}: {rows:?}");
    }
}

/// Issue 40: a client's own token reaches `/api/route` and sees only its set (core,
/// its domains and tools; read-only tools only when it says so); the operator's
/// token sees everything; an unknown or revoked token, and a client's token on an
/// operator endpoint, get 401.
#[tokio::test]
async fn a_clients_token_routes_within_its_own_set() {
    use loadout_server::app::{App, Config};
    use loadout_server::http::{HttpState, app};
    let dir = tempfile::tempdir().expect("tempdir");
    let app_state = App::open(&Config::in_data_dir(dir.path().to_path_buf()))
        .await
        .expect("open app");
    let store = app_state.store().clone();
    let client_token = "client-token-of-the-notes-agent";
    store
        .client_insert(loadout_store::ClientRow {
            domains: vec!["memory".into()],
            read_only: true,
            ..client_row("notes-agent", client_token)
        })
        .await
        .expect("insert client");
    let operator =
        loadout_server::mcp::BearerToken::new("operator-token-0123456789").expect("token");
    let app = app(HttpState::new(app_state, Some(operator)));
    let route = |token: &str| {
        Request::builder()
            .method("POST")
            .uri("/api/route")
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::from(
                json!({"message": "remember that my parrot is called Polly, and make a table of my expenses"})
                    .to_string(),
            ))
            .expect("request")
    };
    let names = |bytes: &[u8]| -> Vec<String> {
        let body: Value = serde_json::from_slice(bytes).expect("JSON");
        body["selection"]["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect()
    };
    let (status, bytes) = send_request(&app, route("operator-token-0123456789")).await;
    assert_eq!(status, StatusCode::OK);
    let everything = names(&bytes);
    assert!(
        everything.iter().any(|t| t == "create_table")
            && everything.iter().any(|t| t == "remember"),
        "{everything:?}"
    );
    let (status, bytes) = send_request(&app, route(client_token)).await;
    assert_eq!(status, StatusCode::OK);
    let seen = names(&bytes);
    assert!(seen.iter().any(|t| t == "recall"), "{seen:?}");
    assert!(seen.iter().any(|t| t == "current_time"), "{seen:?}");
    // Not its domain, and not read-only.
    assert!(!seen.iter().any(|t| t == "create_table"), "{seen:?}");
    assert!(!seen.iter().any(|t| t == "remember"), "{seen:?}");
    let body: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(
        body["tools"].as_array().map(Vec::len),
        Some(seen.len()),
        "{body}"
    );

    let (status, _) = send_request(&app, route("not-a-token-of-anyone-at-all")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let settings = Request::builder()
        .uri("/api/settings")
        .header("authorization", format!("Bearer {client_token}"))
        .body(Body::empty())
        .expect("request");
    let (status, _) = send_request(&app, settings).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(store.client_revoke("notes-agent").await.expect("revoke"));
    let (status, _) = send_request(&app, route(client_token)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// Issue 40: a session belongs to the token that started it. A client's token cannot
/// route or chat in another client's session, nor in the operator's (403, nothing
/// written to it); the operator's token reaches every session.
#[tokio::test]
async fn a_clients_session_is_its_own() {
    use loadout_server::app::{App, Config};
    use loadout_server::http::{HttpState, app};
    let dir = tempfile::tempdir().expect("tempdir");
    let app_state = App::open(&Config::in_data_dir(dir.path().to_path_buf()))
        .await
        .expect("open app");
    let store = app_state.store().clone();
    for name in ["agent-a", "agent-b"] {
        store
            .client_insert(client_row(name, &format!("token-of-{name}-0123456789")))
            .await
            .expect("insert client");
    }
    let operator = "operator-token-0123456789";
    let app = app(HttpState::new(
        app_state,
        Some(loadout_server::mcp::BearerToken::new(operator).expect("token")),
    ));
    let post = |path: &str, token: &str, session: &str| {
        Request::builder()
            .method("POST")
            .uri(path)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::from(
                json!({"message": "what is my parrot called?", "session": session}).to_string(),
            ))
            .expect("request")
    };
    let (a, b) = ("token-of-agent-a-0123456789", "token-of-agent-b-0123456789");
    let (status, _) = send_request(&app, post("/api/route", a, "talk-of-a")).await;
    assert_eq!(status, StatusCode::OK);
    let turns = store.session_turn("talk-of-a").await.expect("turn");
    for path in ["/api/route", "/api/chat"] {
        let (status, bytes) = send_request(&app, post(path, b, "talk-of-a")).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
        let body = String::from_utf8_lossy(&bytes);
        assert!(body.contains("another client"), "{path}: {body}");
    }
    assert_eq!(store.session_turn("talk-of-a").await.expect("turn"), turns);
    let (status, _) = send_request(&app, post("/api/route", operator, "talk-of-a")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send_request(&app, post("/api/route", operator, "talk-of-ops")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send_request(&app, post("/api/route", a, "talk-of-ops")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// One JSON-RPC request to `/mcp` with a bearer token: status, the answer's JSON
/// (from an SSE `data:` line or a plain body) and the session id it gave.
/// An initialized MCP session of `token`'s: its id.
async fn mcp_session(app: &axum::Router, token: &str) -> String {
    let (status, init, session) = mcp_post(
        app,
        token,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "client-test", "version": "1"}}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{init}");
    let session = session.expect("a session id");
    mcp_post(
        app,
        token,
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    session
}

async fn mcp_post(
    app: &axum::Router,
    token: &str,
    session: Option<&str>,
    body: Value,
) -> (StatusCode, Value, Option<String>) {
    let mut builder = Request::builder()
        .method("POST")
        .uri("/mcp")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {token}"));
    if let Some(session) = session {
        builder = builder.header("mcp-session-id", session);
    }
    let request = builder.body(Body::from(body.to_string())).expect("request");
    let response = app.clone().oneshot(request).await.expect("response");
    let status = response.status();
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("body")
        .to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let json = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("result").is_some() || v.get("error").is_some())
        .or_else(|| serde_json::from_str(&text).ok())
        .unwrap_or(Value::String(text));
    (status, json, session)
}

/// Issue 40: over MCP a client limited to domains is served the view of those
/// domains: `tools/list` has core and them only, and a call outside them is refused
/// by name. A client limited by tool names gets its tools and core, no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_token_is_served_the_mcp_view_of_its_domains() {
    use loadout_server::app::{App, Config};
    let dir = tempfile::tempdir().expect("tempdir");
    let app_state = App::open(&Config::in_data_dir(dir.path().to_path_buf()))
        .await
        .expect("open app");
    let store = app_state.store().clone();
    for (name, token, domains, tools) in [
        (
            "notes-agent",
            "client-token-of-the-notes-agent",
            vec!["memory".to_owned()],
            vec![],
        ),
        (
            "calc-agent",
            "client-token-of-the-calc-agent",
            vec![],
            vec!["calculate".to_owned()],
        ),
    ] {
        store
            .client_insert(loadout_store::ClientRow {
                domains,
                tools,
                ..client_row(name, token)
            })
            .await
            .expect("insert client");
    }
    let operator =
        loadout_server::mcp::BearerToken::new("operator-token-0123456789").expect("token");
    let state = loadout_server::http::HttpState::new(app_state, Some(operator))
        .with_mcp()
        .await
        .expect("mcp");
    let app = loadout_server::http::app(state);
    let token = "client-token-of-the-notes-agent";
    let session = mcp_session(&app, token).await;
    let (status, listed, _) = mcp_post(
        &app,
        token,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"recall") && names.contains(&"calculate"),
        "{names:?}"
    );
    assert!(
        !names.contains(&"create_table") && !names.contains(&"read_file"),
        "{names:?}"
    );
    let (_, called, _) = mcp_post(
        &app,
        token,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "call_tool", "arguments": {"name": "list_tables", "arguments": {}}}}),
    )
    .await;
    assert!(called.to_string().contains("list_tables"), "{called}");
    assert!(
        called["result"]["isError"] == json!(true) || called.get("error").is_some(),
        "a call outside the client's domains ran: {called}"
    );
    // A call within its view is audited under the client's name.
    let (_, recalled, _) = mcp_post(
        &app,
        token,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
               "params": {"name": "recall", "arguments": {"query": "parrot"}}}),
    )
    .await;
    assert!(recalled.get("result").is_some(), "{recalled}");
    let audited = store.audit_tail(5).await.expect("audit");
    assert!(
        audited
            .iter()
            .any(|r| r.tool == "recall" && r.client == "notes-agent"),
        "{audited:?}"
    );

    // Issue 40: a client limited by tool names is served on MCP too, narrowed to
    // them (and core): its list, its searches and its calls.
    let calc = "client-token-of-the-calc-agent";
    let session = mcp_session(&app, calc).await;
    let (_, listed, _) = mcp_post(
        &app,
        calc,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    )
    .await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"calculate"), "{names:?}");
    assert!(
        !names.contains(&"recall") && !names.contains(&"remember"),
        "{names:?}"
    );
    let (_, found, _) = mcp_post(
        &app,
        calc,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "search_tools", "arguments": {"query": "remember a note for later"}}}),
    )
    .await;
    let text = found["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("{}");
    let results: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let hits: Vec<&str> = results["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(results["results"].is_array(), "{found}");
    assert!(
        hits.iter()
            .all(|h| *h == "calculate" || !["remember", "recall", "forget"].contains(h)),
        "search_tools found a tool outside the client's: {hits:?}"
    );
    // Its best hits come from its own tools: a limit of 1 still finds one, though
    // the likeliest tool for the query (`remember`) is not its.
    let (_, found, _) = mcp_post(
        &app,
        calc,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 30, "method": "tools/call",
               "params": {"name": "search_tools", "arguments": {"query": "remember the sum to calculate", "limit": 1}}}),
    )
    .await;
    let text = found["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("{}");
    let results: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    assert_eq!(
        results["results"].as_array().map(Vec::len),
        Some(1),
        "{found}"
    );
    // A call outside its tools is refused by name, directly and through call_tool,
    // and never runs.
    let (_, direct, _) = mcp_post(
        &app,
        calc,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
               "params": {"name": "remember", "arguments": {"content": "calc was here"}}}),
    )
    .await;
    let message = direct["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("`remember`") && message.contains("calc-agent"),
        "{direct}"
    );
    let (_, through, _) = mcp_post(
        &app,
        calc,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
               "params": {"name": "call_tool", "arguments": {"name": "remember", "arguments": {"content": "calc was here"}}}}),
    )
    .await;
    assert_eq!(through["result"]["isError"], json!(true), "{through}");
    assert!(through.to_string().contains("calc-agent"), "{through}");
    let (_, calculated, _) = mcp_post(
        &app,
        calc,
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
               "params": {"name": "calculate", "arguments": {"expression": "6*7"}}}),
    )
    .await;
    assert!(calculated.to_string().contains("42"), "{calculated}");
    let audited = store.audit_tail(10).await.expect("audit");
    assert!(
        audited
            .iter()
            .any(|r| r.tool == "remember" && r.client == "calc-agent" && r.outcome == "refused"),
        "{audited:?}"
    );
    assert!(
        !audited
            .iter()
            .any(|r| r.tool == "remember" && r.outcome == "ok"),
        "{audited:?}"
    );
}

/// Issue 40: a client with `--rate N/min` gets 429 with `Retry-After` past N requests
/// a minute, on `/api/route` and on `/mcp` (there with a JSON-RPC error), one budget
/// for both; another client and the operator's token are not held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_rate_gets_429_with_retry_after() {
    use loadout_server::app::{App, Config};
    let dir = tempfile::tempdir().expect("tempdir");
    let app_state = App::open(&Config::in_data_dir(dir.path().to_path_buf()))
        .await
        .expect("open app");
    let store = app_state.store().clone();
    for (name, token, rate) in [
        ("slow-agent", "client-token-of-the-slow-agent", Some(2)),
        ("free-agent", "client-token-of-the-free-agent", None),
    ] {
        store
            .client_insert(loadout_store::ClientRow {
                rate_per_min: rate,
                ..client_row(name, token)
            })
            .await
            .expect("insert client");
    }
    let operator =
        loadout_server::mcp::BearerToken::new("operator-token-0123456789").expect("token");
    let state = loadout_server::http::HttpState::new(app_state, Some(operator))
        .with_mcp()
        .await
        .expect("mcp");
    let app = loadout_server::http::app(state);
    let route = |token: &str| {
        Request::builder()
            .method("POST")
            .uri("/api/route")
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::from(
                json!({"message": "what time is it"}).to_string(),
            ))
            .expect("request")
    };
    let slow = "client-token-of-the-slow-agent";
    for _ in 0..2 {
        let (status, _) = send_request(&app, route(slow)).await;
        assert_eq!(status, StatusCode::OK);
    }
    let response = app.clone().oneshot(route(slow)).await.expect("response");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After in seconds");
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("body")
        .to_bytes();
    let body: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(body["error"]["kind"], "rate_limited", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("slow-agent")),
        "{body}"
    );
    // The same budget on /mcp, answered as JSON-RPC.
    let (status, rpc, _) = mcp_post(
        &app,
        slow,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "client-test", "version": "1"}}}),
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{rpc}");
    assert_eq!(rpc["jsonrpc"], "2.0", "{rpc}");
    assert!(rpc["error"]["code"].is_i64(), "{rpc}");
    // Others are not held back: a client without a rate, and the operator.
    for token in [
        "client-token-of-the-free-agent",
        "operator-token-0123456789",
    ] {
        for _ in 0..5 {
            let (status, _) = send_request(&app, route(token)).await;
            assert_eq!(status, StatusCode::OK);
        }
    }
}

/// Issue 40: `/api/chat` takes a client's token and narrows the turn to its tools
/// is in tests/chat.rs; here `/api/clients` lists the clients with their calls,
/// for the operator only, and `/metrics` counts a client's calls under its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_and_their_calls_are_listed_for_the_operator() {
    use loadout_server::app::{App, Config};
    let dir = tempfile::tempdir().expect("tempdir");
    let app_state = App::open(&Config::in_data_dir(dir.path().to_path_buf()))
        .await
        .expect("open app");
    let store = app_state.store().clone();
    let token = "client-token-of-the-list-agent";
    store
        .client_insert(loadout_store::ClientRow {
            tools: vec!["calculate".into()],
            rate_per_min: Some(100),
            read_only: true,
            ..client_row("list-agent", token)
        })
        .await
        .expect("insert client");
    let operator =
        loadout_server::mcp::BearerToken::new("operator-token-0123456789").expect("token");
    let state = loadout_server::http::HttpState::new(app_state, Some(operator))
        .with_mcp()
        .await
        .expect("mcp");
    let app = loadout_server::http::app(state);
    let session = mcp_session(&app, token).await;
    for id in 2..4 {
        let (_, called, _) = mcp_post(
            &app,
            token,
            Some(&session),
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                   "params": {"name": "calculate", "arguments": {"expression": "1+1"}}}),
        )
        .await;
        assert!(called.get("result").is_some(), "{called}");
    }
    let get = |path: &str, token: &str| {
        Request::builder()
            .uri(path)
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .expect("request")
    };
    let (status, _) = send_request(&app, get("/api/clients", token)).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a client lists the clients"
    );
    let (status, bytes) =
        send_request(&app, get("/api/clients", "operator-token-0123456789")).await;
    assert_eq!(status, StatusCode::OK);
    let body: Value = serde_json::from_slice(&bytes).expect("JSON");
    let listed = &body["clients"][0];
    assert_eq!(listed["name"], "list-agent", "{body}");
    assert_eq!(listed["calls"], 2, "{body}");
    assert_eq!(listed["rate_per_min"], 100, "{body}");
    assert_eq!(listed["read_only"], true, "{body}");
    assert_eq!(listed["tools"], json!(["calculate"]), "{body}");
    assert!(listed["last_call"].is_string(), "{body}");

    let (status, bytes) = send_request(&app, get("/metrics", "operator-token-0123456789")).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        text.lines().any(|l| l.starts_with(
            r#"loadout_tool_calls_total{tool="calculate",outcome="ok",client="list-agent"} "#
        )),
        "{text}"
    );
}

/// A turn the client reports with no calls is one its model answered with words: what
/// that turn was asked is still wanted in the answer, though the answer names another
/// domain (feature `pending`, from the calls the store keeps per turn). Reported with
/// the call, the same answer is something new.
#[tokio::test]
async fn an_answer_to_the_models_question_keeps_the_request_it_answers() {
    let (_dir, app) = http_app(None).await;
    let ask = "forget what I told you about my dentist";
    let answer = "the one in the table of appointments";
    let mut answers = Vec::new();
    for (session, called) in [("asked", json!([])), ("called", json!(["forget"]))] {
        let mut last = Value::Null;
        for (message, called) in [(ask, json!([])), (answer, called)] {
            let (status, body) = send(
                &app,
                "POST",
                "/api/route",
                Some(json!({"session": session, "message": message, "called": called})),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            last = body;
        }
        answers.push(last);
    }
    let [asked, called] = &answers[..] else {
        panic!("two sessions");
    };
    assert!(sent_tools(asked).iter().any(|t| t == "forget"), "{asked}");
    let memory = domain_decision(&asked["selection"], "memory");
    assert!(
        memory["reason"]
            .as_str()
            .is_some_and(|r| r.contains("pending")),
        "{memory}"
    );
    assert!(
        !sent_tools(called).iter().any(|t| t == "forget"),
        "{called}"
    );
}

//! OpenTelemetry (issue 40): `loadout serve` with `OTEL_EXPORTER_OTLP_ENDPOINT` sends
//! its spans to a real OTLP/HTTP receiver started here, which decodes each
//! `ExportTraceServiceRequest` with the official protobuf definitions
//! (`opentelemetry-proto`). One chat turn against a scripted model, sent with a
//! W3C `traceparent`, must come back as one trace: the HTTP request's span (a child
//! of the caller's), and under it the routing decision, each model call (GenAI
//! attributes) and the tool call. An MCP `tools/call` with `_meta.traceparent`
//! continues that caller's trace, and its call to an upstream MCP server over HTTP
//! passes the trace on (header and `_meta`).

use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const MCP_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

type Spans = Arc<Mutex<Vec<Span>>>;

/// The OTLP/HTTP receiver: `POST /v1/traces` with a protobuf body.
async fn receiver() -> (String, Spans) {
    let spans: Spans = Arc::default();
    let kept = spans.clone();
    let router = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                match ExportTraceServiceRequest::decode(body) {
                    Ok(request) => {
                        let mut kept = kept.lock().expect("spans");
                        for resource in request.resource_spans {
                            for scope in resource.scope_spans {
                                kept.extend(scope.spans);
                            }
                        }
                        // An empty ExportTraceServiceResponse.
                        (
                            axum::http::StatusCode::OK,
                            [("content-type", "application/x-protobuf")],
                            Vec::new(),
                        )
                    }
                    Err(_) => (
                        axum::http::StatusCode::BAD_REQUEST,
                        [("content-type", "text/plain")],
                        b"not an ExportTraceServiceRequest".to_vec(),
                    ),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    (format!("http://{addr}"), spans)
}

/// The model: first asks for `current_time`, then answers; usage in every answer.
async fn model() -> String {
    let router = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(|axum::Json(request): axum::Json<Value>| async move {
            let after_tool = request["messages"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
            let message = if after_tool {
                json!({"role": "assistant", "content": "It is noon."})
            } else {
                json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "current_time", "arguments": "{\"timezone\": \"Europe/Paris\"}"}}]})
            };
            axum::Json(json!({
                "model": "scripted-1",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
            }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    format!("http://{addr}/v1")
}

/// What the upstream server saw of each `tools/call`: the `traceparent` header and
/// `_meta.traceparent`.
type Seen = Arc<Mutex<Vec<(Option<String>, Option<String>)>>>;

/// A minimal MCP server over streamable HTTP (JSON answers, no SSE), with one tool,
/// `echo`; it keeps the trace context of every call.
async fn upstream() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let kept = seen.clone();
    let post = move |headers: axum::http::HeaderMap, axum::Json(message): axum::Json<Value>| {
        let kept = kept.clone();
        async move {
            use axum::response::IntoResponse as _;
            let Some(id) = message.get("id").cloned() else {
                return axum::http::StatusCode::ACCEPTED.into_response();
            };
            let result = match message["method"].as_str().unwrap_or_default() {
                "initialize" => json!({
                    "protocolVersion": message["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "echo", "version": "1"},
                }),
                "tools/list" => {
                    json!({"tools": [{"name": "echo", "description": "Echoes a text back.",
                    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}]})
                }
                "tools/call" => {
                    let header = headers
                        .get("traceparent")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    let meta = message["params"]["_meta"]["traceparent"]
                        .as_str()
                        .map(str::to_owned);
                    kept.lock().expect("seen").push((header, meta));
                    json!({"content": [{"type": "text", "text": "echoed"}]})
                }
                _ => json!({}),
            };
            axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
        }
    };
    let router = axum::Router::new().route(
        "/mcp",
        axum::routing::post(post)
            .get(|| async { axum::http::StatusCode::METHOD_NOT_ALLOWED })
            .delete(|| async { axum::http::StatusCode::OK }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, router).await });
    (format!("http://{addr}/mcp"), seen)
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(data: &std::path::Path, collector: &str) -> (Server, String) {
    let (child, base) = crate::support::spawn_serve(
        data,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    (Server(child), base)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<AnyValue> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.clone())
}

fn int(span: &Span, key: &str) -> Option<i64> {
    match attribute(span, key)? {
        AnyValue::IntValue(n) => Some(n),
        _ => None,
    }
}

fn text(span: &Span, key: &str) -> Option<String> {
    match attribute(span, key)? {
        AnyValue::StringValue(s) => Some(s),
        _ => None,
    }
}

/// The spans of `trace` once `done` holds for them (or after [`WAIT`]).
async fn spans_of(spans: &Spans, trace: &str, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
    let deadline = Instant::now() + WAIT;
    loop {
        let found: Vec<Span> = spans
            .lock()
            .expect("spans")
            .iter()
            .filter(|s| hex(&s.trace_id) == trace)
            .cloned()
            .collect();
        if done(&found) || Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_turn_is_one_trace_with_its_route_model_and_tool_spans() {
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let (collector, spans) = receiver().await;
    let model = model().await;
    let (upstream_url, upstream_seen) = upstream().await;
    let data = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        data.path().join("loadout.toml"),
        format!("[servers.echo]\nurl = {upstream_url:?}\nkeywords = [\"echo\"]\n"),
    )
    .expect("loadout.toml");
    let (_server, base) = serve(data.path(), &collector);
    let http = reqwest::Client::builder()
        .timeout(WAIT)
        .build()
        .expect("client");
    for (key, value) in [("llm_base_url", model.as_str()), ("llm_model", "scripted")] {
        let response = http
            .put(format!("{base}/api/settings/{key}"))
            .json(&json!({"value": value}))
            .send()
            .await
            .expect("PUT setting");
        assert!(response.status().is_success(), "{key}: {response:?}");
    }
    let response = http
        .post(format!("{base}/api/chat"))
        .header("traceparent", format!("00-{TRACE_ID}-{CALLER_SPAN}-01"))
        .json(&json!({"message": "what time is it in Paris right now?"}))
        .send()
        .await
        .expect("chat");
    let status = response.status();
    let body: Value = response.json().await.expect("JSON");
    assert!(status.is_success(), "{status} {body}");
    assert_eq!(body["answer"], "It is noon.", "{body}");

    let names = |spans: &[Span]| -> Vec<String> { spans.iter().map(|s| s.name.clone()).collect() };
    let trace = spans_of(&spans, TRACE_ID, |found| {
        let names = names(found);
        names.iter().any(|n| n == "POST /api/chat")
            && names.iter().filter(|n| n.starts_with("chat ")).count() >= 2
            && names.iter().any(|n| n == "execute_tool current_time")
            && names.iter().any(|n| n == "loadout.route")
    })
    .await;
    let all = names(&trace);
    let one = |name: &str| -> &Span {
        trace
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no span `{name}` in {all:?}"))
    };
    let request = one("POST /api/chat");
    assert_eq!(hex(&request.parent_span_id), CALLER_SPAN, "{request:?}");
    assert_eq!(
        int(request, "http.response.status_code"),
        Some(200),
        "{request:?}"
    );
    let request_id = hex(&request.span_id);

    let route = one("loadout.route");
    assert_eq!(hex(&route.parent_span_id), request_id, "{all:?}");
    assert!(
        int(route, "loadout.route.tools").is_some_and(|n| n > 0),
        "{route:?}"
    );
    assert!(
        text(route, "loadout.route.stages").is_some_and(|s| s.contains("core:")),
        "{route:?}"
    );

    let model_calls: Vec<&Span> = trace.iter().filter(|s| s.name == "chat scripted").collect();
    assert_eq!(model_calls.len(), 2, "{all:?}");
    for call in &model_calls {
        assert_eq!(hex(&call.parent_span_id), request_id, "{call:?}");
        assert_eq!(
            text(call, "gen_ai.request.model").as_deref(),
            Some("scripted")
        );
        assert_eq!(int(call, "gen_ai.usage.input_tokens"), Some(12), "{call:?}");
        assert_eq!(int(call, "gen_ai.usage.output_tokens"), Some(3), "{call:?}");
    }

    let tool = one("execute_tool current_time");
    assert_eq!(hex(&tool.parent_span_id), request_id, "{all:?}");
    assert_eq!(
        text(tool, "gen_ai.tool.name").as_deref(),
        Some("current_time")
    );
    assert_eq!(text(tool, "loadout.tool.outcome").as_deref(), Some("ok"));
    assert!(tool.end_time_unix_nano >= tool.start_time_unix_nano);
    // The spans nest in time too: the tool ran between the model's two calls.
    assert!(
        model_calls
            .iter()
            .any(|c| c.end_time_unix_nano <= tool.start_time_unix_nano)
    );

    // MCP: a tools/call whose `_meta` carries a traceparent continues that trace.
    let post = |session: Option<&str>, body: Value| {
        let mut request = http
            .post(format!("{base}/mcp"))
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send()
    };
    let response = post(
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "otel-test", "version": "1"}}}),
    )
    .await
    .expect("initialize");
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .expect("session id");
    let _ = response.text().await;
    let _ = post(
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await
    .expect("initialized");
    let called = post(
        Some(&session),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "_meta": {"traceparent": format!("00-{MCP_TRACE_ID}-{CALLER_SPAN}-01")},
            "name": "calculate", "arguments": {"expression": "6*7"}}}),
    )
    .await
    .expect("tools/call")
    .text()
    .await
    .expect("answer");
    assert!(called.contains("42"), "{called}");
    let mcp = spans_of(&spans, MCP_TRACE_ID, |found| {
        found.iter().any(|s| s.name == "execute_tool calculate")
    })
    .await;
    let call = mcp
        .iter()
        .find(|s| s.name == "execute_tool calculate")
        .unwrap_or_else(|| panic!("no MCP call span: {:?}", names(&mcp)));
    assert_eq!(hex(&call.parent_span_id), CALLER_SPAN, "{call:?}");

    // The upstream call: a client span under the MCP call's span, whose context the
    // upstream server receives as the `traceparent` header and in `_meta`.
    let deadline = Instant::now() + WAIT;
    let echoed = loop {
        let answer = post(
            Some(&session),
            json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
                "_meta": {"traceparent": format!("00-{MCP_TRACE_ID}-{CALLER_SPAN}-01")},
                "name": "call_tool", "arguments": {"name": "echo__echo", "arguments": {"text": "hi"}}}}),
        )
        .await
        .expect("tools/call")
        .text()
        .await
        .expect("answer");
        // Until the upstream server is connected its tool is unknown.
        if answer.contains("echoed") || Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(echoed.contains("echoed"), "{echoed}");
    // The wrapper ends after the upstream call it holds, so it may reach the
    // collector in a later export: wait for the call's parent too.
    let mcp = spans_of(&spans, MCP_TRACE_ID, |found| {
        found.iter().any(|call| {
            call.name == "tools/call echo"
                && found
                    .iter()
                    .any(|s| hex(&s.span_id) == hex(&call.parent_span_id))
        })
    })
    .await;
    let client = mcp
        .iter()
        .find(|s| s.name == "tools/call echo")
        .unwrap_or_else(|| panic!("no upstream span: {:?}", names(&mcp)));
    let wrapper = mcp
        .iter()
        .find(|s| hex(&s.span_id) == hex(&client.parent_span_id))
        .unwrap_or_else(|| {
            panic!(
                "the upstream span's parent is not in the trace: {:?}",
                names(&mcp)
            )
        });
    assert_eq!(wrapper.name, "execute_tool call_tool", "{:?}", names(&mcp));
    let sent = format!("00-{MCP_TRACE_ID}-{}-01", hex(&client.span_id));
    let seen = upstream_seen.lock().expect("seen").clone();
    assert!(
        seen.iter()
            .any(|(header, meta)| header.as_deref() == Some(sent.as_str())
                && meta.as_deref() == Some(sent.as_str())),
        "{sent} not in {seen:?}"
    );
}

//! The chat loop against a local OpenAI-compatible test server (axum, in the test, on
//! 127.0.0.1:0) scripted to request tool calls.
//!
//! Every script answers from the request alone (the user message and how many tool
//! results follow it), so concurrent turns stay deterministic.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::support::{client_row, domain_decision};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use loadout_server::app::{App, Config};
use loadout_server::http::{HttpState, app};
use serde_json::{Value, json};
use tower::ServiceExt;

type Script = Arc<dyn Fn(&Value) -> (StatusCode, Value) + Send + Sync>;

/// The fake model: answers with the script, keeps every request it received.
struct FakeModel {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Value>>>,
}

impl FakeModel {
    async fn start(script: Script) -> FakeModel {
        let requests: Arc<Mutex<Vec<Value>>> = Arc::default();
        let seen = requests.clone();
        let router = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move |axum::Json(request): axum::Json<Value>| {
                let script = script.clone();
                let seen = seen.clone();
                async move {
                    let (status, body) = script(&request);
                    seen.lock().expect("requests").push(request);
                    (status, axum::Json(body))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, router).await });
        FakeModel { addr, requests }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The requests whose first user message contains `marker`.
    fn requests_for(&self, marker: &str) -> Vec<Value> {
        self.requests
            .lock()
            .expect("requests")
            .iter()
            .filter(|r| last_user_message(r).contains(marker))
            .cloned()
            .collect()
    }
}

fn last_user_message(request: &Value) -> String {
    request["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_owned()
}

/// Tool results after the last user message: the model's step within the turn.
fn step_of(request: &Value) -> usize {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let last_user = messages
        .iter()
        .rposition(|m| m["role"] == "user")
        .unwrap_or(0);
    messages[last_user..]
        .iter()
        .filter(|m| m["role"] == "tool")
        .count()
}

fn tool_names(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn last_tool_result(request: &Value) -> String {
    request["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "tool"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_owned()
}

fn call(id: &str, name: &str, arguments: Value) -> (StatusCode, Value) {
    let message = json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": id, "type": "function", "function": {"name": name, "arguments": arguments.to_string()}}]});
    (
        StatusCode::OK,
        json!({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}),
    )
}

fn answer(text: &str) -> (StatusCode, Value) {
    let message = json!({"role": "assistant", "content": text});
    (
        StatusCode::OK,
        json!({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}),
    )
}

/// The main script: a message about memory; the model first calls `write_file`
/// (not routed: refused) on `refused.txt`, loads it, calls it again on
/// `parrot.txt`, then answers.
fn load_script(root: &Path) -> Script {
    let target = root.join("parrot.txt").display().to_string();
    let refused = root.join("refused.txt").display().to_string();
    Arc::new(move |request| {
        if !last_user_message(request).contains("parrot") {
            return answer("noted");
        }
        match step_of(request) {
            0 => call(
                "c1",
                "write_file",
                json!({"path": refused, "content": "Polly"}),
            ),
            1 => call("c2", "load_tools", json!({"names": ["write_file"]})),
            2 => call(
                "c3",
                "write_file",
                json!({"path": target, "content": "Polly"}),
            ),
            _ => answer("Saved it."),
        }
    })
}

async fn open(dir: &Path) -> HttpState {
    let config = Config::in_data_dir(dir.to_path_buf());
    HttpState::new(App::open(&config).await.expect("open app"), None)
}

/// An app on `dir` with the model and the filesystem domain configured.
async fn configured(dir: &Path, model: &FakeModel, root: &Path) -> HttpState {
    let state = open(dir).await;
    let settings = &state.app.settings;
    settings
        .set("llm_base_url", &model.base_url())
        .await
        .expect("set");
    settings.set("llm_model", "scripted").await.expect("set");
    settings
        .set(
            "filesystem_roots",
            &json!([root.display().to_string()]).to_string(),
        )
        .await
        .expect("set");
    state
}

async fn send(
    state: &HttpState,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    crate::support::send(&app(state.clone()), method, uri, body).await
}

fn events_of<'a>(body: &'a Value, kind: &str) -> Vec<&'a Value> {
    body["events"]
        .as_array()
        .map(|events| events.iter().filter(|e| e["event"] == kind).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_routed_tools_are_sent_and_unrouted_calls_are_refused_until_loaded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("root");
    let model = FakeModel::start(load_script(root.path())).await;
    let state = configured(dir.path(), &model, root.path()).await;

    let (status, body) = send(
        &state,
        "POST",
        "/api/chat",
        Some(json!({"session": "s1", "message": "remember that my parrot is called Polly"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "Saved it.");
    assert_eq!(body["steps"], 4);

    let requests = model.requests_for("parrot");
    assert_eq!(requests.len(), 4);
    // Step 1: the router's selection only: memory and core, not the filesystem.
    let first = tool_names(&requests[0]);
    assert!(first.contains(&"remember".to_owned()), "{first:?}");
    assert!(first.contains(&"load_tools".to_owned()), "{first:?}");
    assert!(!first.contains(&"write_file".to_owned()), "{first:?}");
    let system = requests[0]["messages"][0]["content"].as_str().unwrap_or("");
    assert!(system.contains("load_tools"), "{system}");

    // Step 2: the unrouted call was refused, and the tool never ran.
    let refusal = last_tool_result(&requests[1]);
    assert!(
        refusal.contains("refused") && refusal.contains("load_tools"),
        "{refusal}"
    );
    assert!(
        !root.path().join("refused.txt").exists(),
        "a refused call ran"
    );
    assert!(!tool_names(&requests[1]).contains(&"write_file".to_owned()));

    // Step 3: after load_tools, the same turn sends write_file.
    assert!(tool_names(&requests[2]).contains(&"write_file".to_owned()));
    let loaded = last_tool_result(&requests[2]);
    assert!(loaded.contains("write_file"), "{loaded}");
    assert_eq!(
        std::fs::read_to_string(root.path().join("parrot.txt")).expect("written"),
        "Polly"
    );

    let results = events_of(&body, "tool_result");
    assert_eq!(results.len(), 3);
    assert_eq!(results[0]["refused"], true);
    assert_eq!(results[1]["ok"], true);
    assert_eq!(results[2]["ok"], true);
    let selections = events_of(&body, "selection");
    assert_eq!(
        selections.len(),
        2,
        "the first selection and the one after load_tools"
    );
    // What the model was sent is the routed selection, no more and no less.
    let routed: Vec<String> = selections[0]["tools"]
        .as_array()
        .expect("selected tools")
        .iter()
        .filter_map(|t| t.as_str().map(str::to_owned))
        .collect();
    let mut sent = first.clone();
    let mut expected = routed;
    sent.sort();
    expected.sort();
    assert_eq!(sent, expected);
    assert!(
        selections[1]["tools"]
            .as_array()
            .is_some_and(|t| t.contains(&json!("write_file")))
    );

    // Issue 29: the miss the model repaired (`write_file`, fetched with load_tools
    // after routing, then called with success) is learned from the turn's message,
    // as a repair; the meta-tool is not learned.
    state.app.routing().learner.flush().await;
    let rows = state
        .app
        .store()
        .learned_rows(None, None)
        .await
        .expect("learned rows");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].tools, ["write_file"]);
    assert_eq!(rows[0].source, "repair");
    assert_eq!(rows[0].message, "remember that my parrot is called Polly");
    assert_eq!(rows[0].session.as_deref(), Some("s1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_session_state_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("root");
    let model = FakeModel::start(load_script(root.path())).await;
    let state = configured(dir.path(), &model, root.path()).await;
    let (status, body) = send(
        &state,
        "POST",
        "/api/chat",
        Some(json!({"session": "keep", "message": "remember that my parrot is called Polly"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    state.shutdown().await;
    // Every tool call of the turn is in the audit log, the refused one included.
    let audit = state.app.store().audit_tail(10).await.expect("audit");
    let outcomes: Vec<(&str, &str, &str)> = audit
        .iter()
        .map(|row| (row.client.as_str(), row.tool.as_str(), row.outcome.as_str()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("chat", "write_file", "refused"),
            ("chat", "load_tools", "ok"),
            ("chat", "write_file", "ok")
        ]
    );
    drop(state);

    let state = open(dir.path()).await;
    let (status, session) = send(&state, "GET", "/api/sessions/keep", None).await;
    assert_eq!(status, StatusCode::OK, "{session}");
    let roles: Vec<&str> = session["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["role"].as_str())
        .collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant"
        ]
    );
    let calls = session["tool_calls"].as_array().expect("tool calls");
    let names: Vec<&str> = calls.iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["write_file", "load_tools", "write_file"]);
    assert_eq!(calls[0]["result"]["refused"], true);
    assert_eq!(calls[2]["result"]["ok"], true);
    assert!(
        session["selections"]
            .as_array()
            .is_some_and(|s| s.len() >= 2),
        "{session}"
    );
    let filesystem = session["domains"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["domain"] == "filesystem"))
        .expect("filesystem state kept");
    assert_eq!(filesystem["last_used_turn"], 1);

    // The next turn, on the new app, keeps the filesystem (sticky) and sees the history.
    let (status, routed) = send(
        &state,
        "POST",
        "/api/route",
        Some(json!({"session": "keep", "message": "thanks, and what else is new"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{routed}");
    assert_eq!(routed["turn"], 2);
    assert_eq!(
        routed["selection"]["domains"]
            .as_array()
            .and_then(|d| d.iter().find(|d| d["domain"] == "filesystem"))
            .map(|d| d["stage"].clone()),
        Some(json!("sticky"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_at_once_do_not_see_each_others_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("root");
    let model = FakeModel::start(load_script(root.path())).await;
    let state = configured(dir.path(), &model, root.path()).await;
    let (parrot, dog) = tokio::join!(
        send(
            &state,
            "POST",
            "/api/chat",
            Some(
                json!({"session": "parrot-owner", "message": "remember that my parrot is called Polly"})
            )
        ),
        send(
            &state,
            "POST",
            "/api/chat",
            Some(json!({"session": "dog-owner", "message": "remember that my dog is called Rex"}))
        ),
    );
    assert_eq!(parrot.0, StatusCode::OK, "{}", parrot.1);
    assert_eq!(dog.0, StatusCode::OK, "{}", dog.1);
    assert_eq!(dog.1["answer"], "noted");
    for request in model.requests_for("dog") {
        assert!(!tool_names(&request).contains(&"write_file".to_owned()));
        assert!(
            !request.to_string().contains("parrot"),
            "the dog session saw the parrot session"
        );
    }
    let (_, dog_session) = send(&state, "GET", "/api/sessions/dog-owner", None).await;
    assert_eq!(dog_session["domains"], json!([]), "{dog_session}");
    assert_eq!(dog_session["messages"].as_array().map(Vec::len), Some(2));
    let (_, parrot_session) = send(&state, "GET", "/api/sessions/parrot-owner", None).await;
    assert!(parrot_session["domains"].to_string().contains("filesystem"));

    // The next turn of the dog session still does not send the parrot session's tools.
    let (_, routed) = send(
        &state,
        "POST",
        "/api/route",
        Some(json!({"session": "dog-owner", "message": "remember he likes walks"})),
    )
    .await;
    // Filesystem may come as the next likeliest tools with room to spare, never as
    // a domain this session holds.
    let filesystem = domain_decision(&routed["selection"], "filesystem");
    assert_ne!(filesystem["stage"], "sticky", "{filesystem}");
    assert!(
        !filesystem["reason"]
            .as_str()
            .is_some_and(|r| r.contains("domain_sticky") || r.contains("domain_last_turn")),
        "{filesystem}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_yields_each_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("root");
    let model = FakeModel::start(load_script(root.path())).await;
    let state = configured(dir.path(), &model, root.path()).await;
    let request = Request::builder()
        .method("POST")
        .uri("/api/chat")
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(Body::from(
            json!({"session": "sse", "message": "remember that my parrot is called Polly"})
                .to_string(),
        ))
        .expect("request");
    let response = app(state.clone()).oneshot(request).await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let bytes = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        response.into_body().collect(),
    )
    .await
    .expect("stream ends")
    .expect("body")
    .to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    let kinds: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(kinds.first(), Some(&"session"));
    assert_eq!(kinds.last(), Some(&"final"));
    for kind in ["selection", "assistant", "tool_call", "tool_result"] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    assert_eq!(kinds.iter().filter(|k| **k == "tool_result").count(), 3);
    let last_data = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("data");
    let last: Value = serde_json::from_str(last_data).expect("JSON data");
    assert_eq!(last["answer"], "Saved it.");
}

#[tokio::test]
async fn without_a_model_chat_answers_409_and_route_still_works() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = open(dir.path()).await;
    let (status, body) = send(
        &state,
        "POST",
        "/api/chat",
        Some(json!({"message": "hello"})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["kind"], "not_configured");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("not configured: set llm_base_url"),
        "{body}"
    );
    let (status, _) = send(
        &state,
        "POST",
        "/api/route",
        Some(json!({"message": "hello"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_failures_answer_502_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("root");
    let model = FakeModel::start(Arc::new(|_: &Value| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": {"message": "model crashed"}}),
        )
    }))
    .await;
    let state = configured(dir.path(), &model, root.path()).await;
    let (status, body) = send(
        &state,
        "POST",
        "/api/chat",
        Some(json!({"session": "bad", "message": "hello"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("HTTP 500") && message.contains("model crashed"),
        "{message}"
    );

    // Nothing listens on this port once the listener is gone.
    let unused = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = unused.local_addr().expect("addr").port();
    drop(unused);
    state
        .app
        .settings
        .set("llm_base_url", &format!("http://127.0.0.1:{port}/v1"))
        .await
        .expect("set");
    let (status, body) = send(
        &state,
        "POST",
        "/api/chat",
        Some(json!({"session": "bad", "message": "hello"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("cannot reach the model"),
        "{body}"
    );
}

#[tokio::test]
async fn the_dashboard_is_served_at_the_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = open(dir.path()).await;
    let (status, body) = send(&state, "GET", "/", None).await;
    assert_eq!(status, StatusCode::OK);
    let page = body.as_str().unwrap_or("");
    assert!(
        page.contains("<title>Loadout</title>") && page.contains("/api/chat"),
        "{page:.200}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mcp_endpoint_is_mounted_at_mcp() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = open(dir.path()).await.with_mcp().await.expect("mcp");
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "chat-test", "version": "1"}}});
    let request = Request::builder()
        .method("POST")
        .uri("/mcp")
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(Body::from(initialize.to_string()))
        .expect("request");
    let (status, bytes) = crate::support::send_request(&app(state.clone()), request).await;
    let text = String::from_utf8_lossy(&bytes);
    assert_eq!(status, StatusCode::OK, "{text}");
    assert!(text.contains("\"loadout\""), "{text}");
    state.shutdown().await;
}

/// Three steps per turn (two `calculate` calls, then the answer): enough awaits for two
/// concurrent turns of one session to interleave if nothing ordered them.
fn counting_script() -> Script {
    Arc::new(|request| {
        let message = last_user_message(request);
        match step_of(request) {
            0 => call("k1", "calculate", json!({"expression": "1 + 1"})),
            1 => call("k2", "calculate", json!({"expression": "2 + 2"})),
            _ => answer(&format!("done: {message}")),
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_turns_of_one_session_run_one_after_the_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("root");
    let model = FakeModel::start(counting_script()).await;
    let state = configured(dir.path(), &model, root.path()).await;
    let (_, created) = send(&state, "POST", "/api/sessions", None).await;
    let session = created["id"].as_str().expect("id").to_owned();

    let turns = (0..4).map(|i| {
        let state = state.clone();
        let session = session.clone();
        tokio::spawn(async move {
            send(
                &state,
                "POST",
                "/api/chat",
                Some(json!({"session": session, "message": format!("turn {i}")})),
            )
            .await
        })
    });
    for turn in turns.collect::<Vec<_>>() {
        let (status, body) = turn.await.expect("turn task");
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    let (_, stored) = send(&state, "GET", &format!("/api/sessions/{session}"), None).await;
    let messages = stored["messages"].as_array().expect("messages");
    // Each turn is one block: user, then its calls and results, then its answer; the
    // turn number of every message is its block's.
    let roles: Vec<&str> = messages.iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles.len(), 4 * 6, "{roles:?}");
    for (block, chunk) in messages.chunks(6).enumerate() {
        let roles: Vec<&str> = chunk.iter().filter_map(|m| m["role"].as_str()).collect();
        assert_eq!(
            roles,
            [
                "user",
                "assistant",
                "tool",
                "assistant",
                "tool",
                "assistant"
            ],
            "turn {block}: {roles:?}"
        );
        let turn = &chunk[0]["turn"];
        assert!(chunk.iter().all(|m| &m["turn"] == turn), "{chunk:?}");
        let asked = chunk[0]["content"].as_str().unwrap_or_default();
        let answered = chunk[5]["content"]["content"]
            .as_str()
            .or_else(|| chunk[5]["content"].as_str())
            .unwrap_or_default();
        assert!(
            answered.ends_with(asked),
            "{asked:?} answered by {answered:?}"
        );
    }
}

loadout::domain! {
    name: "test_shelf",
    description: "A bookshelf that exists only in the integration tests.",
    keywords: ["shelf"],
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct RemoveBookArgs {
    /// The book's id.
    book_id: u32,
}

/// Every book on the shelf, with its id.
#[loadout::tool(domain = "test_shelf")]
fn shelf_list_books() -> Vec<(u32, String)> {
    vec![(1, "Dune".to_owned()), (2, "Emma".to_owned())]
}

/// Take a book away by its id.
#[loadout::tool(domain = "test_shelf")]
fn shelf_remove_book(args: RemoveBookArgs) -> u32 {
    args.book_id
}

/// Tools that outrank `shelf_remove_book` for any message about the shelf, so the
/// domain (13 tools, over the cap of 12 per domain) leaves it out.
macro_rules! shelf_chores {
    ($($name:ident => $doc:literal),* $(,)?) => {
        $(
            #[doc = $doc]
            #[loadout::tool(domain = "test_shelf")]
            fn $name() -> u32 {
                0
            }
        )*
    };
}

shelf_chores! {
    shelf_dust_top => "Dust the top of the shelf.",
    shelf_dust_sides => "Dust the sides of the shelf.",
    shelf_level => "Level the shelf.",
    shelf_tighten => "Tighten the shelf's screws.",
    shelf_label => "Label the shelf.",
    shelf_light_on => "Light the shelf.",
    shelf_measure => "Measure the shelf.",
    shelf_photograph => "Photograph the shelf.",
    shelf_polish => "Polish the shelf.",
    shelf_sort => "Sort the shelf by colour.",
    shelf_count => "Count what is on the shelf.",
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_finder_is_called_the_next_model_step_gets_its_next_steps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("root");
    let script: Script = Arc::new(|request| {
        if !last_user_message(request).contains("shelf") {
            return answer("noted");
        }
        match step_of(request) {
            0 => call("c1", "shelf_list_books", json!({})),
            1 => call("c2", "shelf_remove_book", json!({"book_id": 2})),
            _ => answer("Emma is gone."),
        }
    });
    let model = FakeModel::start(script).await;
    let state = configured(dir.path(), &model, root.path()).await;
    let (status, body) = send(
        &state,
        "POST",
        "/api/chat",
        Some(json!({"session": "shelf", "message": "tidy my shelf, Emma can go"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "Emma is gone.");

    let requests = model.requests_for("shelf");
    assert_eq!(requests.len(), 3);
    let first = tool_names(&requests[0]);
    assert!(first.contains(&"shelf_list_books".to_owned()), "{first:?}");
    // The listing ran: the tool that takes its ids is sent from the next step on, and
    // the call to it runs.
    let second = tool_names(&requests[1]);
    assert!(
        second.contains(&"shelf_remove_book".to_owned()),
        "{second:?}"
    );
    let results = events_of(&body, "tool_result");
    assert_eq!(results.len(), 2);
    assert_eq!(results[1]["ok"], true, "{}", results[1]);
    assert_eq!(results[1]["content"], "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_never_answers_is_stopped_at_the_step_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("root");
    let model = FakeModel::start(Arc::new(|request| {
        call(
            &format!("c{}", step_of(request)),
            "calculate",
            json!({"expression": "1 + 1"}),
        )
    }))
    .await;
    let state = configured(dir.path(), &model, root.path()).await;
    let (status, body) = send(
        &state,
        "POST",
        "/api/chat",
        Some(json!({"session": "loop", "message": "calculate one plus one, forever"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let max = loadout_server::http::chat::MAX_STEPS;
    assert_eq!(body["steps"], max);
    assert_eq!(body["stopped"], "step_limit");
    assert_eq!(model.requests_for("forever").len(), max);
    assert_eq!(events_of(&body, "tool_result").len(), max);
    let (_, shown) = send(&state, "GET", "/api/sessions/loop", None).await;
    let last = shown["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(last["role"], "assistant", "{shown}");
    assert_eq!(last["content"]["stopped"], "step_limit", "{last}");
}

/// PostgreSQL stops in the middle of a turn: the tools still run and the model's
/// answer still comes back, and the response says how many of the turn's writes the
/// store refused, so a client knows its history is incomplete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_writes_fail_says_how_many_were_not_saved() {
    use loadout_store::testing;
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((t, outage)) = testing::postgres_outage_store(dir.path(), "unsaved-turn test").await
    else {
        return;
    };
    let outage = Arc::new(Mutex::new(outage));
    let stopper = outage.clone();
    let model = FakeModel::start(Arc::new(move |request| {
        if step_of(request) == 0 {
            // The server goes away while the model thinks.
            stopper.lock().expect("outage").stop();
            call("c1", "calculate", json!({"expression": "6 * 7"}))
        } else {
            answer(&format!("It is {}.", last_tool_result(request)))
        }
    }))
    .await;
    let registry = Arc::new(loadout_domains::registry().expect("registry"));
    let app = App::with_registry(registry, t.store.clone());
    app.settings
        .set("llm_base_url", &model.base_url())
        .await
        .expect("set");
    app.settings
        .set("llm_model", "scripted")
        .await
        .expect("set");
    let state = HttpState::new(app, None);
    let (status, body) = send(
        &state,
        "POST",
        "/api/chat",
        Some(json!({"session": "unsaved", "message": "calculate six times seven"})),
    )
    .await;
    outage.lock().expect("outage").end();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["answer"].as_str().is_some_and(|a| a.contains("42")),
        "{body}"
    );
    // The assistant's call, the tool's result and the answer, at least.
    let unsaved = body["unsaved"].as_u64().expect("unsaved count");
    assert!(unsaved >= 3, "{body}");
    let finals = events_of(&body, "final");
    assert_eq!(finals.len(), 1);
    assert_eq!(finals[0]["unsaved"], unsaved);
}

/// An upstream MCP server's tools (`loadout.toml`) are routed for chat and
/// `/api/route` like linked ones, and a chat turn's call reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_tools_are_routed_and_called_in_chat() {
    let Some(dir) = crate::support::data_dir_with_fake_upstream() else {
        return;
    };
    let model = FakeModel::start(Arc::new(|request: &Value| match step_of(request) {
        0 => call("u1", "fake__echo", json!({"text": "hi"})),
        _ => answer(&format!("it said: {}", last_tool_result(request))),
    }))
    .await;
    let state = open(dir.path())
        .await
        .with_mcp()
        .await
        .expect("mcp")
        .with_upstream_tools();
    let settings = &state.app.settings;
    settings
        .set("llm_base_url", &model.base_url())
        .await
        .expect("set");
    settings.set("llm_model", "scripted").await.expect("set");

    let (status, body) = send(&state, "GET", "/api/domains", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.to_string().contains("\"mcp_fake\""), "{body}");

    // Routed by the upstream's keyword; one-off messages route it too.
    let (status, body) = send(
        &state,
        "POST",
        "/api/route",
        Some(json!({"message": "echo this back to me"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let routed: Vec<&str> = body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(routed.contains(&"fake__echo"), "{routed:?}");
    // A message that does not ask for it leaves it out.
    let (_, body) = send(
        &state,
        "POST",
        "/api/route",
        Some(json!({"message": "remember that my parrot is called Polly"})),
    )
    .await;
    assert!(!body["tools"].to_string().contains("fake__echo"), "{body}");

    let (status, body) = send(
        &state,
        "POST",
        "/api/chat",
        Some(json!({"session": "up1", "message": "echo hi back to me"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "it said: echo: hi", "{body}");
    let results = events_of(&body, "tool_result");
    assert_eq!(results.len(), 1, "{body}");
    assert_eq!(results[0]["ok"], true, "{body}");

    // The upstream adds a tool (`grow`): turns that start after it route it.
    let registry = state.app.routing().router().registry().clone();
    registry
        .call("fake__grow", json!({}), state.app.context())
        .await
        .expect("grow");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (status, body) = send(
            &state,
            "POST",
            "/api/route",
            Some(json!({"message": "echo the extra one"})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if body["tools"].to_string().contains("fake__extra") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fake__extra was not routed within 20 s: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (_, body) = send(&state, "GET", "/api/domains", None).await;
    assert!(body.to_string().contains("fake__extra"), "{body}");
    state.shutdown().await;
}

/// The value of one series (name and labels exactly as rendered) in Prometheus text.
fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

/// Issue 32: `GET /metrics` after a routed turn whose model repaired a miss with
/// load_tools. The recorder is per process, so other tests add to the same series:
/// values are checked as lower bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_turns_calls_and_repaired_misses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("root");
    let model = FakeModel::start(load_script(root.path())).await;
    let state = configured(dir.path(), &model, root.path()).await;
    let (status, body) = send(
        &state,
        "POST",
        "/api/chat",
        Some(json!({"session": "m1", "message": "remember that my parrot is called Polly"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, body) = send(&state, "GET", "/metrics", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let text = body.as_str().expect("text");
    let at_least = |series: &str, n: f64| {
        let value = series_value(text, series);
        assert!(
            value.is_some_and(|v| v >= n),
            "{series} = {value:?} in\n{text}"
        );
    };
    at_least(
        r#"loadout_tool_calls_total{tool="write_file",outcome="refused"}"#,
        1.0,
    );
    at_least(
        r#"loadout_tool_calls_total{tool="write_file",outcome="ok"}"#,
        1.0,
    );
    at_least(
        r#"loadout_tool_calls_total{tool="load_tools",outcome="ok"}"#,
        1.0,
    );
    at_least(r#"loadout_misses_repaired_total{via="load_tools"}"#, 1.0);
    at_least(r#"loadout_route_seconds_count{path="lexical"}"#, 1.0);
    at_least(
        r#"loadout_route_seconds_bucket{path="lexical",le="+Inf"}"#,
        1.0,
    );
    at_least("loadout_turn_tools_count", 1.0);
    at_least(r#"loadout_turn_tokens_bucket{le="+Inf"}"#, 1.0);
    // Set by every learner's index build in this process (tests run in parallel), so
    // its value here is whichever build came last: a whole count.
    assert!(
        series_value(text, "loadout_learned_entries").is_some_and(|n| n >= 0.0 && n.fract() == 0.0),
        "{text}"
    );
    assert!(
        text.contains("# TYPE loadout_route_seconds histogram"),
        "{text}"
    );
}

/// Issue 32: each upstream server's health is a gauge of `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_upstream_health() {
    let Some(dir) = crate::support::data_dir_with_fake_upstream() else {
        return;
    };
    let state = open(dir.path())
        .await
        .with_mcp()
        .await
        .expect("mcp")
        .with_upstream_tools();
    let (status, body) = send(&state, "GET", "/metrics", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let text = body.as_str().expect("text");
    assert_eq!(
        series_value(text, r#"loadout_upstream_up{server="fake"}"#),
        Some(1.0),
        "{text}"
    );
    state.shutdown().await;
}

/// Issue 32: the event stream's error said `model` where the JSON error says
/// `model_error`; the session's error message held an object where the user's
/// message holds text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_failure_has_one_kind_and_a_text_message_in_history() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("root");
    let model = FakeModel::start(Arc::new(|_: &Value| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": {"message": "model crashed"}}),
        )
    }))
    .await;
    let state = configured(dir.path(), &model, root.path()).await;
    let (status, body) = send(
        &state,
        "POST",
        "/api/chat",
        Some(json!({"session": "err", "message": "hello"})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let json_kind = body["error"]["kind"].clone();
    assert_eq!(json_kind, "model_error");

    let request = Request::builder()
        .method("POST")
        .uri("/api/chat")
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(Body::from(
            json!({"session": "err", "message": "hello again"}).to_string(),
        ))
        .expect("request");
    let response = app(state.clone()).oneshot(request).await.expect("response");
    let bytes = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        response.into_body().collect(),
    )
    .await
    .expect("stream ends")
    .expect("body")
    .to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let error = lines
        .iter()
        .position(|l| *l == "event: error")
        .and_then(|i| lines[i + 1..].iter().find_map(|l| l.strip_prefix("data: ")))
        .expect("an error event");
    let error: Value = serde_json::from_str(error).expect("JSON data");
    assert_eq!(error["kind"], json_kind, "{error}");

    let (_, session) = send(&state, "GET", "/api/sessions/err", None).await;
    let messages = session["messages"].as_array().expect("messages");
    let errors: Vec<&Value> = messages.iter().filter(|m| m["role"] == "error").collect();
    assert_eq!(errors.len(), 2, "{session}");
    for error in errors {
        let content = error["content"].as_str().unwrap_or_default();
        assert!(content.contains("model crashed"), "{error}");
    }
    assert!(
        messages
            .iter()
            .filter(|m| m["role"] == "user")
            .all(|m| m["content"].is_string())
    );
}

/// A miss the model found with `search_tools`, then loaded, is counted as repaired by
/// search (the counter is per process: compared before and after).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_a_miss_found_by_search_then_loaded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("root");
    let model = FakeModel::start(Arc::new(|request: &Value| {
        let message = last_user_message(request);
        match (message.contains("cat"), step_of(request)) {
            (true, 0) => call("s1", "search_tools", json!({"query": "write a file"})),
            (true, 1) => call("s2", "load_tools", json!({"names": ["write_file"]})),
            _ => answer("done"),
        }
    }))
    .await;
    let state = configured(dir.path(), &model, root.path()).await;
    let repaired = |text: &str, via: &str| {
        series_value(
            text,
            &format!("loadout_misses_repaired_total{{via=\"{via}\"}}"),
        )
        .unwrap_or(0.0)
    };
    let metrics = || async {
        let (status, body) = send(&state, "GET", "/metrics", None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body.as_str().expect("text").to_owned()
    };
    let before = metrics().await;
    let (status, body) = send(
        &state,
        "POST",
        "/api/chat",
        Some(json!({"session": "cat", "message": "remember that my cat is called Tom"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let after = metrics().await;
    assert!(
        repaired(&after, "search_tools") >= repaired(&before, "search_tools") + 1.0,
        "{after}"
    );
}

/// Issue 40: `/api/chat` with a client's token is narrowed to the client's set: the
/// model is sent core and the client's read-only tools of its domains only, a call
/// outside them is refused by name and never runs, and the audit names the client.
/// The operator's token on the same message gets the write tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_chat_turn_sees_and_calls_only_its_tools() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = tempfile::tempdir().expect("root");
    let model = FakeModel::start(Arc::new(|request: &Value| match step_of(request) {
        0 if last_user_message(request).contains("client") => {
            call("c1", "remember", json!({"content": "my parrot is Polly"}))
        }
        _ => answer("done"),
    }))
    .await;
    let plain = configured(dir.path(), &model, root.path()).await;
    let store = plain.app.store().clone();
    let client_token = "client-token-of-the-notes-reader";
    store
        .client_insert(loadout_store::ClientRow {
            domains: vec!["memory".into()],
            read_only: true,
            ..client_row("notes-reader", client_token)
        })
        .await
        .expect("insert client");
    let operator = "operator-token-0123456789";
    let state = HttpState::new(
        plain.app.clone(),
        Some(loadout_server::mcp::BearerToken::new(operator).expect("token")),
    );
    let chat = |token: &str, message: &str| {
        Request::builder()
            .method("POST")
            .uri("/api/chat")
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::from(json!({"message": message}).to_string()))
            .expect("request")
    };
    let (status, bytes) = crate::support::send_request(
        &app(state.clone()),
        chat(
            client_token,
            "as a client, remember that my parrot is called Polly",
        ),
    )
    .await;
    let body: Value = serde_json::from_slice(&bytes).expect("JSON");
    assert_eq!(status, StatusCode::OK, "{body}");
    let requests = model.requests_for("as a client");
    let sent = tool_names(&requests[0]);
    assert!(sent.contains(&"recall".to_owned()), "{sent:?}");
    assert!(!sent.contains(&"remember".to_owned()), "{sent:?}");
    // The session meta-tools stay: they change what is sent, not data.
    assert!(sent.contains(&"load_tools".to_owned()), "{sent:?}");
    let refusal = last_tool_result(&requests[1]);
    assert!(
        refusal.contains("refused") && refusal.contains("notes-reader"),
        "{refusal}"
    );
    let audited = store.audit_tail(5).await.expect("audit");
    assert!(
        audited
            .iter()
            .any(|r| r.tool == "remember" && r.client == "notes-reader" && r.outcome == "refused"),
        "{audited:?}"
    );
    assert!(
        store
            .audit_tail(50)
            .await
            .expect("audit")
            .iter()
            .all(|r| !(r.tool == "remember" && r.outcome == "ok")),
        "the refused call ran"
    );

    let (status, _) = crate::support::send_request(
        &app(state.clone()),
        chat(
            operator,
            "as the operator, remember that my parrot is called Polly",
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let sent = tool_names(&model.requests_for("as the operator")[0]);
    assert!(sent.contains(&"remember".to_owned()), "{sent:?}");
}

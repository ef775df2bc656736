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

/// Defect 3: `set_setting filesystem_roots ["/"]` followed by `read_file /etc/shadow`
/// returned the file; `llm_base_url` took a metadata address. The model's tool now
/// refuses operator keys, and the file stays out of reach.
#[tokio::test]
async fn the_model_cannot_widen_its_own_sandbox() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = loadout_server::app::Config::in_data_dir(dir.path().to_path_buf());
    let app = loadout_server::app::App::open(&config)
        .await
        .expect("open app");
    let call = |tool: &'static str, args: Value| {
        let app = app.clone();
        async move {
            app.registry
                .call(tool, args, app.context().with_client("model"))
                .await
        }
    };
    for (key, value) in [
        ("filesystem_roots", "[\"/\"]"),
        ("llm_base_url", "http://169.254.169.254/latest/meta-data/"),
        ("embeddings_base_url", "http://169.254.169.254/"),
        ("decision_log", "off"),
        ("learning", "on"),
        ("tracker_url", "http://169.254.169.254/"),
    ] {
        let refused = call("set_setting", json!({"key": key, "value": value}))
            .await
            .expect_err(key);
        let message = refused.to_string();
        assert!(
            message.contains("set by the operator") && message.contains("loadout settings set"),
            "{key}: {message}"
        );
        assert_eq!(app.settings.get(key).await.expect("read"), None, "{key}");
    }
    let read = call("read_file", json!({"path": "/etc/shadow"})).await;
    assert!(
        matches!(read, Err(loadout::ToolError::NotConfigured { .. })),
        "{read:?}"
    );
    // Credentials and names are still the model's to set.
    call(
        "set_setting",
        json!({"key": "llm_api_key", "value": "sk-from-chat"}),
    )
    .await
    .expect("a credential");
}

/// Defect 8: a value that cannot work is refused when it is set, with the reason,
/// instead of reporting the domain active (`filesystem_roots = "not json"`) or
/// logging plain behind the operator's back (`decision_log = "bogus"`).
#[tokio::test]
async fn settings_values_are_checked_when_set() {
    let (_dir, app) = crate::support::http_app(None).await;
    for (key, value, reason) in [
        ("filesystem_roots", "not json", "not an absolute path"),
        (
            "filesystem_roots",
            "[\"/no/such/folder\"]",
            "cannot be opened",
        ),
        ("decision_log", "bogus", "plain, hash, off"),
        ("decision_log_days", "ten", "whole number"),
        ("llm_base_url", "localhost:11434", "http://"),
    ] {
        let (status, body) = crate::support::send(
            &app,
            "PUT",
            &format!("/api/settings/{key}"),
            Some(json!({ "value": value })),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{key} = {value}: {body}");
        assert_eq!(body["error"]["kind"], "bad_request");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(reason), "{key} = {value}: {message}");
        let (status, _) =
            crate::support::send(&app, "GET", &format!("/api/settings/{key}"), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{key} was stored");
    }
    let (_, body) = crate::support::send(&app, "GET", "/api/domains", None).await;
    let filesystem = body["domains"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == "filesystem"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(filesystem["active"], false, "{filesystem}");
}

/// Defect 8: `token_budget: null` was accepted though the schema says integer, and a
/// path that is not UTF-8 got a plain-text 400.
#[tokio::test]
async fn nulls_and_bad_paths_get_json_400s() {
    let (_dir, app) = crate::support::http_app(None).await;
    for body in [
        json!({"message": "hello", "token_budget": null}),
        json!({"message": "hello", "session": null}),
    ] {
        let (status, answer) =
            crate::support::send(&app, "POST", "/api/route", Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["kind"], "bad_request", "{answer}");
    }
    let (status, _) = crate::support::send(
        &app,
        "POST",
        "/api/route",
        Some(json!({"message": "hello", "token_budget": 500})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    for uri in ["/api/sessions/%FF%FE", "/api/settings/%C3%28"] {
        let (status, body) = send_request(
            &app,
            Request::get(uri).body(Body::empty()).expect("request"),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}");
        let body: Value = serde_json::from_slice(&body).expect("a JSON body");
        assert_eq!(body["error"]["kind"], "bad_request", "{uri}: {body}");
    }
}

/// A tool that never answers, standing for an upstream server that hangs; it says
/// when its call is dropped.
struct Hangs(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl loadout::ExternalCall for Hangs {
    fn call(&self, _tool: &str, _args: Value) -> loadout::CallFuture {
        struct Dropped(std::sync::Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let dropped = Dropped(self.0.clone());
        Box::pin(async move {
            let _dropped = dropped;
            std::future::pending::<()>().await;
            Ok(Value::Null)
        })
    }
}

/// Every tool call has a wall clock: one that never answers is stopped, its work
/// dropped, and the caller told so (it held stdio `loadout mcp` forever before).
#[tokio::test]
async fn a_call_that_never_answers_is_stopped_at_its_wall_clock() {
    let linked = loadout_domains::registry().expect("registry");
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tools = linked.all_tools().to_vec();
    let mut hanging = linked.tool("calculate").expect("calculate").clone();
    hanging.name = "hangs_forever".into();
    hanging.backend = loadout::Backend::External(std::sync::Arc::new(Hangs(dropped.clone())));
    tools.push(hanging);
    let registry = loadout::Registry::from_parts(linked.domains().to_vec(), tools)
        .expect("registry")
        .with_call_timeout(std::time::Duration::from_millis(200));
    let dir = tempfile::tempdir().expect("tempdir");
    let store = loadout_store::Store::open_dir(dir.path())
        .await
        .expect("store");
    let registry = std::sync::Arc::new(registry);
    let ctx = loadout::ToolContext::new(registry.clone(), loadout::Settings::new(store));
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        registry.call("hangs_forever", json!({"expression": "1"}), ctx.clone()),
    )
    .await
    .expect("answered within its wall clock");
    assert!(
        matches!(&answer, Err(loadout::ToolError::Timeout { name, .. }) if name == "hangs_forever"),
        "{answer:?}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(
        dropped.load(std::sync::atomic::Ordering::SeqCst),
        "the call's work goes on"
    );
    // The registry keeps answering.
    let sum = registry
        .call("calculate", json!({"expression": "2+2"}), ctx)
        .await
        .expect("calculate");
    assert_eq!(sum["result"], 4.0);
}

/// Defect 5: a data dir loadout created was 0755 and `loadout.db` 0644, with
/// `llm_api_key` in it. Now the dir is 0700 and every file in it 0600, and an
/// existing database left readable by others is made private at the next start.
#[test]
fn the_data_dir_and_the_database_are_private() {
    use std::os::unix::fs::PermissionsExt as _;
    let parent = tempfile::tempdir().expect("tempdir");
    let data = parent.path().join("data");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_loadout"))
        .args(["settings", "set", "llm_api_key", "sk-private"])
        .env("LOADOUT_DATA_DIR", &data)
        .env_remove("LOADOUT_DATABASE_URL")
        .output()
        .expect("run loadout");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mode = |path: &std::path::Path| {
        std::fs::metadata(path)
            .expect("metadata")
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&data), 0o700, "data dir");
    let mut files = 0;
    for entry in std::fs::read_dir(&data).expect("read dir").flatten() {
        files += 1;
        assert_eq!(mode(&entry.path()), 0o600, "{}", entry.path().display());
    }
    assert!(files >= 1);

    // A database an older loadout left world-readable.
    let db = data.join("loadout.db");
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_loadout"))
        .args(["settings", "list"])
        .env("LOADOUT_DATA_DIR", &data)
        .env_remove("LOADOUT_DATABASE_URL")
        .output()
        .expect("run loadout");
    assert!(output.status.success());
    assert_eq!(mode(&db), 0o600);
}

/// Runs the binary on a data dir; (success, stderr).
fn loadout_on(data: &std::path::Path, args: &[&str]) -> (bool, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_loadout"))
        .args(args)
        .env("LOADOUT_DATA_DIR", data)
        .env_remove("LOADOUT_DATABASE_URL")
        .env_remove("LOADOUT_CONFIG")
        .output()
        .expect("run loadout");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Data dirs as a crash leaves them: the database written, checkpointed once, then
/// written again, and its files copied while it is open (the WAL still there).
async fn crashed_copy(into: &std::path::Path) {
    let live = tempfile::tempdir().expect("tempdir");
    let store = loadout_store::Store::open_dir(live.path())
        .await
        .expect("store");
    let settings = loadout::Settings::new(store.clone());
    for i in 0..200 {
        settings
            .set(&format!("note_{i}"), &"checkpointed ".repeat(20))
            .await
            .expect("set");
    }
    // The log connection checkpoints every 250 ms.
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    for i in 0..50 {
        settings
            .set(&format!("late_{i}"), "in the WAL only")
            .await
            .expect("set");
    }
    std::fs::create_dir_all(into).expect("mkdir");
    for name in ["loadout.db", "loadout.db-wal", "loadout.decisions.db"] {
        std::fs::copy(live.path().join(name), into.join(name)).expect(name);
    }
    drop(store);
}

/// Defect 6: a 0-byte `loadout.db` started silently as an empty database, and one
/// cut short while a WAL exists started and later said "storage unavailable: …
/// malformed". Both are refused at start now, with the recovery steps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_lost_its_contents_is_refused_at_start() {
    let dirs = tempfile::tempdir().expect("tempdir");

    // Sound: the copy opens, with every acknowledged write.
    let sound = dirs.path().join("sound");
    crashed_copy(&sound).await;
    let (ok, stderr) = loadout_on(&sound, &["settings", "get", "late_49"]);
    assert!(ok, "{stderr}");

    type Damage = fn(&std::path::Path);
    let cases: [(&str, Damage); 3] = [
        ("emptied, no WAL", |dir| {
            let _ = std::fs::remove_file(dir.join("loadout.db-wal"));
            std::fs::write(dir.join("loadout.db"), b"").expect("truncate");
        }),
        ("emptied, WAL kept", |dir| {
            std::fs::write(dir.join("loadout.db"), b"").expect("truncate");
        }),
        ("cut to its first pages, WAL kept", |dir| {
            let db = dir.join("loadout.db");
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&db)
                .expect("open");
            file.set_len(4096 * 2).expect("truncate");
        }),
    ];
    for (i, (case, damage)) in cases.into_iter().enumerate() {
        let dir = dirs.path().join(format!("case-{i}"));
        crashed_copy(&dir).await;
        damage(&dir);
        let (ok, stderr) = loadout_on(&dir, &["settings", "list"]);
        assert!(!ok, "{case}: started on a database that lost its contents");
        assert!(
            stderr.contains("lost its contents") && stderr.contains("To recover"),
            "{case}: {stderr}"
        );
        // Refused, not replaced: the damaged file is still there to recover from.
        assert!(dir.join("loadout.db").exists(), "{case}");
    }
}

/// A listener with short limits on a loopback port, serving `/` with "hello"; stops
/// when the returned sender is dropped.
async fn limited_listener(
    limits: loadout_server::listener::Limits,
) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let router = axum::Router::new()
        .route("/", axum::routing::get(|| async { "hello" }))
        .route(
            "/echo",
            axum::routing::post(|body: axum::body::Bytes| async move { body }),
        );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(loadout_server::listener::serve(
        listener,
        router,
        limits,
        async move {
            let _ = stopped.await;
        },
    ));
    (addr, stop)
}

/// Reads until the peer closes; `None` if it is still open after `within`.
async fn closed_within(
    stream: &mut tokio::net::TcpStream,
    within: std::time::Duration,
) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt as _;
    let mut received = Vec::new();
    let read = tokio::time::timeout(within, async {
        let mut buffer = [0u8; 1024];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    read.ok().map(|()| received)
}

/// Defect 1: an idle socket, a half-sent request and an idle keep-alive connection
/// stayed open forever, and enough of them locked every new client out. Now each is
/// closed after the header timeout, and a client past the connection cap is served
/// as soon as a slot frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_sent_connections_are_closed_and_capped() {
    use tokio::io::AsyncWriteExt as _;
    let limits = loadout_server::listener::Limits {
        header_read: std::time::Duration::from_millis(500),
        body_pause: std::time::Duration::from_millis(500),
        max_connections: 2,
        drain: std::time::Duration::from_secs(1),
    };
    let (addr, _stop) = limited_listener(limits).await;
    let patience = std::time::Duration::from_secs(10);

    // Idle from the start.
    let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // Headers begun, never finished.
    let mut half = tokio::net::TcpStream::connect(addr).await.expect("connect");
    half.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    // Both slots are taken: a third client waits, then is served once they close.
    let mut third = tokio::net::TcpStream::connect(addr).await.expect("connect");
    third
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    assert!(
        closed_within(&mut idle, patience).await.is_some(),
        "an idle socket stayed open"
    );
    assert!(
        closed_within(&mut half, patience).await.is_some(),
        "a half-sent request stayed open"
    );
    // The third is answered, then kept alive idle, then closed.
    let answer = closed_within(&mut third, patience)
        .await
        .expect("the kept-alive connection stayed open");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello"),
        "{answer}"
    );

    // A body that stops half-way is cut off too.
    let mut stalled = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stalled
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        .await
        .expect("write");
    assert!(
        closed_within(&mut stalled, patience).await.is_some(),
        "a stalled body stayed open"
    );
}

/// A shutdown waits for requests in flight only so long: a stuck one does not hold
/// the process (`serve` ignored SIGTERM while a tool call hung).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_does_not_wait_for_a_stuck_request() {
    use tokio::io::AsyncWriteExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let router = axum::Router::new().route(
        "/stuck",
        axum::routing::get(std::future::pending::<&'static str>),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let limits = loadout_server::listener::Limits {
        drain: std::time::Duration::from_millis(300),
        ..Default::default()
    };
    let served = tokio::spawn(loadout_server::listener::serve(
        listener,
        router,
        limits,
        async move {
            let _ = stopped.await;
        },
    ));
    let mut stuck = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stuck
        .write_all(b"GET /stuck HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    drop(stop);
    tokio::time::timeout(std::time::Duration::from_secs(5), served)
        .await
        .expect("the listener returned despite the stuck request")
        .expect("join");
}

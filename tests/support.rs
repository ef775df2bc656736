//! Helpers shared by the test modules.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use loadout_server::app::{App, Config};
use loadout_server::http::{HttpState, app};
use serde_json::Value;
use tower::ServiceExt;

/// A client `name` with token `token` and no limits; a test sets the limits it needs
/// with struct update syntax.
pub fn client_row(name: &str, token: &str) -> loadout_store::ClientRow {
    loadout_store::ClientRow {
        name: name.into(),
        token_sha256: loadout_store::sha256_hex(token),
        domains: vec![],
        tools: vec![],
        rate_per_min: None,
        read_only: false,
        created_ms: 0,
    }
}

/// An HTTP app on a fresh data dir; keep the `TempDir` alive for the test.
pub async fn http_app(token: Option<&str>) -> (tempfile::TempDir, axum::Router) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::in_data_dir(dir.path().to_path_buf());
    let app_state = App::open(&config).await.expect("open app");
    let token = token.map(|t| loadout_server::mcp::BearerToken::new(t).expect("token"));
    let state = HttpState::new(app_state, token);
    (dir, app(state))
}

/// One request through the app with `oneshot`: status and body (JSON, or the text
/// as a JSON string when the body is not JSON).
pub async fn send(
    app: &axum::Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .expect("request");
    let (status, bytes) = send_request(app, request).await;
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, value)
}

/// Any request through the app with `oneshot`: status and the body's bytes.
pub async fn send_request(
    app: &axum::Router,
    request: Request<Body>,
) -> (StatusCode, axum::body::Bytes) {
    let response = app.clone().oneshot(request).await.expect("response");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, bytes)
}

/// The session's logged selections, once at least `at_least` are written (the
/// decision log writes in the background), or whatever is there after 10 s.
pub async fn logged_selections(app: &axum::Router, session: &str, at_least: usize) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, body) = send(app, "GET", &format!("/api/sessions/{session}"), None).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let rows = body["selections"].as_array().cloned().unwrap_or_default();
        if rows.len() >= at_least || std::time::Instant::now() > deadline {
            return rows;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The fake stdio MCP server (`tests/python/fake_upstream.py`) that upstream tests
/// import, with the Python that runs it; `None` when no Python is installed (the
/// tests that need it say they skipped).
pub fn fake_upstream() -> Option<(&'static str, std::path::PathBuf)> {
    let python = ["python3", "python"].into_iter().find(|p| {
        std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok()
    });
    let Some(python) = python else {
        eprintln!("skipped: no python3 for the fake upstream server");
        return None;
    };
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/fake_upstream.py");
    Some((python, script))
}

/// A data dir whose `loadout.toml` runs the fake upstream as server `fake` (domain
/// `mcp_fake`, keyword `echo`); `None` when no Python is installed.
pub fn data_dir_with_fake_upstream() -> Option<tempfile::TempDir> {
    let (python, script) = fake_upstream()?;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("loadout.toml"),
        format!(
            "[servers.fake]\ncommand = {python:?}\nargs = [{script:?}]\nkeywords = [\"echo\"]\n",
            script = script.display().to_string(),
        ),
    )
    .expect("write config");
    Some(dir)
}

/// SplitMix64: seeded randomness for the randomized tests, so a failure replays.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) as usize
    }
}

/// Sends `SIGHUP` to process `pid` (a `loadout serve` or `mcp` reloads its config).
pub fn hangup(pid: u32) {
    let pid = pid.to_string();
    let sent = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -HUP {pid}");
}

/// A selection's decision on one domain (a selection as `/api/route` and `loadout
/// route --json` give it).
pub fn domain_decision<'a>(selection: &'a Value, domain: &str) -> &'a Value {
    selection["domains"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["domain"] == domain)
        .unwrap_or_else(|| panic!("no decision for `{domain}` in {selection}"))
}

/// `loadout serve` on a loopback port of a fresh `data` dir, with `env` set and the
/// environment that would point it elsewhere removed; its base URL once it printed
/// its address (within 30 s).
pub fn spawn_serve(data: &std::path::Path, env: &[(&str, &str)]) -> (std::process::Child, String) {
    use std::io::{BufRead as _, BufReader};
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_loadout"));
    command
        .args(["serve", "--addr", "127.0.0.1:0"])
        .env("LOADOUT_DATA_DIR", data)
        .env("LOADOUT_LOG", "warn")
        .env_remove("LOADOUT_DATABASE_URL")
        .env_remove("LOADOUT_CONFIG")
        .env_remove("LOADOUT_TOKEN")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("spawn loadout serve");
    let pipe = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("serving on http://").nth(1)
                && let Some(addr) = rest.split_whitespace().next()
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(addr.to_owned());
            }
        }
    });
    let addr = rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("loadout serve printed its address");
    (child, format!("http://{addr}"))
}

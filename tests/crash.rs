//! Crash safety: `loadout serve` under load is killed with SIGKILL, started again on
//! the same data dir, and every write it acknowledged is counted. Settings, session
//! turns and audit rows (written before a tool call's answer goes out) must all be
//! there; the decision log's queued rows may be lost (README, "The decision log").

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
/// How long the load runs before the kill.
const LOAD_FOR: Duration = Duration::from_millis(1500);
const WORKERS: usize = 6;

/// `loadout serve` on a loopback port; its base URL.
fn serve(data: &std::path::Path) -> (Child, String) {
    crate::support::spawn_serve(data, &[])
}

fn http_client() -> reqwest::Client {
    // reqwest is built without a default TLS provider; building a client needs one
    // even for plain HTTP.
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(WAIT)
        .build()
        .expect("HTTP client")
}

/// What one worker saw acknowledged.
#[derive(Default)]
struct Acknowledged {
    settings: Vec<String>,
    /// Session id → turns answered.
    turns: BTreeMap<String, i64>,
    /// `calculate` calls answered through `/mcp`.
    calls: usize,
}

async fn mcp_session(http: &reqwest::Client, base: &str) -> Option<String> {
    let response = http
        .post(format!("{base}/mcp"))
        .header("accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "crash-test", "version": "1"}}}),
        )
        .send()
        .await
        .ok()?;
    let session = response
        .headers()
        .get("mcp-session-id")?
        .to_str()
        .ok()?
        .to_owned();
    response.text().await.ok()?;
    http.post(format!("{base}/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-06-18")
        .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .await
        .ok()?;
    Some(session)
}

/// Writes until `stop`, recording only what the server answered with success.
async fn worker(base: String, id: usize, stop: Arc<AtomicBool>) -> Acknowledged {
    let http = http_client();
    let mut seen = Acknowledged::default();
    let session = format!("crash-{id}");
    let mcp = mcp_session(&http, &base).await;
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let key = format!("crash_{id}_{i}");
        let put = http
            .put(format!("{base}/api/settings/{key}"))
            .json(&json!({"value": format!("value {i}")}))
            .send()
            .await;
        if put.is_ok_and(|r| r.status().is_success()) {
            seen.settings.push(key);
        }
        let route = http
            .post(format!("{base}/api/route"))
            .json(&json!({"session": session, "message": format!("remember that item {i} costs {i} dollars")}))
            .send()
            .await;
        if let Ok(response) = route
            && response.status().is_success()
            && let Ok(body) = response.json::<Value>().await
            && let Some(turn) = body["turn"].as_i64()
        {
            seen.turns.insert(session.clone(), turn);
        }
        if let Some(mcp) = &mcp {
            let call = http
                .post(format!("{base}/mcp"))
                .header("accept", "application/json, text/event-stream")
                .header("mcp-session-id", mcp)
                .header("mcp-protocol-version", "2025-06-18")
                .json(&json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                    "params": {"name": "calculate", "arguments": {"expression": format!("{i} * 2")}}}))
                .send()
                .await;
            if let Ok(response) = call
                && let Ok(text) = response.text().await
                && text
                    .lines()
                    .filter_map(|line| line.strip_prefix("data:"))
                    .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
                    .any(|reply| reply["id"] == i && reply["result"]["isError"] == false)
            {
                seen.calls += 1;
            }
        }
    }
    seen
}

/// Load, `kill -9`, restart, count: nothing acknowledged is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    let data = tempfile::tempdir().expect("tempdir");
    let (mut child, base) = serve(data.path());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..WORKERS)
        .map(|id| tokio::spawn(worker(base.clone(), id, stop.clone())))
        .collect();
    tokio::time::sleep(LOAD_FOR).await;
    // Killed in the middle of the load, requests in flight.
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    stop.store(true, Ordering::SeqCst);
    let mut acknowledged = Acknowledged::default();
    for worker in workers {
        let seen = worker.await.expect("worker");
        acknowledged.settings.extend(seen.settings);
        acknowledged.turns.extend(seen.turns);
        acknowledged.calls += seen.calls;
    }
    assert!(
        acknowledged.settings.len() >= 20 && acknowledged.calls >= 5,
        "too little load to judge: {} settings, {} calls",
        acknowledged.settings.len(),
        acknowledged.calls
    );

    // Started again on the same files: everything acknowledged is there.
    let (mut child, base) = serve(data.path());
    let http = http_client();
    let settings: Value = http
        .get(format!("{base}/api/settings"))
        .send()
        .await
        .expect("settings")
        .json()
        .await
        .expect("JSON");
    let missing: Vec<&String> = acknowledged
        .settings
        .iter()
        .filter(|key| settings["settings"].get(key.as_str()).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "acknowledged settings lost: {missing:?}"
    );
    for (session, turns) in &acknowledged.turns {
        let shown: Value = http
            .get(format!("{base}/api/sessions/{session}"))
            .send()
            .await
            .expect("session")
            .json()
            .await
            .expect("JSON");
        let kept = shown["turn"].as_i64().unwrap_or_default();
        assert!(
            kept >= *turns,
            "{session}: {turns} turns acknowledged, {kept} kept: {shown}"
        );
    }
    child.kill().expect("kill");
    child.wait().expect("reap");
    let audit = Command::new(env!("CARGO_BIN_EXE_loadout"))
        .args(["audit", "--json", "--tail", "100000"])
        .env("LOADOUT_DATA_DIR", data.path())
        .env_remove("LOADOUT_DATABASE_URL")
        .output()
        .expect("loadout audit");
    assert!(
        audit.status.success(),
        "{}",
        String::from_utf8_lossy(&audit.stderr)
    );
    let n_calls = String::from_utf8_lossy(&audit.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|row| row["tool"] == "calculate" && row["outcome"] == "ok")
        .count();
    assert!(
        n_calls >= acknowledged.calls,
        "{} calls answered, {n_calls} in the audit log",
        acknowledged.calls
    );
    eprintln!(
        "crash test: {} settings, {} sessions, {} tool calls acknowledged before kill -9; all kept",
        acknowledged.settings.len(),
        acknowledged.turns.len(),
        acknowledged.calls
    );
}

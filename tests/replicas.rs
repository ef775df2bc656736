//! Several replicas on one PostgreSQL database (issue 7): two `loadout serve`
//! processes and a `loadout mcp` process, each with its own data dir, share
//! sessions, the router's session state, settings and memories through the
//! database alone. Also what the binary does with a database it must not use.
//!
//! Tests that need PostgreSQL run when `LOADOUT_TEST_POSTGRES_URL` names a server
//! (`scripts/ci-postgres.sh` prints one) and are skipped with a note otherwise, as
//! every PostgreSQL test is.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::domain_decision;
use loadout_store::testing::{self, TestStore};
use loadout_store::{StoreBackend, StoreError};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
/// How soon a setting written through one process must reach another's router.
const SETTINGS_DEADLINE: Duration = Duration::from_secs(1);

/// A fresh PostgreSQL database (dropped with the returned store), or `None`, with
/// a note, when no server is configured.
async fn postgres_database(dir: &Path, test: &str) -> Option<TestStore> {
    if testing::postgres_url().is_none() {
        eprintln!("note: {} unset; {test} skipped", testing::POSTGRES_URL_VAR);
        return None;
    }
    testing::test_stores(dir)
        .await
        .into_iter()
        .find(TestStore::is_postgres)
}

fn loadout() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_loadout"));
    command
        .env_remove("LOADOUT_DATABASE_URL")
        .env_remove("LOADOUT_TOKEN")
        .env("LOADOUT_LOG", "warn")
        .stdin(Stdio::null());
    command
}

/// One `loadout serve` on a free loopback port; killed when dropped.
struct Replica {
    name: &'static str,
    child: Child,
    base: String,
    stderr: Arc<Mutex<String>>,
    http: reqwest::Client,
    _data_dir: tempfile::TempDir,
}

impl Replica {
    async fn start(name: &'static str, database_url: &str) -> Replica {
        let data_dir = tempfile::tempdir().expect("tempdir");
        Replica::start_in(name, data_dir, Some(database_url)).await
    }

    /// A replica on `data_dir`: on the database at `database_url`, or on SQLite in
    /// the data dir.
    async fn start_in(
        name: &'static str,
        data_dir: tempfile::TempDir,
        database_url: Option<&str>,
    ) -> Replica {
        Replica::start_with(name, data_dir, database_url, &[]).await
    }

    /// [`Replica::start_in`] with more arguments for `loadout serve`.
    async fn start_with(
        name: &'static str,
        data_dir: tempfile::TempDir,
        database_url: Option<&str>,
        args: &[&str],
    ) -> Replica {
        let mut command = loadout();
        command.args(["serve", "--addr", "127.0.0.1:0"]).args(args);
        if let Some(url) = database_url {
            command.args(["--database-url", url]);
        }
        let mut child = command
            .env("LOADOUT_DATA_DIR", data_dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn loadout serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = tokio::sync::oneshot::channel::<String>();
        let pipe = child.stderr.take().expect("stderr");
        let log = stderr.clone();
        // Reads the address the server prints, then keeps draining the pipe so that
        // the server never blocks on a full one.
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("serving on http://").nth(1)
                    && let Some(addr) = rest.split_whitespace().next()
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(addr.to_owned());
                }
                let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut replica = Replica {
            name,
            child,
            base: String::new(),
            stderr,
            http: http_client(),
            _data_dir: data_dir,
        };
        match tokio::time::timeout(WAIT, rx).await {
            Ok(Ok(addr)) => replica.base = format!("http://{addr}"),
            _ => panic!(
                "replica {name} did not start serving: {}",
                replica.stderr_text()
            ),
        }
        replica
    }

    /// Sends SIGTERM and waits for the process to exit; its exit status and data
    /// dir.
    fn terminate(mut self) -> (std::process::ExitStatus, tempfile::TempDir) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM {pid}");
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            assert!(
                started.elapsed() < WAIT,
                "replica {} did not exit after SIGTERM: {}",
                self.name,
                self.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let data_dir = tempfile::tempdir().expect("tempdir");
        (status, std::mem::replace(&mut self._data_dir, data_dir))
    }

    /// Sends SIGHUP: read the config file again.
    fn hangup(&self) {
        crate::support::hangup(self.child.id());
    }

    /// Waits until `text` is on the replica's stderr. A report printed after the
    /// change it reports can reach stderr after the change shows in a request.
    async fn until_stderr_has(&self, text: &str) {
        within(
            WAIT,
            &format!("{text:?} on {}'s stderr", self.name),
            || async { self.stderr_text().contains(text) },
        )
        .await;
    }

    fn stderr_text(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// One API request: status and JSON body.
    async fn api(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut request = self.http.request(method, &url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) => panic!("{} {url}: {e}\n{}", self.name, self.stderr_text()),
        };
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    async fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, value) = self.api(method, path, body).await;
        assert!(
            (200..300).contains(&status),
            "replica {}: {method} {path} → {status} {value}",
            self.name
        );
        value
    }

    /// `POST /api/route` for a session.
    async fn route(&self, session: &str, message: &str, called: &[&str]) -> Value {
        self.ok(
            "POST",
            "/api/route",
            Some(json!({"session": session, "message": message, "called": called})),
        )
        .await
    }

    async fn domain_active(&self, domain: &str) -> bool {
        let listing = self.ok("GET", "/api/domains", None).await;
        listing["domains"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["name"] == domain)
            .and_then(|d| d["active"].as_bool())
            .unwrap_or_else(|| panic!("no domain `{domain}` in {listing}"))
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_client() -> reqwest::Client {
    // reqwest is built without a default TLS provider; building a client needs
    // one even for plain HTTP.
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(WAIT)
        .build()
        .expect("HTTP client")
}

/// A client of a replica's `/mcp` endpoint (streamable HTTP, one MCP session),
/// written against the wire format so that it needs no HTTP client transport.
struct McpHttp {
    http: reqwest::Client,
    url: String,
    session: String,
    next_id: Mutex<u64>,
}

impl McpHttp {
    const PROTOCOL: &'static str = "2025-06-18";

    async fn connect(replica: &Replica) -> McpHttp {
        let url = format!("{}/mcp", replica.base);
        let http = http_client();
        let response = http
            .post(&url)
            .header("accept", "application/json, text/event-stream")
            .json(&json!({
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {
                    "protocolVersion": Self::PROTOCOL,
                    "capabilities": {},
                    "clientInfo": {"name": "loadout-replicas-test", "version": "1.0.0"}
                }
            }))
            .send()
            .await
            .expect("initialize");
        assert_eq!(response.status().as_u16(), 200, "initialize");
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .expect("an MCP session id")
            .to_owned();
        let initialized = response.text().await.expect("initialize body");
        assert!(
            initialized.contains("\"serverInfo\""),
            "initialize: {initialized}"
        );
        let client = McpHttp {
            http,
            url,
            session,
            next_id: Mutex::new(1),
        };
        let response = client
            .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert_eq!(response.status().as_u16(), 202, "notifications/initialized");
        client
    }

    async fn post(&self, body: Value) -> reqwest::Response {
        self.http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", Self::PROTOCOL)
            .json(&body)
            .send()
            .await
            .expect("MCP request")
    }

    /// `tools/call`; the result's structured content. Panics on a tool error.
    async fn call(&self, tool: &str, arguments: Value) -> Value {
        let id = {
            let mut next = self.next_id.lock().unwrap_or_else(|p| p.into_inner());
            *next += 1;
            *next
        };
        let response = self
            .post(json!({
                "jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": tool, "arguments": arguments}
            }))
            .await;
        // An event stream that ends after the response.
        let text = response.text().await.expect("tools/call body");
        let reply = text
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .find(|message| message["id"] == id)
            .unwrap_or_else(|| panic!("no reply to {tool} in {text}"));
        let result = &reply["result"];
        assert_eq!(result["isError"], false, "{tool}: {reply}");
        let text = result["content"][0]["text"].as_str().unwrap_or_default();
        tool_value(result.get("structuredContent"), text)
    }
}

/// `loadout mcp` on stdio, driven by rmcp's client.
async fn start_stdio_mcp(database_url: &str, data_dir: &Path) -> RunningService<RoleClient, ()> {
    let url = database_url.to_owned();
    let data_dir = data_dir.to_path_buf();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadout")).configure(|c| {
        c.args(["mcp", "--database-url", &url])
            .env("LOADOUT_DATA_DIR", &data_dir)
            .env_remove("LOADOUT_DATABASE_URL")
            .env("LOADOUT_LOG", "warn")
            .kill_on_drop(true);
    });
    let transport = TokioChildProcess::new(command).expect("spawn loadout mcp");
    tokio::time::timeout(WAIT, ().serve(transport))
        .await
        .expect("initialize in time")
        .expect("initialize")
}

async fn stdio_call(mcp: &RunningService<RoleClient, ()>, tool: &str, args: Value) -> Value {
    let mut request = CallToolRequestParams::new(tool.to_owned());
    if let Value::Object(map) = args {
        request = request.with_arguments(map);
    }
    let result: CallToolResult = tokio::time::timeout(WAIT, mcp.peer().call_tool(request))
        .await
        .expect("tools/call in time")
        .expect("tools/call");
    assert_ne!(result.is_error, Some(true), "{tool}: {result:?}");
    let text = result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .unwrap_or_default();
    tool_value(result.structured_content.as_ref(), &text)
}

/// A tool's JSON result: objects come as structured content, anything else (lists)
/// only as text.
fn tool_value(structured: Option<&Value>, text: &str) -> Value {
    match structured {
        Some(value) if !value.is_null() => value.clone(),
        _ => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned())),
    }
}

/// Polls `check` until it holds, failing after `deadline`.
async fn within<F, Fut>(deadline: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < deadline,
            "{what}: not seen within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_and_an_mcp_process_share_one_database() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(db) = postgres_database(dir.path(), "replicas test").await else {
        return;
    };
    // Each replica would otherwise build tool vectors with the built-in encoder
    // in its own data dir: CPU this test does not need (routing stays lexical).
    db.store
        .setting_set("router_dense", "off")
        .await
        .expect("set router_dense");
    let a = Replica::start("a", &db.url).await;
    let b = Replica::start("b", &db.url).await;
    let mcp_data = tempfile::tempdir().expect("tempdir");
    let stdio = start_stdio_mcp(&db.url, mcp_data.path()).await;

    // A session routed through A continues through B, stickiness included.
    let created = a.ok("POST", "/api/sessions", None).await;
    let session = created["id"].as_str().expect("session id").to_owned();
    let first = a
        .route(&session, "make a table of my monthly expenses", &[])
        .await;
    assert_eq!(first["turn"], 1);
    assert_eq!(
        domain_decision(&first["selection"], "scratchpad")["included"],
        true
    );
    // `create_table`, called by the client's model since turn 1, pins scratchpad.
    let second = a.route(&session, "add the rent", &["create_table"]).await;
    assert_eq!(second["turn"], 2);
    assert_eq!(
        domain_decision(&second["selection"], "scratchpad")["stage"],
        "pinned"
    );
    let third = b.route(&session, "what time is it in Seoul?", &[]).await;
    assert_eq!(third["turn"], 3, "B continues A's turn count");
    let pinned = domain_decision(&third["selection"], "scratchpad");
    assert_eq!(pinned["stage"], "pinned", "{}", third["summary"]);
    assert_eq!(pinned["included"], true);
    let shown = b.ok("GET", &format!("/api/sessions/{session}"), None).await;
    assert_eq!(shown["turn"], 3);
    let users: Vec<&Value> = shown["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "user")
        .collect();
    assert_eq!(users.len(), 3, "{shown}");
    assert!(
        shown["domains"]
            .as_array()
            .expect("domains")
            .iter()
            .any(|d| d["domain"] == "scratchpad" && d["pinned"] == true),
        "{shown}"
    );
    // Back on A, whose in-process memory of the session stops at turn 2.
    let fourth = a.route(&session, "and in Paris?", &[]).await;
    assert_eq!(fourth["turn"], 4);
    assert_eq!(
        domain_decision(&fourth["selection"], "scratchpad")["stage"],
        "pinned"
    );

    // A follow-up with no evidence of its own, routed through B the moment A routed
    // the turn before, with no decision log to read: the carry-over comes from the
    // session's row, written with A's turn.
    a.ok(
        "PUT",
        "/api/settings/decision_log",
        Some(json!({"value": "off"})),
    )
    .await;
    let fifth = a
        .route(&session, "remember that my parrot is called Polly", &[])
        .await;
    assert_eq!(
        domain_decision(&fifth["selection"], "memory")["stage"],
        "keyword"
    );
    let sixth = b.route(&session, "yes, do it", &[]).await;
    assert_eq!(sixth["turn"], 6);
    assert_eq!(
        domain_decision(&sixth["selection"], "memory")["stage"],
        "carried",
        "{}",
        sixth["summary"]
    );

    // A setting written through A reaches B's router and the MCP process. Both read
    // (and cache) the settings first, so this is invalidation, not a first load.
    assert!(!b.domain_active("filesystem").await);
    let before = stdio_call(&stdio, "get_setting", json!({"key": "filesystem_roots"})).await;
    assert_eq!(before["is_set"], false, "{before}");
    let files = tempfile::tempdir().expect("tempdir");
    std::fs::write(files.path().join("notes.txt"), "replicated").expect("write");
    let roots = json!([files.path().display().to_string()]).to_string();
    a.ok(
        "PUT",
        "/api/settings/filesystem_roots",
        Some(json!({"value": roots})),
    )
    .await;
    // B's router itself (not only its settings API) sees the domain within 1 s.
    let b_ref = &b;
    within(
        SETTINGS_DEADLINE,
        "filesystem routed on B",
        move || async move {
            let routed = b_ref
                .ok(
                    "POST",
                    "/api/route",
                    Some(json!({"message": "read the file notes.txt"})),
                )
                .await;
            domain_decision(&routed["selection"], "filesystem")["included"] == true
        },
    )
    .await;
    assert!(b.domain_active("filesystem").await);
    let (stdio_ref, roots_ref) = (&stdio, roots.as_str());
    within(
        SETTINGS_DEADLINE,
        "filesystem_roots in loadout mcp",
        move || async move {
            stdio_call(stdio_ref, "get_setting", json!({"key": "filesystem_roots"})).await["value"]
                == roots_ref
        },
    )
    .await;

    // A setting written through the MCP process reaches A.
    stdio_call(
        &stdio,
        "set_setting",
        json!({"key": "llm_model", "value": "replica-model"}),
    )
    .await;
    let a_ref = &a;
    within(SETTINGS_DEADLINE, "llm_model on A", move || async move {
        let (status, body) = a_ref.api("GET", "/api/settings/llm_model", None).await;
        status == 200 && body["value"] == "replica-model"
    })
    .await;

    // `remember` through A's /mcp is found by `recall` through B's, and by the
    // MCP process.
    let mcp_a = McpHttp::connect(&a).await;
    let remembered = mcp_a
        .call(
            "remember",
            json!({"content": "the replicas share one PostgreSQL database", "tags": ["replicas"]}),
        )
        .await;
    assert_eq!(remembered["duplicate"], false, "{remembered}");
    let mcp_b = McpHttp::connect(&b).await;
    for recalled in [
        mcp_b
            .call("recall", json!({"query": "replicas PostgreSQL database"}))
            .await,
        stdio_call(&stdio, "recall", json!({"query": "replicas PostgreSQL"})).await,
    ] {
        assert!(
            recalled.as_array().is_some_and(|memories| memories
                .iter()
                .any(|m| m["content"] == "the replicas share one PostgreSQL database")),
            "{recalled}"
        );
    }

    let _ = stdio.cancel().await;
    drop((a, b));
    drop(db);
}

/// Runs the binary to completion, failing (and killing it) if it is still running
/// after `WAIT`: a bad database must stop it, not leave it serving.
fn run_to_exit(mut command: Command) -> (std::process::ExitStatus, String) {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn loadout");
    let mut pipe = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > WAIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "loadout kept running: {}",
                reader.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, reader.join().unwrap_or_default())
}

fn assert_clean_failure(status: std::process::ExitStatus, stderr: &str, expected: &str) {
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains(expected),
        "expected `{expected}` in: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "password shown: {stderr}");
}

/// Bad URLs stop `serve`, `mcp` and the CLI with one clear line, the password
/// masked, and create no database.
#[test]
fn bad_database_urls_stop_the_binary_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        ("mysql://u:hunter2@db/loadout", "unknown scheme `mysql`"),
        ("no-scheme", "expected sqlite:PATH or postgres://"),
        ("sqlite:", "no file path after `sqlite:`"),
        (
            "postgres://u:hunter2@127.0.0.1:notaport/loadout",
            "unsupported database URL `postgres://u:***@127.0.0.1:notaport/loadout`",
        ),
    ];
    for (url, expected) in cases {
        for args in [
            &["serve", "--addr", "127.0.0.1:0"][..],
            &["mcp"][..],
            &["settings", "list"][..],
        ] {
            let mut command = loadout();
            command
                .args(args)
                .env("LOADOUT_DATA_DIR", dir.path())
                .env("LOADOUT_DATABASE_URL", url);
            let (status, stderr) = run_to_exit(command);
            assert_clean_failure(status, &stderr, expected);
        }
    }
    assert!(
        !dir.path().join("loadout.db").exists(),
        "a bad URL must not fall back to the default SQLite database"
    );
}

/// A database written by a newer loadout stops every command before it changes
/// anything: SQLite (always) and PostgreSQL (when configured).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_stops_the_binary_and_is_left_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut stores = testing::test_stores(dir.path()).await;
    if !stores.iter().any(TestStore::is_postgres) {
        eprintln!(
            "note: {} unset; newer-schema test runs on SQLite only",
            testing::POSTGRES_URL_VAR
        );
    }
    for t in &stores {
        t.store.setting_set("kept", "yes").await.expect("set");
        bump_schema_version(t, 999).await;
    }
    // SQLite: the file must be byte for byte the same afterwards, so close it first.
    let sqlite = stores.remove(0);
    let sqlite_file = sqlite.data_dir.join("loadout.db");
    let sqlite_url = sqlite.url.clone();
    let wal = sqlite.data_dir.join("loadout.db-wal");
    drop(sqlite);
    // The store's log connection closes on its own thread; the last connection to
    // close checkpoints the WAL into the file and deletes it. Read after that.
    let deadline = std::time::Instant::now() + WAIT;
    while wal.exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!wal.exists(), "the SQLite store did not close");
    let before = std::fs::read(&sqlite_file).expect("read the SQLite file");
    let mut urls = vec![sqlite_url];
    urls.extend(stores.iter().map(|t| t.url.clone()));
    for url in &urls {
        for args in [
            &["serve", "--addr", "127.0.0.1:0"][..],
            &["mcp"][..],
            &["settings", "set", "kept", "no"][..],
        ] {
            let data_dir = tempfile::tempdir().expect("tempdir");
            let mut command = loadout();
            command
                .args(args)
                .args(["--database-url", url])
                .env("LOADOUT_DATA_DIR", data_dir.path());
            let (status, stderr) = tokio::task::spawn_blocking(move || run_to_exit(command))
                .await
                .expect("join");
            assert_clean_failure(
                status,
                &stderr,
                &format!(
                    "database schema version 999 is newer than this binary knows ({})",
                    loadout_store::SCHEMA_VERSION
                ),
            );
        }
    }
    assert!(
        std::fs::read(&sqlite_file).expect("read") == before,
        "the SQLite database changed"
    );
    for t in &stores {
        let StoreBackend::Postgres(pg) = t.store.backend() else {
            continue;
        };
        let client = pg.client().await.expect("client");
        let versions: Vec<i64> = client
            .query("SELECT version FROM schema_version ORDER BY version", &[])
            .await
            .expect("versions")
            .iter()
            .map(|r| r.get(0))
            .collect();
        let expected: Vec<i64> = (1..=loadout_store::SCHEMA_VERSION)
            .chain(std::iter::once(999))
            .collect();
        assert_eq!(versions, expected);
        let kept: String = client
            .query_one("SELECT value FROM settings WHERE key = 'kept'", &[])
            .await
            .expect("kept")
            .get(0);
        assert_eq!(kept, "yes");
    }
}

/// Writes a row into `schema_version` behind the store's back, as a newer loadout
/// would have.
async fn bump_schema_version(t: &TestStore, version: i64) {
    let bumped: Result<(), StoreError> = match t.store.backend() {
        StoreBackend::Sqlite(s) => {
            s.call(move |c| {
                c.execute(
                    "INSERT INTO schema_version(version, applied_ms) VALUES (?1, 0)",
                    [version],
                )?;
                Ok(())
            })
            .await
        }
        StoreBackend::Postgres(s) => match s.client().await {
            Ok(client) => client
                .execute(
                    "INSERT INTO schema_version(version, applied_ms) VALUES ($1, 0)",
                    &[&version],
                )
                .await
                .map(drop)
                .map_err(|e| s.error(e)),
            Err(e) => Err(e),
        },
        _ => panic!("a backend this test does not know"),
    };
    bumped.expect("bump schema_version");
}

/// Rows still queued when `loadout serve` gets SIGTERM are written before it exits:
/// every routed turn's decision and every tool call's audit row, on both backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_writes_every_queued_log_row_first() {
    const TURNS: usize = 150;
    const CALLS: usize = 12;
    let dir = tempfile::tempdir().expect("tempdir");
    let postgres = postgres_database(dir.path(), "shutdown test on PostgreSQL").await;
    let mut backends: Vec<Option<&str>> = vec![None];
    if let Some(db) = &postgres {
        db.store
            .setting_set("router_dense", "off")
            .await
            .expect("set router_dense");
        backends.push(Some(db.url.as_str()));
    }
    for url in backends {
        let data_dir = tempfile::tempdir().expect("tempdir");
        if url.is_none() {
            let store = loadout_store::Store::connect(None, data_dir.path())
                .await
                .expect("open SQLite");
            store
                .setting_set("router_dense", "off")
                .await
                .expect("set router_dense");
        }
        let replica = Replica::start_in("shutdown", data_dir, url).await;
        let session = "shutdown-flush";
        for turn in 0..TURNS {
            let routed = replica
                .route(session, &format!("remember note number {turn}"), &[])
                .await;
            assert_eq!(routed["turn"], turn + 1);
        }
        let mcp = McpHttp::connect(&replica).await;
        for n in 0..CALLS {
            let result = mcp
                .call("calculate", json!({"expression": format!("{n} + 1")}))
                .await;
            assert!(result.is_object(), "{result}");
        }
        // At once: the writers batch rows for 50 ms, so the last ones are queued.
        let (status, data_dir) = replica.terminate();
        assert!(status.success(), "exit status {status}");
        let store = loadout_store::Store::connect(url, data_dir.path())
            .await
            .expect("reopen the store");
        let decisions = store.decisions(session).await.expect("decisions");
        assert_eq!(decisions.len(), TURNS, "decision rows ({url:?})");
        let calls = store
            .audit_tail(10 * CALLS)
            .await
            .expect("audit")
            .into_iter()
            .filter(|row| row.tool == "calculate")
            .count();
        assert_eq!(calls, CALLS, "audit rows ({url:?})");
    }
    drop(postgres);
}

/// `serve --catalog DIR`: the toolkit's domain is routed for chat, listed with the
/// others, and its tools are served over `/mcp`, answering "no backend" when called.
#[tokio::test]
async fn serve_routes_and_serves_the_toolkit_files_it_is_given() {
    let catalog = tempfile::tempdir().expect("tempdir");
    let toolkit = json!({
        "domain": "recipes",
        "description": "Recipes from the family cookbook.",
        "keywords": ["recipe", "cookbook"],
        "settings_keys": [],
        "tools": [{
            "name": "find_recipe",
            "description": "Find a recipe in the family cookbook by dish or ingredient.",
            "examples": ["what can I cook with leftover rice"],
            "input_schema": {"type": "object",
                             "properties": {"dish": {"type": "string", "description": "The dish"}},
                             "required": ["dish"]}
        }]
    });
    std::fs::write(catalog.path().join("recipes.json"), toolkit.to_string()).expect("write");
    let dir = catalog.path().to_str().expect("utf-8 path").to_owned();
    let data_dir = tempfile::tempdir().expect("tempdir");
    let replica = Replica::start_with("catalog", data_dir, None, &["--catalog", &dir]).await;

    let routed = replica
        .route("cook", "find grandma's pancake recipe", &[])
        .await;
    let sent: Vec<&str> = routed["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert!(sent.contains(&"find_recipe"), "{routed}");
    assert!(replica.domain_active("recipes").await);

    let mcp = McpHttp::connect(&replica).await;
    let response = mcp
        .post(json!({
            "jsonrpc": "2.0", "id": 99, "method": "tools/call",
            "params": {"name": "find_recipe", "arguments": {"dish": "pancakes"}}
        }))
        .await;
    let text = response.text().await.expect("tools/call body");
    assert!(text.contains("no backend"), "{text}");

    // Issue 29: the toolkit tool's examples are learned at start (source `example`).
    let data_dir = replica._data_dir.path().to_owned();
    within(WAIT, "the toolkit's example learned", || {
        let data_dir = data_dir.clone();
        async move {
            let output = loadout()
                .args(["learned", "--json", "--tool", "find_recipe"])
                .env("LOADOUT_DATA_DIR", &data_dir)
                .output()
                .expect("run loadout learned");
            let text = String::from_utf8_lossy(&output.stdout);
            text.contains("\"example\":1") && text.contains("leftover rice")
        }
    })
    .await;
}

/// `SIGHUP` reads `loadout.toml` again: new `[router]` tunables route the turns that
/// follow; a file with problems is refused with them named, and the server keeps
/// routing with the config it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hangup_reloads_the_router_tunables_and_refuses_a_bad_file() {
    let data_dir = tempfile::tempdir().expect("tempdir");
    let config = data_dir.path().join("loadout.toml");
    std::fs::write(&config, "[router]\ntoken_budget = 3210\n").expect("write config");
    let replica = Replica::start_with("reload", data_dir, None, &[]).await;
    let budget = |routed: Value| routed["selection"]["token_budget"].clone();
    assert_eq!(budget(replica.route("r", "list my files", &[]).await), 3210);

    std::fs::write(&config, "[router]\ntoken_budget = 2345\nidle_turns = 7\n").expect("write");
    replica.hangup();
    within(WAIT, "the reloaded budget", || async {
        budget(replica.route("r", "list my files", &[]).await) == 2345
    })
    .await;
    // Printed after the new router is in force (CI saw the budget before the line).
    replica.until_stderr_has("token_budget: 3210 → 2345").await;
    let log = replica.stderr_text();
    assert!(log.contains("idle_turns: 5 → 7"), "{log}");

    std::fs::write(&config, "[router]\ntoken_budjet = 1000\n").expect("write");
    replica.hangup();
    replica.until_stderr_has("not reloaded").await;
    // The error spans several lines, which reach the reader one at a time (CI once
    // read the log between the first and the one naming the key).
    replica.until_stderr_has("token_budjet").await;
    let log = replica.stderr_text();
    assert!(
        log.contains("token_budjet") && !log.contains("panicked"),
        "{log}"
    );
    // Still serving, with the config it had.
    assert_eq!(budget(replica.route("r", "list my files", &[]).await), 2345);
}

/// `[servers]` follows a reload too: a server added to the file is connected and
/// its tools are routed; taken out again, it is stopped and they are not; a file
/// with a problem leaves the servers as they run.
#[tokio::test]
async fn a_hangup_connects_and_stops_the_upstream_servers_of_the_file() {
    let Some(with_fake) = crate::support::data_dir_with_fake_upstream() else {
        return;
    };
    let fake = std::fs::read_to_string(with_fake.path().join("loadout.toml")).expect("read");
    let data_dir = tempfile::tempdir().expect("tempdir");
    let config = data_dir.path().join("loadout.toml");
    std::fs::write(&config, "[router]\ntoken_budget = 4000\n").expect("write config");
    let replica = Replica::start_with("servers", data_dir, None, &[]).await;
    // A session a message: what one check's turn carries must not decide the next.
    let sessions = std::sync::atomic::AtomicUsize::new(0);
    let sends_echo_for = |message: &'static str| {
        let replica = &replica;
        let session = format!(
            "s{}",
            sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        async move {
            let routed = replica.route(&session, message, &[]).await;
            routed["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|t| t["function"]["name"] == "fake__echo")
        }
    };
    let sends_echo = || sends_echo_for("echo this back to me");
    // Placed by memory's keyword, so no fallback sends every tool.
    let parrot_message = "parrot that and remember it";
    assert!(!sends_echo().await);

    std::fs::write(&config, format!("[router]\ntoken_budget = 4000\n{fake}")).expect("write");
    replica.hangup();
    within(WAIT, "the added server's tool in a selection", sends_echo).await;
    // Reported once the reconciling is done, which can be after its tools route.
    replica
        .until_stderr_has("upstream MCP servers added fake")
        .await;

    // A bad file: refused, and the server keeps running.
    std::fs::write(&config, format!("[router]\ntoken_budjet = 1\n{fake}")).expect("write");
    replica.hangup();
    replica.until_stderr_has("not reloaded").await;
    assert!(sends_echo().await);
    assert!(!sends_echo_for(parrot_message).await);

    // Changed settings: the server restarts with them (a new keyword routes to it).
    let parrot = fake.replace("keywords = [\"echo\"]", "keywords = [\"echo\", \"parrot\"]");
    assert_ne!(parrot, fake);
    std::fs::write(&config, format!("[router]\ntoken_budget = 4000\n{parrot}")).expect("write");
    replica.hangup();
    within(WAIT, "the restarted server's new keyword", || {
        sends_echo_for(parrot_message)
    })
    .await;
    replica
        .until_stderr_has("upstream MCP servers restarted fake")
        .await;

    std::fs::write(&config, "[router]\ntoken_budget = 4000\n").expect("write");
    replica.hangup();
    within(WAIT, "the removed server's tool gone", || async {
        !sends_echo().await
    })
    .await;
    let log = replica.stderr_text();
    assert!(
        log.contains("upstream MCP servers removed fake") && !log.contains("panicked"),
        "{log}"
    );
}

/// Issue 29: what one replica learns (a client's model reported calling
/// `list_tables` for a message) reaches another replica's router through the shared
/// database: a similar message routed by B, in no session, gets the tool from the
/// learned stage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_one_replica_learns_another_routes_with() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(db) = postgres_database(dir.path(), "learning replicas test").await else {
        return;
    };
    db.store
        .setting_set("router_dense", "off")
        .await
        .expect("set router_dense");
    let a = Replica::start("a", &db.url).await;
    let b = Replica::start("b", &db.url).await;
    a.route(
        "teacher",
        "remember to zorblax the quarterly frobnication ledgers",
        &[],
    )
    .await;
    a.route("teacher", "thanks", &["list_tables"]).await;
    let learned_by_b = || async {
        let routed = b
            .ok(
                "POST",
                "/api/route",
                Some(json!({"message": "remember to zorblax the monthly frobnication ledgers"})),
            )
            .await;
        let sent = routed["selection"]["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["name"] == "list_tables");
        // The scorer sends it on the learned features, which its domain's reason names.
        let learned = routed["selection"]["domains"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|d| {
                d["domain"] == "scratchpad"
                    && d["reason"].as_str().is_some_and(|r| r.contains("learned"))
            });
        sent && learned
    };
    within(WAIT, "B routing with what A learned", learned_by_b).await;
    let rows = db
        .store
        .learned_rows(Some("list_tables"), None)
        .await
        .expect("learned rows");
    assert!(
        rows.iter()
            .any(|r| r.source == "route" && r.session.as_deref() == Some("teacher")),
        "{rows:?}"
    );
}

//! `loadout mcp` driven by rmcp's client, the way an MCP client runs it: a child
//! process speaking MCP over stdio, with its own data dir.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::response::IntoResponse as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    ContentBlock, Implementation, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{
    ConfigureCommandExt, StreamableHttpServerConfig, StreamableHttpService, TokioChildProcess,
};
use rmcp::{
    ClientHandler, ErrorData, RoleClient, RoleServer, ServerHandler, ServiceError, ServiceExt,
};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

const CLIENT_NAME: &str = "loadout-tests";
const WAIT: Duration = Duration::from_secs(20);

/// Test client: forwards `notifications/tools/list_changed` to a channel.
struct Client {
    list_changed: mpsc::UnboundedSender<()>,
}

impl ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new(CLIENT_NAME, "1.0.0"),
        )
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.list_changed.send(());
    }
}

struct Mcp {
    service: RunningService<RoleClient, Client>,
    list_changed: mpsc::UnboundedReceiver<()>,
}

/// `loadout mcp` over stdio on `data_dir`'s SQLite store.
fn mcp_command(data_dir: &Path, extra_args: &[&str]) -> tokio::process::Command {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_loadout")).configure(|c| {
        c.arg("mcp")
            .args(extra_args)
            .env("LOADOUT_DATA_DIR", data_dir)
            .env_remove("LOADOUT_DATABASE_URL");
    })
}

async fn start(data_dir: &Path, extra_args: &[&str]) -> Mcp {
    let transport =
        TokioChildProcess::new(mcp_command(data_dir, extra_args)).expect("spawn loadout mcp");
    connect(transport).await
}

/// `start`, with the server's stderr collected (and passed on to the test's).
async fn start_capturing_stderr(data_dir: &Path) -> (Mcp, Arc<Mutex<String>>) {
    let (transport, stderr) = TokioChildProcess::builder(mcp_command(data_dir, &[]))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn loadout mcp");
    let collected = Arc::new(Mutex::new(String::new()));
    if let Some(mut stderr) = stderr {
        let collected = collected.clone();
        tokio::spawn(async move {
            let mut buffer = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buffer).await {
                if n == 0 {
                    break;
                }
                let text = String::from_utf8_lossy(&buffer[..n]);
                eprint!("{text}");
                collected.lock().expect("stderr buffer").push_str(&text);
            }
        });
    }
    (connect(transport).await, collected)
}

async fn connect(transport: TokioChildProcess) -> Mcp {
    let (tx, list_changed) = mpsc::unbounded_channel();
    let service = tokio::time::timeout(WAIT, Client { list_changed: tx }.serve(transport))
        .await
        .expect("initialize in time")
        .expect("initialize");
    Mcp {
        service,
        list_changed,
    }
}

impl Mcp {
    async fn tool_names(&self) -> Vec<String> {
        let tools = tokio::time::timeout(WAIT, self.service.peer().list_all_tools())
            .await
            .expect("tools/list in time")
            .expect("tools/list");
        tools.into_iter().map(|t| t.name.to_string()).collect()
    }

    async fn call(&self, name: &str, args: Value) -> Result<CallToolResult, ServiceError> {
        let mut request = CallToolRequestParams::new(name.to_owned());
        if let Value::Object(map) = args {
            request = request.with_arguments(map);
        }
        tokio::time::timeout(WAIT, self.service.peer().call_tool(request))
            .await
            .expect("tools/call in time")
    }

    async fn call_ok(&self, name: &str, args: Value) -> String {
        let result = self.call(name, args).await.expect("tools/call");
        let text = text_of(&result);
        assert_ne!(result.is_error, Some(true), "{name} failed: {text}");
        text
    }

    /// A call that must answer a tool result with `isError`: its text.
    async fn call_err(&self, name: &str, args: Value) -> String {
        let result = self.call(name, args.clone()).await.expect("tools/call");
        let text = text_of(&result);
        assert_eq!(
            result.is_error,
            Some(true),
            "{name} {args} did not fail: {text}"
        );
        text
    }

    /// Waits for the next `tools/list_changed` after dropping those already received.
    async fn next_list_change(&mut self) {
        while self.list_changed.try_recv().is_ok() {}
        tokio::time::timeout(WAIT, self.list_changed.recv())
            .await
            .expect("tools/list_changed in time")
            .expect("notification");
    }

    /// Calls until the call succeeds (an upstream reconnecting), or panics at `WAIT`.
    async fn call_until_ok(&self, name: &str, args: Value) -> String {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let result = self.call(name, args.clone()).await;
            if let Ok(result) = &result
                && result.is_error != Some(true)
            {
                return text_of(result);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{name} never succeeded: {result:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Ends the session the way a client does (closing stdin) and waits for the
    /// process to exit, which flushes the audit log.
    async fn close(mut self) {
        let _ = tokio::time::timeout(WAIT, self.service.close()).await;
    }
}

fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn protocol_error(result: Result<CallToolResult, ServiceError>) -> rmcp::ErrorData {
    match result {
        Err(ServiceError::McpError(error)) => error,
        other => panic!("expected a JSON-RPC error, got {other:?}"),
    }
}

fn loadout(data_dir: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_loadout"))
        .args(args)
        .env("LOADOUT_DATA_DIR", data_dir)
        .env_remove("LOADOUT_DATABASE_URL")
        .output()
        .expect("run loadout")
}

fn roots_value(dir: &Path) -> String {
    json!([dir.display().to_string()]).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_every_tool_with_schemas_and_calls_them() {
    let data = tempfile::tempdir().expect("tempdir");
    let mcp = start(data.path(), &[]).await;
    let tools = tokio::time::timeout(WAIT, mcp.service.peer().list_all_tools())
        .await
        .expect("in time")
        .expect("tools/list");
    for name in [
        "calculate",
        "query_data",
        "read_file",
        "set_setting",
        "recall",
    ] {
        let tool = tools
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} not listed"));
        assert_eq!(
            tool.input_schema.get("type"),
            Some(&json!("object")),
            "{name}"
        );
        assert!(tool.description.as_deref().is_some_and(|d| !d.is_empty()));
    }
    let capabilities = mcp
        .service
        .peer()
        .peer_info()
        .map(|info| info.capabilities.clone())
        .expect("server info");
    assert_eq!(capabilities.tools.and_then(|t| t.list_changed), Some(true));

    let text = mcp
        .call_ok("calculate", json!({"expression": "2 + 3 * 4"}))
        .await;
    assert!(text.contains("14"), "{text}");
    mcp.close().await;
    // Every tool is listed: nothing to rank, so the encoder is never loaded.
    assert!(!data.path().join("vectors").exists());
}

/// Invalid arguments are a tool result the model reads (SEP-1303), naming the field;
/// a tool that does not exist is a protocol error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_are_tool_errors_and_unknown_tools_protocol_errors() {
    let data = tempfile::tempdir().expect("tempdir");
    let mcp = start(data.path(), &[]).await;

    let text = mcp.call_err("calculate", json!({"expression": 12})).await;
    assert!(
        text.contains("`calculate`") && text.contains("`expression`"),
        "{text}"
    );
    let text = mcp.call_err("calculate", json!({})).await;
    assert!(text.contains("expression"), "{text}");

    let error = protocol_error(mcp.call("no_such_tool", json!({})).await);
    assert_eq!(error.code.0, -32602);
    assert!(
        error.message.contains("unknown tool `no_such_tool`"),
        "{}",
        error.message
    );
    // Chat's meta-tools are not MCP's: the message says what to use instead.
    let error = protocol_error(mcp.call("load_tools", json!({"names": ["memory"]})).await);
    assert_eq!(error.code.0, -32602);
    assert!(error.message.contains("search_tools"), "{}", error.message);

    // The server keeps serving after errors.
    mcp.call_ok("calculate", json!({"expression": "1+1"})).await;
    mcp.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_configured_then_set_setting_then_works_in_the_same_process() {
    let data = tempfile::tempdir().expect("tempdir");
    let files = tempfile::tempdir().expect("tempdir");
    let file = files.path().join("note.txt");
    std::fs::write(&file, "hello from a file").expect("write");
    let mcp = start(data.path(), &[]).await;

    let path = file.display().to_string();
    let result = mcp
        .call("read_file", json!({"path": path}))
        .await
        .expect("tools/call");
    assert_eq!(result.is_error, Some(true));
    let text = text_of(&result);
    assert!(
        text.contains("filesystem_roots") && text.contains("set_setting"),
        "{text}"
    );

    // The roots are the operator's: the model's `set_setting` is refused, and the
    // CLI's write reaches the running server without a restart.
    let refused = mcp
        .call(
            "set_setting",
            json!({"key": "filesystem_roots", "value": roots_value(files.path())}),
        )
        .await
        .expect("tools/call");
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text_of(&refused).contains("set by the operator"),
        "{}",
        text_of(&refused)
    );
    let data_dir = data.path().to_path_buf();
    let roots = roots_value(files.path());
    let output = tokio::task::spawn_blocking(move || {
        loadout(&data_dir, &["settings", "set", "filesystem_roots", &roots])
    })
    .await
    .expect("join");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = mcp.call_ok("read_file", json!({"path": path})).await;
    assert!(text.contains("hello from a file"), "{text}");
    mcp.close().await;

    // Every call is in the audit log, with the client's name and the outcome.
    let output = loadout(data.path(), &["audit", "--json", "--tail", "50"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rows: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    let outcomes: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["client"].as_str().unwrap_or(""),
                r["tool"].as_str().unwrap_or(""),
                r["outcome"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            (CLIENT_NAME, "read_file", "not_configured"),
            (CLIENT_NAME, "set_setting", "error"),
            (CLIENT_NAME, "read_file", "ok"),
        ]
    );
    assert!(rows.iter().all(|r| r["duration_ms"].as_f64().is_some()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_written_by_another_process_is_seen_on_the_next_call() {
    let data = tempfile::tempdir().expect("tempdir");
    let files = tempfile::tempdir().expect("tempdir");
    let file = files.path().join("shared.txt");
    std::fs::write(&file, "shared state").expect("write");
    let mcp = start(data.path(), &[]).await;
    let path = file.display().to_string();

    let result = mcp
        .call("read_file", json!({"path": path}))
        .await
        .expect("tools/call");
    assert_eq!(result.is_error, Some(true));

    let data_dir = data.path().to_path_buf();
    let roots = roots_value(files.path());
    let output = tokio::task::spawn_blocking(move || {
        loadout(&data_dir, &["settings", "set", "filesystem_roots", &roots])
    })
    .await
    .expect("join");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let text = mcp.call_ok("read_file", json!({"path": path})).await;
    assert!(text.contains("shared state"), "{text}");
    mcp.close().await;
}

/// The rows of the audit log, oldest first: (tool, outcome).
fn audit_rows(data_dir: &Path) -> Vec<(String, String)> {
    let output = loadout(data_dir, &["audit", "--json", "--tail", "100"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json line"))
        .map(|r| {
            (
                r["tool"].as_str().unwrap_or_default().to_owned(),
                r["outcome"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// A client that lists once and never again (as claude.ai and Claude Desktop do)
/// reaches every tool in dynamic mode: the list is core, `search_tools` and
/// `call_tool`, the same for every connection and after every call; `search_tools`
/// gives full definitions; `call_tool` runs any tool as a direct call would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_mode_reaches_every_tool_through_a_constant_list() {
    let data = tempfile::tempdir().expect("tempdir");
    let mut mcp = start(data.path(), &["--dynamic"]).await;
    let other = start(data.path(), &["--dynamic"]).await;
    let listed = mcp.tool_names().await;
    assert_eq!(listed[..2], ["search_tools", "call_tool"], "{listed:?}");
    for name in ["calculate", "set_setting", "list_tools"] {
        assert!(
            listed.contains(&name.to_owned()),
            "{name} missing from {listed:?}"
        );
    }
    for name in [
        "read_file",
        "load_tools",
        "unload_tools",
        "load_all_for_this_turn",
    ] {
        assert!(!listed.contains(&name.to_owned()), "{name} in {listed:?}");
    }
    assert_eq!(
        other.tool_names().await,
        listed,
        "another connection lists the same"
    );
    let instructions = mcp
        .service
        .peer()
        .peer_info()
        .and_then(|info| info.instructions.clone())
        .expect("instructions");
    assert!(
        instructions.contains("search_tools") && instructions.contains("call_tool"),
        "{instructions}"
    );

    // search_tools: the full definition, and what the domain still needs.
    let found = mcp
        .call("search_tools", json!({"query": "read a file", "limit": 3}))
        .await
        .expect("tools/call");
    let found = found.structured_content.expect("structured results");
    let read_file = found["results"]
        .as_array()
        .and_then(|r| r.iter().find(|hit| hit["name"] == json!("read_file")))
        .unwrap_or_else(|| panic!("read_file not found: {found}"));
    assert_eq!(read_file["domain"], json!("filesystem"));
    assert_eq!(read_file["inputSchema"]["type"], json!("object"));
    assert!(
        read_file["inputSchema"]["properties"]["path"].is_object(),
        "{read_file}"
    );
    assert!(
        read_file["description"]
            .as_str()
            .is_some_and(|d| d.len() > 20)
    );
    assert_eq!(read_file["configured"], json!(false));
    assert_eq!(read_file["needs_settings"], json!(["filesystem_roots"]));
    // Issue 40: an operator key is not the model's to set: the answer says where.
    assert!(
        read_file["how_to_configure"].as_str().is_some_and(|h| h
            .contains("`loadout settings set`")
            && h.contains("`set_setting` may not")),
        "{read_file}"
    );
    assert_eq!(read_file["listed"], json!(false));
    // The first search also starts the dense stage of the ranking, in the
    // background; its vectors land in the data dir's cache.
    if loadout_embed::builtin_available() {
        let started = std::time::Instant::now();
        while !data.path().join("vectors").is_dir() {
            assert!(started.elapsed() < WAIT, "no vector cache after a search");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let found = mcp
            .call_ok("search_tools", json!({"query": "read a file"}))
            .await;
        assert!(found.contains("read_file"), "{found}");
    }

    // call_tool: any tool, with the same checks as a direct call.
    let text = mcp
        .call_ok(
            "call_tool",
            json!({"name": "calculate", "arguments": {"expression": "6 * 7"}}),
        )
        .await;
    assert!(text.contains("42"), "{text}");
    let text = mcp
        .call_err(
            "call_tool",
            json!({"name": "calculate", "arguments": {"expression": 12}}),
        )
        .await;
    assert!(text.contains("`expression`"), "{text}");
    let text = mcp
        .call_err(
            "call_tool",
            json!({"name": "read_file", "arguments": {"path": "/x"}}),
        )
        .await;
    assert!(text.contains("filesystem_roots"), "{text}");
    let text = mcp
        .call_err("call_tool", json!({"name": "no_such_tool"}))
        .await;
    assert!(
        text.contains("no_such_tool") && text.contains("search_tools"),
        "{text}"
    );
    let text = mcp
        .call_err(
            "call_tool",
            json!({"name": "calculate", "arguments": "1+1"}),
        )
        .await;
    assert!(text.contains("`arguments`"), "{text}");
    let text = mcp.call_err("search_tools", json!({"query": 5})).await;
    assert!(text.contains("`query`"), "{text}");
    // An unlisted tool can also be called directly.
    let text = mcp
        .call_ok("remember", json!({"content": "the locker code is 4521"}))
        .await;
    assert!(!text.is_empty());

    // Nothing changed the list, and no one was told it did.
    assert_eq!(mcp.tool_names().await, listed);
    assert!(
        mcp.list_changed.try_recv().is_err(),
        "tools/list_changed was sent"
    );
    mcp.close().await;
    other.close().await;

    // The audit log names the tool that ran, not call_tool (but for call_tool's own
    // argument errors).
    let mut expected = vec![
        ("search_tools", "ok"),
        ("calculate", "ok"),
        ("calculate", "invalid_args"),
        ("read_file", "not_configured"),
        ("no_such_tool", "unknown_tool"),
        ("call_tool", "invalid_args"),
        ("search_tools", "invalid_args"),
        ("remember", "ok"),
    ];
    if loadout_embed::builtin_available() {
        // The search once the dense stage was attached.
        expected.insert(1, ("search_tools", "ok"));
    }
    let expected: Vec<(String, String)> = expected
        .into_iter()
        .map(|(t, o)| (t.to_owned(), o.to_owned()))
        .collect();
    let rows = audit_rows(data.path());
    assert_eq!(rows, expected);
}

/// `--max-tools N`: all tools when they fit; else core, search_tools, call_tool and
/// the domains used within a day (here: by an MCP call in an earlier process), never
/// more than N.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tools_lists_all_that_fit_or_core_and_the_warm_domains() {
    let data = tempfile::tempdir().expect("tempdir");
    let mcp = start(data.path(), &["--max-tools", "1000"]).await;
    let all = mcp.tool_names().await;
    assert!(all.contains(&"read_file".to_owned()) && all.contains(&"recall".to_owned()));
    assert!(!all.contains(&"call_tool".to_owned()), "{all:?}");
    assert!(!all.contains(&"search_tools".to_owned()), "{all:?}");
    // Using memory makes it warm for the next start.
    mcp.call_ok("remember", json!({"content": "the boat is blue"}))
        .await;
    mcp.close().await;

    let dynamic = start(data.path(), &["--dynamic"]).await;
    let core_and_meta = dynamic.tool_names().await.len();
    dynamic.close().await;
    let n_memory = all
        .iter()
        .filter(|t| {
            [
                "remember",
                "recall",
                "forget",
                "list_memories",
                "update_memory",
            ]
            .contains(&t.as_str())
        })
        .count();
    let limit = core_and_meta + n_memory;
    let mcp = start(data.path(), &["--max-tools", &limit.to_string()]).await;
    let listed = mcp.tool_names().await;
    assert_eq!(listed.len(), limit, "{listed:?}");
    assert_eq!(listed[..2], ["search_tools", "call_tool"]);
    assert!(
        listed.contains(&"recall".to_owned()),
        "the warm domain: {listed:?}"
    );
    assert!(!listed.contains(&"read_file".to_owned()), "{listed:?}");
    // What is not listed still runs.
    let text = mcp
        .call_ok("call_tool", json!({"name": "list_tables"}))
        .await;
    assert!(!text.is_empty());
    mcp.close().await;

    let mcp = start(data.path(), &["--max-tools", "5"]).await;
    let listed = mcp.tool_names().await;
    assert_eq!(listed.len(), 5, "{listed:?}");
    assert_eq!(listed[..2], ["search_tools", "call_tool"]);
    mcp.close().await;

    let output = loadout(data.path(), &["mcp", "--max-tools", "1"]);
    assert!(!output.status.success());
}

/// `--domains`: core and those domains only; a name that is no domain is refused by
/// name before serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domains_serve_core_and_the_named_domains_only() {
    let data = tempfile::tempdir().expect("tempdir");
    let mcp = start(data.path(), &["--domains", "memory"]).await;
    let listed = mcp.tool_names().await;
    assert!(listed.contains(&"recall".to_owned()) && listed.contains(&"calculate".to_owned()));
    assert!(!listed.contains(&"read_file".to_owned()), "{listed:?}");
    assert!(!listed.contains(&"create_table".to_owned()), "{listed:?}");
    let error = protocol_error(mcp.call("list_tables", json!({})).await);
    assert_eq!(error.code.0, -32602);
    let found = mcp
        .call_ok("search_tools", json!({"query": "create a table of rows"}))
        .await;
    assert!(!found.contains("create_table"), "{found}");
    mcp.close().await;

    let output = loadout(data.path(), &["mcp", "--domains", "memory,nope"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("`nope`") && stderr.contains("memory"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_servers_are_imported_forwarded_followed_and_restarted() {
    let Some((python, script)) = crate::support::fake_upstream() else {
        return;
    };
    let data = tempfile::tempdir().expect("tempdir");
    let starts = data.path().join("starts.log");
    std::fs::write(
        data.path().join("loadout.toml"),
        format!(
            "[servers.fake]\ncommand = {python:?}\nargs = [{script:?}]\nkeywords = [\"echo\"]\nenv = {{ FAKE_UPSTREAM_LOG = {log:?} }}\n",
            script = script.display().to_string(),
            log = starts.display().to_string(),
        ),
    )
    .expect("write config");
    let mut mcp = start(data.path(), &[]).await;
    let names = mcp.tool_names().await;
    for name in ["fake__echo", "fake__grow", "fake__crash", "calculate"] {
        assert!(
            names.contains(&name.to_owned()),
            "{name} missing from {names:?}"
        );
    }
    let text = mcp.call_ok("fake__echo", json!({"text": "hi"})).await;
    assert_eq!(text, "echo: hi");
    // The upstream's schema is enforced before forwarding.
    let text = mcp.call_err("fake__echo", json!({})).await;
    assert!(text.contains("`text`"), "{text}");

    // The upstream's tools/list_changed reaches our client, with the new tool.
    mcp.call_ok("fake__grow", json!({})).await;
    tokio::time::timeout(WAIT, mcp.list_changed.recv())
        .await
        .expect("tools/list_changed in time")
        .expect("notification");
    assert!(mcp.tool_names().await.contains(&"fake__extra".to_owned()));
    assert_eq!(mcp.call_ok("fake__extra", json!({})).await, "extra works");

    // A crash is reported as a tool error; the server is restarted.
    let result = mcp
        .call("fake__crash", json!({}))
        .await
        .expect("tools/call");
    assert_eq!(result.is_error, Some(true), "{}", text_of(&result));
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let result = mcp.call("fake__echo", json!({"text": "again"})).await;
        if let Ok(result) = &result
            && result.is_error != Some(true)
        {
            assert_eq!(text_of(result), "echo: again");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not restarted: {result:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let n_starts = std::fs::read_to_string(&starts)
        .expect("log")
        .lines()
        .count();
    assert!(n_starts >= 2, "{n_starts} starts");
    mcp.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_upstream_config_is_a_clear_error() {
    let data = tempfile::tempdir().expect("tempdir");
    let config = data.path().join("custom.toml");
    std::fs::write(&config, "[servers.\"Bad Name\"]\ncommand = \"x\"\n").expect("write");
    let output = loadout(
        data.path(),
        &["mcp", "--config", &config.display().to_string()],
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("servers.Bad Name"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_http_upstream_config_names_the_server_and_hides_header_values() {
    let data = tempfile::tempdir().expect("tempdir");
    let config = data.path().join("custom.toml");
    std::fs::write(
        &config,
        "[servers.noscheme]\nurl = \"localhost:8080/mcp\"\n\
         [servers.nohost]\nurl = \"http://\"\n\
         [servers.reserved]\nurl = \"http://127.0.0.1:9/mcp\"\nheaders = { Mcp-Session-Id = \"s3cret-session\" }\n\
         [servers.badvalue]\nurl = \"http://127.0.0.1:9/mcp\"\nheaders = { Authorization = \"Bearer s3\\u0001cret\" }\n",
    )
    .expect("write");
    let output = loadout(
        data.path(),
        &["mcp", "--config", &config.display().to_string()],
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for server in [
        "servers.noscheme",
        "servers.nohost",
        "servers.reserved",
        "servers.badvalue",
    ] {
        assert!(stderr.contains(server), "{server} not named: {stderr}");
    }
    assert!(
        !stderr.contains("s3cret"),
        "a header value leaked: {stderr}"
    );
}

const UPSTREAM_TOKEN: &str = "t0ken-for-the-http-upstream";

/// An MCP server over streamable HTTP, built with rmcp in the test: `echo` (tagged
/// with the run's generation, so a restart shows), `grow` (adds `extra` and says
/// tools/list_changed), and `generation_<n>` (so a re-listing shows).
#[derive(Clone)]
struct HttpUpstream {
    generation: u32,
    grown: Arc<AtomicBool>,
}

impl ServerHandler for HttpUpstream {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("http-upstream", "1.0.0"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = |value: Value| match value {
            Value::Object(map) => Arc::new(map),
            _ => Arc::default(),
        };
        let mut tools = vec![
            Tool::new(
                "echo",
                "Echoes the text.",
                schema(json!({
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                    "required": ["text"],
                })),
            ),
            Tool::new(
                "grow",
                "Adds the tool `extra`.",
                schema(json!({"type": "object"})),
            ),
            Tool::new(
                format!("generation_{}", self.generation),
                "Names the server's run.",
                schema(json!({"type": "object"})),
            ),
        ];
        if self.grown.load(Ordering::SeqCst) {
            tools.push(Tool::new(
                "extra",
                "Appears after `grow`.",
                schema(json!({"type": "object"})),
            ));
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let text = match request.name.as_ref() {
            "echo" => {
                let text = request
                    .arguments
                    .as_ref()
                    .and_then(|args| args.get("text"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                format!("echo {}: {text}", self.generation)
            }
            "grow" => {
                self.grown.store(true, Ordering::SeqCst);
                let _ = context.peer.notify_tool_list_changed().await;
                "grown".to_owned()
            }
            "extra" => "extra works".to_owned(),
            other => {
                return Err(ErrorData::invalid_params(
                    format!("unknown tool `{other}`"),
                    None,
                ));
            }
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]).into())
    }
}

/// One run of [`HttpUpstream`] in a runtime of its own, so that dropping it
/// ends every connection at once, the way a crashed server does.
struct ServedUpstream {
    runtime: Option<tokio::runtime::Runtime>,
}

impl ServedUpstream {
    /// Serves `/mcp` on `listener`, answering only requests with the bearer token.
    fn start(listener: std::net::TcpListener, generation: u32) -> ServedUpstream {
        listener.set_nonblocking(true).expect("nonblocking");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let handler = HttpUpstream {
            generation,
            grown: Arc::new(AtomicBool::new(false)),
        };
        runtime.spawn(async move {
            let service = StreamableHttpService::new(
                move || Ok(handler.clone()),
                Arc::new(LocalSessionManager::default()),
                StreamableHttpServerConfig::default(),
            );
            let router =
                axum::Router::new()
                    .nest_service("/mcp", service)
                    .layer(axum::middleware::from_fn(
                        |request: axum::extract::Request, next: axum::middleware::Next| async move {
                            let expected = format!("Bearer {UPSTREAM_TOKEN}");
                            let authorized = request
                                .headers()
                                .get("authorization")
                                .is_some_and(|value| value.as_bytes() == expected.as_bytes());
                            if authorized {
                                next.run(request).await
                            } else {
                                axum::http::StatusCode::UNAUTHORIZED.into_response()
                            }
                        },
                    ));
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            let _ = axum::serve(listener, router).await;
        });
        ServedUpstream {
            runtime: Some(runtime),
        }
    }
}

impl Drop for ServedUpstream {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn bind(addr: SocketAddr) -> std::net::TcpListener {
    // A restarted server binds the port its predecessor had (std sets SO_REUSEADDR),
    // but `shutdown_background` returns before the old listener is closed.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(listener) => return listener,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("bind {addr}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("bind {addr}: {e}"),
        }
    }
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_upstreams_are_imported_forwarded_followed_and_reconnected() {
    let listener = bind("127.0.0.1:0".parse().expect("addr"));
    let addr = listener.local_addr().expect("addr");
    let upstream = ServedUpstream::start(listener, 1);
    let data = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        data.path().join("loadout.toml"),
        format!(
            "[servers.web]\nurl = \"http://{addr}/mcp\"\nheaders = {{ Authorization = \"Bearer {UPSTREAM_TOKEN}\" }}\nkeywords = [\"echo over http\"]\n\
             [servers.down]\nurl = \"http://127.0.0.1:{}/mcp\"\n",
            closed_port()
        ),
    )
    .expect("write config");
    let (mut mcp, stderr) = start_capturing_stderr(data.path()).await;

    // Imported with the token sent (the upstream refuses requests without it);
    // the unreachable server is reported by name and costs nothing else.
    let names = mcp.tool_names().await;
    for name in ["web__echo", "web__grow", "web__generation_1", "calculate"] {
        assert!(
            names.contains(&name.to_owned()),
            "{name} missing from {names:?}"
        );
    }
    assert!(
        stderr
            .lock()
            .expect("stderr")
            .contains("upstream MCP server `down`"),
        "the unreachable server is not reported"
    );
    assert_eq!(
        mcp.call_ok("web__echo", json!({"text": "hi"})).await,
        "echo 1: hi"
    );
    let text = mcp.call_err("web__echo", json!({})).await;
    assert!(text.contains("`text`"), "{text}");

    // The upstream's tools/list_changed (on its HTTP stream) reaches our client.
    mcp.call_ok("web__grow", json!({})).await;
    mcp.next_list_change().await;
    assert!(mcp.tool_names().await.contains(&"web__extra".to_owned()));
    assert_eq!(mcp.call_ok("web__extra", json!({})).await, "extra works");

    // Restarted between two calls: the next call finds its session unknown, and
    // goes through on a new session (it never ran, so sending it again is safe);
    // the new run's tools are listed.
    drop(upstream);
    let upstream = ServedUpstream::start(bind(addr), 2);
    assert_eq!(
        mcp.call_ok("web__echo", json!({"text": "again"})).await,
        "echo 2: again"
    );
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let names = mcp.tool_names().await;
        if names.contains(&"web__generation_2".to_owned()) {
            assert!(
                !names.contains(&"web__generation_1".to_owned()),
                "{names:?}"
            );
            assert!(!names.contains(&"web__extra".to_owned()), "{names:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not re-listed: {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Gone: a call is a clear tool error naming the server; once it is back the
    // calls work again.
    drop(upstream);
    let result = mcp
        .call("web__echo", json!({"text": "nobody"}))
        .await
        .expect("tools/call");
    assert_eq!(result.is_error, Some(true), "{}", text_of(&result));
    assert!(text_of(&result).contains("`web`"), "{}", text_of(&result));
    let _upstream = ServedUpstream::start(bind(addr), 3);
    assert_eq!(
        mcp.call_until_ok("web__echo", json!({"text": "back"}))
            .await,
        "echo 3: back"
    );
    mcp.close().await;
    let stderr = stderr.lock().expect("stderr").clone();
    assert!(
        !stderr.contains(UPSTREAM_TOKEN),
        "the token was logged: {stderr}"
    );
}

/// Where `.ci/run` installed `@modelcontextprotocol/server-everything`.
fn server_everything() -> Option<PathBuf> {
    let prefix = std::env::var_os("LOADOUT_TEST_NPM_PREFIX")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/ci-npm"));
    let bin = prefix.join("node_modules/.bin/mcp-server-everything");
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    (node && bin.exists()).then_some(bin)
}

/// Starts server-everything's streamable HTTP mode on `port` and waits until it
/// accepts connections.
async fn start_server_everything(bin: &Path, port: u16) -> tokio::process::Child {
    let child = tokio::process::Command::new(bin)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start server-everything");
    let deadline = std::time::Instant::now() + WAIT;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "server-everything did not listen on {port}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_http_upstream_from_npm() {
    let Some(bin) = server_everything() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI: node or @modelcontextprotocol/server-everything is missing (LOADOUT_TEST_NPM_PREFIX, see .ci/run)"
        );
        eprintln!(
            "skipped: @modelcontextprotocol/server-everything is not installed (.ci/run installs it)"
        );
        return;
    };
    let port = closed_port();
    let mut everything = start_server_everything(&bin, port).await;
    let data = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        data.path().join("loadout.toml"),
        format!(
            "[servers.everything]\nurl = \"http://127.0.0.1:{port}/mcp\"\nkeywords = [\"echo\", \"sum\"]\n"
        ),
    )
    .expect("write config");
    let mcp = start(data.path(), &[]).await;
    let names = mcp.tool_names().await;
    for name in ["everything__echo", "everything__get-sum"] {
        assert!(
            names.contains(&name.to_owned()),
            "{name} missing from {names:?}"
        );
    }
    assert_eq!(
        mcp.call_ok("everything__echo", json!({"message": "hi"}))
            .await,
        "Echo: hi"
    );
    let sum = mcp
        .call_ok("everything__get-sum", json!({"a": 2, "b": 3}))
        .await;
    assert!(sum.contains('5'), "{sum}");
    // The upstream's schema is enforced before forwarding.
    let text = mcp
        .call_err("everything__get-sum", json!({"a": "x", "b": 1}))
        .await;
    assert!(text.contains("`a`"), "{text}");

    // A restart loses our session (this server answers 400 to an unknown one);
    // the calls work again on a new session.
    let _ = everything.kill().await;
    let _everything = start_server_everything(&bin, port).await;
    assert_eq!(
        mcp.call_until_ok("everything__echo", json!({"message": "again"}))
            .await,
        "Echo: again"
    );
    mcp.close().await;
}

/// Every listed tool, called over MCP with arguments made from its own schema and then
/// spoilt (wrong types, missing and unknown fields, traversal paths, SQL that writes,
/// 10,000-character strings): each call answers a tool result (invalid arguments
/// included), never a protocol error or a dead connection, and
/// nothing outside the allowed folder is read or written. Seeded, so a failure replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_shaped_random_arguments_get_tool_results_only() {
    let data = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("tempdir");
    let root = outside.path().join("allowed");
    std::fs::create_dir(&root).expect("root");
    std::fs::write(root.join("notes.txt"), "inside").expect("write");
    std::fs::write(outside.path().join("secret.txt"), "CANARY-OUTSIDE").expect("write");
    let output = loadout(
        data.path(),
        &["settings", "set", "filesystem_roots", &roots_value(&root)],
    );
    assert!(output.status.success(), "{output:?}");
    let mcp = start(data.path(), &[]).await;
    let tools = tokio::time::timeout(WAIT, mcp.service.peer().list_all_tools())
        .await
        .expect("in time")
        .expect("tools/list");

    let mut rng = crate::support::Rng(0x006d_6370_u64);
    let mut next = move || rng.next();
    let long = "x".repeat(10_000);
    let strings: Vec<String> = [
        "notes.txt",
        "../secret.txt",
        "../../secret.txt",
        "/etc/passwd",
        "allowed/../secret.txt",
        "*",
        "t",
        "SELECT * FROM t",
        "DROP TABLE t",
        "x'); DELETE FROM settings; --",
        "İ🙂\u{200b}",
        "",
        "UTC",
        "Mars/Olympus",
        "2^1000",
        "1/0",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([long, root.join("notes.txt").display().to_string()])
    .chain([outside.path().join("secret.txt").display().to_string()])
    .collect();
    let value_of = |kind: &str, next: &mut dyn FnMut() -> usize| -> Value {
        match kind {
            "string" => json!(strings[next() % strings.len()]),
            "integer" => json!([0i64, 1, -1, 3, i64::MAX, i64::MIN][next() % 6]),
            "number" => json!([0.5, -1e308, 1e308, 2.0][next() % 4]),
            "boolean" => json!(next().is_multiple_of(2)),
            "array" => json!([
                strings[next() % strings.len()],
                {"name": "a", "type": "text"}
            ]),
            "object" => json!({"a": 1, "name": strings[next() % strings.len()]}),
            _ => Value::Null,
        }
    };
    let kinds = [
        "string", "integer", "number", "boolean", "array", "object", "null",
    ];
    let mut outcomes = std::collections::BTreeMap::new();
    for tool in &tools {
        // A setting could widen the allowed folders; the other tools are the target.
        if tool.name == "set_setting" {
            continue;
        }
        let properties = tool
            .input_schema
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for round in 0..12 {
            let mut args = serde_json::Map::new();
            for (name, schema) in &properties {
                let declared = schema
                    .get("type")
                    .and_then(|t| t.as_str().or_else(|| t.get(0).and_then(Value::as_str)))
                    .unwrap_or("string");
                match next() % 10 {
                    0 => {}
                    1 => {
                        args.insert(
                            name.clone(),
                            value_of(kinds[next() % kinds.len()], &mut next),
                        );
                    }
                    _ => {
                        args.insert(name.clone(), value_of(declared, &mut next));
                    }
                }
            }
            if next().is_multiple_of(8) {
                args.insert("unexpected".into(), json!(1));
            }
            let shown = Value::Object(args.clone()).to_string();
            let shown: String = shown.chars().take(300).collect();
            let outcome = match mcp.call(&tool.name, Value::Object(args)).await {
                Ok(result) => {
                    let text = text_of(&result);
                    assert!(
                        !text.contains("CANARY-OUTSIDE"),
                        "{} read outside the allowed folder with {shown}",
                        tool.name
                    );
                    if result.is_error != Some(true) {
                        "ok"
                    } else if text.starts_with("invalid arguments") {
                        assert!(text.contains('`'), "{} names no field: {text}", tool.name);
                        "invalid arguments"
                    } else {
                        "tool error"
                    }
                }
                Err(other) => panic!("{} round {round} with {shown}: {other:?}", tool.name),
            };
            *outcomes.entry(outcome).or_insert(0) += 1;
        }
    }
    // Still serving, and every kind of answer came up.
    mcp.call_ok("calculate", json!({"expression": "1+1"})).await;
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    mcp.close().await;
    let mut left: Vec<String> = std::fs::read_dir(outside.path())
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["allowed", "secret.txt"], "written outside the root");
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret.txt")).expect("read"),
        "CANARY-OUTSIDE"
    );
}

/// `loadout mcp` over stdio follows a changed `[servers]` on `SIGHUP` as `serve`
/// does: an added server's tools are listed and callable, clients are told the list
/// changed, and a removed server's tools are gone.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hangup_connects_and_stops_upstream_servers_over_stdio() {
    let Some((python, script)) = crate::support::fake_upstream() else {
        return;
    };
    let data = tempfile::tempdir().expect("tempdir");
    let config = data.path().join("loadout.toml");
    std::fs::write(&config, "[router]\n").expect("write config");
    let transport =
        TokioChildProcess::new(mcp_command(data.path(), &[])).expect("spawn loadout mcp");
    let pid = transport.id().expect("pid of loadout mcp");
    let mut mcp = connect(transport).await;
    let hangup = || crate::support::hangup(pid);
    let echo = "fake__echo".to_owned();
    assert!(!mcp.tool_names().await.contains(&echo));

    std::fs::write(
        &config,
        format!(
            "[router]\n[servers.fake]\ncommand = {python:?}\nargs = [{script:?}]\n",
            script = script.display().to_string(),
        ),
    )
    .expect("write config");
    while mcp.list_changed.try_recv().is_ok() {}
    hangup();
    tokio::time::timeout(WAIT, mcp.list_changed.recv())
        .await
        .expect("tools/list_changed in time");
    assert!(mcp.tool_names().await.contains(&echo));
    assert_eq!(
        mcp.call_ok("fake__echo", json!({"text": "hi"})).await,
        "echo: hi"
    );

    std::fs::write(&config, "[router]\n").expect("write config");
    while mcp.list_changed.try_recv().is_ok() {}
    hangup();
    tokio::time::timeout(WAIT, mcp.list_changed.recv())
        .await
        .expect("tools/list_changed in time");
    assert!(!mcp.tool_names().await.contains(&echo));
}

/// An upstream server's result reaches the client as the upstream sent it: image,
/// audio, resource link, embedded resource, annotated text and structured content,
/// called directly or through `call_tool`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_content_passes_through_unchanged() {
    let Some((python, script)) = crate::support::fake_upstream() else {
        return;
    };
    let data = crate::support::data_dir_with_fake_upstream().expect("data dir");
    // What the fake server sends, from the script itself.
    let dir = script.parent().expect("dir").display().to_string();
    let output = std::process::Command::new(python)
        .args([
            "-c",
            &format!(
                "import sys, json; sys.path.insert(0, {dir:?}); import fake_upstream; print(json.dumps(fake_upstream.DRAWING))"
            ),
        ])
        .output()
        .expect("python");
    let sent: Value = serde_json::from_slice(&output.stdout).expect("the drawing as JSON");

    let mcp = start(data.path(), &["--dynamic"]).await;
    for (name, args) in [
        ("fake__draw", json!({})),
        ("call_tool", json!({"name": "fake__draw"})),
    ] {
        let result = mcp.call(name, args).await.expect("tools/call");
        let received = serde_json::to_value(&result).expect("JSON");
        assert_eq!(received["content"], sent["content"], "{name}");
        assert_eq!(
            received["structuredContent"], sent["structuredContent"],
            "{name}"
        );
        assert_ne!(result.is_error, Some(true));
    }
    mcp.close().await;
}

/// Lines a client should never send, on a raw pipe (SDK clients cannot send them):
/// each gets its JSON-RPC error, with the request's id when there is one, and the
/// server goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_stdio_lines_get_json_rpc_errors() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let data = tempfile::tempdir().expect("tempdir");
    let mut child = mcp_command(data.path(), &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn loadout mcp");
    let mut raw = RawStdio {
        stdin: child.stdin.take().expect("stdin"),
        stdout: BufReader::new(child.stdout.take().expect("stdout")).lines(),
    };

    // Before the handshake too.
    let reply = raw.exchange("{bad".into()).await;
    assert_eq!(reply["error"]["code"], json!(-32700), "{reply}");
    assert!(reply.get("id").is_some_and(Value::is_null), "{reply}");

    let reply = raw
        .exchange(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": CLIENT_NAME, "version": "1"}}})
            .to_string(),
        )
        .await;
    assert!(
        reply["result"]["capabilities"]["tools"].is_object(),
        "{reply}"
    );
    raw.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .await;

    let cases = [
        (json!(null), "params"),
        (json!({}), "name"),
        (json!({"name": 5}), "name"),
        (
            json!({"name": "calculate", "arguments": "1+1"}),
            "arguments",
        ),
    ];
    for (i, (params, field)) in cases.into_iter().enumerate() {
        let id = 10 + i;
        let reply = raw
            .exchange(
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
                    .to_string(),
            )
            .await;
        assert_eq!(reply["id"], json!(id), "{reply}");
        assert_eq!(reply["error"]["code"], json!(-32602), "{reply}");
        assert_eq!(reply["error"]["data"]["field"], json!(field), "{reply}");
    }
    let reply = raw.exchange("{\"jsonrpc\":\"2.0\",\"id\":20}".into()).await;
    assert_eq!(
        (reply["id"].clone(), reply["error"]["code"].clone()),
        (json!(20), json!(-32600))
    );
    let reply = raw.exchange("[1, 2]".into()).await;
    assert_eq!(reply["error"]["code"], json!(-32600), "{reply}");

    // A line longer than the server reads (16 MiB).
    let huge = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":21,\"method\":\"tools/call\",\"params\":{{\"name\":\"calculate\",\"arguments\":{{\"expression\":\"{}\"}}}}}}",
        "1".repeat(17 * 1024 * 1024)
    );
    let reply = raw.exchange(huge).await;
    assert_eq!(
        (reply["id"].clone(), reply["error"]["code"].clone()),
        (json!(21), json!(-32600)),
        "{reply}"
    );

    let reply = raw
        .exchange(
            json!({"jsonrpc": "2.0", "id": 22, "method": "tools/call",
               "params": {"name": "calculate", "arguments": {"expression": "2+2"}}})
            .to_string(),
        )
        .await;
    assert_eq!(reply["id"], json!(22));
    assert!(
        reply["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains('4')),
        "{reply}"
    );
    drop(raw);
    let _ = tokio::time::timeout(WAIT, child.wait()).await;
}

/// A `loadout mcp` child spoken to line by line.
struct RawStdio {
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl RawStdio {
    async fn send(&mut self, line: &str) {
        use tokio::io::AsyncWriteExt;
        self.stdin.write_all(line.as_bytes()).await.expect("write");
        self.stdin.write_all(b"\n").await.expect("write");
    }

    /// Sends a line and reads the next reply.
    async fn exchange(&mut self, line: String) -> Value {
        self.send(&line).await;
        let reply = tokio::time::timeout(WAIT, self.stdout.next_line())
            .await
            .expect("a reply in time")
            .expect("read")
            .expect("a line");
        serde_json::from_str(&reply).expect("a JSON reply")
    }
}

/// `loadout mcp --http` with its stderr passed on; killed when dropped.
struct HttpServer {
    _child: tokio::process::Child,
    /// `http://127.0.0.1:PORT/mcp`
    url: String,
}

async fn start_http(data_dir: &Path, extra_args: &[&str]) -> HttpServer {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let mut args = vec!["--http", "127.0.0.1:0"];
    args.extend_from_slice(extra_args);
    let mut child = mcp_command(data_dir, &args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn loadout mcp --http");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let url = loop {
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("an address in time")
            .expect("read stderr")
            .expect("loadout mcp --http printed no address");
        eprintln!("{line}");
        if let Some(at) = line.find("listening on ") {
            break line[at + "listening on ".len()..].trim().to_owned();
        }
    };
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{line}");
        }
    });
    HttpServer { _child: child, url }
}

async fn connect_http(url: &str) -> Mcp {
    // reqwest is built without a default TLS provider; building a client needs one
    // even for plain HTTP.
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_owned());
    let (tx, list_changed) = mpsc::unbounded_channel();
    let service = tokio::time::timeout(WAIT, Client { list_changed: tx }.serve(transport))
        .await
        .expect("initialize in time")
        .expect("initialize");
    Mcp {
        service,
        list_changed,
    }
}

/// One raw POST to an MCP endpoint: status, content type and body.
async fn post(
    url: &str,
    session: Option<&str>,
    body: &str,
) -> (u16, String, String, Option<String>) {
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_owned());
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    let response = tokio::time::timeout(WAIT, request.send())
        .await
        .expect("an answer in time")
        .expect("POST");
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let content_type = header("content-type").unwrap_or_default();
    let session = header("mcp-session-id");
    let body = tokio::time::timeout(WAIT, response.text())
        .await
        .expect("a body in time")
        .expect("body");
    (status, content_type, body, session)
}

/// The JSON-RPC message answering `id` in a body (plain JSON, or an SSE stream).
fn answer(body: &str, id: u64) -> Value {
    std::iter::once(body)
        .chain(body.lines().filter_map(|l| l.strip_prefix("data:")))
        .filter_map(|text| serde_json::from_str::<Value>(text.trim()).ok())
        .find(|message| message["id"] == json!(id))
        .unwrap_or_else(|| panic!("no answer to {id} in {body}"))
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

/// Over HTTP: `/mcp` serves the server's view, `/mcp/domains/a,b` core and those
/// domains, each with sessions of its own; an unknown domain is refused by name; a
/// body that is no message gets a JSON-RPC error with status 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_endpoints_per_domain_set_and_json_rpc_errors() {
    let data = tempfile::tempdir().expect("tempdir");
    let server = start_http(data.path(), &[]).await;
    let every = connect_http(&server.url).await;
    let all = every.tool_names().await;
    assert!(all.contains(&"read_file".to_owned()) && all.contains(&"recall".to_owned()));

    let memory_url = format!("{}/domains/memory", server.url);
    let memory = connect_http(&memory_url).await;
    let listed = memory.tool_names().await;
    assert!(listed.contains(&"recall".to_owned()) && listed.contains(&"calculate".to_owned()));
    assert!(!listed.contains(&"read_file".to_owned()), "{listed:?}");
    let error = protocol_error(memory.call("read_file", json!({"path": "/x"})).await);
    assert_eq!(error.code.0, -32602);
    assert_eq!(
        connect_http(&format!("{}/domains/%20memory,memory", server.url))
            .await
            .tool_names()
            .await,
        listed
    );

    let (status, content_type, body, _) = post(
        &format!("{}/domains/memory,calendar", server.url),
        None,
        INITIALIZE,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let body: Value = serde_json::from_str(&body).expect("JSON");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`calendar`")),
        "{body}"
    );
    assert_eq!(body["error"]["data"]["unknown"], json!(["calendar"]));

    // A session belongs to its endpoint.
    let (status, _, _, session) = post(&server.url, None, INITIALIZE).await;
    assert_eq!(status, 200);
    let session = session.expect("a session id");
    let (status, _, _, _) = post(
        &server.url,
        Some(&session),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;
    assert_eq!(status, 202);
    let (status, _, body, _) = post(
        &memory_url,
        Some(&session),
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    )
    .await;
    assert_eq!(status, 404, "{body}");

    // Bad tools/call params in the session: -32602 naming the field.
    for (id, params, field) in [
        (3, "null", "params"),
        (4, "{}", "name"),
        (5, r#"{"name":5}"#, "name"),
        (6, r#"{"name":"calculate","arguments":"1+1"}"#, "arguments"),
    ] {
        let (status, _, body, _) = post(
            &server.url,
            Some(&session),
            &format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{params}}}"#),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let reply = answer(&body, id);
        assert_eq!(reply["error"]["code"], json!(-32602), "{reply}");
        assert_eq!(reply["error"]["data"]["field"], json!(field), "{reply}");
    }

    // Not JSON, and JSON that is no message.
    for (body, code) in [("{bad", -32700), (r#"{"jsonrpc":"2.0","id":9}"#, -32600)] {
        let (status, content_type, reply, _) = post(&server.url, Some(&session), body).await;
        assert_eq!(status, 400, "{reply}");
        assert!(
            content_type.starts_with("application/json"),
            "{content_type}"
        );
        let reply: Value = serde_json::from_str(&reply).expect("JSON");
        assert_eq!(reply["error"]["code"], json!(code), "{reply}");
        assert!(reply.get("id").is_some(), "{reply}");
    }
    every.close().await;
    memory.close().await;
}

/// Issue 32: `DELETE /mcp` answered 202, which the Python SDK reports as "Session
/// termination failed: 202" on every close; it takes 200 and 204.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ending_a_session_answers_204() {
    let data = tempfile::tempdir().expect("tempdir");
    let server = start_http(data.path(), &[]).await;
    let (status, _, _, session) = post(&server.url, None, INITIALIZE).await;
    assert_eq!(status, 200);
    let session = session.expect("a session id");
    let delete = |session: String| {
        let url = server.url.clone();
        async move {
            reqwest::Client::new()
                .delete(url)
                .header("mcp-session-id", session)
                .send()
                .await
                .expect("DELETE")
                .status()
                .as_u16()
        }
    };
    assert_eq!(delete(session.clone()).await, 204);
    // The session is gone: a request on it is refused.
    let (status, _, _, _) = post(
        &server.url,
        Some(&session),
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    )
    .await;
    assert!(status >= 400, "{status}");
}

/// Issue 29: over MCP, a `search_tools` query followed by a successful call (here
/// through `call_tool`) of a tool it returned teaches that query the tool (source
/// `mcp_search`); a call of a tool the search did not return teaches nothing, and
/// neither does a second found tool called after the first (issue 40: only the first
/// call answers the query).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_followed_by_a_call_of_a_found_tool_is_learned() {
    let data = tempfile::tempdir().expect("tempdir");
    assert!(
        loadout(data.path(), &["settings", "set", "router_dense", "off"])
            .status
            .success()
    );
    let mcp = start(data.path(), &["--dynamic"]).await;
    let query = "which tables have I made so far";
    let found = mcp
        .call("search_tools", json!({"query": query, "limit": 5}))
        .await
        .expect("tools/call");
    let found = found.structured_content.expect("structured results");
    assert!(
        found["results"]
            .as_array()
            .is_some_and(|r| r.iter().any(|hit| hit["name"] == "list_tables")),
        "list_tables not found: {found}"
    );
    assert!(
        found["results"]
            .as_array()
            .is_some_and(|r| r.iter().any(|hit| hit["name"] == "query_data")),
        "query_data not found: {found}"
    );
    mcp.call_ok("call_tool", json!({"name": "list_tables", "arguments": {}}))
        .await;
    mcp.call_ok(
        "call_tool",
        json!({"name": "query_data", "arguments": {"sql": "SELECT 1"}}),
    )
    .await;
    mcp.call_ok("calculate", json!({"expression": "2 + 2"}))
        .await;
    mcp.close().await;

    let listed = loadout(data.path(), &["learned", "--json"]);
    assert!(listed.status.success());
    let text = String::from_utf8_lossy(&listed.stdout);
    let tools: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let names: Vec<&str> = tools.iter().filter_map(|t| t["tool"].as_str()).collect();
    assert_eq!(names, ["list_tables"], "{text}");
    assert_eq!(tools[0]["sources"]["mcp_search"], 1, "{text}");
    assert_eq!(tools[0]["example"], query, "{text}");
}

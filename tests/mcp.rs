//! `loadout mcp` driven by rmcp's client, the way an MCP client runs it: a child
//! process speaking MCP over stdio, with its own data dir.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceError, ServiceExt};
use serde_json::{Value, json};
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

async fn start(data_dir: &Path, extra_args: &[&str]) -> Mcp {
    let args: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
    let command = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadout")).configure(|c| {
        c.arg("mcp")
            .args(&args)
            .env("LOADOUT_DATA_DIR", data_dir)
            .env_remove("LOADOUT_DATABASE_URL");
    });
    let transport = TokioChildProcess::new(command).expect("spawn loadout mcp");
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_and_unknown_tools_are_protocol_errors() {
    let data = tempfile::tempdir().expect("tempdir");
    let mcp = start(data.path(), &[]).await;

    let error = protocol_error(mcp.call("calculate", json!({"expression": 12})).await);
    assert_eq!(error.code.0, -32602);
    assert!(error.message.contains("`expression`"), "{}", error.message);

    let error = protocol_error(mcp.call("calculate", json!({})).await);
    assert_eq!(error.code.0, -32602);
    assert!(error.message.contains("expression"), "{}", error.message);

    let error = protocol_error(mcp.call("no_such_tool", json!({})).await);
    assert_eq!(error.code.0, -32602);
    assert!(
        error.message.contains("unknown tool `no_such_tool`"),
        "{}",
        error.message
    );

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

    mcp.call_ok(
        "set_setting",
        json!({"key": "filesystem_roots", "value": roots_value(files.path())}),
    )
    .await;
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
            (CLIENT_NAME, "set_setting", "ok"),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_mode_lists_core_and_loads_on_request() {
    let data = tempfile::tempdir().expect("tempdir");
    let mut mcp = start(data.path(), &["--dynamic"]).await;
    let names = mcp.tool_names().await;
    for name in [
        "search_tools",
        "load_tools",
        "unload_tools",
        "calculate",
        "set_setting",
    ] {
        assert!(
            names.contains(&name.to_owned()),
            "{name} missing from {names:?}"
        );
    }
    assert!(!names.contains(&"read_file".to_owned()), "{names:?}");

    let found = mcp
        .call_ok("search_tools", json!({"query": "read a file"}))
        .await;
    assert!(found.contains("read_file"), "{found}");

    // A tool that is not loaded is refused with directions.
    let result = mcp
        .call("read_file", json!({"path": "/x"}))
        .await
        .expect("tools/call");
    assert_eq!(result.is_error, Some(true));
    assert!(text_of(&result).contains("load_tools"));

    let loaded = mcp
        .call_ok("load_tools", json!({"names": ["filesystem"]}))
        .await;
    assert!(loaded.contains("read_file"), "{loaded}");
    tokio::time::timeout(WAIT, mcp.list_changed.recv())
        .await
        .expect("tools/list_changed in time")
        .expect("notification");
    let names = mcp.tool_names().await;
    assert!(names.contains(&"read_file".to_owned()), "{names:?}");
    assert!(!names.contains(&"query_data".to_owned()), "{names:?}");

    mcp.call_ok("unload_tools", json!({"names": ["filesystem"]}))
        .await;
    tokio::time::timeout(WAIT, mcp.list_changed.recv())
        .await
        .expect("tools/list_changed in time")
        .expect("notification");
    assert!(!mcp.tool_names().await.contains(&"read_file".to_owned()));

    let error = protocol_error(mcp.call("load_tools", json!({"names": [3]})).await);
    assert_eq!(error.code.0, -32602);
    assert!(error.message.contains("names/0"), "{}", error.message);
    mcp.close().await;
}

fn fake_upstream_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/fake_upstream.py")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_servers_are_imported_forwarded_followed_and_restarted() {
    let python = ["python3", "python"].into_iter().find(|p| {
        std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok()
    });
    let Some(python) = python else {
        eprintln!("skipped: no python3 for the fake upstream server");
        return;
    };
    let data = tempfile::tempdir().expect("tempdir");
    let starts = data.path().join("starts.log");
    std::fs::write(
        data.path().join("loadout.toml"),
        format!(
            "[servers.fake]\ncommand = {python:?}\nargs = [{script:?}]\nkeywords = [\"echo\"]\nenv = {{ FAKE_UPSTREAM_LOG = {log:?} }}\n",
            script = fake_upstream_script().display().to_string(),
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
    let error = protocol_error(mcp.call("fake__echo", json!({})).await);
    assert_eq!(error.code.0, -32602);

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

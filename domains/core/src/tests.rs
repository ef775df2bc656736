//! Calls each tool through the registry, as a server would.

use std::sync::Arc;

use loadout::{Registry, Settings, ToolContext, ToolError};
use loadout_store::Store;
use serde_json::{Value, json};

struct Harness {
    _dir: tempfile::TempDir,
    registry: Arc<Registry>,
    ctx: ToolContext,
}

async fn harness() -> Harness {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Store::open_dir(dir.path()).await.expect("store");
    let registry = Arc::new(Registry::from_inventory().expect("registry"));
    let ctx = ToolContext::new(registry.clone(), Settings::new(store));
    Harness {
        _dir: dir,
        registry,
        ctx,
    }
}

impl Harness {
    async fn call(&self, tool: &str, args: Value) -> Result<Value, ToolError> {
        self.registry.call(tool, args, self.ctx.clone()).await
    }
}

#[tokio::test]
async fn list_domains_and_tools() {
    let h = harness().await;
    let domains = h
        .call("list_domains", json!({}))
        .await
        .expect("list_domains");
    let core = domains
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == "core"))
        .expect("core listed");
    assert_eq!(core["active"], true);
    assert_eq!(core["always_on"], true);
    assert_eq!(core["n_tools"], 11);

    let tools = h
        .call("list_tools", json!({"domain": "core"}))
        .await
        .expect("list_tools");
    let names: Vec<&str> = tools
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "calculate",
            "current_time",
            "get_setting",
            "list_domains",
            "list_settings",
            "list_tools",
            "load_all_for_this_turn",
            "load_tools",
            "search_tools",
            "set_setting",
            "unload_tools"
        ]
    );
    assert!(tools[0]["hint"].as_str().is_some_and(|h| h.ends_with('.')));

    let error = h
        .call("list_tools", json!({"domain": "nope"}))
        .await
        .expect_err("unknown domain");
    assert!(
        error.to_string().contains("unknown domain `nope`"),
        "{error}"
    );
}

#[tokio::test]
async fn set_then_get_masks_secrets() {
    let h = harness().await;
    let set = h
        .call(
            "set_setting",
            json!({"key": "openweathermap_api_key", "value": "sk-abcdefghijkl"}),
        )
        .await
        .expect("set");
    assert_eq!(set["value"], "********ijkl");

    let got = h
        .call("get_setting", json!({"key": "openweathermap_api_key"}))
        .await
        .expect("get");
    assert_eq!(got["value"], "********ijkl");
    assert_eq!(got["masked"], true);
    assert_eq!(got["is_set"], true);

    // The store holds the real value.
    let stored = h
        .ctx
        .settings()
        .get("openweathermap_api_key")
        .await
        .expect("read");
    assert_eq!(stored.as_deref(), Some("sk-abcdefghijkl"));

    h.call(
        "set_setting",
        json!({"key": "imap_username", "value": "small"}),
    )
    .await
    .expect("set plain");
    let listed = h.call("list_settings", json!({})).await.expect("list");
    let text = listed.to_string();
    assert!(!text.contains("sk-abcdefghijkl"), "{text}");
    assert!(text.contains("\"small\""), "{text}");

    // An empty value removes the setting.
    let removed = h
        .call("set_setting", json!({"key": "imap_username", "value": ""}))
        .await
        .expect("unset");
    assert_eq!(removed["removed"], true);
    let got = h
        .call("get_setting", json!({"key": "imap_username"}))
        .await
        .expect("get");
    assert_eq!(got["is_set"], false);
    assert_eq!(got["value"], Value::Null);
}

#[tokio::test]
async fn setting_keys_are_validated() {
    let h = harness().await;
    for key in ["Bad Key", "", "a/b", "DROP TABLE"] {
        let error = h
            .call("set_setting", json!({"key": key, "value": "x"}))
            .await
            .expect_err(key);
        assert!(error.to_string().contains("invalid setting key"), "{error}");
    }
    let error = h
        .call("set_setting", json!({"key": "a"}))
        .await
        .expect_err("missing value");
    assert!(
        matches!(&error, ToolError::InvalidArgs { field: Some(f), .. } if f == "value"),
        "{error:?}"
    );
}

#[tokio::test]
async fn current_time_in_a_valid_and_an_invalid_zone() {
    let h = harness().await;
    let seoul = h
        .call("current_time", json!({"timezone": "Asia/Seoul"}))
        .await
        .expect("seoul");
    assert_eq!(seoul["timezone"], "Asia/Seoul");
    assert_eq!(seoul["utc_offset"], "+09:00");
    assert!(
        seoul["datetime"]
            .as_str()
            .is_some_and(|d| d.ends_with("+09:00"))
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    assert!((seoul["unix_seconds"].as_i64().expect("secs") - now).abs() < 5);

    let utc = h.call("current_time", json!({})).await.expect("utc");
    assert_eq!(utc["timezone"], "UTC");
    assert_eq!(utc["utc_offset"], "+00:00");

    let error = h
        .call("current_time", json!({"timezone": "Mars/Olympus_Mons"}))
        .await
        .expect_err("bad zone");
    let message = error.to_string();
    assert!(
        message.contains("unknown timezone `Mars/Olympus_Mons`"),
        "{message}"
    );
}

#[tokio::test]
async fn calculate_through_the_registry() {
    let h = harness().await;
    let result = h
        .call(
            "calculate",
            json!({"expression": "2 + 3 * 4 ^ 2 / (1 + 1)"}),
        )
        .await
        .expect("calc");
    assert_eq!(result["result"], 26.0);

    let error = h
        .call("calculate", json!({"expression": "1 / (2 - 2)"}))
        .await
        .expect_err("div by zero");
    assert!(error.to_string().contains("division by zero"), "{error}");

    let error = h
        .call("calculate", json!({"expression": "import os"}))
        .await
        .expect_err("not arithmetic");
    assert!(
        error.to_string().contains("unknown name `import`"),
        "{error}"
    );

    let deep = "(".repeat(5000) + "1" + &")".repeat(5000);
    let error = h
        .call("calculate", json!({"expression": deep}))
        .await
        .expect_err("too long");
    assert!(error.to_string().contains("at most 1000"), "{error}");

    let deep = "(".repeat(450) + "1" + &")".repeat(450);
    let error = h
        .call("calculate", json!({"expression": deep}))
        .await
        .expect_err("too deep");
    assert!(error.to_string().contains("nests deeper"), "{error}");
}

/// Records what the meta-tools asked for, as a chat server's session would.
#[derive(Default)]
struct RecordingControl {
    requests: std::sync::Mutex<Vec<String>>,
}

impl loadout::SessionControl for RecordingControl {
    fn search<'a>(&'a self, query: &'a str, limit: usize) -> loadout::ControlFuture<'a> {
        self.note(format!("search {query} {limit}"));
        Box::pin(async move { Ok(json!({"results": [{"name": "read_file"}]})) })
    }
    fn load<'a>(&'a self, names: &'a [String]) -> loadout::ControlFuture<'a> {
        self.note(format!("load {}", names.join(",")));
        Box::pin(async move {
            if names.iter().any(|n| n == "nope") {
                Err("no tool or domain named nope".to_owned())
            } else {
                Ok(json!({"loaded": names}))
            }
        })
    }
    fn unload<'a>(&'a self, names: &'a [String]) -> loadout::ControlFuture<'a> {
        self.note(format!("unload {}", names.join(",")));
        Box::pin(async move { Ok(json!({"unloaded": names})) })
    }
    fn load_all_for_this_turn(&self) -> loadout::ControlFuture<'_> {
        self.note("load_all".into());
        Box::pin(async move { Ok(json!({"n_tools": 42})) })
    }
}

impl RecordingControl {
    fn note(&self, request: String) {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(request);
    }
}

#[tokio::test]
async fn meta_tools_explain_themselves_outside_a_routed_session() {
    let h = harness().await;
    for (tool, args) in [
        ("search_tools", json!({"query": "read a file"})),
        ("load_tools", json!({"names": ["filesystem"]})),
        ("unload_tools", json!({"names": ["filesystem"]})),
        ("load_all_for_this_turn", json!({})),
    ] {
        let error = h.call(tool, args).await.expect_err(tool);
        let text = error.to_string();
        assert!(
            text.contains("routed chat session") && text.contains("already available"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn meta_tools_go_through_the_session_control() {
    let h = harness().await;
    let control = Arc::new(RecordingControl::default());
    let ctx = h.ctx.clone().with_session_control(control.clone());
    let call = |tool: &'static str, args: Value| h.registry.call(tool, args, ctx.clone());

    let found = call(
        "search_tools",
        json!({"query": "  read a file ", "limit": 3}),
    )
    .await
    .expect("search");
    assert_eq!(found["results"][0]["name"], "read_file");
    let loaded = call("load_tools", json!({"names": [" filesystem ", ""]}))
        .await
        .expect("load");
    assert_eq!(loaded["loaded"], json!(["filesystem"]));
    let error = call("load_tools", json!({"names": ["nope"]}))
        .await
        .expect_err("unknown");
    assert!(error.to_string().contains("nope"), "{error}");
    call("unload_tools", json!({"names": ["memory"]}))
        .await
        .expect("unload");
    call("load_all_for_this_turn", Value::Null)
        .await
        .expect("load all");

    let error = call("load_tools", json!({"names": []}))
        .await
        .expect_err("empty");
    assert!(matches!(error, ToolError::InvalidArgs { .. }), "{error}");
    let error = call("search_tools", json!({"query": ""}))
        .await
        .expect_err("empty");
    assert!(matches!(error, ToolError::InvalidArgs { .. }), "{error}");
    let error = call("search_tools", json!({"query": " "}))
        .await
        .expect_err("blank");
    assert!(
        error.to_string().contains("`query`: must not be empty"),
        "{error}"
    );
    let error = call("search_tools", json!({"query": "x", "limit": 0}))
        .await
        .expect_err("limit");
    assert!(matches!(error, ToolError::InvalidArgs { .. }), "{error}");

    let requests = control
        .requests
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    assert_eq!(
        requests,
        [
            "search read a file 3",
            "load filesystem",
            "load nope",
            "unload memory",
            "load_all"
        ]
    );
}

/// Issue 36: the model could set undeclared keys that say where a tool connects
/// (`imap_host`, `docker_socket_path`, a toolkit's `backup_repository`); only
/// credentials remain its to set.
#[tokio::test]
async fn the_model_sets_no_host_path_or_repository() {
    let h = harness().await;
    for (key, value) in [
        ("imap_host", "mail.evil.example"),
        ("smtp_host", "mail.evil.example"),
        ("docker_socket_path", "/var/run/docker.sock"),
        ("backup_repository", "sftp:evil.example:/loot"),
    ] {
        let error = h
            .call("set_setting", json!({"key": key, "value": value}))
            .await
            .expect_err(key);
        assert!(
            error.to_string().contains("set by the operator"),
            "{key}: {error}"
        );
        let stored = h.ctx.settings().get(key).await.expect("read");
        assert_eq!(stored, None, "{key}");
    }
    h.call(
        "set_setting",
        json!({"key": "imap_password", "value": "hunter22"}),
    )
    .await
    .expect("a credential is the model's");
}

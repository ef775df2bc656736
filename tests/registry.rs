//! The registry as servers use it: link-time collection, validation before calls,
//! settings gating, panics contained.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use loadout::{Registry, Settings, ToolContext, ToolError};
use loadout_store::Store;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

loadout::domain! {
    name: "test_probe",
    description: "Tools that exist only in the integration tests.",
    keywords: ["probe"],
}

loadout::domain! {
    name: "test_gated",
    description: "A domain that needs a setting.",
    settings_keys: ["test_gated_url"],
    keywords: ["gated"],
}

static PROBE_RUNS: AtomicUsize = AtomicUsize::new(0);

#[derive(Deserialize, JsonSchema)]
struct ProbeArgs {
    /// How many times.
    count: u32,
    /// Optional label.
    #[serde(default)]
    label: Option<String>,
}

/// Counts its runs. The integration tests use it to prove a body did (not) run.
#[loadout::tool(domain = "test_probe")]
fn probe(args: ProbeArgs) -> u32 {
    PROBE_RUNS.fetch_add(1, Ordering::SeqCst);
    let _ = args.label;
    args.count
}

/// Always panics, to prove a panicking tool is contained.
#[loadout::tool(domain = "test_probe")]
async fn probe_panics() -> u32 {
    panic!("probe panicked on purpose")
}

/// Reads the gated setting back.
#[loadout::tool(domain = "test_gated")]
async fn gated_echo(ctx: &ToolContext) -> Result<String, String> {
    ctx.settings()
        .get("test_gated_url")
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "unset".to_owned())
}

async fn context() -> (tempfile::TempDir, Arc<Registry>, ToolContext) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_dir(dir.path()).await.expect("store");
    let registry = Arc::new(loadout_domains::registry().expect("registry"));
    let ctx = ToolContext::new(registry.clone(), Settings::new(store));
    (dir, registry, ctx)
}

#[tokio::test]
async fn invalid_args_name_the_field_and_the_body_never_runs() {
    let (_dir, registry, ctx) = context().await;
    let before = PROBE_RUNS.load(Ordering::SeqCst);
    let cases = [
        (json!({"count": "three"}), "count"),
        (json!({}), "count"),
        (json!({"count": 1, "label": 7}), "label"),
        (json!({"count": -1}), "count"),
    ];
    for (args, field) in cases {
        let err = registry
            .call("probe", args.clone(), ctx.clone())
            .await
            .expect_err("must fail");
        match &err {
            ToolError::InvalidArgs { field: Some(f), .. } => assert_eq!(f, field, "{args}"),
            other => panic!("expected InvalidArgs for {args}, got {other:?}"),
        }
        // A tool result the model reads, not a protocol error (SEP-1303).
        assert_eq!(err.json_rpc_code(), None);
    }
    assert_eq!(
        PROBE_RUNS.load(Ordering::SeqCst),
        before,
        "the tool body ran on invalid args"
    );
    let ok = registry
        .call("probe", json!({"count": 3}), ctx)
        .await
        .expect("valid call");
    assert_eq!(ok, json!(3));
}

#[tokio::test]
async fn unknown_tool_is_a_clear_error() {
    let (_dir, registry, ctx) = context().await;
    let err = registry
        .call("no_such_tool", json!({}), ctx)
        .await
        .expect_err("unknown");
    assert!(matches!(err, ToolError::UnknownTool { .. }));
    assert_eq!(err.to_string(), "unknown tool `no_such_tool`");
}

#[tokio::test]
async fn a_panicking_tool_is_reported_and_the_registry_keeps_working() {
    let (_dir, registry, ctx) = context().await;
    let err = registry
        .call("probe_panics", json!({}), ctx.clone())
        .await
        .expect_err("panics");
    assert!(
        err.to_string().contains("probe panicked on purpose"),
        "{err}"
    );
    assert!(
        registry
            .call("probe", json!({"count": 1}), ctx)
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn unconfigured_domain_names_its_missing_settings_until_set() {
    let (_dir, registry, ctx) = context().await;
    let err = registry
        .call("gated_echo", json!({}), ctx.clone())
        .await
        .expect_err("gated");
    let message = err.to_string();
    assert!(
        message.starts_with("not configured: set test_gated_url"),
        "{message}"
    );
    assert!(message.contains("set_setting"), "{message}");
    ctx.settings()
        .set("test_gated_url", "http://x")
        .await
        .expect("set");
    let value = registry
        .call("gated_echo", json!({}), ctx)
        .await
        .expect("configured now");
    assert_eq!(value, json!("http://x"));
}

#[test]
fn tools_are_sorted_and_carry_their_schema_and_hint() {
    let registry = loadout_domains::registry().expect("registry");
    let names: Vec<&str> = registry
        .all_tools()
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
    let probe = registry
        .tool("probe")
        .expect("probe registered by this test crate");
    assert_eq!(probe.domain, "test_probe");
    assert_eq!(probe.hint, "Counts its runs.");
    assert_eq!(probe.input_schema["required"], json!(["count"]));
    assert_eq!(
        probe.input_schema["properties"]["count"]["description"],
        "How many times."
    );
    assert!(probe.input_schema.get("$schema").is_none());
}

#[test]
fn definitions_export_in_three_formats_with_real_token_counts() {
    let registry = Arc::new(loadout_domains::registry().expect("registry"));
    let probe = registry.tool("probe").expect("probe");
    let openai = loadout::export::openai(probe);
    assert_eq!(openai["type"], "function");
    assert_eq!(openai["function"]["name"], "probe");
    assert_eq!(openai["function"]["parameters"]["type"], "object");
    let anthropic = loadout::export::anthropic(probe);
    assert_eq!(anthropic["input_schema"]["type"], "object");
    let mcp = loadout::export::mcp(probe);
    assert_eq!(mcp["inputSchema"]["type"], "object");
    let tokens = loadout_router::tokens::tool_cost(probe);
    assert_eq!(tokens, loadout_router::tokens::count_json(&openai));
    assert!(tokens > 20 && tokens < 200, "{tokens}");
    let router = loadout_router::Router::new(registry.clone(), Default::default());
    assert!(router.all_tools_tokens() > tokens);
}

#[test]
fn a_tool_naming_an_undeclared_domain_fails_the_build_of_the_registry() {
    let registry = loadout_domains::registry().expect("registry");
    let mut tool = registry.tool("probe").expect("probe").clone();
    tool.domain = "nowhere".into();
    tool.origin = "tests/registry.rs:1".into();
    let err =
        Registry::from_parts(registry.domains().to_vec(), vec![tool]).expect_err("undeclared");
    let message = err.to_string();
    assert!(
        message.contains("`nowhere`") && message.contains("not declared"),
        "{message}"
    );
}

/// The definitions every client gets of the linked domains' tools, in each export
/// format, against the golden files in `tests/snapshots/`: a schema change shows in
/// review. `cargo insta review` (or `INSTA_UPDATE=always cargo test`) accepts one.
#[test]
fn exported_definitions_match_the_golden_files() {
    let registry = loadout_domains::registry().expect("registry");
    let linked: Vec<&loadout::Tool> = registry
        .all_tools()
        .iter()
        .filter(|t| t.origin.starts_with("domains/"))
        .collect();
    assert!(linked.len() > 20, "{} linked tools", linked.len());
    let export = |format: fn(&loadout::Tool) -> serde_json::Value| -> Vec<serde_json::Value> {
        linked.iter().map(|t| format(t)).collect()
    };
    insta::assert_json_snapshot!("definitions_mcp", export(loadout::export::mcp));
    insta::assert_json_snapshot!("definitions_openai", export(loadout::export::openai));
    insta::assert_json_snapshot!("definitions_anthropic", export(loadout::export::anthropic));
}

/// A backend with a protocol result of its own (an upstream MCP server's): `call`
/// gets its plain value, `call_passthrough` its own result; both validate first, and
/// a panic in either is contained.
struct RemoteBackend;

impl loadout::ExternalCall for RemoteBackend {
    fn call(&self, tool: &str, args: serde_json::Value) -> loadout::CallFuture {
        let tool = tool.to_owned();
        Box::pin(async move {
            if args["shape"] == json!("panic") {
                panic!("remote backend panicked on purpose");
            }
            Ok(json!(format!(
                "{tool}: a {}",
                args["shape"].as_str().unwrap_or("?")
            )))
        })
    }

    fn call_raw(&self, _tool: &str, args: serde_json::Value) -> Option<loadout::CallFuture> {
        Some(Box::pin(async move {
            if args["shape"] == json!("panic") {
                panic!("remote backend panicked on purpose");
            }
            Ok(json!({"content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}]}))
        }))
    }
}

#[tokio::test]
async fn a_passthrough_call_returns_the_backend_result_after_the_same_checks() {
    let (_dir, linked, ctx) = context().await;
    let domain = loadout::Domain {
        name: "remote".into(),
        description: "A remote drawing server.".into(),
        settings_keys: Vec::new(),
        keywords: Vec::new(),
        tier: loadout::Tier::Free,
        always_on: false,
        conflicts: Vec::new(),
        tools: Vec::new(),
        origin: "test".into(),
    };
    let mut tool = linked.tool("probe").expect("probe").clone();
    tool.name = "remote__draw".into();
    tool.domain = "remote".into();
    tool.input_schema = Arc::new(json!({
        "type": "object",
        "properties": {"shape": {"type": "string"}},
        "required": ["shape"],
    }));
    tool.backend = loadout::Backend::External(Arc::new(RemoteBackend));
    let registry = Registry::builder()
        .domain(domain, vec![tool])
        .build()
        .expect("registry");
    let args = json!({"shape": "dot"});

    let plain = registry
        .call("remote__draw", args.clone(), ctx.clone())
        .await;
    assert_eq!(plain.expect("value"), json!("remote__draw: a dot"));
    let raw = registry
        .call_passthrough("remote__draw", args, ctx.clone())
        .await
        .expect("raw");
    assert!(
        matches!(&raw, loadout::CallOutput::Raw(v) if v["content"][0]["type"] == json!("image")),
        "{raw:?}"
    );
    // A native tool has no raw form: its value.
    let native = Registry::from_inventory()
        .expect("registry")
        .call_passthrough("probe", json!({"count": 2}), ctx.clone())
        .await
        .expect("value");
    assert_eq!(native, loadout::CallOutput::Value(json!(2)));

    let err = registry
        .call_passthrough("remote__draw", json!({"shape": 3}), ctx.clone())
        .await
        .expect_err("invalid");
    assert!(
        matches!(&err, ToolError::InvalidArgs { field: Some(f), .. } if f == "shape"),
        "{err:?}"
    );
    let err = registry
        .call_passthrough("remote__draw", json!({"shape": "panic"}), ctx)
        .await
        .expect_err("panicked");
    assert!(matches!(err, ToolError::Panicked { .. }), "{err:?}");
}

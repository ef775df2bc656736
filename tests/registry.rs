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

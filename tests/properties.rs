//! Property tests of argument validation (issue 31): any JSON, sent to any linked
//! tool, is refused as invalid arguments or runs; nothing panics, and a body never
//! runs on arguments its schema refuses.

use std::sync::Arc;

use loadout::{Registry, Settings, ToolContext, ToolError};
use proptest::prelude::*;
use serde_json::{Value, json};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,40}".prop_map(Value::from),
        prop::sample::select(vec![
            "",
            "../../etc/passwd",
            "a.b",
            "SELECT 1",
            "1 + 1",
            "Asia/Seoul",
            "*"
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    prop::sample::select(vec![
                        "expression",
                        "path",
                        "key",
                        "value",
                        "query",
                        "table",
                        "rows",
                        "sql",
                        "names",
                        "limit",
                        "content",
                        "timezone",
                        "pattern",
                        "columns",
                        "tags",
                    ])
                    .prop_map(str::to_owned),
                    "[a-z_]{1,12}",
                ],
                inner,
                0..6,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

struct Harness {
    runtime: tokio::runtime::Runtime,
    registry: Arc<Registry>,
    ctx: ToolContext,
    _dir: tempfile::TempDir,
}

fn harness() -> Harness {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = runtime
        .block_on(loadout_store::Store::open_dir(dir.path()))
        .expect("store");
    let registry = Arc::new(loadout_domains::registry().expect("registry"));
    let ctx = ToolContext::new(registry.clone(), Settings::new(store)).with_session("props");
    Harness {
        runtime,
        registry,
        ctx,
        _dir: dir,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    #[test]
    fn any_json_to_any_tool_is_refused_or_runs_and_never_panics(
        tool in any::<prop::sample::Index>(),
        args in prop_oneof![json_value(), json_value().prop_map(|v| json!({"expression": v}))],
    ) {
        thread_local! {
            static HARNESS: Harness = harness();
        }
        HARNESS.with(|h| {
            // The test binary's own domains (`test_*`, tests/registry.rs) panic on
            // purpose.
            let tools: Vec<&loadout::Tool> = h
                .registry
                .all_tools()
                .iter()
                .filter(|t| !t.domain.starts_with("test_"))
                .collect();
            let name = tools[tool.index(tools.len())].name.clone();
            let valid = h.registry.validate(&name, &if args.is_null() { json!({}) } else { args.clone() });
            let called = h.runtime.block_on(h.registry.call(&name, args.clone(), h.ctx.clone()));
            match (&valid, &called) {
                (_, Err(ToolError::Panicked { message, .. })) => {
                    prop_assert!(false, "{name} panicked on {args}: {message}");
                }
                (Err(ToolError::InvalidArgs { message, .. }), called) => {
                    prop_assert!(!message.is_empty());
                    prop_assert!(
                        matches!(called, Err(ToolError::InvalidArgs { .. })),
                        "{name} ran on arguments its schema refuses ({args}): {called:?}"
                    );
                }
                (Err(other), _) => prop_assert!(false, "{name}: validation answered {other:?}"),
                (Ok(()), _) => {}
            }
            Ok(())
        })?;
    }
}

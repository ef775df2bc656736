//! Property tests of [`Router::select`] on random catalogs (issue 31): domains and
//! tools of random names, descriptions, keywords, settings and schemas (ids that
//! name their finders, so that the workflow stages run), routed with random
//! messages and budgets. Nothing panics, and a selection stays within its budget
//! unless every tool past it was sent by a stage the budget does not trim. The
//! randomized tests in `tests.rs` cover random sessions and configs on a fixed
//! catalog and spoilt toolkit files; these cover the catalogs.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use loadout::{Registry, toolkit};
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::{RouteInput, Router, RouterConfig, SessionView, Stage};

const WORDS: &[&str] = &[
    "weather",
    "forecast",
    "file",
    "read",
    "write",
    "calendar",
    "event",
    "email",
    "send",
    "search",
    "news",
    "docker",
    "container",
    "restart",
    "list",
    "delete",
    "create",
    "table",
    "note",
    "remember",
    "time",
    "price",
    "stock",
    "series",
    "movie",
    "contact",
    "invoice",
    "날씨",
    "파일",
    "일정",
    "🙂",
    "the",
    "and",
    "then",
    "my",
    "it",
    "yes",
    "do",
];

fn words(max: usize) -> impl Strategy<Value = Vec<&'static str>> {
    prop::collection::vec(prop::sample::select(WORDS), 0..max)
}

/// One tool: a description of catalog words, and properties of which some are ids
/// described as found by another tool of the catalog.
fn tool(domain: usize, index: usize) -> impl Strategy<Value = Value> {
    (words(12), words(3), prop::collection::vec((words(2), any::<bool>(), 0usize..6), 0..4))
        .prop_map(move |(description, keywords, properties)| {
            let mut schema_properties = serde_json::Map::new();
            let mut required = Vec::new();
            for (i, (noun, is_id, finder)) in properties.into_iter().enumerate() {
                let noun = noun.first().copied().unwrap_or("thing");
                let name = if is_id { format!("{noun}_id") } else { format!("{noun}_{i}") };
                let description = if is_id {
                    format!("The {noun} id from t{domain}_{finder}")
                } else {
                    format!("The {noun}")
                };
                required.push(Value::String(name.clone()));
                schema_properties.insert(name, json!({"type": "string", "description": description}));
            }
            json!({
                "name": format!("t{domain}_{index}"),
                "description": format!("{}.", description.join(" ")),
                "keywords": keywords,
                "input_schema": {"type": "object", "properties": schema_properties, "required": required},
            })
        })
}

fn domain(index: usize) -> impl Strategy<Value = Value> {
    (
        1usize..14,
        words(8),
        words(4),
        any::<bool>(),
        Just(index == 0),
    )
        .prop_flat_map(
            move |(n_tools, description, keywords, needs_setting, always_on)| {
                let tools: Vec<_> = (0..n_tools).map(|t| tool(index, t)).collect();
                (
                    tools,
                    Just((description, keywords, needs_setting, always_on)),
                )
            },
        )
        .prop_map(
            move |(tools, (description, keywords, needs_setting, always_on))| {
                let settings: Vec<String> = if needs_setting && !always_on {
                    vec![format!("d{index}_key")]
                } else {
                    vec![]
                };
                json!({
                    "domain": format!("d{index}"),
                    "description": format!("{} tools.", description.join(" ")),
                    "keywords": keywords,
                    "settings_keys": settings,
                    "always_on": always_on,
                    "tools": tools,
                })
            },
        )
}

fn catalog() -> impl Strategy<Value = Arc<Registry>> {
    (1usize..8)
        .prop_flat_map(|n| (0..n).map(domain).collect::<Vec<_>>())
        .prop_map(|files| {
            let mut builder = Registry::builder();
            for (i, file) in files.iter().enumerate() {
                let parsed = toolkit::parse(&file.to_string(), &format!("random{i}.json"))
                    .unwrap_or_else(|e| panic!("a generated toolkit file is refused: {e}"));
                builder = builder.toolkit(parsed);
            }
            Arc::new(
                builder
                    .build()
                    .unwrap_or_else(|e| panic!("a generated catalog is refused: {e}")),
            )
        })
}

fn message() -> impl Strategy<Value = String> {
    prop_oneof![
        words(16).prop_map(|w| w.join(" ")),
        ".{0,120}",
        (words(6), "[ -~]{0,20}").prop_map(|(w, junk)| format!("{} {junk}", w.join(" "))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_catalogs_route_within_their_budget(
        registry in catalog(),
        messages in prop::collection::vec(message(), 1..5),
        budget in prop::option::of(0usize..6000),
        set_keys in any::<u8>(),
    ) {
        let router = Router::new(registry.clone(), RouterConfig::default());
        let settings: BTreeMap<String, String> = registry
            .domains()
            .iter()
            .enumerate()
            .filter(|(i, _)| set_keys & (1 << (i % 8)) != 0)
            .flat_map(|(_, d)| d.settings_keys.iter().map(|k| (k.clone(), "set".to_owned())))
            .collect();
        let mut session = SessionView::new(1);
        let mut previous = None;
        for (turn, message) in messages.iter().enumerate() {
            session.begin_turn(turn as i64 + 1, previous.as_ref());
            let selection = router.select(&RouteInput {
                token_budget: budget,
                ..RouteInput::new(message, &settings, &session)
            });
            let budget = budget.unwrap_or(router.config().token_budget);
            prop_assert_eq!(selection.tokens, selection.tools.iter().map(|t| t.tokens).sum::<usize>());
            prop_assert_eq!(selection.n_tools, selection.tools.len());
            let mut sent = HashSet::new();
            for tool in &selection.tools {
                prop_assert!(sent.insert(tool.name.to_string()), "{} sent twice", tool.name);
                prop_assert!(
                    registry.missing_settings(&tool.domain, &settings).is_empty(),
                    "{} sent from an inactive domain", tool.name
                );
            }
            if selection.tokens > budget {
                for tool in &selection.tools {
                    prop_assert!(
                        matches!(tool.stage, Stage::AlwaysOn | Stage::Sticky | Stage::Pinned | Stage::Loaded),
                        "{} tokens over a budget of {budget}: {} sent by {:?}",
                        selection.tokens, tool.name, tool.stage
                    );
                }
            }
            let called: Vec<&str> = selection.tools.iter().take(1).map(|t| t.name.as_ref()).collect();
            session.record_calls(&router, &called);
            previous = Some(selection);
        }
    }
}

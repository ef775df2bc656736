//! Router tests on a small in-memory catalog.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::json;

use super::*;
use loadout::toolkit;

fn tool(name: &str, description: &str) -> serde_json::Value {
    json!({"name": name, "description": description, "input_schema": {"type": "object", "properties": {}}})
}

fn catalog() -> Vec<serde_json::Value> {
    vec![
        json!({"domain": "core", "description": "Core tools.", "keywords": ["settings", "now"], "always_on": true,
               "tools": [tool("list_domains", "List tool domains and whether each is active."),
                         tool("get_setting", "Read a setting by key.")]}),
        json!({"domain": "weather", "description": "Weather forecasts and current conditions.",
               "keywords": ["weather", "forecast", "umbrella", "morning", "날씨"], "settings_keys": ["weather_key"],
               "tools": [tool("get_current_weather", "Current weather conditions for a place."),
                         tool("get_weather_forecast", "Daily weather forecast for the next days.")]}),
        json!({"domain": "homeassistant", "description": "Smart home control: lights, switches, climate.",
               "keywords": ["light", "lamp", "thermostat"],
               "tools": [tool("ha_turn_on", "Turn on a light or switch."),
                         tool("ha_turn_off", "Turn off a light or switch."),
                         tool("ha_set_light", "Set brightness and color of a light.")]}),
        json!({"domain": "scratchpad", "description": "Tables you can query with SQL.",
               "keywords": ["table", "sql"],
               "tools": [tool("create_table", "Create a table with columns."),
                         tool("insert_data", "Insert rows into a table."),
                         tool("query_data", "Run a SQL query over stored tables.")]}),
        json!({"domain": "memory", "description": "Long-term memory of facts about the user.",
               "keywords": ["remember", "recall"], "conflicts": ["scratchpad"],
               "tools": [tool("remember", "Store a fact about the user for later."),
                         json!({"name": "recall", "description": "Look up stored facts about the user.",
                                "input_schema": {"type": "object", "properties": {}},
                                "conflicts": ["query_data"]})]}),
        json!({"domain": "news", "description": "Headlines and articles from news sites.",
               "keywords": ["news", "headlines"],
               "tools": [tool("search_news", "Search recent news articles and headlines."),
                         tool("get_article", "Fetch a news article by URL.")]}),
        json!({"domain": "docker", "description": "Docker containers, images and volumes.",
               "keywords": ["docker", "container"],
               "tools": (0..12).map(|i| tool(&format!("docker_tool_{i:02}"), &format!("Docker operation number {i} on containers."))).chain([
                   tool("restart_container", "Restart a docker container by name."),
               ]).collect::<Vec<_>>()}),
    ]
}

fn registry() -> Arc<Registry> {
    registry_of(&catalog())
}

/// A registry of toolkit files given as JSON.
fn registry_of(toolkits: &[serde_json::Value]) -> Arc<Registry> {
    let mut builder = Registry::builder();
    for (i, value) in toolkits.iter().enumerate() {
        let parsed = toolkit::parse(&value.to_string(), &format!("test{i}.json"));
        builder = builder.toolkit(parsed.unwrap_or_else(|e| panic!("test catalog {i}: {e}")));
    }
    Arc::new(
        builder
            .build()
            .unwrap_or_else(|e| panic!("test registry: {e}")),
    )
}

fn router_with(config: RouterConfig) -> Router {
    Router::new(registry(), config)
}

fn router() -> Router {
    router_with(RouterConfig::default())
}

/// `create_table` pins its domain, as the linked scratchpad's does.
fn pinning(config: RouterConfig) -> RouterConfig {
    RouterConfig {
        pin_on_tools: vec!["create_table".into()],
        ..config
    }
}

fn all_settings() -> BTreeMap<String, String> {
    BTreeMap::from([("weather_key".to_owned(), "k".to_owned())])
}

fn route(router: &Router, message: &str, session: &SessionView) -> Selection {
    let vectors = vectors_for(router, message);
    router.select(&RouteInput {
        vectors: vectors.as_ref(),
        ..RouteInput::new(message, &all_settings(), session)
    })
}

/// What a server does before `select`: the message's pieces through the encoder the
/// attached dense index names (here a fake one per model id); `None` without one.
fn vectors_for(router: &Router, message: &str) -> Option<MessageVectors> {
    let dense = router.dense()?;
    let encode: fn(&str) -> Vec<f32> = match dense.model_id() {
        "test" => outside_is_weather,
        "hash" => hash_vector,
        _ => |_| vec![1.0],
    };
    let pieces = message_pieces(message).into_iter().map(encode).collect();
    Some(MessageVectors::new(dense.model_id(), pieces))
}

/// The stage a sent tool was sent by (`None`: not sent).
fn stage_of_tool(selection: &Selection, name: &str) -> Option<Stage> {
    selection
        .tools
        .iter()
        .find(|t| t.name.as_ref() == name)
        .map(|t| t.stage)
}

/// `tool`'s value of `feature` in the scorer's row for `input` (0 without a row).
fn feature_of(router: &Router, input: &RouteInput<'_>, tool: &str, feature: usize) -> f32 {
    let t = router.registry().tool_idx(tool);
    router
        .feature_rows(input)
        .into_iter()
        .find(|(idx, _)| Some(*idx) == t)
        .map_or(0.0, |(_, row)| row[feature])
}

fn stage_of(selection: &Selection, domain: &str) -> Stage {
    selection
        .domain(domain)
        .map(|d| d.stage)
        .unwrap_or(Stage::NotMatched)
}

#[test]
fn core_is_always_sent_and_first() {
    let router = router();
    let selection = route(&router, "what's the weather tomorrow", &SessionView::new(1));
    assert_eq!(selection.tools[0].domain, "core");
    assert_eq!(selection.tools[1].domain, "core");
    assert!(selection.contains("get_weather_forecast"));
    assert_eq!(stage_of(&selection, "weather"), Stage::Keyword);
    assert!(!selection.contains("ha_turn_on"));
}

#[test]
fn inactive_domains_are_never_sent_and_name_their_missing_settings() {
    let router = router();
    let selection = router.select(&RouteInput::new(
        "weather forecast please",
        &BTreeMap::from([("weather_key".to_owned(), "  ".to_owned())]),
        &SessionView::new(1),
    ));
    let weather = selection
        .domain("weather")
        .map(|d| (d.included, d.stage, d.reason.to_string()));
    assert_eq!(
        weather,
        Some((
            false,
            Stage::Inactive,
            "missing settings: weather_key".to_owned()
        ))
    );
    assert!(!selection.contains("get_weather_forecast"));
}

#[test]
fn an_unconfigured_domain_that_fits_the_message_is_named_with_its_keys() {
    let router = router();
    let unset = BTreeMap::new();
    let route_with = |message: &str, settings: &BTreeMap<String, String>| {
        router.select(&RouteInput::new(message, settings, &SessionView::new(1)))
    };
    let selection = route_with("what's the weather in Seoul tomorrow", &unset);
    let named: Vec<String> = selection
        .unconfigured
        .iter()
        .map(|u| u.to_string())
        .collect();
    assert_eq!(named, ["weather (not configured: set weather_key)"]);
    assert!(
        selection
            .summary_line()
            .ends_with("| weather (not configured: set weather_key)"),
        "{}",
        selection.summary_line()
    );
    assert!(!selection.contains("get_weather_forecast"));

    // Configured, it is sent and not named; a message about something else names
    // nothing; and a better-fitting active domain outranks a weaker unconfigured one.
    let configured = route_with("what's the weather in Seoul tomorrow", &all_settings());
    assert!(configured.unconfigured.is_empty());
    assert!(configured.contains("get_weather_forecast"));
    assert!(
        route_with("turn on the lamp", &unset)
            .unconfigured
            .is_empty()
    );
    let lamp = route_with(
        "turn on the light and the lamp, then check the weather",
        &unset,
    );
    assert!(lamp.unconfigured.is_empty(), "{:?}", lamp.unconfigured);
}

/// A follow-up the last turn's tools were carried into is about them: a word of it
/// that resembles an unconfigured domain does not make the model ask for its keys.
#[test]
fn a_follow_up_names_an_unconfigured_domain_only_by_keyword() {
    let router = router();
    let unset = BTreeMap::new();
    let route_with = |message: &str, session: &SessionView| {
        router.select(&RouteInput::new(message, &unset, session))
    };
    let mut view = SessionView::new(1);
    let first = route_with("restart the redis container", &view);
    view.record_calls::<&str>(&router, &[]);
    view.begin_turn(2, Some(&first));
    // "daily" is in the weather forecast's description.
    let second = route_with("yes, the daily one", &view);
    assert!(second.contains("restart_container"));
    assert!(second.unconfigured.is_empty(), "{:?}", second.unconfigured);
    // Its own keyword still names it.
    let third = route_with("yes, and the weather", &view);
    let named: Vec<&str> = third
        .unconfigured
        .iter()
        .map(|u| u.domain.as_ref())
        .collect();
    assert_eq!(named, ["weather"]);
}

#[test]
fn an_unconfigured_domain_is_not_named_when_the_always_on_tools_explain_the_message_better() {
    let router = router();
    // "current" is in a weather tool's description and passes the BM25 gate, but
    // the core tools explain the message better: naming weather would make the
    // model ask for a key the user does not need.
    let selection = router.select(&RouteInput::new(
        "read the current setting by key",
        &BTreeMap::new(),
        &SessionView::new(1),
    ));
    assert!(
        selection.unconfigured.is_empty(),
        "{:?}",
        selection.unconfigured
    );
}

#[test]
fn every_tool_the_scorer_weighed_says_which_features_sent_it() {
    let router = router();
    let message = "make a table of my expenses";
    let session = SessionView::new(1);
    let selection = route(&router, message, &session);
    let settings = all_settings();
    let input = RouteInput::new(message, &settings, &session);
    let mut weighed = 0;
    for tool in &selection.tools {
        if tool.stage == Stage::AlwaysOn {
            assert!(tool.why.is_empty(), "{}: {}", tool.name, tool.why);
            continue;
        }
        assert!(!tool.why.is_empty(), "{} says nothing", tool.name);
        weighed += 1;
        // Each named feature with the value of the tool's row.
        for (name, value) in tool.why.iter() {
            let feature = crate::scorer::FEATURES.iter().position(|f| *f == name);
            let row_value = feature.map(|f| feature_of(&router, &input, &tool.name, f));
            assert_eq!(row_value, Some(value), "{}: {name}", tool.name);
            assert!(value > 0.0, "{}: {name} {value}", tool.name);
        }
        // In the JSON, as an object whose keys come largest contribution first.
        let json = serde_json::to_string(tool).unwrap_or_default();
        let at: Vec<Option<usize>> = tool
            .why
            .iter()
            .map(|(name, _)| json.find(&format!("\"{name}\":")))
            .collect();
        assert!(at.iter().all(Option::is_some), "{json}");
        assert!(at.is_sorted(), "{json}");
    }
    assert!(weighed > 0, "{}", selection.summary_line());
    // The domain's reason explains its likeliest tool by the same features.
    let likeliest = selection.tools.iter().find(|t| t.domain == "scratchpad");
    let reason = selection.domain("scratchpad").map(|d| d.reason.to_string());
    assert!(
        likeliest
            .zip(reason.as_deref())
            .is_some_and(|(tool, reason)| reason
                .contains(&format!("{} p {:.2}: {}", tool.name, tool.score, tool.why))),
        "{likeliest:?} {reason:?}"
    );
}

#[test]
fn a_keyword_verdict_names_its_keywords() {
    let router = router();
    let selection = route(&router, "make a table of my expenses", &SessionView::new(1));
    let reason = selection.domain("scratchpad").map(|d| d.reason.to_string());
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.starts_with("keyword \"table\"; ")),
        "{reason:?}"
    );
    let selection = route(&router, "run sql over the table", &SessionView::new(1));
    let reason = selection.domain("scratchpad").map(|d| d.reason.to_string());
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.starts_with("keywords \"sql\", \"table\"; ")),
        "{reason:?}"
    );
}

#[test]
fn korean_keywords_route() {
    let router = router();
    let selection = route(&router, "부산 지금 날씨 어때", &SessionView::new(1));
    assert!(selection.contains("get_current_weather"));
    assert_eq!(stage_of(&selection, "weather"), Stage::Keyword);
}

#[test]
fn highlight_does_not_fire_the_light_keyword() {
    let router = router();
    let selection = route(
        &router,
        "give me the highlights of the news",
        &SessionView::new(1),
    );
    assert!(selection.contains("search_news"));
    assert_ne!(stage_of(&selection, "homeassistant"), Stage::Keyword);
}

#[test]
fn used_domains_stick_until_idle_longer_than_idle_turns() {
    let router = router_with(RouterConfig {
        idle_turns: 2,
        carry_over: false,
        ..RouterConfig::default()
    });
    let mut view = SessionView::new(1);
    let first = route(&router, "turn on the lamp", &view);
    assert!(first.contains("ha_turn_on"));
    view.record_calls(&router, &["ha_turn_on"]);
    for turn in 2..=3 {
        view.begin_turn(turn, None);
        let selection = route(&router, "a bit dimmer", &view);
        assert_eq!(
            stage_of(&selection, "homeassistant"),
            Stage::Sticky,
            "turn {turn}"
        );
        assert!(selection.contains("ha_set_light"));
    }
    view.begin_turn(4, None);
    let selection = route(&router, "a bit dimmer", &view);
    assert_ne!(stage_of(&selection, "homeassistant"), Stage::Sticky);
}

#[test]
fn workflow_tools_pin_their_domain_for_the_session() {
    let router = router_with(pinning(RouterConfig {
        idle_turns: 1,
        ..RouterConfig::default()
    }));
    let mut view = SessionView::new(1);
    let changed = view.record_calls(&router, &["create_table"]);
    assert_eq!(changed.len(), 1);
    assert!(changed[0].pinned);
    view.begin_turn(10, None);
    let selection = route(&router, "add another one: 12 oak st", &view);
    assert_eq!(stage_of(&selection, "scratchpad"), Stage::Pinned);
    assert!(selection.contains("insert_data"));
}

#[test]
fn calls_to_core_tools_change_no_session_state() {
    let router = router();
    let mut view = SessionView::new(1);
    assert!(
        view.record_calls(&router, &["list_domains", "no_such_tool"])
            .is_empty()
    );
    assert!(view.domains.is_empty());
}

#[test]
fn conflicting_domains_keep_the_better_one_unless_both_justified() {
    let router = router();
    let view = SessionView::new(1);
    // Only memory is matched by keyword; scratchpad comes by similarity ("facts" no, "table" no):
    // force both in through the session to check the justified case first.
    let mut both_used = SessionView::new(2);
    both_used.record_calls(&router, &["remember", "insert_data"]);
    let selection = route(&router, "what was that again", &both_used);
    assert!(selection.domain("memory").is_some_and(|d| d.included));
    assert!(selection.domain("scratchpad").is_some_and(|d| d.included));

    // Both by keyword: both stay.
    let selection = route(&router, "remember this table", &view);
    assert!(selection.contains("remember") && selection.contains("create_table"));

    // One by keyword, one by similarity: the lower one is dropped as a collision.
    let selection = route(
        &router,
        "recall the stored user facts in my sql tables",
        &view,
    );
    let memory = selection.domain("memory").map(|d| d.stage);
    let scratchpad = selection.domain("scratchpad").map(|d| d.stage);
    assert!(
        memory == Some(Stage::Collision)
            || scratchpad == Some(Stage::Collision)
            || (memory == Some(Stage::Keyword) && scratchpad == Some(Stage::Keyword)),
        "{memory:?} {scratchpad:?}"
    );
}

#[test]
fn conflicting_tools_keep_the_better_one() {
    let router = router();
    let mut view = SessionView::new(1);
    // scratchpad held by the session, memory matched by keyword: `recall` and
    // `query_data` conflict; only one session domain is used, so one of them goes.
    view.record_calls(&router, &["insert_data"]);
    view.begin_turn(2, None);
    let selection = route(&router, "recall it", &view);
    assert!(
        selection.contains("recall") != selection.contains("query_data")
            || selection
                .domain("memory")
                .is_some_and(|d| d.stage == Stage::Collision)
    );
    let collided = selection
        .tool_decisions
        .iter()
        .any(|d| d.stage == Stage::Collision)
        || selection
            .domains
            .iter()
            .any(|d| d.stage == Stage::Collision);
    assert!(collided, "{}", selection.summary_line());
}

#[test]
fn budget_trims_optional_tools_but_never_core_or_pinned() {
    let router = router_with(pinning(RouterConfig::default()));
    let mut view = SessionView::new(1);
    view.record_calls(&router, &["create_table"]);
    view.begin_turn(2, None);
    let held = |domain: &str| domain == "core" || domain == "scratchpad";
    let tools = router.registry().all_tools();
    let core_and_pinned: usize = (0..tools.len())
        .filter(|&i| held(&tools[i].domain))
        .map(|i| router.tool_tokens(i))
        .sum();
    let selection = router.select(&RouteInput {
        token_budget: Some(core_and_pinned + 1),
        ..RouteInput::new(
            "docker container weather forecast news headlines",
            &all_settings(),
            &view,
        )
    });
    for tool in tools.iter().filter(|t| held(&t.domain)) {
        assert!(selection.contains(&tool.name), "{} trimmed", tool.name);
    }
    assert!(
        selection.tokens <= core_and_pinned + 1,
        "{} tokens",
        selection.tokens
    );
    assert!(
        selection
            .tool_decisions
            .iter()
            .any(|d| d.stage == Stage::BudgetTrimmed)
    );
    assert!(!selection.hints.is_empty());
}

#[test]
fn large_domains_send_their_best_tools_and_hint_the_rest() {
    let router = router();
    let docker: Vec<usize> = (0..router.registry().all_tools().len())
        .filter(|&i| router.registry().all_tools()[i].domain == "docker")
        .collect();
    let docker_tokens: usize = docker.iter().map(|&i| router.tool_tokens(i)).sum();
    // A small domain goes whole once it is likely; one that does not fit the budget
    // sends its likely tools and hints the rest.
    let whole = route(&router, "restart the redis container", &SessionView::new(1));
    assert!(
        docker
            .iter()
            .all(|&i| whole.contains(&router.registry().all_tools()[i].name))
    );
    let selection = router.select(&RouteInput {
        token_budget: Some(docker_tokens),
        ..RouteInput::new(
            "restart the redis container",
            &all_settings(),
            &SessionView::new(1),
        )
    });
    assert!(selection.contains("restart_container"));
    let docker_sent = selection
        .tools
        .iter()
        .filter(|t| t.domain == "docker")
        .count();
    assert!(
        (1..docker.len()).contains(&docker_sent),
        "{}",
        selection.summary_line()
    );
    for &i in &docker {
        let name = &router.registry().all_tools()[i].name;
        assert!(
            selection.contains(name) || selection.hints.iter().any(|h| h.name.as_ref() == name),
            "{name} neither sent nor hinted"
        );
    }
}

#[test]
fn meta_tools_load_unload_and_load_all() {
    let router = router();
    let mut view = SessionView::new(1);
    // Loading a tool by name sends it in the same turn.
    assert!(view.load(&router, &["nope"]).is_err());
    view.load(&router, &["get_article"]).unwrap_or_default();
    let selection = route(&router, "weather forecast", &view);
    assert!(selection.contains("get_article"));
    assert!(selection.contains("get_weather_forecast"));

    // Unloading keeps the domain out, even against keywords, until used again.
    let changed = view.unload(&router, &["weather"]).unwrap_or_default();
    assert!(changed.iter().any(|s| s.domain == "weather" && s.unloaded));
    let selection = route(&router, "weather forecast", &view);
    assert!(!selection.contains("get_weather_forecast"));
    assert_eq!(stage_of(&selection, "weather"), Stage::Unloaded);
    assert_eq!(
        view.unload(&router, &["core"]),
        Err(SessionError::AlwaysOn("core".into()))
    );

    view.load(&router, &["weather"]).unwrap_or_default();
    let selection = route(&router, "weather forecast", &view);
    assert!(selection.contains("get_weather_forecast"));

    view.load_all_for_this_turn();
    let selection = route(&router, "anything", &view);
    assert_eq!(selection.n_tools, selection.n_active_tools);
    view.begin_turn(2, Some(&selection));
    assert!(!view.load_all_this_turn && view.loaded_tools.is_empty());
}

#[test]
fn follow_ups_without_evidence_see_last_turns_tools() {
    let router = router();
    let mut view = SessionView::new(1);
    let first = route(&router, "restart the redis container", &view);
    assert!(first.contains("restart_container"));
    // The model asked for confirmation and called nothing.
    view.record_calls::<&str>(&router, &[]);
    view.begin_turn(2, Some(&first));
    let second = route(&router, "yes do it", &view);
    assert!(second.contains("restart_container"));
    assert_eq!(stage_of(&second, "docker"), Stage::Carried);
}

#[test]
fn search_returns_matching_active_tools() {
    let router = router();
    let hints = router.search("dim the light", Some(&all_settings()), None, None, 10);
    assert!(hints.iter().any(|h| h.name == "ha_set_light"));
    // Only active tools, unless every tool is asked for.
    let hints = router.search("weather", Some(&BTreeMap::new()), None, None, 10);
    assert!(hints.iter().all(|h| h.domain != "weather"));
    let hints = router.search("weather", None, None, None, 10);
    assert!(hints.iter().any(|h| h.domain == "weather"));
    assert_eq!(router.search("weather", None, None, None, 1).len(), 1);
    assert!(router.search("zzzz qqqq", None, None, None, 10).is_empty());
}

#[test]
fn search_finds_a_tool_by_what_its_parameters_say() {
    // "throttle" is in neither tool's name nor description, only in a parameter's.
    let toolkit = json!({"domain": "torrents", "description": "A torrent client.",
        "tools": [tool("list_torrents", "List torrents and their state."),
                  {"name": "set_transfer_limits", "description": "Change the client's transfer settings.",
                   "input_schema": {"type": "object", "properties": {
                       "download_limit": {"type": "integer", "description": "Throttle downloads to this many bytes per second."}}}}]});
    let router = Router::new(registry_of(&[toolkit]), RouterConfig::default());
    let hits = router.search("throttle the downloads", None, None, None, 1);
    assert_eq!(
        hits.first().map(|h| h.name.as_ref()),
        Some("set_transfer_limits"),
        "{hits:?}"
    );
}

#[test]
fn names_split_into_words_at_separators_and_camel_case() {
    assert_eq!(build::spaced("get_current_time"), "get current time");
    assert_eq!(build::spaced("get-sum"), "get sum");
    assert_eq!(build::spaced("startDate"), "start Date");
    assert_eq!(build::spaced("pageSize2Max"), "page Size2 Max");
    assert_eq!(build::spaced("URL"), "URL");
}

#[test]
fn summary_line_lists_included_domains_with_stage_and_score() {
    let router = router_with(pinning(RouterConfig::default()));
    let mut view = SessionView::new(1);
    view.record_calls(&router, &["create_table"]);
    view.begin_turn(2, None);
    let selection = route(&router, "weather forecast for tomorrow", &view);
    let line = selection.summary_line();
    assert!(
        line.starts_with(&format!(
            "[router] {}/{} tools, ",
            selection.n_tools, selection.n_active_tools
        )),
        "{line}"
    );
    assert!(line.contains(" tokens | "), "{line}");
    assert!(line.contains("weather(keyword:0.80)"), "{line}");
    assert!(line.contains("scratchpad(pinned)"), "{line}");
    assert!(!line.contains("core("), "{line}");
}

#[test]
fn a_selection_lists_the_sent_tools_as_openai_definitions() {
    let router = router();
    let selection = route(&router, "weather", &SessionView::new(3));
    assert_eq!(
        selection.tools_openai(router.registry()).len(),
        selection.n_tools
    );
}

/// Embeds a text that says "outside" as [1, 0], any other as [0, 1] (model `test`).
fn outside_is_weather(text: &str) -> Vec<f32> {
    if text.contains("outside") {
        vec![1.0, 0.0]
    } else {
        vec![0.0, 1.0]
    }
}

/// A message only the dense stage can route to the weather.
const OUTSIDE: &str = "what's it like outside";

/// [`OUTSIDE`]'s vectors, one per piece, pointing at the weather.
fn outside_pieces() -> Vec<Vec<f32>> {
    message_pieces(OUTSIDE)
        .into_iter()
        .map(outside_is_weather)
        .collect()
}

/// [`OUTSIDE`] routed with `vectors`, every setting set, in a new session.
fn route_outside(router: &Router, vectors: Option<&MessageVectors>) -> Selection {
    router.select(&RouteInput {
        vectors,
        ..RouteInput::new(OUTSIDE, &all_settings(), &SessionView::new(1))
    })
}

/// The router's dense rows: [1, 0] for `get_current_weather`'s texts, `rest` for every
/// other text.
fn weather_rows(router: &Router, rest: [f32; 2]) -> Vec<Vec<f32>> {
    (0..router.dense_texts().len())
        .map(|i| {
            let tool = router
                .dense_text_tool(i)
                .map(|t| router.registry().all_tools()[t].name.as_str());
            if tool == Some("get_current_weather") {
                vec![1.0, 0.0]
            } else {
                rest.to_vec()
            }
        })
        .collect()
}

/// The dense weights say which encoder they were fitted with; another encoder's
/// stage is named as a mismatch, the same one is not.
#[test]
fn dense_weights_fitted_with_another_encoder_are_named() {
    let mut router = router();
    assert_eq!(router.dense_weights_mismatch(), None, "no dense stage");
    let fitted = router
        .weights()
        .dense_encoder()
        .expect("the shipped weights name their encoder")
        .to_owned();
    router.set_dense(Some(DenseIndex::new(
        &fitted,
        weather_rows(&router, [0.0, 1.0]),
    )));
    assert_eq!(router.dense_weights_mismatch(), None, "{fitted}");
    router.set_dense(Some(DenseIndex::new(
        "another-encoder",
        weather_rows(&router, [0.0, 1.0]),
    )));
    let mismatch = router.dense_weights_mismatch().expect("a mismatch");
    assert!(
        mismatch.contains(&fitted) && mismatch.contains("another-encoder"),
        "{mismatch}"
    );
}

/// A joined stage (two encoders' vectors end to end) scores each part as its own
/// encoder: the second's cosines are features of their own, which only a joined
/// model weighs. Without one, the dense model routes as the first encoder alone.
#[test]
fn a_joined_stage_scores_its_second_encoder_apart() {
    use crate::scorer::f;
    const FOUND: &str = "restart_container";
    let mut router = router();
    let mut unfitted = router.weights().clone();
    unfitted.joined = None;
    router.set_weights(unfitted);
    // The first encoder puts `FOUND` away from the message (a cosine of 0: nothing
    // of that encoder's points at it) and nearly every other text on it; the second
    // finds `FOUND` alone.
    let rows: Vec<Vec<f32>> = (0..router.dense_texts().len())
        .map(|i| {
            let tool = router
                .dense_text_tool(i)
                .map(|t| router.registry().all_tools()[t].name.as_str());
            match tool {
                Some(FOUND) => vec![0.0, 1.0, 1.0, 0.0],
                // Away from the message by both: `FOUND`'s domain's other tool that
                // nothing points at (no row of its own).
                Some("docker_tool_00") => vec![0.0, 1.0, 0.0, 1.0],
                _ => vec![1.0, 0.0, 0.0, 1.0],
            }
        })
        .collect();
    let first_only: Vec<Vec<f32>> = rows.iter().map(|r| r[..2].to_vec()).collect();
    // Scaled parts: each is normalised on its own.
    let message: Vec<Vec<f32>> = message_pieces(OUTSIDE)
        .iter()
        .map(|_| vec![3.0, 0.0, 1.0, 0.0])
        .collect();
    router.set_dense(Some(DenseIndex::joined("a+b", rows.clone(), 2)));
    assert!(router.dense().is_some_and(DenseIndex::is_joined));
    let unweighed = router.dense_weights_mismatch().unwrap_or_default();
    assert!(unweighed.contains("no joined weights"), "{unweighed}");
    let vectors = MessageVectors::new("a+b", message.clone());
    let (settings, session) = (all_settings(), SessionView::new(1));
    let input = RouteInput {
        vectors: Some(&vectors),
        ..RouteInput::new(OUTSIDE, &settings, &session)
    };
    let feature = |tool: &str, f: usize| feature_of(&router, &input, tool, f);
    assert!((feature(FOUND, f::TOOL_DENSE2) - 1.0).abs() < 1e-5);
    assert_eq!(feature(FOUND, f::TOOL_DENSE2_RANK), 1.0);
    assert_eq!(feature(FOUND, f::TOOL_DENSE2_TOP3), 1.0);
    assert_eq!(feature(FOUND, f::TOOL_DENSE), 0.0);
    // `search_tools` finds what only the second encoder points at.
    let found = router.search(OUTSIDE, Some(&settings), None, Some(&vectors), 50);
    assert!(found.iter().any(|hint| hint.name == FOUND), "{found:?}");
    assert_eq!(feature("docker_tool_00", f::TOOL_DENSE2), 0.0);
    assert_eq!(feature("docker_tool_01", f::TOOL_DENSE2), 0.0);
    assert!((feature("docker_tool_01", f::TOOL_DENSE) - 1.0).abs() < 1e-5);

    // No joined model: the first encoder's features alone, as its own stage.
    let joined = route_outside(&router, Some(&vectors));
    let mut alone = self::router();
    alone.set_weights(router.weights().clone());
    alone.set_dense(Some(DenseIndex::new("a+b", first_only)));
    let first_pieces: Vec<Vec<f32>> = message.iter().map(|m| m[..2].to_vec()).collect();
    let first = route_outside(&alone, Some(&MessageVectors::new("a+b", first_pieces)));
    assert_eq!(joined, first);
    let found_score = |selection: &Selection| {
        selection
            .tools
            .iter()
            .find(|t| t.name.as_ref() == FOUND)
            .map_or(0.0, |t| t.score)
    };

    // A joined model that weighs the second encoder sends what it finds.
    let mut weights = router.weights().clone();
    let mut model = weights.dense.clone();
    model.weights.insert("tool_dense2_rel".to_owned(), 12.0);
    weights.joined = Some(model);
    router.set_weights(weights);
    let joined = route_outside(&router, Some(&vectors));
    assert!(
        found_score(&joined) > found_score(&first) + 0.5,
        "{}",
        joined.summary_line()
    );
    let found = joined.tools.iter().find(|t| t.name.as_ref() == FOUND);
    assert!(
        found.is_some_and(|t| t.why.iter().any(|(name, _)| name == "tool_dense2_rel")),
        "{found:?}"
    );

    // A split that leaves a part empty is refused: lexical, and the notes say why.
    router.set_dense(Some(DenseIndex::joined("a+b", rows, 4)));
    let refused = route_outside(&router, Some(&vectors));
    assert!(
        refused
            .notes
            .iter()
            .any(|n| n.contains("joined encoder's first part")),
        "{:?}",
        refused.notes
    );
}

/// The domain is sent, and its reason names a dense feature (`tool_dense_rel 1.00`).
fn sent_on_dense(selection: &Selection, domain: &str) -> bool {
    selection
        .domain(domain)
        .is_some_and(|d| d.included && d.reason.contains("_dense"))
}

#[test]
fn dense_stage_adds_paraphrase_matches_and_fails_soft() {
    let mut router = router();
    let vectors = weather_rows(&router, [0.0, 1.0]);
    router.set_dense(Some(DenseIndex::new("test", vectors)));
    let selection = route(&router, "what's it like outside", &SessionView::new(1));
    assert!(
        selection.contains("get_current_weather"),
        "{}",
        selection.summary_line()
    );
    assert!(
        sent_on_dense(&selection, "weather"),
        "{}",
        selection.summary_line()
    );

    router.set_dense(Some(DenseIndex::new("broken", vec![vec![1.0]; 1])));
    let selection = route(&router, "weather", &SessionView::new(1));
    assert!(selection.contains("get_current_weather"));
    assert!(
        selection.notes.iter().any(|n| n.contains("lexical only")),
        "{:?}",
        selection.notes
    );
}

/// A fallback encoder's tool vectors serve the messages whose vectors are its own
/// (the server's choice when the main encoder is busy): dense, and the notes say so;
/// vectors of neither encoder still route lexically.
#[test]
fn a_fallback_encoders_vectors_route_densely_with_its_own_tool_vectors() {
    let mut router = router();
    // The main encoder's space puts the weather elsewhere: only the fallback's
    // vectors can find it.
    router.set_dense(Some(DenseIndex::new(
        "main",
        weather_rows(&router, [1.0, 0.0]),
    )));
    router
        .attach_dense_fallback(DenseIndex::new("table", weather_rows(&router, [0.0, 1.0])))
        .expect("attached once");
    assert!(
        router
            .attach_dense_fallback(DenseIndex::new("again", Vec::new()))
            .is_err()
    );
    let pieces = outside_pieces();
    let fallback = route_outside(
        &router,
        Some(&MessageVectors::new("table", pieces.clone()).as_fallback("encoder busy")),
    );
    assert!(sent_on_dense(&fallback, "weather"));
    assert!(
        fallback
            .notes
            .iter()
            .any(|n| n.contains("fallback encoder table: encoder busy")),
        "{:?}",
        fallback.notes
    );
    let neither = route_outside(&router, Some(&MessageVectors::new("other", pieces)));
    assert!(
        neither.notes.iter().any(|n| n.contains("lexical only")),
        "{:?}",
        neither.notes
    );
    assert!(!sent_on_dense(&neither, "weather"));
}

/// The router never runs an encoder: the dense stage scores the vectors the caller
/// computed, the same vectors give the same selection, and without them (skipped,
/// of another model, or not given) it routes lexically and says why.
#[test]
fn the_dense_stage_scores_the_callers_vectors_and_runs_no_encoder() {
    let mut router = router();
    router.set_dense(Some(DenseIndex::new(
        "test",
        weather_rows(&router, [0.0, 1.0]),
    )));
    let message = OUTSIDE;
    let select = |vectors: Option<&MessageVectors>| route_outside(&router, vectors);
    let pieces = outside_pieces();
    let vectors = MessageVectors::new("test", pieces.clone());
    let dense = select(Some(&vectors));
    assert!(sent_on_dense(&dense, "weather"));
    assert!(dense.notes.is_empty(), "{:?}", dense.notes);
    assert_eq!(dense, select(Some(&vectors.clone())));

    let busy = select(Some(&MessageVectors::skipped("encoder busy")));
    assert!(
        busy.notes
            .iter()
            .any(|n| n.contains("dense skipped: encoder busy")),
        "{:?}",
        busy.notes
    );
    assert!(!sent_on_dense(&busy, "weather"));
    let other_model = select(Some(&MessageVectors::new("other", pieces)));
    assert!(
        other_model.notes.iter().any(|n| n.contains("lexical only")),
        "{:?}",
        other_model.notes
    );
    let none = select(None);
    assert!(
        none.notes.iter().any(|n| n.contains("no message vectors")),
        "{:?}",
        none.notes
    );
    // `search_tools` takes the same vectors.
    let hints = router.search(message, None, None, Some(&vectors), 3);
    assert_eq!(
        hints.first().map(|h| h.name.as_str()),
        Some("get_current_weather")
    );
}

/// ARCHITECTURE's invariant, checked on the crate itself: the router depends on no
/// encoder, runtime, network or storage crate, and its code opens no file, socket,
/// process or thread and calls no encoder.
#[test]
fn the_router_crate_does_no_io_and_runs_no_encoder() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let dependencies = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [dependencies] table");
    let allowed = [
        "loadout.workspace",
        "aho-corasick.workspace",
        "serde.workspace",
        "serde_json.workspace",
        "thiserror.workspace",
        "tiktoken-rs.workspace",
        // SIMD dispatched at run time for the learned stage's dot products: compute only.
        "pulp.workspace",
    ];
    for line in dependencies.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        assert!(
            allowed.iter().any(|a| line.starts_with(a)),
            "the router gained a dependency: {line}"
        );
    }
    let forbidden = [
        "std::fs",
        "std::net",
        "std::process",
        "std::thread",
        "Embedder",
        ".embed(",
    ];
    let sources = std::fs::read_dir(root.join("src")).expect("src");
    for entry in sources.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // The tests read files (this one does); the code they test must not.
        if !name.ends_with(".rs") || name.starts_with("tests") || name == "proptests.rs" {
            continue;
        }
        let code = std::fs::read_to_string(entry.path()).expect("source");
        // Only the code before a file's own test module counts.
        let code = code.split("#[cfg(test)]").next().unwrap_or("");
        for word in forbidden {
            assert!(!code.contains(word), "router/src/{name} uses {word}");
        }
    }
}

#[test]
fn dense_stage_pending_is_noted_and_lexical_only() {
    let router = router();
    router.set_dense_pending(true);
    let selection = route(&router, "weather in busan", &SessionView::new(1));
    assert!(selection.contains("get_current_weather"));
    assert!(
        selection.notes.iter().any(|n| n.contains("not ready")),
        "{:?}",
        selection.notes
    );
    router.set_dense_pending(false);
    let selection = route(&router, "weather in busan", &SessionView::new(1));
    assert!(selection.notes.is_empty(), "{:?}", selection.notes);
}

#[test]
fn chit_chat_exposes_core_only() {
    let router = router();
    // "now" is a core keyword: core is sent with chit-chat anyway.
    for message in [
        "thanks, that's all",
        "haha nice",
        "고마워",
        "hey!",
        "thanks, that's all for now",
        // "morning" is a weather keyword here, but the message asks for nothing.
        "good morning! how's it going",
    ] {
        let selection = route(&router, message, &SessionView::new(1));
        assert!(
            selection.tools.iter().all(|t| t.domain == "core"),
            "{message}: {}",
            selection.summary_line()
        );
        assert_eq!(
            stage_of(&selection, "weather"),
            Stage::NoToolNeeded,
            "{message}"
        );
    }
    // Thanks plus a request is routed as a request.
    let selection = route(
        &router,
        "thanks, now turn on the lamp",
        &SessionView::new(1),
    );
    assert!(
        selection.contains("ha_turn_on"),
        "{}",
        selection.summary_line()
    );
    // A message the router cannot place is no chit-chat: nothing points at a domain,
    // and its decision says so.
    let selection = route(&router, "do the thing", &SessionView::new(1));
    assert_eq!(stage_of(&selection, "weather"), Stage::NotMatched);
}

#[test]
fn multi_request_message_routes_to_each_request() {
    let router = router();
    let selection = route(
        &router,
        "check the forecast in Busan and then store a fact about my dentist for later",
        &SessionView::new(1),
    );
    for tool in ["get_weather_forecast", "remember"] {
        assert!(
            selection.contains(tool),
            "{tool}: {}",
            selection.summary_line()
        );
    }
}

#[test]
fn follow_ups_with_only_similarity_evidence_keep_last_turns_tools() {
    let router = router();
    let mut view = SessionView::new(1);
    let first = route(&router, "restart the redis container", &view);
    view.record_calls::<&str>(&router, &[]);
    view.begin_turn(2, Some(&first));
    // "daily" only resembles the weather forecast's description: weak evidence that
    // must not push out what the confirmation is about.
    let second = route(&router, "yes, the daily one", &view);
    assert!(second.contains("restart_container"));
    assert_eq!(stage_of(&second, "docker"), Stage::Carried);
}

fn id_tool(name: &str, description: &str, required: &[&str]) -> serde_json::Value {
    let properties: serde_json::Map<String, serde_json::Value> = required
        .iter()
        .map(|r| (r.to_string(), json!({"type": "string"})))
        .collect();
    json!({"name": name, "description": description,
           "input_schema": {"type": "object", "properties": properties, "required": required}})
}

fn media_router(config: RouterConfig) -> Router {
    let media = json!({"domain": "media", "description": "TV series and movies in the library.",
    "keywords": ["series", "movie"],
    "tools": [
        id_tool("media_list_series", "Every series in the library with its id.", &[]),
        id_tool("media_lookup_series", "Look a series up in the online catalogue.", &["term"]),
        id_tool("media_delete_series", "Delete a series from the library.", &["series_id"]),
        id_tool("media_get_series_status", "Download status of a series.", &["series_id"]),
        id_tool("media_set_monitored", "Monitor or unmonitor items.", &["ids"]),
        json!({"name": "media_set_quality", "description": "Apply a quality profile in bulk.",
               "input_schema": {"type": "object", "required": ["ids"], "properties": {
                   "ids": {"type": "array", "items": {"type": "integer"},
                           "description": "Series ids or movie ids."}}}}),
        id_tool("media_list_movies", "Every movie in the library with its id.", &[]),
        id_tool("media_search_movies", "Search movies in the library by title.", &["query"]),
        id_tool("media_play_movie", "Play a movie on a screen.", &["movie_id", "screen_id"]),
        json!({"name": "media_rate", "description": "Rate a title.",
               "input_schema": {"type": "object", "required": ["title"], "properties": {
                   "title": {"type": "string", "description": "A title as media_search_movies prints it."},
                   "note": {"type": "string", "description": "Optional; see media_list_series."}}}}),
    ]});
    Router::new(registry_of(&[media]), config)
}

/// The names of the tools that find what tool `name` takes.
fn finders_of(router: &Router, name: &str) -> Vec<String> {
    let t = router
        .registry()
        .tool_idx(name)
        .unwrap_or_else(|| panic!("no tool {name}"));
    router.prerequisites[t]
        .iter()
        .map(|&p| router.names.tools[p].to_string())
        .collect()
}

#[test]
fn prerequisites_are_the_finders_of_required_ids() {
    let router = media_router(RouterConfig::default());
    let finders = |name: &str| finders_of(&router, name);
    // A listing beats a lookup; a tool that needs the id itself finds nothing.
    assert_eq!(finders("media_delete_series"), ["media_list_series"]);
    assert_eq!(finders("media_get_series_status"), ["media_list_series"]);
    // One finder per id argument; an id nothing finds (`screen_id`) is skipped.
    assert_eq!(finders("media_play_movie"), ["media_list_movies"]);
    // A required argument's description names its finder; an optional one's does not.
    assert_eq!(finders("media_rate"), ["media_search_movies"]);
    // A bare `ids` names the nouns its description puts before "ids", and nothing
    // without one.
    assert_eq!(
        finders("media_set_quality"),
        ["media_list_series", "media_list_movies"]
    );
    assert!(finders("media_set_monitored").is_empty());
    assert!(finders("media_list_series").is_empty());
}

#[test]
fn names_with_hyphens_and_camel_case_ids_read_as_snake_case_ones() {
    // An upstream MCP server's names: hyphens between words, camelCase arguments.
    let tracker = json!({"domain": "tracker", "description": "Issues of a project.",
    "tools": [
        id_tool("list-issues", "Every open issue with its id.", &[]),
        id_tool("close-issue", "Close an issue.", &["issueId"]),
        id_tool("tracker-status", "Whether the tracker is up.", &[]),
        id_tool("close-all", "Close every issue.", &[]),
    ]});
    let router = Router::new(registry_of(&[tracker]), RouterConfig::default());
    assert_eq!(finders_of(&router, "close-issue"), ["list-issues"]);
    let prior = |name: &str| router.tool_prior[router.registry().tool_idx(name).expect(name)];
    assert!(prior("list-issues") > 0.0);
    assert!(prior("tracker-status") > 0.0);
    assert_eq!(prior("close-issue"), 0.0);
    assert_eq!(prior("close-all"), 0.0);
}

/// Mail and an address book in two domains, and a calendar that invites.
fn mail_router() -> Router {
    let with = |name: &str, description: &str, properties: serde_json::Value| {
        json!({"name": name, "description": description,
               "input_schema": {"type": "object", "properties": properties}})
    };
    let recipients = json!({"type": "array", "items": {"type": "string"}, "description": "Recipient addresses."});
    let toolkits = [
        json!({"domain": "mail", "description": "Email.", "keywords": ["email", "forward", "draft"],
               "tools": [with("forward_email", "Forward an email.", json!({"message_id": {"type": "string"}, "to": recipients})),
                         with("create_draft", "Save a draft.", json!({"body": {"type": "string"}, "to": recipients})),
                         with("search_email", "Search the mailbox by sender or recipient.",
                              json!({"to": {"type": "string", "description": "Recipient address or name."}})),
                         with("list_folders", "List mail folders.", json!({}))]}),
        json!({"domain": "people", "description": "Address book.", "keywords": ["contact"],
               "tools": [with("list_contacts", "List every contact.", json!({})),
                         with("search_contacts", "Search contacts by name; returns their email.",
                              json!({"query": {"type": "string"}}))]}),
        json!({"domain": "agenda", "description": "Calendar.", "keywords": ["meeting"],
               "tools": [with("create_event", "Create an event.",
                              json!({"title": {"type": "string"},
                                     "guests": {"type": "array", "description": "Email addresses to invite."}}))]}),
    ];
    Router::new(registry_of(&toolkits), RouterConfig::default())
}

#[test]
fn recipients_are_found_in_the_address_book() {
    let router = mail_router();
    let finders = |name: &str| finders_of(&router, name);
    // Sending and creating tools take people; a search beats a listing.
    assert_eq!(finders("forward_email"), ["search_contacts"]);
    assert_eq!(finders("create_draft"), ["search_contacts"]);
    assert_eq!(finders("create_event"), ["search_contacts"]);
    // A search by recipient does not need the address; nor does a tool without one.
    assert!(finders("search_email").is_empty());
    assert!(finders("list_folders").is_empty());

    // "to my accountant" names a person: the address book goes along.
    let settings = BTreeMap::new();
    let session = SessionView::new(1);
    let input = RouteInput::new(
        "forward the invoice email to my accountant",
        &settings,
        &session,
    );
    let selection = router.select(&input);
    assert!(selection.contains("forward_email"));
    assert!(selection.contains("search_contacts"));
    let companion = |tool| feature_of(&router, &input, tool, crate::scorer::f::COMPANION);
    assert_eq!(companion("search_contacts"), 1.0);
    assert_eq!(companion("forward_email"), 0.0);
}

#[test]
fn a_tool_is_sent_with_the_tool_that_finds_its_ids() {
    let router = media_router(RouterConfig::default());
    let settings = BTreeMap::new();
    let session = SessionView::new(1);
    let input = RouteInput::new(
        "delete the walking dead series, keep the files",
        &settings,
        &session,
    );
    let selection = router.select(&input);
    assert!(selection.contains("media_delete_series"));
    assert!(selection.contains("media_list_series"));
    assert_eq!(
        feature_of(
            &router,
            &input,
            "media_list_series",
            crate::scorer::f::COMPANION
        ),
        1.0
    );
    assert!(
        selection
            .hints
            .iter()
            .all(|h| h.name != "media_list_series")
    );
}

#[test]
fn after_a_finder_is_called_its_next_steps_are_sent_for_a_turn() {
    let router = media_router(RouterConfig::default());
    let settings = BTreeMap::new();
    fn input<'a>(
        view: &'a SessionView,
        settings: &'a BTreeMap<String, String>,
        message: &'a str,
    ) -> RouteInput<'a> {
        RouteInput::new(message, settings, view)
    }
    let mut view = SessionView::new(1);
    let first = router.select(&input(&view, &settings, "which series do I have?"));
    assert!(first.contains("media_list_series"));
    view.record_calls(&router, &["media_list_series"]);
    // Within the same turn (the chat loop routes again after the call) and the next,
    // the tools that take what it found are next steps, and are sent.
    let next_steps = |view: &SessionView, message: &str| {
        let input = input(view, &settings, message);
        let selection = router.select(&input);
        ["media_delete_series", "media_get_series_status"].map(|name| {
            let next = feature_of(&router, &input, name, crate::scorer::f::NEXT_STEP);
            (next, selection.contains(name))
        })
    };
    assert_eq!(
        next_steps(&view, "which series do I have?"),
        [(1.0, true), (1.0, true)]
    );
    view.begin_turn(2, Some(&first));
    assert_eq!(
        next_steps(&view, "the walking dead, the first one"),
        [(1.0, true), (1.0, true)]
    );
    // Two turns on, the call is forgotten.
    let second = router.select(&input(&view, &settings, "the walking dead, the first one"));
    view.begin_turn(3, Some(&second));
    let third = next_steps(&view, "the walking dead, the first one");
    assert_eq!(third.map(|(next, _)| next), [0.0, 0.0]);
    assert_eq!(
        router.next_steps("media_list_series").collect::<Vec<_>>(),
        [
            "media_delete_series",
            "media_get_series_status",
            "media_set_quality"
        ]
    );
}

#[test]
fn required_ids_no_tool_finds_are_named() {
    let router = media_router(RouterConfig::default());
    assert_eq!(
        router.unfound_ids(),
        [("media_play_movie".to_owned(), "screen_id".to_owned())]
    );
}

#[test]
fn a_config_out_of_range_names_each_bad_field() {
    assert!(RouterConfig::default().problems().is_empty());
    let config = RouterConfig {
        bm25_min_score: 1.5,
        dense_floor: 0.6,
        dense_ceiling: 0.4,
        rrf_k: f32::NAN,
        idle_turns: -1,
        ..RouterConfig::default()
    };
    let problems = config.problems().join("\n");
    for field in [
        "`bm25_min_score` is 1.5",
        "`dense_ceiling` (0.4) must be above `dense_floor` (0.6)",
        "`rrf_k` is NaN",
        "`idle_turns` is -1",
    ] {
        assert!(problems.contains(field), "{field} not in:\n{problems}");
    }
    assert_eq!(config.problems().len(), 4, "{problems}");
}

/// SplitMix64: a seeded generator for the randomized test below (no dependency, and
/// a failing seed replays exactly).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
    fn piece(&mut self) -> &'static str {
        PIECES[self.below(PIECES.len())]
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Embeds any text as a direction derived from its bytes (model `hash`): arbitrary
/// cosines, the same for the same text.
fn hash_vector(text: &str) -> Vec<f32> {
    let mut rng = Rng(text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }));
    let v: Vec<f32> = (0..8).map(|_| rng.unit() - 0.5).collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
    v.into_iter().map(|x| x / norm).collect()
}

/// Words, scripts and shapes a message may have: catalog words, request splitters,
/// Korean, characters whose lowercase is longer than they are (`İ`), combining marks,
/// emoji, right-to-left text, control characters, long runs.
const PIECES: &[&str] = &[
    "weather",
    "forecast",
    "light",
    "lights",
    "highlight",
    "table",
    "sql",
    "remember",
    "recall",
    "news",
    "headlines",
    "docker",
    "container",
    "restart",
    "the",
    "and",
    "and then",
    "also",
    ";",
    ".",
    "!",
    "?",
    "\n",
    "\r\n",
    ",",
    "날씨",
    "그리고",
    "하고",
    "고마워",
    "부산",
    "thanks",
    "hi",
    "ok",
    "İ",
    "İstanbul",
    "ß",
    "STRASSE",
    "e\u{301}",
    "🙂",
    "👩‍💻",
    "مرحبا",
    "天气",
    "\u{200b}",
    "\u{0}",
    "\t",
    "  ",
    "1,000",
    "-",
    "'",
    "\"",
    "`rm -rf /`",
    "%s",
    "{}",
    "[",
    "outside",
    "umbrella",
    "lamp",
    "morning",
    "now",
    "settings",
];

fn random_message(rng: &mut Rng) -> String {
    let n = match rng.below(20) {
        0 => 0,
        1 => 2000,
        _ => 1 + rng.below(25),
    };
    let mut message = String::new();
    for _ in 0..n {
        message.push_str(rng.piece());
        if rng.chance(70) {
            message.push(' ');
        }
    }
    message
}

/// Any valid config, as a `[router]` table may set it.
fn random_config(rng: &mut Rng) -> RouterConfig {
    let defaults = RouterConfig::default();
    let floor = rng.unit() * 0.5 - 0.2;
    let config = RouterConfig {
        idle_turns: rng.below(8) as i64,
        token_budget: *rng.pick(&[0, 300, 1000, 4000, 100_000]),
        bm25_min_score: rng.unit() * 0.5,
        bm25_relative: rng.unit(),
        carry_over: rng.chance(50),
        max_hints: rng.below(50),
        dense_min_score: rng.unit() - 0.2,
        dense_margin: rng.unit() * 0.3,
        dense_floor: floor,
        dense_ceiling: (floor + 0.05 + rng.unit() * 0.8).min(1.0),
        rrf_k: rng.unit() * 60.0,
        no_tool_for_chitchat: rng.chance(50),
        ..defaults
    };
    assert!(config.problems().is_empty(), "{:?}", config.problems());
    config
}

/// What every selection promises, whatever the message, session and config.
fn check_selection(
    router: &Router,
    settings: &BTreeMap<String, String>,
    session: &SessionView,
    budget: usize,
    selection: &Selection,
) {
    let registry = router.registry();
    assert_eq!(selection.n_tools, selection.tools.len());
    assert_eq!(
        selection.tokens,
        selection.tools.iter().map(|t| t.tokens).sum::<usize>()
    );
    assert_eq!(selection.domains.len(), registry.domains().len());
    assert!(selection.hints.len() <= router.config().max_hints);
    let mut names = std::collections::HashSet::new();
    for tool in &selection.tools {
        assert!(
            names.insert(tool.name.to_string()),
            "{} sent twice",
            tool.name
        );
        let domain = selection
            .domain(&tool.domain)
            .expect("decision for the domain");
        assert!(
            domain.included,
            "{} sent, but {} is not included",
            tool.name, tool.domain
        );
        assert!(
            registry.missing_settings(&tool.domain, settings).is_empty(),
            "{} sent from an inactive domain",
            tool.name
        );
    }
    for hint in &selection.hints {
        assert!(
            !names.contains(hint.name.as_ref()),
            "{} sent and hinted",
            hint.name
        );
    }
    for domain in registry.domains() {
        if router.is_core_domain(&domain.name) {
            for tool in registry
                .all_tools()
                .iter()
                .filter(|t| t.domain == domain.name)
            {
                assert!(
                    selection.contains(&tool.name),
                    "core tool {} left out",
                    tool.name
                );
            }
        }
    }
    if selection.tokens > budget && !session.load_all_this_turn {
        for tool in &selection.tools {
            assert!(
                matches!(
                    tool.stage,
                    Stage::AlwaysOn | Stage::Sticky | Stage::Pinned | Stage::Loaded
                ),
                "over the budget of {budget} ({} tokens) with {} sent by {:?}",
                selection.tokens,
                tool.name,
                tool.stage
            );
        }
    }
}

/// Random messages, sessions and valid configs: no panic, and every selection keeps
/// the promises of [`check_selection`] and is the same when asked twice.
#[test]
fn random_messages_sessions_and_configs_keep_the_selection_promises() {
    let registry = registry();
    let tool_names: Vec<String> = registry
        .all_tools()
        .iter()
        .map(|t| t.name.clone())
        .chain([
            "no_such_tool".to_owned(),
            "weather".to_owned(),
            "core".to_owned(),
            "docker".to_owned(),
        ])
        .collect();
    for seed in 0..120u64 {
        let mut rng = Rng(seed);
        let config = if seed == 0 {
            RouterConfig::default()
        } else {
            random_config(&mut rng)
        };
        let mut router = Router::new(registry.clone(), config);
        if rng.chance(50) {
            let rows = router
                .dense_texts()
                .iter()
                .map(|t| hash_vector(t))
                .collect();
            router.set_dense(Some(DenseIndex::new("hash", rows)));
        }
        for _conversation in 0..5 {
            let mut session = SessionView::new(1);
            let mut previous: Option<Selection> = None;
            for turn in 1..=6i64 {
                session.begin_turn(turn, previous.as_ref());
                let settings = if rng.chance(70) {
                    all_settings()
                } else {
                    BTreeMap::new()
                };
                let names: Vec<&str> = (0..rng.below(3))
                    .map(|_| rng.pick(&tool_names).as_str())
                    .collect();
                match rng.below(6) {
                    0 => {
                        let _ = session.load(&router, &names);
                    }
                    1 => {
                        let _ = session.unload(&router, &names);
                    }
                    2 => session.load_all_for_this_turn(),
                    _ => {}
                }
                let message = random_message(&mut rng);
                let budget = rng.chance(30).then(|| rng.below(5000));
                let vectors = vectors_for(&router, &message);
                let input = RouteInput {
                    token_budget: budget,
                    vectors: vectors.as_ref(),
                    ..RouteInput::new(&message, &settings, &session)
                };
                let selection = router.select(&input);
                check_selection(
                    &router,
                    &settings,
                    &session,
                    budget.unwrap_or(router.config().token_budget),
                    &selection,
                );
                assert_eq!(
                    selection,
                    router.select(&input),
                    "seed {seed}: not deterministic for {message:?}"
                );
                let called: Vec<&str> = (0..rng.below(3))
                    .map(|_| rng.pick(&tool_names).as_str())
                    .collect();
                session.record_calls(&router, &called);
                previous = Some(selection);
            }
        }
    }
}

/// A random JSON value: every type, odd strings, deep nesting.
fn random_json(rng: &mut Rng, depth: usize) -> serde_json::Value {
    match rng.below(if depth > 3 { 6 } else { 9 }) {
        0 => serde_json::Value::Null,
        1 => json!(rng.chance(50)),
        2 => json!(rng.next() as i64),
        3 => json!(f64::from(rng.unit()) * 1e300),
        4 => json!(rng.piece()),
        5 => json!("x".repeat(rng.below(3) * 5000)),
        6 => json!([random_json(rng, depth + 1), random_json(rng, depth + 1)]),
        7 => {
            json!({"type": random_json(rng, depth + 1), "properties": random_json(rng, depth + 1)})
        }
        _ => {
            let mut object = serde_json::Map::new();
            for _ in 0..rng.below(4) {
                object.insert(rng.piece().to_owned(), random_json(rng, depth + 1));
            }
            serde_json::Value::Object(object)
        }
    }
}

/// Replaces, removes or adds one value somewhere in `value`.
fn mutate(rng: &mut Rng, value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) if !map.is_empty() && rng.chance(75) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = rng.pick(&keys).clone();
            match rng.below(4) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    map.insert(key, random_json(rng, 0));
                }
                _ => {
                    if let Some(inner) = map.get_mut(&key) {
                        mutate(rng, inner);
                    }
                }
            }
        }
        serde_json::Value::Array(items) if !items.is_empty() && rng.chance(75) => {
            let i = rng.below(items.len());
            if rng.chance(20) {
                let copy = items[i].clone();
                items.push(copy);
            } else {
                mutate(rng, &mut items[i]);
            }
        }
        _ => *value = random_json(rng, 0),
    }
}

/// Toolkit files spoilt at random (a value replaced, removed, duplicated, at any
/// depth, schemas included): parsing and building answer a clear error or a registry
/// whose router routes and whose tools export; nothing panics.
#[test]
fn spoilt_toolkit_files_are_refused_or_route_never_panic() {
    let mut rng = Rng(7);
    let (mut built, mut refused) = (0, 0);
    for round in 0..400 {
        let mut files = catalog();
        let i = rng.below(files.len());
        mutate(&mut rng, &mut files[i]);
        let mut builder = Registry::builder();
        let mut parse_error = None;
        for (i, file) in files.iter().enumerate() {
            match toolkit::parse(&file.to_string(), &format!("f{i}.json")) {
                Ok(toolkit) => builder = builder.toolkit(toolkit),
                Err(e) => parse_error = Some(e.to_string()),
            }
        }
        if let Some(message) = parse_error {
            assert!(message.contains(".json"), "round {round}: {message}");
            refused += 1;
            continue;
        }
        let registry = match builder.build() {
            Ok(registry) => Arc::new(registry),
            Err(e) => {
                assert!(!e.to_string().is_empty());
                refused += 1;
                continue;
            }
        };
        built += 1;
        let router = Router::new(registry.clone(), RouterConfig::default());
        for message in [
            "weather and then restart the container",
            "",
            "lights 날씨 🙂",
        ] {
            let selection = route(&router, message, &SessionView::new(1));
            check_selection(
                &router,
                &all_settings(),
                &SessionView::new(1),
                4000,
                &selection,
            );
        }
        for tool in registry.all_tools() {
            let _ = loadout::export::mcp(tool);
            let _ = loadout::export::openai(tool);
        }
    }
    // Both outcomes came up: the mutations are neither all fatal nor all harmless.
    assert!(
        built > 40 && refused > 40,
        "built {built}, refused {refused}"
    );
}

fn learned(router: &Router, entries: &[(&str, &[&str])]) -> LearnedIndex {
    let entries: Vec<LearnedEntry> = entries
        .iter()
        .map(|(message, tools)| LearnedEntry {
            message: (*message).to_owned(),
            tools: tools.iter().map(|t| (*t).to_owned()).collect(),
            vector: None,
            session: None,
        })
        .collect();
    LearnedIndex::new(router, None, &entries)
}

/// The lexical matches keep their scores in a buffer of the thread's: what one piece
/// scored is gone before the next, on the same thread as on a fresh one.
#[test]
fn a_pieces_learned_matches_do_not_carry_into_the_next() {
    let router = router();
    let index = learned(
        &router,
        &[
            (
                "what is going on in the world of football",
                &["search_news"],
            ),
            ("turn on the light in the hall", &["ha_turn_on"]),
            ("the light in the kitchen, turn it off", &["ha_turn_off"]),
        ],
    );
    let matches = |piece: &str| index.lexical_matches(piece, 0.0, 10);
    let fresh = std::thread::scope(|s| {
        s.spawn(|| matches("turn off the kitchen light"))
            .join()
            .unwrap_or_default()
    });
    assert!(!fresh.is_empty());
    assert_eq!(
        matches("football in the world"),
        matches("football in the world")
    );
    assert_eq!(matches("turn off the kitchen light"), fresh);
}

fn route_learned(router: &Router, message: &str, index: Option<&LearnedIndex>) -> Selection {
    router.select(&RouteInput {
        learned: index,
        ..RouteInput::new(message, &all_settings(), &SessionView::new(1))
    })
}

#[test]
fn past_messages_like_this_one_select_the_domain_their_turns_called() {
    let router = router();
    // Nothing in the message points at the news domain: its words are the user's own
    // (and a keyword of another domain keeps the fallback from sending everything).
    let message = "weather aside, what is going on in the world of football";
    let without = route_learned(&router, message, None);
    assert!(
        !without.contains("search_news"),
        "{}",
        without.summary_line()
    );
    let index = learned(
        &router,
        &[
            (
                "what is going on in the world of football today",
                &["search_news"],
            ),
            ("what is going on in the world of tennis", &["search_news"]),
            (
                "going on in the world of football, anything new",
                &["search_news"],
            ),
            ("turn on the light in the hall", &["ha_turn_on"]),
        ],
    );
    assert_eq!(index.len(), 4);
    let with = route_learned(&router, message, Some(&index));
    let news = with.domain("news").expect("news decided");
    assert!(
        news.included && news.reason.contains("learned"),
        "{}",
        news.reason
    );
    assert!(with.contains("search_news"));
    // One unrelated past message is no evidence: the light turns nothing on.
    assert!(!with.contains("ha_turn_on"), "{}", with.summary_line());
}

#[test]
fn a_tool_no_past_message_names_keeps_the_evidence_it_had() {
    let router = router();
    let index = learned(
        &router,
        &[
            ("put the kettle song on the news", &["search_news"]),
            ("headlines about the weather in the news", &["search_news"]),
        ],
    );
    for message in [
        "weather forecast for tomorrow",
        "turn off the lamp and remember my door code",
        "hello there",
        "restart the container called web",
    ] {
        let without = route_learned(&router, message, None);
        let with = route_learned(&router, message, Some(&index));
        for decision in &without.domains {
            if decision.domain == "news" {
                continue;
            }
            let other = with.domain(&decision.domain).expect("same domains");
            assert_eq!(
                (other.stage, other.score, other.included),
                (decision.stage, decision.score, decision.included),
                "{message}: {}",
                decision.domain
            );
        }
        for tool in without.tools.iter().filter(|t| t.domain != "news") {
            let same = with.tools.iter().find(|t| t.name == tool.name);
            assert_eq!(
                same.map(|t| t.score),
                Some(tool.score),
                "{message}: {}",
                tool.name
            );
        }
    }
}

#[test]
fn a_learned_index_leaves_out_unknown_tools_and_empty_entries() {
    let router = router();
    let index = learned(
        &router,
        &[
            ("find the news", &["search_news", "no_such_tool"]),
            ("only unknown", &["no_such_tool"]),
            ("   ", &["search_news"]),
        ],
    );
    assert_eq!(index.len(), 1);
    assert_eq!(index.n_vectors(), 0);
    let t = router.registry().tool_idx("search_news").expect("tool");
    assert_eq!(index.tool_entries(t), 1);
}

/// The shared eval catalog beside the repository (`../shared/eval/catalog`); CI has
/// it, a checkout alone may not.
fn shared_catalog_router() -> Option<Router> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/eval/catalog");
    if !dir.is_dir() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs beside ../shared/eval/catalog"
        );
        eprintln!("skipped: no {}", dir.display());
        return None;
    }
    let toolkits = toolkit::load_dir(&dir).unwrap_or_else(|e| panic!("shared catalog: {e}"));
    let mut builder = Registry::builder();
    for toolkit in toolkits {
        builder = builder.toolkit(toolkit);
    }
    let registry = builder
        .build()
        .unwrap_or_else(|e| panic!("shared registry: {e}"));
    Some(Router::new(Arc::new(registry), RouterConfig::default()))
}

/// Routes with every settings key of the router's registry set.
fn route_configured(router: &Router, message: &str, session: &SessionView) -> Selection {
    let settings = crate::replay::every_setting(router.registry());
    router.select(&RouteInput::new(message, &settings, session))
}

/// `tool`'s `feature` for `message`, with every settings key of the router's
/// registry set and `learned` as the learned memory.
fn learned_feature(
    router: &Router,
    learned: &LearnedIndex,
    session: &SessionView,
    message: &str,
    tool: &str,
    feature: usize,
) -> f32 {
    let settings = crate::replay::every_setting(router.registry());
    let input = RouteInput {
        learned: Some(learned),
        ..RouteInput::new(message, &settings, session)
    };
    feature_of(router, &input, tool, feature)
}

/// Everyday requests never send a destructive tool.
fn sends_no_destructive_tool_for_everyday_asks(router: &Router, view: &SessionView) {
    for message in [
        "remind me to call mom at 6",
        "what's on my calendar next week",
        "how much disk space is left",
    ] {
        let selection = route_configured(router, message, view);
        assert_eq!(
            sent_destructive(router, &selection),
            Vec::<String>::new(),
            "{message}: {}",
            selection.summary_line()
        );
    }
}

fn sent_destructive(router: &Router, selection: &Selection) -> Vec<String> {
    let registry = router.registry();
    selection
        .tools
        .iter()
        .filter(|t| {
            registry
                .tool(&t.name)
                .is_some_and(|tool| tool.annotations.destructive == Some(true))
        })
        .map(|t| t.name.to_string())
        .collect()
}

#[test]
fn destructive_tools_go_out_only_on_direct_evidence() {
    let Some(router) = shared_catalog_router() else {
        return;
    };
    let view = SessionView::new(1);
    sends_no_destructive_tool_for_everyday_asks(&router, &view);
    let reboot = route_configured(&router, "reboot the server now", &view);
    assert!(
        reboot.contains("reboot_server"),
        "{}",
        reboot.summary_line()
    );
    let held = route_configured(&router, "remind me to call mom at 6", &view);
    assert!(
        held.tool_decisions
            .iter()
            .any(|d| d.stage == Stage::NoDirectEvidence),
        "the trace names the held-back tools"
    );
}

#[test]
fn a_confirmed_destructive_action_is_carried_to_the_yes() {
    let Some(router) = shared_catalog_router() else {
        return;
    };
    let mut view = SessionView::new(1);
    let first = route_configured(&router, "delete the 2023 backups", &view);
    assert!(first.contains("delete_backup"), "{}", first.summary_line());
    // The model asked "are you sure?" and called nothing.
    view.record_calls::<&str>(&router, &[]);
    view.begin_turn(2, Some(&first));
    let second = route_configured(&router, "yes", &view);
    assert!(
        second.contains("delete_backup"),
        "{}",
        second.summary_line()
    );
}

#[test]
fn without_the_rule_backfill_sends_destructive_tools() {
    // The rule's test above could pass because nothing sends those tools anyway:
    // without it, the same message sends some.
    let Some(guarded) = shared_catalog_router() else {
        return;
    };
    let router = Router::new(
        guarded.registry().clone(),
        RouterConfig {
            destructive_needs_evidence: false,
            ..RouterConfig::default()
        },
    );
    let view = SessionView::new(1);
    let selection = route_configured(&router, "remind me to call mom at 6", &view);
    assert!(
        !sent_destructive(&router, &selection).is_empty(),
        "{}",
        selection.summary_line()
    );
}

/// The shared catalog routed by the fitted scorer (the default).
fn shared_catalog_scorer() -> Option<Router> {
    let rules_router = shared_catalog_router()?;
    Some(Router::new(
        rules_router.registry().clone(),
        RouterConfig::default(),
    ))
}

#[test]
fn the_scorer_sends_likely_tools_with_their_probability_and_features() {
    let Some(router) = shared_catalog_scorer() else {
        return;
    };
    let view = SessionView::new(1);
    let selection = route_configured(&router, "reboot the server now", &view);
    assert!(
        selection.contains("reboot_server"),
        "{}",
        selection.summary_line()
    );
    let tool = selection
        .tools
        .iter()
        .find(|t| t.name.as_ref() == "reboot_server")
        .expect("sent");
    assert_eq!(tool.stage, Stage::Scored);
    assert!(tool.score > 0.0 && tool.score <= 1.0, "{}", tool.score);
    // The domain's reason names its likeliest tool, its probability and the
    // features that put it there, with their values.
    let decision = selection
        .domains
        .iter()
        .find(|d| d.domain.as_ref() == "system")
        .expect("system decided");
    assert!(decision.included);
    assert!(
        decision.reason.contains(" p 0.") && decision.reason.contains("tool_bm25"),
        "{}",
        decision.reason
    );
}

#[test]
fn a_remembering_index_finds_the_same_dense_matches_again() {
    let router = router();
    let tools: Vec<String> = router
        .registry
        .all_tools()
        .iter()
        .take(3)
        .map(|t| t.name.to_owned())
        .collect();
    let entries: Vec<LearnedEntry> = (0..40)
        .map(|i| LearnedEntry {
            message: format!("message {i}"),
            tools: vec![tools[i % tools.len()].clone()],
            vector: Some(
                (0..8)
                    .map(|d| ((i * 7 + d * 3) % 11) as f32 - 5.0)
                    .collect(),
            ),
            session: None,
        })
        .collect();
    let plain = LearnedIndex::new(&router, Some("m"), &entries);
    let remembering = LearnedIndex::new(&router, Some("m"), &entries).remembering();
    let queries = vec![
        (0..8).map(|d| (d % 3) as f32 - 1.0).collect::<Vec<f32>>(),
        (0..8).map(|d| d as f32).collect(),
    ];
    for keep in [3, 10, 3] {
        let expected = plain.dense_matches(&queries, 0.0, keep);
        assert!(expected.iter().all(|m| !m.is_empty()));
        assert_eq!(remembering.dense_matches(&queries, 0.0, keep), expected);
        assert_eq!(remembering.dense_matches(&queries, 0.0, keep), expected);
    }
    assert_eq!(
        remembering.dense_matches(&queries[..1], 0.0, 3),
        plain.dense_matches(&queries[..1], 0.0, 3)
    );
}

#[test]
fn what_past_sessions_called_next_is_a_feature_of_the_next_turn() {
    let Some(router) = shared_catalog_scorer() else {
        return;
    };
    // Past sessions: after the turn that asked for the forecast, the next one asked
    // for the air quality. No schema declares that step: it is learned from use.
    let entry = |message: &str, tool: &str, session: Option<&str>| LearnedEntry {
        message: message.to_owned(),
        tools: vec![tool.to_owned()],
        vector: None,
        session: session.map(str::to_owned),
    };
    let taught = |session: Option<&str>| {
        LearnedIndex::new(
            &router,
            None,
            &[
                entry(
                    "what's the forecast for busan",
                    "get_weather_forecast",
                    session.map(|_| "a"),
                ),
                entry(
                    "is it safe to run outside",
                    "get_air_quality",
                    session.map(|_| "a"),
                ),
                entry(
                    "forecast for the weekend in seoul",
                    "get_weather_forecast",
                    session.map(|_| "b"),
                ),
                entry(
                    "and the pollution?",
                    "get_air_quality",
                    session.map(|_| "b"),
                ),
            ],
        )
    };
    let mut view = SessionView::new(2);
    view.recent_calls = vec![(1, "get_weather_forecast".to_owned())];
    let next_step = |index: &LearnedIndex| {
        learned_feature(
            &router,
            index,
            &view,
            "ok thanks",
            "get_air_quality",
            crate::scorer::f::NEXT_STEP,
        )
    };
    // Both turns that asked for the forecast were followed by the air quality.
    assert_eq!(next_step(&taught(Some("session"))), 1.0);
    // Entries of no session follow nothing.
    assert_eq!(next_step(&taught(None)), 0.0);
}

#[test]
fn what_past_turns_called_together_is_a_companion() {
    let Some(router) = shared_catalog_scorer() else {
        return;
    };
    // Past turns that asked for the forecast also called the air quality. No schema
    // declares them companions: the feature a declared prerequisite earns counts it.
    let taught = |together: bool| {
        let entry = |message: &str| LearnedEntry {
            message: message.to_owned(),
            tools: if together {
                vec![
                    "get_weather_forecast".to_owned(),
                    "get_air_quality".to_owned(),
                ]
            } else {
                vec!["get_weather_forecast".to_owned()]
            },
            vector: None,
            session: None,
        };
        LearnedIndex::new(
            &router,
            None,
            &[
                entry("what's the forecast for busan"),
                entry("forecast for the weekend in seoul"),
            ],
        )
    };
    let session = SessionView::new(1);
    let companion = |index: &LearnedIndex| {
        learned_feature(
            &router,
            index,
            &session,
            "weather forecast for daegu tomorrow",
            "get_air_quality",
            crate::scorer::f::COMPANION,
        )
    };
    assert!(companion(&taught(true)) > 0.0);
    assert_eq!(companion(&taught(false)), 0.0);
}

#[test]
fn the_scorer_keeps_the_hard_rules() {
    let Some(router) = shared_catalog_scorer() else {
        return;
    };
    let view = SessionView::new(1);
    // Chit-chat: core only.
    let hello = route_configured(&router, "thanks, that's all for today", &view);
    assert!(
        hello.tools.iter().all(|t| t.stage == Stage::AlwaysOn),
        "{}",
        hello.summary_line()
    );
    // Destructive tools only on direct evidence.
    sends_no_destructive_tool_for_everyday_asks(&router, &view);
    // A tool loaded by name is sent whatever its probability.
    let mut loaded = SessionView::new(1);
    loaded.loaded_tools = vec!["delete_backup".to_owned()];
    let selection = route_configured(&router, "what's the weather", &loaded);
    assert_eq!(
        stage_of_tool(&selection, "delete_backup"),
        Some(Stage::Loaded),
        "{}",
        selection.summary_line()
    );
}

#[test]
fn search_ranks_with_the_scorer() {
    let Some(router) = shared_catalog_scorer() else {
        return;
    };
    let hits = router.search("reboot the server", None, None, None, 3);
    assert_eq!(
        hits.first().map(|h| h.name.as_ref()),
        Some("reboot_server"),
        "{hits:?}"
    );
}

/// One domain whose one tool is destructive, with the fitted scorer.
fn accounts_router() -> Router {
    let toolkit = json!({"domain": "accounts", "description": "User accounts.", "keywords": ["account"],
        "tools": [{"name": "delete_account", "description": "Delete a user account for good.",
                   "input_schema": {"type": "object", "properties": {"token": {"type": "string"}}},
                   "annotations": {"destructiveHint": true}}]});
    Router::new(registry_of(&[toolkit]), RouterConfig::default())
}

#[test]
fn a_domain_whose_only_tool_the_destructive_rule_held_back_says_so() {
    let router = accounts_router();
    let selection = route(&router, "my account name is foo", &SessionView::new(1));
    assert!(!selection.contains("delete_account"));
    let accounts = selection
        .domain("accounts")
        .map(|d| (d.included, d.stage, d.reason.to_string()));
    let Some((included, stage, reason)) = accounts else {
        panic!("no decision for accounts: {selection:?}");
    };
    assert!(!included);
    assert_eq!(stage, Stage::NoDirectEvidence, "{reason}");
    assert!(!reason.contains("trimmed"), "{reason}");
    assert!(reason.contains("direct evidence"), "{reason}");
}

/// The likeliest tool of a domain held back by the destructive rule: the domain's
/// reason names a tool it sends, not the one held back.
#[test]
fn a_domains_reason_names_a_tool_it_sends() {
    let toolkit = json!({"domain": "accounts", "description": "User accounts.", "keywords": ["account"],
        "tools": [{"name": "delete_account", "description": "Delete a user account for good.",
                   "input_schema": {"type": "object", "properties": {"token": {"type": "string"}}},
                   "annotations": {"destructiveHint": true}},
                  tool("get_profile", "Show the user's profile details.")]});
    let router = Router::new(registry_of(&[toolkit]), RouterConfig::default());
    let selection = route(&router, "my account name is foo", &SessionView::new(1));
    assert!(!selection.contains("delete_account"));
    assert!(
        selection.contains("get_profile"),
        "{}",
        selection.summary_line()
    );
    let reason = selection
        .domain("accounts")
        .map(|d| d.reason.to_string())
        .unwrap_or_default();
    assert!(reason.contains("get_profile p "), "{reason}");
    assert!(!reason.contains("delete_account"), "{reason}");
}

/// Domains a toolkit declares in conflict: when both would send tools, the one the
/// message points at less goes, unless a keyword names each.
#[test]
fn a_declared_domain_conflict_keeps_the_likelier_domain() {
    let toolkits = [
        json!({"domain": "ledger", "description": "The household ledger.", "keywords": ["ledger"],
               "conflicts": ["notes"],
               "tools": [tool("ledger_lookup", "Look up an entry in the ledger.")]}),
        json!({"domain": "notes", "description": "Notes the user keeps.", "keywords": ["notebook"],
               "tools": [tool("notes_lookup", "Look up an entry in my notes.")]}),
    ];
    let router = Router::new(registry_of(&toolkits), RouterConfig::default());
    let selection = route(
        &router,
        "look up the entry in the ledger",
        &SessionView::new(1),
    );
    assert!(
        selection.contains("ledger_lookup"),
        "{}",
        selection.summary_line()
    );
    assert!(
        !selection.contains("notes_lookup"),
        "{}",
        selection.summary_line()
    );
    let notes = selection.domain("notes").expect("notes decided");
    assert_eq!(notes.stage, Stage::Collision, "{}", notes.reason);
    assert!(
        notes.reason.contains("conflicts with ledger"),
        "{}",
        notes.reason
    );
    // A keyword for each: both stay.
    let both = route(&router, "the ledger and the notebook", &SessionView::new(1));
    assert!(both.contains("ledger_lookup") && both.contains("notes_lookup"));
}

#[test]
fn a_domain_whose_only_tool_lost_a_collision_says_so() {
    let toolkits = [
        json!({"domain": "ledger", "description": "The household ledger.", "keywords": ["ledger"],
               "tools": [{"name": "ledger_lookup", "description": "Look up an entry in the ledger.",
                          "input_schema": {"type": "object", "properties": {}},
                          "conflicts": ["notes_lookup"]}]}),
        json!({"domain": "notes", "description": "Notes the user keeps.", "keywords": ["notebook"],
               "tools": [tool("notes_lookup", "Look up an entry in my notes.")]}),
    ];
    let router = Router::new(registry_of(&toolkits), RouterConfig::default());
    let selection = route(
        &router,
        "look up the ledger entry in my notes",
        &SessionView::new(1),
    );
    let lost: Vec<_> = selection
        .domains
        .iter()
        .filter(|d| !d.included && d.stage != Stage::NotMatched)
        .map(|d| (d.domain.to_string(), d.stage, d.reason.to_string()))
        .collect();
    assert_eq!(lost.len(), 1, "{lost:?} {}", selection.summary_line());
    let (_, stage, reason) = &lost[0];
    assert_eq!(*stage, Stage::Collision, "{reason}");
    assert!(reason.contains("conflicts"), "{reason}");
}

#[test]
fn a_destructive_tool_asked_for_last_turn_reaches_the_answer_to_the_models_question() {
    let router = accounts_router();
    let select = |message: &str, session: &SessionView| route(&router, message, session);
    let mut session = SessionView::new(1);
    let asked = select("delete my account", &session);
    assert!(asked.contains("delete_account"), "{}", asked.summary_line());
    session.begin_turn(2, Some(&asked));
    let answer = select("my account name is foo", &session);
    assert!(
        answer.contains("delete_account"),
        "{}",
        answer.summary_line()
    );
    // Without the ask, the same message has no direct evidence for it.
    assert!(!select("my account name is foo", &SessionView::new(2)).contains("delete_account"));
}

/// The fit scores a turn once and tries each selection rule on a copy: that gives
/// the selection a router with the rule in its weights gives.
#[test]
fn one_scoring_selected_by_each_rule_is_what_each_rule_routes() {
    use crate::scorer::SelectionRule;
    let Some(router) = shared_catalog_scorer() else {
        return;
    };
    let shipped = router.weights().clone();
    let rules = [
        shipped.lexical.selection,
        SelectionRule {
            coverage: 0.97,
            min_ratio: 0.002,
            min_probability: 0.0,
            fill_tokens: 3500,
            ..shipped.lexical.selection
        },
        SelectionRule {
            coverage: 0.5,
            min_ratio: 0.5,
            whole_domain_share: 0.0,
            fill_tokens: 0,
            ..shipped.lexical.selection
        },
    ];
    let settings = crate::replay::every_setting(router.registry());
    let session = SessionView::new(1);
    for message in [
        "reboot the server now",
        "delete all my notes and email bob the summary",
        "what's on my calendar tomorrow?",
    ] {
        let input = RouteInput::new(message, &settings, &session);
        let scored = router.scored(&input, &router.scorer);
        let mut sent = std::collections::BTreeSet::new();
        for rule in rules {
            let mut weights = shipped.clone();
            weights.lexical.selection = rule;
            let mut by_rule = Router::new(router.registry().clone(), RouterConfig::default());
            by_rule.set_weights(weights.clone());
            let scorers = crate::Scorers::new(&weights);
            let from_scoring = scored.clone().select(&scorers);
            let routed = by_rule.select(&input);
            assert_eq!(from_scoring, routed, "{message}, {rule:?}");
            sent.insert(routed.n_tools);
        }
        // The rules differ where it counts: the copy is not the first rule's selection.
        assert!(sent.len() > 1, "{message}: every rule sent {sent:?} tools");
    }
}

/// The shared catalog's router and dev's first 30 conversations in 3 folds: a fit
/// that runs in a test (None without the shared catalog).
fn small_fit_on_dev() -> Option<(Router, Vec<Vec<replay::Case>>)> {
    let router = shared_catalog_scorer()?;
    let dev = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/eval/dev.jsonl");
    let text = std::fs::read_to_string(dev).expect("dev.jsonl beside the catalog");
    let cases = replay::cases_from_json_lines(&text).expect("cases");
    let folds = replay::folds(&cases[..cases.len().min(30)], 3);
    Some((router, folds))
}

/// The fit's jobs are independent: run in order or in reverse they give the same
/// weights, and a runner that drops them gets an error, not weights of zeros.
#[test]
fn the_fits_jobs_give_the_same_weights_in_any_order_and_a_dropped_job_is_an_error() {
    use crate::fit::{Fitted, Job, Options, Path, RunJobs, fit_path, one_after_another};
    let Some((router, folds)) = small_fit_on_dev() else {
        return;
    };
    let fit = |run: RunJobs<'_>| -> Result<Fitted, String> {
        fit_path(
            &router,
            &folds,
            &Options::default(),
            Path::Lexical,
            None,
            &mut |_| {},
            run,
        )
    };
    let in_order = fit(&one_after_another).expect("fit");
    let reversed =
        fit(&|jobs: Vec<Job<'_>>| jobs.into_iter().rev().for_each(|job| job())).expect("fit");
    assert_eq!(in_order.model, reversed.model);
    assert!(in_order.model.weights.values().any(|&w| w != 0.0));
    let dropped = fit(&|jobs: Vec<Job<'_>>| drop(jobs));
    assert!(
        dropped.as_ref().is_err_and(|e| e.contains("did not run")),
        "{:?}",
        dropped.map(|f| f.model)
    );
}

/// `turn_rows` gives every turn of every fold once, each candidate with the row the
/// fit trains on: nearly every needed tool is a candidate, with evidence in its row.
#[test]
fn turn_rows_are_the_fits_rows_turn_by_turn() {
    use crate::fit::{one_after_another, turn_rows};
    let Some((router, folds)) = small_fit_on_dev() else {
        return;
    };
    let turns = turn_rows(&router, &folds, None, &one_after_another).expect("rows");
    let n_turns: usize = folds.iter().flatten().map(|c| c.turns.len()).sum();
    assert_eq!(turns.len(), n_turns);
    let mut found = 0;
    for turn in &turns {
        assert_eq!(turn.tools.len(), turn.rows.len());
        let case = &folds[turn.fold]
            .iter()
            .find(|c| c.id == turn.case)
            .expect("case");
        assert_eq!(turn.message, case.turns[turn.turn].user);
        for needed in &turn.needed {
            if let Some(i) = turn.tools.iter().position(|t| t == needed) {
                found += 1;
                assert!(
                    turn.rows[i].iter().any(|&x| x > 0.0),
                    "{needed}: an empty row"
                );
            }
        }
    }
    let n_needed: usize = turns.iter().map(|t| t.needed.len()).sum();
    assert!(
        found * 10 >= n_needed * 9,
        "{found} of {n_needed} needed tools have a row"
    );
}

/// A dense fit's summary names the encoder whose cosines its weights belong to (what
/// `Router::dense_weights_mismatch` reads); a lexical fit's names none.
#[test]
fn a_dense_fit_names_its_encoder() {
    use crate::fit::{Options, Path, fit_path, one_after_another};
    let Some((mut router, folds)) = small_fit_on_dev() else {
        return;
    };
    let rows = router
        .dense_texts()
        .iter()
        .map(|text| {
            let mut row = vec![1.0f32; 8];
            for (i, b) in text.bytes().enumerate() {
                row[i % 8] += f32::from(b);
            }
            row
        })
        .collect();
    router.set_dense(Some(DenseIndex::new("fake-encoder", rows)));
    let fit = |path| {
        fit_path(
            &router,
            &folds,
            &Options::default(),
            path,
            None,
            &mut |_| {},
            &one_after_another,
        )
        .expect("fit")
    };
    assert_eq!(fit(Path::Dense).summary["encoder"], "fake-encoder");
    assert!(fit(Path::Lexical).summary.get("encoder").is_none());
}

/// A fit told the most tools a turn may take on average chooses a selection rule
/// that sends no more on its held-out folds, where the uncapped fit sends more.
#[test]
fn a_fit_under_a_tool_cap_chooses_a_rule_that_keeps_to_it() {
    use crate::fit::{Options, Path, fit_path, one_after_another};
    let Some((router, folds)) = small_fit_on_dev() else {
        return;
    };
    let fit = |max_mean_tools| {
        let options = Options {
            max_mean_tools,
            ..Options::default()
        };
        fit_path(
            &router,
            &folds,
            &options,
            Path::Lexical,
            None,
            &mut |_| {},
            &one_after_another,
        )
        .expect("fit")
    };
    let uncapped = fit(None).held_out.mean_tools();
    let cap = 12.0;
    assert!(uncapped > cap, "the uncapped fit sends {uncapped} tools");
    let capped = fit(Some(cap)).held_out.mean_tools();
    assert!(capped <= cap, "the capped fit sends {capped} tools");
}

/// A meetings domain and a sign-in domain: the request and the answer to the
/// model's question ("your username and password?").
fn meetings_router() -> Router {
    let toolkits = [
        json!({"domain": "meetings", "description": "Meetings on the team calendar.",
               "keywords": ["meeting"],
               "tools": [tool("add_meeting", "Add a meeting to the calendar.")]}),
        json!({"domain": "auth", "description": "Sign-in.", "keywords": ["password", "username"],
               "tools": [tool("get_user_token", "Get a user's token from their username and password.")]}),
    ];
    Router::new(registry_of(&toolkits), RouterConfig::default())
}

const MEETING_ASK: &str = "can you schedule a meeting for me?";
const CREDENTIALS: &str = "my username is foo and my password is bar";

/// `add_meeting`'s `pending` feature for the credentials in `session`.
fn add_meeting_pending(router: &Router, session: &SessionView) -> f32 {
    let settings = all_settings();
    let input = RouteInput::new(CREDENTIALS, &settings, session);
    feature_of(router, &input, "add_meeting", crate::scorer::f::PENDING)
}

/// A request the model answered with a question is still wanted when the answer
/// comes, though the answer names another domain's words: the `pending` feature.
/// Once the model called a tool, it is not.
#[test]
fn a_request_the_model_asked_about_is_pending_in_the_answer() {
    let router = meetings_router();
    let mut session = SessionView::new(1);
    let asked = route(&router, MEETING_ASK, &session);
    assert!(asked.contains("add_meeting"), "{}", asked.summary_line());

    // The model asked for the credentials: nothing was called.
    session.begin_turn(2, Some(&asked));
    assert_eq!(add_meeting_pending(&router, &session), 1.0);
    let selection = route(&router, CREDENTIALS, &session);
    assert!(selection.contains("add_meeting"));
    let meetings = selection.domain("meetings").map(|d| d.reason.to_string());
    assert!(
        meetings
            .as_ref()
            .is_some_and(|r| r.contains("pending 1.00")),
        "{meetings:?}"
    );

    // The model called it on the first turn: the answer is something new.
    let mut called = SessionView::new(1);
    called.record_calls(&router, &["add_meeting"]);
    called.begin_turn(2, Some(&asked));
    assert_eq!(add_meeting_pending(&router, &called), 0.0);
}

/// A request stays carried over the model's questions and a login call until its
/// own tool is called, or until the router no longer sends it.
#[test]
fn a_request_stays_open_until_its_tool_is_called_or_no_longer_sent() {
    let router = meetings_router();
    let carried = |session: &SessionView| session.carried_tools.iter().any(|t| t == "add_meeting");
    let asked = route(&router, MEETING_ASK, &SessionView::new(1));

    // Two more questions, answered with details that name nothing.
    let mut session = SessionView::new(1);
    let mut previous = asked.clone();
    for (turn, detail) in [(2, "it's about the budget"), (3, "friday at ten")] {
        session.begin_turn(turn, Some(&previous));
        previous = route(&router, detail, &session);
    }
    session.begin_turn(4, Some(&previous));
    assert!(carried(&session));
    assert_eq!(add_meeting_pending(&router, &session), 1.0);
    let answered = route(&router, CREDENTIALS, &session);
    assert!(answered.contains("add_meeting"));
    // The model logs in: the request is still open, though no longer pending.
    session.record_calls(&router, &["get_user_token"]);
    session.begin_turn(5, Some(&answered));
    assert!(carried(&session));
    assert_eq!(add_meeting_pending(&router, &session), 0.0);
    let sure = route(&router, "yes, I am sure", &session);
    assert!(sure.contains("add_meeting"), "{}", sure.summary_line());
    // It calls the tool: carried once more (the server stores the carry before the
    // turn's calls come), and then no longer.
    session.record_calls(&router, &["add_meeting"]);
    session.begin_turn(6, Some(&sure));
    assert!(carried(&session));
    let next = route(&router, "yes, I am sure", &session);
    session.begin_turn(7, Some(&next));
    assert!(!carried(&session));

    // A request the router no longer sends (here a budget too small for it) is not
    // carried on, called or not: a client that never reports calls does not pile up
    // every tool it was ever sent.
    let mut session = SessionView::new(1);
    session.begin_turn(2, Some(&asked));
    let moved_on = router.select(&RouteInput {
        token_budget: Some(1),
        ..RouteInput::new("it's about the budget", &all_settings(), &session)
    });
    assert!(!moved_on.contains("add_meeting"));
    session.begin_turn(3, Some(&moved_on));
    assert!(!carried(&session));
}

#[test]
fn names_and_stages_take_a_width() {
    // `loadout route` lines its tools up in columns.
    assert_eq!(format!("{:<8}|", Name::from("forget")), "forget  |");
    assert_eq!(format!("{:>8}|", Stage::Scored), "  scored|");
}

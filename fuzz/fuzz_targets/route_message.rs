//! Messages through the router's evidence (keywords, requests, chit-chat, BM25)
//! and every stage, on a small catalog: never a panic, and within the budget but
//! for the stages it does not trim.
#![no_main]

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use loadout_router::{RouteInput, Router, RouterConfig, SessionView};

fn router() -> &'static Router {
    static ROUTER: OnceLock<Router> = OnceLock::new();
    ROUTER.get_or_init(|| {
        let tool = |name: &str, description: &str| {
            serde_json::json!({"name": name, "description": description,
                "input_schema": {"type": "object", "properties": {"event_id": {"type": "string", "description": "Event id from list_events"}}}})
        };
        let files = [
            serde_json::json!({"domain": "core", "description": "Core tools.", "always_on": true, "keywords": ["settings"],
                "tools": [tool("get_setting", "Read a setting.")]}),
            serde_json::json!({"domain": "calendar", "description": "Events in the user's calendar.", "keywords": ["calendar", "meeting", "일정"],
                "tools": [tool("list_events", "List calendar events."), tool("delete_event", "Delete an event.")]}),
            serde_json::json!({"domain": "weather", "description": "Forecasts.", "keywords": ["weather", "날씨"], "settings_keys": ["weather_key"],
                "tools": [tool("forecast", "Weather forecast for a city.")]}),
        ];
        let mut builder = loadout::Registry::builder();
        for (i, file) in files.iter().enumerate() {
            let toolkit = loadout::toolkit::parse(&file.to_string(), &format!("{i}.json"))
                .unwrap_or_else(|e| panic!("catalog: {e}"));
            builder = builder.toolkit(toolkit);
        }
        let registry = builder.build().unwrap_or_else(|e| panic!("catalog: {e}"));
        Router::new(Arc::new(registry), RouterConfig::default())
    })
}

libfuzzer_sys::fuzz_target!(|input: (&str, u16)| {
    let (message, budget) = input;
    let settings = BTreeMap::from([("weather_key".to_owned(), "k".to_owned())]);
    let session = SessionView::new(1);
    let selection = router().select(&RouteInput {
        token_budget: Some(usize::from(budget)),
        ..RouteInput::new(message, &settings, &session)
    });
    assert_eq!(
        selection.tokens,
        selection.tools.iter().map(|t| t.tokens).sum::<usize>()
    );
});

//! `/api/domains`: every domain, active or not and why, its tools and their tokens.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::{ApiError, HttpState};

pub async fn list(State(state): State<HttpState>) -> Result<Json<Value>, ApiError> {
    let settings = state.app.settings.snapshot().await?;
    // The registry routing uses now: with upstream MCP servers, their domains too.
    let router = state.app.routing().router();
    let registry = router.registry();
    let domains: Vec<Value> = registry
        .domains()
        .iter()
        .map(|domain| {
            let missing = registry.missing_settings(&domain.name, &settings);
            let tools: Vec<Value> = registry
                .tools_of(domain)
                .map(|tool| {
                    let tokens = registry
                        .tool_idx(&tool.name)
                        .map_or(0, |i| router.tool_tokens(i));
                    json!({"name": tool.name, "hint": tool.hint, "tokens": tokens})
                })
                .collect();
            let tokens: u64 = tools.iter().filter_map(|t| t["tokens"].as_u64()).sum();
            json!({
                "name": domain.name,
                "description": domain.description,
                "active": missing.is_empty(),
                "always_on": domain.always_on,
                "settings_keys": domain.settings_keys,
                "missing_settings": missing,
                "keywords": domain.keywords,
                "tools": tools,
                "tokens": tokens,
            })
        })
        .collect();
    Ok(Json(json!({
        "domains": domains,
        "all_tools_tokens": router.all_tools_tokens(),
    })))
}

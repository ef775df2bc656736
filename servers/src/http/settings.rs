//! `/api/settings`: read (secrets masked), write, delete. Writes go through the
//! shared settings cache, so the router sees them at once.

use axum::Json;
use axum::extract::State;
use loadout::{is_secret_key, mask_secret};
use serde::Deserialize;
use serde_json::{Value, json};

use super::extract::{ApiJson, ApiPath};
use super::{ApiError, HttpState};

fn shown(key: &str, value: &str) -> String {
    if is_secret_key(key) {
        mask_secret(value)
    } else {
        value.to_owned()
    }
}

pub async fn list(State(state): State<HttpState>) -> Result<Json<Value>, ApiError> {
    let settings = state.app.settings.snapshot().await?;
    let values: serde_json::Map<String, Value> = settings
        .iter()
        .map(|(k, v)| (k.clone(), json!(shown(k, v))))
        .collect();
    Ok(Json(json!({ "settings": values })))
}

pub async fn show(
    State(state): State<HttpState>,
    ApiPath(key): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    loadout_store::validate_setting_key(&key)?;
    match state.app.settings.get(&key).await? {
        Some(value) => Ok(Json(
            json!({"key": key, "value": shown(&key, &value), "masked": is_secret_key(&key)}),
        )),
        None => Err(ApiError::NotFound(format!("setting `{key}` is not set"))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutBody {
    value: String,
}

pub async fn put(
    State(state): State<HttpState>,
    ApiPath(key): ApiPath<String>,
    ApiJson(body): ApiJson<PutBody>,
) -> Result<Json<Value>, ApiError> {
    state.app.settings.set(&key, &body.value).await?;
    let mut answer = json!({"key": key, "value": shown(&key, &body.value)});
    restart_note(&mut answer, &key);
    Ok(Json(answer))
}

/// Says so when the key is read only at start (`router_dense`, the embeddings
/// keys): saved, but this process keeps the old value until it restarts.
fn restart_note(answer: &mut Value, key: &str) {
    if loadout::applies_of(key) == loadout::Applies::Restart {
        answer["restart_required"] = json!(true);
        answer["note"] = json!(format!(
            "saved; `{key}` is read at start: restart loadout serve and loadout mcp for it to take effect"
        ));
    }
}

pub async fn delete(
    State(state): State<HttpState>,
    ApiPath(key): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    loadout_store::validate_setting_key(&key)?;
    if state.app.settings.unset(&key).await? {
        let mut answer = json!({"key": key, "deleted": true});
        restart_note(&mut answer, &key);
        Ok(Json(answer))
    } else {
        Err(ApiError::NotFound(format!("setting `{key}` is not set")))
    }
}

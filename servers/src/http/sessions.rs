//! `/api/sessions`: create one, read one back with its messages and decisions.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::{ApiError, HttpState};

pub async fn create(State(state): State<HttpState>) -> Result<(StatusCode, Json<Value>), ApiError> {
    let id = state.app.settings.store().session_create().await?;
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

pub async fn show(State(state): State<HttpState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    loadout::store::validate_session_id(&id)?;
    let store = state.app.settings.store();
    if !store.session_exists(&id).await? {
        return Err(ApiError::NotFound(format!("no session `{id}`")));
    }
    let messages = store.messages(&id).await?;
    let decisions = store.decisions(&id).await?;
    let domains = store.session_domains(&id).await?;
    Ok(Json(json!({
        "id": id,
        "turn": store.session_turn(&id).await?,
        "messages": messages,
        "selections": decisions,
        "domains": domains,
    })))
}

//! `POST /api/route`: the router's selection for a message, without calling a model.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::{Value, json};

use super::extract::ApiJson;
use super::{ApiError, HttpState};
use crate::routing::{RouteError, RoutedTurn, TurnRequest};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteBody {
    /// Session id; omitted → a one-off message with no session state.
    #[serde(default)]
    session: Option<String>,
    message: String,
    /// Tools the client's model called since its previous turn.
    #[serde(default)]
    called: Vec<String>,
    #[serde(default)]
    token_budget: Option<usize>,
}

pub async fn route(
    State(state): State<HttpState>,
    ApiJson(body): ApiJson<RouteBody>,
) -> Result<Json<Value>, ApiError> {
    if let Some(session) = &body.session {
        loadout::store::validate_session_id(session)?;
    }
    let settings = state.app.settings.snapshot().await?;
    let routed = state
        .app
        .routing
        .route(
            state.app.store(),
            settings,
            TurnRequest {
                session: body.session.as_deref(),
                message: &body.message,
                called: &body.called,
                token_budget: body.token_budget,
            },
        )
        .await?;
    Ok(Json(selection_json(&state, &routed)))
}

/// The wire form of a routed turn: tools in OpenAI format, hints, reasons, tokens.
pub fn selection_json(state: &HttpState, routed: &RoutedTurn) -> Value {
    let selection = &routed.selection;
    json!({
        "turn": routed.turn,
        "summary": selection.summary_line(),
        "tools": selection.tools_openai(&state.app.registry),
        "selection": selection,
    })
}

impl From<RouteError> for ApiError {
    fn from(e: RouteError) -> Self {
        match e {
            RouteError::MessageTooLarge(_) => ApiError::PayloadTooLarge(e.to_string()),
            RouteError::EmptyMessage | RouteError::UnknownCalled(_) => {
                ApiError::BadRequest(e.to_string())
            }
            RouteError::Store(store) => ApiError::from(store),
        }
    }
}

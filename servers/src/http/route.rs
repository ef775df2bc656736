//! `POST /api/route`: the router's selection for a message, without calling a model.

use std::sync::{Arc, OnceLock, RwLock};

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use loadout::Registry;
use serde::Deserialize;

use super::extract::{ApiJson, present};
use super::{ApiError, HttpState};
use crate::routing::{RouteError, RoutedTurn, TurnRequest};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteBody {
    /// Session id; omitted → a one-off message with no session state.
    #[serde(default, deserialize_with = "present")]
    session: Option<String>,
    message: String,
    /// Tools the client's model called since its previous turn.
    #[serde(default)]
    called: Vec<String>,
    #[serde(default, deserialize_with = "present")]
    token_budget: Option<usize>,
}

pub async fn route(
    State(state): State<HttpState>,
    client: Option<axum::Extension<crate::clients::Client>>,
    ApiJson(body): ApiJson<RouteBody>,
) -> Result<Response, ApiError> {
    if let Some(session) = &body.session {
        let client = client.as_ref().map(|c| c.0.0.name.as_str());
        super::sessions::claim(state.app.store(), session, client).await?;
    }
    let settings = state.app.settings.snapshot_recent().await?;
    let _turn = match &body.session {
        Some(session) => Some(state.app.routing().lock_session(session).await),
        None => None,
    };
    let routed = state
        .app
        .routing()
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
    match client {
        // A client sees only its own set; the decision log keeps what the router
        // decided.
        Some(axum::Extension(client)) => {
            let mut seen = routed;
            seen.selection = Arc::new(client.filter(seen.router.registry(), &seen.selection));
            selection_response(&state, &seen)
        }
        None => selection_response(&state, &routed),
    }
}

/// Each tool's OpenAI definition as JSON text, built on first use: the hot path of
/// `/api/route` copies text instead of building and dropping JSON trees. Kept for
/// the registry routing uses now, and started again when that registry is replaced
/// (an upstream MCP server's tool list changed).
#[derive(Debug)]
pub struct OpenAiDefinitions {
    current: RwLock<Arc<Definitions>>,
}

#[derive(Debug)]
struct Definitions {
    registry: Arc<Registry>,
    by_tool: Vec<OnceLock<String>>,
}

impl Definitions {
    fn new(registry: &Arc<Registry>) -> Definitions {
        Definitions {
            registry: registry.clone(),
            by_tool: (0..registry.all_tools().len())
                .map(|_| OnceLock::new())
                .collect(),
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        let idx = self.registry.tool_idx(name)?;
        let tool = self.registry.all_tools().get(idx)?;
        let cell = self.by_tool.get(idx)?;
        Some(cell.get_or_init(|| loadout::export::openai(tool).to_string()))
    }
}

impl OpenAiDefinitions {
    pub fn new(registry: &Arc<Registry>) -> OpenAiDefinitions {
        OpenAiDefinitions {
            current: RwLock::new(Arc::new(Definitions::new(registry))),
        }
    }

    /// The definitions of `registry`'s tools.
    fn of(&self, registry: &Arc<Registry>) -> Arc<Definitions> {
        let current = self
            .current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        if Arc::ptr_eq(&current.registry, registry) {
            return current;
        }
        let mut current = self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !Arc::ptr_eq(&current.registry, registry) {
            *current = Arc::new(Definitions::new(registry));
        }
        current.clone()
    }
}

/// The wire form of a routed turn: tools in OpenAI format, hints, reasons, tokens;
/// `{"turn", "summary", "tools", "selection"}`.
pub fn selection_response(state: &HttpState, routed: &RoutedTurn) -> Result<Response, ApiError> {
    let selection = &routed.selection;
    let definitions = state.openai_definitions.of(routed.router.registry());
    let mut body = String::with_capacity(16 * 1024);
    body.push_str("{\"turn\":");
    body.push_str(&routed.turn.to_string());
    body.push_str(",\"summary\":");
    body.push_str(&to_json(&selection.summary_line())?);
    body.push_str(",\"tools\":[");
    let mut first = true;
    for tool in &selection.tools {
        let Some(definition) = definitions.get(&tool.name) else {
            continue;
        };
        if !first {
            body.push(',');
        }
        first = false;
        body.push_str(definition);
    }
    body.push_str("],\"selection\":");
    body.push_str(&to_json(selection)?);
    body.push('}');
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, ApiError> {
    serde_json::to_string(value)
        .map_err(|e| ApiError::Internal(format!("serializing the selection: {e}")))
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

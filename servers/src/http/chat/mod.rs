//! `POST /api/chat {session, message}`: one routed chat turn against the configured
//! model. Answers JSON (the final answer and every step's event), or with
//! `Accept: text/event-stream` streams the steps as Server-Sent Events:
//! `selection`, `assistant`, `tool_call`, `tool_result`, then `final` or `error`.

mod control;
pub mod llm;
mod turn;

use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tracing::Instrument as _;

use super::extract::ApiJson;
use super::{ApiError, HttpState};
use crate::routing::TurnRequest;
use control::TurnControl;
use llm::LlmConfig;
pub use turn::MAX_STEPS;
use turn::{Events, Turn};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatBody {
    /// Session id; omitted → a new session, whose id the answer carries.
    #[serde(default, deserialize_with = "super::extract::present")]
    session: Option<String>,
    message: String,
}

pub async fn chat(
    State(state): State<HttpState>,
    client: Option<axum::Extension<crate::clients::Client>>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<ChatBody>,
) -> Result<Response, ApiError> {
    let turn = prepare(state, body, client.map(|axum::Extension(c)| c)).await?;
    let session = turn.session.clone();
    let turn_number = turn.turn_number();
    if wants_event_stream(&headers) {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let _ = sender.send(("session", json!({"session": session, "turn": turn_number})));
        // The turn runs to the end and persists even if the client goes away; in the
        // request's span, so that its spans are the request's children.
        tokio::spawn(
            async move {
                let mut events = Events::Stream(sender);
                let _outcome = turn.run(&mut events).await;
            }
            .instrument(tracing::Span::current()),
        );
        let stream =
            UnboundedReceiverStream::new(receiver).map(|(kind, data): (&'static str, Value)| {
                Ok::<Event, Infallible>(Event::default().event(kind).data(data.to_string()))
            });
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    // A task of its own, so a client that goes away does not cut the turn short.
    let (outcome, events) = tokio::spawn(
        async move {
            let mut events = Events::Collect(Vec::new());
            let outcome = turn.run(&mut events).await;
            (outcome, events)
        }
        .instrument(tracing::Span::current()),
    )
    .await
    .map_err(|e| ApiError::Internal(format!("chat turn task failed: {e}")))?;
    let outcome = outcome.map_err(|e| ApiError::BadGateway(e.to_string()))?;
    let Events::Collect(events) = events else {
        return Err(ApiError::Internal("chat events were not collected".into()));
    };
    Ok(Json(json!({
        "session": session,
        "turn": turn_number,
        "answer": outcome.answer,
        "steps": outcome.n_steps,
        "stopped": outcome.stopped.then_some("step_limit"),
        "unsaved": outcome.unsaved,
        "events": events,
    }))
    .into_response())
}

/// Checks the model settings and routes the message; nothing is sent to the client
/// before this succeeds, so its failures keep their HTTP status. A client's turn sees
/// and calls only what its token allows (`clients add --domains/--tools/--read-only`).
async fn prepare(
    state: HttpState,
    body: ChatBody,
    client: Option<crate::clients::Client>,
) -> Result<Turn, ApiError> {
    let owner = client.as_ref().map(|c| c.0.name.as_str());
    if let Some(session) = &body.session {
        super::sessions::claim(state.app.store(), session, owner).await?;
    }
    let settings = state.app.settings.snapshot().await?;
    let config = LlmConfig::from_settings(&settings).map_err(ApiError::NotConfigured)?;
    let store = state.app.store().clone();
    let session = match body.session {
        Some(session) => session,
        None => store.session_create_for(owner).await?,
    };
    // Held until the turn ends (the model loop included).
    let guard = state.app.routing().lock_session(&session).await;
    let routed = state
        .app
        .routing()
        .route(
            &store,
            settings,
            TurnRequest {
                session: Some(&session),
                message: &body.message,
                called: &[],
                token_budget: None,
            },
        )
        .await?;
    let first_selection = routed.selection.clone();
    let control = TurnControl::new(
        routed,
        state.app.routing().clone(),
        store,
        session.clone(),
        body.message.clone(),
        client.clone(),
    );
    Ok(Turn {
        client,
        state,
        config,
        session,
        message: body.message,
        control,
        _session_turn: guard,
        unsaved: Default::default(),
        first_selection,
        succeeded: Default::default(),
    })
}

fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

//! `/api/sessions`: create one, read one back with its messages and decisions.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use loadout_store::MessageRow;
use serde_json::{Value, json};

use super::extract::ApiPath;
use super::{ApiError, HttpState};

pub async fn create(State(state): State<HttpState>) -> Result<(StatusCode, Json<Value>), ApiError> {
    let id = state.app.store().session_create().await?;
    Ok((StatusCode::CREATED, Json(json!({ "id": id }))))
}

/// Opens session `id` to `client` (`None`: the operator's token or no token, which
/// reach every session), creating it for them when new: a client's token cannot
/// route or chat in another client's session, nor in the operator's.
pub(super) async fn claim(
    store: &loadout_store::Store,
    id: &str,
    client: Option<&str>,
) -> Result<(), ApiError> {
    // The store refuses a malformed id (400).
    if store.session_claim(id, client).await? {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "session `{id}` belongs to another client; start a session of your own"
        )))
    }
}

pub async fn show(
    State(state): State<HttpState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    loadout_store::validate_session_id(&id)?;
    let store = state.app.store();
    if !store.session_exists(&id).await? {
        return Err(ApiError::NotFound(format!("no session `{id}`")));
    }
    let messages = store.messages(&id).await?;
    let decisions = store.decisions(&id).await?;
    let domains = store.session_domains(&id).await?;
    let tool_calls = tool_calls(&messages);
    let messages: Vec<MessageRow> = messages.into_iter().map(error_as_text).collect();
    Ok(Json(json!({
        "id": id,
        "turn": store.session_turn(&id).await?,
        "messages": messages,
        "tool_calls": tool_calls,
        "selections": decisions,
        "domains": domains,
    })))
}

/// An `error` message's content as text, as new rows store it; rows written before
/// that hold `{"message": ...}`.
fn error_as_text(mut row: MessageRow) -> MessageRow {
    if row.role == "error"
        && let Some(message) = row.content.get("message").and_then(Value::as_str)
    {
        row.content = Value::String(message.to_owned());
    }
    row
}

/// Every tool call of the chat turns with its result: each stored assistant message's
/// `tool_calls`, joined with the `tool` message answering it; and the calls a client
/// reported to `/api/route` (`reported`, with no arguments or result: the client
/// ran them).
fn tool_calls(messages: &[MessageRow]) -> Vec<Value> {
    let mut calls: Vec<Value> = Vec::new();
    for message in messages {
        match message.role.as_str() {
            "assistant" => {
                for call in message
                    .content
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let function = call.get("function").unwrap_or(&Value::Null);
                    calls.push(json!({
                        "turn": message.turn,
                        "id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": function.get("arguments"),
                        "result": null,
                    }));
                }
            }
            // Calls a client running its own model reported to `/api/route`: no
            // assistant message of ours asked for them.
            "tool" if message.content.get("reported") == Some(&Value::Bool(true)) => {
                calls.push(json!({
                    "turn": message.turn,
                    "id": null,
                    "name": message.content.get("name"),
                    "arguments": null,
                    "result": null,
                    "reported": true,
                }));
            }
            "tool" => {
                let id = message.content.get("tool_call_id");
                if let Some(call) = calls.iter_mut().rev().find(|c| c.get("id") == id) {
                    call["result"] = json!({
                        "ok": message.content.get("ok"),
                        "refused": message.content.get("refused"),
                        "content": message.content.get("content"),
                    });
                }
            }
            _ => {}
        }
    }
    calls
}

//! `GET /api/clients`: the clients with tokens of their own (issue 40), each with
//! what it may see and its calls, for the operator and the dashboard.

use std::collections::HashMap;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use super::{ApiError, HttpState};
use crate::log_writer::iso_utc;

/// The audit rows the calls are counted in: the newest ones, so that a long log
/// costs the dashboard one bounded read rather than a scan of every row.
pub const CALLS_WINDOW: usize = 5000;

pub async fn list(State(state): State<HttpState>) -> Result<Json<Value>, ApiError> {
    let store = state.app.store();
    let clients = store.clients_list().await?;
    let mut calls: HashMap<&str, (u64, u64, i64)> = HashMap::new();
    let rows = if clients.is_empty() {
        Vec::new()
    } else {
        store.audit_tail(CALLS_WINDOW).await?
    };
    for row in &rows {
        let entry = calls.entry(row.client.as_str()).or_default();
        entry.0 += 1;
        entry.1 += u64::from(row.outcome != "ok");
        entry.2 = entry.2.max(row.at_ms);
    }
    let clients: Vec<Value> = clients
        .iter()
        .map(|client| {
            let (n, failed, last) = calls.get(client.name.as_str()).copied().unwrap_or_default();
            json!({
                "name": client.name,
                "domains": client.domains,
                "tools": client.tools,
                "rate_per_min": client.rate_per_min,
                "read_only": client.read_only,
                "created": iso_utc(client.created_ms),
                "calls": n,
                "failed_calls": failed,
                "last_call": (n > 0).then(|| iso_utc(last)),
            })
        })
        .collect();
    Ok(Json(
        json!({"clients": clients, "calls_counted_in": CALLS_WINDOW}),
    ))
}

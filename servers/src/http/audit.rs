//! `/api/audit`: the newest tool calls from the audit log, times in ISO 8601 UTC.

use axum::Json;
use axum::extract::{RawQuery, State};
use serde_json::{Value, json};

use super::{ApiError, HttpState};
use crate::log_writer::audit_json;

/// Rows returned when the query names no `tail`.
const DEFAULT_TAIL: usize = 50;
/// Most rows one request may ask for.
const MAX_TAIL: usize = 1000;

pub async fn tail(
    State(state): State<HttpState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let n = parse_tail(query.as_deref())?;
    let rows = state.app.store().audit_tail(n).await?;
    let calls: Vec<Value> = rows.iter().map(audit_json).collect();
    Ok(Json(json!({ "calls": calls })))
}

/// `tail=N` (1..=MAX_TAIL) from the query string; other parameters are refused.
fn parse_tail(query: Option<&str>) -> Result<usize, ApiError> {
    let mut tail = DEFAULT_TAIL;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "tail" {
            return Err(ApiError::BadRequest(format!(
                "unknown query parameter `{}`; only `tail` is accepted",
                name.chars().take(64).collect::<String>()
            )));
        }
        tail = value
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_TAIL).contains(n))
            .ok_or_else(|| {
                ApiError::BadRequest(format!("`tail` must be an integer from 1 to {MAX_TAIL}"))
            })?;
    }
    Ok(tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_is_bounded_and_other_parameters_refused() {
        assert_eq!(parse_tail(None).ok(), Some(DEFAULT_TAIL));
        assert_eq!(parse_tail(Some("tail=3")).ok(), Some(3));
        assert!(parse_tail(Some("tail=0")).is_err());
        assert!(parse_tail(Some("tail=100000")).is_err());
        assert!(parse_tail(Some("tail=x")).is_err());
        assert!(parse_tail(Some("limit=3")).is_err());
    }
}

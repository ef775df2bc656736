//! `GET /metrics`: the process's metrics as Prometheus text (see `crate::metrics`),
//! behind the same bearer check as `/api`.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::{ApiError, HttpState};

pub async fn metrics(State(state): State<HttpState>) -> Response {
    // Read at scrape time: the connections know their state, nothing tracks it.
    if let Some(mcp) = &state.mcp {
        for (server, up) in mcp.upstream_health() {
            crate::metrics::set_upstream_up(&server, up);
        }
    }
    match crate::metrics::render() {
        Some(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        None => ApiError::Unavailable(
            "metrics are not recorded in this process (another recorder is installed)".into(),
        )
        .into_response(),
    }
}

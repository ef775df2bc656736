//! `/`: the dashboard, one HTML page with its script and styles inline, embedded in
//! the binary (no build step, no other asset).

use axum::http::header;
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("dashboard.html");

pub async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            // Only its own inline script and style, and calls to this origin.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'",
            ),
        ],
        PAGE,
    )
        .into_response()
}

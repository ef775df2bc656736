//! `/`: the dashboard, one HTML page with its script and styles inline, embedded in
//! the binary (no build step), and its icon (`/favicon.svg`, also at `/favicon.ico`,
//! where browsers look when a page names none).

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

/// The dashboard's icon: a small SVG, so that browsers get no 404.
const FAVICON: &str = concat!(
    r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">"##,
    r##"<rect width="32" height="32" rx="7" fill="#2f6fed"/>"##,
    r##"<path d="M10 7v18h13" fill="none" stroke="#fff" stroke-width="4" stroke-linecap="round" stroke-linejoin="round"/>"##,
    "</svg>"
);

pub async fn favicon() -> Response {
    (
        [
            (header::CONTENT_TYPE, "image/svg+xml"),
            (header::CACHE_CONTROL, "public, max-age=86400"),
        ],
        FAVICON,
    )
        .into_response()
}

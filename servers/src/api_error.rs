//! The chat server's one error type: each variant carries its status, and the body
//! is always JSON `{"error": {"kind", "message"}}`. Internals are logged, not sent.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("missing or wrong bearer token")]
    Unauthorized,
    /// The request's Host or Origin is not one this server answers to.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    /// The request needs settings that are missing (e.g. no model configured).
    #[error("{0}")]
    NotConfigured(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The model endpoint failed or answered something unusable.
    #[error("{0}")]
    BadGateway(String),
    /// The state backend cannot be reached; retrying later may work.
    #[error("{0}")]
    Unavailable(String),
    /// The request took longer than its route allows.
    #[error("{0}")]
    Timeout(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::NotConfigured(_) => StatusCode::CONFLICT,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::NotConfigured(_) => "not_configured",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::BadGateway(_) => "model_error",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::Timeout(_) => "timeout",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = match &self {
            ApiError::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                "internal error; see the server log".to_owned()
            }
            other => other.to_string(),
        };
        let body = json!({"error": {"kind": self.kind(), "message": message}});
        (self.status(), Json(body)).into_response()
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let status = rejection.status();
        let text = rejection.body_text();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(format!("request body too large: {text}"))
        } else {
            ApiError::BadRequest(format!("malformed JSON body: {text}"))
        }
    }
}

impl From<loadout::StoreError> for ApiError {
    fn from(e: loadout::StoreError) -> Self {
        match e {
            loadout::StoreError::Invalid(m) => ApiError::BadRequest(m),
            loadout::StoreError::NotFound(m) => ApiError::NotFound(m),
            // Worth retrying: the server is down or busy, and the store reconnects.
            e @ loadout::StoreError::Unavailable(_) => {
                ApiError::Unavailable(format!("state backend unavailable: {e}"))
            }
            // A failed statement is a bug or a damaged database, not an outage.
            other => ApiError::Internal(format!("state backend: {other}")),
        }
    }
}

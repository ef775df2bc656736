//! The HTTP client of the streamable HTTP transport: same-origin redirects only,
//! bounded connects, and request ids kept on the answers rmcp reads.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context as _;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage, RequestId};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};

use super::HTTP_CONNECT_TIMEOUT;

/// The streamable HTTP client for one upstream.
pub(super) fn http_transport(
    url: &Arc<str>,
    headers: &HashMap<HeaderName, HeaderValue>,
) -> anyhow::Result<StreamableHttpClientTransport<HttpClient>> {
    // reqwest is built without a TLS provider of its own (see Cargo.toml).
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .connect_timeout(HTTP_CONNECT_TIMEOUT)
        // As in rmcp's own client: reusing an idle connection whose last body was
        // not drained stalls ~40 ms on delayed ACKs.
        .pool_max_idle_per_host(0)
        .redirect(same_origin_redirects())
        .build()
        .context("cannot build the HTTP client")?;
    let config = StreamableHttpClientTransportConfig::with_uri(url.clone())
        .custom_headers(headers.clone())
        // A lost session is replaced by a full reconnection instead, which also
        // lists the tools again: a restarted server may have others.
        .reinit_on_expired_session(false);
    Ok(StreamableHttpClientTransport::with_client(
        HttpClient(client),
        config,
    ))
}

/// rmcp's reqwest client with one repair: an error answering a request's POST
/// that carries no `id` gets the request's. Some servers answer an unknown session
/// that way (HTTP 400, as the TypeScript SDK's examples do, so a restarted one),
/// and rmcp drops an error it cannot match, leaving the call to hang until its
/// timeout instead of failing at once.
#[derive(Clone)]
pub(super) struct HttpClient(reqwest::Client);

pub(super) type PostResult =
    Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>;

/// The headers of a POST, with the `traceparent` of a `tools/call` whose `_meta`
/// carries one (set by `call_result`): HTTP servers read the header.
fn with_traceparent(
    message: &ClientJsonRpcMessage,
    mut headers: HashMap<HeaderName, HeaderValue>,
) -> HashMap<HeaderName, HeaderValue> {
    if let JsonRpcMessage::Request(request) = message
        && let rmcp::model::ClientRequest::CallToolRequest(call) = &request.request
        && let Some(traceparent) = call.params.meta.as_ref().and_then(|m| m.get_traceparent())
        && let Ok(value) = HeaderValue::from_str(traceparent)
    {
        headers.insert(HeaderName::from_static("traceparent"), value);
    }
    headers
}

pub(super) fn request_id(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        JsonRpcMessage::Request(request) => Some(request.id.clone()),
        _ => None,
    }
}

pub(super) fn with_request_id(response: PostResult, id: Option<RequestId>) -> PostResult {
    match (response, id) {
        (
            Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(mut error), session)),
            Some(id),
        ) if error.id.is_none() => {
            error.id = Some(id);
            Ok(StreamableHttpPostResponse::Json(
                JsonRpcMessage::Error(error),
                session,
            ))
        }
        (response, _) => response,
    }
}

impl StreamableHttpClient for HttpClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> PostResult {
        let id = request_id(&message);
        let custom_headers = with_traceparent(&message, custom_headers);
        let response = self
            .0
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await;
        with_request_id(response, id)
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> PostResult {
        let id = request_id(&message);
        let custom_headers = with_traceparent(&message, custom_headers);
        let response = self
            .0
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        with_request_id(response, id)
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> PostResult {
        let id = request_id(&message);
        let custom_headers = with_traceparent(&message, custom_headers);
        let response = self
            .0
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await;
        with_request_id(response, id)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<reqwest::Error>> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxedSseResponse, StreamableHttpError<reqwest::Error>> {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxedSseResponse, StreamableHttpError<reqwest::Error>> {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

/// Follows 307/308 within the same origin only: those keep the POST body, and the
/// configured headers (credentials) must not go to another host.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        let keeps_body = matches!(attempt.status().as_u16(), 307 | 308);
        if same_origin && keeps_body && attempt.previous().len() <= 10 {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

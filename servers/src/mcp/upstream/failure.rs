//! What a failed call or connection means: a session the server forgot (reconnect
//! and retry once) or a refusal to report, and its message.

use std::time::Duration;

use loadout::ToolError;
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientRequest, ErrorCode, PingRequest};
use rmcp::service::ClientInitializeError;
use rmcp::transport::DynamicTransportError;
use rmcp::transport::streamable_http_client::StreamableHttpError;
use rmcp::{Peer, RoleClient, ServiceError};
use tokio::time::Instant;

use super::PING_TIMEOUT;

/// Why a forwarded call failed.
pub(super) enum CallFailure {
    TimedOut(Duration),
    Service(ServiceError),
}

impl CallFailure {
    pub(super) fn message(&self, slug: &str) -> String {
        match self {
            CallFailure::TimedOut(timeout) => format!(
                "upstream MCP server `{slug}` did not answer within {}s",
                timeout.as_secs()
            ),
            CallFailure::Service(e) => {
                format!("upstream MCP server `{slug}`: {}", service_failure(e))
            }
        }
    }

    pub(super) fn tool_error(&self, slug: &str) -> ToolError {
        ToolError::Execution(self.message(slug))
    }

    /// Whether the server certainly did not run the call, so that sending it again
    /// on a new session cannot run it twice: the connection was refused, the
    /// session was unknown (404), or a bare ping got the very same rejection.
    pub(super) fn never_processed(&self, lost: &SessionLost) -> bool {
        let CallFailure::Service(call) = self else {
            return false;
        };
        match call {
            ServiceError::TransportSend(e) => match http_error(e) {
                Some(StreamableHttpError::SessionExpired) => true,
                Some(StreamableHttpError::Client(e)) => e.is_connect(),
                // A 4xx that is not JSON-RPC.
                Some(StreamableHttpError::UnexpectedServerResponse(_)) => {
                    same_rejection(call, lost)
                }
                _ => false,
            },
            ServiceError::McpError(_) => same_rejection(call, lost),
            _ => false,
        }
    }
}

/// Whether a ping, which runs nothing, was refused just as the call was: then the
/// refusal was about the session, not the call.
fn same_rejection(call: &ServiceError, lost: &SessionLost) -> bool {
    matches!(lost, SessionLost::Failed(ping) if service_failure(ping) == service_failure(call))
}

fn http_error(error: &DynamicTransportError) -> Option<&StreamableHttpError<reqwest::Error>> {
    error.error.downcast_ref()
}

pub(super) async fn send_call(
    peer: &Peer<RoleClient>,
    request: CallToolRequestParams,
    deadline: Instant,
    timeout: Duration,
) -> Result<CallToolResult, CallFailure> {
    match tokio::time::timeout_at(deadline, peer.call_tool(request)).await {
        Err(_) => Err(CallFailure::TimedOut(timeout)),
        Ok(result) => result.map_err(CallFailure::Service),
    }
}

/// Why a session is considered gone.
pub(super) enum SessionLost {
    Silent,
    Failed(ServiceError),
}

impl std::fmt::Display for SessionLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionLost::Silent => write!(f, "no answer to ping in {}s", PING_TIMEOUT.as_secs()),
            SessionLost::Failed(e) => write!(f, "ping failed: {}", service_failure(e)),
        }
    }
}

pub(super) fn initialize_failure(error: &ClientInitializeError) -> String {
    match error {
        ClientInitializeError::TransportError { error, .. } => transport_failure(error),
        ClientInitializeError::JsonRpcError(e) => format!("{} (code {})", e.message, e.code.0),
        other => other.to_string(),
    }
}

pub(super) fn service_failure(error: &ServiceError) -> String {
    match error {
        ServiceError::McpError(e) => format!("{} (code {})", e.message, e.code.0),
        ServiceError::TransportSend(e) => transport_failure(e),
        other => other.to_string(),
    }
}

/// A transport failure in words to act on: rmcp's own text names the transport's
/// Rust type and leaves out the cause (a refused connection, an unknown host).
fn transport_failure(error: &DynamicTransportError) -> String {
    match http_error(error) {
        Some(StreamableHttpError::Client(e)) if e.is_connect() => {
            format!("cannot connect ({})", root_cause(e))
        }
        Some(StreamableHttpError::Client(e)) if e.is_timeout() => "the request timed out".into(),
        Some(StreamableHttpError::Client(e)) => format!("HTTP request failed ({})", root_cause(e)),
        Some(StreamableHttpError::AuthRequired(_) | StreamableHttpError::InsufficientScope(_)) => {
            "the server refused the credentials (HTTP 401/403); check `headers`".into()
        }
        Some(other) => other.to_string(),
        None => root_cause(error.error.as_ref()),
    }
}

fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut error = error;
    while let Some(source) = error.source() {
        error = source;
    }
    error.to_string()
}

/// Whether the server still answers on this session. One that does not know
/// `ping` did answer.
pub(super) async fn check_session(peer: &Peer<RoleClient>) -> Result<(), SessionLost> {
    let ping = peer.send_request(ClientRequest::PingRequest(PingRequest::default()));
    match tokio::time::timeout(PING_TIMEOUT, ping).await {
        Err(_) => Err(SessionLost::Silent),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(ServiceError::McpError(e))) if e.code == ErrorCode::METHOD_NOT_FOUND => Ok(()),
        Ok(Err(e)) => Err(SessionLost::Failed(e)),
    }
}

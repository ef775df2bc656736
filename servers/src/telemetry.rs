//! OpenTelemetry traces (issue 40), off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) names a collector: then the spans of
//! [`TARGET`] (the HTTP request, the routing decision, each tool call, each upstream
//! MCP call, each model call) go to it as OTLP over HTTP/protobuf, in batches, from
//! the exporter's own thread. The standard `OTEL_*` variables tune the exporter
//! (headers, timeout, `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_SERVICE_NAME`).
//!
//! Off, nothing here runs on a request: the spans' callsites are disabled (no layer
//! wants them at the log filter's default level) and [`enabled`] keeps the
//! `traceparent` work away.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The target of every span that is exported; nothing else is.
pub const TARGET: &str = "loadout::otel";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported (a collector is configured).
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The collector's endpoint, when the environment names one.
pub fn endpoint() -> Option<String> {
    [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .filter_map(|name| std::env::var(name).ok())
    .map(|value| value.trim().to_owned())
    .find(|value| !value.is_empty())
}

/// The exporter, kept to flush what is queued at exit.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Sends the spans still queued (bounded by the exporter's own timeout).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("loadout: OpenTelemetry: spans not flushed at exit: {e}");
        }
    }
}

/// The tracing layer that exports [`TARGET`]'s spans, and its [`Telemetry`];
/// `None` without an endpoint. Built outside the async runtime (the blocking HTTP
/// client starts a runtime of its own).
pub fn layer<S>() -> anyhow::Result<Option<(impl tracing_subscriber::Layer<S> + 'static, Telemetry)>>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    if endpoint().is_none() {
        return Ok(None);
    }
    // reqwest is built without a TLS provider of its own (see Cargo.toml); an
    // `https` collector needs one installed before the client is built.
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| anyhow::anyhow!("OpenTelemetry: the OTLP exporter was not built: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(
            std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "loadout".to_owned()),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("loadout"))
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            meta.target() == TARGET
        }));
    ENABLED.store(true, Ordering::Relaxed);
    Ok(Some((layer, Telemetry { provider })))
}

/// Makes `span` a child of the W3C `traceparent` (and `tracestate`) a caller sent;
/// a missing or malformed one leaves it a root.
pub fn set_remote_parent(span: &tracing::Span, traceparent: &str, tracestate: Option<&str>) {
    if !enabled() {
        return;
    }
    let mut carrier = HashMap::with_capacity(2);
    carrier.insert("traceparent".to_owned(), traceparent.to_owned());
    if let Some(state) = tracestate {
        carrier.insert("tracestate".to_owned(), state.to_owned());
    }
    let cx = TraceContextPropagator::new().extract(&carrier);
    if opentelemetry::trace::TraceContextExt::span(&cx)
        .span_context()
        .is_valid()
    {
        // Fails only for a span no layer records, which then has no parent to take.
        let _ = span.set_parent(cx);
    }
}

/// [`set_remote_parent`] from an HTTP request's headers.
pub fn set_parent_from_headers(span: &tracing::Span, headers: &axum::http::HeaderMap) {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(traceparent) = header("traceparent") {
        set_remote_parent(span, traceparent, header("tracestate"));
    }
}

/// The W3C `traceparent` of `span`, to pass on to a server it calls; `None` when
/// nothing is exported.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    if !enabled() {
        return None;
    }
    let mut carrier: HashMap<String, String> = HashMap::with_capacity(2);
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier.remove("traceparent")
}

/// axum middleware: one server span per HTTP request (method, route, status), a
/// child of the caller's `traceparent` when it sent one. Off, the request passes
/// untouched.
pub async fn trace_request(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use tracing::Instrument as _;
    if !enabled() {
        return next.run(request).await;
    }
    let method = request.method().as_str().to_owned();
    // The matched route (`/api/sessions/{id}`), not the path: ids stay out of names.
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| request.uri().path().chars().take(128).collect());
    let span = tracing::info_span!(
        target: TARGET,
        "http.request",
        otel.name = %format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    set_parent_from_headers(&span, request.headers());
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}

/// The span of one tool call (chat, MCP): `gen_ai.tool.name`, and at its end the
/// audit's outcome ([`end_tool_span`]). Its duration is the span's own.
pub fn tool_span(tool: &str) -> tracing::Span {
    if !enabled() {
        return tracing::Span::none();
    }
    let tool: String = tool.chars().take(128).collect();
    tracing::info_span!(
        target: TARGET,
        "gen_ai.execute_tool",
        otel.name = %format!("execute_tool {tool}"),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %tool,
        loadout.tool.outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    )
}

/// Records a tool call's outcome (as the audit names it) on its span.
pub fn end_tool_span(span: &tracing::Span, outcome: &str) {
    span.record("loadout.tool.outcome", outcome);
    if outcome != "ok" {
        span.record("otel.status_code", "ERROR");
    }
}

/// The client span of one call to an upstream MCP server's tool.
pub fn upstream_span(server: &str, tool: &str) -> tracing::Span {
    tracing::info_span!(
        target: TARGET,
        "mcp.client.call",
        otel.name = %format!("tools/call {tool}"),
        otel.kind = "client",
        mcp.method.name = "tools/call",
        gen_ai.tool.name = %tool,
        loadout.upstream.server = %server,
    )
}

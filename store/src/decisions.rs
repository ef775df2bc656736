//! The decision log's rows: one per routed message, with what the router decided and
//! why, as plain data its callers fill (the server from a router's selection), kept as
//! JSON by both backends.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One routing decision, as the decision log keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DecisionRow {
    pub at_ms: i64,
    pub session: Option<String>,
    pub turn: i64,
    /// The message, or `sha256:` and its hash when [`MessageLogging::Sha256`].
    pub message: String,
    pub n_tools: i64,
    pub tokens: i64,
    pub reasons: Reasons,
}

/// Whether the decision log keeps the message or only its hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MessageLogging {
    #[default]
    Plain,
    /// SHA-256 of the message, hex: the log can still group repeats without the text.
    Sha256,
}

impl MessageLogging {
    /// The message as the log keeps it.
    pub fn apply(self, message: &str) -> String {
        match self {
            MessageLogging::Plain => message.to_owned(),
            MessageLogging::Sha256 => format!("sha256:{}", sha256_hex(message)),
        }
    }
}

/// What a row keeps of a selection: the decision without what it would repeat from
/// one row to the next. Domains with no evidence go by name (`inactive`,
/// `unmatched`), domains left out with some similarity by name and score (`near`,
/// `no_tool_needed`), sent tools by name, and only the best [`LOGGED_NOT_SENT`]
/// tools that were ranked and not sent. Scores keep 3 decimals.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Reasons {
    /// Domains that are sent, or have a stage of their own (sticky, unloaded,
    /// trimmed, collision…), or are inactive with some similarity.
    pub domains: Vec<DomainReason>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inactive: Vec<String>,
    /// Active domains not sent, with no evidence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmatched: Vec<String>,
    /// Active domains not sent with some similarity, below the gates: their scores.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub near: BTreeMap<String, f64>,
    /// Chit-chat: domains left out, with their scores.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub no_tool_needed: BTreeMap<String, f64>,
    pub tools: Vec<String>,
    /// The best tools ranked one by one and not sent, best first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_sent: Vec<ToolReason>,
    /// How many more tools were ranked and not sent.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_sent_left_out: usize,
    #[serde(default)]
    pub hint_tokens: usize,
    #[serde(default)]
    pub all_tools_tokens: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DomainReason {
    pub domain: String,
    pub included: bool,
    pub stage: String,
    pub score: f64,
    pub reason: String,
}

/// `[tool, domain, stage, score]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolReason(pub String, pub String, pub String, pub f64);

/// Most tools ranked and not sent that a row names: the near misses. On a catalog of
/// thousands of tools a selection ranks out hundreds; the rest are counted.
pub const LOGGED_NOT_SENT: usize = 40;

impl Reasons {
    /// Reasons read back from storage; text that is not reasons reads as empty ones.
    pub fn from_json(text: &str) -> Reasons {
        serde_json::from_str(text).unwrap_or_else(|e| {
            tracing::warn!("decision-log reasons unreadable: {e}");
            Reasons::default()
        })
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

pub fn sha256_hex(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_hash_is_hex_sha256() {
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(MessageLogging::Plain.apply("hi"), "hi");
        assert!(MessageLogging::Sha256.apply("hi").starts_with("sha256:"));
    }

    #[test]
    fn unreadable_reasons_read_as_empty_ones() {
        assert_eq!(Reasons::from_json("not json"), Reasons::default());
        let reasons = Reasons {
            tools: vec!["a".into()],
            near: [("x".to_owned(), 0.25)].into(),
            ..Reasons::default()
        };
        assert_eq!(Reasons::from_json(&reasons.to_json()), reasons);
    }
}

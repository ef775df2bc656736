//! What the router returns: the tools to send, hints for the rest, and why.

use std::borrow::Cow;
use std::sync::Arc;

use loadout::Registry;
use serde::Serialize;
use serde_json::Value;

/// Why a domain or tool is in or out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Stage {
    /// Core or `always_on`: sent on every turn.
    AlwaysOn,
    /// A settings key has no value; never sent.
    Inactive,
    /// Used in this session within the idle window.
    Sticky,
    /// Mid-workflow state keeps it for the session.
    Pinned,
    /// A keyword of the domain or tool is in the message.
    Keyword,
    /// Lexical similarity.
    Bm25,
    /// Embedding similarity.
    Dense,
    /// Lexical and dense rankings fused.
    Fused,
    /// Sent last turn on the message's own evidence, carried over for a follow-up that
    /// has none (`yes do it`).
    Carried,
    /// Loaded by a meta-tool (`load_tools`, `load_all_for_this_turn`).
    Loaded,
    /// Unloaded by a meta-tool; kept out until used or loaded again.
    Unloaded,
    /// Dropped to keep the selection under the token budget.
    BudgetTrimmed,
    /// Dropped because a conflicting tool or domain scored better.
    Collision,
    /// The message needs no tool (chit-chat); only core is sent.
    NoToolNeeded,
    /// A destructive tool held back: nothing in the message asked for its action.
    NoDirectEvidence,
    /// Active, but nothing in the message or session pointed at it.
    NotMatched,
    /// Sent by the fitted scorer's probability (see `scorer`).
    Scored,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::AlwaysOn => "always_on",
            Stage::Inactive => "inactive",
            Stage::Sticky => "sticky",
            Stage::Pinned => "pinned",
            Stage::Keyword => "keyword",
            Stage::Bm25 => "bm25",
            Stage::Dense => "dense",
            Stage::Fused => "fused",
            Stage::Carried => "carried",
            Stage::Loaded => "loaded",
            Stage::Unloaded => "unloaded",
            Stage::BudgetTrimmed => "budget_trimmed",
            Stage::Collision => "collision",
            Stage::NoToolNeeded => "no_tool_needed",
            Stage::NoDirectEvidence => "no_direct_evidence",
            Stage::NotMatched => "not_matched",
            Stage::Scored => "scored",
        }
    }

    /// Stages whose score means something to a reader of the summary line.
    fn shows_score(self) -> bool {
        matches!(
            self,
            Stage::Keyword | Stage::Bm25 | Stage::Dense | Stage::Fused | Stage::Scored
        )
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, so that `{:<10}` lines up a table (`loadout route`).
        f.pad(self.as_str())
    }
}

/// A tool, domain or hint text shared with the router's tables: selections clone a
/// pointer, not the text, so routing does not allocate per tool.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(Arc<str>);

impl Name {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Name {
    fn from(text: &str) -> Self {
        Name(Arc::from(text))
    }
}

impl std::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&self.0)
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// The router's verdict on one domain.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DomainDecision {
    pub domain: Name,
    /// At least one of its tools is sent.
    pub included: bool,
    pub stage: Stage,
    /// Its likeliest tool's probability when the scorer weighed it; else the
    /// evidence of the stage that decided it, 0..1 (1 for always-on).
    pub score: f32,
    pub reason: Cow<'static, str>,
}

/// A tool held back one by one: by the budget, a collision or the destructive rule.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolDecision {
    pub tool: Name,
    pub domain: Name,
    /// What held it back.
    pub stage: Stage,
    pub score: f32,
    #[serde(skip)]
    pub(crate) tool_idx: usize,
}

/// A tool whose definition is sent this turn.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SelectedTool {
    pub name: Name,
    pub domain: Name,
    pub stage: Stage,
    pub score: f32,
    /// Tokens of its OpenAI-format definition.
    pub tokens: usize,
    /// The features that raised its probability most; none for a tool the scorer did
    /// not weigh (core's) or whose row raised nothing.
    #[serde(skip_serializing_if = "Why::is_empty")]
    pub why: Why,
    #[serde(skip)]
    pub(crate) tool_idx: usize,
}

/// Up to three features that raised a tool's logit most, largest first, with their
/// values: `tool_dense_rel 1.00, tool_bm25_rank 0.50`. Kept as indices and values,
/// written only when read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Why {
    n: u8,
    parts: [(u8, f32); 3],
}

impl Why {
    pub(crate) fn new(parts: impl IntoIterator<Item = (usize, f32)>) -> Why {
        let mut why = Why::default();
        for (slot, (feature, value)) in why.parts.iter_mut().zip(parts) {
            *slot = (feature as u8, value);
            why.n += 1;
        }
        why
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Each feature's name and value, largest contribution first.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, f32)> + '_ {
        self.parts[..usize::from(self.n)]
            .iter()
            .map(|&(feature, value)| (crate::scorer::FEATURES[usize::from(feature)], value))
    }

    /// Writes `tool_dense_rel 1.00, tool_bm25_rank 0.50` after `out`: the words a
    /// domain's reason and the `Display` of a sent tool share.
    pub(crate) fn push_to(&self, out: &mut String) {
        for (i, (name, value)) in self.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(name);
            out.push(' ');
            crate::scorer::push_two_decimals(out, value);
        }
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = String::new();
        self.push_to(&mut text);
        f.write_str(&text)
    }
}

/// `{"tool_dense_rel": 1.0, ...}`, written largest contribution first.
impl Serialize for Why {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = serializer.serialize_map(Some(usize::from(self.n)))?;
        for (name, value) in self.iter() {
            map.serialize_entry(name, &value)?;
        }
        map.end()
    }
}

/// A domain that is not configured but fits the message at least as well as what was
/// sent (scored by the same stages): the model is told, so it can ask the user for
/// the settings, e.g. `weather (not configured: set openweathermap_api_key)`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Unconfigured {
    pub domain: Name,
    /// The settings keys it still needs.
    pub missing_settings: Vec<String>,
    /// The stage whose evidence it has (keyword, bm25, dense, fused).
    pub stage: Stage,
    pub score: f32,
}

impl std::fmt::Display for Unconfigured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&not_configured(&self.domain, &self.missing_settings))
    }
}

/// `weather (not configured: set openweathermap_api_key)`: how a domain that needs
/// settings is named to the user and the model.
pub fn not_configured(domain: &str, missing: &[String]) -> String {
    format!("{domain} (not configured: set {})", missing.join(", "))
}

/// The compact line shown for an active tool that is not sent: enough for the model to
/// ask for it with `load_tools`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Hint {
    pub name: Name,
    pub domain: Name,
    /// First sentence of the description.
    pub hint: Name,
}

impl Hint {
    pub fn to_json(&self) -> Value {
        serde_json::json!({"name": self.name, "domain": self.domain, "hint": self.hint})
    }
}

/// Everything the router decided for one message.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Selection {
    /// Sent definitions: core first, then by descending score.
    pub tools: Vec<SelectedTool>,
    /// Active tools of considered domains that are not sent, best first.
    pub hints: Vec<Hint>,
    /// One per domain, in registry order.
    pub domains: Vec<DomainDecision>,
    /// Tools held back one by one: by the budget, a collision or the destructive rule.
    pub tool_decisions: Vec<ToolDecision>,
    /// Tokens of the sent definitions.
    pub tokens: usize,
    /// Tokens of the hints, as compact JSON.
    pub hint_tokens: usize,
    /// Tokens of every tool's definition in the registry: what sending everything costs.
    pub all_tools_tokens: usize,
    /// The budget this selection was trimmed to.
    pub token_budget: usize,
    pub n_tools: usize,
    /// Tools of active domains: what the reference "send every active tool" rule sends.
    pub n_active_tools: usize,
    /// Unconfigured domains that fit the message at least as well as what was sent,
    /// best first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unconfigured: Vec<Unconfigured>,
    /// Notes about how the selection was made (e.g. the dense stage failing).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Selection {
    /// Whether a tool's definition is sent this turn.
    pub fn contains(&self, tool: &str) -> bool {
        self.tools.iter().any(|t| t.name == tool)
    }

    pub fn tool_names(&self) -> impl Iterator<Item = &str> {
        self.tools.iter().map(|t| t.name.as_str())
    }

    /// The decision for one domain.
    pub fn domain(&self, name: &str) -> Option<&DomainDecision> {
        self.domains.iter().find(|d| d.domain == name)
    }

    /// The one-line trace, e.g.
    /// `[router] 18/35 tools, 2,140 tokens | weather(keyword:1.00) calendar(bm25:0.52) scratchpad(sticky)`.
    /// Lists the included domains other than always-on ones, best first.
    pub fn summary_line(&self) -> String {
        let mut line = format!(
            "[router] {}/{} tools, {} tokens |",
            self.n_tools,
            self.n_active_tools,
            thousands(self.tokens)
        );
        let mut shown: Vec<&DomainDecision> = self
            .domains
            .iter()
            .filter(|d| d.included && d.stage != Stage::AlwaysOn)
            .collect();
        shown.sort_by(|a, b| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| a.domain.cmp(&b.domain))
        });
        if shown.is_empty() {
            line.push_str(" core only");
        }
        for decision in shown {
            if decision.stage.shows_score() {
                line.push_str(&format!(
                    " {}({}:{:.2})",
                    decision.domain, decision.stage, decision.score
                ));
            } else {
                line.push_str(&format!(" {}({})", decision.domain, decision.stage));
            }
        }
        for unconfigured in &self.unconfigured {
            line.push_str(&format!(" | {unconfigured}"));
        }
        line
    }

    /// The sent tools as OpenAI function definitions.
    pub fn tools_openai(&self, registry: &Registry) -> Vec<Value> {
        self.tools
            .iter()
            .filter_map(|t| {
                registry
                    .all_tools()
                    .get(t.tool_idx)
                    .filter(|tool| t.name == tool.name)
            })
            .map(loadout::export::openai)
            .collect()
    }
}

/// `2140` → `2,140`.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(2140), "2,140");
        assert_eq!(thousands(1234567), "1,234,567");
    }
}

//! What the router returns: the tools to send, hints for the rest, and why.

use std::borrow::Cow;
#[cfg(test)]
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::logged::LogNames;
use crate::Registry;
use crate::store::{DecisionRow, Reasons};

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
    /// Used by some session in the last 24 h: preferred when falling back.
    Warm,
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
    /// Nothing optional matched: the fallback rule sent it.
    Fallback,
    /// Below the similarity gates, but among the nearest, and the selection had room
    /// (see `RouterConfig::backfill_tokens`).
    Backfill,
    /// Finds the ids a sent tool of its domain requires (`list_series` for
    /// `delete_series(series_id)`).
    Prerequisite,
    /// Takes what a tool called this turn or the last found (`install_app` after
    /// `search_app_store`).
    NextStep,
    /// Loaded by a meta-tool (`load_tools`, `load_all_for_this_turn`).
    Loaded,
    /// Unloaded by a meta-tool; kept out until used or loaded again.
    Unloaded,
    /// Ranked inside a selected domain: sent when among the best, hinted otherwise.
    Ranked,
    /// Dropped to keep the selection under the token budget.
    BudgetTrimmed,
    /// Dropped because a conflicting tool or domain scored better.
    Collision,
    /// The message needs no tool (chit-chat); only core is sent.
    NoToolNeeded,
    /// Active, but nothing in the message or session pointed at it.
    NotMatched,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::AlwaysOn => "always_on",
            Stage::Inactive => "inactive",
            Stage::Sticky => "sticky",
            Stage::Pinned => "pinned",
            Stage::Warm => "warm",
            Stage::Keyword => "keyword",
            Stage::Bm25 => "bm25",
            Stage::Dense => "dense",
            Stage::Fused => "fused",
            Stage::Carried => "carried",
            Stage::Prerequisite => "prerequisite",
            Stage::NextStep => "next_step",
            Stage::Fallback => "fallback",
            Stage::Backfill => "backfill",
            Stage::Loaded => "loaded",
            Stage::Unloaded => "unloaded",
            Stage::Ranked => "ranked",
            Stage::BudgetTrimmed => "budget_trimmed",
            Stage::Collision => "collision",
            Stage::NoToolNeeded => "no_tool_needed",
            Stage::NotMatched => "not_matched",
        }
    }

    /// The stage's byte in a compact decision-log row. Fixed for good: rows written
    /// by older binaries are read with it. Below 64 (the row's flags take two bits).
    pub(crate) fn code(self) -> u8 {
        match self {
            Stage::AlwaysOn => 0,
            Stage::Inactive => 1,
            Stage::Sticky => 2,
            Stage::Pinned => 3,
            Stage::Warm => 4,
            Stage::Keyword => 5,
            Stage::Bm25 => 6,
            Stage::Dense => 7,
            Stage::Fused => 8,
            Stage::Carried => 9,
            Stage::Prerequisite => 10,
            Stage::NextStep => 11,
            Stage::Fallback => 12,
            Stage::Backfill => 13,
            Stage::Loaded => 14,
            Stage::Unloaded => 15,
            Stage::Ranked => 16,
            Stage::BudgetTrimmed => 17,
            Stage::Collision => 18,
            Stage::NoToolNeeded => 19,
            Stage::NotMatched => 20,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.code() == code)
    }

    pub(crate) const ALL: [Stage; 21] = [
        Stage::AlwaysOn,
        Stage::Inactive,
        Stage::Sticky,
        Stage::Pinned,
        Stage::Warm,
        Stage::Keyword,
        Stage::Bm25,
        Stage::Dense,
        Stage::Fused,
        Stage::Carried,
        Stage::Prerequisite,
        Stage::NextStep,
        Stage::Fallback,
        Stage::Backfill,
        Stage::Loaded,
        Stage::Unloaded,
        Stage::Ranked,
        Stage::BudgetTrimmed,
        Stage::Collision,
        Stage::NoToolNeeded,
        Stage::NotMatched,
    ];

    /// Stages whose score means something to a reader of the summary line.
    fn shows_score(self) -> bool {
        matches!(
            self,
            Stage::Keyword | Stage::Bm25 | Stage::Dense | Stage::Fused | Stage::Fallback
        )
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
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

    /// The same text: the same pointer (a router's own names), or equal text.
    pub(crate) fn same(&self, other: &Name) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
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
        f.write_str(&self.0)
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
    /// Strength of the evidence, 0..1 (keyword and similarity stages; 0 otherwise).
    pub score: f32,
    pub reason: Cow<'static, str>,
}

/// The router's verdict on one tool of a domain it ranked tool by tool.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolDecision {
    pub tool: Name,
    pub domain: Name,
    pub included: bool,
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
    #[serde(skip)]
    pub(crate) tool_idx: usize,
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

/// Whether the decision log keeps the message or only its hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MessageLogging {
    #[default]
    Plain,
    /// SHA-256 of the message, hex: the log can still group repeats without keeping text.
    Sha256,
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
    /// Tools of domains ranked tool by tool (large domains, budget trimming, collisions).
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
    /// Notes about how the selection was made (e.g. the dense stage failing).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The names of the router that made it, which its compact decision-log row
    /// refers to by index.
    #[serde(skip)]
    pub(crate) log_names: Option<Arc<LogNames>>,
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
            .map(crate::export::openai)
            .collect()
    }

    /// The decision-log row for this selection. `at_ms` is passed in so the router
    /// stays free of clocks. The reasons are written here, on the request's thread
    /// (about 2 µs on the shared catalog): the row used to share the selection and
    /// have the log thread write them and free it, but a selection is hundreds of
    /// small blocks that the request threads allocated, and the log thread freeing
    /// a batch of them every 50 ms raised `/api/route`'s p99 with the log on (paired
    /// rounds, lazy vs written here: one-off 1.33×/2.16× vs 0.86×/0.80× on/off,
    /// sessions 2.94×/2.15× vs 1.82×/1.58×). A queued row also holds only its text.
    pub fn decision_row(
        &self,
        session: Option<&str>,
        turn: i64,
        message: &str,
        logging: MessageLogging,
        at_ms: i64,
    ) -> DecisionRow {
        let message = match logging {
            MessageLogging::Plain => message.to_owned(),
            MessageLogging::Sha256 => format!("sha256:{}", sha256_hex(message)),
        };
        DecisionRow {
            at_ms,
            session: session.map(str::to_owned),
            turn,
            message,
            n_tools: self.n_tools as i64,
            tokens: self.tokens as i64,
            reasons: Reasons::of_selection(self),
        }
    }
}

impl Selection {
    /// The decision log's `reasons` as JSON (see [`LoggedReasons`] for what it keeps),
    /// written by hand: through serde it took about a quarter of a lexical
    /// selection's time, half of it escaping keys and identifiers that never need it,
    /// a fifth formatting floats. Same JSON as serializing [`LoggedReasons`] (test).
    /// Rows of a router's own selections are made compact instead (see
    /// [`super::logged`]) and read back as this JSON.
    pub(crate) fn write_logged_reasons(&self, out: &mut String) {
        self.logged_view().write_json(out);
    }
}

/// Most tools decided one by one and not sent that a decision-log row names, best
/// first: the near misses. On a catalog of thousands of tools a selection ranks out
/// hundreds (Seal-Tools: 540 in a row of 72 kB); the rest are counted.
pub const LOGGED_NOT_SENT: usize = 40;

/// Where a domain goes in a decision-log row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LoggedAs {
    /// An object with stage, score and reason.
    Full,
    /// Its name in `inactive`: no settings, no evidence.
    Inactive,
    /// Its name in `unmatched`: active, no evidence at all.
    Unmatched,
    /// Name and score in `near`: active, not sent, some similarity but below the
    /// gates. Its reason (which numbers fell short of which gate) is what `loadout
    /// route` and `loadout replay` recompute from the message.
    Near,
    /// Name and score in `no_tool_needed`: chit-chat sends core only.
    NoToolNeeded,
}

pub(super) fn logged_as(included: bool, stage: Stage, score: f32) -> LoggedAs {
    match stage {
        _ if included => LoggedAs::Full,
        Stage::Inactive if score <= 0.0 => LoggedAs::Inactive,
        Stage::NotMatched if score > 0.0 => LoggedAs::Near,
        Stage::NotMatched => LoggedAs::Unmatched,
        Stage::NoToolNeeded => LoggedAs::NoToolNeeded,
        _ => LoggedAs::Full,
    }
}

impl Selection {
    /// The tools a row names among those decided one by one and not sent (best
    /// score first, ties in tool order), and how many more there were.
    pub(super) fn logged_not_sent(&self) -> (Vec<&ToolDecision>, usize) {
        let mut not_sent: Vec<(usize, &ToolDecision)> = self
            .tool_decisions
            .iter()
            .filter(|d| !d.included)
            .enumerate()
            .collect();
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
}

/// `text` as a JSON string. Names and stages are printable ASCII with nothing to
/// escape and are copied as they are; anything else goes through serde_json.
pub(super) fn push_json_str(out: &mut String, text: &str) {
    // A fold without an early exit, so that it runs on whole vectors of bytes.
    let plain = text.bytes().fold(true, |plain, b| {
        plain & (0x20..0x7f).contains(&b) & (b != b'"') & (b != b'\\')
    });
    if plain {
        out.push('"');
        out.push_str(text);
        out.push('"');
    } else if let Ok(escaped) = serde_json::to_string(text) {
        out.push_str(&escaped);
    } else {
        out.push_str("\"\"");
    }
}

/// A score with 3 decimals, as serde_json writes the rounded `f64`: `0.6`, `1.0`,
/// `0.125`; `null` when it is not finite (serde_json's choice too).
pub(super) fn push_score(out: &mut String, score: f32) {
    let milli = (f64::from(score) * 1000.0).round();
    if !milli.is_finite() || milli.abs() >= 1e15 {
        out.push_str("null");
        return;
    }
    let milli = milli as i64;
    if milli < 0 {
        out.push('-');
    }
    let (whole, mut frac) = (milli.unsigned_abs() / 1000, milli.unsigned_abs() % 1000);
    out.push_str(itoa(whole as usize).as_str());
    out.push('.');
    if frac == 0 {
        out.push('0');
        return;
    }
    let mut digits = 3;
    while frac % 10 == 0 {
        frac /= 10;
        digits -= 1;
    }
    for shift in (0..digits).rev() {
        let digit = (frac / 10u64.pow(shift)) % 10;
        out.push(char::from(b'0' + digit as u8));
    }
}

/// A number's decimal digits without `format!`'s machinery.
pub(super) fn itoa(mut n: usize) -> ItoaBuf {
    let mut buf = ItoaBuf {
        bytes: [0; 20],
        start: 20,
    };
    loop {
        buf.start -= 1;
        buf.bytes[buf.start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return buf;
        }
    }
}

pub(super) struct ItoaBuf {
    bytes: [u8; 20],
    start: usize,
}

impl ItoaBuf {
    pub(super) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[self.start..]).unwrap_or("0")
    }
}

/// The decision log's `reasons` column, as serde would write it: the definition of
/// the format, which [`Selection::write_logged_reasons`] writes by hand and the tests
/// hold it to. The decision without what it would repeat from one row to the next,
/// since the log's bytes are what its writes cost: domains with no evidence go by
/// name (`inactive`, `unmatched`), domains left out with some similarity by name and
/// score (`near`, `no_tool_needed`), sent tools by name, only the best
/// [`LOGGED_NOT_SENT`] tools not sent, and scores keep 3 decimals. Lexical rows of
/// the labeled sets average 2.0 KB on the 262-tool shared catalog (3-8 KB with every
/// domain and ranked tool in full, 2.8 KB before `near`, `no_tool_needed` and
/// `not_sent`), 5.7 KB on MetaTool's 200 domains and 8.4 KB on Seal-Tools' 4,077
/// tools (72 KB before).
#[cfg(test)]
#[derive(Serialize)]
pub(super) struct LoggedReasons<'a> {
    /// Domains that are sent, or have a stage of their own (sticky, unloaded,
    /// trimmed, collision…), or are inactive with some similarity.
    domains: Vec<LoggedDomain<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    inactive: Vec<&'a str>,
    /// Active domains not sent, with no evidence (stage `not_matched`, score 0).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unmatched: Vec<&'a str>,
    /// Active domains not sent with some similarity, below the gates: their scores.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", serialize_with = "scores")]
    near: BTreeMap<&'a str, f32>,
    /// Chit-chat: domains left out, with their scores.
    #[serde(skip_serializing_if = "BTreeMap::is_empty", serialize_with = "scores")]
    no_tool_needed: BTreeMap<&'a str, f32>,
    tools: Vec<&'a str>,
    /// The best [`LOGGED_NOT_SENT`] tools decided one by one and not sent:
    /// `[tool, domain, stage, score]`, best first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    not_sent: Vec<LoggedTool<'a>>,
    #[serde(skip_serializing_if = "is_zero")]
    not_sent_left_out: usize,
    hint_tokens: usize,
    all_tools_tokens: usize,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    notes: &'a [String],
}

#[cfg(test)]
#[derive(Serialize)]
struct LoggedDomain<'a> {
    domain: &'a str,
    included: bool,
    stage: Stage,
    #[serde(serialize_with = "three_decimals")]
    score: f32,
    reason: &'a str,
}

#[cfg(test)]
#[derive(Serialize)]
struct LoggedTool<'a>(
    &'a str,
    &'a str,
    Stage,
    #[serde(serialize_with = "three_decimals")] f32,
);

#[cfg(test)]
fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[cfg(test)]
fn scores<S: serde::Serializer>(
    scores: &BTreeMap<&str, f32>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(
        scores
            .iter()
            .map(|(name, score)| (name, (f64::from(*score) * 1000.0).round() / 1000.0)),
    )
}

#[cfg(test)]
impl<'a> LoggedReasons<'a> {
    pub(super) fn new(selection: &'a Selection) -> LoggedReasons<'a> {
        let (not_sent, not_sent_left_out) = selection.logged_not_sent();
        let mut logged = LoggedReasons {
            domains: Vec::new(),
            inactive: Vec::new(),
            unmatched: Vec::new(),
            near: BTreeMap::new(),
            no_tool_needed: BTreeMap::new(),
            tools: selection.tools.iter().map(|t| t.name.as_str()).collect(),
            not_sent: not_sent
                .into_iter()
                .map(|d| LoggedTool(d.tool.as_str(), d.domain.as_str(), d.stage, d.score))
                .collect(),
            not_sent_left_out,
            hint_tokens: selection.hint_tokens,
            all_tools_tokens: selection.all_tools_tokens,
            notes: &selection.notes,
        };
        for d in &selection.domains {
            let name = d.domain.as_str();
            match logged_as(d.included, d.stage, d.score) {
                LoggedAs::Inactive => logged.inactive.push(name),
                LoggedAs::Unmatched => logged.unmatched.push(name),
                LoggedAs::Near => {
                    logged.near.insert(name, d.score);
                }
                LoggedAs::NoToolNeeded => {
                    logged.no_tool_needed.insert(name, d.score);
                }
                LoggedAs::Full => logged.domains.push(LoggedDomain {
                    domain: name,
                    included: d.included,
                    stage: d.stage,
                    score: d.score,
                    reason: &d.reason,
                }),
            }
        }
        logged
    }
}

#[cfg(test)]
fn three_decimals<S: serde::Serializer>(score: &f32, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64((f64::from(*score) * 1000.0).round() / 1000.0)
}

pub(super) fn sha256_hex(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
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

    #[test]
    fn every_stage_has_its_own_code_below_64() {
        let mut codes: Vec<u8> = Stage::ALL.iter().map(|s| s.code()).collect();
        for stage in Stage::ALL {
            assert!(stage.code() < 64, "{stage}");
            assert_eq!(Stage::from_code(stage.code()), Some(stage));
        }
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), Stage::ALL.len());
        assert_eq!(Stage::from_code(63), None);
    }

    #[test]
    fn message_hash_is_hex_sha256() {
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}

//! What a decision-log row keeps of a selection, and the compact form SQLite stores
//! it in.
//!
//! The JSON of a row's reasons (see [`Selection::write_logged_reasons`]) names every
//! domain and tool it mentions: about 1.8 KB a row on the shared catalog, and SQLite's
//! cost per row is mostly those bytes (`cargo xtask bench`: 5.2 µs a row, 1.0-1.9 µs
//! with empty reasons). The compact form refers to names by their index in the
//! router's [`LogNames`], which SQLite stores once beside the rows (`catalogs`), and
//! keeps the rest (stages, scores, reasons' text, counts) as they are. Readers get
//! the same JSON back: decoding writes it with the same writer.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::selection::{
    LoggedAs, Name, Selection, Stage, itoa, logged_as, push_json_str, push_score,
};

/// A router's names, which its selections and their decision-log rows refer to: its
/// tools (with the index of each one's domain) and its domains, in registry order.
pub struct LogNames {
    pub(super) tools: Vec<Name>,
    /// Per tool, the index of its domain.
    pub(super) tool_domains: Vec<usize>,
    pub(super) domains: Vec<Name>,
    stored: OnceLock<StoredNames>,
}

/// [`LogNames`] as a store keeps them: JSON, and its SHA-256 to find them by.
pub struct StoredNames {
    pub digest: String,
    pub json: String,
}

#[derive(Serialize, Deserialize)]
struct NamesJson<'a> {
    #[serde(borrow)]
    tools: Vec<std::borrow::Cow<'a, str>>,
    tool_domains: Vec<usize>,
    #[serde(borrow)]
    domains: Vec<std::borrow::Cow<'a, str>>,
}

impl LogNames {
    pub(crate) fn new(tools: Vec<Name>, tool_domains: Vec<usize>, domains: Vec<Name>) -> LogNames {
        LogNames {
            tools,
            tool_domains,
            domains,
            stored: OnceLock::new(),
        }
    }

    /// The names as stored, made once per router (on the log writer's thread).
    pub fn stored(&self) -> &StoredNames {
        self.stored.get_or_init(|| {
            let json = serde_json::to_string(&NamesJson {
                tools: self.tools.iter().map(|t| t.as_str().into()).collect(),
                tool_domains: self.tool_domains.clone(),
                domains: self.domains.iter().map(|d| d.as_str().into()).collect(),
            })
            .unwrap_or_default();
            StoredNames {
                digest: super::selection::sha256_hex(&json),
                json,
            }
        })
    }

    /// Names read back from a store; `None` when the text is not names as
    /// [`stored`](Self::stored) writes them.
    pub fn from_stored(json: &str) -> Option<LogNames> {
        let parsed: NamesJson<'_> = serde_json::from_str(json).ok()?;
        if parsed.tools.len() != parsed.tool_domains.len()
            || parsed
                .tool_domains
                .iter()
                .any(|&d| d >= parsed.domains.len())
        {
            return None;
        }
        Some(LogNames::new(
            parsed.tools.iter().map(|t| Name::from(&**t)).collect(),
            parsed.tool_domains,
            parsed.domains.iter().map(|d| Name::from(&**d)).collect(),
        ))
    }
}

impl PartialEq for LogNames {
    fn eq(&self, other: &LogNames) -> bool {
        std::ptr::eq(self, other)
            || (self.tools == other.tools
                && self.tool_domains == other.tool_domains
                && self.domains == other.domains)
    }
}

impl std::fmt::Debug for LogNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LogNames({} tools, {} domains)",
            self.tools.len(),
            self.domains.len()
        )
    }
}

/// What a row keeps of one domain. Every domain has one, in registry order.
pub(crate) struct DomainEntry<'a> {
    pub domain: &'a str,
    pub included: bool,
    pub stage: Stage,
    pub score: f32,
    pub reason: &'a str,
}

/// A tool decided one by one and not sent, among the best [`LOGGED_NOT_SENT`](super::selection::LOGGED_NOT_SENT).
pub(crate) struct ToolEntry<'a> {
    pub tool: &'a str,
    pub domain: &'a str,
    pub stage: Stage,
    pub score: f32,
}

/// What a decision-log row keeps of a selection: read from the selection, or decoded
/// from the compact form. [`write_json`](Self::write_json) writes the row's JSON.
pub(crate) struct LoggedView<'a> {
    pub domains: Vec<DomainEntry<'a>>,
    pub tools: Vec<&'a str>,
    pub not_sent: Vec<ToolEntry<'a>>,
    pub not_sent_left_out: usize,
    pub hint_tokens: usize,
    pub all_tools_tokens: usize,
    pub notes: Vec<&'a str>,
}

impl Selection {
    pub(crate) fn logged_view(&self) -> LoggedView<'_> {
        let (not_sent, not_sent_left_out) = self.logged_not_sent();
        LoggedView {
            domains: self
                .domains
                .iter()
                .map(|d| DomainEntry {
                    domain: d.domain.as_str(),
                    included: d.included,
                    stage: d.stage,
                    score: d.score,
                    reason: &d.reason,
                })
                .collect(),
            tools: self.tools.iter().map(|t| t.name.as_str()).collect(),
            not_sent: not_sent
                .into_iter()
                .map(|d| ToolEntry {
                    tool: d.tool.as_str(),
                    domain: d.domain.as_str(),
                    stage: d.stage,
                    score: d.score,
                })
                .collect(),
            not_sent_left_out,
            hint_tokens: self.hint_tokens,
            all_tools_tokens: self.all_tools_tokens,
            notes: self.notes.iter().map(String::as_str).collect(),
        }
    }

    /// Appends the compact form of the row's reasons to `out`, names as indices in
    /// `names`. `false` (and `out` holding part of a row) when the selection names
    /// something `names` does not have at that index: it was not made by the router
    /// those names are of, and its row is written as JSON.
    pub(crate) fn write_compact_reasons(&self, names: &LogNames, out: &mut Vec<u8>) -> bool {
        out.push(FORMAT);
        if self.domains.len() != names.domains.len() {
            return false;
        }
        push_varint(out, self.domains.len());
        for (d, name) in self.domains.iter().zip(&names.domains) {
            if !d.domain.same(name) {
                return false;
            }
            let zero = d.score.to_bits() == 0;
            out.push(d.stage.code() | (u8::from(d.included) << 7) | (u8::from(zero) << 6));
            if !zero {
                out.extend_from_slice(&d.score.to_le_bytes());
            }
            if logged_as(d.included, d.stage, d.score) == LoggedAs::Full {
                push_bytes(out, d.reason.as_bytes());
            }
        }
        push_varint(out, self.tools.len());
        for t in &self.tools {
            if !names.tools.get(t.tool_idx).is_some_and(|n| n.same(&t.name)) {
                return false;
            }
            push_varint(out, t.tool_idx);
        }
        let (not_sent, left_out) = self.logged_not_sent();
        push_varint(out, not_sent.len());
        for d in not_sent {
            let known = names.tools.get(d.tool_idx).is_some_and(|n| n.same(&d.tool))
                && names.domains[names.tool_domains[d.tool_idx]].same(&d.domain);
            if !known {
                return false;
            }
            push_varint(out, d.tool_idx);
            out.push(d.stage.code());
            out.extend_from_slice(&d.score.to_le_bytes());
        }
        push_varint(out, left_out);
        push_varint(out, self.hint_tokens);
        push_varint(out, self.all_tools_tokens);
        push_varint(out, self.notes.len());
        for note in &self.notes {
            push_bytes(out, note.as_bytes());
        }
        true
    }
}

/// The compact form's version, its first byte.
const FORMAT: u8 = 1;

fn push_varint(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn push_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    push_varint(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// Why compact reasons could not be read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Undecodable(&'static str);

impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, Undecodable> {
        let (&first, rest) = self.bytes.split_first().ok_or(Undecodable("cut short"))?;
        self.bytes = rest;
        Ok(first)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Undecodable> {
        if n > self.bytes.len() {
            return Err(Undecodable("cut short"));
        }
        let (taken, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(taken)
    }

    fn varint(&mut self) -> Result<usize, Undecodable> {
        let mut n: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return usize::try_from(n).map_err(|_| Undecodable("number too large"));
            }
        }
        Err(Undecodable("number too long"))
    }

    fn score(&mut self) -> Result<f32, Undecodable> {
        let bytes = self.take(4)?;
        Ok(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn text(&mut self) -> Result<&'a str, Undecodable> {
        let n = self.varint()?;
        std::str::from_utf8(self.take(n)?).map_err(|_| Undecodable("text not UTF-8"))
    }

    fn stage(&mut self, code: u8) -> Result<Stage, Undecodable> {
        Stage::from_code(code).ok_or(Undecodable("unknown stage"))
    }

    /// A count of items of at least `min_bytes` each: a count the bytes left cannot
    /// hold is refused before anything is allocated for it.
    fn count(&mut self, min_bytes: usize) -> Result<usize, Undecodable> {
        let n = self.varint()?;
        if n.saturating_mul(min_bytes) > self.bytes.len() {
            return Err(Undecodable("count beyond the bytes"));
        }
        Ok(n)
    }
}

impl<'a> LoggedView<'a> {
    /// Reads the compact form [`Selection::write_compact_reasons`] wrote, names from
    /// `names`.
    pub(crate) fn decode(
        bytes: &'a [u8],
        names: &'a LogNames,
    ) -> Result<LoggedView<'a>, Undecodable> {
        let mut r = Reader { bytes };
        if r.byte()? != FORMAT {
            return Err(Undecodable("unknown format"));
        }
        let n_domains = r.count(1)?;
        if n_domains != names.domains.len() {
            return Err(Undecodable("not as many domains as the names"));
        }
        let mut domains = Vec::with_capacity(n_domains);
        for name in &names.domains {
            let head = r.byte()?;
            let stage = r.stage(head & 0x3f)?;
            let included = head & 0x80 != 0;
            let score = if head & 0x40 != 0 { 0.0 } else { r.score()? };
            let reason = if logged_as(included, stage, score) == LoggedAs::Full {
                r.text()?
            } else {
                ""
            };
            domains.push(DomainEntry {
                domain: name.as_str(),
                included,
                stage,
                score,
                reason,
            });
        }
        let tool = |idx: usize| {
            names
                .tools
                .get(idx)
                .map(|t| (t.as_str(), names.domains[names.tool_domains[idx]].as_str()))
                .ok_or(Undecodable("tool index beyond the names"))
        };
        let n_tools = r.count(1)?;
        let mut tools = Vec::with_capacity(n_tools);
        for _ in 0..n_tools {
            tools.push(tool(r.varint()?)?.0);
        }
        let n_not_sent = r.count(6)?;
        let mut not_sent = Vec::with_capacity(n_not_sent);
        for _ in 0..n_not_sent {
            let (tool, domain) = tool(r.varint()?)?;
            let code = r.byte()?;
            not_sent.push(ToolEntry {
                tool,
                domain,
                stage: r.stage(code)?,
                score: r.score()?,
            });
        }
        let not_sent_left_out = r.varint()?;
        let hint_tokens = r.varint()?;
        let all_tools_tokens = r.varint()?;
        let n_notes = r.count(1)?;
        let mut notes = Vec::with_capacity(n_notes);
        for _ in 0..n_notes {
            notes.push(r.text()?);
        }
        if !r.bytes.is_empty() {
            return Err(Undecodable("bytes after the end"));
        }
        Ok(LoggedView {
            domains,
            tools,
            not_sent,
            not_sent_left_out,
            hint_tokens,
            all_tools_tokens,
            notes,
        })
    }

    /// The row's reasons as JSON (see `LoggedReasons` in the tests for the format).
    pub(crate) fn write_json(&self, out: &mut String) {
        out.push_str("{\"domains\":[");
        for (i, d) in self
            .domains
            .iter()
            .filter(|d| logged_as(d.included, d.stage, d.score) == LoggedAs::Full)
            .enumerate()
        {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"domain\":");
            push_json_str(out, d.domain);
            out.push_str(if d.included {
                ",\"included\":true,\"stage\":"
            } else {
                ",\"included\":false,\"stage\":"
            });
            push_json_str(out, d.stage.as_str());
            out.push_str(",\"score\":");
            push_score(out, d.score);
            out.push_str(",\"reason\":");
            push_json_str(out, d.reason);
            out.push('}');
        }
        out.push(']');
        // Left-out domains by name, the ones with some similarity with their score.
        for (key, kind, scored) in [
            ("inactive", LoggedAs::Inactive, false),
            ("unmatched", LoggedAs::Unmatched, false),
            ("near", LoggedAs::Near, true),
            ("no_tool_needed", LoggedAs::NoToolNeeded, true),
        ] {
            let mut group = self
                .domains
                .iter()
                .filter(|d| logged_as(d.included, d.stage, d.score) == kind)
                .peekable();
            if group.peek().is_none() {
                continue;
            }
            out.push_str(",\"");
            out.push_str(key);
            out.push_str(if scored { "\":{" } else { "\":[" });
            for (i, d) in group.enumerate() {
                if i > 0 {
                    out.push(',');
                }
                push_json_str(out, d.domain);
                if scored {
                    out.push(':');
                    push_score(out, d.score);
                }
            }
            out.push(if scored { '}' } else { ']' });
        }
        out.push_str(",\"tools\":");
        push_json_strs(out, &self.tools);
        if !self.not_sent.is_empty() {
            out.push_str(",\"not_sent\":[");
            for (i, d) in self.not_sent.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push('[');
                push_json_str(out, d.tool);
                out.push(',');
                push_json_str(out, d.domain);
                out.push(',');
                push_json_str(out, d.stage.as_str());
                out.push(',');
                push_score(out, d.score);
                out.push(']');
            }
            out.push(']');
        }
        if self.not_sent_left_out > 0 {
            out.push_str(",\"not_sent_left_out\":");
            out.push_str(itoa(self.not_sent_left_out).as_str());
        }
        out.push_str(",\"hint_tokens\":");
        out.push_str(itoa(self.hint_tokens).as_str());
        out.push_str(",\"all_tools_tokens\":");
        out.push_str(itoa(self.all_tools_tokens).as_str());
        if !self.notes.is_empty() {
            out.push_str(",\"notes\":");
            push_json_strs(out, &self.notes);
        }
        out.push('}');
    }
}

/// `texts` as a JSON array of strings.
fn push_json_strs(out: &mut String, texts: &[&str]) {
    out.push('[');
    for (i, text) in texts.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_json_str(out, text);
    }
    out.push(']');
}

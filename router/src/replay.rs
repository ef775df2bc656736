//! Replaying conversations through a router, turn by turn, and measuring what it sent:
//! recall of the tools each turn needed, tools and tokens sent, and every miss with
//! the router's reasons.
//!
//! One model for two sources: the labeled conversations of `cargo xtask eval` (JSON
//! lines, the format of the shared eval set) and the sessions a deployment stored
//! (`loadout replay`, where a turn needed the tools its model called). The session is
//! fed exactly as the server feeds it: the same [`SessionView`] updates (`begin_turn`,
//! `record_calls`), kept in memory instead of the store.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use loadout::Registry;

use crate::{
    LearnedEntry, LearnedIndex, MessageVectors, Name, RouteInput, Router, Selection, SessionView,
};

/// One conversation to replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    pub id: String,
    pub configured: Configured,
    pub turns: Vec<CaseTurn>,
    /// Why the case exists (labeled sets say what it tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// Which settings keys have values during the case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Configured {
    /// `"all"`: every settings key of every domain has a value.
    All(String),
    Keys(Vec<String>),
}

/// One user message and the tools it needed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseTurn {
    pub user: String,
    /// Tools that must be sent for this turn to count as a hit.
    pub needed: Vec<String>,
    /// Tools called this turn (fed into the session); default: `needed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub called: Option<Vec<String>>,
}

impl Case {
    /// The settings the case routes with: each configured key set to a placeholder.
    pub fn settings(&self, registry: &Registry) -> Result<BTreeMap<String, String>, String> {
        let keys: Vec<String> = match &self.configured {
            Configured::All(word) if word == "all" => return Ok(every_setting(registry)),
            Configured::All(word) => {
                return Err(format!(
                    "case {}: configured must be \"all\" or a list, got {word:?}",
                    self.id
                ));
            }
            Configured::Keys(keys) => keys.clone(),
        };
        Ok(keys.into_iter().map(|k| (k, "set".to_owned())).collect())
    }
}

/// Every settings key of `registry` set to a placeholder: every domain active.
pub fn every_setting(registry: &Registry) -> BTreeMap<String, String> {
    registry
        .domains()
        .iter()
        .flat_map(|d| {
            d.settings_keys
                .iter()
                .map(|k| (k.clone(), "set".to_owned()))
        })
        .collect()
}

/// What the turns of `cases` teach the learned stage: each turn's message with the
/// tools it called (`called`, else `needed`), for turns that called any, in order,
/// each conversation its own session.
pub fn learned_turns(cases: &[Case]) -> Vec<LearnedEntry> {
    cases
        .iter()
        .flat_map(|case| case.turns.iter().map(move |turn| (case, turn)))
        .filter_map(|(case, turn)| {
            let called = turn.called.as_ref().unwrap_or(&turn.needed);
            (!called.is_empty()).then(|| LearnedEntry {
                message: turn.user.clone(),
                tools: called.clone(),
                vector: None,
                session: Some(case.id.clone()),
            })
        })
        .collect()
}

/// `k` folds of `cases` by conversation: ids sorted, the i-th in fold `i % k`. Each
/// fold's cases are replayed with what the other folds teach, so that a labeled set
/// measures learning on conversations it did not learn from.
pub fn folds(cases: &[Case], k: usize) -> Vec<Vec<Case>> {
    let k = k.max(1);
    let mut order: Vec<&Case> = cases.iter().collect();
    order.sort_by(|a, b| a.id.cmp(&b.id));
    let mut folds = vec![Vec::new(); k];
    for (i, case) in order.into_iter().enumerate() {
        folds[i % k].push(case.clone());
    }
    folds
}

/// Every fold's cases but fold `f`'s: what fold `f` learns from.
pub fn all_but(folds: &[Vec<Case>], f: usize) -> Vec<Case> {
    folds
        .iter()
        .enumerate()
        .filter(|&(g, _)| g != f)
        .flat_map(|(_, cases)| cases.iter().cloned())
        .collect()
}

/// Cases from JSON lines (blank lines skipped); an error names the 1-based line.
pub fn cases_from_json_lines(text: &str) -> Result<Vec<Case>, String> {
    let mut cases = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let case =
            serde_json::from_str(line).map_err(|e| format!("line {}: not a case: {e}", n + 1))?;
        cases.push(case);
    }
    Ok(cases)
}

/// One turn whose needed tools were not all sent.
#[derive(Debug, Clone)]
pub struct Miss {
    pub case_id: String,
    /// 1-based.
    pub turn: usize,
    pub message: String,
    pub missing: Vec<String>,
    /// For each missing tool: its domain's decision and, when ranked, its rank.
    pub explanation: Vec<String>,
    pub summary: String,
}

/// What a replay measured.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub turns: usize,
    /// Turns where every needed tool was sent.
    pub hits: usize,
    pub needed: usize,
    pub needed_sent: usize,
    pub tools_per_turn: Vec<usize>,
    pub tokens_per_turn: Vec<usize>,
    pub hint_tokens: usize,
    pub all_tools_tokens: usize,
    pub misses: Vec<Miss>,
    /// Time spent in `Router::select`.
    pub route_time: Duration,
}

impl Report {
    /// Adds the figures of a replay of other cases over the same tools (the folds of
    /// one set).
    pub fn absorb(&mut self, other: Report) {
        self.turns += other.turns;
        self.hits += other.hits;
        self.needed += other.needed;
        self.needed_sent += other.needed_sent;
        self.tools_per_turn.extend(other.tools_per_turn);
        self.tokens_per_turn.extend(other.tokens_per_turn);
        self.hint_tokens += other.hint_tokens;
        self.all_tools_tokens = self.all_tools_tokens.max(other.all_tools_tokens);
        self.misses.extend(other.misses);
        self.route_time += other.route_time;
    }

    pub fn turn_recall(&self) -> f64 {
        ratio(self.hits, self.turns)
    }

    pub fn tool_recall(&self) -> f64 {
        ratio(self.needed_sent, self.needed)
    }

    pub fn mean_tools(&self) -> f64 {
        mean(&self.tools_per_turn)
    }

    pub fn p95_tools(&self) -> usize {
        p95(&self.tools_per_turn)
    }

    pub fn mean_tokens(&self) -> f64 {
        mean(&self.tokens_per_turn)
    }

    pub fn p95_tokens(&self) -> usize {
        p95(&self.tokens_per_turn)
    }

    /// Mean tokens as a percentage of sending every tool.
    pub fn mean_tokens_pct(&self) -> f64 {
        100.0 * self.mean_tokens() / self.all_tools_tokens.max(1) as f64
    }

    pub fn mean_hint_tokens(&self) -> f64 {
        self.hint_tokens as f64 / self.turns.max(1) as f64
    }

    pub fn mean_route_us(&self) -> f64 {
        self.route_time.as_secs_f64() * 1e6 / self.turns.max(1) as f64
    }

    /// The one-line summary both `cargo xtask eval` and `loadout replay` print.
    pub fn summary_line(&self) -> String {
        format!(
            "{}  route {:.0} us/turn (this build)",
            self.figures_line(),
            self.mean_route_us()
        )
    }

    /// [`Report::summary_line`] without the route time: what a fit writes, whose
    /// selections are timed apart from their scoring (see `fit.rs`).
    pub fn figures_line(&self) -> String {
        format!(
            "turns {}  turn_recall {:.3}  tool_recall {:.3}  mean_tools {:.1}  p95_tools {}  \
             mean_tokens {:.0} ({:.1}% of {})  p95_tokens {}  mean_hint_tokens {:.0}",
            self.turns,
            self.turn_recall(),
            self.tool_recall(),
            self.mean_tools(),
            self.p95_tools(),
            self.mean_tokens(),
            self.mean_tokens_pct(),
            self.all_tools_tokens,
            self.p95_tokens(),
            self.mean_hint_tokens(),
        )
    }

    /// The figures as JSON (what `--json` prints last).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "turns": self.turns,
            "hits": self.hits,
            "turn_recall": self.turn_recall(),
            "tool_recall": self.tool_recall(),
            "mean_tools": self.mean_tools(),
            "p95_tools": self.p95_tools(),
            "mean_tokens": self.mean_tokens(),
            "p95_tokens": self.p95_tokens(),
            "all_tools_tokens": self.all_tools_tokens,
            "mean_tokens_pct": self.mean_tokens_pct(),
            "misses": self.misses.len(),
        })
    }

    /// Each miss: the message, what was missing, the selection's summary and why.
    pub fn miss_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for miss in &self.misses {
            miss.write_lines("MISS", &mut lines);
        }
        lines
    }
}

impl Miss {
    fn write_lines(&self, label: &str, lines: &mut Vec<String>) {
        lines.push(format!(
            "{label} {} turn {}: {:?}\n  missing: {}\n  {}",
            self.case_id,
            self.turn,
            self.message,
            self.missing.join(", "),
            self.summary
        ));
        lines.extend(self.explanation.iter().map(|line| format!("    {line}")));
    }
}

/// Two replays of the same cases compared turn by turn: what a change of config
/// (or of tools) would break and what it would fix.
#[derive(Debug)]
pub struct Comparison<'a> {
    /// Turns the candidate misses and the baseline did not: the candidate's misses.
    pub now_missed: Vec<&'a Miss>,
    /// Turns the baseline missed and the candidate does not: the baseline's misses.
    pub now_hit: Vec<&'a Miss>,
}

impl<'a> Comparison<'a> {
    /// Compares `candidate` with `baseline`, replayed from the same cases.
    pub fn new(baseline: &'a Report, candidate: &'a Report) -> Comparison<'a> {
        let key = |m: &Miss| (m.case_id.clone(), m.turn);
        let missed_by = |report: &Report| -> std::collections::BTreeSet<(String, usize)> {
            report.misses.iter().map(key).collect()
        };
        let (before, after) = (missed_by(baseline), missed_by(candidate));
        Comparison {
            now_missed: candidate
                .misses
                .iter()
                .filter(|m| !before.contains(&key(m)))
                .collect(),
            now_hit: baseline
                .misses
                .iter()
                .filter(|m| !after.contains(&key(m)))
                .collect(),
        }
    }

    /// The turns that flipped, each with its message (and, for a new miss, why).
    pub fn lines(&self) -> Vec<String> {
        self.labelled_lines("NOW MISSED", "NOW HIT")
    }

    /// [`Comparison::lines`] with the labels of the new misses and the new hits.
    pub fn labelled_lines(&self, missed: &str, hit: &str) -> Vec<String> {
        let mut lines = Vec::new();
        for miss in &self.now_missed {
            miss.write_lines(missed, &mut lines);
        }
        for miss in &self.now_hit {
            lines.push(format!(
                "{hit} {} turn {}: {:?} (sends {})",
                miss.case_id,
                miss.turn,
                miss.message,
                miss.missing.join(", ")
            ));
        }
        lines
    }

    pub fn to_json(&self) -> serde_json::Value {
        let turns = |misses: &[&Miss]| -> Vec<serde_json::Value> {
            misses
                .iter()
                .map(|m| {
                    serde_json::json!({
                        "case": m.case_id, "turn": m.turn, "message": m.message,
                        "tools": m.missing,
                    })
                })
                .collect()
        };
        serde_json::json!({
            "now_missed": turns(&self.now_missed),
            "now_hit": turns(&self.now_hit),
        })
    }
}

/// A turn as the replay routed it, for callers that report more (e.g. `--verbose`).
pub struct Routed<'a> {
    pub case: &'a Case,
    /// 0-based.
    pub turn_idx: usize,
    pub settings: &'a BTreeMap<String, String>,
    /// The session as the turn was routed with it.
    pub session: &'a SessionView,
    pub selection: &'a Selection,
}

/// Replays `cases` through `router`; `on_turn` sees each routed turn. `vectors`: each
/// user message's vectors by its text (embedded beforehand by the caller, so that
/// the route time measured is the router's alone); a message without routes
/// lexically.
pub fn replay(
    router: &Router,
    cases: &[Case],
    token_budget: Option<usize>,
    learned: Option<&LearnedIndex>,
    vectors: Option<&HashMap<String, MessageVectors>>,
    on_turn: impl FnMut(&Routed<'_>),
) -> Result<Report, String> {
    let input = Replayed {
        cases,
        token_budget,
        learned,
        vectors,
    };
    replay_by(router, &input, |_, _, input| router.select(input), on_turn)
}

/// What [`replay_by`] replays, and with what.
pub(crate) struct Replayed<'c> {
    pub(crate) cases: &'c [Case],
    pub(crate) token_budget: Option<usize>,
    pub(crate) learned: Option<&'c LearnedIndex>,
    pub(crate) vectors: Option<&'c HashMap<String, MessageVectors>>,
}

/// [`replay`], each turn routed by `select(case index, turn index, input)`: the fit
/// routes the first turns of its cases from a scoring it keeps.
pub(crate) fn replay_by(
    router: &Router,
    replayed: &Replayed<'_>,
    mut select: impl FnMut(usize, usize, &RouteInput<'_>) -> Selection,
    mut on_turn: impl FnMut(&Routed<'_>),
) -> Result<Report, String> {
    let Replayed {
        cases,
        token_budget,
        learned,
        vectors,
    } = *replayed;
    let registry = router.registry();
    let mut report = Report {
        all_tools_tokens: router.all_tools_tokens(),
        ..Report::default()
    };
    for (case_idx, case) in cases.iter().enumerate() {
        let settings = case.settings(registry)?;
        let mut view = SessionView::new(0);
        let mut previous: Option<Selection> = None;
        for (turn_idx, turn) in case.turns.iter().enumerate() {
            view.begin_turn(turn_idx as i64 + 1, previous.as_ref());
            let input = RouteInput {
                message: &turn.user,
                settings: &settings,
                session: &view,
                token_budget,
                learned,
                vectors: vectors.and_then(|v| v.get(&turn.user)),
            };
            let routed_at = Instant::now();
            let selection = select(case_idx, turn_idx, &input);
            report.route_time += routed_at.elapsed();

            report.turns += 1;
            report.needed += turn.needed.len();
            let missing: Vec<String> = turn
                .needed
                .iter()
                .filter(|t| !selection.contains(t))
                .cloned()
                .collect();
            report.needed_sent += turn.needed.len() - missing.len();
            if missing.is_empty() {
                report.hits += 1;
            } else {
                report.misses.push(Miss {
                    case_id: case.id.clone(),
                    turn: turn_idx + 1,
                    message: turn.user.clone(),
                    explanation: explain(registry, &selection, &missing),
                    missing,
                    summary: selection.summary_line(),
                });
            }
            report.tools_per_turn.push(selection.n_tools);
            report.tokens_per_turn.push(selection.tokens);
            report.hint_tokens += selection.hint_tokens;
            on_turn(&Routed {
                case,
                turn_idx,
                settings: &settings,
                session: &view,
                selection: &selection,
            });

            let called = turn.called.as_ref().unwrap_or(&turn.needed);
            view.record_calls(router, called);
            previous = Some(selection);
        }
    }
    Ok(report)
}

/// For each missing tool: its domain's decision and, when it was held back one by
/// one, where it ranked in its domain.
fn explain(registry: &Registry, selection: &Selection, missing: &[String]) -> Vec<String> {
    let mut lines = Vec::new();
    for name in missing {
        let Some(tool) = registry.tool(name) else {
            lines.push(format!("{name}: not in the catalog"));
            continue;
        };
        let domain_line = match selection.domain(&tool.domain) {
            Some(d) => format!(
                "{name}: domain {} {} ({}:{:.2}) {}",
                d.domain,
                if d.included { "included" } else { "excluded" },
                d.stage,
                d.score,
                d.reason
            ),
            None => format!("{name}: domain {} has no decision", tool.domain),
        };
        lines.push(domain_line);
        if let Some(decision) = selection.tool_decisions.iter().find(|d| d.tool == *name) {
            // The tools of its domain that scored higher: those sent and those held
            // back like it.
            let sent = selection
                .tools
                .iter()
                .map(|t| (&t.name, &t.domain, t.score));
            let held_back = selection
                .tool_decisions
                .iter()
                .map(|d| (&d.tool, &d.domain, d.score));
            let mut above: Vec<(&Name, f32)> = sent
                .chain(held_back)
                .filter(|&(_, domain, score)| *domain == tool.domain && score > decision.score)
                .map(|(name, _, score)| (name, score))
                .collect();
            above.sort_by(|a, b| b.1.total_cmp(&a.1));
            let rank = above.len() + 1;
            let above: Vec<String> = above
                .iter()
                .take(5)
                .map(|(name, score)| format!("{name}:{score:.2}"))
                .collect();
            lines.push(format!(
                "  tool {}:{:.2}, rank {} in its domain; above: {}",
                decision.stage,
                decision.score,
                rank,
                above.join(" ")
            ));
        }
    }
    lines
}

fn ratio(num: usize, den: usize) -> f64 {
    if den == 0 {
        1.0
    } else {
        num as f64 / den as f64
    }
}

fn mean(values: &[usize]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<usize>() as f64 / values.len() as f64
}

fn p95(values: &[usize]) -> usize {
    if values.is_empty() {
        return 0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let idx = ((sorted.len() as f64) * 0.95).ceil() as usize;
    sorted[idx.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::RouterConfig;

    fn router() -> Router {
        let toolkit = loadout::toolkit::parse(
            &serde_json::json!({
                "domain": "weather", "description": "Weather forecasts.",
                "keywords": ["weather"], "settings_keys": ["weather_key"],
                "tools": [{"name": "get_forecast", "description": "Daily forecast.",
                           "input_schema": {"type": "object", "properties": {}}}]
            })
            .to_string(),
            "weather.json",
        )
        .expect("toolkit");
        let registry = loadout::Registry::builder()
            .toolkit(toolkit)
            .build()
            .expect("registry");
        Router::new(Arc::new(registry), RouterConfig::default())
    }

    fn case(line: &str) -> Case {
        serde_json::from_str(line).expect("case")
    }

    #[test]
    fn a_replay_counts_hits_and_explains_misses() {
        let router = router();
        let cases = [
            case(
                r#"{"id": "a", "configured": "all", "why": "keyword", "turns": [
                    {"user": "weather tomorrow?", "needed": ["get_forecast"]},
                    {"user": "and the day after", "needed": ["get_forecast"]}]}"#,
            ),
            case(
                r#"{"id": "b", "configured": [], "turns": [
                    {"user": "weather tomorrow?", "needed": ["get_forecast"]}]}"#,
            ),
        ];
        let mut seen = Vec::new();
        let report = replay(&router, &cases, None, None, None, |routed| {
            seen.push((routed.case.id.clone(), routed.turn_idx));
        })
        .expect("replay");
        assert_eq!(seen.len(), 3);
        assert_eq!((report.turns, report.hits), (3, 2));
        // The follow-up names no domain: the first turn's call keeps weather loaded.
        assert_eq!(report.misses.len(), 1);
        let miss = &report.misses[0];
        assert_eq!((miss.case_id.as_str(), miss.turn), ("b", 1));
        assert!(
            miss.explanation[0].contains("missing settings: weather_key"),
            "{:?}",
            miss.explanation
        );
        assert!(
            report
                .summary_line()
                .starts_with("turns 3  turn_recall 0.667")
        );
        assert_eq!(report.to_json()["misses"], 1);
    }

    #[test]
    fn a_comparison_names_the_turns_a_change_breaks_and_fixes() {
        let cases = [
            case(
                r#"{"id": "a", "configured": "all", "turns": [
                    {"user": "weather tomorrow?", "needed": ["get_forecast"]}]}"#,
            ),
            case(
                r#"{"id": "b", "configured": [], "turns": [
                    {"user": "weather tomorrow?", "needed": ["get_forecast"]}]}"#,
            ),
        ];
        let baseline = replay(&router(), &cases, None, None, None, |_| {}).expect("replay");
        // A budget too small for the forecast tool trims it.
        let candidate = replay(&router(), &cases, Some(1), None, None, |_| {}).expect("replay");
        let key = |m: &&Miss| (m.case_id.clone(), m.turn);
        let worse = Comparison::new(&baseline, &candidate);
        assert_eq!(
            worse.now_missed.iter().map(key).collect::<Vec<_>>(),
            [("a".to_owned(), 1)]
        );
        assert!(worse.now_hit.is_empty());
        assert!(
            worse.lines()[0].starts_with("NOW MISSED a turn 1"),
            "{:?}",
            worse.lines()
        );
        let better = Comparison::new(&candidate, &baseline);
        assert!(better.now_missed.is_empty());
        assert_eq!(better.to_json()["now_hit"][0]["case"], "a");
        // b misses either way (its domain lacks settings): not a change.
        assert_eq!(
            better.to_json()["now_hit"].as_array().map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn cases_round_trip_through_json_lines() {
        let line = r#"{"id":"s1","configured":["weather_key"],"turns":[{"user":"hi","needed":[],"called":["get_forecast"]}]}"#;
        let parsed = case(line);
        assert_eq!(serde_json::to_string(&parsed).expect("json"), line);
        let text = format!("{line}\n\n{line}\nnot json\n");
        let error = cases_from_json_lines(&text).expect_err("line 4");
        assert!(error.starts_with("line 4: not a case"), "{error}");
        assert_eq!(
            cases_from_json_lines(&text[..2 * line.len() + 3]).map(|c| c.len()),
            Ok(2)
        );
        let bad = case(r#"{"id": "x", "configured": "some", "turns": []}"#);
        let error =
            replay(&router(), &[bad], None, None, None, |_| {}).expect_err("bad configured");
        assert!(error.contains("\"all\" or a list"), "{error}");
    }
}

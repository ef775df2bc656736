//! The stages of [`Router::select`](crate::Router::select), each a method of one
//! [`Pass`]: the message's evidence, the verdict on each domain, the tools being sent
//! and why. Stages run in the order `Router::scored`, then `Pass::select`, call them;
//! each reads what the earlier ones decided and may only add to or trim the selection
//! as its own doc says.

use std::borrow::Cow;

use crate::evidence::{Evidence, best_first};
use crate::features::Candidates;
use crate::scorer::Row;
use crate::selection::{
    DomainDecision, SelectedTool, Selection, Stage, ToolDecision, Unconfigured, Why,
};
use crate::{RouteInput, Router, Scorers, chitchat};

mod domains;
mod finish;
mod guards;
mod scored;
mod tools;

/// One message being routed.
#[derive(Clone)]
pub(crate) struct Pass<'a> {
    router: &'a Router,
    input: &'a RouteInput<'a>,
    /// The models that score the tools and whose rule selects them.
    scorers: &'a Scorers,
    /// The token budget of this message.
    budget: usize,
    evidence: Evidence,
    notes: Vec<String>,
    /// Greetings and thanks: core only.
    chit_chat: bool,
    /// Per domain, in registry order.
    verdicts: Vec<DomainVerdict>,
    /// A keyword matched some domain: the message has evidence of its own.
    evidence_found: bool,
    /// Per domain, its likeliest tool's probability.
    domain_scores: Vec<f32>,
    n_active_tools: usize,
    /// The tools being sent, with the stage that sent each and its score.
    sent: ToolSlots<(Stage, f32)>,
    /// Per tool held back one by one (the budget, a collision, the destructive rule):
    /// what held it back.
    held_back: ToolSlots<Stage>,
    /// Tools considered and not sent: the hints.
    ranked_out: Vec<usize>,
    /// Per tool: the fitted scorer's probability (0 for a tool it did not score).
    probability: Vec<f32>,
    /// The tools the scorer scored, with their feature rows.
    candidates: Candidates,
    /// The domain of the likeliest tool: what the message is about.
    top_domain: Option<usize>,
    /// The probability mass of the candidates nothing points at (no row).
    rest_mass: f32,
    /// Per domain the scorer settled (`settle_verdicts`): what `explain_scored`
    /// writes its reason from at the end.
    scored_reason: Vec<Option<scored::ScoredReason>>,
}

impl<'a> Pass<'a> {
    pub(crate) fn new(
        router: &'a Router,
        input: &'a RouteInput<'a>,
        scorers: &'a Scorers,
    ) -> Pass<'a> {
        let evidence = router.gather_evidence(
            input.message,
            Some(input.settings),
            input.learned,
            input.vectors,
        );
        let session = input.session;
        // Every word of a chit-chat message is social or filler, so a keyword or a
        // similarity it has comes from those words ("good morning" against a
        // scheduler's "every morning"), never from a request.
        let chit_chat = router.config.no_tool_for_chitchat
            && !session.load_all_this_turn
            && session.loaded_tools.is_empty()
            && chitchat::is_chitchat(input.message);
        let n_tools = router.tool_tokens.len();
        Pass {
            router,
            input,
            scorers,
            budget: input.token_budget.unwrap_or(router.config.token_budget),
            notes: evidence.notes.clone(),
            evidence,
            chit_chat,
            verdicts: Vec::new(),
            evidence_found: false,
            domain_scores: Vec::new(),
            n_active_tools: 0,
            sent: ToolSlots::new(n_tools),
            held_back: ToolSlots::new(n_tools),
            ranked_out: Vec::new(),
            probability: vec![0.0; n_tools],
            candidates: Candidates::default(),
            top_domain: None,
            rest_mass: 0.0,
            scored_reason: Vec::new(),
        }
    }

    /// The stages after [`Router::scored`]: the selection by `scorers`' rule, then
    /// the guards and the budget. `scorers` has the weights the pass was scored with
    /// (the fit tries rules on one scoring; only the rule may differ).
    pub(crate) fn select(mut self, scorers: &'a Scorers) -> Selection {
        debug_assert!(scorers.same_weights(self.scorers));
        self.scorers = scorers;
        self.send_by_probability();
        self.domain_collisions();
        self.tool_collisions();
        self.destructive_guard();
        self.token_budget();
        self.finish()
    }

    /// About the bytes the pass holds: what a fit that keeps many pays. Each tool has
    /// its evidence, probability and slots (about 60 bytes); each candidate its row.
    pub(crate) fn heap_bytes(&self) -> usize {
        const PER_TOOL: usize = 64;
        let candidates = &self.candidates;
        self.probability.len() * PER_TOOL
            + candidates.rows.capacity() * std::mem::size_of::<Row>()
            + candidates.tools.capacity() * std::mem::size_of::<usize>()
            + candidates.row_of.capacity() * std::mem::size_of::<u32>()
    }

    /// The candidate tools with the feature rows they were scored on; none for
    /// chit-chat, which is not scored.
    pub(crate) fn scored_rows(&self) -> Option<impl Iterator<Item = (usize, &Row)>> {
        (!self.chit_chat).then(|| self.candidates.iter())
    }

    fn send(&mut self, t: usize, stage: Stage) {
        let score = self.probability[t];
        self.sent.set(t, (stage, score));
    }

    /// Per domain, how many of its tools are being sent.
    fn sent_by_domain(&self) -> Vec<usize> {
        let mut sent = vec![0; self.verdicts.len()];
        for (t, _) in self.sent.iter() {
            sent[self.router.names.tool_domains[t]] += 1;
        }
        sent
    }

    /// Tokens of the tools being sent.
    fn sent_tokens(&self) -> usize {
        self.sent
            .iter()
            .map(|(t, _)| self.router.tool_tokens[t])
            .sum()
    }
}

impl Router {
    pub(crate) fn has_loaded_tool(&self, session: &crate::SessionView, domain_idx: usize) -> bool {
        session
            .loaded_tools
            .iter()
            .filter_map(|name| self.registry.tool_idx(name))
            .any(|t| self.names.tool_domains[t] == domain_idx)
    }
}

/// Per-tool slots of a selection being made, and the tools whose slot was ever set:
/// a selection goes over the few tools it touched, not over every tool of the
/// registry.
#[derive(Clone)]
struct ToolSlots<T: Copy> {
    slots: Vec<Option<T>>,
    listed: Vec<bool>,
    /// Each tool once, in the order first set.
    touched: Vec<usize>,
}

impl<T: Copy> ToolSlots<T> {
    fn new(n_tools: usize) -> Self {
        ToolSlots {
            slots: vec![None; n_tools],
            listed: vec![false; n_tools],
            touched: Vec::new(),
        }
    }

    fn get(&self, t: usize) -> Option<T> {
        self.slots.get(t).copied().flatten()
    }

    fn has(&self, t: usize) -> bool {
        self.get(t).is_some()
    }

    fn set(&mut self, t: usize, value: T) {
        let (Some(slot), Some(listed)) = (self.slots.get_mut(t), self.listed.get_mut(t)) else {
            return;
        };
        *slot = Some(value);
        if !std::mem::replace(listed, true) {
            self.touched.push(t);
        }
    }

    fn clear(&mut self, t: usize) {
        if let Some(slot) = self.slots.get_mut(t) {
            *slot = None;
        }
    }

    /// The set tools with their values, in no particular order.
    fn iter(&self) -> impl Iterator<Item = (usize, T)> + '_ {
        self.touched
            .iter()
            .filter_map(|&t| self.get(t).map(|value| (t, value)))
    }

    /// The tools ever set, by index: the order of a pass over every slot.
    fn sorted(&self) -> Vec<usize> {
        let mut tools = self.touched.clone();
        tools.sort_unstable();
        tools
    }
}

/// How much of a domain a verdict sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Send {
    Nothing,
    Whole,
    /// The tools the scorer sends, hints for the rest.
    Ranked,
}

#[derive(Clone)]
struct DomainVerdict {
    stage: Stage,
    send: Send,
    score: f32,
    reason: Cow<'static, str>,
}

impl DomainVerdict {
    fn out(stage: Stage, score: f32, reason: Cow<'static, str>) -> Self {
        DomainVerdict {
            stage,
            send: Send::Nothing,
            score,
            reason,
        }
    }

    fn whole(stage: Stage, score: f32, reason: Cow<'static, str>) -> Self {
        DomainVerdict {
            stage,
            send: Send::Whole,
            score,
            reason,
        }
    }

    fn ranked(stage: Stage, score: f32, reason: Cow<'static, str>) -> Self {
        DomainVerdict {
            stage,
            send: Send::Ranked,
            score,
            reason,
        }
    }

    fn included(&self) -> bool {
        self.send != Send::Nothing
    }
}

/// Verbs that ask to destroy, undo or stop something (English stems; Korean as the
/// two-syllable windows the lexical stage makes of a word).
const DESTRUCTIVE_VERBS: &[&str] = &[
    "delete",
    "remove",
    "erase",
    "clear",
    "clean",
    "drop",
    "purge",
    "prune",
    "wipe",
    "cancel",
    "uninstall",
    "destroy",
    "kill",
    "terminate",
    "stop",
    "reboot",
    "restart",
    "shutdown",
    "restore",
    "revert",
    "rollback",
    "reset",
    "forget",
    "discard",
    "trash",
    "revoke",
    "unblock",
    "block",
    "ban",
    "format",
    "overwrite",
    "empty",
    "undo",
    "roll",
    "nuke",
    "scrap",
    "disable",
    "deactivate",
    "off",
    "unsubscribe",
    "unmount",
    "eject",
    "abort",
    "reject",
    "삭제",
    "지워",
    "지우",
    "취소",
    "제거",
    "없애",
    "초기",
    "재부",
];

/// Keyword evidence on the 0..1 scale of the other stages: one hit 0.6, two 0.8, ...
impl Router {
    /// `keyword "table"` or `keywords "table", "sql"`: the keywords (the domain's own
    /// or its tools') that matched the message, each once, in message order.
    pub(crate) fn matched_keywords(&self, evidence: &Evidence, d: usize) -> String {
        let mut keywords: Vec<&str> = Vec::new();
        for &(domain, pattern) in &evidence.keyword_matches {
            let keyword = self.keywords.pattern(pattern);
            if domain == d && !keywords.contains(&keyword) {
                keywords.push(keyword);
            }
        }
        let quoted: Vec<String> = keywords.iter().map(|k| format!("{k:?}")).collect();
        match quoted.len() {
            1 => format!("keyword {}", quoted[0]),
            _ => format!("keywords {}", quoted.join(", ")),
        }
    }
}

/// The best score of the domains that are not always on.
fn best_of(scores: &[f32], always_on: &[bool]) -> f32 {
    scores
        .iter()
        .zip(always_on)
        .filter(|&(_, &core)| !core)
        .map(|(&s, _)| s)
        .fold(0.0f32, f32::max)
}

/// The best score of the always-on domains.
fn best_of_core(scores: &[f32], always_on: &[bool]) -> f32 {
    scores
        .iter()
        .zip(always_on)
        .filter(|&(_, &core)| core)
        .map(|(&s, _)| s)
        .fold(0.0f32, f32::max)
}

fn keyword_score(hits: u16) -> f32 {
    if hits == 0 {
        0.0
    } else {
        (0.4 + 0.2 * f32::from(hits)).min(1.0)
    }
}

/// Stages held by the session rather than by this message.
fn is_held(stage: Stage) -> bool {
    matches!(stage, Stage::Sticky | Stage::Pinned | Stage::Loaded)
}

/// Stages neither the budget nor a collision may drop: core, and what the model or
/// the workflow asked for. Sticky is not among them: a conflicting tool the message
/// itself points at beats one that is merely still loaded.
fn is_protected(stage: Stage) -> bool {
    matches!(stage, Stage::AlwaysOn | Stage::Pinned | Stage::Loaded)
}

//! The router: picks the tools a message needs.
//!
//! [`Router::new`] builds every index once (keyword automaton, BM25 indexes, token
//! costs); [`Router::select`] is pure: no IO, no clock, no locks. The server loads the
//! session from the store into a [`SessionView`], calls `select`, and persists what the
//! [`SessionView`] updates return; the eval does the same in memory.
//!
//! Stages, in order (see [`Stage`]): activation by settings; always-on core; the
//! session's hold (pinned, sticky, loaded by meta-tools); "no tool needed" for
//! chit-chat (core only); keywords; then every candidate tool's probability from its
//! features (`features.rs`: keyword, BM25 and dense evidence per request piece, the
//! session, learned votes and co-usage, prerequisites and workflow steps; `scorer.rs`),
//! sent by expected coverage (`stages/scored.rs`); carry-over of what the last turn
//! sent for a follow-up with no keyword of its own; collisions between domains, then
//! between tools; the destructive guard (a destructive tool only on direct evidence);
//! the token budget.
//!
//! Similarity is scored for the whole message and for each request of a message that
//! chains several (`requests`), best per request: BM25, and with a [`DenseIndex`]
//! attached the cosine of the vectors the caller gives (the router runs no encoder),
//! fused by reciprocal rank.
//!
//! Recall comes first: a needed tool that is hidden breaks the task, an extra tool only
//! costs tokens. So the budget never drops core, pinned or loaded tools.

mod build;
mod chitchat;
mod embed;
mod evidence;
mod features;
pub mod fit;
mod keywords;
mod learned;
mod lexical;
mod prerequisite;
pub mod replay;
mod requests;
pub mod scorer;
mod selection;
mod session;
mod stages;
pub mod tokens;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

pub use embed::{DenseIndex, MessageVectors, message_pieces, normalize};
pub use learned::{LearnedEntry, LearnedIndex};
pub use selection::{
    DomainDecision, Hint, Name, SelectedTool, Selection, Stage, ToolDecision, Unconfigured, Why,
    not_configured, thousands,
};
pub use session::{DomainState, SessionError, SessionView, carry_over};

use embed::DenseOwner;
use keywords::{KeywordIndex, KeywordOwner};
use lexical::Bm25Index;
use loadout::Registry;

/// Tunables of the router. Every field has a default; a config file may set any subset.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterConfig {
    /// A domain whose tools were called stays loaded until it has been idle (no call, no
    /// load) for more than this many user turns.
    pub idle_turns: i64,
    /// Most tokens of tool definitions to send; the lowest-scoring optional tools are
    /// trimmed to fit. Core, pinned and loaded tools are never trimmed.
    pub token_budget: usize,
    /// An unconfigured domain is named to the user (with the settings it lacks) when
    /// the message's BM25 score for it is at least this (0..1: the share of the
    /// message's term weight its text explains) ...
    pub bm25_min_score: f32,
    /// ... and at least this fraction of the best domain's, so one strong match does
    /// not drag weak ones along.
    pub bm25_relative: f32,
    /// Tools whose call pins their domain for the rest of the session (mid-workflow
    /// state such as a scratchpad table), besides the tools that say so themselves
    /// (`#[tool(pins_domain = true)]`). None by default.
    pub pin_on_tools: Vec<String>,
    /// Re-send last turn's evidence-selected tools when a message has no evidence of
    /// its own (`yes do it`).
    pub carry_over: bool,
    /// Most hints returned.
    pub max_hints: usize,
    /// ... or when its cosine is at least this ...
    pub dense_min_score: f32,
    /// ... and within this much cosine of the best domain's (per request).
    pub dense_margin: f32,
    /// Cosines are mapped to the 0..1 scale of the other stages linearly from
    /// `dense_floor` (0) to `dense_ceiling` (1).
    pub dense_floor: f32,
    pub dense_ceiling: f32,
    /// Reciprocal-rank fusion constant: a rank `r` counts `1 / (rrf_k + r)`.
    pub rrf_k: f32,
    /// Greetings, thanks and chit-chat send core only.
    pub no_tool_for_chitchat: bool,
    /// The learned stage: a past message counts as like the message when its cosine
    /// with it is at least this (dense path) ...
    pub learned_min_cosine: f32,
    /// ... or when it explains at least this share of the message's BM25 weight
    /// (lexical path). Both 0 by default: the nearest past messages vote however
    /// near they are, and the fitted weights say what their similarity is worth.
    pub learned_min_bm25: f32,
    /// The most similar past messages that vote, per request.
    pub learned_neighbors: usize,
    /// A destructive tool is sent only on direct evidence for it (see the
    /// `destructive_guard` stage).
    pub destructive_needs_evidence: bool,
}

impl Default for RouterConfig {
    fn default() -> Self {
        RouterConfig {
            idle_turns: 5,
            token_budget: 4000,
            bm25_min_score: 0.12,
            bm25_relative: 0.5,
            pin_on_tools: Vec::new(),
            carry_over: true,
            max_hints: 40,
            dense_min_score: 0.30,
            dense_margin: 0.08,
            dense_floor: 0.2,
            dense_ceiling: 0.7,
            rrf_k: 10.0,
            no_tool_for_chitchat: true,
            learned_min_cosine: 0.0,
            learned_min_bm25: 0.0,
            learned_neighbors: 10,
            destructive_needs_evidence: true,
        }
    }
}

impl RouterConfig {
    /// Every value the router cannot work with, each naming its field: a config file
    /// with a typo'd number should fail at start, not route strangely. Deserializing
    /// already refuses unknown fields and wrong types; this checks the ranges.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut check = |field: &str, value: f32, low: f32, high: f32| {
            if !(low..=high).contains(&value) {
                problems.push(format!(
                    "`{field}` is {value}; it must be in {low}..={high}"
                ));
            }
        };
        // The ranges: BM25 scores are shares of the message's weight; cosines lie
        // in -1..=1.
        check("bm25_min_score", self.bm25_min_score, 0.0, 1.0);
        check("bm25_relative", self.bm25_relative, 0.0, 1.0);
        check("dense_min_score", self.dense_min_score, -1.0, 1.0);
        check("dense_margin", self.dense_margin, 0.0, 2.0);
        check("dense_floor", self.dense_floor, -1.0, 1.0);
        check("dense_ceiling", self.dense_ceiling, -1.0, 1.0);
        check("learned_min_cosine", self.learned_min_cosine, -1.0, 1.0);
        check("learned_min_bm25", self.learned_min_bm25, 0.0, 1.0);
        if !(self.rrf_k.is_finite() && self.rrf_k >= 0.0) {
            problems.push(format!("`rrf_k` is {}; it must be 0 or more", self.rrf_k));
        }
        if self.dense_floor.is_finite()
            && self.dense_ceiling.is_finite()
            && self.dense_ceiling <= self.dense_floor
        {
            problems.push(format!(
                "`dense_ceiling` ({}) must be above `dense_floor` ({})",
                self.dense_ceiling, self.dense_floor
            ));
        }
        if self.idle_turns < 0 {
            problems.push(format!(
                "`idle_turns` is {}; it must be 0 or more",
                self.idle_turns
            ));
        }
        problems
    }
}

/// One message to route.
#[derive(Debug, Clone, Copy)]
pub struct RouteInput<'a> {
    pub message: &'a str,
    /// Current settings; a domain is active when each of its settings keys has a
    /// non-blank value.
    pub settings: &'a BTreeMap<String, String>,
    pub session: &'a SessionView,
    /// Overrides [`RouterConfig::token_budget`] for this call.
    pub token_budget: Option<usize>,
    /// Past messages and the tools they called: the learned stage's evidence.
    pub learned: Option<&'a LearnedIndex>,
    /// The message's vectors ([`message_pieces`], embedded by the caller with the
    /// attached dense stage's encoder): the dense and learned stages' evidence. `None`
    /// or skipped routes lexically (and says so when a dense stage is attached).
    pub vectors: Option<&'a MessageVectors>,
}

impl<'a> RouteInput<'a> {
    /// `message` with these settings and session, the config's token budget, no
    /// learned memory and no vectors; set the other fields with struct update syntax.
    pub fn new(
        message: &'a str,
        settings: &'a BTreeMap<String, String>,
        session: &'a SessionView,
    ) -> RouteInput<'a> {
        RouteInput {
            message,
            settings,
            session,
            token_budget: None,
            learned: None,
            vectors: None,
        }
    }
}

/// Picks the tools each message needs. Cheap to share (`Arc`); rebuild when the
/// registry changes.
pub struct Router {
    registry: Arc<Registry>,
    config: RouterConfig,
    keywords: KeywordIndex,
    tool_index: Bm25Index,
    domain_index: Bm25Index,
    /// Attached once its vectors are ready (see [`Router::attach_dense`]).
    dense: OnceLock<DenseIndex>,
    /// Tool vectors of a second, cheaper encoder, for messages its vectors come
    /// from when the first is busy (see [`Router::attach_dense_fallback`]).
    dense_fallback: OnceLock<DenseIndex>,
    /// Set while the dense stage is being prepared, so selections can say why they are
    /// lexical-only.
    dense_pending: AtomicBool,
    /// Texts the dense stage embeds, and what each stands for.
    dense_texts: Vec<String>,
    dense_owners: Vec<DenseOwner>,
    names: Names,
    tool_hints: Vec<Name>,
    tools_by_domain: Vec<Vec<usize>>,
    domain_is_core: Vec<bool>,
    tool_tokens: Vec<usize>,
    /// The cheapest tool's tokens: a selection with less room left takes no more.
    min_tool_tokens: usize,
    /// Per domain: the tokens of all its tools.
    domain_tokens: Vec<usize>,
    hint_tokens: Vec<usize>,
    all_tools_tokens: usize,
    /// Per tool: it is destructive (`destructive = true` or MCP's `destructiveHint`).
    destructive: Vec<bool>,
    /// Per tool: conflicting tools (both directions).
    tool_conflicts: Vec<Vec<usize>>,
    /// Per domain: conflicting domains (both directions).
    domain_conflicts: Vec<Vec<usize>>,
    /// Per tool: a small prior for reading before writing (`list_`, `get_`, `search_`),
    /// used to order tools no evidence separates.
    tool_prior: Vec<f32>,
    /// Per tool: the tools of its domain that find its required ids
    /// (see [`prerequisite`]).
    prerequisites: Vec<Vec<usize>>,
    /// Per tool: the tools it is a prerequisite of.
    consumers: Vec<Vec<usize>>,
    /// Per tool: the words of its name that say its action (verb, objects).
    tool_actions: Vec<Option<features::Action>>,
    /// The tools whose action's verb is each stemmed word.
    tools_by_verb: HashMap<String, Vec<usize>>,
    /// Every settings key some domain needs, sorted, and per domain the indexes of
    /// its keys in that list (see [`Router::active_domains`]).
    setting_keys: Vec<String>,
    domain_setting_keys: Vec<Vec<usize>>,
    /// The fitted scorer's models, lexical and dense.
    scorer: Scorers,
    weights: scorer::Weights,
}

#[derive(Clone)]
pub(crate) struct Scorers {
    lexical: scorer::Compiled,
    dense: scorer::Compiled,
    joined: Option<scorer::Compiled>,
}

impl Scorers {
    pub(crate) fn new(weights: &scorer::Weights) -> Scorers {
        Scorers {
            lexical: scorer::Compiled::new(&weights.lexical),
            dense: scorer::Compiled::new(&weights.dense),
            joined: weights.joined.as_ref().map(scorer::Compiled::new),
        }
    }

    /// The model of the path the evidence took: each reads the features its path
    /// has, since a feature a path lacks would read as evidence against every tool.
    pub(crate) fn for_evidence(&self, evidence: &evidence::Evidence) -> &scorer::Compiled {
        match (evidence.dense_on, evidence.joined_on(), &self.joined) {
            (true, true, Some(joined)) => joined,
            (true, _, _) => &self.dense,
            (false, _, _) => &self.lexical,
        }
    }

    /// Both models score alike: the selection rules may differ.
    fn same_weights(&self, other: &Scorers) -> bool {
        let same =
            |a: &scorer::Compiled, b: &scorer::Compiled| a.bias == b.bias && a.weights == b.weights;
        same(&self.lexical, &other.lexical)
            && same(&self.dense, &other.dense)
            && match (&self.joined, &other.joined) {
                (Some(a), Some(b)) => same(a, b),
                (a, b) => a.is_none() && b.is_none(),
            }
    }
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("registry", &self.registry)
            .field("keywords", &self.keywords.n_patterns())
            .field("dense", &self.dense.get())
            .finish()
    }
}

impl Router {
    /// Builds the keyword automaton, the BM25 indexes and the per-tool token costs
    /// (one builder each, `build.rs`).
    pub fn new(registry: Arc<Registry>, config: RouterConfig) -> Router {
        let domains = registry.domains();
        let tools = registry.all_tools();
        let tool_domain: Vec<usize> = tools
            .iter()
            .map(|t| registry.domain_idx(&t.domain).unwrap_or(0))
            .collect();
        let mut tools_by_domain = vec![Vec::new(); domains.len()];
        for (tool_idx, &domain_idx) in tool_domain.iter().enumerate() {
            if let Some(list) = tools_by_domain.get_mut(domain_idx) {
                list.push(tool_idx);
            }
        }
        let (tool_index, domain_index) = build::bm25_indexes(domains, tools);
        let costs = build::token_costs(tools, &tools_by_domain);
        let (tool_conflicts, domain_conflicts) = build::conflicts(&registry);
        let prerequisites =
            prerequisite::prerequisites(tools, &tool_domain, &tools_by_domain, |name| {
                registry.tool_idx(name)
            });
        let consumers = build::consumers(&prerequisites);
        let tool_actions: Vec<Option<features::Action>> = tools
            .iter()
            .map(|t| features::Action::of(&t.name, &t.domain))
            .collect();
        let (dense_texts, dense_owners) = build::dense_texts(domains, tools);
        let mut setting_keys: Vec<String> = domains
            .iter()
            .flat_map(|d| d.settings_keys.iter().cloned())
            .collect();
        setting_keys.sort_unstable();
        setting_keys.dedup();
        let domain_setting_keys = domains
            .iter()
            .map(|d| {
                d.settings_keys
                    .iter()
                    .filter_map(|key| setting_keys.binary_search(key).ok())
                    .collect()
            })
            .collect();
        let weights = scorer::Weights::shipped();
        let names = Names {
            tools: tools.iter().map(|t| Name::from(t.name.as_str())).collect(),
            tool_domains: tool_domain,
            domains: domains
                .iter()
                .map(|d| Name::from(d.name.as_str()))
                .collect(),
        };
        Router {
            names,
            tool_hints: tools.iter().map(|t| Name::from(t.hint.as_str())).collect(),
            keywords: build::keyword_index(domains, tools),
            tool_index,
            domain_index,
            dense: OnceLock::new(),
            dense_fallback: OnceLock::new(),
            dense_pending: AtomicBool::new(false),
            dense_texts,
            dense_owners,
            tools_by_domain,
            domain_is_core: domains.iter().map(|d| d.always_on).collect(),
            min_tool_tokens: costs.tools.iter().copied().min().unwrap_or(0),
            tool_tokens: costs.tools,
            domain_tokens: costs.domains,
            hint_tokens: costs.hints,
            all_tools_tokens: costs.all,
            destructive: tools
                .iter()
                .map(|t| t.annotations.destructive == Some(true))
                .collect(),
            tool_conflicts,
            domain_conflicts,
            tool_prior: build::read_priors(tools),
            prerequisites,
            consumers,
            tools_by_verb: features::tools_by_verb(&tool_actions),
            tool_actions,
            setting_keys,
            domain_setting_keys,
            scorer: Scorers::new(&weights),
            weights,
            registry,
            config,
        }
    }

    /// Routes with these fitted weights from now on (`cargo xtask fit`, `loadout fit`).
    pub fn set_weights(&mut self, weights: scorer::Weights) {
        self.scorer = Scorers::new(&weights);
        self.weights = weights;
    }

    /// The fitted weights the scorer routes with.
    pub fn weights(&self) -> &scorer::Weights {
        &self.weights
    }

    /// The scorer's candidate tools for a message, each with its feature row: what
    /// `cargo xtask fit` learns from.
    pub fn feature_rows(&self, input: &RouteInput<'_>) -> Vec<(usize, scorer::Row)> {
        let evidence = self.gather_evidence(
            input.message,
            Some(input.settings),
            input.learned,
            input.vectors,
        );
        let candidates = self.candidates(&evidence, input.session, input.learned, false);
        candidates.iter().map(|(t, row)| (t, *row)).collect()
    }

    /// A tool's name by router index.
    pub fn tool_name(&self, tool_idx: usize) -> Option<&str> {
        self.names.tools.get(tool_idx).map(|n| n.as_str())
    }

    /// Installs (or removes) the dense stage. Vectors must be in [`Router::dense_texts`]
    /// order; with a mismatched count the stage stays off and selections say why.
    pub fn set_dense(&mut self, dense: Option<DenseIndex>) {
        self.dense = OnceLock::new();
        if let Some(dense) = dense {
            let _ = self.dense.set(dense);
        }
        *self.dense_pending.get_mut() = false;
    }

    /// Attaches the dense stage to a shared router, once (e.g. from the background task
    /// that computed the vectors). Gives the index back if one is already attached.
    pub fn attach_dense(&self, dense: DenseIndex) -> Result<(), DenseIndex> {
        let result = self.dense.set(dense);
        self.dense_pending.store(false, Ordering::Release);
        result
    }

    /// Attaches the tool vectors of a fallback encoder, once: a message whose vectors
    /// are that encoder's (the server's choice when the dense stage's encoder is
    /// busy) is routed densely with them, and its notes say so. The learned stage's
    /// dense path stays the first encoder's.
    pub fn attach_dense_fallback(&self, dense: DenseIndex) -> Result<(), DenseIndex> {
        self.dense_fallback.set(dense)
    }

    /// The fallback encoder's tool vectors, when attached.
    pub fn dense_fallback(&self) -> Option<&DenseIndex> {
        self.dense_fallback.get()
    }

    /// Says that a dense stage is being prepared: until it is attached, selections
    /// note that they are lexical-only. `false` withdraws it (preparation failed).
    pub fn set_dense_pending(&self, pending: bool) {
        self.dense_pending.store(pending, Ordering::Release);
    }

    /// The dense stage, when attached.
    pub fn dense(&self) -> Option<&DenseIndex> {
        self.dense.get()
    }

    /// Why the dense model's probabilities may be off: it was fitted on another
    /// encoder's cosines than the attached stage's, whose similarities sit elsewhere;
    /// or a joined stage has no joined model to weigh its second encoder. `None`
    /// when they match, or when the weights do not say.
    pub fn dense_weights_mismatch(&self) -> Option<String> {
        let dense = self.dense()?;
        let attached = dense.model_id();
        if dense.is_joined() && self.weights().joined.is_none() {
            return Some(format!(
                "no joined weights: the second encoder of {attached} weighs nothing until \
                 they are fitted (`loadout fit`, or `cargo xtask fit --embedder builtin+...`)"
            ));
        }
        let fitted = match self.weights().joined_encoder() {
            Some(joined) if dense.is_joined() => joined,
            _ => self.weights().dense_encoder()?,
        };
        (fitted != attached).then(|| {
            format!(
                "the dense weights were fitted with the encoder {fitted}, not {attached}: \
                 refit them with it (`loadout fit` on this deployment's traffic, \
                 `cargo xtask fit --embedder` on a labeled set)"
            )
        })
    }

    /// The texts the dense stage embeds, in the order [`DenseIndex::new`] expects
    /// their vectors: per tool `name: description` then each of its examples, then per
    /// domain `name: description`.
    pub fn dense_texts(&self) -> &[String] {
        &self.dense_texts
    }

    /// Which tool a dense text stands for (`None` for a domain's text).
    pub fn dense_text_tool(&self, idx: usize) -> Option<usize> {
        match self.dense_owners.get(idx) {
            Some(DenseOwner::Tool(t)) => Some(*t),
            _ => None,
        }
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// Core: an `always_on` domain, sent on every turn.
    pub fn is_core_domain(&self, domain: &str) -> bool {
        self.registry
            .domain_idx(domain)
            .and_then(|d| self.domain_is_core.get(d).copied())
            .unwrap_or(false)
    }

    /// Tokens of one tool's definition, precomputed.
    pub fn tool_tokens(&self, tool_idx: usize) -> usize {
        self.tool_tokens.get(tool_idx).copied().unwrap_or(0)
    }

    pub fn all_tools_tokens(&self) -> usize {
        self.all_tools_tokens
    }

    /// Per domain, whether it is active under `settings`: core always is, another
    /// domain once each of its keys has a value. One walk of the two sorted key
    /// lists rather than a look-up per key of every domain.
    fn active_domains(&self, settings: &BTreeMap<String, String>) -> Vec<bool> {
        let mut given = settings.iter().peekable();
        let is_set: Vec<bool> = self
            .setting_keys
            .iter()
            .map(|key| {
                while given.next_if(|(k, _)| *k < key).is_some() {}
                given
                    .next_if(|(k, _)| *k == key)
                    .is_some_and(|(_, value)| !value.trim().is_empty())
            })
            .collect();
        self.domain_setting_keys
            .iter()
            .zip(&self.domain_is_core)
            .map(|(keys, &core)| core || keys.iter().all(|&k| is_set[k]))
            .collect()
    }

    /// The tools that take what `tool` finds (its next steps): routed after a call
    /// to it, this turn and the next.
    pub fn next_steps(&self, tool: &str) -> impl Iterator<Item = &str> {
        let consumers = self
            .registry
            .tool_idx(tool)
            .and_then(|t| self.consumers.get(t))
            .map_or(&[][..], Vec::as_slice);
        consumers.iter().map(|&c| self.names.tools[c].as_str())
    }

    /// Required id arguments no tool is found to find, as `(tool, argument)`; see
    /// `prerequisite.rs`.
    pub fn unfound_ids(&self) -> Vec<(String, String)> {
        prerequisite::unfound_ids(
            self.registry.all_tools(),
            &self.names.tool_domains,
            &self.tools_by_domain,
            |name| self.registry.tool_idx(name),
        )
    }

    /// `search_tools(query)`: hints for the tools that best match `query`, ranked by
    /// the fitted scorer as a first turn would be (keywords, BM25, the dense stage
    /// once attached, with `vectors` of the query, learned votes), best first, at most `limit`. `active`:
    /// the settings that make a domain active, so that only active tools are found
    /// (chat); `None` finds every tool (MCP lists every tool, and one that needs
    /// settings says which).
    pub fn search(
        &self,
        query: &str,
        active: Option<&BTreeMap<String, String>>,
        learned: Option<&LearnedIndex>,
        vectors: Option<&MessageVectors>,
        limit: usize,
    ) -> Vec<Hint> {
        let evidence = self.gather_evidence(query, active, learned, vectors);
        let session = SessionView::default();
        let candidates = self.candidates(&evidence, &session, learned, true);
        let model = self.scorer.for_evidence(&evidence);
        use scorer::f;
        let mut scored: Vec<(f32, usize)> = candidates
            .iter()
            .filter(|(_, x)| {
                x[f::TOOL_BM25] > 0.0
                    || x[f::TOOL_KEYWORD] > 0.0
                    || x[f::KEYWORD_IN_DOMAIN] > 0.0
                    || x[f::TOOL_DENSE] > 0.0
                    || x[f::TOOL_DENSE2] > 0.0
                    || x[f::LEARNED_TOOL] > 0.0
            })
            .map(|(t, x)| (model.logit(x), t))
            .collect();
        scored.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored
            .into_iter()
            .take(limit)
            .map(|(_, t)| self.hint_for(t))
            .collect()
    }

    fn hint_for(&self, tool_idx: usize) -> Hint {
        Hint {
            name: self.names.tools[tool_idx].clone(),
            domain: self.names.domains[self.names.tool_domains[tool_idx]].clone(),
            hint: self.tool_hints[tool_idx].clone(),
        }
    }

    /// The keyword stage alone: the domains whose keywords (their own or their tools')
    /// are in the message, one entry per match, from one pass over the lowercased
    /// message. `cargo xtask bench` sets it beside the naive per-keyword baseline,
    /// which does the same job.
    pub fn keyword_domains(&self, message: &str) -> Vec<usize> {
        let lowered = message.to_lowercase();
        let mut matched = Vec::new();
        self.keywords.for_each_match(&lowered, |owner, _| {
            matched.push(match owner {
                KeywordOwner::Domain(d) => d,
                KeywordOwner::Tool(t) => self.names.tool_domains[t],
            })
        });
        matched
    }

    /// Routes one message: the stages in order over one `stages::Pass`. Pure: the
    /// same input gives the same selection.
    pub fn select(&self, input: &RouteInput<'_>) -> Selection {
        self.scored(input, &self.scorer).select(&self.scorer)
    }

    /// The stages of [`Router::select`] before the selection rule: every tool's
    /// probability under `scorers`' weights and the hard rules. The fit scores a turn
    /// once and tries each rule on a clone ([`stages::Pass::select`]).
    pub(crate) fn scored<'a>(
        &'a self,
        input: &'a RouteInput<'a>,
        scorers: &'a Scorers,
    ) -> stages::Pass<'a> {
        let mut pass = stages::Pass::new(self, input, scorers);
        pass.decide_domains();
        pass.score_tools();
        pass.send_held();
        pass.loaded_tools();
        pass.carry_over();
        pass
    }
}

/// A router's tool and domain names, in registry order, shared with its selections
/// (which clone a pointer, not the text).
struct Names {
    tools: Vec<Name>,
    /// Per tool, the index of its domain.
    tool_domains: Vec<usize>,
    domains: Vec<Name>,
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

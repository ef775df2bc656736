//! The stages of [`Router::select`](crate::Router::select), each a method of one
//! [`Pass`]: the message's evidence, the verdict on each domain, the tools being sent
//! and why. Stages run in the order `select` calls them; each reads what the earlier
//! ones decided and may only add to or trim the selection as its own doc says.

use std::borrow::Cow;

use crate::evidence::{Evidence, LearnedVote, Rank, ranks, rrf};
use crate::features::Candidates;
use crate::selection::{
    DomainDecision, SelectedTool, Selection, Stage, ToolDecision, Unconfigured,
};
use crate::{RouteInput, Router, chitchat};

mod scored;

/// One message being routed.
pub(crate) struct Pass<'a> {
    router: &'a Router,
    input: &'a RouteInput<'a>,
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
    /// Per domain, its score as the domain stages left it: what its tools rank by.
    domain_scores: Vec<f32>,
    n_active_tools: usize,
    /// The tools being sent, with the stage that sent each and its score.
    sent: ToolSlots<(Stage, f32)>,
    /// Per tool ranked one by one (large domains, budget, collisions): its stage and
    /// whether it was sent.
    tool_outcomes: ToolSlots<(Stage, bool)>,
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
}

impl<'a> Pass<'a> {
    pub(crate) fn new(router: &'a Router, input: &'a RouteInput<'a>) -> Pass<'a> {
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
            budget: input.token_budget.unwrap_or(router.config.token_budget),
            notes: evidence.notes.clone(),
            evidence,
            chit_chat,
            verdicts: Vec::new(),
            evidence_found: false,
            domain_scores: Vec::new(),
            n_active_tools: 0,
            sent: ToolSlots::new(n_tools),
            tool_outcomes: ToolSlots::new(n_tools),
            ranked_out: Vec::new(),
            probability: vec![0.0; n_tools],
            candidates: Candidates::default(),
            top_domain: None,
            rest_mass: 0.0,
        }
    }

    /// A tool's score: its domain's evidence (as the domain stages left it) plus its
    /// own.
    fn tool_score(&self, t: usize) -> f32 {
        let router = self.router;
        if router.config.scorer {
            return self.probability[t];
        }
        self.domain_scores[router.names.tool_domains[t]]
            + self.evidence.tool_similarity.get(t).copied().unwrap_or(0.0)
            + 0.5 * f32::from(self.evidence.tool_keyword_hits[t].min(2))
            + router.tool_prior[t]
    }

    fn send(&mut self, t: usize, stage: Stage) {
        let score = self.tool_score(t);
        self.sent.set(t, (stage, score));
    }

    /// Activation, always-on, the session's hold (unloaded, loaded, pinned, sticky),
    /// keywords: the verdict on every domain before similarity. Chit-chat leaves out
    /// every optional domain.
    pub(crate) fn decide_domains(&mut self) {
        let router = self.router;
        let config = &router.config;
        let session = self.input.session;
        let evidence = &self.evidence;
        for (d, domain) in router.registry.domains().iter().enumerate() {
            let similarity = evidence.domain_similarity[d];
            let keyword_hits = evidence.keyword_hits_in_domain[d];
            let verdict = if !evidence.active[d] {
                let missing = router
                    .registry
                    .missing_settings(&domain.name, self.input.settings);
                DomainVerdict::out(
                    Stage::Inactive,
                    0.0,
                    format!("missing settings: {}", missing.join(", ")).into(),
                )
            } else if router.domain_is_core[d] {
                DomainVerdict::whole(Stage::AlwaysOn, 1.0, Cow::Borrowed("always on"))
            } else if session.state(&domain.name).is_some_and(|s| s.unloaded)
                && !session.load_all_this_turn
                && !router.has_loaded_tool(session, d)
            {
                DomainVerdict::out(
                    Stage::Unloaded,
                    similarity,
                    Cow::Borrowed("unloaded by the model; kept out until used or loaded again"),
                )
            } else if session.load_all_this_turn {
                DomainVerdict::whole(Stage::Loaded, 1.0, Cow::Borrowed("load_all_for_this_turn"))
            } else if let Some(stage) = session.holds(&domain.name, config.idle_turns) {
                let reason = match stage {
                    Stage::Pinned => "pinned for the session by mid-workflow state",
                    _ => "used in this session within the idle window",
                };
                DomainVerdict::ranked(
                    stage,
                    similarity.max(keyword_score(keyword_hits)),
                    Cow::Borrowed(reason),
                )
            } else if keyword_hits > 0 {
                DomainVerdict::ranked(
                    Stage::Keyword,
                    keyword_score(keyword_hits).max(similarity),
                    Cow::Owned(router.matched_keywords(evidence, d)),
                )
            } else if router.has_loaded_tool(session, d) {
                DomainVerdict::ranked(
                    Stage::Loaded,
                    similarity,
                    Cow::Borrowed("tool loaded by name this turn"),
                )
            } else {
                DomainVerdict::out(
                    Stage::NotMatched,
                    similarity,
                    Cow::Borrowed("no keyword; similarity below threshold"),
                )
            };
            if evidence.active[d] {
                self.n_active_tools += router.tools_by_domain[d].len();
            }
            let verdict = if self.chit_chat && evidence.active[d] && !router.domain_is_core[d] {
                DomainVerdict::out(
                    Stage::NoToolNeeded,
                    similarity,
                    Cow::Borrowed("chit-chat with no evidence: no tool needed"),
                )
            } else {
                verdict
            };
            self.verdicts.push(verdict);
        }
    }

    /// For active domains no earlier stage decided, per piece of the message (the
    /// whole, then each request): those that pass the BM25 gate (share >=
    /// `bm25_min_score` and >= `bm25_relative` of the piece's best) or the dense gate
    /// (cosine >= `dense_min_score` and within `dense_margin` of the piece's best),
    /// best fused rank first, at most `bm25_top_k`/`dense_top_k` for the whole message
    /// and `request_top_k` per request.
    pub(crate) fn similarity(&mut self) {
        if !self.chit_chat {
            self.select_by_similarity();
        }
        self.evidence_found = self.verdicts.iter().any(|v| v.stage == Stage::Keyword);
    }

    fn select_by_similarity(&mut self) {
        let router = self.router;
        let config = &router.config;
        let evidence = &self.evidence;
        let verdicts = &mut self.verdicts;
        let n_domains = verdicts.len();
        let candidates: Vec<usize> = (0..n_domains)
            .filter(|&d| evidence.active[d] && !router.domain_is_core[d])
            .collect();
        let mut bm25_scores = vec![0.0f32; n_domains];
        let mut dense_scores = vec![0.0f32; n_domains];
        // Per domain: best (lowest) dense rank over the pieces, for the reasons.
        let mut best_dense_rank = vec![usize::MAX; n_domains];
        for (p, piece) in evidence.pieces.iter().enumerate() {
            bm25_scores.iter_mut().for_each(|s| *s = 0.0);
            dense_scores.iter_mut().for_each(|s| *s = 0.0);
            for &d in &candidates {
                bm25_scores[d] = piece.domain_bm25[d];
                dense_scores[d] = piece.domain_dense[d];
            }
            let best_bm25 = bm25_scores.iter().copied().fold(0.0f32, f32::max);
            let best_dense = dense_scores.iter().copied().fold(0.0f32, f32::max);
            let fused = if evidence.dense_on {
                rrf(&[&bm25_scores, &dense_scores], config.rrf_k)
            } else {
                bm25_scores.clone()
            };
            let bm25_rank = ranks(&bm25_scores);
            let dense_rank = ranks(&dense_scores);
            let second_dense = dense_scores
                .iter()
                .zip(&dense_rank)
                .filter(|&(_, &r)| r == 2)
                .map(|(&c, _)| c)
                .next()
                .unwrap_or(0.0);
            for (best, &rank) in best_dense_rank.iter_mut().zip(&dense_rank) {
                if rank > 0 {
                    *best = (*best).min(rank);
                }
            }
            let mut passing: Vec<(usize, bool, bool)> = candidates
                .iter()
                .map(|&d| {
                    let b = bm25_scores[d];
                    let c = dense_scores[d];
                    let bm25_gate =
                        b >= config.bm25_min_score && b >= config.bm25_relative * best_bm25;
                    let dense_gate = evidence.dense_on
                        && ((c >= config.dense_min_score && c >= best_dense - config.dense_margin)
                            || (dense_rank[d] == 1
                                && c >= config.dense_top1_min_score
                                && c >= second_dense + config.dense_margin / 2.0));
                    (d, bm25_gate, dense_gate)
                })
                .filter(|&(d, b, c)| (b || c) && verdicts[d].stage == Stage::NotMatched)
                .collect();
            passing.sort_unstable_by(|a, b| fused[b.0].total_cmp(&fused[a.0]).then(a.0.cmp(&b.0)));
            let top_k = match (p, evidence.dense_on) {
                (0, false) => config.bm25_top_k,
                (0, true) => config.bm25_top_k.max(config.dense_top_k),
                _ => config.request_top_k,
            };
            // The best by fused rank, and the dense stage's own best: a paraphrase
            // that shares no word with its domain is not crowded out by several
            // domains that share a word or two with the message.
            let dense_k = if p == 0 {
                config.dense_top_k
            } else {
                config.request_top_k
            };
            let mut dense_best: Vec<usize> = passing.iter().filter(|x| x.2).map(|x| x.0).collect();
            dense_best.sort_unstable_by(|&a, &b| {
                dense_scores[b].total_cmp(&dense_scores[a]).then(a.cmp(&b))
            });
            dense_best.truncate(dense_k);
            let mut kept = 0;
            passing.retain(|x| {
                kept += 1;
                kept <= top_k || dense_best.contains(&x.0)
            });
            for &(d, bm25_gate, dense_gate) in passing.iter() {
                if verdicts[d].stage != Stage::NotMatched {
                    continue;
                }
                let stage = match (bm25_gate, dense_gate) {
                    (true, true) => Stage::Fused,
                    (false, true) => Stage::Dense,
                    _ => Stage::Bm25,
                };
                let score = bm25_scores[d].max(router.calibrated(dense_scores[d]));
                let piece_name = if p == 0 {
                    Cow::Borrowed("the message")
                } else {
                    Cow::Owned(format!("request {p}"))
                };
                let reason = if evidence.dense_on {
                    format!(
                        "{piece_name}: bm25 {:.2} ({}), dense {:.2} ({}), fused {:.2}",
                        bm25_scores[d],
                        Rank(bm25_rank[d]),
                        dense_scores[d],
                        Rank(dense_rank[d]),
                        fused[d]
                    )
                } else {
                    format!(
                        "{piece_name}: bm25 {:.2} ({}) above threshold, among the best",
                        bm25_scores[d],
                        Rank(bm25_rank[d])
                    )
                };
                verdicts[d] = DomainVerdict::ranked(stage, score, Cow::Owned(reason));
            }
        }
        // With the dense stage, the domains left out say how close they came.
        if evidence.dense_on {
            let pieces = &evidence.pieces;
            for &d in &candidates {
                if verdicts[d].stage != Stage::NotMatched {
                    continue;
                }
                let best_bm25 = pieces.iter().map(|p| p.domain_bm25[d]).fold(0.0, f32::max);
                let best_dense = evidence.domain_best_dense[d];
                let rank = Rank(best_dense_rank[d]);
                verdicts[d].reason = Cow::Owned(format!(
                    "no keyword; bm25 {best_bm25:.2}, dense {best_dense:.2} ({rank}): below the gates or not among the best"
                ));
            }
        }
    }

    /// Two conflicting domains both selected: keep the better-scoring one unless the
    /// message matched both by keyword or the session used both. The domain scores
    /// tools rank by are fixed here.
    pub(crate) fn domain_collisions(&mut self) {
        let router = self.router;
        let verdicts = &mut self.verdicts;
        for d in 0..verdicts.len() {
            for &other in &router.domain_conflicts[d] {
                if other <= d || !verdicts[d].included() || !verdicts[other].included() {
                    continue;
                }
                let both_justified = |stage_a: Stage, stage_b: Stage| {
                    (stage_a == Stage::Keyword && stage_b == Stage::Keyword)
                        || (is_held(stage_a) && is_held(stage_b))
                };
                if both_justified(verdicts[d].stage, verdicts[other].stage) {
                    continue;
                }
                let (winner, loser) = if verdicts[d].score >= verdicts[other].score {
                    (d, other)
                } else {
                    (other, d)
                };
                if is_collision_protected(verdicts[loser].stage) {
                    continue;
                }
                let winner_name = &router.registry.domains()[winner].name;
                verdicts[loser] = DomainVerdict::out(
                    Stage::Collision,
                    verdicts[loser].score,
                    format!("conflicts with {winner_name}, which scored higher").into(),
                );
            }
        }
        self.domain_scores = self.verdicts.iter().map(|v| v.score).collect();
    }

    /// The tools of each included domain: all of them, or for a domain larger than
    /// `domain_tool_cap` its best, hinting the rest.
    pub(crate) fn send_decided_domains(&mut self) {
        let router = self.router;
        let cap = router.config.domain_tool_cap;
        for d in 0..self.verdicts.len() {
            let stage = self.verdicts[d].stage;
            match self.verdicts[d].send {
                Send::Nothing => {}
                Send::Whole => {
                    for &t in &router.tools_by_domain[d] {
                        self.send(t, stage);
                    }
                }
                Send::Ranked => {
                    let members = &router.tools_by_domain[d];
                    if members.len() <= cap {
                        for &t in members {
                            self.send(t, stage);
                        }
                        continue;
                    }
                    let mut ranked: Vec<usize> = members.clone();
                    best_first(&mut ranked, cap, |t| self.tool_score(t));
                    for (rank, &t) in ranked.iter().enumerate() {
                        let included = rank < cap;
                        if included {
                            self.send(t, stage);
                        } else {
                            self.ranked_out.push(t);
                        }
                        self.tool_outcomes.set(t, (Stage::Ranked, included));
                    }
                }
            }
        }
    }

    /// Tools loaded by name (`load_tools`) always go.
    pub(crate) fn loaded_tools(&mut self) {
        let router = self.router;
        for name in &self.input.session.loaded_tools {
            if let Some(t) = router.registry.tool_idx(name)
                && self.evidence.active[router.names.tool_domains[t]]
            {
                self.send(t, Stage::Loaded);
                let d = router.names.tool_domains[t];
                if !self.verdicts[d].included() {
                    self.verdicts[d] = DomainVerdict::ranked(
                        Stage::Loaded,
                        self.verdicts[d].score,
                        Cow::Borrowed("tool loaded by name this turn"),
                    );
                }
            }
        }
    }

    /// A follow-up with no evidence of its own (`yes do it`) sees what the last turn
    /// sent on its message's evidence.
    pub(crate) fn carry_over(&mut self) {
        if self.chit_chat {
            self.notes.push("chit-chat: core only".to_owned());
        }
        if !self.router.config.carry_over || self.evidence_found || self.chit_chat {
            return;
        }
        let router = self.router;
        for name in &self.input.session.carried_tools {
            let Some(t) = router.registry.tool_idx(name) else {
                continue;
            };
            let d = router.names.tool_domains[t];
            if !self.evidence.active[d]
                || self.verdicts[d].stage == Stage::Unloaded
                || self.sent.has(t)
            {
                continue;
            }
            self.send(t, Stage::Carried);
            if !self.verdicts[d].included() {
                self.verdicts[d] = DomainVerdict::ranked(
                    Stage::Carried,
                    self.verdicts[d].score,
                    Cow::Borrowed("sent last turn; this message has no evidence of its own"),
                );
            }
        }
    }

    /// A small selection also takes the nearest misses (backfill); a selection with
    /// nothing optional falls back to the best domains that fit.
    pub(crate) fn backfill_or_fallback(&mut self) {
        if self.chit_chat {
            return;
        }
        let router = self.router;
        let any_optional = (0..self.verdicts.len())
            .any(|d| !router.domain_is_core[d] && self.verdicts[d].included());
        if any_optional && router.config.backfill_tokens > 0 {
            self.backfill();
        }
        if !any_optional {
            self.fallback();
        }
    }

    /// The learned stage: per piece, the domains the past messages most like it vote
    /// for (at least `learned_min_score`, at most `learned_top_k`) send the tools that
    /// carry the vote, in addition to what the other stages sent: it runs after them,
    /// so it takes nothing's place, and the budget trims its tools first. Without
    /// history a selection is what it was.
    pub(crate) fn learned(&mut self) {
        let Some(index) = self.input.learned else {
            return;
        };
        if self.chit_chat {
            return;
        }
        let router = self.router;
        let config = &router.config;
        for p in 0..self.evidence.pieces.len() {
            let votes: Vec<LearnedVote> = self.evidence.pieces[p]
                .learned
                .iter()
                .filter(|v| v.score >= config.learned_min_score)
                .take(config.learned_top_k)
                .copied()
                .collect();
            for vote in votes {
                let d = vote.domain;
                if !self.evidence.active[d]
                    || router.domain_is_core[d]
                    || self.verdicts[d].stage == Stage::Unloaded
                {
                    continue;
                }
                // The domain's tools that carry the vote, best first.
                let mut voted: Vec<usize> = router.tools_by_domain[d]
                    .iter()
                    .copied()
                    .filter(|&t| self.evidence.tool_learned[t] >= 0.5 * vote.score)
                    .collect();
                voted.sort_unstable_by(|&a, &b| {
                    self.evidence.tool_learned[b]
                        .total_cmp(&self.evidence.tool_learned[a])
                        .then(a.cmp(&b))
                });
                voted.truncate(config.domain_tool_cap);
                let mut added = false;
                for t in voted {
                    if !self.sent.has(t) {
                        self.sent.set(t, (Stage::Learned, vote.score));
                        self.tool_outcomes.set(t, (Stage::Learned, true));
                        added = true;
                    }
                }
                if added && !self.verdicts[d].included() {
                    let piece_name = if p == 0 {
                        Cow::Borrowed("the message")
                    } else {
                        Cow::Owned(format!("request {p}"))
                    };
                    let example: String = index.message(vote.example).chars().take(60).collect();
                    let reason = format!(
                        "{piece_name}: learned {:.2}: {} past {} like \"{example}\"",
                        vote.score,
                        vote.n_turns,
                        if vote.n_turns == 1 { "turn" } else { "turns" }
                    );
                    self.verdicts[d] =
                        DomainVerdict::ranked(Stage::Learned, vote.score, reason.into());
                }
            }
        }
    }

    /// Adds the domains nearest to the similarity gates while the selection stays
    /// under `backfill_tokens`: best similarity first (the raw cosine breaks ties),
    /// each with its best-ranked tools up to `backfill_tool_cap`.
    fn backfill(&mut self) {
        let router = self.router;
        let config = &router.config;
        let limit = config.backfill_tokens;
        let mut tokens = self.sent_tokens();
        let mut n_tools = self.sent.len();
        if tokens >= limit || n_tools >= config.backfill_tools {
            return;
        }
        let evidence = &self.evidence;
        let mut order: Vec<usize> = (0..self.verdicts.len())
            .filter(|&d| {
                evidence.active[d]
                    && !router.domain_is_core[d]
                    && self.verdicts[d].stage == Stage::NotMatched
                    && (evidence.domain_similarity[d] > 0.0 || evidence.domain_best_dense[d] > 0.0)
            })
            .collect();
        order.sort_unstable_by(|&a, &b| {
            evidence.domain_similarity[b]
                .total_cmp(&evidence.domain_similarity[a])
                .then(evidence.domain_best_dense[b].total_cmp(&evidence.domain_best_dense[a]))
                .then(a.cmp(&b))
        });
        let cap = config.domain_tool_cap.min(config.backfill_tool_cap.max(1));
        for d in order {
            let mut members = router.tools_by_domain[d].clone();
            best_first(&mut members, cap, |t| self.tool_score(t));
            let rest = members.split_off(members.len().min(cap));
            let cost: usize = members.iter().map(|&t| router.tool_tokens[t]).sum();
            if tokens + cost > limit || n_tools + members.len() > config.backfill_tools {
                continue;
            }
            tokens += cost;
            n_tools += members.len();
            self.ranked_out.extend(rest);
            for &t in &members {
                self.send(t, Stage::Backfill);
            }
            self.verdicts[d] = DomainVerdict::ranked(
                Stage::Backfill,
                self.verdicts[d].score,
                Cow::Owned(format!(
                    "{}; sent: the selection had room under {limit} tokens",
                    self.verdicts[d].reason
                )),
            );
        }
    }

    /// Nothing optional was selected: sends every active tool if that fits the
    /// budget, else the best domains (by similarity, warm ones first on ties) that
    /// fit, each with its best `fallback_tool_cap` tools, and hints the rest.
    fn fallback(&mut self) {
        let router = self.router;
        let budget = self.budget;
        let evidence = &self.evidence;
        let optional: Vec<usize> = (0..self.verdicts.len())
            .filter(|&d| {
                evidence.active[d]
                    && !router.domain_is_core[d]
                    && self.verdicts[d].stage == Stage::NotMatched
            })
            .collect();
        let domain_tokens = |d: usize| -> usize { router.domain_tokens[d] };
        let mut tokens = self.sent_tokens();
        let all_optional_tokens: usize = optional.iter().map(|&d| domain_tokens(d)).sum();
        let fits_whole = tokens + all_optional_tokens <= budget;
        let mut order = optional;
        let session = self.input.session;
        let warm: Vec<bool> = router
            .registry
            .domains()
            .iter()
            .map(|domain| session.warm.contains(&domain.name))
            .collect();
        // Best first: similarity, then the raw cosine (which still orders domains when
        // no score reaches the calibrated scale), warm ones first on ties, then the
        // cheaper domain (more of them fit).
        order.sort_unstable_by(|&a, &b| {
            evidence.domain_similarity[b]
                .total_cmp(&evidence.domain_similarity[a])
                .then(evidence.domain_best_dense[b].total_cmp(&evidence.domain_best_dense[a]))
                .then(warm[b].cmp(&warm[a]))
                .then(domain_tokens(a).cmp(&domain_tokens(b)))
                .then(a.cmp(&b))
        });
        let cap = router.config.fallback_tool_cap;
        for d in order {
            let score = self.evidence.domain_similarity[d];
            let stage = if warm[d] {
                Stage::Warm
            } else {
                Stage::Fallback
            };
            let members = &router.tools_by_domain[d];
            if !fits_whole && cap > 0 && members.len() > cap {
                let mut best = members.clone();
                best_first(&mut best, cap, |t| self.tool_score(t));
                let rest = best.split_off(cap);
                let cost: usize = best.iter().map(|&t| router.tool_tokens[t]).sum();
                if tokens + cost <= budget {
                    tokens += cost;
                    self.verdicts[d] = DomainVerdict::ranked(
                        stage,
                        score,
                        Cow::Owned(format!(
                            "nothing matched: its best {cap} tools, among the best domains that fit {budget} tokens"
                        )),
                    );
                    for &t in &best {
                        self.send(t, stage);
                    }
                    self.ranked_out.extend(rest);
                    continue;
                }
            }
            let cost = domain_tokens(d);
            if fits_whole || tokens + cost <= budget {
                tokens += cost;
                let reason = if fits_whole {
                    Cow::Borrowed("nothing matched: every active tool fits the budget")
                } else {
                    Cow::Owned(format!(
                        "nothing matched: among the best domains that fit {budget} tokens"
                    ))
                };
                self.verdicts[d] = DomainVerdict::whole(stage, score, reason);
                for &t in members {
                    self.send(t, stage);
                }
            } else {
                self.verdicts[d].reason =
                    Cow::Borrowed("nothing matched and it does not fit the budget: hinted");
                self.ranked_out.extend(members.iter().copied());
            }
        }
    }

    /// After a finder was called, the tools that take what it found (the model is one
    /// step into a workflow, so they rank above what the message resembles); and with
    /// each sent tool, the tool that finds its ids.
    pub(crate) fn workflow_steps(&mut self) {
        let router = self.router;
        let mut steps = Vec::new();
        for (_, name) in &self.input.session.recent_calls {
            if let Some(t) = router.registry.tool_idx(name) {
                steps.extend(
                    router.consumers[t]
                        .iter()
                        .map(|&c| (c, Stage::NextStep, NEXT_STEP_SCORE + self.tool_score(c))),
                );
            }
        }
        for t in self.sent.sorted() {
            if let Some((stage, score)) = self.sent.get(t)
                && !matches!(stage, Stage::Fallback | Stage::Warm | Stage::AlwaysOn)
            {
                steps.extend(
                    router.prerequisites[t]
                        .iter()
                        .map(|&p| (p, Stage::Prerequisite, score)),
                );
            }
        }
        for (p, stage, score) in steps {
            let d = router.names.tool_domains[p];
            if !self.sent.has(p)
                && self.evidence.active[d]
                && self.verdicts[d].stage != Stage::Unloaded
            {
                self.sent.set(p, (stage, score));
                self.tool_outcomes.set(p, (stage, true));
                if !self.verdicts[d].included() {
                    let why = match stage {
                        Stage::NextStep => {
                            "a tool called this turn or the last finds what it takes"
                        }
                        _ => "a sent tool needs ids one of its tools finds",
                    };
                    self.verdicts[d] =
                        DomainVerdict::ranked(stage, self.verdicts[d].score, Cow::Borrowed(why));
                }
            }
        }
    }

    /// Two conflicting tools both sent: keep the better-scoring one unless both were
    /// matched by keyword or both their domains were used this session.
    pub(crate) fn tool_collisions(&mut self) {
        let router = self.router;
        let tools = router.registry.all_tools();
        let session = self.input.session;
        for t in self.sent.sorted() {
            for &other in &router.tool_conflicts[t] {
                let (Some((stage_t, score_t)), Some((stage_o, score_o))) =
                    (self.sent.get(t), self.sent.get(other))
                else {
                    continue;
                };
                if other <= t {
                    continue;
                }
                let matched = |tool: usize| {
                    self.evidence.tool_keyword_hits[tool] > 0
                        || self.verdicts[router.names.tool_domains[tool]].stage == Stage::Keyword
                };
                let used = |tool: usize| {
                    session
                        .state(&tools[tool].domain)
                        .is_some_and(|s| !s.unloaded && s.last_used_turn > i64::MIN / 2)
                };
                if (matched(t) && matched(other)) || (used(t) && used(other)) {
                    continue;
                }
                let (loser, loser_stage) = if score_t >= score_o {
                    (other, stage_o)
                } else {
                    (t, stage_t)
                };
                if is_collision_protected(loser_stage)
                    || router.domain_is_core[router.names.tool_domains[loser]]
                {
                    continue;
                }
                self.sent.clear(loser);
                self.ranked_out.push(loser);
                self.tool_outcomes.set(loser, (Stage::Collision, false));
            }
        }
    }

    /// A destructive tool (`destructive = true`, MCP's `destructiveHint`) is sent only
    /// on direct evidence for it: the message asks for that action (one of the tool's
    /// keywords; its verb and object; a destructive verb while its domain is what the
    /// message or the conversation is about; the best match of its domain's tools), a
    /// workflow step, an explicit load or pin, or the last turn sent it on such
    /// evidence (carry-over: "delete the 2023 backups" → "are you sure?" → "yes").
    /// Backfill, fallback or a match of its domain alone never send one.
    pub(crate) fn destructive_guard(&mut self) {
        let router = self.router;
        if !router.config.destructive_needs_evidence {
            return;
        }
        let mut message_words: Vec<String> = Vec::new();
        crate::lexical::for_each_term(&self.input.message.to_lowercase(), |term| {
            message_words.push(term.to_owned())
        });
        let asks_to_destroy = message_words.iter().any(|w| {
            DESTRUCTIVE_VERBS
                .iter()
                .any(|v| crate::lexical::stem(v) == w)
        });
        for t in self.sent.sorted() {
            let Some((stage, _)) = self.sent.get(t) else {
                continue;
            };
            let d = router.names.tool_domains[t];
            let domain_stage = self.verdicts.get(d).map(|v| v.stage);
            let about_its_domain = matches!(
                domain_stage,
                Some(
                    Stage::Keyword
                        | Stage::Bm25
                        | Stage::Dense
                        | Stage::Fused
                        | Stage::Learned
                        | Stage::Sticky
                        | Stage::Pinned
                        | Stage::Carried
                )
            ) || (domain_stage == Some(Stage::Scored)
                && self.top_domain == Some(d));
            // A domain the scorer sent counts only when it is what the message is
            // about: "delete all my notes" is about memory, not the scratchpad.
            let on_message_evidence = matches!(
                domain_stage,
                Some(Stage::Keyword | Stage::Bm25 | Stage::Dense | Stage::Fused)
            ) || (domain_stage == Some(Stage::Scored)
                && self.top_domain == Some(d));
            if !router.destructive[t]
                || matches!(
                    stage,
                    Stage::Loaded
                        | Stage::Pinned
                        | Stage::NextStep
                        | Stage::Prerequisite
                        | Stage::Carried
                        | Stage::AlwaysOn
                )
                || self.evidence.tool_keyword_hits[t] > 0
                || router.tool_actions[t]
                    .as_ref()
                    .is_some_and(|action| action.named_in(&message_words))
                || (asks_to_destroy && about_its_domain)
                || (on_message_evidence && self.is_top_match_of_its_domain(t))
                || self.is_learned_for_its_domain(t)
            {
                continue;
            }
            self.sent.clear(t);
            self.ranked_out.push(t);
            self.tool_outcomes.set(t, (Stage::NoDirectEvidence, false));
        }
    }

    /// The tool is the most similar to the message of its domain's tools, and among
    /// the few most similar of all: its own text matches, not just its domain's. Only
    /// with the dense stage: BM25 alone ranks a short message's stray word too high
    /// ("remind me to call mom at 6" ranks `reboot_server` among the first five).
    fn is_top_match_of_its_domain(&self, t: usize) -> bool {
        const TOP: usize = 5;
        if !self.evidence.dense_on {
            return false;
        }
        let similarity = &self.evidence.tool_similarity;
        let own = similarity.get(t).copied().unwrap_or(0.0);
        let domain = &self.router.tools_by_domain[self.router.names.tool_domains[t]];
        own > 0.0
            && domain
                .iter()
                .all(|&other| other == t || similarity.get(other).copied().unwrap_or(0.0) < own)
            && similarity.iter().filter(|&&other| other > own).count() < TOP
    }

    /// Past messages like this one called the tool, more than any other tool of its
    /// domain: a repair (`load_tools`, or `search_tools` then a call) on a message like
    /// this is direct evidence.
    fn is_learned_for_its_domain(&self, t: usize) -> bool {
        let learned = &self.evidence.tool_learned;
        let own = learned.get(t).copied().unwrap_or(0.0);
        own > 0.0
            && self.router.tools_by_domain[self.router.names.tool_domains[t]]
                .iter()
                .all(|&other| other == t || learned.get(other).copied().unwrap_or(0.0) < own)
    }

    /// Trims the lowest-scoring optional tools to the token budget: never core,
    /// pinned, sticky, loaded, or fallback (already fitted) ones.
    pub(crate) fn token_budget(&mut self) {
        let mut tokens = self.sent_tokens();
        if tokens <= self.budget || self.input.session.load_all_this_turn {
            return;
        }
        // What the learned stage added goes first: it only ever adds.
        let mut trimmable: Vec<(bool, f32, usize)> = self
            .sent
            .iter()
            .filter(|&(_, (stage, _))| {
                !is_protected(stage) && !matches!(stage, Stage::Fallback | Stage::Warm)
            })
            .map(|(t, (stage, score))| (stage == Stage::Learned, score, t))
            .collect();
        trimmable
            .sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.total_cmp(&b.1)).then(b.2.cmp(&a.2)));
        for (_, _, t) in trimmable {
            if tokens <= self.budget {
                break;
            }
            self.sent.clear(t);
            tokens -= self.router.tool_tokens[t];
            self.ranked_out.push(t);
            self.tool_outcomes.set(t, (Stage::BudgetTrimmed, false));
        }
    }

    /// Tokens of the tools being sent.
    fn sent_tokens(&self) -> usize {
        self.sent
            .iter()
            .map(|(t, _)| self.router.tool_tokens[t])
            .sum()
    }

    /// Unconfigured domains with a keyword, or past the similarity gate a configured
    /// domain would need and better than the always-on domains, that score at least
    /// as well as the best domain sent on the message's evidence: at most
    /// `MAX_UNCONFIGURED`, best first. Never for chit-chat.
    fn unconfigured_matches(&self) -> Vec<Unconfigured> {
        const MAX_UNCONFIGURED: usize = 3;
        let router = self.router;
        let config = &router.config;
        let evidence = &self.evidence;
        if self.chit_chat {
            return Vec::new();
        }
        let best_sent = self
            .verdicts
            .iter()
            .filter(|v| {
                v.included()
                    && matches!(
                        v.stage,
                        Stage::Keyword
                            | Stage::Bm25
                            | Stage::Dense
                            | Stage::Fused
                            | Stage::Learned
                            | Stage::Scored
                    )
            })
            .map(|v| v.score)
            .fold(0.0f32, f32::max);
        let mut matches: Vec<Unconfigured> = Vec::new();
        for (d, domain) in router.registry.domains().iter().enumerate() {
            if evidence.active[d] || router.domain_is_core[d] {
                continue;
            }
            // Naming a domain makes the model ask the user for its settings, so it
            // needs more than a configured domain would: the gate of its stage, and a
            // better fit than the always-on tools already sent ("what time is it?"
            // shares "time" with the file tools, but `current_time` explains it).
            let bm25 = evidence.pieces.iter().any(|p| {
                let b = p.domain_bm25[d];
                b >= config.bm25_min_score
                    && b >= config.bm25_relative * best_of(&p.domain_bm25, &router.domain_is_core)
                    && b > best_of_core(&p.domain_bm25, &router.domain_is_core)
            });
            let dense = evidence.dense_on
                && evidence.pieces.iter().any(|p| {
                    let c = p.domain_dense[d];
                    c >= config.dense_min_score
                        && c >= best_of(&p.domain_dense, &router.domain_is_core)
                            - config.dense_margin
                        && c > best_of_core(&p.domain_dense, &router.domain_is_core)
                });
            let hits = evidence.keyword_hits_in_domain[d];
            let stage = match (hits > 0, bm25, dense) {
                (true, ..) => Stage::Keyword,
                (false, true, true) => Stage::Fused,
                (false, true, false) => Stage::Bm25,
                (false, false, true) => Stage::Dense,
                (false, false, false) => continue,
            };
            let score = keyword_score(hits).max(evidence.domain_similarity[d]);
            if score < best_sent {
                continue;
            }
            matches.push(Unconfigured {
                domain: router.names.domains[d].clone(),
                missing_settings: router
                    .registry
                    .missing_settings(&domain.name, self.input.settings),
                stage,
                score,
            });
        }
        matches.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.domain.cmp(&b.domain)));
        matches.truncate(MAX_UNCONFIGURED);
        matches
    }

    /// The selection: domain decisions as what is actually sent says, the sent tools
    /// (core first, then by score), and hints for the best of the rest.
    pub(crate) fn finish(self) -> Selection {
        let unconfigured = self.unconfigured_matches();
        let Pass {
            router,
            budget,
            mut notes,
            verdicts,
            n_active_tools,
            sent,
            tool_outcomes,
            mut ranked_out,
            ..
        } = self;
        let names = &router.names;
        let config = &router.config;
        let tokens: usize = sent.iter().map(|(t, _)| router.tool_tokens[t]).sum();
        let mut n_sent_by_domain = vec![0usize; verdicts.len()];
        for (t, _) in sent.iter() {
            n_sent_by_domain[names.tool_domains[t]] += 1;
        }
        let domain_scores: Vec<f32> = self.domain_scores;
        let probability = &self.probability;
        let tool_score = |t: usize| -> f32 {
            if config.scorer {
                return probability[t];
            }
            domain_scores[names.tool_domains[t]]
                + self.evidence.tool_similarity.get(t).copied().unwrap_or(0.0)
                + 0.5 * f32::from(self.evidence.tool_keyword_hits[t].min(2))
                + router.tool_prior[t]
        };
        let domains: Vec<DomainDecision> = verdicts
            .into_iter()
            .enumerate()
            .map(|(d, verdict)| {
                let included = n_sent_by_domain[d] > 0;
                let (stage, reason) = if verdict.included() && !included {
                    (
                        Stage::BudgetTrimmed,
                        format!("{}; trimmed to fit {budget} tokens", verdict.reason).into(),
                    )
                } else {
                    (verdict.stage, verdict.reason)
                };
                DomainDecision {
                    domain: names.domains[d].clone(),
                    included,
                    stage,
                    score: verdict.score,
                    reason,
                }
            })
            .collect();

        let mut selected: Vec<SelectedTool> = sent
            .iter()
            .map(|(t, (stage, score))| SelectedTool {
                name: names.tools[t].clone(),
                domain: names.domains[names.tool_domains[t]].clone(),
                stage,
                score,
                tokens: router.tool_tokens[t],
                tool_idx: t,
            })
            .collect();
        selected.sort_unstable_by(|a, b| {
            let a_core = router.domain_is_core[names.tool_domains[a.tool_idx]];
            let b_core = router.domain_is_core[names.tool_domains[b.tool_idx]];
            b_core
                .cmp(&a_core)
                .then(b.score.total_cmp(&a.score))
                .then(a.tool_idx.cmp(&b.tool_idx))
        });

        // Only the best `max_hints` need an order: with a large domain ranked out, a
        // full sort of every hinted-out tool would dominate the selection's cost.
        let mut seen = vec![false; router.tool_tokens.len()];
        ranked_out.retain(|&t| !sent.has(t) && !std::mem::replace(&mut seen[t], true));
        best_first(&mut ranked_out, config.max_hints, tool_score);
        let mut hints = Vec::with_capacity(ranked_out.len().min(config.max_hints));
        let mut hint_tokens = 0;
        for &t in ranked_out.iter().take(config.max_hints) {
            hint_tokens += router.hint_tokens[t];
            hints.push(router.hint_for(t));
        }
        let tool_decisions: Vec<ToolDecision> = tool_outcomes
            .sorted()
            .into_iter()
            .filter_map(|t| {
                tool_outcomes.get(t).map(|(stage, included)| ToolDecision {
                    tool: names.tools[t].clone(),
                    domain: names.domains[names.tool_domains[t]].clone(),
                    included: included && sent.has(t),
                    stage,
                    score: tool_score(t),
                    tool_idx: t,
                })
            })
            .collect();
        if hints.len() < ranked_out.len() && ranked_out.len() > config.max_hints {
            notes.push(format!(
                "{} more tools not hinted",
                ranked_out.len() - hints.len()
            ));
        }

        Selection {
            n_tools: selected.len(),
            tools: selected,
            hints,
            domains,
            tool_decisions,
            tokens,
            hint_tokens,
            all_tools_tokens: router.all_tools_tokens,
            token_budget: budget,
            n_active_tools,
            unconfigured,
            notes,
        }
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

    fn len(&self) -> usize {
        self.iter().count()
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
    /// Large domains: the best tools, hints for the rest.
    Ranked,
}

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

/// Added to a next step's own score: above what similarity alone gives, so the token
/// budget trims it after the tools the message merely resembles.
const NEXT_STEP_SCORE: f32 = 1.0;

/// Stages whose tools the budget may not drop.
fn is_protected(stage: Stage) -> bool {
    matches!(
        stage,
        Stage::AlwaysOn | Stage::Sticky | Stage::Pinned | Stage::Loaded
    )
}

/// Stages a collision may not drop: the model or the workflow asked for them. Sticky
/// is not among them: a conflicting tool the message itself points at beats one that
/// is merely still loaded.
fn is_collision_protected(stage: Stage) -> bool {
    matches!(stage, Stage::AlwaysOn | Stage::Pinned | Stage::Loaded)
}

/// Puts `tools` best first (score descending, then index), scoring each tool once.
/// Only the first `keep` are put in order; the rest follow them in no order (callers
/// hint those, ordered again with the other hints).
pub(crate) fn best_first(tools: &mut [usize], keep: usize, score: impl Fn(usize) -> f32) {
    if keep == 0 || tools.is_empty() {
        return;
    }
    let mut scored: Vec<(f32, usize)> = tools.iter().map(|&t| (score(t), t)).collect();
    let order = |a: &(f32, usize), b: &(f32, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if keep < scored.len() {
        scored.select_nth_unstable_by(keep - 1, order);
        scored[..keep].sort_unstable_by(order);
    } else {
        scored.sort_unstable_by(order);
    }
    for (slot, (_, t)) in tools.iter_mut().zip(scored) {
        *slot = t;
    }
}

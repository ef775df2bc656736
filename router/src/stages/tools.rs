//! The stages that send tools by rule: loaded by name, and with the stage rules
//! (`scorer = false`) carry-over, backfill or fallback, learned votes and workflow
//! steps.

use super::*;

impl Pass<'_> {
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
}

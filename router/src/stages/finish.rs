//! The last stage: the selection, its decisions and hints, and the unconfigured
//! domains the message points at.

use super::*;

impl Pass<'_> {
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
        // On the scale of the unconfigured domain's own score: keyword hits and
        // similarity, not the scorer's probability.
        let evidence_score = |d: usize| {
            keyword_score(evidence.keyword_hits_in_domain[d]).max(evidence.domain_similarity[d])
        };
        let best_sent = (0..self.verdicts.len())
            .filter(|&d| {
                let v = &self.verdicts[d];
                v.included() && matches!(v.stage, Stage::Keyword | Stage::Scored)
            })
            .map(evidence_score)
            .fold(0.0f32, f32::max);
        // A follow-up the last turn's tools were carried into is about them: only a
        // keyword of its own names a domain.
        let follow_up = self
            .sent
            .iter()
            .any(|(_, (stage, _))| stage == Stage::Carried);
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
                _ if follow_up => continue,
                (false, true, true) => Stage::Fused,
                (false, true, false) => Stage::Bm25,
                (false, false, true) => Stage::Dense,
                (false, false, false) => continue,
            };
            let score = evidence_score(d);
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
    pub(crate) fn finish(mut self) -> Selection {
        self.explain_scored();
        let unconfigured = self.unconfigured_matches();
        let router = self.router;
        let tokens: usize = self.sent.iter().map(|(t, _)| router.tool_tokens[t]).sum();
        let domains = self.domain_decisions();
        let tools = self.selected_tools();
        let (hints, hint_tokens) = self.hints();
        let tool_decisions = self.tool_decisions();
        Selection {
            n_tools: tools.len(),
            tools,
            hints,
            domains,
            tool_decisions,
            tokens,
            hint_tokens,
            all_tools_tokens: router.all_tools_tokens,
            token_budget: self.budget,
            n_active_tools: self.n_active_tools,
            unconfigured,
            notes: self.notes,
        }
    }

    /// Each domain's verdict, told by what is actually sent: a domain left without a
    /// tool says why (the destructive rule, a collision or the budget).
    fn domain_decisions(&mut self) -> Vec<DomainDecision> {
        let names = &self.router.names;
        let n_sent_by_domain = self.sent_by_domain();
        // Per domain, the stage that held its tools back: `Some(Some(stage))` when one
        // did, `Some(None)` when several did (then the budget is named, as it trims
        // last), `None` when none did.
        let mut held_back_by: Vec<Option<Option<Stage>>> = vec![None; self.verdicts.len()];
        for (t, stage) in self.held_back.iter() {
            let slot = &mut held_back_by[names.tool_domains[t]];
            *slot = match *slot {
                None => Some(Some(stage)),
                Some(Some(held)) if held == stage => Some(Some(held)),
                Some(_) => Some(None),
            };
        }
        let budget = self.budget;
        std::mem::take(&mut self.verdicts)
            .into_iter()
            .enumerate()
            .map(|(d, verdict)| {
                let included = n_sent_by_domain[d] > 0;
                let (stage, reason) = if verdict.included() && !included {
                    let (stage, why) = match held_back_by[d] {
                        Some(Some(Stage::NoDirectEvidence)) => (
                            Stage::NoDirectEvidence,
                            "destructive, held back without direct evidence".to_owned(),
                        ),
                        Some(Some(Stage::Collision)) => (
                            Stage::Collision,
                            "held back: conflicts with a tool sent".to_owned(),
                        ),
                        _ => (
                            Stage::BudgetTrimmed,
                            format!("trimmed to fit {budget} tokens"),
                        ),
                    };
                    (stage, format!("{}; {why}", verdict.reason).into())
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
            .collect()
    }

    /// The tools sent, core first, then by score.
    fn selected_tools(&self) -> Vec<SelectedTool> {
        let router = self.router;
        let names = &router.names;
        let model = self.model();
        let candidates = &self.candidates;
        // The row the scorer weighed the tool on, if it did.
        let why = |t: usize| {
            candidates
                .position(t)
                .map_or_else(Why::default, |i| model.why(candidates.row(i)))
        };
        let mut selected: Vec<SelectedTool> = self
            .sent
            .iter()
            .map(|(t, (stage, score))| SelectedTool {
                name: names.tools[t].clone(),
                domain: names.domains[names.tool_domains[t]].clone(),
                stage,
                score,
                tokens: router.tool_tokens[t],
                why: why(t),
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
        selected
    }

    /// Hints for the best `max_hints` tools considered and not sent, and their tokens;
    /// a note counts the rest.
    fn hints(&mut self) -> (Vec<crate::selection::Hint>, usize) {
        let router = self.router;
        let max_hints = router.config.max_hints;
        // Only the best `max_hints` need an order: with a large domain ranked out, a
        // full sort of every hinted-out tool would dominate the selection's cost.
        let mut seen = vec![false; router.tool_tokens.len()];
        let mut ranked_out = std::mem::take(&mut self.ranked_out);
        ranked_out.retain(|&t| !self.sent.has(t) && !std::mem::replace(&mut seen[t], true));
        best_first(&mut ranked_out, max_hints, |t| self.probability[t]);
        let mut hints = Vec::with_capacity(ranked_out.len().min(max_hints));
        let mut hint_tokens = 0;
        for &t in ranked_out.iter().take(max_hints) {
            hint_tokens += router.hint_tokens[t];
            hints.push(router.hint_for(t));
        }
        if hints.len() < ranked_out.len() && ranked_out.len() > max_hints {
            self.notes.push(format!(
                "{} more tools not hinted",
                ranked_out.len() - hints.len()
            ));
        }
        (hints, hint_tokens)
    }

    /// Every tool held back one by one, with what held it back.
    fn tool_decisions(&self) -> Vec<ToolDecision> {
        let names = &self.router.names;
        self.held_back
            .sorted()
            .into_iter()
            .filter_map(|t| {
                self.held_back.get(t).map(|stage| ToolDecision {
                    tool: names.tools[t].clone(),
                    domain: names.domains[names.tool_domains[t]].clone(),
                    stage,
                    score: self.probability[t],
                    tool_idx: t,
                })
            })
            .collect()
    }
}

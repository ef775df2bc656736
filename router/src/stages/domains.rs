//! The domain stages: the verdict on every domain (activation, the session's hold,
//! keywords, chit-chat) before the scorer, and collisions between domains after it.

use super::*;

impl Pass<'_> {
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

    /// Two conflicting domains (`conflicts` in a toolkit) both sending tools: the one
    /// whose likeliest tool is less likely goes, unless the message matched both by
    /// keyword or the session used both.
    pub(crate) fn domain_collisions(&mut self) {
        let router = self.router;
        if router.domain_conflicts.iter().all(Vec::is_empty) {
            return;
        }
        let mut sending = self.sent_by_domain();
        for d in 0..self.verdicts.len() {
            for &other in &router.domain_conflicts[d] {
                if other <= d || sending[d] == 0 || sending[other] == 0 {
                    continue;
                }
                let (stage_d, stage_other) = (self.verdicts[d].stage, self.verdicts[other].stage);
                let both_justified = (stage_d == Stage::Keyword && stage_other == Stage::Keyword)
                    || (is_held(stage_d) && is_held(stage_other));
                if both_justified {
                    continue;
                }
                let (winner, loser) = if self.domain_scores[d] >= self.domain_scores[other] {
                    (d, other)
                } else {
                    (other, d)
                };
                if is_protected(self.verdicts[loser].stage) {
                    continue;
                }
                for &t in &router.tools_by_domain[loser] {
                    if let Some((stage, _)) = self.sent.get(t)
                        && !is_protected(stage)
                    {
                        self.sent.clear(t);
                        self.ranked_out.push(t);
                        self.held_back.set(t, Stage::Collision);
                    }
                }
                sending[loser] = 0;
                if let Some(slot) = self.scored_reason.get_mut(loser) {
                    *slot = None;
                }
                let winner_name = &router.registry.domains()[winner].name;
                self.verdicts[loser] = DomainVerdict::out(
                    Stage::Collision,
                    self.verdicts[loser].score,
                    format!("conflicts with {winner_name}, which scored higher").into(),
                );
            }
        }
    }
}

//! The stages that may take tools back out: collisions between tools, the
//! destructive guard, the token budget.

use super::*;

/// [`DESTRUCTIVE_VERBS`] stemmed as message words are, once: stemming them for every
/// word of every message was a fifth of a lexical selection's time.
static DESTRUCTIVE_STEMS: std::sync::LazyLock<Vec<&'static str>> = std::sync::LazyLock::new(|| {
    DESTRUCTIVE_VERBS
        .iter()
        .map(|v| crate::lexical::stem(v))
        .collect()
});

impl Pass<'_> {
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
                if is_protected(loser_stage)
                    || router.domain_is_core[router.names.tool_domains[loser]]
                {
                    continue;
                }
                self.sent.clear(loser);
                self.ranked_out.push(loser);
                self.held_back.set(loser, Stage::Collision);
            }
        }
    }

    /// A destructive tool (`destructive = true`, MCP's `destructiveHint`) is sent only
    /// on direct evidence for it: the message asks for that action (one of the tool's
    /// keywords; its verb and object; a destructive verb while its domain is what the
    /// message or the conversation is about; the best match of its domain's tools; the
    /// tool past messages like it called most in its domain), an explicit load or pin,
    /// or the last turn sent it on such evidence (carry-over: "delete the 2023
    /// backups" → "are you sure?" → "yes", or "delete my account" → "my username is
    /// foo").
    /// A match of its domain alone never sends one.
    pub(crate) fn destructive_guard(&mut self) {
        let router = self.router;
        if !router.config.destructive_needs_evidence {
            return;
        }
        let message_words = &self.evidence.words;
        let asks_to_destroy = message_words
            .iter()
            .any(|w| DESTRUCTIVE_STEMS.contains(&w.as_str()));
        // The last turn's likeliest tools (what carry-over sends): asked for then, and
        // this turn may be the answer to the model's question ("delete my account" →
        // "my username is foo"), keywords of its own or not.
        let carried: Vec<usize> = self
            .input
            .session
            .carried_tools
            .iter()
            .filter_map(|name| router.registry.tool_idx(name))
            .collect();
        for t in self.sent.sorted() {
            let Some((stage, _)) = self.sent.get(t) else {
                continue;
            };
            let d = router.names.tool_domains[t];
            let domain_stage = self.verdicts.get(d).map(|v| v.stage);
            let top_scored = domain_stage == Some(Stage::Scored) && self.top_domain == Some(d);
            let about_its_domain = top_scored
                || matches!(
                    domain_stage,
                    Some(Stage::Keyword | Stage::Sticky | Stage::Pinned | Stage::Carried)
                );
            // A domain the scorer sent counts only when it is what the message is
            // about: "delete all my notes" is about memory, not the scratchpad.
            let on_message_evidence = top_scored || domain_stage == Some(Stage::Keyword);
            if !router.destructive[t]
                || matches!(stage, Stage::Loaded | Stage::Pinned | Stage::AlwaysOn)
                || self.evidence.tool_keyword_hits[t] > 0
                || router.tool_actions[t]
                    .as_ref()
                    .is_some_and(|action| action.named_in(message_words))
                || (asks_to_destroy && about_its_domain)
                || (on_message_evidence && self.is_top_match_of_its_domain(t))
                || self.is_learned_for_its_domain(t)
                || carried.contains(&t)
            {
                continue;
            }
            self.sent.clear(t);
            self.ranked_out.push(t);
            self.held_back.set(t, Stage::NoDirectEvidence);
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
    /// pinned or loaded ones.
    pub(crate) fn token_budget(&mut self) {
        let mut tokens = self.sent_tokens();
        if tokens <= self.budget || self.input.session.load_all_this_turn {
            return;
        }
        let mut trimmable: Vec<(f32, usize)> = self
            .sent
            .iter()
            .filter(|&(_, (stage, _))| !is_protected(stage))
            .map(|(t, (_, score))| (score, t))
            .collect();
        trimmable.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(b.1.cmp(&a.1)));
        for (_, t) in trimmable {
            if tokens <= self.budget {
                break;
            }
            self.sent.clear(t);
            tokens -= self.router.tool_tokens[t];
            self.ranked_out.push(t);
            self.held_back.set(t, Stage::BudgetTrimmed);
        }
    }
}

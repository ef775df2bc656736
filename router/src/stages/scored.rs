//! The stages of the fitted scorer: every candidate tool's probability from its
//! features, then the selection by expected coverage. Pins, loads, core and the
//! destructive rule stay hard rules, applied around them.

use std::borrow::Cow;

use super::{DomainVerdict, Pass, Send};
use crate::Scorers;
use crate::evidence::BestFirst;
use crate::scorer::Compiled;
use crate::selection::Stage;

impl<'a> Pass<'a> {
    /// The path's model, borrowed from the scorers rather than the pass, so that the
    /// pass can change while it is read.
    pub(super) fn model(&self) -> &'a Compiled {
        let scorers: &'a Scorers = self.scorers;
        scorers.for_evidence(&self.evidence)
    }

    /// Every candidate tool's probability (none for chit-chat: core only).
    pub(crate) fn score_tools(&mut self) {
        self.domain_scores = vec![0.0; self.verdicts.len()];
        if self.chit_chat {
            return;
        }
        let router = self.router;
        let candidates = router.candidates(
            &self.evidence,
            self.input.session,
            self.input.learned,
            false,
        );
        let model = self.model();
        let row_probability: Vec<f32> = candidates
            .rows
            .iter()
            .map(|row| model.probability(row))
            .collect();
        for (&t, &r) in candidates.tools.iter().zip(&candidates.row_of) {
            let p = row_probability[r as usize];
            self.probability[t] = p;
            let d = router.names.tool_domains[t];
            self.domain_scores[d] = self.domain_scores[d].max(p);
        }
        // The tools nothing points at count toward the turn's mass only.
        let mut flags = [[0.0f32; 2]; 2];
        for (destructive, by_read) in flags.iter_mut().enumerate() {
            for (read, p) in by_read.iter_mut().enumerate() {
                let mut row = [0.0; crate::scorer::N_FEATURES];
                row[crate::scorer::f::DESTRUCTIVE] = destructive as f32;
                row[crate::scorer::f::READ_FIRST] = read as f32;
                *p = model.probability(&row);
            }
        }
        self.rest_mass = candidates
            .rest_by_flags
            .iter()
            .enumerate()
            .map(|(f, &count)| count as f32 * flags[f / 2][f % 2])
            .sum();
        self.candidates = candidates;
        // A follow-up with no keyword of its own ("yes, do it") sees what the last
        // turn sent on its evidence (`carry_over`, a hard rule).
        self.evidence_found = self.verdicts.iter().any(|v| v.stage == Stage::Keyword);
        self.top_domain = (0..self.domain_scores.len())
            .filter(|&d| self.domain_scores[d] > 0.0)
            .max_by(|&a, &b| {
                self.domain_scores[a]
                    .total_cmp(&self.domain_scores[b])
                    .then(b.cmp(&a))
            });
    }

    /// Core and `load_all_for_this_turn` send whole domains; a pinned domain sends
    /// every tool.
    pub(crate) fn send_held(&mut self) {
        let router = self.router;
        for d in 0..self.verdicts.len() {
            let stage = self.verdicts[d].stage;
            let hard = self.verdicts[d].send == Send::Whole || stage == Stage::Pinned;
            if !hard {
                continue;
            }
            for &t in &router.tools_by_domain[d] {
                let score = if stage == Stage::AlwaysOn {
                    1.0
                } else {
                    self.probability[t].max(self.verdicts[d].score)
                };
                self.sent.set(t, (stage, score));
            }
        }
    }

    /// Sends the likeliest tools: first each small domain whose likeliest tool is
    /// nearly as likely as the turn's likeliest (whole), then tools best first until
    /// what is sent holds the rule's share of the turn's probability mass, while the
    /// next tool is likely enough beside the likeliest, within the token budget.
    pub(crate) fn send_by_probability(&mut self) {
        if self.chit_chat {
            return;
        }
        let router = self.router;
        let rule = self.model().rule;
        let budget = self.budget;
        let mut tokens = self.sent_tokens();
        let probability = &self.probability;
        let mut order = BestFirst::new(&self.candidates.tools, |t| probability[t]);
        let Some(first) = order.next() else {
            return;
        };
        let best = probability[first];
        let mass: f32 = self
            .candidates
            .tools
            .iter()
            .map(|&t| probability[t])
            .sum::<f32>()
            + self.rest_mass;

        let small = (rule.whole_domain_share * budget as f32) as usize;
        let mut domains: Vec<usize> = (0..self.verdicts.len())
            .filter(|&d| {
                self.domain_scores[d] >= rule.whole_domain_ratio * best
                    && self.domain_scores[d] > 0.0
                    && router.domain_tokens[d] <= small
            })
            .collect();
        domains.sort_unstable_by(|&a, &b| {
            self.domain_scores[b]
                .total_cmp(&self.domain_scores[a])
                .then(a.cmp(&b))
        });
        let mut covered = 0.0f32;
        for d in domains {
            let members = &router.tools_by_domain[d];
            let cost: usize = members
                .iter()
                .filter(|&&t| !self.sent.has(t))
                .map(|&t| router.tool_tokens[t])
                .sum();
            if tokens + cost > budget {
                continue;
            }
            tokens += cost;
            for &t in members {
                if !self.sent.has(t) {
                    covered += self.probability[t];
                    self.sent.set(t, (Stage::Scored, self.probability[t]));
                }
            }
        }

        // Best first while the rule holds: the first tool it stops is held back, and
        // so is every tool after it (less likely, with no less covered).
        let floor = (rule.min_ratio * best).max(rule.min_probability);
        let mut stopped_at = None;
        for t in std::iter::once(first).chain(order.by_ref()) {
            if self.sent.has(t) {
                continue;
            }
            let p = self.probability[t];
            if p < floor || covered >= rule.coverage * mass {
                stopped_at = Some(t);
                break;
            }
            if tokens + router.min_tool_tokens > budget {
                // No tool fits any more: every tool left is held back, and those the
                // rule would have sent were trimmed. None needs an order.
                for t in std::iter::once(t).chain(order.rest()) {
                    if self.sent.has(t) {
                        continue;
                    }
                    self.ranked_out.push(t);
                    if self.probability[t] >= floor {
                        self.held_back.set(t, Stage::BudgetTrimmed);
                    }
                }
                break;
            }
            let cost = router.tool_tokens[t];
            if tokens + cost > budget {
                self.ranked_out.push(t);
                self.held_back.set(t, Stage::BudgetTrimmed);
                continue;
            }
            tokens += cost;
            covered += p;
            self.sent.set(t, (Stage::Scored, p));
        }
        // The held back fill the room under `fill_tokens`, best first, until none fits.
        let fill = rule.fill_tokens.min(budget);
        for t in stopped_at.into_iter().chain(order.by_ref()) {
            if self.sent.has(t) {
                continue;
            }
            if tokens + router.min_tool_tokens > fill {
                self.ranked_out.push(t);
                break;
            }
            let cost = router.tool_tokens[t];
            if tokens + cost <= fill {
                tokens += cost;
                self.sent.set(t, (Stage::Scored, self.probability[t]));
            } else {
                self.ranked_out.push(t);
            }
        }
        // The rest are hinted (in the hints' own order).
        let sent = &self.sent;
        self.ranked_out
            .extend(order.rest().filter(|&t| !sent.has(t)));
        self.settle_verdicts();
    }

    /// Domain decisions as the probabilities say: a domain that sent tools by
    /// probability is `scored` (unless a stage held it), a domain a keyword or the
    /// session pointed at whose tools fell short says so. Their reasons are written
    /// at the end (`explain_scored`), once the guards and the budget have had their
    /// say.
    fn settle_verdicts(&mut self) {
        let router = self.router;
        // Per domain, the candidate index of its likeliest tool.
        let mut best: Vec<Option<usize>> = vec![None; self.verdicts.len()];
        for (i, &t) in self.candidates.tools.iter().enumerate() {
            let d = router.names.tool_domains[t];
            let likelier = best[d]
                .is_none_or(|j| self.probability[t] > self.probability[self.candidates.tools[j]]);
            if likelier {
                best[d] = Some(i);
            }
        }
        let sent_by_domain = self.sent_by_domain();
        self.scored_reason = vec![None; self.verdicts.len()];
        for d in 0..self.verdicts.len() {
            let verdict = &self.verdicts[d];
            if matches!(verdict.send, Send::Whole) || verdict.stage == Stage::Pinned {
                continue;
            }
            let Some(i) = best[d] else {
                continue;
            };
            let p = self.probability[self.candidates.tools[i]];
            let sent = sent_by_domain[d] > 0;
            // A stage that held or pointed at the domain keeps its own words first
            // ("keyword \"table\"").
            let (stage, own_words) = if sent {
                let stage = match verdict.stage {
                    Stage::Keyword | Stage::Sticky | Stage::Loaded | Stage::Carried => {
                        verdict.stage
                    }
                    _ => Stage::Scored,
                };
                (stage, stage != Stage::Scored)
            } else {
                (verdict.stage, verdict.stage != Stage::NotMatched)
            };
            let reason = std::mem::take(&mut self.verdicts[d].reason);
            self.verdicts[d] = if sent {
                DomainVerdict::ranked(stage, p, reason)
            } else {
                DomainVerdict::out(stage, p, reason)
            };
            self.scored_reason[d] = Some(ScoredReason {
                own_words,
                likeliest: i,
            });
        }
    }

    /// The reasons of the domains the scorer settled: the likeliest tool the domain
    /// still sends (or, sending none, its likeliest) with the features that put it
    /// there.
    pub(crate) fn explain_scored(&mut self) {
        let router = self.router;
        let model = self.model();
        let candidates = &self.candidates;
        for d in 0..self.scored_reason.len() {
            let Some(ScoredReason {
                own_words,
                likeliest,
            }) = self.scored_reason[d]
            else {
                continue;
            };
            let sent = self.verdicts[d].included();
            let mut i = likeliest;
            if sent && !self.sent.has(candidates.tools[i]) {
                // Held back after the rule sent it: the likeliest tool still sent.
                let still_sent = router.tools_by_domain[d]
                    .iter()
                    .filter(|&&t| self.sent.has(t))
                    .filter_map(|&t| candidates.position(t))
                    .max_by(|&a, &b| {
                        let (ta, tb) = (candidates.tools[a], candidates.tools[b]);
                        self.probability[ta]
                            .total_cmp(&self.probability[tb])
                            .then(tb.cmp(&ta))
                    });
                i = still_sent.unwrap_or(likeliest);
            }
            let t = candidates.tools[i];
            let row = candidates.row(i);
            let mut reason = String::with_capacity(160);
            if own_words {
                reason.push_str(&self.verdicts[d].reason);
                reason.push_str("; ");
            }
            if !sent {
                reason.push_str("likeliest ");
            }
            reason.push_str(router.names.tools[t].as_str());
            reason.push(' ');
            model.explain_into(&mut reason, row, self.probability[t]);
            if !sent {
                reason.push_str(": below the rule");
            }
            self.verdicts[d].reason = Cow::Owned(reason);
        }
    }
}

/// What `explain_scored` needs of a domain the scorer settled.
#[derive(Clone, Copy)]
pub(super) struct ScoredReason {
    /// The verdict's own words ("keyword \"table\"") stay first.
    own_words: bool,
    /// The candidate index of its likeliest tool.
    likeliest: usize,
}

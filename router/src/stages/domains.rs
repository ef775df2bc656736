//! The domain stages: the verdict on every domain (activation, the session's hold,
//! keywords, chit-chat), and with the stage rules (`scorer = false`) similarity,
//! collisions between domains, and the tools of each domain decided.

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
                let piece = PieceRanks {
                    piece: p,
                    bm25: (bm25_scores[d], bm25_rank[d]),
                    dense: (dense_scores[d], dense_rank[d]),
                    fused: fused[d],
                };
                verdicts[d] = piece.verdict(router, bm25_gate, dense_gate, evidence.dense_on);
            }
        }
        if evidence.dense_on {
            self.say_how_close(&candidates, &best_dense_rank);
        }
    }

    /// With the dense stage, the domains left out say how close they came.
    fn say_how_close(&mut self, candidates: &[usize], best_dense_rank: &[usize]) {
        let evidence = &self.evidence;
        for &d in candidates {
            if self.verdicts[d].stage != Stage::NotMatched {
                continue;
            }
            let pieces = &evidence.pieces;
            let best_bm25 = pieces.iter().map(|p| p.domain_bm25[d]).fold(0.0, f32::max);
            let best_dense = evidence.domain_best_dense[d];
            let rank = Rank(best_dense_rank[d]);
            self.verdicts[d].reason = Cow::Owned(format!(
                "no keyword; bm25 {best_bm25:.2}, dense {best_dense:.2} ({rank}): below the gates or not among the best"
            ));
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
}

/// A domain's scores and ranks on one piece of the message (0: the whole message).
struct PieceRanks {
    piece: usize,
    bm25: (f32, usize),
    dense: (f32, usize),
    fused: f32,
}

impl PieceRanks {
    /// The verdict of a domain that passed a similarity gate on this piece.
    fn verdict(
        &self,
        router: &Router,
        bm25_gate: bool,
        dense_gate: bool,
        dense_on: bool,
    ) -> DomainVerdict {
        let stage = match (bm25_gate, dense_gate) {
            (true, true) => Stage::Fused,
            (false, true) => Stage::Dense,
            _ => Stage::Bm25,
        };
        let score = self.bm25.0.max(router.calibrated(self.dense.0));
        let piece_name = if self.piece == 0 {
            Cow::Borrowed("the message")
        } else {
            Cow::Owned(format!("request {}", self.piece))
        };
        let reason = if dense_on {
            format!(
                "{piece_name}: bm25 {:.2} ({}), dense {:.2} ({}), fused {:.2}",
                self.bm25.0,
                Rank(self.bm25.1),
                self.dense.0,
                Rank(self.dense.1),
                self.fused
            )
        } else {
            format!(
                "{piece_name}: bm25 {:.2} ({}) above threshold, among the best",
                self.bm25.0,
                Rank(self.bm25.1)
            )
        };
        DomainVerdict::ranked(stage, score, Cow::Owned(reason))
    }
}

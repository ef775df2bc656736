//! Feature rows for the fitted scorer ([`crate::scorer`]): what the evidence and the
//! session say of each candidate tool, every value on a 0..1 scale.

use std::collections::HashMap;

use crate::build::name_words;
use crate::evidence::Evidence;
use crate::scorer::{N_FEATURES, Row, f};
use crate::{LearnedIndex, Router, SessionView};

/// The tools a turn may send by probability, with their feature rows.
#[derive(Debug, Default, Clone)]
pub(crate) struct Candidates {
    pub(crate) tools: Vec<usize>,
    /// Per candidate tool: the index of its feature row in `rows`. Tools the turn
    /// points at only through their domain share one row per domain and flags.
    pub(crate) row_of: Vec<u32>,
    pub(crate) rows: Vec<Row>,
    /// How many candidates nothing points at, by their flags (see
    /// [`Router::flags`]): no row, every feature 0 but their flags.
    pub(crate) rest_by_flags: [usize; 4],
}

impl Candidates {
    /// Each candidate tool with its feature row.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, &Row)> + '_ {
        self.tools
            .iter()
            .enumerate()
            .map(|(i, &t)| (t, self.row(i)))
    }

    /// Tool `t`'s candidate index, if it is a candidate (they are in tool order).
    pub(crate) fn position(&self, t: usize) -> Option<usize> {
        self.tools.binary_search(&t).ok()
    }

    /// Candidate `i`'s feature row.
    pub(crate) fn row(&self, i: usize) -> &Row {
        &self.rows[self.row_of[i] as usize]
    }
}

impl Router {
    /// Whether a domain's tools are candidates: active, not core (always sent), and
    /// not unloaded by the model (unless it loaded one of them again).
    pub(crate) fn is_candidate_domain(
        &self,
        d: usize,
        evidence: &Evidence,
        session: &SessionView,
    ) -> bool {
        evidence.active[d]
            && !self.domain_is_core[d]
            && (session.load_all_this_turn
                || self.has_loaded_tool(session, d)
                || !session
                    .state(&self.names.domains[d])
                    .is_some_and(|s| s.unloaded))
    }

    /// One feature row per candidate tool; `with_core` adds core's tools
    /// (`search_tools` finds them, a selection always sends them).
    pub(crate) fn candidates(
        &self,
        evidence: &Evidence,
        session: &SessionView,
        learned: Option<&LearnedIndex>,
        with_core: bool,
    ) -> Candidates {
        let candidate_domain: Vec<bool> = (0..self.names.domains.len())
            .map(|d| {
                self.is_candidate_domain(d, evidence, session)
                    || (with_core && evidence.active[d] && self.domain_is_core[d])
            })
            .collect();
        self.rows_for(evidence, session, learned, &candidate_domain)
    }

    fn rows_for(
        &self,
        evidence: &Evidence,
        session: &SessionView,
        learned: Option<&LearnedIndex>,
        candidate_domain: &[bool],
    ) -> Candidates {
        let is_candidate = |t: usize| candidate_domain[self.names.tool_domains[t]];
        let domains = self.domain_features(evidence, session, candidate_domain);
        let per_tool = self.tool_features(evidence, session, learned, candidate_domain);
        let named: Vec<usize> = self
            .tools_naming_their_action(&evidence.words)
            .into_iter()
            .filter(|&t| is_candidate(t))
            .collect();
        // The tools something of their own points at: a row each. Only the tools
        // the evidence and the session list are tested (debug builds check that no
        // other tool would pass).
        let n_tools = self.names.tools.len();
        let mut own = vec![false; n_tools];
        for &t in &per_tool.listed {
            own[t] = is_candidate(t) && per_tool.points_at(t, evidence);
        }
        for &t in &named {
            own[t] = true;
        }
        // The other tools of a domain the turn points at differ from each other only
        // by their flags: they share one row per domain and flags. The tools of the
        // other domains have no row: the caller prices them by their flags.
        let touched_domain: Vec<bool> = (0..self.names.domains.len())
            .map(|d| domains.evidence[d] > 0.0 || domains.last_turn[d] > 0.0)
            .collect();
        // Room for every row and tool up front: on a catalog of thousands, growing
        // the rows a step at a time copied them over and over.
        let n_own = own.iter().filter(|&&o| o).count();
        let shared_domains =
            (0..touched_domain.len()).filter(|&d| touched_domain[d] && candidate_domain[d]);
        let n_shared: usize = shared_domains
            .clone()
            .map(|d| self.tools_by_domain[d].len())
            .sum();
        let n_shared_rows = (4 * shared_domains.count()).min(n_shared);
        let mut out = Candidates {
            tools: Vec::with_capacity(n_own + n_shared),
            row_of: Vec::with_capacity(n_own + n_shared),
            rows: Vec::with_capacity(n_own + n_shared_rows),
            rest_by_flags: [0; 4],
        };
        let mut shared_row: Vec<[Option<u32>; 4]> = vec![[None; 4]; self.names.domains.len()];
        for t in 0..n_tools {
            let d = self.names.tool_domains[t];
            if !candidate_domain[d] {
                continue;
            }
            let row = if own[t] {
                let names_action = named.binary_search(&t).is_ok();
                out.rows
                    .push(self.row(t, names_action, evidence, &domains, &per_tool));
                out.rows.len() - 1
            } else if touched_domain[d] {
                let r = *shared_row[d][self.flags(t)].get_or_insert_with(|| {
                    out.rows
                        .push(self.row(t, false, evidence, &domains, &per_tool));
                    (out.rows.len() - 1) as u32
                });
                debug_assert!(!per_tool.points_at(t, evidence));
                debug_assert_eq!(
                    out.rows[r as usize],
                    self.row(t, false, evidence, &domains, &per_tool)
                );
                r as usize
            } else {
                debug_assert!(!per_tool.points_at(t, evidence));
                out.rest_by_flags[self.flags(t)] += 1;
                continue;
            };
            out.tools.push(t);
            out.row_of.push(row as u32);
        }
        out
    }

    /// A tool's flags as an index 0..4: destructive, then read-first.
    pub(crate) fn flags(&self, t: usize) -> usize {
        usize::from(self.destructive[t]) * 2 + usize::from(self.tool_prior[t] > 0.0)
    }

    /// Tool `t`'s feature row.
    fn row(
        &self,
        t: usize,
        names_action: bool,
        evidence: &Evidence,
        domains: &DomainFeatures,
        per_tool: &ToolFeatures,
    ) -> Row {
        let d = self.names.tool_domains[t];
        let mut x = [0.0f32; N_FEATURES];
        x[f::TOOL_BM25] = per_tool.bm25(t);
        x[f::TOOL_BM25_REL] = relative_to(per_tool.bm25(t), per_tool.bm25_best);
        x[f::TOOL_BM25_RANK] = at(per_tool.bm25_rank, t);
        x[f::DOMAIN_BM25_REL] = domains.bm25_rel[d];
        x[f::DOMAIN_BM25_RANK] = domains.bm25_rank[d];
        x[f::TOOL_KEYWORD] = f32::from(evidence.tool_keyword_hits[t].min(1));
        x[f::DOMAIN_KEYWORD] = f32::from(evidence.domain_keyword_hits[d].min(2)) / 2.0;
        x[f::KEYWORD_IN_DOMAIN] = f32::from(evidence.keyword_hits_in_domain[d] > 0);
        x[f::DOMAIN_LAST_TURN] = domains.last_turn[d];
        x[f::DOMAIN_STICKY] = domains.sticky[d];
        x[f::TOOL_CALLED_RECENTLY] = f32::from(per_tool.called_recently[t]);
        x[f::CARRIED] = f32::from(per_tool.carried[t]);
        x[f::NEXT_STEP] = per_tool.next_step[t];
        x[f::COMPANION] = per_tool.companion[t];
        x[f::LEARNED_TOOL] = at(&evidence.tool_learned, t);
        x[f::LEARNED_DOMAIN] = domains.learned[d];
        // A small domain the turn points at: its tools travel together. Without
        // the evidence, a catalog of one-tool domains would lift every tool.
        x[f::SMALL_DOMAIN_EVIDENCE] =
            domains.evidence[d] / self.tools_by_domain[d].len().max(1) as f32;
        x[f::DESTRUCTIVE] = f32::from(self.destructive[t]);
        x[f::READ_FIRST] = f32::from(self.tool_prior[t] > 0.0);
        x[f::NAMES_ACTION] = f32::from(names_action);
        x[f::TOOL_DENSE] = per_tool.dense(t);
        x[f::TOOL_DENSE_REL] = relative_to(per_tool.dense(t), per_tool.dense_best);
        x[f::TOOL_DENSE_RANK] = at(per_tool.dense_rank, t);
        x[f::DOMAIN_DENSE_REL] = domains.dense_rel[d];
        x[f::DOMAIN_DENSE_RANK] = domains.dense_rank[d];
        x[f::LEARNED_TOOL_RANK] = at(&per_tool.learned_rank, t);
        x[f::PENDING] = f32::from(per_tool.pending[t]);
        let dense2 = at(&evidence.tool_dense2, t);
        let dense2_rank = at(&evidence.tool_dense2_rank, t);
        x[f::TOOL_DENSE2] = dense2;
        x[f::TOOL_DENSE2_REL] = relative_to(dense2, per_tool.dense2_best);
        x[f::TOOL_DENSE2_RANK] = dense2_rank;
        x[f::TOOL_DENSE2_TOP3] = f32::from(dense2_rank >= 1.0 / 3.0);
        x
    }

    /// The tools whose action the message's `words` name (see [`Action::named_in`]),
    /// sorted: looked up by the words, not tested tool by tool.
    pub(crate) fn tools_naming_their_action(&self, words: &[String]) -> Vec<usize> {
        let mut named: Vec<usize> = words
            .iter()
            .filter_map(|w| self.tools_by_verb.get(w))
            .flatten()
            .copied()
            .filter(|&t| {
                self.tool_actions[t]
                    .as_ref()
                    .is_some_and(|action| action.named_in(words))
            })
            .collect();
        named.sort_unstable();
        named.dedup();
        named
    }

    /// Per domain: what the evidence and the session say of it, over the candidate
    /// domains.
    fn domain_features(
        &self,
        evidence: &Evidence,
        session: &SessionView,
        candidate_domain: &[bool],
    ) -> DomainFeatures {
        let n_domains = self.names.domains.len();
        // Per domain, best over the message's pieces; relative to the best
        // candidate domain, and its rank among them.
        let domain_bm25: Vec<f32> = (0..n_domains)
            .map(|d| {
                evidence
                    .pieces
                    .iter()
                    .map(|p| p.domain_bm25[d])
                    .fold(0.0, f32::max)
            })
            .collect();
        let masked = |scores: &[f32]| -> Vec<f32> {
            scores
                .iter()
                .enumerate()
                .map(|(d, &s)| if candidate_domain[d] { s } else { 0.0 })
                .collect()
        };
        let bm25_rel = relative(&masked(&domain_bm25));
        let dense_rel = relative(&masked(&evidence.domain_best_dense));
        // Ranks per piece, best over them: each request of a chained message has
        // its own first domain.
        let mut bm25_rank = vec![0.0f32; n_domains];
        let mut dense_rank = vec![0.0f32; n_domains];
        for piece in &evidence.pieces {
            for (best, scores) in [
                (&mut bm25_rank, &piece.domain_bm25),
                (&mut dense_rank, &piece.domain_dense),
            ] {
                let rank = inverse_ranks(&masked(scores));
                for (slot, r) in best.iter_mut().zip(rank) {
                    *slot = slot.max(r);
                }
            }
        }
        let mut learned = vec![0.0f32; n_domains];
        for piece in &evidence.pieces {
            for vote in &piece.learned {
                let slot = &mut learned[vote.domain];
                *slot = slot.max(vote.score);
            }
        }
        // The session's hold and how much the turn points at each domain.
        let idle_turns = self.config.idle_turns;
        let mut last_turn = vec![0.0f32; n_domains];
        let mut sticky = vec![0.0f32; n_domains];
        for state in &session.domains {
            let Some(d) = self.registry.domain_idx(&state.domain) else {
                continue;
            };
            last_turn[d] = f32::from(!state.unloaded && state.last_used_turn == session.turn - 1);
            sticky[d] = f32::from(session.holds(&state.domain, idle_turns).is_some());
        }
        let evidence_of = (0..n_domains)
            .map(|d| {
                bm25_rank[d]
                    .max(dense_rank[d])
                    .max(f32::from(evidence.keyword_hits_in_domain[d] > 0))
                    .max(sticky[d])
                    .max(learned[d])
            })
            .collect();
        DomainFeatures {
            bm25_rel,
            bm25_rank,
            dense_rel,
            dense_rank,
            learned,
            last_turn,
            sticky,
            evidence: evidence_of,
        }
    }

    /// Per tool: its evidence over the candidates `tools`, and what it inherits from
    /// the tools the turn points at (prerequisites, co-usage) and from the session.
    fn tool_features<'e>(
        &self,
        evidence: &'e Evidence,
        session: &SessionView,
        learned: Option<&LearnedIndex>,
        candidate_domain: &[bool],
    ) -> ToolFeatures<'e> {
        let n_tools = self.names.tools.len();
        // The candidates with a score of their own: the dense stage scores every
        // tool, the others a few.
        let mut listed: Vec<usize> = if evidence.dense_on {
            (0..n_tools).collect()
        } else {
            let learned =
                (0..evidence.tool_learned.len()).filter(|&t| evidence.tool_learned[t] > 0.0);
            evidence
                .bm25_tools
                .iter()
                .chain(&evidence.keyword_tools)
                .copied()
                .chain(learned)
                .collect()
        };
        listed.retain(|&t| candidate_domain[self.names.tool_domains[t]]);
        // Evidence of the candidates only: the best of them scales the relative
        // features, and learned votes rank among them.
        let best = |scores: &[f32]| -> f32 {
            if scores.is_empty() {
                return 0.0;
            }
            listed.iter().map(|&t| scores[t]).fold(0.0f32, f32::max)
        };
        let learned_rank = if evidence.tool_learned.is_empty() {
            Vec::new()
        } else {
            let mut learned = vec![0.0f32; n_tools];
            for &t in &listed {
                learned[t] = evidence.tool_learned[t];
            }
            inverse_ranks(&learned)
        };
        let mut features = ToolFeatures {
            tool_bm25: &evidence.tool_bm25,
            tool_dense: &evidence.tool_dense,
            bm25_best: best(&evidence.tool_bm25),
            dense_best: best(&evidence.tool_dense),
            dense2_best: best(&evidence.tool_dense2),
            bm25_rank: &evidence.tool_bm25_rank,
            dense_rank: &evidence.tool_dense_rank,
            learned_rank,
            companion: vec![0.0f32; n_tools],
            next_step: vec![0.0f32; n_tools],
            called_recently: vec![false; n_tools],
            carried: vec![false; n_tools],
            pending: vec![false; n_tools],
            listed: Vec::new(),
        };
        let mut inherited: Vec<usize> = Vec::new();

        // How directly the message points at a tool: what its companions inherit,
        // declared (prerequisites) or learned from use (co-usage), as one feature so
        // that either earns the weight the other is fitted to.
        let strength = |t: usize| -> f32 {
            at(&evidence.tool_bm25_rank, t)
                .max(at(&evidence.tool_dense_rank, t))
                .max(f32::from(evidence.tool_keyword_hits[t].min(1)))
                .max(at(&evidence.tool_learned, t))
        };
        for &u in &listed {
            let s = strength(u);
            if s <= 0.0 {
                continue;
            }
            for &p in &self.prerequisites[u] {
                features.companion[p] = features.companion[p].max(s);
                inherited.push(p);
            }
            if let Some(index) = learned {
                for &(v, share) in index.co_used(u) {
                    let slot = &mut features.companion[v as usize];
                    *slot = slot.max(s * share);
                    inherited.push(v as usize);
                }
            }
        }
        // What past sessions called after the tools of the last turn that called any:
        // a next step learned from use, beside the declared ones below.
        let last_calls = session.recent_calls.iter().map(|(turn, _)| *turn).max();
        if let Some(index) = learned {
            for (turn, name) in &session.recent_calls {
                let Some(u) = self.registry.tool_idx(name) else {
                    continue;
                };
                if Some(*turn) != last_calls {
                    continue;
                }
                for &(v, share) in index.followed_by(u) {
                    let slot = &mut features.next_step[v as usize];
                    *slot = slot.max(share);
                    inherited.push(v as usize);
                }
            }
        }
        for (_, name) in &session.recent_calls {
            if let Some(u) = self.registry.tool_idx(name) {
                features.called_recently[u] = true;
                inherited.push(u);
                for &c in &self.consumers[u] {
                    features.next_step[c] = 1.0;
                    inherited.push(c);
                }
            }
        }
        let message_has_keyword = (0..self.names.domains.len())
            .any(|d| candidate_domain[d] && evidence.keyword_hits_in_domain[d] > 0);
        // The last turn called nothing (the model asked for what it lacked): what it
        // sent on its evidence is still wanted, whatever this answer names.
        let pending = session.called_nothing_last_turn();
        for name in &session.carried_tools {
            if let Some(t) = self.registry.tool_idx(name) {
                features.carried[t] = !message_has_keyword;
                features.pending[t] = pending;
                if features.carried[t] || features.pending[t] {
                    inherited.push(t);
                }
            }
        }
        listed.extend(inherited);
        features.listed = listed;
        features
    }
}

/// `scores[t]`, 0 where the evidence has no such scores (no dense stage, no
/// learned index).
fn at(scores: &[f32], t: usize) -> f32 {
    scores.get(t).copied().unwrap_or(0.0)
}

/// A score over the best (0 when nothing scored).
fn relative_to(score: f32, best: f32) -> f32 {
    if best > 0.0 { score / best } else { 0.0 }
}

/// Per domain, the values of the domain features (see `scorer::f`).
struct DomainFeatures {
    bm25_rel: Vec<f32>,
    bm25_rank: Vec<f32>,
    dense_rel: Vec<f32>,
    dense_rank: Vec<f32>,
    learned: Vec<f32>,
    last_turn: Vec<f32>,
    sticky: Vec<f32>,
    /// How much the turn points at the domain: its best rank, keyword, hold or vote.
    evidence: Vec<f32>,
}

/// Per candidate tool, the values of the tool features (see `scorer::f`): the
/// evidence's own scores, read in place, and what the session adds.
struct ToolFeatures<'e> {
    tool_bm25: &'e [f32],
    tool_dense: &'e [f32],
    /// The best BM25 share and cosines among the candidates.
    bm25_best: f32,
    dense_best: f32,
    dense2_best: f32,
    bm25_rank: &'e [f32],
    dense_rank: &'e [f32],
    /// Empty without a learned index.
    learned_rank: Vec<f32>,
    /// A prerequisite of a tool the message points at, or a tool past turns called
    /// beside it (its share of them), by how directly the message points there.
    companion: Vec<f32>,
    /// A declared next step of a tool called recently (1), or what past sessions
    /// called next after the last turn's calls (the largest share).
    next_step: Vec<f32>,
    called_recently: Vec<bool>,
    carried: Vec<bool>,
    /// Carried, and the last turn called no tool.
    pending: Vec<bool>,
    /// Every tool any of these may point at (unsorted, repeats): a superset of the
    /// tools they do point at.
    listed: Vec<usize>,
}

impl ToolFeatures<'_> {
    fn bm25(&self, t: usize) -> f32 {
        at(self.tool_bm25, t)
    }

    fn dense(&self, t: usize) -> f32 {
        at(self.tool_dense, t)
    }

    /// Anything of the tool's own points at it.
    fn points_at(&self, t: usize, evidence: &Evidence) -> bool {
        self.bm25(t) > 0.0
            || self.dense(t) > 0.0
            || at(&evidence.tool_dense2, t) > 0.0
            || evidence.tool_keyword_hits[t] > 0
            || at(&evidence.tool_learned, t) > 0.0
            || self.companion[t] > 0.0
            || self.next_step[t] > 0.0
            || self.called_recently[t]
            || self.carried[t]
            || self.pending[t]
    }
}

/// The words of a tool's name that say its action: the verb (the first word after
/// the domain's) and the objects (the others), stemmed.
#[derive(Debug, Clone)]
pub(crate) struct Action {
    pub(crate) verb: String,
    objects: Vec<String>,
}

impl Action {
    pub(crate) fn of(tool: &str, domain: &str) -> Option<Action> {
        let mut words = name_words(tool)
            .skip_while(|w| name_words(domain).any(|d| d.eq_ignore_ascii_case(w)))
            .map(|w| crate::lexical::stem(&w.to_lowercase()).to_owned());
        let verb = words.next()?;
        Some(Action {
            verb,
            objects: words.collect(),
        })
    }

    /// The message (its stemmed terms) names the verb and, when the name has any,
    /// one of the objects.
    pub(crate) fn named_in(&self, message_words: &[String]) -> bool {
        let has = |word: &str| message_words.iter().any(|w| w == word);
        has(&self.verb) && (self.objects.is_empty() || self.objects.iter().any(|o| has(o)))
    }
}

/// Per verb of a tool name's action: the tools it is the verb of.
pub(crate) fn tools_by_verb(actions: &[Option<Action>]) -> HashMap<String, Vec<usize>> {
    let mut by_verb: HashMap<String, Vec<usize>> = HashMap::new();
    for (t, action) in actions.iter().enumerate() {
        if let Some(action) = action {
            by_verb.entry(action.verb.clone()).or_default().push(t);
        }
    }
    by_verb
}

/// Per item: 1 / its rank among the items scoring above 0 (0 for the others).
fn inverse_ranks(scores: &[f32]) -> Vec<f32> {
    crate::evidence::ranks(scores)
        .into_iter()
        .map(|r| if r == 0 { 0.0 } else { 1.0 / r as f32 })
        .collect()
}

/// Each score over the best (0 when nothing scored).
fn relative(scores: &[f32]) -> Vec<f32> {
    let best = scores.iter().copied().fold(0.0f32, f32::max);
    scores.iter().map(|&s| relative_to(s, best)).collect()
}

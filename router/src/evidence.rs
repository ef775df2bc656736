//! The evidence a message gives, gathered before any decision: keyword hits per
//! domain and tool, and per piece of the message (the whole, then each request) the
//! BM25 share and the dense cosine of every domain and tool, and the votes of the
//! past messages most like it (the learned stage).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use crate::embed::{self, DenseIndex, DenseOwner, MessageVectors};
use crate::keywords::KeywordOwner;
use crate::learned::LearnedIndex;
use crate::{Router, lexical};

/// Per-message evidence, gathered before any decision.
#[derive(Clone)]
pub(crate) struct Evidence {
    pub(crate) active: Vec<bool>,
    /// Per domain: hits of its own keywords.
    pub(crate) domain_keyword_hits: Vec<u16>,
    /// Per domain: hits of its own keywords and of its tools'.
    pub(crate) keyword_hits_in_domain: Vec<u16>,
    pub(crate) tool_keyword_hits: Vec<u16>,
    /// The tools with a keyword hit, and the tools with a BM25 share: where the
    /// scorer's rows start, rather than a test of every tool.
    pub(crate) keyword_tools: Vec<usize>,
    pub(crate) bm25_tools: Vec<usize>,
    /// Every keyword hit as (domain, keyword pattern id), in message order: what a
    /// keyword verdict names as its reason.
    pub(crate) keyword_matches: Vec<(usize, u32)>,
    /// Per tool: what ranks tools inside a domain: the BM25 share (0..1) lexical-only,
    /// the fused (RRF) score of BM25 and dense with the dense stage; best over the
    /// message and its requests.
    pub(crate) tool_similarity: Vec<f32>,
    /// Per tool: its BM25 share (0..1), best over the message and its requests.
    pub(crate) tool_bm25: Vec<f32>,
    /// Per tool: its raw cosine, best over the pieces; empty without the dense stage.
    pub(crate) tool_dense: Vec<f32>,
    /// Per tool: 1 / its BM25 rank among the active tools, best over the pieces (so
    /// that each request of a chained message has its own first), 0 past
    /// `RANKED`.
    pub(crate) tool_bm25_rank: Vec<f32>,
    /// The same for the dense cosine; empty without the dense stage.
    pub(crate) tool_dense_rank: Vec<f32>,
    /// A joined stage's second encoder's cosine and rank, as `tool_dense` and
    /// `tool_dense_rank` are the first's; empty unless the stage is joined.
    pub(crate) tool_dense2: Vec<f32>,
    pub(crate) tool_dense2_rank: Vec<f32>,
    /// Per domain: the best of its BM25 share and its calibrated cosine over the
    /// message and its requests, each the better of its own text's and its best tool's.
    pub(crate) domain_similarity: Vec<f32>,
    /// Per domain: its best raw cosine over the message and its requests (0 without
    /// the dense stage); still orders domains when no score reaches the calibrated
    /// scale.
    pub(crate) domain_best_dense: Vec<f32>,
    /// Per piece (the whole message, then each request when there are several).
    pub(crate) pieces: Vec<PieceScores>,
    /// The dense stage ran for this message.
    pub(crate) dense_on: bool,
    /// Per tool: its learned score, best over the pieces (0 for a tool no past
    /// message like this one named); empty without a learned index.
    pub(crate) tool_learned: Vec<f32>,
    pub(crate) notes: Vec<String>,
    /// The message's terms as the lexical stages see them (lowercased, stemmed):
    /// what names a tool's action.
    pub(crate) words: Vec<String>,
}

impl Evidence {
    /// A joined dense stage scored the message: the second encoder's features are set.
    pub(crate) fn joined_on(&self) -> bool {
        !self.tool_dense2.is_empty()
    }
}

/// Per piece of the message: cosines per tool and per domain text, and the piece's
/// own vector.
struct DenseCosines<'v> {
    tools: Vec<Vec<f32>>,
    domains: Vec<Vec<f32>>,
    /// Per piece, per tool: the second encoder's cosine; empty unless joined.
    second: Vec<Vec<f32>>,
    queries: &'v [Vec<f32>],
    /// The encoder the queries (and the tool vectors compared) are of.
    model_id: &'v str,
}

/// Keyword hits of a message (see the fields of [`Evidence`] of the same names).
struct KeywordEvidence {
    domain_keyword_hits: Vec<u16>,
    keyword_hits_in_domain: Vec<u16>,
    tool_keyword_hits: Vec<u16>,
    keyword_tools: Vec<usize>,
    keyword_matches: Vec<(usize, u32)>,
}

/// The similarity evidence of the pieces seen so far (see the fields of [`Evidence`]
/// of the same names), and the buffers each piece reuses.
struct Similarity {
    tool_bm25: Vec<f32>,
    tool_dense: Vec<f32>,
    tool_similarity: Vec<f32>,
    tool_bm25_rank: Vec<f32>,
    tool_dense_rank: Vec<f32>,
    tool_dense2: Vec<f32>,
    tool_dense2_rank: Vec<f32>,
    domain_similarity: Vec<f32>,
    pieces: Vec<PieceScores>,
    terms: Vec<u32>,
    /// The tools that share a term with the piece: BM25 touches only those, so that
    /// lexical routing costs what the message matches rather than what the registry
    /// holds.
    touched: Vec<u32>,
    piece_tool_bm25: Vec<f32>,
    /// The tools the pieces touched, each once it scored.
    bm25_tools: Vec<usize>,
}

impl Similarity {
    fn new(n_tools: usize, n_domains: usize, dense_on: bool, joined: bool) -> Similarity {
        let per_tool_if = |on: bool| {
            if on {
                vec![0.0f32; n_tools]
            } else {
                Vec::new()
            }
        };
        let per_tool_if_dense = || per_tool_if(dense_on);
        Similarity {
            tool_bm25: vec![0.0f32; n_tools],
            tool_dense: per_tool_if_dense(),
            tool_similarity: per_tool_if_dense(),
            tool_bm25_rank: vec![0.0f32; n_tools],
            tool_dense_rank: per_tool_if_dense(),
            tool_dense2: per_tool_if(joined),
            tool_dense2_rank: per_tool_if(joined),
            domain_similarity: vec![0.0f32; n_domains],
            pieces: Vec::new(),
            terms: Vec::new(),
            touched: Vec::new(),
            piece_tool_bm25: vec![0.0f32; n_tools],
            bm25_tools: Vec::new(),
        }
    }

    /// The BM25 share of every tool (into `piece_tool_bm25`, over `touched`) and of
    /// every domain (returned) for a piece's terms (`words`, one a line).
    fn bm25_shares(&mut self, router: &Router, words: &str, n_domains: usize) -> Vec<f32> {
        for &t in &self.touched {
            self.piece_tool_bm25[t as usize] = 0.0;
        }
        self.touched.clear();
        router.tool_index.query_word_terms(words, &mut self.terms);
        let tool_query_mass: f32 = self
            .terms
            .iter()
            .map(|&t| router.tool_index.max_term_score(t))
            .sum();
        if tool_query_mass > 0.0 {
            router.tool_index.score_into_touched(
                &self.terms,
                &mut self.piece_tool_bm25,
                &mut self.touched,
            );
            for &t in &self.touched {
                self.piece_tool_bm25[t as usize] /= tool_query_mass;
            }
        }
        let mut domain_bm25 = vec![0.0f32; n_domains];
        router.domain_index.query_word_terms(words, &mut self.terms);
        let domain_query_mass: f32 = self
            .terms
            .iter()
            .map(|&t| router.domain_index.max_term_score(t))
            .sum();
        if domain_query_mass > 0.0 {
            router
                .domain_index
                .score_into(&self.terms, &mut domain_bm25);
            for score in &mut domain_bm25 {
                *score /= domain_query_mass;
            }
        }
        domain_bm25
    }

    /// Takes one piece's BM25 shares (of its terms, `words`), and its cosines (per
    /// tool, per domain text, and per tool by a joined stage's second encoder) when
    /// the dense stage ran.
    fn add_piece(
        &mut self,
        router: &Router,
        active: &[bool],
        words: &str,
        cosines: Option<PieceCosines<'_>>,
        learned: Vec<LearnedVote>,
    ) {
        let n_domains = active.len();
        let ranked = |t: usize| {
            let d = router.names.tool_domains[t];
            active[d] && !router.domain_is_core[d]
        };
        let mut domain_bm25 = self.bm25_shares(router, words, n_domains);
        best_ranks(
            self.touched
                .iter()
                .map(|&t| t as usize)
                .filter(|&t| ranked(t)),
            &self.piece_tool_bm25,
            &mut self.tool_bm25_rank,
        );
        for &t in &self.touched {
            let t = t as usize;
            let score = self.piece_tool_bm25[t];
            if self.tool_bm25[t] == 0.0 {
                self.bm25_tools.push(t);
            }
            self.tool_bm25[t] = self.tool_bm25[t].max(score);
            let slot = &mut domain_bm25[router.names.tool_domains[t]];
            *slot = slot.max(score);
        }

        let mut domain_dense = vec![0.0f32; n_domains];
        if let Some((piece_tool_dense, piece_domain_dense, second)) = cosines {
            if let Some(second) = second {
                best_ranks(
                    (0..second.len()).filter(|&t| ranked(t)),
                    second,
                    &mut self.tool_dense2_rank,
                );
                for (slot, &cosine) in self.tool_dense2.iter_mut().zip(second) {
                    *slot = slot.max(cosine);
                }
            }
            best_ranks(
                (0..piece_tool_dense.len()).filter(|&t| ranked(t)),
                piece_tool_dense,
                &mut self.tool_dense_rank,
            );
            for (t, &cosine) in piece_tool_dense.iter().enumerate() {
                self.tool_dense[t] = self.tool_dense[t].max(cosine);
                let slot = &mut domain_dense[router.names.tool_domains[t]];
                *slot = slot.max(cosine);
            }
            for (slot, &cosine) in domain_dense.iter_mut().zip(piece_domain_dense) {
                *slot = slot.max(cosine);
            }
            // Tools: reciprocal-rank fusion of this piece's BM25 and dense ranks.
            let fused = rrf(
                &[&self.piece_tool_bm25, piece_tool_dense],
                router.config.rrf_k,
            );
            for (slot, score) in self.tool_similarity.iter_mut().zip(fused) {
                *slot = slot.max(score);
            }
        }
        for d in 0..n_domains {
            let combined = domain_bm25[d].max(router.calibrated(domain_dense[d]));
            self.domain_similarity[d] = self.domain_similarity[d].max(combined);
        }
        self.pieces.push(PieceScores {
            domain_bm25,
            domain_dense,
            learned,
        });
    }
}

/// A piece's cosines: per tool, per domain text, and per tool by a joined stage's
/// second encoder.
type PieceCosines<'c> = (&'c [f32], &'c [f32], Option<&'c [f32]>);

/// The weight of the pseudo-neighbour that votes for nothing (see `learned_votes`):
/// about three past messages must agree before a tool's share of the votes passes
/// one half.
const LEARNED_PRIOR: f32 = 3.0;

/// A domain the past messages most like a piece vote for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LearnedVote {
    pub(crate) domain: usize,
    /// The most similar past message's similarity times the share of the neighbours'
    /// votes that went to the domain's tools, 0..1.
    pub(crate) score: f32,
}

/// Domain scores for one piece of the message.
#[derive(Clone)]
pub(crate) struct PieceScores {
    /// BM25 share, 0..1.
    pub(crate) domain_bm25: Vec<f32>,
    /// Cosine, 0..1 (zeros when the dense stage is off).
    pub(crate) domain_dense: Vec<f32>,
    /// The domains the past messages most like this piece vote for, best first.
    pub(crate) learned: Vec<LearnedVote>,
}

impl Router {
    /// The message's evidence; `settings: None` counts every domain as active.
    /// `vectors`: the message's pieces embedded by the caller (the dense stage runs
    /// only with them; the router never runs an encoder).
    pub(crate) fn gather_evidence(
        &self,
        message: &str,
        settings: Option<&BTreeMap<String, String>>,
        learned: Option<&LearnedIndex>,
        vectors: Option<&MessageVectors>,
    ) -> Evidence {
        let n_domains = self.registry.domains().len();
        let n_tools = self.registry.all_tools().len();
        let active = match settings {
            Some(settings) => self.active_domains(settings),
            None => vec![true; n_domains],
        };
        let lowered = message.to_lowercase();
        let keywords = self.keyword_evidence(&lowered);
        let mut words = Vec::new();
        lexical::for_each_term(&lowered, |term| words.push(term.to_owned()));

        // The message, then each of its requests when it chains several.
        let piece_texts = embed::message_pieces(message);
        let mut notes = Vec::new();
        let dense_cosines = self.dense_cosines(vectors, piece_texts.len(), &mut notes);
        let dense_on = dense_cosines.is_some();
        let mut tool_learned = Vec::new();
        let mut piece_learned: Vec<Vec<LearnedVote>> = vec![Vec::new(); piece_texts.len()];
        if let Some(index) = learned.filter(|index| !index.is_empty()) {
            let queries = dense_cosines.as_ref().map(|c| (c.queries, c.model_id));
            tool_learned = vec![0.0f32; n_tools];
            piece_learned = self.learned_votes(index, &piece_texts, queries, &mut tool_learned);
        }

        let joined = dense_cosines.as_ref().is_some_and(|c| !c.second.is_empty());
        let mut similarity = Similarity::new(n_tools, n_domains, dense_on, joined);
        let mut piece_words = String::new();
        for (p, piece) in piece_texts.iter().enumerate() {
            let cosines = dense_cosines.as_ref().map(|c| {
                (
                    c.tools[p].as_slice(),
                    c.domains[p].as_slice(),
                    c.second.get(p).map(Vec::as_slice),
                )
            });
            let learned = std::mem::take(&mut piece_learned[p]);
            // The whole message's terms are `words`; a request's are its own.
            if p == 0 {
                piece_words = words.join("\n");
            } else {
                lexical::query_words(&piece.to_lowercase(), &mut piece_words);
            }
            similarity.add_piece(self, &active, &piece_words, cosines, learned);
        }
        let Similarity {
            tool_bm25,
            tool_dense,
            mut tool_similarity,
            tool_bm25_rank,
            tool_dense_rank,
            tool_dense2,
            tool_dense2_rank,
            domain_similarity,
            pieces,
            mut bm25_tools,
            ..
        } = similarity;
        bm25_tools.retain(|&t| tool_bm25[t] > 0.0);
        if !dense_on {
            tool_similarity = tool_bm25.clone();
        }
        let domain_best_dense = (0..n_domains)
            .map(|d| {
                pieces
                    .iter()
                    .map(|p| p.domain_dense[d])
                    .fold(0.0f32, f32::max)
            })
            .collect();

        Evidence {
            active,
            domain_keyword_hits: keywords.domain_keyword_hits,
            keyword_hits_in_domain: keywords.keyword_hits_in_domain,
            tool_keyword_hits: keywords.tool_keyword_hits,
            keyword_tools: keywords.keyword_tools,
            bm25_tools,
            keyword_matches: keywords.keyword_matches,
            tool_similarity,
            tool_bm25,
            tool_dense,
            tool_bm25_rank,
            tool_dense_rank,
            tool_dense2,
            tool_dense2_rank,
            domain_similarity,
            domain_best_dense,
            pieces,
            dense_on,
            tool_learned,
            notes,
            words,
        }
    }

    /// Keyword hits of the lowercased message, per domain and tool.
    fn keyword_evidence(&self, lowered: &str) -> KeywordEvidence {
        let n_domains = self.registry.domains().len();
        let n_tools = self.registry.all_tools().len();
        let mut found = KeywordEvidence {
            domain_keyword_hits: vec![0u16; n_domains],
            keyword_hits_in_domain: vec![0u16; n_domains],
            tool_keyword_hits: vec![0u16; n_tools],
            keyword_tools: Vec::new(),
            keyword_matches: Vec::new(),
        };
        self.keywords.for_each_match(lowered, |owner, pattern| {
            let domain = match owner {
                KeywordOwner::Domain(d) => {
                    let Some(hits) = found.domain_keyword_hits.get_mut(d) else {
                        return;
                    };
                    *hits = hits.saturating_add(1);
                    d
                }
                KeywordOwner::Tool(t) => {
                    let Some(hits) = found.tool_keyword_hits.get_mut(t) else {
                        return;
                    };
                    *hits = hits.saturating_add(1);
                    found.keyword_tools.push(t);
                    self.names.tool_domains[t]
                }
            };
            if let Some(hits) = found.keyword_hits_in_domain.get_mut(domain) {
                *hits = hits.saturating_add(1);
            }
            found.keyword_matches.push((domain, pattern));
        });
        found
    }

    /// The pieces' cosines with every tool and domain, when the dense stage is attached
    /// and the caller gave usable vectors; otherwise `None`, and a note says why.
    fn dense_cosines<'v>(
        &self,
        vectors: Option<&'v MessageVectors>,
        n_pieces: usize,
        notes: &mut Vec<String>,
    ) -> Option<DenseCosines<'v>> {
        let Some(dense) = self.dense.get() else {
            if self.dense_pending.load(Ordering::Acquire) {
                notes.push(
                    "dense stage not ready (tool vectors are being computed); lexical only"
                        .to_owned(),
                );
            }
            return None;
        };
        let Some(vectors) = vectors else {
            notes.push("dense skipped: no message vectors given; lexical only".to_owned());
            return None;
        };
        if let Some(reason) = vectors.skip_reason() {
            notes.push(format!("dense skipped: {reason}; lexical only"));
            return None;
        }
        // Vectors of the fallback encoder are compared with its own tool vectors.
        let dense = match self.dense_fallback.get() {
            Some(fallback)
                if vectors.model_id() == fallback.model_id
                    && vectors.model_id() != dense.model_id =>
            {
                notes.push(format!(
                    "dense by the fallback encoder {}: {}",
                    fallback.model_id,
                    vectors.fallback_reason().unwrap_or("chosen by the caller")
                ));
                fallback
            }
            _ => dense,
        };
        match self.dense_scores(dense, vectors, n_pieces) {
            Ok(cosines) => Some(cosines),
            Err(error) => {
                notes.push(format!("dense stage off ({error}); lexical only"));
                None
            }
        }
    }

    /// Per piece, the domains the past messages most like it vote for (see
    /// [`LearnedVote`]); the tools' scores go into `tool_learned` (best over pieces).
    /// A past message counts when its cosine with the piece (dense path, when the
    /// index holds vectors of the dense stage's encoder) or its BM25 share is high
    /// enough; the `learned_neighbors` most similar vote, each split evenly over the
    /// tools its turn called.
    fn learned_votes(
        &self,
        index: &LearnedIndex,
        pieces: &[&str],
        queries: Option<(&[Vec<f32>], &str)>,
        tool_learned: &mut [f32],
    ) -> Vec<Vec<LearnedVote>> {
        let config = &self.config;
        let dense_matches = match queries {
            Some((queries, model_id))
                if queries
                    .first()
                    .is_some_and(|q| index.has_vectors_of(model_id, q.len())) =>
            {
                index.dense_matches(queries, config.learned_min_cosine, config.learned_neighbors)
            }
            _ => vec![Vec::new(); pieces.len()],
        };
        let mut votes_by_piece = Vec::with_capacity(pieces.len());
        // Per tool touched by this piece's neighbours: (tool, best similarity, votes).
        let mut tools: Vec<(u32, f32, f32)> = Vec::new();
        for (p, piece) in pieces.iter().enumerate() {
            let mut neighbours: Vec<(u32, f32)> = dense_matches[p].clone();
            neighbours.extend(index.lexical_matches(
                piece,
                config.learned_min_bm25,
                config.learned_neighbors,
            ));
            // One similarity per past message: the better of its two paths.
            neighbours.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)));
            neighbours.dedup_by_key(|n| n.0);
            neighbours.sort_unstable_by(crate::learned::nearer);
            neighbours.truncate(config.learned_neighbors);
            // A pseudo-neighbour at similarity 1 that votes for no tool: one past
            // message alone is weak evidence, ten that agree are strong.
            let total: f32 = neighbours.iter().map(|n| n.1).sum::<f32>() + LEARNED_PRIOR;
            tools.clear();
            for &(entry, similarity) in &neighbours {
                let named = index.tools(entry);
                let vote = similarity / named.len().max(1) as f32;
                for &t in named {
                    match tools.iter_mut().find(|x| x.0 == t) {
                        Some(x) => {
                            x.1 = x.1.max(similarity);
                            x.2 += vote;
                        }
                        None => tools.push((t, similarity, vote)),
                    }
                }
            }
            // Per domain: the best similarity and the share of the votes.
            let mut domain_best: Vec<(usize, f32, f32)> = Vec::new();
            for &(t, best, vote) in &tools {
                let share = vote / total;
                if let Some(slot) = tool_learned.get_mut(t as usize) {
                    *slot = slot.max(best * share);
                }
                let d = self.names.tool_domains[t as usize];
                match domain_best.iter_mut().find(|x| x.0 == d) {
                    Some(x) => {
                        x.1 = x.1.max(best);
                        x.2 += share;
                    }
                    None => domain_best.push((d, best, share)),
                }
            }
            let mut domains: Vec<LearnedVote> = domain_best
                .iter()
                .map(|&(domain, best, share)| LearnedVote {
                    domain,
                    score: best * share.min(1.0),
                })
                .collect();
            domains
                .sort_unstable_by(|a, b| b.score.total_cmp(&a.score).then(a.domain.cmp(&b.domain)));
            votes_by_piece.push(domains);
        }
        votes_by_piece
    }

    /// A cosine on the 0..1 scale of the other stages.
    pub(crate) fn calibrated(&self, cosine: f32) -> f32 {
        let span = (self.config.dense_ceiling - self.config.dense_floor).max(1e-3);
        ((cosine - self.config.dense_floor) / span).clamp(0.0, 1.0)
    }

    /// Cosines between each piece's vector (computed by the caller) and every tool
    /// (best over its texts) and domain, clamped to 0..1.
    fn dense_scores<'v>(
        &self,
        dense: &DenseIndex,
        vectors: &'v MessageVectors,
        n_pieces: usize,
    ) -> Result<DenseCosines<'v>, String> {
        if let Some(invalid) = &dense.invalid {
            return Err(invalid.clone());
        }
        if dense.n_rows != self.dense_texts.len() {
            return Err(format!(
                "{} vectors for {} texts",
                dense.n_rows,
                self.dense_texts.len()
            ));
        }
        if vectors.model_id() != dense.model_id {
            return Err(format!(
                "message vectors of {}, tool vectors of {}",
                vectors.model_id(),
                dense.model_id
            ));
        }
        let queries = vectors.pieces();
        if queries.len() != n_pieces {
            return Err(format!(
                "{} message vectors for {} pieces",
                queries.len(),
                n_pieces
            ));
        }
        if let Some(query) = queries.iter().find(|q| q.len() != dense.dims) {
            return Err(format!(
                "query vector has {} dimensions, tool vectors {}",
                query.len(),
                dense.dims
            ));
        }
        let n_tools = self.names.tool_domains.len();
        let n_domains = self.names.domains.len();
        let mut cosines = DenseCosines {
            tools: vec![vec![0.0f32; n_tools]; n_pieces],
            domains: vec![vec![0.0f32; n_domains]; n_pieces],
            second: if dense.is_joined() {
                vec![vec![0.0f32; n_tools]; n_pieces]
            } else {
                Vec::new()
            },
            queries,
            model_id: vectors.model_id(),
        };
        // Dispatched to the widest instructions the CPU has: the same eight sums per
        // row, so the same floats, in AVX2's wider registers where there are some.
        pulp::Arch::new().dispatch(CosineScan {
            dense,
            owners: &self.dense_owners,
            cosines: &mut cosines,
        });
        Ok(cosines)
    }
}

/// Every tool and domain text's cosine with every piece, into `cosines`. A
/// `WithSimd` whose body is inlined into each instruction set's function (as the
/// learned stage's scan is).
struct CosineScan<'a, 'v> {
    dense: &'a DenseIndex,
    owners: &'a [DenseOwner],
    cosines: &'a mut DenseCosines<'v>,
}

impl pulp::WithSimd for CosineScan<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let cosines = self.cosines;
        if let Some(split) = self.dense.first_dims {
            return joined_scan(self.dense, self.owners, cosines, split);
        }
        // Each row against every piece while it is in cache: on a catalog of
        // thousands the rows are megabytes, and a pass per piece read them again.
        for (row, owner) in self.owners.iter().enumerate() {
            let vector = self.dense.row(row);
            for (p, query) in cosines.queries.iter().enumerate() {
                let cosine = embed::dot(vector, query).max(0.0);
                let slot = match *owner {
                    DenseOwner::Tool(t) => cosines.tools[p].get_mut(t),
                    DenseOwner::Domain(d) => cosines.domains[p].get_mut(d),
                };
                if let Some(slot) = slot {
                    *slot = slot.max(cosine);
                }
            }
        }
    }
}

/// [`CosineScan`] of a joined stage: each part of a row against the same part of
/// each piece's vector, normalised on its own (the message vector was normalised
/// whole); domains by the first part only.
#[inline(always)]
fn joined_scan(
    dense: &DenseIndex,
    owners: &[DenseOwner],
    cosines: &mut DenseCosines<'_>,
    split: usize,
) {
    let norm = |v: &[f32]| embed::dot(v, v).sqrt();
    let queries: Vec<(&[f32], f32, &[f32], f32)> = cosines
        .queries
        .iter()
        .map(|q| {
            let (first, second) = q.split_at(split.min(q.len()));
            (first, norm(first), second, norm(second))
        })
        .collect();
    let cosine = |a: &[f32], b: &[f32], norm: f32| {
        if norm > 0.0 {
            (embed::dot(a, b) / norm).max(0.0)
        } else {
            0.0
        }
    };
    for (row, owner) in owners.iter().enumerate() {
        let vector = dense.row(row);
        let (first, second) = vector.split_at(split.min(vector.len()));
        for (p, &(q1, n1, q2, n2)) in queries.iter().enumerate() {
            match *owner {
                DenseOwner::Tool(t) => {
                    if let Some(slot) = cosines.tools[p].get_mut(t) {
                        *slot = slot.max(cosine(first, q1, n1));
                    }
                    if let Some(slot) = cosines.second[p].get_mut(t) {
                        *slot = slot.max(cosine(second, q2, n2));
                    }
                }
                DenseOwner::Domain(d) => {
                    if let Some(slot) = cosines.domains[p].get_mut(d) {
                        *slot = slot.max(cosine(first, q1, n1));
                    }
                }
            }
        }
    }
}

/// Ranks past this one count as unranked in the per-piece ranks.
const RANKED: usize = 50;

/// Raises `best[i]` to 1 / the rank of item `i` among `items` by descending `scores`
/// (above 0), for the first [`RANKED`].
fn best_ranks(items: impl Iterator<Item = usize>, scores: &[f32], best: &mut [f32]) {
    // A long message touches most of a large catalog, and only fifty ranks count.
    let mut kept = Best::new(RANKED);
    for i in items.filter(|&i| scores[i] > 0.0) {
        kept.push(scores[i], i);
    }
    for (r, (i, _)) in kept.into_sorted().enumerate() {
        best[i] = best[i].max(1.0 / (r + 1) as f32);
    }
}

/// The `keep` best of the items pushed (score descending by `f32::total_cmp`, then
/// index), without holding them all: the buffer is cut back to `keep` whenever it
/// holds twice as many, and an item past the last kept can no longer be among them.
pub(crate) struct Best {
    keep: usize,
    keys: Vec<u64>,
    cutoff: u64,
}

impl Best {
    pub(crate) fn new(keep: usize) -> Best {
        Best {
            keep,
            keys: Vec::with_capacity(2 * keep),
            cutoff: u64::MAX,
        }
    }

    pub(crate) fn push(&mut self, score: f32, i: usize) {
        let k = key(score, i);
        if self.keep == 0 || k > self.cutoff {
            return;
        }
        self.keys.push(k);
        if self.keys.len() == 2 * self.keep {
            self.cut();
            self.cutoff = self.keys[self.keep - 1];
        }
    }

    /// Keeps the `keep` best, in no order.
    fn cut(&mut self) {
        if self.keys.len() > self.keep {
            self.keys.select_nth_unstable(self.keep - 1);
            self.keys.truncate(self.keep);
        }
    }

    /// The best, best first: `(index, score)`.
    pub(crate) fn into_sorted(mut self) -> impl Iterator<Item = (usize, f32)> {
        self.cut();
        self.keys.sort_unstable();
        self.keys.into_iter().map(|k| (index_of(k), score_of(k)))
    }
}

/// 1-based rank of each item by descending score among items scoring above 0; 0 for
/// the others.
pub(crate) fn ranks(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).filter(|&i| scores[i] > 0.0).collect();
    let n = order.len();
    best_first(&mut order, n, |i| scores[i]);
    let mut rank = vec![0; scores.len()];
    for (r, &i) in order.iter().enumerate() {
        rank[i] = r + 1;
    }
    rank
}

/// Puts `tools` best first (score descending by `f32::total_cmp`, then index),
/// scoring each tool once. Only the first `keep` are put in order; the rest follow
/// them in no order (callers hint those, ordered again with the other hints). Sorted
/// as integer keys: a comparator that looks both scores up was a fifth of a
/// selection over thousands of tools.
pub(crate) fn best_first(tools: &mut [usize], keep: usize, score: impl Fn(usize) -> f32) {
    if keep == 0 || tools.is_empty() {
        return;
    }
    let mut keys: Vec<u64> = tools.iter().map(|&t| key(score(t), t)).collect();
    if keep < keys.len() {
        keys.select_nth_unstable(keep - 1);
        keys[..keep].sort_unstable();
    } else {
        keys.sort_unstable();
    }
    for (slot, k) in tools.iter_mut().zip(keys) {
        *slot = index_of(k);
    }
}

/// Items best first (as [`best_first`] orders them), put in order only as far as they
/// are read: the send order reads a few dozen of a large catalog's thousands of
/// candidates before nothing more can be sent.
pub(crate) struct BestFirst {
    keys: Vec<u64>,
    /// `keys[..sorted]` are in order, and every key after them is larger.
    sorted: usize,
    next: usize,
}

impl BestFirst {
    pub(crate) fn new(items: &[usize], score: impl Fn(usize) -> f32) -> BestFirst {
        BestFirst {
            keys: items.iter().map(|&i| key(score(i), i)).collect(),
            sorted: 0,
            next: 0,
        }
    }

    /// The items not read yet, in no order; reading them ends the order.
    pub(crate) fn rest(&mut self) -> impl Iterator<Item = usize> + '_ {
        let from = std::mem::replace(&mut self.next, self.keys.len());
        self.keys[from..].iter().map(|&k| index_of(k))
    }
}

impl Iterator for BestFirst {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.next == self.keys.len() {
            return None;
        }
        if self.next == self.sorted {
            // Each chunk doubles: a full read costs what one sort does.
            let chunk = (self.keys.len() - self.sorted).min(self.sorted.max(32));
            let unsorted = &mut self.keys[self.sorted..];
            if chunk < unsorted.len() {
                unsorted.select_nth_unstable(chunk - 1);
            }
            unsorted[..chunk].sort_unstable();
            self.sorted += chunk;
        }
        self.next += 1;
        Some(index_of(self.keys[self.next - 1]))
    }
}

/// Item `i` with its score as a key whose ascending order is best first, ties by
/// index.
fn key(score: f32, i: usize) -> u64 {
    (u64::from(descending(score)) << 32) | i as u64
}

fn index_of(key: u64) -> usize {
    (key & u64::from(u32::MAX)) as usize
}

/// The score a [`key`] was made of, bit for bit.
fn score_of(key: u64) -> f32 {
    let ascending = !((key >> 32) as u32);
    f32::from_bits(if ascending >> 31 == 1 {
        ascending & !(1 << 31)
    } else {
        !ascending
    })
}

/// A key whose ascending order is `f32::total_cmp`'s descending order.
fn descending(score: f32) -> u32 {
    let bits = score.to_bits();
    let ascending = if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    };
    !ascending
}

/// Reciprocal-rank fusion of several score lists over the same items: each list where
/// an item scores above 0 adds `1 / (k + rank)`. Scaled so rank 1 everywhere is 1.
pub(crate) fn rrf(lists: &[&[f32]], k: f32) -> Vec<f32> {
    let n = lists.first().map_or(0, |l| l.len());
    let mut fused = vec![0.0f32; n];
    let scale = lists.len() as f32 / (k + 1.0);
    for list in lists {
        for (slot, rank) in fused.iter_mut().zip(ranks(list)) {
            if rank > 0 {
                *slot += 1.0 / (k + rank as f32) / scale;
            }
        }
    }
    fused
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        /// The first `keep` are the best by `total_cmp`, ties by index, in that order:
        /// what the comparator sort gave before the integer keys.
        #[test]
        fn best_first_keeps_the_best_in_total_cmp_order(
            scores in proptest::collection::vec(
                prop_oneof![Just(0.0f32), Just(-0.0f32), Just(0.5f32), -1.0f32..1.0, any::<f32>()],
                0..60,
            ),
            keep in 1usize..70,
        ) {
            let mut tools: Vec<usize> = (0..scores.len()).rev().collect();
            let mut expected = tools.clone();
            expected.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            super::best_first(&mut tools, keep, |t| scores[t]);
            let kept = keep.min(scores.len());
            prop_assert_eq!(&tools[..kept], &expected[..kept]);
        }

        /// Each item's best rank is 1 / its place among the items scoring above 0,
        /// for the first fifty: what a full sort gives.
        #[test]
        fn best_ranks_are_the_full_sorts_first_fifty(
            scores in proptest::collection::vec(
                prop_oneof![Just(0.0f32), Just(0.5f32), 0.0f32..1.0],
                0..400,
            ),
        ) {
            let mut expected = vec![0.0f32; scores.len()];
            let mut order: Vec<usize> = (0..scores.len()).filter(|&i| scores[i] > 0.0).collect();
            order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            for (r, &i) in order.iter().take(super::RANKED).enumerate() {
                expected[i] = 1.0 / (r + 1) as f32;
            }
            let mut best = vec![0.0f32; scores.len()];
            super::best_ranks((0..scores.len()).rev(), &scores, &mut best);
            prop_assert_eq!(best, expected);
        }

        /// A key gives back the score it was made of, bit for bit, and its index.
        #[test]
        fn a_key_gives_back_its_score_and_index(score in any::<f32>(), i in 0usize..1 << 32) {
            let key = super::key(score, i);
            prop_assert_eq!(super::score_of(key).to_bits(), score.to_bits());
            prop_assert_eq!(super::index_of(key), i);
        }

        /// Read to any depth, the lazy order is the full order, and the rest is what
        /// was not read.
        #[test]
        fn best_first_read_lazily_is_the_full_order(
            scores in proptest::collection::vec(
                prop_oneof![Just(0.0f32), Just(0.5f32), -1.0f32..1.0, any::<f32>()],
                0..200,
            ),
            read in 0usize..220,
        ) {
            let tools: Vec<usize> = (0..scores.len()).rev().collect();
            let mut expected = tools.clone();
            expected.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            let mut order = super::BestFirst::new(&tools, |t| scores[t]);
            let first: Vec<usize> = order.by_ref().take(read).collect();
            let kept = read.min(scores.len());
            prop_assert_eq!(&first[..], &expected[..kept]);
            let mut rest: Vec<usize> = order.rest().collect();
            rest.sort_unstable();
            let mut unread = expected[kept..].to_vec();
            unread.sort_unstable();
            prop_assert_eq!(rest, unread);
        }
    }
}

//! The learned stage's memory: past messages and the tools their turns called with
//! success, as a deployment recorded them (or an eval's history). A message like a
//! past one votes for that one's tools: the evidence the message alone lacks when
//! its words do not point at the tool (Tool2Vec, Re-Invoke).
//!
//! The store keeps the entries; the server builds a [`LearnedIndex`] for its router in
//! the background and passes it with each message ([`crate::RouteInput::learned`]).
//! Past messages are found by the vector the dense stage computes for the message
//! (a dot product with every entry, quantized to 8 bits) and, lexical-only, by BM25
//! over their words. A tool no entry names keeps exactly the evidence it had.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::Router;
use crate::evidence::Best;
use crate::lexical::{Bm25Index, Field, query_words};

/// One past message and the tools its turn called with success.
#[derive(Debug, Clone, PartialEq)]
pub struct LearnedEntry {
    pub message: String,
    pub tools: Vec<String>,
    /// The message's vector from the encoder [`LearnedIndex::new`] names; `None`
    /// leaves the entry to the lexical path.
    pub vector: Option<Vec<f32>>,
    /// The session (conversation) that taught it. A session's entries come in the
    /// order it taught them: the tools of one are what the one before was followed by.
    pub session: Option<String>,
}

/// Per tool `u`: each `(u, v)` pair's count over the entries that name `u`, by `v`.
fn shares(
    pairs: std::collections::HashMap<(u32, u32), u32>,
    tool_entries: &[u32],
) -> Vec<Vec<(u32, f32)>> {
    let mut by_tool = vec![Vec::new(); tool_entries.len()];
    let mut sorted: Vec<((u32, u32), u32)> = pairs.into_iter().collect();
    sorted.sort_unstable();
    for ((u, v), count) in sorted {
        let total = tool_entries[u as usize].max(1);
        by_tool[u as usize].push((v, count as f32 / total as f32));
    }
    by_tool
}

/// Past messages indexed for one router: tool names resolved to its tools.
pub struct LearnedIndex {
    /// The encoder whose vectors the rows hold; the dense path runs only when the
    /// router's dense stage uses the same one.
    model_id: Option<String>,
    dims: usize,
    /// Per entry: its tools, as router indices.
    entry_tools: Vec<Box<[u32]>>,
    /// The messages' bytes: the BM25 postings take about as much.
    message_bytes: usize,
    /// Row-major, `n_rows * dims`: each row an entry's L2-normalised vector, scaled
    /// so its largest coordinate is ±127.
    vectors: Vec<i8>,
    /// Per row: the cosine one unit of its dot product with a query stands for.
    row_scales: Vec<f32>,
    /// Per row: its entry.
    row_entries: Vec<u32>,
    bm25: Bm25Index,
    /// Per tool of the router: how many entries name it.
    tool_entries: Vec<u32>,
    /// Per tool `u`: the tools `v` called in the same turn as it, with the share of
    /// `u`'s entries that also name `v` (co-usage: `get_user_token` with `post`).
    co_used: Vec<Vec<(u32, f32)>>,
    /// Per tool `u`: the tools `v` of the next entry of the same session, with the
    /// share of `u`'s entries followed by `v` (log in, then post).
    followed_by: Vec<Vec<(u32, f32)>>,
    /// The dense matches found so far, by query, once [`LearnedIndex::remembering`]
    /// asked for them: the fit routes each sampled turn once for every rule it tries.
    remembered: Option<Mutex<HashMap<MatchQuery, Matches>>>,
}

/// Per query, the nearest past messages: `(entry, cosine)`.
type Matches = Vec<Vec<(u32, f32)>>;

/// What [`LearnedIndex::dense_matches`] was asked: every query's bits, then the
/// floor's and how many to keep.
type MatchQuery = (Vec<u32>, u32, usize);

impl std::fmt::Debug for LearnedIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LearnedIndex")
            .field("entries", &self.entry_tools.len())
            .field("vectors", &self.row_entries.len())
            .field("model_id", &self.model_id)
            .finish()
    }
}

impl LearnedIndex {
    /// Indexes `entries` for `router`. Tools the router does not have are left out,
    /// and an entry with none of its tools is left out whole; a vector whose length
    /// differs from the first one's is dropped (the entry stays lexical).
    pub fn new(router: &Router, model_id: Option<&str>, entries: &[LearnedEntry]) -> LearnedIndex {
        let registry = &router.registry;
        let mut index = LearnedIndex {
            model_id: model_id.map(str::to_owned),
            dims: 0,
            entry_tools: Vec::new(),
            message_bytes: 0,
            vectors: Vec::new(),
            row_scales: Vec::new(),
            row_entries: Vec::new(),
            bm25: Bm25Index::new(&[]),
            tool_entries: vec![0; registry.all_tools().len()],
            co_used: vec![Vec::new(); registry.all_tools().len()],
            followed_by: vec![Vec::new(); registry.all_tools().len()],
            remembered: None,
        };
        let mut follows: Vec<(u32, u32)> = Vec::new();
        let mut last_of_session: std::collections::HashMap<&str, u32> =
            std::collections::HashMap::new();
        let mut kept: Vec<&LearnedEntry> = Vec::with_capacity(entries.len());
        for entry in entries {
            let mut tools: Vec<u32> = entry
                .tools
                .iter()
                .filter_map(|name| registry.tool_idx(name))
                .map(|t| t as u32)
                .collect();
            tools.sort_unstable();
            tools.dedup();
            if tools.is_empty() || entry.message.trim().is_empty() {
                continue;
            }
            let entry_idx = index.entry_tools.len() as u32;
            if let Some(previous) = entry
                .session
                .as_deref()
                .and_then(|session| last_of_session.insert(session, entry_idx))
            {
                follows.push((previous, entry_idx));
            }
            for &t in &tools {
                index.tool_entries[t as usize] += 1;
            }
            if let Some(vector) = &entry.vector {
                if index.dims == 0 {
                    index.dims = vector.len();
                }
                if let Some((row, scale)) = quantized(vector, index.dims) {
                    index.vectors.extend(row);
                    index.row_scales.push(scale);
                    index.row_entries.push(entry_idx);
                }
            }
            index.entry_tools.push(tools.into_boxed_slice());
            index.message_bytes += entry.message.len();
            kept.push(entry);
        }
        let documents: Vec<Vec<Field<'_>>> = kept
            .iter()
            .map(|entry| {
                vec![Field {
                    text: &entry.message,
                    weight: 1.0,
                }]
            })
            .collect();
        index.bm25 = Bm25Index::new(&documents);
        index.count_co_usage();
        index.count_follows(&follows);
        index
    }

    /// Fills `co_used` from the entries that name several tools.
    fn count_co_usage(&mut self) {
        let mut pairs: std::collections::HashMap<(u32, u32), u32> =
            std::collections::HashMap::new();
        for tools in self.entry_tools.iter().filter(|t| t.len() > 1) {
            for &u in tools.iter() {
                for &v in tools.iter().filter(|&&v| v != u) {
                    *pairs.entry((u, v)).or_insert(0) += 1;
                }
            }
        }
        self.co_used = shares(pairs, &self.tool_entries);
    }

    /// Fills `followed_by` from pairs of consecutive entries of a session.
    fn count_follows(&mut self, follows: &[(u32, u32)]) {
        let mut pairs: std::collections::HashMap<(u32, u32), u32> =
            std::collections::HashMap::new();
        for &(before, after) in follows {
            for &u in self.entry_tools[before as usize].iter() {
                for &v in self.entry_tools[after as usize].iter().filter(|&&v| v != u) {
                    *pairs.entry((u, v)).or_insert(0) += 1;
                }
            }
        }
        self.followed_by = shares(pairs, &self.tool_entries);
    }

    /// The tools the next turn of a session called after one that called tool `u`
    /// (router index), with the share of `u`'s past turns followed by each.
    pub(crate) fn followed_by(&self, u: usize) -> &[(u32, f32)] {
        self.followed_by.get(u).map_or(&[], Vec::as_slice)
    }

    /// The tools called in the same turn as tool `u` (router index), with the share
    /// of `u`'s past turns that called each.
    pub(crate) fn co_used(&self, u: usize) -> &[(u32, f32)] {
        self.co_used.get(u).map_or(&[], Vec::as_slice)
    }

    /// Entries indexed.
    pub fn len(&self) -> usize {
        self.entry_tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entry_tools.is_empty()
    }

    /// Entries with a vector.
    pub fn n_vectors(&self) -> usize {
        self.row_entries.len()
    }

    pub fn model_id(&self) -> Option<&str> {
        self.model_id.as_deref()
    }

    /// How many entries name a tool (by router index).
    pub fn tool_entries(&self, tool_idx: usize) -> usize {
        self.tool_entries.get(tool_idx).copied().unwrap_or(0) as usize
    }

    /// About how many bytes the index holds: vectors, tools, the BM25 postings.
    pub fn approx_bytes(&self) -> usize {
        self.vectors.len()
            + self.row_scales.len() * 4
            + self.row_entries.len() * 4
            + self.message_bytes
            + self
                .entry_tools
                .iter()
                .map(|t| t.len() * 4 + 16)
                .sum::<usize>()
    }

    pub(crate) fn tools(&self, entry: u32) -> &[u32] {
        self.entry_tools.get(entry as usize).map_or(&[], |t| t)
    }

    /// Whether the rows hold vectors of `model_id`'s space and `dims` long.
    pub(crate) fn has_vectors_of(&self, model_id: &str, dims: usize) -> bool {
        !self.row_entries.is_empty()
            && self.dims == dims
            && self.model_id.as_deref() == Some(model_id)
    }

    /// Per query (L2-normalised), the `keep` nearest rows whose cosine is at least
    /// `min_cosine`: `(entry, cosine)`, nearest first. One pass over the rows for all
    /// queries, so the rows are read from memory once per message.
    pub(crate) fn dense_matches(
        &self,
        queries: &[Vec<f32>],
        min_cosine: f32,
        keep: usize,
    ) -> Vec<Vec<(u32, f32)>> {
        let Some(remembered) = &self.remembered else {
            return self.scan(queries, min_cosine, keep);
        };
        let asked: MatchQuery = (
            queries.iter().flatten().map(|x| x.to_bits()).collect(),
            min_cosine.to_bits(),
            keep,
        );
        let lock = || remembered.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = lock().get(&asked) {
            return found.clone();
        }
        let found = self.scan(queries, min_cosine, keep);
        lock().insert(asked, found.clone());
        found
    }

    /// The same index, keeping every dense match it finds for the next time the same
    /// queries come (a fit routes the same turns again and again; a server, never).
    pub fn remembering(mut self) -> LearnedIndex {
        self.remembered = Some(Mutex::new(HashMap::new()));
        self
    }

    /// [`LearnedIndex::dense_matches`] by one pass over the rows.
    fn scan(&self, queries: &[Vec<f32>], min_cosine: f32, keep: usize) -> Vec<Vec<(u32, f32)>> {
        let dims = self.dims;
        let quantized_queries: Vec<(Vec<i8>, f32)> = queries
            .iter()
            .filter_map(|q| quantized(q, dims))
            .map(|(row, scale)| (row.collect(), scale))
            .collect();
        if quantized_queries.len() != queries.len() || dims == 0 {
            return vec![Vec::new(); queries.len()];
        }
        let mut nearest: Vec<Best> = queries.iter().map(|_| Best::new(keep)).collect();
        // The dot products are most of a scan. With AVX2 they are taken sixteen
        // coordinates an instruction (`madd_i8`); otherwise dispatched to the widest
        // instructions the CPU has. Integer sums: either gives the same cosines.
        let scan = DotProducts {
            index: self,
            queries: &quantized_queries,
            min_cosine,
            nearest: &mut nearest,
        };
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V3::try_new() {
            simd.vectorize(MaddScan { simd, scan });
        } else {
            pulp::Arch::new().dispatch(scan);
        }
        #[cfg(not(target_arch = "x86_64"))]
        pulp::Arch::new().dispatch(scan);
        nearest
            .into_iter()
            .map(|best| best.into_sorted().map(|(e, c)| (e as u32, c)).collect())
            .collect()
    }

    /// The `keep` nearest entries whose messages share words with `piece`, nearest
    /// first, with their BM25 share (0..1: the score over what a past message of
    /// average length holding each of the piece's terms once would score), at least
    /// `min_share`.
    pub(crate) fn lexical_matches(
        &self,
        piece: &str,
        min_share: f32,
        keep: usize,
    ) -> Vec<(u32, f32)> {
        let mut words = String::new();
        query_words(&piece.to_lowercase(), &mut words);
        let mut terms = Vec::new();
        self.bm25.query_word_terms(&words, &mut terms);
        let mass: f32 = terms.iter().map(|&t| self.bm25.idf(t)).sum();
        if mass <= 0.0 {
            return Vec::new();
        }
        // One score slot per entry, kept by the thread between messages: zeroing a
        // slot per past message for every piece was a tenth of a selection's
        // instructions with 20,000 of them. Only the touched slots are reset.
        SCORES.with_borrow_mut(|scores| {
            scores.resize(self.len(), 0.0);
            let mut touched = Vec::new();
            self.bm25.score_into_touched(&terms, scores, &mut touched);
            // Each entry is listed once: BM25's terms all add (idf > 0), so a score
            // leaves 0 once. The order does not matter: the nearest are kept by a
            // total order.
            let mut nearest = Best::new(keep);
            for &e in &touched {
                let slot = &mut scores[e as usize];
                let share = (*slot / mass).min(1.0);
                *slot = 0.0;
                if share >= min_share {
                    nearest.push(share, e as usize);
                }
            }
            nearest
                .into_sorted()
                .map(|(e, share)| (e as u32, share))
                .collect()
        })
    }
}

thread_local! {
    /// [`LearnedIndex::lexical_matches`]'s BM25 scores, all 0 between calls.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Every row's cosine with every query, the rows at least `min_cosine` pushed to
/// their query's nearest. A `WithSimd` whose body is inlined into each instruction
/// set's function, so the compiler vectorizes the dot products for it.
struct DotProducts<'a> {
    index: &'a LearnedIndex,
    queries: &'a [(Vec<i8>, f32)],
    min_cosine: f32,
    nearest: &'a mut [Best],
}

impl pulp::WithSimd for DotProducts<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) {
        let queries = self.queries;
        push_matches(
            self.index,
            queries,
            self.min_cosine,
            self.nearest,
            |row, p| dot_i8(row, &queries[p].0),
        );
    }
}

/// [`DotProducts`] with AVX2's sixteen-coordinate multiply-adds: each query widened
/// to `i16` once, each row as it is read.
#[cfg(target_arch = "x86_64")]
struct MaddScan<'a> {
    simd: pulp::x86::V3,
    scan: DotProducts<'a>,
}

#[cfg(target_arch = "x86_64")]
impl pulp::NullaryFnOnce for MaddScan<'_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let (simd, scan) = (self.simd, self.scan);
        let widened: Vec<Vec<i16>> = scan
            .queries
            .iter()
            .map(|(query, _)| query.iter().map(|&x| i16::from(x)).collect())
            .collect();
        push_matches(
            scan.index,
            scan.queries,
            scan.min_cosine,
            scan.nearest,
            |row, p| madd_i8(simd, row, &widened[p]),
        );
    }
}

/// Every row's cosine with every query (`dot(row, p)`: the row's dot product with
/// query `p`), the rows at least `min_cosine` pushed to their query's nearest.
#[inline(always)]
fn push_matches(
    index: &LearnedIndex,
    queries: &[(Vec<i8>, f32)],
    min_cosine: f32,
    nearest: &mut [Best],
    dot: impl Fn(&[i8], usize) -> i32,
) {
    for (r, row) in index.vectors.chunks_exact(index.dims).enumerate() {
        let row_scale = index.row_scales[r];
        for (p, (_, query_scale)) in queries.iter().enumerate() {
            let cosine = dot(row, p) as f32 * row_scale * query_scale;
            if cosine >= min_cosine {
                nearest[p].push(cosine, index.row_entries[r] as usize);
            }
        }
    }
}

/// The order of past messages as neighbours: more similar first, then the earlier entry.
pub(crate) fn nearer(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// `vector` L2-normalised and scaled to `i8`, with the value of one unit; `None` when
/// its length is not `dims` or it is zero or not finite.
fn quantized(vector: &[f32], dims: usize) -> Option<(impl Iterator<Item = i8> + '_, f32)> {
    if vector.len() != dims || dims == 0 || vector.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    let largest = vector.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    if norm <= 0.0 || largest <= 0.0 {
        return None;
    }
    let to_units = 127.0 / largest;
    let row = vector.iter().map(move |x| (x * to_units).round() as i8);
    Some((row, largest / norm / 127.0))
}

#[inline(always)]
fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    // The plain sum: the compiler turns it into multiply-adds of adjacent pairs
    // (`pmaddwd`), 16 coordinates an instruction with AVX2.
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

/// [`dot_i8`] with `b` widened to `i16`, sixteen coordinates an instruction: each
/// chunk of `a` widened (`vpmovsxbw`), multiplied and summed in pairs (`vpmaddwd`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn madd_i8(simd: pulp::x86::V3, a: &[i8], b: &[i16]) -> i32 {
    use std::arch::x86_64::{__m128i, __m256i};
    let n = a.len().min(b.len());
    let (a, a_tail) = a[..n].as_chunks::<16>();
    let (b, b_tail) = b[..n].as_chunks::<16>();
    let tail: i32 = a_tail
        .iter()
        .zip(b_tail)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum();
    let mut sums: __m256i = pulp::cast([0i32; 8]);
    for (x, y) in a.iter().zip(b) {
        let x: __m128i = pulp::cast(*x);
        let products = simd
            .avx2
            ._mm256_madd_epi16(simd.avx2._mm256_cvtepi8_epi16(x), pulp::cast(*y));
        sums = simd.avx2._mm256_add_epi32(sums, products);
    }
    let lanes: [i32; 8] = pulp::cast(sums);
    lanes.iter().sum::<i32>() + tail
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        /// What `Best` keeps is the full sort's first `keep` by `nearer`, the order
        /// the learned votes read matches in, whatever order they come in.
        #[test]
        fn best_keeps_the_nearest_first(
            similarities in proptest::collection::vec(prop_oneof![Just(0.5f32), 0.0f32..1.0], 0..200),
            keep in 0usize..20,
        ) {
            let matches: Vec<(u32, f32)> =
                similarities.iter().enumerate().map(|(e, &s)| (e as u32, s)).rev().collect();
            let mut expected = matches.clone();
            expected.sort_by(super::nearer);
            expected.truncate(keep);
            let mut best = crate::evidence::Best::new(keep);
            for &(e, s) in &matches {
                best.push(s, e as usize);
            }
            let kept: Vec<(u32, f32)> =
                best.into_sorted().map(|(e, s)| (e as u32, s)).collect();
            prop_assert_eq!(kept, expected);
        }
    }

    /// Rows and queries of every length around the 16-coordinate chunks, and the
    /// extreme values, with their plain dot product.
    fn dot_cases() -> Vec<(Vec<i8>, Vec<i8>, i32)> {
        let mut cases: Vec<(Vec<i8>, Vec<i8>, i32)> = [0usize, 1, 15, 16, 17, 383, 384, 385]
            .into_iter()
            .map(|len| {
                let a: Vec<i8> = (0..len)
                    .map(|i| (i as i64 * 37 % 256 - 128) as i8)
                    .collect();
                let b: Vec<i8> = (0..len)
                    .map(|i| (i as i64 * 91 % 256 - 128) as i8)
                    .collect();
                let plain = a
                    .iter()
                    .zip(&b)
                    .map(|(&x, &y)| i32::from(x) * i32::from(y))
                    .sum();
                (a, b, plain)
            })
            .collect();
        cases.push((vec![i8::MIN; 384], vec![i8::MIN; 384], 384 * 128 * 128));
        cases
    }

    /// The lanes give the plain sum for every length and the extreme values; so do
    /// AVX2's multiply-adds, where the CPU has AVX2.
    #[test]
    fn dot_i8_is_the_plain_dot_product() {
        for (a, b, plain) in dot_cases() {
            assert_eq!(super::dot_i8(&a, &b), plain, "length {}", a.len());
            #[cfg(target_arch = "x86_64")]
            if let Some(simd) = pulp::x86::V3::try_new() {
                let wide: Vec<i16> = b.iter().map(|&x| i16::from(x)).collect();
                assert_eq!(super::madd_i8(simd, &a, &wide), plain, "length {}", a.len());
            }
        }
    }
}

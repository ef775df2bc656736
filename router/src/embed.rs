//! The seam for the dense (embedding) similarity stage.
//!
//! The router never loads a model, opens a file or a connection, and never runs an
//! encoder: whoever owns the encoder (the server, with `loadout-embed`'s built-in
//! encoder or an OpenAI-compatible `/v1/embeddings` endpoint) embeds
//! [`Router::dense_texts`] (possibly in the background, through a vector cache) and
//! attaches the result with [`Router::attach_dense`]. Until then the router runs
//! lexical-only and its notes say so. At routing time the caller embeds the
//! [`message_pieces`] of the message and passes them as [`MessageVectors`] in
//! [`RouteInput::vectors`](crate::RouteInput::vectors): one encoder pass per message,
//! batched, cached or skipped as the caller sees fit, and `select` stays pure.
//!
//! [`Router::dense_texts`]: super::Router::dense_texts
//! [`Router::attach_dense`]: super::Router::attach_dense

use crate::requests;

/// What a dense text stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DenseOwner {
    /// A tool's name and description, or one of its examples.
    Tool(usize),
    /// A domain's name and description.
    Domain(usize),
}

/// The texts of a message the dense stage scores, in the order
/// [`MessageVectors::new`] expects their vectors: the whole message (trimmed), then
/// each request when it chains several (see `requests`). Never empty.
pub fn message_pieces(message: &str) -> Vec<&str> {
    let requests = requests::split_requests(message);
    let mut pieces: Vec<&str> = vec![message.trim()];
    if requests.len() > 1 {
        pieces.extend(requests);
    }
    pieces
}

/// A message's vectors, computed outside the router by the encoder of the dense
/// stage: one per [`message_pieces`] entry, L2-normalised. Or, when the caller chose
/// not to run the encoder (busy, failed), why: the selection says so and routes
/// lexically.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageVectors {
    model_id: String,
    pieces: Vec<Vec<f32>>,
    skipped: Option<String>,
    /// Why these are a fallback encoder's vectors (see
    /// [`Router::attach_dense_fallback`](super::Router::attach_dense_fallback)).
    fallback: Option<String>,
}

impl MessageVectors {
    /// The vectors of `model_id` for each of the message's [`message_pieces`], in
    /// that order. Normalised here, so routing needs only dot products.
    pub fn new(model_id: impl Into<String>, pieces: Vec<Vec<f32>>) -> MessageVectors {
        let mut pieces = pieces;
        for piece in &mut pieces {
            normalize(piece);
        }
        MessageVectors {
            model_id: model_id.into(),
            pieces,
            skipped: None,
            fallback: None,
        }
    }

    /// These vectors, marked as the router's fallback encoder's, and why the dense
    /// stage's own encoder did not embed the message (`encoder busy`): the notes say
    /// both.
    pub fn as_fallback(mut self, reason: impl Into<String>) -> MessageVectors {
        self.fallback = Some(reason.into());
        self
    }

    /// No vectors, and why (`encoder busy`): the selection's notes say `dense
    /// skipped: {reason}`.
    pub fn skipped(reason: impl Into<String>) -> MessageVectors {
        MessageVectors {
            model_id: String::new(),
            pieces: Vec::new(),
            skipped: Some(reason.into()),
            fallback: None,
        }
    }

    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// One vector per piece; empty when skipped.
    pub fn pieces(&self) -> &[Vec<f32>] {
        &self.pieces
    }

    /// Why the encoder did not run for this message, if it did not.
    pub fn skip_reason(&self) -> Option<&str> {
        self.skipped.as_deref()
    }

    /// Why these vectors are the fallback encoder's, if they are.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// Vectors were computed (not skipped).
    pub fn is_dense(&self) -> bool {
        self.skipped.is_none()
    }
}

/// L2-normalised vectors of every [`Router::dense_texts`](super::Router::dense_texts)
/// entry, in that order, and the encoder (by id) whose space they are in.
#[derive(Clone)]
pub struct DenseIndex {
    pub(crate) model_id: String,
    pub(crate) dims: usize,
    /// Row-major, `n_rows * dims`.
    pub(crate) vectors: Vec<f32>,
    pub(crate) n_rows: usize,
    /// A joined stage's first encoder's coordinates: each row (and each message
    /// vector) is the first encoder's vector then the second's (see
    /// [`DenseIndex::joined`]).
    pub(crate) first_dims: Option<usize>,
    /// Set when the rows given did not all have `dims` coordinates.
    pub(crate) invalid: Option<String>,
}

impl std::fmt::Debug for DenseIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenseIndex")
            .field("model_id", &self.model_id)
            .field("n_rows", &self.n_rows)
            .field("dims", &self.dims)
            .field("first_dims", &self.first_dims)
            .finish()
    }
}

impl DenseIndex {
    /// The vectors `model_id` produced for the router's dense texts (same order).
    /// Vectors are normalised here so routing needs only dot products. A count or
    /// length mismatch is reported by every selection (lexical-only), never a panic.
    pub fn new(model_id: impl Into<String>, rows: Vec<Vec<f32>>) -> DenseIndex {
        let dims = rows.first().map_or(0, Vec::len);
        let n_rows = rows.len();
        let mut invalid = None;
        let mut vectors = Vec::with_capacity(n_rows * dims);
        for mut row in rows {
            if row.len() != dims || row.iter().any(|x| !x.is_finite()) {
                invalid = Some(format!(
                    "vectors of unequal length or not finite (expected {dims})"
                ));
                break;
            }
            normalize(&mut row);
            vectors.extend_from_slice(&row);
        }
        DenseIndex {
            model_id: model_id.into(),
            dims,
            vectors,
            n_rows,
            first_dims: None,
            invalid,
        }
    }

    /// The vectors of a joined stage: each row is the first encoder's vector, its
    /// first `first_dims` coordinates, then the second encoder's. Each part is
    /// normalised on its own and scored as its own encoder: the first's cosines are
    /// the dense features, the second's the `tool_dense2` ones. Message vectors come
    /// from the same joined encoder; the learned stage compares them whole (the mean
    /// of the two cosines).
    pub fn joined(
        model_id: impl Into<String>,
        rows: Vec<Vec<f32>>,
        first_dims: usize,
    ) -> DenseIndex {
        let mut index = DenseIndex::new(model_id, rows);
        if index.invalid.is_none() && (first_dims == 0 || first_dims >= index.dims) {
            index.invalid = Some(format!(
                "a joined encoder's first part of {first_dims} of {} coordinates",
                index.dims
            ));
        }
        if index.invalid.is_none() && index.dims > 0 {
            for row in index.vectors.chunks_exact_mut(index.dims) {
                let (first, second) = row.split_at_mut(first_dims);
                normalize(first);
                normalize(second);
            }
        }
        index.first_dims = Some(first_dims);
        index
    }

    /// Its rows join two encoders' vectors (see [`DenseIndex::joined`]).
    pub fn is_joined(&self) -> bool {
        self.first_dims.is_some()
    }

    /// The encoder whose space the rows are in; message vectors must come from it.
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// Coordinates per vector.
    pub fn dims(&self) -> usize {
        self.dims
    }

    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    pub(crate) fn row(&self, idx: usize) -> &[f32] {
        self.vectors
            .get(idx * self.dims..(idx + 1) * self.dims)
            .unwrap_or(&[])
    }
}

/// `vector` scaled to length 1 (left as it is when all zero): the dense stage compares
/// vectors by dot products, so encoders and indexes normalise alike.
pub fn normalize(vector: &mut [f32]) {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        for x in vector {
            *x /= norm;
        }
    }
}

#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight running sums, which the compiler keeps in SIMD lanes: one running sum
    // cannot be reordered and went a coordinate at a time (the dense path's cosines
    // with every tool text were most of its selection).
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut lanes = [0.0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        /// The lane-wise dot product is the plain one, up to rounding, at every
        /// length (tails shorter than a lane included) and over the shorter input.
        #[test]
        fn dot_is_the_plain_dot_product(
            a in proptest::collection::vec(-1.0f32..1.0, 0..70),
            b in proptest::collection::vec(-1.0f32..1.0, 0..70),
        ) {
            let plain: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
            let ours = f64::from(super::dot(&a, &b));
            prop_assert!((ours - plain).abs() < 1e-4, "{ours} against {plain}");
        }
    }
}

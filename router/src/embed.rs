//! The seam for the dense (embedding) similarity stage.
//!
//! The router itself never loads a model, opens a file or a connection: whoever owns
//! the embedder (the server, with the built-in encoder of `loadout-embed` or an
//! OpenAI-compatible `/v1/embeddings` endpoint) embeds [`Router::dense_texts`]
//! (possibly in the background, through a vector cache) and attaches the result with
//! [`Router::attach_dense`]. Until then the router runs lexical-only and its notes say
//! so. At routing time the router embeds the message and its requests with one
//! [`Embedder::embed`] call.
//!
//! [`Router::dense_texts`]: super::Router::dense_texts
//! [`Router::attach_dense`]: super::Router::attach_dense

use std::sync::Arc;

/// Turns texts into vectors. Implementations must be deterministic for a given
/// `model_id`, since vectors are cached by it.
pub trait Embedder: Send + Sync {
    /// One vector per text, all of the same length. Texts are never blank.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String>;

    /// Names the model and its settings, e.g. `paraphrase-MiniLM-L3-v2@q4`; part of the
    /// vector cache key.
    fn model_id(&self) -> &str;
}

/// What a dense text stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DenseOwner {
    /// A tool's name and description, or one of its examples.
    Tool(usize),
    /// A domain's name and description.
    Domain(usize),
}

/// L2-normalised vectors of every [`Router::dense_texts`](super::Router::dense_texts)
/// entry, in that order, plus the embedder that turns messages into vectors at routing
/// time.
#[derive(Clone)]
pub struct DenseIndex {
    pub(crate) embedder: Arc<dyn Embedder>,
    pub(crate) dims: usize,
    /// Row-major, `n_rows * dims`.
    pub(crate) vectors: Vec<f32>,
    pub(crate) n_rows: usize,
    /// Set when the rows given did not all have `dims` coordinates.
    pub(crate) invalid: Option<String>,
}

impl std::fmt::Debug for DenseIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenseIndex")
            .field("model_id", &self.embedder.model_id())
            .field("n_rows", &self.n_rows)
            .field("dims", &self.dims)
            .finish()
    }
}

impl DenseIndex {
    /// Pairs an embedder with the vectors it produced for the router's dense texts
    /// (same order). Vectors are normalised here so routing needs only dot products. A
    /// count or length mismatch is reported by every selection (lexical-only), never a
    /// panic.
    pub fn new(embedder: Arc<dyn Embedder>, rows: Vec<Vec<f32>>) -> DenseIndex {
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
            embedder,
            dims,
            vectors,
            n_rows,
            invalid,
        }
    }

    pub fn model_id(&self) -> &str {
        self.embedder.model_id()
    }

    /// The encoder that turns messages into vectors of this index's space.
    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.embedder
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

pub(crate) fn normalize(vector: &mut [f32]) {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        for x in vector {
            *x /= norm;
        }
    }
}

pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

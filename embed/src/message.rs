//! Message vectors for the router, computed outside it: the server embeds each
//! message once (its [`message_pieces`]) and passes the result to `select` and
//! `search` as [`MessageVectors`].
//!
//! A [`MessageEncoder`] wraps one [`Embedder`] with:
//! - a bounded cache of recent texts' vectors (retries and repeated messages skip
//!   the encoder);
//! - worker threads fed by one queue: what arrives while a worker is busy goes
//!   through the encoder with the next call, as one batch (one round trip for an
//!   HTTP endpoint; identical texts of a burst embedded once);
//! - an estimate of the queue's wait, so that a caller with a bound
//!   ([`MessageEncoder::message_vectors_within`]) routes lexically at once instead
//!   of queueing: a burst costs recall on some messages, never seconds of latency.
//!
//! Encoders are shared per model id across the process ([`install_encoder`],
//! [`encoder_for`]): every router whose dense index names the model uses the same
//! cache and workers.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use loadout_router::{MessageVectors, message_pieces};

use crate::Embedder;

/// The reason a skipped message's notes give (`dense skipped: encoder busy`).
pub const ENCODER_BUSY: &str = "encoder busy";

/// Why texts were not embedded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The queue ahead would make the caller wait longer than its bound.
    #[error("encoder busy")]
    Busy,
    /// The encoder failed (or returned the wrong number of vectors).
    #[error("{0}")]
    Failed(String),
    /// The workers are gone (the process is shutting down, or they could not start).
    #[error("the encoder's workers stopped")]
    Stopped,
}

/// How a [`MessageEncoder`] runs.
#[derive(Debug, Clone, Copy)]
pub struct EncoderOptions {
    /// Threads that run the encoder.
    pub workers: usize,
    /// Most texts per encoder call; a worker takes what is queued up to this.
    pub max_batch: usize,
    /// Texts whose vectors are kept (about `cache_entries * dims * 4` bytes).
    pub cache_entries: usize,
}

impl EncoderOptions {
    /// One worker per core but one (at least one, at most 4): a core stays free for
    /// request handling, which a burst of encoder work would otherwise starve.
    /// Batches as the embedder prefers.
    pub fn for_embedder(embedder: &dyn Embedder) -> EncoderOptions {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        EncoderOptions {
            workers: cores.saturating_sub(1).clamp(1, 4),
            max_batch: embedder.max_batch().max(1),
            cache_entries: 4096,
        }
    }
}

/// What an encoder did since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncoderStats {
    /// Encoder calls.
    pub batches: u64,
    /// Texts those calls embedded.
    pub texts: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
}

type Reply = Box<dyn FnOnce(Result<Vec<Vec<f32>>, EncodeError>) + Send>;

struct Job {
    texts: Vec<String>,
    reply: Reply,
}

struct Shared {
    embedder: Arc<dyn Embedder>,
    model_id: String,
    cache: Mutex<RecentVectors>,
    /// Texts queued or being embedded.
    pending: AtomicUsize,
    /// Moving average of the wall time per embedded text, in nanoseconds (0: no
    /// call yet).
    nanos_per_text: AtomicU64,
    workers: usize,
    batches: AtomicU64,
    texts: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
}

/// One embedder behind a cache, a queue and its worker threads. Dropping the last
/// handle stops the workers once the queue is empty.
pub struct MessageEncoder {
    shared: Arc<Shared>,
    jobs: mpsc::Sender<Job>,
}

impl std::fmt::Debug for MessageEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageEncoder")
            .field("model_id", &self.shared.model_id)
            .field("workers", &self.shared.workers)
            .finish()
    }
}

impl MessageEncoder {
    /// Starts the workers. Fails only when no thread could be started.
    pub fn new(
        embedder: Arc<dyn Embedder>,
        options: EncoderOptions,
    ) -> Result<MessageEncoder, EncodeError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let shared = Arc::new(Shared {
            model_id: embedder.model_id().to_owned(),
            embedder,
            cache: Mutex::new(RecentVectors::new(options.cache_entries)),
            pending: AtomicUsize::new(0),
            nanos_per_text: AtomicU64::new(0),
            workers: options.workers.max(1),
            batches: AtomicU64::new(0),
            texts: AtomicU64::new(0),
            cache_hits: AtomicU64::new(0),
            cache_misses: AtomicU64::new(0),
        });
        let mut started = 0;
        for n in 0..shared.workers {
            let (shared, queue) = (shared.clone(), queue.clone());
            let max_batch = options.max_batch.max(1);
            let spawned = std::thread::Builder::new()
                .name(format!("encoder-{n}"))
                .spawn(move || work(&shared, &queue, max_batch));
            match spawned {
                Ok(_) => started += 1,
                Err(e) => tracing::warn!("encoder worker not started: {e}"),
            }
        }
        if started == 0 {
            return Err(EncodeError::Stopped);
        }
        Ok(MessageEncoder { shared, jobs })
    }

    pub fn model_id(&self) -> &str {
        &self.shared.model_id
    }

    /// The embedder itself, for bulk work that should not go through the message
    /// queue (the tool vectors).
    pub fn embedder(&self) -> &Arc<dyn Embedder> {
        &self.shared.embedder
    }

    pub fn stats(&self) -> EncoderStats {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        EncoderStats {
            batches: load(&self.shared.batches),
            texts: load(&self.shared.texts),
            cache_hits: load(&self.shared.cache_hits),
            cache_misses: load(&self.shared.cache_misses),
        }
    }

    /// How long texts queued now would wait before a worker starts on them; `None`
    /// before the encoder's first call (nothing to estimate from).
    pub fn estimated_wait(&self) -> Option<Duration> {
        let per_text = self.shared.nanos_per_text.load(Ordering::Relaxed);
        if per_text == 0 {
            return None;
        }
        let pending = self.shared.pending.load(Ordering::Relaxed) as u64;
        Some(Duration::from_nanos(
            pending.saturating_mul(per_text) / self.shared.workers as u64,
        ))
    }

    /// A vector for each of `texts`, waiting as long as it takes (the CLI, the eval,
    /// the learner). From the cache when there, the rest in batches of the queue.
    pub fn encode(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EncodeError> {
        let (mut found, missing) = self.lookup(texts);
        if missing.is_empty() {
            return Ok(found.into_iter().flatten().collect());
        }
        // Chunks of at most a few texts, so that every worker takes part.
        let chunk = missing.len().div_ceil(self.shared.workers).clamp(1, 64);
        let (sender, receiver) = mpsc::channel();
        let chunks: Vec<&[usize]> = missing.chunks(chunk).collect();
        for (c, indices) in chunks.iter().enumerate() {
            let sender = sender.clone();
            let owned = indices.iter().map(|&i| texts[i].to_owned()).collect();
            self.submit(
                owned,
                Box::new(move |result| {
                    let _ = sender.send((c, result));
                }),
            )?;
        }
        drop(sender);
        for _ in 0..chunks.len() {
            let (c, result) = receiver.recv().map_err(|_| EncodeError::Stopped)?;
            for (&i, vector) in chunks[c].iter().zip(result?) {
                found[i] = Some(vector);
            }
        }
        Ok(found.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// Like [`MessageEncoder::encode`], but refuses at once ([`EncodeError::Busy`])
    /// when the queue ahead would make the texts wait longer than `bound`, and gives
    /// up waiting (still [`EncodeError::Busy`]; the vectors still land in the cache)
    /// when the answer takes much longer than the estimate said.
    pub async fn encode_within(
        &self,
        texts: &[&str],
        bound: Duration,
    ) -> Result<Vec<Vec<f32>>, EncodeError> {
        let (mut found, missing) = self.lookup(texts);
        if missing.is_empty() {
            return Ok(found.into_iter().flatten().collect());
        }
        if self.estimated_wait().is_some_and(|wait| wait > bound) {
            return Err(EncodeError::Busy);
        }
        let per_text = self.shared.nanos_per_text.load(Ordering::Relaxed);
        // Unknown cost (the first call): allow what a cold encoder may take.
        let own = match per_text {
            0 => Duration::from_millis(500),
            n => Duration::from_nanos(n.saturating_mul(missing.len() as u64)),
        };
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let owned = missing.iter().map(|&i| texts[i].to_owned()).collect();
        self.submit(
            owned,
            Box::new(move |result| {
                let _ = sender.send(result);
            }),
        )?;
        let vectors = match tokio::time::timeout(2 * (bound + own), receiver).await {
            Ok(Ok(result)) => result?,
            Ok(Err(_)) => return Err(EncodeError::Stopped),
            Err(_) => return Err(EncodeError::Busy),
        };
        for (&i, vector) in missing.iter().zip(vectors) {
            found[i] = Some(vector);
        }
        Ok(found.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// The message's vectors ([`message_pieces`]), waiting as long as it takes; a
    /// failure gives vectors that say why (the selection routes lexically).
    pub fn message_vectors(&self, message: &str) -> MessageVectors {
        let pieces = message_pieces(message);
        match self.encode(&pieces) {
            Ok(vectors) => MessageVectors::new(self.model_id(), vectors),
            Err(e) => MessageVectors::skipped(e.to_string()),
        }
    }

    /// The message's vectors, or, when the encoder's queue would hold the message
    /// longer than `bound`, vectors skipped as `encoder busy`.
    pub async fn message_vectors_within(&self, message: &str, bound: Duration) -> MessageVectors {
        let pieces = message_pieces(message);
        match self.encode_within(&pieces, bound).await {
            Ok(vectors) => MessageVectors::new(self.model_id(), vectors),
            Err(e) => MessageVectors::skipped(e.to_string()),
        }
    }

    /// Each message's vectors, by message: every piece of every message through the
    /// queue at once (the eval and `loadout replay` route with these).
    pub fn vectors_by_message<'a>(
        &self,
        messages: impl IntoIterator<Item = &'a str>,
    ) -> Result<HashMap<String, MessageVectors>, EncodeError> {
        self.vectors_by_message_kept(messages, None)
    }

    /// [`MessageEncoder::vectors_by_message`], with each piece's vector read from
    /// `kept` when there and added to it when not: a file the eval and the fit reuse,
    /// so that a large history is encoded once.
    pub fn vectors_by_message_kept<'a>(
        &self,
        messages: impl IntoIterator<Item = &'a str>,
        kept: Option<&mut crate::VectorCache>,
    ) -> Result<HashMap<String, MessageVectors>, EncodeError> {
        let mut distinct: Vec<&str> = messages.into_iter().collect();
        distinct.sort_unstable();
        distinct.dedup();
        let pieces: Vec<Vec<&str>> = distinct.iter().map(|m| message_pieces(m)).collect();
        let flat: Vec<&str> = pieces.iter().flatten().copied().collect();
        let vectors = match kept {
            None => self.encode(&flat)?,
            Some(kept) => {
                let mut missing: Vec<&str> = flat
                    .iter()
                    .copied()
                    .filter(|p| kept.get(p).is_none())
                    .collect();
                missing.sort_unstable();
                missing.dedup();
                for (piece, vector) in missing.iter().zip(self.encode(&missing)?) {
                    kept.insert(piece, vector);
                }
                flat.iter()
                    .map(|p| kept.get(p).map(<[f32]>::to_vec))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| EncodeError::Failed("too few vectors returned".to_owned()))?
            }
        };
        let mut vectors = vectors.into_iter();
        let mut by_message = HashMap::with_capacity(distinct.len());
        for (message, pieces) in distinct.iter().zip(&pieces) {
            let own: Vec<Vec<f32>> = vectors.by_ref().take(pieces.len()).collect();
            by_message.insert(
                (*message).to_owned(),
                MessageVectors::new(self.model_id(), own),
            );
        }
        Ok(by_message)
    }

    /// The cached vector of each text, and the indices of those not cached.
    fn lookup(&self, texts: &[&str]) -> (Vec<Option<Vec<f32>>>, Vec<usize>) {
        let found: Vec<Option<Vec<f32>>> = {
            let mut cache = self.shared.cache.lock().unwrap_or_else(|p| p.into_inner());
            texts
                .iter()
                .map(|t| cache.get(&key(&self.shared.model_id, t)))
                .collect()
        };
        let missing: Vec<usize> = (0..texts.len()).filter(|&i| found[i].is_none()).collect();
        let hits = (texts.len() - missing.len()) as u64;
        self.shared.cache_hits.fetch_add(hits, Ordering::Relaxed);
        self.shared
            .cache_misses
            .fetch_add(missing.len() as u64, Ordering::Relaxed);
        (found, missing)
    }

    fn submit(&self, texts: Vec<String>, reply: Reply) -> Result<(), EncodeError> {
        let n = texts.len();
        self.shared.pending.fetch_add(n, Ordering::Relaxed);
        if self.jobs.send(Job { texts, reply }).is_err() {
            self.shared.pending.fetch_sub(n, Ordering::Relaxed);
            return Err(EncodeError::Stopped);
        }
        Ok(())
    }
}

/// How much lower the encoder's threads run than the rest (Unix nice): under a
/// burst the requests' own work comes first, the encoder takes what is left, and
/// its measured cost (hence the wait estimate) grows, so more messages go lexical.
#[cfg(target_os = "linux")]
const WORKER_NICENESS: i32 = 10;

/// Lowers the calling thread's priority by [`WORKER_NICENESS`] (Linux only).
pub(crate) fn lower_priority() {
    // On Linux the nice value is per thread, and `None` names the calling one
    // (elsewhere it would be the whole process's).
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::process::setpriority_process(None, WORKER_NICENESS) {
        tracing::debug!("encoder thread keeps its priority: {e}");
    }
}

/// A worker: takes the next job and whatever else is queued (up to `max_batch`
/// texts), embeds their distinct texts in one call, caches and answers.
fn work(shared: &Shared, queue: &Mutex<mpsc::Receiver<Job>>, max_batch: usize) {
    lower_priority();
    loop {
        let batch = {
            let queue = queue.lock().unwrap_or_else(|p| p.into_inner());
            let Ok(first) = queue.recv() else {
                return;
            };
            let mut n = first.texts.len();
            let mut batch = vec![first];
            while n < max_batch {
                match queue.try_recv() {
                    Ok(job) => {
                        n += job.texts.len();
                        batch.push(job);
                    }
                    Err(_) => break,
                }
            }
            batch
        };
        let n_texts: usize = batch.iter().map(|job| job.texts.len()).sum();
        let mut distinct: Vec<&str> = Vec::with_capacity(n_texts);
        let mut position: HashMap<&str, usize> = HashMap::with_capacity(n_texts);
        let slots: Vec<Vec<usize>> = batch
            .iter()
            .map(|job| {
                job.texts
                    .iter()
                    .map(|text| {
                        *position.entry(text.as_str()).or_insert_with(|| {
                            distinct.push(text.as_str());
                            distinct.len() - 1
                        })
                    })
                    .collect()
            })
            .collect();
        let started = Instant::now();
        // A panicking encoder fails this batch, not the worker.
        let result =
            std::panic::catch_unwind(AssertUnwindSafe(|| shared.embedder.embed(&distinct)))
                .unwrap_or_else(|_| Err("the encoder panicked".to_owned()))
                .and_then(|vectors| {
                    if vectors.len() == distinct.len() {
                        Ok(vectors)
                    } else {
                        Err(format!(
                            "the encoder returned {} vectors for {} texts",
                            vectors.len(),
                            distinct.len()
                        ))
                    }
                });
        let elapsed = started.elapsed().as_nanos() as u64;
        if !distinct.is_empty() {
            let per_text = elapsed / distinct.len() as u64;
            let before = shared.nanos_per_text.load(Ordering::Relaxed);
            let average = if before == 0 {
                per_text
            } else {
                (before * 3 + per_text) / 4
            };
            shared
                .nanos_per_text
                .store(average.max(1), Ordering::Relaxed);
        }
        shared.batches.fetch_add(1, Ordering::Relaxed);
        shared
            .texts
            .fetch_add(distinct.len() as u64, Ordering::Relaxed);
        if let Ok(vectors) = &result {
            let mut cache = shared.cache.lock().unwrap_or_else(|p| p.into_inner());
            for (text, vector) in distinct.iter().zip(vectors) {
                cache.insert(key(&shared.model_id, text), vector.clone());
            }
        }
        shared.pending.fetch_sub(n_texts, Ordering::Relaxed);
        for (job, slots) in batch.into_iter().zip(slots) {
            let answer = match &result {
                Ok(vectors) => Ok(slots.iter().map(|&s| vectors[s].clone()).collect()),
                Err(e) => Err(EncodeError::Failed(e.clone())),
            };
            (job.reply)(answer);
        }
    }
}

/// The cache key: the model and the text, hashed.
fn key(model_id: &str, text: &str) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(model_id.as_bytes());
    hasher.update([0]);
    hasher.update(text.as_bytes());
    hasher.finalize().into()
}

/// The vectors of recently embedded texts, bounded: two generations of at most
/// half the capacity each; a hit in the old one moves to the new one, and when the
/// new one is full the old one is dropped. Least recently used first out, roughly,
/// at O(1) per operation.
struct RecentVectors {
    generation: usize,
    recent: HashMap<[u8; 32], Vec<f32>>,
    old: HashMap<[u8; 32], Vec<f32>>,
}

impl RecentVectors {
    fn new(capacity: usize) -> RecentVectors {
        RecentVectors {
            generation: (capacity / 2).max(1),
            recent: HashMap::new(),
            old: HashMap::new(),
        }
    }

    fn get(&mut self, key: &[u8; 32]) -> Option<Vec<f32>> {
        if let Some(vector) = self.recent.get(key) {
            return Some(vector.clone());
        }
        let vector = self.old.remove(key)?;
        self.insert(*key, vector.clone());
        Some(vector)
    }

    fn insert(&mut self, key: [u8; 32], vector: Vec<f32>) {
        if self.recent.len() >= self.generation && !self.recent.contains_key(&key) {
            self.old = std::mem::take(&mut self.recent);
        }
        self.recent.insert(key, vector);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.recent.len() + self.old.len()
    }
}

/// The process's encoders, one per model id.
static ENCODERS: Mutex<Vec<Arc<MessageEncoder>>> = Mutex::new(Vec::new());

/// The process's encoder for `embedder`'s model: the one already installed for its
/// model id (same id, same vectors: the [`Embedder`] contract), else a new one
/// (with [`EncoderOptions::for_embedder`]). Routers built at the same time, each
/// with an embedder of its own, thus share one cache and one set of workers.
pub fn install_encoder(embedder: Arc<dyn Embedder>) -> Result<Arc<MessageEncoder>, EncodeError> {
    let mut encoders = ENCODERS.lock().unwrap_or_else(|p| p.into_inner());
    let model_id = embedder.model_id();
    if let Some(existing) = encoders.iter().find(|e| e.model_id() == model_id) {
        return Ok(existing.clone());
    }
    let options = EncoderOptions::for_embedder(embedder.as_ref());
    let encoder = Arc::new(MessageEncoder::new(embedder, options)?);
    encoders.push(encoder.clone());
    Ok(encoder)
}

/// The installed encoder of `model_id` (the model a router's dense index names).
pub fn encoder_for(model_id: &str) -> Option<Arc<MessageEncoder>> {
    ENCODERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|e| e.model_id() == model_id)
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sleeps `delay` per call, then gives each text a vector of its length; counts
    /// calls and texts.
    struct Slow {
        delay: Duration,
        calls: AtomicUsize,
        texts: AtomicUsize,
        id: &'static str,
    }

    impl Slow {
        fn new(id: &'static str, delay: Duration) -> Arc<Slow> {
            Arc::new(Slow {
                delay,
                calls: AtomicUsize::new(0),
                texts: AtomicUsize::new(0),
                id,
            })
        }
    }

    impl Embedder for Slow {
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
            std::thread::sleep(self.delay);
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.texts.fetch_add(texts.len(), Ordering::SeqCst);
            Ok(texts.iter().map(|t| vec![t.len() as f32, 1.0]).collect())
        }
        fn model_id(&self) -> &str {
            self.id
        }
    }

    fn options(workers: usize, max_batch: usize) -> EncoderOptions {
        EncoderOptions {
            workers,
            max_batch,
            cache_entries: 64,
        }
    }

    #[test]
    fn a_repeated_message_is_embedded_once() {
        let slow = Slow::new("slow-cache", Duration::ZERO);
        let encoder = MessageEncoder::new(slow.clone(), options(1, 8)).expect("encoder");
        let message = "check the weather in Busan and put a dentist appointment on friday";
        let first = encoder.message_vectors(message);
        assert!(first.is_dense());
        // The whole message and each of its two requests.
        assert_eq!(first.pieces().len(), 3);
        assert_eq!(slow.texts.load(Ordering::SeqCst), 3);
        assert_eq!(encoder.message_vectors(message), first);
        assert_eq!(
            slow.texts.load(Ordering::SeqCst),
            3,
            "the retry hit the cache"
        );
        assert_eq!(encoder.stats().cache_hits, 3);
    }

    #[test]
    fn kept_vectors_come_back_from_the_file_without_the_encoder() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let messages = ["check the weather in Busan and put a dentist appointment on friday"];
        // A new encoder each time (an empty memory cache), with the file reopened.
        let encoded_with_the_file = |slow: &Arc<Slow>| {
            let encoder = MessageEncoder::new(slow.clone(), options(1, 8)).expect("encoder");
            let mut kept = crate::VectorCache::open(dir.path(), "slow-kept");
            let vectors = encoder
                .vectors_by_message_kept(messages, Some(&mut kept))
                .expect("encoded");
            kept.save().expect("saved");
            (vectors, encoder)
        };
        let (first, encoder) = encoded_with_the_file(&Slow::new("slow-kept", Duration::ZERO));
        assert_eq!(
            first,
            encoder.vectors_by_message(messages).expect("encoded")
        );
        let fresh = Slow::new("slow-kept", Duration::ZERO);
        let (again, _) = encoded_with_the_file(&fresh);
        assert_eq!(again, first);
        assert_eq!(fresh.texts.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_cache_is_bounded_and_keeps_what_is_used() {
        let mut cache = RecentVectors::new(4);
        for i in 0..10u8 {
            cache.insert([i; 32], vec![f32::from(i)]);
            // The first text stays in use.
            assert!(cache.get(&[0; 32]).is_some(), "lost at {i}");
            assert!(cache.len() <= 4);
        }
        assert!(cache.get(&[1; 32]).is_none());
    }

    #[test]
    fn messages_queued_together_go_through_the_encoder_as_one_batch() {
        let slow = Slow::new("slow-batch", Duration::from_millis(50));
        let encoder = Arc::new(MessageEncoder::new(slow.clone(), options(1, 32)).expect("encoder"));
        let threads: Vec<_> = (0..6)
            .map(|i| {
                let encoder = encoder.clone();
                std::thread::spawn(move || encoder.encode(&[&format!("message {i}")]))
            })
            .collect();
        for thread in threads {
            assert!(thread.join().expect("thread").is_ok());
        }
        assert_eq!(slow.texts.load(Ordering::SeqCst), 6);
        // The first call runs alone; those queued meanwhile share the next calls.
        assert!(
            slow.calls.load(Ordering::SeqCst) < 6,
            "{} calls for 6 messages",
            slow.calls.load(Ordering::SeqCst)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_message_that_would_queue_past_the_bound_is_skipped_at_once() {
        let slow = Slow::new("slow-busy", Duration::from_millis(100));
        let encoder = Arc::new(MessageEncoder::new(slow.clone(), options(1, 1)).expect("encoder"));
        // Learn the encoder's cost.
        let warm = encoder.message_vectors("warm up");
        assert!(warm.is_dense());
        // Fill the queue: about 400 ms of work ahead.
        let backlog: Vec<_> = (0..4)
            .map(|i| {
                let encoder = encoder.clone();
                std::thread::spawn(move || encoder.encode(&[&format!("backlog {i}")]))
            })
            .collect();
        while encoder.estimated_wait() < Some(Duration::from_millis(150)) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let started = Instant::now();
        let vectors = encoder
            .message_vectors_within("what's it like outside", Duration::from_millis(50))
            .await;
        assert_eq!(vectors.skip_reason(), Some(ENCODER_BUSY));
        assert!(
            started.elapsed() < Duration::from_millis(50),
            "{:?}",
            started.elapsed()
        );
        for thread in backlog {
            assert!(thread.join().expect("thread").is_ok());
        }
        // Once the queue has drained, the same bound admits it.
        let vectors = encoder
            .message_vectors_within("what's it like outside", Duration::from_millis(50))
            .await;
        assert!(vectors.is_dense(), "{:?}", vectors.skip_reason());
    }

    #[test]
    fn a_failing_or_panicking_encoder_fails_the_batch_not_the_worker() {
        struct Flaky(AtomicUsize);
        impl Embedder for Flaky {
            fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
                match self.0.fetch_add(1, Ordering::SeqCst) {
                    0 => Err("endpoint down".into()),
                    1 => panic!("encoder bug"),
                    _ => Ok(vec![vec![1.0]; texts.len()]),
                }
            }
            fn model_id(&self) -> &str {
                "flaky"
            }
        }
        let encoder = MessageEncoder::new(Arc::new(Flaky(AtomicUsize::new(0))), options(1, 4))
            .expect("encoder");
        assert_eq!(
            encoder.message_vectors("a").skip_reason(),
            Some("endpoint down")
        );
        assert_eq!(
            encoder.message_vectors("b").skip_reason(),
            Some("the encoder panicked")
        );
        assert!(encoder.message_vectors("c").is_dense());
    }

    #[test]
    fn installed_encoders_are_shared_per_model() {
        let slow = Slow::new("slow-shared", Duration::ZERO);
        let a = install_encoder(slow.clone()).expect("encoder");
        let b = install_encoder(slow.clone()).expect("encoder");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(encoder_for("slow-shared").is_some_and(|e| Arc::ptr_eq(&e, &a)));
        // Another embedder of the same model (another router's) shares it.
        let c = install_encoder(Slow::new("slow-shared", Duration::ZERO)).expect("encoder");
        assert!(Arc::ptr_eq(&a, &c));
        assert!(encoder_for("nobody").is_none());
    }
}

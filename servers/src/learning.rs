//! Routing that learns from use: what each turn called with success is written to
//! the store's learned memory in the background, and the router's [`LearnedIndex`]
//! is rebuilt from the store in the background, so that learning a turn is never on
//! the request's path.
//!
//! [`Learner::record`] queues an event and returns; a task embeds its message with
//! the dense stage's encoder (when it runs) and writes it with the store's bounds
//! (once per session, tool and day; near-duplicates merged; a cap per tool). Another
//! task keeps the index: built at start, and again when the store's learned version
//! moves (any replica learned or forgot something), when this process learned
//! something, when the router is replaced, or when the dense stage attaches.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use loadout_router::{LearnedEntry, LearnedIndex, Router};
use loadout_store::{LearnOutcome, LearnedWrite, Store, now_ms};
use tokio::sync::{Notify, mpsc, oneshot};

/// The setting that turns learning off (`learning = off`).
pub const LEARNING_SETTING: &str = "learning";

/// Entries each tool keeps (the newest).
pub const ENTRIES_PER_TOOL: usize = 200;

/// How often the store's learned version is compared with the index's.
pub const POLL_EVERY: Duration = Duration::from_secs(3);

/// Events queued at most; a full queue drops new ones (learning is best effort).
const QUEUE_CAPACITY: usize = 4096;

/// Where a learned message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LearnSource {
    /// A chat turn's successful calls of tools it was routed.
    Chat,
    /// `/api/route`'s `called`: the tools a client's model called for its previous
    /// message.
    Route,
    /// A tool the model fetched with `load_tools` or `search_tools` after routing,
    /// then called with success: a miss the model repaired, the strongest signal.
    Repair,
    /// MCP: a `search_tools` query, then a successful call of a tool it returned.
    McpSearch,
    /// A tool's `examples`.
    Example,
    /// `loadout learn --cases`.
    Import,
}

impl LearnSource {
    pub fn as_str(self) -> &'static str {
        match self {
            LearnSource::Chat => "chat",
            LearnSource::Route => "route",
            LearnSource::Repair => "repair",
            LearnSource::McpSearch => "mcp_search",
            LearnSource::Example => "example",
            LearnSource::Import => "import",
        }
    }
}

/// The message an event teaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LearnText {
    Message(String),
    /// The user message of a stored turn, read in the background (`/api/route`'s
    /// `called` answers the previous turn, whose message the request does not carry).
    Turn {
        session: String,
        turn: i64,
    },
}

/// One thing to learn: a message and the tools it called with success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnEvent {
    pub message: LearnText,
    pub tools: Vec<String>,
    pub session: Option<String>,
    pub source: LearnSource,
}

/// Whether the settings allow learning: `learning` is not `off`, and the decision
/// log keeps messages (`decision_log` `hash` or `off` means the operator does not
/// want messages kept, so nothing of them is learned either).
pub fn learning_allowed(settings: &BTreeMap<String, String>) -> bool {
    let off = |key: &str, values: &[&str]| {
        settings
            .get(key)
            .is_some_and(|v| values.contains(&v.trim()))
    };
    !off(LEARNING_SETTING, &["off"])
        && !off(
            crate::decision_log::DECISION_LOG_SETTING,
            &["hash", "sha256", "off"],
        )
}

/// The index in force and what it was built from.
struct Built {
    router: Weak<Router>,
    model: Option<String>,
    version: i64,
    index: Arc<LearnedIndex>,
}

enum Job {
    Learn(LearnEvent),
    /// Answered once every event queued before it is written.
    Flush(oneshot::Sender<()>),
}

struct Inner {
    store: Store,
    router: Arc<RwLock<Arc<Router>>>,
    queue: mpsc::Sender<Job>,
    built: RwLock<Option<Built>>,
    /// Held through a refresh: two at once (the index task's and a caller's) could
    /// finish out of order and leave the older index in force.
    refreshing: tokio::sync::Mutex<()>,
    /// Wakes the index task before its next poll.
    rebuild: Notify,
    /// Index builds so far (tests wait on it).
    n_builds: AtomicU64,
    n_dropped: AtomicU64,
}

/// The learner of one process: its queue, its writer and the current index.
#[derive(Clone)]
pub struct Learner {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Learner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Learner")
            .field("n_builds", &self.inner.n_builds.load(Ordering::Relaxed))
            .finish()
    }
}

impl Learner {
    /// Starts the writer and the index task. `router`: the cell of the router new
    /// turns start with ([`crate::routing::Routing`]'s).
    pub fn start(store: Store, router: Arc<RwLock<Arc<Router>>>) -> Learner {
        let (queue, jobs) = mpsc::channel(QUEUE_CAPACITY);
        let inner = Arc::new(Inner {
            store,
            router,
            queue,
            built: RwLock::new(None),
            refreshing: tokio::sync::Mutex::new(()),
            rebuild: Notify::new(),
            n_builds: AtomicU64::new(0),
            n_dropped: AtomicU64::new(0),
        });
        tokio::spawn(write_events(Arc::downgrade(&inner), jobs));
        tokio::spawn(keep_index(Arc::downgrade(&inner)));
        Learner { inner }
    }

    /// Queues an event; never waits. A full queue drops it.
    pub fn record(&self, event: LearnEvent) {
        if event.tools.is_empty() {
            return;
        }
        if self.inner.queue.try_send(Job::Learn(event)).is_err() {
            let n = self.inner.n_dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!("learning: event dropped (queue full); {n} dropped so far");
            }
        }
    }

    /// Waits until every event queued so far is written (shutdown, tests).
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.inner.queue.send(Job::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }

    /// The index built for `router`, if the current one is (a router just replaced
    /// routes without one until its own is built).
    pub fn index_for(&self, router: &Arc<Router>) -> Option<Arc<LearnedIndex>> {
        let built = self.inner.built.read().unwrap_or_else(|p| p.into_inner());
        built
            .as_ref()
            .filter(|b| std::ptr::eq(b.router.as_ptr(), Arc::as_ptr(router)))
            .filter(|b| !b.index.is_empty())
            .map(|b| b.index.clone())
    }

    /// Asks the index task to look again now (the router was replaced).
    pub fn rebuild_soon(&self) {
        self.inner.rebuild.notify_one();
    }

    /// Builds the index now if the store or the router moved since it was built.
    pub async fn refresh(&self) {
        refresh(&self.inner).await;
    }

    /// Index builds so far.
    pub fn n_builds(&self) -> u64 {
        self.inner.n_builds.load(Ordering::Relaxed)
    }

    /// Queues the `examples` of `router`'s tools not learned yet (source `example`,
    /// no session), for tools linked in and toolkit files alike.
    pub async fn learn_examples(&self, router: &Router) {
        let known = match self.inner.store.learned_rows(None, None).await {
            Ok(rows) => rows
                .into_iter()
                .filter(|r| r.source == LearnSource::Example.as_str())
                .flat_map(|r| {
                    let text = loadout_store::normalized_text(&r.message);
                    r.tools.into_iter().map(move |t| (text.clone(), t))
                })
                .collect::<std::collections::HashSet<_>>(),
            Err(e) => {
                tracing::warn!("learning: tools' examples not learned: {e}");
                return;
            }
        };
        for tool in router.registry().all_tools() {
            for example in &tool.examples {
                let key = (loadout_store::normalized_text(example), tool.name.clone());
                if key.0.is_empty() || known.contains(&key) {
                    continue;
                }
                self.record(LearnEvent {
                    message: LearnText::Message(example.clone()),
                    tools: vec![tool.name.clone()],
                    session: None,
                    source: LearnSource::Example,
                });
            }
        }
    }
}

/// Writes queued events until the learner is gone.
async fn write_events(inner: Weak<Inner>, mut jobs: mpsc::Receiver<Job>) {
    while let Some(job) = jobs.recv().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        match job {
            Job::Flush(done) => {
                let _ = done.send(());
            }
            Job::Learn(event) => match learn(&inner, event).await {
                Ok(LearnOutcome::Nothing) => {}
                Ok(_) => inner.rebuild.notify_one(),
                Err(e) => tracing::warn!("learning: not written: {e}"),
            },
        }
    }
}

async fn learn(inner: &Inner, event: LearnEvent) -> Result<LearnOutcome, String> {
    let router = inner
        .router
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let message = match event.message {
        LearnText::Message(text) => text,
        LearnText::Turn { session, turn } => {
            match inner
                .store
                .user_message(&session, turn)
                .await
                .map_err(|e| e.to_string())?
            {
                Some(text) => text,
                None => return Ok(LearnOutcome::Nothing),
            }
        }
    };
    // Only the router's own tools, never a meta-tool: what a message needed.
    let registry = router.registry();
    let tools: Vec<String> = event
        .tools
        .into_iter()
        .filter(|t| registry.tool(t).is_some() && !loadout::meta::ALL.contains(&t.as_str()))
        .collect();
    if tools.is_empty() || message.trim().is_empty() {
        return Ok(LearnOutcome::Nothing);
    }
    let encoder = router
        .dense()
        .and_then(|dense| loadout_embed::encoder_for(dense.model_id()));
    let (model, vector) = match encoder {
        Some(encoder) => {
            let model = encoder.model_id().to_owned();
            let text = message.clone();
            // Through the message cache: the message was embedded when it was routed.
            let embedded =
                tokio::task::spawn_blocking(move || encoder.encode(&[text.trim()])).await;
            match embedded {
                Ok(Ok(mut vectors)) if vectors.len() == 1 => (Some(model), vectors.pop()),
                Ok(Err(e)) => {
                    tracing::debug!("learning: message not embedded ({e}); kept lexical");
                    (None, None)
                }
                _ => (None, None),
            }
        }
        None => (None, None),
    };
    inner
        .store
        .learned_insert(
            LearnedWrite {
                at_ms: now_ms(),
                session: event.session,
                source: event.source.as_str().to_owned(),
                message,
                tools,
                model,
                vector,
            },
            ENTRIES_PER_TOOL,
        )
        .await
        .map_err(|e| e.to_string())
}

/// Keeps the index current until the learner is gone.
async fn keep_index(inner: Weak<Inner>) {
    loop {
        let notified = {
            let Some(inner) = inner.upgrade() else {
                return;
            };
            refresh(&inner).await;
            // Registered before the wait, so a notification in between is not lost.
            let inner = inner.clone();
            async move {
                tokio::select! {
                    _ = inner.rebuild.notified() => {}
                    _ = tokio::time::sleep(POLL_EVERY) => {}
                }
            }
        };
        notified.await;
    }
}

async fn refresh(inner: &Inner) {
    let _one_at_a_time = inner.refreshing.lock().await;
    let router = inner
        .router
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let model = router.dense().map(|d| d.model_id().to_owned());
    let version = match inner.store.learned_version().await {
        Ok(version) => version,
        Err(e) => {
            tracing::debug!("learning: version not read: {e}");
            return;
        }
    };
    let current = {
        let built = inner.built.read().unwrap_or_else(|p| p.into_inner());
        built.as_ref().is_some_and(|b| {
            b.version == version
                && b.model == model
                && std::ptr::eq(b.router.as_ptr(), Arc::as_ptr(&router))
        })
    };
    if current {
        return;
    }
    let rows = match inner.store.learned_rows(None, model.as_deref()).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!("learning: index not rebuilt: {e}");
            return;
        }
    };
    let mut rows = rows;
    let encoder = model.as_deref().and_then(loadout_embed::encoder_for);
    if let (Some(model), Some(encoder)) = (&model, encoder) {
        // Past the message queue: a backlog of entries must not make messages wait.
        embed_missing(inner, model, encoder.embedder().clone(), &mut rows).await;
    }
    let entries: Vec<LearnedEntry> = rows
        .into_iter()
        .map(|r| LearnedEntry {
            message: r.message,
            tools: r.tools,
            vector: r.vector,
            session: r.session,
        })
        .collect();
    let for_router = router.clone();
    let built_model = model.clone();
    let index = tokio::task::spawn_blocking(move || {
        LearnedIndex::new(&for_router, built_model.as_deref(), &entries)
    })
    .await;
    let Ok(index) = index else {
        return;
    };
    tracing::debug!("learning: index rebuilt: {index:?}");
    crate::metrics::set_learned_entries(index.len());
    *inner.built.write().unwrap_or_else(|p| p.into_inner()) = Some(Built {
        router: Arc::downgrade(&router),
        model,
        version,
        index: Arc::new(index),
    });
    inner.n_builds.fetch_add(1, Ordering::Relaxed);
}

/// Entries embedded per index build at most, for those learned without a vector
/// (imports, examples queued before the dense stage attached, `loadout mcp`'s
/// lexical search router): the rest follow at the next builds.
const EMBED_PER_BUILD: usize = 256;

/// Embeds entries never embedded (of no model) with the dense stage's encoder, and
/// stores their vectors for every replica; entries of another encoder stay as they
/// are (lexical here).
async fn embed_missing(
    inner: &Inner,
    model: &str,
    embedder: Arc<dyn loadout_embed::Embedder>,
    rows: &mut [loadout_store::LearnedRow],
) {
    let missing: Vec<usize> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r.model.is_none() && r.vector.is_none())
        .map(|(i, _)| i)
        .take(EMBED_PER_BUILD)
        .collect();
    if missing.is_empty() {
        return;
    }
    let texts: Vec<String> = missing.iter().map(|&i| rows[i].message.clone()).collect();
    let embedded = tokio::task::spawn_blocking(move || {
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        embedder.embed(&texts)
    })
    .await;
    let vectors = match embedded {
        Ok(Ok(vectors)) if vectors.len() == missing.len() => vectors,
        Ok(Err(e)) => {
            tracing::debug!("learning: entries not embedded ({e}); kept lexical");
            return;
        }
        _ => return,
    };
    let mut updates = Vec::with_capacity(vectors.len());
    for (&i, vector) in missing.iter().zip(vectors) {
        rows[i].vector = Some(vector.clone());
        rows[i].model = Some(model.to_owned());
        updates.push((rows[i].id, vector));
    }
    if let Err(e) = inner.store.learned_set_vectors(model, updates).await {
        tracing::debug!("learning: vectors not stored: {e}");
    }
}

#[cfg(test)]
mod tests {
    use loadout_embed::Embedder;
    use loadout_router::{DenseIndex, RouterConfig};

    use super::*;

    /// Two dimensions: the text's length and 1.
    struct LengthEmbedder;

    impl Embedder for LengthEmbedder {
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
            Ok(texts.iter().map(|t| vec![t.len() as f32, 1.0]).collect())
        }
        fn model_id(&self) -> &str {
            "length"
        }
    }

    fn router(dense: bool) -> Arc<Router> {
        let registry = Arc::new(loadout_domains::registry().expect("registry"));
        let router = Router::new(registry, RouterConfig::default());
        if dense {
            let rows = vec![vec![0.0, 1.0]; router.dense_texts().len()];
            loadout_embed::install_encoder(Arc::new(LengthEmbedder)).expect("encoder");
            assert!(router.attach_dense(DenseIndex::new("length", rows)).is_ok());
        }
        Arc::new(router)
    }

    /// What is learned is embedded with the dense stage's encoder; an entry imported
    /// without a vector gets one at the next build; the index is built for the
    /// router in force, and again for one that replaces it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn events_are_embedded_and_the_index_follows_the_store_and_the_router() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open_dir(dir.path()).await.expect("store");
        let first = router(true);
        let cell = Arc::new(RwLock::new(first.clone()));
        let learner = Learner::start(store.clone(), cell.clone());
        store
            .learned_insert(
                LearnedWrite {
                    at_ms: 1,
                    session: None,
                    source: "import".into(),
                    message: "swap my euros".into(),
                    tools: vec!["list_tables".into()],
                    model: None,
                    vector: None,
                },
                ENTRIES_PER_TOOL,
            )
            .await
            .expect("import");
        learner.record(LearnEvent {
            message: LearnText::Message("make a table of my runs".into()),
            tools: vec![
                "create_table".into(),
                "load_tools".into(),
                "no_such_tool".into(),
            ],
            session: Some("s".into()),
            source: LearnSource::Chat,
        });
        learner.flush().await;
        learner.refresh().await;
        let rows = store
            .learned_rows(None, Some("length"))
            .await
            .expect("rows");
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(
            rows[1].tools,
            ["create_table"],
            "only the router's own tools"
        );
        assert_eq!(rows[1].vector, Some(vec![23.0, 1.0]));
        assert_eq!(
            rows[0].vector,
            Some(vec![13.0, 1.0]),
            "the import was embedded"
        );
        let index = learner.index_for(&first).expect("an index for the router");
        assert_eq!((index.len(), index.n_vectors()), (2, 2));

        let second = router(false);
        *cell.write().expect("cell") = second.clone();
        assert!(
            learner.index_for(&second).is_none(),
            "built for the old router"
        );
        learner.refresh().await;
        let index = learner
            .index_for(&second)
            .expect("rebuilt for the new router");
        assert_eq!(
            (index.len(), index.n_vectors()),
            (2, 0),
            "lexical-only router"
        );
    }

    #[test]
    fn hash_or_off_decision_logs_and_learning_off_stop_learning() {
        let settings = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert!(learning_allowed(&settings(&[])));
        assert!(learning_allowed(&settings(&[("decision_log", "plain")])));
        assert!(!learning_allowed(&settings(&[("decision_log", "hash")])));
        assert!(!learning_allowed(&settings(&[("decision_log", "off")])));
        assert!(!learning_allowed(&settings(&[("learning", "off")])));
    }
}

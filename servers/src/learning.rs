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
            crate::routing::DECISION_LOG_SETTING,
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
    let (model, vector) = match router.dense() {
        Some(dense) => {
            let embedder = dense.embedder().clone();
            let model = dense.model_id().to_owned();
            let text = message.clone();
            let embedded =
                tokio::task::spawn_blocking(move || embedder.embed(&[text.as_str()])).await;
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
    let entries: Vec<LearnedEntry> = rows
        .into_iter()
        .map(|r| LearnedEntry {
            message: r.message,
            tools: r.tools,
            vector: r.vector,
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
    *inner.built.write().unwrap_or_else(|p| p.into_inner()) = Some(Built {
        router: Arc::downgrade(&router),
        model,
        version,
        index: Arc::new(index),
    });
    inner.n_builds.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

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

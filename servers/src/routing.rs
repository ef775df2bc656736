//! One routed turn, as every entry point runs it (`/api/route`, `/api/chat`,
//! `loadout route`): load the session's state from the store, ask the router, persist
//! what changed, and queue the decision for the log.
//!
//! The router itself is pure; this is the only place that feeds it from storage and
//! writes its results back.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use loadout::StoreError;
use loadout_router::{
    DomainState, LearnedIndex, MessageVectors, RouteInput, Router, Selection, SessionView,
};
use loadout_store::Store;
use loadout_store::{SessionDomainState, now_ms};

use crate::decision_log;
use crate::learning::{LearnEvent, LearnSource, LearnText, Learner, learning_allowed};
use crate::log_writer::DecisionWriter;

/// The router's memory of a domain, as the store keeps it.
fn domain_state(row: SessionDomainState) -> DomainState {
    DomainState {
        domain: row.domain,
        last_used_turn: row.last_used_turn,
        pinned: row.pinned,
        unloaded: row.unloaded,
    }
}

/// Longest message the router accepts, in bytes; longer ones are refused, not cut.
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;
/// The cross-session warm rule's window.
pub const WARM_WINDOW_MS: i64 = 24 * 60 * 60 * 1000;

/// Why a turn could not be routed.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("message is empty")]
    EmptyMessage,
    #[error("message is {0} bytes; the limit is {MAX_MESSAGE_BYTES}")]
    MessageTooLarge(usize),
    #[error("unknown tool names in `called`: {}", .0.join(", "))]
    UnknownCalled(Vec<String>),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What to route.
#[derive(Debug, Clone, Copy)]
pub struct TurnRequest<'a> {
    /// `None`: a one-off message with no session state.
    pub session: Option<&'a str>,
    pub message: &'a str,
    /// Tools the client called since its previous turn (when it runs its own model
    /// loop): recorded as usage of that turn before routing this one.
    pub called: &'a [String],
    /// Overrides the token budget for this turn.
    pub token_budget: Option<usize>,
}

/// A routed turn: the selection and the session view it was made with (the chat loop
/// keeps mutating the view with meta-tools).
#[derive(Debug, Clone)]
pub struct RoutedTurn {
    /// The router this turn was routed with; its later steps (meta-tools, calls) use
    /// it too, even if [`Routing::replace_router`] has been called since.
    pub router: Arc<Router>,
    pub turn: i64,
    /// Shared, so that a meta-tool's result takes it under the turn's lock without
    /// copying it.
    pub selection: Arc<Selection>,
    /// What the selection carries into the session's next turn ([`SessionView::carry_into_next`];
    /// empty without a session).
    pub carry: Vec<String>,
    pub view: SessionView,
    pub settings: Arc<BTreeMap<String, String>>,
    /// The learned memory this turn routes with (also for `search_tools`).
    pub learned: Option<Arc<LearnedIndex>>,
    /// The message's vectors (with the dense stage): a reselection in the same turn
    /// routes with them again instead of running the encoder.
    pub vectors: Option<Arc<MessageVectors>>,
}

/// Routing plus the writers it needs; one per process.
#[derive(Clone, Debug)]
pub struct Routing {
    /// The router new turns start with; replaced when the routable tools change (an
    /// upstream MCP server's tool list).
    router: Arc<RwLock<Arc<Router>>>,
    pub decisions: DecisionWriter,
    /// Learns from the turns' calls and keeps the learned index of the router.
    pub learner: Learner,
    /// One lock per session with a turn in flight: concurrent turns of one session run
    /// one after the other instead of interleaving their messages and state.
    sessions: Arc<Mutex<HashMap<String, Weak<SessionLock>>>>,
}

type SessionLock = tokio::sync::Mutex<()>;

/// Held while a session's turn runs; see [`Routing::lock_session`].
pub type SessionGuard = tokio::sync::OwnedMutexGuard<()>;

impl Routing {
    pub fn new(router: Arc<Router>, store: Store) -> Routing {
        let router = Arc::new(RwLock::new(router));
        Routing {
            learner: Learner::start(store.clone(), router.clone()),
            router,
            decisions: DecisionWriter::start(store),
            sessions: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The router a turn starting now uses.
    pub fn router(&self) -> Arc<Router> {
        self.router
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Turns that start from now on route with `router`; turns in flight keep theirs.
    pub fn replace_router(&self, router: Arc<Router>) {
        *self
            .router
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = router;
        // Its tools are numbered anew: the learned index is built again for it.
        self.learner.rebuild_soon();
    }

    /// Waits until no other turn of `session` runs in this process, and holds that
    /// until the guard drops. (Across replicas turns are ordered by the store's row
    /// lock on the session, message by message.)
    pub async fn lock_session(&self, session: &str) -> SessionGuard {
        let lock = {
            let mut locks = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
            match locks.get(session).and_then(Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    // Forget sessions with no turn in flight before the map grows.
                    if locks.len() >= 1024 {
                        locks.retain(|_, lock| lock.strong_count() > 0);
                    }
                    let lock = Arc::new(SessionLock::new(()));
                    locks.insert(session.to_owned(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }

    /// Routes one user turn. With a session: records `called`, routes with the
    /// session's stickiness and the last turn's carry-over, appends the message with
    /// this turn's carry-over (which advances the turn), persists the state changes
    /// and queues the decision.
    pub async fn route(
        &self,
        store: &Store,
        settings: Arc<BTreeMap<String, String>>,
        request: TurnRequest<'_>,
    ) -> Result<RoutedTurn, RouteError> {
        if !crate::telemetry::enabled() {
            return self.route_untraced(store, settings, request).await;
        }
        use tracing::Instrument as _;
        // The routing decision as a span: the stage that sent each domain, and what
        // the turn sent (tools, tokens).
        let span = tracing::info_span!(
            target: crate::telemetry::TARGET,
            "loadout.route",
            loadout.route.turn = tracing::field::Empty,
            loadout.route.tools = tracing::field::Empty,
            loadout.route.tokens = tracing::field::Empty,
            loadout.route.stages = tracing::field::Empty,
            loadout.route.dense = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let routed = self
            .route_untraced(store, settings, request)
            .instrument(span.clone())
            .await;
        match &routed {
            Ok(routed) => {
                let selection = &routed.selection;
                let stages: Vec<String> = selection
                    .domains
                    .iter()
                    .filter(|d| d.included)
                    .map(|d| format!("{}:{}", d.domain, d.stage))
                    .collect();
                span.record("loadout.route.turn", routed.turn);
                span.record("loadout.route.tools", selection.n_tools as i64);
                span.record("loadout.route.tokens", selection.tokens as i64);
                span.record("loadout.route.stages", stages.join(","));
                span.record("loadout.route.dense", routed.vectors.is_some());
            }
            Err(_) => {
                span.record("otel.status_code", "ERROR");
            }
        }
        routed
    }

    async fn route_untraced(
        &self,
        store: &Store,
        settings: Arc<BTreeMap<String, String>>,
        request: TurnRequest<'_>,
    ) -> Result<RoutedTurn, RouteError> {
        let message = request.message;
        if message.trim().is_empty() {
            return Err(RouteError::EmptyMessage);
        }
        if message.len() > MAX_MESSAGE_BYTES {
            return Err(RouteError::MessageTooLarge(message.len()));
        }
        let router = self.router();
        let learned = self.learner.index_for(&router);
        let registry = router.registry();
        let unknown: Vec<String> = request
            .called
            .iter()
            .filter(|name| registry.tool(name).is_none())
            .map(|name| name.chars().take(64).collect())
            .collect();
        if !unknown.is_empty() {
            return Err(RouteError::UnknownCalled(unknown));
        }
        // Embedded once, before anything is read or locked, and outside the router.
        let vectors = message_vectors(&router, &settings, message)
            .await
            .map(Arc::new);

        let pass = Pass {
            router: &router,
            settings: &settings,
            message,
            token_budget: request.token_budget,
            learned: learned.as_deref(),
            vectors: vectors.as_deref(),
        };
        let (turn, selection, carry, view) = match request.session {
            Some(session) => {
                self.route_in_session(store, session, request.called, &pass)
                    .await?
            }
            None => {
                let view = SessionView::new(1);
                let selection = Arc::new(pass.select(&view));
                // No next turn to carry anything into.
                (1, selection, Vec::new(), view)
            }
        };
        self.log(&settings, &selection, request.session, turn, message);
        crate::metrics::record_turn(selection.n_tools, selection.tokens);
        Ok(RoutedTurn {
            router,
            turn,
            selection,
            carry,
            view,
            settings,
            learned,
            vectors,
        })
    }

    /// The session part of [`Routing::route`]: records `called`, routes as the
    /// session's next turn, and stores the message with what this turn carries over.
    async fn route_in_session(
        &self,
        store: &Store,
        session: &str,
        called: &[String],
        pass: &Pass<'_>,
    ) -> Result<(i64, Arc<Selection>, Vec<String>, SessionView), RouteError> {
        // Reads of a session that does not exist yet are empty; `turn_append` below
        // creates it.
        let snapshot = store.session_snapshot(session).await?;
        let domains = snapshot.domains.into_iter().map(domain_state).collect();
        let mut view = SessionView::from_store(snapshot.turn, domains);
        view.recent_calls = snapshot.recent_calls;
        if !called.is_empty() {
            self.record_called(store, session, snapshot.turn, called, pass, &mut view)
                .await?;
        }
        // Routed as the next turn before the message is stored, so that the message and
        // what this turn carries into the next go to the store in one write.
        let expected = snapshot.turn + 1;
        let (mut selection, mut carry) = select_turn(pass, &mut view, expected, snapshot.carry);
        let message_json = serde_json::Value::String(pass.message.to_owned());
        let turn = store.turn_append(session, &message_json, &carry).await?;
        if turn != expected {
            // Another replica stored a turn of this session in between: route again at
            // the turn the store counted.
            let carried = std::mem::take(&mut view.carried_tools);
            (selection, carry) = select_turn(pass, &mut view, turn, carried);
            store.session_carry_put(session, turn, &carry).await?;
        }
        Ok((turn, selection, carry, view))
    }

    /// Records the tools the client's model called since the session's last turn
    /// (`turn`): its view and the store see them, and its previous message teaches them.
    async fn record_called(
        &self,
        store: &Store,
        session: &str,
        turn: i64,
        called: &[String],
        pass: &Pass<'_>,
        view: &mut SessionView,
    ) -> Result<(), RouteError> {
        let changed = view.record_calls(pass.router, called);
        self.persist(store, session, &changed, None).await?;
        // The calls belong to the turn they answer: the session's history and a
        // replay of it (`loadout replay`) see them there, as they see a chat's.
        // Unknown names were refused before.
        store.calls_reported(session, turn, called).await?;
        // What the client's model called answers its previous message: that
        // message teaches those tools (read and written in the background).
        if turn >= 1 && learning_allowed(pass.settings) {
            self.learner.record(LearnEvent {
                message: LearnText::Turn {
                    session: session.to_owned(),
                    turn,
                },
                tools: called.to_vec(),
                session: Some(session.to_owned()),
                source: LearnSource::Route,
            });
        }
        Ok(())
    }

    /// Routes again within the same turn (after a meta-tool changed the view); the
    /// decision is logged as another row of the same turn. The caller stores the new
    /// carry-over with [`Routing::persist`].
    pub fn reselect(&self, routed: &mut RoutedTurn, session: Option<&str>, message: &str) {
        // The turn's own vectors: no encoder runs under the turn's lock.
        let pass = Pass {
            router: &routed.router,
            settings: &routed.settings,
            message,
            token_budget: None,
            learned: routed.learned.as_deref(),
            vectors: routed.vectors.as_deref(),
        };
        routed.selection = Arc::new(pass.select(&routed.view));
        routed.carry = routed.view.carry_into_next(&routed.selection);
        self.log(
            &routed.settings,
            &routed.selection,
            session,
            routed.turn,
            message,
        );
    }

    /// Stores the session's changed domain rows and, after a [`Routing::reselect`],
    /// what its turn now carries over (`(turn, carry)`).
    pub async fn persist(
        &self,
        store: &Store,
        session: &str,
        changed: &[DomainState],
        carry: Option<(i64, &[String])>,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        for state in changed {
            let row = SessionDomainState {
                domain: state.domain.clone(),
                last_used_turn: state.last_used_turn,
                pinned: state.pinned,
                unloaded: state.unloaded,
            };
            store.session_domain_put(session, &row).await?;
            if !state.unloaded {
                store.domain_used(&state.domain, now).await?;
            }
        }
        if let Some((turn, carry)) = carry {
            store.session_carry_put(session, turn, carry).await?;
        }
        Ok(())
    }

    fn log(
        &self,
        settings: &BTreeMap<String, String>,
        selection: &Selection,
        session: Option<&str>,
        turn: i64,
        message: &str,
    ) {
        tracing::info!("{}", selection.summary_line());
        if let Some(logging) = decision_log::decision_logging(settings) {
            self.decisions.record(decision_log::row(
                selection,
                session,
                turn,
                message,
                logging,
                now_ms(),
            ));
        }
    }
}

/// Learned entries with vectors past which a dense selection's scan of them takes
/// milliseconds (2026-11-27: about 9 ms at 20,000 in a debug build): enough to move
/// off the runtime's worker for it.
const HEAVY_LEARNED_VECTORS: usize = 2_000;

/// What a turn routes with besides the session's view: [`RouteInput`] but the view,
/// which changes within a turn (a meta-tool, a replica's turn in between).
struct Pass<'a> {
    router: &'a Router,
    settings: &'a BTreeMap<String, String>,
    message: &'a str,
    token_budget: Option<usize>,
    learned: Option<&'a LearnedIndex>,
    vectors: Option<&'a MessageVectors>,
}

impl Pass<'_> {
    /// The router's pass over `view`. No encoder runs here (the vectors came
    /// before), so it stays on the runtime's worker, unless it scans a large learned
    /// memory densely.
    fn select(&self, view: &SessionView) -> Selection {
        let started = std::time::Instant::now();
        let dense = self.vectors.is_some_and(MessageVectors::is_dense);
        let run = || {
            self.router.select(&RouteInput {
                message: self.message,
                settings: self.settings,
                session: view,
                token_budget: self.token_budget,
                learned: self.learned,
                vectors: self.vectors,
            })
        };
        let heavy = |l: &LearnedIndex| l.n_vectors() > HEAVY_LEARNED_VECTORS;
        let selection = if dense && self.learned.is_some_and(heavy) {
            off_worker(run)
        } else {
            run()
        };
        crate::metrics::record_route(dense, started.elapsed());
        selection
    }
}

/// Routes the view as `turn`, with what the last turn `carried` over; the selection
/// and what it carries into the next turn.
fn select_turn(
    pass: &Pass<'_>,
    view: &mut SessionView,
    turn: i64,
    carried: Vec<String>,
) -> (Arc<Selection>, Vec<String>) {
    view.begin_turn(turn, None);
    view.carried_tools = carried;
    let selection = Arc::new(pass.select(view));
    let carry = view.carry_into_next(&selection);
    (selection, carry)
}

/// The setting that bounds a message's wait for the encoder, in milliseconds.
pub const DENSE_WAIT_SETTING: &str = "router_dense_wait_ms";

/// The default of [`DENSE_WAIT_SETTING`]: about three forward passes of the built-in
/// encoder on a loaded core.
const DEFAULT_DENSE_WAIT: Duration = Duration::from_millis(50);

/// How long a message may wait for the encoder ([`DENSE_WAIT_SETTING`]).
pub fn dense_wait(settings: &BTreeMap<String, String>) -> Duration {
    settings
        .get(DENSE_WAIT_SETTING)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_DENSE_WAIT, Duration::from_millis)
}

/// The vectors `router`'s dense stage needs for `text` (a message, or a
/// `search_tools` query), from the process's encoder of its model; `None` without a
/// dense stage. When the encoder's queue would hold the text longer than
/// [`dense_wait`], or the encoder fails, the vectors say why, the selection routes
/// lexically, and `/metrics` counts it.
pub async fn message_vectors(
    router: &Router,
    settings: &BTreeMap<String, String>,
    text: &str,
) -> Option<MessageVectors> {
    let dense = router.dense()?;
    // A blank query has nothing to embed (and the encoder refuses it).
    if text.trim().is_empty() {
        return None;
    }
    let Some(encoder) = loadout_embed::encoder_for(dense.model_id()) else {
        crate::metrics::record_dense_skipped("encoder_failed");
        return Some(MessageVectors::skipped(format!(
            "no encoder of {} in this process",
            dense.model_id()
        )));
    };
    let vectors = encoder
        .message_vectors_within(text, dense_wait(settings))
        .await;
    match vectors.skip_reason() {
        None => {}
        Some(loadout_embed::ENCODER_BUSY) => {
            if let Some(fallback) = fallback_vectors(router, settings, text).await {
                crate::metrics::record_dense_fallback();
                return Some(fallback);
            }
            crate::metrics::record_dense_skipped("encoder_busy");
        }
        Some(_) => crate::metrics::record_dense_skipped("encoder_failed"),
    }
    Some(vectors)
}

/// The fallback encoder's vectors for `text` (`router_dense_fallback = static`), when
/// the router has its tool vectors and it is not busy itself.
async fn fallback_vectors(
    router: &Router,
    settings: &BTreeMap<String, String>,
    text: &str,
) -> Option<MessageVectors> {
    let model_id = router.dense_fallback()?.model_id();
    let encoder = loadout_embed::encoder_for(model_id)?;
    let vectors = encoder
        .message_vectors_within(text, dense_wait(settings))
        .await;
    // The encoder's vectors name its model, the fallback index's.
    vectors
        .is_dense()
        .then(|| vectors.as_fallback(loadout_embed::ENCODER_BUSY))
}

/// Runs slow, blocking `f` so that the runtime worker it is called on is not held
/// up: on a worker of a multi-threaded runtime, the worker's other tasks move to
/// another thread until `f` returns. Anywhere else (a blocking thread, a
/// current-thread runtime, no runtime) `f` just runs.
pub fn off_worker<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    use loadout_embed::{Embedder, EncoderOptions};
    use loadout_router::{DenseIndex, RouterConfig};

    use super::*;

    /// Says when it is asked, then holds the caller until released (or 10 s pass,
    /// which fails the test instead of hanging it).
    struct Gate {
        entered: Mutex<mpsc::Sender<()>>,
        release: Mutex<mpsc::Receiver<()>>,
        released: AtomicBool,
    }

    impl Embedder for Gate {
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
            let _ = self.entered.lock().map(|entered| entered.send(()));
            let released = self
                .release
                .lock()
                .map_err(|_| "poisoned".to_owned())?
                .recv_timeout(Duration::from_secs(10))
                .is_ok();
            self.released.store(released, Ordering::SeqCst);
            Ok(vec![vec![1.0, 0.0]; texts.len()])
        }
        fn model_id(&self) -> &str {
            "gate"
        }
    }

    /// With one runtime worker, a task spawned while the encoder runs still runs:
    /// the encoder is not on the worker. Run inline, the probe could only start
    /// after the embedder gave up waiting for it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_dense_selection_leaves_the_runtime_free() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open_dir(dir.path()).await.expect("store");
        let registry = Arc::new(loadout_domains::registry().expect("registry"));
        let router = Router::new(registry, RouterConfig::default());
        let (entered, entered_rx) = mpsc::channel();
        let (release, release_rx) = mpsc::channel();
        let gate = Arc::new(Gate {
            entered: Mutex::new(entered),
            release: Mutex::new(release_rx),
            released: AtomicBool::new(false),
        });
        let rows = vec![vec![0.0, 1.0]; router.dense_texts().len()];
        loadout_embed::install_encoder(gate.clone()).expect("encoder");
        assert!(router.attach_dense(DenseIndex::new("gate", rows)).is_ok());
        let routing = Routing::new(Arc::new(router), store.clone());
        // The gate holds the encoder as long as the test needs: no bound applies.
        let settings = Arc::new(BTreeMap::from([(
            DENSE_WAIT_SETTING.to_owned(),
            "60000".to_owned(),
        )]));

        let route = tokio::spawn({
            let routing = routing.clone();
            async move {
                let request = TurnRequest {
                    session: None,
                    message: "what's it like outside",
                    called: &[],
                    token_budget: None,
                };
                routing
                    .route(&store, settings, request)
                    .await
                    .map(|routed| routed.selection)
            }
        });
        // This thread is not the runtime's worker: waiting here blocks nothing.
        entered_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the dense stage ran");
        let probe = tokio::spawn(async move { release.send(()).is_ok() });
        assert!(probe.await.expect("probe"));
        let selection = route.await.expect("route task").expect("routed");
        assert!(selection.n_tools > 0);
        assert!(selection.notes.is_empty(), "{:?}", selection.notes);
        assert!(
            gate.released.load(Ordering::SeqCst),
            "the probe only ran after the encoder gave up: the selection held the worker"
        );
    }

    /// Sleeps `.0` per text; named `.1`.
    struct Named(Duration, &'static str);

    impl Embedder for Named {
        fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, String> {
            std::thread::sleep(self.0 * texts.len() as u32);
            Ok(vec![vec![1.0, 0.0]; texts.len()])
        }
        fn model_id(&self) -> &str {
            self.1
        }
        fn max_batch(&self) -> usize {
            1
        }
    }

    /// A bound of 30 ms on a message's wait for the encoder.
    fn short_wait() -> Arc<BTreeMap<String, String>> {
        Arc::new(BTreeMap::from([(
            DENSE_WAIT_SETTING.to_owned(),
            "30".to_owned(),
        )]))
    }

    fn request(message: &str) -> TurnRequest<'_> {
        TurnRequest {
            session: None,
            message,
            called: &[],
            token_budget: None,
        }
    }

    /// Routing over the domains' registry whose dense stage's encoder, `model`, takes
    /// 80 ms a text; with `fallback`, an instant encoder of that name and its tool
    /// vectors as the fallback. Its first message has taught the encoder its cost,
    /// and the process's metrics recorder is installed.
    async fn routing_with_a_slow_encoder(
        model: &'static str,
        fallback: Option<&'static str>,
    ) -> (
        tempfile::TempDir,
        Store,
        Routing,
        Arc<loadout_embed::MessageEncoder>,
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open_dir(dir.path()).await.expect("store");
        let registry = Arc::new(loadout_domains::registry().expect("registry"));
        let router = Router::new(registry, RouterConfig::default());
        let rows = vec![vec![0.0, 1.0]; router.dense_texts().len()];
        let slow = Named(Duration::from_millis(80), model);
        let encoder = loadout_embed::install_encoder(Arc::new(slow)).expect("encoder");
        assert!(
            router
                .attach_dense(DenseIndex::new(model, rows.clone()))
                .is_ok()
        );
        if let Some(fallback) = fallback {
            let instant = Named(Duration::ZERO, fallback);
            loadout_embed::install_encoder(Arc::new(instant)).expect("fallback encoder");
            assert!(
                router
                    .attach_dense_fallback(DenseIndex::new(fallback, rows))
                    .is_ok()
            );
        }
        let routing = Routing::new(Arc::new(router), store.clone());
        // The process's recorder, installed before anything is counted.
        assert!(crate::metrics::render().is_some());
        let first = routing
            .route(&store, short_wait(), request("remember my locker code"))
            .await
            .expect("routed");
        assert!(
            first.selection.notes.is_empty(),
            "{:?}",
            first.selection.notes
        );
        (dir, store, routing, encoder)
    }

    /// Queues several passes of the encoder per worker and waits until a message
    /// would wait past the 30 ms bound; the backlog's threads.
    async fn fill_the_queue(
        encoder: &Arc<loadout_embed::MessageEncoder>,
    ) -> Vec<std::thread::JoinHandle<Result<Vec<Vec<f32>>, loadout_embed::EncodeError>>> {
        let workers = EncoderOptions::for_embedder(encoder.embedder().as_ref()).workers;
        let backlog = (0..3 * workers)
            .map(|i| {
                let encoder = encoder.clone();
                std::thread::spawn(move || encoder.encode(&[&format!("backlog {i}")]))
            })
            .collect();
        while encoder.estimated_wait() <= Some(Duration::from_millis(60)) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        backlog
    }

    /// Degrade, don't queue: with the encoder's queue longer than the bound, a
    /// message is routed lexically at once, its notes say why, `/metrics` counts it;
    /// once the queue drains the next message is dense again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_message_is_routed_lexically_when_the_encoder_is_busy() {
        let (_dir, store, routing, encoder) =
            routing_with_a_slow_encoder("slow-routing", None).await;
        let backlog = fill_the_queue(&encoder).await;
        let busy = routing
            .route(&store, short_wait(), request("remember where I parked"))
            .await
            .expect("routed");
        assert!(
            busy.selection
                .notes
                .iter()
                .any(|n| n.contains("dense skipped: encoder busy")),
            "{:?}",
            busy.selection.notes
        );
        counted("loadout_dense_skipped_total{reason=\"encoder_busy\"}");
        for thread in backlog {
            assert!(thread.join().expect("thread").is_ok());
        }
        let after = routing
            .route(&store, short_wait(), request("remember where I parked"))
            .await
            .expect("routed");
        assert!(
            after.selection.notes.is_empty(),
            "{:?}",
            after.selection.notes
        );
    }

    /// Asserts that `/metrics` has a nonzero line starting with `series`.
    fn counted(series: &str) {
        let metrics = crate::metrics::render().unwrap_or_default();
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with(series) && !l.ends_with(" 0")),
            "{series} not counted: {metrics}"
        );
    }

    /// `router_dense_fallback = static`: with the encoder's queue past the bound, a
    /// message is routed densely with the fallback encoder's vectors, its notes say
    /// so and `/metrics` counts it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_message_the_encoder_is_too_busy_for_is_routed_with_the_fallback() {
        let (_dir, store, routing, encoder) =
            routing_with_a_slow_encoder("slow-with-fallback", Some("fast-fallback-table")).await;
        let backlog = fill_the_queue(&encoder).await;
        let busy = routing
            .route(&store, short_wait(), request("remember where I parked"))
            .await
            .expect("routed");
        assert!(
            busy.selection
                .notes
                .iter()
                .any(|n| n.contains("fallback encoder fast-fallback-table: encoder busy")),
            "{:?}",
            busy.selection.notes
        );
        counted("loadout_dense_fallback_total");
        for thread in backlog {
            assert!(thread.join().expect("thread").is_ok());
        }
    }

    /// A replaced router serves the turns that start after it; a turn in flight keeps
    /// the one it was routed with (its meta-tools and calls resolve names there).
    #[tokio::test]
    async fn a_turn_keeps_its_router_and_the_next_turn_takes_the_new_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open_dir(dir.path()).await.expect("store");
        let registry = Arc::new(loadout_domains::registry().expect("registry"));
        let first = Arc::new(Router::new(registry.clone(), RouterConfig::default()));
        let routing = Routing::new(first.clone(), store.clone());
        let request = TurnRequest {
            session: Some("swap"),
            message: "remember that my parrot is called Polly",
            called: &[],
            token_budget: None,
        };
        let settings = Arc::new(BTreeMap::new());
        let before = routing
            .route(&store, settings.clone(), request)
            .await
            .expect("routed");
        assert!(Arc::ptr_eq(&before.router, &first));

        let second = Arc::new(Router::new(registry, RouterConfig::default()));
        routing.replace_router(second.clone());
        assert!(Arc::ptr_eq(&routing.router(), &second));
        let after = routing
            .route(&store, settings, request)
            .await
            .expect("routed");
        assert!(Arc::ptr_eq(&after.router, &second));
        assert_eq!(after.turn, before.turn + 1);
        assert!(Arc::ptr_eq(&before.router, &first));
    }
}

//! What every entry point opens: the registry of linked domains, the store, the
//! settings cache.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::Context as _;
use loadout::{Registry, Settings, ToolContext};
use loadout_router::Router;
use loadout_store::Store;

use crate::config::{CONFIG_FILE, ConfigFile, Reloaded};
use crate::routing::Routing;

#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub database_url: Option<String>,
    /// The config file; `None`: `loadout.toml` in the data dir, if it exists.
    pub config_file: Option<PathBuf>,
}

impl Config {
    /// The data dir's store and config file.
    pub fn in_data_dir(data_dir: impl Into<PathBuf>) -> Config {
        Config {
            data_dir: data_dir.into(),
            database_url: None,
            config_file: None,
        }
    }
}

/// `~/.loadout`, or `./.loadout` when no home directory is known.
pub fn default_data_dir() -> PathBuf {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
        .join(".loadout")
}

/// The process-wide state shared by every command and server.
#[derive(Clone, Debug)]
pub struct App {
    pub registry: Arc<Registry>,
    pub store: Store,
    /// The settings of `store`, through one cache.
    pub settings: Settings,
    /// `loadout.toml`: the router's tunables and the upstream MCP servers, as
    /// read at start or at the last reload; shared by the app's copies, and
    /// watched by the MCP server, which connects the `[servers]` it lists.
    config: Arc<tokio::sync::watch::Sender<Arc<ConfigFile>>>,
    /// Built on first use: the router counts every tool's tokens and the decision
    /// writer needs a runtime, which commands that never route (`settings`,
    /// `audit`, `loadout mcp`) should not pay for.
    routing: Arc<OnceLock<Routing>>,
    /// Held while a router replaces the one routing: a reload and an upstream
    /// server's new tool list each build from what the other left, in turn.
    replacing: Arc<tokio::sync::Mutex<()>>,
    /// The clients' rate limiters, one budget per client across `/api` and `/mcp`.
    pub rate_limits: crate::clients::RateLimits,
}

/// The background build of the dense stage (see [`loadout_embed::spawn_dense_stage`]).
pub type DenseStageBuild = std::thread::JoinHandle<Result<loadout_embed::DenseBuildStats, String>>;

impl App {
    pub async fn open(config: &Config) -> anyhow::Result<App> {
        // The config file first: a typo in it should not wait on the database.
        let file = match &config.config_file {
            Some(path) => ConfigFile::load(path, true)?,
            None => ConfigFile::load(&config.data_dir.join(CONFIG_FILE), false)?,
        }
        .with_weights_from(&config.data_dir)?;
        let registry = loadout_domains::registry().context("building the tool registry")?;
        warn_unknown_pins(&file, &registry);
        let store = open_store(config.database_url.as_deref(), &config.data_dir).await?;
        Ok(App::with_registry(Arc::new(registry), store).with_config(file))
    }

    /// An app over a given registry (toolkits added, upstream domains, tests), with
    /// the defaults of an absent config file.
    pub fn with_registry(registry: Arc<Registry>, store: Store) -> App {
        let config = ConfigFile::defaults(store.data_dir().join(CONFIG_FILE));
        App {
            registry,
            settings: Settings::new(store.clone()),
            store,
            config: Arc::new(tokio::sync::watch::Sender::new(Arc::new(config))),
            routing: Arc::new(OnceLock::new()),
            replacing: Arc::new(tokio::sync::Mutex::new(())),
            rate_limits: Default::default(),
        }
    }

    /// The same app over another registry: the config and store stay, and the
    /// router is built again on first use.
    pub fn with_other_registry(&self, registry: Arc<Registry>) -> App {
        App {
            registry,
            store: self.store.clone(),
            settings: self.settings.clone(),
            config: self.config.clone(),
            routing: Arc::new(OnceLock::new()),
            replacing: self.replacing.clone(),
            rate_limits: self.rate_limits.clone(),
        }
    }

    /// Takes a loaded config file. Call before anything routes.
    pub fn with_config(mut self, config: ConfigFile) -> App {
        self.config = Arc::new(tokio::sync::watch::Sender::new(Arc::new(config)));
        self
    }

    /// The config file in force.
    pub fn config(&self) -> Arc<ConfigFile> {
        self.config.borrow().clone()
    }

    /// The config file in force from now on, at each reload.
    pub fn config_changes(&self) -> tokio::sync::watch::Receiver<Arc<ConfigFile>> {
        self.config.subscribe()
    }

    /// A router over `registry` with the config file's tunables: every entry point
    /// builds its routers here, so `[router]` applies to chat, `/api/route`,
    /// `loadout route` and MCP's `search_tools` alike.
    pub fn new_router(&self, registry: Arc<Registry>) -> Router {
        self.config().router(registry)
    }

    /// Reads the config file again. A file with problems changes nothing. New
    /// `[router]` tunables replace the router (if this app routes: turns that start
    /// from now on use the new one) and reach MCP's `search_tools` at its next call.
    /// A changed `[servers]` reaches the MCP server, which connects and stops
    /// upstream servers to match (see [`crate::mcp::McpServer::start`]); their tools
    /// reach the router as an upstream's new tool list does.
    pub async fn reload_config(&self) -> anyhow::Result<Reloaded> {
        let _replacing = self.replacing.lock().await;
        let old = self.config();
        let new = Arc::new(old.reload()?);
        let servers_changed = new.servers != old.servers;
        let reloaded = Reloaded {
            router_changes: old.router_changes(&new),
            servers_changed,
        };
        warn_unknown_pins(&new, &self.registry);
        // Built before anything changes, so that a failed build leaves the old
        // config and router in force, as the error says.
        let rebuilt = match self.routing.get() {
            Some(routing) if !reloaded.router_changes.is_empty() => {
                let registry = routing.router().registry().clone();
                Some((routing, build_router(registry, new.clone()).await?))
            }
            _ => None,
        };
        self.config.send_replace(new);
        if let Some((routing, router)) = rebuilt {
            self.install(routing, router).await;
        }
        Ok(reloaded)
    }

    /// Routes the turns that start from now on with a router over `registry` (an
    /// upstream server's tools changed) and the config in force.
    pub async fn replace_router(&self, registry: Arc<Registry>) -> anyhow::Result<Arc<Router>> {
        let _replacing = self.replacing.lock().await;
        let router = build_router(registry, self.config()).await?;
        self.install(self.routing(), router.clone()).await;
        Ok(router)
    }

    async fn install(&self, routing: &Routing, router: Arc<Router>) {
        routing.replace_router(router.clone());
        // The dense stage's vectors of new tool texts follow in the background, as
        // at start; until then the new router routes lexical-only and says so.
        self.attach_dense_stage_to(router).await;
    }

    /// The router and its decision log, built on first use. Call from inside the
    /// tokio runtime (the decision writer is a task).
    pub fn routing(&self) -> &Routing {
        self.routing.get_or_init(|| {
            let router = Arc::new(self.new_router(self.registry.clone()));
            Routing::new(router, self.store.clone())
        })
    }

    /// Flushes the decision log if anything was routed.
    pub async fn shutdown_routing(&self) {
        if let Some(routing) = self.routing.get() {
            // What was learned goes to the store first, then the log is flushed.
            let _ =
                tokio::time::timeout(std::time::Duration::from_secs(5), routing.learner.flush())
                    .await;
            routing.decisions.shutdown().await;
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Starts the dense (semantic) stage in the background: an OpenAI-compatible
    /// `/v1/embeddings` endpoint when `embeddings_base_url` is set, else the built-in
    /// offline encoder. Tool vectors come from the cache in the data dir; until they
    /// are ready the router runs lexical-only and says so in its notes. Only servers
    /// that route call this (`loadout mcp` never loads the model).
    pub async fn attach_dense_stage(&self) -> Option<DenseStageBuild> {
        self.attach_dense_stage_to(self.routing().router()).await
    }

    /// Like [`App::attach_dense_stage`], for another router over this app's settings
    /// and data dir (the MCP server's `search_tools` ranks with one of its own).
    pub async fn attach_dense_stage_to(&self, router: Arc<Router>) -> Option<DenseStageBuild> {
        let settings = match self.settings.snapshot().await {
            Ok(settings) => settings,
            Err(e) => {
                tracing::warn!("dense stage not started: {e}");
                return None;
            }
        };
        // `router_dense = off` keeps routing lexical-only (microseconds per message
        // instead of milliseconds) for deployments that need throughput over recall.
        if settings.get("router_dense").is_some_and(|v| v == "off") {
            tracing::info!("[router] dense stage off (router_dense = off)");
            return None;
        }
        // `static`: the table distilled from the built-in encoder (minutes, once per
        // data dir; lexical until then), microseconds per message.
        let distilled = settings.get("router_dense").is_some_and(|v| v == "static");
        let http = loadout_embed::http::HttpEmbedder::from_settings(&settings);
        // `router_e5_model = FILE`: e5 joins the built-in encoder (not an endpoint's
        // or the table's, whose weights were fitted alone).
        let e5 = settings
            .get("router_e5_model")
            .filter(|_| http.is_none() && !distilled)
            .map(std::path::PathBuf::from);
        if e5.is_none() && settings.contains_key("router_e5_model") {
            tracing::warn!(
                "[router] router_e5_model ignored: it joins the built-in encoder, and the \
                 dense stage is an endpoint's or the static table's"
            );
        }
        let joined = e5.is_some();
        let cache_dir = self.store().data_dir().join("vectors");
        let table_dir = cache_dir.clone();
        let fallback_router = router.clone();
        let build = loadout_embed::spawn_dense_stage(
            router,
            move || match http {
                _ if distilled => loadout_embed::builtin_static(Some(&table_dir)),
                Some(Ok(embedder)) => Ok(Arc::new(embedder) as Arc<dyn loadout_embed::Embedder>),
                Some(Err(e)) => Err(e),
                // The weights and the message cache of a router built earlier serve
                // this one too.
                None => match e5 {
                    // A file that is no model costs the second encoder, not the
                    // dense stage.
                    Some(file) => {
                        let builtin = loadout_embed::shared_builtin()?;
                        match loadout_embed::e5_encoder(&file) {
                            Ok(e5) => Ok(Arc::new(loadout_embed::Joined::new(builtin, e5)?)
                                as Arc<dyn loadout_embed::Embedder>),
                            Err(e) => {
                                tracing::warn!(
                                    "[router] router_e5_model: {e}; the built-in encoder alone"
                                );
                                Ok(builtin)
                            }
                        }
                    }
                    None => loadout_embed::shared_builtin(),
                },
            },
            Some(cache_dir.clone()),
        );
        // A joined stage falls back to its built-in encoder alone: what e5 is too
        // busy for is routed with the built-in's vectors and the dense model.
        if joined {
            loadout_embed::spawn_dense_fallback(
                fallback_router,
                loadout_embed::shared_builtin,
                Some(cache_dir),
            );
            return Some(build);
        }
        // `router_dense_fallback = static`: what the encoder is too busy for is routed
        // with the static table's vectors rather than lexically.
        let fallback = settings
            .get("router_dense_fallback")
            .is_some_and(|v| v == "static");
        if fallback && !distilled {
            let dir = cache_dir.clone();
            loadout_embed::spawn_dense_fallback(
                fallback_router,
                move || loadout_embed::builtin_static(Some(&dir)),
                Some(cache_dir),
            );
        }
        Some(build)
    }

    /// Waits until the dense stage [`App::attach_dense_stage`] started is attached
    /// (or has failed, leaving routing lexical-only, as its warning says).
    pub async fn wait_for_dense_stage(&self) {
        let Some(build) = self.attach_dense_stage().await else {
            return;
        };
        let _ = tokio::task::spawn_blocking(move || build.join()).await;
    }

    pub fn context(&self) -> ToolContext {
        ToolContext::new(self.registry.clone(), self.settings.clone())
    }
}

/// Indexes and token counts take a tenth of a second or more: built off the runtime.
async fn build_router(
    registry: Arc<Registry>,
    file: Arc<ConfigFile>,
) -> anyhow::Result<Arc<Router>> {
    let router = tokio::task::spawn_blocking(move || file.router(registry))
        .await
        .context("building the router")?;
    Ok(Arc::new(router))
}

/// A `pin_on_tools` name no tool has is most likely a typo. Only a warning: an
/// upstream server's tools (`<server>__<tool>`) are listed after start.
fn warn_unknown_pins(config: &ConfigFile, registry: &Registry) {
    for name in &config.router.pin_on_tools {
        if registry.tool(name).is_none() && !name.contains("__") {
            tracing::warn!(
                "{}: router.pin_on_tools names `{name}`, which no tool has",
                config.path.display()
            );
        }
    }
}

async fn open_store(url: Option<&str>, data_dir: &Path) -> anyhow::Result<Store> {
    Store::connect(url, data_dir)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// `registry` plus the toolkit files of `dir`. A toolkit domain or tool whose name a
/// linked domain already uses is skipped (the linked one has a real backend).
pub fn with_toolkits(registry: &Registry, dir: &Path) -> anyhow::Result<Arc<Registry>> {
    let toolkits = loadout::toolkit::load_dir(dir)
        .with_context(|| format!("loading toolkits from {}", dir.display()))?;
    let mut domains = registry.domains().to_vec();
    let mut tools = registry.all_tools().to_vec();
    let mut n_skipped = 0;
    for toolkit in toolkits {
        if registry.domain(&toolkit.domain.name).is_some() {
            n_skipped += 1;
            continue;
        }
        tools.extend(
            toolkit
                .tools
                .into_iter()
                .filter(|t| registry.tool(&t.name).is_none()),
        );
        domains.push(toolkit.domain);
    }
    if n_skipped > 0 {
        tracing::info!("{n_skipped} toolkit domains skipped: linked domains of the same name");
    }
    Registry::from_parts(domains, tools)
        .map(Arc::new)
        .with_context(|| format!("loading toolkits from {}", dir.display()))
}

/// How long the work after the listener closed (writing queued log rows, stopping
/// upstream servers) may take before the process exits anyway.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads the config file again on every `SIGHUP` for as long as the process runs,
/// and says on stderr what changed or why the file was refused (like the start-up
/// lines, whatever `LOADOUT_LOG` filters: the operator who sent the signal wants
/// the answer). Outside Unix, never returns.
pub async fn reload_on_hangup(app: App) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(hangups) => hangups,
            Err(e) => {
                tracing::warn!("config reload on SIGHUP unavailable: {e}");
                return;
            }
        };
        while hangups.recv().await.is_some() {
            let path = app.config().path.display().to_string();
            match app.reload_config().await {
                Ok(reloaded) => {
                    if reloaded.router_changes.is_empty() {
                        eprintln!("loadout: {path} reloaded: [router] unchanged");
                    } else {
                        eprintln!(
                            "loadout: {path} reloaded: {}",
                            reloaded.router_changes.join(", ")
                        );
                    }
                    if reloaded.servers_changed {
                        eprintln!("loadout: {path}: [servers] changed; reconnecting");
                    }
                }
                Err(e) => eprintln!(
                    "loadout: config not reloaded, the previous one stays in force: {e:#}"
                ),
            }
        }
    }
    #[cfg(not(unix))]
    std::future::pending::<()>().await;
}

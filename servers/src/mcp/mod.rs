//! `loadout mcp`: every registered tool over MCP (stdio or streamable HTTP).
//!
//! The tools are the registry's (plus the tools of upstream MCP servers from
//! `loadout.toml`); what a connection lists is its endpoint's view ([`view`]): every
//! tool, or with `--dynamic` / `--max-tools` a constant few plus `search_tools` and
//! `call_tool`, which reach the rest. Calls go through the registry, and every call
//! is written to the audit log before its answer goes out. [`http_router`] is the
//! same server as an axum router, for the chat server to mount at `/mcp`.

mod auth;
mod catalog;
mod handler;
mod http;
mod jsonrpc;
mod meta;
mod results;
mod sessions;
mod stdio;
pub mod upstream;
mod view;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use loadout::Registry;
use rmcp::ServiceExt;
use tokio::sync::{mpsc, watch};

pub use auth::{AllowedHosts, BearerToken, HostArgs, require_allowed_host, require_bearer};
use catalog::Catalog;
pub use handler::McpHandler;
use handler::Shared;
pub use http::{content_length, http_router};
pub use sessions::{SessionArgs, SessionLedger};
use upstream::Upstreams;
pub use view::View;

use crate::app::App;
use crate::log_writer::AuditWriter;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Serve streamable HTTP on this address (path `/mcp`) instead of stdio. Any
    /// address but loopback needs a bearer token: `LOADOUT_TOKEN`, or one is
    /// generated and printed once.
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// List only core, `search_tools` and `call_tool`, whatever the number of tools:
    /// the other tools are found with `search_tools` and run with `call_tool` (the
    /// list never changes, so clients that never re-list reach every tool).
    #[arg(long)]
    dynamic: bool,
    /// Never list more than N tools (clients cap their tools: Cursor uses 40,
    /// Windsurf 50, VS Code 128). When all fit, all are listed; else core,
    /// `search_tools`, `call_tool` and the domains used in the last 24 hours.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(2..))]
    max_tools: Option<u16>,
    /// Serve only core and these domains (`memory,calendar`). Over HTTP, any set is
    /// also served at `/mcp/domains/<a,b>`.
    #[arg(long, value_name = "A,B")]
    domains: Option<String>,
    /// Also serve the toolkit files (`*.json`) of this directory; their tools are
    /// listed and answer "no backend" when called.
    #[arg(long, value_name = "DIR")]
    catalog: Option<PathBuf>,
    #[command(flatten)]
    hosts: HostArgs,
    #[command(flatten)]
    sessions: SessionArgs,
}

/// How the MCP server is set up, whatever the transport.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// What `/mcp` and stdio list (`/mcp/domains/a,b` narrows its domains).
    pub view: View,
    /// A directory of toolkit files to add to the registry.
    pub catalog: Option<PathBuf>,
}

type ShutdownCallback = Box<dyn FnOnce() + Send>;

/// The MCP server's shared state: catalog, audit writer, upstream connections.
/// Cheap to clone; each connection gets its own [`McpHandler`].
#[derive(Clone)]
pub struct McpServer {
    shared: Arc<Shared>,
    view: Arc<View>,
    upstreams: Arc<Upstreams>,
    /// Run at shutdown (e.g. closing the HTTP service's open streams).
    on_shutdown: Arc<Mutex<Vec<ShutdownCallback>>>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("catalog", &*self.shared.catalog())
            .field("upstreams", &self.upstreams)
            .finish()
    }
}

impl McpServer {
    /// Builds the catalog and connects the upstream servers (waiting for each one's
    /// first connection, so that the first tools/list has their tools).
    pub async fn start(
        app: App,
        audit: AuditWriter,
        options: Options,
    ) -> anyhow::Result<McpServer> {
        // The upstream servers of the app's config file.
        let config = app.config();
        let (changed_tx, changed_rx) = mpsc::unbounded_channel();
        let upstreams = Upstreams::start(&config.path, config.servers.clone(), changed_tx).await;
        let base = match &options.catalog {
            Some(dir) => crate::app::with_toolkits(&app.registry, dir)?,
            None => app.registry.clone(),
        };
        let registry = with_upstreams(&base, &upstreams).unwrap_or_else(|e| {
            eprintln!("loadout: upstream tools left out: {e}");
            base.clone()
        });
        let warm = handler::read_warm(&app).await;
        let shared = Arc::new(Shared::new(
            app,
            Arc::new(Catalog::new(registry)),
            warm,
            audit,
        ));
        let upstreams = Arc::new(upstreams);
        tokio::spawn(rebuild_on_change(
            Arc::downgrade(&shared),
            base,
            upstreams.clone(),
            changed_rx,
        ));
        tokio::spawn(follow_servers_config(
            Arc::downgrade(&shared),
            upstreams.clone(),
            shared.app.config_changes(),
        ));
        Ok(McpServer {
            shared,
            view: Arc::new(options.view),
            upstreams,
            on_shutdown: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// The registry calls go to now: the linked domains plus the upstream servers'
    /// (and toolkit) domains. Changes when an upstream's tool list does.
    pub fn registry(&self) -> Arc<Registry> {
        self.shared.catalog().registry.clone()
    }

    /// The changes of [`McpServer::registry`] from now on (an upstream server's tool
    /// list changed), one [`RegistryChanges::next`] at a time.
    pub fn registry_changes(&self) -> RegistryChanges {
        RegistryChanges {
            catalog: self.shared.catalog.subscribe(),
        }
    }

    /// Each configured upstream server's name, and whether it is connected now.
    pub fn upstream_health(&self) -> Vec<(String, bool)> {
        self.upstreams
            .servers()
            .iter()
            .map(|server| (server.name().to_owned(), server.is_connected()))
            .collect()
    }

    /// A handler for one connection to the server's view.
    pub fn handler(&self) -> McpHandler {
        McpHandler::new(self.shared.clone(), self.view.clone())
    }

    /// Refuses a view naming a domain the server does not have (after the upstream
    /// servers connected: their domains count).
    pub fn check_view(&self) -> anyhow::Result<()> {
        if let Some(domains) = &self.view.domains
            && let Some((_, message)) =
                view::unknown_domains(&self.shared.catalog().registry, domains)
        {
            anyhow::bail!("--domains: {message}");
        }
        Ok(())
    }

    /// Stops the upstream servers, closes open HTTP streams and writes what was
    /// learned.
    pub async fn shutdown(&self) {
        let callbacks = std::mem::take(
            &mut *self
                .on_shutdown
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for callback in callbacks {
            callback();
        }
        self.shared.flush_learning().await;
        self.upstreams.shutdown().await;
    }
}

/// See [`McpServer::registry_changes`].
pub struct RegistryChanges {
    catalog: watch::Receiver<Arc<Catalog>>,
}

impl RegistryChanges {
    /// Waits for the next change and returns the registry as it is then (changes made
    /// in between are folded into it); `None` once the MCP server is gone.
    pub async fn next(&mut self) -> Option<Arc<Registry>> {
        self.catalog.changed().await.ok()?;
        Some(self.catalog.borrow_and_update().registry.clone())
    }
}

/// The registry plus the toolkit files of a directory. A toolkit domain or tool whose
/// name a linked domain already uses is left out (the linked one is the real one).
/// The base registry plus every upstream server's domain as it is now.
/// `base` with the tools of the config file's upstream servers, connected (each
/// waited for up to its connect timeout): what `loadout serve` routes, for the
/// commands that route and exit (`route`, `replay`). A server that does not connect
/// is reported on stderr and left out. Shut the connections down when done.
pub async fn connect_upstream_tools(app: &App, base: Arc<Registry>) -> (Arc<Registry>, Upstreams) {
    let config = app.config();
    if config.servers.is_empty() {
        return (base, Upstreams::none());
    }
    // A command that routes once takes the first tool lists; later changes go nowhere.
    let (changed, _) = mpsc::unbounded_channel();
    let upstreams = Upstreams::start(&config.path, config.servers.clone(), changed).await;
    let registry = with_upstreams(&base, &upstreams).unwrap_or_else(|e| {
        eprintln!("loadout: upstream tools left out: {e}");
        base
    });
    (registry, upstreams)
}

fn with_upstreams(base: &Arc<Registry>, upstreams: &Upstreams) -> anyhow::Result<Arc<Registry>> {
    if upstreams.is_empty() {
        return Ok(base.clone());
    }
    let mut domains = base.domains().to_vec();
    let mut tools = base.all_tools().to_vec();
    for server in upstreams.servers() {
        let (domain, domain_tools) = server.domain();
        domains.push(domain);
        tools.extend(domain_tools);
    }
    Ok(Arc::new(Registry::from_parts(domains, tools)?))
}

/// Connects and stops upstream servers as the config file's `[servers]` changes
/// (a reload), for as long as the MCP server lives; the catalog follows through
/// [`rebuild_on_change`].
async fn follow_servers_config(
    shared: std::sync::Weak<Shared>,
    upstreams: Arc<Upstreams>,
    mut configs: watch::Receiver<Arc<crate::config::ConfigFile>>,
) {
    let mut applied = configs.borrow_and_update().servers.clone();
    while configs.changed().await.is_ok() {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        strong.refresh_warm().await;
        drop(strong);
        let config = configs.borrow_and_update().clone();
        if config.servers == applied {
            continue;
        }
        let done = upstreams.reconcile(&config.path, &config.servers).await;
        applied = config.servers.clone();
        let mut parts = Vec::new();
        for (what, slugs) in [
            ("added", &done.added),
            ("removed", &done.removed),
            ("restarted", &done.restarted),
        ] {
            if !slugs.is_empty() {
                parts.push(format!("{what} {}", slugs.join(", ")));
            }
        }
        if !parts.is_empty() {
            eprintln!("loadout: upstream MCP servers {}", parts.join("; "));
        }
    }
}

/// Rebuilds the catalog when an upstream server's tools change, or the set of
/// servers does; connections are told through the catalog's watch channel.
async fn rebuild_on_change(
    shared: std::sync::Weak<Shared>,
    base: Arc<Registry>,
    upstreams: Arc<Upstreams>,
    mut changed: mpsc::UnboundedReceiver<()>,
) {
    while changed.recv().await.is_some() {
        // Coalesce a burst (a reconnect lists tools right after the exit).
        tokio::time::sleep(Duration::from_millis(50)).await;
        while changed.try_recv().is_ok() {}
        let Some(shared) = shared.upgrade() else {
            return;
        };
        match with_upstreams(&base, &upstreams) {
            Ok(registry) => {
                let catalog = Arc::new(Catalog::new(registry));
                let same = {
                    let current = shared.catalog.borrow();
                    current.tools == catalog.tools
                };
                if !same {
                    shared.catalog.send_replace(catalog);
                    shared.refresh_warm().await;
                }
            }
            Err(e) => tracing::warn!("upstream tools not updated: {e}"),
        }
    }
}

pub async fn run(app: &App, args: Args) -> anyhow::Result<ExitCode> {
    let audit = AuditWriter::new(app.store().clone());
    let view = View {
        domains: args.domains.as_deref().map(view::parse_domain_set),
        dynamic: args.dynamic,
        max_tools: args.max_tools.map(usize::from),
    };
    let (hosts, sessions) = (args.hosts, args.sessions);
    let options = Options {
        view,
        catalog: args.catalog,
    };
    let server = McpServer::start(app.clone(), audit, options).await?;
    if let Err(e) = server.check_view() {
        server.shutdown().await;
        eprintln!("error: {e}");
        return Ok(ExitCode::from(2));
    }
    tokio::spawn(crate::app::reload_on_hangup(app.clone()));
    let served = match args.http {
        None => serve_stdio(&server).await,
        Some(addr) => serve_http(&server, addr, &hosts, &sessions).await,
    };
    // A stuck upstream server does not hold the exit.
    let _ = tokio::time::timeout(crate::app::SHUTDOWN_GRACE, server.shutdown()).await;
    served.map(|()| ExitCode::SUCCESS)
}

async fn serve_stdio(server: &McpServer) -> anyhow::Result<()> {
    let service = match server.handler().serve(stdio::StdioLines::start()).await {
        Ok(service) => service,
        // The client went away before initializing: nothing to serve.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(e) => return Err(anyhow::anyhow!("MCP over stdio: {e}")),
    };
    let cancel = service.cancellation_token();
    let signal = tokio::spawn(async move {
        shutdown_signal().await;
        cancel.cancel();
    });
    let quit = service.waiting().await;
    signal.abort();
    quit.map(|_| ()).context("MCP over stdio")
}

async fn serve_http(
    server: &McpServer,
    addr: SocketAddr,
    hosts: &HostArgs,
    sessions: &SessionArgs,
) -> anyhow::Result<()> {
    let token = BearerToken::for_address(addr, "loadout mcp")?;
    let hosts = AllowedHosts::for_server(token.as_ref(), hosts);
    let router = http_router(server, token, hosts, sessions);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr().context("listening address")?;
    // Tests and scripts read this line to learn the port when ADDR ends in `:0`.
    eprintln!("loadout mcp: listening on http://{local}/mcp");
    let server = server.clone();
    crate::listener::serve(
        listener,
        router,
        crate::listener::Limits::default(),
        async move {
            shutdown_signal().await;
            // Open SSE streams end here, which lets the graceful shutdown finish.
            server.shutdown().await;
        },
    )
    .await;
    Ok(())
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}

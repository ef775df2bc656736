//! One upstream server's life: connect (a child process over stdio or streamable
//! HTTP), list its tools, watch its health, reconnect with backoff.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use loadout::{Annotations, Backend, Domain, Tier, Tool, ToolError};
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RunningService, RunningServiceCancellationToken};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{Peer, RoleClient, ServiceExt};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::client::http_transport;
use super::config::{ServerConfig, tool_name};
use super::failure::{CallFailure, check_session, initialize_failure, send_call, service_failure};
use super::forwarding::{ForwardedTool, UpstreamClient, first_sentence};
use super::{CONNECT_TIMEOUT, DEFAULT_CALL_TIMEOUT, HEALTH_INTERVAL, MAX_BACKOFF, lock};

/// How an upstream is reached.
pub(super) enum Endpoint {
    Stdio,
    Http {
        url: Arc<str>,
        headers: HashMap<HeaderName, HeaderValue>,
    },
}

/// What a call waiting for a reconnection watches: a new connection, or one more
/// failed attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Status {
    pub(super) generation: u64,
    pub(super) failures: u64,
}

/// Messages to an upstream's supervisor.
#[derive(Debug)]
pub(super) enum Wake {
    /// The server said its tools changed.
    Relist,
    /// A call is waiting: connect now if not connected (cuts a backoff short).
    Connect,
    /// The connection of this generation is dead though its transport is open
    /// (an HTTP server that restarted or dropped our session): replace it.
    Reconnect(u64),
}

/// A connection to one upstream server, reconnected when it drops.
pub struct Upstream {
    pub(super) slug: String,
    pub(super) config: ServerConfig,
    pub(super) endpoint: Endpoint,
    pub(super) origin: String,
    /// The live client and its connection's generation, or `None` while
    /// (re)connecting.
    pub(super) peer: Mutex<Option<(Peer<RoleClient>, u64)>>,
    /// Bumped on every connection and every failed attempt.
    pub(super) status: watch::Sender<Status>,
    /// The running client service; dropping it stops the child process or ends
    /// the HTTP session.
    pub(super) service: tokio::sync::Mutex<Option<RunningService<RoleClient, UpstreamClient>>>,
    /// Cancels the running service while the supervisor waits on it.
    pub(super) stop: Mutex<Option<RunningServiceCancellationToken>>,
    pub(super) stopping: AtomicBool,
    /// The latest tool list, as registry tools.
    pub(super) tools: Mutex<Vec<Tool>>,
    pub(super) description: Mutex<String>,
    pub(super) last_error: Mutex<Option<String>>,
    pub(super) wake: mpsc::UnboundedSender<Wake>,
    /// Tells the owner the tool list changed.
    pub(super) changed: mpsc::UnboundedSender<()>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("server", &self.slug)
            .finish()
    }
}

impl Upstream {
    /// The server's name in `[servers]`.
    pub fn name(&self) -> &str {
        &self.slug
    }

    /// Connected now (a live session); false while (re)connecting.
    pub fn is_connected(&self) -> bool {
        lock(&self.peer).is_some()
    }

    pub fn domain_name(&self) -> String {
        format!("mcp_{}", self.slug)
    }

    pub(super) fn is_http(&self) -> bool {
        matches!(self.endpoint, Endpoint::Http { .. })
    }

    /// The domain and its tools as they are now (no tools while disconnected).
    pub fn domain(&self) -> (Domain, Vec<Tool>) {
        let tools = lock(&self.tools).clone();
        let domain = Domain {
            name: self.domain_name(),
            description: lock(&self.description).clone(),
            settings_keys: self.config.settings_keys.clone(),
            keywords: self.config.keywords.clone(),
            tier: Tier::Free,
            always_on: false,
            conflicts: Vec::new(),
            tools: Vec::new(),
            origin: self.origin.clone(),
        };
        (domain, tools)
    }

    /// One connection attempt; a failure is recorded for waiting calls.
    pub(super) async fn attempt(self: &Arc<Self>) -> anyhow::Result<()> {
        let result = self.connect().await;
        if let Err(e) = &result {
            *lock(&self.last_error) = Some(format!("{e:#}"));
            self.status.send_modify(|s| s.failures += 1);
        }
        result
    }

    /// Starts (stdio) or reaches (HTTP) the server and lists its tools.
    pub(super) async fn connect(self: &Arc<Self>) -> anyhow::Result<()> {
        let client = UpstreamClient {
            upstream: Arc::downgrade(self),
        };
        let service = match &self.endpoint {
            Endpoint::Stdio => {
                let command = self.config.command.clone().unwrap_or_default();
                let config = self.config.clone();
                let (transport, stderr) = TokioChildProcess::builder(
                    tokio::process::Command::new(&command).configure(|cmd| {
                        cmd.args(&config.args).envs(&config.env).kill_on_drop(true);
                        if let Some(cwd) = &config.cwd {
                            cmd.current_dir(cwd);
                        }
                    }),
                )
                // The child's stderr is its log, not our output: it goes to our log
                // at debug level, never to the terminal of `loadout route`.
                .stderr(std::process::Stdio::piped())
                .spawn()
                .with_context(|| format!("cannot start `{command}`"))?;
                if let Some(stderr) = stderr {
                    tokio::spawn(log_stderr(self.slug.clone(), stderr));
                }
                tokio::time::timeout(CONNECT_TIMEOUT, client.serve(transport)).await
            }
            Endpoint::Http { url, headers } => {
                let transport = http_transport(url, headers)?;
                tokio::time::timeout(CONNECT_TIMEOUT, client.serve(transport)).await
            }
        }
        .context("no answer to initialize")?
        .map_err(|e| anyhow::anyhow!("initialize failed: {}", initialize_failure(&e)))?;
        if let Some(info) = service.peer().peer_info() {
            let description = self.config.description.clone().unwrap_or_else(|| {
                info.instructions
                    .as_deref()
                    .map(|i| i.trim().chars().take(500).collect::<String>())
                    .filter(|i| !i.is_empty())
                    .unwrap_or_else(|| match &info.server_info {
                        Some(server) => {
                            format!("Tools of the MCP server `{}` ({}).", self.slug, server.name)
                        }
                        None => format!("Tools of the MCP server `{}`.", self.slug),
                    })
            });
            *lock(&self.description) = description;
        }
        let peer = service.peer().clone();
        let tools = tokio::time::timeout(CONNECT_TIMEOUT, peer.list_all_tools())
            .await
            .context("no answer to tools/list")?
            .map_err(|e| anyhow::anyhow!("tools/list failed: {}", service_failure(&e)))?;
        *lock(&self.tools) = self.import_tools(tools);
        let generation = self.status.borrow().generation + 1;
        *lock(&self.peer) = Some((peer, generation));
        *lock(&self.last_error) = None;
        *self.service.lock().await = Some(service);
        self.status.send_modify(|s| s.generation = generation);
        let _ = self.changed.send(());
        Ok(())
    }

    pub(super) fn import_tools(self: &Arc<Self>, tools: Vec<rmcp::model::Tool>) -> Vec<Tool> {
        let mut seen = HashSet::new();
        let mut imported = Vec::new();
        for tool in tools {
            let name = tool_name(&self.slug, &tool.name);
            if !seen.insert(name.clone()) {
                tracing::warn!(
                    "upstream `{}`: duplicate tool `{}` skipped",
                    self.slug,
                    tool.name
                );
                continue;
            }
            let description = tool
                .description
                .as_deref()
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(str::to_owned)
                .or_else(|| tool.title.clone())
                .unwrap_or_else(|| format!("Tool `{}` of MCP server `{}`.", tool.name, self.slug));
            let mut schema = Value::Object((*tool.input_schema).clone());
            if schema.get("type").is_none() {
                schema["type"] = Value::String("object".into());
            }
            let annotations = tool
                .annotations
                .as_ref()
                .map(|a| Annotations {
                    read_only: a.read_only_hint,
                    destructive: a.destructive_hint,
                    idempotent: a.idempotent_hint,
                    open_world: a.open_world_hint,
                })
                .unwrap_or_default();
            imported.push(Tool {
                name,
                domain: self.domain_name(),
                title: tool.title.clone(),
                hint: first_sentence(&description),
                description,
                keywords: Vec::new(),
                examples: Vec::new(),
                conflicts: Vec::new(),
                tier: Tier::Free,
                annotations,
                pins_domain: false,
                input_schema: Arc::new(schema),
                backend: Backend::External(Arc::new(ForwardedTool {
                    upstream: Arc::downgrade(self),
                    original: tool.name.to_string(),
                })),
                origin: format!("{} ({})", self.origin, tool.name),
            });
        }
        imported
    }

    /// Re-lists the tools of a connected server.
    pub(super) async fn refresh_tools(self: &Arc<Self>) -> anyhow::Result<()> {
        let (peer, _) = lock(&self.peer).clone().context("not connected")?;
        let tools = tokio::time::timeout(CONNECT_TIMEOUT, peer.list_all_tools())
            .await
            .context("no answer to tools/list")?
            .map_err(|e| anyhow::anyhow!("{}", service_failure(&e)))?;
        *lock(&self.tools) = self.import_tools(tools);
        let _ = self.changed.send(());
        Ok(())
    }

    /// The current connection, if its transport is still open.
    pub(super) fn live_peer(&self) -> Option<(Peer<RoleClient>, u64)> {
        lock(&self.peer)
            .clone()
            .filter(|(peer, _)| !peer.is_transport_closed())
    }

    pub(super) fn not_connected(&self) -> ToolError {
        let why = lock(&self.last_error)
            .clone()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        ToolError::Execution(format!(
            "upstream MCP server `{}` is not connected{why}; reconnecting, try again shortly",
            self.slug
        ))
    }

    /// Asks the supervisor for a connection (a new one if `dead` names the
    /// current one) and waits, until `deadline` at most, for its next attempt.
    pub(super) async fn reconnect_now(
        &self,
        dead: Option<u64>,
        deadline: Instant,
    ) -> Result<(Peer<RoleClient>, u64), ToolError> {
        let usable = |live: &(Peer<RoleClient>, u64)| dead != Some(live.1);
        let mut status = self.status.subscribe();
        let before = *status.borrow_and_update();
        // Another call may have replaced the connection already.
        if let Some(live) = self.live_peer().filter(usable) {
            return Ok(live);
        }
        let _ = self.wake.send(match dead {
            Some(generation) => Wake::Reconnect(generation),
            None => Wake::Connect,
        });
        let until = deadline.min(Instant::now() + CONNECT_TIMEOUT);
        let _ = tokio::time::timeout_at(until, status.wait_for(|now| *now != before)).await;
        self.live_peer()
            .filter(usable)
            .ok_or_else(|| self.not_connected())
    }

    /// The upstream's result as it sent it. Its `isError` results come back as
    /// results too; [`result_value`] turns them into errors for chat.
    pub(super) async fn call_result(
        &self,
        tool: &str,
        args: Value,
    ) -> Result<CallToolResult, ToolError> {
        let arguments = match args {
            Value::Object(map) => Some(map),
            Value::Null => None,
            _ => {
                return Err(ToolError::Execution(
                    "arguments must be a JSON object".into(),
                ));
            }
        };
        let mut request = CallToolRequestParams::new(tool.to_owned());
        if let Some(arguments) = arguments {
            request = request.with_arguments(arguments);
        }
        // OpenTelemetry (issue 40): the upstream server continues this call's trace
        // (`_meta.traceparent`, SEP-414; over HTTP also the header, see `HttpClient`).
        if let Some(traceparent) = crate::telemetry::traceparent(&tracing::Span::current()) {
            request
                .meta
                .get_or_insert_with(Default::default)
                .set_traceparent(traceparent);
        }
        let timeout = self
            .config
            .timeout_secs
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_CALL_TIMEOUT);
        let deadline = Instant::now() + timeout;
        // A call made while disconnected was never sent: it may wait for the
        // reconnection.
        let (peer, generation) = match self.live_peer() {
            Some(live) => live,
            None => self.reconnect_now(None, deadline).await?,
        };
        let failure = match send_call(&peer, request.clone(), deadline, timeout).await {
            Ok(result) => return Ok(result),
            Err(failure) => failure,
        };
        if !self.is_http() {
            if peer.is_transport_closed() {
                let _ = self.wake.send(Wake::Connect);
            }
            return Err(failure.tool_error(&self.slug));
        }
        // A call out of time has no time left for a check; the periodic one will
        // notice a dead session.
        if matches!(failure, CallFailure::TimedOut(_)) {
            return Err(failure.tool_error(&self.slug));
        }
        // An HTTP transport stays open when the server goes away; whether our
        // session still works is for a ping to tell.
        let Err(lost) = check_session(&peer).await else {
            return Err(failure.tool_error(&self.slug));
        };
        tracing::warn!(
            "upstream `{}`: the session stopped working ({lost}); reconnecting",
            self.slug
        );
        let never_ran = failure.never_processed(&lost);
        let (peer, _) = self.reconnect_now(Some(generation), deadline).await?;
        if !never_ran {
            return Err(ToolError::Execution(format!(
                "{}; the upstream's session was lost and has been re-established, the call may not have run",
                failure.message(&self.slug)
            )));
        }
        send_call(&peer, request, deadline, timeout)
            .await
            .map_err(|failure| failure.tool_error(&self.slug))
    }

    /// Keeps the server connected: waits for the connection to end (or, over HTTP,
    /// to stop answering), then reconnects with backoff; also serves re-list
    /// requests.
    pub(super) async fn supervise(self: Arc<Self>, mut wake: mpsc::UnboundedReceiver<Wake>) {
        let mut backoff = Duration::from_millis(500);
        loop {
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            let connected = lock(&self.peer).is_some();
            if !connected {
                match self.attempt().await {
                    Ok(()) => {
                        tracing::info!("upstream `{}` connected", self.slug);
                        backoff = Duration::from_millis(500);
                    }
                    Err(e) => {
                        tracing::warn!(
                            "upstream `{}`: {e:#}; retrying in {:.1}s",
                            self.slug,
                            backoff.as_secs_f64()
                        );
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            woke = wake.recv() => if woke.is_none() { return },
                        }
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                }
            }
            // Connected: wait for the service to end, for a request, or (HTTP) for
            // the next health check.
            let service = self.service.lock().await.take();
            let Some(service) = service else {
                if self.stopping.load(Ordering::Acquire) {
                    return;
                }
                *lock(&self.peer) = None;
                continue;
            };
            let generation = lock(&self.peer).as_ref().map_or(0, |(_, g)| *g);
            *lock(&self.stop) = Some(service.cancellation_token());
            let mut ended = Box::pin(service.waiting());
            let mut health =
                tokio::time::interval_at(Instant::now() + HEALTH_INTERVAL, HEALTH_INTERVAL);
            health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let (reason, running) = loop {
                tokio::select! {
                    quit = &mut ended => {
                        if !self.stopping.load(Ordering::Acquire) {
                            tracing::warn!("upstream `{}` stopped ({quit:?}); reconnecting", self.slug);
                        }
                        let reason = if self.is_http() { "the connection ended" } else { "the server exited" };
                        break (reason.to_owned(), false);
                    }
                    _ = health.tick(), if self.is_http() => {
                        let peer = lock(&self.peer).as_ref().map(|(peer, _)| peer.clone());
                        if let Some(peer) = peer
                            && let Err(lost) = check_session(&peer).await
                        {
                            tracing::warn!("upstream `{}` stopped answering ({lost}); reconnecting", self.slug);
                            break (format!("the server stopped answering: {lost}"), true);
                        }
                    }
                    woke = wake.recv() => match woke {
                        None => return,
                        // A call found the connection closed: `ended` completes soon.
                        Some(Wake::Connect) => {}
                        Some(Wake::Reconnect(dead)) if dead == generation => {
                            break ("the session was lost".to_owned(), true);
                        }
                        // About a connection already replaced.
                        Some(Wake::Reconnect(_)) => {}
                        Some(Wake::Relist) => {
                            if let Err(e) = self.refresh_tools().await {
                                tracing::warn!("upstream `{}`: re-listing tools failed: {e:#}", self.slug);
                            }
                        }
                    },
                }
            };
            if running {
                if let Some(stop) = lock(&self.stop).take() {
                    stop.cancel();
                }
                // Ending the old session tells the server (HTTP DELETE); a dead
                // server must not hold up the new connection.
                let _ = tokio::time::timeout(Duration::from_secs(5), &mut ended).await;
            }
            *lock(&self.stop) = None;
            *lock(&self.peer) = None;
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            // The last tool list stays: calls meanwhile answer "not connected" (or
            // wait for the reconnection) rather than "unknown tool".
            *lock(&self.last_error) = Some(reason);
        }
    }
}

/// Longest line of an upstream's stderr logged as one; longer ones are cut.
const MAX_STDERR_LINE: u64 = 4096;

/// Logs a stdio upstream's stderr at debug level, line by line, until it closes
/// (the child exited).
async fn log_stderr(server: String, stderr: tokio::process::ChildStderr) {
    use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _};
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(MAX_STDERR_LINE)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end();
                if !text.is_empty() {
                    tracing::debug!("upstream `{server}` stderr: {text}");
                }
            }
        }
    }
}

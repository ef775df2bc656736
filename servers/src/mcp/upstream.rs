//! Upstream MCP servers as domains.
//!
//! The config file's `[servers]` table (`loadout.toml`, see [`crate::config`]) lists
//! servers, run as a child process over stdio or reached over streamable HTTP:
//!
//! ```toml
//! [servers.time]
//! command = "uvx"
//! args = ["mcp-server-time"]
//! env = { TZ = "UTC" }
//! keywords = ["time zone", "convert time"]
//! description = "Current time and time-zone conversion."   # optional
//!
//! [servers.search]
//! url = "https://mcp.example.com/mcp"
//! headers = { Authorization = "Bearer <token>" }
//! keywords = ["web search"]
//! ```
//!
//! Each server's tools become domain `mcp_<server>` with tool names
//! `<server>__<tool>` (kept to `[a-z0-9_-]{1,64}`), descriptions and schemas from
//! the server, keywords from the config. Calls are forwarded with rmcp's client. A
//! server that exits, or an HTTP server that stops answering on our session, is
//! reconnected with backoff (a fresh session, its tools listed again); a
//! `tools/list_changed` from it re-lists its tools, and the catalog is rebuilt.
//!
//! Header values are never logged or quoted in an error: credentials belong there,
//! not in the URL, which logs may show.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use anyhow::Context as _;
use loadout::{Annotations, Backend, CallFuture, Domain, ExternalCall, Tier, Tool, ToolError};
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ClientJsonRpcMessage,
    ClientRequest, ErrorCode, Implementation, JsonRpcMessage, PingRequest, RequestId,
};
use rmcp::service::{
    ClientInitializeError, NotificationContext, RunningService, RunningServiceCancellationToken,
};
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use rmcp::transport::{
    ConfigureCommandExt, DynamicTransportError, StreamableHttpClientTransport, TokioChildProcess,
};
use rmcp::{ClientHandler, Peer, RoleClient, ServiceError, ServiceExt};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Time to start a server and list its tools before it is reported as failing.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// An unreachable HTTP host fails within this instead of the OS's minutes.
const HTTP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// An idle HTTP upstream is pinged this often: a server that restarted has
/// forgotten our session, so without a check we would miss its `list_changed`
/// until the next call failed.
const HEALTH_INTERVAL: Duration = Duration::from_secs(30);
const PING_TIMEOUT: Duration = Duration::from_secs(15);
/// Headers the streamable HTTP transport sets itself; a configured one would clash.
const TRANSPORT_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "last-event-id",
    "mcp-protocol-version",
    "mcp-session-id",
];

/// One `[servers.<name>]` entry.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// stdio: the program to run.
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// Streamable HTTP: the endpoint.
    pub url: Option<String>,
    /// Streamable HTTP: headers sent with every request (e.g. `Authorization`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Routing keywords for the domain.
    #[serde(default)]
    pub keywords: Vec<String>,
    /// Domain description; default: the server's instructions or name.
    pub description: Option<String>,
    /// Settings the domain needs before its tools run (like any domain's).
    #[serde(default)]
    pub settings_keys: Vec<String>,
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
    /// Longest a forwarded call may take.
    pub timeout_secs: Option<u64>,
}

fn enabled_by_default() -> bool {
    true
}

/// Names only for `env` and `headers`: their values are often credentials.
impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .field("url", &self.url)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("keywords", &self.keywords)
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

/// The enabled servers of the config file's `[servers]` table by domain slug, and
/// every problem with any entry (each naming its `servers.<name>` key).
pub(crate) fn check_servers(
    entries: BTreeMap<String, ServerConfig>,
) -> (Vec<(String, ServerConfig)>, Vec<String>) {
    let mut problems = Vec::new();
    let mut servers = Vec::new();
    let mut domains = HashSet::new();
    for (name, config) in entries {
        let key = format!("servers.{name}");
        let Some(slug) = server_slug(&name) else {
            problems.push(format!(
                "{key}: server names use a-z, 0-9, `_` and `-`, at most 40 characters"
            ));
            continue;
        };
        if !domains.insert(slug.clone()) {
            problems.push(format!(
                "{key}: another server's name maps to `mcp_{slug}` too"
            ));
            continue;
        }
        match (&config.command, &config.url) {
            (Some(_), Some(_)) => {
                problems.push(format!("{key}: give `command` or `url`, not both"))
            }
            (None, None) => problems.push(format!(
                "{key}: give `command` (a stdio server) or `url` (an HTTP server)"
            )),
            (Some(command), None) => {
                if command.trim().is_empty() {
                    problems.push(format!("{key}: `command` is empty"));
                }
                if !config.headers.is_empty() {
                    problems.push(format!(
                        "{key}: `headers` are for HTTP servers (`url`), not `command`"
                    ));
                }
            }
            (None, Some(url)) => {
                if let Err(why) = check_url(url) {
                    problems.push(format!("{key}: `url` {why}"));
                }
                if let Err(header_problems) = http_headers(&config.headers) {
                    problems.extend(header_problems.into_iter().map(|p| format!("{key}: {p}")));
                }
                let stdio_only: Vec<&str> = [
                    (!config.args.is_empty()).then_some("`args`"),
                    (!config.env.is_empty()).then_some("`env`"),
                    config.cwd.is_some().then_some("`cwd`"),
                ]
                .into_iter()
                .flatten()
                .collect();
                if !stdio_only.is_empty() {
                    problems.push(format!(
                        "{key}: {} only apply to stdio servers (`command`), not `url`",
                        stdio_only.join(", ")
                    ));
                }
            }
        }
        if config.enabled {
            servers.push((slug, config));
        }
    }
    (servers, problems)
}

/// Why `url` cannot be an MCP endpoint, if it cannot. The URL itself is not
/// quoted back: it may carry a credential.
fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url.trim()).map_err(|e| format!("is not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "must be http:// or https://, not `{}:`",
            parsed.scheme()
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err("has no host".into());
    }
    Ok(())
}

/// The configured headers as the transport takes them, or every problem with
/// them. A problem names the header, never its value.
fn http_headers(
    headers: &BTreeMap<String, String>,
) -> Result<HashMap<HeaderName, HeaderValue>, Vec<String>> {
    let mut parsed = HashMap::new();
    let mut problems = Vec::new();
    for (name, value) in headers {
        let Ok(header) = HeaderName::from_bytes(name.trim().as_bytes()) else {
            problems.push(format!("`headers.{name}` is not a valid header name"));
            continue;
        };
        if TRANSPORT_HEADERS.contains(&header.as_str()) {
            problems.push(format!(
                "`headers.{name}` is set by the MCP transport and cannot be configured"
            ));
            continue;
        }
        match HeaderValue::from_str(value.trim()) {
            Ok(mut value) => {
                // Keeps the value out of any `Debug` output of the request.
                value.set_sensitive(true);
                parsed.insert(header, value);
            }
            Err(_) => problems.push(format!(
                "`headers.{name}` has a value that is not a valid header value (control characters?)"
            )),
        }
    }
    if problems.is_empty() {
        Ok(parsed)
    } else {
        Err(problems)
    }
}

/// `my-server` → `my_server`; `None` if the name has other characters.
fn server_slug(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    ok.then(|| name.to_ascii_lowercase().replace('-', "_"))
}

/// `<server>__<tool>`, kept to `[a-z0-9_-]{1,64}`; a name that had to be changed
/// or cut gets a short hash of the original so two tools stay apart.
fn tool_name(server: &str, tool: &str) -> String {
    let cleaned: String = tool
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '_' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '_',
        })
        .collect();
    let name = format!("{server}__{cleaned}");
    let lossless = cleaned == tool;
    if name.len() <= 64 && lossless {
        return name;
    }
    let hash = format!("{:08x}", fnv1a(tool.as_bytes()) as u32);
    let keep = name.len().min(64 - 1 - hash.len());
    format!("{}_{hash}", &name[..keep])
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

/// How an upstream is reached.
enum Endpoint {
    Stdio,
    Http {
        url: Arc<str>,
        headers: HashMap<HeaderName, HeaderValue>,
    },
}

/// What a call waiting for a reconnection watches: a new connection, or one more
/// failed attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Status {
    generation: u64,
    failures: u64,
}

/// Messages to an upstream's supervisor.
#[derive(Debug)]
enum Wake {
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
    slug: String,
    config: ServerConfig,
    endpoint: Endpoint,
    origin: String,
    /// The live client and its connection's generation, or `None` while
    /// (re)connecting.
    peer: Mutex<Option<(Peer<RoleClient>, u64)>>,
    /// Bumped on every connection and every failed attempt.
    status: watch::Sender<Status>,
    /// The running client service; dropping it stops the child process or ends
    /// the HTTP session.
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, UpstreamClient>>>,
    /// Cancels the running service while the supervisor waits on it.
    stop: Mutex<Option<RunningServiceCancellationToken>>,
    stopping: AtomicBool,
    /// The latest tool list, as registry tools.
    tools: Mutex<Vec<Tool>>,
    description: Mutex<String>,
    last_error: Mutex<Option<String>>,
    wake: mpsc::UnboundedSender<Wake>,
    /// Tells the owner the tool list changed.
    changed: mpsc::UnboundedSender<()>,
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

    fn is_http(&self) -> bool {
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
    async fn attempt(self: &Arc<Self>) -> anyhow::Result<()> {
        let result = self.connect().await;
        if let Err(e) = &result {
            *lock(&self.last_error) = Some(format!("{e:#}"));
            self.status.send_modify(|s| s.failures += 1);
        }
        result
    }

    /// Starts (stdio) or reaches (HTTP) the server and lists its tools.
    async fn connect(self: &Arc<Self>) -> anyhow::Result<()> {
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

    fn import_tools(self: &Arc<Self>, tools: Vec<rmcp::model::Tool>) -> Vec<Tool> {
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
    async fn refresh_tools(self: &Arc<Self>) -> anyhow::Result<()> {
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
    fn live_peer(&self) -> Option<(Peer<RoleClient>, u64)> {
        lock(&self.peer)
            .clone()
            .filter(|(peer, _)| !peer.is_transport_closed())
    }

    fn not_connected(&self) -> ToolError {
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
    async fn reconnect_now(
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
    async fn call_result(&self, tool: &str, args: Value) -> Result<CallToolResult, ToolError> {
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
    async fn supervise(self: Arc<Self>, mut wake: mpsc::UnboundedReceiver<Wake>) {
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

/// The streamable HTTP client for one upstream.
fn http_transport(
    url: &Arc<str>,
    headers: &HashMap<HeaderName, HeaderValue>,
) -> anyhow::Result<StreamableHttpClientTransport<HttpClient>> {
    // reqwest is built without a TLS provider of its own (see Cargo.toml).
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .connect_timeout(HTTP_CONNECT_TIMEOUT)
        // As in rmcp's own client: reusing an idle connection whose last body was
        // not drained stalls ~40 ms on delayed ACKs.
        .pool_max_idle_per_host(0)
        .redirect(same_origin_redirects())
        .build()
        .context("cannot build the HTTP client")?;
    let config = StreamableHttpClientTransportConfig::with_uri(url.clone())
        .custom_headers(headers.clone())
        // A lost session is replaced by a full reconnection instead, which also
        // lists the tools again: a restarted server may have others.
        .reinit_on_expired_session(false);
    Ok(StreamableHttpClientTransport::with_client(
        HttpClient(client),
        config,
    ))
}

/// rmcp's reqwest client with one repair: an error answering a request's POST
/// that carries no `id` gets the request's. Some servers answer an unknown session
/// that way (HTTP 400, as the TypeScript SDK's examples do, so a restarted one),
/// and rmcp drops an error it cannot match, leaving the call to hang until its
/// timeout instead of failing at once.
#[derive(Clone)]
struct HttpClient(reqwest::Client);

type PostResult = Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>;

/// The headers of a POST, with the `traceparent` of a `tools/call` whose `_meta`
/// carries one (set by `call_result`): HTTP servers read the header.
fn with_traceparent(
    message: &ClientJsonRpcMessage,
    mut headers: HashMap<HeaderName, HeaderValue>,
) -> HashMap<HeaderName, HeaderValue> {
    if let JsonRpcMessage::Request(request) = message
        && let rmcp::model::ClientRequest::CallToolRequest(call) = &request.request
        && let Some(traceparent) = call.params.meta.as_ref().and_then(|m| m.get_traceparent())
        && let Ok(value) = HeaderValue::from_str(traceparent)
    {
        headers.insert(HeaderName::from_static("traceparent"), value);
    }
    headers
}

fn request_id(message: &ClientJsonRpcMessage) -> Option<RequestId> {
    match message {
        JsonRpcMessage::Request(request) => Some(request.id.clone()),
        _ => None,
    }
}

fn with_request_id(response: PostResult, id: Option<RequestId>) -> PostResult {
    match (response, id) {
        (
            Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(mut error), session)),
            Some(id),
        ) if error.id.is_none() => {
            error.id = Some(id);
            Ok(StreamableHttpPostResponse::Json(
                JsonRpcMessage::Error(error),
                session,
            ))
        }
        (response, _) => response,
    }
}

impl StreamableHttpClient for HttpClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> PostResult {
        let id = request_id(&message);
        let custom_headers = with_traceparent(&message, custom_headers);
        let response = self
            .0
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await;
        with_request_id(response, id)
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> PostResult {
        let id = request_id(&message);
        let custom_headers = with_traceparent(&message, custom_headers);
        let response = self
            .0
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await;
        with_request_id(response, id)
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> PostResult {
        let id = request_id(&message);
        let custom_headers = with_traceparent(&message, custom_headers);
        let response = self
            .0
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await;
        with_request_id(response, id)
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<reqwest::Error>> {
        self.0
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxedSseResponse, StreamableHttpError<reqwest::Error>> {
        self.0
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxedSseResponse, StreamableHttpError<reqwest::Error>> {
        self.0
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

/// Follows 307/308 within the same origin only: those keep the POST body, and the
/// configured headers (credentials) must not go to another host.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        let keeps_body = matches!(attempt.status().as_u16(), 307 | 308);
        if same_origin && keeps_body && attempt.previous().len() <= 10 {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// Why a forwarded call failed.
enum CallFailure {
    TimedOut(Duration),
    Service(ServiceError),
}

impl CallFailure {
    fn message(&self, slug: &str) -> String {
        match self {
            CallFailure::TimedOut(timeout) => format!(
                "upstream MCP server `{slug}` did not answer within {}s",
                timeout.as_secs()
            ),
            CallFailure::Service(e) => {
                format!("upstream MCP server `{slug}`: {}", service_failure(e))
            }
        }
    }

    fn tool_error(&self, slug: &str) -> ToolError {
        ToolError::Execution(self.message(slug))
    }

    /// Whether the server certainly did not run the call, so that sending it again
    /// on a new session cannot run it twice: the connection was refused, the
    /// session was unknown (404), or a bare ping got the very same rejection.
    fn never_processed(&self, lost: &SessionLost) -> bool {
        let CallFailure::Service(call) = self else {
            return false;
        };
        match call {
            ServiceError::TransportSend(e) => match http_error(e) {
                Some(StreamableHttpError::SessionExpired) => true,
                Some(StreamableHttpError::Client(e)) => e.is_connect(),
                // A 4xx that is not JSON-RPC.
                Some(StreamableHttpError::UnexpectedServerResponse(_)) => {
                    same_rejection(call, lost)
                }
                _ => false,
            },
            ServiceError::McpError(_) => same_rejection(call, lost),
            _ => false,
        }
    }
}

/// Whether a ping, which runs nothing, was refused just as the call was: then the
/// refusal was about the session, not the call.
fn same_rejection(call: &ServiceError, lost: &SessionLost) -> bool {
    matches!(lost, SessionLost::Failed(ping) if service_failure(ping) == service_failure(call))
}

fn http_error(error: &DynamicTransportError) -> Option<&StreamableHttpError<reqwest::Error>> {
    error.error.downcast_ref()
}

async fn send_call(
    peer: &Peer<RoleClient>,
    request: CallToolRequestParams,
    deadline: Instant,
    timeout: Duration,
) -> Result<CallToolResult, CallFailure> {
    match tokio::time::timeout_at(deadline, peer.call_tool(request)).await {
        Err(_) => Err(CallFailure::TimedOut(timeout)),
        Ok(result) => result.map_err(CallFailure::Service),
    }
}

/// Why a session is considered gone.
enum SessionLost {
    Silent,
    Failed(ServiceError),
}

impl std::fmt::Display for SessionLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionLost::Silent => write!(f, "no answer to ping in {}s", PING_TIMEOUT.as_secs()),
            SessionLost::Failed(e) => write!(f, "ping failed: {}", service_failure(e)),
        }
    }
}

fn initialize_failure(error: &ClientInitializeError) -> String {
    match error {
        ClientInitializeError::TransportError { error, .. } => transport_failure(error),
        ClientInitializeError::JsonRpcError(e) => format!("{} (code {})", e.message, e.code.0),
        other => other.to_string(),
    }
}

fn service_failure(error: &ServiceError) -> String {
    match error {
        ServiceError::McpError(e) => format!("{} (code {})", e.message, e.code.0),
        ServiceError::TransportSend(e) => transport_failure(e),
        other => other.to_string(),
    }
}

/// A transport failure in words to act on: rmcp's own text names the transport's
/// Rust type and leaves out the cause (a refused connection, an unknown host).
fn transport_failure(error: &DynamicTransportError) -> String {
    match http_error(error) {
        Some(StreamableHttpError::Client(e)) if e.is_connect() => {
            format!("cannot connect ({})", root_cause(e))
        }
        Some(StreamableHttpError::Client(e)) if e.is_timeout() => "the request timed out".into(),
        Some(StreamableHttpError::Client(e)) => format!("HTTP request failed ({})", root_cause(e)),
        Some(StreamableHttpError::AuthRequired(_) | StreamableHttpError::InsufficientScope(_)) => {
            "the server refused the credentials (HTTP 401/403); check `headers`".into()
        }
        Some(other) => other.to_string(),
        None => root_cause(error.error.as_ref()),
    }
}

fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut error = error;
    while let Some(source) = error.source() {
        error = source;
    }
    error.to_string()
}

/// Whether the server still answers on this session. One that does not know
/// `ping` did answer.
async fn check_session(peer: &Peer<RoleClient>) -> Result<(), SessionLost> {
    let ping = peer.send_request(ClientRequest::PingRequest(PingRequest::default()));
    match tokio::time::timeout(PING_TIMEOUT, ping).await {
        Err(_) => Err(SessionLost::Silent),
        Ok(Ok(_)) => Ok(()),
        Ok(Err(ServiceError::McpError(e))) if e.code == ErrorCode::METHOD_NOT_FOUND => Ok(()),
        Ok(Err(e)) => Err(SessionLost::Failed(e)),
    }
}

/// rmcp client callbacks for one upstream.
pub struct UpstreamClient {
    upstream: Weak<Upstream>,
}

impl ClientHandler for UpstreamClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("loadout", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(upstream) = self.upstream.upgrade() {
            let _ = upstream.wake.send(Wake::Relist);
        }
    }
}

/// The registry backend of one imported tool.
struct ForwardedTool {
    upstream: Weak<Upstream>,
    original: String,
}

impl ForwardedTool {
    /// The call, its result mapped by `map` (flattened for chat, or as JSON).
    fn forward(
        &self,
        args: Value,
        map: fn(CallToolResult) -> Result<Value, ToolError>,
    ) -> CallFuture {
        use tracing::Instrument as _;
        let upstream = self.upstream.upgrade();
        let original = self.original.clone();
        // Made here, not in the future: the registry runs that on a task of its own,
        // where the calling tool's span is no longer the current one.
        let span = match &upstream {
            Some(upstream) => crate::telemetry::upstream_span(&upstream.slug, &original),
            None => tracing::Span::none(),
        };
        Box::pin(async move {
            match upstream {
                Some(upstream) => map(upstream
                    .call_result(&original, args)
                    .instrument(span)
                    .await?),
                None => Err(ToolError::Execution(
                    "the upstream MCP server was shut down".into(),
                )),
            }
        })
    }
}

impl ExternalCall for ForwardedTool {
    fn call(&self, _tool: &str, args: Value) -> CallFuture {
        self.forward(args, result_value)
    }

    /// The upstream's `CallToolResult` unchanged (images, audio, links, embedded
    /// resources, its own structured content and `isError`), for `loadout mcp` to
    /// pass on.
    fn call_raw(&self, _tool: &str, args: Value) -> Option<CallFuture> {
        Some(self.forward(args, |result| {
            serde_json::to_value(result)
                .map_err(|e| ToolError::Execution(format!("upstream result is not JSON: {e}")))
        }))
    }
}

/// An upstream result as a registry value: its structured content, its text, or
/// (for images and other blocks) the content list as JSON. `isError` becomes an
/// execution error with the server's text.
fn result_value(result: CallToolResult) -> Result<Value, ToolError> {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect();
    if result.is_error == Some(true) {
        let message = if texts.is_empty() {
            "the upstream tool reported an error".to_owned()
        } else {
            texts.join("\n")
        };
        return Err(ToolError::Execution(message));
    }
    if let Some(structured) = result.structured_content {
        return Ok(structured);
    }
    if texts.len() == result.content.len() {
        return Ok(Value::String(texts.join("\n")));
    }
    serde_json::to_value(&result.content)
        .map(|content| serde_json::json!({ "content": content }))
        .map_err(|e| ToolError::Execution(format!("upstream result is not JSON: {e}")))
}

fn first_sentence(text: &str) -> String {
    let line = text.lines().next().unwrap_or(text);
    match line.find(". ") {
        Some(i) => line[..=i].to_owned(),
        None => line.to_owned(),
    }
}

/// Every configured upstream, connected in the background. The set follows the
/// config file: [`Upstreams::reconcile`] connects servers added to `[servers]` and
/// stops those taken out.
pub struct Upstreams {
    /// `None` once shut down: a reconcile still connecting then stops what it
    /// connected instead of leaving it running.
    running: Mutex<Option<Vec<Running>>>,
    /// Handed to each server: tells the owner a tool list changed (and that the set
    /// of servers did, after a reconcile).
    changed: mpsc::UnboundedSender<()>,
}

struct Running {
    upstream: Arc<Upstream>,
    supervisor: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams")
            .field("servers", &self.servers().len())
            .finish()
    }
}

/// What [`Upstreams::reconcile`] did, by server slug.
#[derive(Debug, Default, PartialEq)]
pub struct Reconciled {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Servers whose settings changed: stopped and connected again.
    pub restarted: Vec<String>,
}

impl Reconciled {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.restarted.is_empty()
    }
}

impl Upstreams {
    pub fn none() -> Upstreams {
        let (changed, _) = mpsc::unbounded_channel();
        Upstreams::new(changed)
    }

    fn new(changed: mpsc::UnboundedSender<()>) -> Upstreams {
        Upstreams {
            running: Mutex::new(Some(Vec::new())),
            changed,
        }
    }

    /// Starts every server and waits (up to the connect timeout) for the first
    /// connection of each, so the first tools/list has their tools. `changed` gets a
    /// message whenever a server's tool list changes later.
    pub async fn start(
        config_path: &Path,
        servers: Vec<(String, ServerConfig)>,
        changed: mpsc::UnboundedSender<()>,
    ) -> Upstreams {
        let upstreams = Upstreams::new(changed);
        upstreams.add(config_path, servers).await;
        upstreams
    }

    /// Connects `servers`, as [`Upstreams::start`] does.
    async fn add(&self, config_path: &Path, servers: Vec<(String, ServerConfig)>) {
        let mut added = Vec::new();
        let mut wake_receivers = Vec::new();
        let mut first_connects = tokio::task::JoinSet::new();
        for (slug, config) in servers {
            let endpoint = match &config.url {
                None => Endpoint::Stdio,
                Some(url) => match http_headers(&config.headers) {
                    Ok(headers) => Endpoint::Http {
                        url: Arc::from(url.trim()),
                        headers,
                    },
                    // `load_config` reports these; a caller that skipped it gets
                    // the server left out rather than half-configured.
                    Err(problems) => {
                        eprintln!(
                            "loadout: {}: servers.{slug}: {}; skipped",
                            config_path.display(),
                            problems.join("; ")
                        );
                        continue;
                    }
                },
            };
            let (wake, wake_rx) = mpsc::unbounded_channel();
            let upstream = Arc::new(Upstream {
                origin: format!("{}: servers.{slug}", config_path.display()),
                description: Mutex::new(
                    config
                        .description
                        .clone()
                        .unwrap_or_else(|| format!("Tools of the MCP server `{slug}`.")),
                ),
                slug,
                config,
                endpoint,
                peer: Mutex::new(None),
                status: watch::Sender::new(Status::default()),
                service: tokio::sync::Mutex::new(None),
                stop: Mutex::new(None),
                stopping: AtomicBool::new(false),
                tools: Mutex::new(Vec::new()),
                last_error: Mutex::new(None),
                wake,
                changed: self.changed.clone(),
            });
            let first = upstream.clone();
            first_connects.spawn(async move {
                if let Err(e) = first.attempt().await {
                    eprintln!(
                        "loadout: upstream MCP server `{}`: {e:#}; retrying in the background",
                        first.slug
                    );
                }
            });
            added.push(upstream);
            wake_receivers.push(wake_rx);
        }
        while first_connects.join_next().await.is_some() {}
        // Supervisors start after the first attempts so that they do not race them.
        let started = added
            .into_iter()
            .zip(wake_receivers)
            .map(|(upstream, wake_rx)| {
                let supervisor = tokio::spawn(Arc::clone(&upstream).supervise(wake_rx));
                Running {
                    upstream,
                    supervisor: Some(supervisor),
                }
            });
        let shut_down = match &mut *lock(&self.running) {
            Some(running) => {
                running.extend(started);
                None
            }
            None => Some(started.collect::<Vec<_>>()),
        };
        if let Some(started) = shut_down {
            stop_all(started).await;
        }
    }

    /// The servers as they are now.
    pub fn servers(&self) -> Vec<Arc<Upstream>> {
        lock(&self.running)
            .iter()
            .flatten()
            .map(|r| r.upstream.clone())
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        lock(&self.running).as_ref().is_none_or(Vec::is_empty)
    }

    /// Makes the running servers those of `wanted` (the `[servers]` of a config
    /// file read again): stops the servers no longer listed and those whose
    /// settings changed, then connects the new and changed ones (waiting for each
    /// one's first connection, as at start), and tells the owner, which lists the
    /// new set's tools. Servers left as they were keep their connections. Not for
    /// two callers at once.
    pub async fn reconcile(
        &self,
        config_path: &Path,
        wanted: &[(String, ServerConfig)],
    ) -> Reconciled {
        let mut done = Reconciled::default();
        let stopping: Vec<Running> = {
            let mut running = lock(&self.running);
            let Some(running) = running.as_mut() else {
                return done;
            };
            let (stop, keep) = std::mem::take(running).into_iter().partition(|r| {
                wanted
                    .iter()
                    .all(|(slug, config)| *slug != r.upstream.slug || *config != r.upstream.config)
            });
            *running = keep;
            stop
        };
        for r in &stopping {
            if wanted.iter().any(|(slug, _)| *slug == r.upstream.slug) {
                done.restarted.push(r.upstream.slug.clone());
            } else {
                done.removed.push(r.upstream.slug.clone());
            }
        }
        stop_all(stopping).await;
        let running = self.servers();
        let starting: Vec<(String, ServerConfig)> = wanted
            .iter()
            .filter(|(slug, _)| running.iter().all(|r| r.slug != *slug))
            .cloned()
            .collect();
        for (slug, _) in &starting {
            if !done.restarted.contains(slug) {
                done.added.push(slug.clone());
            }
        }
        self.add(config_path, starting).await;
        if !done.is_empty() {
            let _ = self.changed.send(());
        }
        done
    }

    /// Stops every server process (gracefully: stdin closed, then SIGTERM, then
    /// kill) and ends every HTTP session.
    pub async fn shutdown(&self) {
        let running = lock(&self.running).take();
        stop_all(running.unwrap_or_default()).await;
    }
}

/// Stops each server, then waits for its supervisor (see [`Upstreams::shutdown`]).
async fn stop_all(mut running: Vec<Running>) {
    for r in &running {
        let upstream = &r.upstream;
        upstream.stopping.store(true, Ordering::Release);
        *lock(&upstream.peer) = None;
        if let Some(stop) = lock(&upstream.stop).take() {
            stop.cancel();
        }
        if let Some(mut service) = upstream.service.lock().await.take() {
            let _ = service.close_with_timeout(Duration::from_secs(5)).await;
        }
    }
    for r in &mut running {
        let Some(mut handle) = r.supervisor.take() else {
            continue;
        };
        if tokio::time::timeout(Duration::from_secs(6), &mut handle)
            .await
            .is_err()
        {
            handle.abort();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_stay_valid_and_distinct() {
        assert_eq!(
            tool_name("time", "get_current_time"),
            "time__get_current_time"
        );
        let odd = tool_name("srv", "Read.File");
        assert!(odd.starts_with("srv__read_file_"), "{odd}");
        let long = tool_name("srv", &"x".repeat(100));
        assert!(long.len() <= 64, "{long}");
        assert_ne!(tool_name("srv", "a.b"), tool_name("srv", "a_b"));
        for name in [odd, long] {
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase()
                    || b.is_ascii_digit()
                    || b == b'_'
                    || b == b'-')
            );
        }
    }

    #[test]
    fn config_errors_are_all_reported() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(crate::config::CONFIG_FILE);
        let load_config = |path: &Path, explicit| {
            crate::config::ConfigFile::load(path, explicit).map(|config| config.servers)
        };
        std::fs::write(
            &path,
            r#"
            [servers.good]
            command = "echo"
            [servers."bad name"]
            command = "x"
            [servers.both]
            command = "x"
            url = "http://localhost"
            [servers.neither]
            "#,
        )
        .expect("write");
        let error = format!("{:#}", load_config(&path, true).expect_err("error"));
        assert!(error.contains("servers.bad name"), "{error}");
        assert!(error.contains("servers.both"), "{error}");
        assert!(error.contains("servers.neither"), "{error}");
        assert!(
            load_config(&dir.path().join("missing.toml"), false)
                .expect("ok")
                .is_empty()
        );
        assert!(load_config(&dir.path().join("missing.toml"), true).is_err());

        std::fs::write(
            &path,
            r#"
            [servers.web]
            url = "https://mcp.example.com/mcp"
            headers = { Authorization = "Bearer secret-1" }
            [servers.ftp]
            url = "ftp://example.com/mcp"
            [servers.relative]
            url = "/mcp"
            [servers.mixed]
            url = "http://localhost/mcp"
            args = ["x"]
            [servers.stdio-headers]
            command = "x"
            headers = { Authorization = "Bearer secret-2" }
            [servers.session]
            url = "http://localhost/mcp"
            headers = { "Mcp-Session-Id" = "secret-3", "Bad Name" = "secret-4", X-Ok = "secret\u0001-5" }
            "#,
        )
        .expect("write");
        let error = format!("{:#}", load_config(&path, true).expect_err("error"));
        for expected in [
            "servers.ftp: `url` must be http:// or https://",
            "servers.relative: `url` is not a URL",
            "servers.mixed: `args` only apply to stdio servers",
            "servers.stdio-headers: `headers` are for HTTP servers",
            "servers.session: `headers.Mcp-Session-Id` is set by the MCP transport",
            "servers.session: `headers.Bad Name` is not a valid header name",
            "servers.session: `headers.X-Ok` has a value that is not a valid header value",
        ] {
            assert!(
                error.contains(expected),
                "{expected:?} missing from {error}"
            );
        }
        assert!(!error.contains("servers.web"), "{error}");
        assert!(!error.contains("secret"), "a header value leaked: {error}");
    }

    #[test]
    fn debug_output_hides_header_and_env_values() {
        let config: ServerConfig = toml::from_str(
            r#"
            url = "http://localhost/mcp"
            headers = { Authorization = "Bearer hidden-token" }
            env = { API_KEY = "hidden-key" }
            "#,
        )
        .expect("config");
        let debug = format!("{config:?}");
        assert!(
            debug.contains("Authorization") && debug.contains("API_KEY"),
            "{debug}"
        );
        assert!(!debug.contains("hidden"), "{debug}");
        let headers = http_headers(&config.headers).expect("headers");
        assert!(!format!("{headers:?}").contains("hidden"));
    }

    #[test]
    fn an_id_less_error_answering_a_request_gets_its_id() {
        let request: ClientJsonRpcMessage = serde_json::from_value(serde_json::json!(
            {"jsonrpc": "2.0", "id": 7, "method": "ping"}
        ))
        .expect("request");
        let id = request_id(&request);
        assert!(id.is_some());
        let answer = |body: Value| -> PostResult {
            Ok(StreamableHttpPostResponse::Json(
                serde_json::from_value(body).expect("message"),
                None,
            ))
        };
        let id_of = |response: PostResult| match response {
            Ok(StreamableHttpPostResponse::Json(JsonRpcMessage::Error(error), _)) => error.id,
            other => panic!("not an error: {other:?}"),
        };
        let orphan = serde_json::json!(
            {"jsonrpc": "2.0", "error": {"code": -32000, "message": "Bad Request: No valid session ID provided"}}
        );
        assert_eq!(
            id_of(with_request_id(answer(orphan.clone()), id.clone())),
            id
        );
        // A notification's POST awaits no answer: nothing to match.
        assert_eq!(id_of(with_request_id(answer(orphan), None)), None);
        // An error with its own id keeps it.
        let own = serde_json::json!(
            {"jsonrpc": "2.0", "id": 3, "error": {"code": -32601, "message": "no"}}
        );
        assert_eq!(
            id_of(with_request_id(answer(own), id)),
            Some(RequestId::Number(3))
        );
    }
}

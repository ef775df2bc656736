//! Upstream MCP servers as domains.
//!
//! `loadout.toml` (in the data dir, or `--config PATH`) lists servers:
//!
//! ```toml
//! [servers.time]
//! command = "uvx"
//! args = ["mcp-server-time"]
//! env = { TZ = "UTC" }
//! keywords = ["time zone", "convert time"]
//! description = "Current time and time-zone conversion."   # optional
//! ```
//!
//! Each server's tools become domain `mcp_<server>` with tool names
//! `<server>__<tool>` (kept to `[a-z0-9_-]{1,64}`), descriptions and schemas from
//! the server, keywords from the config. Calls are forwarded with rmcp's client. A
//! server that exits is restarted with backoff; a `tools/list_changed` from it
//! re-lists its tools, and the catalog is rebuilt.
//!
//! Only stdio servers are supported in this build: an entry with `url` is reported
//! and skipped (HTTP needs rmcp's `transport-streamable-http-client-reqwest`).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use anyhow::Context as _;
use loadout::{Annotations, Backend, CallFuture, Domain, ExternalCall, Tier, Tool, ToolError};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation,
};
use rmcp::service::{NotificationContext, RunningService, RunningServiceCancellationToken};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ClientHandler, Peer, RoleClient, ServiceExt};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc;

/// Time to start a server and list its tools before it is reported as failing.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The config file's name in the data dir.
pub const CONFIG_FILE: &str = "loadout.toml";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    servers: BTreeMap<String, ServerConfig>,
}

/// One `[servers.<name>]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// stdio: the program to run.
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// Streamable HTTP: the endpoint (not supported in this build).
    pub url: Option<String>,
    #[serde(default)]
    #[expect(
        dead_code,
        reason = "HTTP upstreams are parsed but not connected in this build"
    )]
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

/// Servers from the config file. A missing default file means none; a missing
/// file named with `--config` is an error. Every bad entry is reported at once.
pub fn load_config(path: &Path, explicit: bool) -> anyhow::Result<Vec<(String, ServerConfig)>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => return Ok(Vec::new()),
        Err(e) => return Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    };
    let file: ConfigFile =
        toml::from_str(&text).with_context(|| format!("invalid {}", path.display()))?;
    let mut problems = Vec::new();
    let mut servers = Vec::new();
    let mut domains = HashSet::new();
    for (name, config) in file.servers {
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
            (Some(command), None) if command.trim().is_empty() => {
                problems.push(format!("{key}: `command` is empty"))
            }
            _ => {}
        }
        if config.enabled {
            servers.push((slug, config));
        }
    }
    if !problems.is_empty() {
        anyhow::bail!("{}:\n  {}", path.display(), problems.join("\n  "));
    }
    Ok(servers)
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

/// A connection to one upstream server, reconnected when it drops.
pub struct Upstream {
    slug: String,
    config: ServerConfig,
    origin: String,
    /// The live client, or `None` while (re)connecting.
    peer: Mutex<Option<Peer<RoleClient>>>,
    /// The running client service; dropping it stops the child process.
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, UpstreamClient>>>,
    /// Cancels the running service while the supervisor waits on it.
    stop: Mutex<Option<RunningServiceCancellationToken>>,
    stopping: AtomicBool,
    /// The latest tool list, as registry tools.
    tools: Mutex<Vec<Tool>>,
    description: Mutex<String>,
    last_error: Mutex<Option<String>>,
    /// Wakes the supervisor: re-list tools (`false`) or reconnect (`true`).
    wake: mpsc::UnboundedSender<bool>,
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
    pub fn domain_name(&self) -> String {
        format!("mcp_{}", self.slug)
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

    /// Starts the server, lists its tools, and keeps watching it.
    async fn connect(self: &Arc<Self>) -> anyhow::Result<()> {
        let command = self
            .config
            .command
            .clone()
            .context("HTTP upstream servers are not supported in this build")?;
        let config = self.config.clone();
        let transport =
            TokioChildProcess::new(tokio::process::Command::new(&command).configure(|cmd| {
                cmd.args(&config.args).envs(&config.env).kill_on_drop(true);
                if let Some(cwd) = &config.cwd {
                    cmd.current_dir(cwd);
                }
            }))
            .with_context(|| format!("cannot start `{command}`"))?;
        let client = UpstreamClient {
            upstream: Arc::downgrade(self),
        };
        let service = tokio::time::timeout(CONNECT_TIMEOUT, client.serve(transport))
            .await
            .context("no answer to initialize")?
            .context("initialize failed")?;
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
            .context("tools/list failed")?;
        *lock(&self.tools) = self.import_tools(tools);
        *lock(&self.peer) = Some(peer);
        *lock(&self.last_error) = None;
        *self.service.lock().await = Some(service);
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
        let peer = lock(&self.peer).clone().context("not connected")?;
        let tools = tokio::time::timeout(CONNECT_TIMEOUT, peer.list_all_tools())
            .await
            .context("no answer to tools/list")??;
        *lock(&self.tools) = self.import_tools(tools);
        let _ = self.changed.send(());
        Ok(())
    }

    async fn call(&self, tool: &str, args: Value) -> Result<Value, ToolError> {
        let peer = lock(&self.peer).clone();
        let Some(peer) = peer.filter(|p| !p.is_transport_closed()) else {
            let _ = self.wake.send(true);
            let why = lock(&self.last_error)
                .clone()
                .map(|e| format!(": {e}"))
                .unwrap_or_default();
            return Err(ToolError::Execution(format!(
                "upstream MCP server `{}` is not connected{why}; reconnecting, try again shortly",
                self.slug
            )));
        };
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
        let timeout = self
            .config
            .timeout_secs
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_CALL_TIMEOUT);
        let result = match tokio::time::timeout(timeout, peer.call_tool(request)).await {
            Err(_) => {
                return Err(ToolError::Execution(format!(
                    "upstream MCP server `{}` did not answer within {}s",
                    self.slug,
                    timeout.as_secs()
                )));
            }
            Ok(Err(e)) => {
                if peer.is_transport_closed() {
                    let _ = self.wake.send(true);
                }
                return Err(match e {
                    rmcp::ServiceError::McpError(e) => ToolError::Execution(format!(
                        "upstream MCP server `{}`: {} (code {})",
                        self.slug, e.message, e.code.0
                    )),
                    other => ToolError::Execution(format!(
                        "upstream MCP server `{}`: {other}",
                        self.slug
                    )),
                });
            }
            Ok(Ok(result)) => result,
        };
        result_value(result)
    }

    /// Keeps the server running: waits for it to exit, then reconnects with backoff;
    /// also serves re-list requests.
    async fn supervise(self: Arc<Self>, mut wake: mpsc::UnboundedReceiver<bool>) {
        let mut backoff = Duration::from_millis(500);
        loop {
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            let connected = lock(&self.peer).is_some();
            if !connected {
                match self.connect().await {
                    Ok(()) => {
                        tracing::info!("upstream `{}` connected", self.slug);
                        backoff = Duration::from_millis(500);
                    }
                    Err(e) => {
                        let message = format!("{e:#}");
                        tracing::warn!(
                            "upstream `{}`: {message}; retrying in {:.1}s",
                            self.slug,
                            backoff.as_secs_f64()
                        );
                        *lock(&self.last_error) = Some(message);
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            woke = wake.recv() => if woke.is_none() { return },
                        }
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                }
            }
            // Connected: wait for the service to end or for a request.
            let service = self.service.lock().await.take();
            let Some(service) = service else {
                if self.stopping.load(Ordering::Acquire) {
                    return;
                }
                *lock(&self.peer) = None;
                continue;
            };
            *lock(&self.stop) = Some(service.cancellation_token());
            let mut ended = Box::pin(service.waiting());
            loop {
                tokio::select! {
                    quit = &mut ended => {
                        *lock(&self.stop) = None;
                        *lock(&self.peer) = None;
                        if self.stopping.load(Ordering::Acquire) {
                            return;
                        }
                        // The last tool list stays: calls meanwhile answer "not
                        // connected" rather than "unknown tool".
                        tracing::warn!("upstream `{}` stopped ({quit:?}); reconnecting", self.slug);
                        *lock(&self.last_error) = Some("the server exited".into());
                        break;
                    }
                    woke = wake.recv() => match woke {
                        None => return,
                        // A call found the connection closed: `ended` completes soon.
                        Some(true) => {}
                        Some(false) => {
                            if let Err(e) = self.refresh_tools().await {
                                tracing::warn!("upstream `{}`: re-listing tools failed: {e:#}", self.slug);
                            }
                        }
                    },
                }
            }
        }
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
            let _ = upstream.wake.send(false);
        }
    }
}

/// The registry backend of one imported tool.
struct ForwardedTool {
    upstream: Weak<Upstream>,
    original: String,
}

impl ExternalCall for ForwardedTool {
    fn call(&self, _tool: &str, args: Value) -> CallFuture {
        let upstream = self.upstream.upgrade();
        let original = self.original.clone();
        Box::pin(async move {
            match upstream {
                Some(upstream) => upstream.call(&original, args).await,
                None => Err(ToolError::Execution(
                    "the upstream MCP server was shut down".into(),
                )),
            }
        })
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

/// Every configured upstream, connected in the background.
pub struct Upstreams {
    servers: Vec<Arc<Upstream>>,
    supervisors: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams")
            .field("servers", &self.servers.len())
            .finish()
    }
}

impl Upstreams {
    pub fn none() -> Upstreams {
        Upstreams {
            servers: Vec::new(),
            supervisors: Mutex::new(Vec::new()),
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
        let mut upstreams = Upstreams::none();
        let mut wake_receivers = Vec::new();
        let mut first_connects = tokio::task::JoinSet::new();
        for (slug, config) in servers {
            if config.url.is_some() {
                eprintln!(
                    "loadout: {}: servers.{slug}: HTTP upstream servers are not supported in this build; skipped",
                    config_path.display()
                );
                continue;
            }
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
                peer: Mutex::new(None),
                service: tokio::sync::Mutex::new(None),
                stop: Mutex::new(None),
                stopping: AtomicBool::new(false),
                tools: Mutex::new(Vec::new()),
                last_error: Mutex::new(None),
                wake,
                changed: changed.clone(),
            });
            let first = upstream.clone();
            first_connects.spawn(async move {
                if let Err(e) = first.connect().await {
                    let message = format!("{e:#}");
                    eprintln!(
                        "loadout: upstream MCP server `{}`: {message}; retrying in the background",
                        first.slug
                    );
                    *lock(&first.last_error) = Some(message);
                }
            });
            upstreams.servers.push(upstream);
            wake_receivers.push(wake_rx);
        }
        while first_connects.join_next().await.is_some() {}
        // Supervisors start after the first attempts so that they do not race them.
        let supervisors = upstreams
            .servers
            .iter()
            .zip(wake_receivers)
            .map(|(upstream, wake_rx)| tokio::spawn(Arc::clone(upstream).supervise(wake_rx)))
            .collect();
        *lock(&upstreams.supervisors) = supervisors;
        upstreams
    }

    pub fn servers(&self) -> &[Arc<Upstream>] {
        &self.servers
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Stops every server process (gracefully: stdin closed, then SIGTERM, then kill).
    pub async fn shutdown(&self) {
        for upstream in &self.servers {
            upstream.stopping.store(true, Ordering::Release);
            *lock(&upstream.peer) = None;
            if let Some(stop) = lock(&upstream.stop).take() {
                stop.cancel();
            }
            if let Some(mut service) = upstream.service.lock().await.take() {
                let _ = service.close_with_timeout(Duration::from_secs(5)).await;
            }
        }
        let supervisors = std::mem::take(&mut *lock(&self.supervisors));
        for mut handle in supervisors {
            if tokio::time::timeout(Duration::from_secs(6), &mut handle)
                .await
                .is_err()
            {
                handle.abort();
            }
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
        let path = dir.path().join(CONFIG_FILE);
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
    }
}
